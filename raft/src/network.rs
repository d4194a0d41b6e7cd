//! The network seam of the metadata group.
//!
//! openraft reaches other members through a [`openraft::network::RaftNetworkFactory`];
//! [`crate::node::MetaNode::start_with_network`] takes any factory whose clients carry
//! snapshots as `Vec<u8>` (the bytes of `snapshot.json`), so the cluster transport (length-
//! prefixed, checksummed rkyv frames on port 7943, DESIGN.md §4) plugs in there without touching
//! storage or the node handle.
//!
//! [`SingleNodeNetwork`]: a one-member group never sends an RPC, and any attempt to reach another
//! member answers `Unreachable` instead of hanging. Never opens a socket.
//!
//! [`PeerNetwork`]: the cluster's, over shard 0's [`PeerLink`]s (`narad_io::peer`): one link per
//! member address, requests as JSON (openraft's messages are serde types; rkyv cannot archive
//! types of another crate), a snapshot as its JSON head and its bytes. The receiving side is
//! [`serve_raft`].

use std::future::Future;

use openraft::errors::{RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::type_config::alias::SnapshotOf;
use openraft::{BasicNode, OptionalSend};

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use narad_io::peer::{ops, Identity, PeerError, PeerLink};
use openraft::errors::NetworkError;
use openraft::raft::{TransferLeaderRequest, TransferLeaderResponse};

use crate::store::LogStore;
use crate::types::{Raft, SnapshotMeta, TypeConfig, Vote};

/// Network factory of a one-member group: every client it makes is unreachable.
#[derive(Clone, Debug, Default)]
pub struct SingleNodeNetwork;

/// A client to a member that a single-node group cannot reach.
#[derive(Clone, Debug)]
pub struct NoPeer {
    target: String,
}

impl NoPeer {
    fn error(&self) -> Unreachable<TypeConfig> {
        Unreachable::from_string(format!(
            "metadata node {} is not reachable: this node runs a single-member group (no cluster transport)",
            self.target
        ))
    }
}

impl RaftNetworkFactory<TypeConfig> for SingleNodeNetwork {
    type Network = NoPeer;

    async fn new_client(&mut self, target: String, _node: &BasicNode) -> NoPeer {
        NoPeer { target }
    }
}

impl RaftNetworkV2<TypeConfig> for NoPeer {
    type SnapshotData = Vec<u8>;

    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        Err(RPCError::Unreachable(self.error()))
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        Err(RPCError::Unreachable(self.error()))
    }

    async fn full_snapshot(
        &mut self,
        _vote: Vote,
        _snapshot: SnapshotOf<TypeConfig, Vec<u8>>,
        _cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        Err(StreamingError::Unreachable(self.error()))
    }
}

/// Longest a snapshot transfer may take (openraft sets none; the whole metadata snapshot is one
/// message of at most a few MiB).
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(60);

/// Shard 0's links to the other members, by address. Shared with the node's own callers
/// (forwarded proposals), so each member has one connection from shard 0.
#[derive(Clone)]
pub struct PeerLinks {
    me: Identity,
    links: Rc<RefCell<HashMap<String, PeerLink>>>,
}

impl PeerLinks {
    pub fn new(me: Identity) -> PeerLinks {
        PeerLinks {
            me,
            links: Rc::new(RefCell::new(HashMap::new())),
        }
    }

    /// The link to the member at `addr`, made at first use.
    pub fn to(&self, addr: &str) -> PeerLink {
        self.links
            .borrow_mut()
            .entry(addr.to_string())
            .or_insert_with(|| PeerLink::new(addr.to_string(), self.me.clone()))
            .clone()
    }

    pub fn identity(&self) -> &Identity {
        &self.me
    }
}

/// The metadata group's network over the cluster port.
#[derive(Clone)]
pub struct PeerNetwork(pub PeerLinks);

/// A client to one member.
pub struct PeerClient {
    target: String,
    link: PeerLink,
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: String, node: &BasicNode) -> PeerClient {
        PeerClient {
            link: self.0.to(&node.addr),
            target,
        }
    }
}

fn rpc_error(target: &str, e: PeerError) -> RPCError<TypeConfig> {
    match e {
        PeerError::Unreachable(m) => {
            RPCError::Unreachable(Unreachable::from_string(format!("{target}: {m}")))
        }
        other => RPCError::Network(NetworkError::from_string(format!("{target}: {other}"))),
    }
}

impl PeerClient {
    async fn call<Q: serde::Serialize, A: serde::de::DeserializeOwned>(
        &self,
        op: u8,
        req: &Q,
        within: Duration,
    ) -> Result<A, RPCError<TypeConfig>> {
        let body = serde_json::to_vec(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let reply = self
            .link
            .call(op, &body, within)
            .await
            .map_err(|e| rpc_error(&self.target, e))?;
        serde_json::from_slice(&reply).map_err(|e| {
            RPCError::Network(NetworkError::from_string(format!(
                "{}: malformed raft reply: {e}",
                self.target
            )))
        })
    }
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = Vec<u8>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(ops::RAFT_APPEND, &rpc, option.soft_ttl()).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(ops::RAFT_VOTE, &rpc, option.soft_ttl()).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(ops::RAFT_PRE_VOTE, &rpc, option.soft_ttl()).await
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(ops::RAFT_TRANSFER_LEADER, &req, option.soft_ttl())
            .await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: SnapshotOf<TypeConfig, Vec<u8>>,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let head = serde_json::to_vec(&(&vote, &snapshot.meta))
            .map_err(|e| StreamingError::Network(NetworkError::new(&e)))?;
        let mut body = Vec::with_capacity(4 + head.len() + snapshot.snapshot.len());
        body.extend_from_slice(&(head.len() as u32).to_le_bytes());
        body.extend_from_slice(&head);
        body.extend_from_slice(&snapshot.snapshot);
        let call = self.link.call(ops::RAFT_SNAPSHOT, &body, SNAPSHOT_TIMEOUT);
        let reply = futures_lite::future::or(async { Some(call.await) }, async {
            cancel.await;
            None
        })
        .await;
        let reply = match reply {
            None => {
                return Err(StreamingError::Closed(ReplicationClosed::new(
                    "snapshot transfer cancelled",
                )))
            }
            Some(Err(PeerError::Unreachable(m))) => {
                return Err(StreamingError::Unreachable(Unreachable::from_string(m)))
            }
            Some(Err(e)) => {
                return Err(StreamingError::Network(NetworkError::from_string(
                    e.to_string(),
                )))
            }
            Some(Ok(r)) => r,
        };
        serde_json::from_slice(&reply).map_err(|e| {
            StreamingError::Network(NetworkError::from_string(format!(
                "malformed snapshot reply: {e}"
            )))
        })
    }
}

/// Serves one inbound Raft request (`op` one of the `RAFT_*` codes) on the group's own shard:
/// the reply body, or why not (the caller sees a remote error, which openraft retries).
/// Bytes reserved in the Raft log for entries received from the leader beyond the request's
/// JSON (which holds every entry's JSON): the frames' headers and wrappers, a truncation and
/// the committed id written around them.
pub const APPEND_FRAME_SLACK_BYTES: u64 = 64 << 10;

/// Makes room in `log` for the entries of an append request of `body_bytes` before openraft
/// sees them: openraft stops the group on a failed append, so a full disk answers the leader
/// with an error instead (it sends the entries again later) and this node's group goes on,
/// taking them once space frees.
pub fn reserve_for_append(log: &LogStore, body_bytes: usize) -> Result<(), String> {
    log.reserve(body_bytes as u64 + APPEND_FRAME_SLACK_BYTES)
        .map_err(|e| format!("no room in the metadata log for the leader's entries: {e}"))
}

pub async fn serve_raft(
    raft: &Raft,
    log: &LogStore,
    op: u8,
    body: &[u8],
) -> Result<Vec<u8>, String> {
    fn json<T: serde::Serialize>(v: &T) -> Result<Vec<u8>, String> {
        serde_json::to_vec(v).map_err(|e| e.to_string())
    }
    fn parse<'a, T: serde::Deserialize<'a>>(b: &'a [u8]) -> Result<T, String> {
        serde_json::from_slice(b).map_err(|e| format!("malformed raft request: {e}"))
    }
    match op {
        ops::RAFT_APPEND => {
            let req: AppendEntriesRequest<TypeConfig> = parse(body)?;
            if !req.entries.is_empty() {
                reserve_for_append(log, body.len())?;
            }
            json(&raft.append_entries(req).await.map_err(|e| e.to_string())?)
        }
        ops::RAFT_VOTE => json(&raft.vote(parse(body)?).await.map_err(|e| e.to_string())?),
        ops::RAFT_PRE_VOTE => json(
            &raft
                .pre_vote(parse(body)?)
                .await
                .map_err(|e| e.to_string())?,
        ),
        ops::RAFT_TRANSFER_LEADER => json(
            &raft
                .handle_transfer_leader(parse(body)?)
                .await
                .map_err(|e| e.to_string())?,
        ),
        ops::RAFT_SNAPSHOT => {
            if body.len() < 4 {
                return Err("truncated snapshot".into());
            }
            let n = u32::from_le_bytes(body[..4].try_into().expect("four bytes")) as usize;
            if body.len() < 4 + n {
                return Err("truncated snapshot head".into());
            }
            let (vote, meta): (Vote, SnapshotMeta) = parse(&body[4..4 + n])?;
            let snapshot = openraft::storage::Snapshot {
                meta,
                snapshot: body[4 + n..].to_vec(),
            };
            json(
                &raft
                    .install_full_snapshot(vote, snapshot)
                    .await
                    .map_err(|e| e.to_string())?,
            )
        }
        other => Err(format!("not a raft operation: {other}")),
    }
}
