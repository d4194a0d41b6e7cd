//! Per-partition segment files: the copy of committed records that reads are served from.
//!
//! Owns: the files under `<data_dir>/topics/<topic id hex>/p<5 digits>/` of one partition —
//! segment files `<20-digit first offset>.seg` and the `consumer.state` file — and the in-memory
//! offset index over them (per segment a `Vec<u32>` of record positions: 4 bytes per record,
//! O(1) lookup of an offset inside a segment, O(log segments) to find the segment). Reads of a
//! range cost one `pread` per segment touched. Also the figures of its own storage work for
//! `/metrics` ([`PartitionIoStats`]: one timing per batch write, per checkpoint share and per
//! retention pass, never per record).
//!
//! Never does: assign offsets (the caller, `io::log::ShardLog`, does), decide what is durable,
//! or cache payloads. It never rewrites a record once written; retention deletes whole sealed
//! segments only; the active (newest) segment is never deleted.
//!
//! Crash safety. Writes here are plain page-cache `pwrite`s, made only *after* the WAL batch
//! holding the same records is durable and verified, so a crash can lose only records that the
//! WAL still holds (the WAL is released only after a checkpoint has fsynced these files via
//! [`PartitionLog::take_sync_work`]). Recovery ([`PartitionLog::open`]) therefore may trust
//! nothing written after the last checkpoint: it scans every frame (length bound, CRC, offset
//! sequence), truncates a torn tail of the newest segment (those records are replayed from the
//! WAL by the caller), and keeps offsets dense across damage in the middle: an unreadable frame
//! or a hole keeps its index slot and reads of it answer [`ReadError::Corrupt`] (counted and
//! logged loudly, never silently dropped). A new segment file or partition directory is made
//! durable by fsyncing its parent directories at the next checkpoint, before the WAL is released.
//!
//! Sealed segments get an index file `<first offset>.idx` (the positions, CRC-checked) at the
//! first checkpoint after they are sealed, written only after the segment data was fdatasync'ed
//! (temp + fsync + rename). Recovery loads a sealed segment from its index when the index is
//! intact and the segment is at least as long as it says, and scans it otherwise; so a restart
//! reads about 4 bytes per record of old data, and scans only the newest segment and segments
//! sealed since the last checkpoint. Frames are still CRC-checked on every read.

pub mod frame;
pub mod state;

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::durable;
use crate::stats::Durations;
use crate::types::{Offset, PartitionId, PartitionKey, SharedBytes, TopicId, UnixMillis};
pub use state::{Settled, SettledSet};

/// Positions are `u32`, so a segment must stay below 4 GiB; configs are clamped to this.
pub const SEGMENT_BYTES_MAX_LIMIT: u64 = 1 << 30;
/// Segment space is reserved (fallocate, size kept) ahead of writes, so that a full disk shows
/// up before the WAL write, not after it. A reservation runs as far ahead as the segment is
/// long, between these two bounds: a partition that gets one small message holds 16 KiB of disk,
/// not a megabyte (thousands of quiet partitions would otherwise fill a volume with nothing), and
/// a busy one reserves a megabyte at a time.
pub const RESERVE_CHUNK_BYTES_MIN: u64 = 16 << 10;
pub const RESERVE_CHUNK_BYTES: u64 = 1 << 20;
/// Bound on the records one read returns, whatever the caller asks.
pub const READ_RECORDS_MAX: usize = 65_536;
/// Bound on the directory entries one partition directory may list at recovery.
pub const SEGMENTS_PER_PARTITION_MAX: usize = 1 << 20;

/// One record as read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredRecord {
    pub offset: Offset,
    pub commit_ms: UnixMillis,
    pub msg_key: Option<SharedBytes>,
    pub payload: SharedBytes,
}

#[derive(Debug)]
pub enum ReadError {
    /// The offset was deleted by retention; `oldest` is the oldest readable offset.
    BelowRetention {
        oldest: Offset,
    },
    /// The record at `offset` cannot be read (damaged frame or recovery gap). It stays damaged:
    /// a queue consumer skips it (SEMANTICS.md §2.9).
    Corrupt {
        offset: Offset,
    },
    Io(std::io::Error),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::BelowRetention { oldest } => {
                write!(f, "offset deleted by retention; oldest is {}", oldest.0)
            }
            ReadError::Corrupt { offset } => {
                write!(f, "record at offset {} is unreadable", offset.0)
            }
            ReadError::Io(e) => write!(f, "read failed: {e}"),
        }
    }
}

impl std::error::Error for ReadError {}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartitionStats {
    pub segments: u32,
    pub size_bytes: u64,
    pub oldest_offset: Offset,
    /// Next offset to be assigned (equals the high watermark between batches).
    pub next_offset: Offset,
    pub high_watermark: Offset,
    pub oldest_segment_at: Option<UnixMillis>,
}

/// What one partition's storage work cost since its log was opened here (OPERATIONS.md §9.5).
/// Kept on the partition (plain fields, no allocation), read at scrape time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartitionIoStats {
    /// Writes of committed frames to the active segment (page cache), one per commit batch.
    pub flush: Durations,
    /// Frame bytes those writes carried.
    pub flush_bytes: u64,
    /// The fdatasyncs and directory fsyncs of this partition's share of each checkpoint.
    pub fsync: Durations,
    /// This partition's whole share of each checkpoint (fsyncs, index and consumer state
    /// files), after which its high watermark no longer depends on the WAL: completed ones.
    pub persist_ok: Durations,
    /// The same, for shares that failed.
    pub persist_failed: Durations,
    /// Retention passes over this partition (topics with a retention only).
    pub retention_runs: Durations,
    /// Segment bytes and records (offsets) retention deleted.
    pub retention_bytes_deleted: u64,
    pub retention_records_deleted: u64,
}

/// How long one partition's checkpoint share took: its fsyncs alone and the whole share.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncTimes {
    pub fsync: Duration,
    pub total: Duration,
}

/// What recovery found in one partition's files.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanReport {
    pub segments: u32,
    pub records: u64,
    /// Bytes cut from the tail of the newest segment (never acknowledged from here: the WAL
    /// replays whatever of it was acknowledged).
    pub torn_tail_bytes: u64,
    /// Offsets whose frame is damaged or missing in the middle (reads answer `Corrupt`).
    pub corrupt_records: u64,
    /// Sealed segments loaded from their index file instead of being scanned.
    pub indexed_segments: u32,
}

impl ScanReport {
    pub fn add(&mut self, o: &ScanReport) {
        self.segments += o.segments;
        self.records += o.records;
        self.torn_tail_bytes += o.torn_tail_bytes;
        self.corrupt_records += o.corrupt_records;
        self.indexed_segments += o.indexed_segments;
    }
}

/// `<data_dir>/topics`.
pub fn topics_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("topics")
}

pub fn topic_dir(data_dir: &Path, topic: TopicId) -> PathBuf {
    topics_dir(data_dir).join(topic.to_string())
}

pub fn partition_dir(data_dir: &Path, key: PartitionKey) -> PathBuf {
    topic_dir(data_dir, key.topic).join(format!("p{:05}", key.partition.0))
}

fn segment_path(dir: &Path, base: Offset) -> PathBuf {
    dir.join(format!("{:020}.seg", base.0))
}

/// The topic ids of the directories under `<data_dir>/topics`, visiting at most `max_entries`
/// entries (other entries are skipped).
pub fn topic_dir_ids(data_dir: &Path, max_entries: usize) -> Vec<TopicId> {
    let Ok(rd) = std::fs::read_dir(topics_dir(data_dir)) else {
        return Vec::new();
    };
    rd.flatten()
        .take(max_entries)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let name = e.file_name();
            let name = name.to_str()?;
            (name.len() == 16)
                .then(|| u64::from_str_radix(name, 16).ok())
                .flatten()
                .map(TopicId)
        })
        .collect()
}

/// Every partition directory under `<data_dir>/topics`, with its key. Unknown names are skipped
/// with a warning.
pub fn scan_partition_dirs(data_dir: &Path) -> std::io::Result<Vec<(PartitionKey, PathBuf)>> {
    let mut out = Vec::new();
    let topics = match std::fs::read_dir(topics_dir(data_dir)) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for t in topics {
        let t = t?;
        let name = t.file_name();
        let name = name.to_string_lossy();
        let topic = match (name.len() == 16).then(|| u64::from_str_radix(&name, 16)) {
            Some(Ok(id)) => TopicId(id),
            _ => {
                tracing::warn!(path = %t.path().display(), "unexpected entry in topics directory; ignored");
                continue;
            }
        };
        for p in std::fs::read_dir(t.path())? {
            let p = p?;
            let pname = p.file_name();
            let pname = pname.to_string_lossy();
            let partition = pname
                .strip_prefix('p')
                .filter(|d| d.len() == 5 && d.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|d| d.parse::<u32>().ok());
            match partition {
                Some(n) => out.push((
                    PartitionKey {
                        topic,
                        partition: PartitionId(n),
                    },
                    p.path(),
                )),
                None => {
                    tracing::warn!(path = %p.path().display(), "unexpected entry in topic directory; ignored")
                }
            }
        }
    }
    out.sort_by_key(|(k, _)| *k);
    Ok(out)
}

/// Frames of one partition for one commit, encoded before the WAL write and written to the
/// segment file after it is durable.
#[derive(Debug)]
pub struct EncodedBatch {
    first: Offset,
    bytes: Vec<u8>,
    starts: Vec<u32>,
    first_commit_ms: Option<UnixMillis>,
    last_commit_ms: Option<UnixMillis>,
}

impl EncodedBatch {
    pub fn new(first: Offset) -> EncodedBatch {
        EncodedBatch::with_capacity(first, 0, 0)
    }

    /// An empty batch with room for `records` frames of `bytes` in all, so that pushing them
    /// never grows (and copies) the buffer.
    pub fn with_capacity(first: Offset, bytes: usize, records: usize) -> EncodedBatch {
        EncodedBatch {
            first,
            bytes: Vec::with_capacity(bytes),
            starts: Vec::with_capacity(records),
            first_commit_ms: None,
            last_commit_ms: None,
        }
    }

    pub fn first(&self) -> Offset {
        self.first
    }

    /// The offset the next pushed record gets.
    pub fn next(&self) -> Offset {
        Offset(self.first.0 + self.starts.len() as u64)
    }

    pub fn len(&self) -> usize {
        self.starts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    pub fn byte_len(&self) -> usize {
        self.bytes.len()
    }

    /// Appends a message frame; the caller bounds its size by `frame::FRAME_BYTES_MAX`.
    pub fn push_message(
        &mut self,
        commit_ms: UnixMillis,
        msg_key: Option<&[u8]>,
        payload: &[u8],
    ) -> Offset {
        let offset = self.next();
        self.starts.push(self.bytes.len() as u32);
        frame::encode_message(&mut self.bytes, offset, commit_ms, msg_key, payload);
        self.first_commit_ms.get_or_insert(commit_ms);
        self.last_commit_ms = Some(commit_ms);
        offset
    }

    /// Appends a gap frame (an offset whose record was lost).
    pub fn push_gap(&mut self) -> Offset {
        let offset = self.next();
        self.starts.push(self.bytes.len() as u32);
        frame::encode_gap(&mut self.bytes, offset);
        offset
    }
}

struct Segment {
    base: Offset,
    /// Byte position of record `base + i`. Non-decreasing; a damaged record or a hole keeps a
    /// slot (several slots may share a position).
    positions: Vec<u32>,
    /// End of the last indexed frame.
    size_bytes: u64,
    first_commit_ms: Option<UnixMillis>,
    last_commit_ms: Option<UnixMillis>,
    path: PathBuf,
    /// Its `.idx` file exists (written at a checkpoint after the data was fsynced).
    indexed: bool,
}

impl Segment {
    fn empty(base: Offset) -> Segment {
        Segment {
            base,
            positions: Vec::new(),
            size_bytes: frame::SEGMENT_HEADER_BYTES as u64,
            first_commit_ms: None,
            last_commit_ms: None,
            path: PathBuf::new(),
            indexed: false,
        }
    }

    fn index_path(&self) -> PathBuf {
        self.path.with_extension("idx")
    }

    fn end(&self) -> Offset {
        Offset(self.base.0 + self.positions.len() as u64)
    }

    /// End of the byte region of record index `i`.
    fn region_end(&self, i: usize) -> u64 {
        self.positions
            .get(i + 1)
            .map_or(self.size_bytes, |&p| u64::from(p))
    }
}

/// Files fsynced and written by a checkpoint for one partition (blocking: run off the executor).
pub struct SyncWork {
    key: PartitionKey,
    files: Vec<File>,
    dirs: Vec<PathBuf>,
    state: Option<(PathBuf, Settled)>,
    /// Sealed segments without an index file: (segment path, encoded index).
    seal: Vec<(PathBuf, Vec<u8>)>,
}

/// Why a checkpoint's sync work failed.
#[derive(Debug)]
pub enum SyncError {
    /// An fdatasync of segment data or an fsync of a directory failed: what the page cache holds
    /// is unknown now, so the caller must stop writing (never retry).
    Fsync(std::io::Error),
    /// Writing an index or consumer state file failed (disk full, for one): nothing was
    /// replaced, the old files stay valid, and a later checkpoint can retry after
    /// [`PartitionLog::sync_failed`].
    Write(std::io::Error),
}

impl std::fmt::Display for SyncError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SyncError::Fsync(e) => write!(f, "fsync failed: {e}"),
            SyncError::Write(e) => write!(f, "writing an index or state file failed: {e}"),
        }
    }
}

/// Writes `<segment>.idx` (the caller fdatasync'ed the segment), atomically (`<segment>.idx.tmp`,
/// fdatasync, rename); the caller fsyncs the directory once for all the indexes it wrote.
fn write_index_file(seg: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let idx = seg.with_extension("idx");
    durable::write_temp(&idx, bytes)?;
    durable::rename_temp(&idx)
}

/// Runs `f` (an fsync), adding the time it took to `spent`.
fn timed<T>(spent: &mut Duration, f: impl FnOnce() -> T) -> T {
    let t0 = Instant::now();
    let r = f();
    *spent += t0.elapsed();
    r
}

impl SyncWork {
    /// The partition this work belongs to.
    pub fn key(&self) -> PartitionKey {
        self.key
    }

    /// fdatasyncs the segment files, fsyncs the directories whose entries changed, and replaces
    /// the consumer state file atomically.
    pub fn run(self) -> Result<(), SyncError> {
        self.run_timed().1
    }

    /// [`SyncWork::run`], also answering how long its fsyncs and the whole work took (whether
    /// it succeeded or not).
    pub fn run_timed(self) -> (SyncTimes, Result<(), SyncError>) {
        let t0 = Instant::now();
        let mut fsync = Duration::ZERO;
        let r = self.run_inner(&mut fsync);
        let times = SyncTimes {
            fsync,
            total: t0.elapsed(),
        };
        (times, r)
    }

    fn run_inner(&self, fsync: &mut Duration) -> Result<(), SyncError> {
        let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
        for f in &self.files {
            timed(fsync, || f.sync_data()).map_err(SyncError::Fsync)?;
        }
        for (seg, _) in &self.seal {
            match timed(fsync, || File::open(seg).and_then(|f| f.sync_data())) {
                // Deleted since (retention, delete_topic).
                Err(e) if gone(&e) => {}
                r => r.map_err(SyncError::Fsync)?,
            }
        }
        for d in &self.dirs {
            match timed(fsync, || durable::sync_dir(d)) {
                // The partition was deleted since (delete_topic): nothing left to make durable.
                Err(e) if gone(&e) => {}
                r => r.map_err(SyncError::Fsync)?,
            }
        }
        for (seg, bytes) in &self.seal {
            match write_index_file(seg, bytes) {
                Err(e) if gone(&e) => {}
                r => r.map_err(SyncError::Write)?,
            }
        }
        for d in self.seal.iter().filter_map(|(p, _)| p.parent()) {
            match timed(fsync, || durable::sync_dir(d)) {
                Err(e) if gone(&e) => {}
                r => r.map_err(SyncError::Fsync)?,
            }
        }
        if let Some((dir, s)) = &self.state {
            match state::write_state_file(dir, s) {
                Err(e) if gone(&e) => {}
                r => r.map_err(SyncError::Write)?,
            }
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
            && self.dirs.is_empty()
            && self.state.is_none()
            && self.seal.is_empty()
    }
}

/// Writeback of the active segment is started for each aligned block of this many bytes as soon
/// as an append completes it, rather than left to the checkpoint's fdatasync.
const WRITEBACK_STEP_BYTES: u64 = 1 << 20;

/// The [`WRITEBACK_STEP_BYTES`]-aligned blocks that an append of `len` bytes at `at` completed, as
/// `(from, len)`. Derived from the positions alone, so a rolled-back append or a new segment
/// needs no bookkeeping.
fn completed_blocks(at: u64, len: u64) -> Option<(u64, u64)> {
    let from = at / WRITEBACK_STEP_BYTES * WRITEBACK_STEP_BYTES;
    let to = (at + len) / WRITEBACK_STEP_BYTES * WRITEBACK_STEP_BYTES;
    (to > from).then_some((from, to - from))
}

/// Starts writeback of `[from, from + len)` of `f` without waiting for it
/// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`): a hint that makes no data durable (the checkpoint's
/// fdatasync still does, and reports errors). Left to the checkpoint alone, a shard's partition
/// files reached the device as one burst of up to 256 MiB every few seconds; the WAL's next
/// fdatasync flushed the device cache behind it and took 25-250 ms (W2 p99.9 ~100 ms).
fn start_writeback(f: &File, from: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain syscall on an open descriptor owned by `f`; no memory is passed.
    let _ = unsafe {
        libc::sync_file_range(
            f.as_raw_fd(),
            from as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        )
    };
}

/// One partition's segment files, index and consumer state. Lives on the owning shard.
pub struct PartitionLog {
    key: PartitionKey,
    dir: PathBuf,
    segment_bytes_max: u64,
    segments: VecDeque<Segment>,
    /// Read/write handle of the newest segment; `None` while the log is idle-evicted
    /// ([`Self::evict_if_idle`]): the next write reopens it, reads open the file for themselves.
    active: Option<File>,
    active_dirty: bool,
    /// When the log was last written or read.
    last_used: std::cell::Cell<Instant>,
    /// Bytes of the active segment file backed by allocated blocks.
    reserved_end: u64,
    /// Handles of sealed segments written since the last checkpoint.
    unsynced: Vec<File>,
    dirs_to_sync: Vec<PathBuf>,
    settled: SettledSet,
    settled_dirty: bool,
    /// Offset ranges `[from, to)` found damaged or missing by the recovery scan.
    damaged: Vec<(Offset, Offset)>,
    io: PartitionIoStats,
}

fn open_rw(path: &Path) -> std::io::Result<File> {
    open_noatime(OpenOptions::new().read(true).write(true), path)
}

/// Opens with `O_NOATIME` where the kernel allows it (the file's owner), else without. Reads of
/// a segment right behind its writes would otherwise update the access time and dirty the
/// inode; on nojournal ext4 the next fdatasync of any file whose inode shares that inode table
/// block (the WAL's among them) then writes the block before its flush.
fn open_noatime(o: &OpenOptions, path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    match o.clone().custom_flags(libc::O_NOATIME).open(path) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => o.open(path),
        r => r,
    }
}

fn create_segment(dir: &Path, key: PartitionKey, base: Offset) -> std::io::Result<(File, Segment)> {
    let path = segment_path(dir, base);
    let f = open_noatime(
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true),
        &path,
    )?;
    if let Err(e) = f.write_all_at(&frame::encode_segment_header(key, base), 0) {
        // A roll that failed (a full disk) leaves no empty file behind: the records go on in
        // the segment before, and recovery must not take an empty newer file for their end.
        drop(f);
        let _ = std::fs::remove_file(&path);
        return Err(e);
    }
    let seg = Segment {
        base,
        positions: Vec::new(),
        size_bytes: frame::SEGMENT_HEADER_BYTES as u64,
        first_commit_ms: None,
        last_commit_ms: None,
        path,
        indexed: false,
    };
    Ok((f, seg))
}

/// Cheap checks of a frame header before its CRC is computed (used while resynchronising).
fn plausible_frame(b: &[u8], expected: Offset, max_ahead: u64) -> bool {
    if b.len() < frame::FRAME_HEADER_BYTES {
        return false;
    }
    let len = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let mut o = [0u8; 8];
    o.copy_from_slice(&b[16..24]);
    let o = u64::from_le_bytes(o);
    (frame::FRAME_HEADER_BYTES..=frame::FRAME_BYTES_MAX.min(b.len())).contains(&len)
        && b[9] == frame::FRAME_VERSION
        && (b[8] == frame::TYPE_MESSAGE || b[8] == frame::TYPE_GAP)
        && o >= expected.0
        && o - expected.0 <= max_ahead
}

/// After a bad frame at `pos`: the next position holding a valid frame for an offset at or
/// after `expected` that fits in the damaged span.
fn resync(data: &[u8], pos: usize, expected: Offset) -> Option<(usize, Offset)> {
    let mut q = pos + 1;
    while q + frame::FRAME_HEADER_BYTES <= data.len() {
        let max_ahead = ((q - pos) / frame::FRAME_HEADER_BYTES) as u64 + 1;
        if plausible_frame(&data[q..], expected, max_ahead) {
            if let Ok((f, _)) = frame::decode(&data[q..]) {
                return Some((q, f.offset()));
            }
        }
        q += 1;
    }
    None
}

/// A sealed segment from its `.idx` file, if that file is intact and matches the segment file.
fn load_index(path: &Path, base: Offset) -> Option<Segment> {
    let seg = Segment {
        path: path.to_path_buf(),
        ..Segment::empty(base)
    };
    let bytes = std::fs::read(seg.index_path()).ok()?;
    let ix = frame::decode_index(&bytes).filter(|ix| ix.base == base)?;
    let len = std::fs::metadata(path).ok()?.len();
    if len < ix.size_bytes {
        tracing::warn!(path = %path.display(), "segment shorter than its index says; scanning it");
        return None;
    }
    Some(Segment {
        positions: ix.positions,
        size_bytes: ix.size_bytes,
        first_commit_ms: ix.first_commit_ms,
        last_commit_ms: ix.last_commit_ms,
        indexed: true,
        ..seg
    })
}

fn scan_segment(
    key: PartitionKey,
    path: &Path,
    base: Offset,
    is_last: bool,
    report: &mut ScanReport,
    damaged: &mut Vec<(Offset, Offset)>,
) -> std::io::Result<Segment> {
    let mut data = std::fs::read(path)?;
    let header = frame::SEGMENT_HEADER_BYTES;
    if !frame::check_segment_header(&data, key, base) {
        if is_last && data.len() < header + frame::FRAME_HEADER_BYTES {
            // A segment created just before a crash: holds nothing that is not in the WAL.
            let f = open_rw(path)?;
            f.set_len(0)?;
            f.write_all_at(&frame::encode_segment_header(key, base), 0)?;
            report.torn_tail_bytes += data.len() as u64;
            data = frame::encode_segment_header(key, base).to_vec();
        } else {
            tracing::error!(path = %path.display(), "segment header is damaged; scanning its records anyway");
        }
    }
    let mut seg = Segment {
        base,
        positions: Vec::new(),
        size_bytes: header as u64,
        first_commit_ms: None,
        last_commit_ms: None,
        path: path.to_path_buf(),
        indexed: false,
    };
    let mut pos = header.min(data.len());
    let mut expected = base;
    while pos < data.len() {
        match frame::decode(&data[pos..]) {
            Ok((f, n)) if f.offset() == expected => {
                if let frame::Frame::Message { commit_ms, .. } = f {
                    seg.first_commit_ms.get_or_insert(commit_ms);
                    seg.last_commit_ms = Some(commit_ms);
                }
                seg.positions.push(pos as u32);
                pos += n;
                expected = Offset(expected.0 + 1);
                report.records += 1;
            }
            _ => match resync(&data, pos, expected) {
                Some((q, o)) => {
                    let damaged_records = o.0 - expected.0;
                    tracing::error!(path = %path.display(), byte = pos, first_offset = expected.0, records = damaged_records,
                        "damaged records in the middle of a partition segment; they will read as corrupt");
                    for _ in 0..damaged_records {
                        seg.positions.push(pos as u32);
                    }
                    report.corrupt_records += damaged_records;
                    if damaged_records > 0 {
                        damaged.push((expected, o));
                    }
                    expected = o;
                    pos = q;
                }
                None => {
                    let cut = data.len() - pos;
                    if is_last {
                        tracing::warn!(path = %path.display(), byte = pos, bytes = cut,
                            "truncating torn tail of the newest partition segment (the WAL replays it; records the last checkpoint made durable read as corrupt)");
                        open_rw(path)?.set_len(pos as u64)?;
                        report.torn_tail_bytes += cut as u64;
                    } else {
                        tracing::error!(path = %path.display(), byte = pos, bytes = cut,
                            "damaged tail of a sealed partition segment; its records will read as corrupt");
                    }
                    break;
                }
            },
        }
    }
    seg.size_bytes = pos.max(header) as u64;
    seg.positions.shrink_to_fit();
    report.segments += 1;
    Ok(seg)
}

impl PartitionLog {
    /// Creates a new, empty partition (directories and the first segment). Its directory entries
    /// become durable at the next checkpoint.
    pub fn create(
        data_dir: &Path,
        key: PartitionKey,
        segment_bytes_max: u64,
    ) -> std::io::Result<PartitionLog> {
        let dir = partition_dir(data_dir, key);
        std::fs::create_dir_all(&dir)?;
        let (active, seg) = create_segment(&dir, key, Offset(0))?;
        let topic = topic_dir(data_dir, key.topic);
        Ok(PartitionLog {
            key,
            segment_bytes_max: segment_bytes_max.clamp(4096, SEGMENT_BYTES_MAX_LIMIT),
            segments: VecDeque::from([seg]),
            active: Some(active),
            active_dirty: true,
            last_used: std::cell::Cell::new(Instant::now()),
            reserved_end: frame::SEGMENT_HEADER_BYTES as u64,
            unsynced: Vec::new(),
            dirs_to_sync: vec![
                dir.clone(),
                topic,
                topics_dir(data_dir),
                data_dir.to_path_buf(),
            ],
            dir,
            settled: SettledSet::default(),
            settled_dirty: false,
            damaged: Vec::new(),
            io: PartitionIoStats::default(),
        })
    }

    /// Recovers a partition from its directory (blocking): scans every segment, truncates a torn
    /// tail, rebuilds the index, loads the consumer state.
    pub fn open(
        dir: &Path,
        key: PartitionKey,
        segment_bytes_max: u64,
    ) -> std::io::Result<(PartitionLog, ScanReport)> {
        let mut bases = Vec::new();
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let name = e.file_name();
            let name = name.to_string_lossy();
            if let Some(b) = name
                .strip_suffix(".seg")
                .filter(|b| b.len() == 20)
                .and_then(|b| b.parse::<u64>().ok())
            {
                bases.push(Offset(b));
            }
            if bases.len() > SEGMENTS_PER_PARTITION_MAX {
                return Err(std::io::Error::other(format!(
                    "more than {SEGMENTS_PER_PARTITION_MAX} segments in {}",
                    dir.display()
                )));
            }
        }
        bases.sort();
        let mut report = ScanReport::default();
        let mut segments: VecDeque<Segment> = VecDeque::new();
        let mut damaged = Vec::new();
        let mut removed_empty = false;
        for (i, &base) in bases.iter().enumerate() {
            let is_last = i + 1 == bases.len();
            let path = segment_path(dir, base);
            if let Some(prev) = segments.back().filter(|p| base < p.end()) {
                let len = std::fs::metadata(&path)?.len();
                if len < (frame::SEGMENT_HEADER_BYTES + frame::FRAME_HEADER_BYTES) as u64 {
                    // A roll that failed (or a crash right after it) left this file without a
                    // record, and the records from its base on went to the segment before:
                    // that one holds them, this one goes.
                    tracing::warn!(path = %path.display(), records_kept = prev.end().0 - base.0,
                        "removed an empty segment file left by a failed segment roll");
                    std::fs::remove_file(&path)?;
                    removed_empty = true;
                    continue;
                }
            }
            let seg = match (!is_last).then(|| load_index(&path, base)).flatten() {
                Some(seg) => {
                    report.segments += 1;
                    report.records += seg.positions.len() as u64;
                    report.indexed_segments += 1;
                    seg
                }
                None => scan_segment(key, &path, base, is_last, &mut report, &mut damaged)?,
            };
            if let Some(prev) = segments.back_mut() {
                prev.indexed &= prev.end() == base;
                let end = prev.end();
                if base > end {
                    let missing = base.0 - end.0;
                    tracing::error!(dir = %dir.display(), first_offset = end.0, records = missing,
                        "records missing between partition segments; they will read as corrupt");
                    let at = prev.size_bytes as u32;
                    prev.positions
                        .extend(std::iter::repeat_n(at, missing as usize));
                    report.corrupt_records += missing;
                    damaged.push((end, base));
                } else if base < end {
                    tracing::error!(dir = %dir.display(), base = base.0, "overlapping partition segments; the newer one wins");
                    let keep = (base.0 - prev.base.0) as usize;
                    prev.size_bytes = u64::from(prev.positions[keep]);
                    prev.positions.truncate(keep);
                }
            }
            segments.push_back(seg);
        }
        let (active, mut dirs_to_sync) = match segments.back() {
            Some(s) => (open_rw(&s.path)?, Vec::new()),
            None => {
                let (f, seg) = create_segment(dir, key, Offset(0))?;
                segments.push_back(seg);
                (f, vec![dir.to_path_buf()])
            }
        };
        if report.torn_tail_bytes > 0 || removed_empty {
            dirs_to_sync.push(dir.to_path_buf());
        }
        let mut settled = SettledSet::from_settled(&state::read_state_file(dir));
        let mut p = PartitionLog {
            key,
            dir: dir.to_path_buf(),
            segment_bytes_max: segment_bytes_max.clamp(4096, SEGMENT_BYTES_MAX_LIMIT),
            segments,
            active: Some(active),
            active_dirty: report.torn_tail_bytes > 0,
            last_used: std::cell::Cell::new(Instant::now()),
            reserved_end: 0,
            unsynced: Vec::new(),
            dirs_to_sync,
            settled: SettledSet::default(),
            settled_dirty: false,
            damaged,
            io: PartitionIoStats::default(),
        };
        settled.raise_frontier(p.oldest_offset());
        p.settled = settled;
        p.reserved_end = p.segments.back().map_or(0, |s| s.size_bytes);
        Ok((p, report))
    }

    pub fn key(&self) -> PartitionKey {
        self.key
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// One past the newest record written here (the high watermark).
    pub fn next_offset(&self) -> Offset {
        self.segments.back().map_or(Offset(0), Segment::end)
    }

    pub fn oldest_offset(&self) -> Offset {
        self.segments.front().map_or(Offset(0), |s| s.base)
    }

    /// Each segment's first offset and the bytes of its whole frames (header included), oldest
    /// first: what a copy of this partition holds once it has these bytes of each file
    /// (a partition move, CLUSTER.md §9.3). Sealed segments never change; the newest grows.
    pub fn segment_sizes(&self) -> Vec<(Offset, u64)> {
        self.segments
            .iter()
            .map(|s| (s.base, s.size_bytes))
            .collect()
    }

    /// The file of the segment starting at `base` and the bytes of its whole frames.
    pub fn segment_file(&self, base: Offset) -> Option<(PathBuf, u64)> {
        self.segments
            .iter()
            .find(|s| s.base == base)
            .map(|s| (s.path.clone(), s.size_bytes))
    }

    /// Whether the recovery scan found damaged or missing records at or after `from`.
    pub fn damaged_from(&self, from: Offset) -> bool {
        self.damaged.iter().any(|&(_, to)| to > from)
    }

    /// Cuts the log back to end just before `to` (recovery only: the WAL holds every record from
    /// `to` on and replays them). Removes whole segments starting at or after `to` and truncates
    /// the one holding it, which becomes the active segment.
    pub fn truncate_to(&mut self, to: Offset) -> std::io::Result<()> {
        let to = to.max(self.oldest_offset());
        if to >= self.next_offset() {
            return Ok(());
        }
        while self.segments.len() > 1 && self.segments.back().is_some_and(|s| s.base >= to) {
            let s = self.segments.pop_back().expect("segment");
            let _ = std::fs::remove_file(s.index_path());
            std::fs::remove_file(&s.path)?;
        }
        let seg = self.active_segment();
        if seg.indexed {
            let _ = std::fs::remove_file(seg.index_path());
            seg.indexed = false;
        }
        let keep = (to.0.saturating_sub(seg.base.0) as usize).min(seg.positions.len());
        if keep < seg.positions.len() {
            seg.size_bytes = u64::from(seg.positions[keep]);
            seg.positions.truncate(keep);
        }
        let (path, size) = (seg.path.clone(), seg.size_bytes);
        let f = open_rw(&path)?;
        f.set_len(size)?;
        self.active = Some(f);
        self.reserved_end = size;
        self.active_dirty = true;
        self.dirs_to_sync.push(self.dir.clone());
        self.damaged.retain(|&(from, _)| from < to);
        for r in &mut self.damaged {
            r.1 = r.1.min(to);
        }
        Ok(())
    }

    /// Commit time of the newest message record, if any.
    pub fn last_commit_ms(&self) -> Option<UnixMillis> {
        self.segments.iter().rev().find_map(|s| s.last_commit_ms)
    }

    /// The active segment's handle, reopened if the log was idle-evicted.
    fn active_file(&mut self) -> std::io::Result<&File> {
        if self.active.is_none() {
            let path = &self.segments.back().expect("active segment").path;
            self.active = Some(open_rw(path)?);
        }
        Ok(self.active.as_ref().expect("opened above"))
    }

    /// Whether the active segment's file is open (not idle-evicted).
    pub fn is_open(&self) -> bool {
        self.active.is_some()
    }

    /// Closes the active segment's file if the log has not been written or read for `idle` and
    /// has nothing left for a checkpoint to sync (storage.idle_log_eviction_ms). The index and
    /// consumer state stay in memory; the next write reopens the file. True if it closed it.
    pub fn evict_if_idle(&mut self, idle: Duration, now: Instant) -> bool {
        let clean = !self.active_dirty && self.unsynced.is_empty();
        if clean && now.saturating_duration_since(self.last_used.get()) >= idle {
            return self.active.take().is_some();
        }
        false
    }

    fn active_segment(&mut self) -> &mut Segment {
        self.segments
            .back_mut()
            .expect("a partition always has an active segment")
    }

    /// Writes a batch of frames whose first offset is [`Self::next_offset`] (page cache only).
    /// On error nothing of the batch is indexed.
    pub fn append(&mut self, batch: &EncodedBatch) -> std::io::Result<()> {
        assert_eq!(
            batch.first,
            self.next_offset(),
            "partition {:?}: batch does not continue the log",
            self.key
        );
        if batch.is_empty() {
            return Ok(());
        }
        if self.needs_roll(batch.bytes.len() as u64) {
            self.roll()?;
        }
        let at = self.active_segment().size_bytes;
        let t0 = Instant::now();
        self.last_used.set(t0);
        let f = self.active_file()?;
        if let Err(e) = f.write_all_at(&batch.bytes, at) {
            let _ = f.set_len(at);
            return Err(e);
        }
        if let Some((from, len)) = completed_blocks(at, batch.bytes.len() as u64) {
            start_writeback(f, from, len);
        }
        self.io.flush.record(t0.elapsed());
        self.io.flush_bytes += batch.bytes.len() as u64;
        let seg = self.active_segment();
        seg.positions
            .extend(batch.starts.iter().map(|&s| at as u32 + s));
        seg.size_bytes = at + batch.bytes.len() as u64;
        if seg.first_commit_ms.is_none() {
            seg.first_commit_ms = batch.first_commit_ms;
        }
        if batch.last_commit_ms.is_some() {
            seg.last_commit_ms = batch.last_commit_ms;
        }
        self.active_dirty = true;
        Ok(())
    }

    fn roll(&mut self) -> std::io::Result<()> {
        let base = self.next_offset();
        let (f, seg) = create_segment(&self.dir, self.key, base)?;
        let old = self.active.replace(f);
        if let Some(old) = old.filter(|_| self.active_dirty) {
            self.unsynced.push(old);
        }
        self.active_segment().positions.shrink_to_fit();
        self.segments.push_back(seg);
        self.active_dirty = true;
        self.reserved_end = frame::SEGMENT_HEADER_BYTES as u64;
        self.dirs_to_sync.push(self.dir.clone());
        Ok(())
    }

    fn needs_roll(&self, bytes: u64) -> bool {
        let seg = self.segments.back().expect("active segment");
        let would_be = seg.size_bytes + bytes;
        !seg.positions.is_empty()
            && (would_be > self.segment_bytes_max || would_be > u64::from(u32::MAX))
    }

    /// Makes room for `bytes` more frames before they are committed: rolls to a new segment if
    /// needed and reserves disk blocks for them (ahead by the segment's length, clamped to
    /// `RESERVE_CHUNK_BYTES_MIN..=RESERVE_CHUNK_BYTES`). An
    /// ENOSPC error here means nothing was written; after it succeeds, [`Self::append`] of that
    /// many bytes does not need new blocks.
    pub fn reserve(&mut self, bytes: u64) -> std::io::Result<()> {
        if self.needs_roll(bytes) {
            self.roll()?;
        }
        let size = self.segments.back().expect("active segment").size_bytes;
        let need = size + bytes;
        if need <= self.reserved_end {
            return Ok(());
        }
        let ahead = size.clamp(RESERVE_CHUNK_BYTES_MIN, RESERVE_CHUNK_BYTES);
        let end = need.max((size + ahead).min(self.segment_bytes_max));
        let from = self.reserved_end.max(size);
        // KEEP_SIZE: the file length (and so what recovery scans) is unchanged.
        match durable::reserve_blocks(self.active_file()?, from, end - from) {
            // File systems without fallocate: nothing to reserve, writes allocate as they go.
            Err(e) if !crate::file::is_unsupported(&e) => return Err(e),
            _ => {}
        }
        self.reserved_end = end;
        Ok(())
    }

    /// Records `[from, next_offset)`, at most `max_records` and `max_bytes` of frames (the first
    /// record is always included). Stops before a damaged record unless it is the first.
    pub fn read(
        &self,
        from: Offset,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<StoredRecord>, ReadError> {
        let oldest = self.oldest_offset();
        if from < oldest {
            return Err(ReadError::BelowRetention { oldest });
        }
        let end = self.next_offset();
        let max_records = max_records.clamp(1, READ_RECORDS_MAX);
        let mut out = Vec::new();
        if from >= end {
            return Ok(out);
        }
        self.last_used.set(Instant::now());
        let mut bytes = 0usize;
        let mut si = self.segments.partition_point(|s| s.base <= from) - 1;
        let mut o = from;
        while o < end && out.len() < max_records && si < self.segments.len() {
            let seg = &self.segments[si];
            let first_i = (o.0 - seg.base.0) as usize;
            let mut last_i = first_i;
            while last_i < seg.positions.len() && out.len() + (last_i - first_i) < max_records {
                let rec = (seg.region_end(last_i) - u64::from(seg.positions[last_i])) as usize;
                if bytes + rec > max_bytes && !(out.is_empty() && last_i == first_i) {
                    break;
                }
                bytes += rec;
                last_i += 1;
            }
            if last_i == first_i {
                break;
            }
            let start = u64::from(seg.positions[first_i]);
            let stop = seg.region_end(last_i - 1);
            let mut buf = vec![0u8; (stop - start) as usize];
            let r = match &self.active {
                Some(f) if si + 1 == self.segments.len() => f.read_exact_at(&mut buf, start),
                _ => open_noatime(OpenOptions::new().read(true), &seg.path)
                    .and_then(|f| f.read_exact_at(&mut buf, start)),
            };
            r.map_err(ReadError::Io)?;
            // The records point into the one buffer they were read into (no copy each).
            let buf = Arc::new(buf);
            let range_of = |part: &[u8]| SharedBytes::within(&buf, part);
            for i in first_i..last_i {
                let offset = Offset(seg.base.0 + i as u64);
                let a = (u64::from(seg.positions[i]) - start) as usize;
                let b = (seg.region_end(i) - start) as usize;
                match frame::decode(&buf[a..b]) {
                    Ok((
                        frame::Frame::Message {
                            offset: got,
                            commit_ms,
                            msg_key,
                            payload,
                        },
                        n,
                    )) if got == offset && n == b - a => out.push(StoredRecord {
                        offset,
                        commit_ms,
                        msg_key: msg_key.map(range_of),
                        payload: range_of(payload),
                    }),
                    _ if out.is_empty() => return Err(ReadError::Corrupt { offset }),
                    _ => return Ok(out),
                }
            }
            o = Offset(seg.base.0 + last_i as u64);
            if last_i < seg.positions.len() {
                break;
            }
            si += 1;
        }
        Ok(out)
    }

    /// Deletes whole sealed segments whose newest record is older than `now - retention_ms`
    /// (0 = keep forever). Raises the settled frontier to the new oldest offset. Returns the bytes
    /// deleted.
    pub fn enforce_retention(
        &mut self,
        retention_ms: u64,
        now: UnixMillis,
    ) -> std::io::Result<u64> {
        if retention_ms == 0 {
            return Ok(0);
        }
        let t0 = Instant::now();
        let r = self.delete_expired(retention_ms, now);
        self.io.retention_runs.record(t0.elapsed());
        r
    }

    fn delete_expired(&mut self, retention_ms: u64, now: UnixMillis) -> std::io::Result<u64> {
        let cutoff = now.0.saturating_sub(retention_ms);
        let mut deleted = 0;
        while self.segments.len() > 1 {
            let s = &self.segments[0];
            if s.last_commit_ms.is_some_and(|t| t.0 >= cutoff) {
                break;
            }
            for path in [s.index_path(), s.path.clone()] {
                match std::fs::remove_file(&path) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
            }
            deleted += s.size_bytes;
            self.io.retention_bytes_deleted += s.size_bytes;
            self.io.retention_records_deleted += s.positions.len() as u64;
            self.segments.pop_front();
        }
        if deleted > 0 {
            self.dirs_to_sync.push(self.dir.clone());
            let oldest = self.oldest_offset();
            if self.settled.raise_frontier(oldest) {
                tracing::info!(partition = ?self.key, oldest = oldest.0,
                    "consumer frontier fell behind retention; skipped to oldest retained offset");
                self.settled_dirty = true;
            }
        }
        Ok(deleted)
    }

    /// Marks offsets settled (in memory; durable through the WAL and the next checkpoint).
    pub fn settle(&mut self, offsets: &[Offset]) {
        if self.settled.settle(offsets) {
            self.settled_dirty = true;
        }
    }

    /// Drops settled offsets that do not exist (after recovery replay).
    pub fn clamp_settled(&mut self) {
        self.settled.clamp_below(self.next_offset());
    }

    pub fn settled(&self) -> Settled {
        self.settled.to_settled()
    }

    /// After sync work failed with [`SyncError::Write`]: marks the state file and the missing
    /// index files to be written again by the next checkpoint (the data files were synced).
    pub fn sync_failed(&mut self) {
        self.settled_dirty = true;
        let sealed = self.segments.len().saturating_sub(1);
        for s in self.segments.iter_mut().take(sealed) {
            s.indexed = s.index_path().exists();
        }
    }

    /// Takes what the next checkpoint must make durable and resets the dirty marks.
    pub fn take_sync_work(&mut self) -> std::io::Result<SyncWork> {
        let mut files = std::mem::take(&mut self.unsynced);
        if self.active_dirty {
            // A dirty log is never evicted: its handle is open.
            files.push(self.active_file()?.try_clone()?);
            self.active_dirty = false;
        }
        let mut dirs = std::mem::take(&mut self.dirs_to_sync);
        dirs.dedup();
        let state = self
            .settled_dirty
            .then(|| (self.dir.clone(), self.settled.to_settled()));
        self.settled_dirty = false;
        let sealed = self.segments.len().saturating_sub(1);
        let mut seal = Vec::new();
        for s in self.segments.iter_mut().take(sealed).filter(|s| !s.indexed) {
            let ix = frame::SegmentIndex {
                base: s.base,
                size_bytes: s.size_bytes,
                first_commit_ms: s.first_commit_ms,
                last_commit_ms: s.last_commit_ms,
                positions: s.positions.clone(),
            };
            seal.push((s.path.clone(), frame::encode_index(&ix)));
            s.indexed = true;
        }
        Ok(SyncWork {
            key: self.key,
            files,
            dirs,
            state,
            seal,
        })
    }

    /// Records how this partition's share of a checkpoint went.
    pub fn record_sync(&mut self, times: SyncTimes, ok: bool) {
        self.io.fsync.record(times.fsync);
        if ok {
            self.io.persist_ok.record(times.total);
        } else {
            self.io.persist_failed.record(times.total);
        }
    }

    /// What this partition's storage work cost since its log was opened here.
    pub fn io_stats(&self) -> PartitionIoStats {
        self.io
    }

    /// Commit time of the record at `offset` (its frame read and CRC-checked), or `None` outside
    /// `[oldest, next)`. For a damaged record: the first commit time of its segment, which is no
    /// later (an age computed from it is an upper bound).
    pub fn commit_ms_at(&self, offset: Offset) -> Option<UnixMillis> {
        if offset < self.oldest_offset() || offset >= self.next_offset() {
            return None;
        }
        match self.read(offset, 1, 0) {
            Ok(recs) => match recs.first() {
                Some(r) if r.offset == offset => Some(r.commit_ms),
                _ => self.segment_first_commit_ms(offset),
            },
            Err(_) => self.segment_first_commit_ms(offset),
        }
    }

    fn segment_first_commit_ms(&self, offset: Offset) -> Option<UnixMillis> {
        let i = self.segments.partition_point(|s| s.base <= offset);
        self.segments.get(i.checked_sub(1)?)?.first_commit_ms
    }

    pub fn stats(&self) -> PartitionStats {
        let next = self.next_offset();
        PartitionStats {
            segments: self.segments.len() as u32,
            size_bytes: self.segments.iter().map(|s| s.size_bytes).sum(),
            oldest_offset: self.oldest_offset(),
            next_offset: next,
            high_watermark: next,
            oldest_segment_at: self.segments.front().and_then(|s| s.first_commit_ms),
        }
    }

    /// Bytes of index memory held (for tests and metrics).
    pub fn index_bytes(&self) -> usize {
        self.segments
            .iter()
            .map(|s| s.positions.capacity() * 4)
            .sum()
    }
}

#[cfg(test)]
mod tests;
