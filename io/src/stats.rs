//! Per-shard I/O statistics for `/metrics` that the storage types do not keep themselves: the
//! latency of every WAL `fdatasync`, in fixed buckets with a running sum, so that it can be
//! exposed as a Prometheus histogram (`_bucket`, `_sum`, `_count`). Also [`Durations`], the
//! fixed-bucket histogram the storage types embed for their own timings (a partition's segment
//! writes, its share of a checkpoint, its retention passes).
//!
//! Owns: one thread-local set of plain `Cell` counters per executor thread, that is per shard (a
//! shard is one thread). Recording is a bucket search over a small fixed array and two `Cell`
//! writes: no atomics, no locks, no allocation. Never shared between threads: another shard's
//! figures are obtained by asking that shard (the node's mesh), which calls [`wal_fsync`] there.
//! Never touches a file.

use std::cell::Cell;
use std::time::Duration;

/// Upper bounds, in microseconds, of the WAL fsync latency buckets (`le`); one more bucket
/// counts everything above the last bound (`+Inf`).
pub const FSYNC_BUCKET_BOUNDS_US: [u64; 15] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 10_000_000,
];

const FSYNC_BUCKETS: usize = FSYNC_BUCKET_BOUNDS_US.len() + 1;

/// Upper bounds, in microseconds, of [`Durations`]: 5 µs (a page-cache write) to 10 s; one more
/// bucket counts everything above.
pub const DURATION_BOUNDS_US: [u64; 19] = [
    5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
    500_000, 1_000_000, 2_500_000, 10_000_000,
];

/// Durations in the buckets of [`DURATION_BOUNDS_US`] with their sum: a plain value embedded in
/// whatever owns the timed work (no allocation, no atomics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Durations {
    /// Count per bucket (not cumulative); the last one holds durations above the last bound.
    pub buckets: [u64; DURATION_BOUNDS_US.len() + 1],
    pub sum_us: u64,
}

impl Durations {
    pub fn record(&mut self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let i = DURATION_BOUNDS_US.partition_point(|&b| b < us);
        self.buckets[i] = self.buckets[i].wrapping_add(1);
        self.sum_us = self.sum_us.saturating_add(us);
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

/// WAL fsync latencies recorded on one shard since it started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FsyncStats {
    /// Count per bucket (not cumulative): `buckets[i]` holds latencies in
    /// `(FSYNC_BUCKET_BOUNDS_US[i-1], FSYNC_BUCKET_BOUNDS_US[i]]`; the last one holds the rest.
    pub buckets: [u64; FSYNC_BUCKETS],
    /// Sum of all recorded latencies, microseconds.
    pub sum_us: u64,
}

impl FsyncStats {
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

struct Local {
    buckets: [Cell<u64>; FSYNC_BUCKETS],
    sum_us: Cell<u64>,
}

thread_local! {
    static LOCAL: Local = const {
        Local {
            buckets: [const { Cell::new(0) }; FSYNC_BUCKETS],
            sum_us: Cell::new(0),
        }
    };
}

fn bucket_of(us: u64) -> usize {
    FSYNC_BUCKET_BOUNDS_US.partition_point(|&b| b < us)
}

/// Records one WAL `fdatasync` that took `d` on the calling shard.
pub fn record_wal_fsync(d: Duration) {
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    LOCAL.with(|l| {
        let b = &l.buckets[bucket_of(us)];
        b.set(b.get().wrapping_add(1));
        l.sum_us.set(l.sum_us.get().saturating_add(us));
    });
}

/// The calling shard's WAL fsync latencies so far.
pub fn wal_fsync() -> FsyncStats {
    LOCAL.with(|l| FsyncStats {
        buckets: std::array::from_fn(|i| l.buckets[i].get()),
        sum_us: l.sum_us.get(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fsync_latencies_land_in_their_bucket_and_sum() {
        // Proves bucket edges are inclusive upper bounds (Prometheus `le`), values above the last
        // bound go to the overflow bucket, and the sum and count follow every record.
        std::thread::spawn(|| {
            record_wal_fsync(Duration::from_micros(0));
            record_wal_fsync(Duration::from_micros(50));
            record_wal_fsync(Duration::from_micros(51));
            record_wal_fsync(Duration::from_secs(60));
            let s = wal_fsync();
            assert_eq!(s.buckets[0], 2);
            assert_eq!(s.buckets[1], 1);
            assert_eq!(s.buckets[FSYNC_BUCKETS - 1], 1);
            assert_eq!(s.count(), 4);
            assert_eq!(s.sum_us, 101 + 60_000_000);
        })
        .join()
        .unwrap();
        // Another thread (shard) starts from zero.
        std::thread::spawn(|| assert_eq!(wal_fsync().count(), 0))
            .join()
            .unwrap();
    }

    #[test]
    fn durations_land_in_their_bucket_and_sum() {
        // Proves the bounds are inclusive (Prometheus `le`), values above the last bound go to
        // the overflow bucket, and count and sum follow every record.
        let mut d = Durations::default();
        d.record(Duration::from_micros(5));
        d.record(Duration::from_micros(6));
        d.record(Duration::from_secs(11));
        assert_eq!(d.buckets[0], 1);
        assert_eq!(d.buckets[1], 1);
        assert_eq!(d.buckets[DURATION_BOUNDS_US.len()], 1);
        assert_eq!(d.count(), 3);
        assert_eq!(d.sum_us, 11 + 11_000_000);
    }
}
