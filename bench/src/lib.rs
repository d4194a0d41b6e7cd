//! narad-bench: the load generator behind `narad bench` and `bench/run.sh` (issue 4).
//!
//! It speaks HTTP/1.1 with keep-alive over many connections to one URL (or spread round-robin
//! over several, the nodes of a cluster behind a load balancer) and runs the workloads
//! W1 (single produces), W2 (batch produces), W3 (produce + batch consume + batch ack, then a
//! drain and a check that every accepted message was acked), and W4 (open-loop single produces
//! at a fixed offered load, latency from the scheduled send). It prints msg/s, MB/s, latency
//! percentiles, errors by status and the CPU seconds of the server and of itself, as a table or
//! JSON, optionally as a ratio to a ceiling measured in the same run against a server that does
//! nothing (nginx answering 202).
//!
//! Every run is bounded: it stops producing after `--duration` (or `--count` messages), drains
//! for at most `--drain-timeout`, and every request times out.
//!
//! Owns the client side only: never links the broker, never touches its data directory.
//! Modules: `engine` (epoll connection loop), `workload` (what each connection sends), `http`
//! (wire format), `hist` (latency histogram), `report` (figures, table, JSON, check), `cpu`.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant};

pub mod cpu;
pub mod engine;
pub mod hist;
pub mod http;
pub mod report;
pub mod workload;

use engine::{Connection, Driver, Kind, ThreadStats, Tracking, Window, KINDS};
use http::Target;
pub use report::{Check, Latency, Report, RunReport, ServerUsage};
use workload::{
    Consumer, ConsumerConfig, PayloadEncoding, Producer, ProducerConfig, Schedule, Shared,
    BATCH_MESSAGES_MAX, CONSUME_MAX, PAYLOAD_BYTES_MIN, TRACKED_MESSAGES_MAX,
};

/// Generator threads at most (each drives its share of the connections).
pub const THREADS_MAX: usize = 64;
/// Connections per role at most.
pub const CONNECTIONS_MAX: usize = 4096;
/// Where the generator sends requests when no URL is given.
pub const DEFAULT_URL: &str = "http://127.0.0.1:7942";
/// Longest `--duration` and `--drain-timeout` accepted.
pub const RUN_SECONDS_MAX: u64 = 3600;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// Single produces, closed loop.
    W1,
    /// Batch produces, closed loop.
    W2,
    /// Batch produces with concurrent batch consume + batch ack, then drain and check.
    W3,
    /// Single produces on an open-loop schedule at each `--rate`.
    W4,
    /// W1, W2, W3, then W4 at each `--rate` (default 10000 and half of W1's rate).
    All,
}

/// `narad bench` flags. The original's (`<topic> --count --size --workers --consume`) keep their
/// meaning; the rest select and shape the workloads of issue 4.
#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
    /// Topic to use, created if missing (with `--workload all`: `<topic>-w1`, `-w2`, ...).
    #[arg(default_value = "bench")]
    pub topic: String,
    /// Broker URL, `http://host:port` (default: the CLI's server, else http://127.0.0.1:7942).
    /// A comma list of URLs (the nodes of a cluster) spreads the connections over them
    /// round-robin, as a load balancer would: producer connection i goes to URL i mod n, consumer
    /// connection j to URL (producers + j) mod n. Topics are created through the first URL.
    #[arg(long)]
    pub url: Option<String>,
    #[arg(long, value_enum, default_value = "w1")]
    pub workload: Workload,
    /// Stop producing after this many messages (in addition to `--duration`).
    #[arg(long)]
    pub count: Option<u64>,
    /// Payload bytes per message (ids are embedded from 31 bytes up).
    #[arg(long, default_value_t = 256)]
    pub size: usize,
    /// Producer connections (default: W1 64, W2 16, W3 16, W4 64).
    #[arg(long, visible_alias = "connections")]
    pub workers: Option<usize>,
    /// After producing, drain the topic with batch consume + ack and check nothing was lost.
    #[arg(long)]
    pub consume: bool,
    /// Messages per batch produce (W2/W3 default 100, at most 1000; W4 default 1).
    #[arg(long)]
    pub batch: Option<usize>,
    /// Consumer connections (W3 and `--consume`). The default 10 keeps 10 x `--consume-max` 100
    /// within the broker's per-identity consume cap (1024 records in flight per client IP with
    /// security off, API.md §4): more would be answered 429 by design.
    #[arg(long, default_value_t = 10)]
    pub consumers: usize,
    /// Records per batch consume (1..100).
    #[arg(long, default_value_t = 100)]
    pub consume_max: usize,
    /// Consumers take one message per consume (no `max`: one Message object) and ack it alone
    /// with `?receipt_handle=`, what the Go SDK's `Receive` + `Ack` send (W3, `--consume`).
    #[arg(long)]
    pub single_consume: bool,
    /// Long-poll wait of each consume, milliseconds.
    #[arg(long, default_value_t = 200)]
    pub consume_wait_ms: u64,
    /// W4 offered loads in messages per second, comma separated.
    #[arg(long, value_delimiter = ',')]
    pub rate: Vec<f64>,
    /// W4: give each connection its own fixed share of the schedule (a late answer delays that
    /// connection's next sends) instead of sending each due request on the first free
    /// connection.
    #[arg(long)]
    pub per_connection_schedule: bool,
    /// How long each workload produces, seconds (warm-up included).
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Seconds at the start of each workload left out of the figures (none with `--count`: a
    /// run of N messages reports all N).
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Longest drain after producing (W3, `--consume`), seconds.
    #[arg(long, default_value_t = 30.0)]
    pub drain_timeout: f64,
    /// A request without an answer after this many seconds counts as a timeout.
    #[arg(long, default_value_t = 10.0)]
    pub request_timeout: f64,
    /// Generator threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Partitions of a topic the generator creates.
    #[arg(long, default_value_t = 8)]
    pub partitions: u32,
    /// Do not create the topic (the target is not a broker, or the topic exists).
    #[arg(long)]
    pub no_create: bool,
    /// How batch produces carry payloads.
    #[arg(long, value_enum, default_value = "json")]
    pub payload_encoding: PayloadEncoding,
    /// Process id of the server, to report its CPU seconds (and bytes written to storage). A
    /// comma list (or the flag repeated) for the nodes of a cluster: figures per process and
    /// their sum.
    #[arg(long, value_delimiter = ',')]
    pub server_pid: Vec<u32>,
    /// Measure W1 against this URL first (nginx answering 202) and report ratios to it.
    #[arg(long)]
    pub ceiling_url: Option<String>,
    /// Process id of the ceiling server (its CPU seconds).
    #[arg(long)]
    pub ceiling_pid: Option<u32>,
    /// A ceiling in requests per second measured elsewhere, for the ratio column.
    #[arg(long)]
    pub ceiling_rps: Option<f64>,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON report to this file.
    #[arg(long)]
    pub json_out: Option<std::path::PathBuf>,
    /// `Authorization` header value sent with every request (not a flag; set by the caller).
    #[arg(skip)]
    pub authorization: Option<String>,
}

impl BenchArgs {
    /// The defaults, aimed at `url`.
    pub fn new(url: &str) -> BenchArgs {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            a: BenchArgs,
        }
        let mut a = P::parse_from(["bench"]).a;
        a.url = Some(url.to_string());
        a
    }
}

/// What one workload run does.
#[derive(Clone, Debug)]
struct Plan {
    name: String,
    topic: String,
    producers: usize,
    batch: usize,
    consumers: usize,
    consumers_after_producers: bool,
    rate: Option<f64>,
    track: bool,
    duration: Duration,
    warmup: Duration,
    count: Option<u64>,
    create: bool,
    server_pid: Vec<u32>,
}

fn secs(v: f64, what: &str) -> Result<Duration, String> {
    if !v.is_finite() || v < 0.0 || v > RUN_SECONDS_MAX as f64 {
        return Err(format!(
            "{what} must be between 0 and {RUN_SECONDS_MAX} seconds"
        ));
    }
    Ok(Duration::from_secs_f64(v))
}

fn validate(a: &BenchArgs) -> Result<(), String> {
    let name_ok = !a.topic.is_empty()
        && a.topic.len() <= 190
        && a.topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if !name_ok {
        return Err("topic: 1-190 characters of A-Z a-z 0-9 . _ -".into());
    }
    if a.size == 0 || a.size > 1 << 20 {
        return Err("--size must be 1 byte .. 1 MiB".into());
    }
    if (a.consume || a.workload == Workload::W3 || a.workload == Workload::All)
        && a.size < PAYLOAD_BYTES_MIN
    {
        return Err(format!(
            "--size must be at least {PAYLOAD_BYTES_MIN} to follow messages (W3, --consume)"
        ));
    }
    if a.threads == 0 || a.threads > THREADS_MAX {
        return Err(format!("--threads must be 1..{THREADS_MAX}"));
    }
    if a.workers.is_some_and(|w| w == 0 || w > CONNECTIONS_MAX) || a.consumers > CONNECTIONS_MAX {
        return Err(format!("connections must be 1..{CONNECTIONS_MAX}"));
    }
    if a.batch.is_some_and(|b| b == 0 || b > BATCH_MESSAGES_MAX) {
        return Err(format!("--batch must be 1..{BATCH_MESSAGES_MAX}"));
    }
    if a.consume_max == 0 || a.consume_max > CONSUME_MAX {
        return Err(format!("--consume-max must be 1..{CONSUME_MAX}"));
    }
    if a.rate.iter().any(|r| !r.is_finite() || *r <= 0.0) {
        return Err("--rate values must be positive".into());
    }
    if a.count == Some(0) {
        return Err("--count must be positive".into());
    }
    secs(a.duration, "--duration")?;
    secs(a.warmup, "--warmup")?;
    secs(a.drain_timeout, "--drain-timeout")?;
    secs(a.request_timeout, "--request-timeout")?;
    if a.duration <= 0.0 || a.request_timeout <= 0.0 {
        return Err("--duration and --request-timeout must be positive".into());
    }
    if a.warmup >= a.duration {
        return Err("--warmup must be shorter than --duration".into());
    }
    Ok(())
}

fn plan(a: &BenchArgs, w: Workload, rate: Option<f64>, suffix: bool) -> Plan {
    let (name, producers, batch, consumers) = match w {
        Workload::W1 => ("W1", a.workers.unwrap_or(64), 1, 0),
        Workload::W2 => ("W2", a.workers.unwrap_or(16), a.batch.unwrap_or(100), 0),
        Workload::W3 => (
            "W3",
            a.workers.unwrap_or(16),
            a.batch.unwrap_or(100),
            a.consumers.max(1),
        ),
        Workload::W4 | Workload::All => ("W4", a.workers.unwrap_or(64), a.batch.unwrap_or(1), 0),
    };
    let drain_only = a.consume && consumers == 0;
    let topic = if suffix {
        format!("{}-{}", a.topic, name.to_ascii_lowercase())
    } else {
        a.topic.clone()
    };
    Plan {
        name: match rate {
            Some(r) => format!("{name}@{}k", (r / 1000.0).round() as u64),
            None => name.to_string(),
        },
        topic,
        producers,
        batch,
        consumers: if drain_only {
            a.consumers.max(1)
        } else {
            consumers
        },
        consumers_after_producers: drain_only,
        rate,
        track: consumers > 0 || drain_only,
        duration: Duration::from_secs_f64(a.duration),
        // A counted run may end within the warm-up: it would report nothing.
        warmup: if a.count.is_some() {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(a.warmup)
        },
        count: a.count,
        create: !a.no_create,
        server_pid: a.server_pid.clone(),
    }
}

fn target_of(a: &BenchArgs, url: &str) -> Result<Arc<Target>, String> {
    let mut t = Target::parse(url)?;
    t.authorization = a.authorization.clone();
    Ok(Arc::new(t))
}

/// Nodes a run spreads its connections over, at most.
pub const URLS_MAX: usize = 64;

/// The targets of a `--url` value: one URL, or a comma list of them.
fn targets_of(a: &BenchArgs, urls: &str) -> Result<Vec<Arc<Target>>, String> {
    let list: Vec<&str> = urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    if list.is_empty() || list.len() > URLS_MAX {
        return Err(format!("--url: 1..{URLS_MAX} URLs, comma separated"));
    }
    list.into_iter().map(|u| target_of(a, u)).collect()
}

/// Runs the workloads `args` selects and returns the figures without printing.
pub fn run(args: &BenchArgs) -> Result<Report, String> {
    validate(args)?;
    let targets = targets_of(args, args.url.as_deref().unwrap_or(DEFAULT_URL))?;
    let mut report = Report::default();
    let mut ceiling_rps = args.ceiling_rps;
    if let Some(url) = &args.ceiling_url {
        let ct = target_of(args, url)?;
        let mut p = plan(args, Workload::W1, None, false);
        p.name = "ceiling W1".into();
        p.create = false;
        p.track = false;
        p.consumers = 0;
        p.server_pid = args.ceiling_pid.into_iter().collect();
        let r = run_plan(args, &[ct], &p)?;
        ceiling_rps = Some(r.produce_requests_per_s);
        report.ceiling = Some(r);
    }
    let all = args.workload == Workload::All;
    let list: Vec<Workload> = if all {
        vec![Workload::W1, Workload::W2, Workload::W3, Workload::W4]
    } else {
        vec![args.workload]
    };
    for w in list {
        let rates: Vec<Option<f64>> = if w != Workload::W4 && w != Workload::All {
            vec![None]
        } else if !args.rate.is_empty() {
            args.rate.iter().map(|r| Some(*r)).collect()
        } else {
            let w1 = report
                .runs
                .iter()
                .find(|r| r.workload == "W1")
                .map(|r| r.produced_per_s * 0.5)
                .filter(|r| *r >= 1.0);
            let mut v = vec![Some(10_000.0)];
            if let Some(half) = w1 {
                v.push(Some(half));
            } else {
                v.push(Some(50_000.0));
            }
            v
        };
        for rate in rates {
            let p = plan(args, w, rate, all);
            let mut r = run_plan(args, &targets, &p)?;
            r.ratio_to_ceiling = ceiling_rps
                .filter(|c| *c > 0.0)
                .map(|c| r.headline_per_s() / c);
            report.runs.push(r);
        }
    }
    Ok(report)
}

/// `narad bench`: runs, prints the table (or JSON with `--json`) on stdout, and fails when a
/// check found lost messages.
pub fn run_cli(args: BenchArgs) -> Result<Report, String> {
    let report = run(&args)?;
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.table());
    }
    if let Some(path) = &args.json_out {
        std::fs::write(path, report.to_json() + "\n")
            .map_err(|e| format!("write {}: {e}", path.display()))?;
    }
    let lost = report.lost();
    if lost > 0 {
        return Err(format!(
            "{lost} messages lost, acked twice or unexpected (see the check lines)"
        ));
    }
    Ok(report)
}

/// How long a topic created through one node may take to be seen by the others.
const TOPIC_VISIBLE_WAIT: Duration = Duration::from_secs(10);
const TOPIC_VISIBLE_POLL: Duration = Duration::from_millis(20);

/// Creates the topic through the first target and, when there are several, waits until every
/// other one answers 200 for it (a node applies a metadata change shortly after the proposer
/// answered), so that no produce meets a 404.
fn create_topic_on(targets: &[Arc<Target>], topic: &str, partitions: u32) -> Result<(), String> {
    create_topic(&targets[0], topic, partitions)?;
    let path = format!("/v1/topics/{topic}");
    for t in &targets[1..] {
        let deadline = Instant::now() + TOPIC_VISIBLE_WAIT;
        loop {
            let last = match http::one_shot(t, "GET", &path, None, b"", Duration::from_secs(5)) {
                Ok((200, _)) => break,
                Ok((s, body)) => format!("{s} {}", String::from_utf8_lossy(&body).trim()),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(format!(
                    "topic {topic} not seen by {} within {TOPIC_VISIBLE_WAIT:?}: {last}",
                    t.host
                ));
            }
            std::thread::sleep(TOPIC_VISIBLE_POLL);
        }
    }
    Ok(())
}

fn create_topic(target: &Target, topic: &str, partitions: u32) -> Result<(), String> {
    let body = if partitions == 0 {
        format!("{{\"name\":\"{topic}\"}}")
    } else {
        format!("{{\"name\":\"{topic}\",\"partitions\":{partitions}}}")
    };
    let (status, resp) = http::one_shot(
        target,
        "POST",
        "/v1/topics",
        Some("application/json"),
        body.as_bytes(),
        Duration::from_secs(30),
    )?;
    match status {
        200..=299 | 409 => Ok(()),
        s => Err(format!(
            "create topic {topic}: {s} {}",
            String::from_utf8_lossy(&resp).trim()
        )),
    }
}

fn run_tag() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = nanos ^ (u64::from(std::process::id()) << 32);
    // splitmix64 finaliser: different runs get unrelated tags.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (x ^ (x >> 31)) as u32
}

/// CPU seconds and bytes written of each server process now.
fn server_usage(pids: &[u32]) -> Vec<(Option<f64>, Option<u64>)> {
    pids.iter()
        .map(|&pid| (cpu::process_cpu_s(pid), cpu::process_write_bytes(pid)))
        .collect()
}

fn run_plan(args: &BenchArgs, targets: &[Arc<Target>], p: &Plan) -> Result<RunReport, String> {
    if p.create {
        create_topic_on(targets, &p.topic, args.partitions)?;
    }
    let run = run_tag();
    let budget = match (p.count, p.track) {
        (Some(c), true) => c.min(TRACKED_MESSAGES_MAX),
        (Some(c), false) => c,
        (None, true) => TRACKED_MESSAGES_MAX,
        (None, false) => u64::MAX,
    };
    let shared = Arc::new(Shared::new(p.producers, budget));
    let threads = args.threads.clamp(1, THREADS_MAX);
    let drain = Duration::from_secs_f64(args.drain_timeout);
    let request_timeout = Duration::from_secs_f64(args.request_timeout);
    let mut groups: Vec<Vec<Connection>> = (0..threads).map(|_| Vec::new()).collect();
    for i in 0..p.producers {
        let schedule = p.rate.map(|rate| {
            let req_per_s = rate / p.batch as f64;
            if args.per_connection_schedule {
                Schedule::PerConnection {
                    phase_s: i as f64 / req_per_s,
                    period_s: p.producers as f64 / req_per_s,
                }
            } else {
                Schedule::Pooled {
                    period_s: 1.0 / req_per_s,
                }
            }
        });
        let target = targets[i % targets.len()].clone();
        groups[i % threads].push((
            target.clone(),
            Box::new(Producer::new(ProducerConfig {
                target,
                shared: shared.clone(),
                topic: p.topic.clone(),
                batch: p.batch,
                size: args.size,
                encoding: args.payload_encoding,
                run,
                index: i as u32,
                track: p.track,
                schedule,
                duration: p.duration,
            })) as Box<dyn Driver>,
        ));
    }
    for q in 0..p.consumers {
        let target = targets[(p.producers + q) % targets.len()].clone();
        groups[(p.producers + q) % threads].push((
            target.clone(),
            Box::new(Consumer::new(ConsumerConfig {
                target,
                shared: shared.clone(),
                topic: p.topic.clone(),
                max: args.consume_max,
                wait_ms: args.consume_wait_ms,
                run,
                after_producers: p.consumers_after_producers,
                stop_after: p.duration + drain,
                single: args.single_consume,
            })),
        ));
    }
    // Every thread connects, then all start at the same instant.
    let barrier = Arc::new(Barrier::new(threads + 1));
    let start_at: Arc<OnceLock<Instant>> = Arc::new(OnceLock::new());
    let mut handles = Vec::with_capacity(threads);
    for group in groups {
        let (barrier, start_at) = (barrier.clone(), start_at.clone());
        let (duration, warmup) = (p.duration, p.warmup);
        handles.push(
            std::thread::Builder::new()
                .name("bench".into())
                .spawn(move || {
                    let mut synced = false;
                    let r = engine::run_thread(group, || {
                        synced = true;
                        barrier.wait();
                        barrier.wait();
                        let start = *start_at.get().unwrap_or(&Instant::now());
                        let win = Window {
                            measure_from: start + warmup,
                            measure_to: start + duration,
                            hard_deadline: start + duration + drain + request_timeout,
                            request_timeout,
                        };
                        (start, win)
                    });
                    if !synced {
                        barrier.wait();
                        barrier.wait();
                    }
                    r
                })
                .map_err(|e| format!("spawn generator thread: {e}"))?,
        );
    }
    barrier.wait();
    let start = Instant::now();
    let _ = start_at.set(start);
    barrier.wait();
    let measure_from = start + p.warmup;
    let measure_to = start + p.duration;
    std::thread::sleep(measure_from.saturating_duration_since(Instant::now()));
    let (srv0, gen0) = (server_usage(&p.server_pid), cpu::self_cpu_s());
    let mut early = false;
    loop {
        let now = Instant::now();
        if now >= measure_to {
            break;
        }
        if shared.producers_running.load(Ordering::Acquire) == 0 {
            early = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(5).min(measure_to - now));
    }
    let (srv1, gen1) = (server_usage(&p.server_pid), cpu::self_cpu_s());
    let produce_end = Instant::now();
    let mut stats = ThreadStats::default();
    let mut trackings: Vec<Tracking> = Vec::new();
    let mut first_err = None;
    for h in handles {
        match h.join() {
            Ok(Ok((s, t))) => {
                stats.merge(&s);
                trackings.extend(t);
            }
            Ok(Err(e)) => first_err = first_err.or(Some(e)),
            Err(_) => first_err = first_err.or(Some("generator thread panicked".to_string())),
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    let drain_s = produce_end.elapsed().as_secs_f64();
    let window_end = if early {
        stats
            .last_in_window
            .unwrap_or(measure_from)
            .max(measure_from)
    } else {
        measure_to
    };
    let window_s = window_end.duration_since(measure_from).as_secs_f64();
    let per_s = |n: u64| {
        if window_s > 0.0 {
            n as f64 / window_s
        } else {
            0.0
        }
    };
    let kind_name = ["produce", "consume", "ack"];
    // A batch ack answers 200 with a result per handle; a single ack answers 204.
    let ack_ok: &[u16] = if args.single_consume { &[204] } else { &[200] };
    let expected: [&[u16]; KINDS] = [&[202], &[200, 204], ack_ok];
    let mut r = RunReport {
        workload: p.name.clone(),
        url: targets
            .iter()
            .map(|t| format!("http://{}", t.host))
            .collect::<Vec<_>>()
            .join(","),
        topic: p.topic.clone(),
        producers: p.producers,
        consumers: p.consumers,
        batch: p.batch,
        size_bytes: args.size,
        threads,
        offered_msgs_per_s: p.rate,
        window_s,
        produced: stats.window.produced,
        produced_per_s: per_s(stats.window.produced),
        mb_per_s: per_s(stats.window.produced) * args.size as f64 / 1e6,
        produce_requests_per_s: per_s(stats.requests_in_window[Kind::Produce as usize]),
        acked: stats.window.acked,
        acked_per_s: per_s(stats.window.acked),
        latency: Latency::of(&stats.latency[Kind::Produce as usize]),
        consume_latency: (p.consumers > 0)
            .then(|| Latency::of(&stats.latency[Kind::Consume as usize])),
        ack_latency: (p.consumers > 0).then(|| Latency::of(&stats.latency[Kind::Ack as usize])),
        generator_cpu_s: gen1 - gen0,
        ..RunReport::default()
    };
    r.set_servers(
        p.server_pid
            .iter()
            .zip(srv0.iter().zip(&srv1))
            .map(|(&pid, ((c0, w0), (c1, w1)))| report::ServerUsage {
                pid,
                cpu_s: c0.zip(*c1).map(|(a, b)| b - a),
                write_bytes: w0.zip(*w1).map(|(a, b)| b.saturating_sub(a)),
                rss_mib: cpu::process_rss_bytes(pid).map(|b| b as f64 / f64::from(1 << 20)),
            })
            .collect(),
    );
    for k in 0..KINDS {
        if stats.statuses[k].is_empty() {
            continue;
        }
        r.statuses
            .insert(kind_name[k].to_string(), stats.statuses[k].clone());
        for (s, n) in &stats.statuses[k] {
            if !expected[k].contains(s) {
                r.errors.insert(format!("{} {s}", kind_name[k]), *n);
            }
        }
    }
    for (e, n) in &stats.transport {
        r.errors.insert(e.clone(), *n);
    }
    r.error_count = r.errors.values().sum();
    if p.track {
        r.check = Some(Check::compute(&trackings, drain_s));
    }
    Ok(r)
}

/// What the smoke run found, per workload.
#[derive(Clone, Debug, Default)]
pub struct SmokeReport {
    pub runs: Vec<RunReport>,
}

impl SmokeReport {
    /// Every workload produced something, lost nothing, acked nothing twice, met no error.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        for r in &self.runs {
            match &r.check {
                None => out.push(format!("{}: no check", r.workload)),
                Some(c) => {
                    if c.accepted == 0 {
                        out.push(format!("{}: nothing accepted", r.workload));
                    }
                    if c.lost + c.unexpected + c.acked_twice > 0 {
                        out.push(format!(
                            "{}: lost {} unexpected {} acked twice {}",
                            r.workload, c.lost, c.unexpected, c.acked_twice
                        ));
                    }
                }
            }
            if r.error_count > 0 {
                out.push(format!("{}: errors {:?}", r.workload, r.errors));
            }
        }
        out
    }
}

/// A short correctness run for the test suite: W1 (drained one message at a time) and W2 with a
/// drain (`--consume`), and W3,
/// each about two seconds with small counts against a broker at `addr`. Checks messages, never
/// speed. Errors only when a run cannot be made at all; see [`SmokeReport::problems`].
pub fn smoke(addr: SocketAddr) -> Result<SmokeReport, String> {
    let mut out = SmokeReport::default();
    let url = format!("http://{addr}");
    let tag = run_tag();
    for (w, count, batch) in [
        (Workload::W1, 2_000u64, None),
        (Workload::W2, 5_000, Some(50)),
        (Workload::W3, 5_000, Some(50)),
    ] {
        let mut a = BenchArgs::new(&url);
        a.topic = format!("smoke-{tag:08x}-{w:?}").to_ascii_lowercase();
        a.workload = w;
        a.count = Some(count);
        a.batch = batch;
        a.workers = Some(8);
        a.consumers = 4;
        a.consume = true;
        // W1 drains as the Go SDK's Receive + Ack do: one message per consume, one ack each.
        a.single_consume = w == Workload::W1;
        a.duration = 2.0;
        a.warmup = 0.0;
        a.drain_timeout = 15.0;
        a.request_timeout = 5.0;
        a.partitions = 3;
        a.size = 64;
        let mut r = run(&a)?;
        out.runs.append(&mut r.runs);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_lists_become_targets_in_order() {
        // Proves one URL gives one target as before, a comma list gives one per URL in order
        // (spaces and a trailing comma tolerated), and an empty list is refused.
        let a = BenchArgs::new("http://127.0.0.1:7942");
        let one = targets_of(&a, "http://127.0.0.1:7942").unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].host, "127.0.0.1:7942");
        let three = targets_of(
            &a,
            "http://127.0.0.1:1, http://127.0.0.1:2,http://127.0.0.1:3,",
        )
        .unwrap();
        let hosts: Vec<&str> = three.iter().map(|t| t.host.as_str()).collect();
        assert_eq!(hosts, ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]);
        assert!(targets_of(&a, " , ").is_err());
        assert!(targets_of(&a, "http://127.0.0.1:1,ftp://x").is_err());
    }

    #[test]
    fn server_sums_need_every_process() {
        // Proves the per-process figures sum over the processes given, bytes written are
        // divided by the messages produced in the window, and an unreadable process makes the
        // sum unknown rather than too small.
        let mut r = RunReport {
            produced: 1_000,
            ..RunReport::default()
        };
        let u = |pid, cpu, write| ServerUsage {
            pid,
            cpu_s: cpu,
            write_bytes: write,
            rss_mib: Some(10.0),
        };
        r.set_servers(vec![
            u(1, Some(1.0), Some(100_000)),
            u(2, Some(2.5), Some(200_000)),
        ]);
        assert_eq!(r.server_cpu_s, Some(3.5));
        assert_eq!(r.server_rss_mib, Some(20.0));
        assert_eq!(r.server_write_bytes_per_msg, Some(300.0));
        r.set_servers(vec![u(1, Some(1.0), None), u(2, None, Some(5))]);
        assert_eq!(r.server_cpu_s, None);
        assert_eq!(r.server_write_bytes_per_msg, None);
        assert_eq!(r.servers.len(), 2);
    }
}
