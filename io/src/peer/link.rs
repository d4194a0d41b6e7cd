//! [`PeerLink`]: this shard's connection to one other node, for requests and their replies.
//!
//! Owns connecting (lazily, at the first call), the handshake, request ids, the bound on
//! requests in flight, each call's deadline, and reconnecting with backoff. One link per
//! (shard, peer): nothing is shared between shards. A connection that fails ends every call
//! waiting on it with [`PeerError::Lost`] (the request may have been applied) and the next call
//! dials again; a peer that cannot be reached is not dialled again before its backoff (100 ms
//! doubling to 2 s) has passed: calls meanwhile fail at once with [`PeerError::Unreachable`].

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::wire::{
    dial_handshake, FrameReader, HandshakeError, Identity, Outbox, REPLY_ERROR, REPLY_OK,
    REPLY_UNSUPPORTED,
};
use crate::frame::{FrameKind, FRAME_BODY_BYTES_MAX};
use crate::rt::{self, oneshot, Semaphore, TcpStream};

/// Requests in flight on one link; more wait for a slot (within their deadline).
pub const LINK_IN_FLIGHT_MAX: usize = 256;
/// First wait before dialling a peer again after a failed dial; doubles up to the max.
pub const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(100);
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Longest a dial (TCP connect and handshake) may take.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(3);
/// A connection with calls waiting and nothing heard on it for this long is asked for a sign of
/// life ([`ops::LINK_PING`](super::ops::LINK_PING)).
pub const SILENCE_PING_AFTER: Duration = Duration::from_secs(2);
/// ... and closed, failing its calls, when the ping is not answered within this: a path that a
/// cut blackholed would otherwise hold a call until its own deadline (30 s for a commit).
pub const PING_ANSWER_WITHIN: Duration = Duration::from_secs(3);

/// Why a call produced no reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerError {
    /// Nothing was sent: the peer could not be reached (or was refused), or no slot freed up in
    /// time. Safe to retry elsewhere.
    Unreachable(String),
    /// The request was sent but no reply came within the deadline: it may have been applied.
    Timeout,
    /// The connection ended after the request was sent: it may have been applied.
    Lost(String),
    /// The peer answered with an error.
    Remote(String),
    /// The peer does not know this operation.
    Unsupported,
}

impl std::fmt::Display for PeerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerError::Unreachable(e) => write!(f, "peer unreachable: {e}"),
            PeerError::Timeout => f.write_str("peer did not answer in time"),
            PeerError::Lost(e) => write!(f, "connection to the peer lost: {e}"),
            PeerError::Remote(e) => write!(f, "peer answered an error: {e}"),
            PeerError::Unsupported => f.write_str("unsupported rpc operation"),
        }
    }
}

impl std::error::Error for PeerError {}

impl PeerError {
    /// Whether the request certainly was not applied (it never left this node).
    pub fn not_sent(&self) -> bool {
        matches!(self, PeerError::Unreachable(_))
    }
}

type Waiter = oneshot::Sender<Result<Vec<u8>, PeerError>>;

/// One established connection.
struct Conn {
    outbox: Rc<Outbox>,
    pending: RefCell<HashMap<u64, Waiter>>,
    /// The peer's node id, from the handshake.
    peer_id: String,
    /// When a frame last arrived on this connection.
    last_heard: Cell<Instant>,
}

impl Conn {
    /// Ends the connection: its writer stops, every waiting call fails.
    fn fail(&self, why: &str) {
        self.outbox.close();
        for (_, w) in self.pending.borrow_mut().drain() {
            let _ = w.send(Err(PeerError::Lost(why.to_string())));
        }
    }
}

struct Backoff {
    next_try: Instant,
    wait: Duration,
    last_error: String,
}

struct LinkInner {
    addr: String,
    me: Identity,
    conn: RefCell<Option<Rc<Conn>>>,
    /// One dial at a time; callers queue behind it.
    dialing: Semaphore,
    backoff: RefCell<Option<Backoff>>,
    in_flight: Semaphore,
    next_id: Cell<u64>,
}

/// A shard's link to one peer. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct PeerLink(Rc<LinkInner>);

impl PeerLink {
    /// A link to the node listening at `addr` (`host:port`). Dials at the first call.
    pub fn new(addr: String, me: Identity) -> PeerLink {
        PeerLink(Rc::new(LinkInner {
            addr,
            me,
            conn: RefCell::new(None),
            dialing: Semaphore::new(1),
            backoff: RefCell::new(None),
            in_flight: Semaphore::new(LINK_IN_FLIGHT_MAX),
            next_id: Cell::new(1),
        }))
    }

    pub fn addr(&self) -> &str {
        &self.0.addr
    }

    /// The peer's node id, once a connection is up.
    pub fn peer_id(&self) -> Option<String> {
        self.0.conn.borrow().as_ref().map(|c| c.peer_id.clone())
    }

    /// Whether a connection is up now.
    pub fn connected(&self) -> bool {
        self.0.conn.borrow().is_some()
    }

    /// The last dial failure while the peer is in backoff.
    pub fn last_error(&self) -> Option<String> {
        self.0
            .backoff
            .borrow()
            .as_ref()
            .map(|b| b.last_error.clone())
    }

    /// Sends operation `op` with `body` and waits up to `within` for the reply's body. Counted
    /// in this thread's [`super::stats`] by operation and outcome.
    pub async fn call(&self, op: u8, body: &[u8], within: Duration) -> Result<Vec<u8>, PeerError> {
        let started = Instant::now();
        let r = self.exchange(op, body, within).await;
        super::stats::record(op, super::stats::Outcome::of(&r), started.elapsed());
        r
    }

    async fn exchange(&self, op: u8, body: &[u8], within: Duration) -> Result<Vec<u8>, PeerError> {
        let deadline = Instant::now() + within;
        if body.len() + 1 > FRAME_BODY_BYTES_MAX {
            return Err(PeerError::Unreachable(format!(
                "request of {} bytes is over the frame limit",
                body.len()
            )));
        }
        let _slot = rt::timeout_at(deadline, self.0.in_flight.acquire())
            .await
            .map_err(|_| {
                PeerError::Unreachable("too many requests in flight to this peer".into())
            })?;
        let conn = self.connection(deadline).await?;
        let id = self.0.next_id.get();
        self.0.next_id.set(id.wrapping_add(1));
        let (tx, rx) = oneshot::channel();
        conn.pending.borrow_mut().insert(id, tx);
        let budget = deadline
            .saturating_duration_since(Instant::now())
            .as_millis()
            .min(u32::MAX as u128) as u32;
        let mut framed = Vec::with_capacity(body.len() + 1);
        framed.push(op);
        framed.extend_from_slice(body);
        if !conn.outbox.push(FrameKind::Request, id, budget, &framed) {
            conn.pending.borrow_mut().remove(&id);
            return Err(PeerError::Unreachable("connection closed".into()));
        }
        let sent = Instant::now();
        match rt::timeout_at(deadline, rx).await {
            Err(_) => {
                conn.pending.borrow_mut().remove(&id);
                // Nothing at all came back on this connection since the request left: the
                // path may be dead (a cut network drops packets without a reset, and TCP keeps
                // retrying for minutes). Drop it so that the next call dials afresh.
                if conn.last_heard.get() < sent {
                    tracing::warn!(peer = %self.0.addr, "cluster connection silent past a deadline; closing it");
                    conn.fail("no answer within the deadline");
                }
                Err(PeerError::Timeout)
            }
            Ok(Err(_)) => Err(PeerError::Lost("connection dropped".into())),
            Ok(Ok(r)) => r.and_then(parse_reply),
        }
    }

    /// Sends `op` without waiting for (or expecting) a reply. False when nothing was sent.
    pub async fn tell(&self, op: u8, body: &[u8], within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let Ok(conn) = self.connection(deadline).await else {
            return false;
        };
        let mut framed = Vec::with_capacity(body.len() + 1);
        framed.push(op);
        framed.extend_from_slice(body);
        conn.outbox.push(FrameKind::OneWay, 0, 0, &framed)
    }

    /// The live connection, dialling one when there is none (and the backoff allows).
    async fn connection(&self, deadline: Instant) -> Result<Rc<Conn>, PeerError> {
        if let Some(c) = self.live() {
            return Ok(c);
        }
        let _dial = rt::timeout_at(deadline, self.0.dialing.acquire())
            .await
            .map_err(|_| PeerError::Unreachable("still dialling the peer".into()))?;
        // Another caller may have dialled meanwhile.
        if let Some(c) = self.live() {
            return Ok(c);
        }
        if let Some(b) = self.0.backoff.borrow().as_ref() {
            if Instant::now() < b.next_try {
                return Err(PeerError::Unreachable(b.last_error.clone()));
            }
        }
        let within = deadline
            .saturating_duration_since(Instant::now())
            .min(DIAL_TIMEOUT);
        match rt::timeout(within, self.dial()).await {
            Ok(Ok(c)) => {
                *self.0.backoff.borrow_mut() = None;
                Ok(c)
            }
            Ok(Err(e)) => Err(self.note_failure(e)),
            Err(_) => {
                Err(self.note_failure(format!("no connection within {} ms", within.as_millis())))
            }
        }
    }

    fn live(&self) -> Option<Rc<Conn>> {
        let c = self.0.conn.borrow();
        c.as_ref().filter(|c| !c.outbox.is_closed()).cloned()
    }

    fn note_failure(&self, e: String) -> PeerError {
        let mut b = self.0.backoff.borrow_mut();
        let wait = match b.as_ref() {
            Some(old) => (old.wait * 2).min(RECONNECT_BACKOFF_MAX),
            None => RECONNECT_BACKOFF_MIN,
        };
        let logged = b.as_ref().map(|o| o.last_error != e).unwrap_or(true);
        if logged {
            tracing::warn!(peer = %self.0.addr, error = %e, "cluster peer unreachable");
        }
        *b = Some(Backoff {
            next_try: Instant::now() + wait,
            wait,
            last_error: e.clone(),
        });
        PeerError::Unreachable(e)
    }

    async fn dial(&self) -> Result<Rc<Conn>, String> {
        let stream = TcpStream::connect_host(&self.0.addr)
            .await
            .map_err(|e| format!("connect {}: {e}", self.0.addr))?;
        let _ = stream.set_nodelay(true);
        // A request this node gave up on (a call that timed out closes a silent connection, and
        // the caller hears "may have been applied") must not reach the peer later: without
        // this, a cut network that heals delivers the kernel's buffered bytes and the peer runs
        // a metadata proposal the client was answered 503 for seconds before.
        let _ = stream.set_abortive_close();
        let stream: super::wire::PeerStream = match &self.0.me.tls {
            Some(tls) => tls.connect(&self.0.addr, stream).await.map_err(|e| {
                let msg = format!("TLS with {}: {e}", self.0.addr);
                tracing::error!(peer = %self.0.addr, error = %msg, "cluster connection refused");
                msg
            })?,
            None => Box::new(stream),
        };
        let (r, mut w) = futures_lite::io::split(stream);
        let mut reader = FrameReader::new(r);
        let peer_id = dial_handshake(&self.0.me, &mut reader, &mut w)
            .await
            .map_err(|e: HandshakeError| {
                let msg = e.to_string();
                tracing::error!(peer = %self.0.addr, error = %msg, "cluster connection refused");
                msg
            })?;
        let conn = Rc::new(Conn {
            outbox: Rc::new(Outbox::default()),
            pending: RefCell::new(HashMap::new()),
            peer_id,
            last_heard: Cell::new(Instant::now()),
        });
        let outbox = conn.outbox.clone();
        rt::spawn(async move {
            let _ = outbox.drain(w).await;
        })
        .detach();
        let c = conn.clone();
        let addr = self.0.addr.clone();
        rt::spawn(async move { read_replies(c, reader, addr).await }).detach();
        let (link, c) = (self.clone(), conn.clone());
        rt::spawn(async move { link.watch_silence(c).await }).detach();
        *self.0.conn.borrow_mut() = Some(conn.clone());
        Ok(conn)
    }
}

impl PeerLink {
    /// The watchdog of a dialled connection, until it ends: once calls wait and nothing was
    /// heard for [`SILENCE_PING_AFTER`], sends a ping; no frame back within
    /// [`PING_ANSWER_WITHIN`] closes the connection (its calls fail as lost and are retried
    /// or rerouted by their callers; the next call dials afresh).
    async fn watch_silence(&self, conn: Rc<Conn>) {
        loop {
            let closed = futures_lite::future::or(
                async {
                    conn.outbox.closed().await;
                    true
                },
                async {
                    rt::sleep(Duration::from_secs(1)).await;
                    false
                },
            )
            .await;
            if closed || conn.outbox.is_closed() {
                return;
            }
            if conn.pending.borrow().is_empty()
                || conn.last_heard.get().elapsed() < SILENCE_PING_AFTER
            {
                continue;
            }
            let id = self.0.next_id.get();
            self.0.next_id.set(id.wrapping_add(1));
            let (tx, rx) = oneshot::channel();
            conn.pending.borrow_mut().insert(id, tx);
            let sent = Instant::now();
            let budget = PING_ANSWER_WITHIN.as_millis() as u32;
            if !conn
                .outbox
                .push(FrameKind::Request, id, budget, &[super::ops::LINK_PING])
            {
                return;
            }
            let _ = rt::timeout(PING_ANSWER_WITHIN, rx).await;
            conn.pending.borrow_mut().remove(&id);
            if conn.last_heard.get() < sent && !conn.outbox.is_closed() {
                tracing::warn!(peer = %self.0.addr, "cluster connection silent: no answer to a ping within 3 s; closing it");
                conn.fail("no answer to a ping");
                return;
            }
        }
    }
}

/// The reader task of a dialled connection: hands each reply to its caller until the
/// connection ends (or its outbox is closed).
async fn read_replies(conn: Rc<Conn>, mut reader: FrameReader, addr: String) {
    loop {
        let next = futures_lite::future::or(
            async { Some(reader.next(FRAME_BODY_BYTES_MAX).await) },
            async {
                conn.outbox.closed().await;
                None
            },
        )
        .await;
        let f = match next {
            None => {
                conn.fail("connection closed");
                return;
            }
            Some(Err(e)) => {
                let why = e.to_string();
                tracing::warn!(peer = %addr, error = %why, "cluster connection ended");
                conn.fail(&why);
                return;
            }
            Some(Ok(f)) => f,
        };
        if f.kind != FrameKind::Reply {
            tracing::warn!(peer = %addr, "cluster peer sent a request on a dialled connection; closing it");
            conn.fail("protocol error");
            return;
        }
        conn.last_heard.set(Instant::now());
        let w = conn.pending.borrow_mut().remove(&f.request_id);
        if let Some(w) = w {
            let _ = w.send(Ok(f.body));
        }
    }
}

fn parse_reply(body: Vec<u8>) -> Result<Vec<u8>, PeerError> {
    match body.first() {
        Some(&REPLY_OK) => {
            let mut b = body;
            b.remove(0);
            Ok(b)
        }
        Some(&REPLY_ERROR) => Err(PeerError::Remote(
            String::from_utf8_lossy(&body[1..]).into_owned(),
        )),
        Some(&REPLY_UNSUPPORTED) => Err(PeerError::Unsupported),
        _ => Err(PeerError::Lost("malformed reply".into())),
    }
}
