//! The openraft type configuration of the metadata group: what a log entry carries, what apply
//! answers, how nodes are named, and which runtime runs it.

use serde::{Deserialize, Serialize};

use crate::model::{MetaError, MetaResponse};
use crate::rt::NaradRuntime;

/// What applying one command produced, as carried back to the proposer through openraft.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApplyOutcome(pub Result<MetaResponse, MetaError>);

openraft::declare_raft_types!(
    /// The metadata group's openraft types. Node ids are the nodes' configured ids (strings).
    pub TypeConfig:
        D = crate::model::MetaCommand,
        R = ApplyOutcome,
        NodeId = String,
        Node = openraft::BasicNode,
        AsyncRuntime = NaradRuntime,
);

pub type LogId = openraft::type_config::alias::LogIdOf<TypeConfig>;
pub type Entry = openraft::type_config::alias::EntryOf<TypeConfig>;
pub type Vote = openraft::type_config::alias::VoteOf<TypeConfig>;
pub type StoredMembership = openraft::type_config::alias::StoredMembershipOf<TypeConfig>;
pub type SnapshotMeta = openraft::type_config::alias::SnapshotMetaOf<TypeConfig>;
pub type Raft = openraft::Raft<TypeConfig, crate::store::StateMachine>;
