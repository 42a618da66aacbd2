//! `agent-bash explain`: shows what normalization and interception make of a command.

use std::path::PathBuf;

/// Flags of `agent-bash explain`.
#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// Tool names the caller offers (comma-separated); rules for other tools never block.
    #[arg(long, value_delimiter = ',')]
    pub tools: Option<Vec<String>>,
    /// A TOML or JSON file with interceptor rules (`[[rules]]` / `{"rules": [...]}`).
    #[arg(long)]
    pub rules: Option<PathBuf>,
    /// Explicit head line count (overrides one extracted from the command).
    #[arg(long)]
    pub head: Option<usize>,
    /// Explicit tail line count (overrides one extracted from the command).
    #[arg(long)]
    pub tail: Option<usize>,
    /// The command, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// Runs `explain`; returns the process exit status.
pub fn run(args: ExplainArgs) -> crate::Result<i32> {
    let _ = args;
    todo!("issue 2")
}
