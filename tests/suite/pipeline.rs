//! The output pipeline end to end: raw bytes → sanitizer → sink → artifact, and the
//! `agent-bash sanitize` tool over it.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;

use agent_bash::artifacts::ArtifactStore;
use agent_bash::sanitize::{sanitize, Sanitizer};
use agent_bash::sink::{Sink, SinkConfig, SinkOutput};
use proptest::prelude::*;

use super::support::BIN;

fn run(
    chunks: &[&[u8]],
    config: &SinkConfig,
    dir: &std::path::Path,
) -> (SinkOutput, Vec<String>, Option<String>) {
    let store = Arc::new(ArtifactStore::new(dir));
    let mut sink = Sink::new(config.clone(), Some(store.clone()));
    let mut sanitizer = Sanitizer::new();
    let mut windows = Vec::new();
    let mut text = String::new();
    for chunk in chunks {
        text.clear();
        sanitizer.push(chunk, &mut text);
        sink.push(&text);
        windows.push(sink.window().to_string());
    }
    text.clear();
    sanitizer.finish(&mut text);
    sink.push(&text);
    let out = sink.finish();
    let artifact = out.artifact_id.map(|id| std::fs::read_to_string(store.path(id)).unwrap());
    (out, windows, artifact)
}

fn cut<'a>(bytes: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.sort_unstable();
    let mut out = Vec::new();
    let mut last = 0;
    for p in points {
        out.push(&bytes[last..p]);
        last = p;
    }
    out.push(&bytes[last..]);
    out
}

fn noisy() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(b"\x1b[31m".to_vec()),
        Just(b"\x1b[0m".to_vec()),
        Just(b"\x1b]0;title\x07".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"\n".to_vec()),
        Just("é€😀".as_bytes().to_vec()),
        Just(vec![0xff, 0xc3]),
        prop::collection::vec(any::<u8>(), 0..8),
        "[a-z ]{0,12}".prop_map(|s| s.into_bytes()),
    ];
    prop::collection::vec(piece, 0..60).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn pipeline_chunking_never_changes_anything(bytes in noisy(), cuts in prop::collection::vec(any::<usize>(), 0..12), max_bytes in 8usize..64, max_lines in 1usize..6) {
        let config = SinkConfig { max_bytes, max_lines, ..SinkConfig::default() };
        let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (whole, _, whole_art) = run(&[&bytes], &config, d1.path());
        let (chunked, windows, chunked_art) = run(&cut(&bytes, &cuts), &config, d2.path());
        prop_assert_eq!(&whole, &chunked);
        prop_assert_eq!(&whole_art, &chunked_art);
        let full = sanitize(&bytes);
        prop_assert_eq!(whole.total_bytes, full.len() as u64);
        // The artifact holds the full sanitized stream (far below the cap here).
        if let Some(art) = &whole_art {
            prop_assert_eq!(art, &full);
        }
        for w in windows {
            prop_assert!(w.len() <= max_bytes.max(4));
            prop_assert!(w.matches('\n').count() <= max_lines);
        }
    }
}

proptest! {
    // Large inputs: fewer cases.
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn pipeline_default_window_bounds_hold(bytes in prop::collection::vec(any::<u8>(), 0..200_000)) {
        let dir = tempfile::tempdir().unwrap();
        let (out, _, art) = run(&[&bytes], &SinkConfig::default(), dir.path());
        prop_assert!(out.text.len() <= 51200);
        prop_assert!(agent_bash::sink::count_lines(&out.text) <= 2000);
        if let Some(art) = art {
            prop_assert_eq!(art, sanitize(&bytes));
        }
    }
}

#[test]
fn pipeline_sanitize_tool_text_and_json() {
    let run_tool = |args: &[&str], input: &[u8]| {
        let mut child = Command::new(BIN)
            .arg("sanitize")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        child.wait_with_output().unwrap()
    };
    // contract §4.1's example, under our CR rule (see sanitize.rs for the reasoning).
    let o = run_tool(&[], "\x1b[31mred\x1b[0m\ra\0b\tline\ncarriage\r\x01\u{85}".as_bytes());
    assert_eq!(String::from_utf8_lossy(&o.stdout), "ab\tline\ncarriage\n");
    let dir = tempfile::tempdir().unwrap();
    let input: String = (1..=3000).map(|i| format!("{i}\n")).collect();
    let o = run_tool(&["--artifacts", dir.path().to_str().unwrap()], input.as_bytes());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.ends_with(
            "3000\n\n[Showing lines 1001-3000 of 3000 (2000 lines limit). Full: artifact://0]\n"
        ),
        "{}",
        &text[text.len() - 100..]
    );
    assert_eq!(std::fs::read_to_string(dir.path().join("0.bash.log")).unwrap(), input);
    let o = run_tool(&["--json", "--max-lines", "10"], input.as_bytes());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["truncated"], true);
    assert_eq!(v["total_lines"], 3000);
    assert_eq!(v["output_lines"], 10);
    assert_eq!(v["truncation"]["truncated_by"], "lines");
    assert!(v.get("artifact_id").is_none(), "no --artifacts, no artifact");
}
