//! Remote shell sessions (contract §12): a persistent shell on the other side of any engine that
//! gives a byte stream (`ssh -T host`, `docker exec -i box sh`, `kubectl exec -i pod -- sh`).
//!
//! # Design
//! No shared filesystem is assumed, so everything travels in-band over the engine's stdin and
//! stdout. On connect we send one line to whatever shell the engine starts:
//! `exec bash --noprofile --norc -c '<driver>' agent-bash-remote NONCE MARK ENCODER`, where the
//! driver is [`DRIVER`] (bash, plus `setsid`, `mkfifo`, `mktemp` and `grep` on the remote side).
//! When the remote side has `perl` (every Debian and Ubuntu has it: perl-base is essential), the
//! reader described below is [`READER_PL`], one process that needs no fork per command (a
//! round trip of `true` then costs no process start at all); without perl the bash reader
//! starts an encoder per command. The driver splits in two:
//!
//! * the *reader* owns the byte stream from us: it forwards command lines to the *shell* through
//!   a FIFO, prepares one output FIFO and encoder per command ahead of time (off the critical
//!   path), and handles control lines while a command runs: `X <seq>` closes that command's
//!   output (the producer then gets SIGPIPE, as locally), `K` kills the shell's whole tree (its
//!   own session and process group, plus every process carrying the session's environment mark,
//!   which catches those that called `setsid`) and ends. End of its input does the same, so a
//!   lost connection never leaves processes behind;
//! * the *shell* (`bash` in a session of its own) reads short protocol lines and keeps state
//!   between commands, exactly as a local session does: variables, functions, aliases and `cd`.
//!
//! Every frame sent back starts with a per-session random nonce and is written in one `write(2)`
//! of at most 4096 bytes (a pipe keeps such writes whole even with several writers). Command
//! output travels inside length-prefixed `O` frames, so no output can ever be parsed as a frame,
//! whatever it prints. A task of ours reads frames into a channel (so the run loop's `select!`
//! never loses half a frame); output is then sanitized, windowed and spilled to artifacts
//! locally by the same sink as local runs.
//!
//! A cancel or timeout sends `K` and waits for the `K` frame (the tree is gone by then), keeping
//! the output that was written before; the session is thrown away, as a local one is, and the
//! next command reconnects (`shell_restarted`). An engine that ends (connection lost, ssh
//! killed) fails the running call with `Remote session lost: <reason>`.

use std::future::Future;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::procs;
use super::read_loop::{read_loop, Event, LoopEnd, Phase, Transport};
use super::session::{exit_code, Ending, OutputSink, RunEnd, RunError, Session};

/// The remote driver, sent as text on connect (no binary is uploaded).
pub const DRIVER: &str = include_str!("remote_driver.sh");
/// The driver's fast path when the remote side has perl (one process, no fork per command).
pub const READER_PL: &str = include_str!("remote_reader.pl");

/// How long connecting (engine start, login, driver start-up) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// After `K`, how long to wait for the remote side to report the tree killed.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// Longest header line we accept from the remote side (before the ready frame: any line).
const MAX_LINE: usize = 64 * 1024;
/// How much of the engine's stderr is kept to explain a failure.
const STDERR_KEEP: usize = 4096;
/// Frames buffered between the reader task and a run (back-pressure past that).
const FRAME_QUEUE: usize = 64;

/// How output is encoded on the remote side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoder {
    /// `perl` when the remote side has it, else the shell encoder.
    #[default]
    Auto,
    /// Only `dd`, `wc` and `cat` (slower; what a minimal container gets).
    Shell,
}

/// Everything needed to open a remote session.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// The profile's name (reported in results).
    pub profile: String,
    /// The words that start the engine: `["ssh", "-T", "devbox"]`.
    pub argv: Vec<String>,
    /// Variables exported in the remote shell (the hardening of contract §6, the user's `env`).
    pub env: Vec<(String, String)>,
    pub encoder: Encoder,
}

/// One frame from the remote side.
#[derive(Debug)]
enum Frame {
    Out(u64, Vec<u8>),
    OutEnd(u64),
    Done(u64, i32),
    BadCwd(u64),
    ShellExited(i32),
    Killed,
    /// The stream ended or broke: the reason.
    Closed(String),
}

/// A live remote session.
#[derive(Debug)]
pub struct RemoteShell {
    child: Child,
    pid: i32,
    /// Dropped to end the session (the remote side then kills its tree).
    stdin: Option<ChildStdin>,
    frames: mpsc::Receiver<Frame>,
    stderr: Arc<Mutex<String>>,
    seq: u64,
    host: String,
    profile: String,
    /// The session cannot run another command (killed, exited or lost).
    dead: bool,
}

/// A random 128-bit token as hex (the frame nonce, the environment mark).
pub fn random_token() -> String {
    // A failing getrandom is never expected on Linux; the fallback is still unique, just not
    // secret.
    super::random_hex::<16>().unwrap_or_else(|_| {
        super::local::nonce().chars().filter(|c| c.is_ascii_alphanumeric()).collect()
    })
}

/// Quotes `s` as a bash `$'…'` word on one line (newlines and control bytes escaped).
pub fn quote_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 3);
    out.push_str("$'");
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 || c == '\x7f' => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// The cwd as the remote shell assigns it: `~` and `~/…` expand there, anything else is data.
fn cwd_word(cwd: Option<&str>) -> String {
    match cwd.map(str::trim) {
        None | Some("") => "''".into(),
        Some("~") => "~".into(),
        Some(c) => match c.strip_prefix("~/") {
            Some(rest) => format!("~/{}", quote_line(rest)),
            None => quote_line(c),
        },
    }
}

/// Why a remote session could not start ([`RemoteShell::connect`]), worded for the user.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The profile's `argv` is empty.
    #[error("profile {0:?} has no command")]
    NoCommand(String),
    #[error("cannot start {program}: {source}")]
    Start { program: String, source: io::Error },
    #[error("engine pipes missing")]
    PipesMissing,
    /// The engine or the shell ended, or answered wrongly, before the session was ready: the
    /// engine's last stderr line when it has one, else what was seen ([`reason`]).
    #[error("{0}")]
    Refused(String),
}

impl RemoteShell {
    /// Starts the engine, bootstraps the driver and waits for the shell to answer. The error
    /// is the reason, worded for the user (the engine's last stderr line when it has one).
    pub async fn connect(cfg: &RemoteConfig) -> Result<RemoteShell, ConnectError> {
        let Some((program, args)) = cfg.argv.split_first() else {
            return Err(ConnectError::NoCommand(cfg.profile.clone()));
        };
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = procs::spawn_owned(|| cmd.spawn(), |c| c.id().map(|p| p as i32))
            .map_err(|source| ConnectError::Start { program: program.clone(), source })?;
        let pid = child.id().map(|p| p as i32).unwrap_or(-1);
        let (Some(mut stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(ConnectError::PipesMissing);
        };
        let err_text = Arc::new(Mutex::new(String::new()));
        tokio::spawn(collect_stderr(stderr, err_text.clone()));
        let nonce = random_token();
        let mut reader = BufReader::with_capacity(256 * 1024, stdout);
        let started = bootstrap(&mut stdin, &mut reader, &nonce, cfg.encoder);
        let (shell_pid, host) = match tokio::time::timeout(CONNECT_TIMEOUT, started).await {
            Ok(Ok(v)) => v,
            // Let the engine finish writing its error before it is read.
            Ok(Err(why)) => {
                let why = why.to_string();
                return Err(ConnectError::Refused(
                    engine_failed(child, pid, false, &why, &err_text).await,
                ));
            }
            Err(_) => {
                let why = "no answer within 30 s";
                return Err(ConnectError::Refused(
                    engine_failed(child, pid, true, why, &err_text).await,
                ));
            }
        };
        let (tx, rx) = mpsc::channel(FRAME_QUEUE);
        tokio::spawn(read_frames(reader, nonce, tx));
        let mut shell = RemoteShell {
            child,
            pid,
            stdin: Some(stdin),
            frames: rx,
            stderr: err_text,
            seq: 0,
            host,
            profile: cfg.profile.clone(),
            dead: false,
        };
        // The shell's process group (for kills), then the environment.
        let mut init = format!("P {shell_pid}\n");
        if !cfg.env.is_empty() {
            let exports: Vec<String> =
                cfg.env.iter().map(|(k, v)| format!("{k}={}", quote_line(v))).collect();
            init.push_str(&format!("E \\builtin export {}\n", exports.join(" ")));
        }
        if let Err(e) = shell.send(&init).await {
            let why = shell.lost_reason(&e.to_string()).await;
            shell.close().await;
            return Err(ConnectError::Refused(why));
        }
        Ok(shell)
    }

    /// The remote host's name, as it reports it.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The profile this session was opened with.
    pub fn profile(&self) -> &str {
        &self.profile
    }

    /// The engine's local process id (ssh, docker, kubectl).
    pub fn engine_pid(&self) -> i32 {
        self.pid
    }

    async fn send(&mut self, text: &str) -> io::Result<()> {
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "the session has ended"));
        };
        stdin.write_all(text.as_bytes()).await?;
        stdin.flush().await
    }

    /// Runs one command in `cwd` (None: where the last command left the shell). Output goes to
    /// `out` as it arrives. Same ending rules as a local run (contract §5).
    async fn run_command(
        &mut self,
        command: &str,
        cwd: Option<&str>,
        out: &mut dyn OutputSink,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<RunEnd, RunError> {
        if self.dead {
            return Err(RunError::Lost("the session has ended".into()));
        }
        self.seq += 1;
        let seq = self.seq;
        let line = format!(
            "C {seq} __ab_s={seq};__ab_c={};__ab_cmd={};\\builtin . \"$__ab_d/run\"\n",
            cwd_word(cwd),
            quote_line(command)
        );
        if let Err(e) = self.send(&line).await {
            self.dead = true;
            return Err(RunError::Lost(self.lost_reason(&e.to_string()).await));
        }
        let mut run = RemoteRun { shell: &mut *self, seq, bytes: Vec::new(), fg: None };
        let end = read_loop(&mut run, out, deadline, cancel).await?;
        self.after_run(seq, &end, out).await;
        Ok(RunEnd::of(end.ending, end.eof, end.closed_early))
    }

    /// After the read loop: a timeout or cancel kills the tree; background jobs that still
    /// hold the output get SIGPIPE.
    async fn after_run(&mut self, seq: u64, end: &LoopEnd, out: &mut dyn OutputSink) {
        match end.ending {
            Ending::TimedOut | Ending::Cancelled => {
                self.kill_tree(seq, out, end.closed_early).await;
            }
            Ending::Done(_) if !end.eof && !end.closed_early => {
                // Background jobs still hold the output: stop reading it (they get SIGPIPE).
                let _ = self.send(&format!("X {seq}\n")).await;
            }
            _ => {}
        }
        if matches!(end.ending, Ending::ShellExited(_)) {
            self.dead = true;
        }
    }

    /// Kills the shell's whole remote tree and waits until the remote side says it is gone,
    /// keeping output of `seq` that was written before.
    async fn kill_tree(&mut self, seq: u64, out: &mut dyn OutputSink, closed_early: bool) {
        self.dead = true;
        if self.send("K\n").await.is_err() {
            return;
        }
        let until = Instant::now() + KILL_WAIT;
        loop {
            match tokio::time::timeout_at(until.into(), self.frames.recv()).await {
                Ok(Some(Frame::Out(s, bytes))) if s == seq && !closed_early => {
                    out.data(&bytes);
                }
                Ok(Some(Frame::Killed | Frame::Closed(_)) | None) | Err(_) => break,
                Ok(Some(_)) => {}
            }
        }
        // Output the encoder flushed right after the kill.
        while let Ok(Some(Frame::Out(s, bytes))) =
            tokio::time::timeout(Duration::from_millis(50), self.frames.recv()).await
        {
            if s == seq && !closed_early {
                out.data(&bytes);
            }
        }
    }

    /// Ends the session: the remote side kills the shell's tree when its input ends; then the
    /// engine exits (killed if it does not within 2 s).
    pub async fn close(&mut self) {
        self.dead = true;
        // Closing our end of the pipe is what the remote side sees as the end of its input.
        drop(self.stdin.take());
        // Input closed: the driver kills its tree and exits; wait for the engine to follow.
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await.is_err() {
            let _ = self.child.start_kill();
            let _ = tokio::time::timeout(Duration::from_secs(1), self.child.wait()).await;
        }
        procs::disown_child(self.pid);
    }

    /// The reason a lost session gives: the engine's last stderr line, else its exit status,
    /// else `why`.
    async fn lost_reason(&mut self, why: &str) -> String {
        self.dead = true;
        let status = match tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await {
            Ok(Ok(st)) => exit_code(st),
            _ => None,
        };
        procs::disown_child(self.pid);
        // The stderr task may still be reading the engine's last words.
        tokio::time::sleep(Duration::from_millis(20)).await;
        reason(why, &self.stderr, status)
    }
}

/// Why the remote side did not come up ([`bootstrap`]), as [`reason`] words it when the engine
/// printed nothing.
#[derive(Debug, thiserror::Error)]
enum BootError {
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The stream ended (`reason` says "the connection closed").
    #[error("")]
    Ended,
    /// The driver's own refusal (an `L` frame).
    #[error("{0}")]
    Refused(String),
    #[error("unexpected frame at start-up: {0}")]
    Unexpected(String),
}

/// Sends the boot line and waits for the ready frame: the shell's process id and the host's
/// name, or why the remote side could not start.
async fn bootstrap(
    stdin: &mut ChildStdin,
    reader: &mut BufReader<tokio::process::ChildStdout>,
    nonce: &str,
    encoder: Encoder,
) -> Result<(String, String), BootError> {
    let mark = random_token();
    let encoder = match encoder {
        Encoder::Auto => "auto",
        Encoder::Shell => "sh",
    };
    let driver = format!("__reader_pl={}\n{DRIVER}", crate::project::quote(READER_PL));
    let boot = format!(
        "exec bash --noprofile --norc -c {} agent-bash-remote {nonce} {mark} {encoder}\n",
        crate::project::quote(&driver)
    );
    stdin.write_all(boot.as_bytes()).await?;
    stdin.flush().await?;
    // Anything before the ready frame (a banner, a login script's chatter) is skipped.
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut *reader).take(MAX_LINE as u64).read_until(b'\n', &mut line).await?;
        if n == 0 {
            return Err(BootError::Ended);
        }
        let text = String::from_utf8_lossy(&line);
        let mut words = text.trim_end().splitn(4, ' ');
        if words.next() != Some(nonce) {
            continue;
        }
        match (words.next(), words.next(), words.next()) {
            (Some("R"), Some(pid), host) => {
                return Ok((pid.to_string(), host.unwrap_or("").to_string()))
            }
            (Some("L"), _, _) => {
                return Err(BootError::Refused(text.trim_end()[nonce.len() + 3..].to_string()));
            }
            _ => return Err(BootError::Unexpected(text.trim_end().to_string())),
        }
    }
}

/// The reason an engine that did not bring up the shell gives, once it has exited (`kill`: it
/// is killed first).
async fn engine_failed(
    mut child: Child,
    pid: i32,
    kill: bool,
    why: &str,
    err_text: &Mutex<String>,
) -> String {
    if kill {
        let _ = child.start_kill();
    }
    let status = tokio::time::timeout(Duration::from_secs(2), child.wait()).await;
    procs::disown_child(pid);
    let status = match status {
        Ok(Ok(st)) => exit_code(st),
        _ => None,
    };
    reason(why, err_text, status)
}

/// One command's run in a [`RemoteShell`]: its frames, as the read loop sees them.
struct RemoteRun<'s> {
    shell: &'s mut RemoteShell,
    seq: u64,
    /// The bytes of the last output frame.
    bytes: Vec<u8>,
    /// The foreground's ending, once reported.
    fg: Option<Ending>,
}

impl RemoteRun<'_> {
    fn foreground(&mut self, end: Ending) -> Event {
        self.fg = Some(end);
        Event::Foreground(end)
    }
}

impl Transport for RemoteRun<'_> {
    type Wake = Option<Frame>;

    async fn wait(&mut self, _phase: Phase) -> Option<Frame> {
        self.shell.frames.recv().await
    }

    async fn handle(&mut self, frame: Option<Frame>, phase: Phase) -> Event {
        let seq = self.seq;
        match frame {
            Some(Frame::Out(s, bytes)) if s == seq => {
                self.bytes = bytes;
                Event::Output
            }
            Some(Frame::OutEnd(s)) if s == seq => Event::OutputEnd,
            Some(Frame::Done(s, code)) if s == seq && phase.running => {
                self.foreground(Ending::Done(code))
            }
            Some(Frame::BadCwd(s)) if s == seq => Event::Fail(RunError::BadCwd),
            Some(Frame::ShellExited(code)) => {
                self.shell.dead = true;
                match phase.running {
                    true => self.foreground(Ending::ShellExited(Some(code))),
                    false => Event::Nothing,
                }
            }
            Some(Frame::Killed) => {
                self.shell.dead = true;
                match phase.running {
                    true => self.foreground(Ending::ShellExited(None)),
                    false => Event::Nothing,
                }
            }
            // Frames of earlier commands (their background output, their late ends).
            Some(Frame::Out(..) | Frame::OutEnd(_) | Frame::Done(..) | Frame::BadCwd(_)) => {
                Event::Nothing
            }
            closed @ (Some(Frame::Closed(_)) | None) => {
                self.shell.dead = true;
                // The shell had exited: the engine ending after it is expected.
                if let Some(end @ Ending::ShellExited(_)) = self.fg {
                    return Event::End(end);
                }
                let why = match closed {
                    Some(Frame::Closed(w)) => w,
                    _ => String::new(),
                };
                Event::Fail(RunError::Lost(self.shell.lost_reason(&why_or_default(why)).await))
            }
        }
    }

    fn chunk(&self) -> &[u8] {
        &self.bytes
    }

    async fn close_output(&mut self) {
        let _ = self.shell.send(&format!("X {}\n", self.seq)).await;
    }
}

impl Session for RemoteShell {
    type Config = RemoteConfig;
    type StartError = ConnectError;
    type Cwd<'a>
        = Option<&'a str>
    where
        Self: 'a;

    fn start(cfg: &RemoteConfig) -> impl Future<Output = Result<Self, ConnectError>> + Send {
        RemoteShell::connect(cfg)
    }

    fn run<'a>(
        &'a mut self,
        command: &'a str,
        cwd: Option<&'a str>,
        out: &'a mut dyn OutputSink,
        deadline: Option<Instant>,
        cancel: &'a CancellationToken,
    ) -> impl Future<Output = Result<RunEnd, RunError>> + Send + 'a {
        self.run_command(command, cwd, out, deadline, cancel)
    }

    /// Kills the shell's whole remote tree (`K`), then ends the session.
    async fn kill(&mut self) {
        let seq = self.seq;
        self.kill_tree(seq, &mut |_: &[u8]| true, true).await;
        RemoteShell::close(self).await;
    }

    fn close(&mut self) -> impl Future<Output = ()> + Send {
        RemoteShell::close(self)
    }

    fn is_alive(&self) -> bool {
        !self.dead
    }
}

fn why_or_default(why: String) -> String {
    if why.is_empty() {
        "the connection closed".into()
    } else {
        why
    }
}

/// `<engine's last stderr line>` or `<what we saw> (exit status N)`.
fn reason(why: &str, stderr: &Mutex<String>, status: Option<i32>) -> String {
    let text = match stderr.lock() {
        Ok(s) => s.clone(),
        Err(p) => p.into_inner().clone(),
    };
    let last = text
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty() && *l != "Terminated" && !l.starts_with("bash: warning"));
    let why = if why.is_empty() { "the connection closed" } else { why };
    match (last, status) {
        (Some(line), _) => line.to_string(),
        (None, Some(code)) => format!("{why} (engine exit status {code})"),
        (None, None) => why.to_string(),
    }
}

async fn collect_stderr(mut stderr: tokio::process::ChildStderr, keep: Arc<Mutex<String>>) {
    let mut buf = vec![0u8; 4096];
    loop {
        match stderr.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let text = String::from_utf8_lossy(&buf[..n]);
                tracing::debug!("remote engine stderr: {}", text.trim_end());
                let mut k = match keep.lock() {
                    Ok(k) => k,
                    Err(p) => p.into_inner(),
                };
                k.push_str(&text);
                if k.len() > STDERR_KEEP {
                    let mut cut = k.len() - STDERR_KEEP;
                    while !k.is_char_boundary(cut) {
                        cut += 1;
                    }
                    k.drain(..cut);
                }
            }
        }
    }
}

/// Reads frames until the stream ends or breaks; the last message is `Closed(reason)`.
async fn read_frames(
    mut reader: BufReader<tokio::process::ChildStdout>,
    nonce: String,
    tx: mpsc::Sender<Frame>,
) {
    let mut line = Vec::with_capacity(128);
    let why = loop {
        line.clear();
        match (&mut reader).take(MAX_LINE as u64).read_until(b'\n', &mut line).await {
            Ok(0) => break String::new(),
            Ok(_) => {}
            Err(e) => break e.to_string(),
        }
        if line.last() != Some(&b'\n') {
            break "protocol error: truncated frame".into();
        }
        let text = match std::str::from_utf8(&line[..line.len() - 1]) {
            Ok(t) => t,
            Err(_) => break "protocol error: frame header is not text".into(),
        };
        let mut w = text.split(' ');
        if w.next() != Some(nonce.as_str()) {
            break format!("protocol error: unexpected data {:?}", truncate(text, 80));
        }
        let kind = w.next();
        let a = w.next().and_then(|s| s.parse::<u64>().ok());
        let b = w.next();
        let frame = match (kind, a, b) {
            (Some("O"), Some(seq), Some(len)) => {
                let Ok(len) = len.parse::<usize>() else {
                    break "protocol error: bad length".into();
                };
                if len > 1 << 20 {
                    break "protocol error: frame too long".into();
                }
                let mut bytes = vec![0u8; len];
                if let Err(e) = reader.read_exact(&mut bytes).await {
                    break e.to_string();
                }
                Frame::Out(seq, bytes)
            }
            (Some("F"), Some(seq), None) => Frame::OutEnd(seq),
            (Some("D"), Some(seq), Some(code)) => Frame::Done(seq, code.parse().unwrap_or(1)),
            (Some("E"), Some(seq), None) => Frame::BadCwd(seq),
            (Some("X"), Some(code), None) => Frame::ShellExited(code as i32),
            (Some("K"), None, None) => Frame::Killed,
            _ => break format!("protocol error: bad frame {:?}", truncate(text, 80)),
        };
        if tx.send(frame).await.is_err() {
            return;
        }
    };
    let _ = tx.send(Frame::Closed(why)).await;
}

fn truncate(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_line_is_one_line_and_round_trips_in_bash() {
        let s = "a'b\\c\nd\te\u{1}f héllo $HOME `x`";
        let q = quote_line(s);
        assert!(!q.contains('\n'));
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("printf %s {q}"))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8(out.stdout).unwrap(), s);
    }

    #[test]
    fn tokens_are_random_hex() {
        let a = random_token();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, random_token());
    }

    #[test]
    fn cwd_words() {
        assert_eq!(cwd_word(None), "''");
        assert_eq!(cwd_word(Some("~")), "~");
        assert_eq!(cwd_word(Some("~/a b")), "~/$'a b'");
        assert_eq!(cwd_word(Some("/x")), "$'/x'");
    }
}
