//! The remote branch of the pipeline (contract §12): a command whose call names a profile (or that
//! `default_profile` sends away) runs in a persistent shell on the other side of the profile's
//! engine, one session per (profile, session key). Normalize, intercept, the sink, artifacts
//! and result shaping are the same as for a local run; only the shell is elsewhere, and the cwd
//! is the remote one (checked there; none given: where the last command left the shell).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::{
    blocked_result, settings, Feed, Origin, Request, Runtime, UpdateFn, BANG_KEY, DEFAULT_KEY,
};
use crate::normalize::{self, Normalized};
use crate::result::{self, BashResult, Outcome, Remote};
use crate::shell::local::Ending;
use crate::shell::remote::{Encoder, RemoteConfig, RemoteShell};
use crate::shell::{RunError, Session};
use crate::validate;
use crate::{Error, Result};

/// The name that always means "this machine", whatever `default_profile` says.
pub const LOCAL_PROFILE: &str = "local";

#[derive(Default)]
struct Slot {
    shell: Option<RemoteShell>,
    /// The previous session of this pair was thrown away: the next run says `shell_restarted`.
    lost: bool,
    last_used: Option<Instant>,
}

impl Slot {
    async fn close(&mut self) {
        if let Some(mut sh) = self.shell.take() {
            sh.close().await;
            self.lost = true;
        }
    }
}

/// One (profile, session key) pair's session, locked while a command runs in it.
type SharedSlot = Arc<tokio::sync::Mutex<Slot>>;

/// The live remote sessions, by (profile, session key).
#[derive(Default)]
pub(crate) struct Pool {
    sessions: Mutex<HashMap<(String, String), SharedSlot>>,
}

impl Pool {
    fn slot(&self, profile: &str, key: &str) -> SharedSlot {
        let mut map = match self.sessions.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        map.entry((profile.to_string(), key.to_string())).or_default().clone()
    }

    fn all(&self) -> Vec<SharedSlot> {
        match self.sessions.lock() {
            Ok(m) => m.values().cloned().collect(),
            Err(p) => p.into_inner().values().cloned().collect(),
        }
    }

    /// Closes idle sessions older than `idle` (busy ones are never touched).
    pub(crate) async fn close_idle(&self, idle: Duration) {
        for slot in self.all() {
            let Ok(mut guard) = slot.try_lock_owned() else { continue };
            if guard.shell.is_some() && guard.last_used.is_some_and(|t| t.elapsed() >= idle) {
                guard.close().await;
            }
        }
    }

    /// Closes every session (the remote side kills each tree).
    pub(crate) async fn shutdown(&self) {
        let slots: Vec<_> = match self.sessions.lock() {
            Ok(mut m) => m.drain().map(|(_, v)| v).collect(),
            Err(_) => Vec::new(),
        };
        for slot in slots {
            slot.lock().await.close().await;
        }
    }
}

impl Runtime {
    /// The profile a request runs under: its own, else `default_profile`; `None` for this
    /// machine (no profile, or [`LOCAL_PROFILE`]). An unknown name is bad input.
    pub fn remote_profile(&self, req: &Request) -> Result<Option<(String, Vec<String>)>> {
        let key = req.session_key.as_deref().unwrap_or(match req.origin {
            super::Origin::Bang => super::BANG_KEY,
            super::Origin::Tool => super::DEFAULT_KEY,
        });
        let name =
            req.profile.as_deref().filter(|p| !p.is_empty()).or(self.settings.profile_for(key));
        match name {
            None | Some(LOCAL_PROFILE) => Ok(None),
            Some(name) => match self.settings.profiles.get(name) {
                Some(argv) => Ok(Some((name.to_string(), argv.clone()))),
                None => Err(Error::InvalidInput(settings::unknown_profile(
                    name,
                    &self.settings.profiles,
                ))),
            },
        }
    }

    /// Runs `req` in the remote session of `profile` (contract §12).
    pub(super) async fn remote_path(
        &self,
        req: Request,
        (profile, argv): (String, Vec<String>),
        cancel: CancellationToken,
        on_update: Option<UpdateFn>,
    ) -> Result<BashResult> {
        let started = Instant::now();
        if req.pty {
            return Err(Error::InvalidInput(format!(
                "profile {profile:?}: remote commands run without a terminal (no PTY)"
            )));
        }
        let norm = match req.origin {
            Origin::Tool => normalize::normalize(&req.command, req.head, req.tail),
            Origin::Bang => Normalized::verbatim(&req.command, req.head, req.tail),
        };
        if req.origin == Origin::Tool {
            if let Some(block) = self.interceptor.check(&norm.command, req.tools.as_deref()) {
                return Ok(blocked_result(block, started.elapsed()));
            }
        }
        let timeout = match (req.origin, req.timeout) {
            (Origin::Bang, None) => None,
            (_, t) => Some(validate::timeout_from_secs(t)?),
        };
        if norm.command.is_empty() {
            return Err(Error::InvalidInput("command is empty".into()));
        }
        let cwd = req.cwd.as_deref().map(str::trim).filter(|c| !c.is_empty());

        let wait_started = Instant::now();
        let mut slot = match (&req.session_key, req.origin) {
            (None, Origin::Bang) => {
                // The user's own commands never wait (§8.2): the first idle bang session.
                let mut n = 1usize;
                loop {
                    let key = if n == 1 { BANG_KEY.to_string() } else { format!("{BANG_KEY}.{n}") };
                    if let Ok(guard) = self.remote.slot(&profile, &key).try_lock_owned() {
                        break guard;
                    }
                    n += 1;
                }
            }
            (key, _) => {
                let slot = self.remote.slot(&profile, key.as_deref().unwrap_or(DEFAULT_KEY));
                tokio::select! {
                    s = slot.lock_owned() => s,
                    _ = cancel.cancelled() => {
                        return Ok(self.shape_unrun(Outcome::Cancelled, started));
                    }
                }
            }
        };
        let mut shell_restarted = false;
        if slot.shell.is_none() {
            shell_restarted = slot.lost;
            let cfg = RemoteConfig {
                profile: profile.clone(),
                argv: argv.clone(),
                env: remote_env(&self.settings),
                encoder: Encoder::Auto,
            };
            let connect = tokio::select! {
                c = RemoteShell::connect(&cfg) => c,
                _ = cancel.cancelled() => {
                    return Ok(self.shape_unrun(Outcome::Cancelled, started));
                }
            };
            match connect {
                Ok(sh) => {
                    slot.shell = Some(sh);
                    slot.lost = false;
                }
                Err(why) => {
                    slot.lost = true;
                    let mut r = self.shape_unrun(Outcome::MissingExitStatus, started);
                    r.set_unstarted(&format!(
                        "Cannot start remote session {profile:?} ({}): {why}",
                        argv.join(" ")
                    ));
                    r.remote = Some(Remote { profile, host: None });
                    return Ok(r);
                }
            }
        }
        let waited = wait_started.elapsed();
        slot.last_used = Some(Instant::now());

        let limits = &self.settings.limits;
        let mut feed = Feed::new(self, &norm, req.display, on_update);
        let deadline = timeout.as_ref().map(|t| Instant::now() + t.duration);
        let run_started = Instant::now();
        let Some(shell) = slot.shell.as_mut() else {
            return Ok(self.shape_unrun(Outcome::MissingExitStatus, started));
        };
        let host = shell.host().to_string();
        let end = shell.run(&norm.runnable(), cwd, &mut feed, deadline, &cancel).await;
        let alive = shell.is_alive();
        if !alive {
            slot.close().await;
        }
        slot.last_used = Some(Instant::now());
        drop(slot);
        let remote = Remote { profile: profile.clone(), host: Some(host.clone()) };
        let mut lost = None;
        let outcome = match end {
            Err(RunError::BadCwd) => {
                let _ = feed.finish();
                let cwd = cwd.unwrap_or_default();
                return Err(Error::InvalidInput(format!(
                    "Working directory does not exist: {cwd} (on {host}, profile {profile:?})"
                )));
            }
            Err(RunError::Lost(why)) => {
                lost = Some(why);
                Outcome::MissingExitStatus
            }
            Err(RunError::Io(e)) => {
                lost = Some(e.to_string());
                Outcome::MissingExitStatus
            }
            Ok(end) => match end.ending {
                Ending::Done(code) | Ending::ShellExited(Some(code)) => {
                    Outcome::Exited(if end.closed_early { 0 } else { code })
                }
                Ending::ShellExited(None) => Outcome::MissingExitStatus,
                Ending::TimedOut => {
                    Outcome::TimedOut(timeout.map(|t| t.duration).unwrap_or_default())
                }
                Ending::Cancelled => Outcome::Cancelled,
            },
        };
        let mut r = result::shape(
            feed.finish().finish(),
            &outcome,
            started.elapsed(),
            limits.max_bytes as u64,
        );
        if let Some(why) = lost {
            r.set_session_lost(&why);
        }
        r.shell_restarted = shell_restarted;
        r.waited_ms = (waited >= Duration::from_millis(1)).then_some(waited.as_millis() as u64);
        r.timeout_clamped_from = timeout.and_then(|t| t.clamped_from);
        if !norm.rewrites.is_empty() {
            r.normalized = serde_json::to_value(&norm).ok();
        }
        r.set_resources(crate::resources::Resources {
            wall_ms: run_started.elapsed().as_millis() as u64,
            ..Default::default()
        });
        r.remote = Some(remote);
        Ok(r)
    }
}

/// The variables a remote shell exports: the agent markers and the hardening of contract §6, then
/// the user's `env` setting (the local environment stays here: its paths mean nothing there).
pub fn remote_env(s: &settings::Settings) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![("AGENT_BASH".into(), "1".into())];
    for (k, v) in settings::HARDENING {
        env.push(((*k).into(), (*v).into()));
    }
    if std::env::var_os("AGENT_BASH_NO_CI").is_none() {
        env.push(("CI".into(), "true".into()));
    }
    for (k, v) in &s.env {
        env.retain(|(ek, _)| ek != k);
        env.push((k.clone(), v.clone()));
    }
    env
}
