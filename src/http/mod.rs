//! The HTTP/1.1 server that runs inside every shard (each shard accepts on the same port with
//! `SO_REUSEPORT` and serves its own connections to completion).
//!
//! Owns: request parsing ([`parse`]), connection handling ([`conn`]: keep-alive, pipelining,
//! `Expect: 100-continue`, timeouts, limits, graceful close), response encoding ([`response`]),
//! and the [`Service`] boundary. It never routes, authenticates, touches a file or another shard:
//! those belong to the service it is given. Nothing a client sends can panic a shard: the parser
//! is total, every buffer has a named bound in [`Limits`], and a panicking handler is caught and
//! answered `500 {"error":"internal server panic"}`.

pub mod conn;
pub mod parse;
pub mod response;

use std::borrow::Cow;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use conn::{serve, serve_connection, ConnStats, Drain};
pub use parse::{
    parse_head, parse_request, BodyFraming, ChunkedDecoder, ParseError, ParsedRequest,
};

/// Request method. `HEAD` is parsed as [`Method::Get`] with [`Request::head`] set: HEAD is served
/// wherever GET is, by the same handler, and the body is dropped on the way out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Put,
    Patch,
    Delete,
    Options,
    Other(String),
}

impl Method {
    pub fn parse(s: &str) -> Method {
        match s {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "PATCH" => Method::Patch,
            "DELETE" => Method::Delete,
            "OPTIONS" => Method::Options,
            other => Method::Other(other.to_owned()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
            Method::Delete => "DELETE",
            Method::Options => "OPTIONS",
            Method::Other(s) => s,
        }
    }
}

/// Request header fields in arrival order: names lowercased, values as raw bytes. Two
/// allocations per request, whatever the number of fields.
#[derive(Debug, Clone, Default)]
pub struct Headers {
    bytes: Vec<u8>,
    /// (name start, name end, value end) into `bytes`; a value starts where its name ends.
    fields: Vec<(u32, u32, u32)>,
}

impl Headers {
    pub fn with_capacity(fields: usize, bytes: usize) -> Headers {
        Headers {
            bytes: Vec::with_capacity(bytes),
            fields: Vec::with_capacity(fields),
        }
    }

    /// Appends a field; the name is lowercased (header names are ASCII tokens).
    pub fn push(&mut self, name: &str, value: &[u8]) {
        let start = self.bytes.len() as u32;
        self.bytes
            .extend(name.bytes().map(|b| b.to_ascii_lowercase()));
        let name_end = self.bytes.len() as u32;
        self.bytes.extend_from_slice(value);
        self.fields.push((start, name_end, self.bytes.len() as u32));
    }

    fn field(&self, f: &(u32, u32, u32)) -> (&str, &[u8]) {
        let (s, n, e) = (f.0 as usize, f.1 as usize, f.2 as usize);
        (
            std::str::from_utf8(&self.bytes[s..n]).unwrap_or(""),
            &self.bytes[n..e],
        )
    }

    /// The first value of `name` (compared case-insensitively).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }

    /// The first value of `name` if it is UTF-8, with surrounding whitespace trimmed.
    pub fn get_str(&self, name: &str) -> Option<&str> {
        self.get(name)
            .and_then(|v| std::str::from_utf8(v).ok())
            .map(str::trim)
    }

    /// Every value of `name`, in order.
    pub fn get_all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.iter()
            .filter(move |(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }

    /// All fields in arrival order: (lowercase name, raw value).
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8])> + '_ {
        self.fields.iter().map(|f| self.field(f))
    }

    pub fn len(&self) -> usize {
        self.fields.len()
    }

    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }
}

/// Everything known about a request before its body is read; given to
/// [`Service::body_limit`].
#[derive(Debug)]
pub struct RequestHead {
    pub method: Method,
    /// Raw path, percent-encoded as received (no query).
    pub path: String,
    /// Raw query after `?` (empty when absent), percent-encoded as received.
    pub query: String,
    pub headers: Headers,
    pub peer: SocketAddr,
    /// The request was a HEAD (then `method` is `Get`).
    pub head: bool,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub http_minor: u8,
    pub framing: BodyFraming,
    /// The connection stays open after this request (unless the server decides otherwise).
    pub keep_alive: bool,
    pub expect_continue: bool,
}

impl RequestHead {
    /// Declared body length (`Content-Length`), if the body is not chunked.
    pub fn content_length(&self) -> Option<u64> {
        match self.framing {
            BodyFraming::None => Some(0),
            BodyFraming::Length(n) => Some(n),
            BodyFraming::Chunked => None,
        }
    }
}

/// Whatever [`Service::reserve_body`] holds for a request (the API's is a share of the node's
/// batch-body budget); released on drop.
pub type Reservation = Box<dyn std::any::Any>;

/// A whole request, body read.
pub struct Request {
    pub method: Method,
    pub path: String,
    pub query: String,
    pub headers: Headers,
    pub body: Vec<u8>,
    pub peer: SocketAddr,
    pub head: bool,
    /// What [`Service::reserve_body`] reserved for this request, if anything.
    pub reservation: Option<Reservation>,
    client: Option<narad_io::rt::PeerProbe>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("method", &self.method)
            .field("path", &self.path)
            .field("query", &self.query)
            .field("body_len", &self.body.len())
            .field("peer", &self.peer)
            .field("head", &self.head)
            .finish()
    }
}

impl Request {
    /// Builds a request (for tests and for requests that did not come from a socket).
    pub fn new(head: RequestHead, body: Vec<u8>) -> Request {
        Request {
            method: head.method,
            path: head.path,
            query: head.query,
            headers: head.headers,
            body,
            peer: head.peer,
            head: head.head,
            reservation: None,
            client: None,
        }
    }

    /// True when the client has closed its connection while the request was being handled
    /// (metrics record such a request as status 499; a long-poll can stop waiting). Cheap: one
    /// non-blocking peek on the socket. Always false for requests not read from a socket.
    pub fn client_disconnected(&self) -> bool {
        self.client.as_ref().is_some_and(|c| c.peer_closed())
    }
}

/// A response. `Content-Length` is always computed from `body` (never taken from `headers`);
/// 1xx, 204 and 304 responses are sent without a body and without `Content-Length`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(Cow<'static, str>, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// `Content-Type: application/json` with `body` as given.
    pub fn json(status: u16, body: impl Into<Vec<u8>>) -> Response {
        Response {
            status,
            headers: vec![(Cow::Borrowed("Content-Type"), "application/json".to_owned())],
            body: body.into(),
        }
    }

    /// `Content-Type: text/plain; charset=utf-8`.
    pub fn text(status: u16, body: &str) -> Response {
        Response {
            status,
            headers: vec![(
                Cow::Borrowed("Content-Type"),
                "text/plain; charset=utf-8".to_owned(),
            )],
            body: body.as_bytes().to_vec(),
        }
    }

    /// No body, no content type.
    pub fn empty(status: u16) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// Adds a header field (builder style).
    pub fn with_header(
        mut self,
        name: impl Into<Cow<'static, str>>,
        value: impl Into<String>,
    ) -> Response {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// What a handler panic is answered with (API.md §1.3).
    pub fn internal_panic() -> Response {
        Response::json(500, &b"{\"error\":\"internal server panic\"}\n"[..])
    }

    /// The answer to a request the parser refused; the connection closes after it.
    pub fn for_parse_error(e: ParseError) -> Response {
        match e {
            ParseError::HeaderTooLarge => {
                Response::text(431, "431 Request Header Fields Too Large")
            }
            ParseError::BadRequest(_) => Response::text(400, "400 Bad Request"),
            ParseError::BodyTooLarge => {
                Response::json(413, &b"{\"error\":\"request body too large\"}\n"[..])
            }
            ParseError::UnsupportedTransferEncoding => Response::text(501, "501 Not Implemented"),
            ParseError::ExpectationFailed => Response::text(417, "417 Expectation Failed"),
        }
    }
}

/// What the server calls for each request. One instance per shard (`Rc`), so it may hold
/// shard-local state without locks.
pub trait Service: 'static {
    /// Decides, from the head alone and before any body byte is read, how many body bytes this
    /// request may have, or answers at once (authentication failure, cross-site guard, unknown
    /// route): an early answer is sent without reading the body. The server also applies its own
    /// hard cap ([`Limits::body_bytes_max`]).
    fn body_limit(&self, head: &RequestHead) -> Result<usize, Response>;

    /// Called once the declared size fits `limit`, before [`Service::reserve_body`]: checks
    /// that must pass before a body may take a shared budget (a credential not yet verified),
    /// as a future the server awaits, or `None` when there is nothing to wait for (every small
    /// body: no allocation). `Some(answer)` from the future is sent at once, the body unread
    /// (and [`Service::on_refused_after_head`] called).
    #[allow(clippy::type_complexity)]
    fn admit_body(
        &self,
        _head: &RequestHead,
        _limit: usize,
    ) -> Option<std::pin::Pin<Box<dyn Future<Output = Option<Response>>>>> {
        None
    }

    /// Called once the declared size fits `limit` and before any body byte is read (and before
    /// `100 Continue`): may reserve a shared budget for the body about to be read (bytes in
    /// flight, API.md §4) or refuse with an early answer (`503` + `Retry-After`). The reservation
    /// is moved into [`Request::reservation`] and released when the request is dropped, or
    /// earlier if the handler takes it. The default reserves nothing.
    fn reserve_body(
        &self,
        _head: &RequestHead,
        _limit: usize,
    ) -> Result<Option<Reservation>, Response> {
        Ok(None)
    }

    /// Called while a chunked body is read, with its length so far (after each decoded piece,
    /// so at most one read buffer past any threshold): may reserve for it now that its size
    /// shows (into `reservation`, the one [`Service::reserve_body`] made, if any), or refuse it
    /// (the answer is sent and the connection closes). The default reserves nothing.
    fn reserve_grown(
        &self,
        _head: &RequestHead,
        _limit: usize,
        _len: usize,
        _reservation: &mut Option<Reservation>,
    ) -> Result<(), Response> {
        Ok(())
    }

    /// The answer when the body exceeds the limit returned by [`Service::body_limit`] (the
    /// connection closes after it). The default is API.md's `413 {"error":"request body too
    /// large"}`; a service may first run checks that come before the body (authentication).
    fn body_too_large(&self, _head: &RequestHead) -> impl Future<Output = Response> {
        std::future::ready(Response::for_parse_error(ParseError::BodyTooLarge))
    }

    /// Called for every answer the server gives without [`Service::call`] producing it: a
    /// refused request (400, 413, 417, 431, 501) or a handler panic (500). For metrics, so that
    /// every answer is counted; the default does nothing.
    fn on_refused(&self, _status: u16) {}

    /// Like [`Service::on_refused`], for a refusal made after the request head parsed (a body
    /// over the limit or a malformed chunked body): the head names the route and method the
    /// answer belongs to. The default forwards to [`Service::on_refused`].
    fn on_refused_after_head(&self, _head: &RequestHead, status: u16) {
        self.on_refused(status);
    }

    /// Handles a request. A panic inside is caught by the server and answered with
    /// [`Response::internal_panic`].
    fn call(&self, req: Request) -> impl Future<Output = Response>;
}

/// Named bounds of the HTTP server (OPERATIONS.md `http.*`).
#[derive(Debug, Clone)]
pub struct Limits {
    /// Request line plus header fields (`http.max_header_bytes`); over it: 431.
    pub header_bytes_max: usize,
    /// Hard cap on any request body, whatever the service allows.
    pub body_bytes_max: usize,
    /// From the first byte of a request until its body is read (`http.read_timeout`): a slower
    /// client is disconnected.
    pub read_timeout: Duration,
    /// Keep-alive connection waiting for its next request (`http.idle_timeout`).
    pub idle_timeout: Duration,
    /// Any single write waiting for the client to read (`http.write_timeout`).
    pub write_timeout: Duration,
    /// Open connections, counted over every shard that shares this budget; further ones wait
    /// in the accept backlog.
    pub connections: Arc<ConnectionBudget>,
    /// Responses held back to coalesce writes for pipelined requests before a flush.
    pub pipelined_responses_max: usize,
    /// A body this small is read and dropped after an early answer so the connection can stay
    /// open; a larger one closes the connection instead.
    pub drain_body_bytes_max: usize,
}

/// `http.max_header_bytes` default.
pub const HEADER_BYTES_MAX_DEFAULT: usize = 65536;
/// Largest body any route accepts (batch produce, API.md §4).
pub const BODY_BYTES_MAX_DEFAULT: usize = 16 << 20;

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            header_bytes_max: HEADER_BYTES_MAX_DEFAULT,
            body_bytes_max: BODY_BYTES_MAX_DEFAULT,
            read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(30),
            connections: ConnectionBudget::new(4096),
            pipelined_responses_max: 64,
            drain_body_bytes_max: 64 << 10,
        }
    }
}

/// The cap on open connections of one listening address (`http.max_connections`), shared by
/// every shard that accepts on it. The cap is node-wide: a per-shard share left a client waiting
/// in one shard's accept backlog while another shard had room (the kernel spreads connections
/// over SO_REUSEPORT listeners unevenly). One compare-and-swap per accepted connection, never a
/// lock.
#[derive(Debug)]
pub struct ConnectionBudget {
    open: AtomicUsize,
    /// 0 = unlimited.
    max: usize,
}

impl ConnectionBudget {
    /// A budget of `max` open connections; 0 = unlimited.
    pub fn new(max: usize) -> Arc<ConnectionBudget> {
        Arc::new(ConnectionBudget {
            open: AtomicUsize::new(0),
            max,
        })
    }

    /// Connections holding a slot now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Whether a connection accepted now would get a slot (it may still lose a race).
    pub fn has_room(&self) -> bool {
        self.max == 0 || self.open() < self.max
    }

    /// Takes a slot if one is free; it comes back when the returned value drops.
    pub fn try_claim(self: &Arc<Self>) -> Option<ConnectionSlot> {
        let max = self.max;
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (max == 0 || n < max).then_some(n + 1)
            })
            .ok()?;
        Some(ConnectionSlot(self.clone()))
    }
}

/// One open connection's place in a [`ConnectionBudget`].
pub struct ConnectionSlot(Arc<ConnectionBudget>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}
