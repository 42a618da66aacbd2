//! contract §3: working directory resolution and timeout validation (pure apart from `stat`).

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use crate::{Error, Result};

/// Used when the caller gives no timeout: long enough for a build, short enough to notice a hang.
pub const DEFAULT_TIMEOUT_SECS: f64 = 300.0;
/// Shortest timeout: below a second a command cannot even start a shell reliably.
pub const MIN_TIMEOUT_SECS: f64 = 1.0;
/// Longest timeout: an hour; anything longer belongs in a PTY session the user watches.
pub const MAX_TIMEOUT_SECS: f64 = 3600.0;

/// Resolves the working directory of a tool call against the caller's `base` directory.
///
/// `~` and `~/…` are expanded with the home directory; relative paths are joined onto `base`;
/// `.` and `..` are resolved lexically, as `cd` does, so symlinks in the path are kept. The
/// result is absolute and is an existing directory.
pub fn resolve_cwd(base: &Path, cwd: Option<&str>) -> Result<PathBuf> {
    let base = absolute(base)?;
    let path = match cwd {
        None | Some("") => base,
        Some("~") => home().unwrap_or_else(|| base.join("~")),
        Some(cwd) => match (cwd.strip_prefix("~/"), home()) {
            (Some(rest), Some(home)) => home.join(rest),
            _ => base.join(cwd),
        },
    };
    let path = lexical_normalize(&path);
    match std::fs::metadata(&path) {
        Ok(meta) if meta.is_dir() => Ok(path),
        Ok(_) => Err(Error::CwdNotDir(path)),
        Err(err)
            if err.kind() == std::io::ErrorKind::NotFound
                || err.raw_os_error() == Some(libc::ENOTDIR) =>
        {
            Err(Error::CwdMissing(path))
        }
        Err(err) => Err(Error::Io(err)),
    }
}

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from).or_else(dirs::home_dir)
}

fn absolute(path: &Path) -> Result<PathBuf> {
    if path.is_absolute() {
        Ok(path.to_path_buf())
    } else {
        Ok(std::env::current_dir()?.join(path))
    }
}

/// Drops `.` and applies `..` to the path text, without asking the file system.
fn lexical_normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                // `/..` is `/`: popping the root is a no-op.
                if !out.pop() {
                    out.push(component);
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// A validated timeout (contract §3).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timeout {
    pub duration: Duration,
    /// The effective value in seconds (after clamping).
    pub secs: f64,
    /// The value asked for, when it was outside [1, 3600] and got clamped (reported in metadata).
    pub clamped_from: Option<f64>,
}

/// Validates a timeout in seconds: `None` is the default (300 s); values are clamped to
/// [1, 3600] with fractions kept; NaN, negative and infinite values are errors.
pub fn timeout_from_secs(secs: Option<f64>) -> Result<Timeout> {
    let Some(asked) = secs else {
        return Ok(Timeout {
            duration: Duration::from_secs_f64(DEFAULT_TIMEOUT_SECS),
            secs: DEFAULT_TIMEOUT_SECS,
            clamped_from: None,
        });
    };
    if !asked.is_finite() || asked < 0.0 {
        return Err(Error::InvalidTimeout(asked.to_string()));
    }
    let secs = asked.clamp(MIN_TIMEOUT_SECS, MAX_TIMEOUT_SECS);
    Ok(Timeout {
        duration: Duration::from_secs_f64(secs),
        secs,
        clamped_from: (secs != asked).then_some(asked),
    })
}

/// Validates a timeout as it arrives over RPC: a number, a numeric string (`"30"`, `" 1.5 "`),
/// or null/absent for the default. Anything else is an [`Error::InvalidTimeout`].
pub fn parse_timeout(raw: &serde_json::Value) -> Result<Timeout> {
    use serde_json::Value;
    let secs = match raw {
        Value::Null => None,
        Value::Number(n) => Some(n.as_f64().ok_or_else(|| Error::InvalidTimeout(n.to_string()))?),
        Value::String(s) => {
            Some(s.trim().parse::<f64>().map_err(|_| Error::InvalidTimeout(raw.to_string()))?)
        }
        other => return Err(Error::InvalidTimeout(other.to_string())),
    };
    timeout_from_secs(secs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn validate_timeout_clamps_and_keeps_fractions() {
        let cases: &[(Option<f64>, u128, f64, Option<f64>)] = &[
            (None, 300_000, 300.0, None),
            (Some(0.5), 1_000, 1.0, Some(0.5)),
            (Some(0.0), 1_000, 1.0, Some(0.0)),
            (Some(1.0), 1_000, 1.0, None),
            (Some(1.5), 1_500, 1.5, None),
            (Some(30.0), 30_000, 30.0, None),
            (Some(3600.0), 3_600_000, 3600.0, None),
            (Some(5000.0), 3_600_000, 3600.0, Some(5000.0)),
        ];
        for &(asked, millis, secs, clamped_from) in cases {
            let got =
                timeout_from_secs(asked).map(|t| (t.duration.as_millis(), t.secs, t.clamped_from));
            assert_eq!(got.ok(), Some((millis, secs, clamped_from)), "{asked:?}");
        }
    }

    #[test]
    fn validate_timeout_rejects_nonsense() {
        for asked in [f64::NAN, -1.0, -0.5, f64::INFINITY, f64::NEG_INFINITY] {
            assert!(
                matches!(timeout_from_secs(Some(asked)), Err(Error::InvalidTimeout(_))),
                "{asked}"
            );
        }
        let err = timeout_from_secs(Some(-1.0)).map(|_| ()).unwrap_err().to_string();
        assert_eq!(err, "Invalid timeout: -1 (expected a number of seconds between 1 and 3600)");
    }

    #[test]
    fn validate_parse_timeout_from_rpc_values() {
        let ok = [
            (json!(null), 300.0, None),
            (json!(10), 10.0, None),
            (json!(1.5), 1.5, None),
            (json!("30"), 30.0, None),
            (json!(" 2.5 "), 2.5, None),
            (json!(0.5), 1.0, Some(0.5)),
            (json!("5000"), 3600.0, Some(5000.0)),
        ];
        for (raw, secs, clamped_from) in ok {
            let got = parse_timeout(&raw).map(|t| (t.secs, t.clamped_from));
            assert_eq!(got.ok(), Some((secs, clamped_from)), "{raw}");
        }
        for raw in [
            json!("abc"),
            json!(""),
            json!("NaN"),
            json!("-1"),
            json!(-3),
            json!(true),
            json!([1]),
            json!({}),
        ] {
            assert!(matches!(parse_timeout(&raw), Err(Error::InvalidTimeout(_))), "{raw}");
        }
        let err = parse_timeout(&json!("abc")).map(|_| ()).unwrap_err().to_string();
        assert_eq!(
            err,
            "Invalid timeout: \"abc\" (expected a number of seconds between 1 and 3600)"
        );
    }

    #[test]
    fn validate_cwd_resolution() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        std::fs::create_dir(base.join("sub")).unwrap();
        std::fs::write(base.join("file.txt"), "x").unwrap();

        assert_eq!(resolve_cwd(base, None).unwrap(), base);
        assert_eq!(resolve_cwd(base, Some("sub")).unwrap(), base.join("sub"));
        assert_eq!(resolve_cwd(base, Some("./sub/../sub/.")).unwrap(), base.join("sub"));
        let abs = base.join("sub");
        assert_eq!(resolve_cwd(Path::new("/"), abs.to_str()).unwrap(), abs);

        let missing = resolve_cwd(base, Some("nope")).unwrap_err().to_string();
        assert_eq!(
            missing,
            format!("Working directory does not exist: {}", base.join("nope").display())
        );
        let under_file = resolve_cwd(base, Some("file.txt/x")).unwrap_err().to_string();
        assert_eq!(
            under_file,
            format!("Working directory does not exist: {}", base.join("file.txt/x").display())
        );
        let not_dir = resolve_cwd(base, Some("file.txt")).unwrap_err().to_string();
        assert_eq!(
            not_dir,
            format!("Working directory is not a directory: {}", base.join("file.txt").display())
        );
    }

    #[test]
    fn validate_cwd_expands_home() {
        let Some(home) = home() else { return };
        if !home.is_dir() {
            return;
        }
        let base = Path::new("/");
        assert_eq!(resolve_cwd(base, Some("~")).unwrap(), lexical_normalize(&home));
        assert_eq!(resolve_cwd(base, Some("~/")).unwrap(), lexical_normalize(&home));
        let err = resolve_cwd(base, Some("~/surely-not-here-4f1c")).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "Working directory does not exist: {}",
                home.join("surely-not-here-4f1c").display()
            )
        );
    }
}
