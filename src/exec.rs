//! ToolCall → BashResult: the pipeline in one readable function.

pub mod procs;
pub mod shell;
pub mod snapshot;
