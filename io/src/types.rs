//! Identities and positions shared by every crate. Newtypes, so that a function that needs a
//! partition takes a partition, not a bare integer.

use std::fmt;

/// Index of a shard (one per CPU core) on this node. Fixed when the data directory is created.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardId(pub u32);

/// Incarnation id of a topic: a topic deleted and recreated under the same name gets a new one.
/// Rendered as 16 lowercase hex characters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicId(pub u64);

impl fmt::Display for TopicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Partition number inside one topic (0-based).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionId(pub u32);

/// One partition of one topic incarnation: the unit a shard owns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionKey {
    pub topic: TopicId,
    pub partition: PartitionId,
}

/// Position of a record inside a partition. Dense, starting at 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Offset(pub u64);

/// Random per-lease token inside a receipt handle. Never 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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

/// The shard that owns a partition on a node: a pure function of (topic id, partition, shard
/// count), so every shard computes the same answer without asking anyone.
pub fn owner_shard(key: PartitionKey, shard_count: u32) -> ShardId {
    assert!(shard_count > 0);
    // splitmix64 of the topic id mixed with the partition: spreads consecutive partitions of one
    // topic over shards and different topics' partition 0 over different shards.
    let mut x = key.topic.0 ^ (u64::from(key.partition.0).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    ShardId((x % u64::from(shard_count)) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_shard_spreads_partitions_and_is_stable() {
        // Proves the ownership function is deterministic and uses every shard for a topic with
        // many partitions.
        let mut seen = [0u32; 4];
        for p in 0..64 {
            let k = PartitionKey {
                topic: TopicId(0x681a_429c_0b68_3b2d),
                partition: PartitionId(p),
            };
            let s = owner_shard(k, 4);
            assert_eq!(s, owner_shard(k, 4));
            seen[s.0 as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 4), "{seen:?}");
    }
}
