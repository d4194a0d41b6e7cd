//! An in-memory stand-in for the broker's message routes (API.md §10: topic create, produce,
//! batch produce, single and batch consume, single and batch ack), with injectable faults, so
//! the generator's bookkeeping can be tested without the real binary. Blocking, one thread per connection,
//! loopback only; every connection thread ends when its client closes. `start_nodes` opens
//! several listeners over one state, like the nodes of a cluster (any node serves any request),
//! and counts the connections each one served messages on.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::value::RawValue;

/// Connections served at once at most.
const CONNECTIONS_MAX: usize = 512;
/// Request size the fake accepts at most.
const REQUEST_BYTES_MAX: usize = 4 << 20;

#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    /// Answer 202 but do not store every n-th produced message (1-based count).
    pub drop_every: Option<u64>,
    /// Deliver every n-th delivered message a second time (a new lease, as after an expiry).
    pub redeliver_every: Option<u64>,
    /// Nodes other than the first see a new topic only this long after it was created (404
    /// until then), as a cluster node applies a metadata change after the proposer answered.
    pub visible_after: Option<Duration>,
}

struct Topic {
    created: Instant,
    log: Vec<Vec<u8>>,
    next: usize,
    again: VecDeque<usize>,
    leases: HashSet<(usize, u64)>,
}

#[derive(Default)]
struct State {
    topics: HashMap<String, Topic>,
    nonce: u64,
    produced: u64,
    delivered: u64,
    pub dropped: u64,
}

pub struct Fake {
    /// The first node's address.
    pub addr: SocketAddr,
    /// Every node's address.
    pub addrs: Vec<SocketAddr>,
    /// Connections each node served a produce, consume or ack on so far.
    accepted: Vec<Arc<AtomicUsize>>,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
}

impl Fake {
    pub fn start(faults: Faults) -> Fake {
        Fake::start_nodes(1, faults)
    }

    /// `nodes` listeners sharing one state.
    pub fn start_nodes(nodes: usize, faults: Faults) -> Fake {
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut addrs = Vec::new();
        let mut accepted = Vec::new();
        for node in 0..nodes {
            let l = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
            addrs.push(l.local_addr().unwrap());
            let count = Arc::new(AtomicUsize::new(0));
            accepted.push(count.clone());
            let (st, sp) = (state.clone(), stop.clone());
            std::thread::spawn(move || {
                let live = Arc::new(AtomicUsize::new(0));
                for s in l.incoming() {
                    if sp.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(s) = s else { continue };
                    if live.load(Ordering::Relaxed) >= CONNECTIONS_MAX {
                        continue;
                    }
                    live.fetch_add(1, Ordering::Relaxed);
                    let (st, live, count) = (st.clone(), live.clone(), count.clone());
                    std::thread::spawn(move || {
                        serve(s, &st, faults, node, &count);
                        live.fetch_sub(1, Ordering::Relaxed);
                    });
                }
            });
        }
        Fake {
            addr: addrs[0],
            addrs,
            accepted,
            state,
            stop,
        }
    }

    pub fn dropped(&self) -> u64 {
        self.state.lock().unwrap().dropped
    }

    /// Connections each node served a produce, consume or ack on so far (not the topic
    /// creation and look-ups).
    pub fn accepted(&self) -> Vec<usize> {
        self.accepted
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .collect()
    }

    /// `http://a,http://b,...`: every node, for `--url`.
    pub fn urls(&self) -> String {
        self.addrs
            .iter()
            .map(|a| format!("http://{a}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for a in &self.addrs {
            let _ = TcpStream::connect_timeout(a, Duration::from_millis(200));
        }
    }
}

fn serve(mut s: TcpStream, st: &Mutex<State>, faults: Faults, node: usize, count: &AtomicUsize) {
    let mut counted = false;
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    let _ = s.set_nodelay(true);
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        // Parse one request from buf, reading more as needed.
        let (method, path, body_start, len) = loop {
            let mut h = [httparse::EMPTY_HEADER; 32];
            let mut req = httparse::Request::new(&mut h);
            match req.parse(&buf) {
                Ok(httparse::Status::Complete(n)) => {
                    let cl = req
                        .headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                        .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok())
                        .unwrap_or(0usize);
                    if buf.len() >= n + cl {
                        break (
                            req.method.unwrap_or("").to_string(),
                            req.path.unwrap_or("").to_string(),
                            n,
                            cl,
                        );
                    }
                }
                Ok(httparse::Status::Partial) => {}
                Err(_) => return,
            }
            if buf.len() > REQUEST_BYTES_MAX {
                return;
            }
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let body = buf[body_start..body_start + len].to_vec();
        buf.drain(..body_start + len);
        if !counted
            && ["/produce", "/consume", "/ack"]
                .iter()
                .any(|r| path.contains(r))
        {
            counted = true;
            count.fetch_add(1, Ordering::Relaxed);
        }
        let (status, resp) = handle(st, faults, node, &method, &path, &body);
        let reason = match status {
            200 => "OK",
            201 => "Created",
            202 => "Accepted",
            204 => "No Content",
            _ => "Error",
        };
        let mut out = format!("HTTP/1.1 {status} {reason}\r\n");
        if status != 204 {
            out.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                resp.len()
            ));
        }
        out.push_str("\r\n");
        let mut bytes = out.into_bytes();
        if status != 204 {
            bytes.extend_from_slice(resp.as_bytes());
        }
        if s.write_all(&bytes).is_err() {
            return;
        }
    }
}

#[derive(Deserialize)]
struct Batch<'a> {
    #[serde(borrow)]
    messages: Vec<Elem<'a>>,
}

#[derive(Deserialize)]
struct Elem<'a> {
    #[serde(borrow)]
    payload: &'a RawValue,
    payload_encoding: Option<String>,
}

#[derive(Deserialize)]
struct Acks {
    receipt_handles: Vec<String>,
}

fn handle(
    st: &Mutex<State>,
    faults: Faults,
    node: usize,
    method: &str,
    path: &str,
    body: &[u8],
) -> (u16, String) {
    let (route, query) = path.split_once('?').unwrap_or((path, ""));
    let parts: Vec<&str> = route.trim_matches('/').split('/').collect();
    let mut g = st.lock().unwrap();
    if let (["v1", "topics", t, ..], Some(after)) = (parts.as_slice(), faults.visible_after) {
        // Not yet applied on this node: as if the topic did not exist.
        let unseen = g
            .topics
            .get(*t)
            .is_some_and(|topic| node > 0 && topic.created.elapsed() < after);
        if unseen {
            return (404, "{\"error\":\"topic not found\"}".into());
        }
    }
    match (method, parts.as_slice()) {
        ("GET", ["v1", "topics", t]) => match g.topics.get(*t) {
            Some(topic) => (
                200,
                format!("{{\"name\":\"{t}\",\"messages\":{}}}", topic.log.len()),
            ),
            None => (404, "{\"error\":\"topic not found\"}".into()),
        },
        ("POST", ["v1", "topics"]) => {
            let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
            let name = v["name"].as_str().unwrap_or("").to_string();
            if g.topics.contains_key(&name) {
                return (409, "{\"error\":\"topic already exists\"}".into());
            }
            g.topics.insert(
                name,
                Topic {
                    created: Instant::now(),
                    log: Vec::new(),
                    next: 0,
                    again: VecDeque::new(),
                    leases: HashSet::new(),
                },
            );
            (201, "{}".into())
        }
        ("POST", ["v1", "topics", t, "produce"]) => {
            if !g.topics.contains_key(*t) {
                return (404, "{\"error\":\"topic not found\"}".into());
            }
            store(&mut g, faults, t, body.to_vec());
            (202, String::new())
        }
        ("POST", ["v1", "topics", t, "produce", "batch"]) => {
            if !g.topics.contains_key(*t) {
                return (404, "{\"error\":\"topic not found\"}".into());
            }
            let Ok(b) = serde_json::from_slice::<Batch>(body) else {
                return (400, "{\"error\":\"invalid json\"}".into());
            };
            let n = b.messages.len();
            for m in b.messages {
                let bytes = match m.payload_encoding.as_deref() {
                    Some("base64") => {
                        let s: String = serde_json::from_str(m.payload.get()).unwrap_or_default();
                        narad_bench::workload::base64_decode(s.as_bytes()).unwrap_or_default()
                    }
                    _ => m.payload.get().as_bytes().to_vec(),
                };
                store(&mut g, faults, t, bytes);
            }
            (202, format!("{{\"accepted\":{n}}}"))
        }
        ("GET", ["v1", "topics", t, "consume"]) => {
            // Without `max` the answer is one Message object, not a batch (API.md §10.3).
            let batch: Option<usize> = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("max="))
                .and_then(|v| v.parse().ok());
            let max = batch.unwrap_or(1);
            let State {
                topics,
                nonce,
                delivered,
                ..
            } = &mut *g;
            let Some(topic) = topics.get_mut(*t) else {
                return (404, "{\"error\":\"topic not found\"}".into());
            };
            let mut msgs = Vec::new();
            while msgs.len() < max {
                let off = if let Some(o) = topic.again.pop_front() {
                    o
                } else if topic.next < topic.log.len() {
                    topic.next += 1;
                    topic.next - 1
                } else {
                    break;
                };
                *nonce += 1;
                *delivered += 1;
                if faults
                    .redeliver_every
                    .is_some_and(|n| delivered.is_multiple_of(n))
                {
                    // As if this lease expired at once: its ack is refused (410), the message
                    // comes back under a new handle.
                    topic.again.push_back(off);
                } else {
                    topic.leases.insert((off, *nonce));
                }
                msgs.push(format!(
                    "{{\"topic\":\"{t}\",\"partition\":0,\"offset\":{off},\"payload\":{},\"timestamp\":0,\"receipt_handle\":\"0:{off}:{}\"}}",
                    String::from_utf8_lossy(&topic.log[off]),
                    *nonce
                ));
            }
            if msgs.is_empty() {
                drop(g);
                std::thread::sleep(Duration::from_millis(10));
                return (204, String::new());
            }
            if batch.is_none() {
                return (200, format!("{}\n", msgs[0]));
            }
            (200, format!("{{\"messages\":[{}]}}\n", msgs.join(",")))
        }
        ("POST", ["v1", "topics", t, "ack"]) => {
            let Some(topic) = g.topics.get_mut(*t) else {
                return (404, "{\"error\":\"topic not found\"}".into());
            };
            // A single ack names its handle in the query and answers 204 or 410.
            if let Some(h) = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("receipt_handle="))
            {
                let p: Vec<u64> = h.split(':').filter_map(|x| x.parse().ok()).collect();
                return if p.len() == 3 && topic.leases.remove(&(p[1] as usize, p[2])) {
                    (204, String::new())
                } else {
                    (
                        410,
                        "{\"error\":\"receipt handle no longer matches an active reservation\"}"
                            .into(),
                    )
                };
            }
            let Ok(a) = serde_json::from_slice::<Acks>(body) else {
                return (400, "{\"error\":\"invalid json\"}".into());
            };
            let results: Vec<String> = a
                .receipt_handles
                .iter()
                .map(|h| {
                    let p: Vec<u64> = h.split(':').filter_map(|x| x.parse().ok()).collect();
                    let ok = p.len() == 3 && topic.leases.remove(&(p[1] as usize, p[2]));
                    if ok {
                        "{\"status\":204}".to_string()
                    } else {
                        "{\"status\":410,\"error\":\"receipt handle no longer matches an active reservation\"}".to_string()
                    }
                })
                .collect();
            (200, format!("{{\"results\":[{}]}}\n", results.join(",")))
        }
        _ => (404, "{\"error\":\"no route\"}".into()),
    }
}

fn store(g: &mut State, faults: Faults, topic: &str, bytes: Vec<u8>) {
    g.produced += 1;
    if faults
        .drop_every
        .is_some_and(|n| g.produced.is_multiple_of(n))
    {
        g.dropped += 1;
        return;
    }
    if let Some(t) = g.topics.get_mut(topic) {
        t.log.push(bytes);
    }
}
