//! Bad input (issue 3): malformed HTTP and malformed API input get a precise 4xx, never a panic or
//! a hang, the server keeps serving afterwards, and nothing accepted before is lost.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{Client, Server, TempDir};

/// Sends raw bytes on a fresh connection and returns everything the server answers before it
/// closes the connection (or the read times out).
fn raw_exchange(s: &Server, bytes: &[u8]) -> String {
    let mut t = TcpStream::connect(s.addr()).unwrap();
    t.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = t.write_all(bytes);
    let _ = t.shutdown(std::net::Shutdown::Write);
    let mut out = Vec::new();
    let _ = t.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn status_of(answer: &str) -> u16 {
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[test]
fn malformed_http_and_api_input_get_4xx_and_lose_nothing() {
    let dir = TempDir::new("badinput");
    let s = Server::start(&dir);
    let mut c = s.client();
    c.create_topic("bad", 3);
    for i in 0..20 {
        let r = c.post_client(
            &format!("/v1/topics/bad/produce?partition={}", i % 3),
            format!("msg-{i}").as_bytes(),
        );
        assert_eq!(r.status, 202);
    }

    // Malformed HTTP: each gets 400/431 and a clean close.
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("garbage request line", b"\x00\x01\x02 nonsense\r\n\r\n".to_vec(), 400),
        ("bad version", b"GET /healthz HTTP/9.9\r\n\r\n".to_vec(), 400),
        ("header without colon", b"GET /healthz HTTP/1.1\r\nHost x\r\n\r\n".to_vec(), 400),
        (
            "bad chunk size",
            b"POST /v1/topics/bad/produce HTTP/1.1\r\nHost: x\r\nX-Narad-Client: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n".to_vec(),
            400,
        ),
        (
            "two content lengths",
            b"POST /v1/topics/bad/produce HTTP/1.1\r\nHost: x\r\nX-Narad-Client: t\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc".to_vec(),
            400,
        ),
        ("huge header", {
            let mut v = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
            v.extend(std::iter::repeat_n(b'a', 70_000));
            v.extend_from_slice(b"\r\n\r\n");
            v
        }, 431),
    ];
    for (name, bytes, want) in cases {
        let answer = raw_exchange(&s, &bytes);
        assert_eq!(status_of(&answer), want, "{name}: {answer:?}");
    }
    // A truncated body: the client goes away mid-body; nothing is stored.
    let answer = raw_exchange(
        &s,
        b"POST /v1/topics/bad/produce?partition=0 HTTP/1.1\r\nHost: x\r\nX-Narad-Client: t\r\nContent-Length: 100\r\n\r\nonly-a-part",
    );
    assert_eq!(
        answer, "",
        "a truncated request must not be answered as if complete"
    );

    // Malformed API input over a healthy connection.
    let r = c.post_client("/v1/topics/bad/produce?key=%zz", b"x");
    assert_eq!(
        (r.status, r.error().as_str()),
        (400, "invalid key: invalid URL escape \"%zz\"")
    );
    let r = c.post_json(
        "/v1/topics/bad/produce/batch",
        r#"{"messages":[{"payload":1,"key":"\xff"}]"#,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let r = c.post_json(
        "/v1/topics/bad/produce/batch",
        r#"{"messages":[{"payload":1,"key_encoding":"base64","key":"!!"}]}"#,
    );
    assert_eq!(r.status, 400);
    assert!(r.error().starts_with("message 0: "), "{}", r.error());
    let r = c.post_json(
        "/v1/topics/bad/produce/batch",
        r#"{"messages":[{"payload":1,"partition":"1"}]}"#,
    );
    assert_eq!(r.status, 400);
    let r = c.post_json(
        "/v1/topics/bad/produce/batch",
        r#"{"messages":[{"payload":1,"extra":true}]}"#,
    );
    assert_eq!(r.status, 400);
    let r = c.post_json(
        "/v1/topics/bad/produce/batch",
        r#"{"messages":[{"payload":1}]} trailing"#,
    );
    assert_eq!(r.status, 400);
    let r = c.post_json("/v1/topics", r#"{"name":7}"#);
    assert_eq!(r.status, 400);
    assert!(r.error().starts_with("invalid json: "), "{}", r.error());
    let r = c.post_json("/v1/topics", r#"{"name":"x","partitions":"3"}"#);
    assert_eq!(r.status, 400);
    for h in [
        "",
        "1:2",
        "1:2:3:4",
        "a:b:c",
        "-1:0:5",
        "0:0:0",
        "0:99999999999999999999:1",
        "0:%201:2",
        "0:1:%2B2",
    ] {
        let r = c.post_client(&format!("/v1/topics/bad/ack?receipt_handle={h}"), b"");
        if h.is_empty() {
            assert_eq!(
                (r.status, r.error().as_str()),
                (400, "receipt_handle required")
            );
        } else {
            assert_eq!(
                (r.status, r.error().as_str()),
                (400, "receipt handle is malformed"),
                "{h}"
            );
        }
    }
    let r = c.post_json("/v1/topics/bad/ack", r#"{"receipt_handles":"nope"}"#);
    assert_eq!(r.status, 400);
    assert_eq!(c.get("/v1/topics/bad/consume?max=abc").status, 400);
    assert_eq!(c.get("/v1/topics/bad/consume?partition=zz").status, 400);

    // Still serving, and everything accepted before is there.
    let mut c2 = Client::connect(s.addr()).unwrap();
    let mut got = Vec::new();
    for _ in 0..10 {
        let r = c2.request(
            "GET",
            "/v1/topics/bad/consume?max=100",
            &[("X-Narad-Client", "t")],
            b"",
        );
        if r.status == 204 {
            break;
        }
        for m in r.json()["messages"].as_array().unwrap() {
            got.push(m["payload"].as_str().unwrap().to_string());
        }
    }
    got.sort();
    let mut want: Vec<String> = (0..20).map(|i| format!("msg-{i}")).collect();
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn oversized_json_bodies_answer_by_route_family() {
    // Proves the body-cap answers of API.md §4: attach-child, like the user routes, decodes while
    // reading, so a body over 1 MiB is `400 invalid json: http: request body too large` (whether
    // the size is seen from Content-Length or only while reading a chunked body); topic create
    // keeps `413 request body too large`; and a 1 MiB attach body is not refused for its size.
    let dir = TempDir::new("bigjson");
    let s = Server::start(&dir);
    let mut c = s.client();
    c.create_topic("bw", 3);
    let big = format!(r#"{{"child":"x{}"}}"#, "a".repeat(1 << 20));
    for path in ["/v1/topics/bw/children", "/v1/users"] {
        let r = c.post_json(path, &big);
        assert_eq!(
            (r.status, r.error().as_str()),
            (400, "invalid json: http: request body too large"),
            "{path}"
        );
        c.reconnect();
    }
    let chunked = {
        let mut v = b"POST /v1/topics/bw/children HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        v.extend_from_slice(format!("{:x}\r\n", big.len()).as_bytes());
        v.extend_from_slice(big.as_bytes());
        v.extend_from_slice(b"\r\n0\r\n\r\n");
        v
    };
    let answer = raw_exchange(&s, &chunked);
    assert_eq!(status_of(&answer), 400, "{answer}");
    assert!(
        answer.ends_with("{\"error\":\"invalid json: http: request body too large\"}\n"),
        "{answer}"
    );
    let r = c.post_json("/v1/topics", &big.replace("child", "name"));
    assert_eq!(
        (r.status, r.error().as_str()),
        (413, "request body too large")
    );
    c.reconnect();
    // Exactly 1 MiB is within the cap: the attach is judged on its content (no such child).
    let fits = format!(r#"{{"child":"{}"}}"#, "a".repeat((1 << 20) - 12));
    assert_eq!(fits.len(), 1 << 20);
    let r = c.post_json("/v1/topics/bw/children", &fits);
    assert_eq!((r.status, r.error().as_str()), (404, "topic not found"));
}

#[test]
fn object_bodies_refuse_arrays_and_other_non_objects() {
    // Proves API.md §1.2/§6.1: a route whose body is a JSON object refuses an array (which
    // serde would otherwise read field by field, creating a topic from `["name",null,...]`),
    // a string or a number with `400 invalid json: json: cannot unmarshal <kind> into Go value
    // of type ...`, naming no Rust type; nothing is created; and `null` reads as an empty
    // object, as in the Go original (PATCH then asks for a field).
    let dir = TempDir::new("nonobject");
    let s = Server::start(&dir);
    let mut c = s.client();
    c.create_topic("p", 3);
    let array = r#"["arrtopic",null,null,null,null,null,null,null,null,null]"#;
    for (path, body, want) in [
        (
            "/v1/topics",
            array,
            "json: cannot unmarshal array into Go value of type createTopicRequest",
        ),
        (
            "/v1/topics",
            "[]",
            "json: cannot unmarshal array into Go value of type createTopicRequest",
        ),
        (
            "/v1/topics",
            r#""arrtopic""#,
            "json: cannot unmarshal string into Go value of type createTopicRequest",
        ),
        (
            "/v1/topics",
            "7",
            "json: cannot unmarshal number 7 into Go value of type createTopicRequest",
        ),
        (
            "/v1/topics/p/children",
            r#"["arrtopic"]"#,
            "json: cannot unmarshal array into Go value of type attachChildRequest",
        ),
    ] {
        let r = c.post_json(path, body);
        assert_eq!(
            (r.status, r.error()),
            (400, format!("invalid json: {want}")),
            "{path} {body}"
        );
    }
    let r = c.request(
        "PATCH",
        "/v1/topics/p",
        &[("Content-Type", "application/json")],
        b"[3]",
    );
    assert_eq!(
        (r.status, r.error()),
        (
            400,
            "invalid json: json: cannot unmarshal array into Go value of type alterTopicRequest"
                .to_string()
        )
    );
    let r = c.request(
        "PATCH",
        "/v1/topics/p",
        &[("Content-Type", "application/json")],
        b"null",
    );
    assert_eq!(
        (r.status, r.error().as_str()),
        (
            400,
            "at least one of partitions, retention_ms, max_*_per_partition, or schema is required"
        )
    );
    let r = c.post_json("/v1/topics", "null");
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(!r.error().contains("Body"), "{}", r.error());
    assert_eq!(c.get("/v1/topics/arrtopic").status, 404);
}

#[test]
fn head_refusals_carry_no_body_and_probes_ignore_a_small_body() {
    // Proves API.md §1.1 for HEAD (headers only, also when the request is refused after its
    // headers: 413 over a Content-Length or a chunked body, 400 for broken chunk framing), and
    // that /healthz, /readyz and /metrics ignore a small body as Go's handlers do: answered 200
    // with the connection kept, so a request pipelined behind it is answered too (before, 413
    // and the pipelined request was lost).
    let dir = TempDir::new("headbody");
    let s = Server::start(&dir);
    let head_refusals: [(&[u8], u16); 3] = [
        (
            b"HEAD /v1/topics HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n",
            413,
        ),
        (
            b"HEAD /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n20000\r\n",
            413,
        ),
        (
            b"HEAD /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            400,
        ),
    ];
    for (req, want) in head_refusals {
        let mut body = vec![b'a'; if want == 413 { 70_000 } else { 0 }];
        let mut bytes = req.to_vec();
        bytes.append(&mut body);
        let answer = raw_exchange(&s, &bytes);
        assert_eq!(status_of(&answer), want, "{answer}");
        let (_, after_head) = answer.split_once("\r\n\r\n").expect("a whole head");
        assert_eq!(after_head, "", "a HEAD answer with a body: {answer}");
    }
    for path in ["/healthz", "/readyz", "/metrics"] {
        let two = format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        );
        let answer = raw_exchange(&s, two.as_bytes());
        assert_eq!(status_of(&answer), 200, "{path}: {answer}");
        assert_eq!(
            answer.matches("HTTP/1.1 200").count(),
            2,
            "{path}: both answered: {answer}"
        );
    }
}

#[test]
fn escaped_slash_in_a_topic_segment_is_a_missing_topic_not_a_missing_route() {
    // Proves that a `%2F` inside the topic segment of a path stays in that segment, as in Go's
    // ServeMux (split the escaped path, then unescape each segment): the route is found and the
    // name `a/b` is answered like any other unknown topic, `404 {"error":"topic not found"}` in
    // JSON (API.md §1.3), not the router's plain-text `404 page not found`, which clients read
    // as "this server does not offer the route"; a `%FF` likewise. An invalid escape (`%ZZ`) is
    // Go's plain-text `400 Bad Request`. Nothing reaches the topics `a` or `b`.
    let dir = TempDir::new("escslash");
    let s = Server::start(&dir);
    let mut c = s.client();
    c.create_topic("a", 3);
    c.create_topic("b", 3);
    let requests: [&[u8]; 4] = [
        b"POST /v1/topics/a%2Fb/produce HTTP/1.1\r\nHost: x\r\nX-Narad-Client: t\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
        b"POST /v1/topics/a%2fb/produce/batch HTTP/1.1\r\nHost: x\r\nX-Narad-Client: t\r\nContent-Type: application/json\r\nContent-Length: 28\r\nConnection: close\r\n\r\n{\"messages\":[{\"payload\":1}]}",
        b"GET /v1/topics/a%2Fb HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"DELETE /v1/topics/a%2Fb HTTP/1.1\r\nHost: x\r\nX-Narad-Client: t\r\nConnection: close\r\n\r\n",
    ];
    for req in requests {
        let answer = raw_exchange(&s, req);
        let (head, body) = answer.split_once("\r\n\r\n").expect("a whole head");
        assert_eq!(status_of(head), 404, "{answer}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: application/json"),
            "{answer}"
        );
        assert_eq!(body, "{\"error\":\"topic not found\"}\n", "{answer}");
    }
    // A byte that is not UTF-8 names no topic either (Go keeps it in the name): the same JSON 404.
    let answer = raw_exchange(
        &s,
        b"POST /v1/topics/a%FFb/produce HTTP/1.1\r\nHost: x\r\nX-Narad-Client: t\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
    );
    assert_eq!(status_of(&answer), 404, "{answer}");
    assert!(
        answer.ends_with("{\"error\":\"topic not found\"}\n"),
        "{answer}"
    );
    // An escape that is not one (`%ZZ`, `%4` at the end) makes the request target unparsable:
    // `400 Bad Request` in plain text and the connection closed, as Go's server answers it.
    for req in [
        &b"POST /v1/topics/a%ZZb/produce HTTP/1.1\r\nHost: x\r\nX-Narad-Client: t\r\nContent-Length: 2\r\n\r\nhi"[..],
        b"GET /v1/topics/a%4 HTTP/1.1\r\nHost: x\r\n\r\n",
    ] {
        let answer = raw_exchange(&s, req);
        let (head, body) = answer.split_once("\r\n\r\n").expect("a whole head");
        assert_eq!(status_of(head), 400, "{answer}");
        assert!(head.to_ascii_lowercase().contains("connection: close"), "{answer}");
        assert_eq!(body, "400 Bad Request", "{answer}");
    }
    for t in ["a", "b"] {
        assert_eq!(c.stored(t), 0, "{t}");
    }
}
