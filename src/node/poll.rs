//! Long-poll wake-ups across shards: a waiting consumer takes a ticket before it looks for work,
//! parks until a commit, nack or expiry on any shard that holds the topic wakes it, and tells the
//! other shards once that it waits; in a cluster, it also asks the other nodes that own
//! partitions of the topic to answer once something may be there on them.

use std::rc::Rc;
use std::time::Duration;

use narad_io::peer::ops;
use narad_io::rt;
use narad_io::types::{MemberId, ShardId, TopicId};

use super::*;

/// Longest a parked long-poll waits before it looks at its client again.
pub const WAIT_SLICE_MS: u64 = 1000;
/// Watches of topics one shard keeps parked on one other node at once: each holds one of the
/// 64 requests that node runs per connection ([`narad_io::peer::serve::SERVE_IN_FLIGHT_PER_CONN`]).
const REMOTE_WATCHES_PER_MEMBER: usize = 8;
/// How much longer than its wait a watch may take to be answered before it is given up.
const TOPIC_WAIT_GRACE_MS: u64 = 2000;

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
    ///
    /// In a cluster, the other nodes owning partitions of the topic are asked to answer once
    /// something may be there on them ([`Node::watch_remote_owners`]), which wakes the waiters
    /// here; a slice that ends while they own some answers true, so that the caller looks again
    /// (a commit there between the caller's look and the watch reaching its owner is not missed
    /// for longer than a slice).
    pub async fn wait_for_work(
        self: &Rc<Self>,
        topic: TopicId,
        deadline_ms: u64,
        ticket: u64,
    ) -> bool {
        let now = now_ms();
        if now >= deadline_ms {
            return false;
        }
        if self.announce_interest(topic, deadline_ms).await {
            // Wake-ups of the other shards reach this one from now on: look again once.
            return true;
        }
        let slice = (deadline_ms - now).min(WAIT_SLICE_MS);
        let remote = self.watch_remote_owners(topic, slice);
        self.park(topic, slice, ticket).await || remote
    }

    /// Tells the other shards, once per wait window, that this shard has long-polls parked on
    /// `topic` (their wake-ups are forwarded here from then on); true when it just did.
    async fn announce_interest(&self, topic: TopicId, deadline_ms: u64) -> bool {
        let needs_announce = self
            .announced
            .borrow()
            .get(&topic)
            .is_none_or(|&u| u < deadline_ms);
        if !needs_announce || self.shards <= 1 {
            return false;
        }
        let until = deadline_ms.max(now_ms() + 1000);
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
        true
    }

    /// Parks for at most `slice_ms` on this shard's wake-ups of `topic` after `ticket`; true
    /// when woken (or shutdown began: a shutdown ends every long-poll at once, answered 204, so
    /// that draining is not held up).
    async fn park(&self, topic: TopicId, slice_ms: u64, ticket: u64) -> bool {
        let notify = self.host.notifier(topic);
        let woken = futures_lite::future::or(notify.notified_since(ticket), self.shutdown.wait());
        rt::timeout(Duration::from_millis(slice_ms), woken)
            .await
            .is_ok()
    }

    /// The other nodes owning partitions of `topic`.
    pub(super) fn remote_members(&self, topic: TopicId) -> Vec<MemberId> {
        let idx = self.remote_owners.borrow();
        let mut out: Vec<MemberId> = Vec::new();
        for m in idx.get(&topic).iter().flat_map(|o| o.iter()).flatten() {
            if !out.contains(m) {
                out.push(*m);
            }
        }
        out
    }

    /// Asks every other live node owning partitions of `topic` to answer within `wait_ms` once
    /// something may be there to consume ([`ops::TOPIC_WAIT`]); an answer "woken" wakes this
    /// shard's long-polls of the topic. One watch per topic and node at a time, and at most
    /// [`REMOTE_WATCHES_PER_MEMBER`] per node: each parks a request on that node's connection.
    /// Returns whether other nodes own partitions of the topic.
    fn watch_remote_owners(self: &Rc<Self>, topic: TopicId, wait_ms: u64) -> bool {
        if self.links.is_none() {
            return false;
        }
        let members = self.remote_members(topic);
        for m in members.iter().copied() {
            {
                let mut w = self.remote_watches.borrow_mut();
                let on_member = w.iter().filter(|(_, x)| *x == m).count();
                if w.contains(&(topic, m))
                    || on_member >= REMOTE_WATCHES_PER_MEMBER
                    || self.member_dead(m)
                {
                    continue;
                }
                w.insert((topic, m));
            }
            let node = self.clone();
            rt::spawn(async move {
                let woken = node.remote_wait(m, topic, wait_ms).await;
                node.remote_watches.borrow_mut().remove(&(topic, m));
                if woken {
                    node.host.wake_local(topic);
                }
            })
            .detach();
        }
        !members.is_empty()
    }

    /// One [`ops::TOPIC_WAIT`] on member `m`: true when it answered "woken".
    async fn remote_wait(&self, m: MemberId, topic: TopicId, wait_ms: u64) -> bool {
        let (Some(links), Some((_, addr))) = (&self.links, self.member_addr(m)) else {
            return false;
        };
        let mut body = Vec::with_capacity(12);
        body.extend_from_slice(&topic.0.to_le_bytes());
        body.extend_from_slice(&(wait_ms as u32).to_le_bytes());
        let within = Duration::from_millis(wait_ms + TOPIC_WAIT_GRACE_MS);
        matches!(
            links.to(&addr).call(ops::TOPIC_WAIT, &body, within).await,
            Ok(b) if b.as_slice() == [1]
        )
    }

    /// Another node has long-polls parked on a topic of which this node owns partitions:
    /// answers `[1]` once something may be there to consume on this node (a wake-up of the
    /// topic on any of its shards), `[0]` when the wait (at most [`WAIT_SLICE_MS`]) ends first.
    pub async fn serve_topic_wait(&self, body: &[u8]) -> Result<Vec<u8>, String> {
        let b: &[u8; 12] = body
            .try_into()
            .map_err(|_| "topic wait: body of 12 bytes expected".to_string())?;
        let topic = TopicId(u64::from_le_bytes(b[..8].try_into().expect("8 bytes")));
        let wait_ms = u64::from(u32::from_le_bytes(b[8..].try_into().expect("4 bytes")))
            .clamp(1, WAIT_SLICE_MS);
        let ticket = self.work_ticket(topic);
        self.announce_interest(topic, now_ms() + wait_ms).await;
        Ok(vec![u8::from(self.park(topic, wait_ms, ticket).await)])
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
