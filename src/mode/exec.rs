//! `agent-bash exec`: print mode. Runs one tool call and prints the model-facing text (or the
//! BashResult as JSON); the exit status is the command's (124 on timeout, 130 on cancel).

use std::io::Write;
use std::path::PathBuf;

use tokio_util::sync::CancellationToken;

use crate::exec::{Origin, Request, Settings};
use crate::{Error, Result};

/// Flags of `agent-bash exec`.
#[derive(Debug, clap::Args)]
pub struct ExecArgs {
    /// Working directory (relative to the current directory; `~` expanded).
    #[arg(long)]
    pub cwd: Option<String>,
    /// Timeout in seconds (default 300, clamped to 1..=3600, fractions kept).
    #[arg(long)]
    pub timeout: Option<String>,
    /// Keep only the first N lines.
    #[arg(long)]
    pub head: Option<usize>,
    /// Keep only the last N lines.
    #[arg(long)]
    pub tail: Option<usize>,
    /// Shell session key (state is kept per key within one process).
    #[arg(long)]
    pub session_key: Option<String>,
    /// Run on the other side of this profile of the settings (contract §12; `local`: here).
    #[arg(long)]
    pub profile: Option<String>,
    /// Tool names the caller offers (comma-separated), for interception.
    #[arg(long, value_delimiter = ',')]
    pub tools: Option<Vec<String>>,
    /// Settings file (TOML).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print the BashResult as JSON instead of the text.
    #[arg(long)]
    pub json: bool,
    /// Run in a pseudo-terminal; the text is the terminal's rendering (contract §6).
    #[arg(long)]
    pub pty: bool,
    /// The command, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// Exit status for a timed-out command (as `timeout(1)`).
pub const EXIT_TIMEOUT: i32 = 124;
/// Exit status for a cancelled command (as a shell after SIGINT).
pub const EXIT_CANCELLED: i32 = 130;

/// Parses a timeout flag; anything but a number is an error (contract §3).
pub fn parse_timeout_flag(raw: &str) -> Result<f64> {
    raw.trim().parse::<f64>().map_err(|_| Error::InvalidTimeout(raw.to_string()))
}

/// Runs print mode; returns the exit status.
pub async fn run(args: ExecArgs) -> Result<i32> {
    let settings = match &args.config {
        Some(p) => Settings::load(p)?,
        None => Settings::default(),
    };
    let timeout = args.timeout.as_deref().map(parse_timeout_flag).transpose()?;
    let rt = super::start_runtime(settings, None)?;
    let cancel = CancellationToken::new();
    let on_signal = cancel.clone();
    tokio::spawn(async move {
        super::wait_for_signal().await;
        on_signal.cancel();
    });
    let req = Request {
        origin: Origin::Tool,
        command: args.command.join(" "),
        timeout,
        cwd: args.cwd,
        local_cwd: false,
        remote_cwd: None,
        head: args.head,
        tail: args.tail,
        tools: args.tools,
        session_key: args.session_key,
        display: false,
        pty: args.pty,
        profile: args.profile,
    };
    let res = rt.run(req, cancel, None).await;
    rt.shutdown().await;
    let r = res?;
    let mut stdout = std::io::stdout().lock();
    if args.json {
        let text = super::wire::result_line(&r, true)?;
        writeln!(stdout, "{text}")?;
    } else {
        stdout.write_all(r.output.as_bytes())?;
        if !r.output.ends_with('\n') {
            stdout.write_all(b"\n")?;
        }
    }
    stdout.flush()?;
    Ok(if r.timed_out {
        EXIT_TIMEOUT
    } else if r.cancelled {
        EXIT_CANCELLED
    } else if r.blocked.is_some() {
        1
    } else {
        r.exit_code.unwrap_or(1)
    })
}
