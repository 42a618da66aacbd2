//! ToolCall → BashResult: a call prepared once ([`crate::prepare`]), then run from that value
//! in a shell session (pipes), a PTY ([`pty_path`]) or a remote shell ([`remote_path`])
//! ([`Runtime::run`]).

mod pty_path;
pub mod remote_path;
pub mod settings;
mod slots;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::artifacts::ArtifactStore;
use crate::changes::engine;
use crate::display::{self, Display, StyledLine};
use crate::fence::{Fence, SandboxMode};
use crate::normalize::Normalized;
use crate::prepare::{Place, Preparer};
pub use crate::prepare::{Prep, Prepared, Request, BANG_KEY, DEFAULT_KEY, MAX_KEY_BYTES};
use crate::pty;
use crate::result::{self, BashResult, Outcome};
use crate::sanitize::Sanitizer;
use crate::sink::{Sink, SinkConfig, Throttle, LIVE_UPDATE_INTERVAL};
use crate::validate::Timeout;
use crate::{Error, Result};

use crate::shell::local::{self as shell, Ending, Shell, ShellConfig};
use crate::shell::oneshot::Oneshot;
use crate::shell::remote::RemoteShell;
pub use crate::shell::Origin;
use crate::shell::Session;
use crate::shell::{procs, snapshot};
pub use settings::Settings;
use slots::{bang_key, Held, Kind, Slots};

/// How often idle shell sessions are looked for.
const EVICT_EVERY: Duration = Duration::from_secs(30);

/// What `:checkhealth` says about the shell ([`Runtime::shell_report`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShellReport {
    pub shell: String,
    /// The first line of `<shell> --version`.
    pub version: String,
    /// bash or zsh (anything else runs without an rc snapshot and without the zsh/bash driver).
    pub supported: bool,
    /// What the rc snapshot kept and dropped.
    pub snapshot: String,
}

/// A live update while a command runs: the current tail (bounded) and the counters.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LiveUpdate {
    pub tail: String,
    pub total_bytes: u64,
    pub total_lines: u64,
    /// Styled display lines (only with `Request::display`): the last
    /// [`display::LIVE_LINES`] while running, every kept line in the final update.
    pub lines: Vec<StyledLine>,
    /// The last update of the run, sent once the output is complete.
    pub last: bool,
}

/// Receives throttled live updates.
pub type UpdateFn = Arc<dyn Fn(LiveUpdate) + Send + Sync>;

/// The runtime shared by every mode: settings, shell sessions, artifacts, process hygiene.
pub struct Runtime {
    settings: Settings,
    /// What preparing a call needs (contract §1–§3, §13): [`Runtime::prepare`].
    prep: Preparer,
    /// For tool calls: no handle on the editor in the environment ([`EDITOR_HANDLES`]).
    shell_cfg: ShellConfig,
    /// The environment of bang commands: the editor's, handles included (as `:!` has them).
    bang_env: Vec<(OsString, OsString)>,
    store: Arc<ArtifactStore>,
    snapshots: Arc<snapshot::Snapshots>,
    /// The local shell sessions by key, `limits.max_sessions` of them at most live.
    sessions: Slots<Shell>,
    /// An interactive UI shows our output (contract §6: a tool call may then get a PTY).
    ui_attached: AtomicBool,
    /// [`Runtime::warm`] is starting the first bang shell.
    warming: AtomicBool,
    /// The prefix puts shells where our FIFOs are not: every command runs in a process of its
    /// own ([`Oneshot`]).
    isolated: AtomicBool,
    /// Remote shell sessions by (profile, key) (contract §12).
    remote: Slots<RemoteShell, (String, String)>,
    /// Change receipts and undo (contract §13).
    changes: Arc<crate::changes::Receipts>,
    _runtime_dir: crate::shell::rundir::RunDir,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("artifacts", &self.store.dir()).finish_non_exhaustive()
    }
}

impl Runtime {
    /// Builds the runtime. `session_dir` is this session's artifacts directory; `base_dir` the
    /// directory relative cwds are resolved against.
    pub fn new(settings: Settings, session_dir: PathBuf, base_dir: PathBuf) -> Result<Runtime> {
        let shell = settings.resolve_shell();
        let prefix = settings.resolve_prefix()?;
        let bang_env = bang_env(&settings, &shell);
        let env: Vec<(OsString, OsString)> = command_env(&settings, &shell)
            .into_iter()
            .filter(|(k, _)| !EDITOR_HANDLES.iter().any(|h| k == h))
            .collect();
        let state_root = settings.state_dir.clone().unwrap_or_else(crate::artifacts::state_root);
        // contract §13: private by default; what older versions left wider is tightened once.
        if let Err(e) = crate::shell::rundir::make_private(&state_root) {
            tracing::warn!("state directory {}: {e}", state_root.display());
        }
        // contract §13: the fence's root is the user's (the setting, else the start directory's
        // project), never a request's; its widest form decides where our own files may live.
        let fence_root = settings.sandbox_root_path().unwrap_or_else(|| {
            crate::project::root_or_cwd(
                &base_dir.canonicalize().unwrap_or_else(|_| base_dir.clone()),
            )
        });
        let fence_extra = fence_extra(&settings, &env);
        let widest = settings
            .fences_any()
            .then(|| Fence::new(SandboxMode::WorkspaceWrite, &fence_root, &fence_extra, true))
            .flatten();
        let base = match &widest {
            // Out of the fence's reach: the first usable place no fenced shell may write, else
            // a directory of the state directory (on disk: slower, but not writable by them).
            Some(f) => shell::runtime_bases()
                .into_iter()
                .find(|b| f.exposes(std::slice::from_ref(b)).is_none())
                .unwrap_or_else(|| private_state_dir(&state_root)),
            None => shell::runtime_base(),
        };
        // The projects' shared receipt engines (contract §13): by abstract name on Linux (a
        // fenced shell can neither reach nor impersonate one, see `changes::engine`); else in
        // the first runtime base no fenced shell may write (one could plant a false engine).
        let engines = match settings.changes.enabled {
            true if engine::Spot::named().is_some() => engine::Spot::named(),
            true => shell::runtime_bases()
                .into_iter()
                .find(|b| {
                    widest.as_ref().is_none_or(|f| f.exposes(std::slice::from_ref(b)).is_none())
                })
                .and_then(|b| engine::Spot::at(&b)),
            false => None,
        };
        let runtime_dir = crate::shell::rundir::RunDir::create(&base)?;
        runtime_dir.sweep_in_background(base);
        // What a fenced shell must not be able to write; a fence that would is refused.
        let own = [runtime_dir.path().to_path_buf(), state_root.clone(), session_dir.clone()];
        let owner = shell::nonce();
        let prep = Preparer::new(&settings, base_dir, &shell, (fence_root, fence_extra), &own);
        Ok(Runtime {
            prep,
            shell_cfg: ShellConfig {
                shell,
                env,
                prefix,
                snapshot: None,
                runtime_dir: runtime_dir.path().to_path_buf(),
                owner,
                fence: None,
                runner: true,
                spawn: settings.spawn.unwrap_or(true),
            },
            bang_env,
            store: Arc::new(ArtifactStore::new(session_dir.clone())),
            snapshots: Arc::new(snapshot::Snapshots::new(Some(
                settings
                    .state_dir
                    .clone()
                    .unwrap_or_else(crate::artifacts::state_root)
                    .join("snapshots"),
            ))),
            sessions: Slots::new(settings.limits.max_sessions),
            ui_attached: AtomicBool::new(false),
            warming: AtomicBool::new(false),
            isolated: AtomicBool::new(false),
            // Remote sessions hold no local shell: they do not count against
            // `limits.max_sessions` (contract §12).
            remote: Slots::new(usize::MAX),
            changes: Arc::new(
                crate::changes::Receipts::new(
                    settings.changes.clone(),
                    state_root,
                    session_dir.clone(),
                    runtime_dir.path().to_path_buf(),
                )
                .with_engines(engines),
            ),
            _runtime_dir: runtime_dir,
            settings,
        })
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn store(&self) -> &Arc<ArtifactStore> {
        &self.store
    }

    /// Change receipts and undo (contract §13).
    pub fn changes(&self) -> &Arc<crate::changes::Receipts> {
        &self.changes
    }

    /// The owner mark value every process of this runtime carries ([`procs::OWNER_VAR`]).
    pub fn owner(&self) -> &str {
        &self.shell_cfg.owner
    }

    /// Says whether an interactive UI is attached (the nvim mode sets it from `nvim_list_uis()`).
    pub fn set_ui_attached(&self, attached: bool) {
        self.ui_attached.store(attached, Ordering::Relaxed);
    }

    pub fn ui_attached(&self) -> bool {
        self.ui_attached.load(Ordering::Relaxed)
    }

    /// Prepares `req` once ([`crate::prepare`], contract §1–§3, §5, §6, §12, §13): `Err` for bad
    /// input, [`Prep::Blocked`] with the result when interception stops it, else the command
    /// [`Runtime::run_prepared`] runs. A caller that must know first whether the command runs
    /// (a terminal view opens only for one that does) hands the same value on.
    pub fn prepare(&self, req: Request) -> Result<Prep> {
        self.prep.prepare(&self.settings, req, self.ui_attached())
    }

    /// The checks a command passes before it runs (contract §1–§3), as [`Runtime::prepare`]
    /// makes them: `Err` for bad input, `Some` with the blocked result when interception stops
    /// it, `None` when it would run.
    pub fn precheck(&self, req: &Request) -> Result<Option<BashResult>> {
        Ok(match self.prepare(req.clone())? {
            Prep::Blocked(r) => Some(*r),
            Prep::Run(_) => None,
        })
    }

    /// Runs one command through the whole pipeline. `Err` only for bad input (cwd, timeout);
    /// everything that happens to the command itself is in the [`BashResult`].
    pub async fn run(
        &self,
        req: Request,
        cancel: CancellationToken,
        on_update: Option<UpdateFn>,
    ) -> Result<BashResult> {
        self.run_with(req, cancel, on_update, pty::PtyHooks::default()).await
    }

    /// [`Runtime::run`] with the hooks a PTY run uses if the command gets one.
    pub async fn run_with(
        &self,
        req: Request,
        cancel: CancellationToken,
        on_update: Option<UpdateFn>,
        hooks: pty::PtyHooks,
    ) -> Result<BashResult> {
        match self.prepare(req)? {
            Prep::Blocked(r) => Ok(*r),
            Prep::Run(p) => self.run_prepared(*p, cancel, on_update, hooks).await,
        }
    }

    /// Runs a prepared command: in a remote session, a PTY or a shell session of its key. A
    /// command that runs on this machine gets a change receipt (contract §13): snapshots of its
    /// project before and after.
    pub async fn run_prepared(
        &self,
        p: Prepared,
        cancel: CancellationToken,
        on_update: Option<UpdateFn>,
        hooks: pty::PtyHooks,
    ) -> Result<BashResult> {
        let (cwd, fence, pty) = match &p.place {
            // Remote files are not this machine's: no local change receipt.
            Place::Remote { profile, argv, cwd } => {
                let at = (profile.as_str(), argv.as_slice(), cwd.as_deref());
                return self.remote_path(&p, at, cancel, on_update).await;
            }
            Place::Local { cwd, fence, pty } => (cwd.as_path(), fence.as_ref(), *pty),
        };
        let receipt = match self.changes.enabled() {
            true => self.changes.begin(cwd).await,
            false => crate::changes::Begin::Off,
        };
        // §6 PTY or pipes. The run's duration counts the preparation, not the receipt.
        let mut r = match pty {
            true => self.pty_path(&p, cwd, fence, cancel, on_update, hooks).await,
            false => self.pipe_path(&p, cwd, fence, cancel, on_update).await?,
        };
        note_fence(&mut r, fence);
        r.set_receipt(self.changes.finish(receipt, &p.command).await, p.origin == Origin::Tool);
        Ok(r)
    }

    /// §5 a command in the shell session of its key (pipes): waiting for a busy session does
    /// not count as run time.
    async fn pipe_path(
        &self,
        p: &Prepared,
        cwd: &Path,
        fence: Option<&Fence>,
        cancel: CancellationToken,
        on_update: Option<UpdateFn>,
    ) -> Result<BashResult> {
        let started = p.clock();
        let wait_started = Instant::now();
        let (mut slot, shell_restarted) = match self.session_for(p, fence, &cancel).await? {
            Taken::Ready(slot, restarted) => (slot, restarted),
            Taken::Unrun(outcome, text) => {
                let mut r = self.shape_unrun(outcome, started);
                if let Some(why) = text {
                    r.set_unstarted(&why);
                }
                return Ok(r);
            }
        };
        let waited = wait_started.elapsed();
        slot.last_used = Some(Instant::now());
        // §1: a session that traces what it runs (`set -x` left on by an earlier call) runs the
        // command as written: a stripped stage would lose its own trace line, and the limit
        // would cut the trace lines bash prints past the stage.
        let traced = slot.shell.as_ref().is_some_and(|sh| sh.traces()) && p.norm.stage_stripped();
        let verbatim;
        let norm = match traced {
            true => {
                let (head, tail) = p.asked_limits;
                verbatim = Normalized::verbatim(&p.command, head, tail);
                &verbatim
            }
            false => &p.norm,
        };

        // §4 the output path: sanitize → sink, live updates throttled.
        let mut feed = Feed::new(self, norm, p.display, on_update);
        let deadline = p.timeout.as_ref().map(|t| Instant::now() + t.duration);
        feed.meter =
            slot.shell.as_ref().map(|sh| crate::resources::Meter::start(sh.pid(), sh.cpu_probe()));
        let run_started = Instant::now();
        let command = norm.runnable();
        let end = match slot.shell.as_mut() {
            Some(shell) => shell.run(&command, cwd, &mut feed, deadline, &cancel).await,
            None => {
                let cfg = ShellConfig { fence: fence.cloned(), ..self.shell_config(p.origin) };
                let Ok(mut one) = Oneshot::start(&cfg).await;
                one.run(&command, cwd, &mut feed, deadline, &cancel).await
            }
        };
        let meter = feed.meter.take();
        let sink = feed.finish();
        let alive = matches!(&end, Ok(e) if matches!(e.ending, Ending::Done(_)));
        let resources = match meter {
            Some(m) => m.finish(alive),
            None => crate::resources::Resources {
                wall_ms: run_started.elapsed().as_millis() as u64,
                ..Default::default()
            },
        };
        let outcome = match &end {
            Ok(end) => outcome_of(end, p.timeout),
            Err(e) => {
                tracing::warn!("run failed: {e}");
                Outcome::MissingExitStatus
            }
        };
        if !alive {
            slot.close().await;
        }
        self.sessions.release(slot, p.session_key.as_ref());

        let mut r = self.shape_run(p, norm, sink.finish(), &outcome, started);
        r.shell_restarted = shell_restarted;
        r.waited_ms = waited_ms(waited);
        r.set_resources(resources);
        Ok(r)
    }

    /// The session a pipe run goes to (§5), its shell started if it has none, and whether an
    /// earlier shell of its key was lost (`shell_restarted`). The user's own commands never wait
    /// (§8.2): each takes an idle bang shell, a new one when all are busy.
    async fn session_for(
        &self,
        p: &Prepared,
        fence: Option<&Fence>,
        cancel: &CancellationToken,
    ) -> Result<Taken> {
        let mut slot = match (&p.session_key, p.origin) {
            (None, Origin::Bang) => self.bang_slot().await,
            (key, _) => {
                let key = key.as_deref().unwrap_or(DEFAULT_KEY).to_string();
                match self.sessions.take(&key, cancel).await {
                    Some(slot) => slot,
                    None => return Ok(Taken::Unrun(Outcome::Cancelled, None)),
                }
            }
        };
        let kind = Kind { editor_env: p.origin == Origin::Bang, fence: fence.cloned() };
        if slot.shell.is_some() && !slot.kind.serves(&kind) {
            // A bang command started this key's shell with the editor's handles: a tool call
            // gets a fresh one without them. A shell fenced for another project (or not as
            // the settings now say) is replaced as well. Its place among the live sessions goes
            // with it.
            slot.close().await;
        }
        if slot.shell.is_some() || self.isolated.load(Ordering::Relaxed) {
            return Ok(Taken::Ready(slot, false));
        }
        // Our own slot is locked, so eviction never picks it whatever key we name.
        let Some(permit) = self.sessions.reserve(&p.key().to_string(), cancel).await else {
            return Ok(Taken::Unrun(Outcome::Cancelled, None));
        };
        match self.spawn_shell(p.origin, kind.fence.clone()).await {
            Ok(sh) => slot.fill(sh, kind, Some(permit)),
            Err(e)
                if kind.fence.is_some() && e.to_string().starts_with(crate::fence::UNSUPPORTED) =>
            {
                return Err(Error::SandboxUnavailable(e.to_string()));
            }
            Err(e) if shell::is_isolated(&e) => {
                tracing::info!("prefix isolates the shell: one process per command from now on");
                self.isolated.store(true, Ordering::Relaxed);
            }
            Err(e) => {
                slot.mark_lost();
                let shell = self.shell_cfg.shell.display();
                let why = format!("Bash command failed: cannot start {shell}: {e}");
                return Ok(Taken::Unrun(Outcome::MissingExitStatus, Some(why)));
            }
        }
        let shell_restarted = slot.take_lost();
        Ok(Taken::Ready(slot, shell_restarted))
    }

    /// The result of a run (pipes, PTY, remote alike), shaped from its output and ending, with
    /// what the preparation decided (the clamped timeout, the normalization).
    fn shape_run(
        &self,
        p: &Prepared,
        norm: &Normalized,
        output: crate::sink::SinkOutput,
        outcome: &Outcome,
        started: Instant,
    ) -> BashResult {
        let max_bytes = self.settings.limits.max_bytes as u64;
        let mut r = result::shape(output, outcome, started.elapsed(), max_bytes);
        r.timeout_clamped_from = p.timeout.and_then(|t| t.clamped_from);
        if !norm.rewrites.is_empty() {
            r.normalized = serde_json::to_value(norm).ok();
        }
        r
    }

    /// What the fence settings mean here, for `:checkhealth`: the sandbox of tool calls and the
    /// kernel's Landlock support.
    pub fn fence_report(&self) -> String {
        let s = &self.settings;
        let mut keys: Vec<String> =
            s.sandbox_by_key.iter().map(|(k, m)| format!("{k} = {}", m.as_str())).collect();
        let default = s.sandbox.unwrap_or(crate::fence::SandboxMode::Off).as_str();
        keys.insert(0, format!("tool calls: {default}"));
        let net = if s.network == Some(false) { ", network denied" } else { "" };
        let root = match s.fences_any() {
            true => format!(", root {}", self.prep.fence_root.display()),
            false => String::new(),
        };
        format!("{}{root}{net} ({})", keys.join(", "), crate::fence::kernel_support())
    }

    /// For `:checkhealth`: whether plain commands start without bash's fork (the spawn builtin,
    /// `src/shell/spawn.c`).
    pub fn spawn_report(&self) -> String {
        let cfg = &self.shell_cfg;
        if !cfg.spawn {
            "off (spawn = false in the settings file): bash forks for every command".into()
        } else if crate::platform::portable() {
            let on = crate::platform::describe();
            format!(
                "off on {on}: the runner builtin runs on the Linux paths only, so calls are eval'ed by a one-line driver and bash forks for every command"
            )
        } else if !shell::spawn_built() {
            "off: this build had no C compiler for the builtin, bash forks for every command".into()
        } else if shell::ShellKind::of(&cfg.shell) != shell::ShellKind::Bash {
            format!("off: the shell is {}, not bash", cfg.shell.display())
        } else {
            "on: a plain external command starts with posix_spawn, without bash's fork".into()
        }
    }

    /// For `:checkhealth`: the shell commands run in, its version, whether it is one the
    /// runtime fully supports (bash, zsh), and what its rc snapshot kept and dropped (taking
    /// the snapshot if no command has yet).
    pub async fn shell_report(&self) -> ShellReport {
        let shell = self.shell_cfg.shell.clone();
        let kind = shell::ShellKind::of(&shell);
        let version = tokio::process::Command::new(&shell)
            .arg("--version")
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
            .await
            .ok()
            .and_then(|out| {
                String::from_utf8_lossy(&out.stdout).lines().next().map(str::to_string)
            });
        let snapshot = match kind {
            shell::ShellKind::Posix => "none: only bash and zsh rc files are read".to_string(),
            _ => match self.snapshot().await {
                Some(_) => {
                    let (snaps, path) = (self.snapshots.clone(), shell.clone());
                    let report = tokio::task::spawn_blocking(move || snaps.report(&path));
                    report.await.ok().flatten().unwrap_or_else(|| "taken".into())
                }
                None => "none (no rc, or it failed or took longer than 10 s)".into(),
            },
        };
        ShellReport {
            shell: shell.to_string_lossy().into_owned(),
            version: version.unwrap_or_else(|| "unknown".into()),
            supported: kind != shell::ShellKind::Posix,
            snapshot,
        }
    }

    /// False when the settings fence some tool calls but the kernel cannot.
    pub fn fence_usable(&self) -> bool {
        !self.settings.fences_any() || crate::fence::kernel_abi().is_ok()
    }

    fn shape_unrun(&self, outcome: Outcome, started: Instant) -> BashResult {
        result::shape(
            Default::default(),
            &outcome,
            started.elapsed(),
            self.settings.limits.max_bytes as u64,
        )
    }

    /// An idle bang shell session: [`BANG_KEY`] when it is free (so `export`s and functions carry over
    /// from one command to the next), else `bang.2`, `bang.3`, … — the first idle one, a new one
    /// when every one is busy. While [`Runtime::warm`] starts the first shell, it is waited for.
    async fn bang_slot(&self) -> Held<Shell> {
        if self.warming.load(Ordering::Acquire) {
            return self.sessions.slot(&BANG_KEY.to_string()).lock_owned().await;
        }
        self.sessions.take_idle(bang_key)
    }

    /// Starts the first bang shell (taking the rc snapshot) ahead of the first command, so it
    /// does not wait for them (contract §8.4, cold start). Does nothing when that shell exists or
    /// is busy. Returns whether a shell is ready.
    pub async fn warm(&self) -> bool {
        // Set before the lock is taken, so a command arriving meanwhile waits for this shell
        // rather than starting a second one.
        self.warming.store(true, Ordering::Release);
        // The project's first change-receipt snapshot too, so the first command does not wait
        // for it (up to `changes.max_snapshot_ms`).
        if self.changes.enabled() {
            let (changes, cwd) = (self.changes.clone(), self.prep.base_dir.clone());
            tokio::spawn(async move { drop(changes.begin(&cwd).await) });
        }
        let Ok(mut slot) = self.sessions.slot(&BANG_KEY.to_string()).try_lock_owned() else {
            self.warming.store(false, Ordering::Release);
            return false;
        };
        // Warming is a courtesy: it takes a free place among `limits.max_sessions` or none
        // (it never closes another session to make room).
        let permit = self.sessions.try_permit();
        if slot.shell.is_none() && !self.isolated.load(Ordering::Relaxed) && permit.is_some() {
            match self.spawn_shell(Origin::Bang, None).await {
                Ok(sh) => {
                    slot.fill(sh, Kind { editor_env: true, fence: None }, permit);
                    slot.last_used = Some(Instant::now());
                }
                Err(e) if shell::is_isolated(&e) => self.isolated.store(true, Ordering::Relaxed),
                Err(e) => tracing::warn!("warming the bang shell: {e}"),
            }
        } else if slot.shell.is_none() {
            // One process per command: the snapshot is what can be done ahead.
            let _ = self.snapshot().await;
        }
        self.warming.store(false, Ordering::Release);
        slot.shell.is_some()
    }

    /// The shell configuration for a command of `origin` (the environment differs).
    fn shell_config(&self, origin: Origin) -> ShellConfig {
        let mut cfg = self.shell_cfg.clone();
        if origin == Origin::Bang {
            cfg.env = self.bang_env.clone();
        }
        cfg
    }

    async fn spawn_shell(&self, origin: Origin, fence: Option<Fence>) -> std::io::Result<Shell> {
        let mut cfg = self.shell_config(origin);
        cfg.fence = fence;
        cfg.snapshot = self.snapshot().await;
        Shell::spawn(&cfg).await
    }

    /// Closes shell sessions (local and remote) idle longer than `limits.session_idle_secs`.
    /// Busy sessions are never touched. (The session count is held by [`Slots::reserve`] as
    /// shells start.)
    pub async fn close_idle(&self) {
        let idle_limit = Duration::from_secs(self.settings.limits.session_idle_secs);
        self.sessions.close_idle(idle_limit).await;
        self.remote.close_idle(idle_limit).await;
    }

    /// Periodically evicts idle sessions; run it as a background task.
    pub async fn evict_loop(self: Arc<Self>) {
        loop {
            tokio::time::sleep(EVICT_EVERY).await;
            self.close_idle().await;
        }
    }

    /// Kills every shell session and everything it started.
    pub async fn shutdown(&self) {
        self.sessions.shutdown().await;
        self.remote.shutdown().await;
        // Orphans of shells that died on their own, and anything still carrying our mark.
        let mark = format!("{}={}", procs::OWNER_VAR, self.owner());
        procs::sweep(Some(mark), procs::KILL_GRACE).await;
    }
}

/// The output path of a run (pipes and PTY alike): raw bytes → sanitizer → sink (and styled
/// display lines), with live updates at most every [`LIVE_UPDATE_INTERVAL`] and a trailing one
/// once output pauses, so a view never shows stale output while the command is quiet.
pub(crate) struct Feed {
    sink: Sink,
    sanitizer: Sanitizer,
    text: String,
    spans: Vec<crate::sanitize::Span>,
    display: Option<Display>,
    throttle: Throttle,
    on_update: Option<UpdateFn>,
    /// Output arrived since the last update.
    dirty: bool,
    /// When the head part of a head-only run became complete (contract §1 early close).
    head_complete_at: Option<Instant>,
    /// The receipt of a pipe run, sampled as the output moves or pauses.
    meter: Option<crate::resources::Meter>,
    /// See [`Normalized::lone_stage_stripped`].
    lone_stage: bool,
    /// A `| head`/`| tail` stage was stripped: the command's stderr comes apart
    /// ([`shell::OutputSink::stderr_apart`]), through a sanitizer of its own once it comes.
    stage: bool,
    apart: Option<Sanitizer>,
}

impl Feed {
    pub(crate) fn new(
        rt: &Runtime,
        norm: &Normalized,
        display: bool,
        on_update: Option<UpdateFn>,
    ) -> Feed {
        let limits = &rt.settings.limits;
        let config = SinkConfig {
            max_bytes: limits.max_bytes,
            max_lines: limits.max_lines,
            head: norm.head,
            tail: norm.tail,
            artifact_cap: limits.artifact_cap_bytes,
            close_after_head: norm.close_after_head,
            stage_tail: norm.tail_stripped(),
        };
        Feed {
            sink: Sink::new(config, Some(rt.store.clone())),
            sanitizer: Sanitizer::new(),
            text: String::new(),
            spans: Vec::new(),
            display: display.then(Display::new),
            throttle: Throttle::new(LIVE_UPDATE_INTERVAL),
            on_update,
            dirty: false,
            head_complete_at: None,
            meter: None,
            lone_stage: norm.lone_stage_stripped(),
            stage: norm.stage_stripped(),
            apart: None,
        }
    }

    /// Takes raw output bytes.
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        self.text.clear();
        sanitize_into(
            &mut self.sanitizer,
            self.display.as_mut(),
            bytes,
            &mut self.text,
            &mut self.spans,
        );
        // Hands the buffer to the artifact writer instead of copying it (leaves it empty).
        self.sink.push_owned(&mut self.text);
        if self.head_complete_at.is_none() && self.sink.head_complete() {
            self.head_complete_at = Some(Instant::now());
        }
    }

    /// Takes raw bytes of the command's stderr, kept apart from a stripped stage's limit.
    pub(crate) fn push_apart(&mut self, bytes: &[u8]) {
        self.text.clear();
        let sanitizer = self.apart.get_or_insert_with(Sanitizer::new);
        sanitize_into(sanitizer, self.display.as_mut(), bytes, &mut self.text, &mut self.spans);
        self.sink.push_apart(&self.text);
    }

    /// A live update if the throttle allows one, else remembers that one is due. `screen` is
    /// what a terminal shows now and is not yet part of the text (PTY runs).
    pub(crate) fn update(&mut self, screen: Option<&dyn Fn() -> String>) {
        let Some(f) = &self.on_update else { return };
        self.dirty = !self.throttle.ready(Instant::now());
        if self.dirty {
            return;
        }
        let mut pending = self.sanitizer.pending().to_string();
        if let Some(shown) = screen.map(|s| s()).filter(|s| !s.is_empty()) {
            let window = self.sink.window();
            let at_line_start = match pending.is_empty() {
                true => window.is_empty() || window.ends_with('\n'),
                false => pending.ends_with('\n'),
            };
            if !at_line_start {
                pending.push('\n');
            }
            pending.push_str(&shown);
        }
        f(live(&self.sink, self.display.as_ref(), &pending, false));
    }

    /// The update the throttle held back, once output has paused.
    pub(crate) fn idle(&mut self, screen: Option<&dyn Fn() -> String>) {
        if self.dirty {
            self.update(screen);
        }
    }

    /// Ends the stream: the last text, the final update (every kept display line).
    pub(crate) fn finish(mut self) -> Sink {
        if let Some(mut apart) = self.apart.take() {
            self.text.clear();
            finish_into(&mut apart, self.display.as_mut(), &mut self.text, &mut self.spans);
            self.sink.push_apart(&self.text);
        }
        self.text.clear();
        finish_into(&mut self.sanitizer, self.display.as_mut(), &mut self.text, &mut self.spans);
        self.sink.push(&self.text);
        if let Some(f) = &self.on_update {
            f(live(&self.sink, self.display.as_ref(), "", true));
        }
        self.sink
    }
}

/// Sanitizes `bytes` into `text`, and into the display's styled lines when there is one.
fn sanitize_into(
    sanitizer: &mut Sanitizer,
    display: Option<&mut Display>,
    bytes: &[u8],
    text: &mut String,
    spans: &mut Vec<crate::sanitize::Span>,
) {
    match display {
        Some(d) => {
            spans.clear();
            sanitizer.push_styled(bytes, text, spans);
            d.push(text, spans);
        }
        None => sanitizer.push(bytes, text),
    }
}

/// What `sanitizer` still holds at the end of the stream, as [`sanitize_into`].
fn finish_into(
    sanitizer: &mut Sanitizer,
    display: Option<&mut Display>,
    text: &mut String,
    spans: &mut Vec<crate::sanitize::Span>,
) {
    match display {
        Some(d) => {
            spans.clear();
            sanitizer.finish_styled(text, spans);
            d.push(text, spans);
        }
        None => sanitizer.finish(text),
    }
}

impl shell::OutputSink for Feed {
    fn data(&mut self, bytes: &[u8]) -> bool {
        self.push(bytes);
        self.update(None);
        if let Some(m) = &mut self.meter {
            m.tick();
        }
        !self.sink.should_close()
    }

    fn apart(&mut self, bytes: &[u8]) {
        self.push_apart(bytes);
        self.update(None);
        if let Some(m) = &mut self.meter {
            m.tick();
        }
    }

    fn stderr_apart(&self) -> bool {
        self.stage
    }

    fn idle(&mut self) {
        Feed::idle(self, None);
        if let Some(m) = &mut self.meter {
            m.tick();
        }
    }

    fn close_at(&self) -> Option<Instant> {
        self.head_complete_at.map(|t| t + crate::sink::HEAD_CLOSE_AFTER)
    }

    fn lone_stage_stripped(&self) -> bool {
        self.lone_stage
    }
}

/// What every fence may write besides its root (contract §13): the shells' temp dir (`TMPDIR` of
/// their environment, else `/tmp`) and the `sandbox_writable` paths.
fn fence_extra(settings: &Settings, env: &[(OsString, OsString)]) -> Vec<PathBuf> {
    let tmp = env
        .iter()
        .find(|(k, v)| k == "TMPDIR" && !v.is_empty())
        .map(|(_, v)| PathBuf::from(v))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    let mut extra = vec![tmp];
    extra.extend(settings.sandbox_writable_paths());
    extra
}

/// `<state root>/run`, made private (0700) if missing: where the runtime directory goes when
/// every memory file system is writable by fenced shells.
fn private_state_dir(state_root: &Path) -> PathBuf {
    let dir = state_root.join("run");
    let _ = crate::shell::rundir::private_dirs(&dir);
    dir
}

/// A session taken for a pipe run ([`Runtime::session_for`]), or why the command did not run
/// (the outcome, and why its shell could not start).
enum Taken {
    /// The session, and whether an earlier shell of its key was lost (`shell_restarted`).
    Ready(Held<Shell>, bool),
    Unrun(Outcome, Option<String>),
}

/// How a run that ended ended (pipes and remote alike).
fn outcome_of(end: &shell::RunEnd, timeout: Option<Timeout>) -> Outcome {
    match end.ending {
        Ending::Done(code) | Ending::ShellExited(Some(code)) => {
            // We cut the output as `| head -n N` would: the pipeline's status is then head's,
            // whether the producer died of SIGPIPE or exited on EPIPE.
            Outcome::Exited(if end.closed_early { 0 } else { code })
        }
        Ending::ShellExited(None) => Outcome::MissingExitStatus,
        Ending::TimedOut => Outcome::TimedOut(timeout.map(|t| t.duration).unwrap_or_default()),
        Ending::Cancelled => Outcome::Cancelled,
    }
}

/// `waited_ms` of a result: the time spent waiting for a busy session, when it was noticeable.
fn waited_ms(waited: Duration) -> Option<u64> {
    (waited >= Duration::from_millis(1)).then_some(waited.as_millis() as u64)
}

/// A fenced run says so, and its text ends with the sandbox note when a write was refused
/// (contract §13).
fn note_fence(r: &mut BashResult, fence: Option<&Fence>) {
    let Some(fence) = fence else { return };
    r.sandbox = Some(fence.mode.as_str());
    if crate::fence::looks_denied(&r.text) {
        r.push_note(crate::fence::NOTE);
    }
}

fn live(sink: &Sink, display: Option<&Display>, pending: &str, last: bool) -> LiveUpdate {
    let mut tail = sink.window().to_string();
    tail.push_str(pending);
    let n = if last { display::MAX_LINES } else { display::LIVE_LINES };
    LiveUpdate {
        tail,
        total_bytes: sink.total_bytes(),
        total_lines: sink.total_lines(),
        lines: display.map(|d| d.last(n, pending)).unwrap_or_default(),
        last,
    }
}

/// Variables that give a command a handle on the user's editor: never in a tool call's
/// environment (contract §5); bang commands keep them, as `:!` does.
pub const EDITOR_HANDLES: &[&str] = &["NVIM", "NVIM_LISTEN_ADDRESS"];

/// The environment of a tool call (contract §5, §6): the caller's environment, the agent markers,
/// the non-interactive hardening (pagers, editors, prompts, `CI`), then the user's `env`
/// setting on top. Tool calls get it without [`EDITOR_HANDLES`].
pub fn command_env(settings: &Settings, shell: &Path) -> Vec<(OsString, OsString)> {
    let mut env = base_env(shell);
    let mut set = |k: &str, v: &str| {
        env.retain(|(ek, _)| ek != k);
        env.push((k.into(), v.into()));
    };
    set("GPG_TTY", "not a tty");
    for (k, v) in settings::HARDENING {
        set(k, v);
    }
    if std::env::var_os("AGENT_BASH_NO_CI").is_none() {
        set("CI", "true");
    }
    for (k, v) in &settings.env {
        set(k, v);
    }
    env
}

/// The environment of a bang command (`:AgentBash`, `:AgentBashTerm`): the user's own, as `:!`
/// gives it. No hardening and no `CI`: the user's `EDITOR`/`PAGER` make `git commit` and `man`
/// work in a terminal float, and npm or jest behave as in the user's terminal. The agent
/// marker, `SHELL` and the user's `env` setting are added.
pub fn bang_env(settings: &Settings, shell: &Path) -> Vec<(OsString, OsString)> {
    let mut env = base_env(shell);
    for (k, v) in &settings.env {
        env.retain(|(ek, _)| ek != k.as_str());
        env.push((k.into(), v.into()));
    }
    env
}

/// The caller's environment (without our owner mark) plus `SHELL` and `AGENT_BASH=1`.
fn base_env(shell: &Path) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| k != procs::OWNER_VAR && k != "SHELL" && k != "AGENT_BASH")
        .collect();
    env.push(("SHELL".into(), shell.as_os_str().into()));
    env.push(("AGENT_BASH".into(), "1".into()));
    env
}

/// The artifacts directory of a new session under the state root:
/// `<root>/sessions/<timestamp>-<pid>`.
pub fn new_session_dir(root: &Path) -> PathBuf {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    root.join("sessions").join(format!("{t}-{}", std::process::id()))
}
