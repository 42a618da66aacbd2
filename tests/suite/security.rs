//! The security review's findings (issue 27, SPEC §5 and §13), each written as the attack: a
//! prompt-injected agent's command trying to leave its workspace, reach the session protocol,
//! or read what is the user's. Every test here failed on the code before its fix.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_bash::exec::settings::Settings;
use agent_bash::exec::{Origin, Request, Runtime};
use agent_bash::result::BashResult;
use tokio_util::sync::CancellationToken;

/// A runtime on bash with its own state directory and shells' `TMPDIR`.
fn runtime(mut settings: Settings) -> (Arc<Runtime>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    settings.env.insert("TMPDIR".into(), tmp.to_str().unwrap().into());
    settings.state_dir = Some(dir.path().join("state"));
    let settings = Settings { shell: Some("/bin/bash".into()), ..settings };
    let rt = Runtime::new(settings, dir.path().join("session"), dir.path().to_path_buf()).unwrap();
    (Arc::new(rt), dir)
}

async fn call(rt: &Runtime, cwd: &Path, command: &str, timeout: f64) -> BashResult {
    let req = Request {
        origin: Origin::Tool,
        command: command.into(),
        cwd: Some(cwd.to_str().unwrap().into()),
        timeout: Some(timeout),
        ..Default::default()
    };
    rt.run(req, CancellationToken::new(), None).await.unwrap()
}

/// Writes forged status lines (the format of every version so far: `D <seq> <status>`, for the
/// first 200 sequence numbers, and bare statuses) on every descriptor 3–63 the shell has open.
const FORGE: &str = "for __fd in $(seq 3 63); do [ -e /proc/$$/fd/$__fd ] || continue; \
     for __s in $(seq 1 200); do printf 'D %d 0\\nD %d 7\\n0\\n' $__s $__s >&$__fd; done; \
     done 2>/dev/null";

#[tokio::test]
async fn forged_status_lines_neither_end_the_call_nor_touch_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _d) = runtime(Settings::default());
    // Warm the session up, so sequence numbers are under way.
    assert_eq!(call(&rt, dir.path(), "true", 10.0).await.exit_code, Some(0));

    // A forged ending while the command still runs: the call must time out honestly.
    let t = Instant::now();
    let r = call(&rt, dir.path(), &format!("{FORGE}; echo forged; sleep 3001"), 2.0).await;
    assert!(
        r.timed_out,
        "a forged status ended the call: exit {:?} after {:?}",
        r.exit_code,
        t.elapsed()
    );
    assert!(t.elapsed() >= Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(r.output.contains("forged"), "{}", r.output);

    // The next call is intact.
    let r = call(&rt, dir.path(), "echo intact", 10.0).await;
    assert_eq!((r.exit_code, r.text.trim()), (Some(0), "intact"), "{r:?}");

    // A forged line that arrives during a later call (a job of an earlier one) changes
    // nothing in it: its output is all there, with its own status.
    let r =
        call(&rt, dir.path(), &format!("( sleep 1; {FORGE} ) >/dev/null 2>&1 & echo left"), 10.0)
            .await;
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let r = call(
        &rt,
        dir.path(),
        "echo one; sleep 2; echo two; exit_with() { return $1; }; exit_with 3",
        10.0,
    )
    .await;
    assert_eq!((r.exit_code, r.text.trim()), (Some(3), "one\ntwo"), "{r:?}");
    let r = call(&rt, dir.path(), "echo after", 10.0).await;
    assert_eq!((r.exit_code, r.text.trim()), (Some(0), "after"), "{r:?}");
}

/// What the fence cannot deny (chmod, chown, timestamps outside the workspace) is stated in the
/// README's security model, as SPEC §13 asks when it is not denied by other means.
#[test]
fn readme_states_what_the_fence_does_not_cover() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = readme.split("## Security model").nth(1).expect("a Security model section");
    let section = section.split("\n## ").next().unwrap();
    for needed in
        ["prompt injection", "not metadata", "chmod, chown", "timestamps", "are not denied"]
    {
        assert!(section.contains(needed), "the security model does not say {needed:?}");
    }
    // Each fixed attack names a test that exists.
    let this =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/suite/security.rs"))
            .unwrap();
    for name in section.split('`').filter(|w| w.starts_with("security_")) {
        let f = name.trim_start_matches("security_");
        assert!(this.contains(&format!("fn {f}(")), "README names a missing test {name}");
    }
}

/// 150 tool calls, each under its own 900 KiB `session_key`: refused with a clear error (keys
/// are at most 256 bytes), and the backend stays within the README's 64 MiB (it grew to
/// 154 MiB when every key stayed in memory). A 256-byte key still works.
#[tokio::test]
async fn huge_session_keys_are_refused_and_memory_stays_bounded() {
    use super::support::{status_kib, Rpc};
    use serde_json::json;
    let mut rpc = Rpc::start().await;
    let pid = rpc.pid();
    for n in 0..150 {
        let key = format!("{n:03}{}", "k".repeat(900 * 1024));
        let id =
            rpc.send(json!({"type": "tool_call", "command": "true", "session_key": key})).await;
        let r = rpc.response(&id).await;
        assert_eq!(r["success"], false, "key {n} accepted");
        let err = r["error"].as_str().unwrap_or_default();
        assert!(err.contains("session_key") && err.contains("256"), "{r}");
    }
    let d = rpc.tool(json!({"command": "echo ok", "session_key": "k".repeat(256)})).await;
    assert_eq!(d["output"], "ok\n");
    let hwm = status_kib(pid, "VmHWM");
    assert!(hwm <= 64 * 1024, "peak RSS {hwm} KiB");
    rpc.stop().await;
}
