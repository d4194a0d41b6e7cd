//! Fan-out copying (SEMANTICS.md §10–12): every record committed to a parent partition after a
//! child's attach point is copied into that child, immediately or (delay children) once
//! `parent commit time + delay` has passed.
//!
//! Owns: one cursor per (parent partition owned by this shard × attached child × attach epoch),
//! the task that drives it, and this shard's cursor file (`narad_io::fanout_cursor`). Never
//! appends to a child partition itself: copies go through the [`Sink`] the binary gives it,
//! which is the same append path a produce takes (routing to the child partition's owner shard,
//! and later node). So a cursor never assumes where its child partitions live. Never reads the
//! metadata: the binary hands it the current [`Link`]s on every metadata change.
//!
//! Driving: a cursor copies while its parent partition has records past it, then parks on the
//! partition's commit notification (`ShardLog::on_commit`), re-checking at least every
//! [`FANOUT_IDLE_RECHECK`]. A delay cursor stops at the first record not yet due and sleeps until
//! it is due (at most [`FANOUT_DUE_SLEEP_MAX`]). A failed copy is retried after
//! [`FANOUT_RETRY_BACKOFF`] with the same records. The parent's producers never wait for a
//! cursor: the parent log is the buffer, and a cursor holds at most one slab
//! ([`FanoutLimits`]: `fanout.max_batch_records` / `fanout.max_batch_bytes`, by default
//! [`FANOUT_BATCH_RECORDS_MAX`] records / [`FANOUT_BATCH_BYTES_MAX`] bytes) in memory. Less than
//! a full slab waits up to `fanout.linger_ms` (25 ms) after its oldest record, as a delay
//! record waits for its due time, so a trickle is copied in fewer, larger appends. A cursor
//! that falls behind the parent's retention skips the deleted offsets and counts them
//! (`dropped`, metric `narad_fanout_child_dropped_messages`).
//!
//! # Crash-safety argument (duplicates possible, gaps never)
//! 1. A cursor's in-memory position `next` moves past a slab only after the sink answered that
//!    every record of the slab is durable in the child (the produce contract: fsynced and
//!    verified on the child partition's owner).
//! 2. The cursor file is written from the in-memory positions, atomically (temp, fdatasync,
//!    rename, directory fsync), a little after they move. So the durable position is always at
//!    or behind the copied position: the file never claims a record that is not in the child.
//! 3. After a crash each cursor restarts at its durable position, or at its attach point
//!    (`attach_offsets` in the replicated metadata) when none is stored for its epoch. Every
//!    record between the durable position and the crash is copied again (duplicates); nothing
//!    at or after the durable position is skipped, so the child has no gaps.
//! 4. A re-attach has a new epoch, so an old position is never resumed for a new attach.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use narad_io::fanout_cursor::{self, CursorEntry};
use narad_io::log::{AppendRecord, ReadError, ShardLog, StoredRecord};
use narad_io::rt::{self, Notify, Semaphore};
use narad_io::types::{
    owner_shard, Offset, PartitionId, PartitionKey, ShardId, TopicId, UnixMillis,
};

/// Records one copy step moves at most (`fanout.max_batch_records`).
pub const FANOUT_BATCH_RECORDS_MAX: usize = 4096;
/// Bytes one copy step moves at most (`fanout.max_batch_bytes`); the first record always goes.
pub const FANOUT_BATCH_BYTES_MAX: usize = 4 << 20;
/// Upper bounds of the records-per-copied-batch buckets (`narad_fanout_batch_records`): powers
/// of two up to [`FANOUT_BATCH_RECORDS_MAX`].
pub const FANOUT_BATCH_RECORDS_BOUNDS: [u64; 13] =
    [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096];
/// Upper bounds of the payload-bytes-per-copied-batch buckets (`narad_fanout_batch_bytes`): 256 B
/// to [`FANOUT_BATCH_BYTES_MAX`] by fours (a batch whose first record alone is larger goes
/// above).
pub const FANOUT_BATCH_BYTES_BOUNDS: [u64; 9] = [
    256,
    1 << 10,
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    2 << 20,
    4 << 20,
];
/// The operator's fan-out settings (OPERATIONS.md §4: `fanout.max_batch_records`,
/// `fanout.max_batch_bytes`, `fanout.linger_ms`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FanoutLimits {
    /// Records one copy step moves at most (at least 1).
    pub batch_records: usize,
    /// Payload bytes one copy step moves at most (a first record larger than this goes alone).
    pub batch_bytes: usize,
    /// How long a copy that would move less than a full slab waits for more records, counted
    /// from the oldest record's commit (its due time for a delay child): fewer, larger child
    /// appends under a trickle, never a wait longer than this.
    pub linger: Duration,
}

impl Default for FanoutLimits {
    /// The documented defaults: 4096 records, 4 MiB, 25 ms.
    fn default() -> Self {
        FanoutLimits {
            batch_records: FANOUT_BATCH_RECORDS_MAX,
            batch_bytes: FANOUT_BATCH_BYTES_MAX,
            linger: Duration::from_millis(25),
        }
    }
}

/// Wait before retrying a copy the sink refused (child owner down, disk full, ...).
pub const FANOUT_RETRY_BACKOFF: Duration = Duration::from_secs(1);
/// An idle cursor re-checks its parent this often even without a commit notification.
pub const FANOUT_IDLE_RECHECK: Duration = Duration::from_secs(1);
/// Longest sleep of a delay cursor waiting for its next record to become due.
pub const FANOUT_DUE_SLEEP_MAX: Duration = Duration::from_secs(30);
/// Cursor positions are written this long after they first move (coalesces many steps into one
/// file write).
pub const CURSOR_PERSIST_DELAY: Duration = Duration::from_millis(50);

/// Future of one sink call.
pub type SinkFuture = Pin<Box<dyn Future<Output = Result<(), String>>>>;
/// Appends copies durably (Ok only when every record is durable in its child partition).
pub type Sink = Rc<dyn Fn(Vec<AppendRecord>) -> SinkFuture>;
/// The produce path's key → partition function (so a copy lands where a produce would).
pub type KeyRoute = fn(&[u8], u32) -> u32;

/// Why a remote link's records did not all ship: the first `done` records are on the target
/// (the cursor moves past them), `code` (≥ 1) is the state the binary reports for the cursor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShipError {
    pub done: usize,
    pub code: u8,
}
/// Future of one shipper call.
pub type ShipFuture = Pin<Box<dyn Future<Output = Result<(), ShipError>>>>;
/// Ships a remote link's records to the remote (SEMANTICS.md §13): (parent partition, the
/// stub's id, records). Ok only when the target answered `202` for every record.
pub type Shipper = Rc<dyn Fn(PartitionKey, TopicId, Vec<AppendRecord>) -> ShipFuture>;

/// What the metadata says of a remote link (a child that is a remote stub).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RemoteLink {
    /// Paused by an operator: the cursors hold their positions.
    pub paused: bool,
    /// Parent offsets an operator skipped, per parent partition.
    pub skip: std::collections::BTreeMap<u32, Vec<u64>>,
}

/// One attached child, as the metadata says now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub parent: TopicId,
    pub parent_partitions: u32,
    /// Per parent partition, whether this node owns it (a cluster): cursors run only on the
    /// owner's. Empty: this node owns every partition (a node that is its whole cluster).
    pub parent_owned: Vec<bool>,
    pub child: TopicId,
    pub child_partitions: u32,
    /// The attach epoch (16 hex chars in the metadata) as a number.
    pub epoch: u64,
    /// 0 for an immediate child.
    pub delay_ms: u64,
    /// Attach point per parent partition.
    pub attach_offsets: Vec<u64>,
    /// Set when the child is a remote stub: records go to the [`Shipper`], not the [`Sink`].
    pub remote: Option<RemoteLink>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct CursorId {
    parent: PartitionKey,
    child: TopicId,
    epoch: u64,
}

struct Cursor {
    id: CursorId,
    delay_ms: u64,
    parent_partitions: Cell<u32>,
    child_partitions: Cell<u32>,
    /// Next parent offset to copy; every offset below is durable in the child.
    next: Cell<Offset>,
    /// Round-robin position for keyless records when partition counts differ.
    rr: Cell<u32>,
    stopped: Cell<bool>,
    /// When the oldest record not yet copied became (or becomes) due: its commit time plus the
    /// delay, as last read; `None` when the cursor last found nothing to copy.
    head_due_ms: Cell<Option<u64>>,
    /// The parent partition's commit notification.
    wake: Rc<Notify>,
    /// A remote link's pause and skipped offsets (this parent partition's), `None` for a local
    /// child.
    remote: RefCell<Option<(bool, Rc<[u64]>)>>,
    /// A remote link's state: 0 running, else the [`ShipError::code`] of the last failure.
    state: Cell<u8>,
    /// The parent offset the last failure stopped at (a remote link).
    blocked_at: Cell<Option<u64>>,
    /// When records last shipped (Unix ms; 0 never), a remote link.
    last_ok_ms: Cell<u64>,
}

/// Counters of one shard's fan-out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FanoutCounters {
    /// Records copied into children (the sum of the per-link [`LinkCounts`]).
    pub copied: u64,
    /// Parent offsets skipped because retention deleted them before they were copied (the sum
    /// of the per-link [`LinkCounts`]).
    pub dropped: u64,
    /// Parent records skipped because they could not be read (damaged).
    pub unreadable: u64,
    /// Copy attempts the sink refused (retried).
    pub failed_copies: u64,
    /// Copied batches by records, per bucket of [`FANOUT_BATCH_RECORDS_BOUNDS`] (not cumulative;
    /// the last one counts larger batches). Their records sum to `copied`.
    pub batch_records: [u64; FANOUT_BATCH_RECORDS_BOUNDS.len() + 1],
    /// Copied batches by payload bytes, per bucket of [`FANOUT_BATCH_BYTES_BOUNDS`].
    pub batch_bytes: [u64; FANOUT_BATCH_BYTES_BOUNDS.len() + 1],
    /// Payload bytes of every copied batch.
    pub batch_bytes_sum: u64,
}

/// Where one remote link's cursor stands (a row of the children listing's `partitions=true`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CursorRow {
    pub partition: u32,
    /// Next parent offset to ship.
    pub next: u64,
    pub high_watermark: u64,
    /// 0 running, else the shipper's code.
    pub state: u8,
    /// The offset the last failure stopped at.
    pub blocked_at: Option<u64>,
    /// When records last shipped (Unix ms, 0 never).
    pub last_ok_ms: u64,
}

/// The lag of one child over the parent partitions of this shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChildLag {
    pub child: TopicId,
    /// Σ max(0, parent high watermark − cursor next offset).
    pub lag_messages: u64,
    /// Cursors that reported (one per parent partition owned here).
    pub cursors: u32,
    /// How long past due the oldest uncopied record of the most behind cursor is, in
    /// milliseconds (0 when every cursor is caught up or waiting for a record to become due).
    pub due_lag_ms: u64,
    /// A remote link: one row per cursor (empty for a local child).
    pub rows: Vec<CursorRow>,
}

impl ChildLag {
    /// Adds another shard's or node's cursors of the same child.
    pub fn merge(&mut self, o: &ChildLag) {
        self.lag_messages += o.lag_messages;
        self.cursors += o.cursors;
        self.due_lag_ms = self.due_lag_ms.max(o.due_lag_ms);
        self.rows.extend_from_slice(&o.rows);
    }

    /// A remote link: the cursor in the worst state (the highest code; the lowest partition
    /// among equals), `None` while every cursor runs.
    pub fn worst(&self) -> Option<&CursorRow> {
        self.rows
            .iter()
            .filter(|r| r.state != 0)
            .max_by_key(|r| (r.state, std::cmp::Reverse(r.partition)))
    }

    /// A remote link: when records last shipped from any of its cursors (Unix ms, 0 never).
    pub fn last_ok_ms(&self) -> u64 {
        self.rows.iter().map(|r| r.last_ok_ms).max().unwrap_or(0)
    }
}

enum Step {
    /// Copied or skipped something: go again.
    Progress,
    /// Nothing past the cursor.
    Idle,
    /// The next record is due in this many milliseconds.
    NotDue(u64),
    /// The copy failed: back off and retry.
    Retry,
}

pub struct Fanout {
    shard: ShardId,
    shards: u32,
    log: ShardLog,
    sink: Sink,
    /// Where remote links' records go (set once the binary built it).
    shipper: RefCell<Option<Shipper>>,
    /// Payload bytes this shard's remote cursors may hold at once (their slabs share it).
    remote_budget: Cell<usize>,
    /// The name of a remote cursor's state code, for log lines (the binary knows them).
    state_name: Cell<fn(u8) -> &'static str>,
    route: KeyRoute,
    limits: FanoutLimits,
    path: PathBuf,
    cursors: RefCell<HashMap<CursorId, Rc<Cursor>>>,
    /// Positions found in the cursor file at start, claimed by the cursors reconcile creates.
    loaded: RefCell<HashMap<CursorId, Offset>>,
    /// Commit notification per parent partition with cursors.
    parents: RefCell<HashMap<PartitionKey, Rc<Notify>>>,
    dirty: Cell<bool>,
    persist_wake: Notify,
    /// One cursor file write at a time.
    persist_lock: Semaphore,
    closed: Cell<bool>,
    counters: Cell<FanoutCounters>,
    /// Records copied and skipped as dropped, per (parent topic, child topic), since start.
    links: RefCell<HashMap<(TopicId, TopicId), LinkCounts>>,
}

/// What one link's cursors on a shard did since the shard started (metrics
/// `narad_fanout_committed_total{parent,child}`, `narad_fanout_child_dropped_messages{parent,child}`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkCounts {
    pub copied: u64,
    pub dropped: u64,
}

/// One cursor's lag (metrics `narad_fanout_lag_messages{parent,child,partition}`,
/// `narad_fanout_due_lag_seconds{parent,child,partition}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionLag {
    pub parent: PartitionKey,
    pub child: TopicId,
    /// max(0, parent high watermark − cursor next offset).
    pub lag_messages: u64,
    /// How long past due the oldest uncopied record is, in milliseconds (0 when caught up).
    pub due_lag_ms: u64,
    /// A remote link's cursor state (0 running, else the shipper's code); `None` for a local
    /// child.
    pub remote_state: Option<u8>,
    /// A remote link: when its records last shipped (Unix ms, 0 never).
    pub last_ok_ms: u64,
}

impl Fanout {
    /// Loads this shard's cursor file and hooks the log's commit notifications. No cursor runs
    /// before the first [`Fanout::reconcile`].
    pub fn new(
        shard: ShardId,
        shards: u32,
        data_dir: &std::path::Path,
        log: ShardLog,
        sink: Sink,
        route: KeyRoute,
        limits: FanoutLimits,
    ) -> Rc<Fanout> {
        let path = fanout_cursor::cursor_path(data_dir, shard);
        let loaded = fanout_cursor::load(&path)
            .into_iter()
            .map(|e| {
                (
                    CursorId {
                        parent: e.parent,
                        child: e.child,
                        epoch: e.epoch,
                    },
                    e.next,
                )
            })
            .collect();
        let fan = Rc::new(Fanout {
            shard,
            shards,
            log,
            sink,
            shipper: RefCell::new(None),
            remote_budget: Cell::new(usize::MAX),
            state_name: Cell::new(|_| "failed"),
            route,
            limits,
            path,
            cursors: RefCell::new(HashMap::new()),
            loaded: RefCell::new(loaded),
            parents: RefCell::new(HashMap::new()),
            dirty: Cell::new(false),
            persist_wake: Notify::new(),
            persist_lock: Semaphore::new(1),
            closed: Cell::new(false),
            counters: Cell::new(FanoutCounters::default()),
            links: RefCell::new(HashMap::new()),
        });
        let weak = Rc::downgrade(&fan);
        fan.log.on_commit(Box::new(move |keys: &[PartitionKey]| {
            let Some(f) = weak.upgrade() else { return };
            let hit: Vec<Rc<Notify>> = {
                let parents = f.parents.borrow();
                if parents.is_empty() {
                    return;
                }
                keys.iter()
                    .filter_map(|k| parents.get(k).cloned())
                    .collect()
            };
            for n in hit {
                n.notify_waiters();
            }
        }));
        let f = fan.clone();
        rt::spawn(async move { f.run_persister().await }).detach();
        fan
    }

    /// Sets where remote links' records go, and the payload bytes this shard's remote cursors
    /// may hold at once (`remotes.max_held_bytes` over the shards): each reads slabs of at most
    /// its share. Until then remote cursors wait.
    pub fn set_shipper(&self, s: Shipper, budget_bytes: usize, state_name: fn(u8) -> &'static str) {
        *self.shipper.borrow_mut() = Some(s);
        self.remote_budget.set(budget_bytes.max(1));
        self.state_name.set(state_name);
    }

    /// The slab bytes one cursor reads: its share of the remote budget for a remote link.
    fn slab_bytes(&self, c: &Cursor) -> usize {
        if c.remote.borrow().is_none() {
            return self.limits.batch_bytes;
        }
        let remote_cursors = self
            .cursors
            .borrow()
            .values()
            .filter(|c| c.remote.borrow().is_some())
            .count()
            .max(1);
        (self.remote_budget.get() / remote_cursors).clamp(1, self.limits.batch_bytes)
    }

    pub fn counters(&self) -> FanoutCounters {
        let mut k = self.counters.get();
        // `copied` and `dropped` are the sums of the per-link counts (never reset).
        for l in self.links.borrow().values() {
            k.copied += l.copied;
            k.dropped += l.dropped;
        }
        k
    }

    /// Per-link counts of this shard's cursors, as (parent, child, counts).
    pub fn link_counts(&self) -> Vec<(TopicId, TopicId, LinkCounts)> {
        self.links
            .borrow()
            .iter()
            .map(|(&(p, c), &k)| (p, c, k))
            .collect()
    }

    /// The lag of every cursor of this shard (one per parent partition here × child).
    pub fn partition_lags(&self) -> Vec<PartitionLag> {
        let now = UnixMillis::now().0;
        self.cursors
            .borrow()
            .values()
            .map(|c| PartitionLag {
                parent: c.id.parent,
                child: c.id.child,
                lag_messages: self
                    .log
                    .high_watermark(c.id.parent)
                    .0
                    .saturating_sub(c.next.get().0),
                due_lag_ms: c.head_due_ms.get().map_or(0, |due| now.saturating_sub(due)),
                remote_state: c.remote.borrow().is_some().then(|| c.state.get()),
                last_ok_ms: c.last_ok_ms.get(),
            })
            .collect()
    }

    fn count_link(&self, c: &Cursor, copied: u64, dropped: u64) {
        let mut links = self.links.borrow_mut();
        let k = links.entry((c.id.parent.topic, c.id.child)).or_default();
        k.copied += copied;
        k.dropped += dropped;
    }

    fn count(&self, f: impl FnOnce(&mut FanoutCounters)) {
        let mut c = self.counters.get();
        f(&mut c);
        self.counters.set(c);
    }

    /// Makes the running cursors match `links`: starts cursors for new (parent partition owned
    /// here × child × epoch), stops those no longer linked, and updates partition counts.
    pub fn reconcile(self: &Rc<Self>, links: &[Link]) {
        if self.closed.get() {
            return;
        }
        let mut want: HashMap<CursorId, (&Link, u32)> = HashMap::new();
        for l in links {
            for p in 0..l.parent_partitions {
                let key = PartitionKey {
                    topic: l.parent,
                    partition: PartitionId(p),
                };
                if owner_shard(key, self.shards) != self.shard
                    || l.parent_owned.get(p as usize) == Some(&false)
                {
                    continue;
                }
                let id = CursorId {
                    parent: key,
                    child: l.child,
                    epoch: l.epoch,
                };
                want.insert(id, (l, p));
            }
        }
        let removed: Vec<Rc<Cursor>> = {
            let mut cursors = self.cursors.borrow_mut();
            let gone: Vec<CursorId> = cursors
                .keys()
                .filter(|id| !want.contains_key(id))
                .copied()
                .collect();
            gone.iter().filter_map(|id| cursors.remove(id)).collect()
        };
        for c in &removed {
            c.stopped.set(true);
            c.wake.notify_waiters();
        }
        let mut started = Vec::new();
        for (id, (l, p)) in want {
            let remote = l.remote.as_ref().map(|r| {
                let skip: Rc<[u64]> = r
                    .skip
                    .get(&p)
                    .map_or_else(|| Rc::from([]), |v| Rc::from(&v[..]));
                (r.paused, skip)
            });
            if let Some(c) = self.cursors.borrow().get(&id) {
                c.parent_partitions.set(l.parent_partitions);
                c.child_partitions.set(l.child_partitions.max(1));
                let resumed = matches!(*c.remote.borrow(), Some((true, _)))
                    && matches!(remote, Some((false, _)));
                *c.remote.borrow_mut() = remote;
                if resumed {
                    c.wake.notify_waiters();
                }
                continue;
            }
            let attach = Offset(l.attach_offsets.get(p as usize).copied().unwrap_or(0));
            let stored = self.loaded.borrow_mut().remove(&id);
            let next = stored.map_or(attach, |s| s.max(attach));
            let wake = self
                .parents
                .borrow_mut()
                .entry(id.parent)
                .or_insert_with(|| Rc::new(Notify::new()))
                .clone();
            let c = Rc::new(Cursor {
                id,
                delay_ms: l.delay_ms,
                parent_partitions: Cell::new(l.parent_partitions),
                child_partitions: Cell::new(l.child_partitions.max(1)),
                next: Cell::new(next),
                rr: Cell::new(p),
                stopped: Cell::new(false),
                head_due_ms: Cell::new(None),
                wake,
                remote: RefCell::new(remote),
                state: Cell::new(0),
                blocked_at: Cell::new(None),
                last_ok_ms: Cell::new(0),
            });
            self.cursors.borrow_mut().insert(id, c.clone());
            started.push(c);
        }
        // Parent partitions without cursors no longer need commit notifications.
        {
            let cursors = self.cursors.borrow();
            self.parents
                .borrow_mut()
                .retain(|k, _| cursors.keys().any(|id| id.parent == *k));
        }
        if !removed.is_empty() {
            self.mark_dirty();
        }
        for c in started {
            let f = self.clone();
            rt::spawn(async move { f.run_cursor(c).await }).detach();
        }
    }

    /// Where the cursors of parent partition `parent` on this shard stand: (child, attach epoch,
    /// next offset to copy). A partition move carries them to the new owner.
    pub fn positions(&self, parent: PartitionKey) -> Vec<(TopicId, u64, Offset)> {
        self.cursors
            .borrow()
            .values()
            .filter(|c| c.id.parent == parent)
            .map(|c| (c.id.child, c.id.epoch, c.next.get()))
            .collect()
    }

    /// Positions for the cursors of a parent partition this shard is about to own (a moved
    /// partition's, from its old owner): the next [`Fanout::reconcile`] starts them there instead
    /// of at the attach point. Never moves a known position back.
    pub fn seed(&self, parent: PartitionKey, positions: &[(TopicId, u64, Offset)]) {
        let mut loaded = self.loaded.borrow_mut();
        for &(child, epoch, next) in positions {
            let id = CursorId {
                parent,
                child,
                epoch,
            };
            let e = loaded.entry(id).or_insert(next);
            *e = (*e).max(next);
        }
    }

    /// Lag per child of `parent` over the cursors on this shard.
    pub fn lag(&self, parent: TopicId) -> Vec<ChildLag> {
        let now = UnixMillis::now().0;
        let mut out: Vec<ChildLag> = Vec::new();
        for c in self.cursors.borrow().values() {
            if c.id.parent.topic != parent {
                continue;
            }
            let state = c.state.get();
            let hwm = self.log.high_watermark(c.id.parent).0;
            let rows = if c.remote.borrow().is_some() {
                vec![CursorRow {
                    partition: c.id.parent.partition.0,
                    next: c.next.get().0,
                    high_watermark: hwm,
                    state,
                    blocked_at: c.blocked_at.get().filter(|_| state != 0),
                    last_ok_ms: c.last_ok_ms.get(),
                }]
            } else {
                Vec::new()
            };
            let one = ChildLag {
                child: c.id.child,
                lag_messages: self
                    .log
                    .high_watermark(c.id.parent)
                    .0
                    .saturating_sub(c.next.get().0),
                cursors: 1,
                due_lag_ms: c.head_due_ms.get().map_or(0, |due| now.saturating_sub(due)),
                rows,
            };
            match out.iter_mut().find(|o| o.child == one.child) {
                Some(o) => o.merge(&one),
                None => out.push(one),
            }
        }
        out
    }

    /// Number of cursors running on this shard.
    pub fn cursor_count(&self) -> usize {
        self.cursors.borrow().len()
    }

    /// Stops every cursor and writes their positions one last time (graceful shutdown).
    pub async fn close(&self) {
        self.closed.set(true);
        let all: Vec<Rc<Cursor>> = self.cursors.borrow().values().cloned().collect();
        for c in &all {
            c.stopped.set(true);
            c.wake.notify_waiters();
        }
        self.persist_wake.notify_waiters();
        if let Err(e) = self.persist_now().await {
            tracing::error!(error = %e, "writing fan-out cursors at shutdown failed");
        }
    }

    fn mark_dirty(&self) {
        if !self.dirty.replace(true) {
            self.persist_wake.notify_waiters();
        }
    }

    /// Writes every running cursor's position to the cursor file, durably.
    pub async fn persist_now(&self) -> std::io::Result<()> {
        let _permit = self.persist_lock.acquire().await;
        self.write_cursors().await
    }

    /// The persister's write: none once [`Fanout::close`] began (it writes the final positions
    /// itself), so no file write starts while the shard is stopping (its blocking I/O would
    /// outlive the executor).
    async fn persist_unless_closed(&self) -> std::io::Result<()> {
        let _permit = self.persist_lock.acquire().await;
        if self.closed.get() {
            return Ok(());
        }
        self.write_cursors().await
    }

    async fn write_cursors(&self) -> std::io::Result<()> {
        self.dirty.set(false);
        let entries: Vec<CursorEntry> = self
            .cursors
            .borrow()
            .values()
            .map(|c| CursorEntry {
                parent: c.id.parent,
                child: c.id.child,
                epoch: c.id.epoch,
                next: c.next.get(),
            })
            .collect();
        let r = fanout_cursor::store(self.path.clone(), entries).await;
        if r.is_err() {
            // Try again later; the stored positions stay behind the copies meanwhile.
            self.dirty.set(true);
        }
        r
    }

    async fn run_persister(self: Rc<Self>) {
        loop {
            let wake = self.persist_wake.notified();
            if self.closed.get() {
                return;
            }
            if !self.dirty.get() {
                wake.await;
                continue;
            }
            drop(wake);
            rt::sleep(CURSOR_PERSIST_DELAY).await;
            if let Err(e) = self.persist_unless_closed().await {
                tracing::error!(error = %e, path = %self.path.display(),
                    "writing fan-out cursors failed; retrying (a crash now copies more duplicates)");
                rt::sleep(FANOUT_RETRY_BACKOFF).await;
            }
        }
    }

    async fn run_cursor(self: Rc<Self>, c: Rc<Cursor>) {
        loop {
            if c.stopped.get() || self.closed.get() {
                return;
            }
            let wake = c.wake.clone();
            let notified = wake.notified();
            match self.step(&c).await {
                Step::Progress => {
                    drop(notified);
                    rt::yield_if_needed().await;
                }
                Step::Idle => {
                    let _ = rt::timeout(FANOUT_IDLE_RECHECK, notified).await;
                }
                Step::NotDue(ms) => {
                    drop(notified);
                    let d = Duration::from_millis(ms.max(1)).min(FANOUT_DUE_SLEEP_MAX);
                    // Sleep until due; a stop (detach, shutdown) rings the notification too.
                    let _ = rt::timeout(d, async {
                        loop {
                            let n = wake.notified();
                            if c.stopped.get() {
                                break;
                            }
                            n.await;
                        }
                    })
                    .await;
                }
                Step::Retry => {
                    drop(notified);
                    rt::sleep(FANOUT_RETRY_BACKOFF).await;
                }
            }
        }
    }

    /// One copy step of cursor `c`.
    async fn step(&self, c: &Cursor) -> Step {
        let key = c.id.parent;
        let next = c.next.get();
        if matches!(*c.remote.borrow(), Some((true, _))) {
            // Paused: the position holds (a resume rings the notification).
            return Step::Idle;
        }
        if next >= self.log.high_watermark(key) {
            return Step::Idle;
        }
        let slab_bytes = self.slab_bytes(c);
        let recs = match self
            .log
            .read(key, next, self.limits.batch_records, slab_bytes)
            .await
        {
            Ok(r) => r,
            Err(ReadError::BelowRetention { oldest }) => {
                let lost = oldest.0.saturating_sub(next.0);
                tracing::error!(parent = %key.topic, partition = key.partition.0, child = %c.id.child,
                    lost, "fan-out cursor fell behind the parent's retention; records skipped for this child");
                self.count_link(c, 0, lost);
                c.next.set(oldest.max(next));
                self.mark_dirty();
                return Step::Progress;
            }
            Err(ReadError::Corrupt { offset }) if offset <= next => {
                tracing::error!(parent = %key.topic, partition = key.partition.0, offset = next.0,
                    "unreadable parent record skipped by fan-out");
                self.count(|k| k.unreadable += 1);
                c.next.set(Offset(next.0 + 1));
                self.mark_dirty();
                return Step::Progress;
            }
            Err(ReadError::Corrupt { offset }) => {
                // Copy what comes before the damaged record first.
                let n = (offset.0 - next.0) as usize;
                match self.log.read(key, next, n, slab_bytes).await {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::warn!(error = ?e, "fan-out read failed; retrying");
                        return Step::Retry;
                    }
                }
            }
            Err(e) => {
                tracing::warn!(parent = %key.topic, partition = key.partition.0, error = ?e,
                    "fan-out read failed; retrying");
                return Step::Retry;
            }
        };
        let Some(first) = recs.first() else {
            c.head_due_ms.set(None);
            return Step::Idle;
        };
        c.head_due_ms
            .set(Some(first.commit_ms.0.saturating_add(c.delay_ms)));
        if first.offset > next {
            // Retention raced the read: the records before `first` are gone.
            let lost = first.offset.0 - next.0;
            self.count_link(c, 0, lost);
            c.next.set(first.offset);
        }
        let now = UnixMillis::now().0;
        let due_count = if c.delay_ms == 0 {
            recs.len()
        } else {
            let n = recs
                .iter()
                .take_while(|r| r.commit_ms.0.saturating_add(c.delay_ms) <= now)
                .count();
            if n == 0 {
                return Step::NotDue(first.commit_ms.0 + c.delay_ms - now);
            }
            n
        };
        // Payload bytes of this copy (its metric, and whether it fills the slab).
        let bytes: u64 = recs[..due_count]
            .iter()
            .map(|r| r.payload.len() as u64)
            .sum();
        // Linger: less than a full slab waits for more, up to `linger` after the first was due.
        let linger_ms = self.limits.linger.as_millis() as u64;
        if linger_ms > 0 {
            let full = due_count >= self.limits.batch_records || bytes >= slab_bytes as u64;
            let send_at = first
                .commit_ms
                .0
                .saturating_add(c.delay_ms)
                .saturating_add(linger_ms);
            if !full && send_at > now {
                return Step::NotDue(send_at - now);
            }
        }
        // The oldest record left after this copy, if it was read (else the next read says).
        let next_due = recs
            .get(due_count)
            .map(|r| r.commit_ms.0.saturating_add(c.delay_ms));
        let mut recs = recs;
        recs.truncate(due_count);
        let last = recs.last().map_or(next, |r| r.offset);
        // A shared handle on the skips (the borrow must not live across the shipper's await).
        let remote = c.remote.borrow().as_ref().map(|(_, skip)| skip.clone());
        if let Some(skip) = remote {
            return self.ship(c, recs, &skip, last, next_due, bytes).await;
        }
        let copies = self.copies(c, recs);
        let n = copies.len() as u64;
        match (self.sink)(copies).await {
            Ok(()) => {
                // Never move backwards (a concurrent skip may have moved it further).
                if c.next.get() <= last {
                    c.next.set(Offset(last.0 + 1));
                }
                c.head_due_ms.set(next_due);
                self.count_link(c, n, 0);
                self.count(|k| {
                    k.batch_records[FANOUT_BATCH_RECORDS_BOUNDS.partition_point(|&b| b < n)] += 1;
                    k.batch_bytes[FANOUT_BATCH_BYTES_BOUNDS.partition_point(|&b| b < bytes)] += 1;
                    k.batch_bytes_sum += bytes;
                });
                self.mark_dirty();
                Step::Progress
            }
            Err(e) => {
                self.count(|k| k.failed_copies += 1);
                if !c.stopped.get() {
                    tracing::warn!(parent = %key.topic, partition = key.partition.0, child = %c.id.child,
                        error = %e, "fan-out copy failed; retrying");
                }
                Step::Retry
            }
        }
    }

    /// One step of a remote link: `recs` (less the skipped offsets) to the shipper. The cursor
    /// moves past what the target took; a failure holds it on the first record not taken.
    async fn ship(
        &self,
        c: &Cursor,
        mut recs: Vec<StoredRecord>,
        skip: &[u64],
        last: Offset,
        next_due: Option<u64>,
        bytes: u64,
    ) -> Step {
        let Some(shipper) = self.shipper.borrow().clone() else {
            return Step::Retry;
        };
        if !skip.is_empty() {
            recs.retain(|r| skip.binary_search(&r.offset.0).is_err());
        }
        let offsets: Vec<Offset> = recs.iter().map(|r| r.offset).collect();
        let copies = self.copies(c, recs);
        let n = copies.len();
        let r = if copies.is_empty() {
            Ok(())
        } else {
            shipper(c.id.parent, c.id.child, copies).await
        };
        let advance = |to: Offset| {
            if c.next.get() < to {
                c.next.set(to);
            }
        };
        match r {
            Ok(()) => {
                advance(Offset(last.0 + 1));
                c.head_due_ms.set(next_due);
                c.state.set(0);
                c.blocked_at.set(None);
                c.last_ok_ms.set(UnixMillis::now().0);
                self.count_link(c, n as u64, 0);
                self.count(|k| {
                    k.batch_records
                        [FANOUT_BATCH_RECORDS_BOUNDS.partition_point(|&b| b < n as u64)] += 1;
                    k.batch_bytes[FANOUT_BATCH_BYTES_BOUNDS.partition_point(|&b| b < bytes)] += 1;
                    k.batch_bytes_sum += bytes;
                });
                self.mark_dirty();
                Step::Progress
            }
            Err(e) => {
                let done = e.done.min(n);
                if done > 0 {
                    advance(Offset(offsets[done - 1].0 + 1));
                    c.last_ok_ms.set(UnixMillis::now().0);
                    self.count_link(c, done as u64, 0);
                    self.mark_dirty();
                }
                let stuck = offsets.get(done).map_or(c.next.get().0, |o| o.0);
                if c.state.replace(e.code.max(1)) != e.code.max(1) && !c.stopped.get() {
                    tracing::warn!(parent = %c.id.parent.topic, partition = c.id.parent.partition.0,
                        child = %c.id.child, offset = stuck, state = (self.state_name.get())(e.code),
                        "shipping to the remote stopped; retrying");
                }
                c.blocked_at.set(Some(stuck));
                self.count(|k| k.failed_copies += 1);
                if done > 0 {
                    Step::Progress
                } else {
                    Step::Retry
                }
            }
        }
    }

    /// The child records for `recs`: key kept; keyed records hash over the child's partition
    /// count, keyless ones go to the same index when the counts match, else round-robin.
    fn copies(&self, c: &Cursor, recs: Vec<StoredRecord>) -> Vec<AppendRecord> {
        let cp = c.child_partitions.get().max(1);
        let same_index = cp == c.parent_partitions.get();
        recs.into_iter()
            .map(|r| {
                let p = match r.msg_key.as_deref() {
                    Some(k) if !k.is_empty() => (self.route)(k, cp),
                    _ if same_index => c.id.parent.partition.0,
                    _ => {
                        let p = c.rr.get().wrapping_add(1);
                        c.rr.set(p);
                        p % cp
                    }
                };
                AppendRecord {
                    key: PartitionKey {
                        topic: c.id.child,
                        partition: PartitionId(p % cp),
                    },
                    msg_key: r.msg_key.as_deref().map(<[u8]>::to_vec),
                    payload: r.payload,
                }
            })
            .collect()
    }
}

/// The attach epoch's 16 hex characters as a number (0 when malformed, which apply refuses).
pub fn epoch_from_hex(s: &str) -> u64 {
    u64::from_str_radix(s, 16).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_io::log::LogConfig;

    /// Bound on the polls of a wait in these tests (10 ms each).
    const WAIT_POLLS_MAX: u32 = 1000;

    /// The default slab, copied at once.
    const NO_LINGER: FanoutLimits = FanoutLimits {
        batch_records: FANOUT_BATCH_RECORDS_MAX,
        batch_bytes: FANOUT_BATCH_BYTES_MAX,
        linger: Duration::ZERO,
    };

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "narad-fanout-{tag}-{}-{}",
            std::process::id(),
            UnixMillis::now().0
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn key(topic: u64, p: u32) -> PartitionKey {
        PartitionKey {
            topic: TopicId(topic),
            partition: PartitionId(p),
        }
    }

    fn rec(k: PartitionKey, msg_key: Option<&str>, i: u64) -> AppendRecord {
        AppendRecord {
            key: k,
            msg_key: msg_key.map(|s| s.as_bytes().to_vec()),
            payload: format!("m{i}").into_bytes().into(),
        }
    }

    fn sink_into(log: &ShardLog) -> Sink {
        let log = log.clone();
        Rc::new(move |recs| {
            let log = log.clone();
            Box::pin(async move {
                log.append(recs)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
        })
    }

    fn by_len(k: &[u8], n: u32) -> u32 {
        k.len() as u32 % n
    }

    /// A one-shard fan-out over `log` that copies into the same log.
    fn fanout_on(dir: &std::path::Path, log: &ShardLog, limits: FanoutLimits) -> Rc<Fanout> {
        Fanout::new(
            ShardId(0),
            1,
            dir,
            log.clone(),
            sink_into(log),
            by_len,
            limits,
        )
    }

    fn link(epoch: u64, delay_ms: u64, attach_offsets: Vec<u64>) -> Link {
        Link {
            parent: TopicId(1),
            parent_partitions: 2,
            parent_owned: Vec::new(),
            child: TopicId(2),
            child_partitions: 2,
            epoch,
            delay_ms,
            attach_offsets,
            remote: None,
        }
    }

    async fn wait_for(log: &ShardLog, k: PartitionKey, hwm: u64) {
        for _ in 0..WAIT_POLLS_MAX {
            if log.high_watermark(k) >= Offset(hwm) {
                return;
            }
            rt::sleep(Duration::from_millis(10)).await;
        }
        panic!("{k:?} never reached {hwm}: {:?}", log.high_watermark(k));
    }

    #[test]
    fn a_partial_slab_lingers_and_a_full_one_goes_at_once() {
        // Proves the fan-out settings: with `linger` 1 s a lone record is not copied before
        // its linger ends and is copied after it; a slab of `batch_records` (3) goes at once,
        // and no copy step moves more than 3 records.
        let dir = temp_dir("linger");
        let cfg = LogConfig::new(dir.clone(), ShardId(0), 1);
        let d = dir.clone();
        rt::block_on(async move {
            let (log, _, _) = ShardLog::open(cfg).await.unwrap();
            let limits = FanoutLimits {
                batch_records: 3,
                batch_bytes: FANOUT_BATCH_BYTES_MAX,
                linger: Duration::from_millis(1000),
            };
            let f = fanout_on(&d, &log, limits);
            f.reconcile(&[link(1, 0, vec![0, 0])]);
            let t0 = std::time::Instant::now();
            log.append(vec![rec(key(1, 0), None, 0)]).await.unwrap();
            rt::sleep(Duration::from_millis(150)).await;
            assert_eq!(
                log.high_watermark(key(2, 0)),
                Offset(0),
                "copied before its linger"
            );
            wait_for(&log, key(2, 0), 1).await;
            assert!(
                t0.elapsed() >= Duration::from_millis(950),
                "{:?}",
                t0.elapsed()
            );
            // A full slab does not wait; 7 records move as 3 + 3 (+ 1 after its linger).
            let t1 = std::time::Instant::now();
            log.append((1..8).map(|i| rec(key(1, 0), None, i)).collect())
                .await
                .unwrap();
            wait_for(&log, key(2, 0), 7).await;
            assert!(
                t1.elapsed() < Duration::from_millis(800),
                "{:?}",
                t1.elapsed()
            );
            wait_for(&log, key(2, 0), 8).await;
            let k = f.counters();
            assert_eq!(k.copied, 8);
            // Batches of 1, 3, 3 and 1 records: two in the bucket of 1, two in (2, 4].
            assert_eq!(k.batch_records[..4], [2, 0, 2, 0], "{k:?}");
            assert_eq!(k.batch_records.iter().sum::<u64>(), 4, "{k:?}");
            f.close().await;
            log.close().await.unwrap();
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_remote_link_ships_within_its_share_stops_on_a_refusal_and_honours_pause_and_skips() {
        // Proves the remote-link half of the fan-out (SEMANTICS.md §13): records go to the
        // shipper, never the sink; a slab holds at most the shard's remote budget over its
        // remote cursors (10 B here, records of 2 B: at most 5 a slab); a failure
        // after `done` records moves the cursor past exactly those and reports the state and
        // the stuck offset; a skipped offset is passed without being sent; pause holds.
        let dir = temp_dir("remote");
        let cfg = LogConfig::new(dir.clone(), ShardId(0), 1);
        let d = dir.clone();
        rt::block_on(async move {
            let (log, _, _) = ShardLog::open(cfg).await.unwrap();
            let f = fanout_on(&d, &log, NO_LINGER);
            let sent: Rc<RefCell<Vec<Vec<Vec<u8>>>>> = Rc::new(RefCell::new(Vec::new()));
            // Refuses the payload "m5" (after shipping the ones before it in the same call).
            let s = sent.clone();
            let shipper: Shipper = Rc::new(move |_parent, child, recs| {
                let s = s.clone();
                Box::pin(async move {
                    assert_eq!(child, TopicId(2));
                    let payloads: Vec<Vec<u8>> = recs.iter().map(|r| r.payload.to_vec()).collect();
                    let bad = payloads.iter().position(|p| p == b"m5");
                    s.borrow_mut().push(payloads.clone());
                    match bad {
                        Some(i) => Err(ShipError { done: i, code: 5 }),
                        None => Ok(()),
                    }
                })
            });
            f.set_shipper(shipper, 10, |_| "rejected");
            let mut l = link(1, 0, vec![0, 0]);
            l.parent_partitions = 1;
            l.child_partitions = 0;
            l.remote = Some(RemoteLink::default());
            f.reconcile(std::slice::from_ref(&l));
            log.append((0..8).map(|i| rec(key(1, 0), None, i)).collect())
                .await
                .unwrap();
            let mut stuck = None;
            for _ in 0..WAIT_POLLS_MAX {
                let lag = f.lag(TopicId(1));
                if lag
                    .first()
                    .is_some_and(|c| c.worst().is_some_and(|w| w.state == 5))
                {
                    stuck = lag.first().cloned();
                    break;
                }
                rt::sleep(Duration::from_millis(10)).await;
            }
            let stuck = stuck.expect("the refusal is reported");
            let w = stuck.worst().expect("a stuck cursor");
            assert_eq!((w.partition, w.blocked_at), (0, Some(5)), "{stuck:?}");
            assert_eq!(stuck.lag_messages, 3, "m5, m6, m7 left: {stuck:?}");
            assert!(
                sent.borrow().iter().all(|b| b.len() <= 5),
                "a slab within the 10-byte share: {:?}",
                sent.borrow()
            );
            assert_eq!(
                log.high_watermark(key(2, 0)),
                Offset(0),
                "nothing went to the sink"
            );
            // Pause: nothing more is sent.
            l.remote = Some(RemoteLink {
                paused: true,
                skip: Default::default(),
            });
            f.reconcile(std::slice::from_ref(&l));
            rt::sleep(Duration::from_millis(50)).await;
            let before = sent.borrow().len();
            rt::sleep(Duration::from_millis(1200)).await;
            assert_eq!(sent.borrow().len(), before, "a paused link sends nothing");
            // Skip offset 5 and resume: m6 and m7 go, m5 never again.
            l.remote = Some(RemoteLink {
                paused: false,
                skip: [(0, vec![5])].into(),
            });
            f.reconcile(std::slice::from_ref(&l));
            for _ in 0..WAIT_POLLS_MAX {
                if f.lag(TopicId(1))
                    .first()
                    .is_some_and(|c| c.lag_messages == 0 && c.worst().is_none())
                {
                    break;
                }
                rt::sleep(Duration::from_millis(10)).await;
            }
            let after = f.lag(TopicId(1));
            assert_eq!(
                (after[0].lag_messages, after[0].worst()),
                (0, None),
                "{after:?}"
            );
            let tail: Vec<Vec<u8>> = sent.borrow()[before..].concat();
            assert_eq!(tail, [b"m6".to_vec(), b"m7".to_vec()]);
            f.close().await;
            log.close().await.unwrap();
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn copies_after_the_attach_point_and_resumes_from_the_cursor_file() {
        // Proves: only records at or after the attach point are copied; keyed copies are routed
        // by the key function, keyless ones keep their partition index; after a restart the
        // cursor resumes at its stored position (nothing copied twice without a crash, nothing
        // skipped); a new epoch ignores the old position and starts at its own attach point.
        let dir = temp_dir("resume");
        let cfg = LogConfig::new(dir.clone(), ShardId(0), 1);
        let d = dir.clone();
        rt::block_on(async move {
            let dir = d;
            let (log, _, _) = ShardLog::open(cfg.clone()).await.unwrap();
            for i in 0..5 {
                log.append(vec![rec(key(1, 0), None, i)]).await.unwrap();
            }
            let f = fanout_on(&dir, &log, NO_LINGER);
            f.reconcile(&[link(7, 0, vec![5, 0])]);
            for i in 0..10 {
                log.append(vec![
                    rec(key(1, 0), None, i),
                    rec(key(1, 1), Some("abc"), i),
                ])
                .await
                .unwrap();
            }
            // Keyless from parent 0 → child 0; key "abc" (length 3) → child 1.
            wait_for(&log, key(2, 0), 10).await;
            wait_for(&log, key(2, 1), 10).await;
            let first = log.read(key(2, 0), Offset(0), 1, usize::MAX).await.unwrap();
            assert_eq!(
                first[0].payload[..],
                b"m0"[..],
                "record 5 of the parent is the first copied"
            );
            let k = log.read(key(2, 1), Offset(0), 1, usize::MAX).await.unwrap();
            assert_eq!(k[0].msg_key.as_deref(), Some(&b"abc"[..]), "key kept");
            let k = f.counters();
            assert_eq!(k.copied, 20);
            // Every copied batch is in both histograms; payloads are "m0".."m9", twice.
            let batches: u64 = k.batch_records.iter().sum();
            assert!((2..=20).contains(&batches), "{k:?}");
            assert_eq!(k.batch_bytes.iter().sum::<u64>(), batches);
            assert_eq!(k.batch_bytes_sum, 40);
            f.close().await;
            log.close().await.unwrap();

            let (log, _, _) = ShardLog::open(cfg.clone()).await.unwrap();
            let f = fanout_on(&dir, &log, NO_LINGER);
            f.reconcile(&[link(7, 0, vec![5, 0])]);
            log.append(vec![rec(key(1, 0), None, 99)]).await.unwrap();
            wait_for(&log, key(2, 0), 11).await;
            rt::sleep(Duration::from_millis(100)).await;
            assert_eq!(
                log.high_watermark(key(2, 0)),
                Offset(11),
                "resumed, not restarted"
            );
            assert_eq!(f.lag(TopicId(1))[0].lag_messages, 0);
            assert_eq!(f.lag(TopicId(1))[0].cursors, 2);

            // Re-attach (new epoch) at the tail: nothing old is copied again.
            f.reconcile(&[link(8, 0, vec![16, 10])]);
            log.append(vec![rec(key(1, 0), None, 100)]).await.unwrap();
            wait_for(&log, key(2, 0), 12).await;
            rt::sleep(Duration::from_millis(100)).await;
            assert_eq!(log.high_watermark(key(2, 0)), Offset(12));
            // Detach: the cursors stop.
            f.reconcile(&[]);
            assert_eq!(f.cursor_count(), 0);
            log.append(vec![rec(key(1, 0), None, 101)]).await.unwrap();
            rt::sleep(Duration::from_millis(100)).await;
            assert_eq!(log.high_watermark(key(2, 0)), Offset(12));
            f.close().await;
            log.close().await.unwrap();
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn delay_cursor_copies_only_when_due() {
        // Proves a delay cursor leaves a record in the parent until its commit time + delay has
        // passed, then copies it; while it waits for the record to become due its due lag is 0.
        let dir = temp_dir("delay");
        let cfg = LogConfig::new(dir.clone(), ShardId(0), 1);
        let d = dir.clone();
        rt::block_on(async move {
            let dir = d;
            let (log, _, _) = ShardLog::open(cfg).await.unwrap();
            let f = fanout_on(&dir, &log, NO_LINGER);
            f.reconcile(&[link(9, 300, vec![0, 0])]);
            let before = std::time::Instant::now();
            log.append(vec![rec(key(1, 0), None, 1)]).await.unwrap();
            rt::sleep(Duration::from_millis(150)).await;
            assert_eq!(log.high_watermark(key(2, 0)), Offset(0), "copied early");
            assert_eq!(f.lag(TopicId(1))[0].due_lag_ms, 0, "not due yet");
            wait_for(&log, key(2, 0), 1).await;
            assert!(before.elapsed() >= Duration::from_millis(300));
            f.close().await;
            log.close().await.unwrap();
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_cursor_behind_retention_skips_and_counts_the_lost_records() {
        // Proves drop-behind (SEMANTICS.md §10): while the child refuses copies the cursor
        // retries without moving; when retention deletes parent segments it has not copied, it
        // skips them, counts them as dropped, and copies everything still retained. Its due lag
        // grows while it is stuck and is 0 once it has caught up.
        let dir = temp_dir("behind");
        let cfg = LogConfig {
            partition_segment_bytes_max: 4096,
            ..LogConfig::new(dir.clone(), ShardId(0), 1)
        };
        let d = dir.clone();
        rt::block_on(async move {
            let dir = d;
            let (log, _, _) = ShardLog::open(cfg).await.unwrap();
            let open = Rc::new(Cell::new(false));
            let (l2, o2) = (log.clone(), open.clone());
            let sink: Sink = Rc::new(move |recs| {
                let (log, open) = (l2.clone(), o2.get());
                Box::pin(async move {
                    if !open {
                        return Err("child unavailable".to_string());
                    }
                    log.append(recs)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                })
            });
            let f = Fanout::new(ShardId(0), 1, &dir, log.clone(), sink, by_len, NO_LINGER);
            f.reconcile(&[link(3, 0, vec![0, 0])]);
            let pad = "x".repeat(500);
            for i in 0..40u64 {
                log.append(vec![AppendRecord {
                    key: key(1, 0),
                    msg_key: None,
                    payload: format!("{i}{pad}").into_bytes().into(),
                }])
                .await
                .unwrap();
            }
            rt::sleep(Duration::from_millis(50)).await;
            assert_eq!(log.high_watermark(key(2, 0)), Offset(0));
            assert!(f.counters().failed_copies > 0);
            let stuck = f.lag(TopicId(1))[0].due_lag_ms;
            assert!(stuck >= 40, "due lag of a stuck cursor: {stuck} ms");
            let later = UnixMillis(UnixMillis::now().0 + 7_200_000);
            log.enforce_retention(TopicId(1), 3_600_000, later)
                .await
                .unwrap();
            let oldest = log.oldest_offset(key(1, 0));
            assert!(oldest > Offset(0), "retention deleted nothing");
            open.set(true);
            wait_for(&log, key(2, 0), 40 - oldest.0).await;
            assert_eq!(f.counters().dropped, oldest.0);
            assert_eq!(log.high_watermark(key(2, 0)), Offset(40 - oldest.0));
            for _ in 0..100 {
                if f.lag(TopicId(1))[0].due_lag_ms == 0 {
                    break;
                }
                rt::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(f.lag(TopicId(1))[0].due_lag_ms, 0, "caught up");
            f.close().await;
            log.close().await.unwrap();
        });
        let _ = std::fs::remove_dir_all(&dir);
    }
}
