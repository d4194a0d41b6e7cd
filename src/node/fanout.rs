//! The fan-out cursors of this shard's parent partitions, kept in step with the metadata, and
//! their lag across shards and, in a cluster, across the nodes owning the parent's partitions.

use std::rc::Rc;

use narad_io::peer::ops;
use narad_io::types::{MemberId, ShardId, TopicId};
use narad_raft::MetaState;
use narad_shard::fanout::{ChildLag, CursorRow, Fanout, Link};

use super::remote::FORWARD_BUDGET;
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
            let me = (!self.config.peers.is_empty()).then_some(self.config.node_id.as_str());
            f.reconcile(&fanout_links(meta, me));
        }
    }

    /// Hands remote links' records to `s` (the binary's shipper to remotes).
    /// Each shard's remote cursors share `remotes.max_held_bytes` equally.
    pub fn set_shipper(&self, s: narad_shard::fanout::Shipper, state_name: fn(u8) -> &'static str) {
        let budget = self.config.remotes.max_held_bytes / u64::from(self.shards.max(1));
        if let Some(f) = self.fanout.borrow().as_ref() {
            f.set_shipper(s, usize::try_from(budget).unwrap_or(usize::MAX), state_name);
        }
    }

    /// Sets what runs another node's remote-child checks here.
    pub fn set_probe_hook(&self, h: super::ProbeHook) {
        *self.probe_hook.borrow_mut() = Some(h);
    }

    /// Serves another node's `REMOTE_PROBE` or `REMOTE_VIEW`.
    pub async fn serve_remote_probe(&self, op: u8, body: &[u8]) -> Result<Vec<u8>, String> {
        let hook = self.probe_hook.borrow().clone();
        match hook {
            Some(h) => h(op, body.to_vec()).await,
            None => Err("remote probes are not served yet".into()),
        }
    }

    /// Asks every other member (alive or not) to run the checks in `ask`: each member's id and
    /// its answer, or why there is none, within `within`.
    pub async fn probe_members(
        &self,
        ask: &[u8],
        within: std::time::Duration,
    ) -> Vec<(String, Result<Vec<u8>, String>)> {
        self.ask_members(ops::REMOTE_PROBE, ask, within).await
    }

    /// Sends `ask` as operation `op` to every other member: each one's id and its answer, or
    /// why there is none, within `within`.
    pub async fn ask_members(
        &self,
        op: u8,
        ask: &[u8],
        within: std::time::Duration,
    ) -> Vec<(String, Result<Vec<u8>, String>)> {
        let Some(links) = &self.links else {
            return Vec::new();
        };
        let me = self.config.node_id.clone();
        let ids: Vec<String> = self
            .meta()
            .members
            .values()
            .map(|m| m.id.clone())
            .filter(|id| *id != me)
            .collect();
        let asks = ids.iter().map(|id| async move {
            let Some((_, addr)) = self.member_addr(MemberId::of(id)) else {
                return (id.clone(), Err(format!("no cluster address for {id}")));
            };
            let r = links
                .to(&addr)
                .call(op, ask, within)
                .await
                .map_err(|e| e.to_string());
            (id.clone(), r)
        });
        futures_util::future::join_all(asks).await
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

    /// Lag per child of `parent`, summed over every shard's cursors and, in a cluster, over the
    /// cursors of every other node owning partitions of the parent (CLUSTER.md §5.4: children
    /// listing asks every parent-partition owner); `false` when some shard or owner did not
    /// answer (the sums are then lower bounds).
    pub async fn fanout_lag(&self, parent: TopicId) -> (Vec<ChildLag>, bool) {
        let (mut all, mut complete) = self.node_fanout_lag(parent).await;
        let owners = self.remote_members(parent);
        let asks = owners
            .into_iter()
            .map(|m| self.remote_fanout_lag(m, parent));
        for answer in futures_util::future::join_all(asks).await {
            match answer {
                Some(v) => merge_lags(&mut all, v),
                None => complete = false,
            }
        }
        (all, complete)
    }

    /// [`Node::fanout_lag`] over this node's shards only.
    async fn node_fanout_lag(&self, parent: TopicId) -> (Vec<ChildLag>, bool) {
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
                Ok(ShardResp::FanoutLag(v)) => merge_lags(&mut all, v),
                _ => complete = false,
            }
        }
        (all, complete)
    }

    /// Member `m`'s lags of `parent`'s children ([`ops::FANOUT_LAG`]); `None` when it did not
    /// answer (or is dead) within [`FORWARD_BUDGET`].
    async fn remote_fanout_lag(&self, m: MemberId, parent: TopicId) -> Option<Vec<ChildLag>> {
        let (Some(links), Some((_, addr))) = (&self.links, self.member_addr(m)) else {
            return None;
        };
        if self.member_dead(m) {
            return None;
        }
        let body = parent.0.to_le_bytes();
        let reply = links
            .to(&addr)
            .call(ops::FANOUT_LAG, &body, FORWARD_BUDGET)
            .await
            .ok()?;
        decode_lags(&reply)
    }

    /// Another node lists the children of a parent of which this node owns partitions: the
    /// lags of this node's cursors (body: the parent's topic id, u64 LE).
    pub async fn serve_fanout_lag(&self, body: &[u8]) -> Result<Vec<u8>, String> {
        let id: [u8; 8] = body
            .try_into()
            .map_err(|_| "fan-out lag: body of 8 bytes expected".to_string())?;
        let (lags, complete) = self.node_fanout_lag(TopicId(u64::from_le_bytes(id))).await;
        if !complete {
            return Err("fan-out lag: a shard of this node did not answer".into());
        }
        Ok(encode_lags(&lags))
    }
}

/// Adds `more` (another shard's or node's cursors) into `all`, per child.
fn merge_lags(all: &mut Vec<ChildLag>, more: Vec<ChildLag>) {
    for l in more {
        match all.iter_mut().find(|a| a.child == l.child) {
            Some(a) => a.merge(&l),
            None => all.push(l),
        }
    }
}

/// Bytes of one lag's fixed part on the wire: child id, lag, cursors, due lag, and the count of
/// cursor rows that follow it (little endian).
const LAG_WIRE_BYTES: usize = 8 + 8 + 4 + 8 + 4;
/// Bytes of one cursor row: partition, next, high watermark, state, blocked (`u64::MAX` for
/// none), last shipped.
const ROW_WIRE_BYTES: usize = 4 + 8 + 8 + 1 + 8 + 8;

fn encode_lags(lags: &[ChildLag]) -> Vec<u8> {
    let mut out = Vec::new();
    for l in lags {
        out.extend_from_slice(&l.child.0.to_le_bytes());
        out.extend_from_slice(&l.lag_messages.to_le_bytes());
        out.extend_from_slice(&l.cursors.to_le_bytes());
        out.extend_from_slice(&l.due_lag_ms.to_le_bytes());
        out.extend_from_slice(&(l.rows.len() as u32).to_le_bytes());
        for r in &l.rows {
            out.extend_from_slice(&r.partition.to_le_bytes());
            out.extend_from_slice(&r.next.to_le_bytes());
            out.extend_from_slice(&r.high_watermark.to_le_bytes());
            out.push(r.state);
            out.extend_from_slice(&r.blocked_at.unwrap_or(u64::MAX).to_le_bytes());
            out.extend_from_slice(&r.last_ok_ms.to_le_bytes());
        }
    }
    out
}

/// The lags [`encode_lags`] wrote; `None` for bytes that do not parse as them.
fn decode_lags(mut b: &[u8]) -> Option<Vec<ChildLag>> {
    let u64_at = |c: &[u8], i: usize| u64::from_le_bytes(c[i..i + 8].try_into().expect("8"));
    let u32_at = |c: &[u8], i: usize| u32::from_le_bytes(c[i..i + 4].try_into().expect("4"));
    let mut out = Vec::new();
    while !b.is_empty() {
        let c = b.get(..LAG_WIRE_BYTES)?;
        let n = u32_at(c, 28) as usize;
        let rows_len = n.checked_mul(ROW_WIRE_BYTES)?;
        let rows_bytes = b.get(LAG_WIRE_BYTES..LAG_WIRE_BYTES.checked_add(rows_len)?)?;
        out.push(ChildLag {
            child: TopicId(u64_at(c, 0)),
            lag_messages: u64_at(c, 8),
            cursors: u32_at(c, 16),
            due_lag_ms: u64_at(c, 20),
            rows: rows_bytes
                .chunks_exact(ROW_WIRE_BYTES)
                .map(|r| {
                    let blocked = u64_at(r, 21);
                    CursorRow {
                        partition: u32_at(r, 0),
                        next: u64_at(r, 4),
                        high_watermark: u64_at(r, 12),
                        state: r[20],
                        blocked_at: (blocked != u64::MAX).then_some(blocked),
                        last_ok_ms: u64_at(r, 29),
                    }
                })
                .collect(),
        });
        b = &b[LAG_WIRE_BYTES + rows_len..];
    }
    Some(out)
}

/// The fan-out links of the metadata, as the cursors need them. In a cluster (`me` is this
/// node's id) only the parent partitions this node owns get cursors here: the others are
/// copied by their owners.
fn fanout_links(meta: &MetaState, me: Option<&str>) -> Vec<Link> {
    meta.topics
        .values()
        .filter_map(|c| {
            let p = meta.topic(c.parent.as_deref()?)?;
            let parent_owned = match me {
                Some(me) if !p.owners.is_empty() => (0..p.partitions)
                    .map(|i| p.owner_of(i) == Some(me))
                    .collect(),
                _ => Vec::new(),
            };
            Some(Link {
                parent: p.id,
                parent_partitions: p.partitions,
                parent_owned,
                child: c.id,
                child_partitions: c.partitions,
                epoch: narad_shard::fanout::epoch_from_hex(c.attach_epoch.as_deref()?),
                delay_ms: c.fanout_delay_ms,
                attach_offsets: c.attach_offsets.clone(),
                remote: c.remote.as_ref().map(|r| narad_shard::fanout::RemoteLink {
                    paused: r.paused,
                    skip: r.skip.clone(),
                }),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lags_with_cursor_rows_round_trip_on_the_wire() {
        let row = |p: u32, blocked: Option<u64>| CursorRow {
            partition: p,
            next: 10 + u64::from(p),
            high_watermark: 20,
            state: u8::from(blocked.is_some()) * 5,
            blocked_at: blocked,
            last_ok_ms: 1_790_000_000_000,
        };
        let lags = vec![
            ChildLag {
                child: TopicId(7),
                lag_messages: 3,
                cursors: 2,
                due_lag_ms: 9,
                rows: vec![row(0, None), row(1, Some(11))],
            },
            ChildLag {
                child: TopicId(8),
                lag_messages: 0,
                cursors: 1,
                due_lag_ms: 0,
                rows: Vec::new(),
            },
        ];
        let worst = lags[0].worst().expect("a stuck row");
        assert_eq!((worst.partition, worst.blocked_at), (1, Some(11)));
        assert_eq!(lags[0].last_ok_ms(), 1_790_000_000_000);
        assert_eq!((lags[1].worst(), lags[1].last_ok_ms()), (None, 0));
        let wire = encode_lags(&lags);
        assert_eq!(decode_lags(&wire), Some(lags));
        assert_eq!(decode_lags(&wire[..wire.len() - 1]), None, "a cut row");
        assert_eq!(decode_lags(&[]), Some(Vec::new()));
    }
}
