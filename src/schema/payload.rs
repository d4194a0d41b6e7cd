//! Turning produce bytes into one JSON value for validation (SEMANTICS.md §8.2–8.3): a linear
//! pre-scan that refuses nesting deeper than [`PAYLOAD_NESTING_MAX`] and exponents beyond
//! ±[`EXPONENT_ABS_MAX`] before any recursive parser runs, then a strict parse (one JSON text,
//! valid UTF-8, no BOM, no raw control characters, nothing trailing).
//!
//! Never validates against a schema and never allocates more than the parsed value.

use serde::Deserialize;
use serde_json::Value;

/// Deepest payload nesting accepted on a schema topic.
pub const PAYLOAD_NESTING_MAX: usize = 256;
/// Largest decimal exponent magnitude accepted in a payload number.
pub const EXPONENT_ABS_MAX: u64 = 1000;

/// Why a payload could not become a JSON value.
#[derive(Debug, PartialEq, Eq)]
pub enum Malformed {
    /// Deeper than [`PAYLOAD_NESTING_MAX`].
    TooDeep,
    /// Not exactly one JSON text (the parser's message).
    NotJson(String),
}

/// Refuses nesting beyond the maximum and huge exponents, in one pass over the bytes. Text
/// inside strings is skipped; the parser that follows decides whether the rest is JSON.
pub fn prescan(b: &[u8]) -> Result<(), Malformed> {
    let mut depth = 0usize;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > PAYLOAD_NESTING_MAX {
                    return Err(Malformed::TooDeep);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b'e' | b'E' if i > 0 && (b[i - 1].is_ascii_digit() || b[i - 1] == b'.') => {
                let mut j = i + 1;
                if j < b.len() && (b[j] == b'+' || b[j] == b'-') {
                    j += 1;
                }
                let mut exp: u64 = 0;
                while j < b.len() && b[j].is_ascii_digit() {
                    exp = exp
                        .saturating_mul(10)
                        .saturating_add(u64::from(b[j] - b'0'));
                    j += 1;
                }
                if exp > EXPONENT_ABS_MAX {
                    return Err(Malformed::NotJson(format!(
                        "number exponent beyond ±{EXPONENT_ABS_MAX}"
                    )));
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// Parses `b` as exactly one JSON text. Call [`prescan`] first: it bounds the recursion.
pub fn parse(b: &[u8]) -> Result<Value, Malformed> {
    prescan(b)?;
    let mut de = serde_json::Deserializer::from_slice(b);
    // Depth is already bounded by `prescan` (256 levels, far inside the executor's stack).
    de.disable_recursion_limit();
    let v = Value::deserialize(&mut de).map_err(|e| Malformed::NotJson(e.to_string()))?;
    de.end().map_err(|e| Malformed::NotJson(e.to_string()))?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_section_8_2_lists() {
        // Proves trailing data, a BOM, raw control characters, invalid UTF-8 and non-JSON are
        // refused, and that duplicate keys keep the last value.
        for bad in [
            &b"{\"a\":1} {\"b\":2}"[..],
            b"\xef\xbb\xbf{}",
            b"\"a\x01b\"",
            b"\"\xff\"",
            b"hello",
            b"",
        ] {
            assert!(matches!(parse(bad), Err(Malformed::NotJson(_))), "{bad:?}");
        }
        assert_eq!(parse(b" {\"a\":1,\"a\":2}\n").unwrap()["a"], 2);
        assert_eq!(parse(b"\"hi\"").unwrap(), "hi");
    }

    #[test]
    fn nesting_limit_is_exactly_256() {
        // Proves 256 levels parse (past serde_json's default limit of 128) and 257 are refused.
        let ok = format!("{}{}", "[".repeat(256), "]".repeat(256));
        assert!(parse(ok.as_bytes()).is_ok());
        let deep = format!("{}{}", "[".repeat(257), "]".repeat(257));
        assert_eq!(parse(deep.as_bytes()), Err(Malformed::TooDeep));
        // Brackets inside strings do not count.
        let s = format!("\"{}\"", "[".repeat(1000));
        assert!(parse(s.as_bytes()).is_ok());
        let esc = format!("[\"\\\"{}\"]", "{".repeat(300));
        assert!(parse(esc.as_bytes()).is_ok());
    }

    #[test]
    fn exponents_beyond_1000_are_refused() {
        // Proves the exponent bound of SEMANTICS.md §8.3 on both signs.
        assert!(parse(b"1e300").is_ok());
        assert!(parse(b"1.5E-1000").is_ok());
        assert!(matches!(parse(b"1e1001"), Err(Malformed::NotJson(_))));
        assert!(matches!(parse(b"[1.0e-5000]"), Err(Malformed::NotJson(_))));
        assert!(parse(b"{\"e1001\":1}").is_ok());
    }
}
