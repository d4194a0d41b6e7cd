//! Partition work routed to its owner: append (direct, or through transit for a single produce),
//! take, release, settle, read and stats. A request over several partitions is split by owner
//! once ([`group_by_owner`]); this shard's part runs here, the others' go over the mesh as a
//! [`PartitionOp`].

use narad_io::log::{AppendRecord, StoredRecord};
use narad_io::rt;
use narad_io::types::{Offset, PartitionId, PartitionKey, ShardId, TopicId};
use narad_shard::host::{Host, Leased, QueueConf, SettleKind};
use narad_shard::route::{self, group_by_owner, OpReply, PartitionOp, Placement};

use super::*;

/// The shard of a placement on this node. Callers that can meet a partition another node owns
/// match on [`Placement`] and forward instead; the others only ever see this node's.
pub(super) fn local_shard(p: Placement) -> ShardId {
    match p {
        Placement::Local(s) => s,
        Placement::Remote(m) => {
            unreachable!("a partition placed on member {} of a one-node cluster", m.0)
        }
    }
}

impl Node {
    /// Where the owner of `key` is: another node of the cluster, or a shard of this one.
    pub fn place(&self, key: PartitionKey) -> Placement {
        match self.remote_owner(key) {
            Some(m) => Placement::Remote(m),
            None => self.router.place(key),
        }
    }

    /// The shard of this node that holds `key` when this node owns it.
    pub fn owner(&self, key: PartitionKey) -> ShardId {
        local_shard(self.router.place(key))
    }

    /// Reserves `n` consecutive turns of the topic's node-wide keyless-produce rotation (one
    /// rotation per topic per node, whichever shard took the request, from a random start:
    /// SEMANTICS.md §5) and returns the first (take it modulo the partition count; the next
    /// ones follow it).
    pub fn round_robin_turns(&self, topic: TopicId, n: u32) -> u32 {
        let mut rr = self.rr.borrow_mut();
        let c = rr.entry(topic).or_insert_with(|| self.wide.rotation(topic));
        c.fetch_add(n, Ordering::Relaxed).wrapping_add(1)
    }

    /// Appends records that may belong to partitions on several shards: one message per owner
    /// shard, all in flight at once; Ok only if every part became durable.
    pub async fn append(&self, records: Vec<AppendRecord>) -> Result<(), StoreError> {
        if self.links.is_some() {
            return self.append_cluster(records).await;
        }
        self.append_here(records).await
    }

    /// A cluster's append: records of partitions other nodes own are made durable here as
    /// transit records (each one local fsync, all in one group commit) and handed over in the
    /// background (CLUSTER.md §4.1); the rest are appended on this node's shards.
    async fn append_cluster(&self, records: Vec<AppendRecord>) -> Result<(), StoreError> {
        // One pass: each record to its owner node's transit (a partition frozen for a move:
        // its destination's, CLUSTER.md §9.3) or to this node's shards.
        let mut remote = Vec::new();
        let mut local = Vec::new();
        for r in records {
            match self.produce_owner(r.key) {
                Some(m) => remote.push((narad_io::types::Destination::Node(m), r)),
                None => local.push(r),
            }
        }
        let there = async {
            if remote.is_empty() {
                return Ok(());
            }
            // One request for them all, whatever their owners: one entry in the group commit.
            self.host
                .log()
                .append_transit_many(remote)
                .await
                .map(|_| ())
                .map_err(route::store_error)
        };
        let here = async {
            if local.is_empty() {
                Ok(())
            } else {
                self.append_here(local).await
            }
        };
        // Both in flight at once: they share the shard's next group commit when this shard
        // owns the local part.
        let (here, there) = futures_lite::future::zip(here, there).await;
        here.and(there)
    }

    /// Appends records of partitions this node owns.
    async fn append_here(&self, records: Vec<AppendRecord>) -> Result<(), StoreError> {
        if let [only] = records.as_slice() {
            let s = self.owner(only.key);
            return self.append_one(s, records).await;
        }
        let mut groups = group_by_owner(records, |r| self.place(r.key));
        if groups.len() == 1 {
            // The common case (a single produce, or a batch on one shard): no extra task.
            let g = groups.pop().expect("one group");
            return self.append_one(local_shard(g.owner), g.items).await;
        }
        // This shard's own part is taken at once, in the call that placed it (a partition move
        // relies on it: see `Host::quiet`); the other shards' parts run as tasks meanwhile.
        let mine = groups
            .iter()
            .position(|g| local_shard(g.owner) == self.shard)
            .map(|i| groups.swap_remove(i).items);
        let tasks: Vec<_> = groups
            .into_iter()
            .map(|g| {
                let host = self.host.clone();
                let mesh = self.mesh.clone();
                let me = self.shard;
                let s = local_shard(g.owner);
                rt::spawn(async move { append_via(&host, &mesh, me, s, g.items).await })
            })
            .collect();
        let mut first_err = match mine {
            Some(items) => self.append_one(self.shard, items).await.err(),
            None => None,
        };
        for t in tasks {
            if let Err(e) = t.await {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Appends records that all belong to partitions of shard `s` (also the transit hand-off).
    pub(crate) async fn append_one(
        &self,
        s: ShardId,
        recs: Vec<AppendRecord>,
    ) -> Result<(), StoreError> {
        append_via(&self.host, &self.mesh, self.shard, s, recs).await
    }

    /// Appends one record (a single produce). A partition of another shard takes transit (see
    /// [`crate::transit`]): one local fsync, and the log hands the record over once durable,
    /// even if this request is dropped meanwhile. When transit is full or closing, or this
    /// shard owns the partition, the record goes straight to its owner.
    pub async fn append_single(&self, rec: AppendRecord) -> Result<(), StoreError> {
        if let Some(m) = self.produce_owner(rec.key) {
            return self.accept_for(m, rec).await;
        }
        let dest = self.owner(rec.key);
        if dest == self.shard || !self.transit.has_room() {
            return self.append(vec![rec]).await;
        }
        self.host
            .log()
            .append_transit(narad_io::types::Destination::Shard(dest), rec)
            .await
            .map(|_| ())
            .map_err(route::store_error)
    }

    /// Leases up to `n` records of a topic, trying this shard's partitions first.
    pub async fn take(
        &self,
        conf: QueueConf,
        partitions: &[PartitionId],
        n: usize,
    ) -> Result<Vec<Leased>, StoreError> {
        // Consumes start at rotating partitions too, on this shard's own cursor: taking turns of
        // the produce rotation would move keyless records out of their round-robin order.
        let start = self.take_start.get().wrapping_add(1);
        self.take_start.set(start);
        let start = start as usize;
        let rotated = (0..partitions.len()).map(|i| partitions[(start + i) % partitions.len()]);
        let mut groups = group_by_owner(rotated, |&partition| {
            self.place(PartitionKey {
                topic: conf.topic,
                partition,
            })
        });
        // This shard's partitions first, then the other shards' in shard order, then other
        // nodes' (CLUSTER.md §5.1: local first, then the remote owners, one at a time).
        groups.sort_by_key(|g| match g.owner {
            Placement::Local(s) => (s != self.shard, u64::from(s.0)),
            Placement::Remote(m) => (true, u64::from(u32::MAX) + m.0),
        });
        // A pinned consume (one partition) answers its owner's failure; a queue consume skips
        // an owner that does not answer.
        let pinned = partitions.len() == 1;
        let mut out = Vec::new();
        for g in groups {
            if out.len() >= n {
                break;
            }
            let want = n - out.len();
            let s = match g.owner {
                Placement::Local(s) => s,
                Placement::Remote(m) => {
                    let take = PartitionOp::Take {
                        conf,
                        partitions: g.items,
                        n: want,
                    };
                    let budget = if pinned {
                        remote::FORWARD_BUDGET
                    } else {
                        remote::PROBE_BUDGET
                    };
                    match self.call_owner(m, &take, budget).await {
                        Ok(OpReply::Taken(Ok(got))) => out.extend(got),
                        Ok(OpReply::Taken(Err(e))) if pinned => return Err(e),
                        Err(e) if pinned => return Err(StoreError::Owner(e)),
                        Ok(OpReply::Taken(Err(e))) => {
                            tracing::debug!(member = m.0, error = ?e, "remote owner could not take")
                        }
                        Err(e) => {
                            tracing::debug!(member = m.0, error = ?e, "remote owner skipped")
                        }
                        Ok(_) => {
                            return Err(StoreError::Failed(
                                "a remote owner answered a take with another kind".into(),
                            ))
                        }
                    }
                    continue;
                }
            };
            let parts = g.items;
            let got = if s == self.shard {
                if !self.host.has_available(conf, &parts) {
                    continue;
                }
                self.host
                    .take(conf, &parts, want)
                    .await
                    .map_err(route::store_error)?
            } else {
                let take = PartitionOp::Take {
                    conf,
                    partitions: parts,
                    n: want,
                };
                match call_shard(&self.mesh, s, ShardReq::Op(take)).await {
                    Ok(ShardResp::Op(OpReply::Taken(r))) => r?,
                    Ok(_) => wrong_reply("Take"),
                    Err(e) => return Err(StoreError::Shard(e)),
                }
            };
            out.extend(got);
        }
        Ok(out)
    }

    /// Gives back leases that could not be delivered.
    pub async fn release(&self, topic: TopicId, items: Vec<Lease>) {
        let groups = group_by_owner(items, |it| {
            self.place(PartitionKey {
                topic,
                partition: it.0,
            })
        });
        for g in groups {
            let s = match g.owner {
                Placement::Local(s) => s,
                Placement::Remote(m) => {
                    // Unanswered, the leases run out at their visibility timeout instead.
                    let release = PartitionOp::Release {
                        topic,
                        items: g.items,
                    };
                    let _ = self.call_owner(m, &release, remote::FORWARD_BUDGET).await;
                    continue;
                }
            };
            let items = g.items;
            if s == self.shard {
                self.host.release(topic, &items);
            } else {
                // Unanswered, the leases run out at their visibility timeout instead.
                let release = PartitionOp::Release { topic, items };
                let _ = call_shard(&self.mesh, s, ShardReq::Op(release)).await;
            }
        }
    }

    /// Settles leases (ack / extend / nack), grouped by owner shard; results in input order.
    pub async fn settle(
        &self,
        conf: QueueConf,
        kind: SettleKind,
        items: &[Lease],
    ) -> Vec<Result<(), SettleFailure>> {
        let mut results: Vec<Option<Result<(), SettleFailure>>> = vec![None; items.len()];
        let groups = group_by_owner(items.iter().copied().enumerate(), |(_, it)| {
            self.place(PartitionKey {
                topic: conf.topic,
                partition: it.0,
            })
        });
        // Other nodes' parts first, all in flight at once (one call per owner, CLUSTER.md §5.3).
        let (remote, groups): (Vec<_>, Vec<_>) = groups
            .into_iter()
            .partition(|g| matches!(g.owner, Placement::Remote(_)));
        let remote: Vec<_> = remote
            .into_iter()
            .map(|g| {
                let Placement::Remote(m) = g.owner else {
                    unreachable!("partitioned on Remote")
                };
                let (idx, its): (Vec<usize>, Vec<Lease>) = g.items.into_iter().unzip();
                let n = its.len();
                let op = PartitionOp::Settle {
                    conf,
                    kind,
                    items: its,
                };
                async move {
                    let rs = match self.call_owner(m, &op, remote::FORWARD_BUDGET).await {
                        Ok(OpReply::Settled(rs)) if rs.len() == n => rs,
                        Ok(_) => vec![
                            Err(SettleFailure::Owner(OwnerError::NoAnswer(
                                "malformed settle reply".into()
                            )));
                            n
                        ],
                        Err(e) => vec![Err(SettleFailure::Owner(e)); n],
                    };
                    (idx, rs)
                }
            })
            .collect();
        let remote_done = futures_util::future::join_all(remote);
        // Every shard's part is in flight at once (a task for each other shard's, the first
        // inline), so a batch ack waits for one group commit, not one per shard.
        let mut groups = groups.into_iter();
        let first = groups.next();
        let rest: Vec<_> = groups
            .map(|g| {
                let (host, mesh, me) = (self.host.clone(), self.mesh.clone(), self.shard);
                let s = local_shard(g.owner);
                let (idx, its): (Vec<usize>, Vec<Lease>) = g.items.into_iter().unzip();
                let task =
                    rt::spawn(
                        async move { settle_via(&host, &mesh, me, s, conf, kind, its).await },
                    );
                (idx, task)
            })
            .collect();
        let mut fill = |idx: Vec<usize>, rs: Vec<Result<(), SettleFailure>>| {
            assert_eq!(
                rs.len(),
                idx.len(),
                "an owner answers every item it settles"
            );
            for (i, r) in idx.into_iter().zip(rs) {
                results[i] = Some(r);
            }
        };
        if let Some(g) = first {
            let s = local_shard(g.owner);
            let (idx, its): (Vec<usize>, Vec<Lease>) = g.items.into_iter().unzip();
            fill(
                idx,
                settle_via(&self.host, &self.mesh, self.shard, s, conf, kind, its).await,
            );
        }
        for (idx, task) in rest {
            fill(idx, task.await);
        }
        for (idx, rs) in remote_done.await {
            fill(idx, rs);
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or(Err(SettleFailure::Gone)))
            .collect()
    }

    pub async fn read_at(
        &self,
        key: PartitionKey,
        offset: Offset,
    ) -> Result<Option<StoredRecord>, ReadFailure> {
        if let Some(m) = self.remote_owner(key) {
            let op = PartitionOp::Read { key, offset };
            return match self.call_owner(m, &op, remote::FORWARD_BUDGET).await {
                Ok(OpReply::Read(r)) => r,
                Ok(_) => Err(ReadFailure::Owner(OwnerError::NoAnswer(
                    "malformed read reply".into(),
                ))),
                Err(e) => Err(ReadFailure::Owner(e)),
            };
        }
        let s = self.owner(key);
        if s == self.shard {
            return self
                .host
                .read_at(key, offset)
                .await
                .map_err(route::read_failure);
        }
        match call_shard(
            &self.mesh,
            s,
            ShardReq::Op(PartitionOp::Read { key, offset }),
        )
        .await
        {
            Ok(ShardResp::Op(OpReply::Read(r))) => r,
            Ok(_) => wrong_reply("Read"),
            Err(e) => Err(ReadFailure::Shard(e)),
        }
    }

    /// Partition stats and queue gauges (in flight, acked ahead, frontier), in input order; a
    /// partition whose owner did not answer reads as empty.
    pub async fn stats(&self, keys: &[PartitionKey]) -> Vec<PartitionGauges> {
        self.stats_by_owner(keys)
            .await
            .into_iter()
            .map(|o| o.unwrap_or_default())
            .collect()
    }

    /// [`Node::stats`] asked of each owner shard once, in input order; `None` for a partition
    /// whose owner did not answer.
    pub async fn stats_by_owner(&self, keys: &[PartitionKey]) -> Vec<Option<PartitionGauges>> {
        let mut out: Vec<Option<PartitionGauges>> = vec![None; keys.len()];
        for g in group_by_owner(keys.iter().copied().enumerate(), |(_, k)| self.place(*k)) {
            let (positions, keys): (Vec<usize>, Vec<PartitionKey>) = g.items.into_iter().unzip();
            let s = match g.owner {
                Placement::Local(s) => s,
                Placement::Remote(m) => {
                    let op = PartitionOp::Stats { keys };
                    if let Ok(OpReply::Stats(rs)) =
                        self.call_owner(m, &op, remote::FORWARD_BUDGET).await
                    {
                        for (i, r) in positions.into_iter().zip(rs) {
                            out[i] = Some(r);
                        }
                    }
                    continue;
                }
            };
            let rs = if s == self.shard {
                route::local_stats(&self.host, &keys)
            } else {
                let stats = PartitionOp::Stats { keys };
                match call_shard(&self.mesh, s, ShardReq::Op(stats)).await {
                    Ok(ShardResp::Op(OpReply::Stats(r))) => r,
                    _ => Vec::new(),
                }
            };
            for (i, r) in positions.into_iter().zip(rs) {
                out[i] = Some(r);
            }
        }
        out
    }
}

async fn append_via(
    host: &Host,
    mesh: &NodeMesh,
    me: ShardId,
    s: ShardId,
    recs: Vec<AppendRecord>,
) -> Result<(), StoreError> {
    if s == me {
        return host
            .append(recs)
            .await
            .map(|_| ())
            .map_err(route::store_error);
    }
    match call_shard(mesh, s, ShardReq::Op(PartitionOp::Append(recs))).await {
        Ok(ShardResp::Op(OpReply::Appended(r))) => r.map(|_| ()),
        Ok(_) => wrong_reply("Append"),
        Err(e) => Err(StoreError::Shard(e)),
    }
}

/// Settles leases on shard `s`: this shard's host directly, another shard's over the mesh. When
/// the shard does not answer, every item fails with [`SettleFailure::Shard`].
async fn settle_via(
    host: &Host,
    mesh: &NodeMesh,
    me: ShardId,
    s: ShardId,
    conf: QueueConf,
    kind: SettleKind,
    items: Vec<Lease>,
) -> Vec<Result<(), SettleFailure>> {
    if s == me {
        let rs = host.settle(conf, kind, &items).await;
        return rs.into_iter().map(route::settle_failure).collect();
    }
    let n = items.len();
    let settle = PartitionOp::Settle { conf, kind, items };
    match call_shard(mesh, s, ShardReq::Op(settle)).await {
        Ok(ShardResp::Op(OpReply::Settled(r))) => r,
        Ok(_) => wrong_reply("Settle"),
        Err(e) => vec![Err(SettleFailure::Shard(e)); n],
    }
}
