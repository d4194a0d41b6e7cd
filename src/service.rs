//! Glue between the HTTP server (`http`) and the API (`api`): decides body limits from the head
//! alone and sizes the server's limits from the configuration. (The server itself answers a
//! handler panic with `500 {"error":"internal server panic"}`.)

use std::future::Future;
use std::rc::Rc;

use crate::config::Config;
use crate::http::{Limits, Request, RequestHead, Response, Service};
use crate::node::Node;

pub struct ApiService {
    node: Rc<Node>,
}

impl ApiService {
    pub fn new(node: Rc<Node>) -> ApiService {
        ApiService { node }
    }
}

impl Service for ApiService {
    fn body_limit(&self, head: &RequestHead) -> Result<usize, Response> {
        crate::api::body_limit(head).inspect_err(|r| self.node.metrics.early_answer(head, r.status))
    }

    fn on_refused(&self, status: u16) {
        self.node.metrics.refused(status);
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
