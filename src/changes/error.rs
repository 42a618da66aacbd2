//! Why receipts could not be taken, or an undo could not be done (contract §13): the text a
//! result's `changes_unavailable` carries, and the reason of a failed undo.

use std::io;
use std::path::PathBuf;

use rustix::io::Errno;

/// What went wrong in the shadow store, the watch or a snapshot, worded as results show it.
#[derive(Debug, thiserror::Error)]
pub enum ChangesError {
    // The project and its limits.
    #[error("the first snapshot of {root} is still being taken: {at}")]
    Indexing { root: String, at: super::Hashed },
    #[error("another command was taking a snapshot of {0}")]
    Busy(String),
    #[error("another process was taking a snapshot of this project")]
    LockedElsewhere,
    #[error("{root} has {files} files, over changes.max_files ({max})")]
    TooManyFiles { root: String, files: u64, max: u64 },
    #[error("{root} holds {bytes} bytes, over changes.max_bytes ({max})")]
    TooManyBytes { root: String, bytes: u64, max: u64 },
    #[error(
        "the first snapshot of {root} takes over {ms} ms: it goes on in the background (now: {at}), and receipts start with a later command"
    )]
    FirstDeferred { root: String, ms: u64, at: super::Hashed },
    #[error("the first snapshot of {root} took over {secs} s")]
    FirstTooSlow { root: String, secs: u64 },
    #[error("a snapshot of {root} took over {ms} ms (changes.max_snapshot_ms)")]
    TooSlow { root: String, ms: u64 },
    /// `git add` failed: its exit status (or wait error) and its stderr.
    #[error("a snapshot of {root} failed ({status}): {message}")]
    AddFailed { root: String, status: String, message: String },
    #[error("listing the files of {0} took too long")]
    ListTooSlow(String),
    #[error("cannot list the files of {0}")]
    ListFailed(String),
    /// Receipts were turned off for the project earlier, for this reason.
    #[error("{0}")]
    Off(String),
    /// The project's shared receipt engine could not be reached or answered this.
    #[error("{0}")]
    Engine(String),

    // Running git.
    #[error("cannot run {}: {source}", .bin.display())]
    RunProgram { bin: PathBuf, source: io::Error },
    #[error("cannot run git: {0}")]
    RunGit(io::Error),
    #[error("git: no stdin")]
    GitStdin,
    #[error("git: {0}")]
    GitWait(io::Error),
    #[error("git cat-file: {0}")]
    CatFile(Box<ChangesError>),
    #[error("git cat-file: output cut short")]
    CatFileShort,
    #[error("git cat-file: bad size")]
    CatFileSize,
    #[error("the saved content {oid} is missing from the store ({header})")]
    BlobMissing { oid: String, header: String },
    #[error("missing saved content")]
    ContentMissing,
    #[error("cannot list the ignored folders of {0}")]
    ListIgnored(String),
    #[error("cannot check the ignore rules of {0}")]
    CheckIgnore(String),

    // The store's files.
    #[error("unreadable index: {0}")]
    Index(&'static str),
    #[error("unreadable index: version {0}")]
    IndexVersion(u32),
    #[error("cannot read index: {0}")]
    ReadIndex(io::Error),
    /// `cannot <what> <path>: <error>` (create, write, open the lock of, watch).
    #[error("cannot {what} {}: {source}", .path.display())]
    File { what: &'static str, path: PathBuf, source: io::Error },

    // The watch.
    #[error("this backend watches as many projects as it may")]
    WatchesTaken,
    #[error("inotify is unavailable: {0}")]
    NoInotify(io::Error),
    /// Off Linux, or the portable paths forced: receipts take full snapshots.
    #[error("no folder watcher on {0}: full snapshots")]
    NoWatcher(String),
    #[error(
        "watching its folders would take over a quarter of the system's inotify watches (fs.inotify.max_user_watches = {0})"
    )]
    WatchBudget(usize),
    #[error("the system's inotify watch limit is reached (fs.inotify.max_user_watches)")]
    WatchLimit,
    #[error("the project has over {0} directories")]
    TooManyDirs(usize),

    // Undo, beneath the project root.
    #[error("cannot open the project: {0}")]
    OpenProject(Errno),
    /// `cannot <what> <path>: <errno>` (open, create the folder, remove, replace, write, …).
    #[error("{what} {}: {errno}", .path.display())]
    Beneath { what: &'static str, path: PathBuf, errno: Errno },
    #[error("{} is a symbolic link or not a folder: not written through", .0.display())]
    Blocked(PathBuf),
    #[error("cannot create the folder of {}", .0.display())]
    NoFolder(PathBuf),
    #[error("Run {id} did not change {path}")]
    NotChanged { id: u64, path: String },
    #[error(transparent)]
    Undo(#[from] super::UndoError),
    /// A blocking task that panicked.
    #[error(transparent)]
    Join(#[from] tokio::task::JoinError),
}

impl ChangesError {
    /// No receipt because the project's first snapshot is being taken (the card follows it).
    pub fn is_indexing(&self) -> bool {
        matches!(self, ChangesError::Indexing { .. } | ChangesError::FirstDeferred { .. })
    }
}
