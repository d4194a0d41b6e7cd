//! The HTTP API of API.md: the request pipeline (§1.4), the router and the handlers. Handlers run
//! on the shard that accepted the connection and reach partitions on other shards only through
//! [`crate::node::Node`]. This module never touches a file.

/// Returns the error answer of a `Result<T, Response>` from the enclosing handler.
macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(r) => return r.into(),
        }
    };
}

pub mod admission;
pub mod children;
pub mod cluster;
pub mod messages;
pub mod openapi;
pub mod params;
pub mod remote_children;
pub mod remotes;
pub mod topics;
pub mod users;

use std::rc::Rc;

use crate::auth::{self, Caller};
use crate::http::{Headers, Request, RequestHead, Response};
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

/// The answer to a failed authentication or password operation (API.md §2).
impl From<auth::AuthError> for Response {
    fn from(e: auth::AuthError) -> Response {
        let status = match e {
            auth::AuthError::Unauthorized => 401,
            auth::AuthError::Throttled => 429,
            auth::AuthError::Busy => 503,
            auth::AuthError::Unavailable | auth::AuthError::HashFailed => 500,
        };
        let r = error(status, &e.to_string());
        match e {
            auth::AuthError::Unauthorized => {
                r.with_header("WWW-Authenticate", "Basic realm=\"narad\"")
            }
            auth::AuthError::Busy => r.with_header("Retry-After", "1"),
            _ => r,
        }
    }
}

/// A JSON answer from a serialisable value.
pub fn json<T: serde::Serialize>(status: u16, v: &T) -> Response {
    let mut body = serde_json::to_vec(v).unwrap_or_else(|_| b"{}".to_vec());
    body.push(b'\n');
    Response::json(status, body)
}

/// The answer to a metadata command the state machine refused.
pub fn meta_refusal(e: &narad_raft::MetaError) -> Response {
    let status = match e.kind {
        narad_raft::MetaErrorKind::Invalid => 400,
        narad_raft::MetaErrorKind::Forbidden => 403,
        narad_raft::MetaErrorKind::NotFound => 404,
        narad_raft::MetaErrorKind::Conflict => 409,
    };
    error(status, &e.message)
}

/// Maps a failed metadata proposal to its answer.
pub fn propose_error(e: narad_raft::ProposeError) -> Response {
    use narad_raft::ProposeError;
    match e {
        ProposeError::Apply(me) => meta_refusal(&me),
        ProposeError::NoLeader { .. } => error(503, "control plane temporarily unavailable"),
        ProposeError::DiskFull => {
            tracing::warn!("metadata change refused: the disk is full");
            error(503, &ProposeError::DiskFull.to_string())
        }
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
    OpenApi,
    ChildrenAttach,
    ChildrenList,
    ChildDetach,
    UsersCreate,
    UsersList,
    UserGet,
    UserDelete,
    UserGrants,
    UserPassword,
    ClusterMembers,
    ClusterMoves,
    ClusterDecommission,
    ClusterDecommissionCancel,
    ClusterMoveAbort,
    ClusterForget,
    RemotesCreate,
    RemotesList,
    RemoteGet,
    RemotePatch,
    RemoteDelete,
    RemoteTest,
    RemotesReencrypt,
    ChildPause,
    ChildResume,
    ChildSkip,
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
            Route::OpenApi => "GET /v1/openapi.json",
            Route::ChildrenAttach => "POST /v1/topics/{parent}/children",
            Route::ChildrenList => "GET /v1/topics/{parent}/children",
            Route::ChildDetach => "DELETE /v1/topics/{parent}/children/{child}",
            Route::UsersCreate => "POST /v1/users",
            Route::UsersList => "GET /v1/users",
            Route::UserGet => "GET /v1/users/{username}",
            Route::UserDelete => "DELETE /v1/users/{username}",
            Route::UserGrants => "PUT /v1/users/{username}/grants",
            Route::UserPassword => "PUT /v1/users/{username}/password",
            Route::ClusterMembers => "GET /v1/cluster/members",
            Route::ClusterMoves => "GET /v1/cluster/moves",
            Route::ClusterDecommission => "POST /v1/cluster/members/{id}/decommission",
            Route::ClusterDecommissionCancel => "DELETE /v1/cluster/members/{id}/decommission",
            Route::ClusterMoveAbort => "POST /v1/cluster/moves/{topic}/{partition}/abort",
            Route::ClusterForget => "POST /v1/cluster/members/{id}/forget",
            Route::RemotesCreate => "POST /v1/remotes",
            Route::RemotesList => "GET /v1/remotes",
            Route::RemoteGet => "GET /v1/remotes/{name}",
            Route::RemotePatch => "PATCH /v1/remotes/{name}",
            Route::RemoteDelete => "DELETE /v1/remotes/{name}",
            Route::RemoteTest => "POST /v1/remotes/{name}/test",
            Route::RemotesReencrypt => "POST /v1/cluster/reencrypt-remotes",
            Route::ChildPause => "POST /v1/topics/{parent}/children/{child}/pause",
            Route::ChildResume => "POST /v1/topics/{parent}/children/{child}/resume",
            Route::ChildSkip => "POST /v1/topics/{parent}/children/{child}/skip",
        }
    }
}

/// Every route the router knows (the OpenAPI test checks the document against it): add a new
/// variant here too.
pub const ROUTES: &[Route] = &[
    Route::TopicsCreate,
    Route::TopicsList,
    Route::TopicGet,
    Route::TopicPatch,
    Route::TopicDelete,
    Route::TopicSchema,
    Route::Produce,
    Route::ProduceBatch,
    Route::Consume,
    Route::Ack,
    Route::Healthz,
    Route::Readyz,
    Route::Metrics,
    Route::OpenApi,
    Route::UsersCreate,
    Route::UsersList,
    Route::UserGet,
    Route::UserDelete,
    Route::UserGrants,
    Route::UserPassword,
    Route::ChildrenAttach,
    Route::ChildrenList,
    Route::ChildDetach,
    Route::ClusterMembers,
    Route::ClusterMoves,
    Route::ClusterDecommission,
    Route::ClusterDecommissionCancel,
    Route::ClusterMoveAbort,
    Route::ClusterForget,
    Route::RemotesCreate,
    Route::RemotesList,
    Route::RemoteGet,
    Route::RemotePatch,
    Route::RemoteDelete,
    Route::RemoteTest,
    Route::RemotesReencrypt,
    Route::ChildPause,
    Route::ChildResume,
    Route::ChildSkip,
];

/// Whether `route(method, path)` finds `r` (for the OpenAPI test, which cannot name `Match`).
pub fn routes_to(method: &str, path: &str) -> Option<Route> {
    match route(method, path) {
        Match::Found(r, _) => Some(r),
        _ => None,
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

/// The path arguments of a matched route (topic or user name, child name): at most two, kept
/// inline so that matching a route allocates nothing (it runs for the body cap, the handler and
/// the metrics label of every request).
#[derive(Clone, Copy, Debug, Default)]
struct Args<'a>([&'a str; 2], usize);

impl<'a> Args<'a> {
    const NONE: Args<'static> = Args(["", ""], 0);
    fn one(a: &'a str) -> Args<'a> {
        Args([a, ""], 1)
    }
    fn two(a: &'a str, b: &'a str) -> Args<'a> {
        Args([a, b], 2)
    }
    fn first(&self) -> Option<&'a str> {
        self.get(0)
    }
    fn get(&self, i: usize) -> Option<&'a str> {
        (i < self.1).then(|| self.0[i])
    }
}

/// Segments of the deepest route (`/v1/cluster/moves/{t}/{p}/abort`) plus one, to tell deeper
/// paths.
const ROUTE_SEGMENTS_MAX: usize = 7;

enum Match<'a> {
    Found(Route, Args<'a>),
    WrongMethod(&'static str),
    NotFound,
}

/// `found` when the request's method is `want`, else `405` allowing only `want`.
fn only<'a>(method: &str, want: &'static str, found: Match<'a>) -> Match<'a> {
    if method == want {
        found
    } else {
        Match::WrongMethod(want)
    }
}

/// `found` for GET or HEAD, else `405` allowing those.
fn only_get(get: bool, found: Match<'_>) -> Match<'_> {
    if get {
        found
    } else {
        Match::WrongMethod("GET, HEAD")
    }
}

fn route<'a>(method: &str, path: &'a str) -> Match<'a> {
    let mut buf = [""; ROUTE_SEGMENTS_MAX];
    let mut n = 0;
    for seg in path.trim_start_matches('/').split('/') {
        if n == buf.len() {
            return Match::NotFound;
        }
        buf[n] = seg;
        n += 1;
    }
    let segs = &buf[..n];
    let get = method == "GET" || method == "HEAD";
    use Route::*;
    let found = |r, args| Match::Found(r, args);
    match segs {
        ["healthz"] if get => found(Healthz, Args::NONE),
        ["healthz"] => Match::WrongMethod("GET, HEAD"),
        ["readyz"] if get => found(Readyz, Args::NONE),
        ["readyz"] => Match::WrongMethod("GET, HEAD"),
        ["metrics"] if get => found(Metrics, Args::NONE),
        ["metrics"] => Match::WrongMethod("GET, HEAD"),
        ["v1", "openapi.json"] if get => found(OpenApi, Args::NONE),
        ["v1", "openapi.json"] => Match::WrongMethod("GET, HEAD"),
        ["v1", "topics"] => match method {
            "POST" => found(TopicsCreate, Args::NONE),
            "GET" | "HEAD" => found(TopicsList, Args::NONE),
            _ => Match::WrongMethod("GET, HEAD, POST"),
        },
        ["v1", "topics", t] if !t.is_empty() => match method {
            "GET" | "HEAD" => found(TopicGet, Args::one(t)),
            "PATCH" => found(TopicPatch, Args::one(t)),
            "DELETE" => found(TopicDelete, Args::one(t)),
            _ => Match::WrongMethod("DELETE, GET, HEAD, PATCH"),
        },
        ["v1", "topics", t, "schema"] if !t.is_empty() => {
            only_get(get, found(TopicSchema, Args::one(t)))
        }
        ["v1", "topics", t, "produce"] if !t.is_empty() => {
            only(method, "POST", found(Produce, Args::one(t)))
        }
        ["v1", "topics", t, "produce", "batch"] if !t.is_empty() => {
            only(method, "POST", found(ProduceBatch, Args::one(t)))
        }
        ["v1", "topics", t, "consume"] if !t.is_empty() => {
            only_get(get, found(Consume, Args::one(t)))
        }
        ["v1", "topics", t, "children"] if !t.is_empty() => match method {
            "POST" => found(ChildrenAttach, Args::one(t)),
            "GET" | "HEAD" => found(ChildrenList, Args::one(t)),
            _ => Match::WrongMethod("GET, HEAD, POST"),
        },
        ["v1", "topics", t, "children", c] if !t.is_empty() && !c.is_empty() => {
            only(method, "DELETE", found(ChildDetach, Args::two(t, c)))
        }
        ["v1", "topics", t, "ack"] if !t.is_empty() => {
            only(method, "POST", found(Ack, Args::one(t)))
        }
        ["v1", "users"] => match method {
            "POST" => found(UsersCreate, Args::NONE),
            "GET" | "HEAD" => found(UsersList, Args::NONE),
            _ => Match::WrongMethod("GET, HEAD, POST"),
        },
        ["v1", "users", u] if !u.is_empty() => match method {
            "GET" | "HEAD" => found(UserGet, Args::one(u)),
            "DELETE" => found(UserDelete, Args::one(u)),
            _ => Match::WrongMethod("DELETE, GET, HEAD"),
        },
        ["v1", "users", u, "grants"] if !u.is_empty() => {
            only(method, "PUT", found(UserGrants, Args::one(u)))
        }
        ["v1", "users", u, "password"] if !u.is_empty() => {
            only(method, "PUT", found(UserPassword, Args::one(u)))
        }
        ["v1", "cluster", "members"] if get => found(ClusterMembers, Args::NONE),
        ["v1", "cluster", "members"] => Match::WrongMethod("GET, HEAD"),
        ["v1", "cluster", "moves"] if get => found(ClusterMoves, Args::NONE),
        ["v1", "cluster", "moves"] => Match::WrongMethod("GET, HEAD"),
        ["v1", "cluster", "members", id, "decommission"] if !id.is_empty() => match method {
            "POST" => found(ClusterDecommission, Args::one(id)),
            "DELETE" => found(ClusterDecommissionCancel, Args::one(id)),
            _ => Match::WrongMethod("DELETE, POST"),
        },
        ["v1", "cluster", "members", id, "forget"] if !id.is_empty() => {
            only(method, "POST", found(ClusterForget, Args::one(id)))
        }
        ["v1", "cluster", "moves", t, p, "abort"] if !t.is_empty() && !p.is_empty() => {
            only(method, "POST", found(ClusterMoveAbort, Args::two(t, p)))
        }
        ["v1", "cluster", "reencrypt-remotes"] => {
            only(method, "POST", found(RemotesReencrypt, Args::NONE))
        }
        ["v1", "remotes"] => match method {
            "POST" => found(RemotesCreate, Args::NONE),
            "GET" | "HEAD" => found(RemotesList, Args::NONE),
            _ => Match::WrongMethod("GET, HEAD, POST"),
        },
        ["v1", "remotes", n] if !n.is_empty() => match method {
            "GET" | "HEAD" => found(RemoteGet, Args::one(n)),
            "PATCH" => found(RemotePatch, Args::one(n)),
            "DELETE" => found(RemoteDelete, Args::one(n)),
            _ => Match::WrongMethod("DELETE, GET, HEAD, PATCH"),
        },
        ["v1", "remotes", n, "test"] if !n.is_empty() => {
            only(method, "POST", found(RemoteTest, Args::one(n)))
        }
        ["v1", "topics", t, "children", c, action @ ("pause" | "resume" | "skip")]
            if !t.is_empty() && !c.is_empty() =>
        {
            let r = match *action {
                "pause" => ChildPause,
                "resume" => ChildResume,
                _ => ChildSkip,
            };
            only(method, "POST", found(r, Args::two(t, c)))
        }
        _ => Match::NotFound,
    }
}

/// The `403` of a produce without the grant (API.md §10.1).
const PRODUCE_DENIED: &str = "produce not allowed on this topic";

/// The cross-site guard of API.md §3: true when a state-changing request may pass.
fn guard_passes(headers: &Headers) -> bool {
    if headers.get("x-narad-client").is_some_and(|v| !v.is_empty()) {
        return true;
    }
    let Some(ct) = headers.get("content-type") else {
        return false;
    };
    // The media type before any parameters, trimmed, compared without regard to case (no
    // allocation: this runs for every produce).
    let media = ct.split(|&b| b == b';').next().unwrap_or(&[]).trim_ascii();
    media.eq_ignore_ascii_case(b"application/json")
        || media.eq_ignore_ascii_case(b"application/octet-stream")
}

fn is_state_changing(method: &str) -> bool {
    matches!(method, "POST" | "PUT" | "PATCH")
}

/// Answers that can be decided from the head alone, before the body is read: guard, 404, 405,
/// and the body cap of the matched route.
pub fn body_limit(head: &RequestHead) -> Result<usize, Response> {
    // Authentication comes first (API.md §1.4). A credential that needs a bcrypt check has the
    // guard and route decided after the check, in `handle`; its body is read meanwhile, within
    // the largest cap when the route is unknown.
    let caller = match auth::precheck(&head.headers, &head.path) {
        auth::Pre::Pass(caller) => caller,
        auth::Pre::Deny(e) => return Err(e.into()),
        auth::Pre::Pending => {
            return Ok(match route(head.method.as_str(), &head.path) {
                Match::Found(r, _) => route_body_cap(r),
                _ => BODY_BYTES_MAX,
            })
        }
    };
    if is_state_changing(head.method.as_str()) && !guard_passes(&head.headers) {
        return Err(error(415, GUARD_ERROR));
    }
    match route(head.method.as_str(), &head.path) {
        Match::NotFound => Err(Response::text(404, "404 page not found\n")),
        Match::WrongMethod(allow) => {
            let mut r = Response::text(405, "Method Not Allowed\n");
            r.headers.push(("Allow".into(), allow.into()));
            Err(r)
        }
        Match::Found(r @ (Route::Produce | Route::ProduceBatch), args) => {
            // The grant, then a bad query, win over the body's size (API.md §1.4, §10.1
            // order); the caller passed authentication above.
            let Some(t) = args.first().map(percent_decode_segment) else {
                return Ok(route_body_cap(r));
            };
            if !caller.may(auth::rbac::ACTION_PRODUCE, &t) {
                return Err(error(403, PRODUCE_DENIED));
            }
            messages::produce_query(&head.query, matches!(r, Route::ProduceBatch))?;
            Ok(route_body_cap(r))
        }
        Match::Found(r, _) => Ok(route_body_cap(r)),
    }
}

/// Whether a request head is a produce (single or batch), for the produce cap taken before the
/// body is read.
pub fn is_produce(method: &str, path: &str) -> bool {
    matches!(
        route(method, path),
        Match::Found(Route::Produce | Route::ProduceBatch, _)
    )
}

/// Body cap of the probe, scrape and OpenAPI routes, which ignore their body.
const PROBE_BODY_BYTES_MAX: usize = 64 << 10;

/// The body cap of a route (API.md §4).
fn route_body_cap(r: Route) -> usize {
    match r {
        Route::ProduceBatch => BATCH_BODY_BYTES_MAX,
        Route::Ack => BATCH_ACK_BODY_BYTES_MAX,
        // Probes and scrapes ignore a body, as Go's handlers do; a small one is read and
        // dropped instead of refused (which closed the connection and lost pipelined requests).
        Route::Healthz | Route::Readyz | Route::Metrics | Route::OpenApi => PROBE_BODY_BYTES_MAX,
        _ => BODY_BYTES_MAX,
    }
}

fn is_user_route(r: Route) -> bool {
    matches!(
        r,
        Route::UsersCreate
            | Route::UsersList
            | Route::UserGet
            | Route::UserDelete
            | Route::UserGrants
            | Route::UserPassword
    )
}

/// The answer for a body over the route's cap: API.md §1.4's earlier steps first, since the
/// cap was decided before the credential was checked when that needed a bcrypt check
/// (authentication `401`/`429`, the guard's `415`, then the grant checks' `403`), then `413`.
pub async fn too_large(node: &Rc<Node>, head: &RequestHead) -> Response {
    let caller = tri!(auth::authenticate(node, &head.headers, head.peer, &head.path).await);
    if is_state_changing(head.method.as_str()) && !guard_passes(&head.headers) {
        return error(415, GUARD_ERROR);
    }
    let Match::Found(r, args) = route(head.method.as_str(), &head.path) else {
        return error(413, "request body too large");
    };
    if let Some(t) = args.first().map(percent_decode_segment) {
        let second = args.get(1).map(percent_decode_segment);
        // The body is not read: only the checks that do not need it can refuse.
        if let Some(denied) = authorize(node, &caller, r, &t, second.as_deref(), &[]) {
            return denied;
        }
    }
    if let Route::Produce | Route::ProduceBatch = r {
        if let Err(bad) = messages::produce_query(&head.query, matches!(r, Route::ProduceBatch)) {
            return bad;
        }
    }
    too_large_for(r)
}

/// Serves one request (the head already passed [`body_limit`]).
pub async fn handle(node: &Rc<Node>, mut req: Request) -> Response {
    let path = std::mem::take(&mut req.path);
    // Authentication (API.md §1.4 step 3): from the caches, or the bcrypt check that
    // `body_limit` left pending; then the guard (step 4) for the requests it did not see.
    let caller = tri!(auth::authenticate(node, &req.headers, req.peer, &path).await);
    if is_state_changing(req.method.as_str()) && !guard_passes(&req.headers) {
        return error(415, GUARD_ERROR);
    }
    let (r, args) = match route(req.method.as_str(), &path) {
        Match::Found(r, args) => (r, args),
        // body_limit already answered these; kept for callers that skip it.
        Match::NotFound => return Response::text(404, "404 page not found\n"),
        Match::WrongMethod(allow) => {
            let mut r = Response::text(405, "Method Not Allowed\n");
            r.headers.push(("Allow".into(), allow.into()));
            return r;
        }
    };
    let topic = args.first().map(percent_decode_segment);
    let t = topic.as_deref().unwrap_or("");
    // A name this node's replica does not know may have been created through another node a
    // moment ago: catch up with the leader once before answering as if it did not exist.
    if !t.is_empty() && !node.config.peers.is_empty() {
        let meta = node.meta();
        if meta.topic(t).is_none()
            && meta.user(t).is_none()
            && !node.catch_up_meta().await
            && !matches!(req.method.as_str(), "GET" | "HEAD")
            && r != Route::Produce
            && r != Route::ProduceBatch
        {
            // A change naming something this replica does not know, with no leader in reach to
            // say whether it exists: the change could not be made anyway (CLUSTER.md §3).
            return error(503, "control plane temporarily unavailable")
                .with_header("Retry-After", "1");
        }
    }
    // Per-identity caps (step 6), held until the answer is ready (a long-poll's whole wait).
    let _cap = tri!(identity_cap(node, &caller, r, &mut req));
    // Authorization (step 7, API.md §16); user routes check their own rules.
    let second = args.get(1).map(percent_decode_segment);
    if let Some(denied) = authorize(node, &caller, r, t, second.as_deref(), &req.body) {
        return denied;
    }
    // The server refuses a body over the route's cap before reading it (`too_large`); this is
    // for callers that skip that (requests not read from a socket).
    if req.body.len() > route_body_cap(r) {
        return too_large_for(r);
    }
    // Every later request on this shard sees the single produces it answered before, as if
    // they were committed at their owner (crate::transit): reads, and the admin changes that
    // take partition ends (an attach point) or stop copies (a detach). Not produces and acks
    // (an acked message was consumed, so handed over), nor the probes. A consume takes a mark
    // and waits only if it comes up short (crate::transit).
    let mut catch_up = None;
    if r == Route::Consume {
        catch_up = node.transit.mark();
    } else if !matches!(
        r,
        Route::Produce | Route::ProduceBatch | Route::Ack | Route::Healthz | Route::Readyz
    ) {
        node.transit.caught_up().await;
    }
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
            Err(reason) => error(503, &reason.to_string()),
        },
        Route::Metrics => crate::scrape::api_port_response(node).await,
        Route::OpenApi => openapi::response(),
        Route::TopicsCreate => {
            topics::create(node, &req, caller.username().map(String::from)).await
        }
        Route::TopicsList => topics::list(node, &req, &|t| caller.is_admin() || caller.may_read(t)),
        Route::TopicGet => topics::describe(node, &req, t).await,
        Route::TopicPatch => topics::alter(node, &req, t).await,
        Route::TopicDelete => topics::delete(node, &req, t).await,
        Route::TopicSchema => topics::schema(node, t),
        Route::Produce => messages::produce(node, req, t).await,
        Route::ProduceBatch => messages::produce_batch(node, &mut req, t).await,
        Route::Consume => messages::consume(node, &req, t, catch_up).await,
        Route::Ack => messages::ack(node, &req, t).await,
        Route::ChildrenAttach => children::attach(node, &req, &caller, t).await,
        Route::ChildrenList => children::list(node, &req, t).await,
        Route::ChildDetach => match second {
            Some(c) => children::detach(node, &req, t, &c).await,
            None => Response::text(404, "404 page not found\n"),
        },
        Route::UsersCreate => users::create(node, &req, &caller).await,
        Route::UsersList => users::list(node, &caller),
        Route::UserGet => users::get(node, &caller, t),
        Route::UserDelete => users::delete(node, &caller, t).await,
        Route::UserGrants => users::set_grants(node, &req, &caller, t).await,
        Route::UserPassword => users::set_password(node, &req, &caller, t).await,
        Route::ClusterMembers => cluster::members(node, &req).await,
        Route::ClusterMoves => cluster::moves(node, &req),
        Route::ClusterDecommission => cluster::decommission(node, &req, &caller, t).await,
        Route::ClusterDecommissionCancel => {
            cluster::cancel_decommission(node, &req, &caller, t).await
        }
        Route::ClusterForget => cluster::forget(node, &caller, t).await,
        Route::RemotesCreate => remotes::create(node, &req, &caller).await,
        Route::RemotesList => remotes::list(node, &req, &caller).await,
        Route::RemoteGet => remotes::get(node, &req, &caller, t).await,
        Route::RemotePatch => remotes::patch(node, &req, &caller, t).await,
        Route::RemoteDelete => remotes::delete(node, &req, &caller, t).await,
        Route::RemotesReencrypt => remotes::reencrypt(node, &req, &caller).await,
        Route::ChildPause | Route::ChildResume | Route::ChildSkip => {
            children::remote_child_op(node, &req, &caller, r, t, second.as_deref()).await
        }
        Route::RemoteTest => remotes::test(node, &req, &caller, t).await,
        Route::ClusterMoveAbort => match second {
            Some(p) => cluster::abort_move(node, &req, &caller, t, &p).await,
            None => Response::text(404, "404 page not found\n"),
        },
    }
}

/// The over-cap answer of a route: user routes and attach-child decode while reading in the
/// original, so their over-cap body is a JSON error (`400`); every other route answers `413`
/// (API.md §4).
fn too_large_for(r: Route) -> Response {
    if is_user_route(r) || r == Route::ChildrenAttach {
        error(400, "invalid json: http: request body too large")
    } else {
        error(413, "request body too large")
    }
}

/// Takes the caller's per-identity units for a consume or produce (API.md §4).
fn identity_cap(
    node: &Node,
    caller: &Caller,
    r: Route,
    req: &mut Request,
) -> Result<Option<auth::caps::CapGuard>, Response> {
    use auth::caps::Kind;
    let h = &node.config.http;
    // A produce whose caller was known from the head took its unit before the body was read
    // (`crate::service::ApiService::reserve_body`): a single produce keeps it; a batch gives it back
    // for its message count below.
    let held = admission::BodyHold::take_produce_slot(req);
    if r == Route::Produce && held.is_some() {
        return Ok(held);
    }
    drop(held);
    let (kind, cap, units) = match r {
        Route::Consume => {
            // A batch consume counts as its `max` (clamped to the cap).
            let max = params::Params::new(&req.query)
                .str("max")
                .ok()
                .flatten()
                .and_then(|m| m.parse::<usize>().ok())
                .unwrap_or(1);
            (Kind::Consume, h.max_consume_in_flight_per_identity, max)
        }
        Route::Produce => (Kind::Produce, h.max_produce_in_flight_per_identity, 1),
        Route::ProduceBatch => {
            let cap = h.max_produce_in_flight_per_identity;
            // The body is already read: the batch counts as its message count.
            let n = if cap == 0 { 1 } else { batch_len(&req.body) };
            (Kind::Produce, cap, n)
        }
        _ => return Ok(None),
    };
    auth::node_auth()
        .caps
        .acquire(kind, &caller.identity, units, cap)
        .map_err(|_| error(429, &auth::caps::refusal(kind, cap)))
}

/// Messages in a batch produce body, or 1 when it does not parse (the handler answers that).
fn batch_len(body: &[u8]) -> usize {
    #[derive(serde::Deserialize)]
    struct Batch {
        messages: Vec<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<Batch>(body).map_or(1, |b| b.messages.len().max(1))
}

/// The grant checks of API.md §16 that precede a handler; `None` lets it run. `t` is the first
/// path parameter (topic or parent), `second` the second (child). Exhaustive on purpose: a new
/// route must say here who may call it.
fn authorize(
    node: &Node,
    c: &Caller,
    r: Route,
    t: &str,
    second: Option<&str>,
    body: &[u8],
) -> Option<Response> {
    if c.open() {
        return None;
    }
    let deny = |msg: &str| Some(error(403, msg));
    const NOT_MANAGER: &str = "only the topic owner or an admin may modify this topic";
    let manages = |name: &str| node.topic(name).is_none_or(|topic| c.may_manage(&topic));
    let reads = |name: &str| match node.topic(name) {
        Some(topic) => c.may_read(&topic),
        None => c.user().is_some_and(|u| auth::rbac::may_any(u, name)),
    };
    match r {
        Route::TopicsCreate => {
            #[derive(serde::Deserialize)]
            struct Names {
                name: Option<serde_json::Value>,
                parent: Option<serde_json::Value>,
            }
            // An unparsable body is the handler's 400; only a named topic can be refused here.
            let names: Names = object_body(body)?;
            if let Some(serde_json::Value::String(name)) = &names.name {
                if !c.may(auth::rbac::ACTION_CREATE, name) {
                    return deny("create not allowed on this topic");
                }
            }
            if let Some(serde_json::Value::String(parent)) = &names.parent {
                if let Some(p) = node.topic(parent) {
                    if !c.may_manage(&p) {
                        return deny("only the topic owner or an admin may modify this topic");
                    }
                }
            }
            None
        }
        Route::TopicGet | Route::TopicSchema | Route::ChildrenList => {
            if reads(t) {
                None
            } else {
                deny("no grant on this topic")
            }
        }
        Route::ChildrenAttach => {
            #[derive(serde::Deserialize)]
            struct Attach {
                child: Option<serde_json::Value>,
                remote: Option<serde_json::Value>,
            }
            // Owner of parent and child; a remote child needs admin (API.md §16).
            let attach: Option<Attach> = object_body(body);
            let child = attach.as_ref().and_then(|b| match &b.child {
                Some(serde_json::Value::String(s)) => Some(s.as_str()),
                _ => None,
            });
            // `"remote":""` and `null` are a local attach, as in the original.
            let remote = attach.as_ref().is_some_and(|b| match &b.remote {
                None | Some(serde_json::Value::Null) => false,
                Some(serde_json::Value::String(s)) => !s.is_empty(),
                Some(_) => true,
            });
            if remote && !c.is_admin() {
                deny(children::REMOTES_NEED_SECURITY)
            } else if !manages(t) || child.is_some_and(|ch| !manages(ch)) {
                deny(NOT_MANAGER)
            } else {
                None
            }
        }
        Route::ChildDetach => {
            let owns_either = |name: &str| node.topic(name).is_some_and(|x| c.may_manage(&x));
            let either_missing =
                node.topic(t).is_none() || second.is_none_or(|ch| node.topic(ch).is_none());
            if c.is_admin() || either_missing || owns_either(t) || second.is_some_and(owns_either) {
                None
            } else {
                deny(NOT_MANAGER)
            }
        }
        Route::TopicPatch | Route::TopicDelete => match node.topic(t) {
            Some(topic) if !c.may_manage(&topic) => deny(NOT_MANAGER),
            _ => None,
        },
        Route::Produce | Route::ProduceBatch if !c.may(auth::rbac::ACTION_PRODUCE, t) => {
            deny(PRODUCE_DENIED)
        }
        Route::Consume | Route::Ack if !c.may(auth::rbac::ACTION_CONSUME, t) => {
            deny("consume not allowed on this topic")
        }
        Route::Produce | Route::ProduceBatch | Route::Consume | Route::Ack => None,
        // Any authenticated caller; user routes apply their own rules (API.md §11).
        Route::TopicsList | Route::Healthz | Route::Readyz | Route::Metrics | Route::OpenApi => {
            None
        }
        Route::UsersCreate
        | Route::UsersList
        | Route::UserGet
        | Route::UserDelete
        | Route::UserGrants
        | Route::UserPassword => None,
        Route::ClusterMembers | Route::ClusterMoves => {
            (!c.is_admin()).then(|| error(403, users::ADMIN_REQUIRED))
        }
        // Admin too, checked by the handlers so that a refused change is audited as denied.
        Route::ClusterDecommission
        | Route::ClusterDecommissionCancel
        | Route::ClusterMoveAbort
        | Route::ClusterForget => None,
        // Admin and security on (the handler says the latter, and audits either refusal).
        Route::RemotesCreate
        | Route::RemotesList
        | Route::RemoteGet
        | Route::RemotePatch
        | Route::RemoteDelete
        | Route::RemoteTest
        | Route::RemotesReencrypt
        | Route::ChildPause
        | Route::ChildResume
        | Route::ChildSkip => None,
    }
}

/// The fields `authorize` reads from a JSON object body, or `None` when the body is not an object
/// or does not parse (the handler answers that with its `400`; serde alone would also read an
/// array as the struct's fields in order).
fn object_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Option<T> {
    if body.trim_ascii_start().first() != Some(&b'{') {
        return None;
    }
    serde_json::from_slice(body).ok()
}

/// Decodes `%XX` escapes of one path segment, as Go's ServeMux does after splitting the escaped
/// path: a `%2F` stays inside its segment and decodes to a `/` in the name, which the handler
/// then refuses like any other unknown name (`404 topic not found`); so do bytes that are not
/// UTF-8 (replaced, no name holds them). The parser already refused invalid escapes (`400`).
fn percent_decode_segment(s: &str) -> std::borrow::Cow<'_, str> {
    match crate::wire::query::path_decode(s.as_bytes()) {
        Ok(std::borrow::Cow::Owned(b)) => String::from_utf8_lossy(&b).into_owned().into(),
        // No escape in it (or one the parser let through, kept as it is).
        _ => std::borrow::Cow::Borrowed(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_and_route_depth_without_allocation() {
        // Proves the cross-site guard accepts the two media types in any case, with parameters
        // and spaces, or any non-empty X-Narad-Client, and refuses others and empty values; and
        // that paths deeper than the deepest route are 404 while the deepest still matches.
        let h = |pairs: &[(&str, &[u8])]| {
            let mut h = crate::http::Headers::with_capacity(4, 64);
            for (n, v) in pairs {
                h.push(n, v);
            }
            h
        };
        assert!(guard_passes(&h(&[("content-type", b"application/json")])));
        assert!(guard_passes(&h(&[(
            "content-type",
            b" Application/JSON ; charset=utf-8"
        )])));
        assert!(guard_passes(&h(&[(
            "content-type",
            b"application/octet-stream"
        )])));
        assert!(guard_passes(&h(&[("x-narad-client", b"go-sdk")])));
        assert!(!guard_passes(&h(&[("content-type", b"text/plain")])));
        assert!(!guard_passes(&h(&[("content-type", b"application/jsonx")])));
        assert!(!guard_passes(&h(&[("content-type", b"\xff\xfe")])));
        assert!(!guard_passes(&h(&[("x-narad-client", b"")])));
        assert!(!guard_passes(&h(&[])));
        assert!(matches!(
            route("DELETE", "/v1/topics/a/children/b"),
            Match::Found(Route::ChildDetach, a) if a.first() == Some("a") && a.get(1) == Some("b")
        ));
        assert!(matches!(
            route("DELETE", "/v1/topics/a/children/b/c"),
            Match::NotFound
        ));
        assert!(matches!(
            route("GET", "/v1/topics/a/b/c/d/e/f/g"),
            Match::NotFound
        ));
    }

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
