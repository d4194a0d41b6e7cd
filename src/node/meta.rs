//! This shard's copy of the metadata and the ways it changes: proposals (to shard 0, which hosts
//! Raft), the snapshot pushed to every shard before a change is answered, and the start-up
//! purge of deleted topics' data.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use narad_io::rt;
use narad_io::types::{PartitionKey, ShardId, TopicId};
use narad_raft::{MetaCommand, MetaResponse, MetaState, ProposeError, TopicMeta};

use super::*;

/// Longest a read barrier waits (see [`Node::catch_up_meta`]).
const CATCH_UP_WAIT: Duration = Duration::from_secs(1);

/// Longest start-up waits for the metastore log to be applied before purging deleted topics.
const PURGE_APPLY_WAIT: Duration = Duration::from_secs(10);

impl Node {
    /// The Raft gauges, on the shard that hosts the metadata group.
    pub fn raft_gauges(&self) -> Option<narad_raft::RaftGauges> {
        self.meta_node.as_ref().map(|m| m.gauges())
    }

    /// Shard 0 only: the Raft state machine's current snapshot.
    pub fn meta_node_state(&self) -> Option<Arc<MetaState>> {
        self.meta_node.as_ref().map(|m| m.state())
    }

    pub async fn shutdown_meta(&self) {
        if let Some(m) = &self.meta_node {
            m.shutdown().await;
        }
    }

    pub fn meta(&self) -> Arc<MetaState> {
        self.meta.borrow().clone()
    }

    pub fn topic(&self, name: &str) -> Option<TopicMeta> {
        self.meta.borrow().topic(name).cloned()
    }

    /// Installs a new metadata snapshot on this shard and drops the data of deleted topics.
    pub fn install_meta(self: &Rc<Self>, new: Arc<MetaState>) {
        let old = std::mem::replace(&mut *self.meta.borrow_mut(), new.clone());
        if old.applied_index > new.applied_index {
            // Never go back in time.
            *self.meta.borrow_mut() = old;
            return;
        }
        self.reconcile_fanout(&new);
        self.index_owners(&new);
        self.index_frozen(&new);
        self.reconcile_moves(&new);
        let live: std::collections::HashMap<TopicId, &TopicMeta> =
            new.topics.values().map(|t| (t.id, t)).collect();
        for t in old.topics.values() {
            // Long-polls parked here look again at a topic that was deleted or altered (caps,
            // partitions, visibility): they answer 404, or take under the new values.
            match live.get(&t.id) {
                Some(&n) if n == t => {}
                _ => self.host.wake_local(t.id),
            }
            if !live.contains_key(&t.id) {
                let id = t.id;
                let me = self.clone();
                rt::spawn(async move {
                    if let Err(e) = me.host.drop_topic(id).await {
                        tracing::error!(topic = %id, error = %e, "deleting topic data failed");
                    }
                })
                .detach();
            }
        }
    }

    /// The committed high watermark of each partition (a fan-out attach point); `None` when an
    /// owner did not answer.
    pub async fn high_watermarks(&self, keys: &[PartitionKey]) -> Option<Vec<u64>> {
        self.stats_by_owner(keys)
            .await
            .into_iter()
            .map(|o| o.map(|r| r.0.high_watermark.0))
            .collect()
    }

    /// Proposes a metadata change through shard 0; answers once every shard installed it.
    pub async fn propose(self: &Rc<Self>, cmd: MetaCommand) -> Result<MetaResponse, ProposeError> {
        if self.shard.0 == 0 {
            return self.propose_here(cmd).await;
        }
        match call_shard(
            &self.mesh,
            ShardId(0),
            ShardReq::Control(ShardControl::Propose(Box::new(cmd))),
        )
        .await
        {
            Ok(ShardResp::Proposed(r)) => *r,
            Ok(_) => wrong_reply("Propose"),
            // Shard 0 may still apply it.
            Err(e @ ShardCallError::Timeout { .. }) => {
                Err(ProposeError::Indeterminate(e.to_string()))
            }
            Err(ShardCallError::Gone { .. }) => Err(ProposeError::NoLeader { leader: None }),
        }
    }

    /// Serves another node's request for the metadata group (on shard 0, which hosts it; other
    /// shards hand it there).
    pub async fn serve_meta_rpc(&self, from: &str, op: u8, body: &[u8]) -> Result<Vec<u8>, String> {
        if let Some(mn) = &self.meta_node {
            return mn.serve_rpc(from, op, body).await;
        }
        let req = ShardReq::Control(ShardControl::PeerRpc {
            from: from.to_string(),
            op,
            body: body.to_vec(),
        });
        match call_shard(&self.mesh, ShardId(0), req).await {
            Ok(ShardResp::PeerRpc(r)) => r,
            Ok(_) => wrong_reply("PeerRpc"),
            Err(e) => Err(e.to_string()),
        }
    }

    /// A cluster node's read barrier, for a name this shard's metadata does not know (a topic or
    /// user created through another node a moment ago: reads are local, CLUSTER.md §3): catches
    /// this node's replica up with the leader and waits until this shard installed that state.
    /// At most one second; a node that is its whole cluster returns at once. False when the
    /// leader could not be reached (this replica may be stale: a cut-off node).
    pub async fn catch_up_meta(self: &Rc<Self>) -> bool {
        if self.config.peers.is_empty() {
            return true;
        }
        let index = if self.shard.0 == 0 {
            self.catch_up_here().await
        } else {
            match call_shard(
                &self.mesh,
                ShardId(0),
                ShardReq::Control(ShardControl::CatchUp),
            )
            .await
            {
                Ok(ShardResp::CaughtUp(i)) => i,
                Ok(_) => wrong_reply("CatchUp"),
                Err(_) => None,
            }
        };
        let Some(index) = index else { return false };
        let t0 = std::time::Instant::now();
        while self.meta().applied_index < index && t0.elapsed() < CATCH_UP_WAIT {
            rt::sleep(Duration::from_millis(2)).await;
        }
        self.meta().applied_index >= index
    }

    /// Shard 0: [`Node::catch_up_meta`]'s Raft part, then the push to every shard.
    pub(super) async fn catch_up_here(self: &Rc<Self>) -> Option<u64> {
        let mn = self.meta_node.clone()?;
        let index = mn.catch_up(CATCH_UP_WAIT).await?;
        let st = mn.state();
        if st.applied_index > self.meta().applied_index {
            self.broadcast_meta(st).await;
        }
        Some(index)
    }

    /// Shard 0 of a cluster: pushes every state the metadata group applies to every shard (the
    /// changes other nodes made arrive through Raft, not through a proposal here), at most one
    /// push at a time and always the newest state; and keeps the node-wide leader-contact time
    /// current for readiness. Runs until shutdown.
    pub fn follow_metadata(self: &Rc<Self>) {
        let Some(mn) = self.meta_node.clone() else {
            return;
        };
        self.run_membership();
        // A graceful stop hands metadata leadership over at once, so writes go on through the
        // drain (the group itself stops last, in `shutdown_meta`).
        let (mn2, stop) = (mn.clone(), self.shutdown.clone());
        rt::spawn(async move {
            stop.wait().await;
            if mn2.is_leader() {
                mn2.transfer_leadership(Duration::from_secs(2)).await;
            }
        })
        .detach();
        let news = Rc::new(rt::Notify::new());
        let n2 = news.clone();
        mn.subscribe(Box::new(move |_| n2.notify_waiters()));
        let me = self.clone();
        let mn2 = mn.clone();
        rt::spawn(async move {
            let mut pushed = me.meta().applied_index;
            while !me.shutting_down() {
                let ticket = news.ticket();
                let st = mn2.state();
                if st.applied_index > pushed {
                    pushed = st.applied_index;
                    me.broadcast_meta(st).await;
                    continue;
                }
                futures_lite::future::or(news.notified_since(ticket), async {
                    rt::sleep(Duration::from_millis(500)).await;
                })
                .await;
            }
        })
        .detach();
        let me = self.clone();
        rt::spawn(async move {
            while !me.shutting_down() {
                if let Some(t) = mn.last_leader_contact() {
                    let age = t.elapsed().as_millis() as u64;
                    me.wide.note_leader_contact(
                        narad_shard::host::now_ms().saturating_sub(age).max(1),
                    );
                }
                rt::sleep(Duration::from_millis(250)).await;
            }
        })
        .detach();
    }

    pub(super) async fn propose_here(
        self: &Rc<Self>,
        cmd: MetaCommand,
    ) -> Result<MetaResponse, ProposeError> {
        let mn = self
            .meta_node
            .as_ref()
            .ok_or(ProposeError::NoLeader { leader: None })?;
        let (_index, resp) = mn.propose(cmd).await?;
        let state = mn.state();
        self.broadcast_meta(state).await;
        Ok(resp)
    }

    /// Pushes a snapshot to every shard (this one included) and waits until all installed it.
    pub async fn broadcast_meta(self: &Rc<Self>, state: Arc<MetaState>) {
        self.install_meta(state.clone());
        self.tell_other_shards(|| ShardReq::Event(ShardEvent::Meta(state.clone())))
            .await;
    }

    /// Start-up (shard 0, once every shard has the metadata): drops the data of topics deleted
    /// while the node was down or whose deletion a crash cut short (SEMANTICS.md §14.3: "a node
    /// that was down purges on start, only after the leader confirms the topic (incarnation) is
    /// gone"). This node's Raft group is that leader; it confirms once the whole metastore log is
    /// applied. Skipped, with a warning, when the metastore was empty at this start: its state
    /// says nothing about what the data directory held. Each shard removes its own partitions;
    /// the emptied topic directories go last, here.
    pub async fn purge_deleted_topics(self: &Rc<Self>) {
        let Some(meta_node) = self.meta_node.clone() else {
            return;
        };
        let live = self.meta().topic_ids();
        let dirs = narad_io::partition::topic_dir_ids(&self.config.data_dir, usize::MAX);
        if dirs.iter().all(|id| live.contains(id)) {
            return;
        }
        if !self.config.peers.is_empty() {
            // CLUSTER.md §3: a cluster node destroys data only once caught up and confirmed by
            // the leader; this build keeps it.
            tracing::warn!(
                "topic data of topics this replica does not know is kept (a cluster node never purges on its own view)"
            );
            return;
        }
        if meta_node.started_fresh() {
            tracing::warn!(
                "the metastore was empty at this start but the data directory holds topic data; kept, since nothing confirms those topics were deleted"
            );
            return;
        }
        if !meta_node.applied_through_log(PURGE_APPLY_WAIT).await {
            tracing::warn!("metadata not fully applied in time: deleted topics' data not purged");
            return;
        }
        self.purge_deleted_here().await;
        self.tell_other_shards(|| ShardReq::Control(ShardControl::PurgeDeleted))
            .await;
        // Topic directories every shard emptied, or left empty by a crash mid-delete.
        let live = self.meta().topic_ids();
        for id in narad_io::partition::topic_dir_ids(&self.config.data_dir, usize::MAX) {
            if !live.contains(&id) {
                let dir = narad_io::partition::topic_dir(&self.config.data_dir, id);
                if let Err(e) = std::fs::remove_dir(&dir) {
                    tracing::warn!(topic = %id, error = %e, "deleted topic's directory not removed");
                }
            }
        }
    }

    /// Drops this shard's partitions of topics its metadata copy does not have.
    pub(super) async fn purge_deleted_here(self: &Rc<Self>) {
        let live = self.meta().topic_ids();
        let gone: std::collections::BTreeSet<TopicId> = self
            .host
            .log()
            .partitions()
            .into_iter()
            .map(|k| k.topic)
            .filter(|t| !live.contains(t))
            .collect();
        for id in gone {
            tracing::warn!(topic = %id, "purging the data of a topic deleted before this start");
            if let Err(e) = self.host.drop_topic(id).await {
                tracing::error!(topic = %id, error = %e, "deleting topic data failed");
            }
        }
    }
}
