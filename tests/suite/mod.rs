//! Integration suites, one file per area.

mod differential;
mod exec;
mod explain;
mod nvim;
mod pipeline;
mod pty;
mod rpc;
mod shell;
mod support;
