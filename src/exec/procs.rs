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
//! its own children, so we only ever `waitpid` pids that tokio does not own ([`own_child`]).
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
/// How often a kill re-checks whether its processes are gone.
const KILL_POLL: Duration = Duration::from_millis(10);

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

/// Live (non-zombie) processes that are `root` or descend from it, or carry `mark` in their
/// environment. Never includes the backend itself.
pub fn collect(root: Option<i32>, mark: Option<&str>) -> Vec<ProcInfo> {
    collect_matching(root, None, mark)
}

/// Like [`collect`], plus every process of session `sid`: a PTY run's child is a session leader,
/// and an interactive shell in it moves its jobs into process groups of their own, which can
/// outlive the leader (then they are no longer its descendants).
pub fn collect_session(sid: i32, mark: Option<&str>) -> Vec<ProcInfo> {
    collect_matching(Some(sid), Some(sid), mark)
}

fn collect_matching(root: Option<i32>, session: Option<i32>, mark: Option<&str>) -> Vec<ProcInfo> {
    let me = std::process::id() as i32;
    let procs = all_procs();
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for p in &procs {
        children.entry(p.ppid).or_default().push(p.pid);
    }
    let mut wanted: HashSet<i32> = HashSet::new();
    if let Some(root) = root {
        let mut stack = vec![root];
        while let Some(pid) = stack.pop() {
            if wanted.insert(pid) {
                stack.extend(children.get(&pid).into_iter().flatten().copied());
            }
        }
    }
    // Session ids of 0 and 1 are the kernel's and init's: never a command's.
    if let Some(sid) = session.filter(|&s| s > 1) {
        wanted.extend(procs.iter().filter(|p| p.session == sid).map(|p| p.pid));
    }
    if let Some(mark) = mark {
        let entry = mark.as_bytes();
        for p in &procs {
            if p.pid != me && !p.zombie && !wanted.contains(&p.pid) && environ_has(p.pid, entry) {
                wanted.insert(p.pid);
            }
        }
    }
    procs.into_iter().filter(|p| p.pid != me && !p.zombie && wanted.contains(&p.pid)).collect()
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
pub fn kill_tree_blocking(root: Option<i32>, mark: Option<&str>, grace: Duration) {
    kill_ladder(|| collect(root, mark), grace);
}

/// [`kill_tree_blocking`] for a PTY run: also every process of the session `sid`
/// ([`collect_session`]).
pub fn kill_session_blocking(sid: i32, mark: Option<&str>, grace: Duration) {
    kill_ladder(|| collect_session(sid, mark), grace);
}

fn kill_ladder(find: impl Fn() -> Vec<ProcInfo>, grace: Duration) {
    let procs = find();
    if procs.is_empty() {
        return;
    }
    signal_all(&procs, libc::SIGTERM);
    let deadline = Instant::now() + grace;
    loop {
        reap_adopted();
        let alive = find();
        if alive.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(KILL_POLL);
    }
    // Processes may fork while dying: repeat SIGKILL rounds until nothing is left.
    for _ in 0..50 {
        let alive = find();
        if alive.is_empty() {
            break;
        }
        signal_all(&alive, libc::SIGKILL);
        std::thread::sleep(KILL_POLL);
        reap_adopted();
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

/// Records that `pid` is a child tokio (or std) owns and will reap itself.
///
/// # Caveats
/// A child that exits before this call can be reaped by [`reap_adopted`] first, and its owner
/// then loses the exit status. Where a child may exit at once, spawn it with [`spawn_owned`].
pub fn own_child(pid: i32) {
    if let Ok(mut set) = owned().lock() {
        set.insert(pid);
    }
}

/// Spawns a child and records it as owned ([`own_child`]) with no gap: [`reap_adopted`] scans
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

/// Forgets a pid recorded with [`own_child`] once its owner has reaped it.
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
