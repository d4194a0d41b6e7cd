//! The optional separate metrics listener (`http.metrics_addr`, `NARAD_HTTP_METRICS_ADDR`;
//! API.md §15.3): serves `GET /metrics`, `/healthz` and `/readyz` without credentials and nothing
//! else (`404`). Every shard accepts on it (SO_REUSEPORT), as on the API port; a scrape is
//! answered node-wide by whichever shard took the connection. When it is configured the API
//! port answers `/metrics` with `404` (`crate::scrape::api_port_response`).
//!
//! Owns: that listener's routing. Never serves an API route, never reads a body.

use std::future::Future;
use std::rc::Rc;

use narad_io::rt::{self, ShutdownSignal, TcpListener};

use crate::http::{Request, RequestHead, Response, Service};
use crate::node::Node;

/// Connections per shard on the metrics listener (scrapers are few).
pub const METRICS_CONNECTIONS_MAX: usize = 64;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Target {
    Metrics,
    Health,
}

/// This listener's routing: what `method path` is, or its `404`/`405` answer.
pub(crate) fn target(method: &str, path: &str) -> Result<Target, Response> {
    let t = match path {
        "/metrics" => Target::Metrics,
        "/healthz" | "/readyz" => Target::Health,
        _ => return Err(Response::text(404, "404 page not found\n")),
    };
    if method != "GET" && method != "HEAD" {
        let mut r = Response::text(405, "Method Not Allowed\n");
        r.headers.push(("Allow".into(), "GET, HEAD".into()));
        return Err(r);
    }
    Ok(t)
}

/// The metrics listener's service on one shard.
pub struct MetricsService {
    node: Rc<Node>,
}

impl MetricsService {
    pub fn new(node: Rc<Node>) -> MetricsService {
        MetricsService { node }
    }
}

impl Service for MetricsService {
    fn body_limit(&self, head: &RequestHead) -> Result<usize, Response> {
        target(head.method.as_str(), &head.path).map(|_| 0)
    }

    fn call(&self, req: Request) -> impl Future<Output = Response> {
        let node = self.node.clone();
        async move {
            match target(req.method.as_str(), &req.path) {
                Ok(Target::Metrics) => crate::scrape::document(&node).await,
                // The API's own health answers (same texts, same readiness rules).
                Ok(Target::Health) => crate::api::handle(&node, req).await,
                Err(r) => r,
            }
        }
    }
}

/// Starts the metrics listener on this shard when `http.metrics_addr` is set. It stops when
/// `stop` triggers, which the shard does only once its API listener has drained: until then
/// probes on this port see `/healthz` answer `503 shutting down` (API.md §15.1) instead of a
/// refused connection.
pub fn spawn(node: &Rc<Node>, stop: &ShutdownSignal) -> Result<(), String> {
    let addr = &node.config.http.metrics_addr;
    if addr.is_empty() {
        return Ok(());
    }
    let addr = crate::config::parse_listen_addr(addr)?;
    let listener = TcpListener::bind(addr).map_err(|e| format!("http.metrics_addr {addr}: {e}"))?;
    // Per shard: the listener only serves scrapes and probes.
    let limits = crate::service::limits(
        &node.config,
        crate::http::ConnectionBudget::new(METRICS_CONNECTIONS_MAX),
    );
    let service = Rc::new(MetricsService::new(node.clone()));
    rt::spawn(crate::http::serve(listener, service, limits, stop.clone())).detach();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_metrics_and_health_are_served() {
        // Proves the listener's routing: three GET/HEAD paths, 404 for any other path (API
        // routes included), 405 with Allow for another method.
        assert_eq!(target("GET", "/metrics").unwrap(), Target::Metrics);
        assert_eq!(target("HEAD", "/readyz").unwrap(), Target::Health);
        assert_eq!(target("GET", "/healthz").unwrap(), Target::Health);
        assert_eq!(target("GET", "/v1/topics").unwrap_err().status, 404);
        let r = target("POST", "/metrics").unwrap_err();
        assert_eq!(r.status, 405);
        assert_eq!(r.header("allow"), Some("GET, HEAD"));
    }
}
