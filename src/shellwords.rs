//! A small shell-aware scanner shared by normalization (§1) and interception (§2).
//!
//! It understands enough of POSIX/bash syntax to tell what is at top level: quotes, escapes,
//! `$(…)`, backticks, `${…}`, comments, heredocs, and the operators `;` `&` `&&` `||` `|` `|&`
//! and newlines. It is not a parser: anything it does not understand is treated as a word.
//!
//! Only top-level tokens are returned. Everything nested (quoted text, command and process
//! substitutions, parameter expansions) stays inside the word that contains it, comments are
//! dropped, and heredoc bodies are skipped, so callers can pattern-match on tokens without ever
//! looking inside them.
//!
//! # Caveats
//!
//! Unterminated quotes or substitutions swallow the rest of the input into one word; that is the
//! safe answer for both callers (nothing after an open quote counts as top level). A `case`
//! pattern's `)` inside `$(…)` closes the substitution early; the shell grammar needed to get that
//! right is not worth it for two pattern matchers.

use std::ops::Range;

/// Control operators: each one ends a simple command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `;`
    Semi,
    /// `;;`, `;&`, `;;&` (case-arm terminators)
    CaseEnd,
    /// `&`
    Amp,
    /// `&&`
    AndIf,
    /// `||`
    OrIf,
    /// `|`
    Pipe,
    /// `|&`
    PipeAmp,
    /// An unescaped newline outside any quote.
    Newline,
    /// `(` opening a subshell.
    LParen,
    /// `)` closing a subshell (or a `case` pattern).
    RParen,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// A word, raw as written (quotes and expansions included).
    Word,
    /// A redirection operator including its fd prefix: `>`, `2>`, `2>&`, `&>`, `<<-`, `<<<`, …
    /// Its target is the next token (a [`TokenKind::Word`]).
    Redirect,
    /// A control operator.
    Op(Op),
}

/// One top-level token; `start..end` is its byte range in the scanned source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token {
    pub kind: TokenKind,
    pub start: usize,
    pub end: usize,
}

impl Token {
    /// The token's raw text in `src` (the string it was scanned from).
    pub fn text<'a>(&self, src: &'a str) -> &'a str {
        src.get(self.start..self.end).unwrap_or("")
    }

    pub fn is_op(&self) -> bool {
        matches!(self.kind, TokenKind::Op(_))
    }
}

/// Scans `src` into its top-level tokens.
pub fn tokenize(src: &str) -> Vec<Token> {
    let mut scanner = Scanner::new(src);
    scanner.run();
    scanner.tokens
}

/// Whether `src` ends inside a command or process substitution (`$(`, `<(`, `>(` never closed,
/// at any depth, quoted or not), or nests deeper than the scanner follows. Bash 5.2's parser
/// does not recover from that end of input: after `eval 'echo $(x'` its next parse reads
/// outside its buffers (valgrind shows it), and a session has died of it later (SIGABRT). The
/// shell session runs such a command in a subshell ([`crate::shell::local`]).
pub fn ends_in_substitution(src: &str) -> bool {
    let mut scanner = Scanner::new(src);
    scanner.run();
    scanner.unclosed
}

/// Whether `src` ends inside a heredoc: one opened whose delimiter line never comes (its body
/// runs to the end of the input, so text appended after the command would join the body).
pub fn ends_in_heredoc(src: &str) -> bool {
    let mut scanner = Scanner::new(src);
    scanner.run();
    scanner.open_heredoc || !scanner.pending.is_empty()
}

/// One simple command of a command line: the tokens between two control operators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimpleCommand<'a> {
    src: &'a str,
    /// Byte range of the command in the source, from its first to its last token.
    pub span: Range<usize>,
    /// The command's tokens (words and redirections; spans index the whole source).
    pub tokens: Vec<Token>,
    /// Whether the command is a later stage of a pipeline (its stdin is the previous stage).
    pub piped: bool,
}

impl<'a> SimpleCommand<'a> {
    /// The command's raw text (no leading reserved words, no heredoc bodies).
    pub fn text(&self) -> &'a str {
        self.src.get(self.span.clone()).unwrap_or("")
    }

    /// The argument words (command name first), without redirections and their targets.
    pub fn argv(&self) -> Vec<&'a str> {
        let mut argv = Vec::new();
        let mut after_redirect = false;
        for token in &self.tokens {
            match token.kind {
                TokenKind::Redirect => after_redirect = true,
                TokenKind::Word if after_redirect => after_redirect = false,
                TokenKind::Word => argv.push(token.text(self.src)),
                TokenKind::Op(_) => {}
            }
        }
        argv
    }

    /// The command with what runs it stripped from the front: variable assignments
    /// (`FOO=1 grep …`) and wrappers that run their arguments as the command (`sudo`, `nohup`,
    /// `env`, `time`, `nice -n 5`, `timeout 10`, …), so that rules see the real command name.
    pub fn without_wrappers(&self) -> SimpleCommand<'a> {
        const WRAPPERS: &[&str] = &[
            "sudo", "doas", "nohup", "env", "command", "builtin", "time", "exec", "nice",
            "timeout", "stdbuf", "ionice", "chrt", "taskset",
        ];
        // Options of those wrappers that take the next word as their value.
        const WITH_VALUE: &[&str] = &["-u", "-g", "-n", "-c", "-p", "-s", "-k", "-o", "-e", "-i"];
        let words: Vec<(usize, &Token)> =
            self.tokens.iter().enumerate().filter(|(_, t)| t.kind == TokenKind::Word).collect();
        let mut k = 0;
        let mut wrapper: Option<&str> = None;
        while let Some((_, tok)) = words.get(k) {
            let w = tok.text(self.src);
            let is_assignment = w.split_once('=').is_some_and(|(name, _)| {
                !name.is_empty()
                    && !name.starts_with(|c: char| c.is_ascii_digit())
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            });
            if is_assignment {
                k += 1;
            } else if WRAPPERS.contains(&w) {
                wrapper = Some(w);
                k += 1;
            } else if wrapper.is_some() && w.starts_with('-') {
                k += if WITH_VALUE.contains(&w) { 2 } else { 1 };
            } else if wrapper == Some("timeout") && w.starts_with(|c: char| c.is_ascii_digit()) {
                wrapper = Some("");
                k += 1;
            } else {
                break;
            }
        }
        match words.get(k) {
            Some(&(index, tok)) if k > 0 => SimpleCommand {
                src: self.src,
                span: tok.start..self.span.end,
                tokens: self.tokens[index..].to_vec(),
                piped: self.piped,
            },
            _ => self.clone(),
        }
    }

    /// Each redirection as `(operator, target)`; the target is `""` when it is missing.
    pub fn redirects(&self) -> Vec<(&'a str, &'a str)> {
        let mut out = Vec::new();
        for (n, token) in self.tokens.iter().enumerate() {
            if token.kind == TokenKind::Redirect {
                let target = match self.tokens.get(n + 1) {
                    Some(next) if next.kind == TokenKind::Word => next.text(self.src),
                    _ => "",
                };
                out.push((token.text(self.src), target));
            }
        }
        out
    }
}

/// Words that may open a simple command without being its command name. They are skipped so
/// that `if grep -q x f; then …` and `{ cat f; }` are seen as `grep …` and `cat f`.
const RESERVED_PREFIXES: &[&str] =
    &["!", "{", "}", "if", "then", "elif", "else", "fi", "do", "done", "while", "until", "time"];

/// Splits `src` into its top-level simple commands (at `;`, `&`, `&&`, `||`, `|`, `|&`,
/// newlines and subshell parentheses). Leading reserved words are not part of a command.
pub fn simple_commands(src: &str) -> Vec<SimpleCommand<'_>> {
    let mut out = Vec::new();
    let mut current: Vec<Token> = Vec::new();
    let mut piped = false;
    let mut flush = |current: &mut Vec<Token>, piped: bool| {
        let first = current
            .iter()
            .position(|t| !(t.kind == TokenKind::Word && RESERVED_PREFIXES.contains(&t.text(src))));
        if let Some(first) = first {
            let tokens: Vec<Token> = current.split_off(first);
            if let (Some(a), Some(b)) = (tokens.first(), tokens.last()) {
                out.push(SimpleCommand { src, span: a.start..b.end, tokens, piped });
            }
        }
        current.clear();
    };
    for token in tokenize(src) {
        if let TokenKind::Op(op) = token.kind {
            // A line break before the next command has started (after `|`, `&&`, `;`, or a
            // blank line) continues the same list: `cmd |⏎ grep x` is one pipeline.
            if op == Op::Newline && current.is_empty() {
                continue;
            }
            flush(&mut current, piped);
            piped = matches!(op, Op::Pipe | Op::PipeAmp);
        } else {
            current.push(token);
        }
    }
    flush(&mut current, piped);
    out
}

/// Substitutions and `${…}` nested deeper than this are not scanned further: the rest of the
/// input becomes part of the current word. Keeps adversarial input from exhausting the stack.
const MAX_NEST: usize = 64;

/// A heredoc whose body starts after the next top-level newline.
struct PendingHeredoc {
    delimiter: Vec<u8>,
    /// `<<-`: leading tabs are stripped before comparing with the delimiter.
    strip_tabs: bool,
}

struct Scanner<'a> {
    s: &'a [u8],
    i: usize,
    /// How many substitutions deep we are; tokens are only recorded at 0.
    nest: usize,
    /// How many substitutions and `${…}` deep we are (the recursion depth).
    depth: usize,
    tokens: Vec<Token>,
    /// Set after `<<` / `<<-`: the next word is a heredoc delimiter (`true` for `<<-`).
    heredoc_op: Option<bool>,
    pending: Vec<PendingHeredoc>,
    /// The input ended inside a substitution ([`ends_in_substitution`]).
    unclosed: bool,
    /// A heredoc body ran to the end of the input ([`ends_in_heredoc`]).
    open_heredoc: bool,
}

impl Scanner<'_> {
    fn new(src: &str) -> Scanner<'_> {
        Scanner {
            s: src.as_bytes(),
            i: 0,
            nest: 0,
            depth: 0,
            tokens: Vec::new(),
            heredoc_op: None,
            pending: Vec::new(),
            unclosed: false,
            open_heredoc: false,
        }
    }

    fn peek(&self, offset: usize) -> Option<u8> {
        self.s.get(self.i + offset).copied()
    }

    fn push(&mut self, kind: TokenKind, start: usize) {
        if self.nest == 0 {
            self.tokens.push(Token { kind, start, end: self.i });
        }
    }

    fn op(&mut self, op: Op, len: usize) {
        let start = self.i;
        self.i += len;
        self.heredoc_op = None;
        self.push(TokenKind::Op(op), start);
    }

    /// Scans tokens until the end of input or, inside a substitution, until its closing `)`
    /// (true when that `)` came).
    fn run(&mut self) -> bool {
        let mut parens = 0usize;
        while let Some(c) = self.peek(0) {
            match c {
                b' ' | b'\t' | b'\r' => self.i += 1,
                b'\\' if self.peek(1) == Some(b'\n') => self.i += 2,
                b'\n' => {
                    self.op(Op::Newline, 1);
                    self.skip_heredoc_bodies();
                }
                b'#' => {
                    while self.peek(0).is_some_and(|c| c != b'\n') {
                        self.i += 1;
                    }
                }
                b';' => match (self.peek(1), self.peek(2)) {
                    (Some(b';'), Some(b'&')) => self.op(Op::CaseEnd, 3),
                    (Some(b';' | b'&'), _) => self.op(Op::CaseEnd, 2),
                    _ => self.op(Op::Semi, 1),
                },
                b'&' => match self.peek(1) {
                    Some(b'&') => self.op(Op::AndIf, 2),
                    Some(b'>') => self.redirect(self.i),
                    _ => self.op(Op::Amp, 1),
                },
                b'|' => match self.peek(1) {
                    Some(b'|') => self.op(Op::OrIf, 2),
                    Some(b'&') => self.op(Op::PipeAmp, 2),
                    _ => self.op(Op::Pipe, 1),
                },
                b'(' => {
                    parens += 1;
                    self.op(Op::LParen, 1);
                }
                b')' => {
                    if self.nest > 0 && parens == 0 {
                        self.i += 1;
                        return true;
                    }
                    parens = parens.saturating_sub(1);
                    self.op(Op::RParen, 1);
                }
                b'<' | b'>' if self.peek(1) != Some(b'(') => self.redirect(self.i),
                _ => self.word(),
            }
        }
        false
    }

    /// Scans a redirection operator starting at `self.i`; `start` may be earlier to include an
    /// fd number (`2>`).
    fn redirect(&mut self, start: usize) {
        let rest = &self.s[self.i..];
        // Longest first, so `<<-` is not read as `<<` followed by a word `-`.
        let ops: [&[u8]; 12] =
            [b"&>>", b"&>", b"<<<", b"<<-", b"<<", b"<>", b"<&", b"<", b">>", b">&", b">|", b">"];
        let len = ops.iter().find(|op| rest.starts_with(op)).map_or(1, |op| op.len());
        let op = &rest[..len];
        self.heredoc_op = match op {
            b"<<" => Some(false),
            b"<<-" => Some(true),
            _ => None,
        };
        self.i += len;
        self.push(TokenKind::Redirect, start);
    }

    fn word(&mut self) {
        let start = self.i;
        while let Some(c) = self.peek(0) {
            match c {
                b' ' | b'\t' | b'\r' | b'\n' | b'|' | b'&' | b';' | b'(' | b')' => break,
                b'<' | b'>' if self.peek(1) == Some(b'(') => {
                    self.i += 2;
                    self.substitution();
                }
                b'<' | b'>' => {
                    let so_far = &self.s[start..self.i];
                    if !so_far.is_empty() && so_far.iter().all(u8::is_ascii_digit) {
                        // `2>`: the digits are the redirection's fd, not a word.
                        self.redirect(start);
                        return;
                    }
                    break;
                }
                b'\\' => self.i = (self.i + 2).min(self.s.len()),
                b'\'' => self.single_quoted(),
                b'"' => self.double_quoted(),
                b'`' => self.backticks(),
                b'$' => self.dollar(),
                _ => self.i += 1,
            }
        }
        if self.i == start {
            // Defensive: never loop without progress.
            self.i += 1;
        }
        if let Some(strip_tabs) = self.heredoc_op.take() {
            let delimiter = self.s[start..self.i]
                .iter()
                .copied()
                .filter(|c| !matches!(c, b'\'' | b'"' | b'\\'))
                .collect();
            self.pending.push(PendingHeredoc { delimiter, strip_tabs });
        }
        self.push(TokenKind::Word, start);
    }

    fn single_quoted(&mut self) {
        self.i += 1;
        while let Some(c) = self.peek(0) {
            self.i += 1;
            if c == b'\'' {
                return;
            }
        }
    }

    fn double_quoted(&mut self) {
        self.i += 1;
        while let Some(c) = self.peek(0) {
            match c {
                b'"' => {
                    self.i += 1;
                    return;
                }
                b'\\' => self.i = (self.i + 2).min(self.s.len()),
                b'`' => self.backticks(),
                b'$' => self.dollar(),
                _ => self.i += 1,
            }
        }
    }

    fn backticks(&mut self) {
        self.i += 1;
        while let Some(c) = self.peek(0) {
            match c {
                b'`' => {
                    self.i += 1;
                    return;
                }
                b'\\' => self.i = (self.i + 2).min(self.s.len()),
                _ => self.i += 1,
            }
        }
    }

    /// At a `$`: skips `$(…)`, `$((…))`, `${…}`, `$'…'`, or just the `$`.
    fn dollar(&mut self) {
        match self.peek(1) {
            Some(b'(') => {
                self.i += 2;
                self.substitution();
            }
            Some(b'{') => {
                self.i += 2;
                self.braces();
            }
            Some(b'\'') => {
                // ANSI-C quoting: backslash escapes apply, so `$'it\'s'` is one string.
                self.i += 2;
                while let Some(c) = self.peek(0) {
                    match c {
                        b'\\' => self.i = (self.i + 2).min(self.s.len()),
                        b'\'' => {
                            self.i += 1;
                            return;
                        }
                        _ => self.i += 1,
                    }
                }
            }
            _ => self.i += 1,
        }
    }

    /// After `$(`, `<(` or `>(`: scans nested commands until the matching `)`.
    fn substitution(&mut self) {
        if self.depth >= MAX_NEST {
            self.i = self.s.len();
            self.unclosed = true;
            return;
        }
        self.depth += 1;
        self.nest += 1;
        if !self.run() {
            self.unclosed = true;
        }
        self.nest -= 1;
        self.depth -= 1;
    }

    /// After `${`: skips to the matching `}`.
    fn braces(&mut self) {
        if self.depth >= MAX_NEST {
            self.i = self.s.len();
            return;
        }
        self.depth += 1;
        self.braces_inner();
        self.depth -= 1;
    }

    fn braces_inner(&mut self) {
        let mut depth = 1usize;
        while let Some(c) = self.peek(0) {
            match c {
                b'}' => {
                    self.i += 1;
                    depth -= 1;
                    if depth == 0 {
                        return;
                    }
                }
                b'\\' => self.i = (self.i + 2).min(self.s.len()),
                b'\'' => self.single_quoted(),
                b'"' => self.double_quoted(),
                b'`' => self.backticks(),
                b'$' if self.peek(1) == Some(b'{') => {
                    self.i += 2;
                    depth += 1;
                }
                b'$' => self.dollar(),
                _ => self.i += 1,
            }
        }
    }

    /// Right after a newline: skips the bodies of heredocs opened on the line just ended.
    fn skip_heredoc_bodies(&mut self) {
        for doc in std::mem::take(&mut self.pending) {
            let mut found = false;
            while self.i < self.s.len() {
                let line_end = self.s[self.i..]
                    .iter()
                    .position(|&c| c == b'\n')
                    .map_or(self.s.len(), |n| self.i + n);
                let mut line = &self.s[self.i..line_end];
                if doc.strip_tabs {
                    while let [b'\t', rest @ ..] = line {
                        line = rest;
                    }
                }
                self.i = (line_end + 1).min(self.s.len());
                if line == doc.delimiter.as_slice() {
                    found = true;
                    break;
                }
            }
            self.open_heredoc |= !found;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn texts(src: &str) -> Vec<String> {
        tokenize(src)
            .iter()
            .map(|t| match t.kind {
                TokenKind::Word => t.text(src).to_string(),
                TokenKind::Redirect => format!("R{}", t.text(src)),
                TokenKind::Op(_) => format!("O{}", t.text(src).replace('\n', "\\n")),
            })
            .collect()
    }

    #[test]
    fn shellwords_tokens_table() {
        let cases: &[(&str, &[&str])] = &[
            ("ls -la | head -n 50", &["ls", "-la", "O|", "head", "-n", "50"]),
            ("a||b&&c|&d;e&f", &["a", "O||", "b", "O&&", "c", "O|&", "d", "O;", "e", "O&", "f"]),
            ("echo \"a | head -n 5\"", &["echo", "\"a | head -n 5\""]),
            (
                "echo 'x;y' $(a | b) `c | d` ${e:-|}",
                &["echo", "'x;y'", "$(a | b)", "`c | d`", "${e:-|}"],
            ),
            ("echo $(a $(b) \")\" ) z", &["echo", "$(a $(b) \")\" )", "z"]),
            ("cmd 2>&1 | grep x", &["cmd", "R2>&", "1", "O|", "grep", "x"]),
            ("cmd &>/dev/null >>f 2>e", &["cmd", "R&>", "/dev/null", "R>>", "f", "R2>", "e"]),
            ("a2>f", &["a2", "R>", "f"]),
            ("ls # | head -5", &["ls"]),
            ("echo a#b", &["echo", "a#b"]),
            ("diff <(a | b) >(c)", &["diff", "<(a | b)", ">(c)"]),
            ("(cd x; ls)", &["O(", "cd", "x", "O;", "ls", "O)"]),
            ("case x in a) b;; esac", &["case", "x", "in", "a", "O)", "b", "O;;", "esac"]),
            ("echo a\\ b \\| c", &["echo", "a\\ b", "\\|", "c"]),
            ("ls \\\n | wc", &["ls", "O|", "wc"]),
            ("echo $'it\\'s | x'", &["echo", "$'it\\'s | x'"]),
            ("echo 'open | head", &["echo", "'open | head"]),
        ];
        for (src, want) in cases {
            assert_eq!(
                texts(src),
                want.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                "{src:?}"
            );
        }
    }

    #[test]
    fn shellwords_heredoc_bodies_are_skipped() {
        let src = "cat <<EOF > f\n  a | head -5\nEOF\necho done";
        assert_eq!(texts(src), ["cat", "R<<", "EOF", "R>", "f", "O\\n", "echo", "done"]);
        let src = "cat <<-'END' | wc\n\tx; y\n\tEND\nls";
        assert_eq!(texts(src), ["cat", "R<<-", "'END'", "O|", "wc", "O\\n", "ls"]);
        // A here-string is not a heredoc.
        assert_eq!(texts("wc <<< 'a b'\nls"), ["wc", "R<<<", "'a b'", "O\\n", "ls"]);
        // Unterminated heredoc: the body runs to the end.
        assert_eq!(texts("cat <<EOF\nx | head -5"), ["cat", "R<<", "EOF", "O\\n"]);
    }

    #[test]
    fn shellwords_simple_commands_split_at_top_level_operators() {
        let src = "cd x && grep -r foo . | wc -l; if cat f; then echo \"a;b\" > o; fi\n(ls)";
        let got: Vec<&str> = simple_commands(src).iter().map(SimpleCommand::text).collect();
        assert_eq!(got, ["cd x", "grep -r foo .", "wc -l", "cat f", "echo \"a;b\" > o", "ls"]);
        let piped: Vec<bool> = simple_commands(src).iter().map(|c| c.piped).collect();
        assert_eq!(piped, [false, false, true, false, false, false]);
        let cmds = simple_commands("echo hi 2>&1 >out x");
        assert_eq!(cmds[0].argv(), ["echo", "hi", "x"]);
        assert_eq!(cmds[0].redirects(), [("2>&", "1"), (">", "out")]);
    }

    #[test]
    fn shellwords_ends_in_heredoc_only_when_one_is_left_open() {
        for open in ["cat <<EOF\nno end", "cat <<EOF", "cat <<'E'\nx\nEOF", "a <<A <<B\nA\nb"] {
            assert!(ends_in_heredoc(open), "{open:?}");
        }
        for closed in ["cat <<EOF\nx\nEOF", "cat <<< x", "echo '<<EOF'", "cat <<-E\n\tx\n\tE\necho"]
        {
            assert!(!ends_in_heredoc(closed), "{closed:?}");
        }
    }

    #[test]
    fn shellwords_ends_in_substitution_only_when_one_is_left_open() {
        for open in [
            "echo $(x",
            "echo \"$(x",
            "cat <(x",
            "diff a >(x",
            "x=$(echo $(y)",
            "a\necho $(b",
            "echo $(echo ')'",
            "echo \"${x:-$(y}\"",
        ] {
            assert!(ends_in_substitution(open), "{open:?}");
        }
        for closed in [
            "echo $(x)",
            "echo \"$(x)\"",
            "cat <(ls) >(wc)",
            "echo $((1+2))",
            "echo '$(x'",
            "echo \\$(x",
            "echo ${x",
            "echo `x",
            "echo \"x",
            "if true; then",
            "echo $(echo ')')",
            "# $(x",
        ] {
            assert!(!ends_in_substitution(closed), "{closed:?}");
        }
    }

    #[test]
    fn shellwords_deep_nesting_does_not_overflow() {
        for unit in ["$(", "\"${", "${\"$(", "<(", "`$(", "$((", "\"$(\""] {
            let src = format!("echo {} | head -5", unit.repeat(50_000));
            let tokens = tokenize(&src);
            assert_eq!(tokens.len(), 2, "{unit}");
        }
    }

    proptest::proptest! {
        /// Spans are in order, never overlap, and always fall on character boundaries, so
        /// callers can slice with them.
        #[test]
        fn shellwords_spans_are_sound(src in "(\\PC|[|&;<>()'\"`$\\\\{}#\n ])*") {
            let tokens = tokenize(&src);
            let mut last_end = 0;
            for token in &tokens {
                proptest::prop_assert!(last_end <= token.start && token.start < token.end);
                proptest::prop_assert!(src.get(token.start..token.end).is_some());
                last_end = token.end;
            }
            for command in simple_commands(&src) {
                proptest::prop_assert!(!command.text().is_empty());
            }
        }
    }
}
