//! Linux's process tables and subreapers (`/proc`, `prctl`); the portable twins are in
//! `portable.rs`, the dispatch in `procs.rs`. The cgroup v2 path is in `procs.rs` (it only
//! exists here: elsewhere the tracker never creates one).

use std::collections::HashSet;
use std::fs;

use super::ProcInfo;

/// Reads `/proc/<pid>/stat`; `None` when the process is gone.
#[allow(clippy::disallowed_methods)] // a /proc read: a kernel table, not disk
pub fn proc_info(pid: i32) -> Option<ProcInfo> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may itself contain spaces or parentheses: the
    // fields we need come after the last ')'. Field 3 (state) is the first of them.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    let state = *fields.first()?;
    Some(ProcInfo {
        pid,
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        session: fields.get(3)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
        zombie: state == "Z" || state == "X",
    })
}

/// Every process currently visible in `/proc`.
#[allow(clippy::disallowed_methods)] // a /proc read: a kernel table, not disk
pub fn all_procs() -> Vec<ProcInfo> {
    let Ok(dir) = fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(proc_info)
        .collect()
}

/// True when `/proc/<pid>/environ` contains exactly `entry` (`NAME=value`).
#[allow(clippy::disallowed_methods)] // a /proc read: a kernel table, not disk
fn environ_has(pid: i32, entry: &[u8]) -> bool {
    match fs::read(format!("/proc/{pid}/environ")) {
        Ok(env) => env.split(|&b| b == 0).any(|e| e == entry),
        Err(_) => false,
    }
}

/// Live processes whose environment holds exactly `entry`, never `exclude`.
pub fn marked(entry: &str, exclude: &HashSet<i32>) -> Vec<i32> {
    all_procs()
        .into_iter()
        .filter(|p| !p.zombie && !exclude.contains(&p.pid))
        .filter(|p| environ_has(p.pid, entry.as_bytes()))
        .map(|p| p.pid)
        .collect()
}

/// Direct children of `pid`, from `/proc/<pid>/task/<tid>/children` (every thread's children:
/// a multi-threaded parent such as the backend spawns from several threads). `None` when the
/// kernel does not offer those files (CONFIG_PROC_CHILDREN); an exited process has none.
#[allow(clippy::disallowed_methods)] // a /proc read: a kernel table, not disk
pub fn children_of(pid: i32) -> Option<Vec<i32>> {
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

/// Whether this process is a child subreaper.
pub fn is_subreaper() -> bool {
    let mut is_subreaper: libc::c_int = 0;
    // SAFETY: prctl writes one int through the pointer.
    unsafe { libc::prctl(libc::PR_GET_CHILD_SUBREAPER, &mut is_subreaper as *mut libc::c_int) };
    is_subreaper != 0
}

/// Makes this process a child subreaper.
pub fn set_subreaper() {
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
}
