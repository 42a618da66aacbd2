//! Shell sessions driven directly (below the pipeline): protocol, state, process hygiene.

use std::path::Path;
use std::time::{Duration, Instant};

use agent_bash::shell::local::{Ending, Shell, ShellConfig};
use agent_bash::shell::Session;
use tokio_util::sync::CancellationToken;

pub fn config(dir: &Path) -> ShellConfig {
    config_for(dir, "/bin/bash")
}

/// A session of `shell` (a path) with the test's environment.
pub fn config_for(dir: &Path, shell: &str) -> ShellConfig {
    ShellConfig {
        shell: shell.into(),
        env: std::env::vars_os().collect(),
        prefix: vec![],
        snapshot: None,
        runtime_dir: dir.to_path_buf(),
        owner: format!("test-{}", agent_bash::shell::local::nonce()),
        fence: None,
        runner: true,
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

in_each_shell!(
    shell_keeps_state_and_reports_status,
    shell_background_job_returns_quickly,
    shell_timeout_kills_tree_including_setsid,
    shell_that_stops_executing_is_lost_not_waited_on,
    shell_set_n_through_the_runtime_restarts_the_session,
    shell_unterminated_constructs_fail_alone,
    shell_output_moved_by_the_call_ends_with_its_status,
);

/// What the shell prints (both streams, in /tmp) for `cmd` and its status: `zsh -c CMD`,
/// `bash -c CMD` (a bash session runs each call as `bash -c` runs its string). A bash that runs
/// its calls without the runner builtin (`sh.runs_calls()` false: macOS, the portable paths)
/// runs them through `eval`, which its syntax errors name: `bash -c 'eval "$C"'` then
/// (doc/internals.md, the plain-bash driver's row).
fn shell_c(sh: &Shell, shell: &str, cmd: &str) -> (String, i32) {
    use std::os::unix::process::CommandExt;
    let name = Path::new(shell).file_name().unwrap().to_string_lossy().into_owned();
    let script = match name == "bash" && !sh.runs_calls() {
        true => "eval \"$C\"",
        false => cmd,
    };
    let (mut reader, writer) = std::io::pipe().unwrap();
    let mut c = std::process::Command::new(shell);
    c.arg0(&name)
        .args(["-c", script])
        .env("C", cmd)
        .current_dir("/tmp")
        .stdin(std::process::Stdio::null())
        .stdout(writer.try_clone().unwrap())
        .stderr(writer);
    let mut child = c.spawn().unwrap();
    drop(c);
    let mut out = String::new();
    std::io::Read::read_to_string(&mut reader, &mut out).unwrap();
    (out, child.wait().unwrap().code().unwrap_or(-1))
}

async fn shell_keeps_state_and_reports_status(shell: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut sh = Shell::spawn(&config_for(dir.path(), shell)).await.unwrap();
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
    assert_eq!(
        run(&mut sh, "if then fi", None).await.0,
        Ending::Done(shell_c(&sh, shell, "if then fi").1)
    );
    assert_eq!(run(&mut sh, "echo $FOO", None).await.1, "bar\n");
    assert_eq!(run(&mut sh, "pwd", None).await.1, "/tmp\n");
    assert_eq!(run(&mut sh, "exit 3", None).await.0, Ending::ShellExited(Some(3)));
}

async fn shell_background_job_returns_quickly(shell: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut sh = Shell::spawn(&config_for(dir.path(), shell)).await.unwrap();
    let t = Instant::now();
    let (end, out) = run(&mut sh, "{ sleep 5; } & echo fg", None).await;
    assert_eq!((end, out.as_str()), (Ending::Done(0), "fg\n"));
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    sh.kill().await;
}

async fn shell_timeout_kills_tree_including_setsid(shell: &str) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_for(dir.path(), shell);
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

/// Issue 29 group 9: a call that moves its output descriptor (`exec 3>&1 1>&2 2>&3`) leaves a
/// copy of it in the shell, which waits for its next call: the output has ended there, as
/// `bash -c`'s has when its script ends, so the run ends with the status instead of waiting for
/// the output to go idle (`held`). A background job that holds the output is still waited
/// for (`held` then), and a shell that ignores SIGTERM still closes.
async fn shell_output_moved_by_the_call_ends_with_its_status(shell: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut sh = Shell::spawn(&config_for(dir.path(), shell)).await.unwrap();
    let cmd = "exec 3>&1 1>&2 2>&3; echo swapped; echo err >&2";
    let (end, out) = run_end(&mut sh, cmd).await;
    let want = shell_c(&sh, shell, cmd);
    assert_eq!((out, end.ending, end.held), (want.0, Ending::Done(want.1), false));
    let (end, out) = run_end(&mut sh, "sleep 3 & echo fg").await;
    assert_eq!((out.as_str(), end.ending, end.held), ("fg\n", Ending::Done(0), true));
    let (end, out) = run_end(&mut sh, "trap '' TERM; kill -TERM $$; echo survived").await;
    assert_eq!((out.as_str(), end.ending), ("survived\n", Ending::Done(0)));
    sh.close().await;
    assert!(sh.group().members().is_empty());
}

async fn run_end(shell: &mut Shell, cmd: &str) -> (agent_bash::shell::RunEnd, String) {
    let mut out = Vec::new();
    let mut sink = |b: &[u8]| {
        out.extend_from_slice(b);
        true
    };
    let deadline = Some(Instant::now() + Duration::from_secs(30));
    let cancel = CancellationToken::new();
    let end = shell.run(cmd, Path::new("/tmp"), &mut sink, deadline, &cancel).await.unwrap();
    (end, String::from_utf8_lossy(&out).into_owned())
}

/// `set -n` turns execution off for good in a non-interactive shell: the session must say the
/// shell is lost (and be replaced) instead of waiting for the timeout, and output before it
/// still arrives.
async fn shell_that_stops_executing_is_lost_not_waited_on(shell: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut sh = Shell::spawn(&config_for(dir.path(), shell)).await.unwrap();
    let (ending, out) =
        run(&mut sh, "echo before; set -n; echo after", Some(Duration::from_secs(60))).await;
    // bash ends the script there with status 0, as `bash -c` does; zsh's shell, and a bash
    // without the runner builtin (whose driver never runs again), are found stuck.
    let want = match shell.ends_with("bash") && sh.runs_calls() {
        true => Ending::ShellExited(Some(0)),
        false => Ending::ShellExited(None),
    };
    assert_eq!((ending, out.as_str()), (want, "before\n"));
}

async fn shell_set_n_through_the_runtime_restarts_the_session(shell: &str) {
    use agent_bash::exec::{Origin, Request, Runtime, Settings};
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings { shell: Some(shell.into()), ..Default::default() };
    let rt = Runtime::new(settings, dir.path().join("s"), dir.path().to_path_buf()).unwrap();
    let req = |c: &str| Request {
        origin: Origin::Tool,
        command: c.into(),
        timeout: Some(60.0),
        ..Default::default()
    };
    let cancel = CancellationToken::new;
    let r = rt.run(req("set -n"), cancel(), None).await.unwrap();
    // bash: the script ends there with `bash -c`'s status 0; zsh, and a bash without the
    // runner builtin (macOS, the portable paths): the shell is found stuck.
    match shell.ends_with("bash") && agent_bash::shell::local::spawn_built() {
        true => assert!(!r.timed_out && r.exit_code == Some(0), "{r:?}"),
        false => assert!(!r.timed_out && r.is_error, "{}", r.output),
    }
    let r = rt.run(req("echo ok"), cancel(), None).await.unwrap();
    assert_eq!((r.output.as_str(), r.shell_restarted), ("ok\n", true));
}

/// contract §5: an unterminated quote, backtick, `$(`, heredoc or `if` fails alone, with the
/// shell's own message and status, and the next command runs in the same shell.
async fn shell_unterminated_constructs_fail_alone(shell: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut sh = Shell::spawn(&config_for(dir.path(), shell)).await.unwrap();
    run(&mut sh, "kept=yes", None).await;
    for cmd in
        ["echo 'x", "echo \"x", "echo `x", "echo $(x", "if true; then echo x", "echo a\necho \"b"]
    {
        if !sh.runs_calls() && super::sessions::old_bash_line_numbers(shell, cmd) {
            continue;
        }
        let (end, out) = run(&mut sh, cmd, None).await;
        let want = shell_c(&sh, shell, cmd);
        assert_eq!((out, end), (want.0, Ending::Done(want.1)), "{shell}: {cmd:?}");
        assert_eq!(run(&mut sh, "echo $kept", None).await.1, "yes\n", "{shell}: after {cmd:?}");
    }
}

/// Bash 5.2 does not recover from input that ends inside `$(`: after `eval 'echo $(x'` its next
/// parse reads outside its buffers, and a session has died of it later (SIGABRT, at an
/// unrelated command). The session runs such a command in a subshell: the output and status
/// are bash's, and the session's own bash, run under valgrind here, reads nothing it should not.
#[tokio::test]
async fn shell_command_ending_inside_a_substitution_leaves_the_parser_whole() {
    let valgrind = std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).map(|d| d.join("valgrind")).find(|v| v.exists()))
        .expect("this test runs the session's bash under valgrind (scripts/test.sh installs it)");
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let log = dir.path().join("vg");
    // Named `bash`, so the session speaks bash's protocol; valgrind keeps the pid (it runs bash
    // in its own process), and each forked subshell writes a log of its own.
    let wrapper = bin.join("bash");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec {} -q --log-file={}.%p /bin/bash \"$@\"\n",
            valgrind.display(),
            log.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut cfg = config(dir.path());
    cfg.shell = wrapper;
    let mut sh = Shell::spawn(&cfg).await.unwrap();
    let long = Some(Duration::from_secs(60));
    run(&mut sh, "kept=yes", long).await;
    for cmd in ["echo $(x", "echo \"$(x", "cat <(x", "echo a\necho $(b", "while true; do"] {
        let (end, out) = run(&mut sh, cmd, long).await;
        // `bash -c` as the session's bash is named (`/bin/bash`, as the wrapper starts it);
        // without the runner builtin, its `eval` (see `shell_c`) in a bash whose `$0` is
        // `bash`, as the plain-bash driver's is.
        let script = match sh.runs_calls() {
            true => "exec /bin/bash -c \"$C\" 2>&1",
            false => "exec /bin/bash -c 'eval \"$C\"' bash 2>&1",
        };
        let oracle = std::process::Command::new("sh")
            .args(["-c", script])
            .env("C", cmd)
            .current_dir("/tmp")
            .output()
            .unwrap();
        let want = (String::from_utf8_lossy(&oracle.stdout).into_owned(), oracle.status.code());
        let got = match end {
            Ending::Done(code) => (out, Some(code)),
            other => panic!("{cmd:?} ended {other:?}: {out}"),
        };
        assert_eq!(got, want, "{cmd:?}");
    }
    // The same shell, its state intact.
    assert_eq!(run(&mut sh, "echo $kept", long).await.1, "yes\n");
    let pid = sh.pid();
    sh.kill().await;
    let main_log = std::fs::read_to_string(format!("{}.{pid}", log.display())).unwrap();
    assert!(!main_log.contains("Invalid"), "the session's bash:\n{main_log}");
}

/// With `$SHELL` unset or neither bash nor zsh, the newest bash found is the shell, not the
/// first in `PATH` (macOS: an old bash early in `PATH`, Homebrew's later): the matrix's real
/// bash 3.2 and 5.3 builds, each in a folder of its own as `bash`, and the machine's own.
#[test]
fn default_shell_is_the_newest_bash_found() {
    use agent_bash::exec::settings::default_shell;
    let folder = |v: &str| Path::new(super::support::bash_build(v)).parent().unwrap().to_owned();
    let (old, new) = (folder("3.2"), folder("5.3"));
    let version = |bash: &Path| {
        let out = std::process::Command::new(bash)
            .args(["-c", "echo ${BASH_VERSINFO[0]}.${BASH_VERSINFO[1]}"])
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    assert_eq!(
        (version(&old.join("bash")), version(&new.join("bash"))),
        ("3.2".into(), "5.3".into())
    );
    let path = |dirs: &[&Path]| Some(std::env::join_paths(dirs).unwrap());
    let both = path(&[&old, &new]);
    for shell in [None, Some("/usr/bin/fish".into()), Some("/bin/sh".into())] {
        assert_eq!(default_shell(shell, both.clone()), new.join("bash"));
    }
    // 3.2 alone in PATH, the machine's /bin/bash (5.x) found after it: the newer one.
    assert!(version(Path::new("/bin/bash")).as_str() > "3.2");
    assert_ne!(default_shell(None, path(&[&old])), old.join("bash"));
    // `$SHELL` wins when it is bash or zsh.
    let old_bash = old.join("bash").into_os_string();
    assert_eq!(default_shell(Some(old_bash), both), old.join("bash"));
}
