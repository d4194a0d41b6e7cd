//! `narad-logtorture`: the process that `io/tests/kill_recovery.rs` kills with SIGKILL.
//!
//! `narad-logtorture run <data_dir> <seed> <acked_file>` starts 2 shards, opens a `ShardLog` on
//! each (recovering whatever the previous, killed, process left), verifies every record listed in
//! `acked_file` (lines `A <partition> <offset> <hash>` and `S <partition> <offset>` printed by
//! earlier runs), prints `VERIFIED shard=<i> ...`, then `READY shard=<i>`, and runs 64
//! concurrent appenders per shard for ever. Each appender prints `A <partition> <offset>
//! <fnv64 of key+payload>` for every record as soon as its append resolved (durable), and
//! sometimes settles one of its offsets and prints `S <partition> <offset>` once that resolved.
//! `verify` does the same verification, closes the logs and exits. On any lost or damaged
//! record it prints `FAIL ...` lines and exits with status 1.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use narad_io::log::{AppendRecord, LogConfig, ShardLog};
use narad_io::rt::{self, RuntimeConfig};
use narad_io::types::{owner_shard, Offset, PartitionId, PartitionKey, ShardId, TopicId};

const SHARDS: u32 = 2;
const APPENDERS_PER_SHARD: u64 = 64;
const PARTITIONS: u32 = 16;
const TOPIC: TopicId = TopicId(0x746f_7274_7572_6501);

#[derive(Default)]
struct Acked {
    /// partition -> offset -> hash
    records: HashMap<u32, HashMap<u64, u64>>,
    settled: HashMap<u32, Vec<u64>>,
}

fn parse_acked(path: &std::path::Path) -> Acked {
    let mut a = Acked::default();
    let text = std::fs::read_to_string(path).unwrap_or_default();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        match f.as_slice() {
            ["A", p, o, h] => {
                if let (Ok(p), Ok(o), Ok(h)) = (p.parse(), o.parse(), u64::from_str_radix(h, 16)) {
                    a.records.entry(p).or_default().insert(o, h);
                }
            }
            ["S", p, o] => {
                if let (Ok(p), Ok(o)) = (p.parse(), o.parse()) {
                    a.settled.entry(p).or_default().push(o);
                }
            }
            _ => {}
        }
    }
    a
}

fn fnv64(key: Option<&[u8]>, payload: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key.unwrap_or(b"-").iter().chain(payload) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

use narad_io::types::SplitMix64 as Rng;

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(line.as_bytes());
    let _ = out.flush();
}

fn key(p: u32) -> PartitionKey {
    PartitionKey {
        topic: TOPIC,
        partition: PartitionId(p),
    }
}

async fn verify(log: &ShardLog, shard: ShardId, acked: &Acked) -> bool {
    let mut ok = true;
    let (mut checked, mut settled_checked) = (0u64, 0u64);
    for p in 0..PARTITIONS {
        let k = key(p);
        if owner_shard(k, SHARDS) != shard {
            continue;
        }
        let want = acked.records.get(&p);
        let mut have: HashMap<u64, u64> = HashMap::new();
        let hwm = log.high_watermark(k);
        let mut o = log.oldest_offset(k);
        while o < hwm {
            match log.read(k, o, 4096, 4 << 20).await {
                Ok(recs) => {
                    for r in &recs {
                        have.insert(r.offset.0, fnv64(r.msg_key.as_deref(), &r.payload));
                    }
                    o = Offset(recs.last().map_or(o.0 + 1, |r| r.offset.0 + 1));
                }
                Err(e) => {
                    say(&format!("FAIL read partition {p} offset {}: {e}\n", o.0));
                    ok = false;
                    o = Offset(o.0 + 1);
                }
            }
        }
        for (&off, &h) in want.into_iter().flatten() {
            checked += 1;
            match have.get(&off) {
                Some(&got) if got == h => {}
                Some(&got) => {
                    say(&format!(
                        "FAIL damaged partition {p} offset {off}: hash {got:016x} want {h:016x}\n"
                    ));
                    ok = false;
                }
                None => {
                    say(&format!(
                        "FAIL lost partition {p} offset {off} (hwm {})\n",
                        hwm.0
                    ));
                    ok = false;
                }
            }
        }
        let s = log.settled(k);
        for &off in acked.settled.get(&p).into_iter().flatten() {
            settled_checked += 1;
            if off >= s.frontier.0 && s.ahead.binary_search(&Offset(off)).is_err() {
                say(&format!(
                    "FAIL settle lost partition {p} offset {off} (frontier {})\n",
                    s.frontier.0
                ));
                ok = false;
            }
        }
    }
    say(&format!(
        "VERIFIED shard={} acked={checked} settled={settled_checked} ok={ok}\n",
        shard.0
    ));
    ok
}

async fn appender(log: ShardLog, shard: ShardId, mut rng: Rng) {
    let owned: Vec<u32> = (0..PARTITIONS)
        .filter(|&p| owner_shard(key(p), SHARDS) == shard)
        .collect();
    loop {
        let n = 1 + (rng.next_u64() % 3) as usize;
        let mut recs = Vec::with_capacity(n);
        let mut hashes = Vec::with_capacity(n);
        for _ in 0..n {
            let p = owned[(rng.next_u64() % owned.len() as u64) as usize];
            let len = 16 + (rng.next_u64() % 496) as usize;
            let fill = rng.next_u64();
            let payload: Vec<u8> = (0..len)
                .map(|i| (fill >> (i % 8 * 8)) as u8 ^ i as u8)
                .collect();
            let msg_key = rng
                .next_u64()
                .is_multiple_of(2)
                .then(|| format!("k{}", rng.next_u64() % 1000).into_bytes());
            hashes.push((p, fnv64(msg_key.as_deref(), &payload)));
            recs.push(AppendRecord {
                key: key(p),
                msg_key,
                payload: payload.into(),
            });
        }
        match log.append(recs).await {
            Ok(offs) => {
                let mut lines = String::new();
                for ((p, h), o) in hashes.iter().zip(&offs) {
                    lines.push_str(&format!("A {p} {} {h:016x}\n", o.0));
                }
                say(&lines);
                if rng.next_u64().is_multiple_of(8) {
                    let (p, _) = hashes[0];
                    if log.settle(key(p), vec![offs[0]]).await.is_ok() {
                        say(&format!("S {p} {}\n", offs[0].0));
                    }
                }
            }
            Err(e) => {
                say(&format!("ERROR append: {e}\n"));
                return;
            }
        }
    }
}

async fn shard_main(
    mode: String,
    dir: PathBuf,
    seed: u64,
    shard: ShardId,
    acked: Arc<Acked>,
) -> bool {
    let cfg = LogConfig {
        wal_segment_bytes: 4 << 20,
        wal_batch_bytes_max: 1 << 20,
        partition_segment_bytes_max: 1 << 20,
        checkpoint_wal_bytes: 2 << 20,
        checkpoint_interval_ms: 150,
        ..LogConfig::new(dir, shard, SHARDS)
    };
    let (log, _, report) = match ShardLog::open(cfg).await {
        Ok(x) => x,
        Err(e) => {
            say(&format!("FAIL open shard {}: {e}\n", shard.0));
            return false;
        }
    };
    say(&format!(
        "RECOVERED shard={} replayed={} torn_bytes={} corrupt={} gaps={} ms={}\n",
        shard.0,
        report.replayed_messages,
        report.scan.torn_tail_bytes,
        report.scan.corrupt_records,
        report.gap_records,
        report.duration_ms
    ));
    let ok = verify(&log, shard, &acked).await;
    if mode != "run" || !ok {
        let _ = log.close().await;
        return ok;
    }
    say(&format!("READY shard={}\n", shard.0));
    let mut tasks = Vec::new();
    for a in 0..APPENDERS_PER_SHARD {
        let rng = Rng(seed ^ (u64::from(shard.0) << 40) ^ (a << 20) ^ 0x5eed);
        tasks.push(rt::spawn(appender(log.clone(), shard, rng)));
    }
    for t in tasks {
        t.await;
    }
    false
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5 || !(args[1] == "run" || args[1] == "verify") {
        eprintln!("usage: narad-logtorture <run|verify> <data_dir> <seed> <acked_file>");
        std::process::exit(2);
    }
    let mode = args[1].clone();
    let dir = PathBuf::from(&args[2]);
    let seed: u64 = args[3].parse().unwrap_or(1);
    let acked = Arc::new(parse_acked(std::path::Path::new(&args[4])));
    let rcfg = RuntimeConfig {
        shards: SHARDS,
        pin: false,
        ..RuntimeConfig::new(dir.clone())
    };
    let result = rt::run(rcfg, move |shard| {
        let (mode, dir, acked) = (mode.clone(), dir.clone(), acked.clone());
        async move { shard_main(mode, dir, seed, shard, acked).await }
    });
    match result {
        Ok(oks) if oks.iter().all(|&ok| ok) => std::process::exit(0),
        Ok(_) => std::process::exit(1),
        Err(e) => {
            say(&format!("FAIL runtime: {e}\n"));
            std::process::exit(1);
        }
    }
}
