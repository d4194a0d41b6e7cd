//! The workloads' per-connection logic ([`Driver`]s): producers (single or batch, closed loop or
//! on an open-loop schedule) and consumers (batch consume, batch ack), plus the payload format
//! that lets the end-of-run check follow every message.
//!
//! Payload format (`size` bytes, a JSON string so the broker stores and returns it verbatim):
//! `"#NB#` + run tag (8 hex) + message id (16 hex) + `#` + `x` padding + `"`. A message id is
//! `producer_index << 32 | sequence`, unique within a run.
//!
//! Owns request bodies and response interpretation; never touches sockets or clocks other than
//! the `now` it is given.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::{Completed, Driver, Kind, Step, Tracking};
use crate::http::{write_request, Target};

/// Bytes of a payload before the padding: `"#NB#` + 8 + 16 + `#`, and the closing quote.
pub const PAYLOAD_BYTES_MIN: usize = 1 + 4 + 8 + 16 + 1 + 1;
/// Messages per batch produce (API.md §10.2, v3.2).
pub const BATCH_MESSAGES_MAX: usize = 1000;
/// Records per batch consume and handles per batch ack (API.md §10.3, §10.4).
pub const CONSUME_MAX: usize = 100;
/// Messages one run follows for the end-of-run check; producers stop early beyond it.
pub const TRACKED_MESSAGES_MAX: u64 = 200_000_000;
/// A consumer that got an error answer waits this long before asking again.
const CONSUMER_BACKOFF: Duration = Duration::from_millis(20);
/// How often a consumer waiting for producers to finish (drain-only mode) looks again.
const CONSUMER_IDLE_POLL: Duration = Duration::from_millis(50);
const MARKER: &[u8] = b"#NB#";

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PayloadEncoding {
    /// `"payload":"#NB#..."`: the message is the JSON string, quotes included.
    Json,
    /// `"payload":"<base64>","payload_encoding":"base64"` of the same bytes.
    Base64,
}

/// State shared by every connection of one run.
#[derive(Debug)]
pub struct Shared {
    pub producers_running: AtomicUsize,
    /// Messages answered 202, this run.
    pub accepted: AtomicU64,
    /// Messages of this run acked with 204 (duplicates counted again).
    pub acked: AtomicU64,
    /// Messages producers may still send (a `--count` limit), shared by all producers.
    pub budget: AtomicU64,
    pub stop: AtomicBool,
    /// The next unclaimed send of a pooled open-loop schedule ([`Schedule::Pooled`]).
    pub slots: AtomicU64,
}

impl Shared {
    pub fn new(producers: usize, budget: u64) -> Shared {
        Shared {
            producers_running: AtomicUsize::new(producers),
            accepted: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            budget: AtomicU64::new(budget),
            stop: AtomicBool::new(false),
            slots: AtomicU64::new(0),
        }
    }

    /// Takes up to `want` messages from the budget.
    fn take(&self, want: u64) -> u64 {
        let mut cur = self.budget.load(Ordering::Relaxed);
        loop {
            let got = cur.min(want);
            if got == 0 {
                return 0;
            }
            match self.budget.compare_exchange_weak(
                cur,
                cur - got,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return got,
                Err(c) => cur = c,
            }
        }
    }
}

fn hex(out: &mut Vec<u8>, v: u64, digits: u32) {
    const H: &[u8; 16] = b"0123456789abcdef";
    for i in (0..digits).rev() {
        out.push(H[((v >> (i * 4)) & 0xf) as usize]);
    }
}

/// Appends the payload of message `id` (exactly `size` bytes; without an id when `size` is
/// below [`PAYLOAD_BYTES_MIN`]).
pub fn write_payload(out: &mut Vec<u8>, run: u32, id: u64, size: usize) {
    let start = out.len();
    if size < PAYLOAD_BYTES_MIN {
        out.resize(start + size, b'x');
        return;
    }
    out.push(b'"');
    out.extend_from_slice(MARKER);
    hex(out, u64::from(run), 8);
    hex(out, id, 16);
    out.push(b'#');
    out.resize(start + size - 1, b'x');
    out.push(b'"');
}

fn unhex(b: &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for &c in b {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => return None,
        };
        v = v << 4 | u64::from(d);
    }
    Some(v)
}

/// Reads (run, id) from a marker at the start of `b`.
fn read_marker(b: &[u8]) -> Option<(u32, u64)> {
    let rest = b.strip_prefix(MARKER)?;
    if rest.len() < 24 {
        return None;
    }
    Some((unhex(&rest[..8])? as u32, unhex(&rest[8..24])?))
}

/// Position of `needle` in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    // SAFETY: both pointers are valid for the lengths given; memmem only reads them, and a
    // non-null result points inside `hay`.
    let p = unsafe {
        libc::memmem(
            hay.as_ptr() as *const libc::c_void,
            hay.len(),
            needle.as_ptr() as *const libc::c_void,
            needle.len(),
        )
    };
    if p.is_null() {
        None
    } else {
        Some(p as usize - hay.as_ptr() as usize)
    }
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

pub fn base64_encode(out: &mut Vec<u8>, b: &[u8]) {
    for ch in b.chunks(3) {
        let n = (u32::from(ch[0]) << 16)
            | (u32::from(*ch.get(1).unwrap_or(&0)) << 8)
            | u32::from(*ch.get(2).unwrap_or(&0));
        out.push(B64[(n >> 18) as usize & 63]);
        out.push(B64[(n >> 12) as usize & 63]);
        out.push(if ch.len() > 1 {
            B64[(n >> 6) as usize & 63]
        } else {
            b'='
        });
        out.push(if ch.len() > 2 {
            B64[n as usize & 63]
        } else {
            b'='
        });
    }
}

pub fn base64_decode(s: &[u8]) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    for q in s.chunks(4) {
        let mut n = 0u32;
        let mut pad = 0;
        for &c in q {
            let v = match c {
                b'A'..=b'Z' => c - b'A',
                b'a'..=b'z' => c - b'a' + 26,
                b'0'..=b'9' => c - b'0' + 52,
                b'+' => 62,
                b'/' => 63,
                b'=' => {
                    pad += 1;
                    0
                }
                _ => return None,
            };
            if pad > 0 && c != b'=' {
                return None;
            }
            n = n << 6 | u32::from(v);
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad.min(2)]);
    }
    Some(out)
}

/// An open-loop schedule. Either way a request's latency counts from the time it was due, so
/// time spent waiting for a free connection is never hidden.
#[derive(Clone, Copy, Debug)]
pub enum Schedule {
    /// Send k of the whole run is due at `k * period`, and goes out on whichever connection is
    /// free first (connections claim sends in order as they become free): many independent
    /// clients behind a connection pool, as a load balancer's upstream pool or an SDK's
    /// transport sends them. A slow answer holds up one connection, not a share of the schedule.
    Pooled {
        /// Time between two sends of the run, in seconds.
        period_s: f64,
    },
    /// Request k of this connection is due at `phase + k * period`: each connection a client of
    /// its own with one request in flight, whose late answer delays its next sends (queueing
    /// per connection, as wrk2 measures).
    PerConnection {
        /// Offset of this connection's first request from the run start, in seconds.
        phase_s: f64,
        /// Time between this connection's requests, in seconds.
        period_s: f64,
    },
}

/// Produces single messages or batches, closed loop or on a schedule.
pub struct Producer {
    target: Arc<Target>,
    shared: Arc<Shared>,
    path: String,
    batch: usize,
    size: usize,
    encoding: PayloadEncoding,
    run: u32,
    index: u32,
    seq: u64,
    track: bool,
    schedule: Option<Schedule>,
    /// Run time after which no new request starts.
    duration: Duration,
    start: Instant,
    sent: u64,
    /// The pooled-schedule send this connection claimed and waits to make.
    claimed: Option<u64>,
    in_flight: Option<(u64, u32)>,
    finished: bool,
    body: Vec<u8>,
    out: Tracking,
}

pub struct ProducerConfig {
    pub target: Arc<Target>,
    pub shared: Arc<Shared>,
    pub topic: String,
    pub batch: usize,
    pub size: usize,
    pub encoding: PayloadEncoding,
    pub run: u32,
    pub index: u32,
    pub track: bool,
    pub schedule: Option<Schedule>,
    pub duration: Duration,
}

impl Producer {
    pub fn new(c: ProducerConfig) -> Producer {
        let path = if c.batch > 1 {
            format!("/v1/topics/{}/produce/batch", c.topic)
        } else {
            format!("/v1/topics/{}/produce", c.topic)
        };
        Producer {
            target: c.target,
            shared: c.shared,
            path,
            batch: c.batch.clamp(1, BATCH_MESSAGES_MAX),
            size: c.size,
            encoding: c.encoding,
            run: c.run,
            index: c.index,
            seq: 0,
            track: c.track,
            schedule: c.schedule,
            duration: c.duration,
            start: Instant::now(),
            sent: 0,
            claimed: None,
            in_flight: None,
            finished: false,
            body: Vec::new(),
            out: Tracking::default(),
        }
    }

    fn finish_producing(&mut self) -> Step {
        if !self.finished {
            self.finished = true;
            self.shared.producers_running.fetch_sub(1, Ordering::AcqRel);
        }
        Step::Done
    }

    fn id(&self, seq: u64) -> u64 {
        u64::from(self.index) << 32 | seq
    }

    fn write_body(&mut self, first: u64, n: u64) {
        self.body.clear();
        if self.batch == 1 {
            let id = self.id(first);
            write_payload(&mut self.body, self.run, id, self.size);
            return;
        }
        let mut scratch = Vec::with_capacity(self.size);
        self.body.extend_from_slice(b"{\"messages\":[");
        for k in 0..n {
            if k > 0 {
                self.body.push(b',');
            }
            match self.encoding {
                PayloadEncoding::Json => {
                    self.body.extend_from_slice(b"{\"payload\":");
                    if self.size < PAYLOAD_BYTES_MIN {
                        // Too small for an id: a JSON string of 'x's (at least `""`).
                        let inner = self.size.max(2) - 2;
                        self.body.push(b'"');
                        self.body.resize(self.body.len() + inner, b'x');
                        self.body.push(b'"');
                    } else {
                        let id = self.id(first + k);
                        write_payload(&mut self.body, self.run, id, self.size);
                    }
                    self.body.push(b'}');
                }
                PayloadEncoding::Base64 => {
                    scratch.clear();
                    write_payload(&mut scratch, self.run, self.id(first + k), self.size);
                    self.body.extend_from_slice(b"{\"payload\":\"");
                    base64_encode(&mut self.body, &scratch);
                    self.body
                        .extend_from_slice(b"\",\"payload_encoding\":\"base64\"}");
                }
            }
        }
        self.body.extend_from_slice(b"]}");
    }
}

impl Driver for Producer {
    fn begin(&mut self, start: Instant) {
        self.start = start;
    }

    fn next(&mut self, now: Instant, req: &mut Vec<u8>) -> Step {
        debug_assert!(self.in_flight.is_none());
        let end = self.start + self.duration;
        if self.shared.stop.load(Ordering::Relaxed) || now >= end {
            return self.finish_producing();
        }
        let origin = match self.schedule {
            None => now,
            Some(s) => {
                let offset_s = match s {
                    Schedule::Pooled { period_s } => {
                        let k = *self.claimed.get_or_insert_with(|| {
                            self.shared.slots.fetch_add(1, Ordering::Relaxed)
                        });
                        period_s * k as f64
                    }
                    Schedule::PerConnection { phase_s, period_s } => {
                        phase_s + period_s * self.sent as f64
                    }
                };
                let due = if offset_s.is_finite() && offset_s < self.duration.as_secs_f64() {
                    self.start + Duration::from_secs_f64(offset_s.max(0.0))
                } else {
                    end
                };
                if due >= end {
                    return self.finish_producing();
                }
                if due > now {
                    return Step::Sleep(due);
                }
                self.claimed = None;
                due
            }
        };
        let n = self.shared.take(self.batch as u64);
        if n == 0 || self.seq + n > u64::from(u32::MAX) {
            return self.finish_producing();
        }
        let first = self.seq;
        self.seq += n;
        self.sent += 1;
        self.write_body(first, n);
        let ct = if self.batch > 1 {
            "application/json"
        } else {
            "application/octet-stream"
        };
        write_request(req, &self.target, "POST", &self.path, Some(ct), &self.body);
        self.in_flight = Some((self.id(first), n as u32));
        Step::Send {
            origin,
            kind: Kind::Produce,
        }
    }

    fn on_response(&mut self, status: u16, _body: &[u8], _now: Instant) -> Completed {
        let Some((first, n)) = self.in_flight.take() else {
            return Completed::default();
        };
        if status == 202 {
            self.shared
                .accepted
                .fetch_add(u64::from(n), Ordering::Relaxed);
            if self.track {
                push_range(&mut self.out.accepted, first, n);
            }
            Completed {
                produced: u64::from(n),
                ..Completed::default()
            }
        } else {
            if self.track {
                push_range(&mut self.out.rejected, first, n);
            }
            Completed::default()
        }
    }

    fn on_lost_request(&mut self) {
        if let Some((first, n)) = self.in_flight.take() {
            if self.track {
                push_range(&mut self.out.uncertain, first, n);
            }
        }
    }

    fn finish(mut self: Box<Self>) -> Tracking {
        // A producer stopped by the hard deadline still counts as finished.
        self.finish_producing();
        std::mem::take(&mut self.out)
    }
}

fn push_range(v: &mut Vec<(u64, u32)>, first: u64, n: u32) {
    if let Some(last) = v.last_mut() {
        if last.0 + u64::from(last.1) == first && last.1.checked_add(n).is_some() {
            last.1 += n;
            return;
        }
    }
    v.push((first, n));
}

/// One consumed message: its id if it is one of this run's, and its receipt handle.
#[derive(Debug, PartialEq, Eq)]
pub struct Delivered {
    pub id: Option<u64>,
    pub handle: String,
}

/// Reads the messages of a batch consume answer. Fast path: the `#NB#` markers and the
/// `"receipt_handle":"` fields appear once per message and in message order, whatever the
/// field order inside a message. When the counts disagree (messages from elsewhere, base64
/// payloads) the body is parsed as JSON.
pub fn parse_consume(body: &[u8], run: u32) -> Result<Vec<Delivered>, String> {
    const HANDLE: &[u8] = b"\"receipt_handle\":\"";
    let mut handles = Vec::with_capacity(CONSUME_MAX);
    let mut at = 0;
    while let Some(p) = find(&body[at..], HANDLE) {
        let s = at + p + HANDLE.len();
        let Some(e) = body[s..].iter().position(|&b| b == b'"') else {
            return Err("unterminated receipt_handle".into());
        };
        handles.push(std::str::from_utf8(&body[s..s + e]).map_err(|_| "bad handle")?);
        at = s + e;
    }
    let mut ids = Vec::with_capacity(handles.len());
    let mut at = 0;
    while let Some(p) = find(&body[at..], MARKER) {
        let s = at + p;
        ids.push(read_marker(&body[s..]));
        at = s + MARKER.len();
    }
    if !handles.is_empty() && ids.len() == handles.len() && ids.iter().all(|m| m.is_some()) {
        return Ok(ids
            .into_iter()
            .zip(handles)
            .map(|(m, h)| Delivered {
                id: m.and_then(|(r, id)| (r == run).then_some(id)),
                handle: h.to_string(),
            })
            .collect());
    }
    parse_consume_json(body, run)
}

fn parse_consume_json(body: &[u8], run: u32) -> Result<Vec<Delivered>, String> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("consume body: {e}"))?;
    // A consume without `max` answers one Message object (API.md §10.3).
    let one;
    let msgs = match v.get("messages").and_then(|m| m.as_array()) {
        Some(m) => m,
        None if v.get("receipt_handle").is_some() => {
            one = [v.clone()];
            &one[..]
        }
        None => return Err("consume body without messages".into()),
    };
    let mut out = Vec::with_capacity(msgs.len());
    for m in msgs {
        let handle = m
            .get("receipt_handle")
            .and_then(|h| h.as_str())
            .ok_or("message without receipt_handle")?
            .to_string();
        let payload = m.get("payload").cloned().unwrap_or(serde_json::Value::Null);
        let bytes = match (m.get("payload_encoding").and_then(|e| e.as_str()), &payload) {
            (Some("base64"), serde_json::Value::String(s)) => {
                base64_decode(s.as_bytes()).unwrap_or_default()
            }
            _ => payload.to_string().into_bytes(),
        };
        let id = find(&bytes, MARKER)
            .and_then(|p| read_marker(&bytes[p..]))
            .and_then(|(r, id)| (r == run).then_some(id));
        out.push(Delivered { id, handle });
    }
    Ok(out)
}

/// The `status` of each result of a batch ack answer, in order.
pub fn parse_ack_results(body: &[u8]) -> Vec<u16> {
    const STATUS: &[u8] = b"\"status\":";
    let mut out = Vec::with_capacity(CONSUME_MAX);
    let mut at = 0;
    while let Some(p) = find(&body[at..], STATUS) {
        let mut s = at + p + STATUS.len();
        while body.get(s) == Some(&b' ') {
            s += 1;
        }
        let digits = body[s..].iter().take_while(|b| b.is_ascii_digit()).count();
        let v = std::str::from_utf8(&body[s..s + digits])
            .ok()
            .and_then(|t| t.parse().ok())
            .unwrap_or(0);
        out.push(v);
        at = s + digits;
    }
    out
}

/// Batch-consumes and batch-acks until producers are done and everything accepted is acked, or
/// its drain deadline passes.
pub struct Consumer {
    target: Arc<Target>,
    shared: Arc<Shared>,
    consume_path: String,
    ack_path: String,
    run: u32,
    /// Wait for every producer to finish before consuming (`--consume` after W1/W2).
    after_producers: bool,
    /// Run time after which the consumer stops, drained or not.
    stop_after: Duration,
    start: Instant,
    /// Handles to ack next, and the ids they carry.
    to_ack: Vec<Delivered>,
    /// The ack in flight.
    acking: Vec<Option<u64>>,
    last: Kind,
    last_empty: bool,
    backoff_until: Option<Instant>,
    body: Vec<u8>,
    out: Tracking,
    single: bool,
}

pub struct ConsumerConfig {
    pub target: Arc<Target>,
    pub shared: Arc<Shared>,
    pub topic: String,
    pub max: usize,
    pub wait_ms: u64,
    pub run: u32,
    pub after_producers: bool,
    pub stop_after: Duration,
    /// Consume without `max` (one Message object per answer) and ack each message alone with
    /// `?receipt_handle=`, as the Go SDK's `Receive` + `Ack` do (CLIENTS.md).
    pub single: bool,
}

impl Consumer {
    pub fn new(c: ConsumerConfig) -> Consumer {
        Consumer {
            target: c.target,
            shared: c.shared,
            consume_path: if c.single {
                format!("/v1/topics/{}/consume?wait={}ms", c.topic, c.wait_ms)
            } else {
                format!(
                    "/v1/topics/{}/consume?max={}&wait={}ms",
                    c.topic,
                    c.max.clamp(1, CONSUME_MAX),
                    c.wait_ms
                )
            },
            ack_path: format!("/v1/topics/{}/ack", c.topic),
            single: c.single,
            run: c.run,
            after_producers: c.after_producers,
            stop_after: c.stop_after,
            start: Instant::now(),
            to_ack: Vec::with_capacity(CONSUME_MAX),
            acking: Vec::with_capacity(CONSUME_MAX),
            last: Kind::Consume,
            last_empty: false,
            backoff_until: None,
            body: Vec::new(),
            out: Tracking::default(),
        }
    }
}

impl Driver for Consumer {
    fn begin(&mut self, start: Instant) {
        self.start = start;
    }

    fn next(&mut self, now: Instant, req: &mut Vec<u8>) -> Step {
        if self.single && !self.to_ack.is_empty() {
            let d = self.to_ack.remove(0);
            self.acking.clear();
            self.acking.push(d.id);
            let path = format!("{}?receipt_handle={}", self.ack_path, d.handle);
            write_request(req, &self.target, "POST", &path, None, &[]);
            self.last = Kind::Ack;
            return Step::Send {
                origin: now,
                kind: Kind::Ack,
            };
        }
        if !self.to_ack.is_empty() {
            self.body.clear();
            self.body.extend_from_slice(b"{\"receipt_handles\":[");
            self.acking.clear();
            let n = self.to_ack.len().min(CONSUME_MAX);
            for (k, d) in self.to_ack.drain(..n).enumerate() {
                if k > 0 {
                    self.body.push(b',');
                }
                self.body.push(b'"');
                self.body.extend_from_slice(d.handle.as_bytes());
                self.body.push(b'"');
                self.acking.push(d.id);
            }
            self.body.extend_from_slice(b"]}");
            write_request(
                req,
                &self.target,
                "POST",
                &self.ack_path,
                Some("application/json"),
                &self.body,
            );
            self.last = Kind::Ack;
            return Step::Send {
                origin: now,
                kind: Kind::Ack,
            };
        }
        if now >= self.start + self.stop_after {
            return Step::Done;
        }
        let producing = self.shared.producers_running.load(Ordering::Acquire) > 0;
        if !producing
            && self.last_empty
            && self.shared.acked.load(Ordering::Relaxed)
                >= self.shared.accepted.load(Ordering::Relaxed)
        {
            return Step::Done;
        }
        if producing && self.after_producers {
            return Step::Sleep(now + CONSUMER_IDLE_POLL);
        }
        if let Some(t) = self.backoff_until.take() {
            if t > now {
                return Step::Sleep(t);
            }
        }
        write_request(req, &self.target, "GET", &self.consume_path, None, &[]);
        self.last = Kind::Consume;
        Step::Send {
            origin: now,
            kind: Kind::Consume,
        }
    }

    fn on_response(&mut self, status: u16, body: &[u8], now: Instant) -> Completed {
        match (self.last, status) {
            (Kind::Consume, 200) => match parse_consume(body, self.run) {
                Ok(msgs) => {
                    self.last_empty = msgs.is_empty();
                    let mut ours = 0;
                    for d in msgs {
                        match d.id {
                            Some(id) => {
                                self.out.consumed.push(id);
                                ours += 1;
                            }
                            None => self.out.foreign += 1,
                        }
                        self.to_ack.push(d);
                    }
                    Completed {
                        consumed: ours,
                        ..Completed::default()
                    }
                }
                Err(_) => {
                    self.backoff_until = Some(now + CONSUMER_BACKOFF);
                    Completed::default()
                }
            },
            (Kind::Consume, 204) => {
                self.last_empty = true;
                Completed::default()
            }
            (Kind::Ack, 204) if self.single => {
                let acked = match self.acking.pop().flatten() {
                    Some(id) => {
                        self.out.acked.push(id);
                        1
                    }
                    None => 0,
                };
                self.acking.clear();
                self.shared.acked.fetch_add(acked, Ordering::Relaxed);
                Completed {
                    acked,
                    ..Completed::default()
                }
            }
            (Kind::Ack, 200) => {
                let results = parse_ack_results(body);
                let mut acked = 0;
                for (id, st) in self.acking.drain(..).zip(results) {
                    if let (Some(id), 204) = (id, st) {
                        self.out.acked.push(id);
                        acked += 1;
                    }
                }
                self.shared.acked.fetch_add(acked, Ordering::Relaxed);
                Completed {
                    acked,
                    ..Completed::default()
                }
            }
            _ => {
                // Unacked leases expire and the messages come back; the end check sees it.
                self.acking.clear();
                self.last_empty = false;
                self.backoff_until = Some(now + CONSUMER_BACKOFF);
                Completed::default()
            }
        }
    }

    fn on_lost_request(&mut self) {
        self.acking.clear();
        self.last_empty = false;
    }

    fn finish(mut self: Box<Self>) -> Tracking {
        std::mem::take(&mut self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_has_exact_size_and_round_trips_the_id() {
        // Proves a payload is exactly `size` bytes, is a JSON string, and that the consume
        // scanner reads the same run and id back (both fast path and JSON fallback).
        for size in [PAYLOAD_BYTES_MIN, 64, 256, 1000] {
            let mut p = Vec::new();
            write_payload(&mut p, 0xdead_beef, 0x0000_0007_0000_002a, size);
            assert_eq!(p.len(), size);
            let s: String = serde_json::from_slice(&p).expect("payload is a JSON string");
            assert!(s.starts_with("#NB#deadbeef000000070000002a#"));
        }
        let mut p = Vec::new();
        write_payload(&mut p, 5, 9, 10);
        assert_eq!(p, b"xxxxxxxxxx");
    }

    #[test]
    fn consume_scanner_pairs_ids_with_handles() {
        // Proves the fast scanner pairs each message's id with its handle whatever the field
        // order, marks other runs' messages foreign, and falls back to JSON for base64.
        let mut p1 = Vec::new();
        write_payload(&mut p1, 7, 1, 64);
        let mut p2 = Vec::new();
        write_payload(&mut p2, 8, 2, 64);
        let body = format!(
            "{{\"messages\":[{{\"topic\":\"t\",\"payload\":{},\"receipt_handle\":\"0:1:5\"}},\
             {{\"receipt_handle\":\"1:0:6\",\"payload\":{}}}]}}\n",
            String::from_utf8(p1.clone()).unwrap(),
            String::from_utf8(p2).unwrap()
        );
        let got = parse_consume(body.as_bytes(), 7).unwrap();
        assert_eq!(
            got,
            vec![
                Delivered {
                    id: Some(1),
                    handle: "0:1:5".into()
                },
                Delivered {
                    id: None,
                    handle: "1:0:6".into()
                },
            ]
        );
        let mut b64 = Vec::new();
        base64_encode(&mut b64, &p1);
        let body = format!(
            "{{\"messages\":[{{\"payload\":\"{}\",\"payload_encoding\":\"base64\",\"receipt_handle\":\"2:3:4\"}}]}}",
            String::from_utf8(b64).unwrap()
        );
        let got = parse_consume(body.as_bytes(), 7).unwrap();
        assert_eq!(
            got,
            vec![Delivered {
                id: Some(1),
                handle: "2:3:4".into()
            }]
        );
        assert!(parse_consume(b"{\"messages\":[{\"payload\":1}]}", 7).is_err());
    }

    #[test]
    fn single_consume_sends_what_the_go_sdk_sends() {
        // Proves the single mode consumes without `max`, reads the one Message object an answer
        // holds (fast scanner and JSON fallback), acks it alone by `?receipt_handle=` with an
        // empty body, and counts a 204 as acked exactly once.
        let mut p1 = Vec::new();
        write_payload(&mut p1, 7, 3, 64);
        let mut b64 = Vec::new();
        base64_encode(&mut b64, &p1);
        let fallback = format!(
            "{{\"payload\":\"{}\",\"payload_encoding\":\"base64\",\"receipt_handle\":\"1:2:3\"}}",
            String::from_utf8(b64).unwrap()
        );
        let want = vec![Delivered {
            id: Some(3),
            handle: "1:2:3".into(),
        }];
        assert_eq!(parse_consume(fallback.as_bytes(), 7).unwrap(), want);

        let shared = Arc::new(Shared::new(0, 0));
        let mut c = Consumer::new(ConsumerConfig {
            target: Arc::new(Target::parse("http://127.0.0.1:1").unwrap()),
            shared: shared.clone(),
            topic: "t".into(),
            max: 100,
            wait_ms: 50,
            run: 7,
            after_producers: false,
            stop_after: Duration::from_secs(60),
            single: true,
        });
        let now = Instant::now();
        c.begin(now);
        let mut req = Vec::new();
        assert!(matches!(
            c.next(now, &mut req),
            Step::Send {
                kind: Kind::Consume,
                ..
            }
        ));
        assert!(req.starts_with(b"GET /v1/topics/t/consume?wait=50ms HTTP/1.1\r\n"));
        let body = format!(
            "{{\"topic\":\"t\",\"payload\":{},\"receipt_handle\":\"1:2:3\"}}",
            String::from_utf8(p1).unwrap()
        );
        assert_eq!(c.on_response(200, body.as_bytes(), now).consumed, 1);
        req.clear();
        assert!(matches!(
            c.next(now, &mut req),
            Step::Send {
                kind: Kind::Ack,
                ..
            }
        ));
        let text = String::from_utf8(req.clone()).unwrap();
        assert!(
            text.starts_with("POST /v1/topics/t/ack?receipt_handle=1:2:3 HTTP/1.1\r\n"),
            "{text}"
        );
        assert!(text.ends_with("Content-Length: 0\r\n\r\n"), "{text}");
        assert_eq!(c.on_response(204, b"", now).acked, 1);
        assert_eq!(shared.acked.load(Ordering::Relaxed), 1);
        // Nothing left to ack: the next request is a consume again.
        req.clear();
        assert!(matches!(
            c.next(now, &mut req),
            Step::Send {
                kind: Kind::Consume,
                ..
            }
        ));
        assert_eq!(Box::new(c).finish().acked, vec![3]);
    }

    #[test]
    fn base64_round_trips() {
        // Proves the encoder and decoder agree on every length remainder and reject bad input.
        for n in 0..40usize {
            let data: Vec<u8> = (0..n).map(|i| (i * 37 + 11) as u8).collect();
            let mut e = Vec::new();
            base64_encode(&mut e, &data);
            assert_eq!(base64_decode(&e).unwrap(), data, "len {n}");
        }
        assert_eq!(base64_decode(b"aGVsbG8="), Some(b"hello".to_vec()));
        assert!(base64_decode(b"a=bc").is_none());
        assert!(base64_decode(b"abc").is_none());
    }

    /// Two W4 producers on `schedule(i)`, one send every millisecond in all.
    fn scheduled_pair(schedule: impl Fn(usize) -> Schedule) -> (Vec<Producer>, Instant) {
        let shared = Arc::new(Shared::new(2, u64::MAX));
        let start = Instant::now();
        let producers = (0..2)
            .map(|i| {
                let mut p = Producer::new(ProducerConfig {
                    target: Arc::new(Target::parse("http://127.0.0.1:1").unwrap()),
                    shared: shared.clone(),
                    topic: "t".into(),
                    batch: 1,
                    size: 64,
                    encoding: PayloadEncoding::Json,
                    run: 1,
                    index: i as u32,
                    track: false,
                    schedule: Some(schedule(i)),
                    duration: Duration::from_secs(10),
                });
                p.begin(start);
                p
            })
            .collect();
        (producers, start)
    }

    /// The origins (ms after `start`) of `p`'s first four sends, each answered at once and
    /// every `Sleep` followed to its time; with `answer_first` false, only the first send,
    /// which then stays unanswered.
    fn origins(p: &mut Producer, start: Instant, answer_first: bool) -> Vec<u64> {
        let mut out = Vec::new();
        let mut now = start;
        let mut req = Vec::new();
        for _ in 0..20 {
            match p.next(now, &mut req) {
                Step::Send { origin, .. } => {
                    out.push((origin - start).as_millis() as u64);
                    if !answer_first && out.len() == 1 {
                        return out;
                    }
                    p.on_response(202, b"", now);
                }
                Step::Sleep(t) => now = t,
                Step::Done => break,
            }
            if out.len() == 4 {
                break;
            }
        }
        out
    }

    #[test]
    fn a_pooled_schedule_sends_due_requests_on_the_free_connection() {
        // Proves the pooled W4 schedule: while connection 0 waits for its first answer,
        // connection 1 takes every following send at its due time (1, 2, 3, 4 ms), where the
        // per-connection schedule leaves it only its own share (1, 3, 5, 7 ms) and the sends
        // of the stuck connection wait (their latency then counts from 0, 2, 4 ms).
        let (mut ps, start) = scheduled_pair(|_| Schedule::Pooled { period_s: 0.001 });
        assert_eq!(origins(&mut ps[0], start, false), vec![0]);
        assert_eq!(origins(&mut ps[1], start, true), vec![1, 2, 3, 4]);
        let (mut ps, start) = scheduled_pair(|i| Schedule::PerConnection {
            phase_s: i as f64 * 0.001,
            period_s: 0.002,
        });
        assert_eq!(origins(&mut ps[0], start, false), vec![0]);
        assert_eq!(origins(&mut ps[1], start, true), vec![1, 3, 5, 7]);
    }

    #[test]
    fn ack_results_and_budget() {
        // Proves ack statuses are read in order and the shared budget never goes below zero.
        let r =
            parse_ack_results(b"{\"results\":[{\"status\":204},{\"status\":410,\"error\":\"x\"}]}");
        assert_eq!(r, vec![204, 410]);
        let s = Shared::new(1, 250);
        assert_eq!(s.take(100), 100);
        assert_eq!(s.take(100), 100);
        assert_eq!(s.take(100), 50);
        assert_eq!(s.take(100), 0);
    }
}
