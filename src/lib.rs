//! agent-bash: runs shell commands for coding agents and for the person at the keyboard.
//!
//! Every tool call goes through one pipeline (contract §0):
//!
//! ```text
//!   command ──► normalize (§1)     strip a trailing top-level `| head -n N` / `| tail -n N`
//!           ──► intercept (§2)     block commands another tool does better (per simple command)
//!           ──► validate (§3)      cwd must exist; timeout clamped to [1, 3600] s
//!           ──► exec (§5, §6)      persistent shell session (pipes) or a PTY
//!   bytes   ──► sanitize (§4.1)    incremental UTF-8, ANSI/control stripping, CR overwrite, SGR spans
//!   text    ──► sink (§4.2)        bounded tail window + counters; full text spilled to an artifact
//!           ──► artifacts (§4.3)   `<id>.bash.log`, capped, resolvable as `artifact://<id>`
//!           ──► result (§7)        BashResult: notices, exit-code wording, metadata
//! ```
//!
//! The pure stages (`normalize`, `intercept`, `sanitize`, `sink`, `result`) know nothing of
//! processes; `exec` drives them. The modes in [`mode`] (nvim msgpack-RPC, JSON-lines RPC, print
//! mode and the two pipeline tools `explain` / `sanitize`) only decode requests and encode
//! results.

// Unit tests block freely (each runs on a thread of its own); the library itself is linted
// against blocking calls on the async runtime (clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod artifacts;
pub mod changes;
pub mod display;
pub mod error;
pub mod exec;
pub mod fence;
pub mod intercept;
// Opened once at start-up, before the runtime serves anything.
pub mod logfile;
pub mod mode;
pub mod normalize;
// Which platform paths run: Linux's own or the portable twins (a leaf).
pub mod platform;
pub mod prepare;
pub mod project;
pub mod pty;
pub mod rescue;
// `/proc` reads of the command's processes: kernel tables, not disk.
pub mod resources;
pub mod result;
pub mod sanitize;
pub mod session;
pub mod shell;
pub mod shellwords;
pub mod sink;
pub mod validate;

pub use error::{Error, Result};
