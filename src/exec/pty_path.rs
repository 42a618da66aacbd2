//! The PTY branch of the pipeline (SPEC §6): after normalize, intercept and validate, a command
//! that [`crate::pty::wants_pty`] picks runs in a PTY instead of a shell session, and its screen
//! text goes through the same sanitizer, sink, artifacts and result shaping as pipe output.
//!
//! [`Runtime::run_pty`] is the entry point for terminal views (`:AgentBashTerm`): it takes the
//! raw-output subscriber and the control channel (input, resize, kill) in [`PtyHooks`].

use std::path::Path;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::{live, Request, Runtime, UpdateFn};
use crate::display::Display;
use crate::normalize::Normalized;
use crate::pty::{self, PtyEnd, PtyHooks, PtyOutput};
use crate::result::{self, BashResult, Outcome};
use crate::sanitize::Sanitizer;
use crate::sink::{Sink, SinkConfig, Throttle, LIVE_UPDATE_INTERVAL};
use crate::validate::Timeout;
use crate::Result;

/// A command that passed normalize, intercept and validate.
pub(super) struct PtyJob<'a> {
    pub norm: &'a Normalized,
    pub cwd: &'a Path,
    pub timeout: Option<Timeout>,
    /// When the tool call arrived (its duration counts from here).
    pub started: Instant,
}

impl Runtime {
    /// Runs one command in a PTY whatever the selection rules say (an explicit request, SPEC §6),
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
        pty::wants_pty(
            req.pty,
            req.origin,
            self.settings.virtual_terminal.as_deref(),
            self.ui_attached(),
            |k: &str| std::env::var_os(k),
        )
    }

    /// The PTY branch of [`Runtime::run`], after validation.
    pub(super) async fn pty_path(
        &self,
        job: PtyJob<'_>,
        cancel: CancellationToken,
        on_update: Option<UpdateFn>,
        hooks: PtyHooks,
    ) -> BashResult {
        let PtyJob { norm, cwd, timeout, started } = job;
        let limits = &self.settings.limits;
        let mut out = ScreenSink {
            sink: Sink::new(
                SinkConfig {
                    max_bytes: limits.max_bytes,
                    max_lines: limits.max_lines,
                    head: norm.head,
                    tail: norm.tail,
                    artifact_cap: limits.artifact_cap_bytes,
                },
                Some(self.store.clone()),
            ),
            sanitizer: Sanitizer::new(),
            scratch: String::new(),
            spans: Vec::new(),
            display: Display::new(),
            dirty: false,
            throttle: Throttle::new(LIVE_UPDATE_INTERVAL),
            on_update,
        };
        let mut cfg = self.shell_cfg.clone();
        cfg.snapshot = self.snapshot().await;
        let deadline = timeout.as_ref().map(|t| Instant::now() + t.duration);
        // The terminal cannot be closed early as a pipe can (SPEC §1's head-only rule): the
        // program owns it until it exits, so the sink just keeps its head part.
        let end = pty::run(&cfg, &norm.command, cwd, hooks, deadline, &cancel, &mut out).await;
        let outcome = match end {
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
        out.scratch.clear();
        out.spans.clear();
        out.sanitizer.finish_styled(&mut out.scratch, &mut out.spans);
        out.display.push(&out.scratch, &out.spans);
        out.sink.push(&out.scratch);
        if let Some(f) = &out.on_update {
            f(live(&out.sink, Some(&out.display), "", true));
        }
        let mut r =
            result::shape(out.sink.finish(), &outcome, started.elapsed(), limits.max_bytes as u64);
        r.timeout_clamped_from = timeout.and_then(|t| t.clamped_from);
        if !norm.rewrites.is_empty() {
            r.normalized = serde_json::to_value(norm).ok();
        }
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

/// The output path of a PTY run: screen text → sanitizer → sink, and live updates.
struct ScreenSink {
    sink: Sink,
    sanitizer: Sanitizer,
    scratch: String,
    spans: Vec<crate::sanitize::Span>,
    /// Styled lines for the card view of a finished PTY run (the screen text keeps SGR codes).
    display: Display,
    /// Output arrived since the last live update.
    dirty: bool,
    throttle: Throttle,
    on_update: Option<UpdateFn>,
}

impl PtyOutput for ScreenSink {
    fn text(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        self.scratch.clear();
        self.spans.clear();
        self.sanitizer.push_styled(text.as_bytes(), &mut self.scratch, &mut self.spans);
        self.display.push(&self.scratch, &self.spans);
        self.sink.push(&self.scratch);
    }

    fn idle(&mut self, screen: &dyn Fn() -> String) {
        if self.dirty {
            self.tick(screen);
        }
    }

    fn tick(&mut self, screen: &dyn Fn() -> String) {
        let Some(f) = &self.on_update else { return };
        self.dirty = !self.throttle.ready(Instant::now());
        if !self.dirty {
            // The tail so far, then what is on the screen now (not yet part of the text).
            let mut pending = self.sanitizer.pending().to_string();
            let shown = screen();
            let window = self.sink.window();
            let at_line_start = match pending.is_empty() {
                true => window.is_empty() || window.ends_with('\n'),
                false => pending.ends_with('\n'),
            };
            if !shown.is_empty() && !at_line_start {
                pending.push('\n');
            }
            pending.push_str(&shown);
            f(live(&self.sink, Some(&self.display), &pending, false));
        }
    }
}
