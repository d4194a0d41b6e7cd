//! Partition moves on this node (CLUSTER.md §9.3), destination-driven: a worker on the shard
//! that will own the partition copies the source's segments over the cluster port while produce
//! goes on (`MOVE_MANIFEST`, `MOVE_CHUNK`), freezes the source through Raft, copies the static
//! tail with the consumer frontier, installs the copy and flips the owner by compare-and-swap.
//! Also the source's side: answering those calls, refusing commits of a frozen partition (they
//! wait as transit records for the new owner), and reclaiming copies that moved away.
//!
//! Safety: the final copy is taken only after the source's owner shard sees the freeze in its
//! metadata and has no append of the partition on its way, so the copy holds every record the
//! source ever acknowledged for it; the flip names the freeze's token, so a freeze that expired
//! (after which the source commits again) can never be flipped over. A copy that fails to
//! recover to the source's high watermark is never flipped to.

use std::collections::HashMap;
use std::rc::Rc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use narad_io::log::{MoveManifest, MoveStage, Settled};
use narad_io::peer::ops;
use narad_io::rt;
use narad_io::types::{MemberId, Offset, PartitionId, PartitionKey, TopicId, UnixMillis};
use narad_raft::{MetaCommand, MetaErrorKind, MetaState, ProposeError};
use serde::{Deserialize, Serialize};

use super::*;

/// Bytes of one `MOVE_CHUNK` answer: one chunk in flight per move, at most
/// [`narad_raft::moves::MAX_IN_FLIGHT_MOVES`] moves, so copies hold at most 8 MiB in flight.
pub const MOVE_CHUNK_BYTES: usize = 1 << 20;
/// Copy rate of one move (bytes per second), so that a move does not starve produce and consume.
pub const MOVE_RATE_BYTES_PER_S: u64 = 128 << 20;
/// Catch-up passes before the freeze (CLUSTER.md §9.3 step 1), and their spacing.
const CATCH_UP_PASSES_MAX: u32 = 20;
const CATCH_UP_PASS_GAP: Duration = Duration::from_millis(50);
/// A pass that copied at most this much is close enough to freeze.
const CATCH_UP_LAG_BYTES: u64 = 256 << 10;
/// How long the source's owner shard may take to see the freeze and finish the appends on
/// their way before it answers the final manifest.
const FREEZE_SETTLE_WAIT: Duration = Duration::from_secs(5);
/// Budget of a manifest or chunk call.
const MOVE_CALL_BUDGET: Duration = Duration::from_secs(10);
/// A freeze the leader sees for longer than this ends (the destination died or stalled).
pub const FREEZE_TTL: Duration = Duration::from_secs(15);
/// A source marked dead this long lets a destination whose copy is complete promote itself
/// (CLUSTER.md §9.3 step 6; `NARAD_TEST_FORCE_PROMOTE_MS` shortens it for tests).
pub const FORCE_PROMOTE_AFTER_MS: u64 = 120_000;
/// Longest pause between attempts of a failing move.
const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// What a move worker is doing, for `GET /v1/cluster/moves?detail=true`.
#[derive(Clone, Debug)]
pub struct MoveStatus {
    pub topic: String,
    pub partition: u32,
    pub source: String,
    pub target: String,
    pub started_at_ms: u64,
    pub phase: &'static str,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub copied_bytes: u64,
}

#[derive(Serialize, Deserialize)]
struct ManifestAsk {
    topic: u64,
    partition: u32,
    /// The freeze the source must see before it answers (the final manifest).
    token: Option<u64>,
}

#[derive(Serialize, Deserialize)]
struct ManifestWire {
    segments: Vec<(u64, u64)>,
    next: u64,
    frontier: u64,
    ahead: Vec<u64>,
    /// The partition's fan-out cursors on the source: (child topic id, attach epoch, next).
    #[serde(default)]
    cursors: Vec<(u64, u64, u64)>,
}

/// What a destination copies: the partition's storage and its fan-out cursor positions.
#[derive(Clone, Debug, Default)]
struct Manifest {
    log: MoveManifest,
    cursors: Vec<(TopicId, u64, Offset)>,
}

impl ManifestWire {
    fn of(m: &MoveManifest, cursors: &[(TopicId, u64, Offset)]) -> ManifestWire {
        ManifestWire {
            segments: m.segments.iter().map(|(b, n)| (b.0, *n)).collect(),
            next: m.next.0,
            frontier: m.settled.frontier.0,
            ahead: m.settled.ahead.iter().map(|o| o.0).collect(),
            cursors: cursors.iter().map(|(c, e, n)| (c.0, *e, n.0)).collect(),
        }
    }

    fn manifest(self) -> Manifest {
        let cursors = self
            .cursors
            .iter()
            .map(|&(c, e, n)| (TopicId(c), e, Offset(n)))
            .collect();
        let log = MoveManifest {
            segments: self
                .segments
                .into_iter()
                .map(|(b, n)| (Offset(b), n))
                .collect(),
            next: Offset(self.next),
            settled: Settled {
                frontier: Offset(self.frontier),
                ahead: self.ahead.into_iter().map(Offset).collect(),
            },
        };
        Manifest { log, cursors }
    }
}

#[derive(Serialize, Deserialize)]
struct ChunkAsk {
    topic: u64,
    partition: u32,
    base: u64,
    pos: u64,
    max: u32,
}

/// A move's status, whatever a panicking holder left.
pub fn lock(s: &Mutex<MoveStatus>) -> MutexGuard<'_, MoveStatus> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

fn key_of(topic: u64, partition: u32) -> PartitionKey {
    PartitionKey {
        topic: TopicId(topic),
        partition: PartitionId(partition),
    }
}

/// How one attempt of a move ended.
enum Ended {
    /// Flipped: this node owns the partition.
    Flipped,
    /// The move no longer targets this node (aborted, or flipped by another attempt).
    Gone,
}

impl Node {
    /// Counts a produce request in flight on this node until the guard drops. Only a cluster
    /// node reports the figure (`node_status`), so a node that is its whole cluster skips the
    /// shared counter on its produce path.
    pub fn produce_started(&self) -> Option<ProduceInFlight<'_>> {
        self.links.as_ref()?;
        let n = &self.wide.produce_in_flight;
        n.fetch_add(1, Ordering::Relaxed);
        Some(ProduceInFlight(n))
    }

    /// This node's own status (API.md §12.1 `node_status`): draining, produce requests in
    /// flight, records not yet handed to their owners, and the moves it runs.
    pub fn node_status(&self) -> serde_json::Value {
        let moves: Vec<serde_json::Value> = self
            .move_statuses()
            .into_iter()
            .map(|w| {
                serde_json::json!({
                    "topic": w.topic,
                    "partition": w.partition,
                    "source": w.source,
                    "target": w.target,
                    "phase": w.phase,
                    "attempts": w.attempts,
                    "copied_bytes": w.copied_bytes,
                })
            })
            .collect();
        serde_json::json!({
            "node": self.config.node_id,
            "draining": self.draining_here(),
            "produce_in_flight": self.wide.produce_in_flight.load(Ordering::Relaxed),
            "dispatch_backlog": self.wide.transit.backlog(),
            "quarantine": {"copies": 0, "bytes": 0, "list": []},
            "moves": moves,
        })
    }

    /// Member `id`'s own status, asked over the cluster port within `within`.
    pub async fn member_status(
        &self,
        id: &str,
        within: Duration,
    ) -> Result<serde_json::Value, String> {
        if id == self.config.node_id {
            return Ok(self.node_status());
        }
        let (Some(links), Some((_, addr))) = (&self.links, self.member_addr(MemberId::of(id)))
        else {
            return Err(format!("no cluster address for {id}"));
        };
        let body = links
            .to(&addr)
            .call(ops::NODE_STATUS, b"", within)
            .await
            .map_err(|e| e.to_string())?;
        serde_json::from_slice(&body).map_err(|e| format!("bad status answer: {e}"))
    }

    /// Whether this node is being decommissioned, or was removed by one (CLUSTER.md §10): it
    /// takes no client produce.
    pub fn draining_here(&self) -> bool {
        if self.links.is_none() {
            return false;
        }
        let meta = self.meta.borrow();
        let me = &self.config.node_id;
        meta.tombstones.contains_key(me) || meta.members.get(me).is_some_and(|m| m.draining)
    }

    /// Whether this node commits appends of `key` now: it owns the partition and it is not
    /// frozen for a move. An owner shard refuses others (the caller places them again).
    pub fn commit_here(&self, key: PartitionKey) -> bool {
        self.remote_owner(key).is_none() && !self.frozen.borrow().contains_key(&key)
    }

    /// The node an accepted record of `key` is handed to: the owner, or for a partition frozen
    /// for a move, its destination (the records wait there as transit until the flip).
    pub fn produce_owner(&self, key: PartitionKey) -> Option<MemberId> {
        let frozen = self.frozen.borrow();
        if !frozen.is_empty() {
            if let Some(&t) = frozen.get(&key) {
                if t != self.me() {
                    return Some(t);
                }
            }
        }
        self.remote_owner(key)
    }

    /// Rebuilds the frozen-partition index from a new metadata snapshot.
    pub(super) fn index_frozen(&self, meta: &MetaState) {
        let mut f = self.frozen.borrow_mut();
        f.clear();
        for t in meta.topics.values() {
            for (&p, m) in &t.moves {
                if m.freeze.is_some() {
                    f.insert(
                        PartitionKey {
                            topic: t.id,
                            partition: PartitionId(p),
                        },
                        MemberId::of(&m.target),
                    );
                }
            }
        }
    }

    /// After a metadata install: starts a worker for each move that targets a partition of this
    /// shard, and reclaims partitions held here that another node owns now.
    pub(super) fn reconcile_moves(self: &Rc<Self>, meta: &Arc<MetaState>) {
        if self.links.is_none() {
            return;
        }
        let me = self.config.node_id.as_str();
        for t in meta.topics.values() {
            for (&p, m) in &t.moves {
                let key = PartitionKey {
                    topic: t.id,
                    partition: PartitionId(p),
                };
                if m.target != me || self.owner(key) != self.shard {
                    continue;
                }
                if self.wide.has_move_worker(key) {
                    continue;
                }
                let status = Arc::new(Mutex::new(MoveStatus {
                    topic: t.name.clone(),
                    partition: p,
                    source: m.source.clone(),
                    target: m.target.clone(),
                    started_at_ms: m.started_ms,
                    phase: "copying",
                    attempts: 0,
                    last_error: None,
                    copied_bytes: 0,
                }));
                self.wide.add_move_worker(key, status.clone());
                let node = self.clone();
                let (name, id) = (t.name.clone(), t.id);
                rt::spawn(async move {
                    node.clone().run_move(name, id, key, status).await;
                    node.wide.remove_move_worker(key);
                })
                .detach();
            }
        }
        self.reclaim_moved_away(meta);
    }

    /// Partitions this shard holds whose topic names another owner and no move to here: their
    /// copy on the new owner took over. Dropped once the leader confirms this node's metadata.
    fn reclaim_moved_away(self: &Rc<Self>, meta: &Arc<MetaState>) {
        let me = self.config.node_id.as_str();
        let stale: Vec<PartitionKey> = self
            .host
            .log()
            .held_partitions()
            .into_iter()
            .filter(|k| {
                meta.topics.values().any(|t| {
                    t.id == k.topic
                        && k.partition.0 < t.partitions
                        && t.owner_of(k.partition.0).is_some_and(|o| o != me)
                        && t.moves.get(&k.partition.0).is_none_or(|m| m.target != me)
                })
            })
            .filter(|k| !self.wide.has_move_worker(*k))
            .collect();
        if stale.is_empty() || self.reclaiming.replace(true) {
            return;
        }
        let node = self.clone();
        rt::spawn(async move {
            if node.catch_up_meta().await {
                let meta = node.meta();
                let me = node.config.node_id.clone();
                for k in stale {
                    let still = meta.topics.values().any(|t| {
                        t.id == k.topic
                            && t.owner_of(k.partition.0).is_some_and(|o| o != me)
                            && t.moves.get(&k.partition.0).is_none_or(|m| m.target != me)
                    });
                    if !still || node.wide.has_move_worker(k) {
                        continue;
                    }
                    match node.host.drop_partition(k).await {
                        Ok(()) => tracing::info!(key = ?k, "reclaimed the copy of a partition that moved away"),
                        Err(e) => tracing::warn!(key = ?k, error = %e, "reclaiming a moved partition failed"),
                    }
                }
            }
            node.reclaiming.set(false);
        })
        .detach();
    }

    /// The move of `key` as the metadata says now, if it still targets this node.
    fn my_move(&self, name: &str, id: TopicId, p: u32) -> Option<narad_raft::MoveMeta> {
        let meta = self.meta();
        let t = meta.topics.get(name).filter(|t| t.id == id)?;
        t.moves
            .get(&p)
            .filter(|m| m.target == self.config.node_id)
            .cloned()
    }

    async fn run_move(
        self: Rc<Self>,
        name: String,
        id: TopicId,
        key: PartitionKey,
        status: Arc<Mutex<MoveStatus>>,
    ) {
        let p = key.partition.0;
        let stage = match MoveStage::fresh(&self.config.data_dir, key).await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(topic = name, partition = p, error = %e, "cannot stage a partition move");
                return;
            }
        };
        tracing::info!(topic = name, partition = p, "partition move started");
        let started = Instant::now();
        // The source's last manifest and whether the stage holds all of it (force-promote).
        let mut last: Option<Manifest> = None;
        let mut complete = false;
        let mut dead_since: Option<Instant> = None;
        let force_after = Duration::from_millis(
            crate::config::test_knob("NARAD_TEST_FORCE_PROMOTE_MS")
                .unwrap_or(FORCE_PROMOTE_AFTER_MS),
        );
        let mut attempt = 0u32;
        let outcome = loop {
            if self.shutting_down() {
                break "stopped";
            }
            let Some(mv) = self.my_move(&name, id, p) else {
                break if self.remote_owner(key).is_none() {
                    "flipped elsewhere"
                } else {
                    "aborted"
                };
            };
            attempt += 1;
            lock(&status).attempts = attempt;
            let src = MemberId::of(&mv.source);
            if self.member_dead(src) {
                let since = *dead_since.get_or_insert_with(Instant::now);
                lock(&status).phase = "waiting_for_source";
                if since.elapsed() >= force_after {
                    if let (Some(m), true) = (&last, complete) {
                        match self.force_promote(&name, id, key, &mv, &stage, m).await {
                            Ok(Ended::Flipped) => break "force-promoted",
                            Ok(Ended::Gone) => continue,
                            Err(e) => {
                                tracing::warn!(topic = name, partition = p, error = %e, "force-promote failed");
                                lock(&status).last_error = Some(e);
                            }
                        }
                    } else {
                        lock(&status).last_error = Some(
                            "source_dead_copy_behind: the source died before this copy caught up"
                                .into(),
                        );
                    }
                }
                rt::sleep(Duration::from_secs(1)).await;
                continue;
            }
            dead_since = None;
            lock(&status).phase = "copying";

            match self
                .move_once(
                    &name,
                    id,
                    key,
                    &mv,
                    &stage,
                    &status,
                    &mut last,
                    &mut complete,
                )
                .await
            {
                Ok(Ended::Flipped) => break "flipped",
                Ok(Ended::Gone) => {
                    tracing::info!(
                        topic = name,
                        partition = p,
                        "partition move attempt abandoned: the move was aborted or replaced"
                    );
                    continue;
                }
                Err(e) => {
                    tracing::warn!(topic = name, partition = p, attempt, error = %e, "partition move attempt failed");
                    let mut s = lock(&status);
                    s.last_error = Some(e);
                    s.phase = "copying";
                }
            }
            let backoff = (Duration::from_millis(250) * attempt).min(RETRY_BACKOFF_MAX);
            rt::sleep(backoff).await;
        };
        let copied = lock(&status).copied_bytes;
        self.wide.note_move(outcome, started.elapsed(), copied);
        tracing::info!(
            topic = name,
            partition = p,
            outcome,
            attempts = attempt,
            copied_bytes = copied,
            ms = started.elapsed().as_millis() as u64,
            "partition move ended"
        );
        let _ = MoveStage::fresh(&self.config.data_dir, key).await;
    }

    /// One attempt: catch-up passes, freeze, final copy, install, flip.
    #[allow(clippy::too_many_arguments)]
    async fn move_once(
        self: &Rc<Self>,
        name: &str,
        id: TopicId,
        key: PartitionKey,
        mv: &narad_raft::MoveMeta,
        stage: &MoveStage,
        status: &Arc<Mutex<MoveStatus>>,
        last: &mut Option<Manifest>,
        complete: &mut bool,
    ) -> Result<Ended, String> {
        let p = key.partition.0;
        let src = MemberId::of(&mv.source);
        let mut previous = u64::MAX;
        for pass in 0..CATCH_UP_PASSES_MAX {
            let m = self.fetch_manifest(src, key, None).await?;
            if pass == 0 && last.is_some() {
                // A later attempt, with the source reachable again, copies from scratch: the
                // source may have restarted since and rewritten a segment's tail (a cut torn
                // tail replayed from its WAL), so bytes copied before need not match it now.
                stage
                    .clear()
                    .await
                    .map_err(|e| format!("staging the copy: {e}"))?;
                *last = None;
            }
            *complete = false;
            let Some(copied) = self.copy_from(src, key, stage, &m, status, mv).await? else {
                return Ok(Ended::Gone);
            };
            *complete = true;
            *last = Some(m);
            if copied <= CATCH_UP_LAG_BYTES || copied >= previous {
                break;
            }
            previous = copied;
            rt::sleep(CATCH_UP_PASS_GAP).await;
        }
        // NARAD_TEST_MOVE_HOLD_MS: a test holds a caught-up copy here (to kill the source).
        if let Some(ms) = crate::config::test_knob("NARAD_TEST_MOVE_HOLD_MS") {
            rt::sleep(Duration::from_millis(ms)).await;
        }
        let token = narad_io::sys::random_u64() | 1;
        lock(status).phase = "frozen";
        let frozen = self
            .propose(MetaCommand::FreezeMove {
                topic: name.to_string(),
                id,
                partition: p,
                target: self.config.node_id.clone(),
                token,
            })
            .await;
        match frozen {
            Ok(_) => {}
            Err(ProposeError::Apply(e)) if e.kind == MetaErrorKind::Conflict => {
                return Ok(Ended::Gone)
            }
            Err(e) => return Err(format!("freeze: {e}")),
        }
        let r = self
            .finish_move(name, id, key, mv, stage, status, token)
            .await;
        if !matches!(r, Ok(Ended::Flipped)) {
            // Let the source commit again now rather than at the freeze's TTL.
            let _ = self
                .propose(MetaCommand::Unfreeze {
                    topic: name.to_string(),
                    id,
                    partition: p,
                    token,
                })
                .await;
        }
        r
    }

    #[allow(clippy::too_many_arguments)]
    async fn finish_move(
        self: &Rc<Self>,
        name: &str,
        id: TopicId,
        key: PartitionKey,
        mv: &narad_raft::MoveMeta,
        stage: &MoveStage,
        status: &Arc<Mutex<MoveStatus>>,
        token: u64,
    ) -> Result<Ended, String> {
        let src = MemberId::of(&mv.source);
        let m = self.fetch_manifest(src, key, Some(token)).await?;
        if self
            .copy_from(src, key, stage, &m, status, mv)
            .await?
            .is_none()
        {
            return Ok(Ended::Gone);
        }
        stage
            .seal(&m.log.settled)
            .await
            .map_err(|e| format!("sealing the copy: {e}"))?;
        lock(status).phase = "flip_pending";
        self.install_and_flip(name, id, key, mv, stage, &m, Some(token))
            .await
    }

    /// Installs the staged copy, checks it recovers to the source's high watermark `m.next`,
    /// and flips the owner; rolls the install back when the flip is refused.
    #[allow(clippy::too_many_arguments)]
    async fn install_and_flip(
        self: &Rc<Self>,
        name: &str,
        id: TopicId,
        key: PartitionKey,
        mv: &narad_raft::MoveMeta,
        stage: &MoveStage,
        m: &Manifest,
        token: Option<u64>,
    ) -> Result<Ended, String> {
        let next = self
            .host
            .adopt_partition(key, stage.dir().to_path_buf())
            .await
            .map_err(|e| format!("installing the copy: {e}"))?;
        // The stage was renamed into place: recreate it for a later attempt.
        let _ = MoveStage::fresh(&self.config.data_dir, key).await;
        if next < m.log.next {
            let _ = self.host.drop_partition(key).await;
            return Err(format!(
                "the copy recovers to offset {} but the source's high watermark is {}",
                next.0, m.log.next.0
            ));
        }
        // The fan-out cursors of a parent partition continue where the source's stood (they
        // start once the flip makes this node the owner); without them they would restart at
        // the attach point: duplicates in the children, never gaps, either way.
        if let Some(f) = self.fanout.borrow().as_ref() {
            f.seed(key, &m.cursors);
        }
        let flip = self
            .propose(MetaCommand::FlipOwner {
                topic: name.to_string(),
                id,
                partition: key.partition.0,
                source: mv.source.clone(),
                target: self.config.node_id.clone(),
                token,
            })
            .await;
        match flip {
            Ok(_) => Ok(Ended::Flipped),
            Err(e) => {
                // An answer lost on the way may hide a flip that happened: look again.
                let _ = self.catch_up_meta().await;
                if self.remote_owner(key).is_none() {
                    return Ok(Ended::Flipped);
                }
                let _ = self.host.drop_partition(key).await;
                Err(format!("flip refused: {e}"))
            }
        }
    }

    /// CLUSTER.md §9.3 step 6: the source is dead past the force-promote time and this copy
    /// holds all the source had when last reached: install it and flip without a freeze.
    async fn force_promote(
        self: &Rc<Self>,
        name: &str,
        id: TopicId,
        key: PartitionKey,
        mv: &narad_raft::MoveMeta,
        stage: &MoveStage,
        m: &Manifest,
    ) -> Result<Ended, String> {
        tracing::warn!(
            topic = name,
            partition = key.partition.0,
            source = mv.source,
            high_watermark = m.log.next.0,
            "source dead past the force-promote time: promoting this copy"
        );
        stage
            .seal(&m.log.settled)
            .await
            .map_err(|e| format!("sealing the copy: {e}"))?;
        self.install_and_flip(name, id, key, mv, stage, m, None)
            .await
    }

    async fn fetch_manifest(
        &self,
        src: MemberId,
        key: PartitionKey,
        token: Option<u64>,
    ) -> Result<Manifest, String> {
        let ask = ManifestAsk {
            topic: key.topic.0,
            partition: key.partition.0,
            token,
        };
        let body = serde_json::to_vec(&ask).map_err(|e| e.to_string())?;
        let reply = self.call_member(src, ops::MOVE_MANIFEST, &body).await?;
        let w: ManifestWire =
            serde_json::from_slice(&reply).map_err(|e| format!("bad manifest: {e}"))?;
        Ok(w.manifest())
    }

    async fn call_member(&self, to: MemberId, op: u8, body: &[u8]) -> Result<Vec<u8>, String> {
        let (Some(links), Some((peer, addr))) = (&self.links, self.member_addr(to)) else {
            return Err(format!("no cluster member {:x}", to.0));
        };
        links
            .to(&addr)
            .call(op, body, MOVE_CALL_BUDGET)
            .await
            .map_err(|e| format!("node {peer}: {e}"))
    }

    /// Brings the stage to `m`: drops segments the source no longer has, copies what is
    /// missing of each, paced at [`MOVE_RATE_BYTES_PER_S`]. Answers the bytes copied, or
    /// `None` once the move `mv` is no longer in the metadata (aborted, or replaced).
    async fn copy_from(
        &self,
        src: MemberId,
        key: PartitionKey,
        stage: &MoveStage,
        m: &Manifest,
        status: &Arc<Mutex<MoveStatus>>,
        mv: &narad_raft::MoveMeta,
    ) -> Result<Option<u64>, String> {
        // The move this attempt copies for is still the one in the metadata.
        let current = || {
            self.meta().topics.values().any(|t| {
                t.id == key.topic
                    && t.moves.get(&key.partition.0).is_some_and(|x| {
                        x.target == mv.target
                            && x.source == mv.source
                            && x.started_ms == mv.started_ms
                    })
            })
        };
        let io = |e: std::io::Error| format!("staging the copy: {e}");
        let held = stage.held().await.map_err(io)?;
        for base in held.keys() {
            if !m.log.segments.iter().any(|(b, _)| b == base) {
                stage.remove(*base).await.map_err(io)?;
            }
        }
        let mut copied = 0u64;
        let began = Instant::now();
        // NARAD_TEST_MOVE_RATE_BYTES_PER_S slows copies down so that tests can act mid-move.
        let rate = crate::config::test_knob("NARAD_TEST_MOVE_RATE_BYTES_PER_S")
            .unwrap_or(MOVE_RATE_BYTES_PER_S)
            .max(1);
        let chunk = (MOVE_CHUNK_BYTES as u64).min(rate);
        for &(base, size) in &m.log.segments {
            let mut have = held.get(&base).copied().unwrap_or(0);
            if have > size {
                // The source cut this segment back (a torn tail at its restart): copy it anew.
                stage.remove(base).await.map_err(io)?;
                have = 0;
            }
            while have < size {
                if !current() {
                    return Ok(None);
                }
                let ask = ChunkAsk {
                    topic: key.topic.0,
                    partition: key.partition.0,
                    base: base.0,
                    pos: have,
                    max: (size - have).min(chunk) as u32,
                };
                let body = serde_json::to_vec(&ask).map_err(|e| e.to_string())?;
                let bytes = self.call_member(src, ops::MOVE_CHUNK, &body).await?;
                if bytes.is_empty() {
                    return Err(format!("segment {} ended early at the source", base.0));
                }
                let n = bytes.len() as u64;
                stage.write(base, have, bytes).await.map_err(io)?;
                have += n;
                copied += n;
                lock(status).copied_bytes += n;
                let due = Duration::from_secs_f64(copied as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(began.elapsed()) {
                    rt::sleep(wait).await;
                }
            }
        }
        Ok(Some(copied))
    }

    /// `MOVE_MANIFEST` from a destination: run on the owner shard of the partition.
    pub async fn serve_move_manifest(self: &Rc<Self>, body: &[u8]) -> Result<Vec<u8>, String> {
        let ask: ManifestAsk = serde_json::from_slice(body).map_err(|e| e.to_string())?;
        let key = key_of(ask.topic, ask.partition);
        let s = self.owner(key);
        if s != self.shard {
            return self
                .relay_move(
                    s,
                    ShardControl::MoveManifest {
                        key,
                        token: ask.token,
                    },
                )
                .await;
        }
        self.move_manifest_here(key, ask.token).await
    }

    /// The manifest of `key` on this (its owner) shard. With a freeze token: only once this
    /// shard sees that freeze and no append of the partition is on its way, so the high
    /// watermark answered is final.
    pub(super) async fn move_manifest_here(
        self: &Rc<Self>,
        key: PartitionKey,
        token: Option<u64>,
    ) -> Result<Vec<u8>, String> {
        if self.remote_owner(key).is_some() {
            return Err(format!(
                "{}: partition {} of topic {}",
                remote::NOT_OWNER,
                key.partition.0,
                key.topic
            ));
        }
        if let Some(token) = token {
            let until = Instant::now() + FREEZE_SETTLE_WAIT;
            loop {
                let seen = self.meta().topics.values().any(|t| {
                    t.id == key.topic
                        && t.moves
                            .get(&key.partition.0)
                            .is_some_and(|m| m.freeze == Some(token))
                });
                if seen && self.host.quiet(key) {
                    break;
                }
                if Instant::now() >= until {
                    return Err(if seen {
                        "appends of the partition are still on their way".into()
                    } else {
                        "the freeze is not in this node's metadata".into()
                    });
                }
                rt::sleep(Duration::from_millis(2)).await;
            }
        }
        let m = self.host.log().move_manifest(key);
        let cursors = self
            .fanout
            .borrow()
            .as_ref()
            .map(|f| f.positions(key))
            .unwrap_or_default();
        serde_json::to_vec(&ManifestWire::of(&m, &cursors)).map_err(|e| e.to_string())
    }

    /// `MOVE_CHUNK` from a destination: bytes of one segment, from the owner shard.
    pub async fn serve_move_chunk(self: &Rc<Self>, body: &[u8]) -> Result<Vec<u8>, String> {
        let ask: ChunkAsk = serde_json::from_slice(body).map_err(|e| e.to_string())?;
        let key = key_of(ask.topic, ask.partition);
        let s = self.owner(key);
        if s != self.shard {
            return self
                .relay_move(
                    s,
                    ShardControl::MoveChunk {
                        key,
                        base: ask.base,
                        pos: ask.pos,
                        max: ask.max,
                    },
                )
                .await;
        }
        self.move_chunk_here(key, ask.base, ask.pos, ask.max).await
    }

    pub(super) async fn move_chunk_here(
        &self,
        key: PartitionKey,
        base: u64,
        pos: u64,
        max: u32,
    ) -> Result<Vec<u8>, String> {
        let max = (max as usize).min(MOVE_CHUNK_BYTES);
        self.host
            .log()
            .move_chunk(key, Offset(base), pos, max)
            .await
            .map_err(|e| e.to_string())
    }

    async fn relay_move(&self, s: ShardId, c: ShardControl) -> Result<Vec<u8>, String> {
        match call_shard(&self.mesh, s, ShardReq::Control(c)).await {
            Ok(ShardResp::PeerRpc(r)) => r,
            Ok(_) => wrong_reply("Move"),
            Err(e) => Err(e.to_string()),
        }
    }

    /// The moves this node's workers run (every shard's), for the moves listing.
    pub fn move_statuses(&self) -> Vec<MoveStatus> {
        self.wide.move_statuses()
    }

    /// Moves running here as the destination, and those finished here (`narad_moves_*`).
    pub fn move_figures(&self) -> (u64, MoveTally) {
        self.wide.move_figures()
    }
}

impl NodeWide {
    fn has_move_worker(&self, key: PartitionKey) -> bool {
        self.move_workers().contains_key(&key)
    }

    fn add_move_worker(&self, key: PartitionKey, s: Arc<Mutex<MoveStatus>>) {
        self.move_workers().insert(key, s);
    }

    fn remove_move_worker(&self, key: PartitionKey) {
        self.move_workers().remove(&key);
    }

    fn move_workers(&self) -> MutexGuard<'_, HashMap<PartitionKey, Arc<Mutex<MoveStatus>>>> {
        self.move_workers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The moves this node's workers run, sorted by topic and partition.
    pub fn move_statuses(&self) -> Vec<MoveStatus> {
        let mut v: Vec<MoveStatus> = self
            .move_workers()
            .values()
            .map(|s| lock(s).clone())
            .collect();
        v.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        v
    }

    /// A move ended here as the destination: the finished ones (flipped here, forced or not)
    /// count in `narad_moves_*`.
    fn note_move(&self, outcome: &'static str, took: Duration, bytes: u64) {
        let label = match outcome {
            "flipped" => "completed",
            "force-promoted" => "force_promoted",
            _ => return,
        };
        let mut t = self.move_tally.lock().unwrap_or_else(|e| e.into_inner());
        *t.outcomes.entry(label).or_default() += 1;
        t.durations.record(took.as_millis() as u64);
        t.bytes += bytes;
    }

    /// Moves this node's workers run now.
    pub fn moves_inflight(&self) -> u64 {
        self.move_workers().len() as u64
    }

    /// Finished moves by outcome, their total seconds and bytes copied.
    pub fn move_tally(&self) -> MoveTally {
        self.move_tally
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Upper bounds of `narad_moves_duration_seconds`, in milliseconds.
pub static MOVE_DURATION_BOUNDS_MS: [u64; 10] = [
    1_000, 5_000, 15_000, 30_000, 60_000, 120_000, 300_000, 600_000, 1_800_000, 3_600_000,
];

/// Moves finished on this node as the destination (flipped here): by outcome (`completed`,
/// `force_promoted`), their durations in milliseconds and the bytes they copied.
#[derive(Clone, Debug, PartialEq)]
pub struct MoveTally {
    pub outcomes: std::collections::BTreeMap<&'static str, u64>,
    pub durations: crate::metrics::expo::Histogram,
    pub bytes: u64,
}

impl Default for MoveTally {
    fn default() -> MoveTally {
        MoveTally {
            outcomes: Default::default(),
            durations: crate::metrics::expo::Histogram::new(&MOVE_DURATION_BOUNDS_MS),
            bytes: 0,
        }
    }
}

/// Leader duties for moves and decommission, run on shard 0 every look (CLUSTER.md §9.2, §10).
pub(super) struct LeaderMoves {
    /// When this leader first saw each freeze (topic, partition, token).
    freezes: HashMap<(TopicId, u32, u64), Instant>,
}

impl LeaderMoves {
    pub fn new() -> LeaderMoves {
        LeaderMoves {
            freezes: HashMap::new(),
        }
    }

    /// One look: ends freezes past their TTL, starts the planner's moves.
    pub async fn tick(&mut self, node: &Rc<Node>, meta: &MetaState) {
        let mut seen = std::collections::HashSet::new();
        for t in meta.topics.values() {
            for (&p, m) in &t.moves {
                let Some(token) = m.freeze else { continue };
                let k = (t.id, p, token);
                seen.insert(k);
                let first = *self.freezes.entry(k).or_insert_with(Instant::now);
                if first.elapsed() >= FREEZE_TTL {
                    tracing::warn!(
                        topic = t.name,
                        partition = p,
                        target = m.target,
                        "a partition freeze outlived its TTL: the source commits again"
                    );
                    let _ = node
                        .propose(MetaCommand::Unfreeze {
                            topic: t.name.clone(),
                            id: t.id,
                            partition: p,
                            token,
                        })
                        .await;
                }
            }
        }
        self.freezes.retain(|k, _| seen.contains(k));
        let plan = narad_raft::moves::plan(meta);
        if !plan.is_empty() {
            tracing::info!(moves = plan.len(), "planner: starting partition moves");
            let _ = node
                .propose(MetaCommand::StartMoves {
                    moves: plan,
                    at_ms: UnixMillis::now().0,
                })
                .await;
        }
    }
}
