//! Long-poll wake-ups across shards: a waiting consumer takes a ticket before it looks for work,
//! parks until a commit, nack or expiry on any shard that holds the topic wakes it, and tells the
//! other shards once that it waits.

use std::rc::Rc;
use std::time::Duration;

use narad_io::rt;
use narad_io::types::{ShardId, TopicId};

use super::*;

/// Longest a parked long-poll waits before it looks at its client again.
pub const WAIT_SLICE_MS: u64 = 1000;

impl Node {
    /// Names this moment for [`Node::wait_for_work`]: take it before looking for work, so that
    /// a wake-up that lands while the look is still running (it awaits other shards) is not lost.
    pub fn work_ticket(&self, topic: TopicId) -> u64 {
        self.host.notifier(topic).ticket()
    }

    /// Parks until something may be available for `topic` on any shard (or shutdown began:
    /// answers true): at once when a wake-up came after `ticket` (from [`Node::work_ticket`],
    /// taken before the caller last looked), or when this call first told the other shards of
    /// the waiter (their commits since the look were not forwarded). Else until `deadline_ms`
    /// passes or [`WAIT_SLICE_MS`] went by (false), so that the caller can look at its client
    /// between slices.
    pub async fn wait_for_work(&self, topic: TopicId, deadline_ms: u64, ticket: u64) -> bool {
        let now = now_ms();
        if now >= deadline_ms {
            return false;
        }
        // Tell the other shards once per wait window that this shard has waiters on the topic.
        let needs_announce = self
            .announced
            .borrow()
            .get(&topic)
            .is_none_or(|&u| u < deadline_ms);
        if needs_announce && self.shards > 1 {
            let until = deadline_ms.max(now + 1000);
            self.announced.borrow_mut().insert(topic, until);
            for s in 0..self.shards {
                if s != self.shard.0 {
                    let interest = ShardEvent::Interest {
                        topic,
                        until_ms: until,
                    };
                    let _ = call_shard(&self.mesh, ShardId(s), ShardReq::Event(interest)).await;
                }
            }
            // Wake-ups of the other shards reach this one from now on: look again once.
            return true;
        }
        let notify = self.host.notifier(topic);
        // A shutdown ends every long-poll at once (answered 204), so draining is not held up.
        let woken = futures_lite::future::or(notify.notified_since(ticket), self.shutdown.wait());
        let slice = (deadline_ms - now).min(WAIT_SLICE_MS);
        rt::timeout(Duration::from_millis(slice), woken)
            .await
            .is_ok()
    }

    pub(super) fn note_interest(&self, topic: TopicId, from: ShardId, until_ms: u64) {
        let mut m = self.interest.borrow_mut();
        let v = m.entry(topic).or_default();
        v.retain(|(s, _)| *s != from);
        v.push((from, until_ms));
    }

    /// Forwards a wake-up of `topic` to shards with parked long-polls on it.
    pub fn forward_wake(self: &Rc<Self>, topic: TopicId) {
        let now = now_ms();
        let targets: Vec<ShardId> = {
            let mut m = self.interest.borrow_mut();
            let Some(v) = m.get_mut(&topic) else { return };
            v.retain(|(_, until)| *until > now);
            v.iter().map(|(s, _)| *s).collect()
        };
        for s in targets {
            let mesh = self.mesh.clone();
            rt::spawn(async move {
                let _ = call_shard(&mesh, s, ShardReq::Event(ShardEvent::Wake { topic })).await;
            })
            .detach();
        }
    }
}
