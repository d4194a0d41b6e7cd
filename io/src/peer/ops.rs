//! The operation codes of node-to-node requests: one table, stable and append-only (a code is
//! never reused), so that a node meeting a code it does not know answers "unsupported rpc
//! operation" instead of misreading it. The bodies are defined where each operation is served.

/// Raft: append entries (openraft's `AppendEntriesRequest`, JSON).
pub const RAFT_APPEND: u8 = 1;
/// Raft: vote request (JSON).
pub const RAFT_VOTE: u8 = 2;
/// Raft: pre-vote request (JSON).
pub const RAFT_PRE_VOTE: u8 = 3;
/// Raft: a full snapshot (vote and metadata as JSON, then the snapshot's bytes).
pub const RAFT_SNAPSHOT: u8 = 4;
/// Raft: leadership transfer to the receiver (JSON).
pub const RAFT_TRANSFER_LEADER: u8 = 5;
/// A metadata command proposed on a follower, forwarded to the leader (JSON).
pub const META_PROPOSE: u8 = 6;
/// The leader's committed index, for a follower's read barrier.
pub const META_READ_INDEX: u8 = 7;
/// Records accepted by the sender for partitions the receiver owns (`PartitionOp::Append`,
/// rkyv): answered once committed (fsync, read back).
pub const COMMIT_BATCH: u8 = 8;
/// Work on partitions the receiver owns (`PartitionOp`: take, release, settle, read, stats;
/// rkyv), answered with the owner's reply (`narad_shard::wire`).
pub const PARTITION_OP: u8 = 9;
/// A node outside the voters asks to be admitted (JSON `{id, addr}`), answered by the leader
/// with `narad_raft::JoinAnswer` (CLUSTER.md §7).
pub const META_JOIN: u8 = 10;
/// A node with long-polls parked on a topic asks an owner of some of its partitions to answer
/// once something may be there to consume (a commit, nack or expiry on the topic), or when the
/// wait ends: body `topic id (u64 LE) | wait ms (u32 LE)`, answer one byte, 1 when woken.
pub const TOPIC_WAIT: u8 = 11;

/// The lags of a parent topic's children over the receiver's fan-out cursors (body: the
/// parent's topic id, u64 LE; answer: per child, its id, lag, cursors and due lag).
pub const FANOUT_LAG: u8 = 12;

/// A sign of life asked on a connection where calls wait and nothing came back for a while
/// (`link.rs`); answered at once with an empty body. Any answer, even "unsupported", will do.
pub const LINK_PING: u8 = 13;
/// A partition move's destination asks the source for the partition's segments (first offset
/// and bytes of whole frames), high watermark and settled state (JSON); with a freeze token, once
/// the source sees that freeze and has no append of it on the way (CLUSTER.md §9.3).
pub const MOVE_MANIFEST: u8 = 14;
/// Bytes of one segment of a moving partition (JSON ask: topic, partition, base, pos, max;
/// answer: the raw bytes, at most 1 MiB).
pub const MOVE_CHUNK: u8 = 15;
/// The receiver's own status for `GET /v1/cluster/members?detail=true` (empty body; answer:
/// JSON `{node, draining, produce_in_flight, dispatch_backlog, quarantine, moves}`).
pub const NODE_STATUS: u8 = 16;
/// Run the checks of a remote child from the receiver (SEMANTICS.md §13: every member must be
/// able to ship). JSON ask `{remote, topic}`; answer `{ok, class, detail, target_id}`.
pub const REMOTE_PROBE: u8 = 17;
/// The receiver's view of every registered remote's credential (API.md §14.2 `nodes`): empty
/// ask; answer a JSON object, remote name → that node's row.
pub const REMOTE_VIEW: u8 = 18;

/// The `op` label of an operation code in the cluster RPC metrics (OPERATIONS.md §9.6).
pub fn name(op: u8) -> &'static str {
    match op {
        RAFT_APPEND => "raft_append",
        RAFT_VOTE => "raft_vote",
        RAFT_PRE_VOTE => "raft_pre_vote",
        RAFT_SNAPSHOT => "raft_snapshot",
        RAFT_TRANSFER_LEADER => "raft_transfer_leader",
        META_PROPOSE => "meta_propose",
        META_READ_INDEX => "meta_read_index",
        COMMIT_BATCH => "commit_batch",
        PARTITION_OP => "partition_op",
        META_JOIN => "meta_join",
        TOPIC_WAIT => "topic_wait",
        FANOUT_LAG => "fanout_lag",
        LINK_PING => "link_ping",
        MOVE_MANIFEST => "move_manifest",
        MOVE_CHUNK => "move_chunk",
        NODE_STATUS => "node_status",
        REMOTE_PROBE => "remote_probe",
        REMOTE_VIEW => "remote_view",
        _ => "unknown",
    }
}
