//! Linux's waiting-for-input check: what `/proc` shows of the foreground group's system calls
//! (the module docs of `waiting.rs`).

/// Whether a process of foreground process group `pgrp` is blocked reading a terminal.
// Under spawn_blocking (pty.rs), once a quiet second: /proc reads.
#[allow(clippy::disallowed_methods)]
pub fn group_reads_terminal(pgrp: i32) -> bool {
    if pgrp <= 0 {
        return false;
    }
    // The group leader is the usual reader (`read` in the shell itself); check it first.
    if in_group(pgrp, pgrp) && reads_terminal(pgrp) {
        return true;
    }
    let Ok(dir) = std::fs::read_dir("/proc") else { return false };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
        .filter(|&pid| pid != pgrp && in_group(pid, pgrp))
        .any(reads_terminal)
}

/// `/proc/PID/stat` fields after the command name: state, ppid, pgrp, …
#[allow(clippy::disallowed_methods)] // part of `group_reads_terminal` (under spawn_blocking)
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().take(3).map(str::to_string).collect())
}

fn in_group(pid: i32, pgrp: i32) -> bool {
    stat_fields(pid).is_some_and(|f| f.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(pgrp))
}

/// Process `pid` sleeps waiting for input from a terminal.
#[allow(clippy::disallowed_methods)] // part of `group_reads_terminal` (under spawn_blocking)
fn reads_terminal(pid: i32) -> bool {
    if stat_fields(pid).and_then(|f| f.first().cloned()).as_deref() != Some("S") {
        return false;
    }
    if let Ok(sc) = std::fs::read_to_string(format!("/proc/{pid}/syscall")) {
        if let Some((nr, args)) = parse_syscall(&sc) {
            return waits_on_terminal(pid, nr, &args);
        }
    }
    let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
    (wchan == "n_tty_read" || wchan == "wait_woken") && fd_is_terminal(pid, 0)
}

/// `/proc/PID/syscall`: the number and the six arguments (`running` or `-1 …` give `None`).
fn parse_syscall(text: &str) -> Option<(i64, [u64; 6])> {
    let mut it = text.split_whitespace();
    let nr = it.next()?.parse::<i64>().ok()?;
    let mut args = [0u64; 6];
    for a in &mut args {
        *a = u64::from_str_radix(it.next()?.trim_start_matches("0x"), 16).ok()?;
    }
    Some((nr, args))
}

/// Largest descriptor set read from a process (`select`'s `nfds`, `poll`'s count).
const MAX_FDS: u64 = 4096;

/// Whether syscall `nr` with `args`, in which `pid` sleeps, waits for a terminal's input.
fn waits_on_terminal(pid: i32, nr: i64, args: &[u64; 6]) -> bool {
    let fd = |a: u64| a as i64;
    if nr == libc::SYS_read {
        return fd_is_terminal(pid, fd(args[0]));
    }
    if nr == libc::SYS_pselect6 || is_legacy(nr, Legacy::Select) {
        let (nfds, readfds) = (args[0].min(MAX_FDS), args[1]);
        let Some(set) = read_mem(pid, readfds, nfds.div_ceil(8) as usize) else { return false };
        return (0..nfds as usize)
            .filter(|i| set[i / 8] & (1 << (i % 8)) != 0)
            .any(|i| fd_is_terminal(pid, i as i64));
    }
    if nr == libc::SYS_ppoll || is_legacy(nr, Legacy::Poll) {
        let (fds, n) = (args[0], args[1].min(MAX_FDS) as usize);
        // struct pollfd { int fd; short events; short revents; }
        let Some(raw) = read_mem(pid, fds, n * 8) else { return false };
        return raw.chunks_exact(8).any(|p| {
            let fd = i32::from_ne_bytes([p[0], p[1], p[2], p[3]]);
            let events = i16::from_ne_bytes([p[4], p[5]]);
            events & (libc::POLLIN | libc::POLLPRI) != 0 && fd_is_terminal(pid, fd.into())
        });
    }
    if nr == libc::SYS_epoll_pwait || nr == SYS_EPOLL_PWAIT2 || is_legacy(nr, Legacy::EpollWait) {
        return epoll_watches_terminal(pid, fd(args[0]));
    }
    false
}

/// `epoll_pwait2` (Linux 5.11), the same number on every architecture.
const SYS_EPOLL_PWAIT2: i64 = 441;

/// The calls only some architectures have (x86_64 has them; aarch64 only the newer forms).
enum Legacy {
    Select,
    Poll,
    EpollWait,
}

#[cfg(target_arch = "x86_64")]
fn is_legacy(nr: i64, which: Legacy) -> bool {
    nr == match which {
        Legacy::Select => libc::SYS_select,
        Legacy::Poll => libc::SYS_poll,
        Legacy::EpollWait => libc::SYS_epoll_wait,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn is_legacy(_nr: i64, _which: Legacy) -> bool {
    false
}

/// `len` bytes of `pid`'s memory at `addr` (`None` when unreadable).
#[allow(clippy::disallowed_methods)] // part of `group_reads_terminal` (under spawn_blocking)
fn read_mem(pid: i32, addr: u64, len: usize) -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    if addr == 0 || len == 0 {
        return None;
    }
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut buf = vec![0u8; len];
    mem.read_exact_at(&mut buf, addr).ok()?;
    Some(buf)
}

/// Whether epoll descriptor `epfd` of `pid` watches a terminal for input: its fdinfo lists
/// each target as `tfd: N events: HEX …`.
#[allow(clippy::disallowed_methods)] // part of `group_reads_terminal` (under spawn_blocking)
fn epoll_watches_terminal(pid: i32, epfd: i64) -> bool {
    let Ok(info) = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{epfd}")) else {
        return false;
    };
    info.lines().filter_map(|l| l.trim_start().strip_prefix("tfd:")).any(|rest| {
        let mut it = rest.split_whitespace();
        let tfd = it.next().and_then(|t| t.parse::<i64>().ok());
        let events = match (it.next(), it.next()) {
            (Some("events:"), Some(e)) => u32::from_str_radix(e, 16).unwrap_or(0),
            _ => 0,
        };
        let input = (libc::EPOLLIN | libc::EPOLLPRI) as u32;
        events & input != 0 && tfd.is_some_and(|t| fd_is_terminal(pid, t))
    })
}

fn fd_is_terminal(pid: i32, fd: i64) -> bool {
    if fd < 0 {
        return false;
    }
    std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).is_ok_and(|p| {
        let p = p.to_string_lossy();
        p.starts_with("/dev/pts/") || p == "/dev/tty"
    })
}
