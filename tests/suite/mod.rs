//! Integration suites, one file per area.

mod differential;
mod exec;
mod explain;
mod mcp;
mod nvim;
mod pipeline;
mod pty;
mod rpc;
mod shell;
mod support;
