//! The spawn builtin (`src/shell/spawn.c`): a plain external command runs with `posix_spawn`
//! from inside the session's bash. It must be used where it may be, never where bash would do
//! something else, and show exactly what bash's own fork shows (the oracle: `bash -c`, and the
//! same session with the builtin off).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use agent_bash::shell::local::{Ending, Shell};
use agent_bash::shell::Session;
use pretty_assertions::assert_eq;
use tokio_util::sync::CancellationToken;

use super::shell::config_for;

in_each_bash!(
    spawn_runs_plain_commands_and_leaves_the_rest_to_bash,
    spawn_shows_what_bash_shows_for_signals_failures_and_odd_files,
    spawn_keeps_the_state_a_forked_child_would_see,
);

/// Whether the builtin is loaded into this bash: 5.2 only, where this suite proves it. On 3.2,
/// 4.4 and 5.3 the same tests run with the builtin off (bash's own fork), which they prove
/// exact; with it on, 3.2 cannot load it, and 4.4 and 5.3 word a signalled child differently
/// from what it prints (`spawn_shows_what_bash_shows_for_signals_failures_and_odd_files`).
fn proven(shell: &str) -> bool {
    super::support::bash_version(shell) == (5, 2)
}

async fn session(shell: &str, dir: &Path, spawn: bool) -> Shell {
    let mut cfg = config_for(dir, shell);
    cfg.spawn = spawn;
    let sh = Shell::spawn(&cfg).await.unwrap();
    let want = spawn && proven(shell);
    assert_eq!(sh.spawns(), want, "the builtin loads exactly into bash 5.2 (with `enable -f`)");
    sh
}

async fn run_in(sh: &mut Shell, cmd: &str, cwd: &Path) -> (String, i32) {
    let mut out = Vec::new();
    let mut sink = |b: &[u8]| {
        out.extend_from_slice(b);
        true
    };
    let deadline = Some(Instant::now() + Duration::from_secs(30));
    let end = sh.run(cmd, cwd, &mut sink, deadline, &CancellationToken::new()).await.unwrap();
    let code = match end.ending {
        Ending::Done(c) => c,
        other => panic!("{cmd:?} ended {other:?}"),
    };
    (String::from_utf8_lossy(&out).into_owned(), code)
}

/// `bash -c` in `dir`, its own messages on stdout too; the command is not the script's last
/// (a lone last command is exec'd in place, which prints no signal message).
fn bash_c(shell: &str, dir: &Path, cmd: &str) -> (String, i32) {
    use std::os::unix::process::CommandExt;
    let status = dir.join(".status");
    let out = std::process::Command::new(shell)
        .arg0("bash")
        .arg("-c")
        .arg(format!("exec 2>&1; {cmd}\necho $? >{}", status.display()))
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let code = std::fs::read_to_string(&status).unwrap().trim().parse().unwrap();
    (String::from_utf8_lossy(&out.stdout).into_owned(), code)
}

/// Process ids in bash's signal messages (`bash: line 1: 12345 Killed …`) vary by run.
fn without_pids(text: &str) -> String {
    text.lines()
        .map(|l| match l.split_once(": line 1: ") {
            Some((head, rest)) => {
                let rest = rest.trim_start().trim_start_matches(|c: char| c.is_ascii_digit());
                format!("{head}: line 1: PID{rest}")
            }
            None => l.to_owned(),
        })
        .map(|l| l + "\n")
        .collect()
}

fn script(dir: &Path, name: &str, body: &str) {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Who waits for the script: bash's fork path waits with `wait4(-1, …)`, the builtin with
/// `wait4(<this pid>, …)`. Read from `/proc/$PPID/syscall` once bash is blocked in wait4 (61):
/// the script may start before its parent got there.
const WHO_WAITS: &str = r#"#!/bin/sh
i=0
while read -r nr who rest < /proc/$PPID/syscall; [ "$nr" != 61 ] && [ $i -lt 100000 ]; do
  i=$((i+1))
done
if [ "$nr" != 61 ]; then echo "parent never waited: $nr"
elif [ "$who" = "$(printf '0x%x' $$)" ]; then echo spawned "$@"
else echo forked "$@"; fi
"#;

async fn spawn_runs_plain_commands_and_leaves_the_rest_to_bash(shell: &str) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    script(d, "who-waits", WHO_WAITS);
    let mut sh = session(shell, d, true).await;
    let mut off = session(shell, d, false).await;
    let w = d.join("who-waits");
    let w = w.to_str().unwrap();
    if !proven(shell) {
        // Turned off here: bash forks.
        assert_eq!(run_in(&mut sh, &format!("{w} a b"), d).await, ("forked a b\n".into(), 0));
        return;
    }
    assert_eq!(run_in(&mut sh, &format!("{w} a b"), d).await, ("spawned a b\n".into(), 0));
    assert_eq!(run_in(&mut off, &format!("{w} a b"), d).await, ("forked a b\n".into(), 0));
    // By PATH lookup too.
    run_in(&mut sh, &format!("PATH={}:$PATH", d.display()), d).await;
    assert_eq!(run_in(&mut sh, "who-waits x", d).await.0, "spawned x\n");
    // Anything that is not one plain simple command goes through bash as before.
    for cmd in ["who-waits 'q'", "who-waits x >&2", "V=1 who-waits", "who-waits x; :"] {
        assert!(run_in(&mut sh, cmd, d).await.0.starts_with("forked"), "{cmd}");
    }
    // Shell state that makes bash do something else: the builtin leaves the command to `eval`.
    // (A DEBUG trap lasts past the call only with `set -T`: `.` restores it otherwise.)
    let cases = [
        ("alias who-waits='echo aliased'", "unalias who-waits"),
        ("who-waits() { echo function; }", "unset -f who-waits"),
        ("set -T; trap 'echo debug >&2' DEBUG", "trap - DEBUG; set +T"),
        ("trap 'echo err >&2' ERR", "trap - ERR"),
        ("set -x", "set +x"),
        ("set -v", "set +v"),
        ("set -k", "set +k"),
        ("set -o posix", "set +o posix"),
    ];
    run_in(&mut off, &format!("PATH={}:$PATH", d.display()), d).await;
    for (setup, undo) in cases {
        run_in(&mut sh, setup, d).await;
        run_in(&mut off, setup, d).await;
        let got = run_in(&mut sh, "who-waits x", d).await;
        assert_eq!(got, run_in(&mut off, "who-waits x", d).await, "{setup}");
        assert!(!got.0.contains("spawned"), "{setup}: {got:?}");
        run_in(&mut sh, undo, d).await;
        run_in(&mut off, undo, d).await;
        assert_eq!(run_in(&mut sh, "who-waits y", d).await.0, "spawned y\n", "after {undo}");
    }
    sh.kill().await;
    off.kill().await;
}

async fn spawn_shows_what_bash_shows_for_signals_failures_and_odd_files(shell: &str) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    script(d, "sig", "#!/bin/sh\nkill -$1 $$\n");
    script(d, "st", "#!/bin/sh\necho out; echo err >&2; exit $1\n");
    script(d, "noshebang", "echo \"no #! line, run by bash: $0 $*\"\n");
    script(d, "badinterp", "#!/nonexistent/interpreter\necho never\n");
    std::fs::write(d.join("notexec"), "echo never\n").unwrap();
    let mut sh = session(shell, d, true).await;
    let mut cases: Vec<String> = ["SEGV", "KILL", "TERM", "INT", "PIPE", "ABRT", "USR1", "HUP"]
        .iter()
        .map(|s| format!("{}/sig {s}", d.display()))
        .collect();
    cases.extend(
        [
            "./st 0",
            "./st 3",
            "./st 255",
            "./noshebang a b",
            "./badinterp",
            "./notexec",
            "./missing",
            "no-such-command-here x",
            "printenv _",
            "cat",
            "/bin/pwd",
            "ls -d .",
            "ls /nonexistent-dir",
        ]
        .map(String::from),
    );
    for cmd in &cases {
        let (out, code) = run_in(&mut sh, cmd, d).await;
        let (want, want_code) = bash_c(shell, d, cmd);
        assert_eq!((without_pids(&out), code), (without_pids(&want), want_code), "{cmd}");
    }
    // A core dump says so, after the padding, as bash prints it.
    run_in(&mut sh, "ulimit -c unlimited", d).await;
    let (out, code) = run_in(&mut sh, "./sig SEGV", d).await;
    let (want, want_code) = bash_c(shell, d, "ulimit -c unlimited; ./sig SEGV");
    assert_eq!((without_pids(&out), code), (without_pids(&want), want_code));
    sh.kill().await;
}

async fn spawn_keeps_the_state_a_forked_child_would_see(shell: &str) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    script(d, "umask.sh", "#!/bin/sh\numask\n");
    let steps = [
        "export AB_X=1",
        "printenv AB_X",
        "AB_X=2",
        "printenv AB_X",
        "export -n AB_X",
        "printenv AB_X",
        "umask 027",
        "./umask.sh",
        "hash -r",
        "ls -d /",
        "hash -t ls",
        "exec 7>/dev/null",
        "ls /proc/self/fd",
        "trap '' USR1",
        "grep SigIgn /proc/self/status",
        "/bin/pwd",
        "ulimit -n 512",
        "grep files /proc/self/limits",
    ];
    let mut on = session(shell, d, true).await;
    let mut off = session(shell, d, false).await;
    for step in steps {
        let a = run_in(&mut on, step, d).await;
        let b = run_in(&mut off, step, d).await;
        assert_eq!(a, b, "{step}");
    }
    on.kill().await;
    off.kill().await;
}
