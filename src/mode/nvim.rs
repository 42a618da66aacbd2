//! `agent-bash nvim`: msgpack-RPC over stdio for the Lua plugin (nvim-rs). Decode, call the
//! runtime, encode; no business logic here.
//!
//! Contract with `lua/agent_bash/backend.lua`:
//! * requests (answered at once): `hello {version}` → `{version, pid, session_dir}`;
//!   `ping` → `"pong"`; `artifact_path {url}` → the artifact's file path (Lua reads the file:
//!   artifact text never travels through RPC), or an error whose message is the exact contract
//!   §4.3 text. `get_context {offset?, limit?}` → `{messages, offset, total}`, a page of the
//!   agent's context messages (contract §10); `history {offset?, limit?}` → `{runs, offset,
//!   total}`, a page of the session's recorded bang commands (no offset: the last page).
//!   `changes_status {roots?}` → `[{root, engine?, state, hashed?, total?, files?, reason?,
//!   note}]`: whether the receipts of each project this backend knows (or of `roots`) are ready (`state`: `waiting`,
//!   `indexing` with files `hashed` of `total`, `ready` with `files`, `off` with `reason`,
//!   `busy`), and `note`, the same in words.
//! * malformed input (bad msgpack, wrong shapes, wrong parameter types, strings that are not
//!   UTF-8, unknown methods) is answered with an error naming the problem; a notification has
//!   no answer, so Lua gets a `protocol_error` event instead. The backend keeps serving.
//! * notifications (long work; never block the dispatch loop): `run {id, origin, command, cwd,
//!   local_cwd?, remote_cwd?, timeout?, head?, tail?, tools?, session_key?, profile?,
//!   exclude_from_context, pty?, ui?}` (`local_cwd`: `cwd` is the editor's; a run that goes to a
//!   remote profile starts at `remote_cwd`, or where its shell is),
//!   `warm {}` (start the first bang shell and the rc snapshot now; answered by a `warmed`
//!   event),
//!   `cancel {id}` (a PTY run is force-killed), `pty_input {id, data}` (raw bytes typed in the
//!   terminal, normalized in Rust), `pty_resize {id, cols, rows}`.
//! * a PTY run (contract §6: `pty = true`, or a tool call with `virtual_terminal = "on"` and
//!   `ui = true`) first asks Lua for a view: `require('agent_bash.terminal')._open(id, {command,
//!   origin})` returns `{chan, cols, rows}`; the raw PTY bytes then go to that channel with
//!   `nvim_chan_send`, with flow control (a slow editor slows the program, not our memory).
//! * events pushed back with `nvim_exec_lua` →
//!   `require('agent_bash.backend')._on_event(ev)`: `update` (throttled by the runtime to at
//!   most 20 per second per run, and coalesced: a slow editor gets the latest state, never a
//!   queue), then exactly one `done` (result + every kept display line) or `error`; for a PTY
//!   run also `waiting {id, waiting}` when its program starts or stops waiting for input;
//!   `protocol_error {message}` for a notification that could not be acted on.
//!
//! When Neovim closes the channel, every run is cancelled, every shell killed, and the process
//! exits.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use nvim_rs::compat::tokio::Compat;
use nvim_rs::{Handler, Neovim};
use rmpv::Value;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::frame;
use super::wire::{self, done_event, map, msgpack_to_json, update_event, Failure};
use crate::exec::{LiveUpdate, Origin, Prep, Prepared, Runtime, Settings, UpdateFn};
use crate::pty::{OutputFn, PtyControl, PtyHooks, TermSize};
use crate::Result;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

type Writer = Compat<tokio::fs::File>;
type Nvim = Neovim<Writer>;

/// Flags of `agent-bash nvim`.
#[derive(Debug, clap::Args)]
pub struct NvimArgs {
    /// Settings file (TOML).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// State directory (artifacts, snapshots); Neovim passes `stdpath('state')/agent_bash`.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Editor session id (the plugin passes one per Neovim instance, so a restarted backend
    /// keeps the session's artifacts and record).
    #[arg(long)]
    pub session_id: Option<String>,
}

const EVENT_LUA: &str = "return require('agent_bash.backend')._on_event(...)";

#[derive(Clone)]
struct Backend {
    rt: Arc<Runtime>,
    runs: Arc<Mutex<HashMap<i64, CancellationToken>>>,
    /// Input, resizes and kills for running PTY runs, by run id.
    ptys: Arc<Mutex<HashMap<i64, mpsc::UnboundedSender<PtyControl>>>>,
}

/// Raw PTY output chunks queued for `nvim_chan_send`: when Neovim is slower than the program,
/// the reader thread blocks, and so does the program (terminal flow control), instead of
/// memory growing.
const TERM_QUEUE: usize = 64;
/// The task sending a terminal's bytes, and the signal that the run is over.
type Pump = (tokio::task::JoinHandle<()>, tokio::sync::oneshot::Sender<()>);
/// Largest batch given to one `nvim_chan_send`.
const TERM_BATCH: usize = 1 << 20;

/// Runs the msgpack-RPC mode until Neovim closes the channel.
pub async fn run(args: NvimArgs) -> Result<i32> {
    let mut settings = match &args.config {
        Some(p) => Settings::load(p)?,
        None => Settings::default(),
    };
    if settings.state_dir.is_none() {
        settings.state_dir = args.state_dir.clone();
    }
    let rt = super::start_runtime(settings, args.session_id.as_deref())?;
    tokio::spawn(rt.clone().evict_loop());
    let backend = Backend { rt: rt.clone(), runs: Arc::default(), ptys: Arc::default() };
    // Every byte from Neovim passes the framer first (see `frame`): bad input is answered,
    // never the end of the loop, and no message is held past its size limit.
    let (feed, pipe) = tokio::io::duplex(64 * 1024);
    tokio::spawn(guard_input(tokio::io::stdin(), feed));
    let stdout = {
        use std::os::fd::AsFd;
        let fd = std::io::stdout().as_fd().try_clone_to_owned()?;
        tokio::fs::File::from_std(std::fs::File::from(fd))
    };
    let (_nvim, io) = Neovim::<Writer>::new(pipe.compat(), stdout.compat_write(), backend.clone());
    let io = tokio::spawn(io);
    tokio::select! {
        r = io => {
            match r {
                Ok(Ok(())) => tracing::info!("Neovim closed the channel"),
                Ok(Err(e)) if e.is_channel_closed() => tracing::info!("Neovim closed the channel"),
                Ok(Err(e)) => tracing::warn!("RPC loop ended: {e}"),
                Err(e) => tracing::warn!("RPC loop failed: {e}"),
            }
        }
        _ = super::wait_for_signal() => tracing::info!("signal: stopping"),
    }
    if let Ok(runs) = backend.runs.lock() {
        runs.values().for_each(|c| c.cancel());
    }
    rt.shutdown().await;
    Ok(0)
}

#[async_trait::async_trait]
impl Handler for Backend {
    type Writer = Writer;

    async fn handle_request(
        &self,
        name: String,
        args: Vec<Value>,
        _nvim: Nvim,
    ) -> std::result::Result<Value, Value> {
        if name == frame::MALFORMED {
            return Err(Value::from(malformed_reason(&args)));
        }
        let params = params(&args, &[]).map_err(|e| Value::from(format!("{name}: {e}")))?;
        let rt = &self.rt;
        match name.as_str() {
            "hello" => Ok(hello(rt, &params)),
            "ping" => Ok(Value::from("pong")),
            "shell_info" => Ok(shell_info(rt).await),
            "get_context" | "history" => {
                let (offset, limit) =
                    super::page_args(&params).map_err(|e| Value::from(format!("{name}: {e}")))?;
                Ok(if name == "history" {
                    wire::msgpack(&super::history_page(rt, offset, limit).await)
                } else {
                    wire::msgpack(&super::context_page(rt, offset, limit).await)
                })
            }
            "artifact_path" => artifact_path(rt, &params),
            // contract §13: whether each project's receipts are ready (`:checkhealth`, the card).
            "changes_status" => {
                let only = match params.get("roots") {
                    None | Some(serde_json::Value::Null) => None,
                    Some(serde_json::Value::Array(a)) => Some(
                        a.iter().filter_map(|r| r.as_str()).map(PathBuf::from).collect::<Vec<_>>(),
                    ),
                    Some(other) => {
                        let msg = format!("changes_status: \"roots\" must be a list, got {other}");
                        return Err(Value::from(msg));
                    }
                };
                Ok(wire::msgpack(&rt.changes().status(only.as_deref()).await))
            }
            // contract §13: `undo {id?}`, `undo_check {id?}`, `changes {id?}`, `changes_before {id, path}`.
            "undo" | "undo_check" | "changes" | "changes_before" => {
                changes_request(rt, &name, &params).await
            }
            other => Err(Value::from(format!("Unknown request: {other}"))),
        }
    }

    async fn handle_notify(&self, name: String, args: Vec<Value>, nvim: Nvim) {
        if name == frame::MALFORMED {
            return protocol_error(&nvim, malformed_reason(&args));
        }
        // Keys typed in a terminal are bytes, not necessarily UTF-8: `data` is read raw.
        let raw: &[&str] = if name == "pty_input" { &["data"] } else { &[] };
        let params = match params(&args, raw) {
            Ok(p) => p,
            Err(e) => {
                let msg = format!("{name}: {e}");
                // A run the editor is waiting for ends with the error on its card.
                let run_id = (name == "run").then(|| raw_field_i64(&args, "id")).flatten();
                return match run_id {
                    Some(id) => send(&nvim, Failure::from(msg).event(id)).await,
                    None => protocol_error(&nvim, msg),
                };
            }
        };
        if name == "warm" {
            let (rt, nvim) = (self.rt.clone(), nvim.clone());
            tokio::spawn(async move {
                let started = std::time::Instant::now();
                let ready = rt.warm().await;
                let ms = started.elapsed().as_millis() as u64;
                tracing::info!("warm: shell ready = {ready} after {ms} ms");
                let ev = map(vec![
                    ("type", Value::from("warmed")),
                    ("ready", Value::from(ready)),
                    ("ms", Value::from(ms)),
                ]);
                send(&nvim, ev).await;
            });
            return;
        }
        let id = match params.get("id") {
            Some(v) if v.is_i64() => v.as_i64().unwrap_or(-1),
            other => {
                let got = other.map_or("nothing".to_owned(), |v| v.to_string());
                let known = ["run", "cancel", "pty_input", "pty_resize"].contains(&name.as_str());
                let msg = if known {
                    format!("{name}: \"id\" must be an integer, got {got}")
                } else {
                    format!("Unknown notification: {name}")
                };
                return protocol_error(&nvim, msg);
            }
        };
        match name.as_str() {
            "run" => {
                // Registered before the task starts, so a cancel sent right after the run is
                // never handled before the run exists.
                let cancel = CancellationToken::new();
                if let Ok(mut runs) = self.runs.lock() {
                    runs.insert(id, cancel.clone());
                }
                let this = self.clone();
                tokio::spawn(async move { this.run(id, params, nvim, cancel).await });
            }
            "cancel" => {
                // A PTY run is force-killed (the kill key, contract §6); others are cancelled.
                if !self.pty_control(id, PtyControl::Kill) {
                    if let Ok(runs) = self.runs.lock() {
                        if let Some(c) = runs.get(&id) {
                            c.cancel();
                        }
                    }
                }
            }
            "pty_input" => match raw_field(&args, "data") {
                Some(data) => {
                    self.pty_control(id, PtyControl::Input(data));
                }
                // Never echo the value: it may be a typed password.
                None => protocol_error(&nvim, "pty_input: \"data\" must be a string".to_owned()),
            },
            "pty_resize" => {
                let dim = |k: &str| {
                    params.get(k).and_then(|v| v.as_u64()).map(|n| n.min(u16::MAX as u64) as u16)
                };
                match (dim("cols"), dim("rows")) {
                    (Some(cols), Some(rows)) => {
                        self.pty_control(id, PtyControl::Resize(TermSize { cols, rows }));
                    }
                    _ => protocol_error(
                        &nvim,
                        "pty_resize: \"cols\" and \"rows\" must be non-negative integers"
                            .to_owned(),
                    ),
                }
            }
            other => protocol_error(&nvim, format!("Unknown notification: {other}")),
        }
    }
}

impl Backend {
    /// A `run` notification: decodes it, has the runtime prepare the call (every decision about
    /// it: where it runs, PTY or pipes, whether interception stops it), then runs it.
    async fn run(
        &self,
        id: i64,
        params: serde_json::Map<String, serde_json::Value>,
        nvim: Nvim,
        cancel: CancellationToken,
    ) {
        let refuse = |msg: String| {
            if let Ok(mut runs) = self.runs.lock() {
                runs.remove(&id);
            }
            Failure::from(msg).event(id)
        };
        let origin = match params.get("origin").and_then(|v| v.as_str()) {
            Some("tool") => Origin::Tool,
            None | Some("bang") => Origin::Bang,
            Some(_) => {
                let msg = "\"origin\" must be \"bang\" or \"tool\"".to_owned();
                return send(&nvim, refuse(msg)).await;
            }
        };
        let mut req = match super::request_from(&params, origin) {
            Ok(r) => r,
            Err(e) => return send(&nvim, refuse(e.to_string())).await,
        };
        req.display = true;
        // `local_cwd`: `cwd` is the editor's directory; the runtime starts a run it sends to a
        // remote profile at `remote_cwd` instead (`Request::local_cwd`).
        if params.get("local_cwd").and_then(|v| v.as_bool()) == Some(true) {
            req.local_cwd = true;
            req.remote_cwd = match super::get_str(&params, "remote_cwd") {
                Ok(c) => c,
                Err(e) => return send(&nvim, refuse(e.to_string())).await,
            };
        }
        let limited = req.head.is_some() || req.tail.is_some();
        if let Some(ui) = params.get("ui").and_then(|v| v.as_bool()) {
            self.rt.set_ui_attached(ui);
        }
        let exclude = params.get("exclude_from_context").and_then(|v| v.as_bool()).unwrap_or(false);
        // Blocked or invalid commands answer now (and never open a terminal view).
        let prepared = match self.rt.prepare(req) {
            Ok(Prep::Run(p)) => p,
            Ok(Prep::Blocked(result)) => {
                if let Ok(mut runs) = self.runs.lock() {
                    runs.remove(&id);
                }
                let lines = wire::card_lines(&result, limited, None);
                return send(&nvim, done_event(id, wire::msgpack(&result), Some(&lines))).await;
            }
            Err(e) => {
                if let Ok(mut runs) = self.runs.lock() {
                    runs.remove(&id);
                }
                return send(&nvim, Failure::from(e).event(id)).await;
            }
        };
        let res = self.execute(id, *prepared, &nvim, cancel, limited, exclude).await;
        send(&nvim, res).await;
    }

    /// Runs a prepared command for the editor: live updates, a terminal view for a PTY run, the
    /// session record of a bang command; returns the `done` (or `error`) event.
    async fn execute(
        &self,
        id: i64,
        prepared: Prepared,
        nvim: &Nvim,
        cancel: CancellationToken,
        limited: bool,
        exclude: bool,
    ) -> Value {
        let origin = prepared.origin();
        let command = prepared.command().to_string();
        let cwd = prepared.asked_cwd().unwrap_or_default().to_string();
        // Live updates: the latest one wins (bounded whatever the editor's speed); the final one
        // is kept aside for the `done` event.
        let (tx, mut rx) = watch::channel::<Option<LiveUpdate>>(None);
        let last: Arc<Mutex<Option<LiveUpdate>>> = Arc::default();
        let keep = last.clone();
        let on_update: UpdateFn = Arc::new(move |u: LiveUpdate| {
            if u.last {
                if let Ok(mut l) = keep.lock() {
                    *l = Some(u);
                }
            } else {
                tx.send_replace(Some(u));
            }
        });
        let updater_nvim = nvim.clone();
        let started = std::time::Instant::now();
        let updater = tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let Some(u) = rx.borrow_and_update().clone() else { continue };
                let ev = update_event(id, &u, started.elapsed().as_millis() as u64);
                send(&updater_nvim, ev).await;
            }
        });
        let (hooks, pump) = if prepared.pty() {
            match self.open_terminal(id, &command, origin, nvim).await {
                Ok(t) => t,
                Err(e) => {
                    // The updater ends when its sender (inside `on_update`) is gone.
                    drop(on_update);
                    let _ = updater.await;
                    if let Ok(mut runs) = self.runs.lock() {
                        runs.remove(&id);
                    }
                    return Failure::from(format!("PTY error: {e}")).event(id);
                }
            }
        } else {
            (PtyHooks::default(), None)
        };
        let res = self.rt.run_prepared(prepared, cancel, Some(on_update), hooks).await;
        if let Ok(mut ptys) = self.ptys.lock() {
            ptys.remove(&id);
        }
        // The senders live in the callbacks, which the runtime has dropped by now: the terminal
        // has every byte before the card says the run is over.
        if let Some((pump, finish)) = pump {
            let _ = finish.send(());
            let _ = pump.await;
        }
        let _ = updater.await;
        if let Ok(mut runs) = self.runs.lock() {
            runs.remove(&id);
        }
        match res {
            Ok(result) => {
                if origin == Origin::Bang {
                    let cwd = std::path::Path::new(&cwd);
                    super::record_bang(&self.rt, &command, cwd, &result, exclude).done().await;
                }
                let last = last.lock().ok().and_then(|mut l| l.take());
                let lines = wire::card_lines(&result, limited, last);
                done_event(id, wire::editor_result(&result), Some(&lines))
            }
            Err(e) => Failure::from(e).event(id),
        }
    }
}

impl Backend {
    /// Delivers a control message to a running PTY run; false when there is none.
    fn pty_control(&self, id: i64, msg: PtyControl) -> bool {
        match self.ptys.lock() {
            Ok(ptys) => ptys.get(&id).is_some_and(|tx| tx.send(msg).is_ok()),
            Err(_) => false,
        }
    }

    /// Asks Lua for a terminal view (contract §6): a float holding `nvim_open_term`, whose channel
    /// gets the raw PTY bytes. Returns the run's hooks and the task that pumps the bytes.
    async fn open_terminal(
        &self,
        id: i64,
        command: &str,
        origin: Origin,
        nvim: &Nvim,
    ) -> std::result::Result<(PtyHooks, Option<Pump>), NoTerminalView> {
        let origin = if origin == Origin::Tool { "tool" } else { "bang" };
        let opts = map(vec![("command", Value::from(command)), ("origin", Value::from(origin))]);
        let opened = nvim
            .exec_lua(
                "return require('agent_bash.terminal')._open(...)",
                vec![Value::from(id), opts],
            )
            .await
            .map_err(NoTerminalView::Open)?;
        let field = |k: &str| {
            opened
                .as_map()
                .and_then(|m| m.iter().find(|(key, _)| key.as_str() == Some(k)))
                .and_then(|(_, v)| v.as_u64())
        };
        let chan = field("chan").ok_or(NoTerminalView::NoChannel)?;
        let size = match (field("cols"), field("rows")) {
            (Some(c), Some(r)) => Some(TermSize {
                cols: c.min(u16::MAX as u64) as u16,
                rows: r.min(u16::MAX as u64) as u16,
            }),
            _ => None,
        };
        let (ctl_tx, ctl_rx) = mpsc::unbounded_channel();
        if let Ok(mut ptys) = self.ptys.lock() {
            ptys.insert(id, ctl_tx);
        }
        let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(TERM_QUEUE);
        // Called on the PTY reader thread (not an async context), so it may block.
        let on_output: OutputFn = Arc::new(move |bytes: &[u8]| {
            let _ = out_tx.blocking_send(bytes.to_vec());
        });
        // Waiting for input (contract §8.4): marked on the card and title, a notice for tool calls.
        let waiting_nvim = nvim.clone();
        let on_waiting: crate::pty::WaitingFn = Arc::new(move |waiting: bool| {
            let n = waiting_nvim.clone();
            let ev = map(vec![
                ("type", Value::from("waiting")),
                ("id", Value::from(id)),
                ("waiting", Value::from(waiting)),
            ]);
            tokio::spawn(async move { send(&n, ev).await });
        });
        let pump_nvim = nvim.clone();
        let (finish_tx, mut finish_rx) = tokio::sync::oneshot::channel::<()>();
        let pump = tokio::spawn(async move {
            let mut finishing = false;
            loop {
                // Once the run is over, send what is queued and stop: the reader thread may
                // outlive the run by a moment, holding its end of the channel open.
                let first = if finishing {
                    match out_rx.try_recv() {
                        Ok(b) => b,
                        Err(_) => break,
                    }
                } else {
                    tokio::select! {
                        b = out_rx.recv() => match b { Some(b) => b, None => break },
                        _ = &mut finish_rx => { finishing = true; continue; }
                    }
                };
                let mut batch = first;
                while batch.len() < TERM_BATCH {
                    match out_rx.try_recv() {
                        Ok(more) => batch.extend_from_slice(&more),
                        Err(_) => break,
                    }
                }
                let args = vec![Value::from(chan), Value::Binary(batch)];
                if let Err(e) = pump_nvim.call("nvim_chan_send", args).await {
                    tracing::warn!("terminal output not delivered: {e}");
                }
            }
        });
        Ok((
            PtyHooks {
                size,
                on_output: Some(on_output),
                control: Some(ctl_rx),
                on_waiting: Some(on_waiting),
            },
            Some((pump, finish_tx)),
        ))
    }
}

/// `hello`: the backend's version and what it runs with (`:checkhealth` shows it).
fn hello(rt: &Runtime, params: &serde_json::Map<String, serde_json::Value>) -> Value {
    let theirs = params.get("version").and_then(|v| v.as_str()).unwrap_or("?");
    tracing::info!("hello from the Lua plugin {theirs}");
    // The git program receipts run (`[changes] git`, else `git` on PATH).
    let git = rt.settings().changes.git.as_deref();
    let git = git.map_or("git".into(), std::path::Path::to_string_lossy);
    map(vec![
        ("version", Value::from(env!("CARGO_PKG_VERSION"))),
        ("pid", Value::from(std::process::id())),
        ("session_dir", Value::from(rt.store().dir().to_string_lossy().as_ref())),
        ("changes", Value::from(rt.changes().enabled())),
        ("changes_watch", Value::from(rt.changes().watching())),
        ("git", Value::from(git.as_ref())),
        ("fence", Value::from(rt.fence_report().as_str())),
        ("fence_ok", Value::from(rt.fence_usable())),
        ("spawn", Value::from(rt.spawn_report().as_str())),
        ("platform", Value::from(crate::platform::describe().as_str())),
        ("portable", Value::from(crate::platform::portable())),
        ("tracking", Value::from(crate::shell::procs::tracking_mode())),
    ])
}

/// `shell_info`: the shell, its version and its rc snapshot (`:checkhealth`).
async fn shell_info(rt: &Runtime) -> Value {
    let r = rt.shell_report().await;
    map(vec![
        ("shell", Value::from(r.shell.as_str())),
        ("version", Value::from(r.version.as_str())),
        ("supported", Value::from(r.supported)),
        ("snapshot", Value::from(r.snapshot.as_str())),
    ])
}

/// `artifact_path {url}`: the file behind an `artifact://` URL.
fn artifact_path(
    rt: &Runtime,
    params: &serde_json::Map<String, serde_json::Value>,
) -> std::result::Result<Value, Value> {
    let url = match params.get("url") {
        None => "",
        Some(serde_json::Value::String(s)) => s.as_str(),
        Some(other) => {
            return Err(Value::from(format!(
                "artifact_path: \"url\" must be a string, got {other}"
            )))
        }
    };
    crate::artifacts::resolve_path(Some(rt.store()), url)
        .map(|p| Value::from(p.to_string_lossy().as_ref()))
        .map_err(|e| Failure::from(e).msgpack())
}

/// contract §13: `undo {id?}`, `undo_check {id?}`, `changes {id?}`, `changes_before {id, path}`.
async fn changes_request(
    rt: &Runtime,
    name: &str,
    params: &serde_json::Map<String, serde_json::Value>,
) -> std::result::Result<Value, Value> {
    let id = match params.get("id") {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| {
            Value::from(format!("{name}: \"id\" must be a non-negative integer, got {v}"))
        })?),
    };
    match name {
        // The refusal's text names the paths changed since.
        "undo" => {
            super::undo(rt, id).await.map(|done| wire::msgpack(&done)).map_err(|f| f.msgpack())
        }
        // nil when `undo` would happen now, else its refusal's text.
        "undo_check" => match rt.changes().check_undo(id).await {
            Ok(()) => Ok(Value::Nil),
            Err(e) => Err(Failure::from(e).msgpack()),
        },
        "changes" => super::run_changes(rt, id).map(|c| wire::msgpack(&c)).map_err(|f| f.msgpack()),
        _ => {
            let path = params.get("path").and_then(|p| p.as_str()).unwrap_or("");
            let id = id.ok_or_else(|| Value::from("changes_before: \"id\" is required"))?;
            match rt.changes().before(id, path).await {
                Ok(Some(bytes)) => {
                    Ok(map(vec![("exists", Value::from(true)), ("content", Value::Binary(bytes))]))
                }
                Ok(None) => Ok(map(vec![("exists", Value::from(false))])),
                Err(e) => Err(Failure::from(e).msgpack()),
            }
        }
    }
}

/// An integer field of the first argument (a map), read without converting anything else.
fn raw_field_i64(args: &[Value], key: &str) -> Option<i64> {
    let Some(Value::Map(m)) = args.first() else { return None };
    m.iter().find(|(k, _)| k.as_str() == Some(key)).and_then(|(_, v)| v.as_i64())
}

/// A field of the first argument (a map) as raw bytes (msgpack str or bin).
fn raw_field(args: &[Value], key: &str) -> Option<Vec<u8>> {
    let Some(Value::Map(m)) = args.first() else { return None };
    m.iter().find(|(k, _)| k.as_str() == Some(key)).and_then(|(_, v)| match v {
        Value::String(s) => Some(s.as_bytes().to_vec()),
        Value::Binary(b) => Some(b.clone()),
        _ => None,
    })
}

async fn send(nvim: &Nvim, ev: Value) {
    if let Err(e) = nvim.exec_lua(EVENT_LUA, vec![ev]).await {
        tracing::warn!("event not delivered: {e}");
    }
}

/// Why a PTY run got no terminal view in the editor.
#[derive(Debug, thiserror::Error)]
enum NoTerminalView {
    #[error("could not open a terminal view: {0}")]
    Open(Box<nvim_rs::error::CallError>),
    #[error("the terminal view gave no channel")]
    NoChannel,
}

/// The first argument of a call as a JSON object (Lua tables arrive as msgpack maps; an empty
/// table or no argument is no parameters). Strings must be UTF-8, except under the `raw` keys.
pub fn params(
    args: &[Value],
    raw: &[&str],
) -> crate::Result<serde_json::Map<String, serde_json::Value>> {
    match args.first() {
        None | Some(Value::Nil) => Ok(serde_json::Map::new()),
        Some(Value::Array(a)) if a.is_empty() => Ok(serde_json::Map::new()),
        Some(Value::Map(m)) => {
            for (k, v) in m {
                let key = k.as_str().unwrap_or("");
                if !raw.contains(&key) {
                    utf8(k, key)?;
                    utf8(v, key)?;
                }
            }
            match msgpack_to_json(&Value::Map(m.clone())) {
                serde_json::Value::Object(m) => Ok(m),
                _ => Ok(serde_json::Map::new()),
            }
        }
        Some(other) => Err(crate::Error::ParamsNotTable(frame::kind(other))),
    }
}

/// Refuses strings that are not UTF-8 anywhere inside `v` (a command must not be guessed at).
fn utf8(v: &Value, key: &str) -> crate::Result<()> {
    let not_utf8 = || Err(crate::Error::ParamNotUtf8(key.to_owned()));
    match v {
        Value::String(s) if s.as_str().is_none() => not_utf8(),
        Value::Binary(b) if std::str::from_utf8(b).is_err() => not_utf8(),
        Value::Array(a) => a.iter().try_for_each(|x| utf8(x, key)),
        Value::Map(m) => m.iter().try_for_each(|(k, x)| utf8(k, key).and_then(|()| utf8(x, key))),
        _ => Ok(()),
    }
}

/// The reason the framer gave for a message it replaced.
fn malformed_reason(args: &[Value]) -> String {
    let reason = args.first().and_then(|v| v.as_str()).unwrap_or("malformed message");
    format!("malformed message from Neovim: {reason}")
}

/// Tells the user (and the log) about a notification that could not be acted on: it has no
/// answer to carry an error. At most one a second reaches the editor.
fn protocol_error(nvim: &Nvim, message: String) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    tracing::warn!("{message}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if LAST.swap(now, Ordering::Relaxed) == now {
        return;
    }
    let ev = map(vec![("type", Value::from("protocol_error")), ("message", Value::from(message))]);
    let nvim = nvim.clone();
    tokio::spawn(async move { send(&nvim, ev).await });
}

/// Copies Neovim's input to nvim-rs through the framer (see `frame`).
async fn guard_input(
    mut input: impl tokio::io::AsyncRead + Unpin,
    mut to: tokio::io::DuplexStream,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut framer = frame::Framer::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match input.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                tracing::warn!("reading from Neovim: {e}");
                break;
            }
        };
        for f in framer.feed(&buf[..n]) {
            let bytes = match f {
                frame::Frame::Message(b) => b,
                frame::Frame::Replaced(b, reason) => {
                    tracing::warn!("malformed input from Neovim: {reason}");
                    b
                }
            };
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
    }
    if framer.in_message() {
        tracing::warn!("input from Neovim ended inside a message: dropped");
    }
}
