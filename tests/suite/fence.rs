//! The Landlock fence (contract §13) with the real kernel: fenced tool-call shells write only in
//! their workspace, children and `cd` included; bang commands are never fenced; a kernel
//! without Landlock refuses the call.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use agent_bash::exec::settings::Settings;
use agent_bash::exec::{Origin, Request, Runtime};
use agent_bash::fence::SandboxMode;
use agent_bash::pty::PtyHooks;
use agent_bash::result::BashResult;
use tokio_util::sync::CancellationToken;

use super::support::BIN;

/// The project and a place the fence must keep the command out of, outside any git work tree
/// (so the project's root is its own) and outside the shells' temp dir (see [`runtime`]).
struct Places {
    _root: tempfile::TempDir,
    project: PathBuf,
    outside: PathBuf,
}

fn places(git: bool) -> Places {
    let root = tempfile::Builder::new().prefix("fence-").tempdir().unwrap();
    let project = root.path().join("project");
    let outside = root.path().join("outside");
    std::fs::create_dir_all(project.join("sub")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    if git {
        let ok = Command::new("git").args(["init", "-q"]).current_dir(&project).status().unwrap();
        assert!(ok.success());
    }
    Places { _root: root, project, outside }
}

/// A runtime whose shells have a private `TMPDIR`: the temp dir a fence lets through is that
/// one, not the `/tmp` the test's places are in. The fence's root is `root` (`sandbox_root`).
fn runtime(mut settings: Settings, root: &Path) -> (Arc<Runtime>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    settings.env.insert("TMPDIR".into(), tmp.to_str().unwrap().into());
    settings.sandbox_root = Some(root.to_path_buf());
    let settings = Settings { shell: Some("/bin/bash".into()), ..settings };
    let rt = Runtime::new(settings, dir.path().join("session"), dir.path().to_path_buf()).unwrap();
    (Arc::new(rt), dir)
}

fn fenced(mode: SandboxMode) -> Settings {
    Settings { sandbox: Some(mode), ..Default::default() }
}

async fn run(rt: &Runtime, origin: Origin, cwd: &Path, command: &str) -> BashResult {
    let req = Request {
        origin,
        command: command.into(),
        cwd: Some(cwd.to_str().unwrap().into()),
        timeout: Some(30.0),
        ..Default::default()
    };
    rt.run(req, CancellationToken::new(), None).await.unwrap()
}

pub(super) fn q(p: &Path) -> String {
    agent_bash::project::quote(p.to_str().unwrap())
}

#[tokio::test]
async fn fenced_session_writes_only_in_its_workspace() {
    for git in [true, false] {
        let p = places(git);
        let (rt, _d) = runtime(fenced(SandboxMode::WorkspaceWrite), &p.project);
        // In a git project the root is the work tree, so `..` of a subdirectory is inside.
        let cwd = if git { p.project.join("sub") } else { p.project.clone() };
        let inside = if git { "touch x ../y && echo made" } else { "touch x && echo made" };
        let r = run(&rt, Origin::Tool, &cwd, inside).await;
        assert_eq!(r.exit_code, Some(0), "git={git}: {}", r.output);
        assert!(cwd.join("x").exists());
        assert_eq!(r.sandbox, Some("workspace-write"));
        assert!(!r.output.contains("[Sandbox:"), "{}", r.output);
        if git {
            assert!(p.project.join("y").exists());
        }

        // Every way out: directly, after `cd`, through a child process of another program,
        // a background job, a subshell.
        let out = q(&p.outside);
        let escapes = [
            format!("touch {out}/direct"),
            format!("cd {out} && touch after_cd"),
            format!("bash -c 'touch {out}/child'"),
            format!("python3 -c 'open(\"{}/py\", \"w\")'", p.outside.display()),
            format!("(sh -c 'echo x > {out}/bg') & wait $!"),
            format!("mkdir {out}/dir"),
            format!("mv x {out}/moved"),
        ];
        for cmd in &escapes {
            let r = run(&rt, Origin::Tool, &cwd, cmd).await;
            assert_ne!(r.exit_code, Some(0), "git={git}: {cmd} succeeded: {}", r.output);
            assert!(
                r.output.ends_with(agent_bash::fence::NOTE),
                "git={git}: {cmd}: no sandbox note: {}",
                r.output
            );
        }
        // The home directory, as in `touch ~/outside`.
        let home = std::env::var("HOME").unwrap();
        let name = format!("agent-bash-fence-{}", agent_bash::shell::local::nonce());
        let r = run(&rt, Origin::Tool, &cwd, &format!("touch ~/{name}")).await;
        let escaped = Path::new(&home).join(&name);
        let got_out = escaped.exists();
        let _ = std::fs::remove_file(&escaped);
        assert!(!got_out && r.exit_code != Some(0), "git={git}: wrote in $HOME: {}", r.output);
        let left: Vec<_> = std::fs::read_dir(&p.outside).unwrap().collect();
        assert!(left.is_empty(), "git={git}: files got out: {left:?}");
        assert!(cwd.join("x").exists(), "the refused move must leave the file");

        // The session is still a session: state carries over, and writes inside still work.
        run(&rt, Origin::Tool, &cwd, "export FENCE_STATE=kept").await;
        let r = run(&rt, Origin::Tool, &cwd, "echo $FENCE_STATE > state && cat state").await;
        assert_eq!(r.text.trim(), "kept", "{}", r.output);
        assert!(!r.shell_restarted);
    }
}

#[tokio::test]
async fn bang_commands_and_unfenced_keys_are_not_fenced() {
    let p = places(false);
    let mut settings = fenced(SandboxMode::WorkspaceWrite);
    settings.sandbox_by_key.insert("free".into(), SandboxMode::Off);
    let (rt, _d) = runtime(settings, &p.project);
    let r = run(&rt, Origin::Bang, &p.project, &format!("touch {}/bang", q(&p.outside))).await;
    assert_eq!(r.exit_code, Some(0), "{}", r.output);
    assert_eq!(r.sandbox, None);
    assert!(p.outside.join("bang").exists());

    let req = Request {
        origin: Origin::Tool,
        command: format!("touch {}/free", q(&p.outside)),
        cwd: Some(p.project.to_str().unwrap().into()),
        session_key: Some("free".into()),
        ..Default::default()
    };
    let r = rt.run(req, CancellationToken::new(), None).await.unwrap();
    assert_eq!(r.exit_code, Some(0), "{}", r.output);
    assert!(p.outside.join("free").exists());
}

#[tokio::test]
async fn read_only_writes_only_temp_and_configured_paths() {
    let p = places(true);
    let extra = p.outside.join("cache");
    std::fs::create_dir(&extra).unwrap();
    let mut settings = fenced(SandboxMode::ReadOnly);
    settings.sandbox_writable = vec![extra.clone()];
    let (rt, _d) = runtime(settings, &p.project);
    let r = run(&rt, Origin::Tool, &p.project, "touch x").await;
    assert_ne!(r.exit_code, Some(0), "{}", r.output);
    assert!(!p.project.join("x").exists());
    assert_eq!(r.sandbox, Some("read-only"));
    let r = run(&rt, Origin::Tool, &p.project, "cat /etc/hostname >/dev/null && ls . >/dev/null && t=$(mktemp) && echo hi > \"$t\" && cat \"$t\" && rm \"$t\"").await;
    assert_eq!((r.exit_code, r.text.trim()), (Some(0), "hi"), "{}", r.output);
    let r = run(&rt, Origin::Tool, &p.project, &format!("touch {}/ok", q(&extra))).await;
    assert_eq!(r.exit_code, Some(0), "{}", r.output);
}

/// The root is the setting's, whatever project a call runs in: a call in another project
/// cannot write there, and keeps its shell (the fence is the same one).
#[tokio::test]
async fn the_fence_root_is_the_setting_not_the_calls_project() {
    let a = places(true);
    let b = places(true);
    let (rt, _d) = runtime(fenced(SandboxMode::WorkspaceWrite), &a.project);
    let r = run(&rt, Origin::Tool, &a.project, "touch a").await;
    assert_eq!(r.exit_code, Some(0), "{}", r.output);
    let r = run(&rt, Origin::Tool, &b.project, "touch b").await;
    assert_ne!(r.exit_code, Some(0), "{}", r.output);
    assert!(r.output.ends_with(agent_bash::fence::NOTE), "{}", r.output);
    assert!(!b.project.join("b").exists());
    assert!(!r.shell_restarted, "the same fence serves every cwd");
    let r = run(&rt, Origin::Tool, &b.project, &format!("touch {}/yes", q(&a.project))).await;
    assert_eq!(r.exit_code, Some(0), "{}", r.output);
}

/// A fence whose writable paths would hold the backend's own files (here the root holds the
/// state directory, as when the project is the home directory) is refused, never run.
#[tokio::test]
async fn a_fence_over_our_own_files_is_refused() {
    let p = places(false);
    let settings = Settings {
        state_dir: Some(p.project.join(".state")),
        ..fenced(SandboxMode::WorkspaceWrite)
    };
    let (rt, _d) = runtime(settings, &p.project);
    let req = Request {
        origin: Origin::Tool,
        command: "touch ran".into(),
        cwd: Some(p.project.to_str().unwrap().into()),
        ..Default::default()
    };
    let e = rt.run(req, CancellationToken::new(), None).await.unwrap_err().to_string();
    assert!(e.contains("agent-bash's own files") && e.contains("sandbox_root"), "{e}");
    assert!(!p.project.join("ran").exists());
}

#[tokio::test]
async fn network_false_denies_tcp_connect() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let p = places(false);
    let connect = format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected");
    let (open, _d1) = runtime(fenced(SandboxMode::WorkspaceWrite), &p.project);
    let r = run(&open, Origin::Tool, &p.project, &connect).await;
    assert_eq!(r.text.trim(), "connected", "{}", r.output);

    let settings = Settings { network: Some(false), ..fenced(SandboxMode::WorkspaceWrite) };
    let (closed, _d2) = runtime(settings, &p.project);
    let r = run(&closed, Origin::Tool, &p.project, &connect).await;
    assert_ne!(r.exit_code, Some(0), "{}", r.output);
    assert!(r.output.contains("Permission denied"), "{}", r.output);
}

#[tokio::test]
async fn fenced_pty_runs_are_fenced_too() {
    let p = places(false);
    let (rt, _d) = runtime(fenced(SandboxMode::WorkspaceWrite), &p.project);
    let req = |command: String| Request {
        origin: Origin::Tool,
        command,
        cwd: Some(p.project.to_str().unwrap().into()),
        pty: true,
        timeout: Some(30.0),
        ..Default::default()
    };
    let r = rt
        .run_pty(
            req("touch inside && echo made".into()),
            CancellationToken::new(),
            None,
            PtyHooks::default(),
        )
        .await
        .unwrap();
    assert_eq!(r.exit_code, Some(0), "{}", r.output);
    assert!(p.project.join("inside").exists());
    let cmd = format!("touch {}/pty", q(&p.outside));
    let r =
        rt.run_pty(req(cmd), CancellationToken::new(), None, PtyHooks::default()).await.unwrap();
    assert_ne!(r.exit_code, Some(0), "{}", r.output);
    assert!(r.output.ends_with(agent_bash::fence::NOTE), "{}", r.output);
    assert!(!p.outside.join("pty").exists());
}

/// The real binary on a kernel "without Landlock" (forced by the variable): the fenced call is
/// refused with a clear error and nothing runs; an unfenced key still works.
#[test]
fn no_kernel_support_refuses_the_fenced_call() {
    let p = places(false);
    let state = tempfile::tempdir().unwrap();
    let cfg = state.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "state_dir = {:?}\nsandbox = \"workspace-write\"\n[sandbox_by_key]\nfree = \"off\"\n",
            state.path().to_str().unwrap()
        ),
    )
    .unwrap();
    let exec = |key: &str, cmd: &str| {
        Command::new(BIN)
            .env(agent_bash::fence::NO_LANDLOCK_VAR, "1")
            .arg("--log-file")
            .arg(state.path().join("log"))
            .args(["exec", "--config", cfg.to_str().unwrap(), "--session-key", key])
            .args(["--cwd", p.project.to_str().unwrap(), "--", cmd])
            .output()
            .unwrap()
    };
    let o = exec("default", "touch ran");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("Sandbox unavailable: the sandbox needs Linux Landlock"), "{err}");
    assert!(!p.project.join("ran").exists(), "a refused call must not run");
    let o = exec("free", "touch ran");
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(p.project.join("ran").exists());
}
