//! Receipt handles on the wire (API.md §10.6): `<partition>:<offset>:<nonce>`, three unsigned
//! ASCII decimal integers. Parsing is exact; anything else is `receipt handle is malformed`.

use std::fmt;

use narad_io::types::{Nonce, Offset, PartitionId};

use super::push_u64;

/// Largest value of each part: they travel as Go `int`/`int64`.
const PART_MAX: u64 = i64::MAX as u64;

/// A parsed receipt handle. The topic comes from the URL, not from here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReceiptHandle {
    /// A partition that fits an int64 but not a `u32` is kept as `u32::MAX`: out of range for
    /// every topic, so it answers `410` like any other partition the topic lacks.
    pub partition: PartitionId,
    pub offset: Offset,
    pub nonce: Nonce,
}

/// The handle does not have the `partition:offset:nonce` shape. Answer `400` with this text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MalformedHandle;

impl fmt::Display for MalformedHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("receipt handle is malformed")
    }
}

impl std::error::Error for MalformedHandle {}

/// One part: non-empty, digits only (leading zeros allowed, as Go's `strconv.ParseInt`), at most
/// `PART_MAX`.
fn parse_part(s: &[u8]) -> Result<u64, MalformedHandle> {
    if s.is_empty() {
        return Err(MalformedHandle);
    }
    let mut v: u64 = 0;
    for &c in s {
        if !c.is_ascii_digit() {
            return Err(MalformedHandle);
        }
        v = v
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(c - b'0')))
            .ok_or(MalformedHandle)?;
        if v > PART_MAX {
            return Err(MalformedHandle);
        }
    }
    Ok(v)
}

impl ReceiptHandle {
    /// Parses the exact wire form (already URL-decoded).
    pub fn parse(s: &[u8]) -> Result<ReceiptHandle, MalformedHandle> {
        let mut parts = s.splitn(3, |&c| c == b':');
        let (Some(p), Some(o), Some(n)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(MalformedHandle);
        };
        // A fourth part would still contain ':' in `n`, which parse_part refuses.
        let partition = parse_part(p)?;
        let offset = parse_part(o)?;
        let nonce = parse_part(n)?;
        if nonce == 0 {
            return Err(MalformedHandle);
        }
        Ok(ReceiptHandle {
            partition: PartitionId(u32::try_from(partition).unwrap_or(u32::MAX)),
            offset: Offset(offset),
            nonce: Nonce(nonce),
        })
    }

    /// Appends the wire form to `out`.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        push_u64(out, u64::from(self.partition.0));
        out.push(b':');
        push_u64(out, self.offset.0);
        out.push(b':');
        push_u64(out, self.nonce.0);
    }
}

impl fmt::Display for ReceiptHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.partition.0, self.offset.0, self.nonce.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(p: u32, o: u64, n: u64) -> ReceiptHandle {
        ReceiptHandle {
            partition: PartitionId(p),
            offset: Offset(o),
            nonce: Nonce(n),
        }
    }

    #[test]
    fn parses_and_formats_the_wire_form() {
        // Proves the documented examples parse, and formatting gives the same text back.
        for (s, want) in [
            ("0:0:1836419432839090974", h(0, 0, 1836419432839090974)),
            ("1:0:8874198393259169482", h(1, 0, 8874198393259169482)),
            (
                "107:9223372036854775807:9223372036854775807",
                h(107, i64::MAX as u64, i64::MAX as u64),
            ),
        ] {
            let got = ReceiptHandle::parse(s.as_bytes()).unwrap();
            assert_eq!(got, want);
            assert_eq!(got.to_string(), s);
            let mut out = Vec::new();
            got.write_to(&mut out);
            assert_eq!(out, s.as_bytes());
        }
        // Leading zeros are accepted as Go's ParseInt does.
        assert_eq!(ReceiptHandle::parse(b"01:002:0003").unwrap(), h(1, 2, 3));
        // A partition beyond u32 is well-formed but names no partition of any topic.
        assert_eq!(
            ReceiptHandle::parse(b"4294967296:0:1").unwrap().partition,
            PartitionId(u32::MAX)
        );
    }

    #[test]
    fn refuses_every_other_shape() {
        // Proves extra/missing ':', empty parts, signs, non-digits, overflow and nonce 0 are
        // malformed, with the exact error text.
        for bad in [
            "",
            "0",
            "0:0",
            "0:0:",
            ":0:1",
            "0::1",
            "0:0:1:",
            "0:0:1:2",
            "+0:0:1",
            "0:-1:1",
            "0:0:+1",
            " 0:0:1",
            "0:0:1 ",
            "0:0:0",
            "0:0:00",
            "a:0:1",
            "0:0:1x",
            "0:9223372036854775808:1",
            "0:0:9223372036854775808",
            "9223372036854775808:0:1",
            "0:0:99999999999999999999999",
            "0:0:１",
        ] {
            assert_eq!(
                ReceiptHandle::parse(bad.as_bytes()),
                Err(MalformedHandle),
                "{bad:?}"
            );
        }
        assert_eq!(MalformedHandle.to_string(), "receipt handle is malformed");
    }
}
