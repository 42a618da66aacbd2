//! contract §1: `| head` / `| tail` extraction and head/tail application (pure).

use serde::Serialize;

use crate::shellwords::{self, Op, Token, TokenKind};

/// One rewrite made to the command, reported in result metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rewrite {
    /// The exact text removed from the end of the command, e.g. `| head -n 5` or `2>&1`.
    pub removed: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tail: Option<usize>,
}

/// The command as it will run, plus the line limits to apply to its output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct Normalized {
    pub command: String,
    pub head: Option<usize>,
    pub tail: Option<usize>,
    pub rewrites: Vec<Rewrite>,
    /// Where, in `command`, the pipeline whose `| head`/`| tail` stage was removed starts. Under
    /// bash every stage of a pipeline runs in a subshell, so [`Normalized::runnable`] runs that
    /// pipeline in one too: `x=1 | head -5` leaves the session's `x` alone, `exec ls | head -5`
    /// does not replace the session's shell, and the SIGPIPE of an early close ends the
    /// subshell, never the session.
    #[serde(skip)]
    pub pipeline_start: Option<usize>,
    /// The head limit came from the command (not from the caller) and no tail applies: the
    /// output may be closed early once the head part is complete (contract §1, head-only rule). An
    /// explicit `head` only limits what is shown.
    #[serde(skip)]
    pub close_after_head: bool,
}

impl Normalized {
    /// The text the shell runs: `command`, with the stripped pipeline in a subshell.
    pub fn runnable(&self) -> std::borrow::Cow<'_, str> {
        match self.pipeline_start.filter(|&at| at < self.command.len()) {
            Some(at) => {
                let (before, pipeline) = self.command.split_at(at);
                format!("{before}( {pipeline} )").into()
            }
            None => self.command.as_str().into(),
        }
    }

    /// A `| head`/`| tail` stage was stripped from a pipeline of one other stage (`seq 3 |
    /// tail -n 1`, run as `( seq 3 )`): the shell then records the stage bash would have run
    /// (contract §1, a stripped stage's PIPESTATUS). A pipeline of more stages (or one whose
    /// stage holds a `|` anywhere) keeps what its subshell leaves.
    pub fn lone_stage_stripped(&self) -> bool {
        let Some(at) = self.pipeline_start.filter(|&at| at < self.command.len()) else {
            return false;
        };
        let pipe = |t: &Token| matches!(t.kind, TokenKind::Op(Op::Pipe | Op::PipeAmp));
        self.stage_stripped() && !shellwords::tokenize(&self.command[at..]).iter().any(pipe)
    }

    /// A `| head`/`| tail` stage was stripped (not only a `2>&1`).
    pub fn stage_stripped(&self) -> bool {
        self.rewrites.iter().any(|r| r.head.is_some() || r.tail.is_some())
    }

    /// The stage that was stripped was a `| tail`.
    pub fn tail_stripped(&self) -> bool {
        self.rewrites.iter().any(|r| r.tail.is_some())
    }

    /// A bang command (contract §8.2), or a tool call in a session that traces (§1): run
    /// verbatim, no rewrites, only the caller's own limits.
    pub fn verbatim(command: &str, head: Option<usize>, tail: Option<usize>) -> Normalized {
        Normalized { command: command.trim().to_string(), head, tail, ..Default::default() }
    }
}

/// Normalizes `command`; explicit `head` / `tail` override the extracted value of the same kind.
///
/// Rewrites are made only at the end of the command and only at top level of the shell syntax
/// (see [`shellwords`]), so the result is always a prefix of the trimmed command. At most one
/// `| head` / `| tail` stage is removed, and only when removing it cannot change what the
/// command prints (contract §1, fidelity first: see [`pipeline_start`]). The stripped command's
/// stderr then runs apart from the limit, as bash prints it past the stage; a `2>&1` before the
/// stage stays (`cmd 2>&1 | head -n 5` → `cmd 2>&1`, head 5). A redundant `2>&1` that ends
/// the whole command is removed.
pub fn normalize(command: &str, head: Option<usize>, tail: Option<usize>) -> Normalized {
    normalize_with(Dialect::Bash, command, head, tail, true)
}

/// The shell language a command is written in: what prints nothing by construction differs
/// ([`is_silent`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dialect {
    /// bash, and any POSIX shell.
    #[default]
    Bash,
    /// zsh: `cd OLD NEW` and `cd +N` print the directory, `shopt` is not a command,
    /// `setopt`/`unsetopt` with names print nothing, `=(…)` is a process substitution.
    Zsh,
}

impl Dialect {
    /// The dialect of the shell at `path` (by its file name, as the session picks its protocol).
    pub fn of(path: &std::path::Path) -> Dialect {
        match path.file_name().and_then(|n| n.to_str()) {
            Some("zsh") => Dialect::Zsh,
            _ => Dialect::Bash,
        }
    }
}

/// [`normalize`] (`keep_stage` false) or [`normalize_keeping_stage`] for a command written for
/// `dialect`.
pub fn normalize_in(
    dialect: Dialect,
    command: &str,
    head: Option<usize>,
    tail: Option<usize>,
    keep_stage: bool,
) -> Normalized {
    normalize_with(dialect, command, head, tail, !keep_stage)
}

/// [`normalize`] where the command's stderr cannot be kept apart from a stripped stage's limit
/// (contract §1): no `| head`/`| tail` stage is removed, only a redundant `2>&1`. A PTY run is
/// one stream, and its producer would find a terminal where bash gives it a pipe; a remote
/// shell sends one stream per command (§12).
pub fn normalize_keeping_stage(
    command: &str,
    head: Option<usize>,
    tail: Option<usize>,
) -> Normalized {
    normalize_with(Dialect::Bash, command, head, tail, false)
}

fn normalize_with(
    dialect: Dialect,
    command: &str,
    head: Option<usize>,
    tail: Option<usize>,
    stages: bool,
) -> Normalized {
    let mut current = command.trim();
    let mut rewrites = Vec::new();
    let mut stage_removed = false;
    let mut pipeline_at = None;
    loop {
        let tokens = shellwords::tokenize(current);
        // Cuts end at the previous token rather than trimming, so an escaped trailing space
        // (`echo a\ | head -5`) stays and a line continuation before the cut goes.
        // Only a `2>&1` that ends the whole command is redundant: one before a stripped stage
        // belongs to the producer, whose stderr otherwise goes apart from the stage's limit.
        if let Some((cut, removed)) =
            trailing_stderr_dup(current, &tokens).filter(|_| !stage_removed)
        {
            rewrites.push(Rewrite {
                removed: current[removed..].to_string(),
                head: None,
                tail: None,
            });
            current = &current[..cut];
            continue;
        }
        if !stage_removed {
            if let Some((cut, rewrite, start)) = trailing_head_tail(dialect, current, &tokens) {
                if stages {
                    rewrites.push(rewrite);
                    current = &current[..cut];
                    pipeline_at = Some(start);
                    stage_removed = true;
                    continue;
                }
            }
        }
        break;
    }
    let extracted_head = rewrites.iter().find_map(|r| r.head);
    let extracted_tail = rewrites.iter().find_map(|r| r.tail);
    let tail = tail.or(extracted_tail);
    Normalized {
        command: current.to_string(),
        head: head.or(extracted_head),
        tail,
        rewrites,
        pipeline_start: pipeline_at,
        close_after_head: head.is_none() && extracted_head.is_some() && tail.is_none(),
    }
}

/// Finds a last pipeline stage `| head -n N` (or `-nN`, `-N`; same for `tail`) that ends the
/// command; returns where the remaining command ends and the rewrite to report.
fn trailing_head_tail(
    dialect: Dialect,
    src: &str,
    tokens: &[Token],
) -> Option<(usize, Rewrite, usize)> {
    let pipe = tokens.iter().rposition(Token::is_op)?;
    let stage = &tokens[pipe + 1..];
    // Something must come before the pipe, and nothing (a comment, a heredoc body) after the
    // stage: stripping must never change what the shell would read.
    if pipe == 0 || tokens[pipe].kind != TokenKind::Op(Op::Pipe) || stage.last()?.end != src.len() {
        return None;
    }
    if matches!(tokens[pipe - 1].kind, TokenKind::Op(op) if op != Op::RParen) {
        return None;
    }
    if stage.iter().any(|t| t.kind != TokenKind::Word) {
        return None;
    }
    let words: Vec<&str> = stage.iter().map(|t| t.text(src)).collect();
    let (name, count) = match words.as_slice() {
        [name, "-n", n] => (*name, *n),
        [name, opt] => (*name, opt.strip_prefix("-n").or_else(|| opt.strip_prefix('-'))?),
        _ => return None,
    };
    let count = line_count(count)?;
    let start = tokens[pipeline_start(dialect, src, &tokens[..pipe])?].start;
    let removed = src[tokens[pipe].start..].to_string();
    let cut = tokens[pipe - 1].end;
    match name {
        "head" => Some((cut, Rewrite { removed, head: Some(count), tail: None }, start)),
        "tail" => Some((cut, Rewrite { removed, head: None, tail: Some(count) }, start)),
        _ => None,
    }
}

/// The index of the first token of the pipeline that ends `tokens` (everything before a
/// `| head` stage), when stripping that stage cannot change what the command prints (contract §1,
/// fidelity first): the pipeline is the whole command, or every top-level command before it
/// prints nothing by construction ([`is_silent`]) and is joined to the next by `&&` or `;`.
/// `None` when the stage must stay: `echo a; echo b | head -1` prints `a` and `b`.
///
/// Compound commands (`{ … }`, `( … )`, `if`/`case`/loops) are followed through their reserved
/// words, so their inner `;` is not taken for a top-level one; anything unbalanced keeps the
/// stage.
fn pipeline_start(dialect: Dialect, src: &str, tokens: &[Token]) -> Option<usize> {
    let mut stack: Vec<&str> = Vec::new();
    let mut command_word = true;
    let mut after_redirect = false;
    // Top-level list separators: (token index, operator).
    let mut separators: Vec<(usize, Op)> = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        match t.kind {
            TokenKind::Redirect => after_redirect = true,
            TokenKind::Word if after_redirect => after_redirect = false,
            TokenKind::Word if command_word => {
                command_word = false;
                match t.text(src) {
                    "{" | "if" | "while" | "until" => {
                        stack.push(if t.text(src) == "{" { "{" } else { "compound" });
                        command_word = true;
                    }
                    "for" | "select" => stack.push("compound"),
                    "case" => stack.push("case"),
                    "then" | "else" | "elif" | "do" | "!" | "time" => command_word = true,
                    "}" => (stack.pop()? == "{").then_some(())?,
                    "fi" | "done" => (stack.pop()? == "compound").then_some(())?,
                    "esac" => (stack.pop()? == "case").then_some(())?,
                    _ => {}
                }
            }
            TokenKind::Word => {}
            TokenKind::Op(op) => {
                command_word = true;
                match op {
                    Op::LParen => stack.push("("),
                    Op::RParen => match stack.last() {
                        Some(&"(") => {
                            stack.pop();
                        }
                        // A `case` pattern's closing parenthesis.
                        Some(&"case") => {}
                        _ => return None,
                    },
                    Op::Pipe | Op::PipeAmp => {}
                    _ if stack.is_empty() => separators.push((i, op)),
                    _ => {}
                }
            }
        }
    }
    if !stack.is_empty() {
        return None;
    }
    let start = separators.last().map_or(0, |&(last, _)| last + 1);
    // Every command before the pipeline, each with the operator that follows it.
    let mut from = 0;
    for &(at, op) in &separators {
        let joined = match op {
            Op::AndIf => true,
            Op::Semi | Op::Newline => false,
            _ => return None,
        };
        is_silent(dialect, src, &tokens[from..at], joined).then_some(())?;
        from = at + 1;
    }
    // The pipeline must not start with `!` or `time`, which act on the whole pipeline.
    let first = tokens.get(start)?;
    (!matches!(first.text(src), "!" | "time")).then_some(start)
}

/// Whether a top-level command prints nothing by construction (contract §1): `cd DIR`, `export`,
/// `unset`, plain assignments, `set`/`shopt` options, `:`/`true`. No redirections, no command
/// or process substitutions (they could print). `cd` only before `&&`: when it fails it prints
/// an error and, after `;`, the next command would still run, so a limit would cut around it.
fn is_silent(dialect: Dialect, src: &str, tokens: &[Token], before_and: bool) -> bool {
    if tokens.is_empty() || tokens.iter().any(|t| t.kind != TokenKind::Word) {
        return false;
    }
    let words: Vec<&str> = tokens.iter().map(|t| t.text(src)).collect();
    if words
        .iter()
        .any(|w| w.contains("$(") || w.contains('`') || w.contains("<(") || w.contains(">("))
        || (dialect == Dialect::Zsh && words.iter().any(|w| w.contains("=(")))
    {
        return false;
    }
    let is_assignment = |w: &str| {
        w.split_once('=').is_some_and(|(name, _)| {
            !name.is_empty()
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !name.as_bytes()[0].is_ascii_digit()
        })
    };
    let argv: Vec<&str> = words.iter().copied().skip_while(|w| is_assignment(w)).collect();
    let Some((&name, args)) = argv.split_first() else {
        return true; // plain assignments
    };
    if argv.len() != words.len() {
        // `X=1 cmd`: an assignment in front of a command is that command's environment.
        return false;
    }
    if dialect == Dialect::Zsh {
        match name {
            // One directory: `cd OLD NEW` substitutes and prints, `cd +1`/`-1`/`-` print.
            "cd" => {
                let dirs: Vec<&str> = args
                    .iter()
                    .copied()
                    .skip_while(|a| matches!(*a, "-q" | "-s" | "-L" | "-P"))
                    .collect();
                let dirs = dirs.strip_prefix(&["--"][..]).unwrap_or(&dirs);
                return before_and
                    && dirs.len() == 1
                    && !dirs[0].starts_with(['-', '+'])
                    && !args.contains(&"-");
            }
            "shopt" => return false,
            // Option names only, none that traces what runs (`xtrace`, `verbose`).
            "setopt" | "unsetopt" => {
                let traces = |a: &str| {
                    let n = a.to_ascii_lowercase().replace('_', "");
                    n.contains("xtrace") || n.contains("verbose")
                };
                return !args.is_empty()
                    && args.iter().all(|a| !a.starts_with(['-', '+']) && !traces(a));
            }
            _ => {}
        }
    }
    match name {
        ":" | "true" => true,
        "cd" => before_and && !args.contains(&"-"),
        "export" => !args.is_empty() && !args.contains(&"-p"),
        "unset" => !args.is_empty(),
        "set" => silent_set(args),
        "shopt" => {
            args.iter().any(|a| matches!(*a, "-s" | "-u"))
                && args.iter().any(|a| !a.starts_with('-'))
                && !args.contains(&"-p")
        }
        _ => false,
    }
}

/// `set` with options only, none of which prints (`-x`, `-v` trace what runs; a lone `-o`
/// lists the options).
fn silent_set(args: &[&str]) -> bool {
    if args.is_empty() {
        return false;
    }
    let mut expect_name = false;
    for a in args {
        if expect_name {
            if matches!(*a, "xtrace" | "verbose") {
                return false;
            }
            expect_name = false;
        } else if *a == "-o" || *a == "+o" {
            expect_name = true;
        } else if let Some(flags) = a.strip_prefix('-').or_else(|| a.strip_prefix('+')) {
            if flags.is_empty() || flags.starts_with('-') || flags.contains(['x', 'v']) {
                return false;
            }
            // `-euo pipefail`: a trailing `o` takes the next word as an option name.
            expect_name = flags.ends_with('o');
        } else {
            return false;
        }
    }
    !expect_name
}

/// A positive decimal line count. `0` is refused: `head -0` means "no lines", which as a limit
/// would hide everything, and the reference's "0 = no limit" would change what the command does.
fn line_count(text: &str) -> Option<usize> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok().filter(|&n| n > 0)
}

/// Finds a trailing top-level `2>&1` that changes nothing, because stdout and stderr of the
/// command already go to the same pipe; returns where the remaining command ends and where the
/// removed text starts.
///
/// It is kept when the same simple command redirects stdout earlier (`cmd > f 2>&1` sends
/// stderr into `f`), when it is all there is to the command, and after `exec` (where it would
/// change the shell session for good).
fn trailing_stderr_dup(src: &str, tokens: &[Token]) -> Option<(usize, usize)> {
    let [.., dup, one] = tokens else { return None };
    if dup.kind != TokenKind::Redirect
        || dup.text(src) != "2>&"
        || one.kind != TokenKind::Word
        || one.text(src) != "1"
        || one.end != src.len()
    {
        return None;
    }
    let command_start = tokens.iter().rposition(Token::is_op).map_or(0, |n| n + 1);
    let before = &tokens[command_start..tokens.len() - 2];
    // The command name: the first word that is not a redirection target. Without one (a line
    // of bare redirections) the line is left as the user wrote it.
    let mut after_redirect = false;
    let name = before.iter().find_map(|t| match t.kind {
        TokenKind::Redirect => {
            after_redirect = true;
            None
        }
        TokenKind::Word if after_redirect => {
            after_redirect = false;
            None
        }
        _ => Some(t.text(src)),
    })?;
    if name == "exec" {
        return None;
    }
    if before.iter().any(|t| t.kind == TokenKind::Redirect && redirects_stdout(t.text(src))) {
        return None;
    }
    Some((before.last()?.end, dup.start))
}

/// Whether a redirection operator (with its fd prefix) points stdout somewhere else.
fn redirects_stdout(op: &str) -> bool {
    let fd = op.trim_end_matches(|c: char| !c.is_ascii_digit());
    let op = &op[fd.len()..];
    if op.starts_with("&>") {
        return true;
    }
    op.starts_with('>') && (fd.is_empty() || fd == "1")
}

/// Applies head first, then tail, to `text` (lines as a person sees them). A limit is a no-op
/// when the text is not longer. `tail = N` on text ending in a newline gives N real lines.
///
/// A line is its content plus its `\n` (the last one may lack it), so `"a\n"` is one line, `"a\nb"`
/// two and `""` none. Kept lines keep their newlines: the result is byte for byte what
/// `printf '%s' "$text" | head -n H | tail -n T` prints.
pub fn apply_head_tail(text: &str, head: Option<usize>, tail: Option<usize>) -> String {
    let mut kept = text;
    if let Some(head) = head {
        kept = match head.checked_sub(1) {
            None => "",
            // Cut after the head-th newline; fewer newlines means the text is not longer.
            Some(nth) => kept.match_indices('\n').nth(nth).map_or(kept, |(n, _)| &kept[..=n]),
        };
    }
    if let Some(tail) = tail {
        // A final newline ends the last line; it does not start another one.
        let body = kept.strip_suffix('\n').unwrap_or(kept);
        kept = match tail.checked_sub(1) {
            None => "",
            Some(nth) => body.rmatch_indices('\n').nth(nth).map_or(kept, |(n, _)| &kept[n + 1..]),
        };
    }
    kept.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;

    /// (input, explicit head, explicit tail) → (command, head, tail, removed texts)
    type Case = (
        &'static str,
        Option<usize>,
        Option<usize>,
        &'static str,
        Option<usize>,
        Option<usize>,
        &'static [&'static str],
    );

    const CASES: &[Case] = &[
        // Extraction (contract §1 and the acceptance table).
        ("ls -la | head -n 50", None, None, "ls -la", Some(50), None, &["| head -n 50"]),
        ("ls -la | head -20", None, None, "ls -la", Some(20), None, &["| head -20"]),
        ("ls | head -n7", None, None, "ls", Some(7), None, &["| head -n7"]),
        ("dmesg | tail -n 100", None, None, "dmesg", None, Some(100), &["| tail -n 100"]),
        ("dmesg | tail -50", None, None, "dmesg", None, Some(50), &["| tail -50"]),
        ("dmesg | tail -n3", None, None, "dmesg", None, Some(3), &["| tail -n3"]),
        ("git log   |   head -n 10", None, None, "git log", Some(10), None, &["|   head -n 10"]),
        ("ls|head -5", None, None, "ls", Some(5), None, &["|head -5"]),
        ("ls \\\n  | head -5", None, None, "ls", Some(5), None, &["| head -5"]),
        ("echo a\\  | head -5", None, None, "echo a\\ ", Some(5), None, &["| head -5"]),
        ("make \\\n 2>&1", None, None, "make", None, None, &["2>&1"]),
        ("  ls -la | head -n 50  \n", None, None, "ls -la", Some(50), None, &["| head -n 50"]),
        ("a | head -5 | tail -2", None, None, "a | head -5", None, Some(2), &["| tail -2"]),
        ("(cd x && ls) | tail -3", None, None, "(cd x && ls)", None, Some(3), &["| tail -3"]),
        ("{ a; b; } | head -4", None, None, "{ a; b; }", Some(4), None, &["| head -4"]),
        // Explicit limits override only their own kind.
        ("ls | head -n 50", Some(5), None, "ls", Some(5), None, &["| head -n 50"]),
        ("ls | head -n 50", None, Some(7), "ls", Some(50), Some(7), &["| head -n 50"]),
        ("ls | tail -n 50", None, Some(7), "ls", None, Some(7), &["| tail -n 50"]),
        ("git status", Some(3), Some(4), "git status", Some(3), Some(4), &[]),
        // Left alone.
        (
            "cat file | head -n 10 | grep foo",
            None,
            None,
            "cat file | head -n 10 | grep foo",
            None,
            None,
            &[],
        ),
        ("cat file | head", None, None, "cat file | head", None, None, &[]),
        ("x | head -c 100", None, None, "x | head -c 100", None, None, &[]),
        ("x | head -c100", None, None, "x | head -c100", None, None, &[]),
        ("x | head --lines=5", None, None, "x | head --lines=5", None, None, &[]),
        ("x | tail -n +5", None, None, "x | tail -n +5", None, None, &[]),
        ("x | head -n 5 file", None, None, "x | head -n 5 file", None, None, &[]),
        ("x | head -0", None, None, "x | head -0", None, None, &[]),
        ("x | tail -n 0", None, None, "x | tail -n 0", None, None, &[]),
        ("x |& tail -n 5", None, None, "x |& tail -n 5", None, None, &[]),
        ("x || tail -n 5", None, None, "x || tail -n 5", None, None, &[]),
        ("x && tail -n 5", None, None, "x && tail -n 5", None, None, &[]),
        ("x; head -n 5", None, None, "x; head -n 5", None, None, &[]),
        ("| head -n 5", None, None, "| head -n 5", None, None, &[]),
        ("head -n 5 f", None, None, "head -n 5 f", None, None, &[]),
        ("x | head -n 5 &", None, None, "x | head -n 5 &", None, None, &[]),
        ("x | head -n 5 # first five", None, None, "x | head -n 5 # first five", None, None, &[]),
        ("x | \"head\" -5", None, None, "x | \"head\" -5", None, None, &[]),
        (
            "x | head -n 99999999999999999999999",
            None,
            None,
            "x | head -n 99999999999999999999999",
            None,
            None,
            &[],
        ),
        ("git status", None, None, "git status", None, None, &[]),
        ("echo \"a | head -n 5\"", None, None, "echo \"a | head -n 5\"", None, None, &[]),
        ("echo 'a | tail -3'", None, None, "echo 'a | tail -3'", None, None, &[]),
        ("echo \"a\t|  head -n 5\"", None, None, "echo \"a\t|  head -n 5\"", None, None, &[]),
        ("echo $(ls | head -n 5)", None, None, "echo $(ls | head -n 5)", None, None, &[]),
        ("echo `ls | head -n 5`", None, None, "echo `ls | head -n 5`", None, None, &[]),
        ("echo ${x:-| head -5}", None, None, "echo ${x:-| head -5}", None, None, &[]),
        ("ls # | head -5", None, None, "ls # | head -5", None, None, &[]),
        (
            "cat <<EOF\n  a | head -5\nEOF",
            None,
            None,
            "cat <<EOF\n  a | head -5\nEOF",
            None,
            None,
            &[],
        ),
        (
            "cat <<EOF | head -5\n\tindented\n    body\nEOF",
            None,
            None,
            "cat <<EOF | head -5\n\tindented\n    body\nEOF",
            None,
            None,
            &[],
        ),
        ("printf 'a\\tb'  \t  | wc", None, None, "printf 'a\\tb'  \t  | wc", None, None, &[]),
        // Fidelity first: stripped only when nothing before the pipeline prints (contract §1).
        ("echo a; echo b | head -1", None, None, "echo a; echo b | head -1", None, None, &[]),
        ("echo a; seq 1 5 | tail -2", None, None, "echo a; seq 1 5 | tail -2", None, None, &[]),
        ("echo a\nseq 9 | tail -2", None, None, "echo a\nseq 9 | tail -2", None, None, &[]),
        (
            "cd src && cargo test | tail -20",
            None,
            None,
            "cd src && cargo test",
            None,
            Some(20),
            &["| tail -20"],
        ),
        (
            "cd src; cargo test | tail -20",
            None,
            None,
            "cd src; cargo test | tail -20",
            None,
            None,
            &[],
        ),
        ("cd - && x | head -1", None, None, "cd - && x | head -1", None, None, &[]),
        (
            "export A=1; make | tail -5",
            None,
            None,
            "export A=1; make",
            None,
            Some(5),
            &["| tail -5"],
        ),
        ("export -p; make | tail -5", None, None, "export -p; make | tail -5", None, None, &[]),
        (
            "set -o pipefail; make | head -3",
            None,
            None,
            "set -o pipefail; make",
            Some(3),
            None,
            &["| head -3"],
        ),
        (
            "set -euo pipefail\nmake | head -3",
            None,
            None,
            "set -euo pipefail\nmake",
            Some(3),
            None,
            &["| head -3"],
        ),
        ("set -x; make | head -3", None, None, "set -x; make | head -3", None, None, &[]),
        ("set -o; make | head -3", None, None, "set -o; make | head -3", None, None, &[]),
        ("set; make | head -3", None, None, "set; make | head -3", None, None, &[]),
        (
            "shopt -s globstar; ls | head -3",
            None,
            None,
            "shopt -s globstar; ls",
            Some(3),
            None,
            &["| head -3"],
        ),
        ("shopt -s; ls | head -3", None, None, "shopt -s; ls | head -3", None, None, &[]),
        (
            "x=1 && y=2; make | tail -3",
            None,
            None,
            "x=1 && y=2; make",
            None,
            Some(3),
            &["| tail -3"],
        ),
        (
            ": && true; unset A; make | tail -3",
            None,
            None,
            ": && true; unset A; make",
            None,
            Some(3),
            &["| tail -3"],
        ),
        ("X=1 make | tail -2", None, None, "X=1 make", None, Some(2), &["| tail -2"]),
        ("X=1 echo a; make | tail -2", None, None, "X=1 echo a; make | tail -2", None, None, &[]),
        (
            "export F=$(date) && x | head -2",
            None,
            None,
            "export F=$(date) && x | head -2",
            None,
            None,
            &[],
        ),
        (
            "cd x 2>/dev/null && y | head -2",
            None,
            None,
            "cd x 2>/dev/null && y | head -2",
            None,
            None,
            &[],
        ),
        ("a || b | tail -3", None, None, "a || b | tail -3", None, None, &[]),
        ("a & b | tail -3", None, None, "a & b | tail -3", None, None, &[]),
        (
            "if x; then y; fi | head -3",
            None,
            None,
            "if x; then y; fi",
            Some(3),
            None,
            &["| head -3"],
        ),
        (
            "for i in 1 2; do echo $i; done | head -1",
            None,
            None,
            "for i in 1 2; do echo $i; done",
            Some(1),
            None,
            &["| head -1"],
        ),
        (
            "while read l; do echo $l; done < f | tail -1",
            None,
            None,
            "while read l; do echo $l; done < f",
            None,
            Some(1),
            &["| tail -1"],
        ),
        (
            "case x in a) y;; *) z;; esac | head -2",
            None,
            None,
            "case x in a) y;; *) z;; esac",
            Some(2),
            None,
            &["| head -2"],
        ),
        ("f() { echo; }; f | head -2", None, None, "f() { echo; }; f | head -2", None, None, &[]),
        ("cd x && (a; b) | tail -2", None, None, "cd x && (a; b)", None, Some(2), &["| tail -2"]),
        ("! x | head -2", None, None, "! x | head -2", None, None, &[]),
        ("time x | head -2", None, None, "time x | head -2", None, None, &[]),
        ("{ a; b; } && c | head -2", None, None, "{ a; b; } && c | head -2", None, None, &[]),
        ("if x; then y | head -2", None, None, "if x; then y | head -2", None, None, &[]),
        // `2>&1`.
        ("make 2>&1", None, None, "make", None, None, &["2>&1"]),
        // Before a stripped stage it is the producer's own: its stderr goes to the limit too.
        ("make 2>&1 | head -n 5", None, None, "make 2>&1", Some(5), None, &["| head -n 5"]),
        (
            "make 2>&1 | tail -n 5 2>&1",
            None,
            None,
            "make 2>&1",
            None,
            Some(5),
            &["2>&1", "| tail -n 5"],
        ),
        ("a && make 2>&1", None, None, "a && make", None, None, &["2>&1"]),
        ("make 2>&1 | grep error", None, None, "make 2>&1 | grep error", None, None, &[]),
        ("make > log 2>&1", None, None, "make > log 2>&1", None, None, &[]),
        ("make &>log 2>&1", None, None, "make &>log 2>&1", None, None, &[]),
        ("make 1>log 2>&1", None, None, "make 1>log 2>&1", None, None, &[]),
        ("make 2>/dev/null 2>&1", None, None, "make 2>/dev/null", None, None, &["2>&1"]),
        ("exec 2>&1", None, None, "exec 2>&1", None, None, &[]),
        ("2>&1", None, None, "2>&1", None, None, &[]),
        ("make 2>&1 # all", None, None, "make 2>&1 # all", None, None, &[]),
        ("echo '2>&1'", None, None, "echo '2>&1'", None, None, &[]),
        ("make 2> &1", None, None, "make 2> &1", None, None, &[]),
    ];

    #[test]
    fn normalize_table() {
        for &(input, head, tail, command, want_head, want_tail, removed) in CASES {
            let got = normalize(input, head, tail);
            let got_removed: Vec<&str> = got.rewrites.iter().map(|r| r.removed.as_str()).collect();
            assert_eq!(
                (got.command.as_str(), got.head, got.tail, got_removed),
                (command, want_head, want_tail, removed.to_vec()),
                "input {input:?}"
            );
        }
    }

    /// zsh's `cd OLD NEW`, `cd +1` print the directory and `shopt` is "command not found":
    /// a trailing stage after them stays; `setopt NAME` prints nothing.
    #[test]
    fn normalize_knows_what_zsh_prints() {
        let zsh = |c: &str| normalize_in(Dialect::Zsh, c, None, None, false);
        for kept in [
            "cd a b && x | head -1",
            "cd +1 && x | head -1",
            "cd -1 && x | head -1",
            "shopt -s extglob; x | head -1",
            "setopt xtrace; x | head -1",
            "cat =(ls) && x | head -1",
        ] {
            assert_eq!(zsh(kept).command, kept, "{kept:?}");
        }
        for (stripped, command) in [
            ("cd src && cargo test | tail -20", "cd src && cargo test"),
            ("cd -q -- src && x | head -2", "cd -q -- src && x"),
            ("setopt pipefail; seq 5 | head -n 2", "setopt pipefail; seq 5"),
            ("seq 1 10 | head -n 2", "seq 1 10"),
        ] {
            assert_eq!(zsh(stripped).command, command, "{stripped:?}");
        }
        // The same commands under bash: `shopt` is silent there.
        assert_eq!(
            normalize("shopt -s extglob; x | head -1", None, None).command,
            "shopt -s extglob; x"
        );
    }

    #[test]
    fn normalize_knows_a_lone_stripped_stage() {
        let lone = |c: &str| normalize(c, None, None).lone_stage_stripped();
        assert!(lone("seq 3 | tail -n 1"));
        assert!(lone("cd / && yes | head -5"));
        assert!(!lone("a | b | tail -2"));
        assert!(!lone("{ a | b; } | head -1"));
        assert!(!lone("ls 2>&1"));
        assert!(!lone("ls"));
    }

    #[test]
    fn normalize_runs_the_stripped_pipeline_in_a_subshell() {
        let cases: &[(&str, &str)] = &[
            ("cd src && cargo test | tail -20", "cd src && ( cargo test )"),
            ("yes | head -n 5", "( yes )"),
            ("x=1 | head -5", "( x=1 )"),
            ("a | b | tail -2", "( a | b )"),
            ("make 2>&1 | head -n 5", "( make 2>&1 )"),
            ("make 2>&1", "make"),
            ("ls", "ls"),
        ];
        for &(input, want) in cases {
            assert_eq!(normalize(input, None, None).runnable(), want, "{input:?}");
        }
    }

    #[test]
    fn only_an_extracted_head_may_close_the_output() {
        assert!(normalize("yes | head -n 5", None, None).close_after_head);
        // A caller's head only limits what is shown; a tail needs the whole stream.
        assert!(!normalize("yes", Some(5), None).close_after_head);
        assert!(!normalize("yes | head -n 5", Some(3), None).close_after_head);
        assert!(!normalize("yes | head -n 5", None, Some(2)).close_after_head);
        assert!(!normalize("a | head -5 | tail -2", None, None).close_after_head);
    }

    #[test]
    fn a_pty_or_remote_run_keeps_its_stage() {
        let got = normalize_keeping_stage("yes | head -n 5", None, None);
        assert_eq!(
            (got.command.as_str(), got.head, got.rewrites.len()),
            ("yes | head -n 5", None, 0)
        );
        assert!(!got.close_after_head);
        let got = normalize_keeping_stage("make 2>&1 | tail -3 2>&1", None, None);
        assert_eq!((got.command.as_str(), got.tail), ("make 2>&1 | tail -3", None));
        let got = normalize_keeping_stage("seq 9 | head -5", None, Some(2));
        assert_eq!((got.command.as_str(), got.head, got.tail), ("seq 9 | head -5", None, Some(2)));
    }

    #[test]
    fn normalize_reports_counts_per_rewrite() {
        let got = normalize("make 2>&1 | head -n 5", None, Some(9));
        assert_eq!(
            got.rewrites,
            vec![Rewrite { removed: "| head -n 5".into(), head: Some(5), tail: None }]
        );
        assert_eq!(
            serde_json::to_value(&got.rewrites[0]).ok(),
            Some(serde_json::json!({"removed": "| head -n 5", "head": 5}))
        );
    }

    const TEXT: &str = "line1\nline2\nline3\nline4\nline5";

    #[test]
    fn apply_head_tail_table() {
        let cases: &[(&str, Option<usize>, Option<usize>, &str)] = &[
            (TEXT, Some(2), None, "line1\nline2\n"),
            (TEXT, None, Some(2), "line4\nline5"),
            (TEXT, Some(4), Some(2), "line3\nline4\n"),
            // No-ops.
            (TEXT, Some(5), None, TEXT),
            (TEXT, Some(10), None, TEXT),
            (TEXT, None, Some(5), TEXT),
            (TEXT, None, Some(10), TEXT),
            (TEXT, None, None, TEXT),
            (TEXT, Some(5), Some(5), TEXT),
            (TEXT, Some(50), Some(50), TEXT),
            // Lines as a person sees them.
            ("a\nb\nc\n", None, Some(2), "b\nc\n"),
            ("a\nb\nc\n", None, Some(3), "a\nb\nc\n"),
            ("a\nb\nc\n", Some(2), None, "a\nb\n"),
            ("a\nb\nc\n", Some(3), None, "a\nb\nc\n"),
            ("a\n", None, Some(1), "a\n"),
            ("a\n", Some(1), None, "a\n"),
            ("a\nb", None, Some(1), "b"),
            ("", Some(1), Some(1), ""),
            ("\n\n\n", None, Some(2), "\n\n"),
            ("a\nb\nc\n", Some(0), None, ""),
            ("a\nb\nc\n", None, Some(0), ""),
        ];
        for &(text, head, tail, want) in cases {
            assert_eq!(
                apply_head_tail(text, head, tail),
                want,
                "{text:?} head {head:?} tail {tail:?}"
            );
        }
    }

    /// Shell-flavoured strings, so the scanner's corners get exercised, not just random bytes.
    fn shellish() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("|"),
            Just("||"),
            Just("|&"),
            Just("&"),
            Just(";"),
            Just("\n"),
            Just(" "),
            Just("\t"),
            Just("head"),
            Just("tail"),
            Just("-n"),
            Just("5"),
            Just("-3"),
            Just("2>&1"),
            Just(">"),
            Just("'"),
            Just("\""),
            Just("`"),
            Just("$("),
            Just(")"),
            Just("("),
            Just("${"),
            Just("}"),
            Just("\\"),
            Just("#"),
            Just("<<"),
            Just("<<-"),
            Just("EOF"),
            Just("cat"),
            Just("é"),
        ];
        proptest::collection::vec(piece, 0..24).prop_map(|v| v.concat())
    }

    proptest! {
        #[test]
        fn normalize_only_cuts_the_end(input in prop_oneof![shellish(), any::<String>()]) {
            let got = normalize(&input, None, None);
            let trimmed = input.trim();
            prop_assert!(trimmed.starts_with(&got.command));
            prop_assert_eq!(got.rewrites.is_empty(), got.command == trimmed);
            prop_assert!(got.rewrites.iter().filter(|r| r.removed != "2>&1").count() <= 1);
        }

        #[test]
        fn normalize_is_stable_when_nothing_was_removed(input in shellish()) {
            let once = normalize(&input, None, None);
            if once.rewrites.is_empty() {
                prop_assert_eq!(normalize(&once.command, None, None), once);
            }
        }

        #[test]
        fn apply_head_tail_keeps_whole_lines(
            lines in proptest::collection::vec("[a-z]{0,3}", 0..12),
            newline_at_end in any::<bool>(),
            head in proptest::option::of(0usize..14),
            tail in proptest::option::of(0usize..14),
        ) {
            let mut text = lines.join("\n");
            if newline_at_end && !lines.is_empty() {
                text.push('\n');
            }
            let got = apply_head_tail(&text, head, tail);
            let count = |t: &str| t.split_inclusive('\n').count();
            let want = count(&text).min(head.unwrap_or(usize::MAX)).min(tail.unwrap_or(usize::MAX));
            prop_assert_eq!(count(&got), want);
            prop_assert!(text.contains(&got));
        }
    }
}
