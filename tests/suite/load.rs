//! Load over `agent-bash rpc`: many concurrent calls stay apart and exact; many sequential calls
//! leave memory and file descriptors flat; nothing is left running.

use std::time::Duration;

use serde_json::json;

use super::support::{eventually, fd_count, status_kib, Rpc};

const MB: u64 = 1_000_000;

/// Children of `pid` (all threads).
fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
        let text = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        out.extend(text.split_whitespace().filter_map(|s| s.parse::<i32>().ok()));
    }
    out
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

/// 64 tool calls at once over 8 session keys, each printing 1 MB of lines carrying its own
/// marker: each result and each artifact holds exactly its own output, the counters are exact,
/// the backend's peak RSS stays under 64 MiB, and nothing is left once it exits.
#[tokio::test]
async fn load_64_concurrent_calls_stay_apart() {
    sixty_four_calls(None).await;
}

/// The same with bash forking every command (`spawn = false`: no spawn builtin).
#[tokio::test]
async fn load_64_concurrent_calls_stay_apart_forking() {
    sixty_four_calls(Some("spawn = false")).await;
}

async fn sixty_four_calls(config: Option<&str>) {
    let mut rpc = Rpc::start_with(config).await;
    let tag = std::process::id();
    let line = |n: usize| format!("marker-{tag}-{n:02}-{}", "x".repeat(40));
    let mut ids = Vec::new();
    for n in 0..64 {
        let cmd = format!("yes {} | head -c {MB}", line(n));
        let id = rpc
            .send(
                json!({"type": "tool_call", "command": cmd, "session_key": format!("k{}", n % 8)}),
            )
            .await;
        ids.push(id);
    }
    for (n, id) in ids.iter().enumerate() {
        let r = rpc.response(id).await;
        let d = &r["data"];
        let mine = format!("{}\n", line(n));
        let expected: Vec<u8> = mine.bytes().cycle().take(MB as usize).collect();
        let l = mine.len() as u64;
        assert_eq!(d["totalBytes"], MB, "call {n}: {d}");
        assert_eq!(d["totalLines"], MB.div_ceil(l), "call {n}");
        assert_eq!(d["exitCode"], 0, "call {n}");
        // The window: only this call's lines (the first may start mid-line, the last is cut
        // where `head -c` cut it).
        let out = d["output"].as_str().unwrap();
        let body = out.rsplit_once("\n\n[").map_or(out, |(b, _)| b);
        for (i, got) in body.lines().enumerate() {
            assert!(
                mine.trim_end().ends_with(got) || mine.starts_with(got),
                "call {n}, line {i}: {got:?}"
            );
            if i > 0 {
                assert!(mine.starts_with(got), "call {n}, line {i}: {got:?}");
            }
        }
        // The artifact: the whole 1 MB, this call's and no other's.
        let art = d["artifactId"].as_u64().expect("artifact of a truncated run");
        let file = rpc.artifacts_dir().join(format!("{art}.bash.log"));
        assert!(std::fs::read(&file).unwrap() == expected, "artifact of call {n} differs");
    }
    let backend = rpc.pid();
    let hwm = status_kib(backend, "VmHWM");
    println!("64 × 1 MB concurrently: backend peak RSS {hwm} KiB");
    assert!(hwm <= 64 * 1024, "peak RSS {hwm} KiB");
    let kids = children(backend);
    // Eight shells and the watchdog; every `yes | head` is gone.
    assert!(kids.len() <= 9, "{kids:?}");
    let mut all = kids.clone();
    for k in &kids {
        all.extend(children(*k));
    }
    assert_eq!(all.len(), kids.len(), "the shells have no children left: {all:?}");
    rpc.stop().await;
    assert!(
        eventually(Duration::from_secs(3), || all.iter().all(|p| !alive(*p))).await,
        "left running: {:?}",
        all.iter().filter(|p| alive(**p)).collect::<Vec<_>>()
    );
}

/// 1000 calls one after another on one session: file descriptors exactly flat, memory flat
/// within 1 MiB after a warm-up of 100.
#[tokio::test]
async fn load_1000_sequential_calls_stay_flat() {
    let mut rpc = Rpc::start().await;
    let pid = rpc.pid();
    // A small project of its own: receipts stay on, and their first snapshot is done within
    // the warm-up (of this checkout, under load, it could still hold its lock and git's pipes
    // when the count is taken).
    let project = tempfile::tempdir().unwrap();
    let cwd = project.path().to_str().unwrap();
    for i in 0..100 {
        let d = rpc.tool(json!({"command": format!("echo warm-{i}"), "cwd": cwd})).await;
        assert_eq!(d["output"], format!("warm-{i}\n"));
    }
    let (fds, rss) = (fd_count(pid), status_kib(pid, "VmRSS"));
    for i in 0..1000 {
        let command = format!("echo run-{i}; echo err-{i} >&2");
        let d = rpc.tool(json!({"command": command, "cwd": cwd})).await;
        assert_eq!(d["output"], format!("run-{i}\nerr-{i}\n"));
    }
    let (fds2, rss2) = (fd_count(pid), status_kib(pid, "VmRSS"));
    println!("1000 calls: fds {fds} → {fds2}, RSS {rss} → {rss2} KiB");
    assert_eq!(fds2, fds, "file descriptors leaked");
    assert!(rss2 <= rss + 1024, "RSS grew from {rss} to {rss2} KiB");
}

/// Warming the bang shell (contract §8.4) takes a free place among `limits.max_sessions` or none:
/// with the one place held by a tool call's shell, it starts nothing.
#[tokio::test]
async fn warming_respects_max_sessions() {
    use agent_bash::exec::settings::{Limits, Settings};
    use agent_bash::exec::{Origin, Request, Runtime};
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings {
        shell: Some("/bin/bash".into()),
        limits: Limits { max_sessions: 1, ..Default::default() },
        ..Default::default()
    };
    let rt = Runtime::new(settings, dir.path().join("s"), dir.path().to_path_buf()).unwrap();
    let req = Request { origin: Origin::Tool, command: "true".into(), ..Default::default() };
    let r = rt.run(req, tokio_util::sync::CancellationToken::new(), None).await.unwrap();
    assert_eq!(r.exit_code, Some(0));
    let mark = format!("{}={}", agent_bash::shell::procs::OWNER_VAR, rt.owner());
    let shells = || super::support::procs_with_env(&mark).len();
    assert_eq!(shells(), 1);
    assert!(!rt.warm().await, "warming started a shell past max_sessions = 1");
    assert_eq!(shells(), 1);
    rt.shutdown().await;
}

/// A shell of the wrong kind is replaced in its own slot: with `limits.max_sessions = 1`, a tool
/// call on a key whose shell a bang command started (with the editor's handles) gets a fresh
/// shell. The killed shell's place must go with it: it kept it, and the call waited for
/// capacity forever (it held the only place itself).
#[tokio::test]
async fn replacing_a_shell_of_another_kind_gives_its_place_back() {
    use agent_bash::exec::settings::{Limits, Settings};
    use agent_bash::exec::{Origin, Request, Runtime};
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings {
        shell: Some("/bin/bash".into()),
        limits: Limits { max_sessions: 1, ..Default::default() },
        ..Default::default()
    };
    let rt = Runtime::new(settings, dir.path().join("s"), dir.path().to_path_buf()).unwrap();
    let call = |origin| Request {
        origin,
        command: "echo $$".into(),
        session_key: Some("k".into()),
        timeout: Some(30.0),
        ..Default::default()
    };
    let cancel = tokio_util::sync::CancellationToken::new();
    let bang = rt.run(call(Origin::Bang), cancel.clone(), None).await.unwrap();
    assert_eq!(bang.exit_code, Some(0), "{}", bang.output);
    // A hang guard, not a timing: the call either runs or waits for a place nobody gives back.
    let tool =
        tokio::time::timeout(Duration::from_secs(60), rt.run(call(Origin::Tool), cancel, None))
            .await
            .expect("the tool call waited for a session place its own slot still held")
            .unwrap();
    assert_eq!(tool.exit_code, Some(0), "{}", tool.output);
    assert_ne!(tool.text, bang.text, "the tool call ran in the bang command's shell");
    rt.shutdown().await;
}
