//! Deterministic simulation of the write-ahead log: the real group-commit core
//! (`wal::core`) and recovery scan (`wal::recovery`) run against an in-memory disk that injects
//! faults, driven by a seeded generator. Used by `io/tests/wal_sim.rs`; public only for that.
//!
//! Owns: the simulated disk and the reference model of what was acknowledged. Never touches a
//! real file, never reads the clock: a seed fully determines a run.
//!
//! Pipelining: up to `batches_in_flight_max` batches are in flight, as in the driver: the next
//! batch is written once every earlier write completed, each batch runs its own fdatasync (at a
//! random later step, in random order among the batches in flight), and batches resolve strictly
//! in order, each after its own fdatasync and read-back. So a crash can find batch k written but
//! not synced while k+1 is written (or synced, which also syncs k).
//!
//! Released segments are often recycled: a new segment is then a released file renamed into place
//! with the batches of its earlier life still in it, so torn writes land over old batches.
//!
//! Faults: unsynced writes lost, kept, torn to a prefix or torn to a random subset of 512-byte
//! sectors at a crash; a crash between write and fdatasync or between fdatasync and completion;
//! EIO on write; EIO/ENOSPC on fdatasync (poisons; data state unknown until the next crash);
//! ENOSPC when allocating a segment (DiskFull); a mismatching read-back; bit flips in the middle of
//! the durable log.
//!
//! Invariant, checked after every step against a crash of a copy of the disk (and at every real
//! crash): every acknowledged append whose batch was not hit by a bit flip is recovered byte for
//! byte and in order (unless before the last checkpoint); every recovered record is one that was
//! submitted, unchanged, in submission order (no garbage); damage is reported as corruption only
//! when a bit flip happened, and a flip that loses acknowledged records is always reported.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};

use super::core::{BatchPlan, Core, CoreConfig, Outcome, Ticket};
use super::recovery::{Recovered, Scanner};
use super::{WalError, WalPosition, WalRecord};
use crate::codec;
use crate::types::{Destination, MemberId, Offset, PartitionId, PartitionKey, TopicId, UnixMillis};

/// xorshift64*: tiny, deterministic.
#[derive(Clone)]
pub struct SimRng(u64);

impl SimRng {
    pub fn new(seed: u64) -> SimRng {
        // splitmix the seed so that nearby seeds diverge at once; never zero.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        SimRng((z ^ (z >> 31)) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    /// True with probability 1/n.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

#[derive(Clone, Default)]
struct SimFile {
    /// What reads see (the page cache view).
    cur: Vec<u8>,
    /// What survives a crash.
    durable: Vec<u8>,
    /// Writes since the last successful fdatasync: (pos, len).
    unsynced: Vec<(usize, usize)>,
}

/// An in-memory disk of WAL segments.
#[derive(Clone, Default)]
pub struct SimDisk {
    files: BTreeMap<u64, SimFile>,
    /// Released segment files kept for reuse (the driver's recycle pool): their durable images,
    /// old batches and all. Kept across crashes too, which the driver does not need.
    pool: Vec<Vec<u8>>,
}

impl SimDisk {
    fn allocate(&mut self, id: u64, len: usize) {
        let f = self.files.entry(id).or_default();
        if f.cur.len() < len {
            f.cur.resize(len, 0);
            f.durable.resize(len, 0);
        }
    }
    fn write(&mut self, id: u64, pos: usize, data: &[u8]) {
        let f = self
            .files
            .get_mut(&id)
            .expect("write to an allocated segment");
        f.cur[pos..pos + data.len()].copy_from_slice(data);
        f.unsynced.push((pos, data.len()));
    }
    fn sync(&mut self, id: u64) {
        let f = self
            .files
            .get_mut(&id)
            .expect("sync of an allocated segment");
        for (p, l) in std::mem::take(&mut f.unsynced) {
            let (cur, durable) = (&f.cur, &mut f.durable);
            durable[p..p + l].copy_from_slice(&cur[p..p + l]);
        }
    }
    fn read(&self, id: u64, pos: usize, len: usize) -> Vec<u8> {
        self.files[&id].cur[pos..pos + len].to_vec()
    }
    /// Power loss: every unsynced write is lost, kept, torn to a prefix, or torn to a random
    /// subset of its 512-byte sectors. Returns how many writes were torn.
    fn crash(&mut self, rng: &mut SimRng) -> u32 {
        let mut torn = 0;
        for f in self.files.values_mut() {
            for (p, l) in std::mem::take(&mut f.unsynced) {
                match rng.below(4) {
                    0 => {}
                    1 => f.durable[p..p + l].copy_from_slice(&f.cur[p..p + l]),
                    2 => {
                        let cut = rng.below(l as u64 + 1) as usize;
                        f.durable[p..p + cut].copy_from_slice(&f.cur[p..p + cut]);
                        torn += 1;
                    }
                    _ => {
                        for s in (0..l).step_by(512) {
                            if rng.one_in(2) {
                                let e = (s + 512).min(l);
                                f.durable[p + s..p + e].copy_from_slice(&f.cur[p + s..p + e]);
                            }
                        }
                        torn += 1;
                    }
                }
            }
            f.cur.clone_from(&f.durable);
        }
        torn
    }
    /// Renames a pooled file into place as segment `id` (durable at once: the driver syncs the
    /// directory before writing into it).
    fn reuse(&mut self, id: u64, img: Vec<u8>) {
        let f = SimFile {
            cur: img.clone(),
            durable: img,
            unsynced: Vec::new(),
        };
        assert!(self.files.insert(id, f).is_none(), "segment {id} exists");
    }
    fn zero(&mut self, id: u64, from: usize, to: usize) {
        let f = self.files.get_mut(&id).expect("zero an existing segment");
        f.cur[from..to].fill(0);
        f.durable[from..to].fill(0);
    }
    fn flip(&mut self, id: u64, byte: usize, bit: u8) {
        let f = self
            .files
            .get_mut(&id)
            .expect("flip in an existing segment");
        f.cur[byte] ^= 1 << bit;
        f.durable[byte] ^= 1 << bit;
    }
    fn scan(&self) -> Recovered {
        let mut s = Scanner::new();
        for (&id, f) in &self.files {
            s.feed(id, &f.durable);
        }
        s.finish()
    }
}

/// Sizes and fault rates of a run (rates are "1 in n").
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub core: CoreConfig,
    pub crash_one_in: u64,
    pub enospc_alloc_one_in: u64,
    pub eio_write_one_in: u64,
    pub eio_fsync_one_in: u64,
    pub bad_readback_one_in: u64,
    pub bit_flip_one_in: u64,
    pub checkpoint_one_in: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            core: CoreConfig {
                segment_bytes: 48 << 10,
                batch_bytes_max: 12 << 10,
                append_bytes_max: 12 << 10,
                batch_records_max: 24,
                queue_bytes_max: 24 << 10,
                batches_in_flight_max: 2,
            },
            crash_one_in: 25,
            enospc_alloc_one_in: 6,
            eio_write_one_in: 150,
            eio_fsync_one_in: 150,
            bad_readback_one_in: 300,
            bit_flip_one_in: 60,
            checkpoint_one_in: 20,
        }
    }
}

/// What a run did (so a test can assert the faults were really exercised).
#[derive(Clone, Debug, Default)]
pub struct SimSummary {
    pub steps: u32,
    pub appends_acked: u64,
    pub records_acked: u64,
    pub batches: u64,
    /// Acknowledged batches that were started while others were in flight.
    pub pipelined_batches: u64,
    pub crashes: u64,
    pub torn_writes: u64,
    pub torn_truncations: u64,
    pub disk_full: u64,
    pub poisoned: u64,
    pub bit_flips: u64,
    pub corruption_reported: u64,
    pub checkpoints: u64,
    pub segments_released: u64,
    /// New segments that were released segment files, their old batches still in them.
    pub segments_recycled: u64,
    pub invariant_checks: u64,
}

struct Acked {
    ids: Vec<u64>,
    seq: u64,
    end: WalPosition,
}

/// A batch started and not yet resolved.
struct Flying {
    plan: BatchPlan,
    img: Vec<u8>,
    /// Its own fdatasync succeeded.
    synced: bool,
    /// Decided early (nothing written, or a write/fsync error); else decided by the read-back.
    outcome: Option<Outcome>,
}

struct Sim {
    cfg: SimConfig,
    flying: VecDeque<Flying>,
    rng: SimRng,
    /// Separate stream for the what-if crashes, so checking does not change the run.
    check_rng: SimRng,
    disk: SimDisk,
    core: Core,
    /// Every record ever submitted, by id (= index).
    submitted: Vec<WalRecord>,
    /// Appends submitted to the core and not yet resolved, in ticket order, with their record
    /// ids and the checkpoint they carry.
    waiting: Vec<(Ticket, Vec<u64>, Option<WalPosition>)>,
    acked: Vec<Acked>,
    /// Acknowledged batches: seq -> (start, span, earlier batches in flight at its start).
    batches: BTreeMap<u64, (WalPosition, usize, u8)>,
    damaged: BTreeSet<u64>,
    checkpoints: BTreeSet<WalPosition>,
    /// Newest acknowledged checkpoint and the batch holding it.
    acked_checkpoint: Option<(WalPosition, u64)>,
    summary: SimSummary,
}

fn record_id(r: &WalRecord) -> Option<u64> {
    let first8 = |p: &[u8]| {
        p.get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    match r {
        WalRecord::Message { payload, .. } | WalRecord::Transit { payload, .. } => first8(payload),
        WalRecord::Settle { offsets, .. } => offsets.first().map(|o| o.0),
        WalRecord::Checkpoint { .. } | WalRecord::Handed { .. } => None,
    }
}

impl Sim {
    fn new(seed: u64, cfg: SimConfig) -> Sim {
        let mut disk = SimDisk::default();
        disk.allocate(0, cfg.core.segment_bytes as usize);
        let core = Core::new(cfg.core.clone(), 1, WalPosition::default());
        Sim {
            rng: SimRng::new(seed),
            check_rng: SimRng::new(seed ^ 0xC0FF_EE00_D15C_0000),
            cfg,
            flying: VecDeque::new(),
            disk,
            core,
            submitted: Vec::new(),
            waiting: Vec::new(),
            acked: Vec::new(),
            batches: BTreeMap::new(),
            damaged: BTreeSet::new(),
            checkpoints: BTreeSet::new(),
            acked_checkpoint: None,
            summary: SimSummary::default(),
        }
    }

    fn new_record(&mut self) -> WalRecord {
        let id = self.submitted.len() as u64;
        let key = PartitionKey {
            topic: TopicId(self.rng.below(3)),
            partition: PartitionId(self.rng.below(4) as u32),
        };
        let r = match self.rng.below(5) {
            0 => WalRecord::Settle {
                key,
                offsets: (0..1 + self.rng.below(6)).map(|i| Offset(id + i)).collect(),
            },
            1 => WalRecord::Transit {
                dest: Some(Destination::Node(MemberId(id % 3))),
                key,
                seq: id,
                commit_ms: UnixMillis(id),
                msg_key: None,
                payload: self.payload(id).into(),
            },
            _ => WalRecord::Message {
                key,
                offset: Offset(id),
                commit_ms: UnixMillis(id * 3),
                msg_key: self.rng.one_in(2).then(|| id.to_be_bytes().to_vec()),
                payload: self.payload(id).into(),
            },
        };
        self.submitted.push(r.clone());
        r
    }

    fn payload(&mut self, id: u64) -> Vec<u8> {
        let n = 8 + if self.rng.one_in(10) {
            self.rng.below(3000)
        } else {
            self.rng.below(300)
        } as usize;
        let mut p = id.to_le_bytes().to_vec();
        p.extend((8..n).map(|_| self.rng.next_u64() as u8));
        p
    }

    fn submit_some(&mut self) {
        for _ in 0..1 + self.rng.below(3) {
            if self.core.poisoned().is_some() {
                return;
            }
            let mut checkpoint = None;
            let recs: Vec<WalRecord> = if self.rng.one_in(self.cfg.checkpoint_one_in) {
                // Checkpoint the end of the last acknowledged batch.
                let Some(upto) = self.acked.last().map(|a| a.end) else {
                    continue;
                };
                self.checkpoints.insert(upto);
                checkpoint = Some(upto);
                vec![WalRecord::Checkpoint {
                    upto,
                    marks: Vec::new(),
                }]
            } else {
                (0..1 + self.rng.below(4))
                    .map(|_| self.new_record())
                    .collect()
            };
            let ids: Vec<u64> = recs.iter().filter_map(record_id).collect();
            let mut frames = Vec::new();
            for r in &recs {
                codec::encode_record(r, &mut frames).expect("small records encode");
            }
            if !self.core.has_room(frames.len()) {
                // Backpressure: this appender waits; in the simulation it gives up its turn.
                return;
            }
            match self.core.submit(frames, recs.len() as u32) {
                Ok(t) => self.waiting.push((t, ids, checkpoint)),
                Err(WalError::TooLarge) => {}
                Err(e) => panic!("submit refused unexpectedly: {e}"),
            }
        }
    }

    /// Starts and writes every batch the core allows, runs some fdatasyncs, resolves the oldest
    /// batches that are decided. Returns Err(()) when a crash happened inside.
    fn pipeline_step(&mut self) -> Result<(), ()> {
        while self.start_one()? {}
        for i in 0..self.flying.len() {
            let f = &self.flying[i];
            if f.outcome.is_some() || f.synced {
                continue;
            }
            // The oldest usually syncs now (progress); the others at random later steps.
            let now = if i == 0 {
                !self.rng.one_in(4)
            } else {
                self.rng.one_in(2)
            };
            if now {
                self.sync_one(i)?;
            }
        }
        while let Some(f) = self.flying.front() {
            if f.outcome.is_none() && !f.synced {
                break;
            }
            let f = self.flying.pop_front().expect("front exists");
            self.resolve(f);
        }
        Ok(())
    }

    /// Starts one batch and carries out its segment allocation and write. Ok(false) when the
    /// core starts nothing.
    fn start_one(&mut self) -> Result<bool, ()> {
        let Some((plan, img)) = self.core.start_batch(|n| vec![0u8; n]) else {
            return Ok(false);
        };
        let seg = plan.at.segment;
        let mut f = Flying {
            plan,
            img,
            synced: false,
            outcome: None,
        };
        if f.plan.new_segment {
            if self.rng.one_in(self.cfg.enospc_alloc_one_in) {
                f.outcome = Some(Outcome::DiskFull);
                self.flying.push_back(f);
                return Ok(true);
            }
            if !self.disk.pool.is_empty()
                && !self.disk.files.contains_key(&seg)
                && !self.rng.one_in(4)
            {
                let i = self.rng.below(self.disk.pool.len() as u64) as usize;
                let img = self.disk.pool.swap_remove(i);
                self.disk.reuse(seg, img);
                self.summary.segments_recycled += 1;
            }
            self.disk
                .allocate(seg, self.cfg.core.segment_bytes as usize);
        }
        let pos = f.plan.at.byte as usize;
        if self.rng.one_in(self.cfg.eio_write_one_in) {
            // EIO: some prefix may have reached the cache anyway.
            let cut = self.rng.below(f.img.len() as u64) as usize;
            self.disk.write(seg, pos, &f.img[..cut]);
            f.outcome = Some(Outcome::Failed("write: EIO (simulated)".into()));
            self.flying.push_back(f);
            return Ok(true);
        }
        self.disk.write(seg, pos, &f.img);
        if self.rng.one_in(self.cfg.crash_one_in * 2) {
            self.crash_and_recover();
            return Err(());
        }
        self.core.written(f.plan.seq);
        self.flying.push_back(f);
        Ok(true)
    }

    /// The fdatasync of the batch `i` in flight.
    fn sync_one(&mut self, i: usize) -> Result<(), ()> {
        if self.rng.one_in(self.cfg.eio_fsync_one_in) {
            // The write stays unsynced: at the next crash it may be lost, kept or torn.
            let e = if self.rng.one_in(2) { "EIO" } else { "ENOSPC" };
            self.flying[i].outcome = Some(Outcome::Failed(format!("fdatasync: {e} (simulated)")));
            return Ok(());
        }
        self.disk.sync(self.flying[i].plan.at.segment);
        self.flying[i].synced = true;
        if self.rng.one_in(self.cfg.crash_one_in * 2) {
            // Durable but never acknowledged: recovery may return it, which is allowed.
            self.crash_and_recover();
            return Err(());
        }
        Ok(())
    }

    /// Resolves the oldest batch: read-back verification if it was synced, then `finish`.
    fn resolve(&mut self, f: Flying) {
        let Flying {
            plan,
            img: _,
            synced,
            outcome,
        } = f;
        let outcome = match outcome {
            Some(o) => o,
            None => {
                debug_assert!(synced);
                let mut back = self
                    .disk
                    .read(plan.at.segment, plan.at.byte as usize, plan.span);
                if self.rng.one_in(self.cfg.bad_readback_one_in) {
                    let i = self.rng.below(back.len() as u64) as usize;
                    back[i] ^= 0x10;
                }
                match codec::verify_batch(&back, plan.at.segment, plan.seq) {
                    Ok(_) => Outcome::Durable,
                    Err(e) => Outcome::Failed(format!("read-back does not verify: {e}")),
                }
            }
        };
        let poisoned_before = self.core.poisoned().is_some();
        if outcome == Outcome::Durable && !poisoned_before {
            self.batches
                .insert(plan.seq, (plan.at, plan.span, plan.in_flight_before));
            self.summary.batches += 1;
            if plan.in_flight_before > 0 {
                self.summary.pipelined_batches += 1;
            }
        }
        match &outcome {
            Outcome::DiskFull => self.summary.disk_full += 1,
            Outcome::Failed(_) if !poisoned_before => self.summary.poisoned += 1,
            _ => {}
        }
        let results = self.core.finish(outcome);
        for (ticket, r) in results {
            let (t, ids, checkpoint) = self.waiting.remove(0);
            assert_eq!(t, ticket, "tickets resolve in order");
            if let Ok(end) = r {
                assert_eq!(end, plan.end);
                if let Some(c) = checkpoint {
                    if self.acked_checkpoint.is_none_or(|(a, _)| c > a) {
                        self.acked_checkpoint = Some((c, plan.seq));
                        self.summary.checkpoints += 1;
                    }
                }
                self.summary.appends_acked += 1;
                self.summary.records_acked += ids.len() as u64;
                // A checkpoint append has no ids; it is acknowledged when its batch is.
                self.acked.push(Acked {
                    ids,
                    seq: plan.seq,
                    end,
                });
            }
        }
    }

    /// Flips one bit inside an acknowledged batch that has a later, undamaged acknowledged batch
    /// (so that the damage is in the middle of the log, not a lookalike of a torn tail). Also not
    /// lookalikes of a lost in-flight batch: a batch k after which every batch k+i was started
    /// while k was still in flight (recovery cannot tell that from a power loss in flight; see
    /// `wal::recovery`).
    fn flip_a_bit(&mut self) {
        let oldest = self.disk.files.keys().next().copied().unwrap_or(0);
        let Some(&last) = self.batches.keys().next_back() else {
            return;
        };
        let candidates: Vec<u64> = self
            .batches
            .iter()
            .filter(|(s, (at, _, _))| **s < last && at.segment >= oldest)
            .filter(|(s, _)| {
                !self
                    .batches
                    .range(**s + 1..)
                    .all(|(t, b)| u64::from(b.2) >= t - **s)
            })
            .map(|(s, _)| *s)
            .collect();
        if candidates.is_empty() {
            return;
        }
        let seq = candidates[self.rng.below(candidates.len() as u64) as usize];
        let (at, span, _) = self.batches[&seq];
        let byte = at.byte as usize + self.rng.below(span as u64) as usize;
        self.disk.flip(at.segment, byte, self.rng.below(8) as u8);
        self.damaged.insert(seq);
        self.summary.bit_flips += 1;
    }

    fn release(&mut self) {
        let Some((cp, _)) = self.acked_checkpoint else {
            return;
        };
        let current = self.core.write_at().segment;
        let doomed: Vec<u64> = self
            .disk
            .files
            .keys()
            .copied()
            .filter(|&s| s < cp.segment && s < current)
            .collect();
        for s in doomed {
            let f = self.disk.files.remove(&s).expect("listed above");
            if self.disk.pool.len() < 3 && !self.rng.one_in(3) {
                self.disk.pool.push(f.durable);
            }
            self.summary.segments_released += 1;
        }
        self.batches
            .retain(|_, (at, _, _)| at.segment >= cp.segment.min(current));
        let batches = &self.batches;
        self.damaged.retain(|s| batches.contains_key(s));
        self.acked.retain(|a| a.end > cp);
    }

    fn check(&self, rec: &Recovered, context: &str) -> Result<(), String> {
        let fail = |m: String| Err(format!("{context}: {m}"));
        if rec.stats.records_replayed != rec.records.len() as u64 {
            return fail("replayed count differs from records returned".into());
        }
        let mut last_id = None;
        let mut present = HashSet::with_capacity(rec.records.len());
        for (pos, r) in &rec.records {
            let Some(id) = record_id(r) else {
                return fail(format!("record without id at {pos:?}: {r:?}"));
            };
            match self.submitted.get(id as usize) {
                Some(orig) if orig == r => {}
                _ => return fail(format!("garbage record at {pos:?}: id {id}")),
            }
            if last_id.is_some_and(|l| id <= l) {
                return fail(format!(
                    "record {id} at {pos:?} out of order after {last_id:?}"
                ));
            }
            last_id = Some(id);
            present.insert(id);
        }
        let cp = rec.stats.last_checkpoint;
        if let Some(c) = cp {
            if !self.checkpoints.contains(&c) {
                return fail(format!("checkpoint {c:?} was never submitted"));
            }
        }
        let acked_cp = self.acked_checkpoint.map(|(c, _)| c);
        if let Some((c, seq)) = self.acked_checkpoint {
            if cp < Some(c) && !self.damaged.contains(&seq) {
                return fail(format!(
                    "acknowledged checkpoint {c:?} lost (recovered {cp:?})"
                ));
            }
        }
        // Records before the newest checkpoint (acknowledged or recovered) need not be replayed.
        let threshold = cp.max(acked_cp);
        let mut lost_to_damage = 0u64;
        for a in &self.acked {
            if threshold.is_some_and(|c| a.end <= c) {
                continue;
            }
            for id in &a.ids {
                if !present.contains(id) {
                    if self.damaged.contains(&a.seq) {
                        lost_to_damage += 1;
                    } else {
                        return fail(format!(
                            "acknowledged record {id} (batch {}, end {:?}) lost",
                            a.seq, a.end
                        ));
                    }
                }
            }
        }
        let reported = rec.stats.corrupt_batches + rec.stats.lost_batches;
        if lost_to_damage > 0 && reported == 0 {
            return fail(format!(
                "{lost_to_damage} acknowledged records lost to a bit flip without a report"
            ));
        }
        if self.damaged.is_empty() && reported > 0 {
            return fail(format!(
                "corruption reported without any bit flip: {:?}",
                rec.stats
            ));
        }
        Ok(())
    }

    fn crash_and_recover(&mut self) {
        self.summary.crashes += 1;
        self.summary.torn_writes += u64::from(self.disk.crash(&mut self.rng));
        let rec = self.disk.scan();
        if let Err(e) = self.check(&rec, "after crash") {
            panic!("{e}");
        }
        self.apply_recovery(rec);
    }

    fn apply_recovery(&mut self, rec: Recovered) {
        if rec.stats.corrupt_batches + rec.stats.lost_batches > 0 {
            self.summary.corruption_reported += 1;
        }
        if let Some((at, end)) = rec.truncate {
            self.summary.torn_truncations += 1;
            self.disk.zero(at.segment, at.byte as usize, end as usize);
        }
        for s in &rec.remove_segments {
            self.disk.files.remove(s);
        }
        let write_at = rec.write_at.unwrap_or_default();
        self.disk
            .allocate(write_at.segment, self.cfg.core.segment_bytes as usize);
        let stats = std::mem::take(&mut self.core.stats);
        self.core = Core::new(self.cfg.core.clone(), rec.next_seq, write_at);
        self.core.stats = stats;
        // The process died: appends in flight or queued never learn their fate.
        self.waiting.clear();
        self.flying.clear();
    }

    fn step(&mut self) -> Result<(), String> {
        self.summary.steps += 1;
        if self.core.poisoned().is_some() || self.rng.one_in(self.cfg.crash_one_in) {
            self.crash_and_recover();
        }
        self.submit_some();
        if self.pipeline_step().is_err() {
            return Ok(());
        }
        if self.rng.one_in(self.cfg.bit_flip_one_in) {
            self.flip_a_bit();
        }
        if self.rng.one_in(10) {
            self.release();
        }
        // What if the power failed right now?
        let mut copy = self.disk.clone();
        copy.crash(&mut self.check_rng);
        let rec = copy.scan();
        self.summary.invariant_checks += 1;
        self.check(&rec, "what-if crash")
    }
}

/// Runs `steps` steps of the simulation from `seed`. Err carries the failure (the caller prints
/// the seed).
pub fn run(seed: u64, steps: u32, cfg: SimConfig) -> Result<SimSummary, String> {
    let mut sim = Sim::new(seed, cfg);
    for i in 0..steps {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sim.step()));
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(format!("step {i}: {e}")),
            Err(p) => {
                let m = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
                return Err(format!("step {i}: panic: {}", m.unwrap_or_default()));
            }
        }
    }
    Ok(sim.summary)
}
