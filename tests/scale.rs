//! Black-box tests of scaling a cluster out and in on loopback (CLUSTER.md §9–10): a node that
//! joins receives its share of the partitions by copy-then-cut-over while produce goes on, a
//! decommission sheds a node's partitions and removes it, and no message answered `202` is lost.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::cluster::{Admin, Cluster, ADMIN_PASSWORD};
use common::{basic_auth, Client};

/// Polls `f` every 50 ms until it is true or `limit` passes; how long it took.
fn within(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if f() {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

fn knobs() -> Vec<(String, String)> {
    vec![
        ("NARAD_TEST_HEARTBEAT_MS".to_string(), "300".to_string()),
        (
            "NARAD_TEST_PROMOTE_AFTER_MS".to_string(),
            "1000".to_string(),
        ),
    ]
}

/// Produces unique messages round-robin through the given API addresses until `stop`, single
/// and batch; the payloads answered 202 and every other answer.
fn producer(
    addrs: Vec<std::net::SocketAddr>,
    topic: &'static str,
    tag: &'static str,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(Vec<String>, Vec<String>)> {
    std::thread::spawn(move || {
        let mut clients: Vec<Admin> = addrs
            .iter()
            .map(|a| Admin {
                client: Client::connect(*a).expect("connect"),
                auth: basic_auth("admin", ADMIN_PASSWORD),
            })
            .collect();
        let (mut ok, mut refused) = (Vec::new(), Vec::new());
        let mut i = 0u64;
        let t0 = Instant::now();
        while !stop.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(120) {
            let k = (i as usize) % clients.len();
            let c = &mut clients[k];
            if i % 5 == 4 {
                let ids: Vec<String> = (0..10).map(|j| format!("{tag}-{i}-{j}")).collect();
                let body = format!(
                    r#"{{"messages":[{}]}}"#,
                    ids.iter()
                        .map(|id| format!(r#"{{"payload":"{id}"}}"#))
                        .collect::<Vec<_>>()
                        .join(",")
                );
                let r = c.post(&format!("/v1/topics/{topic}/produce/batch"), &body);
                if r.status == 202 {
                    ok.extend(ids);
                } else {
                    refused.push(format!("{}: {}", r.status, r.text()));
                }
            } else {
                let id = format!("{tag}-{i}");
                let r = c.post(
                    &format!("/v1/topics/{topic}/produce"),
                    &format!(r#""{id}""#),
                );
                if r.status == 202 {
                    ok.push(id);
                } else {
                    refused.push(format!("{}: {}", r.status, r.text()));
                }
            }
            i += 1;
            std::thread::sleep(Duration::from_millis(5));
        }
        (ok, refused)
    })
}

/// Queue-consumes and acks through node `i` until `want` are all seen or `limit` passes.
fn drain_until(c: &Cluster, i: usize, topic: &str, want: &BTreeSet<String>) -> BTreeSet<String> {
    let mut admin = c.nodes[i].admin();
    let mut got = BTreeSet::new();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(60) && !want.is_subset(&got) {
        let r = admin.get(&format!("/v1/topics/{topic}/consume?wait=200ms"));
        if r.status == 204 {
            continue;
        }
        assert_eq!(r.status, 200, "consume: {}", r.text());
        let m = r.json();
        let p = &m["payload"];
        let id = p.as_str().or_else(|| p["id"].as_str()).unwrap_or("");
        got.insert(id.to_string());
        let h = m["receipt_handle"].as_str().expect("handle");
        let a = admin.post(&format!("/v1/topics/{topic}/ack?receipt_handle={h}"), "");
        assert!(a.status == 204 || a.status == 410, "ack: {}", a.text());
    }
    got
}

fn members(a: &mut common::cluster::Admin) -> serde_json::Value {
    a.get("/v1/cluster/members").json()
}

fn owned(a: &mut common::cluster::Admin, id: &str) -> Option<u64> {
    members(a)["members"]
        .as_array()?
        .iter()
        .find(|m| m["id"] == id)
        .and_then(|m| m["owned_partitions"].as_u64())
}

fn moves_in_flight(a: &mut common::cluster::Admin) -> usize {
    a.get("/v1/cluster/moves").json()["moves"]
        .as_array()
        .map_or(usize::MAX, Vec::len)
}

#[test]
fn a_joined_node_takes_its_share_under_load_and_a_decommission_sheds_it() {
    // Proves CLUSTER.md §9–10 end to end on 4 processes: 8 partitions on 3 nodes (3/3/2); a 4th
    // node joins while producers write through every node: the planner moves 2 partitions to it
    // (copy, freeze, flip), every produce is answered 202 throughout, and the moved partitions
    // are consumed from their new owner. Then the 4th node is decommissioned under load: it
    // refuses client produce (503), sheds its partitions, leaves the Raft configuration and
    // the member list. Every message answered 202 is consumed afterwards.
    let mut c = Cluster::spawn("scale", 3, |_| knobs());
    c.wait_ready(Duration::from_secs(60));
    let mut a = c.nodes[0].admin();
    let r = a.post(
        "/v1/topics",
        r#"{"name":"jobs","partitions":8,"visibility_timeout_ms":300000}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    // Messages leased (not acked) before the moves, one per partition: those of a partition
    // that moves must come back from its new owner at once, not after the 5 min visibility.
    for p in 0..8 {
        let r = a.post(
            &format!("/v1/topics/jobs/produce?partition={p}"),
            &format!(r#""leased-{p}""#),
        );
        assert_eq!(r.status, 202, "{}", r.text());
    }
    let mut leased: Vec<(u64, String)> = Vec::new();
    for p in 0..8 {
        let r = a.get(&format!("/v1/topics/jobs/consume?partition={p}&wait=2s"));
        assert_eq!(r.status, 200, "{}", r.text());
        let m = r.json();
        leased.push((
            m["partition"].as_u64().expect("partition"),
            m["receipt_handle"].as_str().expect("handle").to_string(),
        ));
    }
    let leased_at = Instant::now();

    let stop = Arc::new(AtomicBool::new(false));
    let addrs: Vec<_> = c.nodes.iter().map(|n| n.addr()).collect();
    let p1 = producer(addrs.clone(), "jobs", "out", stop.clone());
    std::thread::sleep(Duration::from_millis(500));
    let j = c.add_joiner(knobs());
    c.wait_ready(Duration::from_secs(60));
    let balanced = within(Duration::from_secs(90), || {
        owned(&mut a, "n4") == Some(2) && moves_in_flight(&mut a) == 0
    });
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let (ok1, refused1) = p1.join().expect("producer");
    assert!(
        balanced.is_some(),
        "n4 got its share: {}\nmoves: {}\n{}",
        members(&mut a),
        a.get("/v1/cluster/moves?detail=true").text(),
        c.nodes[j].log_text()
    );
    assert!(
        refused1.is_empty(),
        "every produce answered 202: {refused1:?}"
    );
    assert!(ok1.len() > 50, "load ran: {}", ok1.len());
    // Leases on partitions that stayed are acked; those on the two that moved are gone with
    // the old owner (an ack there finds no lease) and their messages are delivered again.
    let stats = a.get("/v1/topics/jobs").json();
    let moved: Vec<u64> = stats["partition_stats"]
        .as_array()
        .expect("stats")
        .iter()
        .enumerate()
        .filter(|(_, p)| p["owner_node"] == "n4")
        .map(|(i, _)| i as u64)
        .collect();
    assert_eq!(moved.len(), 2, "{stats}");
    for (p, h) in &leased {
        if !moved.contains(p) {
            let r = a.post(&format!("/v1/topics/jobs/ack?receipt_handle={h}"), "");
            assert_eq!(r.status, 204, "{}", r.text());
        }
    }
    let mut again = BTreeSet::new();
    let mut admin = c.nodes[1].admin();
    within(Duration::from_secs(20), || {
        for p in &moved {
            let r = admin.get(&format!("/v1/topics/jobs/consume?partition={p}&wait=100ms"));
            if r.status == 200 {
                let m = r.json();
                let payload = m["payload"].as_str().unwrap_or("").to_string();
                let h = m["receipt_handle"].as_str().expect("handle").to_string();
                admin.post(&format!("/v1/topics/jobs/ack?receipt_handle={h}"), "");
                if payload.starts_with("leased-") {
                    again.insert(payload);
                }
            }
        }
        again.len() == moved.len()
    });
    assert_eq!(
        again.len(),
        moved.len(),
        "the new owner redelivered the leased messages of the moved partitions: {again:?}"
    );
    assert!(
        leased_at.elapsed() < Duration::from_secs(120),
        "well before the 5 min visibility timeout"
    );
    eprintln!(
        "scale out: balanced after {balanced:?}, {} messages accepted meanwhile",
        ok1.len()
    );
    let doc = c.nodes[j].admin().get("/metrics").text();
    assert!(
        doc.lines().any(|l| l
            .strip_prefix("narad_moves_total{outcome=\"completed\"} ")
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|n| n >= 2)),
        "n4 counts its finished moves"
    );
    let log = c.nodes[j].log_text();
    assert!(
        log.matches("partition move ended").count() >= 2 && log.contains("outcome=flipped"),
        "n4 ran the moves: {log}"
    );

    // Scale in: decommission n4 under load through the three others.
    let stop = Arc::new(AtomicBool::new(false));
    let p2 = producer(addrs[..3].to_vec(), "jobs", "in", stop.clone());
    // Through the CLI, as an operator would.
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_narad"))
            .args(args)
            .env("NARAD_ADDR", format!("http://{}", c.nodes[0].addr()))
            .env("NARAD_USER", "admin")
            .env("NARAD_PASS", ADMIN_PASSWORD)
            .output()
            .expect("run the CLI");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, out) = cli(&["cluster", "decommission", "n4", "--dry-run"]);
    assert!(ok, "{out}");
    assert!(out.contains("\"would_decommission\": true"), "{out}");
    let (ok, out) = cli(&["cluster", "moves"]);
    assert!(ok && out.contains("\"moves\""), "{out}");
    let (ok, out) = cli(&["cluster", "decommission", "n4"]);
    assert!(ok, "{out}");
    let refused = within(Duration::from_secs(10), || {
        c.nodes[j]
            .admin()
            .post("/v1/topics/jobs/produce", r#""to-a-draining-node""#)
            .status
            == 503
    });
    assert!(refused.is_some(), "a draining node refuses client produce");
    let gone = within(Duration::from_secs(90), || {
        members(&mut a)["members"]
            .as_array()
            .is_some_and(|m| m.len() == 3 && m.iter().all(|x| x["id"] != "n4"))
    });
    stop.store(true, Ordering::Relaxed);
    let (ok2, refused2) = p2.join().expect("producer");
    assert!(
        gone.is_some(),
        "n4 removed: {}\n{}",
        members(&mut a),
        c.nodes[j].log_text()
    );
    assert!(
        refused2.is_empty(),
        "every produce answered 202: {refused2:?}"
    );
    eprintln!(
        "scale in: n4 removed after {gone:?}, {} messages accepted meanwhile",
        ok2.len()
    );
    let view = a.get("/metrics").text();
    assert!(
        view.lines().any(|l| l == "narad_raft_voters 3"),
        "n4 left the Raft configuration"
    );
    // Nothing answered 202 is lost: every message is consumed through the remaining nodes.
    let want: BTreeSet<String> = ok1.into_iter().chain(ok2).collect();
    let got = drain_until(&c, 1, "jobs", &want);
    let missing: Vec<_> = want.difference(&got).take(20).collect();
    assert!(
        missing.is_empty(),
        "{} of {} lost, e.g. {missing:?}",
        want.difference(&got).count(),
        want.len()
    );
    eprintln!("{} messages consumed after both", got.len());
    eprintln!(
        "{}",
        c.nodes[j]
            .log_text()
            .lines()
            .filter(|l| l.contains("move") || l.contains("decommission"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    c.nodes[j].kill9();
}

/// Fills `topic` with `batches` batches of 100 messages of about `size` bytes through node 0;
/// the ids answered 202.
fn fill(c: &Cluster, topic: &str, batches: usize, size: usize) -> BTreeSet<String> {
    let mut a = c.nodes[0].admin();
    let mut ids = BTreeSet::new();
    let pad = "x".repeat(size);
    for b in 0..batches {
        let batch: Vec<String> = (0..100).map(|i| format!("fill-{b}-{i}")).collect();
        let body = format!(
            r#"{{"messages":[{}]}}"#,
            batch
                .iter()
                .map(|id| format!(r#"{{"payload":{{"id":"{id}","pad":"{pad}"}}}}"#))
                .collect::<Vec<_>>()
                .join(",")
        );
        let r = a.post(&format!("/v1/topics/{topic}/produce/batch"), &body);
        assert_eq!(r.status, 202, "{}", r.text());
        ids.extend(batch);
    }
    ids
}

/// This node's move workers (from its detailed moves listing): (topic, partition, source,
/// copied bytes).
fn workers(a: &mut common::cluster::Admin) -> Vec<(String, u64, String, u64)> {
    a.get("/v1/cluster/moves?detail=true").json()["moves"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter_map(|x| {
                    let w = x.get("worker")?;
                    Some((
                        w["topic"].as_str()?.to_string(),
                        w["partition"].as_u64()?,
                        w["source"].as_str()?.to_string(),
                        w["copied_bytes"].as_u64()?,
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_move_survives_an_abort_and_its_destination_killed_mid_copy() {
    // Proves CLUSTER.md §9.3 steps 4 and 8 under failure: copies slowed to 256 KiB/s so the
    // test acts mid-copy. One move is aborted (202, its worker stops, the owner does not
    // change); then the destination is killed -9 while copying and restarted: the moves are
    // retried from scratch and complete, and every message is consumed afterwards.
    let slow = || {
        let mut k = knobs();
        k.push((
            "NARAD_TEST_MOVE_RATE_BYTES_PER_S".to_string(),
            "262144".to_string(),
        ));
        k
    };
    let mut c = Cluster::spawn("scalekill", 3, |_| slow());
    c.wait_ready(Duration::from_secs(60));
    let mut a = c.nodes[0].admin();
    let r = a.post("/v1/topics", r#"{"name":"jobs","partitions":8}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    let want = fill(&c, "jobs", 60, 1000);
    let j = c.add_joiner(slow());
    c.wait_ready(Duration::from_secs(60));
    let mut n4 = c.nodes[j].admin();
    let mut copying = Vec::new();
    let started = within(Duration::from_secs(30), || {
        copying = workers(&mut n4);
        copying.iter().any(|w| w.3 > 0)
    });
    assert!(
        started.is_some(),
        "a move copies: {}",
        n4.get("/v1/cluster/moves?detail=true").text()
    );
    let (topic, p, source, _) = copying[0].clone();
    let r = a.post(
        &format!("/v1/cluster/moves/{topic}/{p}/abort?target=n4"),
        "",
    );
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(r.json()["move"]["from"], source.as_str(), "{}", r.text());
    let r = a.post(
        &format!("/v1/cluster/moves/{topic}/{p}/abort?target=nobody"),
        "",
    );
    // A move that no longer targets `nobody` (aborted above, or planned again for n4).
    assert_eq!(r.status, 409, "{}", r.text());
    let aborted = within(Duration::from_secs(20), || {
        let log = c.nodes[j].log_text();
        log.contains("outcome=aborted") || log.contains("attempt abandoned")
    });
    assert!(
        aborted.is_some(),
        "the aborted move's worker stopped: {}",
        c.nodes[j].log_text()
    );
    // The planner plans the partition again; kill the destination mid-copy.
    let again = within(Duration::from_secs(30), || {
        workers(&mut n4).iter().any(|w| w.3 > 0)
    });
    assert!(again.is_some(), "copies resume");
    c.nodes[j].kill9();
    std::thread::sleep(Duration::from_secs(1));
    c.start_node(j);
    c.wait_ready(Duration::from_secs(60));
    let balanced = within(Duration::from_secs(120), || {
        owned(&mut a, "n4") == Some(2) && moves_in_flight(&mut a) == 0
    });
    assert!(
        balanced.is_some(),
        "the moves completed after the restart: {}\n{}",
        a.get("/v1/cluster/moves").text(),
        c.nodes[j].log_text()
    );
    let got = drain_until(&c, 1, "jobs", &want);
    let missing = want.difference(&got).count();
    assert_eq!(missing, 0, "{missing} of {} lost", want.len());
}

#[test]
fn a_dead_source_past_the_force_promote_time_lets_a_complete_copy_take_over() {
    // Proves CLUSTER.md §9.3 step 6: the destination holds a caught-up copy (a test setting
    // holds it before the freeze), the source is killed -9 and marked dead; past the
    // force-promote time (shortened to 3 s) the destination installs its copy and flips without
    // a freeze. Nothing the source had committed and the copy held is lost: with the source
    // restarted (its stale copy reclaimed), every message is consumed.
    let knobs_for = |hold: bool| {
        let mut k = knobs();
        k.push(("NARAD_TEST_DEAD_AFTER_MS".to_string(), "1500".to_string()));
        k.push((
            "NARAD_TEST_FORCE_PROMOTE_MS".to_string(),
            "3000".to_string(),
        ));
        if hold {
            k.push(("NARAD_TEST_MOVE_HOLD_MS".to_string(), "8000".to_string()));
        }
        k
    };
    let mut c = Cluster::spawn("scaleforce", 3, |_| knobs_for(false));
    c.wait_ready(Duration::from_secs(60));
    let mut a = c.nodes[0].admin();
    let r = a.post("/v1/topics", r#"{"name":"jobs","partitions":8}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    let want = fill(&c, "jobs", 8, 100);
    let j = c.add_joiner(knobs_for(true));
    c.wait_ready(Duration::from_secs(60));
    let mut n4 = c.nodes[j].admin();
    let mut copying = Vec::new();
    let started = within(Duration::from_secs(30), || {
        copying = workers(&mut n4);
        !copying.is_empty()
    });
    assert!(started.is_some(), "a move runs");
    // Wait for the catch-up to finish (the hold follows), then kill the source.
    std::thread::sleep(Duration::from_secs(2));
    let source = copying[0].2.clone();
    let s = c
        .nodes
        .iter()
        .position(|n| n.id == source)
        .expect("source node");
    c.nodes[s].kill9();
    // A node that stays up drains at the end.
    let live = (s + 1) % 3;
    let forced = within(Duration::from_secs(60), || {
        c.nodes[j].log_text().contains("outcome=force-promoted")
    });
    assert!(
        forced.is_some(),
        "force-promoted: {}\n{}",
        n4.get("/v1/cluster/moves?detail=true").text(),
        c.nodes[j].log_text()
    );
    let doc = n4.get("/metrics").text();
    assert!(
        doc.contains("narad_moves_total{outcome=\"force_promoted\"} 1"),
        "counted"
    );
    c.start_node(s);
    c.wait_ready(Duration::from_secs(60));
    let reclaimed = within(Duration::from_secs(30), || {
        c.nodes[s]
            .log_text()
            .contains("reclaimed the copy of a partition that moved away")
    });
    assert!(
        reclaimed.is_some(),
        "the restarted source reclaims its stale copy"
    );
    let got = drain_until(&c, live, "jobs", &want);
    let missing = want.difference(&got).count();
    assert_eq!(missing, 0, "{missing} of {} lost", want.len());
}

#[test]
fn decommission_refuses_what_could_never_finish_cancels_and_hands_leadership_over() {
    // Proves CLUSTER.md §10 steps 1, 3, 5 and 6: on 3 voters a decommission is refused up front
    // (409 below_min_voters; the dry run says why); with a 4th node, a decommission can be
    // cancelled (the node takes produce again); and decommissioning the Raft leader hands
    // leadership to another node before it leaves, while the members listing shows what
    // blocks it meanwhile. Nothing answered 202 is lost.
    let mut c = Cluster::spawn("scaledecom", 3, |_| knobs());
    c.wait_ready(Duration::from_secs(60));
    let mut a = c.nodes[0].admin();
    let r = a.post("/v1/topics", r#"{"name":"jobs","partitions":6}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    // Members are listed once their first heartbeat is recorded.
    let listed = within(Duration::from_secs(10), || {
        members(&mut a)["members"]
            .as_array()
            .is_some_and(|m| m.len() == 3)
    });
    assert!(listed.is_some(), "{}", members(&mut a));
    let r = a.post("/v1/cluster/members/n2/decommission", "");
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.text().contains("below_min_voters"), "{}", r.text());
    let dry = a.post("/v1/cluster/members/n2/decommission?dry_run=true", "");
    assert_eq!(dry.status, 200, "{}", dry.text());
    assert_eq!(dry.json()["would_decommission"], false, "{}", dry.text());
    assert_eq!(
        a.post("/v1/cluster/members/nobody/decommission", "").status,
        404
    );
    let mut want = BTreeSet::new();
    for i in 0..60 {
        let r = a.post("/v1/topics/jobs/produce", &format!(r#""m-{i}""#));
        assert_eq!(r.status, 202, "{}", r.text());
        want.insert(format!("m-{i}"));
    }

    let j = c.add_joiner(knobs());
    c.wait_ready(Duration::from_secs(60));
    let four = within(Duration::from_secs(30), || {
        members(&mut a)["members"]
            .as_array()
            .is_some_and(|m| m.iter().filter(|x| x["voter"] == true).count() == 4)
    });
    assert!(four.is_some(), "{}", members(&mut a));
    // Cancel: n4 drains, then takes produce again.
    let r = a.post("/v1/cluster/members/n4/decommission", "");
    assert_eq!(r.status, 204, "{}", r.text());
    let mut n4 = c.nodes[j].admin();
    let draining = within(Duration::from_secs(10), || {
        n4.post("/v1/topics/jobs/produce", r#""refused""#).status == 503
    });
    assert!(draining.is_some());
    // The detailed listing asks every member for its own status; a draining member also says
    // what blocks its decommission (the leader's view; it owns partitions still, or not yet).
    let detail = a.get("/v1/cluster/members?detail=true").json();
    let list = detail["members"].as_array().expect("members");
    assert_eq!(list.len(), 4, "{detail}");
    for m in list {
        let st = &m["node_status"];
        assert_eq!(st["node"], m["id"], "{detail}");
        assert!(st["produce_in_flight"].is_u64(), "{detail}");
        assert!(st["dispatch_backlog"].is_u64(), "{detail}");
        assert!(st["moves"].is_array(), "{detail}");
    }
    let n4v = list.iter().find(|m| m["id"] == "n4").expect("n4");
    assert_eq!(n4v["draining"], true, "{detail}");
    assert_eq!(n4v["node_status"]["draining"], true, "{detail}");
    assert!(n4v["decommission_blocked"].is_array(), "{detail}");
    let r = a.req("DELETE", "/v1/cluster/members/n4/decommission", "");
    assert_eq!(r.status, 204, "{}", r.text());
    let back = within(Duration::from_secs(10), || {
        let r = n4.post("/v1/topics/jobs/produce", r#""after-cancel""#);
        r.status == 202
    });
    assert!(back.is_some(), "n4 takes produce again after the cancel");
    want.insert("after-cancel".to_string());

    // The leader leaves: it sheds its partitions, hands leadership over, and is removed.
    let leader = c.leader().expect("a leader");
    let id = c.nodes[leader].id.clone();
    let other = (0..4).find(|&i| i != leader).expect("another node");
    let mut b = c.nodes[other].admin();
    let r = b.post(&format!("/v1/cluster/members/{id}/decommission"), "");
    assert_eq!(r.status, 204, "{}", r.text());
    let gone = within(Duration::from_secs(90), || {
        members(&mut b)["members"]
            .as_array()
            .is_some_and(|m| m.len() == 3 && m.iter().all(|x| x["id"] != id.as_str()))
    });
    assert!(
        gone.is_some(),
        "{id} removed: {}\n{}",
        members(&mut b),
        c.nodes[leader].log_text()
    );
    let new_leader = c.leader().expect("a new leader");
    assert_ne!(new_leader, leader, "leadership moved away first");
    assert!(
        c.nodes[leader]
            .log_text()
            .contains("metadata leadership handed over"),
        "the leader handed over before leaving"
    );
    let got = drain_until(&c, other, "jobs", &want);
    let missing: Vec<_> = want.difference(&got).collect();
    assert!(missing.is_empty(), "lost: {missing:?}");
    c.nodes[leader].kill9();
}

#[test]
fn a_moved_parent_partition_keeps_feeding_its_child_from_where_it_stood() {
    // Proves that a move carries a parent partition's fan-out cursors (CLUSTER.md §9.3 with
    // SEMANTICS.md §10): 800 messages copied into a replica child, then a 4th node joins and
    // parent partitions move to it; 400 more are produced. The child gets every parent message,
    // and the moved cursors continue where they stood rather than at the attach point (which
    // would copy the moved partitions' first 100 messages again).
    let mut c = Cluster::spawn("scalefan", 3, |_| knobs());
    c.wait_ready(Duration::from_secs(60));
    let mut a = c.nodes[0].admin();
    let r = a.post("/v1/topics", r#"{"name":"zz-orders","partitions":8}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    let r = a.post(
        "/v1/topics",
        r#"{"name":"orders-copy","partitions":8,"parent":"zz-orders"}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let produce = |a: &mut common::cluster::Admin, from: usize, to: usize| {
        for b in (from..to).step_by(100) {
            let body = format!(
                r#"{{"messages":[{}]}}"#,
                (b..b + 100)
                    .map(|i| format!(r#"{{"payload":"m-{i}"}}"#))
                    .collect::<Vec<_>>()
                    .join(",")
            );
            let r = a.post("/v1/topics/zz-orders/produce/batch", &body);
            assert_eq!(r.status, 202, "{}", r.text());
        }
    };
    let child_total = |a: &mut common::cluster::Admin| -> u64 {
        a.get("/v1/topics/orders-copy").json()["partition_stats"]
            .as_array()
            .map_or(0, |s| {
                s.iter()
                    .map(|p| p["high_watermark"].as_u64().unwrap_or(0))
                    .sum()
            })
    };
    produce(&mut a, 0, 800);
    let copied = within(Duration::from_secs(30), || child_total(&mut a) >= 800);
    assert!(
        copied.is_some(),
        "the child caught up: {}",
        child_total(&mut a)
    );
    c.add_joiner(knobs());
    c.wait_ready(Duration::from_secs(60));
    let moved = within(Duration::from_secs(60), || {
        owned(&mut a, "n4").is_some_and(|n| n >= 2) && moves_in_flight(&mut a) == 0
    });
    assert!(moved.is_some(), "{}", members(&mut a));
    // The planner gives up each donor's newest assignments first: parent partitions (the
    // parent's name sorts after the child's).
    let parent = a.get("/v1/topics/zz-orders").json();
    let on_n4 = parent["partition_stats"]
        .as_array()
        .map_or(0, |s| s.iter().filter(|p| p["owner_node"] == "n4").count());
    assert!(on_n4 >= 2, "parent partitions moved: {parent}");
    produce(&mut a, 800, 1200);
    let want: BTreeSet<String> = (0..1200).map(|i| format!("m-{i}")).collect();
    let settled = within(Duration::from_secs(30), || child_total(&mut a) >= 1200);
    assert!(settled.is_some(), "child: {}", child_total(&mut a));
    // Count what the child holds: every parent message, and few copied twice.
    let mut seen = std::collections::BTreeMap::<String, u32>::new();
    let mut admin = c.nodes[1].admin();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(60) {
        let r = admin.get("/v1/topics/orders-copy/consume?wait=300ms");
        if r.status == 204 {
            if want.iter().all(|w| seen.contains_key(w)) {
                break;
            }
            continue;
        }
        assert_eq!(r.status, 200, "{}", r.text());
        let m = r.json();
        *seen
            .entry(m["payload"].as_str().unwrap_or("").to_string())
            .or_default() += 1;
        let h = m["receipt_handle"].as_str().expect("handle");
        admin.post(
            &format!("/v1/topics/orders-copy/ack?receipt_handle={h}"),
            "",
        );
    }
    let missing: Vec<_> = want
        .iter()
        .filter(|w| !seen.contains_key(*w))
        .take(10)
        .collect();
    assert!(missing.is_empty(), "the child misses {missing:?}");
    let twice: u32 = seen.values().map(|n| n - 1).sum();
    assert!(
        twice < 50,
        "{twice} parent messages copied twice: the moved cursors restarted"
    );
}
