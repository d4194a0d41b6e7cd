//! The HTTP/1.1 request parser, on byte slices only (no socket), so that it can be unit-tested
//! and fuzzed: [`parse_head`] for the request line and headers (httparse), [`ChunkedDecoder`] for
//! chunked bodies, and [`parse_request`] that combines them on a complete buffer.
//!
//! Owns the framing rules: which requests have a body and how long it is, keep-alive, HEAD,
//! `Expect: 100-continue`, and the refusals (400, 413, 417, 431, 501). It never allocates more than
//! the bytes it was given plus bounded bookkeeping, never panics on any input, and never reads
//! past the request it parses (pipelined bytes stay in the caller's buffer).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use super::{Headers, Method, RequestHead};

/// Header fields parsed without an allocation; a request with more is parsed again with room
/// for every line it holds (only `http.max_header_bytes` bounds the count, as in Go).
pub const HEADER_FIELDS_INLINE: usize = 128;
/// Longest chunk-size line including extensions (beyond it: 400).
pub const CHUNK_LINE_BYTES_MAX: usize = 4096;
/// Hex digits in a chunk size (16 fit any u64).
const CHUNK_SIZE_DIGITS_MAX: u32 = 16;

/// Why a request cannot be served. Each maps to one response, after which the connection closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseError {
    /// The header block (request line + fields) is larger than allowed, or has too many fields:
    /// `431`.
    HeaderTooLarge,
    /// Malformed request line, header, framing or chunk: `400`.
    BadRequest(&'static str),
    /// The declared or decoded body exceeds the limit: `413`.
    BodyTooLarge,
    /// A `Transfer-Encoding` other than `chunked`: `501`.
    UnsupportedTransferEncoding,
    /// An `Expect` other than `100-continue`: `417`.
    ExpectationFailed,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParseError::HeaderTooLarge => f.write_str("request header fields too large"),
            ParseError::BadRequest(why) => write!(f, "bad request: {why}"),
            ParseError::BodyTooLarge => f.write_str("request body too large"),
            ParseError::UnsupportedTransferEncoding => f.write_str("unsupported transfer encoding"),
            ParseError::ExpectationFailed => f.write_str("unsupported expectation"),
        }
    }
}

impl std::error::Error for ParseError {}

/// How the body of a request is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    None,
    Length(u64),
    Chunked,
}

/// Bytes of empty lines (CR and LF) at the start of `buf`: before a request line they are
/// not part of a request (RFC 9112 §2.2).
pub fn blank_prefix(buf: &[u8]) -> usize {
    buf.iter()
        .take_while(|&&b| b == b'\r' || b == b'\n')
        .count()
}

/// When to parse a head that is still arriving. Parsing again on every read would cost O(n²)
/// for a head sent in small pieces (a 62 KB head sent 5 bytes at a time cost 1.4 s of CPU):
/// it is parsed again only when the new bytes may end it (an empty line), the buffer reached
/// `header_bytes_max`, or it doubled since the last parse (so a malformed start is still refused
/// before the head ends). Each byte is scanned once.
#[derive(Debug, Default)]
pub struct HeadWatch {
    /// Bytes seen by the last parse, which found the head incomplete.
    parsed: usize,
    /// Bytes searched for an empty line.
    scanned: usize,
}

impl HeadWatch {
    /// Whether `buf` (the head so far, from its first byte) is worth a [`parse_head`] now.
    pub fn worth_parsing(&mut self, buf: &[u8], header_bytes_max: usize) -> bool {
        let due = self.parsed == 0
            || buf.len() >= header_bytes_max
            || buf.len() >= self.parsed.saturating_mul(2);
        // An empty line is "\n\n" or "\n\r\n": look from the last two bytes already searched.
        let tail = &buf[self.scanned.saturating_sub(2).min(buf.len())..];
        self.scanned = buf.len();
        due || tail.windows(2).any(|w| w == b"\n\n") || tail.windows(3).any(|w| w == b"\n\r\n")
    }

    /// [`parse_head`] found the first `len` bytes incomplete.
    pub fn incomplete(&mut self, len: usize) {
        self.parsed = len;
    }
}

/// Parses the request line and header fields at the start of `buf`.
///
/// `Ok(None)`: incomplete, read more (unless `buf` already holds `header_bytes_max` bytes, which
/// is reported as [`ParseError::HeaderTooLarge`]). `Ok(Some((head, n)))`: the head took the first
/// `n` bytes; the body (if any) follows.
pub fn parse_head(
    buf: &[u8],
    header_bytes_max: usize,
    peer: SocketAddr,
) -> Result<Option<(RequestHead, usize)>, ParseError> {
    // Leading empty lines before a request line are tolerated (RFC 9112 §2.2), within the limit.
    let skip = blank_prefix(buf);
    if skip > 64 {
        return Err(ParseError::BadRequest("empty lines before request"));
    }
    let input = &buf[skip..];
    let mut inline = [httparse::EMPTY_HEADER; HEADER_FIELDS_INLINE];
    let mut spilled: Vec<httparse::Header<'_>>;
    let mut req = httparse::Request::new(&mut inline);
    let mut parsed = req.parse(input);
    if let Err(httparse::Error::TooManyHeaders) = parsed {
        // Every field ends a line: as many slots as lines always suffice. The header bytes
        // seen so far are bounded by the read buffer, so this is too.
        spilled = vec![httparse::EMPTY_HEADER; input.iter().filter(|&&b| b == b'\n').count() + 1];
        req = httparse::Request::new(&mut spilled);
        parsed = req.parse(input);
    }
    let status = match parsed {
        Ok(s) => s,
        Err(httparse::Error::TooManyHeaders) => return Err(ParseError::HeaderTooLarge),
        Err(_) => {
            // A header block that is still growing past the limit is 431 even if the part seen
            // so far is malformed in a way httparse reports first (e.g. an over-long token).
            return Err(ParseError::BadRequest("malformed request line or header"));
        }
    };
    let head_len = match status {
        httparse::Status::Partial => {
            if buf.len() >= header_bytes_max {
                return Err(ParseError::HeaderTooLarge);
            }
            return Ok(None);
        }
        httparse::Status::Complete(n) => n,
    };
    if skip + head_len > header_bytes_max {
        return Err(ParseError::HeaderTooLarge);
    }
    let method_str = req.method.unwrap_or("");
    let target = req.path.unwrap_or("");
    let minor = req.version.unwrap_or(1);

    let (method, head) = match Method::parse(method_str) {
        Method::Head => (Method::Get, true),
        m => (m, false),
    };
    let target = origin_form(target)?;
    let (path, query) = match target.find('?') {
        Some(i) => (&target[..i], &target[i + 1..]),
        None => (target, ""),
    };
    if crate::wire::query::path_decode(path.as_bytes()).is_err() {
        // As Go's server does when the request URI does not parse: `400 Bad Request`.
        return Err(ParseError::BadRequest("invalid URL escape in the path"));
    }

    let mut framing = BodyFraming::None;
    let mut content_length: Option<u64> = None;
    let mut chunked = false;
    let mut expect_continue = false;
    let mut conn_close = false;
    let mut conn_keep_alive = false;
    let header_bytes: usize = req
        .headers
        .iter()
        .map(|h| h.name.len() + h.value.len())
        .sum();
    let mut headers = Headers::with_capacity(req.headers.len(), header_bytes);
    for h in req.headers.iter() {
        let name = h.name;
        let value = h.value;
        if name.eq_ignore_ascii_case("content-length") {
            let n = parse_content_length(value)?;
            if content_length.is_some_and(|c| c != n) {
                return Err(ParseError::BadRequest("conflicting Content-Length"));
            }
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            if chunked || !trim(value).eq_ignore_ascii_case(b"chunked") {
                return Err(ParseError::UnsupportedTransferEncoding);
            }
            chunked = true;
        } else if name.eq_ignore_ascii_case("connection") {
            for token in value.split(|&b| b == b',') {
                let t = trim(token);
                if t.eq_ignore_ascii_case(b"close") {
                    conn_close = true;
                } else if t.eq_ignore_ascii_case(b"keep-alive") {
                    conn_keep_alive = true;
                }
            }
        } else if name.eq_ignore_ascii_case("expect") {
            if trim(value).eq_ignore_ascii_case(b"100-continue") {
                expect_continue = true;
            } else {
                return Err(ParseError::ExpectationFailed);
            }
        }
        headers.push(name, value);
    }
    if chunked {
        if content_length.is_some() {
            // Both framings at once is the classic request-smuggling shape: refuse it.
            return Err(ParseError::BadRequest(
                "both Content-Length and Transfer-Encoding",
            ));
        }
        if minor == 0 {
            return Err(ParseError::BadRequest("chunked encoding in HTTP/1.0"));
        }
        framing = BodyFraming::Chunked;
    } else if let Some(n) = content_length {
        if n > 0 {
            framing = BodyFraming::Length(n);
        }
    }
    let keep_alive = if minor == 0 {
        conn_keep_alive && !conn_close
    } else {
        !conn_close
    };
    // Expect only means something when there is a body to wait for, and only in HTTP/1.1.
    let expect_continue = expect_continue && minor == 1 && framing != BodyFraming::None;
    let head = RequestHead {
        method,
        path: path.to_owned(),
        query: query.to_owned(),
        headers,
        peer,
        head,
        http_minor: minor,
        framing,
        keep_alive,
        expect_continue,
    };
    Ok(Some((head, skip + head_len)))
}

/// Reduces a request target to the origin form (`/path?query`). Absolute form
/// (`http://host/path`) is accepted and stripped of scheme and authority.
fn origin_form(target: &str) -> Result<&str, ParseError> {
    if target.starts_with('/') {
        return Ok(target);
    }
    let rest = if let Some(r) = target.strip_prefix("http://") {
        r
    } else if let Some(r) = target.strip_prefix("https://") {
        r
    } else {
        return Err(ParseError::BadRequest("request target is not a path"));
    };
    match rest.find(['/', '?']) {
        Some(i) if rest.as_bytes()[i] == b'/' => Ok(&rest[i..]),
        // `http://host` or `http://host?q` has the empty path, which is "/": not representable
        // as a slice of the input with its query, so only the bare form is accepted.
        None => Ok("/"),
        Some(_) => Err(ParseError::BadRequest("request target without path")),
    }
}

fn parse_content_length(v: &[u8]) -> Result<u64, ParseError> {
    let v = trim(v);
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return Err(ParseError::BadRequest("invalid Content-Length"));
    }
    let mut n: u64 = 0;
    for &d in v {
        n = n * 10 + u64::from(d - b'0');
    }
    Ok(n)
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |i| i + 1);
    &v[start..end]
}

// ---------------------------------------------------------------------------------------------
// Chunked transfer coding
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    Size,
    SizeWs,
    Ext,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerStart,
    TrailerLine,
    TrailerLf,
    EndLf,
    Done,
}

/// Incremental decoder of a chunked request body (RFC 9112 §7.1): chunk extensions are skipped,
/// trailer fields are read and dropped. CRLF is required everywhere (no bare LF), sizes are
/// bounded by 16 hex digits and by the body limit, lines by [`CHUNK_LINE_BYTES_MAX`], trailers by
/// the header limit.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: ChunkState,
    size: u64,
    digits: u32,
    line_bytes: usize,
    trailer_bytes: usize,
    trailer_bytes_max: usize,
}

impl ChunkedDecoder {
    pub fn new(trailer_bytes_max: usize) -> ChunkedDecoder {
        ChunkedDecoder {
            state: ChunkState::Size,
            size: 0,
            digits: 0,
            line_bytes: 0,
            trailer_bytes: 0,
            trailer_bytes_max,
        }
    }

    /// True once the last chunk and the trailer section have been read.
    pub fn is_done(&self) -> bool {
        self.state == ChunkState::Done
    }

    /// Decodes from `input`, appending data to `body` (never beyond `body_max` bytes in total).
    /// Returns how many input bytes were consumed; stops right after the end of the body, so
    /// bytes of a pipelined next request are left unconsumed.
    pub fn decode(
        &mut self,
        input: &[u8],
        body: &mut Vec<u8>,
        body_max: usize,
    ) -> Result<usize, ParseError> {
        let bad = ParseError::BadRequest;
        let mut i = 0;
        while i < input.len() {
            let b = input[i];
            match self.state {
                ChunkState::Done => break,
                ChunkState::Data => {
                    let take =
                        (input.len() - i).min(usize::try_from(self.size).unwrap_or(usize::MAX));
                    body.extend_from_slice(&input[i..i + take]);
                    self.size -= take as u64;
                    i += take;
                    if self.size == 0 {
                        self.state = ChunkState::DataCr;
                    }
                    continue;
                }
                ChunkState::Size => {
                    self.line_bytes += 1;
                    if let Some(d) = hex_val(b) {
                        if self.digits >= CHUNK_SIZE_DIGITS_MAX {
                            return Err(ParseError::BodyTooLarge);
                        }
                        self.size = (self.size << 4) | u64::from(d);
                        self.digits += 1;
                    } else if self.digits == 0 {
                        return Err(bad("invalid chunk size"));
                    } else {
                        match b {
                            b' ' | b'\t' => self.state = ChunkState::SizeWs,
                            b';' => self.state = ChunkState::Ext,
                            b'\r' => self.state = ChunkState::SizeLf,
                            _ => return Err(bad("invalid chunk size")),
                        }
                    }
                }
                ChunkState::SizeWs => {
                    self.line_bytes += 1;
                    match b {
                        b' ' | b'\t' => {}
                        b';' => self.state = ChunkState::Ext,
                        b'\r' => self.state = ChunkState::SizeLf,
                        _ => return Err(bad("invalid chunk size line")),
                    }
                }
                ChunkState::Ext => {
                    self.line_bytes += 1;
                    match b {
                        b'\r' => self.state = ChunkState::SizeLf,
                        b'\n' | 0 => return Err(bad("invalid chunk extension")),
                        _ => {}
                    }
                }
                ChunkState::SizeLf => {
                    if b != b'\n' {
                        return Err(bad("chunk size line not ended by CRLF"));
                    }
                    if self.size == 0 {
                        self.state = ChunkState::TrailerStart;
                    } else {
                        let room = body_max.saturating_sub(body.len()) as u64;
                        if self.size > room {
                            return Err(ParseError::BodyTooLarge);
                        }
                        self.state = ChunkState::Data;
                    }
                    self.line_bytes = 0;
                    self.digits = 0;
                }
                ChunkState::DataCr => {
                    if b != b'\r' {
                        return Err(bad("chunk data not followed by CRLF"));
                    }
                    self.state = ChunkState::DataLf;
                }
                ChunkState::DataLf => {
                    if b != b'\n' {
                        return Err(bad("chunk data not followed by CRLF"));
                    }
                    self.state = ChunkState::Size;
                    self.size = 0;
                }
                ChunkState::TrailerStart => match b {
                    b'\r' => self.state = ChunkState::EndLf,
                    b'\n' => return Err(bad("bare LF in trailer")),
                    _ => {
                        self.trailer_bytes += 1;
                        self.state = ChunkState::TrailerLine;
                    }
                },
                ChunkState::TrailerLine => {
                    self.trailer_bytes += 1;
                    match b {
                        b'\r' => self.state = ChunkState::TrailerLf,
                        b'\n' | 0 => return Err(bad("invalid trailer field")),
                        _ => {}
                    }
                }
                ChunkState::TrailerLf => {
                    if b != b'\n' {
                        return Err(bad("trailer field not ended by CRLF"));
                    }
                    self.state = ChunkState::TrailerStart;
                }
                ChunkState::EndLf => {
                    if b != b'\n' {
                        return Err(bad("chunked body not ended by CRLF"));
                    }
                    self.state = ChunkState::Done;
                    i += 1;
                    break;
                }
            }
            if self.line_bytes > CHUNK_LINE_BYTES_MAX {
                return Err(bad("chunk size line too long"));
            }
            if self.trailer_bytes > self.trailer_bytes_max {
                return Err(ParseError::HeaderTooLarge);
            }
            i += 1;
        }
        Ok(i)
    }
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// A request parsed from a complete buffer by [`parse_request`].
#[derive(Debug)]
pub struct ParsedRequest {
    pub head: RequestHead,
    pub body: Vec<u8>,
    /// Bytes of the buffer this request took (head and body).
    pub consumed: usize,
}

/// Parses one whole request (head and body) from the start of `buf`, with `body_bytes_max` as
/// the body limit. `Ok(None)`: incomplete. Used by tests and the fuzz target; the connection
/// loop uses the same pieces incrementally.
pub fn parse_request(
    buf: &[u8],
    header_bytes_max: usize,
    body_bytes_max: usize,
) -> Result<Option<ParsedRequest>, ParseError> {
    let peer = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0));
    let Some((head, n)) = parse_head(buf, header_bytes_max, peer)? else {
        return Ok(None);
    };
    let rest = &buf[n..];
    match head.framing {
        BodyFraming::None => Ok(Some(ParsedRequest {
            head,
            body: Vec::new(),
            consumed: n,
        })),
        BodyFraming::Length(len) => {
            if len > body_bytes_max as u64 {
                return Err(ParseError::BodyTooLarge);
            }
            let len = len as usize;
            if rest.len() < len {
                return Ok(None);
            }
            Ok(Some(ParsedRequest {
                head,
                body: rest[..len].to_vec(),
                consumed: n + len,
            }))
        }
        BodyFraming::Chunked => {
            let mut dec = ChunkedDecoder::new(header_bytes_max);
            let mut body = Vec::new();
            let used = dec.decode(rest, &mut body, body_bytes_max)?;
            if !dec.is_done() {
                return Ok(None);
            }
            Ok(Some(ParsedRequest {
                head,
                body,
                consumed: n + used,
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HMAX: usize = 65536;
    const BMAX: usize = 1 << 20;

    fn peer() -> SocketAddr {
        "127.0.0.1:1".parse().expect("addr")
    }

    fn all(buf: &[u8]) -> Vec<ParsedRequest> {
        let mut out = Vec::new();
        let mut at = 0;
        while let Some(r) = parse_request(&buf[at..], HMAX, BMAX).expect("valid") {
            at += r.consumed;
            out.push(r);
        }
        assert_eq!(at, buf.len(), "every byte belongs to a request");
        out
    }

    #[test]
    fn pipelined_requests_in_one_buffer() {
        // Proves several requests in one buffer parse one after the other with exact boundaries,
        // including a Content-Length body and a chunked body between bodiless requests.
        let buf = b"GET /a?x=1 HTTP/1.1\r\nHost: h\r\n\r\n\
POST /b HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello\
POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n\
HEAD /d HTTP/1.1\r\nConnection: close\r\n\r\n";
        let r = all(buf);
        assert_eq!(r.len(), 4);
        assert_eq!(
            (r[0].head.method.as_str(), r[0].head.path.as_str()),
            ("GET", "/a")
        );
        assert_eq!(r[0].head.query, "x=1");
        assert_eq!(r[0].head.headers.get("host"), Some(&b"h"[..]));
        assert_eq!(r[1].body, b"hello");
        assert_eq!(r[2].body, b"abc");
        assert!(r[3].head.head && r[3].head.method == Method::Get);
        assert!(!r[3].head.keep_alive);
        assert!(r[0].head.keep_alive);
    }

    /// Feeds `head` in `piece`-byte reads as the connection does: parses only when
    /// [`HeadWatch`] says so. Returns the outcome at the first parse that decided, and
    /// how many parses it took.
    fn feed_in_pieces(
        head: &[u8],
        piece: usize,
        max: usize,
    ) -> (Option<Result<usize, ParseError>>, usize) {
        let (mut watch, mut parses) = (HeadWatch::default(), 0);
        for end in (piece..head.len() + piece).step_by(piece) {
            let buf = &head[..end.min(head.len())];
            if !watch.worth_parsing(buf, max) {
                continue;
            }
            parses += 1;
            match parse_head(buf, max, peer()) {
                Ok(Some((_, n))) => return (Some(Ok(n)), parses),
                Ok(None) => watch.incomplete(buf.len()),
                Err(e) => return (Some(Err(e)), parses),
            }
        }
        (None, parses)
    }

    #[test]
    fn a_head_in_small_pieces_is_parsed_a_few_times_not_once_per_piece() {
        // Proves the connection's re-parse rule: a head arriving in small reads is found
        // complete at its last byte for every piece size and line ending, with a number of
        // parses logarithmic in its size (a 62 KB head in 5-byte reads: 12,400 reads; before,
        // each was a full parse), and a malformed or oversized head is still refused before
        // the limit is waited out.
        let mut big = b"GET /v1/topics HTTP/1.1\r\nHost: h\r\n".to_vec();
        for i in 0..1000 {
            big.extend_from_slice(format!("X-Field-{i:04}: {}\r\n", "v".repeat(45)).as_bytes());
        }
        big.extend_from_slice(b"\r\n");
        assert!(big.len() > 60_000 && big.len() < 64_000, "{}", big.len());
        let (got, parses) = feed_in_pieces(&big, 5, HMAX);
        assert!(matches!(got, Some(Ok(n)) if n == big.len()), "{got:?}");
        assert!(parses <= 20, "{parses} parses");
        for piece in 1..8 {
            for head in [
                &b"GET /a HTTP/1.1\r\nHost: h\r\nX: y\r\n\r\n"[..],
                b"GET /a HTTP/1.1\nHost: h\n\n",
                b"\r\n\r\nGET /a HTTP/1.1\r\n\r\n",
            ] {
                let (got, _) = feed_in_pieces(head, piece, HMAX);
                assert!(
                    matches!(got, Some(Ok(n)) if n == head.len()),
                    "{piece} {got:?}"
                );
            }
        }
        // Garbage at the start: refused at the first read, whatever follows.
        let mut bad = b"G\x01T / HTTP/1.1\r\nHost: h\r\n".to_vec();
        bad.extend_from_slice(&big[40..]);
        let (got, parses) = feed_in_pieces(&bad, 5, HMAX);
        assert!(
            matches!(got, Some(Err(ParseError::BadRequest(_)))),
            "{got:?}"
        );
        assert_eq!(parses, 1);
        // No end in sight: refused once the buffer holds the limit.
        let mut endless = b"GET / HTTP/1.1\r\nX: ".to_vec();
        endless.resize(8192, b'v');
        let (got, _) = feed_in_pieces(&endless, 7, 4096);
        assert!(
            matches!(got, Some(Err(ParseError::HeaderTooLarge))),
            "{got:?}"
        );
    }

    #[test]
    fn incomplete_head_and_body_ask_for_more() {
        // Proves every strict prefix of a valid request is "incomplete", never an error or a
        // wrong request.
        let buf = b"POST /p?q HTTP/1.1\r\nContent-Length: 3\r\nX-A: b\r\n\r\nxyz";
        for cut in 0..buf.len() {
            assert!(
                parse_request(&buf[..cut], HMAX, BMAX)
                    .expect("prefix is fine")
                    .is_none(),
                "{cut}"
            );
        }
        let chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n4;a=b\r\nwxyz\r\n0\r\nT: v\r\n\r\n";
        for cut in 0..chunked.len() {
            assert!(
                parse_request(&chunked[..cut], HMAX, BMAX)
                    .expect("ok")
                    .is_none(),
                "{cut}"
            );
        }
        let r = parse_request(chunked, HMAX, BMAX)
            .expect("ok")
            .expect("complete");
        assert_eq!(r.body, b"wxyz");
    }

    #[test]
    fn chunked_with_extensions_trailers_and_byte_by_byte_feeding() {
        // Proves chunk extensions and trailers are accepted and skipped, and that decoding one
        // byte at a time gives the same body as decoding all at once.
        let body = b"5 ; name=\"v;x\"\r\nhello\r\n6;e\r\n world\r\nA\r\n0123456789\r\n0;last\r\nX-Trailer: 1\r\nY: 2\r\n\r\nNEXT";
        let mut d = ChunkedDecoder::new(HMAX);
        let mut out = Vec::new();
        let used = d.decode(body, &mut out, BMAX).expect("valid");
        assert!(d.is_done());
        assert_eq!(out, b"hello world0123456789");
        assert_eq!(&body[used..], b"NEXT");

        let mut d = ChunkedDecoder::new(HMAX);
        let mut out2 = Vec::new();
        let mut at = 0;
        while !d.is_done() {
            at += d.decode(&body[at..at + 1], &mut out2, BMAX).expect("valid");
        }
        assert_eq!(out2, out);
        assert_eq!(at, used);
    }

    #[test]
    fn bad_chunks_are_refused() {
        // Proves malformed chunk framing is a 400 (not a hang or a panic) and oversized chunks
        // are a 413 before any data is buffered.
        let cases: &[(&[u8], ParseError)] = &[
            (b"zz\r\n", ParseError::BadRequest("invalid chunk size")),
            (b"\r\n", ParseError::BadRequest("invalid chunk size")),
            (b"-1\r\n", ParseError::BadRequest("invalid chunk size")),
            (b"3\nabc", ParseError::BadRequest("invalid chunk size")),
            (
                b"3\r\nabcX",
                ParseError::BadRequest("chunk data not followed by CRLF"),
            ),
            (
                b"3\r\nabc\rX",
                ParseError::BadRequest("chunk data not followed by CRLF"),
            ),
            (b"0\r\n\n", ParseError::BadRequest("bare LF in trailer")),
            (b"11111111111111111\r\n", ParseError::BodyTooLarge),
            (b"100001\r\n", ParseError::BodyTooLarge),
            (
                b"3 x\r\n",
                ParseError::BadRequest("invalid chunk size line"),
            ),
        ];
        for (input, want) in cases {
            let mut d = ChunkedDecoder::new(HMAX);
            let mut out = Vec::new();
            let got = d.decode(input, &mut out, BMAX);
            assert_eq!(got, Err(*want), "{:?}", String::from_utf8_lossy(input));
            assert!(out.len() <= 3);
        }
        let long_ext = [b"1;".as_slice(), &[b'a'; CHUNK_LINE_BYTES_MAX]].concat();
        let mut d = ChunkedDecoder::new(HMAX);
        assert!(d.decode(&long_ext, &mut Vec::new(), BMAX).is_err());
        let big_trailer = [b"0\r\nX: ".as_slice(), &[b'a'; 100]].concat();
        let mut d = ChunkedDecoder::new(50);
        assert_eq!(
            d.decode(&big_trailer, &mut Vec::new(), BMAX),
            Err(ParseError::HeaderTooLarge)
        );
    }

    #[test]
    fn expect_continue_and_keep_alive_rules() {
        // Proves Expect: 100-continue is recognised only with a body in HTTP/1.1, other
        // expectations are 417, and keep-alive defaults differ between HTTP/1.0 and 1.1.
        let (h, _) = parse_head(
            b"POST / HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 2000\r\n\r\n",
            HMAX,
            peer(),
        )
        .expect("ok")
        .expect("complete");
        assert!(h.expect_continue);
        assert_eq!(h.framing, BodyFraming::Length(2000));
        let (h, _) = parse_head(
            b"GET / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
            HMAX,
            peer(),
        )
        .expect("ok")
        .expect("complete");
        assert!(!h.expect_continue);
        assert_eq!(
            parse_head(b"POST / HTTP/1.1\r\nExpect: teapot\r\n\r\n", HMAX, peer()).err(),
            Some(ParseError::ExpectationFailed)
        );
        let ka = |req: &[u8]| {
            parse_head(req, HMAX, peer())
                .expect("ok")
                .expect("complete")
                .0
                .keep_alive
        };
        assert!(!ka(b"GET / HTTP/1.0\r\n\r\n"));
        assert!(ka(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"));
        assert!(ka(b"GET / HTTP/1.1\r\n\r\n"));
        assert!(!ka(b"GET / HTTP/1.1\r\nConnection: foo, close\r\n\r\n"));
    }

    #[test]
    fn oversized_headers_are_431() {
        // Proves a header block over the limit is 431 both when complete and while still
        // arriving (so a client cannot make the server buffer without bound), and too many
        // fields is 431 as well.
        let mut big = b"GET / HTTP/1.1\r\nX-Big: ".to_vec();
        big.extend(std::iter::repeat_n(b'a', 70_000));
        assert_eq!(
            parse_head(&big, HMAX, peer()).err(),
            Some(ParseError::HeaderTooLarge)
        );
        big.extend_from_slice(b"\r\n\r\n");
        assert_eq!(
            parse_head(&big, HMAX, peer()).err(),
            Some(ParseError::HeaderTooLarge)
        );
        // Many fields are no error while their bytes fit (Go counts bytes, not fields), and
        // are all seen, also when the head arrives in pieces.
        let mut many = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..(HEADER_FIELDS_INLINE * 4) {
            many.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
        }
        assert!(matches!(parse_head(&many, HMAX, peer()), Ok(None)));
        many.extend_from_slice(b"\r\n");
        let (h, n) = parse_head(&many, HMAX, peer()).unwrap().unwrap();
        assert_eq!(n, many.len());
        assert_eq!(h.headers.get("x-511"), Some(&b"v"[..]));
    }

    #[test]
    fn garbage_and_bad_framing_are_400() {
        // Proves malformed request lines, headers and framing are refused with the right error.
        let bad: &[&[u8]] = &[
            b"\x00\x01\x02 garbage\r\n\r\n",
            b"GET\r\n\r\n",
            b"GET / HTTP/9.9\r\n\r\n",
            b"GET / HTTP/1.1\r\nBad Header\r\n\r\n",
            b"GET / HTTP/1.1\r\n: novalue\r\n\r\n",
            b"GET nopath HTTP/1.1\r\n\r\n",
            b"GET /v1/topics/a%ZZb HTTP/1.1\r\n\r\n",
            b"GET /v1/topics/a%4 HTTP/1.1\r\n\r\n",
            b"GET /v1/topics/a% HTTP/1.1\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        ];
        for b in bad {
            match parse_request(b, HMAX, BMAX) {
                Err(ParseError::BadRequest(_)) => {}
                other => panic!("{:?}: {other:?}", String::from_utf8_lossy(b)),
            }
        }
        assert_eq!(
            parse_request(
                b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                HMAX,
                BMAX
            )
            .err(),
            Some(ParseError::UnsupportedTransferEncoding)
        );
        assert_eq!(
            parse_request(
                b"POST / HTTP/1.1\r\nContent-Length: 2000000\r\n\r\n",
                HMAX,
                BMAX
            )
            .err(),
            Some(ParseError::BodyTooLarge)
        );
        // Equal duplicate Content-Length values are tolerated.
        let r = parse_request(
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nz",
            HMAX,
            BMAX,
        )
        .expect("ok")
        .expect("complete");
        assert_eq!(r.body, b"z");
    }

    #[test]
    fn targets_headers_and_methods() {
        // Proves the raw path and query are kept percent-encoded, header names are lowercased
        // with values kept raw (even non-UTF-8), absolute-form targets are reduced to the path,
        // and unknown methods are kept verbatim.
        let input = b"\r\nPATCH /v1/topics/a%2Fb?key=%00%9F&x=y+z HTTP/1.1\r\nX-Mixed-Case: A\xffB\r\n\r\nrest";
        let (h, n) = parse_head(input, HMAX, peer())
            .expect("ok")
            .expect("complete");
        assert_eq!(h.method, Method::Patch);
        assert_eq!(h.path, "/v1/topics/a%2Fb");
        assert_eq!(h.query, "key=%00%9F&x=y+z");
        assert_eq!(h.headers.get("x-mixed-case"), Some(&b"A\xffB"[..]));
        assert_eq!(
            h.headers.iter().next().map(|(k, _)| k),
            Some("x-mixed-case")
        );
        assert_eq!(&input[n..], b"rest");
        let (h, _) = parse_head(
            b"BREW http://example.com/pot?q HTTP/1.1\r\n\r\n",
            HMAX,
            peer(),
        )
        .expect("ok")
        .expect("complete");
        assert_eq!(h.method.as_str(), "BREW");
        assert_eq!((h.path.as_str(), h.query.as_str()), ("/pot", "q"));
    }

    #[test]
    fn random_bytes_never_panic() {
        // Proves (seeded, replayable with NARAD_SEED) that arbitrary bytes and mutated valid
        // requests never panic the parser and that a successful parse never consumes more than
        // the input.
        let seed: u64 = std::env::var("NARAD_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x5eed_1234);
        let mut x = seed;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let base = b"POST /v1/t/produce?key=a HTTP/1.1\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n5;x\r\nhello\r\n0\r\nT: 1\r\n\r\n";
        for round in 0..20_000 {
            let mut buf = base.to_vec();
            let muts = 1 + next() % 4;
            for _ in 0..muts {
                let at = (next() % buf.len() as u64) as usize;
                match next() % 3 {
                    0 => buf[at] = next() as u8,
                    1 => {
                        buf.remove(at);
                    }
                    _ => buf.insert(at, next() as u8),
                }
            }
            if round % 4 == 0 {
                buf = (0..(next() % 200)).map(|_| next() as u8).collect();
            }
            let r = std::panic::catch_unwind(|| parse_request(&buf, 1024, 4096));
            match r {
                Ok(Ok(Some(p))) => assert!(p.consumed <= buf.len(), "seed {seed} round {round}"),
                Ok(_) => {}
                Err(_) => panic!("parser panicked: seed {seed} round {round} input {buf:?}"),
            }
        }
    }
}
