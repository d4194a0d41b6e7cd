//! `narad-raft`: the replicated metadata of a Narad cluster (DESIGN.md §4).
//!
//! Owns the metadata model ([`model`]), its deterministic state transition ([`apply`]), the
//! openraft runtime binding on top of `narad_io::rt` ([`rt`]), the durable Raft log and state
//! machine under `<data_dir>/metastore/` ([`store`]), the network seam ([`network`]) and the
//! handle the server uses on shard 0 ([`node::MetaNode`]).
//!
//! Never names glommio (only `narad_io::rt`), never touches partition data, never serves HTTP.

pub mod apply;
pub mod model;
pub mod network;
pub mod node;
pub mod rt;
pub mod store;
pub mod types;

pub use apply::apply;
pub use model::*;
pub use node::{MetaConfig, MetaNode, MetaStartError, ProposeError};
