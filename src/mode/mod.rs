//! Entry points: each mode decodes its input, calls the library, and encodes the answer.

pub mod exec;
pub mod explain;
pub mod nvim;
pub mod rpc;
pub mod sanitize;

use std::path::{Path, PathBuf};
use std::time::Duration;

use std::sync::Arc;

use crate::exec::{procs, Runtime, Settings};

/// The state root: the `state_dir` setting, else the platform state dir.
pub fn state_root(settings: &Settings) -> PathBuf {
    settings.state_dir.clone().unwrap_or_else(crate::artifacts::state_root)
}

/// Removes artifact directories past the retention limit (SPEC §4.3); failures are only logged.
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
pub fn start_runtime(settings: Settings) -> crate::Result<Arc<Runtime>> {
    let root = state_root(&settings);
    prune_artifacts(&root, &settings);
    let dir = crate::exec::new_session_dir(&root);
    let rt = Arc::new(Runtime::new(settings, dir, std::env::current_dir()?)?);
    if let Err(e) = procs::spawn_watchdog(rt.owner()) {
        tracing::warn!("no watchdog: processes may outlive a killed backend: {e}");
    }
    Ok(rt)
}
