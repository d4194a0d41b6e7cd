//! The metadata model: plain data that every node holds a full copy of (CLUSTER.md §3), and the
//! commands that change it.
//!
//! This module owns the shapes only (topics, schemas, fan-out links, users, grants) and their
//! serde form. It never does I/O and never reads a clock: every time stamp, random topic id and
//! attach epoch a command needs is chosen by the proposer and carried inside the command, so
//! that [`crate::apply::apply`] is a pure function of (state, command) and every replica that
//! applies the same log reaches the same state.

use std::collections::BTreeMap;

use narad_io::types::TopicId;
use serde::{Deserialize, Serialize};

/// Default of the `topic.max_partitions` setting (SEMANTICS.md §14.2). The setting is enforced
/// by the proposer, which knows the configuration; apply only enforces [`PARTITIONS_HARD_MAX`].
pub const PARTITIONS_MAX_DEFAULT: u32 = 108;
/// Ceiling on any topic's partition count, whatever the configuration: a constant, so apply gives
/// the same answer on every replica.
pub const PARTITIONS_HARD_MAX: u32 = 4096;
/// Smallest partition count of a new topic.
pub const PARTITIONS_MIN: u32 = 3;
/// Shortest retention other than 0 (= keep forever): one hour.
pub const RETENTION_MS_MIN: u64 = 3_600_000;
/// Local fan-out children per parent (SEMANTICS.md §10).
pub const CHILDREN_MAX: usize = 108;
/// Longest fan-out delay: one year.
pub const FANOUT_DELAY_MS_MAX: u64 = 31_536_000_000;
/// Schema versions per topic (SEMANTICS.md §8.4).
pub const SCHEMA_VERSIONS_MAX: usize = 1000;
/// Stored schema history per topic, in bytes of compact JSON (v3.1).
pub const SCHEMA_TOPIC_BYTES_MAX: usize = 4 << 20;
/// Stored schema history over the whole cluster, in bytes of compact JSON (v3.1).
pub const SCHEMA_CLUSTER_BYTES_MAX: usize = 256 << 20;
/// Longest topic name for new topics; older releases created names up to 255 characters.
pub const TOPIC_NAME_CHARS_MAX: usize = 200;
/// Longest username (API.md §11.1).
pub const USERNAME_CHARS_MAX: usize = 64;
/// Longest grant pattern (API.md §13.2).
pub const GRANT_PATTERN_CHARS_MAX: usize = 255;
/// Grants per user: a bound so one user record stays small.
pub const GRANTS_PER_USER_MAX: usize = 256;
/// Patterns per grant.
pub const PATTERNS_PER_GRANT_MAX: usize = 1024;

/// The whole replicated metadata, as of log index `applied_index`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MetaState {
    /// Raft log index of the last applied entry (0 before anything was applied).
    pub applied_index: u64,
    /// Bumped on every change to `topics` (names, fields, schemas, links).
    #[serde(default)]
    pub topics_version: u64,
    /// Bumped on every change to `users`; the authentication cache keys on it.
    #[serde(default)]
    pub users_version: u64,
    /// Topics by name, in byte order of the name (the list API's page order).
    #[serde(default)]
    pub topics: BTreeMap<String, TopicMeta>,
    /// Users by username.
    #[serde(default)]
    pub users: BTreeMap<String, UserMeta>,
    /// Members of the cluster by node id (CLUSTER.md §3, §6); empty for a node that is its
    /// whole cluster.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub members: BTreeMap<String, MemberMeta>,
    /// Node ids removed by a finished decommission (CLUSTER.md §10 step 3), with the leader's
    /// clock (Unix ms) at removal: a tombstoned id never registers again.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tombstones: BTreeMap<String, u64>,
    /// Registered remote clusters by name (API.md §14), their passwords sealed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub remotes: BTreeMap<String, RemoteMeta>,
}

/// Remotes a cluster holds at most (API.md §14).
pub const REMOTES_MAX: usize = 64;

/// A registered remote cluster (API.md §14.1). The password is only ever held sealed
/// (AES-256-GCM under a key derived from the cluster secret, by the proposer).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteMeta {
    pub name: String,
    /// 16 hex characters, fresh on every create.
    pub id: String,
    /// Canonical `https://host[:port][/path]`.
    pub url: String,
    pub username: String,
    /// Hex of nonce and ciphertext with its tag.
    pub sealed_password: String,
    /// Which key sealed it (16 hex characters derived from the key, never the key).
    pub key_version: String,
    /// A keyed digest of the password: compares credentials without showing them.
    pub fingerprint: String,
    pub password_set_at_ms: u64,
    pub password_set_by: String,
    /// Bumped on every change of url, username, password or CA.
    pub credential_version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_pem: Option<String>,
    pub limits: RemoteLimits,
    /// Bumped on every change (the compare-and-swap of a PATCH).
    pub revision: u64,
    pub created_at_ms: u64,
    pub created_by: String,
}

/// A remote's limits (API.md §14.1), defaults filled in by the proposer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteLimits {
    pub max_in_flight: u64,
    pub request_timeout_ms: u64,
    pub idle_conn_timeout_ms: u64,
    pub conn_max_age_ms: u64,
    pub check_interval_ms: u64,
    pub compression: String,
}

/// A member of the cluster as the leader last heard it (CLUSTER.md §6).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberMeta {
    pub id: String,
    /// Its client API address.
    pub addr: String,
    /// Its cluster port address.
    pub cluster_addr: String,
    /// The leader's wall clock (Unix ms) when it stamped the member's last heartbeat.
    pub heartbeat_ms: u64,
    /// Marked dead by the leader after missing heartbeats; a heartbeat revives it.
    pub dead: bool,
    /// Being decommissioned (CLUSTER.md §10): refuses client produce, receives no partitions,
    /// sheds the ones it owns. Survives re-registration; cleared only by a cancel.
    #[serde(default)]
    pub draining: bool,
    /// Records its ingress WAL still holds for other nodes, as of its last heartbeat.
    #[serde(default)]
    pub backlog: u64,
}

impl MemberMeta {
    /// Alive and not draining: may receive partitions (CLUSTER.md §9.2 "receivers").
    pub fn receives(&self) -> bool {
        !self.dead && !self.draining
    }
}

impl MetaState {
    pub fn topic(&self, name: &str) -> Option<&TopicMeta> {
        self.topics.get(name)
    }

    /// The incarnation ids of the topics that exist.
    pub fn topic_ids(&self) -> std::collections::HashSet<TopicId> {
        self.topics.values().map(|t| t.id).collect()
    }

    /// The existing topic whose name equals `name` ignoring ASCII letter case, if any.
    pub fn topic_case_insensitive(&self, name: &str) -> Option<&TopicMeta> {
        self.topics
            .values()
            .find(|t| t.name.eq_ignore_ascii_case(name))
    }

    pub fn user(&self, username: &str) -> Option<&UserMeta> {
        self.users.get(username)
    }
}

/// The fan-out role of a topic (API.md §7 `role`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Standalone,
    Parent,
    Child,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Standalone => "standalone",
            Role::Parent => "parent",
            Role::Child => "child",
        }
    }
}

/// One topic incarnation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopicMeta {
    pub name: String,
    /// Incarnation id: random, chosen by the proposer, never reused for the same name.
    #[serde(with = "topic_id_hex")]
    pub id: TopicId,
    pub partitions: u32,
    /// 0 = keep forever.
    pub retention_ms: u64,
    pub visibility_timeout_ms: u64,
    /// Go `int`s in the original: any positive value (u32 in logs written before 2026-12-03,
    /// which read the same).
    pub max_in_flight_per_partition: u64,
    pub max_acked_ahead_per_partition: u64,
    /// Unix seconds.
    pub created_at_s: u64,
    /// Creating user; `None` with security off or after the user was deleted.
    #[serde(default)]
    pub owner: Option<String>,
    /// Schema history, oldest first; version = index + 1. Never shrinks.
    #[serde(default)]
    pub schemas: Vec<serde_json::Value>,
    /// Fan-out parent when this topic is a child.
    #[serde(default)]
    pub parent: Option<String>,
    /// Fan-out children in attach order when this topic is a parent.
    #[serde(default)]
    pub children: Vec<String>,
    /// 16 hex chars, fresh on every attach; `Some` exactly when `parent` is.
    #[serde(default)]
    pub attach_epoch: Option<String>,
    /// Delay of a delay child; 0 for an immediate child and for non-children.
    #[serde(default)]
    pub fanout_delay_ms: u64,
    /// Attach point per parent partition; empty for non-children.
    #[serde(default)]
    pub attach_offsets: Vec<u64>,
    /// The node owning each partition (CLUSTER.md §3 "assignments"): partition `p` is owned by
    /// `owners[p % owners.len()]`, so partitions added later follow the same rotation. Empty for
    /// a node that is its whole cluster (every partition is local).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owners: Vec<String>,
    /// Partition moves in flight (CLUSTER.md §9.1: the assignment's `target`), by partition.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub moves: BTreeMap<u32, MoveMeta>,
    /// Set on the stub of a remote child (SEMANTICS.md §13): `partitions` is 0, `parent` names
    /// the local parent, and the records go to `remote.topic` on the registered remote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteChildMeta>,
}

/// What a remote child's stub says about its link (API.md §9.1 `remote` object).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteChildMeta {
    /// The registered remote.
    pub name: String,
    /// The topic on the remote.
    pub topic: String,
    /// The target topic's incarnation id when the link was checked (a change is `target_replaced`).
    pub target_id: String,
    /// `attach`, `unconsumed` or `earliest`.
    pub from: String,
    pub lanes: u32,
    pub created_by: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_at_ms: Option<u64>,
    /// Records skipped by an operator, per parent partition, ascending (at most
    /// [`REMOTE_SKIPS_MAX`] per partition).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub skip: BTreeMap<u32, Vec<u64>>,
}

/// Skipped records a remote child keeps per parent partition (SEMANTICS.md §13).
pub const REMOTE_SKIPS_MAX: usize = 4000;
/// Remote children one parent may have (SEMANTICS.md §13 "Bounds").
pub const REMOTE_CHILDREN_MAX: usize = 16;

/// A partition on its way from `source` (its owner when the move was planned) to `target`
/// (CLUSTER.md §9.3). The destination drives it; the flip is a compare-and-swap.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveMeta {
    pub source: String,
    pub target: String,
    /// The leader's clock (Unix ms) when the move was planned.
    pub started_ms: u64,
    /// Set while the source is frozen for the final copy: the token the destination chose for
    /// this freeze. A flip must name it, so a freeze that expired (and the commits the source
    /// took after) can never be flipped over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freeze: Option<u64>,
}

impl TopicMeta {
    /// The node owning partition `p`, or `None` when every partition is local (no cluster).
    pub fn owner_of(&self, p: u32) -> Option<&str> {
        if self.owners.is_empty() {
            return None;
        }
        Some(self.owners[p as usize % self.owners.len()].as_str())
    }

    /// Makes `owners` name every partition explicitly (one entry per partition), so that one
    /// partition's owner can change alone. Partitions added later keep following `p % len`.
    pub fn spell_out_owners(&mut self) {
        if self.owners.is_empty() || self.owners.len() == self.partitions as usize {
            return;
        }
        self.owners = (0..self.partitions)
            .map(|p| self.owners[p as usize % self.owners.len()].clone())
            .collect();
    }

    /// Whether partition `p` is frozen for the last copy of a move.
    pub fn frozen(&self, p: u32) -> bool {
        self.moves.get(&p).is_some_and(|m| m.freeze.is_some())
    }

    pub fn role(&self) -> Role {
        if self.parent.is_some() {
            Role::Child
        } else if !self.children.is_empty() {
            Role::Parent
        } else {
            Role::Standalone
        }
    }

    /// Current schema version: 0 when the topic has no schema.
    pub fn schema_version(&self) -> u32 {
        self.schemas.len() as u32
    }

    pub fn current_schema(&self) -> Option<&serde_json::Value> {
        self.schemas.last()
    }

    /// Bytes of stored schema history, as compact JSON.
    pub fn schema_bytes(&self) -> usize {
        self.schemas.iter().map(json_len).sum()
    }
}

/// Length of the compact JSON text of a value.
pub(crate) fn json_len(v: &serde_json::Value) -> usize {
    serde_json::to_vec(v).map_or(0, |b| b.len())
}

/// A user. The password hash is never part of an API answer (the HTTP layer renders users).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserMeta {
    pub username: String,
    pub password_hash: String,
    #[serde(default)]
    pub grants: Vec<Grant>,
    #[serde(default)]
    pub root: bool,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
}

/// One grant: an action on topics matching any of `patterns` (API.md §13.2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub action: String,
    #[serde(default)]
    pub patterns: Vec<String>,
}

/// A change to the metadata. Everything non-deterministic (ids, epochs, clocks, hashes) is
/// decided by the proposer and carried here.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum MetaCommand {
    /// Create a topic; with `parent` set, create it attached as a fan-out child in one step
    /// (the proposer fills `attach_epoch`, `attach_offsets` and `fanout_delay_ms`; `children`
    /// must be empty).
    CreateTopic(TopicMeta),
    /// Delete the incarnation `id` of topic `name`, detaching its fan-out links.
    DeleteTopic {
        name: String,
        #[serde(with = "topic_id_hex")]
        id: TopicId,
    },
    /// Change one or more mutable fields of incarnation `id`, all or nothing. Caps of 0 must be
    /// resolved to the server default by the proposer. The schema must already have passed the
    /// compatibility check against version `schema_base_version` (the proposer sets it to the
    /// version it checked against, so a concurrent change makes this command fail).
    AlterTopic {
        name: String,
        #[serde(with = "topic_id_hex")]
        id: TopicId,
        #[serde(default)]
        retention_ms: Option<u64>,
        #[serde(default)]
        max_in_flight_per_partition: Option<u64>,
        #[serde(default)]
        max_acked_ahead_per_partition: Option<u64>,
        #[serde(default)]
        partitions: Option<u32>,
        #[serde(default)]
        schema: Option<serde_json::Value>,
        #[serde(default)]
        schema_base_version: Option<u32>,
    },
    /// Attach existing topic `child` under `parent` (SEMANTICS.md §10). `attach_offsets` has one
    /// entry per parent partition (the parent's committed high watermarks, read by the proposer).
    AttachChild {
        parent: String,
        /// Expected parent incarnation, when the proposer read one.
        #[serde(default, with = "opt_topic_id_hex")]
        parent_id: Option<TopicId>,
        child: String,
        #[serde(default, with = "opt_topic_id_hex")]
        child_id: Option<TopicId>,
        delay_ms: u64,
        attach_epoch: String,
        attach_offsets: Vec<u64>,
    },
    /// Creates remote child `stub` of `parent` (API.md §9.1 with `remote`): the stub topic
    /// (`partitions` 0, `remote` set) and the link, with its attach point.
    AttachRemoteChild {
        parent: String,
        #[serde(with = "topic_id_hex")]
        parent_id: TopicId,
        stub: Box<TopicMeta>,
    },
    /// Pauses, resumes or records a skip on remote child `child` of `parent` (API.md §9.4–9.6):
    /// the stub's `remote` becomes `remote` if the link's epoch is still `attach_epoch`.
    SetRemoteChild {
        parent: String,
        child: String,
        attach_epoch: String,
        remote: RemoteChildMeta,
    },
    /// Remove the link between `parent` and `child`; both stay as standalone topics (a remote
    /// child's stub is deleted).
    DetachChild {
        parent: String,
        child: String,
    },
    CreateUser(UserMeta),
    DeleteUser {
        username: String,
    },
    SetGrants {
        username: String,
        grants: Vec<Grant>,
        updated_at_ms: u64,
    },
    SetPassword {
        username: String,
        password_hash: String,
        updated_at_ms: u64,
    },
    /// Seed the root admin `admin` on a cluster without users; refused once any user exists.
    SeedRoot {
        password_hash: String,
        created_at_ms: u64,
    },
    /// A member's heartbeat, stamped by the leader's clock (`at_ms`): registers the member,
    /// or refreshes it and makes it alive again.
    Heartbeat {
        id: String,
        addr: String,
        cluster_addr: String,
        at_ms: u64,
        /// Records its ingress WAL holds for other nodes (its dispatch backlog).
        #[serde(default)]
        backlog: u64,
    },
    /// The leader's verdict: these members missed their heartbeats.
    MarkDead {
        ids: Vec<String>,
    },
    /// Remove Raft server `id` (voter or non-voter) that has no member record (API.md §12.6).
    /// Never a log entry: the leader runs it as a membership change where it would propose
    /// ([`crate::MetaNode::propose`]); one that reaches the log anyway changes nothing.
    ForgetServer {
        id: String,
    },
    /// The planner's moves (CLUSTER.md §9.2), stamped with the leader's clock. Each one whose
    /// partition is still owned by its `source`, has no move yet and whose target may receive
    /// is started; the others are skipped (the next tick plans again).
    StartMoves {
        moves: Vec<PlannedMove>,
        at_ms: u64,
    },
    /// The destination freezes the source for the last copy (CLUSTER.md §9.3 step 2): only
    /// while the move still targets it and the source still owns the partition.
    FreezeMove {
        topic: String,
        #[serde(with = "topic_id_hex")]
        id: TopicId,
        partition: u32,
        target: String,
        token: u64,
    },
    /// A freeze that outlived its TTL ends (the move stays; the destination tries again).
    Unfreeze {
        topic: String,
        #[serde(with = "topic_id_hex")]
        id: TopicId,
        partition: u32,
        token: u64,
    },
    /// The ownership flip (CLUSTER.md §9.3 step 4): `owner := target` only if the owner is
    /// still `source`, the move still targets `target` and, with `token`, the freeze is that
    /// one; without a token (force-promote, step 6) only if the source is marked dead.
    FlipOwner {
        topic: String,
        #[serde(with = "topic_id_hex")]
        id: TopicId,
        partition: u32,
        source: String,
        target: String,
        #[serde(default)]
        token: Option<u64>,
    },
    /// Clears a move (abort, API.md §12.5): only while it targets `target` when one is named.
    EndMove {
        topic: String,
        partition: u32,
        #[serde(default)]
        target: Option<String>,
    },
    /// Starts (`true`) or cancels (`false`) the decommission of member `id` (CLUSTER.md §10).
    SetDraining {
        id: String,
        draining: bool,
    },
    /// The last step of a decommission: deletes the record of member `id`, which owns nothing
    /// and is in no move, and leaves a tombstone stamped with the leader's clock.
    RemoveMember {
        id: String,
        at_ms: u64,
    },
    /// Registers a remote (API.md §14.1): refused when the name is taken or 64 exist.
    CreateRemote(RemoteMeta),
    /// Replaces remote `remote.name` if its revision is still `base_revision` and its id
    /// `remote.id` (a PATCH, API.md §14.4); apply sets the new revision.
    UpdateRemote {
        remote: RemoteMeta,
        base_revision: u64,
    },
    /// Removes a remote (API.md §14.5).
    DeleteRemote {
        name: String,
    },
}

/// One move the planner chose: partition `partition` of incarnation `id` from `source` to
/// `target`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedMove {
    pub topic: String,
    #[serde(with = "topic_id_hex")]
    pub id: TopicId,
    pub partition: u32,
    pub source: String,
    pub target: String,
}

impl std::fmt::Display for MetaCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never prints password hashes: this text reaches logs.
        match self {
            MetaCommand::CreateTopic(t) => write!(f, "CreateTopic({} {})", t.name, t.id),
            MetaCommand::DeleteTopic { name, id } => write!(f, "DeleteTopic({name} {id})"),
            MetaCommand::AlterTopic { name, id, .. } => write!(f, "AlterTopic({name} {id})"),
            MetaCommand::AttachChild { parent, child, .. } => {
                write!(f, "AttachChild({parent} <- {child})")
            }
            MetaCommand::AttachRemoteChild { parent, stub, .. } => {
                write!(f, "AttachRemoteChild({parent} <- {})", stub.name)
            }
            MetaCommand::SetRemoteChild { parent, child, .. } => {
                write!(f, "SetRemoteChild({parent} <- {child})")
            }
            MetaCommand::DetachChild { parent, child } => {
                write!(f, "DetachChild({parent} <- {child})")
            }
            MetaCommand::CreateUser(u) => write!(f, "CreateUser({})", u.username),
            MetaCommand::DeleteUser { username } => write!(f, "DeleteUser({username})"),
            MetaCommand::SetGrants { username, .. } => write!(f, "SetGrants({username})"),
            MetaCommand::SetPassword { username, .. } => write!(f, "SetPassword({username})"),
            MetaCommand::SeedRoot { .. } => write!(f, "SeedRoot"),
            MetaCommand::Heartbeat { id, .. } => write!(f, "Heartbeat({id})"),
            MetaCommand::MarkDead { ids } => write!(f, "MarkDead({})", ids.join(",")),
            MetaCommand::ForgetServer { id } => write!(f, "ForgetServer({id})"),
            MetaCommand::StartMoves { moves, .. } => write!(f, "StartMoves({})", moves.len()),
            MetaCommand::FreezeMove {
                topic, partition, ..
            } => write!(f, "FreezeMove({topic}/{partition})"),
            MetaCommand::Unfreeze {
                topic, partition, ..
            } => write!(f, "Unfreeze({topic}/{partition})"),
            MetaCommand::FlipOwner {
                topic,
                partition,
                target,
                ..
            } => write!(f, "FlipOwner({topic}/{partition} -> {target})"),
            MetaCommand::EndMove {
                topic, partition, ..
            } => write!(f, "EndMove({topic}/{partition})"),
            MetaCommand::SetDraining { id, draining } => {
                write!(f, "SetDraining({id} {draining})")
            }
            MetaCommand::RemoveMember { id, .. } => write!(f, "RemoveMember({id})"),
            MetaCommand::CreateRemote(r) => write!(f, "CreateRemote({})", r.name),
            MetaCommand::UpdateRemote { remote, .. } => write!(f, "UpdateRemote({})", remote.name),
            MetaCommand::DeleteRemote { name } => write!(f, "DeleteRemote({name})"),
        }
    }
}

/// What a successful command produced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum MetaResponse {
    /// The topic after the change (for attach: the parent, API.md §9.1).
    Topic(TopicMeta),
    /// The user after the change.
    User(UserMeta),
    /// A delete or detach took effect.
    Done,
    /// The command changed nothing (re-sent identical schema).
    Unchanged(TopicMeta),
    /// A Raft server was removed from the configuration; `voter`: it was a voter.
    Forgot { id: String, voter: bool },
    /// The remote after the change.
    Remote(RemoteMeta),
}

/// The class of an expected apply error: what went wrong, for the caller to answer (the API
/// layer maps each to a status).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaErrorKind {
    /// The command is malformed or breaks a rule of its fields.
    Invalid,
    /// A rule of the state, not of the caller (root cannot be deleted, ...).
    Forbidden,
    /// What the command names does not exist.
    NotFound,
    /// The command clashes with the state (exists already, attached, ...).
    Conflict,
}

/// An expected refusal of a command; `message` is the spec's error text for the client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaError {
    pub kind: MetaErrorKind,
    pub message: String,
}

impl MetaError {
    pub fn invalid(m: impl Into<String>) -> MetaError {
        MetaError {
            kind: MetaErrorKind::Invalid,
            message: m.into(),
        }
    }
    pub fn forbidden(m: impl Into<String>) -> MetaError {
        MetaError {
            kind: MetaErrorKind::Forbidden,
            message: m.into(),
        }
    }
    pub fn not_found(m: impl Into<String>) -> MetaError {
        MetaError {
            kind: MetaErrorKind::NotFound,
            message: m.into(),
        }
    }
    pub fn conflict(m: impl Into<String>) -> MetaError {
        MetaError {
            kind: MetaErrorKind::Conflict,
            message: m.into(),
        }
    }
}

impl std::fmt::Display for MetaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for MetaError {}

/// `TopicId` as 16 lowercase hex characters (its API form), so the JSON snapshot reads well.
pub mod topic_id_hex {
    use narad_io::types::TopicId;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(id: &TopicId, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&id.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<TopicId, D::Error> {
        let s = String::deserialize(d)?;
        parse(&s).ok_or_else(|| serde::de::Error::custom(format!("bad topic id {s:?}")))
    }

    /// Parses 1–16 hex characters.
    pub fn parse(s: &str) -> Option<TopicId> {
        if s.is_empty() || s.len() > 16 {
            return None;
        }
        u64::from_str_radix(s, 16).ok().map(TopicId)
    }
}

/// `Option<TopicId>` as an optional hex string.
pub mod opt_topic_id_hex {
    use narad_io::types::TopicId;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(id: &Option<TopicId>, s: S) -> Result<S::Ok, S::Error> {
        match id {
            Some(id) => s.serialize_some(&id.to_string()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<TopicId>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(s) => super::topic_id_hex::parse(&s)
                .map(Some)
                .ok_or_else(|| serde::de::Error::custom(format!("bad topic id {s:?}"))),
        }
    }
}
