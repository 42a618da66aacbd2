//! The security review's findings (issue 27, contract §5 and §13), each written as the attack: a
//! prompt-injected agent's command trying to leave its workspace, reach the session protocol,
//! or read what is the user's. Every test here failed on the code before its fix.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_bash::exec::settings::Settings;
use agent_bash::exec::{Origin, Request, Runtime};
use agent_bash::result::BashResult;
use tokio_util::sync::CancellationToken;

/// A runtime on `shell` with its own state directory and shells' `TMPDIR`.
fn runtime_on(shell: &str, mut settings: Settings) -> (Arc<Runtime>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    settings.env.insert("TMPDIR".into(), tmp.to_str().unwrap().into());
    settings.state_dir = Some(dir.path().join("state"));
    let settings = Settings { shell: Some(shell.into()), ..settings };
    let rt = Runtime::new(settings, dir.path().join("session"), dir.path().to_path_buf()).unwrap();
    (Arc::new(rt), dir)
}

async fn call(rt: &Runtime, cwd: &Path, command: &str, timeout: f64) -> BashResult {
    let req = Request {
        origin: Origin::Tool,
        command: command.into(),
        cwd: Some(cwd.to_str().unwrap().into()),
        timeout: Some(timeout),
        ..Default::default()
    };
    rt.run(req, CancellationToken::new(), None).await.unwrap()
}

/// Writes forged status lines (the format of every version so far: `D <seq> <status>`, for the
/// first 200 sequence numbers, and bare statuses) on every descriptor 3–63 the shell has open,
/// in zsh also with `print -u`, which reaches the copies zsh keeps of redirected descriptors.
const FORGE: &str = "for __fd in $(seq 3 63); do [ -e /proc/$$/fd/$__fd ] || continue; \
     for __s in $(seq 1 200); do printf 'D %d 0\\nD %d 7\\n0\\n' $__s $__s >&$__fd; \
     [ -n \"$ZSH_VERSION\" ] && print -u $__fd -r -- \"D $__s 0\"; done; \
     done 2>/dev/null";

in_each_shell!(forged_status_lines_neither_end_the_call_nor_touch_the_next);

/// zsh builtins reach every descriptor the shell holds, its saved copies of redirected ones
/// (`print -u N`, `>&N`) included: none of them may carry a status.
async fn forged_status_lines_neither_end_the_call_nor_touch_the_next(shell: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _d) = runtime_on(shell, Settings::default());
    // Warm the session up, so sequence numbers are under way.
    assert_eq!(call(&rt, dir.path(), "true", 10.0).await.exit_code, Some(0));

    // A forged ending while the command still runs: the call must time out honestly.
    let t = Instant::now();
    let r = call(&rt, dir.path(), &format!("{FORGE}; echo forged; sleep 3001"), 2.0).await;
    assert!(
        r.timed_out,
        "a forged status ended the call: exit {:?} after {:?}",
        r.exit_code,
        t.elapsed()
    );
    assert!(t.elapsed() >= Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(r.output.contains("forged"), "{}", r.output);

    // The next call is intact.
    let r = call(&rt, dir.path(), "echo intact", 10.0).await;
    assert_eq!((r.exit_code, r.text.trim()), (Some(0), "intact"), "{r:?}");

    // A forged line that arrives during a later call (a job of an earlier one) changes
    // nothing in it: its output is all there, with its own status.
    let r =
        call(&rt, dir.path(), &format!("( sleep 1; {FORGE} ) >/dev/null 2>&1 & echo left"), 10.0)
            .await;
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let r = call(
        &rt,
        dir.path(),
        "echo one; sleep 2; echo two; exit_with() { return $1; }; exit_with 3",
        10.0,
    )
    .await;
    assert_eq!((r.exit_code, r.text.trim()), (Some(3), "one\ntwo"), "{r:?}");
    let r = call(&rt, dir.path(), "echo after", 10.0).await;
    assert_eq!((r.exit_code, r.text.trim()), (Some(0), "after"), "{r:?}");
}

/// What the fence cannot deny (chmod, chown, timestamps outside the workspace) is stated in the
/// README's security model, as contract §13 asks when it is not denied by other means.
#[test]
fn readme_states_what_the_fence_does_not_cover() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = readme.split("## Security model").nth(1).expect("a Security model section");
    let section = section.split("\n## ").next().unwrap();
    for needed in
        ["prompt injection", "not metadata", "chmod, chown", "timestamps", "are not denied"]
    {
        assert!(section.contains(needed), "the security model does not say {needed:?}");
    }
    // Each fixed attack names a test that exists (`<file>_<name>` of `tests/suite/<file>.rs`,
    // in the table's last column).
    let tests: String = section
        .lines()
        .filter(|l| l.starts_with("| "))
        .filter_map(|l| l.trim_end_matches('|').rsplit('|').next())
        .collect();
    for file in ["security", "fence", "changes"] {
        let path = format!("{}/tests/suite/{file}.rs", env!("CARGO_MANIFEST_DIR"));
        let this = std::fs::read_to_string(path).unwrap();
        for name in tests.split('`').filter(|w| w.starts_with(&format!("{file}_"))) {
            let f = &name[file.len() + 1..];
            assert!(this.contains(&format!("fn {f}(")), "README names a missing test {name}");
        }
    }
}

/// 150 tool calls, each under its own 900 KiB `session_key`: refused with a clear error (keys
/// are at most 256 bytes), and the backend stays within the README's 64 MiB (it grew to
/// 154 MiB when every key stayed in memory). A 256-byte key still works.
#[tokio::test]
async fn huge_session_keys_are_refused_and_memory_stays_bounded() {
    use super::support::{status_kib, Rpc};
    use serde_json::json;
    let mut rpc = Rpc::start().await;
    let pid = rpc.pid();
    for n in 0..150 {
        let key = format!("{n:03}{}", "k".repeat(900 * 1024));
        let id =
            rpc.send(json!({"type": "tool_call", "command": "true", "session_key": key})).await;
        let r = rpc.response(&id).await;
        assert_eq!(r["success"], false, "key {n} accepted");
        let err = r["error"].as_str().unwrap_or_default();
        assert!(err.contains("session_key") && err.contains("256"), "{r}");
    }
    let d = rpc.tool(json!({"command": "echo ok", "session_key": "k".repeat(256)})).await;
    assert_eq!(d["output"], "ok\n");
    let hwm = status_kib(pid, "VmHWM");
    assert!(hwm <= 64 * 1024, "peak RSS {hwm} KiB");
    rpc.stop().await;
}

/// A project (the directory the backend starts in, so the fence's root) and a place outside
/// it, under one temporary directory.
struct Places {
    _root: tempfile::TempDir,
    project: std::path::PathBuf,
    outside: std::path::PathBuf,
}

fn places() -> Places {
    let root = tempfile::Builder::new().prefix("sec-").tempdir().unwrap();
    let (project, outside) = (root.path().join("project"), root.path().join("outside"));
    std::fs::create_dir_all(&project).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    Places { _root: root, project, outside }
}

/// A runtime started in `start` (no `sandbox_root`: the fence's root is `start`'s project),
/// with its state directory and shells' `TMPDIR` elsewhere.
fn runtime_in(mut settings: Settings, start: &Path) -> (Arc<Runtime>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    settings.env.insert("TMPDIR".into(), tmp.to_str().unwrap().into());
    settings.state_dir = Some(dir.path().join("state"));
    let settings = Settings { shell: Some("/bin/bash".into()), ..settings };
    let rt = Runtime::new(settings, dir.path().join("state/session"), start.to_path_buf()).unwrap();
    (Arc::new(rt), dir)
}

async fn call_as(rt: &Runtime, origin: Origin, key: &str, cwd: &Path, command: &str) -> BashResult {
    let req = Request {
        origin,
        command: command.into(),
        cwd: Some(cwd.to_str().unwrap().into()),
        timeout: Some(60.0),
        session_key: (origin == Origin::Tool).then(|| key.to_string()),
        ..Default::default()
    };
    rt.run(req, CancellationToken::new(), None).await.unwrap()
}

use super::fence::q;

/// Finding 1: a fenced call plants a command in every file of the backend's runtime directory
/// (found from its own output FIFO, `/proc/$$/fd/1`) and state directory (drivers, command
/// files, `spawn.so`, the rc snapshot, the receipt store and its git config), appending,
/// prepending and creating. The user's next commands (a bang command, an unfenced tool call, a
/// new shell that sources the snapshot, a receipt's git) must not run it.
#[tokio::test]
async fn a_fenced_call_cannot_plant_commands_for_unfenced_shells() {
    use agent_bash::fence::SandboxMode;
    let p = places();
    let mut settings = Settings::default();
    settings.sandbox_by_key.insert("agent".into(), SandboxMode::WorkspaceWrite);
    let (rt, d) = runtime_in(settings, &p.project);
    let state = d.path().join("state");
    // The user's shells are there to be attacked: a bang shell and an unfenced tool shell.
    assert_eq!(call_as(&rt, Origin::Bang, "", &p.project, "echo a > a").await.exit_code, Some(0));
    assert_eq!(call_as(&rt, Origin::Tool, "free", &p.project, "true").await.exit_code, Some(0));

    let pwned = p.outside.join("pwned");
    let attack = format!(
        r#"P="touch {pw}"; R=$(dirname "$(dirname "$(dirname "$(readlink /proc/$$/fd/1)")")")
n=0
for f in $(find "$R" {s} -type f 2>/dev/null); do
  n=$((n+1))
  printf '%s\n' "$P" >> "$f"
  {{ printf '%s\n' "$P"; cat "$f"; }} > "$f.new" && mv -f "$f.new" "$f"
  case $f in */config) printf '[core]\n\tfsmonitor = %s\n' "$P" >> "$f";; esac
done 2>/dev/null
for dir in $(find "$R" {s} -type d 2>/dev/null); do
  for name in bash cmd snapshot.bash; do printf '%s\n' "$P" > "$dir/$name"; done
done 2>/dev/null
echo "found $n files in $R""#,
        pw = q(&pwned),
        s = q(&state),
    );
    let r = call_as(&rt, Origin::Tool, "agent", &p.project, &attack).await;
    assert_eq!(r.sandbox, Some("workspace-write"), "{}", r.output);
    let found: usize = r
        .text
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{}", r.output));
    assert!(found >= 5, "the attack found too little to attack: {}", r.output);

    // The user's next commands, in their shells and in new ones, with receipts.
    for (origin, key) in
        [(Origin::Bang, ""), (Origin::Tool, "free"), (Origin::Tool, "new"), (Origin::Bang, "")]
    {
        let r = call_as(&rt, origin, key, &p.project, "echo b >> a && echo ok").await;
        assert_eq!(r.text.trim(), "ok", "{origin:?} {key}: {}", r.output);
    }
    assert!(!pwned.exists(), "a command planted by the fenced call ran unfenced");
}

/// Finding 3: the fence's root is the user's (the project of the directory the backend
/// started in), not the request's: a fenced call with `cwd: "/"` writes nothing outside it,
/// and still writes inside it.
#[tokio::test]
async fn a_request_cwd_never_widens_the_fence() {
    let p = places();
    let settings = Settings {
        sandbox: Some(agent_bash::fence::SandboxMode::WorkspaceWrite),
        ..Default::default()
    };
    let (rt, _d) = runtime_in(settings, &p.project);
    for cwd in [Path::new("/"), p.outside.as_path(), p.project.parent().unwrap()] {
        let escape = format!("touch {}/escaped", q(&p.outside));
        let r = call_as(&rt, Origin::Tool, "default", cwd, &escape).await;
        assert_ne!(r.exit_code, Some(0), "cwd {}: {}", cwd.display(), r.output);
        assert!(r.output.ends_with(agent_bash::fence::NOTE), "{}", r.output);
        assert!(!p.outside.join("escaped").exists(), "cwd {} widened the fence", cwd.display());
        let inside = format!("touch {}/inside && echo made", q(&p.project));
        let r = call_as(&rt, Origin::Tool, "default", cwd, &inside).await;
        assert_eq!(r.text.trim(), "made", "cwd {}: {}", cwd.display(), r.output);
    }
}

/// LOW: a call whose project would be `/` or the home directory gets no receipt and says why
/// (a plain-directory cwd of `/` started a snapshot of the whole file system).
#[tokio::test]
async fn no_receipt_of_the_whole_file_system_or_home() {
    let p = places();
    let (rt, _d) = runtime_in(Settings::default(), &p.project);
    let r = call_as(&rt, Origin::Tool, "default", Path::new("/"), "true").await;
    let why = r.changes_unavailable.clone().unwrap_or_default();
    assert!(why.contains("the whole file system"), "{r:?}");
    let home = std::env::var("HOME").unwrap();
    if !Path::new(&home).join(".git").exists() && Path::new(&home).parent().is_some() {
        let r = call_as(&rt, Origin::Tool, "default", Path::new(&home), "true").await;
        let why = r.changes_unavailable.clone().unwrap_or_default();
        assert!(why.contains("home directory"), "{r:?}");
    }
}

/// Finding 2: undo runs unfenced, so it must never write through a symbolic link. The agent
/// (fenced) makes `sub/.bash_login`, removes `sub`, and puts a link to a folder outside (the
/// home directory in the review) where `sub` was, or the user does (the last run's undo then
/// restored into the link's target, answered success, and its own receipt was empty). Also a
/// link deeper down (`a/b`). The undo is refused, names the link, and writes nothing.
#[tokio::test]
async fn undo_never_writes_through_a_symlink() {
    use agent_bash::changes::{ChangesSettings, UndoError};
    for (dir, user_made) in [("sub", false), ("sub", true), ("a/b", false)] {
        let p = places();
        let settings = Settings {
            sandbox: Some(agent_bash::fence::SandboxMode::WorkspaceWrite),
            changes: ChangesSettings { max_snapshot_ms: 60_000, ..Default::default() },
            ..Default::default()
        };
        let (rt, _d) = runtime_in(settings, &p.project);
        let home = &p.outside;
        let tool = |cmd: String| {
            let (rt, project) = (rt.clone(), p.project.clone());
            async move { call_as(&rt, Origin::Tool, "default", &project, &cmd).await }
        };
        let r = tool(format!("mkdir -p {dir} && echo X > {dir}/.bash_login")).await;
        assert_eq!(r.exit_code, Some(0), "{}", r.output);
        let r = tool(format!("rm -r {dir}")).await;
        let id = r.changes_id.unwrap_or_else(|| panic!("no receipt: {r:?}"));
        if user_made {
            std::os::unix::fs::symlink(home, p.project.join(dir)).unwrap();
        } else {
            let r = tool(format!("ln -s {} {dir}", q(home))).await;
            assert_eq!(r.exit_code, Some(0), "{}", r.output);
        }
        let e = rt.changes().undo(Some(id)).await.expect_err("the undo went through the link");
        assert!(matches!(e, UndoError::Conflict { .. }), "{dir} user={user_made}: {e}");
        let said = e.to_string();
        assert!(said.contains(dir) && said.contains("symbolic link"), "{said}");
        let outside: Vec<_> = std::fs::read_dir(home).unwrap().flatten().collect();
        assert!(outside.is_empty(), "{dir} user={user_made}: undo wrote outside: {outside:?}");
    }
}

/// Findings 5 and 6: while a command runs (its command file, FIFOs and driver exist), after a
/// receipt copied a 0600 `secret.env` into the store and a long output made an artifact,
/// nothing under the state directory or the runtime directory is reachable by group or others,
/// though the backend runs with umask 022; a wider directory and file an older version left
/// in the state directory are tightened at start-up.
#[tokio::test]
async fn nothing_under_state_or_runtime_dirs_is_readable_by_others() {
    use super::support::Rpc;
    use serde_json::json;
    use std::os::unix::fs::PermissionsExt;
    let p = places();
    let git = std::process::Command::new("git")
        .args(["init", "-q"])
        .current_dir(&p.project)
        .status()
        .unwrap();
    assert!(git.success());
    let secret = p.project.join("secret.env");
    std::fs::write(&secret, "TOKEN=one\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    // The user's XDG_RUNTIME_DIR is theirs alone, as a login makes it.
    let run = tempfile::tempdir().unwrap();
    std::fs::set_permissions(run.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let state = tempfile::tempdir().unwrap();
    // An older version's leftovers.
    let old = state.path().join("changes/old-0123/objects/ab");
    std::fs::create_dir_all(&old).unwrap();
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(old.join("cd"), "x").unwrap();
    std::fs::set_permissions(old.join("cd"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let config = state.path().join("config.toml");
    let state_path = state.path().to_path_buf();
    let mut rpc = Rpc::start_wrapped(
        state,
        Some("[changes]\nmax_snapshot_ms = 60000\n"),
        &[],
        &[("XDG_RUNTIME_DIR", run.path().to_str().unwrap())],
        &["sh", "-c", "umask 022; exec \"$0\" \"$@\""],
    )
    .await;
    let cwd = p.project.to_str().unwrap();
    rpc.bash("true").await;
    let d =
        rpc.tool(json!({"command": "echo TOKEN=two > secret.env; seq 1 200000", "cwd": cwd})).await;
    assert!(d["changesId"].is_u64() || d["changes_id"].is_u64(), "no receipt: {d}");
    // The walk is the command: everything of its own run exists while it looks.
    let walk = format!(
        "find {} {} -path {} -prune -o ! -type l -perm /077 -printf '%m %p\\n'; echo walked",
        q(&state_path),
        q(run.path()),
        q(&config),
    );
    let d = rpc.tool(json!({"command": walk, "cwd": cwd})).await;
    assert_eq!(d["output"], "walked\n", "reachable by group or others:\n{}", d["output"]);
    let ours = std::fs::read_dir(run.path()).unwrap().count();
    assert!(ours >= 1, "the runtime directory was not made under XDG_RUNTIME_DIR");
    rpc.stop().await;
}

/// Finding 7: 2 000 distinct session keys, one call each (a shell each, the least recently
/// used closed past `limits.max_sessions`): a closed session's slot is freed, so the backend's
/// resident memory does not grow with the keys (each slot, with its 256-byte key, stayed
/// before). Keys evicted last still get `shell_restarted`.
#[tokio::test]
async fn distinct_session_keys_leave_nothing_behind() {
    use super::support::{status_kib, Rpc};
    use serde_json::json;
    let mut rpc =
        Rpc::start_with(Some("[changes]\nenabled = false\n[limits]\nmax_sessions = 4\n")).await;
    let pid = rpc.pid();
    let key = |n: usize| format!("{n:05}{}", "k".repeat(251));
    let mut rss = Vec::new();
    for n in 0..2000 {
        let id =
            rpc.send(json!({"type": "tool_call", "command": "true", "session_key": key(n)})).await;
        let r = rpc.response(&id).await;
        assert_eq!(r["success"], true, "{r}");
        if n == 999 || n == 1999 {
            rss.push(status_kib(pid, "VmRSS"));
        }
    }
    let grown = rss[1].saturating_sub(rss[0]);
    assert!(grown < 400, "RSS grew {grown} KiB over the last 1000 keys ({rss:?})");
    let d = rpc.tool(json!({"command": "echo again", "session_key": key(1990)})).await;
    assert_eq!(
        (d["output"].as_str(), d["shellRestarted"].as_bool()),
        (Some("again\n"), Some(true))
    );
    rpc.stop().await;
}

/// LOW: the runtime directory (here under an `XDG_RUNTIME_DIR` inside the project) is never
/// part of a receipt: a call that writes one file lists that file alone, and `AGENT_BASH_OWNER`,
/// which every command sees, is listed in the contract's environment (doc/contract.md §5).
#[tokio::test]
async fn the_runtime_directory_is_never_in_a_receipt() {
    use super::support::Rpc;
    use serde_json::json;
    let p = places();
    let run = p.project.join("run");
    std::fs::create_dir(&run).unwrap();
    let mut rpc = Rpc::start_env(
        tempfile::tempdir().unwrap(),
        Some("[changes]\nmax_snapshot_ms = 60000\n"),
        &[],
        &[("XDG_RUNTIME_DIR", run.to_str().unwrap())],
    )
    .await;
    let cwd = p.project.to_str().unwrap();
    rpc.tool(json!({"command": "true", "cwd": cwd})).await;
    let d = rpc.tool(json!({"command": "echo x > a; echo $AGENT_BASH_OWNER", "cwd": cwd})).await;
    assert!(std::fs::read_dir(&run).unwrap().count() >= 1, "no runtime directory under {run:?}");
    let paths: Vec<&str> =
        d["changes"].as_array().unwrap().iter().filter_map(|c| c["path"].as_str()).collect();
    assert_eq!(paths, ["a"], "{d}");
    assert!(d["output"].as_str().unwrap().len() > 2, "{d}");
    let contract =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/doc/contract.md")).unwrap();
    assert!(contract.contains("`AGENT_BASH_OWNER=<backend id>`"));
    rpc.stop().await;
}
