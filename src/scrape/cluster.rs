//! §9.6 cluster series: member heartbeats and dead marking, the node-to-node requests sent,
//! partition moves (this node's as the destination, and the metadata's blocked ones), what
//! blocks each decommission (the leader's view) and the co-location of child partitions (a fact
//! of the metadata). A node that is its whole cluster is its own leader and moves nothing.
//!
//! Owns the rendering of those families; never reads the node. The cluster's own series
//! (OPERATIONS.md §9.6) belong here.

use std::collections::BTreeMap;

use narad_io::peer::{ops, stats::OpStats, stats::Outcome};
use narad_raft::{MetaState, RaftGauges};

use super::NodeFacts;
use super::{durations, MetastoreFacts};
use crate::metrics::expo::{Expo, Kind};
use crate::metrics::ShardMetrics;

/// The member-heartbeat and dead-marking gauges, next to the Raft gauges. A node that is its
/// whole cluster is its own leader: no heartbeat travels, no other member can be marked dead.
pub(super) fn render_membership(e: &mut Expo, r: &RaftGauges, h: &MetastoreFacts) {
    e.family(
        "narad_member_heartbeat_failures",
        Kind::Gauge,
        "Heartbeats to the metadata leader that failed in a row (0 on a node that is its \
         whole cluster: it sends none).",
    );
    e.int("narad_member_heartbeat_failures", &[], h.heartbeat_failures);
    if let Some(at) = h.heartbeat_last_success_s {
        e.family(
            "narad_member_heartbeat_last_success_timestamp_seconds",
            Kind::Gauge,
            "Unix time of this node's last heartbeat the leader recorded (on a node that is its \
             whole cluster: it last knew its leader alive, now while it leads).",
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
            "Members the leader would mark dead but may not (it would leave fewer alive voters \
             than a quorum).",
        );
        e.int("narad_dead_marking_refused", &[], h.dead_marking_refused);
    }
}

/// Partition moves this node runs and ran as the destination, and the moves of the metadata
/// that cannot finish on their own (none on a node that is its whole cluster).
pub(super) fn render_moves(e: &mut Expo, facts: &NodeFacts, meta: &MetaState) {
    e.family(
        "narad_moves_inflight",
        Kind::Gauge,
        "Partition moves this node runs as the destination.",
    );
    e.int("narad_moves_inflight", &[], facts.moves_inflight);
    e.family(
        "narad_moves_total",
        Kind::Counter,
        "Finished partition moves, by outcome.",
    );
    for outcome in ["completed", "force_promoted"] {
        let n = facts.moves.outcomes.get(outcome).copied().unwrap_or(0);
        e.int("narad_moves_total", &[("outcome", outcome)], n);
    }
    e.family(
        "narad_moves_duration_seconds",
        Kind::Histogram,
        "Time from a move starting to the ownership change.",
    );
    e.histogram(
        "narad_moves_duration_seconds",
        &[],
        &facts.moves.durations,
        1000.0,
    );
    e.family(
        "narad_moves_bytes_total",
        Kind::Counter,
        "Bytes copied by finished moves.",
    );
    e.int("narad_moves_bytes_total", &[], facts.moves.bytes);
    e.family(
        "narad_moves_blocked",
        Kind::Gauge,
        "Moves that cannot finish on their own, by reason.",
    );
    let dead = |id: &str| meta.members.get(id).is_none_or(|m| m.dead);
    let (mut source_dead, mut target_dead) = (0, 0);
    for m in meta.topics.values().flat_map(|t| t.moves.values()) {
        if dead(&m.source) {
            source_dead += 1;
        } else if dead(&m.target) {
            target_dead += 1;
        }
    }
    for (reason, n) in [
        ("copy_unverifiable", 0),
        ("source_dead_copy_behind", 0),
        ("source_dead", source_dead),
        ("target_dead", target_dead),
    ] {
        e.int("narad_moves_blocked", &[("reason", reason)], n);
    }
}

/// Draining (what blocks each decommission) and the co-location of child partitions.
pub(super) fn render_placement(e: &mut Expo, meta: &MetaState, facts: &NodeFacts) {
    e.family(
        "narad_decommission_blocked",
        Kind::Gauge,
        "1 per reason a draining node's decommission cannot progress (the leader's view).",
    );
    for (node, reason) in &facts.decommission_blocked {
        e.int(
            "narad_decommission_blocked",
            &[("node", node), ("reason", reason)],
            1,
        );
    }
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

/// Node-to-node requests this node sent, every shard's merged: counts by operation and outcome,
/// durations by operation. A node that is its whole cluster sends none (no series).
pub(super) fn render_rpc(e: &mut Expo, shards: &[ShardMetrics]) {
    let mut by_op: BTreeMap<u8, OpStats> = BTreeMap::new();
    for (op, st) in shards.iter().flat_map(|s| &s.rpc) {
        let m = by_op.entry(*op).or_default();
        for (a, b) in m.outcomes.iter_mut().zip(st.outcomes) {
            *a += b;
        }
        for (a, b) in m.seconds.buckets.iter_mut().zip(st.seconds.buckets) {
            *a += b;
        }
        m.seconds.sum_us = m.seconds.sum_us.saturating_add(st.seconds.sum_us);
    }
    e.family(
        "narad_cluster_rpc_requests_total",
        Kind::Counter,
        "Node-to-node RPCs this node sent, by op and outcome.",
    );
    for (op, st) in &by_op {
        for (i, outcome) in Outcome::LABELS.iter().enumerate() {
            e.int(
                "narad_cluster_rpc_requests_total",
                &[("op", ops::name(*op)), ("outcome", outcome)],
                st.outcomes[i],
            );
        }
    }
    e.family(
        "narad_cluster_rpc_request_seconds",
        Kind::Histogram,
        "Duration of node-to-node RPCs this node sent, by op.",
    );
    for (op, st) in &by_op {
        e.histogram(
            "narad_cluster_rpc_request_seconds",
            &[("op", ops::name(*op))],
            &durations(&st.seconds),
            1e6,
        );
    }
}

/// The cluster port's TLS certificates' expiry (no series without cluster TLS).
pub(super) fn render_tls(e: &mut Expo, facts: &super::NodeFacts) {
    e.family(
        "narad_raft_tls_cert_not_after_seconds",
        Kind::Gauge,
        "Expiry (Unix seconds) of the cluster port's TLS certificates: this node's (leaf) and \
         the soonest of the CA file's (ca).",
    );
    for (kind, at) in &facts.cluster_tls_not_after {
        e.int(
            "narad_raft_tls_cert_not_after_seconds",
            &[("kind", kind)],
            (*at).max(0) as u64,
        );
    }
}
