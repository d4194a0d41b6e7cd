//! The fan-out cursors of this shard's parent partitions, kept in step with the metadata, and
//! their lag across shards.

use std::rc::Rc;

use narad_io::types::{ShardId, TopicId};
use narad_raft::MetaState;
use narad_shard::fanout::{ChildLag, Fanout, Link};

use super::*;

impl Node {
    /// Starts this shard's fan-out cursors (call once, after the first metadata install).
    /// Copies go through [`Node::append`], the produce path, so a child partition may live on
    /// any shard (and, later, any node).
    pub fn start_fanout(self: &Rc<Self>) {
        let weak = Rc::downgrade(self);
        let sink: narad_shard::fanout::Sink = Rc::new(move |recs| {
            let weak = weak.clone();
            Box::pin(async move {
                let Some(node) = weak.upgrade() else {
                    return Err("node stopped".to_string());
                };
                node.append(recs).await.map_err(|e| format!("{e:?}"))
            })
        });
        let f = Fanout::new(
            self.shard,
            self.shards,
            &self.config.data_dir,
            self.host.log().clone(),
            sink,
            crate::wire::key_partition,
            self.config.fanout,
        );
        *self.fanout.borrow_mut() = Some(f);
        let meta = self.meta();
        self.reconcile_fanout(&meta);
    }

    pub(super) fn reconcile_fanout(&self, meta: &MetaState) {
        let f = self.fanout.borrow().clone();
        if let Some(f) = f {
            f.reconcile(&fanout_links(meta));
        }
    }

    /// Stops the fan-out cursors and writes their positions (graceful shutdown).
    pub async fn close_fanout(&self) {
        let f = self.fanout.borrow().clone();
        if let Some(f) = f {
            f.close().await;
        }
    }

    /// This shard's fan-out counters (copied, dropped, unreadable, failed copies).
    pub fn fanout_counters(&self) -> narad_shard::fanout::FanoutCounters {
        let f = self.fanout.borrow().clone();
        f.map(|f| f.counters()).unwrap_or_default()
    }

    /// Lag per child of `parent` over this shard's cursors only (the lag route sums the shards;
    /// `/metrics` takes [`Node::fanout_metrics`]).
    pub(crate) fn local_fanout_lag(&self, parent: TopicId) -> Vec<ChildLag> {
        let f = self.fanout.borrow().clone();
        f.map(|f| f.lag(parent)).unwrap_or_default()
    }

    /// This shard's fan-out cursor lags and per-link counts, for `/metrics`.
    pub(crate) fn fanout_metrics(
        &self,
    ) -> (
        Vec<narad_shard::fanout::PartitionLag>,
        Vec<(TopicId, TopicId, narad_shard::fanout::LinkCounts)>,
    ) {
        let f = self.fanout.borrow().clone();
        f.map(|f| (f.partition_lags(), f.link_counts()))
            .unwrap_or_default()
    }

    /// Lag per child of `parent`, summed over every shard's cursors; `false` when some shard did
    /// not answer (the sums are then lower bounds).
    pub async fn fanout_lag(&self, parent: TopicId) -> (Vec<ChildLag>, bool) {
        let mut all = self.local_fanout_lag(parent);
        let mut complete = true;
        for s in 0..self.shards {
            if s == self.shard.0 {
                continue;
            }
            match call_shard(
                &self.mesh,
                ShardId(s),
                ShardReq::Control(ShardControl::FanoutLag { parent }),
            )
            .await
            {
                Ok(ShardResp::FanoutLag(v)) => {
                    for l in v {
                        match all.iter_mut().find(|a| a.child == l.child) {
                            Some(a) => {
                                a.lag_messages += l.lag_messages;
                                a.cursors += l.cursors;
                                a.due_lag_ms = a.due_lag_ms.max(l.due_lag_ms);
                            }
                            None => all.push(l),
                        }
                    }
                }
                _ => complete = false,
            }
        }
        (all, complete)
    }
}

/// The fan-out links of the metadata, as the cursors need them.
fn fanout_links(meta: &MetaState) -> Vec<Link> {
    meta.topics
        .values()
        .filter_map(|c| {
            let p = meta.topic(c.parent.as_deref()?)?;
            Some(Link {
                parent: p.id,
                parent_partitions: p.partitions,
                child: c.id,
                child_partitions: c.partitions,
                epoch: narad_shard::fanout::epoch_from_hex(c.attach_epoch.as_deref()?),
                delay_ms: c.fanout_delay_ms,
                attach_offsets: c.attach_offsets.clone(),
            })
        })
        .collect()
}
