//! Standard base64 with padding (RFC 4648 §4), decoded as Go's `base64.StdEncoding` decodes (the
//! original broker's decoder): the alphabet `A–Z a–z 0–9 + /`, length a multiple of 4 once CR
//! and LF are left out (they are skipped anywhere, so base64 wrapped in lines, as the `base64`
//! tool writes it, decodes), `=` only as the final one or two characters; the unused low bits of
//! the last symbol are ignored (`StdEncoding` is not `Strict()`).

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

/// The input is not standard padded base64. Carries the byte index of the first offending
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

/// Decodes standard padded base64 (see the module doc).
///
/// Every quantum but the last goes through loops without per-symbol branches (an invalid symbol
/// anywhere sends the input to [`decode_checked`], which names its position); the last one
/// carries the padding rules.
pub fn decode(input: &[u8]) -> Result<Vec<u8>, Base64Error> {
    let mut out = Vec::new();
    decode_into(input, &mut out)?;
    Ok(out)
}

/// [`decode`] appending to `out` (unchanged on error): many payloads decode into one buffer.
pub fn decode_into(input: &[u8], out: &mut Vec<u8>) -> Result<(), Base64Error> {
    // CR and LF are not in the alphabet: input holding them fails the fast decoder first, so
    // the search for them costs nothing on the common path.
    match decode_unbroken(input, out) {
        Err(_) if input.iter().any(|&b| b == b'\n' || b == b'\r') => decode_lines(input, out),
        r => r,
    }
}

/// [`decode_into`] of input without CR or LF.
fn decode_unbroken(input: &[u8], out: &mut Vec<u8>) -> Result<(), Base64Error> {
    if input.is_empty() || input.len() & 3 != 0 {
        out.extend_from_slice(&decode_checked(input)?);
        return Ok(());
    }
    let split = input.len() - 4;
    let start = out.len();
    out.reserve(split / 4 * 3 + 3);
    out.resize(start + split / 4 * 3, 0);
    // Eight symbols (six bytes) a step, then the odd quantum.
    let (eights, four) = input[..split].split_at(split / 8 * 8);
    let (out6, out3) = out[start..].split_at_mut(eights.len() / 8 * 6);
    let mut valid = true;
    for (o, c) in out6.chunks_exact_mut(6).zip(eights.chunks_exact(8)) {
        let mut v = 0u64;
        let mut seen = 0u8;
        for &sym in c {
            let d = DECODE[sym as usize];
            seen |= d;
            v = (v << 6) | u64::from(d);
        }
        // Valid symbols are below 64; INVALID has the top bit set.
        valid &= seen & 0x80 == 0;
        o.copy_from_slice(&v.to_be_bytes()[2..]);
    }
    for (o, c) in out3.chunks_exact_mut(3).zip(four.chunks_exact(4)) {
        let (a, b, x, y) = (
            DECODE[c[0] as usize],
            DECODE[c[1] as usize],
            DECODE[c[2] as usize],
            DECODE[c[3] as usize],
        );
        valid &= (a | b | x | y) & 0x80 == 0;
        let v = (u32::from(a) << 18) | (u32::from(b) << 12) | (u32::from(x) << 6) | u32::from(y);
        o[0] = (v >> 16) as u8;
        o[1] = (v >> 8) as u8;
        o[2] = v as u8;
    }
    let last = if valid {
        decode_quad(&input[split..], true, out).map_err(|i| Base64Error(split + i))
    } else {
        Err(Base64Error(0))
    };
    if let Err(e) = last {
        out.truncate(start);
        // The checked decoder names the first offending symbol.
        return Err(decode_checked(input).err().unwrap_or(e));
    }
    Ok(())
}

/// [`decode_into`] of input holding CR or LF: decodes it without them; an error names the
/// offending symbol's position in `input`.
fn decode_lines(input: &[u8], out: &mut Vec<u8>) -> Result<(), Base64Error> {
    let (kept, at): (Vec<u8>, Vec<usize>) = input
        .iter()
        .enumerate()
        .filter(|(_, &b)| b != b'\n' && b != b'\r')
        .map(|(i, &b)| (b, i))
        .unzip();
    decode_into(&kept, out)
        .map_err(|Base64Error(i)| Base64Error(at.get(i).copied().unwrap_or(input.len())))
}

/// Decodes one 4-symbol quantum onto `out`; padding is allowed only in the `last` one. `Err`
/// carries the offending symbol's index within the quantum.
fn decode_quad(c: &[u8], last: bool, out: &mut Vec<u8>) -> Result<(), usize> {
    let d = [
        DECODE[c[0] as usize],
        DECODE[c[1] as usize],
        DECODE[c[2] as usize],
        DECODE[c[3] as usize],
    ];
    if d[0] == INVALID {
        return Err(0);
    }
    if d[1] == INVALID {
        return Err(1);
    }
    if last && c[2] == b'=' {
        if c[3] != b'=' {
            return Err(3);
        }
        out.push((d[0] << 2) | (d[1] >> 4));
        return Ok(());
    }
    if d[2] == INVALID {
        return Err(2);
    }
    if last && c[3] == b'=' {
        out.push((d[0] << 2) | (d[1] >> 4));
        out.push((d[1] << 4) | (d[2] >> 2));
        return Ok(());
    }
    if d[3] == INVALID {
        return Err(3);
    }
    out.push((d[0] << 2) | (d[1] >> 4));
    out.push((d[1] << 4) | (d[2] >> 2));
    out.push((d[2] << 6) | d[3]);
    Ok(())
}

/// [`decode`] one quantum at a time, checking every symbol: names the first offending one.
fn decode_checked(input: &[u8]) -> Result<Vec<u8>, Base64Error> {
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
    for (q, c) in input.chunks_exact(4).enumerate() {
        decode_quad(c, q + 1 == quads, &mut out).map_err(|i| Base64Error(q * 4 + i))?;
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
    fn fast_and_checked_decoding_agree() {
        // Proves the unchecked bulk loop gives what the symbol-by-symbol decoder gives, results
        // and error positions alike, on valid input and on input damaged at every position.
        let data: Vec<u8> = (0..=255u8).cycle().take(120).collect();
        for n in 0..120 {
            let enc = encode(&data[..n]).into_bytes();
            assert_eq!(decode(&enc), decode_checked(&enc), "len {n}");
            // Appending keeps what was there; an error leaves it as it was.
            let mut out = b"prefix".to_vec();
            decode_into(&enc, &mut out).unwrap();
            assert_eq!(&out[..6], b"prefix");
            assert_eq!(&out[6..], &data[..n]);
            if !enc.is_empty() {
                let mut bad = enc.clone();
                bad[0] = b'-';
                let mut out = b"prefix".to_vec();
                assert_eq!(decode_into(&bad, &mut out), Err(Base64Error(0)));
                assert_eq!(out, b"prefix");
            }
            for at in 0..enc.len() {
                for bad in [b'=', b'-', b' ', 0xC3] {
                    let mut e = enc.clone();
                    e[at] = bad;
                    assert_eq!(decode(&e), decode_checked(&e), "len {n} at {at} {bad}");
                }
            }
        }
    }

    #[test]
    fn decoding_accepts_and_refuses_what_go_std_encoding_does() {
        // Proves decoding refuses what Go's StdEncoding refuses (no padding, bad characters,
        // URL alphabet, padding in the middle, other whitespace), naming the same byte, and
        // accepts what it accepts: CR and LF anywhere (wrapped lines) and non-zero unused bits
        // of the last symbol.
        for (bad, at) in [
            ("Zg", 0),
            ("Zg=", 2),
            ("Z===", 1),
            ("Zm8=Zm8=", 3),
            ("_w==", 0),
            ("Zm-v", 2),
            ("Zm9vY", 4),
            ("Zg=a", 3),
            ("====", 0),
            ("Zm9v Zm9v", 4),
            ("Zm\n-v", 3),
            ("Zm9v\r\n_w==", 6),
        ] {
            assert_eq!(decode(bad.as_bytes()), Err(Base64Error(at)), "{bad:?}");
        }
        for (good, raw) in [
            ("Zh==", &b"f"[..]),
            ("Zm9=", b"fo"),
            ("aGl=", b"hi"),
            ("Zm9v\n", b"foo"),
            ("Zm\r\n9v", b"foo"),
            ("Zg=\n=", b"f"),
            ("aGVs\nbG8=", b"hello"),
        ] {
            assert_eq!(decode(good.as_bytes()).as_deref(), Ok(raw), "{good:?}");
        }
        // What `base64` writes for 100 bytes: lines of 76 symbols.
        let data: Vec<u8> = (0..100u8).collect();
        let text = encode(&data);
        let wrapped = format!("{}\n{}\n", &text[..76], &text[76..]);
        assert_eq!(decode(wrapped.as_bytes()).unwrap(), data);
        assert_eq!(
            Base64Error(3).to_string(),
            "illegal base64 data at input byte 3"
        );
    }
}
