//! Differential suite (contract §1, §5, §7: fidelity first): every command runs under `bash -c` (the
//! oracle) and through the runtime, on the pipe path, on the PTY path, and in sequences on one
//! shell session; the output (after contract §4.1's sanitizing) and the status must be the same.
//!
//! Deliberate differences, each applied only to the cases that carry its flag:
//! - [`EVAL`] (contract §5, remote sessions only, `tests/suite/remote.rs`): a remote session runs
//!   each command through `eval`, so bash names `eval` where `bash -c` names `-c` in syntax errors
//!   and heredoc warnings. A local bash session runs each call as `bash -c` runs its string (the
//!   runner builtin, `src/shell/runner.c`): its oracle is plain `bash -c`.
//! - [`PRODUCER`] (contract §1): with a `| head`/`| tail` stage stripped, the status reported is the
//!   producer's (the failure `| head` would hide is worth telling the model); the oracle's
//!   status is then taken from the command without its stage.
//! - [`ALIASES`] (contract §5): a session expands aliases (the rc snapshot re-enables
//!   `expand_aliases`); the oracle turns it on the same way.
//! - PTY runs (contract §6) are a terminal's rendering: a program sees a terminal, lines carry no
//!   trailing spaces and the screen no trailing blank rows. Only cases flagged [`PTY`] (no tabs,
//!   no lone CR redraws, no tty-dependent output) run there, compared line by line after
//!   trimming trailing spaces and blank rows on both sides.

use std::ffi::OsString;
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use agent_bash::exec::{Request, Runtime, Settings};
use agent_bash::sanitize::Sanitizer;
use pretty_assertions::assert_eq;
use proptest::prelude::*;
use tokio_util::sync::CancellationToken;

/// Also run on the PTY path.
pub(crate) const PTY: u8 = 1;
/// Deliberate difference of remote sessions: the command runs through `eval` (see the module
/// docs).
pub(crate) const EVAL: u8 = 2;
/// Deliberate difference: a stripped stage reports the producer's status.
pub(crate) const PRODUCER: u8 = 4;
/// Deliberate difference: aliases are expanded in a session.
pub(crate) const ALIASES: u8 = 8;

/// The corpus: (command, flags). Grouped as the issue lists them.
pub(crate) const CORPUS: &[(&str, u8)] = &[
    // Compound lists.
    ("echo a; echo b", PTY),
    ("echo a && echo b", PTY),
    ("false && echo no; echo yes", PTY),
    ("false || echo rescued", PTY),
    ("true || echo never", PTY),
    ("echo a; false; echo c", PTY),
    ("false; true", PTY),
    ("true; false", PTY),
    ("echo one\necho two\necho three", PTY),
    ("echo a & wait; echo b", PTY),
    ("x=1; y=2; echo $((x+y))", PTY),
    ("[ 1 -lt 2 ] && echo less || echo more", PTY),
    ("if true; then echo then; else echo else; fi", PTY),
    ("if false; then echo then; elif true; then echo elif; fi", PTY),
    ("for i in 1 2 3; do echo n$i; done", PTY),
    ("i=0; while [ $i -lt 3 ]; do echo w$i; i=$((i+1)); done", PTY),
    ("until true; do echo never; done; echo after", PTY),
    ("case abc in a*) echo starts-a;; *) echo other;; esac", PTY),
    ("case x in y) echo y;; esac; echo $?", PTY),
    ("for i in a b; do for j in 1 2; do echo $i$j; done; done", PTY),
    ("select x in a; do break; done </dev/null; echo selected", 0),
    // Pipelines with head/tail in every position.
    ("seq 1 10 | head -n 3", PTY),
    ("seq 1 10 | head -3", PTY),
    ("seq 1 10 | head -n3", PTY),
    ("seq 1 10 | tail -n 3", PTY),
    ("seq 1 10 | tail -3", PTY),
    ("seq 1 10 | tail -n3", PTY),
    ("seq 1 10 | head -n 5 | tail -n 2", PTY),
    ("seq 1 10 | tail -n 5 | head -n 2", PTY),
    ("seq 1 10 | head -n 5 | grep 3", PTY),
    ("seq 1 10 | head -n 50", PTY),
    ("seq 1 10 | tail -n 50", PTY),
    ("seq 1 3 | head -n 1 | cat", PTY),
    ("head -n 2 <<< $'a\\nb\\nc'", PTY),
    ("echo a; echo b | head -1", PTY),
    ("echo a; seq 1 5 | tail -2", PTY),
    ("echo a\nseq 1 5 | tail -2", PTY),
    ("cd / && seq 1 5 | tail -2", PTY),
    ("cd /; seq 1 5 | tail -2", PTY),
    ("export V=1; seq 1 5 | head -n 2", PTY),
    ("set -o pipefail; seq 1 5 | head -n 2", PTY),
    ("x=5 | head -n 1; echo \"x=${x:-unset}\"", PTY),
    ("x=5; seq $x | tail -n 1", PTY),
    ("seq 1 5 | head -n 2 2>&1", PTY),
    ("seq 1 5 2>&1 | tail -n 2", PTY),
    ("(echo a; echo b; echo c) | head -n 2", PTY),
    ("{ echo a; echo b; } | tail -n 1", PTY),
    ("if true; then seq 3; fi | tail -n 1", PTY),
    ("for i in 1 2 3 4; do echo $i; done | head -n 2", PTY),
    ("seq 5 | tail -n +3", PTY),
    ("seq 5 | head -c 4", PTY),
    ("seq 5 | head --lines=2", PTY),
    ("seq 5 | head -n 0; echo zero", PTY),
    ("false | tail -n 1", PRODUCER | PTY),
    ("(echo out; exit 3) | head -n 1", PRODUCER | PTY),
    // The stderr of a stripped stage's command is printed past the stage, not limited by it.
    ("echo err >&2 | wc -l | head -n 1", PTY),
    ("{ seq 3; echo e1 >&2; seq 4 6; echo e2 >&2; } | tail -n 2", PTY),
    ("(seq 5; echo late >&2) | tail -n 1", PTY),
    ("ls -d /nonexistent-agent-bash . | head -n 1", PRODUCER | PTY),
    ("cd /nonexistent-agent-bash && seq 3 | tail -n 1", PTY),
    ("{ echo a; echo b >&2; } 2>&1 | tail -n 1", PTY),
    ("seq 4 | head -n 2 2>&1", PTY),
    ("yes | head -n 3", PTY),
    ("yes abc | head -n 2 | tail -n 1", PTY),
    ("seq 3 || tail -n 1", PTY),
    ("echo '| head -n 1'", PTY),
    ("echo \"$(seq 3 | head -n 1)\"", PTY),
    ("echo `seq 3 | tail -n 1`", PTY),
    ("seq 3 # | head -n 1", PTY),
    ("seq 3 | head -n 2 # first two", PTY),
    // Subshells and functions.
    ("(echo in-subshell)", PTY),
    ("(cd /; pwd); pwd >/dev/null; echo back", PTY),
    ("(exit 4); echo $?", PTY),
    ("( (echo nested) )", PTY),
    ("echo $(echo $(echo deep))", PTY),
    ("f() { echo \"f:$1\"; }; f arg", PTY),
    ("f() { return 3; }; f; echo $?", PTY),
    ("f() { local v=in; echo $v; }; v=out; f; echo $v", PTY),
    ("g() { echo $#; }; g a b c", PTY),
    ("h() { echo ${FUNCNAME[0]}; }; h", PTY),
    ("r() { [ $1 -le 0 ] && return; echo $1; r $(($1-1)); }; r 3", PTY),
    ("declare -A m=([k]=v); echo ${m[k]}", PTY),
    ("a=(x y z); echo ${#a[@]} ${a[1]}", PTY),
    ("echo ${BASH_SUBSHELL}; (echo ${BASH_SUBSHELL})", PTY),
    // Heredocs and here-strings.
    ("cat <<EOF\nhello\nEOF", PTY),
    ("cat <<'EOF'\n$HOME is literal\nEOF", PTY),
    ("x=v; cat <<EOF\nx=$x\nEOF", PTY),
    ("cat <<-EOF\n\tindented\n\tEOF", 0),
    ("cat <<A; cat <<B\na\nA\nb\nB", PTY),
    ("cat <<EOF | tr a-z A-Z\nshout\nEOF", PTY),
    ("cat <<EOF | head -n 1\none\ntwo\nEOF", PTY),
    ("tr a-z A-Z <<< 'here string'", PTY),
    ("read a b <<< 'x y'; echo $b$a", PTY),
    ("cat <<EOF\nno end", EVAL),
    // Quoting.
    ("echo 'single $HOME'", PTY),
    ("echo \"double ${UNSET_VAR:-default}\"", PTY),
    ("echo \"a\\\"b\"", PTY),
    ("echo 'it'\\''s'", PTY),
    ("echo $'tab\\tand\\nnewline'", 0),
    ("printf '%s|' a 'b c' \"d\"; echo", PTY),
    ("echo \\$HOME \\\\", PTY),
    ("echo \"$(echo 'inner \"quoted\"')\"", PTY),
    ("set -- a 'b c'; echo $#; printf '[%s]' \"$@\"; echo", PTY),
    ("echo {a,b}{1,2}", PTY),
    ("echo *.none 2>/dev/null || true", PTY),
    ("x='a  b'; echo $x; echo \"$x\"", PTY),
    // Comments and line continuations.
    ("echo a # comment", PTY),
    ("# only a comment", PTY),
    ("echo a \\\n  b \\\n  c", PTY),
    ("echo start &&\\\n echo cont", PTY),
    ("seq 3 |\n tail -n 1", PTY),
    ("seq 3 | # comment\n tail -n 1", PTY),
    ("echo '#not a comment'", PTY),
    ("echo a#b", PTY),
    // Unterminated constructs (contract §5: each fails alone).
    ("echo 'x", EVAL),
    ("echo \"x", EVAL),
    ("echo `x", EVAL),
    ("echo $(x", EVAL),
    ("if true; then echo x", EVAL),
    ("while true; do", EVAL),
    ("{ echo x", EVAL),
    ("(echo x", EVAL),
    ("echo x |", EVAL),
    ("echo x &&", EVAL),
    ("fi", EVAL),
    ("echo ${x", EVAL),
    ("echo )", EVAL),
    ("case x in", EVAL),
    // stderr interleaving.
    ("echo out; echo err >&2; echo out2", PTY),
    ("echo err >&2", PTY),
    ("ls /nonexistent-dir-xyz", PTY),
    ("cd /nonexistent-dir-xyz", PTY),
    ("nonexistent-command-xyz", PTY),
    ("nonexistent-command-xyz 2>/dev/null; echo $?", PTY),
    ("echo a 1>&2; echo b", PTY),
    ("{ echo 1; echo 2 >&2; echo 3; } 2>&1", PTY),
    ("echo $((1/0))", PTY),
    ("local x=1", PTY),
    ("printf '%d\\n' abc", PTY),
    ("true\ncd /nonexistent-dir-xyz", PTY),
    // Exit statuses.
    ("exit 3", PTY),
    ("exit 0", PTY),
    ("false", PTY),
    ("true", PTY),
    ("(exit 255)", PTY),
    ("exit 256", PTY),
    ("sh -c 'exit 7'", PTY),
    ("! true", PTY),
    ("! false", PTY),
    ("false; exit", PTY),
    ("test -e /nonexistent", PTY),
    ("grep -q nomatch /dev/null", PTY),
    // Signals.
    ("kill -TERM $$", PTY),
    ("sh -c 'kill -INT $$'; echo $?", PTY),
    ("sleep 5 & kill $!; wait $!; echo $?", PTY),
    ("yes | head -c 10 >/dev/null; echo ${PIPESTATUS[0]}", PTY),
    ("trap 'echo trapped' USR1; kill -USR1 $$; echo after", PTY),
    // Empty output and no final newline.
    ("true", PTY),
    (":", PTY),
    ("echo", PTY),
    ("echo -n", PTY),
    ("printf ''", PTY),
    ("printf 'no newline'", PTY),
    ("printf 'a\\nb'", PTY),
    ("printf '\\n\\n\\n'", 0),
    ("echo -n x; echo -n y", PTY),
    ("printf 'x\\n\\n'", 0),
    // CR progress bars (contract §4.1 applies to both sides).
    ("printf '10%%\\r55%%\\r100%%\\n'", PTY),
    ("printf 'a\\r\\nb\\r\\n'", PTY),
    ("printf 'progress\\rdone\\n'", 0),
    ("printf 'x\\r'", 0),
    ("for i in 1 2 3; do printf '\\r%d/3' $i; done; echo", PTY),
    // UTF-8 and control bytes.
    ("echo 'héllo wörld'", PTY),
    ("echo '日本語'", PTY),
    ("echo '🙂 emoji'", PTY),
    ("printf '\\xff\\xfe bad bytes\\n'", 0),
    ("printf '\\xe6\\x97\\n'", 0),
    ("printf '\\033[31mred\\033[0m\\n'", PTY),
    ("printf 'bell\\a and \\x01 ctrl\\n'", 0),
    ("printf 'a\\tb\\n'", 0),
    // Variables, expansions and state that bash -c starts with.
    ("echo $0", PTY),
    ("echo ${#HOME} > /dev/null; echo ok", PTY),
    ("echo $((2**10))", PTY),
    ("x=abcdef; echo ${x:2:3} ${x^^} ${x/c/C}", PTY),
    ("echo ${UNSET_XYZ:-fallback} ${UNSET_XYZ:+alt}", PTY),
    ("printf -v out '%05d' 42; echo $out", PTY),
    ("shopt -q extglob && echo on || echo off", PTY),
    ("echo $LINENO; echo $LINENO\necho $LINENO", PTY),
    ("set -e; false; echo not-reached", PTY),
    ("alias hi='echo alias-ran'\nhi", ALIASES | PTY),
    ("type cd", PTY),
    ("cd /tmp && pwd", PTY),
    ("exec echo replaced", PTY),
    ("exec 3>&1; echo via-fd3 >&3", PTY),
    ("read x </dev/null; echo \"read:$? x=$x\"", PTY),
    ("cat", 0),
    ("wc -c", 0),
    ("sh -c 'kill -TERM $$'; echo $?", PTY),
    ("set -u; echo ${NOPE_UNSET:-guarded}", PTY),
];

in_each_shell!(
    differential_corpus_pipe_path,
    differential_corpus_one_session,
    differential_corpus_pty_path,
    differential_sequences_keep_state_and_survive_errors,
);

/// Sequences on one shell session: state carries over, and a broken command fails alone.
pub(crate) const SEQUENCES: &[&[&str]] = &[
    &["x=5", "echo $x", "x=$((x+1)); echo $x"],
    &["f() { echo f$1; }", "f 1", "unset -f f", "f 2"],
    &["d=/tmp", "cd \"$d\" && pwd", "echo \"$d\""],
    &["echo 'x", "echo hello", "echo still"],
    &["echo \"x", "echo hello"],
    &["echo `x", "echo hello"],
    &["echo $(x", "echo hello"],
    &["cat <<EOF\nunterminated", "echo hello"],
    &["if true; then", "echo hello", "echo again"],
    &["{ echo x", "echo hello"],
    &["export E=1", "sh -c 'echo $E'"],
    &["set -o pipefail", "false | true; echo $?"],
    &["declare -A m; m[k]=v", "echo ${m[k]}"],
    &["shopt -s extglob", "x=aab; echo ${x##+(a)}"],
    &["trap 'echo bye' USR1", "kill -USR1 $$"],
    &["echo $LINENO", "echo $LINENO"],
    &["exec 5>/dev/null", "echo ok >&5; echo $?"],
    &["x=1 | head -n 1", "echo ${x:-unset}"],
];

/// A runtime whose shells and the oracle share one environment: a private HOME (no rc), a private
/// state dir.
pub(crate) struct Bench {
    /// The session's shell, and the oracle's (`bash -c`, `zsh -c`).
    pub(crate) shell: &'static str,
    pub(crate) rt: Runtime,
    pub(crate) env: Vec<(OsString, OsString)>,
    pub(crate) work: tempfile::TempDir,
    _state: tempfile::TempDir,
}

fn bench() -> Bench {
    bench_in("/bin/bash")
}

pub(crate) fn bench_in(shell: &'static str) -> Bench {
    bench_with(shell, None)
}

/// [`bench_in`] with the `prefix` setting.
fn bench_with(shell: &'static str, prefix: Option<&str>) -> Bench {
    let state = tempfile::tempdir().unwrap();
    let home = state.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("file.txt"), "alpha\nbeta\ngamma\n").unwrap();
    let mut settings = Settings {
        shell: Some(shell.into()),
        state_dir: Some(state.path().join("state")),
        prefix: prefix.map(str::to_string),
        ..Settings::default()
    };
    settings.env.insert("HOME".into(), home.to_string_lossy().into_owned());
    // A bash of the version matrix comes first in PATH, as a user's own bash does: `bash` in a
    // command is that bash, and a PTY run names it `bash` (`$0`), as `bash -c` does.
    if let Some(dir) = super::support::matrix_dir(shell) {
        let path = std::env::var("PATH").unwrap_or_default();
        settings.env.insert("PATH".into(), format!("{}:{path}", dir.display()));
    }
    let env = agent_bash::exec::command_env(&settings, Path::new(shell));
    let rt =
        Runtime::new(settings, state.path().join("session"), work.path().to_path_buf()).unwrap();
    Bench { shell, rt, env, work, _state: state }
}

impl Bench {
    fn zsh(&self) -> bool {
        self.shell.ends_with("/zsh")
    }

    /// The runtime's normalization for this shell (of a pipe run).
    fn normalize(&self, command: &str) -> agent_bash::normalize::Normalized {
        let dialect = agent_bash::normalize::Dialect::of(Path::new(self.shell));
        agent_bash::normalize::normalize_in(dialect, command, None, None, false)
    }
}

/// What `bash -c SCRIPT` (`zsh -c SCRIPT` for a zsh bench) prints (stdout and stderr on one
/// pipe, stdin /dev/null) and its status, with the script's extra environment.
fn bash_c(b: &Bench, script: &str, extra: &[(&str, &str)]) -> (String, i32) {
    use std::os::unix::process::CommandExt;
    let (mut reader, writer) = std::io::pipe().unwrap();
    // The session's own shell, under the name the session gives it (`$0`, bash's messages).
    let mut cmd = std::process::Command::new(b.shell);
    cmd.arg0(if b.zsh() { "zsh" } else { "bash" });
    cmd.arg("-c")
        .arg(script)
        .env_clear()
        .envs(b.env.iter().map(|(k, v)| (k, v)))
        .envs(extra.iter().copied())
        .current_dir(b.work.path())
        .stdin(std::process::Stdio::null())
        .stdout(writer.try_clone().unwrap())
        .stderr(writer);
    let mut child = cmd.spawn().unwrap();
    drop(cmd);
    let mut raw = Vec::new();
    reader.read_to_end(&mut raw).unwrap();
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    (sanitized(&raw), code)
}

/// contract §4.1's sanitizing, the one documented transformation of every output.
pub(crate) fn sanitized(raw: &[u8]) -> String {
    let mut s = Sanitizer::new();
    let mut out = String::new();
    s.push(raw, &mut out);
    s.finish(&mut out);
    out
}

/// The oracle for one corpus case. A zsh session prints `zsh -c`'s syntax errors (no [`EVAL`]
/// difference) and, as a zsh script file does, runs each line once the one before it ran: an
/// alias defined on a line applies to the next ([`ALIASES`]; `zsh -c` parses all lines first).
fn oracle(b: &Bench, command: &str, flags: u8) -> (String, i32) {
    if b.zsh() {
        let (out, code) = if flags & ALIASES != 0 {
            let file = b.work.path().join("zsh");
            std::fs::write(&file, command).unwrap();
            let r = bash_c(b, "source ./zsh", &[]);
            std::fs::remove_file(&file).unwrap();
            r
        } else {
            bash_c(b, command, &[])
        };
        if flags & PRODUCER != 0 {
            return (out, bash_c(b, &b.normalize(command).command, &[]).1);
        }
        return (out, code);
    }
    let mut script = String::new();
    if flags & ALIASES != 0 {
        script.push_str("shopt -s expand_aliases\n");
    }
    script.push_str(command);
    let (out, code) = bash_c(b, &script, &[]);
    if flags & PRODUCER != 0 {
        let stripped = agent_bash::normalize::normalize(command, None, None);
        return (out, bash_c(b, &stripped.command, &[]).1);
    }
    (out, code)
}

static KEYS: AtomicU64 = AtomicU64::new(0);

pub(crate) async fn run(
    b: &Bench,
    command: &str,
    key: &str,
    pty: bool,
) -> agent_bash::result::BashResult {
    let req = Request {
        command: command.into(),
        timeout: Some(30.0),
        session_key: Some(key.into()),
        pty,
        ..Request::default()
    };
    b.rt.run(req, CancellationToken::new(), None).await.unwrap()
}

/// A terminal's view of a text: no trailing spaces, no trailing blank lines, `\n` endings.
fn as_terminal(text: &str) -> String {
    let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
    let end = lines.iter().rposition(|l| !l.is_empty()).map_or(0, |n| n + 1);
    lines[..end].join("\n")
}

/// Differences found by one test, reported all at once at its end.
#[derive(Default)]
struct Differences(Vec<String>);

impl Differences {
    fn check(&mut self, what: impl std::fmt::Debug, want: &(String, i32), got: &(String, i32)) {
        // Process ids in bash's job messages vary by run.
        let pids = |(text, code): &(String, i32)| (super::sessions::without_pids(text), *code);
        if pids(got) != pids(want) {
            self.0.push(format!("{what:?}\n  bash:    {want:?}\n  runtime: {got:?}"));
        }
    }

    fn assert_none(self) {
        assert!(self.0.is_empty(), "{} differences:\n{}", self.0.len(), self.0.join("\n"));
    }
}

async fn differential_corpus_pipe_path(shell: &'static str) {
    assert!(CORPUS.len() >= 150, "the corpus has {} commands", CORPUS.len());
    let b = bench_in(shell);
    let mut diffs = Differences::default();
    for &(command, flags) in CORPUS {
        // A fresh session key per command: every command starts from the state `bash -c` has.
        let key = format!("diff-{}", KEYS.fetch_add(1, Ordering::Relaxed));
        let want = oracle(&b, command, flags);
        let r = run(&b, command, &key, false).await;
        let got = (r.text.clone(), r.exit_code.unwrap_or(-1));
        diffs.check(command, &want, &got);
    }
    b.rt.shutdown().await;
    diffs.assert_none();
}

async fn differential_corpus_one_session(shell: &'static str) {
    // The whole corpus on ONE shell session, in order: no command may break the next one. The
    // oracle for each runs in a fresh `bash -c`, so state-changing commands are skipped here.
    let b = bench_in(shell);
    let mut diffs = Differences::default();
    let stateful = ["cd ", "set ", "exec", "alias", "shopt -s", "declare", "export", "x=", "trap"];
    for &(command, flags) in CORPUS {
        if stateful.iter().any(|s| command.contains(s)) || command.contains("exit") {
            continue;
        }
        if super::sessions::pending_in_one_session(shell, command).is_some() {
            continue;
        }
        let r = run(&b, command, "one-session", false).await;
        let want = oracle(&b, command, flags);
        let got = (r.text.clone(), r.exit_code.unwrap_or(-1));
        diffs.check(command, &want, &got);
    }
    b.rt.shutdown().await;
    diffs.assert_none();
}

async fn differential_corpus_pty_path(shell: &'static str) {
    let b = bench_in(shell);
    let mut diffs = Differences::default();
    let cases: Vec<_> = CORPUS.iter().filter(|(_, f)| f & PTY != 0).collect();
    assert!(cases.len() >= 100, "{} PTY cases", cases.len());
    for &&(command, flags) in &cases {
        // A PTY keeps its stage (contract §1): bash's own status is the one reported.
        let flags = flags & !PRODUCER;
        let (out, code) = oracle(&b, command, flags);
        let want = (as_terminal(&out), code);
        let r = run(&b, command, "pty", true).await;
        let got = (as_terminal(&r.text), r.exit_code.unwrap_or(-1));
        diffs.check(command, &want, &got);
    }
    b.rt.shutdown().await;
    diffs.assert_none();
}

async fn differential_sequences_keep_state_and_survive_errors(shell: &'static str) {
    let b = bench_in(shell);
    let mut diffs = Differences::default();
    for (n, steps) in SEQUENCES.iter().enumerate() {
        let key = format!("seq-{n}");
        for k in 0..steps.len() {
            // bash -c with the earlier steps run (output discarded) on the same line, each
            // through `eval`, then the step as written, as the session runs it.
            let mut script = String::new();
            let mut vars = Vec::new();
            for i in 0..=k {
                let name = format!("DIFF_S{i}");
                if i < k {
                    script.push_str(&format!("eval \"${name}\" >/dev/null 2>&1 </dev/null; "));
                } else {
                    script.push_str(steps[i]);
                }
                vars.push((name, steps[i]));
            }
            let extra: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            let want = bash_c(&b, &script, &extra);
            let r = run(&b, steps[k], &key, false).await;
            let got = (r.text.clone(), r.exit_code.unwrap_or(-1));
            // A restarted shell lost the state the oracle kept: a difference too.
            let got = if r.shell_restarted { (got.0 + " [shell restarted]", got.1) } else { got };
            diffs.check(format!("{steps:?} step {k}"), &want, &got);
        }
    }
    b.rt.shutdown().await;
    diffs.assert_none();
}

/// Deliberate differences that are not a transformation of the oracle: asserted as ours, with
/// bash's behaviour beside them so the difference stays visible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_deliberate_differences() {
    let b = bench();
    // contract §5: an EXIT trap runs when the session's shell ends, not after each command (as
    // in one script of the calls); its output belongs to the call that ends the shell.
    let r = run(&b, "trap 'echo bye $?' EXIT; echo hi", "d1", false).await;
    assert_eq!(r.text, "hi\n");
    assert_eq!(bash_c(&b, "trap 'echo bye $?' EXIT; echo hi", &[]).0, "hi\nbye 0\n");
    let r = run(&b, "exit 4", "d1", false).await;
    let want = bash_c(&b, "trap 'echo bye $?' EXIT; exit 4", &[]);
    assert_eq!((r.text.clone(), r.exit_code.unwrap_or(-1)), want);
    // contract §5: what bash -c does with a `return` at top level (refuses it and goes on) and
    // with an unset name under `set -u` (the script ends, 127: the next call gets a new shell).
    for (key, command) in [("d2", "return 3; echo x"), ("d3", "set -u; echo ${NOPE_UNSET}; echo x")]
    {
        let r = run(&b, command, key, false).await;
        let want = bash_c(&b, command, &[]);
        assert_eq!((r.text.clone(), r.exit_code.unwrap_or(-1)), want, "{command}");
    }
    assert!(run(&b, "echo again", "d3", false).await.shell_restarted);
    // `bash -c CMD` execs a lone command, so nobody reports its signal death; a session shell
    // forks it and reports it, as any bash script does.
    let r = run(&b, "sh -c 'kill -KILL $$'", "d4", false).await;
    assert!(r.text.contains("Killed"), "{:?}", r.text);
    assert_eq!(r.exit_code, Some(137));
    assert_eq!(bash_c(&b, "sh -c 'kill -KILL $$'", &[]), (String::new(), 137));
    b.rt.shutdown().await;
}

/// contract §1: a stripped stage's command prints its stderr past the stage, as bash does (the
/// version matrix and zsh run the corpus's cases): on every local path, the runner, the plain
/// driver (a prefix keeps the runner out), a POSIX `sh`, and the one-process path (a prefix that
/// hides the backend's files).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_stderr_of_a_stripped_stage_on_every_path() {
    let cases = [
        "echo err >&2 | wc -l | head -n 1",
        "{ seq 3; echo e1 >&2; seq 4 6; echo e2 >&2; } | tail -n 2",
        "(seq 5; echo late >&2) | tail -n 1",
        "{ echo a; echo b >&2; } 2>&1 | tail -n 1",
        // A background job's stderr, written after the foreground ended.
        "sh -c '(sleep 0.1; echo late >&2) & echo hi' | tail -n 1",
    ];
    let hiding = "unshare -m sh -c 'for d in /dev/shm ${XDG_RUNTIME_DIR:-/dev/shm}; do mount -t tmpfs none $d || exit 1; done; exec \"$0\" \"$@\"'";
    let paths = [
        ("/bin/bash", None),
        ("/bin/bash", Some("env")),
        ("/bin/sh", None),
        ("/bin/bash", Some(hiding)),
    ];
    for (shell, prefix) in paths {
        let b = bench_with(shell, prefix);
        for command in cases {
            let want = bash_c(&b, command, &[]);
            let r = run(&b, command, "apart", false).await;
            let got = (r.text.clone(), r.exit_code.unwrap_or(-1));
            assert_eq!(got, want, "{command:?} in {shell} with prefix {prefix:?}");
        }
        if prefix.is_none() && shell == "/bin/bash" {
            // The runner: a descriptor an earlier call pointed at its stderr follows the
            // script's output, past a stripped stage as bash prints it.
            run(&b, "exec 4>&2", "fd", false).await;
            let r = run(&b, "{ echo x >&4; seq 3; } | tail -n 1", "fd", false).await;
            let want = bash_c(&b, "exec 4>&2; { echo x >&4; seq 3; } | tail -n 1", &[]);
            assert_eq!((r.text.clone(), r.exit_code.unwrap_or(-1)), want);
        }
        // The hiding prefix took the one-process path: no state survives a call there.
        run(&b, "x=1", "state", false).await;
        let kept = run(&b, "echo ${x:-gone}", "state", false).await.text;
        assert_eq!(kept, if prefix == Some(hiding) { "gone\n" } else { "1\n" }, "{prefix:?}");
        b.rt.shutdown().await;
    }
}

/// contract §1: head-limited slow producers end within 0.5 s of bash's time, on pipes and PTYs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_head_limited_slow_producers_end_promptly() {
    let b = bench();
    let cases = [
        "while true; do echo x; sleep 0.1; done | head -n 3",
        "yes | head -n 5",
        "(echo a; echo b; sleep 0.4; echo c) | head -n 2",
        "cd / && while :; do echo tick; sleep 0.05; done | head -n 4",
    ];
    for command in cases {
        for pty in [false, true] {
            let t = Instant::now();
            let want = bash_c(&b, command, &[]);
            let bash_time = t.elapsed();
            let t = Instant::now();
            let r = run(&b, command, "slow", pty).await;
            let ours = t.elapsed();
            let got = if pty { as_terminal(&r.text) } else { r.text.clone() };
            let want_text = if pty { as_terminal(&want.0) } else { want.0.clone() };
            assert_eq!((got, r.exit_code), (want_text, Some(want.1)), "{command} pty={pty}");
            assert!(
                ours <= bash_time + Duration::from_millis(500),
                "{command} (pty={pty}): {ours:?} against bash's {bash_time:?}"
            );
        }
    }
    b.rt.shutdown().await;
}

/// contract §1: an explicit `head` only limits what is shown: the command runs to its end and its
/// real status is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_explicit_head_never_ends_the_command() {
    let b = bench();
    let marker = b.work.path().join("ran-to-the-end");
    let command = format!("seq 1 3000000; echo done; touch {}; exit 3", marker.to_string_lossy());
    let req = Request {
        command,
        head: Some(20),
        timeout: Some(60.0),
        session_key: Some("explicit".into()),
        ..Request::default()
    };
    let r = b.rt.run(req, CancellationToken::new(), None).await.unwrap();
    assert_eq!(r.exit_code, Some(3));
    assert_eq!(
        r.text,
        agent_bash::normalize::apply_head_tail(&bash_c(&b, "seq 1 30", &[]).0, Some(20), None)
    );
    assert!(marker.exists(), "the command was ended early");
    assert_eq!(r.total_lines, 3_000_001);
    b.rt.shutdown().await;
}

/// Random command lines from a small grammar, compared with `bash -c`.
fn atom() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("echo a".to_string()),
        Just("echo 'b  c'".to_string()),
        Just("printf 'x\\ny\\n'".to_string()),
        Just("printf 'no-eol'".to_string()),
        Just("true".to_string()),
        Just("false".to_string()),
        Just("seq 3".to_string()),
        Just("echo $((2+3))".to_string()),
        Just("echo err >&2".to_string()),
        Just("(echo sub)".to_string()),
        Just("{ echo grp; }".to_string()),
        Just("v=1".to_string()),
        Just("echo ${v:-unset}".to_string()),
        Just("cd /".to_string()),
        Just("export W=2".to_string()),
        Just("cat <<< here".to_string()),
        Just("echo $?".to_string()),
        Just("(exit 3)".to_string()),
    ]
}

fn filter() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("cat".to_string()),
        Just("tr a-z A-Z".to_string()),
        Just("head -n 2".to_string()),
        Just("tail -n 1".to_string()),
        Just("wc -l".to_string()),
        Just("sort -r".to_string()),
    ]
}

fn pipeline() -> impl Strategy<Value = String> {
    (atom(), proptest::collection::vec(filter(), 0..2))
        .prop_map(|(a, fs)| std::iter::once(a).chain(fs).collect::<Vec<_>>().join(" | "))
}

fn command_line() -> impl Strategy<Value = String> {
    let sep = prop_oneof![Just("; "), Just(" && "), Just(" || "), Just("\n")];
    let tail = prop_oneof![
        Just(String::new()),
        (1usize..4).prop_map(|n| format!(" | head -n {n}")),
        (1usize..4).prop_map(|n| format!(" | tail -n {n}")),
        Just(" 2>&1".to_string()),
    ];
    (pipeline(), proptest::collection::vec((sep, pipeline()), 0..3), tail).prop_map(
        |(first, rest, tail)| {
            let mut s = first;
            for (sep, p) in rest {
                s.push_str(sep);
                s.push_str(&p);
            }
            s.push_str(&tail);
            s
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn differential_random_command_lines(command in command_line()) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let b = bench();
        let (out, code) = bash_c(&b, &command, &[]);
        let r = rt.block_on(run(&b, &command, "prop", false));
        prop_assert_eq!(&r.text, &out, "{:?}", command);
        // A stripped stage reports the producer's status (contract §1), checked by the corpus.
        if r.normalized.is_none() {
            prop_assert_eq!(r.exit_code, Some(code), "{:?}", command);
        }
        rt.block_on(b.rt.shutdown());
    }
}
