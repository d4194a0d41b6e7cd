//! §9.4 remote plane: the allowlist is a fact of the configuration; the shipper's counters
//! (requests, errors, resends, bytes, chunk limit, held bytes), the remote cursors' states, lags
//! and last successes, and this node's view of each sealed credential are series; the families
//! nothing here feeds yet (request histograms, RTT, gate back-off, seals and decrypts, refused
//! destinations) are declared without series so that dashboards and alerts that name them find
//! them.
//!
//! Owns the rendering of those families from the node's facts and the shards' snapshots; never
//! reads the node.

use std::collections::BTreeMap;

use super::NodeFacts;
use crate::metrics::expo::{Expo, Kind};
use crate::metrics::remote::RemoteCounters;
use crate::metrics::ShardMetrics;
use narad_raft::MetaState;

/// Label-less §9.4 series of the remote plane, zero on a node that holds no remotes.
const REMOTE_ZERO_SERIES: [(&str, Kind, &str); 3] = [
    (
        "narad_remote_held_bytes",
        Kind::Gauge,
        "Bytes of remote-child records this node holds while it sends them.",
    ),
    (
        "narad_remote_seals_total",
        Kind::Counter,
        "Remote credentials sealed (no remotes on this node).",
    ),
    (
        "narad_remote_reseal_opens_total",
        Kind::Counter,
        "Remote credentials opened to be resealed (no remotes on this node).",
    ),
];

/// OPERATIONS.md §9.4 families with labels, in document order: each is declared, and gets the
/// series this node has for it (see `render`), none for those nothing feeds yet.
const REMOTE_FAMILIES: [(&str, Kind, &str); 23] = [
    (
        "narad_fanout_remote_state",
        Kind::Gauge,
        "State of a remote child's partition.",
    ),
    (
        "narad_fanout_remote_lag_seconds",
        Kind::Gauge,
        "Age of a remote child's oldest unsent record.",
    ),
    (
        "narad_fanout_remote_retention_headroom_seconds",
        Kind::Gauge,
        "Time before a remote child's unsent records age out of the parent's retention.",
    ),
    (
        "narad_fanout_remote_last_success_timestamp_seconds",
        Kind::Gauge,
        "When a remote child last delivered a batch.",
    ),
    (
        "narad_fanout_remote_check_failures_total",
        Kind::Counter,
        "Failed remote child checks.",
    ),
    (
        "narad_fanout_remote_skipped_records_total",
        Kind::Counter,
        "Records skipped for a remote child.",
    ),
    (
        "narad_remote_requests_total",
        Kind::Counter,
        "Requests to a remote, by status code.",
    ),
    (
        "narad_remote_request_seconds",
        Kind::Histogram,
        "Duration of requests to a remote.",
    ),
    (
        "narad_remote_inflight_wait_seconds",
        Kind::Histogram,
        "Wait for an in-flight slot of a remote.",
    ),
    (
        "narad_remote_rtt_seconds",
        Kind::Gauge,
        "Round-trip time to a remote.",
    ),
    (
        "narad_remote_gate_backoff_seconds",
        Kind::Gauge,
        "Current back-off of a remote's gate.",
    ),
    (
        "narad_remote_chunk_bytes_limit",
        Kind::Gauge,
        "Largest chunk sent to a remote.",
    ),
    (
        "narad_remote_errors_total",
        Kind::Counter,
        "Errors talking to a remote, by class.",
    ),
    (
        "narad_remote_resent_records_total",
        Kind::Counter,
        "Records sent to a remote again.",
    ),
    (
        "narad_remote_wire_bytes_total",
        Kind::Counter,
        "Bytes sent to a remote on the wire.",
    ),
    (
        "narad_remote_body_bytes_total",
        Kind::Counter,
        "Body bytes sent to a remote.",
    ),
    (
        "narad_remote_credential_decrypts_total",
        Kind::Counter,
        "Decryptions of a remote's credential.",
    ),
    (
        "narad_remote_credential_state",
        Kind::Gauge,
        "State of a remote's credential.",
    ),
    (
        "narad_remote_credential_age_seconds",
        Kind::Gauge,
        "Age of a remote's credential.",
    ),
    (
        "narad_remote_credential_key_current",
        Kind::Gauge,
        "1 when a remote's credential uses the current key.",
    ),
    (
        "narad_remote_key_seals",
        Kind::Gauge,
        "Credentials sealed with a key.",
    ),
    (
        "narad_remote_key_age_seconds",
        Kind::Gauge,
        "Age of a sealing key.",
    ),
    (
        "narad_remote_destination_refused_total",
        Kind::Counter,
        "Remote destinations refused by the address guard, by reason.",
    ),
];

/// The credential and key series of family `name`, from this node's view of each remote.
fn credential_series(e: &mut Expo, name: &str, facts: &NodeFacts) {
    let creds = &facts.remote_credentials;
    match name {
        "narad_remote_credential_state" => {
            for c in creds {
                e.int(name, &[("remote", &c.remote), ("state", &c.state)], 1);
            }
        }
        "narad_remote_credential_age_seconds" => {
            for c in creds {
                e.int(name, &[("remote", &c.remote)], c.age_s);
            }
        }
        "narad_remote_credential_key_current" => {
            for c in creds {
                e.int(name, &[("remote", &c.remote)], u64::from(c.key_current));
            }
        }
        "narad_remote_key_seals" | "narad_remote_key_age_seconds" => {
            let mut keys: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
            for c in creds {
                let k = keys.entry(c.key_version.as_str()).or_default();
                k.0 += 1;
                k.1 = k.1.max(c.age_s);
            }
            for (key, (seals, age)) in keys {
                let v = if name == "narad_remote_key_seals" {
                    seals
                } else {
                    age
                };
                e.int(name, &[("key", key)], v);
            }
        }
        _ => {}
    }
}

/// `narad_fanout_remote_lag_seconds{parent,child,partition}` (how long past due the oldest
/// unshipped record is) and `narad_fanout_remote_last_success_timestamp_seconds{parent,child}`
/// (the latest over this node's cursors), for the remote children this node ships.
fn remote_cursor_series(e: &mut Expo, name: &str, shards: &[ShardMetrics], meta: &MetaState) {
    let by_id: std::collections::HashMap<_, _> = meta.topics.values().map(|t| (t.id, t)).collect();
    let mut last: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    let mut lag: Vec<(&str, &str, u32, u64)> = Vec::new();
    for l in shards.iter().flat_map(|s| &s.fanout_lag) {
        let (Some(_), Some(p), Some(c)) = (
            l.remote_state,
            by_id.get(&l.parent.topic),
            by_id.get(&l.child),
        ) else {
            continue;
        };
        let k = last.entry((p.name.as_str(), c.name.as_str())).or_default();
        *k = (*k).max(l.last_ok_ms);
        lag.push((&p.name, &c.name, l.parent.partition.0, l.due_lag_ms));
    }
    if name == "narad_fanout_remote_lag_seconds" {
        lag.sort();
        for (p, c, partition, ms) in lag {
            let partition = partition.to_string();
            e.float(
                name,
                &[("parent", p), ("child", c), ("partition", &partition)],
                ms as f64 / 1e3,
            );
        }
    } else {
        for ((p, c), ms) in last.into_iter().filter(|(_, ms)| *ms > 0) {
            e.float(name, &[("parent", p), ("child", c)], ms as f64 / 1e3);
        }
    }
}

/// `narad_fanout_remote_state{parent,child,partition,state}` = 1 for each remote child's parent
/// partition shipped from this node, in its current state (`paused` while the link is paused).
fn remote_states(e: &mut Expo, shards: &[ShardMetrics], meta: &MetaState) {
    let by_id: std::collections::HashMap<_, _> = meta.topics.values().map(|t| (t.id, t)).collect();
    let mut rows: Vec<(&str, &str, u32, &str)> = Vec::new();
    for l in shards.iter().flat_map(|s| &s.fanout_lag) {
        let (Some(code), Some(p), Some(c)) = (
            l.remote_state,
            by_id.get(&l.parent.topic),
            by_id.get(&l.child),
        ) else {
            continue;
        };
        let paused = c.remote.as_ref().is_some_and(|r| r.paused);
        let state = if paused {
            "paused"
        } else {
            crate::ship::state_name(code)
        };
        rows.push((&p.name, &c.name, l.parent.partition.0, state));
    }
    rows.sort();
    for (p, c, partition, state) in rows {
        let partition = partition.to_string();
        e.int(
            "narad_fanout_remote_state",
            &[
                ("parent", p),
                ("child", c),
                ("partition", &partition),
                ("state", state),
            ],
            1,
        );
    }
}

/// Every family of this module, in that order; the shipper's counters (summed over `shards`)
/// are the series of the remote families they feed.
pub(super) fn render(e: &mut Expo, facts: &NodeFacts, shards: &[ShardMetrics], meta: &MetaState) {
    let mut remotes: BTreeMap<&str, RemoteCounters> = BTreeMap::new();
    for (name, c) in shards.iter().flat_map(|s| &s.remotes) {
        remotes.entry(name.as_str()).or_default().merge(c);
    }
    e.family(
        "narad_remotes_allowlist_configured",
        Kind::Gauge,
        "1 when remotes.allowed_hosts is set on this node.",
    );
    e.int(
        "narad_remotes_allowlist_configured",
        &[],
        u64::from(facts.remotes_allowlist_configured),
    );
    e.family(
        "narad_remotes_plaintext_raft",
        Kind::Gauge,
        "1 when this node holds remotes and its Raft transport runs without TLS (it holds none).",
    );
    e.int("narad_remotes_plaintext_raft", &[], 0);
    // No remotes are held and nothing is sealed here: the label-less series are zero.
    let held: u64 = shards.iter().map(|s| s.remote_held_bytes).sum();
    for (name, kind, help) in REMOTE_ZERO_SERIES {
        e.family(name, kind, help);
        let v = if name == "narad_remote_held_bytes" {
            held
        } else {
            0
        };
        e.int(name, &[], v);
    }
    // The labelled families: declared, with the series this node has for each.
    for (name, kind, help) in REMOTE_FAMILIES {
        e.family(name, kind, help);
        match name {
            "narad_fanout_remote_state" => remote_states(e, shards, meta),
            "narad_fanout_remote_lag_seconds"
            | "narad_fanout_remote_last_success_timestamp_seconds" => {
                remote_cursor_series(e, name, shards, meta)
            }
            "narad_fanout_remote_check_failures_total" => {
                let by_id: std::collections::HashMap<_, _> =
                    meta.topics.values().map(|t| (t.id, t)).collect();
                let mut failures: BTreeMap<(&str, &str), u64> = BTreeMap::new();
                for (child, n) in shards.iter().flat_map(|s| &s.remote_check_failures) {
                    if let Some(c) = by_id.get(child) {
                        let parent = c.parent.as_deref().unwrap_or("");
                        *failures.entry((parent, c.name.as_str())).or_default() += n;
                    }
                }
                for ((p, c), n) in failures {
                    e.int(name, &[("parent", p), ("child", c)], n);
                }
            }
            "narad_fanout_remote_skipped_records_total" => {
                for t in meta.topics.values() {
                    if let (Some(r), Some(p)) = (&t.remote, &t.parent) {
                        let n: usize = r.skip.values().map(Vec::len).sum();
                        e.int(name, &[("parent", p), ("child", &t.name)], n as u64);
                    }
                }
            }
            _ => {}
        }
        credential_series(e, name, facts);
        for (remote, c) in &remotes {
            match name {
                "narad_remote_requests_total" => {
                    for (code, n) in &c.requests {
                        e.int(name, &[("remote", remote), ("code", code)], *n);
                    }
                }
                "narad_remote_errors_total" => {
                    for (class, n) in &c.errors {
                        e.int(name, &[("remote", remote), ("class", class)], *n);
                    }
                }
                "narad_remote_resent_records_total" => e.int(name, &[("remote", remote)], c.resent),
                "narad_remote_body_bytes_total" => e.int(name, &[("remote", remote)], c.body_bytes),
                "narad_remote_wire_bytes_total" => e.int(name, &[("remote", remote)], c.wire_bytes),
                "narad_remote_chunk_bytes_limit" if c.chunk_limit > 0 => {
                    e.int(name, &[("remote", remote)], c.chunk_limit)
                }
                "narad_remote_request_seconds" => {
                    if let Some(h) = &c.request_us {
                        e.histogram(name, &[("remote", remote)], h, 1e6);
                    }
                }
                "narad_remote_inflight_wait_seconds" => {
                    if let Some(h) = &c.inflight_wait_us {
                        e.histogram(name, &[("remote", remote)], h, 1e6);
                    }
                }
                "narad_remote_credential_decrypts_total" => {
                    e.int(name, &[("remote", remote)], c.decrypts)
                }
                "narad_remote_destination_refused_total" => {
                    for (reason, n) in &c.destination_refused {
                        e.int(name, &[("remote", remote), ("reason", reason)], *n);
                    }
                }
                _ => {}
            }
        }
    }
}
