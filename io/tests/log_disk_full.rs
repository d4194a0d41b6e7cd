//! Disk full under a ShardLog, on a small real filesystem (tmpfs): appends fail with
//! LogError::DiskFull (not Poisoned), nothing acknowledged is lost, appends succeed again once
//! space frees, and a restart reads back every acknowledged record. Needs permission to mount
//! tmpfs (root in the CI container); not running as root, the test says so
//! and returns; as root, a failed mount fails it.

mod tmpfs;

mod common_log;

use common_log::*;
use narad_io::log::{AppendRecord, LogConfig, LogError, ShardLog};
use narad_io::rt;
use narad_io::types::{Destination, Offset, PartitionKey, ShardId};
use std::rc::Rc;
use std::time::Duration;
use tmpfs::Mount;

#[test]
fn disk_full_is_an_error_value_and_recovers_when_space_frees() {
    // Proves: on a 6 MiB filesystem, appends of 3 KB records eventually answer DiskFull (not
    // Poisoned) with the log still healthy; after a ballast file is removed appends succeed;
    // every acknowledged record reads back, before and after a restart.
    let Some((mount, ballast)) = small_disk("narad-log-full") else {
        return;
    };
    let data = mount.0.join("data");
    let wal_dir = data.clone();
    let cfg = small_cfg(data, 256 << 10);
    let k = key(30, 0);
    let rec = |i: u64| record(k, i);
    let c = cfg.clone();
    let acked = rt::block_on(async move {
        let (log, _, _) = ShardLog::open(c).await.expect("open");
        let mut acked = Vec::new();
        assert!(
            fill(&log, &rec, 0..5000, &mut acked).await,
            "never hit disk full"
        );
        assert!(log.poisoned().is_none(), "{:?}", log.poisoned());
        // Disk full sheds the released WAL segments kept for reuse: appends may go on until the
        // disk is full again, and then fail the same way.
        assert!(
            fill(&log, &rec, 5000..10_000, &mut acked).await,
            "never hit disk full again"
        );
        // The deletion runs in the background: give it up to 2 s.
        let kept = || {
            std::fs::read_dir(wal_dir.join("ingress/shard-0"))
                .expect("wal dir")
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with("recycled-"))
                .count()
        };
        for _ in 0..200 {
            if kept() == 0 {
                break;
            }
            rt::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(kept(), 0, "kept WAL segments not deleted on disk full");
        let hwm = log.high_watermark(k);
        assert_eq!(
            hwm,
            Offset(acked.len() as u64),
            "a failed append leaves no offset behind"
        );
        std::fs::remove_file(&ballast).expect("free space");
        let o = log
            .append(vec![rec(7777)])
            .await
            .expect("append after space freed");
        assert_eq!(o, vec![hwm]);
        acked.push((o[0], 7777));
        reads_back(&log, k, &acked).await;
        drop(log);
        acked
    });
    rt::block_on(async move {
        let (log, _, _) = ShardLog::open(cfg).await.expect("reopen");
        reads_back(&log, k, &acked).await;
    });
    drop(mount);
}

/// A 6 MiB tmpfs named after `name` and the process, holding a 1 MiB ballast file whose path
/// comes with it (remove it to free space); `None` when tmpfs cannot be mounted (not root).
fn small_disk(name: &str) -> Option<(Mount, std::path::PathBuf)> {
    let mnt = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    let mount = Mount::tmpfs(&mnt, 6 << 20)?;
    let ballast = mount.0.join("ballast");
    std::fs::write(&ballast, vec![1u8; 1 << 20]).expect("ballast");
    Some((mount, ballast))
}

/// A log sized for a few MiB of disk: 512 KiB WAL segments, 256 KiB partition segments, a
/// checkpoint every `checkpoint_wal_bytes` of WAL (never by time).
fn small_cfg(data: std::path::PathBuf, checkpoint_wal_bytes: u64) -> LogConfig {
    LogConfig {
        wal_segment_bytes: 512 << 10,
        wal_batch_bytes_max: 64 << 10,
        wal_batch_records_max: 64,
        append_queue_bytes_max: 256 << 10,
        partition_segment_bytes_max: 256 << 10,
        checkpoint_wal_bytes,
        checkpoint_interval_ms: 3_600_000,
        ..LogConfig::new(data, ShardId(0), 1)
    }
}

/// Record `i` of partition `k`: 3,000 bytes of `i as u8`.
fn record(k: narad_io::types::PartitionKey, i: u64) -> AppendRecord {
    AppendRecord {
        key: k,
        msg_key: None,
        payload: vec![i as u8; 3000].into(),
    }
}

/// Asserts every acknowledged (offset, id) of partition `k` reads back as record `id`.
async fn reads_back(log: &ShardLog, k: narad_io::types::PartitionKey, acked: &[(Offset, u64)]) {
    for &(o, i) in acked {
        assert_eq!(
            log.read(k, o, 1, 1).await.unwrap()[0].payload,
            record(k, i).payload,
            "offset {}",
            o.0
        );
    }
}

/// Appends the records `ids` one by one until one fails with DiskFull (returns true), pushing
/// each acknowledged one's offset and id to `acked`.
async fn fill(
    log: &ShardLog,
    rec: &impl Fn(u64) -> AppendRecord,
    ids: std::ops::Range<u64>,
    acked: &mut Vec<(Offset, u64)>,
) -> bool {
    for i in ids {
        match log.append(vec![rec(i)]).await {
            Ok(o) => acked.push((o[0], i)),
            Err(LogError::DiskFull) => return true,
            Err(e) => panic!("append {i}: unexpected {e}"),
        }
    }
    false
}

#[test]
fn a_log_reopens_on_a_full_disk_and_serves_reads() {
    // Proves a shard log stopped without a checkpoint (as by kill -9) reopens on a filesystem
    // with no byte free, although the checkpoint after recovery cannot write its state files:
    // every acknowledged record reads back, and appends answer DiskFull instead of the open
    // failing (before: open returned DiskFull and the node refused to start).
    let mnt = std::env::temp_dir().join(format!("narad-log-full-open-{}", std::process::id()));
    let Some(mount) = Mount::tmpfs(&mnt, 6 << 20) else {
        return;
    };
    let data = mount.0.join("data");
    // No checkpoint while filling: the reopen has everything to replay.
    let cfg = small_cfg(data, 1 << 40);
    let k = key(31, 0);
    let rec = |i: u64| record(k, i);
    let c = cfg.clone();
    let ballast = mount.0.join("ballast");
    let acked = rt::block_on(async move {
        let (log, _, _) = ShardLog::open(c).await.expect("open");
        let mut acked = Vec::new();
        assert!(
            fill(&log, &rec, 0..5000, &mut acked).await,
            "never hit disk full"
        );
        // Acks to replay: their settled state is what the checkpoint must write out.
        log.settle(k, vec![Offset(0), Offset(1)])
            .await
            .expect("settle");
        drop(log);
        acked
    });
    // Not a byte left for the state files.
    let mut f = std::fs::File::create(&ballast).expect("ballast");
    let chunk = vec![7u8; 4096];
    for _ in 0..4096 {
        if std::io::Write::write_all(&mut f, &chunk).is_err() {
            break;
        }
    }
    drop(f);
    rt::block_on(async move {
        let (log, _, report) = ShardLog::open(cfg).await.expect("reopen on a full disk");
        assert!(report.wal.records_replayed > 0, "{report:?}");
        reads_back(&log, k, &acked).await;
        assert!(matches!(
            log.append(vec![rec(1)]).await,
            Err(LogError::DiskFull)
        ));
    });
    drop(mount);
}

#[test]
fn batches_planned_behind_a_refused_one_never_become_durable_with_a_gap() {
    // Proves the pipelined committer never makes a batch durable whose offsets were planned
    // behind a batch the WAL refused (segment allocation failed on a full disk): 16 appenders on
    // one partition, large transit records filling the WAL (so that its 1 MiB segment
    // allocation, not a partition's, finds the disk full), and the space freed the moment the
    // WAL reports the disk full. The log is never poisoned ("does not continue the log"), every
    // acknowledged offset is distinct and reads back, before and after a restart. Before, a
    // batch planned while the refused one was in flight could be written to a segment allocated
    // once space had freed: the shard poisoned itself and its offsets became permanent holes.
    let two = |k: PartitionKey| narad_io::types::owner_shard(k, 2);
    let k = (0..2)
        .map(|p| key(32, p))
        .find(|k| two(*k) == ShardId(0))
        .unwrap();
    let away = (0..2)
        .map(|p| key(32, p))
        .find(|k| two(*k) == ShardId(1))
        .unwrap();
    for round in 0..6u64 {
        let Some((mount, ballast)) = small_disk(&format!("narad-log-full-race-{round}")) else {
            return;
        };
        let data = mount.0.join("data");
        let cfg = LogConfig {
            wal_pipeline_min_bytes: 0,
            // No checkpoint: WAL segments are never released, so each new one is allocated.
            wal_segment_bytes: 1 << 20,
            ..LogConfig {
                shard_count: 2,
                ..small_cfg(data, 1 << 40)
            }
        };
        let c = cfg.clone();
        let acked = rt::block_on(async move {
            let (log, _, _) = ShardLog::open(c).await.expect("open");
            let log = Rc::new(log);
            // Set once the ballast is gone; the appenders stop a little after.
            let freed = Rc::new(std::cell::Cell::new(false));
            let freer = {
                let log = log.clone();
                let freed = freed.clone();
                rt::spawn(async move {
                    let start = std::time::Instant::now();
                    while start.elapsed() < Duration::from_secs(30) {
                        if log.wal_stats().disk_full > 0 {
                            std::fs::remove_file(&ballast).expect("free space");
                            freed.set(true);
                            return true;
                        }
                        rt::sleep(Duration::from_micros(50)).await;
                    }
                    freed.set(true);
                    false
                })
            };
            let filler = {
                let log = log.clone();
                let freed = freed.clone();
                rt::spawn(async move {
                    for i in 0..3000u64 {
                        if freed.get() {
                            break;
                        }
                        match log
                            .append_transit(Destination::Shard(ShardId(1)), record(away, i))
                            .await
                        {
                            Ok(_) | Err(LogError::DiskFull) => {}
                            Err(e) => panic!("transit {i}: {e}"),
                        }
                    }
                })
            };
            let appenders: Vec<_> = (0..16u64)
                .map(|a| {
                    let log = log.clone();
                    let freed = freed.clone();
                    rt::spawn(async move {
                        let mut acked = Vec::new();
                        let mut after = 0;
                        for i in 0..100_000u64 {
                            after += u32::from(freed.get());
                            if after > 200 {
                                break;
                            }
                            let id = a * 1_000_000 + i;
                            match log.append(vec![small(k, id)]).await {
                                Ok(o) => acked.push((o[0], id)),
                                Err(LogError::DiskFull) => {}
                                Err(e) => panic!("append {id}: {e}"),
                            }
                        }
                        acked
                    })
                })
                .collect();
            // Appends started on a clock, not after an answer: the log's committer hears of new
            // work at any moment, also while a refused batch's answer is on its way to it.
            let ticker = {
                let log = log.clone();
                let freed = freed.clone();
                rt::spawn(async move {
                    let mut started = Vec::new();
                    let mut after = 0;
                    for i in 0..200_000u64 {
                        after += u32::from(freed.get());
                        if after > 2_000 {
                            break;
                        }
                        rt::sleep(Duration::from_micros(20)).await;
                        let log = log.clone();
                        let id = 100_000_000 + i;
                        started.push(rt::spawn(async move {
                            (id, log.append(vec![small(k, id)]).await)
                        }));
                    }
                    let mut acked = Vec::new();
                    for t in started {
                        match t.await {
                            (id, Ok(o)) => acked.push((o[0], id)),
                            (_, Err(LogError::DiskFull)) => {}
                            (id, Err(e)) => panic!("append {id}: {e}"),
                        }
                    }
                    acked
                })
            };
            let mut acked = ticker.await;
            for t in appenders {
                acked.extend(t.await);
            }
            filler.await;
            assert!(freer.await, "the WAL never found the disk full");
            assert!(log.poisoned().is_none(), "{:?}", log.poisoned());
            acked.sort();
            let before = acked.len();
            acked.dedup_by_key(|a| a.0);
            assert_eq!(acked.len(), before, "an offset acknowledged twice");
            small_reads_back(&log, k, &acked).await;
            acked
        });
        rt::block_on(async move {
            let (log, _, _) = ShardLog::open(cfg).await.expect("reopen");
            small_reads_back(&log, k, &acked).await;
        });
        drop(mount);
    }
}

/// Record `i` of partition `k`, 8 bytes: `i` little-endian.
fn small(k: PartitionKey, i: u64) -> AppendRecord {
    AppendRecord {
        key: k,
        msg_key: None,
        payload: i.to_le_bytes().to_vec().into(),
    }
}

/// Asserts every acknowledged (offset, id) of partition `k` reads back as [`small`] record `id`.
async fn small_reads_back(log: &ShardLog, k: PartitionKey, acked: &[(Offset, u64)]) {
    for &(o, i) in acked {
        let r = log.read(k, o, 1, 1).await.unwrap();
        assert_eq!(r[0].payload, small(k, i).payload, "offset {}", o.0);
    }
}

#[test]
fn settles_on_a_full_disk_are_written_once_space_frees_never_dropped() {
    // Proves a settle (an ack the shard answers once it is queued) is never dropped by a full
    // disk: each settle is queued with an append in the same group commit; the append is refused
    // (`DiskFull`) while the settle either becomes durable at once (it needs WAL room only, not
    // the partition's) or, once the WAL itself has no room, waits (`settle_backlog`) and is
    // written as soon as space frees. After a restart every settled offset is still settled.
    // Before, the settle failed with the batch and was never written again: an ack answered
    // while the disk was full came back after the next crash.
    let Some((mount, ballast)) = small_disk("narad-log-full-settle") else {
        return;
    };
    // No checkpoint: the restart replays every settle from the WAL.
    let cfg = small_cfg(mount.0.join("data"), 1 << 40);
    let k = key(33, 0);
    let rec = |i: u64| record(k, i);
    let c = cfg.clone();
    let settled = rt::block_on(async move {
        let (log, _, _) = ShardLog::open(c).await.expect("open");
        let mut acked = Vec::new();
        assert!(
            fill(&log, &rec, 0..5000, &mut acked).await,
            "never hit disk full"
        );
        let mut settled = Vec::new();
        let mut waiting = None;
        for &(offset, i) in &acked {
            // Both are queued before the committer runs: one batch.
            let (append, durable) = futures_lite::future::zip(log.append(vec![rec(i)]), async {
                log.settle_many(vec![(k, vec![offset])]).await
            })
            .await;
            assert!(
                matches!(append, Err(LogError::DiskFull)),
                "append beside settle {}: {append:?}",
                offset.0
            );
            let durable = durable.expect("settle queued");
            settled.push(offset);
            match rt::timeout(Duration::from_millis(500), durable).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => panic!(
                    "settle of offset {} failed on the full disk ({e}): its ack was answered and \
                     would come back after a crash",
                    offset.0
                ),
                Err(_) => {
                    waiting = Some(offset);
                    break;
                }
            }
        }
        let Some(waiting) = waiting else {
            panic!(
                "the WAL never ran out of room for {} settles",
                settled.len()
            )
        };
        assert!(log.settle_backlog() > 0, "settle {} waits", waiting.0);
        assert_eq!(
            log.settled(k).frontier,
            waiting,
            "not settled before it is durable"
        );
        std::fs::remove_file(&ballast).expect("free space");
        let start = std::time::Instant::now();
        while log.settle_backlog() > 0 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "settles still waiting 10 s after space freed"
            );
            rt::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(log.settled(k).frontier, Offset(waiting.0 + 1));
        assert!(log.poisoned().is_none(), "{:?}", log.poisoned());
        drop(log);
        settled
    });
    rt::block_on(async move {
        let (_log, recovered, _) = ShardLog::open(cfg).await.expect("reopen");
        let p = recovered
            .iter()
            .find(|p| p.key == k)
            .expect("partition recovered");
        let last = *settled.last().expect("settled something");
        assert_eq!(
            p.settled.frontier,
            Offset(last.0 + 1),
            "every settle survived the restart ({} of them)",
            settled.len()
        );
    });
    drop(mount);
}
