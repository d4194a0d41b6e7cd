//! What this shard sent to each remote (OPERATIONS.md §9.4 remote series): recorded by the
//! shipper (`crate::ship`), snapshotted with the shard's other counters for a scrape.

use std::cell::RefCell;
use std::collections::BTreeMap;

/// One remote's counters on one shard, since the shard started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RemoteCounters {
    /// Requests by answer status (`"202"`, `"401"`, ...; `"error"` for no answer).
    pub requests: BTreeMap<String, u64>,
    /// Failures by state class (`unavailable`, `auth_failed`, ...).
    pub errors: BTreeMap<&'static str, u64>,
    /// Records sent again because a request got no answer.
    pub resent: u64,
    /// Request body bytes sent.
    pub body_bytes: u64,
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

/// This shard's counters, by remote.
pub fn snapshot() -> Vec<(String, RemoteCounters)> {
    REMOTES.with(|m| {
        m.borrow()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    })
}
