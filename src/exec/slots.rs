//! The session slots, above the [`Session`] interface (contract §5, §12): one slot per key,
//! locked while a command runs in it; `limits.max_sessions` (a place per live shell, taken
//! before the shell starts, the least recently used idle session closed to make room); idle
//! eviction; the user's commands taking any idle bang session (§8.2); and `shell_restarted`
//! (a key whose shell was thrown away says so on its next run, even after its slot was freed).
//! The local shells (by session key) and the remote ones (by profile and key) use this same
//! code.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedMutexGuard, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::fence::Fence;
use crate::prepare::BANG_KEY;
use crate::shell::Session;

/// How many freed keys remember that their shell was lost (bounded memory, contract §5).
const LOST_KEPT: usize = 256;

/// What a shell was started for: a call that wants another kind gets a fresh shell.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Kind {
    /// Started for a bang command, with the editor's handles in its environment: a tool call
    /// never runs in it (contract §5).
    pub(crate) editor_env: bool,
    /// The fence it started under (contract §13).
    pub(crate) fence: Option<Fence>,
}

/// One key's session.
pub(crate) struct Slot<S> {
    pub(crate) shell: Option<S>,
    /// This shell's place among the live ones (`limits.max_sessions`); dropped with the shell.
    permit: Option<OwnedSemaphorePermit>,
    /// The previous shell of this key was thrown away: the next run reports `shell_restarted`.
    lost: bool,
    pub(crate) kind: Kind,
    pub(crate) last_used: Option<Instant>,
}

impl Kind {
    /// Whether a shell of this kind may run a call that wants `want`: a shell with the editor's
    /// handles never serves a tool call, and the fence must be the same.
    pub(crate) fn serves(&self, want: &Kind) -> bool {
        (want.editor_env || !self.editor_env) && self.fence == want.fence
    }
}

/// The key of the `n`-th bang session (1: [`BANG_KEY`], then `bang.2`, `bang.3`, …).
pub(crate) fn bang_key(n: usize) -> String {
    match n {
        1 => BANG_KEY.to_string(),
        n => format!("{BANG_KEY}.{n}"),
    }
}

impl<S> Default for Slot<S> {
    fn default() -> Self {
        Slot { shell: None, permit: None, lost: false, kind: Kind::default(), last_used: None }
    }
}

impl<S: Session> Slot<S> {
    /// Ends the shell (and everything it started) and gives its place back; the next command
    /// of this key says `shell_restarted`, since its state is gone.
    pub(crate) async fn close(&mut self) {
        if let Some(mut sh) = self.shell.take() {
            sh.close().await;
            self.lost = true;
        }
        self.permit = None;
    }

    /// Puts a started shell in the slot.
    pub(crate) fn fill(&mut self, shell: S, kind: Kind, permit: Option<OwnedSemaphorePermit>) {
        self.shell = Some(shell);
        self.kind = kind;
        self.permit = permit;
    }

    /// Whether the shell before this one was lost (the run's `shell_restarted`), said once.
    pub(crate) fn take_lost(&mut self) -> bool {
        std::mem::take(&mut self.lost)
    }

    /// A shell could not be started: the next run still says `shell_restarted`.
    pub(crate) fn mark_lost(&mut self) {
        self.lost = true;
    }
}

/// A slot as the map holds it: locked while a command runs in it.
type Shared<S> = Arc<tokio::sync::Mutex<Slot<S>>>;
/// A slot taken for a run.
pub(crate) type Held<S> = OwnedMutexGuard<Slot<S>>;

/// Every slot of one kind of shell, by key.
pub(crate) struct Slots<S, K = String> {
    map: Mutex<HashMap<K, Shared<S>>>,
    /// Keys whose freed slot had lost its shell: their next call says `shell_restarted`.
    lost_keys: Mutex<VecDeque<K>>,
    /// One permit per live shell: a shell starts only with one.
    capacity: Arc<Semaphore>,
    /// Woken whenever a run lets go of its session, so a run waiting for capacity can close
    /// that (now idle) shell.
    released: tokio::sync::Notify,
}

impl<S: Session, K: Clone + Eq + Hash + std::fmt::Debug> Slots<S, K> {
    /// Slots for at most `max` live shells.
    pub(crate) fn new(max: usize) -> Self {
        Slots {
            map: Mutex::new(HashMap::new()),
            lost_keys: Mutex::new(VecDeque::new()),
            capacity: Arc::new(Semaphore::new(max.min(Semaphore::MAX_PERMITS))),
            released: tokio::sync::Notify::new(),
        }
    }

    /// The slot of `key`, made if missing.
    pub(crate) fn slot(&self, key: &K) -> Shared<S> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(key.clone())
            .or_insert_with(|| {
                // A key whose closed shell was forgotten still says `shell_restarted` once.
                let lost = self.forget_lost(key);
                Arc::new(tokio::sync::Mutex::new(Slot { lost, ..Default::default() }))
            })
            .clone()
    }

    /// The slot of `key` once no other run holds it; `None` when `cancel` fires first.
    pub(crate) async fn take(&self, key: &K, cancel: &CancellationToken) -> Option<Held<S>> {
        let slot = self.slot(key);
        tokio::select! {
            s = slot.lock_owned() => Some(s),
            _ = cancel.cancelled() => None,
        }
    }

    /// The first idle slot of `key_of(1)`, `key_of(2)`, … (a new one when every one is busy):
    /// the user's own commands never wait (contract §8.2).
    pub(crate) fn take_idle(&self, key_of: impl Fn(usize) -> K) -> Held<S> {
        let mut n = 1usize;
        loop {
            if let Ok(guard) = self.slot(&key_of(n)).try_lock_owned() {
                return guard;
            }
            n += 1;
        }
    }

    /// Lets go of a slot after a run: `key`'s slot is freed when its shell is gone (a key the
    /// call named; the default ones stay), and a run waiting for capacity is woken.
    pub(crate) fn release(&self, mut slot: Held<S>, key: Option<&K>) {
        slot.last_used = Some(Instant::now());
        let gone = slot.shell.is_none();
        drop(slot);
        if let (true, Some(key)) = (gone, key) {
            self.free(key);
        }
        self.released.notify_waiters();
    }

    /// Frees the slot of `key` when its shell is gone and nobody holds or waits for it (contract
    /// §5: memory does not grow with the number of keys ever used). That its shell was lost
    /// is remembered for the newest [`LOST_KEPT`] keys only.
    fn free(&self, key: &K) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let Some(slot) = map.get(key) else { return };
        if Arc::strong_count(slot) != 1 {
            return;
        }
        let lost = match slot.try_lock() {
            Ok(s) if s.shell.is_none() => s.lost,
            _ => return,
        };
        map.remove(key);
        drop(map);
        if lost {
            let mut kept = self.lost_keys.lock().unwrap_or_else(|e| e.into_inner());
            if kept.len() >= LOST_KEPT {
                kept.pop_front();
            }
            kept.push_back(key.clone());
        }
    }

    /// Whether `key`'s forgotten slot had lost its shell (and forgets that).
    fn forget_lost(&self, key: &K) -> bool {
        let mut kept = self.lost_keys.lock().unwrap_or_else(|e| e.into_inner());
        match kept.iter().position(|k| k == key) {
            Some(i) => kept.remove(i).is_some(),
            None => false,
        }
    }

    /// A free place for one more live shell now, if there is one (never closes another).
    pub(crate) fn try_permit(&self) -> Option<OwnedSemaphorePermit> {
        self.capacity.clone().try_acquire_owned().ok()
    }

    /// A place for one more live shell (contract §5, `limits.max_sessions`), taken before the
    /// shell starts so the limit holds at every moment. When every place is taken, the least
    /// recently used idle session (not `key`'s own) is closed to make room; when every live
    /// session is busy, the call waits until one finishes and then closes it (or until a shell
    /// exits by itself). `None` when the call is cancelled while waiting.
    pub(crate) async fn reserve(
        &self,
        key: &K,
        cancel: &CancellationToken,
    ) -> Option<OwnedSemaphorePermit> {
        loop {
            // Registered before looking, so a run that ends in between still wakes us.
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if let Some(permit) = self.try_permit() {
                return Some(permit);
            }
            if self.close_least_recent(key).await {
                continue;
            }
            tokio::select! {
                permit = self.capacity.clone().acquire_owned() => {
                    if let Ok(permit) = permit {
                        return Some(permit);
                    }
                }
                _ = &mut released => {}
                _ = cancel.cancelled() => return None,
            }
        }
    }

    /// Closes the least recently used idle session other than `key`'s; false when every live
    /// session is busy.
    async fn close_least_recent(&self, key: &K) -> bool {
        let mut idle: Vec<(Instant, K, Held<S>)> = self
            .all()
            .into_iter()
            .filter(|(k, _)| k != key)
            .filter_map(|(k, slot)| {
                let guard = slot.try_lock_owned().ok()?;
                let used = guard.last_used.unwrap_or_else(Instant::now);
                guard.shell.is_some().then_some((used, k, guard))
            })
            .collect();
        idle.sort_by_key(|(t, _, _)| *t);
        let Some((_, k, mut guard)) = idle.into_iter().next() else { return false };
        tracing::info!("closing shell session {k:?}: limits.max_sessions reached");
        guard.close().await;
        drop(guard);
        self.free(&k);
        true
    }

    fn all(&self) -> Vec<(K, Shared<S>)> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// Closes the sessions idle for `idle_limit` or longer and frees the slots without a
    /// shell. Busy sessions are never touched.
    pub(crate) async fn close_idle(&self, idle_limit: Duration) {
        let mut closed = Vec::new();
        for (key, slot) in self.all() {
            let Ok(mut guard) = slot.try_lock_owned() else { continue };
            let stale = guard.last_used.is_some_and(|t| t.elapsed() >= idle_limit);
            if guard.shell.is_some() && stale {
                tracing::info!("closing shell session {key:?}: idle");
                guard.close().await;
            }
            if guard.shell.is_none() {
                closed.push(key);
            }
        }
        for key in closed {
            self.free(&key);
        }
    }

    /// Closes every session (each kills what it started).
    pub(crate) async fn shutdown(&self) {
        let slots: Vec<Shared<S>> = match self.map.lock() {
            Ok(mut m) => m.drain().map(|(_, v)| v).collect(),
            Err(_) => Vec::new(),
        };
        for slot in slots {
            slot.lock().await.close().await;
        }
    }
}
