//! Is a PTY run's program waiting for the person at the keyboard? (contract §8.4)
//!
//! A program asking a question (`read`, a password or passphrase prompt, `git push` through
//! ssh, a REPL's prompt, `input()`) sleeps in a call that waits for its terminal while its output
//! is quiet. Linux shows it in `/proc`: the terminal's foreground process group
//! ([`libc::tcgetpgrp`] on the master) holds a process in state `S` whose `/proc/PID/syscall` is
//! * `read` on a file descriptor that is a terminal (`/dev/pts/N` or `/dev/tty`: ssh reads its
//!   passphrase from `/dev/tty`, not fd 0);
//! * `select`/`pselect6` whose read set holds a terminal (bash's readline, Python's REPL);
//! * `poll`/`ppoll` with a terminal among the descriptors polled for input;
//! * `epoll_wait`/`epoll_pwait`/`epoll_pwait2` on an epoll whose interest list
//!   (`/proc/PID/fdinfo/EPFD`) holds a terminal for input (Node's REPL).
//!
//! The sets of `select` and `poll` are read from the process's memory (`/proc/PID/mem`, open
//! to its ancestors as `syscall` is), so a server polling its sockets with a terminal as stdin
//! is not taken for a prompt. Where `syscall` cannot be read (it needs ptrace access), the wait
//! channel stands in: `n_tty_read`, or `wait_woken` with fd 0 on a terminal.
//!
//! Only the run's own process group is looked at, and only after [`QUIET`] without output, so a
//! busy program costs nothing.
//!
//! Off Linux (and with `AGENT_BASH_PORTABLE=1`) there is no `/proc`: the portable signal is the
//! wait channel `ps` shows for the foreground group's processes: one asleep in a terminal read
//! (`ttyin` on macOS; `n_tty_read`/`wait_woken` on Linux) or in `select`/`poll`/`kqueue`/`epoll`.
//! Weaker: a quiet program multiplexing sockets or pipes in the terminal's foreground counts as
//! waiting too (which descriptors it waits on is not visible without `/proc`).

use std::time::Duration;

/// Output must have been quiet this long before the program counts as waiting.
pub const QUIET: Duration = Duration::from_secs(1);
/// How often a quiet terminal is looked at.
pub const CHECK_EVERY: Duration = Duration::from_millis(250);

#[cfg(target_os = "linux")]
mod linux;

/// Whether a process of foreground process group `pgrp` is blocked reading a terminal.
// Under spawn_blocking (pty.rs), once a quiet second: /proc reads or one `ps` run.
pub fn group_reads_terminal(pgrp: i32) -> bool {
    if pgrp <= 0 {
        return false;
    }
    #[cfg(target_os = "linux")]
    if !crate::platform::portable() {
        return linux::group_reads_terminal(pgrp);
    }
    portable_reads_terminal(pgrp)
}

/// Wait channels of a sleep on terminal input, as `ps` names them (Linux, then macOS).
const TERMINAL_READS: &[&str] = &["n_tty_read", "wait_woken", "ttyin", "ttread"];
/// Wait channels of `select`, `poll`, `epoll` and `kqueue` (Linux, then macOS).
const MULTIPLEXERS: &[&str] = &[
    "poll_schedule_timeout",
    "do_select",
    "do_sys_poll",
    "do_epoll_wait",
    "ep_poll",
    "select",
    "kqread",
    "poll",
];

/// The portable twin: a sleeping process of the group whose wait channel is a terminal read or
/// a multiplexer.
fn portable_reads_terminal(pgrp: i32) -> bool {
    crate::shell::procs::wait_channels(pgrp).iter().any(|(_, state, chan)| {
        // procps may add a suffix to a symbol (`poll_schedule_timeout.constprop.0`).
        let chan = chan.split('.').next().unwrap_or("");
        state.starts_with(['S', 'I'])
            && (TERMINAL_READS.contains(&chan) || MULTIPLEXERS.contains(&chan))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `argv` on a fresh terminal; whether its foreground group is seen waiting for input
    /// (a waiter within 10 s; a non-waiter is watched for 1.5 s once it sleeps, as [`QUIET`]).
    fn seen_waiting(argv: &[&str], want: bool) -> bool {
        seen_waiting_by(argv, want, group_reads_terminal)
    }

    fn seen_waiting_by(argv: &[&str], want: bool, check: fn(i32) -> bool) -> bool {
        use portable_pty::{CommandBuilder, PtySize};
        let size = PtySize { rows: 24, cols: 80, pixel_width: 0, pixel_height: 0 };
        let pair = portable_pty::native_pty_system().openpty(size).unwrap();
        let mut cmd = CommandBuilder::new(argv[0]);
        cmd.args(&argv[1..]);
        cmd.env("TERM", "xterm");
        let mut child = pair.slave.spawn_command(cmd).unwrap();
        // Keep the terminal drained so a prompt never blocks on a full buffer.
        let mut reader = pair.master.try_clone_reader().unwrap();
        std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
        let limit = if want { Duration::from_secs(10) } else { Duration::from_millis(1500) };
        let deadline = std::time::Instant::now() + limit;
        let mut seen = false;
        while std::time::Instant::now() < deadline && !seen {
            let pgrp = pair.master.process_group_leader().unwrap_or(-1);
            seen = pgrp > 0 && check(pgrp);
            std::thread::sleep(Duration::from_millis(20));
        }
        child.kill().unwrap();
        let _ = child.wait();
        seen
    }

    /// The portable signal (what macOS gets) sees a read and not a sleep as well.
    #[test]
    fn waiting_portable_sees_a_read_on_a_terminal_and_not_a_sleep() {
        for (script, want) in [("read x", true), ("sleep 30", false)] {
            assert_eq!(
                seen_waiting_by(&["bash", "--norc", "-c", script], want, portable_reads_terminal),
                want,
                "{script}"
            );
        }
    }

    #[test]
    fn waiting_sees_a_read_on_a_terminal_and_not_a_sleep() {
        for (script, want) in [("read x", true), ("sleep 30", false)] {
            assert_eq!(seen_waiting(&["bash", "--norc", "-c", script], want), want, "{script}");
        }
    }

    /// Prompts that wait in select, poll or epoll (a REPL, interactive bash) are seen; the same
    /// calls waiting on a pipe, with the terminal as stdin, are not.
    #[test]
    fn waiting_sees_select_poll_and_epoll_on_the_terminal_only() {
        let py = |code: &'static str| vec!["python3", "-c", code];
        let cases: Vec<(Vec<&str>, bool)> = vec![
            (vec!["bash", "--norc", "--noprofile", "-i"], true),
            (vec!["python3", "-q", "-i"], true),
            (py("input()"), true),
            (py("import select,sys; select.select([sys.stdin],[],[])"), true),
            (py("import select; p=select.poll(); p.register(0, select.POLLIN); p.poll()"), true),
            (py("import select; e=select.epoll(); e.register(0, select.EPOLLIN); e.poll()"), true),
            (py("import os,select; r,w=os.pipe(); select.select([r],[],[])"), false),
            (py("import os,select; r,w=os.pipe(); p=select.poll(); p.register(r, select.POLLIN); p.poll()"), false),
            (py("import os,select; r,w=os.pipe(); e=select.epoll(); e.register(r, select.EPOLLIN); e.poll()"), false),
        ];
        for (argv, want) in cases {
            assert_eq!(seen_waiting(&argv, want), want, "{argv:?}");
        }
    }
}
