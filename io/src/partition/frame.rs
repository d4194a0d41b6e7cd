//! The frames of a partition segment file: the file header and one record frame per offset.
//! Byte-by-byte layout in `io/FORMAT.md` (section "Partition segments").
//!
//! Owns: encoding and decoding, length bounds, checksums. Never does I/O. Every decode function
//! returns an error value on any input (never panics, whatever the bytes): a frame is trusted
//! only after its length is bounded and its CRC verified.
//!
//! Checksums are CRC-32/IEEE ([`crate::checksum::crc32_ieee`]), like the WAL's (`io/FORMAT.md`,
//! "Checksums"). Integers are little-endian.

use crate::checksum::crc32_ieee;
use crate::types::{Offset, PartitionKey, UnixMillis};

pub const SEGMENT_MAGIC: [u8; 8] = *b"NARADSEG";
pub const SEGMENT_VERSION: u16 = 1;
/// magic(8) version(2) header_len(2) partition(4) topic(8) base_offset(8) reserved(4) crc(4).
pub const SEGMENT_HEADER_BYTES: usize = 40;

/// len(4) crc(4) type(1) version(1) flags(1) reserved(1) key_len(4) offset(8) commit_ms(8).
pub const FRAME_HEADER_BYTES: usize = 32;
pub const FRAME_VERSION: u8 = 1;
/// Hard bound on one frame (header + key + payload), checked before the length is used.
pub const FRAME_BYTES_MAX: usize = 16 << 20;

pub const TYPE_MESSAGE: u8 = 1;
/// Placeholder for an offset whose record was lost (recovery gap): reads of it answer
/// `Corrupt`, so that offsets stay dense and a queue consumer can skip it visibly.
pub const TYPE_GAP: u8 = 2;

const FLAG_HAS_KEY: u8 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// Fewer bytes than a header or than the frame claims.
    Truncated,
    BadLength(u32),
    BadCrc,
    BadVersion(u8),
    BadType(u8),
    BadKeyLength,
}

/// One decoded frame, borrowing key and payload from the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    Message {
        offset: Offset,
        commit_ms: UnixMillis,
        msg_key: Option<&'a [u8]>,
        payload: &'a [u8],
    },
    Gap {
        offset: Offset,
    },
}

impl Frame<'_> {
    pub fn offset(&self) -> Offset {
        match self {
            Frame::Message { offset, .. } | Frame::Gap { offset } => *offset,
        }
    }
}

/// Bytes one message frame takes.
pub fn message_frame_len(msg_key: Option<&[u8]>, payload: &[u8]) -> usize {
    FRAME_HEADER_BYTES + msg_key.map_or(0, <[u8]>::len) + payload.len()
}

fn put_header(
    out: &mut Vec<u8>,
    ty: u8,
    flags: u8,
    key_len: u32,
    offset: Offset,
    commit_ms: UnixMillis,
) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0u8; 8]); // len + crc, filled by `seal`
    out.extend_from_slice(&[ty, FRAME_VERSION, flags, 0]);
    out.extend_from_slice(&key_len.to_le_bytes());
    out.extend_from_slice(&offset.0.to_le_bytes());
    out.extend_from_slice(&commit_ms.0.to_le_bytes());
    start
}

fn seal(out: &mut [u8], start: usize) {
    let len = (out.len() - start) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    let c = crc32_ieee(&out[start + 8..]);
    out[start + 4..start + 8].copy_from_slice(&c.to_le_bytes());
}

/// Appends one message frame to `out`. The caller bounds the size (`FRAME_BYTES_MAX`) first.
pub fn encode_message(
    out: &mut Vec<u8>,
    offset: Offset,
    commit_ms: UnixMillis,
    msg_key: Option<&[u8]>,
    payload: &[u8],
) {
    let len = message_frame_len(msg_key, payload);
    assert!(len <= FRAME_BYTES_MAX, "caller must bound the frame size");
    let (flags, key) = match msg_key {
        Some(k) => (FLAG_HAS_KEY, k),
        None => (0, &[][..]),
    };
    let start = put_header(
        out,
        TYPE_MESSAGE,
        flags,
        key.len() as u32,
        offset,
        commit_ms,
    );
    out.extend_from_slice(key);
    out.extend_from_slice(payload);
    seal(out, start);
}

/// Appends one gap frame (an offset whose record was lost) to `out`.
pub fn encode_gap(out: &mut Vec<u8>, offset: Offset) {
    let start = put_header(out, TYPE_GAP, 0, 0, offset, UnixMillis(0));
    seal(out, start);
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Decodes the frame at the start of `buf`. Returns the frame and its length in bytes.
pub fn decode(buf: &[u8]) -> Result<(Frame<'_>, usize), FrameError> {
    if buf.len() < FRAME_HEADER_BYTES {
        return Err(FrameError::Truncated);
    }
    let len = u32_at(buf, 0);
    if (len as usize) < FRAME_HEADER_BYTES || len as usize > FRAME_BYTES_MAX {
        return Err(FrameError::BadLength(len));
    }
    let len = len as usize;
    if buf.len() < len {
        return Err(FrameError::Truncated);
    }
    let f = &buf[..len];
    if crc32_ieee(&f[8..]) != u32_at(f, 4) {
        return Err(FrameError::BadCrc);
    }
    let (ty, version, flags) = (f[8], f[9], f[10]);
    if version != FRAME_VERSION {
        return Err(FrameError::BadVersion(version));
    }
    let key_len = u32_at(f, 12) as usize;
    let offset = Offset(u64_at(f, 16));
    let commit_ms = UnixMillis(u64_at(f, 24));
    match ty {
        TYPE_MESSAGE => {
            if key_len > len - FRAME_HEADER_BYTES || (flags & FLAG_HAS_KEY == 0 && key_len != 0) {
                return Err(FrameError::BadKeyLength);
            }
            let key_end = FRAME_HEADER_BYTES + key_len;
            let msg_key = (flags & FLAG_HAS_KEY != 0).then(|| &f[FRAME_HEADER_BYTES..key_end]);
            Ok((
                Frame::Message {
                    offset,
                    commit_ms,
                    msg_key,
                    payload: &f[key_end..],
                },
                len,
            ))
        }
        TYPE_GAP => {
            if len != FRAME_HEADER_BYTES {
                return Err(FrameError::BadLength(len as u32));
            }
            Ok((Frame::Gap { offset }, len))
        }
        other => Err(FrameError::BadType(other)),
    }
}

/// The 40-byte header every segment file starts with.
pub fn encode_segment_header(key: PartitionKey, base: Offset) -> [u8; SEGMENT_HEADER_BYTES] {
    let mut h = [0u8; SEGMENT_HEADER_BYTES];
    h[0..8].copy_from_slice(&SEGMENT_MAGIC);
    h[8..10].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
    h[10..12].copy_from_slice(&(SEGMENT_HEADER_BYTES as u16).to_le_bytes());
    h[12..16].copy_from_slice(&key.partition.0.to_le_bytes());
    h[16..24].copy_from_slice(&key.topic.0.to_le_bytes());
    h[24..32].copy_from_slice(&base.0.to_le_bytes());
    let c = crc32_ieee(&h[..36]);
    h[36..40].copy_from_slice(&c.to_le_bytes());
    h
}

/// Checks a segment header against the partition and base offset its path names.
pub fn check_segment_header(buf: &[u8], key: PartitionKey, base: Offset) -> bool {
    buf.len() >= SEGMENT_HEADER_BYTES
        && buf[..SEGMENT_HEADER_BYTES] == encode_segment_header(key, base)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{PartitionId, TopicId};

    fn sample() -> Vec<u8> {
        let mut v = Vec::new();
        encode_message(
            &mut v,
            Offset(7),
            UnixMillis(1234),
            Some(b"k1"),
            b"hello payload",
        );
        v
    }

    #[test]
    fn message_and_gap_round_trip() {
        // Proves encode/decode round-trips message frames (with and without key, empty payload)
        // and gap frames, and reports the frame length.
        let mut v = Vec::new();
        encode_message(&mut v, Offset(1), UnixMillis(5), None, b"");
        encode_message(&mut v, Offset(2), UnixMillis(6), Some(b""), b"p");
        encode_gap(&mut v, Offset(3));
        let (f, n1) = decode(&v).unwrap();
        assert_eq!(
            f,
            Frame::Message {
                offset: Offset(1),
                commit_ms: UnixMillis(5),
                msg_key: None,
                payload: b""
            }
        );
        let (f, n2) = decode(&v[n1..]).unwrap();
        assert_eq!(
            f,
            Frame::Message {
                offset: Offset(2),
                commit_ms: UnixMillis(6),
                msg_key: Some(b""),
                payload: b"p"
            }
        );
        let (f, n3) = decode(&v[n1 + n2..]).unwrap();
        assert_eq!(f, Frame::Gap { offset: Offset(3) });
        assert_eq!(n1 + n2 + n3, v.len());
    }

    #[test]
    fn every_single_byte_corruption_is_detected() {
        // Proves that flipping any bit pattern in any single byte of a frame makes decode fail
        // (or, for the length field, never yields a different valid frame).
        let good = sample();
        for i in 0..good.len() {
            for x in [0x01u8, 0x80, 0xff] {
                let mut b = good.clone();
                b[i] ^= x;
                assert!(decode(&b).is_err(), "byte {i} xor {x:#x} not detected");
            }
        }
    }

    #[test]
    fn every_truncation_is_detected() {
        // Proves a frame cut at any byte is reported as an error, never decoded.
        let good = sample();
        for n in 0..good.len() {
            assert!(decode(&good[..n]).is_err());
        }
    }

    #[test]
    fn garbage_never_panics() {
        // Proves decode returns a value on arbitrary bytes (seeded xorshift; seed printed).
        let seed = 0x5eed_u64;
        let mut x = seed;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let n = (x % 80) as usize;
            let bytes: Vec<u8> = (0..n).map(|i| (x >> (i % 56)) as u8).collect();
            let _ = decode(&bytes);
        }
    }

    #[test]
    fn segment_header_checks_identity() {
        // Proves the header names its partition and base offset and rejects any other.
        let k = PartitionKey {
            topic: TopicId(9),
            partition: PartitionId(3),
        };
        let h = encode_segment_header(k, Offset(100));
        assert!(check_segment_header(&h, k, Offset(100)));
        assert!(!check_segment_header(&h, k, Offset(101)));
        assert!(!check_segment_header(&h[..39], k, Offset(100)));
    }
}

pub const INDEX_MAGIC: [u8; 8] = *b"NARADIDX";
pub const INDEX_VERSION: u16 = 1;
/// magic(8) version(2) reserved(2) count(4) base(8) size_bytes(8) first_commit_ms(8)
/// last_commit_ms(8), then count u32 positions, then crc(4).
pub const INDEX_HEADER_BYTES: usize = 48;
/// Commit-time value meaning "no message record in the segment".
const NO_TIME: u64 = u64::MAX;

/// The index of one sealed segment as stored in its `.idx` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentIndex {
    pub base: Offset,
    pub size_bytes: u64,
    pub first_commit_ms: Option<UnixMillis>,
    pub last_commit_ms: Option<UnixMillis>,
    pub positions: Vec<u32>,
}

pub fn encode_index(ix: &SegmentIndex) -> Vec<u8> {
    let mut v = Vec::with_capacity(INDEX_HEADER_BYTES + 4 * ix.positions.len() + 4);
    v.extend_from_slice(&INDEX_MAGIC);
    v.extend_from_slice(&INDEX_VERSION.to_le_bytes());
    v.extend_from_slice(&[0, 0]);
    v.extend_from_slice(&(ix.positions.len() as u32).to_le_bytes());
    v.extend_from_slice(&ix.base.0.to_le_bytes());
    v.extend_from_slice(&ix.size_bytes.to_le_bytes());
    v.extend_from_slice(&ix.first_commit_ms.map_or(NO_TIME, |t| t.0).to_le_bytes());
    v.extend_from_slice(&ix.last_commit_ms.map_or(NO_TIME, |t| t.0).to_le_bytes());
    for p in &ix.positions {
        v.extend_from_slice(&p.to_le_bytes());
    }
    let c = crc32_ieee(&v);
    v.extend_from_slice(&c.to_le_bytes());
    v
}

/// Decodes an index file; `None` on any damage (the caller then scans the segment instead).
pub fn decode_index(b: &[u8]) -> Option<SegmentIndex> {
    if b.len() < INDEX_HEADER_BYTES + 4
        || b[..8] != INDEX_MAGIC
        || u16::from_le_bytes([b[8], b[9]]) != INDEX_VERSION
    {
        return None;
    }
    let count = u32_at(b, 12) as usize;
    let body = INDEX_HEADER_BYTES.checked_add(count.checked_mul(4)?)?;
    if b.len() != body + 4 || crc32_ieee(&b[..body]) != u32_at(b, body) {
        return None;
    }
    let time = |at: usize| {
        Some(u64_at(b, at))
            .filter(|&t| t != NO_TIME)
            .map(UnixMillis)
    };
    let positions: Vec<u32> = (0..count)
        .map(|i| u32_at(b, INDEX_HEADER_BYTES + 4 * i))
        .collect();
    let size_bytes = u64_at(b, 24);
    if positions.windows(2).any(|w| w[0] > w[1])
        || positions.last().is_some_and(|&p| u64::from(p) > size_bytes)
    {
        return None;
    }
    Some(SegmentIndex {
        base: Offset(u64_at(b, 16)),
        size_bytes,
        first_commit_ms: time(32),
        last_commit_ms: time(40),
        positions,
    })
}

#[cfg(test)]
mod index_tests {
    use super::*;

    #[test]
    fn index_round_trip_and_corruption() {
        // Proves the sealed-segment index file round-trips and any single-byte corruption or
        // truncation is rejected (the segment is then scanned instead).
        let ix = SegmentIndex {
            base: Offset(1000),
            size_bytes: 500,
            first_commit_ms: Some(UnixMillis(5)),
            last_commit_ms: None,
            positions: vec![40, 90, 90, 300],
        };
        let b = encode_index(&ix);
        assert_eq!(decode_index(&b), Some(ix));
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x10;
            assert_eq!(decode_index(&c), None, "byte {i}");
            assert_eq!(decode_index(&b[..i]), None);
        }
    }
}
