//! Entry points: each mode decodes its input, calls the library, and encodes the answer.
//!
//! What the modes share lives here (starting a runtime, request fields, pages of the session's
//! record, undo) and in [`wire`], the one place a result, a card or an error takes a wire's
//! shape; a mode imports nothing from another (only `mcp` uses its `mirror`).

pub mod exec;
pub mod explain;
pub mod frame;
pub mod mcp;
// The discovery registry: a few small files read once, when the server starts.
pub mod mirror;
pub mod nvim;
pub mod rpc;
pub mod sanitize;
pub mod wire;

use std::path::{Path, PathBuf};
use std::time::Duration;

use std::sync::Arc;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::exec::{Origin, Request, Runtime, Settings};
use crate::shell::procs;

/// The state root: the `state_dir` setting, else the platform state dir.
pub fn state_root(settings: &Settings) -> PathBuf {
    settings.state_dir.clone().unwrap_or_else(crate::artifacts::state_root)
}

/// Removes artifact directories past the retention limit (contract §4.3); failures are only logged.
/// Runs once at start-up, before any command is served.
pub fn prune_artifacts(root: &Path, settings: &Settings) {
    let age = Duration::from_secs(settings.limits.retention_days * 24 * 3600);
    match crate::artifacts::prune(&root.join("sessions"), age) {
        Ok(n) if n > 0 => tracing::info!("removed {n} artifact directories older than {age:?}"),
        Ok(_) => {}
        Err(e) => tracing::debug!("artifact retention skipped: {e}"),
    }
}

/// Resolves when the process gets SIGINT or SIGTERM (a host SIGINT counts as a cancel).
pub async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) =
        (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
    else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}

/// Everything a mode that runs commands does at start: retention, the runtime for a new
/// session, and the watchdog that cleans up if the backend dies.
///
/// `session_id` names the editor session (its artifacts and its record live in
/// `<state>/sessions/<id>`): a backend restarted for the same session keeps both.
pub fn start_runtime(settings: Settings, session_id: Option<&str>) -> crate::Result<Arc<Runtime>> {
    let root = state_root(&settings);
    prune_artifacts(&root, &settings);
    let dir = match session_id {
        Some(id) => {
            let valid = !id.is_empty()
                && id.len() <= 128
                && !id.starts_with('.')
                && id.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
            if !valid {
                return Err(crate::Error::InvalidInput(format!(
                    "invalid session id {id:?}: use letters, digits, '.', '_' and '-'"
                )));
            }
            root.join("sessions").join(id)
        }
        None => crate::exec::new_session_dir(&root),
    };
    let rt = Arc::new(Runtime::new(settings, dir, std::env::current_dir()?)?);
    if let Err(e) = procs::spawn_watchdog(rt.owner()) {
        tracing::warn!("no watchdog: processes may outlive a killed backend: {e}");
    }
    Ok(rt)
}

/// Records a finished bang command in the session's JSONL file (contract §10); failures are logged.
/// The line is written off the runtime thread, starting now: the caller prepares its answer
/// meanwhile and awaits [`RecordWrite::done`] before sending it, so whoever got the answer finds
/// the record on disk.
pub fn record_bang(
    rt: &Runtime,
    command: &str,
    cwd: &Path,
    result: &crate::result::BashResult,
    exclude: bool,
) -> RecordWrite {
    let rec = crate::session::BashExecution::from_result(
        command,
        cwd,
        result,
        rt.settings().limits.max_bytes as u64,
        exclude,
    );
    let log = crate::session::SessionLog::new(rt.store().dir());
    RecordWrite(tokio::task::spawn_blocking(move || {
        if let Err(e) = log.append(&rec) {
            tracing::warn!("could not record {:?} in {}: {e}", rec.command, log.path().display());
        }
    }))
}

/// A session record being written ([`record_bang`]).
#[derive(Debug)]
pub struct RecordWrite(tokio::task::JoinHandle<()>);

impl RecordWrite {
    /// Resolves once the record is written (or failed, which is logged).
    pub async fn done(self) {
        let _ = self.0.await;
    }
}

/// Page size of `get_context` / `history` answers when the request names none, and the largest
/// one served (each item holds up to one output window, 50 KiB).
pub const PAGE_DEFAULT: usize = 50;
pub const PAGE_MAX: usize = 200;

/// `offset` (absent: the last page) and `limit` (default [`PAGE_DEFAULT`], at most
/// [`PAGE_MAX`]) of a paged request.
pub fn page_args(
    obj: &serde_json::Map<String, serde_json::Value>,
) -> crate::Result<(Option<usize>, usize)> {
    let count = |k: &str| match obj.get(k) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => {
            v.as_u64().map(|n| Some(usize::try_from(n).unwrap_or(usize::MAX))).ok_or_else(|| {
                crate::Error::ParamType {
                    key: k.to_owned(),
                    want: "a non-negative integer",
                    got: v.to_string(),
                }
            })
        }
    };
    let offset = count("offset")?;
    let limit = count("limit")?.unwrap_or(PAGE_DEFAULT).clamp(1, PAGE_MAX);
    Ok((offset, limit))
}

/// A page of the agent's context (contract §10): `{messages: [{role = "user", content}], offset,
/// total}`, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContextPage {
    pub messages: Vec<Message>,
    pub offset: usize,
    pub total: usize,
}

/// One message of the agent's context.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Message {
    pub role: &'static str,
    pub content: String,
}

/// A page of the agent's context. The record is read off the runtime thread.
pub async fn context_page(rt: &Runtime, offset: Option<usize>, limit: usize) -> ContextPage {
    let log = crate::session::SessionLog::new(rt.store().dir());
    let Ok(page) = tokio::task::spawn_blocking(move || log.context_page(offset, limit)).await
    else {
        return ContextPage { messages: Vec::new(), offset: 0, total: 0 };
    };
    let messages =
        page.items.into_iter().map(|content| Message { role: "user", content }).collect();
    ContextPage { messages, offset: page.offset, total: page.total }
}

/// A page of the session's recorded bang commands: `{runs, offset, total}`, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HistoryPage {
    pub runs: Vec<crate::session::BashExecution>,
    pub offset: usize,
    pub total: usize,
}

/// A page of the session's recorded bang commands. The record is read off the runtime thread.
pub async fn history_page(rt: &Runtime, offset: Option<usize>, limit: usize) -> HistoryPage {
    let log = crate::session::SessionLog::new(rt.store().dir());
    let Ok(page) = tokio::task::spawn_blocking(move || log.history_page(offset, limit)).await
    else {
        return HistoryPage { runs: Vec::new(), offset: 0, total: 0 };
    };
    HistoryPage { runs: page.items, offset: page.offset, total: page.total }
}

/// `undo` (contract §13) for the wires: the undo's result, or the refusal (naming the paths
/// changed since, when that is why).
pub async fn undo(
    rt: &Runtime,
    id: Option<u64>,
) -> std::result::Result<crate::changes::UndoResult, wire::Failure> {
    rt.changes().undo(id).await.map_err(wire::Failure::from)
}

/// A run's changes for a viewer (`:AgentBashDiff`): `{id, root, command, changes}` (every
/// changed path).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunChanges {
    pub id: u64,
    pub root: PathBuf,
    pub command: String,
    pub changes: Vec<crate::changes::Change>,
}

/// The changes of run `id` (the newest run with changes without one), or an error when there
/// is no such run.
pub fn run_changes(
    rt: &Runtime,
    id: Option<u64>,
) -> std::result::Result<RunChanges, wire::Failure> {
    let rec = rt.changes().get(id).map_err(wire::Failure::from)?;
    Ok(RunChanges {
        id: rec.id,
        root: rec.root.clone(),
        command: rec.command.clone(),
        changes: rec.changes(),
    })
}

// Request decoding, shared by every mode that takes a command.

/// A string field; absent and null are `None`.
pub fn get_str(obj: &Map<String, Value>, k: &str) -> crate::Result<Option<String>> {
    match obj.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(crate::Error::ParamType {
            key: k.to_owned(),
            want: "a string",
            got: other.to_string(),
        }),
    }
}

/// A count (a non-negative integer); absent and null are `None`.
pub fn get_count(obj: &Map<String, Value>, k: &str) -> crate::Result<Option<usize>> {
    match obj.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(|n| Some(n as usize)).ok_or_else(|| crate::Error::ParamType {
            key: k.to_owned(),
            want: "a non-negative integer",
            got: v.to_string(),
        }),
    }
}

/// The timeout in seconds (contract §3); absent and null are `None`.
pub fn get_timeout(obj: &Map<String, Value>) -> crate::Result<Option<f64>> {
    match obj.get("timeout") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            crate::validate::parse_timeout(v).map(|t| Some(t.clamped_from.unwrap_or(t.secs)))
        }
    }
}

/// A command request from its fields (every mode that takes one).
pub fn request_from(obj: &Map<String, Value>, origin: Origin) -> crate::Result<Request> {
    use crate::Error::ParamShape;
    let command = get_str(obj, "command")?.ok_or(crate::Error::ParamMissing("command"))?;
    let tools = match obj.get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => Some(
            a.iter()
                .map(|t| {
                    let strings = ParamShape { key: "tools", want: "strings" };
                    t.as_str().map(str::to_string).ok_or(strings)
                })
                .collect::<crate::Result<Vec<_>>>()?,
        ),
        Some(_) => return Err(ParamShape { key: "tools", want: "an array of strings" }),
    };
    Ok(Request {
        origin,
        command,
        timeout: get_timeout(obj)?,
        cwd: get_str(obj, "cwd")?,
        local_cwd: false,
        remote_cwd: None,
        head: get_count(obj, "head")?,
        tail: get_count(obj, "tail")?,
        tools,
        session_key: get_str(obj, "session_key")?,
        display: false,
        pty: match obj.get("pty") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(ParamShape { key: "pty", want: "a boolean" }),
        },
        profile: get_str(obj, "profile")?,
    })
}

/// Our stdin. When it is a pipe (the usual case for an agent talking to us), read it through
/// the event loop directly: tokio's `stdin()` goes through a blocking thread, a thread hop on
/// every request.
pub fn stdio_reader() -> Box<dyn tokio::io::AsyncRead + Unpin + Send> {
    match dup_fd(0).map(tokio::net::unix::pipe::Receiver::from_owned_fd) {
        Some(Ok(rx)) => Box::new(rx),
        _ => Box::new(tokio::io::stdin()),
    }
}

/// Our stdout, for the same reason as [`stdio_reader`].
pub fn stdio_writer() -> Box<dyn tokio::io::AsyncWrite + Unpin + Send> {
    match dup_fd(1).map(tokio::net::unix::pipe::Sender::from_owned_fd) {
        Some(Ok(tx)) => Box::new(tx),
        _ => Box::new(tokio::io::stdout()),
    }
}

fn dup_fd(fd: i32) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: dup of a standard descriptor; the new fd is owned by the returned value.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    (new >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(new) })
}
