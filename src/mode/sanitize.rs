//! `agent-bash sanitize`: raw bytes on stdin → the model-facing text (or the result as JSON).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crate::artifacts::ArtifactStore;
use crate::result::{shape, Outcome};
use crate::sanitize::Sanitizer;
use crate::sink::{Sink, SinkConfig};
use crate::Error;

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
    /// Do not rescue diagnostics of the part the window cuts off (for benchmarks).
    #[arg(long)]
    pub no_rescue: bool,
}

/// Reads stdin in chunks of this size.
const READ_CHUNK: usize = 256 * 1024;

/// Runs `sanitize`; returns the process exit status.
pub fn run(args: SanitizeArgs) -> crate::Result<i32> {
    // Four bytes is the smallest window that holds any character.
    if args.max_bytes < 4 || args.max_lines == 0 {
        return Err(Error::InvalidInput(
            "--max-bytes must be at least 4 and --max-lines at least 1".into(),
        ));
    }
    let started = Instant::now();
    let store = args.artifacts.map(|dir| Arc::new(ArtifactStore::new(dir)));
    let config =
        SinkConfig { max_bytes: args.max_bytes, max_lines: args.max_lines, ..Default::default() };
    let mut sink = Sink::new(config, store);
    if args.no_rescue {
        sink = sink.without_rescue();
    }
    let mut sanitizer = Sanitizer::new();
    let mut text = String::new();
    let mut buf = vec![0u8; READ_CHUNK];
    let mut stdin = std::io::stdin().lock();
    loop {
        let n = match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        sanitizer.push(&buf[..n], &mut text);
        // Leaves `text` empty for the next read.
        sink.push_owned(&mut text);
    }
    text.clear();
    sanitizer.finish(&mut text);
    sink.push(&text);
    let result =
        shape(sink.finish(), &Outcome::Exited(0), started.elapsed(), args.max_bytes as u64);
    let mut stdout = std::io::stdout().lock();
    if args.json {
        let json = super::wire::result_line(&result, false)?;
        writeln!(stdout, "{json}")?;
    } else {
        stdout.write_all(result.output.as_bytes())?;
        if !result.output.ends_with('\n') {
            stdout.write_all(b"\n")?;
        }
    }
    stdout.flush()?;
    Ok(0)
}
