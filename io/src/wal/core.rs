//! The group-commit state machine, free of I/O: a bounded queue of pending appends, the batch
//! currently in flight, the write position and the poisoned flag. The real driver
//! (`wal::driver`, glommio files) and the simulation (`wal::sim`, an in-memory faulty disk) run
//! this same code and differ only in how they carry out a [`BatchPlan`].
//!
//! Owns: which appends form the next batch, where it goes, what each waiter learns. Never does
//! I/O, never awaits, never retries a failed batch.
//!
//! Protocol (one batch in flight at a time):
//! 1. [`Core::submit`] queues the encoded frames of one append call (all of one call go into one
//!    batch, contiguous, in call order) and returns its ticket.
//! 2. [`Core::start_batch`] takes appends from the front of the queue up to `batch_bytes_max` /
//!    `batch_records_max`, lays the batch image into a caller-provided aligned buffer and says where
//!    it goes (rolling to a new segment when it does not fit the current one).
//! 3. The driver allocates the segment if asked, writes the image with one write, fdatasyncs, reads
//!    it back and verifies it, then calls [`Core::finish`] with the outcome.
//! 4. `finish` resolves the batch's tickets. On `Durable` they succeed with the position after the
//!    batch. On `DiskFull` (segment allocation refused) the batch and every append queued behind it
//!    fail with `DiskFull`, nothing was written and later appends may succeed. On `Failed` (write,
//!    fsync or verification error) the core is poisoned: the batch, everything queued and every
//!    later append fail with `Poisoned(reason)`.
//!
//! Crash safety: a ticket succeeds only after its batch was written, fdatasync'ed and read back
//! intact, and batches are written strictly one after another, so at any crash every acknowledged
//! batch is on disk and only the batch in flight can be torn. Recovery (`wal::recovery`) relies on
//! exactly that: garbage followed by no valid batch is the torn batch in flight.

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
    pub queue_bytes_max: usize,
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
    next_seq: u64,
    /// Where the next batch goes if it fits the segment.
    write_at: WalPosition,
    inflight: Option<(BatchPlan, Vec<Ticket>)>,
    poisoned: Option<String>,
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
        assert!(next_seq > 0);
        Core {
            cfg,
            pending: VecDeque::new(),
            pending_bytes: 0,
            next_ticket: 1,
            next_seq,
            write_at,
            inflight: None,
            poisoned: None,
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
        self.inflight.is_some()
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

    /// Checks an append before it waits for room: a poisoned log and an append that can never fit
    /// one batch are refused at once.
    pub fn check(&self, frame_bytes: usize, records: usize) -> Result<(), WalError> {
        if let Some(p) = &self.poisoned {
            return Err(WalError::Poisoned(p.clone()));
        }
        if BATCH_HEADER_BYTES + frame_bytes > self.cfg.batch_bytes_max
            || records > self.cfg.batch_records_max
        {
            return Err(WalError::TooLarge);
        }
        Ok(())
    }

    /// Queues the frames of one append call. The caller checked [`Core::has_room`].
    pub fn submit(&mut self, frames: Vec<u8>, records: u32) -> Result<Ticket, WalError> {
        self.check(frames.len(), records as usize)?;
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

    /// Forms the next batch if none is in flight and appends are queued. `alloc(span)` must return
    /// a zeroed-or-not buffer of exactly `span` bytes; the whole image is laid into it.
    pub fn start_batch<B: AsMut<[u8]>>(
        &mut self,
        alloc: impl FnOnce(usize) -> B,
    ) -> Option<(BatchPlan, B)> {
        if self.inflight.is_some() || self.pending.is_empty() || self.poisoned.is_some() {
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
        let (at, new_segment) = if self.write_at.byte + span as u64 <= self.cfg.segment_bytes {
            (self.write_at, false)
        } else {
            (
                WalPosition {
                    segment: self.write_at.segment + 1,
                    byte: 0,
                },
                true,
            )
        };
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
        codec::seal_batch(img, self.next_seq, records as u32, payload);
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
        };
        self.inflight = Some((plan.clone(), tickets));
        Some((plan, buf))
    }

    /// Resolves the batch in flight. Returns every ticket that is now decided, in ticket order.
    pub fn finish(&mut self, outcome: Outcome) -> Vec<(Ticket, Result<WalPosition, WalError>)> {
        let (plan, tickets) = self
            .inflight
            .take()
            .expect("finish without a batch in flight");
        match outcome {
            Outcome::Durable => {
                self.write_at = plan.end;
                self.next_seq += 1;
                self.stats.batches += 1;
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
                self.fail_all(tickets, WalError::DiskFull)
            }
            Outcome::Refused(why) => {
                self.fail_all(tickets, WalError::Io(std::io::Error::other(why)))
            }
            Outcome::Failed(why) => {
                tracing::error!(reason = %why, "write-ahead log poisoned: no more appends on this shard");
                self.poisoned = Some(why.clone());
                self.fail_all(tickets, WalError::Poisoned(why))
            }
        }
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
            queue_bytes_max: 32 << 10,
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
            codec::verify_batch(&img, 1)
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
    fn queue_bound_and_too_large() {
        // Proves the queue reports no room beyond queue_bytes_max (but always room when empty) and
        // that an append larger than one batch is refused with TooLarge.
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
        assert!(matches!(
            c.submit(frames(1, 3000), 1),
            Err(WalError::TooLarge)
        ));
        assert!(matches!(
            c.submit(frames(11, 1), 11),
            Err(WalError::TooLarge)
        ));
    }
}
