//! What the `/metrics` document needs from the node itself rather than from the shards'
//! snapshots: its files (the data and metastore directories), its configuration, the clock,
//! boot timing and the scrape's own caches.
//!
//! Owns every read of the node that a scrape makes, and the two scrape caches it updates (the
//! data directory's measured size, the applied index last seen). Gathered once per scrape,
//! before anything is rendered, so that the renderers are pure functions of plain values.
//! Never renders a line.

use std::path::Path;
use std::time::{Duration, Instant};

use narad_io::types::{TopicId, UnixMillis};

use crate::metrics::{BOOT_DURATION_US, DATA_DIR_SIZE_TTL, DATA_DIR_WALK_ENTRIES_MAX};
use crate::node::Node;

/// How long committed metadata entries may wait with the applied index standing still before
/// `narad_metastore_apply_stalled` reads 1.
pub const APPLY_STALL_AFTER: Duration = Duration::from_secs(10);

/// The node's own figures for one scrape.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct NodeFacts {
    /// `narad_auth_verify_queued`: 0 with security off.
    pub auth_verify_queued: u64,
    /// Present when a shard reported the Raft gauges (the shard that hosts the metadata group).
    pub metastore: Option<MetastoreFacts>,
    /// `remotes.allowed_hosts` is set.
    pub remotes_allowlist_configured: bool,
    /// Microseconds from start until every shard was serving (0 = not yet).
    pub boot_duration_us: u64,
    pub orphan_topic_dirs: u64,
    /// Bytes under the data directory, as last measured (at most [`DATA_DIR_SIZE_TTL`] old).
    pub data_dir_size_bytes: u64,
    /// Unix time (seconds) the vitals (the data directory's size) were measured.
    pub vitals_collected_at_s: f64,
    /// Unix time (seconds) the inventory (topics, partitions, their figures) was read.
    pub inventory_collected_at_s: f64,
    /// `None` when the filesystem could not be asked.
    pub data_dir_available_bytes: Option<u64>,
    /// Expiry (Unix seconds) of the cluster port's TLS certificates, by kind (`leaf`: this
    /// node's; `ca`: the soonest of the CA file's): empty without cluster TLS.
    pub cluster_tls_not_after: Vec<(&'static str, i64)>,
    /// Partition moves this node runs as the destination now.
    pub moves_inflight: u64,
    /// Moves finished here as the destination.
    pub moves: crate::node::MoveTally,
    /// What blocks each decommission, as this node (leading) last saw it: (node, reason).
    pub decommission_blocked: Vec<(String, &'static str)>,
    /// Each registered remote's credential as this node sees it.
    pub remote_credentials: Vec<RemoteCredential>,
}

/// One remote's sealed credential from this node's side (OPERATIONS.md §9.4).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RemoteCredential {
    pub remote: String,
    /// `ready`, `stale` or `credential_unreadable` (as the remotes list's `nodes`).
    pub state: String,
    /// The key that sealed it.
    pub key_version: String,
    /// Sealed with this node's current key.
    pub key_current: bool,
    /// Seconds since the password was set.
    pub age_s: u64,
}

/// The metastore's health as the node sees it, next to the Raft gauges.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct MetastoreFacts {
    /// Bytes of the metastore directory (log, vote, snapshot).
    pub fsm_bytes: u64,
    pub apply_stalled: bool,
    /// Unix time (seconds) this node last knew its leader alive, when it knows one: in a
    /// cluster, the last heartbeat the leader recorded.
    pub heartbeat_last_success_s: Option<f64>,
    /// Heartbeats to the leader that failed in a row (0 on a node that is its whole cluster).
    pub heartbeat_failures: u64,
    /// Members the leader would mark dead but the breaker refuses (0 unless leading).
    pub dead_marking_refused: u64,
}

impl NodeFacts {
    /// Reads the node's figures for a scrape. `raft` is the Raft gauges a shard reported, if
    /// any: the metastore's health is judged only next to them.
    pub(crate) fn gather(
        node: &Node,
        meta: &narad_raft::MetaState,
        raft: Option<&narad_raft::RaftGauges>,
    ) -> NodeFacts {
        // With security off nothing is verified; asking would start the helper threads.
        let auth_verify_queued = if node.config.security_enabled {
            crate::auth::node_auth().verify_queued() as u64
        } else {
            0
        };
        let metastore = raft.map(|r| MetastoreFacts::gather(node, r));
        let orphan_topic_dirs = orphan_topic_dirs(&node.config.data_dir, &meta.topic_ids());
        let now_for_poll = Instant::now();
        let dir = &node.config.data_dir;
        let data_dir_size_bytes = match node.metrics.data_dir_size.get() {
            Some((at, bytes)) if at.elapsed() < DATA_DIR_SIZE_TTL => bytes,
            _ => {
                let bytes = dir_size(dir);
                node.metrics
                    .data_dir_size
                    .set(Some((Instant::now(), bytes)));
                bytes
            }
        };
        // The vitals (the data directory's size) are measured at most every DATA_DIR_SIZE_TTL;
        // the inventory (topics, partitions, their figures) is read at every scrape.
        let measured = node
            .metrics
            .data_dir_size
            .get()
            .map_or(now_for_poll, |(at, _)| at);
        let collected_at = |at: Instant| unix_seconds_now() - at.elapsed().as_secs_f64();
        let tls = &node.config.cluster_tls;
        let cluster_tls_not_after = if node.config.peers.is_empty() || tls.cert_file.is_empty() {
            Vec::new()
        } else {
            use narad_io::peer::tls::pem_not_after;
            [
                ("leaf", pem_not_after(Path::new(&tls.cert_file), false)),
                ("ca", pem_not_after(Path::new(&tls.ca_file), true)),
            ]
            .into_iter()
            .filter_map(|(k, t)| Some((k, t?)))
            .collect()
        };
        let (moves_inflight, moves) = node.move_figures();
        let decommission_blocked = node
            .decommission_blocked()
            .into_iter()
            .map(|b| (b.node, b.code))
            .collect();
        NodeFacts {
            cluster_tls_not_after,
            moves_inflight,
            moves,
            decommission_blocked,
            auth_verify_queued,
            metastore,
            remotes_allowlist_configured: !node.config.remotes.allowed_hosts.is_empty(),
            remote_credentials: remote_credentials(node),
            boot_duration_us: BOOT_DURATION_US.load(std::sync::atomic::Ordering::Relaxed),
            orphan_topic_dirs,
            data_dir_size_bytes,
            vitals_collected_at_s: collected_at(measured),
            inventory_collected_at_s: collected_at(now_for_poll),
            data_dir_available_bytes: narad_io::sys::filesystem_available_bytes(dir),
        }
    }
}

impl MetastoreFacts {
    /// The metastore's bytes on disk, whether applying stalls (judged against the applied index
    /// the previous scrape saw, which this one records), and the leader's last sign of life.
    fn gather(node: &Node, r: &narad_raft::RaftGauges) -> MetastoreFacts {
        let fsm_bytes = dir_size(&narad_raft::metastore_dir(&node.config.data_dir));
        let now = Instant::now();
        let since = match node.metrics.applied_seen.get() {
            Some((index, since)) if index == r.applied_index => since,
            _ => now,
        };
        node.metrics
            .applied_seen
            .set(Some((r.applied_index, since)));
        let apply_stalled =
            r.commit_index > r.applied_index && now.duration_since(since) >= APPLY_STALL_AFTER;
        let (heartbeat_failures, heartbeat_last_success_s) = if node.config.peers.is_empty() {
            // Its own leader: it knows the leader alive as long as Raft does.
            (
                0,
                r.last_contact_seconds.map(|ago| unix_seconds_now() - ago),
            )
        } else {
            let (failures, ok_ms) = node.heartbeats();
            (failures, ok_ms.map(|ms| ms as f64 / 1e3))
        };
        MetastoreFacts {
            fsm_bytes,
            apply_stalled,
            heartbeat_last_success_s,
            heartbeat_failures,
            dead_marking_refused: node.dead_marking_refused(),
        }
    }
}

fn unix_seconds_now() -> f64 {
    UnixMillis::now().0 as f64 / 1e3
}

/// Bytes under `dir`, visiting at most [`DATA_DIR_WALK_ENTRIES_MAX`] entries (symbolic links are
/// not followed).
fn dir_size(dir: &Path) -> u64 {
    let mut total = 0u64;
    let mut visited = 0usize;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            visited += 1;
            if visited > DATA_DIR_WALK_ENTRIES_MAX {
                return total;
            }
            let Ok(md) = e.metadata() else { continue };
            if md.is_dir() {
                stack.push(e.path());
            } else if md.is_file() {
                total += md.len();
            }
        }
    }
    total
}

/// Topic directories under `<data_dir>/topics` whose topic is not in `live`, visiting at most
/// [`DATA_DIR_WALK_ENTRIES_MAX`] entries. Entries that are not topic directories are not counted.
fn orphan_topic_dirs(data_dir: &Path, live: &std::collections::HashSet<TopicId>) -> u64 {
    narad_io::partition::topic_dir_ids(data_dir, DATA_DIR_WALK_ENTRIES_MAX)
        .into_iter()
        .filter(|id| !live.contains(id))
        .count() as u64
}

/// Each remote's credential as `node` sees it, by name.
fn remote_credentials(node: &Node) -> Vec<RemoteCredential> {
    let now_ms = narad_io::types::UnixMillis::now().0;
    node.meta()
        .remotes
        .values()
        .map(|r| {
            let state = crate::ship::node_view(node, r)["state"]
                .as_str()
                .unwrap_or("credential_unreadable")
                .to_string();
            RemoteCredential {
                remote: r.name.clone(),
                key_current: state == "ready",
                state,
                key_version: r.key_version.clone(),
                age_s: now_ms.saturating_sub(r.password_set_at_ms) / 1000,
            }
        })
        .collect()
}
