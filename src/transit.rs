//! Transit dispatch: hands the transit records a shard accepted (`narad_shard::transit`, where
//! the queues, the bounds and the read-your-writes marks are) to their owner shards.
//!
//! One dispatcher task per destination shard, with at most one hand-off in flight (records reach
//! their owner in accept order). The owner appends a hand-off like any produce (its own group
//! commit); only when it answered are the records released from the accepting shard's WAL. A
//! failed hand-off is retried after a backoff (100 ms doubling to 1 s); records of a topic or
//! partition that no longer exists are dropped and released.

use std::rc::Rc;
use std::time::Duration;

use narad_io::log::AppendRecord;
use narad_io::rt;
use narad_io::types::{Destination, ShardId};

use crate::node::Node;

const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(1);

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
        rt::spawn(dispatch(node.clone(), ShardId(d), delay)).detach();
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

/// Hands `dest`'s queue to `dest`, a batch at a time, until the shard drained it and stops.
async fn dispatch(node: Rc<Node>, dest: ShardId, delay: Option<Duration>) {
    let mut backoff = RETRY_FIRST;
    let t = &node.transit;
    loop {
        let work = t.work(dest);
        let batch = t.next_batch(dest);
        if batch.is_empty() {
            if node.shutting_down() && t.closing() {
                return;
            }
            // Wake at least once a second to notice the end of the shard.
            let _ = rt::timeout(Duration::from_secs(1), work).await;
            continue;
        }
        let n = batch.len();
        if let Some(d) = delay {
            rt::sleep(d).await;
        }
        let r = node.append_one(dest, batch).await;
        match r {
            Ok(()) => {
                backoff = RETRY_FIRST;
                t.finish(node.host.log(), dest, n).await;
            }
            Err(e) => {
                if matches!(e, crate::node::StoreError::Stopped(_)) {
                    // The owner's log stopped: the records stay here until a restart, and the
                    // node takes no more produces (SEMANTICS.md §3.4).
                    node.note_ingress_failure();
                }
                let dropped = drop_vanished(&node, dest).await;
                if dropped > 0 {
                    // Retry at once with what is left.
                    continue;
                }
                tracing::warn!(shard = t.me().0, to = dest.0, records = n, error = ?e, retry_in_ms = backoff.as_millis() as u64, "handing accepted records to their shard failed; retrying");
                rt::sleep(backoff).await;
                backoff = (backoff * 2).min(RETRY_MAX);
            }
        }
    }
}

/// Drops (and releases) the queued records of `dest` whose topic or partition no longer
/// exists in this shard's metadata copy; returns how many.
async fn drop_vanished(node: &Node, dest: ShardId) -> usize {
    let meta = node.meta();
    let t = &node.transit;
    let gone = |r: &AppendRecord| {
        !meta
            .topics
            .values()
            .any(|m| m.id == r.key.topic && r.key.partition.0 < m.partitions)
    };
    let n = t.drop_where(node.host.log(), dest, gone).await;
    if n == 0 {
        return 0;
    }
    tracing::info!(
        shard = t.me().0,
        to = dest.0,
        records = n,
        "accepted records dropped before their hand-off: their topic or partition was deleted"
    );
    n
}
