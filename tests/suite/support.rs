//! Shared helpers: a JSON-lines RPC client over the real binary, process checks.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

pub const BIN: &str = env!("CARGO_BIN_EXE_agent-bash");

/// A running `agent-bash rpc` with a private state dir.
pub struct Rpc {
    pub child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    /// Messages read while waiting for something else.
    pending: VecDeque<Value>,
    pub state: tempfile::TempDir,
    next: u64,
}

impl Rpc {
    pub async fn start() -> Rpc {
        Rpc::start_with(None).await
    }

    pub async fn start_with(config: Option<&str>) -> Rpc {
        Rpc::start_in(tempfile::tempdir().unwrap(), config, &[]).await
    }

    /// Starts in an existing state dir, with extra `rpc` arguments.
    pub async fn start_in(state: tempfile::TempDir, config: Option<&str>, args: &[&str]) -> Rpc {
        Rpc::start_env(state, config, args, &[]).await
    }

    /// [`Rpc::start_in`] with extra environment variables for the backend.
    pub async fn start_env(
        state: tempfile::TempDir,
        config: Option<&str>,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Rpc {
        Rpc::start_wrapped(state, config, args, env, &[]).await
    }

    /// [`Rpc::start_env`] under a wrapper command (`unshare … sh -c '…; exec "$0" "$@"'`): the
    /// wrapper must end by exec'ing the binary, so the pid stays the backend's.
    pub async fn start_wrapped(
        state: tempfile::TempDir,
        config: Option<&str>,
        args: &[&str],
        env: &[(&str, &str)],
        wrapper: &[&str],
    ) -> Rpc {
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        cmd.envs(env.iter().copied());
        cmd.arg("--log-file").arg(state.path().join("log")).arg("rpc").args(args);
        let cfg_text =
            format!("state_dir = {:?}\n{}", state.path().to_str().unwrap(), config.unwrap_or(""));
        let cfg_path = state.path().join("config.toml");
        std::fs::write(&cfg_path, cfg_text).unwrap();
        cmd.arg("--config").arg(&cfg_path);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Rpc { child, stdin, lines, pending: VecDeque::new(), state, next: 0 }
    }

    pub fn artifacts_dir(&self) -> PathBuf {
        let sessions = self.state.path().join("sessions");
        std::fs::read_dir(&sessions).unwrap().next().unwrap().unwrap().path()
    }

    pub async fn send_raw(&mut self, line: &str) {
        self.stdin.write_all(line.as_bytes()).await.unwrap();
        self.stdin.write_all(b"\n").await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    /// Sends a request with a fresh id; returns the id.
    pub async fn send(&mut self, mut req: Value) -> String {
        self.next += 1;
        let id = format!("r{}", self.next);
        req["id"] = json!(id);
        self.send_raw(&req.to_string()).await;
        id
    }

    async fn read(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(30), self.lines.next_line())
            .await
            .expect("rpc answered within 30 s")
            .unwrap()
            .expect("rpc closed stdout");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad JSON {line:?}: {e}"))
    }

    /// Waits for the first message matching `pred`, keeping others for later.
    pub async fn wait_for(&mut self, pred: impl Fn(&Value) -> bool) -> Value {
        if let Some(i) = self.pending.iter().position(&pred) {
            return self.pending.remove(i).unwrap();
        }
        loop {
            let v = self.read().await;
            if pred(&v) {
                return v;
            }
            self.pending.push_back(v);
        }
    }

    pub async fn response(&mut self, id: &str) -> Value {
        let id = id.to_string();
        self.wait_for(move |v| v["type"] == "response" && v["id"] == id.as_str()).await
    }

    /// Runs a `bash` request and returns the response's data.
    pub async fn bash(&mut self, command: &str) -> Value {
        let id = self.send(json!({"type": "bash", "command": command})).await;
        let r = self.response(&id).await;
        assert_eq!(r["success"], true, "{r}");
        r["data"].clone()
    }

    /// Runs a `tool_call` and returns the response's data.
    pub async fn tool(&mut self, params: Value) -> Value {
        let mut req = params;
        req["type"] = json!("tool_call");
        let id = self.send(req).await;
        let r = self.response(&id).await;
        assert_eq!(r["success"], true, "{r}");
        r["data"].clone()
    }

    /// Closes stdin and waits for the process to exit; returns the state dir for a restart.
    pub async fn stop(self) -> tempfile::TempDir {
        let Rpc { mut child, stdin, state, .. } = self;
        drop(stdin);
        tokio::time::timeout(Duration::from_secs(10), child.wait()).await.unwrap().unwrap();
        state
    }

    pub fn pid(&self) -> i32 {
        self.child.id().unwrap() as i32
    }
}

/// Processes whose environment contains `needle` (a marker env var set by the test).
pub fn procs_with_env(needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')) {
            continue;
        }
        if let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) {
            if env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()) {
                out.push(pid);
            }
        }
    }
    out
}

/// Polls `cond` every 10 ms until it holds or `limit` passes.
pub async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Live (non-zombie) processes whose command line contains `needle`.
pub fn procs_with_cmdline(needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')) {
            continue;
        }
        if let Some(cmd) = cmdline(pid, &stat) {
            let cmd: Vec<u8> = cmd.iter().map(|&b| if b == 0 { b' ' } else { b }).collect();
            if String::from_utf8_lossy(&cmd).contains(needle) {
                out.push(pid);
            }
        }
    }
    out
}

/// The command line of `pid` (its `stat` line given). A process in the middle of `execve` shows
/// an empty one for a moment (the new image's arguments are not set up yet): that is read again
/// until it is set, or the process is gone, so a search never misses a process that `exec`s
/// from one tagged command line into another (`setsid env -i sleep TAG`). Kernel threads have
/// none at all.
fn cmdline(pid: i32, stat: &str) -> Option<Vec<u8>> {
    const PF_KTHREAD: u64 = 0x0020_0000;
    let flags: u64 = stat.rsplit(')').next()?.split_whitespace().nth(6)?.parse().ok()?;
    for _ in 0..10_000 {
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        if !cmd.is_empty() || flags & PF_KTHREAD != 0 {
            return Some(cmd);
        }
        std::thread::yield_now();
    }
    None
}

/// A field of `/proc/<pid>/status` in KiB (`VmHWM`, `VmRSS`).
pub fn status_kib(pid: i32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = text.lines().find(|l| l.starts_with(&format!("{field}:"))).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Open file descriptors of `pid`.
pub fn fd_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

/// A sleep duration no other process uses: a command line to find an escapee by, since it may
/// have cleared its environment.
pub fn unique_sleep() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(1);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("1000.{}{:04}", std::process::id(), n)
}

/// Debian's zsh, which scripts/test.sh installs: the suites that run in both shells use it.
pub const ZSH: &str = "/usr/bin/zsh";

/// A directory of test data kept beside the repository (`../shared/<sub>`, or one level further
/// up from a worktree), or `$<env>`: the first that holds every file of `files`. Panics naming
/// them when none does (the tests that need it fail, never skip).
pub fn shared_data(sub: &str, env: &str, files: &[&str]) -> std::path::PathBuf {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let candidates = [
        std::env::var_os(env).map(std::path::PathBuf::from),
        Some(repo.join("../shared").join(sub)),
        Some(repo.join("../../shared").join(sub)),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|d| files.iter().all(|f| d.join(f).exists()))
        .unwrap_or_else(|| panic!("{} in ../shared/{sub}/ (or ${env})", files.join(" and ")))
}

/// The bash of the version matrix for `version` (`"3.2"`, `"4.4"`, `"5.3"`; the machine's own
/// 5.2 is `/bin/bash`): the build `../shared/bash/bash-<version>`, reached through a link named
/// `bash` (in `target/tmp/bash-<version>/`), so the session and the oracle both run it as
/// users do, under the name `bash` (`$0`, and the name in bash's messages). Panics when the
/// builds are missing: the matrix fails loudly, never skips.
pub fn bash_build(version: &str) -> &'static str {
    use std::sync::OnceLock;
    static LINKS: OnceLock<Vec<(String, String)>> = OnceLock::new();
    let links = LINKS.get_or_init(|| {
        let builds = shared_data(
            "bash",
            "AGENT_BASH_TEST_BASH_BUILDS",
            &["bash-3.2", "bash-4.4", "bash-5.3"],
        );
        ["3.2", "4.4", "5.3"]
            .iter()
            .map(|v| {
                let target = builds.join(format!("bash-{v}")).canonicalize().unwrap();
                let dir =
                    std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("bash-{v}"));
                std::fs::create_dir_all(&dir).unwrap();
                let link = dir.join("bash");
                if std::fs::read_link(&link).ok().as_deref() != Some(target.as_path()) {
                    // Made beside and renamed over: test processes may do this at once.
                    let tmp = dir.join(format!(".bash-{}", std::process::id()));
                    let _ = std::fs::remove_file(&tmp);
                    std::os::unix::fs::symlink(&target, &tmp).unwrap();
                    std::fs::rename(&tmp, &link).unwrap();
                }
                (v.to_string(), link.to_str().unwrap().to_owned())
            })
            .collect()
    });
    let found = links.iter().find(|(v, _)| v == version);
    &found.unwrap_or_else(|| panic!("no bash {version} in the matrix")).1
}

/// The version of the bash at `shell` as `(major, minor)`, asked of the shell itself.
pub fn bash_version(shell: &str) -> (u32, u32) {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static SEEN: OnceLock<Mutex<HashMap<String, (u32, u32)>>> = OnceLock::new();
    let seen = SEEN.get_or_init(Default::default);
    if let Some(v) = seen.lock().unwrap().get(shell) {
        return *v;
    }
    let out = std::process::Command::new(shell)
        .args(["-c", "echo ${BASH_VERSINFO[0]} ${BASH_VERSINFO[1]}"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text.split_whitespace().map(|w| w.parse().unwrap());
    let v = (it.next().unwrap(), it.next().unwrap());
    seen.lock().unwrap().insert(shell.to_owned(), v);
    v
}

/// The directory of a [`bash_build`] link, when `shell` is one.
pub fn matrix_dir(shell: &str) -> Option<&std::path::Path> {
    let dir = std::path::Path::new(shell).parent()?;
    let name = dir.file_name()?.to_str()?;
    (name.starts_with("bash-") && shell.ends_with("/bash")).then_some(dir)
}
