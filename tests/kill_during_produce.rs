//! Durability across `kill -9` (issue 3): producers send 10,000+ messages (single and batch) while
//! consumers ack part of them; the broker is killed with SIGKILL mid-traffic and restarted on the
//! same data directory. Every message answered `202` must be consumed after the restart unless it
//! was acked before the crash, and no message whose ack was answered is delivered again unless the
//! ack was answered in the last moments before the kill: an ack is answered once its settle record
//! is queued for the next group commit, so only the acks of the unfinished batch can return
//! (DESIGN.md §2.5).

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Client, Server, TempDir};

const PRODUCERS: usize = 4;
const TARGET_ACCEPTED: usize = 10_000;
const RUN_MAX: Duration = Duration::from_secs(60);
/// An ack answered this long before the kill must have been durable: group commits take
/// milliseconds, this leaves room for a loaded debug build on a slow disk.
const UNFINISHED_BATCH_MAX: Duration = Duration::from_secs(1);
/// Traffic runs at least this long before the kill, so most acks are older than the above.
const TRAFFIC_MIN: Duration = Duration::from_millis(2500);

fn consume_batch(c: &mut Client, wait: &str) -> Option<Vec<(String, String)>> {
    let r = c
        .try_request(
            "GET",
            &format!("/v1/topics/d/consume?max=100&wait={wait}"),
            &[("X-Narad-Client", "t")],
            b"",
        )
        .ok()?;
    match r.status {
        204 => Some(Vec::new()),
        200 => Some(
            r.json()["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    (
                        m["payload"].as_str().unwrap().to_string(),
                        m["receipt_handle"].as_str().unwrap().to_string(),
                    )
                })
                .collect(),
        ),
        s => panic!("consume answered {s}: {}", r.text()),
    }
}

fn ack_all(c: &mut Client, handles: &[String]) -> Option<Vec<u64>> {
    let body = serde_json::json!({ "receipt_handles": handles }).to_string();
    let r = c
        .try_request(
            "POST",
            "/v1/topics/d/ack",
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        )
        .ok()?;
    assert_eq!(r.status, 200, "{}", r.text());
    Some(
        r.json()["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["status"].as_u64().unwrap())
            .collect(),
    )
}

#[test]
fn nothing_accepted_is_lost_and_nothing_acked_returns() {
    let dir = TempDir::new("kill");
    let mut s = Server::start(&dir);
    s.client().create_topic("d", 3);
    let accepted = Arc::new(Mutex::new(Vec::<String>::new()));
    let acked = Arc::new(Mutex::new(HashMap::<String, Instant>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let addr = s.addr();
    let mut threads = Vec::new();
    for t in 0..PRODUCERS {
        let (accepted, stop) = (accepted.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let Ok(mut c) = Client::connect(addr) else { return };
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                if i.is_multiple_of(2) {
                    let id = format!("m-{t}-{i}");
                    match c.try_request("POST", &format!("/v1/topics/d/produce?key={id}"), &[("Content-Type", "application/octet-stream")], id.as_bytes()) {
                        Ok(r) if r.status == 202 => accepted.lock().unwrap().push(id),
                        Ok(r) => panic!("produce answered {}: {}", r.status, r.text()),
                        Err(_) => return,
                    }
                    i += 1;
                } else {
                    let ids: Vec<String> = (0..50).map(|j| format!("m-{t}-{}", i + j)).collect();
                    let body = serde_json::json!({"messages": ids.iter().map(|id| serde_json::json!({"payload": id})).collect::<Vec<_>>()}).to_string();
                    match c.try_request("POST", "/v1/topics/d/produce/batch", &[("Content-Type", "application/json")], body.as_bytes()) {
                        // Batch payloads are JSON strings: stored with their quotes, returned as a
                        // JSON string value with the same text.
                        Ok(r) if r.status == 202 => accepted.lock().unwrap().extend(ids),
                        Ok(r) => panic!("batch answered {}: {}", r.status, r.text()),
                        Err(_) => return,
                    }
                    i += 50;
                }
            }
        }));
    }
    // A consumer acks while producers run.
    let in_flight = Arc::new(Mutex::new(HashSet::<String>::new()));
    {
        let (acked, stop, in_flight) = (acked.clone(), stop.clone(), in_flight.clone());
        threads.push(std::thread::spawn(move || {
            let Ok(mut c) = Client::connect(addr) else {
                return;
            };
            while !stop.load(Ordering::Relaxed) {
                let Some(batch) = consume_batch(&mut c, "100ms") else {
                    return;
                };
                if batch.is_empty() {
                    continue;
                }
                let handles: Vec<String> = batch.iter().map(|(_, h)| h.clone()).collect();
                // An ack in flight when the broker dies may or may not have landed.
                *in_flight.lock().unwrap() = batch.iter().map(|(id, _)| id.clone()).collect();
                let Some(statuses) = ack_all(&mut c, &handles) else {
                    return;
                };
                in_flight.lock().unwrap().clear();
                let answered = Instant::now();
                let mut a = acked.lock().unwrap();
                for ((id, _), st) in batch.into_iter().zip(statuses) {
                    if st == 204 {
                        a.insert(id, answered);
                    }
                }
            }
        }));
    }
    let start = Instant::now();
    while accepted.lock().unwrap().len() < TARGET_ACCEPTED || start.elapsed() < TRAFFIC_MIN {
        assert!(
            start.elapsed() < RUN_MAX,
            "only {} accepted in {RUN_MAX:?}",
            accepted.lock().unwrap().len()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Kill in the middle of traffic.
    let killed = Instant::now();
    s.kill9();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let accepted: Vec<String> = accepted.lock().unwrap().clone();
    let acked: HashMap<String, Instant> = acked.lock().unwrap().clone();
    let maybe_acked: HashSet<String> = in_flight.lock().unwrap().clone();
    assert!(accepted.len() >= TARGET_ACCEPTED);

    s.restart();
    let mut c = s.client();
    let mut seen = HashSet::new();
    let mut empty_polls = 0;
    let mut redelivered_acked = 0usize;
    let drain_start = Instant::now();
    while empty_polls < 2 {
        assert!(drain_start.elapsed() < RUN_MAX, "drain did not finish");
        let batch = consume_batch(&mut c, "500ms").expect("consume after restart");
        if batch.is_empty() {
            empty_polls += 1;
            continue;
        }
        empty_polls = 0;
        let handles: Vec<String> = batch.iter().map(|(_, h)| h.clone()).collect();
        let st = ack_all(&mut c, &handles).expect("ack after restart");
        assert!(st.iter().all(|&s| s == 204), "{st:?}");
        for (id, _) in batch {
            if let Some(&answered) = acked.get(&id) {
                let before_kill = killed.saturating_duration_since(answered);
                assert!(
                    before_kill < UNFINISHED_BATCH_MAX,
                    "{id} was acked {before_kill:?} before the crash and delivered again"
                );
                redelivered_acked += 1;
            }
            seen.insert(id);
        }
    }
    let missing: Vec<&String> = accepted
        .iter()
        .filter(|id| !seen.contains(*id) && !acked.contains_key(*id) && !maybe_acked.contains(*id))
        .collect();
    if !missing.is_empty() {
        let d = s.client().get("/v1/topics/d").json();
        eprintln!("after restart: {}", d["partition_stats"]);
        for p in 0..3 {
            let r = s
                .client()
                .get(&format!("/v1/topics/d/consume?partition={p}&offset=0"));
            eprintln!("p{p} offset 0: {} {}", r.status, r.text());
        }
    }
    let old_acks = acked
        .values()
        .filter(|&&t| killed.saturating_duration_since(t) >= UNFINISHED_BATCH_MAX)
        .count();
    eprintln!(
        "{} accepted, {} acked before the kill ({old_acks} of them {UNFINISHED_BATCH_MAX:?} \
         or more before it), {redelivered_acked} of those delivered again",
        accepted.len(),
        acked.len()
    );
    assert!(old_acks > 0, "no ack old enough to have to be durable");
    assert!(
        missing.is_empty(),
        "{} accepted messages lost, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
}

#[test]
fn a_restart_right_after_kill_gets_its_port() {
    // Proves a broker started again at once after `kill -9` (as a supervisor does) binds its
    // port: the killed process keeps its listeners for a few milliseconds after it exits, until
    // the kernel tears down its io_uring rings. Before, most such restarts exited with
    // `Address already in use`.
    let dir = TempDir::new("rebind");
    let mut s = Server::start(&dir);
    s.client().create_topic("d", 3);
    for round in 0..4 {
        // A keep-alive connection open across the kill, as producers have.
        let mut held = s.client();
        assert_eq!(held.get("/readyz").status, 200);
        s.restart();
        assert_eq!(s.client().get("/v1/topics/d").status, 200, "round {round}");
        drop(held);
    }
}

#[test]
fn single_produces_accepted_for_another_shard_survive_a_kill_before_their_hand_off() {
    // Proves the transit path (crate::transit): a single produce for a partition of the other
    // shard is answered `202` after the accepting shard's own fsync, and survives `kill -9`
    // before it ever reached its owner (hand-offs are paused by a test knob, so the records
    // exist only as transit records in the accepting shard's WAL). After the restart each
    // message is consumed exactly once: none lost, none handed over twice. Then a second kill
    // after the hand-offs brings none of them back.
    let dir = TempDir::new("transit");
    let paused = vec![("NARAD_TEST_TRANSIT_PAUSED".to_string(), "1".to_string())];
    let mut s = Server::start_with(dir.0.join("data"), paused);
    let mut c = s.client();
    c.create_topic("d", 4);
    const N: usize = 40;
    for i in 0..N {
        let r = c.request(
            "POST",
            "/v1/topics/d/produce",
            &[("Content-Type", "application/json")],
            format!("\"m{i}\"").as_bytes(),
        );
        assert_eq!(r.status, 202, "{}", r.text());
    }
    let m = c.get("/metrics").text();
    let backlog: f64 = m
        .lines()
        .find_map(|l| l.strip_prefix("narad_ingress_dispatch_backlog_records "))
        .expect("backlog gauge")
        .trim()
        .parse()
        .unwrap();
    // Keyless produces rotate over 4 partitions on 2 shards: about half are for the other one.
    assert!(
        backlog >= (N / 4) as f64,
        "expected records waiting for their hand-off, found {backlog}"
    );
    drop(c);
    s.kill9();
    s.extra_env.clear();
    s.restart();
    let mut c = s.client();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.len() < N && Instant::now() < deadline {
        let got = consume_batch(&mut c, "1s").expect("consume");
        let handles: Vec<String> = got.iter().map(|(_, h)| h.clone()).collect();
        for (p, _) in got {
            *seen.entry(p).or_default() += 1;
        }
        if !handles.is_empty() {
            assert!(ack_all(&mut c, &handles).unwrap().iter().all(|&s| s == 204));
        }
    }
    assert_eq!(seen.len(), N, "every accepted message is delivered");
    assert!(seen.values().all(|&n| n == 1), "delivered twice: {seen:?}");
    assert_eq!(consume_batch(&mut c, "300ms").unwrap().len(), 0);
    // Handed over and acked: a kill now brings nothing back.
    drop(c);
    std::thread::sleep(Duration::from_millis(300));
    s.restart();
    let mut c = s.client();
    assert_eq!(consume_batch(&mut c, "500ms").unwrap().len(), 0);
}

fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

fn orphan_topic_dirs(c: &mut Client) -> u64 {
    let m = c.get("/metrics").text();
    m.lines()
        .find_map(|l| l.strip_prefix("narad_orphan_topic_dirs "))
        .expect("narad_orphan_topic_dirs in /metrics")
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn data_of_a_topic_deleted_before_a_crash_is_purged_at_start() {
    // Proves SEMANTICS.md §14.3 "a node that was down purges on start, only after the leader
    // confirms the topic is gone": a topic directory that outlived its delete (a kill -9 between
    // the 204 and the removal leaves exactly this: metadata without the topic, its partitions
    // on disk; the audit saw it in 3 of 3 rounds) is removed at the next start, and the other
    // topics' data is untouched. With an empty metastore nothing confirms a delete: the data is
    // kept. Before, such a directory stayed for good (narad_orphan_topic_dirs 1).
    let dir = TempDir::new("purge-deleted");
    let mut s = Server::start_with(dir.0.join("data"), vec![]);
    let mut c = s.client();
    let gone_id = c.create_topic("gone", 4)["id"]
        .as_str()
        .unwrap()
        .to_string();
    c.create_topic("kept", 4);
    for t in ["gone", "kept"] {
        let r = c.post_json(
            &format!("/v1/topics/{t}/produce/batch"),
            r#"{"messages":[{"payload":1},{"payload":2},{"payload":3},{"payload":4}]}"#,
        );
        assert_eq!(r.status, 202, "{}", r.text());
    }
    drop(c);
    assert_eq!(s.terminate().code(), Some(0));
    let topics = s.data_dir().join("topics");
    let saved = dir.0.join("saved-topic");
    let gone_dir = topics.join(&gone_id);
    assert!(gone_dir.is_dir(), "{gone_id} under {}", topics.display());
    copy_tree(&gone_dir, &saved);

    s.restart();
    let mut c = s.client();
    assert_eq!(c.request("DELETE", "/v1/topics/gone", &[], b"").status, 204);
    drop(c);
    assert_eq!(s.terminate().code(), Some(0));
    assert!(!gone_dir.exists());
    // What a crash right after the delete's answer leaves behind.
    copy_tree(&saved, &gone_dir);

    s.restart();
    let mut c = s.client();
    assert!(
        !gone_dir.exists(),
        "deleted topic's data still on disk after the start"
    );
    assert_eq!(orphan_topic_dirs(&mut c), 0);
    let v = c.get("/v1/topics/kept").json();
    let held: u64 = v["partition_stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["next_offset"].as_u64().unwrap())
        .sum();
    assert_eq!(held, 4, "{v}");
    drop(c);

    // An empty metastore (removed by hand) confirms nothing: the topic data stays.
    assert_eq!(s.terminate().code(), Some(0));
    std::fs::remove_dir_all(s.data_dir().join("metastore")).unwrap();
    s.restart();
    let mut c = s.client();
    assert_eq!(orphan_topic_dirs(&mut c), 1, "kept's data must be kept");
}
