//! Every shard's snapshot folded into the node's figures, the first step of a scrape.
//!
//! Owns the rule of each figure's merge: counters and histograms are added up over the shards,
//! a flag is set when any shard's is, a partition's gauges come from its owner (the only shard
//! that reports them), the Raft gauges from the shard that hosts the metadata group. Never reads
//! the node, never renders.

use std::collections::{BTreeMap, HashMap};

use narad_io::log::LogFailures;
use narad_io::partition::PartitionIoStats;
use narad_io::stats::DURATION_BOUNDS_US;
use narad_io::types::{PartitionKey, TopicId};

use super::durations;
use crate::metrics::expo::Histogram;
use crate::metrics::{HttpKey, HttpSeries, PartitionGauges, ShardMetrics, TopicCounters, Traffic};

/// The node's figures, merged from every shard's snapshot.
pub(crate) struct Merged {
    /// HTTP answers by route, method and status, in that order.
    pub http: BTreeMap<HttpKey, HttpSeries>,
    /// Produced and consumed messages and bytes, by partition.
    pub traffic: HashMap<PartitionKey, Traffic>,
    /// Settled leases, empty consumes and refused produces, by topic.
    pub topics: HashMap<TopicId, TopicCounters>,
    /// Queue and size gauges, by partition, from its owner.
    pub gauges: HashMap<PartitionKey, PartitionGauges>,
    /// `narad_consume_wait_seconds` by (topic, outcome).
    pub consume_wait: HashMap<(TopicId, &'static str), Histogram>,
    /// Requests being handled.
    pub in_flight: u64,
    /// Some shard's write-ahead log stopped accepting writes.
    pub wal_failed: bool,
    pub open_logs: u64,
    pub idle_evicted: u64,
    pub cold_swept: u64,
    pub retention_panics: u64,
    pub reaper_restarts: u64,
    /// Records accepted for a partition another shard owns, not yet handed to it.
    pub transit_backlog: u64,
    /// Schema validation counters (`slot_validation` is left empty: see `schema_seconds`).
    pub schema: crate::schema::Counters,
    /// Fan-out copy counters and batch-size buckets.
    pub fanout: narad_shard::fanout::FanoutCounters,
    /// Fan-out lag by (parent, child, parent partition): (records summed, due lag in ms at most).
    pub fanout_lag: BTreeMap<(TopicId, TopicId, u32), (u64, u64)>,
    /// Records copied and dropped by (parent, child).
    pub fanout_links: BTreeMap<(TopicId, TopicId), narad_shard::fanout::LinkCounts>,
    /// Lapsed leases, by topic.
    pub expired: HashMap<TopicId, u64>,
    pub budget_rejections: u64,
    /// From the shard that hosts the metadata group (the last one, should two report them).
    pub raft: Option<narad_raft::RaftGauges>,
    /// Storage figures, by partition, from its owner.
    pub partition_io: HashMap<PartitionKey, PartitionIoStats>,
    pub log_failures: LogFailures,
    /// Shards whose log stopped after a write or fsync failure.
    pub shards_poisoned: u64,
    /// `narad_schema_validation_seconds`.
    pub schema_seconds: Histogram,
}

impl Merged {
    /// Folds the shards' snapshots, in the order given.
    pub(crate) fn of(shards: &[ShardMetrics]) -> Merged {
        let mut http: BTreeMap<HttpKey, HttpSeries> = BTreeMap::new();
        let mut traffic: HashMap<PartitionKey, Traffic> = HashMap::new();
        let mut topics: HashMap<TopicId, TopicCounters> = HashMap::new();
        let mut gauges: HashMap<PartitionKey, PartitionGauges> = HashMap::new();
        let mut consume_wait: HashMap<(TopicId, &'static str), Histogram> = HashMap::new();
        let mut in_flight = 0u64;
        let mut wal_failed = false;
        let mut open_logs = 0u64;
        let mut idle_evicted = 0u64;
        let mut cold_swept = 0u64;
        let mut retention_panics = 0u64;
        let mut reaper_restarts = 0u64;
        let mut transit_backlog = 0u64;
        let mut schema = crate::schema::Counters::default();
        let mut fanout = narad_shard::fanout::FanoutCounters::default();
        let mut fanout_lag: BTreeMap<(TopicId, TopicId, u32), (u64, u64)> = BTreeMap::new();
        let mut fanout_links: BTreeMap<(TopicId, TopicId), narad_shard::fanout::LinkCounts> =
            BTreeMap::new();
        let mut expired: HashMap<TopicId, u64> = HashMap::new();
        let mut budget_rejections = 0u64;
        let mut raft = None;
        let mut partition_io: HashMap<PartitionKey, PartitionIoStats> = HashMap::new();
        let mut log_failures = LogFailures::default();
        let mut shards_poisoned = 0u64;
        let mut schema_seconds = Histogram::new(&DURATION_BOUNDS_US);
        for s in shards {
            partition_io.extend(s.partition_io.iter().copied());
            log_failures.checkpoints += s.log_failures.checkpoints;
            log_failures.retention += s.log_failures.retention;
            shards_poisoned += u64::from(s.wal_failed);
            schema_seconds.merge(&durations(&s.schema.slot_validation));
            for (a, b) in fanout.batch_records.iter_mut().zip(s.fanout.batch_records) {
                *a += b;
            }
            for (a, b) in fanout.batch_bytes.iter_mut().zip(s.fanout.batch_bytes) {
                *a += b;
            }
            fanout.batch_bytes_sum += s.fanout.batch_bytes_sum;
            budget_rejections += s.budget_rejections;
            if s.raft.is_some() {
                raft.clone_from(&s.raft);
            }
            in_flight += s.in_flight;
            wal_failed |= s.wal_failed;
            open_logs += s.open_partition_logs;
            idle_evicted += s.idle_logs_evicted;
            cold_swept += s.cold_retention_swept;
            retention_panics += s.retention_panics;
            reaper_restarts += s.reaper_restarts;
            transit_backlog += s.transit_backlog;
            schema.validations += s.schema.validations;
            schema.rejected_depth += s.schema.rejected_depth;
            schema.rejected_malformed += s.schema.rejected_malformed;
            schema.rejected_invalid += s.schema.rejected_invalid;
            schema.rejected_busy += s.schema.rejected_busy;
            schema.rejected_definition_paths += s.schema.rejected_definition_paths;
            schema.rejected_definition_pattern += s.schema.rejected_definition_pattern;
            schema.in_flight += s.schema.in_flight;
            fanout.copied += s.fanout.copied;
            fanout.unreadable += s.fanout.unreadable;
            fanout.failed_copies += s.fanout.failed_copies;
            for l in &s.fanout_lag {
                let e = fanout_lag
                    .entry((l.parent.topic, l.child, l.parent.partition.0))
                    .or_default();
                e.0 += l.lag_messages;
                e.1 = e.1.max(l.due_lag_ms);
            }
            for &(parent, child, k) in &s.fanout_links {
                let e = fanout_links.entry((parent, child)).or_default();
                e.copied += k.copied;
                e.dropped += k.dropped;
            }
            for &(topic, n) in &s.leases_expired {
                *expired.entry(topic).or_default() += n;
            }
            for (k, v) in &s.http {
                match http.get_mut(k) {
                    Some(e) => {
                        e.duration_us.merge(&v.duration_us);
                        e.bytes_in += v.bytes_in;
                        e.bytes_out += v.bytes_out;
                    }
                    None => {
                        http.insert(*k, v.clone());
                    }
                }
            }
            for (k, v) in &s.traffic {
                let e = traffic.entry(*k).or_default();
                e.produced += v.produced;
                e.produced_bytes += v.produced_bytes;
                e.consumed += v.consumed;
                e.consumed_bytes += v.consumed_bytes;
            }
            for (k, v) in &s.topics {
                let e = topics.entry(*k).or_default();
                e.acked += v.acked;
                e.extended += v.extended;
                e.nacked += v.nacked;
                e.consume_empty += v.consume_empty;
                e.rejected_schema += v.rejected_schema;
                e.rejected_delayed_child += v.rejected_delayed_child;
            }
            for (k, v) in &s.partitions {
                gauges.insert(*k, *v);
            }
            for (k, v) in &s.consume_wait {
                match consume_wait.get_mut(k) {
                    Some(h) => h.merge(v),
                    None => {
                        consume_wait.insert(*k, v.clone());
                    }
                }
            }
        }
        Merged {
            http,
            traffic,
            topics,
            gauges,
            consume_wait,
            in_flight,
            wal_failed,
            open_logs,
            idle_evicted,
            cold_swept,
            retention_panics,
            reaper_restarts,
            transit_backlog,
            schema,
            fanout,
            fanout_lag,
            fanout_links,
            expired,
            budget_rejections,
            raft,
            partition_io,
            log_failures,
            shards_poisoned,
            schema_seconds,
        }
    }
}
