//! A guard in front of nvim-rs on the msgpack wire (contract §9: bounded memory, bad input answered).
//!
//! nvim-rs ends its loop on the first message it cannot decode (a method name that is not
//! UTF-8, a request with three elements, a stray byte), and buffers a message of any declared
//! size. So every byte from Neovim passes through [`Framer`] first: it finds where each
//! message ends by walking msgpack markers without decoding (memory: one counter per nesting
//! level), keeps at most [`MAX_MESSAGE`] bytes of one, and checks its RPC shape. A good
//! message goes on unchanged; a bad one is replaced by a well-formed one naming the problem:
//! a request becomes a call of [`MALFORMED`] (answered with that error), anything else a
//! [`MALFORMED`] notification (logged and shown to the user).

use rmpv::Value;

/// Largest message accepted from Neovim: requests and notifications carry a command, its
/// options or a few typed keys, answers to our calls a window id or a channel.
pub const MAX_MESSAGE: usize = 16 << 20;
/// Deepest nesting accepted (Neovim's own encoder stops well before).
const MAX_DEPTH: usize = 256;
/// The method name substituted for a malformed message; its only parameter is the reason.
pub const MALFORMED: &str = "__malformed";
/// Bytes of an over-long message kept to read its type and id.
const HEAD: usize = 32;

/// Where the walker is inside the current message.
#[derive(Debug, Default)]
struct Walk {
    /// Values still expected in each open container (the message itself at the bottom).
    open: Vec<u64>,
    /// Payload bytes still to skip (string, binary, extension or number body).
    skip: u64,
    /// A marker whose length field is still arriving: the marker and the length bytes so far.
    header: Option<(u8, Vec<u8>)>,
}

/// Why a message was replaced: the text of the replacement's one parameter.
#[derive(Debug, thiserror::Error)]
pub enum Malformed {
    #[error("invalid msgpack byte 0xc1")]
    InvalidByte,
    #[error("msgpack nested deeper than {} levels", MAX_DEPTH)]
    TooDeep,
    #[error("message of {0} bytes exceeds the {max}-byte limit", max = MAX_MESSAGE)]
    TooLong(usize),
    #[error("undecodable msgpack: {0}")]
    Undecodable(rmpv::decode::Error),
    #[error("an RPC message is an array, got {0}")]
    NotArray(&'static str),
    #[error("request without a valid message id")]
    NoRequestId,
    #[error("request has {0} elements, expected 4")]
    RequestLength(usize),
    #[error("malformed response")]
    Response,
    #[error("notification has {0} elements, expected 3")]
    NotificationLength(usize),
    #[error("unknown RPC message type")]
    UnknownType,
    #[error("method name is not valid UTF-8")]
    MethodNotUtf8,
    #[error("method name must be a string, got {0}")]
    MethodNotString(&'static str),
    #[error("method name missing")]
    MethodMissing,
    #[error("parameters must be an array, got {0}")]
    ParamsNotArray(&'static str),
    #[error("parameters missing")]
    ParamsMissing,
}

/// What the framer made of the input so far.
#[derive(Debug, PartialEq)]
pub enum Frame {
    /// A complete, well-formed message (bytes as received).
    Message(Vec<u8>),
    /// A replacement for a malformed or over-long message (a well-formed message).
    Replaced(Vec<u8>, String),
}

/// Splits a byte stream into checked messages. Feed it chunks; it returns the messages they
/// complete.
#[derive(Debug, Default)]
pub struct Framer {
    walk: Walk,
    /// The current message's bytes (dropped past [`MAX_MESSAGE`]).
    buf: Vec<u8>,
    /// The first [`HEAD`] bytes of the current message.
    head: Vec<u8>,
    /// Bytes of the current message seen so far.
    len: usize,
    /// Inside a run of bytes that start no valid message (reported once per run).
    garbage: bool,
}

impl Framer {
    pub fn new() -> Framer {
        Framer::default()
    }

    /// True while a message has started but not ended (input ending here is truncated).
    pub fn in_message(&self) -> bool {
        self.len > 0
    }

    /// Consumes `data`, returning the frames it completes, in order.
    pub fn feed(&mut self, data: &[u8]) -> Vec<Frame> {
        let mut frames = Vec::new();
        let mut i = 0;
        while i < data.len() {
            let start = i;
            let step = self.step(data, &mut i);
            self.keep(&data[start..i]);
            match step {
                Step::More => {}
                Step::End => {
                    frames.push(self.finish());
                }
                Step::Invalid(reason) => {
                    // Drop what was read of this message and resynchronise on the next byte;
                    // a run of such bytes is reported once.
                    self.reset();
                    if !self.garbage {
                        self.garbage = true;
                        let reason = reason.to_string();
                        frames.push(Frame::Replaced(notification(&reason), reason));
                    }
                }
            }
        }
        frames
    }

    fn keep(&mut self, bytes: &[u8]) {
        if self.head.len() < HEAD {
            let n = (HEAD - self.head.len()).min(bytes.len());
            self.head.extend_from_slice(&bytes[..n]);
        }
        self.len += bytes.len();
        if self.len <= MAX_MESSAGE {
            self.buf.extend_from_slice(bytes);
        } else if !self.buf.is_empty() {
            self.buf = Vec::new();
        }
    }

    fn reset(&mut self) {
        self.walk = Walk::default();
        self.buf.clear();
        self.head.clear();
        self.len = 0;
    }

    fn finish(&mut self) -> Frame {
        self.garbage = false;
        let frame = if self.len > MAX_MESSAGE {
            replacement(sniff_request_id(&self.head), Malformed::TooLong(self.len))
        } else {
            check(std::mem::take(&mut self.buf))
        };
        self.reset();
        frame
    }

    /// Advances through `data` from `*i` until the message ends, the data ends, or a byte is
    /// invalid.
    fn step(&mut self, data: &[u8], i: &mut usize) -> Step {
        while *i < data.len() {
            if self.walk.skip > 0 {
                let n = self.walk.skip.min((data.len() - *i) as u64);
                self.walk.skip -= n;
                *i += n as usize;
                if self.walk.skip == 0 && self.value_done() {
                    return Step::End;
                }
                continue;
            }
            if let Some((marker, mut bytes)) = self.walk.header.take() {
                let need = length_bytes(marker);
                let n = (need - bytes.len()).min(data.len() - *i);
                bytes.extend_from_slice(&data[*i..*i + n]);
                *i += n;
                if bytes.len() < need {
                    self.walk.header = Some((marker, bytes));
                    return Step::More;
                }
                let len = bytes.iter().fold(0u64, |acc, b| acc << 8 | u64::from(*b));
                match self.sized(marker, len) {
                    Ok(true) => return Step::End,
                    Ok(false) => continue,
                    Err(e) => return Step::Invalid(e),
                }
            }
            let marker = data[*i];
            *i += 1;
            if self.walk.open.is_empty() {
                self.walk.open.push(1);
            }
            let done = match marker {
                0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => Ok(self.value_done()),
                0x80..=0x8f => self.container(u64::from(marker & 0x0f) * 2),
                0x90..=0x9f => self.container(u64::from(marker & 0x0f)),
                0xa0..=0xbf => Ok(self.payload(u64::from(marker & 0x1f))),
                0xca => Ok(self.payload(4)),
                0xcb => Ok(self.payload(8)),
                0xcc | 0xd0 => Ok(self.payload(1)),
                0xcd | 0xd1 => Ok(self.payload(2)),
                0xce | 0xd2 => Ok(self.payload(4)),
                0xcf | 0xd3 => Ok(self.payload(8)),
                0xd4 => Ok(self.payload(2)),
                0xd5 => Ok(self.payload(3)),
                0xd6 => Ok(self.payload(5)),
                0xd7 => Ok(self.payload(9)),
                0xd8 => Ok(self.payload(17)),
                0xc4..=0xc9 | 0xd9..=0xdf => {
                    self.walk.header = Some((marker, Vec::with_capacity(4)));
                    Ok(false)
                }
                0xc1 => Err(Malformed::InvalidByte),
            };
            match done {
                Ok(true) => return Step::End,
                Ok(false) => {}
                Err(e) => return Step::Invalid(e),
            }
        }
        Step::More
    }

    /// A marker with a length field, once the length is known; true when the message ended.
    fn sized(&mut self, marker: u8, len: u64) -> Result<bool, Malformed> {
        match marker {
            0xc4..=0xc6 | 0xd9..=0xdb => Ok(self.payload(len)),
            0xc7..=0xc9 => Ok(self.payload(len + 1)), // the extension's type byte
            0xdc | 0xdd => self.container(len),
            _ => self.container(len.saturating_mul(2)), // maps: keys and values
        }
    }

    fn payload(&mut self, n: u64) -> bool {
        if n == 0 {
            return self.value_done();
        }
        self.walk.skip = n;
        false
    }

    fn container(&mut self, items: u64) -> Result<bool, Malformed> {
        if items == 0 {
            return Ok(self.value_done());
        }
        if self.walk.open.len() >= MAX_DEPTH {
            return Err(Malformed::TooDeep);
        }
        self.walk.open.push(items);
        Ok(false)
    }

    /// One value is complete; true when that completes the message.
    fn value_done(&mut self) -> bool {
        while let Some(top) = self.walk.open.last_mut() {
            *top -= 1;
            if *top > 0 {
                return false;
            }
            self.walk.open.pop();
        }
        true
    }
}

enum Step {
    More,
    End,
    Invalid(Malformed),
}

fn length_bytes(marker: u8) -> usize {
    match marker {
        0xc4 | 0xc7 | 0xd9 => 1,
        0xc5 | 0xc8 | 0xda | 0xdc | 0xde => 2,
        _ => 4,
    }
}

/// Checks a complete message's RPC shape (`[0, id, method, params]`, `[1, id, error, result]`,
/// `[2, method, params]`).
pub fn check(bytes: Vec<u8>) -> Frame {
    let value = match rmpv::decode::read_value(&mut bytes.as_slice()) {
        Ok(v) => v,
        Err(e) => {
            let reason = Malformed::Undecodable(e).to_string();
            return Frame::Replaced(notification(&reason), reason);
        }
    };
    match shape(&value) {
        Ok(()) => Frame::Message(bytes),
        Err((id, reason)) => replacement(id, reason),
    }
}

fn shape(v: &Value) -> Result<(), (Option<u64>, Malformed)> {
    let Value::Array(items) = v else {
        return Err((None, Malformed::NotArray(kind(v))));
    };
    let kind_of = items.first().and_then(Value::as_u64);
    let id = || items.get(1).and_then(Value::as_u64).filter(|id| *id <= u64::from(u32::MAX));
    let method = |at: usize| -> Result<(), Malformed> {
        match items.get(at) {
            Some(Value::String(s)) if s.as_str().is_some() => Ok(()),
            Some(Value::String(_)) => Err(Malformed::MethodNotUtf8),
            Some(other) => Err(Malformed::MethodNotString(kind(other))),
            None => Err(Malformed::MethodMissing),
        }
    };
    let params = |at: usize| -> Result<(), Malformed> {
        match items.get(at) {
            Some(Value::Array(_)) => Ok(()),
            Some(other) => Err(Malformed::ParamsNotArray(kind(other))),
            None => Err(Malformed::ParamsMissing),
        }
    };
    match kind_of {
        Some(0) => {
            let Some(id) = id() else {
                return Err((None, Malformed::NoRequestId));
            };
            if items.len() != 4 {
                return Err((Some(id), Malformed::RequestLength(items.len())));
            }
            method(2).and_then(|()| params(3)).map_err(|e| (Some(id), e))
        }
        Some(1) => match (id(), items.len()) {
            (Some(_), 4) => Ok(()),
            _ => Err((None, Malformed::Response)),
        },
        Some(2) => {
            if items.len() != 3 {
                return Err((None, Malformed::NotificationLength(items.len())));
            }
            method(1).and_then(|()| params(2)).map_err(|e| (None, e))
        }
        _ => Err((None, Malformed::UnknownType)),
    }
}

pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Nil => "nil",
        Value::Boolean(_) => "a boolean",
        Value::Integer(_) => "an integer",
        Value::F32(_) | Value::F64(_) => "a float",
        Value::String(_) => "a string",
        Value::Binary(_) => "binary data",
        Value::Array(_) => "an array",
        Value::Map(_) => "a map",
        Value::Ext(..) => "an extension",
    }
}

/// A request (answered with `reason`) when the id is known, else a notification.
fn replacement(id: Option<u64>, reason: Malformed) -> Frame {
    let reason = reason.to_string();
    let msg = match id {
        Some(id) => encode(Value::Array(vec![
            Value::from(0),
            Value::from(id),
            Value::from(MALFORMED),
            Value::Array(vec![Value::from(reason.as_str())]),
        ])),
        None => notification(&reason),
    };
    Frame::Replaced(msg, reason)
}

fn notification(reason: &str) -> Vec<u8> {
    encode(Value::Array(vec![
        Value::from(2),
        Value::from(MALFORMED),
        Value::Array(vec![Value::from(reason)]),
    ]))
}

fn encode(v: Value) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing to a Vec cannot fail.
    let _ = rmpv::encode::write_value(&mut out, &v);
    out
}

/// The id of a request from the first bytes of its message: `[0, id, …` with the array header
/// and a non-negative integer id.
fn sniff_request_id(head: &[u8]) -> Option<u64> {
    let rest = match head.first()? {
        0x90..=0x9f => &head[1..],
        0xdc => head.get(3..)?,
        0xdd => head.get(5..)?,
        _ => return None,
    };
    if *rest.first()? != 0 {
        return None;
    }
    let be =
        |n: usize| rest.get(2..2 + n).map(|b| b.iter().fold(0u64, |a, x| a << 8 | u64::from(*x)));
    match *rest.get(1)? {
        b @ 0x00..=0x7f => Some(u64::from(b)),
        0xcc => be(1),
        0xcd => be(2),
        0xce => be(4),
        0xcf => be(8),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(v: Value) -> Vec<u8> {
        encode(v)
    }

    fn req(id: u64, method: &str) -> Value {
        Value::Array(vec![0.into(), id.into(), method.into(), Value::Array(vec![])])
    }

    #[test]
    fn frame_splits_messages_byte_by_byte() {
        let mut all = enc(req(1, "ping"));
        all.extend(enc(req(2, "hello")));
        let mut f = Framer::new();
        let mut got = Vec::new();
        for b in &all {
            got.extend(f.feed(std::slice::from_ref(b)));
        }
        assert_eq!(
            got,
            vec![Frame::Message(enc(req(1, "ping"))), Frame::Message(enc(req(2, "hello")))]
        );
        assert!(!f.in_message());
    }

    #[test]
    fn frame_replaces_bad_shapes() {
        let mut f = Framer::new();
        let short = enc(Value::Array(vec![0.into(), 7.into(), "ping".into()]));
        let got = f.feed(&short);
        let Frame::Replaced(bytes, reason) = &got[0] else { panic!("{got:?}") };
        assert_eq!(reason, "request has 3 elements, expected 4");
        let v = rmpv::decode::read_value(&mut bytes.as_slice()).unwrap();
        assert_eq!(v[1].as_u64(), Some(7));
        assert_eq!(v[2].as_str(), Some(MALFORMED));
        // [0, 8, <str 0xff 0x41>, []]
        let bad_name = [0x94, 0x00, 0x08, 0xa2, 0xff, 0x41, 0x90];
        let got = f.feed(&bad_name);
        assert!(matches!(&got[0], Frame::Replaced(_, r) if r == "method name is not valid UTF-8"));
        let got = f.feed(&[0xc1, 0xc1, 0xc1]);
        assert_eq!(got.len(), 1, "one report per run of garbage");
        let got = f.feed(&enc(req(3, "ping")));
        assert_eq!(got, vec![Frame::Message(enc(req(3, "ping")))]);
    }

    #[test]
    fn frame_oversized_message_dropped_in_bounded_memory() {
        let mut f = Framer::new();
        // [0, 300, "ping", [<str32 of MAX_MESSAGE + 1 bytes>]]
        let mut head = vec![0x94, 0x00, 0xcd, 0x01, 0x2c, 0xa4];
        head.extend_from_slice(b"ping");
        head.push(0x91);
        head.push(0xdb);
        head.extend_from_slice(&((MAX_MESSAGE as u32) + 1).to_be_bytes());
        assert!(f.feed(&head).is_empty());
        let chunk = vec![b'x'; 1 << 20];
        for _ in 0..16 {
            assert!(f.feed(&chunk).is_empty());
        }
        assert!(f.buf.capacity() <= MAX_MESSAGE * 2);
        let got = f.feed(b"x");
        let Frame::Replaced(bytes, reason) = &got[0] else { panic!("{got:?}") };
        assert!(reason.contains("exceeds"), "{reason}");
        let v = rmpv::decode::read_value(&mut bytes.as_slice()).unwrap();
        assert_eq!(v[1].as_u64(), Some(300));
        assert!(f.buf.capacity() == 0 || f.buf.is_empty());
    }
}
