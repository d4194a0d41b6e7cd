//! Black-box tests of remote children (SEMANTICS.md §13, API.md §9.1–9.6, FEATURES F076–F079):
//! two brokers on this machine, the target behind a TLS front with its own throw-away CA, the
//! parent shipping to it through the target's batch produce as a produce-only replicator user.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::tls_front::{make_ca_and_leaf, Relay};
use common::{basic_auth, Client, Resp, Server, TempDir};

const ROOT_PW: &str = "root-pw-for-remote-children";
const SECRET: &str = "a-cluster-secret-for-remote-children";
const REPLICATOR_PW: &str = "replicator-password-0123456789";
/// Longest any wait of these tests.
const WAIT_MAX: Duration = Duration::from_secs(60);

fn call(c: &mut Client, method: &str, path: &str, body: &str) -> Resp {
    let auth = basic_auth("admin", ROOT_PW);
    let mut h = vec![("Authorization", auth.as_str())];
    if matches!(method, "POST" | "PATCH") {
        h.push(("Content-Type", "application/json"));
    }
    c.request(method, path, &h, body.as_bytes())
}

/// Every one of `ids` is among the payloads `seen` on the target.
fn assert_arrived<'a>(seen: &HashMap<String, usize>, ids: impl Iterator<Item = &'a String>) {
    let missing: Vec<&String> = ids.filter(|id| !seen.contains_key(*id)).collect();
    assert!(
        missing.is_empty(),
        "{} records never reached the target, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
}

/// The value of `series` (name and labels, exactly as exposed) in the metrics text `m`.
fn metric_in(m: &str, series: &str) -> Option<f64> {
    m.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// [`call`], and the answer must have `status`.
fn expect(c: &mut Client, method: &str, path: &str, body: &str, status: u16) -> Resp {
    let r = call(c, method, path, body);
    assert_eq!(r.status, status, "{method} {path}: {}", r.text());
    r
}

/// Polls `f` every 100 ms until it is true or [`WAIT_MAX`] passed.
fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while start.elapsed() < WAIT_MAX {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timed out waiting for {what}");
}

/// Consumes and acks everything on `topic` (as admin): each payload with its delivery count.
fn drain_all(c: &mut Client, topic: &str, want: usize) -> HashMap<String, usize> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let start = Instant::now();
    let mut empty = 0;
    while start.elapsed() < WAIT_MAX && empty < 3 {
        let auth = basic_auth("admin", ROOT_PW);
        let r = c.request(
            "GET",
            &format!("/v1/topics/{topic}/consume?max=100&wait=300ms"),
            &[
                ("Authorization", &auth),
                ("X-Narad-Client", "narad-tests/0"),
            ],
            b"",
        );
        if r.status == 204 {
            if seen.len() >= want {
                empty += 1;
            }
            continue;
        }
        assert_eq!(r.status, 200, "{}", r.text());
        let msgs = r.json()["messages"].as_array().unwrap().clone();
        let handles: Vec<String> = msgs
            .iter()
            .map(|m| m["receipt_handle"].as_str().unwrap().to_string())
            .collect();
        for m in &msgs {
            *seen
                .entry(
                    m["payload"]
                        .as_str()
                        .map_or_else(|| m["payload"].to_string(), String::from),
                )
                .or_default() += 1;
        }
        let body = serde_json::json!({ "receipt_handles": handles }).to_string();
        let a = call(c, "POST", &format!("/v1/topics/{topic}/ack"), &body);
        assert!(a.status < 300, "ack: {} {}", a.status, a.text());
    }
    seen
}

fn produce_ids(c: &mut Client, topic: &str, ids: &[String]) {
    let body = serde_json::json!({
        "messages": ids.iter().map(|id| serde_json::json!({"key": id, "payload": id})).collect::<Vec<_>>()
    })
    .to_string();
    let r = call(
        c,
        "POST",
        &format!("/v1/topics/{topic}/produce/batch"),
        &body,
    );
    assert_eq!(r.status, 202, "{}", r.text());
}

fn child_row(c: &mut Client, parent: &str, child: &str) -> serde_json::Value {
    let r = call(c, "GET", &format!("/v1/topics/{parent}/children"), "");
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["children"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == child)
        .cloned()
        .unwrap_or_else(|| panic!("no child {child} in {}", r.text()))
}

/// What a parent node needs to ship to the front at `front_port`: the hop attested, the port
/// allowed, loopback exempt from the address guard.
fn remote_env(front_port: u16) -> Vec<(String, String)> {
    vec![
        (
            "NARAD_REMOTES_API_HOP_ENCRYPTED".to_string(),
            "true".to_string(),
        ),
        (
            "NARAD_REMOTES_ALLOWED_PORTS".to_string(),
            front_port.to_string(),
        ),
        (
            "NARAD_REMOTES_ALLOW_ADDRESSES".to_string(),
            "127.0.0.1/32".to_string(),
        ),
    ]
}

/// Registers remote `b` (the target behind the front) through `adm`, with `limits`.
fn register_b(
    adm: &mut common::cluster::Admin,
    front_port: u16,
    ca_pem: &str,
    limits: serde_json::Value,
) {
    let body = serde_json::json!({
        "name": "b",
        "url": format!("https://127.0.0.1:{front_port}"),
        "username": "replicator",
        "password": REPLICATOR_PW,
        "ca_pem": ca_pem,
        "limits": limits,
    });
    let r = adm.post("/v1/remotes", &body.to_string());
    assert_eq!(r.status, 201, "{}", r.text());
}

/// The parent broker's settings: security on, cluster `secret` (and the `previous` one), the
/// front's port allowed and loopback exempt from the address guard.
fn parent_env(front_port: u16, secret: &str, previous: Option<&str>) -> Vec<(String, String)> {
    let mut env = vec![
        ("NARAD_ADMIN_PASSWORD".to_string(), ROOT_PW.to_string()),
        ("NARAD_CLUSTER_SECRET".to_string(), secret.to_string()),
    ];
    env.extend(remote_env(front_port));
    if let Some(p) = previous {
        env.push(("NARAD_CLUSTER_SECRET_PREVIOUS".to_string(), p.to_string()));
    }
    env
}

/// A target broker (security on) behind a TLS front, with topic `orders-copy` and a
/// produce-only user, and a parent broker allowed to dial the front.
struct Pair {
    dir: TempDir,
    target: Server,
    _front: Relay,
    parent: Server,
    front_port: u16,
    ca_pem: String,
}

/// The target side: a broker with security on, topic `orders-copy` and a produce-only user
/// `replicator`, behind a TLS front; with the front's port and its CA.
fn target_behind_front(dir: &TempDir) -> (Server, Relay, u16, String) {
    let certs = dir.0.join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    make_ca_and_leaf(&certs, "target", "IP:127.0.0.1");
    let root = vec![("NARAD_ADMIN_PASSWORD".to_string(), ROOT_PW.to_string())];
    let target = Server::start_secure(dir.0.join("target"), root);
    let front = Relay::start(
        &certs.join("target.pem"),
        &certs.join("target.key"),
        target.addr(),
    );
    let front_port = front.addr.port();
    let mut t = target.client();
    expect(
        &mut t,
        "POST",
        "/v1/topics",
        r#"{"name":"orders-copy","partitions":3}"#,
        201,
    );
    let r = call(
        &mut t,
        "POST",
        "/v1/users",
        &format!(
            r#"{{"username":"replicator","password":"{REPLICATOR_PW}","grants":[{{"action":"produce","patterns":["orders-*"]}}]}}"#
        ),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let ca_pem = std::fs::read_to_string(certs.join("target-ca.pem")).unwrap();
    (target, front, front_port, ca_pem)
}

fn pair(tag: &str) -> Pair {
    let dir = TempDir::new(tag);
    let (target, front, front_port, ca_pem) = target_behind_front(&dir);
    let parent = Server::start_secure(dir.0.join("parent"), parent_env(front_port, SECRET, None));
    let mut p = parent.client();
    expect(
        &mut p,
        "POST",
        "/v1/topics",
        r#"{"name":"orders","partitions":3}"#,
        201,
    );
    Pair {
        dir,
        target,
        _front: front,
        parent,
        front_port,
        ca_pem,
    }
}

impl Pair {
    fn register(&self, name: &str, password: &str) -> Resp {
        let body = serde_json::json!({
            "name": name,
            "url": format!("https://127.0.0.1:{}", self.front_port),
            "username": "replicator",
            "password": password,
            "ca_pem": self.ca_pem,
        });
        call(
            &mut self.parent.client(),
            "POST",
            "/v1/remotes",
            &body.to_string(),
        )
    }
}

#[test]
fn every_record_reaches_the_target_through_tls_and_an_outage_loses_nothing() {
    let pr = pair("rc-ship");
    let mut p = pr.parent.client();
    let r = pr.register("b", REPLICATOR_PW);
    assert_eq!(r.status, 201, "{}", r.text());

    // A dry run checks and resolves the start offsets without creating anything.
    let dry = call(
        &mut p,
        "POST",
        "/v1/topics/orders/children",
        r#"{"child":"orders-to-b","remote":"b","remote_topic":"orders-copy","dry_run":true}"#,
    );
    assert_eq!(dry.status, 200, "{}", dry.text());
    assert_eq!(dry.json()["attach_offsets"], serde_json::json!([0, 0, 0]));
    assert_eq!(
        call(&mut p, "GET", "/v1/topics/orders-to-b", "").status,
        404
    );

    let r = expect(
        &mut p,
        "POST",
        "/v1/topics/orders/children",
        r#"{"child":"orders-to-b","remote":"b","remote_topic":"orders-copy"}"#,
        201,
    );
    let stub = r.json();
    assert_eq!(stub["partitions"], 0);
    assert_eq!(stub["parent"], "orders");
    assert_eq!(stub["remote"]["name"], "b");
    assert_eq!(stub["remote"]["topic"], "orders-copy");
    assert_eq!(stub["remote"]["from"], "attach");
    assert_eq!(stub["remote"]["target_id"].as_str().map(str::len), Some(16));

    // The stub takes no produce, consume or ack.
    let want_409 = "remote child \"orders-to-b\" lives on remote b; consume it there";
    for (m, path, body) in [
        ("POST", "/v1/topics/orders-to-b/produce", "{}"),
        ("GET", "/v1/topics/orders-to-b/consume", ""),
        (
            "POST",
            "/v1/topics/orders-to-b/ack",
            r#"{"receipt_handles":["x"]}"#,
        ),
    ] {
        let r = call(&mut p, m, path, body);
        assert_eq!(
            (r.status, r.error()),
            (409, want_409.to_string()),
            "{m} {path}"
        );
    }

    let first: Vec<String> = (0..300).map(|i| format!("m-{i}")).collect();
    for chunk in first.chunks(100) {
        produce_ids(&mut p, "orders", chunk);
    }
    wait_for("the first 300 on the target", || {
        let row = child_row(&mut p, "orders", "orders-to-b");
        row["lag_messages"] == 0 && row["lag_complete"] == true && row["state"] == "running"
    });

    // The target stops answering (frozen): shipping holds as `unavailable`, the parent still
    // takes produces, and once the target answers again everything arrives.
    let pid = pr.target.pid().to_string();
    let st = std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap();
    assert!(st.success());
    let second: Vec<String> = (300..400).map(|i| format!("m-{i}")).collect();
    produce_ids(&mut p, "orders", &second);
    wait_for("state unavailable while the target is frozen", || {
        child_row(&mut p, "orders", "orders-to-b")["state"] == "unavailable"
    });
    let row = child_row(&mut p, "orders", "orders-to-b");
    assert!(row["lag_messages"].as_u64() > Some(0), "{row}");
    assert!(row["blocked_at"].is_object(), "{row}");
    // Detach is refused while records are unshipped.
    let r = expect(
        &mut p,
        "DELETE",
        "/v1/topics/orders/children/orders-to-b",
        "",
        409,
    );
    assert!(r.json()["lag_messages"].as_u64() > Some(0), "{}", r.text());
    let st = std::process::Command::new("kill")
        .args(["-CONT", &pid])
        .status()
        .unwrap();
    assert!(st.success());
    wait_for("the rest shipped after the outage", || {
        let row = child_row(&mut p, "orders", "orders-to-b");
        row["lag_messages"] == 0 && row["state"] == "running"
    });

    // (A fresh connection: the target closed the idle one meanwhile.)
    let mut t = pr.target.client();
    let seen = drain_all(&mut t, "orders-copy", 400);
    assert_arrived(&seen, first.iter().chain(&second));
    let extra: HashSet<&String> = seen.keys().filter(|k| !k.starts_with("m-")).collect();
    assert!(extra.is_empty(), "unexpected payloads {extra:?}");

    // The shipper's series: answers by code, failures by class, records sent again.
    let m = call(&mut p, "GET", "/metrics", "").text();
    let value = |series: &str| metric_in(&m, series).unwrap_or(0.0);
    assert!(
        value(r#"narad_remote_requests_total{remote="b",code="202"}"#) >= 4.0,
        "{m}"
    );
    assert!(value(r#"narad_remote_errors_total{remote="b",class="unavailable"}"#) >= 1.0);
    assert!(value(r#"narad_remote_resent_records_total{remote="b"}"#) >= 1.0);
    assert!(value(r#"narad_remote_body_bytes_total{remote="b"}"#) > 0.0);
    assert!(
        value(r#"narad_remote_request_seconds_count{remote="b"}"#) >= 4.0,
        "{m}"
    );
    assert!(value(r#"narad_remote_inflight_wait_seconds_count{remote="b"}"#) >= 4.0);
    assert!(value(r#"narad_remote_credential_decrypts_total{remote="b"}"#) >= 1.0);
    assert_eq!(
        value(r#"narad_produce_rejections_total{topic="orders-to-b",reason="remote_child"}"#),
        1.0,
        "the refused produce to the stub"
    );
    for partition in 0..3 {
        let series = format!(
            r#"narad_fanout_remote_state{{parent="orders",child="orders-to-b",partition="{partition}",state="running"}}"#
        );
        assert_eq!(value(&series), 1.0, "{series} in {m}");
        let lag = format!(
            r#"narad_fanout_remote_lag_seconds{{parent="orders",child="orders-to-b",partition="{partition}"}}"#
        );
        assert!(m.contains(&lag), "{lag} in {m}");
    }
    let last = value(
        r#"narad_fanout_remote_last_success_timestamp_seconds{parent="orders",child="orders-to-b"}"#,
    );
    assert!(last > 1.7e9, "a recent Unix time: {last}");
    assert_eq!(
        value(r#"narad_fanout_remote_skipped_records_total{parent="orders",child="orders-to-b"}"#),
        0.0
    );

    // Pause holds the cursors; resume re-runs the checks and ships again.
    let r = expect(
        &mut p,
        "POST",
        "/v1/topics/orders/children/orders-to-b/pause",
        r#"{"reason":"maintenance"}"#,
        200,
    );
    assert_eq!(r.json()["remote"]["paused"], true);
    assert_eq!(r.json()["remote"]["pause_reason"], "maintenance");
    let third: Vec<String> = (400..420).map(|i| format!("m-{i}")).collect();
    produce_ids(&mut p, "orders", &third);
    std::thread::sleep(Duration::from_millis(1500));
    let row = child_row(&mut p, "orders", "orders-to-b");
    assert_eq!(row["state"], "paused", "{row}");
    assert_eq!(
        row["lag_messages"], 20,
        "a paused child ships nothing: {row}"
    );
    let r = expect(
        &mut p,
        "POST",
        "/v1/topics/orders/children/orders-to-b/resume",
        "{}",
        200,
    );
    assert!(r.json()["remote"].get("paused").is_none(), "{}", r.text());
    wait_for("shipping after resume", || {
        child_row(&mut p, "orders", "orders-to-b")["lag_messages"] == 0
    });
    let seen = drain_all(&mut pr.target.client(), "orders-copy", 20);
    assert!(
        third.iter().all(|id| seen.contains_key(id)),
        "after resume: {seen:?}"
    );

    // Nothing unshipped: the detach goes through and the stub is gone.
    expect(
        &mut p,
        "DELETE",
        "/v1/topics/orders/children/orders-to-b",
        "",
        204,
    );
    assert_eq!(
        call(&mut p, "GET", "/v1/topics/orders-to-b", "").status,
        404
    );
}

#[test]
fn a_wrong_password_a_missing_target_and_a_refused_record_are_named() {
    let pr = pair("rc-states");
    let mut p = pr.parent.client();
    let mut t = pr.target.client();
    assert_eq!(
        pr.register("bad", "not-the-password-0123456789xyz").status,
        201
    );
    let r = expect(
        &mut p,
        "POST",
        "/v1/topics/orders/children",
        r#"{"child":"to-bad","remote":"bad","remote_topic":"orders-copy"}"#,
        409,
    );
    assert_eq!(r.json()["class"], "auth_failed", "{}", r.text());

    assert_eq!(pr.register("b", REPLICATOR_PW).status, 201);
    let r = expect(
        &mut p,
        "POST",
        "/v1/topics/orders/children",
        r#"{"child":"to-nowhere","remote":"b","remote_topic":"orders-none"}"#,
        409,
    );
    assert_eq!(r.json()["class"], "target_missing", "{}", r.text());

    // The target's schema refuses a record the parent (no schema) took: the partition stops on
    // it as `rejected_record` until it is skipped; the records after it follow.
    let schema = r#"{"schema":{"type":"object","required":["n"]}}"#;
    let r = call(&mut t, "PATCH", "/v1/topics/orders-copy", schema);
    assert!(r.status < 300, "{}", r.text());
    expect(
        &mut p,
        "POST",
        "/v1/topics/orders/children",
        r#"{"child":"to-b","remote":"b","remote_topic":"orders-copy"}"#,
        201,
    );
    let produce = |c: &mut Client, body: &str| {
        let r = call(c, "POST", "/v1/topics/orders/produce?partition=1", body);
        assert_eq!(r.status, 202, "{}", r.text());
    };
    produce(&mut p, r#"{"n":1}"#);
    produce(&mut p, r#"{"bad":true}"#);
    produce(&mut p, r#"{"n":3}"#);
    // A second partition stuck at once: partition 2's first record.
    expect(
        &mut p,
        "POST",
        "/v1/topics/orders/produce?partition=2",
        r#"{"bad":2}"#,
        202,
    );
    let rows = |p: &mut Client| {
        let r = call(p, "GET", "/v1/topics/orders/children?partitions=true", "");
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["children"][0]["partitions"].clone()
    };
    wait_for("both partitions stuck as rejected_record", || {
        let rows = rows(&mut p);
        rows[1]["state"] == "rejected_record" && rows[2]["state"] == "rejected_record"
    });
    let all = rows(&mut p);
    assert_eq!(all[0]["state"], "running", "{all}");
    assert_eq!(all[1]["blocked_at"]["offset"], 1, "{all}");
    assert_eq!(all[1]["next_offset"], 1, "{all}");
    assert_eq!(all[1]["high_watermark"], 3, "{all}");
    assert_eq!(all[1]["start_offset"], 0, "{all}");
    assert_eq!(all[2]["blocked_at"]["offset"], 0, "{all}");
    let row = child_row(&mut p, "orders", "to-b");
    assert_eq!(row["state"], "rejected_record", "{row}");
    assert!(row["blocked_at"].is_object(), "{row}");
    let wrong = call(
        &mut p,
        "POST",
        "/v1/topics/orders/children/to-b/skip",
        r#"{"partition":1,"offset":2}"#,
    );
    assert_eq!(wrong.status, 409, "{}", wrong.text());
    let r = expect(
        &mut p,
        "POST",
        "/v1/topics/orders/children/to-b/skip",
        r#"{"partition":1,"offset":1}"#,
        200,
    );
    assert_eq!(r.json()["remote"]["skip"]["1"], serde_json::json!([1]));
    let r = call(
        &mut p,
        "POST",
        "/v1/topics/orders/children/to-b/skip",
        r#"{"partition":2,"offset":0}"#,
    );
    assert_eq!(
        r.status,
        200,
        "both stuck partitions skip at once: {}",
        r.text()
    );
    wait_for("running after the skips", || {
        let row = child_row(&mut p, "orders", "to-b");
        row["state"] == "running" && row["lag_messages"] == 0
    });
    let seen = drain_all(&mut t, "orders-copy", 2);
    let mut got: Vec<&String> = seen.keys().collect();
    got.sort();
    assert_eq!(got, ["{\"n\":1}", "{\"n\":3}"], "{seen:?}");

    // A deleted target topic is `target_missing`; detach with force drops the link anyway.
    let r = call(&mut t, "DELETE", "/v1/topics/orders-copy", "");
    assert!(r.status < 300, "{}", r.text());
    produce(&mut p, r#"{"n":4}"#);
    wait_for("target_missing", || {
        child_row(&mut p, "orders", "to-b")["state"] == "target_missing"
    });
    expect(&mut p, "DELETE", "/v1/topics/orders/children/to-b", "", 409);
    expect(
        &mut p,
        "DELETE",
        "/v1/topics/orders/children/to-b?force=true",
        "",
        204,
    );

    // Remote-child writes are 60 a minute per node: the pauses of a new child run out of them.
    expect(
        &mut t,
        "POST",
        "/v1/topics",
        r#"{"name":"orders-again","partitions":3}"#,
        201,
    );
    expect(
        &mut p,
        "POST",
        "/v1/topics/orders/children",
        r#"{"child":"to-b2","remote":"b","remote_topic":"orders-again"}"#,
        201,
    );
    let mut statuses = Vec::new();
    for _ in 0..61 {
        let r = call(
            &mut p,
            "POST",
            "/v1/topics/orders/children/to-b2/pause",
            "{}",
        );
        statuses.push(r.status);
        if r.status == 429 {
            assert!(r.header("retry-after").is_some(), "{}", r.text());
            break;
        }
    }
    assert_eq!(statuses.last(), Some(&429), "{statuses:?}");
    assert!(statuses.len() <= 61 && statuses.len() > 50, "{statuses:?}");
}

#[test]
fn a_killed_parent_and_a_rotated_secret_keep_every_record_shipping() {
    let mut pr = pair("rc-rotate");
    let mut p = pr.parent.client();
    assert_eq!(pr.register("b", REPLICATOR_PW).status, 201);

    // The test route runs the attach checks: pass here, and at most once per 5 s.
    let r = expect(
        &mut p,
        "POST",
        "/v1/remotes/b/test",
        r#"{"topic":"orders-copy","source":"orders"}"#,
        200,
    );
    assert_eq!(r.json()["result"], "pass", "{}", r.text());
    assert_eq!(
        r.json()["checks"][0]["target_id"].as_str().map(str::len),
        Some(16)
    );
    expect(
        &mut p,
        "POST",
        "/v1/remotes/b/test",
        r#"{"topic":"orders-copy"}"#,
        429,
    );

    expect(
        &mut p,
        "POST",
        "/v1/topics/orders/children",
        r#"{"child":"orders-to-b","remote":"b","remote_topic":"orders-copy"}"#,
        201,
    );
    // A remote in use is not deleted without force.
    let r = expect(&mut p, "DELETE", "/v1/remotes/b", "", 409);
    assert_eq!(r.json()["links"], serde_json::json!(["orders/orders-to-b"]));

    // kill -9 of the shipping node mid-stream: after its restart every record still arrives.
    let ids: Vec<String> = (0..2000).map(|i| format!("k-{i}")).collect();
    for chunk in ids.chunks(200) {
        produce_ids(&mut p, "orders", chunk);
    }
    pr.parent.kill9();
    // It comes back with a new cluster secret and the old one as the previous: the sealed
    // password still opens, so shipping resumes before the re-encryption.
    let data = pr.dir.0.join("parent");
    pr.parent = Server::start_secure(
        data,
        parent_env(
            pr.front_port,
            "a-new-cluster-secret-after-rotation",
            Some(SECRET),
        ),
    );
    let mut p = pr.parent.client();
    wait_for("every record shipped after the restart", || {
        let row = child_row(&mut p, "orders", "orders-to-b");
        row["lag_messages"] == 0 && row["lag_complete"] == true
    });
    let metric =
        |p: &mut Client, series: &str| metric_in(&call(p, "GET", "/metrics", "").text(), series);
    // Sealed under the old key: stale until re-encrypted (shipping opens it with the previous).
    assert_eq!(
        metric(
            &mut p,
            r#"narad_remote_credential_state{remote="b",state="stale"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(&mut p, r#"narad_remote_credential_key_current{remote="b"}"#),
        Some(0.0)
    );
    let r = expect(&mut p, "POST", "/v1/cluster/reencrypt-remotes", "", 200);
    assert_eq!(
        metric(
            &mut p,
            r#"narad_remote_credential_state{remote="b",state="ready"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(&mut p, r#"narad_remote_credential_key_current{remote="b"}"#),
        Some(1.0)
    );
    assert_eq!(
        r.json()["reencrypted"],
        serde_json::json!(["b"]),
        "{}",
        r.text()
    );
    let more: Vec<String> = (2000..2100).map(|i| format!("k-{i}")).collect();
    produce_ids(&mut p, "orders", &more);
    wait_for("shipping after the re-encryption", || {
        let row = child_row(&mut p, "orders", "orders-to-b");
        row["lag_messages"] == 0 && row["state"] == "running"
    });
    let seen = drain_all(&mut pr.target.client(), "orders-copy", 2100);
    assert_arrived(&seen, ids.iter().chain(&more));
    let dups: usize = seen.values().map(|n| n - 1).sum();
    println!("2100 records shipped across a kill -9 and a secret rotation; {dups} duplicates");

    // The parent is not deleted while its remote child has unshipped records.
    let pid = pr.target.pid().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    produce_ids(&mut p, "orders", &["late".to_string()]);
    expect(&mut p, "DELETE", "/v1/topics/orders", "", 409);
    assert!(std::process::Command::new("kill")
        .args(["-CONT", &pid])
        .status()
        .unwrap()
        .success());
    expect(&mut p, "DELETE", "/v1/topics/orders?force=true", "", 204);
    assert_eq!(
        call(&mut p, "GET", "/v1/topics/orders-to-b", "").status,
        404,
        "the stub went with it"
    );
}

#[test]
fn a_cluster_ships_from_every_owner_and_across_an_owner_kill() {
    // Each parent partition ships from its owner's cursors; the listing gathers every owner's
    // lag and state. An owner killed (-9) and restarted resumes from its stored positions, so
    // every record reaches the target at least once.
    let dir = TempDir::new("rc-cluster");
    let (target, _front, front_port, ca_pem) = target_behind_front(&dir);
    let mut c = Cluster::spawn("rc-cluster-nodes", 3, |_| remote_env(front_port));
    c.wait_ready(WAIT_MAX);
    let mut a = c.nodes[0].admin();
    register_b(
        &mut a,
        front_port,
        &ca_pem,
        serde_json::json!({"compression": "zstd"}),
    );
    let r = a.post("/v1/topics", r#"{"name":"orders","partitions":3}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    // Every member's view of the credential: all open it with the shared cluster secret.
    let views = |adm: &mut common::cluster::Admin| {
        let v = adm.get("/v1/remotes").json();
        let mut rows: Vec<(String, String)> = v["remotes"][0]["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                (
                    n["node"].as_str().unwrap_or("?").to_string(),
                    n["state"].as_str().unwrap_or("?").to_string(),
                )
            })
            .collect();
        rows.sort();
        (rows, v["not_answering"].clone())
    };
    let (rows, silent) = views(&mut a);
    let ready = |n: &str| (n.to_string(), "ready".to_string());
    assert_eq!(rows, [ready("n1"), ready("n2"), ready("n3")]);
    assert_eq!(silent, serde_json::json!([]));
    // The attach goes through another node than the registration (the registry is in Raft),
    // and its checks run from every member.
    let mut b = c.nodes[1].admin();
    let r = b.post(
        "/v1/topics/orders/children",
        r#"{"child":"orders-to-b","remote":"b","remote_topic":"orders-copy","dry_run":true}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let mut nodes: Vec<String> = r.json()["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["result"] == "pass")
        .map(|c| c["node"].as_str().unwrap().to_string())
        .collect();
    nodes.sort();
    assert_eq!(nodes, ["n1", "n2", "n3"], "{}", r.text());
    let r = b.post(
        "/v1/topics/orders/children",
        r#"{"child":"orders-to-b","remote":"b","remote_topic":"orders-copy","lanes":4}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["remote"]["lanes"], 4);
    let row = |adm: &mut common::cluster::Admin| {
        let r = adm.get("/v1/topics/orders/children");
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["children"][0].clone()
    };
    let batch = |adm: &mut common::cluster::Admin, ids: &[String]| {
        let body = serde_json::json!({
            "messages": ids.iter().map(|id| serde_json::json!({"key": id, "payload": id})).collect::<Vec<_>>()
        });
        let r = adm.post("/v1/topics/orders/produce/batch", &body.to_string());
        assert_eq!(r.status, 202, "{}", r.text());
    };
    let first: Vec<String> = (0..600).map(|i| format!("c-{i}")).collect();
    let mut p = c.nodes[2].admin();
    for chunk in first.chunks(100) {
        batch(&mut p, chunk);
    }
    wait_for("every owner shipped", || {
        let r = row(&mut a);
        r["lag_messages"] == 0 && r["lag_complete"] == true && r["state"] == "running"
    });

    // Bodies went zstd-compressed (4 lanes a partition): fewer bytes on the wire than in them.
    let m = a.get("/metrics").text();
    let value = |series: &str| metric_in(&m, series).unwrap_or(0.0);
    let body = value(r#"narad_remote_body_bytes_total{remote="b"}"#);
    let wire = value(r#"narad_remote_wire_bytes_total{remote="b"}"#);
    assert!(
        body > 0.0 && wire > 0.0 && wire < body,
        "wire {wire} body {body}"
    );
    assert_eq!(
        value(r#"narad_remote_chunk_bytes_limit{remote="b"}"#),
        983040.0
    );
    assert_eq!(
        value("narad_remote_held_bytes"),
        0.0,
        "nothing held once shipped"
    );

    // Node 3 owns a partition of `orders`: killed, its cursor stops; restarted, it resumes.
    c.nodes[2].kill9();
    let second: Vec<String> = (600..900).map(|i| format!("c-{i}")).collect();
    for chunk in second.chunks(100) {
        batch(&mut a, chunk);
    }
    let r = row(&mut b);
    assert_eq!(r["lag_complete"], false, "an owner is down: {r}");
    let (rows, silent) = views(&mut a);
    assert_eq!(silent, serde_json::json!(["n3"]), "{rows:?}");
    c.start_node(2);
    c.wait_ready(WAIT_MAX);
    wait_for("shipping after the owner's restart", || {
        let r = row(&mut a);
        r["lag_messages"] == 0 && r["lag_complete"] == true
    });
    let seen = drain_all(&mut target.client(), "orders-copy", 900);
    assert_arrived(&seen, first.iter().chain(&second));
}

#[test]
fn shipping_follows_a_moved_parent_partition_from_where_it_stood() {
    // A 4th node joins and parent partitions move to it (CLUSTER.md §9.3): their cursors move
    // with them, so the new owner ships on from the old owner's position, not from the attach
    // point (which would send the moved partitions' records again).
    let dir = TempDir::new("rc-move");
    let (target, _front, front_port, ca_pem) = target_behind_front(&dir);
    let env = move || {
        let mut v = remote_env(front_port);
        v.push(("NARAD_TEST_HEARTBEAT_MS".to_string(), "300".to_string()));
        v.push((
            "NARAD_TEST_PROMOTE_AFTER_MS".to_string(),
            "1000".to_string(),
        ));
        v
    };
    let mut c = Cluster::spawn("rc-move-nodes", 3, |_| env());
    c.wait_ready(WAIT_MAX);
    let mut a = c.nodes[0].admin();
    register_b(&mut a, front_port, &ca_pem, serde_json::json!({}));
    let r = a.post("/v1/topics", r#"{"name":"orders","partitions":8}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    let r = a.post(
        "/v1/topics/orders/children",
        r#"{"child":"orders-to-b","remote":"b","remote_topic":"orders-copy"}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let produce = |a: &mut common::cluster::Admin, from: usize, to: usize| {
        for b in (from..to).step_by(100) {
            let body = serde_json::json!({
                "messages": (b..b + 100).map(|i| serde_json::json!({"payload": format!("v-{i}")})).collect::<Vec<_>>()
            });
            let r = a.post("/v1/topics/orders/produce/batch", &body.to_string());
            assert_eq!(r.status, 202, "{}", r.text());
        }
    };
    let settled = |a: &mut common::cluster::Admin| {
        let r = a.get("/v1/topics/orders/children").json()["children"][0].clone();
        r["lag_messages"] == 0 && r["lag_complete"] == true
    };
    produce(&mut a, 0, 800);
    wait_for("the first 800 shipped", || settled(&mut a));
    c.add_joiner(env());
    c.wait_ready(WAIT_MAX);
    wait_for("parent partitions moved to n4", || {
        let on_n4 = a.get("/v1/topics/orders").json()["partition_stats"]
            .as_array()
            .map_or(0, |s| s.iter().filter(|p| p["owner_node"] == "n4").count());
        let moving = a.get("/v1/cluster/moves").json()["moves"]
            .as_array()
            .map_or(usize::MAX, Vec::len);
        on_n4 >= 2 && moving == 0
    });
    produce(&mut a, 800, 1200);
    wait_for("the rest shipped, n4's partitions included", || {
        settled(&mut a)
    });
    let seen = drain_all(&mut target.client(), "orders-copy", 1200);
    let missing = (0..1200)
        .filter(|i| {
            !seen.contains_key(&format!("\"v-{i}\"")) && !seen.contains_key(&format!("v-{i}"))
        })
        .count();
    assert_eq!(missing, 0, "records never reached the target");
    let dups: usize = seen.values().map(|n| n - 1).sum();
    println!("1200 records shipped across the moves; {dups} sent twice");
    assert!(
        dups < 200,
        "the moved cursors went back to the attach point: {dups} records shipped twice"
    );
}

#[test]
fn a_recreated_target_is_caught_by_the_periodic_check_and_needs_accept_target() {
    // SEMANTICS.md §13 "Checks": every `check_interval_ms` the owner checks the target again; a
    // target topic deleted and created anew has a new id: `target_replaced` holds shipping until
    // a resume accepts it (`accept_target`), and a plain resume is refused with `409`.
    let pr = pair("rc-replaced");
    let mut p = pr.parent.client();
    let mut t = pr.target.client();
    let body = serde_json::json!({
        "name": "b",
        "url": format!("https://127.0.0.1:{}", pr.front_port),
        "username": "replicator",
        "password": REPLICATOR_PW,
        "ca_pem": pr.ca_pem,
        "limits": {"check_interval_ms": 10000},
    });
    expect(&mut p, "POST", "/v1/remotes", &body.to_string(), 201);
    expect(
        &mut p,
        "POST",
        "/v1/topics/orders/children",
        r#"{"child":"orders-to-b","remote":"b","remote_topic":"orders-copy"}"#,
        201,
    );
    produce_ids(&mut p, "orders", &["r-0".to_string()]);
    wait_for("the first record shipped", || {
        child_row(&mut p, "orders", "orders-to-b")["lag_messages"] == 0
    });
    assert!(call(&mut t, "DELETE", "/v1/topics/orders-copy", "").status < 300);
    expect(
        &mut t,
        "POST",
        "/v1/topics",
        r#"{"name":"orders-copy","partitions":3}"#,
        201,
    );
    let mut i = 1;
    wait_for("target_replaced within a check interval", || {
        produce_ids(&mut p, "orders", &[format!("r-{i}")]);
        i += 1;
        std::thread::sleep(Duration::from_millis(400));
        child_row(&mut p, "orders", "orders-to-b")["state"] == "target_replaced"
    });
    let m = call(&mut p, "GET", "/metrics", "").text();
    let failures = metric_in(
        &m,
        r#"narad_fanout_remote_check_failures_total{parent="orders",child="orders-to-b"}"#,
    )
    .unwrap_or(0.0);
    assert!(failures >= 1.0, "the failed check is counted: {m}");
    let r = expect(
        &mut p,
        "POST",
        "/v1/topics/orders/children/orders-to-b/resume",
        "{}",
        409,
    );
    assert_eq!(r.json()["class"], "target_replaced", "{}", r.text());
    std::thread::sleep(Duration::from_millis(5100));
    // The CLI's verbs against the real link: resume accepting the new target, then wait for
    // the lag to reach zero.
    let server = format!("http://{}", pr.parent.addr());
    let env = [("NARAD_USER", "admin"), ("NARAD_PASS", ROOT_PW)];
    let out = common::narad_env(
        &server,
        &[
            "topic",
            "resume",
            "orders",
            "orders-to-b",
            "--accept-target",
        ],
        b"",
        &env,
    );
    assert_eq!(out.code, 0, "{} {}", out.stdout, out.stderr);
    assert!(out.stdout.contains("\"remote\""), "{}", out.stdout);
    let out = common::narad_env(
        &server,
        &[
            "topic",
            "wait",
            "orders",
            "orders-to-b",
            "--lag-zero",
            "--timeout",
            "30s",
        ],
        b"",
        &env,
    );
    assert_eq!(out.code, 0, "{} {}", out.stdout, out.stderr);
    assert_eq!(
        child_row(&mut p, "orders", "orders-to-b")["state"],
        "running"
    );
    let out = common::narad_env(&server, &["topic", "children", "orders"], b"", &env);
    assert_eq!(out.code, 0, "{} {}", out.stdout, out.stderr);
    assert!(out.stdout.contains("orders-to-b"), "{}", out.stdout);
}
