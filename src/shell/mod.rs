//! The floor under the executor and the PTY path: shell processes and the processes they start.
//!
//! * [`session`]: the one interface of the three shells below (start, run one command with its
//!   feed, kill, close), and what a run reports.
//! * [`local`]: persistent shell sessions on this machine (protocol, FIFOs, endings).
//! * [`oneshot`]: the one-process-per-command fallback for isolating prefixes.
//! * [`remote`]: persistent shells on the other side of an engine (`ssh`, `docker exec`).
//! * `read_loop`: the read loop the three share, with the background-wait rules.
//! * [`snapshot`]: capturing the user's rc once per shell path.
//! * [`procs`]: marking, tracking and killing every process a shell started.
//!
//! Both [`crate::exec`] (pipe runs) and [`crate::pty`] (terminal runs) stand on this module; it
//! imports neither of them.

// The FIFO work in `local` (mkfifo and unlink on the private runtime directory) stays on the
// runtime thread: measured cheaper than a spawn_blocking round trip (see `local::open_fifo`);
// a shell's directory is removed under spawn_blocking.
pub mod local;
pub mod oneshot;
mod read_loop;
pub mod session;
// Blocking by contract: the kill ladders poll and sleep, so async callers go through
// `Group::kill` and `sweep` (spawn_blocking), the PTY path calls them from its own threads, the watchdog is a
// process of its own, and `reap_adopted` runs under spawn_blocking. `/proc` reads are kernel
// tables, not disk.
pub mod procs;
pub mod remote;
// Made once at start; the sweep runs in a thread of its own.
pub mod rundir;
// Capturing the user's rc waits up to 10 s for a shell: only ever called under spawn_blocking.
pub mod snapshot;
// Writes a command's driver file, in the private runtime directory (a memory file system).
pub mod zsh;

pub use local::{Shell, ShellConfig, ShellKind};
pub use session::{Ending, OutputSink, RunEnd, RunError, Session};

/// `N` bytes from the kernel's random source as hex: the per-command status token of a local
/// shell and the frame nonce of a remote one.
pub fn random_hex<const N: usize>() -> std::io::Result<String> {
    let mut b = [0u8; N];
    let mut got = 0;
    while got < N {
        match random_bytes(&mut b[got..]) {
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Fills the start of `buf` from `getrandom`; how much it filled.
#[cfg(target_os = "linux")]
fn random_bytes(buf: &mut [u8]) -> std::io::Result<usize> {
    // SAFETY: getrandom writes at most the given length into our buffer.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Fills the start of `buf` from `getentropy` (at most 256 bytes a call); how much it filled.
#[cfg(not(target_os = "linux"))]
fn random_bytes(buf: &mut [u8]) -> std::io::Result<usize> {
    let n = buf.len().min(256);
    // SAFETY: getentropy writes exactly `n` bytes into our buffer.
    if unsafe { libc::getentropy(buf.as_mut_ptr().cast(), n) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n)
}

/// Who asked for the command: an agent (full tool path) or the user (contract §8.2 bang semantics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Origin {
    #[default]
    Tool,
    Bang,
}
