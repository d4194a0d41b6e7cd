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
