//! `agent-bash sanitize`: raw bytes on stdin → the model-facing text (or the result as JSON).

use std::path::PathBuf;

/// Flags of `agent-bash sanitize`.
#[derive(Debug, clap::Args)]
pub struct SanitizeArgs {
    /// Window size in bytes.
    #[arg(long, default_value_t = 51200)]
    pub max_bytes: usize,
    /// Window size in lines.
    #[arg(long, default_value_t = 2000)]
    pub max_lines: usize,
    /// Where to spill the full output on overflow (no artifact without it).
    #[arg(long)]
    pub artifacts: Option<PathBuf>,
    /// Print the result object (counters, `truncated`, `artifact_id`) instead of the text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `sanitize`; returns the process exit status.
pub fn run(args: SanitizeArgs) -> crate::Result<i32> {
    let _ = args;
    todo!("issue 2")
}
