//! `narad remote add|set|rm|ls|test|reencrypt` (OPERATIONS.md §1.1, API.md §14, v3.2): the
//! registry of remote clusters that remote children ship to. Owns the limit flags and how they
//! map to the `limits` object. Never takes a remote password from a flag (only a line of stdin:
//! it must not show in a process list or shell history) and never prints one.

use std::io::Read;

use clap::{Args, Subcommand};
use serde_json::{json, Map, Value};

use super::client::{escape, Client};
use super::format::parse_duration_ms;
use super::{call, print_pretty, read_secret_line, CliError};

/// Largest `--ca-file` read (the server takes 64 KiB of PEM).
const CA_FILE_BYTES_MAX: u64 = 64 << 10;

#[derive(Subcommand, Debug)]
pub enum RemoteCommand {
    /// Register a remote (prints it, JSON).
    Add {
        name: String,
        /// `https://host[:port][/path]` of the remote cluster.
        #[arg(long)]
        url: String,
        /// Replicator user on the remote.
        #[arg(long)]
        username: String,
        /// Read the replicator's password from a line of stdin (required).
        #[arg(long = "remote-password-stdin", required = true)]
        remote_password_stdin: bool,
        /// PEM file of the CA certificates to trust for this remote.
        #[arg(long = "ca-file")]
        ca_file: Option<String>,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Change a remote; a new URL, user or CA needs the password again (prints it, JSON).
    Set {
        name: String,
        #[arg(long)]
        url: Option<String>,
        #[arg(long)]
        username: Option<String>,
        /// PEM file of the CA certificates to trust.
        #[arg(long = "ca-file", conflicts_with = "no_ca")]
        ca_file: Option<String>,
        /// Drop the remote's CA (trust the system roots).
        #[arg(long = "no-ca")]
        no_ca: bool,
        /// Read a new password from a line of stdin.
        #[arg(long = "remote-password-stdin")]
        remote_password_stdin: bool,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Delete a remote (--force even while remote children use it).
    Rm {
        name: String,
        #[arg(long)]
        force: bool,
    },
    /// List remotes (JSON); --no-nodes skips asking every node.
    Ls {
        #[arg(long = "no-nodes")]
        no_nodes: bool,
    },
    /// Check that every node can ship to a topic of the remote (JSON).
    Test {
        name: String,
        #[arg(long)]
        topic: String,
        /// Local parent topic for the schema and loop checks.
        #[arg(long)]
        source: Option<String>,
    },
    /// Re-seal every remote password under the current cluster key (JSON).
    Reencrypt,
}

/// Limit flags of `remote add` and `remote set` (absent ones are not sent).
#[derive(Args, Debug)]
pub struct LimitArgs {
    /// Requests in flight per node (1-256, default 16).
    #[arg(long = "max-in-flight")]
    max_in_flight: Option<u32>,
    /// Per request (5s-120s, default 30s).
    #[arg(long = "request-timeout")]
    request_timeout: Option<String>,
    /// Idle connection lifetime (default 30s).
    #[arg(long = "idle-conn-timeout")]
    idle_conn_timeout: Option<String>,
    /// Connection lifetime (default 5m).
    #[arg(long = "conn-max-age")]
    conn_max_age: Option<String>,
    /// Time between health checks (default 60s).
    #[arg(long = "check-interval")]
    check_interval: Option<String>,
    /// none or zstd.
    #[arg(long, value_parser = ["none", "zstd"])]
    compression: Option<String>,
}

impl LimitArgs {
    /// The `limits` object, or None when no limit flag was given.
    fn to_json(&self) -> Result<Option<Value>, CliError> {
        let mut m = Map::new();
        if let Some(n) = self.max_in_flight {
            m.insert("max_in_flight".into(), json!(n));
        }
        for (flag, field, v) in [
            (
                "request-timeout",
                "request_timeout_ms",
                &self.request_timeout,
            ),
            (
                "idle-conn-timeout",
                "idle_conn_timeout_ms",
                &self.idle_conn_timeout,
            ),
            ("conn-max-age", "conn_max_age_ms", &self.conn_max_age),
            ("check-interval", "check_interval_ms", &self.check_interval),
        ] {
            if let Some(v) = v {
                let ms = parse_duration_ms(v, false)
                    .map_err(|e| CliError::Usage(format!("--{flag}: {e}")))?;
                m.insert(field.into(), json!(ms));
            }
        }
        if let Some(c) = &self.compression {
            m.insert("compression".into(), json!(c));
        }
        Ok((!m.is_empty()).then_some(Value::Object(m)))
    }
}

fn read_ca(path: &str) -> Result<String, CliError> {
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(CA_FILE_BYTES_MAX + 1).read_to_string(&mut text))
        .map_err(|e| CliError::Usage(format!("--ca-file {path}: {e}")))?;
    if text.len() as u64 > CA_FILE_BYTES_MAX {
        return Err(CliError::Usage(format!(
            "--ca-file {path}: larger than {CA_FILE_BYTES_MAX} bytes"
        )));
    }
    Ok(text)
}

fn remote_path(name: &str) -> String {
    format!("/v1/remotes/{}", escape(name))
}

pub fn run(client: &mut Client, cmd: RemoteCommand) -> Result<(), CliError> {
    match cmd {
        RemoteCommand::Add {
            name,
            url,
            username,
            remote_password_stdin: _,
            ca_file,
            limits,
        } => {
            let mut body = json!({"name": name, "url": url, "username": username});
            if let Some(l) = limits.to_json()? {
                body["limits"] = l;
            }
            if let Some(f) = ca_file {
                body["ca_pem"] = json!(read_ca(&f)?);
            }
            body["password"] = json!(read_secret_line("--remote-password-stdin")?);
            print_pretty(&call(client, "POST", "/v1/remotes", Some(&body))?)
        }
        RemoteCommand::Set {
            name,
            url,
            username,
            ca_file,
            no_ca,
            remote_password_stdin,
            limits,
        } => {
            let mut body = Map::new();
            if let Some(u) = url {
                body.insert("url".into(), json!(u));
            }
            if let Some(u) = username {
                body.insert("username".into(), json!(u));
            }
            if let Some(f) = ca_file {
                body.insert("ca_pem".into(), json!(read_ca(&f)?));
            }
            if no_ca {
                body.insert("ca_pem".into(), json!(""));
            }
            if let Some(l) = limits.to_json()? {
                body.insert("limits".into(), l);
            }
            if remote_password_stdin {
                body.insert(
                    "password".into(),
                    json!(read_secret_line("--remote-password-stdin")?),
                );
            }
            if body.is_empty() {
                return Err(CliError::Usage(
                    "remote set: nothing to change (give --url, --username, --ca-file, --no-ca, \
                     --remote-password-stdin or a limit flag)"
                        .into(),
                ));
            }
            let body = Value::Object(body);
            print_pretty(&call(client, "PATCH", &remote_path(&name), Some(&body))?)
        }
        RemoteCommand::Rm { name, force } => {
            let mut path = remote_path(&name);
            if force {
                path.push_str("?force=true");
            }
            call(client, "DELETE", &path, None)?;
            eprintln!("deleted remote \"{name}\"");
            Ok(())
        }
        RemoteCommand::Ls { no_nodes } => {
            let path = if no_nodes {
                "/v1/remotes?nodes=false"
            } else {
                "/v1/remotes"
            };
            print_pretty(&call(client, "GET", path, None)?)
        }
        RemoteCommand::Test {
            name,
            topic,
            source,
        } => {
            let mut body = json!({ "topic": topic });
            if let Some(s) = source {
                body["source"] = json!(s);
            }
            let path = format!("{}/test", remote_path(&name));
            print_pretty(&call(client, "POST", &path, Some(&body))?)
        }
        RemoteCommand::Reencrypt => print_pretty(&call(
            client,
            "POST",
            "/v1/cluster/reencrypt-remotes",
            Some(&json!({})),
        )?),
    }
}
