//! Entry points: each mode decodes its input, calls the library, and encodes the answer.

pub mod exec;
pub mod explain;
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

/// Removes artifact directories past the retention limit (SPEC §4.3); failures are only logged.
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

/// Records a finished bang command in the session's JSONL file (SPEC §10); failures are logged.
/// The file is written off the runtime thread.
pub async fn record_bang(
    rt: &Runtime,
    command: &str,
    cwd: &Path,
    result: &crate::result::BashResult,
    exclude: bool,
) {
    let rec = crate::session::BashExecution::from_result(
        command,
        cwd,
        result,
        rt.settings().limits.max_bytes as u64,
        exclude,
    );
    let log = crate::session::SessionLog::new(rt.store().dir());
    let command = command.to_string();
    let _ = tokio::task::spawn_blocking(move || {
        if let Err(e) = log.append(&rec) {
            tracing::warn!("could not record {command:?} in {}: {e}", log.path().display());
        }
    })
    .await;
}

/// The agent's context from the session record: `[{role = "user", content}]`, oldest first.
/// The record is read off the runtime thread.
pub async fn context_json(rt: &Runtime) -> serde_json::Value {
    let log = crate::session::SessionLog::new(rt.store().dir());
    let context = tokio::task::spawn_blocking(move || log.context()).await.unwrap_or_default();
    serde_json::Value::Array(
        context
            .into_iter()
            .map(|content| serde_json::json!({"role": "user", "content": content}))
            .collect(),
    )
}

/// Every recorded bang command of the session, oldest first.
/// The record is read off the runtime thread.
pub async fn history_json(rt: &Runtime) -> serde_json::Value {
    let log = crate::session::SessionLog::new(rt.store().dir());
    let records = tokio::task::spawn_blocking(move || log.load()).await.unwrap_or_default();
    serde_json::to_value(records).unwrap_or_default()
}
