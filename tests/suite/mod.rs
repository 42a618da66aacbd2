//! Integration suites, one file per area.

mod agents;
mod changes;
mod differential;
mod editor;
mod exec;
mod explain;
mod faults;
mod fence;
mod install;
mod load;
mod mcp;
mod nvim;
mod nvim_faults;
mod pipeline;
mod pty;
mod receipt;
mod remote;
mod rescue;
mod rpc;
mod security;
mod shell;
mod spawn;
pub mod sshd;
mod support;
mod wires;
