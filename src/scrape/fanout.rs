//! §9.4 fan-out into local children: each cursor's lag, the records each link copied and
//! dropped, unreadable and refused copies, and the size of copied batches. (The remote plane's
//! families are `remote`'s.)
//!
//! Owns the rendering of those families from the merged figures; never reads the node.

use std::collections::HashMap;

use narad_io::types::TopicId;
use narad_raft::MetaState;
use narad_shard::fanout::{LinkCounts, FANOUT_BATCH_BYTES_BOUNDS, FANOUT_BATCH_RECORDS_BOUNDS};

use super::Merged;
use crate::metrics::expo::{Expo, Histogram, Kind};

/// `narad_fanout_lag_messages` and `narad_fanout_due_lag_seconds`, per cursor (parent
/// partition × child) whose topics still exist.
pub(super) fn render_lag(e: &mut Expo, meta: &MetaState, m: &Merged) {
    let names: HashMap<TopicId, &str> = meta
        .topics
        .values()
        .map(|t| (t.id, t.name.as_str()))
        .collect();
    e.family(
        "narad_fanout_lag_messages",
        Kind::Gauge,
        "Parent records of the partition not yet copied into the child.",
    );
    for ((parent, child, partition), (lag, _)) in &m.fanout_lag {
        if let (Some(p), Some(c)) = (names.get(parent), names.get(child)) {
            let partition = partition.to_string();
            e.int(
                "narad_fanout_lag_messages",
                &[("parent", p), ("child", c), ("partition", &partition)],
                *lag,
            );
        }
    }
    e.family(
        "narad_fanout_due_lag_seconds",
        Kind::Gauge,
        "How long past due the partition's oldest uncopied record is (commit time plus the \
         child's delay); 0 when caught up.",
    );
    for ((parent, child, partition), (_, due_ms)) in &m.fanout_lag {
        if let (Some(p), Some(c)) = (names.get(parent), names.get(child)) {
            let partition = partition.to_string();
            e.float(
                "narad_fanout_due_lag_seconds",
                &[("parent", p), ("child", c), ("partition", &partition)],
                *due_ms as f64 / 1e3,
            );
        }
    }
}

/// `narad_fanout_committed_total` and `narad_fanout_child_dropped_messages`, per link.
pub(super) fn render_links(e: &mut Expo, meta: &MetaState, m: &Merged) {
    type LinkSeries = (&'static str, &'static str, fn(&LinkCounts) -> u64);
    let link_series: [LinkSeries; 2] = [
        (
            "narad_fanout_committed_total",
            "Records copied into the child since the node started.",
            |k| k.copied,
        ),
        (
            "narad_fanout_child_dropped_messages",
            "Parent records never copied into the child because retention deleted them first.",
            |k| k.dropped,
        ),
    ];
    // Every attached local child has its series from the attach on (0 until it copies).
    let mut links: Vec<(&str, &str, LinkCounts)> = meta
        .topics
        .values()
        .filter_map(|c| {
            let p = meta.topic(c.parent.as_deref()?)?;
            let k = m
                .fanout_links
                .get(&(p.id, c.id))
                .copied()
                .unwrap_or_default();
            Some((p.name.as_str(), c.name.as_str(), k))
        })
        .collect();
    links.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    for (name, help, get) in link_series {
        e.family(name, Kind::Counter, help);
        for (p, c, k) in &links {
            e.int(name, &[("parent", p), ("child", c)], get(k));
        }
    }
}

/// Unreadable and refused copies, and the records and bytes of copied batches.
pub(super) fn render_copies(e: &mut Expo, m: &Merged) {
    type FanoutSeries = (&'static str, &'static str, u64);
    let fanout_series: [FanoutSeries; 2] = [
        (
            "narad_fanout_unreadable_skipped_total",
            "Parent records skipped by fan-out because they could not be read.",
            m.fanout.unreadable,
        ),
        (
            "narad_fanout_copy_failures_total",
            "Fan-out copy attempts the child refused (retried).",
            m.fanout.failed_copies,
        ),
    ];
    for (name, help, v) in fanout_series {
        e.family(name, Kind::Counter, help);
        e.int(name, &[], v);
    }
    e.family(
        "narad_fanout_batch_records",
        Kind::Histogram,
        "Records per batch copied into a child.",
    );
    let h = Histogram::from_counts(
        &FANOUT_BATCH_RECORDS_BOUNDS,
        &m.fanout.batch_records,
        m.fanout.copied,
    );
    e.histogram("narad_fanout_batch_records", &[], &h, 1.0);
    e.family(
        "narad_fanout_batch_bytes",
        Kind::Histogram,
        "Payload bytes per batch copied into a child.",
    );
    let h = Histogram::from_counts(
        &FANOUT_BATCH_BYTES_BOUNDS,
        &m.fanout.batch_bytes,
        m.fanout.batch_bytes_sum,
    );
    e.histogram("narad_fanout_batch_bytes", &[], &h, 1.0);
}
