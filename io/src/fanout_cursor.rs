//! The fan-out cursor file of one shard: `<data_dir>/fanout/shard-<i>.cursors`.
//!
//! Owns the byte format and the atomic, durable replacement of that file. Never decides what a
//! cursor means or when it may move (that is `narad_shard::fanout`); never touches partition
//! segments or the WAL.
//!
//! # Format (little endian)
//! | Bytes | Field |
//! |---|---|
//! | 8 | magic `NARADFOC` |
//! | 2 | version (1) |
//! | 2 | reserved, 0 |
//! | 4 | entry count `n` (≤ [`CURSOR_ENTRIES_MAX`]) |
//! | 36 × n | entries: parent topic id u64, parent partition u32, child topic id u64, attach epoch u64, next offset u64 |
//! | 4 | CRC-32/IEEE ([`crate::checksum::crc32_ieee`]) of everything before |
//!
//! # Crash safety
//! [`store`] writes a temporary file (`shard-<i>.cursors.tmp`), fdatasyncs it, renames it over the
//! old file and fsyncs the directory ([`crate::durable::replace_file`], whose doc has the
//! argument): after a crash the file is either the old or the new version, whole. A directory
//! created for the first file is made durable in its parent first. A damaged or
//! unreadable file loads as empty, which restarts every cursor at its attach point: duplicates
//! in the children, never gaps (the caller only ever stores positions whose records were copied).

use std::path::{Path, PathBuf};

use crate::checksum::crc32_ieee;
use crate::durable;
use crate::types::{Offset, PartitionId, PartitionKey, ShardId, TopicId};

pub const CURSOR_MAGIC: [u8; 8] = *b"NARADFOC";
pub const CURSOR_VERSION: u16 = 1;
/// Entries one file may hold (108 children × 4096 partitions is far below).
pub const CURSOR_ENTRIES_MAX: usize = 1 << 20;
const HEADER_BYTES: usize = 16;
const ENTRY_BYTES: usize = 36;

/// One persisted cursor: the next parent offset to copy to `child` under `epoch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CursorEntry {
    pub parent: PartitionKey,
    pub child: TopicId,
    pub epoch: u64,
    pub next: Offset,
}

/// `<data_dir>/fanout/shard-<i>.cursors`.
pub fn cursor_path(data_dir: &Path, shard: ShardId) -> PathBuf {
    data_dir
        .join("fanout")
        .join(format!("shard-{}.cursors", shard.0))
}

pub fn encode(entries: &[CursorEntry]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER_BYTES + ENTRY_BYTES * entries.len() + 4);
    v.extend_from_slice(&CURSOR_MAGIC);
    v.extend_from_slice(&CURSOR_VERSION.to_le_bytes());
    v.extend_from_slice(&[0, 0]);
    v.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for e in entries {
        v.extend_from_slice(&e.parent.topic.0.to_le_bytes());
        v.extend_from_slice(&e.parent.partition.0.to_le_bytes());
        v.extend_from_slice(&e.child.0.to_le_bytes());
        v.extend_from_slice(&e.epoch.to_le_bytes());
        v.extend_from_slice(&e.next.0.to_le_bytes());
    }
    let c = crc32_ieee(&v);
    v.extend_from_slice(&c.to_le_bytes());
    v
}

#[derive(Debug, PartialEq, Eq)]
pub enum CursorFileError {
    Truncated,
    BadMagic,
    BadVersion(u16),
    TooMany(u32),
    BadCrc,
}

pub fn decode(b: &[u8]) -> Result<Vec<CursorEntry>, CursorFileError> {
    if b.len() < HEADER_BYTES + 4 {
        return Err(CursorFileError::Truncated);
    }
    if b[..8] != CURSOR_MAGIC {
        return Err(CursorFileError::BadMagic);
    }
    let version = u16::from_le_bytes([b[8], b[9]]);
    if version != CURSOR_VERSION {
        return Err(CursorFileError::BadVersion(version));
    }
    let count = u32::from_le_bytes([b[12], b[13], b[14], b[15]]);
    if count as usize > CURSOR_ENTRIES_MAX {
        return Err(CursorFileError::TooMany(count));
    }
    let body = HEADER_BYTES + ENTRY_BYTES * count as usize;
    if b.len() != body + 4 {
        return Err(CursorFileError::Truncated);
    }
    let stored = u32::from_le_bytes([b[body], b[body + 1], b[body + 2], b[body + 3]]);
    if crc32_ieee(&b[..body]) != stored {
        return Err(CursorFileError::BadCrc);
    }
    let u64_at = |at: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(a)
    };
    let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    Ok((0..count as usize)
        .map(|i| {
            let at = HEADER_BYTES + ENTRY_BYTES * i;
            CursorEntry {
                parent: PartitionKey {
                    topic: TopicId(u64_at(at)),
                    partition: PartitionId(u32_at(at + 8)),
                },
                child: TopicId(u64_at(at + 12)),
                epoch: u64_at(at + 20),
                next: Offset(u64_at(at + 28)),
            }
        })
        .collect())
}

/// Reads the cursor file (blocking; it is small and read once at start). Missing → empty;
/// damaged → logged and empty (cursors restart at their attach points: duplicates, not gaps).
pub fn load(path: &Path) -> Vec<CursorEntry> {
    match std::fs::read(path) {
        Ok(b) => match decode(&b) {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(path = %path.display(), error = ?e,
                    "fan-out cursor file is damaged; cursors restart at their attach points (children get duplicates)");
                Vec::new()
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e,
                "fan-out cursor file cannot be read; cursors restart at their attach points");
            Vec::new()
        }
    }
}

fn store_blocking(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other("cursor path has no directory"))?;
    let fresh_dir = !dir.exists();
    std::fs::create_dir_all(dir)?;
    if fresh_dir {
        if let Some(up) = dir.parent() {
            durable::sync_dir(up)?;
        }
    }
    durable::replace_file(path, bytes)
}

/// Replaces the cursor file atomically and durably, off the executor thread. Resolves after the
/// directory fsync.
pub async fn store(path: PathBuf, entries: Vec<CursorEntry>) -> std::io::Result<()> {
    if entries.len() > CURSOR_ENTRIES_MAX {
        return Err(std::io::Error::other("too many fan-out cursors"));
    }
    let bytes = encode(&entries);
    glommio::executor()
        .spawn_blocking(move || store_blocking(&path, &bytes))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(i: u64) -> CursorEntry {
        CursorEntry {
            parent: PartitionKey {
                topic: TopicId(0xabc + i),
                partition: PartitionId(i as u32),
            },
            child: TopicId(7 * i + 1),
            epoch: 0xdead_beef ^ i,
            next: Offset(i * 1000),
        }
    }

    #[test]
    fn round_trip_and_corruption_is_detected() {
        // Proves every field survives encode/decode and that a flipped bit or a cut tail is
        // refused instead of read as positions.
        let v: Vec<CursorEntry> = (0..50).map(entry).collect();
        let b = encode(&v);
        assert_eq!(decode(&b).unwrap(), v);
        assert_eq!(decode(&encode(&[])).unwrap(), Vec::new());
        for at in [0, 9, 13, 20, b.len() / 2, b.len() - 1] {
            let mut bad = b.clone();
            bad[at] ^= 0x10;
            assert!(decode(&bad).is_err(), "flip at {at} accepted");
        }
        assert_eq!(decode(&b[..b.len() - 3]), Err(CursorFileError::Truncated));
    }

    #[test]
    fn store_replaces_the_file_and_load_reads_it_back() {
        // Proves store/load through the real file system, including creating the directory,
        // and that a damaged file loads as empty.
        let dir = std::env::temp_dir().join(format!(
            "narad-foc-{}-{}",
            std::process::id(),
            crate::types::UnixMillis::now().0
        ));
        let path = cursor_path(&dir, ShardId(1));
        crate::rt::block_on(async {
            store(path.clone(), vec![entry(1)]).await.unwrap();
            store(path.clone(), vec![entry(2), entry(3)]).await.unwrap();
        });
        assert_eq!(load(&path), vec![entry(2), entry(3)]);
        std::fs::write(&path, b"garbage").unwrap();
        assert!(load(&path).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
