//! Black-box tests of the `narad` CLI (OPERATIONS.md §1): the real binary run as a user would,
//! against a real broker started on a loopback port (or a one-shot fake server where the test is
//! about the request the CLI sends). Each test states what it proves.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{narad_env, narad_raw, no_config_dir, Out, Server, TempDir};

fn narad(s: &Server, args: &[&str], stdin: &[u8]) -> Out {
    narad_env(&format!("http://127.0.0.1:{}", s.port), args, stdin, &[])
}

fn ok(o: Out) -> Out {
    assert_eq!(o.code, 0, "stdout: {}\nstderr: {}", o.stdout, o.stderr);
    o
}

fn json(o: &Out) -> serde_json::Value {
    serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", o.stdout))
}

fn server(tag: &str) -> (TempDir, Server) {
    let dir = TempDir::new(tag);
    let s = Server::start(&dir);
    (dir, s)
}

#[test]
fn topic_add_ls_info_edit_rm() {
    // Proves topic add sends every flag (durations in ms, `forever` = 0), ls prints the
    // NAME/PARTITIONS/RETENTION/ROLE table and JSON, info prints the described topic, edit
    // changes retention and partitions, rm asks and only deletes on yes or -f, and refusals exit 1.
    let (_d, s) = server("cli-topic");
    let t = json(&ok(narad(
        &s,
        &[
            "topic",
            "add",
            "orders",
            "--partitions",
            "4",
            "--retention",
            "2h",
            "--visibility",
            "10s",
            "--max-in-flight",
            "500",
            "--max-acked-ahead",
            "600",
        ],
        b"",
    )));
    assert_eq!(t["name"], "orders");
    assert_eq!(t["partitions"], 4);
    assert_eq!(t["retention_ms"], 7_200_000);
    assert_eq!(t["visibility_timeout_ms"], 10_000);
    assert_eq!(t["max_in_flight_per_partition"], 500);
    assert_eq!(t["max_acked_ahead_per_partition"], 600);
    let again = narad(&s, &["topic", "add", "orders"], b"");
    assert_eq!(again.code, 1);
    assert!(
        again.stderr.contains("topic already exists"),
        "{}",
        again.stderr
    );
    ok(narad(
        &s,
        &["topics", "add", "audit", "--retention", "forever"],
        b"",
    ));
    let bad = narad(&s, &["topic", "add", "x", "--retention", "soon"], b"");
    assert_eq!(bad.code, 2, "{}", bad.stderr);

    let ls = ok(narad(&s, &["topic", "ls"], b""));
    let rows: Vec<Vec<&str>> = ls
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows,
        vec![
            vec!["NAME", "PARTITIONS", "RETENTION", "ROLE"],
            vec!["audit", "3", "forever", "standalone"],
            vec!["orders", "4", "2h", "standalone"],
        ]
    );
    let list = json(&ok(narad(&s, &["topic", "ls", "--json"], b"")));
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["audit", "orders"]);

    let info = json(&ok(narad(&s, &["topic", "info", "orders"], b"")));
    assert_eq!(info["partition_stats"].as_array().unwrap().len(), 4);

    let edited = json(&ok(narad(
        &s,
        &[
            "topic",
            "edit",
            "orders",
            "--retention",
            "0",
            "--partitions",
            "6",
        ],
        b"",
    )));
    assert_eq!(
        (
            edited["retention_ms"].as_u64(),
            edited["partitions"].as_u64()
        ),
        (Some(0), Some(6))
    );
    let none = narad(&s, &["topic", "edit", "orders"], b"");
    assert_eq!(none.code, 2, "{}", none.stderr);

    let declined = narad(&s, &["topic", "rm", "orders"], b"n\n");
    assert_eq!(declined.code, 1);
    assert!(declined
        .stderr
        .contains("delete topic \"orders\" and all its data? [y/N]"));
    ok(narad(&s, &["topic", "info", "orders"], b""));
    ok(narad(&s, &["topic", "rm", "orders"], b"y\n"));
    ok(narad(&s, &["topic", "rm", "-f", "audit"], b""));
    let gone = narad(&s, &["topic", "info", "orders"], b"");
    assert_eq!(gone.code, 1);
    assert!(gone.stderr.contains("topic not found"), "{}", gone.stderr);
    assert_eq!(s.client().get("/v1/topics/audit").status, 404);
    let empty = ok(narad(&s, &["topic", "ls"], b""));
    assert_eq!(empty.stdout, "NAME  PARTITIONS  RETENTION  ROLE\n");
}

#[test]
fn pub_single_and_100000_lines_then_sub_acks_each_exactly_once() {
    // Proves a single pub (key honoured, `accepted (<n> bytes)`), the sub output line, pub of
    // 100,000 stdin lines in batches of 100 (text and JSON lines), and sub --count 100000 --raw
    // returning every line exactly once and acking them all: a second sub finds nothing.
    let (_d, s) = server("cli-pubsub");
    s.client().create_topic("events", 3);
    let one = ok(narad(
        &s,
        &["pub", "events", "hello world", "-k", "user-1"],
        b"",
    ));
    assert_eq!(one.stderr.trim(), "accepted (11 bytes)");
    let got = ok(narad(&s, &["sub", "events", "--count", "1"], b""));
    let line = got.stdout.trim_end();
    assert!(
        line.starts_with("[p")
            && line.contains(" @0] key=user-1 20")
            && line.ends_with("Z hello world"),
        "{line}"
    );
    assert!(
        got.stderr.contains("1 message(s) received, 1 acked"),
        "{}",
        got.stderr
    );

    let mut input = String::new();
    let mut want = Vec::new();
    for i in 0..100_000 {
        let l = if i % 10 == 0 {
            format!("{{\"i\":{i}}}")
        } else {
            format!("line {i} ✓")
        };
        input.push_str(&l);
        input.push('\n');
        want.push(l);
    }
    let start = Instant::now();
    let p = ok(narad(&s, &["pub", "events", "--lines"], input.as_bytes()));
    assert!(
        p.stderr
            .contains(" bytes): 100000 message(s) in 1000 batch(es)"),
        "{}",
        p.stderr
    );
    let pub_ms = start.elapsed().as_millis();
    let start = Instant::now();
    let sub = ok(narad(
        &s,
        &["sub", "events", "--count", "100000", "--raw"],
        b"",
    ));
    let sub_ms = start.elapsed().as_millis();
    eprintln!("pub 100000 lines: {pub_ms} ms; sub+ack 100000: {sub_ms} ms");
    assert!(
        sub.stderr
            .contains("100000 message(s) received, 100000 acked"),
        "{}",
        sub.stderr
    );
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    for l in sub.stdout.lines() {
        *seen.entry(l).or_default() += 1;
    }
    let dup: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(dup.is_empty(), "delivered more than once: {dup:?}");
    let mut got: Vec<&str> = seen.keys().copied().collect();
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(got, want);

    let again = ok(narad(&s, &["sub", "events", "--wait", "1s"], b""));
    assert_eq!(again.stdout, "");
    assert!(
        again.stderr.contains("0 message(s) received"),
        "{}",
        again.stderr
    );
}

#[test]
fn replay_prints_the_range_and_a_summary() {
    // Proves pub --file --lines --partition pins every line, replay prints `[p<P> @<offset>]` lines from
    // the oldest offset to the end, `--from/--to` bound the range, and the summary line; replay
    // leaves the messages for queue consumers.
    let (d, s) = server("cli-replay");
    s.client().create_topic("logs", 3);
    let file = d.0.join("lines.txt");
    std::fs::write(&file, "a\nb\n{\"c\":3}\nd\ne\n").unwrap();
    let p = ok(narad(
        &s,
        &[
            "pub",
            "logs",
            "--file",
            file.to_str().unwrap(),
            "--partition",
            "1",
            "--lines",
        ],
        b"",
    ));
    assert!(
        p.stderr
            .contains("accepted (11 bytes): 5 message(s) in 1 batch(es)"),
        "{}",
        p.stderr
    );
    let all = ok(narad(&s, &["replay", "logs", "--partition", "1"], b""));
    let lines: Vec<&str> = all.stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{}", all.stdout);
    for (i, l) in lines.iter().enumerate() {
        assert!(l.starts_with(&format!("[p1 @{i}] key=- ")), "{l}");
    }
    assert!(lines[2].ends_with(" {\"c\":3}"));
    assert_eq!(all.stderr.trim(), "5 message(s) replayed from p1 [0, 5)");
    let part = ok(narad(
        &s,
        &[
            "replay",
            "logs",
            "--partition",
            "1",
            "--from",
            "1",
            "--to",
            "3",
            "--raw",
        ],
        b"",
    ));
    assert_eq!(part.stdout, "b\n{\"c\":3}\n");
    assert_eq!(part.stderr.trim(), "2 message(s) replayed from p1 [1, 3)");
    let backwards = narad(
        &s,
        &[
            "replay",
            "logs",
            "--partition",
            "1",
            "--from",
            "3",
            "--to",
            "1",
        ],
        b"",
    );
    assert_eq!(backwards.code, 2, "{}", backwards.stderr);
    assert!(
        backwards.stderr.contains("--to (1) is before --from (3)"),
        "{}",
        backwards.stderr
    );
    let empty = ok(narad(&s, &["replay", "logs", "--partition", "0"], b""));
    assert_eq!(
        (empty.stdout.as_str(), empty.stderr.trim()),
        ("", "0 message(s) replayed from p0 [0, 0)")
    );
    let q = ok(narad(&s, &["sub", "logs", "--count", "5", "--raw"], b""));
    assert_eq!(q.stdout, "a\nb\n{\"c\":3}\nd\ne\n");
}

#[test]
fn exit_codes() {
    // Proves 1 for a server refusal (missing topic, with the server's error text), 2 for an
    // unreachable server, a bad URL and bad flags, 0 for success.
    let (_d, s) = server("cli-exit");
    for args in [
        &["pub", "nope", "x"][..],
        &["sub", "nope", "--count", "1"],
        &["replay", "nope", "--partition", "0"],
        &["topic", "info", "nope"],
        &["topic", "rm", "-f", "nope"],
    ] {
        let o = narad(&s, args, b"");
        assert_eq!(o.code, 1, "{args:?}: {}", o.stderr);
        assert!(
            o.stderr.contains("topic not found"),
            "{args:?}: {}",
            o.stderr
        );
    }
    let o = narad(&s, &["pub", "nope"], b"x\n");
    assert_eq!(o.code, 1, "{}", o.stderr);

    // A port nothing listens on.
    let dead = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let o = narad_env(&url, &["topic", "ls"], b"", &[]);
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("cannot connect"), "{}", o.stderr);
    let o = narad_env("https://127.0.0.1:1", &["topic", "ls"], b"", &[]);
    assert_eq!(o.code, 2);
    let o = narad(&s, &["topic", "add"], b"");
    assert_eq!(o.code, 2);
    let o = narad(&s, &["pub", "t", "--partition", "-1", "x"], b"");
    assert_eq!(o.code, 2);
}

/// A one-shot fake broker: answers `bodies` in order (200, JSON), on as many connections as the
/// client opens, and returns the request heads it saw.
fn fake_server(bodies: Vec<String>) -> (String, std::thread::JoinHandle<Vec<String>>) {
    let (url, h) = fake_server_full(bodies.into_iter().map(|b| (200, b)).collect());
    let heads = std::thread::spawn(move || {
        h.join()
            .unwrap()
            .into_iter()
            .map(|(head, _)| head)
            .collect()
    });
    (url, heads)
}

/// A fake broker answering `(status, body)` in order (JSON bodies; a body starting with `404
/// page` is sent as plain text), returning each request's head and body.
fn fake_server_full(
    answers: Vec<(u16, String)>,
) -> (String, std::thread::JoinHandle<Vec<(String, String)>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let h = std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut answers: std::collections::VecDeque<(u16, String)> = answers.into();
        'conns: while !answers.is_empty() {
            let (mut c, _) = l.accept().unwrap();
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            loop {
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match c.read(&mut b) {
                        Ok(1) => head.push(b[0]),
                        _ => continue 'conns,
                    }
                }
                let head = String::from_utf8(head).unwrap();
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse().unwrap())
                    })
                    .unwrap_or(0);
                let mut body = vec![0; len];
                c.read_exact(&mut body).unwrap();
                seen.push((head, String::from_utf8(body).unwrap()));
                let Some((status, body)) = answers.pop_front() else {
                    break 'conns;
                };
                let ct = if body.starts_with("404 page") {
                    "text/plain; charset=utf-8"
                } else {
                    "application/json"
                };
                let resp = format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: {ct}\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                c.write_all(resp.as_bytes()).unwrap();
                if answers.is_empty() {
                    break 'conns;
                }
            }
        }
        seen
    });
    (url, h)
}

#[test]
fn sends_client_header_and_basic_auth_from_flags_and_env() {
    // Proves every request carries `X-Narad-Client: narad-cli/<version>`, `-u/-p` and
    // NARAD_USER/NARAD_PASS become HTTP Basic auth, and NARAD_ADDR is used when -s is absent.
    let empty = r#"{"topics":[],"next_page_token":""}"#.to_string();
    let (url, server) = fake_server(vec![empty.clone()]);
    ok(narad_env(
        &url,
        &["-u", "alice", "-p", "secret", "topic", "ls"],
        b"",
        &[],
    ));
    let mut heads = server.join().unwrap();
    // Without -s: NARAD_ADDR; credentials from the environment.
    let (url, server) = fake_server(vec![empty]);
    let st = Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(["topic", "ls"])
        .env("NARAD_ADDR", &url)
        .env("NARAD_USER", "bob")
        .env("NARAD_PASS", "pw")
        .env("NARAD_CONFIG_DIR", no_config_dir())
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    heads.extend(server.join().unwrap());
    let version = env!("CARGO_PKG_VERSION");
    for h in &heads {
        assert!(
            h.starts_with("GET /v1/topics?limit=1000 HTTP/1.1\r\n"),
            "{h}"
        );
        assert!(
            h.contains(&format!("X-Narad-Client: narad-cli/{version}\r\n")),
            "{h}"
        );
    }
    // base64("alice:secret"), base64("bob:pw")
    assert!(
        heads[0].contains("Authorization: Basic YWxpY2U6c2VjcmV0\r\n"),
        "{}",
        heads[0]
    );
    assert!(
        heads[1].contains("Authorization: Basic Ym9iOnB3\r\n"),
        "{}",
        heads[1]
    );
}

#[test]
fn topic_ls_follows_page_tokens_on_one_connection() {
    // Proves `topic ls` follows next_page_token until it is empty, reusing the kept-alive
    // connection, and prints `forever` for retention 0 and the role as given.
    let (url, server) = fake_server(vec![
        r#"{"topics":[{"name":"a","partitions":3,"retention_ms":0,"role":"parent"}],"next_page_token":"a"}"#.into(),
        r#"{"topics":[{"name":"b","partitions":12,"retention_ms":43200000}],"next_page_token":""}"#.into(),
    ]);
    let o = ok(narad_env(&url, &["topic", "ls"], b"", &[]));
    assert_eq!(
        o.stdout,
        "NAME  PARTITIONS  RETENTION  ROLE\na     3           forever    parent\nb     12          12h        standalone\n"
    );
    let heads = server.join().unwrap();
    assert_eq!(heads.len(), 2);
    assert!(
        heads[1].starts_with("GET /v1/topics?limit=1000&page_token=a HTTP/1.1\r\n"),
        "{}",
        heads[1]
    );
}

#[test]
fn no_ack_leases_lapse_and_peek_takes_no_leases() {
    // Proves sub --no-ack leaves messages to be redelivered after the visibility timeout, and
    // sub --peek tails new messages (and --from with --partition reads old ones) without leases:
    // a queue consumer still gets everything afterwards.
    let (_d, s) = server("cli-peek");
    let url = format!("http://127.0.0.1:{}", s.port);
    ok(narad(
        &s,
        &["topic", "add", "feed", "--visibility", "1s"],
        b"",
    ));
    ok(narad(
        &s,
        &["pub", "feed", "first", "--partition", "0"],
        b"",
    ));
    let lapsed = ok(narad(
        &s,
        &["sub", "feed", "--no-ack", "--count", "1", "--raw"],
        b"",
    ));
    assert_eq!(lapsed.stdout, "first\n");
    assert!(lapsed.stderr.contains("(not acked)"), "{}", lapsed.stderr);

    // The tail starts at the end, so it sees only what is produced after it started: keep
    // producing to a second topic until it has read one message (bounded).
    ok(narad(&s, &["topic", "add", "live"], b""));
    let tail_url = url.clone();
    let tail = std::thread::spawn(move || {
        narad_env(
            &tail_url,
            &[
                "sub", "live", "--peek", "--count", "2", "--raw", "--wait", "20s",
            ],
            b"",
            &[],
        )
    });
    ok(narad(
        &s,
        &["pub", "live", "before", "--partition", "0"],
        b"",
    ));
    for _ in 0..100 {
        if tail.is_finished() {
            break;
        }
        ok(narad(
            &s,
            &["pub", "live", "after", "--partition", "0"],
            b"",
        ));
        std::thread::sleep(Duration::from_millis(100));
    }
    let tail = ok(tail.join().unwrap());
    assert!(
        tail.stdout == "after\nafter\n" || tail.stdout == "before\nafter\n",
        "{}",
        tail.stdout
    );
    ok(narad(
        &s,
        &["pub", "feed", "--partition", "0", "--lines"],
        b"second\nthird\n",
    ));
    let old = ok(narad(
        &s,
        &[
            "sub",
            "feed",
            "--peek",
            "--partition",
            "0",
            "--from",
            "0",
            "--count",
            "3",
            "--raw",
        ],
        b"",
    ));
    assert_eq!(old.stdout, "first\nsecond\nthird\n");

    // `first` comes back once its 1 s lease lapsed; nothing was leased by the peeks.
    let all = ok(narad(
        &s,
        &["sub", "feed", "--count", "3", "--raw", "--wait", "10s"],
        b"",
    ));
    let mut lines: Vec<&str> = all.stdout.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["first", "second", "third"]);
    let bad = narad(&s, &["sub", "feed", "--from", "0"], b"");
    assert_eq!(bad.code, 2);
}

#[test]
fn pub_sends_a_file_or_stdin_whole_as_one_message() {
    // Proves OPERATIONS.md §1.3: without --lines the body of --file or stdin is one message, as
    // it is: a pretty-printed JSON document arrives as one JSON payload, a binary file with
    // newlines byte for byte, --count repeats it, and a body over 1 MiB is refused (exit 2)
    // with nothing sent.
    let (_d, s) = server("cli-body");
    let files = TempDir::new("cli-body-files");
    s.client().create_topic("docs", 3);
    let doc = "{\n  \"order\": 7,\n  \"items\": [\n    \"a\",\n    \"b\"\n  ]\n}\n";
    let file = files.0.join("order.json");
    std::fs::write(&file, doc).unwrap();
    let path = file.to_str().unwrap();
    let o = ok(narad(
        &s,
        &["pub", "docs", "-f", path, "--partition", "0"],
        b"",
    ));
    assert_eq!(o.stderr.trim(), format!("accepted ({} bytes)", doc.len()));
    let o = ok(narad(
        &s,
        &["pub", "docs", "--partition", "1"],
        doc.as_bytes(),
    ));
    assert_eq!(o.stderr.trim(), format!("accepted ({} bytes)", doc.len()));
    let want: serde_json::Value = serde_json::from_str(doc).unwrap();
    for p in ["0", "1"] {
        let r = ok(narad(
            &s,
            &["replay", "docs", "--partition", p, "--raw"],
            b"",
        ));
        assert!(r.stderr.contains("1 message(s) replayed"), "{}", r.stderr);
        let got: serde_json::Value =
            serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {}", r.stdout));
        assert_eq!(got, want, "partition {p}");
    }

    let blob = files.0.join("blob.bin");
    std::fs::write(&blob, b"\xff\x00\n\r\n\x01\n").unwrap();
    let o = ok(narad(
        &s,
        &[
            "pub",
            "docs",
            "--file",
            blob.to_str().unwrap(),
            "--partition",
            "2",
            "--count",
            "2",
        ],
        b"",
    ));
    assert_eq!(o.stderr.trim(), "accepted (14 bytes): 2 message(s)");
    let r = ok(narad(&s, &["replay", "docs", "--partition", "2"], b""));
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", r.stdout);
    for l in lines {
        assert!(l.ends_with("Z ff000a0d0a010a (7 bytes)"), "{l}");
    }

    let mut big = b"{\"x\":\"".to_vec();
    big.extend(std::iter::repeat_n(b'x', 1 << 20));
    big.extend_from_slice(b"\"}");
    let o = narad(&s, &["pub", "docs", "--partition", "0"], &big);
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(
        o.stderr.contains("longer than 1048576 bytes"),
        "{}",
        o.stderr
    );
    let r = ok(narad(
        &s,
        &["replay", "docs", "--partition", "0", "--raw"],
        b"",
    ));
    assert!(r.stderr.contains("1 message(s) replayed"), "{}", r.stderr);
    // A message and --lines contradict each other.
    assert_eq!(narad(&s, &["pub", "docs", "x", "--lines"], b"").code, 2);
}

#[test]
fn pub_count_repeats_a_message_and_limits_lines() {
    // Proves pub --count N sends the argument N times, and with lines stops after N lines.
    let (_d, s) = server("cli-count");
    s.client().create_topic("c", 3);
    let o = ok(narad(&s, &["pub", "c", "x", "--count", "5"], b""));
    assert_eq!(o.stderr.trim(), "accepted (5 bytes): 5 message(s)");
    let o = ok(narad(
        &s,
        &["pub", "c", "--lines", "--count", "3"],
        b"a\nb\nc\nd\n",
    ));
    assert!(
        o.stderr
            .contains("accepted (3 bytes): 3 message(s) in 1 batch(es)"),
        "{}",
        o.stderr
    );
    let all = ok(narad(&s, &["sub", "c", "--raw", "--wait", "1s"], b""));
    let mut lines: Vec<&str> = all.stdout.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["a", "b", "c", "x", "x", "x", "x", "x"]);
}

#[test]
fn binary_lines_print_as_hex_and_oversized_lines_are_refused() {
    // Proves a non-UTF-8 input line travels as base64 and sub prints it as hex with its byte
    // count, and a line over the 1 MiB message limit stops pub with exit 2 after sending the
    // lines before it.
    let (_d, s) = server("cli-binary");
    s.client().create_topic("bin", 3);
    ok(narad(
        &s,
        &["pub", "bin", "--partition", "2", "--lines"],
        b"\xff\x00\x01\r\n",
    ));
    let o = ok(narad(&s, &["sub", "bin", "--count", "1"], b""));
    assert!(
        o.stdout.starts_with("[p2 @0] key=- ") && o.stdout.ends_with("Z ff0001 (3 bytes)\n"),
        "{}",
        o.stdout
    );
    let mut big = b"ok\n".to_vec();
    big.extend(std::iter::repeat_n(b'x', (1 << 20) + 1));
    big.push(b'\n');
    let o = narad(&s, &["pub", "bin", "--partition", "1", "--lines"], &big);
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(
        o.stderr.contains("line 2: longer than 1048576 bytes"),
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains(": 1 message(s) in"), "{}", o.stderr);
    let o = ok(narad(
        &s,
        &["replay", "bin", "--partition", "1", "--raw"],
        b"",
    ));
    assert_eq!(o.stdout, "ok\n");
}

fn mode_0600(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777 == 0o600
}

#[test]
fn contexts_add_select_ls_rm_and_precedence() {
    // Proves ctx add/select/ls/rm keep contexts.json (mode 0600) in NARAD_CONFIG_DIR, else in
    // $XDG_CONFIG_HOME/narad or ~/.config/narad; the first context added is selected; the
    // selected context supplies server and credentials; NARAD_ADDR beats the context, -s beats
    // NARAD_ADDR, -u replaces only the user; --ctx picks another context and is refused while NARAD_USER is set.
    let dir = TempDir::new("cli-ctx");
    let cfg = dir.0.join("cfg");
    let cfg_s = cfg.display().to_string();
    let env = [("NARAD_CONFIG_DIR", cfg_s.as_str())];
    let (url_a, a) = fake_server(vec![r#"{"topics":[],"next_page_token":""}"#.into(); 1]);
    let (url_b, b) = fake_server(vec![r#"{"topics":[],"next_page_token":""}"#.into(); 2]);
    let (url_c, c) = fake_server(vec![r#"{"topics":[],"next_page_token":""}"#.into(); 1]);
    let add = ok(narad_raw(
        &[
            "ctx", "add", "prod", "--server", &url_a, "-u", "alice", "-p", "pw-a",
        ],
        b"",
        &env,
    ));
    assert!(add.stderr.contains("(selected)"), "{}", add.stderr);
    ok(narad_raw(
        &[
            "ctx",
            "add",
            "dev",
            "--server",
            &url_c,
            "-u",
            "bob",
            "--password-stdin",
        ],
        b"pw-b\n",
        &env,
    ));
    let file = cfg.join("contexts.json");
    assert!(mode_0600(&file));
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(saved["current"], "prod");
    assert_eq!(saved["contexts"]["dev"]["password"], "pw-b");
    let ls = ok(narad_raw(&["ctx", "ls"], b"", &env));
    let rows: Vec<Vec<&str>> = ls
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows,
        vec![
            vec!["CURRENT", "NAME", "SERVER", "USER"],
            vec!["dev", url_c.as_str(), "bob"],
            vec!["*", "prod", url_a.as_str(), "alice"],
        ]
    );
    assert!(
        !ls.stdout.contains("pw-"),
        "passwords printed: {}",
        ls.stdout
    );

    // Selected context: server and credentials.
    ok(narad_raw(&["topic", "ls"], b"", &env));
    // NARAD_ADDR beats the context; the context's user and password still apply.
    let env_addr = [
        ("NARAD_CONFIG_DIR", cfg_s.as_str()),
        ("NARAD_ADDR", url_b.as_str()),
    ];
    ok(narad_raw(&["topic", "ls"], b"", &env_addr));
    // -s beats NARAD_ADDR; -u beats the context's user, and the password, a field of its own,
    // still comes from the context (OPERATIONS.md §1.2: precedence per field).
    ok(narad_raw(
        &["-s", &url_b, "-u", "carol", "topic", "ls"],
        b"",
        &[
            ("NARAD_CONFIG_DIR", cfg_s.as_str()),
            ("NARAD_ADDR", "http://127.0.0.1:1"),
        ],
    ));
    // --ctx for one command.
    ok(narad_raw(&["--ctx", "dev", "topic", "ls"], b"", &env));
    let refused = narad_raw(
        &["--ctx", "dev", "topic", "ls"],
        b"",
        &[("NARAD_CONFIG_DIR", cfg_s.as_str()), ("NARAD_USER", "x")],
    );
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(refused.stderr.contains("NARAD_USER"), "{}", refused.stderr);
    let unknown = narad_raw(&["--ctx", "nope", "topic", "ls"], b"", &env);
    assert_eq!(unknown.code, 2);

    let auth = |h: &str| {
        h.lines()
            .find_map(|l| l.strip_prefix("Authorization: "))
            .map(str::to_string)
    };
    let a = a.join().unwrap();
    let b = b.join().unwrap();
    let c = c.join().unwrap();
    // base64 of alice:pw-a, carol:pw-a, bob:pw-b
    assert_eq!(auth(&a[0]).as_deref(), Some("Basic YWxpY2U6cHctYQ=="));
    assert_eq!(auth(&b[0]).as_deref(), Some("Basic YWxpY2U6cHctYQ=="));
    assert_eq!(auth(&b[1]).as_deref(), Some("Basic Y2Fyb2w6cHctYQ=="));
    assert_eq!(auth(&c[0]).as_deref(), Some("Basic Ym9iOnB3LWI="));

    // select, rm (removing the selected one clears the selection), errors.
    ok(narad_raw(&["ctx", "select", "dev"], b"", &env));
    ok(narad_raw(&["ctx", "rm", "dev"], b"", &env));
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(saved["current"], "");
    assert_eq!(narad_raw(&["ctx", "select", "dev"], b"", &env).code, 2);
    assert_eq!(narad_raw(&["ctx", "rm", "dev"], b"", &env).code, 2);
    assert_eq!(narad_raw(&["ctx", "add", "x"], b"", &env).code, 2);
    assert_eq!(
        narad_raw(&["ctx", "add", "bad/name", "-s", &url_a], b"", &env).code,
        2
    );

    // Without NARAD_CONFIG_DIR: the user config dir.
    let home = dir.0.join("home");
    let home_s = home.display().to_string();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_narad"));
    let st = cmd
        .args(["ctx", "add", "h", "-s", "http://127.0.0.1:7942"])
        .env_remove("NARAD_CONFIG_DIR")
        .env_remove("XDG_CONFIG_HOME")
        .env("HOME", &home_s)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    assert!(mode_0600(&home.join(".config/narad/contexts.json")));
    let xdg = dir.0.join("xdg");
    let st = Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(["ctx", "add", "h", "-s", "http://127.0.0.1:7942"])
        .env_remove("NARAD_CONFIG_DIR")
        .env("XDG_CONFIG_HOME", &xdg)
        .env("HOME", &home_s)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    assert!(xdg.join("narad/contexts.json").exists());
}

#[test]
fn user_commands_send_the_users_api_requests() {
    // Proves user add (password from the flag or stdin, --grant action:patterns and bare
    // admin), user grant (PUT replaces; no --grant sends []), user ls and user rm send the
    // requests of API.md §11 and print the answers; a refusal exits 1 with the server's text.
    let user = r#"{"username":"billing","grants":[{"action":"produce","patterns":["invoices.*","orders"]}],"created_at_ms":1,"updated_at_ms":1}"#;
    let (url, h) = fake_server_full(vec![
        (201, user.into()),
        (201, r#"{"username":"ops"}"#.into()),
        (200, r#"{"username":"billing"}"#.into()),
        (200, format!("[{user}]")),
        (204, String::new()),
        (403, r#"{"error":"admin privileges required"}"#.into()),
    ]);
    let o = ok(narad_env(
        &url,
        &[
            "user",
            "add",
            "billing",
            "--user-password",
            "s3cret",
            "--grant",
            "produce:invoices.*,orders",
        ],
        b"",
        &[],
    ));
    assert_eq!(json(&o)["username"], "billing");
    ok(narad_env(
        &url,
        &[
            "user",
            "add",
            "ops",
            "--user-password-stdin",
            "--grant",
            "admin",
            "--grant",
            "consume:x",
        ],
        b"from-stdin\n",
        &[],
    ));
    ok(narad_env(&url, &["user", "grant", "billing"], b"", &[]));
    let ls = ok(narad_env(&url, &["user", "ls"], b"", &[]));
    assert_eq!(json(&ls)[0]["username"], "billing");
    let rm = ok(narad_env(&url, &["user", "rm", "billing"], b"", &[]));
    assert!(
        rm.stderr.contains("deleted user \"billing\""),
        "{}",
        rm.stderr
    );
    let o = narad_env(&url, &["user", "rm", "root"], b"", &[]);
    assert_eq!(o.code, 1);
    assert!(
        o.stderr.contains("admin privileges required (HTTP 403)"),
        "{}",
        o.stderr
    );
    let seen = h.join().unwrap();
    let req = |i: usize| -> (String, serde_json::Value) {
        let (head, body) = &seen[i];
        let line = head.lines().next().unwrap().to_string();
        let v = if body.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(body).unwrap()
        };
        (line, v)
    };
    assert_eq!(
        req(0),
        (
            "POST /v1/users HTTP/1.1".into(),
            serde_json::json!({"username":"billing","password":"s3cret",
                "grants":[{"action":"produce","patterns":["invoices.*","orders"]}]})
        )
    );
    assert_eq!(
        req(1).1,
        serde_json::json!({"username":"ops","password":"from-stdin",
            "grants":[{"action":"admin"},{"action":"consume","patterns":["x"]}]})
    );
    assert_eq!(
        req(2),
        (
            "PUT /v1/users/billing/grants HTTP/1.1".into(),
            serde_json::json!({"grants":[]})
        )
    );
    assert_eq!(req(3).0, "GET /v1/users HTTP/1.1");
    assert_eq!(req(4).0, "DELETE /v1/users/billing HTTP/1.1");
    // Usage errors never reach a server.
    let o = narad_env(&url, &["user", "add", "x"], b"", &[]);
    assert_eq!(o.code, 2, "{}", o.stderr);
    let o = narad_env(
        &url,
        &["user", "add", "x", "--user-password", "p", "--grant", ":x"],
        b"",
        &[],
    );
    assert_eq!(o.code, 2, "{}", o.stderr);
}

#[test]
fn cluster_commands_send_the_admin_requests() {
    // Proves cluster members/moves (with --detail), decommission (plain, --dry-run, --cancel),
    // members forget and moves abort send the requests of API.md §12 and print JSON answers.
    let members = r#"{"members":[{"id":"narad-0","addr":"127.0.0.1:1","status":"alive","draining":false,"owned_partitions":4,"outbound_moves":0}]}"#;
    let (url, h) = fake_server_full(vec![
        (200, members.into()),
        (200, members.into()),
        (200, r#"{"moves":[]}"#.into()),
        (200, r#"{"moves":[]}"#.into()),
        (204, String::new()),
        (
            200,
            r#"{"member":"narad-1","would_decommission":false,"reasons":[]}"#.into(),
        ),
        (204, String::new()),
        (200, r#"{"id":"narad-3","voter":false}"#.into()),
        (202, r#"{"move":{},"note":"n"}"#.into()),
        (
            409,
            r#"{"error":"refused","reasons":[{"code":"below_min_voters","message":"m"}]}"#.into(),
        ),
    ]);
    let run = |args: &[&str]| narad_env(&url, args, b"", &[]);
    let m = ok(run(&["cluster", "members"]));
    assert_eq!(json(&m)["members"][0]["id"], "narad-0");
    ok(run(&["cluster", "members", "--detail"]));
    ok(run(&["cluster", "moves"]));
    ok(run(&["cluster", "moves", "--detail"]));
    let d = ok(run(&["cluster", "decommission", "narad-1"]));
    assert!(d.stderr.contains("\"narad-1\" is draining"), "{}", d.stderr);
    let dry = ok(run(&["cluster", "decommission", "narad-1", "--dry-run"]));
    assert_eq!(json(&dry)["would_decommission"], false);
    ok(run(&["cluster", "decommission", "narad-1", "--cancel"]));
    ok(run(&["cluster", "members", "forget", "narad-3"]));
    ok(run(&[
        "cluster", "moves", "abort", "orders", "3", "--target", "narad-2",
    ]));
    let refused = run(&["cluster", "decommission", "narad-0"]);
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("refused (HTTP 409)"),
        "{}",
        refused.stderr
    );
    let lines: Vec<String> = h
        .join()
        .unwrap()
        .iter()
        .map(|(head, _)| head.lines().next().unwrap().to_string())
        .collect();
    assert_eq!(
        lines,
        [
            "GET /v1/cluster/members HTTP/1.1",
            "GET /v1/cluster/members?detail=true HTTP/1.1",
            "GET /v1/cluster/moves HTTP/1.1",
            "GET /v1/cluster/moves?detail=true HTTP/1.1",
            "POST /v1/cluster/members/narad-1/decommission HTTP/1.1",
            "POST /v1/cluster/members/narad-1/decommission?dry_run=true HTTP/1.1",
            "DELETE /v1/cluster/members/narad-1/decommission HTTP/1.1",
            "POST /v1/cluster/members/narad-3/forget HTTP/1.1",
            "POST /v1/cluster/moves/orders/3/abort?target=narad-2 HTTP/1.1",
            "POST /v1/cluster/members/narad-0/decommission HTTP/1.1",
        ]
    );
    let bad = run(&["cluster", "decommission", "n", "--cancel", "--dry-run"]);
    assert_eq!(bad.code, 2);
}

#[test]
fn routes_the_server_lacks_exit_1_with_a_clear_message() {
    // Proves that against a broker without a route (an older release: a plain "404 page not
    // found"), each command exits 1 and says the server does not offer the route; and that this
    // build's own refusal of the remote plane in dev mode is printed as the server said it.
    let cases: Vec<Vec<&str>> = vec![
        vec!["remote", "ls"],
        vec!["remote", "rm", "x"],
        vec!["user", "ls"],
        vec!["user", "rm", "x"],
    ];
    let (url, h) = fake_server_full(
        cases
            .iter()
            .map(|_| (404, "404 page not found\n".to_string()))
            .collect(),
    );
    for args in &cases {
        let o = narad_env(&url, args, b"", &[]);
        assert_eq!(o.code, 1, "{args:?}: {}", o.stderr);
        assert!(
            o.stderr.contains("this server does not offer")
                && o.stderr.contains("/v1/")
                && o.stderr.contains("(HTTP 404)"),
            "{args:?}: {}",
            o.stderr
        );
    }
    assert_eq!(h.join().unwrap().len(), cases.len());
    let (_d, s) = server("cli-missing");
    let o = narad(&s, &["remote", "ls"], b"");
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(
        o.stderr.contains("remotes require security") && o.stderr.contains("403"),
        "{}",
        o.stderr
    );
}

#[test]
fn topic_schema_attach_detach_children_send_the_spec_requests() {
    // Proves topic add --schema (inline and @file, sent verbatim) --parent --delay, topic edit
    // --schema --schema-base-version, topic schema [--current], attach (local and remote flags),
    // detach [--force] and children [--partitions] send the requests of API.md §6 and §9.
    let dir = TempDir::new("cli-fanout-shape");
    let schema_file = dir.0.join("s.json");
    std::fs::write(
        &schema_file,
        "{\"type\":\"object\",\"required\":[\"id\"]}\n",
    )
    .unwrap();
    let at_file = format!("@{}", schema_file.display());
    let topic = r#"{"name":"t","partitions":3}"#;
    let history = r#"{"topic":"t","version":2,"versions":[{"version":1,"schema":true},{"version":2,"schema":{"type":"object"}}]}"#;
    let (url, h) = fake_server_full(vec![
        (201, topic.into()),
        (201, topic.into()),
        (200, topic.into()),
        (200, history.into()),
        (200, history.into()),
        (
            200,
            r#"{"name":"p","role":"parent","children":["c"]}"#.into(),
        ),
        (200, r#"{"dry_run":true}"#.into()),
        (204, String::new()),
        (204, String::new()),
        (200, r#"{"parent":"p","children":[]}"#.into()),
        (200, r#"{"parent":"p","children":[]}"#.into()),
        (200, r#"{"topic":"u","version":0,"versions":[]}"#.into()),
    ]);
    let run = |args: &[&str]| narad_env(&url, args, b"", &[]);
    ok(run(&[
        "topic",
        "add",
        "t",
        "--schema",
        "{\"z\":1, \"a\":2}",
    ]));
    ok(run(&[
        "topic", "add", "c", "--schema", &at_file, "--parent", "p", "--delay", "10m",
    ]));
    ok(run(&[
        "topic",
        "edit",
        "t",
        "--schema",
        "true",
        "--schema-base-version",
        "1",
    ]));
    let hist = ok(run(&["topic", "schema", "t"]));
    assert_eq!(json(&hist)["version"], 2);
    let cur = ok(run(&["topic", "schema", "t", "--current"]));
    assert_eq!(json(&cur), serde_json::json!({"type":"object"}));
    let att = ok(run(&["topic", "attach", "p", "c", "--delay", "1m"]));
    assert_eq!(json(&att)["role"], "parent");
    ok(run(&[
        "topic",
        "attach",
        "p",
        "c2",
        "--remote",
        "b",
        "--remote-topic",
        "orders",
        "--from",
        "earliest",
        "--lanes",
        "2",
        "--dry-run",
    ]));
    let det = ok(run(&["topic", "detach", "p", "c"]));
    assert!(
        det.stderr.contains("detached \"c\" from \"p\""),
        "{}",
        det.stderr
    );
    ok(run(&["topic", "detach", "p", "c2", "--force"]));
    ok(run(&["topic", "children", "p"]));
    ok(run(&["topic", "children", "p", "--partitions"]));
    let none = run(&["topic", "schema", "u", "--current"]);
    assert_eq!(none.code, 1);
    assert!(none.stderr.contains("has no schema"), "{}", none.stderr);
    let seen = h.join().unwrap();
    let line = |i: usize| seen[i].0.lines().next().unwrap().to_string();
    let body = |i: usize| seen[i].1.clone();
    assert_eq!(line(0), "POST /v1/topics HTTP/1.1");
    assert_eq!(body(0), r#"{"name":"t","schema":{"z":1, "a":2}}"#);
    assert_eq!(
        body(1),
        r#"{"name":"c","schema":{"type":"object","required":["id"]},"parent":"p","fanout_delay_ms":600000}"#
    );
    assert_eq!(line(2), "PATCH /v1/topics/t HTTP/1.1");
    assert_eq!(body(2), r#"{"schema":true,"schema_base_version":1}"#);
    assert_eq!(line(3), "GET /v1/topics/t/schema HTTP/1.1");
    assert_eq!(line(5), "POST /v1/topics/p/children HTTP/1.1");
    assert_eq!(body(5), r#"{"child":"c","delay_ms":60000}"#);
    assert_eq!(
        body(6),
        r#"{"child":"c2","remote":"b","remote_topic":"orders","from":"earliest","lanes":2,"dry_run":true}"#
    );
    assert_eq!(line(7), "DELETE /v1/topics/p/children/c HTTP/1.1");
    assert_eq!(
        line(8),
        "DELETE /v1/topics/p/children/c2?force=true HTTP/1.1"
    );
    assert_eq!(line(9), "GET /v1/topics/p/children HTTP/1.1");
    assert_eq!(
        line(10),
        "GET /v1/topics/p/children?partitions=true HTTP/1.1"
    );
    // Client-side checks exit 2 without a request.
    let o = narad_env(
        "http://127.0.0.1:1",
        &["topic", "add", "x", "--schema", "{nope"],
        b"",
        &[],
    );
    assert_eq!(o.code, 2, "{}", o.stderr);
    let o = narad_env(
        "http://127.0.0.1:1",
        &["topic", "add", "x", "--delay", "1m"],
        b"",
        &[],
    );
    assert_eq!(o.code, 2, "{}", o.stderr);
}

#[test]
fn server_report_sums_every_topic() {
    // Proves `server report` prints TOPIC/PARTS/MESSAGES/SIZE/OWNERS/ROLE for every topic with
    // the messages each holds, and a total line summing parts and messages.
    let (_d, s) = server("cli-report");
    s.client().create_topic("alpha", 3);
    s.client().create_topic("beta", 4);
    let lines: String = (0..25).map(|i| format!("m{i}\n")).collect();
    ok(narad(&s, &["pub", "alpha", "--lines"], lines.as_bytes()));
    ok(narad(&s, &["pub", "beta", "one", "--count", "3"], b""));
    let r = ok(narad(&s, &["server", "report"], b""));
    let rows: Vec<Vec<&str>> = r
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 4, "{}", r.stdout);
    assert_eq!(
        rows[0],
        ["TOPIC", "PARTS", "MESSAGES", "SIZE", "OWNERS", "ROLE"]
    );
    assert_eq!(&rows[1][..3], ["alpha", "3", "25"], "{}", r.stdout);
    assert_eq!(rows[1].last(), Some(&"standalone"));
    assert_eq!(&rows[2][..3], ["beta", "4", "3"], "{}", r.stdout);
    assert_eq!(
        &rows[3][..4],
        ["TOTAL", "(2", "topic(s))", "7"],
        "{}",
        r.stdout
    );
    assert_eq!(rows[3][4], "28", "{}", r.stdout);
}

#[test]
fn version_and_completion() {
    // Proves `version` (and `--version`) prints `narad dev (...)` for this non-release build and
    // `completion` writes a script for each shell that knows the subcommands, without panicking
    // when its reader goes away; an unknown shell exits 2.
    let v = ok(narad_raw(&["version"], b"", &[]));
    assert!(v.stdout.starts_with("narad dev ("), "{}", v.stdout);
    // The --version flag says the same.
    assert_eq!(ok(narad_raw(&["--version"], b"", &[])).stdout, v.stdout);
    // Built from a git checkout without NARAD_COMMIT: the commit is named (build.rs).
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output();
    if let Ok(h) = head {
        if h.status.success() && std::env::var_os("NARAD_COMMIT").is_none() {
            let head = String::from_utf8_lossy(&h.stdout).trim().to_string();
            assert_eq!(v.stdout.trim(), format!("narad dev ({head})"));
        }
    }
    for shell in ["bash", "zsh", "fish", "powershell"] {
        let c = ok(narad_raw(&["completion", shell], b"", &[]));
        assert!(
            c.stdout.contains("narad") && c.stdout.contains("decommission"),
            "{shell}: {}",
            &c.stdout[..c.stdout.len().min(300)]
        );
    }
    assert_eq!(narad_raw(&["completion", "tcsh"], b"", &[]).code, 2);
    // A reader that stops early (`| head`) must not make it panic (exit 101).
    let mut child = Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(["completion", "zsh"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_ne!(
        out.status.code(),
        Some(101),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn pub_rate_paces_messages() {
    // Proves pub --rate R spreads messages at about R per second, for a repeated argument and
    // for lines (in small batches), and that a bad rate is a usage error.
    let (_d, s) = server("cli-rate");
    s.client().create_topic("r", 3);
    let start = Instant::now();
    ok(narad(
        &s,
        &["pub", "r", "x", "--count", "11", "--rate", "50"],
        b"",
    ));
    let single = start.elapsed();
    assert!(single >= Duration::from_millis(190), "{single:?}");
    let lines: String = (0..40).map(|i| format!("l{i}\n")).collect();
    let start = Instant::now();
    let o = ok(narad(
        &s,
        &["pub", "r", "--lines", "--rate", "100"],
        lines.as_bytes(),
    ));
    let batched = start.elapsed();
    assert!(batched >= Duration::from_millis(280), "{batched:?}");
    assert!(
        o.stderr.contains(" bytes): 40 message(s) in 4 batch(es)"),
        "{}",
        o.stderr
    );
    assert_eq!(narad(&s, &["pub", "r", "x", "--rate", "0"], b"").code, 2);
    assert_eq!(narad(&s, &["pub", "r", "x", "--rate", "fast"], b"").code, 2);
    let all = ok(narad(&s, &["sub", "r", "--raw", "--wait", "1s"], b""));
    assert_eq!(all.stdout.lines().count(), 51);
}

#[test]
fn user_commands_against_a_secured_broker() {
    // Proves, on a broker with security on: without credentials a command exits 1 with
    // `authentication required`; the root admin (flags) adds a user with grants, lists users
    // and replaces grants, which take effect at once; the user (NARAD_USER/NARAD_PASS) can
    // produce but not create until granted; rm of the root admin is refused; a deleted user is
    // refused; a context with --password-stdin carries the credentials.
    let dir = TempDir::new("cli-secure");
    let s = Server::start_secure(
        dir.0.join("data"),
        vec![("NARAD_ADMIN_PASSWORD".into(), "root-pw-1".into())],
    );
    let url = format!("http://127.0.0.1:{}", s.port);
    let admin = |args: &[&str]| {
        let mut a = vec!["-u", "admin", "-p", "root-pw-1"];
        a.extend_from_slice(args);
        narad_env(&url, &a, b"", &[])
    };
    let billing_env = [("NARAD_USER", "billing"), ("NARAD_PASS", "bill-pw")];
    let billing = |args: &[&str]| narad_env(&url, args, b"", &billing_env);

    let anon = narad_env(&url, &["topic", "ls"], b"", &[]);
    assert_eq!(anon.code, 1, "{}", anon.stderr);
    assert!(
        anon.stderr.contains("authentication required (HTTP 401)"),
        "{}",
        anon.stderr
    );
    let u = json(&ok(admin(&[
        "user",
        "add",
        "billing",
        "--user-password",
        "bill-pw",
        "--grant",
        "produce:orders*",
        "--grant",
        "consume:orders*",
    ])));
    assert_eq!(u["username"], "billing");
    assert!(u.get("password").is_none());
    let users = json(&ok(admin(&["user", "ls"])));
    let names: Vec<&str> = users
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["username"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["admin", "billing"]);
    ok(admin(&["topic", "add", "orders"]));
    ok(billing(&["pub", "orders", "hi"]));
    let o = ok(billing(&["sub", "orders", "--count", "1", "--raw"]));
    assert_eq!(o.stdout, "hi\n");
    let denied = billing(&["topic", "add", "orders-2"]);
    assert_eq!(denied.code, 1, "{}", denied.stderr);
    assert!(denied.stderr.contains("(HTTP 403)"), "{}", denied.stderr);
    let g = json(&ok(admin(&[
        "user",
        "grant",
        "billing",
        "--grant",
        "create:orders*",
        "--grant",
        "produce:orders*",
    ])));
    assert_eq!(g["grants"].as_array().unwrap().len(), 2);
    ok(billing(&["topic", "add", "orders-2"]));

    let root = admin(&["user", "rm", "admin"]);
    assert_eq!(root.code, 1, "{}", root.stderr);
    assert!(root.stderr.contains("(HTTP 403)"), "{}", root.stderr);
    let dup = admin(&["user", "add", "billing", "--user-password", "x"]);
    assert_eq!(dup.code, 1, "{}", dup.stderr);

    // A context holding the admin's credentials (password from stdin).
    let cfg = dir.0.join("cfg");
    let cfg_s = cfg.display().to_string();
    let env = [("NARAD_CONFIG_DIR", cfg_s.as_str())];
    ok(narad_raw(
        &[
            "ctx",
            "add",
            "sec",
            "-s",
            &url,
            "-u",
            "admin",
            "--password-stdin",
        ],
        b"root-pw-1\n",
        &env,
    ));
    ok(narad_raw(&["user", "rm", "billing"], b"", &env));
    let gone = billing(&["topic", "ls"]);
    assert_eq!(gone.code, 1, "{}", gone.stderr);
    assert!(gone.stderr.contains("(HTTP 401)"), "{}", gone.stderr);
}

#[test]
fn fan_out_and_schema_commands_against_a_real_broker() {
    // Proves against a real broker: topic attach makes the parent a parent and the child
    // receives what the parent gets; topic children lists it; detach unlinks it (a second
    // detach exits 1); topic add --schema registers version 1, topic schema --current prints
    // it, a payload it rejects makes pub exit 1, and edit --schema --schema-base-version adds
    // version 2.
    let (_d, s) = server("cli-fanout");
    ok(narad(&s, &["topic", "add", "orders"], b""));
    ok(narad(&s, &["topic", "add", "audit"], b""));
    let p = json(&ok(narad(&s, &["topic", "attach", "orders", "audit"], b"")));
    assert_eq!(p["role"], "parent");
    assert_eq!(p["children"], serde_json::json!(["audit"]));
    ok(narad(&s, &["pub", "orders", "copied"], b""));
    let got = ok(narad(
        &s,
        &["sub", "audit", "--count", "1", "--raw", "--wait", "20s"],
        b"",
    ));
    assert_eq!(got.stdout, "copied\n");
    let c = json(&ok(narad(&s, &["topic", "children", "orders"], b"")));
    assert_eq!(c["parent"], "orders");
    assert_eq!(c["children"][0]["name"], "audit");
    ok(narad(&s, &["topic", "detach", "orders", "audit"], b""));
    let c = json(&ok(narad(&s, &["topic", "children", "orders"], b"")));
    assert_eq!(c["children"], serde_json::json!([]));
    let again = narad(&s, &["topic", "detach", "orders", "audit"], b"");
    assert_eq!(again.code, 1, "{}", again.stderr);
    assert!(again.stderr.contains("(HTTP 404)"), "{}", again.stderr);

    let schema = r#"{"type":"object","required":["id"]}"#;
    ok(narad(
        &s,
        &["topic", "add", "typed", "--schema", schema],
        b"",
    ));
    let cur = json(&ok(narad(
        &s,
        &["topic", "schema", "typed", "--current"],
        b"",
    )));
    assert_eq!(
        cur,
        serde_json::from_str::<serde_json::Value>(schema).unwrap()
    );
    ok(narad(&s, &["pub", "typed", r#"{"id":1}"#], b""));
    let bad = narad(&s, &["pub", "typed"], b"{\"name\":\"x\"}\n");
    assert_eq!(bad.code, 1, "{}", bad.stderr);
    ok(narad(
        &s,
        &[
            "topic",
            "edit",
            "typed",
            "--schema",
            r#"{"type":"object"}"#,
            "--schema-base-version",
            "1",
        ],
        b"",
    ));
    let h = json(&ok(narad(&s, &["topic", "schema", "typed"], b"")));
    assert_eq!(h["version"], 2, "{h}");
    let stale = narad(
        &s,
        &[
            "topic",
            "edit",
            "typed",
            "--schema",
            r#"{"type":"object","properties":{"n":{"type":"string"}}}"#,
            "--schema-base-version",
            "1",
        ],
        b"",
    );
    assert_eq!(stale.code, 1, "{}", stale.stderr);
    assert!(stale.stderr.contains("(HTTP 409)"), "{}", stale.stderr);
}

#[test]
fn pub_falls_back_to_single_produces_without_the_batch_route() {
    // Proves that against a server without `POST .../produce/batch` (404 page not found), pub
    // of lines sends each line as one produce, with the key and partition as query parameters,
    // and counts them all.
    let mut answers = vec![(404, "404 page not found".to_string())];
    answers.extend((0..3).map(|_| (202, String::new())));
    let (url, h) = fake_server_full(answers);
    let o = ok(narad_env(
        &url,
        &["pub", "t", "-k", "k 1", "--partition", "2", "--lines"],
        b"a\n{\"b\":1}\nc\n",
        &[],
    ));
    assert!(o.stderr.contains("no batch produce"), "{}", o.stderr);
    assert!(o.stderr.contains(": 3 message(s) in"), "{}", o.stderr);
    let seen = h.join().unwrap();
    assert_eq!(seen.len(), 4);
    assert!(seen[0]
        .0
        .starts_with("POST /v1/topics/t/produce/batch HTTP/1.1"));
    let bodies: Vec<&str> = seen[1..].iter().map(|(_, b)| b.as_str()).collect();
    assert_eq!(bodies, ["a", "{\"b\":1}", "c"]);
    for (head, _) in &seen[1..] {
        assert!(
            head.starts_with("POST /v1/topics/t/produce?key=k%201&partition=2 HTTP/1.1"),
            "{head}"
        );
    }
}

#[test]
fn password_stdin_takes_the_first_line_and_pub_the_rest() {
    // Proves --password-stdin reads the password from the first stdin line only: the lines
    // after it are still the messages of pub, and every request carries the credentials.
    let (url, h) = fake_server_full(vec![(202, r#"{"accepted":2}"#.into())]);
    ok(narad_env(
        &url,
        &["-u", "bob", "--password-stdin", "pub", "t", "--lines"],
        b"pw-stdin\none\ntwo\n",
        &[],
    ));
    let seen = h.join().unwrap();
    // base64("bob:pw-stdin")
    assert!(
        seen[0]
            .0
            .contains("Authorization: Basic Ym9iOnB3LXN0ZGlu\r\n"),
        "{}",
        seen[0].0
    );
    assert_eq!(
        seen[0].1,
        r#"{"messages":[{"payload":"b25l","payload_encoding":"base64"},{"payload":"dHdv","payload_encoding":"base64"}]}"#
    );
    let o = narad_env(
        &url,
        &["-u", "bob", "--password-stdin", "topic", "ls"],
        b"",
        &[],
    );
    assert_eq!(o.code, 2, "{}", o.stderr);
    let o = narad_env(
        &url,
        &["-p", "x", "--password-stdin", "topic", "ls"],
        b"x\n",
        &[],
    );
    assert_eq!(o.code, 2, "{}", o.stderr);
}

#[test]
fn peek_refuses_while_an_owner_is_down_and_remote_credentials_warn() {
    // Proves sub --peek does not start when the topic's describe shows a partition owner as
    // unavailable (exit 1, naming the partition), and that credentials sent to a host other
    // than loopback draw a warning on stderr while loopback draws none.
    let described = r#"{"name":"t","partitions":2,"partition_stats":[
        {"index":0,"oldest_offset":0,"high_watermark":3,"size_bytes":1,"status":"ok"},
        {"index":1,"oldest_offset":0,"high_watermark":0,"size_bytes":0,"status":"owner_unavailable","owner_liveness":"dead"}]}"#;
    let (url, h) = fake_server_full(vec![(200, described.into())]);
    let o = narad_env(&url, &["sub", "t", "--peek"], b"", &[]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(
        o.stderr.contains("partition 1") && o.stderr.contains("(dead)"),
        "{}",
        o.stderr
    );
    h.join().unwrap();

    let empty = r#"{"topics":[],"next_page_token":""}"#.to_string();
    let (url, h) = fake_server(vec![empty.clone(), empty]);
    let o = ok(narad_env(
        &url,
        &["-u", "a", "-p", "b", "topic", "ls"],
        b"",
        &[],
    ));
    assert!(!o.stderr.contains("warning"), "{}", o.stderr);
    // 0.0.0.0 reaches this machine on Linux but is not a loopback address.
    let port = url.rsplit(':').next().unwrap();
    let o = ok(narad_env(
        &format!("http://0.0.0.0:{port}"),
        &["-u", "a", "-p", "b", "topic", "ls"],
        b"",
        &[],
    ));
    assert!(
        o.stderr
            .contains("warning: sending credentials over plain http:// to 0.0.0.0"),
        "{}",
        o.stderr
    );
    h.join().unwrap();
}

#[test]
fn remote_child_verbs_and_topic_wait() {
    // Proves topic pause/resume/skip send the v3.2 requests of API.md §9.4-9.6, and topic wait
    // --lag-zero returns once a real child has caught up, exits 1 for a topic that is not a
    // child, and exits 1 on timeout while the lag stays above zero.
    let stub = r#"{"name":"c","role":"child","parent":"p"}"#;
    let (url, h) = fake_server_full(vec![
        (200, stub.into()),
        (200, stub.into()),
        (200, stub.into()),
    ]);
    let run = |args: &[&str]| ok(narad_env(&url, args, b"", &[]));
    run(&["topic", "pause", "p", "c", "--reason", "maintenance"]);
    run(&["topic", "resume", "p", "c", "--accept-target"]);
    run(&[
        "topic",
        "skip",
        "p",
        "c",
        "--partition",
        "1",
        "--offset",
        "42",
    ]);
    let seen = h.join().unwrap();
    let got: Vec<(String, String)> = seen
        .iter()
        .map(|(h, b)| (h.lines().next().unwrap().to_string(), b.clone()))
        .collect();
    assert_eq!(
        got,
        [
            (
                "POST /v1/topics/p/children/c/pause HTTP/1.1".to_string(),
                r#"{"reason":"maintenance"}"#.to_string()
            ),
            (
                "POST /v1/topics/p/children/c/resume HTTP/1.1".into(),
                r#"{"accept_target":true}"#.into()
            ),
            (
                "POST /v1/topics/p/children/c/skip HTTP/1.1".into(),
                r#"{"offset":42,"partition":1}"#.into()
            ),
        ]
    );

    let lagging = r#"{"parent":"p","children":[{"name":"c","delay_ms":0,"lag_messages":5,"lag_complete":true}]}"#;
    let (url, _h) = fake_server_full(vec![(200, lagging.into()); 50]);
    let start = Instant::now();
    let o = narad_env(
        &url,
        &[
            "topic",
            "wait",
            "p",
            "c",
            "--lag-zero",
            "--timeout",
            "500ms",
            "--interval",
            "100ms",
        ],
        b"",
        &[],
    );
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(o.stderr.contains("timed out"), "{}", o.stderr);
    assert!(start.elapsed() < Duration::from_secs(10));

    let (_d, s) = server("cli-wait");
    ok(narad(&s, &["topic", "add", "p"], b""));
    ok(narad(&s, &["topic", "add", "c"], b""));
    ok(narad(&s, &["topic", "attach", "p", "c"], b""));
    let lines: String = (0..200).map(|i| format!("m{i}\n")).collect();
    ok(narad(&s, &["pub", "p", "--lines"], lines.as_bytes()));
    let w = ok(narad(
        &s,
        &[
            "topic",
            "wait",
            "p",
            "c",
            "--lag-zero",
            "--timeout",
            "30s",
            "--interval",
            "100ms",
        ],
        b"",
    ));
    assert!(w.stderr.contains("lag zero"), "{}", w.stderr);
    let all = ok(narad(&s, &["sub", "c", "--raw", "--wait", "2s"], b""));
    assert_eq!(all.stdout.lines().count(), 200);
    let not = narad(
        &s,
        &["topic", "wait", "p", "x", "--lag-zero", "--timeout", "1s"],
        b"",
    );
    assert_eq!(not.code, 1, "{}", not.stderr);
    assert!(not.stderr.contains("is not a child"), "{}", not.stderr);
    assert_eq!(narad(&s, &["topic", "wait", "p", "c"], b"").code, 2);
}

#[test]
fn remote_commands_send_the_remotes_api_requests() {
    // Proves remote add/set/rm/ls/test/reencrypt send the v3.2 requests of API.md §14: the
    // password only from stdin, the CA file's PEM, limit flags as milliseconds; set without a
    // change and add without --remote-password-stdin are usage errors (exit 2).
    let dir = TempDir::new("cli-remote");
    let ca = dir.0.join("ca.pem");
    std::fs::write(
        &ca,
        "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let ca_s = ca.display().to_string();
    let remote = r#"{"name":"b","url":"https://b.example"}"#;
    let (url, h) = fake_server_full(vec![
        (201, remote.into()),
        (200, remote.into()),
        (200, remote.into()),
        (204, String::new()),
        (200, r#"{"remotes":[]}"#.into()),
        (200, r#"{"remote":"b","result":"pass","checks":[]}"#.into()),
        (200, r#"{"key_version":"k","reencrypted":[]}"#.into()),
    ]);
    let add = ok(narad_env(
        &url,
        &[
            "remote",
            "add",
            "b",
            "--url",
            "https://b.example",
            "--username",
            "repl",
            "--remote-password-stdin",
            "--ca-file",
            &ca_s,
            "--max-in-flight",
            "32",
            "--request-timeout",
            "10s",
            "--compression",
            "zstd",
        ],
        b"a-long-replicator-password-123\n",
        &[],
    ));
    assert!(!add.stdout.contains("a-long-replicator"), "{}", add.stdout);
    let run = |args: &[&str], stdin: &[u8]| ok(narad_env(&url, args, stdin, &[]));
    run(
        &[
            "remote",
            "set",
            "b",
            "--no-ca",
            "--remote-password-stdin",
            "--check-interval",
            "2m",
        ],
        b"another-long-password-4567890\n",
    );
    run(&["remote", "set", "b", "--conn-max-age", "10m"], b"");
    run(&["remote", "rm", "b", "--force"], b"");
    run(&["remote", "ls", "--no-nodes"], b"");
    run(
        &[
            "remote", "test", "b", "--topic", "orders", "--source", "orders",
        ],
        b"",
    );
    run(&["remote", "reencrypt"], b"");
    let seen = h.join().unwrap();
    let got: Vec<(String, serde_json::Value)> = seen
        .iter()
        .map(|(h, b)| {
            (
                h.lines().next().unwrap().to_string(),
                if b.is_empty() {
                    serde_json::Value::Null
                } else {
                    serde_json::from_str(b).unwrap()
                },
            )
        })
        .collect();
    assert_eq!(got[0].0, "POST /v1/remotes HTTP/1.1");
    assert_eq!(
        got[0].1,
        serde_json::json!({"name":"b","url":"https://b.example","username":"repl",
            "password":"a-long-replicator-password-123",
            "ca_pem":"-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n",
            "limits":{"max_in_flight":32,"request_timeout_ms":10000,"compression":"zstd"}})
    );
    assert_eq!(got[1].0, "PATCH /v1/remotes/b HTTP/1.1");
    assert_eq!(
        got[1].1,
        serde_json::json!({"ca_pem":"","password":"another-long-password-4567890",
            "limits":{"check_interval_ms":120000}})
    );
    assert_eq!(
        got[2].1,
        serde_json::json!({"limits":{"conn_max_age_ms":600000}})
    );
    assert_eq!(got[3].0, "DELETE /v1/remotes/b?force=true HTTP/1.1");
    assert_eq!(got[4].0, "GET /v1/remotes?nodes=false HTTP/1.1");
    assert_eq!(got[5].0, "POST /v1/remotes/b/test HTTP/1.1");
    assert_eq!(
        got[5].1,
        serde_json::json!({"topic":"orders","source":"orders"})
    );
    assert_eq!(got[6].0, "POST /v1/cluster/reencrypt-remotes HTTP/1.1");
    assert_eq!(got[6].1, serde_json::json!({}));
    let o = narad_env(&url, &["remote", "set", "b"], b"", &[]);
    assert_eq!(o.code, 2, "{}", o.stderr);
    let o = narad_env(
        &url,
        &[
            "remote",
            "add",
            "b",
            "--url",
            "https://x",
            "--username",
            "u",
        ],
        b"",
        &[],
    );
    assert_eq!(o.code, 2, "{}", o.stderr);
}

#[test]
fn cluster_commands_answer_for_a_one_node_cluster() {
    // Proves the cluster routes of API.md §12 answer as a node that is its own whole cluster:
    // `cluster members` lists this node (alive, voter, leader, owning every partition), `--detail`
    // adds its status, `cluster moves` is empty, a decommission is refused 409 with its reasons
    // (200 with them as a dry run), and the HTTP statuses of §12.1-12.6 for bad flags, unknown
    // members, moves and Raft servers.
    let (_d, s) = server("cli-cluster");
    let mut c = s.client();
    c.create_topic("orders", 3);
    c.create_topic("audit", 4);
    let v: serde_json::Value =
        serde_json::from_str(&ok(narad(&s, &["cluster", "members"], b"")).stdout)
            .expect("members JSON");
    let members = v["members"].as_array().expect("members array");
    assert_eq!(members.len(), 1, "{v}");
    let m = &members[0];
    let id = m["id"].as_str().expect("id").to_string();
    assert_eq!(m["status"], "alive");
    assert_eq!(m["draining"], false);
    assert_eq!(m["owned_partitions"], 7);
    assert_eq!(m["outbound_moves"], 0);
    assert_eq!(
        (m["voter"].as_bool(), m["leader"].as_bool()),
        (Some(true), Some(true))
    );
    assert!(m.get("node_status").is_none());
    let v: serde_json::Value =
        serde_json::from_str(&ok(narad(&s, &["cluster", "members", "--detail"], b"")).stdout)
            .expect("detail JSON");
    assert_eq!(v["members"][0]["node_status"]["node"], id.as_str());
    assert_eq!(
        v["members"][0]["node_status"]["moves"],
        serde_json::json!([])
    );
    let v: serde_json::Value =
        serde_json::from_str(&ok(narad(&s, &["cluster", "moves"], b"")).stdout)
            .expect("moves JSON");
    assert_eq!(v, serde_json::json!({"moves": []}));

    let o = narad(&s, &["cluster", "decommission", &id], b"");
    assert_eq!(o.code, 1, "{}", o.stderr);
    let dry = c.post_client(
        &format!("/v1/cluster/members/{id}/decommission?dry_run=true"),
        b"",
    );
    assert_eq!(dry.status, 200, "{}", dry.text());
    let dry = dry.json();
    assert_eq!(dry["would_decommission"], false);
    assert_eq!(dry["owned_partitions"], 7);
    let codes: Vec<&str> = dry["reasons"]
        .as_array()
        .expect("reasons")
        .iter()
        .filter_map(|r| r["code"].as_str())
        .collect();
    assert_eq!(codes, ["below_min_voters", "no_receivers"]);
    let r = c.post_client(&format!("/v1/cluster/members/{id}/decommission"), b"");
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.error().contains("no_receivers"), "{}", r.text());

    let status = |c: &mut common::Client, method: &str, path: &str| {
        c.request(method, path, &[("X-Narad-Client", "test")], b"")
            .status
    };
    for (method, path, want) in [
        ("GET", "/v1/cluster/members?detail=maybe".to_string(), 400),
        ("GET", "/v1/cluster/moves?detail=2".to_string(), 400),
        (
            "POST",
            "/v1/cluster/members/nobody/decommission".to_string(),
            404,
        ),
        (
            "POST",
            format!("/v1/cluster/members/{id}/decommission?dry_run=x"),
            400,
        ),
        (
            "DELETE",
            format!("/v1/cluster/members/{id}/decommission"),
            204,
        ),
        (
            "DELETE",
            format!("/v1/cluster/members/{id}/decommission?dry_run=true"),
            400,
        ),
        (
            "DELETE",
            "/v1/cluster/members/nobody/decommission".to_string(),
            404,
        ),
        ("POST", "/v1/cluster/moves/orders/2/abort".to_string(), 409),
        ("POST", "/v1/cluster/moves/orders/3/abort".to_string(), 404),
        ("POST", "/v1/cluster/moves/nope/0/abort".to_string(), 404),
        ("POST", "/v1/cluster/moves/orders/x/abort".to_string(), 400),
        ("POST", format!("/v1/cluster/members/{id}/forget"), 400),
        ("POST", "/v1/cluster/members/nobody/forget".to_string(), 404),
        ("PUT", "/v1/cluster/members".to_string(), 405),
    ] {
        assert_eq!(status(&mut c, method, &path), want, "{method} {path}");
    }
}

#[test]
fn serve_refuses_out_of_range_settings_before_opening_data() {
    // Proves OPERATIONS.md §4.1 for the storage, Raft snapshot and Raft TLS rules of §4.2: a bad
    // value in the config file (or environment) stops `narad serve` with exit 2 and a message
    // naming the setting, before the data directory is created.
    let dir = TempDir::new("cli-badcfg");
    let data = dir.0.join("data");
    let cfg = dir.0.join("narad.json");
    for (json, env, key) in [
        (
            r#"{"storage":{"idle_log_eviction_ms":59999}}"#,
            None,
            "storage.idle_log_eviction_ms",
        ),
        (
            r#"{"storage":{"cold_retention_walk_ms":5}}"#,
            None,
            "storage.cold_retention_walk_ms",
        ),
        (
            r#"{"storage":{"consumer_offset_commit_interval_ms":70000}}"#,
            None,
            "storage.consumer_offset_commit_interval_ms",
        ),
        (r#"{"storage":{"codec":"lz4"}}"#, None, "storage.codec"),
        (
            r#"{"storage":{"compression_level":"ultra"}}"#,
            None,
            "storage.compression_level",
        ),
        (
            r#"{"cluster":{"raft_snapshot_interval":"1ms"}}"#,
            None,
            "cluster.raft_snapshot_interval",
        ),
        (
            r#"{"security":{"cluster_tls_cert_file":"/x"}}"#,
            None,
            "security.cluster_tls_key_file",
        ),
        (
            "{}",
            Some(("NARAD_CLUSTER_RAFT_SNAPSHOT_INTERVAL", "1ms")),
            "cluster.raft_snapshot_interval",
        ),
        (
            "{}",
            Some(("NARAD_CLUSTER_ADDR", "garbage")),
            "cluster.addr",
        ),
        (
            "{}",
            Some((
                "NARAD_ADMIN_PASSWORD",
                "ppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppp",
            )),
            "NARAD_ADMIN_PASSWORD must be 1-72 bytes",
        ),
    ] {
        std::fs::write(&cfg, json).unwrap();
        let mut vars = vec![("NARAD_CLUSTER_ADDR", "127.0.0.1:18251")];
        vars.extend(env);
        let o = narad_raw(
            &[
                "serve",
                "--addr",
                "127.0.0.1:18250",
                "--data-dir",
                data.to_str().unwrap(),
                "--config",
                cfg.to_str().unwrap(),
            ],
            b"",
            &vars,
        );
        assert_eq!(o.code, 2, "{json}: {}", o.stderr);
        assert!(
            o.stderr.starts_with("narad: ") && o.stderr.contains(key),
            "{json}: {}",
            o.stderr
        );
        assert!(!data.exists(), "{json}: the data directory was created");
    }
}

#[test]
fn a_malformed_fanout_setting_stops_the_start() {
    // Proves OPERATIONS.md §4: `NARAD_FANOUT_*` values are read and checked like every other
    // setting; a malformed one ends `server start` with status 2 and names the variable
    // (before, they were ignored and the node started).
    let dir = TempDir::new("fanout-env");
    for (k, v) in [
        ("NARAD_FANOUT_LINGER_MS", "1h"),
        ("NARAD_FANOUT_MAX_BATCH_RECORDS", "0"),
    ] {
        let port = common::free_port_pair();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_narad"));
        cmd.args(["server", "start", "--dev", "--port", &port.to_string()])
            .arg("--data-dir")
            .arg(dir.0.join("data"))
            .env(k, v);
        let (status, stderr) = common::run_to_exit(cmd, Duration::from_secs(15));
        let status = status.unwrap_or_else(|| panic!("{k}={v}: still running; {stderr}"));
        assert_eq!(status.code(), Some(2), "{k}={v}: {stderr}");
        let named = if v == "0" {
            "fanout.max_batch_records"
        } else {
            k
        };
        assert!(stderr.contains(named), "{k}={v}: {stderr}");
    }
}

#[test]
fn server_commands_refuse_the_client_flags() {
    // Proves `serve -p 8080` (an operator meaning the port) and the other client-only global
    // flags stop a server command at once with exit 2, naming the flag, instead of starting on
    // the default port with a password set; a bad data directory shows nothing was started.
    let dir = std::env::temp_dir().join(format!("narad-cli-serve-flags-{}", std::process::id()));
    let data = dir.display().to_string();
    for args in [
        &["serve", "-p", "18323", "--data-dir", &data][..],
        &["serve", "--ctx", "x", "--data-dir", &data][..],
        &[
            "server",
            "start",
            "--dev",
            "-s",
            "http://127.0.0.1:1",
            "--data-dir",
            &data,
        ][..],
        &[
            "server",
            "start",
            "--dev",
            "--password-stdin",
            "--data-dir",
            &data,
        ][..],
    ] {
        let o = narad_raw(args, b"", &[]);
        assert_eq!(o.code, 2, "{args:?}: {}", o.stderr);
        assert!(
            o.stderr.contains("is a client flag"),
            "{args:?}: {}",
            o.stderr
        );
    }
    assert!(
        !dir.exists(),
        "a server command started despite a client flag"
    );
}

#[test]
fn pub_lines_names_the_input_line_a_batch_was_refused_for() {
    // Proves a batch refused for one element names that element's input line (not its index
    // within the batch) and the lines that were not stored, and that the batch before it was.
    let (_d, s) = server("cli-lines-err");
    let mut c = s.client();
    let r = c.post_json(
        "/v1/topics",
        r#"{"name":"sch","partitions":3,"schema":{"type":"object"}}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let mut input = String::new();
    for i in 0..150 {
        input.push_str(&format!("{{\"i\":{i}}}\n"));
    }
    input.push_str("\n7\n");
    let o = narad(&s, &["pub", "sch", "--lines"], input.as_bytes());
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(
        o.stderr.contains("narad: line 152: ")
            && o.stderr.contains("(none of lines 101-152 was stored)"),
        "{}",
        o.stderr
    );
    let d = c.get("/v1/topics/sch").json();
    let stored: u64 = d["partition_stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["next_offset"].as_u64().unwrap())
        .sum();
    assert_eq!(stored, 100, "{d}");
}

#[test]
fn topic_wait_source_drained_refuses_a_local_child_at_once() {
    // Proves `topic wait --source-drained` on a local child (whose entry has no `remote` and no
    // `source_drained`, API.md §9.2: remote-only fields) stops at once with a usage error (exit
    // 2) saying the flag applies to remote children only and naming --lag-zero, instead of
    // polling until its timeout; on a remote child it still returns once the source drained.
    let local = r#"{"parent":"p","children":[{"name":"c","delay_ms":0,"lag_messages":0,"lag_complete":true}]}"#;
    let (url, _h) = fake_server_full(vec![(200, local.into()); 100]);
    let start = Instant::now();
    let o = narad_env(
        &url,
        &[
            "topic",
            "wait",
            "p",
            "c",
            "--source-drained",
            "--timeout",
            "3s",
            "--interval",
            "100ms",
        ],
        b"",
        &[],
    );
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(
        o.stderr.contains("remote") && o.stderr.contains("--lag-zero"),
        "{}",
        o.stderr
    );
    assert!(!o.stderr.contains("timed out"), "{}", o.stderr);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );

    let remote = r#"{"parent":"p","children":[{"name":"c","delay_ms":0,"lag_messages":0,"lag_complete":true,"remote":"b","source_drained":true}]}"#;
    let (url, _h) = fake_server_full(vec![(200, remote.into())]);
    let o = ok(narad_env(
        &url,
        &["topic", "wait", "p", "c", "--source-drained"],
        b"",
        &[],
    ));
    assert!(o.stderr.contains("source drained"), "{}", o.stderr);
}

#[test]
fn pub_refuses_count_zero_and_an_empty_message_before_sending() {
    // Proves `pub --count 0` (with a message or with --lines) and `sub --count 0` are usage
    // errors (exit 2, "--count must be >= 1") instead of a silent "accepted (0 bytes)" or a
    // subscriber that takes nothing and succeeds, and that an empty message
    // (empty stdin, an empty argument, an empty --file) is refused on the client with exit 2 and
    // a message saying the message is empty and where it came from, rather than sent for the
    // server's `400 message required` (API.md §10.1). Nothing is stored; `--lines` on empty
    // input still sends nothing and succeeds, as its help says empty lines are skipped.
    let (_d, s) = server("cli-pub-empty");
    s.client().create_topic("e", 3);
    let files = TempDir::new("cli-pub-empty-files");
    let empty = files.0.join("empty.txt");
    std::fs::write(&empty, b"").unwrap();
    let empty = empty.to_str().unwrap();
    for (args, stdin, want) in [
        (&["pub", "e", "x", "--count", "0"][..], &b""[..], "--count"),
        (&["pub", "e", "--lines", "--count", "0"], b"a\n", "--count"),
        (&["sub", "e", "--count", "0"], b"", "--count"),
        (&["pub", "e"], b"", "stdin"),
        (&["pub", "e", ""], b"", "argument"),
        (&["pub", "e", "-f", empty], b"", empty),
    ] {
        let o = narad(&s, args, stdin);
        assert_eq!(o.code, 2, "{args:?}: {}", o.stderr);
        assert!(o.stderr.contains(want), "{args:?}: {}", o.stderr);
        if want == "--count" {
            assert!(o.stderr.contains("must be >= 1"), "{args:?}: {}", o.stderr);
        } else {
            assert!(o.stderr.contains("empty"), "{args:?}: {}", o.stderr);
        }
        assert!(!o.stderr.contains("accepted"), "{args:?}: {}", o.stderr);
    }
    let o = ok(narad(&s, &["pub", "e", "--lines"], b""));
    assert!(o.stderr.contains("0 message(s)"), "{}", o.stderr);
    let all = ok(narad(&s, &["sub", "e", "--raw", "--wait", "1s"], b""));
    assert_eq!(all.stdout, "");
}

#[test]
fn serve_names_the_fix_for_a_config_file_of_the_wrong_shape() {
    // Proves a config file whose top level, or one of whose sections, is not a JSON object, and
    // an integer setting out of its type's range, stop `narad serve` with exit 2 and a message
    // saying what to fix, naming no Rust type (`struct FileConfig`, `u32`, `u64`): before, `[]`
    // gave serde's "expected struct FileConfig" and a section written as an array was read
    // field by field in declaration order (`{"log":["debug","text"]}` set log.level).
    let dir = TempDir::new("cli-cfgshape");
    let data = dir.0.join("data");
    let cfg = dir.0.join("narad.json");
    for (json, want) in [
        ("[]", "config file: the top level must be a JSON object"),
        (
            "[null,null,null,null,null,null,null,null]",
            "config file: the top level must be a JSON object",
        ),
        ("\"x\"", "config file: the top level must be a JSON object"),
        (r#"{"log":["debug","text"]}"#, "log: must be a JSON object"),
        (r#"{"http":5}"#, "http: must be a JSON object"),
        (r#"{"storage":[]}"#, "storage: must be a JSON object"),
        (
            r#"{"topic":{"max_partitions":5000000000}}"#,
            "topic.max_partitions: ",
        ),
        (
            r#"{"http":{"max_connections":-5}}"#,
            "http.max_connections: ",
        ),
        (
            r#"{"remotes":{"allowed_ports":[70000]}}"#,
            "remotes.allowed_ports",
        ),
    ] {
        std::fs::write(&cfg, json).unwrap();
        let o = narad_raw(
            &[
                "serve",
                "--addr",
                "127.0.0.1:18252",
                "--data-dir",
                data.to_str().unwrap(),
                "--config",
                cfg.to_str().unwrap(),
            ],
            b"",
            &[("NARAD_CLUSTER_ADDR", "127.0.0.1:18253")],
        );
        assert_eq!(o.code, 2, "{json}: {}", o.stderr);
        assert!(o.stderr.contains(want), "{json}: {}", o.stderr);
        for rust in ["struct", "File", "u16", "u32", "u64", "sequence"] {
            assert!(
                !o.stderr.contains(rust),
                "{json}: names {rust}: {}",
                o.stderr
            );
        }
        assert!(!data.exists(), "{json}: the data directory was created");
    }
}
