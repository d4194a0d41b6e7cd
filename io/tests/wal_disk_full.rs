//! Disk full on a real (small, tmpfs) filesystem: the WAL answers DiskFull when it cannot allocate
//! a segment, stays usable (not poisoned), succeeds again once space frees, and loses nothing
//! acknowledged. Needs permission to mount tmpfs (root in the CI container); not running as root,
//! the test says so and returns; as root, a failed mount fails it.

mod tmpfs;

use narad_io::rt;
use narad_io::types::{Offset, PartitionId, PartitionKey, TopicId, UnixMillis};
use narad_io::wal::{Wal, WalConfig, WalError, WalRecord};
use tmpfs::Mount;

fn msg(i: u64) -> WalRecord {
    WalRecord::Message {
        key: PartitionKey {
            topic: TopicId(9),
            partition: PartitionId(0),
        },
        offset: Offset(i),
        commit_ms: UnixMillis(i),
        msg_key: None,
        payload: vec![i as u8; 3000].into(),
    }
}

#[test]
fn disk_full_is_an_error_value_and_recovers_when_space_frees() {
    // Proves: on a 2 MiB filesystem with 512 KiB segments, appends eventually fail with
    // WalError::DiskFull (not Poisoned), the log is not poisoned, a ballast file removed frees
    // space and the next append succeeds, and a reopen returns every acknowledged record.
    let mnt = std::env::temp_dir().join(format!("narad-wal-full-{}", std::process::id()));
    let Some(mount) = Mount::tmpfs(&mnt, 2 << 20) else {
        return;
    };
    let dir = mount.0.join("wal");
    let ballast = mount.0.join("ballast");
    std::fs::write(&ballast, vec![1u8; 600 << 10]).expect("ballast");
    let cfg = WalConfig {
        dir: dir.clone(),
        segment_bytes: 512 << 10,
        batch_bytes_max: 64 << 10,
        append_bytes_max: 64 << 10,
        batch_records_max: 64,
        queue_bytes_max: 256 << 10,
        batches_in_flight_max: 2,
        recycle_segments_max: 2,
        fail_after_batches: None,
    };
    rt::block_on(async move {
        let (wal, _, _) = Wal::open(cfg.clone()).await.expect("open");
        let mut acked = Vec::new();
        let mut full = false;
        for i in 0..2000u64 {
            match wal.append(vec![msg(i)]).await {
                Ok(_) => acked.push(msg(i)),
                Err(WalError::DiskFull) => {
                    full = true;
                    break;
                }
                Err(e) => panic!("append {i}: unexpected {e}"),
            }
        }
        assert!(full, "never hit disk full");
        assert!(wal.poisoned().is_none());
        assert!(wal.stats().disk_full >= 1);
        // Still full: the next append fails the same way, nothing written.
        assert!(matches!(
            wal.append(vec![msg(5000)]).await,
            Err(WalError::DiskFull)
        ));
        std::fs::remove_file(&ballast).expect("free space");
        wal.append(vec![msg(6000)])
            .await
            .expect("append after space freed");
        acked.push(msg(6000));
        drop(wal);
        let (_, recovered, stats) = Wal::open(cfg).await.expect("reopen");
        assert_eq!(
            stats.corrupt_batches + stats.lost_batches + stats.torn_bytes,
            0,
            "{stats:?}"
        );
        assert_eq!(
            recovered.into_iter().map(|(_, r)| r).collect::<Vec<_>>(),
            acked
        );
    });
    drop(mount);
}
