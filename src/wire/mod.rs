//! Byte-exact wire helpers of the HTTP API: receipt handles, Go duration strings, query-string
//! decoding, payload and key encoding in Message objects, base64, the key → partition hash, the
//! strict request-body decoders and the error body.
//!
//! Owns: the exact texts and bytes the original Go broker produced and accepted, so that the Go
//! SDK and curl users see no difference (API.md §1.2–1.3, §4, §10; SEMANTICS.md §5, §7;
//! CLIENTS.md).
//!
//! Never does: I/O, allocation of trees for JSON it only has to validate or copy, or any policy
//! (statuses, limits other than the per-body ones of the spec): callers map the typed errors here
//! to statuses. Every function is pure and deterministic.

pub mod base64;
pub mod body;
pub mod civil;
pub mod duration;
pub mod encoding;
pub mod gokeys;
pub mod json;
pub mod query;
pub mod reader;
pub mod receipt;

pub use body::{
    decode_strict, parse_batch_ack, parse_batch_produce, BatchMessage, BatchProduceError, Payload,
};
pub use duration::GoDuration;
pub use json::{
    append_key_json, append_payload_json, error_body, push_error_body, push_json_string,
    MessageJson,
};
pub use query::{form_decode, EscapeError, Query, QueryError};
pub use reader::{is_valid_json, nesting_depth};
pub use receipt::{MalformedHandle, ReceiptHandle};

/// FNV-1a, 32 bits, of the key bytes: the partition of a keyed message is this modulo the
/// partition count (SEMANTICS.md §5).
pub fn fnv1a32(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811C_9DC5;
    for &b in bytes {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The partition of a keyed message among `partitions` (> 0).
pub fn key_partition(key: &[u8], partitions: u32) -> u32 {
    fnv1a32(key) % partitions.max(1)
}

/// "00" to "99": two digits per division in [`push_u64`].
const DIGIT_PAIRS: [u8; 200] = {
    let mut t = [0u8; 200];
    let mut i = 0;
    while i < 100 {
        t[2 * i] = b'0' + (i / 10) as u8;
        t[2 * i + 1] = b'0' + (i % 10) as u8;
        i += 1;
    }
    t
};

/// Appends the decimal form of `v`. Two digits per step: every consumed message writes seven
/// integers (offsets, timestamp, the receipt handle's nonce), and one digit per step was 3 % of
/// the broker's CPU in a full-flow benchmark.
pub fn push_u64(out: &mut Vec<u8>, mut v: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    while v >= 100 {
        let d = (v % 100) as usize * 2;
        v /= 100;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&DIGIT_PAIRS[d..d + 2]);
    }
    if v >= 10 {
        let d = v as usize * 2;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&DIGIT_PAIRS[d..d + 2]);
    } else {
        i -= 1;
        buf[i] = b'0' + v as u8;
    }
    out.extend_from_slice(&buf[i..]);
}

/// Appends the decimal form of a signed `v`.
pub fn push_i64(out: &mut Vec<u8>, v: i64) {
    if v < 0 {
        out.push(b'-');
    }
    push_u64(out, v.unsigned_abs());
}

/// Go's `strconv.Atoi` on a query value, with its error text as the detail of
/// `invalid partition: <detail>`: `strconv.Atoi: parsing "x": invalid syntax` or
/// `... value out of range`. Accepts an optional sign and ASCII digits only.
pub fn go_atoi(s: &[u8]) -> Result<i64, String> {
    go_parse_int("Atoi", s)
}

/// Go's `strconv.ParseInt(s, 10, 64)`: as [`go_atoi`], its error texts naming `ParseInt`.
pub fn go_parse_int64(s: &[u8]) -> Result<i64, String> {
    go_parse_int("ParseInt", s)
}

fn go_parse_int(func: &str, s: &[u8]) -> Result<i64, String> {
    let syntax = || format!("strconv.{func}: parsing {}: invalid syntax", go_quote(s));
    let range = || {
        format!(
            "strconv.{func}: parsing {}: value out of range",
            go_quote(s)
        )
    };
    let (neg, digits) = match s.first() {
        Some(b'+') => (false, &s[1..]),
        Some(b'-') => (true, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty() {
        return Err(syntax());
    }
    let mut v: u64 = 0;
    for &c in digits {
        if !c.is_ascii_digit() {
            return Err(syntax());
        }
        // As Go's ParseUint: the first overflow ends the scan with a range error.
        v = v
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(c - b'0')))
            .ok_or_else(range)?;
    }
    const CUTOFF: u64 = 1 << 63;
    match (neg, v) {
        (false, v) if v >= CUTOFF => Err(range()),
        (true, v) if v > CUTOFF => Err(range()),
        (true, v) => Ok((v as i64).wrapping_neg()),
        (false, v) => Ok(v as i64),
    }
}

/// Approximation of Go's `unicode.IsPrint` good for error texts: controls, non-ASCII spaces and
/// the common invisible format characters are not printable.
fn go_is_print(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    if c.is_control() || c.is_whitespace() {
        return false;
    }
    !matches!(c, '\u{AD}' | '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}' | '\u{2060}'..='\u{206F}' | '\u{FEFF}' | '\u{FFF9}'..='\u{FFFB}')
}

/// Appends one rune the way Go's `strconv.Quote` escapes it inside `quote`.
fn go_escape_rune(out: &mut String, c: char, quote: char) {
    if c == quote || c == '\\' {
        out.push('\\');
        out.push(c);
        return;
    }
    if go_is_print(c) {
        out.push(c);
        return;
    }
    match c {
        '\u{7}' => out.push_str("\\a"),
        '\u{8}' => out.push_str("\\b"),
        '\u{c}' => out.push_str("\\f"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\u{b}' => out.push_str("\\v"),
        c if (c as u32) < 0x20 || c as u32 == 0x7F => out.push_str(&format!("\\x{:02x}", c as u32)),
        c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
        c => out.push_str(&format!("\\U{:08x}", c as u32)),
    }
}

/// Go's `strconv.Quote` (`%q`) of a byte string: invalid UTF-8 bytes as `\xHH`.
pub fn go_quote(s: &[u8]) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for chunk in s.utf8_chunks() {
        for c in chunk.valid().chars() {
            go_escape_rune(&mut out, c, '"');
        }
        for &b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out.push('"');
    out
}

/// Go's `quoteChar` of its JSON scanner: a byte shown as the rune U+00XX in single quotes.
fn go_quote_char(c: u8) -> String {
    match c {
        b'\'' => "'\\''".to_string(),
        b'"' => "'\"'".to_string(),
        c => {
            let mut out = String::from("'");
            go_escape_rune(&mut out, char::from(c), '\'');
            out.push('\'');
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_md_query_examples_end_to_end() {
        // Proves the Go SDK's encoded queries (CLIENTS.md) decode to the values the handlers
        // need: the handle parses, the key is the exact bytes, the µs wait parses, and the clamp
        // header for the 10 s ceiling reads `10s`.
        let q = Query::new(b"extend=0&receipt_handle=0%3A0%3A1836419432839090974");
        let h = ReceiptHandle::parse(&q.first("receipt_handle").unwrap().unwrap()).unwrap();
        assert_eq!(h.to_string(), "0:0:1836419432839090974");
        assert_eq!(q.first("extend").unwrap().unwrap().as_ref(), b"0");
        let q = Query::new(b"key=customer+42%2F%C3%A9%26x%3D1&partition=2");
        assert_eq!(
            q.unique("key").unwrap().unwrap().as_ref(),
            "customer 42/é&x=1".as_bytes()
        );
        assert_eq!(go_atoi(&q.unique("partition").unwrap().unwrap()), Ok(2));
        let q = Query::new(b"key=%00%9F%FFk");
        assert_eq!(
            q.unique("key").unwrap().unwrap().as_ref(),
            &[0x00, 0x9F, 0xFF, b'k']
        );
        for (raw, nanos) in [
            ("max=10&wait=1s", 1_000_000_000),
            ("wait=1m0s", 60_000_000_000),
            ("wait=100%C2%B5s", 100_000),
        ] {
            let q = Query::new(raw.as_bytes());
            assert_eq!(
                GoDuration::parse(&q.first("wait").unwrap().unwrap()),
                Ok(GoDuration { nanos }),
                "{raw}"
            );
        }
        assert_eq!(
            GoDuration::from_std(std::time::Duration::from_secs(10)).to_string(),
            "10s"
        );
    }

    #[test]
    fn fnv1a32_matches_reference_vectors() {
        // Proves the key hash is FNV-1a 32 (published test vectors), so keys land on the same
        // partitions as in the original.
        assert_eq!(fnv1a32(b""), 0x811c9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c292c);
        assert_eq!(fnv1a32(b"foobar"), 0xbf9cf968);
        assert_eq!(key_partition(b"foobar", 3), 0xbf9cf968 % 3);
        assert_eq!(key_partition(b"x", 0), 0);
    }

    #[test]
    fn integers_format_in_decimal() {
        // Proves the allocation-free integer writers cover zero and the extremes.
        let mut out = Vec::new();
        push_u64(&mut out, 0);
        out.push(b' ');
        push_u64(&mut out, u64::MAX);
        out.push(b' ');
        push_i64(&mut out, i64::MIN);
        out.push(b' ');
        push_i64(&mut out, 42);
        assert_eq!(out, b"0 18446744073709551615 -9223372036854775808 42");
        // Every digit count and both sides of every power of ten, against std's formatting.
        let mut p = 1u64;
        let mut values = vec![0, 1, 9, u64::MAX, u64::MAX - 1, 0x5eed_1234_abcd];
        for _ in 0..19 {
            p *= 10;
            values.extend([p - 1, p, p + 1, p / 2 + 7]);
        }
        for v in values {
            let mut out = Vec::new();
            push_u64(&mut out, v);
            assert_eq!(out, v.to_string().into_bytes(), "{v}");
        }
    }

    #[test]
    fn go_atoi_matches_strconv_atoi() {
        // Proves integer query values parse as Go's strconv.Atoi, with its error texts.
        assert_eq!(go_atoi(b"0"), Ok(0));
        assert_eq!(go_atoi(b"+7"), Ok(7));
        assert_eq!(go_atoi(b"-7"), Ok(-7));
        assert_eq!(go_atoi(b"007"), Ok(7));
        assert_eq!(go_atoi(b"9223372036854775807"), Ok(i64::MAX));
        assert_eq!(go_atoi(b"-9223372036854775808"), Ok(i64::MIN));
        assert_eq!(
            go_atoi(b""),
            Err(r#"strconv.Atoi: parsing "": invalid syntax"#.to_string())
        );
        assert_eq!(
            go_atoi(b"x"),
            Err(r#"strconv.Atoi: parsing "x": invalid syntax"#.to_string())
        );
        assert_eq!(
            go_atoi(b"1.5"),
            Err(r#"strconv.Atoi: parsing "1.5": invalid syntax"#.to_string())
        );
        assert_eq!(
            go_atoi(b" 1"),
            Err(r#"strconv.Atoi: parsing " 1": invalid syntax"#.to_string())
        );
        assert_eq!(
            go_atoi(b"-"),
            Err(r#"strconv.Atoi: parsing "-": invalid syntax"#.to_string())
        );
        assert_eq!(
            go_atoi(b"9223372036854775808"),
            Err(r#"strconv.Atoi: parsing "9223372036854775808": value out of range"#.to_string())
        );
        assert_eq!(
            go_parse_int64(b"99999999999999999999"),
            Err(
                r#"strconv.ParseInt: parsing "99999999999999999999": value out of range"#
                    .to_string()
            )
        );
        assert_eq!(
            go_parse_int64(b"1e3"),
            Err(r#"strconv.ParseInt: parsing "1e3": invalid syntax"#.to_string())
        );
        assert_eq!(
            go_atoi(b"-9223372036854775809"),
            Err(r#"strconv.Atoi: parsing "-9223372036854775809": value out of range"#.to_string())
        );
        assert_eq!(
            go_atoi(b"99999999999999999999x"),
            Err(r#"strconv.Atoi: parsing "99999999999999999999x": value out of range"#.to_string())
        );
    }

    #[test]
    fn go_quote_matches_strconv_quote() {
        // Proves %q-style quoting as Go prints it in `json: unknown field "x"` and URL escape
        // errors.
        assert_eq!(go_quote(b"x"), r#""x""#);
        assert_eq!(go_quote(b"a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(go_quote(b"\n\t\x01\x7f"), r#""\n\t\x01\x7f""#);
        assert_eq!(go_quote("é\u{a0}\u{200b}".as_bytes()), r#""é\u00a0\u200b""#);
        assert_eq!(go_quote(b"%\xff"), r#""%\xff""#);
        assert_eq!(go_quote_char(b'x'), "'x'");
        assert_eq!(go_quote_char(b'\''), r"'\''");
        assert_eq!(go_quote_char(b'"'), "'\"'");
        assert_eq!(go_quote_char(0x01), r"'\x01'");
        assert_eq!(go_quote_char(0xff), "'ÿ'");
        assert_eq!(go_quote_char(0x85), r"'\u0085'");
    }
}
