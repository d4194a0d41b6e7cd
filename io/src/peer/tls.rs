//! TLS on the cluster port (CLUSTER.md §12, `NARAD_CLUSTER_TLS_{CERT,KEY,CA}_FILE`): mutual
//! authentication, every node presents its certificate and accepts only peers whose chain
//! leads to the cluster's CA. The cluster-secret proof still runs inside the TLS session.
//!
//! Owns: loading the three PEM files into one [`PeerTls`] per node (checked once, at start),
//! and wrapping a shard's connected or accepted stream. The dialler checks the listener's
//! certificate against the address it dialled (a DNS name, or an IP address in the SANs).

use std::io;
use std::path::Path;
use std::sync::Arc;

use futures_rustls::{TlsAcceptor, TlsConnector};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use super::wire::PeerStream;
use crate::rt::TcpStream;

/// The TLS side of this node's cluster connections (both directions).
pub struct PeerTls {
    connector: TlsConnector,
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerTls")
    }
}

impl PeerTls {
    /// Loads this node's certificate chain and key and the cluster CA: an error names the file
    /// and what is wrong with it.
    pub fn from_files(cert: &Path, key: &Path, ca: &Path) -> Result<PeerTls, String> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .map_err(|e| format!("{}: {e}", cert.display()))?
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{}: {e}", cert.display()))?;
        if chain.is_empty() {
            return Err(format!("{}: no certificate in the file", cert.display()));
        }
        let key =
            PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
        let mut roots = RootCertStore::empty();
        let cas: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca)
            .map_err(|e| format!("{}: {e}", ca.display()))?
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{}: {e}", ca.display()))?;
        for c in cas {
            roots
                .add(c)
                .map_err(|e| format!("{}: not a CA certificate: {e}", ca.display()))?;
        }
        if roots.is_empty() {
            return Err(format!("{}: no certificate in the file", ca.display()));
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| format!("{}: {e}", ca.display()))?;
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| format!("{} and {}: {e}", cert.display(), key_name(key.clone_key())))?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| format!("{}: {e}", cert.display()))?;
        Ok(PeerTls {
            connector: TlsConnector::from(Arc::new(client)),
            acceptor: TlsAcceptor::from(Arc::new(server)),
        })
    }

    /// TLS over a stream this node dialled to `addr` (`host:port`): the listener's certificate
    /// must name `host`.
    pub(crate) async fn connect(&self, addr: &str, s: TcpStream) -> io::Result<PeerStream> {
        let host = addr
            .rsplit_once(':')
            .map_or(addr, |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']');
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{host}: {e}")))?;
        let tls = self.connector.connect(name, s).await?;
        Ok(Box::new(tls))
    }

    /// TLS over a stream this node accepted: the dialler must present a certificate of the CA.
    pub(crate) async fn accept(&self, s: TcpStream) -> io::Result<PeerStream> {
        let tls = self.acceptor.accept(s).await?;
        Ok(Box::new(tls))
    }
}

/// How the key is named in an error (its file is not at hand there).
fn key_name(_k: PrivateKeyDer<'static>) -> &'static str {
    "the key"
}

/// When the first certificate of the PEM file at `path` expires, in Unix seconds (its
/// `notAfter`); with `earliest`, the soonest over every certificate in the file (a CA bundle).
/// `None` when the file cannot be read or holds no certificate this can parse.
pub fn pem_not_after(path: &Path, earliest: bool) -> Option<i64> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .ok()?
        .filter_map(Result::ok)
        .collect();
    let mut times = certs.iter().filter_map(|c| not_after(c.as_ref()));
    if earliest {
        times.min()
    } else {
        times.next()
    }
}

/// One DER element at the start of `b`: its tag, its contents and the bytes after it.
fn der_element(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = b.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, &x| (acc << 8) | usize::from(x));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// A certificate's `notAfter` in Unix seconds (RFC 5280 §4.1: Certificate → tbsCertificate →
/// [version] serialNumber signature issuer validity{notBefore, notAfter}).
fn not_after(der: &[u8]) -> Option<i64> {
    const SEQUENCE: u8 = 0x30;
    let (tag, cert, _) = der_element(der)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, tbs, _) = der_element(cert)?;
    if tag != SEQUENCE {
        return None;
    }
    let mut rest = tbs;
    let (tag, _, after) = der_element(rest)?;
    if tag == 0xa0 {
        rest = after; // the explicit version
    }
    for _ in 0..3 {
        // serialNumber, signature, issuer
        rest = der_element(rest)?.2;
    }
    let (tag, validity, _) = der_element(rest)?;
    if tag != SEQUENCE {
        return None;
    }
    let (_, _, after_before) = der_element(validity)?;
    let (tag, time, _) = der_element(after_before)?;
    parse_time(tag, std::str::from_utf8(time).ok()?)
}

/// UTCTime (tag 0x17, `YYMMDDHHMMSSZ`, years 1950-2049) or GeneralizedTime (0x18,
/// `YYYYMMDDHHMMSSZ`) as Unix seconds.
fn parse_time(tag: u8, s: &str) -> Option<i64> {
    let s = s.strip_suffix('Z')?;
    let (year, rest) = match (tag, s.len()) {
        (0x17, 12) => {
            let yy: i64 = s[..2].parse().ok()?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &s[2..])
        }
        (0x18, 14) => (s[..4].parse().ok()?, &s[4..]),
        _ => return None,
    };
    let num = |r: std::ops::Range<usize>| -> Option<i64> { rest.get(r)?.parse().ok() };
    let (month, day, h, m, sec) = (num(0..2)?, num(2..4)?, num(4..6)?, num(6..8)?, num(8..10)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || h > 23 || m > 59 || sec > 60 {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + h * 3600 + m * 60 + sec)
}

/// Days from 1970-01-01 to a proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_times_read_as_unix_seconds() {
        // Proves the date arithmetic and both time encodings, including a leap day and the
        // UTCTime century rule.
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(parse_time(0x17, "700101000000Z"), Some(0));
        assert_eq!(parse_time(0x17, "491231235959Z"), Some(2_524_607_999));
        assert_eq!(parse_time(0x18, "20240229120000Z"), Some(1_709_208_000));
        assert_eq!(parse_time(0x18, "20241301000000Z"), None);
        assert_eq!(parse_time(0x17, "2401010000Z"), None);
        assert_eq!(
            not_after(&[0x30, 0x03, 0x02, 0x01, 0x00]),
            None,
            "no validity"
        );
        assert_eq!(
            der_element(&[0x30, 0x85, 1, 1, 1, 1, 1]),
            None,
            "a length over 4 bytes"
        );
    }
}
