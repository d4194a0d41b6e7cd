//! What this shard sent to each remote (OPERATIONS.md §9.4 remote series): recorded by the
//! shipper (`crate::ship`), snapshotted with the shard's other counters for a scrape.

use std::cell::RefCell;
use std::collections::BTreeMap;

use narad_io::types::TopicId;

use super::expo::Histogram;
use super::HTTP_DURATION_BOUNDS_US;

/// One remote's counters on one shard, since the shard started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RemoteCounters {
    /// Requests by answer status (`"202"`, `"401"`, ...; `"error"` for no answer).
    pub requests: BTreeMap<String, u64>,
    /// Failures by state class (`unavailable`, `auth_failed`, ...).
    pub errors: BTreeMap<&'static str, u64>,
    /// Records sent again because a request got no answer.
    pub resent: u64,
    /// Request body bytes sent (before compression).
    pub body_bytes: u64,
    /// Request body bytes on the wire (after compression).
    pub wire_bytes: u64,
    /// The chunk limit last set (0: never reduced from the default).
    pub chunk_limit: u64,
    /// How long answered requests took, in microseconds.
    pub request_us: Option<Histogram>,
    /// How long requests waited for one of the remote's in-flight slots, in microseconds.
    pub inflight_wait_us: Option<Histogram>,
    /// Openings of the sealed password (one per registry revision and shard).
    pub decrypts: u64,
    /// Dials the destination checks refused, by reason (`address`, `port`, `allowlist`).
    pub destination_refused: BTreeMap<&'static str, u64>,
}

impl RemoteCounters {
    /// Records a request's duration.
    pub fn request_took(&mut self, us: u64) {
        self.request_us
            .get_or_insert_with(|| Histogram::new(&HTTP_DURATION_BOUNDS_US))
            .record(us);
    }

    /// Records a wait for an in-flight slot.
    pub fn waited_for_slot(&mut self, us: u64) {
        self.inflight_wait_us
            .get_or_insert_with(|| Histogram::new(&HTTP_DURATION_BOUNDS_US))
            .record(us);
    }
}

fn merge_hist(into: &mut Option<Histogram>, from: &Option<Histogram>) {
    match (into.as_mut(), from) {
        (Some(a), Some(b)) => a.merge(b),
        (None, Some(b)) => *into = Some(b.clone()),
        _ => {}
    }
}

impl RemoteCounters {
    /// Adds another shard's counters of the same remote.
    pub fn merge(&mut self, o: &RemoteCounters) {
        for (k, v) in &o.requests {
            *self.requests.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &o.errors {
            *self.errors.entry(k).or_default() += v;
        }
        self.resent += o.resent;
        self.body_bytes += o.body_bytes;
        self.wire_bytes += o.wire_bytes;
        self.chunk_limit = self.chunk_limit.max(o.chunk_limit);
        merge_hist(&mut self.request_us, &o.request_us);
        merge_hist(&mut self.inflight_wait_us, &o.inflight_wait_us);
        self.decrypts += o.decrypts;
        for (k, v) in &o.destination_refused {
            *self.destination_refused.entry(k).or_default() += v;
        }
    }
}

thread_local! {
    static REMOTES: RefCell<BTreeMap<String, RemoteCounters>> = const { RefCell::new(BTreeMap::new()) };
}

/// Records into remote `name`'s counters on this shard.
pub fn count(name: &str, f: impl FnOnce(&mut RemoteCounters)) {
    REMOTES.with(|m| {
        let mut m = m.borrow_mut();
        if let Some(c) = m.get_mut(name) {
            f(c);
        } else {
            f(m.entry(name.to_string()).or_default());
        }
    });
}

thread_local! {
    static HELD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    static CHECK_FAILURES: RefCell<BTreeMap<TopicId, u64>> = const { RefCell::new(BTreeMap::new()) };
}

/// A periodic check of remote child `child` (its stub's id) failed on this shard.
pub fn check_failed(child: TopicId) {
    CHECK_FAILURES.with(|m| *m.borrow_mut().entry(child).or_default() += 1);
}

/// This shard's failed periodic checks, by remote child.
pub fn check_failures() -> Vec<(TopicId, u64)> {
    CHECK_FAILURES.with(|m| m.borrow().iter().map(|(k, v)| (*k, *v)).collect())
}

/// Record bytes this shard's shipper holds while it sends them (`narad_remote_held_bytes`),
/// for as long as the value lives.
pub struct Held(u64);

impl Held {
    pub fn new(bytes: u64) -> Held {
        HELD.with(|h| h.set(h.get() + bytes));
        Held(bytes)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        HELD.with(|h| h.set(h.get().saturating_sub(self.0)));
    }
}

/// Record bytes this shard's shipper holds now.
pub fn held_bytes() -> u64 {
    HELD.with(|h| h.get())
}

/// This shard's counters, by remote.
pub fn snapshot() -> Vec<(String, RemoteCounters)> {
    REMOTES.with(|m| {
        m.borrow()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    })
}
