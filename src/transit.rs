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
use narad_io::types::{Destination, PartitionKey, ShardId};

use narad_shard::transit::HandOff;

use crate::node::{Node, OwnerError, StoreError};

/// How this node's dispatchers run (test knobs).
#[derive(Clone, Copy)]
struct Knobs {
    /// `NARAD_TEST_TRANSIT_PAUSED=1`: accept through transit but never hand over, so a test can
    /// kill the process with records only in the accepting shard's WAL.
    paused: bool,
    /// `NARAD_TEST_TRANSIT_DELAY_MS`: every hand-off starts this late, so a test can see a read
    /// wait for it.
    delay: Option<Duration>,
    /// `NARAD_TEST_DROP_HANDOFF=1`: one hand-off of the process is reported confirmed but never
    /// appended (a lost acknowledged message), so the fault harness (tests/harness) is seen to
    /// catch a loss.
    drop_one: bool,
}

/// Starts one dispatcher per shard (this one's own queue only ever holds recovered records of
/// its own partitions, never expected: the layout is fixed per data directory) and one per
/// other node as records for it first arrive, and queues the transit records recovery found.
pub fn start(node: &Rc<Node>) {
    let knobs = Knobs {
        paused: std::env::var("NARAD_TEST_TRANSIT_PAUSED").is_ok_and(|v| v == "1"),
        delay: crate::config::test_knob("NARAD_TEST_TRANSIT_DELAY_MS").map(Duration::from_millis),
        drop_one: std::env::var("NARAD_TEST_DROP_HANDOFF").is_ok_and(|v| v == "1"),
    };
    for d in 0..node.shards {
        spawn_dispatcher(node, Destination::Shard(ShardId(d)), knobs);
    }
    for (hold, rec) in node.host.log().take_recovered_transit() {
        queue(node, hold, rec, knobs);
    }
    let weak = Rc::downgrade(node);
    node.host.log().on_transit(Box::new(move |hold, rec| {
        if let Some(n) = weak.upgrade() {
            queue(&n, hold, rec, knobs);
        }
    }));
}

/// Queues a durable transit record, starting the dispatcher of a node met for the first time.
fn queue(node: &Rc<Node>, hold: narad_io::log::TransitHold, rec: AppendRecord, knobs: Knobs) {
    let to = destination(node, hold.dest, &rec);
    if node.transit.push(to, hold, rec) {
        spawn_dispatcher(node, to, knobs);
    }
}

fn spawn_dispatcher(node: &Rc<Node>, dest: Destination, knobs: Knobs) {
    if knobs.paused {
        return;
    }
    let node = NodeHandOff(node.clone(), knobs.drop_one);
    rt::spawn(async move {
        let n = &node.0;
        n.transit
            .dispatch(&node, n.host.log(), dest, knobs.delay)
            .await;
    })
    .detach();
}

/// The queue that takes a transit record for `dest`: its shard, or another node of the
/// cluster. A record naming this node (or another node on a node that is its whole cluster)
/// goes to the owner shard of its partition here.
fn destination(node: &Node, dest: Destination, rec: &AppendRecord) -> Destination {
    match dest {
        Destination::Shard(s) if s.0 < node.shards => dest,
        Destination::Node(m) if !node.config.peers.is_empty() && m != node.me() => dest,
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
            // In a cluster the partition may have moved to another node since the record was
            // accepted: place it again by the metadata of now.
            Destination::Shard(_) if !self.0.config.peers.is_empty() => self.0.append(batch).await,
            Destination::Shard(s) => self.0.append_one(s, batch).await,
            Destination::Node(m) => {
                // "Not the owner" places the records again at once only when this node's
                // metadata agrees they belong elsewhere now (the partition moved); a refusal
                // by a move's destination before its flip is an ordinary failed pass.
                let keys: Vec<PartitionKey> = batch.iter().map(|r| r.key).collect();
                match self.0.commit_remote(m, batch).await {
                    Err(StoreError::Owner(OwnerError::NotOwner))
                        if keys.iter().any(|k| self.0.produce_owner(*k) == Some(m)) =>
                    {
                        Err(StoreError::Failed(format!(
                            "member {:x} does not own the partitions yet",
                            m.0
                        )))
                    }
                    r => r,
                }
            }
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

    async fn confirm_metadata(&self) -> bool {
        self.0.catch_up_meta().await
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
