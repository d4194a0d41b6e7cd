//! `/metrics`: the `narad_*` series of OPERATIONS.md §9 that a single node has today, in the
//! Prometheus text format.
//!
//! Owns the node-wide answer: the shard that answers a scrape asks every shard for its snapshot
//! of the recorder (`crate::metrics::ShardMetrics`, taken by `Node::metrics_snapshot`) over the
//! mesh, merges them and renders one document ([`render`]). Never touches another shard's state
//! directly, never blocks a request on a scrape.
//!
//! Layout. [`render`] does three things in turn: `merge` folds the shards' snapshots into one
//! `Merged` (counters and histograms added up, partition gauges from their owner), `facts`
//! reads what only the node knows (`NodeFacts`: its directories, configuration, clock and the
//! scrape's caches), and `render_doc`, a pure function of those values, writes the document.
//! `render_doc` is its table of contents: one call per family group, in document order, to the
//! file of its OPERATIONS.md §9 section (`http`, `messages`, `partitions`, `storage`, `schema`,
//! `fanout`, `auth`, `raft`, `cluster`, `remote`, `process`, `shards`). Only `facts` reads the
//! node; the renderers never do. `tests` snapshots the whole document byte for byte
//! (`testdata/`): a new series goes in its section's file, is called from `render_doc` where
//! it belongs in the document, and updates the snapshots.
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
//! its whole cluster are exported with that value (no moves, no member draining, quarantined
//! copies, member heartbeats and dead marking, the co-location of child partitions). Retention covers partition logs closed for
//! idleness on every pass (`narad_cold_retention_swept_total` counts those it deleted from);
//! a retention pass or lease-expiry pass that panics is counted
//! (`narad_cold_retention_panics_total`, `narad_reaper_restarts`) and its loop goes on.
//! `narad_metastore_fsm_bytes` is the bytes of the metastore directory (log,
//! vote, snapshot); the pollers' timestamps are when the scrape collected the figures. Not
//! present: the remote plane (§9.4 `narad_fanout_remote_*`, `narad_remote_*`), cluster RPC and
//! Raft TLS. Status `499` is recorded for a long-poll whose client went away while it waited;
//! other requests run to their answer.

use narad_io::stats::{Durations, DURATION_BOUNDS_US};

use crate::http::Response;
use crate::metrics::expo::{Expo, Histogram};
use crate::metrics::ShardMetrics;
use crate::node::Node;

mod auth;
mod cluster;
mod facts;
mod fanout;
mod http;
mod merge;
mod messages;
mod partitions;
mod process;
mod raft;
mod remote;
mod schema;
mod shards;
mod storage;
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
    // §9.1 HTTP.
    http::render_requests(&mut e, m);
    http::render_bytes(&mut e, m);
    http::render_in_flight(&mut e, m);
    // §9.1 and §9.2 messages, by partition and by topic.
    messages::render_traffic(&mut e, meta, m);
    messages::render_topic_counters(&mut e, meta, m);
    messages::render_produce_rejections(&mut e, meta, m);
    messages::render_lease_expired(&mut e, meta, m);
    messages::render_consume_wait(&mut e, meta, m);
    // §9.2 queue health and §9.5 sizes, per partition from its owner shard.
    partitions::render_gauges(&mut e, meta, m);
    partitions::render_oldest_unconsumed(&mut e, meta, m);
    partitions::render_topic_bytes(&mut e, meta, m);
    // §9.5 storage, per partition.
    storage::render_partitions(&mut e, meta, m);
    // §9.3 schema.
    schema::render(&mut e, m);
    // §9.4 fan-out (local children).
    fanout::render_lag(&mut e, meta, m);
    fanout::render_links(&mut e, meta, m);
    fanout::render_copies(&mut e, m);
    // §9.6 auth, Raft and the metastore.
    auth::render(&mut e, facts);
    raft::render_applied_index(&mut e, meta);
    if let Some(r) = &m.raft {
        let health = facts
            .metastore
            .as_ref()
            .expect("the metastore's health is gathered with the Raft gauges");
        raft::render_raft(&mut e, r);
        raft::render_metastore(&mut e, r);
        raft::render_metastore_health(&mut e, health);
        cluster::render_membership(&mut e, r, health);
    }
    // §9.4 remote plane and the planes this build does not run; §9.6 cluster.
    remote::render(&mut e, facts, shards, meta);
    cluster::render_tls(&mut e, facts);
    cluster::render_rpc(&mut e, shards);
    cluster::render_moves(&mut e, facts, meta);
    cluster::render_placement(&mut e, meta, facts);
    // The node's own series, then the families that sit next to them in the document.
    process::render_errors(&mut e, m);
    process::render_boot(&mut e, facts);
    http::render_budget_rejections(&mut e, m);
    partitions::render_ack_rejected(&mut e);
    process::render_inventory(&mut e, meta);
    // §9.5 storage, node-wide.
    storage::render_logs(&mut e, m);
    storage::render_quarantine(&mut e);
    storage::render_ingress(&mut e, m);
    storage::render_data_dir(&mut e, facts);
    // Per shard: the group commit and queue depths.
    shards::render_wal(&mut e, shards);
    shards::render(&mut e, shards);
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
