//! Shell sessions driven directly (below the pipeline): protocol, state, process hygiene.

use std::path::Path;
use std::time::{Duration, Instant};

use agent_bash::shell::local::{Ending, Shell, ShellConfig};
use tokio_util::sync::CancellationToken;

pub fn config(dir: &Path) -> ShellConfig {
    ShellConfig {
        shell: "/bin/bash".into(),
        env: std::env::vars_os().collect(),
        prefix: vec![],
        snapshot: None,
        runtime_dir: dir.to_path_buf(),
        owner: format!("test-{}", agent_bash::shell::local::nonce()),
        fence: None,
        spawn: true,
    }
}

async fn run(shell: &mut Shell, cmd: &str, timeout: Option<Duration>) -> (Ending, String) {
    let mut out = Vec::new();
    let mut sink = |b: &[u8]| {
        out.extend_from_slice(b);
        true
    };
    let cancel = CancellationToken::new();
    let end = shell
        .run(cmd, Path::new("/tmp"), &mut sink, timeout.map(|t| Instant::now() + t), &cancel)
        .await
        .unwrap();
    (end.ending, String::from_utf8_lossy(&out).into_owned())
}

#[tokio::test]
async fn shell_keeps_state_and_reports_status() {
    let dir = tempfile::tempdir().unwrap();
    let mut sh = Shell::spawn(&config(dir.path())).await.unwrap();
    assert_eq!(
        run(&mut sh, "export FOO=bar; f() { echo fn-$1; }; alias hi='echo alias'", None).await.0,
        Ending::Done(0)
    );
    assert_eq!(
        run(&mut sh, "echo $FOO; f x; hi", None).await,
        (Ending::Done(0), "bar\nfn-x\nalias\n".into())
    );
    assert_eq!(
        run(&mut sh, "echo out; echo err >&2; false", None).await,
        (Ending::Done(1), "out\nerr\n".into())
    );
    assert_eq!(run(&mut sh, "if then fi", None).await.0, Ending::Done(2));
    assert_eq!(run(&mut sh, "echo $FOO", None).await.1, "bar\n");
    assert_eq!(run(&mut sh, "pwd", None).await.1, "/tmp\n");
    assert_eq!(run(&mut sh, "exit 3", None).await.0, Ending::ShellExited(Some(3)));
}

#[tokio::test]
async fn shell_background_job_returns_quickly() {
    let dir = tempfile::tempdir().unwrap();
    let mut sh = Shell::spawn(&config(dir.path())).await.unwrap();
    let t = Instant::now();
    let (end, out) = run(&mut sh, "{ sleep 5; } & echo fg", None).await;
    assert_eq!((end, out.as_str()), (Ending::Done(0), "fg\n"));
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    sh.kill().await;
}

#[tokio::test]
async fn shell_timeout_kills_tree_including_setsid() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let mut sh = Shell::spawn(&cfg).await.unwrap();
    let (end, out) = run(
        &mut sh,
        "setsid sleep 300 & trap '' TERM; echo started; sleep 10; echo done",
        Some(Duration::from_millis(300)),
    )
    .await;
    assert_eq!(end, Ending::TimedOut);
    assert_eq!(out, "started\n");
    assert!(sh.group().members().is_empty());
}

/// `set -n` turns execution off for good in a non-interactive shell: the session must say the
/// shell is lost (and be replaced) instead of waiting for the timeout, and output before it
/// still arrives.
#[tokio::test]
async fn shell_that_stops_executing_is_lost_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut sh = Shell::spawn(&config(dir.path())).await.unwrap();
    let (ending, out) =
        run(&mut sh, "echo before; set -n; echo after", Some(Duration::from_secs(60))).await;
    assert_eq!((ending, out.as_str()), (Ending::ShellExited(None), "before\n"));
}

#[tokio::test]
async fn shell_set_n_through_the_runtime_restarts_the_session() {
    use agent_bash::exec::{Origin, Request, Runtime, Settings};
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings { shell: Some("/bin/bash".into()), ..Default::default() };
    let rt = Runtime::new(settings, dir.path().join("s"), dir.path().to_path_buf()).unwrap();
    let req = |c: &str| Request {
        origin: Origin::Tool,
        command: c.into(),
        timeout: Some(60.0),
        ..Default::default()
    };
    let cancel = CancellationToken::new;
    let r = rt.run(req("set -n"), cancel(), None).await.unwrap();
    assert!(!r.timed_out && r.is_error, "{}", r.output);
    let r = rt.run(req("echo ok"), cancel(), None).await.unwrap();
    assert_eq!((r.output.as_str(), r.shell_restarted), ("ok\n", true));
}
