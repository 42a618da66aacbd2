//! `agent-bash mcp`: a Model Context Protocol server over stdio (contract §11) on the official Rust
//! SDK (`rmcp`). Decode, call the runtime, encode; no business logic here.
//!
//! * tool `bash` → [`Runtime::run`] (the full tool path, §1–§7, persistent shell sessions). Text
//!   content = the model-facing text of §7 and nothing else the model could be shown instead:
//!   the `BashResult` travels in the result's `_meta` under [`wire::RESULT_META`]; structured content
//!   and an output schema only with `[mcp] structured_content = true`. `isError` = its
//!   `is_error`. Bad input and blocked commands are tool errors with §2/§3's exact texts.
//! * progress: with a progress token, `notifications/progress` carry the live tail's last line
//!   and the counters, at most [`PROGRESS_EVERY`] apart.
//! * `notifications/cancelled` cancels the run (the process tree is killed as by any cancel);
//!   rmcp then drops the response, as the protocol wants.
//! * resources: `artifact://<id>` (listed newest first, at most [`MAX_LISTED`]; readable; a
//!   template) and `agent-bash://context`. `resources.listChanged` is declared: a new artifact
//!   sends `notifications/resources/list_changed` ([`ListChanged`], coalesced to one per
//!   [`LIST_CHANGED_EVERY`]), to an `initialize`d session directly and, in the newest revision,
//!   on each `subscriptions/listen` stream that asked for it.
//! * the editor mirror ([`super::mirror`]): each call also shows as a card in the user's Neovim.
//!
//! stdout carries protocol messages only: one writer task owns it. Unparsable lines get a
//! JSON-RPC parse error (rmcp's own stdio transport ignores them silently), and the server
//! keeps serving.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, JsonObject,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    Resource, ResourceContents, ResourceTemplate, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::mirror::Mirror;
use super::wire::{self, done_event, map, update_event, Failure};
use crate::exec::{LiveUpdate, Origin, Runtime, Settings, UpdateFn};
use crate::Result;

/// Flags of `agent-bash mcp`.
#[derive(Debug, clap::Args)]
pub struct McpArgs {
    /// Settings file (TOML).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The editor that shows the calls: `auto` ($NVIM, else the newest Neovim with the plugin
    /// whose cwd contains ours), `off`, or an RPC address (a socket path). $NVIM wins unless
    /// `off`.
    #[arg(long, default_value = "auto")]
    pub nvim: String,
}

/// Least time between two progress notifications of one call (at most 4 per second).
pub const PROGRESS_EVERY: Duration = Duration::from_millis(250);
/// Longest request line accepted; a longer one is answered with an error, not buffered.
const MAX_LINE: usize = 16 << 20;
/// At most this many artifacts in `resources/list` (the newest; older ones stay readable).
pub const MAX_LISTED: usize = 100;
/// Longest wait, once the client is gone, for the last card updates to reach the editor.
const MIRROR_FLUSH: Duration = Duration::from_secs(2);
/// Least time between two `notifications/resources/list_changed`.
pub const LIST_CHANGED_EVERY: Duration = Duration::from_millis(250);
/// The resource holding the user's recorded commands.
const CONTEXT_URI: &str = "agent-bash://context";

/// Runs the MCP server until the client closes stdin or a signal arrives.
pub async fn run(args: McpArgs) -> Result<i32> {
    let settings = match &args.config {
        Some(p) => Settings::load(p)?,
        None => Settings::default(),
    };
    let structured = settings.mcp.structured_content;
    let rt = super::start_runtime(settings, None)?;
    tokio::spawn(rt.clone().evict_loop());
    let cwd = std::env::current_dir()?;
    let mirror = super::mirror::find_editor(&args.nvim, &cwd).map(|addr| {
        tracing::info!("mcp: mirroring calls into the editor at {addr}");
        Mirror::start(addr)
    });
    let list_changed = Arc::new(ListChanged::default());
    let mirror_at_exit = mirror.clone();
    let server = Server {
        list_changed: list_changed.clone(),
        rt: rt.clone(),
        mirror,
        next: Arc::new(AtomicU64::new(0)),
        running: Arc::default(),
        structured,
    };
    let running = server.running.clone();
    let (out_tx, out_rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(write_lines(out_rx));
    let transport = LineTransport::new(out_tx);
    let service = server
        .serve(transport)
        .await
        .map_err(|e| crate::Error::InvalidInput(format!("MCP initialization failed: {e}")))?;
    let announcer = tokio::spawn(list_changed.clone().announce(service.peer().clone()));
    tokio::select! {
        r = service.waiting() => tracing::info!("mcp: client gone ({r:?})"),
        _ = super::wait_for_signal() => tracing::info!("mcp: signal: stopping"),
    }
    // The client is gone: nobody can receive what still runs.
    if let Ok(r) = running.lock() {
        r.values().for_each(CancellationToken::cancel);
    }
    // The client already has its answers; the editor still waits for the last card updates.
    if let Some(m) = &mirror_at_exit {
        m.flush(MIRROR_FLUSH).await;
    }
    announcer.abort();
    rt.shutdown().await;
    let _ = tokio::time::timeout(Duration::from_secs(1), writer).await;
    Ok(0)
}

#[derive(Clone)]
struct Server {
    rt: Arc<Runtime>,
    mirror: Option<Arc<Mirror>>,
    next: Arc<AtomicU64>,
    /// Cancel tokens of the running calls (cancelled when the client goes away).
    running: Arc<Mutex<std::collections::HashMap<u64, CancellationToken>>>,
    /// `[mcp] structured_content`: results carry structured content, tools an output schema.
    structured: bool,
    /// Tells the client that the resource list changed (a new artifact).
    list_changed: Arc<ListChanged>,
}

/// `notifications/resources/list_changed`, coalesced to at most one per [`LIST_CHANGED_EVERY`]:
/// [`ListChanged::changed`] sends it at once, before the call that made the artifact answers,
/// when none went out in the last window (a client that refreshes its list on the notification
/// then knows the artifact before its model reads the result); otherwise [`ListChanged::announce`]
/// sends one at the window's end for any number of changes.
#[derive(Default)]
struct ListChanged {
    notify: tokio::sync::Notify,
    /// When the last notification went out.
    last: Mutex<Option<Instant>>,
    /// A change not yet announced (left for the window's end).
    pending: std::sync::atomic::AtomicBool,
    /// The open `subscriptions/listen` streams that asked for the notification (newest
    /// revision), by a number of ours.
    streams: Mutex<std::collections::HashMap<u64, rmcp::service::SubscriptionSink>>,
    next: AtomicU64,
}

impl ListChanged {
    /// Marks the list changed: announces it now when the window allows, else at its end.
    async fn changed(&self, peer: &rmcp::Peer<RoleServer>) {
        let now = Instant::now();
        let due = match self.last.lock() {
            Ok(mut last) if last.is_none_or(|t| now - t >= LIST_CHANGED_EVERY) => {
                *last = Some(now);
                true
            }
            _ => false,
        };
        if due {
            self.pending.store(false, Ordering::Relaxed);
            self.send(peer).await;
        } else {
            self.pending.store(true, Ordering::Relaxed);
            self.notify.notify_one();
        }
    }

    /// Sends what [`ListChanged::changed`] left for the end of a window.
    async fn announce(self: Arc<Self>, peer: rmcp::Peer<RoleServer>) {
        loop {
            self.notify.notified().await;
            let last = self.last.lock().ok().and_then(|l| *l);
            if let Some(t) = last {
                tokio::time::sleep_until((t + LIST_CHANGED_EVERY).into()).await;
            }
            if !self.pending.swap(false, Ordering::Relaxed) {
                continue;
            }
            if let Ok(mut l) = self.last.lock() {
                *l = Some(Instant::now());
            }
            if !self.send(&peer).await {
                return;
            }
        }
    }

    /// One notification to the session and to each stream that asked; false once the client
    /// is gone.
    async fn send(&self, peer: &rmcp::Peer<RoleServer>) -> bool {
        // An `initialize`d session takes notifications at any time; a session of the newest
        // revision only on the streams it opened.
        if peer.peer_info().is_some() && peer.notify_resource_list_changed().await.is_err() {
            return false;
        }
        let streams: Vec<_> = match self.streams.lock() {
            Ok(s) => s.values().cloned().collect(),
            Err(_) => Vec::new(),
        };
        for sink in streams {
            if let Err(e) = sink.notify_resource_list_changed().await {
                tracing::debug!("mcp: list_changed on a subscription: {e}");
            }
        }
        true
    }
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .enable_resources_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("agent-bash", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "Run shell commands with the `bash` tool. Shell state (variables, functions) \
                 persists between calls with the same session_key. Long output is truncated; \
                 the full text is the resource named in the notice (artifact://<id>).",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> std::result::Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(vec![bash_tool(self.structured), undo_tool()]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResponse, ErrorData> {
        if request.name == "bash_undo" {
            return Ok(self.undo(request.arguments.unwrap_or_default()).await.into());
        }
        if request.name != "bash" {
            return Err(ErrorData::invalid_params(
                format!("Unknown tool: {} (this server has `bash` and `bash_undo`)", request.name),
                None,
            ));
        }
        let args = request.arguments.unwrap_or_default();
        Ok(self.bash(args, context).await.into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> std::result::Result<ListResourcesResult, ErrorData> {
        let store = self.rt.store();
        let mut list: Vec<Resource> = store
            .ids()
            .into_iter()
            .rev()
            .take(MAX_LISTED)
            .map(|id| {
                let mut r = Resource::new(format!("artifact://{id}"), format!("artifact {id}"))
                    .with_description("Full output of a truncated bash call")
                    .with_mime_type("text/plain");
                if let Ok(meta) = std::fs::metadata(store.path(id)) {
                    r = r.with_size(meta.len());
                }
                r
            })
            .collect();
        tracing::debug!(
            "mcp: resources/list answered: {}",
            list.first().map_or("no artifact", |r| r.uri.as_str())
        );
        list.push(
            Resource::new(CONTEXT_URI, "context")
                .with_description("Commands the user ran in the mirrored editor, with their output")
                .with_mime_type("text/plain"),
        );
        Ok(ListResourcesResult::with_all_items(list))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> std::result::Result<ListResourceTemplatesResult, ErrorData> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![ResourceTemplate::new(
            "artifact://{id}",
            "artifact",
        )
        .with_description("Full output of a truncated bash call, by the id its notice names")
        .with_mime_type("text/plain")]))
    }

    fn accepted_subscription_filter(
        &self,
        requested: &rmcp::model::SubscriptionFilter,
    ) -> Option<rmcp::model::SubscriptionFilter> {
        let mut accepted = rmcp::model::SubscriptionFilter::new();
        accepted.resources_list_changed = requested.resources_list_changed.filter(|on| *on);
        Some(accepted)
    }

    async fn listen(
        &self,
        context: rmcp::service::SubscriptionContext,
    ) -> std::result::Result<(), ErrorData> {
        let id = self.list_changed.next.fetch_add(1, Ordering::Relaxed);
        if context.accepted().resources_list_changed == Some(true) {
            if let Ok(mut s) = self.list_changed.streams.lock() {
                s.insert(id, context.sink().clone());
            }
        }
        context.cancelled().await;
        if let Ok(mut s) = self.list_changed.streams.lock() {
            s.remove(&id);
        }
        Ok(())
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> std::result::Result<ReadResourceResponse, ErrorData> {
        let uri = request.uri;
        let text = if uri == CONTEXT_URI {
            match &self.mirror {
                Some(m) => match m.context().await {
                    Some(Ok(text)) => text,
                    Some(Err(e)) => {
                        return Err(ErrorData::internal_error(format!("context: {e}"), None))
                    }
                    None => String::new(),
                },
                None => String::new(),
            }
        } else if uri.starts_with("artifact://") {
            // Up to 32 MiB from disk: off the runtime thread.
            let (store, url) = (self.rt.store().clone(), uri.clone());
            tokio::task::spawn_blocking(move || crate::artifacts::resolve(Some(&store), &url))
                .await
                .map_err(|e| ErrorData::internal_error(e.to_string(), None))?
                .map_err(|e| ErrorData::resource_not_found(e.to_string(), None))?
        } else {
            return Err(ErrorData::resource_not_found(format!("Unknown resource: {uri}"), None));
        };
        let contents = ResourceContents::text(text, uri).with_mime_type("text/plain");
        Ok(ReadResourceResult::new(vec![contents]).into())
    }
}

impl Server {
    /// `bash_undo` (contract §13): puts back the files a `bash` call changed. The text is the
    /// undo's summary or the refusal naming the files changed since; the data (in `_meta`, and
    /// as structured content when asked for) is the undo's own receipt (`changes_id` undoes the
    /// undo) or `{conflicts}`.
    async fn undo(&self, args: JsonObject) -> CallToolResult {
        let id = match args.get("changes_id") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64() {
                Some(n) => Some(n),
                None => {
                    return self.error_result(&format!(
                        "\"changes_id\" must be a non-negative integer, got {v}"
                    ))
                }
            },
        };
        match super::undo(&self.rt, id).await {
            Ok(done) => wire::undo_tool_result(&done, self.structured),
            Err(refused) => refused.tool_result(self.structured),
        }
    }

    /// One `bash` call: the full tool path, progress, the mirror's card.
    async fn bash(&self, args: JsonObject, context: RequestContext<RoleServer>) -> CallToolResult {
        let mut req = match super::request_from(&args, Origin::Tool) {
            Ok(r) => r,
            Err(e) => return self.error_result(&e.to_string()),
        };
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        // The client's `notifications/cancelled` (rmcp cancels `context.ct`) reaches the run
        // through a child token: no task of its own per call.
        let cancel = context.ct.child_token();
        if let Ok(mut r) = self.running.lock() {
            r.insert(key, cancel.clone());
        }
        let mirror = self.mirror.as_ref().filter(|m| m.alive());
        req.display = mirror.is_some();
        let limited = req.head.is_some() || req.tail.is_some();
        let started = Instant::now();
        if let Some(m) = mirror {
            let client = client_name(&context);
            let cwd = crate::validate::resolve_cwd(
                &std::env::current_dir().unwrap_or_default(),
                req.cwd.as_deref(),
            )
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|_| req.cwd.clone().unwrap_or_default());
            let mut spec = vec![
                ("command", rmpv::Value::from(req.command.as_str())),
                ("cwd", rmpv::Value::from(cwd.as_str())),
                ("client", rmpv::Value::from(client.as_str())),
            ];
            if let Some(t) = req.timeout {
                spec.push(("timeout", rmpv::Value::from(t)));
            }
            m.open(key, cancel.clone(), map(spec));
        }

        // Live updates: to the progress task (latest wins) and to the mirror (bounded queue).
        let progress = context.meta.get_progress_token();
        let (tx, rx) = watch::channel::<Option<LiveUpdate>>(None);
        let last: Arc<Mutex<Option<LiveUpdate>>> = Arc::default();
        let keep = last.clone();
        let card = mirror.cloned();
        let on_update: UpdateFn = Arc::new(move |u: LiveUpdate| {
            if u.last {
                if let Ok(mut l) = keep.lock() {
                    *l = Some(u);
                }
                return;
            }
            if let Some(m) = &card {
                m.update(key, update_event(0, &u, started.elapsed().as_millis() as u64));
            }
            tx.send_replace(Some(u));
        });
        let reporter = progress.map(|token| {
            let peer = context.peer.clone();
            tokio::spawn(report_progress(peer, token, rx))
        });

        let res = self.rt.run(req, cancel.clone(), Some(on_update)).await;
        if let Some(r) = reporter {
            r.abort();
            let _ = r.await;
        }
        if let Ok(mut r) = self.running.lock() {
            r.remove(&key);
        }
        let result = match res {
            Ok(r) => r,
            Err(e) => {
                let failure = Failure::from(e);
                if let Some(m) = mirror {
                    m.finish(key, failure.event(0));
                }
                return wire::bash_tool_result(&failure.result(), self.structured);
            }
        };
        if result.artifact_id.is_some() {
            self.list_changed.changed(&context.peer).await;
        }
        if let Some(m) = mirror {
            let last = last.lock().ok().and_then(|mut l| l.take());
            let lines = wire::card_lines(&result, limited, last);
            let shown = wire::mirror_result(&result, self.rt.store());
            m.finish(key, done_event(0, shown, Some(&lines)));
        }
        wire::bash_tool_result(&result, self.structured)
    }

    /// A call that could not run (bad input): the exact message, as text and as a `BashResult`.
    fn error_result(&self, message: &str) -> CallToolResult {
        wire::bash_tool_result(&Failure::from(message).result(), self.structured)
    }
}

/// The client's name: from this request's `_meta` `io.modelcontextprotocol/clientInfo` (the
/// newest revision: no `initialize`, every request names its client), else from `initialize`.
fn client_name(context: &RequestContext<RoleServer>) -> String {
    context
        .meta
        .client_info()
        .map(|i| i.name)
        .filter(|n| !n.is_empty())
        .or_else(|| context.peer.peer_info().map(|i| i.client_info.name.clone()))
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "MCP".into())
}

/// Sends the latest update as a progress notification, at most every [`PROGRESS_EVERY`].
async fn report_progress(
    peer: rmcp::Peer<RoleServer>,
    token: rmcp::model::ProgressToken,
    mut rx: watch::Receiver<Option<LiveUpdate>>,
) {
    let mut sent_bytes = None;
    while rx.changed().await.is_ok() {
        let Some(u) = rx.borrow_and_update().clone() else { continue };
        // Progress must grow with every notification.
        if sent_bytes == Some(u.total_bytes) {
            continue;
        }
        sent_bytes = Some(u.total_bytes);
        let param = ProgressNotificationParam::new(token.clone(), u.total_bytes as f64)
            .with_message(progress_message(&u));
        if peer.notify_progress(param).await.is_err() {
            return;
        }
        tokio::time::sleep(PROGRESS_EVERY).await;
    }
}

/// `<last line of the live tail> · <N> lines, <size>`.
fn progress_message(u: &LiveUpdate) -> String {
    let line = u.tail.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim_end();
    let line: String = line.chars().take(200).collect();
    let counters =
        format!("{} lines, {}", u.total_lines, crate::result::format_size(u.total_bytes));
    if line.is_empty() {
        counters
    } else {
        format!("{line} · {counters}")
    }
}

/// The `bash` tool; with `structured`, it declares the `BashResult`'s output schema.
fn bash_tool(structured: bool) -> Tool {
    let input = json!({
        "type": "object",
        "properties": {
            "command": {
                "type": "string",
                "description": "The bash command to run. Shell state (exported variables, functions, aliases) persists between calls with the same session_key; each call starts in `cwd`. stdin is /dev/null: do not run commands that wait for input."
            },
            "timeout": {
                "type": "number",
                "description": "Timeout in seconds (default 300, clamped to 1-3600, fractions allowed). On timeout the command and everything it started is killed and the output so far is returned."
            },
            "cwd": {
                "type": "string",
                "description": "Working directory for the command: absolute, `~/...`, or relative to the directory the server runs in (the default)."
            },
            "head": {
                "type": "integer",
                "minimum": 0,
                "description": "Return only the first N lines of the output (like `| head -n N`, without cutting the command short)."
            },
            "tail": {
                "type": "integer",
                "minimum": 0,
                "description": "Return only the last N lines of the output (like `| tail -n N`)."
            },
            "session_key": {
                "type": "string",
                "description": "Name of the persistent shell session to run in (default: one shared session). Use different keys for independent work in parallel."
            },
            "profile": {
                "type": "string",
                "description": "Run on another machine or container: the name of a profile from the server's settings (default: the configured default, else this machine; \"local\" is always this machine). The cwd is then a path over there."
            }
        },
        "required": ["command"]
    });
    let output = json!({
        "type": "object",
        "description": "The run's result; `output` is the same text as the content.",
        "properties": {
            "output": {"type": "string", "description": "What the model reads: notices, output, truncation notice, exit wording"},
            "exit_code": {"type": "integer", "description": "Absent when unknown, after a timeout or a cancel"},
            "cancelled": {"type": "boolean", "description": "Cancelled or timed out"},
            "timed_out": {"type": "boolean"},
            "truncated": {"type": "boolean"},
            "total_lines": {"type": "integer"},
            "total_bytes": {"type": "integer"},
            "output_lines": {"type": "integer"},
            "output_bytes": {"type": "integer"},
            "artifact_id": {"type": "integer", "description": "Full output: resource artifact://<id>"},
            "duration_ms": {"type": "integer"},
            "normalized": {"type": "object"},
            "shell_restarted": {"type": "boolean"},
            "timeout_clamped_from": {"type": "number"},
            "waited_ms": {"type": "integer"},
            "truncation": {"type": "object"},
            "is_error": {"type": "boolean"},
            "blocked": {"type": "object", "description": "Set when interception blocked the command: rule, suggested_tool, message"},
            "remote": {"type": "object", "description": "Where a remote profile ran the command: profile, host"},
            "sandbox": {"type": "string", "description": "The fence the command ran under: workspace-write or read-only"},
            "changes": {
                "type": "array",
                "description": "Files of the project the command added, modified, deleted or changed the mode of (at most 200; paths relative to the project root)",
                "items": {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string"},
                        "kind": {"type": "string", "enum": ["added", "modified", "deleted", "mode"]}
                    },
                    "required": ["path", "kind"]
                }
            },
            "changes_count": {"type": "integer", "description": "How many files changed"},
            "changes_id": {"type": "integer", "description": "Pass to bash_undo to put these files back"},
            "changes_unavailable": {"type": "string", "description": "Why no change receipt was taken"}
        },
        "required": ["output", "cancelled", "timed_out", "truncated", "is_error"]
    });
    let as_object = |v: Value| match v {
        Value::Object(m) => m,
        _ => JsonObject::new(),
    };
    let tool = Tool::new(
        "bash",
        "Run a bash command in a persistent shell session and return its output (the tail when long; the full text stays readable as a resource). Non-zero exit, timeout and cancel are errors.",
        as_object(input),
    );
    match structured {
        true => tool.with_raw_output_schema(Arc::new(as_object(output))),
        false => tool,
    }
}

fn undo_tool() -> Tool {
    let input = json!({
        "type": "object",
        "properties": {
            "changes_id": {
                "type": "integer",
                "minimum": 1,
                "description": "The changes_id of the bash result whose file changes to undo (default: the newest call that changed files)."
            }
        }
    });
    let input = match input {
        Value::Object(m) => m,
        _ => JsonObject::new(),
    };
    Tool::new(
        "bash_undo",
        "Undo the file changes of an earlier bash call: every file it added, modified, deleted or changed the mode of is put back as it was before the call. Refused, touching nothing, when one of those files changed again since (the refusal names them). The undo is itself undoable with the changes_id it returns.",
        input,
    )
}

/// stdin/stdout as an MCP transport: one JSON-RPC message per line.
struct LineTransport {
    reader: BufReader<Box<dyn tokio::io::AsyncRead + Unpin + Send>>,
    buf: Vec<u8>,
    out: mpsc::UnboundedSender<Vec<u8>>,
}

impl LineTransport {
    fn new(out: mpsc::UnboundedSender<Vec<u8>>) -> LineTransport {
        LineTransport {
            reader: BufReader::with_capacity(64 * 1024, super::stdio_reader()),
            buf: Vec::new(),
            out,
        }
    }

    fn reply_error(&self, id: Value, code: i64, message: String) {
        let v = json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
        let mut line = v.to_string().into_bytes();
        line.push(b'\n');
        let _ = self.out.send(line);
    }
}

impl Transport<RoleServer> for LineTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl std::future::Future<Output = std::result::Result<(), Self::Error>> + Send + 'static
    {
        let line = serde_json::to_vec(&item).map(|mut v| {
            v.push(b'\n');
            v
        });
        let out = self.out.clone();
        async move {
            let line = line.map_err(std::io::Error::other)?;
            out.send(line).map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::BrokenPipe, "stdout is closed")
            })
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            // `read_until` keeps what it read in `buf` when this future is dropped (rmcp polls
            // it in a select): the line is resumed, not lost. `buf` is cleared only below.
            let n = match (&mut self.reader)
                .take((MAX_LINE + 1) as u64)
                .read_until(b'\n', &mut self.buf)
                .await
            {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!("mcp: stdin: {e}");
                    return None;
                }
            };
            if n == 0 && self.buf.is_empty() {
                return None;
            }
            if self.buf.len() > MAX_LINE && !self.buf.ends_with(b"\n") {
                // Skip the rest of the over-long line without buffering it.
                self.buf.clear();
                let mut sink = Vec::new();
                loop {
                    sink.clear();
                    match (&mut self.reader).take(64 * 1024).read_until(b'\n', &mut sink).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) if sink.ends_with(b"\n") => break,
                        Ok(_) => {}
                    }
                }
                self.reply_error(Value::Null, -32600, "Invalid request: line too long".into());
                continue;
            }
            let line = std::mem::take(&mut self.buf);
            let text = trim_line(&line);
            if text.is_empty() {
                if n == 0 {
                    return None;
                }
                continue;
            }
            match serde_json::from_slice::<RxJsonRpcMessage<RoleServer>>(text) {
                Ok(msg) => return Some(msg),
                Err(e) => match serde_json::from_slice::<Value>(text) {
                    Err(e2) => {
                        tracing::info!("mcp: unparsable line: {e2}");
                        self.reply_error(Value::Null, -32700, format!("Parse error: {e2}"));
                    }
                    Ok(v) => {
                        // A malformed notification gets no answer (JSON-RPC); a request does.
                        if v.get("id").is_some_and(|id| !id.is_null()) || v.get("method").is_none()
                        {
                            let id = match v.get("id") {
                                Some(id @ (Value::String(_) | Value::Number(_))) => id.clone(),
                                _ => Value::Null,
                            };
                            tracing::info!("mcp: invalid request: {e}");
                            self.reply_error(id, -32600, format!("Invalid request: {e}"));
                        } else {
                            tracing::debug!("mcp: ignoring a malformed notification: {e}");
                        }
                    }
                },
            }
            if n == 0 {
                return None;
            }
        }
    }

    async fn close(&mut self) -> std::result::Result<(), Self::Error> {
        Ok(())
    }
}

fn trim_line(line: &[u8]) -> &[u8] {
    let mut t = line;
    while let Some((last, rest)) = t.split_last() {
        if matches!(last, b'\n' | b'\r' | b' ' | b'\t') {
            t = rest;
        } else {
            break;
        }
    }
    t.strip_prefix(b"\xEF\xBB\xBF".as_slice()).unwrap_or(t)
}

/// The one writer of stdout.
async fn write_lines(mut rx: mpsc::UnboundedReceiver<Vec<u8>>) {
    let mut stdout = super::stdio_writer();
    while let Some(line) = rx.recv().await {
        if stdout.write_all(&line).await.is_err() {
            break;
        }
        // Flush once the queue is drained: a burst of messages goes out in one write.
        if rx.is_empty() && stdout.flush().await.is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_message_has_last_line_and_counters() {
        let u = LiveUpdate {
            tail: "one\ntwo\n\n".into(),
            total_bytes: 2048,
            total_lines: 3,
            lines: vec![],
            last: false,
        };
        assert_eq!(progress_message(&u), "two · 3 lines, 2.0KB");
        let empty = LiveUpdate { tail: String::new(), ..u };
        assert_eq!(progress_message(&empty), "3 lines, 2.0KB");
    }

    #[test]
    fn tool_schemas_are_objects_with_command_required() {
        assert!(bash_tool(false).output_schema.is_none());
        let t = bash_tool(true);
        assert_eq!(t.input_schema["type"], "object");
        assert_eq!(t.input_schema["required"], json!(["command"]));
        let out = t.output_schema.unwrap();
        assert_eq!(out["type"], "object");
        // Every required field of the output schema is always in a serialized result.
        let v = serde_json::to_value(crate::result::BashResult::default()).unwrap();
        for k in out["required"].as_array().unwrap() {
            assert!(v.get(k.as_str().unwrap()).is_some(), "{k} missing");
        }
    }
}
