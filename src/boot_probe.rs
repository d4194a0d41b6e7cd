//! The boot probe: answers health probes on the node's ports while the shards are still starting
//! (log recovery, Raft start, metadata push), so `/healthz` is `200` from process start and
//! `/readyz` a `503` with its reason instead of a refused connection (API.md §15.1-15.2,
//! CLUSTER.md "Liveness"; the chart's startupProbe and livenessProbe).
//!
//! Owns: the start-up listeners on `http.addr` and, when set, `http.metrics_addr` (bound by
//! `server::run` before any shard exists), one plain thread per listener, and the answers given
//! there: `/healthz` `200 {"status":"ok"}`, `/readyz` `503 {"error":"starting: ..."}`, every
//! other request `503` + `Retry-After: 1` (on the metrics port `/metrics` likewise, other paths
//! `404` as that listener answers them); after SIGTERM `/healthz` is `503 {"status":"shutting
//! down"}`. Each connection gets one answer with `Connection: close`.
//!
//! Never: reads a request body, keeps a connection, touches the log, the metadata or any shard
//! state, or runs once a shard listens. The shards bind their listeners with `SO_REUSEPORT`
//! and these sockets have none, so [`BootProbe::stop`] closes them (joining the threads that
//! own them) before the first shard binds: every shard calls it just before its own bind, only
//! the first does the work and the others wait for it. Nothing listens only between that close
//! and that bind; connections still in the probe's backlog at the close are reset (a probe then
//! fails once and is retried).
//!
//! Bounds: one connection at a time per listener, answered inline; a request head of at most
//! [`HEAD_BYTES_MAX`] read within [`HEAD_READ_MAX`]; garbage gets `400` and a close.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use narad_io::rt::ShutdownSignal;

use crate::http::response::{encode, ConnectionHeader};
use crate::http::Response;

/// `/readyz`'s reason (and every other request's) while the node starts.
pub const STARTING_REASON: &str = "starting: recovering the log and the metadata";
/// Largest request head read; a longer one is refused with `431`.
pub const HEAD_BYTES_MAX: usize = 8 << 10;
/// Longest wait for a complete request head; the connection is then closed unanswered.
pub const HEAD_READ_MAX: Duration = Duration::from_secs(1);
/// How often an idle accept loop looks for a connection and for the stop flag.
const ACCEPT_POLL_INTERVAL: Duration = Duration::from_millis(10);
/// One blocking read waits at most this long, so a slow client cannot hold up [`BootProbe::stop`]
/// longer than this.
const READ_SLICE: Duration = Duration::from_millis(50);
/// Longest wait to write an answer (a few hundred bytes: it fits any socket buffer).
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// After answering a request that came with a body, unread bytes are drained for at most this
/// long and this much before the close, so the close does not reset the connection (which can
/// discard the answer before the client read it).
const DRAIN_MAX: Duration = Duration::from_millis(200);
const DRAIN_BYTES_MAX: usize = 64 << 10;

/// Which of the node's listeners a probe socket stands in for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Port {
    /// `http.addr`: the API port.
    Api,
    /// `http.metrics_addr`: the metrics listener (`/metrics`, `/healthz`, `/readyz`).
    Metrics,
}

/// The running boot probe of this node: stopped once, by the first shard about to bind, by
/// start-up ending in failure, or on drop.
pub struct BootProbe {
    stop: Arc<AtomicBool>,
    /// The accept threads; emptied by the first [`BootProbe::stop`].
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl BootProbe {
    /// Starts answering on `listeners` (already bound and listening). `shutdown` turns the
    /// answers into "shutting down" ones once it triggers. Spawn the threads after the
    /// termination signals were blocked for the process (`rt::install_termination_handler`):
    /// they inherit the mask, so SIGTERM never lands on them.
    pub fn start(
        listeners: Vec<(Port, TcpListener)>,
        shutdown: &ShutdownSignal,
    ) -> std::io::Result<BootProbe> {
        let probe = BootProbe {
            stop: Arc::new(AtomicBool::new(false)),
            threads: Mutex::new(Vec::with_capacity(listeners.len())),
        };
        for (port, listener) in listeners {
            listener.set_nonblocking(true)?;
            let (stop, shutdown) = (probe.stop.clone(), shutdown.clone());
            let t = std::thread::Builder::new()
                .name("narad-boot-probe".into())
                .spawn(move || accept_loop(port, listener, &stop, &shutdown))?;
            probe.lock().push(t);
        }
        Ok(probe)
    }

    /// Stops answering and closes the probe's sockets: when this returns (on any thread, for
    /// any caller) nothing of the probe listens any more. Idempotent; concurrent callers wait
    /// for the first one to finish. Takes at most about [`READ_SLICE`] +
    /// [`ACCEPT_POLL_INTERVAL`] (a connection being answered is cut short).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let mut threads = self.lock();
        for t in threads.drain(..) {
            // A panicked thread has dropped its listener too; nothing more to do.
            let _ = t.join();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.threads.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for BootProbe {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(port: Port, listener: TcpListener, stop: &AtomicBool, shutdown: &ShutdownSignal) {
    let addr = listener.local_addr().ok();
    tracing::debug!(?port, ?addr, "boot probe listening");
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, _)) => answer_connection(stream, port, stop, shutdown),
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_POLL_INTERVAL),
            Err(e) => {
                // Out of descriptors, a connection aborted before it was taken: try again later.
                tracing::debug!(?port, error = %e, "boot probe accept failed");
                std::thread::sleep(ACCEPT_POLL_INTERVAL);
            }
        }
    }
    drop(listener);
    tracing::debug!(?port, ?addr, "boot probe closed");
}

fn answer_connection(
    mut stream: TcpStream,
    port: Port,
    stop: &AtomicBool,
    shutdown: &ShutdownSignal,
) {
    if stream.set_nonblocking(false).is_err()
        || stream.set_read_timeout(Some(READ_SLICE)).is_err()
        || stream.set_write_timeout(Some(WRITE_TIMEOUT)).is_err()
    {
        return;
    }
    let deadline = Instant::now() + HEAD_READ_MAX;
    let mut buf = vec![0u8; HEAD_BYTES_MAX];
    let mut len = 0;
    let answer = loop {
        if let Some(a) = answer_head(&buf[..len], port, shutdown.is_triggered()) {
            break a;
        }
        if stop.load(Ordering::Acquire) || Instant::now() >= deadline {
            return;
        }
        match stream.read(&mut buf[len..]) {
            Ok(0) => return,
            Ok(n) => len += n,
            Err(e) if read_again(&e) => {}
            Err(_) => return,
        }
    };
    let mut out = Vec::with_capacity(256);
    encode(
        &mut out,
        &answer.response,
        answer.head_only,
        ConnectionHeader::Close,
    );
    if stream.write_all(&out).is_err() {
        return;
    }
    if answer.more_follows || len > answer.head_bytes {
        drain_then_close(stream);
    }
}

/// Whether a read that failed is worth trying again (a read timeout slice ran out).
fn read_again(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
    )
}

/// Half-closes, then reads what the client still sends (bounded) so the close that follows is
/// a FIN, not a reset that could discard the answer on the client's side.
fn drain_then_close(mut stream: TcpStream) {
    let _ = stream.shutdown(Shutdown::Write);
    let deadline = Instant::now() + DRAIN_MAX;
    let mut sink = [0u8; 4096];
    let mut drained = 0;
    while drained < DRAIN_BYTES_MAX && Instant::now() < deadline {
        match stream.read(&mut sink) {
            Ok(0) => return,
            Ok(n) => drained += n,
            Err(e) if read_again(&e) => {}
            Err(_) => return,
        }
    }
}

/// The answer to one request head.
#[derive(Debug)]
struct Answer {
    response: Response,
    /// A HEAD request: `Content-Length` but no body.
    head_only: bool,
    /// The head's length in bytes (what follows it was not read as part of the request).
    head_bytes: usize,
    /// The request announced a body (or its head was refused): it is never read.
    more_follows: bool,
}

/// Parses `bytes` as a request head: `None` while it may still be incomplete, else the answer
/// (`400` for garbage, `431` once [`HEAD_BYTES_MAX`] bytes hold no complete head).
fn answer_head(bytes: &[u8], port: Port, shutting_down: bool) -> Option<Answer> {
    let refuse = |status: u16, text: &str| Answer {
        response: Response::text(status, text),
        head_only: false,
        head_bytes: bytes.len(),
        more_follows: true,
    };
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(bytes) {
        Ok(httparse::Status::Complete(head_bytes)) => {
            let method = req.method.unwrap_or("");
            let path = req.path.unwrap_or("");
            let more_follows = req.headers.iter().any(|h| {
                h.name.eq_ignore_ascii_case("transfer-encoding")
                    || (h.name.eq_ignore_ascii_case("content-length")
                        && h.value.iter().any(|b| (b'1'..=b'9').contains(b)))
            });
            Some(Answer {
                response: answer(port, method, path, shutting_down),
                head_only: method == "HEAD",
                head_bytes,
                more_follows,
            })
        }
        Ok(httparse::Status::Partial) if bytes.len() >= HEAD_BYTES_MAX => {
            Some(refuse(431, "431 Request Header Fields Too Large"))
        }
        Ok(httparse::Status::Partial) => None,
        Err(httparse::Error::TooManyHeaders) => {
            Some(refuse(431, "431 Request Header Fields Too Large"))
        }
        Err(_) => Some(refuse(400, "400 Bad Request")),
    }
}

/// What the node answers `method path` with on `port` while it starts (`shutting_down` once
/// SIGTERM arrived during start-up). The probes' bodies are those of `api::handle`.
pub fn answer(port: Port, method: &str, path: &str, shutting_down: bool) -> Response {
    let path = path.split('?').next().unwrap_or("");
    // The metrics listener's own routing (its 404 and 405), as `service::metrics_listener` answers.
    if port == Port::Metrics {
        if let Err(r) = crate::service::metrics_listener::target(method, path) {
            return r;
        }
    }
    let get = method == "GET" || method == "HEAD";
    let reason = if shutting_down {
        "shutting down"
    } else {
        STARTING_REASON
    };
    match path {
        "/healthz" | "/readyz" if !get => {
            Response::text(405, "Method Not Allowed\n").with_header("Allow", "GET, HEAD")
        }
        "/healthz" if shutting_down => {
            crate::api::json(503, &serde_json::json!({"status":"shutting down"}))
        }
        "/healthz" => crate::api::json(200, &serde_json::json!({"status":"ok"})),
        "/readyz" => crate::api::error(503, reason),
        _ => crate::api::error(503, reason).with_header("Retry-After", "1"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(r: &Response) -> serde_json::Value {
        serde_json::from_slice(&r.body).unwrap()
    }

    #[test]
    fn probes_answer_alive_but_not_ready() {
        // Proves API.md §15.1-15.2 while starting, on both ports: `/healthz` 200 ok, `/readyz`
        // 503 with the start-up reason in the API's error shape, HEAD like GET, a query ignored.
        for port in [Port::Api, Port::Metrics] {
            for method in ["GET", "HEAD"] {
                let r = answer(port, method, "/healthz", false);
                assert_eq!(r.status, 200);
                assert_eq!(body(&r), serde_json::json!({"status":"ok"}));
                assert_eq!(r.header("content-type"), Some("application/json"));
                let r = answer(port, method, "/readyz?verbose=1", false);
                assert_eq!(r.status, 503);
                assert_eq!(body(&r), serde_json::json!({"error": STARTING_REASON}));
                assert!(STARTING_REASON.starts_with("starting: "));
                assert_eq!(r.header("retry-after"), None);
            }
            let r = answer(port, "POST", "/healthz", false);
            assert_eq!((r.status, r.header("allow")), (405, Some("GET, HEAD")));
        }
    }

    #[test]
    fn everything_else_is_503_retry_after_on_the_api_port() {
        // Proves that any other request on the API port (an API route, `/metrics`, an unknown
        // path) is `503` with the JSON error body and `Retry-After: 1`.
        for (method, path) in [
            ("POST", "/v1/topics/t/produce"),
            ("GET", "/v1/topics"),
            ("GET", "/metrics"),
            ("DELETE", "/nowhere"),
        ] {
            let r = answer(Port::Api, method, path, false);
            assert_eq!(r.status, 503, "{method} {path}");
            assert_eq!(body(&r), serde_json::json!({"error": STARTING_REASON}));
            assert_eq!(r.header("retry-after"), Some("1"));
        }
    }

    #[test]
    fn metrics_port_routes_like_its_listener() {
        // Proves the metrics port keeps its listener's routing: `/metrics` 503 + Retry-After
        // while starting, other paths 404, a wrong method on `/metrics` 405.
        let r = answer(Port::Metrics, "GET", "/metrics", false);
        assert_eq!((r.status, r.header("retry-after")), (503, Some("1")));
        assert_eq!(
            answer(Port::Metrics, "GET", "/v1/topics", false).status,
            404
        );
        assert_eq!(answer(Port::Metrics, "PUT", "/metrics", false).status, 405);
    }

    #[test]
    fn shutting_down_during_start_up() {
        // Proves API.md §15.1 after SIGTERM during start-up: `/healthz` 503 shutting down,
        // `/readyz` and the rest 503 with that reason.
        let r = answer(Port::Api, "GET", "/healthz", true);
        assert_eq!(r.status, 503);
        assert_eq!(body(&r), serde_json::json!({"status":"shutting down"}));
        let r = answer(Port::Metrics, "GET", "/readyz", true);
        assert_eq!(
            (r.status, body(&r)),
            (503, serde_json::json!({"error":"shutting down"}))
        );
        assert_eq!(answer(Port::Api, "GET", "/v1/topics", true).status, 503);
    }

    #[test]
    fn heads_partial_complete_garbage_and_oversized() {
        // Proves the head parser never panics and is bounded: incomplete heads wait, a
        // complete one is answered (HEAD without body, a body announced is flagged), garbage is
        // 400, a head that does not end within HEAD_BYTES_MAX is 431.
        assert!(answer_head(b"", Port::Api, false).is_none());
        assert!(answer_head(b"GET /healthz HTTP/1.1\r\nHost: x\r\n", Port::Api, false).is_none());
        let a = answer_head(
            b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
            Port::Api,
            false,
        )
        .unwrap();
        assert_eq!(
            (a.response.status, a.head_only, a.more_follows),
            (200, true, false)
        );
        let mut out = Vec::new();
        encode(&mut out, &a.response, a.head_only, ConnectionHeader::Close);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.contains("Content-Length: 16\r\n"), "{text}");
        assert!(text.contains("Connection: close\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\n"), "{text}");
        let head = b"POST /v1/topics/t/produce HTTP/1.1\r\nContent-Length: 12\r\n\r\nhello";
        let a = answer_head(head, Port::Api, false).unwrap();
        assert_eq!((a.response.status, a.more_follows), (503, true));
        assert_eq!(a.head_bytes, head.len() - 5);
        let a = answer_head(
            b"POST /x HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
            Port::Api,
            false,
        )
        .unwrap();
        assert!(!a.more_follows);
        assert_eq!(
            answer_head(b"\x00\x01garbage\r\n\r\n", Port::Api, false)
                .unwrap()
                .response
                .status,
            400
        );
        let mut long = b"GET /healthz HTTP/1.1\r\nX: ".to_vec();
        long.resize(HEAD_BYTES_MAX, b'a');
        assert_eq!(
            answer_head(&long, Port::Api, false)
                .unwrap()
                .response
                .status,
            431
        );
        let mut many = b"GET /healthz HTTP/1.1\r\n".to_vec();
        for i in 0..40 {
            many.extend_from_slice(format!("X-{i}: y\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(
            answer_head(&many, Port::Api, false)
                .unwrap()
                .response
                .status,
            431
        );
    }

    #[test]
    fn serves_then_stop_closes_the_sockets() {
        // Proves the probe answers over a real socket with `Connection: close`, and that once
        // `stop` returns the port is free again for a listener without SO_REUSEPORT (the
        // shards' bind would otherwise fail); a second stop is harmless.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let probe = BootProbe::start(vec![(Port::Api, l)], &ShutdownSignal::new()).unwrap();
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut got = String::new();
        c.read_to_string(&mut got).unwrap();
        assert!(got.starts_with("HTTP/1.1 503 "), "{got}");
        assert!(got.contains("Connection: close\r\n"), "{got}");
        assert!(
            got.ends_with(&format!("{{\"error\":\"{STARTING_REASON}\"}}\n")),
            "{got}"
        );
        let t0 = Instant::now();
        probe.stop();
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        drop(TcpListener::bind(addr).expect("the probe's port is free after stop"));
        probe.stop();
    }
}
