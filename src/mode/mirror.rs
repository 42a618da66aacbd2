//! The editor mirror of `agent-bash mcp` (contract §11): every call an MCP client makes shows live
//! as a tool card in the user's Neovim, and cancelling that card cancels the call.
//!
//! The editor is found by [`find_editor`]: `$NVIM` (an agent started in a Neovim terminal),
//! else `--nvim ADDRESS`, else (with `auto`) the newest live editor of the discovery registry
//! (`<state>/agent-bash/editors/<pid>.json`, kept by `lua/agent_bash/mirror.lua`) whose working
//! directory contains ours; the registry of the default state directory under `$HOME` is read
//! too, where an editor with its own `$XDG_STATE_HOME` also registers, for a server started with
//! a minimal environment (MCP hubs pass on only HOME, PATH, SHELL, TERM). nvim-rs connects to its RPC socket; the cards are driven through the
//! plugin's own card API (`require('agent_bash.mirror')`: `hello`, `open`, `event`), the events
//! being the nvim mode's (`update`, `done`).
//!
//! The commands run in the server's own processes, and the mirror must never fail, block or slow
//! a call: callers only `try_send` into a bounded queue (an update is dropped rather than
//! waited for), one task talks to the editor with a deadline on every request, and the first
//! failure (no plugin, the editor quit, a hung editor) turns the mirror off for good.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nvim_rs::compat::tokio::Compat;
use nvim_rs::{Handler, Neovim};
use rmpv::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::wire::{map, msgpack_to_json};

type Writer = Compat<tokio::io::WriteHalf<tokio::net::UnixStream>>;

/// Messages waiting for the editor; beyond this, updates are dropped (never waited for).
const QUEUE: usize = 256;
/// Longest wait for the editor's socket to accept us.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait for one answer of the editor; a busier editor is treated as gone.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

const EVENT_LUA: &str = "return require('agent_bash.mirror').event(...)";
const OPEN_LUA: &str = "return require('agent_bash.mirror').open(...)";
const HELLO_LUA: &str = "return require('agent_bash.mirror').hello(...)";
const CONTEXT_LUA: &str = "return require('agent_bash.mirror').context()";

/// The discovery registry's directory (the Lua side computes the same path).
pub fn registry_dir() -> PathBuf {
    crate::artifacts::state_root().join("editors")
}

/// Every registry discovery reads: [`registry_dir`], and the one of the default state
/// directory under `$HOME` (what [`registry_dir`] is without `$XDG_STATE_HOME`), where the
/// plugin registers as well. A server started by an MCP hub with only HOME, PATH, SHELL and
/// TERM finds an editor that has an `$XDG_STATE_HOME` of its own there.
pub fn registry_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![registry_dir()];
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from);
    let default = home.map(|h| match cfg!(target_os = "macos") {
        true => h.join("Library/Application Support/agent-bash/editors"),
        false => h.join(".local/state/agent-bash/editors"),
    });
    if let Some(d) = default.filter(|d| !dirs.contains(d)) {
        dirs.push(d);
    }
    dirs
}

/// The editor to mirror into, by contract §11's order: `$NVIM`, else `--nvim ADDRESS`, else with
/// `auto` the newest registered live editor whose cwd contains `cwd`. `off` means none.
pub fn find_editor(flag: &str, cwd: &Path) -> Option<String> {
    if flag == "off" {
        return None;
    }
    if let Some(addr) = std::env::var("NVIM").ok().filter(|a| !a.is_empty()) {
        return Some(addr);
    }
    if flag != "auto" {
        return Some(flag.to_string());
    }
    discover(&registry_dirs(), cwd)
}

#[derive(serde::Deserialize)]
struct Entry {
    address: String,
    pid: i32,
    cwd: PathBuf,
    #[serde(default)]
    started: u64,
}

/// The newest live editor of the registries in `dirs` whose cwd contains `cwd`. Entries of
/// dead editors are removed on the way.
// The discovery registry: a few small files read once, when the server starts.
#[allow(clippy::disallowed_methods)]
pub fn discover(dirs: &[PathBuf], cwd: &Path) -> Option<String> {
    let mut best: Option<Entry> = None;
    let files = dirs.iter().filter_map(|d| std::fs::read_dir(d).ok()).flatten().flatten();
    for file in files {
        let path = file.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let Some(entry) =
            std::fs::read(&path).ok().and_then(|b| serde_json::from_slice::<Entry>(&b).ok())
        else {
            continue;
        };
        if !pid_alive(entry.pid) {
            tracing::info!("mirror: removing the entry of a dead editor: {}", path.display());
            let _ = std::fs::remove_file(&path);
            continue;
        }
        if !cwd.starts_with(&entry.cwd) {
            continue;
        }
        if best.as_ref().is_none_or(|b| entry.started > b.started) {
            best = Some(entry);
        }
    }
    best.map(|e| e.address)
}

fn pid_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The editor was asked but gave no answer in time (it went away, or is busy).
#[derive(Debug, thiserror::Error)]
#[error("the editor did not answer")]
pub struct NoAnswer;

enum Msg {
    Open {
        key: u64,
        spec: Value,
    },
    Event {
        key: u64,
        ev: Value,
        last: bool,
    },
    Context(oneshot::Sender<std::result::Result<String, NoAnswer>>),
    /// Answered once every message queued before it reached the editor.
    Flush(oneshot::Sender<()>),
}

/// Cancel tokens of the calls shown in the editor, by call number.
type Cancels = Arc<Mutex<HashMap<u64, CancellationToken>>>;

/// A connection (being made, made, or lost) to the user's editor.
pub struct Mirror {
    tx: mpsc::Sender<Msg>,
    cancels: Cancels,
    alive: Arc<AtomicBool>,
}

impl Mirror {
    /// Starts connecting to the editor at `addr` in the background.
    pub fn start(addr: String) -> Arc<Mirror> {
        let (tx, rx) = mpsc::channel(QUEUE);
        let mirror = Arc::new(Mirror {
            tx,
            cancels: Arc::default(),
            alive: Arc::new(AtomicBool::new(true)),
        });
        let (cancels, alive) = (mirror.cancels.clone(), mirror.alive.clone());
        tokio::spawn(async move {
            drive(&addr, rx, cancels).await;
            alive.store(false, Ordering::Relaxed);
        });
        mirror
    }

    /// Still worth sending to (false once the editor was found missing or gone).
    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::Relaxed)
    }

    /// Shows a new call; `cancel` is cancelled when the user cancels its card.
    pub fn open(&self, key: u64, cancel: CancellationToken, spec: Value) {
        if !self.alive() {
            return;
        }
        if let Ok(mut c) = self.cancels.lock() {
            c.insert(key, cancel);
        }
        self.push(Msg::Open { key, spec });
    }

    /// A live update of a call (dropped when the editor is behind).
    pub fn update(&self, key: u64, ev: Value) {
        if self.alive() {
            self.push(Msg::Event { key, ev, last: false });
        }
    }

    /// The last event of a call (`done` or `error`).
    pub fn finish(&self, key: u64, ev: Value) {
        if let Ok(mut c) = self.cancels.lock() {
            c.remove(&key);
        }
        if self.alive() {
            self.push(Msg::Event { key, ev, last: true });
        }
    }

    /// The editor's recorded bang commands in contract §10 wording, one message after the other;
    /// `None` when no editor is mirrored.
    pub async fn context(&self) -> Option<std::result::Result<String, NoAnswer>> {
        if !self.alive() {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        self.tx.try_send(Msg::Context(tx)).ok()?;
        match tokio::time::timeout(CALL_TIMEOUT, rx).await {
            Ok(Ok(r)) => Some(r),
            _ => None,
        }
    }

    /// Waits, at most `limit`, until every card update queued so far reached the editor: a
    /// server that is shutting down (its client got its last answer and left) calls this so the
    /// last card shows the real ending instead of "the MCP server went away".
    pub async fn flush(&self, limit: Duration) {
        if !self.alive() {
            return;
        }
        let (tx, rx) = oneshot::channel();
        let sent = tokio::time::timeout(limit, self.tx.send(Msg::Flush(tx)));
        let deadline = tokio::time::Instant::now() + limit;
        if matches!(sent.await, Ok(Ok(()))) {
            let _ = tokio::time::timeout_at(deadline, rx).await;
        }
    }

    fn push(&self, msg: Msg) {
        if let Err(e) = self.tx.try_send(msg) {
            tracing::debug!("mirror: update dropped ({e})");
        }
    }
}

/// Receives the editor's `cancel {key}` notifications.
#[derive(Clone)]
struct CancelHandler(Cancels);

#[async_trait::async_trait]
impl Handler for CancelHandler {
    type Writer = Writer;

    async fn handle_notify(&self, name: String, args: Vec<Value>, _nvim: Neovim<Writer>) {
        if name != "cancel" {
            tracing::warn!("mirror: unknown notification {name}");
            return;
        }
        let key = args.first().map(msgpack_to_json).and_then(|p| p["key"].as_u64());
        if let (Some(key), Ok(c)) = (key, self.0.lock()) {
            if let Some(token) = c.get(&key) {
                tracing::info!("mirror: call {key} cancelled from the editor");
                token.cancel();
            }
        }
    }
}

/// Talks to the editor until the queue closes or the editor fails us.
async fn drive(addr: &str, mut rx: mpsc::Receiver<Msg>, cancels: Cancels) {
    let connect = nvim_rs::create::tokio::new_path(addr, CancelHandler(cancels));
    let (nvim, io) = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return tracing::info!("mirror: no editor at {addr}: {e}"),
        Err(_) => return tracing::info!("mirror: the editor at {addr} did not accept us"),
    };
    let chan = match call(&nvim, "nvim_get_api_info", vec![]).await {
        Some(Value::Array(info)) => info.first().and_then(Value::as_i64).unwrap_or(0),
        _ => return io.abort(),
    };
    let cwd = std::env::current_dir().unwrap_or_default();
    let hello = map(vec![
        ("chan", Value::from(chan)),
        ("pid", Value::from(std::process::id())),
        ("cwd", Value::from(cwd.to_string_lossy().as_ref())),
        ("version", Value::from(env!("CARGO_PKG_VERSION"))),
    ]);
    if lua(&nvim, HELLO_LUA, hello).await.is_none() {
        tracing::info!("mirror: the editor at {addr} does not have the agent-bash plugin");
        return io.abort();
    }
    tracing::info!("mirror: showing calls in the editor at {addr} (channel {chan})");
    // Call number → the editor's run id.
    let mut ids: HashMap<u64, Value> = HashMap::new();
    while let Some(msg) = rx.recv().await {
        let ok = match msg {
            Msg::Open { key, mut spec } => {
                if let Value::Map(m) = &mut spec {
                    m.push((Value::from("chan"), Value::from(chan)));
                    m.push((Value::from("key"), Value::from(key)));
                }
                lua(&nvim, OPEN_LUA, spec).await.map(|id| ids.insert(key, id)).is_some()
            }
            Msg::Event { key, mut ev, last } => {
                let id = if last { ids.remove(&key) } else { ids.get(&key).cloned() };
                match (id, &mut ev) {
                    (Some(id), Value::Map(m)) => {
                        m.retain(|(k, _)| k.as_str() != Some("id"));
                        m.push((Value::from("id"), id));
                        lua(&nvim, EVENT_LUA, ev).await.is_some()
                    }
                    _ => true,
                }
            }
            Msg::Flush(reply) => {
                let _ = reply.send(());
                true
            }
            Msg::Context(reply) => match lua(&nvim, CONTEXT_LUA, Value::Nil).await {
                Some(v) => {
                    let _ = reply.send(Ok(context_text(&msgpack_to_json(&v))));
                    true
                }
                None => {
                    let _ = reply.send(Err(NoAnswer));
                    false
                }
            },
        };
        if !ok {
            tracing::info!("mirror: the editor at {addr} is gone; calls are no longer shown");
            break;
        }
    }
    io.abort();
}

/// One request to the editor with a deadline; `None` on any failure.
async fn call(nvim: &Neovim<Writer>, method: &str, args: Vec<Value>) -> Option<Value> {
    match tokio::time::timeout(CALL_TIMEOUT, nvim.call(method, args)).await {
        Ok(Ok(Ok(v))) => Some(v),
        Ok(Ok(Err(e))) => {
            tracing::info!("mirror: {method} failed in the editor: {e}");
            None
        }
        Ok(Err(e)) => {
            tracing::info!("mirror: {method}: {e}");
            None
        }
        Err(_) => {
            tracing::info!("mirror: {method}: no answer within {CALL_TIMEOUT:?}");
            None
        }
    }
}

async fn lua(nvim: &Neovim<Writer>, code: &str, arg: Value) -> Option<Value> {
    let args = if arg.is_nil() { vec![] } else { vec![arg] };
    call(nvim, "nvim_exec_lua", vec![Value::from(code), Value::Array(args)]).await
}

/// `[{role, content}]` → the contents, one blank line apart.
fn context_text(messages: &serde_json::Value) -> String {
    let parts: Vec<&str> = messages
        .as_array()
        .map(|a| a.iter().filter_map(|m| m["content"].as_str()).collect())
        .unwrap_or_default();
    parts.join("\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_picks_the_newest_live_editor_containing_cwd() {
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id() as i32;
        let write = |name: &str, v: serde_json::Value| {
            std::fs::write(dir.path().join(name), v.to_string()).unwrap();
        };
        write(
            "1.json",
            serde_json::json!({"address": "/a", "pid": me, "cwd": "/proj", "started": 1}),
        );
        write(
            "2.json",
            serde_json::json!({"address": "/b", "pid": me, "cwd": "/proj", "started": 5}),
        );
        write(
            "3.json",
            serde_json::json!({"address": "/c", "pid": me, "cwd": "/other", "started": 9}),
        );
        // A dead editor (pid far beyond pid_max) is removed.
        write(
            "4.json",
            serde_json::json!({"address": "/d", "pid": 999_999_999, "cwd": "/", "started": 99}),
        );
        write("junk.json", serde_json::json!("not an entry"));
        let dirs = [dir.path().to_path_buf()];
        assert_eq!(discover(&dirs, Path::new("/proj/sub")).as_deref(), Some("/b"));
        assert_eq!(discover(&dirs, Path::new("/other")).as_deref(), Some("/c"));
        assert_eq!(discover(&dirs, Path::new("/nowhere")), None);
        assert!(!dir.path().join("4.json").exists());
        // `/pro` does not contain `/proj`: paths compare by component.
        assert_eq!(discover(&dirs, Path::new("/pro")), None);
        // A second registry: the newest entry of either wins; a missing one is skipped.
        let other = tempfile::tempdir().unwrap();
        std::fs::write(
            other.path().join("5.json"),
            serde_json::json!({"address": "/e", "pid": me, "cwd": "/proj", "started": 7})
                .to_string(),
        )
        .unwrap();
        let both = [dir.path().to_path_buf(), other.path().to_path_buf(), "/no/such".into()];
        assert_eq!(discover(&both, Path::new("/proj")).as_deref(), Some("/e"));
    }

    #[test]
    fn context_text_joins_messages() {
        let v =
            serde_json::json!([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]);
        assert_eq!(context_text(&v), "a\n\nb");
        assert_eq!(context_text(&serde_json::json!([])), "");
    }
}
