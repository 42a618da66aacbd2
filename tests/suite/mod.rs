//! Integration suites, one file per area.

mod explain;
mod rpc;
mod shell;
mod support;
