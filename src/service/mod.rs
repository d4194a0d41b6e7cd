//! Glue between the HTTP server (`http`) and the API (`api`): decides body limits from the head
//! alone and sizes the server's limits from the configuration. (The server itself answers a
//! handler panic with `500 {"error":"internal server panic"}`.)

use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;

use crate::api::admission::{BodyBudget, BodyHold, BodyPermit};
use crate::auth::caps::{CapGuard, Kind};
use crate::config::Config;
use crate::http::{Limits, Request, RequestHead, Reservation, Response, Service};
use crate::node::Node;

pub mod metrics_listener;

/// The answer when the batch-body budget is spent (API.md §4, §10.2).
const BUDGET_FULL: &str = "too many large batch bodies in flight on this node; retry later";

pub struct ApiService {
    node: Rc<Node>,
    /// The node's batch-body budget; `None` when it is off (0).
    batch_budget: Option<Arc<BodyBudget>>,
}

impl ApiService {
    pub fn new(node: Rc<Node>, batch_budget: Option<Arc<BodyBudget>>) -> ApiService {
        ApiService { node, batch_budget }
    }

    /// Records an answer decided before the handler ran, under the head's route.
    fn early_answer(&self, head: &RequestHead, status: u16) {
        let route = crate::api::route_label(head.method.as_str(), &head.path);
        self.node.metrics.early_answer(route, head, status);
    }
}

impl ApiService {
    /// One unit of the produce cap for a produce whose caller is known from the head.
    fn produce_slot(&self, head: &RequestHead) -> Result<Option<CapGuard>, Response> {
        let cap = self.node.config.http.max_produce_in_flight_per_identity;
        if cap == 0 || !crate::api::is_produce(head.method.as_str(), &head.path) {
            return Ok(None);
        }
        let Some(identity) = crate::auth::head_identity(&head.headers, head.peer, &head.path)
        else {
            return Ok(None);
        };
        crate::auth::node_auth()
            .caps
            .acquire(Kind::Produce, &identity, 1, cap)
            .map_err(|_| {
                let r = crate::api::error(429, &crate::auth::caps::refusal(Kind::Produce, cap));
                self.early_answer(head, r.status);
                r
            })
    }

    /// The node's batch-body budget when this body may take a share of it (API.md §10.2): the
    /// route allows more than 1 MiB and the body is declared over 1 MiB, or chunked.
    fn budget_for(&self, head: &RequestHead, limit: usize) -> Option<&Arc<BodyBudget>> {
        let large = limit > crate::api::BODY_BYTES_MAX
            && head
                .content_length()
                .is_none_or(|n| n as usize > crate::api::BODY_BYTES_MAX);
        self.batch_budget.as_ref().filter(|_| large)
    }

    /// Batch-body budget bytes for a body declared over 1 MiB (a chunked one reserves once it
    /// grows past 1 MiB, in `reserve_grown`).
    fn budget_bytes(
        &self,
        head: &RequestHead,
        limit: usize,
    ) -> Result<Option<BodyPermit>, Response> {
        match (self.budget_for(head, limit), head.content_length()) {
            (Some(budget), Some(n)) => self.take_budget(budget, head, (n as usize).min(limit)),
            _ => Ok(None),
        }
    }

    fn take_budget(
        &self,
        budget: &Arc<BodyBudget>,
        head: &RequestHead,
        want: usize,
    ) -> Result<Option<BodyPermit>, Response> {
        match budget.try_take(want) {
            Some(p) => Ok(Some(p)),
            None => {
                let r = crate::api::error(503, BUDGET_FULL).with_header("Retry-After", "1");
                self.early_answer(head, r.status);
                self.node.metrics.budget_rejected();
                Err(r)
            }
        }
    }
}

impl Service for ApiService {
    fn body_limit(&self, head: &RequestHead) -> Result<usize, Response> {
        crate::api::body_limit(head).inspect_err(|r| self.early_answer(head, r.status))
    }

    /// A body that may take batch-body budget (declared over 1 MiB, or chunked on a route
    /// allowing more) from a caller whose credential is not verified yet: the credential is
    /// checked first (API.md §1.4: authentication before anything else), so a wrong password
    /// gets its 401 (and counts toward the failed-login throttle) without holding budget or
    /// getting `100 Continue`. Verified and open callers, and small bodies, wait for nothing.
    fn admit_body(
        &self,
        head: &RequestHead,
        limit: usize,
    ) -> Option<std::pin::Pin<Box<dyn Future<Output = Option<Response>>>>> {
        self.budget_for(head, limit)?;
        if !matches!(
            crate::auth::precheck(&head.headers, &head.path),
            crate::auth::Pre::Pending
        ) {
            return None;
        }
        let node = self.node.clone();
        let (headers, peer, path) = (head.headers.clone(), head.peer, head.path.clone());
        Some(Box::pin(async move {
            crate::auth::authenticate(&node, &headers, peer, &path)
                .await
                .err()
                .map(Response::from)
        }))
    }

    /// Before a produce body is read, its caller takes one unit of the per-identity produce cap
    /// when that is on and the identity is known from the head (API.md §4: "a batch counts as 1
    /// while its body is read"); a full cap answers `429` without reading the body. Bodies over
    /// 1 MiB (only batch produce allows them) also take their declared size from the batch-body
    /// budget; a chunked body of such a route takes the route's cap once it grows past 1 MiB
    /// (see `reserve_grown`).
    fn reserve_body(
        &self,
        head: &RequestHead,
        limit: usize,
    ) -> Result<Option<Reservation>, Response> {
        let produce_slot = self.produce_slot(head)?;
        let budget = self.budget_bytes(head, limit)?;
        if produce_slot.is_none() && budget.is_none() {
            return Ok(None);
        }
        Ok(Some(Box::new(BodyHold::new(produce_slot, budget))))
    }

    /// A chunked body of a route allowing more than 1 MiB takes the route's cap from the batch-
    /// body budget once it grows past 1 MiB (its final size is unknown until then); smaller ones
    /// take nothing, as with a declared length (API.md §10.2).
    fn reserve_grown(
        &self,
        head: &RequestHead,
        limit: usize,
        len: usize,
        reservation: &mut Option<Reservation>,
    ) -> Result<(), Response> {
        let Some(budget) = self.budget_for(head, limit) else {
            return Ok(());
        };
        if len <= crate::api::BODY_BYTES_MAX {
            return Ok(());
        }
        let hold = reservation.get_or_insert_with(|| Box::new(BodyHold::new(None, None)));
        let Some(hold) = hold.downcast_mut::<BodyHold>() else {
            return Ok(());
        };
        if !hold.holds_budget() {
            hold.hold_budget(self.take_budget(budget, head, limit)?);
        }
        Ok(())
    }

    fn on_refused(&self, status: u16) {
        self.node.metrics.refused(status);
    }

    fn on_refused_after_head(&self, head: &RequestHead, status: u16) {
        self.early_answer(head, status);
    }

    fn body_too_large(&self, head: &RequestHead) -> impl Future<Output = Response> {
        crate::api::too_large(&self.node, head)
    }

    fn call(&self, req: Request) -> impl Future<Output = Response> {
        // The server catches a panic inside and answers 500 {"error":"internal server panic"}.
        let route = crate::api::route_label(req.method.as_str(), &req.path);
        crate::metrics::observe(&self.node.metrics, self.node.shard.0, route, req, |req| {
            crate::api::handle(&self.node, req)
        })
    }
}

/// The HTTP limits of one shard; `connections` is the node's connection budget
/// (`http.max_connections`), shared by every shard.
pub fn limits(config: &Config, connections: Arc<crate::http::ConnectionBudget>) -> Limits {
    let h = &config.http;
    Limits {
        header_bytes_max: h.max_header_bytes,
        body_bytes_max: crate::api::BATCH_BODY_BYTES_MAX,
        read_timeout: h.read_timeout,
        idle_timeout: h.idle_timeout,
        write_timeout: h.write_timeout,
        connections,
        ..Limits::default()
    }
}
