//! `agent-bash exec` (print mode) through the real binary.

use std::process::{Command, Output};

use super::support::BIN;

fn exec(state: &std::path::Path, args: &[&str]) -> Output {
    let cfg = state.join("c.toml");
    std::fs::write(&cfg, format!("state_dir = {:?}\n", state.to_str().unwrap())).unwrap();
    Command::new(BIN)
        .arg("--log-file")
        .arg(state.join("log"))
        .arg("exec")
        .arg("--config")
        .arg(&cfg)
        .args(args)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn exec_prints_text_and_exits_with_status() {
    let dir = tempfile::tempdir().unwrap();
    let o = exec(dir.path(), &["--", "echo hi"]);
    assert_eq!((text(&o).as_str(), o.status.code()), ("hi\n", Some(0)));
    let o = exec(dir.path(), &["--", "echo out; exit 7"]);
    assert_eq!(text(&o), "out\n\nCommand exited with code 7\n");
    assert_eq!(o.status.code(), Some(7));
    let o = exec(dir.path(), &["--timeout", "1", "--", "sleep 5"]);
    assert_eq!(o.status.code(), Some(124));
    assert!(text(&o).starts_with("[Command timed out after 1 seconds]"));
    let o = exec(dir.path(), &["--head", "2", "--", "seq 10"]);
    assert_eq!(text(&o), "1\n2\n");
    let o = exec(dir.path(), &["--", "seq 10 | tail -n 3"]);
    assert_eq!(text(&o), "8\n9\n10\n");
    let o = exec(dir.path(), &["--json", "--", "seq 3 | head -n 1"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["output"], "1\n");
    assert_eq!(v["exit_code"], 0);
    assert_eq!(v["normalized"]["rewrites"][0]["removed"], "| head -n 1");
}

#[test]
fn exec_bad_input_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let o = exec(dir.path(), &["--cwd", "/nonexistent", "--", "true"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "agent-bash: Working directory does not exist: /nonexistent\n"
    );
    let o = exec(dir.path(), &["--timeout", "soon", "--", "true"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("Invalid timeout: soon"));
    let o = exec(dir.path(), &["--timeout", "-1", "--", "true"]);
    assert_eq!(o.status.code(), Some(2));
    let o = exec(dir.path(), &["--tools", "grep", "--", "grep -r x ."]);
    assert_eq!(o.status.code(), Some(0), "interception is off by default");
}

#[test]
fn exec_sigint_cancels_with_130() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, format!("state_dir = {:?}\n", dir.path().to_str().unwrap())).unwrap();
    let child = Command::new(BIN)
        .args(["exec", "--config"])
        .arg(&cfg)
        .args(["--", "export AB_SIGINT_T=1; echo started; sleep 30"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    // Wait until the command runs (its `sleep` is a grandchild of exec).
    let t = std::time::Instant::now();
    while !super::support::procs_with_env("AB_SIGINT_T=1").iter().any(|p| {
        std::fs::read_to_string(format!("/proc/{p}/cmdline"))
            .unwrap_or_default()
            .starts_with("sleep\x0030")
    }) {
        assert!(t.elapsed() < std::time::Duration::from_secs(10));
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130));
    assert!(text(&o).starts_with("[Command cancelled]\n\nstarted"), "{}", text(&o));
}

#[test]
fn exec_rc_snapshot_filtered_and_refreshed() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let rc = home.join(".bashrc");
    std::fs::write(
        &rc,
        "shopt -s extglob\nset -o errexit\nalias hi='echo aliased'\ngreet() { echo \"hello $1\"; }\n\
         alias grep='echo hijacked'\n_private() { :; }\n",
    )
    .unwrap();
    let run = |cmd: &str| {
        let cfg = dir.path().join("c.toml");
        std::fs::write(
            &cfg,
            format!("state_dir = {:?}\nshell = \"/bin/bash\"\n", dir.path().to_str().unwrap()),
        )
        .unwrap();
        let o = Command::new(BIN)
            .args(["exec", "--config"])
            .arg(&cfg)
            .args(["--", cmd])
            .env("HOME", &home)
            .output()
            .unwrap();
        text(&o)
    };
    // Aliases and functions from the rc work; options persist; errexit was dropped (the second
    // command still runs); tool names and `_` names are not taken over.
    let out = run("hi; greet you; shopt -q extglob && echo ext; false; echo after; echo x | grep x; type _private >/dev/null 2>&1 || echo no-private");
    assert_eq!(out, "aliased\nhello you\next\nafter\nx\nno-private\n");
    // A changed rc is captured again (the on-disk cache is keyed by the rc's mtime).
    std::fs::write(&rc, "alias hi='echo changed'\n").unwrap();
    // A distinct mtime even on coarse-grained filesystems.
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(10);
    std::fs::File::options().write(true).open(&rc).unwrap().set_modified(later).unwrap();
    assert_eq!(run("hi"), "changed\n");
}

#[test]
fn exec_hung_rc_never_fails_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join(".bashrc"), "export AB_HUNG_RC=1\nsleep 60\n").unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!("state_dir = {:?}\nshell = \"/bin/bash\"\n", dir.path().to_str().unwrap()),
    )
    .unwrap();
    let t = std::time::Instant::now();
    let o = Command::new(BIN)
        .args(["exec", "--config"])
        .arg(&cfg)
        .args(["--", "echo ok"])
        .env("HOME", &home)
        // Its own project: a file edited meanwhile in the checkout would be in its receipt.
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(text(&o), "ok\n");
    // The capture gave up at its 10 s limit, and the hung rc's processes are gone.
    assert!(t.elapsed() < std::time::Duration::from_secs(20));
    assert!(super::support::procs_with_env("AB_HUNG_RC=1").is_empty());
}

#[test]
fn exec_interception_blocks_with_the_exact_text() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!("state_dir = {:?}\n[interceptor]\nenabled = true\n", dir.path().to_str().unwrap()),
    )
    .unwrap();
    let o = Command::new(BIN)
        .args(["exec", "--config"])
        .arg(&cfg)
        .args(["--tools", "read,grep", "--", "cd /tmp && grep -r foo . | head -n 5"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        text(&o),
        "Blocked: Use the `grep` tool instead of grep/rg. It respects .gitignore and provides structured output.\n\nOriginal command: cd /tmp && grep -r foo .\n"
    );
    let o = Command::new(BIN)
        .args(["exec", "--json", "--config"])
        .arg(&cfg)
        .args(["--tools", "read", "--", "cat /etc/hostname"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["blocked"],
        serde_json::json!({"blocked": true, "rule": 0, "suggested_tool": "read", "message": v["output"]})
    );
}
