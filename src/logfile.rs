//! The log file: private to its owner, and never a record of what was typed.
//!
//! The log may hold commands and paths: it is created 0600 (and tightened to 0600 when an older
//! run left it readable by others). Keystrokes typed into a terminal view travel inside
//! nvim-rs's messages, which that crate dumps at debug level: its level is capped at `info`
//! unless the filter names it explicitly.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use tracing_subscriber::EnvFilter;

/// Log file mode: owner read/write only.
pub const MODE: u32 = 0o600;

/// Opens (creating if needed) the log file for appending, mode 0600.
#[allow(clippy::disallowed_methods)] // once at start-up, before the runtime serves anything
pub fn open(path: &Path) -> io::Result<File> {
    if let Some(dir) = path.parent() {
        crate::shell::rundir::private_dirs(dir)?;
    }
    let file = OpenOptions::new().create(true).append(true).mode(MODE).open(path)?;
    let meta = file.metadata()?;
    // SAFETY: getuid has no preconditions.
    let me = unsafe { libc::getuid() };
    if meta.uid() == me && meta.permissions().mode() & 0o077 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(MODE))?;
    }
    Ok(file)
}

/// The tracing filter for `AGENT_BASH_LOG_LEVEL` (default `info`), with nvim-rs capped at `info`
/// unless the filter names it (its debug output holds every message, typed keys included).
pub fn filter(spec: Option<&str>) -> EnvFilter {
    let spec = spec.map(str::trim).filter(|s| !s.is_empty()).unwrap_or("info");
    let full =
        if spec.contains("nvim_rs") { spec.to_owned() } else { format!("{spec},nvim_rs=info") };
    EnvFilter::try_new(&full).unwrap_or_else(|_| EnvFilter::new("info,nvim_rs=info"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logfile_created_private_and_tightened() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/agent-bash.log");
        open(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        open(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn logfile_filter_caps_nvim_rs() {
        assert_eq!(filter(Some("debug")).to_string(), "nvim_rs=info,debug");
        assert_eq!(filter(None).to_string(), "nvim_rs=info,info");
        assert_eq!(filter(Some("debug,nvim_rs=trace")).to_string(), "nvim_rs=trace,debug");
    }
}
