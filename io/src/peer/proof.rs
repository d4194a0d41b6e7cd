//! The cluster-secret proof that opens every node-to-node connection: the messages, their byte
//! layout and the HMAC. Pure (no sockets): [`super::link`] and [`super::serve`] drive it, the
//! fuzz target `peer_handshake` feeds it arbitrary bytes.
//!
//! The exchange, each message the body of one frame (kind one-way, request id 0..3):
//!
//! 1. dialer → listener: [`Hello`] (magic `NRPH`, version, the dialer's node id, a fresh nonce);
//! 2. listener → dialer: [`Challenge`] (the listener's node id, its fresh nonce, and its proof
//!    `HMAC-SHA256(secret, "narad-peer-v1 listener" ‖ transcript)`);
//! 3. dialer → listener: [`Answer`] (the dialer's proof, role `dialer`), sent only when the
//!    listener's proof verified;
//! 4. listener → dialer: [`Verdict`] (accepted, or refused and why).
//!
//! The transcript is both nonces and both node ids, length-prefixed, so a proof is bound to this
//! connection: a recorded proof is worthless on another connection (its nonces differ), and a
//! proof of one role cannot be replayed as the other. The secret itself never crosses the wire.
//! Without TLS a man in the middle could relay a whole exchange: CLUSTER.md §12 assumes a
//! private cluster network, and the Raft mTLS files close that gap where it is not.
//!
//! Every message is bounded ([`HANDSHAKE_BODY_BYTES_MAX`]) before anything is authenticated.

use hmac::{Hmac, Mac};
use sha2::Sha256;

pub const HELLO_MAGIC: [u8; 4] = *b"NRPH";
/// The node-to-node protocol version this build speaks (frames and operations).
pub const PROTOCOL_VERSION: u8 = 1;
pub const NONCE_BYTES: usize = 32;
pub const PROOF_BYTES: usize = 32;
/// Longest node id carried in a handshake (the config allows 255 bytes).
pub const NODE_ID_BYTES_MAX: usize = 255;
/// Largest handshake body accepted before the peer has proved the secret.
pub const HANDSHAKE_BODY_BYTES_MAX: usize = 512;
/// Longest refusal text carried by a [`Verdict`].
const REASON_BYTES_MAX: usize = 200;

type HmacSha256 = Hmac<Sha256>;

/// The shared cluster secret (`NARAD_CLUSTER_SECRET`). Never printed.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl Secret {
    pub fn new(bytes: impl Into<Vec<u8>>) -> Secret {
        Secret(bytes.into())
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Which side of a connection a proof speaks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Opened the connection.
    Dialer,
    /// Accepted it.
    Listener,
}

impl Role {
    fn label(self) -> &'static [u8] {
        match self {
            Role::Dialer => b"narad-peer-v1 dialer",
            Role::Listener => b"narad-peer-v1 listener",
        }
    }
}

/// The bytes both sides prove over: nonces and ids of this connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transcript {
    pub dialer_id: String,
    pub dialer_nonce: [u8; NONCE_BYTES],
    pub listener_id: String,
    pub listener_nonce: [u8; NONCE_BYTES],
}

impl Transcript {
    fn mac(&self, secret: &Secret, role: Role) -> HmacSha256 {
        let mut m = HmacSha256::new_from_slice(&secret.0).expect("HMAC takes a key of any length");
        m.update(role.label());
        m.update(&self.dialer_nonce);
        m.update(&self.listener_nonce);
        for id in [&self.dialer_id, &self.listener_id] {
            m.update(&(id.len() as u16).to_le_bytes());
            m.update(id.as_bytes());
        }
        m
    }

    /// The proof `role` sends.
    pub fn prove(&self, secret: &Secret, role: Role) -> [u8; PROOF_BYTES] {
        self.mac(secret, role).finalize().into_bytes().into()
    }

    /// Whether `proof` is `role`'s proof under `secret` (constant-time comparison).
    pub fn verify(&self, secret: &Secret, role: Role, proof: &[u8]) -> bool {
        self.mac(secret, role).verify_slice(proof).is_ok()
    }
}

/// Why handshake bytes are not the expected message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProofError {
    TooLong(usize),
    Truncated,
    BadMagic,
    /// The peer speaks another protocol version.
    Version(u8),
    BadNodeId,
    Trailing,
}

impl std::fmt::Display for ProofError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProofError::TooLong(n) => write!(
                f,
                "handshake message of {n} bytes is over the {HANDSHAKE_BODY_BYTES_MAX}-byte limit"
            ),
            ProofError::Truncated => f.write_str("truncated handshake message"),
            ProofError::BadMagic => f.write_str("not a narad cluster handshake"),
            ProofError::Version(v) => write!(
                f,
                "the peer speaks cluster protocol version {v}, this node {PROTOCOL_VERSION}"
            ),
            ProofError::BadNodeId => {
                f.write_str("node id in the handshake is empty, too long or not UTF-8")
            }
            ProofError::Trailing => f.write_str("bytes after the handshake message"),
        }
    }
}

impl std::error::Error for ProofError {}

/// Reads fields off a handshake body, failing on any shortfall.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn new(b: &'a [u8]) -> Result<Reader<'a>, ProofError> {
        if b.len() > HANDSHAKE_BODY_BYTES_MAX {
            return Err(ProofError::TooLong(b.len()));
        }
        Ok(Reader(b))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ProofError> {
        if self.0.len() < n {
            return Err(ProofError::Truncated);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], ProofError> {
        Ok(self.take(N)?.try_into().expect("took N bytes"))
    }

    fn id(&mut self) -> Result<String, ProofError> {
        let n = self.take(1)?[0] as usize;
        let b = self.take(n)?;
        match std::str::from_utf8(b) {
            Ok(s) if !s.is_empty() => Ok(s.to_string()),
            _ => Err(ProofError::BadNodeId),
        }
    }

    fn end(self) -> Result<(), ProofError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ProofError::Trailing)
        }
    }
}

fn put_id(out: &mut Vec<u8>, id: &str) {
    let b = id.as_bytes();
    let n = b.len().min(NODE_ID_BYTES_MAX);
    out.push(n as u8);
    out.extend_from_slice(&b[..n]);
}

/// Step 1, dialer → listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    pub node_id: String,
    pub nonce: [u8; NONCE_BYTES],
}

impl Hello {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(6 + NONCE_BYTES + self.node_id.len());
        out.extend_from_slice(&HELLO_MAGIC);
        out.push(PROTOCOL_VERSION);
        out.extend_from_slice(&self.nonce);
        put_id(&mut out, &self.node_id);
        out
    }

    pub fn decode(b: &[u8]) -> Result<Hello, ProofError> {
        let mut r = Reader::new(b)?;
        if r.take(4).map_err(|_| ProofError::BadMagic)? != HELLO_MAGIC {
            return Err(ProofError::BadMagic);
        }
        let v = r.take(1)?[0];
        if v != PROTOCOL_VERSION {
            return Err(ProofError::Version(v));
        }
        let nonce = r.array()?;
        let node_id = r.id()?;
        r.end()?;
        Ok(Hello { node_id, nonce })
    }
}

/// Step 2, listener → dialer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Challenge {
    pub node_id: String,
    pub nonce: [u8; NONCE_BYTES],
    pub proof: [u8; PROOF_BYTES],
}

impl Challenge {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + NONCE_BYTES + PROOF_BYTES + self.node_id.len());
        out.extend_from_slice(&self.nonce);
        out.extend_from_slice(&self.proof);
        put_id(&mut out, &self.node_id);
        out
    }

    pub fn decode(b: &[u8]) -> Result<Challenge, ProofError> {
        let mut r = Reader::new(b)?;
        let nonce = r.array()?;
        let proof = r.array()?;
        let node_id = r.id()?;
        r.end()?;
        Ok(Challenge {
            node_id,
            nonce,
            proof,
        })
    }
}

/// Step 3, dialer → listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub proof: [u8; PROOF_BYTES],
}

impl Answer {
    pub fn encode(&self) -> Vec<u8> {
        self.proof.to_vec()
    }

    pub fn decode(b: &[u8]) -> Result<Answer, ProofError> {
        let mut r = Reader::new(b)?;
        let proof = r.array()?;
        r.end()?;
        Ok(Answer { proof })
    }
}

/// Step 4, listener → dialer: the connection is open, or why not (a wrong secret, a tombstoned
/// id). The dialer logs the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Accepted,
    Refused(String),
}

impl Verdict {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Verdict::Accepted => vec![0],
            Verdict::Refused(why) => {
                let mut out = vec![1];
                let mut n = why.len().min(REASON_BYTES_MAX);
                while !why.is_char_boundary(n) {
                    n -= 1;
                }
                out.extend_from_slice(&why.as_bytes()[..n]);
                out
            }
        }
    }

    pub fn decode(b: &[u8]) -> Result<Verdict, ProofError> {
        let mut r = Reader::new(b)?;
        match r.take(1)?[0] {
            0 => {
                r.end()?;
                Ok(Verdict::Accepted)
            }
            _ => Ok(Verdict::Refused(String::from_utf8_lossy(r.0).into_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcript() -> Transcript {
        Transcript {
            dialer_id: "n1".into(),
            dialer_nonce: [1; NONCE_BYTES],
            listener_id: "n2".into(),
            listener_nonce: [2; NONCE_BYTES],
        }
    }

    #[test]
    fn proofs_bind_secret_role_nonces_and_ids() {
        // Proves a proof verifies only under the same secret, role, nonces and ids: a wrong
        // secret, the other role's proof, another connection's nonce or a swapped id all fail.
        let s = Secret::new(b"right".to_vec());
        let t = transcript();
        let p = t.prove(&s, Role::Dialer);
        assert!(t.verify(&s, Role::Dialer, &p));
        assert!(!t.verify(&Secret::new(b"wrong".to_vec()), Role::Dialer, &p));
        assert!(!t.verify(&s, Role::Listener, &p));
        let mut other = t.clone();
        other.listener_nonce[0] ^= 1;
        assert!(!other.verify(&s, Role::Dialer, &p));
        let mut swapped = t.clone();
        std::mem::swap(&mut swapped.dialer_id, &mut swapped.listener_id);
        assert!(!swapped.verify(&s, Role::Dialer, &p));
        assert!(!t.verify(&s, Role::Dialer, &p[..31]));
        // Ids are length-prefixed: ("n1","n2") and ("n","1n2") differ.
        let mut shifted = t.clone();
        shifted.dialer_id = "n".into();
        shifted.listener_id = "1n2".into();
        assert!(!shifted.verify(&s, Role::Dialer, &p));
    }

    #[test]
    fn messages_round_trip_and_refuse_bad_bytes() {
        // Proves each message decodes to what was encoded, and that truncation, trailing bytes,
        // a wrong magic or version, an empty id and an oversized body are refused.
        let h = Hello {
            node_id: "node-a".into(),
            nonce: [7; NONCE_BYTES],
        };
        let b = h.encode();
        assert_eq!(Hello::decode(&b), Ok(h.clone()));
        for n in 0..b.len() {
            assert!(Hello::decode(&b[..n]).is_err(), "prefix {n}");
        }
        let mut long = b.clone();
        long.push(0);
        assert_eq!(Hello::decode(&long), Err(ProofError::Trailing));
        let mut v = b.clone();
        v[4] = 9;
        assert_eq!(Hello::decode(&v), Err(ProofError::Version(9)));
        let mut m = b.clone();
        m[0] = b'X';
        assert_eq!(Hello::decode(&m), Err(ProofError::BadMagic));
        let empty = Hello {
            node_id: String::new(),
            nonce: [0; NONCE_BYTES],
        };
        assert_eq!(Hello::decode(&empty.encode()), Err(ProofError::BadNodeId));
        assert_eq!(Hello::decode(&[0u8; 600]), Err(ProofError::TooLong(600)));
        let c = Challenge {
            node_id: "node-b".into(),
            nonce: [3; NONCE_BYTES],
            proof: [4; PROOF_BYTES],
        };
        assert_eq!(Challenge::decode(&c.encode()), Ok(c));
        let a = Answer {
            proof: [5; PROOF_BYTES],
        };
        assert_eq!(Answer::decode(&a.encode()), Ok(a));
        assert_eq!(
            Verdict::decode(&Verdict::Accepted.encode()),
            Ok(Verdict::Accepted)
        );
        let r = Verdict::Refused("wrong cluster secret".into());
        assert_eq!(Verdict::decode(&r.encode()), Ok(r));
        assert_eq!(
            Verdict::decode(&Verdict::Refused("é".repeat(150)).encode()),
            Ok(Verdict::Refused("é".repeat(100)))
        );
    }
}
