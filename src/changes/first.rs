//! A project's first snapshot, read here before `git add` (contract §13: 250 000 files in at
//! most 15 s). `git add -A` writes one loose object per file, and at 250 000 files the kernel
//! creating those files is nearly all of its 21 s. Here the files `git ls-files` listed are read
//! on a few threads, each writing the blobs it makes into one pack of its own (with its `.idx`),
//! and the store's index is written with every file's stat data. The `git add -A` that follows
//! finds the files as the index says (a stat each, about 0.5 s at 250 000) and hashes only what
//! changed meanwhile or was left to it here: nested repositories, files gone or of another kind
//! when read, files over [`MAX_FILE`] bytes.
//!
//! A file changed at or after the start of the clock tick it was read in gets no stat data in
//! the index (zeros), so git reads it again; so does a file whose size changed while it was read.
//!
//! Crash safety: packs are written under temporary names and renamed into place, the pack
//! before its index (as git does); the store's index is written last, renamed into place too.
//! Killed before that, the store has no index, and the next first snapshot starts again and
//! removes the temporary files left.
//!
//! Everything here blocks: it runs under `spawn_blocking`, within a first snapshot.

use std::collections::HashSet;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use sha1::Digest;

use super::quick::FS_CLOCK;
use super::status::Progress;
use super::store::Git;
use super::ChangesError;

/// Bigger files are left to `git add`, which streams them; here a file is read whole.
pub const MAX_FILE: u64 = 32 << 20;

/// The prefix of our temporary files in `objects/pack` (removed by the next first snapshot).
const TMP: &str = "tmp_first_";

/// Files a thread takes from the list at a time.
const BATCH: usize = 64;

/// One file of the index we write: its path, git mode, blob id and stat data (git's index
/// fields: ctime, mtime, dev, ino, uid, gid, size, 32 bits each; zeros when not to be trusted).
struct Item {
    path: Vec<u8>,
    mode: u32,
    oid: [u8; 20],
    stat: [u32; 9],
}

/// A pause for tests, `AGENT_BASH_TEST_HOLD_FIRST="N INSIDE GO"`: the files are read on one
/// thread, and after the N-th a line is written to the FIFO `INSIDE`, then the FIFO `GO` is
/// read to its end (a snapshot truly held mid-way, as nothing else can hold it).
struct Hold {
    at: u64,
    inside: PathBuf,
    go: PathBuf,
}

impl Hold {
    fn of_env() -> Option<Hold> {
        let spec = std::env::var("AGENT_BASH_TEST_HOLD_FIRST").ok()?;
        let mut words = spec.split(' ');
        let at = words.next()?.parse().ok()?;
        let (inside, go) = (words.next()?.into(), words.next()?.into());
        Some(Hold { at, inside, go })
    }

    // Under spawn_blocking: waits on two FIFOs.
    #[allow(clippy::disallowed_methods)]
    fn wait(&self) {
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.inside)
            .and_then(|mut f| f.write_all(b"inside\n"));
        let _ = std::fs::File::open(&self.go)
            .and_then(|mut f| std::io::copy(&mut f, &mut std::io::sink()));
    }
}

/// Why [`take`] stopped.
pub enum Stopped {
    Late,
    Failed(ChangesError),
}

impl From<ChangesError> for Stopped {
    fn from(e: ChangesError) -> Self {
        Stopped::Failed(e)
    }
}

fn fail(what: &'static str, path: &Path, source: std::io::Error) -> ChangesError {
    ChangesError::File { what, path: path.into(), source }
}

/// Reads the files `paths` (relative to the project's root, as `git ls-files -z` names them)
/// into packs of the store and writes its index (see the module's text), counting each file in
/// `progress`; stops by `end`.
// Under spawn_blocking: reads the project's files on threads of its own.
#[allow(clippy::disallowed_methods)]
pub fn take(
    git: &Git,
    paths: &[Vec<u8>],
    progress: &Progress,
    end: Instant,
) -> Result<(), Stopped> {
    let dir = git.shadow.join("objects/pack");
    crate::shell::rundir::private_dirs(&dir).map_err(|e| fail("create", &dir, e))?;
    if let Ok(listing) = std::fs::read_dir(&dir) {
        for item in listing.flatten() {
            if item.file_name().as_bytes().starts_with(TMP.as_bytes()) {
                let _ = std::fs::remove_file(item.path());
            }
        }
    }
    let hold = Hold::of_env();
    let threads = match hold {
        Some(_) => 1,
        None => std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(1, 4),
    };
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let results: Vec<Result<Vec<Item>, Stopped>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| worker(git, &dir, paths, (&next, &stop), progress, end, hold.as_ref()))
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join().unwrap_or_else(|_| {
                    Err(Stopped::Failed(ChangesError::Off(
                        "a thread of the snapshot failed".into(),
                    )))
                })
            })
            .collect()
    });
    let mut items = Vec::with_capacity(paths.len());
    for result in results {
        items.extend(result?);
    }
    items.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    items.dedup_by(|a, b| a.path == b.path);
    write_index(&git.shadow, &items)?;
    Ok(())
}

/// One thread's share: batches of [`BATCH`] files taken from `paths` until none is left, their
/// blobs written into one pack.
fn worker(
    git: &Git,
    dir: &Path,
    paths: &[Vec<u8>],
    (next, stop): (&AtomicUsize, &AtomicBool),
    progress: &Progress,
    end: Instant,
    hold: Option<&Hold>,
) -> Result<Vec<Item>, Stopped> {
    let mut pack = Pack::new(dir)?;
    let mut items = Vec::new();
    let mut content = Vec::new();
    loop {
        if stop.load(Ordering::Relaxed) {
            return Err(Stopped::Late);
        }
        if Instant::now() > end {
            stop.store(true, Ordering::Relaxed);
            return Err(Stopped::Late);
        }
        let from = next.fetch_add(BATCH, Ordering::Relaxed);
        if from >= paths.len() {
            break;
        }
        for (i, path) in paths[from..(from + BATCH).min(paths.len())].iter().enumerate() {
            if let Some(item) = read_one(&git.root, path, &mut content) {
                pack.add(&item.oid, &content).map_err(|e| fail("write", dir, e))?;
                items.push(item);
            }
            progress.hashed(1);
            if let Some(hold) = hold.filter(|h| h.at == (from + i + 1) as u64) {
                hold.wait();
            }
        }
    }
    pack.finish()?;
    Ok(items)
}

/// The index entry of one file, its content left in `content`; `None`: left to `git add`
/// (gone, a folder or nested repository, a device, over [`MAX_FILE`]).
// The stat fields' types differ per platform (nanoseconds are u64 on Linux, i64 on macOS).
#[allow(clippy::unnecessary_cast)]
fn read_one(root: &Path, path: &[u8], content: &mut Vec<u8>) -> Option<Item> {
    use rustix::fs::{Mode, OFlags};
    if path.is_empty() || path.ends_with(b"/") {
        return None;
    }
    let full = root.join(std::ffi::OsStr::from_bytes(path));
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: an out-parameter of ours.
    unsafe { libc::clock_gettime(FS_CLOCK, &mut now) };
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    content.clear();
    let (st, mode, whole) = match rustix::fs::open(&full, flags, Mode::empty()) {
        Ok(fd) => {
            let st = rustix::fs::fstat(&fd).ok()?;
            if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_size as u64 > MAX_FILE {
                return None;
            }
            content.reserve(st.st_size as usize);
            std::fs::File::from(fd).read_to_end(content).ok()?;
            let mode = super::quick::mode_of(st.st_mode);
            (st, mode, content.len() as u64 == st.st_size as u64)
        }
        // O_NOFOLLOW on a symbolic link.
        Err(rustix::io::Errno::LOOP) => {
            let st = rustix::fs::lstat(&full).ok()?;
            if st.st_mode & libc::S_IFMT != libc::S_IFLNK {
                return None;
            }
            let target = std::fs::read_link(&full).ok()?;
            content.extend_from_slice(target.as_os_str().as_bytes());
            (st, 0o120000, content.len() as u64 == st.st_size as u64)
        }
        Err(_) => return None,
    };
    let tick = (now.tv_sec as i64, now.tv_nsec as i64);
    let racy = (st.st_mtime as i64, st.st_mtime_nsec as i64) >= tick
        || (st.st_ctime as i64, st.st_ctime_nsec as i64) >= tick;
    let stat = if racy || !whole {
        [0; 9]
    } else {
        // Truncated to 32 bits, as git's index keeps them.
        [
            st.st_ctime as u32,
            st.st_ctime_nsec as u32,
            st.st_mtime as u32,
            st.st_mtime_nsec as u32,
            st.st_dev as u32,
            st.st_ino as u32,
            st.st_uid as u32,
            st.st_gid as u32,
            st.st_size as u32,
        ]
    };
    let mut sha = sha1::Sha1::new();
    sha.update(format!("blob {}\0", content.len()));
    sha.update(&content[..]);
    Some(Item { path: path.to_vec(), mode, oid: sha.finalize().into(), stat })
}

/// A pack being written (git's pack format, version 2): whole blobs, no deltas.
struct Pack {
    dir: PathBuf,
    file: tempfile::NamedTempFile,
    out: Option<BufWriter<std::fs::File>>,
    at: u64,
    /// Each object's id, the CRC-32 of its bytes in the pack, and where they start.
    objects: Vec<([u8; 20], u32, u64)>,
    seen: HashSet<[u8; 20]>,
}

impl Pack {
    fn new(dir: &Path) -> Result<Pack, ChangesError> {
        let file = tempfile::Builder::new()
            .prefix(TMP)
            // Read-only, as git makes packs (0444 under the store's umask of 077).
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o400))
            .tempfile_in(dir)
            .map_err(|e| fail("create", dir, e))?;
        let out = file.as_file().try_clone().map_err(|e| fail("open", dir, e))?;
        let mut out = BufWriter::with_capacity(1 << 20, out);
        // The object count is written when known ([`Pack::finish`]).
        out.write_all(b"PACK\0\0\0\x02\0\0\0\0").map_err(|e| fail("write", dir, e))?;
        Ok(Pack {
            dir: dir.into(),
            file,
            out: Some(out),
            at: 12,
            objects: Vec::new(),
            seen: HashSet::new(),
        })
    }

    fn add(&mut self, oid: &[u8; 20], content: &[u8]) -> std::io::Result<()> {
        if !self.seen.insert(*oid) {
            return Ok(());
        }
        let Some(out) = self.out.as_mut() else { return Ok(()) };
        // Type 3 (blob) and the size, 4 bits then 7 a byte, low bits first.
        let mut head = Vec::with_capacity(10);
        let mut size = content.len() as u64;
        let mut byte = 0x30 | (size & 0x0f) as u8;
        size >>= 4;
        while size > 0 {
            head.push(byte | 0x80);
            byte = (size & 0x7f) as u8;
            size >>= 7;
        }
        head.push(byte);
        let mut z = flate2::write::ZlibEncoder::new(head, flate2::Compression::fast());
        let header_len = z.get_ref().len();
        z.write_all(content)?;
        let bytes = z.finish()?;
        debug_assert!(bytes.len() > header_len);
        out.write_all(&bytes)?;
        self.objects.push((*oid, crc32fast::hash(&bytes), self.at));
        self.at += bytes.len() as u64;
        Ok(())
    }

    /// Writes the count and the checksum, then the `.idx`, and renames both into place (none
    /// when the pack holds nothing).
    fn finish(mut self) -> Result<(), ChangesError> {
        let dir = self.dir.clone();
        let io = |e| fail("write", &dir, e);
        let mut out = self.out.take().ok_or(ChangesError::ContentMissing)?;
        out.flush().map_err(io)?;
        let file = out.into_inner().map_err(|e| io(e.into_error()))?;
        if self.objects.is_empty() {
            return Ok(());
        }
        let count = u32::try_from(self.objects.len())
            .map_err(|_| io(std::io::Error::other("too many objects for one pack")))?;
        file.write_all_at(&count.to_be_bytes(), 8).map_err(io)?;
        let sum = checksum(&file).map_err(io)?;
        file.write_all_at(&sum, self.at).map_err(io)?;
        let idx = index_of(&mut self.objects, &sum);
        let hex: String = sum.iter().map(|b| format!("{b:02x}")).collect();
        let mut idx_file = tempfile::Builder::new()
            .prefix(TMP)
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o400))
            .tempfile_in(&dir)
            .map_err(io)?;
        idx_file.write_all(&idx).map_err(io)?;
        let name = |ext: &str| dir.join(format!("pack-{hex}.{ext}"));
        self.file.persist(name("pack")).map_err(|e| io(e.error))?;
        idx_file.persist(name("idx")).map_err(|e| io(e.error))?;
        Ok(())
    }
}

/// The SHA-1 of everything in `file` (a pack before its trailer).
fn checksum(file: &std::fs::File) -> std::io::Result<[u8; 20]> {
    let mut file = file;
    file.seek(SeekFrom::Start(0))?;
    let mut sha = sha1::Sha1::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match file.read(&mut buf)? {
            0 => break,
            n => sha.update(&buf[..n]),
        }
    }
    Ok(sha.finalize().into())
}

/// A pack's `.idx` (version 2): fan-out table, sorted ids, CRC-32s, offsets (large ones in a
/// table of their own), the pack's checksum and the index's own.
fn index_of(objects: &mut [([u8; 20], u32, u64)], pack_sum: &[u8; 20]) -> Vec<u8> {
    objects.sort_unstable_by_key(|a| a.0);
    let mut idx = Vec::with_capacity(8 + 1024 + objects.len() * 28 + 40);
    idx.extend_from_slice(b"\xfftOc\0\0\0\x02");
    let mut fanout = [0u32; 256];
    for (oid, _, _) in objects.iter() {
        fanout[usize::from(oid[0])] += 1;
    }
    let mut total = 0;
    for n in fanout {
        total += n;
        idx.extend_from_slice(&total.to_be_bytes());
    }
    for (oid, _, _) in objects.iter() {
        idx.extend_from_slice(oid);
    }
    for (_, crc, _) in objects.iter() {
        idx.extend_from_slice(&crc.to_be_bytes());
    }
    let mut large = Vec::new();
    for (_, _, at) in objects.iter() {
        let small = match u32::try_from(*at) {
            Ok(at) if at < 0x8000_0000 => at,
            _ => {
                large.push(*at);
                0x8000_0000 | (large.len() as u32 - 1)
            }
        };
        idx.extend_from_slice(&small.to_be_bytes());
    }
    for at in large {
        idx.extend_from_slice(&at.to_be_bytes());
    }
    idx.extend_from_slice(pack_sum);
    let own: [u8; 20] = sha1::Sha1::digest(&idx).into();
    idx.extend_from_slice(&own);
    idx
}

/// Writes the store's index (git's format, version 2), entries sorted by path.
// Under spawn_blocking: writes one file.
#[allow(clippy::disallowed_methods)]
fn write_index(shadow: &Path, items: &[Item]) -> Result<(), ChangesError> {
    let count = u32::try_from(items.len())
        .map_err(|_| fail("write", shadow, std::io::Error::other("too many files")))?;
    let mut data = Vec::with_capacity(12 + items.len() * 96);
    data.extend_from_slice(b"DIRC\0\0\0\x02");
    data.extend_from_slice(&count.to_be_bytes());
    for item in items {
        let start = data.len();
        let [ctime, ctime_ns, mtime, mtime_ns, dev, ino, uid, gid, size] = item.stat;
        for field in [ctime, ctime_ns, mtime, mtime_ns, dev, ino, item.mode, uid, gid, size] {
            data.extend_from_slice(&field.to_be_bytes());
        }
        data.extend_from_slice(&item.oid);
        let flags = item.path.len().min(0xfff) as u16;
        data.extend_from_slice(&flags.to_be_bytes());
        data.extend_from_slice(&item.path);
        // NUL-padded to a multiple of 8 bytes, at least one NUL.
        let len = data.len() - start;
        data.resize(start + ((len + 8) & !7), 0);
    }
    let sum: [u8; 20] = sha1::Sha1::digest(&data).into();
    data.extend_from_slice(&sum);
    let fail = |e| fail("write", shadow, e);
    let mut tmp =
        tempfile::Builder::new().prefix("tmp_index_").tempfile_in(shadow).map_err(fail)?;
    tmp.write_all(&data).map_err(fail)?;
    tmp.persist(shadow.join("index")).map_err(|e| fail(e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git_in(dir: &Path, args: &[&str], git: &Git) -> String {
        let mut cmd = git.command();
        cmd.args(args).current_dir(dir);
        cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        let out = crate::changes::store::output_owned(cmd).unwrap();
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    /// What we write is what `git add -A` writes: the same index entries (`git ls-files -s`:
    /// modes, ids, a symbolic link, twice the same content, a file named but gone), packs `git
    /// fsck` and `git verify-pack` accept, and nothing hashed again by the `git add -A` that
    /// follows (its `--verbose` names no file).
    #[test]
    fn packs_and_index_are_gits() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("p");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        let mut paths = Vec::new();
        for (i, len) in
            [0usize, 1, 15, 16, 127, 128, 2047, 2048, 70_000, 300_000].iter().enumerate()
        {
            let name = format!("a/b/f{i}");
            let content: Vec<u8> = (0..*len).map(|k| (k * 31 + i) as u8).collect();
            std::fs::write(root.join(&name), content).unwrap();
            paths.push(name.into_bytes());
        }
        std::fs::write(root.join("same1"), "twice\n").unwrap();
        std::fs::write(root.join("same2"), "twice\n").unwrap();
        std::fs::write(root.join("run.sh"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(
            root.join("run.sh"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        std::os::unix::fs::symlink("a/b/f1", root.join("link")).unwrap();
        paths.extend([b"same1".to_vec(), b"same2".to_vec(), b"run.sh".to_vec(), b"link".to_vec()]);
        paths.push(b"gone".to_vec());
        let git = Git { bin: "git".into(), shadow: dir.path().join("s"), root: root.clone() };
        crate::changes::store::init(&git, None).unwrap();
        // The reference: git's own first snapshot in a store of its own.
        let theirs = Git { bin: "git".into(), shadow: dir.path().join("t"), root: root.clone() };
        crate::changes::store::init(&theirs, None).unwrap();
        git_in(&root, &["add", "-A"], &theirs);
        let progress = Progress::default();
        let far = Instant::now() + std::time::Duration::from_secs(60);
        assert!(take(&git, &paths, &progress, far).is_ok());
        assert_eq!(progress.now().hashed, paths.len() as u64);
        let ours = git_in(&root, &["ls-files", "-s"], &git);
        assert_eq!(ours.lines().count(), 14, "{ours}");
        assert_eq!(ours, git_in(&root, &["ls-files", "-s"], &theirs));
        let added = git_in(&root, &["add", "-A", "--verbose"], &git);
        assert_eq!(added, "", "git hashed again what we wrote");
        assert_eq!(ours, git_in(&root, &["ls-files", "-s"], &git));
        git_in(&root, &["fsck", "--strict", "--no-dangling"], &git);
        for pack in std::fs::read_dir(git.shadow.join("objects/pack")).unwrap() {
            let pack = pack.unwrap().path();
            let name = pack.file_name().unwrap().to_string_lossy().into_owned();
            assert!(!name.starts_with(TMP), "{name} left behind");
            if name.ends_with(".idx") {
                git_in(&root, &["verify-pack", pack.to_str().unwrap()], &git);
            }
        }
    }
}
