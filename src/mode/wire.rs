//! The one place a result, a card or a failure becomes what a mode sends: msgpack (`rmpv`) for
//! the editor (`nvim`) and the MCP server's editor mirror, JSON for `rpc` and `mcp`.
//!
//! * [`msgpack`] encodes any `Serialize` value (a `BashResult`, an undo, a page of history)
//!   straight into msgpack, without a `serde_json::Value` on the way. Its shape is the one the
//!   editor has always read: the JSON shape of the value (serde's data model as serde_json maps
//!   it: unit variants as names, bytes as arrays of numbers), map keys in sorted order (what
//!   serde_json's map gave), absent values left out of maps. The unit tests hold it byte for byte
//!   against the old JSON detour.
//! * Card events ([`update_event`], [`done_event`], [`Failure::event`]) are the editor's and the
//!   mirror's alike; the finished card's lines are chosen once, in [`card_lines`].
//! * [`Failure`] is every error a mode reports, in one form: built from the library's
//!   [`crate::Error`], an undo's refusal or a request's bad input, and worded for each wire
//!   here ([`Failure::event`], [`Failure::msgpack`], [`rpc_response`], [`Failure::tool_result`]).

use std::collections::BTreeMap;

use rmcp::model::{CallToolResult, ContentBlock, JsonObject};
use rmpv::Value;
use serde::ser::{self, Serialize};
use serde_json::json;

use crate::display::StyledLine;
use crate::exec::LiveUpdate;
use crate::result::BashResult;
use crate::sanitize::{Color, Style};

/// The `_meta` key of an MCP tool result that holds the `BashResult` (or `bash_undo`'s data).
pub const RESULT_META: &str = "agent-bash/result";

// ---------------------------------------------------------------------------------------------
// Results

/// `v` as msgpack, in the shape described in the module docs (`Nil` if `v` cannot be encoded:
/// a map whose keys are not strings or numbers, which no value of ours has).
pub fn msgpack<T: Serialize + ?Sized>(v: &T) -> Value {
    v.serialize(Msgpack).unwrap_or_else(|e| {
        tracing::warn!("msgpack encoding failed: {e}");
        Value::Nil
    })
}

/// A value as JSON (`rpc` and `mcp`): its serde shape.
pub fn json<T: Serialize + ?Sized>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or_default()
}

/// A result as JSON (`rpc`'s tool events and `mcp`'s `_meta`): snake_case keys, absent fields
/// left out.
pub fn result_json(r: &BashResult) -> serde_json::Value {
    json(r)
}

/// A result as the text the print modes write with `--json` (`exec`: `pretty`, `sanitize`: one
/// line), fields in their declared order.
pub fn result_line(r: &BashResult, pretty: bool) -> crate::Result<String> {
    let text = if pretty { serde_json::to_string_pretty(r) } else { serde_json::to_string(r) };
    text.map_err(|e| crate::Error::InvalidInput(e.to_string()))
}

/// A result for `rpc` (contract §9): the reference's camelCase keys, nulls dropped.
pub fn rpc_result(r: &BashResult) -> serde_json::Value {
    camel(result_json(r))
}

/// The result of a mirrored card: the editor's shape plus `artifact_path`, since the artifact is
/// the MCP server's and the card reads the file instead of asking its own backend.
pub fn mirror_result(r: &BashResult, store: &crate::artifacts::ArtifactStore) -> Value {
    #[derive(serde::Serialize)]
    struct Mirrored<'a> {
        #[serde(flatten)]
        result: &'a BashResult,
        artifact_path: Option<String>,
    }
    let artifact_path = r.artifact_id.map(|id| store.path(id).to_string_lossy().into_owned());
    msgpack(&Mirrored { result: r, artifact_path })
}

/// snake_case keys → camelCase, recursively, nulls dropped (the reference's wire uses camelCase
/// and omits absent values). Not serde's `rename_all`: the same `BashResult` is snake_case for
/// Neovim and `exec --json`, and its nested records (truncation, normalized, blocked) are camelCase
/// here too; the key conversion itself is `heck`'s.
pub fn camel(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        J::Object(m) => J::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (camel_key(k), camel(v)))
                .collect(),
        ),
        J::Array(a) => J::Array(a.into_iter().map(camel).collect()),
        other => other,
    }
}

fn camel_key(k: String) -> String {
    // A one-word key (`output`, `cancelled`) is its own camelCase: kept without a rewrite.
    if k.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) {
        return k;
    }
    heck::ToLowerCamelCase::to_lower_camel_case(k.as_str())
}

// ---------------------------------------------------------------------------------------------
// Cards (the editor's, and the mirror's cards of MCP calls)

/// A msgpack map of `entries`, in their order.
pub fn map(entries: Vec<(&str, Value)>) -> Value {
    Value::Map(entries.into_iter().map(|(k, v)| (Value::from(k), v)).collect())
}

/// `{type = "update", id, total_lines, total_bytes, elapsed_ms, lines, hl}`.
pub fn update_event(id: i64, u: &LiveUpdate, elapsed_ms: u64) -> Value {
    let mut ev = vec![
        ("type", Value::from("update")),
        ("id", Value::from(id)),
        ("total_lines", Value::from(u.total_lines)),
        ("total_bytes", Value::from(u.total_bytes)),
        ("elapsed_ms", Value::from(elapsed_ms)),
    ];
    ev.extend(lines_and_hl(&u.lines));
    map(ev)
}

/// A result as the editor gets it: its fields, and `changes_indexing` (the project root) when
/// there is no receipt because that project's first snapshot is being taken: the card follows
/// it (`changes_status`). Other clients get the reason in `changes_unavailable` alone.
pub fn editor_result(r: &BashResult) -> Value {
    let mut value = msgpack(r);
    if let (Some(root), Value::Map(m)) = (&r.changes_indexing, &mut value) {
        m.push((Value::from("changes_indexing"), Value::from(root.to_string_lossy().as_ref())));
    }
    value
}

/// `{type = "done", id, result}`, with the card's `lines` and `hl` when given (a blocked PTY
/// call has none: it never ran).
pub fn done_event(id: i64, result: Value, lines: Option<&[StyledLine]>) -> Value {
    let mut ev = vec![("type", Value::from("done")), ("id", Value::from(id)), ("result", result)];
    if let Some(lines) = lines {
        ev.extend(lines_and_hl(lines));
    }
    map(ev)
}

/// The finished card's lines: the run's last display lines (`last`, the final live update),
/// except when head/tail limits (`limited`, or a `| head`/`| tail` normalization took) make the
/// model see a selection of the stream rather than its end: then the card shows that selection,
/// without colours.
pub fn card_lines(r: &BashResult, limited: bool, last: Option<LiveUpdate>) -> Vec<StyledLine> {
    let selects = |n: &serde_json::Value| !n["head"].is_null() || !n["tail"].is_null();
    if limited || r.normalized.as_ref().is_some_and(selects) {
        let mut d = crate::display::Display::new();
        d.push(&r.text, &[]);
        d.last(crate::display::MAX_LINES, "")
    } else {
        last.map(|u| u.lines).unwrap_or_default()
    }
}

/// `lines` (as shown, clamped) and `hl` (`{row0, col_start, col_end, style}`) for Lua.
pub fn lines_and_hl(lines: &[StyledLine]) -> [(&'static str, Value); 2] {
    let mut hl = Vec::new();
    for (row, line) in lines.iter().enumerate() {
        for sp in &line.spans {
            hl.push(Value::Array(vec![
                Value::from(row as u64),
                Value::from(sp.start as u64),
                Value::from(sp.end as u64),
                style(&sp.style),
            ]));
        }
    }
    let text = lines.iter().map(|l| Value::from(l.shown())).collect();
    [("lines", Value::Array(text)), ("hl", Value::Array(hl))]
}

/// A style in the shape the Lua side takes (`{fg = 1 | '#rrggbb', bold = true, …}`): only what is
/// set, keys in sorted order.
fn style(s: &Style) -> Value {
    let color = |c: &Color| match c {
        Color::Indexed(i) => Value::from(*i),
        Color::Rgb(r, g, b) => Value::from(format!("#{r:02x}{g:02x}{b:02x}")),
    };
    let mut m: Vec<(&str, Value)> = Vec::new();
    if let Some(c) = &s.fg {
        m.push(("fg", color(c)));
    }
    if let Some(c) = &s.bg {
        m.push(("bg", color(c)));
    }
    for (k, on) in [
        ("bold", s.bold),
        ("dim", s.dim),
        ("italic", s.italic),
        ("underline", s.underline),
        ("reverse", s.reverse),
        ("strikethrough", s.strikethrough),
    ] {
        if on {
            m.push((k, Value::from(true)));
        }
    }
    m.sort_by_key(|(k, _)| *k);
    map(m)
}

// ---------------------------------------------------------------------------------------------
// Failures

/// Every error a mode reports, in one form: the text the user or the model reads, and what a
/// client may act on (an undo refused because files changed since names them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub message: String,
    pub conflicts: Option<Vec<String>>,
}

impl From<String> for Failure {
    fn from(message: String) -> Failure {
        Failure { message, conflicts: None }
    }
}

impl From<&str> for Failure {
    fn from(message: &str) -> Failure {
        Failure::from(message.to_owned())
    }
}

impl From<&crate::Error> for Failure {
    fn from(e: &crate::Error) -> Failure {
        Failure::from(e.to_string())
    }
}

impl From<crate::Error> for Failure {
    fn from(e: crate::Error) -> Failure {
        Failure::from(&e)
    }
}

impl From<crate::changes::ChangesError> for Failure {
    fn from(e: crate::changes::ChangesError) -> Failure {
        Failure::from(e.to_string())
    }
}

impl From<crate::changes::UndoError> for Failure {
    fn from(e: crate::changes::UndoError) -> Failure {
        let conflicts = match &e {
            crate::changes::UndoError::Conflict { paths, .. }
            | crate::changes::UndoError::Ambiguous { paths, .. } => Some(paths.clone()),
            _ => None,
        };
        Failure { message: e.to_string(), conflicts }
    }
}

impl Failure {
    /// The data beside the message: `{conflicts: [...]}`, when there is any.
    pub fn data(&self) -> Option<serde_json::Value> {
        self.conflicts.as_ref().map(|paths| json!({ "conflicts": paths }))
    }

    /// A card's last event: `{type = "error", id, message}`.
    pub fn event(&self, id: i64) -> Value {
        map(vec![
            ("type", Value::from("error")),
            ("id", Value::from(id)),
            ("message", Value::from(self.message.as_str())),
        ])
    }

    /// The error of an editor request: its message.
    pub fn msgpack(&self) -> Value {
        Value::from(self.message.as_str())
    }

    /// A `bash` call that could not run (bad input, a refused cwd): the exact message as the
    /// model's text, in a `BashResult` marked as an error.
    pub fn result(&self) -> BashResult {
        BashResult { output: self.message.clone(), is_error: true, ..Default::default() }
    }

    /// A `tool_call` that could not run, in its `tool_execution_end` event (`rpc`).
    pub fn rpc_result(&self) -> serde_json::Value {
        json!({ "output": self.message })
    }

    /// An MCP tool error: the message as the text; the data, when any, in `_meta` (and the
    /// structured content with `structured`).
    pub fn tool_result(&self, structured: bool) -> CallToolResult {
        tool_result(self.message.clone(), self.data(), true, structured)
    }
}

// ---------------------------------------------------------------------------------------------
// JSON lines (`rpc`)

/// A response line: `{type = "response", command, id?, success, data?}` or, failed,
/// `{…, success = false, error, data?}`.
pub fn rpc_response(
    id: Option<&serde_json::Value>,
    command: &str,
    result: std::result::Result<Option<serde_json::Value>, Failure>,
) -> serde_json::Value {
    let mut v = json!({"type": "response", "command": command});
    if let Some(id) = id {
        v["id"] = id.clone();
    }
    match result {
        Ok(data) => {
            v["success"] = json!(true);
            if let Some(d) = data {
                v["data"] = d;
            }
        }
        Err(f) => {
            v["success"] = json!(false);
            v["error"] = json!(f.message);
            if let Some(d) = f.data() {
                v["data"] = d;
            }
        }
    }
    v
}

/// The answer to a line that is not a request (contract §9): the id is echoed when it could be
/// read.
pub fn rpc_parse_error(id: Option<&serde_json::Value>, msg: &str) -> serde_json::Value {
    let mut v = json!({"type": "response", "command": "parse", "success": false,
        "error": format!("Failed to parse command: {msg}")});
    if let Some(id) = id {
        v["id"] = id.clone();
    }
    v
}

// ---------------------------------------------------------------------------------------------
// MCP

/// An MCP tool result: `text` is the only content (what the model reads); `data` goes to
/// `_meta` under [`RESULT_META`], and also to the structured content when `structured`.
pub fn tool_result(
    text: String,
    data: Option<serde_json::Value>,
    is_error: bool,
    structured: bool,
) -> CallToolResult {
    let mut out = CallToolResult::success(vec![ContentBlock::text(text)]);
    if let Some(data) = data {
        if structured {
            out.structured_content = Some(data.clone());
        }
        let mut meta = JsonObject::new();
        meta.insert(RESULT_META.into(), data);
        out.meta = Some(rmcp::model::MetaObject(meta));
    }
    out.is_error = Some(is_error);
    out
}

/// What an MCP client gets for a done `bash_undo`: the undo's summary as the text, the undo's
/// own receipt as the data.
pub fn undo_tool_result(done: &crate::changes::UndoResult, structured: bool) -> CallToolResult {
    tool_result(done.output.clone(), Some(json(done)), false, structured)
}

/// What an MCP client gets for a finished `bash` call.
pub fn bash_tool_result(r: &BashResult, structured: bool) -> CallToolResult {
    tool_result(r.output.clone(), Some(result_json(r)), r.is_error, structured)
}

// ---------------------------------------------------------------------------------------------
// Decoding

/// A msgpack value (the editor's parameters, the mirror's answers) as JSON. Nil values and
/// absent keys mean the same (vim.NIL): nil map entries are left out.
pub fn msgpack_to_json(v: &Value) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        Value::Nil => J::Null,
        Value::Boolean(b) => J::Bool(*b),
        Value::Integer(i) => {
            i.as_i64().map(J::from).or_else(|| i.as_u64().map(J::from)).unwrap_or(J::Null)
        }
        // NaN and infinities have no JSON number: keep them as text, so that validation rejects
        // them (a NaN timeout is an error, not "no timeout").
        Value::F32(f) => float_json(f64::from(*f)),
        Value::F64(f) => float_json(*f),
        Value::String(s) => J::String(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        Value::Binary(b) => J::String(String::from_utf8_lossy(b).into_owned()),
        Value::Array(a) => J::Array(a.iter().map(msgpack_to_json).collect()),
        Value::Map(m) => J::Object(
            m.iter()
                .filter_map(|(k, v)| {
                    let key = match k {
                        Value::String(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
                        other => other.to_string(),
                    };
                    (!v.is_nil()).then(|| (key, msgpack_to_json(v)))
                })
                .collect(),
        ),
        Value::Ext(_, _) => J::Null,
    }
}

fn float_json(f: f64) -> serde_json::Value {
    serde_json::Number::from_f64(f)
        .map_or_else(|| serde_json::Value::String(f.to_string()), serde_json::Value::Number)
}

// ---------------------------------------------------------------------------------------------
// The msgpack serializer behind [`msgpack`]

/// Why a value could not be encoded.
#[derive(Debug)]
pub struct EncodeError(String);

impl std::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for EncodeError {}

impl ser::Error for EncodeError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        EncodeError(msg.to_string())
    }
}

type Encoded = std::result::Result<Value, EncodeError>;

/// serde → `rmpv::Value`, with serde_json's data model (see [`msgpack`]).
struct Msgpack;

/// A map being built: sorted by key, later keys replacing earlier ones, nil values left out.
#[derive(Default)]
struct Entries(BTreeMap<String, Value>);

impl Entries {
    fn insert(&mut self, key: String, v: Value) {
        if v.is_nil() {
            self.0.remove(&key);
        } else {
            self.0.insert(key, v);
        }
    }

    fn done(self) -> Value {
        Value::Map(self.0.into_iter().map(|(k, v)| (Value::from(k), v)).collect())
    }
}

/// `{variant: value}`, as serde_json writes a non-unit enum variant.
fn variant(name: &str, v: Value) -> Value {
    let mut m = Entries::default();
    m.insert(name.to_owned(), v);
    m.done()
}

fn float(f: f64) -> Value {
    if f.is_finite() {
        Value::F64(f)
    } else {
        Value::Nil
    }
}

impl ser::Serializer for Msgpack {
    type Ok = Value;
    type Error = EncodeError;
    type SerializeSeq = Seq;
    type SerializeTuple = Seq;
    type SerializeTupleStruct = Seq;
    type SerializeTupleVariant = Seq;
    type SerializeMap = Map;
    type SerializeStruct = Map;
    type SerializeStructVariant = Map;

    fn serialize_bool(self, v: bool) -> Encoded {
        Ok(Value::from(v))
    }
    fn serialize_i8(self, v: i8) -> Encoded {
        Ok(Value::from(v))
    }
    fn serialize_i16(self, v: i16) -> Encoded {
        Ok(Value::from(v))
    }
    fn serialize_i32(self, v: i32) -> Encoded {
        Ok(Value::from(v))
    }
    fn serialize_i64(self, v: i64) -> Encoded {
        Ok(Value::from(v))
    }
    fn serialize_i128(self, v: i128) -> Encoded {
        match (i64::try_from(v), u64::try_from(v)) {
            (Ok(n), _) => Ok(Value::from(n)),
            (_, Ok(n)) => Ok(Value::from(n)),
            _ => Err(EncodeError(format!("{v} does not fit in 64 bits"))),
        }
    }
    fn serialize_u8(self, v: u8) -> Encoded {
        Ok(Value::from(v))
    }
    fn serialize_u16(self, v: u16) -> Encoded {
        Ok(Value::from(v))
    }
    fn serialize_u32(self, v: u32) -> Encoded {
        Ok(Value::from(v))
    }
    fn serialize_u64(self, v: u64) -> Encoded {
        Ok(Value::from(v))
    }
    fn serialize_u128(self, v: u128) -> Encoded {
        u64::try_from(v)
            .map(Value::from)
            .map_err(|_| EncodeError(format!("{v} does not fit in 64 bits")))
    }
    fn serialize_f32(self, v: f32) -> Encoded {
        Ok(float(f64::from(v)))
    }
    fn serialize_f64(self, v: f64) -> Encoded {
        Ok(float(v))
    }
    fn serialize_char(self, v: char) -> Encoded {
        Ok(Value::from(v.to_string()))
    }
    fn serialize_str(self, v: &str) -> Encoded {
        Ok(Value::from(v))
    }
    fn serialize_bytes(self, v: &[u8]) -> Encoded {
        Ok(Value::Array(v.iter().map(|b| Value::from(*b)).collect()))
    }
    fn serialize_none(self) -> Encoded {
        Ok(Value::Nil)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Encoded {
        v.serialize(self)
    }
    fn serialize_unit(self) -> Encoded {
        Ok(Value::Nil)
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Encoded {
        Ok(Value::Nil)
    }
    fn serialize_unit_variant(self, _name: &'static str, _i: u32, v: &'static str) -> Encoded {
        Ok(Value::from(v))
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _n: &'static str, v: &T) -> Encoded {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _i: u32,
        name: &'static str,
        v: &T,
    ) -> Encoded {
        Ok(variant(name, v.serialize(self)?))
    }
    fn serialize_seq(self, len: Option<usize>) -> std::result::Result<Seq, EncodeError> {
        Ok(Seq { items: Vec::with_capacity(len.unwrap_or(0)), variant: None })
    }
    fn serialize_tuple(self, len: usize) -> std::result::Result<Seq, EncodeError> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        len: usize,
    ) -> std::result::Result<Seq, EncodeError> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _i: u32,
        name: &'static str,
        len: usize,
    ) -> std::result::Result<Seq, EncodeError> {
        Ok(Seq { items: Vec::with_capacity(len), variant: Some(name) })
    }
    fn serialize_map(self, _len: Option<usize>) -> std::result::Result<Map, EncodeError> {
        Ok(Map::default())
    }
    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> std::result::Result<Map, EncodeError> {
        Ok(Map::default())
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _i: u32,
        name: &'static str,
        _len: usize,
    ) -> std::result::Result<Map, EncodeError> {
        Ok(Map { variant: Some(name), ..Map::default() })
    }
}

struct Seq {
    items: Vec<Value>,
    variant: Option<&'static str>,
}

impl Seq {
    fn push<T: Serialize + ?Sized>(&mut self, v: &T) -> std::result::Result<(), EncodeError> {
        self.items.push(v.serialize(Msgpack)?);
        Ok(())
    }

    fn done(self) -> Encoded {
        let a = Value::Array(self.items);
        Ok(match self.variant {
            Some(name) => variant(name, a),
            None => a,
        })
    }
}

impl ser::SerializeSeq for Seq {
    type Ok = Value;
    type Error = EncodeError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), EncodeError> {
        self.push(v)
    }
    fn end(self) -> Encoded {
        self.done()
    }
}

impl ser::SerializeTuple for Seq {
    type Ok = Value;
    type Error = EncodeError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), EncodeError> {
        self.push(v)
    }
    fn end(self) -> Encoded {
        self.done()
    }
}

impl ser::SerializeTupleStruct for Seq {
    type Ok = Value;
    type Error = EncodeError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), EncodeError> {
        self.push(v)
    }
    fn end(self) -> Encoded {
        self.done()
    }
}

impl ser::SerializeTupleVariant for Seq {
    type Ok = Value;
    type Error = EncodeError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), EncodeError> {
        self.push(v)
    }
    fn end(self) -> Encoded {
        self.done()
    }
}

#[derive(Default)]
struct Map {
    entries: Entries,
    key: Option<String>,
    variant: Option<&'static str>,
}

impl Map {
    fn done(self) -> Encoded {
        let m = self.entries.done();
        Ok(match self.variant {
            Some(name) => variant(name, m),
            None => m,
        })
    }
}

/// A map key as serde_json writes it: a string, or a number or bool as its text.
fn key<T: Serialize + ?Sized>(k: &T) -> std::result::Result<String, EncodeError> {
    match k.serialize(Msgpack)? {
        Value::String(s) => Ok(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        Value::Integer(i) => Ok(i.to_string()),
        Value::Boolean(b) => Ok(b.to_string()),
        other => Err(EncodeError(format!("a map key must be a string, got {other}"))),
    }
}

impl ser::SerializeMap for Map {
    type Ok = Value;
    type Error = EncodeError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, k: &T) -> Result<(), EncodeError> {
        self.key = Some(key(k)?);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), EncodeError> {
        let k = self.key.take().ok_or_else(|| EncodeError("a map value without its key".into()))?;
        self.entries.insert(k, v.serialize(Msgpack)?);
        Ok(())
    }
    fn end(self) -> Encoded {
        self.done()
    }
}

impl ser::SerializeStruct for Map {
    type Ok = Value;
    type Error = EncodeError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        k: &'static str,
        v: &T,
    ) -> Result<(), EncodeError> {
        self.entries.insert(k.to_owned(), v.serialize(Msgpack)?);
        Ok(())
    }
    fn end(self) -> Encoded {
        self.done()
    }
}

impl ser::SerializeStructVariant for Map {
    type Ok = Value;
    type Error = EncodeError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        k: &'static str,
        v: &T,
    ) -> Result<(), EncodeError> {
        self.entries.insert(k.to_owned(), v.serialize(Msgpack)?);
        Ok(())
    }
    fn end(self) -> Encoded {
        self.done()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changes::{Change, Kind, UndoResult};
    use crate::display::Display;
    use crate::result::{Direction, Remote, ShownRange, Truncation};
    use crate::sink::TruncatedBy;
    use proptest::prelude::*;
    use serde_json::Value as J;

    /// What the modes did before this file: a value through `serde_json::Value`, then to rmpv.
    /// Kept here as the oracle the direct encoding is held to, byte for byte.
    fn detour<T: Serialize>(v: &T) -> Value {
        old_json_to_msgpack(&serde_json::to_value(v).unwrap_or_default())
    }

    fn old_json_to_msgpack(v: &J) -> Value {
        match v {
            J::Null => Value::Nil,
            J::Bool(b) => Value::from(*b),
            J::Number(n) => n
                .as_i64()
                .map(Value::from)
                .or_else(|| n.as_u64().map(Value::from))
                .or_else(|| n.as_f64().map(Value::from))
                .unwrap_or(Value::Nil),
            J::String(s) => Value::from(s.as_str()),
            J::Array(a) => Value::Array(a.iter().map(old_json_to_msgpack).collect()),
            J::Object(m) => Value::Map(
                m.iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| (Value::from(k.as_str()), old_json_to_msgpack(v)))
                    .collect(),
            ),
        }
    }

    fn old_style_json(style: &Style) -> J {
        let color = |c: &Color| match c {
            Color::Indexed(i) => json!(i),
            Color::Rgb(r, g, b) => json!(format!("#{r:02x}{g:02x}{b:02x}")),
        };
        let mut m = serde_json::Map::new();
        if let Some(c) = &style.fg {
            m.insert("fg".into(), color(c));
        }
        if let Some(c) = &style.bg {
            m.insert("bg".into(), color(c));
        }
        for (k, v) in [
            ("bold", style.bold),
            ("dim", style.dim),
            ("italic", style.italic),
            ("underline", style.underline),
            ("reverse", style.reverse),
            ("strikethrough", style.strikethrough),
        ] {
            if v {
                m.insert(k.into(), J::Bool(true));
            }
        }
        J::Object(m)
    }

    fn bytes(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, v).unwrap();
        out
    }

    fn same_bytes<T: Serialize>(v: &T) {
        assert_eq!(bytes(&msgpack(v)), bytes(&detour(v)), "{}", serde_json::to_string(v).unwrap());
    }

    /// A result with every field set, nested records and all.
    fn full() -> BashResult {
        BashResult {
            output: "[Command timed out after 2 seconds]\n\nhé\u{1F600}\n\nCommand exited".into(),
            exit_code: Some(-1),
            cancelled: true,
            timed_out: true,
            truncated: true,
            total_lines: u64::MAX,
            total_bytes: 1 << 40,
            output_lines: 3,
            output_bytes: 65,
            artifact_id: Some(7),
            duration_ms: 2001,
            normalized: Some(
                json!({"head": null, "tail": 5, "rewrites": [{"from": "a", "n": -3}]}),
            ),
            shell_restarted: true,
            timeout_clamped_from: Some(0.25),
            waited_ms: Some(12),
            truncation: Some(Truncation {
                direction: Direction::Tail,
                truncated_by: TruncatedBy::Lines,
                shown_range: ShownRange { start: 9001, end: 10000 },
                total_lines: 10000,
                total_bytes: 51200,
                output_lines: 1000,
                output_bytes: 5000,
                artifact_id: Some(7),
                artifact_error: Some("disk full".into()),
                limit_bytes: 51200,
                limit_lines: 2000,
            }),
            text: "hé".into(),
            is_error: true,
            blocked: Some(json!({"rule": "grep", "suggested_tool": "Grep", "message": "m"})),
            rescued: vec![crate::rescue::Rescued { line: 12, text: "error[E0308]".into() }],
            resources: Some(crate::resources::Resources {
                wall_ms: 5,
                cpu_user_ms: Some(1),
                cpu_sys_ms: None,
                max_rss_kib: Some(300),
            }),
            changes: vec![
                Change { path: "src/a.rs".into(), kind: Kind::Modified, overlap: false },
                Change { path: "run.sh".into(), kind: Kind::Mode, overlap: false },
            ],
            changes_count: Some(2),
            changes_id: Some(3),
            changes_unavailable: Some("why".into()),
            changes_indexing: None,
            sandbox: Some("workspace-write"),
            remote: Some(Remote { profile: "box".into(), host: None }),
        }
    }

    #[test]
    fn results_encode_as_the_json_detour_did_byte_for_byte() {
        same_bytes(&full());
        same_bytes(&BashResult::default());
        let nan = BashResult { timeout_clamped_from: Some(f64::NAN), ..Default::default() };
        same_bytes(&nan);
        same_bytes(&Failure::from("Working directory does not exist: /x").result());
        same_bytes(&UndoResult {
            undone: 3,
            output: "Undid run 3 (`rm a`): D a".into(),
            changes_id: Some(4),
            changes: vec![Change { path: "a".into(), kind: Kind::Added, overlap: false }],
            changes_count: 1,
            changes_unavailable: None,
        });
        same_bytes(&super::super::ContextPage {
            messages: vec![super::super::Message { role: "user", content: "Ran `ls`".into() }],
            offset: 0,
            total: 1,
        });
        let rec = crate::session::BashExecution::from_result(
            "ls",
            std::path::Path::new("/tmp"),
            &full(),
            51200,
            false,
        );
        same_bytes(&super::super::HistoryPage { runs: vec![rec], offset: 2, total: 3 });
        same_bytes(&super::super::RunChanges {
            id: 1,
            root: "/p".into(),
            command: "make".into(),
            changes: full().changes,
        });
    }

    #[test]
    fn the_mirrors_result_adds_the_artifact_path_in_its_place() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::artifacts::ArtifactStore::new(dir.path());
        for r in [full(), BashResult::default()] {
            let mut old = serde_json::to_value(&r).unwrap();
            if let Some(id) = r.artifact_id {
                old["artifact_path"] = json!(store.path(id).to_string_lossy());
            }
            assert_eq!(bytes(&mirror_result(&r, &store)), bytes(&old_json_to_msgpack(&old)));
        }
    }

    #[test]
    fn styles_encode_as_the_json_detour_did() {
        let colors = [None, Some(Color::Indexed(1)), Some(Color::Rgb(255, 0, 16))];
        for bits in 0..64u8 {
            for (fg, bg) in [(0, 0), (1, 2), (2, 1), (1, 0), (0, 2)] {
                let s = Style {
                    fg: colors[fg],
                    bg: colors[bg],
                    bold: bits & 1 != 0,
                    dim: bits & 2 != 0,
                    italic: bits & 4 != 0,
                    underline: bits & 8 != 0,
                    reverse: bits & 16 != 0,
                    strikethrough: bits & 32 != 0,
                };
                assert_eq!(bytes(&style(&s)), bytes(&old_json_to_msgpack(&old_style_json(&s))));
            }
        }
        let red = Style { fg: Some(Color::Indexed(1)), ..Style::default() };
        assert_eq!(msgpack_to_json(&style(&red)), json!({"fg": 1}));
    }

    #[test]
    fn card_lines_are_the_selection_when_limited_else_the_last_update() {
        let r = BashResult { text: "a\nb\n".into(), ..Default::default() };
        let mut d = Display::new();
        d.push("live\n", &[]);
        let last = LiveUpdate {
            tail: String::new(),
            total_bytes: 5,
            total_lines: 1,
            lines: d.last(10, ""),
            last: true,
        };
        let shown = |l: Vec<StyledLine>| l.iter().map(StyledLine::shown).collect::<Vec<_>>();
        assert_eq!(shown(card_lines(&r, false, Some(last.clone()))), ["live"]);
        assert_eq!(shown(card_lines(&r, true, Some(last.clone()))), ["a", "b"]);
        let tail = BashResult { normalized: Some(json!({"tail": 2})), ..r.clone() };
        assert_eq!(shown(card_lines(&tail, false, Some(last))), ["a", "b"]);
        assert!(card_lines(&r, false, None).is_empty());
    }

    #[test]
    fn failures_carry_the_conflicts_to_every_wire() {
        let refused = Failure::from(crate::changes::UndoError::Conflict {
            id: 2,
            paths: vec!["a".into()],
            links: vec![],
        });
        assert_eq!(refused.message, "Not undone: this file changed since run 2: a");
        let v = rpc_response(Some(&json!(9)), "undo", Err(refused.clone()));
        assert_eq!(
            v,
            json!({"type": "response", "command": "undo", "id": 9, "success": false,
                "error": refused.message, "data": {"conflicts": ["a"]}})
        );
        let plain = Failure::from(crate::Error::InvalidInput("bad".into()));
        assert_eq!(
            msgpack_to_json(&plain.event(4)),
            json!({"type": "error", "id": 4, "message": "bad"})
        );
        assert_eq!(plain.data(), None);
    }

    proptest! {
        #[test]
        fn any_result_encodes_as_the_json_detour_did(
            output in ".*",
            exit in proptest::option::of(any::<i32>()),
            flags in any::<[bool; 5]>(),
            counts in any::<[u64; 5]>(),
            clamped in proptest::option::of(any::<f64>()),
            path in ".*",
        ) {
            let r = BashResult {
                output,
                exit_code: exit,
                cancelled: flags[0],
                timed_out: flags[1],
                truncated: flags[2],
                shell_restarted: flags[3],
                is_error: flags[4],
                total_lines: counts[0],
                total_bytes: counts[1],
                output_lines: counts[2],
                output_bytes: counts[3],
                duration_ms: counts[4],
                timeout_clamped_from: clamped,
                changes: vec![Change { path, kind: Kind::Deleted, overlap: false }],
                ..Default::default()
            };
            prop_assert_eq!(bytes(&msgpack(&r)), bytes(&detour(&r)));
        }
    }
}
