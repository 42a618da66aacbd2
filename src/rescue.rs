//! contract §7 (Ours, rescued lines): the diagnostics of the part of the output that leaves the
//! tail window, kept with their line numbers so the model reads the first error even when a
//! build kept going for thousands of lines after it.
//!
//! [`Rescue`] sits beside the sink's window and sees every chunk of sanitized text once. It is
//! streaming and bounded:
//!
//! - one pass over each chunk ([`scan`]) counts its newlines for the sink and, in the same
//!   loads, looks for a *filter pair* of every trigger word (`rror`, `FAIL`, `' panicked at`,
//!   `Traceback`, …; [`TRIGGERS`]): two adjacent bytes, tested 32 at a time with nibble lookups
//!   (AVX2) where the processor has them. Only where a pair shows up is the whole word checked,
//!   and only lines holding a word are classified, so plain output costs the sink's own newline
//!   count and little more, and no per-line work;
//! - a classifier ([`classify`]) decides with strict, tool-shaped rules (a line *starting* with
//!   `error:` or `error[E…]`, `file:line:col: error`, `FAILED`, `npm ERR!`, `make: ***`, …);
//!   every rule needs a trigger word, so the result does not depend on chunking, and a line
//!   that merely has "error" inside a word (`error_handling.rs`, `-Werror`, `0 errors`) is not
//!   a diagnostic: false positives cost the model more than misses;
//! - a few rules need the next lines (a Python traceback's last frame and exception line, the
//!   ` --> file:line` after a rustc error): while one is open, lines are read one by one;
//! - the first [`MAX_LINES`] candidates are kept, and after them the most recent ones in a
//!   ring: memory is constant whatever the output size. Which of them the window cut off is
//!   known at the end, from the first shown line.
//!
//! The sink gives it every chunk and takes the newline count from it (the count it would make
//! anyway), so the rescue adds no pass of its own over the output. Line numbers are counted only
//! for the lines kept: a flagged block knows the newlines before it.
//!
//! At the end, [`Rescue::finish`] picks from the first and the most recent candidates (alternating,
//! so both ends are shown) within [`MAX_LINES`] lines and [`MAX_BYTES`] bytes, drops lines the
//! shown text already holds, and returns them in output order.
//!
//! Line numbers are those of the full output, which are those of the artifact as long as it was
//! not capped (contract §4.2: past its cap an artifact keeps its first part and its last 4 MiB):
//! lines past the part a capped artifact keeps verbatim are not rescued, since no exact line
//! number could point at them.

use std::collections::{HashSet, VecDeque};
use std::sync::OnceLock;

use aho_corasick::{AhoCorasick, Input, MatchKind};
use serde::Serialize;

/// At most this many rescued lines (contract §7).
pub const MAX_LINES: usize = 20;
/// At most this many bytes of rescued text, counting the `<line no>: ` prefixes (contract §7).
pub const MAX_BYTES: usize = 4096;
/// Bytes of one line kept for the model; a longer line ends with `…`.
const LINE_TEXT_MAX: usize = 300;
/// Bytes of a line that the classifier looks at (diagnostics say what they are early).
const SCAN_MAX: usize = 1024;
/// The most recent candidates kept. Which of them the window cut off is known only at the end,
/// so the ring is larger than what is shown: with this many diagnostics inside the window
/// itself, the model has plenty to read there.
const RECENT_MAX: usize = 256;
/// A traceback longer than this many lines is not followed to its end.
const TRACEBACK_MAX_LINES: u32 = 2000;

/// Words that every rule needs, each with the offset of its *filter pair* (two adjacent bytes
/// of it, chosen rare in ordinary output; see [`PAIR_BUCKETS`]). A line holding none of the words
/// is never a diagnostic, so only lines holding one are classified. `\nE  ` is pytest's failure
/// line (`E   assert 1 == 2`), which has no other mark. Every rule that wants a lower-case
/// `error` / `Error` wants it ending a word (`error:`, `error[E…]`, `ValueError:`,
/// `  3:5  error  …`, `f.c:1: error` at the end), so `rror` is a trigger only before a colon, a
/// bracket, a blank or the end of the line: test logs full of `error_handling` / `errors.rs`
/// cost no classification. `ERR` covers `ERROR`; `fatal error` is an `rror`, so `fatal` needs
/// only its colon form; a Rust panic is `' panicked at`, a Go one `panic: `. A line longer than
/// [`SCAN_MAX`] is looked at without the word its cut ends in ([`scan_text`]), so no rule
/// mistakes the cut for the end of a word.
const TRIGGERS: &[(&str, usize)] = &[
    ("rror:", 0),
    ("rror ", 0),
    ("rror[", 0),
    ("rror\t", 0),
    ("rror\n", 0),
    ("FAIL", 0),
    ("Failed", 0),
    ("' panicked at", 0),
    ("panic: ", 4),
    ("Traceback", 0),
    ("ERR", 1),
    ("fatal:", 4),
    ("Exception", 1),
    ("\nE  ", 0),
    (".go:", 0),
    ("\u{25cf} ", 1),
    ("***", 0),
    ("unbound variable", 1),
    ("command not found", 2),
    ("No such file or directory", 0),
    ("Permission denied", 0),
    ("Assertion", 0),
];

// [`trigger_index`] has one bit per trigger word.
const _: () = assert!(TRIGGERS.len() <= 32);

/// The filter pairs of [`TRIGGERS`] in eight buckets, one bit each of [`scan`]'s per-byte mask.
/// The SIMD search matches a byte by its two nibbles, so a bucket also matches the pairs mixing
/// its members' nibbles (`FA`, `Fa` and `.g` also match `.a`, `Na`): the grouping keeps those
/// mixes rare (measured on this repository's sources and docs, Debian's changelogs and logs).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const PAIR_BUCKETS: [&[&[u8; 2]]; 8] = [
    &[b"rr", b"RR"],
    &[b"FA", b"Fa", b".g"],
    &[b"c:", b"l:", b"**"],
    &[b"' ", b"Tr"],
    &[b"xc", b"mm"],
    &[b"\nE", b"Pe"],
    &[b"\x97\x8f", b"As", b"No"],
    &[b"nb"],
];

/// Bytes [`scan`] looks at together: one bit per byte in [`Flagged`]'s masks.
const BLOCK: usize = 64;

/// A block of [`BLOCK`] bytes of a chunk in which [`scan`] found a filter pair.
#[derive(Debug, Clone, Copy)]
struct Flagged {
    /// Offset of the block in the chunk.
    at: usize,
    /// Newlines in the chunk before the block.
    newlines_before: u64,
    /// Bit `i`: byte `at + i` is a newline.
    newlines: u64,
    /// Bit `i`: bytes `at + i` and `at + i + 1` may be a filter pair.
    pairs: u64,
}

/// How [`scan`] reads bytes: 32 at a time with AVX2 where the processor has it, else in two
/// passes with the portable SIMD of `memchr` and `aho-corasick` (SSSE3, NEON).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernel {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl Kernel {
    fn best() -> Self {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("popcnt")
        {
            return Kernel::Avx2;
        }
        Kernel::Portable
    }
}

/// The filter pairs as lookup tables: by byte for the last bytes of a chunk, by nibble for AVX2.
#[cfg(target_arch = "x86_64")]
#[derive(Debug)]
struct PairTables {
    /// Buckets whose pairs start with the byte / end with the byte.
    first: [u8; 256],
    second: [u8; 256],
    /// Buckets with a pair whose first (second) byte has this low / high nibble.
    first_lo: [u8; 16],
    first_hi: [u8; 16],
    second_lo: [u8; 16],
    second_hi: [u8; 16],
}

#[cfg(target_arch = "x86_64")]
fn pair_tables() -> &'static PairTables {
    static TABLES: OnceLock<PairTables> = OnceLock::new();
    TABLES.get_or_init(|| {
        let mut t = PairTables {
            first: [0; 256],
            second: [0; 256],
            first_lo: [0; 16],
            first_hi: [0; 16],
            second_lo: [0; 16],
            second_hi: [0; 16],
        };
        for (k, pairs) in PAIR_BUCKETS.iter().enumerate() {
            let bit = 1u8 << k;
            for &&[a, b] in pairs.iter() {
                t.first[usize::from(a)] |= bit;
                t.second[usize::from(b)] |= bit;
                t.first_lo[usize::from(a & 15)] |= bit;
                t.first_hi[usize::from(a >> 4)] |= bit;
                t.second_lo[usize::from(b & 15)] |= bit;
                t.second_hi[usize::from(b >> 4)] |= bit;
            }
        }
        t
    })
}

/// One pass over a chunk: counts its newlines and notes the [`BLOCK`]s where a filter pair may
/// start (in `flagged`, cleared first). The sink needs the count anyway; the pair test rides
/// along in the same loads, so plain output costs the rescue almost nothing more. A pair that
/// straddles two chunks is not seen: such a line is the carried one, classified whole.
fn scan(bytes: &[u8], kernel: Kernel, flagged: &mut Vec<Flagged>) -> u64 {
    flagged.clear();
    match kernel {
        Kernel::Portable => scan_portable(bytes, flagged),
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => {
            let tables = pair_tables();
            // SAFETY: `Kernel::Avx2` is only chosen when the processor has AVX2 and POPCNT.
            let (at, newlines) = unsafe { scan_avx2(bytes, tables, flagged) };
            scan_rest(bytes, at, newlines, tables, flagged)
        }
    }
}

/// The bytes of a chunk from `at` on (under two blocks) after [`scan_avx2`], one by one;
/// `newlines` were before `at`.
#[cfg(target_arch = "x86_64")]
fn scan_rest(
    bytes: &[u8],
    mut at: usize,
    mut newlines: u64,
    tables: &PairTables,
    flagged: &mut Vec<Flagged>,
) -> u64 {
    while at < bytes.len() {
        let end = (at + BLOCK).min(bytes.len());
        let (mut nl, mut pairs) = (0u64, 0u64);
        for i in at..end {
            let b = bytes[i];
            nl |= u64::from(b == b'\n') << (i - at);
            if let Some(&next) = bytes.get(i + 1) {
                let m = tables.first[usize::from(b)] & tables.second[usize::from(next)];
                pairs |= u64::from(m != 0) << (i - at);
            }
        }
        if pairs != 0 {
            flagged.push(Flagged { at, newlines_before: newlines, newlines: nl, pairs });
        }
        newlines += u64::from(nl.count_ones());
        at = end;
    }
    newlines
}

/// [`scan`] without AVX2: the trigger words found by aho-corasick (its SIMD search where the
/// processor has one), each flagging its filter pair, and the newlines counted by `memchr`.
fn scan_portable(bytes: &[u8], flagged: &mut Vec<Flagged>) -> u64 {
    let count = |s: &[u8]| memchr::memchr_iter(b'\n', s).count() as u64;
    let mut pairs = Vec::new();
    let mut from = 0;
    while let Some(m) = finder().find(Input::new(bytes).range(from..)) {
        pairs.push(m.start() + TRIGGERS[m.pattern().as_usize()].1);
        // Words overlap only across a newline (`rror\n`, `\nE  `): the next search starts
        // there.
        from = if bytes[m.end() - 1] == b'\n' { m.end() - 1 } else { m.end() };
    }
    // Block by block.
    pairs.sort_unstable();
    let (mut counted, mut before) = (0, 0);
    for p in pairs {
        let at = p - p % BLOCK;
        if let Some(last) = flagged.last_mut().filter(|f| f.at == at) {
            last.pairs |= 1 << (p - at);
            continue;
        }
        before += count(&bytes[counted..at]);
        counted = at;
        let block = &bytes[at..(at + BLOCK).min(bytes.len())];
        let newlines = memchr::memchr_iter(b'\n', block).fold(0u64, |m, i| m | 1 << i);
        flagged.push(Flagged { at, newlines_before: before, newlines, pairs: 1 << (p - at) });
    }
    before + count(&bytes[counted..])
}

fn finder() -> &'static AhoCorasick {
    static FINDER: OnceLock<AhoCorasick> = OnceLock::new();
    FINDER.get_or_init(|| {
        let words = TRIGGERS.iter().map(|(word, _)| word);
        match AhoCorasick::builder().match_kind(MatchKind::LeftmostFirst).build(words) {
            Ok(ac) => ac,
            // The patterns are constants; building them cannot fail. An automaton that matches
            // nothing keeps the sink working if it ever did.
            Err(_) => AhoCorasick::new::<_, &str>([]).unwrap_or_else(|_| unreachable!()),
        }
    })
}

/// [`scan`]'s loop over whole blocks with AVX2, each byte's pair test made of four nibble
/// lookups (`vpshufb`), as in the Teddy algorithm. Returns where it stopped (the rest, under two
/// blocks, is left to the scalar loop) and the newlines before that.
///
/// # Safety
/// The processor must have AVX2 and POPCNT.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn scan_avx2(bytes: &[u8], t: &PairTables, flagged: &mut Vec<Flagged>) -> (usize, u64) {
    use std::arch::x86_64::*;
    let table = |a: &[u8; 16]| {
        // SAFETY: `a` is 16 readable bytes.
        _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(a.as_ptr().cast()) })
    };
    let (first_lo, first_hi) = (table(&t.first_lo), table(&t.first_hi));
    let (second_lo, second_hi) = (table(&t.second_lo), table(&t.second_hi));
    let nibble = _mm256_set1_epi8(0x0f);
    let newline = _mm256_set1_epi8(b'\n' as i8);
    let zero = _mm256_setzero_si256();
    let classes = |v: __m256i, lo: __m256i, hi: __m256i| {
        let l = _mm256_shuffle_epi8(lo, _mm256_and_si256(v, nibble));
        let h = _mm256_shuffle_epi8(hi, _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble));
        _mm256_and_si256(l, h)
    };
    let (mut at, mut newlines) = (0usize, 0u64);
    let ptr = bytes.as_ptr();
    while at + BLOCK < bytes.len() {
        // SAFETY: every load ends at `at + BLOCK + 1 <= bytes.len()` at the latest.
        let (v0, n0, v1, n1) = unsafe {
            (
                _mm256_loadu_si256(ptr.add(at).cast()),
                _mm256_loadu_si256(ptr.add(at + 1).cast()),
                _mm256_loadu_si256(ptr.add(at + 32).cast()),
                _mm256_loadu_si256(ptr.add(at + 33).cast()),
            )
        };
        let both0 =
            _mm256_and_si256(classes(v0, first_lo, first_hi), classes(n0, second_lo, second_hi));
        let both1 =
            _mm256_and_si256(classes(v1, first_lo, first_hi), classes(n1, second_lo, second_hi));
        let nl = u64::from(_mm256_movemask_epi8(_mm256_cmpeq_epi8(v0, newline)) as u32)
            | u64::from(_mm256_movemask_epi8(_mm256_cmpeq_epi8(v1, newline)) as u32) << 32;
        let any = _mm256_or_si256(both0, both1);
        if _mm256_testz_si256(any, any) == 0 {
            let none0 = _mm256_movemask_epi8(_mm256_cmpeq_epi8(both0, zero)) as u32;
            let none1 = _mm256_movemask_epi8(_mm256_cmpeq_epi8(both1, zero)) as u32;
            let pairs = u64::from(!none0) | u64::from(!none1) << 32;
            flagged.push(Flagged { at, newlines_before: newlines, newlines: nl, pairs });
        }
        newlines += u64::from(nl.count_ones());
        at += BLOCK;
    }
    (at, newlines)
}

/// The trigger words of a chunk in order, found from [`scan`]'s flagged blocks: each possible
/// pair is checked against the words it belongs to.
struct Triggers<'a> {
    flagged: &'a [Flagged],
    /// The flagged block being read, and its pairs not yet looked at.
    index: usize,
    pairs: u64,
}

impl Triggers<'_> {
    /// The last byte of the first trigger word lying within `bytes[from..end]`, its line being
    /// numbered on the way (the flagged block knows the newlines before it).
    fn next(
        &mut self,
        bytes: &[u8],
        from: usize,
        end: usize,
        numbering: &mut Numbering<'_>,
    ) -> Option<usize> {
        loop {
            while self.pairs == 0 {
                self.index += 1;
                let f = self.flagged.get(self.index - 1)?;
                self.pairs = f.pairs;
            }
            let f = self.flagged[self.index - 1];
            let bit = self.pairs.trailing_zeros() as usize;
            self.pairs &= self.pairs - 1;
            let p = f.at + bit;
            if p < from || p + 1 >= end {
                continue;
            }
            let (a, b) = (bytes[p], bytes[p + 1]);
            let mut words = trigger_index()[usize::from(a)];
            let mut found = None;
            while words != 0 && found.is_none() {
                let (word, off) = TRIGGERS[words.trailing_zeros() as usize];
                words &= words - 1;
                let word = word.as_bytes();
                let Some(start) = p.checked_sub(off) else { continue };
                if word[off + 1] == b
                    && start >= from
                    && start + word.len() <= end
                    && same(&bytes[start..start + word.len()], word)
                {
                    found = Some(start + word.len() - 1);
                }
            }
            if let Some(anchor) = found {
                let below = f.newlines & ((1u64 << bit) - 1);
                numbering.set(p, f.newlines_before + u64::from(below.count_ones()));
                return Some(anchor);
            }
        }
    }
}

/// For each byte, the [`TRIGGERS`] (bit `i` for the `i`-th) whose filter pair starts with it.
fn trigger_index() -> &'static [u32; 256] {
    static INDEX: OnceLock<[u32; 256]> = OnceLock::new();
    INDEX.get_or_init(|| {
        let mut index = [0u32; 256];
        for (i, (word, off)) in TRIGGERS.iter().enumerate() {
            index[usize::from(word.as_bytes()[*off])] |= 1 << i;
        }
        index
    })
}

/// `a == b` for two short slices of the same length, without a call to `memcmp`.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

/// Newlines in a chunk before a byte, counted from the last byte asked about.
struct Numbering<'a> {
    bytes: &'a [u8],
    at: usize,
    before: u64,
}

impl Numbering<'_> {
    fn set(&mut self, at: usize, before: u64) {
        self.at = at;
        self.before = before;
    }

    fn before(&mut self, x: usize) -> u64 {
        let count = |s: &[u8]| memchr::memchr_iter(b'\n', s).count() as u64;
        if x >= self.at {
            self.before += count(&self.bytes[self.at..x]);
        } else {
            self.before -= count(&self.bytes[x..self.at]);
        }
        self.at = x;
        self.before
    }
}

/// One line of the output kept for the model: its number in the artifact and its text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rescued {
    pub line: u64,
    pub text: String,
}

/// What a line is to the classifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    None,
    Diagnostic,
    /// pytest's `E   …` line: only the first of a group is kept.
    PytestE,
    /// A rustc/cargo error header: the ` --> file:line:col` line after it is kept too.
    RustError,
    /// `Traceback (most recent call last):` opens a traceback.
    Traceback,
}

/// An open traceback: its last `File "…", line N` frame so far.
#[derive(Debug, Default)]
struct Traceback {
    last_frame: Option<Rescued>,
    lines: u32,
}

/// The streaming classifier of one command's output. See the module docs.
#[derive(Debug)]
pub struct Rescue {
    /// Number (1-based) of the line being assembled.
    line: u64,
    /// Bytes of the stream seen before the current chunk.
    offset: u64,
    /// Lines starting past this byte offset are not rescued (see the module docs).
    exact_until: u64,
    /// Byte offset of the current line's start.
    line_start: u64,
    /// The start (up to [`SCAN_MAX`] bytes) of the current, unfinished line.
    carry: Vec<u8>,
    /// The current line is longer than what `carry` keeps of it.
    carry_cut: bool,
    traceback: Option<Traceback>,
    /// The previous line was a rustc error header.
    want_location: bool,
    /// Number of the last pytest `E` line seen, to keep only the first of a group.
    last_pytest_e: u64,
    /// The first candidates of the stream.
    first: Vec<Rescued>,
    /// The most recent candidates after `first` was full.
    recent: VecDeque<Rescued>,
    /// How [`scan`] reads, and its findings in the current chunk (the buffer is reused).
    kernel: Kernel,
    flagged: Vec<Flagged>,
}

impl Rescue {
    /// A classifier for a stream whose artifact keeps its first `exact_until` bytes verbatim.
    pub fn new(exact_until: u64) -> Self {
        Self {
            line: 1,
            offset: 0,
            exact_until,
            line_start: 0,
            carry: Vec::new(),
            carry_cut: false,
            traceback: None,
            want_location: false,
            last_pytest_e: 0,
            first: Vec::new(),
            recent: VecDeque::new(),
            kernel: Kernel::best(),
            flagged: Vec::new(),
        }
    }

    /// Takes the next chunk of the stream (sanitized text, possibly cut inside a character) and
    /// returns how many newlines it holds: the sink's counters need that count, and the rescue
    /// makes it in the same pass as its search for trigger words ([`scan`]).
    pub fn push(&mut self, bytes: &[u8]) -> u64 {
        let chunk_start = self.offset;
        self.offset += bytes.len() as u64;
        if chunk_start > self.exact_until {
            // Nothing from here on can get an exact line number; only the count matters.
            return memchr::memchr_iter(b'\n', bytes).count() as u64;
        }
        let mut flagged = std::mem::take(&mut self.flagged);
        let newlines = scan(bytes, self.kernel, &mut flagged);
        self.take_chunk(bytes, chunk_start, newlines, &flagged);
        flagged.clear();
        self.flagged = flagged;
        newlines
    }

    /// The classification of one chunk holding `newlines` newlines, whose blocks holding a
    /// filter pair are `flagged` (see [`scan`]).
    fn take_chunk(&mut self, bytes: &[u8], chunk_start: u64, newlines: u64, flagged: &[Flagged]) {
        let Some(n0) = memchr::memchr(b'\n', bytes) else {
            self.extend_carry(bytes);
            return;
        };
        // The line that was carried over (or starts this chunk) ends here.
        self.extend_carry(&bytes[..n0]);
        let mut carried = std::mem::take(&mut self.carry);
        self.classify_line(self.line, scan_text(&carried, self.carry_cut), self.line_start, None);
        self.carry_cut = false;
        // The buffer is reused for the next carried line.
        carried.clear();
        self.carry = carried;

        let last_nl = memchr::memrchr(b'\n', bytes).unwrap_or(n0);
        // Newlines before a byte of the chunk, counted from where the last question was asked
        // (or where a flagged block says), so lines are numbered only when one is kept.
        let mut numbering = Numbering { bytes, at: 0, before: 0 };
        let mut triggers = Triggers { flagged, index: 0, pairs: 0 };
        let mut pos = n0 + 1;
        while pos <= last_nl {
            let stateful = self.stateful();
            let ls = if stateful {
                pos
            } else {
                // A trigger may start at the newline before `pos` (`\nE  `).
                let Some(anchor) = triggers.next(bytes, pos - 1, last_nl + 1, &mut numbering)
                else {
                    break;
                };
                memchr::memrchr(b'\n', &bytes[pos..anchor]).map_or(pos, |p| pos + p + 1)
            };
            let le = memchr::memchr(b'\n', &bytes[ls..]).map_or(last_nl, |p| ls + p);
            let text = scan_text(&bytes[ls..le.min(ls + SCAN_MAX)], le - ls > SCAN_MAX);
            pos = le + 1;
            let class = (!stateful).then(|| classify(text));
            if class == Some(Class::None) {
                // A trigger word inside an ordinary line: nothing to number.
                continue;
            }
            let line = self.line + numbering.before(ls);
            self.classify_line(line, text, chunk_start + ls as u64, class);
        }
        self.line += newlines;
        self.line_start = chunk_start + last_nl as u64 + 1;
        self.extend_carry(&bytes[last_nl + 1..]);
    }

    /// The rescued lines of a run whose shown text starts at line `shown_start` and is `shown`.
    pub fn finish(self, shown_start: u64, shown: &str) -> Vec<Rescued> {
        let elided = |c: &Rescued| c.line < shown_start;
        if !self.first.iter().any(elided) {
            return Vec::new();
        }
        let in_tail: HashSet<&str> = shown.lines().map(str::trim).collect();
        let keep = |c: &Rescued| elided(c) && !in_tail.contains(c.text.trim());
        let first: Vec<Rescued> = self.first.into_iter().filter(keep).collect();
        let recent: Vec<Rescued> = self.recent.into_iter().filter(keep).collect();
        // Alternate: first[0], recent[last], first[1], recent[last - 1], … within the budget.
        let mut picked: Vec<Rescued> = Vec::new();
        let mut bytes = 0;
        let (mut f, mut r) = (first.into_iter(), recent.into_iter().rev());
        let mut f_done = false;
        let mut r_done = false;
        let mut from_first = true;
        while picked.len() < MAX_LINES && !(f_done && r_done) {
            let next = if from_first { f.next() } else { r.next() };
            match next {
                Some(c) => {
                    let cost = rendered_len(&c);
                    if bytes + cost > MAX_BYTES {
                        // This side is out of budget; the other may still have short lines.
                        if from_first {
                            f_done = true
                        } else {
                            r_done = true
                        }
                    } else {
                        bytes += cost;
                        picked.push(c);
                    }
                }
                None if from_first => f_done = true,
                None => r_done = true,
            }
            from_first = if f_done {
                false
            } else if r_done {
                true
            } else {
                !from_first
            };
        }
        picked.sort_by_key(|c| c.line);
        picked
    }

    fn extend_carry(&mut self, bytes: &[u8]) {
        let room = SCAN_MAX.saturating_sub(self.carry.len());
        self.carry_cut |= bytes.len() > room;
        self.carry.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    /// Whether lines must be read one by one (a rule waits for the next lines).
    fn stateful(&self) -> bool {
        self.traceback.is_some() || self.want_location
    }

    /// One whole line (its first [`SCAN_MAX`] bytes) numbered `line`, starting at byte `at`;
    /// `class` is its class when already known.
    fn classify_line(&mut self, line: u64, text: &str, at: u64, class: Option<Class>) {
        if at > self.exact_until {
            self.traceback = None;
            self.want_location = false;
            return;
        }
        if std::mem::take(&mut self.want_location) && text.trim_start().starts_with("--> ") {
            self.candidate(line, text);
            return;
        }
        if let Some(tb) = &mut self.traceback {
            tb.lines += 1;
            let indented = text.starts_with([' ', '\t']);
            if indented || text.is_empty() {
                if text.trim_start().starts_with("File \"") {
                    match &mut tb.last_frame {
                        Some(frame) => {
                            frame.line = line;
                            clip_into(text, &mut frame.text);
                        }
                        None => tb.last_frame = Some(Rescued { line, text: clip(text) }),
                    }
                }
                if tb.lines > TRACEBACK_MAX_LINES {
                    self.traceback = None;
                }
                return;
            }
            // The first line back at the margin names the exception.
            let frame = self.traceback.take().and_then(|tb| tb.last_frame);
            if let Some(frame) = frame {
                self.candidate(frame.line, &frame.text);
            }
            if classify(text) != Class::Traceback {
                self.candidate(line, text);
                return;
            }
        }
        match class.unwrap_or_else(|| classify(text)) {
            Class::None => {}
            Class::Diagnostic => self.candidate(line, text),
            Class::PytestE => {
                if self.last_pytest_e + 1 != line {
                    self.candidate(line, text);
                }
                self.last_pytest_e = line;
            }
            Class::RustError => {
                self.candidate(line, text);
                self.want_location = true;
            }
            Class::Traceback => self.traceback = Some(Traceback::default()),
        }
    }

    fn candidate(&mut self, line: u64, text: &str) {
        if self.first.len() < MAX_LINES {
            let mut kept = String::new();
            clip_into(text, &mut kept);
            self.first.push(Rescued { line, text: kept });
            return;
        }
        // Once the ring is full, the oldest entry's buffer takes the new text.
        let mut c = if self.recent.len() == RECENT_MAX {
            self.recent.pop_front().unwrap_or_else(|| Rescued { line, text: String::new() })
        } else {
            Rescued { line, text: String::new() }
        };
        c.line = line;
        clip_into(text, &mut c.text);
        self.recent.push_back(c);
    }
}

/// The rescue block of the model text (contract §7), or `None` when nothing was rescued.
pub fn block(rescued: &[Rescued], artifact_id: Option<u64>) -> Option<String> {
    if rescued.is_empty() {
        return None;
    }
    let mut out = match artifact_id {
        Some(id) => format!("[Earlier in the output (artifact://{id} lines):]\n"),
        None => "[Earlier in the output:]\n".to_owned(),
    };
    for r in rescued {
        out.push_str(&format!("{}: {}\n", r.line, r.text));
    }
    out.push_str("[\u{2026}]");
    Some(out)
}

fn rendered_len(c: &Rescued) -> usize {
    // `<line no>: <text>\n`
    c.line.to_string().len() + 2 + c.text.len() + 1
}

/// The text kept for a line: trailing blanks dropped, at most [`LINE_TEXT_MAX`] bytes.
fn clip(text: &str) -> String {
    let mut kept = String::new();
    clip_into(text, &mut kept);
    kept
}

/// [`clip`] into a buffer that is reused.
fn clip_into(text: &str, kept: &mut String) {
    kept.clear();
    let text = text.trim_end();
    if text.len() <= LINE_TEXT_MAX {
        kept.push_str(text);
        return;
    }
    kept.push_str(&text[..floor_boundary(text, LINE_TEXT_MAX)]);
    kept.push('\u{2026}');
}

/// The text of a line the classifier looks at: the line's first [`SCAN_MAX`] bytes `bytes`, and
/// whether the line goes on after them (then the word cut at the end is dropped: `error_case`
/// cut after `error` must not read as the word `error`).
fn scan_text(bytes: &[u8], cut: bool) -> &str {
    let text = floor_str(bytes);
    if cut {
        text.trim_end_matches(|c: char| c.is_alphanumeric() || c == '_')
    } else {
        text
    }
}

/// The longest valid UTF-8 prefix of `bytes` (a carried line may be cut inside a character).
fn floor_str(bytes: &[u8]) -> &str {
    match std::str::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default(),
    }
}

fn floor_boundary(text: &str, mut i: usize) -> usize {
    if i >= text.len() {
        return text.len();
    }
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Classifies one line. Every rule that says yes needs one of [`TRIGGERS`] in the line.
fn classify(line: &str) -> Class {
    if line.starts_with("E  ") && !line[1..].trim().is_empty() {
        return Class::PytestE;
    }
    if line.starts_with("Traceback (most recent call last):") {
        return Class::Traceback;
    }
    let t = line.trim_start();
    // rustc / cargo and any tool that starts its diagnostics with `error:` / `error[E…]:`.
    if let Some(rest) = t.strip_prefix("error") {
        if rest.starts_with('[') && find(rest, "]:").is_some() {
            return Class::RustError;
        }
        if rest.starts_with(':') {
            return Class::RustError;
        }
    }
    if is_diagnostic(line, t) {
        Class::Diagnostic
    } else {
        Class::None
    }
}

fn is_diagnostic(line: &str, t: &str) -> bool {
    starts_with_any(t, &["ERROR:", "ERROR ", "[ERROR]", "Error:", "fatal:", "fatal error:"])
        || starts_with_word(t, "FAILED")
        || starts_with_word(t, "FAIL")
        || t.starts_with("--- FAIL:")
        || ends_with_failed(t)
        || (t.starts_with("thread '") && find(t, "' panicked at").is_some())
        || t.starts_with("panic: ")
        || starts_with_any(t, &["npm ERR!", "npm error ", "ERR_PNPM_"])
        || t.starts_with("\u{25cf} ")
        || is_make_error(line)
        || (t.ends_with("failed.") && find(t, "Assertion `").is_some())
        || is_error_name_line(t)
        || is_located(line)
        || is_program_error(line)
        || is_eslint_error(line)
}

fn starts_with_any(t: &str, prefixes: &[&str]) -> bool {
    prefixes.iter().any(|p| t.starts_with(p))
}

/// `word` at the start, then the end, a blank or a colon (`FAIL src/a.test.js`, `FAIL\tpkg`,
/// `FAILED (failures=1)`, `FAIL: test_x (m.T.test_x)`), not `FAILURES`.
fn starts_with_word(t: &str, word: &str) -> bool {
    match t.strip_prefix(word) {
        Some(rest) => rest.is_empty() || rest.starts_with([' ', '\t', ':']),
        None => false,
    }
}

/// `test foo ... FAILED` (cargo, unittest -v), `tests/a.py::test_b FAILED   [ 50%]` (pytest -v).
fn ends_with_failed(t: &str) -> bool {
    let mut u = t.trim_end();
    if u.ends_with("%]") {
        match u.rfind('[') {
            Some(p) => u = u[..p].trim_end(),
            None => return false,
        }
    }
    // unittest -v: `test_b (m.T.test_b) ... FAIL` / `... ERROR`
    u.ends_with(" FAILED") || u.ends_with(" ... FAIL") || u.ends_with(" ... ERROR")
}

/// Where `needle` first occurs in `hay`: candidates for its first byte found with `memchr`, then
/// compared. Lines are short (at most [`SCAN_MAX`] bytes) and the needles rare, so this costs
/// less than any searcher with a set-up step (`str::find`, `memmem::find` build one per call).
fn find(hay: &str, needle: &str) -> Option<usize> {
    let (hay, needle) = (hay.as_bytes(), needle.as_bytes());
    let first = *needle.first()?;
    memchr::memchr_iter(first, hay).find(|&p| hay[p..].starts_with(needle))
}

/// `make: *** [Makefile:3: all] Error 1`, `make[2]: *** …`, `Makefile:3: *** missing separator.`
fn is_make_error(line: &str) -> bool {
    let Some(p) = find(line, ": *** ") else { return false };
    let head = &line[..p];
    let make = head.strip_prefix("make").or_else(|| head.strip_prefix("gmake"));
    if let Some(rest) = make {
        return rest.is_empty()
            || (rest.starts_with('[')
                && rest.ends_with(']')
                && is_digits(&rest[1..rest.len() - 1]));
    }
    // `file:line: *** …`
    match head.rsplit_once(':') {
        Some((file, no)) => !file.is_empty() && !file.contains(' ') && is_digits(no),
        None => false,
    }
}

/// An exception or error name at the margin, then a colon: `AssertionError: expected 1 to be 2`,
/// `TypeError: x is not a function`, `ValueError: bad`, `java.lang.IllegalStateException: x`.
fn is_error_name_line(t: &str) -> bool {
    let Some((name, _)) = t.split_once(':') else { return false };
    let ident = name.rsplit('.').next().unwrap_or(name);
    !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
        && ident.bytes().next().is_some_and(|b| b.is_ascii_uppercase())
        && (ident.ends_with("Error") || ident.ends_with("Exception"))
}

/// `path:line[:col]: …` with an error after it (gcc, clang, go vet, tsc, pytest locations), or any
/// `*.go:line` location (go build errors carry no "error" word); `path(line,col): error TS…`
/// (tsc). The path has no blanks.
fn is_located(line: &str) -> bool {
    let t = line.trim_start();
    if let Some(p) = find(t, "): error ") {
        // The file is the word before the parenthesis (pnpm and others put a prefix before it).
        let head = &t[..p];
        let head = head.rsplit(' ').next().unwrap_or(head);
        if let Some((file, pos)) = head.split_once('(') {
            let mut nums = pos.split(',');
            return !file.is_empty()
                && !file.contains(' ')
                && nums.next().is_some_and(is_digits)
                && nums.next().is_some_and(is_digits);
        }
    }
    let Some((file, rest)) = t.split_once(':') else { return false };
    if file.is_empty() || file.contains(' ') {
        return false;
    }
    let (no, mut rest) = match rest.split_once(|c: char| !c.is_ascii_digit()) {
        Some((no, _)) => (no, &rest[no.len()..]),
        None => return false,
    };
    if !is_digits(no) {
        return false;
    }
    if let Some(r) = rest.strip_prefix(':') {
        let col_len = r.bytes().take_while(u8::is_ascii_digit).count();
        rest = if col_len > 0 { &r[col_len..] } else { rest };
    }
    let msg = if let Some(m) = rest.strip_prefix(": ") {
        m
    } else if let Some(m) = rest.strip_prefix(" - ") {
        m
    } else {
        return false;
    };
    if file.ends_with(".go") {
        return true;
    }
    let msg = msg.strip_prefix("fatal ").unwrap_or(msg);
    if let Some(after) = msg.strip_prefix("error") {
        return after.is_empty() || after.starts_with([':', ' ', '[']);
    }
    // pytest: `tests/test_a.py:12: AssertionError`, `…: Failed`
    file.ends_with(".py")
        && msg.split_whitespace().next().is_some_and(|w| {
            let w = w.trim_end_matches(':');
            w == "Failed" || w.ends_with("Error") || w.ends_with("Exception")
        })
}

/// `prog: error: …`, `./build.sh: line 5: foo: command not found`, `cat: x: No such file or
/// directory`: a program name at the margin, then a colon.
fn is_program_error(line: &str) -> bool {
    let Some(p) = find(line, ": ") else { return false };
    let (prog, rest) = (&line[..p], &line[p + 2..]);
    if prog.is_empty() || prog.contains([' ', '\t']) {
        return false;
    }
    let rest_t = rest.strip_prefix("fatal ").unwrap_or(rest);
    if rest_t.starts_with("error:") {
        return true;
    }
    rest.ends_with(": command not found")
        || rest.ends_with(": No such file or directory")
        || rest.ends_with(": Permission denied")
        || rest.ends_with(": unbound variable")
}

/// eslint's stylish format: `  3:5  error  'x' is not defined  no-undef`.
fn is_eslint_error(line: &str) -> bool {
    if !line.starts_with(' ') {
        return false;
    }
    let mut words = line.split_whitespace();
    let pos = words.next().unwrap_or_default();
    let Some((l, c)) = pos.split_once(':') else { return false };
    is_digits(l) && is_digits(c) && words.next() == Some("error")
}

fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;

    #[test]
    fn classify_table() {
        let yes = [
            "error[E0308]: mismatched types",
            "error: could not compile `x` (bin \"x\") due to 1 previous error",
            "src/main.c:3:5: error: 'y' undeclared (first use in this function)",
            "main.c:1:10: fatal error: nope.h: No such file or directory",
            "./main.go:5:2: undefined: fmt.Prinln",
            "    main_test.go:12: got 1, want 2",
            "--- FAIL: TestAdd (0.00s)",
            "FAIL\texample.com/m\t0.002s",
            "FAIL",
            "src/a.ts(3,5): error TS2322: Type 'string' is not assignable to type 'number'.",
            "src/a.ts:3:5 - error TS2322: Type 'string' is not assignable to type 'number'.",
            "  3:5  error  'x' is not defined  no-undef",
            "Traceback (most recent call last):",
            "E       assert 1 == 2",
            "tests/test_a.py:12: AssertionError",
            "FAILED tests/test_a.py::test_b - assert 1 == 2",
            "tests/test_a.py::test_b FAILED                                  [ 50%]",
            "test tests::it_fails ... FAILED",
            "test_b (test_m.T.test_b) ... FAIL",
            "test_c (test_m.T.test_c) ... ERROR",
            "FAIL src/sum.test.js",
            " FAIL  src/sum.test.ts > sum > adds",
            "  \u{25cf} sum \u{203a} adds 1 + 2",
            "AssertionError: expected 3 to be 4 // Object.is equality",
            "npm ERR! code ELIFECYCLE",
            "npm error code 1",
            "\u{2009}ERR_PNPM_RECURSIVE_RUN_FIRST_FAIL\u{2009} x@1.0.0 build: `false`",
            "make: *** [Makefile:3: all] Error 1",
            "make[2]: *** [sub.mk:7: target] Error 2",
            "Makefile:3: *** missing separator.  Stop.",
            "thread 'main' panicked at src/main.rs:2:5:",
            "panic: runtime error: index out of range [3] with length 3",
            "a.out: t.c:4: main: Assertion `x == 2' failed.",
            "./build.sh: line 5: frobnicate: command not found",
            "./build.sh: line 7: NAME: unbound variable",
            "cat: missing.txt: No such file or directory",
            "ld: error: undefined symbol: foo",
            "fatal: not a git repository (or any of the parent directories): .git",
            "ERROR: Could not find a version that satisfies the requirement nope",
            "FAIL: test_b (test_m.T.test_b)",
            "ERROR: test_c (test_m.T.test_c)",
            "FAILED (failures=1, errors=1)",
        ];
        for line in yes {
            assert_ne!(classify(line), Class::None, "{line:?}");
            assert!(has_trigger(line), "{line:?} has no trigger word");
        }
        let no = [
            "   Compiling error-chain v0.12.4",
            "test tests::error_handling ... ok",
            "warning: unused variable: `error`",
            "cc -Werror -o main main.c",
            "0 errors, 2 warnings",
            "INFO retrying after error: timeout",
            "the quick brown fox",
            "FAILURES",
            "=== FAILURES ===",
            "src/error.rs:10:5: note: defined here",
            "    let error = 3;",
            "Error handling is described in chapter 3",
            "errors.go compiled",
            "stderr is redirected",
            "Ran 300 tests in 0.1s",
            "E",
            "",
            "  --> src/main.rs:2:18",
            "tests/test_a.py::test_ok PASSED",
            "PASS src/ok.test.js",
            "fatality rate: 0",
        ];
        for line in no {
            assert_eq!(classify(line), Class::None, "{line:?}");
        }
    }

    /// A line longer than what the classifier looks at, cut right after `error` or `error:`:
    /// the same lines are rescued whether the line lies inside a chunk or across two.
    #[test]
    fn rescue_long_lines_do_not_depend_on_chunking() {
        for (tail, rescued) in [("error_case x\n", false), ("error: boom\n", false)] {
            let long = format!("{}{tail}", "x ".repeat((SCAN_MAX - 5) / 2) + " ");
            assert!(long.len() > SCAN_MAX);
            let text = format!("ok\n{long}f.c:1:2: error: e\nok\n");
            let whole = run(&[&text], 100, "");
            for cut in 1..text.len() {
                let chunked = run(&[&text[..cut], &text[cut..]], 100, "");
                assert_eq!(whole, chunked, "cut at {cut}");
            }
            assert_eq!(whole.len(), 1 + usize::from(rescued), "{whole:?}");
        }
    }

    /// Memory does not grow with the output: after a million lines, a fifth of them diagnostics
    /// and some lines far longer than what is looked at, the rescue holds its first lines, its
    /// ring of recent ones and one carried line start, as after ten thousand.
    #[test]
    fn rescue_memory_is_bounded_whatever_the_output_size() {
        let held = |r: &Rescue| {
            let texts: usize = r.first.iter().chain(&r.recent).map(|c| c.text.capacity()).sum();
            (r.first.len(), r.recent.len(), r.carry.capacity(), texts, r.flagged.capacity())
        };
        let long = "y".repeat(5 * SCAN_MAX);
        let chunk: String = (0..1000)
            .map(|i| match i % 5 {
                0 => format!("src/m{i}.c:{i}:5: error: 'x' undeclared\n"),
                1 => format!("{long}\n"),
                _ => format!("test tests::case_{i} ... ok\n"),
            })
            .collect();
        let mut r = Rescue::new(u64::MAX);
        for _ in 0..10 {
            assert_eq!(r.push(chunk.as_bytes()), 1000);
        }
        let after_ten = held(&r);
        for _ in 0..990 {
            assert_eq!(r.push(chunk.as_bytes()), 1000);
        }
        let after_all = held(&r);
        assert_eq!((after_all.0, after_all.1), (MAX_LINES, RECENT_MAX));
        assert_eq!(
            (after_ten.0, after_ten.1, after_ten.2, after_ten.4),
            (after_all.0, after_all.1, after_all.2, after_all.4)
        );
        assert!(after_all.2 <= 2 * SCAN_MAX, "carry {}", after_all.2);
        // Kept texts are clipped lines: bounded by the counts above.
        assert!(after_all.3 <= (MAX_LINES + RECENT_MAX) * (LINE_TEXT_MAX + 4), "{after_all:?}");
        let rescued = r.finish(u64::MAX, "");
        assert_eq!(rescued.len(), MAX_LINES);
        assert_eq!(rescued.last().unwrap().line, 999 * 1000 + 996);
    }

    fn kernels() -> Vec<Kernel> {
        let mut k = vec![Kernel::Portable];
        k.extend(Some(Kernel::best()).filter(|&b| b != Kernel::Portable));
        k
    }

    /// Every trigger word's filter pair is flagged wherever the word lies, by every kernel, and
    /// the newline count and masks are exact.
    #[test]
    fn rescue_scan_flags_every_trigger_and_counts_newlines() {
        let filler = b"the quick brown fox jumps over the lazy dog\n".repeat(8);
        for &(word, off) in TRIGGERS {
            let word = word.as_bytes();
            let pair = &word[off..off + 2];
            assert!(
                PAIR_BUCKETS.iter().any(|b| b.iter().any(|p| &p[..] == pair)),
                "{word:?}: pair {pair:?} in no bucket"
            );
            for at in 0..=filler.len() - word.len() {
                let mut buf = filler.clone();
                buf[at..at + word.len()].copy_from_slice(word);
                let want_nl: Vec<usize> = (0..buf.len()).filter(|&i| buf[i] == b'\n').collect();
                for kernel in kernels() {
                    let mut flagged = Vec::new();
                    let n = scan(&buf, kernel, &mut flagged);
                    assert_eq!(n, want_nl.len() as u64, "{kernel:?}");
                    let p = at + off;
                    let hit = flagged
                        .iter()
                        .any(|f| f.at <= p && p < f.at + BLOCK && (f.pairs >> (p - f.at)) & 1 == 1);
                    assert!(
                        hit,
                        "{kernel:?}: {:?} at {at} not flagged",
                        String::from_utf8_lossy(word)
                    );
                    for f in &flagged {
                        let nl: Vec<usize> = (0..BLOCK)
                            .filter(|i| (f.newlines >> i) & 1 == 1)
                            .map(|i| f.at + i)
                            .collect();
                        let want: Vec<usize> = want_nl
                            .iter()
                            .copied()
                            .filter(|&i| i >= f.at && i < f.at + BLOCK)
                            .collect();
                        assert_eq!(nl, want, "{kernel:?}");
                        let before = want_nl.iter().filter(|&&i| i < f.at).count() as u64;
                        assert_eq!(f.newlines_before, before, "{kernel:?}");
                    }
                }
            }
        }
    }

    fn has_trigger(line: &str) -> bool {
        let with_nl = format!("\n{line}\n");
        TRIGGERS.iter().any(|(word, _)| with_nl.contains(word))
    }

    /// Feeds `text` in chunks, the window starting at `first_shown(line count so far)`.
    fn run(chunks: &[&str], shown_start: u64, shown: &str) -> Vec<Rescued> {
        run_with(Kernel::best(), chunks, shown_start, shown)
    }

    fn run_with(kernel: Kernel, chunks: &[&str], shown_start: u64, shown: &str) -> Vec<Rescued> {
        let mut r = Rescue::new(u64::MAX);
        r.kernel = kernel;
        for c in chunks {
            let n = r.push(c.as_bytes());
            assert_eq!(n, c.bytes().filter(|&b| b == b'\n').count() as u64);
        }
        r.finish(shown_start, shown)
    }

    fn noise(n: usize) -> String {
        (0..n).map(|i| format!("   Compiling crate{i} v0.1.0 (error-free)\n")).collect()
    }

    #[test]
    fn rescue_keeps_the_first_error_with_its_location() {
        let text = format!(
            "{}error[E0308]: mismatched types\n --> src/main.rs:2:18\n  |\n{}",
            noise(10),
            noise(5000)
        );
        let got = run(&[&text], 4000, "");
        assert_eq!(
            got,
            vec![
                Rescued { line: 11, text: "error[E0308]: mismatched types".into() },
                Rescued { line: 12, text: " --> src/main.rs:2:18".into() },
            ]
        );
        // Inside the window: nothing.
        assert_eq!(run(&[&text], 5, ""), vec![]);
        // Already in the shown text: nothing.
        assert_eq!(
            run(&[&text], 4000, "error[E0308]: mismatched types\n --> src/main.rs:2:18"),
            vec![]
        );
    }

    #[test]
    fn rescue_follows_a_traceback_to_its_last_frame() {
        let text = "start\nTraceback (most recent call last):\n  File \"a.py\", line 3, in <module>\n    main()\n  File \"a.py\", line 2, in main\n    raise ValueError('bad')\nValueError: bad\nafter\n";
        let got = run(&[text], 100, "");
        assert_eq!(
            got,
            vec![
                Rescued { line: 5, text: "  File \"a.py\", line 2, in main".into() },
                Rescued { line: 7, text: "ValueError: bad".into() },
            ]
        );
    }

    #[test]
    fn rescue_keeps_first_and_most_recent_within_budget() {
        let mut text = String::new();
        for i in 1..=100 {
            text.push_str(&format!("f{i}.c:1:1: error: e{i}\nok line\n"));
        }
        let got = run(&[&text], 1000, "");
        assert_eq!(got.len(), MAX_LINES);
        let lines: Vec<u64> = got.iter().map(|r| r.line).collect();
        let want: Vec<u64> =
            (0..10).map(|i| 2 * i + 1).chain((90..100).map(|i| 2 * i + 1)).collect();
        assert_eq!(lines, want);
        let bytes: usize = got.iter().map(rendered_len).sum();
        assert!(bytes <= MAX_BYTES);

        // Long lines: the byte budget binds first.
        let long = "x".repeat(1000);
        let text: String = (1..=50).map(|i| format!("error: {i} {long}\n")).collect();
        let got = run(&[&text], 1000, "");
        assert!(got.iter().map(rendered_len).sum::<usize>() <= MAX_BYTES);
        assert!(got.len() >= 2 && got.len() < MAX_LINES, "{}", got.len());
        assert!(got.iter().all(|r| r.text.ends_with('\u{2026}')));
    }

    #[test]
    fn rescue_stops_where_a_capped_artifact_stops_being_exact() {
        let text = format!("error: early\n{}error: late\n", noise(100));
        let mut r = Rescue::new(20);
        r.push(text.as_bytes());
        let got = r.finish(1000, "");
        assert_eq!(got, vec![Rescued { line: 1, text: "error: early".into() }]);
    }

    #[test]
    fn rescue_block_wording() {
        let rescued = vec![Rescued { line: 3, text: "error: x".into() }];
        assert_eq!(
            block(&rescued, Some(7)).unwrap(),
            "[Earlier in the output (artifact://7 lines):]\n3: error: x\n[\u{2026}]"
        );
        assert_eq!(block(&[], Some(7)), None);
    }

    fn piece() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            Just("ok line\n"),
            Just("error: boom\n"),
            Just("E       assert 1 == 2\n"),
            Just("E       where 1 = f()\n"),
            Just("Traceback (most recent call last):\n"),
            Just("  File \"a.py\", line 1, in <module>\n"),
            Just("ValueError: v\n"),
            Just("error[E0425]: x\n"),
            Just(" --> src/a.rs:1:1\n"),
            Just("f.c:1:2: error: e\n"),
            Just("noerror here\n"),
            Just("thread 'main' panicked at src/a.rs:1:5:\n"),
            Just("panic: boom\n"),
            Just("got an error\n"),
            Just("fatal: not a repository\n"),
            Just("make: *** [all] Error 1\n"),
            Just("x.go:3:1: undefined: y\n"),
            Just("the quick brown fox: rr .g Fa .a mm xc hm Na ' Tr c: l: ** \\n No As nb\n"),
            Just("\u{e9}rror\n"),
            Just("FAIL"),
            Just("ED x\n"),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        #[test]
        fn rescue_does_not_depend_on_chunking(
            pieces in prop::collection::vec(piece(), 0..80),
            cuts in prop::collection::vec(any::<usize>(), 0..12),
            shown_start in 0u64..100,
        ) {
            let text = pieces.concat();
            let mut cuts: Vec<usize> = cuts.iter().map(|c| {
                let mut c = c % (text.len() + 1);
                while !text.is_char_boundary(c) { c += 1; }
                c
            }).collect();
            cuts.sort_unstable();
            let mut chunks = Vec::new();
            let mut from = 0;
            for cut in cuts.into_iter().chain([text.len()]) {
                chunks.push(&text[from..cut]);
                from = cut;
            }
            let whole = run(&[&text], shown_start, "");
            let chunked = run(&chunks, shown_start, "");
            prop_assert_eq!(&whole, &chunked);
            // Read 32 bytes at a time or with the portable search, the same.
            prop_assert_eq!(&run_with(Kernel::Portable, &chunks, shown_start, ""), &whole);
            // Line-by-line classification of the whole text is the oracle.
            let mut oracle = Rescue::new(u64::MAX);
            for (i, line) in text.split_inclusive('\n').enumerate() {
                if line.ends_with('\n') {
                    oracle.classify_line(i as u64 + 1, line.trim_end_matches('\n'), 0, None);
                }
            }
            prop_assert_eq!(oracle.finish(shown_start, ""), whole);
        }
    }
}
