//! Faults seen from a real Neovim: the editor or the backend dies while commands run; tool calls
//! get no handle on the editor.

use std::time::Duration;

use super::nvim::Editor;
use super::support::{eventually, procs_with_cmdline, unique_sleep};

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

async fn backend_pid(ed: &Editor) -> i32 {
    ed.wait_lua("require('agent_bash.backend').info().pid").await.as_i64().unwrap() as i32
}

/// A tool call's environment has no `NVIM`; a bang command's has the editor's address.
#[tokio::test]
async fn nvim_tool_calls_cannot_reach_the_editor() {
    let ed = Editor::start().await;
    let server = ed.lua("return vim.v.servername").await;
    let server = server.as_str().unwrap().to_string();
    assert!(!server.is_empty());
    ed.tool_call("t", "{command = 'echo \"[${NVIM-}]\"'}").await;
    assert_eq!(ed.tool_result("t", "output").await.as_str(), Some("[]\n"));
    ed.cmd("AgentBash echo \"[${NVIM-}]\"").await;
    let card = ed.card_done().await;
    assert!(card.lines.iter().any(|l| *l == format!("[{server}]")), "{card:?}");
}

/// Neovim is SIGKILLed while a bang command and a tool call run: the backend exits and nothing
/// it started is left.
#[tokio::test]
async fn nvim_sigkilled_editor_leaves_nothing() {
    let ed = Editor::start().await;
    let (a, b, c) = (unique_sleep(), unique_sleep(), unique_sleep());
    ed.cmd(&format!("AgentBash (setsid env -i sleep {a} >/dev/null 2>&1 &); sleep {b}")).await;
    ed.tool_call("t", &format!("{{command = 'sleep {c}'}}")).await;
    for t in [&a, &b, &c] {
        assert!(eventually(Duration::from_secs(10), || !procs_with_cmdline(t).is_empty()).await);
    }
    let backend = backend_pid(&ed).await;
    let nvim = ed.lua("return vim.fn.getpid()").await.as_i64().unwrap() as i32;
    // SAFETY: killing the editor this test started.
    unsafe { libc::kill(nvim, libc::SIGKILL) };
    let ok = eventually(Duration::from_secs(3), || {
        !alive(backend) && [&a, &b, &c].iter().all(|t| procs_with_cmdline(t).is_empty())
    })
    .await;
    assert!(
        ok,
        "backend alive: {}; left: {:?}",
        alive(backend),
        [&a, &b, &c].map(|t| procs_with_cmdline(t))
    );
}

/// The backend is SIGKILLed while a pipe command and a terminal (PTY) command run: one clear
/// message, no old process alive 2 s later, and the next command works.
#[tokio::test]
async fn nvim_backend_sigkill_during_pipe_and_pty_runs() {
    let ed = Editor::start().await;
    let (a, b, c, d) = (unique_sleep(), unique_sleep(), unique_sleep(), unique_sleep());
    ed.lua(&format!(
        "require('agent_bash').run('(setsid env -i sleep {a} >/dev/null 2>&1 &); sleep {b}', {{pty = true}})"
    ))
    .await;
    ed.tool_call(
        "t",
        &format!("{{command = '(setsid env -i sleep {c} >/dev/null 2>&1 &); sleep {d}'}}"),
    )
    .await;
    for t in [&a, &b, &c, &d] {
        assert!(eventually(Duration::from_secs(10), || !procs_with_cmdline(t).is_empty()).await);
    }
    // The fallback's scan window (procs.rs) does not apply here when cgroups exist; with the
    // fallback, a PTY run's orphan is known to the watchdog after one scan (250 ms).
    tokio::time::sleep(Duration::from_millis(600)).await;
    let backend = backend_pid(&ed).await;
    // SAFETY: killing the backend the editor started.
    unsafe { libc::kill(backend, libc::SIGKILL) };
    let ok = eventually(Duration::from_secs(2), || {
        [&a, &b, &c, &d].iter().all(|t| procs_with_cmdline(t).is_empty())
    })
    .await;
    assert!(ok, "left: {:?}", [&a, &b, &c, &d].map(|t| procs_with_cmdline(t)));
    ed.wait_lua("require('agent_bash.backend').info().pid == nil").await;
    // The tool call gets its answer (an error), and the user one message.
    assert_eq!(ed.tool_result("t", "is_error").await, nvim_rs::Value::Boolean(true));
    let msgs = ed.messages().await;
    assert_eq!(msgs.matches("agent-bash: backend exited").count(), 1, "{msgs}");
    ed.tool_call("u", "{command = 'echo again'}").await;
    assert_eq!(ed.tool_result("u", "output").await.as_str(), Some("again\n"));
    assert_eq!(ed.messages().await.matches("agent-bash: backend exited").count(), 1);
}
