//! ShardLog retention and topic deletion on the real disk: whole sealed segments are deleted,
//! other topics are untouched, deleted topics do not come back after restart.

mod common_log;

use common_log::*;
use narad_io::log::{LogError, ReadError, ShardLog};
use narad_io::partition;
use narad_io::rt;
use narad_io::types::{Offset, TopicId, UnixMillis};

fn seg_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |r| {
        r.filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "seg")
        })
        .count()
    })
}

#[test]
fn retention_deletes_old_sealed_segments_of_one_topic_only() {
    // Proves enforce_retention deletes the sealed segment files of the named topic once their
    // newest record is older than the retention, keeps the active segment and every other
    // topic's files, answers BelowRetention below the new oldest offset, and that the deletion
    // holds after restart.
    let dir = temp_dir("retention");
    let cfg = small_cfg(dir.clone());
    let (a, b) = (key(10, 0), key(11, 0));
    let c = cfg.clone();
    rt::block_on(async move {
        let (log, _, _) = ShardLog::open(c).await.unwrap();
        for i in 0..1000 {
            log.append(vec![rec(a, i), rec(b, i)]).await.unwrap();
        }
        let (adir, bdir) = (
            partition::partition_dir(&dir, a),
            partition::partition_dir(&dir, b),
        );
        let (a_before, b_before) = (seg_files(&adir), seg_files(&bdir));
        assert!(a_before > 3, "{a_before}");
        let hour = 3_600_000;
        assert_eq!(
            log.enforce_retention(TopicId(10), hour, UnixMillis::now())
                .await
                .unwrap(),
            0
        );
        assert_eq!(
            log.enforce_retention(TopicId(10), 0, UnixMillis(u64::MAX))
                .await
                .unwrap(),
            0
        );
        let later = UnixMillis(UnixMillis::now().0 + 2 * hour);
        let freed = log
            .enforce_retention(TopicId(10), hour, later)
            .await
            .unwrap();
        assert!(freed > 0);
        assert_eq!(seg_files(&adir), 1, "only the active segment is left");
        assert_eq!(seg_files(&bdir), b_before, "other topic untouched");
        let oldest = log.oldest_offset(a);
        assert!(oldest > Offset(0));
        assert_eq!(log.stats(a).segments, 1);
        assert!(
            matches!(log.read(a, Offset(0), 1, 1).await, Err(ReadError::BelowRetention { oldest: o }) if o == oldest)
        );
        assert_eq!(
            log.read(a, oldest, 1000, 1 << 20).await.unwrap().len() as u64,
            1000 - oldest.0
        );
        assert_eq!(
            log.settled(a).frontier,
            oldest,
            "frontier skipped to the oldest retained offset"
        );
        assert_eq!(
            log.read(b, Offset(0), 1000, 1 << 20).await.unwrap().len(),
            1000
        );
        log.close().await.unwrap();
    });
    let dir2 = cfg.data_dir.clone();
    rt::block_on(async move {
        let (log, recovered, _) = ShardLog::open(cfg).await.unwrap();
        let ra = recovered.iter().find(|r| r.key == a).unwrap();
        assert!(ra.oldest_offset > Offset(0));
        assert_eq!(ra.next_offset, Offset(1000));
        assert_eq!(ra.settled.frontier, ra.oldest_offset);
        assert_eq!(
            log.read(b, Offset(0), 1000, 1 << 20).await.unwrap().len(),
            1000
        );
    });
    let _ = std::fs::remove_dir_all(dir2);
}

#[test]
fn delete_topic_removes_files_and_stays_deleted() {
    // Proves delete_topic removes the topic's directory and in-memory partitions, refuses later
    // appends to it, leaves other topics intact, and that a crash right after (no close) does not
    // resurrect it from the WAL.
    let dir = temp_dir("delete");
    let cfg = small_cfg(dir.clone());
    let (a0, a1, b) = (key(20, 0), key(20, 1), key(21, 0));
    let c = cfg.clone();
    let d = dir.clone();
    rt::block_on(async move {
        let (log, _, _) = ShardLog::open(c).await.unwrap();
        for i in 0..50 {
            log.append(vec![rec(a0, i), rec(a1, i), rec(b, i)])
                .await
                .unwrap();
        }
        log.delete_topic(TopicId(20)).await.unwrap();
        assert!(!partition::topic_dir(&d, TopicId(20)).exists());
        assert_eq!(log.partitions(), vec![b]);
        assert_eq!(log.high_watermark(a0), Offset(0));
        assert!(matches!(
            log.append(vec![rec(a0, 0)]).await,
            Err(LogError::TopicDeleted)
        ));
        log.append(vec![rec(b, 50)]).await.unwrap();
        drop(log);
    });
    let d = dir.clone();
    rt::block_on(async move {
        let (log, recovered, _) = ShardLog::open(cfg).await.unwrap();
        assert_eq!(recovered.iter().map(|r| r.key).collect::<Vec<_>>(), vec![b]);
        assert_eq!(log.high_watermark(b), Offset(51));
        assert!(!partition::topic_dir(&d, TopicId(20)).exists());
    });
    let _ = std::fs::remove_dir_all(dir);
}
