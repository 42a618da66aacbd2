//! PTY execution (contract §6): one command in a pseudo-terminal, rendered by a terminal emulator.
//!
//! # What runs
//! The same shell, rc snapshot, prefix and environment as the pipe sessions of
//! [`crate::shell::local`], plus `TERM=xterm-256color` (and without `COLUMNS`/`LINES`, which would
//! override the terminal's real size in many programs). Each run is a fresh process:
//!
//! ```text
//! <prefix…> <shell> <no-rc args> -c '. <snapshot> </dev/null >/dev/null 2>&1; shopt -s expand_aliases; builtin cd -- <cwd> && builtin eval <quoted command>'
//! ```
//!
//! One line, so the command's lines are numbered from 1 in error messages and `$LINENO`, as under
//! `bash -c`; and the shell is started under its bare name when that is what `PATH` finds, so
//! `$0` and the prefix of error messages read `bash` (contract §1, fidelity first).
//!
//! A `-c` script rather than an interactive shell fed through the terminal: typed setup lines
//! would be echoed by the terminal and drawn on the screen (and so in the model text), a prompt
//! would appear, and the command's status would have to be fished out of the output. With `-c`
//! the screen shows only what the command printed, the shell's exit status is the command's, and
//! `exit` in the command ends the run as it should. `eval` of the quoted command means aliases
//! from the snapshot expand (they are defined before the eval'd text is parsed) and a syntax
//! error is an ordinary failed command.
//!
//! # Threads and file descriptors
//! portable-pty's I/O is blocking, so it lives on std threads; the async side
//! ([`run`]) only waits on channels:
//! - the **slave** fd is dropped right after spawning: as long as we hold it, reading the master
//!   never reaches EOF;
//! - the **reader** thread owns a duplicate of the master fd. It reads, feeds the
//!   [`screen::Screen`] (the terminal emulation is the CPU-heavy part, so it runs here, in
//!   parallel with the sink on the async side), hands the raw bytes to the subscriber
//!   ([`PtyHooks::on_output`]) and sends the text of rows that left the screen over a bounded
//!   channel: a slow consumer slows the program, memory stays bounded. Under a flood the text
//!   goes in batches (one wake-up of the async side per `TEXT_BATCH` or `BATCH_DELAY`); as
//!   soon as no more output is waiting (`poll`), whatever it has is sent. EOF (EIO on Linux,
//!   once no process holds the slave) ends it;
//! - the **writer** thread owns the master's writer and writes normalized input. Dropping the
//!   writer sends `\n` + EOT to the terminal, so it is dropped only after the command ended;
//! - the **waiter** thread owns the child and blocks in `wait`;
//! - [`run`] keeps the master itself, for resizes, and drops it last.
//!
//! # Completion and killing
//! A run is complete when the exit status is known and the reader reached EOF; or
//! [`LEFTOVER_GRACE`] after the exit while a leftover process still holds the terminal, which is
//! then killed. The child is a session leader (portable-pty calls `setsid`), and an interactive
//! shell inside the PTY puts its jobs in their own process groups, so the run's [`procs::Group`]
//! takes the session's processes as well as its cgroup (joined by the script's first statement)
//! and descendants, and its kill runs the SIGTERM → [`procs::KILL_GRACE`] → SIGKILL ladder.
//!
//! # Caveats
//! portable-pty spawns through a `pre_exec` hook (for `setsid` and the controlling terminal),
//! which forces `fork` instead of `posix_spawn`: from a large backend a PTY spawn costs more than
//! a pipe command. PTY runs are interactive, so this is accepted.

pub mod keys;
pub mod screen;
// `/proc` reads once a quiet second: kernel tables, not disk.
pub mod waiting;

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use portable_pty::{CommandBuilder, PtySize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::project::quote;
use crate::shell::local::{self as shell, ShellConfig, ShellKind};
use crate::shell::{procs, Origin};
use screen::Screen;

/// Smallest and largest terminal sizes (contract §6), applied on start and on resize.
pub const MIN_COLS: u16 = 20;
pub const MAX_COLS: u16 = 400;
pub const MIN_ROWS: u16 = 5;
pub const MAX_ROWS: u16 = 200;
/// Size when no window gives one (print mode, agents without a UI): wide enough that tools do
/// not cut their lines for an 80-column terminal.
pub const DEFAULT_SIZE: TermSize = TermSize { cols: 120, rows: 40 };
/// After the command exited, how long a leftover process may keep the terminal open (contract §6).
pub const LEFTOVER_GRACE: Duration = Duration::from_millis(300);
/// After a kill, how long to wait for the exit status and EOF before giving up on them (a process
/// outside our reach may hold the terminal).
const SETTLE_AFTER_KILL: Duration = Duration::from_secs(2);
/// Reads from the master in chunks of this size.
const READ_CHUNK: usize = 64 * 1024;
/// Chunks in flight between the reader thread and [`run`]: the backpressure bound.
const CHUNK_QUEUE: usize = 16;
/// While output keeps coming, screen text is sent on in batches of about this size...
const TEXT_BATCH: usize = 64 * 1024;
/// ... or this often, so live views keep moving (contract §4.2 allows 20 updates per second).
const BATCH_DELAY: Duration = Duration::from_millis(25);
/// The terminal type programs see (contract §6).
pub const TERM: &str = "xterm-256color";

/// A terminal size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermSize {
    pub cols: u16,
    pub rows: u16,
}

impl TermSize {
    /// The size clamped to 20–400 columns and 5–200 rows.
    pub fn clamped(self) -> TermSize {
        TermSize {
            cols: self.cols.clamp(MIN_COLS, MAX_COLS),
            rows: self.rows.clamp(MIN_ROWS, MAX_ROWS),
        }
    }

    fn pty_size(self) -> PtySize {
        let s = self.clamped();
        PtySize { rows: s.rows, cols: s.cols, pixel_width: 0, pixel_height: 0 }
    }
}

/// What a terminal view sends to a running PTY command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PtyControl {
    /// Bytes typed in the view; normalized by [`keys::normalize`] before they reach the program.
    Input(Vec<u8>),
    /// The view's new size (clamped).
    Resize(TermSize),
    /// Force-kill the command (the kill key, contract §6). The result reads as a cancel.
    Kill,
}

/// Receives the raw bytes the program wrote to the terminal, as they arrive (for a terminal
/// view). Called on the reader thread: keep it quick.
pub type OutputFn = Arc<dyn Fn(&[u8]) + Send + Sync>;

/// Told when the program starts (`true`) or stops (`false`) waiting for input: blocked reading
/// the terminal after [`waiting::QUIET`] without output (contract §8.4). Called on the async side.
pub type WaitingFn = Arc<dyn Fn(bool) + Send + Sync>;

/// The terminal view's side of a PTY run. Everything is optional: the default is a headless run
/// of [`DEFAULT_SIZE`].
#[derive(Default)]
pub struct PtyHooks {
    /// Initial size (clamped); default [`DEFAULT_SIZE`].
    pub size: Option<TermSize>,
    /// Raw output subscriber.
    pub on_output: Option<OutputFn>,
    /// Input, resizes and kill requests. Messages sent after the command ended are ignored.
    pub control: Option<mpsc::UnboundedReceiver<PtyControl>>,
    /// Waiting-for-input subscriber; without one the terminal is not watched.
    pub on_waiting: Option<WaitingFn>,
}

impl std::fmt::Debug for PtyHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PtyHooks")
            .field("size", &self.size)
            .field("on_output", &self.on_output.is_some())
            .field("control", &self.control.is_some())
            .field("on_waiting", &self.on_waiting.is_some())
            .finish()
    }
}

/// How a PTY run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PtyEnd {
    /// The command ended; its status (128 + N for a signal) if it could be learned.
    Exited(Option<i32>),
    TimedOut,
    Cancelled,
    /// Killed through [`PtyControl::Kill`].
    Killed,
}

/// What [`run`] returns: how the run ended and, when the shell was reaped, its receipt (contract §7:
/// the `wait4` rusage of the shell and every descendant it waited for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PtyRun {
    pub end: PtyEnd,
    pub resources: Option<crate::resources::Resources>,
}

/// Where [`run`] delivers the model-facing text.
pub trait PtyOutput: Send {
    /// Text (vt100 "basic formatted": plain text with SGR codes) of rows that left the screen,
    /// and at the end the final screen. Chunks arrive in order; their concatenation is the run's
    /// text.
    fn text(&mut self, text: &str);
    /// Called after each chunk of output. `screen` renders the current screen as plain text
    /// (costly: call it only when a live update is due).
    fn tick(&mut self, screen: &dyn Fn() -> String);
    /// Called when the terminal has been quiet for a moment: a chance to send the live update
    /// the throttle held back.
    fn idle(&mut self, _screen: &dyn Fn() -> String) {}
}

/// Whether a command runs in a PTY (contract §6). An explicit request always does. A tool call does
/// when the `virtual_terminal` setting is `"on"`, neither `AGENT_BASH_NO_PTY` nor `PI_NO_PTY`
/// is `1` in `env`, and an interactive UI is attached. Bang commands use pipes unless they ask.
pub fn wants_pty(
    explicit: bool,
    origin: Origin,
    virtual_terminal: Option<&str>,
    ui_attached: bool,
    env: impl Fn(&str) -> Option<OsString>,
) -> bool {
    if explicit {
        return true;
    }
    let opted_out =
        ["AGENT_BASH_NO_PTY", "PI_NO_PTY"].iter().any(|k| env(k).is_some_and(|v| v == "1"));
    origin == Origin::Tool && virtual_terminal == Some("on") && ui_attached && !opted_out
}

/// A zsh run's driver directory ([`crate::shell::zsh`]), removed when the run ends.
struct ZshDir(PathBuf);

impl Drop for ZshDir {
    fn drop(&mut self) {
        #[allow(clippy::disallowed_methods)] // a few bytes on the runtime's memory file system
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `-c` script: snapshot, aliases on, cwd, the command (see the module docs). zsh runs the
/// command from a driver file in `zsh_dir`, as its sessions do, so messages and statuses are
/// `zsh -c`'s.
fn script(
    kind: ShellKind,
    snapshot: Option<&Path>,
    cwd: &Path,
    command: &str,
    zsh_dir: Option<&Path>,
) -> String {
    let mut s = String::new();
    if let Some(snap) = snapshot {
        s.push_str(&format!(". {} </dev/null >/dev/null 2>&1; ", quote(&snap.to_string_lossy())));
    }
    if let (ShellKind::Zsh, Some(dir)) = (kind, zsh_dir) {
        s.push_str("setopt aliases\n");
        s.push_str(&crate::shell::zsh::protocol(dir, command, &quote(&cwd.to_string_lossy()), ""));
        s.push_str(&format!("\\builtin exit ${}\n", crate::shell::zsh::STATUS_VAR));
        return s;
    }
    let builtin = match kind {
        ShellKind::Bash => {
            s.push_str("shopt -s expand_aliases; ");
            "builtin "
        }
        ShellKind::Zsh => {
            s.push_str("setopt aliases; ");
            "builtin "
        }
        // `builtin` is not POSIX (dash lacks it).
        ShellKind::Posix => "",
    };
    s.push_str(&format!(
        "{builtin}cd -- {} && {builtin}eval {}\n",
        quote(&cwd.to_string_lossy()),
        quote(command)
    ));
    s
}

/// How the shell is named on the command line: its bare name when the run's `PATH` finds that
/// very file (portable-pty makes the first word `$0`), else its path.
fn shell_word(cfg: &ShellConfig) -> OsString {
    let path = cfg.shell.as_os_str().to_owned();
    let (Some(name), None) = (cfg.shell.file_name(), cfg.prefix.first()) else {
        return path;
    };
    let search = cfg.env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.clone());
    let same = |candidate: &Path| {
        use std::os::unix::fs::MetadataExt;
        match (std::fs::metadata(candidate), std::fs::metadata(&cfg.shell)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    };
    let found = search
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file());
    match found {
        Some(p) if same(&p) => name.to_owned(),
        _ => path,
    }
}

fn lock(screen: &Mutex<Screen>) -> MutexGuard<'_, Screen> {
    // A panic while parsing leaves a usable (if odd) screen: keep going rather than lose output.
    match screen.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

fn pty_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// Output of the reader thread: the text of rows that left the screen (may be empty: the screen
/// changed, a live update may be due).
struct Chunk {
    text: String,
}

/// Runs `command` in a new PTY. `Err` only when the PTY cannot be opened or the shell cannot be
/// spawned (the caller reports `PTY error: <message>`); everything after that is in [`PtyEnd`].
///
/// `cfg.snapshot` is sourced if set; `deadline` is the timeout instant.
pub async fn run(
    cfg: &ShellConfig,
    command: &str,
    cwd: &Path,
    hooks: PtyHooks,
    deadline: Option<Instant>,
    cancel: &CancellationToken,
    out: &mut dyn PtyOutput,
) -> io::Result<PtyRun> {
    let size = hooks.size.unwrap_or(DEFAULT_SIZE).clamped();
    let group = Arc::new(procs::Group::new(true));
    // Removed when the run ends, whichever way.
    let (cmd, _zsh_dir) = command_for(cfg, command, cwd, &group)?;
    let spawned = spawn(cfg, cmd, size, &group)?;
    let Spawned { reader, writer, master, child, pid } = spawned;
    // If a helper thread cannot be started, the command must not outlive the error: dropping
    // the group kills it.
    let exit_rx = start_waiter(child, pid)?;
    let screen = Arc::new(Mutex::new(Screen::new(size)));
    let app_cursor = Arc::new(AtomicBool::new(false));
    let chunk_rx =
        start_reader(reader, screen.clone(), app_cursor.clone(), hooks.on_output.clone())?;
    let input_tx = start_writer(writer)?;
    let mut run = Driver {
        out,
        screen,
        app_cursor,
        master,
        group,
        pid,
        input_tx,
        chunk_rx,
        exit_rx,
        control: hooks.control,
        on_waiting: hooks.on_waiting,
        exit: None,
        resources: None,
        exited_at: None,
        eof: false,
        ending: None,
        kill_task: None,
        give_up: None,
        last_output: Instant::now(),
        waiting: false,
        next_check: Instant::now() + waiting::QUIET,
    };
    run.drive(deadline, cancel).await;
    Ok(run.finish().await)
}

/// The command line of a run (see the module docs), and the zsh driver directory it uses.
fn command_for(
    cfg: &ShellConfig,
    command: &str,
    cwd: &Path,
    group: &procs::Group,
) -> io::Result<(CommandBuilder, Option<ZshDir>)> {
    let kind = ShellKind::of(&cfg.shell);
    let mut argv: Vec<OsString> = cfg.prefix.iter().map(OsString::from).collect();
    argv.push(shell_word(cfg));
    argv.extend(kind.args().iter().map(OsString::from));
    argv.push("-c".into());
    let join = group.join_statement();
    let zsh_dir = match kind {
        ShellKind::Zsh => {
            let dir = ZshDir(cfg.runtime_dir.join(format!("pty-{}.d", shell::nonce())));
            crate::shell::rundir::private_dir(&dir.0)?;
            crate::shell::zsh::make_dir(&dir.0)?;
            crate::shell::zsh::write_command(&dir.0, command)?;
            Some(dir)
        }
        _ => None,
    };
    let zsh_path = zsh_dir.as_ref().map(|d| d.0.as_path());
    let script = script(kind, cfg.snapshot.as_deref(), cwd, command, zsh_path);
    argv.push(format!("{join}{script}").into());
    let mut cmd = CommandBuilder::from_argv(argv);
    cmd.env_clear();
    for (k, v) in &cfg.env {
        if k != "COLUMNS" && k != "LINES" {
            cmd.env(k, v);
        }
    }
    cmd.env("TERM", TERM);
    cmd.env(procs::OWNER_VAR, &cfg.owner);
    cmd.cwd(cwd);
    Ok((cmd, zsh_dir))
}

/// A spawned PTY run: the master's three handles and the child.
struct Spawned {
    reader: PtyReader,
    writer: Box<dyn Write + Send>,
    master: Box<dyn portable_pty::MasterPty + Send>,
    child: Box<dyn portable_pty::Child + Send + Sync>,
    pid: i32,
}

/// Opens the PTY and spawns `cmd` on its slave, in `group`, under the fence.
fn spawn(
    cfg: &ShellConfig,
    cmd: CommandBuilder,
    size: TermSize,
    group: &procs::Group,
) -> io::Result<Spawned> {
    let pair = portable_pty::native_pty_system().openpty(size.pty_size()).map_err(pty_err)?;
    // Both master handles are taken before spawning, so a failure leaves no child behind.
    let reader = PtyReader::clone_of(pair.master.as_ref())?;
    let writer = pair.master.take_writer().map_err(pty_err)?;
    // Recorded as ours before the reaper can see it: a quick command exits at once.
    // The cgroup join above is a write the fence must let through.
    let fence = cfg.fence.as_ref().map(|f| match group.procs_file() {
        Some(file) => f.also_writing(file),
        None => f.clone(),
    });
    let (slave, fence) = (pair.slave, fence.as_ref());
    let child = procs::spawn_owned(
        move || {
            crate::fence::spawn_fenced(fence, move || {
                let child = slave.spawn_command(cmd).map_err(pty_err);
                // Without this, EOF never comes: we would hold the terminal open ourselves.
                drop(slave);
                child
            })
        },
        |c| c.process_id().map(|p| p as i32),
    )?;
    let pid = child.process_id().map(|p| p as i32).unwrap_or(-1);
    group.started(pid);
    Ok(Spawned { reader, writer, master: pair.master, child, pid })
}

/// The exit status and receipt of the child, from the `pty-wait` thread.
type ExitRx = tokio::sync::oneshot::Receiver<(Option<i32>, Option<crate::resources::Resources>)>;

/// Starts the `pty-wait` thread: it owns the child and blocks in `wait`.
fn start_waiter(child: Box<dyn portable_pty::Child + Send + Sync>, pid: i32) -> io::Result<ExitRx> {
    let spawned = Instant::now();
    let (exit_tx, exit_rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new().name("pty-wait".into()).spawn(move || {
        let (status, usage) = wait_child(child);
        let receipt = usage.map(|ru| crate::resources::from_rusage(spawned.elapsed(), &ru));
        procs::disown_child(pid);
        let _ = exit_tx.send((status, receipt));
    })?;
    Ok(exit_rx)
}

/// Starts the `pty-read` thread (see the module docs).
fn start_reader(
    reader: PtyReader,
    screen: Arc<Mutex<Screen>>,
    app_cursor: Arc<AtomicBool>,
    on_output: Option<OutputFn>,
) -> io::Result<mpsc::Receiver<Chunk>> {
    let (chunk_tx, chunk_rx) = mpsc::channel::<Chunk>(CHUNK_QUEUE);
    std::thread::Builder::new().name("pty-read".into()).spawn(move || {
        read_terminal(reader, &screen, &app_cursor, on_output.as_ref(), &chunk_tx)
    })?;
    Ok(chunk_rx)
}

/// The reader thread's loop: the terminal into the screen, the screen's text to the run.
fn read_terminal(
    mut reader: PtyReader,
    screen: &Mutex<Screen>,
    app_cursor: &AtomicBool,
    on_output: Option<&OutputFn>,
    chunk_tx: &mpsc::Sender<Chunk>,
) {
    let mut buf = vec![0u8; READ_CHUNK];
    // Text is batched while output keeps coming (one wake-up of the async side per batch, not
    // per 4 KiB read) and sent as soon as the terminal goes quiet.
    let mut text = String::new();
    let mut unsent = false;
    let mut last_send = Instant::now();
    loop {
        if unsent && !reader.ready() {
            if chunk_tx.blocking_send(Chunk { text: std::mem::take(&mut text) }).is_err() {
                return;
            }
            unsent = false;
            last_send = Instant::now();
        }
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        {
            let mut s = lock(screen);
            s.process(&buf[..n]);
            s.take_text(&mut text);
            app_cursor.store(s.application_cursor(), Ordering::Relaxed);
        }
        // After the screen: a view that reacts to these bytes (a key typed in answer to a mode
        // switch) finds the runtime already in the mode they set.
        if let Some(f) = on_output {
            f(&buf[..n]);
        }
        unsent = true;
        if text.len() >= TEXT_BATCH || last_send.elapsed() >= BATCH_DELAY {
            if chunk_tx.blocking_send(Chunk { text: std::mem::take(&mut text) }).is_err() {
                return;
            }
            unsent = false;
            last_send = Instant::now();
        }
    }
    if unsent {
        let _ = chunk_tx.blocking_send(Chunk { text });
    }
}

/// Starts the `pty-write` thread: it owns the master's writer and writes normalized input.
fn start_writer(writer: Box<dyn Write + Send>) -> io::Result<std::sync::mpsc::Sender<Vec<u8>>> {
    let (input_tx, input_rx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::Builder::new().name("pty-write".into()).spawn(move || {
        let mut writer = writer;
        for data in input_rx {
            if writer.write_all(&data).and_then(|_| writer.flush()).is_err() {
                break;
            }
        }
    })?;
    Ok(input_tx)
}

/// The async side of a run, from the spawn to the end (see the module docs).
struct Driver<'a> {
    out: &'a mut dyn PtyOutput,
    screen: Arc<Mutex<Screen>>,
    app_cursor: Arc<AtomicBool>,
    /// Kept for resizes; dropped last.
    master: Box<dyn portable_pty::MasterPty + Send>,
    group: Arc<procs::Group>,
    pid: i32,
    input_tx: std::sync::mpsc::Sender<Vec<u8>>,
    chunk_rx: mpsc::Receiver<Chunk>,
    exit_rx: ExitRx,
    control: Option<mpsc::UnboundedReceiver<PtyControl>>,
    on_waiting: Option<WaitingFn>,
    /// The exit status, once the waiter reported.
    exit: Option<Option<i32>>,
    resources: Option<crate::resources::Resources>,
    exited_at: Option<Instant>,
    eof: bool,
    ending: Option<PtyEnd>,
    kill_task: Option<tokio::task::JoinHandle<()>>,
    give_up: Option<Instant>,
    // Waiting for input (contract §8.4): looked at while the terminal is quiet.
    last_output: Instant,
    waiting: bool,
    next_check: Instant,
}

impl Driver<'_> {
    /// Waits until the run is complete (see the module docs: completion and killing).
    async fn drive(&mut self, deadline: Option<Instant>, cancel: &CancellationToken) {
        let far = Instant::now() + Duration::from_secs(365 * 24 * 3600);
        let pid = self.pid;
        loop {
            if self.exit.is_some() && self.eof {
                break;
            }
            if self.give_up.is_some_and(|t| Instant::now() >= t) {
                tracing::warn!("PTY run {pid}: no EOF after the kill; giving up on it");
                break;
            }
            let running = self.exit.is_none() && self.ending.is_none();
            let leftover_at = match (self.exited_at, &self.kill_task) {
                (Some(t), None) if !self.eof => Some(t + LEFTOVER_GRACE),
                _ => None,
            };
            let (watching, exited) = (self.on_waiting.is_some(), self.exit.is_some());
            let (next_check, give_up) = (self.next_check, self.give_up);
            tokio::select! {
                biased;
                _ = cancel.cancelled(), if running => {
                    self.ending = Some(PtyEnd::Cancelled);
                }
                _ = tokio::time::sleep_until(deadline.unwrap_or(far).into()), if running && deadline.is_some() => {
                    self.ending = Some(PtyEnd::TimedOut);
                }
                chunk = self.chunk_rx.recv(), if !self.eof => self.on_chunk(chunk),
                _ = tokio::time::sleep_until(next_check.into()), if running && watching => {
                    self.check_waiting().await;
                }
                _ = tokio::time::sleep(crate::shell::session::IDLE_TICK), if running => {
                    let screen = &self.screen;
                    self.out.idle(&|| lock(screen).live_text());
                }
                st = &mut self.exit_rx, if !exited => {
                    let (status, receipt) = st.unwrap_or((None, None));
                    self.exit = Some(status);
                    self.resources = receipt;
                    self.exited_at = Some(Instant::now());
                }
                msg = recv_control(&mut self.control), if running => self.on_control(msg),
                _ = tokio::time::sleep_until(leftover_at.unwrap_or(far).into()), if leftover_at.is_some() => {
                    tracing::debug!("PTY run {pid}: a leftover process holds the terminal; killing it");
                    self.start_kill();
                }
                _ = tokio::time::sleep_until(give_up.unwrap_or(far).into()), if give_up.is_some() => {}
            }
            if self.ending.is_some() && self.kill_task.is_none() {
                self.start_kill();
            }
        }
    }

    /// Kills the run's processes (the ladder runs off the async threads) and gives their end a
    /// bound.
    fn start_kill(&mut self) {
        let group = self.group.clone();
        let grace = procs::KILL_GRACE;
        self.kill_task = Some(tokio::task::spawn_blocking(move || group.kill_blocking(grace)));
        self.give_up = Some(Instant::now() + procs::KILL_GRACE + SETTLE_AFTER_KILL);
    }

    fn on_chunk(&mut self, chunk: Option<Chunk>) {
        match chunk {
            Some(c) => {
                self.out.text(&c.text);
                let screen = &self.screen;
                self.out.tick(&|| lock(screen).live_text());
                self.last_output = Instant::now();
                self.set_waiting(false);
            }
            None => self.eof = true,
        }
    }

    fn set_waiting(&mut self, now: bool) {
        if self.waiting != now {
            self.waiting = now;
            if let Some(f) = &self.on_waiting {
                f(now);
            }
        }
    }

    /// Whether the program waits for input, once the terminal has been quiet a while.
    async fn check_waiting(&mut self) {
        self.next_check = Instant::now() + waiting::CHECK_EVERY;
        if self.last_output.elapsed() >= waiting::QUIET {
            let pgrp = self.master.process_group_leader().unwrap_or(-1);
            let reads = tokio::task::spawn_blocking(move || waiting::group_reads_terminal(pgrp))
                .await
                .unwrap_or(false);
            self.set_waiting(reads);
        }
    }

    fn on_control(&mut self, msg: Option<PtyControl>) {
        match msg {
            Some(PtyControl::Input(bytes)) => {
                // Typing answers the question; a new one is seen after the next quiet second.
                self.last_output = Instant::now();
                self.set_waiting(false);
                let mut norm = Vec::with_capacity(bytes.len());
                keys::normalize(&bytes, self.app_cursor.load(Ordering::Relaxed), &mut norm);
                if !norm.is_empty() {
                    let _ = self.input_tx.send(norm);
                }
            }
            Some(PtyControl::Resize(size)) => {
                let size = size.clamped();
                // The screen first: output the program draws for the new size (after its
                // SIGWINCH) must land on a screen of that size.
                lock(&self.screen).resize(size);
                if let Err(e) = self.master.resize(size.pty_size()) {
                    tracing::debug!("PTY resize failed: {e}");
                }
            }
            Some(PtyControl::Kill) => self.ending = Some(PtyEnd::Killed),
            None => self.control = None,
        }
    }

    /// The end of the run: the kill's ladder done, the last text and the final screen sent.
    async fn finish(self) -> PtyRun {
        let Driver { out, screen, master, input_tx, mut chunk_rx, kill_task, .. } = self;
        // The kill has finished its ladder once this returns: nothing the run started survives it.
        if let Some(task) = kill_task {
            let _ = task.await;
        }
        // Whatever is still queued was on the screen before the end.
        while let Ok(c) = chunk_rx.try_recv() {
            out.text(&c.text);
        }
        let mut text = String::new();
        lock(&screen).finish(&mut text);
        out.text(&text);
        // Drop order: the writer thread ends (and drops the writer) when this sender goes; the
        // master goes last. A reader still blocked on a terminal held by an unreachable process
        // keeps its own clone and ends when that process lets go.
        drop(input_tx);
        drop(chunk_rx);
        drop(master);
        let end = self.ending.unwrap_or(PtyEnd::Exited(self.exit.flatten()));
        PtyRun { end, resources: self.resources }
    }
}

/// Our own read end of the master: a duplicate of its fd, so the reader thread can ask whether
/// more output is waiting (`poll`) before blocking in `read`.
struct PtyReader {
    file: std::fs::File,
}

impl PtyReader {
    fn clone_of(master: &dyn portable_pty::MasterPty) -> io::Result<PtyReader> {
        use std::os::fd::FromRawFd;
        let fd = master.as_raw_fd().ok_or_else(|| io::Error::other("PTY master has no fd"))?;
        // SAFETY: duplicates a valid fd (close-on-exec: no command inherits it).
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `dup` is a fresh fd that nothing else owns.
        Ok(PtyReader { file: unsafe { std::fs::File::from_raw_fd(dup) } })
    }

    /// Output is waiting: a read would not block.
    fn ready(&self) -> bool {
        use std::os::fd::AsRawFd;
        let mut pfd = libc::pollfd { fd: self.file.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, no timeout.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        n > 0 && pfd.revents & libc::POLLIN != 0
    }

    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.file.read(buf) {
            // Linux reports "no process holds the terminal any more" as EIO: that is EOF.
            Err(e) if e.raw_os_error() == Some(libc::EIO) => Ok(0),
            r => r,
        }
    }
}

async fn recv_control(rx: &mut Option<mpsc::UnboundedReceiver<PtyControl>>) -> Option<PtyControl> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Blocks until the child exits; its status as a shell reports it (128 + N for signal N), and its
/// rusage (the child and the descendants it waited for).
#[allow(clippy::disallowed_methods)] // on the `pty-wait` thread of its own
fn wait_child(
    mut child: Box<dyn portable_pty::Child + Send + Sync>,
) -> (Option<i32>, Option<libc::rusage>) {
    use std::os::unix::process::ExitStatusExt;
    // portable-pty's own status keeps only the signal's name; the std child underneath has it
    // all. It is reaped with `wait4` for its rusage; std's `Child` then never waits again.
    let plain: &mut dyn portable_pty::Child = &mut *child;
    if let Some(std_child) = plain.downcast_mut::<std::process::Child>() {
        let pid = std_child.id() as libc::pid_t;
        let mut status = 0;
        // SAFETY: an all-zero rusage is a valid value of this plain C struct.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        loop {
            // SAFETY: valid pointers to locals; `pid` is our own unreaped child.
            let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
            if r == pid {
                let code = shell::exit_code(std::process::ExitStatus::from_raw(status));
                return (code, Some(ru));
            }
            if r < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            // Reaped elsewhere (it should not be): std's wait reports what it can.
            return (std_child.wait().ok().and_then(shell::exit_code), None);
        }
    }
    (child.wait().ok().map(|st| st.exit_code() as i32), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_with(
        pairs: &'static [(&'static str, &'static str)],
    ) -> impl Fn(&str) -> Option<OsString> {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| OsString::from(v))
    }

    #[test]
    fn pty_selection() {
        let none = env_with(&[]);
        // Explicit requests always get a PTY.
        assert!(wants_pty(true, Origin::Tool, None, false, &none));
        assert!(wants_pty(
            true,
            Origin::Bang,
            Some("off"),
            false,
            env_with(&[("AGENT_BASH_NO_PTY", "1")])
        ));
        // Tool calls: setting on, UI attached, not opted out.
        assert!(wants_pty(false, Origin::Tool, Some("on"), true, &none));
        assert!(!wants_pty(false, Origin::Tool, Some("off"), true, &none));
        assert!(!wants_pty(false, Origin::Tool, None, true, &none));
        assert!(!wants_pty(false, Origin::Tool, Some("on"), false, &none));
        assert!(!wants_pty(
            false,
            Origin::Tool,
            Some("on"),
            true,
            env_with(&[("AGENT_BASH_NO_PTY", "1")])
        ));
        assert!(!wants_pty(false, Origin::Tool, Some("on"), true, env_with(&[("PI_NO_PTY", "1")])));
        assert!(wants_pty(
            false,
            Origin::Tool,
            Some("on"),
            true,
            env_with(&[("AGENT_BASH_NO_PTY", "0")])
        ));
        // Bang commands only on request.
        assert!(!wants_pty(false, Origin::Bang, Some("on"), true, &none));
    }

    #[test]
    fn pty_size_clamp() {
        assert_eq!(TermSize { cols: 10, rows: 2 }.clamped(), TermSize { cols: 20, rows: 5 });
        assert_eq!(TermSize { cols: 999, rows: 999 }.clamped(), TermSize { cols: 400, rows: 200 });
        assert_eq!(TermSize { cols: 80, rows: 24 }.clamped(), TermSize { cols: 80, rows: 24 });
    }

    #[test]
    fn pty_script_has_no_setup_in_the_command() {
        let s = script(
            ShellKind::Bash,
            Some(Path::new("/s/snap")),
            Path::new("/w d"),
            "echo 'hi'",
            None,
        );
        assert_eq!(
            s,
            ". '/s/snap' </dev/null >/dev/null 2>&1; shopt -s expand_aliases; builtin cd -- '/w d' && builtin eval 'echo '\\''hi'\\'''\n"
        );
        assert!(script(ShellKind::Posix, None, Path::new("/"), "x", None)
            .starts_with("cd -- '/' && eval"));
    }
}
