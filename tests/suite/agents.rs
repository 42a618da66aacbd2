//! The real coding agents with `agent-bash mcp` as their shell tool: Claude Code, Codex and Gemini
//! CLI (pinned npm versions, installed by scripts/agents.sh), each driven through a scripted model
//! of ours (tests/agents/drive.py) that listens on 127.0.0.1 inside a network namespace of the
//! test's own (`unshare -n`, only `lo` up), so no request can leave the machine.
//!
//! What is asserted is what the agent's *model* receives, as the scripted model captured it: each
//! tool result is exactly what `agent-bash exec` prints for the same command, once the agent's own
//! wrapping (named below, per agent) is taken off. The calls show as cards in a headless Neovim
//! named after the agent; interrupting the agent mid-call leaves no process behind.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value as Json};
use tokio::process::Command;

use super::mcp::Editor;
use super::support::{eventually, procs_with_env, BIN};

fn python() -> PathBuf {
    std::env::var_os("MCP_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python"))
}

/// Where scripts/agents.sh installed the agents (`AGENTS_BIN`, else `.agents/node_modules/.bin`).
fn agents_bin() -> PathBuf {
    let dir = std::env::var_os("AGENTS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".agents/node_modules/.bin"));
    assert!(dir.join("claude").exists(), "no agents in {dir:?}: run scripts/agents.sh");
    dir
}

/// The client names the agents give in their MCP handshake (the card's title names them).
const CLIENT: [(&str, &str); 3] =
    [("claude", "claude-code"), ("codex", "codex-mcp-client"), ("gemini", "gemini-cli-mcp-client")];

fn client_name(agent: &str) -> &'static str {
    CLIENT.iter().find(|(a, _)| *a == agent).map(|(_, c)| *c).unwrap()
}

/// Runs the agent through the scripted model in a fresh network namespace; returns what the
/// driver captured (`requests`, `results`, `agent {rc, stdout, stderr}`, `errors`).
async fn drive(agent: &str, work: &Path, mut spec: Json) -> Json {
    spec["bin_dir"] = json!(agents_bin());
    spec["agent_bash"] = json!(BIN);
    spec["work"] = json!(work);
    let spec_path = work.join("spec.json");
    let out_path = work.join("out.json");
    std::fs::write(&spec_path, spec.to_string()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agents/drive.py");
    let mut cmd = Command::new("unshare");
    cmd.args(["-n", "sh", "-c", "ip link set lo up && exec \"$0\" \"$@\""])
        .arg(python())
        .arg(script)
        .arg(agent)
        .arg(&spec_path)
        .arg(&out_path)
        .env_remove("NVIM")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(300), cmd.output())
        .await
        .expect("the agent's run finished within 300 s")
        .expect("unshare runs (as root)");
    assert!(
        out.status.success(),
        "the driver failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let run: Json = serde_json::from_slice(&std::fs::read(&out_path).unwrap()).unwrap();
    assert_eq!(run["errors"], json!([]), "the scripted model went wrong: {}", run["agent"]);
    // Nothing but loopback: every request the agent made reached our model.
    assert!(!run["requests"].as_array().unwrap().is_empty(), "{}", run["agent"]);
    run
}

/// What `agent-bash exec` prints for `args` (a fresh state dir, HOME and extra env).
async fn exec_text(args: &[&str], env: &[(&str, &str)]) -> String {
    let state = tempfile::tempdir().unwrap();
    let cfg = state.path().join("config.toml");
    std::fs::write(&cfg, format!("state_dir = {:?}\n", state.path().to_str().unwrap())).unwrap();
    let out = Command::new(BIN)
        .arg("exec")
        .arg("--config")
        .arg(&cfg)
        .args(args)
        .env("HOME", state.path())
        .envs(env.iter().copied())
        .current_dir(state.path())
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    String::from_utf8(out.stdout).unwrap()
}

/// `exec` ends its output with a newline when the model text has none: the model text as
/// `exec` would print it.
fn as_printed(text: &str) -> String {
    if text.ends_with('\n') {
        text.to_string()
    } else {
        format!("{text}\n")
    }
}

/// The text our server sent, out of what the agent handed its model for one tool result,
/// taking off each agent's own wrapping:
/// - Claude Code: none (a string, or text blocks);
/// - Codex: `Wall time: <s> seconds\nOutput:\n` before the text (one string, or the first of
///   several input_text items);
/// - Gemini CLI: a success is `{"output": "<untrusted_context>\n…\n</untrusted_context>"}`; an
///   error is `{"error": "MCP tool 'bash' reported tool error for function call: <call> with
///   response: <the whole MCP result as JSON>"}`.
fn unwrap_result(agent: &str, raw: &Json) -> String {
    match agent {
        "claude" => match raw {
            Json::String(s) => s.clone(),
            Json::Array(blocks) => blocks.iter().map(|b| b["text"].as_str().unwrap()).collect(),
            other => panic!("Claude Code tool result {other}"),
        },
        "codex" => {
            let whole = match raw {
                Json::String(s) => s.clone(),
                Json::Array(items) => {
                    let texts: Vec<&str> =
                        items.iter().map(|i| i["text"].as_str().unwrap()).collect();
                    texts.join("\n")
                }
                other => panic!("Codex tool result {other}"),
            };
            let rest = whole.strip_prefix("Wall time: ").unwrap_or_else(|| panic!("{whole:?}"));
            let (secs, text) =
                rest.split_once(" seconds\nOutput:\n").unwrap_or_else(|| panic!("{whole:?}"));
            assert!(secs.parse::<f64>().is_ok(), "{whole:?}");
            text.to_string()
        }
        "gemini" => {
            let response = &raw["response"];
            if let Some(out) = response["output"].as_str() {
                let inner =
                    out.strip_prefix("<untrusted_context>\n").unwrap_or_else(|| panic!("{out:?}"));
                return inner
                    .strip_suffix("\n</untrusted_context>")
                    .unwrap_or_else(|| panic!("{out:?}"))
                    .to_string();
            }
            let err = response["error"].as_str().unwrap_or_else(|| panic!("{raw}"));
            let (_, json_part) =
                err.split_once(" with response: ").unwrap_or_else(|| panic!("{err:?}"));
            let parts: Json =
                serde_json::from_str(json_part).unwrap_or_else(|e| panic!("{e}: {err:?}"));
            let content = &parts[0]["functionResponse"]["response"]["content"];
            content.as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap()).collect()
        }
        _ => unreachable!(),
    }
}

/// Codex cuts a tool result over its budget (`tool_output_token_limit`, ~10 KB by default) in
/// the middle, leaving `…<N> tokens truncated…` there: `got` is `want` cut so, or `want` itself.
fn codex_cut_of(got: &str, want: &str) -> bool {
    let marker = regex::Regex::new(r"…\d+ tokens truncated…").unwrap();
    let Some(m) = marker.find(got) else { return got == want };
    let (before, after) = (&got[..m.start()], &got[m.end()..]);
    want.starts_with(before) && want.ends_with(after) && before.len() + after.len() < want.len()
}

/// Panics with the first line that differs (the texts may be thousands of lines long). Codex's
/// cut (see [`codex_cut_of`]) is the one difference allowed, and only for Codex.
fn same_text(agent: &str, got: &str, want: &str, what: &str) {
    if got == want || (agent == "codex" && codex_cut_of(got, want)) {
        return;
    }
    let (g, w): (Vec<&str>, Vec<&str>) = (got.split('\n').collect(), want.split('\n').collect());
    let i = g.iter().zip(&w).position(|(a, b)| a != b).unwrap_or(g.len().min(w.len()));
    let ctx = |v: &[&str]| v[i.saturating_sub(2)..(i + 3).min(v.len())].join("\n");
    panic!(
        "{what}: the model got other text than exec prints; first difference at line {}\n\
         model ({} lines):\n{}\nexec ({} lines):\n{}",
        i + 1,
        g.len(),
        ctx(&g),
        w.len(),
        ctx(&w)
    );
}

/// Whether the agent's resource tool gave the model `want`, the artifact's text, taking off the
/// agent's wrapping: Claude Code and Codex show the model the JSON of the `resources/read`
/// result (`{server?, uri?, contents: [{uri, mimeType, text}]}`); Gemini CLI the text itself.
fn resource_read_is(agent: &str, raw: &Json, want: &str) {
    let text = match agent {
        "claude" => {
            let mut text = unwrap_result("claude", raw);
            // Claude Code keeps a result over its size limit in a file and gives the model a
            // 2 KB preview and the file's path (`<persisted-output>`): what the model reads next.
            if let Some(rest) = text.strip_prefix("<persisted-output>\n") {
                let path = rest.split("Full output saved to: ").nth(1).unwrap().lines().next();
                text = std::fs::read_to_string(path.unwrap()).unwrap();
            }
            text
        }
        "codex" => match raw {
            Json::String(s) => s.clone(),
            Json::Array(items) => items.iter().map(|i| i["text"].as_str().unwrap()).collect(),
            other => panic!("Codex resource result {other:.300}"),
        },
        "gemini" => {
            // Gemini CLI puts a newline after each content's text.
            let out = raw["response"]["output"].as_str().unwrap_or_else(|| panic!("{raw:.300}"));
            let out = out.strip_suffix('\n').unwrap_or_else(|| panic!("{out:.300}"));
            return same_text(agent, out, want, "artifact://0 read back (gemini)");
        }
        _ => unreachable!(),
    };
    if let Ok(v) = serde_json::from_str::<Json>(&text) {
        let got = v["contents"][0]["text"].as_str().unwrap_or_else(|| panic!("{v:.300}"));
        return same_text(agent, got, want, &format!("artifact://0 read back ({agent})"));
    }
    // Codex cut the JSON in the middle: both ends must be the JSON of the artifact's text.
    assert_eq!(agent, "codex", "not JSON: {text:.300}");
    let escaped = serde_json::to_string(want).unwrap();
    let escaped = &escaped[1..escaped.len() - 1];
    let marker = regex::Regex::new(r"…\d+ tokens truncated…").unwrap();
    let m = marker.find(&text).unwrap_or_else(|| panic!("not JSON, not cut: {text:.300}"));
    let (before, after) = (&text[..m.start()], &text[m.end()..]);
    let head =
        before.split_once("\"text\":\"").map(|(_, h)| h).unwrap_or_else(|| panic!("{before:.300}"));
    let tail = after.rsplit_once("\"}]").map(|(t, _)| t).unwrap_or_else(|| panic!("{after:.300}"));
    assert!(head.len() > 1000 && escaped.starts_with(head), "head of the read: {head:.300}");
    assert!(tail.len() > 1000 && escaped.ends_with(tail), "tail of the read: {tail:.300}");
}

/// Every tool-call run the editor shows or showed as a card, oldest first: `(title, status,
/// output lines)`, the title as the card draws it (a card may have been closed since: the
/// layout keeps as many as fit).
async fn cards(ed: &Editor) -> Vec<(String, String, String)> {
    let v = ed
        .lua(
            "local runs, card = require('agent_bash.runs'), require('agent_bash.card')
             local out = {}
             for id = 1, 50 do
               local run = runs.finished(id) or runs.get(id)
               if run and run.state.origin == 'tool' then
                 local title = ''
                 for _, chunk in ipairs(card.title(run.state, 200)) do title = title .. chunk[1] end
                 table.insert(out, { title, run.state.status or '', table.concat(run.state.lines or {}, '\\n') })
               end
             end
             return out",
        )
        .await;
    v.as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let c = c.as_array().unwrap();
            let s = |i: usize| c[i].as_str().unwrap_or("").to_string();
            (s(0), s(1), s(2))
        })
        .collect()
}

/// One agent, one run: a success, state kept across calls, a failure, a timeout and a long
/// output whose artifact the model reads back through the agent's resource tool; each result
/// is what `exec` prints; each call is a card in the editor, titled with the agent's name.
async fn model_reads_our_text(agent: &str) {
    let ed = Editor::start().await;
    let work = tempfile::tempdir().unwrap();
    let steps = [
        json!({"command": "printf 'one\\ntwo\\n'; export AGENT_STATE=kept-between-calls"}),
        json!({"command": "echo \"state: $AGENT_STATE\"; echo oops >&2; exit 3"}),
        json!({"command": "echo before-timeout; sleep 30", "timeout": 1}),
        json!({"command": "seq 1 30000"}),
    ];
    let mut script: Vec<Json> = steps.iter().map(|s| json!({"bash": s})).collect();
    script.push(json!({"read_artifact": true}));
    let spec = json!({"steps": script, "nvim": ed.addr});
    let run = drive(agent, work.path(), spec).await;
    assert_eq!(run["agent"]["rc"], 0, "{}", run["agent"]);
    let results = run["results"].as_array().unwrap();
    assert_eq!(results.len(), 5, "{}", run["agent"]);

    // The cards: one per call, named after the agent, each with its ending and output.
    let title = format!("bash ({})", client_name(agent));
    // (A card may be updated a moment after the agent got its result.)
    let end = std::time::Instant::now() + Duration::from_secs(20);
    let mut cs = cards(&ed).await;
    while (cs.len() < 4 || cs.iter().any(|c| c.1 == "running")) && std::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(50)).await;
        cs = cards(&ed).await;
    }
    assert_eq!(cs.len(), 4, "{cs:?}");
    let statuses: Vec<&str> = cs.iter().map(|c| c.1.as_str()).collect();
    assert_eq!(statuses, ["done", "error", "timed_out", "done"], "{cs:?}");
    for (t, _, _) in &cs {
        assert!(t.contains(&format!(" · {title} · ")), "card title {t:?}, want {title:?}");
    }
    assert_eq!(cs[0].2, "one\ntwo", "{cs:?}");
    assert!(cs[1].2.starts_with("state: kept-between-calls"), "{cs:?}");
    assert_eq!(cs[2].2, "before-timeout", "{cs:?}");
    assert!(cs[3].2.ends_with("\n29999\n30000"), "{cs:?}");

    // What exec prints for the same commands (the second with the state the first left).
    let state = [("AGENT_STATE", "kept-between-calls")];
    let expected = [
        exec_text(&["--", "printf 'one\\ntwo\\n'; export AGENT_STATE=kept-between-calls"], &[])
            .await,
        exec_text(&["--", "echo \"state: $AGENT_STATE\"; echo oops >&2; exit 3"], &state).await,
        exec_text(&["--timeout", "1", "--", "echo before-timeout; sleep 30"], &[]).await,
        exec_text(&["--", "seq 1 30000"], &[]).await,
    ];
    assert!(expected[1].contains("state: kept-between-calls"), "{}", expected[1]);
    assert!(expected[2].starts_with("[Command timed out after 1 seconds]"), "{}", expected[2]);
    for (i, want) in expected.iter().enumerate() {
        let got = unwrap_result(agent, &results[i]);
        same_text(agent, &as_printed(&got), want, &format!("call {i} ({agent})"));
    }
    // The artifact the notice names, read back through the agent's own resource tool.
    assert!(expected[3].contains("Full: artifact://0]"), "{}", expected[3]);
    let full: String = (1..=30000).map(|i| format!("{i}\n")).collect();
    resource_read_is(agent, &results[4], &full);
}

/// Ctrl-C (SIGINT to the agent's process group) while a call runs: the agent ends and nothing
/// it started (its MCP server, the session's bash, the command) outlives it.
async fn interrupt_leaves_no_process(agent: &str) {
    let work = tempfile::tempdir().unwrap();
    let tree = format!("AGENT_BASH_AGENT_TREE={}-{agent}", std::process::id());
    let cmd_mark = format!("AGENT_BASH_AGENT_CMD={}-{agent}", std::process::id());
    let (tree_key, tree_val) = tree.split_once('=').unwrap();
    let spec = json!({
        "steps": [{"bash": {"command": format!("echo waiting; env {cmd_mark} sleep 300")}}],
        "env": {tree_key: tree_val},
        "cancel_after": 1,
        "cancel_mark": cmd_mark,
    });
    let run = drive(agent, work.path(), spec).await;
    assert!(run["cancelled_at"].is_number(), "{}", run["agent"]);
    assert_eq!(run["agent"]["killed"], false, "the agent ignored Ctrl-C: {}", run["agent"]);
    assert!(
        eventually(Duration::from_secs(15), || procs_with_env(&tree).is_empty()
            && procs_with_env(&cmd_mark).is_empty())
        .await,
        "left running after the agent was interrupted: {:?} {:?}",
        procs_with_env(&tree),
        procs_with_env(&cmd_mark)
    );
}

#[tokio::test]
async fn agents_claude_code_model_reads_our_text() {
    model_reads_our_text("claude").await;
}

#[tokio::test]
async fn agents_claude_code_interrupt_leaves_no_process() {
    interrupt_leaves_no_process("claude").await;
}

#[tokio::test]
async fn agents_codex_model_reads_our_text() {
    model_reads_our_text("codex").await;
}

#[tokio::test]
async fn agents_codex_interrupt_leaves_no_process() {
    interrupt_leaves_no_process("codex").await;
}

#[tokio::test]
async fn agents_gemini_cli_model_reads_our_text() {
    model_reads_our_text("gemini").await;
}

#[tokio::test]
async fn agents_gemini_cli_interrupt_leaves_no_process() {
    interrupt_leaves_no_process("gemini").await;
}
