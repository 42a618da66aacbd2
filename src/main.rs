//! The `agent-bash` binary: parse arguments, set up logging, run a mode, exit with its status.

use clap::{Parser, Subcommand};

use agent_bash::mode;

#[derive(Debug, Parser)]
#[command(
    name = "agent-bash",
    version,
    about = "Runs shell commands for coding agents and for you"
)]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Debug, Subcommand)]
enum Mode {
    /// Show what normalization and interception make of a command (one JSON object).
    Explain(mode::explain::ExplainArgs),
    /// Read raw bytes on stdin and print the model-facing text.
    Sanitize(mode::sanitize::SanitizeArgs),
}

fn main() {
    let cli = Cli::parse();
    let status = match cli.mode {
        Mode::Explain(args) => mode::explain::run(args),
        Mode::Sanitize(args) => mode::sanitize::run(args),
    };
    match status {
        Ok(code) => std::process::exit(code),
        Err(err) => {
            eprintln!("agent-bash: {err}");
            std::process::exit(2);
        }
    }
}
