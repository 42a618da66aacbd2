//! The resource receipt (SPEC §7) of a real command: ~2 s of CPU and ~200 MiB resident.

use serde_json::json;

#[tokio::test]
async fn receipt_reports_cpu_and_peak_memory_within_ten_percent() {
    let mut rpc = super::support::Rpc::start().await;
    // 200 MiB of bytes, written (so resident), then a busy loop until the process has used 2 s
    // of CPU in all.
    let script =
        "import time\nb = b'x' * (200 << 20)\nwhile time.process_time() < 2.0:\n    pass\n";
    let cmd = format!("python3 -c {}", shell_quote(script));
    let r = rpc.tool(json!({"command": cmd})).await;
    assert_eq!(r["exitCode"], 0, "{r}");
    let res = &r["resources"];
    let cpu = res["cpuUserMs"].as_u64().unwrap() + res["cpuSysMs"].as_u64().unwrap();
    let rss_mib = res["maxRssKib"].as_u64().unwrap() as f64 / 1024.0;
    assert!((1800..=2200).contains(&cpu), "cpu {cpu} ms: {res}");
    assert!((180.0..=230.0).contains(&rss_mib), "peak {rss_mib:.1} MiB: {res}");
    assert!(res["wallMs"].as_u64().unwrap() >= cpu / 2, "{res}");
    // Not expensive: no note in the model text.
    assert!(!r["output"].as_str().unwrap().contains("[Used"), "{r}");

    // A builtin: CPU known (near zero), nothing to sample.
    let r = rpc.tool(json!({"command": "true"})).await;
    assert!(r["resources"]["cpuUserMs"].as_u64().unwrap() < 100, "{r}");
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}
