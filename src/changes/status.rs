//! Whether a project's receipts are ready (contract §13): how far its first snapshot has got,
//! measured as `git add --verbose` reports each file it hashed, against the files `git
//! ls-files` counted before; what calls say meanwhile (`changes_unavailable`), and what the
//! editor's card and `:checkhealth` show.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// "Not known yet" in an atomic count.
const UNKNOWN: u64 = u64::MAX;

/// The figures of a first snapshot as it goes on: written by the task that takes it, read by
/// anyone (lock-free: the snapshot holds the project's lock for its whole length).
#[derive(Debug)]
pub struct Progress {
    hashed: AtomicU64,
    total: AtomicU64,
}

impl Default for Progress {
    fn default() -> Self {
        Progress { hashed: AtomicU64::new(0), total: AtomicU64::new(UNKNOWN) }
    }
}

impl Progress {
    /// A first snapshot starts: nothing hashed, the total not counted yet.
    pub fn start(&self) {
        self.hashed.store(0, Ordering::Relaxed);
        self.total.store(UNKNOWN, Ordering::Relaxed);
    }

    /// The project's files, as counted before hashing.
    pub fn counted(&self, files: u64) {
        self.total.store(files, Ordering::Relaxed);
    }

    /// `lines` more lines of `git add --verbose`: one per file it hashed.
    pub fn hashed(&self, lines: u64) {
        self.hashed.fetch_add(lines, Ordering::Relaxed);
    }

    /// The snapshot is done and holds `files` files.
    pub fn done(&self, files: u64) {
        self.total.store(files, Ordering::Relaxed);
        self.hashed.store(files, Ordering::Relaxed);
    }

    pub fn now(&self) -> Hashed {
        let total = self.total.load(Ordering::Relaxed);
        let total = (total != UNKNOWN).then_some(total);
        let hashed = self.hashed.load(Ordering::Relaxed);
        // A name holding a newline takes two of git's lines.
        Hashed { hashed: total.map_or(hashed, |t| hashed.min(t)), total }
    }

    /// The files of the finished first snapshot, once there was one.
    pub fn files(&self) -> Option<u64> {
        let total = self.total.load(Ordering::Relaxed);
        (total != UNKNOWN).then_some(total)
    }
}

/// How far a first snapshot has got: files hashed, of how many (`None`: not counted, as when
/// the store kept an index from an earlier engine and only changed files are hashed again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hashed {
    pub hashed: u64,
    pub total: Option<u64>,
}

impl std::fmt::Display for Hashed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.total {
            Some(total) => {
                write!(f, "{} of {} files hashed", grouped(self.hashed), grouped(total))
            }
            None if self.hashed == 0 => f.write_str("no file hashed yet"),
            None => write!(f, "{} files hashed", grouped(self.hashed)),
        }
    }
}

/// `250000` as people read it: `250 000`.
pub fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

/// Whether a project's receipts are ready.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Readiness {
    /// No run has asked for a snapshot of it yet.
    Waiting,
    /// Its first snapshot is being taken.
    Indexing { hashed: u64, total: Option<u64> },
    /// Receipts are taken; `files`: in its latest snapshot that is known.
    Ready { files: Option<u64> },
    /// No receipts for it, and why.
    Off { reason: String },
    /// A snapshot is being taken at this moment (asked again, it says more).
    Busy,
}

impl Readiness {
    pub fn indexing(at: Hashed) -> Readiness {
        Readiness::Indexing { hashed: at.hashed, total: at.total }
    }
}

impl std::fmt::Display for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Readiness::Waiting => f.write_str("no snapshot yet: receipts start with its first run"),
            Readiness::Indexing { hashed, total } => {
                let at = Hashed { hashed: *hashed, total: *total };
                write!(f, "the first snapshot is being taken: {at}")
            }
            Readiness::Ready { files: Some(n) } => write!(f, "ready ({} files)", grouped(*n)),
            Readiness::Ready { files: None } => f.write_str("ready"),
            Readiness::Off { reason } => write!(f, "off: {reason}"),
            Readiness::Busy => f.write_str("a snapshot is being taken"),
        }
    }
}

/// One project a backend knows, as `changes_status` answers (`:checkhealth`, the card's note).
#[derive(Debug, Clone, Serialize)]
pub struct ProjectStatus {
    pub root: PathBuf,
    /// The pid of the shared engine that takes its receipts (absent: this backend's own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<u32>,
    #[serde(flatten)]
    pub readiness: Readiness,
    /// The readiness in words.
    pub note: String,
}

impl ProjectStatus {
    pub fn new(root: PathBuf, engine: Option<u32>, readiness: Readiness) -> ProjectStatus {
        ProjectStatus { root, engine, note: readiness.to_string(), readiness }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_read_as_people_read_them() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(41_000), "41 000");
        assert_eq!(grouped(250_000), "250 000");
        assert_eq!(grouped(1_234_567), "1 234 567");
        let p = Progress::default();
        assert_eq!(p.now().to_string(), "no file hashed yet");
        p.hashed(3);
        assert_eq!(p.now().to_string(), "3 files hashed");
        p.counted(2);
        assert_eq!(p.now().to_string(), "2 of 2 files hashed", "never past the total");
        let r = Readiness::indexing(Hashed { hashed: 41_000, total: Some(250_000) });
        assert_eq!(
            r.to_string(),
            "the first snapshot is being taken: 41 000 of 250 000 files hashed"
        );
    }
}
