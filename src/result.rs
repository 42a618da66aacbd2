//! contract §7: `BashResult` and the model-facing text (notices, exit-code wording).
//!
//! The text is built from up to five parts, each present only when it applies, separated by
//! exactly one blank line:
//!
//! ```text
//! [Command timed out after 300 seconds]        timeout or cancel annotation: always first
//!
//! [Earlier in the output (artifact://3 lines):] rescued lines of the part the window cut
//! 12: error[E0308]: mismatched types            (contract §7, `crate::rescue`)
//! […]
//!
//! <the output, or "(no output)">
//!
//! [Showing lines 9001-10000 of 10000 (50.0KB limit). Full: artifact://3]
//!
//! Command exited with code 1                   or "Command failed: missing exit status"
//! ```
//!
//! The output is kept as it is when nothing follows it (`echo hi` gives `"hi\n"`, as in the
//! reference). When a notice or exit line follows, one trailing newline of the output is dropped
//! first, so the separator is one blank line whether or not the output ended with a newline:
//! `"hi\n"` and `"hi"` both give `"hi\n\nCommand exited with code 1"`.

use std::time::Duration;

use serde::Serialize;

use crate::changes::{names, Receipt};
use crate::rescue::{self, Rescued};
use crate::sink::{SinkOutput, TruncatedBy};

/// What the model (and the RPC client) gets for one command.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BashResult {
    /// The model-facing text: annotation, output, truncation notice, exit wording.
    pub output: String,
    /// Absent when unknown, and always after a timeout or cancel.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// True for cancels and timeouts alike (the reference's meaning).
    pub cancelled: bool,
    pub timed_out: bool,
    pub truncated: bool,
    pub total_lines: u64,
    pub total_bytes: u64,
    pub output_lines: u64,
    pub output_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub artifact_id: Option<u64>,
    pub duration_ms: u64,
    /// What normalization (§1) extracted from the command, when it changed anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub normalized: Option<serde_json::Value>,
    /// The persistent shell died or was replaced while serving this command.
    pub shell_restarted: bool,
    /// The timeout the caller asked for, when §3 clamped it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_clamped_from: Option<f64>,
    /// Time spent waiting before the command started: for this key's busy shell session, or
    /// for a place among `limits.max_sessions` when every live session is busy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waited_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncation: Option<Truncation>,
    /// The command's own text (head/tail applied, window-bounded) without annotations or
    /// notices: what session recording fences for the agent's context (contract §10).
    #[serde(skip)]
    pub text: String,
    /// Non-zero or missing exit status, timeout or cancel.
    pub is_error: bool,
    /// The interception (§2) that blocked the command instead of running it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked: Option<serde_json::Value>,
    /// Diagnostics of the part the window cut off, with their artifact line numbers (§7).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rescued: Vec<Rescued>,
    /// What the run cost (§7 receipt).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<crate::resources::Resources>,
    /// Files the run added, modified, deleted or re-moded in its project (contract §13), at most
    /// [`crate::changes::MAX_REPORTED`]; `changes_count` has the total.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<crate::changes::Change>,
    /// How many paths changed (present whenever a receipt was taken).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changes_count: Option<usize>,
    /// The id `undo` and `:AgentBashDiff` take (present when something changed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changes_id: Option<u64>,
    /// Why there is no receipt for this run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changes_unavailable: Option<String>,
    /// The project whose first snapshot was being taken, when that is why (the editor's card
    /// follows it: `changes_status`); not part of what other clients get.
    #[serde(skip)]
    pub changes_indexing: Option<std::path::PathBuf>,
    /// The fence the command ran under (§13): `"workspace-write"` or `"read-only"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<&'static str>,
    /// Where the command ran, when a remote profile ran it (contract §12).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote: Option<Remote>,
}

/// Where a remote command ran (contract §12): the profile, and the host's name as it reports it
/// (absent when the session could not start).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Remote {
    pub profile: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

impl BashResult {
    /// Sets the receipt; an expensive run's text ends with its one-line note (§7).
    pub fn set_resources(&mut self, resources: crate::resources::Resources) {
        if let Some(note) = resources.note() {
            self.push_note(&note);
        }
        self.resources = Some(resources);
    }

    /// Sets `changes`, `changes_count`, `changes_id` (when something changed) or
    /// `changes_unavailable` from the change receipt (contract §13), and, with `note` and
    /// something changed, ends the model text with `[Changed files: M a.rs, A b.txt]`.
    pub fn set_receipt(&mut self, receipt: Receipt, note: bool) {
        match receipt {
            Receipt::Off => {}
            Receipt::Unavailable(reason) => self.changes_unavailable = Some(reason),
            Receipt::Indexing { root, reason } => {
                self.changes_unavailable = Some(reason);
                self.changes_indexing = Some(root);
            }
            Receipt::Taken { changes, count, id } => {
                self.changes_count = Some(count);
                if note && count > 0 {
                    self.push_note(&format!("[Changed files: {}]", names(&changes, count)));
                }
                self.changes_id = id;
                self.changes = changes;
            }
        }
    }

    /// A command whose shell could not be started: `why` in place of its output, then the
    /// missing-exit-status line (§7).
    pub fn set_unstarted(&mut self, why: &str) {
        self.output = format!("{why}\n\n{MISSING_EXIT}");
    }

    /// A remote command whose session was lost (contract §12): `Remote session lost: <why>` in
    /// place of the missing-exit-status line.
    pub fn set_session_lost(&mut self, why: &str) {
        let kept = self.output.strip_suffix(MISSING_EXIT).unwrap_or(&self.output);
        self.output = format!("{kept}Remote session lost: {why}");
    }

    /// Ends the model text with a one-line note after one blank line (the fence's, the
    /// receipts', an expensive run's).
    pub fn push_note(&mut self, note: &str) {
        let kept = self.output.trim_end_matches('\n').len();
        self.output.truncate(kept);
        self.output.push_str("\n\n");
        self.output.push_str(note);
    }
}

/// The exit line of a command whose exit status never arrived.
const MISSING_EXIT: &str = "Command failed: missing exit status";

/// Truncation metadata (contract §7), present exactly when the text is not the whole output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Truncation {
    pub direction: Direction,
    pub truncated_by: TruncatedBy,
    pub shown_range: ShownRange,
    pub total_lines: u64,
    pub total_bytes: u64,
    pub output_lines: u64,
    pub output_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub artifact_id: Option<u64>,
    /// Why the full output could not be saved (then there is no artifact to offer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub artifact_error: Option<String>,
    /// The window's byte limit, as the notice shows it (renderers word their own warning).
    pub limit_bytes: u64,
    /// The window's line limit, which the notice names when lines cut (`truncated_by`).
    pub limit_lines: u64,
}

/// Which end of the output the window keeps; the sink always keeps the tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    #[default]
    Tail,
}

/// 1-based inclusive line range of the full output that the text shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ShownRange {
    pub start: u64,
    pub end: u64,
}

/// How the command ended. One variant per wording of §7, so a timeout can never also carry an
/// exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The command exited with this status; 0 is success. Mapping a death by signal to a status
    /// (such as 128 + N) is the executor's business.
    Exited(i32),
    /// The command ended but its status could not be learned (the shell died, a PTY error).
    MissingExitStatus,
    /// Killed when this timeout (after clamping) ran out.
    TimedOut(Duration),
    /// Stopped at the request of the user or the agent.
    Cancelled,
}

/// Shapes the sink's output and the outcome into a [`BashResult`]. `limit_bytes` is the byte
/// size of the window, shown in the truncation notice. Fields this function cannot know
/// (`normalized`, `shell_restarted`, `timeout_clamped_from`, `waited_ms`, `blocked`) are left
/// empty for the caller to set.
pub fn shape(
    sink: SinkOutput,
    outcome: &Outcome,
    duration: Duration,
    limit_bytes: u64,
) -> BashResult {
    let truncation = sink.truncated.then(|| Truncation {
        direction: Direction::Tail,
        // The sink reports the reason whenever it truncates; bytes is the reference's only one.
        truncated_by: sink.truncated_by.unwrap_or(TruncatedBy::Bytes),
        shown_range: shown_range(&sink),
        total_lines: sink.total_lines,
        total_bytes: sink.total_bytes,
        output_lines: sink.output_lines,
        output_bytes: sink.output_bytes,
        artifact_id: sink.artifact_id,
        artifact_error: sink.artifact_error.clone(),
        limit_bytes,
        limit_lines: match sink.max_lines {
            0 => crate::sink::DEFAULT_MAX_LINES as u64,
            n => n,
        },
    });

    let annotation = match outcome {
        Outcome::TimedOut(timeout) => {
            Some(format!("[Command timed out after {} seconds]", format_seconds(*timeout)))
        }
        Outcome::Cancelled => Some("[Command cancelled]".to_owned()),
        Outcome::Exited(_) | Outcome::MissingExitStatus => None,
    };
    let notice = truncation.as_ref().map(|t| truncation_notice(t, limit_bytes));
    let exit_line = match outcome {
        Outcome::Exited(0) | Outcome::TimedOut(_) | Outcome::Cancelled => None,
        Outcome::Exited(code) => Some(format!("Command exited with code {code}")),
        Outcome::MissingExitStatus => Some(MISSING_EXIT.to_owned()),
    };

    let body = if sink.text.is_empty() { "(no output)" } else { sink.text.as_str() };
    let mut text = String::with_capacity(body.len() + 160);
    if let Some(annotation) = &annotation {
        text.push_str(annotation);
        text.push_str("\n\n");
    }
    if let Some(block) = rescue::block(&sink.rescued, sink.artifact_id) {
        text.push_str(&block);
        text.push_str("\n\n");
    }
    let after: Vec<&str> = notice.iter().chain(&exit_line).map(String::as_str).collect();
    if after.is_empty() {
        text.push_str(body);
    } else {
        text.push_str(body.strip_suffix('\n').unwrap_or(body));
        for part in after {
            text.push_str("\n\n");
            text.push_str(part);
        }
    }

    BashResult {
        output: text,
        exit_code: match outcome {
            Outcome::Exited(code) => Some(*code),
            _ => None,
        },
        cancelled: matches!(outcome, Outcome::TimedOut(_) | Outcome::Cancelled),
        timed_out: matches!(outcome, Outcome::TimedOut(_)),
        truncated: sink.truncated,
        total_lines: sink.total_lines,
        total_bytes: sink.total_bytes,
        output_lines: sink.output_lines,
        output_bytes: sink.output_bytes,
        artifact_id: sink.artifact_id,
        duration_ms: u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
        truncation,
        text: sink.text.clone(),
        is_error: *outcome != Outcome::Exited(0),
        rescued: sink.rescued,
        ..BashResult::default()
    }
}

/// A byte count as people read it: `512B`, `50.0KB`, `1.0MB`, `2.5GB` (binary multiples).
///
/// A value that would round to `1024.0` of a unit is shown in the next unit instead
/// (1048575 bytes is `1.0MB`, not `1024.0KB`).
pub fn format_size(bytes: u64) -> String {
    if bytes < 1024 {
        return format!("{bytes}B");
    }
    let mut value = bytes as f64 / 1024.0;
    for unit in ["KB", "MB"] {
        if value < 1023.95 {
            return format!("{value:.1}{unit}");
        }
        value /= 1024.0;
    }
    format!("{value:.1}GB")
}

/// `[Showing lines A-B of T (<limit> limit). Full: artifact://<id>]` (contract §7), naming the limit
/// that cut: `50.0KB` when bytes did, `2000 lines` when lines did.
pub fn truncation_notice(truncation: &Truncation, limit_bytes: u64) -> String {
    let ShownRange { start, end } = truncation.shown_range;
    let limit = match truncation.truncated_by {
        TruncatedBy::Lines => format!("{} lines", truncation.limit_lines),
        TruncatedBy::Bytes => format_size(limit_bytes),
    };
    let mut notice =
        format!("[Showing lines {start}-{end} of {} ({limit} limit)", truncation.total_lines);
    if let Some(id) = truncation.artifact_id {
        notice.push_str(&format!(". Full: artifact://{id}"));
    } else if let Some(e) = &truncation.artifact_error {
        notice.push_str(&format!(". Full output not saved: {e}"));
    }
    notice.push(']');
    notice
}

/// The sink's range, or, if it gave none, the last `output_lines` lines.
fn shown_range(sink: &SinkOutput) -> ShownRange {
    match sink.shown_range {
        Some((start, end)) => ShownRange { start, end },
        None => ShownRange {
            start: sink.total_lines.saturating_sub(sink.output_lines) + 1,
            end: sink.total_lines,
        },
    }
}

/// Seconds as a person writes them: `300`, `1.5`, `0.25` (to the millisecond).
fn format_seconds(duration: Duration) -> String {
    let seconds = duration.as_millis() as f64 / 1000.0;
    format!("{seconds}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    const LIMIT: u64 = 51200;

    #[test]
    fn receipt_note_names_twenty_then_a_count() {
        use crate::changes::{Change, Kind};
        let c = |path: &str, kind| Change { path: path.into(), kind, overlap: false };
        let few = vec![
            c("src/a.rs", Kind::Modified),
            c("notes.txt", Kind::Added),
            c("old.txt", Kind::Deleted),
            c("run.sh", Kind::Mode),
        ];
        let mut r = BashResult { output: "hi\n".into(), ..Default::default() };
        r.set_receipt(Receipt::Taken { changes: few.clone(), count: 4, id: Some(7) }, true);
        assert_eq!(r.output, "hi\n\n[Changed files: M src/a.rs, A notes.txt, D old.txt, X run.sh]");
        assert_eq!((r.changes, r.changes_count, r.changes_id), (few, Some(4), Some(7)));
        let many: Vec<Change> = (0..25).map(|i| c(&format!("f{i}"), Kind::Added)).collect();
        let mut r = BashResult { output: "hi".into(), ..Default::default() };
        r.set_receipt(Receipt::Taken { changes: many, count: 25, id: Some(8) }, true);
        assert!(r.output.ends_with("A f19 and 5 more]"), "{}", r.output);
        let mut quiet = BashResult { output: "hi".into(), ..Default::default() };
        quiet.set_receipt(Receipt::Taken { changes: Vec::new(), count: 0, id: None }, true);
        assert_eq!((quiet.output.as_str(), quiet.changes_count), ("hi", Some(0)));
        let mut off = BashResult::default();
        off.set_receipt(Receipt::Unavailable("why".into()), true);
        assert_eq!(off.changes_unavailable.as_deref(), Some("why"));
    }

    fn sink(text: &str) -> SinkOutput {
        let lines = if text.is_empty() { 0 } else { text.lines().count() as u64 };
        SinkOutput {
            text: text.to_owned(),
            total_bytes: text.len() as u64,
            total_lines: lines,
            output_bytes: text.len() as u64,
            output_lines: lines,
            ..SinkOutput::default()
        }
    }

    fn truncated(text: &str, artifact_id: Option<u64>) -> SinkOutput {
        SinkOutput {
            total_bytes: 588_895,
            total_lines: 10_000,
            output_bytes: 51_100,
            output_lines: 1_000,
            truncated: true,
            truncated_by: Some(TruncatedBy::Bytes),
            shown_range: Some((9_001, 10_000)),
            artifact_id,
            ..sink(text)
        }
    }

    fn text(sink: SinkOutput, outcome: Outcome) -> String {
        shape(sink, &outcome, Duration::ZERO, LIMIT).output
    }

    #[test]
    fn text_table() {
        let notice = "[Showing lines 9001-10000 of 10000 (50.0KB limit). Full: artifact://3]";
        let cases: Vec<(SinkOutput, Outcome, String)> = vec![
            (sink("hi\n"), Outcome::Exited(0), "hi\n".into()),
            (sink("hi"), Outcome::Exited(0), "hi".into()),
            (sink(""), Outcome::Exited(0), "(no output)".into()),
            (sink("hi\n"), Outcome::Exited(1), "hi\n\nCommand exited with code 1".into()),
            (sink("hi"), Outcome::Exited(-1), "hi\n\nCommand exited with code -1".into()),
            (sink(""), Outcome::Exited(127), "(no output)\n\nCommand exited with code 127".into()),
            (
                sink("hi\n"),
                Outcome::MissingExitStatus,
                "hi\n\nCommand failed: missing exit status".into(),
            ),
            (
                sink("partial\n"),
                Outcome::TimedOut(Duration::from_secs(300)),
                "[Command timed out after 300 seconds]\n\npartial\n".into(),
            ),
            (
                sink(""),
                Outcome::TimedOut(Duration::from_millis(1500)),
                "[Command timed out after 1.5 seconds]\n\n(no output)".into(),
            ),
            (sink("partial"), Outcome::Cancelled, "[Command cancelled]\n\npartial".into()),
            (truncated("tail\n", Some(3)), Outcome::Exited(0), format!("tail\n\n{notice}")),
            (
                truncated("tail\n", None),
                Outcome::Exited(0),
                "tail\n\n[Showing lines 9001-10000 of 10000 (50.0KB limit)]".into(),
            ),
            (
                truncated("tail\n", Some(3)),
                Outcome::Exited(2),
                format!("tail\n\n{notice}\n\nCommand exited with code 2"),
            ),
            (
                truncated("tail", Some(3)),
                Outcome::TimedOut(Duration::from_secs(10)),
                format!("[Command timed out after 10 seconds]\n\ntail\n\n{notice}"),
            ),
            (
                truncated("tail\n", Some(3)),
                Outcome::Cancelled,
                format!("[Command cancelled]\n\ntail\n\n{notice}"),
            ),
        ];
        for (sink, outcome, expected) in cases {
            let input = format!("{:?} / {outcome:?}", sink.text);
            assert_eq!(text(sink, outcome), expected, "{input}");
        }
    }

    #[test]
    fn notice_says_when_the_full_output_was_not_saved() {
        let failed = SinkOutput {
            artifact_error: Some("writing the artifact failed: No space left on device".into()),
            ..truncated("t\n", None)
        };
        assert_eq!(
            text(failed, Outcome::Exited(0)),
            "t\n\n[Showing lines 9001-10000 of 10000 (50.0KB limit). Full output not saved: writing the artifact failed: No space left on device]"
        );
    }

    #[test]
    fn notice_shows_the_window_limit() {
        let text = shape(truncated("x", None), &Outcome::Exited(0), Duration::ZERO, 1 << 20).output;
        assert!(text.ends_with("(1.0MB limit)]"), "{text}");
    }

    #[test]
    fn notice_names_the_limit_that_cut() {
        let by_lines = SinkOutput {
            truncated_by: Some(TruncatedBy::Lines),
            max_lines: 2000,
            ..truncated("t\n", Some(4))
        };
        let text = text(by_lines, Outcome::Exited(0));
        assert!(
            text.ends_with(
                "[Showing lines 9001-10000 of 10000 (2000 lines limit). Full: artifact://4]"
            ),
            "{text}"
        );
        let text = super::tests::text(truncated("t\n", Some(4)), Outcome::Exited(0));
        assert!(text.ends_with("(50.0KB limit). Full: artifact://4]"), "{text}");
    }

    #[test]
    fn rescued_lines_come_before_the_tail() {
        let rescued = vec![
            Rescued { line: 12, text: "error[E0308]: mismatched types".into() },
            Rescued { line: 13, text: " --> src/main.rs:2:18".into() },
        ];
        let sink = SinkOutput { rescued: rescued.clone(), ..truncated("tail\n", Some(3)) };
        let r = shape(sink, &Outcome::Exited(101), Duration::ZERO, LIMIT);
        assert_eq!(
            r.output,
            "[Earlier in the output (artifact://3 lines):]\n12: error[E0308]: mismatched types\n\
             13:  --> src/main.rs:2:18\n[\u{2026}]\n\ntail\n\n\
             [Showing lines 9001-10000 of 10000 (50.0KB limit). Full: artifact://3]\n\n\
             Command exited with code 101"
        );
        assert_eq!(r.rescued, rescued);
        let value = serde_json::to_value(&r).unwrap();
        assert_eq!(
            value["rescued"][0],
            json!({"line": 12, "text": "error[E0308]: mismatched types"})
        );
        // After a timeout annotation, before the tail.
        let sink = SinkOutput { rescued, ..truncated("tail\n", Some(3)) };
        let r = shape(sink, &Outcome::TimedOut(Duration::from_secs(5)), Duration::ZERO, LIMIT);
        assert!(r
            .output
            .starts_with("[Command timed out after 5 seconds]\n\n[Earlier in the output"));
    }

    #[test]
    fn format_size_table() {
        let cases = [
            (0, "0B"),
            (1, "1B"),
            (1023, "1023B"),
            (1024, "1.0KB"),
            (1536, "1.5KB"),
            (51_200, "50.0KB"),
            (1_048_575, "1.0MB"),
            (1_048_576, "1.0MB"),
            (33_554_432, "32.0MB"),
            (1_073_741_824, "1.0GB"),
            (5_905_580_032, "5.5GB"),
            (1 << 50, "1048576.0GB"),
        ];
        for (bytes, expected) in cases {
            assert_eq!(format_size(bytes), expected, "{bytes}");
        }
    }

    #[test]
    fn flags_follow_the_outcome() {
        let flags = |outcome: Outcome| {
            let r = shape(sink("x"), &outcome, Duration::ZERO, LIMIT);
            (r.exit_code, r.cancelled, r.timed_out, r.is_error)
        };
        assert_eq!(flags(Outcome::Exited(0)), (Some(0), false, false, false));
        assert_eq!(flags(Outcome::Exited(3)), (Some(3), false, false, true));
        assert_eq!(flags(Outcome::MissingExitStatus), (None, false, false, true));
        assert_eq!(flags(Outcome::TimedOut(Duration::from_secs(1))), (None, true, true, true));
        assert_eq!(flags(Outcome::Cancelled), (None, true, false, true));
    }

    #[test]
    fn error_results_keep_metadata() {
        for outcome in [
            Outcome::Exited(1),
            Outcome::MissingExitStatus,
            Outcome::TimedOut(Duration::from_secs(5)),
            Outcome::Cancelled,
        ] {
            let r = shape(truncated("t\n", Some(7)), &outcome, Duration::from_millis(1234), LIMIT);
            assert!(r.truncated && r.is_error);
            assert_eq!(r.artifact_id, Some(7));
            assert_eq!((r.total_lines, r.total_bytes), (10_000, 588_895));
            assert_eq!((r.output_lines, r.output_bytes), (1_000, 51_100));
            assert_eq!(r.duration_ms, 1234);
            assert!(r.output.contains("Full: artifact://7]"), "{}", r.output);
            assert_eq!(r.truncation.map(|t| t.artifact_id), Some(Some(7)));
        }
    }

    #[test]
    fn json_of_a_plain_success_omits_absent_values() {
        let r = shape(sink("hi\n"), &Outcome::Exited(0), Duration::from_millis(12), LIMIT);
        let value = serde_json::to_value(&r).unwrap();
        assert_eq!(
            value,
            json!({
                "output": "hi\n",
                "exit_code": 0,
                "cancelled": false,
                "timed_out": false,
                "truncated": false,
                "total_lines": 1,
                "total_bytes": 3,
                "output_lines": 1,
                "output_bytes": 3,
                "duration_ms": 12,
                "shell_restarted": false,
                "is_error": false,
            })
        );
    }

    #[test]
    fn json_of_a_truncated_timeout() {
        let mut r = shape(
            SinkOutput { truncated_by: Some(TruncatedBy::Lines), ..truncated("t\n", Some(3)) },
            &Outcome::TimedOut(Duration::from_secs(3600)),
            Duration::from_secs(3600),
            LIMIT,
        );
        r.timeout_clamped_from = Some(7200.0);
        r.waited_ms = Some(40);
        r.normalized = Some(json!({"tail": 20}));
        let value = serde_json::to_value(&r).unwrap();
        assert_eq!(value.get("exit_code"), None);
        assert_eq!(value["cancelled"], json!(true));
        assert_eq!(value["timed_out"], json!(true));
        assert_eq!(value["artifact_id"], json!(3));
        assert_eq!(value["timeout_clamped_from"], json!(7200.0));
        assert_eq!(value["waited_ms"], json!(40));
        assert_eq!(value["normalized"], json!({"tail": 20}));
        assert_eq!(value.get("blocked"), None);
        assert_eq!(
            value["truncation"],
            json!({
                "direction": "tail",
                "truncated_by": "lines",
                "shown_range": {"start": 9001, "end": 10000},
                "total_lines": 10000,
                "total_bytes": 588895,
                "output_lines": 1000,
                "output_bytes": 51100,
                "artifact_id": 3,
                "limit_bytes": 51200,
                "limit_lines": 2000,
            })
        );
        let without_artifact =
            shape(truncated("t\n", None), &Outcome::Exited(0), Duration::ZERO, LIMIT);
        let value = serde_json::to_value(&without_artifact).unwrap();
        assert_eq!(value.get("artifact_id"), None);
        assert_eq!(value["truncation"].get("artifact_id"), None);
    }

    #[test]
    fn missing_shown_range_falls_back_to_the_tail() {
        let r = shape(
            SinkOutput { shown_range: None, ..truncated("t\n", None) },
            &Outcome::Exited(0),
            Duration::ZERO,
            LIMIT,
        );
        assert_eq!(
            r.truncation.map(|t| t.shown_range),
            Some(ShownRange { start: 9_001, end: 10_000 })
        );
    }
}
