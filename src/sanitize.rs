//! SPEC §4.1: incremental UTF-8 decoding, a stateful ANSI/control stripper, CR-overwrite
//! semantics, and SGR colour spans for display.
//!
//! Bytes go through three stages inside one [`Sanitizer`]:
//!
//! ```text
//!   bytes ──► UTF-8 decoder      keeps at most 3 bytes of a character cut by a read
//!         ──► escape parser      ground / ESC / CSI / string states; SGR updates the style
//!         ──► current line       CR overwrite; complete lines are appended to `out`
//! ```
//!
//! The output is the same for every way of cutting the input into pushes: every decision
//! depends on the decoded character stream only, never on where a push ends.
//!
//! Decisions the SPEC leaves open:
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
    /// The current line, not yet emitted.
    line: String,
    /// Spans of `line`, offsets relative to its start.
    line_spans: Vec<Span>,
    /// A lone `\r` was seen: the next text character replaces the line.
    overwrite: bool,
    /// [`PENDING_CAP`], lowered by tests to exercise the flush with small inputs.
    pending_cap: usize,
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
            line: String::new(),
            line_spans: Vec::new(),
            overwrite: false,
            pending_cap: PENDING_CAP,
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
            self.process("\u{FFFD}", out);
        }
        self.flush_line(out);
        let pending_cap = self.pending_cap;
        *self = Self::new();
        self.pending_cap = pending_cap;
    }

    /// UTF-8 decoding: whole characters go to [`process`](Self::process); invalid bytes become
    /// U+FFFD by maximal subpart (the rule of `String::from_utf8_lossy`, which `Utf8Error`'s
    /// `error_len` follows); a character cut by the end of `bytes` waits in `utf8_buf`.
    fn feed(&mut self, mut bytes: &[u8], out: &mut Out<'_>) {
        if self.utf8_len > 0 {
            let used = self.complete_cut_char(bytes, out);
            bytes = &bytes[used..];
        }
        // `str::from_utf8` rather than `utf8_chunks`: it is several times faster on ASCII, and
        // validating the valid prefix twice after an error costs less than that.
        while !bytes.is_empty() {
            let error = match std::str::from_utf8(bytes) {
                Ok(text) => {
                    self.process(text, out);
                    return;
                }
                Err(error) => error,
            };
            let (valid, rest) = bytes.split_at(error.valid_up_to());
            if let Ok(text) = std::str::from_utf8(valid) {
                self.process(text, out);
            }
            match error.error_len() {
                Some(len) => {
                    self.process("\u{FFFD}", out);
                    bytes = &rest[len..];
                }
                None => {
                    // Cut by the end of this push (at most 3 bytes).
                    self.utf8_buf[..rest.len()].copy_from_slice(rest);
                    self.utf8_len = rest.len();
                    return;
                }
            }
        }
    }

    /// Decodes the character whose start waits in `utf8_buf`, using the first bytes of `bytes`;
    /// returns how many of them it used.
    fn complete_cut_char(&mut self, bytes: &[u8], out: &mut Out<'_>) -> usize {
        let have = self.utf8_len;
        let take = bytes.len().min(4 - have);
        let mut buf = self.utf8_buf;
        buf[have..have + take].copy_from_slice(&bytes[..take]);
        let candidate = &buf[..have + take];
        let (decoded, error) = match std::str::from_utf8(candidate) {
            Ok(s) => (s, None),
            Err(e) => (std::str::from_utf8(&candidate[..e.valid_up_to()]).unwrap_or(""), Some(e)),
        };
        if let Some(ch) = decoded.chars().next() {
            // The stashed bytes were a valid prefix, so this character extends past them.
            self.utf8_len = 0;
            let len = ch.len_utf8();
            self.process(&decoded[..len], out);
            return len.saturating_sub(have);
        }
        match error.and_then(|e| e.error_len()) {
            Some(bad) => {
                self.utf8_len = 0;
                self.process("\u{FFFD}", out);
                // The invalid subpart may end inside the stash; the rest is decoded afresh.
                bad.saturating_sub(have)
            }
            None => {
                // Still cut (a short push): keep waiting.
                self.utf8_buf = buf;
                self.utf8_len = have + take;
                take
            }
        }
    }

    /// The escape/control state machine over decoded text.
    fn process(&mut self, s: &str, out: &mut Out<'_>) {
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            match self.state {
                State::Ground => {
                    let end = i + plain_run(&b[i..]);
                    if end > i {
                        self.plain(&s[i..end], out);
                        i = end;
                        continue;
                    }
                    if b[i] == 0xc2 {
                        // `plain_run` stops at 0xC2 only when it encodes a C1 control.
                        i += 2;
                    } else {
                        self.control(b[i], out);
                        i += 1;
                    }
                }
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
                    let c = b[i];
                    match c {
                        0x30..=0x3f => {
                            // `<=>?` mark private sequences (`ESC [ > 4 ; 2 m` is not SGR).
                            if c >= b'<' || self.csi_params.len() >= CSI_PARAMS_CAP {
                                self.csi_is_sgr = false;
                            } else if self.csi_is_sgr {
                                self.csi_params.push(c);
                            }
                        }
                        0x20..=0x2f => self.csi_is_sgr = false,
                        0x40..=0x7e => {
                            if c == b'm' && self.csi_is_sgr {
                                apply_sgr(&mut self.style, &self.csi_params);
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

    /// Text and newlines, no other controls.
    fn plain(&mut self, run: &str, out: &mut Out<'_>) {
        let Some(first) = run.find('\n') else {
            self.text(run, out);
            return;
        };
        let last = run.rfind('\n').unwrap_or(first);
        if first > 0 {
            self.text(&run[..first], out);
        }
        self.end_line(out);
        // The lines in between are complete and hold no `\r`: copy them in one go, the bulk
        // of ordinary output.
        let middle = &run[first + 1..last + 1];
        if out.spans.is_none() || self.style == Style::default() {
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
        add_span(&mut self.line_spans, start, self.line.len(), self.style);
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
    if start == end || style == Style::default() {
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

/// Length of the leading run of `b` (valid UTF-8) that is plain text or newlines: everything
/// except C0 controls other than TAB and LF, DEL, and the C1 controls (`C2 80`–`C2 9F`).
///
/// This is the hot loop for ordinary output, so it skips eight bytes at a time while none of
/// them can need attention.
fn plain_run(b: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // "Some byte of w is below n" (n <= 0x80), exact for the word as a whole; a byte equal to
    // x is a byte of `w ^ x` below 1. TAB and LF make a word "need a look" too, and pass below.
    let has_below = |w: u64, n: u64| w.wrapping_sub(ONES * n) & !w & HIGHS != 0;
    let needs_look = |w: u64| {
        has_below(w, 0x20) || has_below(w ^ (ONES * 0x7f), 1) || has_below(w ^ (ONES * 0xc2), 1)
    };

    let mut i = 0;
    loop {
        while let Some(word) = b.get(i..i + 8) {
            let mut bytes = [0; 8];
            bytes.copy_from_slice(word);
            if needs_look(u64::from_ne_bytes(bytes)) {
                break;
            }
            i += 8;
        }
        let stop = (i + 8).min(b.len());
        while i < stop {
            match b[i] {
                b'\t' | b'\n' | 0x20..=0x7e | 0x80..=0xc1 | 0xc3.. => i += 1,
                0xc2 if b.get(i + 1).is_some_and(|&next| next >= 0xa0) => i += 2,
                _ => return i,
            }
        }
        if i >= b.len() {
            return b.len();
        }
    }
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
