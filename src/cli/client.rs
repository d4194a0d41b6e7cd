//! A small blocking HTTP/1.1 client with keep-alive, for the CLI: one connection to one broker,
//! reused across requests, responses parsed with httparse.
//!
//! Owns: the socket, TLS for `https://` servers (rustls; the system's CA roots, or the PEM file
//! named by `SSL_CERT_FILE` / the directories in `SSL_CERT_DIR`; the certificate is always
//! verified), request framing (Host, Content-Length, Basic auth, `X-Narad-Client` on every
//! request), response framing (Content-Length, chunked, or read-to-close) and the limits on what
//! it will buffer. Never does: redirects, retries of a request that reached the server (only a
//! request on a reused connection that the server had already closed is resent once, before any
//! byte of an answer arrived), or any interpretation of statuses.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

/// Largest response header block accepted.
pub const RESPONSE_HEAD_BYTES_MAX: usize = 64 << 10;
/// Largest response body accepted (a batch consume answer is at most 8 MiB).
pub const RESPONSE_BODY_BYTES_MAX: usize = 32 << 20;
/// Headers parsed per response at most.
const RESPONSE_HEADERS_MAX: usize = 64;
/// Connect timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Read timeout beyond a request's own long-poll wait.
const READ_SLACK: Duration = Duration::from_secs(30);
/// Write timeout of one request.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a request got no HTTP answer. Exit code 2 territory.
#[derive(Debug)]
pub struct TransportError(pub String);

impl std::fmt::Display for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Whether this is the router's plain-text `404 page not found` (API.md §1.3): the server
    /// has no such route, as opposed to a JSON `404` about a missing topic or user.
    pub fn is_route_missing(&self) -> bool {
        self.status == 404 && self.body.trim_ascii() == b"404 page not found"
    }

    /// The `error` text of a JSON error body, else the body as text (API.md §1.3).
    pub fn error_text(&self) -> String {
        #[derive(serde::Deserialize)]
        struct E {
            error: String,
        }
        match serde_json::from_slice::<E>(&self.body) {
            Ok(e) => e.error,
            Err(_) => {
                let t = String::from_utf8_lossy(&self.body).trim().to_string();
                if t.is_empty() {
                    format!("HTTP {}", self.status)
                } else {
                    t
                }
            }
        }
    }
}

/// Where the broker is: from `http[s]://host[:port][/prefix]` or `host:port`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    /// Path prefix without a trailing slash (usually empty).
    pub prefix: String,
    /// `https://`: TLS to the server (a TLS-terminating ingress or load balancer in front of it).
    pub tls: bool,
}

impl Endpoint {
    pub fn parse(url: &str) -> Result<Endpoint, String> {
        let (rest, tls) = if let Some(r) = url.strip_prefix("http://") {
            (r, false)
        } else if let Some(r) = url.strip_prefix("https://") {
            (r, true)
        } else if url.contains("://") {
            return Err(format!(
                "{url}: only http:// and https:// URLs are supported"
            ));
        } else {
            (url, false)
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if authority.contains('@') {
            return Err(format!(
                "{url}: put credentials in --user/--password, not the URL"
            ));
        }
        let (host, port) = if let Some(h) = authority.strip_prefix('[') {
            // [v6]:port
            let (h, p) = h
                .split_once(']')
                .ok_or_else(|| format!("{url}: bad IPv6 address"))?;
            (h.to_string(), p.strip_prefix(':').unwrap_or(""))
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p),
                None => (authority.to_string(), ""),
            }
        };
        if host.is_empty() {
            return Err(format!("{url}: no host"));
        }
        let port = if port.is_empty() {
            if tls {
                443
            } else {
                80
            }
        } else {
            port.parse::<u16>()
                .map_err(|_| format!("{url}: bad port {port:?}"))?
        };
        Ok(Endpoint {
            host,
            port,
            prefix: path.to_string(),
            tls,
        })
    }

    /// The URL this endpoint was parsed from, in canonical form.
    pub fn url(&self) -> String {
        format!(
            "{}://{}{}",
            if self.tls { "https" } else { "http" },
            self.host_header(),
            self.prefix
        )
    }

    /// Whether the host is this machine (loopback), where plain-text credentials stay local.
    pub fn is_local(&self) -> bool {
        let h = self.host.as_str();
        h.eq_ignore_ascii_case("localhost")
            || h.parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }

    /// The host as it stands in a URL (an IPv6 address in brackets).
    fn url_host(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        }
    }

    /// `host:port` always, for messages.
    fn authority(&self) -> String {
        format!("{}:{}", self.url_host(), self.port)
    }

    /// `host:port` (the port left out when it is the scheme's default, as curl and Go do:
    /// ingresses route on the name).
    fn host_header(&self) -> String {
        if self.port == if self.tls { 443 } else { 80 } {
            self.url_host()
        } else {
            self.authority()
        }
    }

    fn addrs(&self) -> Result<Vec<SocketAddr>, TransportError> {
        (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map(|a| a.collect())
            .map_err(|e| TransportError(format!("cannot resolve {}: {e}", self.host)))
    }
}

/// A connection: plain TCP, or TLS over TCP.
enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => &s.sock,
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// The TLS client settings: TLS 1.2 or 1.3, the certificate verified against the trusted roots
/// (`SSL_CERT_FILE` / `SSL_CERT_DIR` when set, else the system's store).
fn tls_config() -> Result<Arc<rustls::ClientConfig>, TransportError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found
            .errors
            .first()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        return Err(TransportError(format!(
            "no trusted CA certificates to verify the server with{why} (install the system's \
             CA certificates, or name a PEM file with SSL_CERT_FILE)"
        )));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TransportError(format!("TLS setup: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// One keep-alive connection to a broker.
pub struct Client {
    endpoint: Endpoint,
    /// `Basic ...` when a user was given.
    authorization: Option<String>,
    client_name: String,
    conn: Option<BufReader<Stream>>,
    /// Built on the first https connection.
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl Client {
    pub fn new(endpoint: Endpoint, user: Option<&str>, password: Option<&str>) -> Client {
        let authorization = user.map(|u| {
            let cred = format!("{u}:{}", password.unwrap_or(""));
            format!("Basic {}", crate::wire::base64::encode(cred.as_bytes()))
        });
        Client {
            endpoint,
            authorization,
            client_name: format!("narad-cli/{}", env!("CARGO_PKG_VERSION")),
            conn: None,
            tls: None,
        }
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The `Authorization` header value, if any (for `narad bench`).
    pub fn authorization(&self) -> Option<&str> {
        self.authorization.as_deref()
    }

    fn connect(&mut self) -> Result<BufReader<Stream>, TransportError> {
        let mut last = None;
        for addr in self.endpoint.addrs()? {
            match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    s.set_write_timeout(Some(WRITE_TIMEOUT))
                        .map_err(|e| TransportError(e.to_string()))?;
                    let stream = if self.endpoint.tls {
                        Stream::Tls(Box::new(self.handshake(s)?))
                    } else {
                        Stream::Plain(s)
                    };
                    return Ok(BufReader::with_capacity(64 << 10, stream));
                }
                Err(e) => last = Some(e),
            }
        }
        Err(TransportError(format!(
            "cannot connect to {}: {}",
            self.endpoint.authority(),
            last.map(|e| e.to_string())
                .unwrap_or_else(|| "no address".into())
        )))
    }

    /// Completes the TLS handshake on a fresh socket, so that a certificate the client does not
    /// trust is reported as such before any request is sent.
    fn handshake(
        &mut self,
        mut sock: TcpStream,
    ) -> Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>, TransportError> {
        let config = match &self.tls {
            Some(c) => c.clone(),
            None => self.tls.insert(tls_config()?).clone(),
        };
        let name = rustls::pki_types::ServerName::try_from(self.endpoint.host.clone())
            .map_err(|e| TransportError(format!("{}: {e}", self.endpoint.host)))?;
        let failed = |e: &dyn std::fmt::Display| {
            TransportError(format!(
                "TLS handshake with {} failed: {e}",
                self.endpoint.authority()
            ))
        };
        let mut conn = rustls::ClientConnection::new(config, name).map_err(|e| failed(&e))?;
        sock.set_read_timeout(Some(CONNECT_TIMEOUT))
            .map_err(|e| failed(&e))?;
        while conn.is_handshaking() {
            conn.complete_io(&mut sock).map_err(|e| {
                let bad_cert = e.get_ref().is_some_and(|i| {
                    matches!(
                        i.downcast_ref::<rustls::Error>(),
                        Some(rustls::Error::InvalidCertificate(_))
                    )
                });
                if bad_cert {
                    failed(&format!(
                        "{e} (trusted CAs: the PEM file SSL_CERT_FILE names and the \
                         directories in SSL_CERT_DIR when set, else the system's store)"
                    ))
                } else {
                    failed(&e)
                }
            })?;
        }
        Ok(rustls::StreamOwned::new(conn, sock))
    }

    /// Sends one request and reads its answer. `path` starts with `/` and may carry a query;
    /// `wait` is the long-poll budget the server may hold the request for.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: &[u8],
        wait: Duration,
    ) -> Result<Response, TransportError> {
        let head = self.head(method, path, content_type, body.len());
        let reused = self.conn.is_some();
        match self.attempt(&head, body, method == "HEAD", wait) {
            Ok(r) => Ok(r),
            // The server may have closed an idle kept-alive connection: resend once on a fresh
            // one, only when nothing of an answer arrived.
            Err((e, answered)) if reused && !answered => {
                let _ = e;
                self.conn = None;
                self.attempt(&head, body, method == "HEAD", wait)
                    .map_err(|(e, _)| e)
            }
            Err((e, _)) => Err(e),
        }
    }

    fn head(&self, method: &str, path: &str, content_type: Option<&str>, len: usize) -> Vec<u8> {
        let mut h = format!(
            "{method} {}{path} HTTP/1.1\r\nHost: {}\r\nX-Narad-Client: {}\r\nUser-Agent: {}\r\n",
            self.endpoint.prefix,
            self.endpoint.host_header(),
            self.client_name,
            self.client_name
        );
        if let Some(a) = &self.authorization {
            h.push_str(&format!("Authorization: {a}\r\n"));
        }
        if let Some(ct) = content_type {
            h.push_str(&format!("Content-Type: {ct}\r\n"));
        }
        if len > 0 || matches!(method, "POST" | "PUT" | "PATCH") {
            h.push_str(&format!("Content-Length: {len}\r\n"));
        }
        h.push_str("\r\n");
        h.into_bytes()
    }

    /// One try; on error also says whether any byte of an answer had arrived.
    fn attempt(
        &mut self,
        head: &[u8],
        body: &[u8],
        is_head: bool,
        wait: Duration,
    ) -> Result<Response, (TransportError, bool)> {
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => self.connect().map_err(|e| (e, true))?,
        };
        let io = |e: std::io::Error| TransportError(format!("{}: {e}", self.endpoint.authority()));
        conn.get_ref()
            .tcp()
            .set_read_timeout(Some(wait + READ_SLACK))
            .map_err(|e| (io(e), true))?;
        let s = conn.get_mut();
        // The flush sends what TLS still holds (a no-op on plain TCP).
        if let Err(e) = s
            .write_all(head)
            .and_then(|_| s.write_all(body))
            .and_then(|_| s.flush())
        {
            // A server may answer (413) and close before reading a large body: try the answer.
            match read_response(&mut conn, is_head) {
                Ok((r, _)) => return Ok(r),
                Err((_, answered)) => return Err((io(e), answered)),
            }
        }
        match read_response(&mut conn, is_head) {
            Ok((r, keep)) => {
                if keep {
                    self.conn = Some(conn);
                }
                Ok(r)
            }
            Err((e, answered)) => Err((io(e), answered)),
        }
    }
}

fn bad(msg: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.to_string())
}

/// Reads one response; returns it and whether the connection may be reused. On error, whether
/// any byte had arrived.
fn read_response(
    conn: &mut BufReader<Stream>,
    is_head: bool,
) -> Result<(Response, bool), (std::io::Error, bool)> {
    loop {
        let mut head = Vec::new();
        // Read the header block line by line up to the blank line, bounded.
        loop {
            let before = head.len();
            let n = conn
                .by_ref()
                .take((RESPONSE_HEAD_BYTES_MAX - before + 1) as u64)
                .read_until(b'\n', &mut head)
                .map_err(|e| {
                    // A timeout is not a closed idle connection: never resend after one.
                    let timed_out = matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    );
                    (e, before > 0 || timed_out)
                })?;
            if n == 0 {
                let e = std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "connection closed by the server",
                );
                return Err((e, before > 0));
            }
            if head.len() > RESPONSE_HEAD_BYTES_MAX {
                return Err((bad("response header block too large"), true));
            }
            if head.ends_with(b"\n\n") || head.ends_with(b"\r\n\r\n") {
                break;
            }
        }
        let mut hs = [httparse::EMPTY_HEADER; RESPONSE_HEADERS_MAX];
        let mut parsed = httparse::Response::new(&mut hs);
        match parsed.parse(&head) {
            Ok(httparse::Status::Complete(_)) => {}
            Ok(httparse::Status::Partial) => return Err((bad("incomplete response head"), true)),
            Err(e) => return Err((bad(&format!("bad response: {e}")), true)),
        }
        let status = parsed.code.unwrap_or(0);
        let http10 = parsed.version == Some(0);
        let headers: Vec<(String, String)> = parsed
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_string(),
                    String::from_utf8_lossy(h.value).trim().to_string(),
                )
            })
            .collect();
        let get = |n: &str| {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(n))
                .map(|(_, v)| v.as_str())
        };
        if (100..200).contains(&status) {
            continue;
        }
        let mut keep =
            !http10 && !get("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let no_body = is_head || status == 204 || status == 304;
        let body = if no_body {
            Vec::new()
        } else if get("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
        {
            read_chunked(conn).map_err(|e| (e, true))?
        } else if let Some(v) = get("content-length") {
            let len: usize = v.parse().map_err(|_| (bad("bad Content-Length"), true))?;
            if len > RESPONSE_BODY_BYTES_MAX {
                return Err((bad("response body too large"), true));
            }
            let mut b = vec![0; len];
            conn.read_exact(&mut b).map_err(|e| (e, true))?;
            b
        } else {
            keep = false;
            let mut b = Vec::new();
            conn.by_ref()
                .take(RESPONSE_BODY_BYTES_MAX as u64 + 1)
                .read_to_end(&mut b)
                .map_err(|e| (e, true))?;
            if b.len() > RESPONSE_BODY_BYTES_MAX {
                return Err((bad("response body too large"), true));
            }
            b
        };
        return Ok((
            Response {
                status,
                headers,
                body,
            },
            keep,
        ));
    }
}

/// Decodes a chunked body (trailers skipped), bounded by RESPONSE_BODY_BYTES_MAX.
fn read_chunked(conn: &mut BufReader<Stream>) -> std::io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut line = Vec::new();
        conn.by_ref().take(1024).read_until(b'\n', &mut line)?;
        let text = String::from_utf8_lossy(&line);
        let size_text = text
            .trim()
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_string();
        let size = usize::from_str_radix(&size_text, 16).map_err(|_| bad("bad chunk size"))?;
        if size == 0 {
            // Trailers up to the blank line.
            loop {
                let mut t = Vec::new();
                let n = conn.by_ref().take(8192).read_until(b'\n', &mut t)?;
                if n == 0 || t == b"\r\n" || t == b"\n" {
                    return Ok(body);
                }
            }
        }
        if body.len() + size > RESPONSE_BODY_BYTES_MAX {
            return Err(bad("response body too large"));
        }
        let start = body.len();
        body.resize(start + size, 0);
        conn.read_exact(&mut body[start..])?;
        let mut crlf = [0u8; 2];
        conn.read_exact(&mut crlf)?;
    }
}

/// Percent-encodes a path segment or query value.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_parsing() {
        let e = Endpoint::parse("http://127.0.0.1:7942").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.prefix.as_str()),
            ("127.0.0.1", 7942, "")
        );
        let e = Endpoint::parse("localhost:80/narad/").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.prefix.as_str()),
            ("localhost", 80, "/narad")
        );
        let e = Endpoint::parse("http://[::1]:9000").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("::1", 9000));
        let e = Endpoint::parse("https://broker.example/narad").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.prefix.as_str(), e.tls),
            ("broker.example", 443, "/narad", true)
        );
        assert_eq!(e.url(), "https://broker.example/narad");
        assert_eq!(e.host_header(), "broker.example");
        assert_eq!(e.authority(), "broker.example:443");
        let e = Endpoint::parse("https://[::1]:8443").unwrap();
        assert_eq!((e.port, e.host_header().as_str()), (8443, "[::1]:8443"));
        assert_eq!(
            Endpoint::parse("localhost").unwrap().url(),
            "http://localhost"
        );
        assert!(!Endpoint::parse("http://x:1").unwrap().tls);
        assert!(Endpoint::parse("ftp://x:1").is_err());
        assert!(Endpoint::parse("http://x:notaport").is_err());
        assert!(Endpoint::parse("http://u:p@x:1").is_err());
        assert!(Endpoint::parse("http://127.0.0.2:1").unwrap().is_local());
        assert!(Endpoint::parse("http://[::1]:1").unwrap().is_local());
        assert!(Endpoint::parse("localhost:1").unwrap().is_local());
        assert!(!Endpoint::parse("http://10.0.0.1:1").unwrap().is_local());
        assert!(!Endpoint::parse("http://broker.example:1")
            .unwrap()
            .is_local());
    }

    #[test]
    fn escaping() {
        assert_eq!(escape("a b/c%"), "a%20b%2Fc%25");
        assert_eq!(escape("orders-1.x_y"), "orders-1.x_y");
    }
}
