//! Recovery time of a ShardLog holding about `mib` MiB of 256-byte records over 8 partitions:
//! appends in batches of 1000, "crashes" (drops the log without close, so the WAL after the last
//! checkpoint is replayed), reopens and prints how long recovery took and what it did; then
//! reopens once more after a clean close.
//!
//! `cargo run -p narad-io --example log_recovery_time -- [mib=1024] [dir=/tmp]`

use std::path::PathBuf;
use std::time::Instant;

use narad_io::log::{AppendRecord, LogConfig, ShardLog};
use narad_io::rt;
use narad_io::types::{PartitionId, PartitionKey, ShardId, TopicId};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mib: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1024);
    let base = PathBuf::from(args.get(2).cloned().unwrap_or_else(|| "/tmp".into()))
        .join(format!("narad-log-rec-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let cfg = LogConfig::new(base.clone(), ShardId(0), 1);
    let records = mib * (1 << 20) / 256;
    let c = cfg.clone();
    let t = Instant::now();
    rt::block_on(async move {
        let (log, _, _) = ShardLog::open(c).await.unwrap();
        let mut i = 0u64;
        while i < records {
            let batch: Vec<AppendRecord> = (0..1000)
                .map(|j| AppendRecord {
                    key: PartitionKey {
                        topic: TopicId(0x5ec),
                        partition: PartitionId(((i + j) % 8) as u32),
                    },
                    msg_key: None,
                    payload: vec![(i + j) as u8; 256].into(),
                })
                .collect();
            log.append(batch).await.unwrap();
            i += 1000;
        }
        drop(log);
    });
    println!(
        "wrote {records} records ({mib} MiB of payload) in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    for label in ["after crash", "after close"] {
        let c = cfg.clone();
        let t = Instant::now();
        let report = rt::block_on(async move {
            let (log, _, report) = ShardLog::open(c).await.unwrap();
            log.close().await.unwrap();
            report
        });
        println!(
            "recovery {label}: {:.2} s (open+close), segments {} ({} from index files), records {}, WAL records replayed {} (appended {}, already present {})",
            t.elapsed().as_secs_f64(),
            report.scan.segments,
            report.scan.indexed_segments,
            report.scan.records,
            report.wal.records_replayed,
            report.replayed_messages,
            report.skipped_present,
        );
    }
    let _ = std::fs::remove_dir_all(&base);
}
