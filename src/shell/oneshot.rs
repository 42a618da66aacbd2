//! One command in a process of its own: `<prefix> <shell> -c 'cd CWD && eval CMD'`, with stdout
//! and stderr on one pipe (stderr on one of its own after a stripped stage, contract §1). This is the fallback for prefixes that put the shell where our FIFOs
//! and rc snapshot do not exist ([`super::local::ISOLATED`]); shell state does not persist
//! between such commands. The same ending rules apply ([`super::read_loop`]): background output
//! idle for [`super::session::BACKGROUND_IDLE`] (at most
//! [`super::session::BACKGROUND_CAP`]) after the command exits, and a timeout or cancel kills
//! the tree.

use std::future::Future;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::process::Child;
use tokio_util::sync::CancellationToken;

use super::local::{shell_command, ShellConfig};
use super::procs;
use super::read_loop::{read_loop, Event, Phase, Transport};
use super::session::{exit_code, Ending, OutputSink, RunEnd, RunError, Session};
use crate::project::quote;

/// Reads from the output pipe in chunks of this size.
const READ_CHUNK: usize = 256 * 1024;

/// The runner: nothing lives between commands, so starting it only keeps the configuration.
#[derive(Debug)]
pub struct Oneshot {
    cfg: ShellConfig,
}

impl Session for Oneshot {
    type Config = ShellConfig;
    type StartError = std::convert::Infallible;
    type Cwd<'a>
        = &'a Path
    where
        Self: 'a;

    async fn start(cfg: &ShellConfig) -> Result<Self, Self::StartError> {
        Ok(Oneshot { cfg: cfg.clone() })
    }

    fn run<'a>(
        &'a mut self,
        command: &'a str,
        cwd: &'a Path,
        out: &'a mut dyn OutputSink,
        deadline: Option<Instant>,
        cancel: &'a CancellationToken,
    ) -> impl Future<Output = Result<RunEnd, RunError>> + Send + 'a {
        run(&self.cfg, command, cwd, out, deadline, cancel)
    }

    /// Each run's tree is gone when its run returns: nothing to kill.
    async fn kill(&mut self) {}

    async fn close(&mut self) {}

    fn is_alive(&self) -> bool {
        true
    }
}

/// The child and its output pipe, as the read loop sees them.
struct OneshotRun {
    child: Child,
    pid: i32,
    /// Owned, so that dropping it (the head-only rule) closes the pipe and the producer gets
    /// SIGPIPE.
    reader: Option<tokio::net::unix::pipe::Receiver>,
    /// The stderr pipe of a command that lost its stage (contract §1), read first when both
    /// have bytes, as bash's stderr overtakes a stage's output.
    apart: Option<tokio::net::unix::pipe::Receiver>,
    buf: Vec<u8>,
    n: usize,
    /// The last chunk came from `apart`, read into `ebuf`.
    from_apart: bool,
    ebuf: Vec<u8>,
    exited: bool,
}

enum Wake {
    Output(std::io::Result<usize>),
    Apart(std::io::Result<usize>),
    Exited(std::io::Result<std::process::ExitStatus>),
}

impl Transport for OneshotRun {
    type Wake = Wake;

    async fn wait(&mut self, phase: Phase) -> Wake {
        let reading = phase.reading && self.reader.is_some();
        tokio::select! {
            biased;
            n = async { match self.apart.as_mut() { Some(r) => r.read(&mut self.ebuf).await, None => std::future::pending().await } }, if self.apart.is_some() => Wake::Apart(n),
            n = async { match self.reader.as_mut() { Some(r) => r.read(&mut self.buf).await, None => std::future::pending().await } }, if reading => Wake::Output(n),
            st = self.child.wait(), if phase.running => Wake::Exited(st),
            else => std::future::pending::<Wake>().await,
        }
    }

    async fn handle(&mut self, wake: Wake, _phase: Phase) -> Event {
        match wake {
            Wake::Output(Ok(0) | Err(_)) => Event::OutputEnd,
            Wake::Output(Ok(n)) => {
                (self.n, self.from_apart) = (n, false);
                Event::Output
            }
            Wake::Apart(Ok(0) | Err(_)) => {
                self.apart = None;
                Event::Nothing
            }
            Wake::Apart(Ok(n)) => {
                (self.n, self.from_apart) = (n, true);
                Event::Output
            }
            Wake::Exited(st) => {
                procs::disown_child(self.pid);
                self.exited = true;
                Event::Foreground(Ending::Done(st.ok().and_then(exit_code).unwrap_or(1)))
            }
        }
    }

    fn chunk(&self) -> &[u8] {
        match self.from_apart {
            true => &self.ebuf[..self.n],
            false => &self.buf[..self.n],
        }
    }

    fn chunk_apart(&self) -> bool {
        self.from_apart
    }

    async fn close_output(&mut self) {
        self.reader = None;
    }
}

/// Runs one command in a process of its own (see the module docs).
async fn run(
    cfg: &ShellConfig,
    command: &str,
    cwd: &Path,
    out: &mut dyn OutputSink,
    deadline: Option<Instant>,
    cancel: &CancellationToken,
) -> Result<RunEnd, RunError> {
    let group = procs::Group::new(false);
    let script = format!(
        "builtin cd -- {} && builtin eval {}",
        quote(&cwd.to_string_lossy()),
        quote(command)
    );
    let (tx, rx) = tokio::net::unix::pipe::pipe()?;
    let writer = tx.into_blocking_fd()?;
    // stderr on the same pipe, or on one of its own (contract §1).
    let (writer2, apart) = match out.stderr_apart() {
        true => {
            let (etx, erx) = tokio::net::unix::pipe::pipe()?;
            (etx.into_blocking_fd()?, Some(erx))
        }
        false => (writer.try_clone()?, None),
    };
    let (mut cmd, join) = shell_command(cfg, &["-c".into(), script.into()], &group);
    cmd.stdin(Stdio::null()).stdout(Stdio::from(writer)).stderr(Stdio::from(writer2));
    let fence = cfg.fence.as_ref();
    let child = procs::spawn_owned(
        || crate::fence::spawn_fenced(fence, || cmd.spawn()),
        |c| c.id().map(|p| p as i32),
    )?;
    // Our copies of the write end went into the child; only its tree holds the pipe now.
    drop((cmd, join));
    let pid = child.id().map(|p| p as i32).unwrap_or(-1);
    group.started(pid);
    let mut run = OneshotRun {
        child,
        pid,
        reader: Some(rx),
        buf: vec![0u8; READ_CHUNK],
        n: 0,
        from_apart: false,
        ebuf: match apart {
            Some(_) => vec![0u8; READ_CHUNK],
            None => Vec::new(),
        },
        apart,
        exited: false,
    };
    let end = read_loop(&mut run, out, deadline, cancel).await;
    // Whatever is left (background jobs, or the whole tree on timeout and cancel) goes.
    group.kill(procs::KILL_GRACE).await;
    if !run.exited {
        let _ = run.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(1), run.child.wait()).await;
        procs::disown_child(pid);
    }
    let end = end?;
    Ok(RunEnd::of(end.ending, end.eof, end.closed_early))
}
