//! Standard base64 with padding (RFC 4648 §4), strict decoding: the alphabet `A–Z a–z 0–9 + /`,
//! length a multiple of 4, `=` only as the final one or two characters, and the unused low bits
//! of the last symbol zero (as Go's `base64.StdEncoding.Strict()`). No whitespace is skipped.

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Reverse table: 0..=63 for alphabet bytes, `INVALID` otherwise.
const INVALID: u8 = 0xFF;
const DECODE: [u8; 256] = {
    let mut t = [INVALID; 256];
    let mut i = 0;
    while i < 64 {
        t[ALPHABET[i] as usize] = i as u8;
        i += 1;
    }
    t
};

/// The input is not strict standard padded base64. Carries the byte index of the first offending
/// character (as Go's `CorruptInputError`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Base64Error(pub usize);

impl std::fmt::Display for Base64Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "illegal base64 data at input byte {}", self.0)
    }
}

impl std::error::Error for Base64Error {}

/// Length of the encoding of `n` bytes.
pub fn encoded_len(n: usize) -> usize {
    n.div_ceil(3) * 4
}

/// Appends the padded base64 encoding of `data` to `out`.
pub fn encode_into(out: &mut Vec<u8>, data: &[u8]) {
    out.reserve(encoded_len(data.len()));
    let mut chunks = data.chunks_exact(3);
    for c in &mut chunks {
        let v = (u32::from(c[0]) << 16) | (u32::from(c[1]) << 8) | u32::from(c[2]);
        out.extend_from_slice(&[
            ALPHABET[(v >> 18) as usize & 63],
            ALPHABET[(v >> 12) as usize & 63],
            ALPHABET[(v >> 6) as usize & 63],
            ALPHABET[v as usize & 63],
        ]);
    }
    match *chunks.remainder() {
        [a] => {
            let v = u32::from(a) << 16;
            out.extend_from_slice(&[
                ALPHABET[(v >> 18) as usize & 63],
                ALPHABET[(v >> 12) as usize & 63],
                b'=',
                b'=',
            ]);
        }
        [a, b] => {
            let v = (u32::from(a) << 16) | (u32::from(b) << 8);
            out.extend_from_slice(&[
                ALPHABET[(v >> 18) as usize & 63],
                ALPHABET[(v >> 12) as usize & 63],
                ALPHABET[(v >> 6) as usize & 63],
                b'=',
            ]);
        }
        _ => {}
    }
}

/// The padded base64 encoding of `data`.
pub fn encode(data: &[u8]) -> String {
    let mut out = Vec::new();
    encode_into(&mut out, data);
    // The alphabet is ASCII.
    String::from_utf8(out).unwrap_or_default()
}

/// Decodes strict standard padded base64.
pub fn decode(input: &[u8]) -> Result<Vec<u8>, Base64Error> {
    if input.len() & 3 != 0 {
        // Go reports the position where the incomplete quantum starts.
        let good = input.len() / 4 * 4;
        // Report an earlier bad character first, as a scan would.
        if let Some(i) = input[..good]
            .iter()
            .position(|&c| DECODE[c as usize] == INVALID)
        {
            return Err(Base64Error(i));
        }
        if let Some(i) = input[good..]
            .iter()
            .position(|&c| DECODE[c as usize] == INVALID)
        {
            return Err(Base64Error(good + i));
        }
        return Err(Base64Error(good));
    }
    let mut out = Vec::with_capacity(input.len() / 4 * 3);
    let quads = input.len() / 4;
    for q in 0..quads {
        let at = q * 4;
        let c = &input[at..at + 4];
        let last = q + 1 == quads;
        let d = [
            DECODE[c[0] as usize],
            DECODE[c[1] as usize],
            DECODE[c[2] as usize],
            DECODE[c[3] as usize],
        ];
        if d[0] == INVALID {
            return Err(Base64Error(at));
        }
        if d[1] == INVALID {
            return Err(Base64Error(at + 1));
        }
        if last && c[2] == b'=' {
            if c[3] != b'=' {
                return Err(Base64Error(at + 3));
            }
            if d[1] & 0x0F != 0 {
                return Err(Base64Error(at + 1));
            }
            out.push((d[0] << 2) | (d[1] >> 4));
            break;
        }
        if d[2] == INVALID {
            return Err(Base64Error(at + 2));
        }
        if last && c[3] == b'=' {
            if d[2] & 0x03 != 0 {
                return Err(Base64Error(at + 2));
            }
            out.push((d[0] << 2) | (d[1] >> 4));
            out.push((d[1] << 4) | (d[2] >> 2));
            break;
        }
        if d[3] == INVALID {
            return Err(Base64Error(at + 3));
        }
        out.push((d[0] << 2) | (d[1] >> 4));
        out.push((d[1] << 4) | (d[2] >> 2));
        out.push((d[2] << 6) | d[3]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc4648_vectors_round_trip() {
        // Proves encoding matches the RFC 4648 test vectors and decoding inverts it.
        let cases: [(&[u8], &str); 7] = [
            (b"", ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg=="),
            (b"fooba", "Zm9vYmE="),
            (b"foobar", "Zm9vYmFy"),
        ];
        for (raw, enc) in cases {
            assert_eq!(encode(raw), enc);
            assert_eq!(decode(enc.as_bytes()).unwrap(), raw);
        }
        assert_eq!(encode(&[0xFF]), "/w==");
        assert_eq!(encode(&[0xFB, 0xEF, 0xBE]), "++++");
    }

    #[test]
    fn all_byte_values_round_trip() {
        // Proves every byte value and every remainder length survives encode then decode.
        let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        for n in 0..300 {
            assert_eq!(decode(encode(&data[..n]).as_bytes()).unwrap(), &data[..n]);
        }
    }

    #[test]
    fn strict_decoding_refuses_sloppy_input() {
        // Proves decoding refuses what StdEncoding.Strict refuses: no padding, bad characters,
        // URL alphabet, whitespace, padding in the middle, and non-zero trailing bits.
        for (bad, at) in [
            ("Zg", 0),
            ("Zg=", 2),
            ("Z===", 1),
            ("Zh==", 1),
            ("Zm9=", 2),
            ("Zm8=Zm8=", 3),
            ("Zm9v\n", 4),
            ("_w==", 0),
            ("Zm-v", 2),
            ("Zm9vY", 4),
            ("Zg=a", 3),
            ("====", 0),
        ] {
            assert_eq!(decode(bad.as_bytes()), Err(Base64Error(at)), "{bad}");
        }
        assert_eq!(
            Base64Error(3).to_string(),
            "illegal base64 data at input byte 3"
        );
    }
}
