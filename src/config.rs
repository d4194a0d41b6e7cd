//! Node configuration: built-in defaults, then a JSON file (`--config`), then `NARAD_*` environment
//! variables, then command-line flags (OPERATIONS.md §4). The layered result is validated as a whole
//! before any data is opened; every problem names the setting.
//!
//! Every setting is declared once, as one entry of the `settings!` table below: its typed field
//! and default, its kind (how a file value, an environment value and a flag become the typed
//! value), its file key, its environment variable and its flags. The typed structs ([`Config`],
//! [`HttpConfig`], ...), [`FlagOverrides`] and the table that the file, environment and flag
//! readers walk are generated from those entries, so a setting cannot be readable one way and
//! not another, and the known keys of a file section are the keys its entries declare. The checks
//! of the layered result (`Config::validate`) are written by hand: they compare settings with each
//! other and with limits, and their messages are part of the contract.
//!
//! The configuration is a value handed to whoever needs it: this module keeps no global state,
//! and never touches the network or the data directory.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::{self, DeserializeSeed, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::wire::duration::GoDuration;

/// Declares settings. Each `pub struct` becomes a typed struct whose `Default` holds the declared
/// defaults, and each of its entries a [`Setting`] in `SETTINGS`; the flags named by the entries
/// become [`FlagOverrides`]. An entry is
///
/// ```text
/// [pub field: Type = default] => KIND [, file "section.key"] [, env "NARAD_..."]
///     [, flags(flag: FlagType, ...)] [, to path.in.config] [, then hook];
/// ```
///
/// - `pub field: Type = default`: the typed field the setting is stored in, and its default.
///   Without it the entry is only a name: the setting is read and checked but not kept, or kept
///   `to` a field of a type declared elsewhere (which owns the default). Such an entry takes
///   `//` comments only (there is no field for a `///` comment to document).
/// - `KIND`: a [`Kind`] of module [`kind`], saying how each form of the value is parsed.
/// - `file`: the config-file key; `env`: the environment variable; `flags`: the fields of
///   [`FlagOverrides`] that set it (in order: the last one given wins).
/// - `then hook`: a function run on the config after the setting is stored.
///
/// `pub struct S in field` says which field of [`Config`] holds the struct; `with { ... }` after
/// the entries declares fields that are not settings.
macro_rules! settings {
    ($(
        $(#[$attr:meta])*
        pub struct $S:ident $(in $path:ident)? {
            $(
                $(#[$fattr:meta])*
                $fvis:vis $field:ident $(: $fty:ty = $default:expr)?
                    => $kind:ident
                    $(, file $key:literal)?
                    $(, env $env:expr)?
                    $(, flags($($flag:ident: $flagty:ty),+))?
                    $(, to $($to:ident).+)?
                    $(, then $hook:path)?;
            )*
        }
        $(with {
            $($(#[$pattr:meta])* $pvis:vis $pfield:ident: $pty:ty = $pdefault:expr;)*
        })?
    )*) => {
        $(
            $(#[$attr])*
            pub struct $S {
                $($(#[$fattr])* $($fvis $field: $fty,)?)*
                $($($(#[$pattr])* $pvis $pfield: $pty,)*)?
            }

            impl Default for $S {
                fn default() -> $S {
                    $S {
                        $($($field: $default,)?)*
                        $($($pfield: $pdefault,)*)?
                    }
                }
            }

            impl Within for $S {
                fn within(c: &mut Config) -> &mut $S {
                    within!(c $(, $path)?)
                }
            }
        )*

        /// Command-line values that override everything else.
        #[derive(Clone, Debug, Default)]
        pub struct FlagOverrides {
            $($($($(pub $flag: Option<$flagty>,)+)?)*)*
        }

        /// Every setting, in the order the readers apply them (the file section by section, in
        /// [`SECTIONS`] order).
        static SETTINGS: &[Setting] = &[$($(
            Setting {
                key: optional!($($key)?),
                env: optional!($($env)?),
                json: kind::$kind.json,
                apply: |c, from| {
                    let v = match from {
                        Source::File(key, json) => (kind::$kind.file)(key, json)?,
                        Source::Env(var, text) => (kind::$kind.env)(var, text)?,
                        Source::Flags(_flags) => {
                            #[allow(unused_mut)]
                            let mut given = none_of(&kind::$kind);
                            $($(
                                if let Some(flag) = &_flags.$flag {
                                    given = Some(FlagArg::setting(flag));
                                }
                            )+)?
                            match given {
                                Some(v) => v,
                                None => return Ok(()),
                            }
                        }
                    };
                    store!(c, v, $S, $field, [$($fty)?], [$($($to).+)?]);
                    $($hook(c);)?
                    Ok(())
                },
                #[cfg(test)]
                kept: kept!([$($fty)?], [$($($to).+)?]),
            },
        )*)*];
    };
}

/// `Some` of the argument, or `None` without one.
macro_rules! optional {
    () => {
        None
    };
    ($e:expr) => {
        Some($e)
    };
}

/// The struct of settings at `path` in the config `c`, or `c` itself.
macro_rules! within {
    ($c:ident) => {
        $c
    };
    ($c:ident, $path:ident) => {
        &mut $c.$path
    };
}

/// Stores the value `v` of a setting into its field, its `to` path, or nowhere.
macro_rules! store {
    ($c:ident, $v:ident, $S:ident, $field:ident, [$fty:ty], []) => {
        <$S as Within>::within($c).$field = $v
    };
    ($c:ident, $v:ident, $S:ident, $field:ident, [], [$($to:ident).+]) => {
        $c.$($to).+ = $v
    };
    ($c:ident, $v:ident, $S:ident, $field:ident, [], []) => {
        let _ = ($c, $v);
    };
}

/// Whether a setting is stored (in its field or at its `to` path).
#[cfg(test)]
macro_rules! kept {
    ([$fty:ty], []) => {
        true
    };
    ([], [$($to:ident).+]) => {
        true
    };
    ([], []) => {
        false
    };
}

settings! {
    /// A node's configuration (OPERATIONS.md §4.2), as [`Config::load`] layers and validates it.
    #[derive(Clone, Debug)]
    pub struct Config {
        pub node_id: String = hostname()
            => TEXT, file "cluster.node_id", env "NARAD_NODE_ID", flags(node_id: String),
            then node_id_given;
        pub cluster_addr: String = ":7943".into()
            => TEXT, file "cluster.addr", env "NARAD_CLUSTER_ADDR", flags(cluster_port: u16);
        /// `cluster.peers`: the voters of the metadata group (empty: a node that is its whole
        /// cluster).
        pub peers: Vec<Peer> = Vec::new() => PEERS, file "cluster.peers", env "NARAD_CLUSTER_PEERS";
        /// `cluster.advertise_addr`: where other nodes reach this one's cluster port (default:
        /// its own entry of `cluster.peers`).
        pub advertise_addr: String = String::new()
            => TEXT, file "cluster.advertise_addr", env "NARAD_CLUSTER_ADVERTISE_ADDR";
        /// `cluster.initial_members`: the ids allowed to bootstrap (comma list; empty: every
        /// peer).
        pub initial_members: String = String::new()
            => TEXT, file "cluster.initial_members", env "NARAD_CLUSTER_INITIAL_MEMBERS";
        /// `NARAD_CLUSTER_SECRET` (environment only): what nodes prove to each other.
        pub cluster_secret: SecretText = SecretText::default() => SECRET, env CLUSTER_SECRET_ENV;
        /// `NARAD_CLUSTER_SECRET_PREVIOUS` (environment only): the secret before a rotation,
        /// whose key still opens remote passwords until they are re-encrypted.
        pub cluster_secret_previous: SecretText = SecretText::default()
            => SECRET, env "NARAD_CLUSTER_SECRET_PREVIOUS";
        /// `cluster.raft_snapshot_threshold`: the metadata group snapshots after this many entries.
        pub raft_snapshot_threshold: u64 = 8192
            => U64, file "cluster.raft_snapshot_threshold",
            env "NARAD_CLUSTER_RAFT_SNAPSHOT_THRESHOLD";
        /// `cluster.raft_snapshot_interval`: validated, not used by a single-node build yet.
        pub raft_snapshot_interval: Duration = Duration::from_secs(120)
            => DURATION, file "cluster.raft_snapshot_interval",
            env "NARAD_CLUSTER_RAFT_SNAPSHOT_INTERVAL";
        /// `cluster.raft_trailing_logs`: metadata log entries kept behind a snapshot.
        pub raft_trailing_logs: u64 = 10_240
            => U64, file "cluster.raft_trailing_logs", env "NARAD_CLUSTER_RAFT_TRAILING_LOGS";
        pub data_dir: PathBuf = PathBuf::from("data")
            => PATH, file "storage.data_dir", env "NARAD_DATA_DIR", flags(data_dir: PathBuf);
        // The fan-out copy slab and its linger, kept in the shard crate's `FanoutLimits`, whose
        // `Default` holds their defaults (4096 records, 4 MiB, 25 ms).
        fanout_max_batch_records => USIZE, file "fanout.max_batch_records",
            env "NARAD_FANOUT_MAX_BATCH_RECORDS", to fanout.batch_records;
        fanout_max_batch_bytes => USIZE, file "fanout.max_batch_bytes",
            env "NARAD_FANOUT_MAX_BATCH_BYTES", to fanout.batch_bytes;
        fanout_linger_ms => MILLIS, file "fanout.linger_ms",
            env "NARAD_FANOUT_LINGER_MS", to fanout.linger;
        pub log_level: String = "info".into()
            => TEXT, file "log.level", env "NARAD_LOG_LEVEL", flags(log_level: String);
        pub log_format: String = "json".into()
            => TEXT, file "log.format", env "NARAD_LOG_FORMAT", flags(log_format: String);
        pub security_enabled: bool = true
            => BOOL, file "security.enabled", env "NARAD_SECURITY_ENABLED";
        // The root admin's first password, read when the root admin is seeded (after the data is
        // open): checked here so that a password no login could use stops the node before it
        // creates anything. Environment only, like every secret.
        admin_password => PASSWORD, env ADMIN_PASSWORD_ENV;
        /// Shards (executors) on this node; 0 = one per CPU. Fixed when the data directory is
        /// created.
        pub shards: u32 = 0 => U32, env "NARAD_SHARDS";
    }
    with {
        pub http: HttpConfig = HttpConfig::default();
        /// Whether `node_id` was given (file, env or flag) rather than taken from the host name.
        pub node_id_given: bool = false;
        pub storage: StorageConfig = StorageConfig::default();
        pub topic: TopicDefaults = TopicDefaults::default();
        pub cluster_tls: ClusterTls = ClusterTls::default();
        pub remotes: RemotesConfig = RemotesConfig::default();
        /// `fanout.*`: the copy slab and its linger.
        pub fanout: narad_shard::fanout::FanoutLimits = Default::default();
        pub dev: bool = false;
    }

    /// The `http.*` settings: the API listener, its timeouts and its limits.
    #[derive(Clone, Debug)]
    pub struct HttpConfig in http {
        pub addr: String = ":7942".into()
            => TEXT, file "http.addr", env "NARAD_HTTP_ADDR", flags(addr: String, port: u16);
        pub read_timeout: Duration = Duration::from_secs(10)
            => DURATION, file "http.read_timeout", env "NARAD_HTTP_READ_TIMEOUT";
        pub write_timeout: Duration = Duration::from_secs(30)
            => DURATION, file "http.write_timeout", env "NARAD_HTTP_WRITE_TIMEOUT";
        pub idle_timeout: Duration = Duration::from_secs(60)
            => DURATION, file "http.idle_timeout", env "NARAD_HTTP_IDLE_TIMEOUT";
        pub shutdown_grace: Duration = Duration::from_secs(10)
            => DURATION, file "http.shutdown_grace", env "NARAD_HTTP_SHUTDOWN_GRACE";
        pub max_consume_wait: Duration = Duration::from_secs(10)
            => DURATION, file "http.max_consume_wait", env "NARAD_HTTP_MAX_CONSUME_WAIT";
        pub max_header_bytes: usize = 65536
            => USIZE, file "http.max_header_bytes", env "NARAD_HTTP_MAX_HEADER_BYTES";
        pub max_connections: usize = 4096
            => USIZE, file "http.max_connections", env "NARAD_HTTP_MAX_CONNECTIONS";
        pub max_consume_in_flight_per_identity: usize = 1024
            => USIZE, file "http.max_consume_in_flight_per_identity",
            env "NARAD_HTTP_MAX_CONSUME_IN_FLIGHT_PER_IDENTITY";
        pub max_produce_in_flight_per_identity: usize = 0
            => USIZE, file "http.max_produce_in_flight_per_identity",
            env "NARAD_HTTP_MAX_PRODUCE_IN_FLIGHT_PER_IDENTITY";
        pub max_batch_body_bytes_in_flight: usize = 256 << 20
            => USIZE, file "http.max_batch_body_bytes_in_flight",
            env "NARAD_HTTP_MAX_BATCH_BODY_BYTES_IN_FLIGHT";
        pub metrics_addr: String = String::new()
            => TEXT, file "http.metrics_addr", env "NARAD_HTTP_METRICS_ADDR";
        pub metrics_unauthenticated: bool = false
            => BOOL, file "http.metrics_unauthenticated", env "NARAD_HTTP_METRICS_UNAUTHENTICATED";
        pub pprof_addr: String = String::new()
            => TEXT, file "http.pprof_addr", env "NARAD_HTTP_PPROF_ADDR",
            flags(pprof_addr: String);
    }

    /// The operator's `storage.*` settings besides `data_dir` (OPERATIONS.md §4.2). Validated and
    /// kept; the storage engine of this build runs with its own fixed policy and reads none of
    /// them yet. File only.
    #[derive(Clone, Debug)]
    pub struct StorageConfig in storage {
        /// `none` or `zstd`.
        pub codec: String = "none".into() => TEXT, file "storage.codec";
        /// `fastest`, `default`, `better` or `best`.
        pub compression_level: String = "fastest".into()
            => TEXT, file "storage.compression_level";
        /// 0 = off, else at least [`STORAGE_WALK_MS_MIN`].
        pub idle_log_eviction_ms: u64 = 1_800_000 => U64, file "storage.idle_log_eviction_ms";
        /// 0 = off, else at least [`STORAGE_WALK_MS_MIN`].
        pub cold_retention_walk_ms: u64 = 300_000 => U64, file "storage.cold_retention_walk_ms";
        /// [`OFFSET_COMMIT_INTERVAL_MS_MIN`]..=[`OFFSET_COMMIT_INTERVAL_MS_MAX`].
        pub consumer_offset_commit_interval_ms: u64 = 1000
            => U64, file "storage.consumer_offset_commit_interval_ms";
        pub ingress_wal_prealloc: bool = false => BOOL, file "storage.ingress_wal_prealloc";
    }

    /// The `topic.*` settings: what a topic created without them gets.
    #[derive(Clone, Debug)]
    pub struct TopicDefaults in topic {
        pub default_partitions: u32 = 3
            => U32_SATURATING, file "topic.default_partitions",
            env "NARAD_TOPIC_DEFAULT_PARTITIONS";
        pub max_partitions: u32 = 108
            => U32_SATURATING, file "topic.max_partitions", env "NARAD_TOPIC_MAX_PARTITIONS";
        pub default_retention_age_ms: u64 = 604_800_000
            => U64, file "topic.default_retention_age_ms",
            env "NARAD_TOPIC_DEFAULT_RETENTION_AGE_MS";
        pub default_visibility_timeout_ms: u64 = 30_000
            => U64, file "topic.default_visibility_timeout_ms",
            env "NARAD_TOPIC_DEFAULT_VISIBILITY_TIMEOUT_MS";
        pub default_max_in_flight_per_partition: u32 = 1024
            => U32, file "topic.default_max_in_flight_per_partition",
            env "NARAD_TOPIC_DEFAULT_MAX_IN_FLIGHT_PER_PARTITION";
        pub default_max_acked_ahead_per_partition: u32 = 1024
            => U32, file "topic.default_max_acked_ahead_per_partition",
            env "NARAD_TOPIC_DEFAULT_MAX_ACKED_AHEAD_PER_PARTITION";
    }

    /// The Raft mTLS files (`security.cluster_tls_*_file`): all three or none. Validated and
    /// kept; a single-node build has no Raft transport to secure yet.
    #[derive(Clone, Debug)]
    pub struct ClusterTls in cluster_tls {
        pub cert_file: String = String::new()
            => TEXT, file "security.cluster_tls_cert_file", env "NARAD_CLUSTER_TLS_CERT_FILE";
        pub key_file: String = String::new()
            => TEXT, file "security.cluster_tls_key_file", env "NARAD_CLUSTER_TLS_KEY_FILE";
        pub ca_file: String = String::new()
            => TEXT, file "security.cluster_tls_ca_file", env "NARAD_CLUSTER_TLS_CA_FILE";
        /// `security.allow_plaintext_raft`: a secured cluster may talk without TLS.
        pub allow_plaintext_raft: bool = false => BOOL, file "security.allow_plaintext_raft",
            env "NARAD_SECURITY_ALLOW_PLAINTEXT_RAFT";
        /// `security.allow_insecure_cluster`: a cluster may run with security off and no secret.
        pub allow_insecure_cluster: bool = false => BOOL, file "security.allow_insecure_cluster",
            env "NARAD_SECURITY_ALLOW_INSECURE_CLUSTER";
        allow_legacy_cluster_auth => BOOL, file "security.allow_legacy_cluster_auth",
            env "NARAD_SECURITY_ALLOW_LEGACY_CLUSTER_AUTH";
    }

    /// The `remotes.*` settings (OPERATIONS.md §4.2): the registry checks URLs against the
    /// allowed ports and hosts and needs `api_hop_encrypted` for a password; the address guard
    /// and the held-bytes bound belong to shipping (not built yet).
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct RemotesConfig in remotes {
        /// Exact host names or `*.suffix` patterns.
        pub allowed_hosts: Vec<String> = Vec::new()
            => LIST, file "remotes.allowed_hosts", env "NARAD_REMOTES_ALLOWED_HOSTS";
        pub allowed_ports: Vec<u16> = vec![443]
            => PORTS, file "remotes.allowed_ports", env "NARAD_REMOTES_ALLOWED_PORTS";
        /// CIDRs exempt from the address guard.
        pub allow_addresses: Vec<String> = Vec::new()
            => LIST, file "remotes.allow_addresses", env "NARAD_REMOTES_ALLOW_ADDRESSES";
        pub max_held_bytes: u64 = 268_435_456
            => U64, file "remotes.max_held_bytes", env "NARAD_REMOTES_MAX_HELD_BYTES";
        pub api_hop_encrypted: bool = false
            => BOOL, file "remotes.api_hop_encrypted", env "NARAD_REMOTES_API_HOP_ENCRYPTED";
    }
}

/// The config file's top-level keys, in the order their settings are applied. Each is a JSON
/// object (or `null`, meaning absent) of the settings whose keys it prefixes; what it does with
/// other keys is the second member.
const SECTIONS: &[(&str, OtherKeys)] = &[
    ("http", OtherKeys::Unknown),
    ("cluster", OtherKeys::Unknown),
    ("storage", OtherKeys::Internal),
    ("topic", OtherKeys::Unknown),
    ("fanout", OtherKeys::Unknown),
    ("log", OtherKeys::Unknown),
    ("security", OtherKeys::Unknown),
    ("remotes", OtherKeys::Unknown),
];

/// What a config-file section does with a key that no setting declares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OtherKeys {
    /// Refuses it as unknown, while serde reads the file: the error carries the key's position,
    /// and every value is read as its setting's JSON type.
    Unknown,
    /// Names it as an internal setting of the storage engine (fsync mode, segment size...),
    /// after the file is read; the values are checked by their settings' kinds.
    Internal,
}

impl HttpConfig {
    /// API.md §15.3: on the API port `/metrics` takes the API's Basic auth unless
    /// `http.metrics_unauthenticated` is set and no separate listener is configured (the separate
    /// listener itself never asks for credentials). With security off nothing needs credentials.
    pub fn metrics_need_credentials(&self) -> bool {
        !(self.metrics_addr.is_empty() && self.metrics_unauthenticated)
    }
}

/// `cluster.node_id` given in some layer: the node's identity is the operator's choice, not the
/// host name.
fn node_id_given(c: &mut Config) {
    c.node_id_given = true;
}

/// One setting as the readers see it.
struct Setting {
    /// The dotted config-file key (`http.max_consume_wait`); `None`: not in the file.
    key: Option<&'static str>,
    /// The environment variable; `None`: not in the environment.
    env: Option<&'static str>,
    /// The JSON type serde reads the file value as.
    json: Json,
    /// Parses a value from one source and stores it.
    apply: fn(&mut Config, Source<'_>) -> Result<(), String>,
    /// Whether the value is stored, not only checked.
    #[cfg(test)]
    kept: bool,
}

impl Setting {
    /// The file section and the key within it, when the file may hold the setting.
    fn file_key(&self) -> Option<(&'static str, &'static str)> {
        self.key?.split_once('.')
    }
}

/// Where a value being applied comes from.
enum Source<'a> {
    /// A config-file value and its dotted key.
    File(&'a str, &'a serde_json::Value),
    /// A (non-empty) environment value and its variable.
    Env(&'a str, &'a str),
    /// The command line.
    Flags(&'a FlagOverrides),
}

/// Where a struct of settings sits in a [`Config`].
trait Within {
    fn within(c: &mut Config) -> &mut Self;
}

/// How a setting is written in each place, and how it becomes its typed value `T`.
struct Kind<T> {
    /// The JSON type serde reads a file value as, so that a value of another type is refused
    /// with its position in the file.
    json: Json,
    /// The typed value of a file value (the key names it in errors). The values of a section
    /// with [`OtherKeys::Internal`] reach this unread by serde, so it checks the JSON type too.
    file: fn(&str, &serde_json::Value) -> Result<T, String>,
    /// The typed value of an environment variable's (non-empty) value.
    env: fn(&str, &str) -> Result<T, String>,
}

/// `None`, of the kind's value type.
fn none_of<T>(_: &Kind<T>) -> Option<T> {
    None
}

/// The kinds of setting.
mod kind {
    use super::*;

    /// A string, as written.
    pub const TEXT: Kind<String> = Kind {
        json: Json::Text,
        file: json_text,
        env: |_, v| Ok(v.to_string()),
    };
    /// A secret: kept, never printed ([`SecretText`]'s `Debug` hides it).
    pub const SECRET: Kind<SecretText> = Kind {
        json: Json::Text,
        file: |key, v| json_text(key, v).map(SecretText),
        env: |_, v| Ok(SecretText(v.to_string())),
    };
    /// A file system path.
    pub const PATH: Kind<PathBuf> = Kind {
        json: Json::Text,
        file: |key, v| json_text(key, v).map(PathBuf::from),
        env: |_, v| Ok(PathBuf::from(v)),
    };
    /// A duration in Go's syntax (`"10s"`, `"500ms"`; a bare number is refused), not negative.
    pub const DURATION: Kind<Duration> = Kind {
        json: Json::Text,
        file: |key, v| dur(key, &json_text(key, v)?),
        env: dur,
    };
    /// A duration in whole milliseconds.
    pub const MILLIS: Kind<Duration> = Kind {
        json: Json::U64,
        file: |key, v| json_uint(key, v).map(Duration::from_millis),
        env: |var, v| env_uint(var, v).map(Duration::from_millis),
    };
    /// A non-negative 64-bit integer.
    pub const U64: Kind<u64> = Kind {
        json: Json::U64,
        file: json_uint,
        env: env_uint,
    };
    /// A count held in a `usize` (a larger value becomes `usize::MAX`).
    pub const USIZE: Kind<usize> = Kind {
        json: Json::U64,
        file: |key, v| json_uint(key, v).map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        env: |var, v| env_uint(var, v).map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
    };
    /// A 32-bit integer: a larger value is refused, never wrapped.
    pub const U32: Kind<u32> = Kind {
        json: Json::U32,
        file: |key, v| fits_u32(key, json_uint(key, v)?),
        env: |var, v| fits_u32(var, env_uint(var, v)?),
    };
    /// A 32-bit integer whose environment form saturates at `u32::MAX`, leaving the setting's
    /// range check to name the value; the file refuses a larger value as [`U32`] does.
    pub const U32_SATURATING: Kind<u32> = Kind {
        json: Json::U32,
        file: U32.file,
        env: |var, v| env_uint(var, v).map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
    };
    /// A boolean; the environment also takes `1`/`0`, `t`/`f` and `yes`/`no`, in any case.
    pub const BOOL: Kind<bool> = Kind {
        json: Json::Bool,
        file: |key, v| {
            v.as_bool()
                .ok_or_else(|| format!("{key} must be a boolean"))
        },
        env: |var, v| match v.to_ascii_lowercase().as_str() {
            "1" | "true" | "t" | "yes" => Ok(true),
            "0" | "false" | "f" | "no" => Ok(false),
            _ => Err(format!("{var}: not a boolean: {v}")),
        },
    };
    /// Strings: a JSON array in the file, a comma list in the environment.
    pub const LIST: Kind<Vec<String>> = Kind {
        json: Json::Texts,
        file: |key, v| {
            let texts = v
                .as_array()
                .and_then(|a| a.iter().map(|s| s.as_str().map(String::from)).collect());
            texts.ok_or_else(|| format!("{key} must be an array of strings"))
        },
        env: |_, v| Ok(env_list(v)),
    };
    /// Port numbers: a JSON array in the file, a comma list in the environment.
    pub const PORTS: Kind<Vec<u16>> = Kind {
        json: Json::Ports,
        file: |key, v| {
            let port = |p: &serde_json::Value| p.as_u64().and_then(|p| u16::try_from(p).ok());
            let ports = v.as_array().and_then(|a| a.iter().map(port).collect());
            ports.ok_or_else(|| format!("{key} must be an array of port numbers"))
        },
        env: |var, v| {
            let port = |p: &String| {
                p.parse()
                    .map_err(|_| format!("{var}: not a port number: {p}"))
            };
            env_list(v).iter().map(port).collect()
        },
    };
    /// The Raft peer list: `[{"id":..,"addr":..}]` in the file, `id@host:port,...` in the
    /// environment.
    pub const PEERS: Kind<Vec<Peer>> = Kind {
        json: Json::Array,
        file: |key, v| {
            let peer = |p: &serde_json::Value| {
                let id = p.get("id").and_then(|v| v.as_str());
                let addr = p.get("addr").and_then(|v| v.as_str());
                match (id, addr) {
                    (Some(id), Some(addr)) => Peer::new(key, id, addr),
                    _ => Err(format!(
                        "{key}: each peer must be an object with string fields id and addr"
                    )),
                }
            };
            match v.as_array() {
                Some(a) => a.iter().map(peer).collect(),
                None => Err(format!("{key} must be an array")),
            }
        },
        env: |var, v| {
            let peer = |p: &String| match p.split_once('@') {
                Some((id, addr)) => Peer::new(var, id, addr),
                None => Err(format!("{var}: {p:?} is not id@host:port")),
            };
            env_list(v).iter().map(peer).collect()
        },
    };
    /// A password: at most [`PASSWORD_BYTES_MAX`] bytes; checked, not kept.
    pub const PASSWORD: Kind<()> = Kind {
        json: Json::Text,
        file: |key, v| password_fits(key, &json_text(key, v)?),
        env: password_fits,
    };
}

/// The JSON types a setting's file value is read as.
#[derive(Clone, Copy, Debug)]
enum Json {
    Text,
    Bool,
    U32,
    U64,
    Texts,
    Ports,
    Array,
}

/// Reads a value as the JSON type (`null`: absent), with serde's error at the value's position
/// for another type.
impl<'de> DeserializeSeed<'de> for Json {
    type Value = Option<serde_json::Value>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        fn read<'de, T, D>(d: D) -> Result<Option<serde_json::Value>, D::Error>
        where
            T: Deserialize<'de> + Into<serde_json::Value>,
            D: Deserializer<'de>,
        {
            Ok(Option::<T>::deserialize(d)?.map(Into::into))
        }
        match self {
            Json::Text => read::<String, D>(d),
            Json::Bool => read::<bool, D>(d),
            Json::U32 => read::<u32, D>(d),
            Json::U64 => read::<u64, D>(d),
            Json::Texts => read::<Vec<String>, D>(d),
            Json::Ports => read::<Vec<u16>, D>(d),
            Json::Array => read::<Vec<serde_json::Value>, D>(d),
        }
    }
}

fn json_text(key: &str, v: &serde_json::Value) -> Result<String, String> {
    v.as_str()
        .map(String::from)
        .ok_or_else(|| format!("{key} must be a string"))
}

fn json_uint(key: &str, v: &serde_json::Value) -> Result<u64, String> {
    v.as_u64()
        .ok_or_else(|| format!("{key} must be a non-negative integer"))
}

fn env_uint(var: &str, v: &str) -> Result<u64, String> {
    v.parse()
        .map_err(|_| format!("{var}: not a non-negative integer: {v}"))
}

/// A comma list: items trimmed, empty items dropped.
fn env_list(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// `n` as a 32-bit setting: a larger value is refused, never wrapped.
fn fits_u32(name: &str, n: u64) -> Result<u32, String> {
    u32::try_from(n).map_err(|_| format!("{name}: {n} is larger than {}", u32::MAX))
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

/// One voter of `cluster.peers`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub id: String,
    /// Its cluster port, `host:port`.
    pub addr: String,
}

impl Peer {
    fn new(key: &str, id: &str, addr: &str) -> Result<Peer, String> {
        let (id, addr) = (id.trim(), addr.trim());
        if id.is_empty() || id.len() > 255 {
            return Err(format!("{key}: a peer id must be 1-255 bytes"));
        }
        check_host_port(addr).map_err(|e| format!("{key}: peer {id}: {e}"))?;
        Ok(Peer {
            id: id.to_string(),
            addr: addr.to_string(),
        })
    }
}

/// A secret setting's text; `Debug` prints only whether it is set.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretText(pub String);

impl SecretText {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for SecretText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() { "unset" } else { "<set>" })
    }
}

/// A test setting (`NARAD_TEST_*`, environment only) as a number; `None` when unset or not a
/// number. The one reader of those knobs.
pub fn test_knob(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}

/// The cluster secret's environment variable (never a file key, never logged).
pub const CLUSTER_SECRET_ENV: &str = "NARAD_CLUSTER_SECRET";
/// The fewest voters `cluster.peers` may list (CLUSTER.md §7).
pub const PEERS_MIN: usize = 3;

/// API.md §2: passwords are 1-72 bytes (empty means unset: a password is generated).
fn password_fits(name: &str, p: &str) -> Result<(), String> {
    if p.len() > PASSWORD_BYTES_MAX {
        return Err(format!(
            "{name} must be 1-{PASSWORD_BYTES_MAX} bytes (it has {})",
            p.len()
        ));
    }
    Ok(())
}

/// A command-line flag's value as the typed value of the setting it sets.
trait FlagArg<T> {
    fn setting(&self) -> T;
}

impl FlagArg<String> for String {
    fn setting(&self) -> String {
        self.clone()
    }
}

impl FlagArg<PathBuf> for PathBuf {
    fn setting(&self) -> PathBuf {
        self.clone()
    }
}

/// `--port` and `--cluster-port`: the listener on every interface.
impl FlagArg<String> for u16 {
    fn setting(&self) -> String {
        format!(":{self}")
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

/// Refuses a config file whose top level or one of whose sections is not a JSON object, before
/// serde reads it, saying what the file must hold (a section written as an array was once read
/// as a struct's fields in declaration order: `{"log":["debug","text"]}` set `log.level`).
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
        let known = SECTIONS.iter().any(|(name, _)| name == key);
        if known && !(section.is_object() || section.is_null()) {
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

/// The config file as serde read it.
struct FileValues {
    /// Indexed like `SETTINGS`: the file's value of each setting, of its JSON type (`None`:
    /// absent or `null`).
    values: Vec<Option<serde_json::Value>>,
    /// The sections with [`OtherKeys::Internal`], as written.
    unread: Vec<(&'static str, serde_json::Map<String, serde_json::Value>)>,
}

impl<'de> Deserialize<'de> for FileValues {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<FileValues, D::Error> {
        d.deserialize_map(TopLevel)
    }
}

/// Reads the top level of the config file: each key a section, at most once.
struct TopLevel;

impl<'de> Visitor<'de> for TopLevel {
    type Value = FileValues;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<FileValues, A::Error> {
        let mut file = FileValues {
            values: vec![None; SETTINGS.len()],
            unread: Vec::new(),
        };
        let mut seen = Vec::new();
        while let Some(name) = map.next_key::<String>()? {
            let Some(&(section, others)) = SECTIONS.iter().find(|(s, _)| *s == name) else {
                return Err(unknown_key(&name, SECTIONS.iter().map(|(s, _)| *s)));
            };
            if seen.contains(&section) {
                return Err(de::Error::duplicate_field(section));
            }
            seen.push(section);
            match others {
                OtherKeys::Unknown => map.next_value_seed(Section {
                    name: section,
                    values: &mut file.values,
                })?,
                OtherKeys::Internal => {
                    if let Some(keys) = map.next_value()? {
                        file.unread.push((section, keys));
                    }
                }
            }
        }
        Ok(file)
    }
}

/// Reads one section of the config file (`null` is an empty one): each key one of the section's
/// settings, at most once, holding that setting's JSON type or `null`.
struct Section<'a> {
    name: &'static str,
    values: &'a mut [Option<serde_json::Value>],
}

impl<'de> DeserializeSeed<'de> for Section<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for Section<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let section = self.name;
        let settings = || {
            SETTINGS
                .iter()
                .enumerate()
                .filter_map(move |(i, s)| match s.file_key() {
                    Some((sec, key)) if sec == section => Some((i, s, key)),
                    _ => None,
                })
        };
        let mut seen = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            let Some((i, s, name)) = settings().find(|(_, _, name)| *name == key) else {
                return Err(unknown_key(&key, settings().map(|(_, _, name)| name)));
            };
            if seen.contains(&i) {
                return Err(de::Error::duplicate_field(name));
            }
            seen.push(i);
            self.values[i] = map.next_value_seed(s.json)?;
        }
        Ok(())
    }
}

/// serde's error for an unknown key, in the words `#[serde(deny_unknown_fields)]` uses
/// (``unknown field `x`, expected one of `a`, `b`, `c` ``), for keys listed at run time.
fn unknown_key<'k, E: de::Error>(key: &str, known: impl Iterator<Item = &'k str>) -> E {
    let known: Vec<String> = known.map(|k| format!("`{k}`")).collect();
    match known.as_slice() {
        [] => E::custom(format_args!("unknown field `{key}`, there are no fields")),
        [one] => E::custom(format_args!("unknown field `{key}`, expected {one}")),
        [a, b] => E::custom(format_args!("unknown field `{key}`, expected {a} or {b}")),
        all => E::custom(format_args!(
            "unknown field `{key}`, expected one of {}",
            all.join(", ")
        )),
    }
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
        c.apply_flags(flags)?;
        c.validate()?;
        Ok(c)
    }

    /// Applies a config file: serde reads it (refusing unknown keys and values of the wrong JSON
    /// type, naming their path), then the settings are applied section by section.
    fn apply_file(&mut self, text: &str) -> Result<(), String> {
        check_file_shape(text)?;
        let file: FileValues = serde_json::from_str(text).map_err(|e| file_error(text, &e))?;
        for &(section, others) in SECTIONS {
            match others {
                OtherKeys::Unknown => {
                    for (s, v) in SETTINGS.iter().zip(&file.values) {
                        if let (Some(key), Some(v)) = (s.key, v) {
                            if s.file_key().is_some_and(|(sec, _)| sec == section) {
                                (s.apply)(self, Source::File(key, v))?;
                            }
                        }
                    }
                }
                OtherKeys::Internal => {
                    let unread = file.unread.iter().filter(|(sec, _)| *sec == section);
                    for (name, v) in unread.flat_map(|(_, keys)| keys) {
                        let key = format!("{section}.{name}");
                        let Some(s) = SETTINGS.iter().find(|s| s.key == Some(key.as_str())) else {
                            return Err(format!(
                                "{key} is an internal setting and cannot be configured"
                            ));
                        };
                        (s.apply)(self, Source::File(&key, v))?;
                    }
                }
            }
        }
        Ok(())
    }

    fn apply_env(&mut self, env: &BTreeMap<String, String>) -> Result<(), String> {
        for s in SETTINGS {
            let Some(var) = s.env else { continue };
            // An empty value is an unset variable.
            if let Some(v) = env.get(var).filter(|v| !v.is_empty()) {
                (s.apply)(self, Source::Env(var, v))?;
            }
        }
        Ok(())
    }

    fn apply_flags(&mut self, flags: &FlagOverrides) -> Result<(), String> {
        for s in SETTINGS {
            (s.apply)(self, Source::Flags(flags))?;
        }
        Ok(())
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
        self.validate_cluster()?;
        Ok(())
    }

    /// The cluster port's TLS (CLUSTER.md §12), loaded from the three files when they are set
    /// and this node has peers; an error names the file and the problem.
    pub fn cluster_peer_tls(&self) -> Result<Option<narad_io::peer::PeerTls>, String> {
        let t = &self.cluster_tls;
        if self.peers.is_empty() || t.cert_file.is_empty() {
            return Ok(None);
        }
        narad_io::peer::PeerTls::from_files(
            std::path::Path::new(&t.cert_file),
            std::path::Path::new(&t.key_file),
            std::path::Path::new(&t.ca_file),
        )
        .map(Some)
        .map_err(|e| format!("security.cluster_tls_*_file: {e}"))
    }

    /// CLUSTER.md §7 and §12: the peer list's shape, and the refusals of an unsafe cluster.
    fn validate_cluster(&self) -> Result<(), String> {
        if self.peers.is_empty() {
            return Ok(());
        }
        let mut ids: Vec<&str> = self.peers.iter().map(|p| p.id.as_str()).collect();
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("cluster.peers lists {:?} twice", w[0]));
        }
        if self.peers.len() < PEERS_MIN {
            return Err(format!(
                "cluster.peers lists {} voter(s); a cluster needs at least {PEERS_MIN}",
                self.peers.len()
            ));
        }
        if !self.node_id_given {
            return Err("cluster.node_id (NARAD_NODE_ID) must be set when cluster.peers is".into());
        }
        if !ids.contains(&self.node_id.as_str()) && self.advertise_addr.is_empty() {
            return Err(format!(
                "cluster.node_id {:?} is not in cluster.peers ({}): a node that joins needs cluster.advertise_addr (NARAD_CLUSTER_ADVERTISE_ADDR), where the others reach its cluster port",
                self.node_id,
                ids.join(", ")
            ));
        }
        for m in self.initial_member_ids() {
            if !ids.contains(&m) {
                return Err(format!(
                    "cluster.initial_members names {m:?}, which is not in cluster.peers"
                ));
            }
        }
        if self.cluster_secret.is_empty() {
            if self.security_enabled {
                return Err(format!(
                    "{CLUSTER_SECRET_ENV} is required when security is on and cluster.peers is set"
                ));
            }
            if !self.cluster_tls.allow_insecure_cluster {
                return Err(format!(
                    "a cluster with security off and no {CLUSTER_SECRET_ENV} needs security.allow_insecure_cluster"
                ));
            }
        }
        if self.cluster_peer_tls()?.is_some() {
            return Ok(());
        }
        let loopback = self
            .cluster_addr
            .rsplit_once(':')
            .map(|(h, _)| {
                let h = h.trim_start_matches('[').trim_end_matches(']');
                h == "localhost"
                    || h.parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback())
            })
            .unwrap_or(false);
        if self.security_enabled && !self.cluster_tls.allow_plaintext_raft && !loopback {
            return Err("security is on and cluster.peers is set, but the cluster port has no TLS: set security.allow_plaintext_raft (NARAD_SECURITY_ALLOW_PLAINTEXT_RAFT) on a private network, or bind cluster.addr to loopback".into());
        }
        Ok(())
    }

    /// The ids of `cluster.initial_members` (empty: every peer may bootstrap).
    pub fn initial_member_ids(&self) -> Vec<&str> {
        self.initial_members
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect()
    }

    /// Whether this node may bootstrap the metadata group (CLUSTER.md §7).
    pub fn may_bootstrap(&self) -> bool {
        if !self.peers.iter().any(|p| p.id == self.node_id) {
            return false;
        }
        let m = self.initial_member_ids();
        m.is_empty() || m.contains(&self.node_id.as_str())
    }

    /// Where other nodes reach this node's cluster port.
    pub fn advertised_cluster_addr(&self) -> String {
        if !self.advertise_addr.is_empty() {
            return self.advertise_addr.clone();
        }
        if let Some(p) = self.peers.iter().find(|p| p.id == self.node_id) {
            return p.addr.clone();
        }
        match self.cluster_addr.strip_prefix(':') {
            Some(port) => format!("127.0.0.1:{port}"),
            None => self.cluster_addr.clone(),
        }
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

    /// Two different values of the JSON type, each as the file and the environment write it.
    fn samples(json: Json) -> [(&'static str, &'static str); 2] {
        match json {
            Json::Text => [(r#""7s""#, "7s"), (r#""9ms""#, "9ms")],
            Json::Bool => [("true", "true"), ("false", "false")],
            Json::U32 | Json::U64 => [("7", "7"), ("9", "9")],
            Json::Texts => [
                (r#"["a.example"]"#, "a.example"),
                (r#"["b.example","c.example"]"#, " b.example, c.example"),
            ],
            Json::Ports => [("[8443]", "8443"), ("[1,2]", "1,2")],
            Json::Array => [
                (r#"[{"id":"n1","addr":"n1:7943"}]"#, "n1@n1:7943"),
                (r#"[{"id":"n2","addr":"n2:7943"}]"#, "n2@n2:7943"),
            ],
        }
    }

    #[test]
    fn every_setting_is_read_from_the_file_and_from_its_variable() {
        // Proves the readers are derived from the table: every declared setting with a file key
        // is read from the file and every one with a variable from the environment, both into
        // the same typed field (the two configs are equal, and differ from the defaults for some
        // value when the setting is kept); a setting that is only checked is accepted or refused
        // alike by both readers and changes nothing.
        let defaults = format!("{:?}", Config::default());
        for s in SETTINGS {
            let name = format!("{:?} / {:?}", s.key, s.env);
            let mut changed = false;
            for (json, text) in samples(s.json) {
                let by_file = s.file_key().map(|(section, key)| {
                    let mut c = Config::default();
                    let r = c.apply_file(&format!(r#"{{"{section}":{{"{key}":{json}}}}}"#));
                    r.map(|()| format!("{c:?}"))
                });
                let by_env = s.env.map(|var| {
                    let mut c = Config::default();
                    let r = c.apply_env(&env(&[(var, text)]));
                    r.map(|()| format!("{c:?}"))
                });
                if let Some(Err(e)) = &by_file {
                    assert!(e.contains(s.key.unwrap()), "{name}: {e}");
                }
                if let Some(Err(e)) = &by_env {
                    assert!(e.starts_with(s.env.unwrap()), "{name}: {e}");
                }
                let read = match (by_file, by_env) {
                    (Some(f), Some(e)) => {
                        assert_eq!(f.is_ok(), e.is_ok(), "{name}: {json} {f:?} / {text} {e:?}");
                        if let (Ok(f), Ok(e)) = (&f, &e) {
                            assert_eq!(f, e, "{name}: file {json}, environment {text}");
                        }
                        f
                    }
                    (Some(r), None) | (None, Some(r)) => r,
                    (None, None) => panic!("{name}: neither in the file nor in the environment"),
                };
                match read {
                    Ok(c) => changed |= c != defaults,
                    Err(e) => assert!(!s.kept, "{name}: {json} / {text}: {e}"),
                }
            }
            assert_eq!(changed, s.kept, "{name}: read into the config or not");
        }
    }

    #[test]
    fn the_table_declares_each_name_once_and_every_section() {
        // Proves no two settings share a file key or a variable, every variable is a NARAD_ one,
        // every file key is `section.key` with a section of SECTIONS, and every section holds
        // settings (its known keys come from them).
        let keys: Vec<&str> = SETTINGS.iter().filter_map(|s| s.key).collect();
        let vars: Vec<&str> = SETTINGS.iter().filter_map(|s| s.env).collect();
        for names in [&keys, &vars] {
            let mut sorted = names.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), names.len(), "declared twice: {names:?}");
        }
        assert!(vars.iter().all(|v| v.starts_with("NARAD_")), "{vars:?}");
        for s in SETTINGS {
            if let Some(key) = s.key {
                let (section, rest) = s.file_key().expect(key);
                assert!(!rest.contains('.'), "{key}");
                assert!(SECTIONS.iter().any(|(name, _)| *name == section), "{key}");
            }
        }
        for (section, _) in SECTIONS {
            let held = |s: &Setting| s.file_key().is_some_and(|(name, _)| name == *section);
            assert!(SETTINGS.iter().any(held), "{section} declares no setting");
        }
    }

    #[test]
    fn unknown_keys_are_refused_in_serdes_words() {
        // Proves the unknown-key error reads as serde's `deny_unknown_fields` one does, for
        // lists of every length it words differently.
        use serde::de::Error as _;
        let lists: [&'static [&'static str]; 4] = [&[], &["a"], &["a", "b"], &["a", "b", "c"]];
        for known in lists {
            let ours: serde_json::Error = unknown_key("x", known.iter().copied());
            let serde = serde_json::Error::unknown_field("x", known);
            assert_eq!(ours.to_string(), serde.to_string());
        }
    }

    #[test]
    fn every_flag_sets_its_setting() {
        // Proves each command-line flag reaches its setting over the file and the environment,
        // `--port` and `--cluster-port` as the port on every interface, and `--port` over
        // `--addr`.
        let flags = FlagOverrides {
            addr: Some("127.0.0.1:1".into()),
            port: None,
            cluster_port: Some(2),
            node_id: Some("n9".into()),
            data_dir: Some("/d".into()),
            log_level: Some("warn".into()),
            log_format: Some("text".into()),
            pprof_addr: Some("127.0.0.1:3".into()),
        };
        let vars = env(&[("NARAD_HTTP_ADDR", ":4"), ("NARAD_LOG_LEVEL", "error")]);
        let c = Config::load(None, &vars, &flags).unwrap();
        assert_eq!(
            (
                c.http.addr.as_str(),
                c.cluster_addr.as_str(),
                c.node_id.as_str()
            ),
            ("127.0.0.1:1", ":2", "n9")
        );
        assert!(c.node_id_given);
        assert_eq!(c.data_dir, PathBuf::from("/d"));
        assert_eq!(
            (c.log_level.as_str(), c.log_format.as_str()),
            ("warn", "text")
        );
        assert_eq!(c.http.pprof_addr, "127.0.0.1:3");
        let flags = FlagOverrides {
            port: Some(5),
            ..flags
        };
        let c = Config::load(None, &vars, &flags).unwrap();
        assert_eq!(c.http.addr, ":5");
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
    fn cluster_peers_are_parsed_and_unsafe_clusters_refused() {
        // Proves `cluster.peers` reads from the environment (`id@host:port,...`) and the file
        // (`[{"id","addr"}]`), and that CLUSTER.md §7/§12's refusals name what is wrong: fewer
        // than 3 voters, a duplicate, a node id outside the list or not given, a bad address,
        // security on without a secret, security off without the insecure switch, plaintext on a
        // non-loopback port without allow_plaintext_raft. The secret never shows in Debug.
        let peers = "a@127.0.0.1:7001, b@127.0.0.1:7002,c@localhost:7003";
        let build = |env_pairs: &[(&str, &str)]| {
            let mut c = Config::default();
            let mut all: Vec<(&str, &str)> = vec![
                ("NARAD_CLUSTER_PEERS", peers),
                ("NARAD_NODE_ID", "a"),
                ("NARAD_CLUSTER_SECRET", "s3cret"),
                ("NARAD_CLUSTER_ADDR", "127.0.0.1:7001"),
            ];
            for (k, v) in env_pairs {
                all.retain(|(k2, _)| k2 != k);
                all.push((k, v));
            }
            c.apply_env(&env(&all))
                .and_then(|()| c.validate())
                .map(|()| c)
        };
        let c = build(&[]).expect("a valid cluster");
        assert_eq!(c.peers.len(), 3);
        assert_eq!(c.peers[2].addr, "localhost:7003");
        assert!(c.may_bootstrap());
        assert_eq!(c.advertised_cluster_addr(), "127.0.0.1:7001");
        assert!(!format!("{c:?}").contains("s3cret"));
        for (set, want) in [
            (
                ("NARAD_CLUSTER_PEERS", "a@127.0.0.1:7001,b@127.0.0.1:7002"),
                "lists 2 voter(s)",
            ),
            (
                ("NARAD_CLUSTER_PEERS", "a@h:1,a@h:2,c@h:3"),
                "lists \"a\" twice",
            ),
            (
                ("NARAD_CLUSTER_PEERS", "a@h:1,b,c@h:3"),
                "is not id@host:port",
            ),
            (("NARAD_CLUSTER_PEERS", "a@h:1,b@nope,c@h:3"), "peer b"),
            (("NARAD_NODE_ID", "z"), "needs cluster.advertise_addr"),
            (
                ("NARAD_CLUSTER_SECRET", ""),
                "NARAD_CLUSTER_SECRET is required",
            ),
            (
                ("NARAD_CLUSTER_ADDR", "10.0.0.1:7001"),
                "security.allow_plaintext_raft",
            ),
            (("NARAD_CLUSTER_INITIAL_MEMBERS", "a,q"), "names \"q\""),
        ] {
            let e = build(&[set]).expect_err(want);
            assert!(e.contains(want), "{set:?}: {e}");
        }
        let e = build(&[
            ("NARAD_SECURITY_ENABLED", "false"),
            ("NARAD_CLUSTER_SECRET", ""),
        ])
        .expect_err("insecure");
        assert!(e.contains("security.allow_insecure_cluster"), "{e}");
        build(&[
            ("NARAD_SECURITY_ENABLED", "false"),
            ("NARAD_CLUSTER_SECRET", ""),
            ("NARAD_SECURITY_ALLOW_INSECURE_CLUSTER", "true"),
        ])
        .expect("insecure allowed");
        build(&[
            ("NARAD_CLUSTER_ADDR", "10.0.0.1:7001"),
            ("NARAD_SECURITY_ALLOW_PLAINTEXT_RAFT", "1"),
        ])
        .expect("plaintext allowed");
        let c = build(&[("NARAD_CLUSTER_INITIAL_MEMBERS", "b,c")]).expect("joiner");
        assert!(!c.may_bootstrap());
        let mut c = Config::default();
        c.apply_file(r#"{"cluster":{"node_id":"b","peers":[{"id":"a","addr":"h:1"},{"id":"b","addr":"h:2"},{"id":"c","addr":"h:3"}]}}"#)
            .expect("file peers");
        assert_eq!(
            c.peers[1],
            Peer {
                id: "b".into(),
                addr: "h:2".into()
            }
        );
        let mut c = Config::default();
        let e = c
            .apply_file(r#"{"cluster":{"peers":["a@h:1"]}}"#)
            .expect_err("shape");
        assert!(e.contains("must be an object"), "{e}");
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
