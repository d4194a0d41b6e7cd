//! [`MetaNode`]: the handle the server holds on shard 0 to read and change the metadata.
//!
//! Owns start-up (open the store under `<data_dir>/metastore/`, start openraft, initialise a
//! one-member group on first start, wait for leadership), proposals with a bounded wait, the
//! published state snapshot and its subscribers, and shutdown. Never serves HTTP, never pushes
//! metadata to other shards itself (a subscriber does), never touches partition data.
//!
//! Not `Send`: it lives on shard 0's executor with the Raft group.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::errors::{ClientWriteError, RaftError};
use openraft::network::NetSnapshot;
use openraft::network::RaftNetworkFactory;
use openraft::rt::watch::WatchReceiver;
use openraft::type_config::alias::WatchReceiverOf;
use openraft::{BasicNode, Config, RaftMetrics, ServerState, SnapshotPolicy};

use crate::model::{MetaCommand, MetaError, MetaResponse, MetaState};
use std::cell::Cell;

use narad_io::peer::ops;

use crate::network::{serve_raft, PeerLinks, PeerNetwork, SingleNodeNetwork};
use crate::store::{LogStore, Published, StateMachine};
use crate::types::{Raft, TypeConfig};

/// Settings of the metadata node. Defaults follow CLUSTER.md §3 (snapshot every 8192 entries,
/// 10240 trailing entries kept).
#[derive(Clone, Debug)]
pub struct MetaConfig {
    /// The node's data directory; the metastore lives in `<data_dir>/metastore/`.
    pub data_dir: PathBuf,
    /// This node's id (also its Raft node id).
    pub node_id: String,
    /// Address other members reach this node's Raft service at (recorded in the membership).
    pub raft_addr: String,
    /// How long `start` waits for this node to lead a single-member group.
    pub leader_wait_ms: u64,
    /// How long `propose` waits for its entry to be applied.
    pub propose_timeout_ms: u64,
    pub heartbeat_interval_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// Build a snapshot after this many entries since the last one.
    pub snapshot_logs_since_last: u64,
    /// Entries kept in the log behind a snapshot.
    pub logs_kept_after_snapshot: u64,
    /// Tests only: the log's writes fail (EIO) after this many (see
    /// [`LogStore::fail_writes_after`]).
    pub fail_log_writes_after: Option<u64>,
    /// The voters of a cluster, `(node id, cluster address)`, this node among them; empty for a
    /// node that is its whole cluster.
    pub peers: Vec<(String, String)>,
    /// Whether this node may initialise a never-initialised group with `peers` as its voters
    /// (`cluster.initial_members`).
    pub may_bootstrap: bool,
}

impl MetaConfig {
    pub fn new(data_dir: PathBuf, node_id: String) -> MetaConfig {
        MetaConfig {
            data_dir,
            node_id,
            raft_addr: "127.0.0.1:7943".to_string(),
            leader_wait_ms: 10_000,
            propose_timeout_ms: 10_000,
            heartbeat_interval_ms: 100,
            election_timeout_min_ms: 300,
            election_timeout_max_ms: 600,
            snapshot_logs_since_last: 8192,
            logs_kept_after_snapshot: 10_240,
            fail_log_writes_after: None,
            peers: Vec::new(),
            may_bootstrap: true,
        }
    }

    /// The metastore directory.
    pub fn metastore_dir(&self) -> PathBuf {
        metastore_dir(&self.data_dir)
    }
}

/// The metastore directory under a node's data directory.
pub fn metastore_dir(data_dir: &std::path::Path) -> PathBuf {
    data_dir.join("metastore")
}

/// The file in the metastore directory naming the node its single-member group belongs to.
const NODE_ID_FILE: &str = "node-id";

/// The node id the metastore under `data_dir` was last started with, if it recorded one
/// (written at every start once the group's membership is known to include it).
pub fn stored_node_id(data_dir: &std::path::Path) -> Option<String> {
    let s = std::fs::read_to_string(metastore_dir(data_dir).join(NODE_ID_FILE)).ok()?;
    let id = s.trim();
    (!id.is_empty() && id.len() <= 255).then(|| id.to_string())
}

/// Records `node_id` (write, then rename over the old file). Best effort: without the file a
/// later start under another host name is refused with the mismatch message instead.
fn record_node_id(dir: &std::path::Path, node_id: &str) {
    let tmp = dir.join(format!("{NODE_ID_FILE}.tmp"));
    let r = std::fs::write(&tmp, format!("{node_id}\n"))
        .and_then(|()| std::fs::rename(&tmp, dir.join(NODE_ID_FILE)));
    if let Err(e) = r {
        tracing::warn!(dir = %dir.display(), error = %e, "could not record the node id");
    }
}

/// Why the metadata node did not start.
#[derive(Debug)]
pub enum MetaStartError {
    /// The metastore files could not be opened or are damaged.
    Storage(std::io::Error),
    /// openraft refused the configuration or failed to start.
    Raft(String),
}

impl std::fmt::Display for MetaStartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetaStartError::Storage(e) => write!(f, "metadata store: {e}"),
            MetaStartError::Raft(e) => write!(f, "metadata raft group: {e}"),
        }
    }
}

impl std::error::Error for MetaStartError {}

/// Bytes reserved in the Raft log for a proposal beyond its command's JSON: the entry's own
/// fields and frame header, the committed-id frame written after it, and room for other
/// proposals in flight at the same time (openraft may append them together, after each
/// reserved for itself alone).
const PROPOSE_FRAME_SLACK: u64 = 64 << 10;

/// Why a proposal produced no applied answer.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum ProposeError {
    /// This node is not the leader (or there is none); nothing was appended. `503`.
    NoLeader { leader: Option<String> },
    /// The command was applied and refused by a metadata rule. Status from `kind`.
    Apply(MetaError),
    /// The entry was appended but its fate is unknown (leader change, or no answer within
    /// `propose_timeout_ms`): the change may still be applied; read back before retrying. `503`.
    Indeterminate(String),
    /// The Raft group stopped (storage failure or shutdown). `503`; the node is unhealthy.
    Fatal(String),
    /// The disk has no room for the entry: nothing was appended, the group goes on. `503`.
    DiskFull,
}

impl std::fmt::Display for ProposeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProposeError::NoLeader { .. } => f.write_str("control plane temporarily unavailable"),
            ProposeError::Apply(e) => write!(f, "{e}"),
            ProposeError::Indeterminate(e) => write!(
                f,
                "control plane temporarily unavailable: the change may still be applied, read it back before retrying: {e}"
            ),
            ProposeError::Fatal(e) => write!(f, "control plane temporarily unavailable: {e}"),
            ProposeError::DiskFull => {
                f.write_str("control plane temporarily unavailable: disk full; retry later")
            }
        }
    }
}

impl std::error::Error for ProposeError {}

/// The Raft figures of OPERATIONS.md §9.6 (`narad_raft_*`), read from openraft's metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct RaftGauges {
    /// `follower`, `candidate`, `leader` or `shutdown` (a learner counts as a follower).
    pub state: &'static str,
    pub term: u64,
    pub last_log_index: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub has_leader: bool,
    /// Seconds since this node last knew of a working leader (0 while it leads and has a quorum).
    pub last_contact_seconds: Option<f64>,
    pub voters: u64,
    pub nonvoters: u64,
    /// The group stopped on a fatal error (a storage failure, a panic) and applies nothing more.
    pub apply_stopped: bool,
    /// The state machine's snapshot and apply figures.
    pub store: crate::store::StoreFigures,
}

/// The metadata node handle. Cheap to clone; all clones drive the same group.
#[derive(Clone)]
pub struct MetaNode {
    raft: Raft,
    /// The group's log store, shared with openraft: [`MetaNode::propose`] reserves its room.
    log: LogStore,
    id: String,
    published: Rc<Published>,
    metrics: WatchReceiverOf<TypeConfig, RaftMetrics<TypeConfig>>,
    propose_timeout: Duration,
    /// The group was initialised at this start (an empty metastore).
    fresh: bool,
    /// Links to the other members (a cluster), for forwarding proposals to the leader.
    links: Option<PeerLinks>,
    /// When the leader's last append reached this node (a follower's leader contact).
    leader_heard: Rc<Cell<Option<Instant>>>,
    /// The term this node leads and since when it knows it does (see [`MetaNode::is_leader`]).
    led_since: Rc<Cell<Option<(u64, Instant)>>>,
}

/// The leader's answer to a node asking to join (CLUSTER.md §7).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum JoinAnswer {
    /// Added as a non-voter; promoted once caught up.
    Staged,
    Voter,
    /// Not the leader: ask this one instead (when known).
    NotLeader {
        leader_id: Option<String>,
        leader_addr: Option<String>,
    },
    Refused(String),
}

/// How long a proposal waits for an election under way before it answers that there is no
/// leader.
const LEADER_WAIT_ON_PROPOSE: Duration = Duration::from_secs(3);

/// Longest a membership change may take before the leader gives up on it (it retries later).
const MEMBERSHIP_CHANGE_TIMEOUT: Duration = Duration::from_secs(5);
/// Fewest voters a forget may leave (CLUSTER.md §10: never below 3).
const VOTERS_MIN: usize = 3;
/// How long a leader must have led before it forgets a server (API.md §12.6).
const FORGET_LEADER_AGE_MIN: Duration = Duration::from_secs(12);

/// Hops a proposal follows to find the leader before giving up (leader hints can be stale
/// during an election).
const FORWARD_HOPS_MAX: usize = 3;
/// Pause between two rounds of a proposal that found no leader in reach.
const PROPOSE_RETRY_PAUSE: Duration = Duration::from_millis(50);
/// How long a follower waits to apply a forwarded change before answering it (so that the
/// proposer's next read on this node sees it).
const FORWARD_APPLY_WAIT: Duration = Duration::from_secs(5);

impl MetaNode {
    /// Starts a one-member group: opens (or creates) the metastore, initialises the group on
    /// first start, and waits up to `leader_wait_ms` for leadership.
    pub async fn start(cfg: MetaConfig) -> Result<MetaNode, MetaStartError> {
        MetaNode::start_with_network(cfg, SingleNodeNetwork, true, None).await
    }

    /// Starts as a member of the cluster `cfg.peers`, reaching the others through `links`.
    /// Initialises a never-initialised group with every peer as a voter when `may_bootstrap`
    /// (identical configurations converge), then waits up to `leader_wait_ms` for any leader;
    /// without one it starts anyway (the node serves produce; it is not ready).
    pub async fn start_cluster(
        cfg: MetaConfig,
        links: PeerLinks,
    ) -> Result<MetaNode, MetaStartError> {
        let bootstrap = cfg.may_bootstrap;
        MetaNode::start_with_network(cfg, PeerNetwork(links.clone()), bootstrap, Some(links)).await
    }

    /// Starts with any network factory. With `bootstrap`, a group that was never initialised is
    /// initialised with this node as its only voter.
    pub async fn start_with_network<N>(
        cfg: MetaConfig,
        network: N,
        bootstrap: bool,
        links: Option<PeerLinks>,
    ) -> Result<MetaNode, MetaStartError>
    where
        N: RaftNetworkFactory<TypeConfig>,
        N::Network: NetSnapshot<TypeConfig, SnapshotData = Vec<u8>>,
    {
        let dir = cfg.metastore_dir();
        let published = Rc::new(Published::default());
        let (log, recovery) = LogStore::open(&dir).map_err(MetaStartError::Storage)?;
        if let Some(n) = cfg.fail_log_writes_after {
            log.fail_writes_after(n);
        }
        let sm = StateMachine::open(&dir, published.clone()).map_err(MetaStartError::Storage)?;
        tracing::info!(
            dir = %dir.display(),
            frames = recovery.frames,
            torn_tail_bytes = recovery.torn_tail_bytes,
            applied_index = published.current().applied_index,
            "metadata store opened"
        );
        let config = Config {
            cluster_name: "narad-metadata".to_string(),
            heartbeat_interval: cfg.heartbeat_interval_ms,
            election_timeout_min: cfg.election_timeout_min_ms,
            election_timeout_max: cfg.election_timeout_max_ms,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(cfg.snapshot_logs_since_last),
            max_in_snapshot_log_to_keep: cfg.logs_kept_after_snapshot,
            ..Config::default()
        }
        .validate()
        .map_err(|e| MetaStartError::Raft(e.to_string()))?;
        let raft = Raft::new(
            cfg.node_id.clone(),
            Arc::new(config),
            network,
            log.clone(),
            sm,
        )
        .await
        .map_err(|e| MetaStartError::Raft(e.to_string()))?;
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| MetaStartError::Raft(e.to_string()))?;
        if initialized {
            // A single-member store started under another node id would never elect a leader:
            // say so instead of answering 503 forever.
            // The metrics carry the recovered membership once the core has run; wait briefly
            // for it and skip the check if it never shows (nothing is refused on a guess).
            let recovered = raft
                .wait(Some(Duration::from_millis(2000)))
                .metrics(
                    |m| {
                        m.membership_config
                            .membership()
                            .voter_ids()
                            .next()
                            .is_some()
                    },
                    "membership",
                )
                .await;
            // Voters and non-voters: a node that joined may still be one.
            let voters: Vec<String> = match recovered {
                Ok(m) => {
                    let ms = m.membership_config.membership();
                    ms.voter_ids().chain(ms.learner_ids()).collect()
                }
                Err(_) => vec![cfg.node_id.clone()],
            };
            if !voters.contains(&cfg.node_id) {
                let _ = raft.shutdown().await;
                return Err(MetaStartError::Raft(format!(
                    "the metastore in {} belongs to node(s) {voters:?}, but this node's id is {:?}; \
                     start with the original node id or use a fresh data directory",
                    dir.display(),
                    cfg.node_id
                )));
            }
        }
        if bootstrap && !initialized {
            let members: BTreeMap<String, BasicNode> = if cfg.peers.is_empty() {
                BTreeMap::from([(cfg.node_id.clone(), BasicNode::new(&cfg.raft_addr))])
            } else {
                cfg.peers
                    .iter()
                    .map(|(id, addr)| (id.clone(), BasicNode::new(addr)))
                    .collect()
            };
            match raft.initialize(members.clone()).await {
                Ok(()) => tracing::info!(
                    node_id = %cfg.node_id,
                    voters = ?members.keys().collect::<Vec<_>>(),
                    "metadata group initialised"
                ),
                // Another peer's identical bootstrap reached this node first.
                Err(e) if !cfg.peers.is_empty() => {
                    tracing::info!(error = %e, "metadata group already initialised by a peer")
                }
                Err(e) => return Err(MetaStartError::Raft(e.to_string())),
            }
        }
        record_node_id(&dir, &cfg.node_id);
        let cluster = links.is_some();
        let node = MetaNode {
            metrics: raft.metrics(),
            raft,
            log,
            id: cfg.node_id.clone(),
            published,
            propose_timeout: Duration::from_millis(cfg.propose_timeout_ms),
            fresh: !initialized,
            links,
            leader_heard: Rc::new(Cell::new(None)),
            led_since: Rc::new(Cell::new(None)),
        };
        let id = cfg.node_id.clone();
        let waited = node
            .raft
            .wait(Some(Duration::from_millis(cfg.leader_wait_ms)))
            .metrics(
                move |m| {
                    if cluster {
                        m.current_leader.is_some()
                    } else {
                        m.current_leader.as_ref() == Some(&id)
                    }
                },
                "a leader",
            )
            .await;
        match waited {
            Err(e) => {
                tracing::warn!(error = %e, "metadata node started without a leader in view")
            }
            Ok(m) => {
                // The leader of a group of one has nobody to send heartbeats to and no leader to
                // time out, so the ticker (every 13/64 of the heartbeat interval, 20 ms) would
                // only wake shard 0 fifty times a second for nothing: 2 % of a core on an idle
                // broker. Writes commit without it. A group that gains members needs it again.
                if !cluster && m.membership_config.membership().voter_ids().count() == 1 {
                    node.raft.runtime_config().tick(false);
                }
            }
        }
        Ok(node)
    }

    /// Proposes `cmd` and waits until it is applied: the log index and the answer, or why not.
    /// A follower of a cluster forwards it to the leader (following at most
    /// [`FORWARD_HOPS_MAX`] leader hints) and answers once it applied the change itself.
    pub async fn propose(&self, cmd: MetaCommand) -> Result<(u64, MetaResponse), ProposeError> {
        let mut r = self.propose_here(cmd.clone()).await;
        let Some(links) = &self.links else {
            return r;
        };
        // A "no leader" answer means the change was not appended anywhere, so it is safe to try
        // again: during a hand-over this node's leader hint can name the node that just stopped
        // (the forward is refused) or a candidate whose vote is not yet granted. Retry until
        // LEADER_WAIT_ON_PROPOSE has passed rather than answer 503 in the middle of an election.
        let deadline = Instant::now() + LEADER_WAIT_ON_PROPOSE;
        let mut hops = 0;
        loop {
            match &r {
                Err(ProposeError::NoLeader { leader: Some(l) })
                    if *l != self.id && hops < FORWARD_HOPS_MAX =>
                {
                    hops += 1;
                    r = match self.member_addr(l) {
                        Some(addr) => self.forward(links, &addr, &cmd).await,
                        None => Err(ProposeError::NoLeader { leader: None }),
                    };
                }
                Err(ProposeError::NoLeader { .. }) if Instant::now() < deadline => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if !self.wait_for_leader(left).await {
                        break;
                    }
                    // A hint that just failed may still be current: let the election move on.
                    crate::rt::sleep(PROPOSE_RETRY_PAUSE.min(left)).await;
                    hops = 0;
                    r = self.propose_here(cmd.clone()).await;
                }
                _ => break,
            }
        }
        if let Ok((index, _)) = &r {
            self.wait_applied(*index, FORWARD_APPLY_WAIT).await;
        }
        r
    }

    /// Sends `cmd` to the leader at `addr` and maps its answer.
    async fn forward(
        &self,
        links: &PeerLinks,
        addr: &str,
        cmd: &MetaCommand,
    ) -> Result<(u64, MetaResponse), ProposeError> {
        let body = serde_json::to_vec(cmd).map_err(|e| ProposeError::Fatal(e.to_string()))?;
        let within = self.propose_timeout + Duration::from_secs(5);
        match links.to(addr).call(ops::META_PROPOSE, &body, within).await {
            Ok(reply) => {
                serde_json::from_slice::<Result<(u64, MetaResponse), ProposeError>>(&reply)
                    .unwrap_or_else(|e| {
                        Err(ProposeError::Indeterminate(format!(
                            "malformed answer from the leader: {e}"
                        )))
                    })
            }
            Err(e) if e.not_sent() => Err(ProposeError::NoLeader { leader: None }),
            Err(e) => Err(ProposeError::Indeterminate(e.to_string())),
        }
    }

    /// The cluster address of member `id`, from the current membership.
    pub fn member_addr(&self, id: &str) -> Option<String> {
        let m = self.metrics.borrow_watched();
        m.membership_config
            .membership()
            .get_node(&id.to_string())
            .map(|n| n.addr.clone())
    }

    /// Waits up to `within` until this replica applied `index`. False on timeout.
    pub async fn wait_applied(&self, index: u64, within: Duration) -> bool {
        self.raft
            .wait(Some(within))
            .metrics(
                move |m| m.last_applied.as_ref().map_or(0, |l| l.index()) >= index,
                "applied",
            )
            .await
            .is_ok()
    }

    /// Leader: admits node `id` reachable at `addr` as a non-voter (CLUSTER.md §7); promotion
    /// comes later ([`MetaNode::promote_caught_up`]).
    pub async fn admit(&self, id: &str, addr: &str) -> JoinAnswer {
        if !self.is_leader() {
            let leader_id = self.metrics.borrow_watched().current_leader.clone();
            let leader_addr = leader_id.as_deref().and_then(|l| self.member_addr(l));
            return JoinAnswer::NotLeader {
                leader_id,
                leader_addr,
            };
        }
        let (_, voters, learners) = self.raft_view();
        if voters.iter().any(|v| v == id) {
            return JoinAnswer::Voter;
        }
        if learners.iter().any(|v| v == id) {
            return JoinAnswer::Staged;
        }
        if self.state().tombstones.contains_key(id) {
            return JoinAnswer::Refused(format!(
                "node {id:?} was decommissioned and removed from the cluster; start it with a new node id and an empty data directory"
            ));
        }
        let add = self
            .raft
            .add_learner(id.to_string(), BasicNode::new(addr), false);
        match crate::rt::timeout(MEMBERSHIP_CHANGE_TIMEOUT, add).await {
            Ok(Ok(_)) => {
                tracing::info!(node = id, addr, "node staged as a non-voter");
                JoinAnswer::Staged
            }
            Ok(Err(e)) => JoinAnswer::Refused(e.to_string()),
            Err(_) => JoinAnswer::Refused("membership change did not finish in time".into()),
        }
    }

    /// Leader: promotes the non-voters that `eligible` accepts and whose replicated log is
    /// within `lag` entries of the leader's; answers who was promoted.
    pub async fn promote_caught_up(
        &self,
        eligible: impl Fn(&str) -> bool,
        lag: u64,
    ) -> Vec<String> {
        if !self.is_leader() {
            return Vec::new();
        }
        let ready: std::collections::BTreeSet<String> = {
            let m = self.metrics.borrow_watched();
            let last = m.last_log_index.unwrap_or(0);
            let learners: Vec<String> = m.membership_config.membership().learner_ids().collect();
            learners
                .into_iter()
                .filter(|l| eligible(l))
                .filter(|l| {
                    m.replication
                        .as_ref()
                        .and_then(|r| r.get(l))
                        .and_then(|x| x.as_ref())
                        .is_some_and(|matched| matched.index() + lag >= last)
                })
                .collect()
        };
        if ready.is_empty() {
            return Vec::new();
        }
        let change = self
            .raft
            .change_membership(openraft::ChangeMembers::AddVoterIds(ready.clone()), false);
        match crate::rt::timeout(MEMBERSHIP_CHANGE_TIMEOUT, change).await {
            Ok(Ok(_)) => {
                tracing::info!(nodes = ?ready, "non-voters promoted to voters");
                ready.into_iter().collect()
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "promotion refused");
                Vec::new()
            }
            Err(_) => Vec::new(),
        }
    }

    /// Asks the node at `addr` (cluster port) to admit this one, reachable at `my_addr`.
    pub async fn ask_to_join(&self, addr: &str, my_addr: &str) -> Result<JoinAnswer, String> {
        let links = self.links.as_ref().ok_or("not a cluster node")?;
        let body = serde_json::to_vec(&(&self.id, my_addr)).map_err(|e| e.to_string())?;
        let reply = links
            .to(addr)
            .call(
                ops::META_JOIN,
                &body,
                MEMBERSHIP_CHANGE_TIMEOUT + Duration::from_secs(2),
            )
            .await
            .map_err(|e| e.to_string())?;
        serde_json::from_slice(&reply).map_err(|e| format!("malformed join answer: {e}"))
    }

    /// Waits up to `within` until this node's Raft knows a leader. False on timeout.
    pub async fn wait_for_leader(&self, within: Duration) -> bool {
        self.raft
            .wait(Some(within))
            .metrics(|m| m.current_leader.is_some(), "a leader")
            .await
            .is_ok()
    }

    /// Catches this replica up with every change the leader had applied (and so answered) when
    /// asked: asks the leader for its applied index and waits up to `within` to apply as far.
    /// Answers the index this replica then reached, or `None` when there is no leader in reach
    /// or the wait ran out. A leader answers its own applied index at once.
    pub async fn catch_up(&self, within: Duration) -> Option<u64> {
        let applied = || {
            self.metrics
                .borrow_watched()
                .last_applied
                .as_ref()
                .map_or(0, |l| l.index())
        };
        if self.links.is_none() {
            return Some(applied());
        }
        if self.is_leader() {
            // A leader cut off from its quorum still believes it leads: confirm with a quorum
            // (read index) before vouching for its state.
            let read = self
                .raft
                .ensure_linearizable(openraft::raft::ReadPolicy::ReadIndex);
            return match crate::rt::timeout(within, read).await {
                Ok(Ok(_)) => Some(applied()),
                _ => None,
            };
        }
        let leader = self.metrics.borrow_watched().current_leader.clone()?;
        let addr = self.member_addr(&leader)?;
        let links = self.links.as_ref()?;
        let reply = links
            .to(&addr)
            .call(ops::META_READ_INDEX, b"", within)
            .await
            .ok()?;
        let index: u64 = serde_json::from_slice(&reply).ok()?;
        self.wait_applied(index, within).await.then_some(index)
    }

    /// Leader: transfers leadership to the other voter whose replicated log is furthest, and
    /// waits up to `within` for a new leader. False when there was none to hand to, or it did
    /// not happen in time (openraft only logs a failed transfer).
    pub async fn transfer_leadership(&self, within: Duration) -> bool {
        let to = {
            let m = self.metrics.borrow_watched();
            let voters: Vec<String> = m
                .membership_config
                .membership()
                .voter_ids()
                .filter(|v| *v != self.id)
                .collect();
            voters.into_iter().max_by_key(|v| {
                m.replication
                    .as_ref()
                    .and_then(|r| r.get(v))
                    .and_then(|x| x.as_ref())
                    .map_or(0, |l| l.index())
            })
        };
        let Some(to) = to else { return false };
        if self
            .raft
            .trigger()
            .transfer_leader(to.clone())
            .await
            .is_err()
        {
            return false;
        }
        let me = self.id.clone();
        let moved = self
            .raft
            .wait(Some(within))
            .metrics(
                move |m| m.current_leader.as_ref().is_some_and(|l| *l != me),
                "leadership moved",
            )
            .await
            .is_ok();
        tracing::info!(to, moved, "metadata leadership handed over before stopping");
        moved
    }

    /// Whether this node's Raft knows a leader.
    pub fn has_leader(&self) -> bool {
        self.metrics.borrow_watched().current_leader.is_some()
    }

    /// Serves a request another node sent to this one's metadata group: Raft's own messages,
    /// and proposals forwarded by followers (answered as JSON of the proposal's result).
    pub async fn serve_rpc(&self, from: &str, op: u8, body: &[u8]) -> Result<Vec<u8>, String> {
        match op {
            ops::META_READ_INDEX => {
                if !self.is_leader() {
                    return Err("not the metadata leader".into());
                }
                let m = self.metrics.borrow_watched();
                serde_json::to_vec(&m.last_applied.as_ref().map_or(0, |l| l.index()))
                    .map_err(|e| e.to_string())
            }
            ops::META_JOIN => {
                let (id, addr): (String, String) = serde_json::from_slice(body)
                    .map_err(|e| format!("malformed join request: {e}"))?;
                if id != from {
                    return Err("a node can only ask to join as itself".into());
                }
                serde_json::to_vec(&self.admit(&id, &addr).await).map_err(|e| e.to_string())
            }
            ops::META_PROPOSE => {
                let cmd: MetaCommand =
                    serde_json::from_slice(body).map_err(|e| format!("malformed proposal: {e}"))?;
                // Only the leader's own proposal: never forward a forwarded one again.
                let r = self.propose_here(cmd).await;
                serde_json::to_vec(&r).map_err(|e| e.to_string())
            }
            ops::RAFT_APPEND => {
                let r = serve_raft(&self.raft, &self.log, op, body).await;
                if r.is_ok() {
                    let m = self.metrics.borrow_watched();
                    if m.current_leader.as_deref() == Some(from) {
                        self.leader_heard.set(Some(Instant::now()));
                    }
                }
                r
            }
            _ => serve_raft(&self.raft, &self.log, op, body).await,
        }
    }

    /// Leader: removes Raft server `id`, which must have no member record, be named by no
    /// assignment, not be this leader, and (a voter) leave at least [`VOTERS_MIN`] voters
    /// (API.md §12.6). The answer's index is the membership change's log index.
    async fn forget_here(&self, id: &str) -> Result<(u64, MetaResponse), ProposeError> {
        let refuse = |e: MetaError| Err(ProposeError::Apply(e));
        if !self.is_leader() {
            let leader = self.metrics.borrow_watched().current_leader.clone();
            return Err(ProposeError::NoLeader { leader });
        }
        if id == self.id {
            return refuse(MetaError::invalid(format!(
                "{id} is the Raft leader: it cannot be forgotten"
            )));
        }
        let (_, voters, learners) = self.raft_view();
        let voter = voters.iter().any(|v| v == id);
        if !voter && !learners.iter().any(|l| l == id) {
            return refuse(MetaError::not_found(format!("no Raft server {id:?}")));
        }
        let st = self.state();
        if st.members.contains_key(id) {
            return refuse(MetaError::conflict(format!(
                "{id} has a member record: decommission it instead"
            )));
        }
        if let Some(t) = st
            .topics
            .values()
            .find(|t| t.owners.iter().any(|o| o == id))
        {
            return refuse(MetaError::conflict(format!(
                "{id} is named by an assignment of topic {:?}",
                t.name
            )));
        }
        if voter && voters.len() <= VOTERS_MIN {
            return refuse(MetaError::conflict(format!(
                "forgetting {id} would leave fewer than {VOTERS_MIN} voters"
            )));
        }
        // A new leader may not yet know every server's state (API.md §12.6).
        let led = self
            .led_since
            .get()
            .map_or(Duration::ZERO, |(_, t)| t.elapsed());
        if led < FORGET_LEADER_AGE_MIN {
            return refuse(MetaError::conflict(format!(
                "this leader took over {} ms ago; retry once it has led {} s",
                led.as_millis(),
                FORGET_LEADER_AGE_MIN.as_secs()
            )));
        }
        let index = self.remove_from_config(id, voter).await?;
        tracing::info!(node = id, voter, "Raft server forgotten");
        Ok((
            index,
            MetaResponse::Forgot {
                id: id.to_string(),
                voter,
            },
        ))
    }

    /// Leader: removes a decommissioned member's Raft server (CLUSTER.md §10 step 3), never
    /// leaving fewer than 3 voters (non-voters have no floor). True once it is out (or was).
    pub async fn remove_server(&self, id: &str) -> Result<bool, ProposeError> {
        if !self.is_leader() {
            let leader = self.metrics.borrow_watched().current_leader.clone();
            return Err(ProposeError::NoLeader { leader });
        }
        let (_, voters, learners) = self.raft_view();
        let voter = voters.iter().any(|v| v == id);
        if !voter && !learners.iter().any(|l| l == id) {
            return Ok(true);
        }
        if voter && voters.len() <= VOTERS_MIN {
            return Ok(false);
        }
        self.remove_from_config(id, voter).await?;
        tracing::info!(
            node = id,
            voter,
            "decommissioned member removed from the Raft configuration"
        );
        Ok(true)
    }

    async fn remove_from_config(&self, id: &str, voter: bool) -> Result<u64, ProposeError> {
        let gone: std::collections::BTreeSet<String> = [id.to_string()].into();
        let change = if voter {
            openraft::ChangeMembers::RemoveVoters(gone)
        } else {
            openraft::ChangeMembers::RemoveNodes(gone)
        };
        match crate::rt::timeout(
            MEMBERSHIP_CHANGE_TIMEOUT,
            self.raft.change_membership(change, false),
        )
        .await
        {
            Ok(Ok(r)) => Ok(r.log_id.index),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Err(ProposeError::NoLeader {
                    leader: f.leader_id,
                })
            }
            Ok(Err(e)) => Err(ProposeError::Indeterminate(e.to_string())),
            Err(_) => Err(ProposeError::Indeterminate(
                "membership change did not finish in time".into(),
            )),
        }
    }

    /// Proposes on this node's own Raft: [`ProposeError::NoLeader`] when it does not lead.
    async fn propose_here(&self, cmd: MetaCommand) -> Result<(u64, MetaResponse), ProposeError> {
        if let MetaCommand::ForgetServer { id } = &cmd {
            return self.forget_here(id).await;
        }
        // A heartbeat is judged on the leader's clock (CLUSTER.md §6): the leader stamps it.
        let cmd = match cmd {
            MetaCommand::Heartbeat {
                id,
                addr,
                cluster_addr,
                backlog,
                ..
            } if self.is_leader() => MetaCommand::Heartbeat {
                id,
                addr,
                cluster_addr,
                at_ms: narad_io::types::UnixMillis::now().0,
                backlog,
            },
            other => other,
        };
        // The entry's frame, and the frames openraft appends around it (the committed id), fit
        // in the room reserved here, so a full disk refuses this change instead of failing the
        // append, which would stop the group until a restart.
        let bytes = serde_json::to_vec(&cmd).map_or(0, |v| v.len() as u64) + PROPOSE_FRAME_SLACK;
        if let Err(e) = self.log.reserve(bytes) {
            return Err(if narad_io::file::is_disk_full(&e) {
                ProposeError::DiskFull
            } else {
                ProposeError::Fatal(e.to_string())
            });
        }
        let r = crate::rt::timeout(self.propose_timeout, self.raft.client_write(cmd)).await;
        match r {
            Err(_) => Err(ProposeError::Indeterminate(format!(
                "no answer within {} ms",
                self.propose_timeout.as_millis()
            ))),
            Ok(Ok(resp)) => match resp.data.0 {
                Ok(answer) => Ok((resp.log_id.index, answer)),
                Err(e) => Err(ProposeError::Apply(e)),
            },
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Err(ProposeError::NoLeader {
                    leader: f.leader_id,
                })
            }
            Ok(Err(RaftError::APIError(ClientWriteError::LogEntryDiscarded(f)))) => {
                Err(ProposeError::Indeterminate(f.to_string()))
            }
            Ok(Err(RaftError::APIError(e))) => Err(ProposeError::Fatal(e.to_string())),
            Ok(Err(RaftError::Fatal(e))) => Err(ProposeError::Fatal(e.to_string())),
        }
    }

    /// Whether the group was initialised at this start, from an empty metastore: its state then
    /// knows nothing of what the data directory held before.
    pub fn started_fresh(&self) -> bool {
        self.fresh
    }

    /// Waits up to `within` until every entry of the log is applied (the published state is
    /// then at least what the metastore held when the node stopped). False on timeout.
    pub async fn applied_through_log(&self, within: Duration) -> bool {
        self.raft
            .wait(Some(within))
            .metrics(
                |m| {
                    let applied = m.last_applied.as_ref().map_or(0, |l| l.index());
                    applied >= m.last_log_index.unwrap_or(0)
                },
                "everything in the log applied",
            )
            .await
            .is_ok()
    }

    /// The last applied state: an immutable snapshot, cheap to clone and to send to other shards.
    pub fn state(&self) -> Arc<MetaState> {
        self.published.current()
    }

    /// Calls `f` with the new state after every applied change, before the proposer of that
    /// change gets its answer. Runs on shard 0; must not block. At most
    /// [`crate::store::SUBSCRIBERS_MAX`] subscribers; more are refused with a log line.
    pub fn subscribe(&self, f: Box<dyn Fn(Arc<MetaState>)>) {
        if self.published.subscribe(Rc::from(f)).is_err() {
            tracing::error!(
                max = crate::store::SUBSCRIBERS_MAX,
                "metadata subscriber refused: too many"
            );
        }
    }

    /// Waits until the group has stopped for good (a storage failure, or a shutdown), and says
    /// why.
    pub async fn stopped(&self) -> String {
        let mut rx = self.metrics.clone();
        loop {
            {
                let m = rx.borrow_watched();
                if let Err(e) = &m.running_state {
                    return e.to_string();
                }
                if m.state == ServerState::Shutdown {
                    return "shut down".to_string();
                }
            }
            if rx.changed().await.is_err() {
                return "stopped".to_string();
            }
        }
    }

    /// The Raft view: the leader's id, the voters and the non-voters.
    pub fn raft_view(&self) -> (Option<String>, Vec<String>, Vec<String>) {
        let m = self.metrics.borrow_watched();
        let membership = m.membership_config.membership();
        (
            m.current_leader.clone(),
            membership.voter_ids().collect(),
            membership.learner_ids().collect(),
        )
    }

    /// Whether this node currently leads the group.
    pub fn is_leader(&self) -> bool {
        let m = self.metrics.borrow_watched();
        let leads = m.state == ServerState::Leader && m.current_leader.as_ref() == Some(&self.id);
        // Leadership's age, as first seen here (the membership loop asks every few hundred ms).
        match self.led_since.get() {
            Some((term, _)) if leads && term == m.current_term => {}
            _ if leads => self.led_since.set(Some((m.current_term, Instant::now()))),
            _ => self.led_since.set(None),
        }
        leads
    }

    /// When this node last knew the group had a working leader: for a leader, the last time a
    /// quorum acknowledged it (now, for the only voter of a one-member group); `None` when not
    /// leading.
    /// A follower answers when the leader's last append reached it.
    pub fn last_leader_contact(&self) -> Option<Instant> {
        let m = self.metrics.borrow_watched();
        if m.state != ServerState::Leader {
            return m.current_leader.as_ref().and(self.leader_heard.get());
        }
        // A leader that is the only voter is its own quorum: always in contact. openraft only
        // refreshes `last_quorum_acked` on writes there, which would make an idle node look stale.
        let mut voters = m.membership_config.membership().voter_ids();
        if voters.next().as_ref() == Some(&self.id) && voters.next().is_none() {
            return Some(Instant::now());
        }
        m.last_quorum_acked.as_ref().map(|t| **t)
    }

    /// The `narad_raft_*` gauges now.
    pub fn gauges(&self) -> RaftGauges {
        let contact = self.last_leader_contact();
        let m = self.metrics.borrow_watched();
        let state = match m.state {
            ServerState::Leader => "leader",
            ServerState::Candidate => "candidate",
            ServerState::Shutdown => "shutdown",
            ServerState::Follower | ServerState::Learner => "follower",
        };
        let membership = m.membership_config.membership();
        RaftGauges {
            state,
            term: m.current_term,
            last_log_index: m.last_log_index.unwrap_or(0),
            commit_index: m.cluster_committed.as_ref().map_or(0, |l| l.index()),
            applied_index: m.last_applied.as_ref().map_or(0, |l| l.index()),
            has_leader: m.current_leader.is_some(),
            last_contact_seconds: contact.map(|t| t.elapsed().as_secs_f64()),
            voters: membership.voter_ids().count() as u64,
            nonvoters: membership.learner_ids().count() as u64,
            apply_stopped: m.running_state.is_err(),
            store: self.published.figures(),
        }
    }

    /// This node's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Stops the group. Later proposals answer [`ProposeError::Fatal`]. A leader of a cluster
    /// first hands leadership to the most caught-up other voter and waits (at most 2 s) until
    /// it leads, so that metadata writes pause for an election's worth of time at most
    /// (CLUSTER.md §6: ~150 ms), not for a whole election timeout.
    pub async fn shutdown(&self) {
        if self.links.is_some() && self.is_leader() {
            self.transfer_leadership(Duration::from_secs(2)).await;
        }
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "metadata raft shutdown");
        }
    }
}

#[cfg(test)]
mod tests {
    use narad_io::types::TopicId;

    use super::*;
    use crate::model::{MetaErrorKind, TopicMeta};

    fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("narad-raft-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn topic(name: &str, id: u64) -> TopicMeta {
        TopicMeta {
            name: name.to_string(),
            id: TopicId(id),
            partitions: 3,
            retention_ms: 604_800_000,
            visibility_timeout_ms: 30_000,
            max_in_flight_per_partition: 1024,
            max_acked_ahead_per_partition: 1024,
            created_at_s: 1,
            owner: None,
            schemas: Vec::new(),
            parent: None,
            children: Vec::new(),
            attach_epoch: None,
            fanout_delay_ms: 0,
            attach_offsets: Vec::new(),
            owners: Vec::new(),
            moves: Default::default(),
            remote: None,
        }
    }

    /// Runs `f` on a fresh executor, failing the test after 60 s.
    fn run<F: std::future::Future<Output = ()>>(f: F) {
        narad_io::rt::block_on(async {
            crate::rt::timeout(Duration::from_secs(60), f)
                .await
                .expect("test finished within 60 s");
        });
    }

    #[test]
    fn single_node_starts_leads_applies_and_restarts_from_disk() {
        // Proves a fresh data dir becomes a one-member group that leads, applies a create, tells
        // subscribers before the proposer's answer, answers a refused command as MetaError, and
        // after shutdown and restart from the same dir still holds the topic and keeps leading.
        let dir = temp_dir("restart");
        run(async {
            let node = MetaNode::start(MetaConfig::new(dir.clone(), "n1".into()))
                .await
                .expect("start");
            assert!(node.is_leader());
            assert!(node.last_leader_contact().is_some());
            let seen = Rc::new(std::cell::Cell::new(0u64));
            let s = seen.clone();
            node.subscribe(Box::new(move |st: Arc<MetaState>| s.set(st.applied_index)));
            let (index, resp) = node
                .propose(MetaCommand::CreateTopic(topic("orders", 7)))
                .await
                .expect("create");
            assert!(matches!(resp, MetaResponse::Topic(ref t) if t.name == "orders"));
            assert_eq!(
                seen.get(),
                index,
                "subscriber saw the change before the answer"
            );
            assert_eq!(node.state().applied_index, index);
            assert!(node.state().topic("orders").is_some());
            let e = node
                .propose(MetaCommand::CreateTopic(topic("orders", 8)))
                .await
                .expect_err("duplicate");
            match e {
                ProposeError::Apply(e) => {
                    assert_eq!(
                        (e.kind, e.message.as_str()),
                        (MetaErrorKind::Conflict, "topic already exists")
                    )
                }
                other => panic!("expected an apply error, got {other:?}"),
            }
            node.shutdown().await;
            let after = node
                .propose(MetaCommand::CreateTopic(topic("late", 9)))
                .await;
            assert!(matches!(after, Err(ProposeError::Fatal(_))), "{after:?}");
        });
        run(async {
            let node = MetaNode::start(MetaConfig::new(dir.clone(), "n1".into()))
                .await
                .expect("restart");
            let st = node.state();
            assert_eq!(
                st.topic("orders").map(|t| t.id),
                Some(TopicId(7)),
                "topic survived restart"
            );
            assert!(node.is_leader());
            let (_, resp) = node
                .propose(MetaCommand::CreateTopic(topic("second", 10)))
                .await
                .expect("create after restart");
            assert!(matches!(resp, MetaResponse::Topic(_)));
            assert_eq!(node.state().topics.len(), 2);
            node.shutdown().await;
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn snapshots_and_purges_keep_state_across_restart() {
        // Proves that with a tiny snapshot threshold the state machine snapshot is written and
        // the log purged behind it, and a restart from snapshot + remaining log rebuilds the exact
        // same state.
        let dir = temp_dir("snapshot");
        let mut cfg = MetaConfig::new(dir.clone(), "n1".into());
        cfg.snapshot_logs_since_last = 10;
        cfg.logs_kept_after_snapshot = 5;
        let before = Rc::new(std::cell::RefCell::new(None));
        let b = before.clone();
        let c = cfg.clone();
        run(async move {
            let node = MetaNode::start(c).await.expect("start");
            for i in 0..40u64 {
                node.propose(MetaCommand::CreateTopic(topic(&format!("t{i}"), 100 + i)))
                    .await
                    .expect("create");
            }
            // Snapshot building runs in the background: wait until the file exists.
            let snap = dir.join("metastore").join("snapshot.json");
            for _ in 0..200 {
                if snap.exists() {
                    break;
                }
                crate::rt::sleep(Duration::from_millis(10)).await;
            }
            assert!(snap.exists(), "a snapshot was written");
            *b.borrow_mut() = Some(node.state());
            node.shutdown().await;
        });
        let before = before.borrow_mut().take().expect("state recorded");
        let (log, _) = LogStore::open(&cfg.metastore_dir()).expect("open the log alone");
        let first = log.entry_indexes().first().copied().unwrap_or(0);
        assert!(
            first > 1,
            "entries behind the snapshot were purged (first index {first})"
        );
        drop(log);
        run(async move {
            let node = MetaNode::start(cfg).await.expect("restart");
            assert_eq!(node.state().topics, before.topics);
            assert!(node.state().applied_index >= before.applied_index);
            node.shutdown().await;
        });
        let _ = std::fs::remove_dir_all(temp_dir("snapshot"));
    }

    #[test]
    fn idle_leader_keeps_reporting_fresh_contact_and_proposes_quickly() {
        // Proves an idle single-node leader still reports recent leader contact (readiness must
        // not decay while nothing is written), and prints the propose round-trip figures of this
        // machine (each create is one fdatasync), asserting each stays under one second.
        let dir = temp_dir("idle");
        run(async {
            let node = MetaNode::start(MetaConfig::new(dir.clone(), "n1".into()))
                .await
                .expect("start");
            crate::rt::sleep(Duration::from_millis(1500)).await;
            let contact = node
                .last_leader_contact()
                .expect("a leader reports contact");
            assert!(
                contact.elapsed() < Duration::from_millis(1000),
                "contact is {:?} old",
                contact.elapsed()
            );
            let n = 200u64;
            let mut lat = Vec::with_capacity(n as usize);
            let t0 = Instant::now();
            for i in 0..n {
                let t = Instant::now();
                node.propose(MetaCommand::CreateTopic(topic(
                    &format!("bench-{i}"),
                    1000 + i,
                )))
                .await
                .expect("create");
                lat.push(t.elapsed());
            }
            let total = t0.elapsed();
            lat.sort();
            let p = |q: f64| lat[((lat.len() - 1) as f64 * q) as usize];
            println!(
                "propose CreateTopic, {n} sequential on one node: {:.0}/s, p50 {:?}, p99 {:?}, max {:?}",
                n as f64 / total.as_secs_f64(),
                p(0.5),
                p(0.99),
                lat[lat.len() - 1]
            );
            assert!(lat[lat.len() - 1] < Duration::from_secs(1));
            node.shutdown().await;
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn restart_under_another_node_id_is_refused_clearly() {
        // Proves a metastore created by node "n1" refuses to start as "n2" with a message naming
        // both ids, instead of waiting forever for an election it cannot win.
        let dir = temp_dir("other-id");
        run(async {
            let node = MetaNode::start(MetaConfig::new(dir.clone(), "n1".into()))
                .await
                .expect("start");
            node.shutdown().await;
            let err = MetaNode::start(MetaConfig::new(dir.clone(), "n2".into()))
                .await
                .err()
                .expect("refused");
            let msg = err.to_string();
            assert!(msg.contains("\"n1\"") && msg.contains("\"n2\""), "{msg}");
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Child half of `kill_9_loses_no_acknowledged_change`: does nothing unless the parent set
    /// NARAD_RAFT_CRASH_DIR; then creates topics until killed, printing `ACK <name>` after each
    /// answer.
    #[test]
    fn crash_child_proposes_until_killed() {
        let Some(dir) = std::env::var_os("NARAD_RAFT_CRASH_DIR") else {
            return;
        };
        run(async move {
            let node = MetaNode::start(MetaConfig::new(PathBuf::from(dir), "n1".into()))
                .await
                .expect("start");
            for i in 0..10_000u64 {
                let name = format!("crash-{i}");
                node.propose(MetaCommand::CreateTopic(topic(&name, 50_000 + i)))
                    .await
                    .expect("create");
                use std::io::Write;
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "ACK {name}");
                let _ = out.flush();
            }
        });
    }

    #[test]
    fn kill_9_loses_no_acknowledged_change() {
        // Proves durability of acknowledged metadata: a child process creates topics and reports
        // each answered create; it is killed with SIGKILL mid-stream, and a restart from its
        // directory holds every acknowledged topic (and at most the one in flight beyond them).
        use std::io::BufRead;
        let dir = temp_dir("kill9");
        let exe = std::env::current_exe().expect("test binary");
        let mut child = std::process::Command::new(exe)
            .args([
                "--exact",
                "node::tests::crash_child_proposes_until_killed",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("NARAD_RAFT_CRASH_DIR", &dir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().expect("child stdout");
        // The child ends itself within 60 s (its `run` bound), so reading cannot hang forever.
        let mut lines = std::io::BufReader::new(stdout).lines();
        let mut acked = Vec::new();
        let record = |line: std::io::Result<String>, acked: &mut Vec<String>| {
            // libtest prints the test's name without a newline first, so the first ACK may
            // share a line with it.
            if let Ok(l) = line {
                if let Some(i) = l.find("ACK ") {
                    acked.push(l[i + 4..].to_string());
                }
            }
        };
        while acked.len() < 60 {
            match lines.next() {
                Some(line) => record(line, &mut acked),
                None => break,
            }
        }
        child.kill().expect("SIGKILL the child");
        let _ = child.wait();
        // Acks the child printed before it died count as acknowledged too.
        for line in lines {
            record(line, &mut acked);
        }
        assert!(
            acked.len() >= 60,
            "child acknowledged only {} creates",
            acked.len()
        );
        run(async {
            let node = MetaNode::start(MetaConfig::new(dir.clone(), "n1".into()))
                .await
                .expect("restart");
            let st = node.state();
            for name in &acked {
                assert!(st.topic(name).is_some(), "acknowledged topic {name} lost");
            }
            // Beyond the acknowledged ones, at most the create in flight at the kill survives.
            assert!(
                st.topics.len() <= acked.len() + 1,
                "{} topics for {} acks: {:?} / {:?}",
                st.topics.len(),
                acked.len(),
                st.topics.keys().collect::<Vec<_>>(),
                acked
            );
            node.shutdown().await;
        });
        let _ = std::fs::remove_dir_all(&dir);
    }
}
