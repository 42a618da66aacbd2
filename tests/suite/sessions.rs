//! The session differential suite (issue 29; contract §5 "a session is one script"): the calls
//! of one session must behave as the successive lines of one non-interactive bash script, a
//! single call as `bash -c`, on every bash of the version matrix (3.2, 4.4, the machine's 5.2,
//! 5.3), each bash being both the session's shell and the oracle.
//!
//! # The oracle
//! A sequence of calls `c1 … cn` runs through the runtime on one session key, and, for each k,
//! as one script `bash -O expand_aliases -c 'c1⏎…ck⏎EPILOGUE'` run by the same bash (the
//! session has aliases on, contract §5's rc snapshot). Call k's expected output is what the
//! script for k printed past what the script for k−1 printed (the two must agree on that
//! prefix: a case whose output is not deterministic is a broken case, and fails as one), its
//! expected status the script's. So nothing runs between two calls in the oracle either: no
//! marker command that would move `$?`, `$_`, PIPESTATUS, fire a DEBUG trap or be traced.
//!
//! The [`epilogue`] line (EPILOGUE above), after the last call of each script, does what a session does not: it
//! drops the EXIT trap (a session's shell lives on after a call; its EXIT trap belongs to the
//! call that ends it) and keeps the script's status, with its own trace, DEBUG trap output and
//! errors sent to /dev/null; it also leaves a file saying the script reached it. When it did
//! not, call k ended the script (`exit`, `set -e`, `set -u`, `kill $$`): the session must end
//! too, and the next call is the first line of a new script, on a fresh shell
//! (`shell_restarted`).
//!
//! Line numbers: each call numbers its own lines as its own `bash -c` does (contract §5:
//! `bash: -c: line 1:`; bash 3.2/4.4's `-c` starts at line 0), and a function keeps the
//! numbers of the call that defined it; the script numbers on from call to call. So every line
//! number bash prints (in a message, or where a case prints `LINENO N`) is taken to the call
//! whose lines hold it and counted from that call's first line ([`call_lines`]). One thing a
//! script cannot show: on bash 3.2/4.4 a message on a later call's line 0 (bash words it with
//! `line 0:` or without, by message); those comparisons are skipped and counted.
//!
//! Input that ends inside a construct (an unterminated quote, heredoc or `if`) would swallow the
//! next line of a script: [`ALONE`] cases are compared one-shot with a plain `bash -c`.
//!
//! Besides the output (after contract §4.1's sanitizing) and the status, every comparison
//! checks the counters: `total_lines` and `total_bytes` count what bash printed (contract §1,
//! last bullet), except after a stripped `| tail`, where they count the whole output.
//!
//! The groups are issue 29's. A group the session does not yet get right is
//! `#[ignore = "issue 29 group N: …"]`: visible, and runnable with `--ignored`.

use std::sync::atomic::{AtomicU64, Ordering};

use agent_bash::result::BashResult;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;

use super::differential::{bench_in, run, sanitized, Bench};

/// Ends every oracle script (see the module docs), leaving the file `alive`. `\builtin` so
/// that a user's alias or function named `trap` or `exit` changes nothing; the file's path is
/// in the text, not in a variable that `compgen -v` would show.
fn epilogue(alive: &std::path::Path) -> String {
    format!(
        "{{ __ab_s=$?; \\builtin trap - EXIT; \\builtin : >'{}'; \\builtin exit $__ab_s; }} >/dev/null 2>&1",
        alive.display()
    )
}

/// Each listed group, `const NAME: &[&[&str]]` of sequences, runs as `<name>` in every bash of
/// the matrix (`sessions::bash::<name>`, `bash_3_2`, `bash_4_4`, `bash_5_3`).
macro_rules! groups {
    ($($(#[$attr:meta])* $name:ident => $cases:expr;)*) => {
        mod bash {
            $($(#[$attr])* #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
              async fn $name() { use super::*; check("/bin/bash", $cases).await })*
        }
        mod bash_3_2 {
            $($(#[$attr])* #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
              async fn $name() { use super::*; check(crate::suite::support::bash_build("3.2"), $cases).await })*
        }
        mod bash_4_4 {
            $($(#[$attr])* #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
              async fn $name() { use super::*; check(crate::suite::support::bash_build("4.4"), $cases).await })*
        }
        mod bash_5_3 {
            $($(#[$attr])* #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
              async fn $name() { use super::*; check(crate::suite::support::bash_build("5.3"), $cases).await })*
        }
    };
}

groups! {
    sessions_state_carries_from_call_to_call => Cases::Script(STATE);
    sessions_counts_are_what_bash_printed => Cases::Script(GROUP_8);
    sessions_slow_endings_end_as_bash_does => Cases::Script(GROUP_9);
    sessions_generated_sequences => Cases::Generated(Grammar::Settled);
    sessions_err_trap_fires_where_the_script_s_does => Cases::Script(GROUP_1);
    sessions_debug_and_return_traps => Cases::Script(GROUP_2);
    sessions_exit_trap_output_belongs_to_the_call_that_ended_the_shell => Cases::Script(GROUP_3);
    sessions_xtrace_shows_the_user_s_commands_only => Cases::Script(GROUP_4);
    sessions_the_wrapper_is_invisible => Cases::Script(GROUP_5);
    sessions_input_ending_inside_a_construct_fails_as_bash_c_does => Cases::Alone(ALONE);
    sessions_status_pipestatus_and_underscore_carry_over => Cases::Script(GROUP_6);
    sessions_a_call_that_ends_the_script_ends_the_session => Cases::Script(GROUP_7);
    sessions_line_numbers_are_bash_c_s => Cases::Script(GROUP_10);
    sessions_aliases_apply_from_the_next_line => Cases::Script(GROUP_11);
    sessions_no_descriptor_of_ours => Cases::Script(GROUP_12);
    sessions_a_descriptor_left_on_the_output_follows_it => Cases::Script(DESCRIPTORS);
    sessions_corpus_cases_numbered_as_bash_c_numbers_them => Cases::Alone(OLD_BASH_LINE_NUMBERS);
    sessions_generated_sequences_over_script_state => Cases::Generated(Grammar::Full);
}

/// What one test compares.
#[derive(Clone, Copy)]
pub(crate) enum Cases {
    /// Sequences of calls against one script each.
    Script(&'static [&'static [&'static str]]),
    /// One-shot calls against a plain `bash -c` (see [`ALONE`]).
    Alone(&'static [&'static str]),
    /// Sequences generated from a grammar.
    Generated(Grammar),
}

/// State a script carries from line to line, which the session already carries.
const STATE: &[&[&str]] = &[
    &["x=5", "echo $x", "x=$((x+1)); echo $x"],
    &["f() { echo f$1; }", "f 1", "unset -f f", "f 2"],
    &["export E=1", "sh -c 'echo $E'", "export -n E", "sh -c 'echo ${E:-gone}'"],
    &["set -o pipefail", "false | true; echo $?", "set +o pipefail", "false | true; echo $?"],
    &["shopt -s extglob", "x=aab; echo ${x##+(a)}"],
    &["declare -A m; m[k]=v", "echo ${m[k]}"],
    &["a=(x y z)", "echo ${#a[@]} ${a[1]}", "a+=(w); echo ${a[@]}"],
    &["alias hi='echo alias-ran'", "hi", "unalias hi", "type hi >/dev/null 2>&1 || echo gone"],
    &["echo one", "echo two >&2", "printf 'no-eol'", "printf 'a\\nb'"],
    &["seq 3 | tail -n 1", "seq 10 | head -n 2", "seq 5 | head -n 1 | tail -n 1"],
    &["umask 027", "umask", "umask 022"],
    &["set -- a 'b c'", "echo $#", "printf '[%s]' \"$@\"; echo"],
    &["readonly R=1", "echo $R", "R=2", "echo $R"],
    &["n=0", "n=$((n+1))", "n=$((n+1))", "echo $n"],
    &["g() { local v=in; echo $v; }", "v=out", "g", "echo $v"],
    &["shopt -s nullglob", "echo none*here", "shopt -u nullglob", "echo none*here"],
    &["set -f", "echo *", "set +f"],
    &["IFS=:", "x=a:b:c; set -- $x; echo $#", "unset IFS"],
    &["echo out; echo err >&2; echo out2", "{ echo 1; echo 2 >&2; } 2>&1", "echo done"],
    &["exit 3", "echo after-exit"],
    &["(exit 4)", "echo after-subshell"],
    &["echo a; exit", "echo b"],
    &["x=1 | head -n 1", "echo ${x:-unset}"],
    &["exec 5>/dev/null", "echo ok >&5; echo $?"],
    &["cat <<EOF\nhello\nEOF", "cat <<'E'\n$HOME\nE"],
    &["read a b <<< 'x y'", "echo $b$a"],
    &["printf -v out '%05d' 42", "echo $out"],
    &["sleep 5 & kill $!; wait $!", "echo waited"],
    &["trap 'echo usr1' USR1", "kill -USR1 $$", "trap - USR1"],
    &["hash -r", "type -t ls", "command -v sh >/dev/null && echo found"],
    &["ulimit -n 512", "ulimit -n"],
    &["echo $((2**10))", "echo ${UNSET_XYZ:-fallback}"],
    // A lone command killed by a signal: reported as a script reports it (bash -c would exec
    // it and say nothing).
    &["sh -c 'kill -KILL $$'", "echo next"],
    // The cwd is set per call, and only the cwd (contract §5): OLDPWD is the script's.
    &["cd /tmp", "cd - >/dev/null; pwd"],
    &["echo ${OLDPWD:-none}", "cd /", "echo $OLDPWD"],
];

/// Group 8: counts after a stripped head are counts of what bash printed (contract §1).
const GROUP_8: &[&[&str]] = &[
    &["seq 9 | head -4"],
    &["seq 9 | head -n 4", "seq 100 | head -n 1"],
    &["yes 'a line long enough to fill the output window in a few hundred lines' | head -n 1500"],
    &["seq 100000 | head -n 3"],
    &["yes | head -n 5"],
    &["seq 3000 | head -n 2500"],
    &["cd / && seq 50 | head -n 7"],
    &["export V=1; seq 20 | head -n 2"],
    &["printf 'a\\nb\\nc' | head -n 2"],
    &["seq 9 | head -n 20"],
    &["seq 10 | tail -n 3"],
    &["seq 10 | head -n 5 | tail -n 2"],
];

/// Group 9: a shell that signals itself, and a command that moves our output descriptor.
const GROUP_9: &[&[&str]] = &[
    &["trap '' TERM; kill -TERM $$; echo survived"],
    &["trap '' TERM", "kill -TERM $$; echo survived", "trap - TERM"],
    &["exec 3>&1 1>&2 2>&3; echo swapped"],
    &["exec 3>&1 1>&2 2>&3; echo one; echo two >&2", "echo next"],
    &["exec 4>&1; echo kept >&4", "echo next"],
];

/// Group 1: ERR traps.
const GROUP_1: &[&[&str]] = &[
    &["trap 'echo ERR:$BASH_COMMAND' ERR", "false", "echo ok"],
    &["trap 'echo ERR' ERR; false; echo after"],
    &["trap 'echo ERR:$?' ERR", "ls /nonexistent-x", "true"],
    &["trap 'echo ERR' ERR", "/bin/false", "sh -c 'exit 3'"],
    &["f() { false; }; trap 'echo ERR' ERR", "f", "f; echo $?"],
    &["set -E; trap 'echo ERR' ERR", "g() { false; }; g"],
    &["trap 'echo ERR' ERR", "trap - ERR", "false"],
    &["trap 'echo ERR' ERR", "false || true", "! false", "false && true"],
];

/// Group 2: DEBUG and RETURN traps.
const GROUP_2: &[&[&str]] = &[
    &["trap 'echo D' DEBUG", "echo a", "echo b"],
    &["trap 'echo D' DEBUG; echo one"],
    &["trap 'echo D:$BASH_COMMAND' DEBUG", "true", "trap - DEBUG", "echo off"],
    &["trap 'echo R' RETURN", "f() { :; }; f", "echo x"],
    &["f() { echo in; }; trap 'echo R' RETURN", "f", "f"],
    &["set -T; trap 'echo D' DEBUG", "h() { echo h; }; h"],
];

/// Group 3: EXIT traps.
const GROUP_3: &[&[&str]] = &[
    &["trap 'echo \"EXIT $?\"' EXIT; exit 4"],
    &["trap 'echo bye' EXIT", "echo hi", "exit 3", "echo next"],
    &["trap 'echo bye' EXIT; echo hi", "echo still"],
    &["set -e; trap 'echo bye $?' EXIT", "false", "echo after"],
    &["trap 'echo bye' EXIT", "trap - EXIT", "exit 2"],
    &["trap 'echo first' EXIT", "trap 'echo second' EXIT", "exit"],
];

/// Group 4: xtrace.
const GROUP_4: &[&[&str]] = &[
    &["set -x; echo traced"],
    &["set -x", "echo traced", "set +x", "echo quiet"],
    &["set -x", "f() { echo in; }; f"],
    &["set -x", "x=$(echo sub); echo $x"],
    &["set -x", "/bin/echo spawned"],
    // A stage stripped under `set -x` (contract §1) would lose its own trace line. Only one
    // stage traces here: two stages trace side by side, in an order that varies from run to run.
    &["set -x", "{ seq 3; } 2>/dev/null | tail -n 1"],
    &["set -x", "{ seq 3; } 2>/dev/null | head -n 2", "set +x", "seq 3 | head -n 2"],
];

/// Group 5: nothing of ours is visible.
const GROUP_5: &[&[&str]] = &[
    &["echo $-"],
    &["set -e", "echo $-", "set +e"],
    &["caller; echo $?"],
    &["f() { caller; }; f"],
    &["echo ${#BASH_SOURCE[@]} ${BASH_SOURCE[0]}"],
    &["f() { echo ${BASH_SOURCE[@]} ${FUNCNAME[@]}; }; f"],
    &["echo ${#FUNCNAME[@]}", "echo ${#BASH_LINENO[@]}"],
    &["compgen -v | grep -v -x -e BASH_EXECUTION_STRING -e BASH_COMMAND"],
    &["x=1", "compgen -v | grep -v -x -e BASH_EXECUTION_STRING -e BASH_COMMAND"],
    &["compgen -A function", "alias", "trap -p"],
    &["f() { :; }", "compgen -A function"],
    &["declare -p | grep -c __agent"],
    &["echo $BASH_SUBSHELL ${#DIRSTACK[@]}"],
];

/// Input that ends inside a construct: each alone, against `bash -c` (see the module docs).
const ALONE: &[&str] = &[
    "if then fi",
    "echo 'x",
    "echo \"x",
    "echo `x",
    "echo $(x",
    "if true; then echo x",
    "while true; do",
    "{ echo x",
    "(echo x",
    "echo x |",
    "echo x &&",
    "fi",
    "echo ${x",
    "echo )",
    "case x in",
    "cat <<EOF\nno end",
    "echo a\necho \"b",
];

/// Group 6: `$?`, PIPESTATUS and `$_`.
const GROUP_6: &[&[&str]] = &[
    &["false", "echo $?"],
    &["true", "echo $?"],
    &["(exit 7)", "echo $?"],
    &["false | true | false", "echo ${PIPESTATUS[@]}"],
    &["echo a b c", "echo $_"],
    &["ls /nonexistent-x", "echo $?"],
    &["sh -c 'exit 9'", "echo $?", "echo $?"],
    &["/bin/echo spawned", "echo $_"],
    // After a stripped `| tail`/`| head` (contract §1): what the real stage would have left.
    &["seq 3 | tail -n 1", "echo ${PIPESTATUS[@]} $?"],
    &["set -o pipefail; false | tail -n 1", "echo ${PIPESTATUS[@]} $?"],
    &["yes | head -n 2", "echo ${PIPESTATUS[@]} $?"],
];

/// Group 7: a call that ends the script ends the session.
const GROUP_7: &[&[&str]] = &[
    &["set -u; echo $NOPE; echo after"],
    &["set -u", "echo $NOPE", "echo next"],
    &["set -u", "echo ${NOPE:-guarded}", "echo ${NOPE}x"],
    &["set -e", "false", "echo next"],
    &["set -e", "false || echo rescued", "echo still"],
    &["echo before; kill -TERM $$; echo after", "echo next"],
    &["set -e; f() { false; echo in-f; }", "f", "echo next"],
];

/// Group 10: line numbers as `bash -c` gives them.
const GROUP_10: &[&[&str]] = &[
    &["echo $LINENO"],
    &["echo $LINENO; echo $LINENO\necho $LINENO"],
    &["/tmp"],
    &["nonexistent-command-xyz"],
    &["true\nnonexistent-command-xyz"],
    &["cd /nonexistent-dir-xyz"],
    &["local x=1"],
    &["echo $((1/0))"],
    &["printf '%d\\n' abc"],
    &["f() { echo $LINENO; }\nf"],
    &["echo one", "echo LINENO $LINENO"],
    &["echo one\necho two", "echo LINENO $LINENO\necho LINENO $LINENO"],
    &["f() {\necho LINENO $LINENO\n}", "echo two", "f"],
    &["true", "true\nnonexistent-command-xyz", "echo x\ncd /nonexistent-dir-xyz"],
    &["x=1", "echo x\necho ${x:?}\necho $((1/0))"],
];

/// Group 11: an alias applies from the next line of the same call.
const GROUP_11: &[&[&str]] = &[
    &["alias ll='echo LL'\nll x"],
    &["alias a1='echo A1'; a1 2>/dev/null; echo $?"],
    &["alias g='echo G'\ng\nunalias g\ng 2>/dev/null || echo gone"],
    &["alias e2='echo E2'", "e2\nalias e2='echo E3'\ne2"],
];

/// Group 12: no descriptor of ours.
const GROUP_12: &[&[&str]] = &[
    &["ls /proc/self/fd"],
    &["exec 5>/dev/null", "ls /proc/self/fd"],
    &["(ls /proc/self/fd)", "ls /proc/self/fd | cat"],
];

/// A descriptor above 2 that a call pointed at its output (`exec 3>&1`) is the script's output
/// in every later line of a script: here, each later call's output (contract §5).
const DESCRIPTORS: &[&[&str]] = &[
    &["exec 3>&1", "echo x >&3", "echo y >&3; echo z"],
    &["exec 3>&1; echo a >&3", "echo b >&3; exec 3>&-", "echo c >&3"],
    &["exec 4>&2", "echo e >&4", "ls /proc/self/fd"],
    &["exec {v}>&1", "echo z >&$v"],
    &["exec 3>&1 1>&2 2>&3", "echo s >&3", "echo t"],
    &["exec 5>/dev/null", "echo hidden >&5; echo shown"],
    &["exec 6>&1", "sh -c 'echo child >&6'", "(echo sub >&6) | cat"],
];

/// Features an old bash lacks: a case using one (its text contains the first string) is skipped
/// on a bash whose oracle fails the probe (the second), naming the feature (the third).
const FEATURES: &[(&str, &str, &str)] = &[
    ("declare -A", "declare -A __probe", "associative arrays (bash 4.0)"),
    ("^^", "x=a; : ${x^^}", "case modification (bash 4.0)"),
];

/// Which sequences [`Cases::Generated`] makes.
#[derive(Clone, Copy)]
pub(crate) enum Grammar {
    /// Plain state (variables, functions, output, statuses of the call itself).
    Settled,
    /// Also what issue 29 is about: traps, `$?`, PIPESTATUS, `$_`, xtrace, aliases.
    Full,
}

const SETTLED_ATOMS: &[&str] = &[
    "x=1",
    "x=$((x+1))",
    "echo ${x:-unset}",
    "f() { echo f$#; }",
    "type f >/dev/null 2>&1 && f a b",
    "echo a",
    "printf 'no-eol'",
    "echo err >&2",
    "seq 3 | tail -n 1",
    "seq 5 | head -n 2",
    "export E=2",
    "sh -c 'echo ${E:-none}'",
    "true",
    "(exit 3)",
    "cat <<< here",
    "y=(p q); echo ${#y[@]}",
    "echo $((3*4))",
];

const SCRIPT_ATOMS: &[&str] = &[
    "false",
    "echo $?",
    "echo ${PIPESTATUS[@]}",
    "echo $_",
    "false | true",
    "trap 'echo ERR' ERR",
    "trap - ERR",
    "set -x",
    "set +x",
    "g() { echo g; }; trap 'echo R' RETURN",
    "trap - RETURN",
    "alias al='echo AL'\nal",
    "/bin/true",
    "ls /nonexistent-x",
    "unset -f f",
    "f a b",
];

/// A sequence of 1–4 calls, each 1–3 atoms joined by `; ` or a newline.
fn sequence(grammar: Grammar) -> impl Strategy<Value = Vec<String>> {
    let atoms: Vec<&'static str> = match grammar {
        Grammar::Settled => SETTLED_ATOMS.to_vec(),
        Grammar::Full => SETTLED_ATOMS.iter().chain(SCRIPT_ATOMS).copied().collect(),
    };
    let atom = proptest::sample::select(atoms);
    let sep = proptest::sample::select(vec!["; ", "\n"]);
    let call =
        (atom.clone(), proptest::collection::vec((sep, atom), 0..3)).prop_map(|(first, rest)| {
            let mut s = first.to_string();
            for (sep, a) in rest {
                s.push_str(sep);
                s.push_str(a);
            }
            s
        });
    proptest::collection::vec(call, 1..5)
}

/// Generated sequences per test run.
const GENERATED: usize = 48;

/// One call's expected result.
#[derive(Debug, PartialEq)]
struct Want {
    text: String,
    code: i32,
    restarted: bool,
}

/// Runs `script` as the oracle does: `<shell> -O expand_aliases -c SCRIPT` named `bash`, the
/// session's environment (with the owner mark the runtime adds, contract §5), the bench's
/// directory, stdin /dev/null, one pipe for both streams; with `end`, the [`epilogue`] follows
/// the script. Returns the raw output, the status, and whether the epilogue ran.
fn script_run(b: &Bench, script: &str, end: bool) -> (Vec<u8>, i32, bool) {
    use std::io::Read;
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let alive = b.work.path().join(format!(".alive-{}", RUNS.fetch_add(1, Ordering::Relaxed)));
    let script = match end {
        true => format!("{script}\n{}", epilogue(&alive)),
        false => script.to_owned(),
    };
    let (mut reader, writer) = std::io::pipe().unwrap();
    let mut cmd = std::process::Command::new(b.shell);
    cmd.arg0("bash")
        .args(["-O", "expand_aliases", "-c", &script])
        .env_clear()
        .envs(b.env.iter().map(|(k, v)| (k, v)))
        .env("AGENT_BASH_OWNER", b.rt.owner())
        .current_dir(b.work.path())
        .stdin(std::process::Stdio::null())
        .stdout(writer.try_clone().unwrap())
        .stderr(writer);
    let mut child = cmd.spawn().unwrap();
    drop(cmd);
    let mut raw = Vec::new();
    reader.read_to_end(&mut raw).unwrap();
    let status = child.wait().unwrap();
    let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    let reached = alive.exists();
    let _ = std::fs::remove_file(&alive);
    (raw, code, reached)
}

/// The lines `call` takes in a script.
fn script_lines(call: &str) -> usize {
    call.matches('\n').count() + 1
}

/// Where the calls of one oracle script lie: the script line each starts on, in bash's
/// numbering of a `-c` script (from 1 on bash 5, from 0 on 3.2/4.4, as in a single call), and
/// how many lines it takes.
struct Lines {
    first: usize,
    calls: Vec<(usize, usize)>,
}

impl Lines {
    fn new(old: bool) -> Lines {
        Lines { first: if old { 0 } else { 1 }, calls: Vec::new() }
    }

    fn push(&mut self, call: &str) {
        let start = self.calls.last().map_or(self.first, |&(s, n)| s + n);
        self.calls.push((start, script_lines(call)));
    }

    /// Script line `n` as the call it lies in numbers it (contract §5: each call counts its
    /// own lines, as its `bash -c` would), and whether that call is a later one whose first
    /// line it is on bash 3.2/4.4 (line 0, see [`call_lines`]).
    fn of(&self, n: usize) -> (usize, bool) {
        match self.calls.iter().position(|&(s, len)| s <= n && n < s + len) {
            Some(j) => {
                let rel = n - self.calls[j].0 + self.first;
                (rel, j > 0 && rel == 0)
            }
            None => (n, false),
        }
    }
}

/// Line numbers in bash's output, as the calls number them: in messages (`bash: line N:`,
/// `bash: -c: line N:`, `here-document at line N`) and where a case prints `LINENO N`. Each
/// number is taken to the call whose lines hold it: a function keeps the numbers of the call
/// that defined it, as in the session. `None` when a message names a later call's line 0 on
/// bash 3.2/4.4, which their `-c` words in two ways (with `line 0:` or without, by message) and
/// a script can never show: that comparison cannot be made.
fn call_lines(text: &str, lines: &Lines) -> Option<String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) =
        ["line ", "LINENO "].iter().filter_map(|m| rest.find(m).map(|i| (i, m.len()))).min()
    {
        let (head, tail) = rest.split_at(at.0 + at.1);
        out.push_str(head);
        let digits = tail.len() - tail.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let after = &tail[digits..];
        let message = head.ends_with(": line ") || head.ends_with("at line ");
        let value = head.ends_with("LINENO ");
        let ends = after.is_empty() || after.starts_with([':', ' ', '\n']);
        if digits > 0 && ends && (message || value) {
            let (n, ambiguous) = lines.of(tail[..digits].parse().unwrap());
            if ambiguous && message {
                return None;
            }
            out.push_str(&n.to_string());
        } else {
            out.push_str(&tail[..digits]);
        }
        rest = after;
    }
    out.push_str(rest);
    Some(out)
}

/// Process ids in bash's job messages (`bash: line 1:  1234 Terminated …`) vary by run.
pub(crate) fn without_pids(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        match line.split_once(": line ") {
            Some((head, rest)) => {
                let (num, after) = rest.split_at(rest.find(':').unwrap_or(0));
                let after_colon = after.strip_prefix(':').unwrap_or(after);
                let trimmed = after_colon.trim_start();
                let digits =
                    trimmed.len() - trimmed.trim_start_matches(|c: char| c.is_ascii_digit()).len();
                if !num.is_empty() && digits > 0 && trimmed[digits..].starts_with(' ') {
                    out.push_str(&format!("{head}: line {num}: PID{}", &trimmed[digits..]));
                } else {
                    out.push_str(line);
                }
            }
            None => out.push_str(line),
        }
    }
    out
}

/// The expected results of a sequence; `None` for a comparison the oracle cannot give.
fn expect(b: &Bench, calls: &[String]) -> Vec<Option<Want>> {
    let mut wants = Vec::new();
    let mut start = 0; // the call the current script began with
    let mut prev = String::new();
    for k in 0..calls.len() {
        let script = calls[start..=k].join("\n");
        let (out, code, alive) = script_run(b, &script, true);
        // Compared as text without process ids (bash's job messages carry them).
        let out = without_pids(&sanitized(&out));
        assert!(
            out.starts_with(&prev),
            "the oracle is not deterministic for {:?}: {prev:?} then {out:?}",
            &calls[start..=k],
        );
        let mut lines = Lines::new(is_old(b.shell));
        calls[start..=k].iter().for_each(|c| lines.push(c));
        let text = call_lines(&out[prev.len()..], &lines);
        wants.push(text.map(|text| Want { text, code, restarted: k > 0 && start == k }));
        if alive {
            prev = out;
        } else {
            start = k + 1;
            prev.clear();
        }
    }
    wants
}

/// Tallies of one test.
#[derive(Default)]
struct Tally {
    compared: usize,
    skipped: Vec<String>,
    diffs: Vec<String>,
}

impl Tally {
    fn compare(&mut self, what: &str, want: Option<Want>, r: &BashResult) {
        let Some(want) = want else {
            self.skipped.push(format!("{what:?}: a later call's line 0 (bash 3.2/4.4)"));
            return;
        };
        self.compared += 1;
        let got = Want {
            text: without_pids(&r.text),
            code: r.exit_code.unwrap_or(-1),
            restarted: r.shell_restarted,
        };
        // The window keeps the end of a long output (contract §4.2): then the text is the end
        // of bash's.
        let same = if r.truncated {
            want.text.ends_with(&got.text)
                && (want.code, want.restarted) == (got.code, got.restarted)
        } else {
            want == got
        };
        if !same {
            self.diffs.push(format!("{what:?}\n  bash:    {want:?}\n  session: {got:?}"));
            return;
        }
        // Counters count what bash printed, except after a stripped tail (the whole output).
        let tail_stripped = r.normalized.as_ref().is_some_and(|n| !n["tail"].is_null());
        let lines = agent_bash::sink::count_lines(&want.text);
        // Bytes of the text itself when it is whole (process ids differ in length by run).
        let bytes = if r.truncated { want.text.len() } else { r.text.len() } as u64;
        if !tail_stripped && (r.total_lines, r.total_bytes) != (lines, bytes) {
            self.diffs.push(format!(
                "{what:?}: counted {} lines, {} bytes; bash printed {lines} lines, {} bytes",
                r.total_lines, r.total_bytes, bytes
            ));
        }
    }

    fn finish(self, shell: &str) {
        eprintln!(
            "{shell}: {} comparisons, {} skipped{}",
            self.compared,
            self.skipped.len(),
            self.skipped.iter().map(|s| format!("\n  skipped {s}")).collect::<String>()
        );
        assert!(
            self.diffs.is_empty(),
            "{} differences:\n{}",
            self.diffs.len(),
            self.diffs.join("\n")
        );
        assert!(self.compared > 0, "nothing compared");
    }
}

static KEYS: AtomicU64 = AtomicU64::new(0);

/// Whether `shell` is older than bash 5 (its `-c` numbers the first line 0).
fn is_old(shell: &str) -> bool {
    super::support::bash_version(shell).0 < 5
}

/// The feature of [`FEATURES`] that `calls` need and this bash lacks, checked on the oracle.
fn lacks(b: &Bench, calls: &[String]) -> Option<&'static str> {
    FEATURES.iter().find_map(|&(needle, probe, what)| {
        let uses = calls.iter().any(|c| c.contains(needle));
        (uses && script_run(b, probe, false).1 != 0).then_some(what)
    })
}

/// Runs a sequence through one session key and against the oracle.
async fn sequence_check(b: &Bench, t: &mut Tally, calls: &[String]) {
    if let Some(what) = lacks(b, calls) {
        t.skipped.push(format!("{calls:?}: this bash lacks {what} (its own bash -c fails)"));
        return;
    }
    let wants = expect(b, calls);
    let key = format!("seq-{}", KEYS.fetch_add(1, Ordering::Relaxed));
    for (k, want) in wants.into_iter().enumerate() {
        let r = run(b, &calls[k], &key, false).await;
        t.compare(&format!("{calls:?} call {}", k + 1), want, &r);
    }
}

pub(crate) async fn check(shell: &'static str, cases: Cases) {
    let b = bench_in(shell);
    let mut t = Tally::default();
    match cases {
        Cases::Script(seqs) => {
            for seq in seqs {
                let calls: Vec<String> = seq.iter().map(|c| c.to_string()).collect();
                sequence_check(&b, &mut t, &calls).await;
            }
        }
        Cases::Alone(calls) => {
            for call in calls {
                let (out, code, _) = script_run(&b, call, false);
                let want = Want { text: without_pids(&sanitized(&out)), code, restarted: false };
                let key = format!("alone-{}", KEYS.fetch_add(1, Ordering::Relaxed));
                let r = run(&b, call, &key, false).await;
                t.compare(call, Some(want), &r);
            }
        }
        Cases::Generated(grammar) => {
            let mut runner = TestRunner::deterministic();
            let strategy = sequence(grammar);
            for _ in 0..GENERATED {
                let calls = strategy.new_tree(&mut runner).unwrap().current();
                sequence_check(&b, &mut t, &calls).await;
            }
        }
    }
    b.rt.shutdown().await;
    t.finish(shell);
}

/// The corpus cases of `tests/suite/differential.rs` whose line numbers bash 3.2/4.4 give as
/// their `-c` does (from line 0, `line 0:` in some messages and none in others), each alone
/// against `bash -c` here too.
pub(crate) const OLD_BASH_LINE_NUMBERS: &[&str] = &[
    "declare -A m=([k]=v); echo ${m[k]}",
    "cat <<EOF\nno end",
    "echo 'x",
    "echo \"x",
    "echo `x",
    "echo $(x",
    "if true; then echo x",
    "while true; do",
    "{ echo x",
    "(echo x",
    "echo x |",
    "echo x &&",
    "fi",
    "echo ${x",
    "echo )",
    "case x in",
    "cd /nonexistent-dir-xyz",
    "nonexistent-command-xyz",
    "echo $((1/0))",
    "local x=1",
    "printf '%d\\n' abc",
    "true\ncd /nonexistent-dir-xyz",
    "x=abcdef; echo ${x:2:3} ${x^^} ${x/c/C}",
    "echo $LINENO; echo $LINENO\necho $LINENO",
    "echo a\necho \"b",
    // tests/suite/spawn.rs.
    "./notexec",
    "./missing",
    "./badinterp",
    "no-such-command-here x",
    "ls /nonexistent-dir",
    // Sequence steps.
    "f 2",
    "cat <<EOF\nunterminated",
    "if true; then",
    "declare -A m; m[k]=v",
    "echo $LINENO",
];

/// Whether `command` is one of [`OLD_BASH_LINE_NUMBERS`] and `shell` a bash 3.2/4.4 of the
/// matrix: the plain-bash driver (no runner builtin) numbers such a command's lines from
/// another line than `bash -c` does there (doc/internals.md, the driver's row).
pub(crate) fn old_bash_line_numbers(shell: &str, command: &str) -> bool {
    let old = super::support::matrix_dir(shell).is_some() && is_old(shell);
    old && OLD_BASH_LINE_NUMBERS.contains(&command)
}

/// Why a corpus case of `tests/suite/differential.rs` is not compared in one session on `shell`
/// yet, if it is not: on bash 5.3, after the corpus's earlier commands in the same shell, an
/// input ending after `|` or `&&` names a `(` of ours (`unexpected end of file from `(' command
/// on line 1`).
pub(crate) fn pending_in_one_session(shell: &str, command: &str) -> Option<&'static str> {
    let v53 = super::support::matrix_dir(shell).is_some()
        && super::support::bash_version(shell) == (5, 3);
    (v53 && ["echo x |", "echo x &&"].contains(&command))
        .then_some("issue 29 group 5: messages read as bash's own")
}

#[test]
fn sessions_call_lines_and_pids() {
    // Bash 5: calls of 1, 2 and 1 lines on script lines 1, 2-3, 4.
    let mut lines = Lines::new(false);
    ["a", "b\nc", "d"].iter().for_each(|c| lines.push(c));
    assert_eq!(
        call_lines("bash: line 3: x: command not found\n", &lines).unwrap(),
        "bash: line 2: x: command not found\n"
    );
    assert_eq!(call_lines("bash: -c: line 4: `fi'\n", &lines).unwrap(), "bash: -c: line 1: `fi'\n");
    assert_eq!(call_lines("LINENO 1\nLINENO 4\n", &lines).unwrap(), "LINENO 1\nLINENO 1\n");
    assert_eq!(call_lines("the line 3 stays\n", &lines).unwrap(), "the line 3 stays\n");
    // Bash 3.2/4.4: the same calls on script lines 0, 1-2, 3.
    let mut old = Lines::new(true);
    ["a", "b\nc", "d"].iter().for_each(|c| old.push(c));
    assert_eq!(call_lines("bash: line 2: x\n", &old).unwrap(), "bash: line 1: x\n");
    assert_eq!(call_lines("bash: line 0: x\n", &old).unwrap(), "bash: line 0: x\n");
    assert_eq!(call_lines("bash: line 3: x\n", &old), None);
    assert_eq!(call_lines("LINENO 3\n", &old).unwrap(), "LINENO 0\n");
    assert_eq!(
        without_pids("bash: line 1:  7031 Terminated              sleep 5\n143\n"),
        "bash: line 1: PID Terminated              sleep 5\n143\n"
    );
}
