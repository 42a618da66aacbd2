//! `make fuzz`: a bounded fuzzing campaign that runs on stable Rust.
//!
//! Coverage-less but input-aware: each target builds inputs from a seeded RNG (splitmix64) out of
//! a dictionary of fragments that matter to it (quotes, operators, escape sequences, msgpack
//! markers, JSON keys) mixed with random bytes, and checks properties, not only the absence of
//! panics: the sanitizer and the msgpack framer give the same result whatever the chunking, the
//! scanner's tokens are ordered char-boundary ranges, normalization keeps a prefix of the
//! command, the sink's counters match what was pushed and its text fits its limits.
//!
//! `FUZZ_INPUTS` inputs per target (default 20 000, the short campaign `cargo test` runs),
//! `FUZZ_SEED` (default fixed, so a run is reproducible), `FUZZ_TARGET` (substring filter).
//! A failure prints the target, seed, input index and the input as a Rust literal: add it to
//! [`REGRESSIONS`] and fix the code.

// A test program (no libtest harness, so clippy does not see `cfg(test)`): a failed `expect` here
// is a finding, caught and reported with its input.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use agent_bash::mode::{frame, nvim, rpc};
use agent_bash::shell::Origin;
use agent_bash::{intercept, normalize, sanitize, shellwords, sink};

/// Inputs that once failed (target, bytes): run first, every time.
const REGRESSIONS: &[(&str, &[u8])] = &[];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// Up to `max` pieces: dictionary fragments, random bytes, random ASCII.
    fn bytes(&mut self, dict: &[&[u8]], max: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for _ in 0..self.below(max) + 1 {
            match self.below(10) {
                0 => out.push(self.next() as u8),
                1 => out.push(b' ' + self.below(95) as u8),
                2 => out.extend_from_slice("é€😀\u{fffd}".as_bytes()),
                _ => out.extend_from_slice(dict[self.below(dict.len())]),
            }
        }
        // Now and then, damage it: cut it short or flip a byte.
        if !out.is_empty() && self.chance(10) {
            let at = self.below(out.len());
            out.truncate(at);
        }
        if !out.is_empty() && self.chance(10) {
            let at = self.below(out.len());
            out[at] ^= 1 << self.below(8);
        }
        out
    }
}

const SHELL: &[&[u8]] = &[
    b"echo hi",
    b"cat file",
    b" | head",
    b" | head -n 5",
    b" | head -5",
    b" | tail -n 3",
    b" | tail -3",
    b"| tail -n +2",
    b" 2>&1",
    b" |& head -1",
    b"; ",
    b" && ",
    b" || ",
    b" & ",
    b"\n",
    b"\\\n",
    b"'",
    b"\"",
    b"\\",
    b"$(",
    b")",
    b"`",
    b"${x",
    b"}",
    b"<<EOF\n",
    b"\nEOF\n",
    b"<<-'X'\n",
    b"# comment",
    b"case x in a) ;; esac",
    b"(",
    b"grep -r foo .",
    b"rg x",
    b"find . -name '*.rs'",
    b"sed -n 1p f",
    b"head -c 10 f",
    b"tail -f log",
    b"sudo ",
    b"env A=1 ",
    b"command ",
    b"nice -n 5 ",
    b"timeout 5 ",
    b"xargs ",
    b"> out",
    b"2>/dev/null",
    b"<<< x",
    b"&>",
    b"1>&2",
    b"$((1+2))",
    b"<(ls)",
    b" -n ",
    b"-",
    b"0",
    b"99999999999999999999",
];

const ANSI: &[&[u8]] = &[
    b"\x1b[31m",
    b"\x1b[0m",
    b"\x1b[1;4;38;2;255;128;0m",
    b"\x1b[48;5;200m",
    b"\x1b[38;5;",
    b"\x1b[",
    b"\x1b]0;title\x07",
    b"\x1b]8;;http://x\x1b\\",
    b"\x1bP1$r\x1b\\",
    b"\x1b_apc\x1b\\",
    b"\x1b(B",
    b"\x1b",
    b"\r",
    b"\r\n",
    b"\n",
    b"\t",
    b"\x08",
    b"\x7f",
    b"\xc2\x9b",
    b"\xe2\x82",
    b"\xac",
    b"\xf0\x9f",
    b"\x98\x80",
    b"\xff",
    b"10%\r55%\r100%\n",
    b"line\n",
    b"\x00",
    b"\x1b[?25l",
    b"\x1b[2K",
    b"\x1b[1A",
    b"\x9b31m",
];

const JSON: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    br#""id":"#,
    br#""type":"#,
    br#""bash""#,
    br#""tool_call""#,
    br#""abort_bash""#,
    br#""get_context""#,
    br#""history""#,
    br#""command":"#,
    br#""echo hi""#,
    br#""timeout":"#,
    br#""cwd":"#,
    br#""head":"#,
    br#""tail":"#,
    br#""tools":"#,
    br#""pty":"#,
    br#""session_key":"#,
    br#""offset":"#,
    br#""limit":"#,
    br#""target":"#,
    b"1",
    b"-1",
    b"1e999",
    b"0.5",
    b"null",
    b"true",
    b"false",
    br#""\u0000""#,
    br#""\ud800""#,
    br#""x"#,
    b"\"",
    b"\\",
    br#"{"id":"r1","type":"bash","command":"echo hi"}"#,
    br#"["read","bash"]"#,
    b"18446744073709551616",
];

const MSGPACK: &[&[u8]] = &[
    b"\x94",
    b"\x93",
    b"\x92",
    b"\x90",
    b"\x80",
    b"\x81",
    b"\x82",
    b"\x00",
    b"\x01",
    b"\x02",
    b"\x7f",
    b"\xcc\xff",
    b"\xcd\x01\x00",
    b"\xce\x00\x01\x00\x00",
    b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff",
    b"\xd0\x80",
    b"\xca\x7f\xc0\x00\x00",
    b"\xcb\x7f\xf8\0\0\0\0\0\0",
    b"\xc0",
    b"\xc2",
    b"\xc3",
    b"\xc1",
    b"\xa4ping",
    b"\xa3run",
    b"\xa6cancel",
    b"\xa9pty_input",
    b"\xa2id",
    b"\xa7command",
    b"\xa7timeout",
    b"\xa4head",
    b"\xa6origin",
    b"\xa4tool",
    b"\xa3url",
    b"\xa4data",
    b"\xa2\xff\xfe",
    b"\xd9\x03abc",
    b"\xda\x00\x02hi",
    b"\xdb\x00\x00\x00\x01x",
    b"\xc4\x02\x00\x01",
    b"\xc7\x01\x05x",
    b"\xd4\x01x",
    b"\xd8\x00",
    b"\xdc\x00\x02",
    b"\xdd\x00\x00\x00\x01",
    b"\xde\x00\x01",
    b"\xdf\x00\x00\x00\x00",
    b"\xdd\xff\xff\xff\xff",
    b"\xdb\xff\xff\xff\xff",
    b"\x94\x00\x01\xa4ping\x90",
    b"\x93\x02\xa6cancel\x91\x81\xa2id\x05",
];

type Target = fn(&[u8]);
type Gen = fn(&mut Rng) -> Vec<u8>;

fn targets() -> Vec<(&'static str, Gen, Target)> {
    vec![
        ("normalize", |r| r.bytes(SHELL, 12), check_normalize),
        ("intercept", |r| r.bytes(SHELL, 12), check_intercept),
        ("shellwords", |r| r.bytes(SHELL, 16), check_shellwords),
        ("sanitize_sink", |r| r.bytes(ANSI, 40), check_sanitize_sink),
        ("rpc_json", |r| r.bytes(JSON, 24), check_rpc_json),
        ("nvim_msgpack", gen_msgpack, check_nvim_msgpack),
    ]
}

/// The first bytes of an input steer the options (head, tail, limits, chunk sizes), the rest is
/// the text.
fn split_opts(input: &[u8]) -> ([u8; 4], &[u8]) {
    let mut o = [0u8; 4];
    let n = input.len().min(4);
    o[..n].copy_from_slice(&input[..n]);
    (o, &input[n..])
}

fn opt(b: u8) -> Option<usize> {
    (b & 0x80 != 0).then_some(usize::from(b & 0x0f))
}

fn check_normalize(input: &[u8]) {
    let (o, rest) = split_opts(input);
    let cmd = String::from_utf8_lossy(rest);
    let n = normalize::normalize(&cmd, opt(o[0]), opt(o[1]));
    assert!(
        cmd.trim().starts_with(&n.command),
        "normalized {:?} is not a prefix of {cmd:?}",
        n.command
    );
    let shown = normalize::apply_head_tail(&cmd, opt(o[2]), opt(o[3]));
    assert!(shown.len() <= cmd.len() + 1, "head/tail grew the text");
}

fn check_intercept(input: &[u8]) {
    static DEFAULTS: std::sync::OnceLock<intercept::Interceptor> = std::sync::OnceLock::new();
    let cmd = String::from_utf8_lossy(input);
    let i = DEFAULTS.get_or_init(|| {
        intercept::Interceptor::new(&intercept::InterceptorSettings { enabled: true, rules: None })
    });
    let tools = vec!["read".to_string(), "grep".to_string(), "find".to_string()];
    if let Some(block) = i.check(&cmd, Some(&tools)) {
        assert!(block.message.ends_with(&format!("Original command: {cmd}")), "{block:?}");
    }
    let _ = i.check(&cmd, None);
    for part in intercept::simple_commands(&cmd) {
        assert!(cmd.contains(part), "{part:?} not in {cmd:?}");
    }
}

fn check_shellwords(input: &[u8]) {
    let src = String::from_utf8_lossy(input);
    let mut last = 0;
    for t in shellwords::tokenize(&src) {
        assert!(t.start >= last && t.start <= t.end && t.end <= src.len(), "{t:?} in {src:?}");
        let _ = t.text(&src); // panics off a char boundary
        last = t.end;
    }
    for c in shellwords::simple_commands(&src) {
        assert!(src.contains(c.text()));
        let _ = c.argv();
        let _ = c.redirects();
        let w = c.without_wrappers();
        assert!(c.text().contains(w.text()), "{:?} / {:?}", c.text(), w.text());
    }
}

fn check_sanitize_sink(input: &[u8]) {
    let (o, bytes) = split_opts(input);
    let whole = sanitize::sanitize(bytes);
    // Chunked at input-chosen points: the same text (the stripper is stateful, contract §4.1).
    let mut s = sanitize::Sanitizer::new();
    let mut chunked = String::new();
    let step = usize::from(o[0] % 7) + 1;
    for piece in bytes.chunks(step) {
        s.push(piece, &mut chunked);
    }
    s.finish(&mut chunked);
    assert_eq!(whole, chunked, "chunking by {step} changed the text of {bytes:?}");
    assert!(
        !whole.chars().any(|c| (c.is_control() && c != '\n' && c != '\t') || c == '\u{1b}'),
        "control characters left in {whole:?}"
    );
    // Styled output carries the same text, and spans inside it.
    let mut st = sanitize::Sanitizer::new();
    let (mut text, mut spans) = (String::new(), Vec::new());
    st.push_styled(bytes, &mut text, &mut spans);
    st.finish_styled(&mut text, &mut spans);
    assert_eq!(text, whole);
    for sp in &spans {
        assert!(sp.start <= sp.end && sp.end <= text.len(), "{sp:?} outside {} bytes", text.len());
    }
    // The sink over that text: counters exact, window within its limits.
    let config = sink::SinkConfig {
        max_bytes: usize::from(o[1]) % 64 + 1,
        max_lines: usize::from(o[2] % 8),
        head: opt(o[3]),
        tail: opt(o[0]),
        ..sink::SinkConfig::default()
    };
    let (max_bytes, max_lines) = (config.max_bytes.max(4), config.max_lines.max(1));
    let mut k = sink::Sink::new(config, None);
    let mut rest = whole.as_str();
    while !rest.is_empty() {
        let mut cut = (step * 3).min(rest.len());
        while !rest.is_char_boundary(cut) {
            cut += 1;
        }
        k.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    let out = k.finish();
    assert_eq!(out.total_bytes, whole.len() as u64);
    assert!(out.text.len() <= max_bytes.max(4), "{} > {max_bytes}", out.text.len());
    assert!(out.output_lines as usize <= max_lines, "{} lines > {max_lines}", out.output_lines);
    assert_eq!(out.output_bytes, out.text.len() as u64);
}

fn check_rpc_json(input: &[u8]) {
    let line = String::from_utf8_lossy(input);
    match rpc::decode_line(&line) {
        Ok((_, kind, obj)) => {
            if kind == "bash" || kind == "tool_call" {
                let _ = agent_bash::mode::request_from(&obj, Origin::Tool);
            }
            let _ = agent_bash::mode::page_args(&obj);
        }
        Err(e) => {
            assert_eq!(e["success"], false);
            assert!(e["error"]
                .as_str()
                .is_some_and(|s| s.starts_with("Failed to parse command: ")));
        }
    }
}

/// Msgpack inputs: raw fragments, or a structured request (random parameters) that is then
/// perhaps damaged.
fn gen_msgpack(r: &mut Rng) -> Vec<u8> {
    if r.chance(50) {
        return r.bytes(MSGPACK, 16);
    }
    let v = rmpv::Value::Array(vec![
        rmpv::Value::from(*r.pick(&[0u64, 0, 2, 1, 7])),
        rmpv::Value::from(r.below(1000) as u64),
        rmpv::Value::from(*r.pick(&["run", "ping", "artifact_path", "history", "pty_input"])),
        rmpv::Value::Array(vec![value(r, 3)]),
    ]);
    let mut out = Vec::new();
    let _ = rmpv::encode::write_value(&mut out, &v);
    if r.chance(30) && !out.is_empty() {
        let at = r.below(out.len());
        out[at] = r.next() as u8;
    }
    if r.chance(20) {
        out.truncate(r.below(out.len() + 1));
    }
    out
}

fn value(r: &mut Rng, depth: u32) -> rmpv::Value {
    use rmpv::Value as V;
    let keys = [
        "id",
        "command",
        "timeout",
        "head",
        "tail",
        "cwd",
        "tools",
        "origin",
        "pty",
        "url",
        "offset",
        "limit",
        "data",
        "session_key",
    ];
    match r.below(if depth == 0 { 7 } else { 9 }) {
        0 => V::Nil,
        1 => V::from(r.chance(50)),
        2 => V::from(r.next() as i64 >> r.below(64)),
        3 => V::F64(f64::from_bits(r.next())),
        4 => V::from(String::from_utf8_lossy(&r.bytes(SHELL, 3)).as_ref()),
        5 => raw_str(&r.bytes(ANSI, 3)),
        6 => V::Binary(r.bytes(ANSI, 2)),
        7 => V::Array((0..r.below(4)).map(|_| value(r, depth - 1)).collect()),
        _ => V::Map(
            (0..r.below(6)).map(|_| (V::from(*r.pick(&keys)), value(r, depth - 1))).collect(),
        ),
    }
}

/// A msgpack string holding any bytes (valid UTF-8 or not), as a decoder would produce it.
fn raw_str(bytes: &[u8]) -> rmpv::Value {
    let mut enc = vec![0xdb];
    enc.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    enc.extend_from_slice(bytes);
    rmpv::decode::read_value(&mut enc.as_slice()).unwrap_or(rmpv::Value::Nil)
}

fn check_nvim_msgpack(input: &[u8]) {
    let mut whole = frame::Framer::new();
    let frames = whole.feed(input);
    // Chunking does not change the frames.
    let mut chunked = frame::Framer::new();
    let step = input.first().map_or(1, |b| usize::from(b % 5) + 1);
    let mut again = Vec::new();
    for piece in input.chunks(step) {
        again.extend(chunked.feed(piece));
    }
    assert_eq!(frames, again, "chunking by {step} changed the frames");
    for f in frames {
        let bytes = match f {
            frame::Frame::Message(b) | frame::Frame::Replaced(b, _) => b,
        };
        // Whatever nvim-rs receives is a well-formed RPC message.
        let v = rmpv::decode::read_value(&mut bytes.as_slice()).expect("frames decode");
        let items = v.as_array().expect("frames are arrays");
        let params = match items[0].as_u64() {
            Some(0) => items[3].as_array().expect("request params"),
            Some(2) => items[2].as_array().expect("notification params"),
            Some(1) => continue,
            other => panic!("frame of type {other:?}"),
        };
        if let Ok(obj) = nvim::params(params, &[]) {
            let _ = agent_bash::mode::request_from(&obj, Origin::Tool);
            let _ = agent_bash::mode::page_args(&obj);
        }
    }
}

fn literal(bytes: &[u8]) -> String {
    format!("b\"{}\"", bytes.escape_ascii())
}

fn main() {
    let inputs: u64 =
        std::env::var("FUZZ_INPUTS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let seed: u64 = std::env::var("FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x5eed);
    let only = std::env::var("FUZZ_TARGET").unwrap_or_default();
    // Our own report on failure; silence the default hook's per-panic noise.
    std::panic::set_hook(Box::new(|_| {}));
    let mut failed = false;
    for (name, gen, check) in targets() {
        if !name.contains(&only) {
            continue;
        }
        for (target, input) in REGRESSIONS {
            if *target == name {
                if let Err(e) = catch_unwind(|| check(input)) {
                    println!(
                        "{name}: regression {} fails again: {}",
                        literal(input),
                        panic_text(&e)
                    );
                    failed = true;
                }
            }
        }
        let mut rng = Rng(seed ^ fxhash(name));
        let t = Instant::now();
        let mut bytes = 0u64;
        let mut ran = 0u64;
        for i in 0..inputs {
            ran += 1;
            let input = gen(&mut rng);
            bytes += input.len() as u64;
            if let Err(e) = catch_unwind(AssertUnwindSafe(|| check(&input))) {
                println!(
                    "{name}: input {i} (FUZZ_SEED={seed}) failed: {}\n  input: {}",
                    panic_text(&e),
                    literal(&input)
                );
                failed = true;
                break;
            }
        }
        let secs = t.elapsed().as_secs_f64();
        println!(
            "fuzz {name:<14} {ran:>9} inputs {:>7.1} MB in {secs:>6.1} s ({:.0} inputs/s)",
            bytes as f64 / 1e6,
            ran as f64 / secs.max(1e-9)
        );
    }
    if failed {
        std::process::exit(1);
    }
}

fn fxhash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

fn panic_text(e: &Box<dyn std::any::Any + Send>) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic".to_string())
}
