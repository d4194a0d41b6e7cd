//! Identities and positions shared by every crate. Newtypes, so that a function that needs a
//! partition takes a partition, not a bare integer.

use std::fmt;

/// Index of a shard (one per CPU core) on this node. Fixed when the data directory is created.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardId(pub u32);

/// A member of the cluster: the 64-bit FNV-1a hash of its node id ([`MemberId::of`]), so every
/// node computes the same number for a node without asking, and a restart, a new peer list or a
/// node that joined later never renumbers anyone (node ids are never reused, CLUSTER.md §7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemberId(pub u64);

impl MemberId {
    /// The member number of node `id`.
    pub fn of(id: &str) -> MemberId {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in id.as_bytes() {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        MemberId(h)
    }
}

/// Where an accepted record must be handed over: a shard of this node, or another node (which
/// places it on one of its own shards). Stored in the WAL's transit records and `Handed`
/// markers (`FORMAT.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Destination {
    Shard(ShardId),
    Node(MemberId),
}

/// Incarnation id of a topic: a topic deleted and recreated under the same name gets a new one.
/// Rendered as 16 lowercase hex characters.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
pub struct TopicId(pub u64);

impl fmt::Display for TopicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Partition number inside one topic (0-based).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
pub struct PartitionId(pub u32);

/// One partition of one topic incarnation: the unit a shard owns.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
pub struct PartitionKey {
    pub topic: TopicId,
    pub partition: PartitionId,
}

/// Position of a record inside a partition. Dense, starting at 0.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
pub struct Offset(pub u64);

/// Random per-lease token inside a receipt handle. Never 0.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
pub struct Nonce(pub u64);

/// Milliseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct UnixMillis(pub u64);

impl UnixMillis {
    pub fn now() -> UnixMillis {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        UnixMillis(d.as_millis() as u64)
    }
}

/// splitmix64: a fast, seedable generator; every seed (0 included) gives a full-period stream.
/// Used for lease nonces, per-partition seeds and seeded tests; not for secrets.
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// A hasher for the maps looked up once per message on the request paths (lease tables, acks by
/// partition, metrics by partition): keys are small integers this node assigns (topic ids,
/// partitions, shards), so std's SipHash (1.7 % of the broker's CPU in a full-flow benchmark)
/// buys nothing. Multiply-rotate per word, as rustc's FxHasher.
#[derive(Clone, Copy, Default)]
pub struct FastHasher(u64);

impl std::hash::Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(w));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }
    fn write_u16(&mut self, i: u16) {
        self.write_u64(u64::from(i));
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
    fn finish(&self) -> u64 {
        // hashbrown takes its control bits from the top of the hash: fold the well-mixed high
        // bits down too, so that small keys spread over buckets.
        self.0 ^ (self.0 >> 32)
    }
}

/// `HashMap` with [`FastHasher`]; make one with `FastMap::default()`.
pub type FastMap<K, V> = std::collections::HashMap<K, V, std::hash::BuildHasherDefault<FastHasher>>;

/// A byte range of a buffer shared by the records of one read: the records a consume reads
/// in one call take one allocation between them instead of one each (`Send`, so a record can
/// travel to the shard that asked for it). Compares by content.
#[derive(Clone)]
pub struct SharedBytes {
    buf: std::sync::Arc<Vec<u8>>,
    start: usize,
    end: usize,
}

impl SharedBytes {
    /// The bytes `range` of `buf`. Panics when the range is outside the buffer.
    pub fn new(buf: std::sync::Arc<Vec<u8>>, range: std::ops::Range<usize>) -> SharedBytes {
        assert!(range.start <= range.end && range.end <= buf.len());
        SharedBytes {
            buf,
            start: range.start,
            end: range.end,
        }
    }

    /// `part` as a range of `buf` when it is a subslice of it, else a copy of its own.
    pub fn within(buf: &std::sync::Arc<Vec<u8>>, part: &[u8]) -> SharedBytes {
        let at = (part.as_ptr() as usize).wrapping_sub(buf.as_ptr() as usize);
        match at.checked_add(part.len()) {
            Some(end) if end <= buf.len() => SharedBytes::new(std::sync::Arc::clone(buf), at..end),
            _ => SharedBytes::from(part.to_vec()),
        }
    }

    /// Whether these bytes are a range of `buf` (shared, not copied).
    #[cfg(test)]
    fn shares(&self, buf: &std::sync::Arc<Vec<u8>>) -> bool {
        std::sync::Arc::ptr_eq(&self.buf, buf)
    }
}

impl From<Vec<u8>> for SharedBytes {
    fn from(v: Vec<u8>) -> SharedBytes {
        let end = v.len();
        SharedBytes::new(std::sync::Arc::new(v), 0..end)
    }
}

impl std::ops::Deref for SharedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }
}

impl AsRef<[u8]> for SharedBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl PartialEq for SharedBytes {
    fn eq(&self, other: &SharedBytes) -> bool {
        **self == **other
    }
}

impl Eq for SharedBytes {}

impl PartialEq<[u8]> for SharedBytes {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
    }
}

impl PartialEq<Vec<u8>> for SharedBytes {
    fn eq(&self, other: &Vec<u8>) -> bool {
        **self == **other
    }
}

/// The wire form of a [`SharedBytes`] (`#[rkyv(with = AsBytes)]`): its bytes, archived as a
/// byte vector; read back into a buffer of its own.
pub struct AsBytes;

impl rkyv::with::ArchiveWith<SharedBytes> for AsBytes {
    type Archived = rkyv::vec::ArchivedVec<u8>;
    type Resolver = rkyv::vec::VecResolver;

    fn resolve_with(
        field: &SharedBytes,
        resolver: rkyv::vec::VecResolver,
        out: rkyv::Place<Self::Archived>,
    ) {
        rkyv::vec::ArchivedVec::resolve_from_len(field.len(), resolver, out);
    }
}

impl<S> rkyv::with::SerializeWith<SharedBytes, S> for AsBytes
where
    S: rkyv::rancor::Fallible + rkyv::ser::Allocator + rkyv::ser::Writer + ?Sized,
{
    fn serialize_with(
        field: &SharedBytes,
        serializer: &mut S,
    ) -> Result<rkyv::vec::VecResolver, S::Error> {
        rkyv::vec::ArchivedVec::<u8>::serialize_from_slice(field.as_ref(), serializer)
    }
}

impl<D> rkyv::with::DeserializeWith<rkyv::vec::ArchivedVec<u8>, SharedBytes, D> for AsBytes
where
    D: rkyv::rancor::Fallible + ?Sized,
{
    fn deserialize_with(
        field: &rkyv::vec::ArchivedVec<u8>,
        _: &mut D,
    ) -> Result<SharedBytes, D::Error> {
        Ok(SharedBytes::from(field.as_slice().to_vec()))
    }
}

impl fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

/// The shard that owns a partition on a node: a pure function of (topic id, partition, shard
/// count), so every shard computes the same answer without asking anyone.
///
/// A topic's partitions go round-robin over the shards from a start shard taken from a hash of
/// the topic id: any topic with at least `shard_count` partitions uses every shard, and no shard
/// holds more than `ceil(partitions / shard_count)` of them (a per-partition hash left all 8
/// partitions of a topic on one of 2 shards for 1 topic in ~130, halving its throughput), while
/// different topics' partition 0 still land on different shards. Data directories record this
/// placement (`PLACEMENT_VERSION`) next to their shard count.
pub fn owner_shard(key: PartitionKey, shard_count: u32) -> ShardId {
    assert!(shard_count > 0);
    let mut x = key.topic.0;
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    let n = u64::from(shard_count);
    ShardId(((x % n + u64::from(key.partition.0)) % n) as u32)
}

/// The partition placement [`owner_shard`] implements, recorded in a data directory's `shards`
/// file; a directory laid out by another placement is refused at start.
pub const PLACEMENT_VERSION: u32 = 2;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_bytes_are_their_range_and_compare_by_content() {
        let buf = std::sync::Arc::new(b"keypayload".to_vec());
        let key = SharedBytes::new(buf.clone(), 0..3);
        let payload = SharedBytes::new(buf, 3..10);
        assert_eq!(&*key, b"key");
        assert_eq!(payload, b"payload".to_vec());
        assert_eq!(payload, SharedBytes::from(b"payload".to_vec()));
        assert_ne!(key, payload);
        assert_eq!(format!("{key:?}"), format!("{:?}", b"key".as_slice()));
        let buf = std::sync::Arc::new(b"abcdef".to_vec());
        assert_eq!(&*SharedBytes::within(&buf, &buf[2..4]), b"cd");
        assert!(SharedBytes::within(&buf, &buf[2..4]).shares(&buf));
        let other = b"cd".to_vec();
        let copied = SharedBytes::within(&buf, &other);
        assert_eq!(copied, other, "a slice of another buffer is copied");
        assert!(!copied.shares(&buf));
        assert!(SharedBytes::within(&buf, &[]).is_empty());
    }

    #[test]
    fn fast_hasher_tells_small_keys_apart() {
        // Proves the fast hasher gives distinct hashes (in full and in hashbrown's top 7 control
        // bits, spread over most of their values) for the keys it serves: partitions 0..1024 of a
        // few topics, and that a map keyed by them behaves as a map.
        use std::hash::BuildHasher;
        let b = std::hash::BuildHasherDefault::<FastHasher>::default();
        let mut full = std::collections::HashSet::new();
        let mut top7 = std::collections::HashSet::new();
        let mut m: FastMap<PartitionKey, u32> = FastMap::default();
        for topic in [1u64, 2, 0xdead_beef_0000_0001] {
            for p in 0..1024u32 {
                let k = PartitionKey {
                    topic: TopicId(topic),
                    partition: PartitionId(p),
                };
                let h = b.hash_one(k);
                full.insert(h);
                top7.insert(h >> 57);
                m.insert(k, p);
            }
        }
        assert_eq!(full.len(), 3 * 1024);
        assert!(top7.len() >= 100, "top bits poorly spread: {}", top7.len());
        assert_eq!(m.len(), 3 * 1024);
        assert_eq!(
            m.get(&PartitionKey {
                topic: TopicId(2),
                partition: PartitionId(77)
            }),
            Some(&77)
        );
    }

    #[test]
    fn owner_shard_spreads_partitions_evenly_and_is_stable() {
        // Proves the ownership function is deterministic, that every topic with at least as many
        // partitions as shards uses every shard with counts differing by at most one, and that
        // partition 0 of different topics does not always land on the same shard.
        let mut rng = SplitMix64(7);
        let mut first = [0u32; 4];
        for _ in 0..500 {
            let topic = TopicId(rng.next_u64());
            for shards in 1..=4u32 {
                for parts in shards..=9 {
                    let mut seen = [0u32; 4];
                    for p in 0..parts {
                        let k = PartitionKey {
                            topic,
                            partition: PartitionId(p),
                        };
                        let s = owner_shard(k, shards);
                        assert_eq!(s, owner_shard(k, shards));
                        seen[s.0 as usize] += 1;
                    }
                    let used = &seen[..shards as usize];
                    let (lo, hi) = (used.iter().min().unwrap(), used.iter().max().unwrap());
                    assert!(
                        hi - lo <= 1,
                        "topic {topic:?} {parts} on {shards}: {seen:?}"
                    );
                }
            }
            let k0 = PartitionKey {
                topic,
                partition: PartitionId(0),
            };
            first[owner_shard(k0, 4).0 as usize] += 1;
        }
        assert!(first.iter().all(|&n| n > 60), "{first:?}");
    }
}
