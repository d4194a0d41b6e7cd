//! Letting go of partition data and files: deleting a topic's partitions, time retention of
//! sealed segments, and closing the segment files of idle partition logs.
//!
//! Owns: [`ShardLog::delete_topic`], [`ShardLog::enforce_retention`],
//! [`ShardLog::evict_idle_logs`] and their counters. Never: decides a topic's retention (the
//! caller passes it), or writes a record.
//!
//! Crash safety: this file carries the deletion half of point 5 of the argument in `mod.rs`.
//! Appends to a deleted topic are refused from the call on, its partition directories are
//! removed (and the topics directory fsynced when the topic's own directory went), and only then
//! does the checkpoint move the replay start past its records. What a crash before that
//! checkpoint leaves in the WAL for a partition without a directory is skipped by recovery,
//! except a message at offset 0, which starts a partition (`recovery.rs`). Idle eviction closes
//! only logs with nothing left for a checkpoint to sync, so no checkpoint needs a file it closed.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::{count_failure, LogError, ShardLog};
use crate::partition;
use crate::types::{PartitionKey, TopicId, UnixMillis};

impl ShardLog {
    /// Deletes every partition of `topic` this shard owns (files and memory), then checkpoints so
    /// that recovery does not replay them. Appends to the topic fail from now on.
    pub async fn delete_topic(&self, topic: TopicId) -> Result<(), LogError> {
        let dirs: Vec<PathBuf> = {
            let mut st = self.inner.state.borrow_mut();
            st.deleted_topics.insert(topic);
            let keys: Vec<PartitionKey> = st
                .partitions
                .keys()
                .filter(|k| k.topic == topic)
                .copied()
                .collect();
            keys.iter()
                .filter_map(|k| st.partitions.remove(k))
                .map(|p| p.dir().to_path_buf())
                .collect()
        };
        let topic_dir = partition::topic_dir(&self.inner.cfg.data_dir, topic);
        let removed = glommio::executor()
            .spawn_blocking(move || -> std::io::Result<()> {
                for d in &dirs {
                    super::remove_dir_if_present(d)?;
                }
                // Other shards may still hold partitions of the topic: remove it only when empty.
                if std::fs::remove_dir(&topic_dir).is_ok() {
                    if let Some(parent) = topic_dir.parent() {
                        crate::durable::sync_dir(parent)?;
                    }
                }
                Ok(())
            })
            .await;
        removed?;
        self.checkpoint().await
    }

    /// Deletes whole sealed segments of `topic` whose newest record is older than
    /// `now - retention_ms` (0 = keep forever). Returns the bytes deleted.
    pub async fn enforce_retention(
        &self,
        topic: TopicId,
        retention_ms: u64,
        now: UnixMillis,
    ) -> Result<u64, LogError> {
        let mut st = self.inner.state.borrow_mut();
        let mut deleted = 0;
        for p in st
            .partitions
            .values_mut()
            .filter(|p| p.key().topic == topic)
        {
            // A log closed for idleness is swept like an open one: its segments are listed in
            // memory, and deleting files needs no open handle.
            let cold = !p.is_open();
            match p.enforce_retention(retention_ms, now) {
                Ok(n) => {
                    if cold && n > 0 {
                        self.inner.cold_swept.set(self.inner.cold_swept.get() + 1);
                    }
                    deleted += n
                }
                Err(e) => {
                    count_failure(&self.inner, |f| f.retention += 1);
                    return Err(e.into());
                }
            }
        }
        Ok(deleted)
    }

    /// Closes the segment file of every partition log neither written nor read for `idle` and
    /// with nothing left to checkpoint (storage.idle_log_eviction_ms). Such a log reopens on its
    /// next write; reads open the file themselves. Returns how many it closed.
    pub fn evict_idle_logs(&self, idle: Duration) -> usize {
        let now = Instant::now();
        let n = self
            .inner
            .state
            .borrow_mut()
            .partitions
            .values_mut()
            .map(|p| p.evict_if_idle(idle, now))
            .filter(|&closed| closed)
            .count();
        self.inner
            .idle_evicted
            .set(self.inner.idle_evicted.get() + n as u64);
        n
    }

    /// Partition logs closed for idleness since this log was opened.
    pub fn idle_logs_evicted(&self) -> u64 {
        self.inner.idle_evicted.get()
    }

    /// Retention passes that deleted segments of a partition log closed for idleness (cold),
    /// since this log was opened.
    pub fn cold_retention_swept(&self) -> u64 {
        self.inner.cold_swept.get()
    }
}
