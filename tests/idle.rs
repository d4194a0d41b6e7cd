//! An idle broker sleeps: with no requests, its threads are not woken by timers that have
//! nothing to do (the Raft ticker of a group of one was 50 wake-ups a second on shard 0).

mod common;

use std::time::Duration;

/// Context switches (voluntary and not) of every thread of `pid`, summed.
fn context_switches(pid: u32) -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("tasks") {
        let Ok(status) = std::fs::read_to_string(task.expect("task").path().join("status")) else {
            continue; // a thread that ended meanwhile
        };
        total += status
            .lines()
            .filter(|l| l.contains("ctxt_switches:"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum::<u64>();
    }
    total
}

#[test]
fn an_idle_broker_is_not_woken_by_its_own_timers() {
    // Proves that over 3 s with no requests the whole process switches context fewer than 45
    // times. Before the Raft ticker was stopped for a group of one it was ~150 (about 50 a
    // second on shard 0); now a few per second remain (per-shard housekeeping).
    let dir = common::TempDir::new("idle");
    let server = common::Server::start(&dir);
    let mut c = server.client();
    c.create_topic("idle", 3);
    let r = c.post_json("/v1/topics/idle/produce", r#"{"n":1}"#);
    assert_eq!(r.status, 202, "{}", r.text());
    drop(c);
    std::thread::sleep(Duration::from_secs(1));
    let pid = server.pid();
    let before = context_switches(pid);
    std::thread::sleep(Duration::from_secs(3));
    let woken = context_switches(pid) - before;
    assert!(
        woken < 45,
        "an idle broker switched context {woken} times in 3 s"
    );
}
