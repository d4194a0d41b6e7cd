//! What both ends of a node-to-node connection share: reading whole frames off a stream with a
//! bound, the outbox one writer task drains (frames from many callers coalesce into one write),
//! the handshake drivers, and the reply status byte.

use std::cell::{Cell, RefCell};
use std::io;
use std::rc::Rc;
use std::time::Duration;

use futures_lite::io::{ReadHalf, WriteHalf};
use futures_lite::{AsyncReadExt, AsyncWriteExt};

use super::proof::{
    Answer, Challenge, Hello, ProofError, Role, Secret, Transcript, Verdict,
    HANDSHAKE_BODY_BYTES_MAX,
};
use crate::frame::{self, FrameError, FrameKind, FRAME_HEADER_BYTES};
use crate::rt::Notify;

/// Longest a handshake may take, either side.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes read from the socket at once.
const READ_CHUNK: usize = 64 << 10;

/// A frame read off a connection, its body copied out of the receive buffer.
#[derive(Debug)]
pub struct OwnedFrame {
    pub kind: FrameKind,
    pub request_id: u64,
    pub deadline_ms: u32,
    pub body: Vec<u8>,
}

/// Why a connection ended.
#[derive(Debug)]
pub enum WireError {
    Io(io::Error),
    /// The peer closed the connection.
    Closed,
    Frame(FrameError),
    /// A frame over the limit of this phase (the handshake's is small).
    TooLong(usize),
    Proof(ProofError),
    /// A frame of a kind or id this phase does not expect.
    Unexpected(&'static str),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Io(e) => write!(f, "{e}"),
            WireError::Closed => f.write_str("connection closed by the peer"),
            WireError::Frame(e) => write!(f, "{e}"),
            WireError::TooLong(n) => {
                write!(f, "a frame body of {n} bytes is over this phase's limit")
            }
            WireError::Proof(e) => write!(f, "{e}"),
            WireError::Unexpected(what) => write!(f, "unexpected frame: {what}"),
        }
    }
}

impl From<io::Error> for WireError {
    fn from(e: io::Error) -> WireError {
        WireError::Io(e)
    }
}

/// A connection's byte stream: a plain TCP stream, or TLS over one ([`super::tls`]).
pub trait PeerIo: futures_lite::AsyncRead + futures_lite::AsyncWrite + Unpin {}
impl<T: futures_lite::AsyncRead + futures_lite::AsyncWrite + Unpin> PeerIo for T {}

/// A cluster connection's stream, whichever it is.
pub type PeerStream = Box<dyn PeerIo>;

/// Reads whole frames off the read half of a connection.
pub struct FrameReader {
    half: ReadHalf<PeerStream>,
    buf: Vec<u8>,
    /// Start of the unread bytes in `buf`.
    at: usize,
}

impl FrameReader {
    pub fn new(half: ReadHalf<PeerStream>) -> FrameReader {
        FrameReader {
            half,
            buf: Vec::with_capacity(READ_CHUNK),
            at: 0,
        }
    }

    /// The next frame whose body is at most `limit` bytes. A longer one ends the connection as
    /// soon as its header shows the length (nothing more is read for it).
    pub async fn next(&mut self, limit: usize) -> Result<OwnedFrame, WireError> {
        loop {
            let unread = &self.buf[self.at..];
            if unread.len() >= FRAME_HEADER_BYTES || !unread.is_empty() {
                match frame::decode(unread) {
                    Ok(Some((f, used))) => {
                        if f.body.len() > limit {
                            return Err(WireError::TooLong(f.body.len()));
                        }
                        let out = OwnedFrame {
                            kind: f.kind,
                            request_id: f.request_id,
                            deadline_ms: f.deadline_ms,
                            body: f.body.to_vec(),
                        };
                        self.at += used;
                        if self.at == self.buf.len() {
                            self.buf.clear();
                            self.at = 0;
                        }
                        return Ok(out);
                    }
                    Ok(None) => {
                        if unread.len() >= FRAME_HEADER_BYTES {
                            let len =
                                u32::from_le_bytes(unread[20..24].try_into().expect("four bytes"))
                                    as usize;
                            if len > limit {
                                return Err(WireError::TooLong(len));
                            }
                        }
                    }
                    Err(e) => return Err(WireError::Frame(e)),
                }
            }
            if self.at > 0 {
                self.buf.drain(..self.at);
                self.at = 0;
            }
            let old = self.buf.len();
            self.buf.resize(old + READ_CHUNK, 0);
            let n = self.half.read(&mut self.buf[old..]).await;
            match n {
                Ok(0) => {
                    self.buf.truncate(old);
                    return Err(WireError::Closed);
                }
                Ok(n) => self.buf.truncate(old + n),
                Err(e) => {
                    self.buf.truncate(old);
                    return Err(WireError::Io(e));
                }
            }
        }
    }
}

/// Frames waiting to be written, drained by one writer task per connection: whatever many
/// callers queued while the last write was in flight goes out in the next single write.
#[derive(Default)]
pub struct Outbox {
    buf: RefCell<Vec<u8>>,
    wake: Notify,
    closed: Cell<bool>,
}

impl Outbox {
    /// Queues one frame. False when the connection is closed (nothing queued).
    pub fn push(&self, kind: FrameKind, request_id: u64, deadline_ms: u32, body: &[u8]) -> bool {
        if self.closed.get() {
            return false;
        }
        frame::encode(
            kind,
            request_id,
            deadline_ms,
            body,
            &mut self.buf.borrow_mut(),
        );
        self.wake.notify_waiters();
        true
    }

    /// Ends the writer task (and refuses later pushes).
    pub fn close(&self) {
        self.closed.set(true);
        self.wake.notify_waiters();
    }

    pub fn is_closed(&self) -> bool {
        self.closed.get()
    }

    /// Completes when [`Outbox::close`] was called.
    pub async fn closed(&self) {
        loop {
            let t = self.wake.ticket();
            if self.closed.get() {
                return;
            }
            self.wake.notified_since(t).await;
        }
    }

    /// The writer task: writes queued frames until the outbox is closed or a write fails.
    pub async fn drain(self: Rc<Self>, mut half: WriteHalf<PeerStream>) -> Result<(), io::Error> {
        let mut out = Vec::new();
        loop {
            let t = self.wake.ticket();
            std::mem::swap(&mut out, &mut self.buf.borrow_mut());
            if out.is_empty() {
                if self.closed.get() {
                    let _ = half.close().await;
                    return Ok(());
                }
                self.wake.notified_since(t).await;
                continue;
            }
            let r = async {
                half.write_all(&out).await?;
                half.flush().await
            }
            .await;
            if let Err(e) = r {
                self.close();
                return Err(e);
            }
            out.clear();
            if out.capacity() > (4 << 20) {
                out = Vec::new();
            }
        }
    }
}

async fn write_frame(
    half: &mut WriteHalf<PeerStream>,
    request_id: u64,
    body: &[u8],
) -> Result<(), WireError> {
    let mut out = Vec::with_capacity(FRAME_HEADER_BYTES + body.len());
    frame::encode(FrameKind::OneWay, request_id, 0, body, &mut out);
    half.write_all(&out).await?;
    half.flush().await?;
    Ok(())
}

async fn read_step(r: &mut FrameReader, step: u64) -> Result<Vec<u8>, WireError> {
    let f = r.next(HANDSHAKE_BODY_BYTES_MAX).await?;
    if f.kind != FrameKind::OneWay || f.request_id != step {
        return Err(WireError::Unexpected("not the next handshake step"));
    }
    Ok(f.body)
}

/// How a handshake ended for the side that ran it.
#[derive(Debug)]
pub enum HandshakeError {
    Wire(WireError),
    /// The peer's proof did not verify: it holds another cluster secret.
    BadProof {
        peer: String,
    },
    /// The listener refused this dialer, and said why.
    Refused(String),
    TimedOut,
}

impl std::fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandshakeError::Wire(e) => write!(f, "cluster handshake failed: {e}"),
            HandshakeError::BadProof { peer } => write!(
                f,
                "node {peer:?} did not prove the cluster secret: the nodes hold different NARAD_CLUSTER_SECRET values"
            ),
            HandshakeError::Refused(why) => write!(f, "refused by the peer: {why}"),
            HandshakeError::TimedOut => write!(
                f,
                "cluster handshake did not finish within {} s",
                HANDSHAKE_TIMEOUT.as_secs()
            ),
        }
    }
}

impl From<WireError> for HandshakeError {
    fn from(e: WireError) -> HandshakeError {
        HandshakeError::Wire(e)
    }
}

impl From<ProofError> for HandshakeError {
    fn from(e: ProofError) -> HandshakeError {
        HandshakeError::Wire(WireError::Proof(e))
    }
}

fn nonce() -> [u8; super::proof::NONCE_BYTES] {
    let mut n = [0u8; super::proof::NONCE_BYTES];
    crate::sys::fill_random(&mut n);
    n
}

/// Who this node is on the cluster plane.
#[derive(Clone, Debug)]
pub struct Identity {
    pub node_id: String,
    pub secret: Secret,
    /// TLS on every connection, when the cluster has certificates.
    pub tls: Option<std::sync::Arc<super::tls::PeerTls>>,
}

/// The dialer's side: answers the listener's node id once both proofs verified.
pub async fn dial_handshake(
    me: &Identity,
    r: &mut FrameReader,
    w: &mut WriteHalf<PeerStream>,
) -> Result<String, HandshakeError> {
    let hello = Hello {
        node_id: me.node_id.clone(),
        nonce: nonce(),
    };
    write_frame(w, 0, &hello.encode()).await?;
    let ch = Challenge::decode(&read_step(r, 1).await?)?;
    let t = Transcript {
        dialer_id: me.node_id.clone(),
        dialer_nonce: hello.nonce,
        listener_id: ch.node_id.clone(),
        listener_nonce: ch.nonce,
    };
    if !t.verify(&me.secret, Role::Listener, &ch.proof) {
        // Tell the listener why the connection ends, so both logs say it.
        let _ = write_frame(w, 2, &[0u8; 1]).await;
        return Err(HandshakeError::BadProof { peer: ch.node_id });
    }
    let answer = Answer {
        proof: t.prove(&me.secret, Role::Dialer),
    };
    write_frame(w, 2, &answer.encode()).await?;
    match Verdict::decode(&read_step(r, 3).await?)? {
        Verdict::Accepted => Ok(ch.node_id),
        Verdict::Refused(why) => Err(HandshakeError::Refused(why)),
    }
}

/// The listener's side: answers the dialer's node id once both proofs verified and `admit`
/// accepted it (`admit` answers why not, such as a tombstoned id).
pub async fn listen_handshake(
    me: &Identity,
    r: &mut FrameReader,
    w: &mut WriteHalf<PeerStream>,
    admit: &dyn Fn(&str) -> Result<(), String>,
) -> Result<String, HandshakeError> {
    let hello = Hello::decode(&read_step(r, 0).await?)?;
    let mut t = Transcript {
        dialer_id: hello.node_id.clone(),
        dialer_nonce: hello.nonce,
        listener_id: me.node_id.clone(),
        listener_nonce: nonce(),
    };
    let ch = Challenge {
        node_id: me.node_id.clone(),
        nonce: t.listener_nonce,
        proof: t.prove(&me.secret, Role::Listener),
    };
    write_frame(w, 1, &ch.encode()).await?;
    let body = read_step(r, 2).await?;
    let answer = match Answer::decode(&body) {
        Ok(a) => a,
        // A one-byte answer: the dialer could not verify this side's proof.
        Err(_) if body.len() == 1 => {
            return Err(HandshakeError::BadProof {
                peer: std::mem::take(&mut t.dialer_id),
            })
        }
        Err(e) => return Err(e.into()),
    };
    if !t.verify(&me.secret, Role::Dialer, &answer.proof) {
        let why = "wrong cluster secret (NARAD_CLUSTER_SECRET differs between the nodes)";
        let _ = write_frame(w, 3, &Verdict::Refused(why.into()).encode()).await;
        return Err(HandshakeError::BadProof {
            peer: hello.node_id,
        });
    }
    if let Err(why) = admit(&hello.node_id) {
        let _ = write_frame(w, 3, &Verdict::Refused(why.clone()).encode()).await;
        return Err(HandshakeError::Refused(why));
    }
    write_frame(w, 3, &Verdict::Accepted.encode()).await?;
    Ok(hello.node_id)
}

/// First byte of a reply body.
pub const REPLY_OK: u8 = 0;
/// The handler failed; the rest is its message (UTF-8).
pub const REPLY_ERROR: u8 = 1;
/// The listener does not know the operation (another version).
pub const REPLY_UNSUPPORTED: u8 = 2;
