//! Helpers shared by the `log_*` tests: temporary data directories and small configs.
#![allow(dead_code)]

use std::path::PathBuf;

use narad_io::log::{AppendRecord, LogConfig};
use narad_io::types::{PartitionId, PartitionKey, ShardId, TopicId};

pub fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("narad-log-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// One shard, small segments, checkpoints only when asked (interval one hour).
pub fn small_cfg(dir: PathBuf) -> LogConfig {
    LogConfig {
        wal_segment_bytes: 1 << 20,
        wal_batch_bytes_max: 256 << 10,
        wal_batch_records_max: 1024,
        append_queue_bytes_max: 1 << 20,
        partition_segment_bytes_max: 16 << 10,
        checkpoint_wal_bytes: u64::MAX,
        checkpoint_interval_ms: 3_600_000,
        ..LogConfig::new(dir, ShardId(0), 1)
    }
}

pub fn key(topic: u64, p: u32) -> PartitionKey {
    PartitionKey {
        topic: TopicId(topic),
        partition: PartitionId(p),
    }
}

pub fn payload(k: PartitionKey, i: u64) -> Vec<u8> {
    format!("t{}-p{}-i{}-", k.topic.0, k.partition.0, i)
        .repeat(1 + (i % 5) as usize)
        .into_bytes()
}

pub fn rec(k: PartitionKey, i: u64) -> AppendRecord {
    AppendRecord {
        key: k,
        msg_key: i.is_multiple_of(2).then(|| format!("key{i}").into_bytes()),
        payload: payload(k, i).into(),
    }
}
