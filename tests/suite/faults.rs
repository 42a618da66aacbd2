//! Faults: processes that try to escape, ignore signals or outlive the backend; outputs that
//! close, never end a line or never stop. Each process test runs twice: with the tracking the
//! machine offers (cgroup v2 where the backend may create one) and with the fallback forced
//! (`AGENT_BASH_NO_CGROUP=1`); each says which path ran.

use std::time::{Duration, Instant};

use serde_json::json;

use super::support::{eventually, procs_with_cmdline, status_kib, unique_sleep, Rpc};

/// Which process tracking a test asks the backend for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tracking {
    /// cgroup v2 when the machine allows it, else the fallback (the test says which).
    Auto,
    /// The fallback alone.
    Fallback,
}

pub async fn start(tracking: Tracking, config: Option<&str>) -> Rpc {
    let env: &[(&str, &str)] = match tracking {
        Tracking::Auto => &[],
        Tracking::Fallback => &[("AGENT_BASH_NO_CGROUP", "1")],
    };
    Rpc::start_env(tempfile::tempdir().unwrap(), config, &[], env).await
}

/// The tracking the backend reported in its log (after its first command), printed for the
/// test's output; with [`Tracking::Fallback`] it must be the fallback.
pub fn tracking_used(rpc: &Rpc, asked: Tracking) -> String {
    let log = std::fs::read_to_string(rpc.state.path().join("log")).unwrap_or_default();
    let line = log
        .lines()
        .find_map(|l| l.split_once("process tracking: ").map(|(_, m)| m.to_string()))
        .unwrap_or_else(|| "not reported by the backend".into());
    match asked {
        Tracking::Fallback => assert!(line.starts_with("fallback"), "{line}"),
        Tracking::Auto if line.starts_with("fallback") => {
            println!("cgroups are unavailable here, so this test ran the fallback path: {line}")
        }
        Tracking::Auto => {}
    }
    println!("process tracking used: {line}");
    line
}

/// `(setsid env -i sleep N &)`: leaves the session and the process group, clears the
/// environment, and is orphaned at once.
fn escapee(tag: &str) -> String {
    format!("(setsid env -i sleep {tag} >/dev/null 2>&1 &)")
}

/// Same, ignoring SIGTERM (an ignored signal stays ignored across `exec`).
fn stubborn_escapee(tag: &str) -> String {
    format!("(setsid env -i sh -c \"trap '' TERM; exec sleep {tag}\" >/dev/null 2>&1 &)")
}

async fn appears(tag: &str) {
    assert!(
        eventually(Duration::from_secs(10), || !procs_with_cmdline(tag).is_empty()).await,
        "{tag} never started"
    );
}

/// Nothing with `tag` in its command line is alive within 2 s.
async fn gone(tags: &[&str]) {
    let ok = eventually(Duration::from_secs(2), || {
        tags.iter().all(|t| procs_with_cmdline(t).is_empty())
    })
    .await;
    let left: Vec<(&str, Vec<i32>)> = tags.iter().map(|t| (*t, procs_with_cmdline(t))).collect();
    assert!(ok, "still alive 2 s later: {left:?}");
}

async fn cancel_takes_escapees(tracking: Tracking) {
    let mut rpc = start(tracking, None).await;
    let (a, b) = (unique_sleep(), unique_sleep());
    // `echo started` first: once the escapees exist, it has run.
    let cmd = format!("echo started; {}; {}; sleep 300", escapee(&a), stubborn_escapee(&b));
    let id = rpc.send(json!({"type": "tool_call", "command": cmd})).await;
    appears(&a).await;
    appears(&b).await;
    let t = Instant::now();
    let aid = rpc.send(json!({"type": "abort_tool_call", "target": id})).await;
    assert_eq!(rpc.response(&aid).await["success"], true);
    let r = rpc.response(&id).await;
    assert_eq!(r["data"]["cancelled"], true, "{r}");
    assert!(r["data"]["output"].as_str().unwrap().contains("started"));
    // The TERM-ignoring one costs the grace (500 ms) and a SIGKILL, not more.
    assert!(t.elapsed() < Duration::from_millis(2000), "{:?}", t.elapsed());
    gone(&[&a, &b]).await;
    tracking_used(&rpc, tracking);
}

#[tokio::test]
async fn faults_cancel_kills_setsid_env_cleared_escapees() {
    cancel_takes_escapees(Tracking::Auto).await;
}

#[tokio::test]
async fn faults_cancel_kills_setsid_env_cleared_escapees_fallback() {
    cancel_takes_escapees(Tracking::Fallback).await;
}

async fn timeout_takes_escapees(tracking: Tracking) {
    let mut rpc = start(tracking, None).await;
    let (a, b) = (unique_sleep(), unique_sleep());
    let cmd = format!("{}; {}; sleep 300", escapee(&a), stubborn_escapee(&b));
    let d = rpc.tool(json!({"command": cmd, "timeout": 1})).await;
    assert_eq!(d["timedOut"], true, "{d}");
    gone(&[&a, &b]).await;
    tracking_used(&rpc, tracking);
}

#[tokio::test]
async fn faults_timeout_kills_setsid_env_cleared_escapees() {
    timeout_takes_escapees(Tracking::Auto).await;
}

#[tokio::test]
async fn faults_timeout_kills_setsid_env_cleared_escapees_fallback() {
    timeout_takes_escapees(Tracking::Fallback).await;
}

/// A background escapee lives with its shell session, and dies with it: when the session is
/// evicted (least recently used) and when the shell exits.
async fn session_end_takes_escapees(tracking: Tracking) {
    let mut rpc = start(tracking, Some("[limits]\nmax_sessions = 1\n")).await;
    let (a, b) = (unique_sleep(), unique_sleep());
    let d = rpc.tool(json!({"command": escapee(&a), "session_key": "a"})).await;
    assert_eq!(d["exitCode"], 0, "{d}");
    appears(&a).await;
    // Still running once the command is done: background jobs belong to the session.
    assert!(!procs_with_cmdline(&a).is_empty());
    // A second session over the limit of one closes `a`, and its escapee with it.
    rpc.tool(json!({"command": "true", "session_key": "b"})).await;
    gone(&[&a]).await;
    // `exit` ends the session `b`: what it left goes too.
    let d =
        rpc.tool(json!({"command": format!("{}; exit 3", escapee(&b)), "session_key": "b"})).await;
    assert_eq!(d["exitCode"], 3, "{d}");
    gone(&[&b]).await;
    tracking_used(&rpc, tracking);
}

#[tokio::test]
async fn faults_session_end_kills_setsid_env_cleared_escapees() {
    session_end_takes_escapees(Tracking::Auto).await;
}

#[tokio::test]
async fn faults_session_end_kills_setsid_env_cleared_escapees_fallback() {
    session_end_takes_escapees(Tracking::Fallback).await;
}

async fn backend_exit_takes_escapees(tracking: Tracking) {
    let mut rpc = start(tracking, None).await;
    let (a, b) = (unique_sleep(), unique_sleep());
    rpc.tool(json!({"command": escapee(&a)})).await;
    rpc.tool(json!({"command": stubborn_escapee(&b), "session_key": "other"})).await;
    appears(&a).await;
    appears(&b).await;
    tracking_used(&rpc, tracking);
    // stdin closes: the backend shuts down normally.
    rpc.stop().await;
    gone(&[&a, &b]).await;
}

#[tokio::test]
async fn faults_backend_exit_kills_setsid_env_cleared_escapees() {
    backend_exit_takes_escapees(Tracking::Auto).await;
}

#[tokio::test]
async fn faults_backend_exit_kills_setsid_env_cleared_escapees_fallback() {
    backend_exit_takes_escapees(Tracking::Fallback).await;
}

/// SIGKILL of the backend while a pipe command and a PTY command run, with escapees in both and
/// one left by an earlier command in an idle session: nothing is alive 2 s later.
async fn backend_sigkill_takes_everything(tracking: Tracking) {
    let mut rpc = start(tracking, None).await;
    let (idle, pipe, pipe_fg, pty, pty_fg) =
        (unique_sleep(), unique_sleep(), unique_sleep(), unique_sleep(), unique_sleep());
    rpc.tool(json!({"command": escapee(&idle), "session_key": "idle"})).await;
    let cmd = format!("{}; sleep {pipe_fg}", stubborn_escapee(&pipe));
    rpc.send(json!({"type": "tool_call", "command": cmd})).await;
    let cmd = format!("{}; sleep {pty_fg}", escapee(&pty));
    rpc.send(json!({"type": "tool_call", "command": cmd, "pty": true})).await;
    for tag in [&idle, &pipe, &pipe_fg, &pty, &pty_fg] {
        appears(tag).await;
    }
    let mode = tracking_used(&rpc, tracking);
    if mode.starts_with("fallback") {
        // The fallback's documented window (procs.rs): an orphan of a PTY run is known to the
        // watchdog once a scan (every 250 ms) has seen it. The guarantee is for older ones.
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    let backend = rpc.pid();
    let watchdogs: Vec<i32> = procs_with_cmdline("__watchdog")
        .into_iter()
        .filter(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            stat.rsplit(')').next().and_then(|r| r.split_whitespace().nth(1))
                == Some(&backend.to_string())
        })
        .collect();
    assert_eq!(watchdogs.len(), 1, "one watchdog per backend");
    // SAFETY: killing our own child.
    unsafe { libc::kill(backend, libc::SIGKILL) };
    gone(&[&idle, &pipe, &pipe_fg, &pty, &pty_fg]).await;
    // The watchdog ends once its work is done.
    let w = watchdogs[0];
    assert!(
        eventually(Duration::from_secs(3), || {
            std::fs::read_to_string(format!("/proc/{w}/stat"))
                .map(|s| s.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')))
                .unwrap_or(true)
        })
        .await,
        "watchdog {w} still running"
    );
    drop(rpc);
}

#[tokio::test]
async fn faults_backend_sigkill_leaves_nothing() {
    backend_sigkill_takes_everything(Tracking::Auto).await;
}

#[tokio::test]
async fn faults_backend_sigkill_leaves_nothing_fallback() {
    backend_sigkill_takes_everything(Tracking::Fallback).await;
}

/// Tool calls get no handle on the editor; bang commands keep `NVIM` (contract §5).
#[tokio::test]
async fn faults_tool_calls_get_no_editor_handle() {
    let env = [("NVIM", "/tmp/ab-fake-nvim.sock"), ("NVIM_LISTEN_ADDRESS", "/tmp/ab-fake-listen")];
    let mut rpc = Rpc::start_env(tempfile::tempdir().unwrap(), None, &[], &env).await;
    let show = "echo \"[${NVIM-}][${NVIM_LISTEN_ADDRESS-}][$(env | grep -c -e '^NVIM=' -e '^NVIM_LISTEN_ADDRESS=')]\"";
    let d = rpc.tool(json!({"command": show})).await;
    assert_eq!(d["output"], "[][][0]\n");
    let d = rpc.tool(json!({"command": show, "pty": true})).await;
    assert_eq!(d["output"], "[][][0]\n");
    let d = rpc.bash(show).await;
    assert_eq!(d["output"], "[/tmp/ab-fake-nvim.sock][/tmp/ab-fake-listen][2]\n");
    // A bang command that started a key's shell does not hand its environment to a tool call
    // of the same key: the tool call gets a fresh shell, and says so.
    let id = rpc.send(json!({"type": "bash", "command": "true", "session_key": "shared"})).await;
    rpc.response(&id).await;
    let d = rpc.tool(json!({"command": show, "session_key": "shared"})).await;
    assert_eq!(d["output"], "[][][0]\n");
    assert_eq!(d["shellRestarted"], true);
}

/// A command that closes its output and reopens it elsewhere, or closes it and goes on: the
/// result comes when the foreground part is done, with what was written before.
#[tokio::test]
async fn faults_closed_and_reopened_output() {
    let mut rpc = Rpc::start().await;
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("out");
    let cmd = format!("echo before; exec >&- 2>&-; exec >{} 2>&1; echo after", f.display());
    let d = rpc.tool(json!({"command": cmd})).await;
    assert_eq!(d["output"], "before\n");
    assert_eq!(d["exitCode"], 0);
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "after\n");
    let t = Instant::now();
    let d = rpc.tool(json!({"command": "echo x; exec 1>&- 2>&-; sleep 1; sh -c 'exit 4'"})).await;
    assert_eq!(d["exitCode"], 4, "{d}");
    assert!(d["output"].as_str().unwrap().starts_with("x\n\n"), "{d}");
    assert!(t.elapsed() >= Duration::from_millis(900), "returned before the command ended");
    // The session survives and the next command's output is its own.
    let d = rpc.tool(json!({"command": "echo next"})).await;
    assert_eq!(d["output"], "next\n");
    // In a terminal: closed, then reopened on the terminal itself.
    let d = rpc
        .tool(json!({"command": "echo one; exec >&- 2>&-; exec >/dev/tty 2>&1; echo two", "pty": true}))
        .await;
    assert_eq!(d["output"], "one\ntwo\n");
}

/// Floods: gigabytes of lines, and a gigabyte that never ends a line. Counters are exact and
/// the backend's peak memory stays bounded. 10 GB takes ≈ 30 s on the 2-core machine this was
/// written on (≈ 350 MB/s through the whole pipeline while other builds ran), so the test uses
/// 4 GiB of lines + 1 GiB without a newline; memory does not depend on the size past the
/// first megabytes (the windows and the artifact are capped).
#[tokio::test]
async fn faults_flood_without_newlines_keeps_memory_bounded() {
    const GIB: u64 = 1 << 30;
    let mut rpc = Rpc::start().await;
    let t = Instant::now();
    let d = rpc.tool(json!({"command": "yes | head -c 4G"})).await;
    assert_eq!(d["totalBytes"], 4 * GIB);
    assert_eq!(d["totalLines"], 2 * GIB);
    assert_eq!(d["truncated"], true);
    assert!(d["output"].as_str().unwrap().starts_with("y\ny\n"));
    let d = rpc.tool(json!({"command": "head -c 1G /dev/zero | tr '\\0' x"})).await;
    assert_eq!(d["totalBytes"], GIB);
    assert_eq!(d["totalLines"], 1);
    let out = d["output"].as_str().unwrap();
    assert!(out.len() <= 51200 + 200, "{}", out.len());
    assert!(out.starts_with("xxxx"));
    let hwm = status_kib(rpc.pid(), "VmHWM");
    println!("5 GiB in {:?}; backend peak RSS {} KiB", t.elapsed(), hwm);
    assert!(hwm <= 64 * 1024, "peak RSS {hwm} KiB");
    // Still serving.
    assert_eq!(rpc.tool(json!({"command": "echo ok"})).await["output"], "ok\n");
}

/// The fallback is what a machine without cgroups gets; both paths are reported.
#[tokio::test]
async fn faults_tracking_mode_is_reported() {
    for tracking in [Tracking::Auto, Tracking::Fallback] {
        let mut rpc = start(tracking, None).await;
        rpc.tool(json!({"command": "true"})).await;
        let mode = tracking_used(&rpc, tracking);
        if tracking == Tracking::Auto && mode.starts_with("cgroup") {
            // The backend's cgroup exists while it runs and is removed when it exits.
            let dir = mode.trim_start_matches("cgroup v2 (").trim_end_matches(')').to_string();
            assert!(std::path::Path::new(&dir).is_dir(), "{dir}");
            rpc.stop().await;
            assert!(
                eventually(Duration::from_secs(3), || !std::path::Path::new(&dir).exists()).await,
                "{dir} left behind"
            );
        }
    }
}

/// The artifacts directory cannot be created (a file is in the way; permissions would not stop
/// root): the run completes, truncated, and says the full output was not saved.
#[tokio::test]
async fn faults_artifacts_dir_unwritable() {
    let state = tempfile::tempdir().unwrap();
    std::fs::write(state.path().join("sessions"), "not a directory").unwrap();
    let mut rpc = Rpc::start_env(state, None, &[], &[]).await;
    let d = rpc.tool(json!({"command": "seq 1 100000"})).await;
    assert_eq!(d["exitCode"], 0, "{d}");
    assert_eq!(d["totalLines"], 100000);
    assert_eq!(d["truncated"], true);
    assert!(d.get("artifactId").is_none(), "{d}");
    let out = d["output"].as_str().unwrap();
    assert!(out.ends_with("100000\n\n[Showing lines 98001-100000 of 100000 (2000 lines limit). Full output not saved: creating the artifact failed: Not a directory (os error 20)]"), "{}", &out[out.len() - 300..]);
    // And the backend keeps serving.
    assert_eq!(rpc.tool(json!({"command": "echo ok"})).await["output"], "ok\n");
}

/// The artifact's filesystem fills up mid-run (a 256 KiB tmpfs mounted over the sessions
/// directory in a private mount namespace): the run completes, its window is intact, and it
/// says the full output was not saved instead of offering a cut artifact as the full one.
#[tokio::test]
async fn faults_artifact_write_fails_mid_run() {
    let state = tempfile::tempdir().unwrap();
    let sessions = state.path().join("sessions");
    std::fs::create_dir(&sessions).unwrap();
    let probe =
        std::process::Command::new("unshare").args(["--mount", "--map-root-user", "true"]).status();
    if !probe.is_ok_and(|s| s.success()) {
        println!("SKIPPED here, said loudly: `unshare --mount --map-root-user` is not permitted, so no private tmpfs can fill up; faults_artifacts_dir_unwritable covers the failing-create path");
        return;
    }
    let script =
        format!("mount -t tmpfs -o size=256k tmpfs {} && exec \"$0\" \"$@\"", sessions.display());
    let wrapper = ["unshare", "--mount", "--map-root-user", "sh", "-c", script.as_str()];
    let mut rpc = Rpc::start_wrapped(state, None, &["--session-id", "s1"], &[], &wrapper).await;
    let d = rpc.tool(json!({"command": "seq 1 1000000"})).await;
    assert_eq!(d["exitCode"], 0, "{d}");
    assert_eq!(d["totalLines"], 1000000);
    assert_eq!(d["truncated"], true);
    assert!(d.get("artifactId").is_none(), "{d}");
    let out = d["output"].as_str().unwrap();
    assert!(out.contains("\n999999\n1000000\n\n[Showing lines"), "{}", &out[out.len() - 300..]);
    assert!(
        out.ends_with("Full output not saved: writing the artifact failed: No space left on device (os error 28)]"),
        "{}",
        &out[out.len() - 300..]
    );
    // Small outputs need no artifact and still work; the backend keeps serving.
    assert_eq!(rpc.tool(json!({"command": "echo ok"})).await["output"], "ok\n");
}

/// A symlink planted where the next artifact will be written is not followed: its target is
/// untouched and the artifact goes to the next free id.
#[tokio::test]
async fn faults_planted_symlink_is_not_followed() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().join("sessions").join("s1");
    std::fs::create_dir_all(&dir).unwrap();
    let victim = state.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    std::os::unix::fs::symlink(&victim, dir.join("0.bash.log")).unwrap();
    let mut rpc = Rpc::start_in(state, None, &["--session-id", "s1"]).await;
    let d = rpc.tool(json!({"command": "seq 1 100000"})).await;
    assert_eq!(d["truncated"], true);
    assert_eq!(d["artifactId"], 1, "{d}");
    let victim = rpc.state.path().join("victim");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    let full = std::fs::read_to_string(dir.join("1.bash.log")).unwrap();
    assert_eq!(full.lines().count(), 100000);
}

/// Our runtime directories under `base`.
fn run_dirs(base: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut dirs: Vec<_> = std::fs::read_dir(base)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("agent-bash-"))
        .collect();
    dirs.sort();
    dirs
}

/// Sets a directory's modification time `ago` in the past.
fn age(dir: &std::path::Path, ago: Duration) {
    let when = std::time::SystemTime::now() - ago;
    std::fs::File::open(dir).unwrap().set_modified(when).unwrap();
}

/// A SIGKILLed backend cannot remove its runtime directory (FIFOs, per-command files): the
/// next backend to start removes it once it has been idle a minute, and never a live
/// backend's, however idle.
#[tokio::test]
async fn faults_killed_backends_runtime_dir_is_swept_by_the_next() {
    let base = tempfile::tempdir().unwrap();
    let env = [("XDG_RUNTIME_DIR", base.path().to_str().unwrap())];
    let mut live = Rpc::start_env(tempfile::tempdir().unwrap(), None, &[], &env).await;
    live.tool(json!({"command": "true"})).await;
    let mut killed = Rpc::start_env(tempfile::tempdir().unwrap(), None, &[], &env).await;
    killed.tool(json!({"command": "true"})).await;
    let dirs = run_dirs(base.path());
    assert_eq!(dirs.len(), 2, "{dirs:?}");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(killed.pid(), libc::SIGKILL) };
    let _ = killed.child.wait().await;
    assert_eq!(run_dirs(base.path()), dirs, "a killed backend leaves its directory");
    for d in &dirs {
        age(d, Duration::from_secs(120));
    }
    let mut next = Rpc::start_env(tempfile::tempdir().unwrap(), None, &[], &env).await;
    next.tool(json!({"command": "true"})).await;
    let swept = eventually(Duration::from_secs(10), || run_dirs(base.path()).len() == 2).await;
    let left = run_dirs(base.path());
    assert!(swept, "{left:?}");
    let live_dir = dirs.iter().find(|d| left.contains(d));
    assert!(live_dir.is_some(), "the live backend's directory stays: {left:?}");
    let r = live.tool(json!({"command": "echo still"})).await;
    assert_eq!(r["output"], "still\n");
    live.stop().await;
    next.stop().await;
    assert!(run_dirs(base.path()).is_empty(), "backends that end remove their own");
}
