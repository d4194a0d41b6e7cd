//! One shard's snapshot of the metrics recorder and of the gauges of the partitions it owns,
//! for a scrape (`crate::scrape` merges every shard's and renders them).

use narad_io::types::{PartitionId, PartitionKey, UnixMillis};

use super::*;
use crate::metrics::expo::Histogram;
use crate::metrics::{PartitionGauges, ShardMetrics, WAL_BATCH_RECORDS_BOUNDS};

impl Node {
    /// This shard's snapshot of its recorder and of the gauges of the partitions it owns.
    pub fn metrics_snapshot(&self) -> ShardMetrics {
        let mesh_calls_pending = self.mesh.pending_calls();
        let m = &self.metrics;
        let meta = self.meta();
        let live = meta.topic_ids();
        // Deleted topics' counters go: their series disappear, their memory is freed.
        m.traffic
            .borrow_mut()
            .retain(|k, _| live.contains(&k.topic));
        m.topics.borrow_mut().retain(|k, _| live.contains(k));
        m.consume_wait
            .borrow_mut()
            .retain(|k, _| live.contains(&k.0));
        m.oldest_unsettled
            .borrow_mut()
            .retain(|k, _| live.contains(&k.topic));
        let log = self.host.log();
        let now = UnixMillis::now();
        let mut partitions = Vec::new();
        let mut partition_io = Vec::new();
        for t in meta.topics.values() {
            for p in 0..t.partitions {
                let key = PartitionKey {
                    topic: t.id,
                    partition: PartitionId(p),
                };
                if self.owner(key) != self.shard {
                    continue;
                }
                let s = self.host.stats(key);
                let (in_flight, acked_ahead, frontier) = self.host.queue_stats(key);
                let losses = self.host.consumer_losses(key);
                // Below the oldest stored offset nothing is left to read: retention took it.
                let at = frontier.max(s.oldest_offset);
                let age_ms = m.unsettled_age_ms(log, key, at, s.high_watermark, now);
                if let Some(io) = log.io_stats(key) {
                    partition_io.push((key, io));
                }
                partitions.push((
                    key,
                    PartitionGauges {
                        size_bytes: s.size_bytes,
                        segments: s.segments,
                        high_watermark: s.high_watermark.0,
                        frontier: frontier.0,
                        in_flight: in_flight as u64,
                        acked_ahead: acked_ahead as u64,
                        corrupt_skipped: losses.corrupt_skipped,
                        dropped: losses.dropped,
                        oldest_unconsumed_age_ms: age_ms,
                    },
                ));
            }
        }
        let (fanout_lag, fanout_links) = self.fanout_metrics();
        let wal = log.wal_stats();
        let fsync = narad_io::stats::wal_fsync();
        ShardMetrics {
            shard: self.shard.0,
            http: m
                .http
                .borrow()
                .iter()
                .map(|(k, v)| (*k, v.clone()))
                .collect(),
            in_flight: m.in_flight.get(),
            traffic: m.traffic.borrow().iter().map(|(k, v)| (*k, *v)).collect(),
            topics: m.topics.borrow().iter().map(|(k, v)| (*k, *v)).collect(),
            consume_wait: m
                .consume_wait
                .borrow()
                .iter()
                .map(|(k, v)| (*k, v.clone()))
                .collect(),
            partitions,
            partition_io,
            log_failures: log.failures(),
            wal_fsync_us: Histogram::from_counts(
                &narad_io::stats::FSYNC_BUCKET_BOUNDS_US,
                &fsync.buckets,
                fsync.sum_us,
            ),
            wal_batch_records: batch_records(&wal.batch_records.buckets, wal.records),
            wal_bytes_written: wal.bytes_written,
            wal_failed: log.poisoned().is_some(),
            open_partition_logs: log.open_logs() as u64,
            idle_logs_evicted: log.idle_logs_evicted(),
            cold_retention_swept: log.cold_retention_swept(),
            retention_panics: m.retention_panics.get(),
            reaper_restarts: m.reaper_restarts.get(),
            transit_backlog: self.transit.pending() as u64,
            mesh_calls_pending: mesh_calls_pending as u64,
            schema: crate::schema::counters(),
            fanout: self.fanout_counters(),
            fanout_lag,
            fanout_links,
            leases_expired: self.host.leases_expired(),
            budget_rejections: m.budget_rejections.get(),
            raft: self.raft_gauges(),
            rpc: narad_io::peer::stats::snapshot(),
            remotes: crate::metrics::remote::snapshot(),
            remote_held_bytes: crate::metrics::remote::held_bytes(),
            remote_check_failures: crate::metrics::remote::check_failures(),
        }
    }
}

/// The WAL's power-of-two batch-size buckets folded onto [`WAL_BATCH_RECORDS_BOUNDS`].
fn batch_records(log2: &[u64], records: u64) -> Histogram {
    let mut counts = [0u64; WAL_BATCH_RECORDS_BOUNDS.len() + 1];
    for (i, c) in log2.iter().enumerate() {
        counts[i.min(WAL_BATCH_RECORDS_BOUNDS.len())] += c;
    }
    Histogram::from_counts(&WAL_BATCH_RECORDS_BOUNDS, &counts, records)
}

impl Node {
    /// Every shard's metrics snapshot for a node-wide scrape, one mesh call each (a shard that
    /// does not answer is left out).
    pub async fn metrics_snapshots(&self) -> Vec<crate::metrics::ShardMetrics> {
        // The counts include every single produce this shard answered (crate::transit).
        self.transit.caught_up().await;
        let mut shards = Vec::with_capacity(self.shards as usize);
        for s in 0..self.shards {
            if s == self.shard.0 {
                shards.push(self.metrics_snapshot());
            } else if let Ok(ShardResp::Metrics(m)) = call_shard(
                &self.mesh,
                ShardId(s),
                ShardReq::Control(ShardControl::Metrics),
            )
            .await
            {
                shards.push(*m);
            }
        }
        shards
    }
}
