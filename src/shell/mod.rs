//! The floor under the executor and the PTY path: shell processes and the processes they start.
//!
//! * [`local`]: persistent shell sessions on this machine (protocol, FIFOs, endings) and the
//!   one-process-per-command fallback for isolating prefixes.
//! * [`snapshot`]: capturing the user's rc once per shell path.
//! * [`procs`]: marking, tracking and killing every process a shell started.
//!
//! Both [`crate::exec`] (pipe runs) and [`crate::pty`] (terminal runs) stand on this module; it
//! imports neither of them.

pub mod local;
pub mod procs;
pub mod snapshot;

pub use local::{quote, Ending, RunEnd, Shell, ShellConfig, ShellKind};

/// Who asked for the command: an agent (full tool path) or the user (SPEC §8.2 bang semantics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Origin {
    #[default]
    Tool,
    Bang,
}
