//! contract §13 change receipts and undo, with real git, through the real binary (`exec --json`,
//! `rpc`). The MCP wire is in `mcp.rs` (`mcp_sdk_changes_and_bash_undo`), Neovim's commands in
//! `nvim.rs` (`nvim_undo_and_diff_commands`).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

use super::support::{Rpc, BIN};

/// A generous snapshot budget: a loaded CI machine must not turn receipts off mid-test.
const CONFIG: &str = "[changes]\nmax_snapshot_ms = 60000\n";

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Every file under `dir` (recursively, symlinks as links) with its bytes and mode: two equal
/// maps mean byte-identical trees.
fn files(dir: &Path) -> BTreeMap<PathBuf, (Vec<u8>, u32)> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, (Vec<u8>, u32)>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            if meta.is_dir() {
                out.insert(rel.clone(), (b"<dir>".to_vec(), meta.permissions().mode()));
                walk(root, &p, out);
            } else if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&p).unwrap();
                out.insert(rel, (target.to_string_lossy().as_bytes().to_vec(), 0o120000));
            } else {
                out.insert(rel, (std::fs::read(&p).unwrap(), meta.permissions().mode()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// The project's files without its `.git`.
fn work_files(dir: &Path) -> BTreeMap<PathBuf, (Vec<u8>, u32)> {
    files(dir).into_iter().filter(|(p, _)| !p.starts_with(".git")).collect()
}

/// A committed repository: a.txt, b.txt, run.sh, old.txt, keep/x, and ignore rules of every
/// kind git knows: `.gitignore`, `.git/info/exclude`, the user's `core.excludesFile`.
fn repo(home: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    git(p, &["init", "-q"]);
    for (f, t) in [
        ("a.txt", "a\n"),
        ("b.txt", "b\n"),
        ("run.sh", "echo run\n"),
        ("old.txt", "old\n"),
        ("keep/x", "x\n"),
    ] {
        write(&p.join(f), t);
    }
    chmod(&p.join("run.sh"), 0o644);
    write(&p.join(".gitignore"), "*.log\nbuild/\n");
    write(&p.join(".git/info/exclude"), "secret.txt\n");
    write(
        &home.join(".gitconfig"),
        &format!("[core]\n\texcludesFile = {}\n", home.join("global-ignore").display()),
    );
    write(&home.join("global-ignore"), "*.tmp\n");
    git(p, &["add", "-A"]);
    git(p, &["commit", "-qm", "init"]);
    dir
}

/// `agent-bash exec --json` in `cwd` with a private state dir and HOME.
fn exec_json(state: &Path, home: &Path, cwd: &Path, config: &str, command: &str) -> Value {
    let cfg = state.join("c.toml");
    std::fs::write(&cfg, format!("state_dir = {:?}\n{config}", state.to_str().unwrap())).unwrap();
    let out = Command::new(BIN)
        .arg("--log-file")
        .arg(state.join("log"))
        .args(["exec", "--json", "--config"])
        .arg(&cfg)
        .arg("--cwd")
        .arg(cwd)
        .args(["--", command])
        .env("HOME", home)
        .env_remove("XDG_CONFIG_HOME")
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn changes(r: &Value) -> Vec<(String, String)> {
    r["changes"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| {
                    (
                        c["path"].as_str().unwrap().to_string(),
                        c["kind"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items.iter().map(|(p, k)| (p.to_string(), k.to_string())).collect()
}

#[test]
fn changes_in_a_git_repo_are_exact_and_its_git_dir_is_untouched() {
    let (state, home) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let repo = repo(home.path());
    let p = repo.path();
    let git_before = files(&p.join(".git"));
    // Run from a subdirectory: paths stay relative to the work tree's root.
    let command = "echo new > ../c.txt; echo more >> ../a.txt; rm ../b.txt; chmod +x ../run.sh; \
                   mv ../old.txt ../new.txt; echo z > x2; echo log > ../app.log; mkdir -p ../build; \
                   echo o > ../build/out; echo s > ../secret.txt; echo t > ../t.tmp";
    let r = exec_json(state.path(), home.path(), &p.join("keep"), CONFIG, command);
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(
        changes(&r),
        pairs(&[
            ("a.txt", "modified"),
            ("b.txt", "deleted"),
            ("c.txt", "added"),
            ("keep/x2", "added"),
            ("new.txt", "added"),
            ("old.txt", "deleted"),
            ("run.sh", "mode"),
        ]),
        "{r}"
    );
    assert_eq!(r["changes_count"], 7);
    assert!(r["changes_id"].as_u64().is_some(), "{r}");
    assert_eq!(
        r["output"],
        "(no output)\n\n[Changed files: M a.txt, D b.txt, A c.txt, A keep/x2, A new.txt, D old.txt, X run.sh]"
    );
    assert_eq!(files(&p.join(".git")), git_before, "the project's .git changed");

    // Nothing changed: a receipt with no changes and no note; ignored files never show up.
    let r = exec_json(
        state.path(),
        home.path(),
        p,
        CONFIG,
        "echo hi; echo more >> app.log; touch build/more",
    );
    assert_eq!(r["output"], "hi\n");
    assert_eq!(r["changes_count"], 0, "{r}");
    assert!(r.get("changes").is_none() && r.get("changes_id").is_none(), "{r}");
    assert_eq!(files(&p.join(".git")), git_before, "the project's .git changed");
}

#[test]
fn changes_in_a_plain_directory_and_a_symlink() {
    let (state, home) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    write(&p.join("keep.txt"), "k\n");
    write(&p.join("edit.txt"), "e\n");
    write(&p.join(".gitignore"), "out/\n");
    let r = exec_json(
        state.path(),
        home.path(),
        p,
        CONFIG,
        "echo 2 >> edit.txt; rm keep.txt; ln -s edit.txt link; mkdir -p out d; echo x > out/x; echo y > d/y",
    );
    assert_eq!(
        changes(&r),
        pairs(&[
            ("d/y", "added"),
            ("edit.txt", "modified"),
            ("keep.txt", "deleted"),
            ("link", "added")
        ]),
        "{r}"
    );
    // No .git appears in a plain directory: the store is ours, in the state dir.
    assert!(!p.join(".git").exists());
    assert!(state.path().join("changes").is_dir());
}

#[test]
fn changes_limits_budget_and_off_switch() {
    let (state, home) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dir = tempfile::tempdir().unwrap();
    for i in 0..5 {
        write(&dir.path().join(format!("f{i}")), "x\n");
    }
    let over = format!("{CONFIG}max_files = 3\n");
    let r = exec_json(state.path(), home.path(), dir.path(), &over, "echo a > new; echo ran");
    assert_eq!(r["output"], "ran\n", "the command runs and its text has no note: {r}");
    let why = r["changes_unavailable"].as_str().unwrap_or_default();
    assert!(why.contains("5 files, over changes.max_files (3)"), "{r}");
    assert!(r.get("changes").is_none() && r.get("changes_count").is_none(), "{r}");

    let bytes = format!("{CONFIG}max_bytes = 4\n");
    let r = exec_json(state.path(), home.path(), dir.path(), &bytes, "true");
    let why = r["changes_unavailable"].as_str().unwrap_or_default();
    assert!(why.contains("over changes.max_bytes (4)"), "{r}");

    // A 1 ms budget: no receipt for this run, with the reason, and the command unharmed.
    let fresh = tempfile::tempdir().unwrap();
    let r = exec_json(
        fresh.path(),
        home.path(),
        dir.path(),
        "[changes]\nmax_snapshot_ms = 1\n",
        "echo ok",
    );
    assert_eq!(r["output"], "ok\n");
    assert!(r["changes_unavailable"].as_str().is_some_and(|s| !s.is_empty()), "{r}");

    let r = exec_json(
        state.path(),
        home.path(),
        dir.path(),
        "[changes]\nenabled = false\n",
        "echo b > other",
    );
    assert_eq!(r["output"], "(no output)");
    for k in ["changes", "changes_count", "changes_id", "changes_unavailable"] {
        assert!(r.get(k).is_none(), "{k} in {r}");
    }
    assert!(!state.path().join("changes").join("off").exists());
}

#[test]
fn changes_settings_are_checked() {
    let state = tempfile::tempdir().unwrap();
    let cfg = state.path().join("c.toml");
    std::fs::write(&cfg, "[changes]\nmax_snapshot_ms = 0\n").unwrap();
    let out = Command::new(BIN)
        .args(["exec", "--config"])
        .arg(&cfg)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("changes.max_snapshot_ms"), "{err}");
    std::fs::write(&cfg, "[changes]\nmax_file = 3\n").unwrap();
    let out = Command::new(BIN)
        .args(["exec", "--config"])
        .arg(&cfg)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "unknown keys are errors");
}

async fn rpc_in(home: &Path) -> Rpc {
    Rpc::start_env(
        tempfile::tempdir().unwrap(),
        Some(CONFIG),
        &[],
        &[("HOME", home.to_str().unwrap())],
    )
    .await
}

async fn undo(rpc: &mut Rpc, id: Option<u64>) -> Value {
    let mut req = json!({"type": "undo"});
    if let Some(id) = id {
        req["changes_id"] = json!(id);
    }
    let rid = rpc.send(req).await;
    rpc.response(&rid).await
}

#[tokio::test]
async fn changes_undo_round_trip_refusal_and_undo_of_undo_over_rpc() {
    let home = tempfile::tempdir().unwrap();
    let repo = repo(home.path());
    let p = repo.path();
    let git_before = files(&p.join(".git"));
    let mut rpc = rpc_in(home.path()).await;
    let before = work_files(p);
    let cwd = p.to_str().unwrap();
    let r = rpc
        .tool(json!({"cwd": cwd, "command": "printf 'A2\\n' > a.txt; rm b.txt; mkdir -p n/m; echo c > n/m/c.txt; chmod +x run.sh; mv old.txt new.txt"}))
        .await;
    assert_eq!(
        changes(&json!({"changes": r["changes"]})),
        pairs(&[
            ("a.txt", "modified"),
            ("b.txt", "deleted"),
            ("n/m/c.txt", "added"),
            ("new.txt", "added"),
            ("old.txt", "deleted"),
            ("run.sh", "mode"),
        ]),
        "camelCase wire: {r}"
    );
    assert_eq!(r["changesCount"], 6);
    let id = r["changesId"].as_u64().unwrap();
    let after = work_files(p);

    let u = undo(&mut rpc, Some(id)).await;
    assert_eq!(u["success"], true, "{u}");
    assert_eq!(work_files(p), before, "undo put every file back, modes and folders included");
    assert_eq!(u["data"]["undone"], id);
    assert!(u["data"]["output"].as_str().unwrap().starts_with(&format!("Undid run {id} (")), "{u}");
    assert_eq!(u["data"]["changesCount"], 6, "{u}");
    let undo_id = u["data"]["changesId"].as_u64().unwrap();
    assert_ne!(undo_id, id);
    assert_eq!(
        u["data"]["changes"][0],
        json!({"path": "a.txt", "kind": "modified"}),
        "the undo is a run with its own receipt: {u}"
    );

    // The undo of the undo brings the run's result back; with no id, the newest run is undone.
    let u = undo(&mut rpc, None).await;
    assert_eq!(u["success"], true, "{u}");
    assert_eq!(u["data"]["undone"], undo_id);
    assert_eq!(work_files(p), after);

    // A file changed since: refused, nothing touched, the path named.
    let r = rpc.tool(json!({"cwd": cwd, "command": "echo 3 >> a.txt; echo d > d.txt"})).await;
    let id = r["changesId"].as_u64().unwrap();
    write(&p.join("d.txt"), "edited by hand\n");
    let now = work_files(p);
    let u = undo(&mut rpc, Some(id)).await;
    assert_eq!(u["success"], false, "{u}");
    assert_eq!(u["error"], format!("Not undone: this file changed since run {id}: d.txt"));
    assert_eq!(u["data"]["conflicts"], json!(["d.txt"]));
    assert_eq!(work_files(p), now, "a refused undo touches nothing");

    // Bad ids: clear errors, and the backend goes on.
    let u = undo(&mut rpc, Some(999)).await;
    assert_eq!(u["error"], "No run with changes has id 999 in this session");
    let rid = rpc.send(json!({"type": "undo", "changes_id": "x"})).await;
    let u = rpc.response(&rid).await;
    assert_eq!(u["success"], false);
    assert!(u["error"].as_str().unwrap().contains("changes_id"), "{u}");

    // A bang command (`bash`) gets a receipt too; its output stays the reference's.
    let d =
        rpc.send(json!({"type": "bash", "command": "echo e > e.txt; echo done", "cwd": cwd})).await;
    let r = rpc.response(&d).await;
    assert_eq!(r["data"]["output"], "done\n");
    assert_eq!(r["data"]["changes"], json!([{"path": "e.txt", "kind": "added"}]));
    assert_eq!(files(&p.join(".git")), git_before, "the project's .git changed");
    rpc.stop().await;
}

#[tokio::test]
async fn changes_of_overlapping_runs_are_serialized_and_complete() {
    let home = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().to_str().unwrap().to_string();
    let mut rpc = rpc_in(home.path()).await;
    // Two runs in one project at once, in two sessions: each sees at least its own file, the
    // store is not corrupted, and the next receipt is exact.
    let a = rpc
        .send(json!({"type": "tool_call", "cwd": cwd, "session_key": "a", "command": "for i in 1 2 3 4 5; do echo $i > a$i; done"}))
        .await;
    let b = rpc
        .send(json!({"type": "tool_call", "cwd": cwd, "session_key": "b", "command": "for i in 1 2 3 4 5; do echo $i > b$i; done"}))
        .await;
    let ra = rpc.response(&a).await;
    let rb = rpc.response(&b).await;
    for (r, prefix) in [(&ra, "a"), (&rb, "b")] {
        let paths: Vec<String> =
            changes(&json!({"changes": r["data"]["changes"]})).into_iter().map(|c| c.0).collect();
        for i in 1..=5 {
            assert!(paths.contains(&format!("{prefix}{i}")), "{prefix}{i} missing: {r}");
        }
    }
    let r = rpc.tool(json!({"cwd": cwd, "command": "rm a1 b5"})).await;
    assert_eq!(
        r["changes"],
        json!([{"path": "a1", "kind": "deleted"}, {"path": "b5", "kind": "deleted"}])
    );
    rpc.stop().await;
}

/// One step of [`changes_seen_by_the_watch_equal_full_snapshots`]: what the test does to the
/// files first (outside any run), the command, and the receipt it must get.
type Step = (fn(&Path, &Path), &'static str, &'static [(&'static str, &'static str)]);

fn nothing(_: &Path, _: &Path) {}

/// The receipts of a long-lived backend, whose warm snapshots re-read only the folders its
/// watch saw change, equal those of full snapshots (`watch = false`), and both equal what
/// happened, through new, moved and removed folders, ignore rules that change (a
/// `.gitignore`, `.git/info/exclude`, the user's excludes file), folders ignored at start,
/// empty ones, glob characters in names, and edits made between runs (never reported).
#[tokio::test]
async fn changes_seen_by_the_watch_equal_full_snapshots() {
    let steps: &[Step] = &[
        (nothing, "mkdir -p n/m && echo 1 > n/m/f", &[("n/m/f", "added")]),
        (nothing, "echo 2 > n/m/f", &[("n/m/f", "modified")]),
        (
            nothing,
            "mkdir -p build/x && echo 1 > build/x/o && echo 1 > build.txt",
            &[("build.txt", "added")],
        ),
        (|p, _| write(&p.join("a.txt"), "by hand\n"), "true", &[]),
        (nothing, "cat a.txt >/dev/null", &[]),
        (nothing, "mv n m2", &[("m2/m/f", "added"), ("n/m/f", "deleted")]),
        (nothing, "echo 3 > m2/m/f", &[("m2/m/f", "modified")]),
        (nothing, "rm -r m2", &[("m2/m/f", "deleted")]),
        (nothing, "echo 1 > empty/f", &[("empty/f", "added")]),
        (nothing, "echo 1 > onlylog/y.txt", &[("onlylog/y.txt", "added")]),
        (nothing, "mkdir 'we*rd [d]' && echo 1 > 'we*rd [d]/f'", &[("we*rd [d]/f", "added")]),
        (
            nothing,
            "echo 2 > 'we*rd [d]/f'; echo 2 > keep/x",
            &[("keep/x", "modified"), ("we*rd [d]/f", "modified")],
        ),
        (
            nothing,
            "printf '*.log\\n' > .gitignore",
            &[(".gitignore", "modified"), ("build/x/o", "added")],
        ),
        (nothing, "echo 2 > build/x/o", &[("build/x/o", "modified")]),
        (
            |_, home| write(&home.join("global-ignore"), "\n"),
            "echo 2 > cache.tmp/a",
            &[("cache.tmp/a", "modified")],
        ),
        (
            |p, _| write(&p.join(".git/info/exclude"), "\n"),
            "echo 2 > secret.txt",
            &[("secret.txt", "modified")],
        ),
        (
            nothing,
            "mkdir -p deep/a/b/c && touch deep/a/b/c/f && mv deep/a deep/z",
            &[("deep/z/b/c/f", "added")],
        ),
        (nothing, "echo 1 > deep/z/b/c/f; rm -r deep", &[("deep/z/b/c/f", "deleted")]),
    ];
    let mut seen: Vec<Vec<Vec<(String, String)>>> = Vec::new();
    for watch in [true, false] {
        let home = tempfile::tempdir().unwrap();
        let repo = repo(home.path());
        let p = repo.path();
        // Present before the backend starts: an empty folder, one holding only ignored files,
        // files the excludes hide.
        std::fs::create_dir(p.join("empty")).unwrap();
        write(&p.join("onlylog/x.log"), "log\n");
        write(&p.join("cache.tmp/a"), "1\n");
        write(&p.join("secret.txt"), "1\n");
        let config = format!("{CONFIG}watch = {watch}\n");
        let mut rpc = Rpc::start_env(
            tempfile::tempdir().unwrap(),
            Some(&config),
            &[],
            &[("HOME", home.path().to_str().unwrap())],
        )
        .await;
        let cwd = p.to_str().unwrap();
        let r = rpc.tool(json!({"cwd": cwd, "command": "true"})).await;
        assert_eq!(r["changesCount"], 0, "{r}");
        let mut got = Vec::new();
        for (i, (before, command, want)) in steps.iter().enumerate() {
            before(p, home.path());
            let r = rpc.tool(json!({"cwd": cwd, "command": command})).await;
            let changes = changes(&r);
            assert_eq!(changes, pairs(want), "watch = {watch}, step {i} `{command}`: {r}");
            got.push(changes);
        }
        seen.push(got);
        rpc.stop().await;
    }
    assert_eq!(seen[0], seen[1]);
}

/// A named pipe (`mkfifo`) at `path`: a command and the test meet there.
pub(super) fn fifo(path: &Path) -> PathBuf {
    let out = Command::new("mkfifo").arg(path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    path.to_path_buf()
}

/// Waits (off the test's runtime) until a command writes `path` and closes it.
pub(super) async fn heard(path: &Path) {
    let p = path.to_path_buf();
    tokio::task::spawn_blocking(move || std::fs::read(p).unwrap()).await.unwrap();
}

/// Lets a command blocked reading `path` go on.
pub(super) async fn release(path: &Path) {
    let p = path.to_path_buf();
    tokio::task::spawn_blocking(move || std::fs::write(p, "go\n").unwrap()).await.unwrap();
}

fn changes_with_overlap(r: &Value) -> Vec<(String, bool)> {
    r["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["path"].as_str().unwrap().to_string(), c["overlap"] == true))
        .collect()
}

/// Two backends (`rpc` processes, each with its own state) run one command each in one
/// project, overlapping in time: A writes `a_only`, then B starts and writes `shared` while A
/// still runs, then A ends, then B writes `b_only`. Each receipt lists exactly the files that
/// changed during its own run, `shared` in both and marked as overlapping; undo refuses a run
/// with such a file and touches nothing, and a run alone is exact and undone as before.
#[tokio::test]
async fn changes_of_runs_overlapping_in_two_backends_are_marked_and_undo_refuses_them() {
    let (home, project, sync) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write(&project.path().join("base.txt"), "base\n");
    let cwd = project.path().to_str().unwrap();
    let s = |name: &str| fifo(&sync.path().join(name));
    let (a_wrote, a_go, b_wrote, b_go) = (s("a_wrote"), s("a_go"), s("b_wrote"), s("b_go"));
    let (mut a, mut b) = (warm_in(home.path(), cwd).await, warm_in(home.path(), cwd).await);
    let run_a = format!(
        "echo a > a_only; echo > {}; cat {} > /dev/null",
        a_wrote.display(),
        a_go.display()
    );
    let ra = a.send(json!({"type": "tool_call", "cwd": cwd, "command": run_a})).await;
    heard(&a_wrote).await;
    let run_b = format!(
        "echo s > shared; echo > {}; cat {} > /dev/null; echo b > b_only",
        b_wrote.display(),
        b_go.display()
    );
    let rb = b.send(json!({"type": "tool_call", "cwd": cwd, "command": run_b})).await;
    heard(&b_wrote).await;
    release(&a_go).await;
    let ra = a.response(&ra).await;
    release(&b_go).await;
    let rb = b.response(&rb).await;
    let (ra, rb) = (&ra["data"], &rb["data"]);
    assert_eq!(
        changes_with_overlap(ra),
        [("a_only".to_string(), false), ("shared".to_string(), true)],
        "{ra}"
    );
    assert_eq!(
        changes_with_overlap(rb),
        [("b_only".to_string(), false), ("shared".to_string(), true)],
        "{rb}"
    );

    let now = work_files(project.path());
    for (rpc, r) in [(&mut a, ra), (&mut b, rb)] {
        let id = r["changesId"].as_u64().unwrap();
        let u = undo(rpc, Some(id)).await;
        assert_eq!(u["success"], false, "{u}");
        assert_eq!(
            u["error"],
            format!("Not undone: run {id} overlapped another run in this project, and this file changed while both ran, so either may have changed it: shared")
        );
        assert_eq!(u["data"]["conflicts"], json!(["shared"]));
    }
    assert_eq!(work_files(project.path()), now, "a refused undo touches nothing");

    // Alone again: exact, unmarked, undone.
    let r = a.tool(json!({"cwd": cwd, "command": "echo z > z; rm a_only"})).await;
    assert_eq!(
        r["changes"],
        json!([{"path": "a_only", "kind": "deleted"}, {"path": "z", "kind": "added"}])
    );
    let u = undo(&mut a, r["changesId"].as_u64()).await;
    assert_eq!(u["success"], true, "{u}");
    assert_eq!(work_files(project.path()), now);
    b.stop().await;
    a.stop().await;
}

/// A backend and the project's receipt engine are SIGKILLed while the engine's `git add` is in
/// the middle of a snapshot (a `changes.git` wrapper holds it there, with `index.lock` taken as
/// git takes it); that git then finishes on its own. A new backend with the same state starts
/// another engine (the killed one's name went with it), and its receipts are exact.
#[tokio::test]
async fn changes_recover_from_a_backend_and_engine_killed_mid_snapshot() {
    let (home, project, sync, runtime) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    write(&project.path().join("base.txt"), "base\n");
    let real_git = Command::new("sh").args(["-c", "command -v git"]).output().unwrap();
    let real_git = String::from_utf8(real_git.stdout).unwrap().trim().to_string();
    let (inside, go) = (fifo(&sync.path().join("inside")), fifo(&sync.path().join("go")));
    let block = sync.path().join("block");
    let wrapper = sync.path().join("git");
    write(
        &wrapper,
        &format!(
            "#!/bin/sh\ncase \" $* \" in *' add '*) if [ -e {block:?} ]; then rm {block:?}; : > \"$GIT_DIR/index.lock\"; echo > {inside:?}; cat {go:?} > /dev/null; rm -f \"$GIT_DIR/index.lock\"; fi;; esac\nexec {real_git:?} \"$@\"\n"
        ),
    );
    chmod(&wrapper, 0o755);
    let config = format!("{CONFIG}git = {:?}\n", wrapper.to_str().unwrap());
    let env = [
        ("HOME", home.path().to_str().unwrap()),
        ("XDG_RUNTIME_DIR", runtime.path().to_str().unwrap()),
    ];
    let mut a = Rpc::start_env(tempfile::tempdir().unwrap(), Some(&config), &[], &env).await;
    let cwd = project.path().to_str().unwrap();
    let r = a.tool(json!({"cwd": cwd, "command": "echo 1 > one"})).await;
    assert_eq!(r["changes"], json!([{"path": "one", "kind": "added"}]), "{r}");

    // The next snapshot has something to read, and blocks in its git.
    write(&project.path().join("by-hand.txt"), "x\n");
    write(&block, "");
    let _lost =
        a.send(json!({"type": "tool_call", "cwd": cwd, "command": "echo lost > lost"})).await;
    heard(&inside).await;
    let engine = engine_pid(runtime.path());
    unsafe {
        libc::kill(engine, libc::SIGKILL);
        libc::kill(a.pid(), libc::SIGKILL);
    }
    a.child.wait().await.unwrap();
    // The killed snapshot's git goes on and finishes by itself.
    release(&go).await;

    // The same state (the store the killed engine was writing), a new backend.
    let mut b = Rpc::start_env(a.state, Some(&config), &[], &env).await;
    let r = b.tool(json!({"cwd": cwd, "command": "echo 2 > two; rm one"})).await;
    assert_eq!(
        r["changes"],
        json!([{"path": "one", "kind": "deleted"}, {"path": "two", "kind": "added"}]),
        "{r}"
    );
    let u = undo(&mut b, r["changesId"].as_u64()).await;
    assert_eq!(u["success"], true, "{u}");
    assert!(project.path().join("one").exists() && !project.path().join("two").exists());
    b.stop().await;
}

/// The pid of the one receipt engine started by backends whose `XDG_RUNTIME_DIR` is `runtime`
/// (an engine keeps the environment of the backend that started it).
fn engine_pid(runtime: &Path) -> i32 {
    let mark = format!("XDG_RUNTIME_DIR={}", runtime.display()).into_bytes();
    let engines: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let read =
                |what: &str| std::fs::read(format!("/proc/{pid}/{what}")).unwrap_or_default();
            let cmdline = read("cmdline");
            cmdline.split(|&b| b == 0).any(|a| a == b"__changes-engine")
                && read("environ").split(|&b| b == 0).any(|v| v == mark)
        })
        .collect();
    assert_eq!(engines.len(), 1, "one engine for the project: {engines:?}");
    engines[0]
}

/// An engine outlives a backend that ends normally (an `exec`, an MCP server closed by its
/// client) and serves the next backend of the project: one engine, its watch and snapshots kept.
/// The backend's shutdown sweep killed it as an orphan of its own before (SIGTERM), so every
/// short-lived backend started a new engine and a full first snapshot.
#[tokio::test]
async fn changes_engine_outlives_a_backend_that_ends_and_serves_the_next() {
    let (home, project, runtime) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let env = [
        ("HOME", home.path().to_str().unwrap()),
        ("XDG_RUNTIME_DIR", runtime.path().to_str().unwrap()),
    ];
    let cwd = project.path().to_str().unwrap();
    let mut a = Rpc::start_env(tempfile::tempdir().unwrap(), Some(CONFIG), &[], &env).await;
    let r = a.tool(json!({"cwd": cwd, "command": "echo 1 > one"})).await;
    assert_eq!(r["changes"], json!([{"path": "one", "kind": "added"}]), "{r}");
    let engine = engine_pid(runtime.path());
    let state = a.stop().await;
    assert!(
        Path::new(&format!("/proc/{engine}")).exists(),
        "the engine {engine} ended with the backend that started it"
    );
    let mut b = Rpc::start_env(state, Some(CONFIG), &[], &env).await;
    let r = b.tool(json!({"cwd": cwd, "command": "echo 2 > two"})).await;
    assert_eq!(r["changes"], json!([{"path": "two", "kind": "added"}]), "{r}");
    assert_eq!(engine_pid(runtime.path()), engine, "the next backend took the same engine");
    b.stop().await;
}

/// An engine outlives a backend that is SIGKILLed (other backends may be its clients) by its
/// linger, then ends, its folder removed too (the runtime base cleaned at logout, a test's
/// temporary folder). It used to stay for good, one process per removed folder. Waited for on
/// a pidfd, which becomes readable when the process ends (Linux's).
#[cfg(target_os = "linux")]
#[tokio::test]
async fn changes_engine_ends_once_its_folder_is_gone() {
    let (home, project, runtime) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let env = [
        ("HOME", home.path().to_str().unwrap()),
        ("XDG_RUNTIME_DIR", runtime.path().to_str().unwrap()),
    ];
    let mut a = Rpc::start_env(tempfile::tempdir().unwrap(), Some(CONFIG), &[], &env).await;
    let cwd = project.path().to_str().unwrap();
    let r = a.tool(json!({"cwd": cwd, "command": "echo 1 > one"})).await;
    assert_eq!(r["changes"], json!([{"path": "one", "kind": "added"}]), "{r}");
    let engine = engine_pid(runtime.path());
    // SAFETY: pidfd_open on a pid we just read; the descriptor is ours to close.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, engine, 0) } as i32;
    assert!(pidfd >= 0, "engine {engine}: {}", std::io::Error::last_os_error());
    // SAFETY: the backend this test started.
    unsafe { libc::kill(a.pid(), libc::SIGKILL) };
    a.child.wait().await.unwrap();
    drop(runtime);
    // The engine looks 5 s (its linger) after its last client left; 30 s is ample.
    let ended = tokio::task::spawn_blocking(move || {
        let mut p = libc::pollfd { fd: pidfd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd we own, then its descriptor closed.
        let n = unsafe { libc::poll(&mut p, 1, 30_000) };
        unsafe { libc::close(pidfd) };
        n == 1
    })
    .await
    .unwrap();
    if !ended {
        // SAFETY: the engine this test started, left behind: do not leave it running.
        unsafe { libc::kill(engine, libc::SIGKILL) };
    }
    assert!(ended, "the engine {engine} still runs 30 s after its folder was removed");
}

/// The Python a fenced command runs in the attacks below: `reach` connects to every receipt
/// engine it can find (abstract names listed in /proc/net/unix, socket files under `$ENGINES`)
/// and holds a run of its own open in each; `squat` holds the names an engine of the project
/// would take (computed from the public naming: FNV-1a of the root, the settings as JSON and,
/// since names are abstract, the protocol) before any engine runs, and answers as an engine
/// with a forged receipt. Each tells the test through `ready`, then waits for `go`.
#[cfg(target_os = "linux")]
const ATTACK: &str = r#"
import glob, json, os, socket, sys, threading
mode, root, settings, ready, go, log = sys.argv[1:7]
out = open(log, "a", buffering=1)
def fnv(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
    return h
def lines(conn):
    f = conn.makefile("rwb", buffering=0)
    return f, iter(f.readline, b"")
held = []
if mode == "page":
    # The engine's shared page, through any process that holds it: a claim in every slot, one
    # snapshot number each, would become runs that never end.
    fds = []
    for proc in glob.glob("/proc/[0-9]*"):
        try:
            if open(proc + "/comm").read().strip() != "agent-bash":
                continue
            fds += [proc + "/fd/" + n for n in os.listdir(proc + "/fd")]
        except OSError as e:
            out.write("refused %s errno %d\n" % (proc, e.errno))
    for fd in fds:
        try:
            if not os.readlink(fd).startswith("/memfd:agent-bash-engine"):
                continue
            f = os.open(fd, os.O_RDWR)
        except OSError as e:
            out.write("refused %s errno %d\n" % (fd, e.errno))
            continue
        claims = b"".join(((1 << 62) | seq).to_bytes(8, "little") for seq in range(504))
        os.pwrite(f, claims, 64)
        out.write("wrote %s\n" % fd)
elif mode == "reach":
    places = []
    for row in open("/proc/net/unix").read().splitlines()[1:]:
        cols = row.split()
        if len(cols) >= 8 and cols[7].startswith("@agent-bash.engine-"):
            places.append("\0" + cols[7][1:])
    places += glob.glob(os.environ["ENGINES"] + "/*/*.sock")
    for place in places:
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(place)
        except OSError as e:
            out.write("refused %r errno %d\n" % (place, e.errno))
            continue
        f, _ = lines(s)
        hello = {"id": 0, "ask": "hello", "root": root, "is_git": False,
                 "settings": json.loads(settings), "state_root": "/nonexistent", "own": []}
        f.write((json.dumps(hello) + "\n").encode())
        out.write("hello %r %s\n" % (place, f.readline().decode().strip()))
        f.write(b'{"id":1,"ask":"begin","paths":[]}\n')
        out.write("begin %s\n" % f.readline().decode().strip())
        held.append(s)
else:
    key = root.encode() + b"\0" + settings.encode()
    uid = os.geteuid()
    names = ["\0agent-bash.engine-%d-%016x" % (uid, fnv(key + (PROTOCOL).to_bytes(4, "little"))),
             "/dev/shm/agent-bash.engines-%d/%016x.sock" % (uid, fnv(key))]
    def serve(conn):
        f, it = lines(conn)
        for line in it:
            ask = json.loads(line)
            out.write("asked %s\n" % ask["ask"])
            reply = {"hello": {"reply": "hello", "shadow": "/nonexistent", "pid": 1},
                     "begin": {"reply": "begun", "run": 7, "entries": []},
                     "end": {"reply": "ended", "deltas": [{"path": list(b"forged.txt"),
                             "before": None, "after": {"mode": 33188, "oid": [1] * 20, "size": 3}}]},
                     }[ask["ask"]]
            reply["id"] = ask["id"]
            f.write((json.dumps(reply) + "\n").encode())
    def accept(s):
        while True:
            conn, _ = s.accept()
            threading.Thread(target=serve, args=(conn,), daemon=True).start()
    for name in names:
        s = socket.socket(socket.AF_UNIX)
        try:
            s.bind(name)
            s.listen(8)
        except OSError as e:
            out.write("cannot hold %r: %s\n" % (name, e))
            continue
        out.write("holding %r\n" % name)
        held.append(s)
        threading.Thread(target=accept, args=(s,), daemon=True).start()
open(ready, "w").write("x\n")
open(go).read()
"#;

/// The portable paths (`AGENT_BASH_PORTABLE=1`, `make test`'s second run) have no fence (the
/// attacks on it run in the first) and no watch.
fn portable() -> bool {
    std::env::var("AGENT_BASH_PORTABLE").as_deref() == Ok("1")
}

/// The interpreter itself (not a shim that may look at `$HOME`).
#[cfg(target_os = "linux")]
fn python() -> String {
    let out = Command::new("python3").args(["-c", "import sys; print(sys.executable)"]).output();
    String::from_utf8(out.unwrap().stdout).unwrap().trim().to_string()
}

/// A fenced backend (workspace-write in `project`, receipts off so that none of its own runs
/// overlaps the victim's) whose one call runs [`ATTACK`] in `mode` and waits for `go`.
#[cfg(target_os = "linux")]
async fn attacker(
    project: &Path,
    sync: &Path,
    mode: &str,
    env: &[(&str, &str)],
) -> (Rpc, String, PathBuf, PathBuf) {
    let root = project.canonicalize().unwrap();
    let config = format!(
        "sandbox = \"workspace-write\"\nsandbox_root = {:?}\n[changes]\nenabled = false\n",
        root.to_str().unwrap()
    );
    // Its state outside the temp dir, which the fence lets commands write.
    let state = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut a = Rpc::start_env(state, Some(&config), &[], env).await;
    let (ready, go, log) = (fifo(&sync.join("ready")), fifo(&sync.join("go")), sync.join("log"));
    let settings =
        agent_bash::changes::ChangesSettings { max_snapshot_ms: 60000, ..Default::default() };
    let script = sync.join("attack.py");
    let protocol = agent_bash::changes::engine::PROTOCOL.to_string();
    write(&script, &ATTACK.replace("PROTOCOL", &protocol));
    let command = format!(
        "{} {} {mode} {:?} '{}' {} {} {}",
        python(),
        script.display(),
        root.to_str().unwrap(),
        serde_json::to_string(&settings).unwrap(),
        ready.display(),
        go.display(),
        log.display()
    );
    let id = a.send(json!({"type": "tool_call", "cwd": root, "command": command})).await;
    tokio::select! {
        () = heard(&ready) => {}
        r = a.response(&id) => {
            release(&ready).await;
            panic!("the attack ended before it was ready: {r}");
        }
    }
    (a, id, go, log)
}

/// Attack (fenced command → the engine's shared page): a fenced command looks for the page in
/// every process's descriptors (`/proc/<pid>/fd`, the backend and the engine hold it) and
/// opens it to write a claim into every slot, one snapshot number each: the engine would adopt
/// the one at its latest snapshot as a run of the victim's connection that never ends, mark
/// the victim's next changes as overlapping it and refuse their undo. The page was never
/// reachable from inside the fence: Landlock keeps a fenced process from the `/proc` files of
/// processes outside its domain (and the page is made with no permission bits, so that a
/// process of the user without a descriptor cannot open it either).
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_fenced_command_cannot_write_the_engines_page() {
    if portable() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let (project, sync) = (repo(home.path()), tempfile::tempdir().unwrap());
    let cwd = project.path().to_str().unwrap();
    let env = [("HOME", home.path().to_str().unwrap())];
    let mut v = Rpc::start_env(tempfile::tempdir().unwrap(), Some(CONFIG), &[], &env).await;
    with_the_watch(&mut v, cwd).await;
    let (mut a, id, go, log) = attacker(project.path(), sync.path(), "page", &env).await;
    let r = v.tool(json!({"cwd": cwd, "command": "echo v > victim.txt"})).await;
    release(&go).await;
    let done = a.response(&id).await;
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("refused") && !said.contains("wrote"), "{said}\n{done}");
    assert_eq!(changes_with_overlap(&r), [("victim.txt".to_string(), false)], "{r}\n{said}");
    let u = undo(&mut v, r["changesId"].as_u64()).await;
    assert_eq!(u["success"], true, "{u}\n{said}");
    a.stop().await;
    v.stop().await;
}

/// Attack (fenced command → the receipt engine): a fenced command connects to the project's
/// engine and holds a run of its own open while another backend's command writes a file. That
/// receipt came back with the file marked as overlapping, and its undo was refused: a fenced
/// agent could deny the user's undo. Engines are now named in the abstract namespace, which
/// Landlock's scope closes to fenced commands: the connection is refused and the receipt is
/// exact and undone.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_fenced_command_cannot_reach_the_receipt_engine() {
    if portable() {
        return;
    }
    let (home, project, sync, runtime) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap(),
    );
    write(&project.path().join("base.txt"), "base\n");
    let cwd = project.path().to_str().unwrap();
    let env = [
        ("HOME", home.path().to_str().unwrap()),
        ("XDG_RUNTIME_DIR", runtime.path().to_str().unwrap()),
        ("ENGINES", runtime.path().to_str().unwrap()),
    ];
    let mut v = Rpc::start_env(tempfile::tempdir().unwrap(), Some(CONFIG), &[], &env).await;
    let r = v.tool(json!({"cwd": cwd, "command": "echo 1 > one"})).await;
    assert_eq!(r["changes"], json!([{"path": "one", "kind": "added"}]), "{r}");

    let (mut a, id, go, log) = attacker(project.path(), sync.path(), "reach", &env).await;
    let r = v.tool(json!({"cwd": cwd, "command": "echo v > victim.txt"})).await;
    release(&go).await;
    let done = a.response(&id).await;
    let said = std::fs::read_to_string(&log).unwrap();
    assert_eq!(changes_with_overlap(&r), [("victim.txt".to_string(), false)], "{r}\n{said}");
    let u = undo(&mut v, r["changesId"].as_u64()).await;
    assert_eq!(u["success"], true, "{u}\n{said}");
    assert!(!project.path().join("victim.txt").exists());
    assert!(said.contains("refused") && !said.contains("begin"), "{said}\n{done}");
    a.stop().await;
    v.stop().await;
}

/// Attack (fenced command → an unfenced backend): before any engine of the project runs, a
/// fenced command takes the place the engine would listen on (a socket file in `/dev/shm`,
/// which every fence may write, when there is no `XDG_RUNTIME_DIR`) and answers as the
/// engine. The unfenced backend's receipt listed a file the command never touched
/// (`forged.txt`), and its undo would read contents from a store the attacker named. Now the
/// backend asks an engine to prove it runs outside every fence (it must connect to a name of
/// the backend's, which Landlock's scope forbids a fenced process), finds the squatter cannot,
/// and takes receipts itself: exact.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_fenced_command_cannot_pose_as_the_receipt_engine() {
    if portable() {
        return;
    }
    let (home, project, sync) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write(&project.path().join("base.txt"), "base\n");
    let cwd = project.path().to_str().unwrap();
    let env = [("HOME", home.path().to_str().unwrap()), ("XDG_RUNTIME_DIR", "")];
    let mut v = Rpc::start_env(tempfile::tempdir().unwrap(), Some(CONFIG), &[], &env).await;
    let (mut a, id, go, log) = attacker(project.path(), sync.path(), "squat", &env).await;
    let r = v.tool(json!({"cwd": cwd, "command": "echo 1 > one"})).await;
    release(&go).await;
    let done = a.response(&id).await;
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("asked hello"), "the squatter was not asked: {said}\n{done}");
    assert_eq!(r["changes"], json!([{"path": "one", "kind": "added"}]), "{r}\n{said}");
    let u = undo(&mut v, r["changesId"].as_u64()).await;
    assert_eq!(u["success"], true, "{u}\n{said}");
    assert!(!project.path().join("one").exists());
    a.stop().await;
    v.stop().await;
}

/// Lets a held command go when dropped, so a failing test leaves no process waiting on the
/// FIFO (`O_NONBLOCK`: with nobody reading any more, opening it fails, and that is all).
pub(super) struct LetGo(pub PathBuf);

impl Drop for LetGo {
    fn drop(&mut self) {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let fifo =
            std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&self.0);
        if let Ok(mut f) = fifo {
            let _ = f.write_all(b"go\n");
        }
    }
}

/// 3 000 files in `project`, and in `sync` two FIFOs, `inside` and `go`: with the returned
/// value as `AGENT_BASH_TEST_HOLD_FIRST`, the first snapshot is held after its 1 000th file
/// (truly mid-snapshot), after writing `inside`, until `go` is written. Returns that value and
/// the two FIFOs.
pub(super) fn held_first_snapshot(project: &Path, sync: &Path) -> (String, PathBuf, PathBuf) {
    for d in 0..30 {
        for f in 0..100 {
            write(&project.join(format!("d{d}/f{f}")), &format!("{d} {f}\n"));
        }
    }
    let (inside, go) = (fifo(&sync.join("inside")), fifo(&sync.join("go")));
    let hold = format!("1000 {} {}", inside.display(), go.display());
    (hold, inside, go)
}

/// A first snapshot too long for the budget goes on in the background, and every call in the
/// meantime says how far it has got: files hashed of the files counted before. The snapshot is
/// held after its 1 000th file of 3 000
/// ([`held_first_snapshot`]); once let go, it ends and receipts start.
#[tokio::test]
async fn changes_first_snapshot_in_the_background_says_how_far_it_has_got() {
    let (home, project, sync, runtime) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let (hold, inside, go) = held_first_snapshot(project.path(), sync.path());
    let config = "[changes]\nmax_snapshot_ms = 1000\n".to_string();
    let env = [
        ("HOME", home.path().to_str().unwrap()),
        ("XDG_RUNTIME_DIR", runtime.path().to_str().unwrap()),
        ("AGENT_BASH_TEST_HOLD_FIRST", hold.as_str()),
    ];
    let mut rpc = Rpc::start_env(tempfile::tempdir().unwrap(), Some(&config), &[], &env).await;
    let cwd = project.path().to_str().unwrap();
    let root = project.path().canonicalize().unwrap();
    let root = root.display();
    let deferred = regex::Regex::new(&format!(
        r"^the first snapshot of {} takes over 1000 ms: it goes on in the background \(now: (no file hashed yet|[\d ]+ of 3 000 files hashed)\), and receipts start with a later command$",
        regex::escape(&root.to_string())
    ))
    .unwrap();
    let r = rpc.tool(json!({"cwd": cwd, "command": "echo first"})).await;
    assert_eq!(r["output"], "first\n");
    let why = r["changesUnavailable"].as_str().unwrap_or_default();
    assert!(deferred.is_match(why), "{r}");

    // Held after git's 1 000th file: calls say so, the figure rising to exactly that.
    heard(&inside).await;
    let _let_go = LetGo(go.clone());
    let indexing = regex::Regex::new(&format!(
        r"^the first snapshot of {} is still being taken: ([\d ]+) of 3 000 files hashed$",
        regex::escape(&root.to_string())
    ))
    .unwrap();
    let (mut seen, end) = (0, std::time::Instant::now() + std::time::Duration::from_secs(30));
    while seen < 1000 {
        assert!(std::time::Instant::now() < end, "stuck at {seen} files hashed");
        let r = rpc.tool(json!({"cwd": cwd, "command": "true"})).await;
        let why = r["changesUnavailable"].as_str().unwrap_or_default();
        let n: u64 = match indexing.captures(why) {
            Some(c) => c[1].replace(' ', "").parse().unwrap(),
            None => panic!("{r}"),
        };
        assert!(n >= seen && n <= 1000, "{seen} then {n}: {r}");
        seen = n;
    }
    let r = rpc.tool(json!({"cwd": cwd, "command": "true"})).await;
    assert_eq!(
        r["changesUnavailable"],
        format!("the first snapshot of {root} is still being taken: 1 000 of 3 000 files hashed")
    );

    // Let go: the snapshot ends in the background, and a later call has its receipt.
    release(&go).await;
    for i in 0.. {
        assert!(std::time::Instant::now() < end, "no receipt 30 s after the snapshot went on");
        let r = rpc.tool(json!({"cwd": cwd, "command": format!("echo n > new{i}.txt")})).await;
        if let Some(why) = r["changesUnavailable"].as_str() {
            assert!(indexing.is_match(why), "{r}");
            continue;
        }
        assert_eq!(r["changes"], json!([{"path": format!("new{i}.txt"), "kind": "added"}]), "{r}");
        break;
    }
    rpc.stop().await;
}

/// Takes the `flock` of `file` (exclusive, waiting); it is held while the file stays open.
fn hold_lock(file: &Path) -> std::fs::File {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    // SAFETY: flock on a file descriptor of ours.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
    f
}

/// A run in a project where nothing changed since the latest snapshot reuses it without the
/// store's lock or a blocking thread: with the lock held by another process (as a private
/// backend's `git add` holds it), a `true` still gets its (empty) receipt at once, where it
/// used to wait for the lock and say `changes_unavailable` (on the portable paths there is no
/// watch to tell "unchanged": every snapshot is full and takes the lock, so that part is left
/// out there). Whatever could change the project's
/// files or ignore rules is still seen: a file written by hand just before a run (in the
/// earlier snapshot, not the run's receipt), `.git/info/exclude` or the user's excludes file
/// changed with no file touched (the next run's first snapshot reads them again, so a file
/// they no longer hide is seen before a run changes it).
#[tokio::test]
async fn changes_of_an_unchanged_project_skip_the_store_lock_and_still_see_every_change() {
    let home = tempfile::tempdir().unwrap();
    let repo = repo(home.path());
    let p = repo.path();
    write(&p.join("secret.txt"), "1\n");
    write(&p.join("c.tmp"), "1\n");
    let state = tempfile::tempdir().unwrap();
    let store = state.path().join("changes");
    let config = "[changes]\nmax_snapshot_ms = 2000\n";
    let home_var = home.path().to_str().unwrap();
    let mut rpc = Rpc::start_env(state, Some(config), &[], &[("HOME", home_var)]).await;
    let cwd = p.to_str().unwrap();
    let mut tool = async |command: &str| rpc.tool(json!({"cwd": cwd, "command": command})).await;
    let r = tool("true").await;
    assert_eq!(r["changesCount"], 0, "{r}");
    let lock = std::fs::read_dir(&store).unwrap().next().unwrap().unwrap().path();
    if std::env::var("AGENT_BASH_PORTABLE").as_deref() != Ok("1") {
        let held = hold_lock(&lock.join("agent-bash.lock"));
        for _ in 0..3 {
            let r = tool("true").await;
            assert_eq!(r["changesCount"], 0, "no wait for the store's lock: {r}");
        }
        drop(held);
    }
    write(&p.join("a.txt"), "by hand\n");
    let r = tool("true").await;
    assert_eq!(changes(&r), pairs(&[]), "{r}");
    let r = tool("echo 2 > a.txt").await;
    assert_eq!(changes(&r), pairs(&[("a.txt", "modified")]), "{r}");
    // The ignore files change, and no file of the project does.
    write(&p.join(".git/info/exclude"), "\n");
    let r = tool("true").await;
    assert_eq!(changes(&r), pairs(&[]), "{r}");
    let r = tool("echo 2 > secret.txt").await;
    assert_eq!(changes(&r), pairs(&[("secret.txt", "modified")]), "{r}");
    write(&home.path().join("global-ignore"), "\n");
    let r = tool("true").await;
    assert_eq!(changes(&r), pairs(&[]), "{r}");
    let r = tool("echo 2 > c.tmp").await;
    assert_eq!(changes(&r), pairs(&[("c.tmp", "modified")]), "{r}");
    rpc.stop().await;
}

/// A file changed in place (content, executable bit, removed) is read by the snapshot itself,
/// without `git add` (the store's index stays as it was), and the receipts are exact: a
/// same-size rewrite right after the previous one (within one clock tick, where stat data
/// alone cannot tell), a new file elsewhere afterwards (`git add` then re-reads the folders read
/// here too, or its index would put the old content back), undo from blobs written here.
#[tokio::test]
async fn changes_in_place_skip_git_add_and_stay_exact() {
    let home = tempfile::tempdir().unwrap();
    let repo = repo(home.path());
    let p = repo.path();
    let state = tempfile::tempdir().unwrap();
    let store = state.path().join("changes");
    let home_var = home.path().to_str().unwrap();
    let mut rpc = Rpc::start_env(state, Some(CONFIG), &[], &[("HOME", home_var)]).await;
    let cwd = p.to_str().unwrap();
    let mut tool = async |command: &str| rpc.tool(json!({"cwd": cwd, "command": command})).await;
    let r = tool("true").await;
    assert_eq!(r["changesCount"], 0, "{r}");
    let index = std::fs::read_dir(&store).unwrap().next().unwrap().unwrap().path().join("index");
    let watched = std::env::var("AGENT_BASH_PORTABLE").as_deref() != Ok("1");
    let before = std::fs::read(&index).unwrap();
    let steps: &[(&str, &[(&str, &str)])] = &[
        ("echo 1 > keep/x", &[("keep/x", "modified")]),
        ("echo 2 > keep/x", &[("keep/x", "modified")]),
        ("echo 3 > keep/x; chmod +x run.sh", &[("keep/x", "modified"), ("run.sh", "mode")]),
        ("rm b.txt", &[("b.txt", "deleted")]),
    ];
    for (command, want) in steps {
        let r = tool(command).await;
        assert_eq!(changes(&r), pairs(want), "`{command}`: {r}");
    }
    if watched {
        assert!(std::fs::read(&index).unwrap() == before, "no git add wrote the store's index");
    }
    let r = tool("mkdir -p n && echo 1 > n/new").await;
    assert_eq!(changes(&r), pairs(&[("n/new", "added")]), "{r}");
    let r = tool("echo 4 > keep/x").await;
    let id = r["changesId"].as_u64().unwrap();
    assert_eq!(changes(&r), pairs(&[("keep/x", "modified")]), "{r}");
    let u = undo(&mut rpc, Some(id)).await;
    assert_eq!(u["success"], true, "{u}");
    assert_eq!(std::fs::read_to_string(p.join("keep/x")).unwrap(), "3\n");
    rpc.stop().await;
}

/// Whether process `pid` holds an inotify instance: a backend does once it has its engine's
/// watch for quiet runs (it watches nothing itself).
fn holds_inotify(pid: u32) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy() == "anon_inode:inotify")
    })
}

/// A backend in `cwd` whose first call found receipts on.
async fn warm_in(home: &Path, cwd: &str) -> Rpc {
    let mut rpc = rpc_in(home).await;
    let r = rpc.tool(json!({"cwd": cwd, "command": "true"})).await;
    assert_eq!(r["changesCount"], 0, "receipts are on: {r}");
    rpc
}

/// Calls `true` until the backend holds the engine's watch (its first quiet run sends for it,
/// its next ones use it); its pid.
async fn with_the_watch(rpc: &mut Rpc, cwd: &str) -> u32 {
    let (pid, end) = (rpc.child.id().unwrap(), std::time::Instant::now() + CALL_WAIT);
    while !holds_inotify(pid) {
        assert!(std::time::Instant::now() < end, "backend {pid} never got the engine's watch");
        rpc.tool(json!({"cwd": cwd, "command": "true"})).await;
    }
    pid
}

/// A run begun on a quiet project ends without asking the engine only when nothing can have
/// changed during it: its backend checks the engine's change counter, its copy of the watch's
/// queue and the ignore files outside the tree. Here A's change is taken off the queue by B's
/// snapshot before A ends (the queue is empty again, the counter moved), and A's next run
/// edits `.git/info/exclude` (no event in the tree, its stamp moved): both receipts are exact.
#[tokio::test]
async fn changes_of_a_quiet_run_stay_exact_when_its_change_is_read_elsewhere() {
    if portable() || !cfg!(target_os = "linux") {
        return; // no watch there: every run asks the engine
    }
    let home = tempfile::tempdir().unwrap();
    let (project, sync) = (repo(home.path()), tempfile::tempdir().unwrap());
    write(&project.path().join("secret.txt"), "ignored by info/exclude\n");
    let cwd = project.path().to_str().unwrap();
    let (wrote, go) = (fifo(&sync.path().join("wrote")), fifo(&sync.path().join("go")));
    let (mut a, mut b) = (warm_in(home.path(), cwd).await, warm_in(home.path(), cwd).await);
    with_the_watch(&mut a, cwd).await;
    let run = format!(
        "echo x > during.txt; echo > {}; cat {} > /dev/null",
        wrote.display(),
        go.display()
    );
    let ra = a.send(json!({"type": "tool_call", "cwd": cwd, "command": run})).await;
    heard(&wrote).await;
    let r = b.tool(json!({"cwd": cwd, "command": "true"})).await;
    assert_eq!(r["changesCount"], 0, "B's run changed nothing: {r}");
    release(&go).await;
    let ra = a.response(&ra).await;
    assert_eq!(changes(&ra["data"]), pairs(&[("during.txt", "added")]), "{ra}");

    let r = a.tool(json!({"cwd": cwd, "command": ": > .git/info/exclude"})).await;
    assert_eq!(changes(&r), pairs(&[("secret.txt", "added")]), "{r}");
    b.stop().await;
    a.stop().await;
}

/// The tags of the slots claimed or adopted in the engine's page, as backend `pid` maps it
/// (`1`: claimed by its backend, `2`: adopted by the engine).
fn slots_of(pid: u32) -> Vec<u64> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return Vec::new() };
    let page = fds.flatten().find(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|l| l.to_string_lossy().starts_with("/memfd:agent-bash-engine"))
    });
    let Some(page) = page else { return Vec::new() };
    let bytes = std::fs::read(page.path()).unwrap();
    let words = bytes.chunks(8).map(|w| u64::from_ne_bytes(w.try_into().unwrap()));
    words.skip(8).filter(|&w| w != 0).map(|w| w >> 62).collect()
}

/// A run begun on a quiet project claims a slot in the engine's page instead of asking it.
/// While A's claimed run goes on, B's run writes: B's snapshot adopts A's claim as a run begun
/// before it, so both receipts mark what changed while both ran, and A's receipt holds its
/// own file unmarked. Without the adoption, the engine would not know A ran, and B's receipt
/// would claim `theirs.txt` alone (undo could then revert what A may have written).
#[tokio::test]
async fn changes_of_a_run_begun_without_asking_overlap_exactly() {
    if portable() || !cfg!(target_os = "linux") {
        return; // no watch there: every run asks the engine
    }
    let home = tempfile::tempdir().unwrap();
    let (project, sync) = (repo(home.path()), tempfile::tempdir().unwrap());
    let cwd = project.path().to_str().unwrap();
    let (wrote, go) = (fifo(&sync.path().join("wrote")), fifo(&sync.path().join("go")));
    let (mut a, mut b) = (warm_in(home.path(), cwd).await, warm_in(home.path(), cwd).await);
    let pid = with_the_watch(&mut a, cwd).await;
    // A quiet run asks once more, for the engine's latest mark: then A's runs claim.
    a.tool(json!({"cwd": cwd, "command": "true"})).await;
    let run =
        format!("echo a > mine.txt; echo > {}; cat {} > /dev/null", wrote.display(), go.display());
    let ra = a.send(json!({"type": "tool_call", "cwd": cwd, "command": run})).await;
    heard(&wrote).await;
    assert_eq!(slots_of(pid), [1], "A's run did not claim a slot");
    let rb = b.tool(json!({"cwd": cwd, "command": "echo b > theirs.txt"})).await;
    assert_eq!(slots_of(pid), [2], "B's snapshot did not adopt A's claim");
    assert_eq!(changes_with_overlap(&rb), [("theirs.txt".to_string(), true)], "{rb}");
    release(&go).await;
    let ra = a.response(&ra).await;
    assert_eq!(
        changes_with_overlap(&ra["data"]),
        [("mine.txt".to_string(), false), ("theirs.txt".to_string(), true)],
        "{ra}"
    );
    assert_eq!(slots_of(pid), Vec::<u64>::new(), "A's slot stayed taken");
    // A quiet claimed run ends without a word to the engine, and frees its slot.
    let r = a.tool(json!({"cwd": cwd, "command": "true"})).await;
    assert_eq!(r["changesCount"], 0, "{r}");
    let r = a.tool(json!({"cwd": cwd, "command": "true"})).await;
    assert_eq!(r["changesCount"], 0, "{r}");
    assert_eq!(slots_of(pid), Vec::<u64>::new(), "a quiet run left its slot taken");
    b.stop().await;
    a.stop().await;
}

/// Six backends in one project at once, each alternating `true` and a write to its own file
/// (runs begun with and without asking, snapshots that find nothing changed among them): every
/// write's receipt lists its file. A snapshot that found nothing changed once moved the
/// engine's latest snapshot without counting it: a run claimed just after it could never be
/// adopted, and its receipt was lost ("the receipt engine knows no run in slot 0").
#[tokio::test]
async fn changes_of_many_backends_at_once_all_come_back() {
    let home = tempfile::tempdir().unwrap();
    let project = repo(home.path());
    let cwd = project.path().to_str().unwrap().to_string();
    let mut backends = Vec::new();
    for _ in 0..6 {
        backends.push(warm_in(home.path(), &cwd).await);
    }
    let runs = backends.into_iter().enumerate().map(|(k, mut rpc)| {
        let cwd = cwd.clone();
        tokio::spawn(async move {
            let mut lost = Vec::new();
            for i in 0..40 {
                rpc.tool(json!({"cwd": cwd, "command": "true"})).await;
                let command = format!("echo {i} > own{k}.txt");
                let r = rpc.tool(json!({"cwd": cwd, "command": command})).await;
                let listed = r["changes"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c["path"] == format!("own{k}.txt")));
                if !listed {
                    lost.push(r);
                }
            }
            (lost, rpc)
        })
    });
    let runs: Vec<_> = runs.collect();
    // Each backend has a state directory of its own, and the engine keeps its store in the
    // first one's: a backend stops (and its directory goes) only once every run is over.
    let mut done = Vec::new();
    for run in runs {
        done.push(run.await.unwrap());
    }
    for (lost, rpc) in done {
        rpc.stop().await;
        assert!(
            lost.is_empty(),
            "{} writes lost their receipt, the first: {}",
            lost.len(),
            lost[0]
        );
    }
}

/// How long a test waits for a backend to pick something up in the background.
const CALL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
