//! The committer: the one task that turns queued requests into WAL batches and, once a batch is
//! durable, into readable records (the write path of `mod.rs`).
//!
//! Owns: taking a batch off the queue within the WAL's limits (`take_batch`), planning it
//! (`plan_batch`: offsets, commit times, transit `seq`s, segment frames, and the space they need
//! reserved in the partition files), the pipelining (up to `wal_batches_in_flight_max` batches in
//! flight, the next one handed over only when the WAL can start it at once and
//! `wal_pipeline_min_bytes` are queued), and materialising each batch in order (`materialise`:
//! frames written to the partition files, settles applied, transit holds registered, callers
//! answered, `on_commit` callbacks run). Never: fsyncs a partition file (checkpoints do), or
//! writes a frame of a batch the WAL has not made durable.
//!
//! Crash safety: this file carries points 1 and 4 of the argument in `mod.rs`. A caller is
//! answered, and a record becomes readable, only once the WAL answered durable-and-verified for
//! its batch, and the WAL resolves batches strictly in order. Frames reach the partition files
//! only then, so a failed batch leaves nothing but unused offsets: once nothing is in flight the
//! committer plans again from the partitions' ends in their files. Segment space is reserved
//! before the WAL write, so writing the frames after it cannot run out of disk; a durable batch
//! that still cannot be written to its partition poisons the shard log (the WAL keeps it for the
//! restart). No room for that reservation refuses only the requests carrying messages. Settles
//! are answered once queued (`shard::host`), so a full disk never fails one: a settle whose WAL
//! batch is refused goes back to the front of the queue and is tried again every
//! `SETTLE_RETRY_INTERVAL` until written.

use std::collections::hash_map::Entry;
use std::collections::{HashSet, VecDeque};
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

use super::checkpoint::{checkpoint_owed, maybe_checkpoint};
use super::transit::{legacy_destination, take_transit, TransitHold};
use super::{
    poison, settle_records, AppendRecord, CommitCallback, Inner, Kind, LogConfig, LogError,
    Request, Signals, State,
};
use crate::codec::{self, WalPosition, WalRecord};
use crate::file::is_disk_full;
use crate::partition::{frame, EncodedBatch, PartitionLog};
use crate::rt::{oneshot, Task};
use crate::types::{FastMap, Offset, PartitionKey, TopicId, UnixMillis};
use crate::wal::{Wal, WalError};

/// How long the committer waits before it tries again to write settles that a full disk
/// refused: long enough not to spin on a disk that stays full, short enough that they are
/// durable soon after space frees (well inside the crash seam of SEMANTICS.md §1).
const SETTLE_RETRY_INTERVAL: Duration = Duration::from_millis(100);

/// Takes queued requests up to the WAL batch limits (always at least one).
fn take_batch(st: &mut State, cfg: &LogConfig) -> Vec<Request> {
    let mut out = Vec::new();
    let mut bytes = codec::BATCH_HEADER_BYTES;
    let mut records = 0;
    while let Some(r) = st.queue.front() {
        if !out.is_empty()
            && (bytes + r.wal_bytes > cfg.wal_batch_bytes_max
                || records + r.records.len() > cfg.wal_batch_records_max)
        {
            break;
        }
        bytes += r.wal_bytes;
        records += r.records.len();
        let r = st.queue.pop_front().expect("front exists");
        st.queue_bytes -= r.wal_bytes;
        out.push(r);
    }
    out
}

/// The committer: plans a batch (offsets, frames), hands it to the WAL, and materialises and
/// answers batches strictly in order as the WAL makes them durable. Up to the WAL's
/// `batches_in_flight_max` batches are in flight; the next one is handed over only when the WAL
/// can start writing it at once and `wal_pipeline_min_bytes` are queued (or nothing is in
/// flight), so it gathers everything queued until then.
pub(super) async fn committer(weak: Weak<Inner>, signals: Rc<Signals>) {
    let mut flying: VecDeque<(Planned, Task<Result<WalPosition, WalError>>)> = VecDeque::new();
    // A batch failed: hand nothing more to the WAL until every batch in flight has resolved
    // (they fail too), then plan again from the partitions' materialised ends.
    let mut halted = false;
    // The WAL's refusal count when the batches in flight began to be planned: their offsets
    // continue one another, so none may be written once one of them was refused.
    let mut window_refusals = 0;
    // Settles were put back after a full disk refused them: no batch before this time.
    let mut retry_at: Option<Instant> = None;
    loop {
        let work = signals.work.notified();
        let Some(inner) = weak.upgrade() else { return };
        let wal = inner.wal.clone();
        let kick = wal.batch_slot_notified();
        if inner.state.borrow().closed && flying.is_empty() {
            return;
        }
        if flying.is_empty() {
            halted = false;
            inner.state.borrow_mut().planned_next.clear();
            window_refusals = wal.refusals();
        }
        let depth = inner.cfg.wal_batches_in_flight_max.max(1);
        if retry_at.is_some_and(|t| Instant::now() >= t) {
            retry_at = None;
        }
        let may_start = !halted
            && retry_at.is_none()
            && (flying.is_empty()
                || (flying.len() < depth
                    && inner.state.borrow().queue_bytes >= inner.cfg.wal_pipeline_min_bytes
                    && inner.wal.can_start_batch_now()));
        if may_start {
            let batch = {
                let mut st = inner.state.borrow_mut();
                take_batch(&mut st, &inner.cfg)
            };
            if !batch.is_empty() {
                if let Some((mut planned, records)) = plan_batch(&inner, batch) {
                    let wal = inner.wal.clone();
                    let task = match Wal::encode(&records) {
                        Ok(frames) => {
                            let n = records.len();
                            planned.transit = take_transit(records, inner.cfg.shard_count);
                            crate::rt::spawn(async move {
                                wal.append_frames_after(frames, n, Some(window_refusals))
                                    .await
                            })
                        }
                        Err(e) => crate::rt::spawn(async move { Err(e) }),
                    };
                    flying.push_back((planned, task));
                    inner.state.borrow_mut().inflight = flying.len();
                }
                // Wait at least for the next event before handing over another batch.
                drop(inner);
                continue;
            }
        }
        if flying.is_empty() {
            maybe_checkpoint(&inner, &signals);
            // With a checkpoint owed, wake when its interval is up; with none, only for work
            // (an idle log sets no timer at all).
            let idle_for = {
                let st = inner.state.borrow();
                let checkpoint = checkpoint_owed(&st).then(|| {
                    let interval = Duration::from_millis(inner.cfg.checkpoint_interval_ms.max(1));
                    interval
                        .saturating_sub(st.last_checkpoint_at.elapsed())
                        .max(Duration::from_millis(10))
                });
                let retry = retry_at.map(|t| t.saturating_duration_since(Instant::now()));
                match (checkpoint, retry) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            };
            drop(inner);
            match idle_for {
                Some(d) => {
                    futures_lite::future::or(work, async {
                        crate::rt::sleep(d).await;
                    })
                    .await
                }
                None => work.await,
            }
            continue;
        }
        let (_, oldest) = flying.front_mut().expect("not empty");
        let done = futures_lite::future::or(async { Some(oldest.await) }, async {
            futures_lite::future::or(work, kick).await;
            None
        })
        .await;
        let Some(result) = done else {
            drop(inner);
            continue;
        };
        let (planned, _) = flying.pop_front().expect("not empty");
        inner.state.borrow_mut().inflight = flying.len();
        if result.is_err() {
            halted = true;
        }
        if materialise(&inner, planned, result.map_err(LogError::from)) {
            retry_at = Some(Instant::now() + SETTLE_RETRY_INTERVAL);
        }
        signals.progress.notify_waiters();
        maybe_checkpoint(&inner, &signals);
        drop(inner);
    }
}

/// Before the WAL write: creates missing partitions and reserves segment space for the frame
/// bytes `need` of every partition (on top of the runs of batches still in flight), so that
/// writing the frames after the WAL commit cannot run out of disk. ENOSPC here refuses the
/// batch's appends as `DiskFull` with nothing written anywhere.
fn prepare_partitions(
    inner: &Inner,
    st: &mut State,
    need: &FastMap<PartitionKey, (usize, usize)>,
) -> Result<(), LogError> {
    for (key, &(bytes, _)) in need {
        let ahead = st.planned_next.get(key).map_or(0, |p| p.1);
        let p = match st.partitions.entry(*key) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => v.insert(PartitionLog::create(
                &inner.cfg.data_dir,
                *key,
                inner.cfg.partition_segment_bytes_max,
            )?),
        };
        p.reserve(ahead + bytes as u64)?;
    }
    Ok(())
}

/// A batch handed to the WAL: what to materialise and whom to answer once it is durable.
struct Planned {
    runs: FastMap<PartitionKey, EncodedBatch>,
    /// The batch's transit records with their holds, for the sink: moved out of the WAL
    /// records once these are encoded ([`take_transit`]).
    transit: Vec<(TransitHold, AppendRecord)>,
    offsets: Vec<Vec<Offset>>,
    /// Per request: its kind, whom to answer, and whether it is a settle put back before.
    replies: Vec<(Kind, Reply, bool)>,
    wal_bytes: u64,
}

/// Where a queued call learns its offsets (or why it failed).
type Reply = oneshot::Sender<Result<Vec<Offset>, LogError>>;

/// Assigns offsets and times and encodes the segment frames of `batch`. Offsets continue after
/// the batches still in flight (`planned_next`), else after the partition's end in its files.
/// Returns `None` when nothing is left to write (every request answered already).
fn plan_batch(inner: &Rc<Inner>, batch: Vec<Request>) -> Option<(Planned, Vec<WalRecord>)> {
    let mut st = inner.state.borrow_mut();
    let has_message = |req: &Request, deleted_only: Option<&HashSet<TopicId>>| {
        req.records.iter().any(|r| match r {
            WalRecord::Message { key, .. } => deleted_only.is_none_or(|d| d.contains(&key.topic)),
            _ => false,
        })
    };
    let (deleted, mut batch): (Vec<Request>, Vec<Request>) = batch
        .into_iter()
        .partition(|req| has_message(req, Some(&st.deleted_topics)));
    for req in deleted {
        let _ = req.reply.send(Err(LogError::TopicDeleted));
    }
    // Each partition's frames are sized first, so that its run is allocated once.
    let mut need: FastMap<PartitionKey, (usize, usize)> = FastMap::default();
    for rec in batch.iter().flat_map(|r| &r.records) {
        if let WalRecord::Message {
            key,
            msg_key,
            payload,
            ..
        } = rec
        {
            let n = need.entry(*key).or_default();
            n.0 += frame::message_frame_len(msg_key.as_deref(), payload);
            n.1 += 1;
        }
    }
    // Room in the partition files first, before anything is numbered: when there is none, only
    // the requests that carry messages are refused. Settles, transit records and markers need
    // WAL room alone; failing them with the appends beside them would drop acks already
    // answered (a settle is answered once queued).
    if let Err(e) = prepare_partitions(inner, &mut st, &need) {
        let e = match e {
            LogError::Io(e) if is_disk_full(&e) => LogError::DiskFull,
            e => e,
        };
        if matches!(e, LogError::DiskFull) {
            inner.wal.shed_recycled();
        }
        let (refused, rest): (Vec<Request>, Vec<Request>) =
            batch.into_iter().partition(|req| has_message(req, None));
        for req in refused {
            let _ = req.reply.send(Err(e.copy()));
        }
        batch = rest;
        need.clear();
    }
    let mut runs: FastMap<PartitionKey, EncodedBatch> = FastMap::default();
    let mut offsets: Vec<Vec<Offset>> = Vec::with_capacity(batch.len());
    let mut replies = Vec::with_capacity(batch.len());
    let mut records = Vec::with_capacity(batch.iter().map(|r| r.records.len()).sum());
    let mut wal_bytes = 0u64;
    let now = UnixMillis::now().max(st.last_stamp);
    st.last_stamp = now;
    for mut req in batch {
        wal_bytes += req.wal_bytes as u64;
        let mut offs = Vec::new();
        if matches!(req.kind, Kind::Append) {
            offs.reserve(req.records.len());
        }
        for rec in &mut req.records {
            match rec {
                WalRecord::Message {
                    key,
                    offset,
                    commit_ms,
                    msg_key,
                    payload,
                } => {
                    let run = runs.entry(*key).or_insert_with(|| {
                        let first = st.planned_next.get(key).map_or_else(
                            || {
                                st.partitions
                                    .get(key)
                                    .map_or(Offset(0), PartitionLog::next_offset)
                            },
                            |p| p.0,
                        );
                        let (bytes, records) = need.get(key).copied().unwrap_or_default();
                        EncodedBatch::with_capacity(first, bytes, records)
                    });
                    *commit_ms = now;
                    *offset = run.push_message(now, msg_key.as_deref(), payload);
                    offs.push(*offset);
                }
                // `seq` in WAL order per destination; the request learns it as its "offset".
                WalRecord::Transit { dest, key, seq, .. } => {
                    let dest =
                        dest.unwrap_or_else(|| legacy_destination(*key, inner.cfg.shard_count));
                    let next = st.transit_next.entry(dest).or_insert(0);
                    *seq = *next;
                    *next += 1;
                    offs.push(Offset(*seq));
                }
                _ => {}
            }
        }
        offsets.push(offs);
        records.extend(req.records);
        replies.push((req.kind, req.reply, req.requeued));
    }
    if replies.is_empty() {
        return None;
    }
    for (key, run) in &runs {
        debug_assert_eq!(Some(run.byte_len()), need.get(key).map(|n| n.0));
        let e = st.planned_next.entry(*key).or_insert((run.first(), 0));
        *e = (run.next(), e.1 + run.byte_len() as u64);
    }
    Some((
        Planned {
            runs,
            transit: Vec::new(),
            offsets,
            replies,
            wal_bytes,
        },
        records,
    ))
}

/// The WAL answered for `planned` (the oldest batch in flight): on success writes its frames to
/// the partition files (page cache), which advances the high watermarks, applies its settles,
/// then answers every caller and runs the commit callbacks. On a full disk its settles are put
/// back in the queue instead of failing; returns true when it did so.
fn materialise(inner: &Rc<Inner>, planned: Planned, result: Result<WalPosition, LogError>) -> bool {
    let Planned {
        runs,
        transit,
        offsets,
        replies,
        wal_bytes,
    } = planned;
    let mut moved: Vec<PartitionKey> = Vec::new();
    let outcome: Result<(), LogError> = {
        let mut st = inner.state.borrow_mut();
        for (key, run) in &runs {
            // Batches resolve in order: once this one is written the next plans from the files.
            if let Some(p) = st.planned_next.get_mut(key) {
                p.1 = p.1.saturating_sub(run.byte_len() as u64);
            }
        }
        match result {
            Err(e) => Err(e),
            Ok(pos) => {
                // Batches resolve in order: the previous end is at or before this batch.
                let start = st.last_pos.unwrap_or(st.open_pos);
                for (hold, _) in &transit {
                    st.transit_holds.insert(*hold, start);
                    let durable = st.transit_durable.entry(hold.dest).or_insert(0);
                    *durable = (*durable).max(hold.seq + 1);
                }
                st.last_pos = Some(pos);
                if replies.iter().any(|r| !matches!(r.0, Kind::Checkpoint)) {
                    st.last_content_pos = Some(pos);
                }
                st.wal_bytes_since_checkpoint += wal_bytes;
                let mut failed = None;
                for (key, run) in &runs {
                    if st.deleted_topics.contains(&key.topic) {
                        continue;
                    }
                    let Some(p) = st.partitions.get_mut(key) else {
                        continue;
                    };
                    if p.next_offset() != run.first() {
                        // An earlier batch of this partition failed yet this one became
                        // durable: never expected (a failure fails everything behind it).
                        failed = Some(format!(
                            "partition {key:?}: durable batch at offset {} does not continue the log at {}",
                            run.first().0,
                            p.next_offset().0
                        ));
                        break;
                    }
                    if let Err(e) = p.append(run) {
                        failed = Some(format!("writing partition {key:?} segment failed: {e}"));
                        break;
                    }
                    moved.push(*key);
                }
                for reply in &replies {
                    if let Kind::Settle(parts) = &reply.0 {
                        for (key, offs) in parts {
                            if let Some(p) = st.partitions.get_mut(key) {
                                p.settle(offs);
                            }
                        }
                    }
                }
                match failed {
                    // The records are durable in the WAL and come back at restart; until then the
                    // partition would have a hole, so the shard stops accepting writes.
                    Some(why) => {
                        drop(st);
                        poison(inner, why.clone());
                        Err(LogError::Poisoned(why))
                    }
                    None => Ok(()),
                }
            }
        }
    };
    if let Err(e) = &outcome {
        if matches!(e, LogError::Poisoned(_)) {
            // Nothing queued can succeed any more.
            let queued: Vec<Request> = {
                let mut st = inner.state.borrow_mut();
                st.queue_bytes = 0;
                st.settles_requeued = 0;
                st.queue.drain(..).collect()
            };
            for r in queued {
                let _ = r.reply.send(Err(e.copy()));
            }
        }
    }
    if outcome.is_ok() && !transit.is_empty() {
        let sink = inner.transit_sink.borrow().clone();
        if let Some(sink) = sink {
            for (hold, rec) in transit {
                sink(hold, rec);
            }
        }
    }
    // A settle is answered once queued (its ack already went out), so a full disk must not drop
    // it: it goes back to the front of the queue and is written by the first batch that finds
    // room. Settling is idempotent and order-free, so where it lands among others is no matter.
    // A closing log cannot wait for space: the stop then fails as it would for any write.
    let retry = matches!(outcome, Err(LogError::DiskFull)) && !inner.state.borrow().closing;
    let mut again: Vec<Request> = Vec::new();
    for ((kind, reply, requeued), offs) in replies.into_iter().zip(offsets) {
        match kind {
            Kind::Settle(parts) if retry => {
                let records = settle_records(&parts);
                again.push(Request {
                    wal_bytes: records.iter().map(codec::encoded_len).sum(),
                    records,
                    kind: Kind::Settle(parts),
                    reply,
                    requeued,
                });
            }
            _ => {
                if requeued {
                    let mut st = inner.state.borrow_mut();
                    st.settles_requeued = st.settles_requeued.saturating_sub(1);
                }
                let _ = reply.send(match &outcome {
                    Ok(()) => Ok(offs),
                    Err(e) => Err(e.copy()),
                });
            }
        }
    }
    let requeued = !again.is_empty();
    if requeued {
        let mut st = inner.state.borrow_mut();
        let at = st.queue.iter().take_while(|r| r.requeued).count();
        for mut r in again.into_iter().rev() {
            if !r.requeued {
                r.requeued = true;
                st.settles_requeued += 1;
            }
            st.queue_bytes += r.wal_bytes;
            st.queue.insert(at, r);
        }
    }
    if !moved.is_empty() {
        moved.sort();
        let callbacks: Vec<Rc<CommitCallback>> = inner.callbacks.borrow().clone();
        for cb in callbacks {
            cb(&moved);
        }
    }
    requeued
}
