//! Which of the backend's platform-dependent paths run (README, "Platforms").
//!
//! Linux has paths of its own: cgroup v2 and a child subreaper for process trees, `/proc` for
//! process tables, CPU and memory figures and the waiting-for-input check, Landlock for the
//! fence, inotify for the receipts' watcher. Every other Unix (macOS) takes the portable twin
//! of each, which sits beside it under `cfg(target_os = "linux")` / `not(…)`: process groups and
//! a `ps` walk, `wait4` rusage, the wait channel `ps` shows, full snapshots, a fence that
//! refuses. On Linux, `AGENT_BASH_PORTABLE=1` in the environment forces the portable twins, so
//! the tests run through the code macOS runs.
//!
//! A leaf: imports nothing of ours.

/// Set to exactly `1`: take the portable paths on Linux as well.
pub const PORTABLE_VAR: &str = "AGENT_BASH_PORTABLE";

/// Whether the portable paths are in use: always off Linux, on Linux when [`PORTABLE_VAR`] is
/// `1` (read once per process; children inherit it, the watchdog among them).
#[cfg(target_os = "linux")]
pub fn portable() -> bool {
    static PORTABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PORTABLE.get_or_init(|| std::env::var_os(PORTABLE_VAR).is_some_and(|v| v == "1"))
}

/// Whether the portable paths are in use: always off Linux.
#[cfg(not(target_os = "linux"))]
pub fn portable() -> bool {
    true
}

/// The operating system, as people write it (`Linux`, `macOS`, `freebsd`, …).
pub fn os_name() -> &'static str {
    match std::env::consts::OS {
        "linux" => "Linux",
        "macos" => "macOS",
        other => other,
    }
}

/// The paths in use, in words: `Linux` or `macOS (portable paths)` or
/// `Linux (portable paths: AGENT_BASH_PORTABLE=1)`.
pub fn describe() -> String {
    match (portable(), cfg!(target_os = "linux")) {
        (false, _) => os_name().to_string(),
        (true, true) => format!("{} (portable paths: {PORTABLE_VAR}=1)", os_name()),
        (true, false) => format!("{} (portable paths)", os_name()),
    }
}
