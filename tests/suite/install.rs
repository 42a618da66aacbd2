//! Installing as the README says, with the real lazy.nvim (`../shared/clients/lazy.nvim.tar.gz`,
//! loaded from a local copy: nothing is cloned from the network) in a real headless Neovim:
//! a `dir` spec, a git-URL spec (a local `file://` repository), a plain 'runtimepath' entry.
//! What the first command says when the binary is missing, and `:AgentBashBuild`.
//!
//! The plugin under test is a copy of this checkout's `lua/`, `plugin/` and `doc/` whose cargo
//! package is a small stand-in named `agent-bash`: building the real crate takes minutes on this
//! machine. The stand-in's binary executes the real backend (`target/release/agent-bash`) with
//! its arguments, so a built plugin works for real; its build script waits for a gate file, so
//! a test can see cargo's progress in the float while the build runs.

use std::path::{Path, PathBuf};

use nvim_rs::Value;

use super::mcp::clients_dir;
use super::nvim::Editor;
use super::support::BIN;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// A plugin directory as a user would have it, with the stand-in package. The build waits
/// until `gate` exists.
fn plugin_copy(dir: &Path, gate: &Path) {
    std::fs::create_dir_all(dir.join("src")).unwrap();
    for sub in ["lua", "plugin", "doc"] {
        let st = std::process::Command::new("cp")
            .arg("-r")
            .arg(Path::new(REPO).join(sub))
            .arg(dir)
            .status()
            .unwrap();
        assert!(st.success(), "cp -r {sub}");
    }
    let _ = std::fs::remove_file(dir.join("doc/tags"));
    std::fs::write(
        dir.join("Cargo.toml"),
        "[package]\nname = \"agent-bash\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[workspace]\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("build.rs"),
        format!(
            "fn main() {{
    let gate = std::path::Path::new({gate:?});
    let end = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !gate.exists() && std::time::Instant::now() < end {{
        std::thread::sleep(std::time::Duration::from_millis(20));
    }}
    println!(\"cargo:rerun-if-changed=build.rs\");
}}\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("src/main.rs"),
        format!(
            "use std::os::unix::process::CommandExt;
fn main() {{
    let err = std::process::Command::new({BIN:?}).args(std::env::args_os().skip(1)).exec();
    eprintln!(\"agent-bash stand-in: {{err}}\");
    std::process::exit(127);
}}\n"
        ),
    )
    .unwrap();
}

/// lazy.nvim unpacked from the shared tarball; returns its directory.
fn lazy_copy(into: &Path) -> PathBuf {
    std::fs::create_dir_all(into).unwrap();
    let tarball = clients_dir().join("lazy.nvim.tar.gz");
    let st = std::process::Command::new("tar")
        .arg("xzf")
        .arg(&tarball)
        .arg("-C")
        .arg(into)
        .status()
        .unwrap();
    assert!(st.success(), "tar xzf {tarball:?}");
    into.join("lazy.nvim")
}

/// The README's lazy.nvim spec line that contains `key = "`: the line as written.
fn readme_spec(key: &str) -> String {
    let readme = std::fs::read_to_string(Path::new(REPO).join("README.md")).unwrap();
    let install = readme.split("## Install\n").nth(1).expect("README: ## Install");
    let block = install.split("```lua\n").nth(1).expect("README: a lua block under Install");
    let block = block.split("```").next().unwrap();
    block
        .lines()
        .find(|l| l.trim_start().starts_with('{') && l.contains(&format!("{key} = \"")))
        .unwrap_or_else(|| panic!("README: no lazy.nvim spec with {key} in\n{block}"))
        .trim()
        .trim_end_matches(',')
        .to_string()
}

/// The spec with the value of `key` replaced.
fn with_value(spec: &str, key: &str, value: &str) -> String {
    let re = regex::Regex::new(&format!(r#"{key} = "[^"]*""#)).unwrap();
    let out = re.replace(spec, format!("{key} = {value:?}").as_str()).into_owned();
    assert_ne!(out, spec, "{spec}");
    out
}

/// A user's init.lua: lazy.nvim from the local copy, then the spec.
fn lazy_init(home: &Path, lazy: &Path, spec: &str) -> PathBuf {
    let init = home.join("init.lua");
    let lua = format!(
        "vim.opt.rtp:prepend({lazy:?})
require('lazy').setup({{
  spec = {{ {spec} }},
  rocks = {{ enabled = false }},
  install = {{ colorscheme = {{}} }},
  checker = {{ enabled = false }},
  change_detection = {{ enabled = false }},
}})\n",
        lazy = lazy.to_string_lossy(),
    );
    std::fs::write(&init, lua).unwrap();
    init
}

/// The command that found no binary ran once the build was done: its card (the newest)
/// finished without failing and shows `out`.
async fn the_waiting_command_ran(ed: &Editor, command: &str, out: &str) {
    ed.wait_lua_for(
        &format!(
            "(function() local cs = require('agent_bash.float').cards(); local c = cs[#cs]
               return c and c.run.finished and c.run.state.command == {command:?}
                 and c.run.state.status ~= 'failed' end)()"
        ),
        120,
    )
    .await;
    let card = ed.card_done().await;
    assert!(card.lines.iter().any(|l| l == out), "{card:?}");
}

/// Runs an Ex command that reports an error (as a user would see it: in the messages).
async fn failing_cmd(ed: &Editor, c: &str) {
    let ok = ed.lua(&format!("return (pcall(vim.cmd, {c:?}))")).await;
    assert_eq!(ok, Value::Boolean(false), "{c} did not fail");
}

/// The text of the newest card once its run ended.
async fn finished_card(ed: &Editor) -> String {
    let card = ed.card_done().await;
    format!("{}\n{}", card.title, card.lines.join("\n"))
}

/// The build float: whether it is open as a float, and its terminal's text.
async fn build_float(ed: &Editor) -> (bool, String) {
    let v = ed
        .lua(
            "local b = require('agent_bash.build').last()
             if not b then return { false, '' } end
             local open = b.win ~= nil and vim.api.nvim_win_is_valid(b.win)
               and vim.api.nvim_win_get_config(b.win).relative == 'editor'
               and vim.api.nvim_win_get_buf(b.win) == b.buf and vim.bo[b.buf].buftype == 'terminal'
             return { open, table.concat(vim.api.nvim_buf_get_lines(b.buf, 0, -1, false), '\\n') }",
        )
        .await;
    let a = v.as_array().unwrap();
    (a[0].as_bool().unwrap_or(false), a[1].as_str().unwrap_or("").to_string())
}

/// lazy.nvim with the README's `dir` spec: lazy never builds it, so the first `:AgentBash` says
/// to run `:Lazy build agent-bash` or `:AgentBashBuild`; `:AgentBashBuild` shows cargo's
/// progress in a terminal float, then the command that waited runs in a working card.
#[tokio::test]
async fn lazy_dir_spec_first_command_says_how_and_agentbashbuild_runs_it() {
    let home = tempfile::tempdir().unwrap();
    let plugin = home.path().join("src/agent-bash");
    let gate = home.path().join("gate");
    plugin_copy(&plugin, &gate);
    let lazy = lazy_copy(&home.path().join("lazy"));
    let spec = with_value(&readme_spec("dir"), "dir", &plugin.to_string_lossy());
    let init = lazy_init(home.path(), &lazy, &spec);
    let ed = Editor::start_user(home, &init).await;
    ed.wait_lua("vim.fn.exists(':AgentBash') == 2").await;

    failing_cmd(&ed, "AgentBash echo waited-for-the-build").await;
    let card = finished_card(&ed).await;
    let msgs = ed.messages().await;
    for text in [&card, &msgs] {
        assert!(text.contains("backend binary not found"), "{text}");
        assert!(!text.contains("agent-bash: agent-bash"), "{text}");
        assert!(text.contains("lazy.nvim never builds a plugin it loads from `dir`"), "{text}");
        assert!(text.contains(":Lazy build agent-bash"), "{text}");
        assert!(text.contains(":AgentBashBuild"), "{text}");
    }

    ed.cmd("AgentBashBuild").await;
    // The build waits at the gate: the float shows cargo at work. (Not its progress bar: cargo
    // draws none when the environment says CI, as CI's does.)
    let expr = "(function() local b = require('agent_bash.build').last()
        local t = table.concat(vim.api.nvim_buf_get_lines(b.buf, 0, -1, false), '\\n')
        return t:find('Compiling agent-bash v0.1.0', 1, true) ~= nil end)()";
    ed.wait_lua_for(expr, 120).await;
    let (open, text) = build_float(&ed).await;
    assert!(open, "no terminal float while building:\n{text}");
    assert!(text.contains(&plugin.to_string_lossy().into_owned()), "{text}");
    std::fs::write(&gate, "").unwrap();

    // Built: the float closes and the command that waited runs.
    the_waiting_command_ran(&ed, "echo waited-for-the-build", "waited-for-the-build").await;
    let (open, text) = build_float(&ed).await;
    assert!(!open, "{text}");
    assert!(text.contains("Finished `release` profile"), "{text}");
    assert!(plugin.join("target/release/agent-bash").exists());
    assert!(ed.messages().await.contains("agent-bash: backend built: "));
}

/// The other way the message names for a `dir` spec: `:Lazy build agent-bash` runs the README's
/// `build`, and then the command that waited runs.
#[tokio::test]
async fn lazy_dir_spec_lazy_build_runs_the_waiting_command() {
    let home = tempfile::tempdir().unwrap();
    let plugin = home.path().join("src/agent-bash");
    let gate = home.path().join("gate");
    std::fs::write(&gate, "").unwrap();
    plugin_copy(&plugin, &gate);
    let lazy = lazy_copy(&home.path().join("lazy"));
    let spec = with_value(&readme_spec("dir"), "dir", &plugin.to_string_lossy());
    let init = lazy_init(home.path(), &lazy, &spec);
    let ed = Editor::start_user(home, &init).await;
    ed.wait_lua("vim.fn.exists(':AgentBash') == 2").await;
    assert!(!plugin.join("target/release/agent-bash").exists(), "lazy built a dir plugin");
    failing_cmd(&ed, "AgentBash echo after-lazy-build").await;
    assert!(ed
        .messages()
        .await
        .contains(":Lazy build agent-bash (the command you typed then runs)"));
    ed.cmd("Lazy build agent-bash").await;
    the_waiting_command_ran(&ed, "echo after-lazy-build", "after-lazy-build").await;
    assert!(plugin.join("target/release/agent-bash").exists());
}

/// lazy.nvim with the README's git-URL spec (a local repository, `file://`): lazy clones it and
/// builds it on install, and the first command gives a working card; `:help agent_bash` works.
/// With the binary gone, the message says lazy's build did not leave it and how to rerun it.
#[tokio::test]
async fn lazy_url_spec_builds_on_install_and_the_first_card_works() {
    let home = tempfile::tempdir().unwrap();
    let repo = home.path().join("src/agent-bash");
    let gate = home.path().join("gate");
    std::fs::write(&gate, "").unwrap();
    plugin_copy(&repo, &gate);
    let git = |args: &[&str]| {
        let st = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"])
            .args(args)
            .current_dir(&repo)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(st.success(), "git {args:?}");
    };
    git(&["init", "-q"]);
    git(&["add", "-A"]);
    git(&["commit", "-q", "-m", "agent-bash"]);
    let lazy = lazy_copy(&home.path().join("lazy"));
    let url = format!("file://{}", repo.display());
    let spec = with_value(&readme_spec("url"), "url", &url);
    let init = lazy_init(home.path(), &lazy, &spec);
    let data = home.path().join("data");
    let ed = Editor::start_user(home, &init).await;
    let installed = data.join("nvim/lazy/agent-bash");
    assert!(
        installed.join("target/release/agent-bash").exists(),
        "lazy did not build {installed:?}"
    );
    ed.wait_lua("vim.fn.exists(':AgentBash') == 2").await;

    ed.cmd("AgentBash echo first-card").await;
    let card = ed.card_done().await;
    assert!(card.lines.iter().any(|l| l == "first-card"), "{card:?}");
    assert_eq!(card.status, "done", "{card:?}");
    ed.cmd("help agent_bash").await;
    let help = ed.lua("return vim.fn.expand('%:t')").await;
    assert_eq!(help.as_str(), Some("agent_bash.txt"));

    std::fs::remove_file(installed.join("target/release/agent-bash")).unwrap();
    ed.lua("require('agent_bash.backend').stop()").await;
    failing_cmd(&ed, "AgentBash echo again").await;
    let msgs = ed.messages().await;
    assert!(
        msgs.contains(
            "the build lazy.nvim runs on install did not leave it there: :Lazy build agent-bash"
        ),
        "{msgs}"
    );
}

/// A plain 'runtimepath' install without the binary: the message and `:checkhealth` say to
/// run `:AgentBashBuild` or cargo in the plugin's directory; a failing build keeps its float
/// with the exit code; after the fix, `:AgentBashBuild` runs the command that waited.
#[tokio::test]
async fn rtp_install_missing_binary_message_checkhealth_and_failed_build() {
    let home = tempfile::tempdir().unwrap();
    let plugin = home.path().join("src/agent-bash");
    let gate = home.path().join("gate");
    std::fs::write(&gate, "").unwrap();
    plugin_copy(&plugin, &gate);
    let main_rs = plugin.join("src/main.rs");
    let good = std::fs::read_to_string(&main_rs).unwrap();
    std::fs::write(&main_rs, "fn main() { this is not rust }\n").unwrap();
    let init = home.path().join("init.lua");
    std::fs::write(&init, format!("vim.opt.rtp:prepend({:?})\n", plugin.to_string_lossy()))
        .unwrap();
    let ed = Editor::start_user(home, &init).await;
    ed.wait_lua("vim.fn.exists(':AgentBash') == 2").await;

    failing_cmd(&ed, "AgentBash echo after-the-fix").await;
    let msgs = ed.messages().await;
    let by_hand = format!("cd {} && cargo build --release", plugin.display());
    assert!(msgs.contains(&by_hand), "{msgs}");
    assert!(msgs.contains(":AgentBashBuild builds it now"), "{msgs}");
    assert!(!msgs.contains("Lazy"), "{msgs}");

    ed.cmd("checkhealth agent_bash").await;
    let health =
        ed.lua("return table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), '\\n')").await;
    let health = health.as_str().unwrap();
    assert!(health.contains("ERROR agent-bash binary not found"), "{health}");
    assert!(health.contains(":AgentBashBuild builds it now"), "{health}");
    assert!(health.contains(&by_hand), "{health}");
    ed.cmd("bwipeout").await;

    ed.cmd("AgentBashBuild").await;
    ed.wait_lua_for("require('agent_bash.build').last().code", 120).await;
    let (open, text) = build_float(&ed).await;
    assert!(open, "the failed build's float closed");
    assert!(text.contains("error"), "{text}");
    let title = ed
        .lua(
            "local c = vim.api.nvim_win_get_config(require('agent_bash.build').last().win)
             local s = '' for _, ch in ipairs(c.title or {}) do s = s .. ch[1] end return s",
        )
        .await;
    assert!(title.as_str().unwrap().contains("exit 101"), "{title:?}");
    assert!(ed.messages().await.contains("the build failed (exit 101)"));

    std::fs::write(&main_rs, good).unwrap();
    ed.cmd("AgentBashBuild").await;
    the_waiting_command_ran(&ed, "echo after-the-fix", "after-the-fix").await;
}
