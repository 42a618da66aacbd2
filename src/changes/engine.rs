//! One receipt engine per project, shared by every backend of the user on the machine
//! (contract §13, "Many agents at once").
//!
//! The engine is a process of its own (`agent-bash __changes-engine <socket>`), started by the
//! first backend that needs a project's receipts and found by the others through a Unix socket
//! in the user's runtime directory, named after the project root and the `[changes]` settings
//! ([`Spot::paths`]). It keeps the project's one watch and takes its snapshots; backends ask it
//! "a run begins" and "the run ends" over JSON lines ([`Ask`], [`Reply`]) and get the receipt.
//!
//! Snapshots are shared: a request waits for the first snapshot that *started* after it
//! arrived, so concurrent requests are served by one `git add` ([`Engine::fresh`]). Runs that
//! overlap in time each get the changes between their own two snapshots; a path that changed
//! between two snapshots while another run was going on is marked `overlap` (either run may have
//! changed it), and undo refuses such a run ([`super::UndoError::Ambiguous`]).
//!
//! Single ownership and start-up: `<key>.lock` is held (`flock`) by the engine for its whole
//! life, so a socket left by a killed engine is stale and removed by the next one. Clients take
//! `<key>.start` around connecting (and starting an engine when none answers) until their hello
//! is answered; an engine with no client left takes it too before it removes its socket and
//! exits, so no client ever connects to an engine on its way out.
//!
//! Crash safety: the store's lock is inherited by the `git add` of a snapshot
//! ([`super::add_all`]), so an engine (or backend) killed mid-snapshot leaves the lock held until
//! that git ends, and the next one never races it; a killed backend's runs end with its
//! connection.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::oneshot;

use super::store::{self, Delta, Entry, Tree};
use super::{ChangesError, ChangesSettings, Project, Readiness, Receipts};

/// How long an engine with no client left waits for a new one before it exits.
pub const LINGER: Duration = Duration::from_secs(5);
/// How long a client waits for an engine's answer to its hello (a stopped engine: the client
/// takes the private path).
const HELLO_WAIT: Duration = Duration::from_secs(5);
/// The hidden subcommand that runs an engine.
pub const SUBCOMMAND: &str = "__changes-engine";

/// A request: its id and what is asked.
#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    pub id: u64,
    #[serde(flatten)]
    pub ask: Ask,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "ask", rename_all = "snake_case")]
pub enum Ask {
    /// The first message of a connection: the project and the client's settings and own
    /// directories (never part of the project's files).
    Hello {
        root: PathBuf,
        is_git: bool,
        settings: ChangesSettings,
        state_root: PathBuf,
        own: Vec<PathBuf>,
        /// Linux: the abstract name the client listens on; the engine connects to it before
        /// answering, which a fenced process cannot do (Landlock's scope): the proof that the
        /// engine is no fenced command squatting its name ([`Paths::Named`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        proof: Option<String>,
    },
    /// A run begins: its first snapshot. `paths`: their entries in it are answered (undo's
    /// check of what changed since).
    Begin { paths: Vec<Vec<u8>> },
    /// The run ends: its receipt.
    End { run: u64 },
    /// The run begun in slot `slot` of the connection's block ends: its receipt (see
    /// [`super::page`]; a claim not adopted yet is adopted first).
    EndSlot { slot: usize },
    /// The run ended without a receipt, no answer awaited. `quiet`: its client saw that
    /// nothing changed during it (see [`super::page`]), and it ends where it began; else (a run
    /// dropped before its end was asked) it ends now, overlapping what changed meanwhile.
    Close { run: u64, quiet: bool },
    /// The engine's change counter and a copy of its watch's descriptor, sent with the answer
    /// (`SCM_RIGHTS`, Linux).
    Watch,
    /// Whether the project's receipts are ready (how far its first snapshot has got).
    Status,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Response {
    pub id: u64,
    #[serde(flatten)]
    pub reply: Reply,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    /// The store the engine keeps (undo reads saved contents from it) and its pid.
    Hello {
        shadow: PathBuf,
        pid: u32,
        /// The connection's block of slots in the engine's page, for runs begun without asking.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        block: Option<usize>,
    },
    Begun {
        run: u64,
        entries: Vec<Option<Entry>>,
        /// The project was quiet when the run began: what tells, at its end, that it still is.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        quiet: Option<QuietMark>,
    },
    Ended {
        deltas: Vec<Delta>,
    },
    /// No receipt, and why (the text of `changes_unavailable`).
    Failed {
        reason: String,
    },
    /// No receipt because the project's first snapshot is being taken: `reason` says how far
    /// it has got.
    Indexing {
        reason: String,
    },
    Status {
        readiness: Readiness,
    },
    /// The descriptors of [`Ask::Watch`] go with this answer: the page, then the watch's.
    Watch {
        watch: u64,
    },
}

/// What a client checks at the end of a run begun on a quiet project, to know without asking
/// that nothing changed during it: the engine's change counter as it was before the project
/// was found quiet, the watch whose queue was empty then (its descriptor from
/// [`Ask::Watch`]), and the ignore files outside the tree with their stamps then.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QuietMark {
    gen: u64,
    watch: u64,
    files: Vec<(Option<PathBuf>, super::Stamp)>,
    /// The number of the snapshot the project is found as: a run begun without asking while the
    /// mark holds claims it.
    #[serde(default)]
    seq: u64,
}

/// An engine of another protocol is another engine (its name differs). 3: the `status` ask
/// and the `indexing` reply (an engine or backend of 2 would end the connection on them).
/// 4: quiet runs (`close`, `watch`, the `quiet` of `begun`). 5: runs begun without asking
/// (slots in the page, `end_slot`, the `block` of `hello`).
pub const PROTOCOL: u32 = 5;

/// Where the engines of this user are found.
#[derive(Debug, Clone)]
pub enum Spot {
    /// Linux: in the abstract socket namespace, by name. No file: nothing to plant, remove or
    /// leave behind, and Landlock's scope (ABI 6) keeps fenced commands from connecting to a
    /// socket made outside their fence.
    Named,
    /// A private directory of the runtime base holding socket files (macOS, the portable paths).
    Dir(PathBuf),
}

/// How one engine is reached.
#[derive(Debug, Clone)]
pub enum Paths {
    /// An abstract socket name (Linux).
    Named(String),
    /// Its socket file, its lock (held for its life) and the start lock.
    Files { socket: PathBuf, lock: PathBuf, start: PathBuf },
}

impl Paths {
    /// The lock and start files beside a socket `<dir>/<key>.sock`.
    pub fn of_socket(socket: &Path) -> Paths {
        Paths::Files {
            socket: socket.to_path_buf(),
            lock: socket.with_extension("lock"),
            start: socket.with_extension("start"),
        }
    }

    /// The engine subcommand's argument: `@<name>`, or the socket file.
    pub fn arg(&self) -> std::ffi::OsString {
        match self {
            Paths::Named(name) => format!("@{name}").into(),
            Paths::Files { socket, .. } => socket.clone().into_os_string(),
        }
    }

    /// Back from [`Paths::arg`].
    pub fn from_arg(arg: &std::ffi::OsStr) -> Paths {
        match arg.to_str().and_then(|a| a.strip_prefix('@')) {
            Some(name) => Paths::Named(name.to_string()),
            None => Paths::of_socket(Path::new(arg)),
        }
    }

    fn shown(&self) -> String {
        match self {
            Paths::Named(name) => format!("@{name}"),
            Paths::Files { socket, .. } => socket.display().to_string(),
        }
    }
}

// SAFETY (both): geteuid cannot fail.
fn our_uid() -> u32 {
    unsafe { libc::geteuid() }
}

impl Spot {
    /// Linux (not the portable paths): engines by abstract name. Elsewhere [`Spot::at`].
    pub fn named() -> Option<Spot> {
        (cfg!(target_os = "linux") && !crate::platform::portable()).then_some(Spot::Named)
    }

    /// `<base>/agent-bash.engines-<uid>` (not `agent-bash-…`, the prefix of the backends' runtime
    /// directories, which sweeps remove), created private; `None` (the private path) when it
    /// is not ours alone (another user's, a link, wider than 0700) or cannot be made.
    // At start-up (`Runtime::new`): one directory, made once.
    #[allow(clippy::disallowed_methods)]
    pub fn at(base: &Path) -> Option<Spot> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let uid = our_uid();
        let dir = base.join(format!("agent-bash.engines-{uid}"));
        match crate::shell::rundir::private_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                tracing::info!(dir = %dir.display(), "no shared receipt engines: {e}");
                return None;
            }
        }
        let meta = std::fs::symlink_metadata(&dir).ok()?;
        let ours = meta.is_dir() && meta.uid() == uid && meta.permissions().mode() & 0o077 == 0;
        if !ours {
            tracing::info!(dir = %dir.display(), "no shared receipt engines: the folder is not ours alone");
            return None;
        }
        Some(Spot::Dir(dir))
    }

    /// The engine of a project under given settings (different settings: another engine).
    pub fn paths(&self, root: &Path, settings: &ChangesSettings) -> Option<Paths> {
        use std::os::unix::ffi::OsStrExt;
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let text = serde_json::to_vec(settings).ok()?;
        let version = PROTOCOL.to_le_bytes();
        for &b in root.as_os_str().as_bytes().iter().chain(b"\0").chain(&text).chain(&version) {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        match self {
            Spot::Named => {
                Some(Paths::Named(format!("agent-bash.engine-{}-{hash:016x}", our_uid())))
            }
            Spot::Dir(dir) => {
                let socket = dir.join(format!("{hash:016x}.sock"));
                // sun_path holds 108 bytes with its NUL.
                (socket.as_os_str().len() < 100).then(|| Paths::of_socket(&socket))
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The client side: one connection per backend and project.

/// A backend's connection to the engine of one project.
#[derive(Debug)]
pub struct Link {
    writer: tokio::sync::Mutex<tokio::net::unix::OwnedWriteHalf>,
    pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Reply>>>>,
    next: AtomicU64,
    alive: Arc<AtomicBool>,
    /// The engine's store (saved contents for undo and diff).
    pub shadow: PathBuf,
    pub pid: u32,
    /// How to reach the engine again (for [`Ask::Watch`], on a connection of its own).
    reach: (Paths, Ask),
    /// The engine's change counter and a copy of its watch's descriptor, once fetched.
    watching: Arc<Mutex<Option<Arc<Watching>>>>,
    /// A fetch is going on, and how many failed (after [`WATCH_TRIES`], no more).
    fetching: AtomicBool,
    failures: AtomicUsize,
    /// This connection's block of slots in the engine's page (see [`super::page`]).
    block: Option<usize>,
    /// The latest quiet mark the engine gave: while it holds, a run begins without asking.
    mark: Mutex<Option<QuietMark>>,
}

/// A run begun without asking: its slot in the engine's page.
#[derive(Debug, Clone)]
pub struct Claim {
    block: usize,
    slot: usize,
    page: Arc<super::page::Page>,
}

/// What [`Ask::Watch`] brought: the engine's page and a copy of its watch's descriptor.
#[derive(Debug)]
struct Watching {
    id: u64,
    page: Arc<super::page::Page>,
    fd: std::os::fd::OwnedFd,
}

impl Watching {
    /// Nothing queued on the watch now, the counter as at `q` and the ignore files too.
    fn quiet_as(&self, q: &QuietMark) -> bool {
        use std::os::fd::AsFd;
        super::watch::queue_empty(self.fd.as_fd())
            && self.page.now() == q.gen
            && q.files.iter().all(|(path, was)| was.same(&super::Stamp::of(path.as_deref())))
    }
}

/// Failed fetches of the watch after which a link always asks the engine at a run's end.
const WATCH_TRIES: usize = 3;

impl Link {
    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Connects to the engine of `paths` (starting one when none answers) and says hello.
    pub async fn open(paths: Paths, hello: Ask) -> Result<Arc<Link>, ChangesError> {
        let reach = (paths.clone(), hello.clone());
        let (stream, reply, pid) =
            tokio::task::spawn_blocking(move || connect_blocking(&paths, hello)).await??;
        let (shadow, block) = match reply {
            Reply::Hello { shadow, block, .. } => (shadow, block),
            Reply::Failed { reason } => return Err(ChangesError::Engine(reason)),
            other => return Err(ChangesError::Engine(format!("unexpected answer {other:?}"))),
        };
        stream
            .set_nonblocking(true)
            .map_err(|e| ChangesError::Engine(format!("cannot use the engine's socket: {e}")))?;
        let stream = tokio::net::UnixStream::from_std(stream)
            .map_err(|e| ChangesError::Engine(format!("cannot use the engine's socket: {e}")))?;
        let (read, write) = stream.into_split();
        let link = Arc::new(Link {
            writer: tokio::sync::Mutex::new(write),
            pending: Arc::default(),
            next: AtomicU64::new(1),
            alive: Arc::new(AtomicBool::new(true)),
            shadow,
            pid,
            reach,
            watching: Arc::default(),
            fetching: AtomicBool::new(false),
            failures: AtomicUsize::new(0),
            block: block.filter(|&b| b < super::page::BLOCKS),
            mark: Mutex::default(),
        });
        let (pending, alive) = (link.pending.clone(), link.alive.clone());
        let watching = link.watching.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(read).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(r) = serde_json::from_str::<Response>(&line) else { break };
                let waiter = pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&r.id);
                if let Some(w) = waiter {
                    let _ = w.send(r.reply);
                }
            }
            alive.store(false, Ordering::Release);
            // The waiters' senders go: each of them hears that the engine is gone.
            pending.lock().unwrap_or_else(|e| e.into_inner()).clear();
            // The copy of its watch's descriptor would keep that watch alive in the kernel.
            watching.lock().unwrap_or_else(|e| e.into_inner()).take();
        });
        Ok(link)
    }

    /// Nothing changed in the project since the run marked `q` began: the engine's watch
    /// still has nothing queued (asked on our copy of its descriptor), then the engine's
    /// counter is as it was before the project was found quiet (no snapshot has read the queue
    /// since), and the ignore files outside the tree are as they were. `false` when it cannot
    /// be told (the descriptor is then fetched, for later runs).
    pub fn still_quiet(self: &Arc<Self>, q: &QuietMark) -> bool {
        self.watching(q).is_some_and(|w| w.quiet_as(q))
    }

    /// The page and descriptor of the watch `q` was given for, when held (else fetched).
    fn watching(self: &Arc<Self>, q: &QuietMark) -> Option<Arc<Watching>> {
        if !self.alive() {
            return None;
        }
        let w = {
            let mut held = self.watching.lock().unwrap_or_else(|e| e.into_inner());
            // A watch the engine replaced: our copy would keep it alive in the kernel.
            if held.as_ref().is_some_and(|w| w.id != q.watch) {
                held.take();
            }
            held.clone()
        };
        if w.is_none() {
            self.fetch_watch();
        }
        w
    }

    /// Keeps `q` (the engine's latest quiet mark) for runs begun without asking.
    pub fn remember(&self, q: &QuietMark) {
        *self.mark.lock().unwrap_or_else(|e| e.into_inner()) = Some(q.clone());
    }

    /// A run begun without asking the engine: the project is as quiet as at the latest mark,
    /// and a slot of this connection's block is claimed at its snapshot, before any later
    /// snapshot took the lock (see [`super::page`]). `None`: ask.
    pub fn begin_quiet(self: &Arc<Self>) -> Option<(Claim, QuietMark)> {
        let block = self.block?;
        let q = self.mark.lock().unwrap_or_else(|e| e.into_inner()).clone()?;
        let w = self.watching(&q)?;
        if !w.quiet_as(&q) {
            return None;
        }
        let slot = w.page.claim(block, q.seq)?;
        let claim = Claim { block, slot, page: w.page.clone() };
        if w.page.now() == q.gen {
            return Some((claim, q));
        }
        // A snapshot took the lock meanwhile: it may have read the queue before the claim.
        self.let_go(&claim, false);
        None
    }

    /// A claimed run is over: the claim taken back (no message), or the run the engine made
    /// of it closed (where it began when `quiet`, else now, as [`Link::close`] does).
    pub fn let_go(self: &Arc<Self>, claim: &Claim, quiet: bool) {
        if let super::page::Taken::Run(run) = claim.page.take_back(claim.block, claim.slot) {
            claim.page.free(claim.block, claim.slot);
            let link = self.clone();
            tokio::spawn(async move { link.close(run, quiet).await });
        }
    }

    /// A claimed run ends: the engine's answer ([`Ask::EndSlot`]). The slot is free once
    /// answered, by a task of its own: dropped while waiting (a cancelled call), the run still
    /// ends in the engine, and the slot is not given to another run before.
    pub async fn end_claim(self: &Arc<Self>, claim: Claim) -> Result<Reply, ChangesError> {
        let link = self.clone();
        let task = tokio::spawn(async move {
            let reply = link.ask(Ask::EndSlot { slot: claim.slot }).await;
            claim.page.free(claim.block, claim.slot);
            reply
        });
        task.await.map_err(|e| ChangesError::Engine(format!("the end of a run failed: {e}")))?
    }

    /// Fetches the engine's page and watch descriptor in the background (one fetch at a time).
    fn fetch_watch(self: &Arc<Self>) {
        if self.failures.load(Ordering::Relaxed) >= WATCH_TRIES
            || self.fetching.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let link = self.clone();
        tokio::spawn(async move {
            let (paths, hello) = link.reach.clone();
            let pid = link.pid;
            let got =
                tokio::task::spawn_blocking(move || fetch_watch_blocking(&paths, hello, pid)).await;
            match got {
                Ok(Ok(w)) => {
                    *link.watching.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(w));
                }
                Ok(Err(e)) => {
                    tracing::debug!("receipt engine: no watch for quiet runs: {e}");
                    link.failures.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    link.failures.fetch_add(1, Ordering::Relaxed);
                }
            }
            link.fetching.store(false, Ordering::Release);
        });
    }

    /// Tells the engine that run `run` ended ([`Ask::Close`]); its answer is not awaited (the
    /// reader drops answers nobody waits for).
    pub async fn close(&self, run: u64, quiet: bool) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        if let Ok(line) = line_of(id, &Ask::Close { run, quiet }) {
            let _ = self.writer.lock().await.write_all(&line).await;
        }
    }

    /// One request and its answer.
    pub async fn ask(&self, ask: Ask) -> Result<Reply, ChangesError> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut line = serde_json::to_vec(&Request { id, ask })
            .map_err(|e| ChangesError::Engine(format!("cannot ask: {e}")))?;
        line.push(b'\n');
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).insert(id, tx);
        let gone = || ChangesError::Engine("the receipt engine of the project stopped".into());
        if !self.alive() {
            return Err(gone());
        }
        let written = self.writer.lock().await.write_all(&line).await;
        if written.is_err() {
            self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
            return Err(gone());
        }
        rx.await.map_err(|_| gone())
    }
}

/// Takes `file`'s `flock` (exclusive), waiting for it. The lock goes with the returned file.
// Blocking by name: only called under spawn_blocking or at an engine's start.
#[allow(clippy::disallowed_methods)]
fn flock_blocking(file: &Path, wait: bool) -> std::io::Result<Option<std::fs::File>> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(file)?;
    let how = if wait { libc::LOCK_EX } else { libc::LOCK_EX | libc::LOCK_NB };
    loop {
        // SAFETY: flock on a file descriptor we own.
        if unsafe { libc::flock(f.as_raw_fd(), how) } == 0 {
            return Ok(Some(f));
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) if !wait => return Ok(None),
            _ => return Err(e),
        }
    }
}

type Connected = (std::os::unix::net::UnixStream, Reply, u32);

fn failed(what: &str, e: std::io::Error) -> ChangesError {
    ChangesError::Engine(format!("{what}: {e}"))
}

/// Connects (starting an engine when none answers), says hello and checks who answered: the
/// engine's pid is the socket's peer (the answer's own `pid` is not trusted).
// Blocking by name: runs under spawn_blocking (`Link::open`).
fn connect_blocking(paths: &Paths, hello: Ask) -> Result<Connected, ChangesError> {
    match paths {
        #[cfg(target_os = "linux")]
        Paths::Named(name) => {
            // An engine on its way out closes connections it accepted meanwhile: try again.
            for _ in 0..3 {
                if let Some(up) = named::connect_blocking(paths, name, &hello)? {
                    return Ok(up);
                }
            }
            Err(ChangesError::Engine(format!("the receipt engine {name} kept closing")))
        }
        #[cfg(not(target_os = "linux"))]
        Paths::Named(name) => {
            Err(ChangesError::Engine(format!("no abstract sockets here for {name}")))
        }
        Paths::Files { socket, start, .. } => connect_file_blocking(paths, socket, start, &hello),
    }
}

/// [`Ask::Watch`] on a connection of its own: the engine's page and a copy of its watch's
/// descriptor, which come with the answer (`SCM_RIGHTS`).
// Blocking by name: under spawn_blocking.
fn fetch_watch_blocking(paths: &Paths, hello: Ask, pid: u32) -> Result<Watching, ChangesError> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    use std::io::Write;
    let (stream, reply, answered) = connect_blocking(paths, hello)?;
    if !matches!(reply, Reply::Hello { .. }) {
        return Err(ChangesError::Engine(format!("unexpected answer {reply:?}")));
    }
    // Another engine than the link's (that one ended): its watch and counter tell nothing of
    // the runs begun in the link's.
    if answered != pid {
        return Err(ChangesError::Engine("the engine changed".into()));
    }
    let line = line_of(1, &Ask::Watch)?;
    (&stream).write_all(&line).map_err(|e| failed("ask for the watch", e))?;
    stream.set_read_timeout(Some(HELLO_WAIT)).map_err(|e| failed("socket", e))?;
    let (mut answer, mut fds) = (Vec::new(), Vec::new());
    while !answer.contains(&b'\n') {
        let mut chunk = [0u8; 4096];
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let mut slices = [std::io::IoSliceMut::new(&mut chunk)];
        #[cfg(target_os = "linux")]
        let flags = RecvFlags::CMSG_CLOEXEC;
        // No engine page there (see [`new_page`]): never asked.
        #[cfg(not(target_os = "linux"))]
        let flags = RecvFlags::empty();
        let got = rustix::net::recvmsg(&stream, &mut slices, &mut control, flags)
            .map_err(|e| failed("the watch", e.into()))?;
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(sent) = message {
                fds.extend(sent);
            }
        }
        if got.bytes == 0 {
            return Err(ChangesError::Engine("the engine closed the connection".into()));
        }
        answer.extend_from_slice(&chunk[..got.bytes]);
    }
    let r: Response = serde_json::from_slice(&answer)
        .map_err(|e| ChangesError::Engine(format!("bad answer to watch: {e}")))?;
    let Reply::Watch { watch: id } = r.reply else {
        return Err(ChangesError::Engine(format!("unexpected answer {:?}", r.reply)));
    };
    let mut fds = fds.into_iter();
    let (Some(page), Some(fd), None) = (fds.next(), fds.next(), fds.next()) else {
        return Err(ChangesError::Engine("the watch came without its descriptors".into()));
    };
    let page = super::page::Page::open(page).map_err(|e| failed("the engine's page", e))?;
    Ok(Watching { id, page: Arc::new(page), fd })
}

/// A request's line, newline-terminated.
fn line_of(id: u64, ask: &Ask) -> Result<Vec<u8>, ChangesError> {
    let mut line = serde_json::to_vec(&RequestRef { id, ask })
        .map_err(|e| ChangesError::Engine(format!("cannot say hello: {e}")))?;
    line.push(b'\n');
    Ok(line)
}

#[derive(Serialize)]
struct RequestRef<'a> {
    id: u64,
    #[serde(flatten)]
    ask: &'a Ask,
}

/// Says `line` and reads the one-line answer (`None`: the engine closed the connection).
// Blocking by name.
fn hello_blocking(
    stream: &std::os::unix::net::UnixStream,
    line: &[u8],
) -> Result<Option<Reply>, ChangesError> {
    use std::io::{BufRead, ErrorKind, Write};
    stream.set_read_timeout(Some(HELLO_WAIT)).map_err(|e| failed("socket", e))?;
    if stream.try_clone().and_then(|mut s| s.write_all(line)).is_err() {
        return Ok(None);
    }
    let mut answer = String::new();
    match std::io::BufReader::new(stream).read_line(&mut answer) {
        Ok(0) => return Ok(None),
        Ok(_) => {}
        // Closed unanswered (an engine on its way out).
        Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe) => {
            return Ok(None)
        }
        Err(e) => return Err(failed("no answer to hello", e)),
    }
    let r: Response = serde_json::from_str(&answer)
        .map_err(|e| ChangesError::Engine(format!("bad answer to hello {answer:?}: {e}")))?;
    stream.set_read_timeout(None).map_err(|e| failed("socket", e))?;
    Ok(Some(r.reply))
}

/// The uid and pid of a Unix socket's other end, as the kernel recorded them.
#[cfg(target_os = "linux")]
fn peer(fd: &impl AsRawFd) -> std::io::Result<(u32, u32)> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills a ucred of the given length.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((cred.uid, cred.pid as u32))
}

/// The uid of a Unix socket's other end (no pid off Linux: 0).
#[cfg(not(target_os = "linux"))]
fn peer(fd: &impl AsRawFd) -> std::io::Result<(u32, u32)> {
    let (mut uid, mut gid) = (0, 0);
    // SAFETY: getpeereid fills two ids.
    if unsafe { libc::getpeereid(fd.as_raw_fd(), &mut uid, &mut gid) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((uid, 0))
}

/// The other end is ours (the same user), or the error that says whose it is.
fn same_user(fd: &impl AsRawFd, what: &str) -> Result<u32, ChangesError> {
    let (uid, pid) =
        peer(fd).map_err(|e| failed("cannot tell who holds the engine's socket", e))?;
    if uid != our_uid() {
        return Err(ChangesError::Engine(format!("{what} belongs to another user (uid {uid})")));
    }
    Ok(pid)
}

#[cfg(target_os = "linux")]
mod named {
    //! Engines by abstract name (Linux).
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};

    use super::{failed, hello_blocking, line_of, same_user, Ask, ChangesError, Connected, Paths};

    pub fn addr(name: &str) -> std::io::Result<SocketAddr> {
        SocketAddr::from_abstract_name(name.as_bytes())
    }

    /// One attempt: connect (starting the engine when no one holds the name), prove, hello.
    /// `None`: the engine closed the connection (it was leaving).
    // Blocking by name: under spawn_blocking.
    pub fn connect_blocking(
        paths: &Paths,
        name: &str,
        hello: &Ask,
    ) -> Result<Option<Connected>, ChangesError> {
        let a = addr(name).map_err(|e| failed("bad engine name", e))?;
        let stream = match UnixStream::connect_addr(&a) {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                super::start_engine_blocking(paths)?;
                UnixStream::connect_addr(&a)
                    .map_err(|e| failed("cannot reach the new engine", e))?
            }
            Err(e) => return Err(failed("cannot reach the receipt engine", e)),
        };
        let pid = same_user(&stream, "the receipt engine's name")?;
        // The proof: a name of ours the engine must connect to before it answers. A fenced
        // command holding the engine's name cannot (Landlock scopes abstract sockets), nor can
        // anyone but the process that listens on the engine's name (its pid is checked).
        let proof_name = format!("agent-bash.proof-{}", crate::shell::local::nonce());
        let proof = UnixListener::bind_addr(&addr(&proof_name).map_err(|e| failed("proof", e))?)
            .map_err(|e| failed("cannot listen for the engine's proof", e))?;
        proof.set_nonblocking(true).map_err(|e| failed("proof", e))?;
        let Ask::Hello { root, is_git, settings, state_root, own, .. } = hello else {
            return Err(ChangesError::Engine("a connection begins with hello".into()));
        };
        let ask = Ask::Hello {
            root: root.clone(),
            is_git: *is_git,
            settings: settings.clone(),
            state_root: state_root.clone(),
            own: own.clone(),
            proof: Some(proof_name),
        };
        let Some(reply) = hello_blocking(&stream, &line_of(0, &ask)?)? else { return Ok(None) };
        let proven = match proof.accept() {
            Ok((conn, _)) => same_user(&conn, "the engine's proof").is_ok_and(|p| p == pid),
            Err(_) => false,
        };
        if !proven {
            return Err(ChangesError::Engine(format!(
                "the process {pid} holding the receipt engine's name did not prove it runs outside every fence (is a fenced command holding it?)"
            )));
        }
        Ok(Some((stream, reply, pid)))
    }

    /// The engine's half of the proof: connect to the client's name.
    // Blocking by name: one connect to a listening socket, under spawn_blocking.
    pub fn prove_blocking(name: &str) {
        if let Err(e) = addr(name).and_then(|a| UnixStream::connect_addr(&a)) {
            tracing::info!("receipt engine: cannot give the proof to {name}: {e}");
        }
    }

    /// Listens on `name`; `None` when another process holds it.
    // Blocking by name: at the engine's start.
    pub fn listen_blocking(name: &str) -> std::io::Result<Option<UnixListener>> {
        match UnixListener::bind_addr(&addr(name)?) {
            Ok(l) => Ok(Some(l)),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Under the start lock: connects (starting an engine when none answers) and says hello.
// Blocking by name: runs under spawn_blocking (`Link::open`).
#[allow(clippy::disallowed_methods)]
fn connect_file_blocking(
    paths: &Paths,
    socket: &Path,
    start: &Path,
    hello: &Ask,
) -> Result<Connected, ChangesError> {
    use std::os::unix::net::UnixStream;
    let _start =
        flock_blocking(start, true).map_err(|e| failed("cannot take the start lock", e))?;
    let stream = match UnixStream::connect(socket) {
        Ok(s) => s,
        Err(_) => {
            start_engine_blocking(paths)?;
            UnixStream::connect(socket).map_err(|e| failed("cannot reach the new engine", e))?
        }
    };
    let pid = same_user(&stream, "the receipt engine's socket")?;
    match hello_blocking(&stream, &line_of(0, hello)?)? {
        Some(reply) => Ok((stream, reply, pid)),
        None => Err(ChangesError::Engine("the receipt engine closed the connection".into())),
    }
}

/// Starts an engine for `paths` and waits until it listens (it says `ready` on its stdout).
// Blocking by name: under the start lock, under spawn_blocking.
#[allow(clippy::disallowed_methods)]
fn start_engine_blocking(paths: &Paths) -> Result<(), ChangesError> {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let fail = |what: &str, e: std::io::Error| ChangesError::Engine(format!("{what}: {e}"));
    let exe = std::env::current_exe().map_err(|e| fail("cannot find our own program", e))?;
    if exe.file_name().is_none_or(|n| n != "agent-bash") {
        return Err(ChangesError::Engine(format!("{} is not agent-bash", exe.display())));
    }
    let mut cmd = std::process::Command::new(exe);
    cmd.arg(SUBCOMMAND)
        .arg(paths.arg())
        .env_remove(crate::shell::procs::OWNER_VAR)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    // SAFETY: setsid(2) is async-signal-safe; nothing else runs in the hook. The engine leaves
    // the backend's session and process group: it serves other backends too.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    // Not owned: the backend's reaper of adopted children takes its exit status.
    let mut child = cmd.spawn().map_err(|e| fail("cannot start the receipt engine", e))?;
    // It serves other backends and lingers after this one: no shutdown sweep of ours kills it.
    crate::shell::procs::spare(child.id());
    let mut said = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = std::io::BufReader::new(out).read_line(&mut said);
    }
    match said.trim() {
        // `taken`: another engine came first (by name); connecting finds it.
        "ready" | "taken" => Ok(()),
        other => Err(ChangesError::Engine(format!("the receipt engine did not start ({other:?})"))),
    }
}

// ---------------------------------------------------------------------------------------------
// The engine.

/// The project, once the first hello named it.
struct Served {
    receipts: Receipts,
    project: Arc<Project>,
}

/// What the runs of the project did, between snapshots.
#[derive(Default)]
struct Timeline {
    /// The latest snapshot's number and tree.
    seq: u64,
    tree: Option<Arc<Tree>>,
    /// Snapshot number → the paths that changed since the one before (kept while a run that
    /// began before it goes on).
    steps: BTreeMap<u64, Arc<HashSet<Vec<u8>>>>,
    runs: HashMap<u64, Run>,
    /// Connection → its block of slots in the page (see [`super::page`]).
    blocks: HashMap<u64, usize>,
    /// Runs that ended (begin, end), while a run that overlaps them goes on.
    finished: Vec<(u64, u64)>,
    next_run: u64,
}

struct Run {
    begin: u64,
    before: Arc<Tree>,
    conn: u64,
}

impl Timeline {
    /// The paths that changed while another run went on during `begin..=end` (the run itself
    /// is no longer in `runs`).
    fn overlapping(&self, begin: u64, end: u64) -> HashSet<Vec<u8>> {
        let others = self.runs.values().map(|o| (o.begin.max(begin), end));
        let done = self.finished.iter().map(|&(b, e)| (b.max(begin), e.min(end)));
        let mut paths = HashSet::new();
        for (lo, hi) in others.chain(done).filter(|(lo, hi)| lo < hi) {
            for step in self.steps.range(lo + 1..=hi).map(|(_, s)| s) {
                paths.extend(step.iter().cloned());
            }
        }
        paths
    }

    /// Forgets what no run that goes on can overlap.
    fn prune(&mut self) {
        match self.runs.values().map(|r| r.begin).min() {
            None => {
                self.steps.clear();
                self.finished.clear();
            }
            Some(oldest) => {
                self.steps.retain(|&k, _| k > oldest);
                self.finished.retain(|&(_, e)| e > oldest);
            }
        }
    }

    /// A run that ended (or whose backend went away) at snapshot `end`, and the paths that
    /// changed while another run went on during it.
    fn close(&mut self, run: u64, end: u64) -> Option<(Run, HashSet<Vec<u8>>)> {
        let r = self.runs.remove(&run)?;
        let overlap = self.overlapping(r.begin, end);
        self.finished.push((r.begin, end));
        Some((r, overlap))
    }
}

/// The latest snapshot: which one it was in start order, its number, its tree.
type Last = Option<(u64, u64, Arc<Tree>)>;

struct Engine {
    served: tokio::sync::OnceCell<Served>,
    /// Serializes snapshots and keeps the latest.
    snap: tokio::sync::Mutex<Last>,
    started: AtomicU64,
    timeline: Mutex<Timeline>,
    conns: AtomicUsize,
    next_conn: AtomicU64,
    gone: tokio::sync::Notify,
    /// The change counter shared with clients (Linux).
    page: Option<Arc<super::page::Page>>,
}

impl Engine {
    fn timeline(&self) -> std::sync::MutexGuard<'_, Timeline> {
        self.timeline.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A snapshot that started after this call: the latest one when it did, else a new one.
    /// When nothing changed since the latest one (the watch has queued nothing since its drain,
    /// and no snapshot is going on), that one serves as a new one would, without waiting.
    /// `ending`: the run this snapshot ends, which overlaps no run by itself (the paths that
    /// changed are kept for overlaps only while another run goes on).
    async fn fresh(
        &self,
        served: &Served,
        may_defer: bool,
        ending: Option<u64>,
    ) -> Result<(u64, Arc<Tree>), ChangesError> {
        self.fresh_marked(served, may_defer, ending).await.map(|(seq, tree, _)| (seq, tree))
    }

    /// [`Engine::fresh`], with the mark of a quiet project when it was found unchanged.
    async fn fresh_marked(
        &self,
        served: &Served,
        may_defer: bool,
        ending: Option<u64>,
    ) -> Result<(u64, Arc<Tree>, Option<QuietMark>), ChangesError> {
        if let Some(quiet) = self.quiet(served) {
            return Ok(quiet);
        }
        let ticket = self.started.load(Ordering::Acquire);
        let mut last = self.snap.lock().await;
        if let Some((start, seq, tree)) = last.as_ref() {
            if *start > ticket {
                return Ok((*seq, tree.clone(), None));
            }
        }
        let start = self.started.fetch_add(1, Ordering::AcqRel) + 1;
        let tree = served.receipts.snapshot(&served.project, may_defer).await?;
        let (prev, busy) = {
            let mut tl = self.timeline();
            // The timeline gets a new snapshot: marks of the latest one no longer hold (a
            // snapshot that found nothing changed took no lock, and counted nothing), and the
            // claims made before this count are runs begun at the latest one.
            if let Some(page) = &self.page {
                page.bump();
            }
            self.adopt(&mut tl);
            (tl.tree.clone(), tl.runs.keys().any(|&r| Some(r) != ending))
        };
        let step = match prev {
            // Memory only, most paths compared by pointer (the trees share them): no hop to a
            // blocking thread, whose wake-ups cost more under load than the diff itself.
            Some(prev) if busy && !Arc::ptr_eq(&prev, &tree) => {
                store::diff(&prev, &tree).into_iter().map(|d| d.path).collect::<HashSet<_>>()
            }
            _ => HashSet::new(),
        };
        let seq = {
            let mut tl = self.timeline();
            tl.seq += 1;
            let seq = tl.seq;
            if !step.is_empty() {
                tl.steps.insert(seq, Arc::new(step));
            }
            tl.tree = Some(tree.clone());
            seq
        };
        *last = Some((start, seq, tree.clone()));
        Ok((seq, tree, None))
    }

    /// The timeline's latest snapshot (number and tree) when the project is unchanged since,
    /// with its quiet mark (when the engine has a page and the project a watch). The counter is
    /// read first: a snapshot after that, or a new number, counts it up, and the mark no
    /// longer holds.
    fn quiet(&self, served: &Served) -> Option<(u64, Arc<Tree>, Option<QuietMark>)> {
        let gen = self.page.as_ref().map(|p| p.now());
        let q = served.receipts.quiet(&served.project)?;
        let tl = self.timeline();
        // The project's latest tree is the timeline's latest too (not one whose number is
        // still being given).
        if !tl.tree.as_ref().is_some_and(|t| Arc::ptr_eq(t, &q.tree)) {
            return None;
        }
        let seq = tl.seq;
        let mark =
            gen.zip(q.watch).map(|(gen, watch)| QuietMark { gen, watch, files: q.files, seq });
        Some((seq, q.tree, mark))
    }

    async fn begin(&self, conn: u64, paths: Vec<Vec<u8>>) -> Reply {
        let Some(served) = self.served.get() else { return not_introduced() };
        let (seq, tree, quiet) = match self.fresh_marked(served, true, None).await {
            Ok(t) => t,
            Err(e) if e.is_indexing() => return Reply::Indexing { reason: e.to_string() },
            Err(e) => return Reply::Failed { reason: e.to_string() },
        };
        // After a snapshot: quiet now, and that tree still the latest.
        let quiet = quiet.or_else(|| {
            let (_, latest, mark) = self.quiet(served)?;
            mark.filter(|_| Arc::ptr_eq(&latest, &tree))
        });
        let entries = paths.iter().map(|p| tree.get(p).copied()).collect();
        let mut tl = self.timeline();
        let run = tl.next_run;
        tl.next_run += 1;
        tl.runs.insert(run, Run { begin: seq, before: tree, conn });
        Reply::Begun { run, entries, quiet }
    }

    /// A run that ends without a receipt: where it began when its client saw nothing change
    /// during it (so it overlaps no other run), else now (as when its backend goes away).
    fn close(&self, run: u64, quiet: bool) -> Reply {
        let mut tl = self.timeline();
        let Some(begin) = tl.runs.get(&run).map(|r| r.begin) else {
            return Reply::Failed { reason: format!("the receipt engine knows no run {run}") };
        };
        let end = if quiet { begin } else { tl.seq };
        tl.close(run, end);
        tl.prune();
        Reply::Ended { deltas: Vec::new() }
    }

    /// The page and a copy of the watch's descriptor, for [`Ask::Watch`].
    async fn watch(&self) -> (Reply, Vec<std::os::fd::OwnedFd>) {
        let Some(served) = self.served.get() else { return (not_introduced(), Vec::new()) };
        let page = self.page.as_ref().and_then(|p| p.fd().try_clone_to_owned().ok());
        let watch = served.receipts.watch_descriptor(&served.project).await;
        match (page, watch) {
            (Some(page), Some((id, fd))) => (Reply::Watch { watch: id }, vec![page, fd]),
            _ => (Reply::Failed { reason: "the project has no watch".into() }, Vec::new()),
        }
    }

    /// Every claim in the page made at the latest snapshot becomes a run begun there (under
    /// the timeline's lock, before a snapshot is numbered: see [`super::page`]).
    fn adopt(&self, tl: &mut Timeline) {
        let Timeline { seq, tree, blocks, runs, next_run, .. } = tl;
        let (Some(page), Some(tree)) = (self.page.as_ref(), tree.as_ref()) else { return };
        for (&conn, &block) in blocks.iter() {
            let adopted = page.adopt(block, *seq, || {
                *next_run += 1;
                *next_run - 1
            });
            for (_, run) in adopted {
                runs.insert(run, Run { begin: *seq, before: tree.clone(), conn });
            }
        }
    }

    /// [`Ask::EndSlot`]: the run of slot `slot` of `conn`'s block, adopted now if it was not.
    async fn end_slot(&self, conn: u64, slot: usize) -> Reply {
        let run = {
            let mut tl = self.timeline();
            self.adopt(&mut tl);
            let block = tl.blocks.get(&conn).copied();
            let page = self.page.as_ref();
            page.zip(block)
                .filter(|_| slot < super::page::PER_BLOCK)
                .and_then(|(p, b)| p.adopted(b, slot))
        };
        match run {
            Some(run) => self.end(run).await,
            None => {
                Reply::Failed { reason: format!("the receipt engine knows no run in slot {slot}") }
            }
        }
    }

    async fn end(&self, run: u64) -> Reply {
        let Some(served) = self.served.get() else { return not_introduced() };
        let snapshot = self.fresh(served, false, Some(run)).await;
        let mut tl = self.timeline();
        let end = match &snapshot {
            Ok((seq, _)) => *seq,
            Err(_) => tl.seq,
        };
        let Some((r, overlap)) = tl.close(run, end) else {
            return Reply::Failed { reason: format!("the receipt engine knows no run {run}") };
        };
        tl.prune();
        drop(tl);
        let after = match snapshot {
            Ok((_, after)) => after,
            Err(e) => return Reply::Failed { reason: e.to_string() },
        };
        let mut deltas = store::diff(&r.before, &after);
        for d in &mut deltas {
            d.overlap = overlap.contains(&d.path);
        }
        Reply::Ended { deltas }
    }

    /// The first hello names the project; every hello adds the client's own directories.
    async fn hello(&self, conn: u64, ask: Ask) -> Reply {
        let Ask::Hello { root, is_git, settings, state_root, own, proof } = ask else {
            return not_introduced();
        };
        #[cfg(target_os = "linux")]
        if let Some(name) = proof {
            let _ = tokio::task::spawn_blocking(move || named::prove_blocking(&name)).await;
        }
        #[cfg(not(target_os = "linux"))]
        let _ = proof;
        let served = self
            .served
            .get_or_init(|| async {
                let receipts =
                    Receipts::bare(settings, state_root).with_epoch(self.page.clone()).inline();
                let project = receipts.project(&root, is_git);
                Served { receipts, project }
            })
            .await;
        if served.project.git.root != root {
            return Reply::Failed { reason: "the receipt engine serves another project".into() };
        }
        served.receipts.add_own_dirs(own);
        let block = self.page.as_ref().and_then(|_| {
            let mut tl = self.timeline();
            if let Some(&b) = tl.blocks.get(&conn) {
                return Some(b);
            }
            let b = (0..super::page::BLOCKS).find(|b| !tl.blocks.values().any(|u| u == b))?;
            tl.blocks.insert(conn, b);
            Some(b)
        });
        Reply::Hello { shadow: served.project.git.shadow.clone(), pid: std::process::id(), block }
    }

    /// Whether the project's receipts are ready; once they are, with the files of the latest
    /// snapshot. Never waits for a snapshot (see [`Receipts::readiness`]).
    async fn status(&self) -> Reply {
        let Some(served) = self.served.get() else { return not_introduced() };
        let mut readiness = served.receipts.readiness(&served.project).await;
        if let Readiness::Ready { files } = &mut readiness {
            if let Some(tree) = self.timeline().tree.as_ref() {
                *files = Some(tree.entries.len() as u64);
            }
        }
        Reply::Status { readiness }
    }

    /// A backend went away: its runs end now (their changes so far may overlap others'), and
    /// its block of slots is free (a claim it left there is no run).
    fn drop_conn(&self, conn: u64) {
        let mut tl = self.timeline();
        if let (Some(block), Some(page)) = (tl.blocks.remove(&conn), self.page.as_ref()) {
            page.clear(block);
        }
        let now = tl.seq;
        let ids: Vec<u64> =
            tl.runs.iter().filter(|(_, r)| r.conn == conn).map(|(k, _)| *k).collect();
        for id in ids {
            tl.close(id, now);
        }
        tl.prune();
    }
}

fn not_introduced() -> Reply {
    Reply::Failed { reason: "the receipt engine was not told the project".into() }
}

/// A line to send, with descriptors to send along.
type Out = (Vec<u8>, Vec<std::os::fd::OwnedFd>);

/// Sends the start of `line` with `fds` attached (`SCM_RIGHTS`); returns how much was sent.
async fn send_fds(
    write: &tokio::net::unix::OwnedWriteHalf,
    line: &[u8],
    fds: &[std::os::fd::OwnedFd],
) -> std::io::Result<usize> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    use std::os::fd::AsFd;
    let stream: &tokio::net::UnixStream = write.as_ref();
    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    stream
        .async_io(tokio::io::Interest::WRITABLE, || {
            let mut space =
                vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            control.push(SendAncillaryMessage::ScmRights(&borrowed));
            let slice = [std::io::IoSlice::new(line)];
            rustix::net::sendmsg(stream, &slice, &mut control, SendFlags::empty())
                .map_err(std::io::Error::from)
        })
        .await
}

/// The engine's change counter, shared with its clients: none where memfds are not (a client
/// then always asks the engine at the end of a run).
fn new_page() -> Option<Arc<super::page::Page>> {
    #[cfg(target_os = "linux")]
    match super::page::Page::create() {
        Ok(page) => return Some(Arc::new(page)),
        Err(e) => tracing::warn!("receipt engine: no shared page: {e}"),
    }
    None
}

/// Serves one client until it goes away.
async fn serve_conn(engine: Arc<Engine>, stream: tokio::net::UnixStream) {
    let conn = engine.next_conn.fetch_add(1, Ordering::Relaxed);
    let (read, mut write) = stream.into_split();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Out>();
    let writer = tokio::spawn(async move {
        while let Some((line, fds)) = rx.recv().await {
            let sent = match fds.is_empty() {
                true => 0,
                false => match send_fds(&write, &line, &fds).await {
                    Ok(n) => n,
                    Err(_) => break,
                },
            };
            if write.write_all(&line[sent..]).await.is_err() {
                break;
            }
        }
    });
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(req) = serde_json::from_str::<Request>(&line) else { break };
        let (engine, tx) = (engine.clone(), tx.clone());
        let answer = async move {
            let mut fds = Vec::new();
            let reply = match req.ask {
                hello @ Ask::Hello { .. } => engine.hello(conn, hello).await,
                Ask::Begin { paths } => engine.begin(conn, paths).await,
                Ask::End { run } => engine.end(run).await,
                Ask::EndSlot { slot } => engine.end_slot(conn, slot).await,
                Ask::Close { run, quiet } => engine.close(run, quiet),
                Ask::Status => engine.status().await,
                Ask::Watch => {
                    let (reply, sent) = engine.watch().await;
                    fds = sent;
                    reply
                }
            };
            if let Ok(mut out) = serde_json::to_vec(&Response { id: req.id, reply }) {
                out.push(b'\n');
                let _ = tx.send((out, fds));
            }
        };
        tokio::spawn(answer);
    }
    drop(tx);
    let _ = writer.await;
    engine.drop_conn(conn);
    if engine.conns.fetch_sub(1, Ordering::AcqRel) == 1 {
        engine.gone.notify_waiters();
    }
}

/// How an engine listens: by name (nothing to clean up), or on a socket file it owns.
enum Listening {
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    Named,
    /// `_lock`: held for the engine's life.
    File { _lock: std::fs::File, ours: SocketId },
}

/// Runs an engine reached by `arg` ([`Paths::arg`]) until it has had no client for
/// [`LINGER`]. Returns the exit status.
pub async fn serve(arg: std::ffi::OsString) -> i32 {
    let paths = Paths::from_arg(&arg);
    let p = paths.clone();
    let up = match tokio::task::spawn_blocking(move || listen_any_blocking(&p)).await {
        Ok(Ok(Some(up))) => up,
        Ok(Ok(None)) => {
            // Another engine holds the name: the client that started us connects to it.
            say(b"taken\n");
            return 0;
        }
        Ok(Err(e)) => {
            tracing::warn!(engine = %paths.shown(), "receipt engine: cannot listen: {e}");
            return 1;
        }
        Err(_) => return 1,
    };
    let (listener, how) = up;
    let listener = match listener
        .set_nonblocking(true)
        .and_then(|()| tokio::net::UnixListener::from_std(listener))
    {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(engine = %paths.shown(), "receipt engine: cannot listen: {e}");
            return 1;
        }
    };
    say(b"ready\n");
    let engine = Arc::new(Engine {
        served: tokio::sync::OnceCell::new(),
        snap: tokio::sync::Mutex::new(None),
        started: AtomicU64::new(0),
        timeline: Mutex::new(Timeline::default()),
        conns: AtomicUsize::new(0),
        next_conn: AtomicU64::new(1),
        gone: tokio::sync::Notify::new(),
        page: new_page(),
    });
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                // Only the user's own processes are served (an abstract name has no file
                // permissions; another user's connection is closed unanswered).
                match stream.peer_cred() {
                    Ok(c) if c.uid() == our_uid() => {}
                    other => {
                        tracing::warn!("receipt engine: refused a connection of {other:?}");
                        continue;
                    }
                }
                engine.conns.fetch_add(1, Ordering::AcqRel);
                tokio::spawn(serve_conn(engine.clone(), stream));
            }
            () = idle(&engine) => {
                let leaving = match &how {
                    Listening::Named => true,
                    Listening::File { ours, .. } => leave(&engine, &paths, *ours),
                };
                if leaving {
                    break;
                }
            }
        }
    }
    tracing::debug!(engine = %paths.shown(), "receipt engine: no client left, exiting");
    drop(how);
    0
}

/// Listens by name or on the socket file; `None`: another engine holds the name.
fn listen_any_blocking(
    paths: &Paths,
) -> std::io::Result<Option<(std::os::unix::net::UnixListener, Listening)>> {
    match paths {
        #[cfg(target_os = "linux")]
        Paths::Named(name) => Ok(named::listen_blocking(name)?.map(|l| (l, Listening::Named))),
        #[cfg(not(target_os = "linux"))]
        Paths::Named(_) => Err(std::io::Error::other("no abstract sockets here")),
        Paths::Files { socket, lock, .. } => {
            let (lock, listener, ours) = listen_blocking(socket, lock)?;
            Ok(Some((listener, Listening::File { _lock: lock, ours })))
        }
    }
}

/// Takes the engine's lock (an engine on its way out still holds it for a moment) and writes
/// our pid in it, removes a socket a killed engine left (nobody answers it), and listens.
// Blocking by name: under spawn_blocking, once, at the engine's start.
#[allow(clippy::disallowed_methods)]
fn listen_blocking(
    socket: &Path,
    lock: &Path,
) -> std::io::Result<(std::fs::File, std::os::unix::net::UnixListener, SocketId)> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let lock = flock_blocking(lock, true)?
        .ok_or_else(|| std::io::Error::other("the engine's lock is taken"))?;
    lock.set_len(0)?;
    (&lock).write_all(format!("{}\n", std::process::id()).as_bytes())?;
    let _ = std::fs::remove_file(socket);
    let listener = std::os::unix::net::UnixListener::bind(socket)?;
    // Private whatever the umask (contract §13), like every file of ours.
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
    let ours = socket_id(socket).ok_or_else(|| std::io::Error::other("the socket went"))?;
    Ok((lock, listener, ours))
}

/// A socket file's identity (device, inode): an engine leaves only the socket it made.
type SocketId = (u64, u64);

#[allow(clippy::disallowed_methods)] // one stat, under spawn_blocking or at exit
fn socket_id(socket: &Path) -> Option<SocketId> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(socket).ok().map(|m| (m.dev(), m.ino()))
}

/// Says `ready` (or `taken`) to the backend that started us, then lets go of its pipe.
#[allow(clippy::disallowed_methods)] // once, at the engine's start
fn say(what: &[u8]) {
    use std::io::Write;
    let mut out = std::io::stdout();
    let _ = out.write_all(what);
    let _ = out.flush();
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        // SAFETY: dup2 onto our own stdout.
        unsafe { libc::dup2(null.as_raw_fd(), 1) };
    }
}

/// Returns once no client has been connected for [`LINGER`].
async fn idle(engine: &Engine) {
    loop {
        let notified = engine.gone.notified();
        if engine.conns.load(Ordering::Acquire) == 0 {
            tokio::time::sleep(LINGER).await;
            if engine.conns.load(Ordering::Acquire) == 0 {
                return;
            }
        } else {
            notified.await;
        }
    }
}

/// Under the start lock (no client between connecting and its hello's answer), with still no
/// client: removes the socket. `false`: someone is connecting, stay. An engine whose socket is
/// no longer the one it made (its folder removed with the runtime base or a test's temporary
/// folder, or the socket replaced by a client that found it stopped) can never be reached
/// again: it leaves at once, touching nothing (it stayed for good before, one process per
/// removed folder).
#[allow(clippy::disallowed_methods)] // a non-blocking flock and an unlink, at exit
fn leave(engine: &Engine, paths: &Paths, ours: SocketId) -> bool {
    let Paths::Files { socket, start, .. } = paths else { return true };
    if socket_id(socket) != Some(ours) {
        return true;
    }
    let Ok(Some(_start)) = flock_blocking(start, false) else { return false };
    if engine.conns.load(Ordering::Acquire) != 0 {
        return false;
    }
    let _ = std::fs::remove_file(socket);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(begin: u64) -> Run {
        Run { begin, before: Arc::default(), conn: 1 }
    }

    fn step(paths: &[&str]) -> Arc<HashSet<Vec<u8>>> {
        Arc::new(paths.iter().map(|p| p.as_bytes().to_vec()).collect())
    }

    #[test]
    fn overlap_is_what_changed_while_another_run_went_on() {
        let mut tl = Timeline::default();
        // Run 1 from snapshot 1, run 2 from snapshot 2; steps 2, 3 and 4 changed a, s and b.
        tl.runs.insert(1, run(1));
        tl.runs.insert(2, run(2));
        tl.steps.insert(2, step(&["a"]));
        tl.steps.insert(3, step(&["s"]));
        tl.steps.insert(4, step(&["b"]));
        // Run 1 ends at 3: only s changed while both went on.
        assert_eq!(tl.close(1, 3).unwrap().1, *step(&["s"]));
        // Run 2 ends at 4: s again (run 1 is finished but overlapped it), not b.
        assert_eq!(tl.close(2, 4).unwrap().1, *step(&["s"]));
        tl.prune();
        assert!(tl.steps.is_empty() && tl.finished.is_empty());
    }

    #[test]
    fn runs_that_meet_at_one_snapshot_do_not_overlap() {
        let mut tl = Timeline::default();
        tl.runs.insert(1, run(1));
        tl.steps.insert(2, step(&["a"]));
        tl.close(1, 2);
        tl.runs.insert(2, run(2));
        tl.steps.insert(3, step(&["b"]));
        assert!(tl.close(2, 3).unwrap().1.is_empty());
    }
}
