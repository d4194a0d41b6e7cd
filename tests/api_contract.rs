//! Black-box tests of the HTTP contract (API.md, SEMANTICS.md §1–7): the real binary on a loopback
//! port, spoken to over plain HTTP/1.1. Each test states what it proves.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::{Client, Server, TempDir};

fn server(tag: &str) -> (TempDir, Server) {
    let dir = TempDir::new(tag);
    let s = Server::start(&dir);
    (dir, s)
}

#[test]
fn health_and_unknown_routes() {
    // Proves /healthz and /readyz answers, 404 and 405 plain-text bodies with Allow, HEAD.
    let (_d, s) = server("health");
    let mut c = s.client();
    let r = c.get("/healthz");
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), serde_json::json!({"status":"ok"}));
    assert_eq!(r.header("content-type"), Some("application/json"));
    let r = c.get("/readyz");
    assert_eq!(
        (r.status, r.json()["status"].as_str()),
        (200, Some("ready"))
    );
    let r = c.get("/nope");
    assert_eq!(r.status, 404);
    assert_eq!(r.text(), "404 page not found\n");
    let r = c.request("DELETE", "/v1/topics/x/produce", &[], b"");
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("POST"));
    assert_eq!(r.text().trim(), "Method Not Allowed");
    let r = c.request("HEAD", "/healthz", &[], b"");
    assert_eq!(r.status, 200);
    assert!(r.body.is_empty());
    assert!(r.header("content-length").is_some_and(|l| l != "0"));
}

#[test]
fn topic_lifecycle_and_errors() {
    // Proves create/describe/list/patch/delete, defaults, field validation texts, 409 on a taken
    // name and on a case-only collision.
    let (_d, s) = server("topics");
    let mut c = s.client();
    let t = c.create_topic("orders", 3);
    assert_eq!(t["name"], "orders");
    assert_eq!(t["partitions"], 3);
    assert_eq!(t["retention_ms"], 604_800_000u64);
    assert_eq!(t["visibility_timeout_ms"], 30_000);
    assert_eq!(t["max_in_flight_per_partition"], 1024);
    assert_eq!(t["max_acked_ahead_per_partition"], 1024);
    assert_eq!(t["id"].as_str().unwrap().len(), 16);
    assert!(t.get("owner").is_none());
    let r = c.post_json("/v1/topics", r#"{"name":"orders"}"#);
    assert_eq!(r.status, 409);
    assert_eq!(r.error(), "topic already exists");
    let r = c.post_json("/v1/topics", r#"{"name":"ORDERS"}"#);
    assert_eq!(r.status, 409);
    assert!(
        r.error().contains("differs only in letter case"),
        "{}",
        r.error()
    );
    let r = c.post_json("/v1/topics", r#"{"name":"p","partitions":2}"#);
    assert_eq!(r.status, 400);
    assert_eq!(
        r.error(),
        "invalid argument: partitions must be >= 3 (0 = use default)"
    );
    let r = c.post_json("/v1/topics", r#"{"name":"p","partitions":109}"#);
    assert_eq!(
        r.error(),
        "invalid argument: partitions (109) exceeds topic.max_partitions (108)"
    );
    let r = c.post_json("/v1/topics", r#"{"name":"p","retention_ms":5}"#);
    assert_eq!(
        r.error(),
        "invalid argument: retention_ms (5) is below the minimum of 3600000 (1 hour)"
    );
    // Negative numbers take the form API.md §6.1 gives them.
    let r = c.post_json("/v1/topics", r#"{"name":"p","retention_ms":-1}"#);
    assert_eq!(
        (r.status, r.error().as_str()),
        (
            400,
            "invalid argument: retention_ms must be >= 0 (0 = use default)"
        )
    );
    // A bad name is quoted as Go's %q does (\u2028, \x01), not with Rust escapes.
    let r = c.post_json("/v1/topics", "{\"name\":\"a\\u2028b\\u0001\"}");
    assert_eq!(
        r.error(),
        r#"invalid argument: topic name "a\u2028b\x01" must be 1-200 characters of A-Z a-z 0-9 . _ - and not "." or "..""#
    );
    let r = c.post_json("/v1/topics", r#"{"name":"p","bogus":1}"#);
    assert_eq!(
        (r.status, r.error().as_str()),
        (400, "invalid json: json: unknown field \"bogus\"")
    );
    let r = c.post_json("/v1/topics", r#"{"name":"p"} {}"#);
    assert_eq!(
        (r.status, r.error().as_str()),
        (400, "invalid json: multiple JSON values")
    );
    let r = c.post_json("/v1/topics", r#"{"name":"a/b"}"#);
    assert_eq!(r.status, 400);
    let r = c.post_json("/v1/topics", r#"{"name":"forever","retention_ms":0}"#);
    assert_eq!(
        (r.status, r.json()["retention_ms"].as_u64()),
        (201, Some(0))
    );

    let r = c.get("/v1/topics/orders");
    assert_eq!(r.status, 200);
    let d = r.json();
    assert_eq!(d["role"], "standalone");
    assert_eq!(d["schema_version"], 0);
    let stats = d["partition_stats"].as_array().unwrap();
    assert_eq!(stats.len(), 3);
    assert_eq!(stats[1]["index"], 1);
    assert_eq!(stats[1]["high_watermark"], 0);
    assert_eq!(stats[1]["status"], "ok");
    let r = c.get("/v1/topics/orders?partition=2");
    assert_eq!(r.json()["partition_stats"].as_array().unwrap().len(), 1);
    assert_eq!(c.get("/v1/topics/orders?partition=3").status, 400);
    assert_eq!(c.get("/v1/topics/nope").error(), "topic not found");

    let r = c.patch_json(
        "/v1/topics/orders",
        r#"{"retention_ms":7200000,"max_in_flight_per_partition":5,"partitions":4}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let j = r.json();
    assert_eq!(
        (
            j["retention_ms"].as_u64(),
            j["max_in_flight_per_partition"].as_u64(),
            j["partitions"].as_u64()
        ),
        (Some(7_200_000), Some(5), Some(4))
    );
    let r = c.patch_json("/v1/topics/orders", r#"{"partitions":3}"#);
    assert_eq!(r.error(), "invalid argument: new partition count (3) must be greater than current (4); decrease is not supported");
    let r = c.patch_json("/v1/topics/orders", r#"{"partitions":-2}"#);
    assert_eq!(
        (r.status, r.error().as_str()),
        (400, "partitions must be > 0")
    );
    // `partitions: 0` means "no change", so alone it is no field either.
    for body in [&br#"{}"#[..], br#"{"partitions":0}"#] {
        let r = c.request(
            "PATCH",
            "/v1/topics/orders",
            &[("Content-Type", "application/json")],
            body,
        );
        assert_eq!(
            (r.status, r.error().as_str()),
            (
                400,
                "at least one of partitions, retention_ms, max_*_per_partition, or schema is required"
            ),
            "{}",
            String::from_utf8_lossy(body)
        );
    }
    let r = c.patch_json("/v1/topics/orders", r#"{"visibility_timeout_ms":5}"#);
    assert_eq!(r.status, 400);

    let r = c.get("/v1/topics/orders/schema");
    assert_eq!(
        r.json(),
        serde_json::json!({"topic":"orders","version":0,"versions":[]})
    );

    assert_eq!(
        c.request("DELETE", "/v1/topics/orders", &[], b"").status,
        204
    );
    assert_eq!(
        c.request("DELETE", "/v1/topics/orders", &[], b"").status,
        404
    );
    assert_eq!(c.get("/v1/topics/orders").status, 404);
    // A recreated topic gets a new id and none of the old data.
    let t2 = c.create_topic("orders", 3);
    assert_ne!(t2["id"], t["id"]);
}

#[test]
fn admin_body_keys_match_as_go_matches_them() {
    // Proves curl scripts written against the Go broker keep working: admin body keys match
    // fields without regard to letter case, and a repeated key takes its last value.
    let (_d, s) = server("gokeys");
    let mut c = s.client();
    let r = c.post_json(
        "/v1/topics",
        r#"{"Name":"first","NAME":"orders","Partitions":4,"Retention_MS":7200000}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let j = r.json();
    assert_eq!(
        (
            j["name"].as_str(),
            j["partitions"].as_u64(),
            j["retention_ms"].as_u64()
        ),
        (Some("orders"), Some(4), Some(7_200_000))
    );
    assert_eq!(c.get("/v1/topics/first").status, 404);
    let r = c.patch_json(
        "/v1/topics/orders",
        r#"{"Max_In_Flight_Per_Partition":5,"max_in_flight_per_partition":6}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["max_in_flight_per_partition"].as_u64(), Some(6));
    let r = c.post_json("/v1/topics", r#"{"Name":"p","Bogus":1}"#);
    assert_eq!(
        (r.status, r.error().as_str()),
        (400, "invalid json: json: unknown field \"Bogus\"")
    );
}

#[test]
fn topic_list_pagination() {
    // Proves keyset pagination: next_page_token is the last name, empty on the last page.
    let (_d, s) = server("list");
    let mut c = s.client();
    for n in ["a", "b", "c", "d", "e"] {
        c.create_topic(n, 3);
    }
    let r = c.get("/v1/topics?limit=2").json();
    assert_eq!(r["topics"].as_array().unwrap().len(), 2);
    assert_eq!(r["next_page_token"], "b");
    assert_eq!(r["topics"][0]["role"], "standalone");
    let r = c.get("/v1/topics?limit=2&page_token=b").json();
    assert_eq!(r["next_page_token"], "d");
    let r = c.get("/v1/topics?limit=2&page_token=d").json();
    assert_eq!(r["topics"].as_array().unwrap().len(), 1);
    assert_eq!(r["next_page_token"], "");
    let r = c.get("/v1/topics?limit=3&page_token=b").json();
    assert_eq!(r["next_page_token"], "");
    assert_eq!(
        c.get("/v1/topics?limit=0").error(),
        "limit must be a positive integer"
    );
    assert_eq!(c.get("/v1/topics?limit=x").status, 400);
}

#[test]
fn empty_query_values_count_as_absent() {
    // Proves `?limit=`, `?partition=`, `?partitions=` and `?force=` take their defaults, as the
    // original broker does, while a value that is there must still be a valid one.
    let (_d, s) = server("emptyq");
    let mut c = s.client();
    c.create_topic("p", 3);
    c.create_topic("k", 3);
    assert_eq!(
        c.post_json("/v1/topics/p/children", r#"{"child":"k"}"#)
            .status,
        200
    );
    let r = c.get("/v1/topics?limit=&page_token=").json();
    assert_eq!(r["topics"].as_array().unwrap().len(), 2, "{r}");
    let r = c.get("/v1/topics/p?partition=").json();
    assert_eq!(r["partitions"].as_u64(), Some(3), "{r}");
    let r = c.get("/v1/topics/p/children?partitions=");
    assert_eq!(r.status, 200);
    assert_eq!(c.get("/v1/topics/p/children?partitions=yes").status, 400);
    assert_eq!(
        c.request("DELETE", "/v1/topics/p/children/k?force=", &[], b"")
            .status,
        204
    );
    assert_eq!(
        c.request("DELETE", "/v1/topics/k?force=yes", &[], b"")
            .status,
        400
    );
    assert_eq!(
        c.request("DELETE", "/v1/topics/k?force=", &[], b"").status,
        204
    );
}

#[test]
fn cross_site_guard() {
    // Proves API.md §3: form posts get 415, octet-stream and X-Narad-Client pass.
    let (_d, s) = server("guard");
    let mut c = s.client();
    c.create_topic("g", 3);
    let r = c.request(
        "POST",
        "/v1/topics/g/produce",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        b"a=1",
    );
    assert_eq!(r.status, 415);
    assert!(r
        .error()
        .starts_with("state-changing requests must send Content-Type"));
    let r = c.request(
        "POST",
        "/v1/topics/g/produce",
        &[("Content-Type", "text/plain")],
        b"hi",
    );
    assert_eq!(r.status, 415);
    let r = c.request(
        "POST",
        "/v1/topics/g/produce",
        &[("Content-Type", "Application/Octet-Stream; charset=x")],
        b"hi",
    );
    assert_eq!(r.status, 202);
    let r = c.request(
        "POST",
        "/v1/topics/g/produce",
        &[("X-Narad-Client", "x")],
        b"hi",
    );
    assert_eq!(r.status, 202);
    // A body-less POST without headers to a path that would 405 still gets 415 first.
    let r = c.request("POST", "/healthz", &[], b"");
    assert_eq!(r.status, 415);
}

#[test]
fn produce_consume_ack_with_encodings() {
    // Proves SEMANTICS.md §7: JSON verbatim, text as a JSON string, binary as base64, keys likewise;
    // 202 with an empty body; message fields; ack 204 then 410.
    let (_d, s) = server("encodings");
    let mut c = s.client();
    c.create_topic("enc", 3);
    let r = c.request(
        "POST",
        "/v1/topics/enc/produce?partition=0&key=customer+42%2F%C3%A9",
        &[("Content-Type", "application/json")],
        br#" {"order_id":"ord_123","amount":4999}"#,
    );
    assert_eq!(r.status, 202);
    assert!(r.body.is_empty());
    assert_eq!(r.header("content-length"), Some("0"));
    c.request(
        "POST",
        "/v1/topics/enc/produce?partition=0",
        &[("Content-Type", "application/octet-stream")],
        b"plain text",
    );
    c.request(
        "POST",
        "/v1/topics/enc/produce?partition=0&key=%00%9F%FFk",
        &[("Content-Type", "application/octet-stream")],
        &[0xff, 0x00, 0x10],
    );

    let m = c.get("/v1/topics/enc/consume?partition=0").json();
    assert_eq!(m["topic"], "enc");
    assert_eq!(m["partition"], 0);
    assert_eq!(m["offset"], 0);
    assert_eq!(m["key"], "customer 42/é");
    assert_eq!(
        m["payload"],
        serde_json::json!({"order_id":"ord_123","amount":4999})
    );
    assert!(m.get("payload_encoding").is_none());
    assert!(
        m["timestamp"].as_u64().unwrap() > 1_700_000_000
            && m["timestamp"].as_u64().unwrap() < 4_000_000_000
    );
    let h0 = m["receipt_handle"].as_str().unwrap().to_string();
    assert!(h0.starts_with("0:0:"), "{h0}");

    let m = c.get("/v1/topics/enc/consume?partition=0").json();
    assert_eq!(m["payload"], "plain text");
    assert!(m.get("key").is_none());
    let h1 = m["receipt_handle"].as_str().unwrap().to_string();
    let m = c.get("/v1/topics/enc/consume?partition=0").json();
    assert_eq!(m["payload"], "/wAQ");
    assert_eq!(m["payload_encoding"], "base64");
    assert_eq!(m["key"], "AJ//aw==");
    assert_eq!(m["key_encoding"], "base64");
    assert_eq!(c.get("/v1/topics/enc/consume?partition=0").status, 204);

    // Raw body check: JSON payload verbatim including its leading space.
    let raw = c.get("/v1/topics/enc/consume?partition=0&offset=0");
    assert!(
        raw.text()
            .contains(r#""payload": {"order_id":"ord_123","amount":4999}"#),
        "{}",
        raw.text()
    );
    assert!(raw.json().get("receipt_handle").is_none());

    let ack = |c: &mut common::Client, h: &str| {
        c.post_client(&format!("/v1/topics/enc/ack?receipt_handle={h}"), b"")
            .status
    };
    assert_eq!(ack(&mut c, &h0), 204);
    assert_eq!(ack(&mut c, &h0), 410);
    let r = c.post_client(
        &format!(
            "/v1/topics/enc/ack?receipt_handle={}",
            h1.replace(':', "%3A")
        ),
        b"",
    );
    assert_eq!(r.status, 204);
    let r = c.post_client("/v1/topics/enc/ack?receipt_handle=1:2", b"");
    assert_eq!(
        (r.status, r.error().as_str()),
        (400, "receipt handle is malformed")
    );
    let r = c.post_client("/v1/topics/enc/ack?receipt_handle=9:0:5", b"");
    assert_eq!(
        (r.status, r.error().as_str()),
        (
            410,
            "receipt handle no longer matches an active reservation"
        )
    );
    let r = c.post_client("/v1/topics/enc/ack", b"");
    assert_eq!(
        (r.status, r.error().as_str()),
        (400, "receipt_handle required")
    );
    let r = c.post_client("/v1/topics/enc/ack?receipt_handle=0:0:1&extend=maybe", b"");
    assert_eq!(r.status, 400);
    // Replay past the end is 204; replay needs a partition.
    assert_eq!(
        c.get("/v1/topics/enc/consume?partition=0&offset=3").status,
        204
    );
    assert_eq!(
        c.get("/v1/topics/enc/consume?offset=0").error(),
        "partition required for replay-mode consume"
    );
    assert_eq!(
        c.get("/v1/topics/enc/consume?partition=0&offset=-1")
            .error(),
        "invalid offset: must be >= 0"
    );
}

#[test]
fn produce_validation() {
    // Proves the produce query and body rules of API.md §10.1.
    let (_d, s) = server("prodval");
    let mut c = s.client();
    c.create_topic("v", 3);
    let p = |c: &mut common::Client, q: &str, body: &[u8]| {
        c.post_client(&format!("/v1/topics/v/produce{q}"), body)
    };
    assert_eq!(p(&mut c, "", b"").error(), "message required");
    assert_eq!(
        p(&mut c, "?partition=", b"x").error(),
        "invalid partition: empty"
    );
    assert_eq!(
        p(&mut c, "?partition=-1", b"x").error(),
        "invalid partition: must be >= 0"
    );
    assert_eq!(
        p(&mut c, "?partition=3", b"x").error(),
        "invalid argument: partition out of range"
    );
    assert_eq!(
        p(&mut c, "?partition=1&partition=2", b"x").error(),
        "duplicate partition query parameter"
    );
    assert_eq!(
        p(&mut c, "?key=a&key=b", b"x").error(),
        "duplicate key query parameter"
    );
    assert_eq!(
        p(&mut c, "?partition=x", b"x").error(),
        r#"invalid partition: strconv.Atoi: parsing "x": invalid syntax"#
    );
    // Go's strconv texts, as the original answers them (API.md §10.1 `invalid partition: <detail>`).
    assert_eq!(
        p(&mut c, "?partition=99999999999999999999", b"x").error(),
        r#"invalid partition: strconv.Atoi: parsing "99999999999999999999": value out of range"#
    );
    assert_eq!(
        c.get("/v1/topics/v/consume?partition=0&offset=99999999999999999999")
            .error(),
        r#"invalid offset: strconv.ParseInt: parsing "99999999999999999999": value out of range"#
    );
    assert_eq!(
        c.get("/v1/topics/v/consume?partition=1x&offset=0").error(),
        r#"invalid partition: strconv.Atoi: parsing "1x": invalid syntax"#
    );
    assert_eq!(
        c.post_client("/v1/topics/none/produce", b"x").error(),
        "topic not found"
    );
    // Query parse comes before the body read and the topic lookup (API.md §10.1 order).
    let r = c.post_client("/v1/topics/none/produce?partition=x", b"x");
    assert_eq!(
        (r.status, r.error().as_str()),
        (
            400,
            r#"invalid partition: strconv.Atoi: parsing "x": invalid syntax"#
        )
    );
    assert_eq!(
        p(&mut c, "?partition=-1", b"").error(),
        "invalid partition: must be >= 0"
    );
    let r = s.client().post_client(
        "/v1/topics/v/produce?key=a&key=b",
        &vec![b'a'; (1 << 20) + 1],
    );
    assert_eq!(
        (r.status, r.error().as_str()),
        (400, "duplicate key query parameter")
    );
    let r = s
        .client()
        .post_client("/v1/topics/none/produce/batch?key=a", b"{}");
    assert_eq!(
        (r.status, r.error().as_str()),
        (
            400,
            "key is set per message in a batch produce, not as a query parameter"
        )
    );
    let big = vec![b'a'; (1 << 20) + 1];
    let r = p(&mut c, "", &big);
    assert_eq!(
        (r.status, r.error().as_str()),
        (413, "request body too large")
    );
    // The refusal closes the connection (the body was not read).
    c.reconnect();
    assert_eq!(p(&mut c, "", &big[..1 << 20]).status, 202);
    // With Expect: 100-continue (curl over 1 KiB), an oversized body is refused from the head.
    {
        use std::io::Write;
        c.reconnect();
        let head = format!(
            "POST /v1/topics/v/produce HTTP/1.1\r\nHost: x\r\nX-Narad-Client: t\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
            (1 << 20) + 1
        );
        c.raw().write_all(head.as_bytes()).unwrap();
        let r = c.read_response(false).unwrap();
        assert_eq!(
            (r.status, r.error().as_str()),
            (413, "request body too large")
        );
    }
}

#[test]
fn batch_produce_consume_and_ack() {
    // Proves API.md §10.2–10.4 batch forms: all-or-nothing produce, {"accepted":N}, batch consume
    // needing X-Narad-Client, per-handle batch ack results in order.
    let (_d, s) = server("batch");
    let mut c = s.client();
    c.create_topic("b", 3);
    let r = c.post_json("/v1/topics/b/produce/batch",
        r#"{"messages":[{"key":"customer-42","payload":{"order_id":"ord_124"}},{"key":"customer-7","payload":"aGVsbG8=","payload_encoding":"base64"},{"key":"/w==","key_encoding":"base64","payload":[1,2],"partition":2}]}"#);
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(r.json(), serde_json::json!({"accepted":3}));
    let r = c.post_json(
        "/v1/topics/b/produce/batch",
        r#"{"messages":[{"payload":1},{"payload":"","payload_encoding":"base64"}]}"#,
    );
    assert_eq!(
        (r.status, r.error().as_str()),
        (400, "message 1: message required")
    );
    let r = c.post_json(
        "/v1/topics/b/produce/batch",
        r#"{"messages":[{"payload":1,"partition":7}]}"#,
    );
    assert_eq!(
        (r.status, r.error().as_str()),
        (400, "message 0: invalid argument: partition out of range")
    );
    let r = c.post_json("/v1/topics/b/produce/batch", r#"{"messages":[]}"#);
    assert_eq!(r.error(), "messages required");
    let r = c.post_json(
        "/v1/topics/b/produce/batch?key=x",
        r#"{"messages":[{"payload":1}]}"#,
    );
    assert_eq!(
        r.error(),
        "key is set per message in a batch produce, not as a query parameter"
    );
    let many = format!(
        r#"{{"messages":[{}]}}"#,
        vec![r#"{"payload":1}"#; 1001].join(",")
    );
    assert_eq!(
        c.post_json("/v1/topics/b/produce/batch", &many).error(),
        "too many messages: more than 1000"
    );
    // Nothing of the refused batches was stored.
    assert_eq!(c.stored("b"), 3);

    let r = c.get("/v1/topics/b/consume?max=10");
    assert_eq!(r.status, 400);
    let r = c.request(
        "GET",
        "/v1/topics/b/consume?max=10",
        &[("X-Narad-Client", "t")],
        b"",
    );
    assert_eq!(r.status, 200);
    let msgs = r.json()["messages"].as_array().unwrap().clone();
    assert_eq!(msgs.len(), 3);
    let mut handles: Vec<String> = msgs
        .iter()
        .map(|m| m["receipt_handle"].as_str().unwrap().to_string())
        .collect();
    let pinned = msgs
        .iter()
        .find(|m| m["payload"] == serde_json::json!([1, 2]))
        .unwrap();
    assert_eq!(pinned["partition"], 2);
    assert_eq!(pinned["key"], "/w==");
    handles.insert(1, "0:0:1".into());
    handles.push("bad".into());
    let body = serde_json::json!({"receipt_handles": handles}).to_string();
    let r = c.post_json("/v1/topics/b/ack", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let res = r.json()["results"].as_array().unwrap().clone();
    let statuses: Vec<u64> = res.iter().map(|x| x["status"].as_u64().unwrap()).collect();
    assert_eq!(statuses, vec![204, 410, 204, 204, 400]);
    assert!(res[0].get("error").is_none());
    let many = serde_json::json!({"receipt_handles": vec!["0:0:1"; 101]}).to_string();
    assert_eq!(
        c.post_json("/v1/topics/b/ack", &many).error(),
        "too many receipt_handles: more than 100"
    );
    assert_eq!(
        c.request(
            "GET",
            "/v1/topics/b/consume?max=10",
            &[("X-Narad-Client", "t")],
            b""
        )
        .status,
        204
    );
}

#[test]
fn a_batch_consume_answer_stays_within_8_mib() {
    // Proves API.md §10.3: a batch consume answer holds at most 8 MiB of encoded messages (the
    // first always), and the records left out are released at once. Each 1,000,000-byte payload
    // of 0x01 bytes is text returned as a JSON string of `\u0001` escapes, 6 MB encoded: two
    // together are over the cap (before the fix the answer held two, 12 MB).
    let (_d, s) = server("bigbatch");
    let mut c = s.client();
    c.create_topic("big", 3);
    for _ in 0..3 {
        let r = c.post_client("/v1/topics/big/produce?partition=0", &vec![1u8; 1_000_000]);
        assert_eq!(r.status, 202, "{}", r.text());
    }
    let mut offsets = Vec::new();
    for _ in 0..3 {
        let r = c.request(
            "GET",
            "/v1/topics/big/consume?max=10&partition=0",
            &[("X-Narad-Client", "t")],
            b"",
        );
        assert_eq!(r.status, 200);
        assert!(r.body.len() <= 8 << 20, "{} bytes", r.body.len());
        let msgs = r.json()["messages"].as_array().unwrap().clone();
        assert_eq!(msgs.len(), 1, "one 6 MB message per answer");
        assert_eq!(msgs[0]["payload"].as_str().unwrap().len(), 1_000_000);
        offsets.push(msgs[0]["offset"].as_u64().unwrap());
    }
    // The left-out records were released at once, not after the visibility timeout.
    assert_eq!(offsets, vec![0, 1, 2]);
}

#[test]
fn leases_expire_nack_redelivers_extend_keeps() {
    // Proves SEMANTICS.md §2: an unacked lease comes back after the visibility timeout with a new
    // handle and the late ack gets 410; nack redelivers at once; extend keeps the lease alive.
    let (_d, s) = server("leases");
    let mut c = s.client();
    let r = c.post_json(
        "/v1/topics",
        r#"{"name":"l","partitions":3,"visibility_timeout_ms":1000}"#,
    );
    assert_eq!(r.status, 201);
    c.post_client("/v1/topics/l/produce?partition=1", b"one");
    let m1 = c.get("/v1/topics/l/consume").json();
    let h1 = m1["receipt_handle"].as_str().unwrap().to_string();
    assert_eq!(c.get("/v1/topics/l/consume").status, 204);
    std::thread::sleep(Duration::from_millis(1300));
    let m2 = c.get("/v1/topics/l/consume").json();
    assert_eq!(m2["offset"], m1["offset"]);
    let h2 = m2["receipt_handle"].as_str().unwrap().to_string();
    assert_ne!(h1, h2);
    assert_eq!(
        c.post_client(&format!("/v1/topics/l/ack?receipt_handle={h1}"), b"")
            .status,
        410
    );
    // Nack: available again immediately.
    assert_eq!(
        c.post_client(
            &format!("/v1/topics/l/ack?receipt_handle={h2}&extend=0"),
            b""
        )
        .status,
        204
    );
    let m3 = c.get("/v1/topics/l/consume").json();
    assert_eq!(m3["offset"], m1["offset"]);
    let h3 = m3["receipt_handle"].as_str().unwrap().to_string();
    // Extend twice across more than one visibility timeout: still ours.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        c.post_client(
            &format!("/v1/topics/l/ack?receipt_handle={h3}&extend=true"),
            b""
        )
        .status,
        204
    );
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        c.post_client(
            &format!("/v1/topics/l/ack?receipt_handle={h3}&extend=1"),
            b""
        )
        .status,
        204
    );
    assert_eq!(c.get("/v1/topics/l/consume").status, 204);
    assert_eq!(
        c.post_client(&format!("/v1/topics/l/ack?receipt_handle={h3}"), b"")
            .status,
        204
    );
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(c.get("/v1/topics/l/consume").status, 204);
}

/// A consume of `path` on a connection of its own, in a thread: its status and when it was
/// answered.
fn park(addr: std::net::SocketAddr, path: &'static str) -> std::thread::JoinHandle<(u16, Instant)> {
    std::thread::spawn(move || {
        let mut c = common::Client::connect(addr).unwrap();
        let r = c.get(path);
        (r.status, Instant::now())
    })
}

#[test]
fn produces_racing_a_topic_delete_get_202_or_404() {
    // Proves a produce (single or batch) that races a topic delete is answered as a produce to
    // a topic that does not exist (404 "topic not found"), never 500 "produce failed" (audit
    // s21: 11 of 40 producers saw that 500). Eight producers, five rounds of delete + re-create.
    let (_d, s) = server("produce-delete");
    let addr = s.addr();
    let mut c = s.client();
    for round in 0..5 {
        c.create_topic("race", 6);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Producers that had a 202: the delete waits for all of them (a loaded machine may
        // start a thread later than any fixed pause).
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let producers: Vec<_> = (0..8)
            .map(|i| {
                let stop = stop.clone();
                let accepted = accepted.clone();
                std::thread::spawn(move || {
                    let mut p = common::Client::connect(addr).unwrap();
                    let mut seen = std::collections::BTreeMap::<u16, u32>::new();
                    let until = Instant::now() + Duration::from_secs(10);
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < until
                    {
                        let r = if i % 2 == 0 {
                            p.post_json("/v1/topics/race/produce", "{\"a\":1}")
                        } else {
                            p.post_json(
                                "/v1/topics/race/produce/batch",
                                r#"{"messages":[{"payload":1},{"payload":2},{"payload":3}]}"#,
                            )
                        };
                        assert!(
                            matches!(r.status, 202 | 404),
                            "round {round}: {} {}",
                            r.status,
                            r.text()
                        );
                        if r.status == 404 {
                            assert_eq!(r.json()["error"], "topic not found");
                        }
                        if r.status == 202 && !seen.contains_key(&202) {
                            accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        *seen.entry(r.status).or_default() += 1;
                    }
                    seen
                })
            })
            .collect();
        let t0 = Instant::now();
        while accepted.load(std::sync::atomic::Ordering::Relaxed) < 8
            && t0.elapsed() < Duration::from_secs(8)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(c.request("DELETE", "/v1/topics/race", &[], b"").status, 204);
        std::thread::sleep(Duration::from_millis(50));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for p in producers {
            let seen = p.join().unwrap();
            assert!(seen.contains_key(&202), "round {round}: {seen:?}");
        }
    }
}

#[test]
fn a_parked_long_poll_follows_topic_changes() {
    // Proves a long-poll parked before a topic change acts on the topic as it is now:
    // raised caps let it take at once (SEMANTICS.md §2.6: new values apply immediately),
    // lowered caps stop it taking past them, added partitions are looked at, and a deleted topic
    // answers 404 (a consume of a topic that does not exist) at once, not 204 at the end of its
    // wait. Each of the four failed on the code before (the caps and partitions were read once
    // when the request began; a deleted topic's waiters were not woken).
    let (_d, s) = server("poll-changes");
    let mut c = s.client();
    let addr = s.addr();
    // Parks a consume on `wait_path`, changes the topic by `patch` while it waits, then
    // produces to `produce` if given: the consume's status and how long it took.
    let change_while_parked =
        |c: &mut Client, wait_path: &'static str, patch: (&str, &str), produce: Option<&str>| {
            let t0 = Instant::now();
            let waiter = park(addr, wait_path);
            std::thread::sleep(Duration::from_millis(300));
            let r = c.patch_json(patch.0, patch.1);
            assert_eq!(r.status, 200, "{}", r.text());
            if let Some(path) = produce {
                assert_eq!(c.post_client(path, b"y").status, 202);
            }
            let (status, at) = waiter.join().unwrap();
            (status, at - t0)
        };

    // Raised cap: partition 0 holds two messages and a cap of 1 in flight; the first is leased.
    let r = c.post_json(
        "/v1/topics",
        r#"{"name":"raise","partitions":3,"max_in_flight_per_partition":1}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    for _ in 0..2 {
        assert_eq!(
            c.post_client("/v1/topics/raise/produce?partition=0", b"x")
                .status,
            202
        );
    }
    assert_eq!(c.get("/v1/topics/raise/consume?partition=0").status, 200);
    let (status, took) = change_while_parked(
        &mut c,
        "/v1/topics/raise/consume?partition=0&wait=8s",
        ("/v1/topics/raise", r#"{"max_in_flight_per_partition":5}"#),
        None,
    );
    assert_eq!(status, 200);
    assert!(took < Duration::from_secs(5), "{took:?}");

    // Lowered cap: one message in flight under a cap of 5; the cap drops to 1 while a
    // long-poll waits; a new message must not be leased past the new cap.
    let r = c.post_json(
        "/v1/topics",
        r#"{"name":"lower","partitions":3,"max_in_flight_per_partition":5}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(
        c.post_client("/v1/topics/lower/produce?partition=0", b"x")
            .status,
        202
    );
    assert_eq!(c.get("/v1/topics/lower/consume?partition=0").status, 200);
    let (status, _) = change_while_parked(
        &mut c,
        "/v1/topics/lower/consume?partition=0&wait=3s",
        ("/v1/topics/lower", r#"{"max_in_flight_per_partition":1}"#),
        Some("/v1/topics/lower/produce?partition=0"),
    );
    assert_eq!(status, 204, "leased past the lowered cap");

    // Added partitions: a message on partition 5 of a topic that had 3 when the wait began.
    c.create_topic("grow", 3);
    let (status, took) = change_while_parked(
        &mut c,
        "/v1/topics/grow/consume?wait=8s",
        ("/v1/topics/grow", r#"{"partitions":6}"#),
        Some("/v1/topics/grow/produce?partition=5"),
    );
    assert_eq!(status, 200);
    assert!(took < Duration::from_secs(5), "{took:?}");

    // Deleted topic: the waiters (parked on both shards, whichever their connections reached)
    // answer 404 at once.
    c.create_topic("gone", 3);
    let t0 = Instant::now();
    let waiters: Vec<_> = (0..4)
        .map(|_| park(addr, "/v1/topics/gone/consume?wait=8s"))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(c.request("DELETE", "/v1/topics/gone", &[], b"").status, 204);
    for w in waiters {
        let (status, at) = w.join().unwrap();
        assert_eq!(status, 404);
        assert!(at - t0 < Duration::from_secs(5), "{:?}", at - t0);
    }
}

#[test]
fn long_poll_is_woken_by_produce_and_clamped() {
    // Proves SEMANTICS.md §2.8: a parked consume is woken by a commit within milliseconds (on any
    // partition, so across shards), and `wait` above the ceiling is clamped with the header.
    let (_d, s) = server("longpoll");
    let mut c = s.client();
    c.create_topic("w", 6);
    let addr = s.addr();
    for p in 0..6 {
        let t0 = Instant::now();
        let waiter = park(addr, "/v1/topics/w/consume?wait=5s");
        std::thread::sleep(Duration::from_millis(150));
        let t1 = Instant::now();
        assert_eq!(
            c.post_client(&format!("/v1/topics/w/produce?partition={p}"), b"x")
                .status,
            202
        );
        let (status, at) = waiter.join().unwrap();
        let took = at - t0;
        assert_eq!(status, 200);
        assert!(
            took < Duration::from_secs(4),
            "partition {p}: woken after {took:?}"
        );
        assert!(
            t1.elapsed() < Duration::from_millis(500),
            "partition {p}: wake took {:?}",
            t1.elapsed()
        );
    }
    let t0 = Instant::now();
    let r = c.get("/v1/topics/w/consume?wait=1m0s&partition=0");
    // The ceiling is 10 s; nothing to consume on partition 0 any more.
    assert_eq!(r.status, 204);
    assert_eq!(r.header("x-narad-wait-clamped"), Some("10s"));
    assert!(t0.elapsed() >= Duration::from_secs(9));
    assert!(c
        .get("/v1/topics/w/consume?wait=nope")
        .error()
        .starts_with("invalid wait: "));
    assert_eq!(c.get("/v1/topics/w/consume?wait=100%C2%B5s").status, 204);
}

#[test]
fn every_parked_waiter_sees_back_to_back_commits() {
    // Proves SEMANTICS.md §2.8 "waking is broadcast" under a race: two long-polls park, two
    // messages commit one right after the other (same partition, then two partitions, so across
    // shards). Both waiters must get one at once; before the fix a waiter that re-checked after
    // the first wake-up missed the second and slept out its whole wait in ~1 trial in 10.
    let (_d, s) = server("wakerace");
    let mut c = s.client();
    c.create_topic("wr", 3);
    let addr = s.addr();
    for trial in 0..30 {
        let waiters: Vec<_> = (0..2)
            .map(|_| park(addr, "/v1/topics/wr/consume?wait=10s"))
            .collect();
        std::thread::sleep(Duration::from_millis(150));
        let second = if trial % 2 == 0 { 0 } else { 1 };
        let t0 = Instant::now();
        for p in [0, second] {
            let path = format!("/v1/topics/wr/produce?partition={p}");
            assert_eq!(c.post_client(&path, b"x").status, 202);
        }
        for w in waiters {
            let (status, at) = w.join().unwrap();
            assert_eq!(status, 200, "trial {trial}");
            let took = at.saturating_duration_since(t0);
            // The bug slept out the whole 10 s wait; 6 s leaves a loaded machine room.
            assert!(
                took < Duration::from_secs(6),
                "trial {trial}: a waiter got its message {took:?} after the produces"
            );
        }
    }
}

#[test]
fn pipelined_and_chunked_requests() {
    // Proves HTTP/1.1 pipelining (two requests in one write) and chunked request bodies.
    use std::io::Write;
    let (_d, s) = server("pipeline");
    let mut c = s.client();
    c.create_topic("pp", 3);
    let two = "POST /v1/topics/pp/produce?partition=0 HTTP/1.1\r\nHost: x\r\nX-Narad-Client: t\r\nContent-Length: 1\r\n\r\naPOST /v1/topics/pp/produce?partition=0 HTTP/1.1\r\nHost: x\r\nX-Narad-Client: t\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nbc\r\n1;ext=1\r\nd\r\n0\r\n\r\n";
    c.raw().write_all(two.as_bytes()).unwrap();
    assert_eq!(c.read_response(false).unwrap().status, 202);
    assert_eq!(c.read_response(false).unwrap().status, 202);
    let m = c.get("/v1/topics/pp/consume?partition=0&offset=1").json();
    assert_eq!(m["payload"], "bcd");
}

/// The sum of the `/metrics` series whose lines start with `prefix` (0 when absent).
fn metric(c: &mut common::Client, prefix: &str) -> f64 {
    let r = c.get("/metrics");
    assert_eq!(r.status, 200);
    r.text()
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next())
        .map(|v| v.parse::<f64>().expect("metric value"))
        .sum()
}

#[test]
fn a_long_poll_whose_client_left_leases_nothing() {
    // Proves: a parked consume whose client closed its connection is not handed the next
    // message (a live consumer gets it at once, not after the 30 s visibility timeout), and is
    // recorded as status 499 with outcome "cancelled"; one parked with nothing arriving is also
    // ended (and recorded) within about a second of the client leaving, not at the end of `wait`.
    let (_d, s) = server("ghost-poll");
    let mut c = s.client();
    c.create_topic("ghost", 3);
    c.create_topic("quiet", 3);
    let mut ghosts = Vec::new();
    for topic in ["ghost", "quiet"] {
        let mut g = s.client();
        let poll = format!("GET /v1/topics/{topic}/consume?wait=20s HTTP/1.1\r\nHost: t\r\n\r\n");
        g.raw()
            .write_all(poll.as_bytes())
            .expect("send the long-poll");
        ghosts.push(g);
    }
    std::thread::sleep(Duration::from_millis(300));
    drop(ghosts);
    std::thread::sleep(Duration::from_millis(200));
    let r = c.post_client("/v1/topics/ghost/produce", b"m1");
    assert_eq!(r.status, 202, "{}", r.text());
    // Time for the parked polls to be woken by the commit (and, before, to take the message).
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let r = c.get("/v1/topics/ghost/consume?wait=3s");
    assert_eq!(
        r.status,
        200,
        "the message went to a client that had left: {}",
        r.text()
    );
    assert_eq!(r.json()["payload"], "m1");
    assert!(t0.elapsed() < Duration::from_secs(2));

    let prefix = r#"narad_http_requests_total{route="GET /v1/topics/{topic}/consume",method="GET",status="499"}"#;
    let cancelled =
        |t: &str| format!(r#"narad_consume_wait_seconds_count{{topic="{t}",outcome="cancelled"}}"#);
    let deadline = Instant::now() + Duration::from_secs(4);
    loop {
        let n = metric(&mut c, prefix);
        let k = metric(&mut c, &cancelled("ghost")) + metric(&mut c, &cancelled("quiet"));
        if n == 2.0 && k == 2.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "499s {n}, cancelled {k}: want 2 and 2"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        metric(&mut c, r#"narad_inflight_size{topic="ghost""#) as u64,
        1,
        "only the live consumer's lease"
    );
}

#[test]
fn per_partition_caps_take_any_positive_go_int() {
    // Proves API.md §6.1/§6.4: the caps are Go ints with no upper bound ("> 0"), so a client
    // that means "no cap" with a huge value is served (4294967296 and above were refused 400).
    let (_d, s) = server("bigcaps");
    let mut c = s.client();
    let r = c.post_json(
        "/v1/topics",
        r#"{"name":"big","max_in_flight_per_partition":9223372036854775807}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(
        r.json()["max_in_flight_per_partition"],
        9_223_372_036_854_775_807u64
    );
    let r = c.patch_json(
        "/v1/topics/big",
        r#"{"max_acked_ahead_per_partition":4294967296}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let t = c.get("/v1/topics/big").json();
    assert_eq!(t["max_acked_ahead_per_partition"], 4_294_967_296u64);
    assert_eq!(
        t["max_in_flight_per_partition"],
        9_223_372_036_854_775_807u64
    );
    assert_eq!(
        c.post_client("/v1/topics/big/produce?partition=1", b"{}")
            .status,
        202
    );
    let m = c.get("/v1/topics/big/consume?partition=1").json();
    assert_eq!(m["offset"], 0);
}

#[test]
fn patch_groups_apply_in_order_without_a_transaction() {
    // Proves API.md §6.4: retention → caps → partitions → schema, each its own write; the first
    // failing group answers its error and the groups before it stay applied.
    let (_d, s) = server("patch-order");
    let mut c = s.client();
    c.create_topic("pa", 4);
    let r = c.patch_json(
        "/v1/topics/pa",
        r#"{"retention_ms":9000000,"max_in_flight_per_partition":7,"partitions":2}"#,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.error().contains("decrease is not supported"),
        "{}",
        r.text()
    );
    let t = c.get("/v1/topics/pa").json();
    assert_eq!(t["retention_ms"], 9_000_000, "retention stays applied: {t}");
    assert_eq!(
        t["max_in_flight_per_partition"], 7,
        "caps stay applied: {t}"
    );
    assert_eq!(t["partitions"], 4);

    let r = c.post_json(
        "/v1/topics",
        r#"{"name":"pb","partitions":5,"schema":{"type":"object","required":["a"]}}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let r = c.patch_json(
        "/v1/topics/pb",
        r#"{"partitions":6,"schema":{"type":"string"}}"#,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let t = c.get("/v1/topics/pb").json();
    assert_eq!(t["partitions"], 6, "partitions stay applied: {t}");
}

#[test]
fn keyless_produces_rotate_once_per_topic_per_node() {
    // Proves SEMANTICS.md §5: keyless records go round-robin, one rotation per topic per node,
    // whichever shard took the connection (each produce here is on a new connection, so they
    // land on both shards), single and batch produces alike, with queue consumes in between:
    // message i+1 is in the partition after message i's, and the partitions end up even.
    let (_d, s) = server("keyless-rr");
    let mut c = s.client();
    c.create_topic("rr", 4);
    let single = 40;
    for i in 0..single {
        let r = s
            .client()
            .post_client("/v1/topics/rr/produce", format!("m{i}").as_bytes());
        assert_eq!(r.status, 202);
    }
    let batch: Vec<_> = (single..single + 8)
        .map(|i| serde_json::json!({"payload": format!("m{i}")}))
        .collect();
    let r = c.post_json(
        "/v1/topics/rr/produce/batch",
        &serde_json::json!({ "messages": batch }).to_string(),
    );
    assert_eq!(r.status, 202, "{}", r.text());
    // Queue consumes between produces do not take turns of the produce rotation.
    for i in single + 8..single + 16 {
        let r = s.client().get("/v1/topics/rr/consume");
        assert_eq!(r.status, 200);
        let r = s
            .client()
            .post_client("/v1/topics/rr/produce", format!("m{i}").as_bytes());
        assert_eq!(r.status, 202);
    }
    let total = single + 16;
    let mut partition_of = vec![None; total];
    for p in 0..4u32 {
        for off in 0..total {
            let r = c.get(&format!("/v1/topics/rr/consume?partition={p}&offset={off}"));
            if r.status == 204 {
                break;
            }
            assert_eq!(r.status, 200);
            let payload = r.json()["payload"].as_str().unwrap().to_string();
            let i: usize = payload.trim_start_matches('m').parse().unwrap();
            partition_of[i] = Some(p);
        }
    }
    let parts: Vec<u32> = partition_of.into_iter().map(|p| p.unwrap()).collect();
    for i in 1..total {
        assert_eq!(parts[i], (parts[i - 1] + 1) % 4, "message {i}: {parts:?}");
    }
}

#[test]
fn produce_cap_counts_a_request_while_its_body_is_read() {
    // Proves API.md §4's produce cap (`http.max_produce_in_flight_per_identity`, here 1; with
    // security off the identity is the client IP): a produce whose body is still being read
    // already holds its identity's unit, so other produces get the exact 429 (refused before
    // their bodies are read); once it is answered, the unit is free again. A batch larger than
    // the cap is clamped to it and goes through alone.
    let dir = TempDir::new("produce-cap");
    let s = Server::start_with(
        dir.0.join("data"),
        vec![(
            "NARAD_HTTP_MAX_PRODUCE_IN_FLIGHT_PER_IDENTITY".into(),
            "1".into(),
        )],
    );
    let mut c = s.client();
    c.create_topic("cap", 3);
    let refusal = "too many in-flight produce requests for this identity (limit 1 per node)";
    let batch = r#"{"messages":[{"payload":1},{"payload":2},{"payload":3}]}"#;
    for held_path in ["/v1/topics/cap/produce/batch", "/v1/topics/cap/produce"] {
        let body = if held_path.ends_with("batch") {
            batch
        } else {
            "held"
        };
        let mut held = s.client();
        let head = format!(
            "POST {held_path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n",
            body.len()
        );
        held.raw().write_all(head.as_bytes()).unwrap();
        held.raw().write_all(&body.as_bytes()[..2]).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let r = c.post_client("/v1/topics/cap/produce", b"x");
        assert_eq!((r.status, r.error()), (429, refusal.into()), "{held_path}");
        let r = c.post_json("/v1/topics/cap/produce/batch", batch);
        assert_eq!((r.status, r.error()), (429, refusal.into()), "{held_path}");
        held.raw().write_all(&body.as_bytes()[2..]).unwrap();
        assert_eq!(
            held.read_response(false).unwrap().status,
            202,
            "{held_path}"
        );
        assert_eq!(c.post_client("/v1/topics/cap/produce", b"x").status, 202);
        assert_eq!(
            c.post_json("/v1/topics/cap/produce/batch", batch).status,
            202
        );
    }
}

#[test]
fn a_new_host_name_keeps_the_data_directory_node_id() {
    // Proves a restart under another host name (a new container on the same volume) keeps the
    // node id the data directory was started with, and its topics; an id given explicitly that
    // differs is still refused with the reason.
    let dir = TempDir::new("node-id");
    let data = dir.0.join("data");
    let env = |id: &str| vec![("NARAD_NODE_ID".to_string(), id.to_string())];
    let mut s = Server::start_with(data.clone(), env("container-1"));
    s.client().create_topic("kept", 3);
    assert_eq!(s.terminate().code(), Some(0));
    // No NARAD_NODE_ID: the host name of this machine, not "container-1".
    let mut s = Server::start_with(data.clone(), vec![]);
    let mut c = s.client();
    assert_eq!(c.get("/v1/topics/kept").status, 200);
    let members = c.get("/v1/cluster/members").json();
    assert_eq!(members["members"][0]["id"], "container-1", "{members}");
    assert_eq!(s.terminate().code(), Some(0));
    // Bounded: a start that is not refused is killed after 20 s (and fails below).
    let out = std::process::Command::new("timeout")
        .arg("20")
        .arg(env!("CARGO_BIN_EXE_narad"))
        .args(["server", "start", "--dev", "--port", "0", "--data-dir"])
        .arg(&data)
        .env("NARAD_NODE_ID", "container-2")
        .env("NARAD_SHARDS", "2")
        .output()
        .expect("run narad");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(r#"belongs to node(s) ["container-1"]"#),
        "{err}"
    );
}

#[test]
fn a_consume_that_finds_a_message_does_not_wait_for_hand_offs() {
    // Proves a queue consume answers from what is available without waiting for unrelated
    // single produces still on their way to their owner shard (crate::transit), and that one
    // that comes up short still waits for them: each hand-off is held back 2 s here, longer
    // than the 1 s a read waits for hand-offs at most. Before, every consume waited first (up
    // to that 1 s), which cost a consumer taking one message at a time a hand-off per message.
    let dir = TempDir::new("ryw-short");
    let knob = vec![(
        "NARAD_TEST_TRANSIT_DELAY_MS".to_string(),
        "2000".to_string(),
    )];
    let s = Server::start_with(dir.0.join("data"), knob);
    let mut c = s.client();
    c.create_topic("t", 4);
    let next_offsets = |c: &mut Client| -> u64 {
        let v = c.get("/v1/topics/t").json();
        v["partition_stats"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["next_offset"].as_u64().unwrap())
            .sum()
    };
    for i in 0..8 {
        let r = c.post_json("/v1/topics/t/produce", &format!("{{\"i\":{i}}}"));
        assert_eq!(r.status, 202, "{}", r.text());
    }
    let until = Instant::now() + Duration::from_secs(20);
    while next_offsets(&mut c) < 8 {
        assert!(Instant::now() < until, "first 8 never reached their owners");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Four more: keyless produces rotate over the 4 partitions, so two are for the other shard
    // and stay in transit for 2 s.
    for i in 8..12 {
        let r = c.post_json("/v1/topics/t/produce", &format!("{{\"i\":{i}}}"));
        assert_eq!(r.status, 202, "{}", r.text());
    }
    let t0 = Instant::now();
    let r = c.get("/v1/topics/t/consume");
    let took = t0.elapsed();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        took < Duration::from_millis(700),
        "single consume took {took:?}"
    );
    let mut seen = std::collections::BTreeSet::new();
    seen.insert(r.json()["payload"]["i"].as_u64().unwrap());
    // The rest, the two in transit included, with a batch consume that waits for them.
    let until = Instant::now() + Duration::from_secs(20);
    while seen.len() < 12 {
        assert!(Instant::now() < until, "only {seen:?} consumed");
        let r = c.request(
            "GET",
            "/v1/topics/t/consume?max=100&wait=5s",
            &[("X-Narad-Client", "narad-tests/0")],
            b"",
        );
        if r.status == 204 {
            continue;
        }
        assert_eq!(r.status, 200, "{}", r.text());
        for m in r.json()["messages"].as_array().unwrap() {
            assert!(seen.insert(m["payload"]["i"].as_u64().unwrap()), "{m}");
        }
    }
    assert_eq!(seen, (0..12).collect());
}

#[test]
fn a_single_produce_is_readable_at_once_on_its_connection() {
    // Proves read-your-writes across the transit path (crate::transit): a keyless single
    // produce is answered after the accepting shard's own fsync, and reaches the owner shard of
    // its partition later (here each hand-off is held back 300 ms by a test knob). A consume,
    // a pinned read and the topic's stats on the same connection right after the `202` still
    // see every message: reads wait for the accepting shard's earlier hand-offs.
    let dir = TempDir::new("ryw");
    let knob = vec![("NARAD_TEST_TRANSIT_DELAY_MS".to_string(), "300".to_string())];
    let s = Server::start_with(dir.0.join("data"), knob);
    let mut c = s.client();
    c.create_topic("t", 4);
    // Keyless produces rotate over the 4 partitions, so some are owned by the other shard.
    for i in 0..4 {
        let r = c.post_json("/v1/topics/t/produce", &format!("{{\"i\":{i}}}"));
        assert_eq!(r.status, 202, "{}", r.text());
    }
    let v = c.get("/v1/topics/t").json();
    let total: u64 = v["partition_stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["next_offset"].as_u64().unwrap())
        .sum();
    assert_eq!(total, 4, "{v}");
    for p in 0..4 {
        let r = c.get(&format!("/v1/topics/t/consume?partition={p}&offset=0"));
        assert_eq!(r.status, 200, "partition {p}: {}", r.text());
    }
    let r = c.post_json("/v1/topics/t/produce?partition=1", "{\"i\":9}");
    assert_eq!(r.status, 202);
    let r = c.post_json("/v1/topics/t/produce?partition=2", "{\"i\":9}");
    assert_eq!(r.status, 202);
    let r = c.request(
        "GET",
        "/v1/topics/t/consume?max=100",
        &[("X-Narad-Client", "narad-tests/0")],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["messages"].as_array().unwrap().len(), 6);

    // On new connections too (the kernel spreads them over both shards): a read waits until
    // the node handed over what it had accepted. The first read after each round of produces
    // lands on the shard that did not accept them about half the time; 8 rounds make missing
    // that case unlikely (a build without the node-wide wait failed 2 runs in 3).
    c.create_topic("u", 4);
    for round in 0..8u64 {
        for p in 0..4 {
            let r = c.post_json(&format!("/v1/topics/u/produce?partition={p}"), "{\"u\":1}");
            assert_eq!(r.status, 202);
        }
        for p in 0..4 {
            let mut fresh = s.client();
            let r = fresh.get(&format!(
                "/v1/topics/u/consume?partition={p}&offset={round}"
            ));
            assert_eq!(r.status, 200, "partition {p} round {round}: {}", r.text());
        }
    }
}
