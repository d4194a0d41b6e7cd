//! `narad server report` (OPERATIONS.md §1.3): one table of every topic with columns TOPIC,
//! PARTS, MESSAGES, SIZE, OWNERS, ROLE, and a total line, built from the topic list and one
//! describe per topic. Placeholder partitions (`owner_unavailable`) are never summed: a topic
//! with any shows its MESSAGES as a lower bound (`N+`) and `?` among its OWNERS. Never caches.

use std::collections::BTreeSet;

use serde_json::Value;

use super::client::{escape, Client};
use super::topic::list_all;
use super::{call, json_body, print_text, table, CliError};

/// One report row's numbers.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TopicTotals {
    pub partitions: u64,
    pub messages: u64,
    pub size_bytes: u64,
    pub owners: BTreeSet<String>,
    /// Some partition could not report (its numbers are missing from the sums).
    pub partial: bool,
}

/// Sums a describe answer's `partition_stats` (API.md §8).
pub fn totals(described: &Value) -> TopicTotals {
    let mut t = TopicTotals {
        partitions: described["partitions"].as_u64().unwrap_or(0),
        ..Default::default()
    };
    for st in described["partition_stats"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if st["status"].as_str() == Some("owner_unavailable") {
            t.partial = true;
            continue;
        }
        let hw = st["high_watermark"].as_i64().unwrap_or(0);
        let oldest = st["oldest_offset"].as_i64().unwrap_or(0);
        t.messages += u64::try_from(hw.saturating_sub(oldest)).unwrap_or(0);
        t.size_bytes += st["size_bytes"].as_u64().unwrap_or(0);
        if let Some(o) = st["owner_node"].as_str().filter(|o| !o.is_empty()) {
            t.owners.insert(o.to_string());
        }
    }
    t
}

/// Bytes as a short text in binary units: `0 B`, `512 B`, `1.5 KiB`, `12.0 MiB`.
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

pub fn run(client: &mut Client) -> Result<(), CliError> {
    let topics = list_all(client)?;
    let mut rows = vec![["TOPIC", "PARTS", "MESSAGES", "SIZE", "OWNERS", "ROLE"]
        .map(str::to_string)
        .to_vec()];
    let mut all = TopicTotals::default();
    let mut shown = 0u64;
    for t in &topics {
        let name = t["name"].as_str().unwrap_or_default();
        let r = match call(client, "GET", &format!("/v1/topics/{}", escape(name)), None) {
            Ok(r) => r,
            // Deleted since the list was read.
            Err(CliError::Refused { status: 404, .. }) => continue,
            Err(e) => return Err(e),
        };
        let described = json_body(&r)?;
        let x = totals(&described);
        let mut owners: Vec<String> = x.owners.iter().cloned().collect();
        if x.partial {
            owners.push("?".into());
        }
        rows.push(vec![
            name.to_string(),
            x.partitions.to_string(),
            format!("{}{}", x.messages, if x.partial { "+" } else { "" }),
            size(x.size_bytes),
            if owners.is_empty() {
                "-".into()
            } else {
                owners.join(",")
            },
            described["role"]
                .as_str()
                .unwrap_or("standalone")
                .to_string(),
        ]);
        shown += 1;
        all.partitions += x.partitions;
        all.messages += x.messages;
        all.size_bytes += x.size_bytes;
        all.partial |= x.partial;
        all.owners.extend(x.owners);
    }
    rows.push(vec![
        format!("TOTAL ({shown} topic(s))"),
        all.partitions.to_string(),
        format!("{}{}", all.messages, if all.partial { "+" } else { "" }),
        size(all.size_bytes),
        format!("{} node(s)", all.owners.len()),
        String::new(),
    ]);
    print_text(&table(&rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_skip_placeholders() {
        let v: Value = serde_json::from_str(
            r#"{"partitions":3,"partition_stats":[
              {"index":0,"oldest_offset":2,"high_watermark":10,"size_bytes":100,"owner_node":"n1","status":"ok"},
              {"index":1,"oldest_offset":0,"high_watermark":5,"size_bytes":50,"owner_node":"n2","status":"ok"},
              {"index":2,"oldest_offset":0,"high_watermark":0,"size_bytes":0,"status":"owner_unavailable","owner_liveness":"dead"}]}"#,
        )
        .unwrap();
        let t = totals(&v);
        assert_eq!(
            (t.partitions, t.messages, t.size_bytes, t.partial),
            (3, 13, 150, true)
        );
        assert_eq!(t.owners.into_iter().collect::<Vec<_>>(), ["n1", "n2"]);
    }

    #[test]
    fn sizes() {
        assert_eq!(size(0), "0 B");
        assert_eq!(size(1023), "1023 B");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(12 << 20), "12.0 MiB");
    }
}
