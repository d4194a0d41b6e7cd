//! The node's own series (§9.6): errors by where they happened, how long the boot took, and
//! the topic and partition inventory.
//!
//! Owns the rendering of those families from the metadata, the merged figures and the node's
//! facts; never reads the node.

use narad_raft::MetaState;

use super::{Merged, NodeFacts};
use crate::metrics::expo::{Expo, Kind};

/// `narad_errors_total`, by component and kind.
pub(super) fn render_errors(e: &mut Expo, m: &Merged) {
    let http_5xx: u64 = m
        .http
        .iter()
        .filter(|(k, _)| k.status >= 500)
        .map(|(_, v)| v.duration_us.count())
        .sum();
    e.family(
        "narad_errors_total",
        Kind::Counter,
        "Errors by where they happened: HTTP answers 5xx; shard logs that stopped after a write or \
         fsync failure (fsync_poisoned); checkpoints that failed; retention passes that could not \
         delete a file (retention_unlink).",
    );
    for (component, kind, n) in [
        ("http", "5xx", http_5xx),
        ("storage", "fsync_poisoned", m.shards_poisoned),
        ("storage", "checkpoint", m.log_failures.checkpoints),
        ("storage", "retention_unlink", m.log_failures.retention),
    ] {
        e.int(
            "narad_errors_total",
            &[("component", component), ("kind", kind)],
            n,
        );
    }
}

/// `narad_boot_duration_seconds`, once every shard serves.
pub(super) fn render_boot(e: &mut Expo, facts: &NodeFacts) {
    let boot_us = facts.boot_duration_us;
    if boot_us > 0 {
        e.family(
            "narad_boot_duration_seconds",
            Kind::Gauge,
            "Seconds from start until every shard was serving.",
        );
        e.float("narad_boot_duration_seconds", &[], boot_us as f64 / 1e6);
    }
}

/// `narad_topics_total` and `narad_partitions_total`.
pub(super) fn render_inventory(e: &mut Expo, meta: &MetaState) {
    e.family("narad_topics_total", Kind::Gauge, "Topics.");
    e.int("narad_topics_total", &[], meta.topics.len() as u64);
    e.family(
        "narad_partitions_total",
        Kind::Gauge,
        "Partitions owned by this node.",
    );
    e.int(
        "narad_partitions_total",
        &[],
        meta.topics.values().map(|t| u64::from(t.partitions)).sum(),
    );
}
