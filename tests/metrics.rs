//! Black-box tests of observability: `/metrics` parsed with a strict parser of the Prometheus
//! text format (0.0.4) and checked against the traffic the test made, the separate metrics
//! listener (API.md §15.3), and JSON log lines (`narad serve --log-format json`, OPERATIONS.md §8).

mod common;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use common::{Client, Serve, Server, TempDir};

/// One sample: metric name, labels (sorted), value.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A parsed exposition: samples in order, and each family's declared type.
#[derive(Debug, Default)]
struct Exposition {
    samples: Vec<Sample>,
    types: HashMap<String, String>,
}

fn is_name(s: &str, colon: bool) -> bool {
    let mut cs = s.chars();
    let ok_first = |c: char| c.is_ascii_alphabetic() || c == '_' || (colon && c == ':');
    match cs.next() {
        Some(c) if ok_first(c) => {}
        _ => return false,
    }
    cs.all(|c| ok_first(c) || c.is_ascii_digit())
}

fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => {
            if s.is_empty()
                || !s
                    .chars()
                    .all(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E'))
            {
                return Err(format!("bad value {s:?}"));
            }
            s.parse().map_err(|e| format!("bad value {s:?}: {e}"))
        }
    }
}

/// The family a sample belongs to (histogram series carry a suffix).
fn family_of<'a>(name: &'a str, types: &HashMap<String, String>) -> &'a str {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if types.get(base).map(String::as_str) == Some("histogram") {
                return base;
            }
        }
    }
    name
}

/// Parses the text format strictly: HELP/TYPE syntax, at most one TYPE per family and before
/// its samples, each family's lines contiguous, metric and label name syntax, label value
/// escapes (only `\\`, `\"`, `\n`), float values, no duplicate series, newline-terminated.
fn parse(text: &str) -> Result<Exposition, String> {
    if !text.ends_with('\n') {
        return Err("document does not end with a newline".into());
    }
    let mut e = Exposition::default();
    let mut seen_families: Vec<String> = Vec::new();
    let mut series = std::collections::HashSet::new();
    let enter = |fam: &str, seen: &mut Vec<String>| -> Result<(), String> {
        if seen.last().map(String::as_str) == Some(fam) {
            return Ok(());
        }
        if seen.iter().any(|f| f == fam) {
            return Err(format!("family {fam} is not contiguous"));
        }
        seen.push(fam.to_string());
        Ok(())
    };
    for (n, line) in text.lines().enumerate() {
        let err = |m: String| format!("line {}: {m}: {line:?}", n + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let rest = rest.strip_prefix(' ').unwrap_or(rest);
            let mut parts = rest.splitn(3, ' ');
            match parts.next() {
                Some("HELP") => {
                    let name = parts
                        .next()
                        .ok_or_else(|| err("HELP without name".into()))?;
                    if !is_name(name, true) {
                        return Err(err("bad metric name".into()));
                    }
                    enter(name, &mut seen_families).map_err(err)?;
                }
                Some("TYPE") => {
                    let name = parts
                        .next()
                        .ok_or_else(|| err("TYPE without name".into()))?;
                    let ty = parts
                        .next()
                        .ok_or_else(|| err("TYPE without type".into()))?;
                    if !matches!(
                        ty,
                        "counter" | "gauge" | "histogram" | "summary" | "untyped"
                    ) {
                        return Err(err(format!("unknown type {ty}")));
                    }
                    if e.types.insert(name.to_string(), ty.to_string()).is_some() {
                        return Err(err("second TYPE for a family".into()));
                    }
                    if e.samples
                        .iter()
                        .any(|s| family_of(&s.name, &e.types) == name)
                    {
                        return Err(err("TYPE after samples".into()));
                    }
                    enter(name, &mut seen_families).map_err(err)?;
                }
                _ => {} // other comments are allowed
            }
            continue;
        }
        // name [{labels}] value [timestamp]
        let name_end = line
            .find(['{', ' '])
            .ok_or_else(|| err("no value".into()))?;
        let name = &line[..name_end];
        if !is_name(name, true) {
            return Err(err("bad metric name".into()));
        }
        let mut rest = &line[name_end..];
        let mut labels = BTreeMap::new();
        if let Some(r) = rest.strip_prefix('{') {
            let mut chars = r.char_indices().peekable();
            let consumed;
            loop {
                // label name
                let start = match chars.peek() {
                    Some((_, '}')) => {
                        let (i, _) = chars.next().unwrap();
                        consumed = Some(i + 1);
                        break;
                    }
                    Some((i, _)) => *i,
                    None => return Err(err("unterminated labels".into())),
                };
                let mut end = start;
                while let Some((i, c)) = chars.peek() {
                    if *c == '=' {
                        end = *i;
                        break;
                    }
                    chars.next();
                }
                let lname = &r[start..end];
                if !is_name(lname, false) {
                    return Err(err(format!("bad label name {lname:?}")));
                }
                chars.next(); // '='
                if chars.next().map(|x| x.1) != Some('"') {
                    return Err(err("label value not quoted".into()));
                }
                let mut value = String::new();
                loop {
                    match chars.next() {
                        Some((_, '\\')) => match chars.next() {
                            Some((_, '\\')) => value.push('\\'),
                            Some((_, '"')) => value.push('"'),
                            Some((_, 'n')) => value.push('\n'),
                            other => return Err(err(format!("bad escape {other:?}"))),
                        },
                        Some((_, '"')) => break,
                        Some((_, '\n')) | None => return Err(err("unterminated value".into())),
                        Some((_, c)) => value.push(c),
                    }
                }
                if labels.insert(lname.to_string(), value).is_some() {
                    return Err(err(format!("label {lname} twice")));
                }
                match chars.next() {
                    Some((_, ',')) => continue,
                    Some((i, '}')) => {
                        consumed = Some(i + 1);
                        break;
                    }
                    other => return Err(err(format!("expected , or }} got {other:?}"))),
                }
            }
            rest = &r[consumed.unwrap()..];
        }
        let rest = rest
            .strip_prefix(' ')
            .ok_or_else(|| err("no space before value".into()))?;
        let mut fields = rest.split(' ');
        let value = parse_value(fields.next().unwrap_or("")).map_err(err)?;
        if let Some(ts) = fields.next() {
            ts.parse::<i64>().map_err(|_| err("bad timestamp".into()))?;
        }
        if fields.next().is_some() {
            return Err(err("trailing fields".into()));
        }
        let fam = family_of(name, &e.types).to_string();
        enter(&fam, &mut seen_families).map_err(err)?;
        let key = format!("{name}{labels:?}");
        if !series.insert(key) {
            return Err(err("duplicate series".into()));
        }
        e.samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    check_histograms(&e)?;
    Ok(e)
}

/// Every histogram series: `le` buckets ascending and cumulative, `+Inf` present and equal to
/// `_count`, a `_sum`.
fn check_histograms(e: &Exposition) -> Result<(), String> {
    for (fam, ty) in &e.types {
        if ty != "histogram" {
            continue;
        }
        let mut groups: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        let mut counts: BTreeMap<String, f64> = BTreeMap::new();
        let mut sums: BTreeMap<String, f64> = BTreeMap::new();
        for s in &e.samples {
            let mut labels = s.labels.clone();
            if s.name == format!("{fam}_bucket") {
                let le = labels
                    .remove("le")
                    .ok_or_else(|| format!("{fam}_bucket without le"))?;
                let le = parse_value(&le)?;
                groups
                    .entry(format!("{labels:?}"))
                    .or_default()
                    .push((le, s.value));
            } else if s.name == format!("{fam}_count") {
                counts.insert(format!("{labels:?}"), s.value);
            } else if s.name == format!("{fam}_sum") {
                sums.insert(format!("{labels:?}"), s.value);
            }
        }
        for (labels, buckets) in &groups {
            for w in buckets.windows(2) {
                if w[0].0 >= w[1].0 {
                    return Err(format!("{fam}{labels}: le not ascending"));
                }
                if w[0].1 > w[1].1 {
                    return Err(format!("{fam}{labels}: buckets not cumulative"));
                }
            }
            let last = buckets.last().unwrap();
            if last.0 != f64::INFINITY {
                return Err(format!("{fam}{labels}: no +Inf bucket"));
            }
            if counts.get(labels) != Some(&last.1) {
                return Err(format!("{fam}{labels}: +Inf != _count"));
            }
            if !sums.contains_key(labels) {
                return Err(format!("{fam}{labels}: no _sum"));
            }
        }
        if groups.len() != counts.len() || groups.len() != sums.len() {
            return Err(format!("{fam}: bucket/sum/count series differ"));
        }
    }
    Ok(())
}

impl Exposition {
    /// Sum of the samples named `name` whose labels include `want`.
    fn sum(&self, name: &str, want: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                want.iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| s.value)
            .sum()
    }

    fn count(&self, name: &str) -> usize {
        self.samples.iter().filter(|s| s.name == name).count()
    }

    /// Samples named `name` whose labels are exactly `want`.
    fn count_with(&self, name: &str, want: &[(&str, &str)]) -> usize {
        self.samples
            .iter()
            .filter(|s| s.name == name && s.labels.len() == want.len())
            .filter(|s| {
                want.iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .count()
    }
}

fn scrape(c: &mut Client) -> Exposition {
    let r = c.get("/metrics");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.header("content-type")
            .is_some_and(|t| t.starts_with("text/plain; version=0.0.4")),
        "{:?}",
        r.header("content-type")
    );
    parse(&r.text()).unwrap_or_else(|e| panic!("/metrics does not parse: {e}\n{}", r.text()))
}

#[test]
fn strict_parser_rejects_malformed_exposition() {
    // Proves the test's parser is strict: each malformed document is refused, a good one passes.
    let good = "# HELP a_total x\n# TYPE a_total counter\na_total{l=\"a\\\"b\\\\c\\n\"} 1\n";
    assert!(parse(good).is_ok());
    for bad in [
        "a_total 1",               // no final newline
        "a_total{l=\"x} 1\n",      // unterminated value
        "a_total{l=\"\\t\"} 1\n",  // bad escape
        "a_total{1l=\"x\"} 1\n",   // bad label name
        "a_total one\n",           // bad value
        "a 1\nb 1\na 2\n",         // family not contiguous
        "a 1\na 1\n",              // duplicate series
        "a 1\n# TYPE a counter\n", // TYPE after samples
        "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
        "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n", // no +Inf
        "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 1\n", // +Inf != count
    ] {
        assert!(parse(bad).is_err(), "accepted {bad:?}");
    }
}

#[test]
fn metrics_parse_and_move_with_traffic() {
    // Proves /metrics parses strictly as Prometheus exposition from any connection (any shard:
    // the node-wide merge), and that produce 10 / consume 5 / ack 3 show in the per-topic and
    // per-route series, in-flight leases and lag, histograms (cumulative, +Inf = count), the WAL
    // fsync histogram and the 404 of an unknown path.
    let dir = TempDir::new("metrics");
    let s = Server::start(&dir);
    let mut c = s.client();
    let before = scrape(&mut c);
    assert_eq!(before.sum("narad_topics_total", &[]), 0.0);
    // A HEAD answer's body is not sent, so it adds no response bytes.
    let healthz = &[("route", "GET /healthz")][..];
    let out_before = before.sum("narad_http_response_bytes_out_total", healthz);
    let got = c.get("/healthz");
    assert_eq!(c.request("HEAD", "/healthz", &[], b"").status, 200);
    let after = scrape(&mut c);
    assert_eq!(
        after.sum("narad_http_response_bytes_out_total", healthz) - out_before,
        got.body.len() as f64
    );
    // The OpenAPI document is served (and counted under its own route).
    let r = c.get("/v1/openapi.json");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["openapi"], "3.1.0");
    c.create_topic("orders", 4);
    // Produces on several connections: the shards that accept them differ.
    for i in 0..10 {
        let mut p = s.client();
        let r = p.post_json(&format!("/v1/topics/orders/produce?key=k{i}"), "{\"n\":1}");
        assert_eq!(r.status, 202, "{}", r.text());
    }
    let mut handles = Vec::new();
    for _ in 0..5 {
        let mut k = s.client();
        let r = k.get("/v1/topics/orders/consume");
        assert_eq!(r.status, 200, "{}", r.text());
        handles.push(r.json()["receipt_handle"].as_str().unwrap().to_string());
    }
    for h in &handles[..3] {
        let r = c.request(
            "POST",
            &format!("/v1/topics/orders/ack?receipt_handle={h}"),
            &[("X-Narad-Client", "t")],
            b"",
        );
        assert_eq!(r.status, 204, "{}", r.text());
    }
    assert_eq!(c.get("/nope").status, 404);

    // Every connection sees the same node-wide counters.
    for _ in 0..4 {
        let mut k = s.client();
        let m = scrape(&mut k);
        let orders = [("topic", "orders")];
        assert_eq!(m.sum("narad_messages_produced_total", &orders), 10.0);
        assert_eq!(m.sum("narad_bytes_produced_total", &orders), 70.0);
        assert_eq!(m.sum("narad_messages_consumed_total", &orders), 5.0);
        assert_eq!(m.sum("narad_bytes_consumed_total", &orders), 35.0);
        assert_eq!(m.sum("narad_messages_acked_total", &orders), 3.0);
        assert_eq!(m.sum("narad_inflight_size", &orders), 2.0);
        assert_eq!(
            m.count("narad_messages_produced_total"),
            4,
            "one series per partition"
        );
        let lag = m.sum("narad_consumer_lag_messages", &orders);
        assert!((7.0..=10.0).contains(&lag), "lag {lag}");
        let produce = [
            ("route", "POST /v1/topics/{topic}/produce"),
            ("method", "POST"),
            ("status", "202"),
        ];
        assert_eq!(m.sum("narad_http_requests_total", &produce), 10.0);
        assert_eq!(
            m.sum("narad_http_request_duration_seconds_count", &produce),
            10.0
        );
        let consume = [
            ("route", "GET /v1/topics/{topic}/consume"),
            ("status", "200"),
        ];
        assert_eq!(m.sum("narad_http_requests_total", &consume), 5.0);
        let ack = [("route", "POST /v1/topics/{topic}/ack"), ("status", "204")];
        assert_eq!(m.sum("narad_http_requests_total", &ack), 3.0);
        let openapi = [("route", "GET /v1/openapi.json"), ("status", "200")];
        assert_eq!(m.sum("narad_http_requests_total", &openapi), 1.0);
        let unmatched = [("route", "unmatched"), ("status", "404")];
        assert!(m.sum("narad_http_requests_total", &unmatched) >= 1.0);
        assert_eq!(m.sum("narad_topics_total", &[]), 1.0);
        assert_eq!(m.sum("narad_partitions_total", &[]), 4.0);
        assert_eq!(m.sum("narad_shards", &[]), 2.0);
        assert_eq!(m.count("narad_wal_fsync_duration_seconds_count"), 2);
        assert!(m.sum("narad_wal_fsync_duration_seconds_count", &[]) >= 1.0);
        assert!(m.sum("narad_wal_batch_records_sum", &[]) >= 10.0);
        assert!(m.sum("narad_data_dir_size_bytes", &[]) > 0.0);
        assert!(m.sum("narad_data_dir_available_bytes", &[]) > 0.0);
        assert_eq!(m.sum("narad_ingress_wal_failed", &[]), 0.0);
        // The scrape itself is in flight on the shard that answers it.
        assert!(m.sum("narad_http_requests_in_flight", &[]) >= 1.0);
    }
    // Consume waits by outcome: the five consumes above could not wait; a long-poll on an empty
    // topic times out.
    c.create_topic("idle", 3);
    let r = c.get("/v1/topics/idle/consume?wait=100ms");
    assert_eq!(r.status, 204);
    let m = scrape(&mut c);
    let wait = "narad_consume_wait_seconds_count";
    assert_eq!(
        m.sum(wait, &[("topic", "orders"), ("outcome", "no_wait")]),
        5.0
    );
    assert_eq!(
        m.sum(wait, &[("topic", "idle"), ("outcome", "timeout")]),
        1.0
    );
    let waited = m.sum("narad_consume_wait_seconds_sum", &[("topic", "idle")]);
    assert!((0.09..5.0).contains(&waited), "{waited}");
    assert_eq!(
        m.sum("narad_consume_empty_total", &[("topic", "idle")]),
        1.0
    );
    assert!(m.sum("narad_metastore_applied_index", &[]) >= 2.0);
    // §9.6 Raft gauges of a one-member group, and the boot duration.
    assert_eq!(m.sum("narad_raft_state", &[("state", "leader")]), 1.0);
    assert_eq!(m.sum("narad_raft_state", &[]), 1.0, "one state at a time");
    assert!(m.sum("narad_raft_term", &[]) >= 1.0);
    let applied = m.sum("narad_raft_applied_index", &[]);
    assert!(applied >= 2.0);
    assert!(m.sum("narad_raft_commit_index", &[]) >= applied);
    assert!(m.sum("narad_raft_last_log_index", &[]) >= applied);
    assert_eq!(m.sum("narad_raft_has_leader", &[]), 1.0);
    assert_eq!(
        (
            m.sum("narad_raft_voters", &[]),
            m.sum("narad_raft_nonvoters", &[])
        ),
        (1.0, 0.0)
    );
    assert!(m.sum("narad_raft_last_contact_seconds", &[]) < 1.0);
    let boot = m.sum("narad_boot_duration_seconds", &[]);
    assert!(boot > 0.0 && boot < 60.0, "boot {boot}");
    assert_eq!(
        m.sum("narad_http_batch_body_budget_rejections_total", &[]),
        0.0
    );
    // A deleted topic's series disappear.
    let r = c.request("DELETE", "/v1/topics/orders", &[], b"");
    assert_eq!(r.status, 204, "{}", r.text());
    let m = scrape(&mut c);
    assert_eq!(
        m.sum("narad_messages_produced_total", &[("topic", "orders")]),
        0.0
    );
    assert_eq!(m.count("narad_messages_produced_total"), 3);
}

#[test]
fn json_log_lines_parse_with_the_spec_fields() {
    // Proves `narad serve --log-format json` writes JSON lines: the serving line parses as one
    // object with "msg":"http listening" (OPERATIONS.md §8), an RFC 3339 time, a level, the
    // event's fields and its target; and that `--log-format text` writes no JSON.
    let dir = TempDir::new("logjson");
    let s = Serve::start(&dir, &["--log-format", "json", "--log-level", "info"], &[]);
    let line = s.wait_line("http listening", |l| l.contains("http listening"));
    let v: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    assert_eq!(v["msg"], "http listening", "{line}");
    assert_eq!(v["level"], "INFO");
    let time = v["time"].as_str().unwrap();
    assert!(
        time.len() == 24 && time.ends_with('Z') && time.as_bytes()[10] == b'T',
        "{time}"
    );
    assert_eq!(v["shards"], 2);
    assert!(v["addr"].as_str().unwrap().ends_with(&s.port.to_string()));
    assert!(v["target"].as_str().unwrap().starts_with("narad"));
    drop(s);

    let dir = TempDir::new("logtext");
    let s = Serve::start(&dir, &["--log-format", "text", "--log-level", "info"], &[]);
    let line = s.wait_line("http listening", |l| l.contains("http listening"));
    assert!(serde_json::from_str::<serde_json::Value>(&line).is_err());
    assert!(line.contains(" INFO  http listening "), "{line}");
}

#[test]
fn separate_metrics_listener_serves_only_metrics_and_health() {
    // Proves API.md §15.3 with http.metrics_addr set: the listener answers /metrics (parsable),
    // /healthz and /readyz without credentials and 404 for API routes; the API port answers
    // /metrics with 404.
    let dir = TempDir::new("mlisten");
    let mport = common::free_port_pair();
    let maddr = format!("127.0.0.1:{mport}");
    let s = Serve::start(&dir, &[], &[("NARAD_HTTP_METRICS_ADDR", &maddr)]);
    let mut api = s.client();
    assert_eq!(api.get("/metrics").status, 404);
    assert_eq!(api.get("/healthz").status, 200);
    let mut m = Client::connect(maddr.parse().unwrap()).expect("metrics listener");
    let e = scrape(&mut m);
    // The API port's 404 for /metrics was counted.
    let r404 = [("route", "GET /metrics"), ("status", "404")];
    assert_eq!(e.sum("narad_http_requests_total", &r404), 1.0);
    assert_eq!(m.get("/healthz").status, 200);
    assert_eq!(m.get("/readyz").status, 200);
    let r = m.get("/v1/topics");
    assert_eq!((r.status, r.text().as_str()), (404, "404 page not found\n"));
    assert_eq!(m.request("POST", "/metrics", &[], b"").status, 405);
}

#[test]
fn metrics_on_the_api_port_take_basic_auth_with_security_on() {
    // Proves API.md §15.3 with security on and no separate listener: /metrics needs the API's
    // Basic credentials (401 with the challenge without them, 200 with them, any user), and
    // `http.metrics_unauthenticated=true` opens it without credentials.
    let pw = "metrics-admin-password-1";
    let env = vec![("NARAD_ADMIN_PASSWORD".to_string(), pw.to_string())];
    let dir = TempDir::new("mauth");
    let s = Server::start_secure(dir.0.join("data"), env.clone());
    let mut c = s.client();
    let r = c.get("/metrics");
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(r.header("www-authenticate"), Some("Basic realm=\"narad\""));
    let auth = common::basic_auth("admin", pw);
    let r = c.request("GET", "/metrics", &[("Authorization", &auth)], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let m = parse(&r.text()).unwrap();
    // No verification is waiting once the scrape's own check is done.
    assert_eq!(m.sum("narad_auth_verify_queued", &[]), 0.0);
    assert_eq!(m.types["narad_auth_verify_queued"], "gauge");
    drop(s);

    let dir = TempDir::new("mopen");
    let mut env = env;
    env.push((
        "NARAD_HTTP_METRICS_UNAUTHENTICATED".to_string(),
        "true".to_string(),
    ));
    let s = Server::start_secure(dir.0.join("data"), env);
    let mut c = s.client();
    let r = c.get("/metrics");
    assert_eq!(r.status, 200, "{}", r.text());
    // The rest of /v1 still needs credentials.
    assert_eq!(c.get("/v1/topics").status, 401);
}

/// Scrapes until `ok` holds for the exposition (bounded: 15 s), returning the last one.
fn scrape_until(c: &mut Client, what: &str, ok: impl Fn(&Exposition) -> bool) -> Exposition {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let m = scrape(c);
        if ok(&m) {
            return m;
        }
        assert!(Instant::now() < deadline, "no {what} within 15 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn lapsed_leases_and_nacks_are_counted_per_topic() {
    // Proves `narad_lease_expired_total{topic}`: a lease left past its 1 s visibility timeout
    // counts once (whether the sweep or the next consume finds it), the redelivery counts again
    // in `narad_messages_consumed_total`, a nack counts in `narad_nack_total` and not as a lapse,
    // and other topics stay at zero.
    let dir = TempDir::new("m-expire");
    let s = Server::start(&dir);
    let mut c = s.client();
    let r = c.post_json(
        "/v1/topics",
        r#"{"name":"l","partitions":3,"visibility_timeout_ms":1000}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    c.create_topic("other", 3);
    assert_eq!(
        c.post_client("/v1/topics/l/produce?partition=1", b"one")
            .status,
        202
    );
    let m = scrape(&mut c);
    assert_eq!(m.sum("narad_lease_expired_total", &[("topic", "l")]), 0.0);
    assert_eq!(m.count("narad_lease_expired_total"), 2, "one per topic");
    let first = c.get("/v1/topics/l/consume");
    assert_eq!(first.status, 200, "{}", first.text());
    std::thread::sleep(Duration::from_millis(1300));
    let again = c.get("/v1/topics/l/consume?wait=2s");
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.json()["offset"], first.json()["offset"]);
    let m = scrape(&mut c);
    assert_eq!(m.sum("narad_lease_expired_total", &[("topic", "l")]), 1.0);
    assert_eq!(
        m.sum("narad_messages_consumed_total", &[("topic", "l")]),
        2.0
    );
    // A nack releases at once: counted as a nack, not as a lapse.
    let h = again.json()["receipt_handle"].as_str().unwrap().to_string();
    let r = c.post_client(
        &format!("/v1/topics/l/ack?receipt_handle={h}&extend=0"),
        b"",
    );
    assert_eq!(r.status, 204, "{}", r.text());
    let m = scrape(&mut c);
    assert_eq!(m.sum("narad_nack_total", &[("topic", "l")]), 1.0);
    assert_eq!(m.sum("narad_lease_expired_total", &[("topic", "l")]), 1.0);
    assert_eq!(
        m.sum("narad_lease_expired_total", &[("topic", "other")]),
        0.0
    );
    assert_eq!(m.types["narad_lease_expired_total"], "counter");
}

#[test]
fn schema_rejections_are_counted_by_reason() {
    // Proves the §9.3 series: one valid produce, one schema violation, one non-JSON payload and
    // one over-deep payload give validations 4 and rejections invalid 1, malformed 1, depth 1,
    // busy 0, with nothing left in flight; on every shard's connection alike (node-wide merge).
    // Also `narad_produce_rejections_total{reason="schema"}` 3 for the topic (a refused batch
    // counts once more), and `{reason="delayed_child"}` for a direct produce to a delay child.
    // A schema refused for its pattern counts as `definition_pattern`.
    // `narad_schema_validation_seconds` times only validations under the slot: none for these
    // small payloads, one for a valid 20 KiB payload.
    let dir = TempDir::new("m-schema");
    let s = Server::start(&dir);
    let mut c = s.client();
    let body = r#"{"name":"pay","partitions":3,"schema":{"type":"object","required":["id"],"properties":{"id":{"type":"string"}}}}"#;
    let r = c.post_json("/v1/topics", body);
    assert_eq!(r.status, 201, "{}", r.text());
    let m = scrape(&mut c);
    assert_eq!(m.sum("narad_schema_validations_total", &[]), 0.0);
    assert_eq!(m.count("narad_schema_rejections_total"), 7);
    // A schema refused at registration for its pattern counts as `definition_pattern`.
    let r = c.post_json(
        "/v1/topics",
        r#"{"name":"lookaround","schema":{"type":"string","pattern":"(?=a)"}}"#,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let m = scrape(&mut c);
    let reason = |m: &Exposition, r: &str| m.sum("narad_schema_rejections_total", &[("reason", r)]);
    assert_eq!(reason(&m, "definition_pattern"), 1.0);
    assert_eq!(reason(&m, "definition_paths"), 0.0);
    let deep = format!("{}{}", "[".repeat(300), "]".repeat(300));
    for (payload, status) in [
        (&br#"{"id":"a"}"#[..], 202),
        (&br#"{"id":1}"#[..], 400),
        (&b"not json"[..], 400),
        (deep.as_bytes(), 400),
    ] {
        let mut p = s.client();
        let r = p.post_client("/v1/topics/pay/produce", payload);
        assert_eq!(r.status, status, "{}", r.text());
    }
    for _ in 0..3 {
        let mut k = s.client();
        let m = scrape(&mut k);
        let reason = |r: &str| m.sum("narad_schema_rejections_total", &[("reason", r)]);
        assert_eq!(m.sum("narad_schema_validations_total", &[]), 4.0);
        assert_eq!(reason("invalid"), 1.0);
        assert_eq!(reason("malformed"), 1.0);
        assert_eq!(reason("depth"), 1.0);
        assert_eq!(reason("busy"), 0.0);
        assert_eq!(m.sum("narad_schema_validations_in_flight", &[]), 0.0);
        assert_eq!(m.types["narad_schema_rejections_total"], "counter");
        assert_eq!(m.types["narad_schema_validations_in_flight"], "gauge");
        let rejected = |r: &str| {
            m.sum(
                "narad_produce_rejections_total",
                &[("topic", "pay"), ("reason", r)],
            )
        };
        assert_eq!(rejected("schema"), 3.0);
        assert_eq!(rejected("delayed_child"), 0.0);
        assert_eq!(
            m.count_with(
                "narad_produce_rejections_total",
                &[("topic", "pay"), ("reason", "remote_child")]
            ),
            1
        );
        assert_eq!(rejected("remote_child"), 0.0);
        assert_eq!(m.sum("narad_schema_validation_seconds_count", &[]), 0.0);
    }
    let big = format!(r#"{{"id":"{}"}}"#, "x".repeat(20 << 10));
    let r = c.post_client("/v1/topics/pay/produce", big.as_bytes());
    assert_eq!(r.status, 202, "{}", r.text());
    let m = scrape(&mut c);
    assert_eq!(m.types["narad_schema_validation_seconds"], "histogram");
    assert_eq!(m.sum("narad_schema_validation_seconds_count", &[]), 1.0);
    let took = m.sum("narad_schema_validation_seconds_sum", &[]);
    assert!(took > 0.0 && took < 5.0, "{took}");
    assert_eq!(m.sum("narad_schema_validations_total", &[]), 5.0);
    let r = c.post_json(
        "/v1/topics/pay/produce/batch",
        r#"{"messages":[{"payload":{"id":"ok"}},{"payload":{"id":2}}]}"#,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    c.create_topic("later", 3);
    let r = c.post_json(
        "/v1/topics",
        r#"{"name":"lag","parent":"later","fanout_delay_ms":1000}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let r = c.post_client("/v1/topics/lag/produce", br#"{"x":1}"#);
    assert_eq!(r.status, 409, "{}", r.text());
    let m = scrape(&mut c);
    let rejected = |t: &str, r: &str| {
        m.sum(
            "narad_produce_rejections_total",
            &[("topic", t), ("reason", r)],
        )
    };
    assert_eq!(rejected("pay", "schema"), 4.0);
    assert_eq!(rejected("lag", "delayed_child"), 1.0);
    assert_eq!(rejected("later", "schema"), 0.0);
    assert_eq!(m.types["narad_produce_rejections_total"], "counter");
}

#[test]
fn fanout_copies_and_lag_are_exported() {
    // Proves the §9.4 local fan-out series: with an immediate child and a child delayed 60 s
    // attached to a 3-partition parent, 20 produces give `narad_fanout_committed_total` 20 (only
    // the immediate child copies), lag 0 for it and 20 for the delayed child (one series per
    // (parent, child)), copied-batch histograms holding those 20 records and their bytes, and no
    // dropped, unreadable or failed copies. Also that the auth gauge is exported (0: security
    // is off) and `narad_colocated_child_partitions` counts the children's partitions.
    let dir = TempDir::new("m-fanout");
    let s = Server::start(&dir);
    let mut c = s.client();
    for t in ["par", "kid", "late"] {
        c.create_topic(t, 3);
    }
    let m = scrape(&mut c);
    assert_eq!(m.count("narad_fanout_lag_messages"), 0, "no links yet");
    assert_eq!(m.sum("narad_fanout_committed_total", &[]), 0.0);
    assert_eq!(m.sum("narad_fanout_batch_records_count", &[]), 0.0);
    assert_eq!(m.sum("narad_colocated_child_partitions", &[]), 0.0);
    for (child, delay) in [("kid", 0), ("late", 60_000)] {
        let r = c.post_json(
            "/v1/topics/par/children",
            &format!(r#"{{"child":"{child}","delay_ms":{delay}}}"#),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    for i in 0..20 {
        let r = c.post_client(&format!("/v1/topics/par/produce?key=k{i}"), b"{}");
        assert_eq!(r.status, 202, "{}", r.text());
    }
    let lag = |m: &Exposition, child: &str| {
        m.sum(
            "narad_fanout_lag_messages",
            &[("parent", "par"), ("child", child)],
        )
    };
    let m = scrape_until(&mut c, "20 copies and settled lags", |m| {
        m.sum("narad_fanout_committed_total", &[]) == 20.0
            && lag(m, "kid") == 0.0
            && lag(m, "late") == 20.0
    });
    // One lag series per (parent, child, partition): 2 children × 3 parent partitions.
    assert_eq!(m.count("narad_fanout_lag_messages"), 6);
    for p in ["0", "1", "2"] {
        assert_eq!(
            m.count_with(
                "narad_fanout_lag_messages",
                &[("parent", "par"), ("child", "kid"), ("partition", p)]
            ),
            1
        );
    }
    // Copy counters per (parent, child); the delayed child has its series at 0.
    let link = |m: &Exposition, name: &str, child: &str| {
        m.sum(name, &[("parent", "par"), ("child", child)])
    };
    assert_eq!(link(&m, "narad_fanout_committed_total", "kid"), 20.0);
    assert_eq!(link(&m, "narad_fanout_committed_total", "late"), 0.0);
    assert_eq!(m.count("narad_fanout_committed_total"), 2);
    assert_eq!(m.count("narad_fanout_child_dropped_messages"), 2);
    // The delayed child waits for records that are not due: no due lag; nor for the caught-up one.
    assert_eq!(m.count("narad_fanout_due_lag_seconds"), 6);
    assert_eq!(m.sum("narad_fanout_due_lag_seconds", &[]), 0.0);
    assert_eq!(m.sum("narad_fanout_child_dropped_messages", &[]), 0.0);
    assert_eq!(m.sum("narad_fanout_unreadable_skipped_total", &[]), 0.0);
    assert_eq!(m.sum("narad_fanout_copy_failures_total", &[]), 0.0);
    assert_eq!(m.types["narad_fanout_lag_messages"], "gauge");
    assert_eq!(m.types["narad_fanout_child_dropped_messages"], "counter");
    assert_eq!(m.count("narad_auth_verify_queued"), 1);
    assert_eq!(m.sum("narad_auth_verify_queued", &[]), 0.0);
    // Copied batches: every record in one of them; payloads are `{}` (2 bytes).
    assert_eq!(m.sum("narad_fanout_batch_records_sum", &[]), 20.0);
    let batches = m.sum("narad_fanout_batch_records_count", &[]);
    assert!((1.0..=20.0).contains(&batches), "{batches}");
    assert_eq!(m.sum("narad_fanout_batch_bytes_count", &[]), batches);
    assert_eq!(m.sum("narad_fanout_batch_bytes_sum", &[]), 40.0);
    assert_eq!(m.types["narad_fanout_batch_records"], "histogram");
    assert_eq!(m.types["narad_fanout_batch_bytes"], "histogram");
    // Both children's 3 partitions sit with the parent's partition of the same index.
    assert_eq!(m.sum("narad_colocated_child_partitions", &[]), 6.0);
    // The copies are in the child: its consumers see them.
    let r = c.get("/v1/topics/kid/consume");
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn oversized_bodies_are_counted_under_their_route_and_method() {
    // Proves OPERATIONS.md §9.1 for answers the HTTP layer gives before the handler runs, once the
    // request head parsed: a body over the route's cap (by Content-Length, or found while reading
    // a chunked body) is counted under the matched route and the real method, not as
    // `route="unmatched",method="OTHER"`.
    use std::io::{Read, Write};
    let dir = TempDir::new("metrics-413");
    let s = Server::start(&dir);
    let mut c = s.client();
    c.create_topic("lim", 3);
    let big = vec![b'a'; (1 << 20) + 1];
    let r = c.post_client("/v1/topics/lim/produce", &big);
    assert_eq!(r.status, 413, "{}", r.text());
    c.reconnect();
    let body = format!(r#"{{"name":"{}"}}"#, "x".repeat(1 << 20));
    assert_eq!(c.post_json("/v1/topics", &body).status, 413);
    c.reconnect();
    let body = format!(r#"{{"child":"{}"}}"#, "x".repeat(1 << 20));
    assert_eq!(c.post_json("/v1/topics/lim/children", &body).status, 400);
    c.reconnect();
    // A chunked produce body that overruns the cap while it is read.
    let mut t = std::net::TcpStream::connect(s.addr()).unwrap();
    t.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut req = b"POST /v1/topics/lim/produce HTTP/1.1\r\nHost: x\r\nX-Narad-Client: t\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    req.extend_from_slice(format!("{:x}\r\n", big.len()).as_bytes());
    req.extend_from_slice(&big);
    req.extend_from_slice(b"\r\n0\r\n\r\n");
    let _ = t.write_all(&req);
    let _ = t.shutdown(std::net::Shutdown::Write);
    let mut answer = Vec::new();
    let _ = t.read_to_end(&mut answer);
    assert!(answer.starts_with(b"HTTP/1.1 413 "), "{answer:?}");

    let m = scrape(&mut c);
    let produce = [
        ("route", "POST /v1/topics/{topic}/produce"),
        ("method", "POST"),
        ("status", "413"),
    ];
    assert_eq!(m.sum("narad_http_requests_total", &produce), 2.0);
    let create = [
        ("route", "POST /v1/topics"),
        ("method", "POST"),
        ("status", "413"),
    ];
    assert_eq!(m.sum("narad_http_requests_total", &create), 1.0);
    let attach = [
        ("route", "POST /v1/topics/{parent}/children"),
        ("method", "POST"),
        ("status", "400"),
    ];
    assert_eq!(m.sum("narad_http_requests_total", &attach), 1.0);
    assert_eq!(
        m.sum("narad_http_requests_total", &[("method", "OTHER")]),
        0.0
    );
}

/// A server on a fresh data directory with the test knobs `knobs` (name, value).
fn start_with_knobs(dir: &TempDir, knobs: &[(&str, &str)]) -> Server {
    let env = knobs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Server::start_with(dir.0.join("data"), env)
}

#[test]
fn idle_partition_logs_close_and_reopen_on_use() {
    // Proves storage.idle_log_eviction_ms (300 ms here, through a test knob; the setting's floor
    // is a minute): once checkpointed and idle, every partition log closes its file
    // (`narad_open_partition_logs` 0, `narad_idle_logs_evicted_total` counts them); consumes
    // still read every message, and a produce reopens the log it writes to.
    let dir = TempDir::new("m-idle");
    let s = start_with_knobs(
        &dir,
        &[
            ("NARAD_TEST_IDLE_EVICTION_MS", "300"),
            ("NARAD_TEST_CHECKPOINT_INTERVAL_MS", "50"),
        ],
    );
    let mut c = s.client();
    c.create_topic("idle", 3);
    for p in 0..3 {
        for i in 0..4 {
            let r = c.post_client(
                &format!("/v1/topics/idle/produce?partition={p}"),
                format!("\"{p}-{i}\"").as_bytes(),
            );
            assert_eq!(r.status, 202, "{}", r.text());
        }
    }
    let m = scrape_until(&mut c, "all logs idle-evicted", |m| {
        m.sum("narad_open_partition_logs", &[]) == 0.0
    });
    assert!(m.sum("narad_idle_logs_evicted_total", &[]) >= 3.0);
    let mut got = Vec::new();
    for _ in 0..12 {
        let r = c.get("/v1/topics/idle/consume");
        assert_eq!(r.status, 200, "{}", r.text());
        got.push(r.json()["payload"].as_str().unwrap().to_string());
    }
    got.sort();
    let mut want: Vec<String> = (0..3)
        .flat_map(|p| (0..4).map(move |i| format!("{p}-{i}")))
        .collect();
    want.sort();
    assert_eq!(got, want);
    let r = c.post_client("/v1/topics/idle/produce?partition=1", b"\"again\"");
    assert_eq!(r.status, 202, "{}", r.text());
    let r = c.get("/v1/topics/idle/consume?partition=1&offset=4");
    assert_eq!(r.json()["payload"], "again");
}

#[test]
fn retention_sweeps_partition_logs_closed_for_idleness() {
    // Proves `narad_cold_retention_swept_total`: retention covers a partition whose log was
    // closed for idleness (cold). A topic kept forever fills several segments and its logs
    // close; once its retention is set to 1 h (judged with the clock 2 h ahead) the next pass
    // deletes the sealed segments of the closed log, and the counter counts that partition
    // while `narad_open_partition_logs` stays 0 (the sweep does not reopen the log).
    let dir = TempDir::new("m-cold");
    let s = start_with_knobs(
        &dir,
        &[
            ("NARAD_TEST_IDLE_EVICTION_MS", "300"),
            ("NARAD_TEST_CHECKPOINT_INTERVAL_MS", "50"),
            ("NARAD_TEST_PARTITION_SEGMENT_BYTES", "65536"),
            ("NARAD_TEST_RETENTION_INTERVAL_MS", "100"),
            ("NARAD_TEST_RETENTION_CLOCK_SKEW_MS", "7200000"),
        ],
    );
    let mut c = s.client();
    let r = c.post_json(
        "/v1/topics",
        r#"{"name":"cold","partitions":3,"retention_ms":0}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let body = format!(r#"{{"pad":"{}"}}"#, "x".repeat(1000));
    for _ in 0..300 {
        let r = c.post_client("/v1/topics/cold/produce?partition=0", body.as_bytes());
        assert_eq!(r.status, 202, "{}", r.text());
    }
    let p0 = [("topic", "cold"), ("partition", "0")];
    let m = scrape_until(&mut c, "every log closed", |m| {
        m.sum("narad_open_partition_logs", &[]) == 0.0
    });
    assert!(m.sum("narad_segments", &p0) > 1.0, "several segments");
    assert_eq!(m.sum("narad_cold_retention_swept_total", &[]), 0.0);
    let r = c.patch_json("/v1/topics/cold", r#"{"retention_ms":3600000}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    let m = scrape_until(&mut c, "the closed log swept", |m| {
        m.sum("narad_segments", &p0) == 1.0
    });
    assert_eq!(m.sum("narad_cold_retention_swept_total", &[]), 1.0);
    assert_eq!(m.sum("narad_open_partition_logs", &[]), 0.0);
    assert_eq!(m.types["narad_cold_retention_swept_total"], "counter");
}

#[test]
fn housekeeping_loops_recover_from_a_panic() {
    // Proves a panic in a retention pass or in the lease-expiry loop is recovered on each shard
    // (NARAD_TEST_PANIC makes the first pass of both panic on both shards): the node keeps
    // serving, `narad_cold_retention_panics_total` and `narad_reaper_restarts` count them, and
    // both loops go on working: retention still deletes old segments, and a lease left to lapse
    // is expired by the sweep (no consume runs that could find it instead).
    let dir = TempDir::new("m-panic");
    let s = start_with_knobs(
        &dir,
        &[
            ("NARAD_TEST_PANIC", "retention,sweep"),
            ("NARAD_TEST_PARTITION_SEGMENT_BYTES", "65536"),
            ("NARAD_TEST_RETENTION_INTERVAL_MS", "100"),
            ("NARAD_TEST_RETENTION_CLOCK_SKEW_MS", "7200000"),
        ],
    );
    let mut c = s.client();
    let m = scrape_until(&mut c, "both loops panicked on both shards", |m| {
        m.sum("narad_cold_retention_panics_total", &[]) == 2.0
            && m.sum("narad_reaper_restarts", &[]) == 2.0
    });
    assert_eq!(m.types["narad_cold_retention_panics_total"], "counter");
    let r = c.post_json(
        "/v1/topics",
        r#"{"name":"old","partitions":3,"retention_ms":3600000}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let r = c.post_json(
        "/v1/topics",
        r#"{"name":"lease","partitions":3,"visibility_timeout_ms":1000}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let r = c.post_client("/v1/topics/lease/produce", b"one");
    assert_eq!(r.status, 202, "{}", r.text());
    let body = format!(r#"{{"pad":"{}"}}"#, "x".repeat(1000));
    for p in [0, 1] {
        for _ in 0..150 {
            let r = c.post_client(
                &format!("/v1/topics/old/produce?partition={p}"),
                body.as_bytes(),
            );
            assert_eq!(r.status, 202, "{}", r.text());
        }
    }
    let first = c.get("/v1/topics/lease/consume");
    assert_eq!(first.status, 200, "{}", first.text());
    let m = scrape_until(&mut c, "retention and lease expiry after the panics", |m| {
        m.sum("narad_segments", &[("topic", "old"), ("partition", "0")]) == 1.0
            && m.sum("narad_segments", &[("topic", "old"), ("partition", "1")]) == 1.0
            && m.sum("narad_lease_expired_total", &[("topic", "lease")]) == 1.0
    });
    assert_eq!(m.sum("narad_cold_retention_panics_total", &[]), 2.0);
    assert_eq!(m.sum("narad_reaper_restarts", &[]), 2.0);
}

#[test]
fn a_panic_nothing_catches_stops_the_node() {
    // Proves a panic that ends one shard (NARAD_TEST_PANIC=detached: a task of the last shard)
    // stops the whole node with a failure exit, instead of leaving it half served.
    let dir = TempDir::new("m-panic-stop");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_narad"));
    cmd.args(["server", "start", "--dev", "--port"])
        .arg(common::free_port_pair().to_string())
        .arg("--data-dir")
        .arg(dir.0.join("data"))
        .env("NARAD_SHARDS", "2")
        .env("NARAD_TEST_PANIC", "detached");
    let (status, stderr) = common::run_to_exit(cmd, Duration::from_secs(40));
    let status = status.unwrap_or_else(|| panic!("still running after 40 s: {stderr}"));
    assert!(!status.success(), "{status}: {stderr}");
    assert!(
        stderr.contains("a panic ended this shard; the node stops"),
        "{stderr}"
    );
}

#[test]
fn storage_series_follow_writes_checkpoints_and_retention() {
    // Proves the §9.5 per-partition series: segment writes (flush) count with their frame bytes,
    // which with the 40-byte segment headers make up the partition's size; checkpoints (every
    // 50 ms here) time the partition's fsyncs and its high-watermark persist (outcome ok, no
    // error); retention (1 h, judged with the clock 2 h ahead, every 100 ms) deletes the sealed
    // segments of the partition it applies to and counts exactly the offsets it deleted, the
    // bytes and one timed pass per run, and a topic kept forever has no retention pass. A
    // partition never written has counters at 0 and no histograms.
    let dir = TempDir::new("m-storage");
    let s = start_with_knobs(
        &dir,
        &[
            ("NARAD_TEST_PARTITION_SEGMENT_BYTES", "65536"),
            ("NARAD_TEST_RETENTION_INTERVAL_MS", "100"),
            ("NARAD_TEST_RETENTION_CLOCK_SKEW_MS", "7200000"),
            ("NARAD_TEST_CHECKPOINT_INTERVAL_MS", "50"),
        ],
    );
    let mut c = s.client();
    let r = c.post_json(
        "/v1/topics",
        r#"{"name":"logs","partitions":3,"retention_ms":3600000}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let r = c.post_json(
        "/v1/topics",
        r#"{"name":"keep","partitions":3,"retention_ms":0}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let body = format!(r#"{{"pad":"{}"}}"#, "x".repeat(1000));
    for _ in 0..400 {
        let r = c.post_client("/v1/topics/logs/produce?partition=0", body.as_bytes());
        assert_eq!(r.status, 202, "{}", r.text());
    }
    for _ in 0..5 {
        let r = c.post_client("/v1/topics/keep/produce?partition=0", body.as_bytes());
        assert_eq!(r.status, 202, "{}", r.text());
    }
    let p = |t: &'static str, n: &'static str| [("topic", t), ("partition", n)];
    // Retention leaves only the active segment; a checkpoint ran after the last write.
    let m = scrape_until(
        &mut c,
        "retention down to one segment and a checkpoint",
        |m| {
            m.sum("narad_segments", &p("logs", "0")) == 1.0
                && m.sum(
                    "narad_storage_retention_messages_deleted_total",
                    &p("logs", "0"),
                ) > 0.0
                && m.sum(
                    "narad_storage_high_watermark_persist_duration_seconds_count",
                    &p("keep", "0"),
                ) >= 1.0
        },
    );
    let v = c.get("/v1/topics/logs?partition=0").json();
    let oldest = v["partition_stats"][0]["oldest_offset"].as_u64().unwrap();
    assert!(oldest > 0, "{v}");
    // Samples match when their labels include these (`reason="age"` on the retention counters).
    let logs0 = |name: &str| m.sum(name, &p("logs", "0"));
    assert!(m
        .samples
        .iter()
        .filter(|s| s.name.starts_with("narad_storage_retention_") && s.name.ends_with("_total"))
        .all(|s| s.labels.get("reason").map(String::as_str) == Some("age")));
    assert_eq!(
        logs0("narad_storage_retention_messages_deleted_total"),
        oldest as f64,
        "every offset below the oldest one was deleted by retention"
    );
    let deleted = logs0("narad_storage_retention_bytes_deleted_total");
    assert!(deleted >= oldest as f64 * 1000.0, "{deleted} for {oldest}");
    assert!(logs0("narad_storage_retention_run_duration_seconds_count") >= 1.0);
    let flushed = logs0("narad_storage_flush_bytes_total");
    assert!(flushed >= 400.0 * 1000.0, "{flushed}");
    let writes = logs0("narad_storage_flush_duration_seconds_count");
    assert!((1.0..=400.0).contains(&writes), "{writes}");
    assert!(logs0("narad_storage_fsync_duration_seconds_count") >= 1.0);
    // Without retention the written frames and the headers are the partition's whole size.
    let keep0 = p("keep", "0");
    let headers = 40.0 * m.sum("narad_segments", &keep0);
    assert_eq!(
        m.sum("narad_storage_flush_bytes_total", &keep0) + headers,
        m.sum("narad_partition_size_bytes", &keep0)
    );
    assert!(m.sum("narad_storage_flush_bytes_total", &keep0) >= 5000.0);
    assert!(m.sum("narad_storage_fsync_duration_seconds_count", &keep0) >= 1.0);
    let persist = "narad_storage_high_watermark_persist_duration_seconds_count";
    let outcome = |t, o| m.sum(persist, &[("topic", t), ("partition", "0"), ("outcome", o)]);
    assert!(outcome("keep", "ok") >= 1.0);
    assert!(outcome("logs", "ok") >= 1.0);
    assert_eq!(outcome("keep", "error") + outcome("logs", "error"), 0.0);
    assert_eq!(
        m.sum("narad_storage_retention_run_duration_seconds_count", &keep0),
        0.0,
        "retention_ms 0 keeps forever: no pass"
    );
    assert_eq!(
        m.sum(
            "narad_storage_retention_bytes_deleted_total",
            &[("topic", "keep")]
        ),
        0.0
    );
    // A partition never written: zero counters, no histogram series.
    let logs2 = p("logs", "2");
    assert_eq!(m.sum("narad_storage_flush_bytes_total", &logs2), 0.0);
    assert!(!m.samples.iter().any(
        |s| s.name.starts_with("narad_storage_flush_duration_seconds")
            && s.labels.get("topic").map(String::as_str) == Some("logs")
            && s.labels.get("partition").map(String::as_str) == Some("2")
    ));
    assert_eq!(m.count("narad_storage_flush_bytes_total"), 6);
    assert_eq!(m.count("narad_storage_retention_messages_deleted_total"), 6);
    for (name, ty) in [
        ("narad_storage_flush_duration_seconds", "histogram"),
        ("narad_storage_fsync_duration_seconds", "histogram"),
        (
            "narad_storage_high_watermark_persist_duration_seconds",
            "histogram",
        ),
        ("narad_storage_retention_run_duration_seconds", "histogram"),
        ("narad_storage_flush_bytes_total", "counter"),
        ("narad_storage_retention_bytes_deleted_total", "counter"),
        ("narad_storage_retention_messages_deleted_total", "counter"),
    ] {
        assert_eq!(m.types[name], ty, "{name}");
    }
    let storage_errors = m.sum("narad_errors_total", &[("component", "storage")]);
    assert_eq!(storage_errors, 0.0);
}

#[test]
fn oldest_unconsumed_age_grows_until_the_oldest_is_acked() {
    // Proves `narad_oldest_unconsumed_message_age_seconds{topic,partition}` (§9.2): the age of the
    // oldest record not yet acked grows while it waits, stays while it is only leased and while
    // a newer record is acked ahead of it, and drops to 0 once it is acked; partitions with
    // nothing waiting report 0.
    let dir = TempDir::new("m-oldest");
    let s = Server::start(&dir);
    let mut c = s.client();
    c.create_topic("q", 3);
    let age = |m: &Exposition, p: &'static str| {
        m.sum(
            "narad_oldest_unconsumed_message_age_seconds",
            &[("topic", "q"), ("partition", p)],
        )
    };
    let m = scrape(&mut c);
    assert_eq!(m.count("narad_oldest_unconsumed_message_age_seconds"), 3);
    assert_eq!(age(&m, "1"), 0.0);
    assert_eq!(
        m.types["narad_oldest_unconsumed_message_age_seconds"],
        "gauge"
    );
    for body in [&b"first"[..], b"second"] {
        let r = c.post_client("/v1/topics/q/produce?partition=1", body);
        assert_eq!(r.status, 202, "{}", r.text());
    }
    std::thread::sleep(Duration::from_millis(1100));
    let m = scrape(&mut c);
    let waited = age(&m, "1");
    assert!((1.0..60.0).contains(&waited), "{waited}");
    assert_eq!(age(&m, "0") + age(&m, "2"), 0.0);
    std::thread::sleep(Duration::from_millis(300));
    let m = scrape(&mut c);
    assert!(
        age(&m, "1") >= waited + 0.25,
        "{} after {waited}",
        age(&m, "1")
    );

    let handle = |r: &common::Resp| r.json()["receipt_handle"].as_str().unwrap().to_string();
    let first = c.get("/v1/topics/q/consume?partition=1");
    assert_eq!(first.status, 200, "{}", first.text());
    let second = c.get("/v1/topics/q/consume?partition=1");
    assert_eq!(second.status, 200, "{}", second.text());
    assert_eq!(second.json()["offset"], 1);
    let ack = |c: &mut Client, h: &str| {
        let r = c.post_client(&format!("/v1/topics/q/ack?receipt_handle={h}"), b"");
        assert_eq!(r.status, 204, "{}", r.text());
    };
    // Leased is not acked; the newer record acked ahead leaves the older one waiting.
    ack(&mut c, &handle(&second));
    let m = scrape(&mut c);
    assert!(age(&m, "1") >= waited, "{}", age(&m, "1"));
    ack(&mut c, &handle(&first));
    let m = scrape(&mut c);
    assert_eq!(age(&m, "1"), 0.0);
    assert_eq!(m.sum("narad_consumer_lag_messages", &[("topic", "q")]), 0.0);
}

#[test]
fn metastore_snapshots_are_measured() {
    // Proves the §9.6 metastore series: before any snapshot its size and duration are 0; with
    // the metadata group snapshotting every 3 entries (cluster.raft_snapshot_threshold, by env),
    // creating topics writes one whose size is the size of `metastore/snapshot.json` and whose
    // duration is above 0, with no failure, no apply error, and the group still applying.
    let dir = TempDir::new("m-snapshot");
    let plain = Server::start(&dir);
    let m = scrape(&mut plain.client());
    assert_eq!(m.sum("narad_metastore_snapshot_bytes", &[]), 0.0);
    assert_eq!(m.sum("narad_metastore_snapshot_duration_seconds", &[]), 0.0);
    drop(plain);

    let dir = TempDir::new("m-snapshot-3");
    let s = start_with_knobs(&dir, &[("NARAD_CLUSTER_RAFT_SNAPSHOT_THRESHOLD", "3")]);
    let mut c = s.client();
    for i in 0..6 {
        c.create_topic(&format!("t{i}"), 3);
    }
    let file = s.data_dir().join("metastore").join("snapshot.json");
    let m = scrape_until(&mut c, "a metadata snapshot", |m| {
        let bytes = m.sum("narad_metastore_snapshot_bytes", &[]);
        bytes > 0.0 && std::fs::metadata(&file).is_ok_and(|f| f.len() as f64 == bytes)
    });
    assert!(m.sum("narad_metastore_snapshot_duration_seconds", &[]) > 0.0);
    assert_eq!(m.sum("narad_metastore_snapshot_failures_total", &[]), 0.0);
    assert_eq!(
        m.sum("narad_metastore_apply_errors_total", &[("kind", "storage")]),
        0.0
    );
    assert_eq!(m.count("narad_metastore_apply_errors_total"), 1);
    assert_eq!(m.sum("narad_metastore_apply_stopped", &[]), 0.0);
    for (name, ty) in [
        ("narad_metastore_snapshot_bytes", "gauge"),
        ("narad_metastore_snapshot_duration_seconds", "gauge"),
        ("narad_metastore_snapshot_failures_total", "counter"),
        ("narad_metastore_apply_errors_total", "counter"),
        ("narad_metastore_apply_stopped", "gauge"),
    ] {
        assert_eq!(m.types[name], ty, "{name}");
    }
}

#[test]
fn node_health_errors_and_single_node_cluster_series() {
    // Proves on a secured node with `remotes.allowed_hosts` set: `narad_remotes_allowlist_configured`
    // 1 (0 on a dev node), `narad_errors_total{component="http",kind="5xx"}` counts a 501 (the
    // remote-child attach this build answers so) and nothing for 4xx, the storage kinds stay 0;
    // `narad_orphan_topic_dirs` counts a topic directory whose topic the metadata does not know
    // and not the directories of live topics; and the single-node values of the cluster series
    // (no moves, no decommission reasons, no dispatch backlog, no remotes over plaintext Raft).
    let dir = TempDir::new("m-health");
    let dev = Server::start(&dir);
    let m = scrape(&mut dev.client());
    assert_eq!(m.sum("narad_remotes_allowlist_configured", &[]), 0.0);
    drop(dev);

    // Bound and dropped: nothing listens there afterwards.
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let pw = "metrics-admin-password-1";
    let env = vec![
        ("NARAD_ADMIN_PASSWORD".to_string(), pw.to_string()),
        (
            "NARAD_HTTP_METRICS_UNAUTHENTICATED".to_string(),
            "true".to_string(),
        ),
        (
            "NARAD_REMOTES_ALLOWED_HOSTS".to_string(),
            "narad.example.com,127.0.0.1".to_string(),
        ),
        // A remote on a loopback port nothing listens on: its attach answers 503.
        (
            "NARAD_REMOTES_ALLOWED_PORTS".to_string(),
            closed_port.to_string(),
        ),
        (
            "NARAD_REMOTES_ALLOW_ADDRESSES".to_string(),
            "127.0.0.1/32".to_string(),
        ),
        (
            "NARAD_CLUSTER_SECRET".to_string(),
            "a-cluster-secret-of-the-metrics-test".to_string(),
        ),
        (
            "NARAD_REMOTES_API_HOP_ENCRYPTED".to_string(),
            "true".to_string(),
        ),
    ];
    let dir = TempDir::new("m-health-secure");
    let s = Server::start_secure(dir.0.join("data"), env);
    let mut c = s.client();
    let auth = common::basic_auth("admin", pw);
    let admin = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
    ];
    let r = c.request("POST", "/v1/topics", &admin, br#"{"name":"rp"}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    let r = c.request(
        "POST",
        "/v1/topics/rp/produce",
        &[("Authorization", auth.as_str()), ("X-Narad-Client", "t")],
        b"x",
    );
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(c.get("/v1/topics").status, 401);
    let m = scrape(&mut c);
    let errors = |m: &Exposition, component, kind| {
        m.sum(
            "narad_errors_total",
            &[("component", component), ("kind", kind)],
        )
    };
    assert_eq!(errors(&m, "http", "5xx"), 0.0, "a 401 is not an error");
    assert_eq!(m.sum("narad_remotes_allowlist_configured", &[]), 1.0);
    assert_eq!(m.sum("narad_orphan_topic_dirs", &[]), 0.0, "rp is live");
    let body = format!(
        r#"{{"name":"b","url":"https://127.0.0.1:{closed_port}","username":"r","password":"a-replicator-password-0123456789"}}"#
    );
    let r = c.request("POST", "/v1/remotes", &admin, body.as_bytes());
    assert_eq!(r.status, 201, "{}", r.text());
    let r = c.request(
        "POST",
        "/v1/topics/rp/children",
        &admin,
        br#"{"child":"rp-to-b","remote":"b"}"#,
    );
    assert_eq!(r.status, 503, "the target does not answer: {}", r.text());
    assert_eq!(r.json()["class"], "unavailable", "{}", r.text());
    std::fs::create_dir_all(s.data_dir().join("topics").join("00000000deadbeef")).unwrap();
    let m = scrape(&mut c);
    assert_eq!(errors(&m, "http", "5xx"), 1.0);
    for kind in ["fsync_poisoned", "checkpoint", "retention_unlink"] {
        assert_eq!(errors(&m, "storage", kind), 0.0, "{kind}");
    }
    assert_eq!(m.count("narad_errors_total"), 4);
    assert_eq!(m.types["narad_errors_total"], "counter");
    assert_eq!(m.sum("narad_orphan_topic_dirs", &[]), 1.0);
    // A node that is its whole cluster.
    for name in [
        "narad_remotes_plaintext_raft",
        "narad_ingress_dispatch_backlog_records",
        "narad_moves_inflight",
        "narad_moves_total",
        "narad_moves_bytes_total",
        "narad_moves_blocked",
        "narad_moves_duration_seconds_count",
        "narad_quarantined_copies",
        "narad_quarantined_bytes",
        "narad_member_heartbeat_failures",
        "narad_dead_marking_refused",
        "narad_cold_retention_panics_total",
        "narad_reaper_restarts",
        "narad_metastore_apply_stalled",
        "narad_remote_held_bytes",
        "narad_remote_seals_total",
        "narad_remote_reseal_opens_total",
    ] {
        assert!(m.count(name) >= 1, "{name} missing");
        assert_eq!(m.sum(name, &[]), 0.0, "{name}");
    }
    // Families of the planes this build does not run are declared with their type, no series.
    for (name, kind) in [
        ("narad_fanout_remote_state", "gauge"),
        ("narad_remote_requests_total", "counter"),
        ("narad_remote_request_seconds", "histogram"),
        ("narad_remote_destination_refused_total", "counter"),
        ("narad_raft_tls_cert_not_after_seconds", "gauge"),
        ("narad_cluster_rpc_requests_total", "counter"),
        ("narad_cluster_rpc_request_seconds", "histogram"),
    ] {
        assert_eq!(m.types.get(name).map(String::as_str), Some(kind), "{name}");
        assert_eq!(m.count(name), 0, "{name}");
    }
    // The metastore's files, and timestamps of this scrape's collection (within a minute).
    assert!(m.sum("narad_metastore_fsm_bytes", &[]) > 0.0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    for (name, labels) in [
        (
            "narad_member_heartbeat_last_success_timestamp_seconds",
            &[][..],
        ),
        (
            "narad_poller_last_success_timestamp_seconds",
            &[("loop", "vitals")][..],
        ),
        (
            "narad_poller_last_success_timestamp_seconds",
            &[("loop", "inventory")][..],
        ),
    ] {
        let at = m.sum(name, labels);
        assert!((now - at).abs() < 60.0, "{name} {labels:?}: {at} vs {now}");
    }
    // Every reason of §9.3 and §9.1 rejections is present from the start.
    assert_eq!(m.count("narad_schema_rejections_total"), 7);
    for reason in ["canceled", "definition_paths", "definition_pattern"] {
        assert_eq!(
            m.count_with("narad_schema_rejections_total", &[("reason", reason)]),
            1,
            "{reason}"
        );
    }
    assert_eq!(m.count("narad_moves_blocked"), 4);
    assert_eq!(m.count("narad_moves_total"), 2);
    assert_eq!(m.types["narad_decommission_blocked"], "gauge");
    assert_eq!(m.count("narad_decommission_blocked"), 0, "no node drains");
    assert_eq!(m.sum("narad_colocated_child_partitions", &[]), 0.0);
}
