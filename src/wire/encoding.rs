//! `Content-Encoding` of batch produce bodies (API.md §10.2): `zstd` and `gzip` are decoded under
//! the same cap as a plain body; no header (or an empty value) passes the body through; anything
//! else is refused, `identity` included (API.md: "any other content encoding → 415"; RFC 9110
//! §8.4.1 reserves `identity` for Accept-Encoding). Decoding is streamed in bounded steps that yield to the shard's other tasks, so a
//! 16 MiB body never stalls a shard for the whole decode, and a decompression bomb stops at the
//! cap (it is never inflated past `cap + STEP_BYTES`). This module never stores anything.

use std::io::Read;

/// Output produced between two yields to the shard's scheduler.
const STEP_BYTES: usize = 64 << 10;

/// Why a body could not be decoded.
#[derive(Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// An encoding other than `zstd` or `gzip` (`415`).
    Unsupported(String),
    /// The compressed stream is damaged or truncated (`400`).
    Invalid(String),
    /// The decoded body is larger than the cap (`413`).
    TooLarge,
}

impl DecodeError {
    pub fn status(&self) -> u16 {
        match self {
            DecodeError::Unsupported(_) => 415,
            DecodeError::Invalid(_) => 400,
            DecodeError::TooLarge => 413,
        }
    }

    pub fn message(&self) -> String {
        match self {
            DecodeError::Unsupported(e) => {
                format!("unsupported Content-Encoding {e:?}: want \"zstd\", \"gzip\" or none")
            }
            DecodeError::Invalid(detail) => format!("invalid compressed body: {detail}"),
            DecodeError::TooLarge => "request body too large".to_string(),
        }
    }
}

/// The body encodings a batch produce accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyEncoding {
    Identity,
    Gzip,
    Zstd,
}

/// Reads the `Content-Encoding` header value (absent or empty = identity). Names compare
/// case-insensitively; `x-gzip` is gzip (RFC 9110 §8.4.1.3). A list of encodings is refused.
pub fn body_encoding(header: Option<&[u8]>) -> Result<BodyEncoding, DecodeError> {
    let Some(raw) = header else {
        return Ok(BodyEncoding::Identity);
    };
    let v = String::from_utf8_lossy(raw).trim().to_ascii_lowercase();
    match v.as_str() {
        "" => Ok(BodyEncoding::Identity),
        "gzip" | "x-gzip" => Ok(BodyEncoding::Gzip),
        "zstd" => Ok(BodyEncoding::Zstd),
        _ => Err(DecodeError::Unsupported(v)),
    }
}

/// Decodes `body` per `enc`, refusing output over `cap` bytes. `None` for identity (the body is
/// used as it is, no copy).
pub async fn decode(
    enc: BodyEncoding,
    body: &[u8],
    cap: usize,
) -> Result<Option<Vec<u8>>, DecodeError> {
    match enc {
        BodyEncoding::Identity => Ok(None),
        BodyEncoding::Gzip => {
            let r = flate2::read::MultiGzDecoder::new(body);
            read_capped(r, cap, "gzip").await.map(Some)
        }
        BodyEncoding::Zstd => {
            let r = zstd::stream::read::Decoder::with_buffer(body)
                .map_err(|e| DecodeError::Invalid(format!("zstd: {e}")))?;
            read_capped(r, cap, "zstd").await.map(Some)
        }
    }
}

async fn read_capped<R: Read>(mut r: R, cap: usize, name: &str) -> Result<Vec<u8>, DecodeError> {
    let mut out: Vec<u8> = Vec::new();
    loop {
        let start = out.len();
        // One step at a time; never more than one step past the cap.
        out.resize(start + STEP_BYTES, 0);
        let mut filled = start;
        let end = start + STEP_BYTES;
        while filled < end {
            match r.read(&mut out[filled..end]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(DecodeError::Invalid(format!("{name}: {e}"))),
            }
        }
        out.truncate(filled);
        if out.len() > cap {
            return Err(DecodeError::TooLarge);
        }
        if filled < end {
            return Ok(out);
        }
        narad_io::rt::yield_if_needed().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    // yield_if_needed needs a glommio executor: every decode runs inside one.
    fn block<T>(f: impl std::future::Future<Output = T>) -> T {
        narad_io::rt::block_on(f)
    }

    #[test]
    fn header_names() {
        // Proves which Content-Encoding values are accepted and that others are 415.
        assert_eq!(body_encoding(None), Ok(BodyEncoding::Identity));
        assert_eq!(body_encoding(Some(b"GZIP")), Ok(BodyEncoding::Gzip));
        assert_eq!(body_encoding(Some(b" zstd ")), Ok(BodyEncoding::Zstd));
        assert_eq!(body_encoding(Some(b"")), Ok(BodyEncoding::Identity));
        for other in [&b"br"[..], b"identity", b"deflate"] {
            assert_eq!(body_encoding(Some(other)).unwrap_err().status(), 415);
        }
        assert_eq!(
            body_encoding(Some(b"gzip, zstd")).unwrap_err().status(),
            415
        );
    }

    #[test]
    fn round_trips_and_caps() {
        // Proves gzip and zstd bodies decode to the original bytes, that output over the cap is
        // 413 (a bomb is not inflated), and that damaged streams are 400.
        {
            let data: Vec<u8> = (0..300_000u32).flat_map(|i| i.to_le_bytes()).collect();
            let gz = gzip(&data);
            let got = block(decode(BodyEncoding::Gzip, &gz, 2 << 20)).unwrap();
            assert_eq!(got.as_deref(), Some(&data[..]));
            let zs = zstd::bulk::compress(&data, 1).unwrap();
            let got = block(decode(BodyEncoding::Zstd, &zs, 2 << 20)).unwrap();
            assert_eq!(got.as_deref(), Some(&data[..]));
            // Exactly at the cap passes; one byte less refuses.
            let n = data.len();
            assert!(block(decode(BodyEncoding::Zstd, &zs, n)).is_ok());
            assert_eq!(
                block(decode(BodyEncoding::Zstd, &zs, n - 1)),
                Err(DecodeError::TooLarge)
            );
            // A 1 GiB run of zeros compresses to a few KiB; decoding stops at the cap.
            let zeros = vec![0u8; 64 << 20];
            let bomb = zstd::bulk::compress(&zeros, 3).unwrap();
            assert!(bomb.len() < 64 << 10);
            assert_eq!(
                block(decode(BodyEncoding::Zstd, &bomb, 1 << 20)),
                Err(DecodeError::TooLarge)
            );
            // Damage.
            let mut bad = gz.clone();
            bad.truncate(gz.len() / 2);
            assert_eq!(
                block(decode(BodyEncoding::Gzip, &bad, 2 << 20))
                    .unwrap_err()
                    .status(),
                400
            );
            assert_eq!(
                block(decode(BodyEncoding::Zstd, b"not zstd at all", 2 << 20))
                    .unwrap_err()
                    .status(),
                400
            );
            // An empty body is not a gzip stream.
            assert_eq!(
                block(decode(BodyEncoding::Gzip, b"", 2 << 20))
                    .unwrap_err()
                    .status(),
                400
            );
        }
    }
}
