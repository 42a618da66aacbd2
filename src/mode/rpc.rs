//! `agent-bash rpc`: JSON lines over stdio, wire-compatible with the reference agent's RPC
//! `bash` / `abort_bash` (contract §9), plus `tool_call` with execution events.
//!
//! Every request is handled on its own task, so `abort_bash` interrupts a running `bash`.
//! One writer task owns stdout; everything else sends it finished lines.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::{json, Map, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::wire::{self, rpc_parse_error as parse_error, rpc_response, Failure};
use super::{get_count, request_from};
use crate::exec::{LiveUpdate, Origin, Runtime, Settings, UpdateFn};
use crate::Result;

/// Flags of `agent-bash rpc`.
#[derive(Debug, clap::Args)]
pub struct RpcArgs {
    /// Settings file (TOML).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Session id: artifacts and the record of `bash` commands live in
    /// `<state>/sessions/<id>` (default: a new session).
    #[arg(long)]
    pub session_id: Option<String>,
}

/// Longest request line accepted: a command with its options fits many times over. A longer
/// line is refused with a parse error while it streams by, never held whole (contract §9).
pub const MAX_LINE: usize = 1 << 20;
/// Lines waiting for stdout. When the client stops reading, senders wait here (back-pressure):
/// final responses are never dropped, live updates are coalesced per tool call.
const OUT_QUEUE: usize = 16;
/// Requests running at once; past this the reader stops reading stdin until one finishes.
const MAX_RUNNING: usize = 256;
/// After stdin closes, running requests get this long to finish before they are cancelled.
const EOF_GRACE: std::time::Duration = std::time::Duration::from_secs(2);
/// After that cancel, how long answers may take to reach a client that no longer reads.
const EXIT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

type Out = mpsc::Sender<String>;

struct State {
    rt: Arc<Runtime>,
    out: Out,
    /// Running `bash` requests (aborted together by `abort_bash`).
    bangs: Mutex<HashMap<u64, CancellationToken>>,
    /// Running `tool_call` requests by request id.
    tools: Mutex<HashMap<String, CancellationToken>>,
    next: std::sync::atomic::AtomicU64,
}

/// Runs the JSON-lines mode until stdin closes or a signal. At end of stdin, running requests
/// get [`EOF_GRACE`] to finish, then are cancelled (trees killed) and answered as cancelled.
pub async fn run(args: RpcArgs) -> Result<i32> {
    let settings = match &args.config {
        Some(p) => Settings::load(p)?,
        None => Settings::default(),
    };
    let rt = super::start_runtime(settings, args.session_id.as_deref())?;
    tokio::spawn(rt.clone().evict_loop());
    let (tx, mut rx) = mpsc::channel::<String>(OUT_QUEUE);
    let writer = tokio::spawn(async move {
        let mut stdout = super::stdio_writer();
        while let Some(mut line) = rx.recv().await {
            line.push('\n');
            if stdout.write_all(line.as_bytes()).await.is_err() {
                break;
            }
            // Flush only when nothing else is waiting: one syscall for a burst of lines.
            if rx.is_empty() && stdout.flush().await.is_err() {
                break;
            }
        }
    });
    let state = Arc::new(State {
        rt: rt.clone(),
        out: tx,
        bangs: Mutex::new(HashMap::new()),
        tools: Mutex::new(HashMap::new()),
        next: std::sync::atomic::AtomicU64::new(0),
    });
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_RUNNING));
    let mut tasks = tokio::task::JoinSet::new();
    let mut lines = BufReader::with_capacity(64 * 1024, super::stdio_reader());
    let mut buf = Vec::new();
    let signal = super::wait_for_signal();
    tokio::pin!(signal);
    let mut signalled = false;
    loop {
        buf.clear();
        let read = tokio::select! {
            r = read_line(&mut lines, &mut buf, &state.out) => r,
            _ = &mut signal => { signalled = true; cancel_all(&state); break; }
        };
        match read {
            Ok(Line::Eof) => break,
            Ok(Line::Done) => {}
            Ok(Line::TooLong) => continue,
            Err(e) => {
                tracing::warn!("stdin: {e}");
                break;
            }
        }
        let text = String::from_utf8_lossy(&buf);
        if text.trim().is_empty() {
            continue;
        }
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p,
            _ = &mut signal => { signalled = true; cancel_all(&state); break; }
        };
        let st = state.clone();
        let text = text.into_owned();
        tasks.spawn(async move {
            handle(&st, &text).await;
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
    }
    // stdin closed (contract §9): the client is gone. Running requests get a grace period, then are
    // cancelled and answered as cancelled; a signal cancels at once.
    if !signalled {
        let finished = tokio::select! {
            r = tokio::time::timeout(EOF_GRACE, async { while tasks.join_next().await.is_some() {} }) => r.is_ok(),
            _ = &mut signal => false,
        };
        if !finished {
            tracing::info!("stdin closed: cancelling {} running request(s)", tasks.len());
            cancel_all(&state);
        }
    }
    // Answers may still be stuck behind a client that stopped reading: bounded wait.
    let drained =
        tokio::time::timeout(EXIT_DEADLINE, async { while tasks.join_next().await.is_some() {} })
            .await;
    if drained.is_err() {
        tracing::warn!("client stopped reading: {} answer(s) dropped at exit", tasks.len());
        tasks.abort_all();
    }
    rt.shutdown().await;
    drop(state);
    let _ = tokio::time::timeout(EXIT_DEADLINE, writer).await;
    Ok(0)
}

/// What [`read_line`] found.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// End of input with nothing read.
    Eof,
    /// A line (its newline removed) is in the buffer.
    Done,
    /// A line longer than [`MAX_LINE`]: refused and skipped.
    TooLong,
}

/// Reads one line (without its newline) into `buf`, holding at most [`MAX_LINE`] bytes of it: a
/// longer line is answered with a parse error as soon as it crosses the limit, and the rest of
/// it is read and dropped chunk by chunk.
async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    out: &Out,
) -> std::io::Result<Line> {
    let mut any = false;
    let mut too_long = false;
    loop {
        let chunk = r.fill_buf().await?;
        if chunk.is_empty() {
            // EOF: a last line without its newline still counts.
            return Ok(match (any, too_long) {
                (false, _) => Line::Eof,
                (true, true) => Line::TooLong,
                (true, false) => Line::Done,
            });
        }
        any = true;
        let (take, end) = match memchr::memchr(b'\n', chunk) {
            Some(i) => (i, true),
            None => (chunk.len(), false),
        };
        if !too_long {
            if buf.len() + take > MAX_LINE {
                too_long = true;
                // The id is echoed when the part we saw names one (contract §9, Ours).
                let seen = String::from_utf8_lossy(buf);
                let id = sniff_id(&seen);
                let msg = format!("request line longer than {MAX_LINE} bytes");
                buf.clear();
                buf.shrink_to(64 * 1024);
                let _ = out.send(parse_error(id.as_ref(), &msg).to_string()).await;
            } else {
                buf.extend_from_slice(&chunk[..take]);
            }
        }
        r.consume(take + usize::from(end));
        if end {
            break;
        }
    }
    if too_long {
        return Ok(Line::TooLong);
    }
    while buf.last().is_some_and(|b| *b == b'\r') {
        buf.pop();
    }
    Ok(Line::Done)
}

fn cancel_all(state: &State) {
    if let Ok(b) = state.bangs.lock() {
        b.values().for_each(|c| c.cancel());
    }
    if let Ok(t) = state.tools.lock() {
        t.values().for_each(|c| c.cancel());
    }
}

/// Queues a line for stdout, waiting while the queue is full (back-pressure).
async fn send(out: &Out, v: Value) {
    let _ = out.send(v.to_string()).await;
}

fn response<E: std::fmt::Display>(
    id: Option<&Value>,
    command: &str,
    result: std::result::Result<Option<Value>, E>,
) -> Value {
    rpc_response(id, command, result.map_err(|e| Failure::from(e.to_string())))
}

/// A request line decoded: its id (when it has one), its type and its fields.
pub type Decoded = (Option<Value>, String, Map<String, Value>);

/// Decodes one request line, or returns the parse error to answer (contract §9).
pub fn decode_line(line: &str) -> std::result::Result<Decoded, Value> {
    let req: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        // Echo the id when it can be read at all (contract §9, Ours).
        Err(e) => return Err(parse_error(sniff_id(line).as_ref(), &e.to_string())),
    };
    let Value::Object(obj) = req else {
        return Err(parse_error(None, "expected a JSON object"));
    };
    let id = obj.get("id").cloned();
    let Some(kind) = obj.get("type").and_then(Value::as_str).map(str::to_owned) else {
        return Err(parse_error(id.as_ref(), "missing \"type\""));
    };
    Ok((id, kind, obj))
}

async fn handle(state: &Arc<State>, line: &str) {
    let (id, kind, obj) = match decode_line(line) {
        Ok(d) => d,
        Err(e) => return send(&state.out, e).await,
    };
    let (kind, obj) = (kind.as_str(), &obj);
    match kind {
        "bash" => bash(state, id, obj).await,
        "abort_bash" => {
            if let Ok(b) = state.bangs.lock() {
                b.values().for_each(|c| c.cancel());
            }
            send(&state.out, response::<crate::Error>(id.as_ref(), "abort_bash", Ok(None))).await;
        }
        "tool_call" => tool_call(state, id, obj).await,
        "get_context" | "history" => {
            let res = match super::page_args(obj) {
                Ok((offset, limit)) => Ok(Some(if kind == "history" {
                    wire::json(&super::history_page(&state.rt, offset, limit).await)
                } else {
                    wire::json(&super::context_page(&state.rt, offset, limit).await)
                })),
                Err(e) => Err(e),
            };
            send(&state.out, response(id.as_ref(), kind, res)).await;
        }
        "artifact" => {
            // contract §4.3: `artifact://<id>` or `artifact://<id>#L<a>-<b>`; errors word-exact.
            let url = obj.get("url").and_then(Value::as_str).unwrap_or("").to_owned();
            let store = state.rt.store().clone();
            // Up to 32 MiB from disk: off the runtime thread.
            let res = tokio::task::spawn_blocking(move || {
                crate::artifacts::resolve(Some(&store), &url)
                    .map(|text| Some(json!({"text": text})))
            })
            .await
            .unwrap_or_else(|e| Err(crate::Error::Io(std::io::Error::other(e))));
            send(&state.out, response(id.as_ref(), "artifact", res)).await;
        }
        "undo" => {
            // contract §13: `changes_id` (absent: the newest run with changes).
            let v = match get_count(obj, "changes_id") {
                Ok(changes_id) => {
                    let done = super::undo(&state.rt, changes_id.map(|n| n as u64)).await;
                    rpc_response(
                        id.as_ref(),
                        "undo",
                        done.map(|d| Some(wire::camel(wire::json(&d)))),
                    )
                }
                Err(e) => response(id.as_ref(), "undo", Err(e)),
            };
            send(&state.out, v).await;
        }
        "abort_tool_call" => {
            let target = obj.get("target").map(id_key);
            let found = match (&target, state.tools.lock()) {
                (Some(t), Ok(tools)) => tools.get(t).map(|c| c.cancel()).is_some(),
                _ => false,
            };
            let res = if found { Ok(None) } else { Err(crate::Error::NoToolCall) };
            send(&state.out, response(id.as_ref(), "abort_tool_call", res)).await;
        }
        other => {
            send(
                &state.out,
                response(id.as_ref(), other, Err(crate::Error::UnknownCommand(other.to_owned()))),
            )
            .await;
        }
    }
}

/// Best-effort id from a line that is not valid JSON: `"id":"…"` or `"id":123`.
fn sniff_id(line: &str) -> Option<Value> {
    let at = line.find("\"id\"")?;
    let rest = line[at + 4..].trim_start().strip_prefix(':')?.trim_start();
    if let Some(s) = rest.strip_prefix('"') {
        let end = s.find('"')?;
        return Some(Value::String(s[..end].to_string()));
    }
    let num: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    num.parse::<u64>().ok().map(Value::from)
}

fn id_key(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

async fn bash(state: &Arc<State>, id: Option<Value>, obj: &Map<String, Value>) {
    let req = match request_from(obj, Origin::Bang) {
        Ok(r) => r,
        Err(e) => return send(&state.out, response(id.as_ref(), "bash", Err(e))).await,
    };
    let exclude = obj.get("exclude_from_context").and_then(Value::as_bool).unwrap_or(false);
    let (command, cwd) = (req.command.clone(), req.cwd.clone().unwrap_or_default());
    let n = state.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let cancel = CancellationToken::new();
    if let Ok(mut b) = state.bangs.lock() {
        b.insert(n, cancel.clone());
    }
    let res = state.rt.run(req, cancel, None).await;
    if let Ok(mut b) = state.bangs.lock() {
        b.remove(&n);
    }
    // The record is written while the answer is made, and is on disk before it is sent.
    let record = match &res {
        Ok(r) => {
            let cwd = if cwd.is_empty() {
                std::env::current_dir().unwrap_or_default()
            } else {
                cwd.into()
            };
            Some(super::record_bang(&state.rt, &command, &cwd, r, exclude))
        }
        Err(_) => None,
    };
    let res = res.map(|r| Some(wire::rpc_result(&r))).map_err(Failure::from);
    let answer = rpc_response(id.as_ref(), "bash", res).to_string();
    if let Some(record) = record {
        record.done().await;
    }
    let _ = state.out.send(answer).await;
}

async fn tool_call(state: &Arc<State>, id: Option<Value>, obj: &Map<String, Value>) {
    let req = match request_from(obj, Origin::Tool) {
        Ok(r) => r,
        Err(e) => return send(&state.out, response(id.as_ref(), "tool_call", Err(e))).await,
    };
    // Requests without an id still need a key of their own for `abort_tool_call` bookkeeping.
    let n = state.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let key = id.as_ref().map(id_key).unwrap_or_else(|| format!("\0anonymous-{n}"));
    let cancel = CancellationToken::new();
    if let Ok(mut t) = state.tools.lock() {
        t.insert(key.clone(), cancel.clone());
    }
    let mut start = json!({"type": "tool_execution_start", "toolName": "bash",
        "args": {"command": req.command}});
    if let Some(id) = &id {
        start["id"] = id.clone();
    }
    send(&state.out, start).await;
    // Live updates are coalesced: a client that reads slowly gets the latest state, never a
    // queue of old ones (each carries the whole current tail).
    let (utx, mut urx) = watch::channel::<Option<String>>(None);
    let upd_id = id.clone();
    let on_update: UpdateFn = Arc::new(move |u: LiveUpdate| {
        // The final state travels in `tool_execution_end`.
        if u.last {
            return;
        }
        let mut v = json!({"type": "tool_execution_update", "toolName": "bash",
            "partialResult": {"output": u.tail, "totalBytes": u.total_bytes, "totalLines": u.total_lines}});
        if let Some(id) = &upd_id {
            v["id"] = id.clone();
        }
        utx.send_replace(Some(v.to_string()));
    });
    let out = state.out.clone();
    let forwarder = tokio::spawn(async move {
        while urx.changed().await.is_ok() {
            let line = urx.borrow_and_update().clone();
            if let Some(line) = line {
                if out.send(line).await.is_err() {
                    break;
                }
            }
        }
    });
    let res = state.rt.run(req, cancel, Some(on_update)).await;
    // An update still waiting for room is superseded by the end event.
    forwarder.abort();
    let _ = forwarder.await;
    if let Ok(mut t) = state.tools.lock() {
        t.remove(&key);
    }
    let (result, is_error) = match &res {
        Ok(r) => (wire::rpc_result(r), r.is_error),
        Err(e) => (Failure::from(e).rpc_result(), true),
    };
    let mut end = json!({"type": "tool_execution_end", "toolName": "bash", "result": result, "isError": is_error});
    if let Some(id) = &id {
        end["id"] = id.clone();
    }
    send(&state.out, end).await;
    let res = res.map(|r| Some(wire::rpc_result(&r))).map_err(Failure::from);
    send(&state.out, rpc_response(id.as_ref(), "tool_call", res)).await;
}
