//! Remote shell sessions (contract §12) against a real OpenSSH server on loopback, started by each
//! test with throwaway keys (`scripts/sshd.sh` installs Debian's `openssh-server` when absent;
//! without `sshd` these tests fail, they never skip).

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_bash::exec::{LiveUpdate, Request, Runtime, Settings, UpdateFn};
use agent_bash::result::BashResult;
use agent_bash::sanitize::Sanitizer;
use agent_bash::shell::remote::{Encoder, RemoteConfig, RemoteShell};
use agent_bash::shell::Session;
use pretty_assertions::assert_eq;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::differential::{ALIASES, CORPUS, EVAL, SEQUENCES};
use super::sshd::Sshd;
use super::support::{eventually, unique_sleep, Rpc};

impl Sshd {
    pub fn settings(&self, state: &Path) -> Settings {
        let mut s = Settings { state_dir: Some(state.join("state")), ..Settings::default() };
        s.profiles.insert("dev".into(), self.argv());
        s
    }
}

struct Fixture {
    sshd: Sshd,
    rt: Arc<Runtime>,
    work: tempfile::TempDir,
    _state: tempfile::TempDir,
}

fn fixture() -> Fixture {
    let sshd = Sshd::start();
    let state = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("file.txt"), "alpha\nbeta\ngamma\n").unwrap();
    let rt = Runtime::new(
        sshd.settings(state.path()),
        state.path().join("session"),
        work.path().to_path_buf(),
    )
    .unwrap();
    Fixture { sshd, rt: Arc::new(rt), work, _state: state }
}

fn req(command: &str, key: &str) -> Request {
    Request {
        command: command.into(),
        timeout: Some(60.0),
        session_key: Some(key.into()),
        profile: Some("dev".into()),
        ..Request::default()
    }
}

async fn run(f: &Fixture, command: &str, key: &str) -> BashResult {
    f.rt.run(req(command, key), CancellationToken::new(), None).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_keeps_state_across_calls_and_says_where_it_ran() {
    let f = fixture();
    let r = run(&f, "x=41; f() { echo fn-$1; }; alias hi='echo alias-ran'; cd /tmp", "s").await;
    assert_eq!((r.exit_code, r.shell_restarted), (Some(0), false), "{r:?}");
    let remote = serde_json::to_value(&r).unwrap()["remote"].clone();
    assert_eq!(remote["profile"], "dev");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(remote["host"], host.trim());
    let r = run(&f, "echo $((x+1)); f a\nhi; pwd", "s").await;
    assert_eq!(r.output, "42\nfn-a\nalias-ran\n/tmp\n");
    // A cwd given for one call; the next call without one stays where the shell is.
    let mut q = req("pwd; cd ..; pwd", "s");
    q.cwd = Some(f.work.path().to_string_lossy().into_owned());
    let r = f.rt.run(q, CancellationToken::new(), None).await.unwrap();
    let parent = f.work.path().parent().unwrap().display().to_string();
    assert_eq!(r.output, format!("{}\n{parent}\n", f.work.path().display()));
    assert_eq!(run(&f, "pwd", "s").await.output, format!("{parent}\n"));
    // `~` is the remote home.
    let mut q = req("pwd", "s");
    q.cwd = Some("~".into());
    let home = format!("{}\n", f.sshd.home().display());
    assert_eq!(f.rt.run(q, CancellationToken::new(), None).await.unwrap().output, home);
    // Another key is another session.
    assert_eq!(run(&f, "echo ${x:-unset}", "other").await.output, "unset\n");
    // The hardening environment is exported there too.
    assert_eq!(run(&f, "echo $AGENT_BASH $GIT_PAGER $CI", "s").await.output, "1 cat true\n");
    // Errors, exit statuses and a failing command that the session survives.
    let r = run(&f, "echo out; echo err >&2; exit_status() { return 3; }; exit_status", "s").await;
    assert_eq!(
        (r.output.as_str(), r.exit_code),
        ("out\nerr\n\nCommand exited with code 3", Some(3))
    );
    let r = run(&f, "echo 'unterminated", "s").await;
    assert_eq!(r.exit_code, Some(2));
    assert_eq!(run(&f, "echo $x", "s").await.output, "41\n");
    f.rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_bad_input_is_a_clear_error_and_the_session_lives_on() {
    let f = fixture();
    let mut q = req("x=1", "s");
    q.profile = Some("nope".into());
    let err = f.rt.run(q.clone(), CancellationToken::new(), None).await.unwrap_err().to_string();
    assert_eq!(err, "Unknown profile \"nope\" (defined: dev, or \"local\")");
    assert_eq!(f.rt.precheck(&q).unwrap_err().to_string(), err);
    assert_eq!(run(&f, "x=7", "s").await.exit_code, Some(0));
    let mut q = req("echo never", "s");
    q.cwd = Some("/nonexistent-remote-dir".into());
    let err = f.rt.run(q.clone(), CancellationToken::new(), None).await.unwrap_err().to_string();
    assert!(
        err.starts_with("Working directory does not exist: /nonexistent-remote-dir (on "),
        "{err}"
    );
    // The local check is not applied to a remote cwd.
    assert!(f.rt.precheck(&q).is_ok());
    let r = run(&f, "echo $x", "s").await;
    assert_eq!((r.output.as_str(), r.shell_restarted), ("7\n", false));
    // `local` is this machine whatever the default says.
    let mut q = req("echo here", "s");
    q.profile = Some("local".into());
    let r = f.rt.run(q, CancellationToken::new(), None).await.unwrap();
    assert_eq!((r.output.as_str(), r.remote.is_none()), ("here\n", true));
    // An engine that cannot connect: the call fails with the engine's words.
    let state = tempfile::tempdir().unwrap();
    let mut s = f.sshd.settings(state.path());
    let (_closed, port) = closed_port();
    let mut argv = f.sshd.argv();
    let p = argv.iter().position(|a| a == "-p").unwrap();
    argv[p + 1] = port.to_string();
    s.profiles.insert("down".into(), argv);
    let rt = Runtime::new(s, state.path().join("session"), f.work.path().into()).unwrap();
    let mut q = req("true", "s");
    q.profile = Some("down".into());
    let r = rt.run(q, CancellationToken::new(), None).await.unwrap();
    assert!(r.is_error);
    assert!(r.output.starts_with("Cannot start remote session \"down\" (ssh "), "{}", r.output);
    assert!(r.output.contains("Connection refused"), "{}", r.output);
    f.rt.shutdown().await;
}

/// A loopback port that refuses connections for as long as the socket lives: bound, never
/// listening, so no other process can take it meanwhile (a port found free and let go could be).
fn closed_port() -> (std::os::fd::OwnedFd, u16) {
    use std::os::fd::FromRawFd;
    // SAFETY: a new socket we own; bind and getsockname write only into our own structures.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let owned = std::os::fd::OwnedFd::from_raw_fd(fd);
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        addr.sin_family = libc::AF_INET as libc::sa_family_t;
        addr.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let bound = libc::bind(fd, (&raw const addr).cast(), len);
        assert_eq!(bound, 0, "bind: {}", std::io::Error::last_os_error());
        let mut got: libc::sockaddr_in = std::mem::zeroed();
        let mut got_len = len;
        assert_eq!(libc::getsockname(fd, (&raw mut got).cast(), &mut got_len), 0);
        (owned, u16::from_be(got.sin_port))
    }
}

/// Collects live updates.
fn recorder() -> (UpdateFn, Arc<Mutex<Vec<LiveUpdate>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let f: UpdateFn = Arc::new(move |u: LiveUpdate| s.lock().unwrap().push(u));
    (f, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_output_streams_live() {
    let f = fixture();
    let (on_update, seen) = recorder();
    let marker = unique_sleep();
    // The command waits for a file the test creates only after it saw the first line live.
    let flag = f.work.path().join("go");
    let cmd = format!(
        "echo first; while [ ! -e {} ]; do sleep 0.02; done; echo second # {marker}",
        flag.display()
    );
    let rt = f.rt.clone();
    let task = tokio::spawn(async move {
        rt.run(req(&cmd, "s"), CancellationToken::new(), Some(on_update)).await.unwrap()
    });
    let saw_first = eventually(Duration::from_secs(30), || {
        seen.lock().unwrap().iter().any(|u| u.tail.contains("first") && !u.tail.contains("second"))
    })
    .await;
    std::fs::write(&flag, "").unwrap();
    let r = task.await.unwrap();
    assert!(saw_first, "no live update before the command ended");
    assert_eq!(r.output, "first\nsecond\n");
    f.rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_cancel_and_timeout_kill_the_whole_remote_tree() {
    let f = fixture();
    assert_eq!(run(&f, "keep=1", "s").await.exit_code, Some(0));
    for timeout in [false, true] {
        let (a, b, c) = (unique_sleep(), unique_sleep(), unique_sleep());
        // A background job, one that left the session with setsid, and the foreground.
        let cmd = format!("sleep {a} & (setsid sleep {b} &); echo started; sleep {c}");
        let (on_update, seen) = recorder();
        let cancel = CancellationToken::new();
        let mut q = req(&cmd, "s");
        if timeout {
            q.timeout = Some(1.5);
        }
        let rt = f.rt.clone();
        let c2 = cancel.clone();
        let task = tokio::spawn(async move { rt.run(q, c2, Some(on_update)).await.unwrap() });
        let started = eventually(Duration::from_secs(30), || {
            seen.lock().unwrap().iter().any(|u| u.tail.contains("started"))
        })
        .await;
        assert!(started, "the command never started");
        assert_eq!(f.sshd.remote_pgrep(&c).lines().count(), 1, "the command is not running");
        if !timeout {
            cancel.cancel();
        }
        let r = task.await.unwrap();
        assert!(r.cancelled && r.exit_code.is_none(), "{r:?}");
        assert_eq!(r.timed_out, timeout);
        assert!(r.output.contains("started"), "{}", r.output);
        for m in [&a, &b, &c] {
            assert_eq!(f.sshd.remote_pgrep(m), "", "sleep {m} survived (timeout: {timeout})");
        }
        // The session was thrown away: the next call gets a fresh one and says so.
        let r = run(&f, "echo ${keep:-fresh}; keep=1", "s").await;
        assert_eq!((r.output.as_str(), r.shell_restarted), ("fresh\n", true));
    }
    f.rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_lost_connection_fails_the_call_and_the_next_one_reconnects() {
    let f = fixture();
    for kill_server_side in [false, true] {
        let marker = unique_sleep();
        assert_eq!(run(&f, "state=1", "s").await.exit_code, Some(0));
        let before = f.sshd.connection_pids();
        let (on_update, seen) = recorder();
        let rt = f.rt.clone();
        let cmd = format!("echo started; sleep {marker}");
        let task = tokio::spawn(async move {
            rt.run(req(&cmd, "s"), CancellationToken::new(), Some(on_update)).await.unwrap()
        });
        assert!(
            eventually(Duration::from_secs(30), || seen
                .lock()
                .unwrap()
                .iter()
                .any(|u| u.tail.contains("started")))
            .await
        );
        if kill_server_side {
            // The per-connection sshd process of our session.
            for pid in &before {
                unsafe { libc::kill(*pid, libc::SIGKILL) };
            }
        } else {
            let port = format!("-p {} ", f.sshd.port);
            let ssh: Vec<i32> = super::support::procs_with_cmdline(&port)
                .into_iter()
                .filter(|p| {
                    std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap().trim() == "ssh"
                })
                .collect();
            assert_eq!(ssh.len(), 1, "one ssh client for the session");
            unsafe { libc::kill(ssh[0], libc::SIGKILL) };
        }
        let r = task.await.unwrap();
        assert!(r.is_error && r.exit_code.is_none(), "{r:?}");
        assert!(r.output.starts_with("started\n\nRemote session lost: "), "{}", r.output);
        if kill_server_side {
            assert!(r.output.contains("closed by remote host"), "{}", r.output);
        }
        // The remote side cleaned up after itself.
        let gone = eventually(Duration::from_secs(10), || f.sshd.remote_pgrep(&marker).is_empty());
        assert!(gone.await, "sleep {marker} survived the lost connection");
        let r = run(&f, "echo ${state:-fresh}", "s").await;
        assert_eq!((r.output.as_str(), r.shell_restarted), ("fresh\n", true), "{r:?}");
    }
    f.rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_exit_restarts_the_session() {
    let f = fixture();
    assert_eq!(run(&f, "v=1", "s").await.exit_code, Some(0));
    let r = run(&f, "echo bye; exit 4", "s").await;
    assert_eq!((r.output.as_str(), r.exit_code), ("bye\n\nCommand exited with code 4", Some(4)));
    let r = run(&f, "echo ${v:-fresh}", "s").await;
    assert_eq!((r.output.as_str(), r.shell_restarted), ("fresh\n", true));
    f.rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_artifacts_stay_local_with_the_exact_output() {
    let f = fixture();
    let r = run(&f, "seq 1 300000", "s").await;
    assert!(r.truncated, "{r:?}");
    let id = r.artifact_id.expect("an artifact");
    let path = f.rt.store().path(id);
    let want = Command::new("seq").args(["1", "300000"]).output().unwrap().stdout;
    assert_eq!(std::fs::read(&path).unwrap(), want, "artifact {}", path.display());
    assert_eq!(r.total_lines, 300000);
    // The head-only rule closes the remote producer early, as `| head` would.
    let r = run(&f, "yes | head -n 3", "s").await;
    assert_eq!((r.output.as_str(), r.exit_code), ("y\ny\ny\n", Some(0)));
    f.rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_output_cannot_forge_frames() {
    let f = fixture();
    // The command knows the session's nonce (it is a variable of the shell it runs in) and
    // prints every kind of frame with it, a fake length included: all of it is output.
    let cmd = r#"n=$__ab_n; printf '%s D %s 0\n%s X 0\n%s K\n%s F %s\n%s O %s 5\nhello\n%s E %s\n' "$n" "$__ab_s" "$n" "$n" "$n" "$__ab_s" "$n" "$__ab_s" "$n" "$__ab_s" >/tmp/frames.$$; cat /tmp/frames.$$; rm /tmp/frames.$$; echo 'x D 1 0'; exit_with() { return $1; }; exit_with 5"#;
    let r = run(&f, cmd, "s").await;
    let lines: Vec<&str> = r.text.lines().collect();
    assert_eq!(lines.len(), 8, "{}", r.text);
    assert!(lines[0].ends_with(" D 1 0") && lines[0].len() > 10, "{}", r.text);
    assert_eq!(lines[5], "hello");
    assert_eq!(lines[7], "x D 1 0");
    assert_eq!(r.exit_code, Some(5));
    assert!(!r.shell_restarted);
    // The session is intact.
    assert_eq!(run(&f, "echo ok", "s").await.output, "ok\n");
    f.rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_shell_encoder_without_perl_is_exact_and_streams() {
    let sshd = Sshd::start();
    let cfg = RemoteConfig {
        profile: "dev".into(),
        argv: sshd.argv(),
        env: vec![],
        encoder: Encoder::Shell,
    };
    let mut sh = RemoteShell::connect(&cfg).await.unwrap();
    let mut out = Vec::new();
    let cancel = CancellationToken::new();
    // Every byte value, a partial last line, and more than one frame's worth.
    let cmd =
        "for i in $(seq 0 255); do printf \"\\\\$(printf %o $i)\"; done; seq 1 3000; printf tail";
    let mut sink = |b: &[u8]| {
        out.extend_from_slice(b);
        true
    };
    let end = sh.run(cmd, None, &mut sink, None, &cancel).await;
    assert!(matches!(end, Ok(e) if e.ending == agent_bash::shell::local::Ending::Done(0)));
    let want = Command::new("bash").arg("-c").arg(cmd).output().unwrap().stdout;
    assert_eq!(out.len(), want.len());
    assert!(out == want, "the bytes differ");
    // The bash reader keeps state and kills the whole tree on cancel, as the perl one does.
    let mut text = Vec::new();
    let mut sink = |b: &[u8]| {
        text.extend_from_slice(b);
        true
    };
    let _ = sh.run("v=kept; cd /tmp", None, &mut sink, None, &cancel).await;
    let _ = sh.run("echo $v; pwd", None, &mut sink, None, &cancel).await;
    assert_eq!(String::from_utf8_lossy(&text), "kept\n/tmp\n");
    let (a, b) = (unique_sleep(), unique_sleep());
    let cmd = format!("sleep {a} & (setsid sleep {b} &); sleep {b}");
    let mut sink = |_: &[u8]| true;
    let deadline = Some(Instant::now() + Duration::from_millis(1500));
    let end = sh.run(&cmd, None, &mut sink, deadline, &cancel).await;
    assert!(matches!(end, Ok(e) if e.ending == agent_bash::shell::local::Ending::TimedOut));
    assert_eq!(sshd.remote_pgrep(&a), "");
    assert_eq!(sshd.remote_pgrep(&b), "");
    sh.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_profile_over_rpc_and_exec_flag() {
    let sshd = Sshd::start();
    let argv = serde_json::to_string(&sshd.argv()).unwrap();
    let config = format!("[profiles]\ndev = {argv}\n");
    let mut rpc = Rpc::start_with(Some(&config)).await;
    let d = rpc.tool(json!({"command": "v=rpc; echo $v", "profile": "dev"})).await;
    assert_eq!(d["output"], "rpc\n", "{d}");
    assert_eq!(d["remote"]["profile"], "dev", "{d}");
    let d = rpc.tool(json!({"command": "echo ${v}", "profile": "dev"})).await;
    assert_eq!(d["output"], "rpc\n", "{d}");
    let id = rpc.send(json!({"type": "tool_call", "command": "true", "profile": "zz"})).await;
    let r = rpc.response(&id).await;
    assert_eq!(r["success"], false, "{r}");
    assert!(r["error"].as_str().unwrap().contains("Unknown profile \"zz\""), "{r}");
    rpc.stop().await;
    // `exec --profile`.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, &config).unwrap();
    let out = Command::new(super::support::BIN)
        .args(["exec", "--config"])
        .arg(&cfg)
        .args(["--profile", "dev", "--json", "--", "echo $AGENT_BASH; exit 3"])
        .env("XDG_STATE_HOME", dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["output"], "1\n\nCommand exited with code 3", "{v}");
    assert_eq!(v["remote"]["profile"], "dev");
}

/// What `bash -c SCRIPT` prints here, in the environment the remote shell has (sshd's PATH and
/// HOME, our exports), from the same directory; sanitized as contract §4.1 does.
fn bash_here(f: &Fixture, script: &str, extra: &[(&str, &str)]) -> (String, i32) {
    let (mut reader, writer) = std::io::pipe().unwrap();
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(script)
        .env_clear()
        .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .env("HOME", f.sshd.home())
        .envs(agent_bash::exec::remote_path::remote_env(f.rt.settings()))
        .envs(extra.iter().copied())
        .current_dir(f.work.path())
        .stdin(Stdio::null())
        .stdout(writer.try_clone().unwrap())
        .stderr(writer);
    let mut child = cmd.spawn().unwrap();
    drop(cmd);
    let mut raw = Vec::new();
    reader.read_to_end(&mut raw).unwrap();
    let st = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    let code = st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0));
    let mut s = Sanitizer::new();
    let mut out = String::new();
    s.push(&raw, &mut out);
    s.finish(&mut out);
    (out, code)
}

/// The oracle of one corpus case, with the deliberate differences of the local suite.
fn oracle(f: &Fixture, command: &str, flags: u8) -> (String, i32) {
    if flags & EVAL != 0 {
        return bash_here(f, "eval \"$DIFF_CMD\"", &[("DIFF_CMD", command)]);
    }
    let script = match flags & ALIASES != 0 {
        true => format!("shopt -s expand_aliases\n{command}"),
        false => command.to_string(),
    };
    // A remote shell keeps a `| head`/`| tail` stage (contract §1: one stream per command), so
    // bash's own status is the one reported, [`PRODUCER`] or not.
    bash_here(f, &script, &[])
}

/// Cases of the local differential corpus left out here, each with its reason.
const SKIPPED: &[(&str, &str)] = &[];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_differential_corpus_matches_local_bash() {
    let f = fixture();
    let work = f.work.path().to_string_lossy().into_owned();
    let mut diffs = Vec::new();
    let mut compared = 0;
    for (n, &(command, flags)) in CORPUS.iter().enumerate() {
        if SKIPPED.iter().any(|(c, _)| *c == command) {
            continue;
        }
        let want = oracle(&f, command, flags);
        // A fresh session per command: each starts from the state `bash -c` has.
        let mut q = req(command, &format!("d{n}"));
        q.cwd = Some(work.clone());
        q.timeout = Some(30.0);
        let r = f.rt.run(q, CancellationToken::new(), None).await.unwrap();
        let got = (r.text.clone(), r.exit_code.unwrap_or(-1));
        compared += 1;
        if got != want {
            diffs.push(format!("{command:?}\n  bash:   {want:?}\n  remote: {got:?}"));
        }
    }
    // Sequences on one session: state carries over and a broken command fails alone. The
    // oracle runs the earlier steps (output discarded) then the step, each through `eval`.
    for (n, steps) in SEQUENCES.iter().enumerate() {
        for k in 0..steps.len() {
            let mut script = String::new();
            let mut vars = Vec::new();
            for (i, step) in steps.iter().enumerate().take(k + 1) {
                let name = format!("DIFF_S{i}");
                match i < k {
                    true => {
                        script.push_str(&format!("eval \"${name}\" >/dev/null 2>&1 </dev/null; "))
                    }
                    false => script.push_str(&format!("eval \"${name}\"")),
                }
                vars.push((name, *step));
            }
            let extra: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            let want = bash_here(&f, &script, &extra);
            let mut q = req(steps[k], &format!("seq{n}"));
            q.cwd = Some(work.clone());
            let r = f.rt.run(q, CancellationToken::new(), None).await.unwrap();
            let mut got = (r.text.clone(), r.exit_code.unwrap_or(-1));
            if r.shell_restarted {
                got.0.push_str(" [shell restarted]");
            }
            if got != want {
                diffs.push(format!("{steps:?} step {k}\n  bash:   {want:?}\n  remote: {got:?}"));
            }
        }
    }
    f.rt.shutdown().await;
    assert!(compared >= 150, "compared {compared} cases");
    assert!(diffs.is_empty(), "{} differences:\n{}", diffs.len(), diffs.join("\n"));
}

/// Which profile a call gets (contract §12): its own `profile`, else its session key's
/// `[profile_by_key]` entry, else `default_profile`; `"local"` is this machine.
#[test]
fn remote_profile_of_a_call_follows_its_key() {
    let settings = Settings::parse(
        "default_profile = \"dev\"\n[profiles]\ndev = [\"ssh\", \"-T\", \"devbox\"]\nbox = [\"docker\", \"exec\", \"-i\", \"b\"]\n[profile_by_key]\nci = \"box\"\nhere = \"local\"\n",
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::new(settings, dir.path().join("s"), dir.path().to_path_buf()).unwrap();
    let name = |key: Option<&str>, profile: Option<&str>| {
        let r = Request {
            command: "true".into(),
            session_key: key.map(str::to_string),
            profile: profile.map(str::to_string),
            ..Default::default()
        };
        rt.remote_profile(&r).unwrap().map(|(name, _)| name)
    };
    assert_eq!(name(Some("ci"), None).as_deref(), Some("box"));
    assert_eq!(name(Some("here"), None), None);
    assert_eq!(name(None, None).as_deref(), Some("dev"));
    assert_eq!(name(Some("other"), None).as_deref(), Some("dev"));
    assert_eq!(name(Some("ci"), Some("local")), None);
    assert_eq!(name(Some("here"), Some("dev")).as_deref(), Some("dev"));
}
