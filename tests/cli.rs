//! Black-box tests of the `narad` CLI (OPERATIONS.md §1): the real binary run as a user would,
//! against a real broker started on a loopback port (or a one-shot fake server where the test is
//! about the request the CLI sends). Each test states what it proves.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Server, TempDir};

/// Longest any one CLI run may take in these tests.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs `narad <args>` against `server` (a URL), feeding `stdin`, bounded by RUN_TIMEOUT.
fn narad_env(server: &str, args: &[&str], stdin: &[u8], env: &[(&str, &str)]) -> Out {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_narad"));
    cmd.arg("-s")
        .arg(server)
        .args(args)
        .env_remove("NARAD_ADDR")
        .env_remove("NARAD_USER")
        .env_remove("NARAD_PASS")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("run narad");
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let ro = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let re = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > RUN_TIMEOUT {
            let _ = child.kill();
            panic!("narad {args:?} did not finish within {RUN_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    writer.join().unwrap();
    Out {
        code: status.code().unwrap_or(-1),
        stdout: ro.join().unwrap(),
        stderr: re.join().unwrap(),
    }
}

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
fn pub_single_and_10000_lines_then_sub_acks_each_exactly_once() {
    // Proves a single pub (key honoured, `accepted (<n> bytes)`), the sub output line, pub of
    // 10,000 stdin lines in batches of 100 (text and JSON lines), and sub --count 10000 --raw
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
    for i in 0..10_000 {
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
    let p = ok(narad(&s, &["pub", "events"], input.as_bytes()));
    assert!(
        p.stderr
            .contains("accepted 10000 message(s) in 100 batch(es)"),
        "{}",
        p.stderr
    );
    let pub_ms = start.elapsed().as_millis();
    let start = Instant::now();
    let sub = ok(narad(
        &s,
        &["sub", "events", "--count", "10000", "--raw"],
        b"",
    ));
    let sub_ms = start.elapsed().as_millis();
    eprintln!("pub 10000 lines: {pub_ms} ms; sub+ack 10000: {sub_ms} ms");
    assert!(
        sub.stderr
            .contains("10000 message(s) received, 10000 acked"),
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
    // Proves pub --file --partition pins every line, replay prints `[p<P> @<offset>]` lines from
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
        ],
        b"",
    ));
    assert!(
        p.stderr
            .contains("accepted 5 message(s) in 1 batch(es) (11 bytes)"),
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
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let h = std::thread::spawn(move || {
        let mut heads = Vec::new();
        let mut bodies: std::collections::VecDeque<String> = bodies.into();
        'conns: while !bodies.is_empty() {
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
                heads.push(String::from_utf8(head).unwrap());
                let Some(body) = bodies.pop_front() else {
                    break 'conns;
                };
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                c.write_all(resp.as_bytes()).unwrap();
                if bodies.is_empty() {
                    break 'conns;
                }
            }
        }
        heads
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
        &["pub", "feed", "--partition", "0"],
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
fn pub_count_repeats_a_message_and_limits_lines() {
    // Proves pub --count N sends the argument N times, and with lines stops after N lines.
    let (_d, s) = server("cli-count");
    s.client().create_topic("c", 3);
    let o = ok(narad(&s, &["pub", "c", "x", "--count", "5"], b""));
    assert_eq!(o.stderr.trim(), "accepted 5 message(s) (5 bytes)");
    let o = ok(narad(&s, &["pub", "c", "--count", "3"], b"a\nb\nc\nd\n"));
    assert!(
        o.stderr.contains("accepted 3 message(s) in 1 batch(es)"),
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
        &["pub", "bin", "--partition", "2"],
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
    let o = narad(&s, &["pub", "bin", "--partition", "1"], &big);
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(
        o.stderr.contains("line 2: longer than 1048576 bytes"),
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("accepted 1 message(s)"), "{}", o.stderr);
    let o = ok(narad(
        &s,
        &["replay", "bin", "--partition", "1", "--raw"],
        b"",
    ));
    assert_eq!(o.stdout, "ok\n");
}
