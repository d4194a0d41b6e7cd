//! A full disk, end to end against the real binary (DESIGN.md §2 "disk full answered with a clear
//! error and recovered from", §7 tier 3; SEMANTICS.md §3): the data directory lives on a small
//! tmpfs that the produces fill.
//! * a produce that finds no space is answered `500` with the spec's error body naming the
//!   full disk, for single and batch produces alike, and never `202`;
//! * consumes, acks, readiness and topic reads keep working while the disk is full;
//! * once space frees, produces are accepted again without a restart;
//! * a `kill -9` on the full disk and a restart on it lose nothing answered `202`, and acks
//!   answered well before the kill stay settled.
//!
//! Needs root for the tmpfs mount: skipped (with a message) otherwise; as root a failed mount
//! fails the test.

mod common;
#[path = "../io/tests/tmpfs/mod.rs"]
mod tmpfs;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::{
    ack, consume, drain, sample, try_produce_batch, try_produce_one, Client, Resp, Server, TempDir,
};

/// The `<round>-<n>` part of a few payloads, for failure messages.
fn names<'a>(set: impl IntoIterator<Item = &'a String>) -> Vec<&'a str> {
    sample(set)
        .into_iter()
        .map(|p| &p[..p.len().min(16)])
        .collect()
}

/// Each of the two fillers the test removes to free space. A freed filler must hold more than
/// what the broker may already owe the disk: single produces for the other shard's partitions
/// are answered from the accepting shard's WAL (its segment is pre-allocated) while the disk is
/// full, up to an 8 MiB hand-off backlog per shard, and those records take their place in the
/// partition segments first once space frees, each partition reserving up to 1 MiB ahead.
const FILLER_BYTES: usize = 24 << 20;
/// The tmpfs: a fresh broker takes 256 MiB of it (a 64 MiB WAL segment and a prepared spare
/// segment per shard; with less room the two shards' spares race for it and the space left
/// varies); the two fillers, and 8 MiB for partition segments.
const TMPFS_BYTES: u64 = (256 << 20) + 2 * FILLER_BYTES as u64 + (8 << 20);
/// Payload padding: the disk fills after a few thousand produces.
const PAD_BYTES: usize = 1000;
/// How long the free space must stay put after start, and how long that may take.
const SETTLE_QUIET: Duration = Duration::from_millis(1000);
const SETTLE_MAX: Duration = Duration::from_secs(30);
/// Messages per batch produce while filling.
const FILL_BATCH: usize = 50;
/// Most messages any fill sends (far more than the free space holds) and its time limit.
const FILL_REQUESTS_MAX: usize = 40_000;
const FILL_TIME_MAX: Duration = Duration::from_secs(90);
/// Refused produces in a row after which every partition of the topic (4, keyless produces
/// rotating over them) has met the full disk.
const REFUSALS_IN_A_ROW: usize = 8;
/// How long produces may keep being refused after space was freed.
const RECOVERY_WAIT_MAX: Duration = Duration::from_secs(15);
/// An ack answered this long before a kill must have been durable (only the acks of the last
/// unfinished group commit may return after a crash: DESIGN.md §2.5).
const ACK_DURABLE_AFTER: Duration = Duration::from_millis(1500);

fn payload(round: &str, n: usize) -> String {
    format!("{round}-{n:06}-{}", "x".repeat(PAD_BYTES))
}

/// Free bytes of the file system holding `dir` (statvfs: available blocks × fragment size).
fn free_bytes(dir: &std::path::Path) -> u64 {
    narad_io::sys::filesystem_available_bytes(dir).expect("statvfs of the test file system")
}

/// Waits (at most [`SETTLE_MAX`]) until the free space of `dir`'s file system has not moved for
/// [`SETTLE_QUIET`]: a fresh broker prepares its spare WAL segments in the background, and the
/// fill must start from what they leave.
fn settle(dir: &std::path::Path) {
    let start = Instant::now();
    let mut last = (free_bytes(dir), Instant::now());
    while start.elapsed() < SETTLE_MAX {
        std::thread::sleep(Duration::from_millis(50));
        let now = free_bytes(dir);
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() >= SETTLE_QUIET {
            return;
        }
    }
    panic!("the broker's use of the disk still moved after {SETTLE_MAX:?}");
}

/// What was sent, and what of it was answered `202`.
#[derive(Default)]
struct Sent {
    all: HashSet<String>,
    accepted: HashSet<String>,
}

impl Sent {
    fn produce(&mut self, c: &mut Client, id: String) -> Resp {
        let r = try_produce_one(c, "t", &id).expect("produce");
        if r.status == 202 {
            self.accepted.insert(id.clone());
        }
        self.all.insert(id);
        r
    }
}

/// Fills the disk with unique payloads of `round`: batches of [`FILL_BATCH`] (each goes to its
/// partitions' owners at once) until one is refused, then single produces until
/// [`REFUSALS_IN_A_ROW`] in a row are refused. Single produces for the other shard's partitions
/// are still accepted into the accepting shard's WAL until its hand-off backlog is full, and each
/// partition reserves its space ahead in chunks, so one refusal does not yet mean that every
/// produce is refused. Every refusal must be the disk-full `500`.
fn fill(c: &mut Client, round: &str, sent: &mut Sent) {
    let start = Instant::now();
    let mut n = 0;
    let within_limits = |n: usize| {
        assert!(
            start.elapsed() < FILL_TIME_MAX && n < FILL_REQUESTS_MAX,
            "{round}: the {TMPFS_BYTES}-byte disk did not fill within {FILL_TIME_MAX:?} and \
             {FILL_REQUESTS_MAX} messages ({n} sent)"
        );
    };
    loop {
        within_limits(n);
        let ids: Vec<String> = (n..n + FILL_BATCH).map(|i| payload(round, i)).collect();
        n += FILL_BATCH;
        let r = try_produce_batch(c, "t", &ids).expect("batch produce");
        let refused = r.status != 202;
        if refused {
            assert_full(&r, &format!("{round}: batch ending at {n}"));
        } else {
            sent.accepted.extend(ids.iter().cloned());
        }
        sent.all.extend(ids);
        if refused {
            break;
        }
    }
    let mut refused_in_a_row = 0;
    while refused_in_a_row < REFUSALS_IN_A_ROW {
        within_limits(n);
        let r = sent.produce(c, payload(round, n));
        n += 1;
        if r.status == 202 {
            refused_in_a_row = 0;
        } else {
            assert_full(&r, &format!("{round}: produce {n}"));
            refused_in_a_row += 1;
        }
    }
}

/// The refusal of a write on a full disk: `500` with `{"error": "... disk full ..."}`.
fn assert_full(r: &Resp, what: &str) {
    assert_eq!(r.status, 500, "{what}: {}", r.text());
    assert!(
        r.header("content-type")
            .is_some_and(|v| v.starts_with("application/json")),
        "{what}: content type {:?}",
        r.header("content-type")
    );
    assert!(
        r.error().contains("disk full"),
        "{what}: the error names the full disk: {}",
        r.text()
    );
}

#[test]
fn a_full_disk_refuses_produces_clearly_loses_nothing_accepted_and_recovers() {
    let dir = TempDir::new("disk-full");
    let Some(mount) = tmpfs::Mount::tmpfs(&dir.0.join("mnt"), TMPFS_BYTES) else {
        return;
    };
    // Two fillers, written before the broker starts (it prepares spare WAL segments in the
    // background with whatever space there is): the first is removed while the broker runs,
    // the second after its restart.
    let filler = mount.0.join("filler");
    let filler2 = mount.0.join("filler2");
    for f in [&filler, &filler2] {
        std::fs::write(f, vec![0x5a; FILLER_BYTES]).expect("fillers fit on the fresh tmpfs");
    }
    let mut s = Server::start_with(mount.0.join("data"), vec![]);
    let mut c = s.client();
    c.create_topic("t", 4);
    settle(&mount.0);

    // 1. Fill the disk: the refusal is the clear 500, and it stays so.
    let mut sent = Sent::default();
    fill(&mut c, "a", &mut sent);
    assert!(
        sent.accepted.len() > 100,
        "only {} produces fit before the disk was full",
        sent.accepted.len()
    );
    let batch_ids: Vec<String> = (0..50)
        .map(|i| format!("refused-batch-{i}-{}", "y".repeat(PAD_BYTES)))
        .collect();
    sent.all.extend(batch_ids.iter().cloned());
    let batch = try_produce_batch(&mut c, "t", &batch_ids).expect("batch produce");
    assert_full(&batch, "a batch produce on the full disk");

    // 2. Reads, consumes and acks keep working; the node stays ready.
    for path in ["/readyz", "/healthz", "/v1/topics/t", "/metrics"] {
        let r = c.get(path);
        assert_eq!(r.status, 200, "GET {path} on a full disk: {}", r.text());
    }
    let leased = consume(&mut c, "t", "0s");
    assert!(
        !leased.is_empty(),
        "a consume on the full disk found nothing"
    );
    let handles: Vec<String> = leased.iter().map(|(_, h)| h.clone()).collect();
    let acked_at = Instant::now();
    let st = ack(&mut c, "t", &handles, None);
    assert!(st.iter().all(|&s| s == 204), "acks on a full disk: {st:?}");
    let acked: HashSet<String> = leased.into_iter().map(|(p, _)| p).collect();

    // 3. Space frees: produces are accepted again, without a restart.
    std::fs::remove_file(&filler).unwrap();
    let freed = Instant::now();
    let mut n = 0;
    loop {
        let r = sent.produce(&mut c, payload("b", n));
        n += 1;
        if r.status == 202 {
            break;
        }
        assert_full(&r, "a produce after space was freed");
        if freed.elapsed() >= RECOVERY_WAIT_MAX {
            let backlog: Vec<String> = c
                .get("/metrics")
                .text()
                .lines()
                .filter(|l| l.starts_with("narad_ingress_dispatch_backlog_records"))
                .map(str::to_string)
                .collect();
            panic!(
                "produces still refused {RECOVERY_WAIT_MAX:?} after {FILLER_BYTES} bytes were \
                 freed ({} bytes free now, {backlog:?})",
                free_bytes(&mount.0)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // ... until the disk is full again.
    fill(&mut c, "c", &mut sent);

    // 4. kill -9 on the full disk and a restart on it.
    let wait = ACK_DURABLE_AFTER.saturating_sub(acked_at.elapsed());
    std::thread::sleep(wait);
    s.restart();
    let mut c = s.client();
    for path in ["/readyz", "/v1/topics/t"] {
        let r = c.get(path);
        assert_eq!(
            r.status,
            200,
            "GET {path} after the restart on a full disk: {}",
            r.text()
        );
    }
    let r = sent.produce(&mut c, "after-restart".to_string());
    assert!(
        r.status == 202 || r.error().contains("disk full"),
        "a produce after the restart on the full disk: {} {}",
        r.status,
        r.text()
    );

    // 5. Space frees again. Everything answered 202 is delivered (records accepted for another
    // shard's partition wait in the accepting shard's WAL until their owner has room, so some
    // only become visible now); nothing acked comes back; nothing unknown appears.
    std::fs::remove_file(&filler2).unwrap();
    let accepted = &sent.accepted;
    let seen = drain(&mut c, "t", |seen| {
        accepted
            .iter()
            .all(|p| acked.contains(p) || seen.contains_key(p))
    });
    let missing: Vec<&String> = accepted
        .iter()
        .filter(|p| !acked.contains(*p) && !seen.contains_key(*p))
        .collect();
    assert!(
        missing.is_empty(),
        "{} messages answered 202 were not delivered after the restart, e.g. {:?}",
        missing.len(),
        names(missing.iter().copied())
    );
    let returned: Vec<&String> = seen.keys().filter(|p| acked.contains(*p)).collect();
    assert!(
        returned.is_empty(),
        "{} messages acked before the crash came back, e.g. {:?}",
        returned.len(),
        names(returned.iter().copied())
    );
    // A refused produce may still be delivered (SEMANTICS.md §3.4), so "unknown" is only what was
    // never sent.
    let unknown: Vec<&String> = seen.keys().filter(|p| !sent.all.contains(*p)).collect();
    assert!(
        unknown.is_empty(),
        "messages never sent were delivered: {:?}",
        names(unknown.iter().copied())
    );
}

/// Batch acks of `handles`: the status of each and the error text of those refused.
fn ack_results(c: &mut Client, topic: &str, handles: &[String]) -> Vec<(u64, Option<String>)> {
    let body = serde_json::json!({ "receipt_handles": handles }).to_string();
    let r = c.request(
        "POST",
        &format!("/v1/topics/{topic}/ack"),
        &[
            ("Content-Type", "application/json"),
            ("X-Narad-Client", "narad-tests/0"),
        ],
        body.as_bytes(),
    );
    assert_eq!(r.status, 200, "batch ack: {}", r.text());
    r.json()["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["status"].as_u64().unwrap(),
                x["error"].as_str().map(str::to_string),
            )
        })
        .collect()
}

/// Rounds of consume and ack while producers keep meeting the full disk.
const ACK_ROUNDS: usize = 40;
/// Producer threads hammering the full disk during those rounds.
const FULL_DISK_PRODUCERS: usize = 2;

#[test]
fn acks_answered_on_a_full_disk_stay_acked_after_space_frees_and_a_kill() {
    // Proves that an ack answered `204` while the data disk is full is durable once space frees:
    // acks go out while producers keep hitting the full disk (so settle records share group
    // commits with appends the disk refuses); then space frees, and a `kill -9` well after that
    // (longer than any group commit) and a restart deliver none of the acked messages again.
    // An ack the broker cannot record is refused with a `503` naming the full disk (nothing
    // settled), and its message is delivered again. Before, a settle record whose group commit
    // failed on the full disk was never written: the ack was answered and came back after the
    // crash (the fault harness's finding, seed 103).
    let dir = TempDir::new("disk-full-acks");
    let Some(mount) = tmpfs::Mount::tmpfs(&dir.0.join("mnt"), TMPFS_BYTES) else {
        return;
    };
    let filler = mount.0.join("filler");
    let filler2 = mount.0.join("filler2");
    for f in [&filler, &filler2] {
        std::fs::write(f, vec![0x5a; FILLER_BYTES]).expect("fillers fit on the fresh tmpfs");
    }
    let mut s = Server::start_with(mount.0.join("data"), vec![]);
    let mut c = s.client();
    c.create_topic("t", 4);
    settle(&mount.0);
    let mut sent = Sent::default();
    fill(&mut c, "a", &mut sent);

    // Producers keep meeting the full disk while the acks go out.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producers: Vec<_> = (0..FULL_DISK_PRODUCERS)
        .map(|t| {
            let stop = stop.clone();
            let addr = s.addr();
            std::thread::spawn(move || {
                let mut c = Client::connect(addr).expect("connect");
                let mut all = Vec::new();
                let mut accepted = Vec::new();
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let ids: Vec<String> =
                        (n..n + 8).map(|i| payload(&format!("p{t}"), i)).collect();
                    n += 8;
                    let r = try_produce_batch(&mut c, "t", &ids).expect("batch produce");
                    if r.status == 202 {
                        accepted.extend(ids.iter().cloned());
                    } else {
                        assert_full(&r, "a produce during the acks");
                    }
                    all.extend(ids);
                }
                (all, accepted)
            })
        })
        .collect();
    let mut acked: HashSet<String> = HashSet::new();
    let mut refused: HashSet<String> = HashSet::new();
    for _ in 0..ACK_ROUNDS {
        let leased = consume(&mut c, "t", "0s");
        for chunk in leased.chunks(10) {
            let handles: Vec<String> = chunk.iter().map(|(_, h)| h.clone()).collect();
            for ((p, _), (status, error)) in chunk.iter().zip(ack_results(&mut c, "t", &handles)) {
                match status {
                    204 => {
                        acked.insert(p.clone());
                    }
                    503 => {
                        let error = error.unwrap_or_default();
                        assert!(error.contains("disk full"), "a refused ack: {error}");
                        refused.insert(p.clone());
                    }
                    other => panic!("an ack on the full disk answered {other}: {error:?}"),
                }
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in producers {
        let (all, accepted) = t.join().expect("producer");
        sent.all.extend(all);
        sent.accepted.extend(accepted);
    }
    assert!(
        acked.len() >= 100,
        "only {} acks answered 204 on the full disk ({} refused)",
        acked.len(),
        refused.len()
    );

    // Space frees; the kill comes long after any group commit could still be writing.
    std::fs::remove_file(&filler).unwrap();
    std::fs::remove_file(&filler2).unwrap();
    std::thread::sleep(ACK_DURABLE_AFTER);
    s.restart();
    let mut c = s.client();
    let accepted = &sent.accepted;
    let seen = drain(&mut c, "t", |seen| {
        accepted
            .iter()
            .all(|p| acked.contains(p) || seen.contains_key(p))
    });
    let returned: Vec<&String> = seen.keys().filter(|p| acked.contains(*p)).collect();
    assert!(
        returned.is_empty(),
        "{} of {} messages acked (204) on the full disk came back after space freed and a kill, \
         e.g. {:?}",
        returned.len(),
        acked.len(),
        names(returned.iter().copied())
    );
    let lost: Vec<&String> = accepted
        .iter()
        .filter(|p| !acked.contains(*p) && !seen.contains_key(*p))
        .collect();
    assert!(
        lost.is_empty(),
        "{} messages answered 202 (of them {} with a refused ack) were not delivered, e.g. {:?}",
        lost.len(),
        lost.iter().filter(|p| refused.contains(**p)).count(),
        names(lost.iter().copied())
    );
    eprintln!(
        "{} acks answered 204 and {} refused on the full disk; {} delivered after the restart",
        acked.len(),
        refused.len(),
        seen.len()
    );
}

#[test]
fn a_full_disk_refuses_metadata_changes_and_takes_them_again_once_space_frees() {
    // Proves that a metadata write (topics, users, grants: one Raft entry each) on a full disk
    // is refused with a clear 503 and nothing else happens: the metadata group keeps leading
    // (snapshots are put off), readiness holds, and once space frees the same change goes
    // through, durably. Before, the Raft log's failed append, or a snapshot that could not be
    // written, stopped the group for good: every later topic or user change answered 503 until
    // a restart, even with the disk empty again.
    let dir = TempDir::new("disk-full-meta");
    let Some(mount) = tmpfs::Mount::tmpfs(&dir.0.join("mnt"), TMPFS_BYTES) else {
        return;
    };
    // A snapshot every 10 entries: openraft also stops the group when a snapshot it asked for
    // cannot be written, so the full disk must put them off too.
    let mut s = Server::start_env(
        mount.0.join("data"),
        &[("NARAD_CLUSTER_RAFT_SNAPSHOT_THRESHOLD", "10")],
    );
    let mut c = s.client();
    c.create_topic("t", 3);
    settle(&mount.0);
    let filler = tmpfs::fill_to_the_last_byte(&mount.0);

    // Retention changes until one is refused (the log keeps some room reserved ahead, so the
    // first ones still fit).
    let start = Instant::now();
    let mut last_applied = None;
    let refusal = loop {
        let n = last_applied.map_or(0, |v: u64| v - 3_600_000 + 1);
        assert!(
            start.elapsed() < FILL_TIME_MAX && n < FILL_REQUESTS_MAX as u64,
            "{n} metadata changes accepted on a full disk within {:?}",
            start.elapsed()
        );
        let retention = 3_600_000 + n;
        let r = c.patch_json(
            "/v1/topics/t",
            &format!(r#"{{"retention_ms":{retention}}}"#),
        );
        if r.status != 200 {
            break r;
        }
        last_applied = Some(retention);
    };
    assert_eq!(refusal.status, 503, "{}", refusal.text());
    assert!(
        refusal.error().contains("disk full"),
        "the refusal names the full disk: {}",
        refusal.text()
    );
    let described = c.get("/v1/topics/t").json();
    assert_eq!(
        described["retention_ms"].as_u64(),
        last_applied,
        "the refused change was not applied"
    );
    let r = c.get("/readyz");
    assert_eq!(r.status, 200, "ready on a full disk: {}", r.text());
    let metrics = c.get("/metrics").text();
    assert!(
        metrics
            .lines()
            .any(|l| l == r#"narad_raft_state{state="leader"} 1"#),
        "the metadata group still leads on a full disk"
    );
    let put_off: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("narad_metastore_snapshot_failures_total "))
        .and_then(|v| v.parse().ok())
        .expect("narad_metastore_snapshot_failures_total");
    assert!(put_off > 0, "no snapshot was attempted on the full disk");

    // Space frees: the same kinds of change go through again, without a restart.
    std::fs::remove_file(&filler).unwrap();
    let r = c.patch_json("/v1/topics/t", r#"{"retention_ms":7200000}"#);
    assert_eq!(
        r.status,
        200,
        "a change after space was freed: {}",
        r.text()
    );
    c.create_topic("u", 3);

    // And they were durable.
    s.restart();
    let mut c = s.client();
    assert_eq!(
        c.get("/v1/topics/t").json()["retention_ms"].as_u64(),
        Some(7_200_000)
    );
    assert_eq!(c.get("/v1/topics/u").status, 200);
}
