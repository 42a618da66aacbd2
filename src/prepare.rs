//! A call prepared once (contract §1–§3, §5, §6, §12, §13): every decision made about a command
//! before it runs — its session key, the profile it runs under, the cwd it starts in, PTY or
//! pipes, normalization, interception, the timeout, the fence — made in one place, into a
//! [`Prepared`] value that every way of running it (pipes, a PTY, a remote shell; a tool call or
//! the user's own command) runs from. A caller that must know before the run whether it will
//! happen (a terminal view opens only for a command that runs) asks [`Preparer::prepare`] and
//! hands the same value on, so nothing is normalized, intercepted or resolved twice.
//!
//! What it needs of the runtime is in [`Preparer`]; it starts nothing and keeps no state.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::exec::settings::{self, Settings};
use crate::fence::{Fence, SandboxMode};
use crate::intercept::Interceptor;
use crate::normalize::{self, Dialect, Normalized};
use crate::result::BashResult;
use crate::shell::Origin;
use crate::validate::{self, Timeout};
use crate::{Error, Result};

/// Session key used by tool calls that do not name one.
pub const DEFAULT_KEY: &str = "default";
/// Session key of the user's own commands (contract §5: "bang commands use the editor session's
/// key"): a long `:AgentBash npm run dev` never holds up the agent's shell, and the user's
/// `export`s stay out of it. Commands that run side by side get `bang.2`, `bang.3`, … (§8.2).
pub const BANG_KEY: &str = "bang";
/// The name that always means "this machine", whatever `default_profile` says.
pub const LOCAL_PROFILE: &str = "local";
/// The longest `session_key` accepted (contract §5: keys are bounded).
pub const MAX_KEY_BYTES: usize = 256;

/// One command to run.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub origin: Origin,
    pub command: String,
    /// Seconds; validated and clamped for tool calls (default 300); bang commands have none
    /// unless given.
    pub timeout: Option<f64>,
    pub cwd: Option<String>,
    /// `cwd` is a path of this machine (the editor's directory, or one resolved against it),
    /// which means nothing on another one: a run sent to a remote profile (its own, or the
    /// settings' `default_profile` / `[profile_by_key]`) starts at [`Request::remote_cwd`]
    /// instead.
    pub local_cwd: bool,
    /// With [`Request::local_cwd`]: where a remote run starts (the caller's own path over
    /// there); `None`: where that session's shell is.
    pub remote_cwd: Option<String>,
    pub head: Option<usize>,
    pub tail: Option<usize>,
    pub tools: Option<Vec<String>>,
    pub session_key: Option<String>,
    /// Keep styled display lines for live updates (Neovim cards).
    pub display: bool,
    /// Run in a PTY whatever the selection rules say (contract §6: `exec --pty`, `:AgentBashTerm`).
    pub pty: bool,
    /// The remote profile to run under (contract §12); `None`: `default_profile`, else this machine.
    pub profile: Option<String>,
}

impl Request {
    /// The session key the call runs under: its own, else the default of its origin.
    pub fn key(&self) -> &str {
        self.session_key.as_deref().unwrap_or(match self.origin {
            Origin::Bang => BANG_KEY,
            Origin::Tool => DEFAULT_KEY,
        })
    }
}

/// What preparing a call came to: a command to run, or the result of one interception stopped.
#[derive(Debug)]
pub enum Prep {
    Run(Box<Prepared>),
    Blocked(Box<BashResult>),
}

/// A command that passed every check and the decisions about where and how it runs.
#[derive(Debug)]
pub struct Prepared {
    pub(crate) origin: Origin,
    /// The command as the call gave it (the change receipt names it).
    pub(crate) command: String,
    /// The session key the call named (`None`: the default of its origin, or any idle bang
    /// session for the user's own commands).
    pub(crate) session_key: Option<String>,
    pub(crate) norm: Normalized,
    /// The caller's own `head` and `tail` (what a run keeps when nothing is stripped).
    pub(crate) asked_limits: (Option<usize>, Option<usize>),
    pub(crate) timeout: Option<Timeout>,
    pub(crate) display: bool,
    pub(crate) place: Place,
    /// The cwd the call asked for where it runs (a remote run's `remote_cwd`), as given.
    asked_cwd: Option<String>,
    /// How long the preparation took: the run's duration counts it.
    took: Duration,
}

/// Where a prepared command runs.
#[derive(Debug)]
pub(crate) enum Place {
    /// On this machine, in `cwd` (resolved, an existing directory).
    Local {
        cwd: PathBuf,
        /// The fence of a tool call's shell (contract §13).
        fence: Option<Fence>,
        /// In a PTY rather than a shell session (contract §6).
        pty: bool,
    },
    /// In the remote session of `profile` (contract §12), started by `argv`; `cwd` is checked
    /// on the other side (`None`: where the last command left the shell).
    Remote { profile: String, argv: Vec<String>, cwd: Option<String> },
}

impl Prepared {
    /// Whether the command runs in a PTY (a terminal view is then wanted).
    pub fn pty(&self) -> bool {
        matches!(self.place, Place::Local { pty: true, .. })
    }

    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// The key of the session the command runs in: the one the call named, else its origin's
    /// default (a bang command may then run in another idle bang session).
    pub(crate) fn key(&self) -> &str {
        self.session_key.as_deref().unwrap_or(match self.origin {
            Origin::Bang => BANG_KEY,
            Origin::Tool => DEFAULT_KEY,
        })
    }

    /// The command as the call gave it.
    pub fn command(&self) -> &str {
        &self.command
    }

    /// The cwd the call asked for where the command runs, as given (`None`: none).
    pub fn asked_cwd(&self) -> Option<&str> {
        self.asked_cwd.as_deref()
    }

    /// When the run started, for its duration: now, less the time the preparation took.
    pub(crate) fn clock(&self) -> Instant {
        let now = Instant::now();
        now.checked_sub(self.took).unwrap_or(now)
    }
}

/// What preparing a call needs of the runtime: the interceptor, the directory relative cwds
/// resolve against, the shell's dialect and the fence's settled parts.
#[derive(Debug)]
pub(crate) struct Preparer {
    interceptor: Interceptor,
    pub(crate) base_dir: PathBuf,
    dialect: Dialect,
    /// The fence's root (contract §13: `sandbox_root`, else the start directory's project).
    pub(crate) fence_root: PathBuf,
    /// What every fence may write besides the root: the shells' temp dir, `sandbox_writable`.
    fence_extra: Vec<PathBuf>,
    /// Why a `workspace-write` (first) or `read-only` (second) fence cannot hold here.
    fence_refusal: [Option<String>; 2],
}

impl Preparer {
    /// The preparer of a runtime whose shell is `shell`: `base_dir` is where relative cwds
    /// resolve; `fence` the fence's root and what it may write besides; `own` what no fenced
    /// shell may write (the backend's own files): a fence that would reach them is refused.
    pub(crate) fn new(
        s: &Settings,
        base_dir: PathBuf,
        shell: &Path,
        (fence_root, fence_extra): (PathBuf, Vec<PathBuf>),
        own: &[PathBuf],
    ) -> Preparer {
        let refusal = |mode| {
            let f = Fence::new(mode, &fence_root, &fence_extra, true)?;
            let (p, w) = f.exposes(own)?;
            Some(format!(
                "the fence would let commands write agent-bash's own files ({} lies in the writable {}); set `sandbox_root` (or `sandbox_writable`, `state_dir`) so that they do not overlap; the command was not run",
                p.display(),
                w.display()
            ))
        };
        let fence_refusal = [
            refusal(SandboxMode::WorkspaceWrite).filter(|_| s.fences_any()),
            refusal(SandboxMode::ReadOnly).filter(|_| s.fences_any()),
        ];
        Preparer {
            interceptor: Interceptor::new(&s.interceptor),
            base_dir,
            dialect: Dialect::of(shell),
            fence_root,
            fence_extra,
            fence_refusal,
        }
    }

    /// Prepares `req` (contract §1–§3 in this order: key, profile, normalize, intercept, cwd,
    /// timeout, empty command, fence). `Err` for bad input; [`Prep::Blocked`] when interception
    /// stops the command. `ui_attached`: an interactive UI shows our output (§6).
    pub(crate) fn prepare(&self, s: &Settings, req: Request, ui_attached: bool) -> Result<Prep> {
        let started = Instant::now();
        check_key(&req)?;
        let remote = remote_profile(s, &req)?;
        if let (Some((profile, _)), true) = (&remote, req.pty) {
            return Err(Error::InvalidInput(format!(
                "profile {profile:?}: remote commands run without a terminal (no PTY)"
            )));
        }
        let pty = remote.is_none() && wants_pty(s, &req, ui_attached);
        // §1 normalize and §2 intercept: tool calls only; the user's own commands run verbatim.
        // A remote shell is bash, and like a terminal it has one stream: no stage is stripped.
        let norm = match (req.origin, &remote) {
            (Origin::Bang, _) => Normalized::verbatim(&req.command, req.head, req.tail),
            (Origin::Tool, None) => {
                normalize::normalize_in(self.dialect, &req.command, req.head, req.tail, pty)
            }
            (Origin::Tool, Some(_)) => {
                normalize::normalize_keeping_stage(&req.command, req.head, req.tail)
            }
        };
        if req.origin == Origin::Tool {
            if let Some(block) = self.interceptor.check(&norm.command, req.tools.as_deref()) {
                return Ok(Prep::Blocked(Box::new(blocked_result(block, started.elapsed()))));
            }
        }
        // §3 validate; a remote cwd is checked on the remote side (§12).
        let asked_cwd = match (&remote, req.local_cwd) {
            (Some(_), true) => req.remote_cwd.clone(),
            _ => req.cwd.clone(),
        };
        let cwd = match remote {
            None => Some(validate::resolve_cwd(&self.base_dir, asked_cwd.as_deref())?),
            Some(_) => None,
        };
        let timeout = match (req.origin, req.timeout) {
            (Origin::Bang, None) => None,
            (_, t) => Some(validate::timeout_from_secs(t)?),
        };
        if norm.command.is_empty() {
            return Err(Error::InvalidInput("command is empty".into()));
        }
        let place = match (remote, cwd) {
            (Some((profile, argv)), _) => {
                let cwd = asked_cwd.as_deref().map(str::trim).filter(|c| !c.is_empty());
                Place::Remote { profile, argv, cwd: cwd.map(str::to_string) }
            }
            (None, cwd) => {
                Place::Local { cwd: cwd.unwrap_or_default(), fence: self.fence_for(s, &req)?, pty }
            }
        };
        Ok(Prep::Run(Box::new(Prepared {
            origin: req.origin,
            command: req.command,
            session_key: req.session_key,
            norm,
            asked_limits: (req.head, req.tail),
            timeout,
            display: req.display,
            place,
            asked_cwd,
            took: started.elapsed(),
        })))
    }

    /// The fence of a call's shell (contract §13): tool calls only, by the session key's setting,
    /// around the user's fence root whatever the call's cwd (a cwd outside it runs with the
    /// same fence: nothing there can be written). A kernel without Landlock, or a fence that
    /// would reach the backend's own files, refuses a fenced call.
    fn fence_for(&self, s: &Settings, req: &Request) -> Result<Option<Fence>> {
        if req.origin != Origin::Tool {
            return Ok(None);
        }
        let mode = s.sandbox_for(req.key());
        let fence =
            Fence::new(mode, &self.fence_root, &self.fence_extra, s.network.unwrap_or(true));
        if fence.is_some() {
            if let Err(why) = crate::fence::kernel_abi() {
                return Err(Error::SandboxUnavailable(format!(
                    "{} ({why})",
                    crate::fence::UNSUPPORTED
                )));
            }
            let refusal = match mode {
                SandboxMode::ReadOnly => &self.fence_refusal[1],
                _ => &self.fence_refusal[0],
            };
            if let Some(why) = refusal {
                return Err(Error::SandboxUnavailable(why.clone()));
            }
        }
        Ok(fence)
    }
}

/// The profile a request runs under: its own, else the settings' for its key; `None` for this
/// machine (no profile, or [`LOCAL_PROFILE`]). An unknown name is bad input.
pub fn remote_profile(s: &Settings, req: &Request) -> Result<Option<(String, Vec<String>)>> {
    let name = req.profile.as_deref().filter(|p| !p.is_empty()).or(s.profile_for(req.key()));
    match name {
        None | Some(LOCAL_PROFILE) => Ok(None),
        Some(name) => match s.profiles.get(name) {
            Some(argv) => Ok(Some((name.to_string(), argv.clone()))),
            None => Err(Error::InvalidInput(settings::unknown_profile(name, &s.profiles))),
        },
    }
}

/// Whether `req` runs in a PTY ([`crate::pty::wants_pty`] with these settings, the process
/// environment and the UI state).
pub fn wants_pty(s: &Settings, req: &Request, ui_attached: bool) -> bool {
    crate::pty::wants_pty(
        req.pty,
        req.origin,
        s.virtual_terminal.as_deref(),
        ui_attached,
        |k: &str| std::env::var_os(k),
    )
}

/// Refuses a session key longer than [`MAX_KEY_BYTES`]: every key names a session slot kept in
/// memory, so an unbounded key would let requests grow the backend without limit.
fn check_key(req: &Request) -> Result<()> {
    match &req.session_key {
        Some(k) if k.len() > MAX_KEY_BYTES => Err(Error::InvalidInput(format!(
            "session_key is {} bytes long; at most {MAX_KEY_BYTES} are allowed",
            k.len()
        ))),
        _ => Ok(()),
    }
}

/// The result of a command interception stopped (contract §2): an error with the exact text and
/// the structured block.
fn blocked_result(block: crate::intercept::Block, took: Duration) -> BashResult {
    BashResult {
        output: block.message.clone(),
        is_error: true,
        duration_ms: took.as_millis() as u64,
        blocked: serde_json::to_value(&block).ok(),
        ..Default::default()
    }
}
