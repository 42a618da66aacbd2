//! The editor workflow (contract §8.4): a Vim user's habits on a real headless Neovim with the real
//! plugin and backend, keys typed through `nvim_input` as a person would type them.

use std::path::Path;
use std::time::{Duration, Instant};

use nvim_rs::Value;

use super::nvim::Editor;

/// Copies the plugin (plugin/, lua/, doc/agent_bash.txt) to a fresh directory: what a plugin
/// manager installs, without generated help tags.
fn plugin_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    for sub in ["plugin", "lua/agent_bash", "doc"] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
    }
    for sub in ["plugin", "lua/agent_bash"] {
        for e in std::fs::read_dir(repo.join(sub)).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), dir.path().join(sub).join(e.file_name())).unwrap();
        }
    }
    std::fs::copy(repo.join("doc/agent_bash.txt"), dir.path().join("doc/agent_bash.txt")).unwrap();
    dir
}

impl Editor {
    /// `:help {tag}`: the help file and the text of the line the cursor lands on.
    async fn help(&self, tag: &str) -> (String, String) {
        let _ = self.nvim.command(&format!("help {tag}")).await;
        let v = self.lua("return {vim.fn.expand('%:t'), vim.fn.getline('.')}").await;
        let a = v.as_array().unwrap();
        (a[0].as_str().unwrap_or("").into(), a[1].as_str().unwrap_or("").into())
    }

    async fn current_win(&self) -> Value {
        self.lua("return vim.api.nvim_get_current_win()").await
    }

    async fn cards(&self) -> i64 {
        self.lua("return #require('agent_bash.float').cards()").await.as_i64().unwrap()
    }

    /// Title of the newest card, as text.
    async fn title(&self) -> String {
        self.card().await.title
    }
}

#[tokio::test]
async fn editor_help_works_after_install_and_lands_on_the_introduction() {
    let copy = plugin_copy();
    let ed = Editor::start_with(true, copy.path().to_str().unwrap(), &[]).await;
    ed.wait_lua(&format!("vim.uv.fs_stat({:?}) ~= nil", copy.path().join("doc/tags"))).await;
    let (file, line) = ed.help("agent_bash").await;
    assert_eq!(file, "agent_bash.txt");
    assert!(line.contains("*agent_bash*") && line.contains("INTRODUCTION"), "{line:?}");
    // A plugin directory that cannot be written: the tags go to a cache copy on 'runtimepath'.
    let ro = plugin_copy();
    let ed = Editor::start_with(true, ro.path().to_str().unwrap(), &[]).await;
    ed.lua(&format!(
        "vim.uv.fs_unlink({:?}); require('agent_bash.help').generate({:?}, {{writable = false}})",
        ro.path().join("doc/tags"),
        ro.path()
    ))
    .await;
    assert!(!ro.path().join("doc/tags").exists());
    let (file, line) = ed.help("agent_bash").await;
    assert_eq!(file, "agent_bash.txt");
    assert!(line.contains("*agent_bash*"), "{line:?}");
}

#[tokio::test]
async fn editor_cards_leave_the_cursor_and_buffer_keys_alone() {
    let ed = Editor::start().await;
    let home = ed.current_win().await;
    ed.cmd("AgentBash echo started; sleep 30").await;
    ed.wait_lua("(function() local c = require('agent_bash.float').cards()[1]; return c and #c.run.state.lines > 0 end)()").await;
    assert_eq!(ed.current_win().await, home, "the card took the cursor");
    // <Esc> and `q` typed in the buffer act on the buffer: no cancel, no closed card, and `q`
    // records a macro as it always does.
    ed.nvim.input("<Esc>").await.unwrap();
    ed.nvim.input("qa").await.unwrap();
    assert_eq!(ed.lua("return vim.fn.reg_recording()").await.as_str(), Some("a"));
    ed.nvim.input("q").await.unwrap();
    assert_eq!(ed.lua("return vim.fn.reg_recording()").await.as_str(), Some(""));
    assert_eq!(ed.cards().await, 1);
    assert_eq!(ed.card().await.status, "running");
    // In the card (entered on purpose), <Esc> cancels; on the finished card it closes it.
    ed.cmd("AgentBashFocus").await;
    assert_ne!(ed.current_win().await, home);
    ed.nvim.input("<Esc>").await.unwrap();
    let card = ed.card_done().await;
    assert_eq!(card.status, "cancelled");
    assert_eq!(ed.cards().await, 1, "a running card is not closed by <Esc>");
    ed.nvim.input("<Esc>").await.unwrap();
    ed.wait_lua("#require('agent_bash.float').cards() == 0").await;
    assert_eq!(ed.current_win().await, home);
}

#[tokio::test]
async fn editor_terminal_gives_esc_to_the_program() {
    let ed = Editor::start().await;
    ed.attach_ui().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("note.txt");
    // Neovim itself as the program in the float: it needs <Esc> to leave insert mode.
    let nvim = std::env::var("NVIM_BIN").unwrap_or_else(|_| "nvim".into());
    ed.cmd(&format!("AgentBashTerm {nvim} --clean -n -i NONE {}", file.display())).await;
    ed.wait_lua("vim.api.nvim_get_mode().mode == 't'").await;
    ed.wait_term("note.txt").await;
    ed.nvim.input("ihello<Esc>").await.unwrap();
    // The inner editor is back in Normal mode only if it got the <Esc>: `:wq` then writes.
    ed.wait_term("hello").await;
    ed.nvim.input(":wq<CR>").await.unwrap();
    assert_eq!(ed.term_result("exit_code").await.as_i64(), Some(0));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "hello\n");
    // A shell read gets the Escape byte itself.
    ed.cmd(r#"AgentBashTerm echo ready; IFS= read -r x; printf 'got:%q\n' "$x""#).await;
    ed.wait_term("ready").await;
    ed.wait_lua("vim.api.nvim_get_mode().mode == 't'").await;
    ed.nvim.input("<Esc>x<CR>").await.unwrap();
    let out = ed.term_result("output").await;
    assert!(out.as_str().unwrap().contains(r"got:$'\Ex'"), "{out:?}");
}

#[tokio::test]
async fn editor_bang_expands_like_bang_and_reruns() {
    let ed = Editor::start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("three lines.txt");
    std::fs::write(&file, "alpha\nbeta\ngamma\n").unwrap();
    ed.cmd(&format!("edit {}", file.display().to_string().replace(' ', "\\ "))).await;
    ed.cmd("AgentBash wc -l < '%'").await;
    let card = ed.card_done().await;
    assert_eq!(
        card.lines.first().map(String::as_str),
        Some(format!("$ wc -l < '{}'", file.display()).as_str())
    );
    assert!(card.lines.iter().any(|l| l == "3"), "{card:?}");
    ed.cmd("AgentBash echo '%:t' <cword>").await;
    let card = ed.card_done().await;
    assert!(card.lines.iter().any(|l| l == "three lines.txt alpha"), "{card:?}");
    // Backslashes and `%` inside words reach the shell untouched; `\%` is a plain `%`.
    ed.cmd(r"AgentBash printf 'a\nb%s\n' \%").await;
    let card = ed.card_done().await;
    assert_eq!(card.lines[1..3], ["a".to_string(), "b%".to_string()], "{card:?}");
    // No argument: the last command again (`:!!`).
    ed.lua("require('agent_bash').close_all()").await;
    ed.cmd("AgentBash").await;
    let card = ed.card_done().await;
    assert_eq!(card.lines[0], r"$ printf 'a\nb%s\n' %");
    // `%` without a file name: an error, nothing runs.
    ed.cmd("enew").await;
    let _ = ed.nvim.command("AgentBash wc -l %").await;
    assert!(ed.messages().await.contains("no file name to substitute for '%'"));
    assert_eq!(ed.card().await.lines[0], r"$ printf 'a\nb%s\n' %");
}

/// Like `:!`: when a run that rewrote the file a buffer shows finishes, the buffer is reloaded
/// ('autoread', on by default), for the user's bang command and an agent's tool call alike.
#[tokio::test]
async fn editor_files_a_run_rewrites_are_reloaded_as_after_bang() {
    let ed = Editor::start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("notes.txt");
    std::fs::write(&file, "before\n").unwrap();
    ed.cmd(&format!("edit {}", file.display())).await;
    let shows_file = |file: &Path| {
        let want = std::fs::read_to_string(file).unwrap();
        let lines: Vec<String> = want.lines().map(|l| format!("{l:?}")).collect();
        format!(
            "vim.deep_equal(vim.api.nvim_buf_get_lines(0, 0, -1, false), {{{}}})",
            lines.join(", ")
        )
    };
    ed.cmd("AgentBash sed -i 's/before/after the bang command/' %").await;
    ed.card_done().await;
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "after the bang command\n");
    ed.wait_lua(&shows_file(&file)).await;
    let path = file.display().to_string();
    ed.tool_call("w", &format!("{{command = \"printf 'from the agent\\\\n' > '{path}'\"}}")).await;
    ed.tool_result("w", "exit_code").await;
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "from the agent\n");
    ed.wait_lua(&shows_file(&file)).await;
}

/// The editor's directory is a path on this machine: a bang command or tool call that the
/// settings send to a remote profile (`default_profile`) starts where that session's shell is,
/// and `"local"` (which overrides the default) starts in the editor's directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn editor_runs_the_settings_send_elsewhere_do_not_take_the_editors_directory() {
    let sshd = super::sshd::Sshd::start();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    let argv = serde_json::to_string(&sshd.argv()).unwrap();
    std::fs::write(&cfg, format!("default_profile = \"dev\"\n[profiles]\ndev = {argv}\n")).unwrap();
    let ed = Editor::start().await;
    ed.lua(&format!(
        "require('agent_bash').setup({{settings_file = {:?}}})",
        cfg.to_str().unwrap()
    ))
    .await;
    let editor_dir = ed.lua("return vim.fn.getcwd()").await.as_str().unwrap().to_string();
    // Where a login over there starts: asked over a connection of its own.
    let remote_start = sshd.ssh("pwd").trim().to_string();
    assert_ne!(remote_start, editor_dir);
    ed.cmd("AgentBash pwd").await;
    let card = ed.card_done().await;
    assert!(card.lines.contains(&remote_start), "{card:?}");
    ed.tool_call("t", "{command = 'pwd'}").await;
    let out = ed.tool_result("t", "output").await;
    assert_eq!(out.as_str(), Some(format!("{remote_start}\n").as_str()));
    // A tool call's own cwd is a path over there.
    ed.tool_call("t2", "{command = 'pwd', cwd = '/tmp'}").await;
    assert_eq!(ed.tool_result("t2", "output").await.as_str(), Some("/tmp\n"));
    ed.cmd("let g:agent_bash_profile = 'local'").await;
    ed.cmd("AgentBash pwd").await;
    let card = ed.card_done().await;
    assert!(card.lines.contains(&editor_dir), "{card:?}");
}

#[tokio::test]
async fn editor_titles_tick_and_hidden_endings_notify() {
    let ed = Editor::start().await;
    ed.cmd("AgentBash sleep 2.5; echo finished").await;
    let first = ed.title().await;
    assert!(first.contains("$ sleep 2.5; echo finished · running · 0s"), "{first:?}");
    ed.wait_lua("(function() local c = require('agent_bash.float').cards()[1]; local t = vim.api.nvim_win_get_config(c.win).title
                 return t[2][1]:find('running · 1s', 1, true) ~= nil end)()")
        .await;
    // Closed while it runs: its end is announced.
    ed.cmd("AgentBashClose").await;
    ed.wait_lua("require('agent_bash.runs').bang() == nil").await;
    let msgs = ed.messages().await;
    assert!(msgs.contains("agent-bash: $ sleep 2.5; echo finished · done · "), "{msgs}");
    // A run whose card is shown is not announced.
    ed.cmd("AgentBash echo shown").await;
    ed.card_done().await;
    assert!(!ed.messages().await.contains("echo shown"));
}

#[tokio::test]
async fn editor_quit_asks_while_commands_run() {
    let ed = Editor::start().await;
    ed.cmd("AgentBash sleep 30").await;
    let err = ed.nvim.command("qa").await.unwrap_err().to_string();
    assert!(err.contains("E162") || err.contains("E37"), "{err}");
    // The buffer it names lists what runs and what to do (a TUI shows it).
    let shown = ed
        .lua("local b = vim.fn.bufnr('agent-bash://running'); local l = vim.api.nvim_buf_get_lines(b, 0, -1, false)
              return {vim.api.nvim_buf_get_name(b), l[1], l[3]}")
        .await;
    let shown: Vec<&str> = shown.as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(shown[0].ends_with("agent-bash://running"), "{shown:?}");
    assert!(
        shown[1].starts_with("agent-bash: 1 command running. :qa! quits and stops it"),
        "{shown:?}"
    );
    assert_eq!(shown[2], "bang  $ sleep 30");
    // Still alive and working.
    assert_eq!(ed.lua("return 1 + 1").await.as_i64(), Some(2));
    ed.cmd("AgentBashCancel").await;
    ed.card_done().await;
    // Nothing runs: `:qa` quits.
    let _ = ed.nvim.command("qa").await;
    let end = Instant::now() + Duration::from_secs(10);
    while ed.nvim.command("echo 1").await.is_ok() {
        assert!(Instant::now() < end, "Neovim did not quit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // `:qa!` quits while a command runs.
    let ed = Editor::start().await;
    ed.cmd("AgentBash sleep 30").await;
    let _ = ed.nvim.command("qa!").await;
    let end = Instant::now() + Duration::from_secs(10);
    while ed.nvim.command("echo 1").await.is_ok() {
        assert!(Instant::now() < end, "Neovim did not quit on :qa!");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn editor_hidden_lines_note_stands_above_and_counts_what_tab_shows() {
    let ed = Editor::start().await;
    ed.cmd("AgentBash seq 1 200000").await;
    let card = ed.card_done().await;
    let note = card.lines.iter().position(|l| l.contains("more lines (<Tab> to expand)")).unwrap();
    let first_output = card.lines.iter().position(|l| l == "199981").unwrap();
    assert!(note < first_output, "the note stands above the tail: {card:?}");
    // One note: first what <Tab> shows, then the lines only the artifact holds.
    assert!(
        card.lines[note].contains(", 198000 earlier lines in artifact://0 (o: full output)"),
        "{card:?}"
    );
    assert!(!card.lines.iter().any(|l| l.starts_with("… 198000")), "{card:?}");
    let hidden: usize =
        card.lines[note].trim_start_matches("… ").split(' ').next().unwrap().parse().unwrap();
    let shown = card.lines.iter().filter(|l| l.chars().all(|c| c.is_ascii_digit())).count();
    ed.lua("local cs = require('agent_bash.float').cards(); require('agent_bash.float').toggle(cs[#cs])").await;
    let expanded = ed.card().await;
    let shown_after =
        expanded.lines.iter().filter(|l| l.chars().all(|c| c.is_ascii_digit())).count();
    assert_eq!(shown_after - shown, hidden, "<Tab> shows exactly the counted lines");
}

#[tokio::test]
async fn editor_pty_text_has_no_padding() {
    let ed = Editor::start().await;
    ed.attach_ui().await;
    // Rows padded with spaces to the width, and a coloured padded row.
    ed.cmd(r"AgentBashTerm printf 'abc%70s\nxyz\n\e[41mred%20s\e[0m\n' '' ''").await;
    ed.wait_term("xyz").await;
    let out = ed.term_result("output").await;
    assert_eq!(out.as_str(), Some("abc\nxyz\nred\n"));
}

#[tokio::test]
async fn editor_yank_and_split_a_card() {
    let ed = Editor::start().await;
    let home = ed.current_win().await;
    ed.cmd("AgentBash seq 1 5").await;
    ed.card_done().await;
    ed.cmd("AgentBashFocus").await;
    ed.nvim.input("y").await.unwrap();
    assert_eq!(ed.lua("return vim.fn.getreg('\"')").await.as_str(), Some("1\n2\n3\n4\n5\n"));
    ed.nvim.input("<C-s>").await.unwrap();
    let v = ed
        .lua("return {vim.api.nvim_win_get_config(0).relative, vim.api.nvim_buf_get_lines(0, 0, -1, false), #vim.api.nvim_tabpage_list_wins(0)}")
        .await;
    let a = v.as_array().unwrap();
    assert_eq!(a[0].as_str(), Some(""), "a normal window");
    let lines: Vec<&str> = a[1].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
    assert_eq!(lines, ["1", "2", "3", "4", "5"]);
    assert_ne!(ed.current_win().await, home);
    // A truncated card yanks its whole output (the artifact).
    ed.cmd("AgentBash seq 1 100000").await;
    ed.card_done().await;
    ed.cmd("AgentBashFocus").await;
    ed.nvim.input("\"ay").await.unwrap();
    let n = ed.wait_lua("#vim.fn.getreg('a', 1, true) == 100000 and 100000").await;
    assert_eq!(n.as_i64(), Some(100000));
}

/// A C file with an error on line 2.
fn bad_c(dir: &Path) {
    std::fs::write(dir.join("bad.c"), "int main(void) {\n  return undefined_name;\n}\n").unwrap();
}

#[tokio::test]
async fn editor_errors_land_in_quickfix() {
    let ed = Editor::start().await;
    let dir = tempfile::tempdir().unwrap();
    bad_c(dir.path());
    ed.cmd(&format!("cd {}", dir.path().display())).await;
    // A failing bang command: the list fills by itself (gcc's format).
    ed.cmd("AgentBash gcc -c bad.c -o /dev/null").await;
    ed.card_done().await;
    let qf = ed
        .wait_lua("(function() local l = vim.fn.getqflist() for _, e in ipairs(l) do if e.valid == 1 then return {vim.fn.bufname(e.bufnr), e.lnum} end end end)()")
        .await;
    assert_eq!(qf.as_array().unwrap()[0].as_str(), Some("bad.c"));
    assert_eq!(qf.as_array().unwrap()[1].as_i64(), Some(2));
    let msgs = ed.messages().await;
    assert!(
        msgs.contains("agent-bash: 1 error, 1 note in quickfix (:copen): $ gcc -c bad.c"),
        "{msgs}"
    );
    // Errors, warnings and notes are counted apart (gcc leaves its notes untyped).
    std::fs::write(
        dir.path().join("warn.c"),
        "int main(void) {\n  int x;\n  return undefined_name;\n}\n",
    )
    .unwrap();
    ed.cmd("AgentBash gcc -Wall -c warn.c -o /dev/null").await;
    ed.card_done().await;
    ed.cmd("AgentBashQuickfix").await;
    let msgs = ed.messages().await;
    assert!(
        msgs.contains("agent-bash: 1 error, 1 warning, 1 note in quickfix (:copen): $ gcc -Wall"),
        "{msgs}"
    );
    assert!(
        msgs.ends_with("agent-bash: 1 error, 1 warning, 1 note in the quickfix list"),
        "{msgs}"
    );
    // The user's own :compiler (a buffer-local 'errorformat') reads a program it knows.
    ed.cmd("enew | setlocal errorformat=XX%f@%l:%m").await;
    ed.lua("vim.fn.setqflist({}, 'r')").await;
    ed.cmd("AgentBash printf 'XXother.c@7:boom\\n'; exit 1").await;
    ed.card_done().await;
    let qf = ed
        .wait_lua("(function() local l = vim.fn.getqflist() for _, e in ipairs(l) do if e.valid == 1 then return {vim.fn.bufname(e.bufnr), e.lnum, e.text} end end end)()")
        .await;
    assert_eq!(qf.as_array().unwrap()[0].as_str(), Some("other.c"));
    assert_eq!(qf.as_array().unwrap()[1].as_i64(), Some(7));
    // A tool call's failing build lands there too; :AgentBashQuickfix [id] fills it by hand.
    ed.lua("vim.fn.setqflist({}, 'r')").await;
    ed.tool_call("cc", "{command = 'cc -c bad.c -o /dev/null'}").await;
    ed.tool_result("cc", "exit_code").await;
    ed.wait_lua("#vim.tbl_filter(function(e) return e.valid == 1 end, vim.fn.getqflist()) > 0")
        .await;
    ed.lua("vim.fn.setqflist({}, 'r')").await;
    let id = ed.lua("return require('agent_bash.runs').finished().id").await.as_i64().unwrap();
    ed.cmd(&format!("AgentBashQuickfix {id}")).await;
    let n = ed
        .lua("return #vim.tbl_filter(function(e) return e.valid == 1 end, vim.fn.getqflist())")
        .await;
    assert!(n.as_i64().unwrap() >= 1);
    let _ = ed.nvim.command("AgentBashQuickfix 999").await;
    assert!(ed.messages().await.contains("no finished run 999"));
}

#[tokio::test]
async fn editor_cargo_errors_land_in_quickfix_through_the_compiler_mapping() {
    let ed = Editor::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    std::fs::write(
        dir.path().join("Cargo.toml"),
        "[package]\nname = \"broken\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("src/main.rs"), "fn main() {\n    let x: u32 = nope;\n}\n")
        .unwrap();
    ed.cmd(&format!("cd {}", dir.path().display())).await;
    ed.cmd("AgentBash cargo build --offline --color never").await;
    let end = Instant::now() + Duration::from_secs(120);
    loop {
        let done = ed.lua("local r = require('agent_bash.runs').finished(); return r ~= nil").await;
        if done == Value::Boolean(true) {
            break;
        }
        assert!(Instant::now() < end, "cargo never finished");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let qf = ed
        .wait_lua("(function() for _, e in ipairs(vim.fn.getqflist()) do if e.valid == 1 and e.lnum > 0 then return {vim.fn.bufname(e.bufnr), e.lnum} end end end)()")
        .await;
    assert_eq!(qf.as_array().unwrap()[0].as_str(), Some("src/main.rs"), "{qf:?}");
    assert_eq!(qf.as_array().unwrap()[1].as_i64(), Some(2));
}

#[tokio::test]
async fn editor_waiting_for_input_is_marked_and_answered() {
    let ed = Editor::start().await;
    ed.attach_ui().await;
    ed.cmd("AgentBashTerm read -p 'name? ' x; echo hello $x").await;
    ed.wait_term("name? ").await;
    ed.wait_lua("require('agent_bash.runs').bang().state.waiting_input == true").await;
    let title = ed
        .lua("local ts = require('agent_bash.terminal').terms(); local t = ts[#ts]; local c = vim.api.nvim_win_get_config(t.win).title
              local s = '' for _, ch in ipairs(c or {}) do s = s .. ch[1] end return s")
        .await;
    assert!(title.as_str().unwrap().contains("· waiting for input ·"), "{title:?}");
    // The footer says how to answer from where the cursor is: typing in the terminal, the
    // command from another window.
    let footer = "(function() local ts = require('agent_bash.terminal').terms(); local t = ts[#ts]
        local s = '' for _, ch in ipairs(vim.api.nvim_win_get_config(t.win).footer or {}) do s = s .. ch[1] end
        return s end)()";
    let here = ed.lua(&format!("return {footer}")).await;
    assert!(here.as_str().unwrap().contains("waiting for input: type your answer"), "{here:?}");
    ed.cmd("wincmd p").await;
    let away = ed.lua(&format!("return {footer}")).await;
    assert!(
        away.as_str().unwrap().contains("waiting for input: :AgentBashFocus to answer"),
        "{away:?}"
    );
    ed.cmd("AgentBashFocus").await;
    ed.wait_lua("vim.api.nvim_get_mode().mode == 't'").await;
    ed.nvim.input("bob<CR>").await.unwrap();
    ed.wait_term("hello bob").await;
    assert_eq!(ed.term_result("exit_code").await.as_i64(), Some(0));

    // A REPL waits in select(2), not read(2): its prompt is seen too.
    ed.cmd("AgentBashTerm python3 -q").await;
    ed.wait_term(">>> ").await;
    ed.wait_lua("require('agent_bash.runs').bang().state.waiting_input == true").await;
    ed.nvim.input("print(6 * 7)<CR>").await.unwrap();
    ed.wait_term("42").await;
    ed.nvim.input("exit()<CR>").await.unwrap();
    assert_eq!(ed.term_result("exit_code").await.as_i64(), Some(0));

    // A tool call's program waiting: a notice, and the user takes over in its terminal.
    let cfg = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(cfg.path(), "virtual_terminal = \"on\"\n").unwrap();
    ed.lua("require('agent_bash.backend').stop()").await;
    ed.lua(&format!("require('agent_bash').setup({{settings_file = {:?}}})", cfg.path())).await;
    ed.tool_call("ask", "{command = \"read -p 'passphrase? ' p; echo got $p\"}").await;
    ed.wait_lua("(function() for _, r in ipairs(require('agent_bash.runs').running()) do if r.state.waiting_input then return true end end end)()").await;
    let msgs = ed.messages().await;
    assert!(msgs.contains("agent-bash: waiting for input: $ read -p 'passphrase? ' p; echo got $p (:AgentBashFocus)"), "{msgs}");
    ed.cmd("AgentBashFocus").await;
    ed.wait_lua("vim.api.nvim_get_mode().mode == 't'").await;
    ed.nvim.input("s3cret<CR>").await.unwrap();
    assert_eq!(
        ed.tool_result("ask", "output").await.as_str().map(|s| s.contains("got s3cret")),
        Some(true)
    );
}

#[tokio::test]
async fn editor_prewarm_starts_backend_and_shell_when_a_ui_attaches() {
    let ed = Editor::start().await;
    assert_eq!(ed.lua("return require('agent_bash.backend').info().chan").await, Value::Nil);
    ed.attach_ui().await;
    ed.wait_lua("require('agent_bash.backend').info().warmed == true").await;
    ed.cmd("AgentBash echo warm").await;
    let card = ed.card_done().await;
    assert!(card.lines.iter().any(|l| l == "warm"));
}

/// Neovim's own TUI in a real PTY, read through a terminal emulator (the `vt100` crate): the
/// screen a person sees.
struct Tui {
    screen: std::sync::Arc<std::sync::Mutex<vt100::Parser>>,
    writer: Box<dyn std::io::Write + Send>,
    child: Box<dyn portable_pty::Child + Send + Sync>,
    _home: tempfile::TempDir,
}

impl Tui {
    fn start(cols: u16, rows: u16) -> Tui {
        use portable_pty::{CommandBuilder, PtySize};
        let home = tempfile::tempdir().unwrap();
        let size = PtySize { rows, cols, pixel_width: 0, pixel_height: 0 };
        let pair = portable_pty::native_pty_system().openpty(size).unwrap();
        let nvim = std::env::var("NVIM_BIN").unwrap_or_else(|_| "nvim".into());
        let mut cmd = CommandBuilder::new(nvim);
        cmd.args(["--clean", "-n", "-i", "NONE", "--cmd"]);
        cmd.arg(format!("set rtp^={}", env!("CARGO_MANIFEST_DIR")));
        cmd.arg("-c");
        cmd.arg(format!("lua require('agent_bash').setup({{bin = {:?}}})", super::support::BIN));
        cmd.env("TERM", "xterm-256color");
        for (k, d) in [
            ("XDG_STATE_HOME", "state"),
            ("XDG_DATA_HOME", "data"),
            ("XDG_CONFIG_HOME", "config"),
            ("XDG_CACHE_HOME", "cache"),
        ] {
            cmd.env(k, home.path().join(d));
        }
        cmd.cwd(home.path());
        let child = pair.slave.spawn_command(cmd).unwrap();
        drop(pair.slave);
        let mut reader = pair.master.try_clone_reader().unwrap();
        let writer = pair.master.take_writer().unwrap();
        let screen = std::sync::Arc::new(std::sync::Mutex::new(vt100::Parser::new(
            std::num::NonZeroU16::new(rows).unwrap(),
            std::num::NonZeroU16::new(cols).unwrap(),
            0,
        )));
        let s = screen.clone();
        std::thread::spawn(move || {
            let _keep = pair.master;
            let mut buf = [0u8; 8192];
            while let Ok(n) = std::io::Read::read(&mut reader, &mut buf) {
                if n == 0 {
                    break;
                }
                s.lock().unwrap().process(&buf[..n]);
            }
        });
        Tui { screen, writer, child, _home: home }
    }

    fn rows(&self) -> Vec<String> {
        let p = self.screen.lock().unwrap();
        let (_, cols) = p.screen().size();
        p.screen().rows(0, cols.get()).collect()
    }

    fn cursor(&self) -> (u16, u16) {
        self.screen.lock().unwrap().screen().cursor_position()
    }

    fn type_keys(&mut self, keys: &str) {
        self.writer.write_all(keys.as_bytes()).unwrap();
        self.writer.flush().unwrap();
    }

    async fn wait(&self, needle: &str) -> Vec<String> {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let rows = self.rows();
            if rows.iter().any(|r| r.contains(needle)) {
                return rows;
            }
            assert!(Instant::now() < end, "screen never showed {needle:?}:\n{}", rows.join("\n"));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Tui {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn editor_screen_card_layout_in_a_real_terminal() {
    let mut tui = Tui::start(100, 30);
    tui.wait("[No Name]").await;
    let home = tui.cursor();
    tui.type_keys(":AgentBash seq 1 100\r");
    let rows = tui.wait("$ seq 1 100 · done · ").await;
    let text = rows.join("\n");
    // The card sits at the bottom right, above the status line, and its hidden-lines note
    // stands above the tail it shows.
    let title = rows.iter().position(|r| r.contains("╭ ✓ $ seq 1 100 · done · ")).unwrap();
    let note = rows.iter().position(|r| r.contains("… 80 more lines (<Tab> to expand)")).unwrap();
    let first =
        rows.iter().position(|r| r.trim_end().ends_with("│81") || r.contains("│81 ")).unwrap();
    let last = rows.iter().position(|r| r.contains("│100 ")).unwrap();
    assert!(title < note && note < first && first < last, "{text}");
    // Unfocused, the footer names what works from the buffer.
    assert!(rows[last + 1].contains(":AgentBashFocus 1 · :AgentBashClose 1 ╯"), "{text}");
    assert!(
        rows[last + 1].trim_end().ends_with('╯') && rows[last + 1].chars().count() >= 99,
        "{text}"
    );
    // The cursor stayed in the buffer: typing goes there, not into the card.
    assert_eq!(tui.cursor(), home, "{text}");
    tui.type_keys("ihello<Esc>");
    let rows = tui.wait("hello").await;
    assert!(rows[0].starts_with("hello"), "{}", rows.join("\n"));
}

/// The variables the non-interactive hardening sets (contract §6), printed one per line.
const ENV_PROBE: &str = "for v in CI EDITOR VISUAL GIT_EDITOR PAGER MANPAGER GIT_PAGER LESS GPG_TTY npm_config_yes; do echo \"$v=${!v-unset}\"; done";

#[tokio::test]
async fn editor_bang_commands_get_the_users_environment_tool_calls_the_hardening() {
    let user = [
        ("EDITOR", "vim"),
        ("VISUAL", "nvim"),
        ("GIT_EDITOR", "vi"),
        ("PAGER", "less"),
        ("MANPAGER", "less -s"),
        ("GIT_PAGER", "delta"),
    ];
    let ed = Editor::start_with(true, env!("CARGO_MANIFEST_DIR"), &user).await;
    // The backend starts with the first command and inherits the editor's environment; CI may
    // be set by whatever runs the tests, the user here has none.
    ed.lua("vim.env.CI = nil; vim.env.LESS = nil").await;
    // The oracle: what `:!` (Neovim's own shell call) gives the same command.
    let bang = ed.lua(&format!("return vim.fn.systemlist({{'bash', '-c', {ENV_PROBE:?}}})")).await;
    let bang: Vec<String> =
        bang.as_array().unwrap().iter().map(|l| l.as_str().unwrap().to_string()).collect();
    assert!(bang.contains(&"CI=unset".to_string()) && bang.contains(&"EDITOR=vim".to_string()));
    ed.cmd(&format!("AgentBash {ENV_PROBE}")).await;
    let card = ed.card_done().await;
    for line in &bang {
        assert!(card.lines.contains(line), "bang card lacks {line:?}: {card:?}");
    }
    // A terminal float too: `git commit` and `man` get the user's editor and pager.
    ed.attach_ui().await;
    ed.cmd(&format!("AgentBashTerm {ENV_PROBE}")).await;
    let term = ed.wait_term("npm_config_yes=").await;
    for line in &bang {
        assert!(term.contains(line), "terminal lacks {line:?}: {term:?}");
    }
    // A tool call keeps the non-interactive hardening.
    ed.tool_call("t", &format!("{{command = {ENV_PROBE:?}}}")).await;
    let out = ed.tool_result("t", "output").await;
    let out = out.as_str().unwrap();
    for want in [
        "CI=true",
        "EDITOR=true",
        "VISUAL=true",
        "GIT_EDITOR=true",
        "PAGER=cat",
        "MANPAGER=cat",
        "GIT_PAGER=cat",
        "LESS=FRX",
        "GPG_TTY=not a tty",
        "npm_config_yes=true",
    ] {
        assert!(out.lines().any(|l| l == want), "tool call lacks {want:?}: {out}");
    }
}

#[tokio::test]
async fn editor_settings_errors_are_shown_and_restart_reads_them_again() {
    // 80×24: `:checkhealth` trips an assertion in 0.11.4 after a headless resize.
    let ed = Editor::start_sized(false).await;
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("settings.toml");
    std::fs::write(&bad, "bogus = 1\n").unwrap();
    ed.lua(&format!("require('agent_bash').setup({{settings_file = {:?}}})", bad)).await;
    // The card carries the backend's own words, not a closed channel.
    // (the error notification reaches the RPC caller as an error: ignored here)
    let _ = ed.nvim.command("AgentBash echo hi").await;
    let card = ed.card_done().await;
    let text = card.lines.join("\n");
    assert!(text.contains("Bash command failed: settings ") && text.contains("bogus"), "{card:?}");
    assert!(text.contains("unknown field"), "{card:?}");
    assert!(
        !text.contains("Invalid channel") && !text.contains("did not answer hello"),
        "{card:?}"
    );
    // :checkhealth marks the settings file as the error, with that text.
    ed.cmd("silent checkhealth agent_bash").await;
    let health =
        ed.lua("return table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), '\\n')").await;
    let health = health.as_str().unwrap().to_string();
    ed.cmd("bwipe").await;
    let line = health
        .lines()
        .find(|l| l.contains("ERROR settings file"))
        .unwrap_or_else(|| panic!("no settings ERROR in:\n{health}"));
    assert!(line.contains(bad.to_str().unwrap()), "{line}");
    assert!(health.contains("unknown field"), "{health}");
    // Fixed on disk: :AgentBashRestart reads it again and commands run.
    std::fs::write(&bad, "[env]\nAB_MARK = \"one\"\n").unwrap();
    ed.cmd("AgentBashRestart").await;
    assert!(ed.messages().await.contains("backend restarted"), "{}", ed.messages().await);
    ed.cmd("AgentBash echo mark:$AB_MARK").await;
    let card = ed.card_done().await;
    assert!(card.lines.iter().any(|l| l == "mark:one"), "{card:?}");
    // setup() with another settings file while a command runs: the restart waits for it and
    // says so; once it ends the backend reads the new file.
    let two = dir.path().join("two.toml");
    std::fs::write(&two, "[env]\nAB_MARK = \"two\"\n").unwrap();
    let pid = ed.lua("return require('agent_bash.backend').info().pid").await;
    ed.cmd("AgentBash echo running; sleep 30").await;
    ed.wait_lua("(function() local c = require('agent_bash.float').cards(); c = c[#c]; return c and #c.run.state.lines > 0 end)()").await;
    ed.lua(&format!("require('agent_bash').setup({{settings_file = {:?}}})", two)).await;
    let msgs = ed.messages().await;
    assert!(
        msgs.contains("restarts once 1 running command ends: $ echo running; sleep 30"),
        "{msgs}"
    );
    assert_eq!(ed.lua("return require('agent_bash.backend').info().pid").await, pid);
    ed.cmd("AgentBashCancel").await;
    ed.wait_lua(&format!(
        "(function() local p = require('agent_bash.backend').info().pid; return p ~= nil and p ~= {} end)()",
        pid.as_i64().unwrap()
    ))
    .await;
    ed.cmd("AgentBash echo mark:$AB_MARK").await;
    let card = ed.card_done().await;
    assert!(card.lines.iter().any(|l| l == "mark:two"), "{card:?}");
}

impl Editor {
    /// Every float on screen that covers the cursor's cell (the cursor is in a normal window),
    /// as `{win, row, col, height, width}` tables; and the cursor's cell.
    async fn floats_over_cursor(&self) -> (Value, Value) {
        let v = self
            .lua(
                "local pos = vim.fn.screenpos(0, vim.fn.line('.'), vim.fn.col('.'))
                 local r, c = pos.row - 1, pos.col - 1
                 local over = {}
                 for _, w in ipairs(vim.api.nvim_list_wins()) do
                   local cfg = vim.api.nvim_win_get_config(w)
                   if cfg.relative ~= '' and not cfg.hide then
                     local edge = cfg.focusable == false and 0 or 2 -- cards have a border
                     local row, col = cfg.row, cfg.col
                     if type(row) == 'table' then row, col = row[false], col[false] end
                     if r >= row and r < row + cfg.height + edge and c >= col and c < col + cfg.width + edge then
                       over[#over + 1] = {win = w, row = row, col = col, height = cfg.height, width = cfg.width}
                     end
                   end
                 end
                 return {over, {r, c}}",
            )
            .await;
        let a = v.as_array().unwrap();
        (a[0].clone(), a[1].clone())
    }

    /// Cards with a window on screen: (running, finished bang, finished tool).
    async fn shown_cards(&self) -> (i64, i64, i64) {
        let v = self
            .lua(
                "local run, bang, tool = 0, 0, 0
                 for _, c in ipairs(require('agent_bash.float').cards()) do
                   if c.win and vim.api.nvim_win_is_valid(c.win) then
                     if not c.run.finished then run = run + 1
                     elseif c.run.state.origin == 'bang' then bang = bang + 1
                     else tool = tool + 1 end
                   end
                 end
                 return {run, bang, tool}",
            )
            .await;
        let a: Vec<i64> = v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect();
        (a[0], a[1], a[2])
    }
}

#[tokio::test]
async fn editor_cards_never_pile_up_or_cover_the_cursor() {
    let ed = Editor::start_sized(false).await;
    ed.cmd("set lines=24 columns=90").await;
    ed.lua("require('agent_bash').setup({card = {auto_close = 300}})").await;
    // A buffer whose lines reach the right edge; the cursor at the bottom right.
    ed.lua(
        "vim.api.nvim_buf_set_lines(0, 0, -1, false, vim.fn['repeat']({string.rep('x', 88)}, 200))",
    )
    .await;
    ed.cmd("normal! G$").await;
    // Quick commands one after another: one finished bang card at a time.
    for i in 0..4 {
        ed.cmd(&format!("AgentBash echo quick {i}")).await;
        ed.card_done().await;
        let (running, bang, _) = ed.shown_cards().await;
        assert_eq!((running, bang), (0, 1), "after quick {i}");
        let (over, cursor) = ed.floats_over_cursor().await;
        assert_eq!(over, Value::Array(vec![]), "a card covers the cursor at {cursor:?}");
    }
    // Five long ones: three cards run on screen, one line counts the other two.
    let mut ids = vec![];
    for i in 1..=5 {
        ed.cmd(&format!("AgentBash echo started {i}; sleep 30")).await;
        ids.push(ed.lua("return require('agent_bash.runs').latest().id").await.as_i64().unwrap());
        let (over, cursor) = ed.floats_over_cursor().await;
        assert_eq!(over, Value::Array(vec![]), "a card covers the cursor at {cursor:?}");
    }
    let (running, bang, _) = ed.shown_cards().await;
    assert_eq!(running, 3);
    assert_eq!(bang, 0, "a new card replaced the finished one");
    let more = ed.lua("return require('agent_bash.float').more_text()").await;
    assert_eq!(
        more.as_str(),
        Some(format!(" 2 more running (:AgentBashFocus {}|{})", ids[1], ids[0]).as_str())
    );
    // The cursor moves under the stack: the stack moves off it.
    ed.cmd("normal! gg$").await;
    let (over, cursor) = ed.floats_over_cursor().await;
    assert_eq!(over, Value::Array(vec![]), "a card covers the cursor at {cursor:?}");
    ed.cmd("normal! G$").await;
    // Every run is reachable: completion names them, Focus and Cancel take an id.
    let items = ed.lua("return vim.fn.getcompletion('AgentBashCancel ', 'cmdline')").await;
    let want = format!("{} echo started 1; sleep 30", ids[0]);
    assert!(
        items.as_array().unwrap().iter().any(|i| i.as_str() == Some(want.as_str())),
        "{items:?}"
    );
    ed.cmd(&format!("AgentBashFocus {}", ids[0])).await;
    let focused = ed
        .lua(&format!(
            "local c = require('agent_bash.float').find({}); return c.win == vim.api.nvim_get_current_win()",
            ids[0]
        ))
        .await;
    assert_eq!(focused, Value::Boolean(true));
    // Inside, the card's own keys are named.
    let card = ed.lua(&format!("local c = require('agent_bash.float').find({}); return vim.api.nvim_buf_get_lines(c.buf, 0, -1, false)", ids[0])).await;
    assert!(
        card.as_array().unwrap().iter().any(|l| l.as_str() == Some("Running… (<Esc> to cancel)")),
        "{card:?}"
    );
    ed.cmd("wincmd p").await;
    ed.cmd(&format!("AgentBashCancel {}", ids[0])).await;
    ed.wait_lua(&format!("require('agent_bash.runs').finished({}) ~= nil", ids[0])).await;
    assert_eq!(
        ed.lua(&format!("return require('agent_bash.runs').finished({}).state.status", ids[0]))
            .await
            .as_str(),
        Some("cancelled")
    );
    // Unfocused, a running card's hints name the commands that work from the buffer.
    let id = ids[4];
    let card = ed.lua(&format!("local c = require('agent_bash.float').find({id}); return vim.api.nvim_buf_get_lines(c.buf, 0, -1, false)")).await;
    let want = format!("Running… (:AgentBashCancel {id} to cancel)");
    assert!(card.as_array().unwrap().iter().any(|l| l.as_str() == Some(want.as_str())), "{card:?}");
    for id in &ids[1..] {
        ed.cmd(&format!("AgentBashCancel {id}")).await;
    }
    ed.wait_lua("#require('agent_bash.runs').running() == 0").await;
    let (running, bang, _) = ed.shown_cards().await;
    assert_eq!((running, bang), (0, 1));
    // A long output finishing after a command that still runs leaves that one on screen.
    ed.cmd("AgentBash echo still-running; sleep 30").await;
    let long = ed.lua("return require('agent_bash.runs').latest().id").await.as_i64().unwrap();
    ed.cmd("AgentBash seq 1 5000").await;
    ed.wait_lua("require('agent_bash.runs').finished().state.command == 'seq 1 5000'").await;
    let (running, bang, _) = ed.shown_cards().await;
    assert_eq!((running, bang), (1, 1), "the running card was pushed off the screen");
    let (over, cursor) = ed.floats_over_cursor().await;
    assert_eq!(over, Value::Array(vec![]), "a card covers the cursor at {cursor:?}");
    ed.cmd(&format!("AgentBashCancel {long}")).await;
    ed.wait_lua("#require('agent_bash.runs').running() == 0").await;
    // A finished tool-call card closes by itself.
    ed.tool_call("t", "{command = 'echo tool'}").await;
    ed.tool_result("t", "output").await;
    ed.wait_lua("(function() for _, c in ipairs(require('agent_bash.float').cards()) do if c.run.state.origin == 'tool' then return false end end return true end)()").await;
    // A finished terminal float closes when the next card opens, and with :AgentBashClose.
    ed.attach_ui().await;
    ed.cmd("AgentBashTerm echo in-terminal").await;
    let term = "require('agent_bash.terminal').get(require('agent_bash.runs').finished().id)";
    ed.wait_lua(&format!(
        "require('agent_bash.runs').finished().pty and {term} and {term}.finished"
    ))
    .await;
    assert_eq!(
        ed.lua(&format!("return {term}.win ~= nil")).await,
        Value::Boolean(true),
        "the finished terminal is on screen"
    );
    ed.cmd("wincmd p").await;
    ed.cmd("AgentBash echo after").await;
    ed.card_done().await;
    let shown = ed.lua("for _, t in pairs(require('agent_bash.terminal').terms()) do if t.win then return true end end return false").await;
    assert_eq!(shown, Value::Boolean(false), "the finished terminal float is closed");
    ed.cmd("AgentBashClose").await;
    assert_eq!(ed.lua("return #require('agent_bash.float').cards()").await.as_i64(), Some(0));
}

#[tokio::test]
async fn editor_bang_habits_autowrite_completion_and_range_filter() {
    let ed = Editor::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("words.txt"), "pear\nfig\napple\n").unwrap();
    ed.cmd(&format!("cd {}", dir.path().display())).await;
    // 'autowrite': a modified buffer is written before the command runs, as for :!.
    ed.cmd("edit words.txt").await;
    ed.lua("vim.api.nvim_buf_set_lines(0, -1, -1, false, {'kiwi'})").await;
    ed.cmd("set autowrite").await;
    ed.cmd("AgentBash tail -1 %").await;
    let card = ed.card_done().await;
    assert!(card.lines.iter().any(|l| l == "kiwi"), "{card:?}");
    assert_eq!(ed.lua("return vim.bo.modified").await, Value::Boolean(false));
    // File names complete as for :!.
    let items = ed.lua("return vim.fn.getcompletion('AgentBash cat wo', 'cmdline')").await;
    assert!(items.as_array().unwrap().iter().any(|i| i.as_str() == Some("words.txt")), "{items:?}");
    // :{range}AgentBash {filter} does what :{range}! does, in one undo step.
    let lines = "{'delta', 'charlie', 'alpha', 'bravo', 'echo'}";
    for (range, filter) in [("%", "sort"), ("2,4", "tr a-z A-Z | sort -r"), ("3", "rev")] {
        ed.lua(&format!(
            "vim.cmd('enew!'); vim.api.nvim_buf_set_lines(0, 0, -1, false, {lines}); vim.bo.modified = false"
        ))
        .await;
        ed.cmd(&format!("{range}!{filter}")).await;
        let want = ed.lua("return vim.api.nvim_buf_get_lines(0, 0, -1, false)").await;
        ed.lua(&format!(
            "vim.cmd('enew!'); vim.api.nvim_buf_set_lines(0, 0, -1, false, {lines}); vim.bo.modified = false"
        ))
        .await;
        let before = ed.lua("return vim.api.nvim_buf_get_lines(0, 0, -1, false)").await;
        ed.cmd(&format!("{range}AgentBash {filter}")).await;
        ed.wait_lua(&format!(
            "vim.deep_equal(vim.api.nvim_buf_get_lines(0, 0, -1, false), {})",
            lua_list(&want)
        ))
        .await;
        ed.cmd("undo").await;
        assert_eq!(
            ed.lua("return vim.api.nvim_buf_get_lines(0, 0, -1, false)").await,
            before,
            "one undo step for {range}{filter}"
        );
    }
    // A failing filter leaves the lines alone.
    ed.cmd("AgentBash echo done").await;
    ed.card_done().await;
    ed.cmd("%AgentBash echo broken; exit 3").await;
    ed.card_done().await;
    assert_eq!(
        ed.lua("return vim.api.nvim_buf_get_lines(0, 0, -1, false)").await,
        ed.lua(&format!("return {lines}")).await
    );
}

/// A Lua list literal of the strings in `v` (an array Value).
fn lua_list(v: &Value) -> String {
    let items: Vec<String> =
        v.as_array().unwrap().iter().map(|s| format!("{:?}", s.as_str().unwrap())).collect();
    format!("{{{}}}", items.join(", "))
}

#[tokio::test]
async fn editor_quickfix_follows_directories() {
    let ed = Editor::start().await;
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    bad_c(&sub);
    std::fs::write(sub.join("Makefile"), "all:\n\tgcc -c bad.c -o /dev/null\n").unwrap();
    ed.cmd(&format!("cd {}", dir.path().display())).await;
    let want = sub.join("bad.c").to_string_lossy().into_owned();
    for cmd in ["cd sub && gcc -c bad.c -o /dev/null", "make -C sub", "cd sub && make"] {
        ed.lua("vim.fn.setqflist({}, 'r')").await;
        ed.cmd(&format!("AgentBash {cmd}")).await;
        ed.card_done().await;
        let qf = ed
            .wait_lua("(function() for _, e in ipairs(vim.fn.getqflist()) do if e.valid == 1 then return {vim.fn.fnamemodify(vim.fn.bufname(e.bufnr), ':p'), e.lnum} end end end)()")
            .await;
        let a = qf.as_array().unwrap();
        assert_eq!(a[0].as_str(), Some(want.as_str()), "{cmd}: {qf:?}");
        assert_eq!(a[1].as_i64(), Some(2), "{cmd}");
        // Jumping to the entry opens the file that exists.
        ed.lua("for i, e in ipairs(vim.fn.getqflist()) do if e.valid == 1 then vim.cmd('cc ' .. i) return end end").await;
        assert_eq!(ed.lua("return vim.fn.expand('%:p')").await.as_str(), Some(want.as_str()));
        assert_eq!(
            ed.lua("return vim.fn.line('$') > 1").await,
            Value::Boolean(true),
            "{cmd}: the real file"
        );
        ed.cmd("enew").await;
    }
}

/// `make run ARGS=…` hands its arguments to Neovim, as `nvim ARGS` would take them: the line
/// make runs (after the build) is read with `make -n`, then run as is with a headless probe
/// appended.
#[test]
fn make_run_passes_args_to_neovim() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "one\ntwo\nthree\nfour\n").unwrap();
    let args = format!("ARGS=--headless {} +3", notes.display());
    let out =
        std::process::Command::new("make").args(["-n", "run", &args]).current_dir(root).output();
    let out = out.unwrap();
    let plan = String::from_utf8(out.stdout).unwrap();
    let line =
        plan.lines().find(|l| l.starts_with("scripts/run.sh")).unwrap_or_else(|| panic!("{plan}"));
    assert_eq!(line, format!("scripts/run.sh --headless {} +3", notes.display()));
    let probe =
        " '+lua io.stdout:write(vim.fn.expand(\"%:t\") .. \":\" .. vim.fn.line(\".\"))' +qa";
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{line}{probe}"))
        .current_dir(root)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "notes.txt:3", "{out:?}");
}
