//! contract §5, "a session is one script": the calls of a bash session behave as the successive
//! lines of one non-interactive bash script, a single call as `bash -c`, on every bash we have
//! (the machine's, and `../shared/bash/` 3.2, 4.4 and 5.3 when present). Both oracles are real:
//! `bash -O expand_aliases -c CALL` for a single call (the session turns aliases on, as its rc
//! snapshot does), and one `bash -O expand_aliases -c` of all the calls, one per line, whose
//! output must be the calls' outputs in order and whose status the last call's.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent_bash::shell::local::{Ending, Shell};
use agent_bash::shell::Session;
use tokio_util::sync::CancellationToken;

/// The bashes to run: the machine's, and the builds in `shared/bash/` beside the checkout (or
/// beside a directory above it, for a worktree).
fn bashes() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shared = root.ancestors().skip(1).map(|d| d.join("shared/bash")).find(|d| d.is_dir());
    let mut all = vec![PathBuf::from("/bin/bash")];
    for v in ["bash-3.2", "bash-4.4", "bash-5.3"] {
        match shared.as_ref().map(|d| d.join(v)).filter(|p| p.exists()) {
            Some(p) => all.push(p),
            None => eprintln!("shared/bash/{v} missing: not tested"),
        }
    }
    all
}

/// Line numbers out of bash's messages (`bash: line 2: x` → `bash: x`): one script numbers its
/// lines on, where each call numbers its own as `bash -c` does (contract §5: messages name the
/// call's lines; bash 3.2 and 4.4 -c start at line 0, which their messages leave out).
fn without_line_numbers(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("line ") {
        let after = &rest[at + 5..];
        let digits = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits > 0 && after[digits..].starts_with(": ") {
            out.push_str(&rest[..at]);
            rest = &after[digits + 2..];
        } else {
            out.push_str(&rest[..at + 5]);
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// A directory holding `bash`, a link to `build`: the session speaks bash's protocol to a shell
/// named `bash`, and both sides name themselves `bash` in messages.
fn named_bash(build: &Path) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("bash");
    std::os::unix::fs::symlink(build, &link).unwrap();
    (dir, link)
}

/// `bash -O expand_aliases -c SCRIPT` in `cwd`: both streams in one, and the status.
fn bash_c(bash: &Path, script: &str, cwd: &Path) -> (String, i32) {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let (mut reader, writer) = std::io::pipe().unwrap();
    let mut c = std::process::Command::new(bash);
    c.arg0("bash")
        .args(["-O", "expand_aliases", "-c", script])
        .current_dir(cwd)
        .stdin(std::process::Stdio::null())
        .stdout(writer.try_clone().unwrap())
        .stderr(writer);
    let mut child = c.spawn().unwrap();
    drop(c);
    let mut out = String::new();
    std::io::Read::read_to_string(&mut reader, &mut out).unwrap();
    let st = child.wait().unwrap();
    (out, st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0)))
}

/// The calls run in one session in `cwd`, up to the one that ended the shell: each one's output
/// and status (the shell's exit status for the last, when it ended the shell).
async fn session(bash: &Path, calls: &[&str], cwd: &Path) -> (Vec<(String, i32)>, bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut sh =
        Shell::spawn(&super::shell::config_for(dir.path(), &bash.to_string_lossy())).await.unwrap();
    assert!(sh.runs_calls(), "{}: the runner builtin must load", bash.display());
    let mut results = Vec::new();
    let mut ended = false;
    for call in calls {
        let mut out = Vec::new();
        let mut sink = |b: &[u8]| {
            out.extend_from_slice(b);
            true
        };
        let deadline = Some(Instant::now() + Duration::from_secs(30));
        let end = sh.run(call, cwd, &mut sink, deadline, &CancellationToken::new()).await.unwrap();
        let text = String::from_utf8_lossy(&out).into_owned();
        match end.ending {
            Ending::Done(code) => results.push((text, code)),
            Ending::ShellExited(Some(code)) => {
                results.push((text, code));
                ended = true;
                break;
            }
            other => panic!("{}: {call:?} ended {other:?}: {text}", bash.display()),
        }
    }
    sh.kill().await;
    (results, ended)
}

/// Runs every case on every bash: single calls against `bash -c`, sequences against one script.
async fn check(cases: &[&[&str]]) {
    let mut failures = Vec::new();
    for build in bashes() {
        let (_link_dir, bash) = named_bash(&build);
        for calls in cases {
            let work = tempfile::tempdir().unwrap();
            let (got, _) = session(&bash, calls, work.path()).await;
            let (out, code) = bash_c(&bash, &calls.join("\n"), work.path());
            let want_script = (without_line_numbers(&out), code);
            let got_script = (
                without_line_numbers(&got.iter().map(|(o, _)| o.as_str()).collect::<String>()),
                got.last().map_or(0, |(_, c)| *c),
            );
            if got_script != want_script {
                failures.push(format!(
                    "{}: {calls:?}\n  one script: {want_script:?}\n  session:    {got_script:?}",
                    build.display()
                ));
            }
            if let [one] = calls {
                let want = bash_c(&bash, one, work.path());
                if got[0] != want {
                    failures.push(format!(
                        "{}: {one:?}\n  bash -c: {want:?}\n  session: {:?}",
                        build.display(),
                        got[0]
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} differences:\n{}", failures.len(), failures.join("\n"));
}

/// Groups 1-3 of issue 29: ERR, DEBUG and RETURN traps fire where the script's would, once,
/// with the user's `$BASH_COMMAND`; an EXIT trap's output belongs to the call that ends the
/// shell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_traps_fire_as_in_one_script() {
    check(&[
        &["trap 'echo ERR:$BASH_COMMAND' ERR", "false", "true", "false; echo after"],
        &["trap 'echo D:$BASH_COMMAND' DEBUG", "echo a", "echo b"],
        &["f() { :; }; trap 'echo R:$BASH_COMMAND' RETURN", "echo x", "f", "echo y"],
        &["trap 'echo \"EXIT $?\"' EXIT", "echo hi", "exit 4"],
        &["trap 'echo \"EXIT $?\"' EXIT; exit 3"],
        &["trap 'echo bye' EXIT", "set -e", "false", "echo not-reached"],
    ])
    .await;
}

/// Groups 4 and 5: xtrace at the script's depth and nothing of ours traced; no `$-` flag,
/// `caller` frame, BASH_SOURCE/FUNCNAME entry or variable of ours; messages named as `bash -c`
/// names them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_shows_nothing_of_the_wrapper() {
    check(&[
        &["set -x", "echo traced", "f() { echo in; }; f", "x=$(echo sub)"],
        &["set -x; echo traced; set +x"],
        &["echo $-"],
        &["caller; echo $?"],
        &["echo ${#BASH_SOURCE[@]} ${#FUNCNAME[@]} ${#BASH_LINENO[@]}"],
        &["compgen -v | grep -e '^__' -e '^BASH_COMPAT'; echo done"],
        &["compgen -A function | grep -e '^__'; alias; trap -p; echo done"],
        &["type __agent_bash_run; enable -a | grep -e agent -e '^__'; echo \"$BASH_EXECUTION_STRING\""],
        &["echo ("],
        &["echo 'x"],
        &["if true; then echo x"],
        &["return 3; echo after"],
        &["set -v; echo verbose"],
    ])
    .await;
}

/// Group 6: `$?`, PIPESTATUS and `$_` carry from one call to the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_carries_status_pipestatus_and_last_argument() {
    check(&[
        &["false", "echo $?"],
        &["(exit 7)", "echo $?"],
        &["false | true | (exit 3)", "echo ${PIPESTATUS[@]}"],
        &["echo a b c", "echo $_"],
        &["true last-word", "echo $_"],
        &["ls / >/dev/null", "echo $?; echo $_"],
        &["echo $?"],
        &["echo \"$_\" | grep -c bash"],
    ])
    .await;
}

/// Group 7: a call that ends the script ends the session with the script's status and output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_end_ends_the_session() {
    check(&[
        &["set -u", "echo $NOPE", "echo never"],
        &["set -u; echo ${NOPE}; echo never"],
        &["set -e", "false", "echo never"],
        &["exit 5"],
        &["echo x; exit"],
        &["set -n", "echo never"],
    ])
    .await;
    // The next call gets a fresh shell.
    for build in bashes() {
        let (_d, bash) = named_bash(&build);
        let work = tempfile::tempdir().unwrap();
        let (got, ended) = session(&bash, &["set -u; echo $NOPE", "echo after"], work.path()).await;
        assert!(ended && got.len() == 1, "{}: {got:?}", build.display());
    }
}

/// Groups 10-12: line numbers and messages are `bash -c`'s; an alias defined on one line of a
/// call expands on the next; no descriptor of ours reaches a command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_lines_aliases_and_descriptors_are_bash_c() {
    check(&[
        &["echo $LINENO"],
        &["echo $LINENO\necho $LINENO\n\necho $LINENO"],
        &["/"],
        &["cd /nonexistent-dir-of-ours"],
        &["f() { echo $LINENO; }\nf"],
        &["alias ll='echo LL'\nll x"],
        &["alias ll='echo LL'", "ll y"],
        &["ls /proc/self/fd"],
        &["exec 3>/dev/null; ls /proc/self/fd"],
        &["echo ${x"],
        &["x=1; echo ${x:?}; echo ${y:?unset y}; echo never"],
    ])
    .await;
}
