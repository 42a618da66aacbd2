//! The terminal a PTY run draws on, and the model-facing text read from it (SPEC §6).
//!
//! A PTY run's text is what a person watching the terminal saw: the rows that scrolled off the
//! top, then the final screen. Cursor movement, `\r` redraws and clears therefore collapse the way
//! they did on screen (`10%\r55%\r100%\n` is the one line `100%`).
//!
//! # Design
//! The `vt100` parser keeps *no* scrollback (capacity 0). Instead every row that leaves the top
//! of the main screen is handed to [`vt100::Callbacks::on_scroll`] exactly once, and we append it
//! to a text buffer right there. The caller drains that buffer after each chunk of output and
//! streams it into the sink. So:
//! - memory is bounded by the screen size whatever the output size (a scrollback of 10 000 rows
//!   would cost ~10 MB of cells and would lose the middle of a long run);
//! - the artifact receives every row, in order, while the command runs;
//! - rows that wrapped are joined back into one line (vt100 knows which rows wrapped), so a
//!   long line is one line for the model, not one per terminal width.
//!
//! Rows are captured in vt100's "basic formatted" form (text plus SGR codes). The caller runs
//! them through the same [`crate::sanitize::Sanitizer`] as pipe output, which removes the SGR
//! codes from the model text (and could keep them as colour spans for a display).
//!
//! At the end, [`Screen::finish`] scrolls the whole final screen out through the same callback,
//! so the final screen is rendered by exactly the code that rendered the history, and drops the
//! blank rows at the bottom: trailing blank screen rows are not output.

use std::fmt::Write as _;
use std::num::NonZeroU16;

use vt100::capture::{BasicFormattedCaptureState, RowContents};

use super::TermSize;

/// Collects the rows that scroll off the top of the screen.
#[derive(Default)]
struct Capture {
    /// Formatted text of the rows captured since the last [`Screen::take_text`].
    text: String,
    /// vt100's state across rows: the pending newline of the previous row (absent when it
    /// wrapped) and the current SGR attributes.
    state: BasicFormattedCaptureState,
    /// Rows of the alternate screen (full-screen programs) are not history: a terminal does not
    /// keep them in its scrollback either. Only the final screen is taken from it.
    take_alternate: bool,
}

impl vt100::Callbacks for Capture {
    fn on_scroll(&mut self, row: RowContents<'_>, alternate_screen: bool) {
        if alternate_screen && !self.take_alternate {
            return;
        }
        // Writing into a String cannot fail.
        let _ = row.write_formatted_basic(&mut self.text, &mut self.state);
    }
}

/// A terminal emulator whose scrolled-off rows become model-facing text.
pub struct Screen {
    parser: vt100::Parser<Capture>,
    /// Newlines at the end of the text taken so far, held back until more text follows, so that
    /// blank rows between output are kept and blank rows at the end are not.
    held_newlines: usize,
    /// Some text was given out: the final text ends with exactly one newline.
    emitted: bool,
}

fn dims(size: TermSize) -> (NonZeroU16, NonZeroU16) {
    let size = size.clamped();
    // Clamped sizes are at least 5 × 20, so never zero; MIN is only a formal fallback.
    (
        NonZeroU16::new(size.rows).unwrap_or(NonZeroU16::MIN),
        NonZeroU16::new(size.cols).unwrap_or(NonZeroU16::MIN),
    )
}

impl Screen {
    pub fn new(size: TermSize) -> Screen {
        let (rows, cols) = dims(size);
        Screen {
            parser: vt100::Parser::new_with_callbacks(rows, cols, 0, Capture::default()),
            held_newlines: 0,
            emitted: false,
        }
    }

    /// Feeds program output.
    pub fn process(&mut self, bytes: &[u8]) {
        self.parser.process(bytes);
    }

    /// Appends the text of the rows that left the screen since the last call (formatted: SGR
    /// codes included, for the sanitizer to strip). Trailing newlines are held back.
    pub fn take_text(&mut self, out: &mut String) {
        let buf = &mut self.parser.callbacks_mut().text;
        if buf.is_empty() {
            return;
        }
        let kept = buf.trim_end_matches('\n').len();
        if kept > 0 {
            out.push_str(&"\n".repeat(self.held_newlines));
            out.push_str(&buf[..kept]);
            self.held_newlines = 0;
            self.emitted = true;
        }
        self.held_newlines += buf.len() - kept;
        buf.clear();
    }

    /// Resizes the screen (clamped as the PTY is). Rows pushed off by a shrink are captured.
    pub fn resize(&mut self, size: TermSize) {
        let (rows, cols) = dims(size);
        self.parser.set_size(rows, cols);
    }

    pub fn size(&self) -> TermSize {
        let (rows, cols) = self.parser.screen().size();
        TermSize { cols: cols.get(), rows: rows.get() }
    }

    /// Whether the program asked for application cursor keys (`ESC [ ? 1 h`): arrows are then
    /// sent as `ESC O A` instead of `ESC [ A`.
    pub fn application_cursor(&self) -> bool {
        self.parser.screen().application_cursor()
    }

    /// The current screen as plain text without its trailing blank rows, for live views.
    pub fn visible_text(&self) -> String {
        let screen = self.parser.screen();
        let (_, cols) = screen.size();
        let mut out = String::new();
        let mut blank_run = 0usize;
        for (i, row) in screen.rows(0, cols.get()).enumerate() {
            if row.trim_end().is_empty() {
                blank_run += 1;
                continue;
            }
            for _ in 0..blank_run {
                out.push('\n');
            }
            blank_run = 0;
            out.push_str(row.trim_end());
            let wrapped = u16::try_from(i).is_ok_and(|i| screen.row_wrapped(i));
            if !wrapped {
                out.push('\n');
            }
        }
        out
    }

    /// Ends the run: appends the final screen (what was visible when the command ended, the
    /// alternate screen if a full-screen program was still showing it) and the final newline.
    pub fn finish(&mut self, out: &mut String) {
        self.parser.callbacks_mut().take_alternate = true;
        let rows = self.parser.screen().size().0.get();
        // Reset the scroll region (rows outside it never scroll off), go to the bottom row and
        // scroll every row out through the capture callback.
        let mut push = String::with_capacity(usize::from(rows) + 16);
        let _ = write!(push, "\x1b[r\x1b[{rows};1H");
        push.push_str(&"\n".repeat(usize::from(rows)));
        self.parser.process(push.as_bytes());
        self.take_text(out);
        if self.emitted {
            out.push('\n');
        }
        self.held_newlines = 0;
        self.emitted = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sanitize::sanitize;

    fn render(bytes: &[u8], size: TermSize) -> String {
        let mut s = Screen::new(size);
        let mut text = String::new();
        s.process(bytes);
        s.take_text(&mut text);
        s.finish(&mut text);
        sanitize(text.as_bytes())
    }

    fn small() -> TermSize {
        TermSize { cols: 20, rows: 5 }
    }

    #[test]
    fn screen_collapses_redraws() {
        assert_eq!(render(b"10%\r55%\r100%\r\n", small()), "100%\n");
        assert_eq!(render(b"aaaa\x1b[1Gbb\r\n", small()), "bbaa\n");
        assert_eq!(render(b"old\r\nstuff\x1b[2J\x1b[Hnew\r\n", small()), "new\n");
        assert_eq!(render(b"", small()), "");
        assert_eq!(render(b"no newline", small()), "no newline\n");
    }

    #[test]
    fn screen_keeps_history_and_inner_blank_lines_in_order() {
        let mut input = Vec::new();
        for i in 0..12 {
            input.extend_from_slice(format!("line {i}\r\n").as_bytes());
            if i == 3 {
                input.extend_from_slice(b"\r\n\r\n");
            }
        }
        let mut want = String::new();
        for i in 0..12 {
            want.push_str(&format!("line {i}\n"));
            if i == 3 {
                want.push_str("\n\n");
            }
        }
        assert_eq!(render(&input, small()), want);
    }

    #[test]
    fn screen_streams_history_while_running() {
        let mut s = Screen::new(small());
        let mut text = String::new();
        for i in 0..8 {
            s.process(format!("l{i}\r\n").as_bytes());
        }
        s.take_text(&mut text);
        // 8 lines and the cursor row on a 5-row screen: 4 rows have left it.
        assert_eq!(sanitize(text.as_bytes()), "l0\nl1\nl2\nl3");
        s.finish(&mut text);
        assert_eq!(sanitize(text.as_bytes()), "l0\nl1\nl2\nl3\nl4\nl5\nl6\nl7\n");
    }

    #[test]
    fn screen_joins_wrapped_rows() {
        let long = "x".repeat(45);
        assert_eq!(
            render(format!("{long}\r\nend\r\n").as_bytes(), small()),
            format!("{long}\nend\n")
        );
    }

    #[test]
    fn screen_strips_colours_and_takes_final_alternate_screen() {
        assert_eq!(render(b"\x1b[31mred\x1b[0m plain\r\n", small()), "red plain\n");
        assert_eq!(render(b"shell\r\n\x1b[?1049h\x1b[Hfull screen", small()), "full screen\n");
        assert_eq!(
            render(b"before\r\n\x1b[?1049h\x1b[Hfull\x1b[?1049lafter\r\n", small()),
            "before\nafter\n"
        );
    }

    #[test]
    fn screen_visible_text_and_modes() {
        let mut s = Screen::new(TermSize { cols: 10, rows: 2 });
        assert_eq!(s.size(), TermSize { cols: 20, rows: 5 });
        s.process(b"a\r\n\r\nb\r\n");
        assert_eq!(s.visible_text(), "a\n\nb\n");
        assert!(!s.application_cursor());
        s.process(b"\x1b[?1h");
        assert!(s.application_cursor());
        s.resize(TermSize { cols: 1000, rows: 1000 });
        assert_eq!(s.size(), TermSize { cols: 400, rows: 200 });
    }
}
