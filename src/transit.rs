//! Transit wiring: queues the transit records a shard accepts (and those recovery found) and
//! starts one dispatcher per destination shard. The queues, the bounds, the read-your-writes
//! marks and the dispatch policy are `narad_shard::transit`; the node's part of a hand-off (the
//! mesh call to the owner, which appends it like any produce, and what the metadata says) is
//! its `HandOff` implementation here.

use std::rc::Rc;
use std::time::Duration;

use narad_io::log::AppendRecord;
use narad_io::rt;
use narad_io::types::{Destination, ShardId};

use narad_shard::transit::HandOff;

use crate::node::{Node, StoreError};

/// Starts one dispatcher per shard (this one's own queue only ever holds recovered records of
/// its own partitions, never expected: the layout is fixed per data directory), and queues the
/// transit records recovery found.
pub fn start(node: &Rc<Node>) {
    let t = &node.transit;
    for (hold, rec) in node.host.log().take_recovered_transit() {
        t.push(dest_shard(node, hold.dest, &rec), hold, rec);
    }
    let weak = Rc::downgrade(node);
    node.host.log().on_transit(Box::new(move |hold, rec| {
        if let Some(n) = weak.upgrade() {
            let to = dest_shard(&n, hold.dest, &rec);
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
    for d in 0..node.shards {
        let node = NodeHandOff(node.clone());
        rt::spawn(async move {
            let n = &node.0;
            n.transit
                .dispatch(&node, n.host.log(), ShardId(d), delay)
                .await;
        })
        .detach();
    }
}

/// The shard whose queue takes a transit record for `dest`. A node is its whole cluster today,
/// so a record naming another node (only a cluster build writes them) goes to the owner
/// shard of its partition here.
fn dest_shard(node: &Node, dest: Destination, rec: &AppendRecord) -> ShardId {
    match dest {
        Destination::Shard(s) if s.0 < node.shards => s,
        _ => node.owner(rec.key),
    }
}

/// The node's side of a hand-off (`narad_shard::transit::HandOff`): the mesh call to the owner
/// and what the metadata says; the dispatch policy is the shard crate's.
struct NodeHandOff(Rc<Node>);

impl HandOff for NodeHandOff {
    fn hand_over(
        &self,
        dest: ShardId,
        batch: Vec<AppendRecord>,
    ) -> impl std::future::Future<Output = Result<(), StoreError>> {
        self.0.append_one(dest, batch)
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
}
