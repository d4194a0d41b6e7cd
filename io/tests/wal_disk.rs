//! The write-ahead log on the real disk (temp directories under /tmp): group commit with many
//! concurrent appenders, recovery after reopen, segment rollover and release, torn tail
//! truncation, checkpoints, limits.

use std::path::PathBuf;
use std::rc::Rc;

use narad_io::types::{Offset, PartitionId, PartitionKey, TopicId, UnixMillis};
use narad_io::wal::{Wal, WalConfig, WalError, WalPosition, WalRecord};
use narad_io::{codec, rt};

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("narad-wal-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn msg(appender: u32, i: u64, size: usize) -> WalRecord {
    WalRecord::Message {
        key: PartitionKey {
            topic: TopicId(7),
            partition: PartitionId(appender),
        },
        offset: Offset(i),
        commit_ms: UnixMillis(1_700_000_000_000 + i),
        msg_key: i.is_multiple_of(3).then(|| format!("k{i}").into_bytes()),
        payload: vec![(appender as u8) ^ (i as u8); size].into(),
    }
}

fn small_cfg(dir: PathBuf) -> WalConfig {
    WalConfig {
        segment_bytes: 256 << 10,
        batch_bytes_max: 64 << 10,
        append_bytes_max: 64 << 10,
        batch_records_max: 128,
        queue_bytes_max: 256 << 10,
        batches_in_flight_max: 2,
        recycle_segments_max: 2,
        fail_after_batches: None,
        dir,
    }
}

#[test]
fn concurrent_appends_are_grouped_durable_and_recovered_in_order() {
    // Proves: 64 concurrent appenders all get Ok in call order with non-decreasing positions;
    // appends share fsyncs (fewer fsyncs than appends); after reopen every acknowledged record is
    // returned byte for byte, per appender in order, with no corruption reported; segments rolled.
    let dir = temp_dir("concurrent");
    let cfg = small_cfg(dir.clone());
    let appenders = 64u32;
    let per = 40u64;
    rt::block_on(async move {
        let (wal, recovered, stats) = Wal::open(cfg.clone()).await.expect("open");
        assert!(recovered.is_empty() && stats.corrupt_batches == 0);
        let positions = Rc::new(std::cell::RefCell::new(Vec::new()));
        let mut tasks = Vec::new();
        for a in 0..appenders {
            let wal = wal.clone();
            let positions = positions.clone();
            tasks.push(rt::spawn(async move {
                for i in 0..per {
                    let p = wal.append(vec![msg(a, i, 200)]).await.expect("append");
                    positions.borrow_mut().push(p);
                }
            }));
        }
        for t in tasks {
            t.await;
        }
        let s = wal.stats();
        assert_eq!(s.records, u64::from(appenders) * per);
        assert!(
            s.fsyncs < s.records / 4,
            "no grouping: {} fsyncs for {} records",
            s.fsyncs,
            s.records
        );
        assert!(s.segments_created > 0, "segments did not roll");
        let pos = positions.borrow().clone();
        assert!(
            pos.windows(2).all(|w| w[0] <= w[1]),
            "positions resolve in order"
        );
        drop(wal);

        let (wal, recovered, stats) = Wal::open(cfg).await.expect("reopen");
        assert_eq!(
            stats.corrupt_batches + stats.lost_batches + stats.torn_bytes,
            0
        );
        assert_eq!(recovered.len() as u64, u64::from(appenders) * per);
        assert!(
            recovered.windows(2).all(|w| w[0].0 < w[1].0),
            "positions strictly increase"
        );
        for a in 0..appenders {
            let mine: Vec<WalRecord> = recovered
                .iter()
                .filter(
                    |(_, r)| matches!(r, WalRecord::Message { key, .. } if key.partition.0 == a),
                )
                .map(|(_, r)| r.clone())
                .collect();
            let want: Vec<WalRecord> = (0..per).map(|i| msg(a, i, 200)).collect();
            assert_eq!(mine, want, "appender {a}");
        }
        wal.append(vec![msg(0, 999, 10)])
            .await
            .expect("append after recovery");
    });
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn checkpoint_limits_replay_and_release_deletes_old_segments() {
    // Proves: records before a checkpoint's `upto` are not replayed, Checkpoint records are not
    // returned, and release_before deletes exactly the segments wholly before `upto` (never the
    // current one), which survives a reopen.
    let dir = temp_dir("checkpoint");
    let cfg = small_cfg(dir.clone());
    rt::block_on(async move {
        let (wal, _, _) = Wal::open(cfg.clone()).await.expect("open");
        let mut upto = WalPosition::default();
        for i in 0..100 {
            upto = wal.append(vec![msg(1, i, 8000)]).await.expect("append");
        }
        assert!(upto.segment >= 2, "wrote several segments: {upto:?}");
        wal.append(vec![WalRecord::Checkpoint {
            upto,
            marks: Vec::new(),
        }])
        .await
        .expect("checkpoint");
        let after: Vec<WalRecord> = (100..105).map(|i| msg(1, i, 10)).collect();
        wal.append(after.clone()).await.expect("append");
        let before = wal.segments();
        wal.release_before(upto).await.expect("release");
        let left = wal.segments();
        assert!(left.iter().all(|&s| s >= upto.segment), "{left:?}");
        assert!(left.len() < before.len());
        drop(wal);
        let (wal, recovered, stats) = Wal::open(cfg).await.expect("reopen");
        assert_eq!(stats.last_checkpoint, Some(upto));
        assert_eq!(
            recovered.into_iter().map(|(_, r)| r).collect::<Vec<_>>(),
            after
        );
        assert_eq!(wal.segments(), left);
    });
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn torn_tail_on_disk_is_truncated_and_the_log_continues() {
    // Proves: after the last batch of the newest segment, a torn batch whose header survived
    // (payload damaged) is zeroed at reopen, and garbage without a batch header is left to be
    // overwritten; neither is reported as corruption, acknowledged records survive, and appends
    // after it recover cleanly on the next open.
    for header_survived in [true, false] {
        let dir = temp_dir(&format!("torn-{header_survived}"));
        let cfg = small_cfg(dir.clone());
        let seg_dir = dir.clone();
        rt::block_on(async move {
            let (wal, _, _) = Wal::open(cfg.clone()).await.expect("open");
            let acked: Vec<WalRecord> = (0..5).map(|i| msg(2, i, 100)).collect();
            let end = wal.append(acked.clone()).await.expect("append");
            drop(wal);
            // The batch in flight at a crash: seq 2, torn.
            let mut payload = Vec::new();
            for i in 0..40 {
                codec::encode_record(&msg(2, 100 + i, 200), &mut payload).expect("encode");
            }
            let mut junk = vec![0u8; codec::batch_span(payload.len())];
            codec::encode_batch(end.segment, 2, 40, &payload, &mut junk);
            if header_survived {
                junk[5000] ^= 0x20;
            } else {
                junk[..4096].fill(0x5a);
            }
            {
                use std::os::unix::fs::FileExt;
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(seg_dir.join(format!("{:020}.wal", end.segment)))
                    .expect("open segment");
                f.write_all_at(&junk, end.byte).expect("write junk");
                f.sync_all().expect("sync");
            }
            let (wal, recovered, stats) = Wal::open(cfg.clone()).await.expect("reopen");
            if header_survived {
                assert_eq!(stats.torn_bytes, junk.len() as u64, "{stats:?}");
            } else {
                assert_eq!(stats.torn_bytes, 0, "{stats:?}");
            }
            assert_eq!(stats.corrupt_batches + stats.lost_batches, 0);
            assert_eq!(
                recovered.into_iter().map(|(_, r)| r).collect::<Vec<_>>(),
                acked
            );
            let more = vec![msg(2, 5, 3)];
            wal.append(more.clone())
                .await
                .expect("append after truncation");
            drop(wal);
            let (_, recovered, stats) = Wal::open(cfg).await.expect("reopen again");
            assert_eq!(
                stats.torn_bytes + stats.corrupt_batches + stats.lost_batches,
                0,
                "{stats:?}"
            );
            assert_eq!(recovered.len(), 6);
        });
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn kept_segments_are_deleted_when_the_disk_is_full_elsewhere() {
    // Proves: `shed_recycled` deletes the released segment files kept for reuse, keeps none of
    // the segments released right after it, and the log then rolls over into new segments and
    // recovers as before.
    let dir = temp_dir("shed");
    let cfg = small_cfg(dir.clone());
    let kept = kept_files(dir.clone());
    rt::block_on(async move {
        let (wal, _, _) = Wal::open(cfg.clone()).await.expect("open");
        fill_checkpoint_and_release(&wal).await;
        assert_eq!(kept(), 2);
        wal.shed_recycled();
        for _ in 0..100 {
            if kept() == 0 {
                break;
            }
            rt::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(kept(), 0);
        let after: Vec<WalRecord> = (100..170).map(|i| msg(1, i, 7000)).collect();
        append_each(&wal, &after).await;
        assert_eq!(wal.stats().segments_recycled, 0);
        // For a while after that, released segments are deleted, not kept.
        let released = wal.stats().segments_released;
        checkpoint_and_release(&wal, wal.write_position()).await;
        assert!(wal.stats().segments_released > released);
        assert_eq!(kept(), 0);
        drop(wal);
        let (_, recovered, stats) = Wal::open(cfg).await.expect("reopen");
        assert_eq!(stats.corrupt_batches + stats.lost_batches, 0);
        assert!(
            recovered.is_empty(),
            "{} records after the checkpoint",
            recovered.len()
        );
    });
    let _ = std::fs::remove_dir_all(dir);
}

/// Appends 100 records of 8000 bytes (several segments), a checkpoint after them, and releases
/// the segments before it; returns the checkpoint's position.
async fn fill_checkpoint_and_release(wal: &Wal) -> WalPosition {
    let mut upto = WalPosition::default();
    for i in 0..100 {
        upto = wal.append(vec![msg(1, i, 8000)]).await.expect("append");
    }
    assert!(upto.segment >= 3, "{upto:?}");
    checkpoint_and_release(wal, upto).await;
    upto
}

/// Appends a checkpoint at `upto` and releases the segments before it.
async fn checkpoint_and_release(wal: &Wal, upto: WalPosition) {
    wal.append(vec![WalRecord::Checkpoint {
        upto,
        marks: Vec::new(),
    }])
    .await
    .expect("checkpoint");
    wal.release_before(upto).await.expect("release");
}

/// Appends each record in its own call.
async fn append_each(wal: &Wal, records: &[WalRecord]) {
    for r in records {
        wal.append(vec![r.clone()]).await.expect("append");
    }
}

/// Counts the released segment files kept for reuse in `dir`.
fn kept_files(dir: PathBuf) -> impl Fn() -> usize {
    move || {
        std::fs::read_dir(&dir)
            .expect("list")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with("recycled-"))
            .count()
    }
}

#[test]
fn released_segments_are_recycled_and_their_old_batches_never_come_back() {
    // Proves: segments released by a checkpoint are kept (up to `recycle_segments_max`) and
    // reused as new segments; the log written into them recovers exactly, with nothing reported
    // and nothing zeroed, although their earlier batches are still in the files; after a restart
    // only segments written since are kept; and kept files are deleted at open.
    let dir = temp_dir("recycle");
    let cfg = small_cfg(dir.clone());
    let kept = kept_files(dir.clone());
    rt::block_on(async move {
        let (wal, _, _) = Wal::open(cfg.clone()).await.expect("open");
        let upto = fill_checkpoint_and_release(&wal).await;
        assert_eq!(kept(), 2, "recycle_segments_max files kept");
        assert_eq!(wal.stats().segments_released, upto.segment);
        let after: Vec<WalRecord> = (100..170).map(|i| msg(1, i, 7000)).collect();
        append_each(&wal, &after).await;
        let s = wal.stats();
        assert_eq!(s.segments_recycled, 2, "{s:?}");
        assert_eq!(kept(), 0);
        drop(wal);
        let (wal, recovered, stats) = Wal::open(cfg.clone()).await.expect("reopen");
        assert_eq!(
            stats.corrupt_batches + stats.lost_batches + stats.torn_bytes,
            0,
            "{stats:?}"
        );
        assert_eq!(
            recovered.into_iter().map(|(_, r)| r).collect::<Vec<_>>(),
            after
        );
        // Segments from before this open are deleted when released, not kept.
        checkpoint_and_release(&wal, wal.write_position()).await;
        assert_eq!(kept(), 0);
        assert!(wal.stats().segments_released > 0);
        // Those written since are kept, and a restart deletes them.
        fill_checkpoint_and_release(&wal).await;
        assert_eq!(kept(), 2);
        drop(wal);
        let (_, recovered, stats) = Wal::open(cfg).await.expect("reopen again");
        assert_eq!(kept(), 0, "kept segments deleted at open");
        assert!(recovered.is_empty());
        assert_eq!(stats.corrupt_batches + stats.lost_batches, 0);
    });
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn too_large_and_backpressure() {
    // Proves: an append larger than one batch is refused with TooLarge (nothing written), and
    // appenders beyond queue_bytes_max wait but all complete.
    let dir = temp_dir("limits");
    let cfg = WalConfig {
        queue_bytes_max: 8 << 10,
        ..small_cfg(dir.clone())
    };
    rt::block_on(async move {
        let (wal, _, _) = Wal::open(cfg).await.expect("open");
        let r = wal.append(vec![msg(0, 0, 70 << 10)]).await;
        assert!(matches!(r, Err(WalError::TooLarge)), "{r:?}");
        let r = wal.append((0..129).map(|i| msg(0, i, 1)).collect()).await;
        assert!(matches!(r, Err(WalError::TooLarge)), "{r:?}");
        let mut tasks = Vec::new();
        for a in 0..32 {
            let wal = wal.clone();
            tasks.push(rt::spawn(async move {
                wal.append(vec![msg(a, 0, 3000)]).await.map(|_| ())
            }));
        }
        for t in tasks {
            t.await.expect("append under backpressure");
        }
        assert_eq!(wal.stats().records, 32);
        assert!(wal.poisoned().is_none());
    });
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn segments_come_from_a_zeroed_spare_and_a_stale_spare_is_never_read() {
    // Proves: a new WAL prepares the next segment in the background (`next-segment.spare`, full
    // size, every byte zero); rollover renames that very file (same inode) into place; a
    // non-zero file left under the spare's name is removed at reopen and never read as log (the
    // recovered records are exactly the appended ones, no corruption reported).
    use std::os::unix::fs::MetadataExt;
    let dir = temp_dir("spare");
    let cfg = small_cfg(dir.clone());
    let spare = dir.join(narad_io::wal::SPARE_NAME);
    let seg1 = narad_io::wal::segment_path(&dir, 1);
    rt::block_on(async move {
        let (wal, _, _) = Wal::open(cfg.clone()).await.expect("open");
        let mut ready = false;
        for _ in 0..200 {
            let len = std::fs::metadata(&spare).map(|m| m.len()).unwrap_or(0);
            let zero = len == cfg.segment_bytes
                && std::fs::read(&spare).is_ok_and(|b| b.iter().all(|&x| x == 0));
            if zero {
                ready = true;
                break;
            }
            rt::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(ready, "no zeroed spare within 2 s");
        // Give the task the moment to hand the file over after its fdatasync.
        rt::sleep(std::time::Duration::from_millis(50)).await;
        let ino = std::fs::metadata(&spare).unwrap().ino();
        let mut sent = Vec::new();
        let mut last = WalPosition::default();
        for i in 0..40 {
            let r = msg(2, i, 8000);
            last = wal.append(vec![r.clone()]).await.expect("append");
            sent.push(r);
        }
        assert!(last.segment >= 1, "did not roll: {last:?}");
        assert_eq!(
            std::fs::metadata(&seg1).unwrap().ino(),
            ino,
            "segment 1 is the spare"
        );
        drop(wal);
        std::fs::write(&spare, vec![0x5a; 8192]).unwrap();
        let (_wal, recovered, stats) = Wal::open(cfg.clone()).await.expect("reopen");
        assert_eq!(stats.corrupt_batches, 0);
        assert_eq!(
            recovered.into_iter().map(|(_, r)| r).collect::<Vec<_>>(),
            sent
        );
        let len = std::fs::metadata(&spare).map(|m| m.len()).unwrap_or(0);
        assert!(
            len == 0 || std::fs::read(&spare).unwrap()[0] == 0,
            "stale spare reused"
        );
    });
    let _ = std::fs::remove_dir_all(dir);
}
