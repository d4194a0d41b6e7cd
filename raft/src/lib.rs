//! `narad-raft`: the replicated metadata of a Narad cluster (DESIGN.md §4).
//!
//! Owns the metadata model ([`model`]), its deterministic state transition ([`apply`]), the
//! openraft runtime binding on top of `narad_io::rt` ([`rt`]), the durable Raft log and state
//! machine under `<data_dir>/metastore/` ([`store`]), the network seam ([`network`]) and the
//! handle the server uses on shard 0 ([`node::MetaNode`]).
//!
//! Never names glommio (only `narad_io::rt`), never touches partition data, never serves HTTP.
//!
//! Invariants:
//! - `apply` is pure: ids, epochs, time stamps and password hashes come inside the command, so
//!   replicas applying the same log agree byte for byte (tested with seeded random logs).
//! - A refused command changes nothing but `applied_index`.
//! - Fan-out links are symmetric and flat, and an attached child's schema history equals its
//!   parent's ([`apply::check_invariants`]).
//! - An append is acknowledged to openraft only after `fdatasync`; a proposer's answer is sent
//!   only after the new state was published to subscribers.
//! - Decisions that need configuration (defaults, `topic.max_partitions`) or the data plane
//!   (attach offsets, schema compatibility) are made by the proposer, not by `apply`.

pub mod apply;
pub mod model;
pub mod moves;
pub mod network;
pub mod node;
pub mod rt;
pub mod store;
pub mod types;

pub use apply::apply;
pub use model::*;
pub use node::{
    metastore_dir, stored_node_id, JoinAnswer, MetaConfig, MetaNode, MetaStartError, ProposeError,
    RaftGauges,
};
