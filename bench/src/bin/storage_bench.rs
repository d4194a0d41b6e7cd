//! Storage benchmark: the write-ahead log's group commit against the physical limit of the disk,
//! measured in the same run.
//!
//! For 256-byte records and 1, 8, 64 and 512 concurrent appenders per shard (every shard runs the
//! same point at the same time), it prints records/s, fsyncs/s, records per fsync and p50/p99
//! append-to-durable latency of `narad_io::wal::Wal`; and a bare loop of one O_DIRECT write +
//! one fdatasync per batch of the same size the log formed at that point (the limit), and the
//! ratio of the two. The log and the bare loop alternate in short slices within each point, so
//! that the noise of a shared machine hits both alike. Target: at 64 appenders the log reaches
//! ≥ 80 % of the limit's records/s.
//!
//! Usage: `cargo run --release -p narad-bench --bin storage_bench [-- --seconds 2 --dir /tmp/x
//! --shards N --appenders 1,8,64,512 --recovery-mib 256]`. At the end it writes a log of
//! `--recovery-mib` per shard and times its recovery (reopen). Never touches anything outside its directory, which it
//! removes at the end.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use narad_io::file::DirectFile;
use narad_io::rt::{self, RuntimeConfig};
use narad_io::types::{Offset, PartitionId, PartitionKey, TopicId, UnixMillis};
use narad_io::wal::{Wal, WalConfig, WalRecord};

const PAYLOAD_BYTES: usize = 256;
/// Latencies are counted per microsecond up to this bound (larger ones land in the last slot).
const LATENCY_US_MAX: usize = 200_000;
/// Size of the bare-loop file; writes wrap around inside it.
const BARE_FILE_BYTES: u64 = 1 << 30;

/// Per-microsecond latency counts.
#[derive(Clone)]
struct Lat(Vec<u32>);

impl Lat {
    fn new() -> Lat {
        Lat(vec![0; LATENCY_US_MAX + 1])
    }
    fn record(&mut self, d: Duration) {
        let us = (d.as_micros() as usize).min(LATENCY_US_MAX);
        self.0[us] = self.0[us].saturating_add(1);
    }
    fn merge(&mut self, o: &Lat) {
        for (a, b) in self.0.iter_mut().zip(&o.0) {
            *a = a.saturating_add(*b);
        }
    }
    fn quantile_us(&self, q: f64) -> usize {
        let n: u64 = self.0.iter().map(|&c| u64::from(c)).sum();
        if n == 0 {
            return 0;
        }
        let rank = ((q * n as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (us, &c) in self.0.iter().enumerate() {
            seen += u64::from(c);
            if seen >= rank {
                return us;
            }
        }
        LATENCY_US_MAX
    }
}

#[derive(Clone)]
struct Point {
    appenders: usize,
    elapsed_s: f64,
    records: u64,
    fsyncs: u64,
    lat: Lat,
    /// Bytes per batch write (padded), for the bare loop.
    batch_span: usize,
    /// The log's own fdatasync and whole-commit (write + sync + read-back) latency histograms.
    wal_stats: narad_io::wal::WalStats,
    bare_records_per_write: f64,
    bare_writes: u64,
    bare_elapsed_s: f64,
    bare_lat: Lat,
}

struct Args {
    seconds: f64,
    dir: PathBuf,
    shards: Option<u32>,
    appenders: Vec<usize>,
    recovery_mib: u64,
}

fn parse_args() -> Args {
    let mut a = Args {
        seconds: 2.0,
        dir: std::env::temp_dir().join(format!("narad-storage-bench-{}", std::process::id())),
        shards: None,
        appenders: vec![1, 8, 64, 512],
        recovery_mib: 256,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let v = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--seconds" => a.seconds = v.parse().unwrap_or(a.seconds),
            "--dir" => a.dir = PathBuf::from(v),
            "--shards" => a.shards = v.parse().ok(),
            "--recovery-mib" => a.recovery_mib = v.parse().unwrap_or(a.recovery_mib),
            "--appenders" => {
                a.appenders = v.split(',').filter_map(|s| s.trim().parse().ok()).collect()
            }
            other => {
                eprintln!("unknown argument {other}");
                std::process::exit(2);
            }
        }
        i += 2;
    }
    a
}

fn record(shard: u32, i: u64) -> WalRecord {
    WalRecord::Message {
        key: PartitionKey {
            topic: TopicId(0xbe9c),
            partition: PartitionId(shard),
        },
        offset: Offset(i),
        commit_ms: UnixMillis(i),
        msg_key: None,
        payload: vec![(i as u8) | 1; PAYLOAD_BYTES].into(),
    }
}

/// Each point alternates this many slices of the log and of the bare loop, so that both see the
/// same background noise of a shared machine.
const SLICES: u32 = 8;

/// One point: `SLICES` rounds of (log with `appenders` closed-loop appenders for a slice, then
/// the bare loop for a slice with the batch size the log has formed so far).
async fn point(base: PathBuf, shard: u32, appenders: usize, dur: Duration) -> Point {
    let dir = base.join(format!("wal-{appenders}"));
    let _ = std::fs::remove_dir_all(&dir);
    let (wal, _, _) = Wal::open(WalConfig::new(dir.clone()))
        .await
        .expect("open the WAL");
    let bare_path = base.join("bare.dat");
    let _ = std::fs::remove_file(&bare_path);
    let bare = DirectFile::open_rw(&bare_path, true, true)
        .await
        .expect("open bare file");
    bare.pre_allocate(BARE_FILE_BYTES)
        .await
        .expect("fallocate bare file");
    bare.fdatasync().await.expect("sync");
    let slice = dur / SLICES;
    let lat = Rc::new(RefCell::new(Lat::new()));
    let mut p = Point {
        appenders,
        elapsed_s: 0.0,
        records: 0,
        fsyncs: 0,
        lat: Lat::new(),
        batch_span: 0,
        wal_stats: Default::default(),
        bare_records_per_write: 0.0,
        bare_writes: 0,
        bare_elapsed_s: 0.0,
        bare_lat: Lat::new(),
    };
    let mut bare_records = 0.0;
    let mut pos = 0u64;
    for round in 0..SLICES {
        let start = Instant::now();
        let deadline = start + slice;
        let mut tasks = Vec::with_capacity(appenders);
        for a in 0..appenders {
            let wal = wal.clone();
            let lat = lat.clone();
            tasks.push(rt::spawn(async move {
                let mut n = 0u64;
                let mut i = (u64::from(round) << 40) | a as u64;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    wal.append(vec![record(shard, i)]).await.expect("append");
                    lat.borrow_mut().record(t.elapsed());
                    n += 1;
                    i += appenders as u64;
                }
                n
            }));
        }
        for t in tasks {
            p.records += t.await;
        }
        p.elapsed_s += start.elapsed().as_secs_f64();
        // The bare loop with the batch size the log formed so far.
        let s = wal.stats();
        let span = (s.bytes_written / s.batches.max(1)).div_ceil(4096) as usize * 4096;
        let records_per_write = s.records as f64 / s.batches.max(1) as f64;
        let start = Instant::now();
        let deadline = start + slice;
        while Instant::now() < deadline {
            let t = Instant::now();
            let mut b = bare.alloc(span);
            b.as_mut().fill(0x5a);
            if pos + span as u64 > BARE_FILE_BYTES {
                pos = 0;
            }
            bare.write_all_at(b, pos).await.expect("write");
            bare.fdatasync().await.expect("fdatasync");
            p.bare_lat.record(t.elapsed());
            pos += span as u64;
            p.bare_writes += 1;
            bare_records += records_per_write;
        }
        p.bare_elapsed_s += start.elapsed().as_secs_f64();
    }
    let s = wal.stats();
    drop(wal);
    let _ = bare.close().await;
    let _ = std::fs::remove_file(&bare_path);
    let _ = std::fs::remove_dir_all(&dir);
    p.fsyncs = s.fsyncs;
    p.batch_span = (s.bytes_written / s.batches.max(1)).div_ceil(4096) as usize * 4096;
    p.bare_records_per_write = bare_records / p.bare_writes.max(1) as f64;
    p.lat = lat.borrow().clone();
    p.wal_stats = s;
    p
}

struct Recovery {
    bytes: u64,
    records: u64,
    seconds: f64,
}

/// Writes about `bytes` of 256-byte records (16 appenders, 512 records per append), closes the
/// log and times `Wal::open` (scan, checks, replay of every record).
async fn recovery(dir: PathBuf, shard: u32, bytes: u64) -> Recovery {
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = WalConfig::new(dir.clone());
    let (wal, _, _) = Wal::open(cfg.clone()).await.expect("open the WAL");
    let per_append = 512usize;
    let appends = bytes / (per_append as u64 * (PAYLOAD_BYTES as u64 + 50));
    let mut tasks = Vec::new();
    for a in 0..16u64 {
        let wal = wal.clone();
        tasks.push(rt::spawn(async move {
            let mut k = a;
            while k < appends {
                let recs = (0..per_append as u64)
                    .map(|j| record(shard, k * 1000 + j))
                    .collect();
                wal.append(recs).await.expect("append");
                k += 16;
            }
        }));
    }
    for t in tasks {
        t.await;
    }
    let written = wal.stats().bytes_written;
    drop(wal);
    let t = Instant::now();
    let (_, records, _) = Wal::open(cfg).await.expect("recover the WAL");
    let seconds = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&dir);
    Recovery {
        bytes: written,
        records: records.len() as u64,
        seconds,
    }
}

fn main() {
    let args = parse_args();
    std::fs::create_dir_all(&args.dir).expect("create the bench directory");
    let mut cfg = RuntimeConfig::new(args.dir.clone());
    if let Some(s) = args.shards {
        cfg.shards = s;
    }
    let shards = cfg.shards;
    let dur = Duration::from_secs_f64(args.seconds);
    println!(
        "storage_bench: {shards} shards, {PAYLOAD_BYTES}-byte records, {:.1} s per point, dir {}, \
         WAL defaults (64 MiB segments, 4 MiB / 16384-record batches)",
        args.seconds,
        args.dir.display()
    );
    let recovery_bytes = args.recovery_mib << 20;
    let barrier = Arc::new(Barrier::new(shards as usize));
    let points = args.appenders.clone();
    let base = args.dir.clone();
    let out = rt::run(cfg, move |shard| {
        let barrier = barrier.clone();
        let points = points.clone();
        let base = base.join(format!("shard-{}", shard.0));
        async move {
            let mut res = Vec::new();
            for &n in &points {
                // Shards start each point together so that they share the disk the same way.
                barrier.wait();
                let p = point(base.clone(), shard.0, n, dur).await;
                res.push(p);
            }
            barrier.wait();
            let rec = recovery(base.join("recovery"), shard.0, recovery_bytes).await;
            let _ = std::fs::remove_dir_all(&base);
            (res, rec)
        }
    })
    .unwrap_or_else(|e| {
        eprintln!("storage_bench: cannot start the runtime: {e}");
        std::process::exit(1);
    });
    let _ = std::fs::remove_dir_all(&args.dir);
    let (out, recoveries): (Vec<Vec<Point>>, Vec<Recovery>) = out.into_iter().unzip();
    println!(
        "{:>9} | {:>11} {:>10} {:>8} {:>8} {:>8} | {:>8} {:>11} {:>10} {:>8} {:>8} | {:>6}",
        "appenders",
        "wal rec/s",
        "fsyncs/s",
        "rec/fsync",
        "p50 us",
        "p99 us",
        "span B",
        "limit rec/s",
        "fsyncs/s",
        "p50 us",
        "p99 us",
        "ratio"
    );
    for (i, &n) in args.appenders.iter().enumerate() {
        let mut rec_s = 0.0;
        let mut fs_s = 0.0;
        let mut records = 0u64;
        let mut fsyncs = 0u64;
        let mut lat = Lat::new();
        let mut lim_rec_s = 0.0;
        let mut lim_fs_s = 0.0;
        let mut bare_lat = Lat::new();
        let mut span = 0;
        for shard in &out {
            let p = &shard[i];
            assert_eq!(p.appenders, n);
            rec_s += p.records as f64 / p.elapsed_s;
            fs_s += p.fsyncs as f64 / p.elapsed_s;
            records += p.records;
            fsyncs += p.fsyncs;
            lat.merge(&p.lat);
            lim_fs_s += p.bare_writes as f64 / p.bare_elapsed_s;
            lim_rec_s += p.bare_writes as f64 * p.bare_records_per_write / p.bare_elapsed_s;
            bare_lat.merge(&p.bare_lat);
            span = span.max(p.batch_span);
        }
        println!(
            "{:>9} | {:>11.0} {:>10.0} {:>8.1} {:>8} {:>8} | {:>8} {:>11.0} {:>10.0} {:>8} {:>8} | {:>5.0}%",
            n,
            rec_s,
            fs_s,
            records as f64 / fsyncs.max(1) as f64,
            lat.quantile_us(0.5),
            lat.quantile_us(0.99),
            span,
            lim_rec_s,
            lim_fs_s,
            bare_lat.quantile_us(0.5),
            bare_lat.quantile_us(0.99),
            100.0 * rec_s / lim_rec_s.max(1.0)
        );
    }
    println!("inside the log, per batch (power-of-two buckets, upper bounds):");
    for (i, &n) in args.appenders.iter().enumerate() {
        let mut f = narad_io::wal::Log2Histogram::default();
        let mut c = narad_io::wal::Log2Histogram::default();
        for shard in &out {
            let st = &shard[i].wal_stats;
            for (k, v) in st.fsync_latency_us.buckets.iter().enumerate() {
                f.buckets[k] += v;
            }
            for (k, v) in st.commit_latency_us.buckets.iter().enumerate() {
                c.buckets[k] += v;
            }
        }
        println!(
            "{n:>9} appenders: fdatasync p50 <= {} us p99 <= {} us; write+sync+verify p50 <= {} us p99 <= {} us",
            f.quantile(0.5),
            f.quantile(0.99),
            c.quantile(0.5),
            c.quantile(0.99)
        );
    }
    for (i, r) in recoveries.iter().enumerate() {
        println!(
            "recovery, shard {i}: {:.0} MiB of log, {} records, opened in {:.2} s ({:.0} MiB/s)",
            r.bytes as f64 / (1 << 20) as f64,
            r.records,
            r.seconds,
            r.bytes as f64 / (1 << 20) as f64 / r.seconds.max(1e-9)
        );
    }
    println!(
        "limit = bare loop of one O_DIRECT write + one fdatasync of the same span, records/write = \
         the log's records per batch at that point; ratio = wal rec/s / limit rec/s (all shards summed)"
    );
}
