//! Remote children (API.md §9.1 with `remote`, §9.3, §9.4–9.6; SEMANTICS.md §13): the attach
//! that creates a stub, the detach that refuses while records are unshipped, pause, resume and
//! skip, and the remote fields of the children listing. Shipping itself is `crate::ship`, run
//! by the fan-out cursors of each parent partition's owner.

use std::rc::Rc;

use narad_io::types::{PartitionId, PartitionKey, TopicId};
use narad_raft::{MetaCommand, MetaResponse, RemoteChildMeta, TopicMeta, REMOTE_SKIPS_MAX};
use narad_shard::fanout::ChildLag;
use serde_json::{json, Value};

use super::{error, json as json_response, propose_error};
use crate::auth::Caller;
use crate::http::{Request, Response};
use crate::node::Node;
use crate::ship::{self, Class};

/// Remote-child writes a node takes per minute (API.md §9.1, §9.4–9.6).
pub const WRITES_PER_MINUTE: usize = 60;

/// The `429` of a node past its remote-child writes of the minute, or `None` (one taken).
pub fn write_budget(node: &Node) -> Option<Response> {
    node.remote_child_write_slot(WRITES_PER_MINUTE)
        .err()
        .map(|retry_s| {
            error(
                429,
                "too many remote-child writes on this node (60 a minute)",
            )
            .with_header("Retry-After", retry_s.to_string())
        })
}

/// Most ordered streams per parent partition (API.md §9.1 `lanes`).
const LANES_MAX: i64 = 8;
/// Shortest parent retention a remote child accepts (SEMANTICS.md §13 "Bounds"), and the one
/// below which the attach warns.
const RETENTION_MIN_MS: u64 = 24 * 3600 * 1000;
const RETENTION_WARN_MS: u64 = 72 * 3600 * 1000;
/// Longest pause reason (API.md §9.4).
const REASON_BYTES_MAX: usize = 256;

/// The fields of an attach with `remote`.
pub struct Attach<'a> {
    pub child: Option<&'a str>,
    pub remote: &'a str,
    pub remote_topic: Option<&'a str>,
    pub from: Option<&'a str>,
    pub lanes: Option<i64>,
    pub delay_ms: u64,
    pub dry_run: bool,
}

fn valid_topic_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 255
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The answer to a target that failed a check: `503` (with `Retry-After`) when it could not be
/// reached, `502` when it redirects, else `409` (API.md §9.1).
fn unusable(node: &Node, f: &ship::CheckFailed) -> Response {
    let row = json!({
        "node": node.config.node_id,
        "result": "fail",
        "class": f.class.as_str(),
        "detail": f.detail,
    });
    unusable_with(f, vec![row])
}

/// [`unusable`] with the checks of every member.
fn unusable_with(f: &ship::CheckFailed, checks: Vec<Value>) -> Response {
    let status = match f.class {
        Class::Unavailable => 503,
        Class::RedirectRefused => 502,
        _ => 409,
    };
    let r = json_response(
        status,
        &json!({
            "error": format!("target unusable: {}", f.detail),
            "class": f.class.as_str(),
            "checks": checks,
        }),
    );
    if status == 503 {
        r.with_header("Retry-After", "5")
    } else {
        r
    }
}

/// Where each parent partition's cursor starts: the high watermark (`attach`), the consumer
/// ack frontier (`unconsumed`) or the oldest retained record (`earliest`).
async fn start_offsets(node: &Node, parent: &TopicMeta, from: &str) -> Result<Vec<u64>, Response> {
    let keys: Vec<PartitionKey> = (0..parent.partitions)
        .map(|p| PartitionKey {
            topic: parent.id,
            partition: PartitionId(p),
        })
        .collect();
    let stats = node.stats_by_owner(&keys).await;
    stats
        .into_iter()
        .map(|g| {
            g.map(|(stats, _, _, frontier)| match from {
                "unconsumed" => frontier.0,
                "earliest" => stats.oldest_offset.0,
                _ => stats.high_watermark.0,
            })
        })
        .collect::<Option<Vec<u64>>>()
        .ok_or_else(|| {
            error(
                503,
                "parent partition owners unreachable for the attach point; retry",
            )
        })
}

/// `POST /v1/topics/{parent}/children` with `remote`.
pub async fn attach(node: &Rc<Node>, c: &Caller, parent: &str, a: Attach<'_>) -> Response {
    let Some(child) = a.child.filter(|c| !c.is_empty()) else {
        return error(400, "child is required");
    };
    if child == parent {
        return error(400, "invalid argument: a topic cannot be its own parent");
    }
    if !valid_topic_name(child) {
        return error(400, "invalid argument: bad child name");
    }
    let remote_topic = a.remote_topic.filter(|t| !t.is_empty()).unwrap_or(parent);
    if !valid_topic_name(remote_topic) {
        return error(400, "invalid argument: bad remote_topic");
    }
    let from = a.from.filter(|f| !f.is_empty()).unwrap_or("attach");
    if !matches!(from, "attach" | "unconsumed" | "earliest") {
        return error(
            400,
            "invalid from: want \"attach\", \"unconsumed\" or \"earliest\"",
        );
    }
    let lanes = match a.lanes.unwrap_or(0) {
        0 => 1,
        n if (1..=LANES_MAX).contains(&n) => n as u32,
        _ => return error(400, "invalid argument: lanes must be between 1 and 8"),
    };
    let meta = node.meta();
    let Some(p) = meta.topic(parent).cloned() else {
        return error(404, "topic not found");
    };
    let Some(remote) = meta.remotes.get(a.remote).cloned() else {
        return error(
            400,
            &format!("invalid argument: unknown remote {:?}", a.remote),
        );
    };
    if meta.topic(child).is_some() {
        return error(
            409,
            &format!("child exists: topic {child:?} already exists"),
        );
    }
    if p.retention_ms != 0 && p.retention_ms < RETENTION_MIN_MS {
        return error(
            409,
            &format!(
                "parent retention ({} ms) is below 24 h: a remote child needs at least {RETENTION_MIN_MS} ms or forever",
                p.retention_ms
            ),
        );
    }
    let mut warnings = Vec::new();
    if p.retention_ms != 0 && p.retention_ms < RETENTION_WARN_MS {
        warnings.push(format!(
            "parent retention ({} ms) is below 72 h: a long outage of the target may lose records",
            p.retention_ms
        ));
    }
    if !a.dry_run {
        if let Some(r) = write_budget(node) {
            return r;
        }
    }
    // From every member: each owner of a parent partition must be able to ship.
    let (outcome, checks) = Box::pin(ship::probe_everywhere(node, &remote, remote_topic)).await;
    let info = match outcome {
        Ok(i) => i,
        Err(f) => return unusable_with(&f, checks),
    };
    if let (Some(mine), Some(theirs)) = (p.current_schema(), info.schema.as_ref()) {
        if mine != theirs {
            return unusable(
                node,
                &ship::CheckFailed {
                    class: Class::RejectedRecord,
                    detail: "the target topic's schema differs from the parent's".into(),
                },
            );
        }
    }
    let offsets = match start_offsets(node, &p, from).await {
        Ok(o) => o,
        Err(r) => return r,
    };
    if a.dry_run {
        return json_response(
            200,
            &json!({
                "dry_run": true,
                "attach_offsets": offsets,
                "checks": checks,
                "warnings": warnings,
            }),
        );
    }
    let stub = TopicMeta {
        name: child.to_string(),
        id: TopicId(narad_io::sys::random_u64()),
        partitions: 0,
        retention_ms: 0,
        visibility_timeout_ms: 0,
        max_in_flight_per_partition: 0,
        max_acked_ahead_per_partition: 0,
        created_at_s: narad_io::types::UnixMillis::now().0 / 1000,
        owner: c.username().map(String::from),
        schemas: Vec::new(),
        parent: Some(p.name.clone()),
        children: Vec::new(),
        attach_epoch: Some(format!("{:016x}", narad_io::sys::random_u64())),
        fanout_delay_ms: a.delay_ms,
        attach_offsets: offsets,
        owners: Vec::new(),
        moves: Default::default(),
        remote: Some(RemoteChildMeta {
            name: remote.name.clone(),
            topic: remote_topic.to_string(),
            target_id: info.id,
            from: from.to_string(),
            lanes,
            created_by: c.username().unwrap_or_default().to_string(),
            paused: false,
            pause_reason: None,
            paused_by: None,
            paused_at_ms: None,
            skip: Default::default(),
        }),
    };
    let cmd = MetaCommand::AttachRemoteChild {
        parent: p.name.clone(),
        parent_id: p.id,
        stub: Box::new(stub),
    };
    match node.propose(cmd).await {
        Ok(MetaResponse::Topic(t)) => {
            let mut v = serde_json::to_value(super::topics::view(&t)).unwrap_or(Value::Null);
            if !warnings.is_empty() {
                v["warnings"] = json!(warnings);
            }
            json_response(201, &v)
        }
        Ok(_) => error(500, "unexpected answer from the metadata group"),
        Err(e) => propose_error(e),
    }
}

/// The `409` of a detach (or delete) of remote child `child` while records are unshipped, or
/// `None` when every owner reported and nothing is left to ship.
pub async fn unshipped(node: &Node, parent: &TopicMeta, child: &TopicMeta) -> Option<Response> {
    let (lags, complete) = node.fanout_lag(parent.id).await;
    let lag = lags.iter().find(|l| l.child == child.id);
    let lag_messages = lag.map_or(0, |l| l.lag_messages);
    let all = complete && lag.map_or(parent.partitions == 0, |l| l.cursors == parent.partitions);
    if lag_messages == 0 && all {
        return None;
    }
    Some(json_response(
        409,
        &json!({
            "error": format!("remote child {:?} has unshipped records", child.name),
            "lag_messages": lag_messages,
            "lag_complete": all,
            "dispatch_backlog": {},
        }),
    ))
}

/// `blocked_at` of a remote child (API.md §9.2): where its worst cursor stands, or `null` while
/// every cursor runs.
fn worst_blocked_at(lag: Option<&ChildLag>) -> Value {
    lag.and_then(ChildLag::worst).map_or(Value::Null, |w| {
        json!({
            "partition": w.partition,
            "offset": w.blocked_at.unwrap_or(w.next),
            "state": ship::state_name(w.state),
        })
    })
}

/// The remote fields of one row of the children listing (API.md §9.2).
pub fn list_fields(row: &mut Value, stub: &TopicMeta, lag: Option<&ChildLag>, parent: &TopicMeta) {
    let Some(r) = &stub.remote else {
        return;
    };
    let state = if r.paused {
        "paused"
    } else {
        ship::state_name(lag.and_then(ChildLag::worst).map_or(0, |w| w.state))
    };
    let last_ok = lag
        .map(ChildLag::last_ok_ms)
        .filter(|ms| *ms > 0)
        .map(crate::logging::rfc3339_ms);
    row["remote"] = json!(r.name);
    row["paused"] = json!(r.paused);
    row["state"] = json!(state);
    row["blocked_at"] = worst_blocked_at(lag);
    row["last_success_at"] = last_ok.map_or(Value::Null, Value::from);
    row["target_verified_at"] = Value::Null;
    row["unverified"] = json!(false);
    row["source_drained"] = json!(lag.is_some_and(|l| l.lag_messages == 0));
    row["lag_seconds"] = json!(lag.map_or(0, |l| l.due_lag_ms / 1000));
    if parent.retention_ms != 0 {
        // How long the oldest unshipped record has before retention takes it: the parent's
        // retention less its age (its time past due plus the child's delay).
        let age_ms = lag.map_or(0, |l| l.due_lag_ms) + stub.fanout_delay_ms;
        row["retention_headroom_seconds"] =
            json!(parent.retention_ms.saturating_sub(age_ms) / 1000);
    }
}

/// The consumer ack frontier of each partition of `parent` (`None` where its owner did not
/// answer), for the listing's partition rows.
pub async fn ack_frontiers(node: &Node, parent: &TopicMeta) -> Vec<Option<u64>> {
    let keys: Vec<PartitionKey> = (0..parent.partitions)
        .map(|p| PartitionKey {
            topic: parent.id,
            partition: PartitionId(p),
        })
        .collect();
    node.stats_by_owner(&keys)
        .await
        .into_iter()
        .map(|g| g.map(|(_, _, _, frontier)| frontier.0))
        .collect()
}

/// The `partitions` rows of a remote child in the listing (API.md §9.2 `partitions=true`): one
/// per parent partition, from its owner's cursor (`state: "unknown"` when the owner did not
/// report it).
pub fn partition_rows(
    node: &Node,
    row: &mut Value,
    stub: &TopicMeta,
    lag: Option<&ChildLag>,
    parent: &TopicMeta,
    frontiers: &[Option<u64>],
) {
    let Some(r) = &stub.remote else {
        return;
    };
    let rows: Vec<Value> = (0..parent.partitions)
        .map(|p| {
            let c = lag.and_then(|l| l.rows.iter().find(|c| c.partition == p));
            let state = match c {
                _ if r.paused => "paused",
                Some(c) => ship::state_name(c.state),
                None => "unknown",
            };
            let blocked = c
                .filter(|c| c.state != 0)
                .and_then(|c| c.blocked_at)
                .map(|o| json!({"partition": p, "offset": o, "state": state}));
            json!({
                "partition": p,
                "node": parent.owner_of(p).unwrap_or(&node.config.node_id),
                "start_offset": stub.attach_offsets.get(p as usize).copied().unwrap_or(0),
                "next_offset": c.map(|c| c.next),
                "high_watermark": c.map(|c| c.high_watermark),
                "ack_frontier": frontiers.get(p as usize).copied().flatten(),
                "state": state,
                "last_success_at": c
                    .map(|c| c.last_ok_ms)
                    .filter(|ms| *ms > 0)
                    .map(crate::logging::rfc3339_ms),
                "blocked_at": blocked,
            })
        })
        .collect();
    row["partitions"] = Value::Array(rows);
}

/// The remote child `child` of `parent` for pause, resume and skip: both topics, or the answer.
fn remote_child(
    node: &Node,
    parent: &str,
    child: &str,
) -> Result<(TopicMeta, TopicMeta), Response> {
    let meta = node.meta();
    let (Some(p), Some(c)) = (meta.topic(parent), meta.topic(child)) else {
        return Err(error(404, "topic not found"));
    };
    if c.parent.as_deref() != Some(parent) || c.remote.is_none() {
        return Err(error(
            404,
            &format!("not found: {child:?} is not a remote child of {parent:?}"),
        ));
    }
    Ok((p.clone(), c.clone()))
}

async fn set(node: &Rc<Node>, parent: &str, c: &TopicMeta, r: RemoteChildMeta) -> Response {
    if let Some(r) = write_budget(node) {
        return r;
    }
    let cmd = MetaCommand::SetRemoteChild {
        parent: parent.to_string(),
        child: c.name.clone(),
        attach_epoch: c.attach_epoch.clone().unwrap_or_default(),
        remote: r,
    };
    match node.propose(cmd).await {
        Ok(MetaResponse::Topic(t)) => json_response(200, &super::topics::view(&t)),
        Ok(_) => error(500, "unexpected answer from the metadata group"),
        Err(e) => propose_error(e),
    }
}

/// The parent, the stub and the request's JSON object of a pause, resume or skip.
fn prologue(
    node: &Node,
    req: &Request,
    parent: &str,
    child: &str,
) -> Result<(TopicMeta, TopicMeta, serde_json::Map<String, Value>), Response> {
    let (p, stub) = remote_child(node, parent, child)?;
    Ok((p, stub, body_object(req)?))
}

fn body_object(req: &Request) -> Result<serde_json::Map<String, Value>, Response> {
    if req.body.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(Default::default());
    }
    match serde_json::from_slice::<Value>(&req.body) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(error(400, "invalid json: want an object")),
    }
}

/// `POST /v1/topics/{parent}/children/{child}/pause`.
pub async fn pause(
    node: &Rc<Node>,
    req: &Request,
    c: &Caller,
    parent: &str,
    child: &str,
) -> Response {
    let (_, stub, body) = match prologue(node, req, parent, child) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let reason = match body.get("reason") {
        None | Some(Value::Null) => None,
        Some(Value::String(s))
            if s.len() <= REASON_BYTES_MAX && !s.chars().any(|ch| ch.is_control()) =>
        {
            Some(s.clone())
        }
        Some(_) => return error(400, "invalid reason: printable text of at most 256 bytes"),
    };
    let mut r = stub.remote.clone().expect("a remote child");
    r.paused = true;
    r.pause_reason = reason;
    r.paused_by = c.username().map(String::from);
    r.paused_at_ms = Some(narad_io::types::UnixMillis::now().0);
    set(node, parent, &stub, r).await
}

/// `POST /v1/topics/{parent}/children/{child}/resume`: the checks run again first.
pub async fn resume(node: &Rc<Node>, req: &Request, parent: &str, child: &str) -> Response {
    let (_, stub, body) = match prologue(node, req, parent, child) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let accept = match body.get("accept_target") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return error(400, "invalid accept_target: want a boolean"),
    };
    let mut r = stub.remote.clone().expect("a remote child");
    let Some(remote) = node.meta().remotes.get(&r.name).cloned() else {
        return unusable(
            node,
            &ship::CheckFailed {
                class: Class::RemoteMissing,
                detail: format!("remote {:?} is not registered", r.name),
            },
        );
    };
    if let Err(retry_s) = node.remote_check_slot(&remote.name) {
        return error(429, "this remote was checked less than 5 s ago")
            .with_header("Retry-After", retry_s.to_string());
    }
    let (outcome, checks) = Box::pin(ship::probe_everywhere(node, &remote, &r.topic)).await;
    let info = match outcome {
        Ok(i) => i,
        Err(f) => return unusable_with(&f, checks),
    };
    if info.id != r.target_id && !accept {
        return unusable(
            node,
            &ship::CheckFailed {
                class: Class::TargetReplaced,
                detail:
                    "the target topic was recreated; resume with accept_target:true to ship to it"
                        .into(),
            },
        );
    }
    r.target_id = info.id;
    r.paused = false;
    r.pause_reason = None;
    r.paused_by = None;
    r.paused_at_ms = None;
    set(node, parent, &stub, r).await
}

/// `POST /v1/topics/{parent}/children/{child}/skip`: only the record a partition's cursor is
/// stuck on as `rejected_record` or `record_too_large`.
pub async fn skip(node: &Rc<Node>, req: &Request, parent: &str, child: &str) -> Response {
    let (p, stub, body) = match prologue(node, req, parent, child) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let (Some(partition), Some(offset)) = (
        body.get("partition").and_then(Value::as_u64),
        body.get("offset").and_then(Value::as_u64),
    ) else {
        return error(
            400,
            "partition and offset are required, as non-negative integers",
        );
    };
    if partition >= u64::from(p.partitions) {
        return error(400, "invalid partition");
    }
    let (lags, _) = node.fanout_lag(p.id).await;
    let lag = lags.iter().find(|l| l.child == stub.id);
    // That partition's cursor, wherever it runs, must be stuck on exactly that record.
    let stuck = lag.and_then(|l| {
        l.rows.iter().find(|c| {
            c.partition == partition as u32
                && c.blocked_at == Some(offset)
                && Class::from_code(c.state).is_some_and(Class::blocks_record)
        })
    });
    if stuck.is_none() {
        return json_response(
            409,
            &json!({
                "error": "that record is not the one a partition is stuck on as rejected_record or record_too_large",
                "blocked_at": worst_blocked_at(lag),
            }),
        );
    }
    let mut r = stub.remote.clone().expect("a remote child");
    let list = r.skip.entry(partition as u32).or_default();
    if list.len() >= REMOTE_SKIPS_MAX {
        return error(
            409,
            &format!("at most {REMOTE_SKIPS_MAX} skipped records per partition"),
        );
    }
    if let Err(i) = list.binary_search(&offset) {
        list.insert(i, offset);
    }
    set(node, parent, &stub, r).await
}
