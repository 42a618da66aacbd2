//! Process hygiene: marking, finding and killing every process a shell session started.
//!
//! Every shell the backend spawns carries two environment variables, inherited by everything it
//! starts (including `setsid` and double-fork escapees, which leave the process group but keep
//! their environment): `AGENT_BASH_OWNER=<backend nonce>` and `AGENT_BASH_SHELL=<shell nonce>`.
//! A kill collects the shell's descendants (by parent pid) and every process whose initial
//! environment carries the shell's mark (`/proc/<pid>/environ`), then runs the ladder
//! SIGTERM → [`KILL_GRACE`] → SIGKILL on their process groups and pids.
//!
//! The backend is a child subreaper (`PR_SET_CHILD_SUBREAPER`), so orphans of its shells are
//! re-parented to it instead of init; [`reap_adopted`] collects their exit statuses. tokio reaps
//! its own children, so we only ever `waitpid` pids that tokio does not own ([`spawn_owned`]).
//!
//! A backend killed with SIGKILL cannot clean up after itself: a watchdog process
//! ([`run_watchdog`]) holds the read end of a pipe whose write end only the backend has; when it
//! reads EOF the backend is gone and it kills every process carrying the backend's owner mark.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long processes get between SIGTERM and SIGKILL (SPEC §5).
pub const KILL_GRACE: Duration = Duration::from_millis(500);
/// A kill re-checks whether its processes are gone after this long, doubling up to
/// [`KILL_POLL_MAX`]: most trees die within a millisecond of SIGTERM, and a cancel should
/// answer as soon as they have.
const KILL_POLL_MIN: Duration = Duration::from_micros(250);
const KILL_POLL_MAX: Duration = Duration::from_millis(16);

/// Environment variable naming the backend that started a process.
pub const OWNER_VAR: &str = "AGENT_BASH_OWNER";
/// Environment variable naming the shell session that started a process.
pub const SHELL_VAR: &str = "AGENT_BASH_SHELL";

/// What a process looks like in `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcInfo {
    pub pid: i32,
    pub ppid: i32,
    pub pgrp: i32,
    pub session: i32,
    pub zombie: bool,
}

/// Reads `/proc/<pid>/stat`; `None` when the process is gone.
pub fn proc_info(pid: i32) -> Option<ProcInfo> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may itself contain spaces or parentheses: the
    // fields we need come after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    let session = fields.next()?.parse().ok()?;
    Some(ProcInfo { pid, ppid, pgrp, session, zombie: state == "Z" || state == "X" })
}

/// Every process currently visible in `/proc`.
pub fn all_procs() -> Vec<ProcInfo> {
    let Ok(dir) = fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(proc_info)
        .collect()
}

/// True when `/proc/<pid>/environ` contains exactly `entry` (`NAME=value`).
fn environ_has(pid: i32, entry: &[u8]) -> bool {
    match fs::read(format!("/proc/{pid}/environ")) {
        Ok(env) => env.split(|&b| b == 0).any(|e| e == entry),
        Err(_) => false,
    }
}

/// Direct children of `pid`, from `/proc/<pid>/task/<tid>/children` (every thread's children:
/// a multi-threaded parent such as the backend spawns from several threads). `None` when the
/// kernel does not offer those files (CONFIG_PROC_CHILDREN); an exited process has none.
fn children_of(pid: i32) -> Option<Vec<i32>> {
    let tasks = match fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(t) => t,
        Err(_) => return Some(Vec::new()),
    };
    let mut out = Vec::new();
    for task in tasks.flatten() {
        let path = task.path().join("children");
        match fs::read_to_string(&path) {
            Ok(text) => {
                out.extend(text.split_ascii_whitespace().filter_map(|s| s.parse::<i32>().ok()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(_) => {}
        }
    }
    Some(out)
}

/// Live (non-zombie) processes that are `root` or descend from it, or carry `mark` in their
/// environment. Never includes the backend itself.
///
/// With a root, only the backend's own direct children are checked for the mark: an escapee
/// whose parent is alive is still a descendant of the root (`setsid` keeps the parent), and one
/// whose parent died was re-parented to the backend, the subreaper. The tree is walked through
/// the kernel's per-task `children` lists, so the cost follows the size of the tree, not of the
/// machine; reading every process's environment costs milliseconds on a busy machine, so the
/// full scan is kept for `root = None` (the watchdog and shutdown, when the backend may not be
/// the subreaper of what is left) and for kernels without `children` lists.
pub fn collect(root: Option<i32>, mark: Option<&str>) -> Vec<ProcInfo> {
    let me = std::process::id() as i32;
    if let Some(root) = root {
        if let Some(found) = collect_tree(me, root, mark) {
            return found;
        }
    }
    let procs = all_procs();
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for p in &procs {
        children.entry(p.ppid).or_default().push(p.pid);
    }
    let mut roots: Vec<i32> = root.into_iter().collect();
    if let Some(mark) = mark {
        let entry = mark.as_bytes();
        let owned: HashSet<i32> = owned().lock().map(|s| s.clone()).unwrap_or_default();
        for p in &procs {
            let candidate = root.is_none() || (p.ppid == me && !owned.contains(&p.pid));
            if candidate && p.pid != me && !p.zombie && environ_has(p.pid, entry) {
                roots.push(p.pid);
            }
        }
    }
    let mut wanted: HashSet<i32> = HashSet::new();
    while let Some(pid) = roots.pop() {
        if pid != me && wanted.insert(pid) {
            roots.extend(children.get(&pid).into_iter().flatten().copied());
        }
    }
    procs.into_iter().filter(|p| !p.zombie && wanted.contains(&p.pid)).collect()
}

/// Like [`collect`], plus every process of session `sid`: a PTY run's child is a session leader,
/// and an interactive shell in it moves its jobs into process groups of their own, which can
/// outlive the leader (then they are no longer its descendants). Scans the whole process table.
pub fn collect_session(sid: i32, mark: Option<&str>) -> Vec<ProcInfo> {
    let mut found = collect(Some(sid), mark);
    // Session ids of 0 and 1 are the kernel's and init's: never a command's.
    if sid > 1 {
        let me = std::process::id() as i32;
        let known: HashSet<i32> = found.iter().map(|p| p.pid).collect();
        found.extend(
            all_procs().into_iter().filter(|p| {
                p.session == sid && p.pid != me && !p.zombie && !known.contains(&p.pid)
            }),
        );
    }
    found
}

/// [`collect`] by walking `children` lists from the root and from the backend's adopted
/// children that carry the mark; `None` when the kernel has no such lists.
fn collect_tree(me: i32, root: i32, mark: Option<&str>) -> Option<Vec<ProcInfo>> {
    let mut stack = vec![root];
    if let Some(mark) = mark {
        let owned: HashSet<i32> = owned().lock().map(|s| s.clone()).unwrap_or_default();
        for pid in children_of(me)? {
            if !owned.contains(&pid) && environ_has(pid, mark.as_bytes()) {
                stack.push(pid);
            }
        }
    }
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    while let Some(pid) = stack.pop() {
        if pid == me || !seen.insert(pid) {
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

fn signal_all(procs: &[ProcInfo], sig: i32) {
    let my_pgrp = unsafe { libc::getpgrp() };
    let groups: HashSet<i32> =
        procs.iter().map(|p| p.pgrp).filter(|&g| g > 1 && g != my_pgrp).collect();
    for g in groups {
        // SAFETY: plain syscall; a stale group only yields ESRCH.
        unsafe { libc::kill(-g, sig) };
    }
    for p in procs {
        // SAFETY: as above.
        unsafe { libc::kill(p.pid, sig) };
    }
}

/// Kills a process tree with the SIGTERM → grace → SIGKILL ladder and waits until it is gone.
///
/// `root` is a process whose descendants are killed with it; `mark` an environment entry
/// (`NAME=value`) that identifies escapees. Returns when no matching live process remains (or
/// after a bounded number of SIGKILL rounds). Blocking: call from a blocking thread.
///
/// While waiting, only the pids already signalled are re-checked (a few `stat` reads); the whole
/// process table is scanned again only once they are gone, to catch anything forked meanwhile.
pub fn kill_tree_blocking(root: Option<i32>, mark: Option<&str>, grace: Duration) {
    kill_ladder(|| collect(root, mark), grace);
}

/// [`kill_tree_blocking`] for a PTY run: also every process of the session `sid`
/// ([`collect_session`]).
pub fn kill_session_blocking(sid: i32, mark: Option<&str>, grace: Duration) {
    kill_ladder(|| collect_session(sid, mark), grace);
}

fn kill_ladder(find: impl Fn() -> Vec<ProcInfo>, grace: Duration) {
    let mut procs = find();
    let deadline = Instant::now() + grace;
    let mut poll = KILL_POLL_MIN;
    while !procs.is_empty() {
        signal_all(&procs, libc::SIGTERM);
        loop {
            procs.retain(|p| proc_info(p.pid).is_some_and(|i| !i.zombie));
            let now = Instant::now();
            if procs.is_empty() || now >= deadline {
                break;
            }
            std::thread::sleep(poll.min(deadline - now));
            poll = (poll * 2).min(KILL_POLL_MAX);
        }
        if Instant::now() >= deadline {
            break;
        }
        procs = find();
    }
    // Past the grace: SIGKILL rounds until nothing is left (processes may fork while dying).
    for _ in 0..50 {
        if procs.is_empty() {
            break;
        }
        signal_all(&procs, libc::SIGKILL);
        std::thread::sleep(KILL_POLL_MIN * 4);
        procs = find();
    }
}

/// Async wrapper of [`kill_tree_blocking`].
pub async fn kill_tree(root: Option<i32>, mark: Option<String>, grace: Duration) {
    let _ =
        tokio::task::spawn_blocking(move || kill_tree_blocking(root, mark.as_deref(), grace)).await;
}

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
    let me = std::process::id() as i32;
    // Held for the whole scan: see [`spawn_owned`].
    let owned = match owned().lock() {
        Ok(s) => s,
        Err(p) => p.into_inner(),
    };
    let Ok(dir) = fs::read_dir("/proc") else { return };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if owned.contains(&pid) {
            continue;
        }
        if let Some(info) = proc_info(pid) {
            if info.ppid == me && info.zombie {
                let mut status = 0;
                // SAFETY: waits for one specific adopted pid, without blocking.
                unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            }
        }
    }
}

/// Makes the backend a child subreaper so that orphaned descendants stay ours to kill.
pub fn become_subreaper() {
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
}

/// The watchdog's body (`agent-bash __watchdog <owner>`): waits for EOF on stdin, i.e. for the
/// backend to exit for any reason, then kills every process carrying the owner's mark.
pub fn run_watchdog(owner: &str) -> i32 {
    use std::io::Read;
    let mut buf = [0u8; 64];
    let mut stdin = std::io::stdin();
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    let mark = format!("{OWNER_VAR}={owner}");
    // No grace: the backend is gone and nobody waits for output any more.
    kill_tree_blocking(None, Some(&mark), Duration::ZERO);
    0
}

/// Starts the watchdog for this backend (see the module docs). The write end of its stdin pipe
/// is kept open for the life of the process and is close-on-exec, so only the backend's own
/// death closes it.
pub fn spawn_watchdog(owner: &str) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt;
    static KEEP: OnceLock<Mutex<Vec<std::process::ChildStdin>>> = OnceLock::new();
    let exe = std::env::current_exe()?;
    let mut child = std::process::Command::new(exe)
        .arg("__watchdog")
        .arg(owner)
        .env_remove(OWNER_VAR)
        .env_remove(SHELL_VAR)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        // Its own group: a signal to the backend's group must not take the watchdog with it.
        .process_group(0)
        .spawn()?;
    if let Some(stdin) = child.stdin.take() {
        if let Ok(mut keep) = KEEP.get_or_init(|| Mutex::new(Vec::new())).lock() {
            keep.push(stdin);
        }
    }
    Ok(())
}
