//! contract §4.1: incremental UTF-8 decoding, a stateful ANSI/control stripper, CR-overwrite
//! semantics, and SGR colour spans for display.
//!
//! Bytes go through three stages inside one [`Sanitizer`]:
//!
//! ```text
//!   bytes ──► escape parser      ground / ESC / CSI / string states; SGR updates the style
//!         ──► UTF-8 decoder      ground state only; at most 3 bytes of a cut character wait
//!         ──► current line       CR overwrite; complete lines are appended to `out`
//! ```
//!
//! The output is the same for every way of cutting the input into pushes: every decision
//! depends on the decoded character stream only, never on where a push ends. Only text needs
//! decoding: inside a sequence every byte that matters is ASCII, and a UTF-8 sequence never
//! contains an ASCII byte.
//!
//! Speed: plain ASCII (most output) is scanned a block at a time and passed on without a copy;
//! everything else goes through a table-driven byte loop (see `BYTE_OUT`), so that random
//! bytes, where every branch is a coin toss, still run at hundreds of MB/s.
//!
//! Decisions the contract leaves open:
//! - **C1 controls** (U+0080–U+009F, UTF-8 `C2 80`–`C2 9F`) are removed one character at a time;
//!   none of them starts a sequence, so U+009B followed by `31m` leaves `31m`. Programs that mean
//!   CSI write `ESC [`; treating a stray U+009B (or U+0090/U+009D) as an introducer could swallow
//!   the rest of the output. A raw byte 0x9B is not UTF-8 at all and becomes U+FFFD, which is text.
//! - **Sequences** follow the usual VT parser rules: C0 controls inside an ESC or CSI sequence still
//!   act (a newline inside a broken sequence is kept), CAN/SUB abort it, ESC restarts it, and a
//!   non-ASCII character aborts it and is then treated as text. `ESC` + intermediates + final
//!   (`ESC ( B`) is removed whole.
//! - **String sequences** (OSC, DCS, SOS, PM, APC) are swallowed up to BEL, `ESC \` (or any ESC,
//!   which starts the next sequence), CAN or SUB, as a terminal does. Their bodies are never
//!   stored, so an unterminated one costs no memory however long it runs.
//! - **CR**: a lone `\r` arms "overwrite"; the next text character (anything kept that is not a
//!   newline, TAB and U+FFFD included) clears the line first. Escape sequences and removed
//!   controls are not text. A newline or the end of input disarms it and the line stays, which
//!   also makes `\r\n` a plain `\n`. Unlike a terminal, the new text replaces the whole line
//!   rather than overtyping its start (`abcdef\rXY` → `XY`).
//! - **Pending cap**: the current line is held until its newline so that a later `\r` can still
//!   replace it. Once it would grow past [`PENDING_CAP`] bytes its text so far is emitted (at a
//!   character boundary, without a newline); a later `\r` can then only replace what came after.
//! - **Spans** cover text characters only, never the `\n`, and adjacent spans of equal style are
//!   merged (also with the last span already in the caller's vector), so they are canonical.

use serde::Serialize;

/// Longest current line (bytes) held back for CR overwrite before it is emitted anyway; bounds
/// memory when a program writes megabytes without a newline.
pub const PENDING_CAP: usize = 64 * 1024;

/// Longest CSI parameter string (bytes) kept for SGR parsing. Real SGR sequences are a few dozen
/// bytes; longer ones are still removed, only their style change is ignored.
const CSI_PARAMS_CAP: usize = 256;

/// Text decoded from invalid UTF-8 is passed on in pieces of about this many bytes, which bounds
/// the scratch buffer however long the invalid stretch.
const SCRATCH_FLUSH: usize = 16 * 1024;

/// A plain ASCII run at least this long (bytes) ends the character-at-a-time path: it is passed
/// on without a copy.
const LONG_ASCII_RUN: usize = 64;

const BEL: u8 = 0x07;
const CAN: u8 = 0x18;
const SUB: u8 = 0x1a;
const ESC: u8 = 0x1b;

/// A colour from an SGR sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Color {
    /// 0–15 are the basic and bright colours, 16–255 the xterm palette.
    Indexed(u8),
    Rgb(u8, u8, u8),
}

/// Text attributes in effect for a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Style {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fg: Option<Color>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bg: Option<Color>,
    pub bold: bool,
    pub dim: bool,
    pub italic: bool,
    pub underline: bool,
    pub reverse: bool,
    pub strikethrough: bool,
}

impl Style {
    /// `self == Style::default()`, without the derived comparison's branches: this runs for
    /// every SGR sequence and span.
    fn is_default(&self) -> bool {
        self.fg.is_none()
            & self.bg.is_none()
            & !(self.bold | self.dim | self.italic | self.underline | self.reverse)
            & !self.strikethrough
    }
}

/// A styled byte range `[start, end)` of the text a [`Sanitizer`] appended to its output string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Span {
    pub start: usize,
    pub end: usize,
    pub style: Style,
}

/// Where the escape parser is between two characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum State {
    #[default]
    Ground,
    /// After ESC; `intermediate` once a byte 0x20–0x2F followed (`ESC ( B`).
    Escape {
        intermediate: bool,
    },
    Csi,
    /// The body of an OSC, DCS, SOS, PM or APC string.
    Str,
}

/// Streaming sanitizer: feed it raw output bytes, get model-facing text (and colour spans).
///
/// Only complete lines leave [`push`](Self::push); the current line waits in
/// [`pending`](Self::pending) until its newline, [`finish`](Self::finish), or [`PENDING_CAP`].
#[derive(Debug)]
pub struct Sanitizer {
    /// Start of a UTF-8 character cut off by the end of the previous push.
    utf8_buf: [u8; 4],
    utf8_len: usize,
    state: State,
    /// Parameter bytes of the CSI sequence being read, at most [`CSI_PARAMS_CAP`].
    csi_params: Vec<u8>,
    /// The CSI sequence read so far can still be an SGR (no private marker, no intermediate).
    csi_is_sgr: bool,
    style: Style,
    /// `style` is not the default (text in the default style gets no span).
    styled: bool,
    /// The current line, not yet emitted.
    line: String,
    /// Spans of `line`, offsets relative to its start.
    line_spans: Vec<Span>,
    /// A lone `\r` was seen: the next text character replaces the line.
    overwrite: bool,
    /// [`PENDING_CAP`], lowered by tests to exercise the flush with small inputs.
    pending_cap: usize,
    /// Text gathered by [`mixed`](Self::mixed): [`SCRATCH_FLUSH`] bytes and room for one more
    /// character.
    scratch: Vec<u8>,
}

impl Default for Sanitizer {
    fn default() -> Self {
        Self::new()
    }
}

/// The caller's output: text, and spans when they asked for them.
struct Out<'a> {
    text: &'a mut String,
    spans: Option<&'a mut Vec<Span>>,
}

impl Out<'_> {
    fn push_text(&mut self, text: &str, style: Style) {
        let start = self.text.len();
        self.text.push_str(text);
        if let Some(spans) = self.spans.as_deref_mut() {
            add_span(spans, start, self.text.len(), style);
        }
    }
}

impl Sanitizer {
    pub fn new() -> Self {
        Self {
            utf8_buf: [0; 4],
            utf8_len: 0,
            state: State::Ground,
            csi_params: Vec::new(),
            csi_is_sgr: false,
            style: Style::default(),
            styled: false,
            line: String::new(),
            line_spans: Vec::new(),
            overwrite: false,
            pending_cap: PENDING_CAP,
            scratch: Vec::new(),
        }
    }

    /// Sanitizes `bytes` and appends every line they complete (with its `\n`) to `out`.
    pub fn push(&mut self, bytes: &[u8], out: &mut String) {
        self.feed(bytes, &mut Out { text: out, spans: None });
    }

    /// Like [`push`](Self::push), and appends the SGR spans of the new text to `spans`, with
    /// offsets into `out`. Text in the default style gets no span.
    pub fn push_styled(&mut self, bytes: &[u8], out: &mut String, spans: &mut Vec<Span>) {
        self.feed(bytes, &mut Out { text: out, spans: Some(spans) });
    }

    /// The current unterminated line, for live display. After a lone `\r` it still shows the
    /// old text until new text replaces it, as a terminal would.
    pub fn pending(&self) -> &str {
        &self.line
    }

    /// Ends the stream: a cut character becomes U+FFFD, an unterminated sequence is dropped, and
    /// the current line is appended without adding a newline. The sanitizer is then as new.
    pub fn finish(&mut self, out: &mut String) {
        self.end(&mut Out { text: out, spans: None });
    }

    /// [`finish`](Self::finish) with spans, as [`push_styled`](Self::push_styled).
    pub fn finish_styled(&mut self, out: &mut String, spans: &mut Vec<Span>) {
        self.end(&mut Out { text: out, spans: Some(spans) });
    }

    fn end(&mut self, out: &mut Out<'_>) {
        if self.utf8_len > 0 {
            self.utf8_len = 0;
            self.process(REPLACEMENT, out);
        }
        self.flush_line(out);
        let pending_cap = self.pending_cap;
        *self = Self::new();
        self.pending_cap = pending_cap;
    }

    /// Hands `bytes` to the parser, first completing a character cut by the previous push.
    fn feed(&mut self, mut bytes: &[u8], out: &mut Out<'_>) {
        if self.utf8_len > 0 {
            let used = self.complete_cut_char(bytes, out);
            bytes = &bytes[used..];
        }
        self.process(bytes, out);
    }

    /// Decodes the character whose start waits in `utf8_buf`, using the first bytes of `bytes`;
    /// returns how many of them it used.
    fn complete_cut_char(&mut self, bytes: &[u8], out: &mut Out<'_>) -> usize {
        let have = self.utf8_len;
        let take = bytes.len().min(4 - have);
        let mut buf = self.utf8_buf;
        buf[have..have + take].copy_from_slice(&bytes[..take]);
        match decode_char(&buf[..have + take]) {
            Decoded::Char(_, len) => {
                // The stashed bytes were a valid prefix, so this character extends past them.
                self.utf8_len = 0;
                self.process(&buf[..len], out);
                len.saturating_sub(have)
            }
            Decoded::Invalid(bad) => {
                self.utf8_len = 0;
                self.process(REPLACEMENT, out);
                // The invalid subpart may end inside the stash; the rest is decoded afresh.
                bad.saturating_sub(have)
            }
            Decoded::Cut => {
                // Still cut (a short push): keep waiting.
                self.utf8_buf = buf;
                self.utf8_len = have + take;
                take
            }
        }
    }

    /// The escape/control state machine over raw bytes. Only ground state decodes UTF-8:
    /// inside a sequence every byte that matters is ASCII, a non-ASCII byte aborts an ESC or
    /// CSI sequence (and is then decoded as text), and string bodies are skipped unread.
    fn process(&mut self, b: &[u8], out: &mut Out<'_>) {
        let mut i = 0;
        while i < b.len() {
            match self.state {
                State::Ground => i = self.ground(b, i, out),
                State::Escape { intermediate } => {
                    let c = b[i];
                    match c {
                        0x20..=0x2f => self.state = State::Escape { intermediate: true },
                        b'[' if !intermediate => {
                            self.state = State::Csi;
                            self.csi_params.clear();
                            self.csi_is_sgr = true;
                        }
                        b']' | b'P' | b'X' | b'^' | b'_' if !intermediate => {
                            self.state = State::Str
                        }
                        0x30..=0x7e => self.state = State::Ground,
                        0x80.. => {
                            self.state = State::Ground;
                            continue;
                        }
                        _ => self.control(c, out),
                    }
                    i += 1;
                }
                State::Csi => {
                    // Parameter bytes in a tight loop: they are most of a sequence.
                    while let Some(&c @ 0x30..=0x3f) = b.get(i) {
                        // `<=>?` mark private sequences (`ESC [ > 4 ; 2 m` is not SGR).
                        if c >= b'<' || self.csi_params.len() >= CSI_PARAMS_CAP {
                            self.csi_is_sgr = false;
                        } else if self.csi_is_sgr {
                            self.csi_params.push(c);
                        }
                        i += 1;
                    }
                    let Some(&c) = b.get(i) else { break };
                    match c {
                        0x20..=0x2f => self.csi_is_sgr = false,
                        0x40..=0x7e => {
                            if c == b'm' && self.csi_is_sgr {
                                apply_sgr(&mut self.style, &self.csi_params);
                                self.styled = !self.style.is_default();
                            }
                            self.state = State::Ground;
                        }
                        0x80.. => {
                            self.state = State::Ground;
                            continue;
                        }
                        _ => self.control(c, out),
                    }
                    i += 1;
                }
                State::Str => {
                    // Bytes of a cut or invalid character are skipped like any other: none of
                    // them is one of these four.
                    match b[i..].iter().position(|&c| matches!(c, BEL | ESC | CAN | SUB)) {
                        None => i = b.len(),
                        Some(p) => {
                            i += p + 1;
                            // ESC ends the string and starts the next sequence: `ESC \` (ST) is
                            // then removed as a two-byte sequence.
                            self.state = if b[i - 1] == ESC {
                                State::Escape { intermediate: false }
                            } else {
                                State::Ground
                            };
                        }
                    }
                }
            }
        }
    }

    /// Ground state from `b[i]` on: text, newlines and controls, until a control starts a
    /// sequence or the bytes end. Returns where it stopped.
    fn ground(&mut self, b: &[u8], mut i: usize, out: &mut Out<'_>) -> usize {
        while let Some(&c) = b.get(i) {
            if is_plain_ascii(c) {
                // The bulk of ordinary output: plain ASCII needs no decoding, and is passed on
                // without a copy.
                let end = i + plain_ascii_run(&b[i..]);
                self.plain(assume_utf8(&b[i..end]), out);
                i = end;
            } else if c >= 0x80 {
                i = self.mixed(b, i, out);
            } else {
                self.control(c, out);
                i += 1;
            }
            if self.state != State::Ground {
                break;
            }
        }
        i
    }

    /// Ground state from `b[i]` (not plain ASCII) on, a byte at a time: UTF-8 decoding with
    /// invalid bytes becoming U+FFFD by maximal subpart (the rule of `String::from_utf8_lossy`),
    /// C1 and C0 controls removed, `\r` and ESC acted on. The text is gathered in `scratch`, so
    /// that a stretch of noise costs one call to `plain` rather than one per character. Stops at
    /// the bytes' end (a character cut by it waits in `utf8_buf`), when a sequence starts, or at
    /// a long plain ASCII run, which [`ground`](Self::ground) passes on without copying. Returns
    /// where it stopped.
    ///
    /// Random bytes are the worst case (every branch is a coin toss), so most bytes take one
    /// table look-up and no branch: see `BYTE_OUT`.
    fn mixed(&mut self, b: &[u8], mut i: usize, out: &mut Out<'_>) -> usize {
        let mut buf = std::mem::take(&mut self.scratch);
        buf.resize(SCRATCH_FLUSH + 8, 0);
        // `buf[..n]` is the text so far.
        let mut n = 0;
        // Plain ASCII bytes in a row at the end of `buf[..n]`.
        let mut ascii_run = 0;
        while let Some(&c) = b.get(i) {
            // The next byte's top two bits tell whether it can continue a character; past the
            // end, assume it can (a lead byte there is then looked at, and waits).
            let next = b.get(i + 1).map_or(2, |&d| d >> 6);
            let entry = BYTE_OUT[usize::from(c)][usize::from(next)];
            if entry != SPECIAL {
                let len = (entry >> 24) as usize;
                ascii_run = (ascii_run + 1) * usize::from(len == 1);
                if ascii_run == LONG_ASCII_RUN {
                    // Back to the fast path, from the run's start.
                    n -= LONG_ASCII_RUN - 1;
                    i -= LONG_ASCII_RUN - 1;
                    break;
                }
                // Four bytes written, `len` of them kept.
                buf[n..n + 4].copy_from_slice(&entry.to_le_bytes());
                n += len;
                i += 1;
            } else if c >= 0x80 {
                ascii_run = 0;
                match decode_char(&b[i..]) {
                    Decoded::Char(ch, len) => {
                        if !is_c1(ch) {
                            buf[n..n + len].copy_from_slice(&b[i..i + len]);
                            n += len;
                        }
                        i += len;
                    }
                    Decoded::Invalid(len) => {
                        buf[n..n + 3].copy_from_slice(REPLACEMENT);
                        n += 3;
                        i += len;
                    }
                    Decoded::Cut => {
                        // Only the end of `b` cuts a character short: at most 3 bytes.
                        let rest = &b[i..];
                        self.utf8_buf[..rest.len()].copy_from_slice(rest);
                        self.utf8_len = rest.len();
                        i = b.len();
                    }
                }
            } else {
                // `\r` or ESC: what came before belongs to the line they act on.
                ascii_run = 0;
                self.plain_scratch(&buf[..n], out);
                n = 0;
                self.control(c, out);
                i += 1;
                if self.state != State::Ground {
                    break;
                }
            }
            if n >= SCRATCH_FLUSH {
                self.plain_scratch(&buf[..n], out);
                n = 0;
                // The run's start is gone from `buf`: count afresh.
                ascii_run = 0;
            }
        }
        self.plain_scratch(&buf[..n], out);
        self.scratch = buf;
        i
    }

    /// [`plain`](Self::plain) over text [`mixed`](Self::mixed) gathered: only whole UTF-8
    /// sequences (plain ASCII and U+FFFD from `BYTE_OUT` or [`REPLACEMENT`], and characters
    /// [`decode_char`] found well-formed, copied from the input).
    fn plain_scratch(&mut self, text: &[u8], out: &mut Out<'_>) {
        if !text.is_empty() {
            self.plain(assume_utf8(text), out);
        }
    }

    /// Text and newlines, no other controls.
    fn plain(&mut self, run: &str, out: &mut Out<'_>) {
        let Some(first) = first_newline(run.as_bytes()) else {
            self.text(run, out);
            return;
        };
        let last = last_newline(run.as_bytes()).unwrap_or(first);
        if first > 0 {
            self.text(&run[..first], out);
        }
        self.end_line(out);
        // The lines in between are complete and hold no `\r`: copy them in one go, the bulk
        // of ordinary output.
        let middle = &run[first + 1..last + 1];
        if out.spans.is_none() || !self.styled {
            out.text.push_str(middle);
        } else {
            for line in middle.split_inclusive('\n') {
                out.push_text(&line[..line.len() - 1], self.style);
                out.text.push('\n');
            }
        }
        if last + 1 < run.len() {
            self.text(&run[last + 1..], out);
        }
    }

    /// A C0 control or DEL, in ground state or inside an ESC/CSI sequence.
    fn control(&mut self, c: u8, out: &mut Out<'_>) {
        match c {
            b'\n' => self.end_line(out),
            b'\r' => self.overwrite = true,
            // Only reached inside a sequence; in ground state TAB is part of a plain run.
            b'\t' => self.text("\t", out),
            ESC => self.state = State::Escape { intermediate: false },
            CAN | SUB => self.state = State::Ground,
            _ => {}
        }
    }

    /// Appends text to the current line, honouring a pending overwrite and the pending cap.
    fn text(&mut self, mut text: &str, out: &mut Out<'_>) {
        if self.overwrite {
            self.overwrite = false;
            self.line.clear();
            self.line_spans.clear();
        }
        loop {
            let room = self.pending_cap.saturating_sub(self.line.len());
            if text.len() <= room {
                self.append(text);
                return;
            }
            // Flush exactly where the line would pass the cap, so the result does not depend
            // on how the text arrived.
            let mut cut = room;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            self.append(&text[..cut]);
            self.flush_line(out);
            text = &text[cut..];
        }
    }

    fn append(&mut self, text: &str) {
        let start = self.line.len();
        self.line.push_str(text);
        if self.styled {
            add_span(&mut self.line_spans, start, self.line.len(), self.style);
        }
    }

    fn end_line(&mut self, out: &mut Out<'_>) {
        // `\r` then newline: nothing replaced the line, so it stays.
        self.overwrite = false;
        self.flush_line(out);
        out.text.push('\n');
    }

    /// Moves the current line's text and spans to `out`.
    fn flush_line(&mut self, out: &mut Out<'_>) {
        let base = out.text.len();
        out.text.push_str(&self.line);
        if let Some(spans) = out.spans.as_deref_mut() {
            for span in &self.line_spans {
                add_span(spans, base + span.start, base + span.end, span.style);
            }
        }
        self.line.clear();
        self.line_spans.clear();
    }
}

/// One-shot: the model-facing text of a complete output.
pub fn sanitize(bytes: &[u8]) -> String {
    let mut sanitizer = Sanitizer::new();
    let mut out = String::new();
    sanitizer.push(bytes, &mut out);
    sanitizer.finish(&mut out);
    out
}

/// Records `[start, end)` in `style`, extending the last span when it is contiguous and equal,
/// so spans stay canonical whatever the chunking.
fn add_span(spans: &mut Vec<Span>, start: usize, end: usize, style: Style) {
    if start == end || style.is_default() {
        return;
    }
    if let Some(last) = spans.last_mut() {
        if last.end == start && last.style == style {
            last.end = end;
            return;
        }
    }
    spans.push(Span { start, end, style });
}

/// Bytes the scanners below test per step. A block is tested whole, with no early exit inside
/// it, which lets the compiler use SIMD compares: these loops carry ordinary output.
const BLOCK: usize = 32;

/// Printable ASCII, TAB or LF: text that needs neither decoding nor removal.
const fn is_plain_ascii(c: u8) -> bool {
    (c.wrapping_sub(0x20) < 0x5f) | (c.wrapping_sub(b'\t') < 2)
}

/// Length of the leading run of `b` for which `pred` holds, testing [`BLOCK`] bytes at a time.
#[inline(always)]
fn run_len(b: &[u8], pred: impl Fn(u8) -> bool) -> usize {
    // Between escape sequences runs are mostly short: a few bytes one by one first.
    let head = b.len().min(SHORT_RUN);
    if let Some(p) = b[..head].iter().position(|&c| !pred(c)) {
        return p;
    }
    let mut i = head;
    for block in b[head..].chunks_exact(BLOCK) {
        if !block.iter().fold(true, |all, &c| all & pred(c)) {
            break;
        }
        i += BLOCK;
    }
    i + b[i..].iter().position(|&c| !pred(c)).unwrap_or(b.len() - i)
}

/// Runs shorter than this (bytes) are searched a byte at a time: text between escape sequences
/// is mostly a few bytes, where setting up `memchr` costs more than it saves.
const SHORT_RUN: usize = 16;

fn first_newline(b: &[u8]) -> Option<usize> {
    if b.len() < SHORT_RUN {
        b.iter().position(|&c| c == b'\n')
    } else {
        memchr::memchr(b'\n', b)
    }
}

fn last_newline(b: &[u8]) -> Option<usize> {
    if b.len() < SHORT_RUN {
        b.iter().rposition(|&c| c == b'\n')
    } else {
        memchr::memrchr(b'\n', b)
    }
}

/// Bytes this module has built or checked to be UTF-8, as text.
///
/// Validating them again would cost a third of the time on random bytes, and a call per short
/// run on ordinary output. Debug builds (the tests) still check.
fn assume_utf8(bytes: &[u8]) -> &str {
    debug_assert!(std::str::from_utf8(bytes).is_ok(), "not UTF-8: {bytes:?}");
    // SAFETY: callers pass plain ASCII runs (`plain_ascii_run`) or text `mixed` built from whole
    // UTF-8 sequences only (see `plain_scratch`).
    unsafe { std::str::from_utf8_unchecked(bytes) }
}

/// Length of the leading run of plain ASCII in `b` (see [`is_plain_ascii`]).
fn plain_ascii_run(b: &[u8]) -> usize {
    run_len(b, is_plain_ascii)
}

/// U+FFFD REPLACEMENT CHARACTER, what an invalid UTF-8 sequence becomes.
const REPLACEMENT: &[u8] = "\u{FFFD}".as_bytes();

/// `BYTE_OUT` entry of a byte that needs a closer look: `\r`, ESC, or a UTF-8 lead byte
/// followed by a continuation byte.
const SPECIAL: u32 = u32::MAX;

/// What a byte becomes in ground state, by the byte and the top two bits of the next one (`2`
/// for a continuation byte `80`–`BF`): up to three bytes of text (little-endian) and their
/// count in the top byte, or [`SPECIAL`]. Plain ASCII is itself; other C0 controls and DEL are
/// nothing; a byte that cannot start a character (`80`–`C1`, `F5`–`FF`), or a lead byte not
/// followed by a continuation byte, is one U+FFFD.
static BYTE_OUT: [[u32; 4]; 256] = {
    const FFFD: u32 = 3 << 24 | 0xbd << 16 | 0xbf << 8 | 0xef;
    let mut table = [[0u32; 4]; 256];
    let mut c = 0;
    while c < 256 {
        let byte = c as u8;
        let entry = if is_plain_ascii(byte) {
            1 << 24 | byte as u32
        } else if byte == b'\r' || byte == ESC {
            SPECIAL
        } else if byte < 0x80 {
            0
        } else {
            FFFD
        };
        table[c] = [entry; 4];
        if byte >= 0xc2 && byte <= 0xf4 {
            table[c][2] = SPECIAL;
        }
        c += 1;
    }
    table
};

/// The first character of some bytes, as UTF-8 sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decoded {
    /// A valid character and its length in bytes.
    Char(char, usize),
    /// An invalid sequence: its maximal subpart (Unicode §3.9, the rule of
    /// `String::from_utf8_lossy`) has this many bytes and becomes one U+FFFD.
    Invalid(usize),
    /// A valid start that the bytes end too early to complete.
    Cut,
}

/// Decodes the first character of `b` (non-empty) by the well-formed byte sequences of Unicode
/// Table 3-7: the lead byte gives the length, the payload bits and the range of the second byte;
/// the others are continuation bytes.
#[inline(always)]
fn decode_char(b: &[u8]) -> Decoded {
    let (len, mut code, second) = match b[0] {
        c @ 0x00..=0x7f => return Decoded::Char(char::from(c), 1),
        c @ 0xc2..=0xdf => (2, u32::from(c & 0x1f), 0x80..=0xbf),
        0xe0 => (3, 0, 0xa0..=0xbf),
        c @ (0xe1..=0xec | 0xee..=0xef) => (3, u32::from(c & 0x0f), 0x80..=0xbf),
        0xed => (3, 0x0d, 0x80..=0x9f),
        0xf0 => (4, 0, 0x90..=0xbf),
        c @ 0xf1..=0xf3 => (4, u32::from(c & 0x07), 0x80..=0xbf),
        0xf4 => (4, 0x04, 0x80..=0x8f),
        _ => return Decoded::Invalid(1),
    };
    for k in 1..len {
        match b.get(k) {
            None => return Decoded::Cut,
            Some(c) if k == 1 && !second.contains(c) => return Decoded::Invalid(1),
            Some(&c) if c & 0xc0 != 0x80 => return Decoded::Invalid(k),
            Some(&c) => code = code << 6 | u32::from(c & 0x3f),
        }
    }
    // The ranges above leave only scalar values; `from_u32` checks it once more.
    char::from_u32(code).map_or(Decoded::Invalid(len), |ch| Decoded::Char(ch, len))
}

/// A C1 control (U+0080–U+009F).
fn is_c1(ch: char) -> bool {
    matches!(ch, '\u{80}'..='\u{9f}')
}

/// Applies one SGR parameter string (`1;38;5;208`, `38:2::255:0:0`, empty = reset).
fn apply_sgr(style: &mut Style, params: &[u8]) {
    let mut groups = params.split(|&c| c == b';');
    while let Some(group) = groups.next() {
        let colon_form = group.contains(&b':');
        let mut subs = group.split(|&c| c == b':').map(parse_param);
        let code = subs.next().unwrap_or(0);
        match code {
            0 => *style = Style::default(),
            1 => style.bold = true,
            2 => style.dim = true,
            3 => style.italic = true,
            // `4:0` is "no underline"; `4:1`…`4:5` are underline styles.
            4 => style.underline = !colon_form || subs.next() != Some(0),
            7 => style.reverse = true,
            9 => style.strikethrough = true,
            22 => {
                style.bold = false;
                style.dim = false;
            }
            23 => style.italic = false,
            24 => style.underline = false,
            27 => style.reverse = false,
            29 => style.strikethrough = false,
            30..=37 => style.fg = Some(Color::Indexed((code - 30) as u8)),
            39 => style.fg = None,
            40..=47 => style.bg = Some(Color::Indexed((code - 40) as u8)),
            49 => style.bg = None,
            90..=97 => style.fg = Some(Color::Indexed((code - 90 + 8) as u8)),
            100..=107 => style.bg = Some(Color::Indexed((code - 100 + 8) as u8)),
            // 58 is the underline colour: not shown, but its arguments must be skipped.
            38 | 48 | 58 => {
                let color = if colon_form {
                    extended_color(&mut subs, true)
                } else {
                    extended_color(&mut (&mut groups).map(parse_param), false)
                };
                if let Some(color) = color {
                    match code {
                        38 => style.fg = Some(color),
                        48 => style.bg = Some(color),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
}

/// The colour after `38`/`48`: `5;n` or `2;r;g;b`; in the colon form also `2:cs:r:g:b` (ITU
/// T.416 puts a colour-space id first). Consumes its arguments even when they are invalid.
fn extended_color(args: &mut impl Iterator<Item = u32>, colon_form: bool) -> Option<Color> {
    let byte = |v: u32| u8::try_from(v).ok();
    match args.next()? {
        5 => byte(args.next()?).map(Color::Indexed),
        2 => {
            let mut rgb = [0u32; 4];
            let mut n = 0;
            let limit = if colon_form { 4 } else { 3 };
            while n < limit {
                match args.next() {
                    Some(v) => rgb[n] = v,
                    None => break,
                }
                n += 1;
            }
            let [r, g, b] = match n {
                3 => [rgb[0], rgb[1], rgb[2]],
                4 => [rgb[1], rgb[2], rgb[3]],
                _ => return None,
            };
            Some(Color::Rgb(byte(r)?, byte(g)?, byte(b)?))
        }
        _ => None,
    }
}

/// A decimal parameter; empty is 0 and huge values saturate.
fn parse_param(digits: &[u8]) -> u32 {
    digits
        .iter()
        .fold(0u32, |n, &d| n.saturating_mul(10).saturating_add(u32::from(d.wrapping_sub(b'0'))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;

    fn styled(bytes: &[u8]) -> (String, Vec<Span>) {
        let mut s = Sanitizer::new();
        let (mut out, mut spans) = (String::new(), Vec::new());
        s.push_styled(bytes, &mut out, &mut spans);
        s.finish_styled(&mut out, &mut spans);
        (out, spans)
    }

    /// Pushes `bytes` cut at `cuts` (any order, out of range ignored) through one sanitizer.
    fn chunked(bytes: &[u8], cuts: &[usize], pending_cap: usize) -> (String, Vec<Span>) {
        let mut cuts: Vec<usize> = cuts.iter().map(|&c| c % (bytes.len() + 1)).collect();
        cuts.sort_unstable();
        let mut s = Sanitizer::new();
        s.pending_cap = pending_cap;
        let (mut out, mut spans) = (String::new(), Vec::new());
        let mut from = 0;
        for cut in cuts.into_iter().chain([bytes.len()]) {
            s.push_styled(&bytes[from..cut], &mut out, &mut spans);
            from = cut;
        }
        s.finish_styled(&mut out, &mut spans);
        (out, spans)
    }

    fn red() -> Style {
        Style { fg: Some(Color::Indexed(1)), ..Style::default() }
    }

    #[test]
    fn acceptance_example() {
        // "\x1b[31mred\x1b[0m" is "red" in red; the lone `\r` is followed by text ("a"), so
        // "red" is replaced; NUL is removed and TAB kept, giving the line "ab\tline". On the
        // second line "carriage\r" is followed only by SOH (C0) and U+0085 NEL (C1), both
        // removed, so nothing replaces "carriage" and it stays. No newline is added at the end.
        let input = "\x1b[31mred\x1b[0m\ra\0b\tline\ncarriage\r\x01\u{85}";
        assert_eq!(sanitize(input.as_bytes()), "ab\tline\ncarriage");
        // Read as bytes instead, 0x85 alone is invalid UTF-8: U+FFFD, which is text and so
        // replaces "carriage".
        let bytes = b"\x1b[31mred\x1b[0m\ra\0b\tline\ncarriage\r\x01\x85";
        assert_eq!(sanitize(bytes), "ab\tline\n\u{FFFD}");
    }

    #[test]
    fn raw_0x85_byte_is_replacement_text() {
        assert_eq!(sanitize(b"a\x85b"), "a\u{FFFD}b");
        // U+FFFD is text, so after a lone `\r` it replaces the line.
        assert_eq!(sanitize(b"old\r\x85\n"), "\u{FFFD}\n");
        // Raw 0x9B (8-bit CSI) is invalid UTF-8: text, not a sequence.
        assert_eq!(sanitize(b"\x9b31mX"), "\u{FFFD}31mX");
    }

    #[test]
    fn c1_characters_are_removed_and_start_nothing() {
        assert_eq!(sanitize("a\u{9b}31mb\u{80}\u{9f}c".as_bytes()), "a31mbc");
        // Neighbours of the C1 range share the 0xC2 lead byte and are text.
        assert_eq!(sanitize("\u{a0}£\u{bf}".as_bytes()), "\u{a0}£\u{bf}");
    }

    #[test]
    fn carriage_return_semantics() {
        let cases: &[(&[u8], &str)] = &[
            (b"10%\r55%\r100%\n", "100%\n"),
            (b"a\r\nb\r\n", "a\nb\n"),
            (b"keep\r", "keep"),
            (b"keep\r\n", "keep\n"),
            (b"abcdef\rXY\n", "XY\n"),
            (b"old\r\x1b[32m\x07new", "new"),
            (b"old\r\x1b[K\n", "old\n"),
            (b"old\r\tx", "\tx"),
            (b"a\r\rb", "b"),
            (b"\rx", "x"),
        ];
        for (input, expected) in cases {
            assert_eq!(sanitize(input), *expected, "input {input:?}");
        }
    }

    #[test]
    fn controls_and_sequences_are_removed() {
        let cases: &[(&[u8], &str)] = &[
            (b"a\x00\x01\x08\x0b\x0c\x7fb", "ab"),
            (b"\x1b[1;31mx\x1b[0m", "x"),
            (b"\x1b[?25lx\x1b[2J", "x"),
            (b"\x1b]0;title\x07x", "x"),
            (b"\x1b]8;;http://e\x1b\\link\x1b]8;;\x1b\\", "link"),
            (b"\x1bP1$r0m\x1b\\x", "x"),
            (b"\x1b_apc\x1b\\\x1b^pm\x1b\\\x1bXsos\x1b\\x", "x"),
            (b"\x1b(B\x1b[mx\x1b7\x1b8\x1b=", "x"),
            // A newline inside a broken sequence still ends the line.
            (b"\x1b[3\n1mx", "\nx"),
            // CAN aborts; a non-ASCII character aborts and is text.
            (b"\x1b[3\x18x", "x"),
            ("\x1b[3é".as_bytes(), "é"),
            // ESC restarts the sequence.
            (b"\x1b\x1b[31mx", "x"),
            // Unterminated at the end: dropped.
            (b"x\x1b[31", "x"),
            (b"x\x1b]unterminated", "x"),
        ];
        for (input, expected) in cases {
            assert_eq!(sanitize(input), *expected, "input {input:?}");
        }
    }

    #[test]
    fn long_noise_and_plain_runs_interleave() {
        // Invalid bytes, long ASCII runs (the copy-free path) and multi-byte characters, across
        // the scratch buffer's flush size.
        let mut bytes = Vec::new();
        for i in 0..3000u32 {
            bytes.extend_from_slice(b"\xff\xc3");
            bytes.extend(std::iter::repeat_n(b'a' + (i % 26) as u8, (i % 130) as usize));
            bytes.extend_from_slice("é\u{85}😀\x01\n".as_bytes());
        }
        let expected: String = String::from_utf8_lossy(&bytes)
            .chars()
            .filter(|&c| !c.is_control() || c == '\n')
            .collect();
        assert_eq!(sanitize(&bytes), expected);
        assert_eq!(chunked(&bytes, &[1, 4097, 65_536, 100_003], PENDING_CAP).0, expected);

        // A long ASCII run that starts just before the scratch buffer is passed on.
        for noise in SCRATCH_FLUSH / 3 - 2..SCRATCH_FLUSH / 3 + 2 {
            let mut bytes = vec![0xff; noise];
            bytes.extend_from_slice(&[b'a'; 3 * LONG_ASCII_RUN]);
            let expected =
                format!("{}{}", "\u{FFFD}".repeat(noise), "a".repeat(3 * LONG_ASCII_RUN));
            assert_eq!(sanitize(&bytes), expected);
        }
    }

    #[test]
    fn split_sequence_never_leaks() {
        let mut s = Sanitizer::new();
        let mut out = String::new();
        for chunk in [&b"a\x1b"[..], b"[", b"0", b"m", b"b\x1b]0;t", b"itle\x1b", b"\\c\n"] {
            s.push(chunk, &mut out);
        }
        s.finish(&mut out);
        assert_eq!(out, "abc\n");
    }

    #[test]
    fn split_character_comes_out_whole() {
        let bytes = "€😀".as_bytes();
        for cut in 0..=bytes.len() {
            let (text, _) = chunked(bytes, &[cut], PENDING_CAP);
            assert_eq!(text, "€😀");
        }
        let mut s = Sanitizer::new();
        let mut out = String::new();
        for b in bytes {
            s.push(&[*b], &mut out);
        }
        s.finish(&mut out);
        assert_eq!(out, "€😀");
    }

    #[test]
    fn invalid_utf8_uses_maximal_subparts() {
        let cases: &[&[u8]] = &[
            b"\xe2\x82",
            b"\xe2\x82A",
            b"\xf0\x90\x80",
            b"\xf0\x90\x80\xf0",
            b"\xed\xa0\x80",
            b"\xc0\xaf",
            b"\xf4\x90\x80\x80",
            b"\xff\xfe",
        ];
        for bytes in cases {
            let expected = String::from_utf8_lossy(bytes);
            for cut in 0..=bytes.len() {
                assert_eq!(chunked(bytes, &[cut], PENDING_CAP).0, expected, "{bytes:?} / {cut}");
            }
        }
    }

    #[test]
    fn pending_shows_the_current_line() {
        let mut s = Sanitizer::new();
        let mut out = String::new();
        s.push(b"done\n50%", &mut out);
        assert_eq!((out.as_str(), s.pending()), ("done\n", "50%"));
        s.push(b"\r", &mut out);
        assert_eq!(s.pending(), "50%");
        s.push(b"90%", &mut out);
        assert_eq!(s.pending(), "90%");
        s.finish(&mut out);
        assert_eq!((out.as_str(), s.pending()), ("done\n90%", ""));
    }

    #[test]
    fn long_line_is_flushed_at_the_cap() {
        let mut s = Sanitizer::new();
        let mut out = String::new();
        let long = "é".repeat(PENDING_CAP); // 2 bytes each: twice the cap
        s.push(long.as_bytes(), &mut out);
        assert_eq!(out.len(), PENDING_CAP);
        assert_eq!(s.pending().len(), PENDING_CAP);
        // The cap is hit again with the next byte; only the text after that can be replaced.
        s.push(b"x\rnew\n", &mut out);
        assert_eq!(out, format!("{long}new\n"));
        assert!(s.line.capacity() <= 2 * PENDING_CAP);
    }

    #[test]
    fn state_stays_bounded() {
        let mut s = Sanitizer::new();
        let mut out = String::new();
        let body = vec![b'a'; 1 << 20];
        s.push(b"\x1b]52;c;", &mut out);
        s.push(&body, &mut out);
        s.push(b"\x07ok\x1b[", &mut out);
        let params = "1;".repeat(1 << 16);
        s.push(params.as_bytes(), &mut out);
        s.push(b"m!", &mut out);
        s.finish(&mut out);
        assert_eq!(out, "ok!");
        assert!(s.csi_params.capacity() <= 2 * CSI_PARAMS_CAP);
    }

    #[test]
    fn sgr_spans() {
        let (text, spans) = styled(b"\x1b[31mred\x1b[0m plain \x1b[1;4mbu\x1b[24mb\x1b[m");
        assert_eq!(text, "red plain bub");
        let bold = Style { bold: true, ..Style::default() };
        let bold_ul = Style { underline: true, ..bold };
        assert_eq!(
            spans,
            vec![
                Span { start: 0, end: 3, style: red() },
                Span { start: 10, end: 12, style: bold_ul },
                Span { start: 12, end: 13, style: bold },
            ]
        );
    }

    #[test]
    fn sgr_colours() {
        let style_of = |seq: &str| {
            let (_, spans) = styled(format!("\x1b[{seq}mx").as_bytes());
            spans.first().map(|s| s.style).unwrap_or_default()
        };
        let fg = |c| Style { fg: Some(c), ..Style::default() };
        let bg = |c| Style { bg: Some(c), ..Style::default() };
        assert_eq!(style_of("32"), fg(Color::Indexed(2)));
        assert_eq!(style_of("97"), fg(Color::Indexed(15)));
        assert_eq!(style_of("44"), bg(Color::Indexed(4)));
        assert_eq!(style_of("100"), bg(Color::Indexed(8)));
        assert_eq!(style_of("38;5;208"), fg(Color::Indexed(208)));
        assert_eq!(style_of("48;2;1;2;3"), bg(Color::Rgb(1, 2, 3)));
        assert_eq!(style_of("38:5:208"), fg(Color::Indexed(208)));
        assert_eq!(style_of("38:2:1:2:3"), fg(Color::Rgb(1, 2, 3)));
        assert_eq!(style_of("38:2::1:2:3"), fg(Color::Rgb(1, 2, 3)));
        // Arguments of an extended colour are not read as codes (the 1 is not bold).
        assert_eq!(style_of("38;5;1"), fg(Color::Indexed(1)));
        assert_eq!(style_of("58;5;1;3"), Style { italic: true, ..Style::default() });
        // Out-of-range and incomplete colours are ignored.
        assert_eq!(style_of("38;2;300;0;0"), Style::default());
        assert_eq!(style_of("38;5"), Style::default());
        assert_eq!(style_of("31;39"), Style::default());
        assert_eq!(style_of("4:0"), Style::default());
        assert_eq!(style_of("1;2;22"), Style::default());
        // Private sequences and CSI with intermediates are not SGR.
        assert_eq!(style_of(">4;2"), Style::default());
        assert_eq!(style_of("1 "), Style::default());
        // Reset everything.
        assert_eq!(style_of("1;3;7;9;31;42;0"), Style::default());
        assert_eq!(style_of("1;3;7;9;31;42;"), Style::default());
    }

    #[test]
    fn style_persists_across_lines_and_pushes() {
        let (text, spans) = chunked(b"\x1b[31mab\ncd\x1b[0m", &[3, 8], PENDING_CAP);
        assert_eq!(text, "ab\ncd");
        assert_eq!(
            spans,
            vec![Span { start: 0, end: 2, style: red() }, Span { start: 3, end: 5, style: red() },]
        );
    }

    #[test]
    fn overwritten_text_loses_its_spans() {
        let (text, spans) = styled(b"\x1b[31mred\x1b[0m\rplain\nx\x1b[31my\r\x1b[0mz");
        assert_eq!(text, "plain\nz");
        assert_eq!(spans, vec![]);
        let (text, spans) = styled(b"plain\r\x1b[31mred");
        assert_eq!(text, "red");
        assert_eq!(spans, vec![Span { start: 0, end: 3, style: red() }]);
    }

    /// Inputs rich in the bytes the parser cares about.
    fn tricky_bytes() -> impl Strategy<Value = Vec<u8>> {
        let pieces: Vec<&'static [u8]> = vec![
            b"\x1b",
            b"[",
            b"]",
            b";",
            b":",
            b"0",
            b"1",
            b"3",
            b"5",
            b"8",
            b"m",
            b"38;2;",
            b"48;5;",
            b"\r",
            b"\n",
            b"\r\n",
            b"\t",
            b"\x07",
            b"\\",
            b"P",
            b"(",
            b"?",
            b"a",
            b"bc ",
            "é".as_bytes(),
            "€".as_bytes(),
            "😀".as_bytes(),
            "\u{85}".as_bytes(),
            "\u{9b}".as_bytes(),
            b"\x80",
            b"\xc2",
            b"\xe2\x82",
            b"\xf0",
            b"\xff",
            b"\x9b",
            b"\x00",
            b"\x18",
            b"\x7f",
            b"\x1b[31m",
            b"\x1b[1;4m",
            b"\x1b[0m",
            b"\x1b[m",
            b"\x1b[38;5;208m",
            b"\x1b[48:2::1:2:3m",
            b"\x1b[?25l",
            b"\x1b]0;t\x07",
            b"\x1b(B",
        ];
        prop::collection::vec(prop::sample::select(pieces), 0..80).prop_map(|parts| parts.concat())
    }

    fn check_invariants(text: &str, spans: &[Span]) -> Result<(), TestCaseError> {
        for c in text.chars() {
            let bad = (c.is_control() && c != '\t' && c != '\n') || c == '\u{7f}';
            prop_assert!(!bad, "control {c:?} in {text:?}");
        }
        let mut last_end = 0;
        for span in spans {
            prop_assert!(last_end <= span.start && span.start < span.end);
            prop_assert!(span.end <= text.len());
            prop_assert!(text.is_char_boundary(span.start) && text.is_char_boundary(span.end));
            prop_assert!(!text[span.start..span.end].contains('\n'));
            prop_assert!(span.style != Style::default());
            last_end = span.end;
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn chunking_does_not_matter_arbitrary(
            bytes in prop::collection::vec(any::<u8>(), 0..400),
            cuts in prop::collection::vec(any::<usize>(), 0..12),
        ) {
            let whole = chunked(&bytes, &[], PENDING_CAP);
            prop_assert_eq!(&chunked(&bytes, &cuts, PENDING_CAP), &whole);
            prop_assert_eq!(&sanitize(&bytes), &whole.0);
            check_invariants(&whole.0, &whole.1)?;
        }

        #[test]
        fn chunking_does_not_matter_tricky(
            bytes in tricky_bytes(),
            cuts in prop::collection::vec(any::<usize>(), 0..12),
            cap in prop::sample::select(vec![4usize, 7, 16, PENDING_CAP]),
        ) {
            let whole = chunked(&bytes, &[], cap);
            prop_assert_eq!(&chunked(&bytes, &cuts, cap), &whole);
            check_invariants(&whole.0, &whole.1)?;
            if cap == PENDING_CAP {
                prop_assert_eq!(&sanitize(&bytes), &whole.0);
            }
        }

        #[test]
        fn byte_at_a_time_matches_whole(bytes in tricky_bytes()) {
            let cuts: Vec<usize> = (0..bytes.len()).collect();
            prop_assert_eq!(chunked(&bytes, &cuts, 7), chunked(&bytes, &[], 7));
        }

        #[test]
        fn noise_decodes_like_from_utf8_lossy_without_controls(
            bytes in prop::collection::vec(
                any::<u8>().prop_filter("no ESC or CR", |b| *b != ESC && *b != b'\r'),
                0..3000,
            ),
            cuts in prop::collection::vec(any::<usize>(), 0..8),
        ) {
            // Without ESC and CR nothing but removal happens: every C0, DEL and C1 control goes,
            // everything else reads as `from_utf8_lossy` does, however the bytes are cut.
            let expected: String = String::from_utf8_lossy(&bytes)
                .chars()
                .filter(|&c| !c.is_control() || c == '\t' || c == '\n')
                .collect();
            prop_assert_eq!(chunked(&bytes, &cuts, PENDING_CAP).0, expected);
        }

        #[test]
        fn text_without_controls_decodes_like_from_utf8_lossy(
            bytes in prop::collection::vec(
                any::<u8>().prop_filter("no controls", |b| *b >= 0x20 && *b != 0x7f && *b != 0xc2),
                0..200,
            ),
            cuts in prop::collection::vec(any::<usize>(), 0..8),
        ) {
            let expected = String::from_utf8_lossy(&bytes).into_owned();
            prop_assert_eq!(chunked(&bytes, &cuts, PENDING_CAP).0, expected);
        }
    }
}
