//! `narad pub`, `narad sub` and `narad replay` (OPERATIONS.md §1.3, API.md §10): the producer,
//! the queue-mode consumer that acks, and the read-only reader of one partition by offset.
//!
//! Owns: how a message (the argument, or the whole of `--file` / stdin) becomes a produce
//! and, with `--lines`, how input lines become batch produces; how consumed messages are
//! printed and acked; and the bounds on every loop. Never does: hold more than one batch in
//! memory, ack a message before its line was written to stdout (a failed write leaves its
//! lease to lapse, so the message is redelivered: at-least-once), or retry a produce the server may have stored (only
//! `429` and `503` with `Retry-After`, which mean nothing was stored, are retried).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Deserialize;

use super::client::{escape, Client, Response};
use super::format::{parse_duration_ms, Message};
use super::topic::ok;
use super::CliError;
use crate::wire::{is_valid_json, push_json_string};

/// Messages per batch produce sent by `pub` (the v3.1 limit, accepted by every server).
pub const PUB_BATCH_MESSAGES_MAX: usize = 100;
/// Body bytes per batch produce at most (the server takes 16 MiB).
pub const PUB_BATCH_BODY_BYTES_MAX: usize = 8 << 20;
/// Longest message, from the argument, a file, stdin or one input line (API.md §10.1: the
/// server's body limit).
pub const LINE_BYTES_MAX: usize = 1 << 20;
/// Records per batch consume (the server's maximum).
pub const SUB_BATCH_MAX: u64 = 100;
/// Long-poll budget of one consume request.
pub const SUB_POLL_WAIT: Duration = Duration::from_secs(10);
/// Consecutive transient consume failures (`421`, `429`, `502`, `503`, transport) tolerated.
pub const SUB_TRANSIENT_ERRORS_MAX: u32 = 50;
/// Pause after a transient failure.
const TRANSIENT_BACKOFF: Duration = Duration::from_millis(200);
/// Attempts at settling one batch of acks (failed handles with a transient status are resent).
pub const ACK_ATTEMPTS_MAX: u32 = 4;
/// Attempts at one produce refused with `429` or `503` + `Retry-After`.
pub const PRODUCE_ATTEMPTS_MAX: u32 = 5;
/// Longest pause honoured from a `Retry-After`.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(5);

#[derive(Args, Debug)]
pub struct PubArgs {
    pub topic: String,
    /// The message; without it, the whole of --file or stdin is the message (see --lines).
    pub message: Option<String>,
    /// Partition key.
    #[arg(short = 'k', long)]
    pub key: Option<String>,
    /// Pin the partition (wins over the key).
    #[arg(long)]
    pub partition: Option<u32>,
    /// Read the message from this file (`-` for stdin).
    #[arg(short = 'f', long)]
    pub file: Option<PathBuf>,
    /// One message per line of --file or stdin, sent in batches (empty lines skipped).
    #[arg(long, conflicts_with = "message")]
    pub lines: bool,
    /// Send the message this many times (>= 1); with --lines: stop after this many lines.
    #[arg(long, value_parser = parse_count)]
    pub count: Option<u64>,
    /// Send at most this many messages per second (batches shrink to about a tenth of it).
    #[arg(long, value_parser = parse_rate)]
    pub rate: Option<f64>,
}

/// Highest `--rate` accepted (messages per second).
pub const RATE_MAX: f64 = 10_000_000.0;
/// Batches per second aimed at under `--rate`: small batches keep the pace smooth.
const RATE_BATCHES_PER_SECOND: f64 = 10.0;

/// `pub --count` and `sub --count`: zero would do nothing and still report success.
fn parse_count(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(0) => Err("must be >= 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 && r <= RATE_MAX => Ok(r),
        _ => Err(format!(
            "want a number of messages per second in (0, {RATE_MAX}]"
        )),
    }
}

/// Sleeps until `sent` messages are due at `rate` per second since `started`.
fn pace(started: Instant, sent: u64, rate: Option<f64>) {
    if let Some(rate) = rate {
        let due = Duration::from_secs_f64(sent as f64 / rate);
        let elapsed = started.elapsed();
        if due > elapsed {
            std::thread::sleep(due - elapsed);
        }
    }
}

#[derive(Args, Debug)]
pub struct SubArgs {
    pub topic: String,
    /// Consume from this partition only.
    #[arg(long)]
    pub partition: Option<u32>,
    /// Do not ack: leases lapse and the messages are redelivered.
    #[arg(long = "no-ack")]
    pub no_ack: bool,
    /// Print payloads only.
    #[arg(long)]
    pub raw: bool,
    /// Stop after this many messages (>= 1).
    #[arg(long, value_parser = parse_count)]
    pub count: Option<u64>,
    /// Stop after this long without a message (default: run until interrupted).
    #[arg(long)]
    pub wait: Option<String>,
    /// Read-only tail: replay reads from the current end of every partition (or from --from
    /// with --partition); takes no leases, acks nothing.
    #[arg(long)]
    pub peek: bool,
    /// With --peek and --partition: the first offset to read.
    #[arg(long, requires = "peek", requires = "partition")]
    pub from: Option<i64>,
}

#[derive(Args, Debug)]
pub struct ReplayArgs {
    pub topic: String,
    #[arg(long)]
    pub partition: u32,
    /// First offset (default: the oldest retained).
    #[arg(long)]
    pub from: Option<i64>,
    /// Stop before this offset (default: the end of the partition).
    #[arg(long)]
    pub to: Option<i64>,
    /// Print payloads only.
    #[arg(long)]
    pub raw: bool,
}

/// How often the progress line on a terminal is redrawn.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(250);

/// A one-line progress counter on stderr, only when stderr is a terminal (and, for `sub`,
/// stdout is not, so that it never interleaves with the printed messages).
struct Progress {
    enabled: bool,
    last: Instant,
    drawn: bool,
}

impl Progress {
    fn new(stdout_free: bool) -> Progress {
        use std::io::IsTerminal;
        let enabled =
            std::io::stderr().is_terminal() && (stdout_free || !std::io::stdout().is_terminal());
        Progress {
            enabled,
            last: Instant::now(),
            drawn: false,
        }
    }

    fn show(&mut self, what: impl FnOnce() -> String) {
        if self.enabled && self.last.elapsed() >= PROGRESS_INTERVAL {
            eprint!("\r\x1b[K{}", what());
            self.last = Instant::now();
            self.drawn = true;
        }
    }

    fn clear(&mut self) {
        if self.drawn {
            eprint!("\r\x1b[K");
            self.drawn = false;
        }
    }
}

fn topic_path(topic: &str, rest: &str) -> String {
    format!("/v1/topics/{}{rest}", escape(topic))
}

fn output_error(e: std::io::Error) -> CliError {
    CliError::Failed(format!("writing output: {e}"))
}

/// Sends a produce, retrying only answers that guarantee nothing was stored.
fn produce_request(
    client: &mut Client,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> Result<Response, CliError> {
    ok(produce_answer(client, path, content_type, body)?)
}

/// As `produce_request`, but hands back the final answer whatever its status.
fn produce_answer(
    client: &mut Client,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> Result<Response, CliError> {
    let mut attempt = 1;
    loop {
        let r = client.request("POST", path, Some(content_type), body, Duration::ZERO)?;
        let nothing_stored =
            r.status == 429 || (r.status == 503 && r.header("retry-after").is_some());
        if !nothing_stored || attempt >= PRODUCE_ATTEMPTS_MAX {
            return Ok(r);
        }
        let pause = r
            .header("retry-after")
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_secs)
            .unwrap_or(Duration::from_secs(1))
            .min(RETRY_AFTER_MAX);
        std::thread::sleep(pause);
        attempt += 1;
    }
}

pub fn publish(client: &mut Client, a: PubArgs) -> Result<(), CliError> {
    if a.message.is_some() && a.file.is_some() {
        return Err(CliError::Usage(
            "pub: give the message as an argument or --file, not both".into(),
        ));
    }
    let input = || -> Result<Box<dyn Read>, CliError> {
        Ok(match &a.file {
            Some(f) if f.as_os_str() != "-" => Box::new(
                std::fs::File::open(f)
                    .map_err(|e| CliError::Usage(format!("{}: {e}", f.display())))?,
            ),
            _ => Box::new(std::io::stdin().lock()),
        })
    };
    if !a.lines {
        // OPERATIONS.md §1.3: the body comes from the argument, --file or stdin, as it is.
        let message: std::borrow::Cow<[u8]> = match &a.message {
            Some(m) => m.as_bytes().into(),
            None => read_message(input()?)?.into(),
        };
        // API.md §10.1: an empty body is `400 message required`; say where it came from instead.
        if message.is_empty() {
            let source = match (&a.message, &a.file) {
                (Some(_), _) => "the message argument".to_string(),
                (None, Some(f)) if f.as_os_str() != "-" => format!("--file {}", f.display()),
                _ => "stdin".to_string(),
            };
            return Err(CliError::Usage(format!(
                "pub: the message is empty ({source} gave no bytes); an empty message cannot be \
                 produced"
            )));
        }
        let path = single_produce_path(&a);
        let count = a.count.unwrap_or(1);
        let started = Instant::now();
        let mut progress = Progress::new(true);
        for i in 0..count {
            pace(started, i, a.rate);
            if i > 0 {
                progress.show(|| format!("{i} message(s) accepted"));
            }
            produce_request(client, &path, "application/octet-stream", &message)?;
        }
        progress.clear();
        if count == 1 {
            eprintln!("accepted ({} bytes)", message.len());
        } else {
            eprintln!(
                "accepted ({} bytes): {count} message(s)",
                count.saturating_mul(message.len() as u64)
            );
        }
        return Ok(());
    }
    let mut batcher = Batcher::new(&a);
    let result = batcher.run(client, BufReader::with_capacity(256 << 10, input()?));
    batcher.progress.clear();
    // OPERATIONS.md §1.3: `accepted (<n> bytes)`, then what it took.
    eprintln!(
        "accepted ({} bytes): {} message(s) in {} batch(es)",
        batcher.bytes, batcher.accepted, batcher.batches
    );
    result
}

/// Reads a whole message (a file or stdin), byte for byte, refusing one over the server's
/// limit before anything is sent.
fn read_message(input: impl Read) -> Result<Vec<u8>, CliError> {
    let mut message = Vec::new();
    input
        .take(LINE_BYTES_MAX as u64 + 1)
        .read_to_end(&mut message)
        .map_err(|e| CliError::Usage(format!("reading input: {e}")))?;
    if message.len() > LINE_BYTES_MAX {
        return Err(CliError::Usage(format!(
            "the message is longer than {LINE_BYTES_MAX} bytes (the message size limit); \
             --lines sends one message per line"
        )));
    }
    Ok(message)
}

/// The single-produce route with the key and partition of `a` as query parameters.
fn single_produce_path(a: &PubArgs) -> String {
    let mut path = topic_path(&a.topic, "/produce");
    let mut sep = '?';
    if let Some(k) = &a.key {
        path.push_str(&format!("{sep}key={}", escape(k)));
        sep = '&';
    }
    if let Some(p) = a.partition {
        path.push_str(&format!("{sep}partition={p}"));
    }
    path
}

/// Turns lines into batch produces (or, against a server without the batch route, one
/// produce per line: API.md §10.2 asks clients to fall back).
struct Batcher {
    path: String,
    /// JSON prefix of every element: `{"key":...,"partition":N,` (may be just `{`).
    element_head: Vec<u8>,
    limit: u64,
    body: Vec<u8>,
    in_body: usize,
    body_payload_bytes: u64,
    accepted: u64,
    batches: u64,
    bytes: u64,
    progress: Progress,
    /// Messages per batch at most (smaller under `--rate`).
    batch_max: usize,
    rate: Option<f64>,
    started: Instant,
    /// The payloads of the batch being built, end to end, and where each ends: kept for the
    /// fallback to single produces.
    raw: Vec<u8>,
    raw_ends: Vec<usize>,
    /// The input line of each message of the batch being built, to name it in an error.
    lines: Vec<u64>,
    single_path: String,
    /// The server has no batch route: one request per message.
    single: bool,
}

impl Batcher {
    fn new(a: &PubArgs) -> Batcher {
        let mut head = b"{".to_vec();
        if let Some(k) = &a.key {
            head.extend_from_slice(b"\"key\":");
            push_json_string(&mut head, k.as_bytes());
            head.push(b',');
        }
        if let Some(p) = a.partition {
            head.extend_from_slice(format!("\"partition\":{p},").as_bytes());
        }
        Batcher {
            path: topic_path(&a.topic, "/produce/batch"),
            element_head: head,
            limit: a.count.unwrap_or(u64::MAX),
            body: Vec::new(),
            in_body: 0,
            body_payload_bytes: 0,
            accepted: 0,
            batches: 0,
            bytes: 0,
            progress: Progress::new(true),
            batch_max: a.rate.map_or(PUB_BATCH_MESSAGES_MAX, |r| {
                ((r / RATE_BATCHES_PER_SECOND).ceil() as usize).clamp(1, PUB_BATCH_MESSAGES_MAX)
            }),
            rate: a.rate,
            started: Instant::now(),
            raw: Vec::new(),
            raw_ends: Vec::new(),
            lines: Vec::new(),
            single_path: single_produce_path(a),
            single: false,
        }
    }

    fn run(&mut self, client: &mut Client, mut input: impl BufRead) -> Result<(), CliError> {
        let mut line = Vec::new();
        let mut line_no: u64 = 0;
        let mut taken: u64 = 0;
        while taken < self.limit {
            line.clear();
            let n = (&mut input)
                .take(LINE_BYTES_MAX as u64 + 2)
                .read_until(b'\n', &mut line)
                .map_err(|e| CliError::Usage(format!("reading input: {e}")))?;
            if n == 0 {
                break;
            }
            line_no += 1;
            if line.last() == Some(&b'\n') {
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
            }
            if line.len() > LINE_BYTES_MAX {
                self.flush(client)?;
                return Err(CliError::Usage(format!(
                    "line {line_no}: longer than {LINE_BYTES_MAX} bytes (the message size limit)"
                )));
            }
            if line.is_empty() {
                continue;
            }
            let element_max = self.element_head.len() + 64 + line.len() * 2;
            if self.in_body >= self.batch_max
                || (self.in_body > 0 && self.body.len() + element_max > PUB_BATCH_BODY_BYTES_MAX)
            {
                self.flush(client)?;
            }
            self.push(&line);
            self.lines.push(line_no);
            taken += 1;
        }
        self.flush(client)
    }

    fn push(&mut self, line: &[u8]) {
        self.body.extend_from_slice(if self.in_body == 0 {
            b"{\"messages\":["
        } else {
            b","
        });
        self.body.extend_from_slice(&self.element_head);
        self.body.extend_from_slice(b"\"payload\":");
        if is_valid_json(line) {
            self.body.extend_from_slice(line);
            self.body.push(b'}');
        } else {
            self.body.push(b'"');
            crate::wire::base64::encode_into(&mut self.body, line);
            self.body
                .extend_from_slice(b"\",\"payload_encoding\":\"base64\"}");
        }
        self.in_body += 1;
        self.body_payload_bytes += line.len() as u64;
        self.raw.extend_from_slice(line);
        self.raw_ends.push(self.raw.len());
    }

    fn flush(&mut self, client: &mut Client) -> Result<(), CliError> {
        if self.in_body == 0 {
            return Ok(());
        }
        self.body.extend_from_slice(b"]}");
        pace(self.started, self.accepted, self.rate);
        if self.single {
            return self.flush_singly(client);
        }
        let r = produce_answer(client, &self.path, "application/json", &self.body)?;
        if r.is_route_missing() {
            eprintln!("narad: this server has no batch produce; sending one request per message");
            self.single = true;
            return self.flush_singly(client);
        }
        let r = ok(r).map_err(|e| self.name_the_line(e))?;
        #[derive(Deserialize)]
        struct Accepted {
            accepted: u64,
        }
        let n = serde_json::from_slice::<Accepted>(&r.body)
            .map(|a| a.accepted)
            .map_err(|e| {
                CliError::Failed(format!("the server answered an invalid batch result: {e}"))
            })?;
        if n != self.in_body as u64 {
            return Err(CliError::Failed(format!(
                "the server accepted {n} of {} messages in a batch",
                self.in_body
            )));
        }
        self.accepted += n;
        let accepted = self.accepted;
        self.progress
            .show(|| format!("{accepted} message(s) accepted"));
        self.batches += 1;
        self.finish_batch();
        Ok(())
    }

    /// A batch is refused whole, its error naming the element (`message <i>: ...`, API.md
    /// §10.2): says which input line that is, and that none of the batch's lines was stored.
    fn name_the_line(&self, e: CliError) -> CliError {
        let CliError::Refused { status, message } = e else {
            return e;
        };
        let element = message
            .strip_prefix("message ")
            .and_then(|rest| rest.split_once(": "))
            .and_then(|(i, rest)| Some((self.lines.get(i.parse::<usize>().ok()?)?, rest)));
        let (Some((line, rest)), Some(first), Some(last)) =
            (element, self.lines.first(), self.lines.last())
        else {
            return CliError::Refused { status, message };
        };
        CliError::Refused {
            status,
            message: format!("line {line}: {rest} (none of lines {first}-{last} was stored)"),
        }
    }

    fn finish_batch(&mut self) {
        self.bytes += self.body_payload_bytes;
        self.body.clear();
        self.in_body = 0;
        self.body_payload_bytes = 0;
        self.raw.clear();
        self.raw_ends.clear();
        self.lines.clear();
    }

    /// Sends the batch being built as single produces (octet-stream: the server stores JSON
    /// as JSON whatever the content type).
    fn flush_singly(&mut self, client: &mut Client) -> Result<(), CliError> {
        let mut start = 0;
        for i in 0..self.raw_ends.len() {
            let end = self.raw_ends[i];
            produce_request(
                client,
                &self.single_path,
                "application/octet-stream",
                &self.raw[start..end],
            )?;
            start = end;
            self.accepted += 1;
        }
        let accepted = self.accepted;
        self.progress
            .show(|| format!("{accepted} message(s) accepted"));
        self.finish_batch();
        Ok(())
    }
}

#[derive(Deserialize)]
struct Batch<'a> {
    #[serde(borrow)]
    messages: Vec<Message<'a>>,
}

fn is_transient(status: u16) -> bool {
    matches!(status, 421 | 429 | 502 | 503)
}

pub fn subscribe(client: &mut Client, a: SubArgs) -> Result<(), CliError> {
    let idle_max = match &a.wait {
        Some(w) => Some(Duration::from_millis(
            parse_duration_ms(w, false).map_err(|e| CliError::Usage(format!("--wait: {e}")))?,
        )),
        None => None,
    };
    if a.peek {
        return peek(client, &a, idle_max);
    }
    let limit = a.count.unwrap_or(u64::MAX);
    let mut received: u64 = 0;
    let mut acked: u64 = 0;
    let mut last_message = Instant::now();
    let mut polled_since_message = false;
    let mut transient_errors = 0;
    let mut progress = Progress::new(false);
    let mut stdout = std::io::stdout().lock();
    let mut out = Vec::new();
    let result = loop {
        if received >= limit {
            break Ok(());
        }
        let mut poll = SUB_POLL_WAIT;
        if let Some(idle) = idle_max {
            let left = idle.saturating_sub(last_message.elapsed());
            if left.is_zero() && polled_since_message {
                break Ok(());
            }
            poll = poll.min(left);
        }
        let want = (limit - received).min(SUB_BATCH_MAX);
        let mut path = topic_path(
            &a.topic,
            &format!("/consume?max={want}&wait={}ms", poll.as_millis()),
        );
        if let Some(p) = a.partition {
            path.push_str(&format!("&partition={p}"));
        }
        polled_since_message = true;
        let r = match client.request("GET", &path, None, b"", poll) {
            Ok(r) => r,
            Err(e) => {
                transient_errors += 1;
                if transient_errors > SUB_TRANSIENT_ERRORS_MAX || received == 0 {
                    break Err(e.into());
                }
                std::thread::sleep(TRANSIENT_BACKOFF);
                continue;
            }
        };
        match r.status {
            200 => {}
            204 => {
                transient_errors = 0;
                continue;
            }
            s if is_transient(s) && transient_errors < SUB_TRANSIENT_ERRORS_MAX => {
                transient_errors += 1;
                std::thread::sleep(TRANSIENT_BACKOFF);
                continue;
            }
            _ => break Err(CliError::refused(&r)),
        }
        transient_errors = 0;
        let batch: Batch = match serde_json::from_slice(&r.body) {
            Ok(b) => b,
            Err(e) => {
                break Err(CliError::Failed(format!(
                    "the server answered an invalid batch: {e}"
                )))
            }
        };
        out.clear();
        let mut handles = Vec::with_capacity(batch.messages.len());
        let mut bad = None;
        for m in &batch.messages {
            if let Err(e) = m.write_line(a.raw, &mut out) {
                bad = Some(format!(
                    "p{} @{}: undecodable payload: {e}",
                    m.partition, m.offset
                ));
            }
            if let Some(h) = &m.receipt_handle {
                handles.push(h.clone());
            }
        }
        if let Err(e) = stdout.write_all(&out).and_then(|_| stdout.flush()) {
            // Not acked: the leases lapse and the messages are redelivered.
            break Err(output_error(e));
        }
        if let Some(b) = bad {
            break Err(CliError::Failed(b));
        }
        received += batch.messages.len() as u64;
        progress.show(|| format!("{received} message(s) received"));
        last_message = Instant::now();
        polled_since_message = false;
        if !a.no_ack {
            acked += ack(client, &a.topic, handles);
        }
    };
    progress.clear();
    if a.no_ack {
        eprintln!("{received} message(s) received (not acked)");
    } else {
        eprintln!("{received} message(s) received, {acked} acked");
    }
    result
}

/// Acks `handles` (at most SUB_BATCH_MAX) with one batch ack, resending the ones that failed
/// with a transient status. Returns how many were settled; warns about the rest on stderr.
fn ack(client: &mut Client, topic: &str, mut handles: Vec<String>) -> u64 {
    #[derive(Deserialize)]
    struct AckResult {
        status: u16,
        #[serde(default)]
        error: String,
    }
    #[derive(Deserialize)]
    struct AckResults {
        results: Vec<AckResult>,
    }
    let path = topic_path(topic, "/ack");
    let mut settled = 0;
    for attempt in 1..=ACK_ATTEMPTS_MAX {
        if handles.is_empty() {
            break;
        }
        if attempt > 1 {
            std::thread::sleep(TRANSIENT_BACKOFF);
        }
        let body = serde_json::json!({ "receipt_handles": handles }).to_string();
        let r = match client.request(
            "POST",
            &path,
            Some("application/json"),
            body.as_bytes(),
            Duration::ZERO,
        ) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("narad: ack: {e} (will retry)");
                continue;
            }
        };
        if r.status != 200 {
            if !is_transient(r.status) {
                eprintln!(
                    "narad: ack of {} message(s) refused: {} (HTTP {}); they will be redelivered",
                    handles.len(),
                    r.error_text(),
                    r.status
                );
                return settled;
            }
            continue;
        }
        let results = match serde_json::from_slice::<AckResults>(&r.body) {
            Ok(x) if x.results.len() == handles.len() => x.results,
            _ => {
                eprintln!("narad: ack: invalid answer from the server");
                return settled;
            }
        };
        let mut retry = Vec::new();
        for (h, res) in handles.into_iter().zip(results) {
            match res.status {
                204 => settled += 1,
                s if is_transient(s) => retry.push(h),
                s => eprintln!(
                    "narad: ack {h}: {} (HTTP {s}); it will be redelivered",
                    res.error
                ),
            }
        }
        handles = retry;
    }
    if !handles.is_empty() {
        eprintln!(
            "narad: {} ack(s) not settled after {ACK_ATTEMPTS_MAX} attempts; they will be redelivered",
            handles.len()
        );
    }
    settled
}

/// Replay reads per partition per round of `sub --peek`, so that one busy partition does not
/// starve the others.
const PEEK_READS_PER_ROUND: u32 = 100;
/// Pause of `sub --peek` after a round that found nothing new.
const PEEK_IDLE_PAUSE: Duration = Duration::from_millis(200);
/// Partitions `sub --peek` follows at most (the server's maximum partition count is 108).
const PEEK_PARTITIONS_MAX: usize = 4096;

/// `sub --peek`: follows the end of every partition (or one from `--from`) with replay reads.
fn peek(client: &mut Client, a: &SubArgs, idle_max: Option<Duration>) -> Result<(), CliError> {
    let r = ok(client.request("GET", &topic_path(&a.topic, ""), None, b"", Duration::ZERO)?)?;
    let v: serde_json::Value = serde_json::from_slice(&r.body)
        .map_err(|e| CliError::Failed(format!("the server answered invalid JSON: {e}")))?;
    let stats = v["partition_stats"].as_array().cloned().unwrap_or_default();
    let mut positions: Vec<(u64, i64)> = Vec::new();
    for st in stats.iter().take(PEEK_PARTITIONS_MAX) {
        let index = st["index"].as_u64().unwrap_or(0);
        if a.partition.is_some_and(|p| u64::from(p) != index) {
            continue;
        }
        // Its end is unknown: a tail started now would miss or repeat records (v3.1).
        if st["status"].as_str() == Some("owner_unavailable") {
            return Err(CliError::Failed(format!(
                "partition {index} of {:?} has no available owner ({}); --peek does not start \
                 while a partition owner is down",
                a.topic,
                st["owner_liveness"].as_str().unwrap_or("unknown")
            )));
        }
        let end = st["high_watermark"].as_i64().unwrap_or(0);
        positions.push((index, a.from.unwrap_or(end)));
    }
    if positions.is_empty() {
        return Err(CliError::Usage(format!(
            "topic {:?} has no partition {}",
            a.topic,
            a.partition.map(|p| p.to_string()).unwrap_or_default()
        )));
    }
    let limit = a.count.unwrap_or(u64::MAX);
    let mut received: u64 = 0;
    let mut last_message = Instant::now();
    let mut stdout = std::io::stdout().lock();
    let mut out = Vec::new();
    let result = 'rounds: loop {
        let mut progress = false;
        for (partition, offset) in positions.iter_mut() {
            for _ in 0..PEEK_READS_PER_ROUND {
                if received >= limit {
                    break 'rounds Ok(());
                }
                let path = topic_path(
                    &a.topic,
                    &format!("/consume?partition={partition}&offset={offset}"),
                );
                let r = client.request("GET", &path, None, b"", Duration::ZERO)?;
                match r.status {
                    200 => {}
                    204 => break,
                    s if is_transient(s) => break,
                    _ => break 'rounds Err(CliError::refused(&r)),
                }
                let m: Message = match serde_json::from_slice(&r.body) {
                    Ok(m) => m,
                    Err(e) => {
                        break 'rounds Err(CliError::Failed(format!(
                            "the server answered an invalid message: {e}"
                        )))
                    }
                };
                if let Err(e) = m.write_line(a.raw, &mut out) {
                    break 'rounds Err(CliError::Failed(format!(
                        "p{partition} @{}: undecodable payload: {e}",
                        m.offset
                    )));
                }
                *offset = m.offset.max(*offset) + 1;
                received += 1;
                progress = true;
            }
        }
        if let Err(e) = stdout.write_all(&out).and_then(|_| stdout.flush()) {
            break Err(output_error(e));
        }
        out.clear();
        if progress {
            last_message = Instant::now();
            continue;
        }
        if idle_max.is_some_and(|idle| last_message.elapsed() >= idle) {
            break Ok(());
        }
        std::thread::sleep(PEEK_IDLE_PAUSE);
    };
    let _ = stdout.write_all(&out).and_then(|_| stdout.flush());
    eprintln!("{received} message(s) read (peek, nothing acked)");
    result
}

/// The oldest retained offset of one partition (`GET /v1/topics/{t}?partition=N`).
fn oldest_offset(client: &mut Client, topic: &str, partition: u32) -> Result<i64, CliError> {
    let r = ok(client.request(
        "GET",
        &topic_path(topic, &format!("?partition={partition}")),
        None,
        b"",
        Duration::ZERO,
    )?)?;
    let v: serde_json::Value = serde_json::from_slice(&r.body)
        .map_err(|e| CliError::Failed(format!("the server answered invalid JSON: {e}")))?;
    Ok(v["partition_stats"][0]["oldest_offset"]
        .as_i64()
        .unwrap_or(0))
}

pub fn replay(client: &mut Client, a: ReplayArgs) -> Result<(), CliError> {
    if a.from.is_some_and(|f| f < 0) || a.to.is_some_and(|t| t < 0) {
        return Err(CliError::Usage("replay: offsets must be >= 0".into()));
    }
    if let (Some(f), Some(t)) = (a.from, a.to) {
        if t < f {
            return Err(CliError::Usage(format!(
                "replay: --to ({t}) is before --from ({f}); --to is the first offset not read"
            )));
        }
    }
    let from = match a.from {
        Some(f) => f,
        None => oldest_offset(client, &a.topic, a.partition)?,
    };
    let to = a.to.unwrap_or(i64::MAX);
    let mut offset = from;
    let mut replayed: u64 = 0;
    let mut stdout = std::io::stdout().lock();
    let mut out = Vec::new();
    let result = loop {
        if offset >= to {
            break Ok(());
        }
        let path = topic_path(
            &a.topic,
            &format!("/consume?partition={}&offset={offset}", a.partition),
        );
        let r = match client.request("GET", &path, None, b"", Duration::ZERO) {
            Ok(r) => r,
            Err(e) => break Err(e.into()),
        };
        match r.status {
            200 => {}
            204 => break Ok(()),
            _ => break Err(CliError::refused(&r)),
        }
        let m: Message = match serde_json::from_slice(&r.body) {
            Ok(m) => m,
            Err(e) => {
                break Err(CliError::Failed(format!(
                    "the server answered an invalid message: {e}"
                )))
            }
        };
        if m.offset < offset {
            break Err(CliError::Failed(format!(
                "asked for offset {offset}, the server answered {}",
                m.offset
            )));
        }
        if m.offset >= to {
            offset = to;
            break Ok(());
        }
        if let Err(e) = m.write_line(a.raw, &mut out) {
            break Err(CliError::Failed(format!(
                "@{}: undecodable payload: {e}",
                m.offset
            )));
        }
        replayed += 1;
        offset = m.offset + 1;
        if out.len() >= 64 << 10 {
            if let Err(e) = stdout.write_all(&out) {
                break Err(output_error(e));
            }
            out.clear();
        }
    };
    let flushed = stdout.write_all(&out).and_then(|_| stdout.flush());
    let end = offset;
    eprintln!(
        "{replayed} message(s) replayed from p{} [{from}, {end})",
        a.partition
    );
    result?;
    flushed.map_err(output_error)
}
