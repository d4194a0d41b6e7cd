//! HTTP/1.1 client wire format for the generator: writing requests into a reusable buffer and
//! parsing one response (Content-Length or chunked) from the bytes read so far.
//!
//! Owns byte formats only: never touches sockets or clocks. Every size read from the wire is
//! bounded (`RESPONSE_BYTES_MAX`, `RESPONSE_HEADERS_MAX`) before use.

use std::net::{SocketAddr, ToSocketAddrs};

/// Largest response (headers + body) the generator accepts; a consume of 100 messages of 1 MiB
/// would exceed it, the benchmark's payloads never do.
pub const RESPONSE_BYTES_MAX: usize = 16 << 20;
/// Most response headers parsed.
pub const RESPONSE_HEADERS_MAX: usize = 32;

/// Where requests go: socket address plus the header values every request carries.
#[derive(Clone, Debug)]
pub struct Target {
    pub addr: SocketAddr,
    pub host: String,
    /// Value of an `Authorization` header, if any.
    pub authorization: Option<String>,
}

impl Target {
    /// Parses `http://host:port` (a trailing `/` allowed; no path, no TLS).
    pub fn parse(url: &str) -> Result<Target, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("url {url:?}: the load generator speaks plain http:// only (point it at the broker, not a TLS front)"))?;
        let hostport = rest.trim_end_matches('/');
        if hostport.is_empty() || hostport.contains('/') {
            return Err(format!("url {url:?}: want http://host:port without a path"));
        }
        let with_port = if hostport
            .rsplit_once(':')
            .is_some_and(|(_, p)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        {
            hostport.to_string()
        } else {
            format!("{hostport}:80")
        };
        let addr = with_port
            .to_socket_addrs()
            .map_err(|e| format!("url {url:?}: {e}"))?
            .next()
            .ok_or_else(|| format!("url {url:?}: no address"))?;
        Ok(Target {
            addr,
            host: hostport.to_string(),
            authorization: None,
        })
    }

    pub fn from_addr(addr: SocketAddr) -> Target {
        Target {
            addr,
            host: addr.to_string(),
            authorization: None,
        }
    }
}

/// Appends one request to `out`. `content_type` is sent only with a body.
pub fn write_request(
    out: &mut Vec<u8>,
    target: &Target,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &[u8],
) {
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    out.extend_from_slice(target.host.as_bytes());
    out.extend_from_slice(b"\r\nX-Narad-Client: narad-bench\r\n");
    if let Some(a) = &target.authorization {
        out.extend_from_slice(b"Authorization: ");
        out.extend_from_slice(a.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Some(ct) = content_type {
        out.extend_from_slice(b"Content-Type: ");
        out.extend_from_slice(ct.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if method != "GET" || !body.is_empty() {
        out.extend_from_slice(b"Content-Length: ");
        out.extend_from_slice(body.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
}

/// A complete response found at the start of a buffer.
#[derive(Debug)]
pub struct Parsed {
    pub status: u16,
    /// Bytes of the buffer this response used.
    pub consumed: usize,
    /// Body location in the buffer (Content-Length responses), or the decoded chunked body.
    pub body: Body,
    /// The server said `Connection: close`.
    pub close: bool,
}

#[derive(Debug)]
pub enum Body {
    Range(usize, usize),
    Owned(Vec<u8>),
}

impl Parsed {
    pub fn body<'a>(&'a self, buf: &'a [u8]) -> &'a [u8] {
        match &self.body {
            Body::Range(a, b) => &buf[*a..*b],
            Body::Owned(v) => v,
        }
    }
}

/// Parses one response from `buf`. `Ok(None)`: more bytes needed. `Err`: the bytes are not a
/// response the generator can use (the connection must be dropped).
pub fn parse_response(buf: &[u8], head_request: bool) -> Result<Option<Parsed>, String> {
    let mut headers = [httparse::EMPTY_HEADER; RESPONSE_HEADERS_MAX];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            if buf.len() > RESPONSE_BYTES_MAX {
                return Err("response head too large".into());
            }
            return Ok(None);
        }
        Err(e) => return Err(format!("bad response: {e}")),
    };
    let status = resp.code.unwrap_or(0);
    let mut content_length: Option<usize> = None;
    let mut chunked = false;
    let mut close = false;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(h.value)
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .ok_or("bad content-length")?;
            if v > RESPONSE_BYTES_MAX {
                return Err(format!("response body of {v} bytes exceeds the maximum"));
            }
            content_length = Some(v);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = h
                .value
                .split(|b| *b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if h.name.eq_ignore_ascii_case("connection") {
            close = h.value.trim_ascii().eq_ignore_ascii_case(b"close");
        }
    }
    let bodyless = head_request || status == 204 || status == 304 || (100..200).contains(&status);
    if bodyless {
        return Ok(Some(Parsed {
            status,
            consumed: head_len,
            body: Body::Range(head_len, head_len),
            close,
        }));
    }
    if chunked {
        return match decode_chunked(&buf[head_len..])? {
            None => Ok(None),
            Some((body, used)) => Ok(Some(Parsed {
                status,
                consumed: head_len + used,
                body: Body::Owned(body),
                close,
            })),
        };
    }
    match content_length {
        Some(n) => {
            if buf.len() < head_len + n {
                return Ok(None);
            }
            Ok(Some(Parsed {
                status,
                consumed: head_len + n,
                body: Body::Range(head_len, head_len + n),
                close,
            }))
        }
        // Without a length the body runs to the end of the connection: the generator keeps
        // connections alive, so it refuses such a response.
        None => Err("response without Content-Length or chunked encoding".into()),
    }
}

/// Decodes a chunked body. `Ok(None)` when incomplete; on success the body and the bytes used.
fn decode_chunked(mut b: &[u8]) -> Result<Option<(Vec<u8>, usize)>, String> {
    let start_len = b.len();
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let line = std::str::from_utf8(&b[..eol]).map_err(|_| "bad chunk size")?;
        let size_text = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| "bad chunk size")?;
        if out.len() + size > RESPONSE_BYTES_MAX {
            return Err("chunked body exceeds the maximum".into());
        }
        b = &b[eol + 2..];
        if size == 0 {
            // Trailers (none expected) end with an empty line.
            let Some(end) = b.windows(2).position(|w| w == b"\r\n") else {
                return Ok(None);
            };
            if end != 0 {
                return Err("chunked trailers are not supported".into());
            }
            b = &b[2..];
            return Ok(Some((out, start_len - b.len())));
        }
        if b.len() < size + 2 {
            return Ok(None);
        }
        out.extend_from_slice(&b[..size]);
        if &b[size..size + 2] != b"\r\n" {
            return Err("chunk not followed by CRLF".into());
        }
        b = &b[size + 2..];
    }
}

/// Sends one request on a fresh blocking connection and returns status and body: for set-up
/// calls (topic creation), not for load.
pub fn one_shot(
    target: &Target,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &[u8],
    timeout: std::time::Duration,
) -> Result<(u16, Vec<u8>), String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&target.addr, timeout)
        .map_err(|e| format!("connect {}: {e}", target.addr))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let mut req = Vec::new();
    write_request(&mut req, target, method, path, content_type, body);
    s.write_all(&req).map_err(|e| format!("send: {e}"))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 << 10];
    loop {
        if let Some(p) = parse_response(&buf, method == "HEAD")? {
            let body = p.body(&buf).to_vec();
            return Ok((p.status, body));
        }
        let n = s.read(&mut chunk).map_err(|e| format!("receive: {e}"))?;
        if n == 0 {
            return Err("connection closed before a full response".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_content_length_partial_and_complete() {
        // Proves a response is reported incomplete until its last body byte arrives, and that
        // the consumed length and body range are exact.
        let full = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA";
        for cut in 0..full.len() - 5 {
            assert!(
                parse_response(&full[..cut], false).unwrap().is_none(),
                "cut {cut}"
            );
        }
        let p = parse_response(full, false).unwrap().unwrap();
        assert_eq!(p.status, 200);
        assert_eq!(p.body(full), b"hello");
        assert_eq!(p.consumed, full.len() - 5);
        assert!(!p.close);
    }

    #[test]
    fn parses_chunked_and_bodyless() {
        // Proves chunked bodies are decoded (with extensions), 204/202-with-zero-length need
        // no body, and Connection: close is reported.
        let c = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=1\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert!(parse_response(&c[..c.len() - 1], false).unwrap().is_none());
        let p = parse_response(c, false).unwrap().unwrap();
        assert_eq!(p.body(c), b"abcde");
        assert_eq!(p.consumed, c.len());
        let n = b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n";
        let p = parse_response(n, false).unwrap().unwrap();
        assert_eq!((p.status, p.consumed, p.close), (204, n.len(), true));
        let a = b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(parse_response(a, false).unwrap().unwrap().status, 202);
    }

    #[test]
    fn rejects_garbage_and_oversize() {
        // Proves malformed heads, lengthless bodies and oversize lengths are errors, not waits.
        assert!(parse_response(b"NOT HTTP\r\n\r\n", false).is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\n\r\nabc", false).is_err());
        let big = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
            RESPONSE_BYTES_MAX + 1
        );
        assert!(parse_response(big.as_bytes(), false).is_err());
    }

    #[test]
    fn writes_requests_and_parses_urls() {
        // Proves the request bytes carry the guard header, type and length, and URLs parse.
        let t = Target::parse("http://127.0.0.1:7942/").unwrap();
        assert_eq!(t.addr.port(), 7942);
        assert!(Target::parse("https://x:1").is_err());
        assert!(Target::parse("http://127.0.0.1:1/v1").is_err());
        let mut out = Vec::new();
        write_request(
            &mut out,
            &t,
            "POST",
            "/v1/topics/a/produce",
            Some("application/octet-stream"),
            b"xy",
        );
        let s = String::from_utf8(out).unwrap();
        assert!(s.starts_with("POST /v1/topics/a/produce HTTP/1.1\r\nHost: 127.0.0.1:7942\r\n"));
        assert!(s.contains("X-Narad-Client: narad-bench\r\n"));
        assert!(s.contains("Content-Type: application/octet-stream\r\nContent-Length: 2\r\n\r\nxy"));
    }
}
