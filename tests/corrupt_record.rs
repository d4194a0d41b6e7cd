//! Black-box test of a damaged record at rest (SEMANTICS.md §2.9, OPERATIONS.md §9): after a
//! clean stop, one record's bytes in its partition segment file are flipped; on restart queue
//! consumers get every other message (the consume that meets the damaged record answers with the
//! one after it, not empty), the damaged offset is skipped (never delivered), and
//! `narad_consumer_corrupt_skipped_total` counts it for its topic and partition.

mod common;

use std::path::{Path, PathBuf};

use common::{Client, Server, TempDir};

/// Every file under `dir`, recursively.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// Produces `n` records to `partition` of `topic`, the one at `damage_at` being `marker`.
fn produce_with_marker(
    c: &mut Client,
    topic: &str,
    partition: u32,
    n: usize,
    damage_at: usize,
    marker: &str,
) {
    for i in 0..n {
        let body = if i == damage_at {
            marker.to_string()
        } else {
            format!("ok-{i}")
        };
        let r = c.post_client(
            &format!("/v1/topics/{topic}/produce?partition={partition}"),
            body.as_bytes(),
        );
        assert_eq!(r.status, 202, "{}", r.text());
    }
}

/// Flips one byte of `marker` in the one file under `topics/` holding it (a clean stop has
/// checkpointed it into its partition segment); returns the marker's end and the file's length.
fn damage_marker(data_dir: &Path, marker: &[u8]) -> (usize, usize) {
    let mut found = Vec::new();
    for f in files(&data_dir.join("topics")) {
        let mut bytes = std::fs::read(&f).expect("read segment");
        if let Some(at) = bytes.windows(marker.len()).position(|w| w == marker) {
            bytes[at + 3] ^= 0x20;
            std::fs::write(&f, &bytes).expect("write segment");
            found.push((at + marker.len(), bytes.len()));
        }
    }
    assert_eq!(
        found.len(),
        1,
        "the record is not in exactly one segment file"
    );
    found[0]
}

/// Queue-consumes `partition` of `topic` without waiting (a consume that meets a damaged record
/// must answer with the next one) and acks each message, until 204; returns (offset, payload)
/// sorted by offset.
fn drain(c: &mut Client, topic: &str, partition: u32) -> Vec<(u64, String)> {
    let mut got = Vec::new();
    for _ in 0..20 {
        let r = c.get(&format!("/v1/topics/{topic}/consume?partition={partition}"));
        if r.status == 204 {
            break;
        }
        assert_eq!(r.status, 200, "{}", r.text());
        let m = r.json();
        got.push((
            m["offset"].as_u64().expect("offset"),
            m["payload"].as_str().unwrap_or_default().to_string(),
        ));
        let h = m["receipt_handle"].as_str().expect("handle").to_string();
        let a = c.request(
            "POST",
            &format!("/v1/topics/{topic}/ack?receipt_handle={h}"),
            &[("X-Narad-Client", "t")],
            b"",
        );
        assert_eq!(a.status, 204, "{}", a.text());
    }
    got.sort_unstable();
    got
}

#[test]
fn a_damaged_record_is_skipped_and_counted() {
    let dir = TempDir::new("corrupt-record");
    let mut s = Server::start(&dir);
    let mut c = s.client();
    c.create_topic("dmg", 3);
    produce_with_marker(&mut c, "dmg", 1, 5, 2, "DAMAGE-ME-PLEASE");
    assert!(s.terminate().success());
    damage_marker(s.data_dir(), b"DAMAGE-ME-PLEASE");

    s.restart();
    let mut c = s.client();
    let offsets: Vec<u64> = drain(&mut c, "dmg", 1).iter().map(|g| g.0).collect();
    assert_eq!(
        offsets,
        vec![0, 1, 3, 4],
        "every record but the damaged one"
    );
    let metrics = c.get("/metrics").text();
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with(r#"narad_consumer_corrupt_skipped_total{topic="dmg",partition="1"}"#)
        })
        .unwrap_or_else(|| panic!("no corrupt-skipped series:\n{metrics}"));
    assert!(line.ends_with(" 1"), "{line}");
    assert!(
        metrics.contains(r#"narad_consumer_corrupt_skipped_total{topic="dmg",partition="0"} 0"#)
    );
    assert!(metrics.contains(r#"narad_consumer_dropped_messages{topic="dmg",partition="1"} 0"#));
}

#[test]
fn a_damaged_last_record_is_not_cut_as_a_torn_tail() {
    // Proves the damage of the newest record of a partition, after a clean stop checkpointed it,
    // is not taken for a torn write: on restart the high watermark stays, the damaged offset is
    // skipped and counted, and the next produce gets a new offset instead of reusing it.
    let dir = TempDir::new("corrupt-tail");
    let mut s = Server::start(&dir);
    let mut c = s.client();
    c.create_topic("tail", 3);
    produce_with_marker(&mut c, "tail", 2, 4, 3, "DAMAGE-THE-TAIL");
    assert!(s.terminate().success());
    let (end, len) = damage_marker(s.data_dir(), b"DAMAGE-THE-TAIL");
    assert_eq!(end, len, "the record is the segment's last");

    s.restart();
    let mut c = s.client();
    let stats = c.get("/v1/topics/tail?partition=2").json();
    assert_eq!(
        stats["partition_stats"][0]["high_watermark"], 4,
        "high watermark after restart: {stats}"
    );
    let r = c.post_client("/v1/topics/tail/produce?partition=2", b"after");
    assert_eq!(r.status, 202, "{}", r.text());
    let got = drain(&mut c, "tail", 2);
    let offsets: Vec<u64> = got.iter().map(|g| g.0).collect();
    assert_eq!(
        offsets,
        vec![0, 1, 2, 4],
        "damaged offset 3 skipped: {got:?}"
    );
    assert_eq!(
        got[3].1, "after",
        "the new record took a new offset: {got:?}"
    );
    let metrics = c.get("/metrics").text();
    assert!(
        metrics.contains(r#"narad_consumer_corrupt_skipped_total{topic="tail",partition="2"} 1"#),
        "{metrics}"
    );
}
