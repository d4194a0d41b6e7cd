//! Glue between the HTTP server (`http`) and the API (`api`): decides body limits from the head
//! alone and sizes the server's limits from the configuration. (The server itself answers a
//! handler panic with `500 {"error":"internal server panic"}`.)

use std::future::Future;
use std::rc::Rc;

use narad_io::rt::Semaphore;

use crate::config::Config;
use crate::http::{Limits, Request, RequestHead, Reservation, Response, Service};
use crate::node::Node;

/// The answer when the batch-body budget is spent (API.md §4, §10.2).
const BUDGET_FULL: &str = "too many large batch bodies in flight on this node; retry later";

pub struct ApiService {
    node: Rc<Node>,
    /// This shard's share of `http.max_batch_body_bytes_in_flight` (the node budget split evenly
    /// over the shards, as the connection cap is, but never below one whole batch body so a
    /// lone large batch always fits); `None` when the budget is off (0).
    batch_budget: Option<Semaphore>,
}

impl ApiService {
    pub fn new(node: Rc<Node>) -> ApiService {
        let total = node.config.http.max_batch_body_bytes_in_flight;
        let batch_budget = (total > 0).then(|| {
            let share = total.div_ceil(node.shards as usize);
            Semaphore::new(share.max(crate::api::BATCH_BODY_BYTES_MAX))
        });
        ApiService { node, batch_budget }
    }
}

impl Service for ApiService {
    fn body_limit(&self, head: &RequestHead) -> Result<usize, Response> {
        crate::api::body_limit(head).inspect_err(|r| self.node.metrics.early_answer(head, r.status))
    }

    /// Bodies over 1 MiB (only batch produce allows them) take their declared size from the
    /// budget before a byte is read; a chunked body of such a route takes the route's cap, since
    /// its size is unknown until read.
    fn reserve_body(
        &self,
        head: &RequestHead,
        limit: usize,
    ) -> Result<Option<Reservation>, Response> {
        let Some(budget) = &self.batch_budget else {
            return Ok(None);
        };
        if limit <= crate::api::BODY_BYTES_MAX {
            return Ok(None);
        }
        let want = match head.content_length() {
            Some(n) if n as usize <= crate::api::BODY_BYTES_MAX => return Ok(None),
            Some(n) => (n as usize).min(limit),
            None => limit,
        };
        match budget.try_acquire_n(want) {
            Some(p) => Ok(Some(Box::new(p))),
            None => {
                let r = crate::api::error(503, BUDGET_FULL).with_header("Retry-After", "1");
                self.node.metrics.early_answer(head, r.status);
                self.node.metrics.budget_rejected();
                Err(r)
            }
        }
    }

    fn on_refused(&self, status: u16) {
        self.node.metrics.refused(status);
    }

    fn on_refused_after_head(&self, head: &RequestHead, status: u16) {
        self.node.metrics.early_answer(head, status);
    }

    fn body_too_large(&self, head: &RequestHead) -> Response {
        crate::api::too_large(head)
    }

    fn call(&self, req: Request) -> impl Future<Output = Response> {
        // The server catches a panic inside and answers 500 {"error":"internal server panic"}.
        crate::metrics::observe(&self.node, req, |req| crate::api::handle(&self.node, req))
    }
}

/// The HTTP limits of one shard: the node-wide connection cap is split over the shards.
pub fn limits(config: &Config, shards: u32) -> Limits {
    let h = &config.http;
    let per_shard = if h.max_connections == 0 {
        0
    } else {
        h.max_connections.div_ceil(shards as usize)
    };
    Limits {
        header_bytes_max: h.max_header_bytes,
        body_bytes_max: crate::api::BATCH_BODY_BYTES_MAX,
        read_timeout: h.read_timeout,
        idle_timeout: h.idle_timeout,
        write_timeout: h.write_timeout,
        connections_max: per_shard,
        ..Limits::default()
    }
}
