//! Node configuration: built-in defaults, then a JSON file (`--config`), then `NARAD_*` environment
//! variables, then command-line flags (OPERATIONS.md §4). The layered result is validated as a whole
//! before any data is opened; every problem names the setting.
//!
//! This module never touches the network or the data directory.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::wire::duration::GoDuration;

#[derive(Clone, Debug)]
pub struct HttpConfig {
    pub addr: String,
    pub read_timeout: Duration,
    pub write_timeout: Duration,
    pub idle_timeout: Duration,
    pub shutdown_grace: Duration,
    pub max_consume_wait: Duration,
    pub max_header_bytes: usize,
    pub max_connections: usize,
    pub max_consume_in_flight_per_identity: usize,
    pub max_produce_in_flight_per_identity: usize,
    pub max_batch_body_bytes_in_flight: usize,
    pub metrics_addr: String,
    pub metrics_unauthenticated: bool,
    pub pprof_addr: String,
}

impl HttpConfig {
    /// API.md §15.3: on the API port `/metrics` takes the API's Basic auth unless
    /// `http.metrics_unauthenticated` is set and no separate listener is configured (the separate
    /// listener itself never asks for credentials). With security off nothing needs credentials.
    pub fn metrics_need_credentials(&self) -> bool {
        !(self.metrics_addr.is_empty() && self.metrics_unauthenticated)
    }
}

#[derive(Clone, Debug)]
pub struct TopicDefaults {
    pub default_partitions: u32,
    pub max_partitions: u32,
    pub default_retention_age_ms: u64,
    pub default_visibility_timeout_ms: u64,
    pub default_max_in_flight_per_partition: u32,
    pub default_max_acked_ahead_per_partition: u32,
}

/// The operator's `storage.*` settings besides `data_dir` (OPERATIONS.md §4.2). Validated and
/// kept; the storage engine of this build runs with its own fixed policy and reads none of them
/// yet.
#[derive(Clone, Debug)]
pub struct StorageConfig {
    /// `none` or `zstd`.
    pub codec: String,
    /// `fastest`, `default`, `better` or `best`.
    pub compression_level: String,
    /// 0 = off, else at least [`STORAGE_WALK_MS_MIN`].
    pub idle_log_eviction_ms: u64,
    /// 0 = off, else at least [`STORAGE_WALK_MS_MIN`].
    pub cold_retention_walk_ms: u64,
    /// [`OFFSET_COMMIT_INTERVAL_MS_MIN`]..=[`OFFSET_COMMIT_INTERVAL_MS_MAX`].
    pub consumer_offset_commit_interval_ms: u64,
    pub ingress_wal_prealloc: bool,
}

/// The Raft mTLS files (`security.cluster_tls_*_file`): all three or none. Validated and kept;
/// a single-node build has no Raft transport to secure yet.
#[derive(Clone, Debug, Default)]
pub struct ClusterTls {
    pub cert_file: String,
    pub key_file: String,
    pub ca_file: String,
}

/// The `remotes.*` settings (OPERATIONS.md §4.2): parsed, validated and kept so that a
/// configuration written for the original loads. This build has no remote plane (remote children
/// are answered 501), so nothing reads them yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemotesConfig {
    /// Exact host names or `*.suffix` patterns.
    pub allowed_hosts: Vec<String>,
    pub allowed_ports: Vec<u16>,
    /// CIDRs exempt from the address guard.
    pub allow_addresses: Vec<String>,
    pub max_held_bytes: u64,
    pub api_hop_encrypted: bool,
}

impl Default for RemotesConfig {
    fn default() -> RemotesConfig {
        RemotesConfig {
            allowed_hosts: Vec::new(),
            allowed_ports: vec![443],
            allow_addresses: Vec::new(),
            max_held_bytes: 268_435_456,
            api_hop_encrypted: false,
        }
    }
}

/// Whether `s` is an address prefix `ip/len` (IPv4 or IPv6).
fn is_cidr(s: &str) -> bool {
    let Some((ip, len)) = s.split_once('/') else {
        return false;
    };
    let Ok(len) = len.parse::<u8>() else {
        return false;
    };
    match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => len <= 32,
        Ok(std::net::IpAddr::V6(_)) => len <= 128,
        Err(_) => false,
    }
}

/// Whether `s` is a host name or a `*.suffix` pattern of one.
fn is_host_pattern(s: &str) -> bool {
    is_host_name(s.strip_prefix("*.").unwrap_or(s))
}

/// Whether `name` is a DNS host name: dot-separated labels of 1-63 letters, digits and inner
/// hyphens, 253 bytes at most.
fn is_host_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// The environment variable with the root admin's first password (read when the root admin is
/// seeded; checked with the rest of the configuration).
pub const ADMIN_PASSWORD_ENV: &str = "NARAD_ADMIN_PASSWORD";
/// Longest password accepted (bcrypt's limit, API.md §2).
pub const PASSWORD_BYTES_MAX: usize = 72;

/// Shortest non-zero idle-log eviction and cold-retention walk period.
pub const STORAGE_WALK_MS_MIN: u64 = 60_000;
/// Bounds of `storage.consumer_offset_commit_interval_ms`.
pub const OFFSET_COMMIT_INTERVAL_MS_MIN: u64 = 10;
pub const OFFSET_COMMIT_INTERVAL_MS_MAX: u64 = 60_000;
/// Shortest `cluster.raft_snapshot_interval`.
pub const RAFT_SNAPSHOT_INTERVAL_MIN: Duration = Duration::from_millis(5);

#[derive(Clone, Debug)]
pub struct Config {
    pub http: HttpConfig,
    pub node_id: String,
    /// Whether `node_id` was given (file, env or flag) rather than taken from the host name.
    pub node_id_given: bool,
    pub cluster_addr: String,
    /// `cluster.raft_snapshot_interval`: validated, not used by a single-node build yet.
    pub raft_snapshot_interval: Duration,
    /// `cluster.raft_snapshot_threshold`: the metadata group snapshots after this many entries.
    pub raft_snapshot_threshold: u64,
    /// `cluster.raft_trailing_logs`: metadata log entries kept behind a snapshot.
    pub raft_trailing_logs: u64,
    pub data_dir: PathBuf,
    pub storage: StorageConfig,
    pub topic: TopicDefaults,
    pub log_level: String,
    pub log_format: String,
    pub security_enabled: bool,
    pub cluster_tls: ClusterTls,
    pub remotes: RemotesConfig,
    /// `fanout.*`: the copy slab and its linger.
    pub fanout: narad_shard::fanout::FanoutLimits,
    /// Shards (executors) on this node; 0 = one per CPU. Fixed when the data directory is created.
    pub shards: u32,
    pub dev: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            http: HttpConfig {
                addr: ":7942".into(),
                read_timeout: Duration::from_secs(10),
                write_timeout: Duration::from_secs(30),
                idle_timeout: Duration::from_secs(60),
                shutdown_grace: Duration::from_secs(10),
                max_consume_wait: Duration::from_secs(10),
                max_header_bytes: 65536,
                max_connections: 4096,
                max_consume_in_flight_per_identity: 1024,
                max_produce_in_flight_per_identity: 0,
                max_batch_body_bytes_in_flight: 256 << 20,
                metrics_addr: String::new(),
                metrics_unauthenticated: false,
                pprof_addr: String::new(),
            },
            node_id: hostname(),
            node_id_given: false,
            cluster_addr: ":7943".into(),
            raft_snapshot_interval: Duration::from_secs(120),
            raft_snapshot_threshold: 8192,
            raft_trailing_logs: 10_240,
            data_dir: PathBuf::from("data"),
            storage: StorageConfig {
                codec: "none".into(),
                compression_level: "fastest".into(),
                idle_log_eviction_ms: 1_800_000,
                cold_retention_walk_ms: 300_000,
                consumer_offset_commit_interval_ms: 1000,
                ingress_wal_prealloc: false,
            },
            topic: TopicDefaults {
                default_partitions: 3,
                max_partitions: 108,
                default_retention_age_ms: 604_800_000,
                default_visibility_timeout_ms: 30_000,
                default_max_in_flight_per_partition: 1024,
                default_max_acked_ahead_per_partition: 1024,
            },
            log_level: "info".into(),
            log_format: "json".into(),
            security_enabled: true,
            cluster_tls: ClusterTls::default(),
            remotes: RemotesConfig::default(),
            fanout: narad_shard::fanout::FanoutLimits::default(),
            shards: 0,
            dev: false,
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "narad-0".into())
}

/// A config file error that names the setting it is about (OPERATIONS.md §4.1): for a value of
/// the wrong type or range, or an unknown key, the dotted path of the member at the error's
/// position (`http.max_connections: invalid type: ...`); syntax errors keep serde's text only.
fn file_error(text: &str, e: &serde_json::Error) -> String {
    let path = (e.classify() == serde_json::error::Category::Data)
        .then(|| {
            let line_start: usize = text
                .split_inclusive('\n')
                .take(e.line().saturating_sub(1))
                .map(str::len)
                .sum();
            json_path_at(text.as_bytes(), line_start + e.column().saturating_sub(1))
        })
        .flatten();
    let msg = plain_json_words(&e.to_string());
    match path {
        Some(p) => format!("config file: {p}: {msg}"),
        None => format!("config file: {msg}"),
    }
}

/// The top-level keys of the config file, each a JSON object (or `null`, meaning absent).
const FILE_SECTIONS: &[&str] = &[
    "http", "cluster", "storage", "topic", "fanout", "log", "security", "remotes",
];

/// Refuses a config file whose top level or one of whose sections is not a JSON object, before
/// serde sees it: serde would read an array as a struct's fields in declaration order
/// (`{"log":["debug","text"]}` set `log.level`) and names the Rust struct in its errors.
fn check_file_shape(text: &str) -> Result<(), String> {
    let kind = |v: &serde_json::Value| match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    };
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| file_error(text, &e))?;
    let Some(top) = v.as_object() else {
        return Err(format!(
            "config file: the top level must be a JSON object, like \
             {{\"http\":{{...}},\"topic\":{{...}}}} (found {})",
            kind(&v)
        ));
    };
    for (key, section) in top {
        if FILE_SECTIONS.contains(&key.as_str()) && !(section.is_object() || section.is_null()) {
            return Err(format!(
                "config file: {key}: must be a JSON object of {key}.* settings (found {})",
                kind(section)
            ));
        }
    }
    Ok(())
}

/// Replaces serde's words for Rust types in an error text with what the JSON must hold
/// (`expected u32` names a Rust type, not a range an operator can act on).
fn plain_json_words(msg: &str) -> String {
    let mut msg = msg.to_string();
    for (rust, json) in [
        ("expected u16", "expected an integer from 0 to 65535"),
        ("expected u32", "expected an integer from 0 to 4294967295"),
        ("expected u64", "expected a non-negative integer"),
        ("expected a sequence", "expected a JSON array"),
        ("expected a map", "expected a JSON object"),
        ("invalid type: sequence", "invalid type: array"),
        ("invalid type: map", "invalid type: object"),
    ] {
        msg = msg.replace(rust, json);
    }
    // `expected struct FileHttp`: the shape check refuses non-objects first; kept as a backstop.
    while let Some(at) = msg.find("expected struct ") {
        let name_end = msg[at + "expected struct ".len()..]
            .find(|c: char| !c.is_alphanumeric())
            .map_or(msg.len(), |n| at + "expected struct ".len() + n);
        msg.replace_range(at..name_end, "expected a JSON object");
    }
    msg
}

/// Deepest container level [`json_path_at`] enters.
const JSON_PATH_DEPTH_MAX: usize = 64;

/// The dotted path (`a.b`, `a[2].c`) of the innermost object member of the JSON `text` whose
/// span, from its key to the end of its value, holds byte `at`. `None` when no member does or
/// the text stops being JSON before one does. Walks with the wire reader: each level skips the
/// items before the one holding `at` and enters that one (a value that does not end runs to
/// the end of the text).
fn json_path_at(text: &[u8], at: usize) -> Option<String> {
    let mut r = crate::wire::reader::Reader::new(text);
    let mut path = String::new();
    let mut member = None;
    'level: for _ in 0..JSON_PATH_DEPTH_MAX {
        r.skip_ws();
        let object = match r.peek() {
            Some(b'{') => true,
            Some(b'[') => false,
            _ => break,
        };
        r.pos += 1;
        for index in 0.. {
            r.skip_ws();
            let item_at = r.pos;
            let key = match r.peek() {
                Some(b'"') if object => {
                    let Ok(key) = r.read_string_lossy() else {
                        break 'level;
                    };
                    if r.expect(b':', "").is_err() {
                        break 'level;
                    }
                    Some(key)
                }
                Some(b'}' | b']') | None => break 'level,
                Some(_) if object => break 'level,
                Some(_) => None,
            };
            let value_at = r.pos;
            let (end, complete) = match r.skip_value() {
                Ok((_, end)) => (end, true),
                Err(_) => (text.len(), false),
            };
            if (item_at..=end).contains(&at) {
                match key {
                    Some(k) => {
                        if !path.is_empty() {
                            path.push('.');
                        }
                        path.push_str(&k);
                        member = Some(path.clone());
                    }
                    None => path.push_str(&format!("[{index}]")),
                }
                r.pos = value_at;
                continue 'level;
            }
            if !complete {
                break 'level;
            }
            r.skip_ws();
            if r.peek() == Some(b',') {
                r.pos += 1;
            }
        }
    }
    member
}

/// The JSON config file. Unknown keys at any level are a start-up error.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    http: Option<FileHttp>,
    cluster: Option<FileCluster>,
    storage: Option<serde_json::Map<String, serde_json::Value>>,
    topic: Option<FileTopic>,
    fanout: Option<FileFanout>,
    log: Option<FileLog>,
    security: Option<FileSecurity>,
    remotes: Option<FileRemotes>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileRemotes {
    allowed_hosts: Option<Vec<String>>,
    allowed_ports: Option<Vec<u16>>,
    allow_addresses: Option<Vec<String>>,
    max_held_bytes: Option<u64>,
    api_hop_encrypted: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileHttp {
    addr: Option<String>,
    read_timeout: Option<String>,
    write_timeout: Option<String>,
    idle_timeout: Option<String>,
    shutdown_grace: Option<String>,
    max_consume_wait: Option<String>,
    max_header_bytes: Option<u64>,
    max_connections: Option<u64>,
    max_consume_in_flight_per_identity: Option<u64>,
    max_produce_in_flight_per_identity: Option<u64>,
    max_batch_body_bytes_in_flight: Option<u64>,
    metrics_addr: Option<String>,
    metrics_unauthenticated: Option<bool>,
    pprof_addr: Option<String>,
}

// Accepted and checked for shape; not used by a single-node build yet.
#[allow(dead_code)]
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileCluster {
    node_id: Option<String>,
    addr: Option<String>,
    peers: Option<Vec<serde_json::Value>>,
    advertise_addr: Option<String>,
    initial_members: Option<String>,
    raft_snapshot_threshold: Option<u64>,
    raft_snapshot_interval: Option<String>,
    raft_trailing_logs: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileTopic {
    default_partitions: Option<u32>,
    max_partitions: Option<u32>,
    default_retention_age_ms: Option<u64>,
    default_visibility_timeout_ms: Option<u64>,
    default_max_in_flight_per_partition: Option<u32>,
    default_max_acked_ahead_per_partition: Option<u32>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileFanout {
    max_batch_records: Option<u64>,
    max_batch_bytes: Option<u64>,
    linger_ms: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileLog {
    level: Option<String>,
    format: Option<String>,
}

// Accepted and checked for shape; not used by a single-node build yet.
#[allow(dead_code)]
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileSecurity {
    enabled: Option<bool>,
    cluster_tls_cert_file: Option<String>,
    cluster_tls_key_file: Option<String>,
    cluster_tls_ca_file: Option<String>,
    allow_plaintext_raft: Option<bool>,
    allow_insecure_cluster: Option<bool>,
    allow_legacy_cluster_auth: Option<bool>,
}

/// Storage keys an operator may set; every other `storage.*` key is internal.
const STORAGE_KEYS_PUBLIC: &[&str] = &[
    "data_dir",
    "codec",
    "compression_level",
    "idle_log_eviction_ms",
    "cold_retention_walk_ms",
    "consumer_offset_commit_interval_ms",
    "ingress_wal_prealloc",
];

/// Command-line values that override everything else.
#[derive(Clone, Debug, Default)]
pub struct FlagOverrides {
    pub addr: Option<String>,
    pub port: Option<u16>,
    pub cluster_port: Option<u16>,
    pub node_id: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub log_level: Option<String>,
    pub log_format: Option<String>,
    pub pprof_addr: Option<String>,
}

fn dur(key: &str, v: &str) -> Result<Duration, String> {
    let d = GoDuration::parse(v.as_bytes()).map_err(|e| format!("{key}: {e}"))?;
    if d.nanos < 0 {
        return Err(format!("{key} ({v}) must not be negative"));
    }
    Ok(d.to_std())
}

fn show(d: Duration) -> String {
    GoDuration::from_std(d).to_string()
}

impl Config {
    /// Layers the file (when given), the environment and the flags over the defaults and validates.
    pub fn load(
        file: Option<&std::path::Path>,
        env: &BTreeMap<String, String>,
        flags: &FlagOverrides,
    ) -> Result<Config, String> {
        let mut c = Config::default();
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("config file {}: {e}", path.display()))?;
            c.apply_file(&text)?;
        }
        c.apply_env(env)?;
        c.apply_flags(flags);
        c.validate()?;
        Ok(c)
    }

    fn apply_file(&mut self, text: &str) -> Result<(), String> {
        check_file_shape(text)?;
        let f: FileConfig = serde_json::from_str(text).map_err(|e| file_error(text, &e))?;
        if let Some(h) = f.http {
            let t = &mut self.http;
            if let Some(v) = h.addr {
                t.addr = v;
            }
            for (key, src, dst) in [
                ("http.read_timeout", h.read_timeout, &mut t.read_timeout),
                ("http.write_timeout", h.write_timeout, &mut t.write_timeout),
                ("http.idle_timeout", h.idle_timeout, &mut t.idle_timeout),
                (
                    "http.shutdown_grace",
                    h.shutdown_grace,
                    &mut t.shutdown_grace,
                ),
                (
                    "http.max_consume_wait",
                    h.max_consume_wait,
                    &mut t.max_consume_wait,
                ),
            ] {
                if let Some(v) = src {
                    *dst = dur(key, &v)?;
                }
            }
            for (src, dst) in [
                (h.max_header_bytes, &mut t.max_header_bytes),
                (h.max_connections, &mut t.max_connections),
                (
                    h.max_consume_in_flight_per_identity,
                    &mut t.max_consume_in_flight_per_identity,
                ),
                (
                    h.max_produce_in_flight_per_identity,
                    &mut t.max_produce_in_flight_per_identity,
                ),
                (
                    h.max_batch_body_bytes_in_flight,
                    &mut t.max_batch_body_bytes_in_flight,
                ),
            ] {
                if let Some(v) = src {
                    *dst = v as usize;
                }
            }
            if let Some(v) = h.metrics_addr {
                t.metrics_addr = v;
            }
            if let Some(v) = h.metrics_unauthenticated {
                t.metrics_unauthenticated = v;
            }
            if let Some(v) = h.pprof_addr {
                t.pprof_addr = v;
            }
        }
        if let Some(cl) = f.cluster {
            if let Some(v) = cl.node_id {
                self.node_id = v;
                self.node_id_given = true;
            }
            if let Some(v) = cl.addr {
                self.cluster_addr = v;
            }
            if cl.peers.is_some_and(|p| !p.is_empty()) {
                return Err(
                    "cluster.peers: multi-node clusters are not supported by this build yet".into(),
                );
            }
            if let Some(v) = cl.raft_snapshot_interval {
                self.raft_snapshot_interval = dur("cluster.raft_snapshot_interval", &v)?;
            }
            if let Some(v) = cl.raft_snapshot_threshold {
                self.raft_snapshot_threshold = v;
            }
            if let Some(v) = cl.raft_trailing_logs {
                self.raft_trailing_logs = v;
            }
        }
        if let Some(s) = f.storage {
            for (k, v) in s {
                if !STORAGE_KEYS_PUBLIC.contains(&k.as_str()) {
                    return Err(format!(
                        "storage.{k} is an internal setting and cannot be configured"
                    ));
                }
                let st = &mut self.storage;
                let text = || {
                    v.as_str()
                        .map(String::from)
                        .ok_or_else(|| format!("storage.{k} must be a string"))
                };
                let int = || {
                    v.as_u64()
                        .ok_or_else(|| format!("storage.{k} must be a non-negative integer"))
                };
                match k.as_str() {
                    "data_dir" => self.data_dir = PathBuf::from(text()?),
                    "codec" => st.codec = text()?,
                    "compression_level" => st.compression_level = text()?,
                    "idle_log_eviction_ms" => st.idle_log_eviction_ms = int()?,
                    "cold_retention_walk_ms" => st.cold_retention_walk_ms = int()?,
                    "consumer_offset_commit_interval_ms" => {
                        st.consumer_offset_commit_interval_ms = int()?
                    }
                    "ingress_wal_prealloc" => {
                        st.ingress_wal_prealloc = v
                            .as_bool()
                            .ok_or("storage.ingress_wal_prealloc must be a boolean")?
                    }
                    _ => unreachable!("STORAGE_KEYS_PUBLIC lists {k}"),
                }
            }
        }
        if let Some(t) = f.topic {
            let d = &mut self.topic;
            if let Some(v) = t.default_partitions {
                d.default_partitions = v;
            }
            if let Some(v) = t.max_partitions {
                d.max_partitions = v;
            }
            if let Some(v) = t.default_retention_age_ms {
                d.default_retention_age_ms = v;
            }
            if let Some(v) = t.default_visibility_timeout_ms {
                d.default_visibility_timeout_ms = v;
            }
            if let Some(v) = t.default_max_in_flight_per_partition {
                d.default_max_in_flight_per_partition = v;
            }
            if let Some(v) = t.default_max_acked_ahead_per_partition {
                d.default_max_acked_ahead_per_partition = v;
            }
        }
        if let Some(fo) = f.fanout {
            if let Some(v) = fo.max_batch_records {
                self.fanout.batch_records = usize::try_from(v).unwrap_or(usize::MAX);
            }
            if let Some(v) = fo.max_batch_bytes {
                self.fanout.batch_bytes = usize::try_from(v).unwrap_or(usize::MAX);
            }
            if let Some(v) = fo.linger_ms {
                self.fanout.linger = Duration::from_millis(v);
            }
        }
        if let Some(l) = f.log {
            if let Some(v) = l.level {
                self.log_level = v;
            }
            if let Some(v) = l.format {
                self.log_format = v;
            }
        }
        if let Some(r) = f.remotes {
            let t = &mut self.remotes;
            if let Some(v) = r.allowed_hosts {
                t.allowed_hosts = v;
            }
            if let Some(v) = r.allowed_ports {
                t.allowed_ports = v;
            }
            if let Some(v) = r.allow_addresses {
                t.allow_addresses = v;
            }
            if let Some(v) = r.max_held_bytes {
                t.max_held_bytes = v;
            }
            if let Some(v) = r.api_hop_encrypted {
                t.api_hop_encrypted = v;
            }
        }
        if let Some(s) = f.security {
            if let Some(v) = s.enabled {
                self.security_enabled = v;
            }
            let tls = &mut self.cluster_tls;
            for (src, dst) in [
                (s.cluster_tls_cert_file, &mut tls.cert_file),
                (s.cluster_tls_key_file, &mut tls.key_file),
                (s.cluster_tls_ca_file, &mut tls.ca_file),
            ] {
                if let Some(v) = src {
                    *dst = v;
                }
            }
        }
        Ok(())
    }

    fn apply_env(&mut self, env: &BTreeMap<String, String>) -> Result<(), String> {
        let get = |k: &str| env.get(k).filter(|v| !v.is_empty()).cloned();
        // Read when the root admin is seeded, after the data is open: checked here so that a
        // password no login could use stops the node before it creates anything (API.md §2:
        // passwords are 1-72 bytes; empty means unset, a password is generated).
        if let Some(p) = get(ADMIN_PASSWORD_ENV) {
            if p.len() > PASSWORD_BYTES_MAX {
                return Err(format!(
                    "{} must be 1-{} bytes (it has {})",
                    ADMIN_PASSWORD_ENV,
                    PASSWORD_BYTES_MAX,
                    p.len()
                ));
            }
        }
        let num = |k: &str| -> Result<Option<u64>, String> {
            get(k)
                .map(|v| {
                    v.parse::<u64>()
                        .map_err(|_| format!("{k}: not a non-negative integer: {v}"))
                })
                .transpose()
        };
        // A setting held in 32 bits: a larger value is refused, never wrapped.
        let num32 = |k: &str| -> Result<Option<u32>, String> {
            num(k)?
                .map(|v| {
                    u32::try_from(v).map_err(|_| format!("{k}: {v} is larger than {}", u32::MAX))
                })
                .transpose()
        };
        let boolean = |k: &str| -> Result<Option<bool>, String> {
            get(k)
                .map(|v| match v.to_ascii_lowercase().as_str() {
                    "1" | "true" | "t" | "yes" => Ok(true),
                    "0" | "false" | "f" | "no" => Ok(false),
                    _ => Err(format!("{k}: not a boolean: {v}")),
                })
                .transpose()
        };
        if let Some(v) = get("NARAD_HTTP_ADDR") {
            self.http.addr = v;
        }
        for (key, dst) in [
            ("NARAD_HTTP_READ_TIMEOUT", &mut self.http.read_timeout),
            ("NARAD_HTTP_WRITE_TIMEOUT", &mut self.http.write_timeout),
            ("NARAD_HTTP_IDLE_TIMEOUT", &mut self.http.idle_timeout),
            ("NARAD_HTTP_SHUTDOWN_GRACE", &mut self.http.shutdown_grace),
            (
                "NARAD_HTTP_MAX_CONSUME_WAIT",
                &mut self.http.max_consume_wait,
            ),
        ] {
            if let Some(v) = get(key) {
                *dst = dur(key, &v)?;
            }
        }
        for (key, dst) in [
            (
                "NARAD_HTTP_MAX_HEADER_BYTES",
                &mut self.http.max_header_bytes,
            ),
            ("NARAD_HTTP_MAX_CONNECTIONS", &mut self.http.max_connections),
            (
                "NARAD_HTTP_MAX_CONSUME_IN_FLIGHT_PER_IDENTITY",
                &mut self.http.max_consume_in_flight_per_identity,
            ),
            (
                "NARAD_HTTP_MAX_PRODUCE_IN_FLIGHT_PER_IDENTITY",
                &mut self.http.max_produce_in_flight_per_identity,
            ),
            (
                "NARAD_HTTP_MAX_BATCH_BODY_BYTES_IN_FLIGHT",
                &mut self.http.max_batch_body_bytes_in_flight,
            ),
        ] {
            if let Some(v) = num(key)? {
                *dst = v as usize;
            }
        }
        if let Some(v) = get("NARAD_HTTP_METRICS_ADDR") {
            self.http.metrics_addr = v;
        }
        if let Some(v) = boolean("NARAD_HTTP_METRICS_UNAUTHENTICATED")? {
            self.http.metrics_unauthenticated = v;
        }
        if let Some(v) = get("NARAD_HTTP_PPROF_ADDR") {
            self.http.pprof_addr = v;
        }
        if let Some(v) = get("NARAD_NODE_ID") {
            self.node_id = v;
            self.node_id_given = true;
        }
        if let Some(v) = get("NARAD_CLUSTER_ADDR") {
            self.cluster_addr = v;
        }
        if let Some(v) = get("NARAD_CLUSTER_RAFT_SNAPSHOT_INTERVAL") {
            self.raft_snapshot_interval = dur("NARAD_CLUSTER_RAFT_SNAPSHOT_INTERVAL", &v)?;
        }
        if let Some(v) = num("NARAD_CLUSTER_RAFT_SNAPSHOT_THRESHOLD")? {
            self.raft_snapshot_threshold = v;
        }
        if let Some(v) = num("NARAD_CLUSTER_RAFT_TRAILING_LOGS")? {
            self.raft_trailing_logs = v;
        }
        for (key, dst) in [
            (
                "NARAD_CLUSTER_TLS_CERT_FILE",
                &mut self.cluster_tls.cert_file,
            ),
            ("NARAD_CLUSTER_TLS_KEY_FILE", &mut self.cluster_tls.key_file),
            ("NARAD_CLUSTER_TLS_CA_FILE", &mut self.cluster_tls.ca_file),
        ] {
            if let Some(v) = get(key) {
                *dst = v;
            }
        }
        if get("NARAD_CLUSTER_PEERS").is_some() {
            return Err(
                "NARAD_CLUSTER_PEERS: multi-node clusters are not supported by this build yet"
                    .into(),
            );
        }
        if let Some(v) = num("NARAD_FANOUT_MAX_BATCH_RECORDS")? {
            self.fanout.batch_records = usize::try_from(v).unwrap_or(usize::MAX);
        }
        if let Some(v) = num("NARAD_FANOUT_MAX_BATCH_BYTES")? {
            self.fanout.batch_bytes = usize::try_from(v).unwrap_or(usize::MAX);
        }
        if let Some(v) = num("NARAD_FANOUT_LINGER_MS")? {
            self.fanout.linger = Duration::from_millis(v);
        }
        // Checked for shape like their file keys; not used by a single-node build yet.
        for k in [
            "NARAD_SECURITY_ALLOW_PLAINTEXT_RAFT",
            "NARAD_SECURITY_ALLOW_INSECURE_CLUSTER",
            "NARAD_SECURITY_ALLOW_LEGACY_CLUSTER_AUTH",
        ] {
            boolean(k)?;
        }
        if let Some(v) = get("NARAD_DATA_DIR") {
            self.data_dir = PathBuf::from(v);
        }
        let t = &mut self.topic;
        if let Some(v) = num("NARAD_TOPIC_DEFAULT_PARTITIONS")? {
            t.default_partitions = u32::try_from(v).unwrap_or(u32::MAX);
        }
        if let Some(v) = num("NARAD_TOPIC_MAX_PARTITIONS")? {
            t.max_partitions = u32::try_from(v).unwrap_or(u32::MAX);
        }
        if let Some(v) = num("NARAD_TOPIC_DEFAULT_RETENTION_AGE_MS")? {
            t.default_retention_age_ms = v;
        }
        if let Some(v) = num("NARAD_TOPIC_DEFAULT_VISIBILITY_TIMEOUT_MS")? {
            t.default_visibility_timeout_ms = v;
        }
        if let Some(v) = num32("NARAD_TOPIC_DEFAULT_MAX_IN_FLIGHT_PER_PARTITION")? {
            t.default_max_in_flight_per_partition = v;
        }
        if let Some(v) = num32("NARAD_TOPIC_DEFAULT_MAX_ACKED_AHEAD_PER_PARTITION")? {
            t.default_max_acked_ahead_per_partition = v;
        }
        if let Some(v) = get("NARAD_LOG_LEVEL") {
            self.log_level = v;
        }
        if let Some(v) = get("NARAD_LOG_FORMAT") {
            self.log_format = v;
        }
        if let Some(v) = boolean("NARAD_SECURITY_ENABLED")? {
            self.security_enabled = v;
        }
        let list = |k: &str| -> Option<Vec<String>> {
            get(k).map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect()
            })
        };
        if let Some(v) = list("NARAD_REMOTES_ALLOWED_HOSTS") {
            self.remotes.allowed_hosts = v;
        }
        if let Some(v) = list("NARAD_REMOTES_ALLOWED_PORTS") {
            self.remotes.allowed_ports = v
                .iter()
                .map(|p| {
                    p.parse::<u16>()
                        .map_err(|_| format!("NARAD_REMOTES_ALLOWED_PORTS: not a port number: {p}"))
                })
                .collect::<Result<_, _>>()?;
        }
        if let Some(v) = list("NARAD_REMOTES_ALLOW_ADDRESSES") {
            self.remotes.allow_addresses = v;
        }
        if let Some(v) = num("NARAD_REMOTES_MAX_HELD_BYTES")? {
            self.remotes.max_held_bytes = v;
        }
        if let Some(v) = boolean("NARAD_REMOTES_API_HOP_ENCRYPTED")? {
            self.remotes.api_hop_encrypted = v;
        }
        if let Some(v) = num32("NARAD_SHARDS")? {
            self.shards = v;
        }
        Ok(())
    }

    fn apply_flags(&mut self, f: &FlagOverrides) {
        if let Some(a) = &f.addr {
            self.http.addr = a.clone();
        }
        if let Some(p) = f.port {
            self.http.addr = format!(":{p}");
        }
        if let Some(p) = f.cluster_port {
            self.cluster_addr = format!(":{p}");
        }
        if let Some(v) = &f.node_id {
            self.node_id = v.clone();
            self.node_id_given = true;
        }
        if let Some(v) = &f.data_dir {
            self.data_dir = v.clone();
        }
        if let Some(v) = &f.log_level {
            self.log_level = v.clone();
        }
        if let Some(v) = &f.log_format {
            self.log_format = v.clone();
        }
        if let Some(v) = &f.pprof_addr {
            self.pprof_addr_set(v);
        }
    }

    fn pprof_addr_set(&mut self, v: &str) {
        self.http.pprof_addr = v.to_string();
    }

    fn validate(&self) -> Result<(), String> {
        let h = &self.http;
        if h.max_header_bytes < 4096 {
            return Err(format!(
                "http.max_header_bytes ({}) must be >= 4096",
                h.max_header_bytes
            ));
        }
        if h.max_consume_wait > h.shutdown_grace {
            return Err(format!(
                "http.max_consume_wait ({}) must be <= http.shutdown_grace ({})",
                show(h.max_consume_wait),
                show(h.shutdown_grace)
            ));
        }
        // 0 is "no timeout" in the original (Go); here every connection has bounded reads, so
        // a zero that would close every connection at once is refused instead.
        for (name, d) in [
            ("http.read_timeout", h.read_timeout),
            ("http.idle_timeout", h.idle_timeout),
        ] {
            if d.is_zero() {
                return Err(format!("{name} must be > 0"));
            }
        }
        if h.write_timeout <= h.max_consume_wait {
            return Err(format!(
                "http.write_timeout ({}) must exceed http.max_consume_wait ({})",
                show(h.write_timeout),
                show(h.max_consume_wait)
            ));
        }
        if h.addr == self.cluster_addr {
            return Err(format!(
                "http.addr ({}) must differ from cluster.addr",
                h.addr
            ));
        }
        let api = parse_listen_addr(&h.addr).map_err(|e| format!("http.addr: {e}"))?;
        check_host_port(&self.cluster_addr).map_err(|e| format!("cluster.addr: {e}"))?;
        // The same listener written two ways (`:7942` and `127.0.0.1:7942`); a host name is
        // not looked up here.
        let cluster = match self.cluster_addr.strip_prefix(':') {
            Some(port) => format!("0.0.0.0:{port}").parse().ok(),
            None => self.cluster_addr.parse().ok(),
        };
        if cluster.is_some_and(|c| listeners_overlap(api, c)) {
            return Err(format!(
                "http.addr ({}) must differ from cluster.addr",
                h.addr
            ));
        }
        if !h.metrics_addr.is_empty() {
            let m = parse_listen_addr(&h.metrics_addr)
                .map_err(|e| format!("http.metrics_addr: {e}"))?;
            // Both listeners bind with SO_REUSEPORT: on one port the kernel would share the
            // connections between them, and API requests would randomly get the metrics 404.
            if listeners_overlap(api, m) {
                return Err(format!(
                    "http.metrics_addr ({}) must differ from http.addr ({}): the metrics listener \
                     needs a port of its own",
                    h.metrics_addr, h.addr
                ));
            }
        }
        if !h.pprof_addr.is_empty() {
            parse_listen_addr(&h.pprof_addr).map_err(|e| format!("http.pprof_addr: {e}"))?;
        }
        let fo = &self.fanout;
        if fo.batch_records == 0 {
            return Err("fanout.max_batch_records must be >= 1".into());
        }
        if fo.batch_bytes == 0 {
            return Err("fanout.max_batch_bytes must be >= 1".into());
        }
        if fo.linger > Duration::from_secs(60) {
            return Err(format!(
                "fanout.linger_ms ({}) must be <= 60000",
                fo.linger.as_millis()
            ));
        }
        let t = &self.topic;
        // Raft's apply refuses more partitions than PARTITIONS_HARD_MAX whatever the setting, so a
        // larger setting would promise topics that every create then refuses.
        let hard_max = narad_raft::model::PARTITIONS_HARD_MAX;
        if !(3..=hard_max).contains(&t.max_partitions) {
            return Err(format!(
                "topic.max_partitions ({}) must be between 3 and {hard_max}",
                t.max_partitions
            ));
        }
        if t.default_partitions < 3 || t.default_partitions > t.max_partitions {
            return Err(format!(
                "topic.default_partitions ({}) must be between 3 and topic.max_partitions ({})",
                t.default_partitions, t.max_partitions
            ));
        }
        if t.default_retention_age_ms != 0 && t.default_retention_age_ms < 3_600_000 {
            return Err(format!(
                "topic.default_retention_age_ms ({}) must be 0 (forever) or >= 3600000",
                t.default_retention_age_ms
            ));
        }
        if t.default_visibility_timeout_ms == 0 {
            return Err("topic.default_visibility_timeout_ms must be > 0".into());
        }
        if t.default_retention_age_ms != 0
            && t.default_visibility_timeout_ms > t.default_retention_age_ms
        {
            return Err(format!(
                "topic.default_visibility_timeout_ms ({}) must be <= topic.default_retention_age_ms ({})",
                t.default_visibility_timeout_ms, t.default_retention_age_ms
            ));
        }
        if t.default_max_in_flight_per_partition == 0 {
            return Err("topic.default_max_in_flight_per_partition must be > 0".into());
        }
        if t.default_max_acked_ahead_per_partition == 0 {
            return Err("topic.default_max_acked_ahead_per_partition must be > 0".into());
        }
        if !matches!(self.log_level.as_str(), "debug" | "info" | "warn" | "error") {
            return Err(format!(
                "log.level ({}) must be one of debug, info, warn, error",
                self.log_level
            ));
        }
        if !matches!(self.log_format.as_str(), "json" | "text") {
            return Err(format!(
                "log.format ({}) must be json or text",
                self.log_format
            ));
        }
        if self.node_id.is_empty() {
            return Err("cluster.node_id must not be empty".into());
        }
        if self.raft_snapshot_threshold == 0 {
            return Err("cluster.raft_snapshot_threshold (0) must be >= 1".into());
        }
        if self.raft_snapshot_interval < RAFT_SNAPSHOT_INTERVAL_MIN {
            return Err(format!(
                "cluster.raft_snapshot_interval ({}) must be >= {}",
                show(self.raft_snapshot_interval),
                show(RAFT_SNAPSHOT_INTERVAL_MIN)
            ));
        }
        self.validate_storage()?;
        self.validate_remotes()?;
        let tls = &self.cluster_tls;
        let files = [
            ("security.cluster_tls_cert_file", &tls.cert_file),
            ("security.cluster_tls_key_file", &tls.key_file),
            ("security.cluster_tls_ca_file", &tls.ca_file),
        ];
        let missing: Vec<&str> = files
            .iter()
            .filter(|(_, v)| v.is_empty())
            .map(|(k, _)| *k)
            .collect();
        if !missing.is_empty() && missing.len() < files.len() {
            return Err(format!(
                "security.cluster_tls_cert_file, security.cluster_tls_key_file and security.cluster_tls_ca_file must be set together or not at all (missing: {})",
                missing.join(", ")
            ));
        }
        Ok(())
    }

    fn validate_remotes(&self) -> Result<(), String> {
        let r = &self.remotes;
        if let Some(h) = r.allowed_hosts.iter().find(|h| !is_host_pattern(h)) {
            return Err(format!(
                "remotes.allowed_hosts: {h:?} is neither a host name nor a *.suffix pattern"
            ));
        }
        if r.allowed_ports.contains(&0) {
            return Err("remotes.allowed_ports: 0 is not a port".into());
        }
        if let Some(a) = r.allow_addresses.iter().find(|a| !is_cidr(a)) {
            return Err(format!("remotes.allow_addresses: {a:?} is not a CIDR"));
        }
        if !self.security_enabled && *r != RemotesConfig::default() {
            return Err(
                "remotes.* settings require security.enabled (remote children need authentication)"
                    .into(),
            );
        }
        Ok(())
    }

    fn validate_storage(&self) -> Result<(), String> {
        let st = &self.storage;
        if !matches!(st.codec.as_str(), "none" | "zstd") {
            return Err(format!("storage.codec ({}) must be none or zstd", st.codec));
        }
        if !matches!(
            st.compression_level.as_str(),
            "fastest" | "default" | "better" | "best"
        ) {
            return Err(format!(
                "storage.compression_level ({}) must be one of fastest, default, better, best",
                st.compression_level
            ));
        }
        for (key, v) in [
            ("storage.idle_log_eviction_ms", st.idle_log_eviction_ms),
            ("storage.cold_retention_walk_ms", st.cold_retention_walk_ms),
        ] {
            if v != 0 && v < STORAGE_WALK_MS_MIN {
                return Err(format!(
                    "{key} ({v}) must be 0 (off) or >= {STORAGE_WALK_MS_MIN}"
                ));
            }
        }
        let v = st.consumer_offset_commit_interval_ms;
        if !(OFFSET_COMMIT_INTERVAL_MS_MIN..=OFFSET_COMMIT_INTERVAL_MS_MAX).contains(&v) {
            return Err(format!(
                "storage.consumer_offset_commit_interval_ms ({v}) must be between {OFFSET_COMMIT_INTERVAL_MS_MIN} and {OFFSET_COMMIT_INTERVAL_MS_MAX}"
            ));
        }
        Ok(())
    }

    /// The effective long-poll ceiling: a configured 0 falls back to 30 s.
    pub fn consume_wait_ceiling(&self) -> Duration {
        if self.http.max_consume_wait.is_zero() {
            Duration::from_secs(30)
        } else {
            self.http.max_consume_wait
        }
    }
}

/// Parses `host:port`, `:port` (all interfaces) or `[v6]:port`.
/// Checks the form `[host]:port` without resolving the host (a pod's DNS name may not resolve
/// yet when the node starts): an IP, a bracketed IPv6 address, a DNS name or nothing, then a
/// port 1-65535.
fn check_host_port(s: &str) -> Result<(), String> {
    let bad = |why: &str| format!("{s}: {why} (want host:port or :port)");
    if s.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(());
    }
    let (host, port) = s.rsplit_once(':').ok_or_else(|| bad("missing port"))?;
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => return Err(bad("invalid port")),
    }
    if host.is_empty() || host.parse::<std::net::IpAddr>().is_ok() || is_host_name(host) {
        Ok(())
    } else {
        Err(bad("invalid host"))
    }
}

/// Whether two listening addresses would take the same connections: one port, and one address
/// or a wildcard on either side.
fn listeners_overlap(a: std::net::SocketAddr, b: std::net::SocketAddr) -> bool {
    a.port() == b.port() && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

pub fn parse_listen_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    let full = if let Some(port) = s.strip_prefix(':') {
        format!("0.0.0.0:{port}")
    } else {
        s.to_string()
    };
    if let Ok(a) = full.parse() {
        return Ok(a);
    }
    use std::net::ToSocketAddrs;
    full.to_socket_addrs()
        .map_err(|e| format!("{s}: {e}"))?
        .next()
        .ok_or_else(|| format!("{s}: no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn layers_apply_in_order_file_env_flags() {
        // Proves precedence: defaults < file < environment < flags.
        let dir = std::env::temp_dir().join(format!("narad-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("narad.json");
        std::fs::write(
            &path,
            r#"{"http":{"addr":":9000","max_consume_wait":"5s"},"topic":{"default_partitions":4}}"#,
        )
        .unwrap();
        let c = Config::load(
            Some(&path),
            &env(&[
                ("NARAD_TOPIC_DEFAULT_PARTITIONS", "6"),
                ("NARAD_HTTP_ADDR", ":9100"),
            ]),
            &FlagOverrides {
                port: Some(9200),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(c.http.addr, ":9200");
        assert_eq!(c.http.max_consume_wait, Duration::from_secs(5));
        assert_eq!(c.topic.default_partitions, 6);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn fanout_settings_load_and_are_checked() {
        // Proves OPERATIONS.md §4 `fanout.*`: defaults 4096 / 4 MiB / 25 ms, file then env
        // layering, malformed or out-of-range values refused at start; and the shape-only
        // `NARAD_SECURITY_ALLOW_*` booleans are checked like their file keys.
        let d = Config::default();
        assert_eq!(
            (
                d.fanout.batch_records,
                d.fanout.batch_bytes,
                d.fanout.linger
            ),
            (4096, 4 << 20, Duration::from_millis(25))
        );
        let mut c = Config::default();
        c.apply_file(r#"{"fanout":{"max_batch_records":10,"max_batch_bytes":1000,"linger_ms":0}}"#)
            .unwrap();
        c.apply_env(&env(&[("NARAD_FANOUT_MAX_BATCH_RECORDS", "20")]))
            .unwrap();
        assert_eq!(
            (
                c.fanout.batch_records,
                c.fanout.batch_bytes,
                c.fanout.linger
            ),
            (20, 1000, Duration::ZERO)
        );
        for (k, v) in [
            ("NARAD_FANOUT_MAX_BATCH_RECORDS", "-3"),
            ("NARAD_FANOUT_MAX_BATCH_BYTES", "zz"),
            ("NARAD_FANOUT_LINGER_MS", "1h"),
            ("NARAD_SECURITY_ALLOW_PLAINTEXT_RAFT", "perhaps"),
            // 32-bit settings refuse what does not fit (they wrapped to 1: audit s22 L2).
            (
                "NARAD_TOPIC_DEFAULT_MAX_IN_FLIGHT_PER_PARTITION",
                "4294967297",
            ),
            (
                "NARAD_TOPIC_DEFAULT_MAX_ACKED_AHEAD_PER_PARTITION",
                "4294967296",
            ),
            ("NARAD_SHARDS", "4294967298"),
        ] {
            let e = Config::default().apply_env(&env(&[(k, v)])).unwrap_err();
            assert!(e.starts_with(k), "{k}={v}: {e}");
        }
        let mut c = Config::default();
        c.fanout.batch_records = 0;
        assert_eq!(
            c.validate().unwrap_err(),
            "fanout.max_batch_records must be >= 1"
        );
        let mut c = Config::default();
        c.fanout.linger = Duration::from_secs(61);
        assert!(c.validate().unwrap_err().starts_with("fanout.linger_ms"));
        let mut c = Config::default();
        c.topic.max_partitions = narad_raft::model::PARTITIONS_HARD_MAX + 1;
        assert_eq!(
            c.validate().unwrap_err(),
            "topic.max_partitions (4097) must be between 3 and 4096"
        );
        let mut c = Config::default();
        c.apply_env(&env(&[("NARAD_TOPIC_MAX_PARTITIONS", "4294967299")]))
            .unwrap();
        assert!(c
            .validate()
            .unwrap_err()
            .starts_with("topic.max_partitions (4294967295)"));
        let mut c = Config::default();
        c.http.pprof_addr = "notanaddr".into();
        assert!(c.validate().unwrap_err().starts_with("http.pprof_addr"));
        // A zero read or idle timeout would close every connection at once (audit s21 L4).
        let mut c = Config::default();
        c.http.read_timeout = Duration::ZERO;
        assert_eq!(c.validate().unwrap_err(), "http.read_timeout must be > 0");
        let mut c = Config::default();
        c.http.idle_timeout = Duration::ZERO;
        assert_eq!(c.validate().unwrap_err(), "http.idle_timeout must be > 0");
    }

    #[test]
    fn unknown_and_internal_keys_are_refused() {
        // Proves the strictness rules of OPERATIONS.md §4.1.
        let mut c = Config::default();
        let e = c.apply_file(r#"{"http":{"nope":1}}"#).unwrap_err();
        assert!(e.contains("unknown field `nope`"), "{e}");
        let e = c
            .apply_file(r#"{"storage":{"segment_bytes":1}}"#)
            .unwrap_err();
        assert_eq!(
            e,
            "storage.segment_bytes is an internal setting and cannot be configured"
        );
        let e = c.apply_file(r#"{"http":{"read_timeout":10}}"#).unwrap_err();
        assert!(e.starts_with("config file: http.read_timeout: "), "{e}");
    }

    #[test]
    fn config_file_errors_name_the_setting() {
        // Proves a value of the wrong type or range, or an unknown key, names the dotted setting
        // (OPERATIONS.md §4.1 "a message naming the setting"), on any line, and that syntax
        // errors keep serde's own text.
        let mut c = Config::default();
        for (text, want) in [
            (
                r#"{"http":{"max_connections":"abc"}}"#,
                "http.max_connections: invalid type",
            ),
            (
                r#"{"http":{"max_connections":-5}}"#,
                "http.max_connections: invalid value",
            ),
            (
                "{\n  \"log\": {\n    \"level\": 3\n  }\n}",
                "log.level: invalid type",
            ),
            (r#"{"shards":2}"#, "shards: unknown field `shards`"),
            (
                r#"{"http":{"addr":":1","x":{"y":[1]}}}"#,
                "http.x: unknown field `x`",
            ),
        ] {
            let e = c.apply_file(text).unwrap_err();
            assert!(
                e.starts_with(&format!("config file: {want}")),
                "{text}: {e}"
            );
        }
        let e = c
            .apply_file(r#"{"http":{"max_connections":1,}}"#)
            .unwrap_err();
        assert!(e.starts_with("config file: trailing comma"), "{e}");
    }

    #[test]
    fn json_paths_at_positions() {
        // Proves the member lookup: innermost member holding the byte, array indexes, a key's
        // own bytes (also where the text breaks off after it), None outside any member, and a
        // depth bound.
        let t = br#"{"a":{"b":[{"c":1},{"d":"x\"y"}]},"e":2}"#;
        let at = |needle: &str| {
            let pos = t
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .unwrap();
            json_path_at(t, pos)
        };
        assert_eq!(at("1}").as_deref(), Some("a.b[0].c"));
        assert_eq!(at("y\"").as_deref(), Some("a.b[1].d"));
        assert_eq!(at("\"e\"").as_deref(), Some("e"));
        assert_eq!(at("2}").as_deref(), Some("e"));
        assert_eq!(json_path_at(t, 0), None);
        assert_eq!(json_path_at(br#"{"a":{"b":"#, 8).as_deref(), Some("a.b"));
        assert_eq!(json_path_at(b"[1,2", 1), None);
        assert_eq!(json_path_at(b"[1", 99), None);
        assert_eq!(json_path_at(br#"{"a":[,1]}"#, 7).as_deref(), Some("a"));
        assert_eq!(json_path_at(br#"[{"x":1}]"#, 6).as_deref(), Some("[0].x"));
        let deep = "[".repeat(100);
        assert_eq!(json_path_at(deep.as_bytes(), 50), None);
    }

    #[test]
    fn remotes_settings_load_and_need_security() {
        // Proves OPERATIONS.md §4.2 for `remotes.*`: a config file or environment written for the
        // original loads (file arrays, env comma lists) with security on; any setting off its
        // default without security is a start-up error; malformed hosts, ports and CIDRs are
        // refused naming the setting.
        let load = |json: &str, env: &[(&str, &str)]| {
            let mut c = Config::default();
            let env: BTreeMap<String, String> = env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            c.apply_file(json)
                .and_then(|()| c.apply_env(&env))
                .and_then(|()| c.validate())
                .map(|()| c.remotes)
        };
        let r = load(
            r#"{"remotes":{"allowed_hosts":["b.example.com","*.corp.example"],"allowed_ports":[443,8443],"allow_addresses":["10.0.0.0/8","fd00::/8"],"max_held_bytes":1048576,"api_hop_encrypted":true}}"#,
            &[],
        )
        .expect("a spec config loads");
        assert_eq!(r.allowed_hosts, ["b.example.com", "*.corp.example"]);
        assert_eq!(r.allowed_ports, [443, 8443]);
        assert_eq!(r.allow_addresses, ["10.0.0.0/8", "fd00::/8"]);
        assert_eq!((r.max_held_bytes, r.api_hop_encrypted), (1_048_576, true));
        let r = load(
            "{}",
            &[
                ("NARAD_REMOTES_ALLOWED_HOSTS", "a.com, *.b.org"),
                ("NARAD_REMOTES_ALLOWED_PORTS", "443,9443"),
                ("NARAD_REMOTES_MAX_HELD_BYTES", "5"),
            ],
        )
        .expect("env form");
        assert_eq!(r.allowed_hosts, ["a.com", "*.b.org"]);
        assert_eq!(
            (r.allowed_ports.as_slice(), r.max_held_bytes),
            (&[443, 9443][..], 5)
        );
        assert_eq!(load("{}", &[]), Ok(RemotesConfig::default()));
        for (json, env, want) in [
            (
                r#"{"security":{"enabled":false},"remotes":{"allowed_hosts":["a.com"]}}"#,
                vec![],
                "remotes.* settings require security.enabled",
            ),
            (
                "{}",
                vec![
                    ("NARAD_SECURITY_ENABLED", "false"),
                    ("NARAD_REMOTES_MAX_HELD_BYTES", "5"),
                ],
                "remotes.* settings require security.enabled",
            ),
            (
                r#"{"remotes":{"allowed_hosts":["a b"]}}"#,
                vec![],
                "remotes.allowed_hosts",
            ),
            (
                r#"{"remotes":{"allowed_ports":[0]}}"#,
                vec![],
                "remotes.allowed_ports",
            ),
            (
                r#"{"remotes":{"allowed_ports":[70000]}}"#,
                vec![],
                "config file",
            ),
            (
                r#"{"remotes":{"allow_addresses":["10.0.0.0/33"]}}"#,
                vec![],
                "remotes.allow_addresses",
            ),
            (
                r#"{"remotes":{"bogus":1}}"#,
                vec![],
                "unknown field `bogus`",
            ),
            (
                "{}",
                vec![("NARAD_REMOTES_ALLOWED_PORTS", "https")],
                "NARAD_REMOTES_ALLOWED_PORTS",
            ),
        ] {
            let e = load(json, &env).expect_err(json);
            assert!(e.contains(want), "{json} {env:?}: {e}");
        }
    }

    #[test]
    fn cluster_addr_and_admin_password_are_checked_before_data_opens() {
        // Proves that `cluster.addr` must be `[host]:port` (IP, bracketed IPv6, DNS name or
        // nothing; port 1-65535; the host is not resolved) and that a NARAD_ADMIN_PASSWORD
        // longer than a login accepts (72 bytes) stops `load`, which runs before the data
        // directory is opened; 72 bytes and an empty value (unset) pass.
        let load = |pairs: &[(&str, &str)]| {
            let mut c = Config::default();
            c.apply_env(&env(pairs)).and_then(|()| c.validate())
        };
        for ok in [
            ":7943",
            "127.0.0.1:7943",
            "[::1]:7943",
            "narad-0.narad-headless.ns.svc:7943",
            "localhost:1",
        ] {
            assert_eq!(load(&[("NARAD_CLUSTER_ADDR", ok)]), Ok(()), "{ok}");
        }
        for bad in [
            "garbage",
            ":0",
            ":70000",
            "a b:7943",
            "host:",
            "1.2.3.4:x",
            "-:",
        ] {
            let e = load(&[("NARAD_CLUSTER_ADDR", bad)]).expect_err(bad);
            assert!(e.starts_with("cluster.addr: "), "{bad}: {e}");
        }
        let long = "x".repeat(73);
        let e = load(&[("NARAD_ADMIN_PASSWORD", &long)]).unwrap_err();
        assert_eq!(e, "NARAD_ADMIN_PASSWORD must be 1-72 bytes (it has 73)");
        assert_eq!(load(&[("NARAD_ADMIN_PASSWORD", &long[..72])]), Ok(()));
        assert_eq!(load(&[("NARAD_ADMIN_PASSWORD", "")]), Ok(()));
    }

    #[test]
    fn storage_cluster_and_tls_settings_are_validated() {
        // Proves the ranges and enums of OPERATIONS.md §4.2 for the storage, Raft snapshot and
        // Raft mTLS settings: each bad value (file or environment) is refused with a message
        // naming the setting, and the boundary values are accepted.
        let file = |json: &str| {
            let mut c = Config::default();
            c.apply_file(json).and_then(|()| c.validate())
        };
        for (json, want) in [
            (
                r#"{"storage":{"idle_log_eviction_ms":5}}"#,
                "storage.idle_log_eviction_ms (5) must be 0 (off) or >= 60000",
            ),
            (
                r#"{"storage":{"idle_log_eviction_ms":59999}}"#,
                "storage.idle_log_eviction_ms (59999) must be 0 (off) or >= 60000",
            ),
            (
                r#"{"storage":{"cold_retention_walk_ms":5}}"#,
                "storage.cold_retention_walk_ms (5) must be 0 (off) or >= 60000",
            ),
            (
                r#"{"storage":{"consumer_offset_commit_interval_ms":9}}"#,
                "storage.consumer_offset_commit_interval_ms (9) must be between 10 and 60000",
            ),
            (
                r#"{"storage":{"consumer_offset_commit_interval_ms":60001}}"#,
                "storage.consumer_offset_commit_interval_ms (60001) must be between 10 and 60000",
            ),
            (
                r#"{"storage":{"consumer_offset_commit_interval_ms":-1}}"#,
                "storage.consumer_offset_commit_interval_ms must be a non-negative integer",
            ),
            (
                r#"{"storage":{"codec":"lz4"}}"#,
                "storage.codec (lz4) must be none or zstd",
            ),
            (
                r#"{"storage":{"codec":1}}"#,
                "storage.codec must be a string",
            ),
            (
                r#"{"storage":{"compression_level":"ultra"}}"#,
                "storage.compression_level (ultra) must be one of fastest, default, better, best",
            ),
            (
                r#"{"storage":{"ingress_wal_prealloc":"yes"}}"#,
                "storage.ingress_wal_prealloc must be a boolean",
            ),
            (
                r#"{"cluster":{"raft_snapshot_interval":"1ms"}}"#,
                "cluster.raft_snapshot_interval (1ms) must be >= 5ms",
            ),
            (
                r#"{"cluster":{"raft_snapshot_threshold":0}}"#,
                "cluster.raft_snapshot_threshold (0) must be >= 1",
            ),
            (
                r#"{"security":{"cluster_tls_cert_file":"/x"}}"#,
                "security.cluster_tls_cert_file, security.cluster_tls_key_file and security.cluster_tls_ca_file must be set together or not at all (missing: security.cluster_tls_key_file, security.cluster_tls_ca_file)",
            ),
        ] {
            assert_eq!(file(json), Err(want.to_string()), "{json}");
        }
        for json in [
            r#"{"storage":{"idle_log_eviction_ms":0,"cold_retention_walk_ms":0}}"#,
            r#"{"storage":{"idle_log_eviction_ms":60000,"cold_retention_walk_ms":60000}}"#,
            r#"{"storage":{"consumer_offset_commit_interval_ms":10}}"#,
            r#"{"storage":{"consumer_offset_commit_interval_ms":60000}}"#,
            r#"{"storage":{"codec":"zstd","compression_level":"best","ingress_wal_prealloc":true}}"#,
            r#"{"storage":{"compression_level":"default"}}"#,
            r#"{"storage":{"compression_level":"better"}}"#,
            r#"{"cluster":{"raft_snapshot_interval":"5ms"}}"#,
            r#"{"cluster":{"raft_snapshot_threshold":5,"raft_trailing_logs":0}}"#,
            r#"{"security":{"cluster_tls_cert_file":"/c","cluster_tls_key_file":"/k","cluster_tls_ca_file":"/a"}}"#,
        ] {
            assert_eq!(file(json), Ok(()), "{json}");
        }
        let c = Config::default();
        assert_eq!(
            (c.raft_snapshot_threshold, c.raft_trailing_logs),
            (8192, 10_240)
        );
        assert_eq!(
            (
                c.storage.codec.as_str(),
                c.storage.compression_level.as_str()
            ),
            ("none", "fastest")
        );
        assert_eq!(c.validate(), Ok(()));

        // The environment forms are layered, then validated the same way.
        let e = Config::load(
            None,
            &env(&[("NARAD_CLUSTER_RAFT_SNAPSHOT_INTERVAL", "4ms")]),
            &Default::default(),
        )
        .unwrap_err();
        assert_eq!(e, "cluster.raft_snapshot_interval (4ms) must be >= 5ms");
        let c = Config::load(
            None,
            &env(&[
                ("NARAD_CLUSTER_RAFT_SNAPSHOT_THRESHOLD", "3"),
                ("NARAD_CLUSTER_RAFT_TRAILING_LOGS", "7"),
            ]),
            &Default::default(),
        )
        .unwrap();
        assert_eq!((c.raft_snapshot_threshold, c.raft_trailing_logs), (3, 7));
        let e = Config::load(
            None,
            &env(&[
                ("NARAD_CLUSTER_TLS_CERT_FILE", "/c"),
                ("NARAD_CLUSTER_TLS_CA_FILE", "/a"),
            ]),
            &Default::default(),
        )
        .unwrap_err();
        assert!(
            e.ends_with("(missing: security.cluster_tls_key_file)"),
            "{e}"
        );
    }

    #[test]
    fn validation_names_the_setting() {
        // Proves cross-field validation produces the documented message.
        let e = Config::load(
            None,
            &env(&[("NARAD_HTTP_MAX_CONSUME_WAIT", "20s")]),
            &Default::default(),
        )
        .unwrap_err();
        assert_eq!(
            e,
            "http.max_consume_wait (20s) must be <= http.shutdown_grace (10s)"
        );
    }

    #[test]
    fn metrics_listener_needs_a_port_of_its_own() {
        // Proves a metrics address that would share the API's connections stops the start, and
        // that another port (or another address on the same port) is fine.
        let load = |api: &str, metrics: &str| {
            Config::load(
                None,
                &env(&[
                    ("NARAD_HTTP_ADDR", api),
                    ("NARAD_HTTP_METRICS_ADDR", metrics),
                ]),
                &Default::default(),
            )
        };
        for (api, metrics) in [
            ("127.0.0.1:18394", "127.0.0.1:18394"),
            (":18394", "127.0.0.1:18394"),
            ("127.0.0.1:18394", ":18394"),
        ] {
            let e = load(api, metrics).unwrap_err();
            assert!(
                e.starts_with("http.metrics_addr (") && e.contains("must differ from http.addr"),
                "{api} / {metrics}: {e}"
            );
        }
        assert!(load("127.0.0.1:18394", "127.0.0.1:18395").is_ok());
        assert!(load("127.0.0.1:18394", "127.0.0.2:18394").is_ok());
        // The cluster listener likewise, however the address is written.
        let e = Config::load(
            None,
            &env(&[
                ("NARAD_HTTP_ADDR", "127.0.0.1:18321"),
                ("NARAD_CLUSTER_ADDR", ":18321"),
            ]),
            &Default::default(),
        )
        .unwrap_err();
        assert_eq!(
            e,
            "http.addr (127.0.0.1:18321) must differ from cluster.addr"
        );
    }
}
