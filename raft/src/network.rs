//! The network seam of the metadata group.
//!
//! openraft reaches other members through a [`openraft::network::RaftNetworkFactory`];
//! [`crate::node::MetaNode::start_with_network`] takes any factory whose clients carry
//! snapshots as `Vec<u8>` (the bytes of `snapshot.json`), so the cluster transport (length-
//! prefixed, checksummed rkyv frames on port 7943, DESIGN.md §4) plugs in there without touching
//! storage or the node handle.
//!
//! For now only [`SingleNodeNetwork`] exists: a one-member group never sends an RPC, and any
//! attempt to reach another member answers `Unreachable` instead of hanging. Never opens a socket.

use std::future::Future;

use openraft::errors::{RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::type_config::alias::SnapshotOf;
use openraft::{BasicNode, OptionalSend};

use crate::types::{TypeConfig, Vote};

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
