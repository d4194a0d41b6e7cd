//! Opening a shard log: recovery after a clean stop or a crash.
//!
//! Owns: [`ShardLog::open`] and its [`RecoveryReport`]: loading this shard's partitions from their
//! segment files, replaying the WAL from the last checkpoint into them, the repair of partitions
//! damaged after it, the gap frames (holes in the replay, offsets missing below a checkpoint's
//! marks), the transit records and `Handed` markers met on the way, and the state the committer
//! starts from. Never: decodes WAL batches (the WAL's own recovery hands over the records), or
//! lets a partition file overrule the WAL (offsets in the WAL are authoritative).
//!
//! Crash safety: this file carries point 3 of the argument in `mod.rs`, and the replay half of
//! point 5. Everything before the last checkpoint's `P` was made durable in the partition files;
//! everything after it is replayed from the WAL, idempotently, and the WAL is released only by
//! the checkpoint that ends a recovery, so a crash during recovery is recovered from the same
//! way. A partition damaged at or after its first offset in the WAL is cut back and rewritten;
//! offsets lost below a checkpoint's mark, or missing from the WAL, become gap frames that read
//! as corrupt and are never given to new records.

use std::cell::{Cell, RefCell};
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::rc::Rc;
use std::time::Instant;

use super::commit::committer;
use super::transit::{transit_parts, TransitHold};
use super::{
    wal_config, AppendRecord, Inner, LogConfig, LogError, LogFailures, RecoveredPartition,
    ShardLog, Signals, State,
};
use crate::codec::{WalPosition, WalRecord};
use crate::partition::{self, EncodedBatch, PartitionLog, ScanReport};
use crate::rt::Notify;
use crate::types::{owner_shard, Destination, FastMap, Offset, PartitionKey, UnixMillis};
use crate::wal::{Wal, WalRecoveryStats};

/// Replay writes a partition's frames in runs of at most this many bytes.
const REPLAY_RUN_BYTES_MAX: usize = 1 << 20;

/// What `open` found and did.
#[derive(Clone, Debug, Default)]
pub struct RecoveryReport {
    pub partitions: u32,
    /// Partition segment scan: segments, records, torn tail bytes, corrupt records.
    pub scan: ScanReport,
    pub wal: WalRecoveryStats,
    /// WAL message records appended to partitions (not yet in their segment files).
    pub replayed_messages: u64,
    /// WAL message records already present in the segment files.
    pub skipped_present: u64,
    /// WAL message records of partitions deleted since.
    pub skipped_deleted: u64,
    /// Offsets missing from the WAL replay (holes), filled with gap frames that read as corrupt.
    pub gap_records: u64,
    pub replayed_settles: u64,
    /// Offsets below a partition's mark in the last checkpoint that its files no longer held
    /// (filled with gap frames that read as corrupt).
    pub checkpointed_missing: u64,
    /// Partitions whose files were damaged after the last checkpoint and rewritten from the WAL.
    pub repaired_partitions: u32,
    /// Transit records replayed: accepted here for a partition of another shard, and not known
    /// to be handed over (see [`ShardLog::append_transit`]).
    pub transit_records: u64,
    pub duration_ms: u64,
}

impl ShardLog {
    /// Opens and recovers this shard's log: partition files first, then the WAL replay from the
    /// last checkpoint; then checkpoints, so the next recovery starts from here.
    pub async fn open(
        cfg: LogConfig,
    ) -> Result<(ShardLog, Vec<RecoveredPartition>, RecoveryReport), LogError> {
        let started = Instant::now();
        if cfg.shard_count == 0 || cfg.shard.0 >= cfg.shard_count {
            return Err(LogError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "shard must be below shard_count",
            )));
        }
        std::fs::create_dir_all(partition::topics_dir(&cfg.data_dir))?;
        let mut report = RecoveryReport::default();
        let mut partitions = FastMap::default();
        for (key, dir) in partition::scan_partition_dirs(&cfg.data_dir)? {
            if owner_shard(key, cfg.shard_count) != cfg.shard {
                continue;
            }
            let (p, scan) = PartitionLog::open(&dir, key, cfg.partition_segment_bytes_max)?;
            report.scan.add(&scan);
            partitions.insert(key, p);
        }
        let (wal, records, mut wal_stats) = Wal::open(wal_config(&cfg)).await?;
        let marks = std::mem::take(&mut wal_stats.last_checkpoint_marks);
        report.wal = wal_stats;
        let replayed = !records.is_empty();
        let open_pos = wal.write_position();
        let mut transit = Vec::new();
        let mut handed = HashMap::new();
        replay(
            &cfg,
            &mut partitions,
            records,
            &mut report,
            &mut transit,
            &mut handed,
        )?;
        fill_below_marks(&mut partitions, &marks, &mut report)?;
        // Sequences continue after everything recovery saw; records a marker covers were
        // handed over before the crash.
        let mut transit_next = handed.clone();
        for (_, h, _) in &transit {
            let n = transit_next.entry(h.dest).or_insert(0);
            *n = (*n).max(h.seq + 1);
        }
        transit.retain(|(_, h, _)| h.seq >= handed.get(&h.dest).copied().unwrap_or(0));
        report.transit_records = transit.len() as u64;
        let transit_holds: BTreeMap<TransitHold, WalPosition> =
            transit.iter().map(|(pos, h, _)| (*h, *pos)).collect();
        let recovered_transit: Vec<(TransitHold, AppendRecord)> =
            transit.into_iter().map(|(_, h, r)| (h, r)).collect();
        let mut last_stamp = UnixMillis(0);
        let mut recovered = Vec::with_capacity(partitions.len());
        for p in partitions.values_mut() {
            p.clamp_settled();
            last_stamp = last_stamp.max(p.last_commit_ms().unwrap_or_default());
            recovered.push(RecoveredPartition {
                key: p.key(),
                next_offset: p.next_offset(),
                oldest_offset: p.oldest_offset(),
                settled: p.settled(),
            });
        }
        recovered.sort_by_key(|r| r.key);
        report.partitions = recovered.len() as u32;
        let last_pos = replayed.then(|| wal.write_position());
        let state = State {
            partitions,
            queue: VecDeque::new(),
            queue_bytes: 0,
            settles_requeued: 0,
            inflight: 0,
            planned_next: FastMap::default(),
            last_pos,
            last_content_pos: None,
            last_checkpoint: None,
            wal_bytes_since_checkpoint: 0,
            last_checkpoint_at: Instant::now(),
            last_stamp,
            deleted_topics: HashSet::new(),
            poisoned: None,
            closing: false,
            closed: false,
            transit_holds,
            transit_durable: transit_next.clone(),
            transit_marked: handed,
            transit_next,
            open_pos,
            recovered_transit,
        };
        let inner = Rc::new(Inner {
            cfg,
            wal,
            state: RefCell::new(state),
            callbacks: RefCell::new(Vec::new()),
            transit_sink: RefCell::new(None),
            checkpoint_running: Cell::new(false),
            checkpoint_done: Notify::new(),
            failures: Cell::new(LogFailures::default()),
            idle_evicted: Cell::new(0),
            cold_swept: Cell::new(0),
        });
        let signals = Rc::new(Signals {
            work: Notify::new(),
            progress: Notify::new(),
        });
        crate::rt::spawn(committer(Rc::downgrade(&inner), signals.clone())).detach();
        let log = ShardLog { inner, signals };
        if replayed || report.checkpointed_missing > 0 {
            match log.checkpoint().await {
                Ok(()) => {}
                // The WAL still holds everything the checkpoint would have written out, and the
                // periodic checkpoint retries: serve reads (and drain) on a full disk instead of
                // refusing to start.
                Err(LogError::DiskFull) => tracing::warn!(
                    shard = log.inner.cfg.shard.0,
                    "disk full: the checkpoint after recovery waits for space; consumes are served, produces fail until then"
                ),
                Err(e) => return Err(e),
            }
        }
        report.duration_ms = started.elapsed().as_millis() as u64;
        tracing::info!(
            shard = log.inner.cfg.shard.0,
            partitions = report.partitions,
            segments = report.scan.segments,
            records = report.scan.records,
            replayed = report.replayed_messages,
            torn_bytes = report.scan.torn_tail_bytes,
            corrupt = report.scan.corrupt_records,
            gaps = report.gap_records,
            missing_below_checkpoint = report.checkpointed_missing,
            ms = report.duration_ms,
            "shard log recovered"
        );
        Ok((log, recovered, report))
    }
}

/// Writes pending replay runs to their partitions.
fn flush_runs(
    partitions: &mut FastMap<PartitionKey, PartitionLog>,
    runs: &mut HashMap<PartitionKey, EncodedBatch>,
) -> Result<(), LogError> {
    for (key, run) in runs.drain() {
        if let Some(p) = partitions.get_mut(&key) {
            p.append(&run)?;
        }
    }
    Ok(())
}

/// After the replay: a partition whose files end below its mark in the last checkpoint lost
/// records that were durable (damage at the end of its newest segment, cut as if torn). Their
/// offsets become gap frames that read as corrupt, so that they are skipped and counted instead of
/// silently handed out again to new records.
fn fill_below_marks(
    partitions: &mut FastMap<PartitionKey, PartitionLog>,
    marks: &[(PartitionKey, Offset)],
    report: &mut RecoveryReport,
) -> Result<(), LogError> {
    for &(key, mark) in marks {
        // A partition without files was deleted after the checkpoint: nothing to keep.
        let Some(p) = partitions.get_mut(&key) else {
            continue;
        };
        let next = p.next_offset();
        if next >= mark {
            continue;
        }
        tracing::error!(?key, from = next.0, to = mark.0,
            "records the last checkpoint made durable are missing from the partition files; they will read as corrupt");
        let mut run = EncodedBatch::new(next);
        while run.next() < mark {
            run.push_gap();
        }
        p.append(&run)?;
        report.checkpointed_missing += mark.0 - next.0;
    }
    Ok(())
}

fn replay(
    cfg: &LogConfig,
    partitions: &mut FastMap<PartitionKey, PartitionLog>,
    records: Vec<(WalPosition, WalRecord)>,
    report: &mut RecoveryReport,
    transit: &mut Vec<(WalPosition, TransitHold, AppendRecord)>,
    handed: &mut HashMap<Destination, u64>,
) -> Result<(), LogError> {
    // Everything at or after a partition's first offset in the WAL is in the WAL. A partition
    // whose files are damaged in that range (pages lost at a power failure, a segment file
    // created after the checkpoint whose directory entry was lost) is cut back to it, so the
    // replay rewrites those records instead of leaving acknowledged data unreadable.
    let mut first_in_wal: HashMap<PartitionKey, Offset> = HashMap::new();
    for (_, rec) in &records {
        if let WalRecord::Message { key, offset, .. } = rec {
            let f = first_in_wal.entry(*key).or_insert(*offset);
            *f = (*f).min(*offset);
        }
    }
    for (key, from) in first_in_wal {
        if let Some(p) = partitions.get_mut(&key) {
            if p.damaged_from(from) {
                tracing::warn!(?key, from = from.0, "partition files damaged after the last checkpoint; rewriting them from the write-ahead log");
                p.truncate_to(from)?;
                report.repaired_partitions += 1;
            }
        }
    }
    let mut runs: HashMap<PartitionKey, EncodedBatch> = HashMap::new();
    for (pos, rec) in records {
        match rec {
            WalRecord::Message {
                key,
                offset,
                commit_ms,
                msg_key,
                payload,
            } => {
                if owner_shard(key, cfg.shard_count) != cfg.shard {
                    tracing::error!(
                        ?key,
                        "WAL message for a partition this shard does not own; skipped"
                    );
                    continue;
                }
                if let Entry::Vacant(v) = partitions.entry(key) {
                    if offset != Offset(0) {
                        report.skipped_deleted += 1;
                        continue;
                    }
                    v.insert(PartitionLog::create(
                        &cfg.data_dir,
                        key,
                        cfg.partition_segment_bytes_max,
                    )?);
                }
                let p = &partitions[&key];
                let next = runs.get(&key).map_or(p.next_offset(), EncodedBatch::next);
                if offset < next {
                    report.skipped_present += 1;
                    continue;
                }
                let run = runs.entry(key).or_insert_with(|| EncodedBatch::new(next));
                if offset > next {
                    tracing::error!(?key, from = next.0, to = offset.0,
                        "offsets missing from the write-ahead log replay; they will read as corrupt");
                    report.gap_records += offset.0 - next.0;
                    while run.next() < offset {
                        run.push_gap();
                    }
                }
                run.push_message(commit_ms, msg_key.as_deref(), &payload);
                report.replayed_messages += 1;
                if run.byte_len() >= REPLAY_RUN_BYTES_MAX {
                    let run = runs.remove(&key).expect("run present");
                    partitions
                        .get_mut(&key)
                        .expect("partition present")
                        .append(&run)?;
                }
            }
            WalRecord::Settle { key, offsets } => {
                if let Some(p) = partitions.get_mut(&key) {
                    p.settle(&offsets);
                    report.replayed_settles += 1;
                }
            }
            r @ WalRecord::Transit { .. } => {
                if let Some((hold, rec)) = transit_parts(r, cfg.shard_count) {
                    transit.push((pos, hold, rec));
                }
            }
            WalRecord::Handed { dest, upto } => {
                let h = handed.entry(dest).or_insert(0);
                *h = (*h).max(upto);
            }
            WalRecord::Checkpoint { .. } => {}
        }
    }
    flush_runs(partitions, &mut runs)
}
