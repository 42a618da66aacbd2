//! Entry points: each mode decodes its input, calls the library, and encodes the answer.

pub mod exec;
pub mod explain;
pub mod frame;
pub mod mcp;
// The discovery registry: a few small files read once, when the server starts.
pub mod mirror;
pub mod nvim;
pub mod rpc;
pub mod sanitize;

use std::path::{Path, PathBuf};
use std::time::Duration;

use std::sync::Arc;

use crate::exec::{Runtime, Settings};
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
/// total}`, oldest first. The record is read off the runtime thread.
pub async fn context_json(rt: &Runtime, offset: Option<usize>, limit: usize) -> serde_json::Value {
    let log = crate::session::SessionLog::new(rt.store().dir());
    let Ok(page) = tokio::task::spawn_blocking(move || log.context_page(offset, limit)).await
    else {
        return serde_json::json!({"messages": [], "offset": 0, "total": 0});
    };
    let messages: Vec<_> = page
        .items
        .into_iter()
        .map(|content| serde_json::json!({"role": "user", "content": content}))
        .collect();
    serde_json::json!({"messages": messages, "offset": page.offset, "total": page.total})
}

/// A page of the session's recorded bang commands: `{runs, offset, total}`, oldest first. The
/// record is read off the runtime thread.
pub async fn history_json(rt: &Runtime, offset: Option<usize>, limit: usize) -> serde_json::Value {
    let log = crate::session::SessionLog::new(rt.store().dir());
    let Ok(page) = tokio::task::spawn_blocking(move || log.history_page(offset, limit)).await
    else {
        return serde_json::json!({"runs": [], "offset": 0, "total": 0});
    };
    serde_json::json!({"runs": page.items, "offset": page.offset, "total": page.total})
}

/// `undo` (contract §13) for the wires: the undo's result as JSON, or the refusal with the
/// conflicting paths (`{conflicts: [...]}`) when files changed since.
pub async fn undo_json(
    rt: &Runtime,
    id: Option<u64>,
) -> std::result::Result<serde_json::Value, (crate::changes::UndoError, Option<serde_json::Value>)>
{
    match rt.changes().undo(id).await {
        Ok(done) => Ok(serde_json::to_value(&done).unwrap_or_default()),
        Err(e) => {
            let data = match &e {
                crate::changes::UndoError::Conflict { paths, .. } => {
                    Some(serde_json::json!({ "conflicts": paths }))
                }
                _ => None,
            };
            Err((e, data))
        }
    }
}

/// A run's changes for a viewer (`:AgentBashDiff`): `{id, root, command, changes}` (every
/// changed path), or an error when there is no such run.
pub fn changes_json(
    rt: &Runtime,
    id: Option<u64>,
) -> std::result::Result<serde_json::Value, crate::changes::UndoError> {
    let rec = rt.changes().get(id)?;
    Ok(serde_json::json!({
        "id": rec.id,
        "root": rec.root,
        "command": rec.command,
        "changes": rec.changes(),
    }))
}
