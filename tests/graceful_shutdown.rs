//! Graceful shutdown (OPERATIONS.md, issue 3): SIGTERM while a long-poll is parked and after
//! acknowledged produces: the long-poll is answered at once, the process exits 0 well within the
//! grace period, and everything acknowledged is there after a restart. And the other end of a
//! node's life: probes answered while it still starts (the boot probe), a start-up that fails
//! or is cut short by SIGTERM ending the process promptly.

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

/// Asks `method path` of `addr` on a new connection each time (as the kubelet's probes do)
/// until something answers or `limit` passes.
fn probe_until_answered(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    limit: Duration,
) -> Option<common::Resp> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if let Ok(mut c) = common::Client::connect(addr) {
            if let Ok(r) = c.try_request(method, path, &[], b"") {
                return Some(r);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn probes_answer_while_the_node_is_still_starting() {
    // Proves API.md §15.1-15.2 and CLUSTER.md "Liveness" during a long start-up (log recovery
    // held for 5 s by NARAD_TEST_START_DELAY_MS): both the API port and the metrics port
    // (`http.metrics_addr`) answer `/healthz` 200 and `/readyz` 503 "starting: ..." instead of
    // refusing connections, every other request is 503 + Retry-After, and once the shards took
    // the ports over `/readyz` is 200 and `/metrics` served. Before the boot probe both ports
    // refused connections until recovery was done.
    let dir = common::TempDir::new("boot-probe");
    let mport = common::free_port_pair();
    let maddr: std::net::SocketAddr = format!("127.0.0.1:{mport}").parse().unwrap();
    let mut s = common::Server::spawn_starting(
        dir.0.join("data"),
        vec![
            ("NARAD_HTTP_METRICS_ADDR".into(), maddr.to_string()),
            ("NARAD_TEST_START_DELAY_MS".into(), "5000".into()),
        ],
    );
    let addr = s.addr();
    let limit = Duration::from_secs(4);
    for a in [addr, maddr] {
        let r = probe_until_answered(a, "GET", "/healthz", limit).expect("no /healthz answer");
        assert_eq!(r.status, 200, "{a}: {}", r.text());
        assert_eq!(r.json(), serde_json::json!({"status":"ok"}));
        assert_eq!(r.header("connection"), Some("close"));
        let r = probe_until_answered(a, "GET", "/readyz", limit).expect("no /readyz answer");
        assert_eq!(r.status, 503, "{a}: {}", r.text());
        assert!(r.error().starts_with("starting: "), "{a}: {}", r.text());
        let r = probe_until_answered(a, "HEAD", "/healthz", limit).expect("no HEAD answer");
        assert_eq!((r.status, r.body.len()), (200, 0));
        assert_eq!(r.header("content-length"), Some("16"));
    }
    let r = probe_until_answered(addr, "GET", "/v1/topics", limit).expect("no answer");
    assert_eq!((r.status, r.header("retry-after")), (503, Some("1")));
    assert!(r.error().starts_with("starting: "), "{}", r.text());
    let r = probe_until_answered(maddr, "GET", "/metrics", limit).expect("no answer");
    assert_eq!((r.status, r.header("retry-after")), (503, Some("1")));
    // Then the shards take over both ports.
    s.wait_ready();
    let r = probe_until_answered(addr, "GET", "/readyz", limit).expect("no /readyz answer");
    assert_eq!(r.json(), serde_json::json!({"status":"ready"}));
    let r = probe_until_answered(maddr, "GET", "/readyz", limit).expect("no /readyz answer");
    assert_eq!(r.status, 200, "{}", r.text());
    let r = probe_until_answered(maddr, "GET", "/metrics", limit).expect("no /metrics answer");
    assert_eq!(r.status, 200, "{}", r.text());
    s.client().create_topic("t", 3);
}

#[test]
fn sigterm_during_start_up_answers_shutting_down_and_exits_promptly() {
    // Proves SIGTERM while the node is still starting (log recovery held for 60 s): `/healthz`
    // turns to `503 {"status":"shutting down"}` (API.md §15.1) and the process exits within
    // seconds with status 0, not after the recovery, releasing its port.
    let dir = common::TempDir::new("boot-term");
    let mut s = common::Server::spawn_starting(
        dir.0.join("data"),
        vec![("NARAD_TEST_START_DELAY_MS".into(), "60000".into())],
    );
    let addr = s.addr();
    let r = probe_until_answered(addr, "GET", "/healthz", Duration::from_secs(4))
        .expect("no /healthz answer");
    assert_eq!(r.status, 200, "{}", r.text());
    s.signal_term();
    // The probe answers until the process stops it; an answer, if any, says shutting down.
    let t0 = Instant::now();
    let mut seen = None;
    while t0.elapsed() < Duration::from_secs(2) {
        match probe_until_answered(addr, "GET", "/healthz", Duration::from_millis(100)) {
            Some(r) if r.status == 200 => std::thread::sleep(Duration::from_millis(10)),
            Some(r) => {
                seen = Some(r);
                break;
            }
            None => break,
        }
    }
    if let Some(r) = seen {
        assert_eq!(r.status, 503, "{}", r.text());
        assert_eq!(r.json(), serde_json::json!({"status":"shutting down"}));
    }
    let status = s
        .wait_exit(Duration::from_secs(10))
        .expect("still running 10 s after SIGTERM during start-up");
    // Asked to stop, it stopped: a clean exit, not a failure (a supervisor would report one).
    assert_eq!(status.code(), Some(0), "{status}");
    drop(std::net::TcpListener::bind(addr).expect("the API port is free after the exit"));
}

#[test]
fn settings_accepted_without_effect_are_named_at_start() {
    // Proves the node says at start that `storage.codec: zstd` and `http.pprof_addr` (accepted
    // for the original's config files, OPERATIONS.md §4 and §12) do nothing here, instead of
    // leaving an operator to believe segments are compressed or a profiler listens; and that
    // nothing is opened on the pprof address.
    let dir = common::TempDir::new("inert-settings");
    let cfg = dir.0.join("narad.json");
    std::fs::write(&cfg, r#"{"storage":{"codec":"zstd"}}"#).unwrap();
    let pprof = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let pprof_addr = pprof.local_addr().unwrap().to_string();
    drop(pprof);
    let s = common::Serve::start(
        &dir,
        &["--config", cfg.to_str().unwrap()],
        &[("NARAD_HTTP_PPROF_ADDR", &pprof_addr)],
    );
    let codec = s.wait_line("storage.codec", |l| l.contains("storage.codec is zstd"));
    assert!(codec.contains("uncompressed"), "{codec}");
    let pprof = s.wait_line("pprof", |l| l.contains("http.pprof_addr is set"));
    assert!(pprof.contains(&pprof_addr), "{pprof}");
    drop(s.client());
    assert!(
        std::net::TcpStream::connect(&pprof_addr).is_err(),
        "something listens on the pprof address"
    );
}
