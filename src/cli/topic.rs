//! `narad topic add|ls|info|edit|schema|rm|attach|detach|children` (OPERATIONS.md §1.1, API.md
//! §6 and §9): topic administration over `/v1/topics` and fan-out children. Never caches topics,
//! and `topic rm -f` only skips the question: it never sends `force=true`.

use std::io::{BufRead, Read, Write};
use std::time::Duration;

use clap::Subcommand;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use super::client::{escape, Client, Response};
use super::format::{parse_duration_ms, retention};
use super::{call, json_body, print_pretty, print_value, CliError};

/// Topics per list page requested (the server's maximum).
const LIST_PAGE_LIMIT: u32 = 1000;
/// Pages followed at most by `topic ls` (a million topics; a server that keeps answering the
/// same token is caught separately).
pub(crate) const LIST_PAGES_MAX: usize = 1000;
/// Longest confirmation answer read from stdin.
const CONFIRM_BYTES_MAX: u64 = 1024;
/// Largest schema file read by `--schema @file` (the server's request body limit).
const SCHEMA_FILE_BYTES_MAX: u64 = 1 << 20;

#[derive(Subcommand, Debug)]
pub enum TopicCommand {
    /// Create a topic.
    Add {
        name: String,
        /// Partition count (server default 3; the parent's with --parent).
        #[arg(long)]
        partitions: Option<u32>,
        /// Retention: `1h`, `7d`, ...; `0` or `forever` keeps messages forever.
        #[arg(long)]
        retention: Option<String>,
        /// Lease length of consumed messages, e.g. `30s` (fixed after creation).
        #[arg(long)]
        visibility: Option<String>,
        /// Leased messages per partition at most.
        #[arg(long = "max-in-flight")]
        max_in_flight: Option<u32>,
        /// Out-of-order acks kept per partition at most.
        #[arg(long = "max-acked-ahead")]
        max_acked_ahead: Option<u32>,
        /// JSON Schema for payloads: the JSON text, or @FILE.
        #[arg(long)]
        schema: Option<String>,
        /// Create as a fan-out child of this topic.
        #[arg(long)]
        parent: Option<String>,
        /// With --parent: deliver to this child after a delay, e.g. `10m`.
        #[arg(long, requires = "parent")]
        delay: Option<String>,
    },
    /// List topics: NAME / PARTITIONS / RETENTION / ROLE.
    Ls {
        /// Print the topics as a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Describe a topic with per-partition statistics (JSON).
    Info { name: String },
    /// Change retention, grow the partition count, or register a new schema version.
    Edit {
        name: String,
        /// New retention (`0` or `forever` keeps messages forever).
        #[arg(long)]
        retention: Option<String>,
        /// New partition count (only increases).
        #[arg(long)]
        partitions: Option<u32>,
        /// New JSON Schema: the JSON text, or @FILE.
        #[arg(long)]
        schema: Option<String>,
        /// With --schema: apply only if the current schema version is this one.
        #[arg(long = "schema-base-version", requires = "schema")]
        schema_base_version: Option<u32>,
    },
    /// Print a topic's schema history (JSON), or with --current only the current schema.
    Schema {
        name: String,
        /// Print only the current schema document (exit 1 when the topic has none).
        #[arg(long)]
        current: bool,
    },
    /// Delete a topic and all its data.
    Rm {
        name: String,
        /// Do not ask for confirmation.
        #[arg(short = 'f', long)]
        force: bool,
    },
    /// Attach <child> as a fan-out child of <parent> (prints the parent, JSON).
    Attach {
        parent: String,
        child: String,
        /// Deliver to the child after this delay, e.g. `10m`.
        #[arg(long)]
        delay: Option<String>,
        /// Remote child: the registered remote to ship to.
        #[arg(long)]
        remote: Option<String>,
        /// With --remote: the topic on the remote (default: the parent's name).
        #[arg(long = "remote-topic", requires = "remote")]
        remote_topic: Option<String>,
        /// With --remote: where shipping starts: attach, unconsumed or earliest.
        #[arg(long, requires = "remote")]
        from: Option<String>,
        /// With --remote: ordered streams per parent partition (1-8).
        #[arg(long, requires = "remote")]
        lanes: Option<u32>,
        /// With --remote: run every check and write nothing.
        #[arg(long = "dry-run", requires = "remote")]
        dry_run: bool,
    },
    /// Detach <child> from <parent>; the child keeps its data and becomes standalone.
    Detach {
        parent: String,
        child: String,
        /// Remote child only: delete it even with records not yet shipped.
        #[arg(long)]
        force: bool,
    },
    /// List a parent's children with their lag (JSON).
    Children {
        parent: String,
        /// Add per-parent-partition rows to remote children.
        #[arg(long)]
        partitions: bool,
    },
    /// Pause shipping to a remote child (prints the child, JSON).
    Pause {
        parent: String,
        child: String,
        /// Why (shown to admins).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Resume shipping to a remote child (prints the child, JSON).
    Resume {
        parent: String,
        child: String,
        /// Accept a target topic that was recreated on the remote.
        #[arg(long = "accept-target")]
        accept_target: bool,
    },
    /// Skip the one record a remote child's partition is stuck on (prints the child, JSON).
    Skip {
        parent: String,
        child: String,
        #[arg(long)]
        partition: u32,
        #[arg(long)]
        offset: u64,
    },
    /// Wait until a child's lag is zero or its source is drained; exit 1 on timeout.
    Wait {
        parent: String,
        child: String,
        /// Wait for lag_messages 0 with every partition reporting.
        #[arg(long = "lag-zero", required_unless_present = "source_drained")]
        lag_zero: bool,
        /// Wait for source_drained (remote children only; a local child is a usage error).
        #[arg(long = "source-drained", conflicts_with = "lag_zero")]
        source_drained: bool,
        /// The condition must hold this long, e.g. `10s` (default 0).
        #[arg(long)]
        stable: Option<String>,
        /// Give up after this long (default 10m).
        #[arg(long)]
        timeout: Option<String>,
        /// Time between checks (default 2s).
        #[arg(long)]
        interval: Option<String>,
    },
}

/// `topic wait` defaults.
const WAIT_TIMEOUT_DEFAULT_MS: u64 = 600_000;
const WAIT_INTERVAL_DEFAULT_MS: u64 = 2_000;
/// Shortest `--interval` accepted, so a wait never hammers the server.
const WAIT_INTERVAL_MIN_MS: u64 = 100;

/// Body of `POST /v1/topics` (API.md §6.1).
#[derive(Serialize, Default)]
struct CreateBody {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    partitions: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retention_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    visibility_timeout_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_in_flight_per_partition: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_acked_ahead_per_partition: Option<u32>,
    /// Kept as given (key order and all), not re-encoded.
    #[serde(skip_serializing_if = "Option::is_none")]
    schema: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fanout_delay_ms: Option<u64>,
}

/// Body of `PATCH /v1/topics/{topic}` (API.md §6.4).
#[derive(Serialize, Default)]
struct PatchBody {
    #[serde(skip_serializing_if = "Option::is_none")]
    retention_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    partitions: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    schema: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    schema_base_version: Option<u32>,
}

/// Body of `POST /v1/topics/{parent}/children` (API.md §9.1).
#[derive(Serialize, Default)]
struct AttachBody {
    child: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    delay_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    remote: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    remote_topic: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lanes: Option<u32>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    dry_run: bool,
}

fn topic_path(name: &str) -> String {
    format!("/v1/topics/{}", escape(name))
}

pub fn run(client: &mut Client, cmd: TopicCommand) -> Result<(), CliError> {
    match cmd {
        TopicCommand::Add {
            name,
            partitions,
            retention,
            visibility,
            max_in_flight,
            max_acked_ahead,
            schema,
            parent,
            delay,
        } => {
            let body = CreateBody {
                name,
                partitions,
                retention_ms: retention
                    .map(|r| duration_flag("retention", &r, true))
                    .transpose()?,
                visibility_timeout_ms: visibility
                    .map(|v| duration_flag("visibility", &v, false))
                    .transpose()?,
                max_in_flight_per_partition: max_in_flight,
                max_acked_ahead_per_partition: max_acked_ahead,
                schema: schema.map(|s| schema_flag(&s)).transpose()?,
                parent,
                fanout_delay_ms: delay
                    .map(|d| duration_flag("delay", &d, false))
                    .transpose()?,
            };
            let r = send(client, "POST", "/v1/topics", &body)?;
            print_pretty(&r)
        }
        TopicCommand::Ls { json } => list(client, json),
        TopicCommand::Info { name } => {
            let r = call(client, "GET", &topic_path(&name), None)?;
            print_pretty(&r)
        }
        TopicCommand::Edit {
            name,
            retention,
            partitions,
            schema,
            schema_base_version,
        } => {
            let body = PatchBody {
                retention_ms: retention
                    .map(|r| duration_flag("retention", &r, true))
                    .transpose()?,
                partitions,
                schema: schema.map(|s| schema_flag(&s)).transpose()?,
                schema_base_version,
            };
            if body.retention_ms.is_none() && body.partitions.is_none() && body.schema.is_none() {
                return Err(CliError::Usage(
                    "topic edit: give at least one of --retention, --partitions, --schema".into(),
                ));
            }
            let r = send(client, "PATCH", &topic_path(&name), &body)?;
            print_pretty(&r)
        }
        TopicCommand::Schema { name, current } => {
            let r = call(
                client,
                "GET",
                &format!("{}/schema", topic_path(&name)),
                None,
            )?;
            if !current {
                return print_pretty(&r);
            }
            let v = json_body(&r)?;
            let version = v["version"].as_u64().unwrap_or(0);
            let doc = v["versions"]
                .as_array()
                .and_then(|vs| vs.iter().find(|e| e["version"].as_u64() == Some(version)))
                .map(|e| e["schema"].clone());
            match doc {
                Some(d) if version > 0 => print_value(&d),
                _ => Err(CliError::Failed(format!("topic \"{name}\" has no schema"))),
            }
        }
        TopicCommand::Rm { name, force } => {
            if !force && !confirm(&format!("delete topic \"{name}\" and all its data? [y/N] "))? {
                return Err(CliError::Failed(format!("topic \"{name}\" not deleted")));
            }
            call(client, "DELETE", &topic_path(&name), None)?;
            eprintln!("deleted topic \"{name}\"");
            Ok(())
        }
        TopicCommand::Attach {
            parent,
            child,
            delay,
            remote,
            remote_topic,
            from,
            lanes,
            dry_run,
        } => {
            let body = AttachBody {
                child,
                delay_ms: delay
                    .map(|d| duration_flag("delay", &d, false))
                    .transpose()?,
                remote,
                remote_topic,
                from,
                lanes,
                dry_run,
            };
            let r = send(
                client,
                "POST",
                &format!("{}/children", topic_path(&parent)),
                &body,
            )?;
            print_pretty(&r)
        }
        TopicCommand::Detach {
            parent,
            child,
            force,
        } => {
            let mut path = format!("{}/children/{}", topic_path(&parent), escape(&child));
            if force {
                path.push_str("?force=true");
            }
            call(client, "DELETE", &path, None)?;
            eprintln!("detached \"{child}\" from \"{parent}\"");
            Ok(())
        }
        TopicCommand::Pause {
            parent,
            child,
            reason,
        } => {
            let body = match reason {
                Some(r) => serde_json::json!({ "reason": r }),
                None => serde_json::json!({}),
            };
            let path = format!("{}/children/{}/pause", topic_path(&parent), escape(&child));
            print_pretty(&send(client, "POST", &path, &body)?)
        }
        TopicCommand::Resume {
            parent,
            child,
            accept_target,
        } => {
            let body = serde_json::json!({ "accept_target": accept_target });
            let path = format!("{}/children/{}/resume", topic_path(&parent), escape(&child));
            print_pretty(&send(client, "POST", &path, &body)?)
        }
        TopicCommand::Skip {
            parent,
            child,
            partition,
            offset,
        } => {
            let body = serde_json::json!({ "partition": partition, "offset": offset });
            let path = format!("{}/children/{}/skip", topic_path(&parent), escape(&child));
            print_pretty(&send(client, "POST", &path, &body)?)
        }
        TopicCommand::Wait {
            parent,
            child,
            lag_zero: _,
            source_drained,
            stable,
            timeout,
            interval,
        } => {
            let ms = |flag: &str, v: Option<String>, default: u64| match v {
                Some(v) => duration_flag(flag, &v, false),
                None => Ok(default),
            };
            let stable = Duration::from_millis(ms("stable", stable, 0)?);
            let timeout = Duration::from_millis(ms("timeout", timeout, WAIT_TIMEOUT_DEFAULT_MS)?);
            let interval = Duration::from_millis(
                ms("interval", interval, WAIT_INTERVAL_DEFAULT_MS)?.max(WAIT_INTERVAL_MIN_MS),
            );
            wait_child(
                client,
                &parent,
                &child,
                source_drained,
                stable,
                timeout,
                interval,
            )
        }
        TopicCommand::Children { parent, partitions } => {
            let mut path = format!("{}/children", topic_path(&parent));
            if partitions {
                path.push_str("?partitions=true");
            }
            let r = call(client, "GET", &path, None)?;
            print_pretty(&r)
        }
    }
}

/// Polls the parent's children until `child` meets the condition for `stable`, or `timeout`.
fn wait_child(
    client: &mut Client,
    parent: &str,
    child: &str,
    source_drained: bool,
    stable: Duration,
    timeout: Duration,
    interval: Duration,
) -> Result<(), CliError> {
    let started = std::time::Instant::now();
    let path = format!("{}/children", topic_path(parent));
    let mut held_since: Option<std::time::Instant> = None;
    // Bounded by the timeout: each round sleeps at least WAIT_INTERVAL_MIN_MS.
    loop {
        let v = json_body(&call(client, "GET", &path, None)?)?;
        let entry = v["children"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"].as_str() == Some(child)))
            .ok_or_else(|| {
                CliError::Failed(format!("\"{child}\" is not a child of \"{parent}\""))
            })?;
        // `source_drained` is a remote-only field (API.md §9.2): a local child never reports it,
        // so waiting for it could only end in the timeout.
        if source_drained && entry.get("remote").is_none_or(Value::is_null) {
            return Err(CliError::Usage(format!(
                "--source-drained applies only to remote children, and \"{child}\" is a local \
                 child of \"{parent}\"; use --lag-zero to wait until it caught up"
            )));
        }
        let holds = if source_drained {
            entry["source_drained"].as_bool() == Some(true)
        } else {
            entry["lag_messages"].as_u64() == Some(0)
                && entry["lag_complete"].as_bool() == Some(true)
        };
        if holds {
            let since = *held_since.get_or_insert_with(std::time::Instant::now);
            if since.elapsed() >= stable {
                eprintln!(
                    "\"{child}\": {} after {:.1} s",
                    if source_drained {
                        "source drained"
                    } else {
                        "lag zero"
                    },
                    started.elapsed().as_secs_f64()
                );
                return Ok(());
            }
        } else {
            held_since = None;
        }
        if started.elapsed() >= timeout {
            return Err(CliError::Failed(format!(
                "\"{child}\": timed out after {timeout:?} (lag_messages {}, lag_complete {}, source_drained {})",
                entry["lag_messages"], entry["lag_complete"], entry["source_drained"]
            )));
        }
        std::thread::sleep(interval);
    }
}

fn duration_flag(flag: &str, v: &str, forever_ok: bool) -> Result<u64, CliError> {
    parse_duration_ms(v, forever_ok).map_err(|e| CliError::Usage(format!("--{flag}: {e}")))
}

/// A `--schema` value: JSON text, or `@FILE` holding it. Checked to be JSON here; whether it is a
/// valid schema is the server's call.
fn schema_flag(v: &str) -> Result<Box<RawValue>, CliError> {
    let text = match v.strip_prefix('@') {
        Some(path) => {
            let mut text = String::new();
            std::fs::File::open(path)
                .and_then(|f| f.take(SCHEMA_FILE_BYTES_MAX + 1).read_to_string(&mut text))
                .map_err(|e| CliError::Usage(format!("--schema {path}: {e}")))?;
            if text.len() as u64 > SCHEMA_FILE_BYTES_MAX {
                return Err(CliError::Usage(format!(
                    "--schema {path}: larger than {SCHEMA_FILE_BYTES_MAX} bytes"
                )));
            }
            text
        }
        None => v.to_string(),
    };
    RawValue::from_string(text.trim().to_string())
        .map_err(|e| CliError::Usage(format!("--schema: not JSON: {e}")))
}

/// The response when its status is 2xx, else the server's refusal.
pub(crate) fn ok(r: Response) -> Result<Response, CliError> {
    if (200..300).contains(&r.status) {
        Ok(r)
    } else {
        Err(CliError::refused(&r))
    }
}

fn send<T: Serialize>(
    client: &mut Client,
    method: &str,
    path: &str,
    body: &T,
) -> Result<Response, CliError> {
    let bytes = serde_json::to_vec(body).map_err(|e| CliError::Usage(e.to_string()))?;
    let r = client.request(
        method,
        path,
        Some("application/json"),
        &bytes,
        Duration::ZERO,
    )?;
    super::ok_for(r, method, path)
}

/// Asks on stderr, reads one line from stdin; only `y`/`yes` agree.
fn confirm(question: &str) -> Result<bool, CliError> {
    eprint!("{question}");
    let _ = std::io::stderr().flush();
    let mut line = Vec::new();
    std::io::stdin()
        .lock()
        .take(CONFIRM_BYTES_MAX)
        .read_until(b'\n', &mut line)
        .map_err(|e| CliError::Usage(format!("reading the answer: {e}")))?;
    let answer = String::from_utf8_lossy(&line).trim().to_ascii_lowercase();
    Ok(answer == "y" || answer == "yes")
}

#[derive(Deserialize)]
struct Page {
    topics: Vec<Value>,
    #[serde(default)]
    next_page_token: String,
}

fn list(client: &mut Client, as_json: bool) -> Result<(), CliError> {
    let topics = list_all(client)?;
    print_list(&topics, as_json)
}

/// Every topic, following `next_page_token` (bounded by LIST_PAGES_MAX pages).
pub(crate) fn list_all(client: &mut Client) -> Result<Vec<Value>, CliError> {
    let mut topics = Vec::new();
    let mut token = String::new();
    for _ in 0..LIST_PAGES_MAX {
        let mut path = format!("/v1/topics?limit={LIST_PAGE_LIMIT}");
        if !token.is_empty() {
            path.push_str(&format!("&page_token={}", escape(&token)));
        }
        let r = call(client, "GET", &path, None)?;
        let page: Page = serde_json::from_slice(&r.body).map_err(|e| {
            CliError::Failed(format!("the server answered an invalid topic list: {e}"))
        })?;
        topics.extend(page.topics);
        if page.next_page_token.is_empty() {
            return Ok(topics);
        }
        if page.next_page_token <= token {
            return Err(CliError::Failed(format!(
                "the server repeated page token {:?}",
                page.next_page_token
            )));
        }
        token = page.next_page_token;
    }
    Err(CliError::Failed(format!(
        "more than {LIST_PAGES_MAX} pages of topics; stopped"
    )))
}

fn print_list(topics: &[Value], as_json: bool) -> Result<(), CliError> {
    let mut out = String::new();
    if as_json {
        out = serde_json::to_string_pretty(topics).unwrap_or_default();
        out.push('\n');
    } else {
        let rows: Vec<[String; 4]> = topics
            .iter()
            .map(|t| {
                [
                    t["name"].as_str().unwrap_or("").to_string(),
                    t["partitions"].as_u64().unwrap_or(0).to_string(),
                    retention(t["retention_ms"].as_u64().unwrap_or(0)),
                    t["role"].as_str().unwrap_or("standalone").to_string(),
                ]
            })
            .collect();
        let head = ["NAME", "PARTITIONS", "RETENTION", "ROLE"];
        let mut width = head.map(str::len);
        for r in &rows {
            for (w, c) in width.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        for r in std::iter::once(head.map(str::to_string)).chain(rows) {
            let line = format!(
                "{:<w0$}  {:<w1$}  {:<w2$}  {}",
                r[0],
                r[1],
                r[2],
                r[3],
                w0 = width[0],
                w1 = width[1],
                w2 = width[2]
            );
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(out.as_bytes())
        .and_then(|_| stdout.flush())
        .map_err(|e| CliError::Failed(format!("writing output: {e}")))
}
