//! The fence (contract §13): tool-call shells under Linux Landlock.
//!
//! A fenced shell may read anywhere but write only beneath the fence's root (`sandbox_root`, else
//! the project root of the directory the backend started in: never chosen by a request), the
//! temp dir, the `sandbox_writable` paths, a few device files every command writes to
//! (`/dev/null`, the terminals, `/dev/shm`) and, in the backend's runtime directory, only into
//! its own FIFOs. `read-only` drops the root from that list. `network = false` also denies TCP
//! bind and connect where the kernel's Landlock ABI has them (4 and later).
//!
//! The fenced party is the agent (contract §13): nothing it may write is executed or trusted by
//! anything unfenced. The runtime directory (driver and command files, `spawn.so`) and the
//! state directory (rc snapshots, the receipt store, artifacts) must therefore lie outside every
//! writable path: the runtime picks a runtime directory that does ([`Fence::exposes`]), and a
//! fence that would expose the state directory is refused rather than run.
//!
//! How: the process that becomes the shell is forked from a short-lived thread that restricts
//! itself first ([`spawn_fenced`]). Landlock domains belong to a thread's credentials and are
//! inherited by every process it forks, so the shell and everything it starts are fenced, no
//! `cd` or child process gets out, and the backend's other threads stay free. A kernel without
//! Landlock makes the spawn fail with [`UNSUPPORTED`]: a fenced call is refused, never run
//! unfenced.
//!
//! What Landlock does not fence (documented in the README): files opened before the fence (the
//! inherited pipes and terminal), most ioctls on already-open files, rights the running kernel's
//! ABI lacks (e.g. truncate before ABI 3, device ioctls before 5, network before 4, the scope
//! of abstract Unix sockets and signals before 6), UDP, Unix sockets with a file, and other
//! users' processes.
//!
//! Off Linux (macOS), and on the portable paths (`AGENT_BASH_PORTABLE=1`), there is no fence:
//! [`kernel_abi`] says why, and every fenced call is refused with [`UNSUPPORTED`] and the
//! platform's name (never run unfenced).

use std::io;
use std::path::{Path, PathBuf};

#[cfg(target_os = "linux")]
use landlock::{
    path_beneath_rules, Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use serde::{Deserialize, Serialize};

/// `sandbox` setting values (contract §13).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxMode {
    /// Not fenced.
    Off,
    /// Writes beneath the project root, the temp dir and the configured paths.
    WorkspaceWrite,
    /// Writes only in the temp dir and the configured paths.
    ReadOnly,
}

impl SandboxMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::Off => "off",
            SandboxMode::WorkspaceWrite => "workspace-write",
            SandboxMode::ReadOnly => "read-only",
        }
    }
}

/// The error text of a fenced call on a kernel without Landlock.
pub const UNSUPPORTED: &str =
    "the sandbox needs Linux Landlock, which this kernel does not provide (or has disabled); the command was not run";

/// The line a fenced run's text ends with when a write was refused (contract §13).
pub const NOTE: &str = "[Sandbox: writes outside the workspace are denied]";

/// Set to `1` to make the fence behave as on a kernel without Landlock (tests of the refusal).
pub const NO_LANDLOCK_VAR: &str = "AGENT_BASH_NO_LANDLOCK";

/// Device files every command may write: output sinks, terminals, shared memory.
pub const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
    "/dev/shm",
];

/// The newest ABI this build knows; older kernels get the subset they have.
#[cfg(target_os = "linux")]
const LATEST: ABI = ABI::V6;

/// What one fenced shell may write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub mode: SandboxMode,
    /// Where writes are allowed besides the devices (project root first for workspace-write).
    pub writable: Vec<PathBuf>,
    /// TCP bind/connect allowed.
    pub network: bool,
    /// The shell's own FIFO directory: its files may be opened for writing, nothing more
    /// (no file made, removed or renamed there). Set by the shell at spawn.
    pub fifos: Option<PathBuf>,
}

impl Fence {
    /// The fence of mode `mode` around `root` (for `workspace-write`) and `extra` (temp dir,
    /// configured paths). Whatever directory a command runs in, this is what it may write.
    pub fn new(mode: SandboxMode, root: &Path, extra: &[PathBuf], network: bool) -> Option<Fence> {
        let mut writable = Vec::new();
        match mode {
            SandboxMode::Off => return None,
            SandboxMode::WorkspaceWrite => writable.push(root.to_path_buf()),
            SandboxMode::ReadOnly => {}
        }
        for p in extra {
            if !writable.contains(p) {
                writable.push(p.clone());
            }
        }
        Some(Fence { mode, writable, network, fifos: None })
    }

    /// The first of `paths` that this fence lets a shell write (it lies at or beneath one of
    /// the writable paths or devices), with that writable path. Paths are compared as the
    /// kernel resolves them (symbolic links followed, where they exist).
    pub fn exposes<'a>(&self, paths: &'a [PathBuf]) -> Option<(&'a Path, PathBuf)> {
        let real = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
        let open: Vec<PathBuf> = self
            .writable
            .iter()
            .map(PathBuf::as_path)
            .chain(DEVICES.iter().map(Path::new))
            .map(real)
            .collect();
        paths.iter().find_map(|p| {
            let rp = real(p);
            open.iter().find(|w| rp.starts_with(w)).map(|w| (p.as_path(), w.clone()))
        })
    }

    /// A copy whose shell may write into the FIFOs of `dir` (and nothing else there).
    pub fn with_fifos(&self, dir: PathBuf) -> Fence {
        Fence { fifos: Some(dir), ..self.clone() }
    }

    /// A copy that may also write `path` (e.g. the cgroup file a PTY shell joins).
    pub fn also_writing(&self, path: PathBuf) -> Fence {
        let mut f = self.clone();
        f.writable.push(path);
        f
    }

    /// Fences the calling thread (and what it forks from now on). Irreversible: call it only on
    /// a thread that exits afterwards.
    #[cfg(target_os = "linux")]
    fn restrict_this_thread(&self) -> io::Result<()> {
        if let Err(why) = kernel_abi() {
            return Err(io::Error::other(format!("{UNSUPPORTED} ({why})")));
        }
        let err = |e: landlock::RulesetError| {
            tracing::warn!("landlock: {e}");
            io::Error::other(format!("{UNSUPPORTED} ({e})"))
        };
        // The file-system fence itself is required; newer rights are taken where the kernel
        // has them.
        let mut ruleset = Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(AccessFs::from_all(ABI::V1))
            .map_err(err)?
            .set_compatibility(CompatLevel::BestEffort)
            .handle_access(AccessFs::from_all(LATEST))
            .map_err(err)?;
        if !self.network {
            ruleset =
                ruleset.handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp).map_err(err)?;
        }
        // ABI 6: no connecting to abstract Unix sockets made outside the fence (the receipt
        // engines are named there) and no signals to processes outside it.
        ruleset = ruleset.scope(Scope::from_all(LATEST)).map_err(err)?;
        let writable =
            self.writable.iter().map(PathBuf::as_path).chain(DEVICES.iter().map(Path::new));
        let status = ruleset
            .create()
            .map_err(err)?
            .add_rules(path_beneath_rules(["/"], AccessFs::from_read(LATEST)))
            .map_err(err)?
            .add_rules(path_beneath_rules(writable, AccessFs::from_all(LATEST)))
            .map_err(err)?
            .add_rules(path_beneath_rules(
                self.fifos.iter(),
                AccessFs::WriteFile | AccessFs::Truncate,
            ))
            .map_err(err)?
            .restrict_self()
            .map_err(err)?;
        if status.ruleset == RulesetStatus::NotEnforced {
            return Err(io::Error::other(UNSUPPORTED));
        }
        Ok(())
    }

    /// Off Linux there is nothing to fence with: the spawn fails (the call was refused before).
    #[cfg(not(target_os = "linux"))]
    fn restrict_this_thread(&self) -> io::Result<()> {
        let why = kernel_abi().err().map(|e| e.to_string()).unwrap_or_default();
        Err(io::Error::other(format!("{UNSUPPORTED} ({why})")))
    }
}

/// Runs `spawn` (which starts a process) on a fresh thread fenced by `fence` first, so the
/// process and its descendants inherit the fence and no other thread of the backend does.
/// Without a fence, runs it here. The thread enters the caller's tokio runtime, if any, so
/// `tokio::process` spawns work inside.
pub fn spawn_fenced<T: Send>(
    fence: Option<&Fence>,
    spawn: impl FnOnce() -> io::Result<T> + Send,
) -> io::Result<T> {
    let Some(fence) = fence else { return spawn() };
    let runtime = tokio::runtime::Handle::try_current().ok();
    std::thread::scope(|scope| {
        let fenced =
            std::thread::Builder::new().name("fenced-spawn".into()).spawn_scoped(scope, || {
                let _entered = runtime.as_ref().map(|h| h.enter());
                fence.restrict_this_thread()?;
                spawn()
            })?;
        fenced.join().unwrap_or_else(|_| Err(io::Error::other("fenced spawn panicked")))
    })
}

/// Whether a refused write shows in a fenced run's text: the wording of EACCES/EPERM/EROFS as
/// programs print them.
pub fn looks_denied(text: &str) -> bool {
    ["Permission denied", "Operation not permitted", "Read-only file system"]
        .iter()
        .any(|w| text.contains(w))
}

/// Why the kernel offers no Landlock ([`kernel_abi`]).
#[derive(Debug, thiserror::Error)]
pub enum NoLandlock {
    /// Turned off for this process by [`NO_LANDLOCK_VAR`].
    #[error("{}=1", NO_LANDLOCK_VAR)]
    Disabled,
    /// The kernel refused the ABI query (no Landlock, or not enabled at boot).
    #[error(transparent)]
    Kernel(io::Error),
    /// Not Linux, or the portable paths forced (`AGENT_BASH_PORTABLE=1`): no fence here.
    #[error("{0}: the fence is Landlock, which only the Linux paths use")]
    Platform(String),
}

/// The kernel's Landlock ABI version, or why there is none.
#[cfg(target_os = "linux")]
pub fn kernel_abi() -> Result<i64, NoLandlock> {
    if crate::platform::portable() {
        return Err(NoLandlock::Platform(crate::platform::describe()));
    }
    if std::env::var_os(NO_LANDLOCK_VAR).is_some_and(|v| v == "1") {
        return Err(NoLandlock::Disabled);
    }
    // SAFETY: LANDLOCK_CREATE_RULESET_VERSION with a null attribute only queries the ABI.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    if abi > 0 {
        Ok(abi)
    } else {
        Err(NoLandlock::Kernel(io::Error::last_os_error()))
    }
}

/// Off Linux: no Landlock, whatever the kernel.
#[cfg(not(target_os = "linux"))]
pub fn kernel_abi() -> Result<i64, NoLandlock> {
    Err(NoLandlock::Platform(crate::platform::describe()))
}

/// What `:checkhealth` says about the kernel's Landlock.
pub fn kernel_support() -> String {
    match kernel_abi() {
        Ok(abi) if abi < 6 => format!(
            "Landlock ABI {abi} (before 6: fenced commands can signal your other processes and reach abstract Unix sockets, the receipt engines among them)"
        ),
        Ok(abi) => format!("Landlock ABI {abi}"),
        Err(why) => format!("unavailable ({why})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_paths() {
        let cwd = Path::new("/nonexistent/p");
        let ww = Fence::new(SandboxMode::WorkspaceWrite, cwd, &[], true).unwrap();
        let own = [PathBuf::from("/var/x"), PathBuf::from("/nonexistent/p/.state")];
        assert_eq!(ww.exposes(&own[..1]), None);
        assert_eq!(ww.exposes(&own).map(|(p, _)| p), Some(own[1].as_path()));
        let shm = [PathBuf::from("/dev/shm/agent-bash-x")];
        assert!(ww.exposes(&shm).is_some(), "/dev/shm is writable under every fence");
        let tmp = vec![PathBuf::from("/tmp")];
        assert_eq!(Fence::new(SandboxMode::Off, cwd, &tmp, true), None);
        let ro = Fence::new(SandboxMode::ReadOnly, cwd, &tmp, true).unwrap();
        assert_eq!(ro.writable, tmp);
        let ww = Fence::new(SandboxMode::WorkspaceWrite, cwd, &tmp, false).unwrap();
        assert_eq!(ww.writable, [PathBuf::from("/nonexistent/p"), PathBuf::from("/tmp")]);
        assert!(!ww.network);
    }

    #[test]
    fn denial_wording() {
        assert!(looks_denied("touch: cannot touch '/x': Permission denied"));
        assert!(!looks_denied("all good"));
    }
}
