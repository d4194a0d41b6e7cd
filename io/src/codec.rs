//! The on-disk frames of the write-ahead log: one record frame per [`WalRecord`] and one batch
//! header per group-commit unit. Byte-by-byte layout in `io/FORMAT.md`.
//!
//! Owns: encoding and decoding, length bounds, checksums. Never does I/O and never trusts a byte
//! before its length is bounded and its checksum verified: every decode function returns an error
//! value on any input (it never panics, whatever the bytes), and the tests below feed it every
//! single-byte corruption of valid frames and random garbage.
//!
//! Checksums are CRC-32/IEEE ([`crate::checksum::crc32_ieee`]; why not CRC32C: `io/FORMAT.md`,
//! "Checksums"). All integers are little-endian.

use crate::checksum;
use crate::types::{
    Destination, MemberId, Offset, PartitionId, PartitionKey, ShardId, SharedBytes, TopicId,
    UnixMillis,
};

/// Position in the WAL: segment sequence number and byte offset inside that segment.
/// Ordered first by segment, then by byte, which is log order.
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Debug, Hash, Default)]
pub struct WalPosition {
    pub segment: u64,
    pub byte: u64,
}

/// One logical record. The WAL frames it and never interprets it, except `Checkpoint`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WalRecord {
    Message {
        key: PartitionKey,
        offset: Offset,
        commit_ms: UnixMillis,
        msg_key: Option<Vec<u8>>,
        payload: SharedBytes,
    },
    /// Accepted here for a partition owned by another shard (or node), until handed over.
    /// `seq` counts the transit records of one destination in WAL order. `dest` is `None` only
    /// in a version-1 record (written before destinations were stored): its destination is the
    /// owner shard of `key` on this node, which the reader works out.
    Transit {
        dest: Option<Destination>,
        key: PartitionKey,
        seq: u64,
        commit_ms: UnixMillis,
        msg_key: Option<Vec<u8>>,
        payload: SharedBytes,
    },
    /// Acks made durable.
    Settle {
        key: PartitionKey,
        offsets: Vec<Offset>,
    },
    /// Everything before `upto` is materialised elsewhere. `marks` holds, for every partition
    /// of the shard, the offset one past its last record materialised then (its next offset):
    /// recovery knows that every offset below a mark was durable, so damage at the end of a
    /// partition's files cannot pass for a torn tail and hand its offsets out again. Written
    /// as a count and entries after `upto`; a body of `upto` alone (older logs) has none.
    Checkpoint {
        upto: WalPosition,
        marks: Vec<(PartitionKey, Offset)>,
    },
    /// Every transit record for `dest` with `seq < upto` reached its owner.
    Handed { dest: Destination, upto: u64 },
}

pub const RECORD_MAGIC: [u8; 2] = *b"NR";
/// The version of Message, Settle and Checkpoint frames, and of Transit frames without a
/// destination.
pub const RECORD_VERSION: u8 = 1;
/// The version of Transit and Handed frames that carry a [`Destination`] (written since the
/// destination could name a node; version 1 of both is still read).
pub const RECORD_VERSION_DEST: u8 = 2;
/// A stored destination: kind(1) then id(8).
const DEST_BYTES: usize = 9;
const DEST_SHARD: u8 = 0;
const DEST_NODE: u8 = 1;
/// magic(2) type(1) version(1) body_len(4) crc(4).
pub const RECORD_HEADER_BYTES: usize = 12;
/// Hard bound on one record body, checked before the length is used for anything.
pub const RECORD_BODY_BYTES_MAX: usize = 64 << 20;
/// One checkpoint mark: topic(8) partition(4) next offset(8).
const MARK_BYTES: usize = 20;
/// `key_len` value meaning "no message key".
const KEY_NONE: u32 = u32::MAX;

pub const TYPE_MESSAGE: u8 = 1;
pub const TYPE_TRANSIT: u8 = 2;
pub const TYPE_SETTLE: u8 = 3;
pub const TYPE_CHECKPOINT: u8 = 4;
pub const TYPE_HANDED: u8 = 5;

pub const BATCH_MAGIC: [u8; 4] = *b"NWAL";
/// Version 2: the header checksum also covers the number of the segment the batch was written
/// into, so a batch is valid only in that segment (a recycled segment file's old batches are not).
pub const BATCH_VERSION: u8 = 2;
/// Version 1 (written before segments were recycled): the header checksum covers the header
/// alone. Still read; never written.
pub const BATCH_VERSION_UNBOUND: u8 = 1;
pub const BATCH_KIND: u8 = 0xB1;
/// magic(4) version(1) kind(1) flags(1) reserved(1) seq(8) payload_len(4) record_count(4) payload_crc(4)
/// header_crc(4), the CRC of bytes 0..28 followed by the segment number (u64).
pub const BATCH_HEADER_BYTES: usize = 32;
/// Bits of the batch flags byte holding how many earlier batches were still in flight (written
/// but not yet fdatasync'ed, read back and resolved) when this batch was started: 0 without
/// pipelining. Recovery uses it to tell lost in-flight predecessors from corruption.
pub const BATCH_FLAGS_IN_FLIGHT_MASK: u8 = 0x07;
/// Every batch starts on this boundary and is zero-padded up to the next one: the unit of one
/// O_DIRECT write.
pub const BATCH_ALIGN: usize = 4096;
/// Hard bound on one batch payload, checked before the length is used.
pub const BATCH_PAYLOAD_BYTES_MAX: usize = 256 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the frame claims (or than a header).
    Truncated,
    BadMagic,
    BadVersion(u8),
    BadType(u8),
    /// A length beyond its hard bound.
    TooLong(u64),
    Checksum {
        stored: u32,
        computed: u32,
    },
    /// Checksum good but the body does not parse: a writer bug, never expected.
    Malformed(&'static str),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Truncated => write!(f, "truncated frame"),
            DecodeError::BadMagic => write!(f, "bad magic"),
            DecodeError::BadVersion(v) => write!(f, "unknown version {v}"),
            DecodeError::BadType(t) => write!(f, "unknown record type {t}"),
            DecodeError::TooLong(n) => write!(f, "length {n} beyond bound"),
            DecodeError::Checksum { stored, computed } => {
                write!(
                    f,
                    "checksum mismatch (stored {stored:08x}, computed {computed:08x})"
                )
            }
            DecodeError::Malformed(m) => write!(f, "malformed body: {m}"),
        }
    }
}

fn key_bytes(k: &Option<Vec<u8>>) -> usize {
    4 + k.as_ref().map_or(0, |k| k.len())
}

fn body_len(r: &WalRecord) -> usize {
    match r {
        WalRecord::Message {
            msg_key, payload, ..
        } => 8 + 4 + 8 + 8 + key_bytes(msg_key) + 4 + payload.len(),
        WalRecord::Transit {
            dest,
            msg_key,
            payload,
            ..
        } => {
            dest.map_or(0, |_| DEST_BYTES) + 8 + 4 + 8 + 8 + key_bytes(msg_key) + 4 + payload.len()
        }
        WalRecord::Settle { offsets, .. } => 8 + 4 + 4 + 8 * offsets.len(),
        WalRecord::Checkpoint { marks, .. } => 16 + 4 + MARK_BYTES * marks.len(),
        WalRecord::Handed { .. } => DEST_BYTES + 8,
    }
}

/// Bytes the frame of `r` takes on disk (header + body).
pub fn encoded_len(r: &WalRecord) -> usize {
    RECORD_HEADER_BYTES + body_len(r)
}

/// Why a record cannot be encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooLarge;

/// Appends the frame of `r` to `out`. Fails (writing nothing) when the body exceeds
/// [`RECORD_BODY_BYTES_MAX`] or a key/payload exceeds what a u32 length holds.
pub fn encode_record(r: &WalRecord, out: &mut Vec<u8>) -> Result<(), TooLarge> {
    let body = body_len(r);
    if body > RECORD_BODY_BYTES_MAX {
        return Err(TooLarge);
    }
    let start = out.len();
    out.reserve(RECORD_HEADER_BYTES + body);
    out.extend_from_slice(&RECORD_MAGIC);
    let ty = match r {
        WalRecord::Message { .. } => TYPE_MESSAGE,
        WalRecord::Transit { .. } => TYPE_TRANSIT,
        WalRecord::Settle { .. } => TYPE_SETTLE,
        WalRecord::Checkpoint { .. } => TYPE_CHECKPOINT,
        WalRecord::Handed { .. } => TYPE_HANDED,
    };
    let version = match r {
        WalRecord::Transit { dest: Some(_), .. } | WalRecord::Handed { .. } => RECORD_VERSION_DEST,
        _ => RECORD_VERSION,
    };
    out.push(ty);
    out.push(version);
    out.extend_from_slice(&(body as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]); // crc, filled below
    match r {
        WalRecord::Message {
            key,
            offset,
            commit_ms,
            msg_key,
            payload,
        } => {
            put_key(out, *key);
            out.extend_from_slice(&offset.0.to_le_bytes());
            out.extend_from_slice(&commit_ms.0.to_le_bytes());
            put_bytes_opt(out, msg_key);
            put_bytes(out, payload);
        }
        WalRecord::Transit {
            dest,
            key,
            seq,
            commit_ms,
            msg_key,
            payload,
        } => {
            if let Some(d) = dest {
                put_dest(out, *d);
            }
            put_key(out, *key);
            out.extend_from_slice(&seq.to_le_bytes());
            out.extend_from_slice(&commit_ms.0.to_le_bytes());
            put_bytes_opt(out, msg_key);
            put_bytes(out, payload);
        }
        WalRecord::Settle { key, offsets } => {
            put_key(out, *key);
            out.extend_from_slice(&(offsets.len() as u32).to_le_bytes());
            for o in offsets {
                out.extend_from_slice(&o.0.to_le_bytes());
            }
        }
        WalRecord::Checkpoint { upto, marks } => {
            out.extend_from_slice(&upto.segment.to_le_bytes());
            out.extend_from_slice(&upto.byte.to_le_bytes());
            out.extend_from_slice(&(marks.len() as u32).to_le_bytes());
            for (key, next) in marks {
                put_key(out, *key);
                out.extend_from_slice(&next.0.to_le_bytes());
            }
        }
        WalRecord::Handed { dest, upto } => {
            put_dest(out, *dest);
            out.extend_from_slice(&upto.to_le_bytes());
        }
    }
    debug_assert_eq!(out.len() - start, RECORD_HEADER_BYTES + body);
    let crc = record_crc(&out[start..]);
    out[start + 8..start + 12].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// CRC over header bytes 0..8 and the body (the crc field itself excluded).
fn record_crc(frame: &[u8]) -> u32 {
    checksum::crc32_ieee_parts(&[&frame[..8], &frame[RECORD_HEADER_BYTES..]])
}

fn put_dest(out: &mut Vec<u8>, d: Destination) {
    let (kind, id) = match d {
        Destination::Shard(s) => (DEST_SHARD, u64::from(s.0)),
        Destination::Node(m) => (DEST_NODE, m.0),
    };
    out.push(kind);
    out.extend_from_slice(&id.to_le_bytes());
}

fn put_key(out: &mut Vec<u8>, k: PartitionKey) {
    out.extend_from_slice(&k.topic.0.to_le_bytes());
    out.extend_from_slice(&k.partition.0.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_bytes_opt(out: &mut Vec<u8>, b: &Option<Vec<u8>>) {
    match b {
        Some(b) => put_bytes(out, b),
        None => out.extend_from_slice(&KEY_NONE.to_le_bytes()),
    }
}

/// Reads the frame at the start of `buf`. Returns the record and the frame's length.
pub fn decode_record(buf: &[u8]) -> Result<(WalRecord, usize), DecodeError> {
    if buf.len() < RECORD_HEADER_BYTES {
        return Err(DecodeError::Truncated);
    }
    if buf[0..2] != RECORD_MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let ty = buf[2];
    let version = buf[3];
    let body = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]) as usize;
    if body > RECORD_BODY_BYTES_MAX {
        return Err(DecodeError::TooLong(body as u64));
    }
    let total = RECORD_HEADER_BYTES + body;
    if buf.len() < total {
        return Err(DecodeError::Truncated);
    }
    let frame = &buf[..total];
    let stored = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]);
    let computed = record_crc(frame);
    if stored != computed {
        return Err(DecodeError::Checksum { stored, computed });
    }
    // Version and type are covered by the checksum; check them after it so that a flipped bit
    // reports as a checksum error, the common case.
    let with_dest = match (ty, version) {
        (TYPE_TRANSIT | TYPE_HANDED, RECORD_VERSION_DEST) => true,
        (_, RECORD_VERSION) => false,
        _ => return Err(DecodeError::BadVersion(version)),
    };
    let mut r = Reader {
        b: &frame[RECORD_HEADER_BYTES..],
    };
    let rec = match ty {
        TYPE_MESSAGE => {
            let key = r.key()?;
            let offset = Offset(r.u64()?);
            let commit_ms = UnixMillis(r.u64()?);
            let msg_key = r.bytes_opt()?;
            let payload = SharedBytes::from(r.bytes()?.to_vec());
            WalRecord::Message {
                key,
                offset,
                commit_ms,
                msg_key,
                payload,
            }
        }
        TYPE_TRANSIT => {
            let dest = if with_dest { Some(r.dest()?) } else { None };
            let key = r.key()?;
            let seq = r.u64()?;
            let commit_ms = UnixMillis(r.u64()?);
            let msg_key = r.bytes_opt()?;
            let payload = SharedBytes::from(r.bytes()?.to_vec());
            WalRecord::Transit {
                dest,
                key,
                seq,
                commit_ms,
                msg_key,
                payload,
            }
        }
        TYPE_SETTLE => {
            let key = r.key()?;
            let n = r.u32()? as usize;
            if n.checked_mul(8) != Some(r.b.len()) {
                return Err(DecodeError::Malformed(
                    "settle count does not match body length",
                ));
            }
            let mut offsets = Vec::with_capacity(n);
            for _ in 0..n {
                offsets.push(Offset(r.u64()?));
            }
            WalRecord::Settle { key, offsets }
        }
        TYPE_CHECKPOINT => {
            let segment = r.u64()?;
            let byte = r.u64()?;
            let mut marks = Vec::new();
            if !r.b.is_empty() {
                let n = r.u32()? as usize;
                if n.checked_mul(MARK_BYTES) != Some(r.b.len()) {
                    return Err(DecodeError::Malformed(
                        "checkpoint mark count does not match body length",
                    ));
                }
                marks.reserve(n);
                for _ in 0..n {
                    marks.push((r.key()?, Offset(r.u64()?)));
                }
            }
            WalRecord::Checkpoint {
                upto: WalPosition { segment, byte },
                marks,
            }
        }
        TYPE_HANDED => {
            // Version 1 named a shard of this node as a bare u32.
            let dest = if with_dest {
                r.dest()?
            } else {
                Destination::Shard(ShardId(r.u32()?))
            };
            let upto = r.u64()?;
            WalRecord::Handed { dest, upto }
        }
        t => return Err(DecodeError::BadType(t)),
    };
    if !r.b.is_empty() {
        return Err(DecodeError::Malformed("trailing bytes in body"));
    }
    Ok((rec, total))
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.b.len() < n {
            return Err(DecodeError::Malformed("field runs past body"));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
    fn dest(&mut self) -> Result<Destination, DecodeError> {
        let kind = self.take(1)?[0];
        let id = self.u64()?;
        match kind {
            DEST_SHARD => u32::try_from(id)
                .map(|s| Destination::Shard(ShardId(s)))
                .map_err(|_| DecodeError::Malformed("destination shard out of range")),
            DEST_NODE => Ok(Destination::Node(MemberId(id))),
            _ => Err(DecodeError::Malformed("unknown destination kind")),
        }
    }
    fn key(&mut self) -> Result<PartitionKey, DecodeError> {
        let topic = TopicId(self.u64()?);
        let partition = PartitionId(self.u32()?);
        Ok(PartitionKey { topic, partition })
    }
    fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn bytes_opt(&mut self) -> Result<Option<Vec<u8>>, DecodeError> {
        let n = self.u32()?;
        if n == KEY_NONE {
            return Ok(None);
        }
        Ok(Some(self.take(n as usize)?.to_vec()))
    }
}

/// The header that opens every batch (group-commit unit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchHeader {
    /// Batch sequence number: starts at 1 in a new WAL, +1 per batch, across segments.
    pub seq: u64,
    pub payload_len: u32,
    pub record_count: u32,
    pub payload_crc: u32,
    /// Earlier batches still in flight when this one was started ([`BATCH_FLAGS_IN_FLIGHT_MASK`]).
    pub in_flight_before: u8,
}

impl BatchHeader {
    /// Bytes on disk of the whole batch: header, payload, zero padding to [`BATCH_ALIGN`].
    pub fn span(&self) -> u64 {
        batch_span(self.payload_len as usize) as u64
    }
}

/// Bytes on disk of a batch with `payload_len` payload bytes.
pub fn batch_span(payload_len: usize) -> usize {
    (BATCH_HEADER_BYTES + payload_len).div_ceil(BATCH_ALIGN) * BATCH_ALIGN
}

pub fn payload_crc(payload: &[u8]) -> u32 {
    checksum::crc32_ieee(payload)
}

/// Header checksum: bytes 0..28, then (version 2) the segment number the batch belongs to.
fn header_crc(b: &[u8], segment: Option<u64>) -> u32 {
    match segment {
        Some(s) => checksum::crc32_ieee_parts(&[&b[0..28], &s.to_le_bytes()]),
        None => checksum::crc32_ieee(&b[0..28]),
    }
}

/// The header of a batch written into segment `segment`: version 2, its checksum bound to
/// `segment`.
pub fn encode_batch_header(h: &BatchHeader, segment: u64) -> [u8; BATCH_HEADER_BYTES] {
    let mut b = [0u8; BATCH_HEADER_BYTES];
    b[0..4].copy_from_slice(&BATCH_MAGIC);
    b[4] = BATCH_VERSION;
    b[5] = BATCH_KIND;
    assert!(h.in_flight_before <= BATCH_FLAGS_IN_FLIGHT_MASK);
    b[6] = h.in_flight_before;
    // b[7] reserved, zero
    b[8..16].copy_from_slice(&h.seq.to_le_bytes());
    b[16..20].copy_from_slice(&h.payload_len.to_le_bytes());
    b[20..24].copy_from_slice(&h.record_count.to_le_bytes());
    b[24..28].copy_from_slice(&h.payload_crc.to_le_bytes());
    let hc = header_crc(&b, Some(segment));
    b[28..32].copy_from_slice(&hc.to_le_bytes());
    b
}

/// Decodes and checks the header of a batch found in segment `segment` (magic, version, header
/// checksum bound to `segment`, kind, reserved bytes, payload bound). A batch written into
/// another segment (an earlier life of a recycled file) fails the checksum. The payload checksum
/// is checked separately by the caller.
pub fn decode_batch_header(buf: &[u8], segment: u64) -> Result<BatchHeader, DecodeError> {
    if buf.len() < BATCH_HEADER_BYTES {
        return Err(DecodeError::Truncated);
    }
    let b = &buf[..BATCH_HEADER_BYTES];
    if b[0..4] != BATCH_MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let bound = match b[4] {
        BATCH_VERSION => Some(segment),
        BATCH_VERSION_UNBOUND => None,
        v => return Err(DecodeError::BadVersion(v)),
    };
    let stored = u32::from_le_bytes([b[28], b[29], b[30], b[31]]);
    let computed = header_crc(b, bound);
    if stored != computed {
        return Err(DecodeError::Checksum { stored, computed });
    }
    if b[5] != BATCH_KIND || b[6] & !BATCH_FLAGS_IN_FLIGHT_MASK != 0 || b[7] != 0 {
        return Err(DecodeError::BadType(b[5]));
    }
    let mut s = [0u8; 8];
    s.copy_from_slice(&b[8..16]);
    let seq = u64::from_le_bytes(s);
    let payload_len = u32::from_le_bytes([b[16], b[17], b[18], b[19]]);
    if payload_len as usize > BATCH_PAYLOAD_BYTES_MAX {
        return Err(DecodeError::TooLong(u64::from(payload_len)));
    }
    let record_count = u32::from_le_bytes([b[20], b[21], b[22], b[23]]);
    if record_count as usize > payload_len as usize / RECORD_HEADER_BYTES {
        return Err(DecodeError::Malformed(
            "record count cannot fit the payload",
        ));
    }
    let payload_crc = u32::from_le_bytes([b[24], b[25], b[26], b[27]]);
    Ok(BatchHeader {
        seq,
        payload_len,
        record_count,
        payload_crc,
        in_flight_before: b[6] & BATCH_FLAGS_IN_FLIGHT_MASK,
    })
}

/// Writes a whole batch for `segment` (header, `payload`, zero padding) into `out`, which must be
/// exactly `batch_span(payload.len())` bytes long.
pub fn encode_batch(segment: u64, seq: u64, record_count: u32, payload: &[u8], out: &mut [u8]) {
    assert_eq!(
        out.len(),
        batch_span(payload.len()),
        "batch buffer of the wrong size"
    );
    assert!(payload.len() <= BATCH_PAYLOAD_BYTES_MAX);
    let h = BatchHeader {
        seq,
        payload_len: payload.len() as u32,
        record_count,
        payload_crc: payload_crc(payload),
        in_flight_before: 0,
    };
    out[..BATCH_HEADER_BYTES].copy_from_slice(&encode_batch_header(&h, segment));
    let end = BATCH_HEADER_BYTES + payload.len();
    out[BATCH_HEADER_BYTES..end].copy_from_slice(payload);
    out[end..].fill(0);
}

/// Completes a batch image for `segment` in place: the payload already sits at
/// `img[BATCH_HEADER_BYTES..]` (`payload_len` bytes); writes the header, recording
/// `in_flight_before` earlier batches in flight (at most [`BATCH_FLAGS_IN_FLIGHT_MASK`]), and
/// zeroes the padding. `img` must be exactly `batch_span(payload_len)` bytes long.
pub fn seal_batch_flagged(
    img: &mut [u8],
    segment: u64,
    seq: u64,
    record_count: u32,
    payload_len: usize,
    in_flight_before: u8,
) {
    assert_eq!(
        img.len(),
        batch_span(payload_len),
        "batch buffer of the wrong size"
    );
    assert!(payload_len <= BATCH_PAYLOAD_BYTES_MAX);
    let end = BATCH_HEADER_BYTES + payload_len;
    let h = BatchHeader {
        seq,
        payload_len: payload_len as u32,
        record_count,
        payload_crc: payload_crc(&img[BATCH_HEADER_BYTES..end]),
        in_flight_before,
    };
    img[..BATCH_HEADER_BYTES].copy_from_slice(&encode_batch_header(&h, segment));
    img[end..].fill(0);
}

/// Checks a whole batch image read back from segment `segment`: header good, sequence as
/// expected, payload checksum good and padding zero. Used by the group commit after every write.
pub fn verify_batch(image: &[u8], segment: u64, seq: u64) -> Result<BatchHeader, DecodeError> {
    let h = decode_batch_header(image, segment)?;
    if h.seq != seq {
        return Err(DecodeError::Malformed("batch sequence number differs"));
    }
    let end = BATCH_HEADER_BYTES + h.payload_len as usize;
    if image.len() != h.span() as usize {
        return Err(DecodeError::Truncated);
    }
    let computed = payload_crc(&image[BATCH_HEADER_BYTES..end]);
    if computed != h.payload_crc {
        return Err(DecodeError::Checksum {
            stored: h.payload_crc,
            computed,
        });
    }
    if image[end..].iter().any(|&b| b != 0) {
        return Err(DecodeError::Malformed("non-zero padding"));
    }
    Ok(h)
}

/// Decodes every record of a batch payload, in order. Stops at the first bad frame and returns
/// what came before it along with the error.
pub fn decode_payload(payload: &[u8]) -> (Vec<(usize, WalRecord)>, Option<DecodeError>) {
    let mut out = Vec::new();
    let mut at = 0;
    while at < payload.len() {
        match decode_record(&payload[at..]) {
            Ok((r, n)) => {
                out.push((at, r));
                at += n;
            }
            Err(e) => return (out, Some(e)),
        }
    }
    (out, None)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// xorshift64*: a tiny deterministic generator for the property tests.
    pub struct Rng(pub u64);
    impl Rng {
        pub fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.0 = x;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        pub fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
        pub fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    /// A destination of every stored form, or none (a version-1 transit record).
    fn random_dest(rng: &mut Rng) -> Option<Destination> {
        match rng.below(3) {
            0 => None,
            1 => Some(Destination::Shard(ShardId(rng.next() as u32))),
            _ => Some(Destination::Node(MemberId(rng.next()))),
        }
    }

    pub fn random_record(rng: &mut Rng) -> WalRecord {
        let key = PartitionKey {
            topic: TopicId(rng.next()),
            partition: PartitionId(rng.next() as u32),
        };
        let small = |rng: &mut Rng| {
            let n = rng.below(300) as usize;
            rng.bytes(n)
        };
        let opt = |rng: &mut Rng| {
            if rng.below(2) == 0 {
                None
            } else {
                Some(small(rng))
            }
        };
        match rng.below(5) {
            0 => WalRecord::Message {
                key,
                offset: Offset(rng.next()),
                commit_ms: UnixMillis(rng.next()),
                msg_key: opt(rng),
                payload: small(rng).into(),
            },
            1 => WalRecord::Transit {
                dest: random_dest(rng),
                key,
                seq: rng.next(),
                commit_ms: UnixMillis(rng.next()),
                msg_key: opt(rng),
                payload: small(rng).into(),
            },
            4 => WalRecord::Handed {
                dest: random_dest(rng).unwrap_or(Destination::Shard(ShardId(0))),
                upto: rng.next(),
            },
            2 => {
                let n = rng.below(20) as usize;
                WalRecord::Settle {
                    key,
                    offsets: (0..n).map(|_| Offset(rng.next())).collect(),
                }
            }
            _ => WalRecord::Checkpoint {
                upto: WalPosition {
                    segment: rng.next(),
                    byte: rng.next(),
                },
                marks: (0..rng.below(4))
                    .map(|i| {
                        let k = PartitionKey {
                            topic: key.topic,
                            partition: PartitionId(key.partition.0.wrapping_add(i as u32)),
                        };
                        (k, Offset(rng.next()))
                    })
                    .collect(),
            },
        }
    }

    fn seed() -> u64 {
        std::env::var("NARAD_SIM_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x5eed_c0de)
    }

    /// A version-1 frame of type `ty` around `body`, laid out by hand as older writers did.
    fn old_frame(ty: u8, body: &[u8]) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&RECORD_MAGIC);
        f.push(ty);
        f.push(RECORD_VERSION);
        f.extend_from_slice(&(body.len() as u32).to_le_bytes());
        f.extend_from_slice(&[0; 4]);
        f.extend_from_slice(body);
        let crc = record_crc(&f);
        f[8..12].copy_from_slice(&crc.to_le_bytes());
        f
    }

    #[test]
    fn version_one_transit_and_handed_frames_still_decode() {
        // Proves data directories written before destinations were stored still open: a
        // version-1 Transit frame (no destination) decodes with `dest: None`, a version-1 Handed
        // frame (a bare u32 shard) as that shard; new frames of both are version 2, and a
        // Message frame claiming version 2 is refused by its version.
        let key = PartitionKey {
            topic: TopicId(7),
            partition: PartitionId(3),
        };
        let transit = WalRecord::Transit {
            dest: None,
            key,
            seq: 5,
            commit_ms: UnixMillis(9),
            msg_key: None,
            payload: b"p".to_vec().into(),
        };
        let mut out = Vec::new();
        encode_record(&transit, &mut out).unwrap();
        assert_eq!(out[3], RECORD_VERSION);
        assert_eq!(decode_record(&out).unwrap().0, transit);
        // A version-1 Handed frame as the old writer laid it out: dest u32, upto u64.
        let body = [&1u32.to_le_bytes()[..], &40u64.to_le_bytes()].concat();
        let old = old_frame(TYPE_HANDED, &body);
        assert_eq!(
            decode_record(&old).unwrap().0,
            WalRecord::Handed {
                dest: Destination::Shard(ShardId(1)),
                upto: 40
            }
        );
        let handed = WalRecord::Handed {
            dest: Destination::Node(MemberId(2)),
            upto: 40,
        };
        let mut out = Vec::new();
        encode_record(&handed, &mut out).unwrap();
        assert_eq!(out[3], RECORD_VERSION_DEST);
        assert_eq!(decode_record(&out).unwrap().0, handed);
        let mut msg = Vec::new();
        encode_record(
            &WalRecord::Settle {
                key,
                offsets: vec![Offset(1)],
            },
            &mut msg,
        )
        .unwrap();
        msg[3] = RECORD_VERSION_DEST;
        let crc = record_crc(&msg);
        msg[8..12].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            decode_record(&msg).unwrap_err(),
            DecodeError::BadVersion(RECORD_VERSION_DEST)
        );
    }

    #[test]
    fn record_round_trip() {
        // Proves encode then decode gives back the same record and consumes exactly its frame,
        // for random records of every type (seeded; NARAD_SIM_SEED replays).
        let s = seed();
        let mut rng = Rng(s | 1);
        for i in 0..2000 {
            let r = random_record(&mut rng);
            let mut buf = Vec::new();
            encode_record(&r, &mut buf).expect("encode");
            assert_eq!(buf.len(), encoded_len(&r), "seed {s} case {i}");
            buf.extend_from_slice(b"trailing");
            let (d, n) = decode_record(&buf).unwrap_or_else(|e| panic!("seed {s} case {i}: {e}"));
            assert_eq!(n, encoded_len(&r), "seed {s} case {i}");
            assert_eq!(d, r, "seed {s} case {i}");
        }
    }

    #[test]
    fn a_checkpoint_without_marks_from_an_older_log_still_reads() {
        // Proves a checkpoint body of `upto` alone (as written before marks existed) decodes with
        // no marks, and that a mark count disagreeing with the body is refused, not misread.
        let body = [&7u64.to_le_bytes()[..], &4096u64.to_le_bytes()].concat();
        let old = old_frame(TYPE_CHECKPOINT, &body);
        let (r, n) = decode_record(&old).expect("old checkpoint");
        assert_eq!(n, old.len());
        assert_eq!(
            r,
            WalRecord::Checkpoint {
                upto: WalPosition {
                    segment: 7,
                    byte: 4096
                },
                marks: Vec::new()
            }
        );
        let key = PartitionKey {
            topic: TopicId(9),
            partition: PartitionId(2),
        };
        let mut bad = Vec::new();
        let r = WalRecord::Checkpoint {
            upto: WalPosition::default(),
            marks: vec![(key, Offset(5))],
        };
        encode_record(&r, &mut bad).expect("encode");
        bad[RECORD_HEADER_BYTES + 16] = 2; // count 2, one entry
        let crc = record_crc(&bad);
        bad[8..12].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            decode_record(&bad),
            Err(DecodeError::Malformed(_))
        ));
    }

    #[test]
    fn every_single_byte_corruption_is_detected() {
        // Proves that changing any one byte of a record frame (to several different values) never
        // decodes to a record: the checksum, magic or length check refuses it.
        let s = seed();
        let mut rng = Rng(s | 1);
        for case in 0..40 {
            let r = random_record(&mut rng);
            let mut buf = Vec::new();
            encode_record(&r, &mut buf).expect("encode");
            for i in 0..buf.len() {
                for pattern in [0x01u8, 0x80, 0xff, 0x5a, (rng.next() as u8) | 1] {
                    let mut c = buf.clone();
                    c[i] ^= pattern;
                    if let Ok((d, _)) = decode_record(&c) {
                        panic!("seed {s} case {case}: byte {i} ^ {pattern:#x} decoded as {d:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn every_single_byte_corruption_of_a_batch_is_detected() {
        // Proves the batch-level check (header checksum + payload checksum + zero padding) refuses
        // every single-byte change anywhere in the batch image, padding included.
        let s = seed();
        let mut rng = Rng(s | 1);
        let mut payload = Vec::new();
        for _ in 0..5 {
            encode_record(&random_record(&mut rng), &mut payload).expect("encode");
        }
        let mut img = vec![0u8; batch_span(payload.len())];
        encode_batch(3, 7, 5, &payload, &mut img);
        assert_eq!(verify_batch(&img, 3, 7).expect("valid").record_count, 5);
        assert!(verify_batch(&img, 3, 8).is_err(), "wrong sequence accepted");
        for i in 0..img.len() {
            for pattern in [0x01u8, 0x80, 0xff] {
                let mut c = img.clone();
                c[i] ^= pattern;
                assert!(
                    verify_batch(&c, 3, 7).is_err(),
                    "seed {s}: byte {i} ^ {pattern:#x} accepted"
                );
            }
        }
    }

    #[test]
    fn a_batch_is_valid_only_in_its_own_segment() {
        // Proves a batch sealed for one segment fails its header check in any other segment (so
        // the old batches of a recycled segment file never pass for new ones), that the payload
        // is not what tells them apart, and that a version-1 header (no segment in its checksum,
        // written by earlier builds) still decodes in any segment.
        let mut rng = Rng(seed() | 1);
        let mut payload = Vec::new();
        encode_record(&random_record(&mut rng), &mut payload).expect("encode");
        let mut img = vec![0u8; batch_span(payload.len())];
        encode_batch(41, 9, 1, &payload, &mut img);
        assert_eq!(decode_batch_header(&img, 41).expect("own segment").seq, 9);
        for other in [0, 40, 42, 41 + (1 << 32), u64::MAX] {
            assert!(
                matches!(
                    decode_batch_header(&img, other),
                    Err(DecodeError::Checksum { .. })
                ),
                "valid in segment {other}"
            );
            assert!(verify_batch(&img, other, 9).is_err());
        }
        // The same header as version 1: bytes 0..28 with version 1, checksum over them alone.
        let mut v1 = img.clone();
        v1[4] = BATCH_VERSION_UNBOUND;
        let hc = checksum::crc32_ieee(&v1[0..28]);
        v1[28..32].copy_from_slice(&hc.to_le_bytes());
        for any in [0, 41, 7777] {
            let h = decode_batch_header(&v1, any).expect("version 1 decodes");
            assert_eq!((h.seq, h.record_count), (9, 1));
            assert!(verify_batch(&v1, any, 9).is_ok());
        }
        v1[4] = 3;
        assert!(matches!(
            decode_batch_header(&v1, 41),
            Err(DecodeError::BadVersion(3))
        ));
    }

    #[test]
    fn decoding_garbage_never_panics() {
        // Proves the decoders return errors, never panic, on random bytes, on random lengths, and
        // on valid headers followed by garbage.
        let s = seed();
        let mut rng = Rng(s | 1);
        for _ in 0..20_000 {
            let n = rng.below(200) as usize;
            let mut b = rng.bytes(n);
            if rng.below(3) == 0 && b.len() >= 4 {
                b[0..2].copy_from_slice(&RECORD_MAGIC);
                b[3] = RECORD_VERSION;
            }
            let _ = decode_record(&b);
            let _ = decode_batch_header(&b, rng.next());
            let _ = decode_payload(&b);
            let _ = verify_batch(&b, rng.next(), rng.next());
        }
        // A frame whose length claims more than the bound is refused before allocation.
        let mut b = vec![0u8; RECORD_HEADER_BYTES];
        b[0..2].copy_from_slice(&RECORD_MAGIC);
        b[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode_record(&b), Err(DecodeError::TooLong(_))));
    }

    #[test]
    fn payload_decodes_in_order() {
        // Proves a batch payload of several frames decodes to the same records in order with
        // their byte offsets, and that a corrupt frame stops decoding with the prefix kept.
        let s = seed();
        let mut rng = Rng(s | 1);
        let recs: Vec<_> = (0..10).map(|_| random_record(&mut rng)).collect();
        let mut p = Vec::new();
        let mut offs = Vec::new();
        for r in &recs {
            offs.push(p.len());
            encode_record(r, &mut p).expect("encode");
        }
        let (got, err) = decode_payload(&p);
        assert!(err.is_none());
        assert_eq!(got.iter().map(|(o, _)| *o).collect::<Vec<_>>(), offs);
        assert_eq!(got.into_iter().map(|(_, r)| r).collect::<Vec<_>>(), recs);
        let mut c = p.clone();
        c[offs[4] + RECORD_HEADER_BYTES] ^= 1;
        let (got, err) = decode_payload(&c);
        assert_eq!(got.len(), 4);
        assert!(matches!(err, Some(DecodeError::Checksum { .. })));
    }
}
