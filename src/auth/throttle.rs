//! The failed-login throttle of API.md §2: a token bucket per existing username (burst
//! [`USER_BURST`], one token back every [`USER_REFILL`]) and a node-wide budget (burst
//! [`NODE_BURST`], [`NODE_REFILL_PER_S`] tokens a second) drawn only by usernames with recent
//! failures. A password check takes a token before it runs; a check that succeeds gives it back,
//! so only failures drain a bucket.
//!
//! Pure state: time is passed in, nothing here sleeps, locks or logs. Buckets that are full
//! again are dropped, so the table holds only usernames with recent failures, and it never holds
//! more than [`USERS_TRACKED_MAX`] of them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Password checks per username before the throttle answers 429.
pub const USER_BURST: f64 = 5.0;
/// One token comes back this often.
pub const USER_REFILL: Duration = Duration::from_secs(12);
/// Node-wide budget of checks for usernames with recent failures.
pub const NODE_BURST: f64 = 32.0;
pub const NODE_REFILL_PER_S: f64 = 4.0;
/// Usernames with a partly drained bucket tracked at once; past it, the fullest are forgotten.
pub const USERS_TRACKED_MAX: usize = 65_536;

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn level(&self, now: Instant, burst: f64, per_s: f64) -> f64 {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        (self.tokens + dt * per_s).min(burst)
    }
}

/// Why a check may not run now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The username's bucket is empty.
    User,
    /// The node-wide budget is empty.
    Node,
}

#[derive(Debug)]
pub struct Throttle {
    users: HashMap<String, Bucket>,
    node: Bucket,
}

fn user_rate() -> f64 {
    1.0 / USER_REFILL.as_secs_f64()
}

impl Throttle {
    pub fn new(now: Instant) -> Throttle {
        Throttle {
            users: HashMap::new(),
            node: Bucket {
                tokens: NODE_BURST,
                at: now,
            },
        }
    }

    /// Takes a token for a password check of `user`. A user with a full bucket never draws on
    /// (nor is refused by) the node budget.
    pub fn take(&mut self, user: &str, now: Instant) -> Result<(), Refused> {
        let level = self
            .users
            .get(user)
            .map_or(USER_BURST, |b| b.level(now, USER_BURST, user_rate()));
        if level < 1.0 {
            return Err(Refused::User);
        }
        if level < USER_BURST {
            let n = self.node.level(now, NODE_BURST, NODE_REFILL_PER_S);
            if n < 1.0 {
                return Err(Refused::Node);
            }
            self.node = Bucket {
                tokens: n - 1.0,
                at: now,
            };
        }
        if self.users.len() >= USERS_TRACKED_MAX && !self.users.contains_key(user) {
            self.forget_full(now);
            if self.users.len() >= USERS_TRACKED_MAX {
                // Still full of drained buckets: forget an arbitrary one rather than grow.
                if let Some(k) = self.users.keys().next().cloned() {
                    self.users.remove(&k);
                }
            }
        }
        self.users.insert(
            user.to_string(),
            Bucket {
                tokens: level - 1.0,
                at: now,
            },
        );
        Ok(())
    }

    /// Gives back the token of a check that succeeded.
    pub fn give_back(&mut self, user: &str, now: Instant) {
        if let Some(b) = self.users.get_mut(user) {
            let level = (b.level(now, USER_BURST, user_rate()) + 1.0).min(USER_BURST);
            if level >= USER_BURST {
                self.users.remove(user);
            } else {
                *b = Bucket {
                    tokens: level,
                    at: now,
                };
            }
        }
    }

    /// True when the user has failed recently (a partly drained bucket).
    pub fn has_recent_failures(&self, user: &str, now: Instant) -> bool {
        self.users
            .get(user)
            .is_some_and(|b| b.level(now, USER_BURST, user_rate()) < USER_BURST)
    }

    fn forget_full(&mut self, now: Instant) {
        self.users
            .retain(|_, b| b.level(now, USER_BURST, user_rate()) < USER_BURST);
    }

    /// Usernames tracked (for tests).
    pub fn tracked(&self) -> usize {
        self.users.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_failures_then_one_per_12s() {
        // Proves the per-user bucket: 5 checks, then refused until 12 s earned one back.
        let t0 = Instant::now();
        let mut th = Throttle::new(t0);
        for _ in 0..5 {
            assert_eq!(th.take("bob", t0), Ok(()));
        }
        assert_eq!(th.take("bob", t0), Err(Refused::User));
        assert_eq!(
            th.take("bob", t0 + Duration::from_secs(11)),
            Err(Refused::User)
        );
        assert_eq!(th.take("bob", t0 + Duration::from_secs(12)), Ok(()));
        assert_eq!(
            th.take("bob", t0 + Duration::from_secs(13)),
            Err(Refused::User)
        );
        // Another user is untouched.
        assert_eq!(th.take("carol", t0), Ok(()));
    }

    #[test]
    fn successes_give_tokens_back() {
        // Proves a successful check does not drain the bucket, and a full bucket is forgotten.
        let t0 = Instant::now();
        let mut th = Throttle::new(t0);
        for _ in 0..20 {
            th.take("ann", t0).unwrap();
            th.give_back("ann", t0);
        }
        assert_eq!(th.tracked(), 0);
        assert!(!th.has_recent_failures("ann", t0));
    }

    #[test]
    fn node_budget_refuses_only_users_with_failures() {
        // Proves the node-wide budget (32 burst, 4/s): users with recent failures draw on it and
        // are refused once it is empty, while a user with a full bucket still gets checked.
        let t0 = Instant::now();
        let mut th = Throttle::new(t0);
        let mut refused_node = 0;
        for i in 0..40 {
            let u = format!("u{i}");
            th.take(&u, t0).unwrap(); // first failure: full bucket, no node draw
        }
        for i in 0..40 {
            let u = format!("u{i}");
            if th.take(&u, t0) == Err(Refused::Node) {
                refused_node += 1;
            }
        }
        assert_eq!(refused_node, 8);
        assert_eq!(th.take("fresh", t0), Ok(()));
        // A second later 4 more checks fit.
        let t1 = t0 + Duration::from_secs(1);
        let ok = (0..8)
            .filter(|i| th.take(&format!("u{i}"), t1).is_ok())
            .count();
        assert_eq!(ok, 4);
    }
}
