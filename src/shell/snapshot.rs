//! Capturing the user's rc: options, functions, aliases and PATH from an interactive shell.
//!
//! An agent's shell must feel like the user's (their aliases and functions work) without the
//! parts of an interactive setup that break automation (prompts, `set -e`, job control). So the
//! rc is run once per shell path in an interactive shell (zsh: an interactive login shell, so
//! `.zshenv`, `.zprofile`, `.zshrc` and `.zlogin` are read in their order) with stdin
//! /dev/null and stderr discarded, under [`CAPTURE_LIMIT`]; what it defined is written to a
//! script that every new session sources. A failed or hung rc gives no snapshot, never a
//! failed command.

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use super::local::{nonce, ShellKind};
use super::procs;
use crate::project::quote;

/// The rc gets this long to finish (contract §5).
pub const CAPTURE_LIMIT: Duration = Duration::from_secs(10);

/// Function and alias names never taken over from the rc: the agent's tools must behave as
/// documented, not as the user's customisations (contract §5).
const SKIP_NAMES: &[&str] = &[
    "ls", "dir", "vdir", "cat", "head", "tail", "less", "more", "grep", "egrep", "fgrep", "rg",
    "find", "fd", "locate", "sed", "awk", "perl", "cp", "mv", "rm", "mkdir", "rmdir", "touch",
    "chmod", "chown", "ln", "pwd", "readlink", "stat", "cut", "sort", "uniq", "xargs", "tee", "tr",
    "basename", "dirname",
];

/// Options that would break an agent shell or change what a command means (contract §5), as bash
/// (`set -o`/`shopt`) and zsh (`setopt`, lower case without `_`) name them. A zsh option is
/// dropped whichever way the rc turned it (`setopt noclobber` or `unsetopt clobber` are the same).
const DROP_OPTIONS: &[&str] = &[
    // Both shells, and bash's spellings.
    "errexit",
    "nounset",
    "xtrace",
    "verbose",
    "noexec",
    "histexpand",
    "monitor",
    "emacs",
    "vi",
    "posix",
    "onecmd",
    "history",
    "login_shell",
    "restricted_shell",
    "ignoreeof",
    "privileged",
    "interactive",
    "zle",
    "shinstdin",
    "singlecommand",
    "restricted",
    "login",
    "noclobber",
    "nullglob",
    "failglob",
    "xpg_echo",
    "dotglob",
    "nocaseglob",
    "nocasematch",
    "lastpipe",
    // zsh: how a command line is read (`git reset HEAD^` is a glob under extendedglob), what
    // `>` may overwrite, what cd does, and what is printed around commands.
    "errreturn",
    "unset",
    "exec",
    "banghist",
    "clobber",
    "rcquotes",
    "extendedglob",
    "kshglob",
    "shglob",
    "globdots",
    "nomatch",
    "cshnullglob",
    "glob",
    "globsubst",
    "magicequalsubst",
    "equals",
    "braceccl",
    "ignorebraces",
    "ignoreclosebraces",
    "shwordsplit",
    "ksharrays",
    "kshzerosubscript",
    "octalzeroes",
    "cbases",
    "shfileexpansion",
    "shnullcmd",
    "bsdecho",
    "rematchpcre",
    "multios",
    "autocd",
    "cdablevars",
    "autopushd",
    "pushdtohome",
    "pushdsilent",
    "pushdminus",
    "pushdignoredups",
    "chaselinks",
    "chasedots",
    "posixcd",
    "posixbuiltins",
    "posixaliases",
    "posixargzero",
    "posixidentifiers",
    "posixstrings",
    "posixtraps",
    "posixjobs",
    "correct",
    "correctall",
    "printexitvalue",
    "sunkeyboardhack",
    "warncreateglobal",
    "warnnestedvar",
    "aliases",
    "evallineno",
    "functionargzero",
    "localoptions",
    "localtraps",
    "sourcetrace",
    "typesetsilent",
    "kshtypeset",
    "pathdirs",
    "hashdirs",
    "continueonerror",
    "bgnice",
    "hup",
    "checkjobs",
    "checkrunningjobs",
];

/// zsh functions the shell calls by itself (hooks, traps, the not-found handler) and bash's
/// not-found handler: they would change what commands print.
const HOOKS: &[&str] = &[
    "chpwd",
    "precmd",
    "preexec",
    "periodic",
    "zshaddhistory",
    "zshexit",
    "zsh_directory_name",
    "command_not_found_handler",
    "command_not_found_handle",
];

/// Why the snapshot left something of the rc out (`:checkhealth` counts them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Dropped {
    /// Named like a shell builtin or reserved word (`cd`, `echo`, `[`).
    BuiltinName,
    /// One of the tools agents rely on (`ls`, `grep`, `cat` …).
    ToolName,
    /// A zsh autoload stub (`builtin autoload -X…` as its body).
    AutoloadStub,
    /// A hook the shell calls by itself (`chpwd`, `precmd`, `TRAPEXIT`, not-found handlers).
    Hook,
    /// Calls (or, for an alias, runs) a function the snapshot left out.
    NeedsDropped,
    /// A zsh global (`alias -g`) or suffix (`alias -s`) alias: it rewrites words anywhere.
    GlobalAlias,
    /// A name the shell cannot read back (`alias -- -='cd -'`), or one starting with `_`.
    Unreadable,
    /// An option that would break an agent shell or change what a command means.
    Option,
}

impl Dropped {
    pub fn reason(self) -> &'static str {
        match self {
            Dropped::BuiltinName => "named like a builtin or keyword",
            Dropped::ToolName => "named like a common tool",
            Dropped::AutoloadStub => "autoload stub",
            Dropped::Hook => "shell hook",
            Dropped::NeedsDropped => "needs a dropped function",
            Dropped::GlobalAlias => "global or suffix alias",
            Dropped::Unreadable => "name the shell cannot re-read",
            Dropped::Option => "changes what commands do",
        }
    }
}

/// What a snapshot kept and dropped, for `:checkhealth` (one line in the snapshot file).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub options: usize,
    pub functions: usize,
    pub aliases: usize,
    /// (what, why, how many): `("function", AutoloadStub, 3)`.
    pub dropped: Vec<(&'static str, Dropped, usize)>,
}

impl Report {
    fn drop(&mut self, what: &'static str, why: Dropped) {
        match self.dropped.iter_mut().find(|(w, y, _)| *w == what && *y == why) {
            Some(entry) => entry.2 += 1,
            None => self.dropped.push((what, why, 1)),
        }
    }

    /// One line: `kept 12 options, 30 functions, 4 aliases; dropped 2 functions (autoload
    /// stub), 1 alias (named like a builtin or keyword)`.
    pub fn line(&self) -> String {
        let mut dropped = self.dropped.clone();
        dropped.sort_by_key(|&(w, y, _)| (w, y));
        let plural = |n: usize, w: &str| {
            if n == 1 {
                format!("{n} {w}")
            } else if w == "alias" {
                format!("{n} aliases")
            } else {
                format!("{n} {w}s")
            }
        };
        let mut text = format!(
            "kept {}, {}, {}",
            plural(self.options, "option"),
            plural(self.functions, "function"),
            plural(self.aliases, "alias")
        );
        if dropped.is_empty() {
            text.push_str("; dropped nothing");
        } else {
            let parts: Vec<String> = dropped
                .iter()
                .map(|&(w, y, n)| format!("{} ({})", plural(n, w), y.reason()))
                .collect();
            text.push_str(&format!("; dropped {}", parts.join(", ")));
        }
        text
    }
}

/// The prefix of the report line in a snapshot file.
const REPORT_PREFIX: &str = "# report: ";

/// The rc files whose change invalidates a snapshot.
fn rc_files(kind: ShellKind) -> Vec<PathBuf> {
    let Some(home) = dirs::home_dir() else { return Vec::new() };
    let names: &[&str] = match kind {
        ShellKind::Bash => &[".bashrc", ".bash_profile", ".bash_aliases", ".profile"],
        ShellKind::Zsh => &[".zshrc", ".zshenv", ".zprofile", ".zlogin"],
        ShellKind::Posix => &[],
    };
    names.iter().map(|n| home.join(n)).collect()
}

/// Modification times of the rc files (None: missing).
type RcStamp = Vec<Option<SystemTime>>;

fn rc_stamp(kind: ShellKind) -> RcStamp {
    rc_files(kind).iter().map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok()).collect()
}

/// The dump script run inside the interactive shell; writes to `$1`-like target `out`.
fn dump_script(kind: ShellKind, out: &Path) -> String {
    let out = quote(&out.to_string_lossy());
    match kind {
        ShellKind::Bash => format!(
            "{{ builtin shopt -p; builtin set +o; \
             builtin compgen -b -k | while IFS= builtin read -r __ab_b; do builtin printf '#B %s\\n' \"$__ab_b\"; done; \
             for __ab_f in $(builtin compgen -A function); do \
               builtin printf '#F %s\\n' \"$__ab_f\"; builtin declare -f -- \"$__ab_f\"; done; \
             builtin printf '#A\\n'; builtin alias -p; \
             builtin printf '#P\\nexport PATH=%q\\n' \"$PATH\"; }} >{out} 2>/dev/null"
        ),
        ShellKind::Zsh => format!(
            "{{ builtin zmodload -L; \
             builtin setopt | while read -r __ab_o; do builtin print -r -- \"setopt $__ab_o\"; done; \
             for __ab_b in ${{(k)builtins}} ${{(k)reswords}}; do builtin print -r -- \"#B $__ab_b\"; done; \
             for __ab_f in ${{(k)functions}}; do builtin print -r -- \"#F $__ab_f\"; builtin functions -- \"$__ab_f\"; done; \
             builtin print -r -- '#A'; builtin alias -L; \
             builtin print -r -- '#P'; builtin print -r -- \"export PATH=${{(q)PATH}}\"; }} >{out} 2>/dev/null"
        ),
        ShellKind::Posix => String::new(),
    }
}

/// One function of the dump: its name and its text as the shell printed it.
struct Function<'a> {
    name: &'a str,
    text: String,
}

impl Function<'_> {
    /// The body's words (the first line, the name, left out): what it may call.
    fn words(&self) -> impl Iterator<Item = (&str, &str)> {
        let body = self.text.split_once('\n').map_or("", |(_, b)| b);
        let words: Vec<&str> = body
            .split(|c: char| c.is_whitespace() || ";|&(){}<>\"'`$".contains(c))
            .filter(|w| !w.is_empty())
            .collect();
        let prev: Vec<&str> = std::iter::once("").chain(words.iter().copied()).collect();
        prev.into_iter().zip(words)
    }

    fn is_autoload_stub(&self) -> bool {
        self.text.contains("builtin autoload -X")
    }
}

/// The raw dump, read into its parts (see [`filter_dump`]).
#[derive(Default)]
struct Dump<'a> {
    /// The options (and modules) kept, as script lines.
    options: String,
    /// Names of the shell's builtins and keywords.
    reserved: std::collections::HashSet<&'a str>,
    functions: Vec<Function<'a>>,
    alias_lines: Vec<&'a str>,
    path: String,
}

/// Turns the raw dump into the script sessions source, and says what it kept and dropped.
/// Options come first (completion functions need `extglob` to parse); then the functions, each
/// with every function it calls or not at all; then the aliases; then PATH. Nothing may take
/// the name of a builtin or keyword of the shell (contract §5, turn 3).
pub fn filter_dump(raw: &str, kind: ShellKind) -> (String, Report) {
    let mut report = Report::default();
    let Dump { options, reserved, functions, alias_lines, path } =
        read_dump(raw, kind, &mut report);
    let by_name: HashMap<&str, usize> =
        functions.iter().enumerate().map(|(i, f)| (f.name, i)).collect();
    let keep = kept_functions(&functions, &by_name, &reserved, kind, &mut report);
    let mut script = options;
    if kind == ShellKind::Zsh {
        // zsh starts with aliases of its own (`run-help`, `which-command`): a function of the
        // same name would not parse. The rc's aliases, those two included, come back below.
        script.push_str("\\builtin unalias -m '*'\n");
    }
    for (i, f) in functions.iter().enumerate() {
        if keep[i] {
            report.functions += 1;
            script.push_str(&f.text);
        }
    }
    for line in alias_lines {
        match keep_alias(line, kind, &reserved, &by_name, &keep) {
            Ok(()) => {
                report.aliases += 1;
                script.push_str(line);
                script.push('\n');
            }
            Err(why) => report.drop("alias", why),
        }
    }
    script.push_str(&path);
    (script, report)
}

/// Splits the raw dump into its parts, keeping the options that may be kept.
fn read_dump<'a>(raw: &'a str, kind: ShellKind, report: &mut Report) -> Dump<'a> {
    #[derive(PartialEq)]
    enum Part {
        Options,
        Function,
        Aliases,
        Path,
    }
    let mut dump = Dump::default();
    let mut part = Part::Options;
    for line in raw.lines() {
        if let Some(name) = line.strip_prefix("#B ") {
            dump.reserved.insert(name.trim());
            continue;
        }
        if let Some(name) = line.strip_prefix("#F ") {
            part = Part::Function;
            dump.functions.push(Function { name: name.trim(), text: String::new() });
            continue;
        }
        if line == "#A" {
            part = Part::Aliases;
            continue;
        }
        if line == "#P" {
            part = Part::Path;
            continue;
        }
        match part {
            Part::Options => option_line(line, kind, report, &mut dump.options),
            Part::Function => {
                if let Some(f) = dump.functions.last_mut() {
                    f.text.push_str(line);
                    f.text.push('\n');
                }
            }
            Part::Aliases => dump.alias_lines.push(line),
            Part::Path => {
                dump.path.push_str(line);
                dump.path.push('\n');
            }
        }
    }
    dump
}

/// One line of the options part: kept in `options`, or counted as dropped.
fn option_line(line: &str, kind: ShellKind, report: &mut Report, options: &mut String) {
    // Modules the rc loaded (oh-my-zsh's functions read `$langinfo`), before the functions
    // that use them.
    if let Some(module) = line.strip_prefix("zmodload ") {
        if kind == ShellKind::Zsh && module != "zsh/main" && !module.starts_with('-') {
            options.push_str(&format!("zmodload {module}\n"));
        }
        return;
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    let name = words.last().copied().unwrap_or("");
    let known = matches!(words.first(), Some(&"shopt") | Some(&"set") | Some(&"setopt"));
    if !known {
        return;
    }
    // `shopt -u compat32` is how bash lists an option that is off by default, but setting it
    // makes bash 5 define BASH_COMPAT, which `bash -c` has not (contract §5: nothing shows
    // that a script would not have): a compatibility option the rc did not turn on is left
    // alone.
    if kind == ShellKind::Bash && line.starts_with("shopt -u compat") {
        return;
    }
    let plain = name.to_ascii_lowercase().replace('_', "");
    let dropped = DROP_OPTIONS.contains(&name)
        || (kind == ShellKind::Zsh
            && (DROP_OPTIONS.contains(&plain.as_str())
                || plain.strip_prefix("no").is_some_and(|n| DROP_OPTIONS.contains(&n))));
    if dropped {
        // bash lists every option; only one the rc turned on counts as dropped.
        if kind == ShellKind::Zsh || line.starts_with("set -o") || line.starts_with("shopt -s") {
            report.drop("option", Dropped::Option);
        }
    } else {
        report.options += 1;
        options.push_str(line);
        options.push('\n');
    }
}

/// Why a function cannot be kept on its own account.
fn unfit(
    f: &Function,
    reserved: &std::collections::HashSet<&str>,
    kind: ShellKind,
) -> Option<Dropped> {
    let name = f.name;
    if reserved.contains(name) {
        Some(Dropped::BuiltinName)
    } else if SKIP_NAMES.contains(&name) {
        Some(Dropped::ToolName)
    } else if f.is_autoload_stub() {
        Some(Dropped::AutoloadStub)
    } else if HOOKS.contains(&name)
        || (kind == ShellKind::Zsh
            && name.len() > 4
            && name.starts_with("TRAP")
            && name[4..].bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit()))
    {
        Some(Dropped::Hook)
    } else {
        None
    }
}

/// Which functions are kept: a root (a function the user calls by name: not `_`-prefixed) is
/// kept with everything it reaches, unless it reaches a function that cannot be kept (a call
/// to one named like a builtin or a tool reaches the builtin or the tool instead).
fn kept_functions(
    functions: &[Function],
    by_name: &HashMap<&str, usize>,
    reserved: &std::collections::HashSet<&str>,
    kind: ShellKind,
    report: &mut Report,
) -> Vec<bool> {
    // Calls: a body word naming a function, unless `builtin`/`command` (or a backslash) says
    // it is not the function.
    let calls: Vec<Vec<usize>> = functions
        .iter()
        .map(|f| {
            let mut out: Vec<usize> = f
                .words()
                .filter(|(prev, _)| {
                    !matches!(*prev, "builtin" | "command" | "\\builtin" | "\\command")
                })
                .filter_map(|(_, w)| by_name.get(w).copied())
                .collect();
            out.sort_unstable();
            out.dedup();
            out
        })
        .collect();
    let unfit: Vec<Option<Dropped>> = functions.iter().map(|f| unfit(f, reserved, kind)).collect();
    let mut keep = vec![false; functions.len()];
    let mut dropped_roots: Vec<(usize, Dropped)> = Vec::new();
    for (root, f) in functions.iter().enumerate() {
        if f.name.starts_with('_') {
            continue;
        }
        if let Some(why) = unfit[root] {
            dropped_roots.push((root, why));
            continue;
        }
        match reach(root, &calls, &unfit) {
            Some(seen) => {
                for (i, s) in seen.iter().enumerate() {
                    keep[i] |= *s;
                }
            }
            None => dropped_roots.push((root, Dropped::NeedsDropped)),
        }
    }
    for (_, why) in &dropped_roots {
        report.drop("function", *why);
    }
    keep
}

/// The functions `root` reaches, or `None` when one of them cannot be kept.
fn reach(root: usize, calls: &[Vec<usize>], unfit: &[Option<Dropped>]) -> Option<Vec<bool>> {
    let mut seen = vec![false; calls.len()];
    let mut stack = vec![root];
    while let Some(i) = stack.pop() {
        // A call to one named like a builtin or tool reaches the builtin or the tool, as the
        // agent's own commands do.
        let plain = matches!(unfit[i], Some(Dropped::BuiltinName | Dropped::ToolName));
        if (i != root && plain) || std::mem::replace(&mut seen[i], true) {
            continue;
        }
        if unfit[i].is_some() && i != root {
            return None;
        }
        stack.extend(calls[i].iter().copied());
    }
    Some(seen)
}

/// Whether one line of `alias -p` (bash) or `alias -L` (zsh) may be kept.
fn keep_alias(
    line: &str,
    kind: ShellKind,
    reserved: &std::collections::HashSet<&str>,
    by_name: &HashMap<&str, usize>,
    keep: &[bool],
) -> Result<(), Dropped> {
    let body = line.strip_prefix("alias ").unwrap_or(line);
    if kind == ShellKind::Zsh && (body.starts_with("-g ") || body.starts_with("-s ")) {
        return Err(Dropped::GlobalAlias);
    }
    let body = body.strip_prefix("-- ").unwrap_or(body);
    let Some((name, value)) = body.split_once('=') else { return Err(Dropped::Unreadable) };
    let readable = !name.is_empty()
        && !name.starts_with(['-', '_'])
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "_.:@%+,-".contains(c));
    if !readable {
        return Err(Dropped::Unreadable);
    }
    if reserved.contains(name) {
        return Err(Dropped::BuiltinName);
    }
    if SKIP_NAMES.contains(&name) {
        return Err(Dropped::ToolName);
    }
    // `alias j='z'`: the function it runs must be there.
    let first = value
        .trim_start_matches(['\'', '"', '\\'])
        .split(|c: char| c.is_whitespace() || ";|&'\"".contains(c))
        .next()
        .unwrap_or("");
    match by_name.get(first) {
        Some(&i) if !keep[i] && !reserved.contains(first) && !SKIP_NAMES.contains(&first) => {
            Err(Dropped::NeedsDropped)
        }
        _ => Ok(()),
    }
}

/// Captures a snapshot synchronously (bounded by [`CAPTURE_LIMIT`]); `None` when the rc failed.
// Waits up to CAPTURE_LIMIT for a shell: only ever called under spawn_blocking.
#[allow(clippy::disallowed_methods)]
pub fn capture(
    shell: &Path,
    env: &[(std::ffi::OsString, std::ffi::OsString)],
    dir: &Path,
    owner: &str,
) -> Option<String> {
    let kind = ShellKind::of(shell);
    if kind == ShellKind::Posix {
        return None;
    }
    let raw_path = dir.join(format!("snapshot-raw-{}", nonce()));
    let script = dump_script(kind, &raw_path);
    let group = procs::Group::new(false);
    let mut cmd = std::process::Command::new(shell);
    // zsh as a login shell, as a terminal starts it: `.zprofile` (and `.zlogin`) too.
    if kind == ShellKind::Zsh {
        cmd.arg("-l");
    }
    cmd.arg("-i")
        .arg("-c")
        .arg(&script)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env(procs::OWNER_VAR, owner)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    let join = group.prepare(&mut cmd);
    let mut child = procs::spawn_owned(|| cmd.spawn(), |c| Some(c.id() as i32)).ok()?;
    drop(join);
    let pid = child.id() as i32;
    group.started(pid);
    let deadline = std::time::Instant::now() + CAPTURE_LIMIT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5))
            }
            _ => break None,
        }
    };
    // Whatever the rc left behind (agents, background refreshers) goes with it.
    group.kill_blocking(Duration::ZERO);
    let _ = child.kill();
    let _ = child.wait();
    procs::disown_child(pid);
    let raw = std::fs::read(&raw_path).ok();
    let _ = std::fs::remove_file(&raw_path);
    if status.is_none() {
        tracing::warn!("rc snapshot of {} timed out after {:?}", shell.display(), CAPTURE_LIMIT);
        return None;
    }
    let raw = String::from_utf8_lossy(&raw?).into_owned();
    let (script, report) = filter_dump(&raw, kind);
    Some(format!("{REPORT_PREFIX}{}\n{script}", report.line()))
}

/// Snapshots per shell path, refreshed when an rc file changes.
///
/// Capturing runs the user's whole rc (hundreds of milliseconds with version managers and
/// prompt frameworks), so a capture is also kept on disk under `cache_dir` with the rc files'
/// modification times: the next backend (every `agent-bash exec` is one) reuses it until an rc
/// file changes.
#[derive(Debug, Default)]
pub struct Snapshots {
    cache: Mutex<HashMap<PathBuf, (RcStamp, Option<PathBuf>)>>,
    cache_dir: Option<PathBuf>,
}

impl Snapshots {
    pub fn new(cache_dir: Option<PathBuf>) -> Snapshots {
        Snapshots { cache: Mutex::default(), cache_dir }
    }

    /// The snapshot script for `shell`, capturing (or re-capturing) it when needed. Blocking.
    pub fn get(
        &self,
        shell: &Path,
        env: &[(std::ffi::OsString, std::ffi::OsString)],
        dir: &Path,
        owner: &str,
    ) -> Option<PathBuf> {
        let kind = ShellKind::of(shell);
        let stamp = rc_stamp(kind);
        if let Ok(cache) = self.cache.lock() {
            if let Some((s, path)) = cache.get(shell) {
                if *s == stamp {
                    return path.clone();
                }
            }
        }
        let path = match self.load_disk(shell, &stamp) {
            Some(p) => Some(p),
            None => {
                let script = capture(shell, env, dir, owner);
                script.and_then(|text| self.store(shell, &stamp, dir, &text))
            }
        };
        if let Ok(mut cache) = self.cache.lock() {
            cache.insert(shell.to_path_buf(), (stamp, path.clone()));
        }
        path
    }

    /// What the snapshot of `shell` kept and dropped ([`Report::line`]), once it was taken;
    /// `None` before, or when the rc gave none.
    // Reads the snapshot file: callers use spawn_blocking (`Runtime::shell_report`).
    #[allow(clippy::disallowed_methods)]
    pub fn report(&self, shell: &Path) -> Option<String> {
        let path = self.cache.lock().ok()?.get(shell)?.1.clone()?;
        let text = std::fs::read_to_string(path).ok()?;
        text.lines().find_map(|l| l.strip_prefix(REPORT_PREFIX)).map(str::to_string)
    }

    /// Where the on-disk copy for `shell` lives: one file per shell path and home directory.
    fn disk_path(&self, shell: &Path) -> Option<PathBuf> {
        use std::hash::{Hash, Hasher};
        let dir = self.cache_dir.as_ref()?;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        shell.hash(&mut h);
        dirs::home_dir().hash(&mut h);
        Some(dir.join(format!("{:016x}.sh", h.finish())))
    }

    fn stamp_line(shell: &Path, stamp: &RcStamp) -> String {
        let times: Vec<String> = stamp
            .iter()
            .map(|t| match t.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok()) {
                Some(d) => d.as_nanos().to_string(),
                None => "-".into(),
            })
            .collect();
        format!("# agent-bash snapshot of {} rc {}\n", shell.display(), times.join(","))
    }

    // Part of `Snapshots::get`, which callers run under spawn_blocking.
    #[allow(clippy::disallowed_methods)]
    fn load_disk(&self, shell: &Path, stamp: &RcStamp) -> Option<PathBuf> {
        let path = self.disk_path(shell)?;
        let text = std::fs::read_to_string(&path).ok()?;
        text.starts_with(&Self::stamp_line(shell, stamp)).then_some(path)
    }

    /// Writes the snapshot (to the disk cache when there is one, else the runtime dir).
    // Part of `Snapshots::get`, which callers run under spawn_blocking.
    #[allow(clippy::disallowed_methods)]
    fn store(&self, shell: &Path, stamp: &RcStamp, dir: &Path, text: &str) -> Option<PathBuf> {
        let body = format!("{}{text}", Self::stamp_line(shell, stamp));
        if let Some(path) = self.disk_path(shell) {
            if let Some(parent) = path.parent() {
                let _ = super::rundir::private_dirs(parent);
            }
            // Write then rename, so a concurrent backend never sources half a snapshot.
            let tmp = path.with_extension(format!("tmp{}", nonce()));
            if write_private(&tmp, &body).is_ok() && std::fs::rename(&tmp, &path).is_ok() {
                return Some(path);
            }
            let _ = std::fs::remove_file(&tmp);
        }
        let p = dir.join(format!("snapshot-{}.sh", nonce()));
        write_private(&p, &body).ok().map(|_| p)
    }
}

/// Writes a file readable by the user only (it holds their functions and PATH).
// Part of `Snapshots::get`, which callers run under spawn_blocking.
#[allow(clippy::disallowed_methods)]
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    f.write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_orders_and_drops() {
        let raw = "shopt -s extglob\nshopt -u compat31\nshopt -u histappend\nset -o errexit\nset +o monitor\nset -o pipefail\n\
#B cd\n#B echo\n#B [[\n\
#F _comp\n_comp () \n{ \n  :\n}\n#F greet\ngreet () \n{ \n  echo hi\n}\n#F ls\nls () \n{ \n  command ls -G\n}\n\
#F cd\ncd () \n{ \n  __z \"$@\"\n}\n#F __z\n__z () \n{ \n  _zh; \\builtin cd \"$@\"\n}\n#F _zh\n_zh () \n{ \n  :\n}\n\
#F j\nj () \n{ \n  __z \"$@\"\n}\n#F k\nk () \n{ \n  cd \"$@\"\n}\n#F diff\ndiff () \n{ \n  builtin autoload -XUz\n}\n\
#A\nalias ll='ls -l'\nalias grep='grep --color'\nalias _x='y'\nalias -- -='cd -'\nalias echo='echo x'\nalias dd='diff'\n#P\nexport PATH=/bin\n";
        let (out, report) = filter_dump(raw, ShellKind::Bash);
        assert_eq!(
            out,
            "shopt -s extglob\nshopt -u histappend\nset -o pipefail\ngreet () \n{ \n  echo hi\n}\n\
__z () \n{ \n  _zh; \\builtin cd \"$@\"\n}\n_zh () \n{ \n  :\n}\nj () \n{ \n  __z \"$@\"\n}\n\
k () \n{ \n  cd \"$@\"\n}\nalias ll='ls -l'\nexport PATH=/bin\n"
        );
        assert_eq!(
            report.line(),
            "kept 3 options, 5 functions, 1 alias; dropped 1 alias (named like a builtin or \
             keyword), 1 alias (named like a common tool), 1 alias (needs a dropped function), \
             2 aliases (name the shell cannot re-read), 1 function (named like a builtin or \
             keyword), 1 function (named like a common tool), 1 function (autoload stub), \
             1 option (changes what commands do)"
        );
        assert_eq!((report.options, report.functions, report.aliases), (3, 5, 1));
        let count = |what: &str, why: Dropped| {
            report.dropped.iter().find(|(w, y, _)| *w == what && *y == why).map_or(0, |e| e.2)
        };
        assert_eq!(count("option", Dropped::Option), 1); // errexit (monitor was off)
        assert_eq!(count("function", Dropped::BuiltinName), 1); // cd
        assert_eq!(count("function", Dropped::ToolName), 1); // ls
        assert_eq!(count("function", Dropped::AutoloadStub), 1); // diff
                                                                 // k calls cd, which is then the builtin.
        assert_eq!(count("function", Dropped::NeedsDropped), 0);
        assert_eq!(count("alias", Dropped::ToolName), 1); // grep
        assert_eq!(count("alias", Dropped::Unreadable), 2); // _x, -
        assert_eq!(count("alias", Dropped::BuiltinName), 1); // echo
        assert_eq!(count("alias", Dropped::NeedsDropped), 1); // dd runs the dropped diff
    }

    #[test]
    fn zsh_drops_global_aliases_hooks_and_options_either_way() {
        let raw = "zmodload zsh/main\nzmodload zsh/langinfo\nsetopt noclobber\nsetopt extendedglob\nsetopt nonomatch\nsetopt interactivecomments\n\
#B cd\n#F chpwd\nchpwd () {\n\tls\n}\n#F TRAPEXIT\nTRAPEXIT () {\n\techo bye\n}\n#F take\ntake () {\n\tmkdir -p $1\n}\n\
#A\nalias -g ...=../..\nalias -s txt=cat\nalias md='mkdir -p'\n#P\n";
        let (out, report) = filter_dump(raw, ShellKind::Zsh);
        assert_eq!(
            out,
            "zmodload zsh/langinfo\nsetopt interactivecomments\n\\builtin unalias -m '*'\ntake () {\n\tmkdir -p $1\n}\nalias md='mkdir -p'\n"
        );
        assert_eq!((report.options, report.functions, report.aliases), (1, 1, 1));
    }
}
