//! The listening side of the cluster port: accepts connections on this shard, runs the
//! handshake, and hands each request to the node's handler, writing its reply back.
//!
//! Bounds: connections per shard ([`PEER_CONNECTIONS_MAX`]), requests running per connection
//! ([`SERVE_IN_FLIGHT_PER_CONN`]: the reader stops reading until one finishes, which is the
//! backpressure on a peer), handshake bytes and time. A peer that sends a bad frame, a wrong
//! proof or a reply where a request belongs is disconnected with one log line; nothing it sends
//! can panic the shard or hold up other connections.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::wire::{
    listen_handshake, FrameReader, Identity, Outbox, REPLY_ERROR, REPLY_OK, REPLY_UNSUPPORTED,
};
use crate::frame::{FrameKind, FRAME_BODY_BYTES_MAX};
use crate::rt::{self, Semaphore, ShutdownSignal, TcpListener};

/// Cluster connections one shard serves at once; more are closed at accept.
pub const PEER_CONNECTIONS_MAX: usize = 256;
/// Requests of one connection running at once.
pub const SERVE_IN_FLIGHT_PER_CONN: usize = 64;

/// One request as the handler sees it.
pub struct Inbound {
    /// The calling node's id (proved in the handshake).
    pub from: Rc<str>,
    pub op: u8,
    /// The frame's body as received: the operation byte, then the operation's bytes.
    frame: Vec<u8>,
    /// When the caller stops waiting.
    pub deadline: Instant,
    /// False for a one-way message (its answer is dropped).
    pub wants_reply: bool,
}

impl Inbound {
    /// The operation's bytes (after the operation byte).
    pub fn body(&self) -> &[u8] {
        &self.frame[1..]
    }
}

/// A handler's answer.
pub enum Outcome {
    Ok(Vec<u8>),
    Error(String),
    /// The operation code is unknown here.
    Unsupported,
}

pub type HandlerFuture = Pin<Box<dyn Future<Output = Outcome>>>;
/// Serves one request. Runs on the shard that accepted the connection.
pub type Handler = Rc<dyn Fn(Inbound) -> HandlerFuture>;
/// Admits (or refuses, with the reason the dialer logs) a proved peer by its node id.
pub type Admit = Rc<dyn Fn(&str) -> Result<(), String>>;

/// Serves the cluster port on this shard until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    me: Identity,
    handler: Handler,
    admit: Admit,
    shutdown: ShutdownSignal,
) {
    let me = Rc::new(me);
    let conns = Semaphore::new(PEER_CONNECTIONS_MAX);
    loop {
        let accepted = futures_lite::future::or(async { Some(listener.accept().await) }, async {
            shutdown.wait().await;
            None
        })
        .await;
        let (stream, addr) = match accepted {
            None => return,
            Some(Ok(s)) => s,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "cluster port accept failed");
                if rt::accept_out_of_resources(&e) {
                    rt::sleep(Duration::from_millis(100)).await;
                }
                continue;
            }
        };
        let Some(permit) = conns.try_acquire() else {
            tracing::warn!(peer = %addr, max = PEER_CONNECTIONS_MAX, "cluster connection refused: too many");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (me, handler, admit, shutdown) =
            (me.clone(), handler.clone(), admit.clone(), shutdown.clone());
        rt::spawn(async move {
            let _permit = permit;
            serve_conn(stream, addr, me, handler, admit, shutdown).await;
        })
        .detach();
    }
}

async fn serve_conn(
    stream: rt::TcpStream,
    addr: std::net::SocketAddr,
    me: Rc<Identity>,
    handler: Handler,
    admit: Admit,
    shutdown: ShutdownSignal,
) {
    // The TLS handshake (when the cluster has certificates) and the secret's proof share one
    // deadline.
    let deadline = Instant::now() + super::wire::HANDSHAKE_TIMEOUT;
    let stream: super::wire::PeerStream = match &me.tls {
        Some(tls) => match rt::timeout_at(deadline, tls.accept(stream)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::warn!(peer = %addr, error = %e, "cluster connection refused: TLS");
                return;
            }
            Err(_) => {
                tracing::warn!(peer = %addr, "cluster connection refused: no TLS handshake within 5 s");
                return;
            }
        },
        None => Box::new(stream),
    };
    let (r, mut w) = futures_lite::io::split(stream);
    let mut reader = FrameReader::new(r);
    let proved = rt::timeout_at(
        deadline,
        listen_handshake(&me, &mut reader, &mut w, &*admit),
    )
    .await;
    let from: Rc<str> = match proved {
        Ok(Ok(id)) => Rc::from(id),
        Ok(Err(e)) => {
            tracing::warn!(peer = %addr, error = %e, "cluster connection refused");
            return;
        }
        Err(_) => {
            tracing::warn!(peer = %addr, "cluster connection refused: no handshake within 5 s");
            return;
        }
    };
    tracing::debug!(peer = %addr, node = %from, "cluster connection open");
    let outbox = Rc::new(Outbox::default());
    let ob = outbox.clone();
    let writer = rt::spawn(async move { ob.drain(w).await });
    let running = Semaphore::new(SERVE_IN_FLIGHT_PER_CONN);
    let why = loop {
        let next = futures_lite::future::or(
            async { Some(reader.next(FRAME_BODY_BYTES_MAX).await) },
            async {
                futures_lite::future::or(shutdown.wait(), outbox.closed()).await;
                None
            },
        )
        .await;
        let f = match next {
            None => break None,
            Some(Err(super::wire::WireError::Closed)) => break None,
            Some(Err(e)) => break Some(e.to_string()),
            Some(Ok(f)) => f,
        };
        let wants_reply = match f.kind {
            FrameKind::Request => true,
            FrameKind::OneWay => false,
            FrameKind::Reply => break Some("a reply frame on a served connection".into()),
        };
        let Some(&op) = f.body.first() else {
            break Some("an empty request".into());
        };
        let permit = running.acquire().await;
        let inbound = Inbound {
            from: from.clone(),
            op,
            frame: f.body,
            deadline: Instant::now() + Duration::from_millis(u64::from(f.deadline_ms.max(1))),
            wants_reply,
        };
        let (h, ob, id) = (handler.clone(), outbox.clone(), f.request_id);
        rt::spawn(async move {
            let _permit = permit;
            let outcome = h(inbound).await;
            if !wants_reply {
                return;
            }
            let mut reply = Vec::new();
            match outcome {
                Outcome::Ok(b) => {
                    reply.reserve(b.len() + 1);
                    reply.push(REPLY_OK);
                    reply.extend_from_slice(&b);
                }
                Outcome::Error(e) => {
                    reply.push(REPLY_ERROR);
                    reply.extend_from_slice(e.as_bytes());
                }
                Outcome::Unsupported => reply.push(REPLY_UNSUPPORTED),
            }
            if reply.len() > FRAME_BODY_BYTES_MAX {
                reply.clear();
                reply.push(REPLY_ERROR);
                reply.extend_from_slice(b"reply over the frame limit");
            }
            ob.push(FrameKind::Reply, id, 0, &reply);
        })
        .detach();
    };
    if let Some(why) = why {
        tracing::warn!(peer = %addr, node = %from, error = %why, "cluster connection closed");
    }
    outbox.close();
    let _ = writer.await;
}
