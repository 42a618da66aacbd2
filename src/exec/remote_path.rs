//! The remote branch of the pipeline (contract §12): a prepared command ([`crate::prepare`])
//! whose call names a profile (or that `default_profile` sends away) runs in a persistent shell
//! on the other side of the profile's engine, one session per (profile, session key).
//! Normalize, intercept, the sink, artifacts and result shaping are the same as for a local
//! run; only the shell is elsewhere, and the cwd is the remote one (checked there; none given:
//! where the last command left the shell).

use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::slots::{bang_key, Held, Kind};
use super::{outcome_of, settings, waited_ms, Feed, Origin, Prepared, Request, Runtime, UpdateFn};
use crate::prepare::DEFAULT_KEY;
pub use crate::prepare::LOCAL_PROFILE;
use crate::result::{BashResult, Outcome, Remote};
use crate::shell::remote::{Encoder, RemoteConfig, RemoteShell};
use crate::shell::{RunError, Session};
use crate::{Error, Result};

impl Runtime {
    /// The profile a request runs under: its own, else `default_profile`; `None` for this
    /// machine (no profile, or [`LOCAL_PROFILE`]). An unknown name is bad input.
    pub fn remote_profile(&self, req: &Request) -> Result<Option<(String, Vec<String>)>> {
        crate::prepare::remote_profile(&self.settings, req)
    }

    /// Runs a prepared command in the remote session of `profile` (contract §12), at `cwd`
    /// there (`None`: where its shell is).
    pub(super) async fn remote_path(
        &self,
        p: &Prepared,
        (profile, argv, cwd): (&str, &[String], Option<&str>),
        cancel: CancellationToken,
        on_update: Option<UpdateFn>,
    ) -> Result<BashResult> {
        let started = p.clock();
        let wait_started = Instant::now();
        let (mut slot, shell_restarted) = match self.remote_session(p, profile, argv, &cancel).await
        {
            Ok(taken) => taken,
            Err(unrun) => {
                let mut r = self.shape_unrun(unrun.0, started);
                // A session that could not start names its profile; a cancelled wait does not.
                if let Some(why) = unrun.1 {
                    r.set_unstarted(&why);
                    r.remote = Some(Remote { profile: profile.to_string(), host: None });
                }
                return Ok(r);
            }
        };
        let waited = wait_started.elapsed();
        slot.last_used = Some(Instant::now());

        let mut feed = Feed::new(self, &p.norm, p.display, on_update);
        let deadline = p.timeout.as_ref().map(|t| Instant::now() + t.duration);
        let run_started = Instant::now();
        let Some(shell) = slot.shell.as_mut() else {
            return Ok(self.shape_unrun(Outcome::MissingExitStatus, started));
        };
        let host = shell.host().to_string();
        let end = shell.run(&p.norm.runnable(), cwd, &mut feed, deadline, &cancel).await;
        if !shell.is_alive() {
            slot.close().await;
        }
        let key = p.session_key.as_ref().map(|k| (profile.to_string(), k.clone()));
        self.remote.release(slot, key.as_ref());
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
            Ok(end) => outcome_of(&end, p.timeout),
        };
        let mut r = self.shape_run(p, &p.norm, feed.finish().finish(), &outcome, started);
        if let Some(why) = lost {
            r.set_session_lost(&why);
        }
        r.shell_restarted = shell_restarted;
        r.waited_ms = waited_ms(waited);
        r.set_resources(crate::resources::Resources {
            wall_ms: run_started.elapsed().as_millis() as u64,
            ..Default::default()
        });
        r.remote = Some(Remote { profile: profile.to_string(), host: Some(host) });
        Ok(r)
    }

    /// The remote session of (`profile`, the call's key), connected if it is not, and whether
    /// an earlier session of that pair was lost (`shell_restarted`); else why the command did
    /// not run (its outcome, and why its session could not start).
    async fn remote_session(
        &self,
        p: &Prepared,
        profile: &str,
        argv: &[String],
        cancel: &CancellationToken,
    ) -> std::result::Result<(Held<RemoteShell>, bool), (Outcome, Option<String>)> {
        let mut slot = match (&p.session_key, p.origin) {
            // The user's own commands never wait (§8.2): the first idle bang session.
            (None, Origin::Bang) => self.remote.take_idle(|n| (profile.to_string(), bang_key(n))),
            (key, _) => {
                let key = (profile.to_string(), key.as_deref().unwrap_or(DEFAULT_KEY).to_string());
                match self.remote.take(&key, cancel).await {
                    Some(slot) => slot,
                    None => return Err((Outcome::Cancelled, None)),
                }
            }
        };
        if slot.shell.is_some() {
            return Ok((slot, false));
        }
        // Our own slot is locked, so eviction never picks it whatever key we name.
        let key = (profile.to_string(), p.key().to_string());
        let Some(permit) = self.remote.reserve(&key, cancel).await else {
            return Err((Outcome::Cancelled, None));
        };
        let cfg = RemoteConfig {
            profile: profile.to_string(),
            argv: argv.to_vec(),
            env: remote_env(&self.settings),
            encoder: Encoder::Auto,
        };
        let connect = tokio::select! {
            c = RemoteShell::connect(&cfg) => c,
            _ = cancel.cancelled() => return Err((Outcome::Cancelled, None)),
        };
        match connect {
            Ok(sh) => {
                slot.fill(sh, Kind::default(), Some(permit));
                let shell_restarted = slot.take_lost();
                Ok((slot, shell_restarted))
            }
            Err(why) => {
                slot.mark_lost();
                let why =
                    format!("Cannot start remote session {profile:?} ({}): {why}", argv.join(" "));
                Err((Outcome::MissingExitStatus, Some(why)))
            }
        }
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
