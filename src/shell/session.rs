//! The one interface of the three shells (contract §5, §12): the persistent local shell
//! ([`super::local::Shell`]), the one-process-per-command runner ([`super::oneshot::Oneshot`],
//! for isolating prefixes) and the remote shell ([`super::remote::RemoteShell`]).
//!
//! A trait rather than an enum: what sits above it (slots, keys, `max_sessions`, eviction,
//! `shell_restarted`) is the same code for the local pool and the remote one, generic over the
//! session it holds, and a local slot can then never hold a remote shell. Each shell keeps its
//! own start-up and its own way of ending (a local kill ladder, a remote `K` frame); what they
//! share, the read loop and its background-wait rules, is [`super::read_loop`], generic too, so
//! nothing on a command's round trip goes through a virtual call.
//!
//! The methods return `impl Future + Send` (not `async fn`) so that code generic over a
//! [`Session`] may spawn what it awaits.

use std::future::Future;
use std::io;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// After the foreground part ends, background jobs may still hold the output pipe: wait while it
/// keeps producing, but return once it has been idle this long (contract §5).
pub const BACKGROUND_IDLE: Duration = Duration::from_millis(250);
/// ... and never longer than this after the foreground ended (contract §5).
pub const BACKGROUND_CAP: Duration = Duration::from_secs(2);
/// How long the output must pause before [`OutputSink::idle`] is called.
pub const IDLE_TICK: Duration = Duration::from_millis(50);

/// Receives a command's raw output (the feed of a run). Returning `false` closes the output
/// stream (the producer then gets SIGPIPE), used for the head-only rule of contract §1.
pub trait OutputSink: Send {
    fn data(&mut self, bytes: &[u8]) -> bool;
    /// Called when no output has arrived for [`IDLE_TICK`] while the command runs (a chance to
    /// send a live update that the throttle held back).
    fn idle(&mut self) {}
    /// When to close the output stream even if no more output arrives (the time bound of the
    /// head-only rule, contract §1).
    fn close_at(&self) -> Option<Instant> {
        None
    }
    /// The command lost a `| head`/`| tail` stage after a lone other stage (contract §1): a
    /// shell that can records the stage's status in PIPESTATUS and `$?` as bash would have.
    fn lone_stage_stripped(&self) -> bool {
        false
    }
    /// The command lost a `| head`/`| tail` stage (contract §1): a shell that can sends its
    /// stderr apart, to [`OutputSink::apart`], since bash prints it past the stage's limit.
    fn stderr_apart(&self) -> bool {
        false
    }
    /// Bytes of the command's stderr, kept apart ([`OutputSink::stderr_apart`]).
    fn apart(&mut self, bytes: &[u8]) {
        self.data(bytes);
    }
}

impl<F: FnMut(&[u8]) -> bool + Send> OutputSink for F {
    fn data(&mut self, bytes: &[u8]) -> bool {
        self(bytes)
    }
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The foreground part finished with this status; the shell lives on.
    Done(i32),
    /// The shell itself ended (`exit`, `exec`, a crash): its status if known.
    ShellExited(Option<i32>),
    TimedOut,
    Cancelled,
}

/// The outcome of [`Session::run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunEnd {
    pub ending: Ending,
    /// We closed the output early because the sink asked for it.
    pub closed_early: bool,
    /// The foreground ended while something still held the output open (a background job),
    /// and the run ended by the background-wait rules (idle, or the cap) rather than at the
    /// output's end (contract §5).
    pub held: bool,
}

impl RunEnd {
    /// The outcome of a read loop that ended `ending`: `eof` no writer held the output any
    /// more, `closed_early` we closed it.
    pub fn of(ending: Ending, eof: bool, closed_early: bool) -> RunEnd {
        let held = matches!(ending, Ending::Done(_)) && !eof && !closed_early;
        RunEnd { ending, closed_early, held }
    }
}

/// Why a run has no [`RunEnd`].
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The local machinery failed (a FIFO, the protocol write): nothing is known of the command.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The cwd is not a directory on the remote side (nothing ran); the session lives on.
    #[error("the working directory does not exist")]
    BadCwd,
    /// The connection to a remote shell was lost: `Remote session lost: <reason>`.
    #[error("Remote session lost: {0}")]
    Lost(String),
}

/// A shell that runs one command at a time.
pub trait Session: Sized + Send {
    /// What starting one takes.
    type Config: Sync;
    /// Why it could not start.
    type StartError;
    /// Where a command runs: a local directory, or (remote) a path on the other side, `None`
    /// for where the last command left the shell.
    type Cwd<'a>: Send
    where
        Self: 'a;

    /// Starts the shell and waits until it answers.
    fn start(cfg: &Self::Config) -> impl Future<Output = Result<Self, Self::StartError>> + Send;

    /// Runs one command, its output going to `out` as it arrives. `deadline` is the timeout
    /// instant (None: no timeout); `cancel` stops the run. After any ending but
    /// [`Ending::Done`] the shell is gone ([`Session::is_alive`] says so): close it.
    fn run<'a>(
        &'a mut self,
        command: &'a str,
        cwd: Self::Cwd<'a>,
        out: &'a mut dyn OutputSink,
        deadline: Option<Instant>,
        cancel: &'a CancellationToken,
    ) -> impl Future<Output = Result<RunEnd, RunError>> + Send + 'a;

    /// Kills the shell's whole process tree now (and ends the session).
    fn kill(&mut self) -> impl Future<Output = ()> + Send;

    /// Ends the session in order: nothing it started survives.
    fn close(&mut self) -> impl Future<Output = ()> + Send;

    /// Whether the session can run another command.
    fn is_alive(&self) -> bool;
}

/// Exit code of a process: its status, or 128 + signal number (contract §5).
pub fn exit_code(st: std::process::ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    st.code().or_else(|| st.signal().map(|s| 128 + s))
}
