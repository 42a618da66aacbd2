//! Both wires under abuse (SPEC §9): over-long lines, clients that stop reading, end of input,
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
        std::fs::write(&cfg, format!("state_dir = {:?}\n", state.path().to_str().unwrap())).unwrap();
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
