//! Message routes (API.md §10): produce, batch produce, consume (queue, batch, replay) and
//! ack/extend/nack. The answer `202` is sent only after `Node::append` returned, which happens only
//! after the owner shard's group commit made every record durable and verified.

use std::rc::Rc;

use narad_io::log::AppendRecord;
use narad_io::types::{Nonce, Offset, PartitionId, PartitionKey, SharedBytes};
use narad_raft::TopicMeta;
use narad_shard::host::{now_ms, Leased, QueueConf, SettleKind};

use super::params::Params;
use super::{error, BODY_BYTES_MAX};
use crate::http::{Request, Response};
use crate::node::{Node, OwnerError, ReadFailure, SettleFailure, ShardCallError, StoreError};
use crate::schema::{Rejection, RejectionKind};
use crate::wire;
use crate::wire::duration::GoDuration;
use crate::wire::receipt::{MalformedHandle, ReceiptHandle};
use narad_shard::transit::CatchUpMark;

/// One lease named by a receipt handle.
type Lease = (PartitionId, Offset, Nonce);

/// Most records one batch consume hands out.
pub const CONSUME_BATCH_MAX: usize = 100;
/// Encoded messages in one batch consume answer; the first is always included.
pub const CONSUME_RESPONSE_BYTES_MAX: usize = 8 << 20;
/// Handles per batch ack.
pub const ACK_BATCH_MAX: usize = 100;

const GONE: &str = "receipt handle no longer matches an active reservation";
/// An ack the owner refused because its data disk is full (nothing settled; the lease holds).
const ACK_DISK_FULL: &str = "ack not recorded: disk full; retry later";

fn queue_conf(t: &TopicMeta) -> QueueConf {
    QueueConf {
        topic: t.id,
        visibility_ms: t.visibility_timeout_ms,
        max_in_flight: t.max_in_flight_per_partition,
        max_acked_ahead: t.max_acked_ahead_per_partition,
    }
}

/// The answer to a produce the log did not take. Both are API.md §10.1's `500 produce failed`,
/// the status the Go SDK retries on another node and counts against this one's breaker; a full
/// disk says so after that prefix, and nothing was stored. (Unlike an fsync failure, it is not
/// final: produces are taken again once space is free.)
fn store_failure(e: StoreError) -> Response {
    match e {
        StoreError::DiskFull => error(500, "produce failed: disk full; retry later"),
        // Deleted between the topic lookup and the append: as if the lookup had missed it.
        StoreError::TopicGone => error(404, "topic not found"),
        StoreError::Owner(e) => owner_response(&e),
        StoreError::Shard(e @ ShardCallError::Timeout { .. }) => shard_timeout(e),
        StoreError::Shard(e @ ShardCallError::Gone { .. }) => {
            tracing::error!(error = %e, "produce failed");
            error(500, "produce failed")
        }
        StoreError::Failed(detail) | StoreError::Stopped(detail) => {
            tracing::error!(error = %detail, "produce failed");
            error(500, "produce failed")
        }
    }
}

/// The answer when the shard that owns a partition did not answer in time: `503` with
/// `Retry-After: 1`, naming the shard and the deadline. What was asked may still have happened
/// there (a produce may be stored, an ack applied: a retried ack then answers `410`).
fn shard_timeout(e: ShardCallError) -> Response {
    error(503, &shard_timeout_message(e)).with_header("Retry-After", "1")
}

/// Status, text and whether to send `Retry-After` when a partition's owner node did not do
/// what was forwarded to it (CLUSTER.md §5.2–5.3, API.md §1). The texts name neither the owner
/// nor the transport error.
fn owner_failure(e: &OwnerError) -> (u16, &'static str, bool) {
    match e {
        OwnerError::Down => (503, "partition owner is down; retry later", true),
        OwnerError::NoAnswer(_) => (
            502,
            "partition owner did not answer; the request may have been applied",
            false,
        ),
        OwnerError::NotOwner => (421, "partition moved to another node; retry", false),
    }
}

fn owner_response(e: &OwnerError) -> Response {
    let (status, text, retry) = owner_failure(e);
    let r = error(status, text);
    if retry {
        r.with_header("Retry-After", "1")
    } else {
        r
    }
}

fn shard_timeout_message(e: ShardCallError) -> String {
    format!("{e}; retry")
}

/// [`store_failure`] of a produce; a stopped log makes the whole node refuse produces.
fn produce_failure(node: &Rc<Node>, e: StoreError) -> Response {
    if matches!(e, StoreError::Stopped(_)) {
        node.note_ingress_failure();
    }
    store_failure(e)
}

/// Counts a schema refusal (only of the payload: busy capacity and a schema this build cannot
/// compile are not rejections of the payload) and answers it: `400`, `503` busy, `500`.
fn schema_rejected(node: &Node, t: &TopicMeta, r: &Rejection) -> Response {
    let status = match r.kind {
        RejectionKind::Invalid => {
            node.metrics
                .produce_rejected(t.id, crate::metrics::ProduceRejection::Schema);
            400
        }
        RejectionKind::Busy => 503,
        RejectionKind::Uncompilable => 500,
    };
    error(status, &r.message)
}

/// Refusals shared by single and batch produce once the topic is known.
fn produce_refusal(node: &Node, t: &TopicMeta) -> Option<Response> {
    if let Some(r) = stub_refusal(t) {
        node.metrics
            .produce_rejected(t.id, crate::metrics::ProduceRejection::RemoteChild);
        return Some(r);
    }
    if t.parent.is_some() && t.fanout_delay_ms > 0 {
        node.metrics
            .produce_rejected(t.id, crate::metrics::ProduceRejection::DelayedChild);
        return Some(error(
            409,
            "direct produce to a delayed child topic is not allowed",
        ));
    }
    None
}

/// The `409` of a produce, consume or ack on a remote child's stub (SEMANTICS.md §13): its
/// records live on the remote.
pub(crate) fn stub_refusal(t: &TopicMeta) -> Option<Response> {
    let r = t.remote.as_ref()?;
    Some(error(
        409,
        &format!(
            "remote child \"{}\" lives on remote {}; consume it there",
            t.name, r.name
        ),
    ))
}

/// Parses the `partition` query parameter of produce (API.md §10.1).
fn partition_param(q: &Params, partitions: u32) -> Result<Option<u32>, Response> {
    if q.count("partition") > 1 {
        return Err(error(400, "duplicate partition query parameter"));
    }
    let Some(v) = q.str("partition")? else {
        return Ok(None);
    };
    if v.is_empty() {
        return Err(error(400, "invalid partition: empty"));
    }
    let n = crate::wire::go_atoi(v.as_bytes())
        .map_err(|e| error(400, &format!("invalid partition: {e}")))?;
    if n < 0 {
        return Err(error(400, "invalid partition: must be >= 0"));
    }
    if n >= i64::from(partitions) {
        return Err(error(400, "invalid argument: partition out of range"));
    }
    Ok(Some(n as u32))
}

/// The partition of a produced record: pinned, else its key's hash, else the topic's next
/// round-robin turn (`next_turn`, called only then).
fn pick_partition(
    t: &TopicMeta,
    key: Option<&[u8]>,
    pinned: Option<u32>,
    next_turn: impl FnOnce() -> u32,
) -> u32 {
    if let Some(p) = pinned {
        return p;
    }
    match key {
        Some(k) if !k.is_empty() => wire::fnv1a32(k) % t.partitions,
        _ => next_turn() % t.partitions,
    }
}

/// The query of a produce, parsed before its body is read (API.md §10.1: query parse comes
/// before the body read, the topic lookup and the rest): a single produce's key and pinned
/// partition (its range is checked later, against the topic); a batch produce takes neither.
pub(crate) fn produce_query(
    raw: &str,
    batch: bool,
) -> Result<(Option<Vec<u8>>, Option<u32>), Response> {
    let q = Params::new(raw);
    if batch {
        for p in ["key", "partition"] {
            if q.count(p) > 0 {
                return Err(error(
                    400,
                    &format!("{p} is set per message in a batch produce, not as a query parameter"),
                ));
            }
        }
        return Ok((None, None));
    }
    if q.count("key") > 1 {
        return Err(error(400, "duplicate key query parameter"));
    }
    let key = q.bytes("key")?.filter(|k| !k.is_empty());
    let pinned = partition_param(&q, u32::MAX)?;
    Ok((key, pinned))
}

/// A node being decommissioned takes no client produce (CLUSTER.md §4.4).
fn draining_refusal(node: &Node) -> Option<Response> {
    node.draining_here().then(|| {
        error(
            503,
            "this node is being decommissioned and takes no new produce; send it to another node",
        )
        .with_header("Retry-After", "1")
    })
}

pub async fn produce(node: &Rc<Node>, req: Request, topic: &str) -> Response {
    let _in_flight = node.produce_started();
    let (key, pinned) = tri!(produce_query(&req.query, false));
    if let Some(r) = draining_refusal(node) {
        return r;
    }
    if req.body.is_empty() {
        return error(400, "message required");
    }
    if req.body.len() > BODY_BYTES_MAX {
        return error(413, "request body too large");
    }
    let meta = node.meta();
    let Some(t) = meta.topic(topic) else {
        return error(404, "topic not found");
    };
    if let Some(r) = produce_refusal(node, t) {
        return r;
    }
    if let Err(r) = crate::schema::check_produce(t, &req.body).await {
        return schema_rejected(node, t, &r);
    }
    if pinned.is_some_and(|p| p >= t.partitions) {
        return error(400, "invalid argument: partition out of range");
    }
    let p = pick_partition(t, key.as_deref(), pinned, || {
        node.round_robin_turns(t.id, 1)
    });
    let rec = AppendRecord {
        key: PartitionKey {
            topic: t.id,
            partition: PartitionId(p),
        },
        msg_key: key,
        payload: req.body.into(),
    };
    let tally = crate::metrics::Tally::of(std::slice::from_ref(&rec));
    if node.ingress_refused() {
        return error(500, "produce failed");
    }
    // Another shard's partition: one local fsync, then the hand-off (crate::transit).
    match node.append_single(rec).await {
        Ok(()) => {
            node.metrics.produced(tally);
            Response::empty(202)
        }
        Err(e) => produce_failure(node, e),
    }
}

pub async fn produce_batch(node: &Rc<Node>, req: &mut Request, topic: &str) -> Response {
    let _in_flight = node.produce_started();
    tri!(produce_query(&req.query, true));
    if let Some(r) = draining_refusal(node) {
        return r;
    }
    // A compressed body is decoded under the same cap as a plain one (API.md §10.2).
    let decoded = match wire::encoding::body_encoding(req.headers.get("content-encoding")) {
        Ok(enc) => wire::encoding::decode(enc, &req.body, super::BATCH_BODY_BYTES_MAX).await,
        Err(e) => Err(e),
    };
    let decoded = match decoded {
        Ok(d) => d,
        Err(e) => return error(e.status(), &e.message()),
    };
    // The records' payloads stay ranges of this one buffer: no allocation or copy each.
    let body = std::sync::Arc::new(decoded.unwrap_or_else(|| std::mem::take(&mut req.body)));
    // Pass one: format of every element (encodings, empty payloads, negative partitions).
    // Base64 payloads are decoded into one buffer, shared by their records like the body.
    let mut from_base64 = Vec::new();
    let msgs = match wire::body::parse_batch_produce(&body, &mut from_base64) {
        Ok(m) => m,
        Err(e) => return error(e.status(), e.message()),
    };
    let from_base64 = std::sync::Arc::new(from_base64);
    let meta = node.meta();
    let Some(t) = meta.topic(topic) else {
        return error(404, "topic not found");
    };
    if let Some(r) = produce_refusal(node, t) {
        return r;
    }
    // Pass two: schema, then partition range, per message; then every record goes to the log in
    // one append per shard.
    let schema = tri!(crate::schema::for_topic(t).map_err(|r| schema_rejected(node, t, &r)));
    let mut records = Vec::with_capacity(msgs.len());
    // The keyless messages take consecutive turns of the topic's rotation, reserved at once.
    let keyless = msgs
        .iter()
        .filter(|m| m.partition.is_none() && m.key.as_deref().is_none_or(<[u8]>::is_empty))
        .count() as u32;
    let mut turn = if keyless > 0 {
        node.round_robin_turns(t.id, keyless)
    } else {
        0
    };
    for (i, m) in msgs.into_iter().enumerate() {
        if let Some(s) = &schema {
            tri!(s
                .check(m.payload.bytes(&from_base64))
                .await
                .map_err(|r| schema_rejected(node, t, &r.at(i))));
        }
        if let Some(p) = m.partition {
            if p.0 >= t.partitions {
                return error(
                    400,
                    &format!("message {i}: invalid argument: partition out of range"),
                );
            }
        }
        let p = pick_partition(t, m.key.as_deref(), m.partition.map(|p| p.0), || {
            turn = turn.wrapping_add(1);
            turn.wrapping_sub(1)
        });
        records.push(AppendRecord {
            key: PartitionKey {
                topic: t.id,
                partition: PartitionId(p),
            },
            msg_key: m.key.map(|k| k.into_owned()).filter(|k| !k.is_empty()),
            payload: match m.payload {
                wire::Payload::Raw(raw) => SharedBytes::within(&body, raw),
                wire::Payload::Decoded(r) => SharedBytes::new(from_base64.clone(), r),
            },
        });
    }
    let n = records.len();
    let tally = crate::metrics::Tally::of(&records);
    if node.ingress_refused() {
        return error(500, "produce failed");
    }
    match node.append(records).await {
        Ok(()) => {
            node.metrics.produced(tally);
            Response::json(202, format!("{{\"accepted\":{n}}}\n").into_bytes())
        }
        Err(e) => produce_failure(node, e),
    }
}

fn write_message(
    out: &mut Vec<u8>,
    topic: &str,
    partition: u32,
    l: &narad_io::log::StoredRecord,
    lease: Option<Nonce>,
) {
    wire::json::MessageJson {
        topic,
        partition: PartitionId(partition),
        offset: l.offset,
        key: l.msg_key.as_deref(),
        payload: &l.payload,
        timestamp: l.commit_ms,
        receipt_handle: lease.map(|nonce| ReceiptHandle {
            partition: PartitionId(partition),
            offset: l.offset,
            nonce,
        }),
    }
    .write_to(out);
}

/// `catch_up`: the single produces accepted before this request that were not yet at their
/// owners ([`narad_shard::transit::Transit::mark`]); the read waits for them only if it comes up short.
pub async fn consume(
    node: &Rc<Node>,
    req: &Request,
    topic: &str,
    catch_up: Option<CatchUpMark>,
) -> Response {
    let q = Params::new(&req.query);
    let ceiling = node.config.consume_wait_ceiling();
    let (wait, clamped) = match tri!(q.str("wait")) {
        None => (std::time::Duration::ZERO, false),
        Some(s) if s.is_empty() => (std::time::Duration::ZERO, false),
        Some(s) => match GoDuration::parse(s.as_bytes()) {
            Ok(d) if d.nanos <= 0 => (std::time::Duration::ZERO, false),
            Ok(d) => {
                let d = d.to_std();
                if d > ceiling {
                    (ceiling, true)
                } else {
                    (d, false)
                }
            }
            Err(e) => return error(400, &format!("invalid wait: {e}")),
        },
    };
    let max = match tri!(q.str("max")) {
        None => None,
        Some(s) => match s.parse::<i64>() {
            Ok(n) if (1..=CONSUME_BATCH_MAX as i64).contains(&n) => Some(n as usize),
            _ => {
                return error(
                    400,
                    &format!("invalid max: must be an integer between 1 and {CONSUME_BATCH_MAX}"),
                )
            }
        },
    };
    if max.is_some()
        && req
            .headers
            .get("x-narad-client")
            .is_none_or(<[u8]>::is_empty)
    {
        return error(
            400,
            "batch consume (max) requires the X-Narad-Client header",
        );
    }
    let offset = match tri!(q.str("offset")) {
        None => None,
        Some(s) => match crate::wire::go_parse_int64(s.as_bytes()) {
            Ok(n) if n < 0 => return error(400, "invalid offset: must be >= 0"),
            Ok(n) => Some(n as u64),
            Err(e) => return error(400, &format!("invalid offset: {e}")),
        },
    };
    if offset.is_some() && max.is_some() {
        return error(
            400,
            "max cannot be combined with offset (replay reads one record)",
        );
    }
    let partition_raw = tri!(q.str("partition"));
    let meta = node.meta();
    let Some(t) = meta.topic(topic) else {
        return error(404, "topic not found");
    };
    if let Some(r) = stub_refusal(t) {
        return r;
    }
    let partition = match partition_raw {
        None => None,
        Some(s) => match crate::wire::go_atoi(s.as_bytes()) {
            Ok(n) if n >= 0 && n < i64::from(t.partitions) => Some(n as u32),
            Ok(_) => return error(400, "invalid partition: out of range"),
            Err(e) => return error(400, &format!("invalid partition: {e}")),
        },
    };
    let mut resp = if let Some(off) = offset {
        let Some(p) = partition else {
            return error(400, "partition required for replay-mode consume");
        };
        replay(node, t, p, off, catch_up).await
    } else {
        let ask = QueueAsk {
            partition,
            max,
            wait,
            local_only: tri!(q.str("local_only")).as_deref() == Some("1"),
        };
        queue_consume(node, req, t, ask, catch_up).await
    };
    if clamped {
        resp.headers.push((
            "X-Narad-Wait-Clamped".into(),
            GoDuration::from_std(ceiling).to_string(),
        ));
    }
    resp
}

async fn replay(
    node: &Rc<Node>,
    t: &TopicMeta,
    p: u32,
    offset: u64,
    catch_up: Option<CatchUpMark>,
) -> Response {
    let key = PartitionKey {
        topic: t.id,
        partition: PartitionId(p),
    };
    let mut read = node.read_at(key, Offset(offset)).await;
    if let (Ok(None), Some(m)) = (&read, catch_up) {
        // The end of the log: the record may still be on its way to its owner.
        node.transit.catch_up(m).await;
        read = node.read_at(key, Offset(offset)).await;
    }
    match read {
        Ok(None) => Response::empty(204),
        Ok(Some(rec)) => {
            let mut body = Vec::with_capacity(rec.payload.len() + 128);
            write_message(&mut body, &t.name, p, &rec, None);
            body.push(b'\n');
            Response::json(200, body)
        }
        Err(ReadFailure::BelowRetention { oldest }) => error(
            410,
            &format!(
                "{GONE}: offset {offset} aged out of retention (oldest retained: {})",
                oldest.0
            ),
        ),
        Err(ReadFailure::Unreadable) => {
            error(410, &format!("{GONE}: offset {offset} is unreadable"))
        }
        Err(ReadFailure::Owner(e)) => owner_response(&e),
        Err(ReadFailure::Shard(e @ ShardCallError::Timeout { .. })) => shard_timeout(e),
        Err(ReadFailure::Shard(e @ ShardCallError::Gone { .. })) => {
            tracing::error!(error = %e, "partition read failed");
            error(500, "partition unreadable")
        }
        Err(ReadFailure::Failed(e)) => {
            tracing::error!(error = %e, "partition read failed");
            error(500, "partition unreadable")
        }
    }
}

/// What a queue consume asks for (API.md §10.3).
struct QueueAsk {
    partition: Option<u32>,
    max: Option<usize>,
    wait: std::time::Duration,
    local_only: bool,
}

async fn queue_consume(
    node: &Rc<Node>,
    req: &Request,
    t: &TopicMeta,
    ask: QueueAsk,
    mut catch_up: Option<CatchUpMark>,
) -> Response {
    let QueueAsk {
        partition,
        max,
        wait,
        local_only,
    } = ask;
    let mut conf = queue_conf(t);
    let mut partitions: Vec<PartitionId> = match partition {
        Some(p) => vec![PartitionId(p)],
        None => (0..t.partitions).map(PartitionId).collect(),
    };
    let n = max.unwrap_or(1);
    let waited = crate::metrics::ConsumeWait::start(local_only || wait.is_zero());
    let deadline = now_ms()
        + if local_only {
            0
        } else {
            wait.as_millis() as u64
        };
    loop {
        // Before the look: a wake-up during it (the take awaits other shards) is seen below.
        let ticket = node.work_ticket(t.id);
        let mut leased = match take_logged(node, conf, &partitions, n).await {
            Ok(l) => l,
            Err(answer) => return answer,
        };
        if leased.len() < n {
            if let Some(m) = catch_up.take() {
                // Short: the single produces answered before this request may still be on
                // their way to their owners; wait for them and look for the rest once more.
                node.transit.catch_up(m).await;
                match take_logged(node, conf, &partitions, n - leased.len()).await {
                    Ok(more) => leased.extend(more),
                    Err(answer) if leased.is_empty() => return answer,
                    Err(_) => {}
                }
            }
        }
        if !leased.is_empty() {
            waited.hit(&node.metrics, t.id);
            return deliver(node, t, leased, max.is_some()).await;
        }
        if now_ms() >= deadline || node.shutting_down() {
            waited.empty(&node.metrics, t.id, node.shutting_down());
            return Response::empty(204);
        }
        // Park until work may be there (or the wait ends), looking at the client at least once a
        // second: one that went away must not be leased records, which would stay hidden from
        // live consumers for a whole visibility timeout, nor hold its consume slot till the end.
        loop {
            let woken = node.wait_for_work(t.id, deadline, ticket).await;
            if req.client_disconnected() {
                waited.gone(&node.metrics, t.id);
                return Response::empty(499);
            }
            if woken || now_ms() >= deadline || node.shutting_down() {
                break;
            }
        }
        // Look again at the topic as it is now: it may have been deleted (a consume of a topic
        // that does not exist is 404), or altered while this waited (new caps apply at once,
        // SEMANTICS.md §2.6; added partitions are looked at too). Metadata changes wake it.
        let meta = node.meta();
        let Some(now) = meta.topic(&t.name).filter(|n| n.id == t.id) else {
            waited.empty(&node.metrics, t.id, false);
            return error(404, "topic not found");
        };
        conf = queue_conf(now);
        if partition.is_none() && partitions.len() != now.partitions as usize {
            partitions = (0..now.partitions).map(PartitionId).collect();
        }
    }
}

/// [`Node::take`]; a failure is logged and becomes its answer: `500 partition unreadable`, or
/// the `503` of an owner shard that did not answer in time.
async fn take_logged(
    node: &Rc<Node>,
    conf: QueueConf,
    partitions: &[PartitionId],
    n: usize,
) -> Result<Vec<Leased>, Response> {
    node.take(conf, partitions, n).await.map_err(|e| {
        tracing::error!(error = ?e, "consume failed");
        match e {
            StoreError::Shard(e @ ShardCallError::Timeout { .. }) => shard_timeout(e),
            StoreError::Owner(e) => owner_response(&e),
            _ => error(500, "partition unreadable"),
        }
    })
}

async fn deliver(node: &Rc<Node>, t: &TopicMeta, leased: Vec<Leased>, batch: bool) -> Response {
    let mut body = Vec::with_capacity(
        leased
            .iter()
            .map(|l| l.record.payload.len() + 160)
            .sum::<usize>()
            + 16,
    );
    if !batch {
        node.metrics.consumed(t.id, &leased[..1]);
        let l = &leased[0];
        write_message(&mut body, &t.name, l.partition.0, &l.record, Some(l.nonce));
        body.push(b'\n');
        return Response::json(200, body);
    }
    body.extend_from_slice(b"{\"messages\":[");
    let mut unsent = Vec::new();
    // The messages written stay within CONSUME_RESPONSE_BYTES_MAX (the first always goes out);
    // from the first that does not fit, the rest are released, so the order holds.
    for (i, l) in leased.iter().enumerate() {
        if unsent.is_empty() {
            let mark = body.len();
            if i > 0 {
                body.push(b',');
            }
            write_message(&mut body, &t.name, l.partition.0, &l.record, Some(l.nonce));
            // The closing `]}\n` counts too.
            if i == 0 || body.len() + 3 <= CONSUME_RESPONSE_BYTES_MAX {
                continue;
            }
            body.truncate(mark);
        }
        unsent.push((l.partition, l.record.offset, l.nonce));
    }
    body.extend_from_slice(b"]}\n");
    node.metrics
        .consumed(t.id, &leased[..leased.len() - unsent.len()]);
    if !unsent.is_empty() {
        node.release(t.id, unsent).await;
    }
    Response::json(200, body)
}

pub async fn ack(node: &Rc<Node>, req: &Request, topic: &str) -> Response {
    let q = Params::new(&req.query);
    let kind = match tri!(q.str("extend")).as_deref() {
        None | Some("") | Some("false") => SettleKind::Ack,
        Some("true") | Some("1") => SettleKind::Extend,
        Some("0") => SettleKind::Nack,
        Some(_) => {
            return error(
                400,
                "invalid extend: want \"true\" (renew lease) or \"0\" (release for redelivery)",
            )
        }
    };
    let single = tri!(q.bytes("receipt_handle")).filter(|h| !h.is_empty());
    let handles: Vec<Result<ReceiptHandle, MalformedHandle>> =
        match (&single, req.body.iter().any(|b| !b.is_ascii_whitespace())) {
            (Some(h), _) => vec![ReceiptHandle::parse(h)],
            (None, true) => match wire::body::parse_batch_ack(&req.body) {
                Ok(hs) => hs,
                Err(e) => return error(400, &e),
            },
            (None, false) => return error(400, "receipt_handle required"),
        };
    let meta = node.meta();
    let Some(t) = meta.topic(topic) else {
        return error(404, "topic not found");
    };
    if let Some(r) = stub_refusal(t) {
        return r;
    }
    let conf = queue_conf(t);
    // Parse every handle; malformed ones answer 400, foreign partitions 410, without a lease lookup.
    let mut parsed: Vec<Result<Lease, (u16, &'static str)>> = Vec::with_capacity(handles.len());
    for h in handles {
        parsed.push(match h {
            Err(_) => Err((400, "receipt handle is malformed")),
            Ok(rh) if rh.partition.0 >= t.partitions => Err((410, GONE)),
            Ok(rh) => Ok((rh.partition, rh.offset, rh.nonce)),
        });
    }
    let items: Vec<(PartitionId, Offset, Nonce)> = parsed
        .iter()
        .filter_map(|r| r.as_ref().ok().copied())
        .collect();
    let settled = node.settle(conf, kind, &items).await;
    node.metrics
        .settled(t.id, kind, settled.iter().filter(|r| r.is_ok()).count());
    let mut results = settled.into_iter();
    // Per handle: status, error message, and whether to send Retry-After (the owner shard timed
    // out, or its disk is full).
    let outcome: Vec<(u16, Option<String>, bool)> = parsed
        .iter()
        .map(|r| match r {
            Err((s, m)) => (*s, Some((*m).to_string()), false),
            Ok(_) => match results.next() {
                Some(Ok(())) => (204, None, false),
                Some(Err(SettleFailure::Gone)) | None => (410, Some(GONE.to_string()), false),
                Some(Err(SettleFailure::Owner(e))) => {
                    let (status, text, retry) = owner_failure(&e);
                    (status, Some(text.to_string()), retry)
                }
                Some(Err(SettleFailure::Shard(e @ ShardCallError::Timeout { .. }))) => {
                    tracing::error!(error = %e, "ack got no answer from its shard");
                    (503, Some(shard_timeout_message(e)), true)
                }
                Some(Err(SettleFailure::Shard(e @ ShardCallError::Gone { .. }))) => {
                    tracing::error!(error = %e, "ack could not be made durable");
                    (
                        503,
                        Some("ack could not be made durable; retry".to_string()),
                        false,
                    )
                }
                Some(Err(SettleFailure::DiskFull)) => (503, Some(ACK_DISK_FULL.to_string()), true),
                Some(Err(SettleFailure::Failed(e))) => {
                    tracing::error!(error = %e, "ack could not be made durable");
                    (
                        503,
                        Some("ack could not be made durable; retry".to_string()),
                        false,
                    )
                }
            },
        })
        .collect();
    if single.is_some() {
        let (status, msg, timed_out) = &outcome[0];
        let r = match msg {
            None => Response::empty(*status),
            Some(m) => error(*status, m),
        };
        return if *timed_out {
            r.with_header("Retry-After", "1")
        } else {
            r
        };
    }
    let mut body = Vec::with_capacity(outcome.len() * 24 + 16);
    body.extend_from_slice(b"{\"results\":[");
    for (i, (status, msg, _)) in outcome.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(b"{\"status\":");
        wire::push_u64(&mut body, u64::from(*status));
        if let Some(m) = msg {
            body.extend_from_slice(b",\"error\":");
            wire::json::push_json_string(&mut body, m.as_bytes());
        }
        body.push(b'}');
    }
    body.extend_from_slice(b"]}\n");
    Response::json(200, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_failures_answer_500_produce_failed() {
        // Proves both log refusals are API.md §10.1's 500 whose error starts "produce failed"
        // (what clients retry elsewhere), and that a full disk says so.
        let full = store_failure(StoreError::DiskFull);
        let other = store_failure(StoreError::Failed("fsync: EIO".into()));
        for r in [&full, &other] {
            assert_eq!(r.status, 500);
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            assert!(v["error"].as_str().unwrap().starts_with("produce failed"));
        }
        assert!(String::from_utf8_lossy(&full.body).contains("disk full"));
        assert_eq!(&other.body[..], &b"{\"error\":\"produce failed\"}\n"[..]);
        // A produce that raced a topic delete is the 404 of an unknown topic.
        let gone = store_failure(StoreError::TopicGone);
        assert_eq!(gone.status, 404);
        assert_eq!(&gone.body[..], &b"{\"error\":\"topic not found\"}\n"[..]);
    }

    #[test]
    fn an_owner_shard_that_times_out_answers_503_retry_after_and_a_gone_one_500() {
        // Proves the API layer's choice for a produce whose owner shard did not answer: a
        // timeout is a 503 with Retry-After: 1 naming the shard and the deadline (the record may
        // still be stored: retry), while a shard that left keeps today's 500 "produce failed".
        use narad_io::types::ShardId;
        let timeout = store_failure(StoreError::Shard(ShardCallError::Timeout {
            shard: ShardId(1),
            after: std::time::Duration::from_millis(crate::node::MESH_DATA_CALL_TIMEOUT_MS),
        }));
        assert_eq!(timeout.status, 503);
        assert_eq!(timeout.header("Retry-After"), Some("1"));
        assert_eq!(
            &timeout.body[..],
            &b"{\"error\":\"shard 1 did not answer within 30s; retry\"}\n"[..]
        );
        let gone = store_failure(StoreError::Shard(ShardCallError::Gone {
            shard: ShardId(1),
        }));
        assert_eq!(gone.status, 500);
        assert_eq!(gone.header("Retry-After"), None);
        assert_eq!(&gone.body[..], &b"{\"error\":\"produce failed\"}\n"[..]);
    }
}
