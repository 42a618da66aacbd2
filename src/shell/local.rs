//! Persistent shell sessions: one long-lived shell per session key, driven through `eval`.
//!
//! # Design
//! Measured on this machine, a fresh `bash -c true` costs ≈ 1.1 ms while a live bash answers a
//! builtin in 0.02–0.1 ms, and only a live shell keeps variables, functions, aliases and options
//! between commands. So each session key owns one shell process that reads *our* protocol on its
//! stdin and never sees the command's input or output:
//!
//! * stdin (pipe, ours): one line per command. The command travels quoted, as data, and runs
//!   through `eval` with stdin /dev/null, so a syntax error is an ordinary failed command (exit 2)
//!   instead of killing a shell that reads its script from stdin, and a command that reads stdin
//!   cannot eat the protocol.
//! * a status FIFO of the shell's own (`<shell dir>/f/st`), which the shell opens by name only
//!   *after* the command, to write `<nonce> <status>` when the foreground part is done. The
//!   nonce is random per command and travels only in the protocol line, after the command, so
//!   the command cannot know it before it has ended: no descriptor the runtime reads a status
//!   from is open while the command runs, and a forged line (on any descriptor, in the FIFO)
//!   is just output (contract §5). The shell's stdout (a pipe) carries only the start-up reply;
//!   afterwards it is watched for its end (the shell exited), and what is written to it is
//!   dropped.
//! * the output FIFO (one per command, created by us, opened for reading *before* the command is
//!   sent, in fact while the previous command ran): stdout and stderr of the command in one
//!   stream, in write order. Because it is a separate channel per command, background jobs that
//!   keep writing never corrupt the protocol, and dropping our read end gives the producer
//!   SIGPIPE exactly as `| head` would.
//!
//! # Bash: a session is one script (contract §5)
//! A bash session loads the runner builtin (`src/shell/runner.c`, with its spawn path
//! `src/shell/spawn.c`, built by `build.rs` and loaded with `enable -f`), and the last line of
//! the start-up script enters it for good: from then on the shell's top level runs nothing
//! else. Each call comes to it as a frame on stdin (token, cwd, output FIFO, flags, text:
//! [`Shell::frame`]), and it runs the text with bash's own `parse_and_execute(text, "-c", …)`,
//! as `bash -c` runs its string, then writes `<token> <status>` to the status FIFO. No bash code
//! of ours runs around a call, so nothing of ours shows (no `eval`/`source` frame, variable,
//! trap firing, traced line or `$-` flag), what one call leaves (`$?`, PIPESTATUS, `$_`,
//! traps) is what the next starts with, and a call that would end the script (`exit`, `set -e`,
//! `set -u`) ends the shell as `bash -c` ends, its EXIT trap writing into the call's output. A
//! bash that cannot load it (no C compiler at build time, not Linux, a bash without `enable
//! -f`, an isolating prefix) runs the plain-bash driver below; what that driver shows is listed
//! in doc/internals.md.
//!
//! # No command breaks the next one (contract §5)
//! For bash without the runner, the protocol line holds no reserved word and every builtin is written `\builtin`:
//! after an `eval` that hit the end of its text inside a quote, bash no longer recognizes a
//! reserved word at the start of the next line it reads (measured with bash 5.2: `{` then
//! fails as a syntax error, which kills a shell reading from stdin), and a user's alias must
//! not rewrite our words. The command itself runs from a one-line *driver* file named `bash`,
//! sourced from a per-shell directory: a sourced file numbers its lines from 1, so errors name
//! the user's lines (`bash: line 1: cd: /nope: No such file or directory`, as `bash -c`
//! prints), and at top level of a sourced file `declare`, `local` and `$1` mean what they mean
//! in `bash -c` (a function would make `declare` local and take `return`). Only syntax errors
//! differ from `bash -c`: bash names the `eval` (`bash: eval: line 1: …`) where it names `-c`.
//! zsh runs each command from a driver file named `zsh` the same way ([`super::zsh`]: the
//! command's text is written into it, parse-checked first); its protocol line sources `cmd`
//! and writes the status with the token exactly as bash's does. Other POSIX shells get the
//! same protocol inline.
//!
//! `exit`, `exec` and crashes end the shell process; the session notices through its stdout's
//! EOF and the child's exit status, and the next command starts a fresh shell. A status FIFO
//! the shell cannot open makes it exit (`|| exit`), which the session notices the same way,
//! instead of waiting forever for a status that cannot come.
//!
//! Each shell's files live in a directory of its own that the backend makes before the shell
//! starts (`<runtime>/sh-<id>/`: the drivers and the `cmd` file, read-only to a fenced shell;
//! `f/`: the status and output FIFOs, the only things a fenced shell may open for writing
//! there, see [`crate::fence`]).
//!
//! The shell runs in its own process group and its own [`procs::Group`] (a cgroup, and a child
//! subreaper); cancel and timeout kill the whole group and throw the shell away.

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio_util::sync::CancellationToken;

use super::procs;
use super::read_loop::{read_loop, Event, LoopEnd, Phase, Transport};
use super::session::{RunError, Session};
use super::zsh;
use crate::project::quote;

pub use super::session::{
    exit_code, Ending, OutputSink, RunEnd, BACKGROUND_CAP, BACKGROUND_IDLE, IDLE_TICK,
};

/// After a kill, how long to keep draining output that was already written.
const DRAIN_AFTER_KILL: Duration = Duration::from_millis(200);
/// Reads from the output FIFO in chunks of this size.
const READ_CHUNK: usize = 256 * 1024;
/// Capacity asked for the output FIFO (the default is 64 KiB): a fast producer then blocks, and
/// we wake up, four times less often. The kernel may grant less (`pipe-max-size`).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
const PIPE_SIZE: libc::c_int = 1 << 20;
/// A shell that does not say it is ready within this time is considered broken.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// A command's output FIFO joins the event loop only once the command has run this long;
/// before, its output is read when the status line comes. A quick command then costs one
/// wake-up (its status) instead of two (the output's hang-up, then the status) and no epoll
/// registration; a longer one only starts streaming this much later.
const QUICK: Duration = Duration::from_millis(3);

/// Where the private runtime directory (FIFOs, the per-command file, snapshots) is made: a
/// memory file system when there is one we may write, since every command creates a FIFO and
/// a file there and removes the FIFO (measured here: 330 µs per command on ext4, 30 µs on
/// tmpfs). `$XDG_RUNTIME_DIR` (the user's own tmpfs), else `/dev/shm`, else the temp directory.
pub fn runtime_base() -> PathBuf {
    runtime_bases().into_iter().next().unwrap_or_else(std::env::temp_dir)
}

/// The places [`runtime_base`] may choose, usable ones only, best first (the runtime takes the
/// first one no fenced shell may write, contract §13).
pub fn runtime_bases() -> Vec<PathBuf> {
    let usable = |dir: &Path| {
        use std::os::unix::ffi::OsStrExt;
        let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return false };
        // SAFETY: a valid C string; access(2) only reads it.
        dir.is_absolute()
            && dir.is_dir()
            && unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } == 0
    };
    let xdg = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from);
    xdg.into_iter()
        .chain([PathBuf::from("/dev/shm"), std::env::temp_dir()])
        .filter(|d| usable(d))
        .collect()
}

/// The spawn error of a shell that cannot see the backend's runtime directory (a prefix such
/// as `docker exec -i box` runs it in another filesystem): see [`super::oneshot`].
pub const ISOLATED: &str = "the shell cannot see the backend's files (isolating prefix)";

/// Whether a spawn error is [`ISOLATED`].
pub fn is_isolated(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Other && e.to_string() == ISOLATED
}

/// `<prefix…> <shell> <no-rc args> <extra…>` as a command with the shell environment and the
/// owner mark, in a process group of its own, entering `group` (keep the returned fd until the
/// spawn returned).
pub(super) fn shell_command(
    cfg: &ShellConfig,
    extra: &[OsString],
    group: &procs::Group,
) -> (Command, Option<std::os::fd::OwnedFd>) {
    let kind = ShellKind::of(&cfg.shell);
    let mut argv: Vec<OsString> = cfg.prefix.iter().map(OsString::from).collect();
    argv.push(cfg.shell.clone().into_os_string());
    argv.extend(kind.args().iter().map(OsString::from));
    argv.extend(extra.iter().cloned());
    let mut std_cmd = std::process::Command::new(&argv[0]);
    if cfg.prefix.is_empty() {
        // `$0` and the name in error messages, as `bash -c` shows them (`bash: line 1: …`).
        if let Some(name) = cfg.shell.file_name() {
            std::os::unix::process::CommandExt::arg0(&mut std_cmd, name);
        }
    }
    let join = group.prepare(&mut std_cmd);
    let mut cmd = Command::from(std_cmd);
    cmd.args(&argv[1..])
        .env_clear()
        .envs(cfg.env.iter().map(|(k, v)| (k, v)))
        .env(procs::OWNER_VAR, &cfg.owner)
        .process_group(0)
        .kill_on_drop(true);
    (cmd, join)
}

/// Which dialect the protocol lines are written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShellKind {
    Bash,
    Zsh,
    /// Any other POSIX shell.
    Posix,
}

impl ShellKind {
    pub fn of(path: &Path) -> ShellKind {
        match path.file_name().and_then(|n| n.to_str()) {
            Some("bash") => ShellKind::Bash,
            Some("zsh") => ShellKind::Zsh,
            _ => ShellKind::Posix,
        }
    }

    /// Arguments that start the shell without reading any rc file (the snapshot replaces them).
    pub fn args(self) -> &'static [&'static str] {
        match self {
            ShellKind::Bash => &["--noprofile", "--norc"],
            ShellKind::Zsh => &["-f"],
            ShellKind::Posix => &[],
        }
    }
}

/// Everything needed to start a shell for a session.
#[derive(Debug, Clone)]
pub struct ShellConfig {
    pub shell: PathBuf,
    /// The full environment of the shell (markers are added at spawn).
    pub env: Vec<(OsString, OsString)>,
    /// Words that wrap the shell process (`nice -n 10`, `docker exec -i box`).
    pub prefix: Vec<String>,
    /// Script sourced once at start (the user's rc snapshot).
    pub snapshot: Option<PathBuf>,
    /// Private directory for the per-command FIFOs.
    pub runtime_dir: PathBuf,
    /// The backend's owner mark value ([`procs::OWNER_VAR`]).
    pub owner: String,
    /// The Landlock fence the shell starts under (contract §13); none for bang commands.
    pub fence: Option<crate::fence::Fence>,
    /// Bash sessions run their calls through the runner builtin ([`SPAWN_SO`]) where it
    /// loads; false: the plain-bash driver (see the module docs).
    pub runner: bool,
    /// With the runner: a plain external command starts with `posix_spawn` instead of bash's
    /// fork (`src/shell/spawn.c`).
    pub spawn: bool,
}

/// A live shell process.
#[derive(Debug)]
pub struct Shell {
    child: Child,
    pid: i32,
    group: procs::Group,
    stdin: ChildStdin,
    /// The shell's stdout: the start-up reply, then only its end (the shell exited).
    stdout: BufReader<ChildStdout>,
    /// The status FIFO's read end (opened read-write: it never reports an end of file).
    status: StatusFifo,
    seq: u64,
    /// The tree has been killed already: a second kill has nothing to do.
    killed: bool,
    /// The shell cannot run another command (it exited, or a run ended it).
    dead: bool,
    kind: ShellKind,
    /// This shell's directory (see the module docs), removed with the shell.
    dir: PathBuf,
    /// Bash: the directory holding this shell's driver file (see the module docs).
    driver_dir: Option<PathBuf>,
    /// The read buffer, kept from one command to the next: zeroing [`READ_CHUNK`] bytes for
    /// every command is a measurable part of a builtin's round trip.
    buf: Vec<u8>,
    /// The read buffer of a command's stderr when it goes apart (allocated on first use).
    ebuf: Vec<u8>,
    /// Bash: the per-command file (see [`Shell::run`]), kept open and rewritten in place, and
    /// the length of what it holds.
    cmd_file: Option<(std::fs::File, u64)>,
    /// The output FIFO of the next command, made while the previous one ran: its sequence
    /// number, path and read end.
    next_fifo: Option<(u64, PathBuf, std::os::fd::OwnedFd)>,
    /// The FIFO of the last finished command, removed while the next one runs (or at the end).
    stale_fifo: Option<PathBuf>,
    /// Where this session's CPU time is read (found once, at start).
    probe: crate::resources::CpuProbe,
    /// Bash loaded the runner builtin ([`SPAWN_SO`]): calls go to it as frames.
    runner: bool,
    /// With the runner, plain commands may take its spawn path.
    spawn: bool,
}

/// Shell variables the bash protocol line hands to the driver.
const VAR_CMD: &str = "__agent_bash_cmd";
const VAR_CWD: &str = "__agent_bash_cwd";
const VAR_OLDPWD: &str = "__agent_bash_oldpwd";
/// The per-command part of the bash protocol (see [`Shell::run`]).
const COMMAND_NAME: &str = "cmd";
/// A read-only variable holding the path of [`COMMAND_NAME`]: bash reads its protocol from a
/// pipe one byte per read(2), so the line names the file through it (`\builtin .
/// "$__ab_c"`, 20 bytes instead of a path of 40 or more).
const VAR_CMD_FILE: &str = "__ab_c";
/// A read-only variable holding the path of the status FIFO.
const VAR_STATUS_FILE: &str = "__ab_s";
/// The subdirectory of a shell's directory holding its FIFOs.
pub const FIFO_DIR: &str = "f";
/// The status FIFO's name in [`FIFO_DIR`].
const STATUS_NAME: &str = "st";
/// The driver's file name: what bash names in error messages, as `bash -c` does.
const DRIVER_NAME: &str = "bash";
/// The shell variable naming the driver's directory: the subshell driver's for a command
/// that ends inside `$(`, unless `set -v` would show the driver's line.
const VAR_DRIVER: &str = "__agent_bash_d";
/// The shell variable holding the name the driver is sourced by.
const VAR_DOT: &str = "__agent_bash_dot";
/// The bash loadable builtin `src/shell/runner.c` with `src/shell/spawn.c` (built by
/// `build.rs`; empty when the build machine had no C compiler): runs each call as `bash -c`
/// runs its string, and a plain external command with `posix_spawn` from inside the session's
/// bash instead of bash's fork, which costs more than the rest of a round trip.
const SPAWN_SO: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/spawn.so"));
/// Whether this build has the spawn builtin ([`SPAWN_SO`]) and uses it: Linux only, so never
/// on the portable paths (`AGENT_BASH_PORTABLE=1` runs what macOS runs).
pub fn spawn_built() -> bool {
    !SPAWN_SO.is_empty() && !crate::platform::portable()
}

/// The subshell driver's subdirectory of the driver directory.
const SUBSHELL_DIR: &str = "p";
/// The one bash version whose runner takes the spawn path: the version matrix
/// (`tests/suite/spawn.rs`) proves it there only. 4.4 reports a `Terminated` child as
/// `bash: line 1: PID Terminated …` where the spawn path prints bash 5.2's short form, and 5.3
/// pads signal descriptions differently. Elsewhere the runner leaves every command to bash,
/// which forks as usual (the spawn path saves ≈ 0.1 ms per external command).
const SPAWN_PROVEN: &str = "5.2";
/// The runner builtin's name (its symbol is `<name>_struct`).
const RUNNER_BUILTIN: &str = "__agent_bash_run";
/// The word of the start-up reply that says the runner loaded.
const RUNNER_REPLY: &str = "run";
/// The word after it that says the spawn path is proven on this bash ([`SPAWN_PROVEN`]).
const SPAWN_REPLY: &str = "spawn";
/// Its file in the backend's runtime directory.
const SPAWN_FILE: &str = "spawn.so";

static NONCE: AtomicU64 = AtomicU64::new(0);

/// A process-unique token: pid, time and a counter.
pub fn nonce() -> String {
    let n = NONCE.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{}-{:x}-{n}", std::process::id(), t & 0xffff_ffff_ffff)
}

/// The status FIFO's read end, and what has been read from it that is no whole line yet.
#[derive(Debug)]
struct StatusFifo {
    rx: tokio::net::unix::pipe::Receiver,
    pending: Vec<u8>,
    /// The portable paths' own write end, held so that no end of file ever comes.
    _writer: Option<std::fs::File>,
    /// The last status line said the shell traces what it runs (`set -x`/`set -v` on: the
    /// runner adds ` x`).
    traces: bool,
}

impl StatusFifo {
    /// Makes the FIFO `path` (0600) and opens it read-write (Linux), so that no end of file
    /// ever comes. POSIX leaves a read-write FIFO undefined: the portable twin opens the read
    /// end, then a write end of its own that it holds.
    fn open(path: &Path) -> io::Result<StatusFifo> {
        make_fifo(path)?;
        let options = tokio::net::unix::pipe::OpenOptions::new();
        #[cfg(target_os = "linux")]
        if !crate::platform::portable() {
            let rx = options.clone().read_write(true).open_receiver(path)?;
            return Ok(StatusFifo { rx, pending: Vec::new(), _writer: None, traces: false });
        }
        let rx = options.open_receiver(path)?;
        #[allow(clippy::disallowed_methods)] // a FIFO on the runtime directory, as `open_fifo`
        let writer = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(path)?
        };
        Ok(StatusFifo { rx, pending: Vec::new(), _writer: Some(writer), traces: false })
    }

    /// Takes what was read (`bytes`) and returns the status of the line that carries `token`
    /// (`<token> <status>`, the runner's with ` x` when the shell traces), if one came. Anything else is dropped; a flood without a newline
    /// keeps only its tail (a real line is short and written in one piece, so it is whole in
    /// there whatever came before it).
    fn take(&mut self, bytes: &[u8], token: &str) -> Option<i32> {
        self.pending.extend_from_slice(bytes);
        let mut found = None;
        while let Some(nl) = memchr::memchr(b'\n', &self.pending) {
            let line: Vec<u8> = self.pending.drain(..=nl).collect();
            let line = String::from_utf8_lossy(&line[..nl]);
            if let Some(at) = line.find(token) {
                let mut rest = line[at + token.len()..].split_whitespace();
                found = Some(rest.next().and_then(|w| w.parse().ok()).unwrap_or(1));
                self.traces = rest.next() == Some("x");
            }
        }
        if self.pending.len() > 4096 {
            let cut = self.pending.len() - 128;
            self.pending.drain(..cut);
        }
        found
    }
}

/// Whether `pid` is blocked reading its standard input: `/proc/<pid>/syscall` says `read` on
/// fd 0 (Linux); on the portable paths, `ps` shows it asleep in a pipe read (its stdin is our
/// pipe).
fn waits_on_stdin(pid: i32) -> bool {
    #[cfg(target_os = "linux")]
    if !crate::platform::portable() {
        #[allow(clippy::disallowed_methods)] // a small /proc file, read on an idle tick
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/syscall")) else {
            return false;
        };
        let mut fields = text.split_whitespace();
        let nr = fields.next().and_then(|f| f.parse::<i64>().ok());
        return nr == Some(libc::SYS_read) && fields.next() == Some("0x0");
    }
    // Linux names the wait `pipe_read` (`anon_pipe_read` from 6.16, `pipe_wait` before 5.6),
    // macOS `piperd`.
    procs::wait_channel(pid).is_some_and(|(state, chan)| {
        let pipe = ["pipe_read", "anon_pipe_read", "pipe_wait", "piperd"];
        state.starts_with(['S', 'I']) && pipe.contains(&chan.as_str())
    })
}

impl Shell {
    /// Starts a shell, sources the snapshot and waits until it answers.
    pub async fn spawn(cfg: &ShellConfig) -> io::Result<Shell> {
        let kind = ShellKind::of(&cfg.shell);
        // The shell's directory and FIFOs exist before it starts: a fenced shell is allowed
        // to write its FIFOs and nothing else of ours (see the module docs).
        let dir = cfg.runtime_dir.join(format!("sh-{}", nonce()));
        super::rundir::private_dir(&dir)?;
        let made = super::rundir::private_dir(&dir.join(FIFO_DIR))
            .and_then(|()| StatusFifo::open(&dir.join(FIFO_DIR).join(STATUS_NAME)))
            .and_then(|status| Shell::start_process(cfg, kind, &dir, status));
        let mut shell = match made {
            Ok(shell) => shell,
            Err(e) => {
                remove_dir(dir).await;
                return Err(e);
            }
        };
        // The spawn builtin, where bash can load it (a `noexec` runtime directory, a bash
        // without `enable -f` or an isolating prefix cannot): the reply says whether it did.
        let runner_so = match kind {
            ShellKind::Bash if cfg.runner && cfg.prefix.is_empty() => {
                spawn_library(&cfg.runtime_dir)
            }
            _ => None,
        };
        let init = init_script(cfg, kind, &dir, runner_so.as_deref());
        match tokio::time::timeout(READY_TIMEOUT, shell.ready(cfg, &init)).await {
            Ok(Ok(())) => match shell.write_driver() {
                Ok(()) => Ok(shell),
                Err(e) => {
                    shell.kill().await;
                    Err(e)
                }
            },
            Ok(Err(e)) => {
                shell.kill().await;
                Err(e)
            }
            Err(_) => {
                shell.kill().await;
                Err(io::Error::other("shell did not start within 15 s"))
            }
        }
    }

    /// Starts the shell process in `dir` (made, with its status FIFO): not yet answering.
    fn start_process(
        cfg: &ShellConfig,
        kind: ShellKind,
        dir: &Path,
        status: StatusFifo,
    ) -> io::Result<Shell> {
        let group = procs::Group::new(false);
        let (mut cmd, join) = shell_command(cfg, &[], &group);
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null());
        let fence = cfg.fence.as_ref().map(|f| f.with_fifos(dir.join(FIFO_DIR)));
        let mut child = procs::spawn_owned(
            || crate::fence::spawn_fenced(fence.as_ref(), || cmd.spawn()),
            |c| c.id().map(|p| p as i32),
        )?;
        drop(join);
        let pid = child.id().map(|p| p as i32).unwrap_or(-1);
        group.started(pid);
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(io::Error::other("shell pipes missing"));
        };
        Ok(Shell {
            child,
            pid,
            group,
            stdin,
            stdout: BufReader::new(stdout),
            status,
            seq: 0,
            killed: false,
            dead: false,
            kind,
            dir: dir.to_path_buf(),
            driver_dir: None,
            buf: Vec::new(),
            ebuf: Vec::new(),
            cmd_file: None,
            next_fifo: None,
            stale_fifo: None,
            probe: crate::resources::CpuProbe::of(pid),
            runner: false,
            spawn: false,
        })
    }

    /// Sends the start-up script and reads the shell's reply.
    async fn ready(&mut self, cfg: &ShellConfig, init: &str) -> io::Result<()> {
        self.stdin.write_all(init.as_bytes()).await?;
        self.stdin.flush().await?;
        let mut line = String::new();
        let reply = match self.stdout.read_line(&mut line).await? {
            0 => None,
            _ => Some(line.trim_end_matches('\n')),
        };
        match reply {
            Some("R isolated") => Err(io::Error::other(ISOLATED)),
            Some(line) if line.starts_with("R ") => {
                self.runner = line.split_whitespace().nth(2) == Some(RUNNER_REPLY);
                self.spawn =
                    self.runner && cfg.spawn && line.split_whitespace().nth(3) == Some(SPAWN_REPLY);
                Ok(())
            }
            Some(line) => Err(io::Error::other(format!("unexpected shell reply: {line}"))),
            None => Err(io::Error::other(format!(
                "{} exited during start-up",
                cfg.prefix
                    .iter()
                    .map(String::as_str)
                    .chain(std::iter::once(cfg.shell.to_string_lossy().as_ref()))
                    .collect::<Vec<_>>()
                    .join(" ")
            ))),
        }
    }

    /// Runs one command. `deadline` is the timeout instant (None: no timeout).
    ///
    /// After `TimedOut`, `Cancelled` or `ShellExited` the shell is dead; drop it (or call
    /// [`Shell::kill`], which is what the caller does).
    ///
    /// The output FIFO is read only when the kernel reports it readable or hung up: a FIFO
    /// opened for reading with `O_NONBLOCK` reports no hang-up until a writer has come (Linux
    /// `fifo_open`), so no start marker is needed. When the status line comes, one
    /// non-blocking read tells whether the output is still held (a background job), already
    /// closed, or was never opened (the redirection failed).
    #[allow(clippy::disallowed_methods)] // FIFO unlinks stay on the runtime thread: see `open_fifo`
    async fn run_command(
        &mut self,
        command: &str,
        cwd: &Path,
        out: &mut dyn OutputSink,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<RunEnd, RunError> {
        self.seq += 1;
        let seq = self.seq;
        let (fifo, fd) = self.take_fifo(seq)?;
        let quick_until = Instant::now() + QUICK;
        let stage = Stage { lone: out.lone_stage_stripped(), apart: out.stderr_apart() };
        // The stderr of a command that lost its stage, apart (contract §1).
        let erx = match stage.apart {
            true => match open_fifo(&apart_path(&fifo)) {
                Ok(fd) => Some(OutputEnd::Unwatched(fd)),
                Err(e) => {
                    let _ = std::fs::remove_file(&fifo);
                    return Err(e.into());
                }
            },
            false => None,
        };
        let token = match self.send_command(command, cwd, &fifo, stage).await {
            Ok(Some(token)) => token,
            Ok(None) => {
                remove_fifos_of(&fifo, stage.apart);
                let status = self.wait_exit().await;
                self.dead = true;
                return Ok(RunEnd::of(Ending::ShellExited(status), true, false));
            }
            Err(e) => {
                remove_fifos_of(&fifo, stage.apart);
                return Err(e.into());
            }
        };
        // While the shell works: remove the last command's FIFO and make the next one.
        self.between_commands(seq + 1);

        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(READ_CHUNK, 0);
        let mut ebuf = std::mem::take(&mut self.ebuf);
        if erx.is_some() {
            ebuf.resize(READ_CHUNK, 0);
        }
        let mut run = LocalRun {
            rx: Some(OutputEnd::Unwatched(fd)),
            ebuf,
            erx,
            apart: false,
            group: &self.group,
            after_foreground: false,
            quick_until,
            token: &token,
            status: &mut self.status,
            stdout: &mut self.stdout,
            child: &mut self.child,
            pid: self.pid,
            buf,
            n: 0,
            sbuf: [0u8; 512],
            dropped: [0u8; 512],
        };
        let end = read_loop(&mut run, out, deadline, cancel).await;
        let LocalRun { mut rx, erx, mut buf, mut ebuf, .. } = run;
        if let Ok(end) = &end {
            self.after_run(end, &mut rx, &mut buf, out).await;
        }
        // What the stderr still holds: a background job's, or what a killed tree wrote last.
        drain_apart(erx, &mut ebuf, out, Instant::now() + DRAIN_AFTER_KILL);
        drop(rx);
        if stage.apart {
            let _ = std::fs::remove_file(apart_path(&fifo));
        }
        (self.buf, self.ebuf) = (buf, ebuf);
        // Removed while the next command runs, or when the shell goes.
        self.stale_fifo = Some(fifo);
        // Fallback tracking: what the command left running is known before the next one.
        self.group.note();
        let end = end?;
        Ok(RunEnd::of(end.ending, end.eof, end.closed_early))
    }

    /// Writes the command's protocol line: its status token, or `None` when the shell did not
    /// take it (it is gone: a previous `exit` we did not see yet).
    async fn send_command(
        &mut self,
        command: &str,
        cwd: &Path,
        fifo: &Path,
        stage: Stage,
    ) -> io::Result<Option<String>> {
        let token = super::random_hex::<8>()?;
        let line = self.command_line(&token, command, cwd, fifo, stage)?;
        let sent = async {
            self.stdin.write_all(line.as_bytes()).await?;
            self.stdin.flush().await
        };
        match sent.await {
            Ok(()) => Ok(Some(token)),
            Err(e) => {
                tracing::debug!("shell {} did not take the command: {e}", self.pid);
                Ok(None)
            }
        }
    }

    /// After the read loop: a shell that timed out, was cancelled or stopped answering is
    /// killed, keeping what its tree wrote before it died.
    async fn after_run(
        &mut self,
        end: &LoopEnd,
        rx: &mut Option<OutputEnd>,
        buf: &mut [u8],
        out: &mut dyn OutputSink,
    ) {
        if !matches!(end.ending, Ending::Done(_)) {
            self.dead = true;
        }
        if !matches!(end.ending, Ending::TimedOut | Ending::Cancelled | Ending::ShellExited(None)) {
            return;
        }
        let t = Instant::now();
        self.kill().await;
        tracing::debug!("killed shell {} in {:?}", self.pid, t.elapsed());
        // Whatever the tree wrote before it died is still in the pipe: keep it (the stderr's
        // is drained by the caller).
        if end.closed_early || end.eof {
            return;
        }
        let until = Instant::now() + DRAIN_AFTER_KILL;
        while Instant::now() < until {
            // Nothing held the output, or it was never opened: done without waiting.
            let (n, more) = read_now(rx, buf);
            if n > 0 && !out.data(&buf[..n]) {
                break;
            }
            if !more {
                break;
            }
            if n == 0 {
                if !watch(rx) {
                    break;
                }
                match tokio::time::timeout_at(until.into(), read_some(rx, buf)).await {
                    Ok(Ok(n)) if n > 0 => {
                        if !out.data(&buf[..n]) {
                            break;
                        }
                    }
                    _ => break,
                }
            }
        }
    }

    /// The output FIFO of command `seq`, open for reading: the one made ahead of time when
    /// there is one, else a new one.
    #[allow(clippy::disallowed_methods)] // FIFO unlinks stay on the runtime thread: see `open_fifo`
    fn take_fifo(&mut self, seq: u64) -> io::Result<(PathBuf, std::os::fd::OwnedFd)> {
        if let Some((s, path, rx)) = self.next_fifo.take() {
            if s == seq {
                return Ok((path, rx));
            }
            drop(rx);
            let _ = std::fs::remove_file(&path);
        }
        let path = self.fifo_path(seq);
        open_fifo(&path).map(|rx| (path, rx))
    }

    /// Work that would otherwise sit on a command's round trip, done while the shell runs the
    /// command: removing the previous command's FIFO and making the one of command `next`.
    #[allow(clippy::disallowed_methods)] // FIFO unlinks stay on the runtime thread: see `open_fifo`
    fn between_commands(&mut self, next: u64) {
        if let Some(old) = self.stale_fifo.take() {
            let _ = std::fs::remove_file(old);
        }
        let path = self.fifo_path(next);
        match open_fifo(&path) {
            Ok(rx) => self.next_fifo = Some((next, path, rx)),
            // Tried again (and reported) when that command comes.
            Err(e) => tracing::debug!("cannot make FIFO {}: {e}", path.display()),
        }
    }

    /// Removes the FIFOs made for this shell that are still there.
    #[allow(clippy::disallowed_methods)] // FIFO unlinks stay on the runtime thread: see `open_fifo`
    fn remove_fifos(&mut self) {
        if let Some((_, path, rx)) = self.next_fifo.take() {
            drop(rx);
            let _ = std::fs::remove_file(path);
        }
        if let Some(old) = self.stale_fifo.take() {
            let _ = std::fs::remove_file(old);
        }
    }

    /// Waits (briefly) for the shell process to exit and maps its status.
    async fn wait_exit(&mut self) -> Option<i32> {
        wait_exit(&mut self.child, self.pid).await
    }

    /// Kills the shell and everything it started (TERM → grace → KILL), then reaps it.
    pub async fn kill(&mut self) {
        if std::mem::replace(&mut self.killed, true) {
            return;
        }
        self.group.kill(procs::KILL_GRACE).await;
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(1), self.child.wait()).await;
        procs::disown_child(self.pid);
        self.remove_fifos();
        self.cmd_file = None;
        self.driver_dir = None;
        remove_dir(self.dir.clone()).await;
    }

    /// Where this session's CPU time is read ([`crate::resources::Meter`]).
    pub fn cpu_probe(&self) -> &crate::resources::CpuProbe {
        &self.probe
    }

    /// Whether this bash runs plain commands with `posix_spawn` (the runner builtin loaded,
    /// [`SPAWN_SO`], and the spawn path is on).
    pub fn spawns(&self) -> bool {
        self.spawn
    }

    /// Whether this bash loaded the runner builtin ([`SPAWN_SO`]).
    pub fn runs_calls(&self) -> bool {
        self.runner
    }

    /// Whether the shell traced what it ran when its last call ended (`set -x` or `set -v`
    /// left on: the runner says so; a shell without it never does).
    pub fn traces(&self) -> bool {
        self.status.traces
    }

    /// The shell's process id (its counters measure the commands it runs, `crate::resources`).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The processes of this shell session.
    pub fn group(&self) -> &procs::Group {
        &self.group
    }

    /// Bash: makes this shell's files in its directory (0700, files 0600):
    /// - the driver `bash`, one line (so the command's lines are numbered from 1): enter the
    ///   cwd, restore `OLDPWD`, and run the command;
    /// - `cmd`, rewritten for each command (kept open): the command's variables and the
    ///   protocol's fixed part (see [`Shell::command_line`]). Bash reads its script from a pipe
    ///   one byte per read(2) but a sourced file in one read, so the protocol line only sources
    ///   it.
    ///
    /// A bash running the runner builtin needs none of them: its calls come as frames.
    fn write_driver(&mut self) -> io::Result<()> {
        use super::rundir::{private_dir, private_file};
        if self.kind == ShellKind::Posix || self.runner {
            return Ok(());
        }
        let dir = self.dir.clone();
        if self.kind == ShellKind::Zsh {
            zsh::make_dir(&dir)?;
            self.cmd_file = Some((new_private(&dir.join(COMMAND_NAME))?, 0));
            self.driver_dir = Some(dir);
            return Ok(());
        }
        let driver = |run: &str| {
            format!(
                "\\builtin cd -- \"${VAR_CWD}\"||\\builtin return;OLDPWD=${VAR_OLDPWD};\\builtin {run} \"${VAR_CMD}\"\n"
            )
        };
        private_file(&dir.join(DRIVER_NAME), driver("eval").as_bytes())?;
        // A third one in `p/` runs the command's `eval` in a subshell: for a command that ends
        // inside `$(`, whose parse leaves bash's parser broken (see `ends_in_substitution`).
        private_dir(&dir.join(SUBSHELL_DIR))?;
        private_file(
            &dir.join(SUBSHELL_DIR).join(DRIVER_NAME),
            format!(
                "\\builtin cd -- \"${VAR_CWD}\"||\\builtin return;OLDPWD=${VAR_OLDPWD};(\\builtin eval \"${VAR_CMD}\")\n"
            )
            .as_bytes(),
        )?;
        self.cmd_file = Some((new_private(&dir.join(COMMAND_NAME))?, 0));
        self.driver_dir = Some(dir);
        Ok(())
    }

    /// The output FIFO of command `seq`: `<runtime>/<pid>.<seq>`.
    fn fifo_path(&self, seq: u64) -> PathBuf {
        self.dir.join(FIFO_DIR).join(seq.to_string())
    }

    /// The runner's frame for `command` (see `src/shell/runner.c`): its length, then the
    /// token, cwd, output FIFO, flags (`s`: a plain command the spawn path may take; `p`: a
    /// command that ends inside `$(`, run in a subshell, see `ends_in_substitution`; `t`: a
    /// `| head`/`| tail` stage was stripped after a lone stage, see
    /// [`OutputSink::lone_stage_stripped`]; `e`: stderr goes apart, to [`apart_path`]) and the
    /// text, separated by NULs. Written in one piece; the runner reads it in two reads.
    fn frame(&self, token: &str, command: &str, cwd: &Path, fifo: &Path, stage: Stage) -> String {
        let mut flags = String::new();
        if stage.lone {
            flags.push('t');
        }
        if stage.apart {
            flags.push('e');
        }
        if self.spawn && fast_words(command) {
            flags.push('s');
        }
        if crate::shellwords::ends_in_substitution(command) {
            flags.push('p');
        }
        let payload = format!(
            "{token}\0{}\0{}\0{flags}\0{command}",
            cwd.to_string_lossy(),
            fifo.to_string_lossy()
        );
        format!("{}\n{payload}", payload.len())
    }

    /// The protocol line that runs `command` in `cwd` with its output into `fifo`.
    ///
    /// Kept short: bash reads its script from a pipe one byte per read(2). For bash, the
    /// command's part goes into the `cmd` file first (rewritten in place), and the line only
    /// sources it.
    ///
    /// The status is written by the protocol line itself, after the command, with `token`
    /// (see the module docs): the line is read whole before the command runs, so the token
    /// is nowhere the command can look while it runs.
    fn command_line(
        &mut self,
        token: &str,
        command: &str,
        cwd: &Path,
        fifo: &Path,
        stage: Stage,
    ) -> io::Result<String> {
        if self.runner {
            return Ok(self.frame(token, command, cwd, fifo, stage));
        }
        let cwd = quote(&cwd.to_string_lossy());
        let cmd = quote(command);
        let redirect = match stage.apart {
            true => format!(
                ">{} 2>{} </dev/null",
                quote(&fifo.to_string_lossy()),
                quote(&apart_path(fifo).to_string_lossy())
            ),
            false => format!(">{} 2>&1 </dev/null", quote(&fifo.to_string_lossy())),
        };
        let (Some(dir), Some((file, len))) = (&self.driver_dir, &mut self.cmd_file) else {
            let st = quote(&self.dir.join(FIFO_DIR).join(STATUS_NAME).to_string_lossy());
            return Ok(format!(
                "{{ command cd -- {cwd}&&command eval {cmd};}}{redirect};command echo {token} $? >{st}||command exit 99\n",
            ));
        };
        if self.kind == ShellKind::Zsh {
            zsh::write_command(dir, command)?;
            let text = zsh::protocol(dir, command, &cwd, &redirect);
            rewrite_in_place(file, len, &text)?;
            return Ok(format!(
                "\\builtin . \"${VAR_CMD_FILE}\";\\builtin echo {token} ${}>\"${VAR_STATUS_FILE}\"||\\builtin exit 99\n",
                zsh::STATUS_VAR
            ));
        }
        // No reserved words, every builtin escaped: see the module docs. `sourcepath` off makes
        // `.` read the driver from its directory instead of searching PATH.
        let d = quote(&dir.to_string_lossy());
        // A command that ends inside `$(` goes to the subshell driver (same output and status:
        // it fails to parse there; what its earlier lines did is gone with the subshell), so
        // the session's parser never meets it (`ends_in_substitution`), unless `set -v` shows
        // the driver's line.
        let other = if crate::shellwords::ends_in_substitution(command) {
            Some((SUBSHELL_DIR, "v"))
        } else {
            None
        };
        let (pick, d) = match other {
            Some((sub, shown)) => (
                format!(
                    "{VAR_DRIVER}={ds};\\builtin test -z \"${{-//[!{shown}]/}}\"||{VAR_DRIVER}={d};",
                    ds = quote(&dir.join(sub).to_string_lossy()),
                ),
                format!("\"${VAR_DRIVER}\""),
            ),
            None => (String::new(), d),
        };
        // In POSIX mode `.` looks for a bare name in PATH only (`set -o posix` made the next
        // command fail, and the shell exit): `./bash` then, which bash names in messages.
        let text = format!(
            "{pick}{VAR_CMD}={cmd};{VAR_CWD}={cwd};{VAR_OLDPWD}=$PWD;\\builtin shopt -u sourcepath;\\builtin shopt -qo posix&&{VAR_DOT}=./{DRIVER_NAME}||{VAR_DOT}={DRIVER_NAME};\\builtin cd -- {d}&&\\builtin . \"${VAR_DOT}\" {redirect}\n",
        );
        rewrite_in_place(file, len, &text)?;
        Ok(format!(
            "\\builtin . \"${VAR_CMD_FILE}\";\\builtin echo {token} $?>\"${VAR_STATUS_FILE}\"||\\builtin exit 99\n"
        ))
    }
}

/// The start-up script of a shell in `dir`: the snapshot, aliases on, the runner builtin from
/// `runner_so` (bash), the protocol's read-only variables where no runner loaded, the reply
/// line, and for bash with the runner the line that enters it (a bash that did not load it
/// fails that line quietly, its stderr being /dev/null, and reads the plain protocol).
fn init_script(cfg: &ShellConfig, kind: ShellKind, dir: &Path, runner_so: Option<&Path>) -> String {
    let mut init = String::new();
    if let Some(snap) = &cfg.snapshot {
        init.push_str(&format!(
            ". {} </dev/null >/dev/null 2>&1\n",
            quote(&snap.to_string_lossy())
        ));
    }
    match kind {
        ShellKind::Bash => init.push_str("shopt -s expand_aliases\n"),
        ShellKind::Zsh => init.push_str("setopt aliases\n"),
        ShellKind::Posix => {}
    }
    let status = quote(&dir.join(FIFO_DIR).join(STATUS_NAME).to_string_lossy());
    let variables = format!(
        "\\builtin readonly {VAR_CMD_FILE}={} {VAR_STATUS_FILE}={status}",
        quote(&dir.join(COMMAND_NAME).to_string_lossy()),
    );
    let runner_flag = match runner_so {
        Some(so) => {
            init.push_str(&format!(
                "__agent_bash_sp=;\\builtin enable -f {} {RUNNER_BUILTIN} 2>/dev/null && __agent_bash_sp=' {RUNNER_REPLY}' && \\builtin test \"${{BASH_VERSINFO[0]}}.${{BASH_VERSINFO[1]}}\" = {SPAWN_PROVEN} && __agent_bash_sp=' {RUNNER_REPLY} {SPAWN_REPLY}'\n\\builtin test -n \"$__agent_bash_sp\" || {variables}\n",
                quote(&so.to_string_lossy())
            ));
            "\"$__agent_bash_sp\""
        }
        None => {
            if kind != ShellKind::Posix {
                init.push_str(&variables);
                init.push('\n');
            }
            "''"
        }
    };
    // The reply comes on stdout. A prefix that moves the shell into another filesystem
    // (`docker exec -i box`) cannot see our FIFOs: the reply says so, and the runtime runs
    // such commands one process each.
    // A POSIX sh has no `builtin` (dash): `command` skips functions there.
    let builtin = if kind == ShellKind::Posix { "command" } else { "builtin" };
    init.push_str(&format!(
        "[ -d {dir} ] || {{ {builtin} printf 'R isolated\\n'; exit 0; }}\n{builtin} printf 'R 1%s\\n' {runner_flag}\n",
        dir = quote(&dir.join(FIFO_DIR).to_string_lossy()),
    ));
    if runner_so.is_some() {
        init.push_str(&format!(
            "\\builtin unset __agent_bash_sp\n\\builtin {RUNNER_BUILTIN} {status}\n"
        ));
    }
    init
}

/// What a command's protocol line carries besides its text.
#[derive(Debug, Clone, Copy)]
struct Stage {
    /// See [`OutputSink::lone_stage_stripped`].
    lone: bool,
    /// See [`OutputSink::stderr_apart`].
    apart: bool,
}

/// The FIFO of a command's stderr when it goes apart: its output FIFO's path and `.e`.
fn apart_path(fifo: &Path) -> PathBuf {
    let mut path = fifo.as_os_str().to_owned();
    path.push(".e");
    PathBuf::from(path)
}

/// Removes a command's output FIFO, and its stderr's when it has one.
#[allow(clippy::disallowed_methods)] // FIFO unlinks stay on the runtime thread: see `open_fifo`
fn remove_fifos_of(fifo: &Path, apart: bool) {
    let _ = std::fs::remove_file(fifo);
    if apart {
        let _ = std::fs::remove_file(apart_path(fifo));
    }
}

/// One command's run in a [`Shell`]: what the read loop watches (the output FIFO, the status
/// FIFO and the shell's stdout, whose end means the shell exited).
struct LocalRun<'s> {
    rx: Option<OutputEnd>,
    /// The stderr FIFO of a command that lost its stage (contract §1), watched as `rx` is; read
    /// first when both have bytes, as bash's stderr overtakes a stage's output.
    erx: Option<OutputEnd>,
    /// The last chunk came from `erx`, read into `ebuf`.
    apart: bool,
    ebuf: Vec<u8>,
    /// The shell's processes: who else holds the output (see [`LocalRun::wait`]).
    group: &'s procs::Group,
    /// The foreground ended and the output is still open: read what is left without waiting.
    after_foreground: bool,
    /// Until then the output is read only when the status comes (see [`QUICK`]).
    quick_until: Instant,
    token: &'s str,
    status: &'s mut StatusFifo,
    stdout: &'s mut BufReader<ChildStdout>,
    child: &'s mut Child,
    pid: i32,
    buf: Vec<u8>,
    /// Bytes of the last read in `buf`.
    n: usize,
    sbuf: [u8; 512],
    dropped: [u8; 512],
}

enum LocalWake {
    Output(io::Result<usize>),
    Apart(io::Result<usize>),
    Status(io::Result<usize>),
    Stdout(io::Result<usize>),
}

impl Transport for LocalRun<'_> {
    type Wake = LocalWake;

    async fn wait(&mut self, phase: Phase) -> LocalWake {
        let reading = phase.reading && self.rx.as_ref().is_some_and(OutputEnd::watched);
        let apart = self.erx.as_ref().is_some_and(OutputEnd::watched);
        if reading && self.after_foreground {
            // The stderr first, as the select below reads it first.
            let (n, more) = read_now(&self.erx, &mut self.ebuf);
            if n > 0 || (apart && !more) {
                return LocalWake::Apart(Ok(n));
            }
            // What is left in the pipe once the foreground ended is read now. Once it is empty
            // with a writer still there: when that writer is only the shell itself (the call
            // moved a copy of its output where the call's end does not close it: `exec 3>&1
            // 1>&2 2>&3`), waiting for its next call, the output has ended, as `bash -c`'s
            // does when its script ends (issue 29: such a call waited out the 250 ms of the
            // background wait). A background job's copy is waited for as before.
            let (n, more) = read_now(&self.rx, &mut self.buf);
            if n > 0 || !more {
                return LocalWake::Output(Ok(n));
            }
            self.after_foreground = false;
            if let Some(rx) = &self.rx {
                if !held_by_others(self.group, self.pid, rx.raw_fd()) {
                    return LocalWake::Output(Ok(0));
                }
            }
        }
        tokio::select! {
            biased;
            n = read_some(&mut self.erx, &mut self.ebuf), if apart => LocalWake::Apart(n),
            n = read_some(&mut self.rx, &mut self.buf), if reading => LocalWake::Output(n),
            n = self.status.rx.read(&mut self.sbuf), if phase.running => LocalWake::Status(n),
            // Only its end matters: what a command writes to it is dropped.
            n = self.stdout.read(&mut self.dropped), if phase.running => LocalWake::Stdout(n),
            else => std::future::pending::<LocalWake>().await,
        }
    }

    async fn handle(&mut self, wake: LocalWake, _phase: Phase) -> Event {
        match wake {
            LocalWake::Output(Ok(0) | Err(_)) => Event::OutputEnd,
            LocalWake::Output(Ok(n)) => {
                (self.n, self.apart) = (n, false);
                Event::Output
            }
            LocalWake::Apart(Ok(0) | Err(_)) => {
                self.erx = None;
                Event::Nothing
            }
            LocalWake::Apart(Ok(n)) => {
                (self.n, self.apart) = (n, true);
                Event::Output
            }
            LocalWake::Status(Ok(n)) => match self.status.take(&self.sbuf[..n], self.token) {
                Some(code) => Event::Foreground(Ending::Done(code)),
                None => Event::Nothing,
            },
            LocalWake::Status(Err(_)) | LocalWake::Stdout(Ok(1..)) => Event::Nothing,
            LocalWake::Stdout(Ok(0) | Err(_)) => {
                Event::Foreground(Ending::ShellExited(wait_exit(self.child, self.pid).await))
            }
        }
    }

    fn chunk(&self) -> &[u8] {
        match self.apart {
            true => &self.ebuf[..self.n],
            false => &self.buf[..self.n],
        }
    }

    fn chunk_apart(&self) -> bool {
        self.apart
    }

    async fn close_output(&mut self) {
        self.rx = None;
    }

    fn closable(&self) -> bool {
        self.rx.as_ref().is_some_and(OutputEnd::watched)
    }

    fn tick_at(&self) -> Instant {
        match &self.rx {
            Some(OutputEnd::Unwatched(_)) => self.quick_until,
            _ => Instant::now() + IDLE_TICK,
        }
    }

    fn tick(&mut self) -> Option<Event> {
        if !matches!(self.rx, Some(OutputEnd::Unwatched(_))) {
            return None;
        }
        // The command outlived QUICK: its output is streamed from now on.
        if !watch(&mut self.erx) {
            self.erx = None;
        }
        Some(if watch(&mut self.rx) { Event::Nothing } else { Event::OutputEnd })
    }

    fn stuck(&self, eof: bool) -> Option<Ending> {
        // Every writer closed the output, yet no status came and the shell waits for its next
        // protocol line: the command turned execution off (`set -n`) and the shell will never
        // run another. It is thrown away, not waited on until the timeout.
        if eof && waits_on_stdin(self.pid) {
            tracing::warn!("shell {} stopped executing commands (set -n?)", self.pid);
            return Some(Ending::ShellExited(None));
        }
        None
    }

    fn read_pending(&mut self) -> (bool, bool) {
        // The stderr first: what the foreground wrote there is all in by now.
        let (n, _) = read_now(&self.erx, &mut self.ebuf);
        if n > 0 {
            (self.n, self.apart) = (n, true);
            return (true, true);
        }
        let (n, more) = read_now(&self.rx, &mut self.buf);
        (self.n, self.apart) = (n, false);
        (n > 0, more)
    }

    fn keep_reading(&mut self) -> bool {
        self.after_foreground = true;
        if !watch(&mut self.erx) {
            self.erx = None;
        }
        watch(&mut self.rx)
    }
}

/// Reads what the stderr FIFO holds now, without waiting, into `out` (until `until`: a writer
/// that keeps writing does not hold the run).
fn drain_apart(erx: Option<OutputEnd>, buf: &mut [u8], out: &mut dyn OutputSink, until: Instant) {
    while Instant::now() < until {
        let (n, more) = read_now(&erx, buf);
        if n > 0 {
            out.apart(&buf[..n]);
        }
        if n == 0 || !more {
            break;
        }
    }
}

/// Whether a process of `group` other than the shell `shell` holds the pipe that `fd` reads (a
/// background job that may still write it). Read from `/proc/<pid>/fd` of each member: only
/// once a call's foreground has ended with its output still open.
#[allow(clippy::disallowed_methods)] // /proc reads: kernel tables, not disk
fn held_by_others(group: &procs::Group, shell: i32, fd: std::os::fd::RawFd) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(pipe) = std::fs::metadata(format!("/proc/self/fd/{fd}")) else { return true };
    let same = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| (m.dev(), m.ino()) == (pipe.dev(), pipe.ino()))
    };
    group.members().iter().filter(|m| m.pid != shell).any(|m| {
        std::fs::read_dir(format!("/proc/{}/fd", m.pid))
            .map(|dir| dir.flatten().any(|e| same(&e.path())))
            // A member whose descriptors cannot be read may hold it.
            .unwrap_or(true)
    })
}

/// Waits (briefly) for the shell process `pid` to exit and maps its status.
async fn wait_exit(child: &mut Child, pid: i32) -> Option<i32> {
    let status = tokio::time::timeout(Duration::from_secs(2), child.wait()).await;
    procs::disown_child(pid);
    match status {
        Ok(Ok(st)) => exit_code(st),
        _ => None,
    }
}

impl Session for Shell {
    type Config = ShellConfig;
    type StartError = io::Error;
    type Cwd<'a>
        = &'a Path
    where
        Self: 'a;

    fn start(cfg: &ShellConfig) -> impl Future<Output = io::Result<Shell>> + Send {
        Shell::spawn(cfg)
    }

    fn run<'a>(
        &'a mut self,
        command: &'a str,
        cwd: &'a Path,
        out: &'a mut dyn OutputSink,
        deadline: Option<Instant>,
        cancel: &'a CancellationToken,
    ) -> impl Future<Output = Result<RunEnd, RunError>> + Send + 'a {
        self.run_command(command, cwd, out, deadline, cancel)
    }

    fn kill(&mut self) -> impl Future<Output = ()> + Send {
        Shell::kill(self)
    }

    /// A local shell has no orderly end that its background jobs would not survive: the same
    /// as [`Session::kill`].
    fn close(&mut self) -> impl Future<Output = ()> + Send {
        Shell::kill(self)
    }

    fn is_alive(&self) -> bool {
        !self.killed && !self.dead
    }
}

/// Removes a shell's directory (and what is left in it) on a blocking thread: see
/// [`open_fifo`] for what that costs on a disk.
#[allow(clippy::disallowed_methods)] // under spawn_blocking
async fn remove_dir(dir: PathBuf) {
    let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
}

/// A new file `path`, mode 0600 whatever the umask, open for writing.
#[allow(clippy::disallowed_methods)] // once per shell start, in the runtime directory's memory file system
fn new_private(path: &Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)
}

/// Rewrites the per-command file (kept open) with `text`.
fn rewrite_in_place(file: &mut std::fs::File, len: &mut u64, text: &str) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.write_all_at(text.as_bytes(), 0)?;
    let new_len = text.len() as u64;
    if new_len < *len {
        file.set_len(new_len)?;
    }
    *len = new_len;
    Ok(())
}

impl Drop for Shell {
    #[allow(clippy::disallowed_methods)] // a shell dropped without `kill` (an error path) removes its directory here
    fn drop(&mut self) {
        // A shell dropped without [`Shell::kill`] (its process goes by `kill_on_drop`) leaves
        // no file behind.
        self.remove_fifos();
        if !self.killed {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Whether `command` is one simple command of plain words, which the spawn builtin may run
/// without bash's fork (`src/shell/spawn.c` checks the shell's state, and falls back to `eval`
/// for functions, aliases, builtins and anything it cannot spawn): words of letters, digits
/// and `_ . / : @ % + , = -` only (nothing bash would expand, quote, redirect, glob or
/// split differently), separated by blanks; a first word that is no assignment, no job (`%1`)
/// and no reserved word.
fn fast_words(command: &str) -> bool {
    const RESERVED: &[&str] = &[
        "if", "then", "else", "elif", "fi", "case", "esac", "for", "select", "while", "until",
        "do", "done", "in", "function", "time", "coproc",
    ];
    let plain = |c: char| {
        c.is_ascii_alphanumeric()
            || matches!(c, '_' | '.' | '/' | ':' | '@' | '%' | '+' | ',' | '=' | '-')
    };
    let text = command.strip_suffix('\n').unwrap_or(command);
    let mut words = text.split([' ', '\t']).filter(|w| !w.is_empty());
    let Some(first) = words.next() else { return false };
    text.len() <= 4096
        && text.chars().all(|c| plain(c) || c == ' ' || c == '\t')
        && !first.contains(['=', '%'])
        && !RESERVED.contains(&first)
        && words.count() < 255
}

/// The spawn builtin's file in `runtime_dir` (written once per backend), or None when this
/// build has none or it cannot be written.
#[allow(clippy::disallowed_methods)] // once per backend, a small file on the runtime directory's memory file system
fn spawn_library(runtime_dir: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt;
    if !spawn_built() {
        return None;
    }
    let path = runtime_dir.join(SPAWN_FILE);
    #[allow(clippy::disallowed_methods)] // once per backend, a small file on a memory fs
    let present = std::fs::metadata(&path).is_ok_and(|m| m.len() == SPAWN_SO.len() as u64);
    if present {
        return Some(path);
    }
    // Written under a private name, then renamed: a shell never loads half a file.
    let tmp = runtime_dir.join(format!("{SPAWN_FILE}.{}", nonce()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o500)
        .open(&tmp)
        .and_then(|mut f| std::io::Write::write_all(&mut f, SPAWN_SO))
        .and_then(|()| std::fs::rename(&tmp, &path));
    match written {
        Ok(()) => Some(path),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            tracing::warn!("spawn builtin not written ({e}): sessions fork for external commands");
            None
        }
    }
}

/// Makes the FIFO `path` (mode 0600) and opens its read end, non-blocking (not yet watched by
/// the event loop: see [`OutputEnd`]), with a [`PIPE_SIZE`] buffer.
//
// A command's FIFO work (mkfifo, open, unlink) stays on the runtime thread: on the runtime
// directory's memory file system (`runtime_bases`: XDG_RUNTIME_DIR, else /dev/shm) a mkfifo
// took 3.8 µs and an unlink 2.9 µs (medians of 20 000, load ≈ 9 on 2 cores; 17.7 / 5.7 µs on
// an ext4 /tmp), less than the 11.5 µs round trip of a no-op spawn_blocking that every command
// would wait for. Whole files and directories cost more on a disk (a 200-byte file rewritten:
// 7 µs on /dev/shm, 1.9 ms on ext4; a shell's directory removed: 32 µs and 7.8 ms): the
// directory goes under spawn_blocking ([`remove_dir`]); the small per-command file
// (`zsh::write_command`) stays, the runtime directory being on a disk only when neither of
// those two is usable.
#[allow(clippy::disallowed_methods)] // see above
fn open_fifo(path: &Path) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    make_fifo(path)?;
    let fd = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map(std::os::fd::OwnedFd::from)
        .inspect_err(|_| {
            let _ = std::fs::remove_file(path);
        })?;
    grow_pipe(fd.as_raw_fd());
    Ok(fd)
}

/// Gives the FIFO a [`PIPE_SIZE`] buffer (Linux: `F_SETPIPE_SZ`; other systems size pipes
/// themselves, macOS up to 64 KiB as the writer fills it).
#[cfg(target_os = "linux")]
fn grow_pipe(fd: std::os::fd::RawFd) {
    // SAFETY: fcntl on a FIFO we own; failure only leaves the default size.
    unsafe { libc::fcntl(fd, libc::F_SETPIPE_SZ, PIPE_SIZE) };
}

#[cfg(not(target_os = "linux"))]
fn grow_pipe(_fd: std::os::fd::RawFd) {}

/// The read end of a command's output FIFO (non-blocking).
#[derive(Debug)]
enum OutputEnd {
    /// Not registered with the event loop: read only by [`read_now`] (see [`QUICK`]).
    Unwatched(std::os::fd::OwnedFd),
    /// Watched by the event loop.
    Watched(tokio::net::unix::pipe::Receiver),
}

impl OutputEnd {
    fn watched(&self) -> bool {
        matches!(self, OutputEnd::Watched(_))
    }

    fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        match self {
            OutputEnd::Unwatched(fd) => fd.as_raw_fd(),
            OutputEnd::Watched(rx) => rx.as_raw_fd(),
        }
    }
}

/// Registers the output with the event loop if it is not yet. False when that fails (the
/// output is then dropped: its writers get SIGPIPE rather than block forever).
fn watch(rx: &mut Option<OutputEnd>) -> bool {
    match rx.take() {
        Some(OutputEnd::Unwatched(fd)) => {
            match tokio::net::unix::pipe::Receiver::from_owned_fd(fd) {
                Ok(r) => {
                    *rx = Some(OutputEnd::Watched(r));
                    true
                }
                Err(e) => {
                    tracing::warn!("cannot watch a command's output: {e}");
                    false
                }
            }
        }
        other => {
            *rx = other;
            true
        }
    }
}

/// One read of the output that does not wait: `(bytes read, more may come)`. `more` is false
/// at end of file (no writer holds the FIFO: all closed, or none ever opened it) or when the
/// output is already closed; true when bytes came or a writer holds it without writing.
fn read_now(rx: &Option<OutputEnd>, buf: &mut [u8]) -> (usize, bool) {
    let Some(rx) = rx else { return (0, false) };
    loop {
        // SAFETY: a read into our own buffer from a descriptor we own (non-blocking).
        let n = unsafe { libc::read(rx.raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            return (n as usize, true);
        }
        if n == 0 {
            return (0, false);
        }
        match io::Error::last_os_error().kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return (0, true),
            _ => return (0, false),
        }
    }
}

async fn read_some(rx: &mut Option<OutputEnd>, buf: &mut [u8]) -> io::Result<usize> {
    match rx {
        Some(OutputEnd::Watched(rx)) => rx.read(buf).await,
        _ => std::future::pending().await,
    }
}

fn make_fifo(path: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::other("FIFO path contains NUL"))?;
    // SAFETY: valid C string; mode 0600 keeps other users out of the command's output.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::fast_words;

    #[test]
    fn fast_words_takes_only_one_plain_simple_command() {
        for plain in
            ["/bin/true", "ls -la src/", "cargo test --release", "git log -3\n", "dd if=a of=b"]
        {
            assert!(fast_words(plain), "{plain:?}");
        }
        for not in [
            "",
            " ",
            "echo $HOME",
            "ls *.rs",
            "echo 'q'",
            "a; b",
            "a && b",
            "a | b",
            "a > f",
            "A=1 cmd",
            "%1",
            "time ls",
            "if",
            "ls ~",
            "echo {a,b}",
            "a\nb",
            "ls \\x",
            "cmd #c",
            "(ls)",
            "ls\n\n",
        ] {
            assert!(!fast_words(not), "{not:?}");
        }
    }
}
