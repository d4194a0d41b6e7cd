//! Node-to-node frames: the unit every message between two nodes travels in (CLUSTER.md §13 is
//! informative; the wire is ours). A frame is a 32-byte header and a body; the body is opaque
//! here (an rkyv archive of the operation or reply, the caller's business).
//!
//! Owns the byte layout and its checks. Never reads a socket, never trusts a length before the
//! header's checksum is verified, never copies a body: [`decode`] answers a frame that borrows
//! its body from the receive buffer (the caller copies it once, where it must be aligned for
//! rkyv). [`decode`] is incremental: given the bytes received so far it answers a whole frame,
//! "need more", or why the stream is unusable (the connection is then dropped: no resync).
//!
//! | offset | size | field | value |
//! |---|---|---|---|
//! | 0 | 4 | magic | `NRPC` |
//! | 4 | 1 | version | 1 |
//! | 5 | 1 | kind | 1 request, 2 reply, 3 one-way (no reply expected) |
//! | 6 | 2 | reserved | 0 |
//! | 8 | 8 | request id | chosen by the sender of a request, echoed by its reply |
//! | 16 | 4 | deadline ms | a request's remaining budget when sent (0 for replies) |
//! | 20 | 4 | body length | ≤ [`FRAME_BODY_BYTES_MAX`] |
//! | 24 | 4 | body CRC | CRC-32/IEEE of the body |
//! | 28 | 4 | header CRC | CRC-32/IEEE of bytes 0..28 |
//!
//! All integers little-endian.

use crate::checksum::crc32_ieee;

pub const FRAME_MAGIC: [u8; 4] = *b"NRPC";
pub const FRAME_VERSION: u8 = 1;
pub const FRAME_HEADER_BYTES: usize = 32;
/// Largest body a frame may carry (a transit hand-off is at most 256 KiB of records; a batch
/// produce forwarded whole is at most the 16 MiB batch body).
pub const FRAME_BODY_BYTES_MAX: usize = 32 << 20;

/// What a frame is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// Expects a [`FrameKind::Reply`] with the same request id.
    Request,
    Reply,
    /// Expects no answer (a heartbeat, a wake-up).
    OneWay,
}

impl FrameKind {
    fn code(self) -> u8 {
        match self {
            FrameKind::Request => 1,
            FrameKind::Reply => 2,
            FrameKind::OneWay => 3,
        }
    }

    fn of(code: u8) -> Option<FrameKind> {
        match code {
            1 => Some(FrameKind::Request),
            2 => Some(FrameKind::Reply),
            3 => Some(FrameKind::OneWay),
            _ => None,
        }
    }
}

/// One decoded frame; its body is a slice of the buffer it was decoded from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    pub kind: FrameKind,
    pub request_id: u64,
    /// A request's remaining budget in milliseconds when it was sent (0 for replies).
    pub deadline_ms: u32,
    pub body: &'a [u8],
}

/// Why received bytes are not a frame. Every one ends the connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameError {
    BadMagic,
    BadVersion(u8),
    BadKind(u8),
    /// Reserved bits set.
    Reserved,
    HeaderChecksum,
    BodyChecksum,
    /// A body longer than [`FRAME_BODY_BYTES_MAX`] (refused before anything is read for it).
    TooLong(u32),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::BadMagic => f.write_str("not a narad frame (bad magic)"),
            FrameError::BadVersion(v) => write!(f, "frame version {v} is not spoken here"),
            FrameError::BadKind(k) => write!(f, "unknown frame kind {k}"),
            FrameError::Reserved => f.write_str("reserved frame bits set"),
            FrameError::HeaderChecksum => f.write_str("frame header checksum mismatch"),
            FrameError::BodyChecksum => f.write_str("frame body checksum mismatch"),
            FrameError::TooLong(n) => write!(
                f,
                "frame body of {n} bytes is over the {FRAME_BODY_BYTES_MAX}-byte limit"
            ),
        }
    }
}

/// Appends the frame of `body` to `out`. Panics if the body is over [`FRAME_BODY_BYTES_MAX`]:
/// senders bound what they put in a frame (a bug otherwise, not a peer's fault).
pub fn encode(kind: FrameKind, request_id: u64, deadline_ms: u32, body: &[u8], out: &mut Vec<u8>) {
    assert!(
        body.len() <= FRAME_BODY_BYTES_MAX,
        "a frame body of {} bytes is over the limit",
        body.len()
    );
    let start = out.len();
    out.reserve(FRAME_HEADER_BYTES + body.len());
    out.extend_from_slice(&FRAME_MAGIC);
    out.push(FRAME_VERSION);
    out.push(kind.code());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&request_id.to_le_bytes());
    out.extend_from_slice(&deadline_ms.to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32_ieee(body).to_le_bytes());
    let header_crc = crc32_ieee(&out[start..start + 28]);
    out.extend_from_slice(&header_crc.to_le_bytes());
    out.extend_from_slice(body);
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The first frame of `buf` and how many bytes it took, or `None` when `buf` holds only part of
/// one (read more and call again). The header is verified (magic, checksum, version, kind,
/// reserved bits, length bound) before its length is used; the body before it is returned.
pub fn decode(buf: &[u8]) -> Result<Option<(Frame<'_>, usize)>, FrameError> {
    if buf.len() < FRAME_HEADER_BYTES {
        // A stream that cannot become a frame is refused as early as its first bytes show it.
        let n = buf.len().min(4);
        if buf[..n] != FRAME_MAGIC[..n] {
            return Err(FrameError::BadMagic);
        }
        return Ok(None);
    }
    let h = &buf[..FRAME_HEADER_BYTES];
    if h[..4] != FRAME_MAGIC {
        return Err(FrameError::BadMagic);
    }
    if u32_at(h, 28) != crc32_ieee(&h[..28]) {
        return Err(FrameError::HeaderChecksum);
    }
    if h[4] != FRAME_VERSION {
        return Err(FrameError::BadVersion(h[4]));
    }
    let kind = FrameKind::of(h[5]).ok_or(FrameError::BadKind(h[5]))?;
    if h[6] != 0 || h[7] != 0 {
        return Err(FrameError::Reserved);
    }
    let len = u32_at(h, 20);
    if len as usize > FRAME_BODY_BYTES_MAX {
        return Err(FrameError::TooLong(len));
    }
    let total = FRAME_HEADER_BYTES + len as usize;
    if buf.len() < total {
        return Ok(None);
    }
    let body = &buf[FRAME_HEADER_BYTES..total];
    if u32_at(h, 24) != crc32_ieee(body) {
        return Err(FrameError::BodyChecksum);
    }
    let request_id = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
    Ok(Some((
        Frame {
            kind,
            request_id,
            deadline_ms: u32_at(h, 16),
            body,
        },
        total,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: FrameKind, id: u64, deadline_ms: u32, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode(kind, id, deadline_ms, body, &mut out);
        out
    }

    #[test]
    fn frames_round_trip_back_to_back_and_arrive_in_any_pieces() {
        // Proves the layout: frames decode to what was encoded, one after another in one
        // buffer, and every prefix of a frame answers "need more" rather than an error.
        let a = frame(FrameKind::Request, 7, 30_000, b"append");
        let b = frame(FrameKind::Reply, 7, 0, b"");
        let c = frame(FrameKind::OneWay, u64::MAX, 0, &[0xab; 5000]);
        let stream = [a.clone(), b.clone(), c.clone()].concat();
        let mut at = 0;
        let mut got = Vec::new();
        while at < stream.len() {
            let (f, n) = decode(&stream[at..]).unwrap().expect("whole frame");
            got.push(f);
            at += n;
        }
        assert_eq!(got.len(), 3);
        assert_eq!(
            got[0],
            Frame {
                kind: FrameKind::Request,
                request_id: 7,
                deadline_ms: 30_000,
                body: b"append"
            }
        );
        assert_eq!((got[1].kind, got[1].body.len()), (FrameKind::Reply, 0));
        assert_eq!((got[2].request_id, got[2].body.len()), (u64::MAX, 5000));
        for f in [&a, &b, &c] {
            for cut in 0..f.len() {
                assert_eq!(decode(&f[..cut]), Ok(None), "prefix of {cut} bytes");
            }
        }
    }

    #[test]
    fn every_damaged_byte_is_refused_and_lengths_are_checked_first() {
        // Proves nothing is trusted unverified: every single-byte change of a frame is an
        // error (header checksum, or body checksum for body bytes), never a frame; a header
        // claiming a body over the limit is refused at once, without waiting for the body;
        // a stream that starts with the wrong bytes is refused from its first byte.
        let f = frame(FrameKind::Request, 42, 1000, b"settle these leases");
        for i in 0..f.len() {
            let mut d = f.clone();
            d[i] ^= 0x01;
            let e = decode(&d).expect_err("a changed byte must not decode");
            if i >= FRAME_HEADER_BYTES {
                assert_eq!(e, FrameError::BodyChecksum);
            }
        }
        let mut big = Vec::new();
        encode(FrameKind::Request, 1, 0, b"", &mut big);
        big[20..24].copy_from_slice(&(FRAME_BODY_BYTES_MAX as u32 + 1).to_le_bytes());
        let crc = crc32_ieee(&big[..28]);
        big[28..32].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            decode(&big),
            Err(FrameError::TooLong(FRAME_BODY_BYTES_MAX as u32 + 1))
        );
        let mut v2 = f.clone();
        v2[4] = 2;
        let crc = crc32_ieee(&v2[..28]);
        v2[28..32].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode(&v2), Err(FrameError::BadVersion(2)));
        assert_eq!(decode(b"GET / HTTP/1.1\r\n"), Err(FrameError::BadMagic));
        assert_eq!(decode(b"NRX"), Err(FrameError::BadMagic));
        assert_eq!(decode(b"NR"), Ok(None));
    }
}
