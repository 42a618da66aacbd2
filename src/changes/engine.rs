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
use super::{ChangesError, ChangesSettings, Project, Receipts};

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

#[derive(Debug, Serialize, Deserialize)]
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
    },
    /// A run begins: its first snapshot. `paths`: their entries in it are answered (undo's
    /// check of what changed since).
    Begin { paths: Vec<Vec<u8>> },
    /// The run ends: its receipt.
    End { run: u64 },
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
    },
    Begun {
        run: u64,
        entries: Vec<Option<Entry>>,
    },
    Ended {
        deltas: Vec<Delta>,
    },
    /// No receipt, and why (the text of `changes_unavailable`).
    Failed {
        reason: String,
    },
}

/// Where the engines of this user live: a private directory of the runtime base.
#[derive(Debug, Clone)]
pub struct Spot {
    pub dir: PathBuf,
}

/// The files of one engine: its socket, its lock (held for its life), the start lock.
#[derive(Debug, Clone)]
pub struct Paths {
    pub socket: PathBuf,
    pub lock: PathBuf,
    pub start: PathBuf,
}

impl Paths {
    /// The lock and start files beside a socket `<dir>/<key>.sock`.
    pub fn of_socket(socket: &Path) -> Paths {
        Paths {
            socket: socket.to_path_buf(),
            lock: socket.with_extension("lock"),
            start: socket.with_extension("start"),
        }
    }
}

impl Spot {
    /// `<base>/agent-bash.engines-<uid>` (not `agent-bash-…`, the prefix of the backends' runtime
    /// directories, which sweeps remove), created private; `None` (the private path) when it
    /// is not ours alone (another user's, a link, wider than 0700) or cannot be made.
    // At start-up (`Runtime::new`): one directory, made once.
    #[allow(clippy::disallowed_methods)]
    pub fn at(base: &Path) -> Option<Spot> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        // SAFETY: geteuid cannot fail.
        let uid = unsafe { libc::geteuid() };
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
        Some(Spot { dir })
    }

    /// The engine files of a project under given settings (different settings: another engine).
    pub fn paths(&self, root: &Path, settings: &ChangesSettings) -> Option<Paths> {
        use std::os::unix::ffi::OsStrExt;
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let text = serde_json::to_vec(settings).ok()?;
        for &b in root.as_os_str().as_bytes().iter().chain(b"\0").chain(&text) {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        let socket = self.dir.join(format!("{hash:016x}.sock"));
        // sun_path holds 108 bytes with its NUL.
        (socket.as_os_str().len() < 100).then(|| Paths::of_socket(&socket))
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
}

impl Link {
    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Connects to the engine of `paths` (starting one when none answers) and says hello.
    pub async fn open(paths: Paths, hello: Ask) -> Result<Arc<Link>, ChangesError> {
        let line = serde_json::to_vec(&Request { id: 0, ask: hello })
            .map_err(|e| ChangesError::Engine(format!("cannot say hello: {e}")))?;
        let (stream, reply) =
            tokio::task::spawn_blocking(move || connect_blocking(&paths, &line)).await??;
        let (shadow, pid) = match reply {
            Reply::Hello { shadow, pid } => (shadow, pid),
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
        });
        let (pending, alive) = (link.pending.clone(), link.alive.clone());
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
        });
        Ok(link)
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

/// Under the start lock: connects (starting an engine when none answers) and says hello.
// Blocking by name: runs under spawn_blocking (`Link::open`).
#[allow(clippy::disallowed_methods)]
fn connect_blocking(
    paths: &Paths,
    hello: &[u8],
) -> Result<(std::os::unix::net::UnixStream, Reply), ChangesError> {
    use std::io::{BufRead, Write};
    use std::os::unix::net::UnixStream;
    let fail = |what: &str, e: std::io::Error| ChangesError::Engine(format!("{what}: {e}"));
    let _start =
        flock_blocking(&paths.start, true).map_err(|e| fail("cannot take the start lock", e))?;
    let stream = match UnixStream::connect(&paths.socket) {
        Ok(s) => s,
        Err(_) => {
            start_engine_blocking(paths)?;
            UnixStream::connect(&paths.socket)
                .map_err(|e| fail("cannot reach the new engine", e))?
        }
    };
    stream.set_read_timeout(Some(HELLO_WAIT)).map_err(|e| fail("socket", e))?;
    let mut line = hello.to_vec();
    line.push(b'\n');
    (&stream).write_all(&line).map_err(|e| fail("cannot say hello", e))?;
    let mut answer = String::new();
    std::io::BufReader::new(&stream)
        .read_line(&mut answer)
        .map_err(|e| fail("no answer to hello", e))?;
    let r: Response = serde_json::from_str(&answer)
        .map_err(|e| ChangesError::Engine(format!("bad answer to hello {answer:?}: {e}")))?;
    stream.set_read_timeout(None).map_err(|e| fail("socket", e))?;
    Ok((stream, r.reply))
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
        .arg(&paths.socket)
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
    let mut said = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = std::io::BufReader::new(out).read_line(&mut said);
    }
    match said.trim() {
        "ready" => Ok(()),
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
}

impl Engine {
    fn timeline(&self) -> std::sync::MutexGuard<'_, Timeline> {
        self.timeline.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A snapshot that started after this call: the latest one when it did, else a new one.
    async fn fresh(
        &self,
        served: &Served,
        may_defer: bool,
    ) -> Result<(u64, Arc<Tree>), ChangesError> {
        let ticket = self.started.load(Ordering::Acquire);
        let mut last = self.snap.lock().await;
        if let Some((start, seq, tree)) = last.as_ref() {
            if *start > ticket {
                return Ok((*seq, tree.clone()));
            }
        }
        let start = self.started.fetch_add(1, Ordering::AcqRel) + 1;
        let (held, tree) = served.receipts.snapshot(&served.project, may_defer).await?;
        drop(held);
        let (prev, busy) = {
            let tl = self.timeline();
            (tl.tree.clone(), !tl.runs.is_empty())
        };
        let step = match prev {
            Some(prev) if busy && !Arc::ptr_eq(&prev, &tree) => {
                let t = tree.clone();
                tokio::task::spawn_blocking(move || {
                    store::diff(&prev, &t).into_iter().map(|d| d.path).collect::<HashSet<_>>()
                })
                .await?
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
        Ok((seq, tree))
    }

    async fn begin(&self, conn: u64, paths: Vec<Vec<u8>>) -> Reply {
        let Some(served) = self.served.get() else { return not_introduced() };
        let (seq, tree) = match self.fresh(served, true).await {
            Ok(t) => t,
            Err(e) => return Reply::Failed { reason: e.to_string() },
        };
        let entries = paths.iter().map(|p| tree.get(p).copied()).collect();
        let mut tl = self.timeline();
        let run = tl.next_run;
        tl.next_run += 1;
        tl.runs.insert(run, Run { begin: seq, before: tree, conn });
        Reply::Begun { run, entries }
    }

    async fn end(&self, run: u64) -> Reply {
        let Some(served) = self.served.get() else { return not_introduced() };
        let snapshot = self.fresh(served, false).await;
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
    async fn hello(&self, ask: Ask) -> Reply {
        let Ask::Hello { root, is_git, settings, state_root, own } = ask else {
            return not_introduced();
        };
        let served = self
            .served
            .get_or_init(|| async {
                let receipts = Receipts::bare(settings, state_root);
                let project = receipts.project(&root, is_git);
                Served { receipts, project }
            })
            .await;
        if served.project.git.root != root {
            return Reply::Failed { reason: "the receipt engine serves another project".into() };
        }
        served.receipts.add_own_dirs(own);
        Reply::Hello { shadow: served.project.git.shadow.clone(), pid: std::process::id() }
    }

    /// A backend went away: its runs end now (their changes so far may overlap others').
    fn drop_conn(&self, conn: u64) {
        let mut tl = self.timeline();
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

/// Serves one client until it goes away.
async fn serve_conn(engine: Arc<Engine>, stream: tokio::net::UnixStream) {
    let conn = engine.next_conn.fetch_add(1, Ordering::Relaxed);
    let (read, mut write) = stream.into_split();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(async move {
        while let Some(line) = rx.recv().await {
            if write.write_all(&line).await.is_err() {
                break;
            }
        }
    });
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(req) = serde_json::from_str::<Request>(&line) else { break };
        let (engine, tx) = (engine.clone(), tx.clone());
        let answer = async move {
            let reply = match req.ask {
                hello @ Ask::Hello { .. } => engine.hello(hello).await,
                Ask::Begin { paths } => engine.begin(conn, paths).await,
                Ask::End { run } => engine.end(run).await,
            };
            if let Ok(mut out) = serde_json::to_vec(&Response { id: req.id, reply }) {
                out.push(b'\n');
                let _ = tx.send(out);
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

/// Runs an engine on `socket` until it has had no client for [`LINGER`]. Returns the exit
/// status.
pub async fn serve(socket: PathBuf) -> i32 {
    let paths = Paths::of_socket(&socket);
    let p = paths.clone();
    let (lock, listener, ours) = match tokio::task::spawn_blocking(move || listen_blocking(&p))
        .await
    {
        Ok(Ok(up)) => up,
        Ok(Err(e)) => {
            tracing::warn!(socket = %paths.socket.display(), "receipt engine: cannot listen: {e}");
            return 1;
        }
        Err(_) => return 1,
    };
    let listener = match listener
        .set_nonblocking(true)
        .and_then(|()| tokio::net::UnixListener::from_std(listener))
    {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(socket = %paths.socket.display(), "receipt engine: cannot listen: {e}");
            return 1;
        }
    };
    say_ready();
    let engine = Arc::new(Engine {
        served: tokio::sync::OnceCell::new(),
        snap: tokio::sync::Mutex::new(None),
        started: AtomicU64::new(0),
        timeline: Mutex::new(Timeline::default()),
        conns: AtomicUsize::new(0),
        next_conn: AtomicU64::new(1),
        gone: tokio::sync::Notify::new(),
    });
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                engine.conns.fetch_add(1, Ordering::AcqRel);
                tokio::spawn(serve_conn(engine.clone(), stream));
            }
            () = idle(&engine) => {
                if leave(&engine, &paths, ours) {
                    break;
                }
            }
        }
    }
    tracing::debug!(socket = %paths.socket.display(), "receipt engine: no client left, exiting");
    drop(lock);
    0
}

/// Takes the engine's lock (an engine on its way out still holds it for a moment) and writes
/// our pid in it, removes a socket a killed engine left (nobody answers it), and listens.
// Blocking by name: under spawn_blocking, once, at the engine's start.
#[allow(clippy::disallowed_methods)]
fn listen_blocking(
    paths: &Paths,
) -> std::io::Result<(std::fs::File, std::os::unix::net::UnixListener, SocketId)> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let lock = flock_blocking(&paths.lock, true)?
        .ok_or_else(|| std::io::Error::other("the engine's lock is taken"))?;
    lock.set_len(0)?;
    (&lock).write_all(format!("{}\n", std::process::id()).as_bytes())?;
    let _ = std::fs::remove_file(&paths.socket);
    let listener = std::os::unix::net::UnixListener::bind(&paths.socket)?;
    // Private whatever the umask (contract §13), like every file of ours.
    std::fs::set_permissions(&paths.socket, std::fs::Permissions::from_mode(0o600))?;
    let ours = socket_id(&paths.socket).ok_or_else(|| std::io::Error::other("the socket went"))?;
    Ok((lock, listener, ours))
}

/// A socket file's identity (device, inode): an engine leaves only the socket it made.
type SocketId = (u64, u64);

#[allow(clippy::disallowed_methods)] // one stat, under spawn_blocking or at exit
fn socket_id(socket: &Path) -> Option<SocketId> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(socket).ok().map(|m| (m.dev(), m.ino()))
}

/// Says `ready` to the backend that started us, then lets go of its pipe.
#[allow(clippy::disallowed_methods)] // once, at the engine's start
fn say_ready() {
    use std::io::Write;
    let mut out = std::io::stdout();
    let _ = out.write_all(b"ready\n");
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
    if socket_id(&paths.socket) != Some(ours) {
        return true;
    }
    let Ok(Some(_start)) = flock_blocking(&paths.start, false) else { return false };
    if engine.conns.load(Ordering::Acquire) != 0 {
        return false;
    }
    let _ = std::fs::remove_file(&paths.socket);
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
