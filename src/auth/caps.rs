//! Per-identity concurrency caps (API.md §4): consumes (and optionally produces) in flight per
//! identity per node. Identity = authenticated username, or the client IP with security off.
//!
//! The cap is per node, and a node is one process of several shards, so the counts live in one
//! node-wide table behind a mutex (held for a hash-map update, never across an `.await`). The
//! alternative, per-shard caps that sum to the node cap, refuses a client early whenever the
//! kernel's SO_REUSEPORT spreading of its connections over the shards is uneven, and cannot
//! express a cap smaller than the shard count; one uncontended lock per request costs far less
//! than the request. The table only holds identities with something in flight, so its size is
//! bounded by the requests in flight.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Consume,
    Produce,
}

impl Kind {
    fn noun(self) -> &'static str {
        match self {
            Kind::Consume => "consume",
            Kind::Produce => "produce",
        }
    }
}

#[derive(Default)]
pub struct Caps {
    counts: Mutex<HashMap<(Kind, String), usize>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// The identity is at its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtCap;

/// Held while the request is in flight; gives its units back when dropped.
pub struct CapGuard {
    caps: Arc<Caps>,
    key: (Kind, String),
    units: usize,
}

impl Drop for CapGuard {
    fn drop(&mut self) {
        let mut m = lock(&self.caps.counts);
        if let Some(c) = m.get_mut(&self.key) {
            *c = c.saturating_sub(self.units);
            if *c == 0 {
                m.remove(&self.key);
            }
        }
    }
}

/// The `429` text of API.md §4.
pub fn refusal(kind: Kind, cap: usize) -> String {
    format!(
        "too many in-flight {} requests for this identity (limit {cap} per node)",
        kind.noun()
    )
}

impl Caps {
    /// Takes `units` (clamped to `cap`) for `identity`; `Ok(None)` when the cap is off (0),
    /// `Err(AtCap)` when the identity is at its cap.
    pub fn acquire(
        self: &Arc<Self>,
        kind: Kind,
        identity: &str,
        units: usize,
        cap: usize,
    ) -> Result<Option<CapGuard>, AtCap> {
        if cap == 0 {
            return Ok(None);
        }
        let units = units.clamp(1, cap);
        let key = (kind, identity.to_string());
        let mut m = lock(&self.counts);
        let c = m.entry(key.clone()).or_insert(0);
        if *c + units > cap {
            if *c == 0 {
                m.remove(&key);
            }
            return Err(AtCap);
        }
        *c += units;
        Ok(Some(CapGuard {
            caps: self.clone(),
            key,
            units,
        }))
    }

    /// Units in flight for an identity (for tests and metrics).
    pub fn in_flight(&self, kind: Kind, identity: &str) -> usize {
        lock(&self.counts)
            .get(&(kind, identity.to_string()))
            .copied()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_counts_units_and_releases_on_drop() {
        // Proves the cap: units clamp to the cap, refusal at the cap, release on drop, 0 = off.
        let caps = Arc::new(Caps::default());
        let a = caps.acquire(Kind::Consume, "bob", 1, 3).unwrap();
        let b = caps.acquire(Kind::Consume, "bob", 100, 3);
        assert!(
            b.is_err(),
            "a batch of 100 clamps to 3 and does not fit beside 1"
        );
        let b = caps.acquire(Kind::Consume, "bob", 2, 3).unwrap();
        assert!(caps.acquire(Kind::Consume, "bob", 1, 3).is_err());
        assert!(caps.acquire(Kind::Consume, "ann", 1, 3).unwrap().is_some());
        assert!(caps.acquire(Kind::Produce, "bob", 1, 3).unwrap().is_some());
        drop(a);
        assert_eq!(caps.in_flight(Kind::Consume, "bob"), 2);
        drop(b);
        assert_eq!(caps.in_flight(Kind::Consume, "bob"), 0);
        assert!(caps.acquire(Kind::Consume, "bob", 5, 0).unwrap().is_none());
        assert_eq!(
            refusal(Kind::Consume, 1024),
            "too many in-flight consume requests for this identity (limit 1024 per node)"
        );
    }
}
