//! Is a PTY run's program waiting for the person at the keyboard? (SPEC §8.4)
//!
//! A program asking a question (`read`, a password or passphrase prompt, `git push` through
//! ssh) sits in `read(2)` on its terminal while its output is quiet. Linux shows it in `/proc`:
//! the terminal's foreground process group ([`libc::tcgetpgrp`] on the master) holds a process
//! in state `S` whose `/proc/PID/syscall` is `read` on a file descriptor that is a terminal
//! (`/dev/pts/N` or `/dev/tty`: ssh reads its passphrase from `/dev/tty`, not fd 0). Where
//! `syscall` cannot be read (it needs ptrace access), the wait channel stands in: `n_tty_read`,
//! or `wait_woken` with fd 0 on a terminal.
//!
//! Only the run's own process group is looked at, and only after [`QUIET`] without output, so a
//! busy program costs nothing.

use std::time::Duration;

/// Output must have been quiet this long before the program counts as waiting.
pub const QUIET: Duration = Duration::from_secs(1);
/// How often a quiet terminal is looked at.
pub const CHECK_EVERY: Duration = Duration::from_millis(250);

/// Whether a process of foreground process group `pgrp` is blocked reading a terminal.
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
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().take(3).map(str::to_string).collect())
}

fn in_group(pid: i32, pgrp: i32) -> bool {
    stat_fields(pid).is_some_and(|f| f.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(pgrp))
}

/// Process `pid` sleeps in a read of a terminal.
fn reads_terminal(pid: i32) -> bool {
    if stat_fields(pid).and_then(|f| f.first().cloned()).as_deref() != Some("S") {
        return false;
    }
    if let Ok(sc) = std::fs::read_to_string(format!("/proc/{pid}/syscall")) {
        let mut it = sc.split_whitespace();
        if let (Some(nr), Some(fd)) = (it.next(), it.next()) {
            if let Ok(nr) = nr.parse::<i64>() {
                let fd = i64::from_str_radix(fd.trim_start_matches("0x"), 16).unwrap_or(-1);
                return nr == libc::SYS_read && fd_is_terminal(pid, fd);
            }
        }
    }
    let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
    (wchan == "n_tty_read" || wchan == "wait_woken") && fd_is_terminal(pid, 0)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_sees_a_read_on_a_terminal_and_not_a_sleep() {
        use portable_pty::{CommandBuilder, PtySize};
        let size = PtySize { rows: 24, cols: 80, pixel_width: 0, pixel_height: 0 };
        for (script, want) in [("read x", true), ("sleep 30", false)] {
            let pair = portable_pty::native_pty_system().openpty(size).unwrap();
            let mut cmd = CommandBuilder::new("bash");
            cmd.args(["--norc", "-c", script]);
            let mut child = pair.slave.spawn_command(cmd).unwrap();
            // A reader is seen once bash reaches its read; a sleeper is never seen.
            let limit = if want { Duration::from_secs(10) } else { Duration::from_millis(600) };
            let deadline = std::time::Instant::now() + limit;
            let mut seen = false;
            while std::time::Instant::now() < deadline && !seen {
                let pgrp = pair.master.process_group_leader().unwrap_or(-1);
                seen = group_reads_terminal(pgrp);
                std::thread::sleep(Duration::from_millis(20));
            }
            child.kill().unwrap();
            let _ = child.wait();
            assert_eq!(seen, want, "{script}");
        }
    }
}
