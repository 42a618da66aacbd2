//! `agent-bash rpc` with real shells: the reference's cases and ours.

use std::time::{Duration, Instant};

use serde_json::json;

use super::support::{eventually, procs_with_env, Rpc};

#[tokio::test]
async fn rpc_bash_wire_shape_and_exit_codes() {
    let mut rpc = Rpc::start().await;
    let id = rpc.send(json!({"type": "bash", "command": "echo hi"})).await;
    let r = rpc.response(&id).await;
    assert_eq!(r["command"], "bash");
    assert_eq!(r["success"], true);
    assert_eq!(r["data"]["output"], "hi\n");
    assert_eq!(r["data"]["exitCode"], 0);
    assert_eq!(r["data"]["cancelled"], false);
    assert_eq!(r["data"]["truncated"], false);
    assert!(r["data"].get("artifactId").is_none(), "absent values omitted: {r}");
    let d = rpc.bash("exit 7").await;
    assert_eq!(d["exitCode"], 7);
    assert!(d["output"].as_str().unwrap().ends_with("Command exited with code 7"), "{d}");
    // `exit` threw the shell away: the next command works and says so.
    let d = rpc.bash("echo again").await;
    assert_eq!(d["output"], "again\n");
    assert_eq!(d["shellRestarted"], true);
}

#[tokio::test]
async fn rpc_errors_echo_ids() {
    let mut rpc = Rpc::start().await;
    rpc.send_raw("{not json").await;
    let r = rpc.wait_for(|v| v["command"] == "parse").await;
    assert_eq!(r["success"], false);
    assert!(r["error"].as_str().unwrap().starts_with("Failed to parse command: "), "{r}");
    rpc.send_raw(r#"{"id":"x1","type":"bash","command":}"#).await;
    let r = rpc.wait_for(|v| v["command"] == "parse" && v["id"] == "x1").await;
    assert_eq!(r["success"], false);
    let id = rpc.send(json!({"type": "frobnicate"})).await;
    let r = rpc.response(&id).await;
    assert_eq!(r["error"], "Unknown command: frobnicate");
    assert_eq!(r["success"], false);
    let id =
        rpc.send(json!({"type": "tool_call", "command": "true", "cwd": "/nonexistent/dir"})).await;
    let r = rpc.response(&id).await;
    assert_eq!(r["success"], false);
    assert_eq!(r["error"], "Working directory does not exist: /nonexistent/dir");
    let id = rpc.send(json!({"type": "tool_call", "command": "true", "timeout": "soon"})).await;
    let r = rpc.response(&id).await;
    assert_eq!(r["success"], false, "{r}");
    // Still alive after all of that.
    assert_eq!(rpc.bash("echo ok").await["output"], "ok\n");
}

#[tokio::test]
async fn rpc_state_persists_per_key() {
    let mut rpc = Rpc::start().await;
    rpc.bash("export AB_T=1; f() { echo fn $1; }; alias al='echo aliased'; shopt -s extglob").await;
    let d = rpc.bash("echo $AB_T; f x; al; shopt -q extglob && echo ext").await;
    assert_eq!(d["output"], "1\nfn x\naliased\next\n");
    let d = rpc.bash("if then fi").await;
    assert_eq!(d["exitCode"], 2);
    assert_eq!(rpc.bash("echo $AB_T").await["output"], "1\n");
    // Another key is another shell.
    let d = rpc.tool(json!({"command": "echo \"[$AB_T]\"", "session_key": "other"})).await;
    assert_eq!(d["output"], "[]\n");
    // `exec` must not replace the backend.
    let d = rpc.bash("exec echo hi").await;
    assert_eq!(d["output"], "hi\n");
    assert_eq!(rpc.bash("echo alive").await["output"], "alive\n");
}

#[tokio::test]
async fn rpc_cwd_env_and_invalid_utf8() {
    let mut rpc = Rpc::start_with(Some("[env]\nAB_FROM_SETTINGS = \"yes\"\n")).await;
    let dir = tempfile::tempdir().unwrap();
    let d = rpc.tool(json!({"command": "pwd", "cwd": dir.path()})).await;
    assert_eq!(d["output"], format!("{}\n", dir.path().display()));
    let d = rpc
        .tool(json!({"command": "echo $AB_FROM_SETTINGS $AGENT_BASH $GIT_TERMINAL_PROMPT $PAGER"}))
        .await;
    assert_eq!(d["output"], "yes 1 0 cat\n");
    let d = rpc.tool(json!({"command": "printf 'a\\377b\\n'"})).await;
    assert_eq!(d["output"], "a\u{FFFD}b\n");
}

#[tokio::test]
async fn rpc_streams_updates() {
    let mut rpc = Rpc::start().await;
    let id = rpc
        .send(json!({"type": "tool_call", "command": "for i in $(seq 20); do echo line $i; sleep 0.03; done"}))
        .await;
    let start = rpc.wait_for(|v| v["type"] == "tool_execution_start").await;
    assert_eq!(start["id"], id.as_str());
    let mut updates = 0;
    loop {
        let v = rpc
            .wait_for(|v| v["type"] == "tool_execution_update" || v["type"] == "tool_execution_end")
            .await;
        if v["type"] == "tool_execution_end" {
            break;
        }
        let tail = v["partialResult"]["output"].as_str().unwrap();
        assert!(tail.is_empty() || tail.starts_with("line 1\n"), "{tail:?}");
        updates += 1;
    }
    assert!(updates >= 2, "streamed in {updates} updates");
    let r = rpc.response(&id).await;
    let out = r["data"]["output"].as_str().unwrap();
    assert_eq!(out.lines().count(), 20);
    assert!(out.ends_with("line 20\n"));
}

#[tokio::test]
async fn rpc_background_job_returns() {
    let mut rpc = Rpc::start().await;
    let t = Instant::now();
    let d = rpc.tool(json!({"command": "{ sleep 5; } & echo fg"})).await;
    assert_eq!(d["output"], "fg\n");
    assert!(t.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn rpc_timeout_annotation_and_tree_killed() {
    let mut rpc = Rpc::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m1 = dir.path().join("m1");
    let m2 = dir.path().join("m2");
    let d = rpc.tool(json!({"command": "sleep 10; echo done", "timeout": 0.05})).await;
    assert!(
        d["output"].as_str().unwrap().starts_with("[Command timed out after 1 seconds]"),
        "{d}"
    );
    assert!(!d["output"].as_str().unwrap().contains("done"));
    assert_eq!(d["cancelled"], true);
    assert_eq!(d["timedOut"], true);
    assert!(d.get("exitCode").is_none());
    assert_eq!(d["timeoutClampedFrom"], 0.05);
    let cmd = format!("sleep 2 && echo > {}", m1.display());
    rpc.tool(json!({"command": cmd, "timeout": 1})).await;
    let cmd = format!("{{ sleep 2; echo > {}; }} & sleep 10", m2.display());
    let d = rpc.tool(json!({"command": cmd, "timeout": 1})).await;
    assert_eq!(d["timedOut"], true);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!m1.exists() && !m2.exists());
}

#[tokio::test]
async fn rpc_abort_kills_everything() {
    let mut rpc = Rpc::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m");
    let cmd = format!(
        "export AB_ABORT_T=1; setsid sleep 300 & {{ sleep 2; echo > {}; }} & (trap '' TERM; sleep 300) & echo started; sleep 100",
        m.display()
    );
    let id = rpc.send(json!({"type": "bash", "command": cmd})).await;
    assert!(eventually(Duration::from_secs(5), || procs_with_env("AB_ABORT_T=1").len() >= 3).await);
    let t = Instant::now();
    let aid = rpc.send(json!({"type": "abort_bash"})).await;
    let r = rpc.response(&aid).await;
    assert_eq!(r["success"], true);
    let r = rpc.response(&id).await;
    let out = r["data"]["output"].as_str().unwrap();
    assert!(out.starts_with("[Command cancelled]"), "{out}");
    assert!(out.contains("started"));
    assert_eq!(r["data"]["cancelled"], true);
    // TERM-ignoring child: gone within 1 s of the 500 ms grace.
    assert!(t.elapsed() < Duration::from_millis(1500), "{:?}", t.elapsed());
    assert!(procs_with_env("AB_ABORT_T=1").is_empty());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!m.exists());
}

#[tokio::test]
async fn rpc_output_limits_and_head() {
    let mut rpc = Rpc::start().await;
    let d = rpc.tool(json!({"command": "head -c 100000 /dev/zero | tr '\\0' x"})).await;
    assert_eq!(d["totalBytes"], 100000);
    assert!(d["outputBytes"].as_u64().unwrap() <= 51200);
    assert_eq!(d["truncated"], true);
    // The full output is in the artifact the notice names, private to the user.
    let id = d["artifactId"].as_u64().unwrap();
    assert!(d["output"].as_str().unwrap().ends_with(&format!("Full: artifact://{id}]")));
    let file = rpc.artifacts_dir().join(format!("{id}.bash.log"));
    assert_eq!(std::fs::read(&file).unwrap(), vec![b'x'; 100000]);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(rpc.artifacts_dir()).unwrap().permissions().mode() & 0o777, 0o700);
    let t = Instant::now();
    let d = rpc.tool(json!({"command": "yes | head -n 5"})).await;
    assert_eq!(d["output"], "y\ny\ny\ny\ny\n");
    assert_eq!(d["exitCode"], 0);
    assert!(t.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
async fn rpc_prefix_wraps_every_stage() {
    let mut rpc = Rpc::start_with(Some("prefix = \"nice -n 7\"\n")).await;
    let d = rpc.tool(json!({"command": "nice | cat && nice"})).await;
    assert_eq!(d["output"], "7\n7\n");
}

#[tokio::test]
async fn rpc_concurrent_keys_get_own_output() {
    let mut rpc = Rpc::start().await;
    let mut ids = Vec::new();
    for k in 0..16 {
        let cmd = format!("for i in 1 2 3; do echo key{k}-$i; sleep 0.05; done");
        ids.push(
            rpc.send(json!({"type": "tool_call", "command": cmd, "session_key": format!("k{k}")}))
                .await,
        );
    }
    for (k, id) in ids.iter().enumerate() {
        let r = rpc.response(id).await;
        assert_eq!(r["data"]["output"], format!("key{k}-1\nkey{k}-2\nkey{k}-3\n"));
    }
}

#[tokio::test]
async fn rpc_sigkill_leaves_nothing_behind() {
    let mut rpc = Rpc::start().await;
    let id = rpc.send(json!({"type": "bash", "command": "export AB_KILL_T=1; setsid sleep 300 & sleep 300 & sleep 300"})).await;
    assert!(eventually(Duration::from_secs(5), || procs_with_env("AB_KILL_T=1").len() >= 3).await);
    let _ = id;
    // SAFETY: killing our own child.
    unsafe { libc::kill(rpc.pid(), libc::SIGKILL) };
    assert!(eventually(Duration::from_secs(2), || procs_with_env("AB_KILL_T=1").is_empty()).await);
}

#[tokio::test]
async fn rpc_records_bang_commands_for_context() {
    let mut rpc = Rpc::start_in(tempfile::tempdir().unwrap(), None, &["--session-id", "s1"]).await;
    rpc.bash("echo one").await;
    rpc.bash("echo two; exit 4").await;
    let id = rpc
        .send(json!({"type": "bash", "command": "echo secret", "exclude_from_context": true}))
        .await;
    rpc.response(&id).await;
    let id = rpc.send(json!({"type": "bash", "command": "seq 1 5000"})).await;
    rpc.response(&id).await;
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(rpc.artifacts_dir().join("session.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    assert_eq!(lines.len(), 4);
    for (rec, (cmd, exclude)) in lines.iter().zip([
        ("echo one", false),
        ("echo two; exit 4", false),
        ("echo secret", true),
        ("seq 1 5000", false),
    ]) {
        assert_eq!(rec["role"], "bashExecution");
        assert_eq!(rec["command"], cmd);
        assert_eq!(rec["exclude_from_context"], exclude);
        for field in ["output", "cancelled", "truncated", "meta", "timestamp"] {
            assert!(rec.get(field).is_some(), "{field} in {rec}");
        }
    }
    let id = rpc.send(json!({"type": "get_context"})).await;
    let r = rpc.response(&id).await;
    let msgs = r["data"]["messages"].as_array().unwrap().clone();
    assert_eq!(msgs.len(), 3);
    assert_eq!(msgs[0], json!({"role": "user", "content": "Ran `echo one`\n```\none\n```"}));
    assert_eq!(
        msgs[1]["content"],
        "Ran `echo two; exit 4`\n```\ntwo\n```\n\nCommand exited with code 4"
    );
    let long = msgs[2]["content"].as_str().unwrap();
    assert!(
        long.ends_with("[Showing lines 3001-5000 of 5000 (2000 lines limit). Full: artifact://0]"),
        "{}",
        &long[long.len() - 90..]
    );
    // A restarted backend for the same session keeps the record.
    let state = rpc.stop().await;
    let mut rpc = Rpc::start_in(state, None, &["--session-id", "s1"]).await;
    rpc.bash("echo three").await;
    let id = rpc.send(json!({"type": "get_context"})).await;
    let r = rpc.response(&id).await;
    assert_eq!(r["data"]["messages"].as_array().unwrap().len(), 4);
    let id = rpc.send(json!({"type": "history"})).await;
    let r = rpc.response(&id).await;
    assert_eq!(r["data"]["runs"].as_array().unwrap().len(), 5);
}

#[tokio::test]
async fn rpc_bang_commands_have_their_own_shell() {
    let mut rpc = Rpc::start().await;
    // Both shells up first (the rc snapshot is captured once), so only the waiting is timed.
    rpc.tool(json!({"command": "true"})).await;
    rpc.bash("export AB_BANG_ONLY=1").await;
    let id = rpc.send(json!({"type": "bash", "command": "sleep 2; echo bang"})).await;
    let t = Instant::now();
    let d = rpc.tool(json!({"command": "echo \"[$AB_BANG_ONLY]\""})).await;
    // The agent is not held up by the user's long command, nor sees its exports.
    assert_eq!(d["output"], "[]\n");
    assert!(t.elapsed() < Duration::from_millis(1500), "{:?}", t.elapsed());
    assert_eq!(rpc.response(&id).await["data"]["output"], "bang\n");
}

#[tokio::test]
async fn rpc_quiet_output_still_reaches_the_view() {
    let mut rpc = Rpc::start().await;
    let id = rpc
        .send(
            json!({"type": "tool_call", "command": "echo a; sleep 0.01; echo b; sleep 1; echo c"}),
        )
        .await;
    // An update showing `b` arrives while the command sleeps, not only when `c` comes.
    let v = rpc
        .wait_for(|v| {
            v["type"] == "tool_execution_update"
                && v["partialResult"]["output"].as_str().is_some_and(|o| o.contains('b'))
        })
        .await;
    assert!(!v["partialResult"]["output"].as_str().unwrap().contains('c'), "{v}");
    let r = rpc.response(&id).await;
    assert_eq!(r["data"]["output"], "a\nb\nc\n");
}

#[tokio::test]
async fn rpc_head_close_reports_heads_status() {
    let mut rpc = Rpc::start().await;
    // The producer exits 1 on EPIPE instead of dying of SIGPIPE; `| head` would still say 0.
    // Its `write error` goes to stderr, past the stage: shown, as bash shows it (contract §1).
    let command = "(trap '' PIPE; while echo 1; do :; done; exit 1) | head -n 3";
    let d = rpc.tool(json!({ "command": command })).await;
    let bash = std::process::Command::new("bash")
        .args(["-c", &format!("{{ {command}; }} 2>&1")])
        .output()
        .unwrap();
    assert_eq!(d["output"], String::from_utf8_lossy(&bash.stdout).as_ref());
    assert!(d["output"].as_str().unwrap().starts_with("1\n1\n1\n"), "{d}");
    assert_eq!(d["exitCode"], 0);
}

#[tokio::test]
async fn rpc_isolating_prefix_still_runs_commands() {
    // A prefix that gives the shell its own /tmp and /dev/shm, as a container would: it cannot
    // see the backend's FIFOs (made under one of them, `XDG_RUNTIME_DIR` being cleared), so each
    // command runs in a process of its own.
    if !std::process::Command::new("unshare")
        .args(["-m", "true"])
        .status()
        .is_ok_and(|s| s.success())
    {
        eprintln!("skipped: unshare -m is not permitted here");
        return;
    }
    let prefix = concat!(
        r#"prefix = "unshare -m sh -c 'mount -t tmpfs none /tmp && mount -t tmpfs none /dev/shm && exec \"$0\" \"$@\"'""#,
        "\n"
    );
    let state = tempfile::tempdir().unwrap();
    let mut rpc = Rpc::start_env(state, Some(prefix), &[], &[("XDG_RUNTIME_DIR", "")]).await;
    let d = rpc.tool(json!({"command": "echo inside; ls /tmp | wc -l; exit 3", "cwd": "/"})).await;
    assert_eq!(d["output"], "inside\n0\n\nCommand exited with code 3");
    assert_eq!(d["exitCode"], 3);
    let t = Instant::now();
    let d = rpc.tool(json!({"command": "yes | head -n 2", "cwd": "/"})).await;
    assert_eq!(d["output"], "y\ny\n");
    assert!(t.elapsed() < Duration::from_secs(2));
    let d = rpc.tool(json!({"command": "sleep 10", "cwd": "/", "timeout": 1})).await;
    assert_eq!(d["timedOut"], true);
}

#[tokio::test]
async fn rpc_abort_stops_a_chain_before_its_marker() {
    let mut rpc = Rpc::start().await;
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("marker");
    let id = rpc.send(json!({"type": "bash", "command": format!("export AB_CHAIN_T=1; sleep 2 && echo > {}", m.display())})).await;
    assert!(
        eventually(Duration::from_secs(5), || !procs_with_env("AB_CHAIN_T=1").is_empty()).await
    );
    let aid = rpc.send(json!({"type": "abort_bash"})).await;
    rpc.response(&aid).await;
    assert_eq!(rpc.response(&id).await["data"]["cancelled"], true);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!m.exists());
}

#[tokio::test]
async fn rpc_least_recently_used_session_is_evicted() {
    let mut rpc = Rpc::start_with(Some("[limits]\nmax_sessions = 2\n")).await;
    for key in ["a", "b", "c"] {
        rpc.tool(json!({"command": format!("export AB_KEY={key}"), "session_key": key})).await;
    }
    // Three sessions for a limit of two: `a`, the least recently used, was closed.
    let d = rpc.tool(json!({"command": "echo \"[$AB_KEY]\"", "session_key": "c"})).await;
    assert_eq!(d["output"], "[c]\n");
    let d = rpc.tool(json!({"command": "echo \"[$AB_KEY]\"", "session_key": "a"})).await;
    assert_eq!(d["output"], "[]\n");
    assert_eq!(d["shellRestarted"], true);
}

/// Live session shells of the backend `pid`: its children carrying a shell mark that were not
/// started with `-c` (the rc snapshot capture and one-shot runs are), read from /proc.
fn session_shells(pid: i32) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
        let mut rest = stat.rsplit(')').next().unwrap_or("").split_ascii_whitespace();
        let (state, ppid) = (rest.next(), rest.next().and_then(|p| p.parse::<i32>().ok()));
        if ppid != Some(pid) || matches!(state, Some("Z" | "X") | None) {
            continue;
        }
        let env = std::fs::read(format!("/proc/{child}/environ")).unwrap_or_default();
        let marked = env.split(|b| *b == 0).any(|kv| kv.starts_with(b"AGENT_BASH_OWNER="));
        let argv = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
        if marked && !argv.split(|b| *b == 0).any(|a| a == b"-c") {
            n += 1;
        }
    }
    n
}

#[tokio::test]
async fn rpc_max_sessions_holds_when_forty_keys_start_at_once() {
    const MAX: usize = 6;
    // Receipts off: their per-project lock would reorder which keys get a shell first, and
    // the end of the test relies on k0's shell being the least recently used.
    let cfg = format!("[limits]\nmax_sessions = {MAX}\n[changes]\nenabled = false\n");
    let mut rpc = Rpc::start_with(Some(&cfg)).await;
    let pid = rpc.pid();
    // Counts the live shells from another thread for as long as the calls run.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = std::thread::spawn({
        let done = done.clone();
        move || {
            let mut peak = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(session_shells(pid));
                std::thread::yield_now();
            }
            peak
        }
    });
    let mut ids = Vec::new();
    for i in 0..40 {
        let cmd = format!("export AB_K={i}; sleep 0.2; echo \"key $AB_K\"");
        let req = json!({"type": "tool_call", "command": cmd, "session_key": format!("k{i}")});
        ids.push(rpc.send(req).await);
    }
    let mut waited = 0;
    for (i, id) in ids.iter().enumerate() {
        let r = rpc.response(id).await;
        assert_eq!(r["success"], true, "{r}");
        assert_eq!(r["data"]["output"], format!("key {i}\n"), "{r}");
        waited += r["data"].get("waitedMs").is_some() as usize;
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak = watcher.join().unwrap();
    assert_eq!(peak, MAX, "live shells peaked at {peak} for max_sessions = {MAX}");
    assert!(waited >= 40 - MAX, "only {waited} calls waited for a shell");
    // The limit still holds once everything is idle, and a closed key starts afresh.
    assert!(session_shells(pid) <= MAX);
    let d = rpc.tool(json!({"command": "echo \"[$AB_K]\"", "session_key": "k0"})).await;
    assert_eq!(d["output"], "[]\n");
    assert_eq!(d["shellRestarted"], true);
}

#[tokio::test]
async fn rpc_call_waiting_for_a_session_can_be_cancelled() {
    let mut rpc = Rpc::start_with(Some("[limits]\nmax_sessions = 1\n")).await;
    let busy =
        rpc.send(json!({"type": "tool_call", "command": "sleep 30", "session_key": "a"})).await;
    assert!(eventually(Duration::from_secs(10), || session_shells(rpc.pid()) == 1).await);
    let waiting =
        rpc.send(json!({"type": "tool_call", "command": "echo b", "session_key": "b"})).await;
    let abort = rpc.send(json!({"type": "abort_tool_call", "target": waiting})).await;
    rpc.response(&abort).await;
    let r = rpc.response(&waiting).await;
    assert_eq!(r["data"]["cancelled"], true, "{r}");
    assert_eq!(session_shells(rpc.pid()), 1);
    let abort = rpc.send(json!({"type": "abort_tool_call", "target": busy})).await;
    rpc.response(&abort).await;
    assert_eq!(rpc.response(&busy).await["data"]["cancelled"], true);
    // With the busy shell gone, `b` gets the place.
    let d = rpc.tool(json!({"command": "echo b", "session_key": "b"})).await;
    assert_eq!(d["output"], "b\n");
}
