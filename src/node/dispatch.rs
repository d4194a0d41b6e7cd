//! Messages between the shards of this node: addressed partition work ([`ShardReq::Op`]), news
//! ([`ShardReq::Event`]) and control steps ([`ShardReq::Control`]), each kind with its deadline,
//! and how a shard serves them ([`Node::serve`]). Every call leaves through [`call_shard`] and
//! fails typed ([`ShardCallError`]), never with a string.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use narad_io::types::{ShardId, TopicId};
use narad_raft::{MetaCommand, MetaResponse, MetaState, ProposeError};
use narad_shard::fanout::ChildLag;
use narad_shard::route::{self, OpReply, PartitionOp};

use super::*;

/// A message between shards of this process: addressed partition work, news for a shard, or a
/// control step. Every kind names its deadline ([`ShardReq::deadline`]).
pub enum ShardReq {
    /// Work on partitions the asked shard owns: the same operation a node will forward to
    /// another node.
    Op(PartitionOp),
    /// News the asked shard must hear (every shard, for the metadata and failures).
    Event(ShardEvent),
    /// Start-up steps, metadata proposals (to shard 0) and reads of one shard's state.
    Control(ShardControl),
}

pub enum ShardEvent {
    /// Install this metadata snapshot (from shard 0).
    Meta(Arc<MetaState>),
    /// The metadata group on shard 0 stopped for good, for this reason: not ready any more.
    MetaStopped(String),
    /// A shard's log stopped after an I/O failure: refuse every produce until restarted.
    IngressFailed,
    /// A shard has long-polls parked on `topic` until `until_ms` (monotonic): wake it on news.
    Interest { topic: TopicId, until_ms: u64 },
    /// News on `topic` for the long-polls parked here.
    Wake { topic: TopicId },
}

pub enum ShardControl {
    /// Drop the data of topics this shard holds that the metadata no longer has (start-up,
    /// from shard 0, see [`Node::purge_deleted_topics`]).
    PurgeDeleted,
    /// Shard 0 finished its start-up work (metadata everywhere, deleted topics purged): the
    /// asked shard may start serving.
    StartServing,
    /// Propose a metadata change (to shard 0).
    Propose(Box<MetaCommand>),
    /// Fan-out lag of the children of `parent` over the asked shard's cursors.
    FanoutLag { parent: TopicId },
    /// This shard's counters and gauges for a scrape.
    Metrics,
    /// A request of another node for the metadata group (to shard 0): Raft's messages and
    /// forwarded proposals.
    PeerRpc { from: String, op: u8, body: Vec<u8> },
    /// Catch the metadata replica up with the leader (to shard 0); answers the index reached.
    CatchUp,
    /// A move's destination asks for the manifest of a partition the asked shard owns
    /// (answered as [`ShardResp::PeerRpc`]).
    MoveManifest {
        key: narad_io::types::PartitionKey,
        token: Option<u64>,
    },
    /// ... and for bytes of one of its segments.
    MoveChunk {
        key: narad_io::types::PartitionKey,
        base: u64,
        pos: u64,
        max: u32,
    },
}

pub enum ShardResp {
    Op(OpReply),
    Proposed(Box<Result<MetaResponse, ProposeError>>),
    FanoutLag(Vec<ChildLag>),
    Metrics(Box<crate::metrics::ShardMetrics>),
    PeerRpc(Result<Vec<u8>, String>),
    CaughtUp(Option<u64>),
    Done,
}

pub type NodeMesh = Mesh<ShardReq, ShardResp>;

/// Deadline of a data-path call to another shard: append, take, settle, read, release, stats,
/// long-poll interest and wake-ups. An append or an ack waits for the owner's group commit, whose
/// fsync may take a second under load: a shard that has not answered in thirty is stuck, not
/// slow. No mesh call waits out a long-poll's `wait` (up to 20 s): a long-poll parks on the shard
/// that took it ([`Node::wait_for_work`]); a call that ever does must add that `wait` to this.
pub const MESH_DATA_CALL_TIMEOUT_MS: u64 = 30_000;
/// Deadline of a read of another shard's counters (a `/metrics` scrape, the fan-out lag route):
/// memory only, and Prometheus gives a whole scrape 10 s by default.
pub const MESH_COUNTERS_CALL_TIMEOUT_MS: u64 = 10_000;
/// Deadline of control messages (metadata installs, start-up release and purge, stop notices)
/// and of a metadata change forwarded to shard 0, which waits for Raft (itself bounded by
/// `propose_timeout_ms`, 10 s) and for every shard to install the result; a purge deletes files.
pub const MESH_CONTROL_CALL_TIMEOUT_MS: u64 = 60_000;

impl ShardReq {
    /// How long a caller waits for the answer. Every kind names its deadline: a new kind has to
    /// choose one.
    fn deadline(&self) -> Duration {
        let ms = match self {
            ShardReq::Op(_)
            | ShardReq::Event(ShardEvent::Interest { .. } | ShardEvent::Wake { .. }) => {
                MESH_DATA_CALL_TIMEOUT_MS
            }
            ShardReq::Control(ShardControl::FanoutLag { .. } | ShardControl::Metrics) => {
                MESH_COUNTERS_CALL_TIMEOUT_MS
            }
            ShardReq::Event(
                ShardEvent::Meta(_) | ShardEvent::MetaStopped(_) | ShardEvent::IngressFailed,
            )
            | ShardReq::Control(
                ShardControl::PurgeDeleted
                | ShardControl::StartServing
                | ShardControl::Propose(_)
                | ShardControl::PeerRpc { .. }
                | ShardControl::CatchUp
                | ShardControl::MoveManifest { .. }
                | ShardControl::MoveChunk { .. },
            ) => MESH_CONTROL_CALL_TIMEOUT_MS,
        };
        Duration::from_millis(ms)
    }
}

/// Calls shard `to` with the deadline of the request's kind.
pub(super) async fn call_shard(
    mesh: &NodeMesh,
    to: ShardId,
    req: ShardReq,
) -> Result<ShardResp, ShardCallError> {
    let within = req.deadline();
    Ok(mesh.call(to, req, within).await?)
}

/// [`Node::serve`] answers every request with a reply of its own kind: another kind is a bug.
pub(super) fn wrong_reply(asked: &str) -> ! {
    unreachable!("a shard answered {asked} with a reply of another kind")
}

impl Node {
    /// Serves a message from another shard.
    pub async fn serve(self: Rc<Self>, from: ShardId, req: ShardReq) -> ShardResp {
        match req {
            // An append placed by a shard that had not yet seen a move of one of its partitions
            // (a freeze or a flip this shard has installed): placed again here, by this
            // shard's metadata, before anything is written.
            ShardReq::Op(PartitionOp::Append(recs))
                if self.links.is_some() && recs.iter().any(|r| !self.commit_here(r.key)) =>
            {
                ShardResp::Op(OpReply::Appended(
                    self.append(recs).await.map(|()| Vec::new()),
                ))
            }
            ShardReq::Op(op) => ShardResp::Op(route::execute(&self.host, op).await),
            ShardReq::Event(e) => {
                self.hear(from, e).await;
                ShardResp::Done
            }
            ShardReq::Control(c) => self.control(c).await,
        }
    }

    async fn hear(self: &Rc<Self>, from: ShardId, e: ShardEvent) {
        match e {
            ShardEvent::Interest { topic, until_ms } => self.note_interest(topic, from, until_ms),
            ShardEvent::Wake { topic } => self.host.wake_local(topic),
            ShardEvent::Meta(state) => self.install_meta(state),
            ShardEvent::MetaStopped(reason) => *self.meta_stopped.borrow_mut() = Some(reason),
            ShardEvent::IngressFailed => self.ingress_failed.set(true),
        }
    }

    async fn control(self: &Rc<Self>, c: ShardControl) -> ShardResp {
        match c {
            ShardControl::PurgeDeleted => {
                self.purge_deleted_here().await;
                ShardResp::Done
            }
            ShardControl::StartServing => {
                self.released.set(true);
                ShardResp::Done
            }
            ShardControl::Propose(cmd) => {
                ShardResp::Proposed(Box::new(self.propose_here(*cmd).await))
            }
            ShardControl::FanoutLag { parent } => {
                ShardResp::FanoutLag(self.local_fanout_lag(parent))
            }
            ShardControl::Metrics => ShardResp::Metrics(Box::new(self.metrics_snapshot())),
            ShardControl::PeerRpc { from, op, body } => {
                ShardResp::PeerRpc(self.serve_meta_rpc(&from, op, &body).await)
            }
            ShardControl::CatchUp => ShardResp::CaughtUp(self.catch_up_here().await),
            ShardControl::MoveManifest { key, token } => {
                ShardResp::PeerRpc(self.move_manifest_here(key, token).await)
            }
            ShardControl::MoveChunk {
                key,
                base,
                pos,
                max,
            } => ShardResp::PeerRpc(self.move_chunk_here(key, base, pos, max).await),
        }
    }
}
