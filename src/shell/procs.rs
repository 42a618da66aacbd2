//! Process hygiene: tracking, finding and killing every process a shell session started, without
//! trusting anything a command can change (its environment, its session, its process group).
//!
//! # Groups
//! Every unit of processes (a persistent shell session, a one-shot run, a PTY run, an rc capture)
//! is a [`Group`]. Two mechanisms find a group's processes; both always run, so either one alone
//! is enough:
//!
//! * **cgroup v2** (where the backend may create one): at the first group the backend creates
//!   `<its own cgroup>/agent-bash-<pid>-<n>` (pure v2 at `/sys/fs/cgroup`, hybrid at
//!   `/sys/fs/cgroup/unified`, or a delegated systemd user scope: whatever `/proc/self/cgroup`
//!   and `/proc/self/mountinfo` name, if we can create a directory there, it has `cgroup.kill`,
//!   and we may write our own `cgroup.procs`), and one child cgroup per group. A pipe shell joins
//!   its cgroup between `fork` and `exec` (a `pre_exec` write of `0` to `cgroup.procs`); a PTY
//!   run's shell joins as its first statement (portable-pty offers no hook), before it can start
//!   anything. Nothing a process does without privileges takes it out: `setsid`, `env -i`,
//!   double forks all stay inside. The kill ends with `cgroup.kill`, which the kernel applies
//!   atomically against concurrent forks. `AGENT_BASH_NO_CGROUP=1` turns this off (the tests
//!   use it to prove the fallback on its own).
//! * **Fallback: subreapers, process trees and start times.** A pipe shell is made a child
//!   subreaper (`PR_SET_CHILD_SUBREAPER` in `pre_exec`; the flag survives `exec`), so an orphan
//!   of its tree (`(setsid env -i sleep 1000 &)`) is re-parented to the shell, not to init:
//!   while the shell lives, its whole tree is its descendants, walked through the kernel's
//!   per-task `children` lists. Every process a walk finds is remembered by `(pid, start time)`
//!   (`/proc/PID/stat` field 22, so a reused pid is never mistaken for it), and later walks start
//!   from every remembered process that is still alive too: when the shell dies first, what it
//!   held re-parents to the backend (itself a subreaper) and is still found. Orphans adopted by
//!   the backend that no walk saw (born and orphaned between two walks, or escapees of a PTY
//!   run, whose shell cannot be a subreaper) are attributed to a group being killed when they
//!   were born after the group's root: an adopted orphan always belongs to some group whose
//!   holder died, and killing it is what the contract asks. A PTY run also takes every process
//!   of its terminal session.
//!
//! # The kill ladder
//! SIGTERM to every member and its process group, [`KILL_GRACE`] to exit (re-collecting, to
//! catch late forks), then rounds of: `cgroup.kill`; *freeze* (SIGSTOP every member, walk again
//! from the stopped ones, until a walk finds nothing new: a stopped process cannot fork); SIGKILL.
//! It returns when no member is alive and the cgroup is empty, then removes the cgroup.
//!
//! # A backend that dies (SIGKILL, OOM)
//! A watchdog process ([`run_watchdog`]) holds the read end of a pipe whose write end only the
//! backend has; EOF means the backend is gone, whatever killed it. The backend tells it, over the
//! same pipe, the `(pid, start time)` of every group root at spawn and of every member a walk
//! finds (walks run after each pipe command and every [`SCAN_EVERY`] while groups exist, in
//! fallback mode only). On EOF the watchdog applies `cgroup.kill` to the backend's parent
//! cgroup (all groups at once, exact), then freezes and SIGKILLs the trees of every reported
//! process still alive (start time checked), and every process still carrying the backend's
//! `AGENT_BASH_OWNER` mark; then removes the cgroup directories. The fallback's one window: a
//! process born and orphaned less than [`SCAN_EVERY`] before the backend died, by a shell that
//! was idle (a busy shell stays alive, and a subreaper, until its command ends) and with its
//! environment cleared, can outlive the backend. With cgroup v2 there is no window.
//!
//! tokio reaps its own children, so we only ever `waitpid` pids that it does not own
//! ([`spawn_owned`]); [`reap_adopted`] collects adopted orphans.
//!
//! # Off Linux (and with `AGENT_BASH_PORTABLE=1`)
//! No cgroups and no subreaper: [`Group`]s are found by process groups, a descendant walk over
//! one `ps` listing (`portable.rs`: pid, parent, group, state, start time to the second; the
//! session from `getsid`) and the members earlier walks remembered; a PTY run also takes every
//! process of its terminal session. What is weaker (README, "Platforms"): an orphan that left
//! its session (`setsid`) and whose parent died before any walk saw it is re-parented to
//! init/launchd, not to us, and is out of reach unless it still carries the `AGENT_BASH_OWNER`
//! mark, which the shutdown sweep and the watchdog look for in what `ps` shows of environments.

#[cfg(target_os = "linux")]
mod linux;
mod portable;

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::Write;
#[cfg(target_os = "linux")]
use std::os::fd::AsRawFd;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// How long processes get between SIGTERM and SIGKILL (contract §5).
pub const KILL_GRACE: Duration = Duration::from_millis(500);
/// A kill re-checks whether its processes are gone after this long, doubling up to
/// [`KILL_POLL_MAX`]: most trees die within a millisecond of SIGTERM, and a cancel should
/// answer as soon as they have.
const KILL_POLL_MIN: Duration = Duration::from_micros(250);
const KILL_POLL_MAX: Duration = Duration::from_millis(16);
/// How long a kill waits for a killed cgroup to report itself empty.
const CGROUP_EMPTY_WAIT: Duration = Duration::from_secs(2);
/// Fallback mode: how often the backend walks its groups and reports new members to the
/// watchdog.
pub const SCAN_EVERY: Duration = Duration::from_millis(250);

/// Environment variable naming the backend that started a process (a hint for the watchdog;
/// nothing depends on it alone).
pub const OWNER_VAR: &str = "AGENT_BASH_OWNER";
/// Set to anything but `0` or empty: do not use cgroups (the fallback path alone).
pub const NO_CGROUP_VAR: &str = "AGENT_BASH_NO_CGROUP";

/// What a process looks like in `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcInfo {
    pub pid: i32,
    pub ppid: i32,
    pub pgrp: i32,
    /// The session id (`/proc` on Linux, `getsid` on the portable paths).
    pub session: i32,
    /// Start time in clock ticks after boot (field 22): with the pid, a process's identity.
    pub start: u64,
    pub zombie: bool,
}

/// The process `pid` if it is alive and still the one that started at `start`.
// The portable paths ask for many at once ([`living`]).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn alive(pid: i32, start: u64) -> Option<ProcInfo> {
    proc_info(pid).filter(|i| !i.zombie && i.start == start)
}

/// Where a process table comes from: `/proc` (Linux) or `ps` (the portable twin, and every
/// other Unix; README, "Platforms").
#[cfg(target_os = "linux")]
fn native() -> bool {
    !crate::platform::portable()
}

/// The process `pid`; `None` when it is gone.
pub fn proc_info(pid: i32) -> Option<ProcInfo> {
    #[cfg(target_os = "linux")]
    if native() {
        return linux::proc_info(pid);
    }
    portable::proc_info(pid)
}

/// Every process currently visible.
pub fn all_procs() -> Vec<ProcInfo> {
    #[cfg(target_os = "linux")]
    if native() {
        return linux::all_procs();
    }
    portable::all_procs()
}

/// Live processes whose environment holds exactly `entry` (`NAME=value`), never `exclude`.
fn marked(entry: &str, exclude: &HashSet<i32>) -> Vec<i32> {
    #[cfg(target_os = "linux")]
    if native() {
        return linux::marked(entry, exclude);
    }
    portable::marked(entry, exclude)
}

/// Direct children of `pid`; `None` when the system does not list them (then a walk scans the
/// whole table once).
fn children_of(pid: i32) -> Option<Vec<i32>> {
    #[cfg(target_os = "linux")]
    if native() {
        return linux::children_of(pid);
    }
    let _ = pid;
    None
}

/// The processes of group `pgrp` with their state and wait channel, as `ps` shows them (one
/// run): the portable paths' look at what a terminal's foreground group waits for.
pub fn wait_channels(pgrp: i32) -> Vec<(i32, String, String)> {
    portable::wait_channels(pgrp)
}

/// The state and wait channel of `pid`, as `ps` shows them.
pub fn wait_channel(pid: i32) -> Option<(String, String)> {
    portable::wait_channel(pid)
}

/// Whether this process is a child subreaper (orphans of its descendants re-parent to it).
/// Only Linux has them.
fn is_subreaper() -> bool {
    #[cfg(target_os = "linux")]
    if native() {
        return linux::is_subreaper();
    }
    false
}

/// The processes of `ids` (`(pid, start time)`) that are alive and still the ones that started
/// then: one look at the table for all of them (one `ps` run on the portable paths).
fn living(ids: &[(i32, u64)]) -> Vec<ProcInfo> {
    #[cfg(target_os = "linux")]
    if native() {
        return ids.iter().filter_map(|(p, s)| alive(*p, *s)).collect();
    }
    let wanted: HashSet<(i32, u64)> = ids.iter().copied().collect();
    let pids: Vec<i32> = ids.iter().map(|(p, _)| *p).collect();
    portable::table(Some(&pids))
        .into_iter()
        .filter(|i| !i.zombie && wanted.contains(&(i.pid, i.start)))
        .collect()
}

fn ids(procs: &[ProcInfo]) -> Vec<(i32, u64)> {
    procs.iter().map(|p| (p.pid, p.start)).collect()
}

/// Live processes that are `roots` or descend from them, never `exclude`. Walks the kernel's
/// `children` lists (the cost follows the size of the trees), or one scan of the whole process
/// table on kernels without them.
fn walk(roots: &[i32], exclude: &HashSet<i32>) -> Vec<ProcInfo> {
    if let Some(found) = walk_children(roots, exclude) {
        return found;
    }
    walk_table(roots, exclude, all_procs())
}

/// [`walk`] over a listing of the whole table, `procs`.
fn walk_table(roots: &[i32], exclude: &HashSet<i32>, procs: Vec<ProcInfo>) -> Vec<ProcInfo> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for p in &procs {
        children.entry(p.ppid).or_default().push(p.pid);
    }
    let mut stack = roots.to_vec();
    let mut wanted = HashSet::new();
    while let Some(pid) = stack.pop() {
        if !exclude.contains(&pid) && wanted.insert(pid) {
            stack.extend(children.get(&pid).into_iter().flatten().copied());
        }
    }
    procs.into_iter().filter(|p| !p.zombie && wanted.contains(&p.pid)).collect()
}

/// One listing of the whole process table for everything a group's walk asks (the portable
/// paths: one `ps` run instead of one per question); `None` on Linux, whose `/proc` answers
/// each question on its own.
fn snapshot() -> Option<Vec<ProcInfo>> {
    #[cfg(target_os = "linux")]
    if native() {
        return None;
    }
    Some(portable::all_procs())
}

fn walk_children(roots: &[i32], exclude: &HashSet<i32>) -> Option<Vec<ProcInfo>> {
    let mut stack = roots.to_vec();
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    while let Some(pid) = stack.pop() {
        if exclude.contains(&pid) || !seen.insert(pid) {
            continue;
        }
        if let Some(info) = proc_info(pid) {
            if !info.zombie {
                out.push(info);
            }
            stack.extend(children_of(pid)?);
        }
    }
    Some(out)
}

/// Pids never to signal: the backend itself and its watchdog.
fn untouchable() -> HashSet<i32> {
    let mut set = HashSet::from([std::process::id() as i32]);
    let w = WATCHDOG_PID.load(Ordering::Relaxed);
    if w > 0 {
        set.insert(w);
    }
    set.extend(spared().lock().map(|s| s.clone()).unwrap_or_default());
    set
}

fn spared() -> &'static Mutex<HashSet<i32>> {
    static SPARED: OnceLock<Mutex<HashSet<i32>>> = OnceLock::new();
    SPARED.get_or_init(Mutex::default)
}

/// A child of ours that serves others and outlives us (a project's receipt engine): never
/// killed as an orphan by [`sweep`] when the backend shuts down.
pub fn spare(pid: u32) {
    if let Ok(mut s) = spared().lock() {
        s.insert(pid as i32);
    }
}

fn signal_all(procs: &[ProcInfo], sig: i32) {
    // SAFETY: plain syscall.
    let my_pgrp = unsafe { libc::getpgrp() };
    let groups: HashSet<i32> =
        procs.iter().map(|p| p.pgrp).filter(|&g| g > 1 && g != my_pgrp).collect();
    for g in groups {
        // SAFETY: plain syscall; a stale group only yields ESRCH.
        unsafe { libc::kill(-g, sig) };
    }
    signal_pids(procs, sig);
}

/// Whether `pid` ignores or blocks SIGTERM (`SigIgn`, `SigBlk` in `/proc/<pid>/status`).
#[allow(clippy::disallowed_methods)] // /proc and cgroupfs reads: kernel tables, not disk
fn deaf_to_term(pid: i32) -> bool {
    let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else { return false };
    let bit = 1u64 << (libc::SIGTERM - 1);
    status.lines().any(|l| {
        let mask = l.strip_prefix("SigIgn:").or_else(|| l.strip_prefix("SigBlk:"));
        mask.and_then(|m| u64::from_str_radix(m.trim(), 16).ok()).is_some_and(|m| m & bit != 0)
    })
}

fn signal_pids(procs: &[ProcInfo], sig: i32) {
    // Checked just before: a pid reused since the walk is left alone (a tiny window).
    for p in living(&ids(procs)) {
        // SAFETY: plain syscall.
        unsafe { libc::kill(p.pid, sig) };
    }
}

/// Stops every process `find` returns, then walks again (from the stopped ones too) until a walk
/// finds nothing new: stopped processes cannot fork, so the result is the whole tree.
fn freeze(find: &dyn Fn(&[i32]) -> Vec<ProcInfo>) -> Vec<ProcInfo> {
    let mut frozen: HashMap<i32, ProcInfo> = HashMap::new();
    for _ in 0..64 {
        let extra: Vec<i32> = frozen.keys().copied().collect();
        let new: Vec<ProcInfo> =
            find(&extra).into_iter().filter(|p| !frozen.contains_key(&p.pid)).collect();
        if new.is_empty() {
            break;
        }
        signal_pids(&new, libc::SIGSTOP);
        frozen.extend(new.into_iter().map(|p| (p.pid, p)));
    }
    frozen.into_values().collect()
}

// ---------------------------------------------------------------------------------------------
// cgroup v2

/// Where this backend's groups live, decided once per process.
struct Tracker {
    /// `<own cgroup>/agent-bash-<pid>-<n>`, parent of one cgroup per group; `None`: fallback.
    cgroup: Option<PathBuf>,
    /// Which path tracks processes, in words (logs, tests).
    mode: String,
    groups: Mutex<HashMap<u64, Weak<Inner>>>,
    next: AtomicU64,
}

fn tracker() -> &'static Tracker {
    static TRACKER: OnceLock<Tracker> = OnceLock::new();
    TRACKER.get_or_init(|| {
        let (cgroup, mode) = linux_tracking().unwrap_or_else(|| {
            let how = "portable: process groups and a ps walk, no subreaper";
            (None, format!("{how} ({})", crate::platform::describe()))
        });
        tracing::info!("process tracking: {mode}");
        Tracker { cgroup, mode, groups: Mutex::new(HashMap::new()), next: AtomicU64::new(1) }
    })
}

/// Linux's tracking: a cgroup v2 of our own, else subreapers and process trees; `None` on the
/// portable paths.
#[cfg(target_os = "linux")]
fn linux_tracking() -> Option<(Option<PathBuf>, String)> {
    if !native() {
        return None;
    }
    Some(match create_parent_cgroup() {
        Ok(dir) => {
            let mode = format!("cgroup v2 ({})", dir.display());
            (Some(dir), mode)
        }
        Err(why) => (None, format!("fallback: subreapers and process trees ({why})")),
    })
}

#[cfg(not(target_os = "linux"))]
fn linux_tracking() -> Option<(Option<PathBuf>, String)> {
    None
}

/// Which path tracks processes: `cgroup v2 (<dir>)`, `fallback: … (<why not cgroups>)` or
/// `portable: … (<platform>)`.
pub fn tracking_mode() -> &'static str {
    &tracker().mode
}

/// The cgroup of `pid` when it is one of our groups' own (a shell session's), so that its
/// statistics are the session's and nobody else's; `None` on the fallback path.
#[allow(clippy::disallowed_methods)] // /proc and cgroupfs reads: kernel tables, not disk
pub fn session_cgroup_of(pid: i32) -> Option<PathBuf> {
    let parent = tracker().cgroup.as_ref()?;
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    // Our groups are `<parent>/g<id>`: the process's cgroup path ends with the parent's name and
    // one more component.
    let (dir_rel, name) = rel.rsplit_once('/')?;
    let parent_name = parent.file_name()?.to_str()?;
    if !name.starts_with('g') || !dir_rel.ends_with(&format!("/{parent_name}")) {
        return None;
    }
    let dir = parent.join(name);
    dir.is_dir().then_some(dir)
}

/// Why processes are tracked without a cgroup of their own ([`tracking_mode`]).
#[cfg(target_os = "linux")]
#[derive(Debug, thiserror::Error)]
enum NoCgroup {
    #[error("{} is set", NO_CGROUP_VAR)]
    Disabled,
    #[error("/proc/self/cgroup: {0}")]
    ReadOwn(std::io::Error),
    #[error("no cgroup v2 hierarchy in /proc/self/cgroup")]
    NoHierarchy,
    #[error("mountinfo: {0}")]
    ReadMounts(std::io::Error),
    #[error("no cgroup2 mount")]
    NoMount,
    #[error("cgroup path has a NUL")]
    Nul,
    #[error("{} is not writable", .0.display())]
    NotWritable(PathBuf),
    #[error("cannot create a cgroup in {}: {source}", .dir.display())]
    Create { dir: PathBuf, source: std::io::Error },
    #[error("no cgroup.kill (Linux < 5.14)")]
    NoKill,
}

/// Our own cgroup v2 directory: `/proc/self/cgroup`'s `0::<path>` under the cgroup2 mount.
#[cfg(target_os = "linux")]
#[allow(clippy::disallowed_methods)] // /proc and cgroupfs reads: kernel tables, not disk
fn own_cgroup_dir() -> Result<PathBuf, NoCgroup> {
    let text = fs::read_to_string("/proc/self/cgroup").map_err(NoCgroup::ReadOwn)?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::")).ok_or(NoCgroup::NoHierarchy)?;
    let mounts = fs::read_to_string("/proc/self/mountinfo").map_err(NoCgroup::ReadMounts)?;
    for line in mounts.lines() {
        // `id parent dev root mountpoint opts… - fstype source superopts`
        let Some((left, right)) = line.split_once(" - ") else { continue };
        if right.split_ascii_whitespace().next() != Some("cgroup2") {
            continue;
        }
        let f: Vec<&str> = left.split_ascii_whitespace().collect();
        let (Some(root), Some(point)) = (f.get(3), f.get(4)) else { continue };
        // A mount of a sub-tree (a container's namespace) shows paths below its root.
        let Some(below) = rel.strip_prefix(root.trim_end_matches('/')) else { continue };
        return Ok(Path::new(point).join(below.trim_start_matches('/')));
    }
    Err(NoCgroup::NoMount)
}

#[cfg(target_os = "linux")]
fn create_parent_cgroup() -> Result<PathBuf, NoCgroup> {
    if std::env::var_os(NO_CGROUP_VAR).is_some_and(|v| !v.is_empty() && v != "0") {
        return Err(NoCgroup::Disabled);
    }
    let own = own_cgroup_dir()?;
    // Moving a process from our cgroup into a child needs write access to our cgroup.procs.
    let procs = own.join("cgroup.procs");
    let c =
        std::ffi::CString::new(procs.as_os_str().as_encoded_bytes()).map_err(|_| NoCgroup::Nul)?;
    // SAFETY: valid C string.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK) } != 0 {
        return Err(NoCgroup::NotWritable(procs));
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = own.join(format!("agent-bash-{}-{t:x}", std::process::id()));
    fs::create_dir(&dir).map_err(|source| NoCgroup::Create { dir: own.clone(), source })?;
    if !dir.join("cgroup.kill").exists() {
        let _ = fs::remove_dir(&dir);
        return Err(NoCgroup::NoKill);
    }
    extern "C" fn remove_at_exit() {
        if let Some(dir) = tracker().cgroup.as_deref() {
            remove_cgroup_tree(dir);
        }
    }
    // SAFETY: registers a plain function; it only removes (empty) directories.
    unsafe { libc::atexit(remove_at_exit) };
    Ok(dir)
}

/// Pids in a cgroup and its descendants.
#[allow(clippy::disallowed_methods)] // /proc and cgroupfs reads: kernel tables, not disk
pub fn cgroup_pids(dir: &Path) -> Vec<i32> {
    let mut out: Vec<i32> = fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .split_ascii_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect();
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(cgroup_pids(&e.path()));
            }
        }
    }
    out
}

#[allow(clippy::disallowed_methods)] // /proc and cgroupfs reads: kernel tables, not disk
fn cgroup_populated(dir: &Path) -> bool {
    match fs::read_to_string(dir.join("cgroup.events")) {
        Ok(text) => text.lines().any(|l| l == "populated 1"),
        Err(_) => false,
    }
}

/// SIGKILLs everything in the cgroup and below (atomic against forks) and waits, bounded, until
/// it is empty.
// Polls and sleeps: from the kill ladder, the `cgroup-rm` thread and the watchdog.
#[allow(clippy::disallowed_methods)]
fn cgroup_kill(dir: &Path, wait: Duration) {
    if !cgroup_populated(dir) {
        return;
    }
    if let Err(e) = fs::write(dir.join("cgroup.kill"), "1") {
        tracing::debug!("cgroup.kill in {}: {e}", dir.display());
        return;
    }
    let end = Instant::now() + wait;
    let mut poll = KILL_POLL_MIN;
    while cgroup_populated(dir) && Instant::now() < end {
        std::thread::sleep(poll);
        poll = (poll * 2).min(KILL_POLL_MAX);
    }
}

/// Removes a cgroup and its children (deepest first); busy ones stay.
// Cgroupfs (kernel, not disk): from the kill ladder, the `cgroup-rm` thread and the watchdog.
#[allow(clippy::disallowed_methods)]
fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = fs::remove_dir(dir);
}

// ---------------------------------------------------------------------------------------------
// Groups

/// One unit of processes: a shell session, a one-shot run, a PTY run or an rc capture. Killing
/// it ([`Group::kill`]) ends every process it started, wherever they went; dropping it kills
/// what is left without a grace.
#[derive(Debug)]
pub struct Group {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    cgroup: Option<PathBuf>,
    /// `(pid, start)` of the process spawned for the group.
    root: Mutex<Option<(i32, u64)>>,
    /// Also every process of the root's terminal session (PTY runs).
    session: bool,
    /// The root's [`ProcInfo::session`], once it started.
    session_key: AtomicI32,
    /// Every member ever found, by pid → start time; dead ones are dropped at each walk.
    seen: Mutex<HashMap<i32, u64>>,
    id: u64,
}

impl Group {
    /// A new group; `session`: the root leads a terminal session whose processes are members.
    pub fn new(session: bool) -> Group {
        let t = tracker();
        let id = t.next.fetch_add(1, Ordering::Relaxed);
        let cgroup = t.cgroup.as_ref().and_then(|parent| {
            let dir = parent.join(format!("g{id}"));
            match fs::create_dir(&dir) {
                Ok(()) => Some(dir),
                Err(e) => {
                    tracing::warn!("cannot create cgroup {}: {e}", dir.display());
                    None
                }
            }
        });
        let inner = Arc::new(Inner {
            cgroup,
            root: Mutex::new(None),
            session,
            session_key: AtomicI32::new(0),
            seen: Mutex::new(HashMap::new()),
            id,
        });
        if let Ok(mut groups) = t.groups.lock() {
            groups.retain(|_, g| g.strong_count() > 0);
            groups.insert(id, Arc::downgrade(&inner));
        }
        Group { inner }
    }

    /// The group's cgroup directory, when cgroups are in use.
    pub fn cgroup(&self) -> Option<&Path> {
        self.inner.cgroup.as_deref()
    }

    /// Makes the child spawned by `cmd` a subreaper in this group's cgroup (both done between
    /// `fork` and `exec`). Keep the returned fd until the spawn returned.
    // Opens `cgroup.procs` on cgroupfs (kernel, not disk) at each spawn.
    #[allow(clippy::disallowed_methods)]
    pub fn prepare(&self, cmd: &mut std::process::Command) -> Option<OwnedFd> {
        #[cfg(target_os = "linux")]
        if native() {
            return self.prepare_linux(cmd);
        }
        // Portable: no subreaper and no cgroup, so no hook (the spawn keeps posix_spawn).
        let _ = cmd;
        None
    }

    #[cfg(target_os = "linux")]
    #[allow(clippy::disallowed_methods)] // see `prepare`
    fn prepare_linux(&self, cmd: &mut std::process::Command) -> Option<OwnedFd> {
        use std::os::unix::process::CommandExt;
        let file =
            self.inner.cgroup.as_ref().and_then(|dir| {
                fs::OpenOptions::new().write(true).open(dir.join("cgroup.procs")).ok()
            });
        let fd = file.as_ref().map_or(-1, |f| f.as_raw_fd());
        let hook = move || {
            // SAFETY: async-signal-safe syscalls only (prctl, write), no allocation. Failures
            // are ignored: the fallback tracking still covers the child.
            unsafe {
                libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
                if fd >= 0 {
                    libc::write(fd, b"0".as_ptr().cast(), 1);
                }
            }
            Ok(())
        };
        // SAFETY: the hook only makes async-signal-safe calls (see above).
        unsafe { cmd.pre_exec(hook) };
        file.map(OwnedFd::from)
    }

    /// A first shell statement that moves the shell into the group's cgroup (for spawns without
    /// a `pre_exec` hook: PTY runs), ending in `;` so the command's lines keep their numbers.
    /// Empty without a cgroup.
    pub fn join_statement(&self) -> String {
        match &self.inner.cgroup {
            Some(dir) => format!(
                "printf 0 2>/dev/null >{};",
                crate::project::quote(&dir.join("cgroup.procs").to_string_lossy())
            ),
            None => String::new(),
        }
    }

    /// The `cgroup.procs` file [`Group::join_statement`] writes, when there is a cgroup.
    pub fn procs_file(&self) -> Option<std::path::PathBuf> {
        self.inner.cgroup.as_ref().map(|dir| dir.join("cgroup.procs"))
    }

    /// Records the spawned root process (and tells the watchdog).
    pub fn started(&self, pid: i32) {
        if let Some(info) = proc_info(pid) {
            if let Ok(mut root) = self.inner.root.lock() {
                *root = Some((pid, info.start));
            }
            self.inner.session_key.store(info.session, Ordering::Relaxed);
            report(&[(pid, info.start)]);
        }
    }

    /// The group's live processes (never the backend or its watchdog).
    pub fn members(&self) -> Vec<ProcInfo> {
        self.inner.members(&[])
    }

    /// Fallback mode: walks the group and tells the watchdog about members it has not heard of.
    pub fn note(&self) {
        if tracker().cgroup.is_none() {
            self.inner.members(&[]);
        }
    }

    /// The kill ladder (see the module docs); returns when nothing of the group is alive.
    /// Blocking: call from a blocking thread.
    pub fn kill_blocking(&self, grace: Duration) {
        self.inner.kill_blocking(grace);
    }

    /// [`Group::kill_blocking`] on a blocking thread.
    pub async fn kill(&self, grace: Duration) {
        let inner = self.inner.clone();
        let _ = tokio::task::spawn_blocking(move || inner.kill_blocking(grace)).await;
    }
}

impl Drop for Group {
    // Cgroupfs writes (kernel, not disk); the bounded wait goes to the `cgroup-rm` thread.
    #[allow(clippy::disallowed_methods)]
    fn drop(&mut self) {
        // Normally killed already: then this finds nothing. Otherwise no grace, and the wait for
        // the cgroup to empty (so it can be removed) happens on a thread of its own.
        let mut busy = false;
        if let Some(dir) = &self.inner.cgroup {
            if cgroup_populated(dir) {
                let _ = fs::write(dir.join("cgroup.kill"), "1");
                busy = true;
            }
        }
        let left = self.inner.members(&[]);
        signal_pids(&left, libc::SIGKILL);
        if let Some(dir) = self.inner.cgroup.clone() {
            if busy {
                let spawned =
                    std::thread::Builder::new().name("cgroup-rm".into()).spawn(move || {
                        cgroup_kill(&dir, CGROUP_EMPTY_WAIT);
                        remove_cgroup_tree(&dir);
                    });
                // Without a thread, the parent's removal at exit (or the watchdog's) gets it.
                drop(spawned);
            } else {
                remove_cgroup_tree(&dir);
            }
        }
        if let Ok(mut groups) = tracker().groups.lock() {
            groups.remove(&self.inner.id);
        }
    }
}

impl Inner {
    /// Walks from the root, the cgroup's pids, every remembered member, the session (PTY) and
    /// adopted orphans born after the root, plus `extra`; remembers (and reports) what it finds.
    fn members(&self, extra: &[i32]) -> Vec<ProcInfo> {
        let root = self.root.lock().ok().and_then(|r| *r);
        let snap = snapshot();
        let living_of = |ids: &[(i32, u64)]| -> HashSet<(i32, u64)> {
            let live = match &snap {
                Some(table) => table
                    .iter()
                    .filter(|p| !p.zombie && ids.contains(&(p.pid, p.start)))
                    .copied()
                    .collect(),
                None => living(ids),
            };
            live.into_iter().map(|p| (p.pid, p.start)).collect()
        };
        let mut roots: Vec<i32> = extra.to_vec();
        if let Some(id) = root {
            roots.extend(living_of(&[id]).into_iter().map(|(p, _)| p));
        }
        if let Some(dir) = &self.cgroup {
            roots.extend(cgroup_pids(dir));
        }
        let known: Vec<(i32, u64)> = match self.seen.lock() {
            Ok(s) => s.iter().map(|(p, s)| (*p, *s)).collect(),
            Err(_) => Vec::new(),
        };
        let known_alive = living_of(&known);
        roots.extend(known_alive.iter().map(|(p, _)| *p));
        if let Some((_, born)) = root {
            roots.extend(adopted_orphans().into_iter().filter(|o| o.start >= born).map(|o| o.pid));
        }
        let exclude = untouchable();
        let walk_from = |roots: &[i32]| match &snap {
            Some(table) => walk_table(roots, &exclude, table.clone()),
            None => walk(roots, &exclude),
        };
        let mut found = walk_from(&roots);
        if self.session {
            let sid = self.session_key.load(Ordering::Relaxed);
            if root.is_some() && sid > 1 {
                let have: HashSet<i32> = found.iter().map(|p| p.pid).collect();
                let more: Vec<i32> = snap
                    .clone()
                    .unwrap_or_else(all_procs)
                    .into_iter()
                    .filter(|p| p.session == sid && !p.zombie && !have.contains(&p.pid))
                    .map(|p| p.pid)
                    .collect();
                found.extend(walk_from(&more));
            }
        }
        let mut uniq = HashSet::new();
        found.retain(|p| uniq.insert(p.pid));
        let mut new = Vec::new();
        if let Ok(mut seen) = self.seen.lock() {
            seen.retain(|p, s| known_alive.contains(&(*p, *s)));
            for p in &found {
                if seen.insert(p.pid, p.start) != Some(p.start) {
                    new.push((p.pid, p.start));
                }
            }
        }
        report(&new);
        found
    }

    // The kill ladder polls and sleeps: async callers use `Group::kill` (spawn_blocking).
    #[allow(clippy::disallowed_methods)]
    fn kill_blocking(&self, grace: Duration) {
        let deadline = Instant::now() + grace;
        let mut procs = self.members(&[]);
        let mut poll = KILL_POLL_MIN;
        'grace: while !procs.is_empty() && Instant::now() < deadline {
            signal_all(&procs, libc::SIGTERM);
            loop {
                procs = living(&ids(&procs));
                let now = Instant::now();
                if procs.is_empty() || now >= deadline {
                    break;
                }
                // Every process left ignores or blocks SIGTERM (`trap '' TERM` in the shell is
                // inherited by what it starts): the grace cannot end any of them, so it is not
                // waited out (issue 29: such a session took 0.5 s to close).
                if procs.iter().all(|p| deaf_to_term(p.pid)) {
                    break 'grace;
                }
                std::thread::sleep(poll.min(deadline - now));
                poll = (poll * 2).min(KILL_POLL_MAX);
            }
            if Instant::now() >= deadline {
                break;
            }
            procs = self.members(&[]);
        }
        // Past the grace (or nothing left): cgroup.kill, then freeze and SIGKILL what any walk
        // still finds, until nothing is left (processes may fork while dying).
        for _ in 0..50 {
            if let Some(dir) = &self.cgroup {
                cgroup_kill(dir, CGROUP_EMPTY_WAIT);
            }
            let procs = freeze(&|extra| self.members(extra));
            if procs.is_empty() {
                break;
            }
            signal_pids(&procs, libc::SIGKILL);
            std::thread::sleep(KILL_POLL_MIN * 4);
        }
        if let Some(dir) = &self.cgroup {
            remove_cgroup_tree(dir);
        }
    }
}

/// Children of the backend that nobody spawned: orphans re-parented to it (the subreaper).
fn adopted_orphans() -> Vec<ProcInfo> {
    if !is_subreaper() {
        // Nothing is ever re-parented to us: every child was spawned by someone here (a test
        // harness spawns its own) and is none of our business.
        return Vec::new();
    }
    let me = std::process::id() as i32;
    let Some(children) = children_of(me) else {
        return all_procs().into_iter().filter(|p| p.ppid == me && !p.zombie).collect();
    };
    let owned: HashSet<i32> = owned().lock().map(|s| s.clone()).unwrap_or_default();
    let exclude = untouchable();
    children
        .into_iter()
        .filter(|p| !owned.contains(p) && !exclude.contains(p))
        .filter_map(proc_info)
        .filter(|p| !p.zombie)
        .collect()
}

/// Kills every adopted orphan of the backend and, by a full scan, every process carrying the
/// `mark` (`NAME=value`): what may be left when the backend shuts down, after its groups.
// The kill ladder polls and sleeps: async callers use `sweep` (spawn_blocking).
#[allow(clippy::disallowed_methods)]
pub fn sweep_blocking(mark: Option<&str>, grace: Duration) {
    let exclude = untouchable();
    let find = |extra: &[i32]| {
        let mut roots: Vec<i32> = extra.to_vec();
        roots.extend(adopted_orphans().into_iter().map(|p| p.pid));
        if let Some(mark) = mark {
            roots.extend(marked(mark, &exclude));
        }
        walk(&roots, &exclude)
    };
    let procs = find(&[]);
    if !procs.is_empty() {
        signal_all(&procs, libc::SIGTERM);
        let end = Instant::now() + grace;
        while Instant::now() < end && !living(&ids(&procs)).is_empty() {
            std::thread::sleep(KILL_POLL_MAX);
        }
    }
    for _ in 0..50 {
        let procs = freeze(&find);
        if procs.is_empty() {
            break;
        }
        signal_pids(&procs, libc::SIGKILL);
        std::thread::sleep(KILL_POLL_MIN * 4);
    }
}

/// [`sweep_blocking`] on a blocking thread.
pub async fn sweep(mark: Option<String>, grace: Duration) {
    let _ = tokio::task::spawn_blocking(move || sweep_blocking(mark.as_deref(), grace)).await;
}

/// Fallback mode: walks every group every [`SCAN_EVERY`] so the watchdog hears of new members
/// (see the module docs). Returns at once with cgroups. Run it as a background task.
pub async fn scan_loop() {
    if tracker().cgroup.is_some() {
        return;
    }
    loop {
        tokio::time::sleep(SCAN_EVERY).await;
        let groups: Vec<Arc<Inner>> = match tracker().groups.lock() {
            Ok(g) => g.values().filter_map(Weak::upgrade).collect(),
            Err(_) => return,
        };
        if groups.is_empty() {
            continue;
        }
        let _ = tokio::task::spawn_blocking(move || {
            for g in groups {
                g.members(&[]);
            }
        })
        .await;
    }
}

// ---------------------------------------------------------------------------------------------
// Children the backend owns, adopted orphans

fn owned() -> &'static Mutex<HashSet<i32>> {
    static OWNED: OnceLock<Mutex<HashSet<i32>>> = OnceLock::new();
    OWNED.get_or_init(|| Mutex::new(HashSet::new()))
}

/// Spawns a child and records it as owned (tokio or std reaps it, [`reap_adopted`] must not)
/// with no gap: [`reap_adopted`] scans
/// under the same lock, so it runs either before the child exists or after it is recorded.
/// `pid_of` tells the new child's pid.
pub fn spawn_owned<T, E>(
    spawn: impl FnOnce() -> Result<T, E>,
    pid_of: impl FnOnce(&T) -> Option<i32>,
) -> Result<T, E> {
    let mut set = match owned().lock() {
        Ok(s) => s,
        Err(p) => p.into_inner(),
    };
    let child = spawn()?;
    if let Some(pid) = pid_of(&child) {
        set.insert(pid);
    }
    Ok(child)
}

/// Forgets a pid recorded with [`spawn_owned`] once its owner has reaped it.
pub fn disown_child(pid: i32) {
    if let Ok(mut set) = owned().lock() {
        set.remove(&pid);
    }
}

/// Reaps zombie children that were adopted (orphans re-parented to the subreaper backend).
/// Children that tokio owns are left alone: reaping them would steal their exit status.
pub fn reap_adopted() {
    if !is_subreaper() {
        // Nothing is ever re-parented to us (and a `ps` run per SIGCHLD would be wasted).
        return;
    }
    let me = std::process::id() as i32;
    // Held for the whole scan: see [`spawn_owned`].
    let owned = match owned().lock() {
        Ok(s) => s,
        Err(p) => p.into_inner(),
    };
    let pids = children_of(me).unwrap_or_else(|| {
        all_procs().into_iter().filter(|p| p.ppid == me).map(|p| p.pid).collect()
    });
    for pid in pids {
        if owned.contains(&pid) || pid == WATCHDOG_PID.load(Ordering::Relaxed) {
            continue;
        }
        if proc_info(pid).is_some_and(|i| i.ppid == me && i.zombie) {
            let mut status = 0;
            // SAFETY: waits for one specific adopted pid, without blocking.
            unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        }
    }
}

/// Makes the backend a child subreaper so that orphaned descendants stay ours to kill (Linux;
/// the portable paths have none).
pub fn become_subreaper() {
    #[cfg(target_os = "linux")]
    if native() {
        linux::set_subreaper();
    }
}

// ---------------------------------------------------------------------------------------------
// The watchdog

static WATCHDOG_PID: AtomicI32 = AtomicI32::new(0);

fn watchdog_pipe() -> &'static Mutex<Option<std::process::ChildStdin>> {
    static PIPE: OnceLock<Mutex<Option<std::process::ChildStdin>>> = OnceLock::new();
    PIPE.get_or_init(|| Mutex::new(None))
}

/// Tells the watchdog about processes to kill if the backend dies (`<pid> <start>` lines).
fn report(procs: &[(i32, u64)]) {
    if procs.is_empty() {
        return;
    }
    static BROKEN: AtomicBool = AtomicBool::new(false);
    if BROKEN.load(Ordering::Relaxed) {
        return;
    }
    let mut text = String::new();
    for (pid, start) in procs {
        text.push_str(&format!("{pid} {start}\n"));
    }
    if let Ok(mut pipe) = watchdog_pipe().lock() {
        if let Some(w) = pipe.as_mut() {
            if w.write_all(text.as_bytes()).is_err() {
                tracing::warn!("the watchdog is gone: a killed backend may leave processes");
                BROKEN.store(true, Ordering::Relaxed);
            }
        }
    }
}

/// The watchdog's body (`agent-bash __watchdog <owner> [--cgroup DIR]`): collects the
/// `<pid> <start>` lines the backend sends until EOF on stdin, i.e. until the backend exits for
/// any reason, then kills the backend's cgroup, the trees of the reported processes still alive
/// and every process carrying the owner's mark, and removes the cgroup directories.
// The watchdog is a process of its own (`agent-bash __watchdog`).
#[allow(clippy::disallowed_methods)]
pub fn run_watchdog(owner: &str, cgroup: Option<&Path>) -> i32 {
    use std::io::BufRead;
    let mut reported: HashMap<i32, u64> = HashMap::new();
    let mut prune_at = 1024;
    let stdin = std::io::stdin();
    let mut line = String::new();
    let mut lock = stdin.lock();
    loop {
        line.clear();
        match lock.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) => {
                let mut it = line.split_ascii_whitespace();
                if let (Some(Ok(pid)), Some(Ok(start))) =
                    (it.next().map(str::parse::<i32>), it.next().map(str::parse::<u64>))
                {
                    reported.insert(pid, start);
                }
                // Bounded: forget the dead once the table has doubled.
                if reported.len() >= prune_at {
                    let all: Vec<(i32, u64)> = reported.iter().map(|(p, s)| (*p, *s)).collect();
                    let live: HashSet<i32> = living(&all).into_iter().map(|p| p.pid).collect();
                    reported.retain(|p, _| live.contains(p));
                    prune_at = (reported.len() * 2).max(1024);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    // No grace: the backend is gone and nobody waits for output any more.
    if let Some(dir) = cgroup {
        cgroup_kill(dir, CGROUP_EMPTY_WAIT);
    }
    let mark = format!("{OWNER_VAR}={owner}");
    let me = std::process::id() as i32;
    let exclude = HashSet::from([me]);
    let find = |extra: &[i32]| {
        let mut roots: Vec<i32> = extra.to_vec();
        let all: Vec<(i32, u64)> = reported.iter().map(|(p, s)| (*p, *s)).collect();
        roots.extend(living(&all).into_iter().map(|p| p.pid));
        roots.extend(marked(&mark, &exclude));
        walk(&roots, &exclude)
    };
    for _ in 0..50 {
        let procs = freeze(&find);
        if procs.is_empty() {
            break;
        }
        signal_pids(&procs, libc::SIGKILL);
        std::thread::sleep(KILL_POLL_MIN * 4);
    }
    if let Some(dir) = cgroup {
        let end = Instant::now() + CGROUP_EMPTY_WAIT;
        while dir.exists() && Instant::now() < end {
            remove_cgroup_tree(dir);
            if dir.exists() {
                std::thread::sleep(KILL_POLL_MAX);
            }
        }
    }
    0
}

/// Starts the watchdog for this backend (see the module docs). The write end of its stdin pipe
/// is kept open for the life of the process and is close-on-exec, so only the backend's own
/// death closes it.
pub fn spawn_watchdog(owner: &str) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("__watchdog").arg(owner);
    if let Some(dir) = &tracker().cgroup {
        cmd.arg("--cgroup").arg(dir);
    }
    let mut child = cmd
        .env_remove(OWNER_VAR)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        // Its own group: a signal to the backend's group must not take the watchdog with it.
        .process_group(0)
        .spawn()?;
    WATCHDOG_PID.store(child.id() as i32, Ordering::Relaxed);
    if let Some(stdin) = child.stdin.take() {
        if let Ok(mut pipe) = watchdog_pipe().lock() {
            *pipe = Some(stdin);
        }
    }
    // Groups made before the watchdog existed.
    let groups: Vec<Arc<Inner>> = match tracker().groups.lock() {
        Ok(g) => g.values().filter_map(Weak::upgrade).collect(),
        Err(_) => Vec::new(),
    };
    for g in groups {
        let known: Vec<(i32, u64)> = g.root.lock().ok().and_then(|r| *r).into_iter().collect();
        report(&known);
        g.members(&[]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_a_hostile_name() {
        let me = proc_info(std::process::id() as i32).unwrap();
        assert_eq!(me.pid, std::process::id() as i32);
        assert!(me.start > 0 && !me.zombie);
        // A reused pid with another start time is not the same process.
        assert!(alive(me.pid, me.start + 1).is_none());
        assert!(alive(me.pid, me.start).is_some());
    }
}
