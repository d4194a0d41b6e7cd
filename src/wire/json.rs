//! JSON output written straight into a `Vec<u8>`: strings escaped as Go's `encoding/json` does
//! (HTML-safe, `\u2028`/`\u2029` escaped, invalid UTF-8 as U+FFFD), payloads and keys encoded by
//! inspecting their bytes (SEMANTICS.md §7), the Message object in the original field order
//! (API.md §10.5) and the `{"error":"..."}` body (API.md §1.3).

use narad_io::types::{Offset, PartitionId, UnixMillis};

use super::base64;
use super::reader::is_valid_json;
use super::receipt::ReceiptHandle;
use super::{push_i64, push_u64};

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Bytes below 0x80 that go into a JSON string unchanged (Go's `htmlSafeSet`).
const SAFE: [bool; 128] = {
    let mut t = [false; 128];
    let mut i = 0x20;
    while i < 128 {
        t[i] = !matches!(i as u8, b'"' | b'\\' | b'<' | b'>' | b'&');
        i += 1;
    }
    t
};

/// Appends `s` as a JSON string literal, escaped as Go's `encoding/json` does by default.
pub fn push_json_string(out: &mut Vec<u8>, s: &[u8]) {
    out.reserve(s.len() + 2);
    out.push(b'"');
    let mut i = 0;
    let mut run = 0;
    while i < s.len() {
        let b = s[i];
        if b < 0x80 {
            if SAFE[b as usize] {
                i += 1;
                continue;
            }
            out.extend_from_slice(&s[run..i]);
            match b {
                b'\\' | b'"' => out.extend_from_slice(&[b'\\', b]),
                0x08 => out.extend_from_slice(b"\\b"),
                0x0C => out.extend_from_slice(b"\\f"),
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b'\t' => out.extend_from_slice(b"\\t"),
                _ => out.extend_from_slice(&[
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[(b >> 4) as usize],
                    HEX[(b & 0xF) as usize],
                ]),
            }
            i += 1;
            run = i;
            continue;
        }
        // Non-ASCII: copy valid UTF-8 sequences, replace invalid bytes, escape U+2028/U+2029.
        let len = utf8_len_at(&s[i..]);
        if len == 0 {
            out.extend_from_slice(&s[run..i]);
            out.extend_from_slice(b"\\ufffd");
            i += 1;
            run = i;
            continue;
        }
        if len == 3 && s[i] == 0xE2 && s[i + 1] == 0x80 && (s[i + 2] == 0xA8 || s[i + 2] == 0xA9) {
            out.extend_from_slice(&s[run..i]);
            out.extend_from_slice(if s[i + 2] == 0xA8 {
                b"\\u2028"
            } else {
                b"\\u2029"
            });
            i += 3;
            run = i;
            continue;
        }
        i += len;
    }
    out.extend_from_slice(&s[run..]);
    out.push(b'"');
}

/// Length of the valid UTF-8 sequence starting `s` (which starts with a byte ≥ 0x80), or 0.
fn utf8_len_at(s: &[u8]) -> usize {
    let n = match s[0] {
        0xC2..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF4 => 4,
        _ => return 0,
    };
    match s.get(..n) {
        Some(seq) if std::str::from_utf8(seq).is_ok() => n,
        _ => 0,
    }
}

/// Appends the JSON form of a stored payload and returns the `payload_encoding` to add:
/// valid JSON (and valid UTF-8) verbatim, including surrounding whitespace; other UTF-8 text as
/// a JSON string; anything else as a padded base64 string with `Some("base64")`. Empty is `null`.
pub fn append_payload_json(out: &mut Vec<u8>, bytes: &[u8]) -> Option<&'static str> {
    if bytes.is_empty() {
        out.extend_from_slice(b"null");
        return None;
    }
    // UTF-8 first: JSON with invalid UTF-8 inside a string would reach Go clients mangled, so
    // invalid UTF-8 is always binary.
    if std::str::from_utf8(bytes).is_err() {
        push_base64_string(out, bytes);
        return Some("base64");
    }
    if is_valid_json(bytes) {
        out.extend_from_slice(bytes);
    } else {
        push_json_string(out, bytes);
    }
    None
}

/// Appends the JSON form of a key and returns the `key_encoding` to add: valid UTF-8 as a JSON
/// string, anything else padded base64 with `Some("base64")`.
pub fn append_key_json(out: &mut Vec<u8>, key: &[u8]) -> Option<&'static str> {
    if std::str::from_utf8(key).is_ok() {
        push_json_string(out, key);
        None
    } else {
        push_base64_string(out, key);
        Some("base64")
    }
}

fn push_base64_string(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'"');
    base64::encode_into(out, bytes);
    out.push(b'"');
}

/// One Message object (API.md §10.5), borrowed from the record it describes.
#[derive(Clone, Copy, Debug)]
pub struct MessageJson<'a> {
    pub topic: &'a str,
    pub partition: PartitionId,
    pub offset: Offset,
    /// `None` (or empty) = no key: the field is omitted.
    pub key: Option<&'a [u8]>,
    pub payload: &'a [u8],
    /// Commit time at the owner; written as Unix seconds.
    pub timestamp: UnixMillis,
    /// Present on queue consumes, absent on replay.
    pub receipt_handle: Option<ReceiptHandle>,
}

impl MessageJson<'_> {
    /// Appends the object (no trailing newline) in the original field order: topic, partition,
    /// offset, key, key_encoding, payload, payload_encoding, timestamp, receipt_handle.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        out.reserve(self.payload.len() + self.topic.len() + 128);
        out.extend_from_slice(b"{\"topic\":");
        push_json_string(out, self.topic.as_bytes());
        out.extend_from_slice(b",\"partition\":");
        push_u64(out, u64::from(self.partition.0));
        out.extend_from_slice(b",\"offset\":");
        push_u64(out, self.offset.0);
        if let Some(key) = self.key.filter(|k| !k.is_empty()) {
            out.extend_from_slice(b",\"key\":");
            if let Some(enc) = append_key_json(out, key) {
                out.extend_from_slice(b",\"key_encoding\":\"");
                out.extend_from_slice(enc.as_bytes());
                out.push(b'"');
            }
        }
        out.extend_from_slice(b",\"payload\":");
        if let Some(enc) = append_payload_json(out, self.payload) {
            out.extend_from_slice(b",\"payload_encoding\":\"");
            out.extend_from_slice(enc.as_bytes());
            out.push(b'"');
        }
        out.extend_from_slice(b",\"timestamp\":");
        push_i64(out, (self.timestamp.0 / 1000) as i64);
        if let Some(h) = self.receipt_handle {
            out.extend_from_slice(b",\"receipt_handle\":\"");
            h.write_to(out);
            out.push(b'"');
        }
        out.push(b'}');
    }
}

/// Appends an error body: `{"error":"<message>"}` and a newline.
pub fn push_error_body(out: &mut Vec<u8>, message: &str) {
    out.extend_from_slice(b"{\"error\":");
    push_json_string(out, message.as_bytes());
    out.extend_from_slice(b"}\n");
}

/// An error body as a fresh vector.
pub fn error_body(message: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len() + 12);
    push_error_body(&mut out, message);
    out
}

#[cfg(test)]
mod tests {
    use narad_io::types::Nonce;

    use super::*;

    fn s(b: &[u8]) -> String {
        let mut out = Vec::new();
        push_json_string(&mut out, b);
        String::from_utf8(out).unwrap()
    }

    fn payload(b: &[u8]) -> (String, Option<&'static str>) {
        let mut out = Vec::new();
        let enc = append_payload_json(&mut out, b);
        (String::from_utf8(out).unwrap(), enc)
    }

    #[test]
    fn strings_escape_like_go_encoding_json() {
        // Proves JSON string escaping matches Go's encoding/json: named escapes, \u00XX for other
        // controls, HTML characters escaped, U+2028/2029 escaped, invalid UTF-8 as \ufffd,
        // everything else (DEL, non-ASCII) verbatim.
        assert_eq!(s(b"plain"), r#""plain""#);
        assert_eq!(s(b"a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(s(b"\n\r\t\x08\x0c\x00\x1f"), r#""\n\r\t\b\f\u0000\u001f""#);
        assert_eq!(
            s(b"<a href='x'>&</a>"),
            r#""\u003ca href='x'\u003e\u0026\u003c/a\u003e""#
        );
        assert_eq!(s("\u{2028}x\u{2029}".as_bytes()), r#""\u2028x\u2029""#);
        assert_eq!(s("é😀\u{7f}/".as_bytes()), "\"é😀\u{7f}/\"");
        assert_eq!(s(b"a\xffb\xe2\x82"), r#""a\ufffdb\ufffd\ufffd""#);
        // The output always parses back to the same text when the input was UTF-8.
        let text = "k\u{2028}<\"\\\u{1}é";
        let back: String = serde_json::from_str(&s(text.as_bytes())).unwrap();
        assert_eq!(back, text);
    }

    #[test]
    fn payload_encoding_follows_the_stored_bytes() {
        // Proves SEMANTICS.md §7: JSON verbatim with its whitespace, non-JSON text as a JSON
        // string (so `"hi"` and `hi` look alike), binary as base64 with the flag, empty as null.
        assert_eq!(
            payload(b"{\"order_id\":\"ord_123\"}"),
            ("{\"order_id\":\"ord_123\"}".into(), None)
        );
        assert_eq!(payload(b" [1, 2]\n"), (" [1, 2]\n".into(), None));
        assert_eq!(payload(b"\"hi\""), ("\"hi\"".into(), None));
        assert_eq!(payload(b"hi"), ("\"hi\"".into(), None));
        assert_eq!(payload(b"42"), ("42".into(), None));
        assert_eq!(payload(b"null"), ("null".into(), None));
        assert_eq!(payload(b"{\"a\":1} x"), (r#""{\"a\":1} x""#.into(), None));
        assert_eq!(
            payload("héllo <b>".as_bytes()),
            ("\"héllo \\u003cb\\u003e\"".into(), None)
        );
        assert_eq!(
            payload(&[0xFF, 0x00, 0x01]),
            ("\"/wAB\"".into(), Some("base64"))
        );
        // JSON-shaped but with invalid UTF-8 inside a string: binary.
        assert_eq!(payload(b"\"\xff\""), ("\"Iv8i\"".into(), Some("base64")));
        assert_eq!(payload(b""), ("null".into(), None));
        // Deeper than serde_json's recursion limit is still JSON.
        let deep = format!("{}{}", "[".repeat(300), "]".repeat(300));
        assert_eq!(payload(deep.as_bytes()).0, deep);
    }

    #[test]
    fn keys_are_strings_or_base64() {
        // Proves UTF-8 keys are JSON strings and other keys base64 with key_encoding.
        let mut out = Vec::new();
        assert_eq!(
            append_key_json(&mut out, "customer 42/é&x=1".as_bytes()),
            None
        );
        assert_eq!(out, "\"customer 42/é\\u0026x=1\"".as_bytes());
        out.clear();
        assert_eq!(
            append_key_json(&mut out, &[0x00, 0x9F, 0xFF, b'k']),
            Some("base64")
        );
        assert_eq!(out, b"\"AJ//aw==\"");
    }

    #[test]
    fn message_object_has_the_original_shape_and_order() {
        // Proves the Message object bytes for the API.md example, the replay form (no handle, no
        // key) and the binary form (both encodings next to their fields).
        let m = MessageJson {
            topic: "orders",
            partition: PartitionId(1),
            offset: Offset(0),
            key: Some(b"customer-42"),
            payload: br#"{"order_id":"ord_123","amount":4999}"#,
            timestamp: UnixMillis(1_790_592_556_999),
            receipt_handle: Some(ReceiptHandle {
                partition: PartitionId(1),
                offset: Offset(0),
                nonce: Nonce(8874198393259169482),
            }),
        };
        let mut out = Vec::new();
        m.write_to(&mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"topic":"orders","partition":1,"offset":0,"key":"customer-42","payload":{"order_id":"ord_123","amount":4999},"timestamp":1790592556,"receipt_handle":"1:0:8874198393259169482"}"#
        );
        let replay = MessageJson {
            key: None,
            receipt_handle: None,
            payload: b"text",
            ..m
        };
        let mut out = Vec::new();
        replay.write_to(&mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"topic":"orders","partition":1,"offset":0,"payload":"text","timestamp":1790592556}"#
        );
        let binary = MessageJson {
            key: Some(&[0xFF]),
            payload: &[0xFE],
            receipt_handle: None,
            ..m
        };
        let mut out = Vec::new();
        binary.write_to(&mut out);
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            r#"{"topic":"orders","partition":1,"offset":0,"key":"/w==","key_encoding":"base64","payload":"/g==","payload_encoding":"base64","timestamp":1790592556}"#
        );
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["payload_encoding"], "base64");
        // An empty key is no key.
        let mut out = Vec::new();
        MessageJson {
            key: Some(b""),
            ..replay
        }
        .write_to(&mut out);
        assert!(!String::from_utf8(out).unwrap().contains("\"key\""));
    }

    #[test]
    fn error_body_is_one_json_line() {
        // Proves the error body shape of API.md §1.3 with escaping of the message.
        assert_eq!(
            error_body("topic not found"),
            b"{\"error\":\"topic not found\"}\n"
        );
        assert_eq!(
            error_body("invalid json: json: unknown field \"x\""),
            b"{\"error\":\"invalid json: json: unknown field \\\"x\\\"\"}\n"
        );
    }
}
