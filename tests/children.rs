//! Fan-out, replica and delay children (SEMANTICS.md §10–12, API.md §9) and retention on disk
//! (SEMANTICS.md §6), against the real binary.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use common::{Client, Server, TempDir};

/// Longest a test waits for fan-out to catch up.
const CATCH_UP_MAX: Duration = Duration::from_secs(90);

fn client_hdr() -> [(&'static str, &'static str); 2] {
    [
        ("Content-Type", "application/json"),
        ("X-Narad-Client", "narad-tests/0"),
    ]
}

fn create(c: &mut Client, body: &str) -> common::Resp {
    c.post_json("/v1/topics", body)
}

fn attach(c: &mut Client, parent: &str, body: &str) -> common::Resp {
    c.post_json(&format!("/v1/topics/{parent}/children"), body)
}

fn detach(c: &mut Client, parent: &str, child: &str) -> common::Resp {
    c.request(
        "DELETE",
        &format!("/v1/topics/{parent}/children/{child}"),
        &[("X-Narad-Client", "narad-tests/0")],
        b"",
    )
}

/// Produces ids `from..to` to `topic` in batches of 100; every third message has no key.
fn produce_ids(c: &mut Client, topic: &str, from: u64, to: u64) {
    let mut i = from;
    while i < to {
        let end = (i + 100).min(to);
        let msgs: Vec<String> = (i..end)
            .map(|n| {
                if n % 3 == 0 {
                    format!(r#"{{"payload":{{"i":{n}}}}}"#)
                } else {
                    format!(r#"{{"key":"k{}","payload":{{"i":{n}}}}}"#, n % 97)
                }
            })
            .collect();
        let body = format!(r#"{{"messages":[{}]}}"#, msgs.join(","));
        let r = c.request(
            "POST",
            &format!("/v1/topics/{topic}/produce/batch"),
            &client_hdr(),
            body.as_bytes(),
        );
        assert_eq!(r.status, 202, "produce batch: {}", r.text());
        i = end;
    }
}

/// One batch consume of up to 100 records, acked at once: the ids it returned.
fn consume_ids(c: &mut Client, topic: &str, wait: &str) -> Vec<u64> {
    let r = c.request(
        "GET",
        &format!("/v1/topics/{topic}/consume?max=100&wait={wait}"),
        &[("X-Narad-Client", "narad-tests/0")],
        b"",
    );
    let msgs = match r.status {
        204 => return Vec::new(),
        200 => r.json()["messages"].as_array().unwrap().clone(),
        s => panic!("consume {topic}: {s} {}", r.text()),
    };
    let handles: Vec<serde_json::Value> =
        msgs.iter().map(|m| m["receipt_handle"].clone()).collect();
    let body = serde_json::json!({ "receipt_handles": handles }).to_string();
    let a = c.request(
        "POST",
        &format!("/v1/topics/{topic}/ack"),
        &client_hdr(),
        body.as_bytes(),
    );
    assert_eq!(a.status, 200, "ack: {}", a.text());
    msgs.iter()
        .map(|m| m["payload"]["i"].as_u64().expect("payload id"))
        .collect()
}

/// Consumes `topic` until every id of `want` was seen or `CATCH_UP_MAX` passed; returns the ids
/// seen (a set: duplicates are allowed by the contract).
fn drain_until_complete(c: &mut Client, topic: &str, want: u64) -> HashSet<u64> {
    let start = Instant::now();
    let mut seen = HashSet::new();
    while (seen.len() as u64) < want && start.elapsed() < CATCH_UP_MAX {
        seen.extend(consume_ids(c, topic, "1s"));
    }
    seen
}

/// Waits until a killed broker's API port can be bound again: io_uring tears a dead process's
/// sockets down asynchronously, so the port may stay taken for a moment after `kill -9`.
fn wait_port_free(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "port {port} still taken");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn children_list(c: &mut Client, parent: &str) -> serde_json::Value {
    let r = c.get(&format!("/v1/topics/{parent}/children"));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

#[test]
fn attach_list_detach_statuses_and_texts() {
    // Proves the statuses and error texts of API.md §9.1–9.3 and the role rules of SEMANTICS.md
    // §10: attach answers the parent, list shows each child, roles are flat, one parent per
    // child, delay versus parent retention, detach, and that deleting a parent frees children.
    let dir = TempDir::new("children-api");
    let srv = Server::start(&dir);
    let mut c = srv.client();
    for t in ["p", "c1", "c2", "q"] {
        c.create_topic(t, 3);
    }
    let r = attach(&mut c, "p", r#"{"child":"c1"}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["name"], "p");
    assert_eq!(v["role"], "parent");
    assert_eq!(v["children"], serde_json::json!(["c1"]));
    let r = attach(&mut c, "p", r#"{"child":"c2","delay_ms":0}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    let l = children_list(&mut c, "p");
    assert_eq!(l["parent"], "p");
    assert_eq!(l["parent_id"].as_str().unwrap().len(), 16);
    let kids = l["children"].as_array().unwrap();
    assert_eq!(kids.len(), 2);
    assert_eq!(kids[0]["name"], "c1");
    assert_eq!(kids[1]["name"], "c2");
    assert_eq!(kids[0]["delay_ms"], 0);
    assert_eq!(kids[0]["lag_messages"], 0);
    assert_eq!(kids[0]["lag_complete"], true);
    let child = c.get("/v1/topics/c1").json();
    assert_eq!(child["role"], "child");
    assert_eq!(child["parent"], "p");
    assert_eq!(child["attach_epoch"].as_str().unwrap().len(), 16);
    assert_eq!(child["attach_offsets"], serde_json::json!([0, 0, 0]));

    // Validation (400), missing topics (404), conflicts (409).
    let r = attach(&mut c, "p", "{}");
    assert_eq!((r.status, r.error()), (400, "child is required".into()));
    let r = attach(&mut c, "p", r#"{"child":"p"}"#);
    assert_eq!(r.status, 400);
    let r = attach(&mut c, "p", r#"{"child":"q","delay_ms":-1}"#);
    assert_eq!((r.status, r.error()), (400, "delay_ms must be >= 0".into()));
    assert_eq!(attach(&mut c, "p", r#"{"child":"nope"}"#).status, 404);
    assert_eq!(attach(&mut c, "nope", r#"{"child":"q"}"#).status, 404);
    let r = attach(&mut c, "p", r#"{"child":"c1"}"#);
    assert_eq!(r.status, 409);
    assert!(r.error().starts_with("already exists: "), "{}", r.error());
    let r = attach(&mut c, "q", r#"{"child":"c1"}"#);
    assert_eq!(r.status, 409);
    assert!(
        r.error().starts_with("fan-out role conflict: "),
        "{}",
        r.error()
    );
    let r = attach(&mut c, "c1", r#"{"child":"q"}"#);
    assert_eq!(r.status, 409, "a child cannot have children");
    assert!(
        r.error().starts_with("fan-out role conflict: "),
        "{}",
        r.error()
    );
    let r = attach(&mut c, "q", r#"{"child":"p"}"#);
    assert_eq!(r.status, 409, "a parent cannot become a child");
    assert!(
        r.error().starts_with("fan-out role conflict: "),
        "{}",
        r.error()
    );
    // Default retention is 7 days: a delay of 7 days cannot be buffered.
    let r = attach(&mut c, "p", r#"{"child":"q","delay_ms":604800000}"#);
    assert_eq!(r.status, 409);
    assert_eq!(
        r.error(),
        "delay exceeds what the parent's retention can buffer: parent \"p\" retention (604800000ms) must be at least delay (604800000ms) + 3600000ms"
    );
    assert_eq!(c.get("/v1/topics/nope/children").status, 404);

    // Detach: 204, then 404 with the spec's text; the child is standalone again.
    assert_eq!(detach(&mut c, "p", "c2").status, 204);
    let r = detach(&mut c, "p", "c2");
    assert_eq!(r.status, 404);
    assert_eq!(r.error(), "not found: \"c2\" is not attached to \"p\"");
    assert_eq!(detach(&mut c, "p", "nope").status, 404);
    let v = c.get("/v1/topics/c2").json();
    assert_eq!(v["role"], "standalone");
    assert!(v.get("parent").is_none() && v.get("attach_epoch").is_none());

    // Deleting the parent leaves the child standalone.
    let r = c.request(
        "DELETE",
        "/v1/topics/p",
        &[("X-Narad-Client", "narad-tests/0")],
        b"",
    );
    assert_eq!(r.status, 204);
    assert_eq!(c.get("/v1/topics/c1").json()["role"], "standalone");
}

#[test]
fn remote_fields_at_their_zero_values_are_a_local_attach() {
    // Proves an attach body with every remote-only field at its zero value (what a client that
    // serialises the whole attach struct sends) attaches a local child, as in the original,
    // while a field with a value still needs `remote` and a non-empty `remote` is remote.
    let dir = TempDir::new("children-zero");
    let srv = Server::start(&dir);
    let mut c = srv.client();
    for t in ["p", "c1", "c2"] {
        c.create_topic(t, 3);
    }
    let full = r#"{"child":"c1","delay_ms":0,"remote":"","remote_topic":"","from":"","lanes":0,"dry_run":false}"#;
    let r = attach(&mut c, "p", full);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["children"], serde_json::json!(["c1"]));
    let r = attach(&mut c, "p", r#"{"child":"c2","remote":null}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(detach(&mut c, "p", "c2").status, 204);
    for body in [
        r#"{"child":"c2","lanes":2}"#,
        r#"{"child":"c2","dry_run":true}"#,
        r#"{"child":"c2","from":"earliest"}"#,
        r#"{"child":"c2","remote_topic":"t"}"#,
    ] {
        let r = attach(&mut c, "p", body);
        assert_eq!(
            (r.status, r.error().as_str()),
            (
                400,
                "invalid argument: remote_topic, from, lanes and dry_run require remote"
            ),
            "{body}"
        );
    }
    let r = attach(&mut c, "p", r#"{"child":"c2","remote":"r"}"#);
    assert_eq!(
        (r.status, r.error().as_str()),
        (403, "remotes require security")
    );
}

#[test]
fn fanout_copies_every_message_to_three_children() {
    // Proves every message committed to a parent after the attach is copied into each of three
    // children (one with a different partition count), with keys routed like a produce, and
    // that nothing produced before the attach is copied (no backfill).
    let dir = TempDir::new("children-fanout");
    let srv = Server::start(&dir);
    let mut c = srv.client();
    c.create_topic("orders", 3);
    produce_ids(&mut c, "orders", 1_000_000, 1_000_050);
    for (name, parts) in [("a", 3), ("b", 3), ("wide", 5)] {
        c.create_topic(name, parts);
        let r = attach(&mut c, "orders", &format!(r#"{{"child":"{name}"}}"#));
        assert_eq!(r.status, 200, "{}", r.text());
    }
    const N: u64 = 1000;
    produce_ids(&mut c, "orders", 0, N);
    for name in ["a", "b", "wide"] {
        let seen = drain_until_complete(&mut c, name, N);
        let missing: Vec<u64> = (0..N).filter(|i| !seen.contains(i)).take(10).collect();
        assert!(
            missing.is_empty(),
            "{name} is missing ids, e.g. {missing:?}"
        );
        assert!(
            seen.iter().all(|&i| i < N),
            "{name} got records from before the attach"
        );
    }
    // Keyed copies landed where a produce of that key would go: key k<j> always in one partition.
    let mut by_key: HashMap<String, HashSet<u64>> = HashMap::new();
    for p in 0..5 {
        let mut off = 0;
        loop {
            let r = c.get(&format!(
                "/v1/topics/wide/consume?partition={p}&offset={off}"
            ));
            if r.status == 204 {
                break;
            }
            assert_eq!(r.status, 200, "{}", r.text());
            if let Some(k) = r.json()["key"].as_str() {
                by_key.entry(k.to_string()).or_default().insert(p);
            }
            off += 1;
        }
    }
    assert!(!by_key.is_empty());
    for (k, parts) in by_key {
        assert_eq!(parts.len(), 1, "key {k} spread over partitions {parts:?}");
    }
    // The list reports no lag once everything is copied.
    let l = children_list(&mut c, "orders");
    for k in l["children"].as_array().unwrap() {
        assert_eq!(k["lag_messages"], 0, "{l}");
        assert_eq!(k["lag_complete"], true);
    }
}

#[test]
fn fanout_survives_kill9_midway_without_gaps() {
    // Proves the crash-safety argument of shard/src/fanout.rs: 10,000 parent messages reach each
    // of three children completely although the broker is killed with SIGKILL halfway through
    // (duplicates allowed, none missing).
    let dir = TempDir::new("children-kill");
    let mut srv = Server::start(&dir);
    let mut c = srv.client();
    c.create_topic("src", 4);
    for name in ["x", "y", "z"] {
        c.create_topic(name, 4);
        assert_eq!(
            attach(&mut c, "src", &format!(r#"{{"child":"{name}"}}"#)).status,
            200
        );
    }
    const N: u64 = 10_000;
    // A producer sends batches 0..100 of 100 ids while the broker is killed once half of them
    // were answered 202; the batches not answered are sent again after the restart.
    drop(c);
    let addr = srv.addr();
    let acked = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let a = acked.clone();
    let producer = std::thread::spawn(move || {
        let mut p = Client::connect(addr).unwrap();
        for b in 0..N / 100 {
            let msgs: Vec<String> = (b * 100..(b + 1) * 100)
                .map(|n| format!(r#"{{"key":"k{}","payload":{{"i":{n}}}}}"#, n % 13))
                .collect();
            let body = format!(r#"{{"messages":[{}]}}"#, msgs.join(","));
            match p.try_request(
                "POST",
                "/v1/topics/src/produce/batch",
                &client_hdr(),
                body.as_bytes(),
            ) {
                Ok(r) if r.status == 202 => a.store(b + 1, std::sync::atomic::Ordering::SeqCst),
                _ => return,
            }
        }
    });
    let deadline = Instant::now() + CATCH_UP_MAX;
    while acked.load(std::sync::atomic::Ordering::SeqCst) < N / 200 {
        assert!(Instant::now() < deadline, "producer stalled");
        std::thread::sleep(Duration::from_millis(1));
    }
    srv.kill9();
    producer.join().unwrap();
    let done = acked.load(std::sync::atomic::Ordering::SeqCst);
    assert!(done < N / 100, "the kill came after the last batch");
    wait_port_free(srv.port);
    srv.restart();
    let mut c = srv.client();
    produce_ids(&mut c, "src", done * 100, N);
    for name in ["x", "y", "z"] {
        let seen = drain_until_complete(&mut c, name, N);
        let missing: Vec<u64> = (0..N).filter(|i| !seen.contains(i)).take(10).collect();
        assert!(
            missing.is_empty(),
            "{name} lost ids after kill -9 ({} seen), e.g. {missing:?}",
            seen.len()
        );
    }
}

#[test]
fn delay_child_never_delivers_early() {
    // Proves SEMANTICS.md §12: a delay child (300 ms) makes no record visible before
    // parent commit time + delay, over 1,000 messages; it delivers all of them; a direct produce
    // to it is refused with 409.
    let dir = TempDir::new("children-delay");
    let srv = Server::start(&dir);
    let mut c = srv.client();
    c.create_topic("jobs", 3);
    let r = create(
        &mut c,
        r#"{"name":"jobs-retry","parent":"jobs","fanout_delay_ms":300}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["fanout_delay_ms"], 300);
    let r = c.request(
        "POST",
        "/v1/topics/jobs-retry/produce",
        &[("X-Narad-Client", "narad-tests/0")],
        b"x",
    );
    assert_eq!(
        (r.status, r.error()),
        (
            409,
            "direct produce to a delayed child topic is not allowed".into()
        )
    );
    const DELAY: Duration = Duration::from_millis(300);
    const N: u64 = 1000;
    // Produce in 10 batches 50 ms apart while a second connection consumes the child.
    let addr = srv.addr();
    let producer = std::thread::spawn(move || {
        let mut p = Client::connect(addr).unwrap();
        let mut sent_at = HashMap::new();
        for b in 0..10 {
            let t = Instant::now();
            produce_ids(&mut p, "jobs", b * 100, (b + 1) * 100);
            sent_at.insert(b, t);
            std::thread::sleep(Duration::from_millis(50));
        }
        sent_at
    });
    let mut first_seen: HashMap<u64, Instant> = HashMap::new();
    let start = Instant::now();
    while (first_seen.len() as u64) < N && start.elapsed() < CATCH_UP_MAX {
        let ids = consume_ids(&mut c, "jobs-retry", "200ms");
        let now = Instant::now();
        for i in ids {
            first_seen.entry(i).or_insert(now);
        }
    }
    let sent_at = producer.join().unwrap();
    assert_eq!(first_seen.len() as u64, N, "not every message arrived");
    let mut earliest_margin = Duration::MAX;
    let mut latest = Duration::ZERO;
    for (i, seen) in &first_seen {
        // Sent before the parent committed it, so `sent + delay` is a lower bound of due.
        let sent = sent_at[&(i / 100)];
        let after = seen.duration_since(sent);
        assert!(
            after >= DELAY,
            "message {i} delivered {after:?} after it was sent (delay {DELAY:?})"
        );
        earliest_margin = earliest_margin.min(after - DELAY);
        latest = latest.max(after);
    }
    eprintln!(
        "delay child: 1000 messages, earliest delivery {:?} after due (lower bound), latest {:?} after send",
        earliest_margin, latest
    );
}

#[test]
fn replica_create_and_reattach_epochs() {
    // Proves create-with-parent (SEMANTICS.md §11): inherits the partition count, answers the
    // attached view, keyless records keep their partition index; the 400/404/409 answers of
    // create; retention versus a delay child on PATCH; and that a detach + re-attach gets a new
    // epoch and restarts at the parent's tail (no backfill).
    let dir = TempDir::new("children-replica");
    let srv = Server::start(&dir);
    let mut c = srv.client();
    c.create_topic("main", 5);
    let r = create(&mut c, r#"{"name":"main-replica","parent":"main"}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    let v = r.json();
    assert_eq!(v["partitions"], 5);
    assert_eq!(v["role"], "child");
    assert_eq!(v["parent"], "main");
    assert_eq!(v["attach_offsets"], serde_json::json!([0, 0, 0, 0, 0]));
    let epoch1 = v["attach_epoch"].as_str().unwrap().to_string();
    assert_eq!(epoch1.len(), 16);
    assert!(v.get("fanout_delay_ms").is_none());

    let r = create(&mut c, r#"{"name":"x","fanout_delay_ms":5}"#);
    assert_eq!(
        (r.status, r.error()),
        (
            400,
            "invalid argument: fanout_delay_ms requires parent".into()
        )
    );
    // Zero values are absent values: an empty parent and a zero delay create a plain topic.
    let r = create(
        &mut c,
        r#"{"name":"plain0","parent":"","fanout_delay_ms":0}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert!(r.json().get("parent").is_none(), "{}", r.text());
    assert_eq!(
        create(&mut c, r#"{"name":"x","parent":"missing"}"#).status,
        404
    );
    assert_eq!(create(&mut c, r#"{"name":"x","parent":"x"}"#).status, 400);
    let r = create(
        &mut c,
        r#"{"name":"x","parent":"main","fanout_delay_ms":-1}"#,
    );
    assert_eq!(
        (r.status, r.error()),
        (400, "invalid argument: fanout_delay_ms must be >= 0".into())
    );
    let r = attach(&mut c, "main", r#"{"child":"main","delay_ms":31536000001}"#);
    assert_eq!(r.status, 400, "self-attach or delay over a year");
    c.create_topic("y", 3);
    let r = attach(&mut c, "main", r#"{"child":"y","delay_ms":31536000001}"#);
    assert_eq!(
        (r.status, r.error()),
        (
            400,
            "invalid argument: delay_ms must be <= 31536000000".into()
        )
    );
    let r = create(&mut c, r#"{"name":"x","parent":"main-replica"}"#);
    assert_eq!(r.status, 409, "a child cannot be a parent: {}", r.text());
    assert_eq!(c.get("/v1/topics/x").status, 404, "rolled back");

    // Keyless, pinned to parent partition 3: the copy is in replica partition 3.
    let r = c.request(
        "POST",
        "/v1/topics/main/produce?partition=3",
        &[("X-Narad-Client", "narad-tests/0")],
        br#"{"i":7}"#,
    );
    assert_eq!(r.status, 202);
    let deadline = Instant::now() + CATCH_UP_MAX;
    loop {
        let r = c.get("/v1/topics/main-replica/consume?partition=3&offset=0");
        if r.status == 200 {
            assert_eq!(r.json()["payload"]["i"], 7);
            break;
        }
        assert_eq!(r.status, 204);
        assert!(Instant::now() < deadline, "copy never arrived");
        std::thread::sleep(Duration::from_millis(20));
    }

    // A delay child pins the parent's retention at delay + 1 h.
    let r = create(
        &mut c,
        r#"{"name":"later","parent":"main","fanout_delay_ms":3600000}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let r = c.request(
        "PATCH",
        "/v1/topics/main",
        &client_hdr(),
        br#"{"retention_ms":3600000}"#,
    );
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r
        .error()
        .starts_with("delay exceeds what the parent's retention can buffer"));
    assert_eq!(detach(&mut c, "main", "later").status, 204);

    // Re-attach: new epoch, attach point at the tail, no backfill of what came in between.
    assert_eq!(detach(&mut c, "main", "main-replica").status, 204);
    let r = c.request(
        "POST",
        "/v1/topics/main/produce?partition=3",
        &[("X-Narad-Client", "narad-tests/0")],
        br#"{"i":8}"#,
    );
    assert_eq!(r.status, 202);
    let r = attach(&mut c, "main", r#"{"child":"main-replica"}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = c.get("/v1/topics/main-replica").json();
    assert_ne!(v["attach_epoch"].as_str().unwrap(), epoch1);
    assert_eq!(v["attach_offsets"], serde_json::json!([0, 0, 0, 2, 0]));
    let r = c.request(
        "POST",
        "/v1/topics/main/produce?partition=3",
        &[("X-Narad-Client", "narad-tests/0")],
        br#"{"i":9}"#,
    );
    assert_eq!(r.status, 202);
    let deadline = Instant::now() + CATCH_UP_MAX;
    loop {
        let r = c.get("/v1/topics/main-replica/consume?partition=3&offset=1");
        if r.status == 200 {
            assert_eq!(
                r.json()["payload"]["i"],
                9,
                "message 8 must not be backfilled"
            );
            break;
        }
        assert!(Instant::now() < deadline, "copy never arrived");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn segment_files(data_dir: &std::path::Path, topic_id: &str, partition: u32) -> usize {
    let dir = data_dir
        .join("topics")
        .join(topic_id)
        .join(format!("p{partition:05}"));
    std::fs::read_dir(&dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().ends_with(".seg"))
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn retention_deletes_segment_files_on_disk() {
    // Proves SEMANTICS.md §6 on disk: sealed segments older than the retention are deleted as
    // files, the newest segment stays, and the partition's oldest offset moves past them. Uses
    // the test-only knobs of src/server.rs (small segments, fast reaper, clock moved 2 h ahead
    // on the second start).
    let dir = TempDir::new("children-retention");
    let data = dir.0.join("data");
    let knobs = |skew: &str| {
        vec![
            (
                "NARAD_TEST_PARTITION_SEGMENT_BYTES".to_string(),
                "65536".to_string(),
            ),
            (
                "NARAD_TEST_RETENTION_INTERVAL_MS".to_string(),
                "100".to_string(),
            ),
            (
                "NARAD_TEST_RETENTION_CLOCK_SKEW_MS".to_string(),
                skew.to_string(),
            ),
        ]
    };
    let mut srv = Server::start_with(data.clone(), knobs("0"));
    let mut c = srv.client();
    let r = create(
        &mut c,
        r#"{"name":"logs","partitions":3,"retention_ms":3600000}"#,
    );
    assert_eq!(r.status, 201);
    let id = r.json()["id"].as_str().unwrap().to_string();
    let body = format!(r#"{{"pad":"{}"}}"#, "x".repeat(1000));
    for _ in 0..400 {
        let r = c.request(
            "POST",
            "/v1/topics/logs/produce?partition=0",
            &[("X-Narad-Client", "narad-tests/0")],
            body.as_bytes(),
        );
        assert_eq!(r.status, 202);
    }
    let before = segment_files(&data, &id, 0);
    assert!(
        before >= 4,
        "expected several sealed segments, found {before}"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        segment_files(&data, &id, 0),
        before,
        "nothing is older than the retention yet"
    );
    drop(c);
    srv.kill9();
    wait_port_free(srv.port);
    srv.extra_env = knobs("7200000");
    srv.restart();
    let mut c = srv.client();
    let deadline = Instant::now() + Duration::from_secs(30);
    while segment_files(&data, &id, 0) != 1 {
        assert!(
            Instant::now() < deadline,
            "retention did not delete the sealed segments"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let v = c.get("/v1/topics/logs?partition=0").json();
    let st = &v["partition_stats"][0];
    assert_eq!(st["segments"], 1, "{v}");
    assert!(st["oldest_offset"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(st["next_offset"], 400);
    // A replay below the oldest retained offset is gone (410).
    assert_eq!(
        c.get("/v1/topics/logs/consume?partition=0&offset=0").status,
        410
    );
}
