//! §9.6 cluster series whose meaning is settled for a node that is its whole cluster: member
//! heartbeats and dead marking (it is its own leader), partition moves (none: there is no other
//! node), draining (a decommission is refused) and the co-location of child partitions (a fact
//! of the metadata).
//!
//! Owns the rendering of those families; never reads the node. The cluster's own series
//! (OPERATIONS.md §9.6) belong here.

use narad_raft::{MetaState, RaftGauges};

use super::MetastoreFacts;
use crate::metrics::expo::{Expo, Histogram, Kind};

/// Upper bounds (seconds) of `narad_moves_duration_seconds`.
static MOVE_DURATION_BOUNDS_S: [u64; 10] = [1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600];

/// The member-heartbeat and dead-marking gauges, next to the Raft gauges: a node that is its
/// whole cluster is its own leader (no heartbeat travels, no other member can be marked dead).
pub(super) fn render_membership(e: &mut Expo, r: &RaftGauges, h: &MetastoreFacts) {
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

/// Partition moves: none on a node that is its whole cluster.
pub(super) fn render_moves(e: &mut Expo) {
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
}

/// Draining (no node drains: the family has no series) and the co-location of child
/// partitions.
pub(super) fn render_placement(e: &mut Expo, meta: &MetaState) {
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
