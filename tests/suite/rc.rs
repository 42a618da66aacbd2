//! The user's rc as people really have it (issue 26, contract §5 turn 3): oh-my-zsh with its own
//! `.zshrc` template, prezto with its runcoms, zoxide's `--cmd cd` in bash and zsh, and the
//! patterns other agents' bug trackers are full of. Each case gets a fresh HOME; the oracle for
//! every command is the same command in the same shell with an empty rc, never hand-written
//! text: the snapshot may bring the user's aliases and functions, it may not change what
//! ordinary commands print.
//!
//! oh-my-zsh and prezto are read, as they install, from `../shared/rc/` beside the repository
//! (or `$AGENT_BASH_RC`); a missing archive fails the test.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

use super::support::{Rpc, ZSH};

/// Where the frameworks' archives are (see the module docs).
fn rc_dir() -> PathBuf {
    super::support::shared_data("rc", "AGENT_BASH_RC", &["oh-my-zsh.tar.gz", "prezto.tar.gz"])
}

/// Unpacks `archive` of [`rc_dir`] into `home` and renames its top directory to `name`.
fn unpack(home: &Path, archive: &str, top: &str, name: &str) {
    let st = Command::new("tar")
        .arg("-xzf")
        .arg(rc_dir().join(archive))
        .arg("-C")
        .arg(home)
        .status()
        .unwrap();
    assert!(st.success(), "tar -xzf {archive}");
    std::fs::rename(home.join(top), home.join(name)).unwrap();
}

/// A directory the commands work in: two files that differ, a subdirectory.
fn work_tree(root: &Path) -> PathBuf {
    let work = root.join("work");
    std::fs::create_dir_all(work.join("sub")).unwrap();
    std::fs::write(work.join("a.txt"), "one\ntwo\nthree\n").unwrap();
    std::fs::write(work.join("b.txt"), "one\n2\nthree\n").unwrap();
    work
}

/// The commands whose output the rc must not change, in one session each, in this order.
const COMMANDS: &[&str] = &[
    "echo hi",
    "cd sub && pwd",
    "ls",
    "diff a.txt b.txt",
    "make --version",
    "git --version",
    "grep -n t a.txt",
    "type cd",
    "cd sub; cd - >/dev/null; pwd",
];

/// Runs [`COMMANDS`] (and `extra`) as tool calls of one backend whose HOME is `home`, with
/// `shell`, in `work`: each command's output and exit code.
async fn outputs(shell: &str, home: &Path, work: &Path, extra: &[&str]) -> Vec<(String, Value)> {
    let state = tempfile::tempdir().unwrap();
    let config = format!("shell = {shell:?}\n");
    let home_s = home.to_str().unwrap();
    let mut rpc = Rpc::start_env(state, Some(&config), &[], &[("HOME", home_s)]).await;
    let mut out = Vec::new();
    for command in COMMANDS.iter().chain(extra) {
        let r = rpc.tool(json!({"cwd": work.to_str().unwrap(), "command": command})).await;
        out.push((r["output"].as_str().unwrap_or("").to_string(), r["exit_code"].clone()));
    }
    rpc.stop().await;
    out
}

/// Runs `command` in an interactive `shell` that reads the rc of `home` as a user's terminal
/// would (login for zsh, so `.zprofile` counts): the oracle for what the rc itself defines.
fn interactive(shell: &str, home: &Path, work: &Path, command: &str) -> String {
    let mut c = Command::new(shell);
    if shell.ends_with("zsh") {
        c.arg("-l");
    }
    // What the rc prints itself comes before the mark.
    const MARK: &str = "--- the probe ---";
    let o = c
        .args(["-i", "-c", &format!("echo '{MARK}'; {command}")])
        .env("HOME", home)
        .current_dir(work)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let at = text.find(&format!("{MARK}\n")).expect("the interactive shell ran the probe");
    text[at + MARK.len() + 1..].to_string()
}

/// The case: `setup` writes the rc into a fresh HOME. Every command of [`COMMANDS`] and
/// `extra` prints what it prints with an empty rc, and `type cd` names the builtin; `probe`
/// (what the rc itself defines) prints what it prints in the user's own interactive shell, so
/// the rc was read at all.
async fn same_as_empty_rc(shell: &str, setup: impl FnOnce(&Path), extra: &[&str], probe: &str) {
    let dir = tempfile::tempdir().unwrap();
    let work = work_tree(dir.path());
    let (home, empty) = (dir.path().join("home"), dir.path().join("empty"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&empty).unwrap();
    setup(&home);
    let want_probe = interactive(shell, &home, &work, probe);
    assert!(!want_probe.trim().is_empty(), "the rc defines nothing for `{probe}`");
    let mut with_extra = extra.to_vec();
    with_extra.push(probe);
    let with_rc = outputs(shell, &home, &work, &with_extra).await;
    let without = outputs(shell, &empty, &work, extra).await;
    for (i, command) in COMMANDS.iter().chain(extra).enumerate() {
        assert_eq!(with_rc[i], without[i], "{shell}: `{command}` with the rc of {home:?}");
    }
    let type_cd = &with_rc[COMMANDS.iter().position(|c| *c == "type cd").unwrap()].0;
    assert!(type_cd.contains("builtin"), "{type_cd}");
    assert_eq!(with_rc.last().unwrap().0, want_probe, "{shell}: `{probe}`");
}

/// oh-my-zsh's own `.zshrc` template, updates off.
fn oh_my_zsh(home: &Path) {
    unpack(home, "oh-my-zsh.tar.gz", "oh-my-zsh", ".oh-my-zsh");
    let template =
        std::fs::read_to_string(home.join(".oh-my-zsh/templates/zshrc.zsh-template")).unwrap();
    std::fs::write(
        home.join(".zshrc"),
        format!("DISABLE_AUTO_UPDATE=true\nzstyle ':omz:update' mode disabled\n{template}"),
    )
    .unwrap();
}

/// prezto with its runcoms as `~/.zshenv`, `~/.zprofile`, `~/.zshrc` …
fn prezto(home: &Path) {
    unpack(home, "prezto.tar.gz", "zprezto", ".zprezto");
    for name in ["zlogin", "zlogout", "zpreztorc", "zprofile", "zshenv", "zshrc"] {
        std::fs::copy(home.join(".zprezto/runcoms").join(name), home.join(format!(".{name}")))
            .unwrap();
    }
}

/// zoxide's init with `--cmd cd`, as its README tells users to add it.
fn zoxide(shell: &'static str) -> impl FnOnce(&Path) {
    move |home: &Path| {
        let (rc, name) =
            if shell.ends_with("zsh") { (".zshrc", "zsh") } else { (".bashrc", "bash") };
        std::fs::write(home.join(rc), format!("eval \"$(zoxide init {name} --cmd cd)\"\n"))
            .unwrap();
    }
}

/// The patterns of the issue in one rc: a jump function behind `alias cd=`, a `diff` whose
/// body is a zsh autoload stub, `alias -- -='cd -'`, and an rc that prints.
fn patterns(shell: &'static str) -> impl FnOnce(&Path) {
    move |home: &Path| {
        let rc = if shell.ends_with("zsh") { ".zshrc" } else { ".bashrc" };
        std::fs::write(
            home.join(rc),
            "echo 'welcome from the rc'\n\
             z() { builtin cd \"$@\" && echo \"jumped to $PWD\"; }\n\
             alias cd='z'\n\
             diff() { builtin autoload -XUz; }\n\
             alias -- -='cd -'\n\
             alias ll='ls -l'\n",
        )
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rc_oh_my_zsh_changes_no_command() {
    // Its functions come through: omz_urlencode quotes as in the user's own terminal.
    let probe = "omz_urlencode 'a b&c=d/é'; echo; alias gst";
    same_as_empty_rc(ZSH, oh_my_zsh, &[], probe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rc_prezto_changes_no_command() {
    same_as_empty_rc(ZSH, prezto, &[], "alias po pu").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rc_zoxide_bash_changes_no_command() {
    same_as_empty_rc("/bin/bash", zoxide("/bin/bash"), &[], "type -t cdi").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rc_zoxide_zsh_changes_no_command() {
    same_as_empty_rc(ZSH, zoxide(ZSH), &[], "whence -w cdi").await;
}

/// The alias `cd='z'` is gone, so `cd` is the builtin even when `z` means something else.
const REDEFINED_Z: &str = "z() { :; }; cd sub && pwd";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rc_patterns_bash_change_no_command() {
    same_as_empty_rc("/bin/bash", patterns("/bin/bash"), &[REDEFINED_Z], "alias ll").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rc_patterns_zsh_change_no_command() {
    same_as_empty_rc(ZSH, patterns(ZSH), &[REDEFINED_Z], "alias ll").await;
}
