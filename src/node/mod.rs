//! One shard's view of the node: its partitions (`narad_shard::host::Host`), its read-only copy of
//! the metadata, and the messages it exchanges with the other shards of this process.
//!
//! Routing rules: a partition's owner shard is `owner_shard(key, shards)`; a request that needs a
//! partition owned elsewhere becomes one mesh message per owner shard (a batch produce splits by
//! owner, never per record). Metadata changes are proposed on shard 0 (which hosts Raft) and shard
//! 0 installs the new metadata on every shard before it answers, so a client that got `201` for a
//! topic can use it on any connection at once.
//!
//! Never shared between shards: the `Host`, the lease tables, the metadata `RefCell`. The metadata
//! itself travels as an `Arc` of an immutable snapshot.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use narad_io::log::{AppendRecord, StoredRecord};
use narad_io::rt::{self, Mesh, ShutdownSignal};
use narad_io::types::{Offset, PartitionId, PartitionKey, ShardId, TopicId};
use narad_raft::{MetaCommand, MetaNode, MetaResponse, MetaState, ProposeError, TopicMeta};
use narad_shard::fanout::{ChildLag, Fanout, Link};
use narad_shard::host::{now_ms, Host, Leased, QueueConf, SettleKind};
use narad_shard::route::{self, group_by_owner, OpReply, PartitionOp, Placement, Router};
use narad_shard::transit::TransitProgress;

pub use narad_shard::route::{
    Lease, PartitionGauges, ReadFailure, SettleFailure, ShardCallError, StoreError,
};

use crate::config::Config;

mod snapshot;

/// A message between shards of this process: addressed partition work, news for a shard, or a
/// control step. Every kind names its deadline ([`ShardReq::deadline`]).
pub enum ShardReq {
    /// Work on partitions the asked shard owns: the same operation a node will forward to
    /// another node.
    Op(PartitionOp),
    /// News the asked shard must hear (every shard, for the metadata and failures).
    Event(ShardEvent),
    /// Start-up steps, metadata proposals (to shard 0) and reads of one shard's state.
    Control(ShardControl),
}

pub enum ShardEvent {
    /// Install this metadata snapshot (from shard 0).
    Meta(Arc<MetaState>),
    /// The metadata group on shard 0 stopped for good, for this reason: not ready any more.
    MetaStopped(String),
    /// A shard's log stopped after an I/O failure: refuse every produce until restarted.
    IngressFailed,
    /// A shard has long-polls parked on `topic` until `until_ms` (monotonic): wake it on news.
    Interest { topic: TopicId, until_ms: u64 },
    /// News on `topic` for the long-polls parked here.
    Wake { topic: TopicId },
}

pub enum ShardControl {
    /// Drop the data of topics this shard holds that the metadata no longer has (start-up,
    /// from shard 0, see [`Node::purge_deleted_topics`]).
    PurgeDeleted,
    /// Shard 0 finished its start-up work (metadata everywhere, deleted topics purged): the
    /// asked shard may start serving.
    StartServing,
    /// Propose a metadata change (to shard 0).
    Propose(Box<MetaCommand>),
    /// Fan-out lag of the children of `parent` over the asked shard's cursors.
    FanoutLag { parent: TopicId },
    /// This shard's counters and gauges for a scrape.
    Metrics,
}

pub enum ShardResp {
    Op(OpReply),
    Proposed(Result<MetaResponse, ProposeError>),
    FanoutLag(Vec<ChildLag>),
    Metrics(Box<crate::metrics::ShardMetrics>),
    Done,
}

pub type NodeMesh = Mesh<ShardReq, ShardResp>;

/// Deadline of a data-path call to another shard: append, take, settle, read, release, stats,
/// long-poll interest and wake-ups. An append or an ack waits for the owner's group commit, whose
/// fsync may take a second under load: a shard that has not answered in thirty is stuck, not
/// slow. No mesh call waits out a long-poll's `wait` (up to 20 s): a long-poll parks on the shard
/// that took it ([`Node::wait_for_work`]); a call that ever does must add that `wait` to this.
pub const MESH_DATA_CALL_TIMEOUT_MS: u64 = 30_000;
/// Deadline of a read of another shard's counters (a `/metrics` scrape, the fan-out lag route):
/// memory only, and Prometheus gives a whole scrape 10 s by default.
pub const MESH_COUNTERS_CALL_TIMEOUT_MS: u64 = 10_000;
/// Deadline of control messages (metadata installs, start-up release and purge, stop notices)
/// and of a metadata change forwarded to shard 0, which waits for Raft (itself bounded by
/// `propose_timeout_ms`, 10 s) and for every shard to install the result; a purge deletes files.
pub const MESH_CONTROL_CALL_TIMEOUT_MS: u64 = 60_000;

impl ShardReq {
    /// How long a caller waits for the answer. Every kind names its deadline: a new kind has to
    /// choose one.
    fn deadline(&self) -> Duration {
        let ms = match self {
            ShardReq::Op(_)
            | ShardReq::Event(ShardEvent::Interest { .. } | ShardEvent::Wake { .. }) => {
                MESH_DATA_CALL_TIMEOUT_MS
            }
            ShardReq::Control(ShardControl::FanoutLag { .. } | ShardControl::Metrics) => {
                MESH_COUNTERS_CALL_TIMEOUT_MS
            }
            ShardReq::Event(
                ShardEvent::Meta(_) | ShardEvent::MetaStopped(_) | ShardEvent::IngressFailed,
            )
            | ShardReq::Control(
                ShardControl::PurgeDeleted | ShardControl::StartServing | ShardControl::Propose(_),
            ) => MESH_CONTROL_CALL_TIMEOUT_MS,
        };
        Duration::from_millis(ms)
    }
}

/// Calls shard `to` with the deadline of the request's kind.
async fn call_shard(
    mesh: &NodeMesh,
    to: ShardId,
    req: ShardReq,
) -> Result<ShardResp, ShardCallError> {
    let within = req.deadline();
    Ok(mesh.call(to, req, within).await?)
}

/// The shard of a placement on this node. A node is its whole cluster today: the router places
/// every partition here, so a remote placement is a bug. With the cluster, the callers that can
/// meet a remote owner match on [`Placement`] and forward instead.
fn local_shard(p: Placement) -> ShardId {
    match p {
        Placement::Local(s) => s,
        Placement::Remote(m) => {
            unreachable!("a partition placed on member {} of a one-node cluster", m.0)
        }
    }
}

/// [`Node::serve`] answers every request with a reply of its own kind: another kind is a bug.
fn wrong_reply(asked: &str) -> ! {
    unreachable!("a shard answered {asked} with a reply of another kind")
}

/// Longest start-up waits for the metastore log to be applied before purging deleted topics.
const PURGE_APPLY_WAIT: Duration = Duration::from_secs(10);

/// Longest a parked long-poll waits before it looks at its client again.
pub const WAIT_SLICE_MS: u64 = 1000;

pub struct Node {
    pub shard: ShardId,
    pub shards: u32,
    pub config: Arc<Config>,
    pub host: Rc<Host>,
    mesh: NodeMesh,
    router: Router,
    meta: RefCell<Arc<MetaState>>,
    meta_node: Option<MetaNode>,
    /// What the node's shards share.
    wide: Arc<NodeWide>,
    /// This shard's handles on the node-wide round-robin cursors ([`NodeWide::rotation`]).
    rr: RefCell<HashMap<TopicId, Arc<AtomicU32>>>,
    /// Where this shard's next queue consume starts looking (rotating over the partitions).
    take_start: Cell<u32>,
    /// Remote shards with long-polls parked per topic, and until when.
    interest: RefCell<HashMap<TopicId, Vec<(ShardId, u64)>>>,
    /// Topics this shard already told the others it waits on, and until when.
    announced: RefCell<HashMap<TopicId, u64>>,
    shutdown: ShutdownSignal,
    started: Cell<bool>,
    released: Cell<bool>,
    /// Why the metadata group stopped, once it did (see [`Node::watch_metadata_group`]).
    meta_stopped: RefCell<Option<String>>,
    /// Some shard's log stopped after an I/O failure (see [`Node::note_ingress_failure`]).
    ingress_failed: Cell<bool>,
    /// Fan-out cursors of this shard's parent partitions (set once at start).
    fanout: RefCell<Option<Rc<Fanout>>>,
    pub metrics: crate::metrics::Metrics,
    /// Single produces accepted here for other shards' partitions, until handed over.
    pub transit: narad_shard::transit::Transit,
}

/// What a shard's [`Node`] is made of (the server builds one per shard).
pub struct NodeSetup {
    pub shard: ShardId,
    pub shards: u32,
    pub config: Arc<Config>,
    pub host: Rc<Host>,
    pub mesh: NodeMesh,
    /// The metadata group, on shard 0 only.
    pub meta_node: Option<MetaNode>,
    pub shutdown: ShutdownSignal,
    pub wide: Arc<NodeWide>,
}

impl Node {
    pub fn new(setup: NodeSetup) -> Rc<Node> {
        let NodeSetup {
            shard,
            shards,
            config,
            host,
            mesh,
            meta_node,
            shutdown,
            wide,
        } = setup;
        let meta = meta_node.as_ref().map(|m| m.state()).unwrap_or_default();
        Rc::new(Node {
            shard,
            shards,
            config,
            host,
            mesh,
            router: Router::new(shards),
            meta: RefCell::new(meta),
            meta_node,
            rr: RefCell::new(HashMap::new()),
            take_start: Cell::new(narad_io::sys::random_u64() as u32),
            interest: RefCell::new(HashMap::new()),
            announced: RefCell::new(HashMap::new()),
            shutdown,
            started: Cell::new(false),
            released: Cell::new(false),
            meta_stopped: RefCell::new(None),
            ingress_failed: Cell::new(false),
            fanout: RefCell::new(None),
            metrics: crate::metrics::Metrics::default(),
            transit: narad_shard::transit::Transit::new(shard, shards, wide.transit.clone()),
            wide,
        })
    }

    pub fn mark_started(&self) {
        self.started.set(true);
    }

    pub fn shutting_down(&self) -> bool {
        self.shutdown.is_triggered()
    }

    pub fn ready(&self) -> Result<(), String> {
        if !self.started.get() {
            return Err("startup in progress".into());
        }
        if self.shutting_down() {
            return Err("shutting down".into());
        }
        if let Some(reason) = self.meta_stopped.borrow().as_ref() {
            // API.md §15.2: ready only with a Raft leader in view; a stopped group has none.
            return Err(format!(
                "no metadata leader: the metadata group stopped ({reason}); restart the node"
            ));
        }
        if let Some(reason) = self.host.log().poisoned() {
            // Reads and consumes still work; readiness stays up (SEMANTICS.md §3.4).
            tracing::debug!(reason, "ingress WAL failed");
        }
        Ok(())
    }

    /// Shard 0: waits (in the background) for the metadata group to stop for good, e.g. on a
    /// storage failure, and then makes every shard answer `/readyz` with 503. Not while the node
    /// shuts down (readiness says so already).
    pub fn watch_metadata_group(self: &Rc<Self>) {
        let Some(mn) = self.meta_node.clone() else {
            return;
        };
        let weak = Rc::downgrade(self);
        rt::spawn(async move {
            let reason = mn.stopped().await;
            let Some(n) = weak.upgrade() else { return };
            if n.shutting_down() {
                return;
            }
            tracing::error!(reason, "the metadata group stopped: topic and user changes fail and the node is not ready until it is restarted");
            *n.meta_stopped.borrow_mut() = Some(reason.clone());
            n.tell_other_shards(|| ShardReq::Event(ShardEvent::MetaStopped(reason.clone())))
                .await;
        })
        .detach();
    }

    /// Whether produces are refused because a shard's log stopped after an I/O failure
    /// (SEMANTICS.md §3.4: after a WAL write or sync failure the node answers every produce
    /// `500` until restarted, even the ones a healthy shard could still take). One `Cell` read
    /// per produce: a stopped log of this shard needs no check of its own, since its next
    /// append fails as [`StoreError::Stopped`], which sets the mark.
    pub fn ingress_refused(&self) -> bool {
        self.ingress_failed.get()
    }

    /// A produce met a stopped log ([`StoreError::Stopped`], here or on the owner shard): every
    /// shard refuses produces from now on. Told to the others once, in the background.
    pub fn note_ingress_failure(self: &Rc<Self>) {
        if self.ingress_failed.replace(true) {
            return;
        }
        tracing::error!("a shard's log stopped after an I/O failure: this node refuses every produce until it is restarted");
        let n = self.clone();
        rt::spawn(async move {
            n.tell_other_shards(|| ShardReq::Event(ShardEvent::IngressFailed))
                .await;
        })
        .detach();
    }

    /// True once shard 0 has released this shard to serve (see [`ShardReq::StartServing`]).
    pub fn released(&self) -> bool {
        self.released.get()
    }

    /// Shard 0, at the end of its start-up work: lets every other shard start serving, so no
    /// shard answers `/readyz` (or anything) before the node's start-up is done.
    pub async fn release_shards(&self) {
        self.tell_other_shards(|| ShardReq::Control(ShardControl::StartServing))
            .await;
    }

    /// Sends `req()` to every other shard, one after the other, each answered (or given up on
    /// at its deadline) before the next; the answers are not looked at, failures are logged.
    async fn tell_other_shards(&self, req: impl Fn() -> ShardReq) {
        for s in 0..self.shards {
            if s == self.shard.0 {
                continue;
            }
            match call_shard(&self.mesh, ShardId(s), req()).await {
                Ok(_) => {}
                Err(e @ ShardCallError::Timeout { .. }) => {
                    tracing::warn!(error = %e, "a control message to another shard got no answer")
                }
                // A shard leaves the mesh only when the node stops.
                Err(e) => tracing::debug!(error = %e, "a control message found its shard gone"),
            }
        }
    }

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

    fn reconcile_fanout(&self, meta: &MetaState) {
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
            Ok(ShardResp::Proposed(r)) => r,
            Ok(_) => wrong_reply("Propose"),
            // Shard 0 may still apply it.
            Err(e @ ShardCallError::Timeout { .. }) => {
                Err(ProposeError::Indeterminate(e.to_string()))
            }
            Err(ShardCallError::Gone { .. }) => Err(ProposeError::NoLeader { leader: None }),
        }
    }

    async fn propose_here(self: &Rc<Self>, cmd: MetaCommand) -> Result<MetaResponse, ProposeError> {
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
    async fn purge_deleted_here(self: &Rc<Self>) {
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

    /// Where the owner of `key` is.
    pub fn place(&self, key: PartitionKey) -> Placement {
        self.router.place(key)
    }

    /// The shard of this node that owns `key` (see [`local_shard`]).
    pub fn owner(&self, key: PartitionKey) -> ShardId {
        local_shard(self.place(key))
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
        let mut first_err = None;
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
        // This shard's partitions first, then the other shards' in shard order.
        groups.sort_by_key(|g| {
            let s = local_shard(g.owner);
            (s != self.shard, s.0)
        });
        let mut out = Vec::new();
        for g in groups {
            if out.len() >= n {
                break;
            }
            let (s, parts) = (local_shard(g.owner), g.items);
            let want = n - out.len();
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
            let (s, items) = (local_shard(g.owner), g.items);
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
        let groups = group_by_owner(items.iter().copied(), |it| {
            self.place(PartitionKey {
                topic: conf.topic,
                partition: it.0,
            })
        });
        // Every shard's part is in flight at once (a task for each other shard's, the first
        // inline), so a batch ack waits for one group commit, not one per shard.
        let mut groups = groups.into_iter();
        let first = groups.next();
        let rest: Vec<_> = groups
            .map(|g| {
                let (host, mesh, me) = (self.host.clone(), self.mesh.clone(), self.shard);
                let s = local_shard(g.owner);
                let its = g.items;
                let task =
                    rt::spawn(
                        async move { settle_via(&host, &mesh, me, s, conf, kind, its).await },
                    );
                (g.positions, task)
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
            fill(
                g.positions,
                settle_via(&self.host, &self.mesh, self.shard, s, conf, kind, g.items).await,
            );
        }
        for (idx, task) in rest {
            fill(idx, task.await);
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
    async fn stats_by_owner(&self, keys: &[PartitionKey]) -> Vec<Option<PartitionGauges>> {
        let mut out: Vec<Option<PartitionGauges>> = vec![None; keys.len()];
        for g in group_by_owner(keys.iter().copied(), |k| self.place(*k)) {
            let s = local_shard(g.owner);
            let rs = if s == self.shard {
                route::local_stats(&self.host, &g.items)
            } else {
                let stats = PartitionOp::Stats { keys: g.items };
                match call_shard(&self.mesh, s, ShardReq::Op(stats)).await {
                    Ok(ShardResp::Op(OpReply::Stats(r))) => r,
                    _ => Vec::new(),
                }
            };
            for (i, r) in g.positions.into_iter().zip(rs) {
                out[i] = Some(r);
            }
        }
        out
    }

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
    pub async fn wait_for_work(&self, topic: TopicId, deadline_ms: u64, ticket: u64) -> bool {
        let now = now_ms();
        if now >= deadline_ms {
            return false;
        }
        // Tell the other shards once per wait window that this shard has waiters on the topic.
        let needs_announce = self
            .announced
            .borrow()
            .get(&topic)
            .is_none_or(|&u| u < deadline_ms);
        if needs_announce && self.shards > 1 {
            let until = deadline_ms.max(now + 1000);
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
            // Wake-ups of the other shards reach this one from now on: look again once.
            return true;
        }
        let notify = self.host.notifier(topic);
        // A shutdown ends every long-poll at once (answered 204), so draining is not held up.
        let woken = futures_lite::future::or(notify.notified_since(ticket), self.shutdown.wait());
        let slice = (deadline_ms - now).min(WAIT_SLICE_MS);
        rt::timeout(Duration::from_millis(slice), woken)
            .await
            .is_ok()
    }

    fn note_interest(&self, topic: TopicId, from: ShardId, until_ms: u64) {
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

    /// Serves a message from another shard.
    pub async fn serve(self: Rc<Self>, from: ShardId, req: ShardReq) -> ShardResp {
        match req {
            ShardReq::Op(op) => ShardResp::Op(route::execute(&self.host, op).await),
            ShardReq::Event(e) => {
                self.hear(from, e).await;
                ShardResp::Done
            }
            ShardReq::Control(c) => self.control(c).await,
        }
    }

    async fn hear(self: &Rc<Self>, from: ShardId, e: ShardEvent) {
        match e {
            ShardEvent::Interest { topic, until_ms } => self.note_interest(topic, from, until_ms),
            ShardEvent::Wake { topic } => self.host.wake_local(topic),
            ShardEvent::Meta(state) => self.install_meta(state),
            ShardEvent::MetaStopped(reason) => *self.meta_stopped.borrow_mut() = Some(reason),
            ShardEvent::IngressFailed => self.ingress_failed.set(true),
        }
    }

    async fn control(self: &Rc<Self>, c: ShardControl) -> ShardResp {
        match c {
            ShardControl::PurgeDeleted => {
                self.purge_deleted_here().await;
                ShardResp::Done
            }
            ShardControl::StartServing => {
                self.released.set(true);
                ShardResp::Done
            }
            ShardControl::Propose(cmd) => ShardResp::Proposed(self.propose_here(*cmd).await),
            ShardControl::FanoutLag { parent } => {
                ShardResp::FanoutLag(self.local_fanout_lag(parent))
            }
            ShardControl::Metrics => ShardResp::Metrics(Box::new(self.metrics_snapshot())),
        }
    }

    /// Every shard's metrics snapshot for a node-wide scrape, one mesh call each (a shard that
    /// does not answer is left out).
    pub async fn metrics_snapshots(&self) -> Vec<crate::metrics::ShardMetrics> {
        // The counts include every single produce this shard answered (crate::transit).
        self.transit.caught_up().await;
        let mut shards = Vec::with_capacity(self.shards as usize);
        for s in 0..self.shards {
            if s == self.shard.0 {
                shards.push(self.metrics_snapshot());
            } else if let Ok(ShardResp::Metrics(m)) = call_shard(
                &self.mesh,
                ShardId(s),
                ShardReq::Control(ShardControl::Metrics),
            )
            .await
            {
                shards.push(*m);
            }
        }
        shards
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

/// What every shard of one node shares: created once by the server and handed to each shard's
/// [`Node`] (the node-wide exceptions of ARCHITECTURE.md: atomics, and a map locked only the
/// first time a shard meets a topic). Never global: two nodes in one process share nothing.
#[derive(Default)]
pub struct NodeWide {
    /// Transit records accepted and handed over by every shard.
    pub transit: Arc<TransitProgress>,
    /// The keyless round-robin cursor of each topic (SEMANTICS.md §5: one rotation per topic
    /// per node).
    rotations: Mutex<HashMap<TopicId, Arc<AtomicU32>>>,
}

impl NodeWide {
    /// The node-wide round-robin cursor of a topic: one atomic shared by every shard, found
    /// through this map (locked) only the first time a shard meets the topic; after that the
    /// shard uses its own handle, so a keyless produce costs one relaxed `fetch_add`.
    fn rotation(&self, topic: TopicId) -> Arc<AtomicU32> {
        let mut m = self.rotations.lock().unwrap_or_else(|e| e.into_inner());
        m.entry(topic)
            .or_insert_with(|| Arc::new(AtomicU32::new(narad_io::sys::random_u64() as u32)))
            .clone()
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
