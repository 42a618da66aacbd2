//! SPEC §7 (Ours, rescued lines): the diagnostics of the part of the output that leaves the
//! tail window, kept with their line numbers so the model reads the first error even when a
//! build kept going for thousands of lines after it.
//!
//! [`Rescue`] sits beside the sink's window and sees every chunk of sanitized text once. It is
//! streaming and bounded:
//!
//! - a multi-pattern search ([`aho_corasick`], SIMD) over each chunk finds the few lines that
//!   hold a trigger word (`rror`, `FAIL`, `panic`, `Traceback`, …); only those lines are
//!   classified, so plain output costs one scan and no per-line work;
//! - a classifier ([`classify`]) decides with strict, tool-shaped rules (a line *starting* with
//!   `error:` or `error[E…]`, `file:line:col: error`, `FAILED`, `npm ERR!`, `make: ***`, …);
//!   every rule needs a trigger word, so the result does not depend on chunking, and a line
//!   that merely has "error" inside a word (`error_handling.rs`, `-Werror`, `0 errors`) is not
//!   a diagnostic: false positives cost the model more than misses;
//! - a few rules need the next lines (a Python traceback's last frame and exception line, the
//!   ` --> file:line` after a rustc error): while one is open, lines are read one by one;
//! - the first [`MAX_LINES`] candidates are kept, and after them the most recent ones in a
//!   ring: memory is constant whatever the output size. Which of them the window cut off is
//!   known at the end, from the first shown line.
//!
//! The sink runs it on the artifact writer's thread ([`crate::artifacts::ArtifactWriter`]): it
//! sees the same stream as the artifact, from the first overflow on (before it, nothing has
//! left the window), and its cost stays off the output path.
//!
//! At the end, [`Rescue::finish`] picks from the first and the most recent candidates (alternating,
//! so both ends are shown) within [`MAX_LINES`] lines and [`MAX_BYTES`] bytes, drops lines the
//! shown text already holds, and returns them in output order.
//!
//! Line numbers are those of the full output, which are those of the artifact as long as it was
//! not capped (SPEC §4.2: past its cap an artifact keeps its first part and its last 4 MiB):
//! lines past the part a capped artifact keeps verbatim are not rescued, since no exact line
//! number could point at them.

use std::collections::{HashSet, VecDeque};
use std::sync::OnceLock;

use aho_corasick::{AhoCorasick, Input, MatchKind};
use serde::Serialize;

/// At most this many rescued lines (SPEC §7).
pub const MAX_LINES: usize = 20;
/// At most this many bytes of rescued text, counting the `<line no>: ` prefixes (SPEC §7).
pub const MAX_BYTES: usize = 4096;
/// Bytes of one line kept for the model; a longer line ends with `…`.
const LINE_TEXT_MAX: usize = 300;
/// Bytes of a line that the classifier looks at (diagnostics say what they are early).
const SCAN_MAX: usize = 1024;
/// The most recent candidates kept. Which of them the window cut off is known only at the end,
/// so the ring is larger than what is shown: with this many diagnostics inside the window
/// itself, the model has plenty to read there.
const RECENT_MAX: usize = 256;
/// A traceback longer than this many lines is not followed to its end.
const TRACEBACK_MAX_LINES: u32 = 2000;

/// Words that every rule needs. A line holding none of them is never a diagnostic, so only
/// lines holding one are classified. `\nE  ` is pytest's failure line (`E   assert 1 == 2`),
/// which has no other mark. Every rule that wants a lower-case `error` / `Error` wants it ending
/// a word (`error:`, `error[E…]`, `ValueError:`, `  3:5  error  …`, `f.c:1: error` at the end),
/// so `rror` is a trigger only before a colon, a bracket, a blank or the end of the line: test
/// logs full of `error_handling` / `errors.rs` cost no classification. `ERR` covers `ERROR`.
/// A line longer than [`SCAN_MAX`] is looked at without the word its cut ends in
/// ([`scan_text`]), so no rule mistakes the cut for the end of a word.
const TRIGGERS: &[&str] = &[
    "rror:",
    "rror ",
    "rror[",
    "rror\t",
    "rror\n",
    "FAIL",
    "Failed",
    "panic",
    "Traceback",
    "ERR",
    "fatal",
    "Exception",
    "\nE  ",
    ".go:",
    "\u{25cf} ",
    "***",
    "unbound variable",
    "command not found",
    "No such file or directory",
    "Permission denied",
    "Assertion",
];

/// One line of the output kept for the model: its number in the artifact and its text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rescued {
    pub line: u64,
    pub text: String,
}

/// What a line is to the classifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    None,
    Diagnostic,
    /// pytest's `E   …` line: only the first of a group is kept.
    PytestE,
    /// A rustc/cargo error header: the ` --> file:line:col` line after it is kept too.
    RustError,
    /// `Traceback (most recent call last):` opens a traceback.
    Traceback,
}

/// An open traceback: its last `File "…", line N` frame so far.
#[derive(Debug, Default)]
struct Traceback {
    last_frame: Option<Rescued>,
    lines: u32,
}

/// The streaming classifier of one command's output. See the module docs.
#[derive(Debug)]
pub struct Rescue {
    /// Number (1-based) of the line being assembled.
    line: u64,
    /// Bytes of the stream seen before the current chunk.
    offset: u64,
    /// Lines starting past this byte offset are not rescued (see the module docs).
    exact_until: u64,
    /// Byte offset of the current line's start.
    line_start: u64,
    /// The start (up to [`SCAN_MAX`] bytes) of the current, unfinished line.
    carry: Vec<u8>,
    /// The current line is longer than what `carry` keeps of it.
    carry_cut: bool,
    traceback: Option<Traceback>,
    /// The previous line was a rustc error header.
    want_location: bool,
    /// Number of the last pytest `E` line seen, to keep only the first of a group.
    last_pytest_e: u64,
    /// The first candidates of the stream.
    first: Vec<Rescued>,
    /// The most recent candidates after `first` was full.
    recent: VecDeque<Rescued>,
}

impl Rescue {
    /// A classifier for a stream whose artifact keeps its first `exact_until` bytes verbatim.
    pub fn new(exact_until: u64) -> Self {
        Self {
            line: 1,
            offset: 0,
            exact_until,
            line_start: 0,
            carry: Vec::new(),
            carry_cut: false,
            traceback: None,
            want_location: false,
            last_pytest_e: 0,
            first: Vec::new(),
            recent: VecDeque::new(),
        }
    }

    /// Takes the next chunk of the stream (sanitized text, possibly cut inside a character).
    pub fn push(&mut self, bytes: &[u8]) {
        self.push_counted(bytes, None);
    }

    /// [`push`](Self::push) for a caller that already counted the chunk's newlines (the sink
    /// does, for its counters): the rescue then counts only up to the lines it keeps, and plain
    /// output costs it one multi-pattern scan and nothing else.
    pub fn push_counted(&mut self, bytes: &[u8], newlines: Option<u64>) {
        let chunk_start = self.offset;
        self.offset += bytes.len() as u64;
        if chunk_start > self.exact_until {
            // Nothing from here on can get an exact line number; the count no longer matters.
            return;
        }
        let Some(n0) = memchr::memchr(b'\n', bytes) else {
            self.extend_carry(bytes);
            return;
        };
        // The line that was carried over (or starts this chunk) ends here.
        self.extend_carry(&bytes[..n0]);
        let mut carried = std::mem::take(&mut self.carry);
        self.classify_line(self.line, scan_text(&carried, self.carry_cut), self.line_start);
        self.carry_cut = false;
        // The buffer is reused for the next carried line.
        carried.clear();
        self.carry = carried;

        let last_nl = memchr::memrchr(b'\n', bytes).unwrap_or(n0);
        let finder = finder();
        // Line numbers are counted lazily: `counted_line` is the number of the line starting at
        // `counted`, and moves forward only when a line needs its number.
        let (mut counted, mut counted_line) = (n0 + 1, self.line + 1);
        let mut pos = n0 + 1;
        while pos <= last_nl {
            let stateful = self.stateful();
            let ls = if stateful {
                pos
            } else {
                // The search starts at the newline before `pos`, so `\nE  ` can match there.
                let input = Input::new(bytes).range(pos - 1..last_nl + 1);
                let Some(m) = finder.find(input) else { break };
                // The last byte of a match is never a newline: it lies in the line to classify.
                let anchor = m.end() - 1;
                memchr::memrchr(b'\n', &bytes[pos..anchor]).map_or(pos, |p| pos + p + 1)
            };
            let le = memchr::memchr(b'\n', &bytes[ls..]).map_or(last_nl, |p| ls + p);
            let text = scan_text(&bytes[ls..le.min(ls + SCAN_MAX)], le - ls > SCAN_MAX);
            pos = le + 1;
            if !stateful && classify(text) == Class::None {
                // A trigger word inside an ordinary line: nothing to number.
                continue;
            }
            counted_line += memchr::memchr_iter(b'\n', &bytes[counted..ls]).count() as u64;
            counted = ls;
            self.classify_line(counted_line, text, chunk_start + ls as u64);
        }
        self.line = match newlines {
            Some(n) => self.line + n,
            None => {
                counted_line + memchr::memchr_iter(b'\n', &bytes[counted..=last_nl]).count() as u64
            }
        };
        self.line_start = chunk_start + last_nl as u64 + 1;
        self.extend_carry(&bytes[last_nl + 1..]);
    }

    /// The rescued lines of a run whose shown text starts at line `shown_start` and is `shown`.
    pub fn finish(self, shown_start: u64, shown: &str) -> Vec<Rescued> {
        let elided = |c: &Rescued| c.line < shown_start;
        if !self.first.iter().any(elided) {
            return Vec::new();
        }
        let in_tail: HashSet<&str> = shown.lines().map(str::trim).collect();
        let keep = |c: &Rescued| elided(c) && !in_tail.contains(c.text.trim());
        let first: Vec<Rescued> = self.first.into_iter().filter(keep).collect();
        let recent: Vec<Rescued> = self.recent.into_iter().filter(keep).collect();
        // Alternate: first[0], recent[last], first[1], recent[last - 1], … within the budget.
        let mut picked: Vec<Rescued> = Vec::new();
        let mut bytes = 0;
        let (mut f, mut r) = (first.into_iter(), recent.into_iter().rev());
        let mut f_done = false;
        let mut r_done = false;
        let mut from_first = true;
        while picked.len() < MAX_LINES && !(f_done && r_done) {
            let next = if from_first { f.next() } else { r.next() };
            match next {
                Some(c) => {
                    let cost = rendered_len(&c);
                    if bytes + cost > MAX_BYTES {
                        // This side is out of budget; the other may still have short lines.
                        if from_first {
                            f_done = true
                        } else {
                            r_done = true
                        }
                    } else {
                        bytes += cost;
                        picked.push(c);
                    }
                }
                None if from_first => f_done = true,
                None => r_done = true,
            }
            from_first = if f_done {
                false
            } else if r_done {
                true
            } else {
                !from_first
            };
        }
        picked.sort_by_key(|c| c.line);
        picked
    }

    fn extend_carry(&mut self, bytes: &[u8]) {
        let room = SCAN_MAX.saturating_sub(self.carry.len());
        self.carry_cut |= bytes.len() > room;
        self.carry.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    /// Whether lines must be read one by one (a rule waits for the next lines).
    fn stateful(&self) -> bool {
        self.traceback.is_some() || self.want_location
    }

    /// One whole line (its first [`SCAN_MAX`] bytes) numbered `line`, starting at byte `at`.
    fn classify_line(&mut self, line: u64, text: &str, at: u64) {
        if at > self.exact_until {
            self.traceback = None;
            self.want_location = false;
            return;
        }
        if std::mem::take(&mut self.want_location) && text.trim_start().starts_with("--> ") {
            self.candidate(line, text);
            return;
        }
        if let Some(tb) = &mut self.traceback {
            tb.lines += 1;
            let indented = text.starts_with([' ', '\t']);
            if indented || text.is_empty() {
                if text.trim_start().starts_with("File \"") {
                    tb.last_frame = Some(Rescued { line, text: clip(text) });
                }
                if tb.lines > TRACEBACK_MAX_LINES {
                    self.traceback = None;
                }
                return;
            }
            // The first line back at the margin names the exception.
            let frame = self.traceback.take().and_then(|tb| tb.last_frame);
            if let Some(frame) = frame {
                self.candidate(frame.line, &frame.text);
            }
            if classify(text) != Class::Traceback {
                self.candidate(line, text);
                return;
            }
        }
        match classify(text) {
            Class::None => {}
            Class::Diagnostic => self.candidate(line, text),
            Class::PytestE => {
                if self.last_pytest_e + 1 != line {
                    self.candidate(line, text);
                }
                self.last_pytest_e = line;
            }
            Class::RustError => {
                self.candidate(line, text);
                self.want_location = true;
            }
            Class::Traceback => self.traceback = Some(Traceback::default()),
        }
    }

    fn candidate(&mut self, line: u64, text: &str) {
        let c = Rescued { line, text: clip(text) };
        if self.first.len() < MAX_LINES {
            self.first.push(c);
            return;
        }
        if self.recent.len() == RECENT_MAX {
            self.recent.pop_front();
        }
        self.recent.push_back(c);
    }
}

/// The rescue block of the model text (SPEC §7), or `None` when nothing was rescued.
pub fn block(rescued: &[Rescued], artifact_id: Option<u64>) -> Option<String> {
    if rescued.is_empty() {
        return None;
    }
    let mut out = match artifact_id {
        Some(id) => format!("[Earlier in the output (artifact://{id} lines):]\n"),
        None => "[Earlier in the output:]\n".to_owned(),
    };
    for r in rescued {
        out.push_str(&format!("{}: {}\n", r.line, r.text));
    }
    out.push_str("[\u{2026}]");
    Some(out)
}

fn rendered_len(c: &Rescued) -> usize {
    // `<line no>: <text>\n`
    c.line.to_string().len() + 2 + c.text.len() + 1
}

fn finder() -> &'static AhoCorasick {
    static FINDER: OnceLock<AhoCorasick> = OnceLock::new();
    FINDER.get_or_init(|| {
        match AhoCorasick::builder().match_kind(MatchKind::LeftmostFirst).build(TRIGGERS) {
            Ok(ac) => ac,
            // The patterns are constants; building them cannot fail. An automaton that matches
            // nothing keeps the sink working if it ever did.
            Err(_) => AhoCorasick::new::<_, &str>([]).unwrap_or_else(|_| unreachable!()),
        }
    })
}

/// The text kept for a line: trailing blanks dropped, at most [`LINE_TEXT_MAX`] bytes.
fn clip(text: &str) -> String {
    let text = text.trim_end();
    if text.len() <= LINE_TEXT_MAX {
        return text.to_owned();
    }
    let mut s = text[..floor_boundary(text, LINE_TEXT_MAX)].to_owned();
    s.push('\u{2026}');
    s
}

/// The text of a line the classifier looks at: the line's first [`SCAN_MAX`] bytes `bytes`, and
/// whether the line goes on after them (then the word cut at the end is dropped: `error_case`
/// cut after `error` must not read as the word `error`).
fn scan_text(bytes: &[u8], cut: bool) -> &str {
    let text = floor_str(bytes);
    if cut {
        text.trim_end_matches(|c: char| c.is_alphanumeric() || c == '_')
    } else {
        text
    }
}

/// The longest valid UTF-8 prefix of `bytes` (a carried line may be cut inside a character).
fn floor_str(bytes: &[u8]) -> &str {
    match std::str::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default(),
    }
}

fn floor_boundary(text: &str, mut i: usize) -> usize {
    if i >= text.len() {
        return text.len();
    }
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Classifies one line. Every rule that says yes needs one of [`TRIGGERS`] in the line.
fn classify(line: &str) -> Class {
    if line.starts_with("E  ") && !line[1..].trim().is_empty() {
        return Class::PytestE;
    }
    if line.starts_with("Traceback (most recent call last):") {
        return Class::Traceback;
    }
    let t = line.trim_start();
    // rustc / cargo and any tool that starts its diagnostics with `error:` / `error[E…]:`.
    if let Some(rest) = t.strip_prefix("error") {
        if rest.starts_with('[') && find(rest, "]:").is_some() {
            return Class::RustError;
        }
        if rest.starts_with(':') {
            return Class::RustError;
        }
    }
    if is_diagnostic(line, t) {
        Class::Diagnostic
    } else {
        Class::None
    }
}

fn is_diagnostic(line: &str, t: &str) -> bool {
    starts_with_any(t, &["ERROR:", "ERROR ", "[ERROR]", "Error:", "fatal:", "fatal error:"])
        || starts_with_word(t, "FAILED")
        || starts_with_word(t, "FAIL")
        || t.starts_with("--- FAIL:")
        || ends_with_failed(t)
        || (t.starts_with("thread '") && find(t, "' panicked at").is_some())
        || t.starts_with("panic: ")
        || starts_with_any(t, &["npm ERR!", "npm error ", "ERR_PNPM_"])
        || t.starts_with("\u{25cf} ")
        || is_make_error(line)
        || (t.ends_with("failed.") && find(t, "Assertion `").is_some())
        || is_error_name_line(t)
        || is_located(line)
        || is_program_error(line)
        || is_eslint_error(line)
}

fn starts_with_any(t: &str, prefixes: &[&str]) -> bool {
    prefixes.iter().any(|p| t.starts_with(p))
}

/// `word` at the start, then the end, a blank or a colon (`FAIL src/a.test.js`, `FAIL\tpkg`,
/// `FAILED (failures=1)`, `FAIL: test_x (m.T.test_x)`), not `FAILURES`.
fn starts_with_word(t: &str, word: &str) -> bool {
    match t.strip_prefix(word) {
        Some(rest) => rest.is_empty() || rest.starts_with([' ', '\t', ':']),
        None => false,
    }
}

/// `test foo ... FAILED` (cargo, unittest -v), `tests/a.py::test_b FAILED   [ 50%]` (pytest -v).
fn ends_with_failed(t: &str) -> bool {
    let mut u = t.trim_end();
    if u.ends_with("%]") {
        match u.rfind('[') {
            Some(p) => u = u[..p].trim_end(),
            None => return false,
        }
    }
    // unittest -v: `test_b (m.T.test_b) ... FAIL` / `... ERROR`
    u.ends_with(" FAILED") || u.ends_with(" ... FAIL") || u.ends_with(" ... ERROR")
}

/// Where `needle` first occurs in `hay`: candidates for its first byte found with `memchr`, then
/// compared. Lines are short (at most [`SCAN_MAX`] bytes) and the needles rare, so this costs
/// less than any searcher with a set-up step (`str::find`, `memmem::find` build one per call).
fn find(hay: &str, needle: &str) -> Option<usize> {
    let (hay, needle) = (hay.as_bytes(), needle.as_bytes());
    let first = *needle.first()?;
    memchr::memchr_iter(first, hay).find(|&p| hay[p..].starts_with(needle))
}

/// `make: *** [Makefile:3: all] Error 1`, `make[2]: *** …`, `Makefile:3: *** missing separator.`
fn is_make_error(line: &str) -> bool {
    let Some(p) = find(line, ": *** ") else { return false };
    let head = &line[..p];
    let make = head.strip_prefix("make").or_else(|| head.strip_prefix("gmake"));
    if let Some(rest) = make {
        return rest.is_empty()
            || (rest.starts_with('[')
                && rest.ends_with(']')
                && is_digits(&rest[1..rest.len() - 1]));
    }
    // `file:line: *** …`
    match head.rsplit_once(':') {
        Some((file, no)) => !file.is_empty() && !file.contains(' ') && is_digits(no),
        None => false,
    }
}

/// An exception or error name at the margin, then a colon: `AssertionError: expected 1 to be 2`,
/// `TypeError: x is not a function`, `ValueError: bad`, `java.lang.IllegalStateException: x`.
fn is_error_name_line(t: &str) -> bool {
    let Some((name, _)) = t.split_once(':') else { return false };
    let ident = name.rsplit('.').next().unwrap_or(name);
    !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
        && ident.bytes().next().is_some_and(|b| b.is_ascii_uppercase())
        && (ident.ends_with("Error") || ident.ends_with("Exception"))
}

/// `path:line[:col]: …` with an error after it (gcc, clang, go vet, tsc, pytest locations), or any
/// `*.go:line` location (go build errors carry no "error" word); `path(line,col): error TS…`
/// (tsc). The path has no blanks.
fn is_located(line: &str) -> bool {
    let t = line.trim_start();
    if let Some(p) = find(t, "): error ") {
        // The file is the word before the parenthesis (pnpm and others put a prefix before it).
        let head = &t[..p];
        let head = head.rsplit(' ').next().unwrap_or(head);
        if let Some((file, pos)) = head.split_once('(') {
            let mut nums = pos.split(',');
            return !file.is_empty()
                && !file.contains(' ')
                && nums.next().is_some_and(is_digits)
                && nums.next().is_some_and(is_digits);
        }
    }
    let Some((file, rest)) = t.split_once(':') else { return false };
    if file.is_empty() || file.contains(' ') {
        return false;
    }
    let (no, mut rest) = match rest.split_once(|c: char| !c.is_ascii_digit()) {
        Some((no, _)) => (no, &rest[no.len()..]),
        None => return false,
    };
    if !is_digits(no) {
        return false;
    }
    if let Some(r) = rest.strip_prefix(':') {
        let col_len = r.bytes().take_while(u8::is_ascii_digit).count();
        rest = if col_len > 0 { &r[col_len..] } else { rest };
    }
    let msg = if let Some(m) = rest.strip_prefix(": ") {
        m
    } else if let Some(m) = rest.strip_prefix(" - ") {
        m
    } else {
        return false;
    };
    if file.ends_with(".go") {
        return true;
    }
    let msg = msg.strip_prefix("fatal ").unwrap_or(msg);
    if let Some(after) = msg.strip_prefix("error") {
        return after.is_empty() || after.starts_with([':', ' ', '[']);
    }
    // pytest: `tests/test_a.py:12: AssertionError`, `…: Failed`
    file.ends_with(".py")
        && msg.split_whitespace().next().is_some_and(|w| {
            let w = w.trim_end_matches(':');
            w == "Failed" || w.ends_with("Error") || w.ends_with("Exception")
        })
}

/// `prog: error: …`, `./build.sh: line 5: foo: command not found`, `cat: x: No such file or
/// directory`: a program name at the margin, then a colon.
fn is_program_error(line: &str) -> bool {
    let Some(p) = find(line, ": ") else { return false };
    let (prog, rest) = (&line[..p], &line[p + 2..]);
    if prog.is_empty() || prog.contains([' ', '\t']) {
        return false;
    }
    let rest_t = rest.strip_prefix("fatal ").unwrap_or(rest);
    if rest_t.starts_with("error:") {
        return true;
    }
    rest.ends_with(": command not found")
        || rest.ends_with(": No such file or directory")
        || rest.ends_with(": Permission denied")
        || rest.ends_with(": unbound variable")
}

/// eslint's stylish format: `  3:5  error  'x' is not defined  no-undef`.
fn is_eslint_error(line: &str) -> bool {
    if !line.starts_with(' ') {
        return false;
    }
    let mut words = line.split_whitespace();
    let pos = words.next().unwrap_or_default();
    let Some((l, c)) = pos.split_once(':') else { return false };
    is_digits(l) && is_digits(c) && words.next() == Some("error")
}

fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;

    #[test]
    fn classify_table() {
        let yes = [
            "error[E0308]: mismatched types",
            "error: could not compile `x` (bin \"x\") due to 1 previous error",
            "src/main.c:3:5: error: 'y' undeclared (first use in this function)",
            "main.c:1:10: fatal error: nope.h: No such file or directory",
            "./main.go:5:2: undefined: fmt.Prinln",
            "    main_test.go:12: got 1, want 2",
            "--- FAIL: TestAdd (0.00s)",
            "FAIL\texample.com/m\t0.002s",
            "FAIL",
            "src/a.ts(3,5): error TS2322: Type 'string' is not assignable to type 'number'.",
            "src/a.ts:3:5 - error TS2322: Type 'string' is not assignable to type 'number'.",
            "  3:5  error  'x' is not defined  no-undef",
            "Traceback (most recent call last):",
            "E       assert 1 == 2",
            "tests/test_a.py:12: AssertionError",
            "FAILED tests/test_a.py::test_b - assert 1 == 2",
            "tests/test_a.py::test_b FAILED                                  [ 50%]",
            "test tests::it_fails ... FAILED",
            "test_b (test_m.T.test_b) ... FAIL",
            "test_c (test_m.T.test_c) ... ERROR",
            "FAIL src/sum.test.js",
            " FAIL  src/sum.test.ts > sum > adds",
            "  \u{25cf} sum \u{203a} adds 1 + 2",
            "AssertionError: expected 3 to be 4 // Object.is equality",
            "npm ERR! code ELIFECYCLE",
            "npm error code 1",
            "\u{2009}ERR_PNPM_RECURSIVE_RUN_FIRST_FAIL\u{2009} x@1.0.0 build: `false`",
            "make: *** [Makefile:3: all] Error 1",
            "make[2]: *** [sub.mk:7: target] Error 2",
            "Makefile:3: *** missing separator.  Stop.",
            "thread 'main' panicked at src/main.rs:2:5:",
            "panic: runtime error: index out of range [3] with length 3",
            "a.out: t.c:4: main: Assertion `x == 2' failed.",
            "./build.sh: line 5: frobnicate: command not found",
            "./build.sh: line 7: NAME: unbound variable",
            "cat: missing.txt: No such file or directory",
            "ld: error: undefined symbol: foo",
            "fatal: not a git repository (or any of the parent directories): .git",
            "ERROR: Could not find a version that satisfies the requirement nope",
            "FAIL: test_b (test_m.T.test_b)",
            "ERROR: test_c (test_m.T.test_c)",
            "FAILED (failures=1, errors=1)",
        ];
        for line in yes {
            assert_ne!(classify(line), Class::None, "{line:?}");
            assert!(has_trigger(line), "{line:?} has no trigger word");
        }
        let no = [
            "   Compiling error-chain v0.12.4",
            "test tests::error_handling ... ok",
            "warning: unused variable: `error`",
            "cc -Werror -o main main.c",
            "0 errors, 2 warnings",
            "INFO retrying after error: timeout",
            "the quick brown fox",
            "FAILURES",
            "=== FAILURES ===",
            "src/error.rs:10:5: note: defined here",
            "    let error = 3;",
            "Error handling is described in chapter 3",
            "errors.go compiled",
            "stderr is redirected",
            "Ran 300 tests in 0.1s",
            "E",
            "",
            "  --> src/main.rs:2:18",
            "tests/test_a.py::test_ok PASSED",
            "PASS src/ok.test.js",
            "fatality rate: 0",
        ];
        for line in no {
            assert_eq!(classify(line), Class::None, "{line:?}");
        }
    }

    /// A line longer than what the classifier looks at, cut right after `error` or `error:`:
    /// the same lines are rescued whether the line lies inside a chunk or across two.
    #[test]
    fn rescue_long_lines_do_not_depend_on_chunking() {
        for (tail, rescued) in [("error_case x\n", false), ("error: boom\n", false)] {
            let long = format!("{}{tail}", "x ".repeat((SCAN_MAX - 5) / 2) + " ");
            assert!(long.len() > SCAN_MAX);
            let text = format!("ok\n{long}f.c:1:2: error: e\nok\n");
            let whole = run(&[&text], 100, "");
            for cut in 1..text.len() {
                let chunked = run(&[&text[..cut], &text[cut..]], 100, "");
                assert_eq!(whole, chunked, "cut at {cut}");
            }
            assert_eq!(whole.len(), 1 + usize::from(rescued), "{whole:?}");
        }
    }

    /// Memory does not grow with the output: after a million lines, a fifth of them diagnostics
    /// and some lines far longer than what is looked at, the rescue holds its first lines, its
    /// ring of recent ones and one carried line start, as after ten thousand.
    #[test]
    fn rescue_memory_is_bounded_whatever_the_output_size() {
        let held = |r: &Rescue| {
            let texts: usize = r.first.iter().chain(&r.recent).map(|c| c.text.capacity()).sum();
            (r.first.len(), r.recent.len(), r.carry.capacity(), texts)
        };
        let long = "y".repeat(5 * SCAN_MAX);
        let chunk: String = (0..1000)
            .map(|i| match i % 5 {
                0 => format!("src/m{i}.c:{i}:5: error: 'x' undeclared\n"),
                1 => format!("{long}\n"),
                _ => format!("test tests::case_{i} ... ok\n"),
            })
            .collect();
        let mut r = Rescue::new(u64::MAX);
        r.push(chunk.as_bytes());
        for _ in 0..9 {
            r.push_counted(chunk.as_bytes(), Some(1000));
        }
        let after_ten = held(&r);
        for _ in 0..990 {
            r.push_counted(chunk.as_bytes(), Some(1000));
        }
        let after_all = held(&r);
        assert_eq!((after_all.0, after_all.1), (MAX_LINES, RECENT_MAX));
        assert_eq!(
            (after_ten.0, after_ten.1, after_ten.2),
            (after_all.0, after_all.1, after_all.2)
        );
        assert!(after_all.2 <= 2 * SCAN_MAX, "carry {}", after_all.2);
        // Kept texts are clipped lines: bounded by the counts above.
        assert!(after_all.3 <= (MAX_LINES + RECENT_MAX) * (LINE_TEXT_MAX + 4), "{after_all:?}");
        let rescued = r.finish(u64::MAX, "");
        assert_eq!(rescued.len(), MAX_LINES);
        assert_eq!(rescued.last().unwrap().line, 999 * 1000 + 996);
    }

    fn has_trigger(line: &str) -> bool {
        let with_nl = format!("\n{line}\n");
        finder().is_match(with_nl.as_str())
    }

    /// Feeds `text` in chunks, the window starting at `first_shown(line count so far)`.
    fn run(chunks: &[&str], shown_start: u64, shown: &str) -> Vec<Rescued> {
        let mut r = Rescue::new(u64::MAX);
        for c in chunks {
            r.push(c.as_bytes());
        }
        r.finish(shown_start, shown)
    }

    fn noise(n: usize) -> String {
        (0..n).map(|i| format!("   Compiling crate{i} v0.1.0 (error-free)\n")).collect()
    }

    #[test]
    fn rescue_keeps_the_first_error_with_its_location() {
        let text = format!(
            "{}error[E0308]: mismatched types\n --> src/main.rs:2:18\n  |\n{}",
            noise(10),
            noise(5000)
        );
        let got = run(&[&text], 4000, "");
        assert_eq!(
            got,
            vec![
                Rescued { line: 11, text: "error[E0308]: mismatched types".into() },
                Rescued { line: 12, text: " --> src/main.rs:2:18".into() },
            ]
        );
        // Inside the window: nothing.
        assert_eq!(run(&[&text], 5, ""), vec![]);
        // Already in the shown text: nothing.
        assert_eq!(
            run(&[&text], 4000, "error[E0308]: mismatched types\n --> src/main.rs:2:18"),
            vec![]
        );
    }

    #[test]
    fn rescue_follows_a_traceback_to_its_last_frame() {
        let text = "start\nTraceback (most recent call last):\n  File \"a.py\", line 3, in <module>\n    main()\n  File \"a.py\", line 2, in main\n    raise ValueError('bad')\nValueError: bad\nafter\n";
        let got = run(&[text], 100, "");
        assert_eq!(
            got,
            vec![
                Rescued { line: 5, text: "  File \"a.py\", line 2, in main".into() },
                Rescued { line: 7, text: "ValueError: bad".into() },
            ]
        );
    }

    #[test]
    fn rescue_keeps_first_and_most_recent_within_budget() {
        let mut text = String::new();
        for i in 1..=100 {
            text.push_str(&format!("f{i}.c:1:1: error: e{i}\nok line\n"));
        }
        let got = run(&[&text], 1000, "");
        assert_eq!(got.len(), MAX_LINES);
        let lines: Vec<u64> = got.iter().map(|r| r.line).collect();
        let want: Vec<u64> =
            (0..10).map(|i| 2 * i + 1).chain((90..100).map(|i| 2 * i + 1)).collect();
        assert_eq!(lines, want);
        let bytes: usize = got.iter().map(rendered_len).sum();
        assert!(bytes <= MAX_BYTES);

        // Long lines: the byte budget binds first.
        let long = "x".repeat(1000);
        let text: String = (1..=50).map(|i| format!("error: {i} {long}\n")).collect();
        let got = run(&[&text], 1000, "");
        assert!(got.iter().map(rendered_len).sum::<usize>() <= MAX_BYTES);
        assert!(got.len() >= 2 && got.len() < MAX_LINES, "{}", got.len());
        assert!(got.iter().all(|r| r.text.ends_with('\u{2026}')));
    }

    #[test]
    fn rescue_stops_where_a_capped_artifact_stops_being_exact() {
        let text = format!("error: early\n{}error: late\n", noise(100));
        let mut r = Rescue::new(20);
        r.push(text.as_bytes());
        let got = r.finish(1000, "");
        assert_eq!(got, vec![Rescued { line: 1, text: "error: early".into() }]);
    }

    #[test]
    fn rescue_block_wording() {
        let rescued = vec![Rescued { line: 3, text: "error: x".into() }];
        assert_eq!(
            block(&rescued, Some(7)).unwrap(),
            "[Earlier in the output (artifact://7 lines):]\n3: error: x\n[\u{2026}]"
        );
        assert_eq!(block(&[], Some(7)), None);
    }

    fn piece() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            Just("ok line\n"),
            Just("error: boom\n"),
            Just("E       assert 1 == 2\n"),
            Just("E       where 1 = f()\n"),
            Just("Traceback (most recent call last):\n"),
            Just("  File \"a.py\", line 1, in <module>\n"),
            Just("ValueError: v\n"),
            Just("error[E0425]: x\n"),
            Just(" --> src/a.rs:1:1\n"),
            Just("f.c:1:2: error: e\n"),
            Just("noerror here\n"),
            Just("\u{e9}rror\n"),
            Just("FAIL"),
            Just("ED x\n"),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        #[test]
        fn rescue_does_not_depend_on_chunking(
            pieces in prop::collection::vec(piece(), 0..80),
            cuts in prop::collection::vec(any::<usize>(), 0..12),
            shown_start in 0u64..100,
        ) {
            let text = pieces.concat();
            let mut cuts: Vec<usize> = cuts.iter().map(|c| {
                let mut c = c % (text.len() + 1);
                while !text.is_char_boundary(c) { c += 1; }
                c
            }).collect();
            cuts.sort_unstable();
            let mut chunks = Vec::new();
            let mut from = 0;
            for cut in cuts.into_iter().chain([text.len()]) {
                chunks.push(&text[from..cut]);
                from = cut;
            }
            let whole = run(&[&text], shown_start, "");
            let chunked = run(&chunks, shown_start, "");
            prop_assert_eq!(&whole, &chunked);
            // Newline counts given by the caller (as the sink does) change nothing.
            let mut counted = Rescue::new(u64::MAX);
            for chunk in &chunks {
                let n = chunk.bytes().filter(|&b| b == b'\n').count() as u64;
                counted.push_counted(chunk.as_bytes(), Some(n));
            }
            prop_assert_eq!(&counted.finish(shown_start, ""), &whole);
            // Line-by-line classification of the whole text is the oracle.
            let mut oracle = Rescue::new(u64::MAX);
            for (i, line) in text.split_inclusive('\n').enumerate() {
                if line.ends_with('\n') {
                    oracle.classify_line(i as u64 + 1, line.trim_end_matches('\n'), 0);
                }
            }
            prop_assert_eq!(oracle.finish(shown_start, ""), whole);
        }
    }
}
