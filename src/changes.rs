//! contract §13: what a command did to the project's files (change receipts) and undo.
//!
//! Around every run the runtime takes a snapshot of the project's non-ignored files before and
//! after ([`Receipts::begin`], [`Receipts::finish`]) in a shadow git store of its own
//! ([`store`]), and reports the paths that differ: `changes: [{path, kind}]` (at most
//! [`MAX_REPORTED`]), `changes_count`, and `changes_id`, the id [`Receipts::undo`] takes.
//!
//! Cost is bounded per project: a snapshot over `changes.max_snapshot_ms`, or a tree over
//! `changes.max_files` / `changes.max_bytes`, turns receipts off for that project until the
//! backend restarts, and every later result says why (`changes_unavailable`). The first
//! snapshot of a project hashes every file; when it takes longer than the budget it goes on in
//! the background (results say so meanwhile) and receipts start once it is done.
//!
//! Overlapping runs in one project: snapshots are serialized by a per-project lock (and a lock
//! file shared with other agent-bash processes), and each run reports every change made in the
//! project between its two snapshots, whoever made it: a run that overlaps another also lists
//! the other's changes, and undoing it puts those back too (only where they are still as its
//! end snapshot saw them).

// Every function of `store` blocks; they are only called under `spawn_blocking`.
pub mod error;
pub mod store;
// The same: only called under `spawn_blocking`.
pub mod watch;
// The same: snapshots of files changed in place, without `git add`.
pub mod quick;

pub mod first;

pub mod page;
// The shared receipt engine (a process of its own) and backends' connections to it.
pub mod engine;
// Whether a project's receipts are ready, and how far its first snapshot has got.
pub mod status;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;
use tokio::sync::OwnedMutexGuard;

pub use error::ChangesError;
pub use status::{Hashed, ProjectStatus, Readiness};
use store::{Delta, Entry, Git, Tree};

/// Changed paths a result lists; `changes_count` has the total.
pub const MAX_REPORTED: usize = 200;
/// Names in the model's one-line note.
pub const NOTE_NAMES: usize = 20;
/// Runs with changes kept for undo and diff (the oldest are forgotten first).
pub const KEEP_RECORDS: usize = 1000;
/// `changes.max_files` by default: large monorepos keep their receipts.
pub const DEFAULT_MAX_FILES: u64 = 500_000;
/// The longest a first snapshot may go on in the background.
pub const FIRST_SNAPSHOT_MAX: Duration = Duration::from_secs(120);
/// How long a status request waits for a project whose snapshot is being taken (then: busy).
const STATUS_WAIT: Duration = Duration::from_millis(100);

/// `[changes]` settings.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ChangesSettings {
    /// Change receipts (and so undo) for tool calls and bang commands. Default true.
    pub enabled: bool,
    /// A project with more non-ignored files gets no receipts. Default [`DEFAULT_MAX_FILES`].
    pub max_files: u64,
    /// A project whose non-ignored files hold more bytes gets no receipts. Default 2 GiB.
    pub max_bytes: u64,
    /// A snapshot that takes longer turns receipts off for the project. Default 200.
    pub max_snapshot_ms: u64,
    /// The git program. Default: `git` on `PATH`.
    pub git: Option<PathBuf>,
    /// Watch the project's folders (inotify) so that a snapshot re-reads only what changed.
    /// Default true; turn off on network filesystems changed from other machines.
    pub watch: bool,
}

impl Default for ChangesSettings {
    fn default() -> Self {
        ChangesSettings {
            enabled: true,
            max_files: DEFAULT_MAX_FILES,
            max_bytes: 2 << 30,
            max_snapshot_ms: 200,
            git: None,
            watch: true,
        }
    }
}

impl ChangesSettings {
    pub fn check(&self) -> crate::Result<()> {
        if self.max_snapshot_ms == 0 || self.max_files == 0 {
            return Err(crate::Error::InvalidInput(
                "changes.max_snapshot_ms and changes.max_files must be at least 1".into(),
            ));
        }
        Ok(())
    }

    fn budget(&self) -> Duration {
        Duration::from_millis(self.max_snapshot_ms)
    }
}

/// What happened to one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Added,
    Modified,
    Deleted,
    /// Only the mode changed (the executable bit).
    Mode,
}

impl Kind {
    /// The letter of the model's note: `A`, `M`, `D`, and `X` for a mode change.
    pub fn letter(self) -> char {
        match self {
            Kind::Added => 'A',
            Kind::Modified => 'M',
            Kind::Deleted => 'D',
            Kind::Mode => 'X',
        }
    }

    fn of(d: &Delta) -> Kind {
        match (&d.before, &d.after) {
            (None, _) => Kind::Added,
            (_, None) => Kind::Deleted,
            (Some(b), Some(a)) if b.oid == a.oid && is_file(b.mode) && is_file(a.mode) => {
                Kind::Mode
            }
            _ => Kind::Modified,
        }
    }
}

fn is_file(mode: u32) -> bool {
    mode == 0o100644 || mode == 0o100755
}

/// One changed path, relative to the project root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    pub path: String,
    pub kind: Kind,
    /// It changed while another run in the project went on too: either may have changed it
    /// (absent when false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub overlap: bool,
}

impl Change {
    fn of(d: &Delta) -> Change {
        Change {
            path: String::from_utf8_lossy(&d.path).into_owned(),
            kind: Kind::of(d),
            overlap: d.overlap,
        }
    }
}

/// `M src/a.rs, A notes.txt, D old.txt`: at most [`NOTE_NAMES`] names, then ` and <N> more`
/// (the model's note, `crate::result`, and the undo's output list them so).
pub fn names(changes: &[Change], total: usize) -> String {
    let names: Vec<String> = changes
        .iter()
        .take(NOTE_NAMES)
        .map(|c| format!("{} {}", c.kind.letter(), c.path))
        .collect();
    let shown = names.len();
    let mut text = names.join(", ");
    if total > shown {
        text.push_str(&format!(" and {} more", total - shown));
    }
    text
}

/// What a run did to its project's files, as the result carries it (contract §13): the result
/// sets its `changes*` fields from it and writes the model's note
/// (`crate::result::BashResult::set_receipt`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Receipt {
    /// Receipts are off (or the run was blocked): the result says nothing of changes.
    #[default]
    Off,
    /// No receipt for this run, and why (`changes_unavailable`).
    Unavailable(String),
    /// No receipt: the first snapshot of the project at `root` is being taken (`reason` says
    /// how far it has got).
    Indexing { root: PathBuf, reason: String },
    /// The changed paths (at most [`MAX_REPORTED`]), how many changed, and the id `undo` takes
    /// (present when something changed).
    Taken { changes: Vec<Change>, count: usize, id: Option<u64> },
}

/// A run whose changes can be undone and shown.
#[derive(Debug)]
pub struct Record {
    pub id: u64,
    pub command: String,
    pub root: PathBuf,
    /// Every changed path (not only the reported ones), with its state before and after.
    pub deltas: Vec<Delta>,
    source: Source,
}

/// Who took a record's snapshots: this backend, or the project's shared engine.
#[derive(Debug, Clone)]
enum Source {
    Local(Arc<Project>),
    Shared(Arc<engine::Link>, Git),
}

impl Source {
    fn git(&self) -> &Git {
        match self {
            Source::Local(p) => &p.git,
            Source::Shared(_, git) => git,
        }
    }
}

impl Record {
    pub fn changes(&self) -> Vec<Change> {
        self.deltas.iter().map(Change::of).collect()
    }
}

/// The receipt of a run in progress.
#[derive(Debug)]
pub enum Begin {
    /// Receipts are turned off, or the command will not run.
    Off,
    Unavailable(String),
    /// The project's first snapshot is being taken (see [`Receipt::Indexing`]).
    Indexing {
        root: PathBuf,
        reason: String,
    },
    Taken {
        project: Arc<Project>,
        before: Arc<Tree>,
    },
    /// The project's shared engine holds the run.
    Shared {
        open: OpenRun,
        git: Git,
        quiet: Option<engine::QuietMark>,
    },
}

/// A run open in a shared engine (`run`, its id there). Dropped before its end was answered (a
/// warm-up's snapshot, a command that failed or a call cancelled while it ran), it is closed
/// then, overlapping what changed meanwhile: an engine that kept it going would mark every
/// later change in the project as overlapping it, and undo would refuse them all.
#[derive(Debug)]
pub struct OpenRun {
    link: Arc<engine::Link>,
    run: RunId,
    open: bool,
}

/// How a run is known to its engine: by the id it answered, or by the slot this backend claimed
/// without asking (see [`page`]).
#[derive(Debug, Clone)]
enum RunId {
    Asked(u64),
    Claimed(engine::Claim),
}

impl OpenRun {
    /// Its end was answered (or told): nothing to close when dropped.
    fn ended(mut self) {
        self.open = false;
    }

    /// Nothing changed during the run (its mark still holds): the engine is told without
    /// waiting (after this task has given its result on: the write wakes the engine), or, for a
    /// claim it never adopted, not at all.
    fn end_quiet(self) {
        self.close(true);
        self.ended();
    }

    /// Ends the run without a receipt: where it began when `quiet`, else now.
    fn close(&self, quiet: bool) {
        match &self.run {
            RunId::Asked(run) => {
                let (link, run) = (self.link.clone(), *run);
                tokio::spawn(async move { link.close(run, quiet).await });
            }
            RunId::Claimed(claim) => self.link.let_go(claim, quiet),
        }
    }

    /// The run's receipt, from its engine.
    async fn end(self) -> Result<Vec<Delta>, ChangesError> {
        let link = self.link.clone();
        match self.run.clone() {
            // Dropped while waiting (a cancelled call), the guard still closes the run.
            RunId::Asked(run) => {
                let ended = end_shared(&link, run).await;
                self.ended();
                ended
            }
            // The end goes on when dropped (see [`engine::Link::end_claim`]).
            RunId::Claimed(claim) => {
                self.ended();
                deltas_of(link.end_claim(claim).await?)
            }
        }
    }
}

impl Drop for OpenRun {
    fn drop(&mut self) {
        if self.open && tokio::runtime::Handle::try_current().is_ok() {
            self.close(false);
        }
    }
}

/// Why an undo did not happen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UndoError {
    /// Nothing to undo (no such id, or no run with changes yet).
    NotFound(String),
    /// Files the run changed were changed again since, or a symbolic link (or a file) now
    /// stands where the run left a folder (`links`, also in `paths`): nothing was touched.
    Conflict {
        id: u64,
        paths: Vec<String>,
        links: Vec<String>,
    },
    /// The run overlapped another run in the project, and these files changed while both went
    /// on: either may have changed them, so undo cannot tell whose change it would take back.
    Ambiguous {
        id: u64,
        paths: Vec<String>,
    },
    Failed(String),
}

impl std::fmt::Display for UndoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UndoError::NotFound(m) | UndoError::Failed(m) => f.write_str(m),
            UndoError::Conflict { id, paths, links } if !links.is_empty() => {
                write!(
                    f,
                    "Not undone: {} {} now a symbolic link (or a file) where run {id} left a folder, and undo never writes through one",
                    links.join(", "),
                    if links.len() == 1 { "is" } else { "are" },
                )?;
                let others: Vec<&str> =
                    paths.iter().filter(|p| !links.contains(p)).map(String::as_str).collect();
                match others.is_empty() {
                    true => Ok(()),
                    false => write!(f, "; changed since: {}", others.join(", ")),
                }
            }
            UndoError::Conflict { id, paths, .. } => write!(
                f,
                "Not undone: {} changed since run {id}: {}",
                if paths.len() == 1 { "this file" } else { "these files" },
                paths.join(", ")
            ),
            UndoError::Ambiguous { id, paths } => write!(
                f,
                "Not undone: run {id} overlapped another run in this project, and {} changed while both ran, so either may have changed {}: {}",
                if paths.len() == 1 { "this file" } else { "these files" },
                if paths.len() == 1 { "it" } else { "them" },
                paths.join(", ")
            ),
        }
    }
}

impl std::error::Error for UndoError {}

/// A done undo: itself a recorded run (`changes_id`) that can be undone.
#[derive(Debug, Clone, Serialize)]
pub struct UndoResult {
    /// The run that was undone.
    pub undone: u64,
    /// `Undid run 3 ($ cmd): M a.txt, D b.txt`.
    pub output: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changes_id: Option<u64>,
    pub changes: Vec<Change>,
    pub changes_count: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changes_unavailable: Option<String>,
}

/// One project (a root) and its shadow store.
#[derive(Debug)]
pub struct Project {
    git: Git,
    is_git: bool,
    state: Arc<tokio::sync::Mutex<State>>,
    /// A first snapshot is going on in the background: no need to wait for the lock.
    indexing: AtomicBool,
    /// How far the first snapshot has got.
    progress: Arc<status::Progress>,
}

#[derive(Debug, Default)]
struct State {
    /// The store exists and the user's ignore settings were read.
    init: bool,
    /// A snapshot was taken: the index holds every file's stat data.
    ready: bool,
    /// Why receipts are off for this project (for good, until the backend restarts).
    off: Option<String>,
    project_exclude: Option<PathBuf>,
    /// The user's `core.excludesFile`, and its content when last seen.
    excludes_file: Option<PathBuf>,
    excludes_seen: Option<Vec<u8>>,
    /// The two ignore files as they were when last read, and which of our own directories
    /// were known then: while all three stay so, the store's excludes are up to date.
    stamps: Option<(Stamp, Stamp, u64)>,
    tracker: Tracker,
}

/// A file's identity and times, for telling "unchanged" without reading it (`Racy`, never
/// equal to anything: it was changed so recently that a change within the same clock tick
/// would leave the same stamp; `Missing`: no such file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum Stamp {
    Missing,
    Racy,
    Seen { dev: u64, ino: u64, size: u64, mtime: (i64, i64), ctime: (i64, i64) },
}

impl Stamp {
    /// `path`'s stamp now (one `stat`). File times come from the kernel's coarse clock, read
    /// here first: a file changed at or after that instant may change again with the same
    /// times, so it is `Racy`.
    // The stat fields' types differ per platform (i32 or u64, u64 or i64).
    #[allow(clippy::unnecessary_cast)]
    fn of(path: Option<&Path>) -> Stamp {
        let Some(path) = path else { return Stamp::Missing };
        let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: an out-parameter of ours.
        unsafe { libc::clock_gettime(quick::FS_CLOCK, &mut now) };
        let now = (now.tv_sec, now.tv_nsec);
        match rustix::fs::stat(path) {
            Err(_) => Stamp::Missing,
            Ok(st) => {
                let mtime = (st.st_mtime, st.st_mtime_nsec as i64);
                let ctime = (st.st_ctime, st.st_ctime_nsec as i64);
                if mtime >= now || ctime >= now {
                    return Stamp::Racy;
                }
                Stamp::Seen {
                    dev: st.st_dev as u64,
                    ino: st.st_ino,
                    size: st.st_size as u64,
                    mtime,
                    ctime,
                }
            }
        }
    }

    fn same(&self, other: &Stamp) -> bool {
        *self != Stamp::Racy && self == other
    }
}

/// A project found unchanged: its latest tree, the watch whose empty queue said so, and the
/// ignore files outside the tree with the stamps they had then.
struct Quiet {
    tree: Arc<Tree>,
    watch: Option<u64>,
    files: Vec<(Option<PathBuf>, Stamp)>,
}

/// What the project's watch says about the latest snapshot.
#[derive(Debug, Default)]
struct Tracker {
    watch: Option<watch::Watch>,
    /// Why the project has no watch (full snapshots), once it was given up.
    off: Option<String>,
    /// The latest snapshot, while no change outside what the watch reports can have happened.
    last: Option<Arc<Tree>>,
    /// The ignore rules changed: the watch starts again.
    stale: bool,
    /// Folders whose files [`quick`] read since the last `git add`: the store's index is older
    /// than the tree there, so the next `git add` re-reads them too.
    unsynced: BTreeSet<Vec<u8>>,
}

impl Tracker {
    /// The latest snapshot, when the watch has queued nothing since it was taken: nothing
    /// changed (no blocking call; the queue is left for the next [`Tracker::plan`]).
    fn quiet(&self) -> Option<Arc<Tree>> {
        if self.stale || self.off.is_some() {
            return None;
        }
        let last = self.last.as_ref()?;
        self.watch.as_ref().filter(|w| w.quiet()).map(|_| last.clone())
    }
}

/// How the next snapshot is taken.
enum Plan {
    /// Nothing changed since the latest one.
    Reuse(Arc<Tree>),
    /// Taken here, without `git add` ([`quick`]).
    Done(Arc<Tree>),
    /// `git add` of these path specs only.
    Paths(Vec<std::ffi::OsString>),
    Full,
}

impl Tracker {
    /// Reads the watch's queue and says what the snapshot must re-read (blocking). Starts the
    /// watch when there is none (before the full snapshot, so nothing is missed after it).
    fn plan(&mut self, git: &Git, enabled: bool, budget: &Arc<watch::Budget>) -> Plan {
        let last = self.last.take();
        if !enabled || self.off.is_some() {
            return Plan::Full;
        }
        let seen = match (&mut self.watch, self.stale) {
            (Some(w), false) => w.drain(),
            _ => watch::Seen::Everything(String::new()),
        };
        let (flat, deep, new, last) = match (seen, last) {
            (watch::Seen::Everything(why), _) => {
                self.restart(git, &why, budget);
                return Plan::Full;
            }
            (_, None) => return Plan::Full,
            (watch::Seen::Nothing, Some(last)) => {
                self.last = Some(last.clone());
                return Plan::Reuse(last);
            }
            (watch::Seen::Some { flat, deep, new }, Some(last)) => (flat, deep, new, last),
        };
        if deep.is_empty() && new.is_empty() && last.stats.len() == last.entries.len() {
            match quick::update(git, &last, &flat) {
                Ok(quick::Quick::Same) => {
                    self.last = Some(last.clone());
                    return Plan::Reuse(last);
                }
                Ok(quick::Quick::Tree(tree)) => {
                    let tree = Arc::new(tree);
                    self.unsynced.extend(flat);
                    self.last = Some(tree.clone());
                    return Plan::Done(tree);
                }
                Ok(quick::Quick::Cannot) => {}
                Err(e) => tracing::debug!(root = %git.root.display(), "no quick snapshot: {e}"),
            }
        }
        let mut flat = flat;
        flat.extend(self.unsynced.iter().cloned());
        let Some(w) = self.watch.as_mut() else { return Plan::Full };
        let ignored = match w.absorb(git, &new) {
            Ok(ignored) => ignored,
            Err(e) => {
                self.restart(git, &e.to_string(), budget);
                return Plan::Full;
            }
        };
        let specs = watch::specs(&git.root, &last, &flat, &deep, &ignored);
        if specs.is_empty() {
            self.last = Some(last.clone());
            return Plan::Reuse(last);
        }
        if specs.len() > watch::MAX_SPECS {
            return Plan::Full;
        }
        Plan::Paths(specs)
    }

    /// A new watch (the old one's queue no longer tells the whole story). Failing that, the
    /// project goes on with full snapshots.
    fn restart(&mut self, git: &Git, why: &str, budget: &Arc<watch::Budget>) {
        self.stale = false;
        self.watch = None;
        if !why.is_empty() {
            tracing::debug!(root = %git.root.display(), "watch restarted: {why}");
        }
        match watch::Watch::start(git, budget) {
            Ok(w) => self.watch = Some(w),
            Err(e) => {
                tracing::info!(root = %git.root.display(), "full snapshots from now on: {e}");
                self.off = Some(e.to_string());
            }
        }
    }

    /// A snapshot was taken: later ones may start from it. A project with nested repositories
    /// gets no watch (their commits happen in `.git` folders, which are not watched).
    fn taken(&mut self, tree: &Arc<Tree>) {
        self.unsynced.clear();
        if self.watch.is_some() && tree.entries.iter().any(|(_, e)| e.mode == 0o160000) {
            self.watch = None;
            self.off = Some("the project holds nested git repositories".into());
        }
        if self.watch.is_some() {
            self.last = Some(tree.clone());
        }
    }
}

/// The per-project lock, held across a snapshot (or an undo's two snapshots and restore).
struct Held {
    guard: OwnedMutexGuard<State>,
    /// Inherited by the snapshot's `git add`: a process killed mid-snapshot leaves it held
    /// until that git ends (see [`add_all`]).
    flock: std::fs::File,
}

/// Change receipts of one runtime: projects, and the runs that changed something.
#[derive(Debug)]
pub struct Receipts {
    settings: ChangesSettings,
    /// Our own directories (state root, session directory): never part of a project's files,
    /// and no receipts for a working directory inside them. An engine adds its clients'.
    own_dirs: Mutex<Vec<PathBuf>>,
    base: PathBuf,
    projects: Mutex<HashMap<PathBuf, Arc<Project>>>,
    records: Mutex<BTreeMap<u64, Arc<Record>>>,
    next_id: AtomicU64,
    /// The inotify watches and instances the projects' watches may take.
    budget: Arc<watch::Budget>,
    /// Where the projects' shared engines live (`None`: every snapshot is this backend's own).
    engines: Option<engine::Spot>,
    /// Each project's connection to its engine; `None`: it takes the private path.
    links: tokio::sync::Mutex<HashMap<PathBuf, Option<Arc<engine::Link>>>>,
    /// Counts the changes to `own_dirs` (each one rewrites the stores' excludes).
    own_gen: AtomicU64,
    /// `own_dirs` resolved, as of the `own_gen` kept with them.
    own_resolved: Mutex<Option<(u64, Arc<Vec<PathBuf>>)>>,
    /// `$HOME` as last read, and resolved.
    home_resolved: Mutex<Option<(PathBuf, PathBuf)>>,
    /// A receipt engine's change counter ([`page`]), counted up whenever a snapshot takes a
    /// project's lock and whenever our own directories change.
    epoch: Option<Arc<page::Page>>,
    /// A snapshot's short blocking steps run on the calling thread (an engine's: see
    /// [`Receipts::blocking`]).
    inline: bool,
}

impl Receipts {
    /// `state_root` is agent-bash's state directory (stores go to `<state_root>/changes`);
    /// `session_dir` this runtime's artifacts directory; `runtime_dir` its runtime directory.
    pub fn new(
        settings: ChangesSettings,
        state_root: PathBuf,
        session_dir: PathBuf,
        runtime_dir: PathBuf,
    ) -> Receipts {
        let mut own = own_dirs(state_root.clone(), session_dir);
        own.push(runtime_dir);
        let mut r = Receipts::bare(settings, state_root);
        r.own_dirs = Mutex::new(own);
        r
    }

    /// Receipts with no own directories yet (an engine learns them from its clients).
    pub fn bare(settings: ChangesSettings, state_root: PathBuf) -> Receipts {
        Receipts {
            base: state_root.join("changes"),
            own_dirs: Mutex::default(),
            settings,
            projects: Mutex::new(HashMap::new()),
            records: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(1),
            budget: watch::Budget::of_system(),
            engines: None,
            links: tokio::sync::Mutex::default(),
            own_gen: AtomicU64::new(0),
            own_resolved: Mutex::default(),
            home_resolved: Mutex::default(),
            epoch: None,
            inline: false,
        }
    }

    /// Counts on `page` what could change a project's latest tree (the engine's receipts).
    pub fn with_epoch(mut self, page: Option<Arc<page::Page>>) -> Receipts {
        self.epoch = page;
        self
    }

    /// A snapshot's short blocking steps (the store's lock and excludes, the watch's plan) run
    /// where they are called: an engine is a process of its own, whose one thread would only
    /// wait for them, and under load every hop to a blocking thread and back waited for two
    /// wake-ups behind the agents' processes.
    pub fn inline(mut self) -> Receipts {
        self.inline = true;
        self
    }

    /// `f` on a blocking thread, or here when [`Receipts::inline`].
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, tokio::task::JoinError> {
        match self.inline {
            true => Ok(f()),
            false => tokio::task::spawn_blocking(f).await,
        }
    }

    fn bump(&self) {
        if let Some(page) = &self.epoch {
            page.bump();
        }
    }

    /// Projects' snapshots go to their shared engines, found in `spot` (contract §13).
    pub fn with_engines(mut self, spot: Option<engine::Spot>) -> Receipts {
        self.engines = spot;
        self
    }

    fn own(&self) -> Vec<PathBuf> {
        self.own_dirs.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// More directories of ours (an engine's new client's), when not known yet.
    fn add_own_dirs(&self, dirs: Vec<PathBuf>) {
        let mut own = self.own_dirs.lock().unwrap_or_else(|e| e.into_inner());
        for d in dirs {
            if !own.contains(&d) {
                own.push(d);
                self.own_gen.fetch_add(1, Ordering::AcqRel);
                self.bump();
            }
        }
    }

    pub fn enabled(&self) -> bool {
        self.settings.enabled
    }

    /// Receipts are on and watch the projects' folders (`[changes] watch`; Linux's inotify, so
    /// never on the portable paths, where every snapshot is full).
    pub fn watching(&self) -> bool {
        self.settings.enabled && self.settings.watch && !crate::platform::portable()
    }

    /// Every project this backend has taken receipts in, and whether they are ready: asked of
    /// the project's engine, or of this backend's own snapshots (`:checkhealth`, the card's
    /// note of a run whose first snapshot was still being taken). `only`: just these roots
    /// (each project asked may wait up to [`STATUS_WAIT`] for a snapshot in progress).
    pub async fn status(&self, only: Option<&[PathBuf]>) -> Vec<ProjectStatus> {
        let wanted = |root: &PathBuf| only.is_none_or(|o| o.contains(root));
        // A connection being opened holds the map: asked again, the project is there.
        let links: Vec<(PathBuf, Arc<engine::Link>)> = match self.links.try_lock() {
            Ok(links) => links
                .iter()
                .filter(|(root, _)| wanted(root))
                .filter_map(|(root, link)| Some((root.clone(), link.clone()?)))
                .collect(),
            Err(_) => Vec::new(),
        };
        let mut out = Vec::new();
        for (root, link) in links {
            let readiness = match link.alive() {
                // The next run there connects again (starting an engine when none runs).
                false => Readiness::Waiting,
                true => match link.ask(engine::Ask::Status).await {
                    Ok(engine::Reply::Status { readiness }) => readiness,
                    Ok(engine::Reply::Failed { reason }) => Readiness::Off { reason },
                    Ok(other) => {
                        Readiness::Off { reason: format!("the receipt engine answered {other:?}") }
                    }
                    Err(e) => Readiness::Off { reason: e.to_string() },
                },
            };
            out.push(ProjectStatus::new(root, Some(link.pid), readiness));
        }
        let own: Vec<Arc<Project>> = self
            .projects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|p| wanted(&p.git.root))
            .cloned()
            .collect();
        for project in own {
            let readiness = self.readiness(&project).await;
            out.push(ProjectStatus::new(project.git.root.clone(), None, readiness));
        }
        out.sort_by(|a, b| a.root.cmp(&b.root));
        out
    }

    /// Whether `project`'s receipts are ready, from its own state (never waiting long for a
    /// snapshot being taken).
    async fn readiness(&self, project: &Project) -> Readiness {
        if project.indexing.load(Ordering::Acquire) {
            return Readiness::indexing(project.progress.now());
        }
        let Ok(state) = tokio::time::timeout(STATUS_WAIT, project.state.lock()).await else {
            return Readiness::Busy;
        };
        match (&state.off, state.ready) {
            (Some(reason), _) => Readiness::Off { reason: reason.clone() },
            (None, true) => Readiness::Ready { files: project.progress.files() },
            (None, false) => Readiness::Waiting,
        }
    }

    fn bin(&self) -> PathBuf {
        self.settings.git.clone().unwrap_or_else(|| PathBuf::from("git"))
    }

    fn project(&self, root: &Path, is_git: bool) -> Arc<Project> {
        let mut projects = self.projects.lock().unwrap_or_else(|e| e.into_inner());
        projects
            .entry(root.to_path_buf())
            .or_insert_with(|| {
                Arc::new(Project {
                    git: Git {
                        bin: self.bin(),
                        shadow: store::shadow_dir(&self.base, root),
                        root: root.to_path_buf(),
                    },
                    is_git,
                    state: Arc::default(),
                    indexing: AtomicBool::new(false),
                    progress: Arc::default(),
                })
            })
            .clone()
    }

    /// The snapshot before a run in `cwd` (an existing directory).
    pub async fn begin(&self, cwd: &Path) -> Begin {
        if !self.settings.enabled {
            return Begin::Off;
        }
        let (root, is_git) = match self.root_of(cwd) {
            Ok(found) => found,
            Err(reason) => return Begin::Unavailable(reason.into()),
        };
        if let Some(link) = self.link(&root, is_git).await {
            let git = |link: &engine::Link| Git {
                bin: self.bin(),
                shadow: link.shadow.clone(),
                root: root.clone(),
            };
            if let Some((claim, quiet)) = link.begin_quiet() {
                let git = git(&link);
                let open = OpenRun { link, run: RunId::Claimed(claim), open: true };
                return Begin::Shared { open, git, quiet: Some(quiet) };
            }
            return match link.ask(engine::Ask::Begin { paths: Vec::new() }).await {
                Ok(engine::Reply::Begun { run, quiet, .. }) => {
                    if let Some(q) = &quiet {
                        link.remember(q);
                    }
                    let git = git(&link);
                    let open = OpenRun { link, run: RunId::Asked(run), open: true };
                    Begin::Shared { open, git, quiet }
                }
                Ok(engine::Reply::Indexing { reason }) => Begin::Indexing { root, reason },
                Ok(engine::Reply::Failed { reason }) => Begin::Unavailable(reason),
                Ok(other) => Begin::Unavailable(format!("the receipt engine answered {other:?}")),
                Err(e) => Begin::Unavailable(e.to_string()),
            };
        }
        let project = self.project(&root, is_git);
        match self.snapshot(&project, true).await {
            Ok(before) => Begin::Taken { project, before },
            Err(reason) if reason.is_indexing() => {
                Begin::Indexing { root: project.git.root.clone(), reason: reason.to_string() }
            }
            Err(reason) => Begin::Unavailable(reason.to_string()),
        }
    }

    /// The project root of `cwd` and whether it is a git work tree, or why it gets no receipt.
    /// On the runtime thread: a `stat` per level of `cwd` (resolving it, then looking for
    /// `.git` upwards), cheaper than the hop to a blocking thread and back (measured: 34 µs of
    /// a 0.43 ms `true` went to that hop); our own directories and the home directory are
    /// resolved once.
    fn root_of(&self, cwd: &Path) -> Result<(PathBuf, bool), &'static str> {
        let cwd = cwd.canonicalize().unwrap_or_else(|_| cwd.to_path_buf());
        let root =
            crate::project::root(&cwd).ok_or("the working directory is inside a .git directory")?;
        if self.resolved().iter().any(|d| root.0.starts_with(d)) {
            return Err("the working directory is inside agent-bash's own state directory");
        }
        // contract §13: a snapshot of the whole file system or home directory is no receipt.
        if root.0.parent().is_none() {
            return Err("the project would be / (the whole file system): no receipt is kept");
        }
        if self.home().is_some_and(|h| h == root.0) {
            return Err("the project would be the home directory itself: no receipt is kept");
        }
        Ok(root)
    }

    /// Our own directories, resolved (again whenever one is added, or until all exist).
    fn resolved(&self) -> Arc<Vec<PathBuf>> {
        let gen = self.own_gen.load(Ordering::Acquire);
        let mut cache = self.own_resolved.lock().unwrap_or_else(|e| e.into_inner());
        match &*cache {
            Some((g, dirs)) if *g == gen => dirs.clone(),
            _ => {
                let mut all = true;
                let dirs: Vec<PathBuf> = (self.own().into_iter())
                    .map(|d| {
                        d.canonicalize().unwrap_or_else(|_| {
                            all = false;
                            d
                        })
                    })
                    .collect();
                let dirs = Arc::new(dirs);
                // One not made yet is resolved again the next time.
                if all {
                    *cache = Some((gen, dirs.clone()));
                }
                dirs
            }
        }
    }

    /// `$HOME` resolved (again when it changes).
    fn home(&self) -> Option<PathBuf> {
        let home = std::env::var_os("HOME").map(PathBuf::from).filter(|h| h.is_absolute())?;
        let mut cache = self.home_resolved.lock().unwrap_or_else(|e| e.into_inner());
        match &*cache {
            Some((h, resolved)) if *h == home => Some(resolved.clone()),
            _ => {
                let resolved = home.canonicalize().unwrap_or_else(|_| home.clone());
                *cache = Some((home, resolved.clone()));
                Some(resolved)
            }
        }
    }

    /// The connection to the project's shared engine: the one this backend holds, else a new
    /// one (starting the engine when none runs). `None`: the private path, for good (logged).
    async fn link(&self, root: &Path, is_git: bool) -> Option<Arc<engine::Link>> {
        let spot = self.engines.as_ref()?;
        let mut links = self.links.lock().await;
        match links.get(root) {
            Some(None) => return None,
            Some(Some(link)) if link.alive() => return Some(link.clone()),
            _ => {}
        }
        let opened = match spot.paths(root, &self.settings) {
            None => Err(ChangesError::Engine("no socket path for the project's engine".into())),
            Some(paths) => {
                let hello = engine::Ask::Hello {
                    root: root.to_path_buf(),
                    is_git,
                    settings: self.settings.clone(),
                    state_root: self.base.parent().map(Path::to_path_buf).unwrap_or_default(),
                    own: self.own(),
                    proof: None,
                };
                engine::Link::open(paths, hello).await
            }
        };
        match opened {
            Ok(link) => {
                tracing::debug!(root = %root.display(), pid = link.pid, "receipts by the shared engine");
                links.insert(root.to_path_buf(), Some(link.clone()));
                Some(link)
            }
            Err(e) => {
                tracing::warn!(root = %root.display(), "receipts take this backend's private path: {e}");
                links.insert(root.to_path_buf(), None);
                None
            }
        }
    }

    /// The snapshot after the run, and the receipt: what changed between the two (recorded
    /// for undo when anything did), or why there is none.
    pub async fn finish(&self, begin: Begin, command: &str) -> Receipt {
        let (project, before) = match begin {
            Begin::Off => return Receipt::Off,
            Begin::Unavailable(reason) => return Receipt::Unavailable(reason),
            Begin::Indexing { root, reason } => return Receipt::Indexing { root, reason },
            Begin::Taken { project, before } => (project, before),
            Begin::Shared { open, git, quiet } => {
                let link = open.link.clone();
                // Nothing changed during the run, as the engine's counter and watch tell: the
                // engine is told, and not waited for.
                if quiet.is_some_and(|q| link.still_quiet(&q)) {
                    open.end_quiet();
                    return self.report(Source::Shared(link, git), command, Vec::new());
                }
                return match open.end().await {
                    Ok(deltas) => self.report(Source::Shared(link, git), command, deltas),
                    Err(reason) => Receipt::Unavailable(reason.to_string()),
                };
            }
        };
        let after = match self.snapshot(&project, false).await {
            Ok(after) => after,
            Err(reason) => return Receipt::Unavailable(reason.to_string()),
        };
        let deltas = tokio::task::spawn_blocking(move || store::diff(&before, &after))
            .await
            .unwrap_or_default();
        self.report(Source::Local(project), command, deltas)
    }

    /// The receipt of `deltas`, recorded when not empty.
    fn report(&self, source: Source, command: &str, deltas: Vec<Delta>) -> Receipt {
        let changes: Vec<Change> = deltas.iter().take(MAX_REPORTED).map(Change::of).collect();
        let count = deltas.len();
        let id = (!deltas.is_empty()).then(|| self.record(source, command, deltas));
        Receipt::Taken { changes, count, id }
    }

    fn record(&self, source: Source, command: &str, deltas: Vec<Delta>) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let rec = Record {
            id,
            command: command.to_string(),
            root: source.git().root.clone(),
            deltas,
            source,
        };
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        records.insert(id, Arc::new(rec));
        while records.len() > KEEP_RECORDS {
            records.pop_first();
        }
        id
    }

    /// The run with changes `id`, or the newest one.
    pub fn get(&self, id: Option<u64>) -> Result<Arc<Record>, UndoError> {
        let records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        match id {
            Some(id) => records.get(&id).cloned().ok_or_else(|| {
                UndoError::NotFound(format!("No run with changes has id {id} in this session"))
            }),
            None => records
                .values()
                .next_back()
                .cloned()
                .ok_or_else(|| UndoError::NotFound("No run has changed any file yet".into())),
        }
    }

    /// A file's content before run `id` (`None`: it did not exist). Only paths the run changed.
    pub async fn before(&self, id: u64, path: &str) -> Result<Option<Vec<u8>>, ChangesError> {
        let rec = self.get(Some(id))?;
        let delta = rec
            .deltas
            .iter()
            .find(|d| d.path == path.as_bytes())
            .ok_or_else(|| ChangesError::NotChanged { id, path: path.to_owned() })?;
        let Some(entry) = delta.before else {
            return Ok(None);
        };
        let git = rec.source.git().clone();
        tokio::task::spawn_blocking(move || store::blobs(&git, &[entry.oid_hex()]))
            .await?
            .map(|mut b| b.pop())
    }

    /// Puts the files run `id` (default: the newest run with changes) changed back as they were
    /// before it, where they are still as it left them; else refuses and names the others.
    pub async fn undo(&self, id: Option<u64>) -> Result<UndoResult, UndoError> {
        let (rec, open) = self.prepare_undo(id).await?;
        let (git, deltas) = (rec.source.git().clone(), rec.deltas.clone());
        let restored = tokio::task::spawn_blocking(move || restore_all(&git, &deltas))
            .await
            .map_err(|e| UndoError::Failed(e.to_string()))
            .and_then(|r| {
                r.map_err(|e| UndoError::Failed(format!("Undo of run {} failed: {e}", rec.id)))
            });
        let label = format!("undo {}", rec.id);
        let receipt = match open {
            UndoRun::Local(project, held, now) => {
                restored?;
                match self.snapshot_held(&project, held).await {
                    Ok((_, after)) => {
                        let deltas = tokio::task::spawn_blocking(move || store::diff(&now, &after))
                            .await
                            .unwrap_or_default();
                        self.report(Source::Local(project), &label, deltas)
                    }
                    Err(reason) => Receipt::Unavailable(reason.to_string()),
                }
            }
            UndoRun::Shared(link, run, git) => {
                // The engine's run ends whatever happened, so that it forgets it.
                let ended = end_shared(&link, run).await;
                restored?;
                match ended {
                    Ok(deltas) => self.report(Source::Shared(link, git), &label, deltas),
                    Err(reason) => Receipt::Unavailable(reason.to_string()),
                }
            }
        };
        Ok(undone(&rec, receipt))
    }

    /// Whether run `id` can be undone now: `undo`'s refusal, if any, without touching a file
    /// (the editor asks the user only about an undo that would happen).
    pub async fn check_undo(&self, id: Option<u64>) -> Result<(), UndoError> {
        match self.prepare_undo(id).await? {
            (_, UndoRun::Local(..)) => Ok(()),
            (_, UndoRun::Shared(link, run, _)) => {
                let _ = end_shared(&link, run).await;
                Ok(())
            }
        }
    }

    /// The run to undo and the undo's own run begun (the project's lock and its current tree,
    /// or the engine's run), or the refusal: a nested git repository, files changed since the
    /// run, files the run shares with another that overlapped it, or a link where the run left
    /// a folder.
    async fn prepare_undo(&self, id: Option<u64>) -> Result<(Arc<Record>, UndoRun), UndoError> {
        let rec = self.get(id)?;
        if let Some(d) = rec
            .deltas
            .iter()
            .find(|d| [d.before, d.after].iter().flatten().any(|e| e.mode == 0o160000))
        {
            return Err(UndoError::Failed(format!(
                "Not undone: {} is a nested git repository, which undo does not restore",
                String::from_utf8_lossy(&d.path)
            )));
        }
        let ambiguous: Vec<String> = rec
            .deltas
            .iter()
            .filter(|d| d.overlap)
            .map(|d| String::from_utf8_lossy(&d.path).into_owned())
            .collect();
        if !ambiguous.is_empty() {
            return Err(UndoError::Ambiguous { id: rec.id, paths: ambiguous });
        }
        let (open, now) = self.begin_undo(&rec).await?;
        let refusal = refusal(&rec, &now).await;
        match (refusal, open) {
            (None, open) => Ok((rec, open)),
            (Some(e), UndoRun::Shared(link, run, _)) => {
                let _ = end_shared(&link, run).await;
                Err(e)
            }
            (Some(e), UndoRun::Local(..)) => Err(e),
        }
    }

    /// The undo's own run begun: what each changed path of `rec` is now (in delta order).
    async fn begin_undo(&self, rec: &Record) -> Result<(UndoRun, Vec<Option<Entry>>), UndoError> {
        let failed = |e: ChangesError| UndoError::Failed(e.to_string());
        match &rec.source {
            Source::Local(project) => {
                let (held, now) = self.snapshot_locked(project, false).await.map_err(failed)?;
                let entries = rec.deltas.iter().map(|d| now.get(&d.path).copied()).collect();
                Ok((UndoRun::Local(project.clone(), held, now), entries))
            }
            Source::Shared(link, git) => {
                let paths = rec.deltas.iter().map(|d| d.path.clone()).collect();
                match link.ask(engine::Ask::Begin { paths }).await.map_err(failed)? {
                    engine::Reply::Begun { run, entries, .. }
                        if entries.len() == rec.deltas.len() =>
                    {
                        Ok((UndoRun::Shared(link.clone(), run, git.clone()), entries))
                    }
                    engine::Reply::Failed { reason } => Err(UndoError::Failed(reason)),
                    other => {
                        Err(UndoError::Failed(format!("the receipt engine answered {other:?}")))
                    }
                }
            }
        }
    }

    /// A snapshot of the project (see [`Receipts::snapshot_locked`]). When nothing changed
    /// since the latest one (the watch has queued nothing, the ignore files are as they were,
    /// no snapshot is going on), that one, without the store's lock or a blocking thread: the
    /// everyday `true` costs a `poll` and two `stat`s.
    async fn snapshot(
        &self,
        project: &Arc<Project>,
        may_defer: bool,
    ) -> Result<Arc<Tree>, ChangesError> {
        if let Some(tree) = self.unchanged(project) {
            return Ok(tree);
        }
        self.snapshot_locked(project, may_defer).await.map(|(_, tree)| tree)
    }

    /// The latest snapshot, when nothing can have changed since it was taken (see
    /// [`Receipts::snapshot`]); `None`: take one.
    fn unchanged(&self, project: &Project) -> Option<Arc<Tree>> {
        self.quiet(project).map(|q| q.tree)
    }

    /// [`Receipts::unchanged`], with what tells it: the watch whose queue is empty and the
    /// ignore files outside the tree, with their stamps.
    fn quiet(&self, project: &Project) -> Option<Quiet> {
        if project.indexing.load(Ordering::Acquire) {
            return None;
        }
        // A snapshot going on holds the lock: its tree is not the latest yet.
        let guard = project.state.try_lock().ok()?;
        if guard.off.is_some() || !guard.ready {
            return None;
        }
        let (exclude, user, own) = guard.stamps?;
        let ours = self.own_gen.load(Ordering::Acquire) == own;
        // Two `stat`s of small local files, as cheap as the hop to a blocking thread.
        let same = ours
            && exclude.same(&Stamp::of(guard.project_exclude.as_deref()))
            && user.same(&Stamp::of(guard.excludes_file.as_deref()));
        let tree = same.then(|| guard.tracker.quiet()).flatten()?;
        Some(Quiet {
            tree,
            watch: guard.tracker.watch.as_ref().map(|w| w.id()),
            files: vec![
                (guard.project_exclude.clone(), exclude),
                (guard.excludes_file.clone(), user),
            ],
        })
    }

    /// The project's watch and a copy of its inotify descriptor (for an engine's client).
    async fn watch_descriptor(&self, project: &Project) -> Option<(u64, std::os::fd::OwnedFd)> {
        let guard = project.state.lock().await;
        let watch = guard.tracker.watch.as_ref()?;
        Some((watch.id(), watch.descriptor().ok()?))
    }

    /// Takes the project's lock and a snapshot within the budget.
    async fn snapshot_locked(
        &self,
        project: &Arc<Project>,
        may_defer: bool,
    ) -> Result<(Held, Arc<Tree>), ChangesError> {
        let deadline = Instant::now() + self.settings.budget();
        let held = self.acquire(project, deadline).await?;
        if !held.guard.ready {
            return self.first_snapshot(project, held, deadline, may_defer).await;
        }
        self.snapshot_held(project, held).await
    }

    /// A snapshot with the lock already held (a warm store).
    async fn snapshot_held(
        &self,
        project: &Arc<Project>,
        mut held: Held,
    ) -> Result<(Held, Arc<Tree>), ChangesError> {
        let deadline = Instant::now() + self.settings.budget();
        let root = project.git.root.display().to_string();
        let specs = match self.plan(project, &mut held).await {
            Plan::Reuse(tree) => return Ok((held, tree)),
            Plan::Done(tree) => {
                if let Err(reason) = self.within_limits(&root, &tree) {
                    held.guard.off = Some(reason.to_string());
                    return Err(reason);
                }
                return Ok((held, tree));
            }
            Plan::Paths(specs) => Some(specs),
            Plan::Full => None,
        };
        let mut added = add_all(&project.git, deadline, specs.as_deref(), &held.flock, None).await;
        if specs.is_some() && matches!(added, Err(AddError::Failed(_))) {
            // A spec git refused (a folder gone meanwhile): the whole tree, as without a watch.
            added = add_all(&project.git, deadline, None, &held.flock, None).await;
        }
        match added {
            Ok(()) => {}
            Err(AddError::Slow(slow)) => {
                slow.kill().await;
                let git = project.git.clone();
                let _ =
                    tokio::task::spawn_blocking(move || store::clear_stale_lock(&git.shadow)).await;
                let reason = ChangesError::TooSlow { root, ms: self.settings.max_snapshot_ms };
                held.guard.off = Some(reason.to_string());
                return Err(reason);
            }
            Err(AddError::Failed(e)) => {
                held.guard.off = Some(e.to_string());
                return Err(e);
            }
        }
        let tree = Arc::new(read_tree(&project.git).await?);
        if let Err(reason) = self.within_limits(&root, &tree) {
            held.guard.off = Some(reason.to_string());
            return Err(reason);
        }
        held.guard.tracker.taken(&tree);
        Ok((held, tree))
    }

    /// What the next snapshot must read, from the project's watch (see [`Tracker::plan`]).
    async fn plan(&self, project: &Arc<Project>, held: &mut Held) -> Plan {
        let mut tracker = std::mem::take(&mut held.guard.tracker);
        let (git, enabled, budget) =
            (project.git.clone(), self.settings.watch, self.budget.clone());
        let (tracker, plan) = self
            .blocking(move || {
                let plan = tracker.plan(&git, enabled, &budget);
                (tracker, plan)
            })
            .await
            .unwrap_or_else(|_| (Tracker::default(), Plan::Full));
        held.guard.tracker = tracker;
        plan
    }

    fn within_limits(&self, root: &str, tree: &Tree) -> Result<(), ChangesError> {
        let s = &self.settings;
        if tree.entries.len() as u64 > s.max_files {
            return Err(ChangesError::TooManyFiles {
                root: root.to_owned(),
                files: tree.entries.len() as u64,
                max: s.max_files,
            });
        }
        let bytes = tree.total_bytes();
        if bytes > s.max_bytes {
            return Err(ChangesError::TooManyBytes {
                root: root.to_owned(),
                bytes,
                max: s.max_bytes,
            });
        }
        Ok(())
    }

    /// The first snapshot of a project in this backend. When our store has no index yet, the
    /// tree's size is checked first (`git ls-files`, no hashing), then every file is hashed.
    /// All of it runs in a task of its own: when it outlasts the budget and `may_defer`, it
    /// goes on in the background (at most [`FIRST_SNAPSHOT_MAX`]) and this run has no receipt.
    async fn first_snapshot(
        &self,
        project: &Arc<Project>,
        held: Held,
        deadline: Instant,
        may_defer: bool,
    ) -> Result<(Held, Arc<Tree>), ChangesError> {
        let limits = (self.settings.max_files, self.settings.max_bytes, self.settings.watch);
        let budget = self.budget.clone();
        let (git, progress) = (project.git.clone(), project.progress.clone());
        progress.start();
        project.indexing.store(true, Ordering::Release);
        let mut task = tokio::spawn(first_snapshot(git, held, limits, budget, progress));
        let done = if may_defer {
            match tokio::time::timeout_at(deadline.into(), &mut task).await {
                Ok(done) => done,
                Err(_) => {
                    // The task clears `indexing` when it ends.
                    let flag = project.clone();
                    tokio::spawn(async move {
                        let _ = task.await;
                        flag.indexing.store(false, Ordering::Release);
                    });
                    return Err(ChangesError::FirstDeferred {
                        root: project.git.root.display().to_string(),
                        ms: self.settings.max_snapshot_ms,
                        at: project.progress.now(),
                    });
                }
            }
        } else {
            task.await
        };
        project.indexing.store(false, Ordering::Release);
        let (held, tree) = done?;
        Ok((held, tree?))
    }

    /// The project's lock (in-process, then the store's lock file), the store created and the
    /// excludes brought up to date.
    async fn acquire(
        &self,
        project: &Arc<Project>,
        deadline: Instant,
    ) -> Result<Held, ChangesError> {
        let root = project.git.root.display().to_string();
        if project.indexing.load(Ordering::Acquire) {
            return Err(ChangesError::Indexing { root, at: project.progress.now() });
        }
        let busy = || ChangesError::Busy(root.clone());
        let mut guard =
            tokio::time::timeout_at(deadline.into(), project.state.clone().lock_owned())
                .await
                .map_err(|_| busy())?;
        // Before anything under the lock reads the watch's queue or changes the latest tree.
        self.bump();
        if let Some(off) = &guard.off {
            return Err(ChangesError::Off(off.clone()));
        }
        let git = project.git.clone();
        let (init, is_git, exclude) = (guard.init, project.is_git, guard.project_exclude.clone());
        let user_file = guard.excludes_file.clone();
        // Read before the directories: one added meanwhile makes the next snapshot look again.
        let own_gen = self.own_gen.load(Ordering::Acquire);
        let own = self.own();
        // The error, and whether it turns receipts off for the project.
        let prepared = self
            .blocking(move || -> Result<_, (ChangesError, bool)> {
                let (mut exclude, mut user_file) = (exclude, user_file);
                // A store removed under us (its state directory deleted while an engine serves
                // other backends) is made again, and its next snapshot is a first one.
                let fresh = !init || !git.shadow.join("config").is_file();
                if fresh {
                    let (excludes_file, info) = store::user_ignores(&git.bin, &git.root, is_git);
                    store::init(&git, excludes_file.as_deref()).map_err(|e| (e, true))?;
                    exclude = info;
                    user_file = excludes_file;
                }
                let flock = store::lock(&git.shadow, deadline).map_err(|e| (e, false))?;
                store::clear_stale_lock(&git.shadow);
                // Before they are read: a change after that shows in the stamps.
                let stamps =
                    (Stamp::of(exclude.as_deref()), Stamp::of(user_file.as_deref()), own_gen);
                // Our own directories (stores, artifacts) never count as the project's files.
                let extra: Vec<String> = own
                    .into_iter()
                    .filter_map(|d| {
                        let d = d.canonicalize().unwrap_or(d);
                        let rel = d.strip_prefix(&git.root).ok()?;
                        (!rel.as_os_str().is_empty()).then(|| format!("/{}/", rel.display()))
                    })
                    .collect();
                // A store removed under us meanwhile (its state directory going) is made again
                // by the next call: that failure does not turn receipts off.
                let rewritten = store::sync_excludes(&git.shadow, exclude.as_deref(), &extra)
                    .map_err(|e| (e, git.shadow.join("config").is_file()))?;
                // The user's own ignore file is named in our config, not copied: its content is
                // compared here, so that the watch hears of new rules.
                #[allow(clippy::disallowed_methods)] // under spawn_blocking
                let user_rules = user_file.as_ref().and_then(|f| std::fs::read(f).ok());
                Ok((flock, exclude, user_file, user_rules, rewritten, fresh, stamps))
            })
            .await?;
        match prepared {
            Ok((flock, exclude, user_file, user_rules, rewritten, fresh, stamps)) => {
                if init && (rewritten || user_rules != guard.excludes_seen) {
                    guard.tracker.stale = true;
                }
                if init && fresh {
                    tracing::info!(root = %project.git.root.display(), "the receipt store was removed: made again");
                    guard.ready = false;
                    guard.tracker = Tracker::default();
                }
                guard.init = true;
                guard.project_exclude = exclude;
                guard.excludes_file = user_file;
                guard.excludes_seen = user_rules;
                guard.stamps = Some(stamps);
                Ok(Held { guard, flock })
            }
            Err((reason, permanent)) => {
                if permanent {
                    guard.off = Some(reason.to_string());
                }
                Err(reason)
            }
        }
    }
}

/// Our directories: the state root and the session directory (the runtime directory is added
/// by [`Receipts::new`]), and, when the state root is the
/// editor's (`stdpath('state')/agent_bash`, the plugin's layout), the editor's state directory,
/// which holds its log and the plugin's.
fn own_dirs(state_root: PathBuf, session_dir: PathBuf) -> Vec<PathBuf> {
    let mut dirs = vec![session_dir];
    let named = state_root.file_name().is_some_and(|n| n == "agent_bash" || n == "agent-bash");
    if let Some(parent) = state_root.parent().filter(|p| named && p.parent().is_some()) {
        dirs.push(parent.to_path_buf());
    }
    dirs.push(state_root);
    dirs
}

/// An undo's own run, begun: this backend's lock, snapshot and the project; or the engine's.
enum UndoRun {
    Local(Arc<Project>, Held, Arc<Tree>),
    Shared(Arc<engine::Link>, u64, Git),
}

/// Ends run `run` of the project's engine: its deltas.
async fn end_shared(link: &engine::Link, run: u64) -> Result<Vec<Delta>, ChangesError> {
    deltas_of(link.ask(engine::Ask::End { run }).await?)
}

/// The deltas of the engine's answer to the end of a run.
fn deltas_of(reply: engine::Reply) -> Result<Vec<Delta>, ChangesError> {
    match reply {
        engine::Reply::Ended { deltas } => Ok(deltas),
        engine::Reply::Failed { reason } => Err(ChangesError::Engine(reason)),
        other => Err(ChangesError::Engine(format!("the receipt engine answered {other:?}"))),
    }
}

/// Why `rec` cannot be undone now that its paths are `now` (in delta order): files changed
/// since, or a link where the run left a folder. `None`: it can.
async fn refusal(rec: &Record, now: &[Option<Entry>]) -> Option<UndoError> {
    let conflicts: Vec<String> = rec
        .deltas
        .iter()
        .zip(now)
        .filter(|(d, now)| !same(now.as_ref(), d.after.as_ref()))
        .map(|(d, _)| String::from_utf8_lossy(&d.path).into_owned())
        .collect();
    if !conflicts.is_empty() {
        return Some(UndoError::Conflict { id: rec.id, paths: conflicts, links: Vec::new() });
    }
    // Every path is reached beneath the root without following links (contract §13): a link
    // where the run left a folder refuses the whole undo before anything is written.
    let (root, deltas) = (rec.root.clone(), rec.deltas.clone());
    let blocked = tokio::task::spawn_blocking(move || links_in_the_way(&root, &deltas)).await;
    match blocked {
        Err(e) => Some(UndoError::Failed(e.to_string())),
        Ok(Err(e)) => Some(UndoError::Failed(e.to_string())),
        Ok(Ok(blocked)) if !blocked.is_empty() => {
            Some(UndoError::Conflict { id: rec.id, paths: blocked.clone(), links: blocked })
        }
        Ok(Ok(_)) => None,
    }
}

/// A done undo of `rec`, with the undo's own receipt.
fn undone(rec: &Record, receipt: Receipt) -> UndoResult {
    let changes = rec.changes();
    let output = format!(
        "Undid run {} (`{}`): {}",
        rec.id,
        first_line(&rec.command),
        names(&changes, changes.len())
    );
    let mut undo = UndoResult {
        undone: rec.id,
        output,
        changes_id: None,
        changes: Vec::new(),
        changes_count: 0,
        changes_unavailable: None,
    };
    match receipt {
        Receipt::Off => {}
        Receipt::Unavailable(reason) | Receipt::Indexing { reason, .. } => {
            undo.changes_unavailable = Some(reason)
        }
        Receipt::Taken { changes, count, id } => {
            (undo.changes, undo.changes_count, undo.changes_id) = (changes, count, id);
        }
    }
    undo
}

fn same(a: Option<&Entry>, b: Option<&Entry>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => a.same(b),
        _ => false,
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

/// The parts of `deltas`' paths that are symbolic links (or files) where a folder belongs,
/// each named once (blocking).
fn links_in_the_way(root: &Path, deltas: &[Delta]) -> Result<Vec<String>, ChangesError> {
    use std::os::unix::ffi::OsStrExt;
    let beneath = store::Beneath::open(root)?;
    let mut blocked = Vec::new();
    for d in deltas {
        match beneath.check(Path::new(std::ffi::OsStr::from_bytes(&d.path))) {
            Ok(()) => {}
            Err(store::Reach::Blocked(p)) => {
                let p = p.to_string_lossy().into_owned();
                if !blocked.contains(&p) {
                    blocked.push(p);
                }
            }
            Err(store::Reach::Failed(e)) => return Err(e),
        }
    }
    Ok(blocked)
}

/// Writes every path of `deltas` back to its `before` state (blocking), each reached beneath
/// the root without following links.
fn restore_all(git: &Git, deltas: &[Delta]) -> Result<(), ChangesError> {
    use std::os::unix::ffi::OsStrExt;
    let wanted: Vec<String> = deltas.iter().filter_map(|d| d.before.map(|e| e.oid_hex())).collect();
    let mut contents = store::blobs(git, &wanted)?.into_iter();
    let beneath = store::Beneath::open(&git.root)?;
    for d in deltas {
        let path = Path::new(std::ffi::OsStr::from_bytes(&d.path));
        match &d.before {
            None => beneath.restore(path, None)?,
            Some(entry) => {
                let content = contents.next().ok_or(ChangesError::ContentMissing)?;
                beneath.restore(path, Some((entry, &content)))?;
            }
        }
    }
    Ok(())
}

enum AddError {
    /// Still running at the deadline (the caller kills it).
    Slow(Slow),
    Failed(ChangesError),
}

/// A `git add` still running at its deadline.
struct Slow {
    child: tokio::process::Child,
    pid: i32,
}

impl Slow {
    async fn kill(mut self) {
        let _ = self.child.kill().await;
        crate::shell::procs::disown_child(self.pid);
    }
}

/// `git add -A` into the shadow index, waited for until `deadline`.
/// With `specs`, only what they name (glob path specs of [`watch::specs`]). With `progress`,
/// git says each file it hashes (`--verbose`: one line each) and the lines are counted there.
/// The git inherits
/// the store's lock (`flock`, open as `lock`): if we are killed while it runs, the lock stays
/// held until it ends, so the next snapshot never runs beside it (nor removes its
/// `index.lock`).
async fn add_all(
    git: &Git,
    deadline: Instant,
    specs: Option<&[std::ffi::OsString]>,
    lock: &std::fs::File,
    progress: Option<&status::Progress>,
) -> Result<(), AddError> {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let mut cmd = git.command();
    let fd = lock.as_raw_fd();
    // SAFETY: fcntl(2) is async-signal-safe; it changes the child's copy of the descriptor only.
    unsafe {
        cmd.pre_exec(move || {
            libc::fcntl(fd, libc::F_SETFD, 0);
            Ok(())
        });
    }
    match specs {
        Some(specs) => {
            // Preloading stats every file of the index in threads, path specs or not: the
            // few folders named are cheaper to stat on one thread.
            cmd.env("GIT_LITERAL_PATHSPECS", "0")
                .args(["-c", "core.preloadIndex=false", "add", "-A", "--"])
                .args(specs);
        }
        None if progress.is_some() => {
            cmd.args(["add", "-A", "--verbose", "--", "."]);
        }
        None => {
            cmd.args(["add", "-A", "--", "."]);
        }
    }
    let stdout = match progress {
        Some(_) => std::process::Stdio::piped(),
        None => std::process::Stdio::null(),
    };
    cmd.stdout(stdout).stderr(std::process::Stdio::piped());
    let mut cmd = tokio::process::Command::from(cmd);
    // Owned: the backend's reaper of adopted orphans must not take its exit status.
    let mut child = crate::shell::procs::spawn_owned(|| cmd.spawn(), |c| c.id().map(|p| p as i32))
        .map_err(|source| {
            AddError::Failed(ChangesError::RunProgram { bin: git.bin.clone(), source })
        })?;
    let pid = child.id().map_or(0, |p| p as i32);
    let mut stderr = child.stderr.take();
    let read_err = async move {
        let mut buf = Vec::new();
        if let Some(s) = stderr.as_mut() {
            let _ = s.take(16 * 1024).read_to_end(&mut buf).await;
        }
        buf
    };
    let mut stdout = child.stdout.take();
    let count = async move {
        let (Some(out), Some(progress)) = (stdout.as_mut(), progress) else { return };
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = out.read(&mut buf).await {
            progress.hashed(buf[..n].iter().filter(|&&b| b == b'\n').count() as u64);
        }
    };
    let waited = tokio::time::timeout_at(deadline.into(), async {
        let (status, err, ()) = tokio::join!(child.wait(), read_err, count);
        (status, err)
    })
    .await;
    if waited.is_ok() {
        crate::shell::procs::disown_child(pid);
    }
    match waited {
        Ok((Ok(status), _)) if status.success() => Ok(()),
        Ok((status, err)) => {
            let err = String::from_utf8_lossy(&err);
            let err = err.trim();
            Err(AddError::Failed(ChangesError::AddFailed {
                root: git.root.display().to_string(),
                status: status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string()),
                message: if err.is_empty() { "no message" } else { err }.to_owned(),
            }))
        }
        Err(_) => Err(AddError::Slow(Slow { child, pid })),
    }
}

/// The work of [`Receipts::first_snapshot`]: limits, `git add -A`, the tree. A failure turns
/// receipts off for the project (the reason is kept in its state).
async fn first_snapshot(
    git: Git,
    mut held: Held,
    (max_files, max_bytes, watch): (u64, u64, bool),
    budget: Arc<watch::Budget>,
    progress: Arc<status::Progress>,
) -> (Held, Result<Arc<Tree>, ChangesError>) {
    let root = git.root.display().to_string();
    let end = Instant::now() + FIRST_SNAPSHOT_MAX;
    let result = async {
        let shadow = git.shadow.clone();
        let has_index = tokio::task::spawn_blocking(move || shadow.join("index").is_file())
            .await
            .unwrap_or(false);
        let mut listed = Vec::new();
        if !has_index {
            let (paths, bytes) = count_files(&git, end).await?;
            let files = paths.len() as u64;
            listed = paths;
            progress.counted(files);
            if files > max_files {
                return Err(ChangesError::TooManyFiles { root, files, max: max_files });
            }
            if bytes > max_bytes {
                return Err(ChangesError::TooManyBytes { root, bytes, max: max_bytes });
            }
        }
        // The watch starts before the snapshot: what changes after it is in its queue.
        let mut tracker = std::mem::take(&mut held.guard.tracker);
        let g = git.clone();
        held.guard.tracker = tokio::task::spawn_blocking(move || {
            let _ = tracker.plan(&g, watch, &budget);
            tracker
        })
        .await
        .unwrap_or_default();
        if !listed.is_empty() {
            // Our packs and index first; `git add` then hashes what changed meanwhile.
            let (g, p) = (git.clone(), progress.clone());
            let taken =
                tokio::task::spawn_blocking(move || first::take(&g, &listed, &p, end)).await?;
            match taken {
                Ok(()) => {}
                Err(first::Stopped::Late) => {
                    return Err(ChangesError::FirstTooSlow {
                        root,
                        secs: FIRST_SNAPSHOT_MAX.as_secs(),
                    })
                }
                Err(first::Stopped::Failed(e)) => return Err(e),
            }
        }
        match add_all(&git, end, None, &held.flock, Some(&progress)).await {
            Ok(()) => {}
            Err(AddError::Failed(e)) => return Err(e),
            Err(AddError::Slow(slow)) => {
                slow.kill().await;
                let shadow = git.shadow.clone();
                let _ = tokio::task::spawn_blocking(move || store::clear_stale_lock(&shadow)).await;
                return Err(ChangesError::FirstTooSlow {
                    root,
                    secs: FIRST_SNAPSHOT_MAX.as_secs(),
                });
            }
        }
        let tree = read_tree(&git).await?;
        let bytes = tree.total_bytes();
        if tree.entries.len() as u64 > max_files {
            let files = tree.entries.len() as u64;
            return Err(ChangesError::TooManyFiles { root, files, max: max_files });
        }
        if bytes > max_bytes {
            return Err(ChangesError::TooManyBytes { root, bytes, max: max_bytes });
        }
        Ok(Arc::new(tree))
    }
    .await;
    match &result {
        Ok(tree) => {
            progress.done(tree.entries.len() as u64);
            held.guard.ready = true;
            held.guard.tracker.taken(tree);
        }
        Err(e) => held.guard.off = Some(e.to_string()),
    }
    (held, result)
}

async fn read_tree(git: &Git) -> Result<Tree, ChangesError> {
    let shadow = git.shadow.clone();
    tokio::task::spawn_blocking(move || store::read_index(&shadow)).await?
}

/// The project's non-ignored files (relative to its root) and their bytes, without hashing
/// any (`git ls-files --others --exclude-standard`): the limits are checked before a first
/// snapshot, which then reads these files ([`first`]).
async fn count_files(git: &Git, deadline: Instant) -> Result<(Vec<Vec<u8>>, u64), ChangesError> {
    let mut cmd = git.command();
    cmd.args(["ls-files", "-z", "--others", "--cached", "--exclude-standard"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    let child = crate::shell::procs::spawn_owned(|| cmd.spawn(), |c| c.id().map(|p| p as i32))
        .map_err(|source| ChangesError::RunProgram { bin: git.bin.clone(), source })?;
    let pid = child.id().map_or(0, |p| p as i32);
    let out = tokio::time::timeout_at(deadline.into(), child.wait_with_output()).await;
    crate::shell::procs::disown_child(pid);
    let root = || git.root.display().to_string();
    let out = out
        .map_err(|_| ChangesError::ListTooSlow(root()))?
        .map_err(|source| ChangesError::RunProgram { bin: git.bin.clone(), source })?;
    if !out.status.success() {
        return Err(ChangesError::ListFailed(root()));
    }
    let root = git.root.clone();
    tokio::task::spawn_blocking(move || {
        use std::os::unix::ffi::OsStrExt;
        let mut files = Vec::new();
        let mut bytes = 0u64;
        for name in out.stdout.split(|b| *b == 0).filter(|n| !n.is_empty()) {
            let path = root.join(std::ffi::OsStr::from_bytes(name));
            if let Ok(m) = path.symlink_metadata() {
                bytes += m.len();
            }
            files.push(name.to_vec());
        }
        (files, bytes)
    })
    .await
    .map_err(ChangesError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(path: &str, kind: Kind) -> Change {
        Change { path: path.into(), kind, overlap: false }
    }

    #[test]
    fn names_lists_twenty_then_a_count() {
        let few = [
            c("src/a.rs", Kind::Modified),
            c("notes.txt", Kind::Added),
            c("old.txt", Kind::Deleted),
            c("run.sh", Kind::Mode),
        ];
        assert_eq!(names(&few, 4), "M src/a.rs, A notes.txt, D old.txt, X run.sh");
        let many: Vec<Change> = (0..25).map(|i| c(&format!("f{i}"), Kind::Added)).collect();
        let text = names(&many, 25);
        assert!(text.ends_with("A f19 and 5 more"), "{text}");
        assert_eq!(text.matches("A f").count(), 20);
        let capped = names(&many[..3], 300);
        assert!(capped.ends_with("A f2 and 297 more"), "{capped}");
    }

    #[test]
    fn receipts_stay_on_up_to_half_a_million_files_by_default() {
        assert_eq!(ChangesSettings::default().max_files, 500_000);
        // As the settings file gives them: an empty `[changes]` table keeps the default.
        let parsed: ChangesSettings = toml::from_str("enabled = true\n").unwrap();
        assert_eq!(parsed.max_files, 500_000);
    }

    #[test]
    fn settings_reject_zero_budgets() {
        let s = ChangesSettings { max_snapshot_ms: 0, ..Default::default() };
        assert!(s.check().is_err());
        assert!(ChangesSettings::default().check().is_ok());
    }
}
