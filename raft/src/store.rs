//! Durable Raft storage of the metadata group, under `<data_dir>/metastore/`.
//!
//! Owns three files and the in-memory copies openraft reads from:
//!
//! | File | Content | Written |
//! |---|---|---|
//! | `raft-log` | header + frames of log operations (below) | appended, `fdatasync` before an append is acknowledged |
//! | `raft-vote` | the last vote: two slots (below), written in place | one slot overwritten, `fdatasync` |
//! | `snapshot.json` | `{"format":1,"meta":<SnapshotMeta>,"state":<MetaState>}` | atomically, as above |
//!
//! `raft-log` layout, little endian:
//!
//! | Bytes | Field |
//! |---|---|
//! | 8 | file magic `NARADRL1` (format version 1) |
//! | then per frame: 4 | frame magic: `0x464C524E` (`NRLF` on disk), or `0x534C524E` (`NRLS`) on the last frame of a synced write |
//! | 4 | payload length *n* (≤ [`FRAME_PAYLOAD_BYTES_MAX`]) |
//! | 4 | CRC32C (Castagnoli, [`narad_io::checksum::crc32c`]) of the payload |
//! | *n* | payload: JSON of one [`LogOp`] (an entry, a truncation, a purge, the committed id) |
//!
//! `raft-vote` is [`VOTE_FILE_BYTES`] long, created whole (zeros, or the vote of a `vote.json`
//! left by an older version) by an atomic replace ([`narad_io::durable::replace_file`]) at open,
//! and never grows: a vote overwrites the older of its two [`VOTE_SLOT_BYTES`] slots in place, so
//! a full disk cannot refuse it (before, a vote written as a new file failed with ENOSPC and
//! openraft stopped the group for good). A slot, little endian:
//!
//! | Bytes | Field |
//! |---|---|
//! | 4 | magic `0x5654524E` (`NRTV` on disk) |
//! | 8 | sequence number (the newer slot has the higher one) |
//! | 4 | payload length *n* (≤ `VOTE_SLOT_BYTES - 20`) |
//! | 4 | CRC32C of the sequence number, the length and the payload |
//! | *n* | payload: JSON of the [`Vote`]; the rest of the slot is zeros |
//!
//! Crash safety: an append writes all frames of the batch with one `write`, then `fdatasync`, and
//! only then tells openraft the entries are durable; a vote is acknowledged only after its slot
//! was written and synced. A write torn by a crash leaves that slot failing its CRC, and open
//! takes the other slot: the previous vote, durable before, and the only one openraft acted on.
//! Log frames are written into disk blocks reserved ahead ([`LogStore::reserve`]): proposals and
//! entries received from the leader reserve their room before openraft sees them, so a full
//! disk refuses them (the leader retries) instead of failing an append. A crash can therefore only leave a torn
//! *tail* written since the last completed sync, possibly with holes (pages of one write reach the
//! disk in any order). Nothing is written after a synced write until its sync returned, so data
//! of a *later* write behind an intact sync-end frame (`NRLS`) proves the earlier write was
//! synced. On open, the log is scanned frame by frame; at the first bad frame (short, wrong magic,
//! oversized, CRC mismatch, unparsable) the rest of the file is searched: an intact frame that
//! starts after an intact sync-end frame lying beyond the bad one means damage inside synced,
//! acknowledged data, and opening fails loudly instead of dropping committed entries; otherwise
//! the bad frame is in the torn tail, which is cut off (truncate + `fdatasync`). Truncations and purges are
//! themselves frames, replayed in order, so a crash between a truncation and the next append
//! replays to the same state. A compaction rewrites the live entries into `raft-log.tmp`, syncs
//! it and renames it over `raft-log` (then syncs the directory), so either the old or the new file
//! is found after a crash. The committed id is written without its own sync: a stale committed id
//! only makes openraft re-apply less at start-up, which is safe.
//!
//! The state machine keeps [`MetaState`] in memory and persists it only as snapshots; at start-up
//! openraft re-applies committed entries after the snapshot from the log.
//!
//! I/O here is blocking `std::fs` on the shard-0 thread: metadata writes are rare (topic and user
//! changes), and each costs one `fdatasync` (~0.1–1 ms on these machines). Never touches partition
//! data.

use std::cell::{Cell, RefCell};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use futures_util::StreamExt;
use narad_io::checksum::crc32c;
use narad_io::durable;
use openraft::storage::{
    EntryResponder, IOFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot,
};
use openraft::type_config::alias::SnapshotOf;
use openraft::{EntryPayload, OptionalSend, RaftLogReader, RaftSnapshotBuilder};
use serde::{Deserialize, Serialize};

use crate::apply::apply;
use crate::model::{MetaResponse, MetaState};
use crate::types::{ApplyOutcome, Entry, LogId, SnapshotMeta, StoredMembership, TypeConfig, Vote};

/// First bytes of `raft-log`; the last byte is the format version.
pub const LOG_FILE_MAGIC: &[u8; 8] = b"NARADRL1";
/// Marks the start of each frame.
pub const FRAME_MAGIC: u32 = 0x464C_524E;
/// Marks the start of the last frame of a write that was synced before the next write.
pub const FRAME_MAGIC_SYNC_END: u32 = 0x534C_524E;
/// Bytes of a frame header (magic, length, CRC).
pub const FRAME_HEADER_BYTES: usize = 12;
/// Largest frame payload: a command carries at most one topic's schema history (4 MiB) plus
/// small fields; anything above this is damage, not data.
pub const FRAME_PAYLOAD_BYTES_MAX: usize = 64 << 20;
/// A compaction runs when the file holds more than this many frames beyond twice the live
/// entries.
pub const LOG_COMPACT_SLACK_FRAMES: u64 = 4096;
/// Version of `snapshot.json`.
pub const SNAPSHOT_FORMAT: u32 = 1;

const LOG_FILE: &str = "raft-log";

/// Disk space reserved past the end of `raft-log` at a time (see [`LogStore::reserve`]).
pub const LOG_RESERVE_AHEAD_BYTES: u64 = 1 << 20;
/// The vote file (see the module doc).
const VOTE_FILE: &str = "raft-vote";
/// Where versions before `raft-vote` kept the vote (a JSON file replaced atomically); read at
/// open when `raft-vote` does not exist yet, then removed.
const VOTE_FILE_LEGACY: &str = "vote.json";
/// One slot of `raft-vote`: a page, so that writing one never touches the other's blocks.
pub const VOTE_SLOT_BYTES: usize = 4096;
/// Length of `raft-vote`: two slots.
pub const VOTE_FILE_BYTES: usize = 2 * VOTE_SLOT_BYTES;
/// Marks a written slot of `raft-vote`.
pub const VOTE_SLOT_MAGIC: u32 = 0x5654_524E;
const VOTE_SLOT_HEADER_BYTES: usize = 20;
const SNAPSHOT_FILE: &str = "snapshot.json";

/// One operation in `raft-log`, replayed in order at open.
// Ops live only while a frame is encoded or replayed, so the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Serialize, Deserialize)]
pub enum LogOp {
    /// An entry at `entry.log_id.index`; drops any entries at or after that index first.
    Entry(Entry),
    /// Drop every entry after `after` (all entries when `None`).
    Truncate { after: Option<LogId> },
    /// Drop every entry up to and including `upto`.
    Purge { upto: LogId },
    /// The last committed log id known when this was written.
    Committed(Option<LogId>),
}

fn encode_frame(op: &LogOp, sync_end: bool, out: &mut Vec<u8>) -> io::Result<()> {
    let payload = serde_json::to_vec(op).map_err(io::Error::other)?;
    if payload.len() > FRAME_PAYLOAD_BYTES_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "raft log frame of {} bytes exceeds {FRAME_PAYLOAD_BYTES_MAX}",
                payload.len()
            ),
        ));
    }
    let magic = if sync_end {
        FRAME_MAGIC_SYNC_END
    } else {
        FRAME_MAGIC
    };
    out.extend_from_slice(&magic.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(())
}

fn u32_at(buf: &[u8], pos: usize) -> Option<u32> {
    let b = buf.get(pos..pos + 4)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// An intact frame: its op, the position after it, and whether it ends a synced write.
struct Decoded {
    op: LogOp,
    next: usize,
    sync_end: bool,
}

/// Decodes the frame at `pos`, or `None` if it is not a whole, intact frame.
fn decode_frame(buf: &[u8], pos: usize) -> Option<Decoded> {
    let magic = u32_at(buf, pos)?;
    if magic != FRAME_MAGIC && magic != FRAME_MAGIC_SYNC_END {
        return None;
    }
    let len = u32_at(buf, pos + 4)? as usize;
    let crc = u32_at(buf, pos + 8)?;
    if len > FRAME_PAYLOAD_BYTES_MAX {
        return None;
    }
    let start = pos + FRAME_HEADER_BYTES;
    let payload = buf.get(start..start.checked_add(len)?)?;
    if crc32c(payload) != crc {
        return None;
    }
    let op = serde_json::from_slice(payload).ok()?;
    Some(Decoded {
        op,
        next: start + len,
        sync_end: magic == FRAME_MAGIC_SYNC_END,
    })
}

/// After a bad frame at `bad`: the start of an intact frame written after a later synced write,
/// which proves the bad frame lies in synced data (damage, not a torn tail). The bad frame itself
/// counts as that synced write when its header still reads as the end of one: a write returns
/// only after its sync, so an intact frame past its end was written after the sync.
fn intact_after_sync_end(buf: &[u8], bad: usize) -> Option<usize> {
    let mut synced_end: Option<usize> = None;
    if u32_at(buf, bad) == Some(FRAME_MAGIC_SYNC_END) {
        synced_end = u32_at(buf, bad + 4)
            .map(|len| len as usize)
            .filter(|&len| len <= FRAME_PAYLOAD_BYTES_MAX)
            .map(|len| bad + FRAME_HEADER_BYTES + len);
    }
    for q in bad + 1..buf.len() {
        let Some(d) = decode_frame(buf, q) else {
            continue;
        };
        if synced_end.is_some_and(|e| q >= e) {
            return Some(q);
        }
        if d.sync_end {
            synced_end = Some(synced_end.map_or(d.next, |e| e.min(d.next)));
        }
    }
    None
}

/// The in-memory image of the log.
#[derive(Default)]
struct LogImage {
    entries: std::collections::BTreeMap<u64, Entry>,
    last_purged: Option<LogId>,
    committed: Option<LogId>,
}

impl LogImage {
    fn replay(&mut self, op: LogOp) {
        match op {
            LogOp::Entry(e) => {
                let index = e.log_id.index;
                drop(self.entries.split_off(&index));
                self.entries.insert(index, e);
            }
            LogOp::Truncate { after } => {
                let from = after.map_or(0, |l| l.index + 1);
                drop(self.entries.split_off(&from));
            }
            LogOp::Purge { upto } => {
                self.entries = self.entries.split_off(&(upto.index + 1));
                self.last_purged = Some(upto);
            }
            LogOp::Committed(c) => self.committed = c,
        }
    }
}

/// What opening `raft-log` found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LogRecovery {
    pub frames: u64,
    /// Bytes of a torn tail cut off (0 when the file ended cleanly).
    pub torn_tail_bytes: u64,
}

/// The slot bytes of `vote` with sequence number `seq`.
fn encode_vote_slot(vote: &Vote, seq: u64) -> io::Result<Vec<u8>> {
    let payload = serde_json::to_vec(vote).map_err(io::Error::other)?;
    if payload.len() > VOTE_SLOT_BYTES - VOTE_SLOT_HEADER_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a vote of {} bytes does not fit its slot", payload.len()),
        ));
    }
    let mut slot = Vec::with_capacity(VOTE_SLOT_BYTES);
    slot.extend_from_slice(&VOTE_SLOT_MAGIC.to_le_bytes());
    slot.extend_from_slice(&seq.to_le_bytes());
    slot.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    let crc = crc32c(&[&slot[4..16], &payload[..]].concat());
    slot.extend_from_slice(&crc.to_le_bytes());
    slot.extend_from_slice(&payload);
    slot.resize(VOTE_SLOT_BYTES, 0);
    Ok(slot)
}

/// The sequence number and vote of an intact slot; `None` for an empty or torn one.
fn decode_vote_slot(slot: &[u8]) -> Option<(u64, Vote)> {
    if u32_at(slot, 0)? != VOTE_SLOT_MAGIC {
        return None;
    }
    let seq = u64::from_le_bytes(slot.get(4..12)?.try_into().ok()?);
    let len = u32_at(slot, 12)? as usize;
    let crc = u32_at(slot, 16)?;
    let payload = slot.get(VOTE_SLOT_HEADER_BYTES..VOTE_SLOT_HEADER_BYTES.checked_add(len)?)?;
    if crc32c(&[&slot[4..16], payload].concat()) != crc {
        return None;
    }
    Some((seq, serde_json::from_slice(payload).ok()?))
}

/// `raft-vote`, open for writing in place, and the sequence number of its newer slot.
struct VoteFile {
    file: File,
    seq: u64,
}

impl VoteFile {
    /// Opens `raft-vote` in `dir`, creating it whole when absent (with the vote of a legacy
    /// `vote.json`, which is then removed). Returns the file and the newest intact vote.
    fn open(dir: &Path) -> io::Result<(VoteFile, Option<Vote>)> {
        let path = dir.join(VOTE_FILE);
        let buf = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let legacy = dir.join(VOTE_FILE_LEGACY);
                let vote: Option<Vote> = match std::fs::read(&legacy) {
                    Ok(b) => Some(serde_json::from_slice(&b).map_err(|e| {
                        io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("{VOTE_FILE_LEGACY}: {e}"),
                        )
                    })?),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                    Err(e) => return Err(e),
                };
                let mut buf = vec![0u8; VOTE_FILE_BYTES];
                if let Some(v) = &vote {
                    buf[..VOTE_SLOT_BYTES].copy_from_slice(&encode_vote_slot(v, 1)?);
                }
                durable::replace_file(&path, &buf)?;
                if vote.is_some() {
                    std::fs::remove_file(&legacy)?;
                    durable::sync_dir(dir)?;
                }
                buf
            }
            Err(e) => return Err(e),
        };
        if buf.len() != VOTE_FILE_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: {} bytes, not {VOTE_FILE_BYTES}",
                    path.display(),
                    buf.len()
                ),
            ));
        }
        let newest = buf
            .chunks(VOTE_SLOT_BYTES)
            .filter_map(decode_vote_slot)
            .max_by_key(|(seq, _)| *seq);
        let file = OpenOptions::new().write(true).open(&path)?;
        let seq = newest.as_ref().map_or(0, |(seq, _)| *seq);
        Ok((VoteFile { file, seq }, newest.map(|(_, v)| v)))
    }

    /// Overwrites the older slot with `vote` and syncs it: no block is allocated.
    fn save(&mut self, vote: &Vote) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let seq = self.seq + 1;
        let slot = encode_vote_slot(vote, seq)?;
        let at = (seq % 2) * VOTE_SLOT_BYTES as u64;
        self.file.write_all_at(&slot, at)?;
        self.file.sync_data()?;
        self.seq = seq;
        Ok(())
    }
}

struct LogInner {
    dir: PathBuf,
    file: File,
    image: LogImage,
    vote: Option<Vote>,
    vote_file: VoteFile,
    /// Frames in the current file, for the compaction trigger.
    frames_in_file: u64,
    /// Length of the current file.
    len: u64,
    /// Disk blocks are reserved up to here (see [`LogStore::reserve`]); `u64::MAX` when the
    /// file system cannot reserve (appends then allocate as they go).
    reserved_end: u64,
    /// Set after a failed write or sync: the file's durable content is unknown, so every later
    /// operation fails (an fsync failure is never retried).
    failed: Option<String>,
    /// Tests only: writes left before every write fails as an I/O error would
    /// ([`LogStore::fail_writes_after`]).
    writes_before_failure: Option<u64>,
}

impl LogInner {
    fn check(&self) -> io::Result<()> {
        match &self.failed {
            Some(e) => Err(io::Error::other(format!(
                "metadata log failed earlier: {e}"
            ))),
            None => Ok(()),
        }
    }

    /// Appends frames for `ops`, syncing when `sync`. On failure the store stops.
    fn write_ops(&mut self, ops: &[LogOp], sync: bool) -> io::Result<()> {
        self.check()?;
        if let Some(left) = self.writes_before_failure.as_mut() {
            if *left == 0 {
                let e = narad_io::file::eio();
                tracing::error!(error = %e, "metadata raft log write failed (injected); the metastore stops");
                self.failed = Some(e.to_string());
                return Err(e);
            }
            *left -= 1;
        }
        let mut buf = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            encode_frame(op, sync && i + 1 == ops.len(), &mut buf)?;
        }
        // Normally within the room reserved ahead (proposals and entries from the leader
        // reserve theirs); growing past it on a full disk would fail the write half-done, so
        // no room refuses it here with nothing written and the store still healthy.
        self.reserve(buf.len() as u64)?;
        let r =
            self.file
                .write_all(&buf)
                .and_then(|()| if sync { self.file.sync_data() } else { Ok(()) });
        if let Err(e) = r {
            tracing::error!(error = %e, "metadata raft log write failed; the metastore stops");
            self.failed = Some(e.to_string());
            return Err(e);
        }
        self.frames_in_file += ops.len() as u64;
        self.len += buf.len() as u64;
        Ok(())
    }

    /// Reserves disk blocks so that `bytes` more can be appended without the file system
    /// allocating: [`LOG_RESERVE_AHEAD_BYTES`] past what is needed at a time, or exactly what is
    /// needed when the disk has less.
    fn reserve(&mut self, bytes: u64) -> io::Result<()> {
        let need = self.len.saturating_add(bytes);
        if need <= self.reserved_end {
            return Ok(());
        }
        let from = self.reserved_end.max(self.len);
        let ahead = need.max(self.len.saturating_add(LOG_RESERVE_AHEAD_BYTES));
        let r = match durable::reserve_blocks(&self.file, from, ahead - from) {
            Err(e) if narad_io::file::is_disk_full(&e) => {
                durable::reserve_blocks(&self.file, from, need - from).map(|()| need)
            }
            r => r.map(|()| ahead),
        };
        match r {
            Ok(end) => self.reserved_end = end,
            Err(e) if narad_io::file::is_unsupported(&e) => self.reserved_end = u64::MAX,
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// Rewrites the file with only the live state when it has grown mostly dead.
    fn maybe_compact(&mut self) -> io::Result<()> {
        let live = self.image.entries.len() as u64;
        if self.frames_in_file <= live * 2 + LOG_COMPACT_SLACK_FRAMES {
            return Ok(());
        }
        self.check()?;
        let mut buf = LOG_FILE_MAGIC.to_vec();
        let mut frames = 0;
        if let Some(p) = &self.image.last_purged {
            encode_frame(&LogOp::Purge { upto: p.clone() }, false, &mut buf)?;
            frames += 1;
        }
        for e in self.image.entries.values() {
            encode_frame(&LogOp::Entry(e.clone()), false, &mut buf)?;
            frames += 1;
        }
        encode_frame(
            &LogOp::Committed(self.image.committed.clone()),
            true,
            &mut buf,
        )?;
        frames += 1;
        let path = self.dir.join(LOG_FILE);
        if let Err(e) = durable::write_temp(&path, &buf) {
            if !narad_io::file::is_disk_full(&e) {
                return Err(e);
            }
            // The log as it is stays valid (its purge frame is written): compaction only saves
            // space, and is tried again at the next purge.
            tracing::warn!(error = %e, "metadata raft log compaction skipped: the disk is full");
            let _ = std::fs::remove_file(durable::temp_path(&path));
            return Ok(());
        }
        durable::install_temp(&path)?;
        self.file = OpenOptions::new().append(true).open(&path)?;
        self.frames_in_file = frames;
        self.len = buf.len() as u64;
        self.reserved_end = self.len;
        if let Err(e) = self.reserve(LOG_RESERVE_AHEAD_BYTES) {
            tracing::warn!(error = %e, "metadata raft log: no space reserved after compaction");
        }
        tracing::info!(frames, "metadata raft log compacted");
        Ok(())
    }
}

/// The Raft log and vote store. Cheap to clone: clones share one file and image (the log reader
/// openraft asks for is such a clone).
#[derive(Clone)]
pub struct LogStore(Rc<RefCell<LogInner>>);

impl LogStore {
    /// Opens (creating if absent) the log in `dir`, recovering from a torn tail.
    pub fn open(dir: &Path) -> io::Result<(LogStore, LogRecovery)> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(LOG_FILE);
        let mut buf = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            durable::replace_file(&path, LOG_FILE_MAGIC)?;
            buf = LOG_FILE_MAGIC.to_vec();
        }
        if buf.len() < LOG_FILE_MAGIC.len() || &buf[..LOG_FILE_MAGIC.len()] != LOG_FILE_MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is not a Narad metadata log (bad magic)", path.display()),
            ));
        }
        let mut image = LogImage::default();
        let mut rec = LogRecovery::default();
        let mut pos = LOG_FILE_MAGIC.len();
        while pos < buf.len() {
            match decode_frame(&buf, pos) {
                Some(d) => {
                    image.replay(d.op);
                    rec.frames += 1;
                    pos = d.next;
                }
                None => {
                    if let Some(q) = intact_after_sync_end(&buf, pos) {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                                "{}: damaged frame at byte {pos} followed by data of a later synced write at byte {q}; \
                                 refusing to drop acknowledged metadata (restore the metastore from a \
                                 healthy copy)",
                                path.display()
                            ),
                        ));
                    }
                    rec.torn_tail_bytes = (buf.len() - pos) as u64;
                    tracing::warn!(
                        bytes = rec.torn_tail_bytes,
                        offset = pos,
                        "metadata raft log: cutting off a torn tail"
                    );
                    let f = OpenOptions::new().write(true).open(&path)?;
                    f.set_len(pos as u64)?;
                    f.sync_data()?;
                    break;
                }
            }
        }
        let (vote_file, vote) = VoteFile::open(dir)?;
        let file = OpenOptions::new().append(true).open(&path)?;
        let len = file.metadata()?.len();
        let mut inner = LogInner {
            dir: dir.to_path_buf(),
            file,
            image,
            vote,
            vote_file,
            frames_in_file: rec.frames,
            len,
            reserved_end: len,
            failed: None,
            writes_before_failure: None,
        };
        // Best effort: blocks reserved by an earlier run are still allocated, so this succeeds
        // on a full disk too, and the appends of this start (a leader's first entry) fit.
        if let Err(e) = inner.reserve(LOG_RESERVE_AHEAD_BYTES) {
            tracing::warn!(error = %e, "metadata raft log: no space reserved at open");
        }
        Ok((LogStore(Rc::new(RefCell::new(inner))), rec))
    }

    /// Makes sure `bytes` more can be appended to `raft-log` without the file system allocating
    /// (disk blocks reserved past its end, the length unchanged). A proposal calls it before
    /// openraft sees the command: openraft stops the whole group on a failed append, so a full
    /// disk must refuse the change here, after which the group goes on and takes changes again
    /// once space frees. An error changes nothing.
    pub fn reserve(&self, bytes: u64) -> io::Result<()> {
        let mut inner = self.0.borrow_mut();
        inner.check()?;
        inner.reserve(bytes)
    }

    /// Tests only: after `writes` more writes, every write fails with EIO, as a failing disk
    /// would make it (what the group and the node do then is what such tests check).
    pub fn fail_writes_after(&self, writes: u64) {
        self.0.borrow_mut().writes_before_failure = Some(writes);
    }

    /// Indexes of the entries held (for tests and diagnostics).
    pub fn entry_indexes(&self) -> Vec<u64> {
        self.0.borrow().image.entries.keys().copied().collect()
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<
        RB: std::ops::RangeBounds<u64> + Clone + std::fmt::Debug + OptionalSend,
    >(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let inner = self.0.borrow();
        Ok(inner
            .image
            .entries
            .range(range)
            .map(|(_, e)| e.clone())
            .collect())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(self.0.borrow().vote.clone())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let inner = self.0.borrow();
        inner.check()?;
        let last_purged_log_id = inner.image.last_purged.clone();
        let last_log_id = inner
            .image
            .entries
            .values()
            .next_back()
            .map(|e| e.log_id.clone())
            .or_else(|| last_purged_log_id.clone());
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let mut inner = self.0.borrow_mut();
        inner.check()?;
        if let Err(e) = inner.vote_file.save(vote) {
            tracing::error!(error = %e, "metadata raft vote write failed; the metastore stops");
            inner.failed = Some(e.to_string());
            return Err(e);
        }
        inner.vote = Some(vote.clone());
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        let mut inner = self.0.borrow_mut();
        match inner.write_ops(&[LogOp::Committed(committed.clone())], false) {
            Ok(()) => {}
            // A stale committed id on disk only makes openraft re-apply less at start-up: on a
            // full disk it is skipped rather than stop the group.
            Err(e) if narad_io::file::is_disk_full(&e) && inner.failed.is_none() => {
                tracing::warn!(error = %e, "metadata raft log: committed id not written, the disk is full");
            }
            Err(e) => return Err(e),
        }
        inner.image.committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(self.0.borrow().image.committed.clone())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let ops: Vec<LogOp> = entries.into_iter().map(LogOp::Entry).collect();
        let r = {
            let mut inner = self.0.borrow_mut();
            inner.write_ops(&ops, true).map(|()| {
                for op in ops {
                    inner.image.replay(op);
                }
            })
        };
        match r {
            Ok(()) => {
                callback.io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.io_completed(Err(io::Error::new(e.kind(), e.to_string())));
                Err(e)
            }
        }
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let mut inner = self.0.borrow_mut();
        let op = LogOp::Truncate { after: last_log_id };
        inner.write_ops(std::slice::from_ref(&op), true)?;
        inner.image.replay(op);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        let mut inner = self.0.borrow_mut();
        let op = LogOp::Purge { upto: log_id };
        inner.write_ops(std::slice::from_ref(&op), true)?;
        inner.image.replay(op);
        inner.maybe_compact()
    }
}

// ---------------------------------------------------------------------------------------------
// State machine

/// Subscriber callback: called with every newly applied state.
pub type Subscriber = Rc<dyn Fn(Arc<MetaState>)>;

/// The applied state as the rest of shard 0 sees it, and who to tell about changes.
#[derive(Default)]
pub struct Published {
    current: RefCell<Arc<MetaState>>,
    subscribers: RefCell<Vec<Subscriber>>,
    figures: Cell<StoreFigures>,
}

/// What the state machine's work cost and how it failed, since this process opened the store
/// (OPERATIONS.md §9.6, read by [`crate::MetaNode::gauges`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreFigures {
    /// Entries the state machine could not apply because reading them from the log failed
    /// (openraft then stops the group: fail-stop, never a retry).
    pub apply_errors_storage: u64,
    /// Size of the last snapshot built here (`snapshot.json`), 0 before the first.
    pub snapshot_bytes: u64,
    /// How long building it took, from the copy of the state to the file's rename and sync.
    pub snapshot_duration_us: u64,
    /// Snapshot builds that failed (serialisation, or writing `snapshot.json`).
    pub snapshot_failures: u64,
}

/// Subscribers per node: a bound on the callbacks run after each apply.
pub const SUBSCRIBERS_MAX: usize = 64;

impl Published {
    pub fn current(&self) -> Arc<MetaState> {
        self.current.borrow().clone()
    }

    /// The store's figures so far.
    pub fn figures(&self) -> StoreFigures {
        self.figures.get()
    }

    fn count(&self, f: impl FnOnce(&mut StoreFigures)) {
        let mut v = self.figures.get();
        f(&mut v);
        self.figures.set(v);
    }

    /// Adds a subscriber; refuses more than [`SUBSCRIBERS_MAX`].
    pub fn subscribe(&self, f: Subscriber) -> Result<(), Subscriber> {
        let mut subs = self.subscribers.borrow_mut();
        if subs.len() >= SUBSCRIBERS_MAX {
            return Err(f);
        }
        subs.push(f);
        Ok(())
    }

    fn publish(&self, state: Arc<MetaState>) {
        *self.current.borrow_mut() = state.clone();
        // Callbacks run on a copy of the list, so one may subscribe or read the state.
        let subs: Vec<Subscriber> = self.subscribers.borrow().clone();
        for s in subs {
            s(state.clone());
        }
    }
}

#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    format: u32,
    meta: SnapshotMeta,
    state: MetaState,
}

/// The metadata state machine: [`MetaState`] in memory, persisted as `snapshot.json`.
pub struct StateMachine {
    dir: PathBuf,
    state: MetaState,
    last_applied: Option<LogId>,
    last_membership: StoredMembership,
    published: Rc<Published>,
}

impl StateMachine {
    /// Loads the last snapshot from `dir` (an empty state when there is none) and publishes it.
    pub fn open(dir: &Path, published: Rc<Published>) -> io::Result<StateMachine> {
        std::fs::create_dir_all(dir)?;
        let mut sm = StateMachine {
            dir: dir.to_path_buf(),
            state: MetaState::default(),
            last_applied: None,
            last_membership: StoredMembership::default(),
            published,
        };
        if let Some((file, _)) = read_snapshot(dir)? {
            sm.state = file.state;
            sm.last_applied = file.meta.last_log_id;
            sm.last_membership = file.meta.last_membership;
        }
        sm.published.publish(Arc::new(sm.state.clone()));
        Ok(sm)
    }
}

fn read_snapshot(dir: &Path) -> io::Result<Option<(SnapshotFile, Vec<u8>)>> {
    let bytes = match std::fs::read(dir.join(SNAPSHOT_FILE)) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let file = parse_snapshot(&bytes)?;
    Ok(Some((file, bytes)))
}

fn parse_snapshot(bytes: &[u8]) -> io::Result<SnapshotFile> {
    let file: SnapshotFile = serde_json::from_slice(bytes)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{SNAPSHOT_FILE}: {e}")))?;
    if file.format != SNAPSHOT_FORMAT {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{SNAPSHOT_FILE}: unknown format {}", file.format),
        ));
    }
    let want = file.meta.last_log_id.as_ref().map_or(0, |l| l.index);
    if file.state.applied_index != want {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{SNAPSHOT_FILE}: state applied_index {} differs from snapshot index {want}",
                file.state.applied_index
            ),
        ));
    }
    Ok(file)
}

/// Builds `snapshot.json` from a copy of the state taken when the build was requested.
pub struct SnapshotBuilder {
    dir: PathBuf,
    meta: SnapshotMeta,
    state: MetaState,
    published: Rc<Published>,
    /// The encoded snapshot, its temp file already allocated (see [`SnapshotBuilder::prepare`]).
    prepared: Option<Vec<u8>>,
}

impl SnapshotBuilder {
    /// Encodes the snapshot and allocates its temp file at full length, so that [`Self::write`]
    /// needs no new disk blocks. openraft stops the whole group when a snapshot it asked for
    /// fails, so a full disk must show here, where the snapshot can still be put off.
    fn prepare(&mut self) -> io::Result<()> {
        let file = SnapshotFile {
            format: SNAPSHOT_FORMAT,
            meta: self.meta.clone(),
            state: std::mem::take(&mut self.state),
        };
        let bytes = serde_json::to_vec(&file).map_err(io::Error::other)?;
        let tmp = durable::temp_path(&self.dir.join(SNAPSHOT_FILE));
        let allocated = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&tmp)
            .and_then(|f| durable::allocate(&f, bytes.len() as u64));
        if let Err(e) = allocated {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        self.prepared = Some(bytes);
        Ok(())
    }

    /// Writes the snapshot into its allocated temp file and renames it into place (a forced
    /// snapshot, built without being asked first, is prepared here).
    fn write(&mut self) -> Result<SnapshotOf<TypeConfig, Vec<u8>>, io::Error> {
        use std::os::unix::fs::FileExt;
        if self.prepared.is_none() {
            self.prepare()?;
        }
        let bytes = self.prepared.take().expect("prepared above");
        let path = self.dir.join(SNAPSHOT_FILE);
        let f = OpenOptions::new()
            .write(true)
            .open(durable::temp_path(&path))?;
        f.write_all_at(&bytes, 0)?;
        f.set_len(bytes.len() as u64)?;
        f.sync_data()?;
        durable::install_temp(&path)?;
        tracing::info!(
            index = self.meta.last_log_id.as_ref().map_or(0, |l| l.index),
            bytes = bytes.len(),
            "metadata snapshot written"
        );
        Ok(Snapshot {
            meta: self.meta.clone(),
            snapshot: bytes,
        })
    }
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = Vec<u8>;

    async fn build_snapshot(&mut self) -> Result<SnapshotOf<TypeConfig, Vec<u8>>, io::Error> {
        let t0 = Instant::now();
        let r = self.write();
        let us = u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX);
        match &r {
            Ok(snap) => self.published.count(|f| {
                f.snapshot_bytes = snap.snapshot.len() as u64;
                f.snapshot_duration_us = us;
            }),
            Err(e) => {
                tracing::error!(error = %e, "metadata snapshot failed");
                self.published.count(|f| f.snapshot_failures += 1);
            }
        }
        r
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = Vec<u8>;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        Ok((self.last_applied.clone(), self.last_membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: futures_util::Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>>
            + Unpin
            + OptionalSend,
    {
        // Answers go out only after the new state is published, so a proposer never sees its
        // answer before the rest of the shard can see the change.
        let mut answers = Vec::new();
        let mut changed = false;
        while let Some(item) = entries.next().await {
            let (entry, responder) = item.inspect_err(|_| {
                self.published.count(|f| f.apply_errors_storage += 1);
            })?;
            let index = entry.log_id.index;
            let outcome = match entry.payload {
                EntryPayload::Normal(cmd) => {
                    changed = true;
                    ApplyOutcome(apply(&mut self.state, index, cmd))
                }
                EntryPayload::Blank => {
                    self.state.applied_index = index;
                    ApplyOutcome(Ok(MetaResponse::Done))
                }
                EntryPayload::Membership(m) => {
                    self.state.applied_index = index;
                    self.last_membership = StoredMembership::new(Some(entry.log_id.clone()), m);
                    ApplyOutcome(Ok(MetaResponse::Done))
                }
            };
            self.last_applied = Some(entry.log_id);
            if let Some(r) = responder {
                answers.push((r, outcome));
            }
        }
        if changed || self.published.current().applied_index != self.state.applied_index {
            self.published.publish(Arc::new(self.state.clone()));
        }
        for (r, outcome) in answers {
            r.send(outcome);
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            dir: self.dir.clone(),
            meta: SnapshotMeta {
                last_log_id: self.last_applied.clone(),
                last_membership: self.last_membership.clone(),
            },
            state: self.state.clone(),
            published: self.published.clone(),
            prepared: None,
        }
    }

    async fn try_create_snapshot_builder(&mut self, force: bool) -> Option<Self::SnapshotBuilder> {
        #[allow(deprecated)]
        let mut b = self.get_snapshot_builder().await;
        if force {
            return Some(b);
        }
        match b.prepare() {
            Ok(()) => Some(b),
            Err(e) => {
                // Put off, not failed: the log keeps every entry until a snapshot is written,
                // and openraft asks again after the next entries.
                tracing::warn!(error = %e, "metadata snapshot put off: its file cannot be written");
                self.published.count(|f| f.snapshot_failures += 1);
                None
            }
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Vec<u8>,
    ) -> Result<(), io::Error> {
        let file = parse_snapshot(&snapshot)?;
        if &file.meta != meta {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "snapshot data does not match its meta",
            ));
        }
        // Only rewrite the file when it is not the one already on disk.
        let on_disk = read_snapshot(&self.dir)?.map(|(f, _)| f.meta);
        if on_disk.as_ref() != Some(meta) {
            durable::replace_file(&self.dir.join(SNAPSHOT_FILE), &snapshot)?;
        }
        self.state = file.state;
        self.last_applied = meta.last_log_id.clone();
        self.last_membership = meta.last_membership.clone();
        self.published.publish(Arc::new(self.state.clone()));
        tracing::info!(
            last_index = meta.last_log_id.as_ref().map_or(0, |l| l.index),
            bytes = snapshot.len(),
            "metadata snapshot installed from the leader"
        );
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<SnapshotOf<TypeConfig, Vec<u8>>>, io::Error> {
        Ok(read_snapshot(&self.dir)?.map(|(file, bytes)| Snapshot {
            meta: file.meta,
            snapshot: bytes,
        }))
    }
}

#[cfg(test)]
mod tests {
    use openraft::impls::leader_id_adv::LeaderId;
    use openraft::storage::RaftLogStorage;

    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("narad-store-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(
            LeaderId {
                term,
                node_id: "n1".to_string(),
            },
            index,
        )
    }

    fn entry(term: u64, index: u64) -> Entry {
        Entry {
            log_id: log_id(term, index),
            payload: EntryPayload::Blank,
        }
    }

    async fn append(log: &mut LogStore, terms_indexes: &[(u64, u64)]) {
        let entries: Vec<Entry> = terms_indexes.iter().map(|&(t, i)| entry(t, i)).collect();
        log.append(entries, IOFlushed::noop())
            .await
            .expect("append");
    }

    fn file_len(dir: &Path) -> u64 {
        std::fs::metadata(dir.join(LOG_FILE))
            .map(|m| m.len())
            .unwrap_or(0)
    }

    #[test]
    fn log_replays_appends_truncations_purges_and_vote_after_reopen() {
        // Proves every log operation is durable and replayed in order: entries, a truncation
        // followed by re-appends at the same indexes with a new term, a purge, the committed id
        // and the vote all come back identical after reopening.
        let dir = temp_dir("replay");
        narad_io::rt::block_on(async {
            let (mut log, rec) = LogStore::open(&dir).expect("open");
            assert_eq!(rec, LogRecovery::default());
            append(&mut log, &[(1, 1), (1, 2), (1, 3), (1, 4)]).await;
            log.truncate_after(Some(log_id(1, 2)))
                .await
                .expect("truncate");
            append(&mut log, &[(2, 3), (2, 4), (2, 5)]).await;
            log.purge(log_id(1, 1)).await.expect("purge");
            log.save_committed(Some(log_id(2, 4)))
                .await
                .expect("committed");
            let vote = Vote::new(2, "n1".to_string());
            log.save_vote(&vote).await.expect("vote");
            drop(log);
            let (mut log, rec) = LogStore::open(&dir).expect("reopen");
            assert_eq!(rec.torn_tail_bytes, 0);
            assert_eq!(log.entry_indexes(), vec![2, 3, 4, 5]);
            let got = log.try_get_log_entries(3..=4).await.expect("read");
            assert_eq!(
                got.iter().map(|e| e.log_id.clone()).collect::<Vec<_>>(),
                vec![log_id(2, 3), log_id(2, 4)]
            );
            let st = log.get_log_state().await.expect("state");
            assert_eq!(
                (st.last_purged_log_id, st.last_log_id),
                (Some(log_id(1, 1)), Some(log_id(2, 5)))
            );
            assert_eq!(
                log.read_committed().await.expect("committed"),
                Some(log_id(2, 4))
            );
            assert_eq!(log.read_vote().await.expect("vote"), Some(vote));
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_vote_json_of_an_older_version_moves_into_the_vote_file() {
        // Proves an upgrade keeps the vote: a `vote.json` written by a version before
        // `raft-vote` is read at open, written into `raft-vote` (then removed), and the next
        // vote goes to the other slot, the newer one read back after a reopen.
        let dir = temp_dir("vote-legacy");
        std::fs::create_dir_all(&dir).unwrap();
        let old = Vote::new(7, "n2".to_string());
        std::fs::write(
            dir.join(VOTE_FILE_LEGACY),
            serde_json::to_vec(&old).unwrap(),
        )
        .unwrap();
        narad_io::rt::block_on(async {
            let (mut log, _) = LogStore::open(&dir).expect("open");
            assert_eq!(log.read_vote().await.unwrap(), Some(old.clone()));
            assert!(!dir.join(VOTE_FILE_LEGACY).exists());
            assert_eq!(
                std::fs::metadata(dir.join(VOTE_FILE)).unwrap().len(),
                VOTE_FILE_BYTES as u64
            );
            let (mut log2, _) = LogStore::open(&dir).expect("reopen");
            assert_eq!(log2.read_vote().await.unwrap(), Some(old));
            drop(log2);
            log.save_vote(&Vote::new(8, "n3".to_string()))
                .await
                .unwrap();
        });
        narad_io::rt::block_on(async {
            let (mut log, _) = LogStore::open(&dir).expect("reopen");
            assert_eq!(
                log.read_vote().await.unwrap(),
                Some(Vote::new(8, "n3".to_string()))
            );
        });
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn torn_tail_is_cut_and_synced_data_kept() {
        // Proves crash recovery: a partly written last write (here: the last frame cut at every
        // possible length, and a hole in the middle of the last multi-frame write) is cut off
        // at open and the acknowledged entries before it are kept; appends continue afterwards.
        let dir = temp_dir("torn");
        narad_io::rt::block_on(async {
            let (mut log, _) = LogStore::open(&dir).expect("open");
            append(&mut log, &[(1, 1), (1, 2)]).await;
            let synced = file_len(&dir);
            append(&mut log, &[(1, 3), (1, 4), (1, 5)]).await;
            drop(log);
            let full = std::fs::read(dir.join(LOG_FILE)).expect("read");
            // Every truncation point inside the last write.
            for cut in synced as usize + 1..full.len() {
                std::fs::write(dir.join(LOG_FILE), &full[..cut]).expect("write");
                let (log, rec) = LogStore::open(&dir).expect("open after torn tail");
                let idx = log.entry_indexes();
                assert!(
                    idx.starts_with(&[1, 2]) && idx.len() < 5,
                    "cut {cut}: {idx:?}"
                );
                assert_eq!(
                    file_len(&dir),
                    cut as u64 - rec.torn_tail_bytes,
                    "torn bytes are cut off"
                );
            }
            // A hole inside the last write while its last frame (the sync end) reached the disk.
            let mut holed = full.clone();
            holed[synced as usize + 20] ^= 0xff;
            std::fs::write(dir.join(LOG_FILE), &holed).expect("write");
            let (mut log, rec) =
                LogStore::open(&dir).expect("a hole in the unsynced tail is a torn tail");
            assert_eq!(log.entry_indexes(), vec![1, 2]);
            assert!(rec.torn_tail_bytes > 0);
            assert_eq!(file_len(&dir), synced);
            append(&mut log, &[(1, 3)]).await;
            drop(log);
            let (log, _) = LogStore::open(&dir).expect("reopen");
            assert_eq!(log.entry_indexes(), vec![1, 2, 3]);
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn damage_inside_synced_data_refuses_to_open() {
        // Proves a flipped byte in a synced, acknowledged write followed by later writes makes
        // open fail with a message naming the damage, instead of silently dropping entries.
        let dir = temp_dir("damage");
        narad_io::rt::block_on(async {
            let (mut log, _) = LogStore::open(&dir).expect("open");
            append(&mut log, &[(1, 1), (1, 2)]).await;
            append(&mut log, &[(1, 3)]).await;
            drop(log);
            let mut bytes = std::fs::read(dir.join(LOG_FILE)).expect("read");
            bytes[LOG_FILE_MAGIC.len() + FRAME_HEADER_BYTES + 3] ^= 0x01;
            std::fs::write(dir.join(LOG_FILE), &bytes).expect("write");
            let err = LogStore::open(&dir).err().expect("open refuses");
            assert_eq!(err.kind(), io::ErrorKind::InvalidData);
            assert!(err.to_string().contains("damaged frame at byte"), "{err}");
            // The damaged frame is the last of its synced write (the one a later write
            // follows): its own header says so.
            let mut bytes = std::fs::read(dir.join(LOG_FILE)).expect("read");
            bytes[LOG_FILE_MAGIC.len() + FRAME_HEADER_BYTES + 3] ^= 0x01;
            let second = LOG_FILE_MAGIC.len()
                + FRAME_HEADER_BYTES
                + u32_at(&bytes, LOG_FILE_MAGIC.len() + 4).unwrap() as usize;
            assert_eq!(u32_at(&bytes, second), Some(FRAME_MAGIC_SYNC_END));
            bytes[second + FRAME_HEADER_BYTES + 3] ^= 0x01;
            std::fs::write(dir.join(LOG_FILE), &bytes).expect("write");
            let err = LogStore::open(&dir).err().expect("open refuses");
            assert!(err.to_string().contains("damaged frame at byte"), "{err}");
            std::fs::write(dir.join(LOG_FILE), b"NOTALOG!").expect("write");
            assert!(LogStore::open(&dir).is_err(), "bad magic refused");
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn compaction_rewrites_only_live_entries() {
        // Proves the log file stays bounded: after many entries are purged the file is rewritten
        // with the live entries only (more than LOG_COMPACT_SLACK_FRAMES dead frames trigger it),
        // and the rewritten file reopens to the same image.
        let dir = temp_dir("compact");
        narad_io::rt::block_on(async {
            let (mut log, _) = LogStore::open(&dir).expect("open");
            let n = LOG_COMPACT_SLACK_FRAMES + 100;
            for chunk in (1..=n).collect::<Vec<_>>().chunks(256) {
                let ids: Vec<(u64, u64)> = chunk.iter().map(|&i| (1, i)).collect();
                append(&mut log, &ids).await;
            }
            let before = file_len(&dir);
            log.purge(log_id(1, n - 10)).await.expect("purge");
            let after = file_len(&dir);
            assert!(after * 20 < before, "file compacted: {before} -> {after}");
            assert_eq!(
                log.0.borrow().frames_in_file,
                12,
                "purge marker + 10 entries + committed"
            );
            drop(log);
            let (mut log, _) = LogStore::open(&dir).expect("reopen");
            assert_eq!(log.entry_indexes(), (n - 9..=n).collect::<Vec<_>>());
            let st = log.get_log_state().await.expect("state");
            assert_eq!(st.last_purged_log_id, Some(log_id(1, n - 10)));
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn appends_land_in_space_reserved_ahead() {
        // Proves what makes a full disk harmless to the log (see `LogStore::reserve`): the room
        // reserved past the end of `raft-log` is allocated on disk while the file's length stays
        // what its frames make it, appends within it allocate nothing more, and a request past it
        // reserves again. A file system without fallocate (EOPNOTSUPP) skips the check.
        use std::os::unix::fs::MetadataExt;
        let dir = temp_dir("reserve");
        let allocated = |d: &Path| std::fs::metadata(d.join(LOG_FILE)).unwrap().blocks() * 512;
        narad_io::rt::block_on(async {
            let (mut log, _) = LogStore::open(&dir).expect("open");
            if log.0.borrow().reserved_end == u64::MAX {
                eprintln!("skipped: this file system cannot reserve space");
                return;
            }
            let len = file_len(&dir);
            assert_eq!(log.0.borrow().len, len);
            assert!(
                allocated(&dir) >= len + LOG_RESERVE_AHEAD_BYTES,
                "open reserves ahead: {} allocated for {len} bytes",
                allocated(&dir)
            );
            let before = allocated(&dir);
            log.reserve(10_000).expect("within the reservation");
            append(&mut log, &[(1, 1), (1, 2), (1, 3)]).await;
            assert_eq!(allocated(&dir), before, "appends used the reserved blocks");
            assert_eq!(log.0.borrow().len, file_len(&dir));
            log.reserve(3 * LOG_RESERVE_AHEAD_BYTES)
                .expect("past the reservation");
            assert!(allocated(&dir) >= file_len(&dir) + 3 * LOG_RESERVE_AHEAD_BYTES);
            assert_eq!(log.entry_indexes(), vec![1, 2, 3]);
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn snapshot_built_on_one_machine_installs_on_another() {
        // Proves the snapshot path end to end without openraft: build a snapshot from a state
        // machine, install its bytes into a fresh one in another directory, and get the same
        // state, applied id and a published copy; mismatched meta is refused.
        let a = temp_dir("snap-a");
        let b = temp_dir("snap-b");
        narad_io::rt::block_on(async {
            let pub_a = Rc::new(Published::default());
            let mut sm = StateMachine::open(&a, pub_a.clone()).expect("open a");
            sm.state.applied_index = 7;
            sm.state.topics_version = 3;
            sm.last_applied = Some(log_id(2, 7));
            let mut builder = sm.get_snapshot_builder().await;
            let snap = builder.build_snapshot().await.expect("build");
            let current = sm
                .get_current_snapshot()
                .await
                .expect("read")
                .expect("exists");
            assert_eq!(current.meta, snap.meta);

            let pub_b = Rc::new(Published::default());
            let mut other = StateMachine::open(&b, pub_b.clone()).expect("open b");
            let mut wrong = snap.meta.clone();
            wrong.last_log_id = Some(log_id(2, 8));
            assert!(other
                .install_snapshot(&wrong, snap.snapshot.clone())
                .await
                .is_err());
            other
                .install_snapshot(&snap.meta, snap.snapshot)
                .await
                .expect("install");
            assert_eq!(
                other.applied_state().await.expect("applied").0,
                Some(log_id(2, 7))
            );
            assert_eq!(pub_b.current().topics_version, 3);
            drop(other);
            let reopened = StateMachine::open(&b, Rc::new(Published::default())).expect("reopen b");
            assert_eq!(
                reopened.state.applied_index, 7,
                "installed snapshot is durable"
            );
        });
        let _ = std::fs::remove_dir_all(&a);
        let _ = std::fs::remove_dir_all(&b);
    }

    #[test]
    fn snapshot_figures_follow_builds_and_failures() {
        // Proves the `/metrics` figures of snapshots: a build sets the size of the file it wrote
        // and a duration; a build that cannot write its file (directory gone) counts a failure
        // and leaves the last size in place.
        let a = temp_dir("snap-figures");
        narad_io::rt::block_on(async {
            let published = Rc::new(Published::default());
            let mut sm = StateMachine::open(&a, published.clone()).expect("open");
            assert_eq!(published.figures(), StoreFigures::default());
            let snap = sm
                .get_snapshot_builder()
                .await
                .build_snapshot()
                .await
                .expect("build");
            let f = published.figures();
            let on_disk = std::fs::metadata(a.join(SNAPSHOT_FILE))
                .expect("file")
                .len();
            assert_eq!(f.snapshot_bytes, snap.snapshot.len() as u64);
            assert_eq!(f.snapshot_bytes, on_disk);
            assert!(f.snapshot_duration_us > 0);
            assert_eq!(f.snapshot_failures, 0);
            std::fs::remove_dir_all(&a).expect("remove");
            let mut builder = sm.get_snapshot_builder().await;
            assert!(builder.build_snapshot().await.is_err());
            let g = published.figures();
            assert_eq!(g.snapshot_failures, 1);
            assert_eq!(g.snapshot_bytes, f.snapshot_bytes);
            assert_eq!(g.apply_errors_storage, 0);
        });
        let _ = std::fs::remove_dir_all(&a);
    }

    #[test]
    fn subscribers_are_bounded_and_see_every_publish() {
        // Proves subscribers are called with each published state, may read the current state
        // from inside the callback, and that more than SUBSCRIBERS_MAX are refused.
        let p = Rc::new(Published::default());
        let seen = Rc::new(std::cell::Cell::new(0u64));
        for _ in 0..SUBSCRIBERS_MAX {
            let (s, p2) = (seen.clone(), p.clone());
            let f: Subscriber = Rc::new(move |st: Arc<MetaState>| {
                assert_eq!(p2.current().applied_index, st.applied_index);
                s.set(s.get() + 1);
            });
            assert!(p.subscribe(f).is_ok());
        }
        assert!(p.subscribe(Rc::new(|_: Arc<MetaState>| {})).is_err());
        p.publish(Arc::new(MetaState {
            applied_index: 5,
            ..MetaState::default()
        }));
        assert_eq!(seen.get(), SUBSCRIBERS_MAX as u64);
    }
}
