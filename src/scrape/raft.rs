//! §9.6 Raft and the metastore: the metadata applied on this node, the Raft group's state and
//! indexes, the state machine's snapshots and apply failures, its bytes on disk and whether
//! applying stalls. Apart from the applied index, from the shard that hosts the metadata group.
//!
//! Owns the rendering of those families from the metadata, the merged Raft gauges and the
//! node's facts; never reads the node.

use narad_raft::{MetaState, RaftGauges};

use super::MetastoreFacts;
use crate::metrics::expo::{Expo, Kind};

/// `narad_metastore_applied_index`.
pub(super) fn render_applied_index(e: &mut Expo, meta: &MetaState) {
    e.family(
        "narad_metastore_applied_index",
        Kind::Gauge,
        "Raft log index of the last metadata change applied on this node.",
    );
    e.int("narad_metastore_applied_index", &[], meta.applied_index);
}

/// The `narad_raft_*` gauges.
pub(super) fn render_raft(e: &mut Expo, r: &RaftGauges) {
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

/// §9.6 metastore, from the shard that hosts the metadata group.
pub(super) fn render_metastore(e: &mut Expo, r: &RaftGauges) {
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

/// The metastore's bytes on disk and whether applying stalls.
pub(super) fn render_metastore_health(e: &mut Expo, h: &MetastoreFacts) {
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
}
