//! contract §4.3: the artifact store, ids, caps, retention and `artifact://` resolution.
//!
//! An artifact is the full sanitized output of one command whose output did not fit the sink's
//! window (contract §4.2). Each session owns one directory (mode 0700) of files `<id>.bash.log`
//! (mode 0600). Ids are decimal and sequential per directory, continuing after the highest id
//! already there, and are taken only when a spill happens.
//!
//! [`CappedWriter`] bounds an artifact's size: past the cap it keeps the first part, one
//! `[… N bytes elided …]` line and the last [`TAIL_KEEP`] bytes. [`ArtifactWriter`] runs one on
//! its own thread, so that writing the file never holds up draining the command's output.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use crate::Error;

/// Default size cap of one artifact file (contract §4.2 Ours: 32 MiB, configurable).
pub const DEFAULT_ARTIFACT_CAP: u64 = 32 << 20;

/// Bytes of the stream's end an over-cap artifact keeps: the end of a log is where failures are.
pub const TAIL_KEEP: u64 = 4 << 20;

/// How far (bytes) the cut points of a capped artifact may move to land on a line boundary;
/// past this they fall back to a character boundary, so one giant line cannot empty a part.
const BOUNDARY_SEARCH: usize = 64 << 10;

/// How many bytes at the start of the stream an artifact capped at `cap` keeps verbatim, so
/// that line numbers there are those of the stream (the rest may be elided, contract §4.2).
pub fn verbatim_prefix(cap: u64) -> u64 {
    let cap = cap.saturating_sub(ELISION_RESERVE);
    let tail_keep = TAIL_KEEP.min(cap / 2);
    (cap - tail_keep).saturating_sub(BOUNDARY_SEARCH as u64)
}

/// File name suffix of an artifact: `<id>.bash.log`.
const SUFFIX: &str = ".bash.log";

/// How many taken ids `create` skips before giving up: other processes sharing the directory
/// may race us, but not thousands of times.
const MAX_CREATE_ATTEMPTS: u32 = 1000;

/// The URL scheme prefix resolved by [`resolve`].
const SCHEME: &str = "artifact://";

/// The artifacts directory of one session. Ids are allocated lazily, on the first spill.
#[derive(Debug)]
pub struct ArtifactStore {
    dir: PathBuf,
    /// The next id to try; `None` until the directory has been scanned once.
    next_id: Mutex<Option<u64>>,
}

impl ArtifactStore {
    /// A store rooted at `dir`; nothing is created until the first artifact.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into(), next_id: Mutex::new(None) }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of artifact `id` (whether or not it exists).
    pub fn path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{id}{SUFFIX}"))
    }

    /// Ids of the artifacts in the directory, sorted numerically; empty when it cannot be read.
    #[allow(clippy::disallowed_methods)] // see `create`; `resolve` runs under spawn_blocking
    pub fn ids(&self) -> Vec<u64> {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut ids: Vec<u64> = entries
            .filter_map(|entry| entry.ok())
            .filter_map(|entry| parse_artifact_name(&entry.file_name().to_string_lossy()))
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Creates the next artifact file and returns its id and the file, opened read-write
    /// (a [`CappedWriter`] reads back the part it moves to its tail buffer).
    ///
    /// Creates the directory (and parents) with mode 0700 if missing. The file is created with
    /// `O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600: an existing file or symlink at the path is
    /// never opened; its id is skipped (another process may share the directory).
    ///
    /// Called on the runtime thread by a sink about to spill: one directory scan of this
    /// session's own directory (once per session) and one `open`; the writes go to the
    /// artifact-writer thread.
    #[allow(clippy::disallowed_methods)]
    pub fn create(&self) -> io::Result<(u64, File)> {
        // A poisoned lock only means another thread panicked mid-allocation; the counter is
        // still a valid lower bound.
        let mut next = self.next_id.lock().unwrap_or_else(|e| e.into_inner());
        DirBuilder::new().recursive(true).mode(0o700).create(&self.dir)?;
        let mut id = match *next {
            Some(id) => id,
            None => self.ids().last().map_or(0, |highest| highest.saturating_add(1)),
        };
        for _ in 0..MAX_CREATE_ATTEMPTS {
            let opened = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(self.path(id));
            match opened {
                Ok(file) => {
                    *next = Some(id.saturating_add(1));
                    return Ok((id, file));
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    id = id.saturating_add(1);
                }
                Err(e) => return Err(e),
            }
        }
        *next = Some(id);
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "no free artifact id in {} after {MAX_CREATE_ATTEMPTS} attempts",
                self.dir.display()
            ),
        ))
    }
}

/// `<digits>.bash.log` → the id.
fn parse_artifact_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(SUFFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Resolves `artifact://<id>` (or a bare `<id>`) to the artifact's full text, or with
/// `#L<a>-<b>` (`#L<a>`) to those lines only (1-based, inclusive; the end is clamped).
///
/// Errors, exact and checked in this order (contract §4.3): no store, empty id, non-numeric id,
/// missing directory, missing file. Anything after the id's first `/` is ignored. The file is
/// opened with `O_NOFOLLOW`, so a symlink planted in the directory is not followed (that is an
/// I/O error). Invalid UTF-8 (which the sink never writes) is replaced with U+FFFD.
///
/// Blocking (an artifact is up to 32 MiB): async callers use spawn_blocking.
#[allow(clippy::disallowed_methods)]
pub fn resolve(store: Option<&ArtifactStore>, url: &str) -> crate::Result<String> {
    let Opened { mut file, range, id, .. } = open_artifact(store, url)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    let text = match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    };
    match range {
        None => Ok(text),
        Some((from, to)) => select_lines(&text, from, to, &id),
    }
}

/// Resolves `artifact://<id>` to the artifact's file, for a reader that reads it itself
/// (Neovim: artifact text never travels through RPC, contract §4.3). Same errors as [`resolve`];
/// the path is a regular file, not a symlink, at the time of the answer.
pub fn resolve_path(store: Option<&ArtifactStore>, url: &str) -> crate::Result<PathBuf> {
    let Opened { file, path, .. } = open_artifact(store, url)?;
    if !file.metadata()?.is_file() {
        return Err(Error::Artifact(format!("{} is not a regular file", path.display())));
    }
    Ok(path)
}

/// An artifact opened by [`open_artifact`]: the file, its path, the `#L` range asked for.
struct Opened {
    file: File,
    path: PathBuf,
    range: Option<(u64, u64)>,
    id: String,
}

// Opens (no read): resolve_path answers Neovim with the path; resolve runs under spawn_blocking.
#[allow(clippy::disallowed_methods)]
fn open_artifact(store: Option<&ArtifactStore>, url: &str) -> crate::Result<Opened> {
    let store =
        store.ok_or_else(|| Error::Artifact("No session - artifacts unavailable".to_owned()))?;
    let rest = url.strip_prefix(SCHEME).unwrap_or(url);
    let (rest, fragment) = match rest.split_once('#') {
        Some((rest, fragment)) => (rest, Some(fragment)),
        None => (rest, None),
    };
    let id = rest.split('/').next().unwrap_or_default();
    if id.is_empty() {
        return Err(Error::Artifact(
            "artifact:// URL requires a numeric ID: artifact://0".to_owned(),
        ));
    }
    if !id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Error::Artifact(format!("artifact:// ID must be numeric, got: {id}")));
    }
    if !store.dir().is_dir() {
        return Err(Error::Artifact("No artifacts directory found".to_owned()));
    }
    let not_found = || {
        let ids = store.ids();
        let available = if ids.is_empty() {
            "none".to_owned()
        } else {
            ids.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
        };
        Error::Artifact(format!("Artifact {id} not found. Available: {available}"))
    };
    // Digits only, so a parse failure can only be overflow: no such artifact.
    let numeric: u64 = id.parse().map_err(|_| not_found())?;
    let path = store.path(numeric);
    let file = match OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(not_found()),
        Err(e) => return Err(e.into()),
    };
    let range = fragment.map(|f| parse_lines(f, id)).transpose()?;
    Ok(Opened { file, path, range, id: id.to_owned() })
}

/// `L<a>` or `L<a>-<b>` (also `L<a>-L<b>`, as GitHub writes it): a 1-based inclusive range.
fn parse_lines(fragment: &str, id: &str) -> crate::Result<(u64, u64)> {
    let bad = || {
        Error::Artifact(format!(
            "Invalid line range in artifact://{id}#{fragment}: expected #L<start> or #L<start>-<end>"
        ))
    };
    let body = fragment.strip_prefix('L').ok_or_else(bad)?;
    let (a, b) = match body.split_once('-') {
        Some((a, b)) => (a, b.strip_prefix('L').unwrap_or(b)),
        None => (body, body),
    };
    let num = |s: &str| -> crate::Result<u64> {
        if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse().map_err(|_| bad())
    };
    let (from, to) = (num(a)?, num(b)?);
    if from == 0 || to < from {
        return Err(bad());
    }
    Ok((from, to))
}

/// Lines `from..=to` of `text` (each with its newline); the end is clamped to the last line.
fn select_lines(text: &str, from: u64, to: u64, id: &str) -> crate::Result<String> {
    let total = text.lines().count() as u64;
    if from > total {
        return Err(Error::Artifact(format!(
            "Artifact {id} has {total} lines: line {from} is past its end"
        )));
    }
    let lines = text.split_inclusive('\n').skip(from as usize - 1).take((to - from + 1) as usize);
    Ok(lines.collect())
}

/// Removes the session artifact directories directly under `root` that have not been touched
/// for longer than `max_age`; returns how many were removed.
///
/// "Touched" is the newest mtime of the directory and its direct entries, so a session that
/// keeps appending to an old artifact is not pruned under its feet. Symlinks (to directories or
/// not) and plain files under `root` are left alone, and removal never follows symlinks out of
/// `root` (`std::fs::remove_dir_all` does not follow them). A missing `root` prunes nothing.
/// Entries that cannot be inspected or removed are logged and skipped.
#[allow(clippy::disallowed_methods)] // once, at start-up, before any command is served
pub fn prune(root: &Path, max_age: Duration) -> io::Result<usize> {
    let entries = match fs::read_dir(root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let now = SystemTime::now();
    let mut removed = 0;
    for entry in entries {
        let entry = entry?;
        // DirEntry::metadata does not traverse symlinks.
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_dir() {
            continue;
        }
        let path = entry.path();
        let Some(touched) = newest_mtime(&path, &meta) else {
            continue;
        };
        let age = now.duration_since(touched).unwrap_or(Duration::ZERO);
        if age <= max_age {
            continue;
        }
        match fs::remove_dir_all(&path) {
            Ok(()) => removed += 1,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "pruning artifacts failed")
            }
        }
    }
    Ok(removed)
}

/// The newest mtime of a directory and its direct entries (not following symlinks).
#[allow(clippy::disallowed_methods)] // part of `prune`
fn newest_mtime(dir: &Path, meta: &fs::Metadata) -> Option<SystemTime> {
    let mut newest = meta.modified().ok()?;
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.filter_map(|e| e.ok()) {
            if let Ok(modified) = entry.metadata().and_then(|m| m.modified()) {
                newest = newest.max(modified);
            }
        }
    }
    Some(newest)
}

/// Where agent-bash keeps its state (session artifacts among it): the platform state dir
/// (`$XDG_STATE_HOME`), else the local data dir, else the temp dir, joined with `agent-bash`.
pub fn state_root() -> PathBuf {
    dirs::state_dir()
        .or_else(dirs::data_local_dir)
        .unwrap_or_else(std::env::temp_dir)
        .join("agent-bash")
}

/// Writes an artifact, bounded by a size cap (contract §4.2 Ours).
///
/// The file gets the stream's first `cap − tail_keep` bytes (the head limit) as they come, up
/// to a 64 KiB write buffer; the next `tail_keep` bytes are held in memory until either
/// [`finish`](Self::finish) writes them (the stream fitted the cap) or the stream passes the
/// cap. Then the head part is cut back to end at a line boundary when one is within 64 KiB
/// before the head limit, else at a character boundary, and the stream's last `tail_keep`
/// bytes are kept in a ring buffer; `finish` appends a line `[… N bytes elided …]` (N = bytes
/// dropped) and the tail, whose start is moved forward to a line (or character) boundary the
/// same way. The artifact thus stays valid UTF-8 when the input is. Holding back the bytes
/// that may become the tail, rather than writing and reading them back, keeps the file writes
/// at the artifact's size. Memory: `tail_keep` + 1 bytes (held bytes, then the ring, in one
/// buffer) plus small buffers.
#[derive(Debug)]
pub struct CappedWriter {
    out: BufWriter<File>,
    cap: u64,
    tail_keep: usize,
    /// Bytes given to the file while under the cap: at most the head limit.
    written: u64,
    /// Bytes given to `write` in all.
    total: u64,
    /// Under the cap: the bytes after the head limit.
    held: Vec<u8>,
    /// Past the cap: the kept head's length and whether it ends with a newline, and the tail.
    over: Option<Over>,
}

#[derive(Debug)]
struct Over {
    head_len: u64,
    head_ends_newline: bool,
    tail: Ring,
}

/// Room for the `[… N bytes elided …]` line and the newline that may precede it (at most
/// 3 + 2 × 3 + 20 digits + 16 ASCII bytes): with it, an artifact never exceeds its cap.
pub const ELISION_RESERVE: u64 = 64;

/// Buffer size of the artifact file writer: sanitized chunks may be single lines.
const WRITE_BUFFER: usize = 64 << 10;

impl CappedWriter {
    /// A writer with the default tail size ([`TAIL_KEEP`]) whose file never exceeds `cap`
    /// bytes: [`ELISION_RESERVE`] bytes of the cap are kept for the elision line.
    pub fn new(file: File, cap: u64) -> Self {
        Self::with_limits(file, cap.saturating_sub(ELISION_RESERVE), TAIL_KEEP)
    }

    /// A writer keeping `tail_keep` bytes of the end past the cap. `tail_keep` is limited to
    /// half the cap, so the first part always gets at least half of it.
    pub fn with_limits(file: File, cap: u64, tail_keep: u64) -> Self {
        let tail_keep = tail_keep.min(cap / 2);
        Self {
            out: BufWriter::with_capacity(WRITE_BUFFER, file),
            cap,
            tail_keep: usize::try_from(tail_keep).unwrap_or(usize::MAX),
            written: 0,
            total: 0,
            held: Vec::new(),
            over: None,
        }
    }

    /// Bytes written so far (before any elision).
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Where the head part ends at the latest.
    fn head_limit(&self) -> u64 {
        self.cap - self.tail_keep as u64
    }

    pub fn write(&mut self, mut data: &[u8]) -> io::Result<()> {
        self.total += data.len() as u64;
        if let Some(over) = &mut self.over {
            over.tail.push(data);
            return Ok(());
        }
        let room = self.head_limit() - self.written;
        if room > 0 {
            // `room` is below `data.len()` whenever it is split, so the cut fits usize.
            let (to_file, rest) = data.split_at((data.len() as u64).min(room) as usize);
            self.out.write_all(to_file)?;
            self.written += to_file.len() as u64;
            data = rest;
        }
        if data.is_empty() {
            return Ok(());
        }
        if self.total <= self.cap {
            if self.held.is_empty() {
                // One allocation: it becomes the ring if the stream passes the cap.
                self.held.reserve_exact(self.tail_keep + 1);
            }
            self.held.extend_from_slice(data);
            return Ok(());
        }
        self.go_over(data)
    }

    /// The stream just passed the cap (`rest` is what follows the held bytes): cut the file
    /// back to its head part and move the stream's end into the ring. The file holds exactly
    /// the head limit's bytes, so the ring needs at most one byte of it (see [`Ring`]).
    fn go_over(&mut self, rest: &[u8]) -> io::Result<()> {
        self.out.flush()?;
        let head_limit = self.head_limit();
        let search_from = head_limit.saturating_sub(BOUNDARY_SEARCH as u64);
        let file = self.out.get_mut();

        // The region to search, plus the byte at the limit: the first one after the file.
        let mut near = Vec::new();
        file.seek(SeekFrom::Start(search_from))?;
        Read::by_ref(file).take(head_limit - search_from).read_to_end(&mut near)?;
        let limit = near.len();
        near.extend(self.held.first().or(rest.first()));
        let cut_in_near = head_cut(&near, limit);
        let cut = search_from + cut_in_near as u64;
        let head_ends_newline = cut_in_near > 0 && near[cut_in_near - 1] == b'\n';

        // The ring keeps one byte more than the tail, as context for finding a line start: the
        // last file byte, unless the head keeps it.
        let context = &near[cut_in_near.max(limit.saturating_sub(1))..limit];
        let mut held = std::mem::take(&mut self.held);
        held.splice(0..0, context.iter().copied());
        let mut tail = Ring::from_vec(held, self.tail_keep + 1);
        tail.push(rest);
        file.set_len(cut)?;
        file.seek(SeekFrom::Start(cut))?;
        self.over = Some(Over { head_len: cut, head_ends_newline, tail });
        Ok(())
    }

    /// Flushes everything; past the cap, writes the elision line and the kept tail.
    pub fn finish(mut self) -> io::Result<()> {
        let Some(over) = self.over.take() else {
            self.out.write_all(&self.held)?;
            return self.out.flush();
        };
        let len = over.tail.len();
        let start = if len <= self.tail_keep {
            // Nothing was evicted: the ring holds everything after the head's cut.
            0
        } else {
            tail_start(&over.tail)
        };
        let tail_len = (len - start) as u64;
        let dropped = self.total - over.head_len - tail_len;
        if dropped > 0 {
            if over.head_len > 0 && !over.head_ends_newline {
                self.out.write_all(b"\n")?;
            }
            writeln!(self.out, "[… {dropped} bytes elided …]")?;
        }
        let (a, b) = over.tail.as_slices();
        if start < a.len() {
            self.out.write_all(&a[start..])?;
            self.out.write_all(b)?;
        } else {
            self.out.write_all(&b[start - a.len()..])?;
        }
        self.out.flush()
    }
}

/// Bytes [`ArtifactWriter`] gathers before handing them to its thread: few hand-offs, large
/// writes.
const HAND_OFF: usize = 256 << 10;

/// Hand-offs queued for the writer thread before [`ArtifactWriter::write`] waits for it; with
/// the one being written and the one being filled this bounds the buffers to four.
const QUEUE: usize = 2;

/// Bytes for the writer thread.
type HandOff = Vec<u8>;

/// A [`CappedWriter`] on its own thread (contract §4.2: the artifact gets every chunk).
///
/// The file is written while the caller goes on reading and sanitizing: writing to the page
/// cache costs about as much as everything else in the output path together. The thread owns
/// the file; it ends, finishing the artifact, when the writer is finished or dropped. Memory:
/// at most four buffers of `HAND_OFF` bytes (or of one `write`, if larger) plus the
/// `CappedWriter`'s tail ring.
///
/// # Caveats
/// A write error surfaces at a later [`write`](Self::write) or at [`finish`](Self::finish),
/// not at the `write` whose bytes failed. Dropping the writer without `finish` leaves the
/// thread to complete the file on its own.
#[derive(Debug)]
pub struct ArtifactWriter {
    /// Bytes not yet handed to the thread.
    pending: Vec<u8>,
    /// `None` once the thread has stopped.
    sender: Option<SyncSender<HandOff>>,
    /// Buffers the thread is done with, for reuse.
    spare: Receiver<Vec<u8>>,
    /// The thread's result: the file's.
    thread: Option<JoinHandle<io::Result<()>>>,
}

impl ArtifactWriter {
    /// Starts the thread writing `file` through a [`CappedWriter`] with this cap.
    pub fn spawn(file: File, cap: u64) -> io::Result<Self> {
        let (sender, receiver) = mpsc::sync_channel::<HandOff>(QUEUE);
        let (give_back, spare) = mpsc::channel();
        let thread =
            std::thread::Builder::new().name("artifact-writer".to_owned()).spawn(move || {
                let mut writer = CappedWriter::new(file, cap);
                for mut buf in receiver {
                    writer.write(&buf)?;
                    buf.clear();
                    // The other end may be gone already; the buffer is then simply freed.
                    let _ = give_back.send(buf);
                }
                writer.finish()
            })?;
        Ok(Self {
            pending: Vec::with_capacity(HAND_OFF),
            sender: Some(sender),
            spare,
            thread: Some(thread),
        })
    }

    /// Appends `data` to the artifact. An error means the thread stopped (it carries the
    /// thread's error); the file then holds the stream up to some earlier point.
    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        self.pending.extend_from_slice(data);
        if self.pending.len() >= HAND_OFF {
            self.hand_off()?;
        }
        Ok(())
    }

    /// Like [`write`](Self::write), for a caller that is done with `text`: a large one is handed
    /// to the thread as it is rather than copied. `text` is left empty, possibly holding another
    /// buffer to reuse.
    pub fn write_owned(&mut self, text: &mut String) -> io::Result<()> {
        if !self.pending.is_empty() || text.len() < HAND_OFF / 4 {
            self.write(text.as_bytes())?;
            text.clear();
            return Ok(());
        }
        // An empty buffer is valid UTF-8, so this never falls back to a new one.
        let spare = String::from_utf8(self.spare_buffer()).unwrap_or_default();
        self.send(std::mem::replace(text, spare).into_bytes())
    }

    /// Writes everything and finishes the artifact (see [`CappedWriter::finish`]).
    pub fn finish(mut self) -> io::Result<()> {
        if !self.pending.is_empty() {
            self.hand_off()?;
        }
        // Closing the channel ends the thread's loop.
        self.sender = None;
        self.join()
    }

    fn hand_off(&mut self) -> io::Result<()> {
        let next = self.spare_buffer();
        let full = std::mem::replace(&mut self.pending, next);
        self.send(full)
    }

    /// An empty buffer: one the thread gave back, else a new one.
    fn spare_buffer(&mut self) -> Vec<u8> {
        self.spare.try_recv().unwrap_or_else(|_| Vec::with_capacity(HAND_OFF))
    }

    fn send(&mut self, full: HandOff) -> io::Result<()> {
        match self.sender.as_ref().map(|sender| sender.send(full)) {
            Some(Ok(())) => Ok(()),
            // The thread hung up: it failed.
            _ => {
                self.sender = None;
                Err(self.join().err().unwrap_or_else(|| io::Error::other("artifact writer ended")))
            }
        }
    }

    fn join(&mut self) -> io::Result<()> {
        match self.thread.take().map(JoinHandle::join) {
            None => Err(io::Error::other("artifact writer already ended")),
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(io::Error::other("artifact writer panicked")),
        }
    }
}

impl Drop for ArtifactWriter {
    fn drop(&mut self) {
        // Not finished: hand over what is left; the thread completes the file on its own.
        if !self.pending.is_empty() {
            let _ = self.hand_off();
        }
    }
}

/// Where to cut the head part, as an index into `near`: the file's bytes from up to
/// [`BOUNDARY_SEARCH`] before the head limit through the byte at the limit (so `near` has
/// `limit + 1` bytes). After the last newline before the limit if any (a line boundary), else at
/// the last character boundary at or before the limit.
fn head_cut(near: &[u8], limit: usize) -> usize {
    if let Some(p) = near[..limit].iter().rposition(|&b| b == b'\n') {
        return p + 1;
    }
    // `near[cut]` is the first byte dropped: it must start a character.
    let mut cut = limit;
    while cut > 0 && near.get(cut).copied().is_some_and(is_utf8_continuation) {
        cut -= 1;
    }
    cut
}

fn is_utf8_continuation(b: u8) -> bool {
    b & 0xC0 == 0x80
}

/// Where the kept tail starts in a full ring whose first byte is context (the byte before the
/// tail): after the first newline within [`BOUNDARY_SEARCH`] bytes, else at the first character
/// boundary after the context byte.
fn tail_start(ring: &Ring) -> usize {
    let search = ring.len().min(BOUNDARY_SEARCH);
    if let Some(p) = (0..search).find(|&i| ring.get(i) == b'\n') {
        return p + 1;
    }
    let mut start = 1;
    while start < ring.len() && is_utf8_continuation(ring.get(start)) {
        start += 1;
    }
    start
}

/// A fixed-size byte ring keeping the last `capacity` bytes pushed.
#[derive(Debug)]
struct Ring {
    buf: Vec<u8>,
    /// Next write position.
    pos: usize,
    filled: usize,
}

impl Ring {
    /// A ring of `capacity` bytes holding `data` (at most `capacity` bytes), reusing its
    /// allocation.
    fn from_vec(mut data: Vec<u8>, capacity: usize) -> Self {
        let capacity = capacity.max(1);
        let filled = data.len().min(capacity);
        data.truncate(filled);
        data.resize(capacity, 0);
        Self { buf: data, pos: filled % capacity, filled }
    }

    fn len(&self) -> usize {
        self.filled
    }

    fn push(&mut self, data: &[u8]) {
        let cap = self.buf.len();
        let data = &data[data.len().saturating_sub(cap)..];
        let first = data.len().min(cap - self.pos);
        self.buf[self.pos..self.pos + first].copy_from_slice(&data[..first]);
        let second = data.len() - first;
        self.buf[..second].copy_from_slice(&data[first..]);
        self.pos = (self.pos + data.len()) % cap;
        self.filled = (self.filled + data.len()).min(cap);
    }

    /// The contents, oldest first, as two slices.
    fn as_slices(&self) -> (&[u8], &[u8]) {
        if self.filled < self.buf.len() {
            (&self.buf[..self.filled], &[])
        } else {
            (&self.buf[self.pos..], &self.buf[..self.pos])
        }
    }

    /// The byte at logical index `i` (oldest is 0); `i < len()`.
    fn get(&self, i: usize) -> u8 {
        let (a, b) = self.as_slices();
        match a.get(i) {
            Some(&byte) => byte,
            None => b.get(i - a.len()).copied().unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;
    use std::os::unix::fs::PermissionsExt;

    fn artifact_error(result: crate::Result<String>) -> String {
        match result {
            Err(Error::Artifact(text)) => text,
            other => panic!("expected an artifact error, got {other:?}"),
        }
    }

    fn mode(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn artifacts_ids_continue_after_the_highest() {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::new(dir.path());
        assert_eq!(store.create().unwrap().0, 0);
        assert_eq!(store.create().unwrap().0, 1);

        let dir = tempfile::tempdir().unwrap();
        for name in ["7.bash.log", "3.bash.log", "99.txt", "x.bash.log", "12"] {
            fs::write(dir.path().join(name), "").unwrap();
        }
        let store = ArtifactStore::new(dir.path());
        assert_eq!(store.ids(), vec![3, 7]);
        assert_eq!(store.create().unwrap().0, 8);
        assert_eq!(store.create().unwrap().0, 9);
        assert_eq!(store.ids(), vec![3, 7, 8, 9]);
    }

    #[test]
    fn artifacts_skip_ids_taken_by_another_process() {
        let dir = tempfile::tempdir().unwrap();
        let ours = ArtifactStore::new(dir.path());
        let theirs = ArtifactStore::new(dir.path());
        assert_eq!(ours.create().unwrap().0, 0);
        assert_eq!(theirs.create().unwrap().0, 1);
        assert_eq!(ours.create().unwrap().0, 2);
    }

    #[test]
    fn artifacts_are_private() {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::new(dir.path().join("state/session/artifacts"));
        let (id, _file) = store.create().unwrap();
        assert_eq!(mode(store.dir()), 0o700);
        assert_eq!(mode(&dir.path().join("state")), 0o700);
        assert_eq!(mode(&store.path(id)), 0o600);
    }

    #[test]
    fn artifacts_never_open_a_planted_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::new(dir.path().join("artifacts"));
        assert_eq!(store.create().unwrap().0, 0);
        let victim = dir.path().join("victim");
        fs::write(&victim, "precious").unwrap();
        std::os::unix::fs::symlink(&victim, store.path(1)).unwrap();
        let (id, mut file) = store.create().unwrap();
        assert_eq!(id, 2, "the symlinked id is skipped");
        file.write_all(b"output").unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        // Resolving it does not follow it either.
        assert!(matches!(resolve(Some(&store), "artifact://1"), Err(Error::Io(_))));
    }

    #[test]
    fn artifacts_resolve_errors_are_exact() {
        assert_eq!(
            artifact_error(resolve(None, "artifact://1")),
            "No session - artifacts unavailable"
        );
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::new(dir.path().join("artifacts"));
        assert_eq!(
            artifact_error(resolve(Some(&store), "artifact://")),
            "artifact:// URL requires a numeric ID: artifact://0"
        );
        assert_eq!(
            artifact_error(resolve(Some(&store), "artifact://abc")),
            "artifact:// ID must be numeric, got: abc"
        );
        assert_eq!(
            artifact_error(resolve(Some(&store), "artifact://3")),
            "No artifacts directory found"
        );
        fs::create_dir(store.dir()).unwrap();
        assert_eq!(
            artifact_error(resolve(Some(&store), "artifact://3")),
            "Artifact 3 not found. Available: none"
        );
        for id in [10, 2, 1] {
            fs::write(store.path(id), "").unwrap();
        }
        assert_eq!(
            artifact_error(resolve(Some(&store), "artifact://3")),
            "Artifact 3 not found. Available: 1, 2, 10"
        );
        assert_eq!(
            artifact_error(resolve(Some(&store), "artifact://99999999999999999999999")),
            "Artifact 99999999999999999999999 not found. Available: 1, 2, 10"
        );
    }

    #[test]
    fn artifacts_resolve_to_the_full_text() {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::new(dir.path());
        let (id, mut file) = store.create().unwrap();
        file.write_all("full\ntext é\n".as_bytes()).unwrap();
        assert_eq!(resolve(Some(&store), &format!("artifact://{id}")).unwrap(), "full\ntext é\n");
        assert_eq!(resolve(Some(&store), "0").unwrap(), "full\ntext é\n");
        fs::write(store.path(1), b"bad \xff byte").unwrap();
        assert_eq!(resolve(Some(&store), "artifact://1").unwrap(), "bad \u{fffd} byte");

        // Line ranges.
        let (id, mut file) = store.create().unwrap();
        file.write_all(b"one\ntwo\nthree\nfour").unwrap();
        let url = |f: &str| format!("artifact://{id}#{f}");
        assert_eq!(resolve(Some(&store), &url("L2-3")).unwrap(), "two\nthree\n");
        assert_eq!(resolve(Some(&store), &url("L2-L3")).unwrap(), "two\nthree\n");
        assert_eq!(resolve(Some(&store), &url("L4")).unwrap(), "four");
        assert_eq!(resolve(Some(&store), &url("L3-99")).unwrap(), "three\nfour");
        assert_eq!(
            artifact_error(resolve(Some(&store), &url("L5"))),
            format!("Artifact {id} has 4 lines: line 5 is past its end")
        );
        for bad in ["", "L", "L0", "L3-2", "Lx", "10", "L1-"] {
            assert_eq!(
                artifact_error(resolve(Some(&store), &url(bad))),
                format!("Invalid line range in artifact://{id}#{bad}: expected #L<start> or #L<start>-<end>"),
                "{bad:?}"
            );
        }
        // The id's errors come first, exact as without a range.
        assert_eq!(
            artifact_error(resolve(Some(&store), "artifact://abc#L1")),
            "artifact:// ID must be numeric, got: abc"
        );
        assert_eq!(
            artifact_error(resolve(Some(&store), "artifact://#L1")),
            "artifact:// URL requires a numeric ID: artifact://0"
        );
    }

    #[test]
    fn artifacts_prune_old_session_directories() {
        let root = tempfile::tempdir().unwrap();
        let week = Duration::from_secs(7 * 24 * 3600);
        let old_time = SystemTime::now() - 2 * week;
        let age = |path: &Path| {
            File::open(path).unwrap().set_modified(old_time).unwrap();
        };
        for name in ["old", "new", "old-with-fresh-file"] {
            fs::create_dir(root.path().join(name)).unwrap();
            fs::write(root.path().join(name).join("0.bash.log"), "x").unwrap();
        }
        age(&root.path().join("old/0.bash.log"));
        age(&root.path().join("old"));
        age(&root.path().join("old-with-fresh-file"));
        // A symlink to an old directory elsewhere is neither followed nor removed.
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("keep"), "x").unwrap();
        age(&outside.path().join("keep"));
        age(outside.path());
        std::os::unix::fs::symlink(outside.path(), root.path().join("link")).unwrap();

        assert_eq!(prune(root.path(), week).unwrap(), 1);
        assert!(!root.path().join("old").exists());
        assert!(root.path().join("new").exists());
        assert!(root.path().join("old-with-fresh-file").exists());
        assert!(outside.path().join("keep").exists());
        assert_eq!(prune(&root.path().join("missing"), week).unwrap(), 0);
    }

    #[test]
    fn artifacts_state_root_is_named_for_the_tool() {
        assert!(state_root().ends_with("agent-bash"));
    }

    fn capped(chunks: &[&[u8]], cap: u64, tail_keep: u64) -> String {
        let mut file = tempfile::tempfile().unwrap();
        let mut writer = CappedWriter::with_limits(file.try_clone().unwrap(), cap, tail_keep);
        for chunk in chunks {
            writer.write(chunk).unwrap();
        }
        writer.finish().unwrap();
        let mut text = String::new();
        file.seek(SeekFrom::Start(0)).unwrap();
        file.read_to_string(&mut text).unwrap();
        text
    }

    #[test]
    fn artifacts_below_the_cap_keep_everything() {
        let text = "0123456789\n".repeat(10);
        assert_eq!(capped(&[text.as_bytes()], 110, 30), text);
        let big = "x".repeat(100_000);
        assert_eq!(capped(&[big.as_bytes()], DEFAULT_ARTIFACT_CAP, TAIL_KEEP), big);
    }

    #[test]
    fn artifacts_past_the_cap_keep_head_and_tail_lines() {
        let lines: Vec<String> = (0..20).map(|i| format!("line{i:05}\n")).collect();
        let chunks: Vec<&[u8]> = lines.iter().map(|l| l.as_bytes()).collect();
        let want =
            format!("{}[… 100 bytes elided …]\n{}", lines[..7].concat(), lines[17..].concat());
        assert_eq!(capped(&chunks, 100, 30), want);
        // The same stream in one write.
        assert_eq!(capped(&[lines.concat().as_bytes()], 100, 30), want);
    }

    #[test]
    fn artifacts_past_the_cap_cut_at_character_boundaries() {
        let text = "é".repeat(200);
        let want = format!("{}\n[… 300 bytes elided …]\n{}", "é".repeat(35), "é".repeat(15));
        assert_eq!(capped(&[text.as_bytes()], 101, 30), want);
    }

    #[test]
    fn artifacts_past_a_tiny_cap_stay_utf8() {
        // A cap of 1 leaves no room for a tail; the head cannot end inside "é" either.
        let text = "é".repeat(10);
        assert_eq!(capped(&[text.as_bytes()], 1, TAIL_KEEP), "[… 20 bytes elided …]\n");
    }

    /// What an [`ArtifactWriter`] leaves in the file.
    fn threaded(chunks: &[&str], cap: u64, owned: bool) -> String {
        let mut file = tempfile::tempfile().unwrap();
        let mut writer = ArtifactWriter::spawn(file.try_clone().unwrap(), cap).unwrap();
        for chunk in chunks {
            if owned {
                let mut text = (*chunk).to_owned();
                writer.write_owned(&mut text).unwrap();
                assert!(text.is_empty());
            } else {
                writer.write(chunk.as_bytes()).unwrap();
            }
        }
        writer.finish().unwrap();
        let mut text = String::new();
        file.seek(SeekFrom::Start(0)).unwrap();
        file.read_to_string(&mut text).unwrap();
        text
    }

    #[test]
    fn artifacts_writer_thread_writes_what_the_capped_writer_would() {
        let small: Vec<String> = (0..2000).map(|i| format!("line {i}\n")).collect();
        let small: Vec<&str> = small.iter().map(String::as_str).collect();
        let big = "0123456789abcdef\n".repeat(HAND_OFF / 8);
        let mixed = [big.as_str(), "tail\n", big.as_str(), "end"];
        for chunks in [&small[..], &mixed[..]] {
            for cap in [DEFAULT_ARTIFACT_CAP, 10_000, 100_000] {
                let bytes: Vec<&[u8]> = chunks.iter().map(|c| c.as_bytes()).collect();
                // `new` keeps room for the elision line, so the file never exceeds the cap.
                let want = capped(&bytes, cap - ELISION_RESERVE, TAIL_KEEP);
                assert!(want.len() as u64 <= cap);
                assert_eq!(threaded(chunks, cap, false), want, "cap {cap}");
                assert_eq!(threaded(chunks, cap, true), want, "cap {cap}, owned");
            }
        }
    }

    proptest! {
        #[test]
        fn artifacts_capped_writer_keeps_a_valid_prefix_and_suffix(
            pieces in prop::collection::vec(
                prop_oneof![Just("ab"), Just("\n"), Just("é"), Just("😀"), Just("0123456789")],
                0..200,
            ),
            cap in 8u64..300,
            tail_keep in 0u64..100,
        ) {
            let text = pieces.concat();
            let chunks: Vec<&[u8]> = pieces.iter().map(|p| p.as_bytes()).collect();
            let out = capped(&chunks, cap, tail_keep);
            if text.len() as u64 <= cap {
                prop_assert_eq!(out, text);
            } else {
                let marker_at = out.find("[… ").unwrap();
                let head = &out[..marker_at];
                let rest = &out[marker_at..];
                let marker_end = rest.find(" bytes elided …]\n").unwrap();
                let dropped: usize = rest["[… ".len()..marker_end].parse().unwrap();
                let tail = &rest[marker_end + " bytes elided …]\n".len()..];
                // A newline is inserted before the marker when the head ends mid-line.
                let head = if head.len() + dropped + tail.len() == text.len() + 1 {
                    head.strip_suffix('\n').unwrap()
                } else {
                    head
                };
                prop_assert!(text.starts_with(head));
                prop_assert!(text.ends_with(tail));
                prop_assert_eq!(head.len() + dropped + tail.len(), text.len());
                prop_assert!(head.len() as u64 <= cap - tail_keep.min(cap / 2));
                prop_assert!(tail.len() as u64 <= tail_keep.min(cap / 2));
            }
        }
    }
}
