//! Rescued lines (contract §7) on real logs: tools run at test time (cargo, gcc, make, python,
//! bash) and, for tools this machine lacks, small samples in `tests/corpus/` followed by
//! enough output to push them out of the window. Each test says exactly which lines are rescued
//! and checks their numbers against the artifact's content.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use super::support::BIN;

/// Runs `command` through `agent-bash exec --json` in `cwd`; returns the result and the text
/// of its artifact (empty without one).
fn run(state: &Path, cwd: &Path, command: &str) -> (Value, String) {
    let cfg = state.join("c.toml");
    std::fs::write(&cfg, format!("state_dir = {:?}\n", state.to_str().unwrap())).unwrap();
    let out = Command::new(BIN)
        .arg("--log-file")
        .arg(state.join("log"))
        .arg("exec")
        .arg("--json")
        .arg("--config")
        .arg(&cfg)
        .arg("--cwd")
        .arg(cwd)
        .args(["--", command])
        // Under `make test` these say we are a sub-make: `make[1]: ***` instead of `make: ***`.
        .env_remove("MAKELEVEL")
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .output()
        .unwrap();
    let r: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    let artifact = match r["artifact_id"].as_u64() {
        Some(id) => {
            let sessions = std::fs::read_dir(state.join("sessions")).unwrap();
            let dir = sessions.flatten().next().unwrap().path();
            std::fs::read_to_string(dir.join(format!("{id}.bash.log"))).unwrap()
        }
        None => String::new(),
    };
    (r, artifact)
}

/// Asserts that exactly `want` (texts, in order) were rescued, that each rescued line number
/// points at that very text in the artifact, that the first one is the first occurrence of
/// its text there, and that the model text shows them in the rescue block before the tail.
fn assert_rescued(r: &Value, artifact: &str, want: &[&str]) {
    assert_eq!(r["truncated"], true, "{:.3000}", r["output"].as_str().unwrap_or_default());
    let lines: Vec<&str> = artifact.lines().collect();
    let rescued: Vec<(u64, String)> = r["rescued"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| (x["line"].as_u64().unwrap(), x["text"].as_str().unwrap().to_owned()))
                .collect()
        })
        .unwrap_or_default();
    let texts: Vec<&str> = rescued.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(texts, want, "{:.3000}", r["output"].as_str().unwrap_or_default());
    for (n, text) in &rescued {
        assert_eq!(lines[*n as usize - 1].trim_end(), text, "line {n} of the artifact");
    }
    let shown_start = r["truncation"]["shown_range"]["start"].as_u64().unwrap();
    if let Some((first, text)) = rescued.first() {
        let at = lines.iter().position(|l| l.trim_end() == text).unwrap() as u64 + 1;
        assert_eq!(*first, at, "the first error's line");
        assert!(*first < shown_start, "rescued lines come from the part the window cut off");
        let id = r["artifact_id"].as_u64().unwrap();
        let mut block = format!("[Earlier in the output (artifact://{id} lines):]\n");
        for (n, t) in &rescued {
            block.push_str(&format!("{n}: {t}\n"));
        }
        block.push_str("[\u{2026}]\n\n");
        let output = r["output"].as_str().unwrap();
        assert!(output.starts_with(&block), "{output:.2000}");
    }
}

fn corpus(name: &str) -> String {
    format!("{}/tests/corpus/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn rescue_cargo_error_before_hundreds_of_warnings() {
    let state = tempfile::tempdir().unwrap();
    let krate = tempfile::tempdir().unwrap();
    std::fs::create_dir(krate.path().join("src")).unwrap();
    std::fs::write(
        krate.path().join("Cargo.toml"),
        "[package]\nname = \"broken\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    )
    .unwrap();
    let mut src = String::from("fn main() {\n    let x: i32 = \"text\";\n}\n");
    for i in 0..600 {
        src.push_str(&format!("fn helper_{i}() {{ let unused_{i} = {i}; }}\n"));
    }
    std::fs::write(krate.path().join("src/main.rs"), src).unwrap();
    let target = krate.path().join("target");
    let cmd = format!(
        "CARGO_TARGET_DIR={} cargo build --offline --color never",
        target.to_str().unwrap()
    );
    let (r, artifact) = run(state.path(), krate.path(), &cmd);
    assert_eq!(r["exit_code"], 101, "{}", r["output"]);
    assert_rescued(&r, &artifact, &["error[E0308]: mismatched types", " --> src/main.rs:2:18"]);
}

#[test]
fn rescue_gcc_error_before_many_warnings() {
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut src = String::from("int main(void) {\n    return undeclared_name;\n}\n");
    for i in 0..800 {
        src.push_str(&format!("void helper_{i}(void) {{ int unused_{i} = {i}; }}\n"));
    }
    std::fs::write(dir.path().join("broken.c"), src).unwrap();
    let (r, artifact) =
        run(state.path(), dir.path(), "gcc -Wall -fdiagnostics-color=never -c broken.c");
    assert_eq!(r["exit_code"], 1, "{}", r["output"]);
    assert_rescued(
        &r,
        &artifact,
        &["broken.c:2:12: error: \u{2018}undeclared_name\u{2019} undeclared (first use in this function)"],
    );
}

#[test]
fn rescue_python_unittest_one_failure_among_thousands() {
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut src = String::from("import unittest\n\nclass T(unittest.TestCase):\n");
    for i in 0..3000 {
        let body = if i == 40 { "self.assertEqual(1, 2)" } else { "pass" };
        src.push_str(&format!("    def test_{i:04}(self):\n        {body}\n"));
    }
    src.push_str("\nif __name__ == '__main__':\n    unittest.main(verbosity=2)\n");
    std::fs::write(dir.path().join("test_m.py"), src).unwrap();
    let (r, artifact) = run(state.path(), dir.path(), "python3 test_m.py");
    assert_eq!(r["exit_code"], 1, "{}", r["output"]);
    assert_rescued(&r, &artifact, &["test_0040 (__main__.T.test_0040) ... FAIL"]);
}

#[test]
fn rescue_python_traceback_keeps_last_frame_and_exception() {
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("boom.py"),
        "def inner():\n    raise ValueError('bad input')\n\ndef outer():\n    inner()\n\nouter()\n",
    )
    .unwrap();
    let (r, artifact) = run(state.path(), dir.path(), "python3 boom.py; seq 1 3000");
    let frame = format!("  File \"{}/boom.py\", line 2, in inner", dir.path().to_str().unwrap());
    assert_rescued(&r, &artifact, &[&frame, "ValueError: bad input"]);
}

#[test]
fn rescue_bash_script_with_set_x() {
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("build.sh"),
        "set -x\necho start\nfrobnicate --all\nfor i in $(seq 1 1500); do echo \"step $i\"; done\nexit 1\n",
    )
    .unwrap();
    let (r, artifact) = run(state.path(), dir.path(), "bash build.sh");
    assert_eq!(r["exit_code"], 1);
    assert_rescued(&r, &artifact, &["build.sh: line 3: frobnicate: command not found"]);
}

#[test]
fn rescue_make_keeps_going_after_a_failed_target() {
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("Makefile"),
        "all: broken big\nbroken:\n\t@false\nbig:\n\t@seq 1 3000\n",
    )
    .unwrap();
    let (r, artifact) = run(state.path(), dir.path(), "make -k -j1 all");
    assert_eq!(r["exit_code"], 2, "{}", r["output"]);
    assert_rescued(&r, &artifact, &["make: *** [Makefile:3: broken] Error 1"]);
}

/// Samples of tools this machine lacks, followed by enough lines to leave the window.
#[test]
fn rescue_checked_in_samples() {
    let cases: &[(&str, &[&str])] = &[
        ("go_build.log", &["cart/cart.go:14:9: undefined: itemPrice", "cart/cart.go:27:2: declared and not used: total"]),
        (
            "go_test.log",
            &[
                "    calc_test.go:21: Subtract(5, 3) = 1, want 2",
                "--- FAIL: TestSubtract (0.00s)",
                "FAIL",
                "FAIL\texample.com/calc\t0.004s",
            ],
        ),
        (
            "tsc.log",
            &[
                "src/index.ts(12,7): error TS2322: Type 'string' is not assignable to type 'number'.",
                "src/util/format.ts(3,18): error TS2304: Cannot find name 'Intl2'.",
            ],
        ),
        (
            "tsc_pretty.log",
            &["src/index.ts:12:7 - error TS2322: Type 'string' is not assignable to type 'number'."],
        ),
        ("eslint.log", &["   3:7   error    'unused' is assigned a value but never used  no-unused-vars"]),
        ("jest.log", &["FAIL src/cart.test.js", "  \u{25cf} cart \u{203a} computes the total"]),
        (
            "vitest.log",
            &[
                " FAIL  src/cart.test.ts > cart > computes the total",
                "AssertionError: expected 25 to be 30 // Object.is equality",
            ],
        ),
        (
            "pnpm.log",
            &[
                "packages/core build: src/index.ts(4,1): error TS1128: Declaration or statement expected.",
                " ERR_PNPM_RECURSIVE_RUN_FIRST_FAIL  @acme/core@1.0.0 build: `tsc -p .`",
            ],
        ),
        (
            "npm_legacy.log",
            &[
                "npm ERR! code ELIFECYCLE",
                "npm ERR! errno 1",
                "npm ERR! app@1.0.0 build: `node build.js`",
                "npm ERR! Exit status 1",
            ],
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (name, want) in cases {
        let state = tempfile::tempdir().unwrap();
        let cmd = format!("cat {}; seq 1 3000", corpus(name));
        let (r, artifact) = run(state.path(), dir.path(), &cmd);
        eprintln!("{name}");
        assert_rescued(&r, &artifact, want);
    }
}

/// Clean logs, even long ones full of warnings and words such as `error_handling`, rescue nothing.
#[test]
fn rescue_nothing_from_clean_logs() {
    let dir = tempfile::tempdir().unwrap();
    let mut src = String::from("int main(void) { return 0; }\n");
    for i in 0..800 {
        src.push_str(&format!("void error_helper_{i}(void) {{ int unused_{i} = {i}; }}\n"));
    }
    std::fs::write(dir.path().join("ok.c"), src).unwrap();
    for cmd in [
        "gcc -Wall -fdiagnostics-color=never -c ok.c",
        "for i in $(seq 1 3000); do echo \"test tests::error_handling_$i ... ok\"; done",
        "seq 1 100000",
    ] {
        let state = tempfile::tempdir().unwrap();
        let (r, _) = run(state.path(), dir.path(), cmd);
        assert_eq!(r["truncated"], true, "{cmd}");
        assert_eq!(r.get("rescued"), None, "{cmd}: {:.2000}", r["rescued"]);
        assert!(!r["output"].as_str().unwrap().contains("[Earlier in the output"), "{cmd}");
    }
}

/// When the window still holds the error, nothing is rescued: the model reads it there.
#[test]
fn rescue_nothing_when_the_tail_holds_the_error() {
    let state = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (r, _) = run(state.path(), dir.path(), "seq 1 3000; echo 'error: at the end'");
    assert_eq!(r["truncated"], true);
    assert_eq!(r.get("rescued"), None);
}

/// The rescue block's line numbers resolve through RPC: `artifact://<id>#L<n>` is that line.
#[tokio::test]
async fn rescue_line_numbers_resolve_as_artifact_ranges_over_rpc() {
    use serde_json::json;
    let mut rpc = super::support::Rpc::start().await;
    let r = rpc
        .tool(json!({"command": "echo start; echo 'main.c:1:1: error: early'; seq 1 3000"}))
        .await;
    let id = r["artifactId"].as_u64().unwrap();
    assert_eq!(r["rescued"], json!([{"line": 2, "text": "main.c:1:1: error: early"}]));
    let req = json!({"type": "artifact", "url": format!("artifact://{id}#L2")});
    let got = rpc.send(req).await;
    let res = rpc.response(&got).await;
    assert_eq!(res["data"]["text"], "main.c:1:1: error: early\n", "{res}");
    let req = json!({"type": "artifact", "url": format!("artifact://{id}#L1-3")});
    let got = rpc.send(req).await;
    let res = rpc.response(&got).await;
    assert_eq!(res["data"]["text"], "start\nmain.c:1:1: error: early\n1\n");
    let got = rpc.send(json!({"type": "artifact", "url": "artifact://99#L1"})).await;
    let res = rpc.response(&got).await;
    assert_eq!(res["success"], false);
    assert_eq!(res["error"], format!("Artifact 99 not found. Available: {id}"));
}
