//! The shadow git object store of one project (contract §13), and the blocking work on it.
//!
//! `<state>/changes/<name>-<hash>/` is a bare git directory of our own. Every git we run gets
//! `GIT_DIR` = that directory and `GIT_WORK_TREE` = the project root, no system or global
//! config (so no hooks, fsmonitor, filters or aliases of the user's apply), and attributes that
//! turn every conversion off (`info/attributes`), so a file is stored byte for byte. Ignore rules
//! stay the user's: the project's `.gitignore` files are read from the work tree, its
//! `info/exclude` is copied into ours, and the user's `core.excludesFile` is named in our config.
//! The project's own `.git` is only ever read (to find `info/exclude`), never written.
//!
//! A snapshot is `git add -A` into our private index, whose entries (path, mode, blob id) are
//! then read straight from the index file: no tree objects, one process per snapshot. The
//! index keeps the stat data of every file between calls, so only files whose stat changed are
//! hashed again. Files changed in place are read without `git add` ([`super::quick`]); the
//! index is then older than the tree in the folders read so, which the next `git add` names.
//!
//! Everything here blocks: it runs under `spawn_blocking` (see [`super`]).

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use super::ChangesError;
use std::process::{Command, Stdio};

/// The stat data a snapshot keeps per file, as git's index keeps it (32 bits each); all zero:
/// unknown (the file is read the next time its folder changes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stat {
    ctime: [u32; 2],
    mtime: [u32; 2],
    dev: u32,
    ino: u32,
    size: u32,
}

impl Stat {
    /// From the first 40 bytes of an index entry, unless the entry is racily clean (changed
    /// at or after the index was written, `index_mtime`): git itself checks those again.
    pub fn of_index(head: &[u8], index_mtime: (u32, u32)) -> Stat {
        let be =
            |at: usize| u32::from_be_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
        let s = Stat {
            ctime: [be(0), be(4)],
            mtime: [be(8), be(12)],
            dev: be(16),
            ino: be(20),
            size: be(36),
        };
        if (s.mtime[0], s.mtime[1]) >= index_mtime {
            return Stat::default();
        }
        s
    }

    pub(super) fn of(st: &rustix::fs::Stat) -> Stat {
        // Truncated to 32 bits, as git's index keeps them.
        Stat {
            ctime: [st.st_ctime as u32, st.st_ctime_nsec as u32],
            mtime: [st.st_mtime as u32, st.st_mtime_nsec as u32],
            dev: st.st_dev as u32,
            ino: st.st_ino as u32,
            size: st.st_size as u32,
        }
    }

    pub(super) fn known(&self) -> bool {
        *self != Stat::default()
    }
}

/// One file as a snapshot saw it: git mode (`0o100644`, `0o100755`, `0o120000` for a symlink,
/// `0o160000` for a nested repository), blob id and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Entry {
    pub mode: u32,
    pub oid: [u8; 20],
    pub size: u32,
}

impl Entry {
    /// Same content and mode (the size is stat data, not identity).
    pub fn same(&self, other: &Entry) -> bool {
        self.mode == other.mode && self.oid == other.oid
    }

    pub fn oid_hex(&self) -> String {
        self.oid.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// A path in a [`Tree`]: shared with the trees after it that hold it too, so that a
/// snapshot changing one file copies no path (at 10 000 files, the copies and their memory were
/// most of an engine's work between snapshots of eight agents).
pub type Name = std::sync::Arc<[u8]>;

/// The project's non-ignored files at one moment, sorted by path (bytes, as git sorts them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tree {
    pub entries: Vec<(Name, Entry)>,
    /// Each entry's stat data when known (the same length as `entries`, or empty): what
    /// [`super::quick`] compares a file with before it reads it again.
    pub stats: Vec<Stat>,
}

impl Tree {
    pub fn get(&self, path: &[u8]) -> Option<&Entry> {
        self.entries.binary_search_by(|(p, _)| p[..].cmp(path)).ok().map(|i| &self.entries[i].1)
    }

    /// Some file of the tree lies in directory `dir` (relative, not empty).
    pub fn holds_dir(&self, dir: &[u8]) -> bool {
        let mut prefix = dir.to_vec();
        prefix.push(b'/');
        let i = self.entries.partition_point(|(p, _)| p[..] < prefix[..]);
        self.entries.get(i).is_some_and(|(p, _)| p.starts_with(&prefix))
    }

    pub fn total_bytes(&self) -> u64 {
        self.entries.iter().map(|(_, e)| u64::from(e.size)).sum()
    }
}

/// One path whose state differs between two trees.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Delta {
    pub path: Vec<u8>,
    pub before: Option<Entry>,
    pub after: Option<Entry>,
    /// It changed while another run in the project was going on too (the receipt engine's
    /// mark, see [`super::engine`]): either run may have changed it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub overlap: bool,
}

/// The paths that differ between `a` and `b`, in path order (a merge of two sorted lists).
pub fn diff(a: &Tree, b: &Tree) -> Vec<Delta> {
    if std::ptr::eq(a, b) {
        return Vec::new();
    }
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < a.entries.len() || j < b.entries.len() {
        let order = match (a.entries.get(i), b.entries.get(j)) {
            // Most paths are shared by consecutive trees: no bytes to compare.
            (Some((pa, _)), Some((pb, _))) if std::sync::Arc::ptr_eq(pa, pb) => {
                std::cmp::Ordering::Equal
            }
            (Some((pa, _)), Some((pb, _))) => pa.cmp(pb),
            (Some(_), None) => std::cmp::Ordering::Less,
            _ => std::cmp::Ordering::Greater,
        };
        match order {
            std::cmp::Ordering::Less => {
                let (p, e) = &a.entries[i];
                out.push(Delta { path: p.to_vec(), before: Some(*e), after: None, overlap: false });
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                let (p, e) = &b.entries[j];
                out.push(Delta { path: p.to_vec(), before: None, after: Some(*e), overlap: false });
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                let ((p, ea), (_, eb)) = (&a.entries[i], &b.entries[j]);
                if !ea.same(eb) {
                    out.push(Delta {
                        path: p.to_vec(),
                        before: Some(*ea),
                        after: Some(*eb),
                        overlap: false,
                    });
                }
                i += 1;
                j += 1;
            }
        }
    }
    out
}

/// Reads the entries of a git index file (versions 2, 3 and 4, SHA-1), stage 0 only.
pub fn parse_index(data: &[u8]) -> Result<Vec<(Name, Entry)>, ChangesError> {
    parse_index_stats(data, (0, 0)).map(|t| t.entries)
}

/// The tree of an index file written at `mtime` (seconds, nanoseconds), with each entry's
/// stat data (unknown for the racily clean ones, see [`Stat::of_index`]).
pub fn parse_index_stats(data: &[u8], mtime: (u32, u32)) -> Result<Tree, ChangesError> {
    let bad = ChangesError::Index;
    if data.len() < 12 || &data[..4] != b"DIRC" {
        return Err(bad("no DIRC header"));
    }
    let be32 = |at: usize| -> Result<u32, ChangesError> {
        data.get(at..at + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(|| bad("entry cut short"))
    };
    let version = be32(4)?;
    if !(2..=4).contains(&version) {
        return Err(ChangesError::IndexVersion(version));
    }
    let count = be32(8)? as usize;
    let mut entries = Vec::with_capacity(count.min(1 << 20));
    let mut stats = Vec::with_capacity(count.min(1 << 20));
    let mut at = 12;
    let mut previous: Vec<u8> = Vec::new();
    for _ in 0..count {
        let start = at;
        let mode = be32(start + 24)?;
        let size = be32(start + 36)?;
        let oid_bytes = data.get(start + 40..start + 60).ok_or_else(|| bad("entry cut short"))?;
        let mut oid = [0u8; 20];
        oid.copy_from_slice(oid_bytes);
        let flags = data
            .get(start + 60..start + 62)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
            .ok_or_else(|| bad("entry cut short"))?;
        let mut name_at = start + 62;
        if version >= 3 && flags & 0x4000 != 0 {
            name_at += 2;
        }
        let path = if version == 4 {
            // Prefix compression: a varint of bytes to drop from the previous path, then the
            // rest of the name up to a NUL; no padding.
            let (drop, used) =
                varint(data.get(name_at..).unwrap_or(&[])).ok_or_else(|| bad("bad path prefix"))?;
            let rest_at = name_at + used;
            let nul = memchr::memchr(0, data.get(rest_at..).unwrap_or(&[]))
                .ok_or_else(|| bad("path without end"))?;
            let keep = previous.len().checked_sub(drop).ok_or_else(|| bad("bad path prefix"))?;
            let mut path = previous[..keep].to_vec();
            path.extend_from_slice(&data[rest_at..rest_at + nul]);
            at = rest_at + nul + 1;
            path
        } else {
            let nul = memchr::memchr(0, data.get(name_at..).unwrap_or(&[]))
                .ok_or_else(|| bad("path without end"))?;
            let path = data[name_at..name_at + nul].to_vec();
            let len = name_at - start + nul;
            at = start + ((len + 8) & !7);
            path
        };
        previous.clone_from(&path);
        let stage = (flags >> 12) & 3;
        if stage == 0 {
            entries.push((Name::from(path), Entry { mode, oid, size }));
            let head = data.get(start..start + 40).ok_or_else(|| bad("entry cut short"))?;
            stats.push(Stat::of_index(head, mtime));
        }
    }
    Ok(Tree { entries, stats })
}

/// git's offset varint (index v4): 7 bits a byte, each continuation adding one.
fn varint(data: &[u8]) -> Option<(usize, usize)> {
    let mut value: usize = 0;
    for (i, &b) in data.iter().enumerate().take(10) {
        if i > 0 {
            value = value.checked_add(1)?.checked_shl(7)?;
        }
        value |= usize::from(b & 0x7f);
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// Where the shadow store of `root` lives under `base`: `<base>/<name>-<hash of the path>`.
pub fn shadow_dir(base: &Path, root: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    // FNV-1a: stable across builds (std's hasher makes no such promise).
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in root.as_os_str().as_bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let name: String = root
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "root".into())
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' })
        .take(40)
        .collect();
    base.join(format!("{name}-{hash:016x}"))
}

/// How git is run for one project.
#[derive(Debug, Clone)]
pub struct Git {
    pub bin: PathBuf,
    pub shadow: PathBuf,
    pub root: PathBuf,
}

impl Git {
    /// A git command on the shadow store with the project as work tree, isolated from the
    /// user's and the project's configuration and from `GIT_*` variables of our environment.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.bin);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("GIT_") {
                cmd.env_remove(&k);
            }
        }
        cmd.env("GIT_DIR", &self.shadow)
            .env("GIT_WORK_TREE", &self.root)
            .env("GIT_INDEX_FILE", self.shadow.join("index"))
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_ATTR_NOSYSTEM", "1")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_NO_REPLACE_OBJECTS", "1")
            .env("GIT_LITERAL_PATHSPECS", "1")
            .env("LC_ALL", "C")
            // Only a system or global config or the command line may set it; the work tree
            // may belong to another user and we only read it.
            .args(["-c", "safe.directory=*"])
            .current_dir(&self.root)
            .stdin(Stdio::null());
        // What git writes in the store (objects, index, refs) is the user's alone, whatever
        // the umask (contract §13); the store never sets core.sharedRepository.
        // SAFETY: umask(2) is async-signal-safe and cannot fail; nothing else runs in the hook.
        unsafe {
            cmd.pre_exec(|| {
                libc::umask(0o077);
                Ok(())
            });
        }
        cmd
    }
}

/// Runs a command to the end and returns its output. The child is recorded as owned
/// ([`crate::shell::procs::spawn_owned`]), so the backend's reaper of adopted orphans never
/// takes its exit status.
pub fn output_owned(mut cmd: Command) -> std::io::Result<std::process::Output> {
    let child = crate::shell::procs::spawn_owned(|| cmd.spawn(), |c| Some(c.id() as i32))?;
    let pid = child.id() as i32;
    let out = child.wait_with_output();
    crate::shell::procs::disown_child(pid);
    out
}

/// Runs `cmd` with `input` on its stdin (written from a thread of its own, so a full output
/// pipe cannot block the writer) and returns its output. The child is owned, as in
/// [`output_owned`].
pub fn output_with_input(
    mut cmd: Command,
    input: Vec<u8>,
) -> Result<std::process::Output, ChangesError> {
    cmd.stdin(Stdio::piped());
    let mut child = crate::shell::procs::spawn_owned(|| cmd.spawn(), |c| Some(c.id() as i32))
        .map_err(ChangesError::RunGit)?;
    let pid = child.id() as i32;
    let mut stdin = child.stdin.take().ok_or(ChangesError::GitStdin)?;
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output();
    crate::shell::procs::disown_child(pid);
    let _ = writer.join();
    out.map_err(ChangesError::GitWait)
}

/// Creates the shadow store when missing: a bare repository with our config and attributes.
/// `excludes_file` is the user's `core.excludesFile`, when set.
pub fn init(git: &Git, excludes_file: Option<&Path>) -> Result<(), ChangesError> {
    let shadow = &git.shadow;
    if shadow.join("config").is_file() && shadow.join("objects").is_dir() {
        return Ok(());
    }
    // Private (contract §13): the store holds copies of the project's files.
    use crate::shell::rundir::{private_dirs, write_private};
    private_dirs(&shadow.join("info"))
        .and_then(|()| private_dirs(&shadow.join("objects")))
        .and_then(|()| private_dirs(&shadow.join("refs")))
        .map_err(|source| ChangesError::File { what: "create", path: shadow.clone(), source })?;
    let mut config = String::from(
        "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tfilemode = true\n\
         \tsymlinks = true\n\tignorecase = false\n\tautocrlf = false\n\tsafecrlf = false\n\
         \tfsmonitor = false\n\tuntrackedCache = false\n\thooksPath = /dev/null\n\
         \tquotePath = false\n\tpreloadIndex = true\n\tsplitIndex = false\n\
         \tsparseCheckout = false\n\tlogAllRefUpdates = false\n",
    );
    if let Some(f) = excludes_file {
        // git's config quoting: backslashes and double quotes escaped inside quotes.
        let quoted = f.to_string_lossy().replace('\\', "\\\\").replace('"', "\\\"");
        config.push_str(&format!("\texcludesFile = \"{quoted}\"\n"));
    }
    config.push_str(
        "[gc]\n\tauto = 0\n[index]\n\tversion = 4\n\tskipHash = true\n\
         [advice]\n\taddEmbeddedRepo = false\n\taddIgnoredFile = false\n",
    );
    // No conversion of any kind: what is stored is what is on disk, and what undo writes back.
    let attributes = "* -text -filter -ident !eol !working-tree-encoding\n";
    write_private(&shadow.join("info/attributes"), attributes.as_bytes())
        .and_then(|()| write_private(&shadow.join("HEAD"), b"ref: refs/heads/receipts\n"))
        .and_then(|()| write_private(&shadow.join("root"), git.root.as_os_str().as_encoded_bytes()))
        // Written last: its presence says the store is complete.
        .and_then(|()| write_private(&shadow.join("config"), config.as_bytes()))
        .map_err(|source| ChangesError::File { what: "write", path: shadow.clone(), source })
}

/// The user's ignore settings of a project, read once with the user's own git: their
/// `core.excludesFile` and (in a git project) the path of its `info/exclude`.
pub fn user_ignores(bin: &Path, root: &Path, is_git: bool) -> (Option<PathBuf>, Option<PathBuf>) {
    let run = |args: &[&str]| -> Option<PathBuf> {
        let mut cmd = Command::new(bin);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("GIT_") {
                cmd.env_remove(&k);
            }
        }
        cmd.args(args)
            .current_dir(root)
            .env("GIT_OPTIONAL_LOCKS", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let out = output_owned(cmd).ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        let text = text.trim_end_matches('\n');
        (out.status.success() && !text.is_empty()).then(|| PathBuf::from(text))
    };
    let excludes = run(&["config", "--path", "--get", "core.excludesFile"]);
    let info = if is_git {
        run(&["rev-parse", "--path-format=absolute", "--git-path", "info/exclude"])
    } else {
        None
    };
    (excludes, info)
}

/// Brings our `info/exclude` up to date: the project's own `info/exclude`, and the state
/// directory when it lies inside the project (our store must never snapshot itself).
/// Writes only when the content changed, and says whether it did.
// Under spawn_blocking, as every call into the store (changes.rs).
#[allow(clippy::disallowed_methods)]
pub fn sync_excludes(
    shadow: &Path,
    project_exclude: Option<&Path>,
    extra: &[String],
) -> Result<bool, ChangesError> {
    let mut want = Vec::new();
    if let Some(p) = project_exclude {
        if let Ok(bytes) = std::fs::read(p) {
            want.extend_from_slice(&bytes);
            want.push(b'\n');
        }
    }
    for line in extra {
        want.extend_from_slice(line.as_bytes());
        want.push(b'\n');
    }
    let path = shadow.join("info/exclude");
    if std::fs::read(&path).ok().as_deref() == Some(want.as_slice()) {
        return Ok(false);
    }
    crate::shell::rundir::write_private(&path, &want)
        .map(|()| true)
        .map_err(|source| ChangesError::File { what: "write", path, source })
}

/// Reads the snapshot `git add -A` left in our index.
// Under spawn_blocking, as every call into the store (changes.rs).
#[allow(clippy::disallowed_methods)]
pub fn read_index(shadow: &Path) -> Result<Tree, ChangesError> {
    // `git add -A` of an empty tree writes no index: an empty snapshot.
    use std::io::Read;
    let mut file = match std::fs::File::open(shadow.join("index")) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Tree::default()),
        Err(e) => return Err(ChangesError::ReadIndex(e)),
    };
    let st = rustix::fs::fstat(&file).map_err(|e| ChangesError::ReadIndex(e.into()))?;
    let mut data = Vec::with_capacity(st.st_size as usize);
    file.read_to_end(&mut data).map_err(ChangesError::ReadIndex)?;
    parse_index_stats(&data, (st.st_mtime as u32, st.st_mtime_nsec as u32))
}

/// Removes a lock a killed git left behind (only called while we hold the store's lock).
// Under spawn_blocking, as every call into the store (changes.rs).
#[allow(clippy::disallowed_methods)]
pub fn clear_stale_lock(shadow: &Path) {
    let _ = std::fs::remove_file(shadow.join("index.lock"));
}

/// Takes the store's lock file (`flock`), shared with other agent-bash processes, polling
/// until `deadline`. The lock goes with the returned file.
// Under spawn_blocking, as every call into the store (changes.rs).
#[allow(clippy::disallowed_methods)]
pub fn lock(shadow: &Path, deadline: std::time::Instant) -> Result<std::fs::File, ChangesError> {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(shadow.join("agent-bash.lock"))
        .map_err(|source| ChangesError::File {
            what: "open the lock of",
            path: shadow.to_path_buf(),
            source,
        })?;
    loop {
        // SAFETY: flock on a file descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(file);
        }
        if std::time::Instant::now() >= deadline {
            return Err(ChangesError::LockedElsewhere);
        }
        #[allow(clippy::disallowed_methods)]
        // under spawn_blocking; a lock held by another process
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// The content of blobs, by id (`git cat-file --batch`), in the order asked.
pub fn blobs(git: &Git, oids: &[String]) -> Result<Vec<Vec<u8>>, ChangesError> {
    if oids.is_empty() {
        return Ok(Vec::new());
    }
    let mut cmd = git.command();
    cmd.args(["cat-file", "--batch"]).stdout(Stdio::piped()).stderr(Stdio::null());
    let mut input = String::new();
    for oid in oids {
        input.push_str(oid);
        input.push('\n');
    }
    let out = output_with_input(cmd, input.into_bytes())
        .map_err(|e| ChangesError::CatFile(Box::new(e)))?;
    let data = out.stdout;
    let mut blobs = Vec::with_capacity(oids.len());
    let mut at = 0;
    for oid in oids {
        let nl = memchr::memchr(b'\n', &data[at..]).ok_or(ChangesError::CatFileShort)?;
        let header = String::from_utf8_lossy(&data[at..at + nl]).into_owned();
        at += nl + 1;
        let mut words = header.split(' ');
        let (_, kind, size) = (words.next(), words.next(), words.next());
        if kind != Some("blob") {
            return Err(ChangesError::BlobMissing { oid: oid.clone(), header });
        }
        let size: usize = size.and_then(|s| s.parse().ok()).ok_or(ChangesError::CatFileSize)?;
        let body = data.get(at..at + size).ok_or(ChangesError::CatFileShort)?;
        blobs.push(body.to_vec());
        at += size + 1;
    }
    Ok(blobs)
}

/// Why a path of the project cannot be reached beneath its root without following a link.
#[derive(Debug)]
pub enum Reach {
    /// This part of the path (relative to the root) is a symbolic link or not a folder.
    Blocked(PathBuf),
    Failed(ChangesError),
}

/// The project root, opened once: every path of an undo is resolved beneath it, one component
/// at a time, without following symbolic links (contract §13), so nothing outside it is written
/// whatever links the project holds (a link the agent or the user put where a folder was).
pub struct Beneath {
    root: OwnedFd,
}

/// A path's parent folders, opened from the root down (the last one holds the path).
struct Parents {
    dirs: Vec<OwnedFd>,
    names: Vec<OsString>,
}

impl Parents {
    /// The folder that holds the path (`dirs` always starts with the root).
    fn parent(&self) -> BorrowedFd<'_> {
        self.dirs[self.dirs.len() - 1].as_fd()
    }
}

/// How a folder is opened to reach what lies in it: Linux's `O_PATH` (no read permission
/// needed, nothing read); other systems, which lack it, open it for reading.
#[cfg(target_os = "linux")]
const DIR_OPEN: OFlags = OFlags::PATH;
#[cfg(not(target_os = "linux"))]
const DIR_OPEN: OFlags = OFlags::RDONLY;

const DIR_FLAGS: OFlags =
    DIR_OPEN.union(OFlags::DIRECTORY).union(OFlags::NOFOLLOW).union(OFlags::CLOEXEC);

impl Beneath {
    pub fn open(root: &Path) -> Result<Beneath, ChangesError> {
        // The root itself is the user's choice (it may be reached through a link).
        let root =
            rustix::fs::open(root, DIR_OPEN | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
                .map_err(|errno| ChangesError::Beneath {
                what: "cannot open",
                path: root.into(),
                errno,
            })?;
        Ok(Beneath { root })
    }

    /// Opens the folders holding `rel`, without following links; `create` makes the missing
    /// ones (`Ok(None)` without it: a folder is missing, so nothing is in the way).
    fn walk(&self, rel: &Path, create: bool) -> Result<Option<(Parents, OsString)>, Reach> {
        let mut names = Vec::new();
        for c in rel.components() {
            match c {
                Component::Normal(n) => names.push(n.to_os_string()),
                _ => return Err(Reach::Blocked(rel.to_path_buf())),
            }
        }
        let Some(last) = names.pop() else { return Err(Reach::Blocked(rel.to_path_buf())) };
        let root = rustix::fs::openat(&self.root, ".", DIR_FLAGS, Mode::empty())
            .map_err(|e| Reach::Failed(ChangesError::OpenProject(e)))?;
        let mut parents = Parents { dirs: vec![root], names: Vec::new() };
        let mut so_far = PathBuf::new();
        for name in names {
            so_far.push(&name);
            let dir = parents.parent();
            let opened = match rustix::fs::openat(dir, &name, DIR_FLAGS, Mode::empty()) {
                Err(Errno::NOENT) if create => {
                    match rustix::fs::mkdirat(dir, &name, Mode::from_raw_mode(0o777)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(errno) => {
                            return Err(Reach::Failed(ChangesError::Beneath {
                                what: "cannot create the folder",
                                path: so_far,
                                errno,
                            }))
                        }
                    }
                    rustix::fs::openat(dir, &name, DIR_FLAGS, Mode::empty())
                }
                other => other,
            };
            match opened {
                Ok(fd) => {
                    parents.dirs.push(fd);
                    parents.names.push(name);
                }
                Err(Errno::NOENT) => return Ok(None),
                Err(Errno::NOTDIR | Errno::LOOP) => return Err(Reach::Blocked(so_far)),
                Err(errno) => {
                    return Err(Reach::Failed(ChangesError::Beneath {
                        what: "cannot open",
                        path: so_far,
                        errno,
                    }))
                }
            }
        }
        Ok(Some((parents, last)))
    }

    /// Whether `rel` can be restored without going through a link: `Err(Blocked)` names the
    /// part of it that is a link (or a file) where a folder belongs.
    pub fn check(&self, rel: &Path) -> Result<(), Reach> {
        self.walk(rel, false).map(drop)
    }

    /// Puts one path back to `entry` (its content and mode), or removes it when `entry` is
    /// `None`. Folders left empty by a removal are removed up to the root.
    pub fn restore(&self, rel: &Path, entry: Option<(&Entry, &[u8])>) -> Result<(), ChangesError> {
        let fail = |what: &'static str, errno: Errno| ChangesError::Beneath {
            what,
            path: rel.to_path_buf(),
            errno,
        };
        let reach = |r: Reach| match r {
            Reach::Blocked(p) => ChangesError::Blocked(p),
            Reach::Failed(e) => e,
        };
        match entry {
            None => {
                let Some((parents, name)) = self.walk(rel, false).map_err(reach)? else {
                    return Ok(());
                };
                match rustix::fs::unlinkat(parents.parent(), &name, AtFlags::empty()) {
                    Ok(()) | Err(Errno::NOENT) => {}
                    Err(e) => return Err(fail("cannot remove", e)),
                }
                for i in (0..parents.names.len()).rev() {
                    let rm = rustix::fs::unlinkat(
                        &parents.dirs[i],
                        &parents.names[i],
                        AtFlags::REMOVEDIR,
                    );
                    if rm.is_err() {
                        break;
                    }
                }
                Ok(())
            }
            Some((entry, content)) => {
                let (parents, name) = self
                    .walk(rel, true)
                    .map_err(reach)?
                    .ok_or_else(|| ChangesError::NoFolder(rel.to_path_buf()))?;
                let dir = parents.parent();
                let existing = rustix::fs::statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW).ok();
                let is_link = existing
                    .as_ref()
                    .is_some_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink);
                if entry.mode == 0o120000 {
                    if existing.is_some() {
                        rustix::fs::unlinkat(dir, &name, AtFlags::empty())
                            .map_err(|e| fail("cannot replace", e))?;
                    }
                    let target =
                        <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(content);
                    return rustix::fs::symlinkat(target, dir, &name)
                        .map_err(|e| fail("cannot create the symlink", e));
                }
                if is_link {
                    rustix::fs::unlinkat(dir, &name, AtFlags::empty())
                        .map_err(|e| fail("cannot replace", e))?;
                }
                let file = rustix::fs::openat(
                    dir,
                    &name,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::TRUNC
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o666),
                )
                .map_err(|e| fail("cannot write", e))?;
                let mut file = std::fs::File::from(file);
                file.write_all(content).map_err(|source| ChangesError::File {
                    what: "write",
                    path: rel.to_path_buf(),
                    source,
                })?;
                let st = rustix::fs::fstat(&file).map_err(|e| fail("cannot read", e))?;
                let mut mode = st.st_mode & 0o7777;
                if entry.mode == 0o100755 {
                    // Executable where readable, as git checks a file out.
                    mode |= (mode & 0o444) >> 2;
                } else {
                    mode &= !0o111;
                }
                rustix::fs::fchmod(&file, Mode::from_raw_mode(mode))
                    .map_err(|e| fail("cannot set the mode of", e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(mode: u32, b: u8) -> Entry {
        Entry { mode, oid: [b; 20], size: 1 }
    }

    fn tree(items: &[(&str, Entry)]) -> Tree {
        let entries = items.iter().map(|(p, e)| (Name::from(p.as_bytes()), *e)).collect();
        Tree { entries, stats: Vec::new() }
    }

    #[test]
    fn diff_finds_added_deleted_modified_and_mode() {
        let a = tree(&[
            ("a", e(0o100644, 1)),
            ("b", e(0o100644, 2)),
            ("c", e(0o100644, 3)),
            ("d", e(0o100644, 4)),
        ]);
        let b = tree(&[
            ("a", e(0o100644, 1)),
            ("b", e(0o100644, 9)),
            ("c", e(0o100755, 3)),
            ("e", e(0o100644, 5)),
        ]);
        let d = diff(&a, &b);
        let paths: Vec<_> =
            d.iter().map(|d| String::from_utf8_lossy(&d.path).into_owned()).collect();
        assert_eq!(paths, ["b", "c", "d", "e"]);
        assert_eq!(d[2].after, None);
        assert_eq!(d[3].before, None);
        assert!(diff(&a, &a).is_empty());
    }

    #[test]
    fn varints_as_git_writes_them() {
        assert_eq!(varint(&[0x05]), Some((5, 1)));
        assert_eq!(varint(&[0x80, 0x00]), Some((128, 2)));
        assert_eq!(varint(&[0xff, 0x7f]), Some((16383 + 128, 2)));
        assert_eq!(varint(&[0x80]), None);
    }

    #[test]
    fn bad_indexes_are_errors() {
        assert!(parse_index(b"").is_err());
        assert!(parse_index(b"DIRC\0\0\0\x09\0\0\0\0").is_err());
        assert_eq!(parse_index(b"DIRC\0\0\0\x02\0\0\0\0").unwrap(), vec![]);
        assert!(parse_index(b"DIRC\0\0\0\x02\0\0\0\x01short").is_err());
    }

    #[test]
    fn shadow_names() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        std::fs::create_dir_all(repo.join(".git")).unwrap();
        std::fs::create_dir_all(repo.join("src/deep")).unwrap();
        let base = Path::new("/state/changes");
        let a = shadow_dir(base, Path::new("/home/me/my project"));
        assert!(a.to_string_lossy().starts_with("/state/changes/my_project-"), "{a:?}");
        assert_ne!(a, shadow_dir(base, Path::new("/home/you/my project")));
        assert_eq!(a, shadow_dir(base, Path::new("/home/me/my project")));
    }
}
