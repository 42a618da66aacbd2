//! The terminal a PTY run draws on, and the model-facing text read from it (contract §6).
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
//!
//! # Fast path for plain lines
//! vt100 costs about 2 µs per short line (it renders each scrolled row cell by cell), three times
//! what the kernel's PTY costs: `yes` through the PTY would run at a third of its speed. But most
//! bulk output is plain lines (`[ -~]*\r\n` with at most colour codes, shorter than the width)
//! streaming at the bottom of the screen, and their fate is known without emulation: each is
//! written on the blank cursor row, scrolls up, and leaves the screen `rows - 1` lines later,
//! unchanged. So when the cursor
//! is at the start of a blank bottom row (main screen, no scroll region), plain lines are
//! *deferred* instead of parsed. Once more than `rows - 1` are deferred, the oldest ones would
//! have scrolled off: the rows above the cursor are scrolled out of the parser once ("flush"),
//! and from then on the oldest deferred line is appended to the text directly. The last
//! `rows - 1` lines stay deferred. Anything else (an escape sequence, a `\r` redraw, a long
//! line, a query of the screen) first *materializes* the deferred lines: they are parsed for
//! real (after a flush: from the top of the now blank screen, where they would be), so the
//! parser's screen is exactly what it would have been. A partial plain line at the end of a
//! chunk is carried, as it may still turn into a deferred line; reads end anywhere, so it may
//! stop inside a colour sequence or between `\r` and `\n` (the whole line is checked once its
//! `\n` arrives). Property tests check the result
//! against the parser alone.

use std::collections::VecDeque;
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
        let start = self.text.len();
        // Writing into a String cannot fail.
        let _ = row.write_formatted_basic(&mut self.text, &mut self.state);
        // The newline written first ends the previous row: its padding is not text.
        if self.text[start..].starts_with('\n') && ends_blank(&self.text[..start]) {
            let rest = self.text.split_off(start);
            trim_row_end(&mut self.text);
            self.text.push_str(&rest);
        }
    }
}

/// The text ends with a space, or with an SGR code that may follow spaces.
fn ends_blank(text: &str) -> bool {
    text.ends_with(' ') || text.ends_with('m')
}

/// Where the blank end of the last row of `text` starts: the spaces there (a terminal row's
/// padding, or cells cleared to spaces), with the SGR codes among and after them. `text.len()`
/// when the row does not end with a space.
fn blank_tail_start(text: &str) -> usize {
    let bytes = text.as_bytes();
    let mut pos = bytes.len();
    let mut start = bytes.len();
    loop {
        if pos > 0 && bytes[pos - 1] == b' ' {
            pos -= 1;
            start = pos;
        } else if pos > 0 && bytes[pos - 1] == b'm' {
            // `ESC [ <digits ; :> m`
            let mut i = pos - 1;
            while i > 0
                && (bytes[i - 1].is_ascii_digit() || bytes[i - 1] == b';' || bytes[i - 1] == b':')
            {
                i -= 1;
            }
            if i >= 2 && bytes[i - 1] == b'[' && bytes[i - 2] == 0x1b {
                pos = i - 2;
            } else {
                break;
            }
        } else {
            break;
        }
    }
    start
}

/// Removes the spaces at the end of the last row of `text`, keeping its SGR codes (the colour
/// state after the row stays what the terminal had).
fn trim_row_end(text: &mut String) {
    let start = blank_tail_start(text);
    if start == text.len() {
        return;
    }
    let codes: String = text[start..].split(' ').collect();
    text.truncate(start);
    text.push_str(&codes);
}

/// A terminal emulator whose scrolled-off rows become model-facing text.
pub struct Screen {
    parser: vt100::Parser<Capture>,
    /// Newlines at the end of the text taken so far, held back until more text follows, so that
    /// blank rows between output are kept and blank rows at the end are not.
    held_newlines: usize,
    /// Some text was given out: the final text ends with exactly one newline.
    emitted: bool,
    /// Plain lines (without their `\r\n`) not yet given to the parser; see the module docs.
    deferred: VecDeque<Vec<u8>>,
    /// Emptied line buffers, reused.
    spare: Vec<Vec<u8>>,
    /// The parser's rows above the cursor were scrolled out for the deferred lines.
    flushed: bool,
    /// The plain start of a line whose end has not arrived yet (only while deferring is allowed).
    partial: Vec<u8>,
    /// Tracks the parser's sequence state and scroll regions from the bytes it gets.
    region: RegionScan,
    /// Scratch buffer for the colour sequences of lines appended directly.
    sgr: Vec<u8>,
    /// Scratch buffer for a carried partial line joined with the next piece.
    joined: Vec<u8>,
    /// Times deferred lines had to be parsed after all (tests check the fast path holds).
    materialized: u64,
    /// The parser's colour state is known to be the default: the last bytes it got were the
    /// colour sequences of a deferred line, ending in a full reset.
    attrs_reset: bool,
    /// Plain lines parsed in a row: deferring starts only in a run of them.
    plain_streak: usize,
    /// [`DEFER_AFTER`] (0 in tests, to exercise the fast path as often as possible).
    defer_after: usize,
    /// The fast path is on (off only to check it against the parser alone).
    fast: bool,
}

/// Plain lines parsed in a row before deferring is tried: checking whether it is allowed reads a
/// whole screen row, which costs more than it saves when plain and other lines alternate.
const DEFER_AFTER: usize = 8;

/// What the parser's input says about its state, as far as the fast path needs it: whether the
/// parser is between sequences (a line is only plain if it does not finish an escape sequence,
/// string or UTF-8 character cut at the end of the previous chunk), and whether the main screen
/// may have a scroll region (vt100 does not expose it). It mirrors how vt100 (through vte)
/// handles `CSI <top>;<bottom> r` (per screen), the alternate screen switches (`CSI ? 47 h/l`,
/// `CSI ? 1049 h/l`) and RIS (`ESC c`). Conservative: any `CSI <params> r` counts as a region;
/// only `CSI r` and RIS remove it; an unreadable sequence sets it for good.
#[derive(Debug, Default)]
struct RegionScan {
    state: ScanState,
    params: Vec<u8>,
    intermediates: bool,
    /// Continuation bytes still expected by a UTF-8 character.
    utf8_pending: u8,
    /// The scanner believes the alternate screen is shown.
    alt: bool,
    main_region: bool,
    /// A sequence was too long to read: assume a region until RIS.
    unsure: bool,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ScanState {
    #[default]
    Ground,
    Esc,
    /// `ESC` and intermediate bytes (`ESC ( B`).
    EscIntermediate,
    Csi,
    /// OSC, DCS, SOS, PM, APC: a string that only BEL (OSC), ST or CAN/SUB ends.
    Str,
}

/// Longest parameter string read; longer ones make the scanner unsure.
const MAX_SCAN_PARAMS: usize = 64;

impl RegionScan {
    fn region_possible(&self) -> bool {
        self.main_region || self.unsure
    }

    /// The parser is between sequences and characters.
    fn at_ground(&self) -> bool {
        self.state == ScanState::Ground && self.utf8_pending == 0
    }

    fn feed(&mut self, bytes: &[u8]) {
        if self.at_ground() && !bytes.iter().any(|&b| b == 0x1b || b >= 0x80) {
            return;
        }
        for &b in bytes {
            match (self.state, b) {
                (_, 0x1b) => {
                    self.state = ScanState::Esc;
                    self.utf8_pending = 0;
                }
                // CAN and SUB abort a sequence.
                (_, 0x18 | 0x1a) => self.state = ScanState::Ground,
                (ScanState::Ground, _) => self.utf8(b),
                (ScanState::Esc, b'[') => {
                    self.state = ScanState::Csi;
                    self.params.clear();
                    self.intermediates = false;
                }
                (ScanState::Esc, b']' | b'P' | b'X' | b'^' | b'_') => self.state = ScanState::Str,
                (ScanState::Esc, b'c') => *self = RegionScan::default(),
                (ScanState::Esc | ScanState::EscIntermediate, 0x20..=0x2f) => {
                    self.state = ScanState::EscIntermediate;
                }
                (ScanState::Esc | ScanState::EscIntermediate, 0x30..=0x7e) => {
                    self.state = ScanState::Ground;
                }
                (ScanState::Csi, 0x30..=0x3f) => {
                    if self.params.len() < MAX_SCAN_PARAMS {
                        self.params.push(b);
                    } else {
                        self.unsure = true;
                    }
                }
                (ScanState::Csi, 0x20..=0x2f) => self.intermediates = true,
                (ScanState::Csi, 0x40..=0x7e) => {
                    self.state = ScanState::Ground;
                    self.dispatch(b);
                }
                (ScanState::Str, 0x07) => self.state = ScanState::Ground,
                // Anything else inside a sequence or string (C0 controls are executed, string
                // bytes collected) leaves the state as it is.
                _ => {}
            }
        }
    }

    /// Tracks UTF-8 characters in ground state (vte holds a cut character until it is whole).
    fn utf8(&mut self, b: u8) {
        self.utf8_pending = match b {
            0x80..=0xbf => self.utf8_pending.saturating_sub(1),
            0xc0..=0xdf => 1,
            0xe0..=0xef => 2,
            0xf0..=0xf7 => 3,
            _ => 0,
        };
    }

    fn dispatch(&mut self, fin: u8) {
        if self.intermediates {
            return;
        }
        let private = self.params.first().is_some_and(|p| (b'<'..=b'?').contains(p));
        match fin {
            b'r' if !private && !self.alt => self.main_region = !self.params.is_empty(),
            b'h' | b'l' if self.params.first() == Some(&b'?') => {
                let switches =
                    self.params[1..].split(|&c| c == b';').any(|p| p == b"47" || p == b"1049");
                if switches {
                    self.alt = fin == b'h';
                }
            }
            _ => {}
        }
    }
}

fn dims(size: TermSize) -> (NonZeroU16, NonZeroU16) {
    let size = size.clamped();
    // Clamped sizes are at least 5 × 20, so never zero; MIN is only a formal fallback.
    (
        NonZeroU16::new(size.rows).unwrap_or(NonZeroU16::MIN),
        NonZeroU16::new(size.cols).unwrap_or(NonZeroU16::MIN),
    )
}

/// The width in cells of a plain line's text, `None` when it is not plain. Plain: printable
/// ASCII (one cell per byte) and SGR sequences (`ESC [ <digits ; :> m`: colours, which never
/// move the cursor).
fn plain_width(text: &[u8]) -> Option<usize> {
    let mut width = 0;
    let mut i = 0;
    while i < text.len() {
        // Printable ASCII up to the next escape, checked in one pass the compiler vectorizes.
        let run = memchr::memchr(0x1b, &text[i..]).unwrap_or(text.len() - i);
        let bad = text[i..i + run].iter().fold(false, |bad, b| bad | !(0x20..=0x7e).contains(b));
        if bad {
            return None;
        }
        width += run;
        i += run;
        match text.get(i) {
            None => break,
            Some(0x1b) if text.get(i + 1) == Some(&b'[') => {
                let params =
                    text[i + 2..].iter().position(|b| !matches!(b, b'0'..=b'9' | b';' | b':'));
                let end = i + 2 + params?;
                if text[end] != b'm' {
                    return None;
                }
                i = end + 1;
            }
            _ => return None,
        }
    }
    Some(width)
}

/// [`plain_width`] of the start of a line whose end has not arrived yet (a read of the PTY ends
/// anywhere): it may also stop inside an SGR sequence (`ESC`, `ESC [`, `ESC [ 3 1`) or right
/// after the `\r` of its `\r\n`, which the next piece completes. Whether the whole line is plain
/// is decided once its `\n` has arrived.
fn partial_width(text: &[u8]) -> Option<usize> {
    if let Some(width) = plain_width(text) {
        return Some(width);
    }
    if let Some(body) = text.strip_suffix(b"\r") {
        return plain_width(body);
    }
    let esc = text.iter().rposition(|&b| b == 0x1b)?;
    let open = match &text[esc + 1..] {
        [] => true,
        [b'[', params @ ..] => params.iter().all(|b| matches!(b, b'0'..=b'9' | b';' | b':')),
        _ => false,
    };
    if open {
        plain_width(&text[..esc])
    } else {
        None
    }
}

/// Longest carried partial line: past it a line is parsed (a line of colour codes without end
/// would otherwise be re-checked from its start on every read).
const MAX_PARTIAL: usize = 4096;

/// A cell as a fresh row has it: no text and no attributes. A cell painted by an erase in a
/// background colour has no text but shows (and is captured as a space), so it is not blank.
fn untouched(cell: &vt100::Cell) -> bool {
    !cell.has_contents()
        && cell.fgcolor() == vt100::Color::Default
        && cell.bgcolor() == vt100::Color::Default
        && !(cell.bold() || cell.dim() || cell.italic() || cell.underline() || cell.inverse())
}

/// The SGR sequences of a plain line that decide the colour state it leaves, for the parser to
/// keep that state when the line's text is not parsed: those from the last full reset
/// (`ESC [ m`, `ESC [ 0 m`) on, since a reset forgets everything before it.
fn sgr_only(line: &[u8], out: &mut Vec<u8>) {
    let mut rest = line;
    while let Some(start) = memchr::memchr(0x1b, rest) {
        let seq = &rest[start..];
        let len = seq.iter().position(|&b| b == b'm').map_or(seq.len(), |p| p + 1);
        if matches!(&seq[..len], b"\x1b[0m" | b"\x1b[m") {
            out.clear();
        }
        out.extend_from_slice(&seq[..len]);
        rest = &seq[len..];
    }
}

impl Screen {
    pub fn new(size: TermSize) -> Screen {
        let (rows, cols) = dims(size);
        Screen {
            parser: vt100::Parser::new_with_callbacks(rows, cols, 0, Capture::default()),
            held_newlines: 0,
            emitted: false,
            deferred: VecDeque::new(),
            spare: Vec::new(),
            flushed: false,
            partial: Vec::new(),
            region: RegionScan::default(),
            sgr: Vec::new(),
            joined: Vec::new(),
            materialized: 0,
            attrs_reset: false,
            plain_streak: 0,
            defer_after: DEFER_AFTER,
            fast: true,
        }
    }

    /// Feeds program output.
    pub fn process(&mut self, mut input: &[u8]) {
        while !input.is_empty() {
            let (piece, complete) = match input.iter().position(|&b| b == b'\n') {
                Some(i) => (&input[..=i], true),
                None => (input, false),
            };
            input = &input[piece.len()..];
            // The line's own test first: it is cheap and fails at once on escape sequences,
            // while the screen test reads a whole row.
            let cols = usize::from(self.size().cols);
            let fits = self.line_width(piece, complete).is_some_and(|w| w < cols);
            let streak = self.plain_streak >= self.defer_after;
            if fits && self.fast && streak && self.may_defer() {
                if complete {
                    // `line_width` checked that the line ends with `\r\n`.
                    let mut line = self.spare.pop().unwrap_or_default();
                    line.clear();
                    line.append(&mut self.partial);
                    line.extend_from_slice(piece);
                    line.truncate(line.len() - 2);
                    self.defer(line);
                } else {
                    self.partial.extend_from_slice(piece);
                }
                continue;
            }
            self.materialize();
            self.feed(piece);
            if !fits {
                self.plain_streak = 0;
            } else if complete {
                self.plain_streak += 1;
            }
        }
    }

    /// The width of the plain line that the carried partial line and `piece` make (`piece` ends
    /// the line when `complete`, and the line must then end with `\r\n`); `None` when it is not
    /// plain (or not yet known to be).
    fn line_width(&mut self, piece: &[u8], complete: bool) -> Option<usize> {
        let width = |line: &[u8]| match complete {
            true => line[..line.len() - 1].strip_suffix(b"\r").and_then(plain_width),
            false => partial_width(line),
        };
        if self.partial.is_empty() {
            return width(piece);
        }
        if self.partial.len() + piece.len() > MAX_PARTIAL {
            return None;
        }
        // Once per read at most: only a line cut by the end of a read is carried.
        let mut whole = std::mem::take(&mut self.joined);
        whole.clear();
        whole.extend_from_slice(&self.partial);
        whole.extend_from_slice(piece);
        let w = width(&whole);
        self.joined = whole;
        w
    }

    /// Gives bytes to the parser, watching for scroll regions.
    fn feed(&mut self, bytes: &[u8]) {
        self.region.feed(bytes);
        self.attrs_reset = false;
        self.parser.process(bytes);
    }

    /// Whether plain lines may be deferred now: some already are (the parser has not changed
    /// since), or the parser is between sequences and the cursor is at the start of an untouched
    /// bottom row of the main screen with no scroll region.
    fn may_defer(&self) -> bool {
        if !self.deferred.is_empty() || !self.partial.is_empty() {
            return true;
        }
        let screen = self.parser.screen();
        let (rows, cols) = screen.size();
        let bottom = rows.get() - 1;
        self.region.at_ground()
            && !self.region.region_possible()
            && screen.cursor_position() == (bottom, 0)
            && !screen.alternate_screen()
            && (0..cols.get()).all(|c| screen.cell(bottom, c).is_none_or(untouched))
    }

    fn defer(&mut self, line: Vec<u8>) {
        self.deferred.push_back(line);
        let keep = usize::from(self.size().rows) - 1;
        if self.deferred.len() <= keep {
            return;
        }
        if !self.flushed {
            // The deferred lines would start a new logical line only if the row above the
            // cursor did not wrap into the cursor row; otherwise parse them for real.
            if self.parser.screen().row_wrapped(self.size().rows - 2) {
                self.materialize();
                return;
            }
            // Scroll every row above the cursor out (they are captured), as the deferred lines
            // would have.
            let lfs = vec![b'\n'; keep];
            self.parser.process(&lfs);
            self.flushed = true;
        }
        while self.deferred.len() > keep {
            let Some(line) = self.deferred.pop_front() else { break };
            // After a flush the capture owes the previous row its newline: the row before a
            // plain line never wrapped into it.
            let text = &mut self.parser.callbacks_mut().text;
            trim_row_end(text);
            text.push('\n');
            // Its colours go to the text as they are (the sanitizer strips them) and to the
            // parser, whose colour state must be what parsing the line would have left.
            text.push_str(std::str::from_utf8(&line).unwrap_or_default());
            if line.contains(&0x1b) {
                let mut sgr = std::mem::take(&mut self.sgr);
                sgr.clear();
                sgr_only(&line, &mut sgr);
                // A lone reset on top of a reset changes nothing (lines that close their own
                // colours, the usual case, then cost the parser nothing).
                let lone_reset = sgr == b"\x1b[0m" || sgr == b"\x1b[m";
                if !(lone_reset && self.attrs_reset) {
                    self.parser.process(&sgr);
                }
                self.attrs_reset = lone_reset;
                self.sgr = sgr;
            }
            self.spare.push(line);
        }
    }

    /// Parses the deferred lines and the carried partial line for real.
    fn materialize(&mut self) {
        if self.deferred.is_empty() && self.partial.is_empty() {
            return;
        }
        self.materialized += 1;
        self.attrs_reset = false;
        if self.flushed {
            // The flushed screen is blank with the cursor at the bottom; the deferred lines are
            // the last rows - 1 lines, which fill it from the top.
            self.parser.process(b"\x1b[1;1H");
            self.flushed = false;
        }
        while let Some(line) = self.deferred.pop_front() {
            self.parser.process(&line);
            self.parser.process(b"\r\n");
            self.spare.push(line);
        }
        if !self.partial.is_empty() {
            let partial = std::mem::take(&mut self.partial);
            // It may end inside a colour sequence, which the next bytes complete.
            self.region.feed(&partial);
            self.parser.process(&partial);
            self.partial = partial;
            self.partial.clear();
        }
    }

    /// Appends the text of the rows that left the screen since the last call (formatted: SGR
    /// codes included, for the sanitizer to strip). Trailing newlines are held back.
    pub fn take_text(&mut self, out: &mut String) {
        let buf = &mut self.parser.callbacks_mut().text;
        if buf.is_empty() {
            return;
        }
        let kept = buf.trim_end_matches('\n').len();
        // A last row that has not ended yet keeps its blank end back: the newline that ends it
        // trims it (the row may also wrap, and then the spaces are text).
        let end = if kept == buf.len() { blank_tail_start(&buf[..kept]) } else { kept };
        if end > 0 {
            out.push_str(&"\n".repeat(self.held_newlines));
            out.push_str(&buf[..end]);
            self.held_newlines = 0;
            self.emitted = true;
        }
        if kept == buf.len() {
            buf.drain(..end);
        } else {
            self.held_newlines += buf.len() - kept;
            buf.clear();
        }
    }

    /// Resizes the screen (clamped as the PTY is). Rows pushed off by a shrink are captured.
    pub fn resize(&mut self, size: TermSize) {
        self.materialize();
        let (rows, cols) = dims(size);
        self.parser.set_size(rows, cols);
    }

    pub fn size(&self) -> TermSize {
        let (rows, cols) = self.parser.screen().size();
        TermSize { cols: cols.get(), rows: rows.get() }
    }

    /// Whether the program asked for application cursor keys (`ESC [ ? 1 h`): arrows are then
    /// sent as `ESC O A` instead of `ESC [ A`. (Deferred lines cannot change modes.)
    pub fn application_cursor(&self) -> bool {
        self.parser.screen().application_cursor()
    }

    /// The current screen as plain text without its trailing blank rows, for live views.
    pub fn visible_text(&mut self) -> String {
        self.materialize();
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

    /// For live views: the rows that left the screen but were not taken yet (parsing deferred
    /// lines makes some), then [`Screen::visible_text`]. Takes nothing: the text stays in order
    /// for [`Screen::take_text`].
    pub fn live_text(&mut self) -> String {
        let screen = self.visible_text();
        let pending = &self.parser.callbacks().text;
        if pending.is_empty() {
            return screen;
        }
        let mut out: String = vt100::capture::basic_formatted_to_plain(pending).collect();
        out.push('\n');
        out.push_str(&screen);
        out
    }

    /// Ends the run: appends the final screen (what was visible when the command ended, the
    /// alternate screen if a full-screen program was still showing it) and the final newline.
    pub fn finish(&mut self, out: &mut String) {
        self.materialize();
        self.parser.callbacks_mut().take_alternate = true;
        let rows = self.parser.screen().size().0.get();
        // Reset the scroll region (rows outside it never scroll off), go to the bottom row and
        // scroll every row out through the capture callback.
        let mut push = String::with_capacity(usize::from(rows) + 16);
        let _ = write!(push, "\x1b[r\x1b[{rows};1H");
        push.push_str(&"\n".repeat(usize::from(rows)));
        self.parser.process(push.as_bytes());
        self.take_text(out);
        // The blank end of the last row (when the screen's bottom row had text).
        self.parser.callbacks_mut().text.clear();
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
    use proptest::prelude::*;

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
        // Plain lines may still be deferred; a look at the screen parses them.
        s.visible_text();
        s.take_text(&mut text);
        // 8 lines and the cursor row on a 5-row screen: 4 rows have left it.
        assert_eq!(sanitize(text.as_bytes()), "l0\nl1\nl2\nl3");
        s.finish(&mut text);
        assert_eq!(sanitize(text.as_bytes()), "l0\nl1\nl2\nl3\nl4\nl5\nl6\nl7\n");
    }

    #[test]
    fn screen_text_has_no_padding_spaces_or_rows() {
        // Rows padded to the width (progress lines, full-width tables), with colours.
        let pad = format!("abc{}\r\n", " ".repeat(17));
        let full = format!("{}\r\n", "x".repeat(20));
        let coloured = "\x1b[41mred   \x1b[0m  \r\n";
        let mut input = String::new();
        for _ in 0..6 {
            input.push_str(&pad);
            input.push_str(&full);
            input.push_str(coloured);
        }
        input.push_str("last   ");
        let text = render(input.as_bytes(), small());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 19, "{text:?}");
        for chunk in lines[..18].chunks(3) {
            assert_eq!(chunk, ["abc", "x".repeat(20).as_str(), "red"], "{text:?}");
        }
        assert_eq!(lines[18], "last");
        // A space at the wrap point of a long line is text.
        let wrapped = format!("{} {}\r\n", "a".repeat(19), "b".repeat(5));
        assert_eq!(
            render(wrapped.as_bytes(), small()),
            format!("{} {}\n", "a".repeat(19), "b".repeat(5))
        );
        // Colours after trimmed spaces survive for the next row.
        let mut s = Screen::new(small());
        let mut raw = String::new();
        s.process(b"\x1b[31mab   \r\ncd\r\n");
        s.take_text(&mut raw);
        s.finish(&mut raw);
        assert_eq!(raw, "\x1b[31mab\ncd\n");
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

    /// One piece of terminal output, for the property test below.
    fn piece() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            // Plain lines dominate, as in real output.
            6 => "[ -~]{0,12}".prop_map(|t| format!("{t}\r\n").into_bytes()),
            1 => "[ -~]{0,30}".prop_map(|t| t.into_bytes()),
            1 => "[a-z]{0,8}".prop_map(|t| format!("\x1b[3{}m{t}\x1b[0m\r\n", t.len() % 8).into_bytes()),
            1 => "[a-z]{1,6}".prop_map(|t| format!("10%\r{t}\r\n").into_bytes()),
            1 => (1u8..4, "[a-z]{1,5}").prop_map(|(n, t)| format!("\x1b[{n}A\r{t}\x1b[{n}B\r").into_bytes()),
            // Colours that outlive their line, a background that erases paint.
            1 => "[a-z]{0,8}".prop_map(|t| format!("\x1b[1;4{}m{t}\r\n", t.len() % 8).into_bytes()),
            1 => Just(b"\x1b[44m".to_vec()),
            1 => Just(b"\x1b[m".to_vec()),
            1 => Just(b"\x1b[2A\x1b[K\x1b[2B".to_vec()),
            1 => Just(b"\x1b[2;4r".to_vec()),
            1 => Just(b"\x1b[2;5r".to_vec()),
            1 => Just(b"\x1b[5;1H".to_vec()),
            // A wrapped row above a blank cursor row.
            1 => "[a-z]{21,39}".prop_map(|t| format!("{t}\r\x1b[K").into_bytes()),
            1 => Just(b"\x1b[r".to_vec()),
            1 => Just(b"\x1b[?1049h".to_vec()),
            1 => Just(b"\x1b[?1049l".to_vec()),
            1 => Just(b"\x1b[?47h".to_vec()),
            1 => Just(b"\x1b[?47l".to_vec()),
            1 => Just(b"\x1bc".to_vec()),
            // Sequences, strings and characters that plain text may complete.
            1 => Just(b"\x1b[?10".to_vec()),
            1 => Just(b"\x1b]0;title ".to_vec()),
            1 => Just(b"\x07".to_vec()),
            1 => Just(b"\x1b(".to_vec()),
            1 => Just(vec![0xe4, 0xb8]),
            1 => Just(b"\x1b[2J\x1b[H".to_vec()),
            1 => Just(b"\n".to_vec()),
            1 => Just("h\u{e9}llo \u{4e16}\u{754c}\r\n".as_bytes().to_vec()),
            1 => "[a-z]{25,50}".prop_map(|t| format!("{t}\r\n").into_bytes()),
        ]
    }

    /// Runs `input` split at `cuts` through a screen; returns the text and the screen shown
    /// after each chunk (when `look` says so).
    fn drive(
        mut screen: Screen,
        input: &[u8],
        cuts: &[usize],
        look: &[bool],
    ) -> (String, Vec<String>) {
        let mut text = String::new();
        let mut seen = Vec::new();
        let mut at = 0;
        for (i, &cut) in cuts.iter().chain(std::iter::once(&input.len())).enumerate() {
            let cut = cut.clamp(at, input.len());
            screen.process(&input[at..cut]);
            at = cut;
            screen.take_text(&mut text);
            if look.get(i).copied().unwrap_or(false) {
                seen.push(screen.visible_text());
            }
        }
        screen.finish(&mut text);
        // Compared as the model sees it: SGR codes may differ (deferred lines are appended
        // without the colour they were printed in), the text may not.
        (sanitize(text.as_bytes()), seen)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        #[test]
        fn screen_fast_path_matches_the_parser(
            pieces in proptest::collection::vec(piece(), 0..120),
            mut cuts in proptest::collection::vec(0usize..4000, 0..12),
            look in proptest::collection::vec(any::<bool>(), 12),
            defer_after in prop_oneof![3 => Just(0usize), 1 => Just(DEFER_AFTER)],
        ) {
            let input: Vec<u8> = pieces.concat();
            cuts.sort_unstable();
            let size = TermSize { cols: 20, rows: 5 };
            let mut slow = Screen::new(size);
            slow.fast = false;
            let mut fast = Screen::new(size);
            fast.defer_after = defer_after;
            let fast = drive(fast, &input, &cuts, &look);
            let slow = drive(slow, &input, &cuts, &look);
            prop_assert_eq!(fast, slow);
        }
    }

    #[test]
    fn screen_fast_path_edge_cases() {
        let size = TermSize { cols: 20, rows: 5 };
        let lines = "1\r\n2\r\n3\r\n4\r\n";
        let tail = "d\r\ne\r\nf\r\ng\r\nh\r\n";
        // Each case is two chunks: the second starts with a line that may be deferred.
        let cases: Vec<(Vec<u8>, String)> = vec![
            // A wrapped row right above the blank cursor row.
            (format!("{lines}abcdefghijklmnopqrstuvwxy\r\x1b[K").into(), format!("a\r\n{tail}")),
            // A scroll region that keeps the last row out / the first row out.
            (b"\x1b[2;4r\x1b[5;1H".to_vec(), format!("a\r\n{tail}")),
            (b"top\x1b[2;5r\x1b[5;1H".to_vec(), format!("a\r\n{tail}")),
            // A background colour set by a line that is never parsed, then an erase that paints.
            (lines.into(), "\x1b[44mX\r\nY\r\nY\r\nY\r\nY\r\n\x1b[K".into()),
            // A cursor row painted by an erase in a background colour: not blank.
            (format!("{lines}\x1b[44m\x1b[K\x1b[m").into(), format!("a\r\n{tail}")),
            // A line that completes a sequence, a string or a character cut by the chunk.
            (format!("{lines}\x1b[?10").into(), format!("abc\r\n{tail}")),
            (format!("{lines}\x1b]0;ti").into(), format!("tle\r\n{tail}\x07")),
            ([lines.as_bytes(), &[0xe4]].concat(), format!("x\r\n{tail}")),
            // A plain line cut inside its colour sequence, or between its `\r` and `\n`.
            (format!("{lines}ab\x1b[3").into(), format!("1mcd\x1b[0m\r\n{tail}")),
            (format!("{lines}ab\x1b").into(), format!("[1mcd\x1b[0m\r\n{tail}")),
            (format!("{lines}ab\r").into(), format!("\ncd\r\n{tail}")),
            // A cut sequence that turns out not to be a colour, or a `\r` that redraws.
            (format!("{lines}abc\x1b[1").into(), format!("Dx\r\n{tail}")),
            (format!("{lines}abc\r").into(), format!("x\r\n{tail}")),
        ];
        for (first, second) in &cases {
            let input = [first.as_slice(), second.as_bytes()].concat();
            let mut slow = Screen::new(size);
            slow.fast = false;
            let mut fast = Screen::new(size);
            fast.defer_after = 0;
            let want = drive(slow, &input, &[first.len()], &[]);
            let got = drive(fast, &input, &[first.len()], &[]);
            assert_eq!(got, want, "{:?}", String::from_utf8_lossy(&input));
        }
    }

    #[test]
    fn screen_fast_path_streams_plain_lines() {
        let mut s = Screen::new(small());
        let mut text = String::new();
        let input: String = (0..1000).map(|i| format!("{i}\r\n")).collect();
        for chunk in input.as_bytes().chunks(77) {
            s.process(chunk);
            s.take_text(&mut text);
        }
        // All but the last 4 lines left through the fast path without being parsed.
        assert_eq!(s.deferred.len(), 4);
        s.finish(&mut text);
        let want: String = (0..1000).map(|i| format!("{i}\n")).collect();
        assert_eq!(sanitize(text.as_bytes()), want);
    }

    #[test]
    fn screen_fast_path_streams_coloured_lines_cut_anywhere() {
        // Reads of a PTY end anywhere, also inside a colour sequence or a `\r\n`: the lines
        // still leave through the fast path.
        let input: String =
            (0..1000).map(|i| format!("\x1b[3{}m{i}\x1b[0m tail\r\n", i % 8)).collect();
        for size in [7, 13, 64] {
            let mut s = Screen::new(small());
            let mut text = String::new();
            for chunk in input.as_bytes().chunks(size) {
                s.process(chunk);
                s.take_text(&mut text);
            }
            assert_eq!(s.materialized, 0, "chunks of {size}: deferred lines were parsed");
            assert_eq!(s.deferred.len(), 4, "chunks of {size}");
            s.finish(&mut text);
            let want: String = (0..1000).map(|i| format!("{i} tail\n")).collect();
            assert_eq!(sanitize(text.as_bytes()), want, "chunks of {size}");
        }
    }

    #[test]
    fn screen_partial_width() {
        assert_eq!(partial_width(b"ab"), Some(2));
        assert_eq!(partial_width(b"ab\r"), Some(2));
        assert_eq!(partial_width(b"ab\x1b"), Some(2));
        assert_eq!(partial_width(b"ab\x1b[3"), Some(2));
        assert_eq!(partial_width(b"\x1b[31mab\x1b[0;4"), Some(2));
        assert_eq!(partial_width(b"ab\x1b[?"), None);
        assert_eq!(partial_width(b"ab\x1b]0"), None);
        assert_eq!(partial_width(b"a\rb"), None);
        assert_eq!(partial_width(b"ab\x1b[3\r"), None);
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
