//! SPEC §4.2: the bounded tail window, truthful counters, spill to an artifact, live-update
//! throttle.

use serde::Serialize;

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
    pub artifact_id: Option<u64>,
}
