//! Routing: where a partition lives ([`Placement`], decided by the [`Router`]), the operations
//! that travel to its owner ([`PartitionOp`]) and what comes back ([`OpReply`], with typed
//! failures).
//!
//! A partition operation is the same value whether it runs here, goes to another shard over the
//! mesh, or (with the cluster) to another node: [`execute`] runs it on the owner's [`Host`], so a
//! forwarded request is the local request, carried. Requests that touch several partitions are
//! split by owner once, by [`group_by_owner`], never per record.
//!
//! Never sends anything itself: the node's dispatch (the binary's `node`) carries operations to
//! their owner and decides what a failure means for the client.

use std::time::Duration;

use narad_io::log::{AppendRecord, LogError, ReadError, StoredRecord};
use narad_io::partition::PartitionStats;
use narad_io::rt::MeshError;
use narad_io::types::TopicId;
use narad_io::types::{owner_shard, MemberId, Nonce, Offset, PartitionId, PartitionKey, ShardId};

use crate::host::{Host, Leased, QueueConf, SettleError, SettleKind};

/// Where a partition's owner is: a shard of this node, or another node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Placement {
    Local(ShardId),
    Remote(MemberId),
}

/// Decides placements. Today a node is its whole cluster: every partition is owned here, on the
/// shard [`owner_shard`] names (a pure function of the partition and the node's shard count,
/// fixed for a data directory). The cluster's partition assignments will make some `Remote`.
#[derive(Clone, Debug)]
pub struct Router {
    shards: u32,
}

impl Router {
    pub fn new(shards: u32) -> Router {
        assert!(shards > 0, "a node has at least one shard");
        Router { shards }
    }

    pub fn place(&self, key: PartitionKey) -> Placement {
        Placement::Local(owner_shard(key, self.shards))
    }
}

/// The items of a request that one owner serves.
#[derive(Debug, PartialEq, Eq)]
pub struct OwnerGroup<T> {
    pub owner: Placement,
    pub items: Vec<T>,
}

/// Splits `items` by the owner `place` gives each, groups in the order their owners first
/// appear, items in request order within a group. A caller that must put answers back in
/// request order groups `items.enumerate()`.
pub fn group_by_owner<T>(
    items: impl IntoIterator<Item = T>,
    mut place: impl FnMut(&T) -> Placement,
) -> Vec<OwnerGroup<T>> {
    let mut groups: Vec<OwnerGroup<T>> = Vec::new();
    for item in items {
        let owner = place(&item);
        // Few owners per request (at most the shards, later the nodes): a scan beats a map.
        match groups.iter_mut().find(|g| g.owner == owner) {
            Some(g) => g.items.push(item),
            None => groups.push(OwnerGroup {
                owner,
                items: vec![item],
            }),
        }
    }
    groups
}

/// One lease: partition, offset and the nonce of its receipt handle.
pub type Lease = (PartitionId, Offset, Nonce);

/// A partition's stats and queue gauges: stats, in flight, acked ahead, settled frontier.
pub type PartitionGauges = (PartitionStats, usize, usize, Offset);

/// Work on partitions that one owner holds. The same value runs here, crosses the shard mesh,
/// and (with the cluster) crosses the network as [`encode_op`]'s bytes.
#[derive(Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum PartitionOp {
    /// Make these records durable (one group commit) and readable.
    Append(Vec<AppendRecord>),
    /// Lease up to `n` available records of these partitions of `conf.topic`.
    Take {
        conf: QueueConf,
        partitions: Vec<PartitionId>,
        n: usize,
    },
    /// Give back leases that could not be delivered.
    Release { topic: TopicId, items: Vec<Lease> },
    /// Ack, extend or nack leases.
    Settle {
        conf: QueueConf,
        kind: SettleKind,
        items: Vec<Lease>,
    },
    /// The record at `offset`, without a lease.
    Read { key: PartitionKey, offset: Offset },
    /// Stats and queue gauges of these partitions.
    Stats { keys: Vec<PartitionKey> },
}

/// Why bytes did not decode as a [`PartitionOp`]: they were not written by [`encode_op`] (a
/// truncated, damaged or foreign frame). Validated before anything is read from them.
#[derive(Debug)]
pub struct OpDecodeError(pub String);

impl std::fmt::Display for OpDecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not a partition operation: {}", self.0)
    }
}

/// `op` as bytes for another node (rkyv; the transport frames and checksums them).
pub fn encode_op(op: &PartitionOp) -> Vec<u8> {
    rkyv::to_bytes::<rkyv::rancor::Error>(op)
        .expect("a partition operation always serialises (memory only)")
        .into_vec()
}

/// The operation [`encode_op`] wrote into `bytes`, after checking every byte of it (lengths,
/// enum tags, offsets): damaged or foreign bytes are an error, never a panic.
pub fn decode_op(bytes: &[u8]) -> Result<PartitionOp, OpDecodeError> {
    // rkyv reads archived values in place: copy into an aligned buffer first.
    let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(bytes.len());
    aligned.extend_from_slice(bytes);
    rkyv::from_bytes::<PartitionOp, rkyv::rancor::Error>(&aligned)
        .map_err(|e| OpDecodeError(e.to_string()))
}

/// The answer to a [`PartitionOp`], of the same kind.
#[derive(Debug)]
pub enum OpReply {
    Appended(Result<Vec<Offset>, StoreError>),
    Taken(Result<Vec<Leased>, StoreError>),
    Released,
    /// One result per item, in the order asked.
    Settled(Vec<Result<(), SettleFailure>>),
    Read(Result<Option<StoredRecord>, ReadFailure>),
    /// One entry per key, in the order asked.
    Stats(Vec<PartitionGauges>),
}

/// Runs `op` on the partitions `host` owns.
pub async fn execute(host: &Host, op: PartitionOp) -> OpReply {
    match op {
        PartitionOp::Append(recs) => {
            OpReply::Appended(host.append(recs).await.map_err(store_error))
        }
        PartitionOp::Take {
            conf,
            partitions,
            n,
        } => OpReply::Taken(host.take(conf, &partitions, n).await.map_err(store_error)),
        PartitionOp::Release { topic, items } => {
            host.release(topic, &items);
            OpReply::Released
        }
        PartitionOp::Settle { conf, kind, items } => OpReply::Settled(
            host.settle(conf, kind, &items)
                .await
                .into_iter()
                .map(settle_failure)
                .collect(),
        ),
        PartitionOp::Read { key, offset } => {
            OpReply::Read(host.read_at(key, offset).await.map_err(read_failure))
        }
        PartitionOp::Stats { keys } => OpReply::Stats(local_stats(host, &keys)),
    }
}

/// Why another node did not answer for a partition it owns (the API picks the status:
/// CLUSTER.md §5.2–5.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerError {
    /// The request never left: the owner cannot be reached. Nothing was applied. `503`.
    Down,
    /// Sent, but no answer came in time: it may have been applied. `502`.
    NoAnswer(String),
    /// The owner says it does not own the partition (it moved). `421`.
    NotOwner,
}

/// Why an append or a take did not happen (values that reach the client as a status).
#[derive(Debug, Clone)]
pub enum StoreError {
    DiskFull,
    /// A shard's log stopped after an I/O failure: no produce is taken on this node until it
    /// restarts (API.md §10.1 `500 produce failed`).
    Stopped(String),
    /// The topic was deleted while the produce was on its way (nothing stored).
    TopicGone,
    /// The owner shard did not answer.
    Shard(ShardCallError),
    /// The owner node did not answer.
    Owner(OwnerError),
    Failed(String),
}

#[derive(Debug, Clone)]
pub enum SettleFailure {
    Gone,
    /// The owner's data disk is full and earlier settles wait for space: nothing was settled.
    DiskFull,
    /// The owner shard did not answer.
    Shard(ShardCallError),
    /// The owner node did not answer.
    Owner(OwnerError),
    Failed(String),
}

#[derive(Debug, Clone)]
pub enum ReadFailure {
    BelowRetention {
        oldest: Offset,
    },
    Unreadable,
    /// The owner shard did not answer.
    Shard(ShardCallError),
    /// The owner node did not answer.
    Owner(OwnerError),
    Failed(String),
}

/// Why a call to another shard of this node got no answer. The API layer picks the status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardCallError {
    /// The shard has left the mesh (it stopped, or the node is stopping) or does not serve.
    Gone { shard: ShardId },
    /// The shard did not answer within `after`: what was asked may still happen there.
    Timeout { shard: ShardId, after: Duration },
}

impl From<MeshError> for ShardCallError {
    fn from(e: MeshError) -> ShardCallError {
        match e {
            MeshError::Timeout { shard, after } => ShardCallError::Timeout { shard, after },
            MeshError::NoSuchShard(shard)
            | MeshError::Disconnected(shard)
            | MeshError::NotServing(shard)
            | MeshError::AlreadyJoined(shard) => ShardCallError::Gone { shard },
        }
    }
}

impl std::fmt::Display for ShardCallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShardCallError::Gone { shard } => write!(f, "shard {} unavailable", shard.0),
            ShardCallError::Timeout { shard, after } => {
                write!(f, "shard {} did not answer within {after:?}", shard.0)
            }
        }
    }
}

pub fn store_error(e: LogError) -> StoreError {
    match e {
        LogError::DiskFull => StoreError::DiskFull,
        LogError::TopicDeleted => StoreError::TopicGone,
        e @ LogError::Poisoned(_) => StoreError::Stopped(e.to_string()),
        other => StoreError::Failed(other.to_string()),
    }
}

pub fn settle_failure(r: Result<(), SettleError>) -> Result<(), SettleFailure> {
    r.map_err(|e| match e {
        SettleError::Gone => SettleFailure::Gone,
        SettleError::Log(e) => SettleFailure::Failed(e.to_string()),
        SettleError::DiskFull => SettleFailure::DiskFull,
    })
}

pub fn read_failure(e: ReadError) -> ReadFailure {
    match e {
        ReadError::BelowRetention { oldest } => ReadFailure::BelowRetention { oldest },
        ReadError::Corrupt { .. } => ReadFailure::Unreadable,
        other => ReadFailure::Failed(format!("{other:?}")),
    }
}

/// Stats and queue gauges of partitions `host` owns, in the order asked.
pub fn local_stats(host: &Host, keys: &[PartitionKey]) -> Vec<PartitionGauges> {
    keys.iter()
        .map(|&k| {
            let (inflight, ahead, frontier) = host.queue_stats(k);
            (host.stats(k), inflight, ahead, frontier)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_keep_first_seen_owner_order_and_request_positions() {
        // Proves the one split by owner: every item lands in its owner's group exactly once,
        // groups come in the order their owners first appear, and positions point back into
        // the request in order.
        let place = |&(_, x): &(usize, u32)| {
            if x >= 100 {
                Placement::Remote(MemberId(u64::from(x / 100)))
            } else {
                Placement::Local(ShardId(x % 3))
            }
        };
        let groups = group_by_owner([4u32, 3, 7, 100, 5, 6, 201].into_iter().enumerate(), place);
        let got: Vec<(Placement, Vec<usize>, Vec<u32>)> = groups
            .into_iter()
            .map(|g| {
                let (positions, items) = g.items.into_iter().unzip();
                (g.owner, positions, items)
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (Placement::Local(ShardId(1)), vec![0, 2], vec![4, 7]),
                (Placement::Local(ShardId(0)), vec![1, 5], vec![3, 6]),
                (Placement::Remote(MemberId(1)), vec![3], vec![100]),
                (Placement::Local(ShardId(2)), vec![4], vec![5]),
                (Placement::Remote(MemberId(2)), vec![6], vec![201]),
            ]
        );
        assert!(group_by_owner(Vec::<(usize, u32)>::new(), place).is_empty());
    }

    fn every_op() -> Vec<PartitionOp> {
        let conf = QueueConf {
            topic: TopicId(9),
            visibility_ms: 30_000,
            max_in_flight: 10,
            max_acked_ahead: 1000,
        };
        let key = PartitionKey {
            topic: TopicId(9),
            partition: PartitionId(2),
        };
        vec![
            PartitionOp::Append(vec![
                AppendRecord {
                    key,
                    msg_key: Some(b"k".to_vec()),
                    payload: b"{\"n\":1}".to_vec().into(),
                },
                AppendRecord {
                    key,
                    msg_key: None,
                    payload: Vec::new().into(),
                },
            ]),
            PartitionOp::Take {
                conf,
                partitions: vec![PartitionId(0), PartitionId(3)],
                n: 7,
            },
            PartitionOp::Release {
                topic: TopicId(9),
                items: vec![(PartitionId(1), Offset(5), Nonce(77))],
            },
            PartitionOp::Settle {
                conf,
                kind: SettleKind::Nack,
                items: vec![
                    (PartitionId(1), Offset(5), Nonce(77)),
                    (PartitionId(2), Offset(0), Nonce(1)),
                ],
            },
            PartitionOp::Read {
                key,
                offset: Offset(u64::MAX),
            },
            PartitionOp::Stats {
                keys: vec![key, key],
            },
        ]
    }

    #[test]
    fn every_partition_op_crosses_the_wire_unchanged() {
        // Proves the one operation type serialises: every kind decodes to the value encoded,
        // payload bytes included, from any alignment of the received buffer.
        for op in every_op() {
            let bytes = encode_op(&op);
            assert_eq!(decode_op(&bytes).unwrap(), op);
            let mut shifted = vec![0u8];
            shifted.extend_from_slice(&bytes);
            assert_eq!(decode_op(&shifted[1..]).unwrap(), op);
        }
    }

    #[test]
    fn damaged_op_bytes_are_refused_not_trusted() {
        // Proves decoding checks what it reads: every truncation and every single-byte change
        // of a valid frame either fails or decodes to some valid operation; none panics or
        // reads out of bounds (bytecheck validates lengths, tags and offsets first). Empty and
        // foreign bytes fail.
        for op in every_op() {
            let bytes = encode_op(&op);
            for cut in 0..bytes.len() {
                let _ = decode_op(&bytes[..cut]);
            }
            for i in 0..bytes.len() {
                for flip in [0x01u8, 0x80, 0xff] {
                    let mut b = bytes.clone();
                    b[i] ^= flip;
                    let _ = decode_op(&b);
                }
            }
        }
        assert!(decode_op(&[]).is_err());
        assert!(decode_op(&[0xff; 64]).is_err());
    }

    #[test]
    fn the_router_places_every_partition_on_its_owner_shard_here() {
        // Proves a node that is its whole cluster places each partition locally, on the shard
        // the data directory's placement names.
        let r = Router::new(4);
        for p in 0..16 {
            let key = PartitionKey {
                topic: TopicId(0xabc),
                partition: PartitionId(p),
            };
            assert_eq!(r.place(key), Placement::Local(owner_shard(key, 4)));
        }
    }
}
