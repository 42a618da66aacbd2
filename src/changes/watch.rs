//! Which parts of a project changed since its last snapshot, so that a warm snapshot re-reads
//! only those (contract §13: bounded cost).
//!
//! A [`Watch`] holds one inotify instance with a watch on every directory of the project that
//! git does not ignore (and that is not a `.git`). Between two snapshots it collects, from the
//! kernel's queue, the directories whose entries changed (`flat`: their files are re-read, not
//! their subdirectories) and the directories that appeared, vanished or moved (`deep`: their
//! whole subtree is re-read). New directories get their watches before the snapshot that
//! re-reads them, so nothing written in them is missed between the two.
//!
//! What the queue cannot tell — it overflowed, an ignore file changed (a `.gitignore` in the
//! tree; the caller checks the store's own exclude files), the project root itself moved —
//! is [`Seen::Everything`]: the caller starts the watch again and takes a full snapshot.
//!
//! Known blind spots, documented in the README: writes through a memory mapping after the
//! file was closed, writes through a hard link from outside the project, and changes made by
//! another machine on a network filesystem. `[changes] watch = false` turns the watch off.
//!
//! Everything here blocks (it runs under `spawn_blocking`), except [`Watch::quiet`], a `poll`
//! with no wait that lets a snapshot of an unchanged project skip the blocking thread.

#[cfg(target_os = "linux")]
use std::collections::HashMap;
use std::collections::{BTreeSet, HashSet};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
#[cfg(target_os = "linux")]
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

#[cfg(target_os = "linux")]
use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};

use super::store::{Git, Tree};
use super::ChangesError;

/// The most directories one project's watch covers; a larger tree gets full snapshots.
pub const MAX_DIRS: usize = 50_000;
/// More path specs than this: one full snapshot is simpler than naming them all.
pub const MAX_SPECS: usize = 256;

/// What changed since the last drain of the queue.
#[derive(Debug, PartialEq, Eq)]
pub enum Seen {
    Nothing,
    /// Relative directories (`b""` is the root): `flat` saw changes to their own entries,
    /// `deep` appeared, vanished or moved (their subtrees), `new` are directories to watch.
    Some {
        flat: BTreeSet<Vec<u8>>,
        deep: BTreeSet<Vec<u8>>,
        new: BTreeSet<Vec<u8>>,
    },
    /// The extent of the changes is unknown: why.
    Everything(String),
}

/// The share of the user's inotify resources one backend may take: they are shared with every
/// program of the user (editors' file watchers among them), so a quarter of the watches
/// (`fs.inotify.max_user_watches`) and an eighth of the instances (`max_user_instances`).
#[derive(Debug)]
#[cfg_attr(not(target_os = "linux"), allow(dead_code))] // no watches to count there
pub struct Budget {
    dirs: AtomicUsize,
    watches: AtomicUsize,
    limit: usize,
}

impl Budget {
    #[allow(clippy::disallowed_methods)] // one small /proc file, once per backend (`Receipts::new`)
    pub fn of_system() -> Arc<Budget> {
        let read = |name: &str, default: usize| {
            std::fs::read_to_string(format!("/proc/sys/fs/inotify/{name}"))
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .unwrap_or(default)
        };
        let limit = read("max_user_watches", 8192);
        Budget::new(limit / 4, (read("max_user_instances", 128) / 8).max(1), limit)
    }

    pub fn new(dirs: usize, watches: usize, limit: usize) -> Arc<Budget> {
        Arc::new(Budget { dirs: AtomicUsize::new(dirs), watches: AtomicUsize::new(watches), limit })
    }

    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    fn take(n: &AtomicUsize) -> bool {
        n.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(1)).is_ok()
    }
}

/// The inotify watches of one project.
#[cfg(target_os = "linux")]
pub struct Watch {
    ino: Inotify,
    /// Which watch this is, in this process (a restart makes a new one).
    id: u64,
    root: PathBuf,
    /// Watch descriptor → directory relative to the root (`b""` for the root).
    dirs: HashMap<i32, (WatchDescriptor, Vec<u8>)>,
    budget: Arc<Budget>,
}

#[cfg(target_os = "linux")]
impl Drop for Watch {
    fn drop(&mut self) {
        self.budget.dirs.fetch_add(self.dirs.len(), Ordering::AcqRel);
        self.budget.watches.fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(target_os = "linux")]
impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Watch({}, {} directories)", self.root.display(), self.dirs.len())
    }
}

#[cfg(target_os = "linux")]
fn mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MODIFY
        | WatchMask::ATTRIB
        | WatchMask::CLOSE_WRITE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::MOVE_SELF
        | WatchMask::ONLYDIR
        | WatchMask::DONT_FOLLOW
        | WatchMask::EXCL_UNLINK
}

/// `dir/name`, relative (`name` alone under the root).
pub fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = Vec::with_capacity(dir.len() + 1 + name.len());
    if !dir.is_empty() {
        path.extend_from_slice(dir);
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

/// `path` is `dir` or inside it.
fn within(path: &[u8], dir: &[u8]) -> bool {
    dir.is_empty()
        || path == dir
        || (path.len() > dir.len() && path.starts_with(dir) && path[dir.len()] == b'/')
}

#[cfg(target_os = "linux")]
impl Watch {
    /// Watches every directory of the project that git does not ignore.
    pub fn start(git: &Git, budget: &Arc<Budget>) -> Result<Watch, ChangesError> {
        if crate::platform::portable() {
            return Err(ChangesError::NoWatcher(crate::platform::describe()));
        }
        if !Budget::take(&budget.watches) {
            return Err(ChangesError::WatchesTaken);
        }
        let ino = match Inotify::init() {
            Ok(ino) => ino,
            Err(e) => {
                budget.watches.fetch_add(1, Ordering::AcqRel);
                return Err(ChangesError::NoInotify(e));
            }
        };
        static IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = IDS.fetch_add(1, Ordering::Relaxed);
        let mut watch =
            Watch { ino, id, root: git.root.clone(), dirs: HashMap::new(), budget: budget.clone() };
        let ignored = ignored_dirs(git, &[])?;
        watch.add_tree(b"", &ignored)?;
        Ok(watch)
    }

    /// Watches `top` (relative) and every directory below it that is not ignored. A directory
    /// that vanishes meanwhile is skipped: its removal is in the queue.
    // Under spawn_blocking (changes.rs `plan`): lists the project's directories.
    #[allow(clippy::disallowed_methods)]
    fn add_tree(&mut self, top: &[u8], ignored: &HashSet<Vec<u8>>) -> Result<(), ChangesError> {
        let mut stack = vec![top.to_vec()];
        while let Some(rel) = stack.pop() {
            let full = self.root.join(OsStr::from_bytes(&rel));
            if !Budget::take(&self.budget.dirs) {
                return Err(ChangesError::WatchBudget(self.budget.limit));
            }
            match self.ino.watches().add(&full, mask()) {
                Ok(wd) => {
                    let id = wd.get_watch_descriptor_id();
                    if self.dirs.insert(id, (wd, rel.clone())).is_some() {
                        // The same folder again (a new name for it): counted once.
                        self.budget.dirs.fetch_add(1, Ordering::AcqRel);
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                    self.budget.dirs.fetch_add(1, Ordering::AcqRel);
                    return Err(ChangesError::WatchLimit);
                }
                Err(e) => {
                    self.budget.dirs.fetch_add(1, Ordering::AcqRel);
                    if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) {
                        continue;
                    }
                    return Err(ChangesError::File { what: "watch", path: full, source: e });
                }
            }
            if self.dirs.len() > MAX_DIRS {
                return Err(ChangesError::TooManyDirs(MAX_DIRS));
            }
            let Ok(entries) = std::fs::read_dir(&full) else { continue };
            for entry in entries.flatten() {
                let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
                let name = entry.file_name();
                if !is_dir || name == ".git" {
                    continue;
                }
                let child = join(&rel, name.as_bytes());
                if !ignored.contains(&child) {
                    stack.push(child);
                }
            }
        }
        Ok(())
    }

    /// The kernel has queued no event since the last drain: nothing the watch covers changed
    /// (one `poll` with no wait, so the runtime thread may ask; the queue is left as it is).
    pub fn quiet(&self) -> bool {
        use std::os::fd::{AsRawFd, BorrowedFd};
        // SAFETY: the descriptor of our inotify instance, open while `self` lives.
        queue_empty(unsafe { BorrowedFd::borrow_raw(self.ino.as_raw_fd()) })
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// A copy of the inotify descriptor, for a client of the engine to ask [`quiet`] itself
    /// (it never reads the queue: see [`super::page`]).
    ///
    /// [`quiet`]: Watch::quiet
    pub fn descriptor(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        use std::os::fd::{AsRawFd, BorrowedFd};
        // SAFETY: the descriptor of our inotify instance, open while `self` lives.
        let fd = unsafe { BorrowedFd::borrow_raw(self.ino.as_raw_fd()) };
        fd.try_clone_to_owned()
    }

    /// Takes every event the kernel queued since the last drain.
    pub fn drain(&mut self) -> Seen {
        let mut buf = [0u8; 16 * 1024];
        let (mut flat, mut deep, mut new) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
        let mut everything: Option<String> = None;
        loop {
            let events = match self.ino.read_events(&mut buf) {
                Ok(events) => events,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    everything = Some(format!("the watch failed: {e}"));
                    break;
                }
            };
            let mut moved_away = Vec::new();
            for ev in events {
                if ev.mask.contains(EventMask::Q_OVERFLOW) {
                    everything = Some("the change queue overflowed".into());
                    continue;
                }
                let id = ev.wd.get_watch_descriptor_id();
                if ev.mask.contains(EventMask::IGNORED) {
                    if let Some((_, dir)) = self.dirs.remove(&id) {
                        self.budget.dirs.fetch_add(1, Ordering::AcqRel);
                        if dir.is_empty() {
                            everything = Some("the project folder was removed".into());
                        }
                    }
                    continue;
                }
                let Some((_, dir)) = self.dirs.get(&id) else { continue };
                let Some(name) = ev.name else {
                    if dir.is_empty() && ev.mask.contains(EventMask::MOVE_SELF) {
                        everything = Some("the project folder moved".into());
                    }
                    continue;
                };
                if name == ".gitignore" {
                    everything = Some("ignore rules changed".into());
                }
                let path = join(dir, name.as_bytes());
                flat.insert(dir.clone());
                if ev.mask.contains(EventMask::ISDIR) {
                    if ev.mask.intersects(EventMask::CREATE | EventMask::MOVED_TO) {
                        new.insert(path.clone());
                    }
                    if ev.mask.contains(EventMask::MOVED_FROM) {
                        moved_away.push(path.clone());
                    }
                    deep.insert(path);
                }
            }
            // A directory moved away keeps its watches under its old name: drop them (a move
            // within the project is also a new directory, watched again under its new name).
            for gone in moved_away {
                let ids: Vec<i32> = self
                    .dirs
                    .iter()
                    .filter(|(_, (_, d))| within(d, &gone))
                    .map(|(id, _)| *id)
                    .collect();
                for id in ids {
                    if let Some((wd, _)) = self.dirs.remove(&id) {
                        let _ = self.ino.watches().remove(wd);
                        self.budget.dirs.fetch_add(1, Ordering::AcqRel);
                    }
                }
            }
        }
        if let Some(why) = everything {
            return Seen::Everything(why);
        }
        if flat.is_empty() && deep.is_empty() {
            return Seen::Nothing;
        }
        Seen::Some { flat, deep, new }
    }

    /// Watches the directories that appeared (those git does not ignore). Returns the ones that
    /// are ignored, whose content no snapshot needs to read.
    pub fn absorb(
        &mut self,
        git: &Git,
        new: &BTreeSet<Vec<u8>>,
    ) -> Result<HashSet<Vec<u8>>, ChangesError> {
        let present: Vec<Vec<u8>> =
            new.iter().filter(|d| self.root.join(OsStr::from_bytes(d)).is_dir()).cloned().collect();
        if present.is_empty() {
            return Ok(HashSet::new());
        }
        let ignored = ignored_dirs(git, &present)?;
        for dir in present.iter().filter(|d| !ignored.contains(*d)) {
            self.add_tree(dir, &ignored)?;
        }
        Ok(ignored)
    }
}

/// The portable twin: no watcher (a project gets full snapshots, README "Platforms"). macOS's
/// FSEvents reports changes late and coalesced, which would make a receipt miss a write the
/// command made just before it ended; a full snapshot never does.
#[cfg(not(target_os = "linux"))]
#[derive(Debug)]
pub struct Watch {
    never: std::convert::Infallible,
}

#[cfg(not(target_os = "linux"))]
impl Watch {
    /// Always refuses: there is no watcher here.
    pub fn start(_git: &Git, _budget: &Arc<Budget>) -> Result<Watch, ChangesError> {
        Err(ChangesError::NoWatcher(crate::platform::describe()))
    }

    pub fn quiet(&self) -> bool {
        match self.never {}
    }

    pub fn id(&self) -> u64 {
        match self.never {}
    }

    pub fn descriptor(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        match self.never {}
    }

    pub fn drain(&mut self) -> Seen {
        match self.never {}
    }

    pub fn absorb(
        &mut self,
        _git: &Git,
        _new: &BTreeSet<Vec<u8>>,
    ) -> Result<HashSet<Vec<u8>>, ChangesError> {
        match self.never {}
    }
}

/// Nothing is queued on the inotify instance `fd` (one `poll` with no wait; the queue is left
/// as it is).
pub fn queue_empty(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one pollfd of ours, no wait.
    let ready = unsafe { libc::poll(&mut p, 1, 0) };
    ready == 0
}

/// The `git add` path specs that re-read what `seen` names: `:(glob)dir/*` for a directory's
/// own entries, `:(glob)dir/**` for a subtree. A directory that neither exists nor held files
/// in `last` is left out (git refuses a spec that matches nothing), and so are ignored ones.
pub fn specs(
    root: &Path,
    last: &Tree,
    flat: &BTreeSet<Vec<u8>>,
    deep: &BTreeSet<Vec<u8>>,
    ignored: &HashSet<Vec<u8>>,
) -> Vec<OsString> {
    let useful = |d: &Vec<u8>| {
        !ignored.contains(d)
            && (d.is_empty() || root.join(OsStr::from_bytes(d)).is_dir() || last.holds_dir(d))
    };
    let deep: Vec<&Vec<u8>> = deep.iter().filter(|d| useful(d)).collect();
    let covered = |d: &[u8], strict: bool| {
        deep.iter().any(|top| within(d, top) && (!strict || d.len() != top.len()))
    };
    let mut out = Vec::new();
    for d in &deep {
        if !covered(d, true) {
            out.push(spec(d, b"**"));
        }
    }
    for d in flat.iter().filter(|d| useful(d) && !covered(d, false)) {
        out.push(spec(d, b"*"));
    }
    out
}

/// `:(glob)<dir>/<tail>` with the glob characters of `dir` escaped.
fn spec(dir: &[u8], tail: &[u8]) -> OsString {
    let mut s = b":(glob)".to_vec();
    for &b in dir {
        if matches!(b, b'*' | b'?' | b'[' | b'\\') {
            s.push(b'\\');
        }
        s.push(b);
    }
    if !dir.is_empty() {
        s.push(b'/');
    }
    s.extend_from_slice(tail);
    OsString::from_vec(s)
}

/// The directories git ignores (as a whole, by a rule), among those it lists as holding
/// nothing but ignored files (`ls-files --others --ignored --directory`), within `under`
/// (the whole project when empty). `git check-ignore` tells a directory a rule ignores from
/// one whose files merely all happen to be ignored (which must stay watched).
pub fn ignored_dirs(git: &Git, under: &[Vec<u8>]) -> Result<HashSet<Vec<u8>>, ChangesError> {
    let mut cmd = git.command();
    cmd.args(["ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory"]);
    if !under.is_empty() {
        cmd.arg("--");
        cmd.args(under.iter().map(|d| OsStr::from_bytes(d)));
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::null());
    let out = super::store::output_owned(cmd).map_err(ChangesError::RunGit)?;
    if !out.status.success() {
        return Err(ChangesError::ListIgnored(git.root.display().to_string()));
    }
    let candidates: Vec<&[u8]> = out
        .stdout
        .split(|b| *b == 0)
        .filter_map(|p| p.strip_suffix(b"/"))
        .filter(|p| !p.is_empty())
        .collect();
    if candidates.is_empty() {
        return Ok(HashSet::new());
    }
    let mut input = Vec::new();
    for c in &candidates {
        input.extend_from_slice(c);
        input.push(0);
    }
    let mut cmd = git.command();
    // check-ignore takes plain paths: no pathspec magic.
    cmd.env("GIT_LITERAL_PATHSPECS", "0")
        .args(["check-ignore", "-z", "--no-index", "--stdin"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let out = super::store::output_with_input(cmd, input)?;
    // 1: none of them is ignored.
    if !matches!(out.status.code(), Some(0 | 1)) {
        return Err(ChangesError::CheckIgnore(git.root.display().to_string()));
    }
    Ok(out.stdout.split(|b| *b == 0).filter(|p| !p.is_empty()).map(<[u8]>::to_vec).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changes::store::Entry;

    fn set(items: &[&str]) -> BTreeSet<Vec<u8>> {
        items.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    #[test]
    fn specs_cover_each_change_once_and_escape_globs() {
        let dir = tempfile::tempdir().unwrap();
        for d in ["a/b", "w*ld"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        let e = Entry { mode: 0o100644, oid: [0; 20], size: 1 };
        let last = Tree { entries: vec![(b"gone/f"[..].into(), e)], stats: Vec::new() };
        let specs = specs(
            dir.path(),
            &last,
            &set(&["", "a", "a/b", "w*ld", "never"]),
            &set(&["a", "gone", "tmp"]),
            &HashSet::new(),
        );
        let specs: Vec<String> = specs.iter().map(|s| s.to_string_lossy().into_owned()).collect();
        assert_eq!(specs, [":(glob)a/**", ":(glob)gone/**", ":(glob)*", ":(glob)w\\*ld/*"]);
    }

    #[test]
    fn paths_within_directories() {
        assert!(within(b"a/b", b"a"));
        assert!(within(b"a", b"a"));
        assert!(!within(b"ab", b"a"));
        assert!(within(b"x", b""));
        assert_eq!(join(b"", b"x"), b"x");
        assert_eq!(join(b"a", b"x"), b"a/x");
    }
}

#[cfg(test)]
#[cfg(target_os = "linux")]
mod budget_tests {
    use super::*;

    /// A project with `n` folders and its shadow store.
    fn project(n: usize) -> (tempfile::TempDir, Git) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("p");
        for i in 0..n {
            std::fs::create_dir_all(root.join(format!("d{i}"))).unwrap();
        }
        let git = Git { bin: "git".into(), shadow: dir.path().join("s"), root };
        crate::changes::store::init(&git, None).unwrap();
        (dir, git)
    }

    #[test]
    fn watches_stay_within_their_share_and_give_it_back() {
        let (_d, git) = project(4);
        // The root and 4 folders: 5 watches.
        let budget = Budget::new(4, 2, 16);
        let err = Watch::start(&git, &budget).unwrap_err().to_string();
        assert!(err.contains("fs.inotify.max_user_watches = 16"), "{err}");
        assert_eq!(budget.dirs.load(Ordering::Acquire), 4, "a failed start gives everything back");
        assert_eq!(budget.watches.load(Ordering::Acquire), 2);

        let budget = Budget::new(10, 1, 40);
        let w = Watch::start(&git, &budget).unwrap();
        assert_eq!(budget.dirs.load(Ordering::Acquire), 5);
        let err = Watch::start(&git, &budget).unwrap_err().to_string();
        assert!(err.contains("as many projects"), "{err}");
        drop(w);
        assert_eq!(budget.dirs.load(Ordering::Acquire), 10);
        assert_eq!(budget.watches.load(Ordering::Acquire), 1);
    }

    #[test]
    fn a_folder_moved_away_gives_its_watches_back() {
        let (d, git) = project(2);
        std::fs::create_dir_all(git.root.join("d0/sub")).unwrap();
        let budget = Budget::new(10, 1, 40);
        let mut w = Watch::start(&git, &budget).unwrap();
        assert_eq!(budget.dirs.load(Ordering::Acquire), 6);
        std::fs::rename(git.root.join("d0"), d.path().join("outside")).unwrap();
        match w.drain() {
            Seen::Some { deep, .. } => assert!(deep.contains(b"d0".as_slice())),
            other => panic!("{other:?}"),
        }
        assert_eq!(budget.dirs.load(Ordering::Acquire), 8, "d0 and d0/sub are no longer watched");
        std::fs::write(d.path().join("outside/sub/f"), "x").unwrap();
        assert_eq!(w.drain(), Seen::Nothing, "what happens outside the project is not seen");
    }
}
