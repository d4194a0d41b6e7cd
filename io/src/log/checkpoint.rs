//! Checkpoints: making everything the committer materialised durable in the partition files, then
//! releasing the WAL before it.
//!
//! Owns: [`ShardLog::checkpoint`] and the guard that runs one checkpoint at a time, the trigger
//! the committer pulls after each batch and when idle (`checkpoint_wal_bytes`,
//! `checkpoint_interval_ms`), the `Checkpoint { upto, marks }` record and the release of the WAL
//! segments before `upto`. Never: writes a partition frame (the committer does), or retries a
//! failed fsync.
//!
//! Crash safety: this file carries point 2 of the argument in `mod.rs`. `upto` and the dirty
//! files are captured in one synchronous section, and no batch is half-materialised outside the
//! committer's own synchronous section, so every WAL record before `upto` is in the files about
//! to be synced. The fsyncs run off the executor thread; only once all of them succeeded is the
//! `Checkpoint` record appended (through the group commit, as any request) and the WAL before
//! `upto` released. `upto` never passes a transit record not yet handed over (`transit.rs`). A
//! failed write (a full disk) leaves the WAL unreleased for the next checkpoint; a failed fsync
//! poisons the shard log.

use std::rc::Rc;
use std::time::{Duration, Instant};

use super::{count_failure, poison, Inner, Kind, LogError, ShardLog, Signals, State};
use crate::codec::WalRecord;
use crate::file::is_disk_full;
use crate::partition::{SyncError, SyncTimes, SyncWork};
use crate::types::{Offset, PartitionKey};

impl ShardLog {
    /// Makes everything materialised so far durable in the partition files and releases the WAL
    /// before it. Also runs by itself every `checkpoint_wal_bytes` / `checkpoint_interval_ms`.
    pub async fn checkpoint(&self) -> Result<(), LogError> {
        run_checkpoint(&self.inner, &self.signals).await
    }
}

async fn run_checkpoint(inner: &Rc<Inner>, signals: &Rc<Signals>) -> Result<(), LogError> {
    while inner.checkpoint_running.get() {
        let done = inner.checkpoint_done.notified();
        if !inner.checkpoint_running.get() {
            break;
        }
        done.await;
    }
    inner.checkpoint_running.set(true);
    // A log that already stopped refuses checkpoints: not a new failure.
    let poisoned_before = inner.state.borrow().poisoned.is_some() || inner.wal.poisoned().is_some();
    let r = checkpoint_once(inner, signals).await;
    if r.is_err() && !poisoned_before {
        count_failure(inner, |f| f.checkpoints += 1);
    }
    inner.checkpoint_running.set(false);
    inner.checkpoint_done.notify_waiters();
    r
}

async fn checkpoint_once(inner: &Rc<Inner>, signals: &Rc<Signals>) -> Result<(), LogError> {
    if let Some(p) = inner.state.borrow().poisoned.clone() {
        return Err(LogError::Poisoned(p));
    }
    // Capture P and the dirty files together: no batch is half-materialised outside the committer's
    // synchronous section, so every WAL record before `upto` is in these files and states.
    let (upto, marks, works) = {
        let mut st = inner.state.borrow_mut();
        // Never past a transit record that has not reached its owner.
        let held = st.transit_holds.values().min().copied();
        let upto = st.last_pos.map(|p| held.map_or(p, |h| h.min(p)));
        st.wal_bytes_since_checkpoint = 0;
        st.last_checkpoint_at = Instant::now();
        let mut works: Vec<SyncWork> = Vec::new();
        let mut marks = Vec::with_capacity(st.partitions.len().min(CHECKPOINT_MARKS_MAX));
        for (key, p) in st.partitions.iter_mut() {
            let w = p.take_sync_work()?;
            if !w.is_empty() {
                works.push(w);
            }
            // Every record below it is in the files the sync below makes durable.
            if p.next_offset() > Offset(0) {
                marks.push((*key, p.next_offset()));
            }
        }
        marks.sort_unstable();
        marks.truncate(CHECKPOINT_MARKS_MAX);
        (upto, marks, works)
    };
    if !works.is_empty() {
        let (times, synced) = glommio::executor()
            .spawn_blocking(move || {
                let mut times: Vec<(PartitionKey, SyncTimes, bool)> =
                    Vec::with_capacity(works.len());
                for w in works {
                    let key = w.key();
                    let (t, r) = w.run_timed();
                    times.push((key, t, r.is_ok()));
                    if let Err(e) = r {
                        return (times, Err(e));
                    }
                }
                (times, Ok(()))
            })
            .await;
        {
            let mut st = inner.state.borrow_mut();
            for (key, t, ok) in times {
                if let Some(p) = st.partitions.get_mut(&key) {
                    p.record_sync(t, ok);
                }
            }
        }
        match synced {
            Ok(()) => {}
            // Nothing replaced, WAL not released: retry at the next checkpoint.
            Err(SyncError::Write(e)) => {
                for p in inner.state.borrow_mut().partitions.values_mut() {
                    p.sync_failed();
                }
                tracing::warn!(shard = inner.cfg.shard.0, error = %e, "checkpoint could not write index/state files; will retry");
                return Err(if is_disk_full(&e) {
                    inner.wal.shed_recycled();
                    LogError::DiskFull
                } else {
                    LogError::Io(e)
                });
            }
            Err(e @ SyncError::Fsync(_)) => {
                let why = format!("checkpoint of partition files failed: {e}");
                poison(inner, why.clone());
                return Err(LogError::Poisoned(why));
            }
        }
    }
    let Some(upto) = upto else { return Ok(()) };
    if inner.state.borrow().last_checkpoint == Some(upto) {
        return Ok(());
    }
    let log = ShardLog {
        inner: inner.clone(),
        signals: signals.clone(),
    };
    log.submit(
        Kind::Checkpoint,
        vec![WalRecord::Checkpoint { upto, marks }],
    )
    .await?;
    inner.wal.release_before(upto).await?;
    let mut st = inner.state.borrow_mut();
    if st.last_checkpoint.is_none_or(|c| c < upto) {
        st.last_checkpoint = Some(upto);
    }
    Ok(())
}

/// Most partitions a checkpoint record marks (20 bytes each: 2 MB, within one WAL batch); the
/// partitions past it, in key order, are recovered without the check their mark gives.
const CHECKPOINT_MARKS_MAX: usize = 100_000;

/// Whether records other than checkpoints were made durable after the last checkpoint (and
/// the log still takes writes).
pub(super) fn checkpoint_owed(st: &State) -> bool {
    st.poisoned.is_none() && !st.closed && st.last_content_pos > st.last_checkpoint
}

/// Starts a background checkpoint when the WAL grew by `checkpoint_wal_bytes` or
/// `checkpoint_interval_ms` passed with something new.
pub(super) fn maybe_checkpoint(inner: &Rc<Inner>, signals: &Rc<Signals>) {
    if inner.checkpoint_running.get() {
        return;
    }
    let due = {
        let st = inner.state.borrow();
        checkpoint_owed(&st)
            && (st.wal_bytes_since_checkpoint >= inner.cfg.checkpoint_wal_bytes
                || st.last_checkpoint_at.elapsed()
                    >= Duration::from_millis(inner.cfg.checkpoint_interval_ms))
    };
    if due {
        let (inner, signals) = (inner.clone(), signals.clone());
        crate::rt::spawn(async move {
            if let Err(e) = run_checkpoint(&inner, &signals).await {
                tracing::error!(shard = inner.cfg.shard.0, error = %e, "checkpoint failed");
            }
        })
        .detach();
    }
}
