//! Strict request-body decoders with the original's error texts (API.md §1.2, §10.2, §10.4):
//! the batch produce body `{"messages":[...]}`, the batch ack body `{"receipt_handles":[...]}`,
//! and `decode_strict` for the small admin bodies.
//!
//! The batch decoders are hand-written over [`Reader`]: they borrow payloads byte for byte from
//! the body (no tree, no copy unless base64), refuse at the first element past the limit without
//! reading further, and match field names case-insensitively with the last occurrence winning, as
//! Go's `encoding/json` does. Errors come in document order; the per-message format checks run
//! after the whole body parsed, in message order.

use std::borrow::Cow;

use narad_io::types::PartitionId;
use serde::de::DeserializeOwned;

use super::base64;
use super::go_quote;
use super::reader::Reader;
use super::receipt::{MalformedHandle, ReceiptHandle};

/// Most messages in one batch produce (v3.2).
pub const BATCH_MESSAGES_MAX: usize = 1000;
/// Largest decoded payload of one message: 1 MiB.
pub const MESSAGE_BYTES_MAX: usize = 1 << 20;
/// Most receipt handles in one batch ack.
pub const BATCH_ACK_HANDLES_MAX: usize = 100;

/// One message of a batch produce, ready for partition resolution.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchMessage<'a> {
    /// `None` = no key (absent or empty).
    pub key: Option<Cow<'a, [u8]>>,
    /// Never empty, at most `MESSAGE_BYTES_MAX`.
    pub payload: Payload<'a>,
    /// A pinned partition; values beyond `u32` are kept as `u32::MAX` (out of range for every
    /// topic, so the caller answers as for any out-of-range partition).
    pub partition: Option<PartitionId>,
}

/// Where a batch message's payload bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Payload<'a> {
    /// The JSON value's own text in the body (no `payload_encoding`).
    Raw(&'a [u8]),
    /// A base64 payload, decoded: this range of the batch's decode buffer (one buffer for the
    /// whole batch, no allocation per message).
    Decoded(std::ops::Range<usize>),
}

impl Payload<'_> {
    /// The bytes, given the decode buffer [`parse_batch_produce`] filled.
    pub fn bytes<'s>(&'s self, decoded: &'s [u8]) -> &'s [u8] {
        match self {
            Payload::Raw(b) => b,
            Payload::Decoded(r) => &decoded[r.clone()],
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Payload::Raw(b) => b.len(),
            Payload::Decoded(r) => r.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why a batch produce body is refused. The message is the complete error text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchProduceError {
    /// `400` with this message.
    BadRequest(String),
    /// `413` `message <i>: message too large`.
    TooLarge(String),
}

impl BatchProduceError {
    pub fn status(&self) -> u16 {
        match self {
            BatchProduceError::BadRequest(_) => 400,
            BatchProduceError::TooLarge(_) => 413,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            BatchProduceError::BadRequest(m) | BatchProduceError::TooLarge(m) => m,
        }
    }
}

impl std::fmt::Display for BatchProduceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for BatchProduceError {}

/// A failure while walking the document: `Json` details get the `invalid json: ` prefix.
enum Fail {
    Json(String),
    Plain(String),
}

impl Fail {
    fn into_message(self) -> String {
        match self {
            Fail::Json(d) => format!("invalid json: {d}"),
            Fail::Plain(m) => m,
        }
    }
}

impl From<String> for Fail {
    fn from(detail: String) -> Fail {
        Fail::Json(detail)
    }
}

/// Go's name for the kind of JSON value starting at the cursor, for type errors.
fn kind(r: &Reader<'_>) -> &'static str {
    match r.peek() {
        Some(b'"') => "string",
        Some(b'{') => "object",
        Some(b'[') => "array",
        Some(b't' | b'f') => "bool",
        _ => "number",
    }
}

/// Skips the (syntactically checked) value at the cursor and returns Go's type error for it.
fn type_error(r: &mut Reader<'_>, target: &str, go_type: &str) -> Fail {
    r.skip_ws();
    let what = kind(r);
    match r.skip_value() {
        Err(e) => Fail::Json(e),
        Ok((s, e)) if what == "number" => Fail::Json(format!(
            "json: cannot unmarshal number {} into Go {target} of type {go_type}",
            String::from_utf8_lossy(&r.buf[s..e])
        )),
        Ok(_) => Fail::Json(format!(
            "json: cannot unmarshal {what} into Go {target} of type {go_type}"
        )),
    }
}

/// Consumes `null` if it is at the cursor.
fn take_null(r: &mut Reader<'_>) -> Result<bool, Fail> {
    r.skip_ws();
    if r.peek() == Some(b'n') {
        r.skip_value()?;
        return Ok(true);
    }
    Ok(false)
}

/// A JSON string field (`null` = empty), as Go decodes into a `string`.
fn string_field<'a>(r: &mut Reader<'a>, target: &str) -> Result<Cow<'a, str>, Fail> {
    if take_null(r)? {
        return Ok(Cow::Borrowed(""));
    }
    if r.peek() == Some(b'"') {
        return Ok(r.read_string_lossy()?);
    }
    Err(type_error(r, target, "string"))
}

/// Walks `{ "<field>": [ elem, ... ] }`, calling `elem` per array element and refusing the
/// element after `max` with `too_many`. Returns the element count of the last occurrence of the
/// field (`null` or absent = 0). Anything after the object but whitespace is a second value.
fn walk_single_array_object<'a>(
    body: &'a [u8],
    field: &str,
    go_type: &str,
    array_type: &str,
    max: usize,
    too_many: &str,
    mut elem: impl FnMut(&mut Reader<'a>, usize) -> Result<(), Fail>,
) -> Result<usize, Fail> {
    let mut r = Reader::new(body);
    r.skip_ws();
    if r.at_end() {
        return Err(Fail::Json("EOF".to_string()));
    }
    let mut count = 0;
    if !take_null(&mut r)? {
        if r.peek() != Some(b'{') {
            return Err(type_error(&mut r, "value", go_type));
        }
        r.pos += 1;
        r.skip_ws();
        if r.peek() == Some(b'}') {
            r.pos += 1;
        } else {
            // One iteration per key: bounded by the body length.
            loop {
                r.skip_ws();
                if r.peek() != Some(b'"') {
                    return Err(Fail::Json(
                        r.error("looking for beginning of object key string"),
                    ));
                }
                let key = r.read_string_lossy()?;
                r.expect(b':', "after object key")?;
                if !key.eq_ignore_ascii_case(field) {
                    return Err(Fail::Json(format!(
                        "json: unknown field {}",
                        go_quote(key.as_bytes())
                    )));
                }
                // A repeated field replaces the earlier one, as Go's decoder does for slices: `elem`
                // sees index 0 again and the caller keeps only the last `count` elements.
                count = 0;
                if !take_null(&mut r)? {
                    if r.peek() != Some(b'[') {
                        return Err(type_error(
                            &mut r,
                            &format!("struct field {go_type}.{field}"),
                            array_type,
                        ));
                    }
                    r.pos += 1;
                    r.skip_ws();
                    if r.peek() == Some(b']') {
                        r.pos += 1;
                    } else {
                        loop {
                            if count == max {
                                return Err(Fail::Plain(too_many.to_string()));
                            }
                            elem(&mut r, count)?;
                            count += 1;
                            r.skip_ws();
                            match r.peek() {
                                Some(b',') => r.pos += 1,
                                Some(b']') => {
                                    r.pos += 1;
                                    break;
                                }
                                _ => return Err(Fail::Json(r.error("after array element"))),
                            }
                        }
                    }
                }
                r.skip_ws();
                match r.peek() {
                    Some(b',') => r.pos += 1,
                    Some(b'}') => {
                        r.pos += 1;
                        break;
                    }
                    _ => return Err(Fail::Json(r.error("after object key:value pair"))),
                }
            }
        }
    }
    r.skip_ws();
    if !r.at_end() {
        return Err(Fail::Json("multiple JSON values".to_string()));
    }
    Ok(count)
}

/// One element as written, before the format checks.
#[derive(Default)]
struct RawMessage<'a> {
    /// Span of the payload value in the body; `None` = absent.
    payload: Option<(usize, usize)>,
    payload_encoding: Cow<'a, str>,
    key: Cow<'a, str>,
    key_encoding: Cow<'a, str>,
    partition: Option<i64>,
}

fn parse_message<'a>(r: &mut Reader<'a>) -> Result<RawMessage<'a>, Fail> {
    const ELEM: &str = "batchMessage";
    let mut m = RawMessage::default();
    if take_null(r)? {
        return Ok(m);
    }
    if r.peek() != Some(b'{') {
        return Err(type_error(r, "struct field batchRequest.messages", ELEM));
    }
    r.pos += 1;
    r.skip_ws();
    if r.peek() == Some(b'}') {
        r.pos += 1;
        return Ok(m);
    }
    loop {
        r.skip_ws();
        if r.peek() != Some(b'"') {
            return Err(Fail::Json(
                r.error("looking for beginning of object key string"),
            ));
        }
        let key = r.read_string_lossy()?;
        r.expect(b':', "after object key")?;
        let target = |f: &str| format!("struct field {ELEM}.messages.{f}");
        if key.eq_ignore_ascii_case("payload") {
            m.payload = Some(r.skip_value()?);
        } else if key.eq_ignore_ascii_case("payload_encoding") {
            m.payload_encoding = string_field(r, &target("payload_encoding"))?;
        } else if key.eq_ignore_ascii_case("key") {
            m.key = string_field(r, &target("key"))?;
        } else if key.eq_ignore_ascii_case("key_encoding") {
            m.key_encoding = string_field(r, &target("key_encoding"))?;
        } else if key.eq_ignore_ascii_case("partition") {
            m.partition = int_field(r, &target("partition"))?;
        } else {
            return Err(Fail::Json(format!(
                "json: unknown field {}",
                go_quote(key.as_bytes())
            )));
        }
        r.skip_ws();
        match r.peek() {
            Some(b',') => r.pos += 1,
            Some(b'}') => {
                r.pos += 1;
                return Ok(m);
            }
            _ => return Err(Fail::Json(r.error("after object key:value pair"))),
        }
    }
}

/// An optional Go `int` field: `null` = absent; a number with a fraction, an exponent or out of
/// int64 range is a type error, as in Go.
fn int_field(r: &mut Reader<'_>, target: &str) -> Result<Option<i64>, Fail> {
    if take_null(r)? {
        return Ok(None);
    }
    if !matches!(r.peek(), Some(b'-' | b'0'..=b'9')) {
        return Err(type_error(r, target, "int"));
    }
    let at = r.pos;
    let (s, e) = r.skip_value()?;
    let text = std::str::from_utf8(&r.buf[s..e]).unwrap_or("");
    match text.parse::<i64>() {
        Ok(v) => Ok(Some(v)),
        Err(_) => {
            r.pos = at;
            Err(type_error(r, target, "int"))
        }
    }
}

/// Parses a batch produce body (API.md §10.2) into messages in body order, or the first error:
/// JSON errors (document order, `invalid json: ...`), `too many messages: more than 1000` at the
/// 1001st element, `messages required` for none, then each message's format checks in order
/// (`message <i>: ...`; an oversized payload is [`BatchProduceError::TooLarge`]). Base64
/// payloads are decoded onto `decoded` ([`Payload::Decoded`] ranges of it).
pub fn parse_batch_produce<'a>(
    body: &'a [u8],
    decoded: &mut Vec<u8>,
) -> Result<Vec<BatchMessage<'a>>, BatchProduceError> {
    let mut raws: Vec<RawMessage<'_>> = Vec::new();
    let too_many = format!("too many messages: more than {BATCH_MESSAGES_MAX}");
    let walked = walk_single_array_object(
        body,
        "messages",
        "batchRequest",
        // The element type's Go name is not known from the spec.
        "[]",
        BATCH_MESSAGES_MAX,
        &too_many,
        |r, i| {
            if i == 0 {
                raws.clear();
            }
            let m = parse_message(r)?;
            raws.push(m);
            Ok(())
        },
    );
    let count = walked.map_err(|f| BatchProduceError::BadRequest(f.into_message()))?;
    // Keep only the last occurrence of a repeated "messages" field.
    let raws = raws.split_off(raws.len() - count);
    if raws.is_empty() {
        return Err(BatchProduceError::BadRequest(
            "messages required".to_string(),
        ));
    }
    // One allocation for every decoded payload: each is at most 3/4 of its text.
    let base64_text: usize = raws
        .iter()
        .filter(|m| m.payload_encoding.as_ref() == "base64")
        .filter_map(|m| m.payload.map(|(s, e)| e - s))
        .sum();
    decoded.reserve(base64_text / 4 * 3);
    raws.into_iter()
        .enumerate()
        .map(|(i, m)| check_message(body, i, m, decoded))
        .collect()
}

fn check_message<'a>(
    body: &'a [u8],
    i: usize,
    m: RawMessage<'a>,
    decoded: &mut Vec<u8>,
) -> Result<BatchMessage<'a>, BatchProduceError> {
    let bad = |msg: &str| BatchProduceError::BadRequest(format!("message {i}: {msg}"));
    let payload_base64 = match m.payload_encoding.as_ref() {
        "" => false,
        "base64" => true,
        _ => return Err(bad("invalid payload_encoding: want \"base64\" or none")),
    };
    let key_base64 = match m.key_encoding.as_ref() {
        "" => false,
        "base64" => true,
        _ => return Err(bad("invalid key_encoding: want \"base64\" or none")),
    };
    let raw = m.payload.map(|(s, e)| &body[s..e]).unwrap_or_default();
    let payload = if payload_base64 && !raw.is_empty() {
        if raw[0] != b'"' {
            return Err(bad(
                "invalid payload: a base64 payload must be a JSON string",
            ));
        }
        let text = Reader::new(raw)
            .read_string()
            .map_err(|e| bad(&format!("invalid payload: {e}")))?;
        let start = decoded.len();
        base64::decode_into(&text, decoded).map_err(|e| bad(&format!("invalid payload: {e}")))?;
        Payload::Decoded(start..decoded.len())
    } else {
        Payload::Raw(raw)
    };
    if payload.is_empty() {
        return Err(bad("message required"));
    }
    if payload.len() > MESSAGE_BYTES_MAX {
        return Err(BatchProduceError::TooLarge(format!(
            "message {i}: message too large"
        )));
    }
    let key: Option<Cow<'a, [u8]>> = match m.key {
        k if k.is_empty() => None,
        k if key_base64 => {
            let bytes =
                base64::decode(k.as_bytes()).map_err(|e| bad(&format!("invalid key: {e}")))?;
            (!bytes.is_empty()).then_some(Cow::Owned(bytes))
        }
        Cow::Borrowed(s) => Some(Cow::Borrowed(s.as_bytes())),
        Cow::Owned(s) => Some(Cow::Owned(s.into_bytes())),
    };
    let partition = match m.partition {
        None => None,
        Some(p) if p < 0 => return Err(bad("invalid partition: must be >= 0")),
        Some(p) => Some(PartitionId(u32::try_from(p).unwrap_or(u32::MAX))),
    };
    Ok(BatchMessage {
        key,
        payload,
        partition,
    })
}

/// Parses a batch ack body `{"receipt_handles":[...]}` (API.md §10.4): 1..100 strings, each
/// parsed on its own (a malformed one is that handle's `400`, not the request's). Errors are the
/// whole request's `400` text.
pub fn parse_batch_ack(body: &[u8]) -> Result<Vec<Result<ReceiptHandle, MalformedHandle>>, String> {
    let mut handles = Vec::new();
    let too_many = format!("too many receipt_handles: more than {BATCH_ACK_HANDLES_MAX}");
    let walked = walk_single_array_object(
        body,
        "receipt_handles",
        "batchAckRequest",
        "[]string",
        BATCH_ACK_HANDLES_MAX,
        &too_many,
        |r, i| {
            if i == 0 {
                handles.clear();
            }
            let s = string_field(r, "struct field batchAckRequest.receipt_handles")?;
            handles.push(ReceiptHandle::parse(s.as_bytes()));
            Ok(())
        },
    );
    let count = walked.map_err(Fail::into_message)?;
    let handles = handles.split_off(handles.len() - count);
    if handles.is_empty() {
        return Err("receipt_handles required".to_string());
    }
    Ok(handles)
}

/// Decodes one strict JSON object body into `T` with the original's error texts:
/// `invalid json: EOF` for an empty body, `invalid json: <Go scanner text>` for malformed JSON,
/// `invalid json: multiple JSON values` for anything after the first value,
/// `invalid json: json: cannot unmarshal array into Go value of type <go_type>` (likewise
/// string, number, bool) when the body is not an object, and
/// `invalid json: json: unknown field "x"` when `T` (with `#[serde(deny_unknown_fields)]`) meets
/// an unknown field. Other type errors keep serde's wording after `invalid json: `.
/// A `null` body is an object with no fields, as Go's decoder leaves the struct untouched.
/// Keys match fields as Go matches them (exact, else without regard to letter case; a repeated
/// key takes its last value: [`super::gokeys`]), and a missing field is an error unless `T`
/// gives it `#[serde(default)]`.
///
/// The object check is made here because serde's derived structs also accept a JSON array, field
/// by field in declaration order, which would make `["orders",null,...]` a valid create body and
/// put the struct's Rust name and arity in the refusals.
pub fn decode_strict<T: DeserializeOwned>(body: &[u8], go_type: &str) -> Result<T, String> {
    let mut r = Reader::new(body);
    r.skip_ws();
    if r.at_end() {
        return Err("invalid json: EOF".to_string());
    }
    let (s, e) = r.skip_value().map_err(|d| format!("invalid json: {d}"))?;
    r.skip_ws();
    if !r.at_end() {
        return Err("invalid json: multiple JSON values".to_string());
    }
    let value = match body[s] {
        b'{' => &body[s..e],
        b'n' => b"{}".as_slice(),
        _ => {
            let mut v = Reader::new(&body[s..e]);
            return Err(type_error(&mut v, "value", go_type).into_message());
        }
    };
    let decoded = match std::str::from_utf8(value) {
        Ok(text) => T::deserialize(super::gokeys::GoKeys(text)),
        // serde_json names the bad bytes.
        Err(_) => serde_json::from_slice::<T>(value),
    };
    decoded.map_err(|err| format!("invalid json: {}", serde_detail(&err)))
}

/// serde_json's message without its position suffix, with the unknown-field form rewritten to
/// Go's `json: unknown field "x"`.
fn serde_detail(err: &serde_json::Error) -> String {
    let full = err.to_string();
    let suffix = format!(" at line {} column {}", err.line(), err.column());
    let msg = full.strip_suffix(&suffix).unwrap_or(&full);
    if let Some(rest) = msg.strip_prefix("unknown field `") {
        let end = rest
            .rfind("`, expected")
            .or_else(|| rest.rfind("`, there are no fields"))
            .unwrap_or(rest.len());
        return format!("json: unknown field {}", go_quote(&rest.as_bytes()[..end]));
    }
    msg.to_string()
}

#[cfg(test)]
mod tests {
    use narad_io::types::{Nonce, Offset};

    use super::*;

    /// A parsed message with its payload's bytes (`raw`: a range of the body, not decoded).
    struct Got<'a> {
        key: Option<Cow<'a, [u8]>>,
        payload: Vec<u8>,
        raw: bool,
        partition: Option<PartitionId>,
    }

    fn parse(body: &str) -> Result<Vec<BatchMessage<'_>>, BatchProduceError> {
        parse_batch_produce(body.as_bytes(), &mut Vec::new())
    }

    fn ok(body: &str) -> Vec<Got<'_>> {
        let mut decoded = Vec::new();
        let msgs = parse_batch_produce(body.as_bytes(), &mut decoded)
            .unwrap_or_else(|e| panic!("{body}: {e:?}"));
        msgs.into_iter()
            .map(|m| Got {
                payload: m.payload.bytes(&decoded).to_vec(),
                raw: matches!(m.payload, Payload::Raw(_)),
                key: m.key,
                partition: m.partition,
            })
            .collect()
    }

    fn bad(body: &str) -> String {
        match parse(body) {
            Err(BatchProduceError::BadRequest(m)) => m,
            other => panic!("{body}: expected 400, got {other:?}"),
        }
    }

    #[test]
    fn batch_produce_reads_the_api_example() {
        // Proves the API.md §10.2 example: a JSON payload is its raw text byte for byte, base64
        // payloads and keys are decoded, a pinned partition is kept.
        let body = r#"{"messages":[
  {"key":"customer-42","payload":{"order_id":"ord_124"}},
  {"key":"customer-7","payload":"aGVsbG8=","payload_encoding":"base64"},
  {"key":"/w==","key_encoding":"base64","payload":[1,2],"partition":2}
]}"#;
        let m = ok(body);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].key.as_deref(), Some(&b"customer-42"[..]));
        assert_eq!(m[0].payload.as_slice(), br#"{"order_id":"ord_124"}"#);
        assert!(m[0].raw);
        assert!(!m[1].raw);
        assert_eq!(m[0].partition, None);
        assert_eq!(m[1].payload.as_slice(), b"hello");
        assert_eq!(m[2].key.as_deref(), Some(&[0xFF][..]));
        assert_eq!(m[2].payload.as_slice(), b"[1,2]");
        assert_eq!(m[2].partition, Some(PartitionId(2)));
    }

    #[test]
    fn batch_payload_text_is_exact() {
        // Proves a JSON string keeps its quotes and escapes, inner whitespace is kept, outer
        // whitespace is not, `null` is the 4-byte message, and keys unescape; field names match
        // case-insensitively and the last occurrence wins, as in Go.
        let m = ok("{\"messages\":[{\"payload\": \"a\\u00e9\" ,\"key\":\"k\\/1\"},{\"payload\":{ \"a\" : [ 1 ] }\n},{\"payload\":null},{\"PAYLOAD\":1,\"payload\":2,\"Key\":\"\"}]}");
        assert_eq!(m[0].payload.as_slice(), b"\"a\\u00e9\"");
        assert_eq!(m[0].key.as_deref(), Some(&b"k/1"[..]));
        assert_eq!(m[1].payload.as_slice(), b"{ \"a\" : [ 1 ] }");
        assert_eq!(m[2].payload.as_slice(), b"null");
        assert_eq!(m[3].payload.as_slice(), b"2");
        assert_eq!(m[3].key, None);
        assert_eq!(ok(" {\"messages\":[{\"payload\":1}]} \n").len(), 1);
        let last = ok(r#"{"messages":[{"payload":1},{"payload":2}],"Messages":[{"payload":3}]}"#);
        assert_eq!(last.len(), 1);
        assert_eq!(last[0].payload.as_slice(), b"3");
        // A partition beyond u32 is out of range for every topic.
        assert_eq!(
            ok(r#"{"messages":[{"payload":1,"partition":4294967296}]}"#)[0].partition,
            Some(PartitionId(u32::MAX))
        );
        assert_eq!(
            ok(r#"{"messages":[{"payload":1,"partition":null}]}"#)[0].partition,
            None
        );
    }

    #[test]
    fn batch_produce_json_errors_have_the_original_texts() {
        // Proves the whole-body refusals: unknown fields at either level, trailing values,
        // malformed JSON, wrong types, and the empty body.
        assert_eq!(
            bad(r#"{"messages":[{"payload":1}],"x":1}"#),
            r#"invalid json: json: unknown field "x""#
        );
        assert_eq!(
            bad(r#"{"messages":[{"payload":1,"extra":true}]}"#),
            r#"invalid json: json: unknown field "extra""#
        );
        assert_eq!(
            bad(r#"{"messages":[{"payload":1}]} {}"#),
            "invalid json: multiple JSON values"
        );
        assert_eq!(
            bad(r#"{"messages":[{"payload":1}]}x"#),
            "invalid json: multiple JSON values"
        );
        assert_eq!(
            bad(r#"{"messages":[{"payload":1}"#),
            "invalid json: unexpected EOF"
        );
        assert_eq!(
            bad(r#"{"messages":[{"payload":}]}"#),
            "invalid json: invalid character '}' looking for beginning of value"
        );
        assert_eq!(bad(""), "invalid json: EOF");
        assert!(bad("[]").starts_with("invalid json: json: cannot unmarshal array into Go value"));
        assert!(bad(r#"{"messages":5}"#)
            .starts_with("invalid json: json: cannot unmarshal number 5 into Go struct field"));
        assert!(bad(r#"{"messages":[{"payload":1,"partition":1.5}]}"#)
            .contains("cannot unmarshal number 1.5"));
        assert!(bad(r#"{"messages":[{"payload":1,"partition":"1"}]}"#)
            .contains("cannot unmarshal string"));
        assert!(
            bad(r#"{"messages":[{"payload":1,"key":7}]}"#).contains("cannot unmarshal number 7")
        );
        assert!(bad(r#"{"messages":[7]}"#).contains("cannot unmarshal number 7"));
    }

    #[test]
    fn batch_produce_counts_messages() {
        // Proves zero messages (absent, null, empty) is `messages required`, 1000 are accepted and
        // the 1001st element is refused without reading the rest of the body.
        for body in [
            "{}",
            "null",
            r#"{"messages":null}"#,
            r#"{"messages":[]}"#,
            r#"{"messages":[{"payload":1}],"messages":[]}"#,
        ] {
            assert_eq!(bad(body), "messages required", "{body}");
        }
        let elems = vec![r#"{"payload":1}"#; BATCH_MESSAGES_MAX].join(",");
        assert_eq!(
            ok(&format!(r#"{{"messages":[{elems}]}}"#)).len(),
            BATCH_MESSAGES_MAX
        );
        // The 1001st element is garbage: refused for the count, not for its syntax.
        assert_eq!(
            bad(&format!(r#"{{"messages":[{elems},garbage"#)),
            "too many messages: more than 1000"
        );
    }

    #[test]
    fn batch_produce_format_errors_name_the_message() {
        // Proves the per-message texts of API.md §10.2, prefixed with the 0-based index, and
        // that the first failing message in order wins.
        let one = |elem: &str| bad(&format!(r#"{{"messages":[{{"payload":1}},{elem}]}}"#));
        assert_eq!(
            one(r#"{"payload":"eA==","payload_encoding":"hex"}"#),
            "message 1: invalid payload_encoding: want \"base64\" or none"
        );
        assert_eq!(
            one(r#"{"payload":1,"key_encoding":"utf8"}"#),
            "message 1: invalid key_encoding: want \"base64\" or none"
        );
        assert_eq!(
            one(r#"{"payload":[1],"payload_encoding":"base64"}"#),
            "message 1: invalid payload: a base64 payload must be a JSON string"
        );
        assert_eq!(
            one(r#"{"payload":"","payload_encoding":"base64"}"#),
            "message 1: message required"
        );
        assert_eq!(one(r#"{"key":"k"}"#), "message 1: message required");
        assert_eq!(one("null"), "message 1: message required");
        assert_eq!(
            one(r#"{"payload":1,"partition":-1}"#),
            "message 1: invalid partition: must be >= 0"
        );
        assert_eq!(
            one(r#"{"payload":"e","payload_encoding":"base64"}"#),
            "message 1: invalid payload: illegal base64 data at input byte 0"
        );
        assert_eq!(
            one(r#"{"payload":1,"key":"!!","key_encoding":"base64"}"#),
            "message 1: invalid key: illegal base64 data at input byte 0"
        );
        assert_eq!(
            bad(
                r#"{"messages":[{"payload":1,"partition":-1},{"payload":1,"payload_encoding":"x"}]}"#
            ),
            "message 0: invalid partition: must be >= 0"
        );
    }

    #[test]
    fn batch_produce_refuses_an_oversized_payload_with_413() {
        // Proves a decoded payload over 1 MiB is the distinct TooLarge error (413), while exactly
        // 1 MiB passes, for raw and base64 payloads alike.
        let exact = format!(
            r#"{{"messages":[{{"payload":"{}"}}]}}"#,
            "a".repeat(MESSAGE_BYTES_MAX - 2)
        );
        assert_eq!(ok(&exact)[0].payload.len(), MESSAGE_BYTES_MAX);
        let over = format!(
            r#"{{"messages":[{{"payload":1}},{{"payload":"{}"}}]}}"#,
            "a".repeat(MESSAGE_BYTES_MAX - 1)
        );
        let err = parse(&over).unwrap_err();
        assert_eq!(
            err,
            BatchProduceError::TooLarge("message 1: message too large".to_string())
        );
        assert_eq!(err.status(), 413);
        let big = base64::encode(&vec![7u8; MESSAGE_BYTES_MAX + 1]);
        let over = format!(r#"{{"messages":[{{"payload":"{big}","payload_encoding":"base64"}}]}}"#);
        assert_eq!(
            parse(&over).unwrap_err().message(),
            "message 0: message too large"
        );
    }

    #[test]
    fn batch_ack_reads_handles_and_limits_them() {
        // Proves the batch ack body: handles parsed one by one (malformed ones kept as per-handle
        // errors), 1..100 enforced with the exact texts, strict JSON rules as elsewhere.
        let got = parse_batch_ack(
            br#"{"receipt_handles":["1:1:6130356697557286029","bad","0:0:2681459915124828679"]}"#,
        )
        .unwrap();
        assert_eq!(
            got[0],
            Ok(ReceiptHandle {
                partition: PartitionId(1),
                offset: Offset(1),
                nonce: Nonce(6130356697557286029)
            })
        );
        assert_eq!(got[1], Err(MalformedHandle));
        assert_eq!(got.len(), 3);
        let hundred = vec!["\"0:0:1\""; BATCH_ACK_HANDLES_MAX].join(",");
        assert_eq!(
            parse_batch_ack(format!(r#"{{"receipt_handles":[{hundred}]}}"#).as_bytes())
                .unwrap()
                .len(),
            100
        );
        assert_eq!(
            parse_batch_ack(format!(r#"{{"receipt_handles":[{hundred},"0:0:1"]}}"#).as_bytes()),
            Err("too many receipt_handles: more than 100".to_string())
        );
        assert_eq!(
            parse_batch_ack(br#"{"receipt_handles":[]}"#),
            Err("receipt_handles required".to_string())
        );
        assert_eq!(
            parse_batch_ack(br#"{"handles":[]}"#),
            Err(r#"invalid json: json: unknown field "handles""#.to_string())
        );
        assert_eq!(
            parse_batch_ack(br#"{"receipt_handles":["0:0:1"]}{}"#),
            Err("invalid json: multiple JSON values".to_string())
        );
        assert!(parse_batch_ack(br#"{"receipt_handles":[1]}"#)
            .unwrap_err()
            .contains("cannot unmarshal number 1"));
        // Go names the field's type in full (audit s20 D4: "of type []" before).
        assert_eq!(
            parse_batch_ack(br#"{"receipt_handles":"0:0:1"}"#),
            Err("invalid json: json: cannot unmarshal string into Go struct field batchAckRequest.receipt_handles of type []string".to_string())
        );
    }

    #[derive(serde::Deserialize, Debug, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Topic {
        name: String,
        #[serde(default)]
        partitions: u32,
    }

    fn topic(body: &[u8]) -> Result<Topic, String> {
        decode_strict(body, "topicRequest")
    }

    #[derive(serde::Deserialize, Debug, PartialEq, Default)]
    #[serde(deny_unknown_fields)]
    struct Optional {
        name: Option<String>,
        partitions: Option<i64>,
    }

    #[test]
    fn decode_strict_refuses_non_objects_with_go_texts() {
        // Proves an object body cannot be given as an array (serde's positional struct form),
        // string, number or bool: each is Go's "cannot unmarshal ... into Go value of type"
        // text, naming the Go-style type and nothing of the Rust struct; `null` is an empty
        // object, as Go's decoder leaves the struct untouched.
        let dec = |b: &[u8]| decode_strict::<Optional>(b, "createTopicRequest");
        let want = |what: &str| {
            Err(format!(
                "invalid json: json: cannot unmarshal {what} into Go value of type createTopicRequest"
            ))
        };
        assert_eq!(dec(br#"["orders",3]"#), want("array"));
        assert_eq!(dec(b" [] "), want("array"));
        assert_eq!(dec(br#""orders""#), want("string"));
        assert_eq!(dec(b"true"), want("bool"));
        assert_eq!(dec(b"-1.5e3"), want("number -1.5e3"));
        assert_eq!(dec(b"null"), Ok(Optional::default()));
        assert_eq!(dec(b" null\n"), Ok(Optional::default()));
        assert_eq!(
            dec(br#"{"name":"o"}"#),
            Ok(Optional {
                name: Some("o".into()),
                partitions: None
            })
        );
        // Malformed input keeps its scanner text; a second value is still refused.
        assert_eq!(dec(b"[1,"), Err("invalid json: unexpected EOF".into()));
        assert_eq!(
            dec(b"[] {}"),
            Err("invalid json: multiple JSON values".into())
        );
    }

    #[test]
    fn decode_strict_maps_errors_to_go_texts() {
        // Proves the generic strict decoder: unknown field, trailing value, malformed JSON and
        // empty body give the original's texts; valid bodies decode.
        assert_eq!(
            topic(br#" {"name":"orders","partitions":3} "#),
            Ok(Topic {
                name: "orders".into(),
                partitions: 3
            })
        );
        assert_eq!(
            topic(br#"{"name":"o","x":1}"#),
            Err(r#"invalid json: json: unknown field "x""#.into())
        );
        assert_eq!(
            topic(br#"{"name":"o","a`b":1}"#),
            Err(r#"invalid json: json: unknown field "a`b""#.into())
        );
        assert_eq!(
            topic(br#"{"name":"o"} {"name":"p"}"#),
            Err("invalid json: multiple JSON values".into())
        );
        assert_eq!(
            topic(br#"{"name":"o""#),
            Err("invalid json: unexpected EOF".into())
        );
        assert_eq!(
            topic(br#"{"name":"o",}"#),
            Err(
                "invalid json: invalid character '}' looking for beginning of object key string"
                    .into()
            )
        );
        assert_eq!(topic(b"  "), Err("invalid json: EOF".into()));
        let err = topic(br#"{"name":5}"#).unwrap_err();
        assert!(
            err.starts_with("invalid json: invalid type: integer `5`"),
            "{err}"
        );
        assert!(!err.contains("line"), "{err}");

        #[derive(serde::Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        struct Empty {}
        assert_eq!(
            decode_strict::<Empty>(br#"{"y":1}"#, "emptyRequest").unwrap_err(),
            r#"invalid json: json: unknown field "y""#
        );
    }
}
