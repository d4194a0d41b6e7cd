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
        let mut m = Merged::empty();
        for s in shards {
            m.add_node_figures(s);
            m.add_schema(s);
            m.add_fanout(s);
            m.add_messages(s);
            m.add_partitions(s);
        }
        m
    }

    fn empty() -> Merged {
        Merged {
            http: BTreeMap::new(),
            traffic: HashMap::new(),
            topics: HashMap::new(),
            gauges: HashMap::new(),
            consume_wait: HashMap::new(),
            in_flight: 0,
            wal_failed: false,
            open_logs: 0,
            idle_evicted: 0,
            cold_swept: 0,
            retention_panics: 0,
            reaper_restarts: 0,
            transit_backlog: 0,
            schema: crate::schema::Counters::default(),
            fanout: narad_shard::fanout::FanoutCounters::default(),
            fanout_lag: BTreeMap::new(),
            fanout_links: BTreeMap::new(),
            expired: HashMap::new(),
            budget_rejections: 0,
            raft: None,
            partition_io: HashMap::new(),
            log_failures: LogFailures::default(),
            shards_poisoned: 0,
            schema_seconds: Histogram::new(&DURATION_BOUNDS_US),
        }
    }

    /// The shard's label-less counters and flags, and the Raft gauges if it hosts the group.
    fn add_node_figures(&mut self, s: &ShardMetrics) {
        self.log_failures.checkpoints += s.log_failures.checkpoints;
        self.log_failures.retention += s.log_failures.retention;
        self.shards_poisoned += u64::from(s.wal_failed);
        self.budget_rejections += s.budget_rejections;
        if s.raft.is_some() {
            self.raft.clone_from(&s.raft);
        }
        self.in_flight += s.in_flight;
        self.wal_failed |= s.wal_failed;
        self.open_logs += s.open_partition_logs;
        self.idle_evicted += s.idle_logs_evicted;
        self.cold_swept += s.cold_retention_swept;
        self.retention_panics += s.retention_panics;
        self.reaper_restarts += s.reaper_restarts;
        self.transit_backlog += s.transit_backlog;
    }

    fn add_schema(&mut self, s: &ShardMetrics) {
        self.schema_seconds
            .merge(&durations(&s.schema.slot_validation));
        let (sum, add) = (&mut self.schema, &s.schema);
        sum.validations += add.validations;
        sum.rejected_depth += add.rejected_depth;
        sum.rejected_malformed += add.rejected_malformed;
        sum.rejected_invalid += add.rejected_invalid;
        sum.rejected_busy += add.rejected_busy;
        sum.rejected_definition_paths += add.rejected_definition_paths;
        sum.rejected_definition_pattern += add.rejected_definition_pattern;
        sum.in_flight += add.in_flight;
    }

    /// Copy counters and batch buckets added up; a cursor's lag summed, its due lag the
    /// largest any shard reported.
    fn add_fanout(&mut self, s: &ShardMetrics) {
        let fanout = &mut self.fanout;
        for (a, b) in fanout.batch_records.iter_mut().zip(s.fanout.batch_records) {
            *a += b;
        }
        for (a, b) in fanout.batch_bytes.iter_mut().zip(s.fanout.batch_bytes) {
            *a += b;
        }
        fanout.batch_bytes_sum += s.fanout.batch_bytes_sum;
        fanout.copied += s.fanout.copied;
        fanout.unreadable += s.fanout.unreadable;
        fanout.failed_copies += s.fanout.failed_copies;
        for l in &s.fanout_lag {
            let e = self
                .fanout_lag
                .entry((l.parent.topic, l.child, l.parent.partition.0))
                .or_default();
            e.0 += l.lag_messages;
            e.1 = e.1.max(l.due_lag_ms);
        }
        for &(parent, child, k) in &s.fanout_links {
            let e = self.fanout_links.entry((parent, child)).or_default();
            e.copied += k.copied;
            e.dropped += k.dropped;
        }
    }

    /// HTTP series, traffic, topic counters, lapsed leases and consume waits, added up key by
    /// key (every shard records what it handled).
    fn add_messages(&mut self, s: &ShardMetrics) {
        for &(topic, n) in &s.leases_expired {
            *self.expired.entry(topic).or_default() += n;
        }
        for (k, v) in &s.http {
            match self.http.get_mut(k) {
                Some(e) => {
                    e.duration_us.merge(&v.duration_us);
                    e.bytes_in += v.bytes_in;
                    e.bytes_out += v.bytes_out;
                }
                None => {
                    self.http.insert(*k, v.clone());
                }
            }
        }
        for (k, v) in &s.traffic {
            let e = self.traffic.entry(*k).or_default();
            e.produced += v.produced;
            e.produced_bytes += v.produced_bytes;
            e.consumed += v.consumed;
            e.consumed_bytes += v.consumed_bytes;
        }
        for (k, v) in &s.topics {
            let e = self.topics.entry(*k).or_default();
            e.acked += v.acked;
            e.extended += v.extended;
            e.nacked += v.nacked;
            e.consume_empty += v.consume_empty;
            e.rejected_schema += v.rejected_schema;
            e.rejected_delayed_child += v.rejected_delayed_child;
            e.rejected_remote_child += v.rejected_remote_child;
        }
        for (k, v) in &s.consume_wait {
            match self.consume_wait.get_mut(k) {
                Some(h) => h.merge(v),
                None => {
                    self.consume_wait.insert(*k, v.clone());
                }
            }
        }
    }

    /// The gauges and storage figures of the partitions the shard owns: taken, not added (only
    /// the owner reports a partition).
    fn add_partitions(&mut self, s: &ShardMetrics) {
        self.partition_io.extend(s.partition_io.iter().copied());
        for (k, v) in &s.partitions {
            self.gauges.insert(*k, *v);
        }
    }
}
