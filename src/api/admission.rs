//! What a request holds while its body is read and handled: the node's batch-body budget
//! ([`BodyBudget`], API.md §4) and the request's [`BodyHold`] (a unit of its identity's produce
//! cap, batch-body bytes). `crate::service` takes them from the head before the body is read;
//! the produce handler takes the produce-cap unit over.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::auth::caps::CapGuard;
use crate::http::Request;

/// `http.max_batch_body_bytes_in_flight` (API.md §4): bytes of batch bodies over 1 MiB being
/// read at once on the node. One counter shared by every shard, so the limit is the node's
/// whatever shard a connection lands on (a per-shard split refused bodies that fit the node,
/// and could not hold a body larger than one share). Only bodies over 1 MiB touch it, so it is
/// never on a hot path; a compare-and-swap, never a lock.
pub struct BodyBudget {
    remaining: AtomicUsize,
}

impl BodyBudget {
    pub fn new(total_bytes: usize) -> Arc<BodyBudget> {
        Arc::new(BodyBudget {
            remaining: AtomicUsize::new(total_bytes),
        })
    }

    /// Takes `n` bytes if that many remain; they come back when the permit is dropped.
    pub fn try_take(self: &Arc<Self>, n: usize) -> Option<BodyPermit> {
        self.remaining
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| r.checked_sub(n))
            .ok()?;
        Some(BodyPermit {
            budget: self.clone(),
            bytes: n,
        })
    }

    #[cfg(test)]
    fn remaining_bytes(&self) -> usize {
        self.remaining.load(Ordering::Acquire)
    }
}

/// Bytes held from a [`BodyBudget`] while one body is read and handled.
pub struct BodyPermit {
    budget: Arc<BodyBudget>,
    bytes: usize,
}

impl Drop for BodyPermit {
    fn drop(&mut self) {
        self.budget
            .remaining
            .fetch_add(self.bytes, Ordering::AcqRel);
    }
}

/// What a request holds while its body is read and handled: a unit of its identity's produce
/// cap (taken over by the handler, see [`BodyHold::take_produce_slot`]) and batch-body bytes.
pub struct BodyHold {
    produce_slot: Option<CapGuard>,
    budget: Option<BodyPermit>,
}

impl BodyHold {
    pub fn new(produce_slot: Option<CapGuard>, budget: Option<BodyPermit>) -> BodyHold {
        BodyHold {
            produce_slot,
            budget,
        }
    }

    pub fn holds_budget(&self) -> bool {
        self.budget.is_some()
    }

    pub fn hold_budget(&mut self, permit: Option<BodyPermit>) {
        self.budget = permit;
    }

    /// The produce-cap unit taken before the body was read, if any.
    pub fn take_produce_slot(req: &mut Request) -> Option<CapGuard> {
        req.reservation
            .as_mut()?
            .downcast_mut::<BodyHold>()?
            .produce_slot
            .take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_budget_takes_refuses_and_returns() {
        // Proves the node budget admits bodies while bytes remain, refuses one that does not fit
        // (also one larger than the whole budget), and gets the bytes back when a permit drops,
        // from any thread.
        let b = BodyBudget::new(24 << 20);
        let first = b.try_take(10 << 20).expect("fits");
        let second = b.try_take(10 << 20).expect("fits");
        assert!(b.try_take(10 << 20).is_none(), "4 MiB left");
        assert!(BodyBudget::new(2 << 20).try_take(3 << 20).is_none());
        assert_eq!(b.remaining_bytes(), 4 << 20);
        std::thread::spawn(move || drop(first)).join().unwrap();
        assert!(
            b.try_take(10 << 20).is_some(),
            "returned by the other thread"
        );
        drop(second);
        assert_eq!(b.remaining_bytes(), 24 << 20);
    }
}
