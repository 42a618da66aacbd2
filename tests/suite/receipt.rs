//! The resource receipt (contract §7) of a real command: ~2 s of CPU and ~200 MiB resident, on every
//! path that measures it: a pipe run with the shell session's cgroup v2 (`cpu.stat`), a pipe run
//! on the fallback (`/proc` of the shell), and a PTY run (the shell's `wait4` rusage).

use serde_json::{json, Value};

use super::faults::{start, tracking_used, Tracking};
use super::support::Rpc;

/// 200 MiB of bytes, written (so resident), then a busy loop until the process has used 2 s of
/// CPU in all.
const STRESS: &str =
    "import time\nb = b'x' * (200 << 20)\nwhile time.process_time() < 2.0:\n    pass\n";

async fn assert_stress_receipt(rpc: &mut Rpc, pty: bool) -> Value {
    let cmd = format!("python3 -c {}", shell_quote(STRESS));
    let r = rpc.tool(json!({"command": cmd, "pty": pty})).await;
    assert_eq!(r["exitCode"], 0, "{r}");
    let res = &r["resources"];
    let cpu = res["cpuUserMs"].as_u64().unwrap() + res["cpuSysMs"].as_u64().unwrap();
    let rss_mib = res["maxRssKib"].as_u64().unwrap() as f64 / 1024.0;
    assert!((1800..=2200).contains(&cpu), "cpu {cpu} ms: {res}");
    assert!((180.0..=230.0).contains(&rss_mib), "peak {rss_mib:.1} MiB: {res}");
    assert!(res["wallMs"].as_u64().unwrap() >= cpu / 2, "{res}");
    // Not expensive: no note in the model text.
    assert!(!r["output"].as_str().unwrap().contains("[Used"), "{r}");

    // A builtin: CPU known (near zero).
    let r = rpc.tool(json!({"command": "true", "pty": pty})).await;
    assert!(r["resources"]["cpuUserMs"].as_u64().unwrap() < 100, "{r}");
    r
}

#[tokio::test]
async fn receipt_reports_cpu_and_peak_memory_within_ten_percent() {
    let mut rpc = start(Tracking::Auto, None).await;
    assert_stress_receipt(&mut rpc, false).await;
    println!("tracking: {}", tracking_used(&rpc, Tracking::Auto));
}

#[tokio::test]
async fn receipt_reports_cpu_and_peak_memory_within_ten_percent_fallback() {
    let mut rpc = start(Tracking::Fallback, None).await;
    assert_stress_receipt(&mut rpc, false).await;
    println!("tracking: {}", tracking_used(&rpc, Tracking::Fallback));
}

#[tokio::test]
async fn receipt_reports_cpu_and_peak_memory_within_ten_percent_pty() {
    let mut rpc = start(Tracking::Auto, None).await;
    assert_stress_receipt(&mut rpc, true).await;
}

/// With a cgroup of its own, the session's receipt counts a process the shell never waits for:
/// one that left with `setsid` and burns 1 s of CPU while the command waits for its mark.
#[tokio::test]
async fn receipt_counts_a_process_that_left_the_shell_with_cgroups() {
    let mut rpc = start(Tracking::Auto, None).await;
    let dir = tempfile::tempdir().unwrap();
    let done = dir.path().join("done");
    let busy = format!(
        "import time\nwhile time.process_time() < 1.0:\n    pass\nopen({:?}, 'w').close()\n",
        done.to_str().unwrap()
    );
    let cmd = format!(
        "setsid -f python3 -c {}; while [ ! -e {} ]; do sleep 0.05; done; sleep 0.2",
        shell_quote(&busy),
        done.display()
    );
    let r = rpc.tool(json!({"command": cmd})).await;
    assert_eq!(r["exitCode"], 0, "{r}");
    let res = &r["resources"];
    let cpu = res["cpuUserMs"].as_u64().unwrap() + res["cpuSysMs"].as_u64().unwrap();
    let tracking = tracking_used(&rpc, Tracking::Auto);
    if tracking.starts_with("fallback") {
        // The shell's `/proc` counters hold only the children it waited for.
        assert!(cpu < 500, "cpu {cpu} ms on the fallback: {res}");
    } else {
        assert!((1000..=1300).contains(&cpu), "cpu {cpu} ms with {tracking}: {res}");
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}
