//! §9.1 HTTP series: answers by route, method and status, their durations, body bytes by
//! route, requests in flight, and batch bodies refused for the node's body budget.
//!
//! Owns the rendering of those families from the merged figures; never reads the node.

use std::collections::BTreeMap;

use super::Merged;
use crate::metrics::expo::{Expo, Kind};

/// `narad_http_requests_total` and `narad_http_request_duration_seconds`, by route, method
/// and status.
pub(super) fn render_requests(e: &mut Expo, m: &Merged) {
    e.family(
        "narad_http_requests_total",
        Kind::Counter,
        "HTTP answers by matched route, method and status.",
    );
    for (k, v) in &m.http {
        let status = k.status.to_string();
        let labels = [
            ("route", k.route),
            ("method", k.method),
            ("status", status.as_str()),
        ];
        e.int("narad_http_requests_total", &labels, v.duration_us.count());
    }
    e.family(
        "narad_http_request_duration_seconds",
        Kind::Histogram,
        "Time from a request's body being read to its answer.",
    );
    for (k, v) in &m.http {
        let status = k.status.to_string();
        let labels = [
            ("route", k.route),
            ("method", k.method),
            ("status", status.as_str()),
        ];
        e.histogram(
            "narad_http_request_duration_seconds",
            &labels,
            &v.duration_us,
            1e6,
        );
    }
}

/// `narad_http_request_bytes_in_total` and `narad_http_response_bytes_out_total`, by route.
pub(super) fn render_bytes(e: &mut Expo, m: &Merged) {
    let mut by_route: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for (k, v) in &m.http {
        let r = by_route.entry(k.route).or_default();
        r.0 += v.bytes_in;
        r.1 += v.bytes_out;
    }
    e.family(
        "narad_http_request_bytes_in_total",
        Kind::Counter,
        "Request body bytes by route.",
    );
    for (route, (bytes_in, _)) in &by_route {
        e.int(
            "narad_http_request_bytes_in_total",
            &[("route", route)],
            *bytes_in,
        );
    }
    e.family(
        "narad_http_response_bytes_out_total",
        Kind::Counter,
        "Response body bytes by route.",
    );
    for (route, (_, bytes_out)) in &by_route {
        e.int(
            "narad_http_response_bytes_out_total",
            &[("route", route)],
            *bytes_out,
        );
    }
}

/// `narad_http_requests_in_flight`.
pub(super) fn render_in_flight(e: &mut Expo, m: &Merged) {
    e.family(
        "narad_http_requests_in_flight",
        Kind::Gauge,
        "Requests being handled.",
    );
    e.int("narad_http_requests_in_flight", &[], m.in_flight);
}

/// `narad_http_batch_body_budget_rejections_total`.
pub(super) fn render_budget_rejections(e: &mut Expo, m: &Merged) {
    e.family(
        "narad_http_batch_body_budget_rejections_total",
        Kind::Counter,
        "Batch produce bodies refused (503) because the node's batch-body budget was spent.",
    );
    e.int(
        "narad_http_batch_body_budget_rejections_total",
        &[],
        m.budget_rejections,
    );
}
