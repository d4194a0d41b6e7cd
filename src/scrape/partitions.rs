//! §9.2 queue health and the §9.5 sizes, per partition as its owner shard reported them: lag,
//! leases in flight, acks ahead of the frontier, segment bytes and files, losses, the oldest
//! unconsumed record's age, and each topic's bytes; and `narad_ack_rejected_total`, declared
//! without series.
//!
//! Owns the rendering of those families from the merged figures; never reads the node.

use narad_io::types::{PartitionId, PartitionKey};
use narad_raft::MetaState;

use super::Merged;
use crate::metrics::expo::{Expo, Kind};
use crate::metrics::PartitionGauges;

/// The gauges and loss counters of every partition of every topic (0 for a partition no
/// owner reported).
pub(super) fn render_gauges(e: &mut Expo, meta: &MetaState, m: &Merged) {
    type GaugeSeries = (&'static str, &'static str, fn(&PartitionGauges) -> u64);
    let per_partition_gauges: [GaugeSeries; 6] = [
        (
            "narad_consumer_lag_messages",
            "High watermark minus committed frontier.",
            |g| g.high_watermark.saturating_sub(g.frontier),
        ),
        ("narad_inflight_size", "Leases held by consumers.", |g| {
            g.in_flight
        }),
        (
            "narad_acked_ahead_size",
            "Offsets acked above the frontier.",
            |g| g.acked_ahead,
        ),
        (
            "narad_partition_size_bytes",
            "Bytes of the partition's segment files.",
            |g| g.size_bytes,
        ),
        ("narad_segments", "Segment files of the partition.", |g| {
            u64::from(g.segments)
        }),
        (
            "narad_consumer_dropped_messages",
            "Offsets retention deleted before any consumer settled them, since the owner started.",
            |g| g.dropped,
        ),
    ];
    let blank = PartitionGauges::default();
    let per_partition_counters: [GaugeSeries; 1] = [(
        "narad_consumer_corrupt_skipped_total",
        "Unreadable records queue consumers skipped (never delivered), since the owner started.",
        |g| g.corrupt_skipped,
    )];
    let families = per_partition_gauges
        .iter()
        .map(|s| (s, Kind::Gauge))
        .chain(per_partition_counters.iter().map(|s| (s, Kind::Counter)));
    for (&(name, help, get), kind) in families {
        e.family(name, kind, help);
        for t in meta.topics.values() {
            for p in 0..t.partitions {
                let key = PartitionKey {
                    topic: t.id,
                    partition: PartitionId(p),
                };
                let g = m.gauges.get(&key).unwrap_or(&blank);
                let ps = p.to_string();
                e.int(name, &[("topic", &t.name), ("partition", &ps)], get(g));
            }
        }
    }
}

/// `narad_oldest_unconsumed_message_age_seconds`, per partition.
pub(super) fn render_oldest_unconsumed(e: &mut Expo, meta: &MetaState, m: &Merged) {
    e.family(
        "narad_oldest_unconsumed_message_age_seconds",
        Kind::Gauge,
        "Age (since its commit) of the oldest record not yet acked, 0 when every record is.",
    );
    for t in meta.topics.values() {
        for p in 0..t.partitions {
            let key = PartitionKey {
                topic: t.id,
                partition: PartitionId(p),
            };
            let ms = m.gauges.get(&key).map_or(0, |g| g.oldest_unconsumed_age_ms);
            let ps = p.to_string();
            e.float(
                "narad_oldest_unconsumed_message_age_seconds",
                &[("topic", &t.name), ("partition", &ps)],
                ms as f64 / 1e3,
            );
        }
    }
}

/// `narad_topic_bytes`: the segment bytes of a topic's reported partitions.
pub(super) fn render_topic_bytes(e: &mut Expo, meta: &MetaState, m: &Merged) {
    e.family(
        "narad_topic_bytes",
        Kind::Gauge,
        "Bytes of a topic's segment files.",
    );
    for t in meta.topics.values() {
        let bytes: u64 = (0..t.partitions)
            .filter_map(|p| {
                m.gauges.get(&PartitionKey {
                    topic: t.id,
                    partition: PartitionId(p),
                })
            })
            .map(|g| g.size_bytes)
            .sum();
        e.int("narad_topic_bytes", &[("topic", &t.name)], bytes);
    }
}

/// `narad_ack_rejected_total`: registered, never incremented (as in the original).
pub(super) fn render_ack_rejected(e: &mut Expo) {
    e.family(
        "narad_ack_rejected_total",
        Kind::Counter,
        "Acks rejected, by reason (registered as in the original, which never increments it).",
    );
}
