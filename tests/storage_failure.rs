//! Storage failures (a failing disk: writes that fail with an I/O error), against the real
//! binary, through test knobs that make the writes fail:
//! * the ingress WAL of shard 0 (`NARAD_TEST_WAL_FAIL_AFTER_BATCHES`; SEMANTICS.md §3.4, API.md
//!   §10.1): the node, every shard of it, answers every produce `500 produce failed` from then
//!   on until a restart, with `narad_ingress_wal_failed` 1, while consumes and readiness are
//!   unaffected; after a restart everything answered `202` is delivered;
//! * the metadata Raft log (`NARAD_TEST_RAFT_LOG_FAIL_AFTER`; API.md §15.2): `/readyz` is `200`
//!   only while the node has a Raft leader in view; a group that stopped has none, so every
//!   shard answers `503` with the reason, while the data plane (produce, consume) goes on and
//!   topic changes are refused with a clear `503`.

mod common;

use std::time::{Duration, Instant};

use std::collections::HashSet;

use common::{drain, try_produce_one, Client, Server, TempDir};

/// Longest the test waits for every shard to report the stopped group.
const NOT_READY_WITHIN: Duration = Duration::from_secs(10);

#[test]
fn a_stopped_metadata_group_makes_the_node_unready_on_every_shard() {
    let dir = TempDir::new("metastore-failure");
    // Start-up writes a few entries (the leader's first one, its committed id); the first topic
    // create below writes more. 50 writes leave room for both and fail soon after.
    let s = Server::start_env(
        dir.0.join("data"),
        &[("NARAD_TEST_RAFT_LOG_FAIL_AFTER", "50")],
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

/// Most produces the WAL test sends before both shards' WALs have failed.
const PRODUCES_MAX: usize = 2_000;
/// Connections the WAL test produces over (round-robin).
const CONNECTIONS: usize = 8;
/// Produces in a round that must all be refused: every connection several times.
const REFUSED_IN_A_ROW: usize = 4 * CONNECTIONS;
/// How long after the first refusal a connection to the healthy shard may still get a 202 (the
/// other shards learn of the failure in the background).
const REFUSED_EVERYWHERE_WITHIN: Duration = Duration::from_secs(5);

#[test]
fn a_failed_ingress_wal_refuses_produces_until_restart_and_loses_nothing_accepted() {
    let dir = TempDir::new("wal-failure");
    let mut s = Server::start_env(
        dir.0.join("data"),
        &[("NARAD_TEST_WAL_FAIL_AFTER_BATCHES", "40")],
    );
    let mut c = s.client();
    c.create_topic("t", 4);
    // Several connections, so that both shards accept produces (each connection lands on one):
    // only shard 0's WAL fails, and shard 1 must refuse too.
    let mut clients: Vec<Client> = (0..CONNECTIONS).map(|_| s.client()).collect();

    let mut accepted = HashSet::new();
    let mut n = 0;
    let mut produce = |clients: &mut Vec<Client>, accepted: &mut HashSet<String>| {
        let id = format!("m-{n:05}");
        let c = &mut clients[n % CONNECTIONS];
        n += 1;
        let r = try_produce_one(c, "t", &id).expect("produce");
        match r.status {
            202 => {
                accepted.insert(id);
            }
            500 => assert!(
                r.error().starts_with("produce failed"),
                "the refusal: {}",
                r.text()
            ),
            other => panic!("produce {n}: {other} {}", r.text()),
        }
        r.status
    };
    // Until the first refusal...
    let mut first_refusal = None;
    for _ in 0..PRODUCES_MAX {
        if produce(&mut clients, &mut accepted) == 500 {
            first_refusal = Some(Instant::now());
            break;
        }
    }
    let first_refusal = first_refusal.expect("the injected WAL failure never showed");
    assert!(
        !accepted.is_empty(),
        "nothing was accepted before the failure"
    );
    // ... then, soon, every produce on every connection is refused, and stays so.
    loop {
        let round: Vec<u16> = (0..REFUSED_IN_A_ROW)
            .map(|_| produce(&mut clients, &mut accepted))
            .collect();
        if round.iter().all(|&st| st == 500) {
            break;
        }
        assert!(
            first_refusal.elapsed() < REFUSED_EVERYWHERE_WITHIN,
            "{REFUSED_EVERYWHERE_WITHIN:?} after the first refusal some connections still get \
             202: {round:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for _ in 0..REFUSED_IN_A_ROW {
        assert_eq!(
            produce(&mut clients, &mut accepted),
            500,
            "a produce after the failure"
        );
    }
    let metrics = c.get("/metrics").text();
    assert!(
        metrics.lines().any(|l| l == "narad_ingress_wal_failed 1"),
        "narad_ingress_wal_failed is 1"
    );
    // Consumes and readiness are unaffected.
    assert_eq!(c.get("/readyz").status, 200);
    let r = c.get("/v1/topics/t/consume");
    assert_eq!(r.status, 200, "a consume after the failure: {}", r.text());

    // After a restart (without the fault) produces are accepted again and everything answered
    // 202 before is delivered (some only now: records accepted for the other shard's partitions
    // wait in the accepting shard's WAL for the hand-off the failed owner could not take).
    s.extra_env.clear();
    s.restart();
    let mut c = s.client();
    let r = try_produce_one(&mut c, "t", "after-restart").expect("produce");
    assert_eq!(r.status, 202, "a produce after the restart: {}", r.text());
    let seen = drain(&mut c, "t", |seen| {
        accepted.iter().all(|p| seen.contains_key(p)) && seen.contains_key("after-restart")
    });
    let missing: Vec<&String> = accepted.iter().filter(|p| !seen.contains_key(*p)).collect();
    assert!(
        missing.is_empty(),
        "{} of {} messages answered 202 were not delivered after the restart, e.g. {:?}",
        missing.len(),
        accepted.len(),
        common::sample(missing.iter().copied())
    );
}
