//! Per-shard series (deviations from §9.5 and §9.1, see the module `scrape`): each shard's
//! write-ahead log group commit (fsync latency, records per commit, bytes written), the
//! requests and mesh calls it has in hand, and how many shards answered the scrape.
//!
//! Owns the rendering of those families from the shards' snapshots as they came; never reads
//! the node.

use crate::metrics::expo::{Expo, Kind};
use crate::metrics::ShardMetrics;

/// The write-ahead log's group commits, per shard.
pub(super) fn render_wal(e: &mut Expo, shards: &[ShardMetrics]) {
    e.family(
        "narad_wal_fsync_duration_seconds",
        Kind::Histogram,
        "fdatasync latency of the shard's write-ahead log (one per group commit).",
    );
    for s in shards {
        let id = s.shard.to_string();
        e.histogram(
            "narad_wal_fsync_duration_seconds",
            &[("shard", &id)],
            &s.wal_fsync_us,
            1e6,
        );
    }
    e.family(
        "narad_wal_batch_records",
        Kind::Histogram,
        "Records per group commit of the shard's write-ahead log.",
    );
    for s in shards {
        let id = s.shard.to_string();
        e.histogram(
            "narad_wal_batch_records",
            &[("shard", &id)],
            &s.wal_batch_records,
            1.0,
        );
    }
}

/// Per-shard counters and queue depths, and `narad_shards`.
pub(super) fn render(e: &mut Expo, shards: &[ShardMetrics]) {
    type ShardSeries = (&'static str, Kind, &'static str, fn(&ShardMetrics) -> u64);
    let per_shard: [ShardSeries; 3] = [
        (
            "narad_wal_bytes_written_total",
            Kind::Counter,
            "Bytes written by the shard's write-ahead log, padding included.",
            |s| s.wal_bytes_written,
        ),
        (
            "narad_shard_http_requests_in_flight",
            Kind::Gauge,
            "Requests being handled, by the shard that accepted them.",
            |s| s.in_flight,
        ),
        (
            "narad_shard_mesh_calls_pending",
            Kind::Gauge,
            "Calls from the shard to other shards waiting for an answer.",
            |s| s.mesh_calls_pending,
        ),
    ];
    for (name, kind, help, get) in per_shard {
        e.family(name, kind, help);
        for s in shards {
            e.int(name, &[("shard", &s.shard.to_string())], get(s));
        }
    }
    e.family(
        "narad_shards",
        Kind::Gauge,
        "Shards that answered this scrape (one per core).",
    );
    e.int("narad_shards", &[], shards.len() as u64);
}
