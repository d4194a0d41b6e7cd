//! Graceful shutdown (OPERATIONS.md, issue 3): SIGTERM while a long-poll is parked and after
//! acknowledged produces: the long-poll is answered at once, the process exits 0 well within the
//! grace period, and everything acknowledged is there after a restart.

mod common;

use std::io::Write;
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

#[test]
fn metrics_listener_answers_shutting_down_while_requests_drain() {
    // Proves API.md §15.1 during a drain: while a produce is still in flight after SIGTERM, the
    // metrics listener (where the chart's probes go) stays up and answers `/healthz` with
    // `503 {"status":"shutting down"}` (and `/readyz` with 503); the produce then completes with
    // 202, the process exits 0, and the message is there after a restart.
    let dir = common::TempDir::new("term-probe");
    let mport = common::free_port_pair();
    let maddr: std::net::SocketAddr = format!("127.0.0.1:{mport}").parse().unwrap();
    let mut s = common::Server::start_with(
        dir.0.join("data"),
        vec![
            ("NARAD_HTTP_METRICS_ADDR".into(), maddr.to_string()),
            ("NARAD_HTTP_SHUTDOWN_GRACE".into(), "10s".into()),
        ],
    );
    let mut c = s.client();
    c.create_topic("t", 3);
    let mut m = common::Client::connect(maddr).unwrap();
    assert_eq!(m.get("/healthz").status, 200);
    // A produce whose body is only half sent keeps its connection busy through the drain.
    let mut p = s.client();
    let body = b"half-sent-body";
    let head = format!(
        "POST /v1/topics/t/produce?partition=1 HTTP/1.1\r\nHost: x\r\n\
         Content-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    p.raw().write_all(head.as_bytes()).unwrap();
    p.raw().write_all(&body[..4]).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    s.signal_term();
    // Each probe on a new connection, as the chart's probes do: a shard with nothing in flight
    // stops its listener (closing a probe's connection after its answer), and the port is then
    // served by the shard still draining.
    let t0 = Instant::now();
    let probe = |path: &str| -> Option<common::Resp> {
        while t0.elapsed() < Duration::from_secs(3) {
            if let Ok(mut m) = common::Client::connect(maddr) {
                if let Ok(r) = m.try_request("GET", path, &[], b"") {
                    if r.status == 503 {
                        return Some(r);
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    };
    let health = probe("/healthz").expect("/healthz never answered 503 during the drain");
    assert_eq!(health.json(), serde_json::json!({"status":"shutting down"}));
    assert!(
        probe("/readyz").is_some(),
        "/readyz never answered 503 during the drain"
    );
    p.raw().write_all(&body[4..]).unwrap();
    assert_eq!(p.read_response(false).unwrap().status, 202);
    let status = s.terminate();
    assert!(status.success(), "exit status {status}");
    s.restart();
    let r = s.client().get("/v1/topics/t/consume?partition=1&offset=0");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["payload"], "half-sent-body");
}

/// Starts a 2-shard node on `data` (prepared by the caller to fail) and waits at most 15 s for
/// it to exit: its status must be 2; answers its stderr.
fn start_expecting_failure(data: &std::path::Path) -> String {
    let port = common::free_port_pair();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_narad"));
    cmd.args(["server", "start", "--dev", "--port", &port.to_string()])
        .arg("--data-dir")
        .arg(data)
        .env("NARAD_SHARDS", "2");
    let (status, stderr) = common::run_to_exit(cmd, Duration::from_secs(15));
    let status = status.unwrap_or_else(|| panic!("still running after 15 s; stderr: {stderr}"));
    assert_eq!(status.code(), Some(2), "{stderr}");
    stderr
}

#[test]
fn a_shard_failing_at_start_stops_the_node_at_once_with_the_reason() {
    // Proves a start-up failure of shard 0 (here: its metadata store cannot be opened, because
    // `metastore` is a file) ends the process promptly with status 2 and the reason, logged when
    // it happens. Before, the other shards waited up to a minute for metadata that could never
    // come, and the reason was printed only then.
    let dir = common::TempDir::new("boot-fail");
    let data = dir.0.join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("metastore"), b"not a directory").unwrap();
    let stderr = start_expecting_failure(&data);
    assert!(
        stderr.contains("shard failed; the node stops") && stderr.contains("metadata store"),
        "{stderr}"
    );
}

#[test]
fn a_shard_other_than_0_failing_at_start_stops_the_node() {
    // Proves a start-up failure of shard 1 (its WAL directory is a file) ends the process
    // promptly with status 2 and the reason. Before, shard 0 waited forever for shard 1 to take
    // the metadata, so the node neither became ready nor exited.
    let dir = common::TempDir::new("boot-fail-1");
    let data = dir.0.join("data");
    std::fs::create_dir_all(data.join("ingress")).unwrap();
    std::fs::write(data.join("ingress").join("shard-1"), b"not a directory").unwrap();
    let stderr = start_expecting_failure(&data);
    assert!(
        stderr.contains("shard failed; the node stops")
            && stderr.contains("shard 1: opening the log"),
        "{stderr}"
    );
}
