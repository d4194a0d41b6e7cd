//! Server wiring: one shard per core, each with its log, its partitions, an HTTP listener on the
//! shared API port (SO_REUSEPORT) and its end of the cross-shard mesh; shard 0 also hosts the Raft
//! metadata group. Start-up order per shard: join the mesh, recover the log, (shard 0) start Raft
//! and push the metadata to every shard, then listen. Until the first shard listens, the node's
//! ports are held by the [`crate::boot_probe`], which answers the health probes. Shutdown: stop
//! accepting, finish in-flight requests within the grace period, checkpoint the log, exit.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use narad_io::durable;
use narad_io::log::{LogConfig, ShardLog};
use narad_io::rt::{self, MeshSetup, RuntimeConfig, ShutdownSignal, TcpListener};
use narad_io::types::{ShardId, PLACEMENT_VERSION};
use narad_raft::{MetaConfig, MetaNode};
use narad_shard::host::Host;

use crate::boot_probe::{self, BootProbe};
use crate::config::{parse_listen_addr, Config};
use crate::node::{Node, NodeSetup, NodeWide, ShardReq, ShardResp};

/// Messages queued per pair of shards before a sender waits.
const MESH_CAPACITY: usize = 1024;
/// How long a shard waits at start for shard 0 to release it (metadata pushed, deleted topics
/// purged).
const META_WAIT_MAX: Duration = Duration::from_secs(60);
/// Descriptors wanted beyond `http.max_connections`: segment, WAL and metadata files, sockets.
const OPEN_FILES_MARGIN: u64 = 1024;
/// Retention runs this often on every shard (SEMANTICS.md §6).
const RETENTION_INTERVAL: Duration = Duration::from_secs(60);
/// Expired leases are swept this often (SEMANTICS.md §2.2).
const LEASE_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

pub fn init_logging(config: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("NARAD_LOG").unwrap_or_else(|_| {
        // openraft narrates every election at info; keep it to warnings unless asked.
        tracing_subscriber::EnvFilter::new(format!("{},openraft=warn", config.log_level))
    });
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if config.log_format == "json" {
        b.json().try_init()
    } else {
        b.try_init()
    };
}

/// The shard count is fixed when the data directory is created and recorded in it (`shards`:
/// the count, then `placement <v>`, the partition-to-shard placement of
/// [`narad_io::types::owner_shard`]). A multi-shard directory laid out by another placement is
/// refused: its partitions would be looked for on the wrong shards.
fn shard_count(data_dir: &Path, wanted: u32) -> Result<u32, String> {
    let path = data_dir.join("shards");
    if let Ok(s) = std::fs::read_to_string(&path) {
        let mut lines = s.lines();
        let n: u32 = lines
            .next()
            .unwrap_or("")
            .trim()
            .parse()
            .map_err(|_| format!("{}: not a shard count", path.display()))?;
        if wanted != 0 && wanted != n {
            return Err(format!(
                "the data directory was created with {n} shards; NARAD_SHARDS={wanted} cannot change it"
            ));
        }
        let placement = lines
            .find_map(|l| l.trim().strip_prefix("placement "))
            .map_or(Some(1), |v| v.trim().parse::<u32>().ok());
        if n > 1 && placement != Some(PLACEMENT_VERSION) {
            return Err(format!(
                "{}: the data directory was laid out with partition placement {} by another \
                 build; this build uses placement {PLACEMENT_VERSION}: start it with the build that \
                 created it, or use a new data directory",
                path.display(),
                placement.map_or("(unreadable)".to_string(), |v| v.to_string()),
            ));
        }
        return Ok(n);
    }
    let n = if wanted != 0 {
        wanted
    } else {
        rt::available_cpus().len().max(1) as u32
    };
    // `shards.tmp`, synced, renamed into place, the data directory synced.
    let text = format!("{n}\nplacement {PLACEMENT_VERSION}\n");
    durable::write_temp(&path, text.as_bytes())
        .map_err(|e| format!("{}: {e}", durable::temp_path(&path).display()))?;
    durable::install_temp(&path).map_err(|e| e.to_string())?;
    Ok(n)
}

/// A node id taken from the host name gives way to the one the data directory was started with:
/// a container gets a new host name each time it is created (Docker names it after the
/// container), and the single-member metastore would refuse to start under another id. An id
/// given in the file, the environment or a flag is kept (and refused on a mismatch).
fn keep_recorded_node_id(config: &mut Config, data_dir: &Path) {
    if config.node_id_given {
        return;
    }
    if let Some(id) = narad_raft::stored_node_id(data_dir) {
        if id != config.node_id {
            tracing::info!(
                node_id = %id,
                host_name = %config.node_id,
                "keeping the node id this data directory was started with (set cluster.node_id \
                 or NARAD_NODE_ID to choose one)"
            );
            config.node_id = id;
        }
    }
}

/// How long start-up waits for a listening address that is in use.
const BIND_IN_USE_WAIT_MAX: Duration = Duration::from_secs(3);

/// Settings the original honours that this broker accepts (so existing config files keep working)
/// but does not act on: said once at start, so nobody believes they took effect.
fn warn_inert_settings(config: &Config) {
    if config.storage.codec == "zstd" {
        tracing::warn!(
            "storage.codec is zstd: partition segments are stored uncompressed by this broker \
             (the setting is accepted and has no effect; batch bodies sent with \
             Content-Encoding: zstd are still accepted)"
        );
    }
    if !config.http.pprof_addr.is_empty() {
        tracing::warn!(
            pprof_addr = %config.http.pprof_addr,
            "http.pprof_addr is set: this broker has no pprof listener and opens nothing there \
             (profile it with perf or another sampling profiler)"
        );
    }
}

/// Binds `addr`, waiting up to [`BIND_IN_USE_WAIT_MAX`] while it is in use: a broker killed a
/// moment ago (kill -9, OOM) keeps its listeners for a few milliseconds after its exit, until
/// the kernel tears its io_uring rings down, and a supervisor that restarts it at once would
/// otherwise see `Address already in use`.
fn bind_when_free(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let start = Instant::now();
    let mut logged = false;
    loop {
        match std::net::TcpListener::bind(addr) {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                if start.elapsed() >= BIND_IN_USE_WAIT_MAX {
                    return Err(e);
                }
                if !logged {
                    logged = true;
                    tracing::info!(%addr, "address in use; waiting up to {BIND_IN_USE_WAIT_MAX:?} for it to be released");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

pub fn run(mut config: Config) -> Result<(), String> {
    crate::metrics::boot_started();
    std::fs::create_dir_all(&config.data_dir)
        .map_err(|e| format!("data directory {}: {e}", config.data_dir.display()))?;
    let data_dir = std::fs::canonicalize(&config.data_dir).map_err(|e| e.to_string())?;
    keep_recorded_node_id(&mut config, &data_dir);
    let shards = shard_count(&data_dir, config.shards)?;
    let addr = parse_listen_addr(&config.http.addr)?;
    // Bind here so that a port in use is a clear start-up error, not a failure in a shard; the
    // boot probe then answers on these sockets until the first shard binds its own.
    let mut probe_listeners = vec![(
        boot_probe::Port::Api,
        bind_when_free(addr).map_err(|e| format!("http.addr {addr}: {e}"))?,
    )];
    if !config.http.metrics_addr.is_empty() {
        // Config validation refused a metrics address that overlaps http.addr.
        let maddr = parse_listen_addr(&config.http.metrics_addr)?;
        let l = bind_when_free(maddr).map_err(|e| format!("http.metrics_addr {maddr}: {e}"))?;
        probe_listeners.push((boot_probe::Port::Metrics, l));
    }
    if let Some(files) = rt::raise_process_limits() {
        // Each connection is a descriptor, and so are segment files, WAL segments and sockets.
        let wanted = config.http.max_connections as u64 + OPEN_FILES_MARGIN;
        if config.http.max_connections > 0 && files < wanted {
            tracing::warn!(
                open_files_limit = files,
                max_connections = config.http.max_connections,
                "the open-files limit is below http.max_connections plus {OPEN_FILES_MARGIN} for \
                 files: raise it (ulimit -n, LimitNOFILE=) or lower http.max_connections"
            );
        }
    }
    warn_inert_settings(&config);
    let shutdown = ShutdownSignal::new();
    rt::install_termination_handler(&shutdown).map_err(|e| e.to_string())?;
    // After the signal mask is set: the probe's threads inherit it, so SIGTERM never kills them.
    let probe = Arc::new(
        BootProbe::start(probe_listeners, &shutdown)
            .map_err(|e| format!("starting the boot probe: {e}"))?,
    );
    let mesh: MeshSetup<ShardReq, ShardResp> = MeshSetup::new(shards, MESH_CAPACITY);
    let config = Arc::new(Config {
        data_dir: data_dir.clone(),
        ..config
    });
    // The shards still serving HTTP; a shard leaves the mesh only when none is.
    let serving = Arc::new(Serving::new(shards));
    let mut rcfg = RuntimeConfig::new(data_dir.clone());
    rcfg.shards = shards;
    rcfg.on_shard_panic = Some(stop_on_shard_panic(
        shutdown.clone(),
        serving.clone(),
        config.http.shutdown_grace,
    ));
    let budget_bytes = config.http.max_batch_body_bytes_in_flight;
    let body_budget =
        (budget_bytes > 0).then(|| crate::api::admission::BodyBudget::new(budget_bytes));
    let connections = crate::http::ConnectionBudget::new(config.http.max_connections);
    let shard_probe = probe.clone();
    let wide = Arc::new(NodeWide::default());
    let results = rt::run(rcfg, move |id| {
        let (config, mesh, shutdown) = (config.clone(), mesh.clone(), shutdown.clone());
        let (serving, body_budget) = (serving.clone(), body_budget.clone());
        let (connections, probe, wide) = (connections.clone(), shard_probe.clone(), wide.clone());
        async move {
            let shared = Shared {
                serving,
                body_budget,
                connections,
                probe,
                wide,
            };
            let r = shard_main(id, shards, config, mesh, shutdown.clone(), addr, shared).await;
            if let Err(e) = &r {
                // One shard failing takes the node down instead of leaving it half served; say
                // why now, not only once every other shard has stopped.
                tracing::error!(shard = id.0, error = %e, "shard failed; the node stops");
                shutdown.trigger();
            }
            r
        }
    });
    // A start-up that failed (or was cut short by SIGTERM) never reached a shard's bind.
    probe.stop();
    let results = results.map_err(|e| e.to_string())?;
    for r in results {
        r?;
    }
    Ok(())
}

/// What a panic that nothing caught does to the node: the shard it happened on has ended, so
/// the others stop serving (they drain like on SIGTERM) and the process exits with an error
/// instead of going on half served. Should the drain wait on the ended shard, the process exits
/// anyway after twice the grace. Accepted messages are safe either way: they were in the WAL
/// before their `202`.
fn stop_on_shard_panic(
    shutdown: ShutdownSignal,
    serving: Arc<Serving>,
    grace: Duration,
) -> rt::ShardPanicHook {
    Arc::new(move |id: ShardId| {
        tracing::error!(shard = id.0, "a panic ended this shard; the node stops");
        serving.leave(id);
        shutdown.trigger();
        let limit = grace * 2 + Duration::from_secs(5);
        let _ = std::thread::Builder::new()
            .name("panic-exit".into())
            .spawn(move || {
                std::thread::sleep(limit);
                eprintln!(
                    "narad: the node did not stop within {limit:?} after a shard panicked; exiting"
                );
                std::process::exit(70);
            });
    })
}

// Test-only knobs (read with `crate::config::test_knob`), documented here only: they exist so
// black-box tests can watch retention delete files without waiting an hour.
// `NARAD_TEST_PARTITION_SEGMENT_BYTES`: partition segment size (default 64 MiB, at least 4096);
// `NARAD_TEST_RETENTION_INTERVAL_MS`: how often retention runs (default 60 s);
// `NARAD_TEST_RETENTION_CLOCK_SKEW_MS`: retention judges record ages as if the clock read this
// much later (default 0); `NARAD_TEST_WAL_BATCHES_IN_FLIGHT`: WAL batches in flight per shard
// (pipelined group commit depth, 1..7, default 2; for benchmarks);
// `NARAD_TEST_WAL_PIPELINE_MIN_BYTES`: queued WAL bytes before a batch is pipelined behind one in
// flight (default 4096; 0 pipelines at once; for benchmarks);
// `NARAD_TEST_CHECKPOINT_WAL_BYTES` / `NARAD_TEST_CHECKPOINT_INTERVAL_MS`: a checkpoint starts
// after this much WAL or this long (defaults 64 MiB and 5 s; for benchmarks);
// `NARAD_TEST_IDLE_EVICTION_MS`: storage.idle_log_eviction_ms below its one-minute floor;
// `NARAD_TEST_START_DELAY_MS`: every shard waits this long (or until SIGTERM) before recovering
// its log, so tests can watch a node that is still starting (the boot probe);
// `NARAD_TEST_RAFT_LOG_FAIL_AFTER`: the metadata Raft log's writes fail with EIO after this many
// (a failing disk under the metadata group); `NARAD_TEST_WAL_FAIL_AFTER_BATCHES`: shard 0's
// WAL write fails after this many batches (a failing disk under the ingress WAL; the other
// shards' stay healthy, so tests see the node-wide refusal).

fn log_config(data_dir: &Path, shard: ShardId, shards: u32) -> LogConfig {
    let mut c = LogConfig::new(PathBuf::from(data_dir), shard, shards);
    if let Some(b) = crate::config::test_knob("NARAD_TEST_PARTITION_SEGMENT_BYTES") {
        c.partition_segment_bytes_max = b.max(4096);
    }
    if let Some(b) = crate::config::test_knob("NARAD_TEST_CHECKPOINT_WAL_BYTES") {
        c.checkpoint_wal_bytes = b.max(1 << 20);
    }
    if let Some(ms) = crate::config::test_knob("NARAD_TEST_CHECKPOINT_INTERVAL_MS") {
        c.checkpoint_interval_ms = ms.max(10);
    }
    if let Some(n) = crate::config::test_knob("NARAD_TEST_WAL_BATCHES_IN_FLIGHT") {
        c.wal_batches_in_flight_max = n.clamp(1, 7) as usize;
    }
    if let Some(b) = crate::config::test_knob("NARAD_TEST_WAL_PIPELINE_MIN_BYTES") {
        c.wal_pipeline_min_bytes = b as usize;
    }
    if shard.0 == 0 {
        c.wal_fail_after_batches = crate::config::test_knob("NARAD_TEST_WAL_FAIL_AFTER_BATCHES");
    }
    c
}

/// Which shards of the node still serve HTTP (and so may forward requests to the others).
struct Serving(Vec<std::sync::atomic::AtomicBool>);

impl Serving {
    fn new(shards: u32) -> Serving {
        Serving(
            (0..shards)
                .map(|_| std::sync::atomic::AtomicBool::new(true))
                .collect(),
        )
    }

    /// Counts a shard out (again is harmless: a shard that panicked is counted out by the
    /// panic hook, whether or not its guard ran).
    fn leave(&self, id: ShardId) {
        if let Some(s) = self.0.get(id.0 as usize) {
            s.store(false, std::sync::atomic::Ordering::Release);
        }
    }

    fn any(&self) -> bool {
        self.0
            .iter()
            .any(|s| s.load(std::sync::atomic::Ordering::Acquire))
    }
}

/// What the shards of one node share: the shards still serving, the batch-body budget, the
/// connection budget and the boot probe.
struct Shared {
    serving: Arc<Serving>,
    body_budget: Option<Arc<crate::api::admission::BodyBudget>>,
    /// The node's open-connection cap (`http.max_connections`), counted over every shard.
    connections: Arc<crate::http::ConnectionBudget>,
    /// Holds the node's ports until the first shard binds them.
    probe: Arc<BootProbe>,
    /// The node-wide counters and cursors of `node` (transit progress, keyless rotations).
    wide: Arc<NodeWide>,
}

// mimalloc's C library, linked through the mimalloc crate (the binary's global allocator).
use mimalloc as _;

extern "C" {
    fn mi_collect(force: bool);
}

/// Hands the memory start-up freed back to the system. Recovery reads each WAL segment and each
/// partition's newest segment whole (64 MiB buffers, one at a time); mimalloc keeps what is
/// freed for a purge delay that a then idle shard thread never reaches, so a restarted node held
/// the images: two shards, release build, an empty data directory: 76 MiB fresh, 196 MiB after
/// a restart, 78 MiB with this; 150k messages recovered after kill -9 (debug build): 102 MiB
/// before the kill, 186 MiB after, 98 MiB with this.
fn release_freed_memory() {
    // SAFETY: mi_collect takes no arguments that point anywhere; it may run on any thread at any
    // time and only returns memory the allocator holds unused.
    unsafe { mi_collect(true) }
}

async fn shard_main(
    id: ShardId,
    shards: u32,
    config: Arc<Config>,
    mesh: MeshSetup<ShardReq, ShardResp>,
    shutdown: ShutdownSignal,
    addr: std::net::SocketAddr,
    shared: Shared,
) -> Result<(), String> {
    let Shared {
        serving,
        body_budget,
        connections,
        probe,
        wide,
    } = shared;
    // Counts this shard out of `serving` however this function returns.
    let serving_guard = ServingGuard(serving.clone(), id);
    let mesh = mesh.join(id).await.map_err(|e| e.to_string())?;
    // However this shard ends (a start-up error included), its peers' calls to it then fail at
    // once instead of waiting for an answer that cannot come.
    let _leave_mesh = LeaveMesh(mesh.clone());
    if let Some(ms) = crate::config::test_knob("NARAD_TEST_START_DELAY_MS") {
        futures_lite::future::or(
            async {
                rt::sleep(Duration::from_millis(ms)).await;
            },
            shutdown.wait(),
        )
        .await;
    }
    let (log, recovered, report) = ShardLog::open(log_config(&config.data_dir, id, shards))
        .await
        .map_err(|e| format!("shard {}: opening the log: {e}", id.0))?;
    tracing::debug!(shard = id.0, report = ?report, "log recovered");
    // The seed of this shard's lease-nonce generators, from the one random source.
    let host = Host::new(log, recovered, narad_io::sys::random_u64());
    let meta_node = if id.0 == 0 {
        let mut mc = MetaConfig::new(config.data_dir.clone(), config.node_id.clone());
        mc.snapshot_logs_since_last = config.raft_snapshot_threshold;
        mc.logs_kept_after_snapshot = config.raft_trailing_logs;
        mc.fail_log_writes_after = crate::config::test_knob("NARAD_TEST_RAFT_LOG_FAIL_AFTER");
        if config.peers.is_empty() {
            Some(MetaNode::start(mc).await.map_err(|e| e.to_string())?)
        } else {
            mc.raft_addr = config.advertised_cluster_addr();
            mc.peers = config
                .peers
                .iter()
                .map(|p| (p.id.clone(), p.addr.clone()))
                .collect();
            mc.may_bootstrap = config.may_bootstrap();
            // Between nodes an append's budget includes the follower's fsync and the network,
            // on machines that may be busy: a leader heard every 200 ms, an election after 0.8-1.6 s
            // of silence (CLUSTER.md §6: crash election ~1 s).
            mc.heartbeat_interval_ms = 200;
            mc.election_timeout_min_ms = 800;
            mc.election_timeout_max_ms = 1600;
            // The group elects through the cluster port, which opens once the node exists:
            // waiting for a leader here would only delay that.
            mc.leader_wait_ms = 0;
            let links = narad_raft::network::PeerLinks::new(crate::node::identity(&config));
            Some(
                MetaNode::start_cluster(mc, links)
                    .await
                    .map_err(|e| e.to_string())?,
            )
        }
    } else {
        None
    };
    let node = Node::new(NodeSetup {
        shard: id,
        shards,
        config: config.clone(),
        host: host.clone(),
        mesh: mesh.clone(),
        meta_node,
        shutdown: shutdown.clone(),
        wide,
    });
    node.watch_metadata_group();
    // Other nodes reach this shard's cluster port as soon as it can serve them (Raft needs it
    // before start-up finishes: the group elects a leader through it).
    if let Some(l) = crate::cluster::bind(&config)? {
        crate::cluster::serve(&node, l, &shutdown);
    }
    if !config.peers.is_empty() {
        node.follow_metadata();
    }
    {
        let weak = Rc::downgrade(&node);
        host.set_wake_hook(Box::new(move |topic| {
            if let Some(n) = weak.upgrade() {
                n.forward_wake(topic);
            }
        }));
    }
    crate::auth::attach_shard(&node);
    let n2 = node.clone();
    mesh.serve(move |from, req| Box::pin(n2.clone().serve(from, req)));
    if id.0 == 0 {
        // Seed before any shard serves, so a ready node already has its root admin. A cluster
        // node seeds in the background: it starts (and takes produces) without a quorum, and
        // the users come through Raft.
        if config.peers.is_empty() {
            crate::auth::seed::seed_root(&node).await?;
        } else {
            let n = node.clone();
            rt::spawn(async move {
                if let Err(e) = crate::auth::seed::seed_root(&n).await {
                    tracing::error!(error = %e, "seeding the root admin failed; a restart retries");
                }
            })
            .detach();
        }
        let state = node.meta_node_state().expect("shard 0 hosts the metadata");
        // A shard that failed to start stops the node: stop waiting for its answer then.
        let sent = futures_lite::future::or(
            async {
                node.broadcast_meta(state).await;
                true
            },
            async {
                shutdown.wait().await;
                false
            },
        )
        .await;
        if !sent {
            // Told to stop (SIGTERM, or another shard failed and said so): a stop, not a failure
            // of this shard. Only a shard's own failure is the node's error.
            tracing::info!(
                shard = id.0,
                "stopped during start-up, before every shard had the metadata"
            );
            return Ok(());
        }
        // Every shard has the metadata: drop what a crash kept of deleted topics.
        node.purge_deleted_topics().await;
        node.release_shards().await;
    } else {
        let start = std::time::Instant::now();
        // Shard 0 releases this shard once the metadata is everywhere and the data of deleted
        // topics is gone: serving earlier would show a node that is still starting as ready.
        while !node.released() {
            if shutdown.is_triggered() {
                tracing::info!(
                    shard = id.0,
                    "stopped during start-up, before shard 0 finished it"
                );
                return Ok(());
            }
            if start.elapsed() > META_WAIT_MAX {
                return Err(format!(
                    "shard {}: shard 0 did not finish its start-up in {META_WAIT_MAX:?}",
                    id.0
                ));
            }
            rt::sleep(Duration::from_millis(2)).await;
        }
    }
    node.start_fanout();
    crate::ship::install(&node);
    crate::transit::start(&node);
    spawn_housekeeping(&node, &config);
    // The probe's sockets have no SO_REUSEPORT: they must be closed before this bind (the first
    // shard here closes them; the others wait until it has).
    probe.stop();
    let listener = TcpListener::bind(addr).map_err(|e| format!("http.addr {addr}: {e}"))?;
    let metrics_stop = ShutdownSignal::new();
    crate::service::metrics_listener::spawn(&node, &metrics_stop)?;
    node.mark_started();
    release_freed_memory();
    crate::metrics::shard_serving();
    if id.0 == 0 {
        tracing::info!(addr = %addr, shards, "http listening");
    }
    let service = Rc::new(crate::service::ApiService::new(node.clone(), body_budget));
    let limits = crate::service::limits(&config, connections);
    let grace = config.http.shutdown_grace;
    let served = crate::http::serve(listener, service, limits, shutdown.clone());
    let drained = futures_lite::future::or(
        async {
            served.await;
            true
        },
        async {
            shutdown.wait().await;
            rt::sleep(grace).await;
            false
        },
    )
    .await;
    if !drained {
        tracing::warn!(
            shard = id.0,
            "shutdown grace ran out with requests in flight"
        );
    }
    metrics_stop.trigger();
    // Hand the accepted single produces to their shards while every shard still serves the
    // mesh (no shard closes its log before all have passed here). What is left stays in the
    // WAL and is handed over after the restart.
    let left = node.transit.drain(std::time::Instant::now() + grace).await;
    if left > 0 {
        tracing::warn!(
            shard = id.0,
            records = left,
            "accepted records not yet handed to their shard; they are handed over after the restart"
        );
    }
    // Other shards may still forward requests here until they too stopped serving: leave the
    // mesh only when every shard is done (a bounded wait: each one stops within the grace).
    drop(serving_guard);
    let start = std::time::Instant::now();
    while serving.any() && start.elapsed() < grace * 2 {
        rt::sleep(Duration::from_millis(5)).await;
    }
    node.close_fanout().await;
    if let Err(e) = node.host.log().close().await {
        tracing::error!(shard = id.0, error = %e, "closing the log failed");
    }
    node.shutdown_meta().await;
    Ok(())
}

struct LeaveMesh(narad_io::rt::Mesh<ShardReq, ShardResp>);

impl Drop for LeaveMesh {
    fn drop(&mut self) {
        self.0.close();
    }
}

struct ServingGuard(Arc<Serving>, ShardId);

impl Drop for ServingGuard {
    fn drop(&mut self) {
        self.0.leave(self.1);
    }
}

fn spawn_housekeeping(node: &Rc<Node>, config: &Config) {
    let idle_ms = crate::config::test_knob("NARAD_TEST_IDLE_EVICTION_MS")
        .unwrap_or(config.storage.idle_log_eviction_ms);
    if idle_ms > 0 {
        let idle = Duration::from_millis(idle_ms);
        // Looked at a few times per idle period: a log closes between idle and idle + 1/4.
        let every = idle / 4;
        let n = node.clone();
        rt::spawn(async move {
            while !n.shutting_down() {
                rt::sleep(every).await;
                let closed = n.host.log().evict_idle_logs(idle);
                if closed > 0 {
                    tracing::debug!(closed, "idle partition logs closed");
                }
            }
        })
        .detach();
    }
    if injected_panic("detached") && node.shard.0 + 1 == node.shards {
        rt::spawn(async {
            rt::sleep(Duration::from_millis(300)).await;
            panic!("injected panic in a detached task (NARAD_TEST_PANIC)");
        })
        .detach();
    }
    let n = node.clone();
    let mut inject = injected_panic("sweep");
    rt::spawn(async move {
        while !n.shutting_down() {
            rt::sleep(LEASE_SWEEP_INTERVAL).await;
            let pass = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                if std::mem::take(&mut inject) {
                    panic!("injected panic in the lease-expiry loop (NARAD_TEST_PANIC)");
                }
                n.host.sweep();
            }));
            if pass.is_err() {
                // Leases still lapse: the loop starts over at its next tick (the panic hook
                // printed where it happened).
                n.metrics.reaper_restarted();
                tracing::error!(
                    shard = n.shard.0,
                    "the lease-expiry loop panicked; restarting it"
                );
            }
        }
    })
    .detach();
    let n = node.clone();
    let retention_every = crate::config::test_knob("NARAD_TEST_RETENTION_INTERVAL_MS")
        .map_or(RETENTION_INTERVAL, Duration::from_millis);
    let skew_ms = crate::config::test_knob("NARAD_TEST_RETENTION_CLOCK_SKEW_MS").unwrap_or(0);
    let mut inject = injected_panic("retention");
    rt::spawn(async move {
        while !n.shutting_down() {
            rt::sleep(retention_every).await;
            let pass = retention_pass(&n, skew_ms, std::mem::take(&mut inject));
            if futures_lite::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(pass))
                .await
                .is_err()
            {
                n.metrics.retention_panicked();
                tracing::error!(
                    shard = n.shard.0,
                    "a retention pass panicked; the next pass runs as planned"
                );
            }
        }
    })
    .detach();
}

/// One retention pass over every topic's partitions on this shard (their logs open or closed).
async fn retention_pass(n: &Node, skew_ms: u64, inject_panic: bool) {
    if inject_panic {
        panic!("injected panic in a retention pass (NARAD_TEST_PANIC)");
    }
    let meta = n.meta();
    for t in meta.topics.values() {
        let now = narad_io::types::UnixMillis(
            narad_io::types::UnixMillis::now().0.saturating_add(skew_ms),
        );
        if let Err(e) = n.host.enforce_retention_at(t.id, t.retention_ms, now).await {
            tracing::error!(topic = %t.name, error = %e, "retention failed");
        }
    }
}

/// `NARAD_TEST_PANIC=retention|sweep|detached` (test-only, comma-separated): the first pass of
/// that housekeeping loop on each shard panics, so tests can watch the loop recover; `detached`
/// panics in a task of the last shard that nothing catches, so tests can watch the node stop.
fn injected_panic(which: &str) -> bool {
    std::env::var("NARAD_TEST_PANIC")
        .map(|v| v.split(',').any(|w| w.trim() == which))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_count_records_placement_and_refuses_other_layouts() {
        // Proves a new directory records its count and placement and reopens with them, that a
        // one-shard directory without a placement line still opens (placement cannot matter),
        // and that a multi-shard directory of the earlier placement is refused with a message
        // that says why instead of looking for its partitions on the wrong shards.
        let dir = std::env::temp_dir().join(format!("narad-shards-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(shard_count(&dir, 3).unwrap(), 3);
        let text = std::fs::read_to_string(dir.join("shards")).unwrap();
        assert_eq!(text, format!("3\nplacement {PLACEMENT_VERSION}\n"));
        assert_eq!(shard_count(&dir, 0).unwrap(), 3);
        assert!(shard_count(&dir, 2)
            .unwrap_err()
            .contains("created with 3 shards"));
        std::fs::write(dir.join("shards"), "1\n").unwrap();
        assert_eq!(shard_count(&dir, 0).unwrap(), 1);
        std::fs::write(dir.join("shards"), "2\n").unwrap();
        let e = shard_count(&dir, 0).unwrap_err();
        assert!(
            e.contains("placement 1") && e.contains("new data directory"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
