//! Cluster administration (API.md §12) as a node that is its own whole cluster answers it. This
//! build runs one node (a configuration naming peers is refused at start), so the member list is
//! this node, the single Raft voter and leader; no partition ever moves; and a decommission could
//! never complete, since no other node could take the partitions, so it is refused with the
//! reasons. Every route needs `admin`: the reads are checked by `api::authorize`, the changes here,
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
    meta.members
        .values()
        .map(|m| {
            json!({
                "id": m.id,
                "addr": m.addr,
                "status": if m.dead { "dead" } else { "alive" },
                "draining": false,
                "owned_partitions": owned.get(m.id.as_str()).copied().unwrap_or(0),
                "outbound_moves": 0,
                "voter": view.voters.contains(&m.id),
                "leader": view.leader.as_deref() == Some(m.id.as_str()),
                "heartbeat_age_seconds": now.saturating_sub(m.heartbeat_ms) / 1000,
            })
        })
        .collect()
}

/// `GET /v1/cluster/members[?detail=true]` (§12.1).
pub fn members(node: &Rc<Node>, req: &Request) -> Response {
    let detail = tri!(parse_bool("detail", &Params::new(&req.query)));
    if !node.config.peers.is_empty() {
        // A cluster answers from its replica, ready or not: an operator looks here when a node
        // is cut off.
        return json_response(200, &json!({ "members": cluster_member_views(node) }));
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
    tri!(parse_bool("detail", &Params::new(&req.query)));
    if let Some(r) = unavailable(node) {
        return r;
    }
    json_response(200, &json!({ "moves": [] }))
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
pub fn decommission(node: &Rc<Node>, req: &Request, c: &Caller, id: &str) -> Response {
    const EVENT: &str = "cluster.decommission";
    if let Some(r) = denied(c, EVENT, id) {
        return r;
    }
    let dry_run = match parse_bool("dry_run", &Params::new(&req.query)) {
        Ok(v) => v,
        Err(r) => return audited(EVENT, c, id, r),
    };
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
    let reasons: Vec<Value> = refusals
        .iter()
        .map(|(code, message)| json!({"code": code, "message": message}))
        .collect();
    if dry_run {
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
    let codes: Vec<&str> = refusals.iter().map(|(code, _)| *code).collect();
    json_response(
        409,
        &json!({
            "error": format!(
                "decommission of {id} refused: it could never complete safely ({})",
                codes.join(", ")
            ),
            "reasons": reasons,
        }),
    )
}

/// `DELETE /v1/cluster/members/{id}/decommission` (§12.4): nothing is ever draining here, so
/// cancelling is done at once.
pub fn cancel_decommission(node: &Rc<Node>, req: &Request, c: &Caller, id: &str) -> Response {
    const EVENT: &str = "cluster.decommission.cancel";
    if let Some(r) = denied(c, EVENT, id) {
        return r;
    }
    audited(EVENT, c, id, cancel_check(node, req, id))
}

fn cancel_check(node: &Rc<Node>, req: &Request, id: &str) -> Response {
    let q = Params::new(&req.query);
    if q.count("dry_run") > 0 {
        return error(
            400,
            "dry_run is not supported when cancelling a decommission",
        );
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
pub fn abort_move(node: &Rc<Node>, c: &Caller, topic: &str, partition: &str) -> Response {
    const EVENT: &str = "cluster.move.abort";
    let target = format!("{topic}/{partition}");
    if let Some(r) = denied(c, EVENT, &target) {
        return r;
    }
    audited(EVENT, c, &target, abort_check(node, topic, partition))
}

fn abort_check(node: &Rc<Node>, topic: &str, partition: &str) -> Response {
    let Ok(p) = partition.parse::<u32>() else {
        return error(
            400,
            &format!("invalid partition: strconv.Atoi: parsing {partition:?}: invalid syntax"),
        );
    };
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
