//! Graceful shutdown (OPERATIONS.md, issue 3): SIGTERM while a long-poll is parked and after
//! acknowledged produces: the long-poll is answered at once, the process exits 0 well within the
//! grace period, and everything acknowledged is there after a restart.

mod common;

use std::time::{Duration, Instant};

#[test]
fn sigterm_ends_long_polls_and_exits_zero() {
    let dir = common::TempDir::new("term");
    let mut s = common::Server::start(&dir);
    let mut c = s.client();
    c.create_topic("t", 3);
    for p in 0..3 {
        assert_eq!(
            c.post_client(&format!("/v1/topics/t/produce?partition={p}"), b"kept")
                .status,
            202
        );
    }
    // Park long-polls on a topic with nothing to hand out (every partition reachable via both
    // shards), then stop the server.
    c.create_topic("empty", 6);
    let addr = s.addr();
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let mut w = common::Client::connect(addr).unwrap();
                let t0 = Instant::now();
                let r = w.try_request("GET", "/v1/topics/empty/consume?wait=8s", &[], b"");
                (r.map(|r| r.status).ok(), t0.elapsed())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let status = s.terminate();
    assert!(status.success(), "exit status {status}");
    assert!(
        t0.elapsed() < Duration::from_secs(6),
        "shutdown took {:?}",
        t0.elapsed()
    );
    for w in waiters {
        let (st, took) = w.join().unwrap();
        assert!(took < Duration::from_secs(6), "long-poll held for {took:?}");
        assert!(matches!(st, Some(204) | None), "long-poll answered {st:?}");
    }
    s.restart();
    let mut c = s.client();
    let mut n = 0;
    for p in 0..3 {
        let r = c.get(&format!("/v1/topics/t/consume?partition={p}&offset=0"));
        assert_eq!(r.status, 200);
        assert_eq!(r.json()["payload"], "kept");
        n += 1;
    }
    assert_eq!(n, 3);
}
