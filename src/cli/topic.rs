//! `narad topic add|ls|info|edit|rm` (OPERATIONS.md §1.1, API.md §6): topic administration over
//! `/v1/topics`. Never caches topics and never sends `force=true` on delete.

use std::io::{BufRead, Read, Write};
use std::time::Duration;

use clap::Subcommand;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::client::{escape, Client, Response};
use super::format::{parse_duration_ms, retention};
use super::CliError;

/// Topics per list page requested (the server's maximum).
const LIST_PAGE_LIMIT: u32 = 1000;
/// Pages followed at most by `topic ls` (a million topics; a server that keeps answering the
/// same token is caught separately).
const LIST_PAGES_MAX: usize = 1000;
/// Longest confirmation answer read from stdin.
const CONFIRM_BYTES_MAX: u64 = 1024;

#[derive(Subcommand, Debug)]
pub enum TopicCommand {
    /// Create a topic.
    Add {
        name: String,
        /// Partition count (server default 3).
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
    },
    /// List topics: NAME / PARTITIONS / RETENTION / ROLE.
    Ls {
        /// Print the topics as a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Describe a topic with per-partition statistics (JSON).
    Info { name: String },
    /// Change retention or grow the partition count.
    Edit {
        name: String,
        /// New retention (`0` or `forever` keeps messages forever).
        #[arg(long)]
        retention: Option<String>,
        /// New partition count (only increases).
        #[arg(long)]
        partitions: Option<u32>,
    },
    /// Delete a topic and all its data.
    Rm {
        name: String,
        /// Do not ask for confirmation.
        #[arg(short = 'f', long)]
        force: bool,
    },
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
        } => {
            let mut body = Map::new();
            body.insert("name".into(), json!(name));
            if let Some(p) = partitions {
                body.insert("partitions".into(), json!(p));
            }
            if let Some(r) = retention {
                body.insert(
                    "retention_ms".into(),
                    json!(duration_flag("retention", &r, true)?),
                );
            }
            if let Some(v) = visibility {
                body.insert(
                    "visibility_timeout_ms".into(),
                    json!(duration_flag("visibility", &v, false)?),
                );
            }
            if let Some(n) = max_in_flight {
                body.insert("max_in_flight_per_partition".into(), json!(n));
            }
            if let Some(n) = max_acked_ahead {
                body.insert("max_acked_ahead_per_partition".into(), json!(n));
            }
            let r = send_json(client, "POST", "/v1/topics", &Value::Object(body))?;
            print_pretty(&r)
        }
        TopicCommand::Ls { json } => list(client, json),
        TopicCommand::Info { name } => {
            let r = ok(client.request(
                "GET",
                &format!("/v1/topics/{}", escape(&name)),
                None,
                b"",
                Duration::ZERO,
            )?)?;
            print_pretty(&r)
        }
        TopicCommand::Edit {
            name,
            retention,
            partitions,
        } => {
            let mut body = Map::new();
            if let Some(r) = retention {
                body.insert(
                    "retention_ms".into(),
                    json!(duration_flag("retention", &r, true)?),
                );
            }
            if let Some(p) = partitions {
                body.insert("partitions".into(), json!(p));
            }
            if body.is_empty() {
                return Err(CliError::Usage(
                    "topic edit: give at least one of --retention, --partitions".into(),
                ));
            }
            let r = send_json(
                client,
                "PATCH",
                &format!("/v1/topics/{}", escape(&name)),
                &Value::Object(body),
            )?;
            print_pretty(&r)
        }
        TopicCommand::Rm { name, force } => {
            if !force && !confirm(&format!("delete topic \"{name}\" and all its data? [y/N] "))? {
                return Err(CliError::Failed(format!("topic \"{name}\" not deleted")));
            }
            ok(client.request(
                "DELETE",
                &format!("/v1/topics/{}", escape(&name)),
                None,
                b"",
                Duration::ZERO,
            )?)?;
            eprintln!("deleted topic \"{name}\"");
            Ok(())
        }
    }
}

fn duration_flag(flag: &str, v: &str, forever_ok: bool) -> Result<u64, CliError> {
    parse_duration_ms(v, forever_ok).map_err(|e| CliError::Usage(format!("--{flag}: {e}")))
}

/// The response when its status is 2xx, else the server's refusal.
pub(crate) fn ok(r: Response) -> Result<Response, CliError> {
    if (200..300).contains(&r.status) {
        Ok(r)
    } else {
        Err(CliError::refused(&r))
    }
}

fn send_json(
    client: &mut Client,
    method: &str,
    path: &str,
    body: &Value,
) -> Result<Response, CliError> {
    let bytes = serde_json::to_vec(body).map_err(|e| CliError::Usage(e.to_string()))?;
    ok(client.request(
        method,
        path,
        Some("application/json"),
        &bytes,
        Duration::ZERO,
    )?)
}

fn print_pretty(r: &Response) -> Result<(), CliError> {
    let v: Value = serde_json::from_slice(&r.body)
        .map_err(|e| CliError::Failed(format!("the server answered invalid JSON: {e}")))?;
    let text = serde_json::to_string_pretty(&v).unwrap_or_default();
    println!("{text}");
    Ok(())
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
    let mut topics = Vec::new();
    let mut token = String::new();
    for _ in 0..LIST_PAGES_MAX {
        let mut path = format!("/v1/topics?limit={LIST_PAGE_LIMIT}");
        if !token.is_empty() {
            path.push_str(&format!("&page_token={}", escape(&token)));
        }
        let r = ok(client.request("GET", &path, None, b"", Duration::ZERO)?)?;
        let page: Page = serde_json::from_slice(&r.body).map_err(|e| {
            CliError::Failed(format!("the server answered an invalid topic list: {e}"))
        })?;
        topics.extend(page.topics);
        if page.next_page_token.is_empty() {
            return print_list(&topics, as_json);
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
