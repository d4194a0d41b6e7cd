//! §9.1 and §9.2 message series by partition and by topic: messages and bytes produced and
//! consumed, settled leases and empty consumes, produce rejections, lapsed leases, and how
//! long consumes waited. Every partition of every topic, in name order, has its counters (0
//! until traffic).
//!
//! Owns the rendering of those families from the merged figures; never reads the node.

use narad_io::types::{PartitionId, PartitionKey};
use narad_raft::MetaState;

use super::Merged;
use crate::metrics::expo::{Expo, Kind};
use crate::metrics::{TopicCounters, Traffic};

/// Messages and bytes produced and consumed, per partition of every topic.
pub(super) fn render_traffic(e: &mut Expo, meta: &MetaState, m: &Merged) {
    type PartitionSeries = (&'static str, &'static str, fn(&Traffic) -> u64);
    let per_partition: [PartitionSeries; 4] = [
        (
            "narad_messages_produced_total",
            "Messages made durable, by topic and partition.",
            |t| t.produced,
        ),
        (
            "narad_bytes_produced_total",
            "Payload bytes made durable, by topic and partition.",
            |t| t.produced_bytes,
        ),
        (
            "narad_messages_consumed_total",
            "Queue deliveries (redeliveries count again), by topic and partition.",
            |t| t.consumed,
        ),
        (
            "narad_bytes_consumed_total",
            "Payload bytes of queue deliveries, by topic and partition.",
            |t| t.consumed_bytes,
        ),
    ];
    let zero = Traffic::default();
    for (name, help, get) in per_partition {
        e.family(name, Kind::Counter, help);
        for t in meta.topics.values() {
            for p in 0..t.partitions {
                let key = PartitionKey {
                    topic: t.id,
                    partition: PartitionId(p),
                };
                let v = m.traffic.get(&key).unwrap_or(&zero);
                let ps = p.to_string();
                e.int(name, &[("topic", &t.name), ("partition", &ps)], get(v));
            }
        }
    }
}

/// Empty consumes and settled leases, per topic.
pub(super) fn render_topic_counters(e: &mut Expo, meta: &MetaState, m: &Merged) {
    type TopicSeries = (&'static str, &'static str, fn(&TopicCounters) -> u64);
    let per_topic: [TopicSeries; 4] = [
        (
            "narad_consume_empty_total",
            "Queue consumes that found nothing within their wait.",
            |c| c.consume_empty,
        ),
        (
            "narad_messages_acked_total",
            "Leases acknowledged, by topic.",
            |c| c.acked,
        ),
        (
            "narad_ack_extended_total",
            "Leases extended, by topic.",
            |c| c.extended,
        ),
        (
            "narad_nack_total",
            "Leases released for redelivery (nack), by topic.",
            |c| c.nacked,
        ),
    ];
    let none = TopicCounters::default();
    for (name, help, get) in per_topic {
        e.family(name, Kind::Counter, help);
        for t in meta.topics.values() {
            let v = m.topics.get(&t.id).unwrap_or(&none);
            e.int(name, &[("topic", &t.name)], get(v));
        }
    }
}

/// `narad_produce_rejections_total`, by topic and reason.
pub(super) fn render_produce_rejections(e: &mut Expo, meta: &MetaState, m: &Merged) {
    let none = TopicCounters::default();
    e.family(
        "narad_produce_rejections_total",
        Kind::Counter,
        "Produces refused before storage, by topic and reason (a batch counts once).",
    );
    for t in meta.topics.values() {
        let v = m.topics.get(&t.id).unwrap_or(&none);
        for (reason, n) in [
            ("schema", v.rejected_schema),
            ("delayed_child", v.rejected_delayed_child),
            ("remote_child", v.rejected_remote_child),
        ] {
            e.int(
                "narad_produce_rejections_total",
                &[("topic", &t.name), ("reason", reason)],
                n,
            );
        }
    }
}

/// `narad_lease_expired_total`, by topic.
pub(super) fn render_lease_expired(e: &mut Expo, meta: &MetaState, m: &Merged) {
    e.family(
        "narad_lease_expired_total",
        Kind::Counter,
        "Leases whose visibility timeout passed (message released for redelivery), by topic.",
    );
    for t in meta.topics.values() {
        let n = m.expired.get(&t.id).copied().unwrap_or(0);
        e.int("narad_lease_expired_total", &[("topic", &t.name)], n);
    }
}

/// `narad_consume_wait_seconds`, by topic and outcome (only the outcomes that happened).
pub(super) fn render_consume_wait(e: &mut Expo, meta: &MetaState, m: &Merged) {
    e.family(
        "narad_consume_wait_seconds",
        Kind::Histogram,
        "Time a queue consume waited, by outcome (hit, timeout, cancelled, no_wait).",
    );
    for t in meta.topics.values() {
        for outcome in ["hit", "timeout", "cancelled", "no_wait"] {
            if let Some(h) = m.consume_wait.get(&(t.id, outcome)) {
                e.histogram(
                    "narad_consume_wait_seconds",
                    &[("topic", &t.name), ("outcome", outcome)],
                    h,
                    1e6,
                );
            }
        }
    }
}
