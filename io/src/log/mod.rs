//! [`ShardLog`]: one shard's message log. It composes the shard's write-ahead log
//! ([`crate::wal::Wal`]) with per-partition segment files ([`crate::partition`]) and is the only
//! storage API the rest of the code uses.
//!
//! Owns: offset assignment (dense per partition, from 0), commit-time stamps, the high watermark
//! of every partition this shard owns, the settled (acked) state, checkpoints and recovery. Never
//! does: leases, routing, HTTP; never holds a `RefCell` borrow across an `.await`; never names
//! glommio outside this crate.
//!
//! # Parts
//! - `mod.rs`: the [`ShardLog`] handle, its configuration and errors, the request queue
//!   (appends, settles, backpressure, [`Durable`]), reads and figures, `close`, and the state the
//!   other parts share (`State`, `Inner`).
//! - `recovery.rs`: [`ShardLog::open`]: partition files loaded, the WAL replayed, gaps filled
//!   (point 3 of the crash-safety argument below).
//! - `commit.rs`: the committer task: batch planning, the pipelined hand-over to the WAL, and
//!   materialisation in WAL order (points 1 and 4).
//! - `checkpoint.rs`: checkpoints and the release of WAL segments (point 2).
//! - `transit.rs`: transit records for partitions owned elsewhere, their holds on the WAL and the
//!   `Handed` markers.
//! - `retention.rs`: topic deletion, retention, closing idle partition files (point 5).
//!
//! # Write path
//! Appends and settles queue in the shard log. One committer task takes whatever is queued (up to
//! the WAL's batch limits), assigns offsets and commit times, encodes the partition segment frames,
//! and hands all records to the WAL as ONE append call: one O_DIRECT write and one fdatasync for
//! every partition and producer in the batch. Up to `wal_batches_in_flight_max` batches are in
//! flight (pipelined group commit): the committer hands the next batch over as soon as the WAL
//! can start writing it and at least `wal_pipeline_min_bytes` are queued (at light load the queue
//! waits for the batch in flight instead of paying a second fsync for one message), assigning
//! offsets after those of the batches in flight (`planned_next`). The WAL resolves batches
//! strictly in order and a failed batch fails every batch behind it, so a failed batch needs no
//! rollback: once nothing is in flight the committer plans again from the partitions' ends in
//! their files, and the failed offsets are simply never used. After the WAL answers
//! durable-and-verified for the oldest batch, the committer writes its frames to the partition
//! segment files (page cache), which advances the high watermarks, then answers every appender
//! and runs the `on_commit` callbacks. A record is thus visible to readers only after it is
//! durable in the WAL.
//!
//! # Crash-safety argument
//! 1. An append is acknowledged only after its WAL batch is durable and verified (WAL contract).
//! 2. Segment files may lag the WAL (page cache). A checkpoint captures the WAL position `P` just
//!    after the last materialised batch (every WAL record before `P` is in the segment files and
//!    the settled state), then, off the executor thread, fdatasyncs every segment file written
//!    since the previous checkpoint, fsyncs the directories whose entries changed (new partitions,
//!    new segments), and replaces the dirty `consumer.state` files atomically (temp + fsync +
//!    rename + dir fsync). Only then does it append `Checkpoint { upto: P, marks }` to the WAL
//!    (`marks`: every partition's next offset at `P`) and release WAL segments wholly before `P`.
//!    An fsync error poisons the shard log (never retried).
//! 3. Recovery loads the partition files (CRC-checked; a torn tail of the newest segment is cut),
//!    then replays the WAL records from the last checkpoint's `P` on. Replay is idempotent: a
//!    message whose offset is already present is skipped, a missing one is appended (offsets in
//!    the WAL are authoritative), a hole (a WAL record lost to corruption) becomes a gap frame that
//!    reads as `Corrupt`; settles are re-applied (settling twice is a no-op). A partition whose
//!    files are damaged at or after its first offset in the replayed WAL (pages or a segment
//!    lost at a power failure) is first cut back to that offset, and the replay rewrites it.
//!    After the replay, a partition whose files end below its mark (damage at the very end of
//!    its newest segment, cut as a torn tail) gets gap frames up to the mark: those offsets read
//!    as corrupt and are never given to new records.
//!    Everything before `P`
//!    was fsynced in step 2, everything after is in the WAL, so every acknowledged record and
//!    every durable settle survives, whatever moment the crash hits.
//! 4. Records written to segment files but whose WAL batch failed cannot exist: frames are written
//!    only after the WAL succeeded. A WAL failure therefore leaves no trace but the unused offsets.
//! 5. A topic deleted here is checkpointed right after its directories are removed, so replay
//!    does not resurrect it; a WAL message for a partition that has no directory and a non-zero
//!    offset is skipped as belonging to a deleted partition.

mod checkpoint;
mod commit;
mod moves;
mod recovery;
mod retention;
mod transit;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Instant;

use crate::codec::{self, WalPosition, WalRecord};
use crate::partition::{frame, PartitionIoStats, PartitionLog, PartitionStats};
use crate::rt::{oneshot, Notify};
use crate::types::{
    Destination, FastMap, Offset, PartitionKey, ShardId, SharedBytes, TopicId, UnixMillis,
};
use crate::wal::{Wal, WalConfig, WalError};

pub use crate::partition::{ReadError, Settled, StoredRecord};
pub use moves::{MoveManifest, MoveStage};
pub use recovery::RecoveryReport;
pub use transit::{TransitHold, TransitSink};

/// Run after every commit with the partitions whose high watermark moved.
pub type CommitCallback = dyn Fn(&[PartitionKey]);

/// Bound on the offsets one settle call may carry.
pub const SETTLE_OFFSETS_MAX: usize = 65_536;
/// Default [`LogConfig::wal_pipeline_min_bytes`].
pub const WAL_PIPELINE_MIN_BYTES_DEFAULT: usize = 4096;

#[derive(Clone, Debug)]
pub struct LogConfig {
    pub data_dir: PathBuf,
    pub shard: ShardId,
    /// Shards on this node (fixed when the data directory was created): recovery loads only the
    /// partitions `owner_shard` assigns to `shard`.
    pub shard_count: u32,
    pub wal_segment_bytes: u64,
    /// Largest WAL batch gathering several requests.
    pub wal_batch_bytes_max: usize,
    pub wal_batch_records_max: usize,
    /// Largest single request (one produce, however large its batch): it is committed as one WAL
    /// batch of its own when over `wal_batch_bytes_max`, never split, so it lands whole or not.
    pub wal_append_bytes_max: usize,
    /// WAL batches in flight at once (pipelined group commit; 1 = one at a time).
    pub wal_batches_in_flight_max: usize,
    /// A batch is handed over while another is in flight only once this many bytes of WAL
    /// frames are queued; below it the queue waits for the batch in flight to resolve and goes as
    /// one batch. At light load a second batch of one or two messages only doubles the fsyncs
    /// (and the CPU spent on them) without making anyone's answer earlier.
    pub wal_pipeline_min_bytes: usize,
    /// Bytes of appends queued for the committer; appends beyond wait (backpressure).
    pub append_queue_bytes_max: usize,
    pub partition_segment_bytes_max: u64,
    pub checkpoint_wal_bytes: u64,
    pub checkpoint_interval_ms: u64,
    /// Tests only: the WAL's write fails after this many batches (`WalConfig::fail_after_batches`).
    pub wal_fail_after_batches: Option<u64>,
}

impl LogConfig {
    /// The largest single request the WAL takes: `wal_append_bytes_max`, but never below a batch
    /// nor above what one segment holds.
    pub fn wal_append_limit(&self) -> usize {
        let segment_fit = (self.wal_segment_bytes as usize).saturating_sub(codec::BATCH_ALIGN);
        self.wal_append_bytes_max
            .min(segment_fit)
            .max(self.wal_batch_bytes_max)
    }

    pub fn new(data_dir: PathBuf, shard: ShardId, shard_count: u32) -> LogConfig {
        LogConfig {
            data_dir,
            shard,
            shard_count,
            wal_segment_bytes: 64 << 20,
            wal_batch_bytes_max: 4 << 20,
            wal_batch_records_max: 16_384,
            wal_append_bytes_max: crate::wal::APPEND_BYTES_MAX_DEFAULT,
            wal_batches_in_flight_max: crate::wal::BATCHES_IN_FLIGHT_DEFAULT,
            wal_pipeline_min_bytes: WAL_PIPELINE_MIN_BYTES_DEFAULT,
            append_queue_bytes_max: 64 << 20,
            partition_segment_bytes_max: 64 << 20,
            checkpoint_wal_bytes: 64 << 20,
            checkpoint_interval_ms: 5_000,
            wal_fail_after_batches: None,
        }
    }

    /// `<data_dir>/ingress/shard-<i>`.
    pub fn wal_dir(&self) -> PathBuf {
        self.data_dir
            .join("ingress")
            .join(format!("shard-{}", self.shard.0))
    }
}

/// One record to append.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct AppendRecord {
    pub key: PartitionKey,
    pub msg_key: Option<Vec<u8>>,
    /// Shared with the request body it was parsed from (a batch's records take no allocation
    /// each) or with the read it came from (a fan-out copy).
    #[rkyv(with = crate::types::AsBytes)]
    pub payload: SharedBytes,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveredPartition {
    pub key: PartitionKey,
    pub next_offset: Offset,
    pub oldest_offset: Offset,
    pub settled: Settled,
}

/// Storage work of this shard log that failed and is not a partition's own figure
/// (`narad_errors_total{component="storage"}`), since the log was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogFailures {
    /// Checkpoints that failed (retried at the next one, or the log stopped).
    pub checkpoints: u64,
    /// Retention passes over a topic that failed to delete a file.
    pub retention: u64,
}

#[derive(Debug)]
pub enum LogError {
    /// The disk is full (WAL segment allocation failed); nothing of the call was written. A later
    /// call can succeed once space frees.
    DiskFull,
    /// A write or fsync failed earlier: this shard accepts no more writes until restarted.
    Poisoned(String),
    Io(std::io::Error),
    /// One call is larger than a WAL batch or a record larger than a frame.
    TooLarge,
    /// The log was closed.
    Closed,
    /// A record is for a topic deleted here (the produce raced the delete); nothing of the
    /// call was written.
    TopicDeleted,
}

impl std::fmt::Display for LogError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LogError::DiskFull => write!(f, "disk full"),
            LogError::Poisoned(why) => write!(f, "log stopped after an I/O failure: {why}"),
            LogError::Io(e) => write!(f, "log I/O error: {e}"),
            LogError::TooLarge => write!(f, "append larger than the largest WAL batch"),
            LogError::Closed => write!(f, "log closed"),
            LogError::TopicDeleted => write!(f, "topic deleted"),
        }
    }
}

impl std::error::Error for LogError {}

impl From<std::io::Error> for LogError {
    fn from(e: std::io::Error) -> Self {
        LogError::Io(e)
    }
}

impl From<WalError> for LogError {
    fn from(e: WalError) -> Self {
        match e {
            WalError::DiskFull => LogError::DiskFull,
            WalError::Poisoned(s) => LogError::Poisoned(s),
            WalError::Io(e) => LogError::Io(e),
            WalError::TooLarge => LogError::TooLarge,
        }
    }
}

impl LogError {
    fn copy(&self) -> LogError {
        match self {
            LogError::DiskFull => LogError::DiskFull,
            LogError::Poisoned(s) => LogError::Poisoned(s.clone()),
            LogError::Io(e) => LogError::Io(std::io::Error::new(e.kind(), e.to_string())),
            LogError::TooLarge => LogError::TooLarge,
            LogError::Closed => LogError::Closed,
            LogError::TopicDeleted => LogError::TopicDeleted,
        }
    }
}

enum Kind {
    Append,
    /// Records for partitions of another shard (see [`ShardLog::append_transit`]).
    Transit,
    Settle(Vec<(PartitionKey, Vec<Offset>)>),
    /// `Handed` markers (see [`ShardLog::transit_handed`]).
    Handed,
    Checkpoint,
}

/// One queued call: its WAL records (message offsets and times are filled in by the committer).
struct Request {
    kind: Kind,
    records: Vec<WalRecord>,
    wal_bytes: usize,
    reply: oneshot::Sender<Result<Vec<Offset>, LogError>>,
    /// A settle put back after its batch failed on a full disk (counted in
    /// `State::settles_requeued` until answered).
    requeued: bool,
}

/// The WAL records of a settle request: one per partition.
fn settle_records(parts: &[(PartitionKey, Vec<Offset>)]) -> Vec<WalRecord> {
    parts
        .iter()
        .map(|(key, offsets)| WalRecord::Settle {
            key: *key,
            offsets: offsets.clone(),
        })
        .collect()
}

struct State {
    partitions: FastMap<PartitionKey, PartitionLog>,
    queue: VecDeque<Request>,
    queue_bytes: usize,
    /// Settle requests in `queue` put back after a full disk failed their batch (at its front).
    settles_requeued: usize,
    /// Batches handed to the WAL and not yet materialised.
    inflight: usize,
    /// For partitions with batches in flight: the next offset to assign and the frame bytes
    /// planned but not yet written to their files.
    planned_next: FastMap<PartitionKey, (Offset, u64)>,
    /// Position just after the last durable batch; every WAL record before it is materialised.
    last_pos: Option<WalPosition>,
    /// Position just after the last durable batch holding more than checkpoint records: a
    /// checkpoint is owed only while this is past `last_checkpoint` (a checkpoint's own record
    /// never makes another one due).
    last_content_pos: Option<WalPosition>,
    last_checkpoint: Option<WalPosition>,
    wal_bytes_since_checkpoint: u64,
    last_checkpoint_at: Instant,
    /// Commit times are max(now, this): non-decreasing on the shard, so per partition too.
    last_stamp: UnixMillis,
    deleted_topics: HashSet<TopicId>,
    poisoned: Option<String>,
    closing: bool,
    closed: bool,
    /// Transit records durable and not yet handed over, by hold: a WAL position at or before
    /// the record. A checkpoint's `upto` never passes the smallest, so recovery replays them.
    transit_holds: BTreeMap<TransitHold, WalPosition>,
    /// Per destination: the next transit `seq` to assign (in WAL order, at planning)...
    transit_next: HashMap<Destination, u64>,
    /// ...one past the highest made durable...
    transit_durable: HashMap<Destination, u64>,
    /// ...and the last `Handed` marker queued.
    transit_marked: HashMap<Destination, u64>,
    /// Where the WAL stood at open: at or before every batch written since.
    open_pos: WalPosition,
    /// Transit records found by recovery, until the owner of the log takes them.
    recovered_transit: Vec<(TransitHold, AppendRecord)>,
}

struct Inner {
    cfg: LogConfig,
    wal: Wal,
    state: RefCell<State>,
    callbacks: RefCell<Vec<Rc<CommitCallback>>>,
    transit_sink: RefCell<Option<Rc<TransitSink>>>,
    checkpoint_running: Cell<bool>,
    checkpoint_done: Notify,
    failures: Cell<LogFailures>,
    /// Partition logs closed for idleness since the log was opened.
    idle_evicted: Cell<u64>,
    /// Retention passes that deleted segments of a partition whose log was closed for idleness.
    cold_swept: Cell<u64>,
}

/// Wake-ups shared with the committer without keeping the log alive.
struct Signals {
    /// New work queued (or close).
    work: Notify,
    /// A batch finished (queue space freed, progress made).
    progress: Notify,
}

/// One shard's log. Clone-able handle (Rc inside); lives on its shard.
#[derive(Clone)]
pub struct ShardLog {
    inner: Rc<Inner>,
    signals: Rc<Signals>,
}

fn wal_config(cfg: &LogConfig) -> WalConfig {
    WalConfig {
        dir: cfg.wal_dir(),
        segment_bytes: cfg.wal_segment_bytes,
        batch_bytes_max: cfg.wal_batch_bytes_max,
        batch_records_max: cfg.wal_batch_records_max,
        append_bytes_max: cfg.wal_append_limit(),
        // The committer hands a batch over only when the WAL can start it at once, so at most
        // one call waits in the WAL queue.
        queue_bytes_max: cfg.wal_batch_bytes_max,
        batches_in_flight_max: cfg
            .wal_batches_in_flight_max
            .clamp(1, crate::wal::BATCHES_IN_FLIGHT_MAX),
        // A checkpoint releases about this many segments at once; keeping as many covers the
        // rollovers until the next one. It is disk the WAL held just before the checkpoint. At
        // least two: a checkpoint that starts late releases two, and a segment deleted then
        // comes back as a spare written with zeros.
        recycle_segments_max: (cfg.checkpoint_wal_bytes / cfg.wal_segment_bytes.max(1)).clamp(2, 8)
            as usize,
        fail_after_batches: cfg.wal_fail_after_batches,
    }
}

impl ShardLog {
    fn refuse(&self) -> Option<LogError> {
        let st = self.inner.state.borrow();
        if st.closing || st.closed {
            return Some(LogError::Closed);
        }
        if let Some(p) = st.poisoned.clone().or_else(|| self.inner.wal.poisoned()) {
            return Some(LogError::Poisoned(p));
        }
        None
    }

    /// Queues a request (waiting while the queue is full) and waits for its answer.
    async fn submit(&self, kind: Kind, records: Vec<WalRecord>) -> Result<Vec<Offset>, LogError> {
        self.enqueue(kind, records).await?.await
    }

    /// Queues a request, waiting while the queue is full (backpressure). The returned
    /// [`Durable`] resolves with the request's answer once its batch is durable.
    async fn enqueue(&self, kind: Kind, records: Vec<WalRecord>) -> Result<Durable, LogError> {
        let wal_bytes: usize = records.iter().map(codec::encoded_len).sum();
        if codec::BATCH_HEADER_BYTES + wal_bytes > self.inner.cfg.wal_append_limit()
            || records.len() > self.inner.cfg.wal_batch_records_max
        {
            return Err(LogError::TooLarge);
        }
        loop {
            let progressed = self.signals.progress.notified();
            {
                let st = self.inner.state.borrow();
                if st.queue.is_empty()
                    || st.queue_bytes + wal_bytes <= self.inner.cfg.append_queue_bytes_max
                {
                    break;
                }
            }
            progressed.await;
            if !matches!(kind, Kind::Checkpoint) {
                if let Some(e) = self.refuse() {
                    return Err(e);
                }
            }
        }
        let (tx, rx) = oneshot::channel();
        {
            let mut st = self.inner.state.borrow_mut();
            st.queue_bytes += wal_bytes;
            st.queue.push_back(Request {
                kind,
                records,
                wal_bytes,
                reply: tx,
                requeued: false,
            });
        }
        self.signals.work.notify_waiters();
        Ok(Durable(rx))
    }

    /// Assigns offsets (dense per partition, from 0) and commit times (non-decreasing per
    /// partition), commits through the WAL group commit, and resolves after the batch is durable
    /// and verified AND the records are readable (high watermarks advanced). Offsets in input
    /// order.
    pub async fn append(&self, records: Vec<AppendRecord>) -> Result<Vec<Offset>, LogError> {
        if let Some(e) = self.refuse() {
            return Err(e);
        }
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let mut wal_records = Vec::with_capacity(records.len());
        {
            let st = self.inner.state.borrow();
            for r in records {
                if frame::message_frame_len(r.msg_key.as_deref(), &r.payload)
                    > frame::FRAME_BYTES_MAX
                {
                    return Err(LogError::TooLarge);
                }
                if st.deleted_topics.contains(&r.key.topic) {
                    return Err(LogError::TopicDeleted);
                }
                wal_records.push(WalRecord::Message {
                    key: r.key,
                    offset: Offset(0),
                    commit_ms: UnixMillis(0),
                    msg_key: r.msg_key,
                    payload: r.payload,
                });
            }
        }
        self.submit(Kind::Append, wal_records).await
    }

    /// Marks offsets acked; durable through a Settle WAL record in the next group commit.
    /// Resolves when durable.
    pub async fn settle(&self, key: PartitionKey, offsets: Vec<Offset>) -> Result<(), LogError> {
        self.settle_many(vec![(key, offsets)])
            .await?
            .await
            .map(|_| ())
    }

    /// Marks offsets of several partitions acked: one Settle WAL record per partition, all in
    /// the same group commit (one fsync for a batch ack spread over partitions). Resolves once
    /// the records are queued (waiting while the queue is full); the returned [`Durable`]
    /// resolves when they are durable. At most [`SETTLE_OFFSETS_MAX`] offsets per call.
    pub async fn settle_many(
        &self,
        mut parts: Vec<(PartitionKey, Vec<Offset>)>,
    ) -> Result<Durable, LogError> {
        if let Some(e) = self.refuse() {
            return Err(e);
        }
        parts.retain(|(_, offsets)| !offsets.is_empty());
        if parts.is_empty() {
            return Ok(Durable::done());
        }
        if parts.iter().map(|(_, o)| o.len()).sum::<usize>() > SETTLE_OFFSETS_MAX {
            return Err(LogError::TooLarge);
        }
        let recs = settle_records(&parts);
        self.enqueue(Kind::Settle(parts), recs).await
    }

    pub fn high_watermark(&self, key: PartitionKey) -> Offset {
        self.inner
            .state
            .borrow()
            .partitions
            .get(&key)
            .map_or(Offset(0), PartitionLog::next_offset)
    }

    pub fn oldest_offset(&self, key: PartitionKey) -> Offset {
        self.inner
            .state
            .borrow()
            .partitions
            .get(&key)
            .map_or(Offset(0), PartitionLog::oldest_offset)
    }

    /// Settle requests whose group commit failed on a full disk and that wait to be written
    /// again (they are retried until written; see `commit.rs`). While any wait, the disk is
    /// full for settles too: a caller that would answer an ack once queued refuses it instead.
    pub fn settle_backlog(&self) -> usize {
        self.inner.state.borrow().settles_requeued
    }

    /// The settled state of a partition (as of the last materialised batch).
    pub fn settled(&self, key: PartitionKey) -> Settled {
        self.inner
            .state
            .borrow()
            .partitions
            .get(&key)
            .map(PartitionLog::settled)
            .unwrap_or_default()
    }

    /// Records `[from, hwm)`, at most `max_records` and `max_bytes` (the first record is always
    /// included).
    pub async fn read(
        &self,
        key: PartitionKey,
        from: Offset,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<StoredRecord>, ReadError> {
        match self.inner.state.borrow().partitions.get(&key) {
            Some(p) => p.read(from, max_records, max_bytes),
            None => Ok(Vec::new()),
        }
    }

    pub fn stats(&self, key: PartitionKey) -> PartitionStats {
        self.inner
            .state
            .borrow()
            .partitions
            .get(&key)
            .map(PartitionLog::stats)
            .unwrap_or_default()
    }

    pub fn partitions(&self) -> Vec<PartitionKey> {
        let mut v: Vec<PartitionKey> = self
            .inner
            .state
            .borrow()
            .partitions
            .keys()
            .copied()
            .collect();
        v.sort();
        v
    }

    /// Registers a callback run after every commit with the partitions whose high watermark
    /// moved (wakes long-polls). Callbacks must not block.
    pub fn on_commit(&self, f: Box<CommitCallback>) {
        self.inner.callbacks.borrow_mut().push(Rc::from(f));
    }

    /// Graceful stop: waits for queued calls, checkpoints, stops the committer. Later calls answer
    /// `Closed`.
    pub async fn close(&self) -> Result<(), LogError> {
        self.inner.state.borrow_mut().closing = true;
        loop {
            let progressed = self.signals.progress.notified();
            {
                let st = self.inner.state.borrow();
                if st.queue.is_empty() && st.inflight == 0 {
                    break;
                }
            }
            progressed.await;
        }
        let r = if self.poisoned().is_none() {
            self.checkpoint().await
        } else {
            Ok(())
        };
        self.inner.state.borrow_mut().closed = true;
        self.signals.work.notify_waiters();
        let w = self.inner.wal.stats();
        tracing::info!(
            shard = self.inner.cfg.shard.0,
            batches = w.batches,
            records = w.records,
            records_per_batch_p50 = w.batch_records.quantile(0.5),
            fsync_us_p50 = w.fsync_latency_us.quantile(0.5),
            fsync_us_p99 = w.fsync_latency_us.quantile(0.99),
            commit_us_p50 = w.commit_latency_us.quantile(0.5),
            commit_us_p99 = w.commit_latency_us.quantile(0.99),
            "shard log closed"
        );
        r
    }

    /// Why this log stopped accepting writes, if it did.
    pub fn poisoned(&self) -> Option<String> {
        self.inner
            .state
            .borrow()
            .poisoned
            .clone()
            .or_else(|| self.inner.wal.poisoned())
    }

    /// Statistics of the shard's WAL (fsyncs, batch sizes, latencies).
    pub fn wal_stats(&self) -> crate::wal::WalStats {
        self.inner.wal.stats()
    }

    /// What the storage work of partition `key` cost since its log was opened here (`None` when
    /// this shard holds no log for it).
    pub fn io_stats(&self, key: PartitionKey) -> Option<PartitionIoStats> {
        self.inner
            .state
            .borrow()
            .partitions
            .get(&key)
            .map(PartitionLog::io_stats)
    }

    /// Commit time of the record at `offset` of partition `key` (see
    /// [`PartitionLog::commit_ms_at`]): one read of that record from the segment file.
    pub fn commit_ms_at(&self, key: PartitionKey, offset: Offset) -> Option<UnixMillis> {
        self.inner
            .state
            .borrow()
            .partitions
            .get(&key)?
            .commit_ms_at(offset)
    }

    /// Checkpoints and retention passes of this log that failed, since it was opened.
    pub fn failures(&self) -> LogFailures {
        self.inner.failures.get()
    }

    /// Partition logs whose segment file is open (not idle-evicted).
    pub fn open_logs(&self) -> usize {
        self.inner
            .state
            .borrow()
            .partitions
            .values()
            .filter(|p| p.is_open())
            .count()
    }

    /// Bytes of offset index held in memory by this shard's partitions.
    pub fn index_bytes(&self) -> usize {
        self.inner
            .state
            .borrow()
            .partitions
            .values()
            .map(PartitionLog::index_bytes)
            .sum()
    }
}

fn count_failure(inner: &Inner, f: impl FnOnce(&mut LogFailures)) {
    let mut v = inner.failures.get();
    f(&mut v);
    inner.failures.set(v);
}

fn poison(inner: &Inner, why: String) {
    tracing::error!(shard = inner.cfg.shard.0, reason = %why, "shard log stopped accepting writes");
    let mut st = inner.state.borrow_mut();
    if st.poisoned.is_none() {
        st.poisoned = Some(why);
    }
}

/// The answer to a queued request: resolves when the batch holding it is durable (or failed).
/// Dropping it does not withdraw the request; it is still written.
#[must_use = "a queued request is durable only once this resolves"]
pub struct Durable(oneshot::Receiver<Result<Vec<Offset>, LogError>>);

impl Durable {
    /// Already durable: nothing was queued.
    fn done() -> Self {
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(Ok(Vec::new()));
        Durable(rx)
    }
}

impl std::future::Future for Durable {
    type Output = Result<Vec<Offset>, LogError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(LogError::Closed)))
    }
}

/// Removes a directory tree; one that is already gone is not an error (blocking: run off the
/// executor).
fn remove_dir_if_present(dir: &std::path::Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
