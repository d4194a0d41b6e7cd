//! Remote children (SEMANTICS.md §13): shipping a parent's records to a topic on another Narad
//! cluster through that cluster's batch produce, over HTTPS.
//!
//! Owns: the [`Shipper`] each shard hands its fan-out (`narad_shard::fanout`) for links whose
//! child is a remote stub, the HTTPS connections to remotes (a few idle ones kept per remote),
//! the chunking of a slab into requests, and the classification of a failure into the states
//! of §13. The cursor, its durable position, retries and restarts are the fan-out's: a cursor
//! moves only past the records a call reports as answered `202` by the target, so a record is
//! on the target at least once (a request that got no answer is sent again: duplicates, never
//! gaps). The checks before an attach run through [`probe`].

pub mod client;
pub mod guard;

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::time::Duration;

use narad_io::log::AppendRecord;
use narad_io::types::{PartitionKey, TopicId};
use narad_raft::{MetaState, RemoteChildMeta, RemoteMeta};
use narad_shard::fanout::{ShipError, ShipFuture, Shipper as ShipFn};

use crate::auth::seal::RemoteKey;
use crate::node::Node;
use client::{Conn, Target};

/// Records one request carries at most (API.md §10.2: 1000 per batch on a v3.2 target).
pub const CHUNK_RECORDS_MAX: usize = 1000;
/// Body bytes one request carries at most (SEMANTICS.md §13: chunks ≤ 960 KiB).
pub const CHUNK_BYTES_MAX: usize = 960 << 10;
/// The smallest chunk: where repeated timeouts leave it (SEMANTICS.md §13 "Transport").
pub const CHUNK_BYTES_MIN: usize = 64 << 10;
/// Answered requests in a row after which a reduced chunk doubles again.
const CHUNK_GROW_AFTER: u32 = 20;
/// Idle connections kept per remote on one shard.
const IDLE_CONNS_MAX: usize = 4;

/// Why a partition of a remote child does not ship (SEMANTICS.md §13 "States"), as the fan-out
/// stores it (`code`): a higher code is worse, 0 is `running`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Class {
    Unknown = 1,
    Throttled,
    Unavailable,
    RecordTooLarge,
    RejectedRecord,
    TlsFailed,
    RedirectRefused,
    NoBatchProduce,
    TargetMissing,
    Forbidden,
    AuthFailed,
    TargetReplaced,
    TargetHasRemoteChildren,
    DestinationRefused,
    NodeInsecure,
    CredentialUnreadable,
    RemoteMissing,
}

const CLASSES: [Class; 17] = [
    Class::Unknown,
    Class::Throttled,
    Class::Unavailable,
    Class::RecordTooLarge,
    Class::RejectedRecord,
    Class::TlsFailed,
    Class::RedirectRefused,
    Class::NoBatchProduce,
    Class::TargetMissing,
    Class::Forbidden,
    Class::AuthFailed,
    Class::TargetReplaced,
    Class::TargetHasRemoteChildren,
    Class::DestinationRefused,
    Class::NodeInsecure,
    Class::CredentialUnreadable,
    Class::RemoteMissing,
];

impl Class {
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Unknown => "unknown",
            Class::Throttled => "throttled",
            Class::Unavailable => "unavailable",
            Class::RecordTooLarge => "record_too_large",
            Class::RejectedRecord => "rejected_record",
            Class::TlsFailed => "tls_failed",
            Class::RedirectRefused => "redirect_refused",
            Class::NoBatchProduce => "no_batch_produce",
            Class::TargetMissing => "target_missing",
            Class::Forbidden => "forbidden",
            Class::AuthFailed => "auth_failed",
            Class::TargetReplaced => "target_replaced",
            Class::TargetHasRemoteChildren => "target_has_remote_children",
            Class::DestinationRefused => "destination_refused",
            Class::NodeInsecure => "node_insecure",
            Class::CredentialUnreadable => "credential_unreadable",
            Class::RemoteMissing => "remote_missing",
        }
    }

    /// The class stored as `code` by the fan-out (0, `running`, is none).
    pub fn from_code(code: u8) -> Option<Class> {
        CLASSES.iter().copied().find(|c| *c as u8 == code)
    }

    /// A record the target refuses: the cursor stops on it until an operator skips it.
    pub fn blocks_record(self) -> bool {
        matches!(self, Class::RejectedRecord | Class::RecordTooLarge)
    }
}

/// The state name of fan-out code `code` (0 = `running`).
pub fn state_name(code: u8) -> &'static str {
    Class::from_code(code).map_or("running", Class::as_str)
}

/// What an answer's status says about the request (`None`: accepted).
fn classify(status: u16, body: &[u8]) -> Option<Class> {
    Some(match status {
        200..=202 => return None,
        300..=399 => Class::RedirectRefused,
        400 => Class::RejectedRecord,
        401 => Class::AuthFailed,
        403 => Class::Forbidden,
        404 => {
            if String::from_utf8_lossy(body).contains("topic not found") {
                Class::TargetMissing
            } else {
                Class::NoBatchProduce
            }
        }
        413 => Class::RecordTooLarge,
        429 => Class::Throttled,
        500..=599 => Class::Unavailable,
        _ => Class::Unknown,
    })
}

/// The index of the refused message in a batch produce's error (`message <i>: ...`).
fn refused_index(body: &[u8]) -> Option<usize> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let e = v.get("error")?.as_str()?;
    let rest = e.strip_prefix("message ")?;
    rest.split(':').next()?.trim().parse().ok()
}

thread_local! {
    /// This shard's shipper (one per shard thread, as the node it serves).
    static SHIPPER: RefCell<Option<Rc<Shipper>>> = const { RefCell::new(None) };
}

/// Builds this shard's shipper and hands it to the shard's fan-out (call once, after
/// `Node::start_fanout`).
pub fn install(node: &Rc<Node>) {
    let s = Shipper::new(node);
    node.set_shipper(s.as_fn(), state_name);
    let weak = Rc::downgrade(node);
    node.set_probe_hook(Rc::new(move |op: u8, ask: Vec<u8>| {
        let weak = weak.clone();
        Box::pin(async move {
            let node = weak.upgrade().ok_or("node stopped")?;
            let answer = if op == narad_io::peer::ops::REMOTE_VIEW {
                let meta = node.meta();
                let views: serde_json::Map<String, serde_json::Value> = meta
                    .remotes
                    .values()
                    .map(|r| (r.name.clone(), node_view(&node, r)))
                    .collect();
                serde_json::Value::Object(views)
            } else {
                serve_probe(&node, &ask).await
            };
            Ok(answer.to_string().into_bytes())
        })
    }));
    SHIPPER.with(|x| *x.borrow_mut() = Some(s));
}

/// This shard's shipper, once installed.
pub fn local() -> Option<Rc<Shipper>> {
    SHIPPER.with(|x| x.borrow().clone())
}

/// A link's periodic check: the stub, the target id it accepted, the registry revision.
type CheckKey = (TopicId, String, u64);
/// When a link was checked, and the verdict.
type Checked = (std::time::Instant, Result<(), Class>);

/// One shard's shipping to remotes.
pub struct Shipper {
    node: Weak<Node>,
    idle: RefCell<HashMap<String, Vec<Conn>>>,
    /// The target of each remote, for the registry revision it was built from.
    targets: RefCell<HashMap<String, (u64, Rc<Target>)>>,
    /// The last periodic check of each link: (stub, accepted target id, registry revision) →
    /// when, and its verdict.
    checks: RefCell<HashMap<CheckKey, Checked>>,
    /// Each remote's chunk limit on this shard, and the answered requests since it last moved.
    chunk: RefCell<HashMap<String, (usize, u32)>>,
    /// Each remote's in-flight requests on this shard: its share of `limits.max_in_flight`
    /// (the limit it was made for, the slots).
    gates: RefCell<HashMap<String, (u64, Rc<narad_io::rt::Semaphore>)>>,
}

impl Shipper {
    pub fn new(node: &Rc<Node>) -> Rc<Shipper> {
        Rc::new(Shipper {
            node: Rc::downgrade(node),
            idle: RefCell::new(HashMap::new()),
            targets: RefCell::new(HashMap::new()),
            checks: RefCell::new(HashMap::new()),
            chunk: RefCell::new(HashMap::new()),
            gates: RefCell::new(HashMap::new()),
        })
    }

    /// The function the fan-out calls for a remote link's records.
    pub fn as_fn(self: &Rc<Self>) -> ShipFn {
        let me = Rc::downgrade(self);
        Rc::new(move |parent, child, recs| -> ShipFuture {
            let me = me.clone();
            Box::pin(async move {
                let Some(me) = me.upgrade() else {
                    return Err(ShipError {
                        done: 0,
                        code: Class::Unavailable as u8,
                    });
                };
                me.ship(parent, child, recs).await
            })
        })
    }

    fn count(&self, remote: &str, f: impl FnOnce(&mut crate::metrics::remote::RemoteCounters)) {
        crate::metrics::remote::count(remote, f);
    }

    /// The in-flight slots of `remote` on this shard: `max_in_flight` shared by the shards (at
    /// least one each).
    fn gate(&self, remote: &str, max_in_flight: u64, shards: u32) -> Rc<narad_io::rt::Semaphore> {
        let share = (max_in_flight / u64::from(shards.max(1))).max(1);
        let mut gates = self.gates.borrow_mut();
        match gates.get(remote) {
            Some((limit, g)) if *limit == share => g.clone(),
            _ => {
                let g = Rc::new(narad_io::rt::Semaphore::new(share as usize));
                gates.insert(remote.to_string(), (share, g.clone()));
                g
            }
        }
    }

    /// This shard's chunk limit for `remote` (body bytes per request).
    fn chunk_limit(&self, remote: &str) -> usize {
        self.chunk
            .borrow()
            .get(remote)
            .map_or(CHUNK_BYTES_MAX, |c| c.0)
    }

    /// A request to `remote` timed out: halve its chunk, down to [`CHUNK_BYTES_MIN`].
    fn chunk_timed_out(&self, remote: &str) {
        let mut m = self.chunk.borrow_mut();
        let c = m.entry(remote.to_string()).or_insert((CHUNK_BYTES_MAX, 0));
        *c = (shrunk(c.0), 0);
        let limit = c.0;
        drop(m);
        self.count(remote, |k| k.chunk_limit = limit as u64);
    }

    /// A request to `remote` was answered: after [`CHUNK_GROW_AFTER`] in a row a reduced
    /// chunk doubles, up to [`CHUNK_BYTES_MAX`].
    fn chunk_answered(&self, remote: &str) {
        let mut m = self.chunk.borrow_mut();
        let c = m.entry(remote.to_string()).or_insert((CHUNK_BYTES_MAX, 0));
        *c = grown(c.0, c.1);
        let limit = c.0;
        drop(m);
        self.count(remote, |k| k.chunk_limit = limit as u64);
    }

    /// The target of remote `r`, built once per registry revision (the password opened here).
    fn target(&self, node: &Node, r: &RemoteMeta) -> Result<Rc<Target>, Class> {
        if let Some((rev, t)) = self.targets.borrow().get(&r.name) {
            if *rev == r.revision {
                return Ok(t.clone());
            }
        }
        let t = Rc::new(build_target(node, r)?);
        self.targets
            .borrow_mut()
            .insert(r.name.clone(), (r.revision, t.clone()));
        // Connections made with the old credentials or CA are not reused.
        self.idle.borrow_mut().remove(&r.name);
        Ok(t)
    }

    async fn ship(
        &self,
        _parent: PartitionKey,
        child: TopicId,
        recs: Vec<AppendRecord>,
    ) -> Result<(), ShipError> {
        let fail = |done: usize, c: Class| ShipError {
            done,
            code: c as u8,
        };
        let Some(node) = self.node.upgrade() else {
            return Err(fail(0, Class::Unavailable));
        };
        let meta = node.meta();
        let Some((rc, remote)) = remote_of(&meta, child) else {
            return Err(fail(0, Class::RemoteMissing));
        };
        let target = self.target(&node, &remote).map_err(|c| fail(0, c))?;
        if let Err(c) = self.recheck(&node, child, &rc, &remote).await {
            self.count(&remote.name, |k| {
                *k.errors.entry(c.as_str()).or_default() += 1
            });
            return Err(fail(0, c));
        }
        // Topic names are plain (letters, digits, `.`, `_`, `-`): no escaping needed.
        let path = format!("/v1/topics/{}/produce/batch", rc.topic);
        let held: u64 = recs.iter().map(|r| r.payload.len() as u64).sum();
        let _held = crate::metrics::remote::Held::new(held);
        let limit = self.chunk_limit(&remote.name);
        let lanes = rc.lanes.max(1) as usize;
        let r = if lanes == 1 || recs.len() < 2 {
            self.send_stream(&remote.name, &target, &path, &recs, limit)
                .await
        } else {
            self.send_lanes(&remote.name, &target, &path, recs, lanes, limit)
                .await
        };
        r.map_err(|(n, c)| {
            self.count(&remote.name, |k| {
                *k.errors.entry(c.as_str()).or_default() += 1
            });
            fail(n, c)
        })
    }

    /// Sends `recs` in order, a chunk at a time. `Err((n, class))`: the first `n` are on the
    /// target, the rest are not.
    async fn send_stream(
        &self,
        remote: &str,
        t: &Target,
        path: &str,
        recs: &[AppendRecord],
        limit: usize,
    ) -> Result<(), (usize, Class)> {
        let mut done = 0;
        for chunk in chunks(recs, limit) {
            match self.send_chunk(remote, t, path, chunk).await {
                Ok(()) => done += chunk.len(),
                Err((n, c)) => return Err((done + n, c)),
            }
        }
        Ok(())
    }

    /// Sends `recs` as `lanes` ordered streams at once (API.md §9.1 `lanes`): a keyed record's
    /// lane follows its key, a keyless one its position. The records on the target are then a
    /// prefix per lane; the answer's `n` is the longest prefix of `recs` (in offset order) that is
    /// all on the target, so the cursor stops at the first record some lane did not deliver
    /// (the lanes' later records go again: duplicates, never gaps).
    async fn send_lanes(
        &self,
        remote: &str,
        t: &Target,
        path: &str,
        recs: Vec<AppendRecord>,
        lanes: usize,
        limit: usize,
    ) -> Result<(), (usize, Class)> {
        let mut streams: Vec<Vec<AppendRecord>> = vec![Vec::new(); lanes];
        let mut place: Vec<(usize, usize)> = Vec::with_capacity(recs.len());
        for (i, r) in recs.into_iter().enumerate() {
            let lane = match r.msg_key.as_deref() {
                Some(k) if !k.is_empty() => crate::wire::key_partition(k, lanes as u32) as usize,
                _ => i % lanes,
            };
            place.push((lane, streams[lane].len()));
            streams[lane].push(r);
        }
        let sends = streams
            .iter()
            .map(|s| self.send_stream(remote, t, path, s, limit));
        let results = futures_util::future::join_all(sends).await;
        if results.iter().all(Result::is_ok) {
            return Ok(());
        }
        let delivered: Vec<usize> = results
            .iter()
            .zip(&streams)
            .map(|(r, s)| match r {
                Ok(()) => s.len(),
                Err((n, _)) => *n,
            })
            .collect();
        let worst = results
            .iter()
            .filter_map(|r| r.as_ref().err().map(|(_, c)| *c))
            .max()
            .unwrap_or(Class::Unknown);
        Err((delivered_prefix(&place, &delivered), worst))
    }

    /// The checks of SEMANTICS.md §13 again, at most once per the remote's `check_interval_ms`
    /// for each link on this shard: a target recreated since the attach (`target_replaced`, until
    /// a resume accepts it), a credential that stopped working, a target that gained remote
    /// children. The verdict holds until the next check; a resume (a new accepted target id) or
    /// a changed registry entry checks again at once.
    async fn recheck(
        &self,
        node: &Node,
        child: TopicId,
        rc: &RemoteChildMeta,
        remote: &RemoteMeta,
    ) -> Result<(), Class> {
        let every = Duration::from_millis(remote.limits.check_interval_ms.max(1));
        let key = (child, rc.target_id.clone(), remote.revision);
        if let Some((at, verdict)) = self.checks.borrow().get(&key) {
            if at.elapsed() < every {
                return *verdict;
            }
        }
        let verdict = match Box::pin(probe(node, remote, &rc.topic)).await {
            Ok(info) if info.id != rc.target_id => Err(Class::TargetReplaced),
            Ok(_) => Ok(()),
            // A target that does not answer is what shipping itself reports.
            Err(f) if f.class == Class::Unavailable => Ok(()),
            Err(f) => Err(f.class),
        };
        if verdict.is_err() {
            crate::metrics::remote::check_failed(child);
        }
        let mut checks = self.checks.borrow_mut();
        checks.retain(|(c, _, _), _| *c != child);
        checks.insert(key, (std::time::Instant::now(), verdict));
        verdict
    }

    /// Sends one chunk. `Err((n, class))`: the first `n` records are on the target (a refused
    /// record at index `n` whose predecessors were then sent on their own), the rest are not.
    async fn send_chunk(
        &self,
        remote: &str,
        t: &Target,
        path: &str,
        recs: &[AppendRecord],
    ) -> Result<(), (usize, Class)> {
        let body = batch_body(recs);
        let reply = self.post(remote, t, path, &body, recs.len()).await?;
        match classify(reply.status, &reply.body) {
            None => Ok(()),
            Some(c) if c.blocks_record() => {
                let i = refused_index(&reply.body).unwrap_or(0).min(recs.len());
                if i == 0 {
                    return Err((0, c));
                }
                // All or nothing: the records before the refused one were not stored either.
                let body = batch_body(&recs[..i]);
                let again = self.post(remote, t, path, &body, i).await?;
                match classify(again.status, &again.body) {
                    None => Err((i, c)),
                    Some(c2) => Err((0, c2)),
                }
            }
            Some(c) => Err((0, c)),
        }
    }

    /// One request on a pooled (or new) connection; a connection that fails is dropped.
    async fn post(
        &self,
        remote: &str,
        t: &Target,
        path: &str,
        body: &[u8],
        records: usize,
    ) -> Result<client::Reply, (usize, Class)> {
        let gate = self.gate(remote, t.max_in_flight, t.shards);
        let asked = std::time::Instant::now();
        let _slot = gate.acquire().await;
        let waited = asked.elapsed().as_micros() as u64;
        self.count(remote, |k| k.waited_for_slot(waited));
        let pooled = self.idle.borrow_mut().get_mut(remote).and_then(|v| v.pop());
        let mut conn = match pooled {
            Some(c) => c,
            None => Box::pin(client::connect(t)).await.map_err(|c| {
                if c == Class::DestinationRefused {
                    self.count(remote, |k| {
                        *k.destination_refused.entry("address").or_default() += 1
                    });
                }
                (0, c)
            })?,
        };
        let started = std::time::Instant::now();
        self.count(remote, |k| k.body_bytes += body.len() as u64);
        let compressed;
        let (wire, encoding) = if t.zstd {
            compressed = zstd::bulk::compress(body, 1).map_err(|_| (0, Class::Unknown))?;
            (&compressed[..], Some("zstd"))
        } else {
            (body, None)
        };
        self.count(remote, |k| k.wire_bytes += wire.len() as u64);
        match conn.request(t, "POST", path, true, wire, encoding).await {
            Ok(reply) => {
                let took = started.elapsed().as_micros() as u64;
                self.count(remote, |k| k.request_took(took));
                self.chunk_answered(remote);
                self.count(remote, |k| {
                    *k.requests.entry(reply.status.to_string()).or_default() += 1
                });
                let mut idle = self.idle.borrow_mut();
                let v = idle.entry(remote.to_string()).or_default();
                if v.len() < IDLE_CONNS_MAX {
                    v.push(conn);
                }
                Ok(reply)
            }
            Err(e) => {
                if e.kind() == std::io::ErrorKind::TimedOut {
                    self.chunk_timed_out(remote);
                }
                // No answer: the target may have stored them; they are sent again.
                self.count(remote, |k| {
                    *k.requests.entry("error".into()).or_default() += 1;
                    k.resent += records as u64;
                });
                Err((0, Class::Unavailable))
            }
        }
    }
}

/// What the checks of an attach or resume learned of the target topic (SEMANTICS.md §13
/// "Checks").
#[derive(Clone, Debug)]
pub struct TargetInfo {
    /// The target topic's incarnation id.
    pub id: String,
    /// Its current schema document, if any.
    pub schema: Option<serde_json::Value>,
}

/// A failed check: the state it maps to and what it found.
#[derive(Clone, Debug)]
pub struct CheckFailed {
    pub class: Class,
    pub detail: String,
}

fn failed(class: Class, detail: impl Into<String>) -> CheckFailed {
    CheckFailed {
        class,
        detail: detail.into(),
    }
}

/// Runs the checks of SEMANTICS.md §13 against `topic` on remote `r` from this node: the
/// target asks for credentials, the credential works and is not an admin there, the topic
/// exists, is neither a delay child nor a stub, and has no remote children.
pub async fn probe(node: &Node, r: &RemoteMeta, topic: &str) -> Result<TargetInfo, CheckFailed> {
    let t = build_target(node, r).map_err(|c| {
        failed(
            c,
            "the remote cannot be reached from this node as registered",
        )
    })?;
    let mut conn = Box::pin(client::connect(&t))
        .await
        .map_err(|c| failed(c, "connecting to the remote failed"))?;
    let path = format!("/v1/topics/{topic}");
    let anon = get(&mut conn, &t, &path, false).await?;
    if anon.status != 401 {
        return Err(failed(
            Class::Unknown,
            format!(
                "the target answered {} without credentials: it must have security on",
                anon.status
            ),
        ));
    }
    let desc = get(&mut conn, &t, &path, true).await?;
    match desc.status {
        200 => {}
        401 => {
            return Err(failed(
                Class::AuthFailed,
                "the target refused the credential",
            ))
        }
        403 => {
            return Err(failed(
                Class::Forbidden,
                "the credential has no grant on the target topic",
            ))
        }
        404 => {
            return Err(failed(
                Class::TargetMissing,
                "the target topic does not exist",
            ))
        }
        300..=399 => return Err(failed(Class::RedirectRefused, "the target redirects")),
        s => {
            return Err(failed(
                Class::Unavailable,
                format!("the target answered {s}"),
            ))
        }
    }
    let v: serde_json::Value = serde_json::from_slice(&desc.body)
        .map_err(|_| failed(Class::Unknown, "the target's topic answer is not JSON"))?;
    if v.get("remote").is_some()
        || v.get("fanout_delay_ms")
            .is_some_and(|d| d.as_u64() > Some(0))
    {
        return Err(failed(
            Class::Unknown,
            "the target topic is a delay child or a remote child's stub: it takes no produce",
        ));
    }
    let children: Vec<String> = v
        .get("children")
        .and_then(|c| c.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|c| c.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    for c in children {
        let r = get(&mut conn, &t, &format!("/v1/topics/{c}"), true).await?;
        let is_remote = r.status == 200
            && serde_json::from_slice::<serde_json::Value>(&r.body)
                .is_ok_and(|v| v.get("remote").is_some());
        if is_remote {
            return Err(failed(
                Class::TargetHasRemoteChildren,
                format!("the target topic has remote child {c:?}: no chains or loops"),
            ));
        }
    }
    let users = get(&mut conn, &t, "/v1/users", true).await?;
    if users.status == 200 {
        return Err(failed(
            Class::Forbidden,
            "the credential is an admin on the target: use a produce-only user",
        ));
    }
    Ok(TargetInfo {
        id: v
            .get("id")
            .and_then(|i| i.as_str())
            .unwrap_or_default()
            .to_string(),
        schema: v.get("schema").cloned(),
    })
}

/// This node's view of remote `r`'s credential (API.md §14.2 `nodes[]`): whether its cluster
/// secret opens the sealed password (`ready`), was replaced since (`stale`), or cannot
/// (`credential_unreadable`).
pub fn node_view(node: &Node, r: &RemoteMeta) -> serde_json::Value {
    let state = match RemoteKey::derive(node.config.cluster_secret.0.as_bytes()) {
        Some(k) if k.open(&r.name, &r.key_version, &r.sealed_password).is_ok() => "ready",
        Some(k) if k.version() != r.key_version => "stale",
        _ => "credential_unreadable",
    };
    serde_json::json!({
        "node": node.config.node_id,
        "state": state,
        "credential_version": r.credential_version,
        "key_version": r.key_version,
        "fingerprint": r.fingerprint,
        "last_ok_at": null,
        "last_error": null,
        "server_cert_not_after": null,
        "rtt_ms": null,
    })
}

/// Another node's `REMOTE_PROBE` (`{remote, topic}`), run from here.
async fn serve_probe(node: &Node, ask: &[u8]) -> serde_json::Value {
    let ask: serde_json::Value = serde_json::from_slice(ask).unwrap_or_default();
    let (Some(name), Some(topic)) = (ask["remote"].as_str(), ask["topic"].as_str()) else {
        return serde_json::json!({"ok": false, "class": "unknown", "detail": "malformed probe"});
    };
    let Some(remote) = node.meta().remotes.get(name).cloned() else {
        return serde_json::json!({"ok": false, "class": Class::RemoteMissing.as_str(),
            "detail": format!("remote {name:?} is not registered on this node's metadata yet")});
    };
    match Box::pin(probe(node, &remote, topic)).await {
        Ok(info) => serde_json::json!({"ok": true, "target_id": info.id, "schema": info.schema}),
        Err(f) => serde_json::json!({"ok": false, "class": f.class.as_str(), "detail": f.detail}),
    }
}

/// The checks of SEMANTICS.md §13 from this node and every other member (all must pass and
/// answer, and see the same target): what the target is, or the first failure; and one row per
/// member for the answer's `checks`.
pub async fn probe_everywhere(
    node: &Node,
    r: &RemoteMeta,
    topic: &str,
) -> (Result<TargetInfo, CheckFailed>, Vec<serde_json::Value>) {
    let ask = serde_json::json!({"remote": r.name, "topic": topic}).to_string();
    let within = Duration::from_millis(r.limits.request_timeout_ms.saturating_mul(2))
        + Duration::from_secs(5);
    let (mine, theirs) = futures_util::future::join(
        Box::pin(probe(node, r, topic)),
        node.probe_members(ask.as_bytes(), within),
    )
    .await;
    let row = |id: &str, res: &Result<TargetInfo, CheckFailed>| match res {
        Ok(i) => serde_json::json!({"node": id, "result": "pass", "target_id": i.id}),
        Err(f) => {
            serde_json::json!({"node": id, "result": "fail", "class": f.class.as_str(), "detail": f.detail})
        }
    };
    let mut rows = vec![row(&node.config.node_id, &mine)];
    let mut outcome = mine;
    for (id, answer) in theirs {
        let res = match answer {
            Err(e) => Err(failed(
                Class::Unavailable,
                format!("member {id} did not answer the checks: {e}"),
            )),
            Ok(b) => {
                let v: serde_json::Value = serde_json::from_slice(&b).unwrap_or_default();
                if v["ok"] == true {
                    Ok(TargetInfo {
                        id: v["target_id"].as_str().unwrap_or_default().to_string(),
                        schema: v.get("schema").filter(|s| !s.is_null()).cloned(),
                    })
                } else {
                    let class = v["class"]
                        .as_str()
                        .and_then(|c| CLASSES.iter().copied().find(|k| k.as_str() == c))
                        .unwrap_or(Class::Unknown);
                    Err(failed(
                        class,
                        format!("from {id}: {}", v["detail"].as_str().unwrap_or("failed")),
                    ))
                }
            }
        };
        rows.push(row(&id, &res));
        outcome = match (outcome, res) {
            (Err(f), _) => Err(f),
            (Ok(_), Err(f)) => Err(f),
            (Ok(a), Ok(b)) if a.id != b.id => Err(failed(
                Class::TargetReplaced,
                format!(
                    "members see different target topics ({} and {} from {id})",
                    a.id, b.id
                ),
            )),
            (Ok(a), Ok(_)) => Ok(a),
        };
    }
    (outcome, rows)
}

/// One GET of a probe.
async fn get(
    conn: &mut Conn,
    t: &Target,
    path: &str,
    auth: bool,
) -> Result<client::Reply, CheckFailed> {
    conn.request(t, "GET", path, auth, b"", None)
        .await
        .map_err(|e| {
            failed(
                Class::Unavailable,
                format!("no answer from the remote: {e}"),
            )
        })
}

/// How many records, in offset order, are all delivered: record `i` went to lane `place[i].0`
/// at position `place[i].1`, and each lane delivered its first `delivered[lane]` records.
fn delivered_prefix(place: &[(usize, usize)], delivered: &[usize]) -> usize {
    place
        .iter()
        .position(|(lane, k)| *k >= delivered[*lane])
        .unwrap_or(place.len())
}

/// A chunk limit after a timeout: halved, down to [`CHUNK_BYTES_MIN`].
fn shrunk(limit: usize) -> usize {
    (limit / 2).max(CHUNK_BYTES_MIN)
}

/// A chunk limit and its run of answers after one more answer: a reduced limit doubles (up to
/// [`CHUNK_BYTES_MAX`]) once [`CHUNK_GROW_AFTER`] answers came in a row.
fn grown(limit: usize, answered: u32) -> (usize, u32) {
    let answered = answered + 1;
    if limit < CHUNK_BYTES_MAX && answered >= CHUNK_GROW_AFTER {
        ((limit * 2).min(CHUNK_BYTES_MAX), 0)
    } else {
        (limit, answered)
    }
}

/// The remote child `child` (a stub's id): its link and its remote's registry entry, found
/// once per shipped slab.
fn remote_of(meta: &MetaState, child: TopicId) -> Option<(RemoteChildMeta, RemoteMeta)> {
    let stub = meta.topics.values().find(|t| t.id == child)?;
    let rc = stub.remote.as_ref()?;
    let r = meta.remotes.get(&rc.name)?;
    Some((rc.clone(), r.clone()))
}

/// Opens the remote's password with the current (or previous) cluster secret's key and builds
/// how to reach it.
pub fn build_target(node: &Node, r: &RemoteMeta) -> Result<Target, Class> {
    let password = [
        node.config.cluster_secret.0.as_bytes(),
        node.config.cluster_secret_previous.0.as_bytes(),
    ]
    .iter()
    .filter_map(|s| RemoteKey::derive(s))
    .find_map(|k| k.open(&r.name, &r.key_version, &r.sealed_password).ok())
    .ok_or(Class::CredentialUnreadable)?;
    let (host, port, path) = client::split_url(&r.url).ok_or(Class::DestinationRefused)?;
    let refused = |reason: &'static str| {
        crate::metrics::remote::count(&r.name, |k| {
            *k.destination_refused.entry(reason).or_default() += 1
        });
        Class::DestinationRefused
    };
    // The settings may have changed since the URL was registered.
    let remotes = &node.config.remotes;
    if !remotes.allowed_ports.contains(&port) {
        return Err(refused("port"));
    }
    let host_allowed = remotes.allowed_hosts.is_empty()
        || remotes
            .allowed_hosts
            .iter()
            .any(|a| match a.strip_prefix("*.") {
                Some(suffix) => host.ends_with(&format!(".{}", suffix.to_ascii_lowercase())),
                None => host == a.to_ascii_lowercase(),
            });
    if !host_allowed {
        return Err(refused("allowlist"));
    }
    crate::metrics::remote::count(&r.name, |k| k.decrypts += 1);
    let tls = client::tls_config(r.ca_pem.as_deref()).map_err(|_| Class::TlsFailed)?;
    let mut cred = r.username.as_bytes().to_vec();
    cred.push(b':');
    cred.extend_from_slice(&password);
    Ok(Target {
        host,
        port,
        path,
        auth: format!("Basic {}", crate::wire::base64::encode(&cred)),
        tls,
        timeout: Duration::from_millis(r.limits.request_timeout_ms),
        zstd: r.limits.compression == "zstd",
        max_in_flight: r.limits.max_in_flight,
        shards: node.shards,
        allow: node.config.remotes.allow_addresses.clone(),
    })
}

/// Splits a slab into requests of at most [`CHUNK_RECORDS_MAX`] records and about `limit` body
/// bytes (a first record larger than that goes alone; the target may refuse it as too large).
fn chunks(recs: &[AppendRecord], limit: usize) -> Vec<&[AppendRecord]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (i, r) in recs.iter().enumerate() {
        let b = wire_bytes(r);
        if i > start && (i - start >= CHUNK_RECORDS_MAX || bytes + b > limit) {
            out.push(&recs[start..i]);
            start = i;
            bytes = 0;
        }
        bytes += b;
    }
    if start < recs.len() {
        out.push(&recs[start..]);
    }
    out
}

/// About how many body bytes a record takes in a batch (base64 payload and key, field names).
fn wire_bytes(r: &AppendRecord) -> usize {
    let key = r.msg_key.as_ref().map_or(0, |k| k.len() * 4 / 3 + 48);
    r.payload.len().div_ceil(3) * 4 + key + 64
}

/// The batch-produce body for `recs`: payloads always base64 (exact bytes whatever they are),
/// keys as text when they are UTF-8; no partition pin (the target places by key).
pub fn batch_body(recs: &[AppendRecord]) -> Vec<u8> {
    let mut out = Vec::with_capacity(recs.iter().map(wire_bytes).sum::<usize>() + 16);
    out.extend_from_slice(b"{\"messages\":[");
    for (i, r) in recs.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'{');
        if let Some(k) = r.msg_key.as_deref().filter(|k| !k.is_empty()) {
            out.extend_from_slice(b"\"key\":");
            if let Some(enc) = crate::wire::json::append_key_json(&mut out, k) {
                out.extend_from_slice(b",\"key_encoding\":\"");
                out.extend_from_slice(enc.as_bytes());
                out.push(b'"');
            }
            out.push(b',');
        }
        out.extend_from_slice(b"\"payload\":\"");
        crate::wire::base64::encode_into(&mut out, &r.payload);
        out.extend_from_slice(b"\",\"payload_encoding\":\"base64\"}");
    }
    out.extend_from_slice(b"]}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_io::types::PartitionId;

    fn rec(key: Option<&[u8]>, payload: &[u8]) -> AppendRecord {
        AppendRecord {
            key: PartitionKey {
                topic: TopicId(1),
                partition: PartitionId(0),
            },
            msg_key: key.map(<[u8]>::to_vec),
            payload: payload.to_vec().into(),
        }
    }

    #[test]
    fn a_batch_body_carries_exact_bytes_and_keys() {
        let body = batch_body(&[
            rec(Some(b"k1"), b"{\"a\":1}"),
            rec(Some(&[0xff]), b"\x00\x01"),
        ]);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let m = v["messages"].as_array().unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0]["key"], "k1");
        assert!(m[0].get("key_encoding").is_none());
        assert_eq!(m[0]["payload"], "eyJhIjoxfQ==");
        assert_eq!(m[1]["key"], "/w==");
        assert_eq!(m[1]["key_encoding"], "base64");
        assert_eq!(m[1]["payload"], "AAE=");
        assert_eq!(m[1]["payload_encoding"], "base64");
        let keyless = batch_body(&[rec(None, b"x")]);
        assert_eq!(
            keyless,
            b"{\"messages\":[{\"payload\":\"eA==\",\"payload_encoding\":\"base64\"}]}"
        );
    }

    #[test]
    fn slabs_split_at_1000_records_and_960_kib() {
        let small: Vec<AppendRecord> = (0..2500).map(|_| rec(None, b"x")).collect();
        let c = chunks(&small, CHUNK_BYTES_MAX);
        assert_eq!(
            c.iter().map(|c| c.len()).collect::<Vec<_>>(),
            [1000, 1000, 500]
        );
        let big: Vec<AppendRecord> = (0..5).map(|_| rec(None, &[7u8; 300 << 10])).collect();
        let c = chunks(&big, CHUNK_BYTES_MAX);
        assert_eq!(c.iter().map(|c| c.len()).collect::<Vec<_>>(), [2, 2, 1]);
        for part in c {
            assert!(batch_body(part).len() <= CHUNK_BYTES_MAX);
        }
        assert!(chunks(&[], CHUNK_BYTES_MAX).is_empty());
        let c = chunks(&big, CHUNK_BYTES_MIN);
        assert_eq!(
            c.len(),
            5,
            "one 300 KiB record a request under the smallest limit"
        );
    }

    #[test]
    fn lanes_deliver_a_prefix_and_chunks_shrink_on_timeouts_and_grow_back() {
        // Records 0..6 over lanes 0,1,0,1,0,1 (positions 0,0,1,1,2,2): lane 0 delivered 2, lane 1
        // all 3 -> records 0..3 are all there, record 4 (lane 0, position 2) is not.
        let place = [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)];
        assert_eq!(delivered_prefix(&place, &[2, 3]), 4);
        assert_eq!(delivered_prefix(&place, &[3, 0]), 1);
        assert_eq!(delivered_prefix(&place, &[3, 3]), 6);
        assert_eq!(delivered_prefix(&place, &[0, 3]), 0);
        // 960 KiB -> 480 -> 240 -> 120 -> 64 (floor) after timeouts.
        let mut l = CHUNK_BYTES_MAX;
        for want in [480 << 10, 240 << 10, 120 << 10, 64 << 10, 64 << 10] {
            l = shrunk(l);
            assert_eq!(l, want);
        }
        // 19 answers keep it, the 20th doubles it; at the top it stays.
        let mut run = 0;
        for _ in 0..19 {
            (l, run) = grown(l, run);
        }
        assert_eq!((l, run), (64 << 10, 19));
        (l, run) = grown(l, run);
        assert_eq!((l, run), (128 << 10, 0));
        assert_eq!(grown(CHUNK_BYTES_MAX, 50).0, CHUNK_BYTES_MAX);
    }

    #[test]
    fn answers_map_to_the_states_of_semantics_13() {
        assert_eq!(classify(202, b""), None);
        assert_eq!(classify(401, b""), Some(Class::AuthFailed));
        assert_eq!(classify(403, b""), Some(Class::Forbidden));
        assert_eq!(
            classify(404, br#"{"error":"topic not found"}"#),
            Some(Class::TargetMissing)
        );
        assert_eq!(classify(404, b"not found"), Some(Class::NoBatchProduce));
        assert_eq!(classify(413, b""), Some(Class::RecordTooLarge));
        assert_eq!(classify(429, b""), Some(Class::Throttled));
        assert_eq!(classify(503, b""), Some(Class::Unavailable));
        assert_eq!(classify(302, b""), Some(Class::RedirectRefused));
        assert_eq!(
            refused_index(br#"{"error":"message 7: message required"}"#),
            Some(7)
        );
        assert_eq!(refused_index(br#"{"error":"messages required"}"#), None);
        for c in CLASSES {
            assert_eq!(Class::from_code(c as u8), Some(c));
            assert_eq!(state_name(c as u8), c.as_str());
        }
        assert_eq!(state_name(0), "running");
    }
}
