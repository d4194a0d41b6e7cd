//! Response encoding into a reused per-connection buffer: status line, the service's header
//! fields (refusing any that could split the response), `Date` (formatted once per second per
//! shard), `Content-Length`, `Connection`, then the body. Never writes to a socket itself.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

use super::Response;

/// How the connection continues after this response, which decides the `Connection` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionHeader {
    /// HTTP/1.1 keep-alive: no field needed.
    Default,
    /// HTTP/1.0 client that asked for keep-alive.
    KeepAlive,
    /// The server closes after this response.
    Close,
}

pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Request Entity Too Large",
        415 => "Unsupported Media Type",
        417 => "Expectation Failed",
        421 => "Misdirected Request",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        499 => "Client Closed Request",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Unknown",
    }
}

/// True for statuses that never carry a body (RFC 9110 §6.4.1).
pub fn status_has_no_body(status: u16) -> bool {
    (100..200).contains(&status) || status == 204 || status == 304
}

fn header_is_safe(name: &str, value: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_graphic() && b != b':')
        && !value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0)
}

/// Appends the encoded `resp` to `out`. With `head_only` (a HEAD request) the body is left out
/// but `Content-Length` still gives its length.
pub fn encode(out: &mut Vec<u8>, resp: &Response, head_only: bool, conn: ConnectionHeader) {
    let status = if (100..1000).contains(&resp.status) {
        resp.status
    } else {
        500
    };
    out.extend_from_slice(b"HTTP/1.1 ");
    crate::wire::push_u64(out, u64::from(status));
    out.push(b' ');
    out.extend_from_slice(reason(status).as_bytes());
    out.extend_from_slice(b"\r\n");
    let mut has_date = false;
    for (name, value) in &resp.headers {
        if name.eq_ignore_ascii_case("content-length")
            || name.eq_ignore_ascii_case("transfer-encoding")
            || name.eq_ignore_ascii_case("connection")
        {
            continue;
        }
        if !header_is_safe(name, value) {
            debug_assert!(false, "unsafe response header {name:?}");
            continue;
        }
        has_date |= name.eq_ignore_ascii_case("date");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !has_date {
        out.extend_from_slice(b"Date: ");
        push_date(out);
        out.extend_from_slice(b"\r\n");
    }
    let no_body = status_has_no_body(status);
    if !no_body {
        out.extend_from_slice(b"Content-Length: ");
        crate::wire::push_u64(out, resp.body.len() as u64);
        out.extend_from_slice(b"\r\n");
    }
    match conn {
        ConnectionHeader::Default => {}
        ConnectionHeader::KeepAlive => out.extend_from_slice(b"Connection: keep-alive\r\n"),
        ConnectionHeader::Close => out.extend_from_slice(b"Connection: close\r\n"),
    }
    out.extend_from_slice(b"\r\n");
    if !no_body && !head_only {
        out.extend_from_slice(&resp.body);
    }
}

thread_local! {
    /// (Unix second, IMF-fixdate of it): formatted once per second per shard.
    static DATE: RefCell<(u64, [u8; 29])> = const { RefCell::new((u64::MAX, [0; 29])) };
}

fn push_date(out: &mut Vec<u8>) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    DATE.with(|d| {
        let mut d = d.borrow_mut();
        if d.0 != now {
            *d = (now, imf_fixdate(now));
        }
        out.extend_from_slice(&d.1);
    });
}

/// `Sun, 06 Nov 1994 08:49:37 GMT` for a Unix time in seconds.
pub fn imf_fixdate(secs: u64) -> [u8; 29] {
    const DAYS: [&[u8; 3]; 7] = [b"Thu", b"Fri", b"Sat", b"Sun", b"Mon", b"Tue", b"Wed"];
    const MONTHS: [&[u8; 3]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    let days = secs / 86_400;
    let sod = secs % 86_400;
    let (year, month, day) = crate::wire::civil::civil_from_days(days as i64);
    let mut b = [b' '; 29];
    b[..3].copy_from_slice(DAYS[(days % 7) as usize]);
    b[3] = b',';
    let two = |b: &mut [u8], at: usize, v: i64| {
        b[at] = b'0' + (v / 10 % 10) as u8;
        b[at + 1] = b'0' + (v % 10) as u8;
    };
    two(&mut b, 5, day);
    b[8..11].copy_from_slice(MONTHS[(month - 1) as usize]);
    let y = year.clamp(0, 9999);
    two(&mut b, 12, y / 100);
    two(&mut b, 14, y % 100);
    two(&mut b, 17, (sod / 3600) as i64);
    b[19] = b':';
    two(&mut b, 20, (sod / 60 % 60) as i64);
    b[22] = b':';
    two(&mut b, 23, (sod % 60) as i64);
    b[26..29].copy_from_slice(b"GMT");
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(resp: &Response, head: bool, conn: ConnectionHeader) -> String {
        let mut out = Vec::new();
        encode(&mut out, resp, head, conn);
        let s = String::from_utf8(out).expect("utf8");
        // Drop the Date line, which changes every second.
        s.lines()
            .filter(|l| !l.starts_with("Date: "))
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn encodes_status_headers_length_and_body() {
        // Proves the wire form of a JSON response, of HEAD (length kept, body dropped), of 204
        // (no Content-Length), of Connection handling, and that unsafe headers are not written.
        let r = Response::json(202, &b"{}\n"[..]).with_header("Retry-After", "1");
        assert_eq!(
            enc(&r, false, ConnectionHeader::Default),
            "HTTP/1.1 202 Accepted\nContent-Type: application/json\nRetry-After: 1\nContent-Length: 3\n\n{}"
        );
        assert_eq!(
            enc(&r, true, ConnectionHeader::Close),
            "HTTP/1.1 202 Accepted\nContent-Type: application/json\nRetry-After: 1\nContent-Length: 3\nConnection: close\n"
        );
        let nc = Response::empty(204).with_header("Content-Length", "99");
        assert_eq!(
            enc(&nc, false, ConnectionHeader::KeepAlive),
            "HTTP/1.1 204 No Content\nConnection: keep-alive\n"
        );
        let mut out = Vec::new();
        encode(
            &mut out,
            &Response::empty(200),
            false,
            ConnectionHeader::Default,
        );
        assert!(String::from_utf8_lossy(&out).contains("\r\nDate: "));
        assert!(out.ends_with(b"Content-Length: 0\r\n\r\n"));
    }

    #[test]
    fn date_format_matches_known_instants() {
        // Proves the IMF-fixdate formatter against fixed instants (RFC 9110's example, the
        // epoch, a leap day).
        assert_eq!(&imf_fixdate(784_111_777), b"Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(&imf_fixdate(0), b"Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(
            &imf_fixdate(1_709_164_800),
            b"Thu, 29 Feb 2024 00:00:00 GMT"
        );
    }
}
