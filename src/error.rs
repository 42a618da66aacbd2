//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in the library, worded as the user (or model) should read it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// contract §3: the resolved cwd does not exist.
    #[error("Working directory does not exist: {}", .0.display())]
    CwdMissing(PathBuf),
    /// contract §3: the resolved cwd is not a directory.
    #[error("Working directory is not a directory: {}", .0.display())]
    CwdNotDir(PathBuf),
    /// contract §3 (Ours): NaN, negative, infinite or non-numeric timeout.
    #[error("Invalid timeout: {0} (expected a number of seconds between 1 and 3600)")]
    InvalidTimeout(String),
    /// contract §4.3: an `artifact://` URL that cannot be resolved (message is the exact text).
    #[error("{0}")]
    Artifact(String),
    /// contract §13: a fenced call on a kernel without Landlock is refused, never run unfenced.
    #[error("Sandbox unavailable: {0}")]
    SandboxUnavailable(String),
    /// Bad input from a caller (flags, RPC parameters, settings).
    #[error("{0}")]
    InvalidInput(String),
    /// contract §9: a request field of the wrong type (`got` is the value as JSON).
    #[error("\"{key}\" must be {want}, got {got}")]
    ParamType { key: String, want: &'static str, got: String },
    /// contract §9: a request field of the wrong shape.
    #[error("\"{key}\" must be {want}")]
    ParamShape { key: &'static str, want: &'static str },
    /// contract §9: a required request field is absent.
    #[error("missing \"{0}\"")]
    ParamMissing(&'static str),
    /// contract §9: text that is not UTF-8 under this key (a command is never guessed at).
    #[error("\"{0}\" is not valid UTF-8")]
    ParamNotUtf8(String),
    /// contract §9: an editor call's parameters that are not a table (the kind it was).
    #[error("expected a table of parameters, got {0}")]
    ParamsNotTable(&'static str),
    /// contract §9: a request type the JSON-lines RPC does not know.
    #[error("Unknown command: {0}")]
    UnknownCommand(String),
    /// contract §9: `abort_tool_call` of an id that is not running.
    #[error("No running tool call with that id")]
    NoToolCall,

    #[error(transparent)]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
