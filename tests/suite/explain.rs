//! `agent-bash explain`: normalization and interception as seen from the command line.

// The helpers below are test code too; clippy's test exemption only sees `#[test]` functions.
#![allow(clippy::expect_used)]

use std::process::{Command, Output};

use pretty_assertions::assert_eq;
use serde_json::{json, Value};

fn explain(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agent-bash"))
        .arg("explain")
        .args(args)
        .output()
        .expect("agent-bash runs")
}

fn explain_json(args: &[&str]) -> Value {
    let out = explain(args);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).expect("utf-8 stdout");
    assert_eq!(stdout.lines().count(), 1, "one JSON object on one line: {stdout:?}");
    serde_json::from_str(&stdout).expect("valid JSON")
}

#[test]
fn explain_strips_trailing_head() {
    assert_eq!(
        explain_json(&["--", "ls -la | head -n 50"]),
        json!({
            "command": "ls -la",
            "head": 50,
            "tail": null,
            "rewrites": [{"removed": "| head -n 50", "head": 50}],
            "blocked": false,
            "rule": null,
            "suggested_tool": null,
            "message": null,
        })
    );
}

#[test]
fn explain_reports_both_rewrites_and_explicit_limits() {
    let got = explain_json(&["--tail", "3", "--", "make", "|", "head", "-n", "5", "2>&1"]);
    assert_eq!(got["command"], "make");
    assert_eq!(got["head"], 5);
    assert_eq!(got["tail"], 3);
    assert_eq!(
        got["rewrites"],
        json!([{"removed": "2>&1"}, {"removed": "| head -n 5", "head": 5}])
    );
    // A `2>&1` before the stage is the producer's: it stays (contract §1).
    let got = explain_json(&["--", "make", "2>&1", "|", "head", "-n", "5"]);
    assert_eq!(got["command"], "make 2>&1");
    assert_eq!(got["rewrites"], json!([{"removed": "| head -n 5", "head": 5}]));
}

#[test]
fn explain_blocks_per_simple_command() {
    let got = explain_json(&["--tools", "grep", "--", "cd x && grep -r foo ."]);
    assert_eq!(
        got,
        json!({
            "command": "cd x && grep -r foo .",
            "head": null,
            "tail": null,
            "rewrites": [],
            "blocked": true,
            "rule": 1,
            "suggested_tool": "grep",
            "message": "Blocked: Use the `grep` tool instead of grep/rg. It respects .gitignore and provides structured output.\n\nOriginal command: cd x && grep -r foo .",
        })
    );
}

#[test]
fn explain_blocks_nothing_without_tools() {
    let got = explain_json(&["--", "grep -r foo . | tail -5"]);
    assert_eq!(
        (got["command"].clone(), got["blocked"].clone()),
        (json!("grep -r foo ."), json!(false))
    );
}

#[test]
fn explain_uses_rules_from_a_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("rules.toml");
    std::fs::write(
        &rules,
        "[[rules]]\npattern = '^curl\\s'\nflags = 'i'\ntool = 'fetch'\nmessage = 'Use fetch.'\n",
    )
    .expect("write rules");
    let rules = rules.to_str().expect("utf-8 path");
    let got = explain_json(&["--rules", rules, "--tools", "fetch,grep", "--", "CURL x; grep y"]);
    assert_eq!(got["rule"], 0);
    assert_eq!(got["message"], "Blocked: Use fetch.\n\nOriginal command: CURL x; grep y");
    // The file replaces the defaults: grep is not blocked by it.
    let got = explain_json(&["--rules", rules, "--tools", "grep", "--", "grep y"]);
    assert_eq!(got["blocked"], false);
}

#[test]
fn explain_bad_rules_file_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("rules.json");
    std::fs::write(&rules, r#"{"rules": [{"pattern": "x", "tool": "t"}]}"#).expect("write rules");
    let out = explain(&["--rules", rules.to_str().expect("utf-8 path"), "--", "ls"]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("rules.json: invalid rules: missing field `message`"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let out = explain(&["--rules", "/nonexistent/rules.toml", "--", "ls"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/rules.toml"));
}
