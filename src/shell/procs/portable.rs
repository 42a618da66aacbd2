//! The portable twins of `linux.rs`: process tables from `ps`, whose options and columns used
//! here mean the same in procps (Linux) and in macOS's ps. One `ps` run per look, so callers
//! ask for many processes at once where they can ([`table`]).
//!
//! * identity: a pid with its start time (`lstart`, to the second, read in UTC), so a reused
//!   pid is never mistaken for the process that had it;
//! * sessions: macOS's `ps` shows no session id (its `sess` is a kernel address), so each
//!   process's is asked of the kernel with `getsid` (which, unlike the controlling terminal,
//!   stays after the session leader exits);
//! * environment marks: `ps` appends the environment to the command line (`e` in procps, `-E`
//!   on macOS), from which a `NAME=value` word is picked.

use std::collections::HashSet;
use std::process::{Command, Stdio};

use super::ProcInfo;

/// The columns read, the start time last (it holds spaces: `Thu Dec  3 19:11:24 2026`).
const COLUMNS: &str = "pid=,ppid=,pgid=,stat=,lstart=";

/// Runs `ps` with `args` (C locale, UTC); its standard output, empty when it failed.
#[allow(clippy::disallowed_methods)] // waits for `ps`: its callers are blocking threads (the kill ladder, the watchdog)
fn ps(args: &[&str]) -> String {
    let out = Command::new("ps")
        .args(args)
        .env("LC_ALL", "C")
        .env("TZ", "UTC0")
        .env_remove(super::OWNER_VAR)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    match out {
        Ok(out) => String::from_utf8_lossy(&out.stdout).into_owned(),
        Err(e) => {
            tracing::warn!("cannot run ps: {e}");
            String::new()
        }
    }
}

/// The processes `pids` (every process with `None`) that exist.
pub fn table(pids: Option<&[i32]>) -> Vec<ProcInfo> {
    let text = match pids {
        None => ps(&["-A", "-o", COLUMNS]),
        Some([]) => return Vec::new(),
        Some(pids) => {
            let list: Vec<String> = pids.iter().map(i32::to_string).collect();
            ps(&["-p", &list.join(","), "-o", COLUMNS])
        }
    };
    text.lines()
        .filter_map(parse_line)
        .map(|mut p| {
            // SAFETY: plain syscall; a process gone since the listing gives -1.
            p.session = unsafe { libc::getsid(p.pid) }.max(0);
            p
        })
        .collect()
}

/// One line of [`COLUMNS`] (the session is left 0: see [`table`]).
fn parse_line(line: &str) -> Option<ProcInfo> {
    let mut it = line.split_ascii_whitespace();
    let pid = it.next()?.parse().ok()?;
    let ppid = it.next()?.parse().ok()?;
    let pgrp = it.next()?.parse().ok()?;
    let state = it.next()?;
    let start = parse_lstart(&it.collect::<Vec<_>>())?;
    Some(ProcInfo {
        pid,
        ppid,
        pgrp,
        session: 0,
        start,
        zombie: state.starts_with('Z') || state.starts_with('X'),
    })
}

/// `Thu Dec 3 19:11:24 2026` (UTC) as seconds since the epoch.
fn parse_lstart(f: &[&str]) -> Option<u64> {
    let [_, month, day, time, year] = f else { return None };
    const MONTHS: [&str; 12] =
        ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let m = MONTHS.iter().position(|x| x == month)? as i64 + 1;
    let d: i64 = day.parse().ok()?;
    let y: i64 = year.parse().ok()?;
    let mut hms = time.split(':').map(|x| x.parse::<i64>().ok());
    let (h, mi, s) = (hms.next()??, hms.next()??, hms.next()??);
    // Days from the civil date (proleptic Gregorian), March-based years.
    let (y, m) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + h * 3600 + mi * 60 + s).ok()
}

/// The process `pid`; `None` when it is gone.
pub fn proc_info(pid: i32) -> Option<ProcInfo> {
    // A pid that no longer exists costs no `ps` run.
    // SAFETY: signal 0 only checks that the process exists.
    if pid <= 0
        || (unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH))
    {
        return None;
    }
    table(Some(&[pid])).into_iter().find(|p| p.pid == pid)
}

/// Every process `ps -A` shows.
pub fn all_procs() -> Vec<ProcInfo> {
    table(None)
}

/// Live processes whose environment, as `ps` shows it, holds the word `entry`
/// (`NAME=value`), never `exclude`. `ps` shows a process's environment as it was at `exec`
/// and only for the user's own processes; a word of the command line that equals `entry`
/// counts as well (a process that names our mark is ours to end anyway).
pub fn marked(entry: &str, exclude: &HashSet<i32>) -> Vec<i32> {
    #[cfg(target_os = "linux")]
    let text = ps(&["-A", "-ww", "-o", "pid=,args=", "e"]);
    #[cfg(not(target_os = "linux"))]
    let text = ps(&["-A", "-ww", "-E", "-o", "pid=,command="]);
    let me = std::process::id() as i32;
    text.lines()
        .filter_map(|l| {
            let mut words = l.split_ascii_whitespace();
            let pid: i32 = words.next()?.parse().ok()?;
            words.any(|w| w == entry).then_some(pid)
        })
        .filter(|p| *p != me && !exclude.contains(p))
        .collect()
}

/// The wait channels of the processes of group `pgrp`: `(pid, state, channel)`, as `ps`
/// names them (`wait_woken`, `n_tty_read`, `poll_schedule_timeout` on Linux; `ttyin`,
/// `select` on macOS).
pub fn wait_channels(pgrp: i32) -> Vec<(i32, String, String)> {
    ps(&["-A", "-o", "pid=,pgid=,stat=,wchan="])
        .lines()
        .filter_map(|l| {
            let mut it = l.split_ascii_whitespace();
            let pid: i32 = it.next()?.parse().ok()?;
            let group: i32 = it.next()?.parse().ok()?;
            let state = it.next()?.to_string();
            let chan = it.next().unwrap_or("-").to_string();
            (group == pgrp).then_some((pid, state, chan))
        })
        .collect()
}

/// The state and wait channel of `pid`, as `ps` shows them.
pub fn wait_channel(pid: i32) -> Option<(String, String)> {
    let text = ps(&["-p", &pid.to_string(), "-o", "stat=,wchan="]);
    let mut it = text.split_ascii_whitespace();
    Some((it.next()?.to_string(), it.next().unwrap_or("-").to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_of_ps_parse_on_both_systems() {
        // procps (Linux) and macOS print the same columns (states differ in their flags).
        let linux = parse_line("  4242     1  4242 Ss+  Thu Dec  3 19:11:24 2026").unwrap();
        assert_eq!((linux.pid, linux.ppid, linux.pgrp, linux.zombie), (4242, 1, 4242, false));
        assert_eq!(linux.start, 1_796_325_084);
        let mac = parse_line("77 76 70 Z+ Thu Jan  1 00:00:01 1970").unwrap();
        assert_eq!((mac.start, mac.zombie), (1, true));
        assert_eq!(parse_line("5 1 5 S Tue Feb 29 12:00:00 2028").unwrap().start, 1_835_438_400);
        assert_eq!(parse_line("5 1 5 S Tue Feb 29 12:00"), None);
    }

    #[test]
    fn ps_finds_this_process_and_its_start() {
        let me = proc_info(std::process::id() as i32).unwrap();
        assert_eq!(me.pid, std::process::id() as i32);
        assert!(!me.zombie);
        // SAFETY: plain syscall.
        assert_eq!(me.session, unsafe { libc::getsid(0) });
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        assert!(me.start <= now && me.start + 24 * 3600 > now, "{} vs {now}", me.start);
        assert!(all_procs().iter().any(|p| p.pid == me.pid && p.start == me.start));
        assert_eq!(proc_info(i32::MAX), None);
    }
}
