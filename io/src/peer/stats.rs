//! Counts of the node-to-node requests this thread sent (`narad_cluster_rpc_requests_total` and
//! `narad_cluster_rpc_request_seconds`, OPERATIONS.md §9.6): per operation code, how each ended
//! and how long it took.
//!
//! Owns: the outcome classes and the per-thread tally [`PeerLink::call`](super::PeerLink::call)
//! records into. One tally per thread (a shard is one thread and sends only from it), read by
//! that shard's metrics snapshot: nothing is shared between shards. A call whose caller gave
//! up before it ended (its future dropped) is not counted.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Duration;

use super::PeerError;
use crate::stats::Durations;

/// How a request ended, in the order of [`Outcome::LABELS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Answered.
    Ok,
    /// The peer answered with a refusal (an error of the operation, or an operation it does not
    /// know).
    Rejected,
    /// Never sent: no connection, the backoff, the in-flight bound or the frame limit.
    Failed,
    /// No answer within the deadline.
    Timeout,
    /// The connection broke after the request left: whether it ran is unknown.
    Error,
}

impl Outcome {
    /// The `outcome` label values, indexed by `Outcome as usize`.
    pub const LABELS: [&'static str; 5] = ["ok", "rejected", "failed", "timeout", "error"];

    pub fn of(r: &Result<Vec<u8>, PeerError>) -> Outcome {
        match r {
            Ok(_) => Outcome::Ok,
            Err(PeerError::Remote(_) | PeerError::Unsupported) => Outcome::Rejected,
            Err(PeerError::Unreachable(_)) => Outcome::Failed,
            Err(PeerError::Timeout) => Outcome::Timeout,
            Err(PeerError::Lost(_)) => Outcome::Error,
        }
    }
}

/// One operation's requests from this thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpStats {
    /// Requests per outcome, indexed by `Outcome as usize`.
    pub outcomes: [u64; 5],
    /// Time from the call to its end, whatever the outcome.
    pub seconds: Durations,
}

thread_local! {
    static TALLY: RefCell<BTreeMap<u8, OpStats>> = const { RefCell::new(BTreeMap::new()) };
}

/// Counts one request of operation `op` that ended with `outcome` after `took`.
pub fn record(op: u8, outcome: Outcome, took: Duration) {
    TALLY.with(|t| {
        let mut t = t.borrow_mut();
        let s = t.entry(op).or_default();
        s.outcomes[outcome as usize] += 1;
        s.seconds.record(took);
    });
}

/// What this thread has sent so far, per operation code.
pub fn snapshot() -> Vec<(u8, OpStats)> {
    TALLY.with(|t| t.borrow().iter().map(|(op, s)| (*op, *s)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_and_durations_are_tallied_per_operation() {
        // Proves the tally: each call lands under its own operation and outcome, with its
        // duration in the histogram; the error classes map as documented.
        record(9, Outcome::of(&Ok(Vec::new())), Duration::from_micros(300));
        record(
            9,
            Outcome::of(&Err(PeerError::Timeout)),
            Duration::from_secs(2),
        );
        record(
            8,
            Outcome::of(&Err(PeerError::Remote("not the owner".into()))),
            Duration::from_millis(1),
        );
        record(8, Outcome::of(&Err(PeerError::Unsupported)), Duration::ZERO);
        record(
            8,
            Outcome::of(&Err(PeerError::Unreachable("down".into()))),
            Duration::ZERO,
        );
        record(
            8,
            Outcome::of(&Err(PeerError::Lost("reset".into()))),
            Duration::ZERO,
        );
        let s = snapshot();
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].0, s[0].1.outcomes), (8, [0, 2, 1, 0, 1]));
        assert_eq!((s[1].0, s[1].1.outcomes), (9, [1, 0, 0, 1, 0]));
        assert_eq!(s[1].1.seconds.count(), 2);
        assert_eq!(s[1].1.seconds.sum_us, 2_000_300);
    }
}
