//! The HTTP API of API.md: the request pipeline (§1.4), the router and the handlers. Handlers run
//! on the shard that accepted the connection and reach partitions on other shards only through
//! [`crate::node::Node`]. This module never touches a file.

/// Returns the error answer of a `Result<T, Response>` from the enclosing handler.
macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(r) => return r,
        }
    };
}

pub mod messages;
pub mod params;
pub mod topics;

use std::rc::Rc;

use crate::http::{Request, RequestHead, Response};
use crate::node::Node;

/// Body caps (API.md §4).
pub const BODY_BYTES_MAX: usize = 1 << 20;
pub const BATCH_BODY_BYTES_MAX: usize = 16 << 20;
pub const BATCH_ACK_BODY_BYTES_MAX: usize = 64 << 10;

const GUARD_ERROR: &str = "state-changing requests must send Content-Type: application/json or application/octet-stream, or an X-Narad-Client header";

/// A JSON error answer: `{"error":"..."}` and a newline.
pub fn error(status: u16, msg: &str) -> Response {
    Response::json(status, crate::wire::json::error_body(msg))
}

/// A JSON answer from a serialisable value.
pub fn json<T: serde::Serialize>(status: u16, v: &T) -> Response {
    let mut body = serde_json::to_vec(v).unwrap_or_else(|_| b"{}".to_vec());
    body.push(b'\n');
    Response::json(status, body)
}

/// Maps a failed metadata proposal to its answer.
pub fn propose_error(e: narad_raft::ProposeError) -> Response {
    use narad_raft::ProposeError;
    match e {
        ProposeError::Apply(me) => error(me.kind.http_status(), &me.message),
        ProposeError::NoLeader { .. } => error(503, "control plane temporarily unavailable"),
        other => {
            tracing::error!(error = %other, "metadata proposal failed");
            error(503, &other.to_string())
        }
    }
}

/// Which route a path and method matched (the `route` label of metrics too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    TopicsCreate,
    TopicsList,
    TopicGet,
    TopicPatch,
    TopicDelete,
    TopicSchema,
    Produce,
    ProduceBatch,
    Consume,
    Ack,
    Healthz,
    Readyz,
    Metrics,
}

impl Route {
    /// The route's pattern, as the `route` label of metrics and the OpenAPI document
    /// (docs/openapi.json) name it. Exhaustive on purpose: a new route gets its pattern here and
    /// its entry in the document (the `openapi_lists_every_route` test checks both).
    pub fn pattern(self) -> &'static str {
        match self {
            Route::TopicsCreate => "POST /v1/topics",
            Route::TopicsList => "GET /v1/topics",
            Route::TopicGet => "GET /v1/topics/{topic}",
            Route::TopicPatch => "PATCH /v1/topics/{topic}",
            Route::TopicDelete => "DELETE /v1/topics/{topic}",
            Route::TopicSchema => "GET /v1/topics/{topic}/schema",
            Route::Produce => "POST /v1/topics/{topic}/produce",
            Route::ProduceBatch => "POST /v1/topics/{topic}/produce/batch",
            Route::Consume => "GET /v1/topics/{topic}/consume",
            Route::Ack => "POST /v1/topics/{topic}/ack",
            Route::Healthz => "GET /healthz",
            Route::Readyz => "GET /readyz",
            Route::Metrics => "GET /metrics",
        }
    }
}

/// The `route` label of a request (API.md §9.1 metrics): its matched pattern, or `unmatched`
/// (no route, or a known path with the wrong method).
pub fn route_label(method: &str, path: &str) -> &'static str {
    match route(method, path) {
        Match::Found(r, _) => r.pattern(),
        _ => "unmatched",
    }
}

enum Match<'a> {
    Found(Route, Vec<&'a str>),
    WrongMethod(&'static str),
    NotFound,
}

fn route<'a>(method: &str, path: &'a str) -> Match<'a> {
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let get = method == "GET" || method == "HEAD";
    use Route::*;
    let found = |r, args| Match::Found(r, args);
    match segs.as_slice() {
        ["healthz"] if get => found(Healthz, vec![]),
        ["healthz"] => Match::WrongMethod("GET, HEAD"),
        ["readyz"] if get => found(Readyz, vec![]),
        ["readyz"] => Match::WrongMethod("GET, HEAD"),
        ["metrics"] if get => found(Metrics, vec![]),
        ["metrics"] => Match::WrongMethod("GET, HEAD"),
        ["v1", "topics"] => match method {
            "POST" => found(TopicsCreate, vec![]),
            "GET" | "HEAD" => found(TopicsList, vec![]),
            _ => Match::WrongMethod("GET, HEAD, POST"),
        },
        ["v1", "topics", t] if !t.is_empty() => match method {
            "GET" | "HEAD" => found(TopicGet, vec![t]),
            "PATCH" => found(TopicPatch, vec![t]),
            "DELETE" => found(TopicDelete, vec![t]),
            _ => Match::WrongMethod("DELETE, GET, HEAD, PATCH"),
        },
        ["v1", "topics", t, "schema"] if !t.is_empty() => {
            if get {
                found(TopicSchema, vec![t])
            } else {
                Match::WrongMethod("GET, HEAD")
            }
        }
        ["v1", "topics", t, "produce"] if !t.is_empty() => {
            if method == "POST" {
                found(Produce, vec![t])
            } else {
                Match::WrongMethod("POST")
            }
        }
        ["v1", "topics", t, "produce", "batch"] if !t.is_empty() => {
            if method == "POST" {
                found(ProduceBatch, vec![t])
            } else {
                Match::WrongMethod("POST")
            }
        }
        ["v1", "topics", t, "consume"] if !t.is_empty() => {
            if get {
                found(Consume, vec![t])
            } else {
                Match::WrongMethod("GET, HEAD")
            }
        }
        ["v1", "topics", t, "ack"] if !t.is_empty() => {
            if method == "POST" {
                found(Ack, vec![t])
            } else {
                Match::WrongMethod("POST")
            }
        }
        _ => Match::NotFound,
    }
}

/// The cross-site guard of API.md §3: true when a state-changing request may pass.
fn guard_passes(head: &RequestHead) -> bool {
    if head
        .headers
        .get("x-narad-client")
        .is_some_and(|v| !v.is_empty())
    {
        return true;
    }
    let Some(ct) = head.headers.get("content-type") else {
        return false;
    };
    let ct = String::from_utf8_lossy(ct);
    let media = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    media == "application/json" || media == "application/octet-stream"
}

fn is_state_changing(method: &str) -> bool {
    matches!(method, "POST" | "PUT" | "PATCH")
}

/// Answers that can be decided from the head alone, before the body is read: guard, 404, 405,
/// and the body cap of the matched route.
pub fn body_limit(head: &RequestHead) -> Result<usize, Response> {
    if is_state_changing(head.method.as_str()) && !guard_passes(head) {
        return Err(error(415, GUARD_ERROR));
    }
    match route(head.method.as_str(), &head.path) {
        Match::NotFound => Err(Response::text(404, "404 page not found\n")),
        Match::WrongMethod(allow) => {
            let mut r = Response::text(405, "Method Not Allowed\n");
            r.headers.push(("Allow".into(), allow.into()));
            Err(r)
        }
        Match::Found(r, _) => Ok(match r {
            Route::ProduceBatch => BATCH_BODY_BYTES_MAX,
            Route::Ack => BATCH_ACK_BODY_BYTES_MAX,
            Route::Healthz | Route::Readyz | Route::Metrics => 0,
            _ => BODY_BYTES_MAX,
        }),
    }
}

/// The answer for a body over the route's cap.
pub fn too_large(head: &RequestHead) -> Response {
    match route(head.method.as_str(), &head.path) {
        Match::Found(Route::ProduceBatch, _) => error(413, "request body too large"),
        _ => error(413, "request body too large"),
    }
}

/// Serves one request (the head already passed [`body_limit`]).
pub async fn handle(node: &Rc<Node>, mut req: Request) -> Response {
    let path = std::mem::take(&mut req.path);
    let (r, args) = match route(req.method.as_str(), &path) {
        Match::Found(r, args) => (r, args.into_iter().map(String::from).collect::<Vec<_>>()),
        // body_limit already answered these; kept for callers that skip it.
        Match::NotFound => return Response::text(404, "404 page not found\n"),
        Match::WrongMethod(allow) => {
            let mut r = Response::text(405, "Method Not Allowed\n");
            r.headers.push(("Allow".into(), allow.into()));
            return r;
        }
    };
    let topic = args.first().map(|t| percent_decode_segment(t));
    let topic = match topic {
        Some(Ok(t)) => Some(t),
        Some(Err(())) => return Response::text(404, "404 page not found\n"),
        None => None,
    };
    let t = topic.as_deref().unwrap_or("");
    match r {
        Route::Healthz => {
            if node.shutting_down() {
                json(503, &serde_json::json!({"status":"shutting down"}))
            } else {
                json(200, &serde_json::json!({"status":"ok"}))
            }
        }
        Route::Readyz => match node.ready() {
            Ok(()) => json(200, &serde_json::json!({"status":"ready"})),
            Err(reason) => error(503, &reason),
        },
        Route::Metrics => crate::metrics::api_port_response(node).await,
        Route::TopicsCreate => topics::create(node, &req).await,
        Route::TopicsList => topics::list(node, &req),
        Route::TopicGet => topics::describe(node, &req, t).await,
        Route::TopicPatch => topics::alter(node, &req, t).await,
        Route::TopicDelete => topics::delete(node, &req, t).await,
        Route::TopicSchema => topics::schema(node, t),
        Route::Produce => messages::produce(node, req, t).await,
        Route::ProduceBatch => messages::produce_batch(node, &req, t).await,
        Route::Consume => messages::consume(node, &req, t).await,
        Route::Ack => messages::ack(node, &req, t).await,
    }
}

/// Decodes `%XX` escapes of one path segment (a topic name is plain ASCII; anything decoding to
/// a `/` or invalid bytes is no route).
fn percent_decode_segment(s: &str) -> Result<String, ()> {
    if !s.contains('%') {
        return Ok(s.to_string());
    }
    let bytes = crate::wire::query::form_decode(s.as_bytes())
        .map_err(|_| ())?
        .into_owned();
    let s = String::from_utf8(bytes).map_err(|_| ())?;
    if s.contains('/') {
        return Err(());
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_matches_spec_routes_and_methods() {
        // Proves the route table of API.md §5 for the routes served here, with 405 Allow lists.
        assert!(matches!(
            route("POST", "/v1/topics"),
            Match::Found(Route::TopicsCreate, _)
        ));
        assert!(matches!(
            route("HEAD", "/v1/topics/a"),
            Match::Found(Route::TopicGet, _)
        ));
        assert!(matches!(
            route("POST", "/v1/topics/a/produce/batch"),
            Match::Found(Route::ProduceBatch, _)
        ));
        assert!(matches!(
            route("PUT", "/v1/topics/a/produce"),
            Match::WrongMethod("POST")
        ));
        assert!(matches!(route("GET", "/v1/topics/a/b"), Match::NotFound));
        assert!(matches!(route("GET", "/v2"), Match::NotFound));
        assert!(matches!(
            route("GET", "/v1/topics//produce"),
            Match::NotFound
        ));
    }
}
