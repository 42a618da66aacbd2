//! The backend's private runtime directory (FIFOs, per-command files, snapshots), under
//! [`super::local::runtime_base`]: `agent-bash-XXXXXX/`, removed when the backend ends.
//!
//! A backend that is killed (SIGKILL, the OOM killer) cannot remove its own, so each one holds
//! an exclusive `flock` on `backend.lock` inside it for its whole life, and every backend that
//! starts sweeps, in a thread of its own, the directories of ours whose lock nobody holds.
//! A directory is only swept when it has also been left alone for [`STALE_AFTER`] (a backend
//! that is starting has made its directory but may not hold the lock yet); one without a lock
//! file (made by an older version) only when no shell its file names mention is alive.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The prefix of our directories.
pub const PREFIX: &str = "agent-bash-";
/// The lock file each live backend holds.
pub const LOCK: &str = "backend.lock";
/// How long a directory must have gone untouched before a sweep may remove it.
pub const STALE_AFTER: Duration = Duration::from_secs(60);

/// Makes directory `path` with mode 0700, whatever the umask (contract §13: private by default).
pub fn private_dir(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(0o700).create(path)?;
    // The umask can only take bits away, and 0700 has none it may keep others from.
    Ok(())
}

/// Makes directory `path` and its missing parents with mode 0700, whatever the umask.
pub fn private_dirs(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(path)
}

/// Writes `path` (created 0600 whatever the umask, or truncated) with `bytes`.
#[allow(clippy::disallowed_methods)] // callers run it at start-up or under spawn_blocking
pub fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
}

/// The mark that [`make_private`] has tightened a state directory once.
pub const PRIVATE_MARK: &str = ".private";

/// Makes the state directory `dir` private (contract §13): created 0700 if missing; the first time
/// (no [`PRIVATE_MARK`] yet), every directory and file under it that group or others may reach
/// (as older versions and git's default modes left them) is tightened to the owner's bits.
/// Links are not followed.
pub fn make_private(dir: &Path) -> io::Result<()> {
    private_dirs(dir)?;
    if dir.join(PRIVATE_MARK).exists() {
        return Ok(());
    }
    tighten(dir);
    write_private(&dir.join(PRIVATE_MARK), b"")
}

/// Takes group and other bits off `path` and everything under it that we own.
#[allow(clippy::disallowed_methods)] // part of `make_private`, once at start-up
pub fn tighten(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    let Ok(meta) = std::fs::symlink_metadata(path) else { return };
    if meta.file_type().is_symlink() || meta.uid() != uid {
        return;
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        let _ =
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & !0o077 & 0o700));
    }
    if meta.is_dir() {
        for e in std::fs::read_dir(path).into_iter().flatten().flatten() {
            tighten(&e.path());
        }
    }
}

/// Writes a new file `path` with mode 0600, whatever the umask.
// A few small files per shell start, on the runtime directory's memory file system
// (`runtime_bases`).
#[allow(clippy::disallowed_methods)]
pub fn private_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    f.write_all(bytes)
}

/// A runtime directory, and the lock that says its backend lives.
#[derive(Debug)]
pub struct RunDir {
    dir: tempfile::TempDir,
    _lock: std::fs::File,
}

impl RunDir {
    /// Makes the directory under `base` (else the temp directory) and takes its lock.
    #[allow(clippy::disallowed_methods)] // once, at start-up
    pub fn create(base: &Path) -> io::Result<RunDir> {
        use std::os::unix::fs::PermissionsExt;
        let mut builder = tempfile::Builder::new();
        // 0700 whatever the umask (contract §13; tempfile's default follows the umask).
        builder.prefix(PREFIX).permissions(std::fs::Permissions::from_mode(0o700));
        let dir = builder.tempdir_in(base).or_else(|_| builder.tempdir())?;
        // The lock file is 0600 too.
        let lock = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(dir.path().join(LOCK))?
        };
        // SAFETY: flock on a descriptor we own. The file is close-on-exec: no shell inherits
        // the lock.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(RunDir { dir, _lock: lock })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Sweeps the other directories of `base` in a thread of its own.
    pub fn sweep_in_background(&self, base: PathBuf) {
        let own = self.path().to_path_buf();
        let _ = std::thread::Builder::new().name("rundir-sweep".into()).spawn(move || {
            let removed = sweep(&base, &own, STALE_AFTER);
            if removed > 0 {
                tracing::info!(base = %base.display(), removed, "removed runtime directories of killed backends");
            }
        });
    }
}

/// Removes the directories of `base` that a dead backend of this user left (see the module
/// doc), except `own`. Returns how many.
#[allow(clippy::disallowed_methods)] // in a thread of its own (`sweep_in_background`)
pub fn sweep(base: &Path, own: &Path, stale_after: Duration) -> usize {
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    let Ok(entries) = std::fs::read_dir(base) else { return 0 };
    let mut removed = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let ours = entry.file_name().to_string_lossy().starts_with(PREFIX);
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        if !ours || path == own || !meta.is_dir() || meta.uid() != uid {
            continue;
        }
        let idle = meta.modified().ok().and_then(|m| m.elapsed().ok());
        if idle.is_none_or(|idle| idle < stale_after) {
            continue;
        }
        if abandoned(&path) && std::fs::remove_dir_all(&path).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Nobody holds the directory's lock (or, without a lock file, none of its shells lives).
#[allow(clippy::disallowed_methods)] // part of `sweep`, in a thread of its own
fn abandoned(dir: &Path) -> bool {
    match std::fs::File::open(dir.join(LOCK)) {
        // SAFETY: flock on a descriptor we own; closing it drops the lock at once.
        Ok(f) => (unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }) == 0,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let Ok(entries) = std::fs::read_dir(dir) else { return false };
            !entries.flatten().any(|e| {
                let name = e.file_name();
                let digits: String =
                    name.to_string_lossy().chars().take_while(char::is_ascii_digit).collect();
                // SAFETY: signal 0 only asks whether the process exists.
                digits.parse::<i32>().is_ok_and(|pid| pid > 0 && unsafe { libc::kill(pid, 0) } == 0)
            })
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_removes_only_dead_and_idle_directories() {
        let base = tempfile::tempdir().unwrap();
        let live = RunDir::create(base.path()).unwrap();
        let me = RunDir::create(base.path()).unwrap();
        let dead = RunDir::create(base.path()).unwrap();
        let dead_path = dead.path().to_path_buf();
        // A killed backend: its directory stays, its lock goes with the process.
        let RunDir { dir, _lock } = dead;
        drop(_lock);
        let _ = dir.keep();
        // Older versions: no lock file; one names a live shell (this process), one a dead one.
        let old_live = base.path().join(format!("{PREFIX}oldlive"));
        std::fs::create_dir(&old_live).unwrap();
        std::fs::write(old_live.join(format!("{}.d", std::process::id())), "").unwrap();
        let old_dead = base.path().join(format!("{PREFIX}olddead"));
        std::fs::create_dir(&old_dead).unwrap();
        std::fs::write(old_dead.join("2147483646.d"), "").unwrap();
        let other = base.path().join("not-ours");
        std::fs::create_dir(&other).unwrap();

        // Nothing is idle long enough yet.
        assert_eq!(sweep(base.path(), me.path(), STALE_AFTER), 0);
        assert_eq!(sweep(base.path(), me.path(), Duration::ZERO), 2);
        assert!(!dead_path.exists() && !old_dead.exists());
        assert!(live.path().exists() && me.path().exists() && old_live.exists() && other.exists());
    }
}
