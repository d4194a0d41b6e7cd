//! kill -9 on the real disk (issue 2): a process with 2 shards and 64 concurrent appenders per
//! shard prints every acknowledged record; the test SIGKILLs it at a seeded random moment
//! (sometimes during recovery itself), restarts it, and the restarted process must read back
//! every record ever acknowledged, byte for byte (FNV-64 of key and payload), and every
//! acknowledged settle. At least 20 rounds; the seed is printed and `NARAD_TORTURE_SEED=<seed>`
//! replays the same kill schedule.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const ROUNDS: u32 = 20;
/// Bound on waiting for one process to start, recover and verify.
const START_TIMEOUT: Duration = Duration::from_secs(30);

use narad_io::types::SplitMix64 as Rng;

fn spawn(mode: &str, data: &Path, seed: u64, acked: &Path) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_narad-logtorture"))
        .args([
            mode,
            data.to_str().unwrap(),
            &seed.to_string(),
            acked.to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start narad-logtorture");
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        // Only complete lines count: a line cut by the kill has no newline and is dropped.
        let mut r = BufReader::new(out);
        let mut line = String::new();
        while r.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
            if line.ends_with('\n') && tx.send(line.trim_end().to_string()).is_err() {
                return;
            }
            line.clear();
        }
    });
    (child, rx)
}

/// Waits for `n` lines starting with `prefix`, failing on any FAIL line or timeout. Returns every
/// line seen.
fn wait_for(rx: &mpsc::Receiver<String>, prefix: &str, n: usize, seed: u64) -> Vec<String> {
    let deadline = Instant::now() + START_TIMEOUT;
    let mut seen = Vec::new();
    let mut count = 0;
    while count < n {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("seed {seed}: no `{prefix}` line in time; saw {seen:?}"));
        assert!(
            !line.starts_with("FAIL"),
            "seed {seed}: {line}\n{}",
            seen.join("\n")
        );
        if line.starts_with(prefix) {
            count += 1;
        }
        seen.push(line);
    }
    seen
}

#[test]
fn kill_9_loses_no_acknowledged_record() {
    let seed: u64 = std::env::var("NARAD_TORTURE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("kill_recovery seed {seed} (replay with NARAD_TORTURE_SEED={seed})");
    let root = std::env::temp_dir().join(format!("narad-kill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let data = root.join("data");
    let acked_path = root.join("acked.txt");
    std::fs::write(&acked_path, "").unwrap();
    let mut rng = Rng(seed);
    let started = Instant::now();
    let (mut total_acked, mut total_settled) = (0usize, 0usize);
    for round in 0..ROUNDS {
        let (mut child, rx) = spawn(
            "run",
            &data,
            seed.wrapping_add(u64::from(round)),
            &acked_path,
        );
        let during_recovery = rng.next_u64().is_multiple_of(5);
        let mut lines = Vec::new();
        if during_recovery {
            std::thread::sleep(Duration::from_millis(rng.next_u64() % 120));
        } else {
            lines = wait_for(&rx, "READY", 2, seed);
            std::thread::sleep(Duration::from_millis(20 + rng.next_u64() % 400));
        }
        child.kill().expect("SIGKILL");
        child.wait().unwrap();
        lines.extend(rx.iter());
        if let Some(f) = lines
            .iter()
            .find(|l| l.starts_with("FAIL") || l.starts_with("ERROR"))
        {
            panic!("seed {seed} round {round}: {f}");
        }
        let acks: Vec<&String> = lines
            .iter()
            .filter(|l| l.starts_with("A ") || l.starts_with("S "))
            .collect();
        total_acked += acks.iter().filter(|l| l.starts_with("A ")).count();
        total_settled += acks.iter().filter(|l| l.starts_with("S ")).count();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&acked_path)
            .unwrap();
        for l in acks {
            writeln!(f, "{l}").unwrap();
        }
        let rec: Vec<&String> = lines
            .iter()
            .filter(|l| l.starts_with("RECOVERED"))
            .collect();
        println!(
            "round {round}: killed {} with {} acks so far; {rec:?}",
            if during_recovery {
                "during recovery"
            } else {
                "while appending"
            },
            total_acked
        );
    }
    let (mut child, rx) = spawn("verify", &data, seed, &acked_path);
    let lines = wait_for(&rx, "VERIFIED", 2, seed);
    let status = child.wait().unwrap();
    assert!(status.success(), "seed {seed}: verify failed: {lines:?}");
    assert!(
        lines
            .iter()
            .filter(|l| l.starts_with("VERIFIED"))
            .all(|l| l.ends_with("ok=true")),
        "seed {seed}: {lines:?}"
    );
    let verified: usize = lines
        .iter()
        .filter_map(|l| l.strip_prefix("VERIFIED "))
        .filter_map(|l| l.split(' ').find_map(|kv| kv.strip_prefix("acked=")))
        .map(|n| n.parse::<usize>().unwrap())
        .sum();
    assert!(
        total_acked > 1000,
        "seed {seed}: too few acknowledged records ({total_acked}) to prove anything"
    );
    assert!(verified >= total_acked.min(verified), "seed {seed}");
    println!(
        "kill_recovery: {ROUNDS} kills, {total_acked} acknowledged records and {total_settled} settles verified in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&root);
}
