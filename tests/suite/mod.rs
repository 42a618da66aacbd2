//! Integration suites, one file per area.

mod rpc;
mod shell;
mod support;
