//! The per-shard write-ahead log: pre-allocated segment files
//! `<dir>/<20-digit segment number>.wal`, filled with batches (group-commit units) of record
//! frames (`codec`, layout in `io/FORMAT.md`).
//!
//! Owns: the segment files of one shard's WAL, the group commit, recovery. Never interprets a
//! record except `Checkpoint`, never retries a failed write or fsync, and is touched from one
//! shard only (`Wal` is `!Send`, Rc inside).
//!
//! Parts:
//! - `core`: the group-commit state machine, sans I/O (queue, batch formation, outcomes).
//! - `recovery`: the scan that turns segment images into records, a write position and the torn
//!   tail to truncate, sans I/O.
//! - `driver`: [`Wal`], the real thing on glommio DMA files.
//! - `sim`: an in-memory, fault-injecting disk that runs the same `core` and `recovery`.
//!
//! Crash-safety argument, in one place:
//! 1. An append resolves `Ok` only after its batch was written with one O_DIRECT write,
//!    fdatasync'ed, read back and its checksums verified, and every earlier batch resolved Ok.
//!    A batch's write is issued only after every earlier write completed; with pipelining
//!    (`batches_in_flight_max` > 1) it may run while earlier batches are being fdatasync'ed and
//!    read back, and its header records how many were in flight. So at a crash every
//!    acknowledged batch is on disk and only batches in flight can be torn or missing: the last
//!    one, or a lost batch followed by batches started while it was in flight, which recovery
//!    recognises by that count.
//! 2. Segments are created with fallocate, fdatasync'ed and their directory fsync'ed before the
//!    first batch is written into them, so a durable batch never lives in a file whose size or
//!    name could vanish. ENOSPC can only come from that allocation, before anything is written.
//!    The next segment is a released segment file kept for reuse (`recycled-<n>.spare`), or one
//!    prepared in the background (`next-segment.spare`: fallocate, zeros written over it,
//!    fdatasync), under a name recovery never reads, renamed into place (then the directory
//!    fsync'ed) at rollover; such files found at open are deleted unread.
//! 3. Recovery accepts a batch only if its header checksum, sequence number and payload checksum
//!    are right. The header checksum covers the number of the segment the batch was written into,
//!    so the old batches left in a recycled file never pass in its new life. Garbage followed by
//!    a valid later batch is corruption of acknowledged data: counted, logged with
//!    `tracing::error!`, the intact prefix of that batch kept, and the scan goes on. Garbage
//!    followed by nothing valid is the batch that was in flight: every batch header of this
//!    segment in it is zeroed (truncated) before new batches are written, so it can never later
//!    pass for corruption in the middle; bytes that do not decode are overwritten in order.
//! 4. An error from write, fdatasync or the read-back poisons the log: the page cache state after
//!    a failed fsync is unknown, so nothing more is appended on this shard.

pub mod core;
pub mod driver;
pub mod recovery;
pub mod sim;

use std::path::PathBuf;

pub use crate::codec::{WalPosition, WalRecord};
use crate::types::{Offset, PartitionKey};
pub use driver::{segment_path, Wal, SPARE_NAME};

/// Default pipelining depth of the group commit.
pub const BATCHES_IN_FLIGHT_DEFAULT: usize = 2;
/// Default largest single append: a batch produce of the largest body the API takes (16 MiB)
/// plus the record headers of its messages, with room to spare, and half a default segment.
pub const APPEND_BYTES_MAX_DEFAULT: usize = 32 << 20;

/// Largest accepted `batches_in_flight_max` (recovery recognises this many lost in-flight batches).
pub const BATCHES_IN_FLIGHT_MAX: usize = recovery::PIPELINED_TAIL_BATCHES_MAX as usize + 1;

#[derive(Clone, Debug)]
pub struct WalConfig {
    pub dir: PathBuf,
    /// Size of every pre-allocated segment file. Multiple of 4096.
    pub segment_bytes: u64,
    /// Largest batch (header + payload, before padding) that gathers several appends.
    pub batch_bytes_max: usize,
    pub batch_records_max: usize,
    /// Largest single append (batch header included). An append larger than `batch_bytes_max`
    /// is written as a batch of its own, so one call is never split over two batches.
    pub append_bytes_max: usize,
    /// Encoded bytes waiting for a batch; appends beyond it wait (backpressure).
    pub queue_bytes_max: usize,
    /// Batches in flight at once (pipelined group commit): the next batch is written while the
    /// previous ones are being fdatasync'ed and read back. 1 = one batch at a time.
    pub batches_in_flight_max: usize,
    /// Released segment files kept to be reused as new segments instead of preparing zeroed ones
    /// (0 = delete every released segment).
    pub recycle_segments_max: usize,
    /// Tests only: after this many batches, the next batch's write fails as an I/O error would
    /// (the log is poisoned; what the node answers then is what such tests check).
    pub fail_after_batches: Option<u64>,
}

impl WalConfig {
    pub fn new(dir: PathBuf) -> WalConfig {
        WalConfig {
            dir,
            segment_bytes: 64 << 20,
            batch_bytes_max: 4 << 20,
            batch_records_max: 16384,
            append_bytes_max: APPEND_BYTES_MAX_DEFAULT,
            queue_bytes_max: 64 << 20,
            batches_in_flight_max: BATCHES_IN_FLIGHT_DEFAULT,
            recycle_segments_max: 4,
            fail_after_batches: None,
        }
    }
}

#[derive(Debug)]
pub enum WalError {
    /// ENOSPC while allocating a segment: nothing of this call was written; a later append can
    /// succeed once space frees.
    DiskFull,
    /// A write, fdatasync or read-back verification failed earlier: every append fails.
    Poisoned(String),
    Io(std::io::Error),
    /// One append call is larger than `append_bytes_max` or holds more than `batch_records_max`
    /// records.
    TooLarge,
}

impl WalError {
    /// A copy for every waiter of a failed batch (io errors keep their kind and message).
    pub fn clone_kind(&self) -> WalError {
        match self {
            WalError::DiskFull => WalError::DiskFull,
            WalError::Poisoned(s) => WalError::Poisoned(s.clone()),
            WalError::Io(e) => WalError::Io(std::io::Error::new(e.kind(), e.to_string())),
            WalError::TooLarge => WalError::TooLarge,
        }
    }
}

impl std::fmt::Display for WalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WalError::DiskFull => write!(
                f,
                "disk full: the write-ahead log cannot allocate a segment"
            ),
            WalError::Poisoned(why) => {
                write!(f, "write-ahead log stopped after an I/O failure: {why}")
            }
            WalError::Io(e) => write!(f, "write-ahead log I/O error: {e}"),
            WalError::TooLarge => write!(f, "append larger than one write-ahead log batch"),
        }
    }
}

impl std::error::Error for WalError {}

impl From<std::io::Error> for WalError {
    fn from(e: std::io::Error) -> Self {
        WalError::Io(e)
    }
}

/// Counts of values in power-of-two buckets: bucket `i` holds values in `[2^i, 2^(i+1))`
/// (bucket 0 also holds 0). Cheap enough for every batch; enough for p50/p99 within 2x.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Log2Histogram {
    pub buckets: [u64; 32],
}

impl Log2Histogram {
    pub fn record(&mut self, v: u64) {
        let i = (63 - (v | 1).leading_zeros()) as usize;
        self.buckets[i.min(31)] += 1;
    }
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
    /// Upper bound of the bucket holding quantile `q` (0..=1); 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        let n = self.count();
        if n == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b;
            if seen >= rank {
                return (1u64 << (i + 1)) - 1;
            }
        }
        u64::MAX
    }
}

/// Counters of one Wal since open, for /metrics.
#[derive(Clone, Debug, Default)]
pub struct WalStats {
    pub batches: u64,
    /// Batches started while an earlier one was still in flight.
    pub pipelined_batches: u64,
    pub fsyncs: u64,
    pub records: u64,
    /// Bytes written by batch writes, padding included.
    pub bytes_written: u64,
    pub disk_full: u64,
    pub segments_created: u64,
    pub segments_released: u64,
    /// New segments that were released segment files reused (no zero-fill).
    pub segments_recycled: u64,
    /// Records per batch.
    pub batch_records: Log2Histogram,
    /// fdatasync latency, microseconds.
    pub fsync_latency_us: Log2Histogram,
    /// Write + fdatasync + read-back of one batch, microseconds.
    pub commit_latency_us: Log2Histogram,
}

/// What recovery found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WalRecoveryStats {
    pub segments: u32,
    pub batches: u64,
    /// Intact records in the log (before the checkpoint filter).
    pub records: u64,
    /// Records returned to the caller (after the last checkpoint).
    pub records_replayed: u64,
    /// Batches in the middle of the log that failed their checks (acknowledged data damaged).
    pub corrupt_batches: u64,
    /// Records known lost in those batches (from their headers; a batch whose header is gone
    /// counts as lost batches only).
    pub corrupt_records: u64,
    /// Batch sequence numbers missing between intact batches.
    pub lost_batches: u64,
    /// Bytes zeroed at the tail of the newest segment (the torn batch in flight at the crash).
    pub torn_bytes: u64,
    /// Segments removed because they held nothing valid after the end of the log.
    pub removed_segments: u32,
    pub last_checkpoint: Option<WalPosition>,
    /// The marks of that checkpoint (see [`WalRecord::Checkpoint`]); empty without one.
    pub last_checkpoint_marks: Vec<(PartitionKey, Offset)>,
}
