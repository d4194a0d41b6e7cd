//! Text the CLI reads and writes: duration flags (`1h`, `30s`, `7d`, `0`/`forever`), retention
//! as a short duration, Unix seconds as RFC 3339, and one consumed message as the output line of
//! OPERATIONS.md §1.3. Pure functions, no I/O.

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::wire::GoDuration;

const MS_PER_DAY: u64 = 86_400_000;

/// A duration flag in milliseconds: a Go duration (`1h30m`, `500ms`), a whole number of days
/// (`7d`), or `0`. With `forever_ok`, `forever` means 0.
pub fn parse_duration_ms(s: &str, forever_ok: bool) -> Result<u64, String> {
    let t = s.trim();
    if forever_ok && t.eq_ignore_ascii_case("forever") {
        return Ok(0);
    }
    if let Some(days) = t.strip_suffix('d') {
        return days
            .parse::<u64>()
            .ok()
            .and_then(|d| d.checked_mul(MS_PER_DAY))
            .ok_or_else(|| format!("invalid duration {s:?}"));
    }
    let d = GoDuration::parse(t.as_bytes()).map_err(|e| e.replace("time: ", ""))?;
    if d.nanos < 0 {
        return Err(format!("invalid duration {s:?}: negative"));
    }
    let ns = d.nanos as u64;
    if !ns.is_multiple_of(1_000_000) {
        return Err(format!("invalid duration {s:?}: finer than a millisecond"));
    }
    Ok(ns / 1_000_000)
}

/// A retention in milliseconds as a short text: `forever` for 0, else the largest whole unit.
pub fn retention(ms: u64) -> String {
    if ms == 0 {
        return "forever".into();
    }
    for (unit, per) in [
        ("d", MS_PER_DAY),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
    ] {
        if ms.is_multiple_of(per) {
            return format!("{}{unit}", ms / per);
        }
    }
    format!("{ms}ms")
}

/// Unix seconds as `YYYY-MM-DDTHH:MM:SSZ` (UTC, proleptic Gregorian).
pub fn rfc3339(unix_s: i64) -> String {
    let days = unix_s.div_euclid(86_400);
    let secs = unix_s.rem_euclid(86_400);
    let (y, m, d) = crate::wire::civil::civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// A Message object (API.md §10.5); the payload kept as its raw JSON text.
#[derive(Deserialize, Debug)]
pub struct Message<'a> {
    pub partition: u32,
    pub offset: i64,
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub key_encoding: Option<String>,
    #[serde(borrow)]
    pub payload: &'a RawValue,
    #[serde(default)]
    pub payload_encoding: Option<String>,
    #[serde(default)]
    pub timestamp: i64,
    #[serde(default)]
    pub receipt_handle: Option<String>,
}

/// What a payload is, decoded from its Message encoding.
#[derive(Debug, PartialEq, Eq)]
pub enum Payload {
    /// Valid JSON other than a string: printed verbatim.
    Json(String),
    /// UTF-8 text (a JSON string in the message).
    Text(String),
    /// Anything else (base64 in the message).
    Binary(Vec<u8>),
}

impl Message<'_> {
    pub fn payload(&self) -> Result<Payload, String> {
        let raw = self.payload.get();
        if self.payload_encoding.as_deref() == Some("base64") {
            let b64: String = serde_json::from_str(raw).map_err(|e| e.to_string())?;
            return crate::wire::base64::decode(b64.as_bytes())
                .map(Payload::Binary)
                .map_err(|e| e.to_string());
        }
        if raw.starts_with('"') {
            return serde_json::from_str(raw)
                .map(Payload::Text)
                .map_err(|e| e.to_string());
        }
        Ok(Payload::Json(raw.to_string()))
    }

    /// The key as printed: text, or hex marked `(binary)`; `-` when there is none.
    pub fn key_text(&self) -> String {
        match (&self.key, self.key_encoding.as_deref()) {
            (None, _) => "-".into(),
            (Some(k), Some("base64")) => match crate::wire::base64::decode(k.as_bytes()) {
                Ok(b) => format!("{} (binary)", hex(&b)),
                Err(_) => format!("{k} (base64)"),
            },
            (Some(k), _) if k.is_empty() => "-".into(),
            (Some(k), _) => k.clone(),
        }
    }

    /// Appends this message's output line (with `raw`, the payload only) and a newline.
    pub fn write_line(&self, raw: bool, out: &mut Vec<u8>) -> Result<(), String> {
        let payload = self.payload()?;
        if !raw {
            out.extend_from_slice(
                format!(
                    "[p{} @{}] key={} {} ",
                    self.partition,
                    self.offset,
                    self.key_text(),
                    rfc3339(self.timestamp)
                )
                .as_bytes(),
            );
        }
        match payload {
            Payload::Json(s) | Payload::Text(s) => out.extend_from_slice(s.as_bytes()),
            Payload::Binary(b) if raw => out.extend_from_slice(&b),
            Payload::Binary(b) => {
                out.extend_from_slice(format!("{} ({} bytes)", hex(&b), b.len()).as_bytes())
            }
        }
        out.push(b'\n');
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("1h", true), Ok(3_600_000));
        assert_eq!(parse_duration_ms("30s", false), Ok(30_000));
        assert_eq!(parse_duration_ms("7d", true), Ok(7 * MS_PER_DAY));
        assert_eq!(parse_duration_ms("0", true), Ok(0));
        assert_eq!(parse_duration_ms("forever", true), Ok(0));
        assert!(parse_duration_ms("forever", false).is_err());
        assert!(parse_duration_ms("-1s", true).is_err());
        assert!(parse_duration_ms("1us", true).is_err());
        assert!(parse_duration_ms("x", true).is_err());
        assert!(parse_duration_ms("99999999999999999999d", true).is_err());
    }

    #[test]
    fn retention_text() {
        assert_eq!(retention(0), "forever");
        assert_eq!(retention(604_800_000), "7d");
        assert_eq!(retention(3_600_000), "1h");
        assert_eq!(retention(5_400_000), "90m");
        assert_eq!(retention(1500), "1500ms");
    }

    #[test]
    fn times() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_790_592_556), "2026-09-28T10:49:16Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn message_lines() {
        let m: Message = serde_json::from_str(
            r#"{"topic":"t","partition":1,"offset":7,"key":"k","payload":{"a": 1},"timestamp":0}"#,
        )
        .unwrap();
        let mut out = Vec::new();
        m.write_line(false, &mut out).unwrap();
        assert_eq!(out, b"[p1 @7] key=k 1970-01-01T00:00:00Z {\"a\": 1}\n");
        let m: Message = serde_json::from_str(
            r#"{"partition":0,"offset":1,"key":"/w==","key_encoding":"base64","payload":"AAE=","payload_encoding":"base64","timestamp":0}"#,
        )
        .unwrap();
        let mut out = Vec::new();
        m.write_line(false, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "[p0 @1] key=ff (binary) 1970-01-01T00:00:00Z 0001 (2 bytes)\n"
        );
        let m: Message = serde_json::from_str(
            r#"{"partition":0,"offset":1,"payload":"h\u00e9 \"x\"","timestamp":0}"#,
        )
        .unwrap();
        let mut out = Vec::new();
        m.write_line(true, &mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "hé \"x\"\n");
    }
}
