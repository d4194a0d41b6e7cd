//! `narad-io`: the only crate that names glommio. It owns the runtime (one pinned executor per
//! core), files opened for direct I/O, the per-shard write-ahead log with its group commit, and
//! the per-partition segment files that reads are served from. It also holds the one
//! implementation of each durability primitive ([`durable`]: atomic durable replace, directory
//! fsync, `fallocate`) that the other crates use instead of their own.

pub mod checksum;
pub mod codec;
pub mod durable;
pub mod fanout_cursor;
pub mod file;
pub mod frame;
pub mod log;
pub mod partition;
pub mod peer;
pub mod rt;
pub mod stats;
pub mod sys;
pub mod types;
pub mod wal;
