//! The metadata group stopping on a storage failure, against the real binary: the Raft log's
//! writes are made to fail with EIO (`NARAD_TEST_RAFT_LOG_FAIL_AFTER`, a failing disk under the
//! metastore). API.md §15.2: `/readyz` is `200` only while the node has a Raft leader in view;
//! a group that stopped has none, so every shard answers `503` with the reason, while the
//! data plane (produce, consume) goes on and topic changes are refused with a clear `503`.

mod common;

use std::time::{Duration, Instant};

use common::{Server, TempDir};

/// Longest the test waits for every shard to report the stopped group.
const NOT_READY_WITHIN: Duration = Duration::from_secs(10);

#[test]
fn a_stopped_metadata_group_makes_the_node_unready_on_every_shard() {
    let dir = TempDir::new("metastore-failure");
    // Start-up writes a few entries (the leader's first one, its committed id); the first topic
    // create below writes more. 50 writes leave room for both and fail soon after.
    let s = Server::start_with(
        dir.0.join("data"),
        vec![(
            "NARAD_TEST_RAFT_LOG_FAIL_AFTER".to_string(),
            "50".to_string(),
        )],
    );
    let mut c = s.client();
    c.create_topic("t", 4);
    let r = c.get("/readyz");
    assert_eq!(r.status, 200, "{}", r.text());

    // Metadata changes until the log fails: a clear 503, never a hang.
    let mut refused = None;
    for i in 0..200 {
        let r = c.patch_json(
            "/v1/topics/t",
            &format!(r#"{{"retention_ms":{}}}"#, 3_600_000 + i),
        );
        if r.status != 200 {
            refused = Some(r);
            break;
        }
    }
    let refused = refused.expect("the injected log failure never showed");
    assert_eq!(refused.status, 503, "{}", refused.text());

    // Every shard (each connection lands on one; 16 connections reach both of 2 with
    // overwhelming likelihood) answers /readyz 503 with the reason, within a bound.
    let start = Instant::now();
    loop {
        let answers: Vec<(u16, String)> = (0..16)
            .map(|_| {
                let mut c = s.client();
                let r = c.get("/readyz");
                (r.status, r.text())
            })
            .collect();
        if answers.iter().all(|(st, _)| *st == 503) {
            assert!(
                answers
                    .iter()
                    .all(|(_, body)| body.contains("no metadata leader")),
                "{answers:?}"
            );
            break;
        }
        assert!(
            start.elapsed() < NOT_READY_WITHIN,
            "still ready {NOT_READY_WITHIN:?} after the metadata group stopped: {answers:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // The data plane goes on: produces are accepted and consumed.
    let r = c.request(
        "POST",
        "/v1/topics/t/produce",
        &[("Content-Type", "application/octet-stream")],
        b"still-flowing",
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let r = c.get("/v1/topics/t/consume?wait=2s");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["payload"], "still-flowing");
    // Liveness is unaffected (API.md §15.1: 200 until shutdown begins).
    assert_eq!(c.get("/healthz").status, 200);
}
