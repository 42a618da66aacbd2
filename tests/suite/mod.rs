//! Integration suites, one file per area.

mod explain;
mod pty;
mod rpc;
mod shell;
mod support;
