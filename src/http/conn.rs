//! Connections: the accept loop of one shard ([`serve`]) and the request loop of one connection
//! ([`serve_connection`]).
//!
//! Per connection the server keeps one read buffer (bounded by the header limit plus one read)
//! and one output buffer, both reused across requests. Requests are handled one after another
//! in arrival order; responses of pipelined requests are coalesced and written together, and the
//! output is always flushed before the server waits for anything (the client, or a handler that
//! did not finish at once), so coalescing never delays an answer behind a slow request.
//!
//! Time bounds: a request must arrive completely (head and body) within `read_timeout` of its
//! first byte; a keep-alive connection may idle for `idle_timeout`; each write may wait
//! `write_timeout`. A connection that breaks a rule gets its answer (400/413/417/431/501) and is
//! closed gracefully (write side shut, input drained for a bounded time) so the client reads the
//! answer instead of a reset.

use std::cell::Cell;
use std::io;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_lite::future::{self, FutureExt};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use narad_io::rt::{self, Notify, ShutdownSignal, TcpListener, TcpStream};

use super::parse::{blank_prefix, parse_head, BodyFraming, ChunkedDecoder, HeadWatch, ParseError};
use super::response::{encode, ConnectionHeader};
use super::{ConnectionBudget, ConnectionSlot, Limits, Request, RequestHead, Response, Service};

/// Initial read buffer per connection.
const READ_BUF_INITIAL_BYTES: usize = 8 << 10;
/// Room kept above the header limit in the read buffer, so that a head of exactly the limit is
/// seen whole and one more read can show it is over.
const READ_BUF_SLACK_BYTES: usize = 8 << 10;
/// Output is written once this much is waiting, even if more pipelined requests are buffered.
const OUT_FLUSH_BYTES: usize = 64 << 10;
/// An output buffer that grew beyond this (a large response) is released after the flush.
const OUT_KEEP_BYTES: usize = 256 << 10;
/// After the last answer of a closing connection: input read and dropped at most ...
const LINGER_BYTES_MAX: usize = 256 << 10;
/// ... for at most this long, so the client sees the answer rather than a reset.
const LINGER_TIMEOUT: Duration = Duration::from_secs(2);
/// The first buffer of a body declared by Content-Length; it doubles as the body arrives.
const BODY_READ_STEP_BYTES: usize = 64 << 10;
/// Pause after an accept failure for lack of descriptors or memory (no busy loop).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// How often a shard at the connection cap looks again for a slot another shard freed (one it
/// freed itself is seen at once).
const ROOM_POLL: Duration = Duration::from_millis(5);

/// Shard-local "stop taking requests" flag: set when shutdown begins; idle connections close,
/// busy ones finish their request and answer with `Connection: close`.
#[derive(Default)]
pub struct Drain {
    draining: Cell<bool>,
    notify: Notify,
}

impl Drain {
    pub fn new() -> Drain {
        Drain::default()
    }

    pub fn start(&self) {
        self.draining.set(true);
        self.notify.notify_waiters();
    }

    pub fn is_draining(&self) -> bool {
        self.draining.get()
    }
}

/// Why a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// The client closed between requests.
    ClientClosed,
    /// The client closed or failed in the middle of a request.
    Truncated,
    IdleTimeout,
    /// The request (head and body) did not arrive within `read_timeout`.
    ReadTimeout,
    /// Writing failed or timed out.
    WriteFailed,
    /// The request or the response asked for it (`Connection: close`, HTTP/1.0).
    NoKeepAlive,
    /// Refused with this status (400, 413, 417, 431, 501) or an early answer with an unread body.
    Refused(u16),
    /// Shutdown began.
    Draining,
}

/// What happened on one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnStats {
    pub requests: u64,
    pub close: CloseReason,
}

struct ReadBuf {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl ReadBuf {
    fn new() -> ReadBuf {
        ReadBuf {
            buf: vec![0; READ_BUF_INITIAL_BYTES],
            start: 0,
            end: 0,
        }
    }

    fn data(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    fn is_empty(&self) -> bool {
        self.start == self.end
    }

    fn consume(&mut self, n: usize) {
        debug_assert!(n <= self.end - self.start);
        self.start += n.min(self.end - self.start);
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Makes room at the end: moves unread bytes to the front, then grows up to `cap_max`.
    fn prepare(&mut self, cap_max: usize) {
        if self.end < self.buf.len() {
            return;
        }
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            if self.end < self.buf.len() {
                return;
            }
        }
        if self.buf.len() < cap_max {
            let new_len = (self.buf.len() * 2).min(cap_max);
            self.buf.resize(new_len, 0);
        }
    }

    /// One read from the stream into the free space; 0 means end of stream (or no room, which
    /// `prepare` with a cap above the header limit rules out).
    async fn fill(&mut self, stream: &mut TcpStream, cap_max: usize) -> io::Result<usize> {
        self.prepare(cap_max);
        if self.end == self.buf.len() {
            return Ok(0);
        }
        let n = stream.read(&mut self.buf[self.end..]).await?;
        self.end += n;
        Ok(n)
    }
}

enum BodyError {
    /// Over the limit: answer with the service's 413.
    TooLarge,
    /// Malformed chunking: 400.
    Bad(ParseError),
    /// The client went away, failed or was too slow: close without an answer.
    Gone(CloseReason),
    /// The service refused the body as it grew (a chunked body past its free share).
    Refused(Response),
}

struct Conn<'a> {
    stream: TcpStream,
    rb: ReadBuf,
    out: Vec<u8>,
    limits: &'a Limits,
    requests: u64,
}

fn is_timeout(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::TimedOut
}

impl Conn<'_> {
    fn rb_cap(&self) -> usize {
        self.limits.header_bytes_max + READ_BUF_SLACK_BYTES
    }

    async fn flush(&mut self) -> io::Result<()> {
        if self.out.is_empty() {
            return Ok(());
        }
        let r = self.stream.write_all(&self.out).await;
        self.out.clear();
        if self.out.capacity() > OUT_KEEP_BYTES {
            self.out = Vec::with_capacity(READ_BUF_INITIAL_BYTES);
        }
        r
    }

    /// Sets the socket read timeout to what is left until `deadline`.
    fn arm(&self, deadline: Instant) -> io::Result<()> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "request deadline passed",
            ));
        }
        self.stream.set_read_timeout(Some(left))
    }

    async fn read_more(&mut self, deadline: Instant) -> Result<(), CloseReason> {
        let cap = self.rb_cap();
        let r = match self.arm(deadline) {
            Ok(()) => self.rb.fill(&mut self.stream, cap).await,
            Err(e) => Err(e),
        };
        match r {
            Ok(0) => Err(CloseReason::Truncated),
            Ok(_) => Ok(()),
            Err(e) if is_timeout(&e) => Err(CloseReason::ReadTimeout),
            Err(_) => Err(CloseReason::Truncated),
        }
    }

    async fn read_body_length(
        &mut self,
        n: usize,
        deadline: Instant,
    ) -> Result<Vec<u8>, BodyError> {
        // The buffer grows with what arrives (doubling, from BODY_READ_STEP_BYTES): a client
        // declaring a large body and sending little costs little memory. Not even its capacity
        // is taken ahead: the allocator may back a large fresh block with resident huge pages.
        let mut body = Vec::with_capacity(n.min(BODY_READ_STEP_BYTES));
        let take = n.min(self.rb.data().len());
        body.extend_from_slice(&self.rb.data()[..take]);
        self.rb.consume(take);
        if body.len() < n {
            // Large bodies are read straight into their final buffer.
            let mut filled = body.len();
            while filled < n {
                if body.len() == filled {
                    body.resize(n.min(filled.max(BODY_READ_STEP_BYTES / 2) * 2), 0);
                }
                self.arm(deadline)
                    .map_err(|_| BodyError::Gone(CloseReason::ReadTimeout))?;
                match self.stream.read(&mut body[filled..]).await {
                    Ok(0) => return Err(BodyError::Gone(CloseReason::Truncated)),
                    Ok(k) => filled += k,
                    Err(e) if is_timeout(&e) => {
                        return Err(BodyError::Gone(CloseReason::ReadTimeout))
                    }
                    Err(_) => return Err(BodyError::Gone(CloseReason::Truncated)),
                }
            }
        }
        Ok(body)
    }

    /// Reads a chunked body of at most `limit` bytes. `grown` is told the body's length after
    /// each decoded piece (a size known only as it arrives), and may refuse it.
    async fn read_body_chunked(
        &mut self,
        limit: usize,
        deadline: Instant,
        grown: &mut dyn FnMut(usize) -> Result<(), Response>,
    ) -> Result<Vec<u8>, BodyError> {
        let mut dec = ChunkedDecoder::new(self.limits.header_bytes_max);
        let mut body = Vec::new();
        loop {
            if !self.rb.is_empty() {
                let used = match dec.decode(self.rb.data(), &mut body, limit) {
                    Ok(u) => u,
                    Err(ParseError::BodyTooLarge) => return Err(BodyError::TooLarge),
                    Err(e) => return Err(BodyError::Bad(e)),
                };
                self.rb.consume(used);
                grown(body.len()).map_err(BodyError::Refused)?;
                if dec.is_done() {
                    return Ok(body);
                }
            }
            self.read_more(deadline).await.map_err(BodyError::Gone)?;
        }
    }

    /// Reads and drops `n` body bytes so the connection can serve the next request.
    async fn discard_body(&mut self, n: usize, deadline: Instant) -> Result<(), CloseReason> {
        let mut left = n;
        loop {
            let take = left.min(self.rb.data().len());
            self.rb.consume(take);
            left -= take;
            if left == 0 {
                return Ok(());
            }
            self.read_more(deadline).await?;
        }
    }

    /// Answers `resp` (headers only to a HEAD request) with `Connection: close`, then closes.
    async fn refuse(&mut self, resp: &Response, head_only: bool) {
        encode(&mut self.out, resp, head_only, ConnectionHeader::Close);
        self.close().await;
    }

    /// Flushes what is queued, shuts the write side and drains input for a bounded time. With
    /// nothing to send (an idle connection closed for shutdown) the socket is simply closed.
    async fn close(&mut self) {
        if self.out.is_empty() {
            return;
        }
        if self.flush().await.is_err() {
            return;
        }
        let _ = self.stream.shutdown_write().await;
        let deadline = Instant::now() + LINGER_TIMEOUT;
        let mut drained = 0;
        let mut scratch = [0u8; 4096];
        while drained < LINGER_BYTES_MAX && self.arm(deadline).is_ok() {
            match self.stream.read(&mut scratch).await {
                Ok(0) | Err(_) => break,
                Ok(k) => drained += k,
            }
        }
    }
}

/// Runs `service` on one accepted connection until it closes. Never panics on client input;
/// a panicking handler is answered with [`Response::internal_panic`].
pub async fn serve_connection<S: Service>(
    stream: TcpStream,
    peer: SocketAddr,
    service: &S,
    limits: &Limits,
    drain: &Drain,
) -> ConnStats {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(limits.write_timeout));
    let mut c = Conn {
        stream,
        rb: ReadBuf::new(),
        out: Vec::with_capacity(4096),
        limits,
        requests: 0,
    };
    let close = run(&mut c, peer, service, drain).await;
    ConnStats {
        requests: c.requests,
        close,
    }
}

async fn run<S: Service>(
    c: &mut Conn<'_>,
    peer: SocketAddr,
    service: &S,
    drain: &Drain,
) -> CloseReason {
    let limits = c.limits;
    let probe = c.stream.peer_probe();
    let mut responses_waiting = 0usize;
    loop {
        // ---- head --------------------------------------------------------------------------
        // Empty lines left after the last request (a stray CRLF in its packet) do not start the
        // next one either: the connection is idle until a request byte arrives.
        if c.requests > 0 {
            let blank = blank_prefix(c.rb.data());
            c.rb.consume(blank);
        }
        let mut started = (!c.rb.is_empty()).then(Instant::now);
        let mut watch = HeadWatch::default();
        let head: RequestHead = loop {
            if !c.rb.is_empty() && watch.worth_parsing(c.rb.data(), limits.header_bytes_max) {
                match parse_head(c.rb.data(), limits.header_bytes_max, peer) {
                    Ok(Some((h, n))) => {
                        c.rb.consume(n);
                        break h;
                    }
                    Ok(None) => watch.incomplete(c.rb.data().len()),
                    Err(e) => {
                        let resp = Response::for_parse_error(e);
                        service.on_refused(resp.status);
                        c.refuse(&resp, false).await;
                        return CloseReason::Refused(resp.status);
                    }
                }
            }
            // About to wait for the client: send what is ready first.
            if c.flush().await.is_err() {
                return CloseReason::WriteFailed;
            }
            responses_waiting = 0;
            match started {
                Some(t0) => {
                    if let Err(r) = c.read_more(t0 + limits.read_timeout).await {
                        return r;
                    }
                }
                None => {
                    let notified = drain.notify.notified();
                    if drain.is_draining() {
                        c.close().await;
                        return CloseReason::Draining;
                    }
                    // A new connection gets the read timeout for its first byte, as Go's server
                    // does: only a connection that has been served waits under the idle timeout
                    // (a silent one no longer holds a connection slot for 60 s).
                    let wait = if c.requests == 0 {
                        limits.read_timeout
                    } else {
                        limits.idle_timeout
                    };
                    if c.stream.set_read_timeout(Some(wait)).is_err() {
                        return CloseReason::Truncated;
                    }
                    let cap = c.rb_cap();
                    let (rb, stream) = (&mut c.rb, &mut c.stream);
                    let r = future::or(async { Some(rb.fill(stream, cap).await) }, async {
                        notified.await;
                        None
                    })
                    .await;
                    match r {
                        None => {
                            c.close().await;
                            return CloseReason::Draining;
                        }
                        Some(Ok(0)) => return CloseReason::ClientClosed,
                        Some(Ok(_)) => {
                            // Empty lines between requests are not the start of one (RFC 9112
                            // §2.2): they leave the connection idle, under the idle timeout.
                            let blank = blank_prefix(c.rb.data());
                            c.rb.consume(blank);
                            if !c.rb.is_empty() {
                                started = Some(Instant::now());
                            }
                        }
                        Some(Err(e)) if is_timeout(&e) => return CloseReason::IdleTimeout,
                        Some(Err(_)) => return CloseReason::ClientClosed,
                    }
                }
            }
        };
        let deadline = started.unwrap_or_else(Instant::now) + limits.read_timeout;

        // ---- body limit and reservation, decided before any body byte is read ----------------
        let decision = service
            .body_limit(&head)
            .map(|l| l.min(limits.body_bytes_max));
        let decision = match decision {
            Ok(limit) => match head.framing {
                BodyFraming::Length(n) if n > limit as u64 => {
                    let resp = service.body_too_large(&head).await;
                    return refuse_after_head(c, service, &head, resp).await;
                }
                _ => match service.admit_body(&head, limit) {
                    None => service.reserve_body(&head, limit).map(|r| (limit, r)),
                    Some(check) => match check.await {
                        Some(resp) => {
                            service.on_refused_after_head(&head, resp.status);
                            Err(resp)
                        }
                        None => service.reserve_body(&head, limit).map(|r| (limit, r)),
                    },
                },
            },
            Err(resp) => Err(resp),
        };
        let (limit, mut reservation) = match decision {
            Ok(d) => d,
            Err(resp) => {
                // Answered early: a small declared body is read and dropped to keep the
                // connection; otherwise (large, chunked, or a client waiting for 100) close.
                let drainable = match head.framing {
                    BodyFraming::None => Some(0),
                    BodyFraming::Length(n) if !head.expect_continue => usize::try_from(n)
                        .ok()
                        .filter(|&n| n <= limits.drain_body_bytes_max),
                    _ => None,
                };
                let keep = head.keep_alive && !drain.is_draining() && drainable.is_some();
                if let (true, Some(n)) = (keep, drainable) {
                    if let Err(r) = c.discard_body(n, deadline).await {
                        return r;
                    }
                    encode(&mut c.out, &resp, head.head, conn_header(&head, true));
                    c.requests += 1;
                    continue;
                }
                c.requests += 1;
                c.refuse(&resp, head.head).await;
                return if drain.is_draining() {
                    CloseReason::Draining
                } else if !head.keep_alive {
                    CloseReason::NoKeepAlive
                } else {
                    CloseReason::Refused(resp.status)
                };
            }
        };

        // ---- 100-continue and body ------------------------------------------------------------
        if head.expect_continue && c.rb.is_empty() {
            c.out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
            if c.flush().await.is_err() {
                return CloseReason::WriteFailed;
            }
            responses_waiting = 0;
        }
        let body = match head.framing {
            BodyFraming::None => Ok(Vec::new()),
            BodyFraming::Length(n) => c.read_body_length(n as usize, deadline).await,
            BodyFraming::Chunked => {
                // Its size shows only as it arrives: the service may reserve for it then.
                let mut grown =
                    |len: usize| service.reserve_grown(&head, limit, len, &mut reservation);
                c.read_body_chunked(limit, deadline, &mut grown).await
            }
        };
        let body = match body {
            Ok(b) => b,
            Err(BodyError::TooLarge) => {
                let resp = service.body_too_large(&head).await;
                return refuse_after_head(c, service, &head, resp).await;
            }
            Err(BodyError::Bad(e)) => {
                let resp = Response::for_parse_error(e);
                return refuse_after_head(c, service, &head, resp).await;
            }
            Err(BodyError::Refused(resp)) => {
                return refuse_after_head(c, service, &head, resp).await;
            }
            Err(BodyError::Gone(r)) => return r,
        };

        // ---- handler ------------------------------------------------------------------------
        let head_only = head.head;
        let mut keep_alive = head.keep_alive;
        let http_minor = head.http_minor;
        let mut req = Request::new(head, body);
        req.client = Some(probe.clone());
        req.reservation = reservation;
        let fut = AssertUnwindSafe(service.call(req)).catch_unwind();
        let mut fut = std::pin::pin!(fut);
        let mut write_failed = false;
        let result = match future::poll_once(fut.as_mut()).await {
            Some(r) => r,
            None => {
                // The handler waits (commit, long-poll): earlier answers go out meanwhile. The
                // handler still runs to completion if the client is gone.
                write_failed = c.flush().await.is_err();
                responses_waiting = 0;
                fut.await
            }
        };
        let resp = result.unwrap_or_else(|_| {
            service.on_refused(500);
            Response::internal_panic()
        });
        c.requests += 1;
        if write_failed {
            return CloseReason::WriteFailed;
        }
        let resp_close = resp
            .header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        keep_alive = keep_alive && !resp_close && !drain.is_draining();
        let hdr = match (keep_alive, http_minor) {
            (false, _) => ConnectionHeader::Close,
            (true, 0) => ConnectionHeader::KeepAlive,
            (true, _) => ConnectionHeader::Default,
        };
        encode(&mut c.out, &resp, head_only, hdr);
        responses_waiting += 1;
        if !keep_alive {
            c.close().await;
            return if drain.is_draining() {
                CloseReason::Draining
            } else {
                CloseReason::NoKeepAlive
            };
        }
        if (c.out.len() >= OUT_FLUSH_BYTES || responses_waiting >= limits.pipelined_responses_max)
            && c.flush().await.is_err()
        {
            return CloseReason::WriteFailed;
        }
        if c.out.is_empty() {
            responses_waiting = 0;
        }
    }
}

fn conn_header(head: &RequestHead, keep_alive: bool) -> ConnectionHeader {
    match (keep_alive, head.http_minor) {
        (false, _) => ConnectionHeader::Close,
        (true, 0) => ConnectionHeader::KeepAlive,
        (true, _) => ConnectionHeader::Default,
    }
}

/// A request refused after its head was read (body over the cap, broken chunk framing): counted,
/// answered and the connection closed, since the rest of its body is not read.
async fn refuse_after_head<S: Service>(
    c: &mut Conn<'_>,
    service: &S,
    head: &RequestHead,
    resp: Response,
) -> CloseReason {
    service.on_refused_after_head(head, resp.status);
    c.requests += 1;
    c.refuse(&resp, head.head).await;
    CloseReason::Refused(resp.status)
}

/// Accepts connections on this shard's `listener` and serves each with `service` until
/// `shutdown` triggers; then stops accepting, lets busy connections finish their current
/// request (closing idle ones at once) and returns when every connection has ended. Wrap it in
/// [`rt::timeout`] for a bounded grace period.
pub async fn serve<S: Service>(
    listener: TcpListener,
    service: Rc<S>,
    limits: Limits,
    shutdown: ShutdownSignal,
) {
    let drain = Rc::new(Drain::new());
    let watcher = {
        let drain = drain.clone();
        rt::spawn(async move {
            shutdown.wait().await;
            drain.start();
        })
    };
    let conns = Rc::new(ShardConns::default());
    let limits = Rc::new(limits);
    loop {
        // At the node's cap, further connections wait in the kernel's accept backlog.
        if !wait_for_room(&limits.connections, &conns, &drain).await {
            break;
        }
        let notified = drain.notify.notified();
        if drain.is_draining() {
            break;
        }
        let accepted = future::or(async { Some(listener.accept().await) }, async {
            notified.await;
            None
        })
        .await;
        match accepted {
            None => break,
            Some(Ok((stream, peer))) => {
                let Some(slot) = claim_slot(&limits.connections, &conns, &drain).await else {
                    break;
                };
                let conn = conns.enter();
                let service = service.clone();
                let limits = limits.clone();
                let drain = drain.clone();
                rt::spawn(async move {
                    let stats = serve_connection(stream, peer, &*service, &limits, &drain).await;
                    tracing::trace!(%peer, requests = stats.requests, close = ?stats.close, "connection closed");
                    // The node-wide slot first: a waiter woken by the local end finds it free.
                    drop(slot);
                    drop(conn);
                })
                .detach();
            }
            Some(Err(e)) => {
                if rt::accept_out_of_resources(&e) {
                    tracing::warn!(error = %e, "accept failed, backing off");
                    rt::sleep(ACCEPT_BACKOFF).await;
                } else {
                    // Mostly a client that gave up before we accepted it; the short pause keeps a
                    // persistent error from turning into a busy loop.
                    tracing::debug!(error = %e, "accept failed");
                    rt::sleep(Duration::from_millis(1)).await;
                }
            }
        }
    }
    drop(listener);
    drop(watcher);
    conns.all_ended().await;
}

/// This shard's open connections: the drain waits for every one to end, and a shard at the
/// connection cap hears at once when one of its own ends.
#[derive(Default)]
struct ShardConns {
    open: Cell<usize>,
    ended: Notify,
}

/// One open connection in [`ShardConns`]; dropping it counts the connection out.
struct ShardConn(Rc<ShardConns>);

impl ShardConns {
    fn enter(self: &Rc<Self>) -> ShardConn {
        self.open.set(self.open.get() + 1);
        ShardConn(self.clone())
    }

    async fn all_ended(&self) {
        loop {
            let ended = self.ended.notified();
            if self.open.get() == 0 {
                return;
            }
            ended.await;
        }
    }
}

impl Drop for ShardConn {
    fn drop(&mut self) {
        self.0.open.set(self.0.open.get() - 1);
        self.0.ended.notify_waiters();
    }
}

/// A slot for a connection already accepted. Another shard may have taken the last one since
/// [`wait_for_room`] looked: the connection then waits for one, unserved, as it would have in
/// the backlog. `None` when the drain starts first.
async fn claim_slot(
    budget: &Arc<ConnectionBudget>,
    conns: &ShardConns,
    drain: &Drain,
) -> Option<ConnectionSlot> {
    loop {
        if let Some(slot) = budget.try_claim() {
            return Some(slot);
        }
        if !wait_for_room(budget, conns, drain).await {
            return None;
        }
    }
}

/// Waits until `budget` has room for one more connection; false when the drain starts first.
/// A slot freed on this shard is seen at once (`conns.ended`), one freed on another shard at
/// the next look, every [`ROOM_POLL`]; below the cap it returns at once, so an idle node sets
/// no timer.
async fn wait_for_room(budget: &ConnectionBudget, conns: &ShardConns, drain: &Drain) -> bool {
    loop {
        let drained = drain.notify.notified();
        if drain.is_draining() {
            return false;
        }
        let ended = conns.ended.notified();
        if budget.has_room() {
            return true;
        }
        // Woken by a local end, the next look or the drain; the loop looks again.
        let look = async {
            let _ = rt::timeout(ROOM_POLL, ended).await;
        };
        future::or(look, drained).await;
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpStream as StdStream;

    use narad_io::rt::Semaphore;

    use super::*;

    /// Test service: echoes method, path, query and body; `/deny` answers 401 before the body,
    /// `/panic` panics, `/slow` waits 30 ms, `/close` asks to close; bodies up to 1024 bytes.
    struct Echo {
        /// Statuses reported through `on_refused`, in order.
        refused: std::cell::RefCell<Vec<u16>>,
        /// Set by `/wait` when it saw the client go away.
        saw_disconnect: Cell<bool>,
        /// Body bytes in flight for paths under `/budget` (1000).
        budget: Semaphore,
    }

    impl Default for Echo {
        fn default() -> Echo {
            Echo {
                refused: Default::default(),
                saw_disconnect: Cell::new(false),
                budget: Semaphore::new(1000),
            }
        }
    }

    impl Service for Echo {
        fn reserve_body(
            &self,
            head: &RequestHead,
            _limit: usize,
        ) -> Result<Option<crate::http::Reservation>, Response> {
            if !head.path.starts_with("/budget") {
                return Ok(None);
            }
            let n = head.content_length().unwrap_or(0) as usize;
            match self.budget.try_acquire_n(n) {
                Some(p) => Ok(Some(Box::new(p))),
                None => Err(Response::json(503, &b"{\"error\":\"busy\"}\n"[..])
                    .with_header("Retry-After", "1")),
            }
        }

        fn on_refused(&self, status: u16) {
            self.refused.borrow_mut().push(status);
        }

        fn body_limit(&self, head: &RequestHead) -> Result<usize, Response> {
            if head.path == "/deny" {
                return Err(Response::json(
                    401,
                    &b"{\"error\":\"authentication required\"}\n"[..],
                ));
            }
            Ok(1024)
        }

        async fn call(&self, req: Request) -> Response {
            match req.path.as_str() {
                "/panic" => panic!("handler bug"),
                "/slow" => {
                    rt::sleep(Duration::from_millis(30)).await;
                }
                "/close" => return Response::text(200, "bye").with_header("Connection", "close"),
                "/nocontent" => return Response::empty(204),
                "/budget/slow" => {
                    rt::sleep(Duration::from_millis(150)).await;
                }
                "/wait" => {
                    for _ in 0..400 {
                        if req.client_disconnected() {
                            self.saw_disconnect.set(true);
                            break;
                        }
                        rt::sleep(Duration::from_millis(5)).await;
                    }
                }
                _ => {}
            }
            let mut body =
                format!("{} {} {} ", req.method.as_str(), req.path, req.query).into_bytes();
            body.extend_from_slice(&req.body);
            Response::text(200, std::str::from_utf8(&body).unwrap_or("?"))
        }
    }

    fn test_limits() -> Limits {
        Limits {
            header_bytes_max: 4096,
            read_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
            ..Limits::default()
        }
    }

    /// Runs the server on 127.0.0.1:0 inside an executor on this thread, runs `client` on a std
    /// thread, then shuts the server down and checks that `serve` returns. Returns the statuses
    /// the service saw through `on_refused`.
    fn with_server(limits: Limits, client: impl FnOnce(SocketAddr) + Send + 'static) -> Vec<u16> {
        with_server_echo(limits, client).refused.borrow().clone()
    }

    fn with_server_echo(
        limits: Limits,
        client: impl FnOnce(SocketAddr) + Send + 'static,
    ) -> Rc<Echo> {
        rt::block_on(async move {
            let l = TcpListener::bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
            let addr = l.local_addr().expect("addr");
            let sig = ShutdownSignal::new();
            let echo = Rc::new(Echo::default());
            let server = rt::spawn(serve(l, echo.clone(), limits, sig.clone()));
            let t = std::thread::spawn(move || client(addr));
            let t0 = Instant::now();
            while !t.is_finished() {
                assert!(
                    t0.elapsed() < Duration::from_secs(30),
                    "client thread hangs"
                );
                rt::sleep(Duration::from_millis(2)).await;
            }
            sig.trigger();
            rt::timeout(Duration::from_secs(5), server)
                .await
                .expect("serve returns after shutdown");
            if let Err(p) = t.join() {
                std::panic::resume_unwind(p);
            }
            echo
        })
    }

    fn connect(addr: SocketAddr) -> BufReader<StdStream> {
        let s = StdStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        BufReader::new(s)
    }

    /// Reads one response: (status, lowercase headers, body).
    fn read_response(
        r: &mut BufReader<StdStream>,
        head_request: bool,
    ) -> (u16, Vec<(String, String)>, Vec<u8>) {
        let mut line = String::new();
        r.read_line(&mut line).expect("status line");
        let status: u16 = line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("status line {line:?}"));
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            r.read_line(&mut h).expect("header");
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').expect("field");
            headers.push((k.to_ascii_lowercase(), v.trim().to_owned()));
        }
        let len = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .map_or(0, |(_, v)| v.parse().expect("len"));
        let mut body = vec![0; if head_request { 0 } else { len }];
        r.read_exact(&mut body).expect("body");
        (status, headers, body)
    }

    fn closed(r: &mut BufReader<StdStream>) -> bool {
        let mut b = [0u8; 1];
        matches!(r.read(&mut b), Ok(0) | Err(_))
    }

    fn hdr<'a>(h: &'a [(String, String)], k: &str) -> Option<&'a str> {
        h.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn keep_alive_pipelining_head_and_no_content() {
        // Proves two requests on one keep-alive connection, three pipelined requests sent in one
        // write answered in order, HEAD answered with Content-Length but no body, 204 without
        // Content-Length, and a slow request not reordered with fast ones.
        with_server(test_limits(), |addr| {
            let mut c = connect(addr);
            c.get_mut()
                .write_all(b"GET /a?x=1 HTTP/1.1\r\nHost: t\r\n\r\n")
                .expect("write");
            let (s, h, b) = read_response(&mut c, false);
            assert_eq!((s, b.as_slice()), (200, &b"GET /a x=1 "[..]));
            assert_eq!(hdr(&h, "content-type"), Some("text/plain; charset=utf-8"));
            assert!(hdr(&h, "date").is_some());
            c.get_mut()
                .write_all(b"POST /b HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET /slow HTTP/1.1\r\n\r\nHEAD /c HTTP/1.1\r\n\r\nGET /nocontent HTTP/1.1\r\n\r\n")
                .expect("write");
            assert_eq!(read_response(&mut c, false).2, b"POST /b  abc");
            assert_eq!(read_response(&mut c, false).2, b"GET /slow  ");
            let (s, h, _) = read_response(&mut c, true);
            assert_eq!((s, hdr(&h, "content-length")), (200, Some("8")));
            let (s, h, _) = read_response(&mut c, false);
            assert_eq!((s, hdr(&h, "content-length")), (204, None));
            // Still open and in sync after all that.
            c.get_mut()
                .write_all(b"GET /again HTTP/1.1\r\n\r\n")
                .expect("write");
            assert_eq!(read_response(&mut c, false).2, b"GET /again  ");
        });
    }

    #[test]
    fn expect_continue_chunked_and_early_answers() {
        // Proves 100 Continue is sent before the body is read when the limit accepts it, not
        // sent when the body is too large (413 at once) or the service answers early (401), and
        // a chunked body with extensions and trailers reaches the handler decoded; an early answer
        // keeps the connection only when the unread body is small enough to drain.
        with_server(test_limits(), |addr| {
            let mut c = connect(addr);
            c.get_mut()
                .write_all(b"POST /e HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n")
                .expect("write");
            let mut line = String::new();
            c.read_line(&mut line).expect("interim");
            assert_eq!(line, "HTTP/1.1 100 Continue\r\n");
            line.clear();
            c.read_line(&mut line).expect("blank");
            c.get_mut().write_all(b"wxyz").expect("body");
            assert_eq!(read_response(&mut c, false).2, b"POST /e  wxyz");

            c.get_mut()
                .write_all(b"POST /ch HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2;x=y\r\nab\r\n1\r\nc\r\n0\r\nT: 1\r\n\r\n")
                .expect("write");
            assert_eq!(read_response(&mut c, false).2, b"POST /ch  abc");

            let mut c = connect(addr);
            c.get_mut()
                .write_all(
                    b"POST /e HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 5000\r\n\r\n",
                )
                .expect("write");
            let (s, h, b) = read_response(&mut c, false);
            assert_eq!(
                (s, b.as_slice()),
                (413, &b"{\"error\":\"request body too large\"}\n"[..])
            );
            assert_eq!(hdr(&h, "connection"), Some("close"));
            assert!(closed(&mut c));

            // Early answer with a small body: body drained, connection kept.
            let mut c = connect(addr);
            c.get_mut()
                .write_all(
                    b"POST /deny HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET /ok HTTP/1.1\r\n\r\n",
                )
                .expect("write");
            assert_eq!(read_response(&mut c, false).0, 401);
            assert_eq!(read_response(&mut c, false).2, b"GET /ok  ");
            // Early answer while the client waits for 100: no 100, answer, close.
            let mut c = connect(addr);
            c.get_mut()
                .write_all(
                    b"POST /deny HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3000\r\n\r\n",
                )
                .expect("write");
            assert_eq!(read_response(&mut c, false).0, 401);
            assert!(closed(&mut c));
            // Early answer with a body above drain_body_bytes_max: answer, then close (the
            // body is not read for nothing).
            let mut c = connect(addr);
            let mut req = b"POST /deny HTTP/1.1\r\nContent-Length: 70000\r\n\r\n".to_vec();
            req.extend(std::iter::repeat_n(b'y', 70_000));
            c.get_mut().write_all(&req).expect("write");
            let (s, h, _) = read_response(&mut c, false);
            assert_eq!((s, hdr(&h, "connection")), (401, Some("close")));
            assert!(closed(&mut c));
            // Chunked body over the limit while decoding: 413.
            let mut c = connect(addr);
            let mut req = b"POST /big HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            for _ in 0..3 {
                req.extend_from_slice(b"190\r\n");
                req.extend(std::iter::repeat_n(b'x', 400));
                req.extend_from_slice(b"\r\n");
            }
            c.get_mut().write_all(&req).expect("write");
            assert_eq!(read_response(&mut c, false).0, 413);
            assert!(closed(&mut c));
        });
    }

    #[test]
    fn bad_input_gets_4xx_and_close_and_the_server_keeps_serving() {
        // Proves garbage is 400, an oversized header block 431 (plain text), a bad chunk size
        // 400, each followed by a clean close; a truncated body and a too-slow client are just
        // disconnected; a handler panic is a 500 JSON answer; and after all of it the server
        // still answers on a fresh connection. Every answer not made by the handler is reported
        // to the service's on_refused hook.
        let refused = with_server(test_limits(), |addr| {
            let mut c = connect(addr);
            c.get_mut()
                .write_all(b"\x16\x03\x01garbage\r\n\r\n")
                .expect("write");
            let (s, h, b) = read_response(&mut c, false);
            assert_eq!((s, b.as_slice()), (400, &b"400 Bad Request"[..]));
            assert_eq!(hdr(&h, "connection"), Some("close"));
            assert!(closed(&mut c));

            let mut c = connect(addr);
            let mut big = b"GET / HTTP/1.1\r\nX-Big: ".to_vec();
            big.extend(std::iter::repeat_n(b'a', 5000));
            big.extend_from_slice(b"\r\n\r\n");
            c.get_mut().write_all(&big).expect("write");
            let (s, _, b) = read_response(&mut c, false);
            assert_eq!(
                (s, b.as_slice()),
                (431, &b"431 Request Header Fields Too Large"[..])
            );
            assert!(closed(&mut c));

            let mut c = connect(addr);
            c.get_mut()
                .write_all(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nxyz\r\n")
                .expect("write");
            assert_eq!(read_response(&mut c, false).0, 400);
            assert!(closed(&mut c));

            let mut c = connect(addr);
            c.get_mut()
                .write_all(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc")
                .expect("write");
            c.get_mut()
                .shutdown(std::net::Shutdown::Write)
                .expect("half close");
            assert!(closed(&mut c), "truncated body: closed without an answer");

            let mut c = connect(addr);
            let t0 = Instant::now();
            c.get_mut()
                .write_all(b"GET / HTTP/1.1\r\nX-Slow: ")
                .expect("write");
            assert!(closed(&mut c), "slow client disconnected");
            assert!(t0.elapsed() < Duration::from_secs(3));

            let mut c = connect(addr);
            c.get_mut()
                .write_all(b"GET /panic HTTP/1.1\r\n\r\n")
                .expect("write");
            let (s, h, b) = read_response(&mut c, false);
            assert_eq!(
                (s, b.as_slice()),
                (500, &b"{\"error\":\"internal server panic\"}\n"[..])
            );
            assert_eq!(hdr(&h, "content-type"), Some("application/json"));
            c.get_mut()
                .write_all(b"GET /after-panic HTTP/1.1\r\n\r\n")
                .expect("write");
            assert_eq!(read_response(&mut c, false).2, b"GET /after-panic  ");

            let mut c = connect(addr);
            c.get_mut()
                .write_all(b"GET /alive HTTP/1.1\r\n\r\n")
                .expect("write");
            assert_eq!(read_response(&mut c, false).0, 200);
        });
        assert_eq!(refused, vec![400, 431, 400, 500]);
    }

    #[test]
    fn handler_sees_client_disconnect() {
        // Proves Request::client_disconnected turns true while the handler runs once the client
        // has closed its connection (what metrics record as 499).
        let echo = with_server_echo(test_limits(), |addr| {
            let mut c = connect(addr);
            c.get_mut()
                .write_all(b"GET /wait HTTP/1.1\r\n\r\n")
                .expect("write");
            std::thread::sleep(Duration::from_millis(30));
            drop(c);
            // Give the handler time to notice before the server is shut down.
            std::thread::sleep(Duration::from_millis(100));
        });
        assert!(echo.saw_disconnect.get());
    }

    #[test]
    fn body_reservation_refuses_when_the_budget_is_spent() {
        // Proves reserve_body runs before the body is read and its reservation lives as long as
        // the request: while one 600-byte body holds the 1000-byte budget another is refused
        // with the service's 503 (connection kept, small body drained), and once the first
        // request is done the budget is free again.
        with_server(test_limits(), |addr| {
            let body = vec![b'x'; 600];
            let mut a = connect(addr);
            a.get_mut()
                .write_all(b"POST /budget/slow HTTP/1.1\r\nContent-Length: 600\r\n\r\n")
                .expect("write");
            a.get_mut().write_all(&body).expect("body");
            std::thread::sleep(Duration::from_millis(50));
            let mut b = connect(addr);
            let mut req = b"POST /budget HTTP/1.1\r\nContent-Length: 600\r\n\r\n".to_vec();
            req.extend_from_slice(&body);
            b.get_mut().write_all(&req).expect("write");
            let (s, h, _) = read_response(&mut b, false);
            assert_eq!((s, hdr(&h, "retry-after")), (503, Some("1")));
            assert_eq!(read_response(&mut a, false).0, 200);
            b.get_mut().write_all(&req).expect("write again");
            assert_eq!(read_response(&mut b, false).0, 200);
        });
    }

    #[test]
    fn connection_close_and_http10() {
        // Proves Connection: close and HTTP/1.0 without keep-alive end the connection after the
        // answer (with Connection: close), HTTP/1.0 with keep-alive stays open, and a handler
        // asking to close is obeyed.
        with_server(test_limits(), |addr| {
            for req in [
                &b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n"[..],
                b"GET / HTTP/1.0\r\n\r\n",
                b"GET /close HTTP/1.1\r\n\r\n",
            ] {
                let mut c = connect(addr);
                c.get_mut().write_all(req).expect("write");
                let (s, h, _) = read_response(&mut c, false);
                assert_eq!((s, hdr(&h, "connection")), (200, Some("close")));
                assert!(closed(&mut c));
            }
            let mut c = connect(addr);
            c.get_mut()
                .write_all(b"GET /1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
                .expect("write");
            let (_, h, _) = read_response(&mut c, false);
            assert_eq!(hdr(&h, "connection"), Some("keep-alive"));
            c.get_mut()
                .write_all(b"GET /2 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
                .expect("write");
            assert_eq!(read_response(&mut c, false).2, b"GET /2  ");
        });
    }

    #[test]
    fn connection_limit_makes_extra_clients_wait() {
        // Proves that with connections_max = 1 a second client is not served while the first
        // is open, and is served as soon as the first closes.
        let limits = Limits {
            connections: crate::http::ConnectionBudget::new(1),
            ..test_limits()
        };
        with_server(limits, |addr| {
            let mut a = connect(addr);
            a.get_mut()
                .write_all(b"GET /a HTTP/1.1\r\n\r\n")
                .expect("write");
            assert_eq!(read_response(&mut a, false).0, 200);
            let mut b = connect(addr);
            b.get_mut()
                .set_read_timeout(Some(Duration::from_millis(200)))
                .expect("timeout");
            b.get_mut()
                .write_all(b"GET /b HTTP/1.1\r\n\r\n")
                .expect("write");
            let mut one = [0u8; 1];
            let r = b.get_mut().read(&mut one);
            assert!(
                matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
                "{r:?}"
            );
            drop(a);
            b.get_mut()
                .set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            assert_eq!(read_response(&mut b, false).2, b"GET /b  ");
        });
    }

    #[test]
    fn a_silent_new_connection_is_closed_after_the_read_timeout() {
        // Proves a connection that sends nothing is closed after read_timeout (300 ms here), not
        // kept for idle_timeout (5 s), which applies only between requests.
        with_server(test_limits(), |addr| {
            let mut c = connect(addr);
            c.get_mut()
                .set_read_timeout(Some(Duration::from_secs(3)))
                .expect("timeout");
            let t0 = Instant::now();
            let mut one = [0u8; 1];
            let r = c.get_mut().read(&mut one);
            assert!(matches!(r, Ok(0)) || r.is_err(), "{r:?}");
            let waited = t0.elapsed();
            assert!(
                waited >= Duration::from_millis(250) && waited < Duration::from_millis(2500),
                "closed after {waited:?}"
            );
        });
    }

    #[test]
    fn empty_lines_between_requests_keep_the_connection_idle() {
        // Proves a CRLF sent after an answer, or in the same packet as the request, does not
        // start the request read timeout (300 ms here): the connection is still served 700 ms
        // later, under the idle timeout (5 s).
        // Before, the stray bytes started a request and the read timeout closed the connection.
        with_server(test_limits(), |addr| {
            let mut c = connect(addr);
            c.get_mut()
                .write_all(b"GET /a HTTP/1.1\r\n\r\n")
                .expect("write");
            assert_eq!(read_response(&mut c, false).0, 200);
            c.get_mut().write_all(b"\r\n\r\n").expect("write");
            std::thread::sleep(Duration::from_millis(700));
            c.get_mut()
                .write_all(b"GET /b HTTP/1.1\r\n\r\n")
                .expect("write");
            assert_eq!(read_response(&mut c, false).2, b"GET /b  ");
            // The same with the CRLF in the request's own packet (audit s21 limits L3).
            c.get_mut()
                .write_all(b"GET /c HTTP/1.1\r\n\r\n\r\n")
                .expect("write");
            assert_eq!(read_response(&mut c, false).2, b"GET /c  ");
            std::thread::sleep(Duration::from_millis(700));
            c.get_mut()
                .write_all(b"GET /d HTTP/1.1\r\n\r\n")
                .expect("write");
            assert_eq!(read_response(&mut c, false).2, b"GET /d  ");
        });
    }

    #[test]
    fn idle_timeout_and_pipelined_flush_limit() {
        // Proves a keep-alive connection idle for longer than idle_timeout is closed, and that
        // with pipelined_responses_max = 2 seven pipelined requests are all answered, in order
        // (the limit only forces earlier flushes).
        let limits = Limits {
            idle_timeout: Duration::from_millis(150),
            pipelined_responses_max: 2,
            ..test_limits()
        };
        with_server(limits, |addr| {
            let mut c = connect(addr);
            let mut reqs = Vec::new();
            for i in 0..7 {
                reqs.extend_from_slice(format!("GET /{i} HTTP/1.1\r\n\r\n").as_bytes());
            }
            c.get_mut().write_all(&reqs).expect("write");
            for i in 0..7 {
                assert_eq!(
                    read_response(&mut c, false).2,
                    format!("GET /{i}  ").as_bytes()
                );
            }
            let t0 = Instant::now();
            assert!(closed(&mut c), "idle connection closed");
            let waited = t0.elapsed();
            assert!(
                waited >= Duration::from_millis(100) && waited < Duration::from_secs(3),
                "{waited:?}"
            );
        });
    }

    #[test]
    fn shutdown_closes_idle_connections_and_serve_returns() {
        // Proves that after the shutdown signal an idle keep-alive connection is closed and
        // serve returns (with_server asserts the return); the client sees end of stream.
        rt::block_on(async {
            let l = TcpListener::bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
            let addr = l.local_addr().expect("addr");
            let sig = ShutdownSignal::new();
            let server = rt::spawn(serve(
                l,
                Rc::new(Echo::default()),
                test_limits(),
                sig.clone(),
            ));
            let t = std::thread::spawn(move || {
                let mut c = connect(addr);
                c.get_mut()
                    .write_all(b"GET / HTTP/1.1\r\n\r\n")
                    .expect("write");
                assert_eq!(read_response(&mut c, false).0, 200);
                c
            });
            while !t.is_finished() {
                rt::sleep(Duration::from_millis(2)).await;
            }
            let mut c = t.join().expect("client");
            sig.trigger();
            rt::timeout(Duration::from_secs(5), server)
                .await
                .expect("serve returns");
            assert!(closed(&mut c));
        });
    }
}
