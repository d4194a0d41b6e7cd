//! Snapshots of the whole `/metrics` document rendered from fixed inputs: a reorganisation of
//! the renderers must leave every byte in place (families, their order, HELP/TYPE lines,
//! series, label order, values). A deliberate change of the document updates the snapshot in
//! `testdata/`: a failing test writes what it rendered next to the temporary directory's other
//! files and names it, to be read and copied over the snapshot.

use std::time::Duration;

use narad_io::log::LogFailures;
use narad_io::partition::PartitionIoStats;
use narad_io::stats::Durations;
use narad_io::types::{PartitionId, PartitionKey, TopicId};
use narad_raft::{MetaState, RaftGauges, TopicMeta};
use narad_shard::fanout::{FanoutCounters, LinkCounts, PartitionLag};

use super::{render_doc, Merged, MetastoreFacts, NodeFacts};
use crate::metrics::expo::Histogram;
use crate::metrics::{
    HttpKey, HttpSeries, PartitionGauges, ShardMetrics, TopicCounters, Traffic,
    HTTP_DURATION_BOUNDS_US, WAL_BATCH_RECORDS_BOUNDS,
};

const ORDERS: TopicId = TopicId(0x0a);
const KID: TopicId = TopicId(0x0b);
const LATE: TopicId = TopicId(0x0c);

fn topic(name: &str, id: TopicId, partitions: u32, parent: Option<&str>) -> TopicMeta {
    TopicMeta {
        name: name.to_string(),
        id,
        partitions,
        retention_ms: 0,
        visibility_timeout_ms: 30_000,
        max_in_flight_per_partition: 1_000,
        max_acked_ahead_per_partition: 1_000,
        created_at_s: 1_700_000_000,
        owner: None,
        schemas: Vec::new(),
        parent: parent.map(str::to_string),
        children: Vec::new(),
        attach_epoch: parent.map(|_| "00000000000000aa".to_string()),
        fanout_delay_ms: 0,
        attach_offsets: Vec::new(),
        owners: Vec::new(),
        moves: Default::default(),
        remote: None,
    }
}

/// `orders` (4 partitions, a schema) with two children: `kid` (3 partitions) and `late` (2,
/// delayed).
fn meta() -> MetaState {
    let mut orders = topic("orders", ORDERS, 4, None);
    orders.schemas = vec![serde_json::json!({"type": "object"})];
    orders.children = vec!["kid".into(), "late".into()];
    let mut late = topic("late", LATE, 2, Some("orders"));
    late.fanout_delay_ms = 60_000;
    let mut meta = MetaState {
        applied_index: 42,
        ..MetaState::default()
    };
    for t in [orders, topic("kid", KID, 3, Some("orders")), late] {
        meta.topics.insert(t.name.clone(), t);
    }
    meta
}

fn key(topic: TopicId, partition: u32) -> PartitionKey {
    PartitionKey {
        topic,
        partition: PartitionId(partition),
    }
}

fn histogram(bounds: &'static [u64], values: &[u64]) -> Histogram {
    let mut h = Histogram::new(bounds);
    for &v in values {
        h.record(v);
    }
    h
}

fn durations(us: &[u64]) -> Durations {
    let mut d = Durations::default();
    for &v in us {
        d.record(Duration::from_micros(v));
    }
    d
}

fn http(
    route: &'static str,
    method: &'static str,
    status: u16,
    us: &[u64],
) -> (HttpKey, HttpSeries) {
    (
        HttpKey {
            route,
            method,
            status,
        },
        HttpSeries {
            duration_us: histogram(&HTTP_DURATION_BOUNDS_US, us),
            bytes_in: 10 * us.len() as u64,
            bytes_out: 100 * us.len() as u64 + u64::from(status),
        },
    )
}

fn gauges(n: u64) -> PartitionGauges {
    PartitionGauges {
        size_bytes: 4096 * n,
        segments: n as u32 + 1,
        high_watermark: 10 * n,
        frontier: 7 * n,
        in_flight: n,
        acked_ahead: n / 2,
        corrupt_skipped: n % 2,
        dropped: n % 3,
        oldest_unconsumed_age_ms: 1_500 * n,
    }
}

fn io_stats(n: u64) -> PartitionIoStats {
    PartitionIoStats {
        flush: durations(&[3 * n, 40 * n, 700]),
        flush_bytes: 1_000 * n,
        fsync: durations(&[900 * n, 12_000]),
        persist_ok: durations(&[1_200 * n]),
        persist_failed: durations(if n == 2 { &[30_000][..] } else { &[][..] }),
        retention_runs: durations(&[60 * n]),
        retention_bytes_deleted: 512 * n,
        retention_records_deleted: 5 * n,
    }
}

/// A shard with nothing recorded.
fn quiet_shard(shard: u32) -> ShardMetrics {
    ShardMetrics {
        shard,
        http: Vec::new(),
        in_flight: 0,
        traffic: Vec::new(),
        topics: Vec::new(),
        consume_wait: Vec::new(),
        partitions: Vec::new(),
        partition_io: Vec::new(),
        log_failures: LogFailures::default(),
        wal_fsync_us: Histogram::new(&narad_io::stats::FSYNC_BUCKET_BOUNDS_US),
        wal_batch_records: Histogram::new(&WAL_BATCH_RECORDS_BOUNDS),
        wal_bytes_written: 0,
        wal_failed: false,
        open_partition_logs: 0,
        idle_logs_evicted: 0,
        cold_retention_swept: 0,
        retention_panics: 0,
        reaper_restarts: 0,
        transit_backlog: 0,
        mesh_calls_pending: 0,
        schema: crate::schema::Counters::default(),
        fanout: FanoutCounters::default(),
        fanout_lag: Vec::new(),
        fanout_links: Vec::new(),
        leases_expired: Vec::new(),
        budget_rejections: 0,
        raft: None,
        rpc: Vec::new(),
        remotes: Vec::new(),
        remote_held_bytes: 0,
        remote_check_failures: Vec::new(),
    }
}

/// Two shards that both recorded traffic: the same HTTP series, partitions, topics, consume
/// outcomes and fan-out links on both (the merge adds them up), each owning some partitions;
/// shard 1 hosts the metadata group.
fn busy_shards() -> Vec<ShardMetrics> {
    let mut shards = vec![quiet_shard(0), quiet_shard(1)];
    for (i, s) in shards.iter_mut().enumerate() {
        let n = i as u64 + 1;
        s.http = vec![
            http(
                "POST /v1/topics/{topic}/produce",
                "POST",
                202,
                &[80 * n, 900, 40_000],
            ),
            http("GET /v1/topics/{topic}/consume", "GET", 200, &[300 * n]),
            http("GET /metrics", "GET", 200, &[2_000]),
        ];
        s.in_flight = n;
        s.traffic = vec![
            (
                key(ORDERS, 1),
                Traffic {
                    produced: 3 * n,
                    produced_bytes: 30 * n,
                    consumed: n,
                    consumed_bytes: 10 * n,
                },
            ),
            (
                key(KID, 2),
                Traffic {
                    produced: n,
                    produced_bytes: 7 * n,
                    consumed: 0,
                    consumed_bytes: 0,
                },
            ),
        ];
        s.topics = vec![(
            ORDERS,
            TopicCounters {
                acked: 2 * n,
                extended: n,
                nacked: 1,
                consume_empty: n,
                rejected_schema: n,
                rejected_delayed_child: n - 1,
                rejected_remote_child: 0,
            },
        )];
        s.consume_wait = vec![
            (
                (ORDERS, "hit"),
                histogram(&HTTP_DURATION_BOUNDS_US, &[50 * n]),
            ),
            (
                (ORDERS, "timeout"),
                histogram(&HTTP_DURATION_BOUNDS_US, &[1_000_000]),
            ),
        ];
        s.wal_fsync_us = histogram(
            &narad_io::stats::FSYNC_BUCKET_BOUNDS_US,
            &[120 * n, 4_000, 60_000],
        );
        s.wal_batch_records = histogram(&WAL_BATCH_RECORDS_BOUNDS, &[1, 3 * n, 64]);
        s.wal_bytes_written = 65_536 * n;
        // Both shards sent hand-offs (merged per operation); shard 0 also a forwarded take
        // that timed out.
        s.rpc = vec![(
            narad_io::peer::ops::COMMIT_BATCH,
            narad_io::peer::stats::OpStats {
                outcomes: [10 * n, 1, 0, 0, n - 1],
                seconds: durations(&[900 * n, 2_000]),
            },
        )];
        if n == 1 {
            s.rpc.push((
                narad_io::peer::ops::PARTITION_OP,
                narad_io::peer::stats::OpStats {
                    outcomes: [3, 0, 0, 1, 0],
                    seconds: durations(&[300, 500_000]),
                },
            ));
        }
        s.open_partition_logs = 3 + n;
        s.idle_logs_evicted = n;
        s.cold_retention_swept = 2 * n;
        s.retention_panics = n - 1;
        s.reaper_restarts = n;
        s.transit_backlog = 5 * n;
        s.mesh_calls_pending = 2 * n;
        s.log_failures = LogFailures {
            checkpoints: n,
            retention: 2 * n,
        };
        s.schema = crate::schema::Counters {
            validations: 20 * n,
            rejected_depth: n,
            rejected_malformed: 2 * n,
            rejected_invalid: 3 * n,
            rejected_busy: 0,
            rejected_definition_paths: 1,
            rejected_definition_pattern: n,
            in_flight: n - 1,
            slot_validation: durations(&[2_500 * n]),
        };
        let mut batch_records = [0; narad_shard::fanout::FANOUT_BATCH_RECORDS_BOUNDS.len() + 1];
        batch_records[2] = n;
        batch_records[5] = 1;
        let mut batch_bytes = [0; narad_shard::fanout::FANOUT_BATCH_BYTES_BOUNDS.len() + 1];
        batch_bytes[1] = n + 1;
        s.fanout = FanoutCounters {
            copied: 40 * n,
            dropped: n,
            unreadable: n,
            failed_copies: 2 * n,
            batch_records,
            batch_bytes,
            batch_bytes_sum: 3_000 * n,
        };
        s.fanout_lag = vec![
            PartitionLag {
                parent: key(ORDERS, 0),
                child: KID,
                lag_messages: 4 * n,
                due_lag_ms: 250 * n,
                remote_state: None,
                last_ok_ms: 0,
            },
            PartitionLag {
                parent: key(ORDERS, 1),
                child: LATE,
                lag_messages: n,
                due_lag_ms: 0,
                remote_state: None,
                last_ok_ms: 0,
            },
        ];
        s.fanout_links = vec![(
            ORDERS,
            KID,
            LinkCounts {
                copied: 40 * n,
                dropped: n,
            },
        )];
        s.leases_expired = vec![(ORDERS, n), (KID, 1)];
        s.budget_rejections = n;
    }
    // Each partition's gauges and storage figures come from its owner only.
    let owned = [
        (0, key(ORDERS, 0), 1),
        (1, key(ORDERS, 1), 2),
        (0, key(ORDERS, 2), 3),
        (1, key(KID, 0), 4),
        (0, key(LATE, 1), 5),
    ];
    for (shard, k, n) in owned {
        shards[shard].partitions.push((k, gauges(n)));
        if n % 2 == 0 || shard == 0 {
            shards[shard].partition_io.push((k, io_stats(n)));
        }
    }
    // A 5xx on one shard only: narad_errors_total{component="http"}.
    shards[0].http.push(http(
        "POST /v1/topics/{topic}/produce",
        "POST",
        503,
        &[5_000],
    ));
    shards[1].wal_failed = true;
    shards[1].raft = Some(RaftGauges {
        state: "leader",
        term: 3,
        last_log_index: 44,
        commit_index: 44,
        applied_index: 42,
        has_leader: true,
        last_contact_seconds: Some(0.25),
        voters: 1,
        nonvoters: 0,
        apply_stopped: false,
        store: narad_raft::store::StoreFigures {
            apply_errors_storage: 1,
            snapshot_bytes: 2_048,
            snapshot_duration_us: 1_250,
            snapshot_failures: 2,
        },
    });
    shards
}

fn busy_facts() -> NodeFacts {
    NodeFacts {
        auth_verify_queued: 2,
        metastore: Some(MetastoreFacts {
            fsm_bytes: 123_456,
            apply_stalled: true,
            heartbeat_last_success_s: Some(1_700_000_100.75),
            heartbeat_failures: 0,
            dead_marking_refused: 0,
        }),
        remotes_allowlist_configured: true,
        boot_duration_us: 1_234_567,
        orphan_topic_dirs: 1,
        data_dir_size_bytes: 987_654,
        vitals_collected_at_s: 1_700_000_098.5,
        inventory_collected_at_s: 1_700_000_101.125,
        data_dir_available_bytes: Some(50 << 30),
        cluster_tls_not_after: vec![("leaf", 1_800_000_000), ("ca", 2_000_000_000)],
        moves_inflight: 1,
        moves: {
            let mut t = crate::node::MoveTally::default();
            t.outcomes.insert("completed", 2);
            t.durations.record(1_500);
            t.durations.record(40_000);
            t.bytes = 1 << 20;
            t
        },
        decommission_blocked: vec![("n4".to_string(), "move_target")],
        remote_credentials: Vec::new(),
    }
}

/// Compares with `testdata/<name>`; on a difference, writes the rendering to the temporary
/// directory and names the first line that differs.
fn assert_snapshot(name: &str, want: &str, got: &str) {
    if want == got {
        return;
    }
    let path = std::env::temp_dir().join(format!("narad-scrape-{name}"));
    std::fs::write(&path, got).expect("write the rendering");
    let line = want
        .lines()
        .zip(got.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| want.lines().count().min(got.lines().count()));
    panic!(
        "the document differs from testdata/{name} from line {} on (rendered: {})",
        line + 1,
        path.display()
    );
}

#[test]
fn busy_node_document_is_unchanged() {
    // Proves the rendering of a node with traffic on two shards, children, schema rejections,
    // storage figures, a stalled metastore it leads, every node figure present: byte for byte
    // the snapshot.
    let shards = busy_shards();
    let doc = render_doc(&meta(), &Merged::of(&shards), &busy_facts(), &shards);
    assert_snapshot("busy.prom", include_str!("testdata/busy.prom"), &doc);
}

#[test]
fn quiet_node_document_is_unchanged() {
    // Proves the rendering of a node with one topic and no traffic, still booting, with no
    // Raft gauges reported and no filesystem figure: the families it declares without series
    // and those it leaves out, byte for byte the snapshot.
    let mut meta = MetaState::default();
    let t = topic("solo", TopicId(7), 3, None);
    meta.topics.insert(t.name.clone(), t);
    let facts = NodeFacts {
        auth_verify_queued: 0,
        metastore: None,
        remotes_allowlist_configured: false,
        boot_duration_us: 0,
        orphan_topic_dirs: 0,
        data_dir_size_bytes: 0,
        vitals_collected_at_s: 1_700_000_000.0,
        inventory_collected_at_s: 1_700_000_000.0,
        data_dir_available_bytes: None,
        cluster_tls_not_after: Vec::new(),
        moves_inflight: 0,
        moves: Default::default(),
        decommission_blocked: Vec::new(),
        remote_credentials: Vec::new(),
    };
    let shards = [quiet_shard(0)];
    let doc = render_doc(&meta, &Merged::of(&shards), &facts, &shards);
    assert_snapshot("quiet.prom", include_str!("testdata/quiet.prom"), &doc);
}

#[test]
fn follower_document_is_unchanged() {
    // Proves the Raft and membership families of a follower that knows no leader: no
    // last-contact or heartbeat-success series, no dead-marking family; byte for byte the
    // snapshot.
    let mut shard = quiet_shard(0);
    shard.raft = Some(RaftGauges {
        state: "follower",
        term: 7,
        last_log_index: 12,
        commit_index: 10,
        applied_index: 10,
        has_leader: false,
        last_contact_seconds: None,
        voters: 3,
        nonvoters: 1,
        apply_stopped: true,
        store: narad_raft::store::StoreFigures::default(),
    });
    let facts = NodeFacts {
        metastore: Some(MetastoreFacts {
            fsm_bytes: 4_096,
            apply_stalled: false,
            heartbeat_last_success_s: None,
            heartbeat_failures: 0,
            dead_marking_refused: 0,
        }),
        ..busy_facts()
    };
    let shards = [shard];
    let doc = render_doc(&meta(), &Merged::of(&shards), &facts, &shards);
    assert_snapshot(
        "follower.prom",
        include_str!("testdata/follower.prom"),
        &doc,
    );
}
