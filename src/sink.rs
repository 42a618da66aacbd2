//! contract §4.2: the bounded tail window, truthful counters, spill to an artifact, live-update
//! throttle; and contract §1 (Ours): head/tail limits applied over the full stream.
//!
//! The [`Sink`] takes sanitized text in arbitrary chunks. It keeps:
//! - the tail window: the longest suffix of the stream that starts at a line start and fits
//!   both `max_bytes` and `max_lines`; when the last line alone is longer than `max_bytes`, the
//!   end of that line, cut at a character boundary;
//! - with a head limit, a second window over the first N lines only (the head part);
//! - counters of everything pushed;
//! - from the first overflow on, the artifact: everything so far, then every chunk, written on
//!   a thread of its own ([`ArtifactWriter`]).
//!
//! Memory is bounded by a few windows whatever the stream's size: chunks larger than the window
//! are not copied whole, and the window's buffer is compacted once its dropped prefix is as
//! large as what it keeps (so compaction is amortized O(1) per byte).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::artifacts::{self, ArtifactStore, ArtifactWriter, DEFAULT_ARTIFACT_CAP};
use crate::rescue::{Rescue, Rescued};

/// Why the window is shorter than the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TruncatedBy {
    Bytes,
    Lines,
}

/// What the sink hands to result shaping when the command is over.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct SinkOutput {
    /// Model-facing text: head/tail applied over the full stream, bounded by the window.
    pub text: String,
    pub total_bytes: u64,
    pub total_lines: u64,
    /// Counters of `text`.
    pub output_bytes: u64,
    pub output_lines: u64,
    /// `text` is not the whole output.
    pub truncated: bool,
    pub truncated_by: Option<TruncatedBy>,
    /// 1-based inclusive line range of the full output that `text` shows.
    pub shown_range: Option<(u64, u64)>,
    /// The artifact holding the whole output; `None` when there is none, or when it could not
    /// be created or completely written ([`SinkOutput::artifact_error`] says why).
    pub artifact_id: Option<u64>,
    /// Why the whole output could not be saved (a failed create or write: full disk, file size
    /// limit, unwritable directory).
    pub artifact_error: Option<String>,
    /// The window's line limit (0: the default), which the notice names when lines cut.
    pub max_lines: u64,
    /// Diagnostics of the part of the output the window cut off (contract §7, [`crate::rescue`]).
    pub rescued: Vec<Rescued>,
}

/// Window size limit in bytes (contract §4.2: 50 KiB).
pub const DEFAULT_MAX_BYTES: usize = 50 * 1024;

/// Window size limit in lines (contract §4.2 Ours).
pub const DEFAULT_MAX_LINES: usize = 2000;

/// Bytes a head-only run may still push after its N lines before [`Sink::should_close`] says
/// to close the pipe (contract §1 Ours): the artifact gets this much more, then the producer gets
/// SIGPIPE as under `| head`.
pub const HEAD_DRAIN: usize = 1 << 20;

/// ... or this long after the N-th line, whichever comes first: a slow producer
/// (`while :; do echo x; sleep 0.1; done | head -n 3`) ends as promptly as under bash.
pub const HEAD_CLOSE_AFTER: Duration = Duration::from_millis(100);

/// Minimum time between two live updates of one command: at most 20 per second (contract §4.2).
pub const LIVE_UPDATE_INTERVAL: Duration = Duration::from_millis(50);

/// The smallest usable `max_bytes`: one character of any width always fits.
const MIN_WINDOW_BYTES: usize = 4;

/// Limits of one command's sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkConfig {
    /// Window limit in bytes; values below 4 are raised to 4 so a character always fits.
    pub max_bytes: usize,
    /// Window limit in lines; 0 is raised to 1.
    pub max_lines: usize,
    /// Show only the first N lines of the output (`Some(0)`: none).
    pub head: Option<usize>,
    /// Show only the last N lines (of the head part when both are set; `Some(0)`: none).
    pub tail: Option<usize>,
    /// Size cap of the artifact file in bytes.
    pub artifact_cap: u64,
    /// The head limit was extracted from the command (`| head -n N`), so the stream may be
    /// closed once the head part is complete ([`Sink::should_close`]); a caller's explicit head
    /// only limits what is shown (contract §1).
    pub close_after_head: bool,
    /// The tail limit stands for a stripped `| tail` stage: the text pushed apart (the
    /// command's stderr, [`Sink::push_apart`]) comes before the tail's lines, as bash prints
    /// it (contract §1).
    pub stage_tail: bool,
}

impl Default for SinkConfig {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_MAX_BYTES,
            max_lines: DEFAULT_MAX_LINES,
            head: None,
            tail: None,
            artifact_cap: DEFAULT_ARTIFACT_CAP,
            close_after_head: false,
            stage_tail: false,
        }
    }
}

/// The output sink of one command. See the module docs.
#[derive(Debug)]
pub struct Sink {
    tail_limit: Option<usize>,
    close_after_head: bool,
    artifact_cap: u64,
    store: Option<Arc<ArtifactStore>>,
    /// The tail window over the whole stream; also carries the stream's counters.
    window: Window,
    /// With a head limit: the window over the head part.
    head: Option<HeadPart>,
    /// Set on the first overflow: whether the artifact was attempted.
    spilled: bool,
    artifact: Option<ArtifactWriter>,
    artifact_id: Option<u64>,
    artifact_error: Option<String>,
    /// Rescued lines (contract §7): sees every chunk, and counts its newlines for the sink in the
    /// same pass; none with a head limit, whose window keeps the start anyway.
    rescue: Option<Rescue>,
    /// With an extracted head ([`SinkConfig::close_after_head`]): bytes the producer wrote past
    /// the head part. Bash would never have printed them, so they are kept nowhere and counted
    /// nowhere but here, for [`Sink::should_close`] (contract §1: counts are of what bash would
    /// have printed).
    past_head: u64,
    /// [`SinkConfig::stage_tail`] with no head limit (with one, head first, then tail, as ever:
    /// contract §1), and once stderr came, the two streams apart ([`Apart`]).
    stage_tail: bool,
    apart: Option<Box<Apart>>,
}

/// The two streams of a stripped `| tail` stage once its command wrote to stderr: bash prints
/// the stderr as it comes and the stage's last lines of stdout at the end.
#[derive(Debug)]
struct Apart {
    /// The window over stdout alone.
    stdout: Window,
    /// The window over the stderr.
    stderr: Window,
}

impl Sink {
    pub fn new(config: SinkConfig, store: Option<Arc<ArtifactStore>>) -> Self {
        let max_bytes = config.max_bytes.max(MIN_WINDOW_BYTES);
        let max_lines = config.max_lines.max(1);
        Self {
            tail_limit: config.tail,
            close_after_head: config.close_after_head,
            artifact_cap: config.artifact_cap,
            store,
            window: Window::new(max_bytes, max_lines),
            head: config.head.map(|limit| HeadPart {
                remaining: limit,
                window: Window::new(max_bytes, max_lines),
            }),
            spilled: false,
            artifact: None,
            artifact_id: None,
            artifact_error: None,
            rescue: config
                .head
                .is_none()
                .then(|| Rescue::new(artifacts::verbatim_prefix(config.artifact_cap))),
            past_head: 0,
            stage_tail: config.stage_tail && config.tail.is_some() && config.head.is_none(),
            apart: None,
        }
    }

    /// Turns rescued lines off (benchmarks compare the sink with and without them).
    pub fn without_rescue(mut self) -> Self {
        self.rescue = None;
        self
    }

    /// Takes the next chunk of sanitized text (any size, not necessarily whole lines).
    pub fn push(&mut self, text: &str) {
        let text = self.printed(text);
        if text.is_empty() {
            return;
        }
        let newlines = self.record(text);
        self.keep(text, newlines);
    }

    /// Counts a chunk's newlines (once: every consumer needs them) and writes it to the artifact,
    /// opening it on the first overflow.
    fn record(&mut self, text: &str) -> usize {
        let newlines = self.count(text);
        if self.spilled {
            self.write_artifact(text);
        } else if self.overflows_with(text, newlines) {
            self.spill(text);
        }
        newlines
    }

    /// Like [`push`](Self::push), for a caller that is done with `text`: once the artifact is
    /// being written, a large chunk's buffer is handed to the writer rather than copied. `text`
    /// is left empty, possibly holding another buffer to reuse.
    pub fn push_owned(&mut self, text: &mut String) {
        if self.artifact.is_none() || self.close_after_head {
            self.push(text);
            text.clear();
            return;
        }
        let newlines = self.count(text);
        self.keep(text, newlines);
        let written = self.artifact.as_mut().map_or(Ok(()), |writer| writer.write_owned(text));
        if let Err(e) = written {
            self.artifact = None;
            self.note_artifact_error("writing the artifact failed", &e);
        }
        text.clear();
    }

    /// The part of a chunk bash would have printed: with an extracted head, what falls within
    /// the head part (the rest only counts towards [`Sink::should_close`]); all of it otherwise.
    fn printed<'t>(&mut self, text: &'t str) -> &'t str {
        let Some(head) = self.head.as_ref().filter(|_| self.close_after_head) else {
            return text;
        };
        let keep = head.share(text);
        self.past_head += (text.len() - keep) as u64;
        &text[..keep]
    }

    /// The newlines of a chunk: the rescue counts them in its own pass over the chunk.
    fn count(&mut self, text: &str) -> usize {
        match &mut self.rescue {
            Some(rescue) => usize::try_from(rescue.push(text.as_bytes())).unwrap_or(usize::MAX),
            None => count_newlines(text),
        }
    }

    /// The window's (and the head part's) share of a chunk.
    fn keep(&mut self, text: &str, newlines: usize) {
        if let Some(head) = &mut self.head {
            head.push(text);
        }
        if let Some(apart) = &mut self.apart {
            apart.stdout.push(text, newlines);
        }
        self.window.push(text, newlines);
    }

    /// Takes the next chunk of the command's stderr, kept apart from a stripped stage's limit
    /// (contract §1: bash prints it past the stage). It counts, spills and shows like the rest,
    /// but takes no line of a head limit; with a stripped `| tail` it comes before the tail's
    /// lines.
    pub fn push_apart(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        let newlines = self.record(text);
        if let Some(head) = &mut self.head {
            head.window.push(text, newlines);
        }
        if self.stage_tail {
            // Until now the window held stdout alone: it starts the stdout window.
            let window = &self.window;
            let apart = self.apart.get_or_insert_with(|| {
                Box::new(Apart {
                    stdout: window.clone(),
                    stderr: Window::new(window.max_bytes, window.max_lines),
                })
            });
            apart.stderr.push(text, newlines);
        }
        self.window.push(text, newlines);
    }

    /// The current tail window (for live updates).
    pub fn window(&self) -> &str {
        self.window.text()
    }

    pub fn total_bytes(&self) -> u64 {
        self.window.pushed_bytes
    }

    /// Lines as a person sees them: `"a\n"` is 1, `"a\nb"` is 2, `""` is 0.
    pub fn total_lines(&self) -> u64 {
        self.window.pushed_lines()
    }

    /// The id of the artifact, once a spill has created it.
    pub fn artifact_id(&self) -> Option<u64> {
        self.artifact_id
    }

    /// Why the artifact could not be created or written, if it could not.
    pub fn artifact_error(&self) -> Option<&str> {
        self.artifact_error.as_deref()
    }

    /// Whether the executor should close the output pipe now (contract §1 Ours, head-only rule).
    ///
    /// True exactly when the head limit came from the command ([`SinkConfig::close_after_head`]),
    /// the head part is complete (its N lines, each with its newline, have been pushed) and at
    /// least [`HEAD_DRAIN`] bytes have been pushed after it. The producer then gets SIGPIPE on
    /// its next write, as it would under `| head -n N`; the artifact, the window and the
    /// counters hold the head part only (what bash printed). The other bound of the rule (100 ms after the N-th line) is the
    /// executor's clock: see [`Sink::head_complete`].
    pub fn should_close(&self) -> bool {
        self.head_complete() && self.past_head >= HEAD_DRAIN as u64
    }

    /// Whether the stream may be closed early and its head part is complete: from then on the
    /// executor closes the stream at the latest [`HEAD_CLOSE_AFTER`] later.
    pub fn head_complete(&self) -> bool {
        self.close_after_head && self.head.as_ref().is_some_and(|h| h.remaining == 0)
    }

    /// Ends the stream: finishes the artifact and shapes the model-facing text.
    ///
    /// Text: the window over the head part (with a head limit) or over the whole stream, then
    /// its last `tail` lines. This equals applying head then tail to the full text and then
    /// bounding the result by the window limits (keeping its end).
    pub fn finish(mut self) -> SinkOutput {
        if let Some(writer) = self.artifact.take() {
            if let Err(e) = writer.finish() {
                self.note_artifact_error("finishing the artifact failed", &e);
            }
        }
        if let (Some(apart), Some(n)) = (self.apart.take(), self.tail_limit) {
            return self.finish_apart(&apart, n);
        }
        // The part of the stream the head limit selects (all of it without one).
        let selected = self.head.as_ref().map_or(&self.window, |h| &h.window);
        let window = selected.text();
        let text = match self.tail_limit {
            Some(n) => last_lines(window, n),
            None => window,
        };
        // Only the window counts as truncation: head and tail limits are what the caller asked
        // for (the model sees exactly what `| head -n N` would print), while a window cut hides
        // lines the limits selected. When the tail limit left fewer lines than the window holds,
        // the window did not cut anything the caller wanted.
        let tail_cut = text.len() < window.len();
        let window_cut = (window.len() as u64) < selected.pushed_bytes;
        let selected_lines = selected.pushed_lines();
        let wanted = self.tail_limit.map_or(selected_lines, |n| selected_lines.min(n as u64));
        let output_lines = count_lines(text);
        let truncated = window_cut
            && (output_lines < wanted || (!tail_cut && selected.mid_line && output_lines > 0));
        let truncated_by = truncated.then(|| selected.cut_by());
        let text = text.to_owned();
        self.output(text, truncated_by, selected_lines)
    }

    /// The output of [`Sink::finish`]: `text` (`truncated_by` when it is not all the limits
    /// selected), shown as the lines of the stream that end at line `last`.
    fn output(&mut self, text: String, truncated_by: Option<TruncatedBy>, last: u64) -> SinkOutput {
        let truncated = truncated_by.is_some();
        let output_lines = count_lines(&text);
        let shown_range = (output_lines > 0).then(|| (last + 1 - output_lines, last));
        let rescued = match (self.rescue.take(), truncated) {
            (Some(rescue), true) => rescue.finish(shown_range.map_or(last + 1, |r| r.0), &text),
            _ => Vec::new(),
        };
        SinkOutput {
            total_bytes: self.window.pushed_bytes,
            total_lines: self.window.pushed_lines(),
            output_bytes: text.len() as u64,
            output_lines,
            text,
            truncated,
            truncated_by,
            shown_range,
            // A partly written artifact is not the full output: it is not offered as one.
            artifact_id: self.artifact_id.filter(|_| self.artifact_error.is_none()),
            artifact_error: self.artifact_error.take(),
            max_lines: self.window.max_lines as u64,
            rescued,
        }
    }

    /// [`Sink::finish`] for a stripped `| tail` whose command wrote to stderr: the stderr, then
    /// the last `n` lines of stdout, bounded by the window (keeping the end). It is not one
    /// stretch of the stream (the artifact holds the stream in the order it came), so the range
    /// named is the stream's last lines, as many as are shown.
    fn finish_apart(mut self, apart: &Apart, n: usize) -> SinkOutput {
        // What bash prints is the whole stderr, then the last `n` lines of stdout (`wanted`
        // lines): its window. When the stdout window holds fewer, those `n` lines alone overflow
        // the window, which then lies within them and is the stdout window's. Else it holds them
        // all, and any stderr that fits with them lies within the stderr window.
        let tail = last_lines(apart.stdout.text(), n);
        let wanted = apart.stdout.pushed_lines().min(n as u64);
        let whole_tail = count_lines(tail) >= wanted;
        let mut composed = String::new();
        if whole_tail {
            let stderr = apart.stderr.text();
            // A window that starts inside its line has no line start to show from, unless
            // nothing follows it.
            let from = match apart.stderr.mid_line && !tail.is_empty() {
                true => stderr.find('\n').map_or(stderr.len(), |p| p + 1),
                false => 0,
            };
            composed.push_str(&stderr[from..]);
        }
        composed.push_str(tail);
        let mut shown = Window::new(self.window.max_bytes, self.window.max_lines);
        shown.push(&composed, count_newlines(&composed));
        let text = shown.text();
        let stderr_cut = (apart.stderr.text().len() as u64) < apart.stderr.pushed_bytes;
        let truncated = !whole_tail || text.len() < composed.len() || stderr_cut;
        let truncated_by = truncated.then(|| match (whole_tail, text.len() < composed.len()) {
            (false, _) => apart.stdout.cut_by(),
            (true, true) => shown.cut_by(),
            (true, false) => apart.stderr.cut_by(),
        });
        let last = self.window.pushed_lines();
        self.output(text.to_owned(), truncated_by, last)
    }

    /// Whether the stream no longer fits the window once `text` is added.
    fn overflows_with(&self, text: &str, newlines: usize) -> bool {
        let bytes = self.window.pushed_bytes + text.len() as u64;
        let newlines = self.window.pushed_newlines + newlines as u64;
        let lines = newlines + u64::from(!text.ends_with('\n'));
        bytes > self.window.max_bytes as u64 || lines > self.window.max_lines as u64
    }

    /// The first overflow: open the artifact and write everything so far, then `text`.
    fn spill(&mut self, text: &str) {
        self.spilled = true;
        let Some(store) = &self.store else { return };
        match store.create() {
            Ok((id, file)) => {
                self.artifact_id = Some(id);
                // Until now the whole stream fitted the window, so its buffer holds all of it.
                let written =
                    ArtifactWriter::spawn(file, self.artifact_cap).and_then(|mut writer| {
                        writer.write(self.window.whole_stream().as_bytes())?;
                        writer.write(text.as_bytes())?;
                        Ok(writer)
                    });
                match written {
                    Ok(writer) => self.artifact = Some(writer),
                    Err(e) => self.note_artifact_error("writing the artifact failed", &e),
                }
            }
            Err(e) => self.note_artifact_error("creating the artifact failed", &e),
        }
    }

    /// Appends to the artifact. A write error stops writing for this command; the id is kept,
    /// since the file still holds the stream up to the error.
    fn write_artifact(&mut self, text: &str) {
        let Some(writer) = &mut self.artifact else {
            return;
        };
        if let Err(e) = writer.write(text.as_bytes()) {
            self.artifact = None;
            self.note_artifact_error("writing the artifact failed", &e);
        }
    }

    fn note_artifact_error(&mut self, what: &str, e: &std::io::Error) {
        tracing::warn!(error = %e, id = ?self.artifact_id, "{what}; output stays truncated");
        self.artifact_error = Some(format!("{what}: {e}"));
    }
}

/// The head part: the first N lines of the stream, seen through its own window.
#[derive(Debug)]
struct HeadPart {
    /// Newlines still to take before the head part is complete.
    remaining: usize,
    window: Window,
}

impl HeadPart {
    fn push(&mut self, text: &str) {
        let (end, newlines) = self.take(text);
        self.remaining -= newlines;
        self.window.push(&text[..end], newlines);
    }

    /// How many bytes of `text` belong to the head part.
    fn share(&self, text: &str) -> usize {
        self.take(text).0
    }

    /// The bytes of `text` that belong to the head part, and the newlines among them.
    fn take(&self, text: &str) -> (usize, usize) {
        let mut end = 0;
        let mut newlines = 0;
        while newlines < self.remaining {
            match memchr::memchr(b'\n', &text.as_bytes()[end..]) {
                Some(p) => {
                    end += p + 1;
                    newlines += 1;
                }
                None => return (text.len(), newlines),
            }
        }
        (end, newlines)
    }
}

/// A bounded tail window over a stream, with the stream's counters.
///
/// Invariant: `buf[start..]` is the canonical window of the stream (see the module docs);
/// `buf[..start]` is dropped text awaiting compaction. After a chunk larger than the window,
/// `buf[0]` may be a context byte only (the byte before the window's possible starts).
#[derive(Debug, Clone)]
struct Window {
    max_bytes: usize,
    max_lines: usize,
    buf: String,
    start: usize,
    /// Newlines in `buf[start..]`.
    newlines: usize,
    /// The window does not start at a line start (its line alone is longer than the window).
    mid_line: bool,
    pushed_bytes: u64,
    pushed_newlines: u64,
    ends_with_newline: bool,
}

impl Window {
    fn new(max_bytes: usize, max_lines: usize) -> Self {
        Self {
            max_bytes,
            max_lines,
            buf: String::new(),
            start: 0,
            newlines: 0,
            mid_line: false,
            pushed_bytes: 0,
            pushed_newlines: 0,
            ends_with_newline: false,
        }
    }

    fn text(&self) -> &str {
        &self.buf[self.start..]
    }

    fn pushed_lines(&self) -> u64 {
        self.pushed_newlines + u64::from(self.pushed_bytes > 0 && !self.ends_with_newline)
    }

    /// The whole stream; only meaningful while it fits the window (nothing dropped yet).
    fn whole_stream(&self) -> &str {
        &self.buf
    }

    /// Appends `text`, which holds `newlines` newlines.
    fn push(&mut self, text: &str, newlines: usize) {
        if text.is_empty() {
            return;
        }
        self.pushed_bytes += text.len() as u64;
        self.pushed_newlines += newlines as u64;
        self.ends_with_newline = text.ends_with('\n');
        if text.len() > self.max_bytes {
            // The window lies within the chunk's last `max_bytes` bytes; keep those plus at
            // least one byte before them, to tell whether they start a line.
            let keep_from = floor_char_boundary(text, text.len() - self.max_bytes - 1);
            self.buf.clear();
            self.buf.push_str(&text[keep_from..]);
            self.start = 0;
            self.newlines = count_newlines(&self.buf);
            // `buf[0]` is context: never a window start.
            self.mid_line = true;
        } else {
            self.buf.push_str(text);
            self.newlines += newlines;
        }
        self.settle();
        if self.start > 0 && self.start >= self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
    }

    /// Visible lines of `buf[s..]` given its newline count.
    fn lines_from(&self, s: usize, newlines: usize) -> usize {
        if s >= self.buf.len() {
            0
        } else {
            newlines + usize::from(!self.buf.ends_with('\n'))
        }
    }

    /// Moves `start` forward to the canonical window of the stream. The canonical start never
    /// moves backwards as text is appended, so the search starts from the current one.
    fn settle(&mut self) {
        let len = self.buf.len();
        let bytes = self.buf.as_bytes();
        let ends_newline = self.buf.ends_with('\n');
        let target = len.saturating_sub(self.max_bytes);
        // A newline before the last byte means a line starts inside the window.
        let line_start_inside = self.newlines > usize::from(ends_newline);
        if self.start >= target
            && self.lines_from(self.start, self.newlines) <= self.max_lines
            && !(self.mid_line && line_start_inside)
        {
            return;
        }
        // The first line start at or after `lo` fits the byte limit.
        let lo = target.max(self.start);
        let mut s = if (lo == self.start && !self.mid_line) || (lo > 0 && bytes[lo - 1] == b'\n') {
            lo
        } else {
            find_newline(&self.buf, lo).map_or(len, |p| p + 1)
        };
        let mut newlines = self.newlines - count_newlines(&self.buf[self.start..s]);
        // Then drop whole lines until the line limit holds.
        while s < len && self.lines_from(s, newlines) > self.max_lines {
            match find_newline(&self.buf, s) {
                Some(p) => {
                    s = p + 1;
                    newlines -= 1;
                }
                None => break,
            }
        }
        if s >= len && len > 0 {
            // No line start leaves a non-empty window: the last line alone is longer than the
            // window, show its end.
            s = ceil_char_boundary(&self.buf, lo);
            newlines = self.newlines - count_newlines(&self.buf[self.start..s]);
        }
        if s != self.start {
            self.mid_line = bytes[s - 1] != b'\n';
        }
        self.start = s;
        self.newlines = newlines;
    }

    /// Which limit made the window shorter than the stream: the line limit when the window is
    /// full of lines, else the byte limit.
    fn cut_by(&self) -> TruncatedBy {
        let lines = self.lines_from(self.start, self.newlines);
        if !self.mid_line && lines >= self.max_lines {
            TruncatedBy::Lines
        } else {
            TruncatedBy::Bytes
        }
    }
}

/// Throttles live updates: the first call is ready, then at most one per interval. The caller
/// sends a final update at the end regardless.
#[derive(Debug, Clone)]
pub struct Throttle {
    min_interval: Duration,
    last: Option<Instant>,
}

impl Throttle {
    pub fn new(min_interval: Duration) -> Self {
        Self { min_interval, last: None }
    }

    /// Whether an update may be sent at `now`; if so, `now` counts as the last update.
    pub fn ready(&mut self, now: Instant) -> bool {
        let ready = match self.last {
            None => true,
            Some(last) => now.saturating_duration_since(last) >= self.min_interval,
        };
        if ready {
            self.last = Some(now);
        }
        ready
    }
}

impl Default for Throttle {
    fn default() -> Self {
        Self::new(LIVE_UPDATE_INTERVAL)
    }
}

/// Lines as a person sees them: `"a\n"` is 1, `"a\nb"` is 2, `""` is 0.
pub fn count_lines(text: &str) -> u64 {
    count_newlines(text) as u64 + u64::from(!text.is_empty() && !text.ends_with('\n'))
}

/// The first `n` lines of `text` (each with its newline); all of it when it has no more.
pub fn first_lines(text: &str, n: usize) -> &str {
    let mut end = 0;
    for _ in 0..n {
        match find_newline(text, end) {
            Some(p) => end = p + 1,
            None => return text,
        }
    }
    &text[..end]
}

/// The last `n` lines of `text`; a final newline ends the last line rather than starting an
/// empty one, so `tail = N` on newline-terminated text gives N real lines.
pub fn last_lines(text: &str, n: usize) -> &str {
    if n == 0 {
        return &text[text.len()..];
    }
    let body = text.strip_suffix('\n').unwrap_or(text);
    let mut start = body.len();
    for _ in 0..n {
        match body[..start].rfind('\n') {
            Some(p) => start = p,
            None => return text,
        }
    }
    &text[start + 1..]
}

/// Counts `\n` bytes (`memchr` counts with SIMD).
fn count_newlines(text: &str) -> usize {
    memchr::memchr_iter(b'\n', text.as_bytes()).count()
}

/// The index of the first `\n` at or after byte `from` (any index; a newline never sits inside
/// a character, so searching from the next character boundary is the same).
fn find_newline(text: &str, from: usize) -> Option<usize> {
    let from = ceil_char_boundary(text, from);
    memchr::memchr(b'\n', &text.as_bytes()[from..]).map(|p| from + p)
}

fn floor_char_boundary(text: &str, mut i: usize) -> usize {
    if i >= text.len() {
        return text.len();
    }
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_char_boundary(text: &str, mut i: usize) -> usize {
    if i >= text.len() {
        return text.len();
    }
    while !text.is_char_boundary(i) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;

    fn config(max_bytes: usize, max_lines: usize) -> SinkConfig {
        SinkConfig { max_bytes, max_lines, ..SinkConfig::default() }
    }

    fn numbered(range: std::ops::RangeInclusive<u32>) -> String {
        range.map(|i| format!("line{i}\n")).collect()
    }

    fn run(config: SinkConfig, chunks: &[&str]) -> SinkOutput {
        let mut sink = Sink::new(config, None);
        for chunk in chunks {
            sink.push(chunk);
        }
        sink.finish()
    }

    fn store() -> (tempfile::TempDir, Arc<ArtifactStore>) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(ArtifactStore::new(dir.path().join("artifacts")));
        (dir, store)
    }

    /// The window by its definition: the longest line-start suffix within both limits, else
    /// the end of the last line cut at a character boundary.
    fn model_window(text: &str, max_bytes: usize, max_lines: usize) -> &str {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1).filter(|&s| s < text.len()));
        for s in starts {
            let w = &text[s..];
            if w.len() <= max_bytes && count_lines(w) as usize <= max_lines {
                return w;
            }
        }
        let mut s = text.len().saturating_sub(max_bytes);
        while !text.is_char_boundary(s) {
            s += 1;
        }
        &text[s..]
    }

    /// Head then tail, by splitting into lines.
    fn model_head_tail(text: &str, head: Option<usize>, tail: Option<usize>) -> String {
        let lines: Vec<&str> = text.split_inclusive('\n').collect();
        let lines = &lines[..head.unwrap_or(usize::MAX).min(lines.len())];
        let lines = &lines[lines.len().saturating_sub(tail.unwrap_or(usize::MAX))..];
        lines.concat()
    }

    #[test]
    fn sink_counts_lines_as_a_person_sees_them() {
        for (text, lines) in [("", 0), ("a\n", 1), ("a\nb", 2), ("\n", 1), ("\n\n", 2)] {
            let out = run(SinkConfig::default(), &[text]);
            assert_eq!((out.total_lines, out.output_lines), (lines, lines), "{text:?}");
            assert_eq!(out.total_bytes, text.len() as u64);
            assert!(!out.truncated);
        }
        let empty = run(SinkConfig::default(), &[]);
        assert_eq!(empty.shown_range, None);
        assert_eq!(empty.truncated_by, None);
    }

    #[test]
    fn sink_window_is_limited_by_lines() {
        let text = numbered(1..=10_000);
        let mut sink = Sink::new(SinkConfig::default(), None);
        for line in text.split_inclusive('\n') {
            sink.push(line);
        }
        assert_eq!(sink.window(), numbered(8001..=10_000));
        let out = sink.finish();
        assert_eq!(out.text, numbered(8001..=10_000));
        assert_eq!((out.total_lines, out.output_lines), (10_000, 2000));
        assert_eq!(out.shown_range, Some((8001, 10_000)));
        assert_eq!(out.truncated_by, Some(TruncatedBy::Lines));
        assert!(out.truncated);
    }

    #[test]
    fn sink_window_is_limited_by_bytes_and_starts_at_a_line() {
        // 1000 lines of 100 bytes: 51200 bytes hold 512 whole lines.
        let line = |i: u32| format!("{i:099}\n");
        let text: String = (1..=1000).map(line).collect();
        let out = run(SinkConfig::default(), &[&text]);
        assert_eq!(out.output_bytes, 51_200);
        assert_eq!(out.text, (489..=1000).map(line).collect::<String>());
        assert_eq!(out.truncated_by, Some(TruncatedBy::Bytes));
        assert_eq!(out.shown_range, Some((489, 1000)));

        // Lines of 30 bytes: 51200 is not a multiple, the window starts at the next line.
        let line = |i: u32| format!("{i:029}\n");
        let text: String = (1..=3000).map(line).collect();
        let out = run(config(51_200, 5000), &[&text]);
        assert_eq!(out.output_bytes, 1706 * 30);
        assert!(out.text.starts_with(&line(1295)));
    }

    #[test]
    fn sink_keeps_the_end_of_a_single_long_line() {
        let text = format!("{}\u{e9}end", "x".repeat(100 * 1024));
        let out = run(config(6, 5), &[&text]);
        assert_eq!(out.text, "x\u{e9}end");
        // 4 bytes back lands inside "é": the window starts after it.
        let out = run(config(4, 5), &[&text]);
        assert_eq!(out.text, "end");
        assert_eq!(out.truncated_by, Some(TruncatedBy::Bytes));
        assert_eq!(out.shown_range, Some((1, 1)));

        // Pushed in pieces, and then a short line after it: the window moves to that line.
        let mut sink = Sink::new(SinkConfig::default(), None);
        for _ in 0..100 {
            sink.push(&"y".repeat(1024));
        }
        assert_eq!(sink.window().len(), DEFAULT_MAX_BYTES);
        sink.push("\nshort\n");
        assert_eq!(sink.window(), "short\n");
        let out = sink.finish();
        assert_eq!(out.shown_range, Some((2, 2)));
    }

    #[test]
    fn sink_spills_exactly_on_first_overflow() {
        let (_dir, store) = store();
        let mut sink = Sink::new(config(10, 3), Some(store.clone()));
        sink.push("ab\ncd\n");
        sink.push("ef");
        assert_eq!(sink.artifact_id(), None, "3 lines, 8 bytes still fit");
        assert!(store.ids().is_empty(), "no id taken without a spill");
        sink.push("\n");
        assert_eq!(sink.artifact_id(), None, "3 lines, 9 bytes still fit");
        sink.push("g");
        assert_eq!(sink.artifact_id(), Some(0), "4 lines overflow");
        sink.push("h\nijklmnopq\n");
        let out = sink.finish();
        assert_eq!(out.artifact_id, Some(0));
        assert_eq!(out.text, "ijklmnopq\n");
        assert_eq!(std::fs::read_to_string(store.path(0)).unwrap(), "ab\ncd\nef\ngh\nijklmnopq\n");

        // A run that fits takes no id; the next spill gets the next id.
        let out = run(config(10, 3), &["fits\n"]);
        assert_eq!(out.artifact_id, None);
        let mut sink = Sink::new(config(10, 3), Some(store.clone()));
        sink.push("0123456789A");
        assert_eq!(sink.finish().artifact_id, Some(1));
        assert_eq!(store.ids(), vec![0, 1]);
    }

    /// Rescued lines and a capped artifact (contract §4.2, §7): a diagnostic in the part the artifact
    /// keeps verbatim is rescued with its line number, which is its line in the artifact; one in
    /// the elided middle is not (no line of the artifact holds it), nor one in the kept end
    /// outside the window (its line number in the artifact depends on where the kept end
    /// starts, which is decided when the artifact is finished, after the line went by).
    #[test]
    fn sink_rescues_only_where_a_capped_artifact_is_verbatim() {
        let (_dir, store) = store();
        let cap = 1 << 20;
        let config = SinkConfig { artifact_cap: cap, ..SinkConfig::default() };
        let mut sink = Sink::new(config, Some(store.clone()));
        let mut text = String::new();
        for i in 1..=80_000u64 {
            match i {
                10 => text.push_str("error: early\n"),
                40_000 => text.push_str("error: elided\n"),
                70_000 => text.push_str("error: in the kept end\n"),
                _ => text.push_str(&format!("line {i} of plain output\n")),
            }
        }
        assert!(text.len() as u64 > 2 * cap - (cap >> 3), "{}", text.len());
        for chunk in text.as_bytes().chunks(64 << 10) {
            sink.push(std::str::from_utf8(chunk).unwrap());
        }
        let out = sink.finish();
        assert!(out.truncated);
        assert_eq!(out.rescued, vec![Rescued { line: 10, text: "error: early".into() }]);
        let artifact = std::fs::read_to_string(store.path(out.artifact_id.unwrap())).unwrap();
        let lines: Vec<&str> = artifact.lines().collect();
        assert_eq!(lines[9], "error: early");
        assert!(artifact.contains(" bytes elided \u{2026}]\n"));
        assert!(!artifact.contains("error: elided"));
        assert!(artifact.contains("error: in the kept end\n"));
        assert!(!out.text.contains("error: in the kept end"));
    }

    #[test]
    fn sink_continues_without_artifact_when_creation_fails() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, "").unwrap();
        // The artifacts directory would have to live under a regular file.
        let store = Arc::new(ArtifactStore::new(blocker.join("artifacts")));
        let mut sink = Sink::new(config(4, 1), Some(store));
        sink.push("a\nb\n");
        assert!(sink.artifact_error().is_some());
        let out = sink.finish();
        assert_eq!(out.artifact_id, None);
        assert_eq!(out.text, "b\n");
        assert!(out.truncated);
    }

    #[test]
    fn sink_applies_head_and_tail_over_the_full_stream() {
        let text = numbered(1..=5);
        let cases = [
            (Some(2), None, "line1\nline2\n", Some((1, 2))),
            (None, Some(2), "line4\nline5\n", Some((4, 5))),
            (Some(4), Some(2), "line3\nline4\n", Some((3, 4))),
            (Some(9), None, text.as_str(), Some((1, 5))),
            (None, Some(5), text.as_str(), Some((1, 5))),
            (Some(0), None, "", None),
            (None, Some(0), "", None),
        ];
        for (head, tail, want, range) in cases {
            let config = SinkConfig { head, tail, ..SinkConfig::default() };
            let out = run(config, &[&text]);
            assert_eq!(out.text, want, "head {head:?} tail {tail:?}");
            assert_eq!(out.text, model_head_tail(&text, head, tail));
            assert_eq!(out.shown_range, range);
            // Limits the caller asked for are not truncation.
            assert!(!out.truncated);
            assert_eq!(out.truncated_by, None);
        }

        // Over a stream far longer than the window: the head part is the stream's start.
        let text = numbered(1..=10_000);
        let head = SinkConfig { head: Some(3), ..SinkConfig::default() };
        let out = run(head, &[&text]);
        assert_eq!(out.text, numbered(1..=3));
        assert_eq!(out.shown_range, Some((1, 3)));
        assert_eq!(out.truncated_by, None);
        let tail = SinkConfig { tail: Some(1000), ..SinkConfig::default() };
        let out = run(tail, &[&text]);
        assert_eq!(out.text, numbered(9001..=10_000));
        assert_eq!(out.shown_range, Some((9001, 10_000)));
        assert_eq!(out.total_lines, 10_000);
        // A head part longer than the window keeps its end, like the window itself.
        let both = SinkConfig { head: Some(5000), tail: Some(3000), ..SinkConfig::default() };
        let out = run(both, &[&text]);
        assert_eq!(out.text, numbered(3001..=5000));
        assert_eq!(out.shown_range, Some((3001, 5000)));
        assert_eq!(out.truncated_by, Some(TruncatedBy::Lines));
    }

    #[test]
    fn sink_tail_on_unterminated_text_counts_the_partial_line() {
        let out = run(SinkConfig { tail: Some(2), ..SinkConfig::default() }, &["a\nb\nc"]);
        assert_eq!(out.text, "b\nc");
        assert_eq!(out.shown_range, Some((2, 3)));
    }

    #[test]
    fn sink_asks_to_close_after_head_and_a_mebibyte() {
        let head_only =
            SinkConfig { head: Some(2), close_after_head: true, ..SinkConfig::default() };
        let mut sink = Sink::new(head_only, None);
        sink.push("1\n2");
        assert!(!sink.should_close());
        sink.push("\n");
        assert!(!sink.should_close(), "head complete, nothing drained yet");
        let block = "y\n".repeat(1024);
        for _ in 0..(HEAD_DRAIN / block.len() - 1) {
            sink.push(&block);
        }
        assert!(!sink.should_close());
        sink.push(&block);
        assert!(sink.should_close());
        assert_eq!(sink.finish().text, "1\n2\n");

        // Never with a tail limit, without a head limit, or with a caller's head (not extracted).
        for (head, tail) in [(Some(2), Some(1)), (None, None), (None, Some(1)), (Some(2), None)] {
            let mut sink = Sink::new(SinkConfig { head, tail, ..SinkConfig::default() }, None);
            sink.push(&"z\n".repeat(HEAD_DRAIN));
            assert!(!sink.should_close());
        }
    }

    /// contract §1: after an extracted `| head -n N`, every count is of what bash printed (the N
    /// lines), whatever the producer wrote before it was stopped; the artifact of a head part
    /// too long for the window holds those N lines, and the live window shows nothing past them.
    #[test]
    fn sink_counts_only_what_an_extracted_head_prints() {
        let (_dir, store) = store();
        let head = |n| SinkConfig { head: Some(n), close_after_head: true, ..config(20, 3) };
        let mut sink = Sink::new(head(4), Some(store.clone()));
        sink.push(&numbered(1..=2));
        sink.push(&numbered(3..=9));
        assert_eq!((sink.total_lines(), sink.window()), (4, "line2\nline3\nline4\n"));
        let out = sink.finish();
        assert_eq!((out.total_lines, out.total_bytes), (4, numbered(1..=4).len() as u64));
        assert_eq!(out.shown_range, Some((2, 4)));
        let id = out.artifact_id.expect("4 lines overflow a 3-line window");
        assert_eq!(std::fs::read_to_string(store.path(id)).unwrap(), numbered(1..=4));
        // Within the window: no artifact, the counters of the N lines.
        let out = run(head(2), &[&numbered(1..=9)]);
        assert_eq!(
            (out.text.as_str(), out.total_lines, out.artifact_id),
            ("line1\nline2\n", 2, None)
        );
        // An explicit head of the caller's (the command runs to its end) counts everything.
        let caller = SinkConfig { head: Some(2), ..config(20, 3) };
        assert_eq!(run(caller, &[&numbered(1..=9)]).total_lines, 9);
    }

    #[test]
    fn throttle_allows_one_update_per_interval() {
        let mut throttle = Throttle::new(LIVE_UPDATE_INTERVAL);
        let t0 = Instant::now();
        assert!(throttle.ready(t0));
        assert!(!throttle.ready(t0));
        assert!(!throttle.ready(t0 + Duration::from_millis(49)));
        assert!(throttle.ready(t0 + Duration::from_millis(50)));
        assert!(!throttle.ready(t0 + Duration::from_millis(60)));
        assert!(throttle.ready(t0 + Duration::from_secs(1)));
    }

    #[test]
    fn sink_line_helpers() {
        assert_eq!(first_lines("a\nb\nc", 2), "a\nb\n");
        assert_eq!(first_lines("a\nb", 5), "a\nb");
        assert_eq!(last_lines("a\nb\nc\n", 2), "b\nc\n");
        assert_eq!(last_lines("a\nb\nc", 1), "c");
        assert_eq!(last_lines("\n\n", 1), "\n");
        assert_eq!(last_lines("abc", 0), "");
    }

    fn piece() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            Just("a"),
            Just("bc"),
            Just("\n"),
            Just("\n"),
            Just("\u{e9}"),
            Just("\u{20ac}"),
            Just("\u{1f600}"),
            Just("0123456789abcdefghij"),
        ]
    }

    fn stream() -> impl Strategy<Value = String> {
        prop::collection::vec(piece(), 0..60).prop_map(|p| p.concat())
    }

    /// Splits `text` at the given byte offsets, moved to character boundaries.
    fn split<'a>(text: &'a str, cuts: &[usize]) -> Vec<&'a str> {
        let mut cuts: Vec<usize> =
            cuts.iter().map(|&c| ceil_char_boundary(text, c % (text.len() + 1))).collect();
        cuts.sort_unstable();
        let mut chunks = Vec::new();
        let mut from = 0;
        for cut in cuts.into_iter().chain([text.len()]) {
            chunks.push(&text[from..cut]);
            from = cut;
        }
        chunks
    }

    fn run_with_store(config: &SinkConfig, chunks: &[&str]) -> (Vec<String>, SinkOutput, String) {
        let (_dir, store) = store();
        let mut sink = Sink::new(config.clone(), Some(store.clone()));
        let mut windows = Vec::new();
        for chunk in chunks {
            sink.push(chunk);
            let window = sink.window();
            assert!(window.len() <= config.max_bytes.max(MIN_WINDOW_BYTES));
            assert!(count_lines(window) as usize <= config.max_lines.max(1));
            windows.push(window.to_owned());
        }
        let out = sink.finish();
        let artifact = out
            .artifact_id
            .map(|id| std::fs::read_to_string(store.path(id)).unwrap())
            .unwrap_or_default();
        (windows, out, artifact)
    }

    #[test]
    fn sink_push_owned_is_push() {
        // Chunks large enough to be handed to the writer thread whole, and small ones.
        let big: String = (0..40_000).map(|i| format!("{i:07}\n")).collect();
        let chunks = [&big[..100], &big[100..200_000], "partial", &big[200_000..], "\n", "x"];
        let config = SinkConfig { artifact_cap: 300_000, ..SinkConfig::default() };
        let (_, want, want_artifact) = run_with_store(&config, &chunks);
        let (_dir, store) = store();
        let mut sink = Sink::new(config, Some(store.clone()));
        for chunk in chunks {
            let mut text = chunk.to_owned();
            sink.push_owned(&mut text);
            assert!(text.is_empty());
        }
        let out = sink.finish();
        assert_eq!(out, want);
        assert_eq!(std::fs::read_to_string(store.path(0)).unwrap(), want_artifact);
        assert!(want_artifact.contains(" bytes elided …]\n"));
    }

    /// Whole lines, each from stdout (false) or from the stderr kept apart (true).
    fn two_streams() -> impl Strategy<Value = Vec<(bool, String)>> {
        prop::collection::vec((any::<bool>(), "[a-c]{0,6}\n|[a-c]{20,70}\n"), 0..24)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// contract §1: after a stripped `| head -n N` the stderr takes no line of the N and is
        /// shown where it came; after a stripped `| tail -n N` it comes before the N last lines
        /// of stdout, as bash prints them. Bounded by the window like any text.
        #[test]
        fn stderr_apart_is_printed_past_the_stage(
            lines in two_streams(),
            n in 0usize..6,
            tail in any::<bool>(),
            max_bytes in 8usize..60,
            max_lines in 1usize..8,
        ) {
            let config = match tail {
                true => SinkConfig { max_bytes, max_lines, tail: Some(n), stage_tail: true, ..SinkConfig::default() },
                false => SinkConfig { max_bytes, max_lines, head: Some(n), close_after_head: true, ..SinkConfig::default() },
            };
            let mut sink = Sink::new(config, None);
            for (apart, line) in &lines {
                match apart {
                    true => sink.push_apart(line),
                    false => sink.push(line),
                }
            }
            let out = sink.finish();
            let stdout: String = lines.iter().filter(|l| !l.0).map(|l| l.1.as_str()).collect();
            let printed: String = match tail {
                true => {
                    let stderr: String = lines.iter().filter(|l| l.0).map(|l| l.1.as_str()).collect();
                    stderr + last_lines(&stdout, n)
                }
                false => {
                    let mut taken = 0;
                    let mut keep = |apart: bool| {
                        taken += usize::from(!apart);
                        apart || taken <= n
                    };
                    lines.iter().filter(|l| keep(l.0)).map(|l| l.1.as_str()).collect()
                }
            };
            let shown = model_window(&printed, max_bytes, max_lines);
            prop_assert_eq!(out.text.as_str(), shown);
            prop_assert_eq!(out.truncated, shown.len() < printed.len());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn sink_output_does_not_depend_on_chunking(
            text in stream(),
            cuts in prop::collection::vec(any::<usize>(), 0..16),
            max_bytes in 1usize..40,
            max_lines in 0usize..6,
            head in prop::option::of(0usize..10),
            tail in prop::option::of(0usize..10),
        ) {
            let config = SinkConfig { max_bytes, max_lines, head, tail, artifact_cap: 1 << 20, close_after_head: false, stage_tail: false };
            let chunks = split(&text, &cuts);
            let (windows, out, artifact) = run_with_store(&config, &chunks);
            let (_, whole, whole_artifact) = run_with_store(&config, &[&text]);
            prop_assert_eq!(&out, &whole);
            prop_assert_eq!(&artifact, &whole_artifact);

            let (max_bytes, max_lines) = (max_bytes.max(MIN_WINDOW_BYTES), max_lines.max(1));
            // Every intermediate window is the window of the stream so far.
            let mut so_far = String::new();
            for (chunk, window) in chunks.iter().zip(&windows) {
                so_far.push_str(chunk);
                prop_assert_eq!(window.as_str(), model_window(&so_far, max_bytes, max_lines));
            }
            // The text is head/tail over the full stream, bounded by the window.
            let selected = model_head_tail(&text, head, tail);
            prop_assert_eq!(out.text.as_str(), model_window(&selected, max_bytes, max_lines));
            prop_assert_eq!(out.total_bytes, text.len() as u64);
            prop_assert_eq!(out.total_lines, count_lines(&text));
            prop_assert_eq!(out.output_lines, count_lines(&out.text));
            prop_assert_eq!(out.truncated, out.text.len() < selected.len());
            prop_assert_eq!(out.truncated_by.is_some(), out.truncated);
            let head_part = model_head_tail(&text, head, None);
            let range_end = count_lines(&head_part);
            let range = (!out.text.is_empty())
                .then(|| (range_end + 1 - out.output_lines, range_end));
            prop_assert_eq!(out.shown_range, range);
            let fits = text.len() <= max_bytes && count_lines(&text) as usize <= max_lines;
            if fits {
                prop_assert_eq!(out.artifact_id, None);
                prop_assert_eq!(&out.text, &selected);
            } else {
                prop_assert_eq!(out.artifact_id, Some(0));
                prop_assert_eq!(&artifact, &text);
            }
        }
    }
}
