//! The group-commit state machine, free of I/O: a bounded queue of pending appends, the batch
//! currently in flight, the write position and the poisoned flag. The real driver
//! (`wal::driver`, glommio files) and the simulation (`wal::sim`, an in-memory faulty disk) run
//! this same code and differ only in how they carry out a [`BatchPlan`].
//!
//! Owns: which appends form the next batch, where it goes, what each waiter learns. Never does
//! I/O, never awaits, never retries a failed batch.
//!
//! Protocol (up to `batches_in_flight_max` batches in flight, resolved strictly in order):
//! 1. [`Core::submit`] queues the encoded frames of one append call (all of one call go into one
//!    batch, contiguous, in call order) and returns its ticket.
//! 2. [`Core::start_batch`] takes appends from the front of the queue up to `batch_bytes_max` /
//!    `batch_records_max`, lays the batch image into a caller-provided aligned buffer and says where
//!    it goes (rolling to a new segment when it does not fit the current one).
//! 3. The driver allocates the segment if asked, writes the image with one write, reports
//!    [`Core::written`], fdatasyncs, reads it back and verifies it, then calls [`Core::finish`]
//!    with the outcome. Pipelining: the next batch may start (step 2) once every batch in flight
//!    has been written, while their fdatasyncs and read-backs run; it carries the pipelined flag.
//!    A batch that needs a new segment starts only when nothing is in flight, so segment
//!    allocation (and DiskFull) only ever concerns a batch alone.
//! 4. `finish` resolves the oldest batch in flight (the driver calls it in batch order, each after
//!    that batch's own fdatasync and read-back). On `Durable` they succeed with the position after the
//!    batch. On `DiskFull` (segment allocation refused) the batch and every append queued behind it
//!    fail with `DiskFull`, nothing was written and later appends may succeed, except those
//!    submitted with [`Core::submit_after`] a refusal count read before it (their content
//!    continued the refused batch's: the shard log's offsets). On `Failed` (write,
//!    fsync or verification error) the core is poisoned: the batch, the batches in flight behind
//!    it, everything queued and every later append fail with `Poisoned(reason)`.
//!
//! Crash safety: a ticket succeeds only after its own batch was written, fdatasync'ed and read back
//! intact and every earlier batch succeeded, and a batch's write is issued only after every
//! earlier write completed. So at any crash every acknowledged batch is on disk and only batches
//! in flight can be torn or lost: the last one, or (power loss dropping a completed but unsynced
//! write) a batch in flight followed by pipelined ones. Recovery (`wal::recovery`) relies on
//! exactly that: garbage followed by no valid batch, or by nothing but pipelined batches, is the
//! torn tail.

use std::collections::VecDeque;

use super::{WalError, WalStats};
use crate::codec::{self, WalPosition, BATCH_HEADER_BYTES};

/// Identifies one append call; increases by one per call.
pub type Ticket = u64;

#[derive(Clone, Debug)]
pub struct CoreConfig {
    pub segment_bytes: u64,
    pub batch_bytes_max: usize,
    pub batch_records_max: usize,
    /// Largest single append; one over `batch_bytes_max` is a batch of its own.
    pub append_bytes_max: usize,
    pub queue_bytes_max: usize,
    /// Batches written but not yet resolved, at most (1 = no pipelining). At most
    /// `recovery::PIPELINED_TAIL_BATCHES_MAX + 1`.
    pub batches_in_flight_max: usize,
}

struct InFlight {
    plan: BatchPlan,
    tickets: Vec<Ticket>,
    /// The driver reported the write complete.
    written: bool,
}

struct Pending {
    ticket: Ticket,
    frames: Vec<u8>,
    records: u32,
}

/// What the driver must do for the next batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchPlan {
    pub seq: u64,
    /// Where the batch starts (aligned).
    pub at: WalPosition,
    /// `at.segment` does not exist yet: create and pre-allocate it before writing.
    pub new_segment: bool,
    /// Bytes of the image (a multiple of the batch alignment).
    pub span: usize,
    pub records: u32,
    pub appends: u32,
    /// Position right after the batch: what its appends resolve to.
    pub end: WalPosition,
    /// Earlier batches in flight when this one started (0 = not pipelined; in the batch header).
    pub in_flight_before: u8,
}

/// How the driver's attempt to make a batch durable ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Written, fdatasync'ed, read back and verified.
    Durable,
    /// Allocating the new segment failed with ENOSPC; nothing was written.
    DiskFull,
    /// Allocating the new segment failed otherwise; nothing was written, the log stays usable.
    Refused(String),
    /// Write, fdatasync or read-back verification failed: the log is poisoned.
    Failed(String),
}

pub struct Core {
    cfg: CoreConfig,
    pending: VecDeque<Pending>,
    pending_bytes: usize,
    next_ticket: Ticket,
    /// Sequence number of the next batch to start.
    next_seq: u64,
    /// End of the last durable batch.
    write_at: WalPosition,
    /// Where the next batch to start goes if it fits the segment (the end of the last batch
    /// started).
    plan_at: WalPosition,
    /// Oldest first.
    inflight: VecDeque<InFlight>,
    poisoned: Option<String>,
    /// Batches refused so far, and why the last one was (see [`Core::submit_after`]).
    refusals: u64,
    last_refusal: Option<WalError>,
    pub stats: WalStats,
}

impl Core {
    /// `write_at` is the end of the recovered log; `next_seq` the sequence number of the next batch.
    /// A `write_at` past `segment_bytes` (segments made under a larger setting) simply rolls over
    /// at the first batch.
    pub fn new(cfg: CoreConfig, next_seq: u64, write_at: WalPosition) -> Core {
        assert!(
            cfg.segment_bytes.is_multiple_of(codec::BATCH_ALIGN as u64),
            "segment size not aligned"
        );
        assert!(
            codec::batch_span(cfg.batch_bytes_max) as u64 <= cfg.segment_bytes,
            "batch_bytes_max does not fit a segment"
        );
        assert!(cfg.batch_records_max > 0 && cfg.queue_bytes_max > 0);
        assert!(
            (1..=super::recovery::PIPELINED_TAIL_BATCHES_MAX as usize + 1)
                .contains(&cfg.batches_in_flight_max),
            "batches_in_flight_max out of range"
        );
        assert!(next_seq > 0);
        Core {
            cfg,
            pending: VecDeque::new(),
            pending_bytes: 0,
            next_ticket: 1,
            next_seq,
            write_at,
            plan_at: write_at,
            inflight: VecDeque::new(),
            poisoned: None,
            refusals: 0,
            last_refusal: None,
            stats: WalStats::default(),
        }
    }

    pub fn poisoned(&self) -> Option<&str> {
        self.poisoned.as_deref()
    }

    pub fn write_at(&self) -> WalPosition {
        self.write_at
    }

    pub fn in_flight(&self) -> bool {
        !self.inflight.is_empty()
    }

    /// Batches started and not yet resolved.
    pub fn in_flight_count(&self) -> usize {
        self.inflight.len()
    }

    /// Whether [`Core::start_batch`] could start a batch now if appends were queued.
    pub fn can_start(&self) -> bool {
        self.poisoned.is_none()
            && self.inflight.len() < self.cfg.batches_in_flight_max
            && self.inflight.iter().all(|b| b.written)
    }

    /// The driver's write of batch `seq` completed: a later batch may start.
    pub fn written(&mut self, seq: u64) {
        if let Some(b) = self.inflight.iter_mut().find(|b| b.plan.seq == seq) {
            b.written = true;
        }
    }

    pub fn pending_appends(&self) -> usize {
        self.pending.len()
    }

    pub fn pending_bytes(&self) -> usize {
        self.pending_bytes
    }

    /// Whether an append of `frame_bytes` may be queued now. An empty queue always has room, so an
    /// append no larger than a batch never waits forever.
    pub fn has_room(&self, frame_bytes: usize) -> bool {
        self.pending.is_empty() || self.pending_bytes + frame_bytes <= self.cfg.queue_bytes_max
    }

    /// Checks an append before it waits for room: a poisoned log and an append that can never be
    /// written (over `append_bytes_max` or `batch_records_max`) are refused at once. One over
    /// `batch_bytes_max` is fine: it forms a batch of its own.
    pub fn check(&self, frame_bytes: usize, records: usize) -> Result<(), WalError> {
        if let Some(p) = &self.poisoned {
            return Err(WalError::Poisoned(p.clone()));
        }
        if BATCH_HEADER_BYTES + frame_bytes > self.cfg.append_bytes_max
            || records > self.cfg.batch_records_max
        {
            return Err(WalError::TooLarge);
        }
        Ok(())
    }

    /// Batches refused so far (segment allocation failed, nothing written).
    pub fn refusals(&self) -> u64 {
        self.refusals
    }

    /// Queues the frames of one append call. The caller checked [`Core::has_room`].
    pub fn submit(&mut self, frames: Vec<u8>, records: u32) -> Result<Ticket, WalError> {
        self.submit_after(frames, records, None)
    }

    /// [`Core::submit`] of an append whose content assumes that every append submitted since
    /// [`Core::refusals`] read `seen` succeeds (a caller that numbers records ahead of the
    /// WAL's answer, as the shard log's pipelined committer does with offsets). Refused with
    /// the last refusal's error when a batch was refused since: written after a refused batch,
    /// it would leave a gap in that numbering. Appends queued at the refusal fail with it
    /// already; this catches those submitted after it.
    pub fn submit_after(
        &mut self,
        frames: Vec<u8>,
        records: u32,
        seen: Option<u64>,
    ) -> Result<Ticket, WalError> {
        self.check(frames.len(), records as usize)?;
        if seen.is_some_and(|seen| seen != self.refusals) {
            return Err(self
                .last_refusal
                .as_ref()
                .map_or(WalError::DiskFull, WalError::clone_kind));
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.pending_bytes += frames.len();
        self.pending.push_back(Pending {
            ticket,
            frames,
            records,
        });
        Ok(ticket)
    }

    /// Forms the next batch if appends are queued, fewer than `batches_in_flight_max` batches are
    /// in flight and all of them are written. `alloc(span)` must return a zeroed-or-not buffer of
    /// exactly `span` bytes; the whole image is laid into it.
    pub fn start_batch<B: AsMut<[u8]>>(
        &mut self,
        alloc: impl FnOnce(usize) -> B,
    ) -> Option<(BatchPlan, B)> {
        if self.pending.is_empty() || !self.can_start() {
            return None;
        }
        // Pick appends: the first always fits (checked at submit); stop at either bound.
        let mut payload = 0usize;
        let mut records = 0usize;
        let mut n = 0usize;
        for p in &self.pending {
            let bytes = BATCH_HEADER_BYTES + payload + p.frames.len();
            if n > 0
                && (bytes > self.cfg.batch_bytes_max
                    || records + p.records as usize > self.cfg.batch_records_max)
            {
                break;
            }
            payload += p.frames.len();
            records += p.records as usize;
            n += 1;
        }
        let span = codec::batch_span(payload);
        let (at, new_segment) = if self.plan_at.byte + span as u64 <= self.cfg.segment_bytes {
            (self.plan_at, false)
        } else {
            (
                WalPosition {
                    segment: self.plan_at.segment + 1,
                    byte: 0,
                },
                true,
            )
        };
        if new_segment && !self.inflight.is_empty() {
            // A new segment starts only with nothing in flight.
            return None;
        }
        let in_flight_before = self.inflight.len() as u8;
        let mut buf = alloc(span);
        let img = buf.as_mut();
        assert_eq!(
            img.len(),
            span,
            "allocator returned a buffer of the wrong size"
        );
        let mut tickets = Vec::with_capacity(n);
        let mut w = BATCH_HEADER_BYTES;
        for _ in 0..n {
            let p = self.pending.pop_front().expect("counted above");
            img[w..w + p.frames.len()].copy_from_slice(&p.frames);
            w += p.frames.len();
            self.pending_bytes -= p.frames.len();
            tickets.push(p.ticket);
        }
        debug_assert_eq!(w, BATCH_HEADER_BYTES + payload);
        codec::seal_batch_flagged(
            img,
            at.segment,
            self.next_seq,
            records as u32,
            payload,
            in_flight_before,
        );
        let plan = BatchPlan {
            seq: self.next_seq,
            at,
            new_segment,
            span,
            records: records as u32,
            appends: n as u32,
            end: WalPosition {
                segment: at.segment,
                byte: at.byte + span as u64,
            },
            in_flight_before,
        };
        self.next_seq += 1;
        self.plan_at = plan.end;
        self.inflight.push_back(InFlight {
            plan: plan.clone(),
            tickets,
            written: false,
        });
        Some((plan, buf))
    }

    /// Resolves the oldest batch in flight. Returns every ticket that is now decided, in ticket
    /// order (nothing for a batch already failed when an earlier one poisoned the log).
    pub fn finish(&mut self, outcome: Outcome) -> Vec<(Ticket, Result<WalPosition, WalError>)> {
        let InFlight { plan, tickets, .. } = self
            .inflight
            .pop_front()
            .expect("finish without a batch in flight");
        if self.poisoned.is_some() {
            // Failed together with the batch that poisoned the log; its I/O has ended now.
            debug_assert!(tickets.is_empty());
            return Vec::new();
        }
        match outcome {
            Outcome::Durable => {
                assert!(
                    plan.at == self.write_at || (plan.new_segment && plan.at.byte == 0),
                    "batches resolve in order"
                );
                self.write_at = plan.end;
                self.stats.batches += 1;
                self.stats.pipelined_batches += u64::from(plan.in_flight_before > 0);
                self.stats.records += u64::from(plan.records);
                self.stats.bytes_written += plan.span as u64;
                self.stats.batch_records.record(u64::from(plan.records));
                if plan.new_segment {
                    self.stats.segments_created += 1;
                }
                tickets.into_iter().map(|t| (t, Ok(plan.end))).collect()
            }
            Outcome::DiskFull => {
                self.stats.disk_full += 1;
                self.refused(&plan, tickets, WalError::DiskFull)
            }
            Outcome::Refused(why) => {
                self.refused(&plan, tickets, WalError::Io(std::io::Error::other(why)))
            }
            Outcome::Failed(why) => {
                tracing::error!(reason = %why, "write-ahead log poisoned: no more appends on this shard");
                self.poisoned = Some(why.clone());
                let mut all = tickets;
                for b in &mut self.inflight {
                    all.append(&mut b.tickets);
                }
                self.fail_all(all, WalError::Poisoned(why))
            }
        }
    }

    /// Nothing of `plan` was written (segment allocation refused): the next batch takes its place.
    fn refused(
        &mut self,
        plan: &BatchPlan,
        tickets: Vec<Ticket>,
        e: WalError,
    ) -> Vec<(Ticket, Result<WalPosition, WalError>)> {
        // Only a batch that starts a segment can be refused, and it runs alone.
        assert!(
            self.inflight.is_empty(),
            "a refused batch had batches in flight behind it"
        );
        self.plan_at = self.write_at;
        self.next_seq = plan.seq;
        self.refusals += 1;
        self.last_refusal = Some(e.clone_kind());
        self.fail_all(tickets, e)
    }

    fn fail_all(
        &mut self,
        tickets: Vec<Ticket>,
        e: WalError,
    ) -> Vec<(Ticket, Result<WalPosition, WalError>)> {
        let mut out: Vec<_> = tickets
            .into_iter()
            .map(|t| (t, Err(e.clone_kind())))
            .collect();
        while let Some(p) = self.pending.pop_front() {
            out.push((p.ticket, Err(e.clone_kind())));
        }
        self.pending_bytes = 0;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{encode_record, WalRecord};
    use crate::types::{Offset, PartitionId, PartitionKey, TopicId};

    fn cfg() -> CoreConfig {
        CoreConfig {
            segment_bytes: 64 << 10,
            batch_bytes_max: 16 << 10,
            batch_records_max: 10,
            append_bytes_max: 40 << 10,
            queue_bytes_max: 32 << 10,
            batches_in_flight_max: 2,
        }
    }

    fn frames(n: usize, size: usize) -> Vec<u8> {
        let mut v = Vec::new();
        for _ in 0..n {
            encode_record(
                &WalRecord::Settle {
                    key: PartitionKey {
                        topic: TopicId(1),
                        partition: PartitionId(2),
                    },
                    offsets: vec![Offset(3); size],
                },
                &mut v,
            )
            .expect("encode");
        }
        v
    }

    #[test]
    fn batches_respect_record_and_byte_bounds_and_roll_segments() {
        // Proves a batch never exceeds batch_records_max or batch_bytes_max, takes appends whole and
        // in order, and rolls to the next segment when the current one cannot hold the batch.
        let mut c = Core::new(
            cfg(),
            1,
            WalPosition {
                segment: 0,
                byte: 0,
            },
        );
        for _ in 0..4 {
            c.submit(frames(4, 1), 4).expect("submit");
        }
        let (p, _) = c.start_batch(|n| vec![0u8; n]).expect("batch");
        assert_eq!(
            (p.appends, p.records),
            (2, 8),
            "10-record bound splits before the third append"
        );
        assert!(
            c.start_batch(|n| vec![0u8; n]).is_none(),
            "one batch in flight"
        );
        let done = c.finish(Outcome::Durable);
        assert_eq!(done.iter().map(|d| d.0).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(
            c.write_at(),
            WalPosition {
                segment: 0,
                byte: 4096
            }
        );
        // Big appends: each ~6 KiB; two fit 16 KiB, three do not.
        let mut c = Core::new(
            cfg(),
            1,
            WalPosition {
                segment: 3,
                byte: 60 << 10,
            },
        );
        for _ in 0..3 {
            c.submit(frames(1, 750), 1).expect("submit");
        }
        let (p, img) = c.start_batch(|n| vec![0u8; n]).expect("batch");
        assert_eq!(p.appends, 2);
        assert!(p.span <= codec::batch_span(16 << 10));
        assert!(
            p.new_segment
                && p.at
                    == WalPosition {
                        segment: 4,
                        byte: 0
                    }
        );
        assert_eq!(
            codec::verify_batch(&img, 4, 1)
                .expect("valid image")
                .record_count,
            2
        );
    }

    #[test]
    fn disk_full_fails_the_batch_and_everything_behind_it_then_recovers() {
        // Proves DiskFull fails the batch and the queued appends, leaves the log usable and the
        // write position unchanged.
        let mut c = Core::new(
            cfg(),
            5,
            WalPosition {
                segment: 0,
                byte: 60 << 10,
            },
        );
        c.submit(frames(1, 600), 1).expect("submit");
        let (p, _) = c.start_batch(|n| vec![0u8; n]).expect("batch");
        assert!(p.new_segment);
        c.submit(frames(1, 1), 1).expect("submit");
        let done = c.finish(Outcome::DiskFull);
        assert_eq!(done.len(), 2);
        assert!(done
            .iter()
            .all(|(_, r)| matches!(r, Err(WalError::DiskFull))));
        assert!(c.poisoned().is_none());
        c.submit(frames(1, 1), 1).expect("submit after disk full");
        let (p2, _) = c.start_batch(|n| vec![0u8; n]).expect("batch");
        assert_eq!(
            (p2.seq, p2.at),
            (
                5,
                WalPosition {
                    segment: 0,
                    byte: 60 << 10
                }
            )
        );
    }

    #[test]
    fn an_append_planned_before_a_refusal_is_refused_after_it() {
        // Proves submit_after: an append whose caller read the refusal count before a batch was
        // refused (its content numbered behind that batch) fails with the refusal's error and
        // queues nothing, while one that read the count after the refusal goes ahead; a plain
        // submit is unaffected. The shard log's committer relies on it (C2 of the s21 audit).
        let mut c = Core::new(
            cfg(),
            5,
            WalPosition {
                segment: 0,
                byte: 60 << 10,
            },
        );
        let seen = c.refusals();
        c.submit_after(frames(1, 600), 1, Some(seen))
            .expect("submit");
        let (p, _) = c.start_batch(|n| vec![0u8; n]).expect("batch");
        assert!(p.new_segment);
        assert_eq!(c.finish(Outcome::DiskFull).len(), 1);
        assert_eq!(c.refusals(), seen + 1);
        assert!(matches!(
            c.submit_after(frames(1, 1), 1, Some(seen)),
            Err(WalError::DiskFull)
        ));
        assert_eq!(c.pending_appends(), 0);
        c.submit_after(frames(1, 1), 1, Some(c.refusals()))
            .expect("planned after the refusal");
        c.submit(frames(1, 1), 1).expect("plain submit");
        assert_eq!(c.pending_appends(), 2);
        // A refusal for another reason is what the stale append learns.
        let (_, _) = c.start_batch(|n| vec![0u8; n]).expect("batch");
        let seen = c.refusals();
        let _ = c.finish(Outcome::Refused("EROFS".into()));
        assert!(matches!(
            c.submit_after(frames(1, 1), 1, Some(seen)),
            Err(WalError::Io(e)) if e.to_string().contains("EROFS")
        ));
    }

    #[test]
    fn a_position_past_a_smaller_segment_size_rolls_over() {
        // Proves a log recovered with a write position beyond the configured segment size (the
        // setting was lowered) does not panic and puts the next batch at byte 0 of a new segment.
        let mut c = Core::new(
            cfg(),
            9,
            WalPosition {
                segment: 2,
                byte: 1 << 20,
            },
        );
        c.submit(frames(1, 1), 1).expect("submit");
        let (p, _) = c.start_batch(|n| vec![0u8; n]).expect("batch");
        assert!(
            p.new_segment
                && p.at
                    == WalPosition {
                        segment: 3,
                        byte: 0
                    }
        );
    }

    #[test]
    fn failure_poisons_forever() {
        // Proves a write/fsync failure fails the batch and the queue with Poisoned(reason) and
        // every later append is refused with the same reason.
        let mut c = Core::new(cfg(), 1, WalPosition::default());
        c.submit(frames(1, 1), 1).expect("submit");
        c.start_batch(|n| vec![0u8; n]).expect("batch");
        c.submit(frames(1, 1), 1).expect("submit");
        let done = c.finish(Outcome::Failed("fdatasync: EIO".into()));
        assert!(done
            .iter()
            .all(|(_, r)| matches!(r, Err(WalError::Poisoned(w)) if w.contains("EIO"))));
        assert!(matches!(
            c.submit(frames(1, 1), 1),
            Err(WalError::Poisoned(_))
        ));
        assert!(c.start_batch(|n| vec![0u8; n]).is_none());
    }

    #[test]
    fn pipelining_respects_the_in_flight_bound_order_and_failure_rules() {
        // Proves a second batch starts only after the first one's write completed and carries
        // the pipelined count, that batches_in_flight_max bounds the batches in flight, that a
        // batch needing a new segment waits until nothing is in flight, that batches resolve
        // in order to their own end positions, and that a failure of the oldest fails the
        // batches in flight behind it (whose later completion then resolves nothing).
        let mut c = Core::new(cfg(), 1, WalPosition::default());
        let cap = |n: usize| vec![0u8; n];
        c.submit(frames(1, 1), 1).expect("submit");
        let (p1, _) = c.start_batch(cap).expect("first batch");
        c.submit(frames(1, 1), 1).expect("submit");
        assert_eq!(p1.in_flight_before, 0);
        assert!(c.start_batch(cap).is_none(), "first batch not written yet");
        c.written(p1.seq);
        let (p2, img2) = c.start_batch(cap).expect("pipelined batch");
        assert_eq!((p2.seq, p2.in_flight_before, p2.at), (2, 1, p1.end));
        assert_eq!(
            codec::decode_batch_header(&img2, p2.at.segment)
                .expect("header")
                .in_flight_before,
            1
        );
        c.written(p2.seq);
        c.submit(frames(1, 1), 1).expect("submit");
        assert!(
            c.start_batch(cap).is_none(),
            "batches_in_flight_max = 2 reached"
        );
        let done = c.finish(Outcome::Durable);
        assert!(done.iter().all(|(_, r)| *r.as_ref().expect("ok") == p1.end));
        assert_eq!(c.write_at(), p1.end);
        let (p3, _) = c.start_batch(cap).expect("slot freed");
        assert_eq!((p3.seq, p3.in_flight_before), (3, 1));
        let done = c.finish(Outcome::Durable);
        assert!(done.iter().all(|(_, r)| *r.as_ref().expect("ok") == p2.end));
        // The oldest (p3) fails: the batch behind it fails with it.
        c.written(p3.seq);
        c.submit(frames(1, 1), 1).expect("submit");
        let (p4, _) = c.start_batch(cap).expect("pipelined");
        c.submit(frames(1, 1), 1).expect("submit");
        let queued = c.pending_appends() as u32;
        let done = c.finish(Outcome::Failed("fdatasync: EIO".into()));
        assert_eq!(done.len() as u32, p3.appends + p4.appends + queued);
        assert!(done
            .iter()
            .all(|(_, r)| matches!(r, Err(WalError::Poisoned(_)))));
        assert!(c.finish(Outcome::Durable).is_empty(), "p4 already failed");
        // A batch that needs a new segment waits for an empty pipeline.
        let mut c = Core::new(
            cfg(),
            1,
            WalPosition {
                segment: 0,
                byte: (64 << 10) - 8192,
            },
        );
        c.submit(frames(1, 700), 1).expect("submit");
        let (q1, _) = c.start_batch(cap).expect("fits the segment");
        assert!(!q1.new_segment);
        c.submit(frames(1, 700), 1).expect("submit");
        c.written(q1.seq);
        assert!(c.start_batch(cap).is_none(), "a new segment waits");
        c.finish(Outcome::Durable);
        let (q2, _) = c.start_batch(cap).expect("alone now");
        assert!(q2.new_segment && q2.in_flight_before == 0);
    }

    #[test]
    fn queue_bound_and_too_large() {
        // Proves the queue reports no room beyond queue_bytes_max (but always room when empty) and
        // that an append larger than append_bytes_max (or with more records than a batch holds)
        // is refused with TooLarge.
        let mut c = Core::new(cfg(), 1, WalPosition::default());
        let f = frames(1, 1000);
        assert!(c.has_room(f.len()));
        let mut queued = 0;
        while c.has_room(f.len()) {
            c.submit(f.clone(), 1).expect("submit");
            queued += 1;
            assert!(queued < 100, "queue bound never hit");
        }
        assert!(c.pending_bytes() <= 32 << 10);
        assert!(frames(1, 6000).len() > 40 << 10);
        assert!(matches!(
            c.submit(frames(1, 6000), 1),
            Err(WalError::TooLarge)
        ));
        assert!(matches!(
            c.submit(frames(11, 1), 11),
            Err(WalError::TooLarge)
        ));
    }

    #[test]
    fn an_append_over_a_batch_is_a_batch_of_its_own() {
        // Proves an append larger than batch_bytes_max (but within append_bytes_max) is taken
        // whole into one batch, alone, between the batches of the appends around it.
        let mut c = Core::new(cfg(), 1, WalPosition::default());
        let big = frames(1, 3000);
        assert!(big.len() > 16 << 10 && big.len() < 40 << 10);
        let t1 = c.submit(frames(1, 10), 1).expect("small");
        let t2 = c.submit(big.clone(), 1).expect("big append accepted");
        let t3 = c.submit(frames(1, 10), 1).expect("small");
        let mut got = Vec::new();
        for i in 0..3 {
            let (p, img) = c.start_batch(|n| vec![0u8; n]).expect("batch");
            assert_eq!(p.appends, 1, "one append per batch here");
            let n = img.len();
            if i == 1 {
                assert!(
                    n >= BATCH_HEADER_BYTES + big.len(),
                    "the big append whole: {n}"
                );
            } else {
                assert!(n < 16 << 10, "a small batch: {n}");
            }
            c.written(p.seq);
            got.extend(c.finish(Outcome::Durable).into_iter().map(|(t, r)| {
                r.expect("durable");
                t
            }));
        }
        assert_eq!(got, vec![t1, t2, t3], "answered in order, each once");
        assert!(c.start_batch(|n| vec![0u8; n]).is_none());
    }
}
