//! Rough ShardLog throughput on one shard: N concurrent appenders of 256-byte records for a few
//! seconds, then records/s, WAL fsyncs/s, records per fsync and p50/p99 append latency, next to
//! the bare WAL (same appenders, same records, no partition files) measured in the same run.
//!
//! `cargo run --release -p narad-io --example log_throughput -- [appenders=64] [seconds=3]
//! [dir=/tmp] [batches_in_flight=2] [records_per_append=1]`: the last two compare pipelining depths
//! (1 = one batch at a time) and single against batch appends in one binary.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use narad_io::log::{AppendRecord, LogConfig, ShardLog};
use narad_io::rt;
use narad_io::types::{Offset, PartitionId, PartitionKey, ShardId, TopicId, UnixMillis};
use narad_io::wal::{Wal, WalConfig, WalRecord};

fn key(a: u64) -> PartitionKey {
    PartitionKey {
        topic: TopicId(0xbe7c),
        partition: PartitionId((a % 8) as u32),
    }
}

fn pct(v: &mut [u64], q: f64) -> u64 {
    v.sort_unstable();
    v.get(((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0)
}

/// What one run does: appenders, seconds, pipelining depth, records per append.
#[derive(Clone, Copy)]
struct Load {
    appenders: u64,
    secs: u64,
    depth: usize,
    per_append: u64,
}

async fn run_log(dir: PathBuf, load: Load) -> (u64, u64, Vec<u64>) {
    let Load {
        appenders,
        secs,
        depth,
        per_append,
    } = load;
    let mut cfg = LogConfig::new(dir, ShardId(0), 1);
    cfg.checkpoint_interval_ms = 1000;
    cfg.wal_batches_in_flight_max = depth;
    let (log, _, _) = ShardLog::open(cfg).await.unwrap();
    let lat: Rc<RefCell<Vec<u64>>> = Rc::default();
    let stop = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for a in 0..appenders {
        let (log, lat) = (log.clone(), lat.clone());
        tasks.push(rt::spawn(async move {
            while Instant::now() < stop {
                let t = Instant::now();
                let recs = (0..per_append)
                    .map(|_| AppendRecord {
                        key: key(a),
                        msg_key: None,
                        payload: vec![a as u8; 256].into(),
                    })
                    .collect();
                log.append(recs).await.unwrap();
                let us = t.elapsed().as_micros() as u64;
                lat.borrow_mut()
                    .extend(std::iter::repeat_n(us, per_append as usize));
            }
        }));
    }
    for t in tasks {
        t.await;
    }
    let fsyncs = log.wal_stats().fsyncs;
    log.close().await.unwrap();
    let lat = lat.borrow().clone();
    (lat.len() as u64, fsyncs, lat)
}

async fn run_wal(dir: PathBuf, load: Load) -> (u64, u64, Vec<u64>) {
    let Load {
        appenders,
        secs,
        depth,
        per_append,
    } = load;
    let cfg = WalConfig {
        batches_in_flight_max: depth,
        ..WalConfig::new(dir)
    };
    let (wal, _, _) = Wal::open(cfg).await.unwrap();
    let lat: Rc<RefCell<Vec<u64>>> = Rc::default();
    let stop = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for a in 0..appenders {
        let (wal, lat) = (wal.clone(), lat.clone());
        tasks.push(rt::spawn(async move {
            let mut i = 0;
            while Instant::now() < stop {
                let t = Instant::now();
                let recs = (0..per_append)
                    .map(|j| WalRecord::Message {
                        key: key(a),
                        offset: Offset(i + j),
                        commit_ms: UnixMillis(0),
                        msg_key: None,
                        payload: vec![a as u8; 256].into(),
                    })
                    .collect();
                wal.append(recs).await.unwrap();
                let us = t.elapsed().as_micros() as u64;
                lat.borrow_mut()
                    .extend(std::iter::repeat_n(us, per_append as usize));
                i += per_append;
            }
        }));
    }
    for t in tasks {
        t.await;
    }
    let fsyncs = wal.stats().fsyncs;
    let lat = lat.borrow().clone();
    (lat.len() as u64, fsyncs, lat)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let appenders: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(64);
    let secs: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3);
    let base = PathBuf::from(args.get(3).cloned().unwrap_or_else(|| "/tmp".into()))
        .join(format!("narad-log-tp-{}", std::process::id()));
    let depth: usize = args
        .get(4)
        .and_then(|s| s.parse().ok())
        .unwrap_or(narad_io::wal::BATCHES_IN_FLIGHT_DEFAULT);
    let per_append: u64 = args.get(5).and_then(|s| s.parse().ok()).unwrap_or(1).max(1);
    let load = Load {
        appenders,
        secs,
        depth,
        per_append,
    };
    let _ = std::fs::remove_dir_all(&base);
    for (name, which) in [("bare WAL ", 0), ("ShardLog ", 1)] {
        let dir = base.join(name.trim());
        let (n, fsyncs, mut lat) = rt::block_on(async move {
            if which == 0 {
                run_wal(dir, load).await
            } else {
                run_log(dir, load).await
            }
        });
        println!(
            "{name} appenders={appenders} x{per_append} record=256B secs={secs} in_flight={depth}: {:.0} rec/s, {:.0} fsyncs/s, {:.1} rec/fsync, p50 {} us, p99 {} us",
            n as f64 / secs as f64,
            fsyncs as f64 / secs as f64,
            n as f64 / fsyncs.max(1) as f64,
            pct(&mut lat, 0.5),
            pct(&mut lat, 0.99)
        );
    }
    let _ = std::fs::remove_dir_all(&base);
}
