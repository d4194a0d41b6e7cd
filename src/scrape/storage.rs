//! §9.5 storage: each partition's segment writes, checkpoint shares and retention passes; the
//! partition logs open, closed for idleness and swept; copies set aside after a move; the
//! write-ahead log's state and the records waiting for their owner shard; and the data
//! directory (orphan topic directories, bytes used and available, when they were measured).
//!
//! Owns the rendering of those families from the merged figures and the node's facts; never
//! reads the node or a file itself (`facts` does).

use std::collections::HashMap;

use narad_io::partition::PartitionIoStats;
use narad_io::stats::Durations;
use narad_io::types::{PartitionId, PartitionKey};
use narad_raft::MetaState;

use super::{durations, Merged, NodeFacts};
use crate::metrics::expo::{Expo, Kind};

/// §9.5 per partition: segment writes, checkpoint shares and retention passes. Counters for
/// every partition of every topic (0 until the owner did the work); histograms for the
/// partitions whose owner holds a log (one was written, or recovered, since the shard started).
pub(super) fn render_partitions(e: &mut Expo, meta: &MetaState, m: &Merged) {
    render_timings(e, meta, &m.partition_io);
    render_persist(e, meta, &m.partition_io);
    render_counters(e, meta, &m.partition_io);
}

/// Calls `f` for every partition of every topic, in name order, with its topic's name, its
/// index, its figures (empty when its owner holds no log) and whether its owner holds a log.
fn each_partition(
    meta: &MetaState,
    io: &HashMap<PartitionKey, PartitionIoStats>,
    f: &mut dyn FnMut(&str, &str, &PartitionIoStats, bool),
) {
    let blank = PartitionIoStats::default();
    for t in meta.topics.values() {
        for p in 0..t.partitions {
            let key = PartitionKey {
                topic: t.id,
                partition: PartitionId(p),
            };
            let ps = p.to_string();
            match io.get(&key) {
                Some(s) => f(&t.name, &ps, s, true),
                None => f(&t.name, &ps, &blank, false),
            }
        }
    }
}

/// Segment writes, segment fsyncs and retention passes, timed.
fn render_timings(e: &mut Expo, meta: &MetaState, io: &HashMap<PartitionKey, PartitionIoStats>) {
    type TimingSeries = (
        &'static str,
        &'static str,
        fn(&PartitionIoStats) -> &Durations,
    );
    let timings: [TimingSeries; 3] = [
        (
            "narad_storage_flush_duration_seconds",
            "Time spent writing committed records to the partition's segment file (page cache), \
             one write per commit batch.",
            |s| &s.flush,
        ),
        (
            "narad_storage_fsync_duration_seconds",
            "Time spent syncing the partition's segment files and directories to disk, per \
             checkpoint (the write-ahead log's own fsyncs are narad_wal_fsync_duration_seconds).",
            |s| &s.fsync,
        ),
        (
            "narad_storage_retention_run_duration_seconds",
            "Time one retention pass over the partition took.",
            |s| &s.retention_runs,
        ),
    ];
    for (name, help, get) in timings {
        e.family(name, Kind::Histogram, help);
        each_partition(meta, io, &mut |topic, partition, s, open| {
            if open {
                let labels = [("topic", topic), ("partition", partition)];
                e.histogram(name, &labels, &durations(get(s)), 1e6);
            }
        });
    }
}

/// `narad_storage_high_watermark_persist_duration_seconds`, by outcome.
fn render_persist(e: &mut Expo, meta: &MetaState, io: &HashMap<PartitionKey, PartitionIoStats>) {
    let name = "narad_storage_high_watermark_persist_duration_seconds";
    e.family(
        name,
        Kind::Histogram,
        "Time spent making the partition's high watermark durable without the write-ahead log: \
         its share of a checkpoint (segment fsyncs, index and consumer state files), by outcome.",
    );
    each_partition(meta, io, &mut |topic, partition, s, open| {
        if open {
            for (outcome, d) in [("ok", &s.persist_ok), ("error", &s.persist_failed)] {
                let labels = [
                    ("topic", topic),
                    ("partition", partition),
                    ("outcome", outcome),
                ];
                e.histogram(name, &labels, &durations(d), 1e6);
            }
        }
    });
}

/// Bytes written, and bytes and messages retention deleted.
fn render_counters(e: &mut Expo, meta: &MetaState, io: &HashMap<PartitionKey, PartitionIoStats>) {
    let name = "narad_storage_flush_bytes_total";
    e.family(
        name,
        Kind::Counter,
        "Bytes of record frames written to the partition's segment files.",
    );
    each_partition(meta, io, &mut |topic, partition, s, _| {
        e.int(
            name,
            &[("topic", topic), ("partition", partition)],
            s.flush_bytes,
        );
    });
    type CountSeries = (&'static str, &'static str, fn(&PartitionIoStats) -> u64);
    let deleted: [CountSeries; 2] = [
        (
            "narad_storage_retention_bytes_deleted_total",
            "Segment bytes deleted by retention, by reason (age).",
            |s| s.retention_bytes_deleted,
        ),
        (
            "narad_storage_retention_messages_deleted_total",
            "Messages (offsets) deleted by retention, by reason (age).",
            |s| s.retention_records_deleted,
        ),
    ];
    for (name, help, get) in deleted {
        e.family(name, Kind::Counter, help);
        each_partition(meta, io, &mut |topic, partition, s, _| {
            let labels = [
                ("topic", topic),
                ("partition", partition),
                ("reason", "age"),
            ];
            e.int(name, &labels, get(s));
        });
    }
}

/// Partition logs open, closed for idleness and swept, retention and lease-expiry loops
/// recovered from a panic.
pub(super) fn render_logs(e: &mut Expo, m: &Merged) {
    e.family(
        "narad_open_partition_logs",
        Kind::Gauge,
        "Partition logs open on this node.",
    );
    e.int("narad_open_partition_logs", &[], m.open_logs);
    e.family(
        "narad_idle_logs_evicted_total",
        Kind::Counter,
        "Partition logs whose files were closed after storage.idle_log_eviction_ms without use.",
    );
    e.int("narad_idle_logs_evicted_total", &[], m.idle_evicted);
    e.family(
        "narad_cold_retention_swept_total",
        Kind::Counter,
        "Retention passes that deleted segments of a partition whose log was closed for \
         idleness (every retention pass covers closed logs; there is no separate walk).",
    );
    e.int("narad_cold_retention_swept_total", &[], m.cold_swept);
    e.family(
        "narad_cold_retention_panics_total",
        Kind::Counter,
        "Retention passes (they cover closed logs too) that panicked and were recovered: the \
         loop goes on with its next pass.",
    );
    e.int("narad_cold_retention_panics_total", &[], m.retention_panics);
    e.family(
        "narad_reaper_restarts",
        Kind::Gauge,
        "Restarts of the lease-expiry loop after a panic, summed over the shards since start.",
    );
    e.int("narad_reaper_restarts", &[], m.reaper_restarts);
}

/// `narad_quarantined_copies` and `narad_quarantined_bytes`: 0, a node that is its whole
/// cluster moves no partitions.
pub(super) fn render_quarantine(e: &mut Expo) {
    for (name, help) in [
        (
            "narad_quarantined_copies",
            "Partition copies set aside after a move: 0, a node that is its whole cluster \
             moves no partitions.",
        ),
        (
            "narad_quarantined_bytes",
            "Bytes of partition copies set aside after a move: 0, a node that is its whole \
             cluster moves no partitions.",
        ),
    ] {
        e.family(name, Kind::Gauge, help);
        e.int(name, &[], 0);
    }
}

/// The write-ahead log's state and the records accepted for another shard's partition.
pub(super) fn render_ingress(e: &mut Expo, m: &Merged) {
    e.family(
        "narad_ingress_wal_failed",
        Kind::Gauge,
        "1 when a shard's write-ahead log stopped accepting writes after an I/O failure.",
    );
    e.int("narad_ingress_wal_failed", &[], u64::from(m.wal_failed));
    e.family(
        "narad_ingress_dispatch_backlog_records",
        Kind::Gauge,
        "Records accepted here (durable in the accepting shard's WAL) for a partition another shard or \
         node owns and not yet handed to it.",
    );
    e.int(
        "narad_ingress_dispatch_backlog_records",
        &[],
        m.transit_backlog,
    );
}

/// The data directory: orphan topic directories, bytes used and available, and when the
/// node's figures were collected (`narad_poller_last_success_timestamp_seconds`, §9.6).
pub(super) fn render_data_dir(e: &mut Expo, facts: &NodeFacts) {
    e.family(
        "narad_orphan_topic_dirs",
        Kind::Gauge,
        "Topic directories under the data directory whose topic the metadata no longer knows \
         (a delete that did not finish removing them).",
    );
    e.int("narad_orphan_topic_dirs", &[], facts.orphan_topic_dirs);
    e.family(
        "narad_data_dir_size_bytes",
        Kind::Gauge,
        "Bytes of files under the data directory.",
    );
    e.int("narad_data_dir_size_bytes", &[], facts.data_dir_size_bytes);
    e.family(
        "narad_poller_last_success_timestamp_seconds",
        Kind::Gauge,
        "Unix time the node's figures were last collected, by loop: vitals (data directory \
         size, measured at most every 5 s), inventory (topics and partitions, every scrape).",
    );
    for (lp, at) in [
        ("vitals", facts.vitals_collected_at_s),
        ("inventory", facts.inventory_collected_at_s),
    ] {
        e.float(
            "narad_poller_last_success_timestamp_seconds",
            &[("loop", lp)],
            at,
        );
    }
    if let Some(avail) = facts.data_dir_available_bytes {
        e.family(
            "narad_data_dir_available_bytes",
            Kind::Gauge,
            "Bytes available on the data directory's filesystem.",
        );
        e.int("narad_data_dir_available_bytes", &[], avail);
    }
}
