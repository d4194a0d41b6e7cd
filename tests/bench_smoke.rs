//! The load generator's W1/W2/W3 workloads against the real broker, with small counts: proves the
//! full flow loses nothing (W3: every produced message consumed and acked, lost = 0). Correctness
//! only; speed lives in bench/run.sh.

mod common;

#[test]
fn w1_w2_w3_smoke_loses_nothing() {
    let dir = common::TempDir::new("smoke");
    let s = common::Server::start(&dir);
    let report = narad_bench::smoke(s.addr()).expect("smoke run");
    assert!(report.problems().is_empty(), "{:?}", report.problems());
}

#[test]
fn narad_bench_with_count_reports_every_message() {
    // Proves `narad bench <topic> --count N --json` (OPERATIONS.md §1.1, the original's flags)
    // reports all N produced messages even when the run ends within the default warm-up, with
    // p50/p95/p99 latencies (OPERATIONS.md §1.3).
    let dir = common::TempDir::new("bench-count");
    let s = common::Server::start(&dir);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_narad"))
        .args([
            "bench",
            "counted",
            "--count",
            "300",
            "--json",
            "--url",
            &format!("http://{}", s.addr()),
        ])
        .output()
        .expect("run narad bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report");
    let run = &v["runs"][0];
    assert_eq!(run["latency"]["count"], 300, "{run}");
    let l = &run["latency"];
    let (p50, p95, p99) = (
        l["p50_us"].as_f64().expect("p50"),
        l["p95_us"].as_f64().expect("p95"),
        l["p99_us"].as_f64().expect("p99"),
    );
    assert!(p50 > 0.0 && p50 <= p95 && p95 <= p99, "{l}");
}
