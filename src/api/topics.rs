//! Topic routes (API.md §6–8): create, list, describe, alter, delete, schema history. Field
//! validation happens here, before anything is proposed; the conflicts that depend on the current
//! metadata (name taken, case collision, schema base version) are decided by the Raft state
//! machine so that they hold cluster-wide.

use std::rc::Rc;

use narad_io::types::{PartitionId, PartitionKey, TopicId};
use narad_raft::{MetaCommand, TopicMeta};
use serde::{Deserialize, Serialize};

use super::params::Params;
use super::{error, json, propose_error};
use crate::http::{Request, Response};
use crate::node::Node;

/// The Topic object of API.md §7.
#[derive(Serialize)]
pub struct TopicView<'a> {
    name: &'a str,
    id: String,
    partitions: u32,
    retention_ms: u64,
    visibility_timeout_ms: u64,
    max_in_flight_per_partition: u64,
    max_acked_ahead_per_partition: u64,
    created_at: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    owner: Option<&'a str>,
    role: &'static str,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    children: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    parent: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    attach_epoch: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fanout_delay_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    attach_offsets: Option<&'a [u64]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    schema_version: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    schema: Option<&'a serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    partition_stats: Option<Vec<PartitionStatsView>>,
    /// `true` when some partition entries are placeholders (API.md §6.3).
    #[serde(skip_serializing_if = "Option::is_none")]
    partial: Option<bool>,
    /// A remote child's stub: its link (API.md §9.1 `remote` object).
    #[serde(skip_serializing_if = "Option::is_none")]
    remote: Option<&'a narad_raft::RemoteChildMeta>,
}

#[derive(Serialize)]
pub struct PartitionStatsView {
    index: u32,
    segments: u32,
    oldest_offset: u64,
    next_offset: u64,
    high_watermark: u64,
    size_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    oldest_segment_at: Option<u64>,
    owner_node: String,
    status: &'static str,
    /// Only on a placeholder for an owner that could not report (`dead` or `unreachable`).
    #[serde(skip_serializing_if = "Option::is_none")]
    owner_liveness: Option<&'static str>,
}

pub fn view(t: &TopicMeta) -> TopicView<'_> {
    let child = t.parent.is_some();
    TopicView {
        name: &t.name,
        id: t.id.to_string(),
        partitions: t.partitions,
        retention_ms: t.retention_ms,
        visibility_timeout_ms: t.visibility_timeout_ms,
        max_in_flight_per_partition: t.max_in_flight_per_partition,
        max_acked_ahead_per_partition: t.max_acked_ahead_per_partition,
        created_at: t.created_at_s,
        owner: t.owner.as_deref().filter(|o| !o.is_empty()),
        role: t.role().as_str(),
        children: &t.children,
        parent: t.parent.as_deref(),
        attach_epoch: t.attach_epoch.as_deref(),
        fanout_delay_ms: (child && t.fanout_delay_ms > 0).then_some(t.fanout_delay_ms),
        attach_offsets: child.then_some(t.attach_offsets.as_slice()),
        schema_version: None,
        schema: None,
        partition_stats: None,
        partial: None,
        remote: t.remote.as_ref(),
    }
}

/// The Topic object with the current schema and its version, as describe shows them: the
/// answer of a create and of a PATCH, so a client that set a schema reads the version it got
/// (the Go SDK's `SetSchema` returns that Topic; a chained conditional update needs the version).
fn view_with_schema(t: &TopicMeta) -> TopicView<'_> {
    let mut v = view(t);
    v.schema_version = Some(t.schema_version());
    v.schema = t.current_schema();
    v
}

/// The owners of a new topic's partitions (CLUSTER.md §8): round-robin over the cluster's
/// members, starting at a member that turns with every topic created; a child's rotation is its
/// parent's shifted by one, so child partition `p` lives away from parent partition `p` (both
/// follow `owners[p % n]`). Empty for a node that is its whole cluster.
/// Members marked dead are left out while another one is alive.
fn placement(node: &Node, parent_owners: Vec<String>) -> Vec<String> {
    let meta = node.meta();
    // The members the metadata knows (peers and nodes that joined), else the peer list.
    let mut all: Vec<String> = node
        .config
        .peers
        .iter()
        .map(|p| p.id.clone())
        .filter(|id| !meta.tombstones.contains_key(id))
        .collect();
    all.extend(
        meta.members
            .keys()
            .filter(|id| !all.contains(id))
            .cloned()
            .collect::<Vec<_>>(),
    );
    let alive: Vec<String> = all
        .iter()
        .filter(|id| meta.members.get(*id).is_none_or(|m| m.receives()))
        .cloned()
        .collect();
    let members = if alive.is_empty() { all } else { alive };
    if members.is_empty() {
        return Vec::new();
    }
    let n = members.len();
    if !parent_owners.is_empty() {
        let mut o = parent_owners;
        let len = o.len();
        o.rotate_left(1 % len);
        return o;
    }
    let start = node.meta().topics.len() % n;
    (0..n).map(|i| members[(start + i) % n].clone()).collect()
}

/// Topic names of SEMANTICS.md §14.1 (new topics: 1–200 characters).
pub fn valid_new_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    name: Option<String>,
    partitions: Option<i64>,
    retention_ms: Option<i64>,
    visibility_timeout_ms: Option<i64>,
    max_in_flight_per_partition: Option<i64>,
    max_acked_ahead_per_partition: Option<i64>,
    schema: Option<Box<serde_json::value::RawValue>>,
    parent: Option<String>,
    fanout_delay_ms: Option<i64>,
    #[allow(dead_code)]
    owner: Option<String>,
}

fn invalid(msg: String) -> Response {
    error(400, &format!("invalid argument: {msg}"))
}

/// A non-negative integer field where 0 means the server default.
fn defaulted(field: &str, v: Option<i64>, default: u64) -> Result<u64, Response> {
    match v {
        None | Some(0) => Ok(default),
        Some(n) if n < 0 => Err(invalid(format!("{field} must be >= 0 (0 = use default)"))),
        Some(n) => Ok(n as u64),
    }
}

/// A per-partition cap (`max_*_per_partition`): 0 means the server default; any positive value
/// is kept (a Go `int` in the original, where a huge one means "no cap").
fn cap_field(field: &str, v: Option<i64>, default: u32) -> Result<u64, Response> {
    defaulted(field, v, u64::from(default))
}

/// Proposes one metadata change; a refusal becomes its answer.
async fn apply(node: &Rc<Node>, cmd: MetaCommand) -> Result<(), Response> {
    node.propose(cmd).await.map(|_| ()).map_err(propose_error)
}

/// `retention_ms` of create and alter: absent → `None`, 0 → forever, else ≥ 1 h.
fn retention(v: Option<i64>) -> Result<Option<u64>, Response> {
    match v {
        None => Ok(None),
        // The form API.md §6.1 gives every negative number (0 is "keep forever" here).
        Some(n) if n < 0 => Err(invalid(
            "retention_ms must be >= 0 (0 = use default)".into(),
        )),
        Some(0) => Ok(Some(0)),
        Some(n) if n < 3_600_000 => Err(invalid(format!(
            "retention_ms ({n}) is below the minimum of 3600000 (1 hour)"
        ))),
        Some(n) => Ok(Some(n as u64)),
    }
}

fn partitions_for_create(v: Option<i64>, default: u32, max: u32) -> Result<u32, Response> {
    match v {
        None | Some(0) => Ok(default),
        Some(n) if n < 3 => Err(invalid("partitions must be >= 3 (0 = use default)".into())),
        Some(n) if n > i64::from(max) => Err(invalid(format!(
            "partitions ({n}) exceeds topic.max_partitions ({max})"
        ))),
        Some(n) => Ok(n as u32),
    }
}

/// Deserializes a member that is present, `null` included, as `Some`.
fn present<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Box<serde_json::value::RawValue>>, D::Error> {
    Box::<serde_json::value::RawValue>::deserialize(d).map(Some)
}

/// The history of a new topic created with `schema`: that document as version 1.
fn schema_v1(
    raw: Option<&serde_json::value::RawValue>,
) -> Result<Vec<serde_json::Value>, Response> {
    let Some(raw) = raw else {
        return Ok(Vec::new());
    };
    let doc = crate::schema::parse_document(raw).map_err(|e| error(400, &e.0))?;
    crate::schema::check_document(&doc).map_err(|e| error(400, &e.0))?;
    Ok(vec![doc])
}

/// The schema a PATCH registers (SEMANTICS.md §8.4): `None` when the document equals the current
/// version up to annotations (whatever the base version). Otherwise checks the base version, the
/// document rules, the parent-managed rule and compatibility with the current version before
/// anything is proposed.
fn schema_change(
    t: &TopicMeta,
    raw: &serde_json::value::RawValue,
    base: Option<i64>,
) -> Result<Option<serde_json::Value>, Response> {
    let doc = crate::schema::parse_document(raw).map_err(|e| error(400, &e.0))?;
    crate::schema::check_document(&doc).map_err(|e| error(400, &e.0))?;
    // A re-send of the current schema registers nothing whatever its base version: a retried
    // conditional update whose first attempt was applied (its answer lost) is answered 200,
    // not 409 (the Go SDK retries a set-schema it is uncertain about).
    let current = t.current_schema();
    if current.is_some_and(|c| crate::schema::same_ignoring_annotations(c, &doc)) {
        return Ok(None);
    }
    if base.is_some_and(|b| b != i64::from(t.schema_version())) {
        return Err(error(409, "schema version conflict"));
    }
    let Some(current) = current else {
        return Ok(Some(doc));
    };
    if let Some(p) = &t.parent {
        return Err(error(
            409,
            &format!(
                "schema is parent-managed while attached to a fan-out parent: topic \"{}\" is attached to \"{p}\"",
                t.name
            ),
        ));
    }
    crate::schema::compatible(current, t.schema_version(), &doc).map_err(|e| error(400, &e.0))?;
    Ok(Some(doc))
}

/// Creates a topic owned by `owner` (the authenticated caller; `None` with security off: a
/// client-sent `owner` is ignored).
pub async fn create(node: &Rc<Node>, req: &Request, owner: Option<String>) -> Response {
    let body: CreateBody = match crate::wire::body::decode_strict(&req.body, "createTopicRequest") {
        Ok(b) => b,
        Err(e) => return error(400, &e),
    };
    let d = &node.config.topic;
    let Some(name) = body.name.filter(|n| !n.is_empty()) else {
        return invalid("name is required".into());
    };
    if !valid_new_name(&name) {
        return invalid(format!(
            "topic name {} must be 1-200 characters of A-Z a-z 0-9 . _ - and not \".\" or \"..\"",
            crate::wire::go_quote(name.as_bytes())
        ));
    }
    // Zero values mean absent, as in Go's request struct: `"parent":""` is no parent and
    // `"fanout_delay_ms":0` no delay (clients that send every field must still create).
    let parent = body.parent.as_deref().filter(|p| !p.is_empty());
    if body.fanout_delay_ms.is_some_and(|d| d != 0) && parent.is_none() {
        return invalid("fanout_delay_ms requires parent".into());
    }
    let link =
        match super::children::link_for_create(node, &name, parent, body.fanout_delay_ms).await {
            Ok(l) => l,
            Err(r) => return r,
        };
    let schemas = tri!(schema_v1(body.schema.as_deref()));
    let partitions = match partitions_for_create(
        body.partitions,
        link.as_ref().map_or(d.default_partitions, |l| l.partitions),
        d.max_partitions,
    ) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let retention_ms = match retention(body.retention_ms) {
        Ok(r) => r.unwrap_or(d.default_retention_age_ms),
        Err(r) => return r,
    };
    let visibility = match defaulted(
        "visibility_timeout_ms",
        body.visibility_timeout_ms,
        d.default_visibility_timeout_ms,
    ) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let caps = cap_field(
        "max_in_flight_per_partition",
        body.max_in_flight_per_partition,
        d.default_max_in_flight_per_partition,
    )
    .and_then(|inflight| {
        cap_field(
            "max_acked_ahead_per_partition",
            body.max_acked_ahead_per_partition,
            d.default_max_acked_ahead_per_partition,
        )
        .map(|ahead| (inflight, ahead))
    });
    let (max_in_flight, max_acked_ahead) = match caps {
        Ok(c) => c,
        Err(r) => return r,
    };
    let created_at_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let parent_owners = parent
        .and_then(|p| node.topic(p))
        .map(|p| p.owners)
        .unwrap_or_default();
    let meta = TopicMeta {
        name: name.clone(),
        id: TopicId(narad_io::sys::random_u64()),
        partitions,
        retention_ms,
        visibility_timeout_ms: visibility,
        max_in_flight_per_partition: max_in_flight,
        max_acked_ahead_per_partition: max_acked_ahead,
        created_at_s,
        owner,
        schemas,
        parent: link.as_ref().map(|l| l.parent.clone()),
        children: Vec::new(),
        attach_epoch: link.as_ref().map(|l| l.epoch.clone()),
        fanout_delay_ms: link.as_ref().map_or(0, |l| l.delay_ms),
        attach_offsets: link.map(|l| l.offsets).unwrap_or_default(),
        owners: placement(node, parent_owners),
        moves: Default::default(),
        remote: None,
    };
    if let Err(e) = node.propose(MetaCommand::CreateTopic(meta)).await {
        return propose_error(e);
    }
    match node.topic(&name) {
        Some(t) => json(201, &view_with_schema(&t)),
        None => error(
            503,
            "topic create was applied but is not visible yet; retry",
        ),
    }
}

/// A page of topics in name order; `readable` drops the caller's unreadable topics after the
/// page is cut (API.md §6.2: a page may be short while `next_page_token` is set).
pub fn list(node: &Rc<Node>, req: &Request, readable: &dyn Fn(&TopicMeta) -> bool) -> Response {
    let q = Params::new(&req.query);
    let limit = match tri!(q.given("limit")) {
        None => 100,
        Some(s) => match s.parse::<i64>() {
            Ok(n) if n >= 1 => n.min(1000) as usize,
            _ => return error(400, "limit must be a positive integer"),
        },
    };
    let token = tri!(q.str("page_token")).unwrap_or_default();
    let meta = node.meta();
    let mut after = meta.topics.range::<str, _>((
        std::ops::Bound::Excluded(token.as_str()),
        std::ops::Bound::Unbounded,
    ));
    if token.is_empty() {
        after = meta.topics.range::<str, _>(..);
    }
    let page: Vec<&TopicMeta> = after.by_ref().take(limit).map(|(_, t)| t).collect();
    let more = after.next().is_some();
    let next = if more {
        page.last().map(|t| t.name.clone()).unwrap_or_default()
    } else {
        String::new()
    };
    #[derive(Serialize)]
    struct Page<'a> {
        topics: Vec<TopicView<'a>>,
        next_page_token: String,
    }
    json(
        200,
        &Page {
            topics: page.into_iter().filter(|t| readable(t)).map(view).collect(),
            next_page_token: next,
        },
    )
}

pub async fn describe(node: &Rc<Node>, req: &Request, name: &str) -> Response {
    let meta = node.meta();
    let Some(t) = meta.topic(name) else {
        return error(404, "topic not found");
    };
    let q = Params::new(&req.query);
    let parts: Vec<u32> = match tri!(q.given("partition")) {
        None => (0..t.partitions).collect(),
        Some(s) => match s.parse::<i64>() {
            Ok(p) if p >= 0 && p < i64::from(t.partitions) => vec![p as u32],
            _ => return error(400, "invalid partition"),
        },
    };
    let keys: Vec<PartitionKey> = parts
        .iter()
        .map(|&p| PartitionKey {
            topic: t.id,
            partition: PartitionId(p),
        })
        .collect();
    // Each owner asked once (2 s budget for another node's); an owner that could not report
    // leaves a placeholder and marks the answer partial (API.md §6.3).
    let stats = node.stats_by_owner(&keys).await;
    let node_id = node.config.node_id.clone();
    let mut v = view_with_schema(t);
    if stats.iter().any(Option::is_none) {
        v.partial = Some(true);
    }
    v.partition_stats = Some(
        parts
            .iter()
            .zip(stats)
            .map(|(&p, got)| {
                let owner = t.owner_of(p).unwrap_or(&node_id).to_string();
                let Some((s, _, _, _)) = got else {
                    let dead = node.member_dead(narad_io::types::MemberId::of(&owner));
                    return PartitionStatsView {
                        index: p,
                        segments: 0,
                        oldest_offset: 0,
                        next_offset: 0,
                        high_watermark: 0,
                        size_bytes: 0,
                        oldest_segment_at: None,
                        owner_node: owner,
                        status: "owner_unavailable",
                        owner_liveness: Some(if dead { "dead" } else { "unreachable" }),
                    };
                };
                PartitionStatsView {
                    index: p,
                    segments: s.segments,
                    oldest_offset: s.oldest_offset.0,
                    next_offset: s.next_offset.0,
                    high_watermark: s.high_watermark.0,
                    size_bytes: s.size_bytes,
                    oldest_segment_at: s.oldest_segment_at.map(|m| m.0 / 1000),
                    owner_node: owner,
                    status: "ok",
                    owner_liveness: None,
                }
            })
            .collect(),
    );
    json(200, &v)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AlterBody {
    partitions: Option<i64>,
    retention_ms: Option<i64>,
    max_in_flight_per_partition: Option<i64>,
    max_acked_ahead_per_partition: Option<i64>,
    /// `null` is kept (not read as absent) so that it can be refused: a schema cannot be removed.
    #[serde(default, deserialize_with = "present")]
    schema: Option<Box<serde_json::value::RawValue>>,
    schema_base_version: Option<i64>,
}

pub async fn alter(node: &Rc<Node>, req: &Request, name: &str) -> Response {
    let body: AlterBody = match crate::wire::body::decode_strict(&req.body, "alterTopicRequest") {
        Ok(b) => b,
        Err(e) => return error(400, &e),
    };
    // `partitions: 0` is "no change" (API.md §6.4), so it alone is no field.
    if body.partitions.is_none_or(|p| p == 0)
        && body.retention_ms.is_none()
        && body.max_in_flight_per_partition.is_none()
        && body.max_acked_ahead_per_partition.is_none()
        && body.schema.is_none()
    {
        return error(
            400,
            "at least one of partitions, retention_ms, max_*_per_partition, or schema is required",
        );
    }
    let meta = node.meta();
    let Some(t) = meta.topic(name) else {
        return error(404, "topic not found");
    };
    // A remote child's stub has no partitions or settings of its own here.
    if let Some(r) = super::messages::stub_refusal(t) {
        return r;
    }
    let d = &node.config.topic;
    let alter = |retention_ms, inflight, ahead, partitions| MetaCommand::AlterTopic {
        name: t.name.clone(),
        id: t.id,
        retention_ms,
        max_in_flight_per_partition: inflight,
        max_acked_ahead_per_partition: ahead,
        partitions,
        schema: None,
        schema_base_version: None,
    };
    // Applied in the order retention → caps → partitions → schema, each group checked and then
    // written on its own (API.md §6.4): no transaction, so the first failure answers its error
    // and the groups before it stay applied. (No group changes what a later one checks against:
    // the partition count and schema version read from `t` stay current.)
    if body.retention_ms.is_some() {
        let retention_ms = tri!(retention(body.retention_ms));
        tri!(apply(node, alter(retention_ms, None, None, None)).await);
    }
    if body.max_in_flight_per_partition.is_some() || body.max_acked_ahead_per_partition.is_some() {
        let cap = |field, v: Option<i64>, default| {
            v.map(|v| cap_field(field, Some(v), default)).transpose()
        };
        let inflight = tri!(cap(
            "max_in_flight_per_partition",
            body.max_in_flight_per_partition,
            d.default_max_in_flight_per_partition,
        ));
        let ahead = tri!(cap(
            "max_acked_ahead_per_partition",
            body.max_acked_ahead_per_partition,
            d.default_max_acked_ahead_per_partition,
        ));
        tri!(apply(node, alter(None, inflight, ahead, None)).await);
    }
    let partitions = match body.partitions {
        None | Some(0) => None,
        // The spec text has no `invalid argument: ` prefix here (API.md §6.4).
        Some(n) if n < 0 => return error(400, "partitions must be > 0"),
        Some(n) if n > i64::from(d.max_partitions) => {
            return invalid(format!(
                "partitions ({n}) exceeds topic.max_partitions ({})",
                d.max_partitions
            ));
        }
        Some(n) if n <= i64::from(t.partitions) => {
            return invalid(format!(
                "new partition count ({n}) must be greater than current ({}); decrease is not supported",
                t.partitions
            ));
        }
        Some(n) => Some(n as u32),
    };
    if partitions.is_some() {
        tri!(apply(node, alter(None, None, None, partitions)).await);
    }
    if let Some(raw) = body.schema.as_deref() {
        if let Some(s) = tri!(schema_change(t, raw, body.schema_base_version)) {
            // Based on the version the compatibility check read: a concurrent change answers 409.
            let step = MetaCommand::AlterTopic {
                name: t.name.clone(),
                id: t.id,
                retention_ms: None,
                max_in_flight_per_partition: None,
                max_acked_ahead_per_partition: None,
                partitions: None,
                schema: Some(s),
                schema_base_version: Some(t.schema_version()),
            };
            tri!(apply(node, step).await);
        }
    }
    match node.topic(name) {
        Some(t) => json(200, &view_with_schema(&t)),
        None => error(404, "topic not found"),
    }
}

pub async fn delete(node: &Rc<Node>, req: &Request, name: &str) -> Response {
    let q = Params::new(&req.query);
    match tri!(q.given("force")).as_deref() {
        None | Some("true") | Some("false") => {}
        Some(_) => return error(400, "invalid force: want \"true\" or \"false\""),
    }
    let meta = node.meta();
    let Some(t) = meta.topic(name) else {
        return error(404, "topic not found");
    };
    // A remote child's records leave only through its parent's cursors: deleting the stub or
    // the parent with records unshipped needs `force=true` (SEMANTICS.md §13 "Deletion").
    if q.given("force").ok().flatten().as_deref() != Some("true") {
        let links: Vec<(&TopicMeta, &TopicMeta)> = match &t.remote {
            Some(_) => t
                .parent
                .as_deref()
                .and_then(|p| meta.topic(p))
                .map(|p| vec![(p, t)])
                .unwrap_or_default(),
            None => t
                .children
                .iter()
                .filter_map(|c| meta.topic(c))
                .filter(|c| c.remote.is_some())
                .map(|c| (t, c))
                .collect(),
        };
        for (p, c) in links {
            if let Some(r) = super::remote_children::unshipped(node, p, c).await {
                return r;
            }
        }
    }
    match node
        .propose(MetaCommand::DeleteTopic {
            name: t.name.clone(),
            id: t.id,
        })
        .await
    {
        Ok(_) => Response::empty(204),
        Err(e) => propose_error(e),
    }
}

pub fn schema(node: &Rc<Node>, name: &str) -> Response {
    let meta = node.meta();
    let Some(t) = meta.topic(name) else {
        return error(404, "topic not found");
    };
    let versions: Vec<serde_json::Value> = t
        .schemas
        .iter()
        .enumerate()
        .map(|(i, s)| serde_json::json!({"version": i + 1, "schema": s}))
        .collect();
    json(
        200,
        &serde_json::json!({"topic": t.name, "version": t.schema_version(), "versions": versions}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_follow_the_spec() {
        // Proves the name rules of SEMANTICS.md §14.1 for new topics.
        assert!(valid_new_name("orders.eu_1-a"));
        assert!(!valid_new_name(""));
        assert!(!valid_new_name("."));
        assert!(!valid_new_name(".."));
        assert!(!valid_new_name("a/b"));
        assert!(!valid_new_name("é"));
        assert!(valid_new_name(&"a".repeat(200)));
        assert!(!valid_new_name(&"a".repeat(201)));
    }

    #[test]
    fn create_field_validation_messages() {
        // Proves the exact 400 texts the Go SDK's tests quote.
        let msg = |r: Response| -> String {
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            v["error"].as_str().unwrap().to_string()
        };
        let r = partitions_for_create(Some(2), 3, 108).unwrap_err();
        assert_eq!(
            msg(r),
            "invalid argument: partitions must be >= 3 (0 = use default)"
        );
        let r = partitions_for_create(Some(109), 3, 108).unwrap_err();
        assert_eq!(
            msg(r),
            "invalid argument: partitions (109) exceeds topic.max_partitions (108)"
        );
        assert_eq!(partitions_for_create(Some(0), 3, 108).unwrap(), 3);
        let r = retention(Some(1000)).unwrap_err();
        assert_eq!(
            msg(r),
            "invalid argument: retention_ms (1000) is below the minimum of 3600000 (1 hour)"
        );
        assert_eq!(retention(Some(0)).unwrap(), Some(0));
        assert_eq!(retention(None).unwrap(), None);
    }
}
