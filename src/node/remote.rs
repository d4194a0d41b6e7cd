//! Partitions owned by other nodes of a cluster (CLUSTER.md §4): who owns what, the node's
//! identity on the cluster port, handing accepted records to their owner node, and taking
//! records another node hands here.
//!
//! Members are numbered by their place in `cluster.peers` (identical on every node, CLUSTER.md
//! §7): that number is the [`MemberId`] the WAL's transit records name, so a restart hands
//! them to the same node.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use narad_io::log::AppendRecord;
use narad_io::peer::{ops, Identity, PeerError, Secret};
use narad_io::types::{MemberId, PartitionKey};
use narad_raft::MetaState;
use narad_shard::route::{self, decode_op, encode_op, OpReply, OwnerError, PartitionOp};

use super::*;

/// Longest an owner may take to commit a hand-off (CLUSTER.md §14: commit RPC 30 s).
pub const COMMIT_RPC_TIMEOUT: Duration = Duration::from_secs(30);
/// The same for an owner whose hand-offs keep failing (a probe, CLUSTER.md §14: 5 s).
pub const STUCK_PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// This node's identity on the cluster port: its id and the secret it proves
/// (`NARAD_CLUSTER_SECRET`, or, for a node that is its whole cluster, 32 random bytes of this
/// process: its port is then closed to every other process).
pub fn identity(config: &Config) -> Identity {
    let secret = if config.cluster_secret.is_empty() {
        if config.peers.is_empty() {
            let mut b = vec![0u8; 32];
            narad_io::sys::fill_random(&mut b);
            Secret::new(b)
        } else {
            // Security off with security.allow_insecure_cluster (config validation): an open
            // plane, as CLUSTER.md §12 allows.
            Secret::new(b"narad-insecure-cluster".to_vec())
        }
    } else {
        Secret::new(config.cluster_secret.0.as_bytes().to_vec())
    };
    Identity {
        node_id: config.node_id.clone(),
        secret,
        tls: config
            .cluster_peer_tls()
            .expect("the cluster TLS files were loaded when the configuration was validated")
            .map(Arc::new),
    }
}

impl Node {
    /// The member number of node `id`.
    pub fn member_of(&self, id: &str) -> Option<MemberId> {
        Some(MemberId::of(id))
    }

    /// This node's member number.
    pub fn me(&self) -> MemberId {
        MemberId::of(&self.config.node_id)
    }

    /// Node id and cluster address of member `m`, from the metadata's members and the peer
    /// list.
    pub fn member_addr(&self, m: MemberId) -> Option<(String, String)> {
        if let Some(x) = self
            .meta
            .borrow()
            .members
            .values()
            .find(|x| MemberId::of(&x.id) == m && !x.cluster_addr.is_empty())
        {
            return Some((x.id.clone(), x.cluster_addr.clone()));
        }
        self.config
            .peers
            .iter()
            .find(|p| MemberId::of(&p.id) == m)
            .map(|p| (p.id.clone(), p.addr.clone()))
    }

    /// Rebuilds the owner index from a new metadata snapshot (cluster only).
    pub(super) fn index_owners(&self, meta: &Arc<MetaState>) {
        if self.config.peers.is_empty() {
            return;
        }
        let me = self.config.node_id.as_str();
        let idx = meta
            .topics
            .values()
            .filter(|t| !t.owners.is_empty())
            .map(|t| {
                let owners: Rc<[Option<MemberId>]> = t
                    .owners
                    .iter()
                    .map(|o| if o == me { None } else { self.member_of(o) })
                    .collect();
                (t.id, owners)
            })
            .collect();
        *self.remote_owners.borrow_mut() = idx;
    }

    /// The other node owning `key`'s partition, or `None` when this node owns it.
    pub fn remote_owner(&self, key: PartitionKey) -> Option<MemberId> {
        let idx = self.remote_owners.borrow();
        let owners = idx.get(&key.topic)?;
        owners[key.partition.0 as usize % owners.len()]
    }

    /// Makes `rec` durable here as a transit record for its owner node `to` (one local fsync);
    /// the dispatcher hands it over (see [`crate::transit`]).
    pub(super) async fn accept_for(
        &self,
        to: MemberId,
        rec: AppendRecord,
    ) -> Result<(), StoreError> {
        self.host
            .log()
            .append_transit(narad_io::types::Destination::Node(to), rec)
            .await
            .map(|_| ())
            .map_err(route::store_error)
    }

    /// Hands `batch` to member `to`, which commits it (fsync, read back) before answering.
    pub async fn commit_remote(
        &self,
        to: MemberId,
        batch: Vec<AppendRecord>,
    ) -> Result<(), StoreError> {
        let (Some(links), Some((peer_id, peer_addr))) = (&self.links, self.member_addr(to)) else {
            return Err(StoreError::Failed(format!("no cluster member {:x}", to.0)));
        };
        let body = encode_op(&PartitionOp::Append(batch));
        let within = if self.stuck.borrow().contains(&to) {
            STUCK_PROBE_TIMEOUT
        } else {
            COMMIT_RPC_TIMEOUT
        };
        match links
            .to(&peer_addr)
            .call(ops::COMMIT_BATCH, &body, within)
            .await
        {
            Ok(_) => Ok(()),
            Err(PeerError::Remote(m)) if m.starts_with(NOT_OWNER) => {
                Err(StoreError::Owner(OwnerError::NotOwner))
            }
            Err(e) => Err(StoreError::Failed(format!("node {peer_id}: {e}"))),
        }
    }

    /// Whether member `m`'s hand-offs keep failing here.
    pub fn note_stuck(&self, m: MemberId, stuck: bool) {
        let mut s = self.stuck.borrow_mut();
        if stuck {
            s.insert(m);
        } else {
            s.remove(&m);
        }
    }

    /// Moves records that their owner `from` could not take to sibling partitions (CLUSTER.md
    /// §4.3): for each, its own partition when that moved away from `from` (CLUSTER.md §9.3:
    /// the new owner takes it), else the first partition after its own, circularly, whose owner
    /// is neither `from` nor stuck. Appends them there (durable here before this answers, as transit
    /// records or locally) and answers true; false, with nothing done, when some record has
    /// nowhere else to go (a single-partition topic, every other owner stuck, a deleted topic).
    pub async fn reroute(
        &self,
        from: MemberId,
        batch: Vec<AppendRecord>,
    ) -> Result<bool, StoreError> {
        let meta = self.meta();
        let stuck = self.stuck.borrow().clone();
        let me = self.member_of(&self.config.node_id);
        let mut moved = Vec::with_capacity(batch.len());
        for mut r in batch {
            let Some(t) = meta.topics.values().find(|t| t.id == r.key.topic) else {
                return Ok(false);
            };
            let n = t.partitions;
            let p = r.key.partition.0;
            // Where a record of partition q goes now: its owner, or for a partition frozen
            // for a move, the move's destination (`produce_owner`; None: this node).
            let target = (0..n).map(|k| (p + k) % n).find(|&q| {
                let owner = self
                    .produce_owner(PartitionKey {
                        topic: t.id,
                        partition: narad_io::types::PartitionId(q),
                    })
                    .or(me);
                owner != Some(from)
                    && (owner == me
                        || owner.is_none_or(|o| !stuck.contains(&o) && !self.member_dead(o)))
            });
            match target {
                Some(q) => {
                    r.key.partition = narad_io::types::PartitionId(q);
                    moved.push(r);
                }
                None => return Ok(false),
            }
        }
        self.append(moved).await.map(|()| true)
    }

    /// Another node hands records here: commits those of partitions this node owns and
    /// refuses the batch if any belongs elsewhere (the sender keeps it and tries again).
    pub async fn serve_commit(&self, body: &[u8]) -> Result<Vec<u8>, String> {
        let records = match decode_op(body) {
            Ok(PartitionOp::Append(r)) => r,
            Ok(_) => return Err("not a commit batch".into()),
            Err(e) => return Err(e.to_string()),
        };
        if let Some(r) = records.iter().find(|r| self.remote_owner(r.key).is_some()) {
            return Err(format!(
                "{NOT_OWNER}: partition {} of topic {}",
                r.key.partition.0, r.key.topic
            ));
        }
        self.append(records)
            .await
            .map(|()| Vec::new())
            .map_err(|e| format!("{e:?}"))
    }
}

/// Budget of a queue consume's probe of one remote owner (CLUSTER.md §5.1).
pub const PROBE_BUDGET: Duration = Duration::from_millis(500);
/// Budget of a forwarded ack, extend, nack, pinned read or stats (CLUSTER.md §5.3, §14).
pub const FORWARD_BUDGET: Duration = Duration::from_secs(2);

impl Node {
    /// Runs `op` on member `to`, which owns every partition it names.
    pub async fn call_owner(
        &self,
        to: MemberId,
        op: &PartitionOp,
        within: Duration,
    ) -> Result<OpReply, OwnerError> {
        let (Some(links), Some((_, peer_addr))) = (&self.links, self.member_addr(to)) else {
            return Err(OwnerError::Down);
        };
        // An owner marked dead is not asked (CLUSTER.md §5.2: 503 at once).
        if self.member_dead(to) {
            return Err(OwnerError::Down);
        }
        match links
            .to(&peer_addr)
            .call(ops::PARTITION_OP, &encode_op(op), within)
            .await
        {
            Ok(b) => narad_shard::wire::decode_reply(&b).map_err(OwnerError::NoAnswer),
            Err(PeerError::Remote(m)) if m.starts_with(NOT_OWNER) => Err(OwnerError::NotOwner),
            Err(e) if e.not_sent() => Err(OwnerError::Down),
            Err(e) => Err(OwnerError::NoAnswer(e.to_string())),
        }
    }

    /// Another node forwards work on partitions this node owns: runs it here (over this node's
    /// shards) and answers the reply, or refuses it whole when a partition is not this node's.
    pub async fn serve_op(&self, body: &[u8]) -> Result<Vec<u8>, String> {
        let op = decode_op(body).map_err(|e| e.to_string())?;
        let keys: Vec<PartitionKey> = match &op {
            PartitionOp::Append(r) => r.iter().map(|r| r.key).collect(),
            PartitionOp::Take {
                conf, partitions, ..
            } => partitions
                .iter()
                .map(|&partition| PartitionKey {
                    topic: conf.topic,
                    partition,
                })
                .collect(),
            PartitionOp::Release { topic, items } => items
                .iter()
                .map(|it| PartitionKey {
                    topic: *topic,
                    partition: it.0,
                })
                .collect(),
            PartitionOp::Settle { conf, items, .. } => items
                .iter()
                .map(|it| PartitionKey {
                    topic: conf.topic,
                    partition: it.0,
                })
                .collect(),
            PartitionOp::Read { key, .. } => vec![*key],
            PartitionOp::Stats { keys } => keys.clone(),
        };
        if let Some(k) = keys.iter().find(|k| self.remote_owner(**k).is_some()) {
            return Err(format!(
                "{NOT_OWNER}: partition {} of topic {}",
                k.partition.0, k.topic
            ));
        }
        let reply = match op {
            PartitionOp::Append(r) => OpReply::Appended(self.append(r).await.map(|()| Vec::new())),
            PartitionOp::Take {
                conf,
                partitions,
                n,
            } => OpReply::Taken(self.take(conf, &partitions, n).await),
            PartitionOp::Release { topic, items } => {
                self.release(topic, items).await;
                OpReply::Released
            }
            PartitionOp::Settle { conf, kind, items } => {
                OpReply::Settled(self.settle(conf, kind, &items).await)
            }
            PartitionOp::Read { key, offset } => OpReply::Read(self.read_at(key, offset).await),
            PartitionOp::Stats { keys } => OpReply::Stats(self.stats(&keys).await),
        };
        Ok(narad_shard::wire::encode_reply(reply))
    }
}

/// How an owner refuses work on a partition it does not own.
pub(super) const NOT_OWNER: &str = "not the owner";
