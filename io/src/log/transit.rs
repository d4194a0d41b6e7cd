//! Transit records: records this shard accepts for a partition that another shard or node owns
//! (DESIGN.md §2.3). [`ShardLog::append_transit`] writes one in the next group commit and answers
//! once it is durable; the [`ShardLog::on_transit`] sink hands it to its owner;
//! [`ShardLog::transit_handed`] lets it go and queues a `Handed` marker.
//!
//! Owns: [`TransitHold`] (a record's destination and its `seq` there), the hand-off API, the sink,
//! the `Handed` markers, and the destination of version-1 records, which stored none. The
//! committer (`commit.rs`) assigns the `seq`s in WAL order when it plans a batch and registers the
//! holds once the batch is durable; recovery (`recovery.rs`) collects the transit records and
//! markers it replays. Never: makes a transit record readable on this shard, or chooses where one
//! goes (the caller names its destination).
//!
//! Crash safety (the transit part of the argument in `mod.rs`): the WAL is the only copy of a
//! transit record on this node. Its hold is a WAL position at or before it, and a checkpoint's
//! `upto` never passes the smallest hold (`checkpoint.rs`), so until the record is handed over
//! every recovery replays it and gives it back ([`ShardLog::take_recovered_transit`]). The
//! `Handed` marker that lets a recovery skip it is not waited for: a crash before the marker is
//! durable hands the record over twice, never loses it.

use std::rc::Rc;

use super::{AppendRecord, Kind, LogError, ShardLog};
use crate::codec::WalRecord;
use crate::partition::frame;
use crate::types::{owner_shard, Destination, PartitionKey, UnixMillis};

/// Receives each transit record once its batch is durable (see [`ShardLog::on_transit`]).
pub type TransitSink = dyn Fn(TransitHold, AppendRecord);

/// A transit record's claim on the WAL (its destination and its `seq` there): checkpoints stop
/// before it until [`ShardLog::transit_handed`] lets it go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TransitHold {
    pub dest: Destination,
    pub seq: u64,
}

/// The destination of a version-1 transit record, which did not store one: the owner shard of
/// its partition on this node (the only destination such records had). Everything written
/// since names its destination, decided by the caller of [`ShardLog::append_transit`].
pub(super) fn legacy_destination(key: PartitionKey, shard_count: u32) -> Destination {
    Destination::Shard(owner_shard(key, shard_count))
}

impl ShardLog {
    /// Writes a record for `dest` (a partition owned by another shard or node) as a transit
    /// record, in the next group commit, and resolves once that batch is durable and verified: the accept of
    /// DESIGN.md §2.3, one local fsync. The record is not readable here. Once durable it goes
    /// to the [`ShardLog::on_transit`] sink, which hands it to its owner and then calls
    /// [`ShardLog::transit_handed`]; until then checkpoints keep it in the WAL, so a restart
    /// finds it again ([`ShardLog::take_recovered_transit`]).
    pub async fn append_transit(
        &self,
        dest: Destination,
        r: AppendRecord,
    ) -> Result<TransitHold, LogError> {
        let holds = self.append_transit_many(vec![(dest, r)]).await?;
        holds.into_iter().next().ok_or(LogError::Closed)
    }

    /// [`ShardLog::append_transit`] for several records at once, each with its destination:
    /// one request in the next group commit, answered once it is durable, with the records'
    /// holds in the order given. A batch produce takes this path for every record it accepts
    /// for other nodes, so that their bookkeeping costs one queued request, not one per record.
    pub async fn append_transit_many(
        &self,
        recs: Vec<(Destination, AppendRecord)>,
    ) -> Result<Vec<TransitHold>, LogError> {
        if let Some(e) = self.refuse() {
            return Err(e);
        }
        let mut dests = Vec::with_capacity(recs.len());
        let mut wal = Vec::with_capacity(recs.len());
        let now = UnixMillis::now();
        for (dest, r) in recs {
            if frame::message_frame_len(r.msg_key.as_deref(), &r.payload) > frame::FRAME_BYTES_MAX {
                return Err(LogError::TooLarge);
            }
            dests.push(dest);
            wal.push(WalRecord::Transit {
                dest: Some(dest),
                key: r.key,
                seq: 0, // assigned at planning, in WAL order
                commit_ms: now,
                msg_key: r.msg_key,
                payload: r.payload,
            });
        }
        if wal.is_empty() {
            return Ok(Vec::new());
        }
        let offs = self.submit(Kind::Transit, wal).await?;
        if offs.len() != dests.len() {
            return Err(LogError::Closed);
        }
        Ok(dests
            .into_iter()
            .zip(offs)
            .map(|(dest, s)| TransitHold { dest, seq: s.0 })
            .collect())
    }

    /// These transit records reached their owner: checkpoints may pass them, and a `Handed`
    /// marker rides the next group commit so that a restart does not hand them over again
    /// (not waited for: without it they are handed over twice, never lost).
    pub async fn transit_handed(&self, holds: &[TransitHold]) {
        let mut marks = Vec::new();
        {
            let mut st = self.inner.state.borrow_mut();
            let mut dests: Vec<Destination> = Vec::new();
            for h in holds {
                st.transit_holds.remove(h);
                if !dests.contains(&h.dest) {
                    dests.push(h.dest);
                }
            }
            for dest in dests {
                // Every seq below both the oldest still held and the first not yet durable.
                let held = st
                    .transit_holds
                    .range(
                        TransitHold { dest, seq: 0 }..=TransitHold {
                            dest,
                            seq: u64::MAX,
                        },
                    )
                    .next()
                    .map(|(h, _)| h.seq);
                let durable = st.transit_durable.get(&dest).copied().unwrap_or(0);
                let upto = held.map_or(durable, |h| h.min(durable));
                let marked = st.transit_marked.entry(dest).or_insert(0);
                if upto > *marked {
                    *marked = upto;
                    marks.push(WalRecord::Handed { dest, upto });
                }
            }
        }
        if !marks.is_empty() && self.refuse().is_none() {
            if let Ok(durable) = self.enqueue(Kind::Handed, marks).await {
                drop(durable);
            }
        }
    }

    /// Transit records held in the WAL (written, not yet released).
    pub fn transit_held(&self) -> usize {
        self.inner.state.borrow().transit_holds.len()
    }

    /// The transit records recovery found (each with its own hold), once; the caller hands them
    /// to their owners as it does with new ones.
    pub fn take_recovered_transit(&self) -> Vec<(TransitHold, AppendRecord)> {
        std::mem::take(&mut self.inner.state.borrow_mut().recovered_transit)
    }

    /// Registers where transit records go once durable: each durable transit record is given
    /// to `f` with its hold, in WAL order, whether or not the caller of
    /// [`ShardLog::append_transit`] still waits (a dropped request must not strand its record).
    /// Without a sink they stay held until restart. `f` must not block.
    pub fn on_transit(&self, f: Box<TransitSink>) {
        *self.inner.transit_sink.borrow_mut() = Some(Rc::from(f));
    }
}

/// The transit records of an encoded batch, moved out with their holds (no payload copy).
pub(super) fn take_transit(
    records: Vec<WalRecord>,
    shard_count: u32,
) -> Vec<(TransitHold, AppendRecord)> {
    records
        .into_iter()
        .filter_map(|r| transit_parts(r, shard_count))
        .collect()
}

/// A transit record's hold and its record (moved, no payload copy); `None` for other records.
pub(super) fn transit_parts(r: WalRecord, shard_count: u32) -> Option<(TransitHold, AppendRecord)> {
    match r {
        WalRecord::Transit {
            dest,
            key,
            seq,
            msg_key,
            payload,
            ..
        } => Some((
            TransitHold {
                dest: dest.unwrap_or_else(|| legacy_destination(key, shard_count)),
                seq,
            },
            AppendRecord {
                key,
                msg_key,
                payload,
            },
        )),
        _ => None,
    }
}
