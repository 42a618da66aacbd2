//! Snapshots taken in this process for the commonest change: files the latest snapshot holds,
//! changed in place (content, executable bit) or removed, in the folders the watch names
//! (contract §13: bounded cost). No `git add` runs: that one reads and writes the store's
//! whole index (at 250 000 files, 130–200 ms however few files changed).
//!
//! Each file of such a folder is `lstat`ed and compared with the stat data the latest snapshot
//! kept for it (git's index's for a tree read from it, ours for one made here): the same, and
//! it is unchanged; else it is read and hashed as git hashes a blob (SHA-1 of
//! `blob <size>\0<content>`), and a new blob is written into the store as a loose object
//! (zlib stream of stored blocks, which git reads as any other), so undo finds it. A file
//! changed at or after the start of the kernel's clock tick in which it was read keeps no stat
//! data (it could change again with the same), so it is read again the next time.
//!
//! Anything else — a file the latest snapshot does not hold (git's ignore rules decide whether
//! it belongs), a symbolic link, a folder gone, more than [`MAX_READ`] bytes to read — is left
//! to `git add` ([`Quick::Cannot`]). The store's index is then older than the tree: the caller
//! names the folders updated here in the next `git add`'s path specs, whose stat check sees the
//! files changed since.
//!
//! Everything here blocks: it runs under `spawn_blocking`, within a snapshot.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::store::{Entry, Git, Stat, Tree};
use super::watch::join;
use super::ChangesError;

/// The most bytes one snapshot reads here; more is `git add`'s work (which has a deadline).
pub const MAX_READ: u64 = 8 << 20;

/// What [`update`] made of the changed folders.
pub enum Quick {
    /// Every file is as the latest snapshot saw it.
    Same,
    Tree(Tree),
    /// A change only `git add` can take.
    Cannot,
}

/// The latest snapshot `last` with the files of folders `dirs` (relative, `b""` the root)
/// read again (see the module's text).
pub fn update(git: &Git, last: &Tree, dirs: &BTreeSet<Vec<u8>>) -> Result<Quick, ChangesError> {
    let mut changed: BTreeMap<Vec<u8>, Option<(Entry, Stat)>> = BTreeMap::new();
    let mut budget = MAX_READ;
    for dir in dirs {
        let Some(found) = read_folder(git, last, dir, &mut budget)? else {
            return Ok(Quick::Cannot);
        };
        changed.extend(found);
    }
    if changed.is_empty() {
        return Ok(Quick::Same);
    }
    let mut tree = Tree {
        entries: Vec::with_capacity(last.entries.len()),
        stats: Vec::with_capacity(last.entries.len()),
    };
    let mut next = changed.into_iter().peekable();
    for (i, (path, entry)) in last.entries.iter().enumerate() {
        if next.peek().is_some_and(|(p, _)| p[..] == path[..]) {
            if let Some((_, Some((e, s)))) = next.next() {
                tree.entries.push((path.clone(), e));
                tree.stats.push(s);
            }
            continue;
        }
        tree.entries.push((path.clone(), *entry));
        tree.stats.push(last.stats.get(i).copied().unwrap_or_default());
    }
    Ok(Quick::Tree(tree))
}

/// Changed paths and what they are now (`None`: gone).
type Found = Vec<(Vec<u8>, Option<(Entry, Stat)>)>;

/// The files of `dir` whose entry or stat data differ from `last`'s (`None` for a file gone),
/// or `None`: a change left to `git add`.
// Under spawn_blocking (a snapshot's plan): lists one folder.
#[allow(clippy::disallowed_methods)]
fn read_folder(
    git: &Git,
    last: &Tree,
    dir: &[u8],
    budget: &mut u64,
) -> Result<Option<Found>, ChangesError> {
    let full = git.root.join(OsStr::from_bytes(dir));
    let Ok(listing) = std::fs::read_dir(&full) else { return Ok(None) };
    let mut out = Vec::new();
    let mut present = HashSet::new();
    for item in listing {
        let Ok(item) = item else { return Ok(None) };
        let Ok(kind) = item.file_type() else { return Ok(None) };
        if kind.is_dir() {
            continue;
        }
        let path = join(dir, item.file_name().as_bytes());
        let Ok(i) = last.entries.binary_search_by(|(p, _)| p[..].cmp(&path[..])) else {
            return Ok(None);
        };
        let entry = last.entries[i].1;
        if !kind.is_file() || !matches!(entry.mode, 0o100644 | 0o100755) {
            return Ok(None);
        }
        let file = full.join(item.file_name());
        let Ok(st) = rustix::fs::lstat(&file) else { return Ok(None) };
        let seen = Stat::of(&st);
        let kept = last.stats.get(i).copied().unwrap_or_default();
        present.insert(path.clone());
        if seen.known() && seen == kept && mode_of(st.st_mode) == entry.mode {
            continue;
        }
        let Some((now, stat)) = read_blob(git, &file, budget)? else { return Ok(None) };
        if now != entry || stat != kept {
            out.push((path, Some((now, stat))));
        }
    }
    // The files of `dir` the latest snapshot held and the folder no longer does.
    let prefix = if dir.is_empty() { Vec::new() } else { join(dir, b"") };
    let from = last.entries.partition_point(|(p, _)| p[..] < prefix[..]);
    for (path, entry) in last.entries[from..].iter().take_while(|(p, _)| p.starts_with(&prefix)) {
        if path[prefix.len()..].contains(&b'/') || present.contains(&path[..]) {
            continue;
        }
        if !matches!(entry.mode, 0o100644 | 0o100755 | 0o120000) {
            return Ok(None);
        }
        out.push((path.to_vec(), None));
    }
    Ok(Some(out))
}

/// The clock file times are taken from: Linux stamps them from its coarse clock; macOS
/// from the real time clock.
#[cfg(target_os = "linux")]
pub const FS_CLOCK: libc::clockid_t = libc::CLOCK_REALTIME_COARSE;
#[cfg(not(target_os = "linux"))]
pub const FS_CLOCK: libc::clockid_t = libc::CLOCK_REALTIME;

/// git's mode for a regular file: executable when its owner may execute it.
pub(super) fn mode_of(st_mode: impl Into<u32>) -> u32 {
    // u16 on macOS.
    let st_mode: u32 = st_mode.into();
    if st_mode & 0o100 != 0 {
        0o100755
    } else {
        0o100644
    }
}

/// Reads a regular file, writes its blob into the store, and returns its entry and stat data
/// (unknown when it changed within the current clock tick). `None`: not a regular file any
/// more, changed while read, or over the byte budget.
// Under spawn_blocking: reads one file.
#[allow(clippy::disallowed_methods)]
// The stat fields' types differ per platform (nanoseconds are u64 on Linux, i64 on macOS).
#[allow(clippy::unnecessary_cast)]
fn read_blob(
    git: &Git,
    file: &Path,
    budget: &mut u64,
) -> Result<Option<(Entry, Stat)>, ChangesError> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let Ok(fd) = rustix::fs::open(file, flags, Mode::empty()) else { return Ok(None) };
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: an out-parameter of ours.
    unsafe { libc::clock_gettime(FS_CLOCK, &mut now) };
    let Ok(st) = rustix::fs::fstat(&fd) else { return Ok(None) };
    let size = st.st_size as u64;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || size > *budget {
        return Ok(None);
    }
    *budget -= size;
    let mut content = Vec::with_capacity(size as usize);
    if std::fs::File::from(fd).read_to_end(&mut content).is_err() || content.len() as u64 != size {
        return Ok(None);
    }
    let oid = write_blob(&git.shadow, &content)?;
    let racy = (st.st_mtime, st.st_mtime_nsec as i64) >= (now.tv_sec, now.tv_nsec)
        || (st.st_ctime, st.st_ctime_nsec as i64) >= (now.tv_sec, now.tv_nsec);
    let stat = if racy { Stat::default() } else { Stat::of(&st) };
    Ok(Some((Entry { mode: mode_of(st.st_mode), oid, size: size as u32 }, stat)))
}

/// The blob's id, and the blob written into the store's objects when not there yet (a
/// private temporary file renamed into place, as git writes loose objects).
// Under spawn_blocking: writes one object.
#[allow(clippy::disallowed_methods)]
pub fn write_blob(shadow: &Path, content: &[u8]) -> Result<[u8; 20], ChangesError> {
    use std::io::Write;
    let mut object = format!("blob {}\0", content.len()).into_bytes();
    object.extend_from_slice(content);
    let oid = sha1(&object);
    let hex: String = oid.iter().map(|b| format!("{b:02x}")).collect();
    let dir = shadow.join("objects").join(&hex[..2]);
    let path = dir.join(&hex[2..]);
    if path.symlink_metadata().is_ok() {
        return Ok(oid);
    }
    let fail = |what, path: &Path, source| ChangesError::File { what, path: path.into(), source };
    crate::shell::rundir::private_dirs(&dir).map_err(|e| fail("create", &dir, e))?;
    let tmp = tempfile::Builder::new()
        .prefix("tmp_obj_")
        // Read-only, as git makes objects (0444 under the store's umask of 077).
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o400))
        .tempfile_in(&dir)
        .map_err(|e| fail("create", &dir, e))?;
    let mut out = std::io::BufWriter::new(tmp.as_file());
    let packed = zlib(&object).map_err(|e| fail("write", &dir, e))?;
    out.write_all(&packed).map_err(|e| fail("write", &dir, e))?;
    out.flush().map_err(|e| fail("write", &dir, e))?;
    drop(out);
    tmp.persist(&path).map_err(|e| fail("write", &path, e.error))?;
    Ok(oid)
}

/// A zlib stream of `data` (git's loose object format), at the fastest level: these are a few
/// files changed in place, read back by undo.
fn zlib(data: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write;
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    z.write_all(data)?;
    z.finish()
}

/// SHA-1, git's object id.
pub fn sha1(data: &[u8]) -> [u8; 20] {
    use sha1::Digest;
    sha1::Sha1::digest(data).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Our blob ids and objects are git's: `git hash-object` agrees on every length around the
    /// block sizes, and `git cat-file` reads back what we wrote.
    #[test]
    fn blobs_are_gits() {
        let dir = tempfile::tempdir().unwrap();
        let git = Git { bin: "git".into(), shadow: dir.path().join("s"), root: dir.path().into() };
        crate::changes::store::init(&git, None).unwrap();
        for len in [0usize, 1, 9, 55, 56, 63, 64, 65, 119, 120, 1000, 65535, 65536, 200_003] {
            let content: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            let file = dir.path().join("f");
            std::fs::write(&file, &content).unwrap();
            let out = std::process::Command::new("git")
                .args(["hash-object", "--no-filters"])
                .arg(&file)
                .output()
                .unwrap();
            let want = String::from_utf8(out.stdout).unwrap();
            let oid = write_blob(&git.shadow, &content).unwrap();
            let hex: String = oid.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(hex, want.trim(), "length {len}");
            let blobs = crate::changes::store::blobs(&git, &[hex]).unwrap();
            assert_eq!(blobs, [content], "length {len}");
        }
    }
}
