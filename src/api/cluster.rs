//! Cluster administration (API.md §12). In a cluster: the members as the metadata records them,
//! the moves in flight (CLUSTER.md §9), decommission and its cancel (§10), abort of a move and
//! forget, every change through the Raft leader. A node that is its own whole cluster answers as
//! the single Raft voter and leader: no partition ever moves, and a decommission could never
//! complete, since no other node could take the partitions, so it is refused with the reasons. Every route needs `admin`: the reads are checked by `api::authorize`, the changes here,
//! where every answer to them (denied ones included) writes its audit line (SEMANTICS.md §15).

use std::rc::Rc;

use serde_json::{json, Value};

use super::params::Params;
use super::users::{audited, ADMIN_REQUIRED};
use super::{error, json as json_response};
use crate::auth::Caller;
use crate::http::{Request, Response};
use crate::node::Node;

/// The admin check of a change: `Some(403)`, audited, for anyone else.
fn denied(c: &Caller, event: &str, target: &str) -> Option<Response> {
    (!c.is_admin()).then(|| audited(event, c, target, error(403, ADMIN_REQUIRED)))
}

/// Go's `strconv.ParseBool`, which the original parsed these flags with.
fn parse_bool(name: &str, q: &Params<'_>) -> Result<Option<bool>, Response> {
    let Some(v) = q.str(name)? else {
        return Ok(None);
    };
    match v.as_str() {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(Some(true)),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(Some(false)),
        _ => Err(error(
            400,
            &format!("invalid {name}: strconv.ParseBool: parsing {v:?}: invalid syntax"),
        )),
    }
}

/// Partitions of every topic: all of them are owned here.
fn owned_partitions(node: &Node) -> u64 {
    node.meta()
        .topics
        .values()
        .map(|t| u64::from(t.partitions))
        .sum()
}

fn member_view(node: &Node) -> Value {
    json!({
        "id": node.config.node_id,
        "addr": node.config.http.addr,
        "status": "alive",
        "draining": false,
        "owned_partitions": owned_partitions(node),
        "outbound_moves": 0,
        "voter": true,
        "leader": true,
        "heartbeat_age_seconds": 0,
    })
}

/// Metadata must be loaded to answer from it (`503` otherwise, as with no Raft leader).
fn unavailable(node: &Node) -> Option<Response> {
    node.ready()
        .err()
        .map(|reason| error(503, &reason.to_string()).with_header("Retry-After", "1"))
}

fn unknown_member(id: &str) -> Response {
    error(404, &format!("member {id:?} not found"))
}

/// The members of a cluster as the metadata records them (sorted by id), with their Raft role
/// from shard 0's view and the partitions each owns.
fn cluster_member_views(node: &Node) -> Vec<Value> {
    let meta = node.meta();
    let view = node.raft_view();
    let now = narad_io::types::UnixMillis::now().0;
    let mut owned: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for t in meta.topics.values() {
        for p in 0..t.partitions {
            if let Some(o) = t.owner_of(p) {
                *owned.entry(o).or_default() += 1;
            }
        }
    }
    let mut outbound: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for t in meta.topics.values() {
        for m in t.moves.values() {
            *outbound.entry(m.source.as_str()).or_default() += 1;
        }
    }
    let blocked = node.decommission_blocked();
    meta.members
        .values()
        .map(|m| {
            let mut v = json!({
                "id": m.id,
                "addr": m.addr,
                "status": if m.dead { "dead" } else { "alive" },
                "draining": m.draining,
                "owned_partitions": owned.get(m.id.as_str()).copied().unwrap_or(0),
                "outbound_moves": outbound.get(m.id.as_str()).copied().unwrap_or(0),
                "voter": view.voters.contains(&m.id),
                "leader": view.leader.as_deref() == Some(m.id.as_str()),
                "heartbeat_age_seconds": now.saturating_sub(m.heartbeat_ms) / 1000,
            });
            if m.draining {
                v["decommission_blocked"] = blocked
                    .iter()
                    .filter(|b| b.node == m.id)
                    .map(|b| json!({"code": b.code, "message": b.message}))
                    .collect();
            }
            v
        })
        .collect()
}

/// A member's state in a move view (API.md §12.2).
fn member_status(meta: &narad_raft::MetaState, id: &str) -> &'static str {
    match meta.members.get(id) {
        None => "not_a_member",
        Some(m) if m.dead => "dead",
        Some(m) if m.draining => "draining",
        Some(_) => "alive",
    }
}

/// One move as API.md §12.2 shows it; with `detail`, this node's worker when it runs one.
fn move_view(
    node: &Node,
    meta: &narad_raft::MetaState,
    topic: &str,
    p: u32,
    m: &narad_raft::MoveMeta,
    detail: bool,
) -> Value {
    let (from, to) = (
        member_status(meta, &m.source),
        member_status(meta, &m.target),
    );
    let blocked = if from == "dead" {
        Some("source_dead")
    } else if to == "dead" {
        Some("target_dead")
    } else if to == "not_a_member" {
        Some("target_not_member")
    } else {
        None
    };
    let mut v = json!({
        "topic": topic,
        "partition": p,
        "from": m.source,
        "to": m.target,
        "from_status": from,
        "to_status": to,
    });
    if let Some(b) = blocked {
        v["blocked"] = json!(b);
    }
    if detail {
        match node
            .move_statuses()
            .into_iter()
            .find(|s| s.topic == topic && s.partition == p)
        {
            Some(w) => {
                v["worker"] = json!({
                    "topic": w.topic,
                    "partition": w.partition,
                    "source": w.source,
                    "target": w.target,
                    "started_at": w.started_at_ms,
                    "phase": w.phase,
                    "attempts": w.attempts,
                    "last_error": w.last_error,
                    "copied_bytes": w.copied_bytes,
                    "blocked": blocked,
                });
            }
            None => {
                v["worker_error"] = json!(format!(
                    "the move's worker runs on {}; ask that node for its detail",
                    m.target
                ));
            }
        }
    }
    v
}

/// Budget of `detail=true`: every member is asked for its own status at once (API.md §12.1).
const MEMBER_STATUS_BUDGET: std::time::Duration = std::time::Duration::from_secs(2);

/// `GET /v1/cluster/members[?detail=true]` (§12.1).
pub async fn members(node: &Rc<Node>, req: &Request) -> Response {
    let detail = tri!(parse_bool("detail", &Params::new(&req.query)));
    if !node.config.peers.is_empty() {
        // A cluster answers from its replica, ready or not: an operator looks here when a node
        // is cut off.
        let mut views = cluster_member_views(node);
        if detail == Some(true) {
            let asks: Vec<_> = views
                .iter()
                .map(|v| {
                    let id = v["id"].as_str().unwrap_or("").to_string();
                    let n = node.clone();
                    narad_io::rt::spawn(
                        async move { n.member_status(&id, MEMBER_STATUS_BUDGET).await },
                    )
                })
                .collect();
            for (v, ask) in views.iter_mut().zip(asks) {
                match ask.await {
                    Ok(status) => v["node_status"] = status,
                    Err(e) => v["status_error"] = json!(e),
                }
            }
        }
        return json_response(200, &json!({ "members": views }));
    }
    if let Some(r) = unavailable(node) {
        return r;
    }
    let mut m = member_view(node);
    if detail == Some(true) {
        m["node_status"] = json!({
            "node": node.config.node_id,
            "draining": false,
            "dispatch_backlog": 0,
            "quarantine": {"copies": 0, "bytes": 0, "list": []},
            "moves": [],
        });
    }
    json_response(200, &json!({ "members": [m] }))
}

/// `GET /v1/cluster/moves[?detail=true]` (§12.2): never any on one node.
pub fn moves(node: &Rc<Node>, req: &Request) -> Response {
    let detail = tri!(parse_bool("detail", &Params::new(&req.query))) == Some(true);
    if node.config.peers.is_empty() {
        if let Some(r) = unavailable(node) {
            return r;
        }
    }
    let meta = node.meta();
    // Topics in name order, then partitions: sorted as the spec asks.
    let list: Vec<Value> = meta
        .topics
        .values()
        .flat_map(|t| {
            t.moves
                .iter()
                .map(|(&p, m)| move_view(node, &meta, &t.name, p, m, detail))
                .collect::<Vec<_>>()
        })
        .collect();
    json_response(200, &json!({ "moves": list }))
}

/// Why member `id` could never finish a decommission now (CLUSTER.md §10 step 1), and whether
/// it is a voter; `None` for an unknown member.
fn cluster_refusals(node: &Node, id: &str) -> Option<(Vec<(&'static str, String)>, bool)> {
    let meta = node.meta();
    let m = meta.members.get(id)?;
    let view = node.raft_view();
    let voter = view.voters.iter().any(|v| v == id);
    let mut reasons = Vec::new();
    if voter && view.voters.len() <= 3 {
        reasons.push((
            "below_min_voters",
            format!(
                "removing {id} would leave {} Raft voters; at least 3 must remain",
                view.voters.len() - 1
            ),
        ));
    }
    let alive_voters = view
        .voters
        .iter()
        .filter(|v| meta.members.get(*v).is_some_and(|x| !x.dead))
        .count();
    if alive_voters < view.voters.len() / 2 + 1 {
        reasons.push((
            "no_healthy_majority",
            format!(
                "only {alive_voters} of {} voters are alive",
                view.voters.len()
            ),
        ));
    }
    if !meta.members.values().any(|x| x.id != id && x.receives()) {
        reasons.push((
            "no_receivers",
            "no other alive, non-draining member can receive its partitions".to_string(),
        ));
    }
    let (owned, _) = narad_raft::moves::member_load(&meta, id);
    if m.dead && owned > 0 {
        reasons.push((
            "owner_dead",
            format!("{id} is dead and owns {owned} partitions, which cannot be copied from it"),
        ));
    }
    Some((reasons, voter))
}

async fn cluster_decommission(node: &Rc<Node>, id: &str, dry_run: bool) -> Response {
    let Some((refusals, voter)) = cluster_refusals(node, id) else {
        return unknown_member(id);
    };
    if dry_run {
        let reasons = reasons_json(&refusals);
        let meta = node.meta();
        let (owned, _) = narad_raft::moves::member_load(&meta, id);
        let inbound: usize = meta
            .topics
            .values()
            .map(|t| t.moves.values().filter(|m| m.target == id).count())
            .sum();
        let member = cluster_member_views(node)
            .into_iter()
            .find(|v| v["id"] == id)
            .unwrap_or(Value::Null);
        return json_response(
            200,
            &json!({
                "member": member,
                "would_decommission": refusals.is_empty(),
                "reasons": reasons,
                "voter": voter,
                "owned_partitions": owned,
                "inbound_moves": inbound,
            }),
        );
    }
    if !refusals.is_empty() {
        return refused_decommission(id, &refusals);
    }
    set_draining(node, id, true).await
}

async fn set_draining(node: &Rc<Node>, id: &str, draining: bool) -> Response {
    let cmd = narad_raft::MetaCommand::SetDraining {
        id: id.to_string(),
        draining,
    };
    match node.propose(cmd).await {
        Ok(_) => Response::empty(204),
        Err(e) => super::propose_error(e),
    }
}

/// Why this node cannot be decommissioned: it is the only voter and no node could receive its
/// partitions (CLUSTER.md §10 reason codes).
fn refusal_reasons(node: &Node) -> [(&'static str, String); 2] {
    [
        (
            "below_min_voters",
            format!(
                "{} is the only Raft voter: the cluster would have none left",
                node.config.node_id
            ),
        ),
        (
            "no_receivers",
            "no other alive, non-draining member can receive its partitions".to_string(),
        ),
    ]
}

/// `POST /v1/cluster/members/{id}/decommission[?dry_run=true]` (§12.3).
pub async fn decommission(node: &Rc<Node>, req: &Request, c: &Caller, id: &str) -> Response {
    const EVENT: &str = "cluster.decommission";
    if let Some(r) = denied(c, EVENT, id) {
        return r;
    }
    let dry_run = match parse_bool("dry_run", &Params::new(&req.query)) {
        Ok(v) => v,
        Err(r) => return audited(EVENT, c, id, r),
    };
    if !node.config.peers.is_empty() {
        if dry_run == Some(true) {
            return cluster_decommission(node, id, true).await;
        }
        let answer = cluster_decommission(node, id, false).await;
        return audited(EVENT, c, id, answer);
    }
    // A dry run changes nothing: answered, not audited.
    if dry_run == Some(true) {
        return decommission_check(node, id, true);
    }
    audited(EVENT, c, id, decommission_check(node, id, false))
}

fn decommission_check(node: &Rc<Node>, id: &str, dry_run: bool) -> Response {
    if let Some(r) = unavailable(node) {
        return r;
    }
    if id != node.config.node_id {
        return unknown_member(id);
    }
    let refusals = refusal_reasons(node);
    if dry_run {
        let reasons = reasons_json(&refusals);
        return json_response(
            200,
            &json!({
                "member": member_view(node),
                "would_decommission": false,
                "reasons": reasons,
                "voter": true,
                "owned_partitions": owned_partitions(node),
                "inbound_moves": 0,
            }),
        );
    }
    refused_decommission(id, &refusals)
}

/// The `409` of a decommission that could never complete, listing every reason (§12.3).
fn refused_decommission(id: &str, refusals: &[(&'static str, String)]) -> Response {
    let codes: Vec<&str> = refusals.iter().map(|(code, _)| *code).collect();
    json_response(
        409,
        &json!({
            "error": format!(
                "decommission of {id} refused: it could never complete safely ({})",
                codes.join(", ")
            ),
            "reasons": reasons_json(refusals),
        }),
    )
}

fn reasons_json(refusals: &[(&'static str, String)]) -> Vec<Value> {
    refusals
        .iter()
        .map(|(code, message)| json!({"code": code, "message": message}))
        .collect()
}

/// `DELETE /v1/cluster/members/{id}/decommission` (§12.4): nothing is ever draining here, so
/// cancelling is done at once.
pub async fn cancel_decommission(node: &Rc<Node>, req: &Request, c: &Caller, id: &str) -> Response {
    const EVENT: &str = "cluster.decommission.cancel";
    if let Some(r) = denied(c, EVENT, id) {
        return r;
    }
    let answer = cancel_check(node, req, id).await;
    audited(EVENT, c, id, answer)
}

async fn cancel_check(node: &Rc<Node>, req: &Request, id: &str) -> Response {
    let q = Params::new(&req.query);
    if q.count("dry_run") > 0 {
        return error(
            400,
            "dry_run is not supported when cancelling a decommission",
        );
    }
    if !node.config.peers.is_empty() {
        if !node.meta().members.contains_key(id) {
            return unknown_member(id);
        }
        return set_draining(node, id, false).await;
    }
    if let Some(r) = unavailable(node) {
        return r;
    }
    if id != node.config.node_id {
        return unknown_member(id);
    }
    Response::empty(204)
}

/// `POST /v1/cluster/moves/{topic}/{partition}/abort[?target=id]` (§12.5): a partition that
/// exists is owned here with no move in flight.
pub async fn abort_move(
    node: &Rc<Node>,
    req: &Request,
    c: &Caller,
    topic: &str,
    partition: &str,
) -> Response {
    const EVENT: &str = "cluster.move.abort";
    let target = format!("{topic}/{partition}");
    if let Some(r) = denied(c, EVENT, &target) {
        return r;
    }
    let answer = abort_check(node, req, topic, partition).await;
    audited(EVENT, c, &target, answer)
}

async fn abort_check(node: &Rc<Node>, req: &Request, topic: &str, partition: &str) -> Response {
    let Ok(p) = partition.parse::<u32>() else {
        return error(
            400,
            &format!("invalid partition: strconv.Atoi: parsing {partition:?}: invalid syntax"),
        );
    };
    if !node.config.peers.is_empty() {
        let q = Params::new(&req.query);
        let target = tri!(q.str("target")).filter(|t| !t.is_empty());
        let meta = node.meta();
        let Some(t) = meta.topic(topic).filter(|t| p < t.partitions) else {
            return error(404, &format!("no assignment for {topic}/{p}"));
        };
        let owner = t.owner_of(p).unwrap_or("").to_string();
        let Some(m) = t.moves.get(&p) else {
            return error(
                409,
                &format!("no move in flight for {topic}/{p}: owned by {owner}"),
            );
        };
        let view = move_view(node, &meta, topic, p, m, false);
        let cmd = narad_raft::MetaCommand::EndMove {
            topic: topic.to_string(),
            partition: p,
            target,
        };
        return match node.propose(cmd).await {
            Ok(_) => json_response(
                202,
                &json!({
                    "move": view,
                    "note": format!(
                        "move aborted: {topic}/{p} stays with {owner}; the planner may plan it again"
                    ),
                }),
            ),
            Err(e) => super::propose_error(e),
        };
    }
    if let Some(r) = unavailable(node) {
        return r;
    }
    match node.meta().topic(topic) {
        Some(t) if p < t.partitions => error(
            409,
            &format!(
                "no move in flight for {topic}/{p}: owned by {}",
                node.config.node_id
            ),
        ),
        _ => error(404, &format!("no assignment for {topic}/{p}")),
    }
}

/// `POST /v1/cluster/members/{id}/forget` (§12.6): removes a Raft voter or non-voter that has
/// no member record, through the leader (a membership change). On a node that is its whole
/// cluster the only Raft server is this node, the leader, which cannot be forgotten.
pub async fn forget(node: &Rc<Node>, c: &Caller, id: &str) -> Response {
    const EVENT: &str = "cluster.forget";
    if let Some(r) = denied(c, EVENT, id) {
        return r;
    }
    let answer = forget_check(node, id).await;
    audited(EVENT, c, id, answer)
}

async fn forget_check(node: &Rc<Node>, id: &str) -> Response {
    if let Some(r) = unavailable(node) {
        return r;
    }
    if node.config.peers.is_empty() {
        if id == node.config.node_id {
            return error(
                400,
                &format!("{id} is the Raft leader: it cannot be forgotten"),
            );
        }
        return error(404, &format!("no Raft server {id:?}"));
    }
    let cmd = narad_raft::MetaCommand::ForgetServer { id: id.to_string() };
    match node.propose(cmd).await {
        Ok(narad_raft::MetaResponse::Forgot { id, voter }) => {
            json_response(200, &json!({"id": id, "voter": voter}))
        }
        Ok(other) => error(500, &format!("unexpected answer to forget: {other:?}")),
        Err(e) => super::propose_error(e),
    }
}
