//! The display path (contract §4.1 "Ours", §8): the last lines of a run with their SGR colour spans,
//! for Neovim cards. The model never sees this; it gets the sink's plain text.
//!
//! Bounded like everything else: at most [`MAX_LINES`] lines and [`MAX_BYTES`] bytes are kept,
//! and each line keeps its first [`LINE_CLAMP_CHARS`] characters; the rest is counted and shown
//! as `… [<K> chars omitted]` (contract §8.2), so a gigabyte on one line costs nothing.

use std::collections::VecDeque;

use serde::Serialize;

use crate::sanitize::Span;

/// Characters of one line shown in a card (contract §8.2).
pub const LINE_CLAMP_CHARS: usize = 4000;
/// Lines kept for an expanded card: as many as the model-facing window.
pub const MAX_LINES: usize = 2000;
/// Bytes kept in all (clamped lines of wide characters could otherwise reach 32 MB).
pub const MAX_BYTES: usize = 256 * 1024;
/// Lines sent with a live update: enough for any collapsed or live card.
pub const LIVE_LINES: usize = 40;

/// One display line with its styled byte ranges (offsets into `text`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StyledLine {
    pub text: String,
    pub spans: Vec<Span>,
    /// Characters past the clamp, not kept.
    #[serde(skip)]
    omitted: u64,
    #[serde(skip)]
    chars: usize,
}

impl StyledLine {
    /// The line as shown: clamped text plus the omitted-characters suffix.
    pub fn shown(&self) -> String {
        if self.omitted == 0 {
            self.text.clone()
        } else {
            format!("{}… [{} chars omitted]", self.text, self.omitted)
        }
    }

    fn append(&mut self, seg: &str, seg_offset: usize, spans: &[Span]) {
        // A segment that has no more bytes than the room left has no more characters either:
        // it is kept whole without walking its characters (the common case by far).
        let room = LINE_CLAMP_CHARS.saturating_sub(self.chars);
        let (kept, rest_chars) = match seg.len() <= room {
            true => (seg, 0),
            false => match seg.char_indices().nth(room) {
                Some((cut, _)) => (&seg[..cut], seg[cut..].chars().count()),
                None => (seg, 0),
            },
        };
        let base = self.text.len();
        for sp in spans {
            let (s, e) = (sp.start.max(seg_offset), sp.end.min(seg_offset + kept.len()));
            if s < e {
                self.spans.push(Span {
                    start: base + s - seg_offset,
                    end: base + e - seg_offset,
                    style: sp.style,
                });
            }
        }
        self.text.push_str(kept);
        self.chars += kept.chars().count();
        self.omitted += rest_chars as u64;
    }
}

/// The last lines of a run, styled.
#[derive(Debug, Default)]
pub struct Display {
    lines: VecDeque<StyledLine>,
    bytes: usize,
    /// The line being written (no newline yet).
    current: StyledLine,
}

impl Display {
    pub fn new() -> Display {
        Display::default()
    }

    /// Takes sanitized text and the spans the sanitizer produced for it (offsets into `text`,
    /// in order and not overlapping, as the sanitizer makes them).
    ///
    /// Linear in the text and the spans: each line looks only at the spans that overlap it (a
    /// window that slides forward), not at every span of the chunk.
    pub fn push(&mut self, text: &str, spans: &[Span]) {
        let mut offset = 0;
        let mut first = 0;
        while offset < text.len() {
            let newline = memchr::memchr(b'\n', &text.as_bytes()[offset..]).map(|i| offset + i);
            let content = &text[offset..newline.unwrap_or(text.len())];
            let end = newline.map_or(text.len(), |i| i + 1);
            // Spans that ended before this line are done with; a span that goes on past it
            // stays the first for the next line.
            while spans.get(first).is_some_and(|sp| sp.end <= offset) {
                first += 1;
            }
            let overlapping = spans[first..].iter().take_while(|sp| sp.start < end).count();
            self.current.append(content, offset, &spans[first..first + overlapping]);
            if newline.is_some() {
                let line = std::mem::take(&mut self.current);
                self.bytes += line.text.len();
                self.lines.push_back(line);
                while self.lines.len() > MAX_LINES || self.bytes > MAX_BYTES {
                    let Some(mut old) = self.lines.pop_front() else { break };
                    self.bytes -= old.text.len();
                    // The line that fell out lends its buffers to the next one: a long run
                    // allocates nothing per line once the window is full.
                    if self.current.text.capacity() == 0 {
                        old.text.clear();
                        old.spans.clear();
                        old.omitted = 0;
                        old.chars = 0;
                        self.current = old;
                    }
                }
            }
            offset = end;
        }
    }

    /// The last `n` lines, with `pending` (the sanitizer's unterminated line, unstyled) after the
    /// current partial line when there is one.
    pub fn last(&self, n: usize, pending: &str) -> Vec<StyledLine> {
        let mut current = self.current.clone();
        if !pending.is_empty() {
            current.append(pending, 0, &[]);
        }
        let has_current = !current.text.is_empty() || current.omitted > 0;
        let take = n.saturating_sub(usize::from(has_current)).min(self.lines.len());
        let mut out: Vec<StyledLine> =
            self.lines.iter().skip(self.lines.len() - take).cloned().collect();
        if has_current {
            out.push(current);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sanitize::{Color, Sanitizer, Style};

    fn feed(d: &mut Display, bytes: &[u8]) {
        let mut s = Sanitizer::new();
        let (mut out, mut spans) = (String::new(), Vec::new());
        s.push_styled(bytes, &mut out, &mut spans);
        s.finish_styled(&mut out, &mut spans);
        d.push(&out, &spans);
    }

    #[test]
    fn display_keeps_colours_per_line() {
        let mut d = Display::new();
        feed(&mut d, b"plain\n\x1b[31mred\x1b[0m and \x1b[1mbold\x1b[0m\n");
        let lines = d.last(10, "");
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1].text, "red and bold");
        let red = Style { fg: Some(Color::Indexed(1)), ..Style::default() };
        let bold = Style { bold: true, ..Style::default() };
        assert_eq!(
            lines[1].spans,
            vec![Span { start: 0, end: 3, style: red }, Span { start: 8, end: 12, style: bold }]
        );
    }

    #[test]
    fn display_clamps_long_lines_and_bounds_memory() {
        let mut d = Display::new();
        let long = "é".repeat(LINE_CLAMP_CHARS + 5);
        d.push(&format!("{long}\n"), &[]);
        let l = &d.last(1, "")[0];
        assert_eq!(l.text.chars().count(), LINE_CLAMP_CHARS);
        assert_eq!(l.shown(), format!("{}… [5 chars omitted]", "é".repeat(LINE_CLAMP_CHARS)));
        for i in 0..5000 {
            d.push(&format!("{i}\n"), &[]);
        }
        assert_eq!(d.lines.len(), MAX_LINES);
        assert_eq!(
            d.last(2, "part").iter().map(|l| l.text.as_str()).collect::<Vec<_>>(),
            ["4999", "part"]
        );
    }

    #[test]
    fn display_spans_per_line_in_a_chunk_of_thousands_of_lines() {
        // One chunk, as a fast producer delivers it: every line carries its own colours, and a
        // span that crosses line ends is split across the lines it covers.
        let mut bytes = Vec::new();
        for i in 0..MAX_LINES + 3000 {
            bytes.extend(
                format!("\x1b[3{}m{i:05}\x1b[0m plain \x1b[1mbold\x1b[0m\n", i % 8).as_bytes(),
            );
        }
        bytes.extend(b"\x1b[4mwrapped\nacross\nthree\x1b[0m tail\n");
        let mut d = Display::new();
        feed(&mut d, &bytes);
        let lines = d.last(MAX_LINES, "");
        assert_eq!(lines.len(), MAX_LINES);
        let bold = Style { bold: true, ..Style::default() };
        let under = Style { underline: true, ..Style::default() };
        // MAX_LINES + 3003 lines in all: the first 3003 fell out of the window.
        let first = 3003;
        for (row, line) in lines[..MAX_LINES - 3].iter().enumerate() {
            let i = first + row;
            assert_eq!(line.text, format!("{i:05} plain bold"));
            let fg = Style { fg: Some(Color::Indexed((i % 8) as u8)), ..Style::default() };
            assert_eq!(
                line.spans,
                vec![
                    Span { start: 0, end: 5, style: fg },
                    Span { start: 12, end: 16, style: bold }
                ],
                "line {i}"
            );
        }
        let tail: Vec<_> =
            lines[MAX_LINES - 3..].iter().map(|l| (&l.text[..], &l.spans[..])).collect();
        assert_eq!(
            tail,
            [
                ("wrapped", &[Span { start: 0, end: 7, style: under }][..]),
                ("across", &[Span { start: 0, end: 6, style: under }][..]),
                ("three tail", &[Span { start: 0, end: 5, style: under }][..]),
            ]
        );
    }

    #[test]
    fn display_line_continues_across_pushes() {
        let mut d = Display::new();
        d.push("abc", &[]);
        d.push("def\nx", &[]);
        let lines = d.last(5, "");
        assert_eq!(lines.iter().map(|l| l.text.as_str()).collect::<Vec<_>>(), ["abcdef", "x"]);
    }
}
