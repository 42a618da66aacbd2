//! Integration suites, one file per area.

mod differential;
mod exec;
mod explain;
mod nvim;
mod pipeline;
mod pty;
mod receipt;
mod rescue;
mod rpc;
mod shell;
mod support;
mod wires;
