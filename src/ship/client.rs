//! One HTTPS connection to a remote cluster (SEMANTICS.md §13 "Transport"): TLS 1.2 or later with
//! the server's certificate always verified (against the remote's CA bundle, else the system's
//! roots), HTTP/1.1 with keep-alive, Basic auth, no proxy, redirects never followed.
//!
//! Owns: dialling (the address guard checked on every address the host resolves to, each dial),
//! writing one request and reading its answer (Content-Length or chunked, bounded). The body of
//! an answer is at most [`REPLY_BYTES_MAX`]; a remote that sends more is broken, not trusted.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use futures_rustls::client::TlsStream;
use futures_rustls::TlsConnector;
use narad_io::rt::TcpStream;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};

use super::Class;

/// Longest answer body read from a remote (its error bodies and `{"accepted":N}` are small).
pub const REPLY_BYTES_MAX: usize = 1 << 20;
/// Bytes asked of the TLS stream per read.
const READ_CHUNK_BYTES: usize = 16 << 10;
/// Longest head of an answer (status line and headers).
const HEAD_BYTES_MAX: usize = 16 << 10;

/// Where and how to reach one remote, as its registry entry says now.
#[derive(Clone)]
pub struct Target {
    pub host: String,
    pub port: u16,
    /// The URL's path, without a trailing slash ("" for none).
    pub path: String,
    /// `Basic ...` for the replicator user.
    pub auth: String,
    pub tls: Arc<ClientConfig>,
    pub timeout: Duration,
    /// Bodies go zstd-compressed (`limits.compression: zstd`).
    pub zstd: bool,
    /// Requests in flight to this remote from the whole node (`limits.max_in_flight`), and the
    /// node's shards that share them.
    pub max_in_flight: u64,
    pub shards: u32,
    /// `remotes.allow_addresses`: what the guard lets through besides public addresses.
    pub allow: Vec<String>,
}

/// The parts of a canonical `https://host[:port][/path]`.
pub fn split_url(url: &str) -> Option<(String, u16, String)> {
    let rest = url.strip_prefix("https://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !authority.ends_with(']') => (h, p.parse().ok()?),
        _ => (authority, 443),
    };
    Some((
        host.to_string(),
        port,
        path.trim_end_matches('/').to_string(),
    ))
}

/// The TLS client for a remote: its CA bundle when it has one, else the system's roots.
pub fn tls_config(ca_pem: Option<&str>) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    match ca_pem {
        Some(pem) => {
            for c in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                let c = c.map_err(|e| format!("ca_pem: {e}"))?;
                roots
                    .add(c)
                    .map_err(|e| format!("ca_pem: not a CA certificate: {e}"))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for c in found.certs {
                let _ = roots.add(c);
            }
        }
    }
    if roots.is_empty() {
        return Err("no trusted root certificate to verify the remote with".into());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// An open connection and when it was made.
pub struct Conn {
    tls: TlsStream<TcpStream>,
    /// Bytes read past the last answer (none in practice: one request at a time).
    buf: Vec<u8>,
    pub born: Instant,
}

/// One answer: its status and body.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

/// Dials `t`: resolves its host, refuses an address the guard refuses
/// ([`Class::DestinationRefused`]), connects and completes the TLS handshake.
pub async fn connect(t: &Target) -> Result<Conn, Class> {
    // The canonical URL keeps an IPv6 literal in brackets, as `host:port` needs it.
    let host_port = format!("{}:{}", t.host, t.port);
    let addrs: Vec<SocketAddr> = narad_io::rt::resolve(&host_port)
        .await
        .map_err(|_| Class::Unavailable)?;
    if addrs.is_empty()
        || addrs
            .iter()
            .any(|a| !super::guard::address_allowed(a.ip(), &t.allow))
    {
        return Err(Class::DestinationRefused);
    }
    let mut last = Class::Unavailable;
    for a in addrs {
        let s = match TcpStream::connect_timeout(a, t.timeout).await {
            Ok(s) => s,
            Err(_) => continue,
        };
        let _ = s.set_nodelay(true);
        let name = t.host.trim_start_matches('[').trim_end_matches(']');
        let Ok(name) = ServerName::try_from(name.to_string()) else {
            return Err(Class::TlsFailed);
        };
        let hs = TlsConnector::from(t.tls.clone()).connect(name, s);
        match narad_io::rt::timeout(t.timeout, hs).await {
            Ok(Ok(tls)) => {
                return Ok(Conn {
                    tls,
                    buf: Vec::new(),
                    born: Instant::now(),
                })
            }
            Ok(Err(e)) if e.kind() == io::ErrorKind::InvalidData => last = Class::TlsFailed,
            _ => last = Class::Unavailable,
        }
    }
    Err(last)
}

impl Conn {
    /// Sends `method path` with `body` (JSON, in `encoding` when given) and reads the answer,
    /// all within `t.timeout`. `Err` means no (complete) answer: the request may or may not
    /// have been acted on.
    pub async fn request(
        &mut self,
        t: &Target,
        method: &str,
        path: &str,
        auth: bool,
        body: &[u8],
        encoding: Option<&str>,
    ) -> io::Result<Reply> {
        let exchange = self.exchange(t, method, path, auth, body, encoding);
        match narad_io::rt::timeout(t.timeout, exchange).await {
            Ok(r) => r,
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "no answer in time")),
        }
    }

    async fn exchange(
        &mut self,
        t: &Target,
        method: &str,
        path: &str,
        auth: bool,
        body: &[u8],
        encoding: Option<&str>,
    ) -> io::Result<Reply> {
        let host = if t.port == 443 {
            t.host.clone()
        } else {
            format!("{}:{}", t.host, t.port)
        };
        let mut head = format!(
            "{method} {}{path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: narad-remote\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            t.path,
            body.len()
        );
        if let Some(e) = encoding {
            head.push_str("Content-Encoding: ");
            head.push_str(e);
            head.push_str("\r\n");
        }
        if auth {
            head.push_str("Authorization: ");
            head.push_str(&t.auth);
            head.push_str("\r\n");
        }
        head.push_str("\r\n");
        let mut out = Vec::with_capacity(head.len() + body.len());
        out.extend_from_slice(head.as_bytes());
        out.extend_from_slice(body);
        self.tls.write_all(&out).await?;
        self.tls.flush().await?;
        self.read_reply(method == "HEAD").await
    }

    async fn fill(&mut self) -> io::Result<()> {
        let have = self.buf.len();
        self.buf.resize(have + READ_CHUNK_BYTES, 0);
        let r = self.tls.read(&mut self.buf[have..]).await;
        let n = *r.as_ref().unwrap_or(&0);
        self.buf.truncate(have + n);
        if r? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the remote closed the connection",
            ));
        }
        Ok(())
    }

    async fn read_reply(&mut self, head_only: bool) -> io::Result<Reply> {
        let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
        let (status, head_len, length, chunked) = loop {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut resp = httparse::Response::new(&mut headers);
            match resp.parse(&self.buf) {
                Ok(httparse::Status::Complete(n)) => {
                    let status = resp.code.unwrap_or(0);
                    let mut length = None;
                    let mut chunked = false;
                    for h in resp.headers.iter() {
                        if h.name.eq_ignore_ascii_case("content-length") {
                            length = std::str::from_utf8(h.value)
                                .ok()
                                .and_then(|v| v.trim().parse::<usize>().ok());
                        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                            chunked = h.value.eq_ignore_ascii_case(b"chunked");
                        }
                    }
                    break (status, n, length, chunked);
                }
                Ok(httparse::Status::Partial) => {
                    if self.buf.len() > HEAD_BYTES_MAX {
                        return Err(bad("answer head too large"));
                    }
                    self.fill().await?;
                }
                Err(_) => return Err(bad("malformed answer")),
            }
        };
        self.buf.drain(..head_len);
        if head_only || status == 204 || status == 304 || (100..200).contains(&status) {
            return Ok(Reply {
                status,
                body: Vec::new(),
            });
        }
        let body = if chunked {
            self.read_chunked().await?
        } else {
            let Some(n) = length else {
                return Err(bad("answer without a length"));
            };
            if n > REPLY_BYTES_MAX {
                return Err(bad("answer too large"));
            }
            while self.buf.len() < n {
                self.fill().await?;
            }
            self.buf.drain(..n).collect()
        };
        Ok(Reply { status, body })
    }

    async fn read_chunked(&mut self) -> io::Result<Vec<u8>> {
        let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                if self.buf.len() > 1024 {
                    return Err(bad("malformed chunk"));
                }
                self.fill().await?;
            };
            let size_txt = std::str::from_utf8(&self.buf[..line_end]).map_err(|_| bad("chunk"))?;
            let size_txt = size_txt.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(size_txt, 16).map_err(|_| bad("chunk size"))?;
            self.buf.drain(..line_end + 2);
            if body.len() + size > REPLY_BYTES_MAX {
                return Err(bad("answer too large"));
            }
            while self.buf.len() < size + 2 {
                self.fill().await?;
            }
            body.extend_from_slice(&self.buf[..size]);
            self.buf.drain(..size + 2);
            if size == 0 {
                return Ok(body);
            }
        }
    }
}
