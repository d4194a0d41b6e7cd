//! Black-box tests of a 3-node cluster on loopback (CLUSTER.md): metadata written through any
//! node is seen on every node, a killed metadata leader is replaced within seconds, and a node
//! holding another cluster secret is refused and says why.

mod common;

use std::time::{Duration, Instant};

use common::cluster::{Cluster, ADMIN_PASSWORD};
use common::{basic_auth, Client};

/// Polls `f` every 20 ms until it is true or `limit` passes; how long it took.
fn within(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if f() {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn metadata_written_on_any_node_is_seen_on_every_node() {
    // Proves the metadata is one replicated state: a topic created through node 1 (whichever
    // node leads; followers forward) is described on nodes 2 and 3 at once; a user created
    // through node 2 authenticates on nodes 1 and 3; a topic deleted through node 3 is gone
    // everywhere; a create retried after it landed answers 409 on another node; a schema
    // registered through node 2 refuses bad payloads on all three nodes.
    let c = Cluster::start("meta", 3);
    let mut a = c.nodes[0].admin();
    let r = a.post("/v1/topics", r#"{"name":"orders","partitions":3}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    let id = r.json()["id"].as_str().expect("id").to_string();
    // Reads are local (CLUSTER.md §3), but a name a node does not know yet makes it catch up
    // with the leader first: the very next request through another node sees the change.
    for n in &c.nodes[1..] {
        let r = n.admin().get("/v1/topics/orders");
        assert_eq!(r.status, 200, "node {}: {}", n.id, r.text());
        assert_eq!(
            r.json()["id"].as_str(),
            Some(id.as_str()),
            "same incarnation"
        );
    }
    let r = c.nodes[2]
        .admin()
        .post("/v1/topics", r#"{"name":"orders","partitions":3}"#);
    assert_eq!(r.status, 409, "{}", r.text());

    let r = c.nodes[1].admin().post(
        "/v1/users",
        r#"{"username":"alice","password":"alice-password-1","grants":[{"action":"consume","patterns":["*"]}]}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    for n in [&c.nodes[0], &c.nodes[2]] {
        let mut cl = Client::connect(n.addr()).expect("connect");
        let auth = basic_auth("alice", "alice-password-1");
        let r = cl.request("GET", "/v1/topics/orders", &[("Authorization", &auth)], b"");
        assert_eq!(r.status, 200, "alice at once on {}: {}", n.id, r.text());
        let bad = basic_auth("alice", "wrong-password");
        let r = cl.request("GET", "/v1/topics/orders", &[("Authorization", &bad)], b"");
        assert_eq!(r.status, 401, "wrong password on {}", n.id);
    }

    // A schema registered through one node is enforced by every node's produce (the check
    // runs on the receiving node, before anything is accepted).
    let schema =
        r#"{"type":"object","required":["amount"],"properties":{"amount":{"type":"integer"}}}"#;
    let r = c.nodes[1].admin().post(
        "/v1/topics",
        &format!(r#"{{"name":"payments","partitions":3,"schema":{schema}}}"#),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    for n in &c.nodes {
        let mut admin = n.admin();
        let r = admin.post("/v1/topics/payments/produce", r#"{"amount":"ten"}"#);
        assert_eq!(r.status, 400, "refused on {}: {}", n.id, r.text());
        let r = admin.post(
            "/v1/topics/payments/produce/batch",
            r#"{"messages":[{"payload":{"amount":1}},{"payload":{"note":"no amount"}}]}"#,
        );
        assert_eq!(
            r.status,
            400,
            "batch refused whole on {}: {}",
            n.id,
            r.text()
        );
        let r = admin.post("/v1/topics/payments/produce", r#"{"amount":10}"#);
        assert_eq!(r.status, 202, "accepted on {}: {}", n.id, r.text());
    }
    let stored = within(Duration::from_secs(10), || {
        c.nodes[0].admin().get("/v1/topics/payments").json()["partition_stats"]
            .as_array()
            .expect("stats")
            .iter()
            .map(|p| p["high_watermark"].as_u64().unwrap_or(0))
            .sum::<u64>()
            == 3
    });
    assert!(
        stored.is_some(),
        "exactly the three valid messages are stored"
    );

    let r = c.nodes[2].admin().req("DELETE", "/v1/topics/orders", "");
    assert!(
        r.status == 204 || r.status == 200,
        "{} {}",
        r.status,
        r.text()
    );
    for n in &c.nodes[..2] {
        let mut admin = n.admin();
        let lag = within(Duration::from_secs(2), || {
            admin.get("/v1/topics/orders").status == 404
        });
        assert!(lag.is_some(), "node {} still has the deleted topic", n.id);
    }
}

#[test]
fn a_killed_leader_is_replaced_and_writes_resume_within_5_s() {
    // Proves CLUSTER.md §6/§11: with the metadata leader killed (-9), a create through a
    // surviving node succeeds again within 5 s, the survivors stay ready, and the restarted
    // node catches up on what it missed and is ready again.
    let mut c = Cluster::start("leader", 3);
    let leader = within(Duration::from_secs(10), || c.leader().is_some())
        .and_then(|_| c.leader())
        .expect("a leader");
    c.nodes[leader].kill9();
    let other = (leader + 1) % 3;
    let mut admin = c.nodes[other].admin();
    let t0 = Instant::now();
    let mut last = String::new();
    let took = within(Duration::from_secs(10), || {
        let r = admin.post("/v1/topics", r#"{"name":"after-kill","partitions":3}"#);
        last = format!("{} {}", r.status, r.text());
        r.status == 201 || r.status == 409
    });
    let took = took.unwrap_or_else(|| panic!("no write within 10 s: {last}"));
    println!("metadata write after the leader's kill -9: {took:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "writes resumed only after {took:?}"
    );
    let third = (leader + 2) % 3;
    let mut t = c.nodes[third].admin();
    let seen = within(Duration::from_secs(5), || {
        t.get("/v1/topics/after-kill").status == 200
    });
    assert!(seen.is_some(), "the third node applied the create");
    c.start_node(leader);
    c.wait_ready(Duration::from_secs(30));
    let caught_up = within(Duration::from_secs(5), || {
        c.nodes[leader].admin().get("/v1/topics/after-kill").status == 200
    });
    assert!(caught_up.is_some(), "restarted node caught up");
}

#[test]
fn a_node_with_the_wrong_secret_is_refused_and_says_why() {
    // Proves CLUSTER.md §12: the two nodes holding the cluster's secret form a quorum and
    // serve; the third, holding another secret, never joins (not ready), and both sides' logs
    // say the secrets differ.
    let mut c = Cluster::spawn("secret", 3, |i| {
        if i == 2 {
            vec![(
                "NARAD_CLUSTER_SECRET".to_string(),
                "another-secret".to_string(),
            )]
        } else {
            Vec::new()
        }
    });
    let good = within(Duration::from_secs(30), || {
        c.nodes[0].readyz() == 200 && c.nodes[1].readyz() == 200
    });
    assert!(good.is_some(), "the two good nodes are ready");
    let r = c.nodes[0]
        .admin()
        .post("/v1/topics", r#"{"name":"t","partitions":3}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(c.nodes[2].readyz(), 503, "the outsider is not ready");
    let said = within(Duration::from_secs(10), || {
        c.nodes[2].log_text().contains("NARAD_CLUSTER_SECRET")
            && c.nodes[0].log_text().contains("NARAD_CLUSTER_SECRET")
    });
    assert!(
        said.is_some(),
        "both sides say why:\n--- n1\n{}\n--- n3\n{}",
        c.nodes[0].log_text(),
        c.nodes[2].log_text()
    );
    // The outsider's own admin password never took: it has no users of the cluster.
    let mut cl = Client::connect(c.nodes[2].addr()).expect("connect");
    let auth = basic_auth("admin", ADMIN_PASSWORD);
    let r = cl.request("GET", "/v1/topics/t", &[("Authorization", &auth)], b"");
    assert_ne!(
        r.status, 200,
        "the outsider does not serve the cluster's topic"
    );
    c.nodes[2].kill9();
}

/// The owner node of each partition of `topic`, from a describe.
fn owners(admin: &mut common::cluster::Admin, topic: &str) -> Vec<String> {
    admin.get(&format!("/v1/topics/{topic}")).json()["partition_stats"]
        .as_array()
        .expect("stats")
        .iter()
        .map(|p| p["owner_node"].as_str().unwrap_or("").to_string())
        .collect()
}

/// Consumes and acks (on node `i`'s API) until a 204; the payloads taken.
fn drain(c: &Cluster, i: usize, topic: &str) -> Vec<String> {
    let mut admin = c.nodes[i].admin();
    let mut got = Vec::new();
    for _ in 0..10_000 {
        let r = admin.get(&format!("/v1/topics/{topic}/consume?wait=200ms"));
        if r.status == 204 {
            break;
        }
        assert_eq!(r.status, 200, "consume on {}: {}", c.nodes[i].id, r.text());
        let m = r.json();
        let handle = m["receipt_handle"].as_str().expect("handle").to_string();
        got.push(m["payload"].to_string());
        let a = admin.post(
            &format!("/v1/topics/{topic}/ack?receipt_handle={handle}"),
            "",
        );
        assert_eq!(a.status, 204, "ack on {}: {}", c.nodes[i].id, a.text());
    }
    got
}

#[test]
fn produce_on_one_node_consume_and_ack_on_the_others() {
    // Proves CLUSTER.md §4–5 end to end: every produce through node 1 (single) and node 2
    // (batch) is answered 202 and stored by its partition's owner (each node owns one of the
    // three partitions); a queue consumer on node 2 alone, taking its own partition first and
    // then probing the other owners, receives every message exactly once and acks each (acks of
    // other nodes' partitions forwarded to their owner); a pinned consume on a non-owner is
    // forwarded to the owner, and its ack through a third node reaches the owner too.
    let c = Cluster::start("produce", 3);
    let mut a = c.nodes[0].admin();
    let r = a.post("/v1/topics", r#"{"name":"jobs","partitions":3}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    let owners = owners(&mut a, "jobs");
    let mut sorted = owners.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        ["n1", "n2", "n3"],
        "one partition per node: {owners:?}"
    );
    let mut want = std::collections::BTreeSet::new();
    for i in 0..60 {
        let r = a.post("/v1/topics/jobs/produce", &format!(r#"{{"n":{i}}}"#));
        assert_eq!(r.status, 202, "{}", r.text());
        want.insert(format!(r#"{{"n":{i}}}"#));
    }
    let batch: Vec<String> = (60..120)
        .map(|i| format!(r#"{{"payload":{{"n":{i}}}}}"#))
        .collect();
    let r = c.nodes[1].admin().post(
        "/v1/topics/jobs/produce/batch",
        &format!(r#"{{"messages":[{}]}}"#, batch.join(",")),
    );
    assert_eq!(r.status, 202, "{}", r.text());
    want.extend((60..120).map(|i| format!(r#"{{"n":{i}}}"#)));
    // Hand-offs run in the background: wait until the owners hold all 120 (as any node's
    // describe, merged from the owners, says).
    let stored = within(Duration::from_secs(10), || {
        c.nodes[2].admin().get("/v1/topics/jobs").json()["partition_stats"]
            .as_array()
            .expect("stats")
            .iter()
            .map(|p| p["high_watermark"].as_u64().unwrap_or(0))
            .sum::<u64>()
            == 120
    });
    assert!(stored.is_some(), "the owners hold all 120");
    let got = drain(&c, 1, "jobs");
    let got_set: std::collections::BTreeSet<String> = got.iter().cloned().collect();
    assert_eq!(got.len(), got_set.len(), "no duplicates");
    assert_eq!(got_set, want, "node 2 delivered every message");
    assert!(drain(&c, 0, "jobs").is_empty() && drain(&c, 2, "jobs").is_empty());

    // Pinned: a message for the partition node 3 owns, consumed through node 1, acked through
    // node 2.
    let p3 = owners.iter().position(|o| o == "n3").expect("n3 owns one");
    let r = a.post(
        &format!("/v1/topics/jobs/produce?partition={p3}"),
        r#"{"pinned":1}"#,
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let mut got = None;
    within(Duration::from_secs(5), || {
        let r = a.get(&format!(
            "/v1/topics/jobs/consume?partition={p3}&wait=200ms"
        ));
        if r.status == 200 {
            got = Some(r.json());
        }
        got.is_some()
    });
    let m = got.expect("pinned consume forwarded to the owner");
    assert_eq!(m["payload"]["pinned"], 1);
    assert_eq!(m["partition"].as_u64(), Some(p3 as u64));
    let handle = m["receipt_handle"].as_str().expect("handle").to_string();
    let r = c.nodes[1]
        .admin()
        .post(&format!("/v1/topics/jobs/ack?receipt_handle={handle}"), "");
    assert_eq!(r.status, 204, "ack forwarded to the owner: {}", r.text());
    let r = c.nodes[2]
        .admin()
        .post(&format!("/v1/topics/jobs/ack?receipt_handle={handle}"), "");
    assert_eq!(r.status, 410, "acked once: {}", r.text());

    // The cluster series of OPERATIONS.md §9.6 count what happened: node 1 handed records to
    // the other owners (commit_batch) and forwarded the pinned consume (partition_op), every
    // one answered; its heartbeats reach the leader.
    let doc = a.get("/metrics").text();
    let sample = |name: &str, labels: &str| -> f64 {
        let head = if labels.is_empty() {
            format!("{name} ")
        } else {
            format!("{name}{{{labels}}} ")
        };
        doc.lines()
            .find_map(|l| l.strip_prefix(&head))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {head} in /metrics"))
    };
    assert!(
        sample(
            "narad_cluster_rpc_requests_total",
            r#"op="commit_batch",outcome="ok""#
        ) >= 1.0
    );
    assert!(
        sample(
            "narad_cluster_rpc_requests_total",
            r#"op="partition_op",outcome="ok""#
        ) >= 1.0
    );
    assert_eq!(
        sample(
            "narad_cluster_rpc_requests_total",
            r#"op="commit_batch",outcome="failed""#
        ),
        0.0
    );
    assert!(
        sample(
            "narad_cluster_rpc_request_seconds_count",
            r#"op="commit_batch""#
        ) >= 1.0,
        "durations recorded"
    );
    // Failures in a row: a heartbeat can fail once on a loaded machine (an election, a slow
    // forward); the next one recorded resets it.
    let reset = within(Duration::from_secs(5), || {
        let doc = a.get("/metrics").text();
        doc.lines()
            .any(|l| l.trim() == "narad_member_heartbeat_failures 0")
    });
    assert!(reset.is_some(), "heartbeats reach the leader");
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    // Read after the reset: the first heartbeats of a start may all have failed (no leader
    // yet), and the series appears with the first one recorded.
    let doc = a.get("/metrics").text();
    let last: f64 = doc
        .lines()
        .find_map(|l| l.strip_prefix("narad_member_heartbeat_last_success_timestamp_seconds "))
        .and_then(|v| v.trim().parse().ok())
        .expect("a heartbeat recorded");
    assert!(
        (now_s - last).abs() < 30.0,
        "a recent heartbeat: {last} vs now {now_s}"
    );
}

#[test]
fn a_long_poll_on_one_node_wakes_for_a_commit_on_another() {
    // Proves CLUSTER.md §5.1's long-poll across owners: a queue consume parked on node 1 with a
    // 10 s wait (the default ceiling) on an empty topic is answered with a message that only node 3 committed (a
    // produce through node 3 pinned to the partition node 3 owns: nothing of it passes node 1)
    // long before its wait ends, instead of only when the wait is over.
    let c = Cluster::start("wake", 3);
    let mut a = c.nodes[0].admin();
    let r = a.post("/v1/topics", r#"{"name":"wake","partitions":3}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    let owners = owners(&mut a, "wake");
    let p3 = owners.iter().position(|o| o == "n3").expect("n3 owns one");
    // Every node knows the topic before the consumer parks (metadata reaches followers async).
    for n in &c.nodes {
        let seen = within(Duration::from_secs(5), || {
            n.admin().get("/v1/topics/wake").status == 200
        });
        assert!(seen.is_some(), "{} knows the topic", n.id);
    }
    let mut consumer = c.nodes[0].admin();
    let parked = std::thread::spawn(move || {
        let t = Instant::now();
        let r = consumer.get("/v1/topics/wake/consume?wait=10s");
        (r.status, r.text(), t.elapsed())
    });
    std::thread::sleep(Duration::from_millis(1500));
    let r = c.nodes[2].admin().post(
        &format!("/v1/topics/wake/produce?partition={p3}"),
        r#"{"woke":1}"#,
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let (status, body, took) = parked.join().expect("consumer thread");
    assert_eq!(status, 200, "the parked consume got the message: {body}");
    assert!(body.contains(r#""woke":1"#), "{body}");
    assert!(
        took < Duration::from_secs(6),
        "answered {took:?} after parking (1.5 s before the produce), long before its 10 s wait"
    );
}

#[test]
fn a_child_is_placed_away_from_its_parent_and_fed_from_every_owner() {
    // Proves CLUSTER.md §8 and §5.4 for a replica child: created with `parent`, each child
    // partition is owned by another node than the parent partition of the same index; every
    // parent message produced through any node reaches the child (copied by the cursor on the
    // parent partition's owner, handed to the child partition's owner) and is consumed once
    // from the child through a third node; the children listing on one node sums the cursors
    // of all three owners: lag 0 and complete once copied (one node's cursors alone cover a
    // third of the parent's partitions).
    let c = Cluster::start("child", 3);
    let mut a = c.nodes[0].admin();
    let r = a.post("/v1/topics", r#"{"name":"orders","partitions":3}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    let r = c.nodes[1].admin().post(
        "/v1/topics",
        r#"{"name":"audit","partitions":3,"parent":"orders"}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let parent = owners(&mut a, "orders");
    let child = owners(&mut a, "audit");
    for p in 0..3 {
        assert!(!parent[p].is_empty() && !child[p].is_empty());
        assert_ne!(
            parent[p], child[p],
            "child partition {p} away from its parent's"
        );
    }
    for n in &c.nodes {
        let seen = within(Duration::from_secs(5), || {
            n.admin().get("/v1/topics/audit").status == 200
        });
        assert!(seen.is_some(), "{} knows the child", n.id);
    }
    let mut want = std::collections::BTreeSet::new();
    for i in 0..30 {
        let r = c.nodes[i % 3]
            .admin()
            .post("/v1/topics/orders/produce", &format!(r#"{{"o":{i}}}"#));
        assert_eq!(r.status, 202, "{}", r.text());
        want.insert(format!(r#"{{"o":{i}}}"#));
    }
    let listing = || c.nodes[0].admin().get("/v1/topics/orders/children").json();
    let caught_up = within(Duration::from_secs(15), || {
        let l = listing();
        l["children"][0]["lag_messages"] == 0
            && l["children"][0]["lag_complete"] == true
            && c.nodes[2].admin().get("/v1/topics/audit").json()["partition_stats"]
                .as_array()
                .expect("stats")
                .iter()
                .map(|p| p["high_watermark"].as_u64().unwrap_or(0))
                .sum::<u64>()
                == 30
    });
    assert!(
        caught_up.is_some(),
        "child fed, listing complete: {}",
        listing()
    );
    let got = drain(&c, 2, "audit");
    let got_set: std::collections::BTreeSet<String> = got.iter().cloned().collect();
    assert_eq!(got.len(), 30, "each parent message once in the child");
    assert_eq!(got_set, want);
}

#[test]
fn a_node_that_missed_compacted_entries_catches_up_from_a_snapshot() {
    // Proves snapshot shipping across processes (CLUSTER.md §3): with snapshots every 20
    // entries and 5 kept behind, node 3 is killed, 30 topics are created (and heartbeats go
    // on) so the leader's log no longer holds what node 3 missed; restarted, node 3 installs
    // the leader's snapshot (its log says so) and serves every topic: a produce through it to
    // the last one is consumed through node 1.
    let c = Cluster::spawn("snap", 3, |_| {
        vec![
            ("NARAD_CLUSTER_RAFT_SNAPSHOT_THRESHOLD".into(), "20".into()),
            ("NARAD_CLUSTER_RAFT_TRAILING_LOGS".into(), "5".into()),
        ]
    });
    let mut c = c;
    c.wait_ready(Duration::from_secs(30));
    let leader = c.leader().expect("a leader");
    let out = (0..3).find(|&i| i != leader).expect("a follower");
    let keep = (0..3).find(|&i| i != leader && i != out).expect("another");
    c.nodes[out].kill9();
    let mut a = c.nodes[leader].admin();
    for i in 0..30 {
        let r = a.post(
            "/v1/topics",
            &format!(r#"{{"name":"snap-{i}","partitions":3}}"#),
        );
        assert_eq!(r.status, 201, "{}", r.text());
    }
    c.start_node(out);
    c.wait_ready(Duration::from_secs(30));
    let installed = within(Duration::from_secs(20), || {
        c.nodes[out]
            .log_text()
            .contains("metadata snapshot installed from the leader")
    });
    assert!(installed.is_some(), "node {out} caught up from a snapshot");
    let mut o = c.nodes[out].admin();
    let known = within(Duration::from_secs(10), || {
        (0..30).all(|i| o.get(&format!("/v1/topics/snap-{i}")).status == 200)
    });
    assert!(
        known.is_some(),
        "every topic is known on the restarted node"
    );
    let r = o.post("/v1/topics/snap-29/produce", r#"{"after":"snapshot"}"#);
    assert_eq!(r.status, 202, "{}", r.text());
    let mut got = None;
    within(Duration::from_secs(10), || {
        let r = c.nodes[keep]
            .admin()
            .get("/v1/topics/snap-29/consume?wait=500ms");
        if r.status == 200 {
            got = Some(r.json());
        }
        got.is_some()
    });
    assert_eq!(got.expect("consumed")["payload"]["after"], "snapshot");
}

#[test]
fn forget_goes_through_the_leader_and_refuses_what_it_must() {
    // Proves API.md §12.6 on a cluster, asked through a follower (forwarded to the leader):
    // the leader cannot be forgotten (400), an id that is no Raft server is 404, a voter that
    // still has a member record is 409 and stays a voter.
    let c = Cluster::start("forget", 3);
    let leader = c.leader().expect("a leader");
    let follower = (0..3).find(|&i| i != leader).expect("a follower");
    let other = (0..3)
        .find(|&i| i != leader && i != follower)
        .expect("another");
    let mut f = c.nodes[follower].admin();
    let lid = c.nodes[leader].id.clone();
    let r = f.post(&format!("/v1/cluster/members/{lid}/forget"), "");
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("is the Raft leader"), "{}", r.text());
    let r = f.post("/v1/cluster/members/nobody/forget", "");
    assert_eq!(r.status, 404, "{}", r.text());
    let oid = c.nodes[other].id.clone();
    // Until its first heartbeat is recorded the voter has no member record yet and the refusal
    // names the voter floor instead; either way nothing is removed.
    let mut last = String::new();
    let named = within(Duration::from_secs(10), || {
        let r = f.post(&format!("/v1/cluster/members/{oid}/forget"), "");
        assert_eq!(r.status, 409, "{}", r.text());
        last = r.text();
        last.contains("member record")
    });
    assert!(named.is_some(), "{last}");
    let members = f.get("/v1/cluster/members").json();
    let row = members["members"]
        .as_array()
        .expect("members")
        .iter()
        .find(|m| m["id"] == oid.as_str())
        .cloned()
        .expect("still listed");
    assert_eq!(row["voter"], true, "still a voter: {row}");
}

#[test]
fn a_cluster_with_tls_on_its_port_works_and_refuses_a_plain_node() {
    // Proves CLUSTER.md §12's TLS: three nodes given the NARAD_CLUSTER_TLS_* files of one CA
    // (security on, the default serve) form a cluster over mutual TLS, and a message produced
    // through one is consumed through another; a fourth node with the secret but no
    // certificates, asking to join, is refused by TLS (never admitted, never ready) and the
    // cluster's logs say so.
    let pki = std::env::temp_dir().join(format!("narad-test-pki-{}", std::process::id()));
    let Some(tls) = common::cluster::test_tls_env(&pki) else {
        return;
    };
    let mut c = Cluster::spawn("tls", 3, |_| tls.clone());
    c.wait_ready(Duration::from_secs(60));
    let mut a = c.nodes[0].admin();
    let r = a.post("/v1/topics", r#"{"name":"sealed","partitions":3}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    let r = a.post("/v1/topics/sealed/produce?partition=1", r#"{"over":"tls"}"#);
    assert_eq!(r.status, 202, "{}", r.text());
    let mut got = None;
    within(Duration::from_secs(10), || {
        let r = c.nodes[2]
            .admin()
            .get("/v1/topics/sealed/consume?partition=1&wait=500ms");
        if r.status == 200 {
            got = Some(r.json());
        }
        got.is_some()
    });
    assert_eq!(got.expect("consumed")["payload"]["over"], "tls");
    // The certificates' expiry is exported (made for 2 days: within a day of now + 2 days).
    let doc = a.get("/metrics").text();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as f64;
    for kind in ["leaf", "ca"] {
        let head = format!("narad_raft_tls_cert_not_after_seconds{{kind=\"{kind}\"}} ");
        let at: f64 = doc
            .lines()
            .find_map(|l| l.strip_prefix(&head))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {head} in /metrics"));
        assert!(
            (at - (now + 2.0 * 86_400.0)).abs() < 86_400.0,
            "{kind}: {at}"
        );
    }
    let plain = c.add_joiner(Vec::new());
    let refused = within(Duration::from_secs(15), || {
        c.nodes[..3]
            .iter()
            .any(|n| n.log_text().contains("cluster connection refused: TLS"))
    });
    assert!(refused.is_some(), "a node without TLS is refused by TLS");
    assert_ne!(
        c.nodes[plain].readyz(),
        200,
        "the plain node is never ready"
    );
    let members = a.get("/v1/cluster/members").json();
    assert!(
        !members.to_string().contains(&c.nodes[plain].id),
        "never admitted: {members}"
    );
    let _ = std::fs::remove_dir_all(pki);
}

#[test]
fn an_owner_killed_keeps_produce_answered_rerouted_and_pinned_work_gets_503() {
    // Proves CLUSTER.md §4.3 and §11's row "one node down": with node 3 killed (-9), produces
    // through node 1 are still answered 202; the records of node 3's partition are rerouted to
    // sibling partitions after its hand-offs keep failing, so every one of them is consumable
    // within seconds while node 3 is down; a pinned consume of node 3's partition answers 503
    // `partition owner is down; retry later` with Retry-After; after node 3 restarts nothing is
    // delivered twice and nothing is missing.
    let mut c = Cluster::start("ownerdown", 3);
    let mut a = c.nodes[0].admin();
    let r = a.post("/v1/topics", r#"{"name":"jobs","partitions":3}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    let owners = owners(&mut a, "jobs");
    let p3 = owners.iter().position(|o| o == "n3").expect("n3 owns one");
    c.nodes[2].kill9();
    let killed = Instant::now();
    let mut want = std::collections::BTreeSet::new();
    for i in 0..30 {
        let r = a.post("/v1/topics/jobs/produce", &format!(r#"{{"late":{i}}}"#));
        assert_eq!(r.status, 202, "produce with an owner down: {}", r.text());
        want.insert(format!(r#"{{"late":{i}}}"#));
    }
    let r = a.get(&format!("/v1/topics/jobs/consume?partition={p3}"));
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(
        r.text().contains("partition owner is down; retry later"),
        "{}",
        r.text()
    );
    assert_eq!(r.header("Retry-After"), Some("1"));
    let mut got = Vec::new();
    let all = within(Duration::from_secs(20), || {
        got.extend(drain(&c, 0, "jobs"));
        got.len() >= want.len()
    });
    println!(
        "all {} produced with the owner down consumable {:?} after its kill",
        want.len(),
        all.map(|_| killed.elapsed())
    );
    assert!(
        all.is_some(),
        "rerouted and consumable: {} of {}",
        got.len(),
        want.len()
    );
    c.start_node(2);
    c.wait_ready(Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(1));
    for i in 0..3 {
        got.extend(drain(&c, i, "jobs"));
    }
    let set: std::collections::BTreeSet<String> = got.iter().cloned().collect();
    assert_eq!(set, want, "every 202 delivered");
    assert_eq!(got.len(), set.len(), "none twice");
}

#[test]
fn members_are_listed_marked_dead_and_revived() {
    // Proves CLUSTER.md §6 and API.md §12.1: every node lists the three members (sorted, one
    // leader, three voters, alive); a member killed (-9) is marked dead by the leader once it
    // missed its heartbeats (shortened here by test settings: heartbeat 300 ms, dead after 2 s),
    // a pinned consume of its partition then answers 503 at once, and its restart makes it alive
    // again.
    let knobs = |_| {
        vec![
            ("NARAD_TEST_HEARTBEAT_MS".to_string(), "300".to_string()),
            ("NARAD_TEST_DEAD_AFTER_MS".to_string(), "2000".to_string()),
        ]
    };
    let mut c = Cluster::spawn("members", 3, knobs);
    c.wait_ready(Duration::from_secs(60));
    let mut a = c.nodes[0].admin();
    let listed = within(Duration::from_secs(10), || {
        let r = a.get("/v1/cluster/members");
        let m = r.json()["members"].as_array().cloned().unwrap_or_default();
        m.len() == 3 && m.iter().filter(|x| x["leader"] == true).count() == 1
    });
    assert!(listed.is_some(), "{}", a.get("/v1/cluster/members").text());
    let r = a.get("/v1/cluster/members");
    let m = r.json()["members"].as_array().cloned().expect("members");
    let ids: Vec<&str> = m.iter().map(|x| x["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["n1", "n2", "n3"]);
    assert!(
        m.iter()
            .all(|x| x["voter"] == true && x["status"] == "alive"),
        "{m:?}"
    );
    let r = a.post("/v1/topics", r#"{"name":"jobs","partitions":3}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    let owners = owners(&mut a, "jobs");
    let p3 = owners.iter().position(|o| o == "n3").expect("n3 owns one");

    c.nodes[2].kill9();
    let dead = within(Duration::from_secs(30), || {
        let r = a.get("/v1/cluster/members");
        r.json()["members"]
            .as_array()
            .is_some_and(|m| m.iter().any(|x| x["id"] == "n3" && x["status"] == "dead"))
    });
    println!("n3 marked dead after {dead:?}");
    assert!(
        dead.is_some(),
        "n3 marked dead: {}",
        a.get("/v1/cluster/members").text()
    );
    let t = Instant::now();
    let r = a.get(&format!("/v1/topics/jobs/consume?partition={p3}"));
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(t.elapsed() < Duration::from_millis(500), "answered at once");
    // Describe answers 200, partial, with a placeholder for the dead owner's partition.
    let d = a.get("/v1/topics/jobs");
    assert_eq!(d.status, 200, "{}", d.text());
    let d = d.json();
    assert_eq!(d["partial"], true, "{d}");
    let ph = &d["partition_stats"][p3];
    assert_eq!(ph["status"], "owner_unavailable", "{d}");
    assert_eq!(ph["owner_liveness"], "dead", "{d}");
    assert_eq!(ph["owner_node"], "n3", "{d}");
    // New topics are placed on the alive members only.
    let r = a.post("/v1/topics", r#"{"name":"later","partitions":4}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    let later = a.get("/v1/topics/later").json();
    assert!(
        later["partition_stats"]
            .as_array()
            .expect("stats")
            .iter()
            .all(|p| p["owner_node"] != "n3"),
        "{later}"
    );

    c.start_node(2);
    c.wait_ready(Duration::from_secs(30));
    let alive = within(Duration::from_secs(10), || {
        let r = a.get("/v1/cluster/members");
        r.json()["members"]
            .as_array()
            .is_some_and(|m| m.iter().all(|x| x["status"] == "alive"))
    });
    assert!(
        alive.is_some(),
        "n3 revived: {}",
        a.get("/v1/cluster/members").text()
    );
}

#[test]
fn a_fourth_node_joins_as_a_non_voter_and_is_promoted() {
    // Proves CLUSTER.md §7: a node outside the peer list (with its advertise address) asks the
    // peers to admit it, is staged as a non-voter, becomes ready, is promoted to voter once
    // caught up (the leader's 12 s wait shortened by a test setting), and then serves: a topic
    // created afterwards places a partition on it, and what is produced there through another
    // node is consumed through it.
    let knobs = |_| {
        vec![
            ("NARAD_TEST_HEARTBEAT_MS".to_string(), "300".to_string()),
            (
                "NARAD_TEST_PROMOTE_AFTER_MS".to_string(),
                "1000".to_string(),
            ),
        ]
    };
    let mut c = Cluster::spawn("join", 3, knobs);
    c.wait_ready(Duration::from_secs(60));
    let mut a = c.nodes[0].admin();
    let r = a.post("/v1/topics", r#"{"name":"before","partitions":3}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    let j = c.add_joiner(vec![(
        "NARAD_TEST_HEARTBEAT_MS".to_string(),
        "300".to_string(),
    )]);
    c.wait_ready(Duration::from_secs(60));
    let voter = within(Duration::from_secs(30), || {
        let r = a.get("/v1/cluster/members");
        r.json()["members"]
            .as_array()
            .is_some_and(|m| m.iter().any(|x| x["id"] == "n4" && x["voter"] == true))
    });
    assert!(
        voter.is_some(),
        "n4 promoted: {}",
        a.get("/v1/cluster/members").text()
    );
    // The joiner has the metadata written before it came.
    let r = c.nodes[j].admin().get("/v1/topics/before");
    assert_eq!(r.status, 200, "{}", r.text());
    let r = a.post("/v1/topics", r#"{"name":"after","partitions":4}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    let owners = owners(&mut a, "after");
    let p4 = owners
        .iter()
        .position(|o| o == "n4")
        .expect("a partition on n4");
    let r = a.post(
        &format!("/v1/topics/after/produce?partition={p4}"),
        r#"{"on":4}"#,
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let mut joiner = c.nodes[j].admin();
    let got = within(Duration::from_secs(10), || {
        joiner
            .get(&format!(
                "/v1/topics/after/consume?partition={p4}&wait=200ms"
            ))
            .status
            == 200
    });
    assert!(got.is_some(), "the joiner serves its partition");
}

#[test]
fn a_gracefully_stopped_leader_hands_over_first() {
    // Proves CLUSTER.md §6 "graceful shutdown transfers leadership first": SIGTERM to the
    // metadata leader moves leadership to another voter at once, so a create through a
    // survivor succeeds well within an election timeout, and the stopped node exits cleanly.
    let mut c = Cluster::start("handover", 3);
    let leader = within(Duration::from_secs(10), || c.leader().is_some())
        .and_then(|_| c.leader())
        .expect("a leader");
    let other = (leader + 1) % 3;
    let mut admin = c.nodes[other].admin();
    assert_eq!(
        admin
            .post("/v1/topics", r#"{"name":"warm","partitions":3}"#)
            .status,
        201
    );
    c.nodes[leader].term();
    let t0 = Instant::now();
    let moved = within(Duration::from_secs(5), || {
        c.leader().is_some_and(|l| l != leader)
    });
    println!("leadership moved {moved:?} after SIGTERM to the leader");
    assert!(moved.is_some(), "another node leads");
    let r = admin.post("/v1/topics", r#"{"name":"after-stop","partitions":3}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    println!(
        "first create after SIGTERM answered after {:?}",
        t0.elapsed()
    );
    let st = c.nodes[leader].wait_exit(Duration::from_secs(30));
    assert!(st.is_some_and(|s| s.success()), "clean exit: {st:?}");
    assert!(
        c.nodes[leader]
            .log_text()
            .contains("leadership handed over"),
        "the stopped leader says it handed over"
    );
}
