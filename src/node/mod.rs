//! One shard's view of the node: its partitions (`narad_shard::host::Host`), its read-only copy of
//! the metadata, and the messages it exchanges with the other shards of this process. This file
//! holds the `Node` itself and its lifecycle (start-up release, readiness, stop notices); one
//! file per other concern:
//! - `dispatch.rs`: the messages between shards (addressed work, events, control), their
//!   deadlines, and serving them;
//! - `ops.rs`: partition work routed to its owner (append, take, release, settle, read, stats);
//! - `meta.rs`: the metadata copy, proposals to shard 0, the purge of deleted topics;
//! - `poll.rs`: long-poll wake-ups across shards;
//! - `fanout.rs`: this shard's fan-out cursors;
//! - `snapshot.rs`: this shard's metrics snapshot, and every shard's for a scrape.
//!
//! Routing rules: a partition's owner is the shard router's `Placement` (today always a shard
//! of this node, `owner_shard(key, shards)`); a request that needs partitions owned elsewhere
//! becomes one mesh message per owner shard (a batch produce splits by owner, never per record).
//! Metadata changes are proposed on shard 0 (which hosts Raft) and shard 0 installs the new
//! metadata on every shard before it answers, so a client that got `201` for a topic can use it
//! on any connection at once.
//!
//! Never shared between shards: the `Host`, the lease tables, the metadata `RefCell`. The metadata
//! itself travels as an `Arc` of an immutable snapshot; what the shards do share is `NodeWide`.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use narad_io::rt::{self, Mesh, ShutdownSignal};
use narad_io::types::{PartitionKey, ShardId, TopicId};
use narad_raft::{MetaNode, MetaState};
use narad_shard::fanout::Fanout;
use narad_shard::host::{now_ms, Host};
use narad_shard::route::Router;
use narad_shard::transit::TransitProgress;

pub use narad_shard::route::{
    Lease, OwnerError, PartitionGauges, ReadFailure, SettleFailure, ShardCallError, StoreError,
};

use crate::config::Config;

mod dispatch;
mod fanout;
mod members;
mod meta;
mod moves;
mod ops;
mod poll;
mod remote;
mod snapshot;

use dispatch::{call_shard, wrong_reply};
pub use dispatch::{
    NodeMesh, ShardControl, ShardEvent, ShardReq, ShardResp, MESH_CONTROL_CALL_TIMEOUT_MS,
    MESH_COUNTERS_CALL_TIMEOUT_MS, MESH_DATA_CALL_TIMEOUT_MS,
};
pub use members::{Blocked, RaftView};
pub use moves::{MoveStatus, MoveTally, MOVE_DURATION_BOUNDS_MS};
pub use poll::WAIT_SLICE_MS;
pub use remote::identity;

/// Serves another node's `REMOTE_PROBE` or `REMOTE_VIEW`: (operation, ask) → answer.
pub type ProbeHook = Rc<
    dyn Fn(
        u8,
        Vec<u8>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<u8>, String>>>>,
>;

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
    /// Runs another node's `REMOTE_PROBE` and `REMOTE_VIEW` here (set by the shipper, a layer
    /// above).
    probe_hook: RefCell<Option<ProbeHook>>,
    pub metrics: crate::metrics::Metrics,
    /// Single produces accepted here for other shards' partitions, until handed over.
    pub transit: narad_shard::transit::Transit,
    /// This shard's links to the other nodes of a cluster (data plane).
    links: Option<narad_raft::network::PeerLinks>,
    /// Per topic, the member owning each entry of its `owners` rotation, `None` for this node
    /// (cluster only; rebuilt with every metadata install).
    remote_owners: RefCell<HashMap<TopicId, Rc<[Option<narad_io::types::MemberId>]>>>,
    /// Members this shard's dispatchers cannot hand records to right now (CLUSTER.md §4.3's
    /// stuck destinations): reroutes avoid their partitions, probes of them get a short budget.
    stuck: RefCell<std::collections::HashSet<narad_io::types::MemberId>>,
    /// Topics this shard's long-polls watch on other nodes right now ([`Node::wait_for_work`]).
    remote_watches: RefCell<std::collections::HashSet<(TopicId, narad_io::types::MemberId)>>,
    /// Partitions frozen for a move's last copy, with their destination ([`Node::commit_here`]).
    frozen: RefCell<HashMap<PartitionKey, narad_io::types::MemberId>>,
    /// A reclaim of moved-away partitions is running on this shard.
    reclaiming: Cell<bool>,
}

/// A cluster node is ready only if it heard from a metadata leader this recently (CLUSTER.md §6).
pub const LEADER_CONTACT_MAX_MS: u64 = 5_000;

/// Why a node is not ready (`/readyz` answers `503` with this text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// Start-up has not finished (metadata pushed, deleted topics purged, shards released).
    Starting,
    ShuttingDown,
    /// A cluster node has not heard from a metadata leader within [`LEADER_CONTACT_MAX_MS`].
    NoLeader,
    /// The metadata group stopped for good (a storage failure): no leader until a restart.
    MetadataStopped(String),
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotReady::Starting => f.write_str("startup in progress"),
            NotReady::ShuttingDown => f.write_str("shutting down"),
            NotReady::NoLeader => f.write_str(
                "no metadata leader in view within 5 s: this node is cut off from the cluster's quorum",
            ),
            NotReady::MetadataStopped(reason) => write!(
                f,
                "no metadata leader: the metadata group stopped ({reason}); restart the node"
            ),
        }
    }
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
        let links = (!config.peers.is_empty())
            .then(|| narad_raft::network::PeerLinks::new(remote::identity(&config)));
        let node = Rc::new(Node {
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
            probe_hook: RefCell::new(None),
            metrics: crate::metrics::Metrics::default(),
            transit: narad_shard::transit::Transit::new(shard, shards, wide.transit.clone()),
            links,
            remote_owners: RefCell::new(HashMap::new()),
            stuck: RefCell::new(Default::default()),
            remote_watches: RefCell::new(Default::default()),
            frozen: RefCell::new(HashMap::new()),
            reclaiming: Cell::new(false),
            wide,
        });
        node.index_owners(&node.meta());
        node.index_frozen(&node.meta());
        if node.links.is_some() {
            node.host.track_appends();
        }
        node
    }

    pub fn mark_started(&self) {
        self.started.set(true);
    }

    pub fn shutting_down(&self) -> bool {
        self.shutdown.is_triggered()
    }

    /// Whether this node takes traffic (API.md §15.2), and why not.
    pub fn ready(&self) -> Result<(), NotReady> {
        if !self.started.get() {
            return Err(NotReady::Starting);
        }
        if self.shutting_down() {
            return Err(NotReady::ShuttingDown);
        }
        if let Some(reason) = self.meta_stopped.borrow().as_ref() {
            // API.md §15.2: ready only with a Raft leader in view; a stopped group has none.
            return Err(NotReady::MetadataStopped(reason.clone()));
        }
        if !self.config.peers.is_empty()
            && self
                .wide
                .leader_contact_age_ms()
                .is_none_or(|age| age > LEADER_CONTACT_MAX_MS)
        {
            return Err(NotReady::NoLeader);
        }
        if !self.config.peers.is_empty()
            && self.config.security_enabled
            && self.meta.borrow().users.is_empty()
        {
            // A cluster seeds its root admin through Raft after start-up: a node without it
            // could only answer 401.
            return Err(NotReady::Starting);
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
    /// When shard 0 last knew of a working metadata leader ([`now_ms`]; 0: never), for every
    /// shard's readiness in a cluster.
    leader_contact_ms: AtomicU64,
    /// Shard 0's last published Raft view (a cluster's members route reads it).
    raft_view: Mutex<Arc<members::RaftView>>,
    /// Members the leader's last look would have marked dead but the breaker refused
    /// (`narad_dead_marking_refused`; 0 when not leading).
    dead_marking_refused: AtomicU64,
    /// Heartbeats to the metadata leader that failed in a row (`narad_member_heartbeat_failures`).
    heartbeat_failures: AtomicU64,
    /// Unix milliseconds of the last heartbeat the leader recorded (0: none yet).
    heartbeat_ok_ms: AtomicU64,
    /// The partition moves this node's shards run as the destination, by partition.
    move_workers: Mutex<HashMap<PartitionKey, Arc<Mutex<moves::MoveStatus>>>>,
    /// Moves finished here as the destination.
    move_tally: Mutex<moves::MoveTally>,
    /// What blocks each decommission at the leader's last look (empty when not leading).
    decommission_blocked: Mutex<Vec<members::Blocked>>,
    /// Produce requests being handled by this node's shards (`node_status.produce_in_flight`).
    produce_in_flight: AtomicU64,
    /// When this node's last remote-registry writes were taken (API.md §14: 10 a minute).
    remote_writes: Mutex<std::collections::VecDeque<std::time::Instant>>,
    /// When this node's last remote-child writes were taken (API.md §9.1: 60 a minute).
    remote_child_writes: Mutex<std::collections::VecDeque<std::time::Instant>>,
    /// When each remote was last checked from this node (API.md §14.6: one check per 5 s).
    remote_checks: Mutex<std::collections::HashMap<String, std::time::Instant>>,
}

/// Counts one produce request as in flight on its node until dropped (borrows the node's
/// counter: no reference count to touch on the produce path).
pub struct ProduceInFlight<'a>(&'a AtomicU64);

impl Drop for ProduceInFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Node {
    /// Takes one of the node's `per_minute` remote-registry writes, or says in how many
    /// seconds one frees.
    pub fn remote_write_slot(&self, per_minute: usize) -> Result<(), u64> {
        minute_slot(&self.wide.remote_writes, per_minute)
    }

    /// Takes one of the node's `per_minute` remote-child writes (attach, pause, resume, skip,
    /// detach of a remote child), or says in how many seconds one frees.
    pub fn remote_child_write_slot(&self, per_minute: usize) -> Result<(), u64> {
        minute_slot(&self.wide.remote_child_writes, per_minute)
    }

    /// Takes this node's check of remote `name` (one per [`REMOTE_CHECK_EVERY`]), or says in
    /// how many seconds the next one may run.
    pub fn remote_check_slot(&self, name: &str) -> Result<(), u64> {
        let mut m = self
            .wide
            .remote_checks
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        if let Some(last) = m.get(name) {
            let since = now.duration_since(*last);
            if since < REMOTE_CHECK_EVERY {
                return Err((REMOTE_CHECK_EVERY - since).as_secs() + 1);
            }
        }
        m.insert(name.to_string(), now);
        Ok(())
    }
}

/// Takes one of `per_minute` slots of the sliding minute `taken`, or says in how many seconds
/// one frees.
fn minute_slot(
    taken: &Mutex<std::collections::VecDeque<std::time::Instant>>,
    per_minute: usize,
) -> Result<(), u64> {
    let mut w = taken.lock().unwrap_or_else(|e| e.into_inner());
    let now = std::time::Instant::now();
    let minute = std::time::Duration::from_secs(60);
    while w.front().is_some_and(|t| now.duration_since(*t) >= minute) {
        w.pop_front();
    }
    if w.len() >= per_minute {
        let oldest = *w.front().expect("full");
        return Err((minute - now.duration_since(oldest)).as_secs() + 1);
    }
    w.push_back(now);
    Ok(())
}

/// Shortest time between two checks of one remote from a node (API.md §14.6, §9.5).
pub const REMOTE_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

impl NodeWide {
    /// Partition moves this node runs as the destination, and those it finished.
    pub fn move_figures(&self) -> (u64, MoveTally) {
        (self.moves_inflight(), self.move_tally())
    }

    /// Shard 0: the metadata leader was in view at `ms` ([`now_ms`]).
    pub fn note_leader_contact(&self, ms: u64) {
        self.leader_contact_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// How long ago the metadata leader was last in view; `None` if never.
    pub fn leader_contact_age_ms(&self) -> Option<u64> {
        match self.leader_contact_ms.load(Ordering::Relaxed) {
            0 => None,
            at => Some(now_ms().saturating_sub(at)),
        }
    }

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
