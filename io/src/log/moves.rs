//! A partition moving between nodes (CLUSTER.md §9.3): the source's side (its segments and
//! settled state, the bytes of a segment, whether appends for it are still on their way) and the
//! destination's (a staged copy under `<data_dir>/moves/`, installed in one rename, and a
//! partition dropped when its copy on another node took over).
//!
//! Crash safety: a staged copy is fsynced file by file, with its `consumer.state` replaced
//! atomically and its directory fsynced, before it is installed; the install renames the staged
//! directory into `topics/` (after removing a stale copy of the same partition), fsyncs the
//! parent directories, then recovers it like any partition at start-up ([`PartitionLog::open`]:
//! CRC of every frame, torn tail cut), so what the caller then compares with the source's high
//! watermark is what a restart would find. Install and drop both end with a checkpoint, so no
//! replay of the WAL brings back records of the partition's earlier life on this shard.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::{LogError, ShardLog};
use crate::partition::{self, state::Settled, PartitionLog};
use crate::types::{Offset, PartitionKey};

/// What a destination needs to copy a partition: each segment's first offset and bytes of whole
/// frames, the high watermark, and the settled state (consumer frontier and acks ahead of it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MoveManifest {
    pub segments: Vec<(Offset, u64)>,
    pub next: Offset,
    pub settled: Settled,
}

impl ShardLog {
    /// The partition as a copy must reproduce it now (empty when nothing was ever written here).
    pub fn move_manifest(&self, key: PartitionKey) -> MoveManifest {
        let st = self.inner.state.borrow();
        match st.partitions.get(&key) {
            Some(p) => MoveManifest {
                segments: p.segment_sizes(),
                next: p.next_offset(),
                settled: p.settled(),
            },
            None => MoveManifest::default(),
        }
    }

    /// Up to `max` bytes of the segment of `key` starting at `base`, from byte `pos` (never past
    /// its whole frames). Empty at the end; an error when the segment is gone (retention).
    pub async fn move_chunk(
        &self,
        key: PartitionKey,
        base: Offset,
        pos: u64,
        max: usize,
    ) -> std::io::Result<Vec<u8>> {
        let found = self
            .inner
            .state
            .borrow()
            .partitions
            .get(&key)
            .and_then(|p| p.segment_file(base));
        let Some((path, size)) = found else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("no segment {} of {key:?} here", base.0),
            ));
        };
        let len = size.saturating_sub(pos).min(max as u64) as usize;
        if len == 0 {
            return Ok(Vec::new());
        }
        glommio::executor()
            .spawn_blocking(move || {
                let f = std::fs::File::open(&path)?;
                let mut buf = vec![0u8; len];
                f.read_exact_at(&mut buf, pos)?;
                Ok(buf)
            })
            .await
    }

    /// No append of `key` is queued or being written: its high watermark is final as long as no
    /// new one is submitted.
    pub fn quiet(&self, key: PartitionKey) -> bool {
        let st = self.inner.state.borrow();
        !st.planned_next.contains_key(&key)
            && !st.queue.iter().any(|r| {
                r.records.iter().any(
                    |w| matches!(w, crate::codec::WalRecord::Message { key: k, .. } if *k == key),
                )
            })
    }

    /// Installs the staged copy at `staged` as partition `key` of this shard (replacing a stale
    /// copy), recovers it and answers its high watermark and settled state.
    pub async fn adopt_partition(
        &self,
        key: PartitionKey,
        staged: PathBuf,
    ) -> Result<(Offset, Settled), LogError> {
        if let Some(e) = self.refuse() {
            return Err(e);
        }
        if !self.quiet(key) {
            return Err(LogError::Io(std::io::Error::other(
                "appends of the partition are on their way here; not installing a copy over them",
            )));
        }
        self.inner.state.borrow_mut().partitions.remove(&key);
        let data_dir = self.inner.cfg.data_dir.clone();
        let seg_max = self.inner.cfg.partition_segment_bytes_max;
        let p = glommio::executor()
            .spawn_blocking(move || -> std::io::Result<PartitionLog> {
                let dir = partition::partition_dir(&data_dir, key);
                super::remove_dir_if_present(&dir)?;
                let topic = partition::topic_dir(&data_dir, key.topic);
                std::fs::create_dir_all(&topic)?;
                std::fs::rename(&staged, &dir)?;
                crate::durable::sync_dir(&topic)?;
                crate::durable::sync_dir(&partition::topics_dir(&data_dir))?;
                crate::durable::sync_dir(&data_dir)?;
                let (p, _) = PartitionLog::open(&dir, key, seg_max)?;
                Ok(p)
            })
            .await?;
        let out = (p.next_offset(), p.settled());
        self.inner.state.borrow_mut().partitions.insert(key, p);
        self.checkpoint().await?;
        Ok(out)
    }

    /// Removes partition `key` from this shard (memory and files): another node owns it now and
    /// its copy took over, or a copy installed here lost its flip.
    pub async fn drop_partition(&self, key: PartitionKey) -> Result<(), LogError> {
        let dir = self
            .inner
            .state
            .borrow_mut()
            .partitions
            .remove(&key)
            .map(|p| p.dir().to_path_buf())
            .unwrap_or_else(|| partition::partition_dir(&self.inner.cfg.data_dir, key));
        glommio::executor()
            .spawn_blocking(move || -> std::io::Result<()> {
                super::remove_dir_if_present(&dir)?;
                match dir.parent() {
                    Some(parent) => crate::durable::sync_dir(parent),
                    None => Ok(()),
                }
            })
            .await?;
        self.checkpoint().await
    }

    /// Partitions held here, for the reclaim of copies that moved away.
    pub fn held_partitions(&self) -> Vec<PartitionKey> {
        self.inner
            .state
            .borrow()
            .partitions
            .keys()
            .copied()
            .collect()
    }
}

/// A destination's staged copy of one partition, under `<data_dir>/moves/`.
pub struct MoveStage {
    dir: PathBuf,
}

fn segment_name(base: Offset) -> String {
    format!("{:020}.seg", base.0)
}

impl MoveStage {
    /// An empty stage for `key` (anything left from an earlier attempt is removed).
    pub async fn fresh(data_dir: &Path, key: PartitionKey) -> std::io::Result<MoveStage> {
        let stage = MoveStage {
            dir: partition::partition_dir(&data_dir.join("moves"), key),
        };
        stage.clear().await?;
        Ok(stage)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Empties the stage (a copy starts over).
    pub async fn clear(&self) -> std::io::Result<()> {
        let d = self.dir.clone();
        glommio::executor()
            .spawn_blocking(move || -> std::io::Result<()> {
                super::remove_dir_if_present(&d)?;
                std::fs::create_dir_all(&d)
            })
            .await
    }

    /// Bytes held of each staged segment, by first offset.
    pub async fn held(&self) -> std::io::Result<BTreeMap<Offset, u64>> {
        let dir = self.dir.clone();
        glommio::executor()
            .spawn_blocking(move || {
                let mut out = BTreeMap::new();
                for e in std::fs::read_dir(&dir)? {
                    let e = e?;
                    let name = e.file_name();
                    let name = name.to_string_lossy();
                    if let Some(b) = name.strip_suffix(".seg").and_then(|b| b.parse().ok()) {
                        out.insert(Offset(b), e.metadata()?.len());
                    }
                }
                Ok(out)
            })
            .await
    }

    /// Writes `bytes` at `pos` of the staged segment starting at `base` (created when missing).
    pub async fn write(&self, base: Offset, pos: u64, bytes: Vec<u8>) -> std::io::Result<()> {
        let path = self.dir.join(segment_name(base));
        glommio::executor()
            .spawn_blocking(move || {
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&path)?;
                f.write_all_at(&bytes, pos)
            })
            .await
    }

    /// Removes the staged segment starting at `base` (gone at the source, or to be copied anew).
    pub async fn remove(&self, base: Offset) -> std::io::Result<()> {
        let path = self.dir.join(segment_name(base));
        glommio::executor()
            .spawn_blocking(move || match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            })
            .await
    }

    /// Makes the stage durable with `settled` as its consumer state: every segment fsynced, the
    /// state file replaced atomically, the directory fsynced.
    pub async fn seal(&self, settled: &Settled) -> std::io::Result<()> {
        let dir = self.dir.clone();
        let settled = settled.clone();
        glommio::executor()
            .spawn_blocking(move || {
                for e in std::fs::read_dir(&dir)? {
                    let e = e?;
                    if e.file_name().to_string_lossy().ends_with(".seg") {
                        std::fs::File::open(e.path())?.sync_all()?;
                    }
                }
                partition::state::write_state_file(&dir, &settled)?;
                crate::durable::sync_dir(&dir)
            })
            .await
    }
}
