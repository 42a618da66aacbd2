//! The PTY branch of the pipeline (contract §6): a prepared command ([`crate::prepare`]) that
//! [`crate::pty::wants_pty`] picked runs in a PTY instead of a shell session, and its screen
//! text goes through the same sanitizer, sink, artifacts and result shaping as pipe output.
//!
//! [`Runtime::run_pty`] is the entry point for terminal views (`:AgentBashTerm`): it takes the
//! raw-output subscriber and the control channel (input, resize, kill) in [`PtyHooks`].

use std::path::Path;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::{Feed, Prepared, Request, Runtime, UpdateFn};
use crate::fence::Fence;
use crate::pty::{self, PtyEnd, PtyHooks, PtyOutput};
use crate::result::{BashResult, Outcome};
use crate::Result;

impl Runtime {
    /// Runs one command in a PTY whatever the selection rules say (an explicit request, contract §6),
    /// through the whole pipeline: normalize, intercept and validate as [`Runtime::run`], then
    /// the PTY.
    ///
    /// `hooks` connects a terminal view: [`PtyHooks::on_output`] receives the raw bytes as the
    /// program writes them (called on the PTY reader thread); [`PtyHooks::control`] takes
    /// [`pty::PtyControl::Input`] (typed bytes, normalized by [`pty::keys`] against the program's
    /// cursor-key mode), [`pty::PtyControl::Resize`] (clamped to 20–400 × 5–200) and
    /// [`pty::PtyControl::Kill`] (reads as a cancel); messages sent after the command ended are
    /// ignored. `on_update` gets throttled live updates whose tail includes the current screen.
    ///
    /// The result is shaped like a pipe run's; its text is the terminal's rendering: the rows that
    /// scrolled off, then the final screen.
    pub async fn run_pty(
        &self,
        mut req: Request,
        cancel: CancellationToken,
        on_update: Option<UpdateFn>,
        hooks: PtyHooks,
    ) -> Result<BashResult> {
        req.pty = true;
        self.run_with(req, cancel, on_update, hooks).await
    }

    /// Whether `req` runs in a PTY ([`pty::wants_pty`] with this runtime's settings, the
    /// process environment and the UI state).
    pub fn wants_pty(&self, req: &Request) -> bool {
        crate::prepare::wants_pty(&self.settings, req, self.ui_attached())
    }

    /// The PTY branch of [`Runtime::run_prepared`].
    pub(super) async fn pty_path(
        &self,
        p: &Prepared,
        cwd: &Path,
        fence: Option<&Fence>,
        cancel: CancellationToken,
        on_update: Option<UpdateFn>,
        hooks: PtyHooks,
    ) -> BashResult {
        let (started, timeout) = (p.clock(), p.timeout);
        // Styled when someone shows the run: the finished card keeps the screen's colours.
        let mut out = Feed::new(self, &p.norm, p.display, on_update);
        let mut cfg = self.shell_config(p.origin);
        cfg.snapshot = self.snapshot().await;
        cfg.fence = fence.cloned();
        let deadline = timeout.as_ref().map(|t| Instant::now() + t.duration);
        // A terminal is one stream: a `| head`/`| tail` stage stayed in the command
        // ([`crate::normalize::normalize_keeping_stage`]), and the real `head` ends the producer
        // exactly as under bash.
        let command = p.norm.runnable();
        let end = pty::run(&cfg, &command, cwd, hooks, deadline, &cancel, &mut out).await;
        let resources = end.as_ref().ok().and_then(|run| run.resources);
        let outcome = match end.map(|run| run.end) {
            Ok(PtyEnd::Exited(Some(code))) => Outcome::Exited(code),
            Ok(PtyEnd::Exited(None)) => Outcome::MissingExitStatus,
            Ok(PtyEnd::TimedOut) => {
                Outcome::TimedOut(timeout.map(|t| t.duration).unwrap_or_default())
            }
            Ok(PtyEnd::Cancelled | PtyEnd::Killed) => Outcome::Cancelled,
            Err(e) => {
                tracing::warn!("PTY error: {e}");
                out.text(&format!("PTY error: {e}\n"));
                Outcome::MissingExitStatus
            }
        };
        let mut r = self.shape_run(p, &p.norm, out.finish().finish(), &outcome, started);
        // Without the shell's rusage (it was not reaped: a PTY error, a kill that left it), the
        // wall time alone.
        r.set_resources(resources.unwrap_or(crate::resources::Resources {
            wall_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            ..Default::default()
        }));
        r
    }

    /// The rc snapshot for this runtime's shell, captured with the same environment the shells
    /// get. It blocks for up to its limit, so it runs off the async threads.
    pub(super) async fn snapshot(&self) -> Option<std::path::PathBuf> {
        let cfg = &self.shell_cfg;
        let (shell, env, dir, owner) =
            (cfg.shell.clone(), cfg.env.clone(), cfg.runtime_dir.clone(), cfg.owner.clone());
        let snaps = self.snapshots.clone();
        tokio::task::spawn_blocking(move || snaps.get(&shell, &env, &dir, &owner))
            .await
            .ok()
            .flatten()
    }
}

impl PtyOutput for Feed {
    fn text(&mut self, text: &str) {
        if !text.is_empty() {
            self.push(text.as_bytes());
        }
    }

    fn tick(&mut self, screen: &dyn Fn() -> String) {
        self.update(Some(screen));
    }

    fn idle(&mut self, screen: &dyn Fn() -> String) {
        Feed::idle(self, Some(screen));
    }
}
