//! The partitions one shard owns: their log (through `narad_io::log::ShardLog`), their lease tables
//! and the wake-ups of long-polling consumers.
//!
//! A `Host` lives on exactly one shard and is never touched from another thread: other shards reach
//! it with messages (routing lives in the binary). It never names glommio and never parses HTTP.
//!
//! Ordering that makes consumption safe: a lease is recorded in the table *before* the record is
//! read, so two consumers never hold the same live offset; only offsets below the high watermark
//! (durable and verified, see `narad_io::log`) are ever leased; an ack updates the table and is
//! answered once its settle record is queued for the shard's next group commit, so a crash
//! redelivers at most the acks of the batch being written (DESIGN.md §2.5). The log never drops
//! a queued settle: one a full disk refused is written again once space frees
//! (`ShardLog::settle_backlog`), and while any waits, new acks are refused (`DiskFull`, nothing
//! settled) rather than answered on a queue that cannot reach the disk.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::OnceLock;
use std::time::Instant;

use narad_io::log::{AppendRecord, LogError, ReadError, RecoveredPartition, ShardLog};
use narad_io::partition::{PartitionStats, StoredRecord};
use narad_io::rt::Notify;
use narad_io::types::{FastMap, Nonce, Offset, PartitionId, PartitionKey, SplitMix64, TopicId};

use crate::lease::LeaseTable;

/// Bytes one batch take reads at most (keys + payloads); the record crossing it is kept.
pub const TAKE_BYTES_MAX: usize = 4 << 20;

/// Times one take goes back to a partition after skipping unreadable (or retention-deleted)
/// records in it, so that a consume is answered with the records after them rather than empty.
pub const TAKE_SKIP_ROUNDS_MAX: usize = 8;

/// Milliseconds on a monotonic clock shared by every shard of the process.
pub fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// Called with a topic whose long-polls should re-check (see [`Host::set_wake_hook`]).
pub type WakeHook = Box<dyn Fn(TopicId)>;

/// The per-topic settings a partition's queue needs; copied from the metadata on each request so
/// PATCHed caps apply at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct QueueConf {
    pub topic: TopicId,
    pub visibility_ms: u64,
    pub max_in_flight: u64,
    pub max_acked_ahead: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum SettleKind {
    Ack,
    Extend,
    Nack,
}

#[derive(Debug)]
pub enum SettleError {
    /// No live lease with this offset and nonce (expired, settled, superseded, wrong topic).
    Gone,
    /// The settle record could not be made durable.
    Log(LogError),
    /// Settles already wait for a full disk to free space: this ack was refused with nothing
    /// settled (the lease is still held; a retry may succeed, or the lease lapses).
    DiskFull,
}

/// A record handed out under a lease.
#[derive(Debug)]
pub struct Leased {
    pub partition: PartitionId,
    pub nonce: Nonce,
    pub record: StoredRecord,
}

pub struct Host {
    log: ShardLog,
    queues: RefCell<FastMap<PartitionKey, LeaseTable>>,
    /// Settled state found at recovery, consumed when a partition's queue is first touched.
    recovered: RefCell<HashMap<PartitionKey, (Offset, Vec<Offset>)>>,
    wakers: RefCell<HashMap<TopicId, Rc<Notify>>>,
    /// Called on every wake-up after local waiters were notified (the node forwards it to other
    /// shards with parked long-polls on the topic).
    wake_hook: RefCell<Option<WakeHook>>,
    seed: std::cell::Cell<u64>,
    /// Leases that lapsed (visibility timeout passed), per topic, since this host started: the
    /// `/metrics` redelivery counter. One entry per topic with a queue here; dropped with it.
    expired: RefCell<HashMap<TopicId, u64>>,
    /// Per partition queue here, since this host started: unreadable records skipped by queue
    /// consumes, and unsettled offsets lost to retention before any consumer settled them
    /// (`narad_consumer_corrupt_skipped_total`, `narad_consumer_dropped_messages`).
    consumer_losses: RefCell<HashMap<PartitionKey, ConsumerLosses>>,
    /// Appends taken and not yet answered, per partition, when tracked ([`Host::track_appends`],
    /// a cluster: a partition move's final copy waits until its partition has none).
    appending: RefCell<Option<FastMap<PartitionKey, u32>>>,
}

/// Counts an append of some partitions as on its way until dropped.
struct Appending<'a> {
    host: &'a Host,
    keys: Vec<PartitionKey>,
}

impl Drop for Appending<'_> {
    fn drop(&mut self) {
        if let Some(m) = self.host.appending.borrow_mut().as_mut() {
            for k in &self.keys {
                if let Some(n) = m.get_mut(k) {
                    *n -= 1;
                    if *n == 0 {
                        m.remove(k);
                    }
                }
            }
        }
    }
}

/// What queue consumers of one partition never got, since this host started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConsumerLosses {
    pub corrupt_skipped: u64,
    pub dropped: u64,
}

impl Host {
    pub fn new(log: ShardLog, recovered: Vec<RecoveredPartition>, seed: u64) -> Rc<Host> {
        let rec = recovered
            .into_iter()
            .map(|r| (r.key, (r.settled.frontier, r.settled.ahead)))
            .collect();
        let host = Rc::new(Host {
            log,
            queues: RefCell::new(FastMap::default()),
            recovered: RefCell::new(rec),
            wakers: RefCell::new(HashMap::new()),
            wake_hook: RefCell::new(None),
            seed: std::cell::Cell::new(seed | 1),
            expired: RefCell::new(HashMap::new()),
            consumer_losses: RefCell::new(HashMap::new()),
            appending: RefCell::new(None),
        });
        let weak = Rc::downgrade(&host);
        host.log.on_commit(Box::new(move |keys: &[PartitionKey]| {
            if let Some(h) = weak.upgrade() {
                let mut last = None;
                for k in keys {
                    if last != Some(k.topic) {
                        h.wake(k.topic);
                        last = Some(k.topic);
                    }
                }
            }
        }));
        host
    }

    pub fn log(&self) -> &ShardLog {
        &self.log
    }

    /// The notifier long-polls of `topic` on this shard park on.
    pub fn notifier(&self, topic: TopicId) -> Rc<Notify> {
        self.wakers
            .borrow_mut()
            .entry(topic)
            .or_insert_with(|| Rc::new(Notify::new()))
            .clone()
    }

    pub fn set_wake_hook(&self, f: WakeHook) {
        *self.wake_hook.borrow_mut() = Some(f);
    }

    /// Wakes the long-polls of `topic` parked on this shard only.
    pub fn wake_local(&self, topic: TopicId) {
        let n = self.wakers.borrow().get(&topic).cloned();
        if let Some(n) = n {
            n.notify_waiters();
        }
    }

    /// Wakes long-polls of `topic` here, and through the hook those on other shards.
    pub fn wake(&self, topic: TopicId) {
        self.wake_local(topic);
        if let Some(hook) = self.wake_hook.borrow().as_ref() {
            hook(topic);
        }
    }

    /// Expires `q`'s lapsed leases as of `now` and counts them under `topic`.
    fn expire_counted(&self, topic: TopicId, q: &mut LeaseTable, now: u64) -> usize {
        let n = q.expire(now);
        if n > 0 {
            *self.expired.borrow_mut().entry(topic).or_default() += n as u64;
        }
        n
    }

    fn count_loss(&self, key: PartitionKey, corrupt_skipped: u64, dropped: u64) {
        if corrupt_skipped == 0 && dropped == 0 {
            return;
        }
        let mut m = self.consumer_losses.borrow_mut();
        let e = m.entry(key).or_default();
        e.corrupt_skipped += corrupt_skipped;
        e.dropped += dropped;
    }

    /// What queue consumers of `key` never got since this host started (zeros if nothing).
    pub fn consumer_losses(&self, key: PartitionKey) -> ConsumerLosses {
        self.consumer_losses
            .borrow()
            .get(&key)
            .copied()
            .unwrap_or_default()
    }

    /// Leases that lapsed here since start, per topic (each one's message is redelivered).
    pub fn leases_expired(&self) -> Vec<(TopicId, u64)> {
        self.expired
            .borrow()
            .iter()
            .map(|(t, n)| (*t, *n))
            .collect()
    }

    fn next_seed(&self) -> u64 {
        // Distinct seeds per partition queue.
        let mut rng = SplitMix64(self.seed.get());
        let seed = rng.next_u64();
        self.seed.set(rng.0);
        seed
    }

    fn with_queue<R>(&self, key: PartitionKey, f: impl FnOnce(&mut LeaseTable) -> R) -> R {
        let mut queues = self.queues.borrow_mut();
        let q = queues.entry(key).or_insert_with(|| {
            let (frontier, ahead) = self
                .recovered
                .borrow_mut()
                .remove(&key)
                .unwrap_or((Offset(0), Vec::new()));
            let oldest = self.log.oldest_offset(key);
            let mut t = LeaseTable::new(frontier, ahead, self.next_seed());
            if oldest > t.frontier() {
                t.jump_to(oldest);
            }
            t
        });
        f(q)
    }

    pub async fn append(&self, records: Vec<AppendRecord>) -> Result<Vec<Offset>, LogError> {
        // Counted from the call on (before any await), so that whoever checked ownership just
        // before calling sees this append in [`Host::quiet`] until it is answered.
        let tracking = self.appending.borrow().is_some();
        let _on_its_way = tracking.then(|| {
            // The partitions of one append are few: a short list, not one entry per record.
            let mut keys: Vec<PartitionKey> = Vec::new();
            for r in &records {
                if !keys.contains(&r.key) {
                    keys.push(r.key);
                }
            }
            if let Some(m) = self.appending.borrow_mut().as_mut() {
                for k in &keys {
                    *m.entry(*k).or_default() += 1;
                }
            }
            Appending { host: self, keys }
        });
        self.log.append(records).await
    }

    /// Counts appends per partition from now on (a cluster node: see [`Host::quiet`]).
    pub fn track_appends(&self) {
        self.appending
            .borrow_mut()
            .get_or_insert_with(FastMap::default);
    }

    /// No append of `key` is on its way here: taken by [`Host::append`] and unanswered, queued
    /// or being written. Its high watermark stays put until another append is taken.
    pub fn quiet(&self, key: PartitionKey) -> bool {
        !self
            .appending
            .borrow()
            .as_ref()
            .is_some_and(|m| m.contains_key(&key))
            && self.log.quiet(key)
    }

    /// Leases up to `n` records from the given partitions (all owned here), trying them in the
    /// order given, and reads them. Lease first, read second.
    pub async fn take(
        &self,
        conf: QueueConf,
        partitions: &[PartitionId],
        n: usize,
    ) -> Result<Vec<Leased>, LogError> {
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for &p in partitions {
            // A record found unreadable or lost to retention is skipped, and the partition is
            // tried again for the records after it, up to TAKE_SKIP_ROUNDS_MAX times.
            for _ in 0..TAKE_SKIP_ROUNDS_MAX {
                if out.len() >= n || bytes >= TAKE_BYTES_MAX {
                    break;
                }
                let skipped = self
                    .take_round(conf, p, n - out.len(), &mut out, &mut bytes)
                    .await?;
                if !skipped {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// One pass of [`Host::take`] over partition `p`: leases up to `want` records, reads them
    /// into `out` (counting their bytes) and skips the unreadable or retention-deleted ones.
    /// Answers whether it skipped any (the records after them may be takeable now).
    async fn take_round(
        &self,
        conf: QueueConf,
        p: PartitionId,
        want: usize,
        out: &mut Vec<Leased>,
        bytes: &mut usize,
    ) -> Result<bool, LogError> {
        let mut skipped_any = false;
        let key = PartitionKey {
            topic: conf.topic,
            partition: p,
        };
        let hwm = self.log.high_watermark(key);
        let now = now_ms();
        let leased = self.with_queue(key, |q| {
            self.expire_counted(key.topic, q, now);
            q.take(
                hwm,
                now,
                conf.visibility_ms,
                conf.max_in_flight as usize,
                conf.max_acked_ahead as usize,
                want,
            )
        });
        // Records of a run of consecutive leased offsets, read with one call.
        let mut ahead: VecDeque<StoredRecord> = VecDeque::new();
        for (i, &(offset, nonce)) in leased.iter().enumerate() {
            if *bytes >= TAKE_BYTES_MAX {
                // Over the scan budget: give the rest back at once.
                self.with_queue(key, |q| {
                    for &(o, nn) in &leased[i..] {
                        q.release(o, nn);
                    }
                });
                break;
            }
            if ahead.front().is_none_or(|r| r.offset != offset) {
                ahead.clear();
                let run = 1 + leased[i..]
                    .windows(2)
                    .take_while(|w| w[1].0 .0 == w[0].0 .0 + 1)
                    .count();
                if run > 1 {
                    // A failed range read falls back to one read per offset below, which
                    // tells a damaged record from the others.
                    if let Ok(recs) = self.log.read(key, offset, run, TAKE_BYTES_MAX).await {
                        ahead.extend(recs);
                    }
                }
            }
            // The record at `offset`: from the run read above, else read alone (`None`: the
            // log answered without it).
            let got = match ahead.front() {
                Some(r) if r.offset == offset => Ok(ahead.pop_front()),
                _ => self
                    .log
                    .read(key, offset, 1, usize::MAX)
                    .await
                    .map(|recs| recs.into_iter().next().filter(|r| r.offset == offset)),
            };
            match got {
                Ok(Some(record)) => {
                    *bytes +=
                        record.payload.len() + record.msg_key.as_deref().map_or(0, <[u8]>::len);
                    out.push(Leased {
                        partition: p,
                        nonce,
                        record,
                    });
                }
                Ok(None) | Err(ReadError::Corrupt { .. }) => {
                    tracing::error!(topic = %conf.topic, partition = p.0, offset = offset.0,
                        "unreadable record skipped by queue consume");
                    let skipped = self.with_queue(key, |q| {
                        q.release(offset, nonce);
                        q.skip_unreadable(offset)
                    });
                    if skipped {
                        self.count_loss(key, 1, 0);
                    }
                    skipped_any = true;
                }
                Err(ReadError::BelowRetention { oldest }) => {
                    let dropped = self.with_queue(key, |q| {
                        q.release(offset, nonce);
                        q.jump_to(oldest)
                    });
                    self.count_loss(key, 0, dropped);
                    skipped_any = true;
                }
                Err(e) => {
                    self.with_queue(key, |q| {
                        for &(o, nn) in &leased[i..] {
                            q.release(o, nn);
                        }
                    });
                    return Err(read_to_log_error(e));
                }
            }
        }
        Ok(skipped_any)
    }

    /// Gives back leases a caller could not deliver (its answer was cut short).
    pub fn release(&self, topic: TopicId, items: &[(PartitionId, Offset, Nonce)]) {
        for &(p, o, n) in items {
            self.with_queue(
                PartitionKey {
                    topic,
                    partition: p,
                },
                |q| q.release(o, n),
            );
        }
        self.wake(topic);
    }

    /// Acks, extends or nacks one lease each; an ack's settle record is queued for the next
    /// group commit before this returns, or the ack is refused (`DiskFull`) with nothing settled.
    pub async fn settle(
        &self,
        conf: QueueConf,
        kind: SettleKind,
        items: &[(PartitionId, Offset, Nonce)],
    ) -> Vec<Result<(), SettleError>> {
        // Settles that a full disk refused are still waiting: an ack answered now could only be
        // queued behind them, and a crash before space frees would undo it. Refused before the
        // lease table is touched, so the lease stays as it was.
        if kind == SettleKind::Ack && self.log.settle_backlog() > 0 {
            return items.iter().map(|_| Err(SettleError::DiskFull)).collect();
        }
        let now = now_ms();
        let mut results = Vec::with_capacity(items.len());
        let mut durable: FastMap<PartitionId, Vec<Offset>> = FastMap::default();
        let mut woke = false;
        for &(p, offset, nonce) in items {
            let key = PartitionKey {
                topic: conf.topic,
                partition: p,
            };
            let r = self.with_queue(key, |q| {
                self.expire_counted(key.topic, q, now);
                match kind {
                    SettleKind::Ack => q.ack(offset, nonce, now),
                    SettleKind::Extend => q.extend(offset, nonce, now, conf.visibility_ms),
                    SettleKind::Nack => q.nack(offset, nonce, now),
                }
            });
            match r {
                Ok(()) => {
                    if kind == SettleKind::Ack {
                        durable.entry(p).or_default().push(offset);
                    }
                    woke |= kind != SettleKind::Extend;
                    results.push(Ok(()));
                }
                Err(_) => results.push(Err(SettleError::Gone)),
            }
        }
        if woke {
            self.wake(conf.topic);
        }
        let parts: Vec<(PartitionKey, Vec<Offset>)> = durable
            .into_iter()
            .map(|(partition, offsets)| {
                let key = PartitionKey {
                    topic: conf.topic,
                    partition,
                };
                (key, offsets)
            })
            .collect();
        // One request for every partition: their settle records share one group commit. The
        // ack is answered once its records are queued, not once they are durable: the lease
        // state above already settled them in memory, a graceful stop writes the queue out,
        // a full disk delays them (the log writes them once space frees, never drops them),
        // and a crash redelivers at most the acks of the batch being written (DESIGN.md §2.5).
        if let Err(e) = self.log.settle_many(parts).await.map(drop) {
            let msg = e.to_string();
            for r in results.iter_mut().filter(|r| r.is_ok()) {
                *r = Err(SettleError::Log(LogError::Io(std::io::Error::other(
                    msg.clone(),
                ))));
            }
        }
        results
    }

    /// Reads the record at `offset` without a lease (replay). `Ok(None)` at or past the end.
    pub async fn read_at(
        &self,
        key: PartitionKey,
        offset: Offset,
    ) -> Result<Option<StoredRecord>, ReadError> {
        if offset >= self.log.high_watermark(key) {
            return Ok(None);
        }
        let mut recs = self.log.read(key, offset, 1, usize::MAX).await?;
        match recs.first() {
            Some(r) if r.offset == offset => Ok(Some(recs.swap_remove(0))),
            Some(_) | None => Err(ReadError::Corrupt { offset }),
        }
    }

    /// True when a take on one of these partitions could hand something out now.
    pub fn has_available(&self, conf: QueueConf, partitions: &[PartitionId]) -> bool {
        let now = now_ms();
        partitions.iter().any(|&p| {
            let key = PartitionKey {
                topic: conf.topic,
                partition: p,
            };
            let hwm = self.log.high_watermark(key);
            self.with_queue(key, |q| {
                // Expired here (not inside the table) so the lapse is counted.
                self.expire_counted(key.topic, q, now);
                q.has_available(
                    hwm,
                    now,
                    conf.max_in_flight as usize,
                    conf.max_acked_ahead as usize,
                )
            })
        })
    }

    pub fn stats(&self, key: PartitionKey) -> PartitionStats {
        self.log.stats(key)
    }

    /// Queue gauges of one partition: (in flight, acked ahead, committed frontier).
    pub fn queue_stats(&self, key: PartitionKey) -> (usize, usize, Offset) {
        self.with_queue(key, |q| (q.in_flight(), q.acked_ahead_len(), q.frontier()))
    }

    /// Drops expired leases everywhere and wakes the long-polls of topics that got work back.
    pub fn sweep(&self) {
        let now = now_ms();
        let mut topics = Vec::new();
        for (key, q) in self.queues.borrow_mut().iter_mut() {
            if self.expire_counted(key.topic, q, now) > 0 {
                topics.push(key.topic);
            }
        }
        topics.sort();
        topics.dedup();
        for t in topics {
            self.wake(t);
        }
    }

    /// Installs a moved partition's staged copy (CLUSTER.md §9.3 step 4): its queue starts
    /// afresh from the copied settled state (leases held on the source are not carried over:
    /// those records are delivered again). Answers the copy's high watermark.
    pub async fn adopt_partition(
        &self,
        key: PartitionKey,
        staged: std::path::PathBuf,
    ) -> Result<Offset, LogError> {
        let (next, settled) = self.log.adopt_partition(key, staged).await?;
        self.queues.borrow_mut().remove(&key);
        self.recovered
            .borrow_mut()
            .insert(key, (settled.frontier, settled.ahead));
        self.consumer_losses.borrow_mut().remove(&key);
        self.wake(key.topic);
        Ok(next)
    }

    /// Forgets a partition that another node owns now, and removes its data here.
    pub async fn drop_partition(&self, key: PartitionKey) -> Result<(), LogError> {
        self.queues.borrow_mut().remove(&key);
        self.recovered.borrow_mut().remove(&key);
        self.consumer_losses.borrow_mut().remove(&key);
        self.log.drop_partition(key).await
    }

    /// Forgets a deleted topic's queues and removes its data.
    pub async fn drop_topic(&self, topic: TopicId) -> Result<(), LogError> {
        self.queues.borrow_mut().retain(|k, _| k.topic != topic);
        self.recovered.borrow_mut().retain(|k, _| k.topic != topic);
        self.wakers.borrow_mut().remove(&topic);
        self.expired.borrow_mut().remove(&topic);
        self.consumer_losses
            .borrow_mut()
            .retain(|k, _| k.topic != topic);
        self.log.delete_topic(topic).await
    }

    /// Applies a topic's retention to its partitions here and moves consumers past deleted data.
    pub async fn enforce_retention(
        &self,
        topic: TopicId,
        retention_ms: u64,
    ) -> Result<u64, LogError> {
        self.enforce_retention_at(topic, retention_ms, narad_io::types::UnixMillis::now())
            .await
    }

    /// [`Host::enforce_retention`] as if the wall clock read `now` (a test knob moves it ahead so
    /// retention can be observed without waiting an hour). Returns the bytes deleted.
    pub async fn enforce_retention_at(
        &self,
        topic: TopicId,
        retention_ms: u64,
        now: narad_io::types::UnixMillis,
    ) -> Result<u64, LogError> {
        if retention_ms == 0 {
            return Ok(0);
        }
        let deleted = self.log.enforce_retention(topic, retention_ms, now).await?;
        if deleted > 0 {
            let keys: Vec<PartitionKey> = self
                .log
                .partitions()
                .into_iter()
                .filter(|k| k.topic == topic)
                .collect();
            for key in keys {
                let oldest = self.log.oldest_offset(key);
                let dropped = self.with_queue(key, |q| {
                    if oldest > q.frontier() {
                        let dropped = q.jump_to(oldest);
                        tracing::warn!(topic = %topic, partition = key.partition.0, dropped,
                            "consumer frontier fell behind retention; skipped to oldest retained offset");
                        dropped
                    } else {
                        0
                    }
                });
                self.count_loss(key, 0, dropped);
            }
        }
        Ok(deleted)
    }
}

fn read_to_log_error(e: ReadError) -> LogError {
    match e {
        ReadError::Io(io) => LogError::Io(io),
        other => LogError::Io(std::io::Error::other(format!("{other:?}"))),
    }
}
