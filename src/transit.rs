//! Transit wiring: queues the transit records a shard accepts (and those recovery found) and
//! starts one dispatcher per destination shard. The queues, the bounds, the read-your-writes
//! marks and the dispatch policy are `narad_shard::transit`; the node's part of a hand-off (the
//! mesh call to the owner, which appends it like any produce, and what the metadata says) is
//! its `HandOff` implementation here.

use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use narad_io::log::AppendRecord;
use narad_io::rt;
use narad_io::types::{Destination, MemberId, ShardId};

use narad_shard::transit::HandOff;

use crate::node::{Node, StoreError};

/// Starts one dispatcher per shard (this one's own queue only ever holds recovered records of
/// its own partitions, never expected: the layout is fixed per data directory), and queues the
/// transit records recovery found.
pub fn start(node: &Rc<Node>) {
    let t = &node.transit;
    for (hold, rec) in node.host.log().take_recovered_transit() {
        t.push(destination(node, hold.dest, &rec), hold, rec);
    }
    let weak = Rc::downgrade(node);
    node.host.log().on_transit(Box::new(move |hold, rec| {
        if let Some(n) = weak.upgrade() {
            let to = destination(&n, hold.dest, &rec);
            n.transit.push(to, hold, rec);
        }
    }));
    // Test knob: accept through transit but never hand over, so a test can kill the process
    // with records only in the accepting shard's WAL.
    if std::env::var("NARAD_TEST_TRANSIT_PAUSED").is_ok_and(|v| v == "1") {
        return;
    }
    // Test knob: every hand-off starts this late, so a test can see a read wait for it.
    let delay = std::env::var("NARAD_TEST_TRANSIT_DELAY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_millis);
    // Test knob: one hand-off of the process is reported confirmed but never appended (a lost
    // acknowledged message), so the fault harness (tests/harness) is seen to catch a loss.
    let drop_one = std::env::var("NARAD_TEST_DROP_HANDOFF").is_ok_and(|v| v == "1");
    let me = node.member_of(&node.config.node_id);
    let shards = (0..node.shards).map(|d| Destination::Shard(ShardId(d)));
    let members = (0..node.config.peers.len() as u64)
        .map(MemberId)
        .filter(|m| Some(*m) != me)
        .map(Destination::Node);
    for d in shards.chain(members) {
        let node = NodeHandOff(node.clone(), drop_one);
        rt::spawn(async move {
            let n = &node.0;
            n.transit.dispatch(&node, n.host.log(), d, delay).await;
        })
        .detach();
    }
}

/// The queue that takes a transit record for `dest`: its shard, or another member of the
/// cluster. A record naming this node, or a member the configuration no longer has (the peer
/// list changed across a restart), goes to the owner shard of its partition here.
fn destination(node: &Node, dest: Destination, rec: &AppendRecord) -> Destination {
    match dest {
        Destination::Shard(s) if s.0 < node.shards => dest,
        Destination::Node(m)
            if (m.0 as usize) < node.config.peers.len()
                && node.member_of(&node.config.node_id) != Some(m) =>
        {
            dest
        }
        _ => Destination::Shard(node.owner(rec.key)),
    }
}

/// The node's side of a hand-off (`narad_shard::transit::HandOff`): the mesh call to the owner
/// and what the metadata says; the dispatch policy is the shard crate's.
/// The flag is the `NARAD_TEST_DROP_HANDOFF` knob.
struct NodeHandOff(Rc<Node>, bool);

/// Whether the `NARAD_TEST_DROP_HANDOFF` knob already dropped its one hand-off in this process.
static HANDOFF_DROPPED: AtomicBool = AtomicBool::new(false);

impl HandOff for NodeHandOff {
    async fn hand_over(
        &self,
        dest: Destination,
        batch: Vec<AppendRecord>,
    ) -> Result<(), StoreError> {
        if self.1 && !HANDOFF_DROPPED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                shard = self.0.shard.0,
                to = ?dest,
                records = batch.len(),
                "NARAD_TEST_DROP_HANDOFF: hand-off dropped and reported confirmed"
            );
            return Ok(());
        }
        match dest {
            Destination::Shard(s) => self.0.append_one(s, batch).await,
            Destination::Node(m) => self.0.commit_remote(m, batch).await,
        }
    }

    fn vanished(&self) -> impl Fn(&AppendRecord) -> bool + '_ {
        let meta = self.0.meta();
        move |r: &AppendRecord| {
            !meta
                .topics
                .values()
                .any(|m| m.id == r.key.topic && r.key.partition.0 < m.partitions)
        }
    }

    fn owner_stopped(&self) {
        self.0.note_ingress_failure();
    }

    fn stopping(&self) -> bool {
        self.0.shutting_down()
    }

    fn dead(&self, dest: Destination) -> bool {
        matches!(dest, Destination::Node(m) if self.0.member_dead(m))
    }

    fn note_stuck(&self, dest: Destination, stuck: bool) {
        if let Destination::Node(m) = dest {
            self.0.note_stuck(m, stuck);
        }
    }

    async fn reroute(
        &self,
        dest: Destination,
        batch: Vec<AppendRecord>,
    ) -> Result<bool, StoreError> {
        match dest {
            Destination::Node(m) => self.0.reroute(m, batch).await,
            Destination::Shard(_) => Ok(false),
        }
    }
}
