//! The `agent-bash` binary: parse arguments, set up logging, run a mode, exit with its status.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use agent_bash::mode;
use agent_bash::shell::procs;

#[derive(Debug, Parser)]
#[command(
    name = "agent-bash",
    version,
    about = "Runs shell commands for coding agents and for you"
)]
struct Cli {
    /// Log file (default: `$AGENT_BASH_LOG`, else `<state dir>/agent-bash/agent-bash.log`).
    #[arg(long, global = true)]
    log_file: Option<PathBuf>,
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Debug, Subcommand)]
enum Mode {
    /// Run one tool call and print the model-facing text (print mode).
    Exec(mode::exec::ExecArgs),
    /// msgpack-RPC over stdio for the Neovim plugin (started by it).
    Nvim(mode::nvim::NvimArgs),
    /// JSON lines over stdio (`bash`, `abort_bash`, `tool_call`, `abort_tool_call`, `get_context`,
    /// `history`, `artifact`).
    Rpc(mode::rpc::RpcArgs),
    /// Model Context Protocol server over stdio (tool `bash`, artifacts as resources); shows
    /// every call in the user's Neovim.
    Mcp(mode::mcp::McpArgs),
    /// Show what normalization and interception make of a command (one JSON object).
    Explain(mode::explain::ExplainArgs),
    /// Read raw bytes on stdin and print the model-facing text.
    Sanitize(mode::sanitize::SanitizeArgs),
    /// Internal: kills what a backend started once that backend is gone.
    #[command(name = "__watchdog", hide = true)]
    Watchdog {
        owner: String,
        /// The backend's parent cgroup, killed and removed when the backend is gone.
        #[arg(long)]
        cgroup: Option<PathBuf>,
    },
    /// Internal: the receipt engine of one project, shared by the user's backends.
    #[command(name = "__changes-engine", hide = true)]
    ChangesEngine { socket: std::ffi::OsString },
}

#[allow(clippy::disallowed_methods)] // at start-up, before the runtime serves anything
fn init_logging(path: Option<PathBuf>) {
    let path = path
        .or_else(|| std::env::var_os("AGENT_BASH_LOG").map(PathBuf::from))
        .unwrap_or_else(|| agent_bash::artifacts::state_root().join("agent-bash.log"));
    let Ok(file) = agent_bash::logfile::open(&path) else {
        return;
    };
    let filter = agent_bash::logfile::filter(std::env::var("AGENT_BASH_LOG_LEVEL").ok().as_deref());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(std::sync::Mutex::new(file))
        .try_init();
}

/// Runs an async mode as a subreaper. One thread drives all I/O: it avoids cross-thread
/// wake-ups on every round trip (measured: `true` via RPC 0.31 → 0.25 ms) and costs no
/// throughput, since artifact writes, PTY reads and process kills have threads of their own.
fn run_async<F: std::future::Future<Output = agent_bash::Result<i32>>>(
    f: F,
) -> anyhow::Result<i32> {
    procs::become_subreaper();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let code = rt.block_on(async {
        let reaper = tokio::spawn(reap_loop());
        let scanner = tokio::spawn(procs::scan_loop());
        let code = f.await;
        reaper.abort();
        scanner.abort();
        code
    })?;
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    Ok(code)
}

/// Runs a project's receipt engine (one thread, like the backends) until it has no client.
fn run_engine(socket: std::ffi::OsString) -> anyhow::Result<i32> {
    // Every snapshot makes a tree of the project's files and drops the one before: glibc gave
    // such blocks back to the kernel and took them again, one page fault a page (measured under
    // eight agents: most of the engine's kernel time). An engine keeps them instead.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: plain settings of the allocator, before any other thread of ours exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let code = rt.block_on(agent_bash::changes::engine::serve(socket));
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    Ok(code)
}

/// Reaps orphans adopted as subreaper whenever a child changes state.
async fn reap_loop() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut sig) = signal(SignalKind::child()) else { return };
    while sig.recv().await.is_some() {
        // A scan of /proc: off the runtime thread.
        let _ = tokio::task::spawn_blocking(procs::reap_adopted).await;
    }
}

fn main() {
    let cli = Cli::parse();
    if let Mode::Watchdog { owner, cgroup } = &cli.mode {
        std::process::exit(procs::run_watchdog(owner, cgroup.as_deref()));
    }
    init_logging(cli.log_file);
    let status: anyhow::Result<i32> = match cli.mode {
        Mode::Exec(args) => run_async(mode::exec::run(args)),
        Mode::Rpc(args) => run_async(mode::rpc::run(args)),
        Mode::Nvim(args) => run_async(mode::nvim::run(args)),
        Mode::Mcp(args) => run_async(mode::mcp::run(args)),
        Mode::Explain(args) => mode::explain::run(args).map_err(Into::into),
        Mode::Sanitize(args) => mode::sanitize::run(args).map_err(Into::into),
        Mode::Watchdog { .. } => Ok(0),
        Mode::ChangesEngine { socket } => run_engine(socket),
    };
    match status {
        Ok(code) => std::process::exit(code),
        Err(err) => {
            eprintln!("agent-bash: {err}");
            std::process::exit(2);
        }
    }
}
