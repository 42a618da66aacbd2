//! Capturing the user's rc: options, functions, aliases and PATH from an interactive shell.
//!
//! An agent's shell must feel like the user's (their aliases and functions work) without the
//! parts of an interactive setup that break automation (prompts, `set -e`, job control). So the
//! rc is run once per shell path in an interactive shell with stdin /dev/null and stderr
//! discarded, under [`CAPTURE_LIMIT`]; what it defined is written to a script that every new
//! session sources. A failed or hung rc gives no snapshot, never a failed command.

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use super::local::{nonce, quote, ShellKind};
use super::procs;

/// The rc gets this long to finish (SPEC §5).
pub const CAPTURE_LIMIT: Duration = Duration::from_secs(10);

/// Function and alias names never taken over from the rc: the agent's tools must behave as
/// documented, not as the user's customisations (SPEC §5).
const SKIP_NAMES: &[&str] = &[
    "ls", "dir", "vdir", "cat", "head", "tail", "less", "more", "grep", "egrep", "fgrep", "rg",
    "find", "fd", "locate", "sed", "awk", "perl", "cp", "mv", "rm", "mkdir", "rmdir", "touch",
    "chmod", "chown", "ln", "pwd", "readlink", "stat", "cut", "sort", "uniq", "xargs", "tee", "tr",
    "basename", "dirname",
];

/// Options that would break an agent shell (SPEC §5).
const DROP_OPTIONS: &[&str] = &[
    "errexit",
    "nounset",
    "xtrace",
    "verbose",
    "noexec",
    "histexpand",
    "monitor",
    "emacs",
    "vi",
    "posix",
    "onecmd",
    "history",
    "login_shell",
    "restricted_shell",
    "ignoreeof",
    "privileged",
    "interactive",
    "zle",
    "shinstdin",
    "singlecommand",
    "restricted",
    "login",
    "err_exit",
    "no_unset",
    "xtrace",
    "bang_hist",
    "banghist",
];

fn skip_name(name: &str) -> bool {
    name.starts_with('_') || SKIP_NAMES.contains(&name)
}

/// The rc files whose change invalidates a snapshot.
fn rc_files(kind: ShellKind) -> Vec<PathBuf> {
    let Some(home) = dirs::home_dir() else { return Vec::new() };
    let names: &[&str] = match kind {
        ShellKind::Bash => &[".bashrc", ".bash_profile", ".bash_aliases", ".profile"],
        ShellKind::Zsh => &[".zshrc", ".zshenv", ".zprofile"],
        ShellKind::Posix => &[],
    };
    names.iter().map(|n| home.join(n)).collect()
}

/// Modification times of the rc files (None: missing).
type RcStamp = Vec<Option<SystemTime>>;

fn rc_stamp(kind: ShellKind) -> RcStamp {
    rc_files(kind).iter().map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok()).collect()
}

/// The dump script run inside the interactive shell; writes to `$1`-like target `out`.
fn dump_script(kind: ShellKind, out: &Path) -> String {
    let out = quote(&out.to_string_lossy());
    match kind {
        ShellKind::Bash => format!(
            "{{ builtin shopt -p; builtin set +o; \
             for __ab_f in $(builtin compgen -A function); do \
               builtin printf '#F %s\\n' \"$__ab_f\"; builtin declare -f -- \"$__ab_f\"; done; \
             builtin printf '#A\\n'; builtin alias -p; \
             builtin printf '#P\\nexport PATH=%q\\n' \"$PATH\"; }} >{out} 2>/dev/null"
        ),
        ShellKind::Zsh => format!(
            "{{ builtin setopt | while read -r __ab_o; do builtin print -r -- \"setopt $__ab_o\"; done; \
             for __ab_f in ${{(k)functions}}; do builtin print -r -- \"#F $__ab_f\"; builtin functions -- \"$__ab_f\"; done; \
             builtin print -r -- '#A'; builtin alias -L; \
             builtin print -r -- '#P'; builtin print -r -- \"export PATH=${{(q)PATH}}\"; }} >{out} 2>/dev/null"
        ),
        ShellKind::Posix => String::new(),
    }
}

/// Turns the raw dump into the script sessions source: options first (completion functions need
/// `extglob` to parse), filtered; then functions and aliases whose names are kept; then PATH.
pub fn filter_dump(raw: &str) -> String {
    let mut options = String::new();
    let mut functions = String::new();
    let mut aliases = String::new();
    let mut path = String::new();
    #[derive(PartialEq)]
    enum Part {
        Options,
        Function(bool),
        Aliases,
        Path,
    }
    let mut part = Part::Options;
    for line in raw.lines() {
        if let Some(name) = line.strip_prefix("#F ") {
            part = Part::Function(!skip_name(name.trim()));
            continue;
        }
        if line == "#A" {
            part = Part::Aliases;
            continue;
        }
        if line == "#P" {
            part = Part::Path;
            continue;
        }
        match part {
            Part::Options => {
                let words: Vec<&str> = line.split_whitespace().collect();
                let name = words.last().copied().unwrap_or("");
                let known =
                    matches!(words.first(), Some(&"shopt") | Some(&"set") | Some(&"setopt"));
                if known && !DROP_OPTIONS.contains(&name) {
                    options.push_str(line);
                    options.push('\n');
                }
            }
            Part::Function(keep) => {
                if keep {
                    functions.push_str(line);
                    functions.push('\n');
                }
            }
            Part::Aliases => {
                // `alias name='value'` (bash) or `name=value` (zsh `alias -L` gives `alias name=…`).
                let body = line.strip_prefix("alias ").unwrap_or(line);
                let body = body.strip_prefix("-- ").unwrap_or(body);
                let name = body.split('=').next().unwrap_or("");
                if !name.is_empty() && !skip_name(name) {
                    aliases.push_str(line);
                    aliases.push('\n');
                }
            }
            Part::Path => {
                path.push_str(line);
                path.push('\n');
            }
        }
    }
    format!("{options}{functions}{aliases}{path}")
}

/// Captures a snapshot synchronously (bounded by [`CAPTURE_LIMIT`]); `None` when the rc failed.
pub fn capture(
    shell: &Path,
    env: &[(std::ffi::OsString, std::ffi::OsString)],
    dir: &Path,
    owner: &str,
) -> Option<String> {
    let kind = ShellKind::of(shell);
    if kind == ShellKind::Posix {
        return None;
    }
    let raw_path = dir.join(format!("snapshot-raw-{}", nonce()));
    let script = dump_script(kind, &raw_path);
    let group = procs::Group::new(false);
    let mut cmd = std::process::Command::new(shell);
    cmd.arg("-i")
        .arg("-c")
        .arg(&script)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env(procs::OWNER_VAR, owner)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    let join = group.prepare(&mut cmd);
    let mut child = procs::spawn_owned(|| cmd.spawn(), |c| Some(c.id() as i32)).ok()?;
    drop(join);
    let pid = child.id() as i32;
    group.started(pid);
    let deadline = std::time::Instant::now() + CAPTURE_LIMIT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5))
            }
            _ => break None,
        }
    };
    // Whatever the rc left behind (agents, background refreshers) goes with it.
    group.kill_blocking(Duration::ZERO);
    let _ = child.kill();
    let _ = child.wait();
    procs::disown_child(pid);
    let raw = std::fs::read(&raw_path).ok();
    let _ = std::fs::remove_file(&raw_path);
    if status.is_none() {
        tracing::warn!("rc snapshot of {} timed out after {:?}", shell.display(), CAPTURE_LIMIT);
        return None;
    }
    let raw = String::from_utf8_lossy(&raw?).into_owned();
    Some(filter_dump(&raw))
}

/// Snapshots per shell path, refreshed when an rc file changes.
///
/// Capturing runs the user's whole rc (hundreds of milliseconds with version managers and
/// prompt frameworks), so a capture is also kept on disk under `cache_dir` with the rc files'
/// modification times: the next backend (every `agent-bash exec` is one) reuses it until an rc
/// file changes.
#[derive(Debug, Default)]
pub struct Snapshots {
    cache: Mutex<HashMap<PathBuf, (RcStamp, Option<PathBuf>)>>,
    cache_dir: Option<PathBuf>,
}

impl Snapshots {
    pub fn new(cache_dir: Option<PathBuf>) -> Snapshots {
        Snapshots { cache: Mutex::default(), cache_dir }
    }

    /// The snapshot script for `shell`, capturing (or re-capturing) it when needed. Blocking.
    pub fn get(
        &self,
        shell: &Path,
        env: &[(std::ffi::OsString, std::ffi::OsString)],
        dir: &Path,
        owner: &str,
    ) -> Option<PathBuf> {
        let kind = ShellKind::of(shell);
        let stamp = rc_stamp(kind);
        if let Ok(cache) = self.cache.lock() {
            if let Some((s, path)) = cache.get(shell) {
                if *s == stamp {
                    return path.clone();
                }
            }
        }
        let path = match self.load_disk(shell, &stamp) {
            Some(p) => Some(p),
            None => {
                let script = capture(shell, env, dir, owner);
                script.and_then(|text| self.store(shell, &stamp, dir, &text))
            }
        };
        if let Ok(mut cache) = self.cache.lock() {
            cache.insert(shell.to_path_buf(), (stamp, path.clone()));
        }
        path
    }

    /// Where the on-disk copy for `shell` lives: one file per shell path and home directory.
    fn disk_path(&self, shell: &Path) -> Option<PathBuf> {
        use std::hash::{Hash, Hasher};
        let dir = self.cache_dir.as_ref()?;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        shell.hash(&mut h);
        dirs::home_dir().hash(&mut h);
        Some(dir.join(format!("{:016x}.sh", h.finish())))
    }

    fn stamp_line(shell: &Path, stamp: &RcStamp) -> String {
        let times: Vec<String> = stamp
            .iter()
            .map(|t| match t.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok()) {
                Some(d) => d.as_nanos().to_string(),
                None => "-".into(),
            })
            .collect();
        format!("# agent-bash snapshot of {} rc {}\n", shell.display(), times.join(","))
    }

    fn load_disk(&self, shell: &Path, stamp: &RcStamp) -> Option<PathBuf> {
        let path = self.disk_path(shell)?;
        let text = std::fs::read_to_string(&path).ok()?;
        text.starts_with(&Self::stamp_line(shell, stamp)).then_some(path)
    }

    /// Writes the snapshot (to the disk cache when there is one, else the runtime dir).
    fn store(&self, shell: &Path, stamp: &RcStamp, dir: &Path, text: &str) -> Option<PathBuf> {
        let body = format!("{}{text}", Self::stamp_line(shell, stamp));
        if let Some(path) = self.disk_path(shell) {
            if let Some(parent) = path.parent() {
                let _ = super::rundir::private_dirs(parent);
            }
            // Write then rename, so a concurrent backend never sources half a snapshot.
            let tmp = path.with_extension(format!("tmp{}", nonce()));
            if write_private(&tmp, &body).is_ok() && std::fs::rename(&tmp, &path).is_ok() {
                return Some(path);
            }
            let _ = std::fs::remove_file(&tmp);
        }
        let p = dir.join(format!("snapshot-{}.sh", nonce()));
        write_private(&p, &body).ok().map(|_| p)
    }
}

/// Writes a file readable by the user only (it holds their functions and PATH).
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    f.write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_orders_and_drops() {
        let raw = "shopt -s extglob\nshopt -u histappend\nset -o errexit\nset +o monitor\nset -o pipefail\n\
#F _comp\n_comp () \n{ \n  :\n}\n#F greet\ngreet () \n{ \n  echo hi\n}\n#F ls\nls () \n{ \n  command ls -G\n}\n\
#A\nalias ll='ls -l'\nalias grep='grep --color'\nalias _x='y'\n#P\nexport PATH=/bin\n";
        let out = filter_dump(raw);
        assert_eq!(
            out,
            "shopt -s extglob\nshopt -u histappend\nset -o pipefail\ngreet () \n{ \n  echo hi\n}\n\
alias ll='ls -l'\nexport PATH=/bin\n"
        );
    }
}
