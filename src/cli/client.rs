//! A small blocking HTTP/1.1 client with keep-alive, for the CLI: one connection to one broker,
//! reused across requests, responses parsed with httparse.
//!
//! Owns: the socket, request framing (Host, Content-Length, Basic auth, `X-Narad-Client` on
//! every request), response framing (Content-Length, chunked, or read-to-close) and the limits on
//! what it will buffer. Never does: TLS, redirects, retries of a request that reached the server
//! (only a request on a reused connection that the server had already closed is resent once,
//! before any byte of an answer arrived), or any interpretation of statuses.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
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

/// Where the broker is: from `http://host:port[/prefix]` or `host:port`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    /// Path prefix without a trailing slash (usually empty).
    pub prefix: String,
}

impl Endpoint {
    pub fn parse(url: &str) -> Result<Endpoint, String> {
        let rest = if let Some(r) = url.strip_prefix("http://") {
            r
        } else if url.starts_with("https://") {
            return Err(format!(
                "{url}: https is not supported by this CLI; terminate TLS in front of it or use http://"
            ));
        } else if url.contains("://") {
            return Err(format!("{url}: only http:// URLs are supported"));
        } else {
            url
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
            80
        } else {
            port.parse::<u16>()
                .map_err(|_| format!("{url}: bad port {port:?}"))?
        };
        Ok(Endpoint {
            host,
            port,
            prefix: path.to_string(),
        })
    }

    /// Whether the host is this machine (loopback), where plain-text credentials stay local.
    pub fn is_local(&self) -> bool {
        let h = self.host.as_str();
        h.eq_ignore_ascii_case("localhost")
            || h.parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }

    fn host_header(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    fn addrs(&self) -> Result<Vec<SocketAddr>, TransportError> {
        (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map(|a| a.collect())
            .map_err(|e| TransportError(format!("cannot resolve {}: {e}", self.host)))
    }
}

/// One keep-alive connection to a broker.
pub struct Client {
    endpoint: Endpoint,
    /// `Basic ...` when a user was given.
    authorization: Option<String>,
    client_name: String,
    conn: Option<BufReader<TcpStream>>,
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
        }
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The `Authorization` header value, if any (for `narad bench`).
    pub fn authorization(&self) -> Option<&str> {
        self.authorization.as_deref()
    }

    fn connect(&self) -> Result<BufReader<TcpStream>, TransportError> {
        let mut last = None;
        for addr in self.endpoint.addrs()? {
            match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    s.set_write_timeout(Some(WRITE_TIMEOUT))
                        .map_err(|e| TransportError(e.to_string()))?;
                    return Ok(BufReader::with_capacity(64 << 10, s));
                }
                Err(e) => last = Some(e),
            }
        }
        Err(TransportError(format!(
            "cannot connect to {}: {}",
            self.endpoint.host_header(),
            last.map(|e| e.to_string())
                .unwrap_or_else(|| "no address".into())
        )))
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
        let io =
            |e: std::io::Error| TransportError(format!("{}: {e}", self.endpoint.host_header()));
        conn.get_ref()
            .set_read_timeout(Some(wait + READ_SLACK))
            .map_err(|e| (io(e), true))?;
        let s = conn.get_mut();
        if let Err(e) = s.write_all(head).and_then(|_| s.write_all(body)) {
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
    conn: &mut BufReader<TcpStream>,
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
fn read_chunked(conn: &mut BufReader<TcpStream>) -> std::io::Result<Vec<u8>> {
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
        assert!(Endpoint::parse("https://x:1").is_err());
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
