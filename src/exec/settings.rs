//! Settings (`--config FILE`, TOML): every key, its default and why.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::fence::SandboxMode;
use crate::intercept::InterceptorSettings;
use crate::{Error, Result};

/// All settings. Unknown keys are an error, so a typo never silently does nothing.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Shell to run commands in. Default: `$SHELL` if it is bash or zsh, else bash from PATH,
    /// else `sh`.
    pub shell: Option<PathBuf>,
    /// Extra environment for every command (after the built-in hardening, so it can override).
    pub env: BTreeMap<String, String>,
    /// Words that wrap the whole shell process, e.g. `"nice -n 10"` or `"docker exec -i box"`.
    /// Default: `$AGENT_BASH_SHELL_PREFIX`.
    pub prefix: Option<String>,
    /// `[interceptor]`: `enabled` (default false) and `rules` (default: the seven built-ins).
    pub interceptor: InterceptorSettings,
    /// `[limits]`: output window, artifact cap, shell-session pool.
    pub limits: Limits,
    /// `"on"` runs tool calls in a PTY when an interactive UI is attached; default `"off"`.
    pub virtual_terminal: Option<String>,
    /// Root of the per-session artifact directories. Default: `<state dir>/agent-bash`.
    pub state_dir: Option<PathBuf>,
    /// `[changes]`: change receipts and undo (contract §13).
    pub changes: crate::changes::ChangesSettings,
    /// The fence of tool-call shells (contract §13): `"workspace-write"`, `"read-only"` or `"off"`.
    /// Default off. Bang commands are never fenced.
    pub sandbox: Option<SandboxMode>,
    /// `[sandbox_by_key]`: the fence of the sessions of one session key (overrides `sandbox`).
    pub sandbox_by_key: BTreeMap<String, SandboxMode>,
    /// More paths a fenced shell may write (`~/` expands to the home directory).
    pub sandbox_writable: Vec<PathBuf>,
    /// The one directory tree a `workspace-write` shell may write besides the temp dir and
    /// `sandbox_writable` (absolute or `~/…`). Default: the project root (git work tree, else
    /// the directory itself) of the directory the backend started in. A request's `cwd` never
    /// changes it (contract §13).
    pub sandbox_root: Option<PathBuf>,
    /// `false` denies TCP bind/connect in fenced shells where the kernel's Landlock has it.
    /// Default true.
    pub network: Option<bool>,
    /// Bash sessions run a plain external command (one simple command of plain words) with
    /// `posix_spawn` from a loadable builtin instead of bash's fork. Default true.
    pub spawn: Option<bool>,
    /// `[profiles]`: name → the words that start a shell elsewhere and give us its stdin and
    /// stdout (contract §12), e.g. `dev = ["ssh", "-T", "devbox"]`. Default: none.
    pub profiles: BTreeMap<String, Vec<String>>,
    /// The profile of calls that name none. Default: none (this machine); a call can still say
    /// `profile = "local"`.
    pub default_profile: Option<String>,
    /// `[profile_by_key]`: the profile of one session key's calls that name none (overrides
    /// `default_profile`; `"local"` keeps a key on this machine).
    pub profile_by_key: BTreeMap<String, String>,
    /// `[mcp]`: what `agent-bash mcp` answers (contract §11).
    pub mcp: McpSettings,
}

/// `[mcp]`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct McpSettings {
    /// Tool results also carry the `BashResult` as structured content, and the tools declare an
    /// output schema. Default false: agents that see structured content hand it to the model
    /// instead of the text (contract §11), so by default the result is text only and the
    /// `BashResult` travels in `_meta` (`agent-bash/result`).
    pub structured_content: bool,
}

/// The error for a profile name the settings do not define.
pub fn unknown_profile(name: &str, profiles: &BTreeMap<String, Vec<String>>) -> String {
    let known: Vec<&str> = profiles.keys().map(String::as_str).collect();
    match known.is_empty() {
        true => format!(
            "Unknown profile {name:?}: no profiles are defined in the settings ([profiles])"
        ),
        false => format!("Unknown profile {name:?} (defined: {}, or \"local\")", known.join(", ")),
    }
}

/// `[limits]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Tail window size in bytes (model-facing text). Default 51200.
    pub max_bytes: usize,
    /// Tail window size in lines. Default 2000.
    pub max_lines: usize,
    /// Largest artifact file; past it the middle is elided. Default 32 MiB.
    pub artifact_cap_bytes: u64,
    /// Idle shell sessions are closed after this many seconds. Default 1800.
    pub session_idle_secs: u64,
    /// At most this many live shell sessions (held as each shell starts: the least recently used
    /// idle one is closed, or the call waits while all are busy). Default 16.
    pub max_sessions: usize,
    /// Artifact directories older than this many days are removed at start-up. Default 7.
    pub retention_days: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 51_200,
            max_lines: 2000,
            artifact_cap_bytes: 32 << 20,
            session_idle_secs: 30 * 60,
            max_sessions: 16,
            retention_days: 7,
        }
    }
}

impl Settings {
    /// Reads a TOML settings file.
    #[allow(clippy::disallowed_methods)] // once, at start-up, before any command is served
    pub fn load(path: &Path) -> Result<Settings> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::InvalidInput(format!("cannot read settings {}: {e}", path.display()))
        })?;
        Settings::parse(&text)
            .map_err(|e| Error::InvalidInput(format!("settings {}: {e}", path.display())))
    }

    /// Parses settings from TOML text.
    pub fn parse(text: &str) -> Result<Settings> {
        let s: Settings = toml::from_str(text).map_err(|e| Error::InvalidInput(e.to_string()))?;
        if let Some(v) = &s.virtual_terminal {
            if v != "on" && v != "off" {
                return Err(Error::InvalidInput(format!(
                    "virtual_terminal must be \"on\" or \"off\", got {v:?}"
                )));
            }
        }
        s.changes.check()?;
        if s.limits.max_bytes < 4 || s.limits.max_lines == 0 || s.limits.max_sessions == 0 {
            return Err(Error::InvalidInput(
                "limits.max_bytes must be at least 4, limits.max_lines and limits.max_sessions at least 1"
                    .into(),
            ));
        }
        if s.network == Some(false) && !s.fences_any() {
            return Err(Error::InvalidInput(
                "network = false needs a sandbox (`sandbox` or `[sandbox_by_key]`): only fenced shells can be denied the network".into(),
            ));
        }
        if let Some(p) = s.sandbox_root.iter().find(|p| !p.is_absolute() && !p.starts_with("~")) {
            return Err(Error::InvalidInput(format!(
                "sandbox_root: {} is not an absolute path (or ~/…)",
                p.display()
            )));
        }
        if let Some(p) = s.sandbox_writable.iter().find(|p| !p.is_absolute() && !p.starts_with("~"))
        {
            return Err(Error::InvalidInput(format!(
                "sandbox_writable: {} is not an absolute path (or ~/…)",
                p.display()
            )));
        }
        for (name, argv) in &s.profiles {
            if name == "local" {
                return Err(Error::InvalidInput(
                    "profiles: \"local\" is reserved (it means this machine)".into(),
                ));
            }
            if argv.is_empty() || argv[0].is_empty() {
                return Err(Error::InvalidInput(format!(
                    "profiles.{name}: the command is empty (expected e.g. [\"ssh\", \"-T\", \"host\"])"
                )));
            }
        }
        let named = s.default_profile.iter().map(|d| ("default_profile".to_string(), d));
        let by_key = s.profile_by_key.iter().map(|(k, d)| (format!("profile_by_key.{k}"), d));
        for (setting, d) in named.chain(by_key) {
            if d != "local" && !s.profiles.contains_key(d) {
                return Err(Error::InvalidInput(format!(
                    "{setting}: {}",
                    unknown_profile(d, &s.profiles)
                )));
            }
        }
        Ok(s)
    }

    /// The profile of a call of session key `key` that names none: `[profile_by_key]`, else
    /// `default_profile` (contract §12).
    pub fn profile_for(&self, key: &str) -> Option<&str> {
        self.profile_by_key.get(key).or(self.default_profile.as_ref()).map(String::as_str)
    }

    /// Whether any session key's tool calls are fenced.
    pub fn fences_any(&self) -> bool {
        self.sandbox.is_some_and(|m| m != SandboxMode::Off)
            || self.sandbox_by_key.values().any(|m| *m != SandboxMode::Off)
    }

    /// The fence mode of tool calls of session key `key` (contract §13).
    pub fn sandbox_for(&self, key: &str) -> SandboxMode {
        self.sandbox_by_key.get(key).copied().or(self.sandbox).unwrap_or(SandboxMode::Off)
    }

    /// The configured writable paths, `~/` expanded.
    pub fn sandbox_writable_paths(&self) -> Vec<PathBuf> {
        self.sandbox_writable.iter().map(|p| expand_home(p)).collect()
    }

    /// The `sandbox_root` setting, `~/` expanded.
    pub fn sandbox_root_path(&self) -> Option<PathBuf> {
        self.sandbox_root.as_deref().map(expand_home)
    }

    /// The shell to run (contract §5).
    pub fn resolve_shell(&self) -> PathBuf {
        match &self.shell {
            Some(s) => s.clone(),
            None => default_shell(std::env::var_os("SHELL"), std::env::var_os("PATH")),
        }
    }

    /// The prefix words (setting, else `AGENT_BASH_SHELL_PREFIX`).
    pub fn resolve_prefix(&self) -> Result<Vec<String>> {
        let raw = match &self.prefix {
            Some(p) => p.clone(),
            None => std::env::var("AGENT_BASH_SHELL_PREFIX").unwrap_or_default(),
        };
        split_words(&raw)
    }
}

/// Where bash is looked for after `PATH` (contract §5): Homebrew's on Apple silicon and on
/// Intel Macs, then the system's (3.2 on macOS).
const BASH_AFTER_PATH: [&str; 3] = ["/opt/homebrew/bin/bash", "/usr/local/bin/bash", "/bin/bash"];

/// The shell when the `shell` setting names none (contract §5), from the values of `SHELL` and
/// `PATH`: `$SHELL` when it is an existing bash or zsh; else the newest bash found in `PATH`,
/// then [`BASH_AFTER_PATH`] (the first of equal versions); else `/bin/sh`.
pub fn default_shell(shell: Option<OsString>, path: Option<OsString>) -> PathBuf {
    if let Some(s) = shell.map(PathBuf::from) {
        let name = s.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if (name == "bash" || name == "zsh") && s.is_absolute() && s.exists() {
            return s;
        }
    }
    let mut found: Vec<PathBuf> = Vec::new();
    let in_path = path.iter().flat_map(std::env::split_paths).map(|d| d.join("bash"));
    for cand in in_path.chain(BASH_AFTER_PATH.iter().map(PathBuf::from)) {
        if cand.is_file() && !found.contains(&cand) {
            found.push(cand);
        }
    }
    let mut best: Option<(Vec<u32>, &PathBuf)> = None;
    for cand in &found {
        let Some(v) = bash_version(cand) else { continue };
        if best.as_ref().is_none_or(|(b, _)| v > *b) {
            best = Some((v, cand));
        }
    }
    match best {
        Some((_, p)) => p.clone(),
        None => found.into_iter().next().unwrap_or_else(|| PathBuf::from("/bin/sh")),
    }
}

/// `[major, minor, patch]` from `bash --version` (`GNU bash, version 5.2.15(1)-release …`).
// Once per runtime, and only when `$SHELL` is neither bash nor zsh: a few milliseconds each.
#[allow(clippy::disallowed_methods)]
fn bash_version(bash: &Path) -> Option<Vec<u32>> {
    let out = std::process::Command::new(bash)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rest = text.lines().next()?.split("version ").nth(1)?;
    let digits = rest.split(|c: char| !c.is_ascii_digit() && c != '.').next()?;
    let v: Vec<u32> = digits.split('.').filter_map(|n| n.parse().ok()).collect();
    (!v.is_empty()).then_some(v)
}

/// `p` with a leading `~/` replaced by the home directory.
fn expand_home(p: &Path) -> PathBuf {
    let home = std::env::var_os("HOME").map(PathBuf::from).or_else(dirs::home_dir);
    match (p.strip_prefix("~"), &home) {
        (Ok(rest), Some(h)) => h.join(rest),
        _ => p.to_path_buf(),
    }
}

/// Splits a prefix into words with shell quoting rules (single/double quotes, backslash),
/// by `shell-words`; an unbalanced quote is an error naming the setting.
pub fn split_words(s: &str) -> Result<Vec<String>> {
    shell_words::split(s).map_err(|e| Error::InvalidInput(format!("prefix: {e} in {s:?}")))
}

/// The non-interactive hardening environment (contract §6), given to every command.
pub const HARDENING: &[(&str, &str)] = &[
    ("PAGER", "cat"),
    ("GIT_PAGER", "cat"),
    ("MANPAGER", "cat"),
    ("SYSTEMD_PAGER", "cat"),
    ("BAT_PAGER", "cat"),
    ("DELTA_PAGER", "cat"),
    ("GH_PAGER", "cat"),
    ("GLAB_PAGER", "cat"),
    ("PSQL_PAGER", "cat"),
    ("MYSQL_PAGER", "cat"),
    ("HOMEBREW_PAGER", "cat"),
    ("AWS_PAGER", ""),
    ("LESS", "FRX"),
    ("GIT_EDITOR", "true"),
    ("VISUAL", "true"),
    ("EDITOR", "true"),
    ("GIT_TERMINAL_PROMPT", "0"),
    ("SSH_ASKPASS", "/usr/bin/false"),
    ("npm_config_yes", "true"),
    ("npm_config_update_notifier", "false"),
    ("npm_config_fund", "false"),
    ("npm_config_audit", "false"),
    ("npm_config_progress", "false"),
    ("PNPM_DISABLE_SELF_UPDATE_CHECK", "true"),
    ("PNPM_UPDATE_NOTIFIER", "false"),
    ("YARN_ENABLE_TELEMETRY", "0"),
    ("YARN_ENABLE_PROGRESS_BARS", "0"),
    ("CARGO_TERM_PROGRESS_WHEN", "never"),
    ("DEBIAN_FRONTEND", "noninteractive"),
    ("PIP_NO_INPUT", "1"),
    ("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
    ("TF_INPUT", "0"),
    ("TF_IN_AUTOMATION", "1"),
    ("GH_PROMPT_DISABLED", "1"),
    ("COMPOSER_NO_INTERACTION", "1"),
    ("CLOUDSDK_CORE_DISABLE_PROMPTS", "1"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_reject() {
        let s = Settings::parse("prefix = \"nice -n 10\"\n[limits]\nmax_sessions = 4\n").unwrap();
        assert_eq!(s.prefix.as_deref(), Some("nice -n 10"));
        assert_eq!(s.limits.max_sessions, 4);
        assert_eq!(s.limits.max_bytes, 51_200);
        assert!(Settings::parse("prefx = 1").is_err());
        assert!(Settings::parse("virtual_terminal = \"maybe\"").is_err());
    }

    #[test]
    fn profiles_parse_and_reject() {
        let s = Settings::parse(
            "default_profile = \"dev\"\n[profiles]\ndev = [\"ssh\", \"-T\", \"devbox\"]\n",
        )
        .unwrap();
        assert_eq!(s.profiles["dev"], ["ssh", "-T", "devbox"]);
        assert_eq!(s.default_profile.as_deref(), Some("dev"));
        let err = Settings::parse("default_profile = \"nope\"").unwrap_err().to_string();
        assert!(err.contains("Unknown profile \"nope\""), "{err}");
        let err = Settings::parse("[profiles]\nx = []").unwrap_err().to_string();
        assert!(err.contains("profiles.x: the command is empty"), "{err}");
        let err = Settings::parse("[profiles]\nlocal = [\"sh\"]").unwrap_err().to_string();
        assert!(err.contains("reserved"), "{err}");
        let s = Settings::parse(
            "default_profile = \"dev\"\n[profiles]\ndev = [\"ssh\", \"devbox\"]\nbox = [\"docker\", \"exec\", \"-i\", \"b\"]\n[profile_by_key]\nci = \"box\"\nhere = \"local\"\n",
        )
        .unwrap();
        assert_eq!(s.profile_for("ci"), Some("box"));
        assert_eq!(s.profile_for("here"), Some("local"));
        assert_eq!(s.profile_for("default"), Some("dev"));
        let err = Settings::parse("[profile_by_key]\nci = \"nope\"").unwrap_err().to_string();
        assert!(err.contains("profile_by_key.ci: Unknown profile \"nope\""), "{err}");
    }

    #[test]
    fn sandbox_settings() {
        let s = Settings::parse(
            "sandbox = \"workspace-write\"\nnetwork = false\nsandbox_writable = [\"~/.cache\"]\n[sandbox_by_key]\nci = \"read-only\"\nscratch = \"off\"\n",
        )
        .unwrap();
        assert_eq!(s.sandbox_for("default"), SandboxMode::WorkspaceWrite);
        assert_eq!(s.sandbox_for("ci"), SandboxMode::ReadOnly);
        assert_eq!(s.sandbox_for("scratch"), SandboxMode::Off);
        assert!(s.sandbox_writable_paths()[0].is_absolute());
        assert_eq!(Settings::default().sandbox_for("default"), SandboxMode::Off);
        let e = Settings::parse("sandbox = \"everything\"").unwrap_err().to_string();
        assert!(e.contains("unknown variant"), "{e}");
        let e = Settings::parse("network = false").unwrap_err().to_string();
        assert!(e.contains("needs a sandbox"), "{e}");
        let e = Settings::parse("sandbox = \"read-only\"\nsandbox_writable = [\"rel\"]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not an absolute path"), "{e}");
    }

    #[test]
    fn prefix_words() {
        assert_eq!(split_words("nice -n 10").unwrap(), ["nice", "-n", "10"]);
        assert_eq!(
            split_words("docker exec -i 'my box'").unwrap(),
            ["docker", "exec", "-i", "my box"]
        );
        assert_eq!(split_words("").unwrap(), Vec::<String>::new());
        assert_eq!(split_words(r#"env A="x y" B=a\ b"#).unwrap(), ["env", "A=x y", "B=a b"]);
        let err = split_words("a 'b").unwrap_err().to_string();
        assert!(err.contains("prefix: missing closing quote"), "{err}");
    }
}
