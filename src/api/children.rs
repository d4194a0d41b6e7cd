//! Fan-out child routes (API.md §9.1–9.3): attach, list with lag, detach; and the link a
//! create-with-parent (§6.1 `parent`, `fanout_delay_ms`) carries.
//!
//! Field validation happens here; the rules that depend on the metadata (roles, 108 children,
//! schema histories, delay versus parent retention) are decided by the Raft state machine so
//! that they hold cluster-wide. The attach point is read here, from the parent partitions'
//! owners, before proposing. Never copies records: that is `narad_shard::fanout`.

use std::rc::Rc;

use narad_io::types::{PartitionId, PartitionKey};
use narad_raft::{MetaCommand, MetaResponse, TopicMeta};
use serde::{Deserialize, Serialize};

use super::params::Params;
use super::{error, json, propose_error, users, Route};
use crate::auth::Caller;
use crate::http::{Request, Response};
use crate::node::Node;

/// Longest fan-out delay (SEMANTICS.md §12): one year.
const DELAY_MS_MAX: i64 = 31_536_000_000;

/// The `403` of a remote-child request without security or by a non-admin (API.md §9.1).
pub const REMOTES_NEED_SECURITY: &str = "remotes require security";
/// Pause, resume and skip of a remote child (API.md §9.4–9.6): admin with security on, one
/// audit line each.
pub async fn remote_child_op(
    node: &Rc<Node>,
    req: &Request,
    c: &Caller,
    r: Route,
    parent: &str,
    child: Option<&str>,
) -> Response {
    let child = child.unwrap_or("");
    let target = format!("{parent}/{child}");
    let event = match r {
        Route::ChildPause => "child.pause",
        Route::ChildResume => "child.resume",
        _ => "child.skip",
    };
    let resp = if !node.config.security_enabled || !c.is_admin() {
        error(403, REMOTES_NEED_SECURITY)
    } else {
        match r {
            Route::ChildPause => super::remote_children::pause(node, req, c, parent, child).await,
            Route::ChildResume => super::remote_children::resume(node, req, parent, child).await,
            _ => super::remote_children::skip(node, req, parent, child).await,
        }
    };
    users::audited(event, c, &target, resp)
}

/// What a create-with-parent adds to the new topic.
pub struct CreateLink {
    pub parent: String,
    /// The parent's partition count (the child's default).
    pub partitions: u32,
    pub epoch: String,
    pub delay_ms: u64,
    pub offsets: Vec<u64>,
}

/// A fresh attach epoch: 16 lowercase hex characters of 8 random bytes.
fn new_epoch() -> String {
    format!("{:016x}", narad_io::sys::random_u64())
}

/// The attach point: the parent's committed high watermark per partition.
async fn attach_point(node: &Node, parent: &TopicMeta) -> Result<Vec<u64>, Response> {
    let keys: Vec<PartitionKey> = (0..parent.partitions)
        .map(|p| PartitionKey {
            topic: parent.id,
            partition: PartitionId(p),
        })
        .collect();
    node.high_watermarks(&keys).await.ok_or_else(|| {
        error(
            503,
            "parent partition owners unreachable for the attach point; retry",
        )
    })
}

/// A delay field: 0 ≤ d ≤ one year. `create` selects the create texts (`invalid argument: `
/// prefix on the negative case too).
fn delay(field: &str, v: Option<i64>, create: bool) -> Result<u64, Response> {
    let pre = if create { "invalid argument: " } else { "" };
    match v {
        None => Ok(0),
        Some(n) if n < 0 => Err(error(400, &format!("{pre}{field} must be >= 0"))),
        Some(n) if n > DELAY_MS_MAX => Err(error(
            400,
            &format!("invalid argument: {field} must be <= {DELAY_MS_MAX}"),
        )),
        Some(n) => Ok(n as u64),
    }
}

/// The link of a create-with-parent, or `None` for a plain create. Errors are the answers of
/// API.md §6.1 (`400` self-parent or bad delay, `404` parent missing, `503` attach point).
pub async fn link_for_create(
    node: &Node,
    name: &str,
    parent: Option<&str>,
    fanout_delay_ms: Option<i64>,
) -> Result<Option<CreateLink>, Response> {
    let Some(parent) = parent else {
        return Ok(None);
    };
    if parent == name {
        return Err(error(
            400,
            "invalid argument: a topic cannot be its own parent",
        ));
    }
    let delay_ms = delay("fanout_delay_ms", fanout_delay_ms, true)?;
    let Some(p) = node.topic(parent) else {
        return Err(error(404, "topic not found"));
    };
    let offsets = attach_point(node, &p).await?;
    Ok(Some(CreateLink {
        parent: p.name.clone(),
        partitions: p.partitions,
        epoch: new_epoch(),
        delay_ms,
        offsets,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AttachBody {
    child: Option<String>,
    delay_ms: Option<i64>,
    remote: Option<String>,
    remote_topic: Option<String>,
    from: Option<String>,
    lanes: Option<i64>,
    dry_run: Option<bool>,
}

/// `POST /v1/topics/{parent}/children`.
pub async fn attach(node: &Rc<Node>, req: &Request, c: &Caller, parent: &str) -> Response {
    let body: AttachBody = match crate::wire::body::decode_strict(&req.body, "attachChildRequest") {
        Ok(b) => b,
        Err(e) => return error(400, &e),
    };
    // As in the original, a field at its zero value counts as absent: a client that always
    // sends the whole attach struct (`"remote":""`, `"lanes":0`, `"dry_run":false`) attaches a
    // local child.
    let given = |s: &Option<String>| s.as_ref().is_some_and(|s| !s.is_empty());
    let remote = given(&body.remote);
    if !remote
        && (given(&body.remote_topic)
            || given(&body.from)
            || body.lanes.is_some_and(|n| n != 0)
            || body.dry_run == Some(true))
    {
        return error(
            400,
            "invalid argument: remote_topic, from, lanes and dry_run require remote",
        );
    }
    if remote {
        // A remote child needs security on (API.md §9.1; the admin check is in `authorize`).
        if !node.config.security_enabled {
            return error(403, REMOTES_NEED_SECURITY);
        }
        let delay_ms = match delay("delay_ms", body.delay_ms, false) {
            Ok(d) => d,
            Err(r) => return r,
        };
        let a = super::remote_children::Attach {
            child: body.child.as_deref(),
            remote: body.remote.as_deref().unwrap_or_default(),
            remote_topic: body.remote_topic.as_deref(),
            from: body.from.as_deref(),
            lanes: body.lanes,
            delay_ms,
            dry_run: body.dry_run == Some(true),
        };
        return super::remote_children::attach(node, c, parent, a).await;
    }
    let Some(child) = body.child.filter(|c| !c.is_empty()) else {
        return error(400, "child is required");
    };
    if child == parent {
        return error(400, "invalid argument: a topic cannot be its own parent");
    }
    let delay_ms = match delay("delay_ms", body.delay_ms, false) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let Some(p) = node.topic(parent) else {
        return error(404, "topic not found");
    };
    let Some(c) = node.topic(&child) else {
        return error(404, "topic not found");
    };
    let attach_offsets = match attach_point(node, &p).await {
        Ok(o) => o,
        Err(r) => return r,
    };
    let cmd = MetaCommand::AttachChild {
        parent: p.name.clone(),
        parent_id: Some(p.id),
        child: c.name.clone(),
        child_id: Some(c.id),
        delay_ms,
        attach_epoch: new_epoch(),
        attach_offsets,
    };
    match node.propose(cmd).await {
        Ok(MetaResponse::Topic(t)) => json(200, &super::topics::view(&t)),
        Ok(_) => match node.topic(parent) {
            Some(t) => json(200, &super::topics::view(&t)),
            None => error(404, "topic not found"),
        },
        Err(e) => propose_error(e),
    }
}

#[derive(Serialize)]
struct ChildList<'a> {
    parent: &'a str,
    parent_id: String,
    children: Vec<serde_json::Value>,
}

/// `GET /v1/topics/{parent}/children`.
pub async fn list(node: &Rc<Node>, req: &Request, parent: &str) -> Response {
    let q = Params::new(&req.query);
    let rows = match tri!(q.given("partitions")).as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => return error(400, "invalid partitions: want \"true\" or \"false\""),
    };
    let meta = node.meta();
    let Some(p) = meta.topic(parent) else {
        return error(404, "topic not found");
    };
    let (lags, all_answered) = node.fanout_lag(p.id).await;
    let any_remote = p
        .children
        .iter()
        .any(|c| meta.topic(c).is_some_and(|c| c.remote.is_some()));
    let frontiers = if rows && any_remote {
        Some(super::remote_children::ack_frontiers(node, p).await)
    } else {
        None
    };
    let children = p
        .children
        .iter()
        .filter_map(|name| meta.topic(name))
        .map(|c| {
            let lag = lags.iter().find(|l| l.child == c.id);
            let mut row = serde_json::json!({
                "name": &c.name,
                "delay_ms": c.fanout_delay_ms,
                "lag_messages": lag.map_or(0, |l| l.lag_messages),
                "lag_complete": all_answered && lag.is_some_and(|l| l.cursors == p.partitions),
            });
            super::remote_children::list_fields(&mut row, c, lag, p);
            if let Some(f) = &frontiers {
                super::remote_children::partition_rows(node, &mut row, c, lag, p, f);
            }
            row
        })
        .collect();
    json(
        200,
        &ChildList {
            parent: &p.name,
            parent_id: p.id.to_string(),
            children,
        },
    )
}

/// `DELETE /v1/topics/{parent}/children/{child}`.
pub async fn detach(node: &Rc<Node>, req: &Request, parent: &str, child: &str) -> Response {
    let q = Params::new(&req.query);
    match tri!(q.given("force")).as_deref() {
        None | Some("true") | Some("false") => {}
        Some(_) => return error(400, "invalid force: want \"true\" or \"false\""),
    }
    let (Some(p), Some(c)) = (node.topic(parent), node.topic(child)) else {
        return error(404, "topic not found");
    };
    if c.remote.is_some() && c.parent.as_deref() == Some(parent) {
        if !node.config.security_enabled {
            return error(403, REMOTES_NEED_SECURITY);
        }
        if q.given("force").ok().flatten().as_deref() != Some("true") {
            if let Some(r) = super::remote_children::unshipped(node, &p, &c).await {
                return r;
            }
        }
        if let Some(r) = super::remote_children::write_budget(node) {
            return r;
        }
    }
    match node
        .propose(MetaCommand::DetachChild {
            parent: parent.to_string(),
            child: child.to_string(),
        })
        .await
    {
        Ok(_) => Response::empty(204),
        Err(e) => propose_error(e),
    }
}
