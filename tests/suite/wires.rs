//! Both wires under abuse (contract §9): over-long lines, clients that stop reading, end of input,
//! malformed msgpack. The backend answers, keeps serving, and its memory stays bounded.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::support::{eventually, BIN};

/// Peak resident memory of a process in bytes (`VmHWM`).
pub fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

const MIB: u64 = 1 << 20;

/// `agent-bash rpc` with raw access to both pipes.
struct Raw {
    child: Child,
    stdin: Option<ChildStdin>,
    out: tokio::io::Lines<BufReader<ChildStdout>>,
    _state: tempfile::TempDir,
}

impl Raw {
    fn start() -> Raw {
        let state = tempfile::tempdir().unwrap();
        let cfg = state.path().join("config.toml");
        std::fs::write(&cfg, format!("state_dir = {:?}\n", state.path().to_str().unwrap()))
            .unwrap();
        let mut child = Command::new(BIN)
            .arg("--log-file")
            .arg(state.path().join("log"))
            .arg("rpc")
            .arg("--config")
            .arg(&cfg)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().unwrap()).lines();
        Raw { child, stdin, out, _state: state }
    }

    async fn write(&mut self, bytes: &[u8]) {
        self.stdin.as_mut().unwrap().write_all(bytes).await.unwrap();
    }

    async fn line(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(30), self.out.next_line())
            .await
            .expect("an answer within 30 s")
            .unwrap()
            .expect("stdout open");
        serde_json::from_str(&line).unwrap()
    }

    /// Reads until a message with this id and type `response`.
    async fn response(&mut self, id: &str) -> Value {
        loop {
            let v = self.line().await;
            if v["type"] == "response" && v["id"] == id {
                return v;
            }
        }
    }

    fn pid(&self) -> u32 {
        self.child.id().unwrap()
    }
}

#[tokio::test]
async fn wires_rpc_gigabyte_line_refused_in_bounded_memory() {
    let mut rpc = Raw::start();
    let pid = rpc.pid();
    let mut stdin = rpc.stdin.take().unwrap();
    // 1 GiB without a newline, streamed from one reused 1 MiB chunk, then a normal request.
    let writer = tokio::spawn(async move {
        let chunk = vec![b'a'; MIB as usize];
        stdin.write_all(br#"{"id":"big","type":"bash","command":""#).await.unwrap();
        for _ in 0..1024 {
            stdin.write_all(&chunk).await.unwrap();
        }
        stdin.write_all(b"\"}\n").await.unwrap();
        stdin.write_all(br#"{"id":"after","type":"bash","command":"echo alive"}"#).await.unwrap();
        stdin.write_all(b"\n").await.unwrap();
        stdin
    });
    let err = rpc.line().await;
    assert_eq!(
        err,
        json!({"type": "response", "command": "parse", "success": false, "id": "big",
               "error": "Failed to parse command: request line longer than 1048576 bytes"})
    );
    let r = rpc.response("after").await;
    assert_eq!(r["data"]["output"], "alive\n", "{r}");
    let stdin = writer.await.unwrap();
    let peak = peak_rss(pid);
    assert!(peak <= 64 * MIB, "peak RSS {} MiB", peak / MIB);
    // Still serving afterwards.
    rpc.stdin = Some(stdin);
    rpc.write(b"{\"id\":\"again\",\"type\":\"bash\",\"command\":\"echo again\"}\n").await;
    assert_eq!(rpc.response("again").await["data"]["output"], "again\n");
}

#[tokio::test]
async fn wires_rpc_slow_reader_gets_coalesced_updates_and_whole_answers() {
    let mut rpc = Raw::start();
    let dir = tempfile::tempdir().unwrap();
    let done = dir.path().join("done");
    // ~4 s of output at the runtime's 20 updates per second: ~80 updates of ~20-50 KB each.
    let cmd = format!(
        "for i in $(seq 400); do head -c 20000 /dev/zero | tr '\\0' x; echo; sleep 0.01; done; touch {}",
        done.display()
    );
    let req = json!({"id": "t", "type": "tool_call", "command": cmd});
    rpc.write(format!("{req}\n").as_bytes()).await;
    // Do not read while the command runs.
    assert!(eventually(Duration::from_secs(60), || done.exists()).await);
    let started = Instant::now();
    let mut updates = 0;
    loop {
        let v = rpc.line().await;
        match v["type"].as_str().unwrap() {
            "tool_execution_update" => updates += 1,
            "tool_execution_end" => {
                assert_eq!(v["result"]["totalLines"], 400);
                break;
            }
            _ => {}
        }
    }
    let r = rpc.response("t").await;
    assert_eq!(r["success"], true);
    assert_eq!(r["data"]["totalLines"], 400);
    assert_eq!(r["data"]["totalBytes"], 400 * 20001);
    // Without back-pressure every update of the run would be waiting here (~80).
    assert!(updates <= 24, "{updates} updates queued for a client that did not read");
    assert!(started.elapsed() < Duration::from_secs(10));
    let peak = peak_rss(rpc.pid());
    assert!(peak <= 64 * MIB, "peak RSS {} MiB", peak / MIB);
}

fn alive(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !stat.is_empty() && !stat.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z'))
}

fn read_pid(p: &Path) -> Option<i32> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

#[tokio::test]
async fn wires_rpc_end_of_input_cancels_after_grace() {
    let mut rpc = Raw::start();
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let slow = format!("sleep 100 & echo $! > {}; wait", pidfile.display());
    let req = json!({"id": "slow", "type": "bash", "command": slow});
    rpc.write(format!("{req}\n").as_bytes()).await;
    let req = json!({"id": "quick", "type": "tool_call", "command": "sleep 0.5; echo finished"});
    rpc.write(format!("{req}\n").as_bytes()).await;
    assert!(eventually(Duration::from_secs(10), || read_pid(&pidfile).is_some()).await);
    let sleeper = read_pid(&pidfile).unwrap();
    let closed = Instant::now();
    drop(rpc.stdin.take());
    // A request that finishes within the grace period gets its normal answer.
    let quick = rpc.response("quick").await;
    assert_eq!(quick["data"]["output"], "finished\n", "{quick}");
    assert_eq!(quick["data"]["cancelled"], false);
    let slow = rpc.response("slow").await;
    let waited = closed.elapsed();
    assert_eq!(slow["data"]["cancelled"], true, "{slow}");
    assert!(slow["data"]["output"].as_str().unwrap().starts_with("[Command cancelled]"), "{slow}");
    assert!(waited >= Duration::from_millis(1900), "cancelled after {waited:?}");
    let status = tokio::time::timeout(Duration::from_secs(10), rpc.child.wait()).await;
    assert!(status.expect("backend exits after end of input").unwrap().success());
    assert!(closed.elapsed() < Duration::from_secs(8), "exit took {:?}", closed.elapsed());
    assert!(eventually(Duration::from_secs(2), || !alive(sleeper)).await, "sleep 100 survived");
}

// ---- the msgpack wire (agent-bash nvim) --------------------------------------------------

use super::nvim::Editor;

/// Runs Lua in the editor that returns `{ok, result_or_error}` of an rpcrequest to the backend.
async fn rpc_call(ed: &Editor, call: &str) -> (bool, String) {
    let v = ed
        .lua(&format!(
            "local chan = assert(require('agent_bash.backend').ensure())
             local ok, res = pcall(vim.rpcrequest, chan, {call})
             return {{ ok, type(res) == 'string' and res or vim.inspect(res) }}"
        ))
        .await;
    let a = v.as_array().unwrap();
    (a[0].as_bool().unwrap(), a[1].as_str().unwrap().to_string())
}

#[tokio::test]
async fn wires_nvim_wrong_types_unknown_methods_and_non_utf8_answered() {
    let ed = Editor::start().await;
    ed.lua("_G.notes = {}; vim.notify = function(m, l) table.insert(_G.notes, m) end").await;
    let pid = ed.lua("require('agent_bash.backend').ensure(); return require('agent_bash.backend').info().pid").await;
    for (call, want) in [
        ("'artifact_path', 42", "artifact_path: expected a table of parameters, got an integer"),
        ("'artifact_path', {url = 42}", "artifact_path: \"url\" must be a string, got 42"),
        (
            "'artifact_path', {url = 'artifact://\\255'}",
            "artifact_path: \"url\" is not valid UTF-8",
        ),
        ("'history', {offset = -1}", "history: \"offset\" must be a non-negative integer, got -1"),
        ("'frobnicate', {}", "Unknown request: frobnicate"),
        // nvim-rs alone ends its loop on this one (the method name is not UTF-8).
        ("'pi\\255ng', {}", "malformed message from Neovim: method name is not valid UTF-8"),
    ] {
        let (ok, err) = rpc_call(&ed, call).await;
        assert!(!ok, "{call} succeeded: {err}");
        assert!(err.contains(want), "{call}: {err}");
        assert_eq!(rpc_call(&ed, "'ping', {}").await, (true, "pong".to_string()), "after {call}");
    }
    // Notifications have no answer: the user is told.
    for (call, want) in [
        ("'run', {id = 'x', command = 'echo hi'}", "run: \"id\" must be an integer, got \"x\""),
        ("'cancel', {}", "cancel: \"id\" must be an integer, got nothing"),
        ("'bogus', {}", "Unknown notification: bogus"),
    ] {
        ed.lua("_G.notes = {}").await;
        ed.lua(&format!("vim.rpcnotify(require('agent_bash.backend').ensure(), {call})")).await;
        let got = ed.wait_lua("_G.notes[1]").await;
        assert!(got.as_str().unwrap().contains(want), "{call}: {got:?}");
        // At most one such notice a second reaches the editor.
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    // A command with a non-UTF-8 byte is refused, not guessed at: its card says why.
    ed.lua("vim.cmd('AgentBash echo caf\\233')").await;
    let card = ed.card_done().await;
    assert!(
        card.lines.iter().any(|l| l.contains("run: \"command\" is not valid UTF-8")),
        "{:?}",
        card.lines
    );
    ed.lua("require('agent_bash').close_all()").await;
    // The same backend still runs commands.
    ed.cmd("AgentBash echo still serving").await;
    let card = ed.card_done().await;
    assert!(card.lines.iter().any(|l| l == "still serving"), "{:?}", card.lines);
    let now = ed.lua("return require('agent_bash.backend').info().pid").await;
    assert_eq!(now, pid, "the backend was restarted");
}

/// Reads the next response from the backend's stdout (bounded wait); the backend's own
/// requests (events for Lua) are skipped.
async fn read_msg(out: &mut ChildStdout, buf: &mut Vec<u8>) -> rmpv::Value {
    use tokio::io::AsyncReadExt;
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let mut cur = std::io::Cursor::new(&buf[..]);
        if let Ok(v) = rmpv::decode::read_value(&mut cur) {
            let n = cur.position() as usize;
            buf.drain(..n);
            if v[0].as_u64() == Some(1) {
                return v;
            }
            continue;
        }
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(end - Instant::now(), out.read(&mut chunk))
            .await
            .expect("an answer within 20 s")
            .unwrap();
        assert!(n > 0, "backend closed stdout");
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn msg(v: rmpv::Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &v).unwrap();
    out
}

fn request(id: u64, method: &str) -> Vec<u8> {
    use rmpv::Value as V;
    msg(V::Array(vec![V::from(0), V::from(id), V::from(method), V::Array(vec![])]))
}

#[tokio::test]
async fn wires_nvim_truncated_and_garbage_msgpack_answered_then_clean_exit() {
    use rmpv::Value as V;
    let state = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .arg("--log-file")
        .arg(state.path().join("log"))
        .arg("nvim")
        .arg("--state-dir")
        .arg(state.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut buf = Vec::new();
    // A request missing its parameters (three elements instead of four).
    stdin.write_all(&msg(V::Array(vec![V::from(0), V::from(1), V::from("ping")]))).await.unwrap();
    let r = read_msg(&mut out, &mut buf).await;
    assert_eq!(r[1].as_u64(), Some(1));
    assert_eq!(
        r[2].as_str(),
        Some("malformed message from Neovim: request has 3 elements, expected 4")
    );
    // Bytes no msgpack value starts with, a bare integer, then a good request.
    stdin.write_all(&[0xc1, 0xc1, 0x05]).await.unwrap();
    stdin.write_all(&request(2, "ping")).await.unwrap();
    let r = read_msg(&mut out, &mut buf).await;
    assert_eq!((r[1].as_u64(), r[3].as_str()), (Some(2), Some("pong")), "{r}");
    // A request far over the size limit, streamed: refused, memory bounded.
    let mut head = vec![0x94, 0x00, 0x03, 0xa4];
    head.extend_from_slice(b"ping");
    head.push(0x91);
    head.push(0xdb);
    let size: u32 = 64 << 20;
    head.extend_from_slice(&size.to_be_bytes());
    stdin.write_all(&head).await.unwrap();
    let chunk = vec![b'x'; 1 << 20];
    for _ in 0..64 {
        stdin.write_all(&chunk).await.unwrap();
    }
    let r = read_msg(&mut out, &mut buf).await;
    assert_eq!(r[1].as_u64(), Some(3));
    assert!(r[2].as_str().unwrap().contains("exceeds the 16777216-byte limit"), "{r}");
    stdin.write_all(&request(4, "ping")).await.unwrap();
    let r = read_msg(&mut out, &mut buf).await;
    assert_eq!((r[1].as_u64(), r[3].as_str()), (Some(4), Some("pong")), "{r}");
    let peak = peak_rss(pid);
    assert!(peak <= 64 * MIB, "peak RSS {} MiB", peak / MIB);
    // Input that ends inside a message: the backend exits cleanly.
    let cut = request(5, "ping");
    stdin.write_all(&cut[..cut.len() - 2]).await.unwrap();
    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
    assert!(status.expect("exit after end of input").unwrap().success());
    let log = std::fs::read_to_string(state.path().join("log")).unwrap();
    assert!(log.contains("input from Neovim ended inside a message"), "{log}");
}

/// Bytes the process has written (to pipes and files) so far.
fn written(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    io.lines().find_map(|l| l.strip_prefix("wchar:")).unwrap().trim().parse().unwrap()
}

#[tokio::test]
async fn wires_nvim_artifact_read_from_its_file_not_through_rpc() {
    let ed = Editor::start().await;
    ed.tool_call("big", "{command = 'seq 1 2000000'}").await;
    assert_eq!(ed.tool_result("big", "artifact_id").await.as_u64(), Some(0));
    let pid = ed.lua("return require('agent_bash.backend').info().pid").await.as_u64().unwrap();
    let before = written(pid as u32);
    ed.cmd("edit artifact://0").await;
    let v = ed
        .lua("return {vim.api.nvim_buf_line_count(0), vim.fn.getline(1), vim.fn.getline('$')}")
        .await;
    let a = v.as_array().unwrap();
    assert_eq!(a[0].as_i64(), Some(2_000_000));
    assert_eq!(a[1].as_str(), Some("1"));
    assert_eq!(a[2].as_str(), Some("2000000"));
    // ~14.9 MB of text reached the buffer; the backend wrote only a path.
    let sent = written(pid as u32) - before;
    assert!(sent < 4096, "backend wrote {sent} bytes for :edit artifact://0");
}

#[tokio::test]
async fn wires_nvim_typed_keys_never_logged_and_log_private() {
    let ed = Editor::start().await;
    // Debug level on both sides, as a user chasing a bug would set it.
    ed.lua(&format!(
        "vim.env.AGENT_BASH_LOG_LEVEL = 'debug'; require('agent_bash').setup({{bin = {BIN:?}, log_level = 'debug'}})"
    ))
    .await;
    ed.attach_ui().await;
    // The command names only the length, so the secret can reach the log only as typed keys.
    ed.cmd("AgentBashTerm read -rs -p 'password: ' pw; [ ${#pw} = 13 ] && echo matched").await;
    ed.wait_term("password: ").await;
    ed.nvim.input("hunter2secret<CR>").await.unwrap();
    ed.wait_term("matched").await;
    let path = ed.lua("return require('agent_bash.log').file()").await;
    let path = path.as_str().unwrap();
    let log = std::fs::read_to_string(path).unwrap();
    assert!(log.contains("DEBUG"), "debug logging is on: {log}");
    assert!(log.contains("send pty_input to run"), "{log}");
    assert!(!log.contains("hunter2"), "typed keys in the log:\n{log}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}
