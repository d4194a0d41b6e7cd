//! Black-box tests of batch produce bodies (API.md §4, §10.2): `Content-Encoding: zstd`/`gzip`
//! decoded under the 16 MiB cap, other encodings 415, damaged streams 400, and the node budget
//! for bodies over 1 MiB (503 + `Retry-After: 1`). Each test states what it proves.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{Server, TempDir};

fn batch_json(n: usize, tag: &str) -> String {
    let msgs: Vec<String> = (0..n)
        .map(|i| format!(r#"{{"payload":{{"tag":"{tag}","i":{i}}}}}"#))
        .collect();
    format!(r#"{{"messages":[{}]}}"#, msgs.join(","))
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// Consumes everything on the topic (batch consume + ack) and returns the payloads seen.
fn drain(c: &mut common::Client, topic: &str) -> Vec<serde_json::Value> {
    let mut seen = Vec::new();
    for _ in 0..200 {
        let r = c.request(
            "GET",
            &format!("/v1/topics/{topic}/consume?max=100&wait=200ms"),
            &[("X-Narad-Client", "test")],
            b"",
        );
        if r.status == 204 {
            break;
        }
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        let mut handles = Vec::new();
        for m in v["messages"].as_array().unwrap() {
            seen.push(m["payload"].clone());
            handles.push(m["receipt_handle"].clone());
        }
        let body = serde_json::json!({ "receipt_handles": handles }).to_string();
        let a = c.post_json(&format!("/v1/topics/{topic}/ack"), &body);
        assert_eq!(a.status, 200, "{}", a.text());
    }
    seen
}

#[test]
fn compressed_batches_are_decoded_and_bad_encodings_refused() {
    // Proves: a zstd batch and a gzip batch are stored message for message (202 {"accepted":N},
    // then consumed back with the same payloads); an unknown Content-Encoding is 415, a damaged
    // stream 400, a body that decodes past 16 MiB 413; nothing of a refused batch is stored.
    let dir = TempDir::new("batch-enc");
    let s = Server::start(&dir);
    let mut c = s.client();
    c.create_topic("enc", 3);
    let path = "/v1/topics/enc/produce/batch";
    let json = [("Content-Type", "application/json")];

    let z = zstd::bulk::compress(batch_json(300, "z").as_bytes(), 3).unwrap();
    let r = c.request("POST", path, &[json[0], ("Content-Encoding", "zstd")], &z);
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(r.json()["accepted"], 300);

    let g = gzip(batch_json(200, "g").as_bytes());
    let r = c.request("POST", path, &[json[0], ("Content-Encoding", "GZIP")], &g);
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(r.json()["accepted"], 200);

    // Refusals: none of these may store anything.
    let r = c.request("POST", path, &[json[0], ("Content-Encoding", "br")], &g);
    assert_eq!(r.status, 415, "{}", r.text());
    assert!(r.error().contains("Content-Encoding"), "{}", r.text());
    let r = c.request(
        "POST",
        path,
        &[json[0], ("Content-Encoding", "gzip")],
        &g[..g.len() / 2],
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.error().starts_with("invalid compressed body"),
        "{}",
        r.text()
    );
    // 17 MiB of one JSON string payload, compressed to a few KiB: over the cap once decoded.
    let big = format!(
        r#"{{"messages":[{{"payload":"{}"}}]}}"#,
        "a".repeat(17 << 20)
    );
    let bomb = zstd::bulk::compress(big.as_bytes(), 3).unwrap();
    assert!(bomb.len() < 1 << 20);
    let r = c.request(
        "POST",
        path,
        &[json[0], ("Content-Encoding", "zstd")],
        &bomb,
    );
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(r.error(), "request body too large");

    let mut c = s.client();
    let seen = drain(&mut c, "enc");
    let z = seen.iter().filter(|p| p["tag"] == "z").count();
    let g = seen.iter().filter(|p| p["tag"] == "g").count();
    assert_eq!((z, g, seen.len()), (300, 200, 500), "{seen:?}");
}

/// Sends a batch-produce head declaring `len` body bytes with `Expect: 100-continue` and returns
/// the status line's code of the first answer (100 when the body may be sent).
fn head_only(port: u16, len: usize) -> (TcpStream, BufReader<TcpStream>, u16, String) {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut w = s.try_clone().unwrap();
    write!(
        w,
        "POST /v1/topics/budget/produce/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len}\r\nExpect: 100-continue\r\n\r\n"
    )
    .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    let code: u16 = status.split_whitespace().nth(1).unwrap().parse().unwrap();
    // Read the rest of the head (and the error body of a refusal).
    let mut rest = String::new();
    loop {
        let mut l = String::new();
        if r.read_line(&mut l).unwrap() == 0 || l == "\r\n" {
            break;
        }
        rest.push_str(&l);
    }
    (w, r, code, rest)
}

/// A broker whose node batch-body budget is `bytes`.
fn budget_server(dir: &TempDir, bytes: u64) -> Server {
    Server::start_with(
        dir.0.clone(),
        vec![(
            "NARAD_HTTP_MAX_BATCH_BODY_BYTES_IN_FLIGHT".into(),
            bytes.to_string(),
        )],
    )
}

#[test]
fn large_batch_bodies_share_a_node_budget() {
    // Proves: bodies over 1 MiB take their declared size from one node-wide budget before they
    // are read, whatever shard their connection lands on: with 24 MiB, two 10 MiB heads are
    // admitted and the next two refused at once with 503 and `Retry-After: 1` (each refusal
    // counted in narad_http_batch_body_budget_rejections_total); small bodies still pass; the
    // bytes come back when bodies finish.
    let dir = TempDir::new("batch-budget");
    let s = budget_server(&dir, 24 << 20);
    let mut c = s.client();
    c.create_topic("budget", 3);
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..4 {
        let (w, r, code, rest) = head_only(s.port, 10 << 20);
        match code {
            100 => held.push((w, r)),
            503 => {
                refused += 1;
                assert!(
                    rest.to_ascii_lowercase().contains("retry-after: 1"),
                    "{rest}"
                );
            }
            other => panic!("unexpected {other}: {rest}"),
        }
    }
    assert_eq!((held.len(), refused), (2, 2), "the node budget holds two");
    let counted = c
        .get("/metrics")
        .text()
        .lines()
        .find_map(|l| l.strip_prefix("narad_http_batch_body_budget_rejections_total "))
        .map(|v| v.trim().parse::<u64>().expect("counter"));
    assert_eq!(counted, Some(refused), "each refusal counted");
    // Small bodies never touch the budget.
    let r = c.post_json("/v1/topics/budget/produce/batch", &batch_json(10, "s"));
    assert_eq!(r.status, 202, "{}", r.text());
    // Finish the held bodies (10 MiB of blanks: not JSON, so 400); the budget is returned.
    let body = vec![b' '; 10 << 20];
    for (mut w, mut r) in held {
        w.write_all(&body).unwrap();
        let mut status = String::new();
        r.read_line(&mut status).unwrap();
        assert!(status.contains(" 400 "), "{status}");
    }
    // Whole again: two large heads are admitted together (retried briefly, since a closed
    // connection's release reaches the server asynchronously).
    let mut admitted = Vec::new();
    for _ in 0..100 {
        let (w, r, code, rest) = head_only(s.port, 10 << 20);
        match code {
            100 => admitted.push((w, r)),
            503 => std::thread::sleep(Duration::from_millis(20)),
            other => panic!("unexpected {other}: {rest}"),
        }
        if admitted.len() == 2 {
            break;
        }
    }
    assert_eq!(admitted.len(), 2);
}

#[test]
fn large_valid_batches_are_stored_whole() {
    // Proves: batches well over 4 MiB (the WAL's batching size) but within the 16 MiB cap are
    // accepted and stored whole: 1000 messages of 7000 bytes spread over 3 partitions (7 MB), and
    // 16 messages of 1 MB pinned to one partition (16 MB, one shard's single append, just under the
    // cap). Both were answered 500, with part of the first stored, before the WAL took appends
    // over one batch.
    let dir = TempDir::new("batch-large");
    let s = Server::start(&dir);
    let mut c = s.client();
    c.create_topic("spread", 3);
    c.create_topic("pinned", 3);

    let p7000 = "a".repeat(7000);
    let msgs: Vec<String> = (0..1000)
        .map(|i| format!(r#"{{"payload":"{i:04}{p7000}"}}"#))
        .collect();
    let body = format!(r#"{{"messages":[{}]}}"#, msgs.join(","));
    assert!(body.len() > 7_000_000);
    let r = c.post_json("/v1/topics/spread/produce/batch", &body);
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(r.json()["accepted"], 1000);
    assert_eq!(c.stored("spread"), 1000);

    let big = "b".repeat(999_990);
    let msgs: Vec<String> = (0..16)
        .map(|i| format!(r#"{{"payload":"{i}{big}","partition":0}}"#))
        .collect();
    let body = format!(r#"{{"messages":[{}]}}"#, msgs.join(","));
    assert!(body.len() > 16_000_000 && body.len() <= 16 << 20);
    let r = c.post_json("/v1/topics/pinned/produce/batch", &body);
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(c.stored("pinned"), 16);
    let r = c.get("/v1/topics/pinned/consume?partition=0&offset=15");
    assert_eq!(r.status, 200, "{}", r.text());
    let payload = r.json()["payload"]
        .as_str()
        .expect("text payload")
        .to_string();
    assert_eq!(payload.len(), 999_992);
    assert!(payload.starts_with("15b"));
}

#[test]
fn a_body_larger_than_the_whole_budget_is_refused() {
    // Proves the node budget is the configured size, with no per-shard floor: with 2 MiB, a
    // 3 MiB batch body is refused at once (503, Retry-After: 1), and a 1.5 MiB one is admitted.
    let dir = TempDir::new("batch-budget-small");
    let s = budget_server(&dir, 2 << 20);
    s.client().create_topic("budget", 3);
    let (_w, _r, code, rest) = head_only(s.port, 3 << 20);
    assert_eq!(code, 503, "{rest}");
    assert!(
        rest.to_ascii_lowercase().contains("retry-after: 1"),
        "{rest}"
    );
    let (_w, _r, code, rest) = head_only(s.port, 3 << 19);
    assert_eq!(code, 100, "{rest}");
}

/// Sends `body` as a chunked batch produce (64 KiB chunks, the rest of the body written by a
/// thread so a refusal mid-body can be read) and returns the answer's status code.
fn chunked_status(port: u16, body: Vec<u8>) -> u16 {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = write!(
            w,
            "POST /v1/topics/budget/produce/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
        for c in body.chunks(64 << 10) {
            if write!(w, "{:x}\r\n", c.len()).is_err()
                || w.write_all(c).is_err()
                || w.write_all(b"\r\n").is_err()
            {
                return;
            }
        }
        let _ = w.write_all(b"0\r\n\r\n");
    });
    let mut r = BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    drop(r);
    let _ = writer.join();
    status.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn chunked_batch_bodies_take_the_budget_only_past_1_mib() {
    // Proves API.md §10.2 "bodies over 1 MiB take a share" for chunked bodies, whose size shows
    // only as they arrive: with 24 MiB of budget and two 10 MiB heads holding 20, a small chunked
    // batch is still accepted (it used to be charged the 16 MiB route cap up front and refused
    // 503, audit s21 limits L2); one that grows past 1 MiB takes the cap then and, with 4 MiB
    // left, is refused mid-body (503); once the heads are gone a 2 MB chunked batch is stored.
    let dir = TempDir::new("batch-budget-chunked");
    let s = budget_server(&dir, 24 << 20);
    let mut c = s.client();
    c.create_topic("budget", 3);
    let held: Vec<_> = (0..2)
        .map(|_| {
            let (w, r, code, rest) = head_only(s.port, 10 << 20);
            assert_eq!(code, 100, "{rest}");
            (w, r)
        })
        .collect();
    assert_eq!(
        chunked_status(s.port, batch_json(3, "small").into_bytes()),
        202
    );
    let p = "x".repeat(2000);
    let msgs: Vec<String> = (0..1000)
        .map(|i| format!(r#"{{"payload":"{i}{p}"}}"#))
        .collect();
    let big = format!(r#"{{"messages":[{}]}}"#, msgs.join(",")).into_bytes();
    assert!(big.len() > 3 << 19);
    assert_eq!(chunked_status(s.port, big.clone()), 503);
    drop(held);
    // The heads' connections closed: their bytes come back (asynchronously; retried briefly).
    let mut status = 0;
    for _ in 0..100 {
        status = chunked_status(s.port, big.clone());
        if status != 503 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(status, 202);
    assert_eq!(c.stored("budget"), 3 + 1000);
}
