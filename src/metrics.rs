//! Per-shard counters rendered in the Prometheus text format (OPERATIONS.md §9). Each shard keeps
//! its own counters (no sharing between threads); `/metrics` renders the shard that answered the
//! scrape. Node-wide aggregation across shards and the labelled series of §9 are not done yet.

use std::cell::Cell;

#[derive(Default)]
pub struct Metrics {
    pub http_requests: Cell<u64>,
    pub messages_produced: Cell<u64>,
    pub messages_consumed: Cell<u64>,
}

impl Metrics {
    pub fn render(&self) -> String {
        format!(
            "# TYPE narad_http_requests_total counter\nnarad_http_requests_total {}\n\
             # TYPE narad_messages_produced_total counter\nnarad_messages_produced_total {}\n\
             # TYPE narad_messages_consumed_total counter\nnarad_messages_consumed_total {}\n",
            self.http_requests.get(),
            self.messages_produced.get(),
            self.messages_consumed.get()
        )
    }
}
