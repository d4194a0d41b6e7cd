//! A [`PartitionOp`](crate::route::PartitionOp)'s answer as bytes for another node: the
//! [`OpReply`] of the owner, archived with rkyv (validated by bytecheck when read, so damaged
//! or foreign bytes are an error, never a panic). Plain mirror types: the in-memory reply holds
//! shared buffers and typed errors that need not cross a network.

use narad_io::partition::{PartitionStats, StoredRecord};
use narad_io::types::{Nonce, Offset, PartitionId, UnixMillis};

use crate::host::Leased;
use crate::route::{OpReply, ReadFailure, SettleFailure, StoreError};

#[derive(Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WireRecord {
    pub offset: u64,
    pub commit_ms: u64,
    pub msg_key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
}

#[derive(Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WireLeased {
    pub partition: u32,
    pub nonce: u64,
    pub record: WireRecord,
}

#[derive(Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WireGauges {
    pub segments: u32,
    pub size_bytes: u64,
    pub oldest_offset: u64,
    pub next_offset: u64,
    pub high_watermark: u64,
    pub oldest_segment_at: Option<u64>,
    pub in_flight: u64,
    pub acked_ahead: u64,
    pub frontier: u64,
}

/// Why the owner did not do it (the owner's typed failure, flattened).
#[derive(Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum WireFailure {
    DiskFull,
    Stopped(String),
    TopicGone,
    /// A lease that is no longer held (settle).
    Gone,
    BelowRetention(u64),
    Unreadable,
    Failed(String),
}

#[derive(Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum WireReply {
    Appended(Result<Vec<u64>, WireFailure>),
    Taken(Result<Vec<WireLeased>, WireFailure>),
    Released,
    Settled(Vec<Result<(), WireFailure>>),
    Read(Result<Option<WireRecord>, WireFailure>),
    Stats(Vec<WireGauges>),
}

fn record_out(r: &StoredRecord) -> WireRecord {
    WireRecord {
        offset: r.offset.0,
        commit_ms: r.commit_ms.0,
        msg_key: r.msg_key.as_ref().map(|k| k.to_vec()),
        payload: r.payload.to_vec(),
    }
}

fn record_in(r: WireRecord) -> StoredRecord {
    StoredRecord {
        offset: Offset(r.offset),
        commit_ms: UnixMillis(r.commit_ms),
        msg_key: r.msg_key.map(Into::into),
        payload: r.payload.into(),
    }
}

fn store_out(e: StoreError) -> WireFailure {
    match e {
        StoreError::DiskFull => WireFailure::DiskFull,
        StoreError::Stopped(m) => WireFailure::Stopped(m),
        StoreError::TopicGone => WireFailure::TopicGone,
        other => WireFailure::Failed(format!("{other:?}")),
    }
}

fn store_in(e: WireFailure) -> StoreError {
    match e {
        WireFailure::DiskFull => StoreError::DiskFull,
        WireFailure::Stopped(m) => StoreError::Stopped(m),
        WireFailure::TopicGone => StoreError::TopicGone,
        other => StoreError::Failed(format!("{other:?}")),
    }
}

impl From<OpReply> for WireReply {
    fn from(r: OpReply) -> WireReply {
        match r {
            OpReply::Appended(r) => WireReply::Appended(
                r.map(|offs| offs.into_iter().map(|o| o.0).collect())
                    .map_err(store_out),
            ),
            OpReply::Taken(r) => WireReply::Taken(
                r.map(|ls| {
                    ls.iter()
                        .map(|l| WireLeased {
                            partition: l.partition.0,
                            nonce: l.nonce.0,
                            record: record_out(&l.record),
                        })
                        .collect()
                })
                .map_err(store_out),
            ),
            OpReply::Released => WireReply::Released,
            OpReply::Settled(rs) => WireReply::Settled(
                rs.into_iter()
                    .map(|r| {
                        r.map_err(|e| match e {
                            SettleFailure::Gone => WireFailure::Gone,
                            SettleFailure::DiskFull => WireFailure::DiskFull,
                            other => WireFailure::Failed(format!("{other:?}")),
                        })
                    })
                    .collect(),
            ),
            OpReply::Read(r) => {
                WireReply::Read(r.map(|o| o.as_ref().map(record_out)).map_err(|e| match e {
                    ReadFailure::BelowRetention { oldest } => WireFailure::BelowRetention(oldest.0),
                    ReadFailure::Unreadable => WireFailure::Unreadable,
                    other => WireFailure::Failed(format!("{other:?}")),
                }))
            }
            OpReply::Stats(gs) => WireReply::Stats(
                gs.into_iter()
                    .map(|(s, in_flight, ahead, frontier)| WireGauges {
                        segments: s.segments,
                        size_bytes: s.size_bytes,
                        oldest_offset: s.oldest_offset.0,
                        next_offset: s.next_offset.0,
                        high_watermark: s.high_watermark.0,
                        oldest_segment_at: s.oldest_segment_at.map(|m| m.0),
                        in_flight: in_flight as u64,
                        acked_ahead: ahead as u64,
                        frontier: frontier.0,
                    })
                    .collect(),
            ),
        }
    }
}

impl From<WireReply> for OpReply {
    fn from(r: WireReply) -> OpReply {
        match r {
            WireReply::Appended(r) => OpReply::Appended(
                r.map(|offs| offs.into_iter().map(Offset).collect())
                    .map_err(store_in),
            ),
            WireReply::Taken(r) => OpReply::Taken(
                r.map(|ls| {
                    ls.into_iter()
                        .map(|l| Leased {
                            partition: PartitionId(l.partition),
                            nonce: Nonce(l.nonce),
                            record: record_in(l.record),
                        })
                        .collect()
                })
                .map_err(store_in),
            ),
            WireReply::Released => OpReply::Released,
            WireReply::Settled(rs) => OpReply::Settled(
                rs.into_iter()
                    .map(|r| {
                        r.map_err(|e| match e {
                            WireFailure::Gone => SettleFailure::Gone,
                            WireFailure::DiskFull => SettleFailure::DiskFull,
                            other => SettleFailure::Failed(format!("{other:?}")),
                        })
                    })
                    .collect(),
            ),
            WireReply::Read(r) => OpReply::Read(r.map(|o| o.map(record_in)).map_err(|e| match e {
                WireFailure::BelowRetention(o) => ReadFailure::BelowRetention { oldest: Offset(o) },
                WireFailure::Unreadable => ReadFailure::Unreadable,
                other => ReadFailure::Failed(format!("{other:?}")),
            })),
            WireReply::Stats(gs) => OpReply::Stats(
                gs.into_iter()
                    .map(|g| {
                        (
                            PartitionStats {
                                segments: g.segments,
                                size_bytes: g.size_bytes,
                                oldest_offset: Offset(g.oldest_offset),
                                next_offset: Offset(g.next_offset),
                                high_watermark: Offset(g.high_watermark),
                                oldest_segment_at: g.oldest_segment_at.map(UnixMillis),
                            },
                            g.in_flight as usize,
                            g.acked_ahead as usize,
                            Offset(g.frontier),
                        )
                    })
                    .collect(),
            ),
        }
    }
}

/// `reply` as bytes for another node.
pub fn encode_reply(reply: OpReply) -> Vec<u8> {
    let w = WireReply::from(reply);
    rkyv::to_bytes::<rkyv::rancor::Error>(&w)
        .expect("a reply always serialises (memory only)")
        .into_vec()
}

/// The reply [`encode_reply`] wrote into `bytes`, every byte checked first.
pub fn decode_reply(bytes: &[u8]) -> Result<OpReply, String> {
    let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(bytes.len());
    aligned.extend_from_slice(bytes);
    rkyv::from_bytes::<WireReply, rkyv::rancor::Error>(&aligned)
        .map(OpReply::from)
        .map_err(|e| format!("not a partition reply: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_round_trip_and_damage_is_an_error() {
        // Proves every reply kind survives encode/decode with its values, and that truncated
        // or bit-flipped bytes decode to an error (or a valid reply), never a panic.
        let leased = Leased {
            partition: PartitionId(2),
            nonce: Nonce(77),
            record: StoredRecord {
                offset: Offset(9),
                commit_ms: UnixMillis(1234),
                msg_key: Some(b"k".to_vec().into()),
                payload: b"hello".to_vec().into(),
            },
        };
        let b = encode_reply(OpReply::Taken(Ok(vec![leased])));
        match decode_reply(&b).expect("decodes") {
            OpReply::Taken(Ok(ls)) => {
                assert_eq!(ls.len(), 1);
                assert_eq!((ls[0].partition, ls[0].nonce), (PartitionId(2), Nonce(77)));
                assert_eq!(ls[0].record.offset, Offset(9));
                assert_eq!(&ls[0].record.payload[..], b"hello");
                assert_eq!(ls[0].record.msg_key.as_deref(), Some(&b"k"[..]));
            }
            other => panic!("{other:?}"),
        }
        let b = encode_reply(OpReply::Settled(vec![Ok(()), Err(SettleFailure::Gone)]));
        assert!(matches!(
            decode_reply(&b).unwrap(),
            OpReply::Settled(v) if matches!(v.as_slice(), [Ok(()), Err(SettleFailure::Gone)])
        ));
        let b = encode_reply(OpReply::Read(Err(ReadFailure::BelowRetention {
            oldest: Offset(5),
        })));
        assert!(matches!(
            decode_reply(&b).unwrap(),
            OpReply::Read(Err(ReadFailure::BelowRetention { oldest: Offset(5) }))
        ));
        let g = (
            PartitionStats {
                segments: 1,
                size_bytes: 2,
                oldest_offset: Offset(3),
                next_offset: Offset(4),
                high_watermark: Offset(4),
                oldest_segment_at: Some(UnixMillis(6)),
            },
            7,
            8,
            Offset(9),
        );
        let b = encode_reply(OpReply::Stats(vec![g]));
        assert!(matches!(decode_reply(&b).unwrap(), OpReply::Stats(v) if v == vec![g]));
        let b = encode_reply(OpReply::Taken(Err(StoreError::DiskFull)));
        assert!(matches!(
            decode_reply(&b).unwrap(),
            OpReply::Taken(Err(StoreError::DiskFull))
        ));
        for n in 0..b.len() {
            let _ = decode_reply(&b[..n]);
        }
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 0x5a;
            let _ = decode_reply(&d);
        }
    }
}
