//! ShardLog recovery on the real disk: after a clean close, after a "crash" (dropped without
//! close, partition files never fsynced), with partition files lost or torn, and settled state.

mod common_log;

use std::path::Path;

use common_log::*;
use narad_io::log::{LogConfig, ReadError, Settled, ShardLog};
use narad_io::partition;
use narad_io::rt;
use narad_io::types::{Destination, MemberId, Offset, PartitionKey, ShardId};

/// Appends `n` records to each of `keys` (one call per record index, all keys in one call).
async fn fill(log: &ShardLog, keys: &[PartitionKey], from: u64, n: u64) {
    for i in from..from + n {
        let offs = log
            .append(keys.iter().map(|&k| rec(k, i)).collect())
            .await
            .unwrap();
        assert!(offs.iter().all(|o| *o == Offset(i)));
    }
}

async fn check(log: &ShardLog, keys: &[PartitionKey], n: u64) {
    for &k in keys {
        assert_eq!(log.high_watermark(k), Offset(n), "{k:?}");
        let mut o = 0;
        while o < n {
            for r in log.read(k, Offset(o), 33, 1 << 20).await.unwrap() {
                assert_eq!(r.offset, Offset(o));
                assert_eq!(r.payload, payload(k, o), "{k:?} offset {o}");
                o += 1;
            }
        }
    }
}

fn reopen_check(cfg: &LogConfig, keys: &[PartitionKey], n: u64) -> narad_io::log::RecoveryReport {
    let (cfg, keys) = (cfg.clone(), keys.to_vec());
    rt::block_on(async move {
        let (log, recovered, report) = ShardLog::open(cfg).await.unwrap();
        assert_eq!(recovered.iter().map(|r| r.key).collect::<Vec<_>>(), keys);
        assert!(recovered.iter().all(|r| r.next_offset == Offset(n)));
        check(&log, &keys, n).await;
        // The log continues at the right offsets after recovery.
        fill(&log, &keys, n, 3).await;
        check(&log, &keys, n + 3).await;
        log.close().await.unwrap();
        report
    })
}

fn wal_segments(cfg: &LogConfig) -> usize {
    std::fs::read_dir(cfg.wal_dir())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "wal")
        })
        .count()
}

#[test]
fn records_survive_close_and_reopen() {
    // Proves every record is read back after a clean close (which checkpoints: nothing is
    // replayed from the WAL), and the log continues at the right offsets.
    let dir = temp_dir("close");
    let cfg = small_cfg(dir.clone());
    let keys = [key(1, 0), key(1, 1), key(2, 0)];
    let c = cfg.clone();
    rt::block_on(async move {
        let (log, _, _) = ShardLog::open(c).await.unwrap();
        fill(&log, &keys, 0, 300).await;
        log.close().await.unwrap();
    });
    let report = reopen_check(&cfg, &keys, 300);
    assert_eq!(report.replayed_messages, 0);
    assert_eq!(report.scan.records, 900);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn crash_without_close_replays_the_wal() {
    // Proves that after a crash (log dropped without close, no checkpoint ever ran) with the
    // partition files lost entirely (never fsynced), recovery rebuilds every acknowledged record
    // from the WAL, and a second restart finds them in the partition files.
    let dir = temp_dir("crash");
    let cfg = small_cfg(dir.clone());
    let keys = [key(1, 0), key(3, 5)];
    let c = cfg.clone();
    rt::block_on(async move {
        let (log, _, _) = ShardLog::open(c).await.unwrap();
        fill(&log, &keys, 0, 200).await;
        drop(log);
    });
    std::fs::remove_dir_all(partition::topics_dir(&dir)).unwrap();
    let report = reopen_check(&cfg, &keys, 200);
    assert_eq!(report.replayed_messages, 400);
    let report = reopen_check(&cfg, &keys, 203);
    assert_eq!(report.replayed_messages, 0);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn torn_partition_tail_is_refilled_from_the_wal() {
    // Proves that a partition segment torn at an arbitrary byte after a crash is truncated and
    // the missing records are replayed from the WAL at their original offsets.
    let dir = temp_dir("torn");
    let cfg = small_cfg(dir.clone());
    let keys = [key(4, 2)];
    let c = cfg.clone();
    rt::block_on(async move {
        let (log, _, _) = ShardLog::open(c).await.unwrap();
        fill(&log, &keys, 0, 50).await;
        log.checkpoint().await.unwrap();
        fill(&log, &keys, 50, 50).await;
        drop(log);
    });
    let pdir = partition::partition_dir(&dir, keys[0]);
    let newest = std::fs::read_dir(&pdir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .max()
        .unwrap();
    let len = std::fs::metadata(&newest).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&newest)
        .unwrap()
        .set_len(len - 77)
        .unwrap();
    let report = reopen_check(&cfg, &keys, 100);
    assert!(report.scan.torn_tail_bytes > 0);
    assert!(report.replayed_messages >= 1);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn checkpoint_releases_wal_segments_and_bounds_replay() {
    // Proves checkpoints release WAL segments (the WAL does not grow without bound) and that
    // recovery replays only what came after the last checkpoint.
    let dir = temp_dir("checkpoint");
    let mut cfg = small_cfg(dir.clone());
    cfg.checkpoint_wal_bytes = 512 << 10;
    let keys = [key(5, 0), key(5, 1)];
    let c = cfg.clone();
    let segs_before_crash = rt::block_on(async move {
        let (log, _, _) = ShardLog::open(c.clone()).await.unwrap();
        fill(&log, &keys, 0, 2000).await;
        // Let the background checkpoint (triggered by bytes) finish, then one explicit one.
        log.checkpoint().await.unwrap();
        fill(&log, &keys, 2000, 10).await;
        let segs = wal_segments(&c);
        drop(log);
        segs
    });
    assert!(
        segs_before_crash <= 2,
        "WAL segments left: {segs_before_crash}"
    );
    let report = reopen_check(&cfg, &keys, 2010);
    assert_eq!(
        report.replayed_messages, 0,
        "partition files hold them (page cache survives)"
    );
    assert!(
        report.skipped_present <= 20,
        "replayed only after the checkpoint: {}",
        report.skipped_present
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn settles_survive_restart() {
    // Proves settled offsets (frontier and acked-ahead set) are durable once settle resolves:
    // after a crash without checkpoint (WAL replay) and after a checkpoint (state file).
    let dir = temp_dir("settle");
    let cfg = small_cfg(dir.clone());
    let k = key(6, 1);
    let c = cfg.clone();
    rt::block_on(async move {
        let (log, _, _) = ShardLog::open(c).await.unwrap();
        fill(&log, &[k], 0, 20).await;
        log.settle(k, vec![Offset(0), Offset(1), Offset(2), Offset(7)])
            .await
            .unwrap();
        log.settle(k, vec![Offset(9), Offset(8)]).await.unwrap();
        assert_eq!(
            log.settled(k),
            Settled {
                frontier: Offset(3),
                ahead: vec![Offset(7), Offset(8), Offset(9)]
            }
        );
        drop(log);
    });
    let expect = Settled {
        frontier: Offset(3),
        ahead: vec![Offset(7), Offset(8), Offset(9)],
    };
    let c = cfg.clone();
    let e = expect.clone();
    rt::block_on(async move {
        let (log, recovered, report) = ShardLog::open(c).await.unwrap();
        assert_eq!(report.replayed_settles, 2);
        assert_eq!(recovered[0].settled, e);
        log.settle(k, vec![Offset(3), Offset(4), Offset(5), Offset(6)])
            .await
            .unwrap();
        log.close().await.unwrap();
    });
    assert!(Path::new(&partition::partition_dir(&dir, k))
        .join("consumer.state")
        .exists());
    let c = cfg.clone();
    rt::block_on(async move {
        let (_log, recovered, report) = ShardLog::open(c).await.unwrap();
        assert_eq!(report.replayed_settles, 0);
        assert_eq!(
            recovered[0].settled,
            Settled {
                frontier: Offset(10),
                ahead: vec![]
            }
        );
    });
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn settle_of_several_partitions_is_one_commit_and_survives_restart() {
    // Proves a settle spread over partitions writes one WAL batch (one fsync for a batch ack),
    // and that every partition's part of it is durable once it resolves.
    let dir = temp_dir("settle-many");
    let cfg = small_cfg(dir.clone());
    let keys = [key(8, 0), key(8, 1), key(8, 2)];
    let c = cfg.clone();
    rt::block_on(async move {
        let (log, _, _) = ShardLog::open(c).await.unwrap();
        fill(&log, &keys, 0, 5).await;
        let before = log.wal_stats().batches;
        let parts = keys
            .iter()
            .enumerate()
            .map(|(i, &k)| (k, (0..=i as u64).map(Offset).collect()))
            .collect();
        log.settle_many(parts).await.unwrap().await.unwrap();
        assert_eq!(log.wal_stats().batches, before + 1);
        drop(log);
    });
    rt::block_on(async move {
        let (_log, recovered, report) = ShardLog::open(cfg).await.unwrap();
        assert_eq!(report.replayed_settles, 3);
        for (i, &k) in keys.iter().enumerate() {
            let r = recovered.iter().find(|r| r.key == k).unwrap();
            assert_eq!(r.settled.frontier, Offset(i as u64 + 1), "partition {i}");
        }
    });
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn damaged_record_in_a_checkpointed_segment_reads_as_corrupt() {
    // Proves a bit flip inside a fsynced (checkpointed) partition segment is reported as Corrupt
    // for that offset only, counted in the recovery report, and never shifts other offsets.
    let dir = temp_dir("bitflip");
    let cfg = small_cfg(dir.clone());
    let k = key(7, 0);
    let c = cfg.clone();
    rt::block_on(async move {
        let (log, _, _) = ShardLog::open(c).await.unwrap();
        fill(&log, &[k], 0, 10).await;
        log.close().await.unwrap();
    });
    let seg = partition::partition_dir(&dir, k).join(format!("{:020}.seg", 0));
    let mut b = std::fs::read(&seg).unwrap();
    b[40 + 32 + 5] ^= 0x20; // inside record 0's key/payload
    std::fs::write(&seg, &b).unwrap();
    rt::block_on(async move {
        let (log, _, report) = ShardLog::open(cfg).await.unwrap();
        assert_eq!(report.scan.corrupt_records, 1);
        assert!(matches!(
            log.read(k, Offset(0), 5, 1 << 20).await,
            Err(ReadError::Corrupt { offset: Offset(0) })
        ));
        let rest = log.read(k, Offset(1), 100, 1 << 20).await.unwrap();
        assert_eq!(rest.len(), 9);
        assert_eq!(rest[0].payload, payload(k, 1));
    });
    let _ = std::fs::remove_dir_all(dir);
}

fn segments_of(dir: &Path, k: PartitionKey) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(partition::partition_dir(dir, k))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    v.sort();
    v
}

fn base_of(p: &Path) -> u64 {
    p.file_stem().unwrap().to_str().unwrap().parse().unwrap()
}

/// Appends 50 records, checkpoints, appends 1500 more, and "crashes" (drop without close).
fn crash_after_checkpoint(cfg: &LogConfig, k: PartitionKey) {
    let c = cfg.clone();
    rt::block_on(async move {
        let (log, _, _) = ShardLog::open(c).await.unwrap();
        fill(&log, &[k], 0, 50).await;
        log.checkpoint().await.unwrap();
        fill(&log, &[k], 50, 1500).await;
        drop(log);
    });
}

#[test]
fn pages_lost_after_the_checkpoint_are_rewritten_from_the_wal() {
    // Proves that damage in the middle of partition data written after the last checkpoint (a
    // page lost at a power failure while later pages survived) does not leave acknowledged
    // records unreadable: recovery cuts the partition back and replays them from the WAL.
    let dir = temp_dir("lostpage");
    let cfg = small_cfg(dir.clone());
    let k = key(8, 0);
    crash_after_checkpoint(&cfg, k);
    let newest = segments_of(&dir, k).pop().unwrap();
    assert!(base_of(&newest) > 50);
    let mut b = std::fs::read(&newest).unwrap();
    let mid = b.len() / 2;
    b[mid..mid + 200].fill(0);
    std::fs::write(&newest, &b).unwrap();
    let report = reopen_check(&cfg, &[k], 1550);
    assert!(report.scan.corrupt_records > 0);
    assert_eq!(report.repaired_partitions, 1);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn segment_lost_after_the_checkpoint_is_rewritten_from_the_wal() {
    // Proves that a sealed segment created after the last checkpoint and lost at a crash (its
    // directory entry was never fsynced) is rebuilt from the WAL, with no offset left corrupt.
    let dir = temp_dir("lostseg");
    let cfg = small_cfg(dir.clone());
    let k = key(8, 1);
    crash_after_checkpoint(&cfg, k);
    let segs = segments_of(&dir, k);
    let victim = &segs[segs.len() - 2];
    assert!(base_of(victim) > 50);
    std::fs::remove_file(victim).unwrap();
    let report = reopen_check(&cfg, &[k], 1550);
    assert_eq!(report.repaired_partitions, 1);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn idle_logs_close_their_files_and_reopen_on_use() {
    // Proves idle eviction closes the segment file of a checkpointed log only (a log with
    // unsynced writes stays open), that an evicted log still reads, takes new records at the
    // right offsets, and that everything survives a restart.
    let dir = temp_dir("idle-evict");
    let cfg = small_cfg(dir.clone());
    let keys = [key(9, 0), key(9, 1)];
    let c = cfg.clone();
    rt::block_on(async move {
        let (log, _, _) = ShardLog::open(c).await.unwrap();
        fill(&log, &keys, 0, 20).await;
        let idle = std::time::Duration::ZERO;
        assert_eq!(
            log.evict_idle_logs(idle),
            0,
            "unsynced writes keep a log open"
        );
        log.checkpoint().await.unwrap();
        assert_eq!(log.evict_idle_logs(std::time::Duration::from_secs(3600)), 0);
        assert_eq!(log.evict_idle_logs(idle), 2);
        assert_eq!((log.open_logs(), log.idle_logs_evicted()), (0, 2));
        check(&log, &keys, 20).await;
        assert_eq!(log.open_logs(), 0, "reads do not reopen");
        fill(&log, &keys, 20, 5).await;
        assert_eq!(log.open_logs(), 2, "a write reopens");
        check(&log, &keys, 25).await;
        log.checkpoint().await.unwrap();
        assert_eq!(log.evict_idle_logs(idle), 2);
        log.close().await.unwrap();
    });
    reopen_check(&cfg, &keys, 25);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn transit_records_are_held_until_handed_and_come_back_after_a_crash() {
    // Proves the accept-then-hand-over contract of `append_transit`: a transit record is not
    // readable here; while it is held, checkpoints (even ones that release WAL segments) keep
    // it, so a crash and a close both bring it back from recovery with its key and payload;
    // once handed, its `Handed` marker keeps the next recovery from returning it, even after a
    // crash with no checkpoint since, while a record not handed still comes back. The
    // destination is another node's: it is stored with the record and comes back with it.
    let dir = temp_dir("transit");
    let cfg = small_cfg(dir.clone());
    let own = [key(7, 0)];
    let away = key(8, 1);
    let to = Destination::Node(MemberId(2));
    let c = cfg.clone();
    rt::block_on(async move {
        let (log, _, _) = ShardLog::open(c.clone()).await.unwrap();
        fill(&log, &own, 0, 10).await;
        let h0 = log.append_transit(to, rec(away, 0)).await.unwrap();
        let h1 = log.append_transit(to, rec(away, 1)).await.unwrap();
        assert_eq!((h0.seq, h1.seq), (0, 1));
        assert_eq!((h0.dest, h1.dest), (to, to));
        assert_eq!(log.transit_held(), 2);
        assert_eq!(
            log.high_watermark(away),
            Offset(0),
            "transit is not readable here"
        );
        // Enough traffic after it to roll several WAL segments, then checkpoints.
        fill(&log, &own, 10, 1500).await;
        log.checkpoint().await.unwrap();
        assert!(wal_segments(&c) >= 2, "the held records keep their segment");
        drop(log); // crash
    });
    let c = cfg.clone();
    rt::block_on(async move {
        let (log, _, report) = ShardLog::open(c).await.unwrap();
        assert_eq!(report.transit_records, 2);
        let got = log.take_recovered_transit();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].1, rec(away, 0));
        assert_eq!(got[1].1, rec(away, 1));
        assert_eq!((got[0].0.dest, got[1].0.dest), (to, to));
        assert!(log.take_recovered_transit().is_empty(), "handed out once");
        assert_eq!(log.transit_held(), 2);
        check(&log, &own, 1510).await;
        // A clean close with the holds still there keeps them too.
        log.close().await.unwrap();
    });
    let c = cfg.clone();
    rt::block_on(async move {
        let (log, _, report) = ShardLog::open(c).await.unwrap();
        assert_eq!(report.transit_records, 2);
        let got = log.take_recovered_transit();
        // The first reached its owner; the second did not. A new one continues the sequence.
        log.transit_handed(&[got[0].0]).await;
        let h2 = log.append_transit(to, rec(away, 2)).await.unwrap();
        assert_eq!(h2.seq, 2);
        assert_eq!(log.transit_held(), 2);
        fill(&log, &own, 1510, 5).await;
        drop(log); // crash, no checkpoint since
    });
    let c = cfg.clone();
    rt::block_on(async move {
        let (log, _, report) = ShardLog::open(c).await.unwrap();
        let got = log.take_recovered_transit();
        let payloads: Vec<_> = got.iter().map(|(_, r)| r.clone()).collect();
        assert_eq!(
            payloads,
            vec![rec(away, 1), rec(away, 2)],
            "handed records stay handed"
        );
        assert_eq!(report.transit_records, 2);
        let holds: Vec<_> = got.iter().map(|(h, _)| *h).collect();
        log.transit_handed(&holds).await;
        assert_eq!(log.transit_held(), 0);
        log.checkpoint().await.unwrap();
        drop(log); // crash again
    });
    let c = cfg.clone();
    rt::block_on(async move {
        let (log, _, report) = ShardLog::open(c).await.unwrap();
        assert_eq!(report.transit_records, 0, "handed records are not replayed");
        assert!(log.take_recovered_transit().is_empty());
        check(&log, &own, 1515).await;
        log.close().await.unwrap();
    });
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_durable_transit_record_reaches_the_sink_even_when_its_caller_left() {
    // Proves a transit record is never stranded by its request: the caller's future is dropped
    // right after queuing the record (a client that disconnected), yet once the batch is
    // durable the sink gets the record with its hold, so it is handed over and released.
    let dir = temp_dir("transit-sink");
    let cfg = small_cfg(dir.clone());
    let away = key(8, 1);
    rt::block_on(async move {
        let (log, _, _) = ShardLog::open(cfg).await.unwrap();
        let got = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let g = got.clone();
        log.on_transit(Box::new(move |hold, rec| g.borrow_mut().push((hold, rec))));
        let mut fut = Box::pin(log.append_transit(Destination::Shard(ShardId(1)), rec(away, 0)));
        assert!(futures_lite::future::poll_once(&mut fut).await.is_none());
        drop(fut);
        // Any later commit comes after that batch.
        fill(&log, &[key(7, 0)], 0, 2).await;
        let sunk = got.borrow().clone();
        assert_eq!(sunk.len(), 1);
        assert_eq!(sunk[0].1, rec(away, 0));
        assert_eq!(log.transit_held(), 1);
        log.transit_handed(&[sunk[0].0]).await;
        assert_eq!(log.transit_held(), 0);
        log.close().await.unwrap();
    });
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn transit_records_of_one_request_get_their_own_destination_and_sequence() {
    // Proves `append_transit_many` (a batch produce's records for other nodes): one request
    // answers a hold per record in the order given, each numbered in its own destination's
    // sequence, continuing after the single appends before it; the sink gets every record with
    // its hold, and a crash before any is handed brings all back with their destinations.
    let dir = temp_dir("transit-many");
    let cfg = small_cfg(dir.clone());
    let (a, b) = (
        Destination::Node(MemberId(2)),
        Destination::Node(MemberId(3)),
    );
    let (ka, kb) = (key(8, 0), key(8, 1));
    let c = cfg.clone();
    rt::block_on(async move {
        let (log, _, _) = ShardLog::open(c).await.unwrap();
        let got = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let g = got.clone();
        log.on_transit(Box::new(move |hold, rec| g.borrow_mut().push((hold, rec))));
        let first = log.append_transit(a, rec(ka, 0)).await.unwrap();
        assert_eq!(first.seq, 0);
        let holds = log
            .append_transit_many(vec![(b, rec(kb, 1)), (a, rec(ka, 2)), (b, rec(kb, 3))])
            .await
            .unwrap();
        let seqs: Vec<_> = holds.iter().map(|h| (h.dest, h.seq)).collect();
        assert_eq!(seqs, vec![(b, 0), (a, 1), (b, 1)]);
        assert!(log
            .append_transit_many(Vec::new())
            .await
            .unwrap()
            .is_empty());
        assert_eq!(log.transit_held(), 4);
        let sunk: Vec<_> = got.borrow().iter().map(|(h, r)| (*h, r.clone())).collect();
        assert_eq!(sunk.len(), 4);
        assert_eq!(
            &sunk[1..].iter().map(|(h, _)| *h).collect::<Vec<_>>(),
            &holds
        );
        assert_eq!(sunk[2].1, rec(ka, 2));
        drop(log); // crash
    });
    rt::block_on(async move {
        let (log, _, report) = ShardLog::open(cfg).await.unwrap();
        assert_eq!(report.transit_records, 4);
        let got: Vec<_> = log
            .take_recovered_transit()
            .into_iter()
            .map(|(h, r)| (h.dest, h.seq, r))
            .collect();
        assert_eq!(
            got,
            vec![
                (a, 0, rec(ka, 0)),
                (b, 0, rec(kb, 1)),
                (a, 1, rec(ka, 2)),
                (b, 1, rec(kb, 3)),
            ]
        );
    });
    let _ = std::fs::remove_dir_all(dir);
}
