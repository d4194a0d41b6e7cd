//! `/metrics`: the `narad_*` series of OPERATIONS.md §9 that a single node has today, in the
//! Prometheus text format.
//!
//! Owns the node-wide answer: the shard that answers a scrape asks every shard for its snapshot
//! of the recorder (`crate::metrics::ShardMetrics`, taken by `Node::metrics_snapshot`) over the
//! mesh, merges them and renders one document ([`render`]). Never touches another shard's state
//! directly, never blocks a request on a scrape.
//!
//! What is counted where. HTTP series are recorded by `crate::metrics::observe` around every
//! handled request, and for answers the HTTP layer gives without the handler. Message counters
//! are recorded on the shard that accepted the request (a single node: the node-wide sum is the owner's count
//! the spec asks for). Partition gauges (lag, in flight, acked ahead, sizes) are read from the
//! owner shard at scrape time, so they are always current (the spec's 5 s refresh is an upper
//! bound). Every bounded map has a named maximum: beyond it new series are dropped, never
//! unbounded memory.
//!
//! Storage (§9.5) figures are kept by each partition's log on its owner shard
//! (`narad_io::partition::PartitionIoStats`) and read at scrape time: a segment write is one
//! flush (timed per commit batch, never per record), a partition's share of a checkpoint gives
//! `narad_storage_fsync_duration_seconds` (its fsyncs) and
//! `narad_storage_high_watermark_persist_duration_seconds` (the whole share: there is no `hwm`
//! file here, the checkpoint is what makes a partition's high watermark durable without the
//! WAL), and a retention pass is timed whole. Their histograms are exported for the partitions
//! whose owner holds a log, their counters for every partition. The oldest unconsumed age is the
//! commit time of the record at the committed frontier (or the oldest stored offset, if
//! retention passed the frontier), read from the log once per frontier position.
//!
//! Deviations, deliberate: one WAL fsync per shard covers every partition of a batch, so the
//! group commit's fsync is `narad_wal_fsync_duration_seconds{shard}` with
//! `narad_wal_batch_records{shard}` (records per group commit), next to the per-partition
//! checkpoint fsyncs of the spec's series. Added series (no spec name
//! covers them): `narad_messages_acked_total{topic}`, `narad_shard_*{shard}` queue depths,
//! `narad_lease_expired_total{topic}` (lapsed leases, each one a redelivery; nacks are
//! `narad_nack_total`), `narad_schema_validations_total` (every validation; the spec's
//! `narad_schema_validation_seconds` times only those under the validation slot, as the
//! original does), `narad_fanout_unreadable_skipped_total` and
//! `narad_fanout_copy_failures_total`. The fan-out copy counters
//! (`narad_fanout_committed_total`, `narad_fanout_child_dropped_messages`, per `parent`/`child`)
//! count since the node started. Schema
//! rejections count the reasons the validator records (`depth`, `malformed`, `invalid`, `busy`)
//! and the registration refusals (`definition_paths`, `definition_pattern`); `canceled` stays 0,
//! as a produce's validation runs to its answer.
//! The §9.6 Raft and metastore gauges (`narad_raft_*`, `narad_metastore_*`) come from the shard
//! that hosts the metadata group; `narad_boot_duration_seconds` and
//! `narad_http_batch_body_budget_rejections_total` are node-wide; `narad_ack_rejected_total` is
//! registered without samples, as in the original. `narad_consumer_corrupt_skipped_total`,
//! `narad_consumer_dropped_messages` and the storage figures count since the owner shard
//! started (they restart at 0). The cluster series whose meaning is settled for a node that is
//! its whole cluster are exported with that value (no moves, no member draining, no remotes
//! held, quarantined copies, member heartbeats and dead marking, the co-location of child
//! partitions, `remote_child` produce rejections). Retention covers partition logs closed for
//! idleness on every pass (`narad_cold_retention_swept_total` counts those it deleted from);
//! a retention pass or lease-expiry pass that panics is counted
//! (`narad_cold_retention_panics_total`, `narad_reaper_restarts`) and its loop goes on.
//! `narad_metastore_fsm_bytes` is the bytes of the metastore directory (log,
//! vote, snapshot); the pollers' timestamps are when the scrape collected the figures. Not
//! present: the remote plane (§9.4 `narad_fanout_remote_*`, `narad_remote_*`), cluster RPC and
//! Raft TLS. Status `499` is recorded for a long-poll whose client went away while it waited;
//! other requests run to their answer.

use std::collections::{BTreeMap, HashMap};

use narad_io::partition::PartitionIoStats;
use narad_io::stats::{Durations, DURATION_BOUNDS_US};
use narad_io::types::{PartitionId, PartitionKey, TopicId};
use narad_shard::fanout::{LinkCounts, FANOUT_BATCH_BYTES_BOUNDS, FANOUT_BATCH_RECORDS_BOUNDS};

use crate::http::Response;
use crate::metrics::expo::{Expo, Histogram, Kind};
use crate::metrics::*;
use crate::node::Node;

mod facts;
mod merge;
#[cfg(test)]
mod tests;

pub use facts::APPLY_STALL_AFTER;
pub(crate) use facts::{MetastoreFacts, NodeFacts};
pub(crate) use merge::Merged;

/// `/metrics` as the API port answers it: `404` when a separate metrics listener is configured
/// (API.md §15.3), else the node-wide document. (Whether credentials are needed first is the
/// authentication step's decision: `HttpConfig::metrics_need_credentials`.)
pub async fn api_port_response(node: &Node) -> Response {
    if !node.config.http.metrics_addr.is_empty() {
        return Response::text(404, "404 page not found\n");
    }
    document(node).await
}

/// The node-wide `/metrics` document: every shard's snapshot, merged and rendered.
pub async fn document(node: &Node) -> Response {
    let shards = node.metrics_snapshots().await;
    response(render(node, shards))
}

/// A storage timing as a histogram of seconds' worth of microseconds.
fn durations(d: &Durations) -> Histogram {
    Histogram::from_counts(&DURATION_BOUNDS_US, &d.buckets, d.sum_us)
}

/// §9.5 per partition: segment writes, checkpoint shares and retention passes. Counters for
/// every partition of every topic (0 until the owner did the work); histograms for the
/// partitions whose owner holds a log (one was written, or recovered, since the shard started).
fn render_partition_storage(
    e: &mut Expo,
    meta: &narad_raft::MetaState,
    io: &HashMap<PartitionKey, PartitionIoStats>,
) {
    let blank = PartitionIoStats::default();
    let each = |f: &mut dyn FnMut(&str, &str, &PartitionIoStats, bool)| {
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
    };
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
        each(&mut |topic, partition, s, open| {
            if open {
                let labels = [("topic", topic), ("partition", partition)];
                e.histogram(name, &labels, &durations(get(s)), 1e6);
            }
        });
    }
    let name = "narad_storage_high_watermark_persist_duration_seconds";
    e.family(
        name,
        Kind::Histogram,
        "Time spent making the partition's high watermark durable without the write-ahead log: \
         its share of a checkpoint (segment fsyncs, index and consumer state files), by outcome.",
    );
    each(&mut |topic, partition, s, open| {
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
    let name = "narad_storage_flush_bytes_total";
    e.family(
        name,
        Kind::Counter,
        "Bytes of record frames written to the partition's segment files.",
    );
    each(&mut |topic, partition, s, _| {
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
        each(&mut |topic, partition, s, _| {
            let labels = [
                ("topic", topic),
                ("partition", partition),
                ("reason", "age"),
            ];
            e.int(name, &labels, get(s));
        });
    }
}

/// §9.6 metastore, from the shard that hosts the metadata group.
fn render_metastore(e: &mut Expo, r: &narad_raft::RaftGauges) {
    e.family(
        "narad_metastore_apply_errors_total",
        Kind::Counter,
        "Raft entries the metadata state machine could not apply, by kind (storage: reading them \
         from the Raft log failed; the group then stops).",
    );
    e.int(
        "narad_metastore_apply_errors_total",
        &[("kind", "storage")],
        r.store.apply_errors_storage,
    );
    e.family(
        "narad_metastore_apply_stopped",
        Kind::Gauge,
        "1 once the metadata group stopped on a fatal error and applies no more entries.",
    );
    e.int(
        "narad_metastore_apply_stopped",
        &[],
        u64::from(r.apply_stopped),
    );
    e.family(
        "narad_metastore_snapshot_bytes",
        Kind::Gauge,
        "Size of the last metadata snapshot this process wrote (0 before the first).",
    );
    e.int(
        "narad_metastore_snapshot_bytes",
        &[],
        r.store.snapshot_bytes,
    );
    e.family(
        "narad_metastore_snapshot_duration_seconds",
        Kind::Gauge,
        "How long that snapshot took, from the copy of the state to the synced file.",
    );
    e.float(
        "narad_metastore_snapshot_duration_seconds",
        &[],
        r.store.snapshot_duration_us as f64 / 1e6,
    );
    e.family(
        "narad_metastore_snapshot_failures_total",
        Kind::Counter,
        "Metadata snapshots that failed or were put off because their file could not be allocated (the log keeps its entries; Raft asks again).",
    );
    e.int(
        "narad_metastore_snapshot_failures_total",
        &[],
        r.store.snapshot_failures,
    );
}

/// The §9.6 metastore and membership health series: the metastore's bytes on disk, whether
/// applying stalls, and the member-heartbeat and dead-marking gauges, whose meaning is settled
/// for a node that is its whole cluster (it is its own leader: no heartbeat travels, no other
/// member can be marked dead).
fn render_metastore_health(e: &mut Expo, h: &MetastoreFacts, r: &narad_raft::RaftGauges) {
    e.family(
        "narad_metastore_fsm_bytes",
        Kind::Gauge,
        "Bytes of the metadata state machine's files on disk (Raft log, vote and snapshot).",
    );
    e.int("narad_metastore_fsm_bytes", &[], h.fsm_bytes);
    e.family(
        "narad_metastore_apply_stalled",
        Kind::Gauge,
        "1 when committed metadata entries wait and the applied index has not moved for 10 s \
         (judged between scrapes).",
    );
    e.int(
        "narad_metastore_apply_stalled",
        &[],
        u64::from(h.apply_stalled),
    );
    e.family(
        "narad_member_heartbeat_failures",
        Kind::Gauge,
        "Heartbeats to the leader that failed in a row: 0, a node that is its whole cluster \
         is its own leader and sends none.",
    );
    e.int("narad_member_heartbeat_failures", &[], 0);
    if let Some(at) = h.heartbeat_last_success_s {
        e.family(
            "narad_member_heartbeat_last_success_timestamp_seconds",
            Kind::Gauge,
            "Unix time this node last knew its leader alive (now while it leads).",
        );
        e.float(
            "narad_member_heartbeat_last_success_timestamp_seconds",
            &[],
            at,
        );
    }
    if r.state == "leader" {
        e.family(
            "narad_dead_marking_refused",
            Kind::Gauge,
            "Members the leader would mark dead but may not (no healthy majority): 0, there is \
             no other member.",
        );
        e.int("narad_dead_marking_refused", &[], 0);
    }
}

/// Upper bounds (seconds) of `narad_moves_duration_seconds`.
static MOVE_DURATION_BOUNDS_S: [u64; 10] = [1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600];

/// Label-less §9.4 series of the remote plane, zero on a node that holds no remotes.
const REMOTE_ZERO_SERIES: [(&str, Kind, &str); 3] = [
    (
        "narad_remote_held_bytes",
        Kind::Gauge,
        "Bytes of remote-child records held for sending (no remotes on this node).",
    ),
    (
        "narad_remote_seals_total",
        Kind::Counter,
        "Remote credentials sealed (no remotes on this node).",
    ),
    (
        "narad_remote_reseal_opens_total",
        Kind::Counter,
        "Remote credentials opened to be resealed (no remotes on this node).",
    ),
];

/// OPERATIONS.md §9.4 and §9.6 families with labels whose series only a remote plane, node RPC
/// or Raft TLS would produce; this build runs none of them, so they carry no series.
const UNUSED_PLANE_FAMILIES: [(&str, Kind, &str); 26] = [
    (
        "narad_fanout_remote_state",
        Kind::Gauge,
        "State of a remote child's partition.",
    ),
    (
        "narad_fanout_remote_lag_seconds",
        Kind::Gauge,
        "Age of a remote child's oldest unsent record.",
    ),
    (
        "narad_fanout_remote_retention_headroom_seconds",
        Kind::Gauge,
        "Time before a remote child's unsent records age out of the parent's retention.",
    ),
    (
        "narad_fanout_remote_last_success_timestamp_seconds",
        Kind::Gauge,
        "When a remote child last delivered a batch.",
    ),
    (
        "narad_fanout_remote_check_failures_total",
        Kind::Counter,
        "Failed remote child checks.",
    ),
    (
        "narad_fanout_remote_skipped_records_total",
        Kind::Counter,
        "Records skipped for a remote child.",
    ),
    (
        "narad_remote_requests_total",
        Kind::Counter,
        "Requests to a remote, by status code.",
    ),
    (
        "narad_remote_request_seconds",
        Kind::Histogram,
        "Duration of requests to a remote.",
    ),
    (
        "narad_remote_inflight_wait_seconds",
        Kind::Histogram,
        "Wait for an in-flight slot of a remote.",
    ),
    (
        "narad_remote_rtt_seconds",
        Kind::Gauge,
        "Round-trip time to a remote.",
    ),
    (
        "narad_remote_gate_backoff_seconds",
        Kind::Gauge,
        "Current back-off of a remote's gate.",
    ),
    (
        "narad_remote_chunk_bytes_limit",
        Kind::Gauge,
        "Largest chunk sent to a remote.",
    ),
    (
        "narad_remote_errors_total",
        Kind::Counter,
        "Errors talking to a remote, by class.",
    ),
    (
        "narad_remote_resent_records_total",
        Kind::Counter,
        "Records sent to a remote again.",
    ),
    (
        "narad_remote_wire_bytes_total",
        Kind::Counter,
        "Bytes sent to a remote on the wire.",
    ),
    (
        "narad_remote_body_bytes_total",
        Kind::Counter,
        "Body bytes sent to a remote.",
    ),
    (
        "narad_remote_credential_decrypts_total",
        Kind::Counter,
        "Decryptions of a remote's credential.",
    ),
    (
        "narad_remote_credential_state",
        Kind::Gauge,
        "State of a remote's credential.",
    ),
    (
        "narad_remote_credential_age_seconds",
        Kind::Gauge,
        "Age of a remote's credential.",
    ),
    (
        "narad_remote_credential_key_current",
        Kind::Gauge,
        "1 when a remote's credential uses the current key.",
    ),
    (
        "narad_remote_key_seals",
        Kind::Gauge,
        "Credentials sealed with a key.",
    ),
    (
        "narad_remote_key_age_seconds",
        Kind::Gauge,
        "Age of a sealing key.",
    ),
    (
        "narad_remote_destination_refused_total",
        Kind::Counter,
        "Remote destinations refused by the address guard, by reason.",
    ),
    (
        "narad_raft_tls_cert_not_after_seconds",
        Kind::Gauge,
        "Expiry of the Raft TLS certificates.",
    ),
    (
        "narad_cluster_rpc_requests_total",
        Kind::Counter,
        "Node-to-node RPCs, by op and outcome.",
    ),
    (
        "narad_cluster_rpc_request_seconds",
        Kind::Histogram,
        "Duration of node-to-node RPCs, by op.",
    ),
];

/// §9.4 and §9.6 series of the cluster and remote planes whose meaning is settled for a node
/// that is its whole cluster: no partition moves (there is no other node), no member draining
/// (a decommission is refused), no remotes held; the allowlist and co-location are facts of
/// this node's configuration and metadata.
fn render_cluster(e: &mut Expo, facts: &NodeFacts, meta: &narad_raft::MetaState) {
    e.family(
        "narad_remotes_allowlist_configured",
        Kind::Gauge,
        "1 when remotes.allowed_hosts is set on this node.",
    );
    e.int(
        "narad_remotes_allowlist_configured",
        &[],
        u64::from(facts.remotes_allowlist_configured),
    );
    e.family(
        "narad_remotes_plaintext_raft",
        Kind::Gauge,
        "1 when this node holds remotes and its Raft transport runs without TLS (it holds none).",
    );
    e.int("narad_remotes_plaintext_raft", &[], 0);
    // No remotes are held and nothing is sealed here: the label-less series are zero.
    for (name, kind, help) in REMOTE_ZERO_SERIES {
        e.family(name, kind, help);
        e.int(name, &[], 0);
    }
    // Families of the planes this node does not run: declared, so that dashboards and alerts
    // that name them find them, with no series (as `narad_ack_rejected_total`).
    for (name, kind, help) in UNUSED_PLANE_FAMILIES {
        e.family(name, kind, help);
    }
    e.family(
        "narad_moves_inflight",
        Kind::Gauge,
        "Partition moves this node runs as the destination (none: a single node).",
    );
    e.int("narad_moves_inflight", &[], 0);
    e.family(
        "narad_moves_total",
        Kind::Counter,
        "Finished partition moves, by outcome.",
    );
    for outcome in ["completed", "force_promoted"] {
        e.int("narad_moves_total", &[("outcome", outcome)], 0);
    }
    e.family(
        "narad_moves_duration_seconds",
        Kind::Histogram,
        "Time from a move starting to the ownership change.",
    );
    e.histogram(
        "narad_moves_duration_seconds",
        &[],
        &Histogram::new(&MOVE_DURATION_BOUNDS_S),
        1.0,
    );
    e.family(
        "narad_moves_bytes_total",
        Kind::Counter,
        "Bytes copied by finished moves.",
    );
    e.int("narad_moves_bytes_total", &[], 0);
    e.family(
        "narad_moves_blocked",
        Kind::Gauge,
        "Moves that cannot finish on their own, by reason.",
    );
    for reason in [
        "copy_unverifiable",
        "source_dead_copy_behind",
        "source_dead",
        "target_dead",
    ] {
        e.int("narad_moves_blocked", &[("reason", reason)], 0);
    }
    e.family(
        "narad_decommission_blocked",
        Kind::Gauge,
        "1 per reason a draining node's decommission cannot progress (no series: no node drains).",
    );
    e.family(
        "narad_colocated_child_partitions",
        Kind::Gauge,
        "Fan-out child partitions on the same node as their parent's partition of the same \
         index (on a single node, every child partition whose index the parent has).",
    );
    let colocated: u64 = meta
        .topics
        .values()
        .filter_map(|c| {
            let parent = meta.topic(c.parent.as_deref()?)?;
            Some(u64::from(c.partitions.min(parent.partitions)))
        })
        .sum();
    e.int("narad_colocated_child_partitions", &[], colocated);
}

/// Merges every shard's snapshot and renders the node's `/metrics` document.
pub fn render(node: &Node, shards: Vec<ShardMetrics>) -> String {
    let meta = node.meta();
    let merged = Merged::of(&shards);
    let facts = NodeFacts::gather(node, &meta, merged.raft.as_ref());
    render_doc(&meta, &merged, &facts, &shards)
}

/// The `/metrics` document of plain values: the metadata, the shards' figures merged, the
/// node's own figures and every shard's snapshot (for the per-shard series). Pure: the same
/// inputs render the same bytes.
pub(crate) fn render_doc(
    meta: &narad_raft::MetaState,
    m: &Merged,
    facts: &NodeFacts,
    shards: &[ShardMetrics],
) -> String {
    let mut e = Expo::new();

    // §9.1 traffic and HTTP.
    e.family(
        "narad_http_requests_total",
        Kind::Counter,
        "HTTP answers by matched route, method and status.",
    );
    for (k, v) in &m.http {
        let status = k.status.to_string();
        let labels = [
            ("route", k.route),
            ("method", k.method),
            ("status", status.as_str()),
        ];
        e.int("narad_http_requests_total", &labels, v.duration_us.count());
    }
    e.family(
        "narad_http_request_duration_seconds",
        Kind::Histogram,
        "Time from a request's body being read to its answer.",
    );
    for (k, v) in &m.http {
        let status = k.status.to_string();
        let labels = [
            ("route", k.route),
            ("method", k.method),
            ("status", status.as_str()),
        ];
        e.histogram(
            "narad_http_request_duration_seconds",
            &labels,
            &v.duration_us,
            1e6,
        );
    }
    let mut by_route: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for (k, v) in &m.http {
        let r = by_route.entry(k.route).or_default();
        r.0 += v.bytes_in;
        r.1 += v.bytes_out;
    }
    e.family(
        "narad_http_request_bytes_in_total",
        Kind::Counter,
        "Request body bytes by route.",
    );
    for (route, (bytes_in, _)) in &by_route {
        e.int(
            "narad_http_request_bytes_in_total",
            &[("route", route)],
            *bytes_in,
        );
    }
    e.family(
        "narad_http_response_bytes_out_total",
        Kind::Counter,
        "Response body bytes by route.",
    );
    for (route, (_, bytes_out)) in &by_route {
        e.int(
            "narad_http_response_bytes_out_total",
            &[("route", route)],
            *bytes_out,
        );
    }
    e.family(
        "narad_http_requests_in_flight",
        Kind::Gauge,
        "Requests being handled.",
    );
    e.int("narad_http_requests_in_flight", &[], m.in_flight);

    // Per partition of every topic, in name order (zero until traffic).
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
            // A remote child needs the remote plane, which this build does not have
            // (API.md §18: attach answers 501/403), so no topic has one to refuse for.
            ("remote_child", 0),
        ] {
            e.int(
                "narad_produce_rejections_total",
                &[("topic", &t.name), ("reason", reason)],
                n,
            );
        }
    }

    e.family(
        "narad_lease_expired_total",
        Kind::Counter,
        "Leases whose visibility timeout passed (message released for redelivery), by topic.",
    );
    for t in meta.topics.values() {
        let n = m.expired.get(&t.id).copied().unwrap_or(0);
        e.int("narad_lease_expired_total", &[("topic", &t.name)], n);
    }

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

    // §9.2 queue health and §9.5 storage, per partition from its owner shard.
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
    render_partition_storage(&mut e, meta, &m.partition_io);

    // §9.3 schema.
    e.family(
        "narad_schema_validation_seconds",
        Kind::Histogram,
        "Time of each validation run under the validation slot (payloads over 16 KiB, costly \
         schemas), decoding included, the wait for the slot excluded; others are not timed.",
    );
    e.histogram(
        "narad_schema_validation_seconds",
        &[],
        &m.schema_seconds,
        1e6,
    );
    e.family(
        "narad_schema_validations_total",
        Kind::Counter,
        "Produce payloads validated against a topic schema.",
    );
    e.int("narad_schema_validations_total", &[], m.schema.validations);
    e.family(
        "narad_schema_validations_in_flight",
        Kind::Gauge,
        "Payload validations running now.",
    );
    e.int(
        "narad_schema_validations_in_flight",
        &[],
        m.schema.in_flight,
    );
    e.family(
        "narad_schema_rejections_total",
        Kind::Counter,
        "Produces refused by schema validation, by reason.",
    );
    for (reason, n) in [
        ("depth", m.schema.rejected_depth),
        ("malformed", m.schema.rejected_malformed),
        ("invalid", m.schema.rejected_invalid),
        ("busy", m.schema.rejected_busy),
        // A produce is not cancelled while it validates: the answer is computed even when the
        // client has gone (only long-polls notice a departed client).
        ("canceled", 0),
        ("definition_paths", m.schema.rejected_definition_paths),
        ("definition_pattern", m.schema.rejected_definition_pattern),
    ] {
        e.int("narad_schema_rejections_total", &[("reason", reason)], n);
    }

    // §9.4 fan-out (local children).
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

    // §9.6 auth.
    e.family(
        "narad_auth_verify_queued",
        Kind::Gauge,
        "Password verifications waiting or running on the helper threads.",
    );
    e.int("narad_auth_verify_queued", &[], facts.auth_verify_queued);

    e.family(
        "narad_metastore_applied_index",
        Kind::Gauge,
        "Raft log index of the last metadata change applied on this node.",
    );
    e.int("narad_metastore_applied_index", &[], meta.applied_index);
    if let Some(r) = &m.raft {
        e.family(
            "narad_raft_state",
            Kind::Gauge,
            "1 for this node's Raft state (follower, candidate, leader, shutdown), 0 for the others.",
        );
        for state in ["follower", "candidate", "leader", "shutdown"] {
            e.int(
                "narad_raft_state",
                &[("state", state)],
                u64::from(r.state == state),
            );
        }
        for (name, help, v) in [
            ("narad_raft_term", "Current Raft term.", r.term),
            (
                "narad_raft_last_log_index",
                "Index of the last Raft log entry.",
                r.last_log_index,
            ),
            (
                "narad_raft_commit_index",
                "Raft log index known committed by a quorum.",
                r.commit_index,
            ),
            (
                "narad_raft_applied_index",
                "Raft log index last applied to the metadata.",
                r.applied_index,
            ),
            (
                "narad_raft_fsm_pending",
                "Committed Raft entries not yet applied.",
                r.commit_index.saturating_sub(r.applied_index),
            ),
            (
                "narad_raft_has_leader",
                "1 when the group has a known leader.",
                u64::from(r.has_leader),
            ),
            (
                "narad_raft_voters",
                "Voting members of the Raft group.",
                r.voters,
            ),
            (
                "narad_raft_nonvoters",
                "Non-voting members of the Raft group.",
                r.nonvoters,
            ),
        ] {
            e.family(name, Kind::Gauge, help);
            e.int(name, &[], v);
        }
        if let Some(s) = r.last_contact_seconds {
            e.family(
                "narad_raft_last_contact_seconds",
                Kind::Gauge,
                "Seconds since this node last knew of a working leader.",
            );
            e.float("narad_raft_last_contact_seconds", &[], s);
        }
    }
    if let Some(r) = &m.raft {
        render_metastore(&mut e, r);
        let health = facts
            .metastore
            .as_ref()
            .expect("the metastore's health is gathered with the Raft gauges");
        render_metastore_health(&mut e, health, r);
    }
    render_cluster(&mut e, facts, meta);
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
    let boot_us = facts.boot_duration_us;
    if boot_us > 0 {
        e.family(
            "narad_boot_duration_seconds",
            Kind::Gauge,
            "Seconds from start until every shard was serving.",
        );
        e.float("narad_boot_duration_seconds", &[], boot_us as f64 / 1e6);
    }
    e.family(
        "narad_http_batch_body_budget_rejections_total",
        Kind::Counter,
        "Batch produce bodies refused (503) because the node's batch-body budget was spent.",
    );
    e.int(
        "narad_http_batch_body_budget_rejections_total",
        &[],
        m.budget_rejections,
    );
    e.family(
        "narad_ack_rejected_total",
        Kind::Counter,
        "Acks rejected, by reason (registered as in the original, which never increments it).",
    );
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
    e.family(
        "narad_ingress_wal_failed",
        Kind::Gauge,
        "1 when a shard's write-ahead log stopped accepting writes after an I/O failure.",
    );
    e.int("narad_ingress_wal_failed", &[], u64::from(m.wal_failed));
    e.family(
        "narad_ingress_dispatch_backlog_records",
        Kind::Gauge,
        "Records accepted here (durable in the accepting shard's WAL) for a partition another \
         shard owns and not yet handed to it.",
    );
    e.int(
        "narad_ingress_dispatch_backlog_records",
        &[],
        m.transit_backlog,
    );
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

    // Per shard: the group commit and queue depths.
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
    e.finish()
}

/// The content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A `/metrics` answer from a rendered document.
pub fn response(doc: String) -> Response {
    Response {
        status: 200,
        headers: vec![(
            std::borrow::Cow::Borrowed("Content-Type"),
            CONTENT_TYPE.into(),
        )],
        body: doc.into_bytes(),
    }
}
