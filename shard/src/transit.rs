//! Transit state: a single produce for a partition of another shard is accepted with one local
//! fsync.
//!
//! The accepting shard writes the record to its own WAL as a transit record (its group commit,
//! one fdatasync, read back and verified), answers `202`, and then hands the record to the owner
//! shard in batches over the mesh (DESIGN.md §2.3 within a node; CLUSTER.md §4.1-4.2). The owner
//! appends it like any produce: its own group commit, then the record is readable. Only when the
//! owner answered is the transit record released, so checkpoints keep it in the WAL until then
//! and a crash brings it back (recovery hands it over again: a duplicate when the owner already
//! had it, which SEMANTICS.md §1 allows: "a commit whose reply was lost").
//!
//! Owns, per shard: one queue per other shard, in accept order, the hand-off batches cut from
//! it, the read-your-writes marks, and the dispatch policy ([`Transit::dispatch`]: one task per
//! queue, at most one hand-off in flight, so records reach their owner in accept order; a failed
//! hand-off is retried after a backoff of 100 ms doubling to 1 s; records of a topic or
//! partition that no longer exists are dropped and released). The node carries the hand-offs
//! and knows the metadata ([`HandOff`]). The queued bytes are bounded
//! ([`TRANSIT_PENDING_BYTES_MAX`]): past it, produces take the direct path (a mesh call that
//! waits for the owner's commit), so memory and the held WAL stay bounded.
//!
//! Read-your-writes: every request but produces, acks and probes first waits until every record
//! this shard accepted before it has been handed over, so a client that got `202` on a
//! connection reads its message on that connection. A queue consume looks first and waits only
//! when it found fewer records than it asked for (then looks again for the rest): any available
//! record may answer it, and under steady single produces the wait is a hand-off and an owner
//! commit, which a consumer asking for one message at a time paid on every request. A replay
//! waits only before answering `204` (end of the log). Then, for the other shards (a client that
//! reads on a new connection, which the kernel may give to another shard), it waits until the
//! node has handed over as many records as it had accepted when the request began: two
//! node-wide counters (atomics, like the keyless rotation), looked at every
//! [`NODE_CATCH_UP_POLL`]. Exact when producers are quiet; under concurrent single produces a
//! later record handed over early can end the wait before an earlier one. Both waits end after
//! [`CATCH_UP_WAIT_MAX`].

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use narad_io::log::{AppendRecord, ShardLog, TransitHold};
use narad_io::rt::{self, Notify};
use narad_io::types::{Destination, MemberId, ShardId};

use crate::route::{OwnerError, StoreError};

/// Bytes of queued transit records per shard before produces take the direct path.
pub const TRANSIT_PENDING_BYTES_MAX: usize = 8 << 20;
/// Records per hand-off (one mesh call, one append on the owner).
pub const HANDOFF_RECORDS_MAX: usize = 1024;
/// Payload and key bytes per hand-off (well under the owner's WAL append limit).
pub const HANDOFF_BYTES_MAX: usize = 256 << 10;
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(1);
/// Longest an idle dispatcher sleeps before it looks whether its shard is stopping.
const IDLE_LOOK_MAX: Duration = Duration::from_secs(1);
/// Longest a read waits for earlier transit records to reach their owners.
const CATCH_UP_WAIT_MAX: Duration = Duration::from_secs(1);
/// How often a read looks at the node-wide counters while other shards hand over.
const NODE_CATCH_UP_POLL: Duration = Duration::from_micros(200);

/// Transit records accepted, and handed over (or dropped), by all shards of one node: created
/// once for the node and shared by every shard's [`Transit`] (two atomics, the node-wide
/// exception ARCHITECTURE.md names).
#[derive(Debug, Default)]
pub struct TransitProgress {
    accepted: AtomicU64,
    handed: AtomicU64,
}

impl TransitProgress {
    /// Records accepted by the node's shards and not yet handed over (its dispatch backlog).
    pub fn backlog(&self) -> u64 {
        let handed = self.handed.load(Ordering::Acquire);
        self.accepted.load(Ordering::Acquire).saturating_sub(handed)
    }
}

/// What a dispatcher needs from its node: carry a hand-off to its owner, and what the node
/// knows (which records vanished with their topic, whether the owner's log stopped, whether
/// the node stops). The policy stays in [`Transit::dispatch`].
pub trait HandOff {
    /// Appends `batch` (records of partitions `dest` owns) there; resolves once committed.
    fn hand_over(
        &self,
        dest: Destination,
        batch: Vec<AppendRecord>,
    ) -> impl Future<Output = Result<(), StoreError>>;
    /// Whether a record's topic or partition no longer exists, as the metadata says now.
    fn vanished(&self) -> impl Fn(&AppendRecord) -> bool + '_;
    /// Whether this node's metadata is confirmed current (a cluster's read barrier through the
    /// leader, CLUSTER.md §4.3): records whose topic vanished are discarded only then, never on
    /// the word of a replica that may be stale (a node cut off from the leader).
    fn confirm_metadata(&self) -> impl Future<Output = bool> {
        async { true }
    }
    /// The owner's log stopped for good: the node must take no more produces.
    fn owner_stopped(&self);
    fn stopping(&self) -> bool;
    /// Whether membership says `dest` is dead: its records reroute at the first failure.
    fn dead(&self, _dest: Destination) -> bool {
        false
    }
    /// `dest` keeps failing (`stuck`), or committed again: what other choices should avoid.
    fn note_stuck(&self, _dest: Destination, _stuck: bool) {}
    /// Hands `batch`, which `dest` could not take, to other partitions of the same topics
    /// instead (CLUSTER.md §4.3): `Ok(true)` once every record is durable on its way there,
    /// `Ok(false)` when there is nowhere else to go (keep retrying `dest`).
    fn reroute(
        &self,
        _dest: Destination,
        _batch: Vec<AppendRecord>,
    ) -> impl Future<Output = Result<bool, StoreError>> {
        async { Ok(false) }
    }
}

/// Consecutive failed hand-offs to another node before its records go to sibling partitions
/// (CLUSTER.md §4.3: "after 3 failed passes").
pub const REROUTE_AFTER_PASSES: u32 = 3;

/// The transit records a read must see: those this shard queued before sequence `upto`, and
/// as many as the node had accepted (see [`Transit::mark`]).
#[derive(Clone, Copy, Debug)]
pub struct CatchUpMark {
    upto: u64,
    node_accepted: u64,
}

struct Queued {
    seq: u64,
    hold: TransitHold,
    rec: AppendRecord,
}

fn weight(r: &AppendRecord) -> usize {
    r.payload.len() + r.msg_key.as_ref().map_or(0, Vec::len) + 64
}

/// One destination's queue and its wake-up.
#[derive(Default)]
struct Slot {
    queue: RefCell<VecDeque<Queued>>,
    work: Notify,
}

pub struct Transit {
    me: ShardId,
    shards: u32,
    /// The node's shards (indexed by shard; this shard's own stays empty), then the cluster's
    /// members in the order this shard first queued for them ([`Transit::slot`]).
    queues: RefCell<Vec<Rc<Slot>>>,
    /// The member of each queue after the shards'.
    members: RefCell<Vec<MemberId>>,
    /// Something was handed over (or dropped).
    progress: Notify,
    next_seq: Cell<u64>,
    pending_bytes: Cell<usize>,
    closing: Cell<bool>,
    /// The node's counts, shared with the other shards.
    node: Arc<TransitProgress>,
}

impl Transit {
    /// Transit state of shard `me` of `shards`; queues for other nodes are made as records for
    /// them arrive.
    pub fn new(me: ShardId, shards: u32, node: Arc<TransitProgress>) -> Transit {
        Transit {
            me,
            shards,
            node,
            queues: RefCell::new((0..shards).map(|_| Rc::new(Slot::default())).collect()),
            members: RefCell::new(Vec::new()),
            progress: Notify::new(),
            next_seq: Cell::new(0),
            pending_bytes: Cell::new(0),
            closing: Cell::new(false),
        }
    }

    /// The queue of `dest`, made at its first use for a member (`true`: new). A shard beyond
    /// the node's count (a bug) shares the last shard's queue rather than panicking.
    fn slot_new(&self, dest: Destination) -> (Rc<Slot>, bool) {
        match dest {
            Destination::Shard(s) => {
                let i = (s.0 as usize).min(self.shards as usize - 1);
                (self.queues.borrow()[i].clone(), false)
            }
            Destination::Node(m) => {
                let pos = self.members.borrow().iter().position(|x| *x == m);
                match pos {
                    Some(i) => (
                        self.queues.borrow()[self.shards as usize + i].clone(),
                        false,
                    ),
                    None => {
                        let s = Rc::new(Slot::default());
                        self.members.borrow_mut().push(m);
                        self.queues.borrow_mut().push(s.clone());
                        (s, true)
                    }
                }
            }
        }
    }

    fn slot(&self, dest: Destination) -> Rc<Slot> {
        self.slot_new(dest).0
    }

    /// The other nodes this shard has queues for.
    pub fn members(&self) -> Vec<MemberId> {
        self.members.borrow().clone()
    }

    fn node_handed(&self) -> u64 {
        self.node.handed.load(Ordering::Acquire)
    }

    /// Whether a new record may take the transit path (queue under its bound, not closing).
    pub fn has_room(&self) -> bool {
        !self.closing.get() && self.pending_bytes.get() < TRANSIT_PENDING_BYTES_MAX
    }

    /// Queues a durable transit record for its owner `dest`. True when `dest` is a node this
    /// shard never queued for before: its dispatcher must be started.
    pub fn push(&self, dest: Destination, hold: TransitHold, rec: AppendRecord) -> bool {
        let (slot, new) = self.slot_new(dest);
        let seq = self.next_seq.get();
        self.next_seq.set(seq + 1);
        self.pending_bytes
            .set(self.pending_bytes.get() + weight(&rec));
        slot.queue.borrow_mut().push_back(Queued { seq, hold, rec });
        self.node.accepted.fetch_add(1, Ordering::AcqRel);
        slot.work.notify_waiters();
        new
    }

    /// Records queued and not yet handed over.
    pub fn pending(&self) -> usize {
        self.queues
            .borrow()
            .iter()
            .map(|s| s.queue.borrow().len())
            .sum()
    }

    /// Whether every record queued before sequence `upto` has left its queue.
    fn handed_before(&self, upto: u64) -> bool {
        self.queues
            .borrow()
            .iter()
            .all(|s| s.queue.borrow().front().is_none_or(|e| e.seq >= upto))
    }

    /// Waits (at most [`CATCH_UP_WAIT_MAX`]) until every record this shard accepted so far has
    /// reached its owner.
    pub async fn caught_up(&self) {
        if let Some(m) = self.mark() {
            self.catch_up(m).await;
        }
    }

    /// What [`Transit::caught_up`] would wait for if called now, or `None` when every record
    /// this shard and the node accepted so far has already been handed over. A read that may
    /// answer without them (a queue consume that fills its `max`) takes the mark first and
    /// waits only when it comes up short.
    pub fn mark(&self) -> Option<CatchUpMark> {
        let m = CatchUpMark {
            upto: self.next_seq.get(),
            node_accepted: self.node.accepted.load(Ordering::Acquire),
        };
        let pending = !self.handed_before(m.upto) || self.node_handed() < m.node_accepted;
        pending.then_some(m)
    }

    /// Waits (at most [`CATCH_UP_WAIT_MAX`]) until the records accepted before `m` was taken
    /// have reached their owners.
    pub async fn catch_up(&self, m: CatchUpMark) {
        let deadline = Instant::now() + CATCH_UP_WAIT_MAX;
        if !self.handed_before(m.upto) {
            loop {
                let progressed = self.progress.notified();
                if self.handed_before(m.upto) {
                    break;
                }
                if rt::timeout_at(deadline, progressed).await.is_err() {
                    return;
                }
            }
        }
        // The other shards' hand-offs (see the module doc).
        while self.node_handed() < m.node_accepted && Instant::now() < deadline {
            rt::sleep(NODE_CATCH_UP_POLL).await;
        }
    }

    /// Graceful stop: no new transit records; waits until the queues are empty or `deadline`.
    /// Returns how many records are left (they stay in the WAL and are handed over after the
    /// restart).
    pub async fn drain(&self, deadline: Instant) -> usize {
        self.closing.set(true);
        loop {
            let progressed = self.progress.notified();
            let left = self.pending();
            if left == 0 {
                return 0;
            }
            if rt::timeout_at(deadline, progressed).await.is_err() {
                return self.pending();
            }
        }
    }

    /// The shard this transit state belongs to.
    pub fn me(&self) -> ShardId {
        self.me
    }

    /// Whether a graceful stop began ([`Transit::drain`]).
    pub fn closing(&self) -> bool {
        self.closing.get()
    }

    /// The next hand-off to `dest`: its oldest records, at most [`HANDOFF_RECORDS_MAX`] and
    /// [`HANDOFF_BYTES_MAX`] (one record however large). They stay queued until
    /// [`Transit::finish`].
    pub fn next_batch(&self, dest: Destination) -> Vec<AppendRecord> {
        let slot = self.slot(dest);
        let q = slot.queue.borrow();
        let mut bytes = 0;
        q.iter()
            .take(HANDOFF_RECORDS_MAX)
            .take_while(|e| {
                bytes += weight(&e.rec);
                bytes <= HANDOFF_BYTES_MAX || bytes == weight(&e.rec)
            })
            .map(|e| e.rec.clone())
            .collect()
    }

    /// The owner committed the first `n` records of `dest`'s queue: removes them and releases
    /// their WAL holds.
    pub async fn finish(&self, log: &ShardLog, dest: Destination, n: usize) {
        let done: Vec<Queued> = self.slot(dest).queue.borrow_mut().drain(..n).collect();
        self.forget(log, done).await;
    }

    /// Whether some record queued for `dest` is `gone`.
    fn holds_where(&self, dest: Destination, gone: impl Fn(&AppendRecord) -> bool) -> bool {
        self.slot(dest).queue.borrow().iter().any(|e| gone(&e.rec))
    }

    /// Drops (and releases) the records queued for `dest` that are `gone` (their topic or
    /// partition no longer exists); returns how many.
    pub async fn drop_where(
        &self,
        log: &ShardLog,
        dest: Destination,
        gone: impl Fn(&AppendRecord) -> bool,
    ) -> usize {
        let vanished: Vec<Queued> = {
            let slot = self.slot(dest);
            let mut q = slot.queue.borrow_mut();
            if !q.iter().any(|e| gone(&e.rec)) {
                return 0;
            }
            let (keep, gone): (VecDeque<Queued>, VecDeque<Queued>) =
                q.drain(..).partition(|e| !gone(&e.rec));
            *q = keep;
            gone.into_iter().collect()
        };
        let n = vanished.len();
        self.forget(log, vanished).await;
        n
    }

    /// Hands `dest`'s queue to `dest` through `node`, a batch at a time, until the node stops
    /// and the queue is closed. `delay` postpones every hand-off (a test knob).
    pub async fn dispatch<H: HandOff>(
        &self,
        node: &H,
        log: &ShardLog,
        dest: Destination,
        delay: Option<Duration>,
    ) {
        let mut backoff = RETRY_FIRST;
        let mut failed_passes = 0u32;
        let slot = self.slot(dest);
        loop {
            let ticket = slot.work.ticket();
            let batch = self.next_batch(dest);
            if batch.is_empty() {
                if node.stopping() && self.closing() {
                    return;
                }
                // Wake at least once a second to notice the end of the shard.
                let _ = rt::timeout(IDLE_LOOK_MAX, slot.work.notified_since(ticket)).await;
                continue;
            }
            let n = batch.len();
            if let Some(d) = delay {
                rt::sleep(d).await;
            }
            match node.hand_over(dest, batch).await {
                Ok(()) => {
                    backoff = RETRY_FIRST;
                    if failed_passes > 0 {
                        node.note_stuck(dest, false);
                        failed_passes = 0;
                    }
                    self.finish(log, dest, n).await;
                }
                Err(e) => {
                    failed_passes += 1;
                    // The owner says the partitions moved (CLUSTER.md §9.3): place them again
                    // at once, at their new owner; that node is not stuck.
                    let moved_away = matches!(e, StoreError::Owner(OwnerError::NotOwner));
                    if matches!(dest, Destination::Node(_)) {
                        node.note_stuck(dest, !moved_away);
                        if failed_passes >= REROUTE_AFTER_PASSES || node.dead(dest) || moved_away {
                            // The records stay queued until `finish`: take the head again
                            // (only this loop removes from it) rather than keeping a copy of
                            // every hand-off in case it fails.
                            let batch = self.next_batch(dest);
                            let moved = batch.len();
                            match node.reroute(dest, batch).await {
                                Ok(true) => {
                                    // A warning: records leave their key's partition (an
                                    // ordering seam), and a log at the default level shows why.
                                    tracing::warn!(shard = self.me.0, to = ?dest, records = moved, error = ?e, "owner node refused or keeps failing: records placed again (a moved partition's new owner, or sibling partitions)");
                                    self.finish(log, dest, moved).await;
                                    continue;
                                }
                                Ok(false) => {}
                                Err(re) => {
                                    tracing::warn!(shard = self.me.0, to = ?dest, error = ?re, "rerouting failed; retrying the owner")
                                }
                            }
                        }
                    }
                    if matches!(e, StoreError::Stopped(_)) {
                        // The owner's log stopped: the records stay here until a restart, and
                        // the node takes no more produces (SEMANTICS.md §3.4).
                        node.owner_stopped();
                    }
                    let dropped = if self.holds_where(dest, node.vanished())
                        && node.confirm_metadata().await
                    {
                        self.drop_where(log, dest, node.vanished()).await
                    } else {
                        0
                    };
                    if dropped > 0 {
                        // Accepted records discarded (their topic is gone, as the leader
                        // confirmed): always worth a line at the default level.
                        tracing::warn!(
                            shard = self.me.0,
                            to = ?dest,
                            records = dropped,
                            "accepted records dropped before their hand-off: their topic or partition was deleted"
                        );
                        // Retry at once with what is left.
                        continue;
                    }
                    tracing::warn!(shard = self.me.0, to = ?dest, records = n, error = ?e, retry_in_ms = backoff.as_millis() as u64, "handing accepted records to their shard failed; retrying");
                    // Another node gets the spec's 1 s between failed passes (CLUSTER.md §4.2), so
                    // that a reroute comes after ~3 s, not after a blip.
                    let pause = match dest {
                        Destination::Node(_) => RETRY_MAX,
                        Destination::Shard(_) => backoff,
                    };
                    rt::sleep(pause).await;
                    backoff = (backoff * 2).min(RETRY_MAX);
                }
            }
        }
    }

    async fn forget(&self, log: &ShardLog, done: Vec<Queued>) {
        self.node
            .handed
            .fetch_add(done.len() as u64, Ordering::AcqRel);
        let bytes: usize = done.iter().map(|q| weight(&q.rec)).sum();
        self.pending_bytes
            .set(self.pending_bytes.get().saturating_sub(bytes));
        self.progress.notify_waiters();
        let holds: Vec<TransitHold> = done.iter().map(|q| q.hold).collect();
        log.transit_handed(&holds).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_io::log::LogConfig;
    use narad_io::types::{PartitionId, PartitionKey, TopicId, UnixMillis};

    /// A node whose hand-offs answer from a script, recording what they were given.
    struct Scripted {
        answers: RefCell<VecDeque<Result<(), StoreError>>>,
        handed: RefCell<Vec<Vec<AppendRecord>>>,
        stopped_log: Cell<bool>,
        stopping: Cell<bool>,
        /// What the leader says of the metadata: the read barriers asked, and how many
        /// confirm (the rest fail, as on a node cut off from the leader).
        barriers: Cell<u32>,
        confirmed_after: u32,
    }

    impl Scripted {
        /// Hand-offs answered by `answers` in turn (then Ok); read barriers confirm after
        /// `confirmed_after` failed ones.
        fn new(answers: Vec<Result<(), StoreError>>, confirmed_after: u32) -> Scripted {
            Scripted {
                answers: RefCell::new(answers.into()),
                handed: RefCell::new(Vec::new()),
                stopped_log: Cell::new(false),
                stopping: Cell::new(false),
                barriers: Cell::new(0),
                confirmed_after,
            }
        }
    }

    /// Runs `to`'s dispatcher until its queue is empty (at most 3 s), then stops it.
    async fn run_until_handed(t: &Transit, node: &Scripted, log: &ShardLog, to: Destination) {
        let run = t.dispatch(node, log, to, None);
        let watch = async {
            for _ in 0..300 {
                if t.pending() == 0 {
                    break;
                }
                rt::sleep(Duration::from_millis(10)).await;
            }
            node.stopping.set(true);
            assert_eq!(t.drain(Instant::now() + Duration::from_secs(1)).await, 0);
        };
        let ((), ()) = futures_lite::future::zip(run, watch).await;
    }

    impl HandOff for Scripted {
        async fn confirm_metadata(&self) -> bool {
            self.barriers.set(self.barriers.get() + 1);
            self.barriers.get() > self.confirmed_after
        }
        async fn hand_over(
            &self,
            _: Destination,
            batch: Vec<AppendRecord>,
        ) -> Result<(), StoreError> {
            self.handed.borrow_mut().push(batch);
            self.answers.borrow_mut().pop_front().unwrap_or(Ok(()))
        }
        fn vanished(&self) -> impl Fn(&AppendRecord) -> bool + '_ {
            |r: &AppendRecord| r.key.topic == TopicId(99)
        }
        fn owner_stopped(&self) {
            self.stopped_log.set(true);
        }
        fn stopping(&self) -> bool {
            self.stopping.get()
        }
    }

    fn rec(topic: u64, i: u8) -> AppendRecord {
        AppendRecord {
            key: PartitionKey {
                topic: TopicId(topic),
                partition: PartitionId(0),
            },
            msg_key: None,
            payload: vec![i].into(),
        }
    }

    #[test]
    fn a_failed_hand_off_drops_what_vanished_then_hands_the_rest_over_once() {
        // Proves the dispatch policy: the first hand-off fails because the owner's log stopped
        // (the node is told), the record whose topic vanished is dropped and released at once
        // (no backoff), the rest goes over in the next hand-off, in accept order, and is
        // released from the WAL; the dispatcher ends once the node stops and transit closed.
        let dir = std::env::temp_dir().join(format!(
            "narad-transit-dispatch-{}-{}",
            std::process::id(),
            UnixMillis::now().0
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = LogConfig::new(dir.clone(), ShardId(0), 2);
        rt::block_on(async move {
            let (log, _, _) = ShardLog::open(cfg).await.unwrap();
            let t = Transit::new(ShardId(0), 2, Arc::new(TransitProgress::default()));
            let to = Destination::Shard(ShardId(1));
            for r in [rec(1, 0), rec(99, 1), rec(1, 2)] {
                let hold = log.append_transit(to, r.clone()).await.unwrap();
                t.push(to, hold, r);
            }
            assert_eq!(log.transit_held(), 3);
            let node = Scripted::new(vec![Err(StoreError::Stopped("eio".into()))], 0);
            run_until_handed(&t, &node, &log, to).await;
            let handed = node.handed.borrow();
            assert_eq!(
                *handed,
                vec![
                    vec![rec(1, 0), rec(99, 1), rec(1, 2)],
                    vec![rec(1, 0), rec(1, 2)]
                ]
            );
            assert!(
                node.stopped_log.get(),
                "the node heard that the owner's log stopped"
            );
            assert_eq!(
                log.transit_held(),
                0,
                "handed and dropped records are released"
            );
        });
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn vanished_records_are_kept_until_the_leader_confirms_the_metadata() {
        // Proves CLUSTER.md §4.3's discard rule: while the read barrier fails (a node that may
        // be cut off from the leader, its replica stale), a record whose topic looks deleted
        // is kept and offered again with the rest; once the barrier confirms, it is dropped
        // and released, and the others are handed over.
        let dir = std::env::temp_dir().join(format!(
            "narad-transit-confirm-{}-{}",
            std::process::id(),
            UnixMillis::now().0
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = LogConfig::new(dir.clone(), ShardId(0), 2);
        rt::block_on(async move {
            let (log, _, _) = ShardLog::open(cfg).await.unwrap();
            let t = Transit::new(ShardId(0), 2, Arc::new(TransitProgress::default()));
            let to = Destination::Shard(ShardId(1));
            for r in [rec(1, 0), rec(99, 1)] {
                let hold = log.append_transit(to, r.clone()).await.unwrap();
                t.push(to, hold, r);
            }
            let failed = || Err(StoreError::Failed("topic deleted".into()));
            let node = Scripted::new(vec![failed(), failed(), failed()], 2);
            run_until_handed(&t, &node, &log, to).await;
            let both = vec![rec(1, 0), rec(99, 1)];
            assert_eq!(
                *node.handed.borrow(),
                vec![both.clone(), both.clone(), both, vec![rec(1, 0)]],
                "kept through two unconfirmed passes, dropped after the third"
            );
            assert_eq!(node.barriers.get(), 3);
            assert_eq!(log.transit_held(), 0);
        });
        let _ = std::fs::remove_dir_all(dir);
    }
}
