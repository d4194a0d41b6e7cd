//! The metrics recorder: the per-shard counters ([`Metrics`], one per shard inside its `Node`)
//! that every part of the broker records into, and their snapshot ([`ShardMetrics`], the one
//! value that crosses threads). Counters are plain `Cell`/`RefCell` values of the shard that did
//! the work: no atomics, no locks on the request path; recording is a hash-map update. Every
//! bounded map has a named maximum: beyond it new series are dropped, never unbounded memory.
//! `expo` is the text format and its histograms.
//!
//! Never reads the node, never answers a request: collecting the snapshots of every shard and
//! rendering `/metrics` is `crate::scrape`, which sits above the node. What is counted where:
//! HTTP series by [`observe`] around every handled request, and for answers the HTTP layer gives
//! without the handler (404/405/415 from the head, 413, parse errors:
//! [`Metrics::early_answer`], [`Metrics::refused`]); message counters on the shard that accepted
//! the request.

pub mod expo;
pub mod remote;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

use narad_io::log::{AppendRecord, LogFailures, ShardLog};
use narad_io::partition::PartitionIoStats;
use narad_io::types::{FastMap, Offset, PartitionKey, TopicId, UnixMillis};
use narad_shard::host::{Leased, SettleKind};

use crate::http::{Request, RequestHead, Response};
use expo::Histogram;

/// Upper bounds (microseconds) of `narad_http_request_duration_seconds`: 250 µs to the 30 s
/// long-poll ceiling.
pub static HTTP_DURATION_BOUNDS_US: [u64; 15] = [
    250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000,
    2_500_000, 10_000_000, 30_000_000,
];

/// Upper bounds of `narad_wal_batch_records`: the WAL's power-of-two buckets (bucket `i` holds
/// `[2^i, 2^(i+1))` records, so `2^(i+1) - 1` is its inclusive bound), up to 2^20 - 1.
pub static WAL_BATCH_RECORDS_BOUNDS: [u64; 20] = {
    let mut b = [0u64; 20];
    let mut i = 0;
    while i < 20 {
        b[i] = (1u64 << (i + 1)) - 1;
        i += 1;
    }
    b
};

/// Distinct (route, method, status) series per shard.
pub const HTTP_SERIES_MAX: usize = 4096;
/// Partitions with traffic counters per shard.
pub const PARTITION_SERIES_MAX: usize = 1 << 16;
/// Topics with counters per shard.
pub const TOPIC_SERIES_MAX: usize = 1 << 14;
/// Directory entries visited to size the data directory; beyond it the size is a lower bound.
pub const DATA_DIR_WALK_ENTRIES_MAX: usize = 200_000;
/// How long a data directory size stays cached (OPERATIONS.md §9: gauges refresh every 5 s).
pub const DATA_DIR_SIZE_TTL: Duration = Duration::from_secs(5);

/// The labels of one HTTP series.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HttpKey {
    /// Matched pattern (`POST /v1/topics/{topic}/ack`) or `unmatched`.
    pub route: &'static str,
    pub method: &'static str,
    pub status: u16,
}

/// One HTTP series: durations (its count is the request count) and bytes.
#[derive(Clone, Debug)]
pub struct HttpSeries {
    pub duration_us: Histogram,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// Message traffic of one partition, counted on one shard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    pub produced: u64,
    pub produced_bytes: u64,
    pub consumed: u64,
    pub consumed_bytes: u64,
}

/// Per-topic counters of one shard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TopicCounters {
    pub acked: u64,
    pub extended: u64,
    pub nacked: u64,
    /// Queue consumes answered `204` (nothing available within the wait).
    pub consume_empty: u64,
    /// Produces (a batch counts once) refused by the topic's schema.
    pub rejected_schema: u64,
    /// Produces refused because the topic is a delay child.
    pub rejected_delayed_child: u64,
    pub rejected_remote_child: u64,
}

/// Why a produce was refused (`narad_produce_rejections_total{reason}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProduceRejection {
    Schema,
    DelayedChild,
    /// A produce to a remote child's stub.
    RemoteChild,
}

/// Queue and storage gauges of one partition, read on its owner shard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartitionGauges {
    pub size_bytes: u64,
    pub segments: u32,
    pub high_watermark: u64,
    pub frontier: u64,
    pub in_flight: u64,
    pub acked_ahead: u64,
    /// Unreadable records skipped by queue consumes since the owner shard started.
    pub corrupt_skipped: u64,
    /// Unsettled offsets lost to retention since the owner shard started.
    pub dropped: u64,
    /// Milliseconds since the oldest unsettled record still stored was committed (0 when every
    /// record is settled).
    pub oldest_unconsumed_age_ms: u64,
}

/// The counters of one shard. Lives in the shard's `Node`; never leaves its thread. Recorded
/// through its methods; read only by the shard's snapshot (`Node::metrics_snapshot`) and the
/// scrape's own caches (`crate::scrape`).
pub struct Metrics {
    pub(crate) http: RefCell<FastMap<HttpKey, HttpSeries>>,
    pub(crate) in_flight: Cell<u64>,
    pub(crate) traffic: RefCell<FastMap<PartitionKey, Traffic>>,
    pub(crate) topics: RefCell<FastMap<TopicId, TopicCounters>>,
    /// `narad_consume_wait_seconds` by (topic, outcome).
    pub(crate) consume_wait: RefCell<HashMap<(TopicId, &'static str), Histogram>>,
    pub(crate) next_request: Cell<u64>,
    /// (when measured, data directory bytes) on the shard that answers scrapes.
    pub(crate) data_dir_size: Cell<Option<(Instant, u64)>>,
    /// Batch bodies refused because the node's batch-body budget was spent.
    pub(crate) budget_rejections: Cell<u64>,
    /// Per owned partition: the offset last found oldest unsettled and its commit time, so a
    /// scrape reads a record only when a partition's frontier moved.
    pub(crate) oldest_unsettled: RefCell<HashMap<PartitionKey, (Offset, UnixMillis)>>,
    /// The metadata applied index last seen by a scrape and since when it has not moved, for
    /// `narad_metastore_apply_stalled`.
    pub(crate) applied_seen: Cell<Option<(u64, Instant)>>,
    /// Retention passes that panicked and were recovered (the loop goes on).
    pub(crate) retention_panics: Cell<u64>,
    /// Restarts of the lease-expiry loop after a panic.
    pub(crate) reaper_restarts: Cell<u64>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            http: RefCell::new(FastMap::default()),
            in_flight: Cell::new(0),
            traffic: RefCell::new(FastMap::default()),
            topics: RefCell::new(FastMap::default()),
            consume_wait: RefCell::new(HashMap::new()),
            next_request: Cell::new(0),
            data_dir_size: Cell::new(None),
            budget_rejections: Cell::new(0),
            retention_panics: Cell::new(0),
            reaper_restarts: Cell::new(0),
            oldest_unsettled: RefCell::new(HashMap::new()),
            applied_seen: Cell::new(None),
        }
    }
}

/// When `narad serve` began, for `narad_boot_duration_seconds`.
static BOOT_STARTED: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
/// Microseconds from [`BOOT_STARTED`] until the last shard was serving (0 = not yet).
pub(crate) static BOOT_DURATION_US: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// Marks the start of the boot (the first call wins).
pub fn boot_started() {
    let _ = BOOT_STARTED.set(Instant::now());
}

/// A shard is serving: the boot lasted at least until now.
pub fn shard_serving() {
    if let Some(t0) = BOOT_STARTED.get() {
        let us = t0.elapsed().as_micros() as u64;
        BOOT_DURATION_US.fetch_max(us.max(1), std::sync::atomic::Ordering::Relaxed);
    }
}

/// Per-partition message and byte counts of records about to be appended, taken before the
/// records move into the log (they are counted only once the append succeeded).
pub struct Tally(Vec<(PartitionKey, u64, u64)>);

impl Tally {
    pub fn of(records: &[AppendRecord]) -> Tally {
        let mut v: Vec<(PartitionKey, u64, u64)> = Vec::with_capacity(records.len().min(8));
        for r in records {
            let bytes = r.payload.len() as u64;
            match v.iter_mut().find(|e| e.0 == r.key) {
                Some(e) => {
                    e.1 += 1;
                    e.2 += bytes;
                }
                None => v.push((r.key, 1, bytes)),
            }
        }
        Tally(v)
    }
}

fn bump(c: &Cell<u64>, by: u64) {
    c.set(c.get().wrapping_add(by));
}

fn method_label(method: &str, head: bool) -> &'static str {
    if head {
        return "HEAD";
    }
    match method {
        "GET" => "GET",
        "HEAD" => "HEAD",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "OPTIONS" => "OPTIONS",
        _ => "OTHER",
    }
}

impl Metrics {
    /// A batch body was refused because the node's batch-body budget was spent.
    pub fn budget_rejected(&self) {
        self.budget_rejections.set(self.budget_rejections.get() + 1);
    }

    /// A retention pass panicked; the loop recovered and goes on with the next pass.
    pub fn retention_panicked(&self) {
        self.retention_panics.set(self.retention_panics.get() + 1);
    }

    /// The lease-expiry loop panicked and was restarted.
    pub fn reaper_restarted(&self) {
        self.reaper_restarts.set(self.reaper_restarts.get() + 1);
    }

    fn record_http(&self, key: HttpKey, elapsed: Duration, bytes_in: u64, bytes_out: u64) {
        let mut http = self.http.borrow_mut();
        if !http.contains_key(&key) && http.len() >= HTTP_SERIES_MAX {
            return;
        }
        let s = http.entry(key).or_insert_with(|| HttpSeries {
            duration_us: Histogram::new(&HTTP_DURATION_BOUNDS_US),
            bytes_in: 0,
            bytes_out: 0,
        });
        s.duration_us
            .record(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX));
        s.bytes_in += bytes_in;
        s.bytes_out += bytes_out;
    }

    /// An answer decided from the head alone (guard, 404, 405, authentication, a body over the
    /// route's cap), or a refusal while reading the body of a parsed head: labelled with the
    /// head's route and method.
    pub fn early_answer(&self, route: &'static str, head: &RequestHead, status: u16) {
        let key = HttpKey {
            route,
            method: method_label(head.method.as_str(), head.head),
            status,
        };
        self.record_http(key, Duration::ZERO, 0, 0);
    }

    /// An answer the HTTP layer gave without a parsed head (unparsable request, oversized header
    /// block) or for a handler panic.
    pub fn refused(&self, status: u16) {
        let key = HttpKey {
            route: "unmatched",
            method: "OTHER",
            status,
        };
        self.record_http(key, Duration::ZERO, 0, 0);
    }

    /// Records appended successfully (call after the append answered Ok).
    pub fn produced(&self, tally: Tally) {
        let mut t = self.traffic.borrow_mut();
        for (key, n, bytes) in tally.0 {
            if !t.contains_key(&key) && t.len() >= PARTITION_SERIES_MAX {
                continue;
            }
            let e = t.entry(key).or_default();
            e.produced += n;
            e.produced_bytes += bytes;
        }
    }

    /// Queue deliveries (redeliveries count again; replays are not counted).
    pub fn consumed(&self, topic: TopicId, delivered: &[Leased]) {
        let mut t = self.traffic.borrow_mut();
        for l in delivered {
            let key = PartitionKey {
                topic,
                partition: l.partition,
            };
            if !t.contains_key(&key) && t.len() >= PARTITION_SERIES_MAX {
                continue;
            }
            let e = t.entry(key).or_default();
            e.consumed += 1;
            e.consumed_bytes += l.record.payload.len() as u64;
        }
    }

    fn topic(&self, topic: TopicId, f: impl FnOnce(&mut TopicCounters)) {
        let mut t = self.topics.borrow_mut();
        if !t.contains_key(&topic) && t.len() >= TOPIC_SERIES_MAX {
            return;
        }
        f(t.entry(topic).or_default());
    }

    /// `ok` leases settled successfully with `kind`.
    pub fn settled(&self, topic: TopicId, kind: SettleKind, ok: usize) {
        if ok == 0 {
            return;
        }
        let ok = ok as u64;
        self.topic(topic, |c| match kind {
            SettleKind::Ack => c.acked += ok,
            SettleKind::Extend => c.extended += ok,
            SettleKind::Nack => c.nacked += ok,
        });
    }

    /// A produce (single or batch) refused for `reason`.
    pub fn produce_rejected(&self, topic: TopicId, reason: ProduceRejection) {
        self.topic(topic, |c| match reason {
            ProduceRejection::Schema => c.rejected_schema += 1,
            ProduceRejection::DelayedChild => c.rejected_delayed_child += 1,
            ProduceRejection::RemoteChild => c.rejected_remote_child += 1,
        });
    }

    /// A queue consume that found nothing within its wait.
    pub fn consume_empty(&self, topic: TopicId) {
        self.topic(topic, |c| c.consume_empty += 1);
    }

    fn consume_waited(&self, topic: TopicId, outcome: &'static str, waited: Duration) {
        let mut m = self.consume_wait.borrow_mut();
        let key = (topic, outcome);
        if !m.contains_key(&key) && m.len() >= TOPIC_SERIES_MAX {
            return;
        }
        m.entry(key)
            .or_insert_with(|| Histogram::new(&HTTP_DURATION_BOUNDS_US))
            .record(u64::try_from(waited.as_micros()).unwrap_or(u64::MAX));
    }

    /// Milliseconds since the record at `at` (the oldest unsettled one still stored) of `key`
    /// was committed, as of `now`; 0 when `at` is at or past the high watermark (all settled).
    /// The commit time is read from the log once per position and remembered.
    pub(crate) fn unsettled_age_ms(
        &self,
        log: &ShardLog,
        key: PartitionKey,
        at: Offset,
        hwm: Offset,
        now: UnixMillis,
    ) -> u64 {
        if at >= hwm {
            self.oldest_unsettled.borrow_mut().remove(&key);
            return 0;
        }
        let known = self.oldest_unsettled.borrow().get(&key).copied();
        let committed = match known {
            Some((o, t)) if o == at => Some(t),
            _ => {
                let t = log.commit_ms_at(key, at);
                let mut m = self.oldest_unsettled.borrow_mut();
                match t {
                    Some(t) if m.contains_key(&key) || m.len() < PARTITION_SERIES_MAX => {
                        m.insert(key, (at, t));
                    }
                    _ => {
                        m.remove(&key);
                    }
                }
                t
            }
        };
        committed.map_or(0, |t| now.0.saturating_sub(t.0))
    }

    /// A fresh request id, unique within this process: shard in the top byte, then a counter.
    fn next_request_id(&self, shard: u32) -> u64 {
        let n = self.next_request.get().wrapping_add(1);
        self.next_request.set(n);
        (u64::from(shard & 0xff) << 56) | (n & ((1 << 56) - 1))
    }
}

/// One queue consume's wait, for `narad_consume_wait_seconds{topic,outcome}`: `no_wait` when it
/// was not allowed to wait, else `hit` (delivered), `timeout` (nothing within the wait) or
/// `cancelled` (ended by shutdown, or by the client going away).
pub struct ConsumeWait {
    t0: Instant,
    no_wait: bool,
}

impl ConsumeWait {
    pub fn start(no_wait: bool) -> ConsumeWait {
        ConsumeWait {
            t0: Instant::now(),
            no_wait,
        }
    }

    /// The consume delivered records.
    pub fn hit(&self, m: &Metrics, topic: TopicId) {
        let outcome = if self.no_wait { "no_wait" } else { "hit" };
        m.consume_waited(topic, outcome, self.t0.elapsed());
    }

    /// The client went away while the consume waited (answered `499`, to no one).
    pub fn gone(&self, m: &Metrics, topic: TopicId) {
        m.consume_waited(topic, "cancelled", self.t0.elapsed());
    }

    /// The consume answers `204` (also counted in `narad_consume_empty_total`).
    pub fn empty(&self, m: &Metrics, topic: TopicId, cancelled: bool) {
        let outcome = match (self.no_wait, cancelled) {
            (true, _) => "no_wait",
            (false, true) => "cancelled",
            (false, false) => "timeout",
        };
        m.consume_waited(topic, outcome, self.t0.elapsed());
        m.consume_empty(topic);
    }
}

/// Decrements the in-flight gauge however the request ends (answer, panic, cancellation).
struct InFlight<'a>(&'a Cell<u64>);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

/// Serves `req` with `handler`, recording (in shard `shard`'s `m`, under the route label
/// `route`) the HTTP series, the in-flight gauge, a request id on every log line the handler
/// writes, and a log line for a `5xx` answer (4xx are not logged, OPERATIONS.md §8).
pub async fn observe<F, H>(
    m: &Metrics,
    shard: u32,
    route: &'static str,
    req: Request,
    handler: H,
) -> Response
where
    H: FnOnce(Request) -> F,
    F: Future<Output = Response>,
{
    let method = method_label(req.method.as_str(), req.head);
    let bytes_in = req.body.len() as u64;
    let head = req.head;
    let id = m.next_request_id(shard);
    bump(&m.in_flight, 1);
    let guard = InFlight(&m.in_flight);
    let t0 = Instant::now();
    let resp = crate::logging::with_request_id(id, handler(req)).await;
    let elapsed = t0.elapsed();
    drop(guard);
    let key = HttpKey {
        route,
        method,
        status: resp.status,
    };
    // A HEAD answer is sent without its body.
    let bytes_out = if head { 0 } else { resp.body.len() as u64 };
    m.record_http(key, elapsed, bytes_in, bytes_out);
    if resp.status >= 500 {
        crate::logging::in_request(id, || {
            tracing::error!(
                status = resp.status,
                route,
                method,
                duration_ms = elapsed.as_secs_f64() * 1e3,
                "request failed"
            )
        });
    }
    resp
}

/// One shard's counters and the gauges of the partitions it owns: the value the mesh carries.
#[derive(Debug)]
pub struct ShardMetrics {
    pub shard: u32,
    pub http: Vec<(HttpKey, HttpSeries)>,
    pub in_flight: u64,
    pub traffic: Vec<(PartitionKey, Traffic)>,
    pub topics: Vec<(TopicId, TopicCounters)>,
    pub consume_wait: Vec<((TopicId, &'static str), Histogram)>,
    pub partitions: Vec<(PartitionKey, PartitionGauges)>,
    /// The storage figures of the owned partitions that have a log here.
    pub partition_io: Vec<(PartitionKey, PartitionIoStats)>,
    /// Checkpoints and retention passes of the shard's log that failed.
    pub log_failures: LogFailures,
    pub wal_fsync_us: Histogram,
    pub wal_batch_records: Histogram,
    pub wal_bytes_written: u64,
    pub wal_failed: bool,
    pub open_partition_logs: u64,
    /// Partition logs closed for idleness since the shard started.
    pub idle_logs_evicted: u64,
    pub cold_retention_swept: u64,
    pub retention_panics: u64,
    pub reaper_restarts: u64,
    /// Single produces accepted here and not yet handed to their owner shard.
    pub transit_backlog: u64,
    pub mesh_calls_pending: u64,
    /// The shard's schema validation counters (thread-local in `crate::schema`).
    pub schema: crate::schema::Counters,
    /// The shard's fan-out copy counters.
    pub fanout: narad_shard::fanout::FanoutCounters,
    /// The lag of each fan-out cursor on this shard (one per parent partition × child).
    pub fanout_lag: Vec<narad_shard::fanout::PartitionLag>,
    /// Records copied and dropped per (parent, child) by this shard's cursors.
    pub fanout_links: Vec<(TopicId, TopicId, narad_shard::fanout::LinkCounts)>,
    /// Leases that lapsed on this shard, per topic.
    pub leases_expired: Vec<(TopicId, u64)>,
    pub budget_rejections: u64,
    /// The Raft gauges, from the shard that hosts the metadata group.
    pub raft: Option<narad_raft::RaftGauges>,
    /// Node-to-node requests this shard sent, per operation code.
    pub rpc: Vec<(u8, narad_io::peer::stats::OpStats)>,
    /// What this shard sent to each remote (remote children).
    pub remotes: Vec<(String, remote::RemoteCounters)>,
    /// Record bytes this shard's shipper holds while it sends them.
    pub remote_held_bytes: u64,
    /// Failed periodic checks of remote children on this shard, by stub id.
    pub remote_check_failures: Vec<(TopicId, u64)>,
}
