//! Feeds arbitrary bytes to the HTTP request parser (no socket): as many pipelined requests as
//! the input holds, then the chunked-body decoder both in one piece and split at an input-chosen
//! point. Checks: no panic, a parsed request never claims more bytes than given, bodies stay
//! within the limit, and split decoding agrees with one-piece decoding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use narad::http::parse::{parse_request, ChunkedDecoder, ParseError};

const HEADER_BYTES_MAX: usize = 4096;
const BODY_BYTES_MAX: usize = 65536;
const REQUESTS_MAX: usize = 64;

fn decode_split(input: &[u8], split: usize) -> (Result<usize, ParseError>, Vec<u8>, bool) {
    let mut dec = ChunkedDecoder::new(HEADER_BYTES_MAX);
    let mut body = Vec::new();
    let split = split.min(input.len());
    let first = match dec.decode(&input[..split], &mut body, BODY_BYTES_MAX) {
        Ok(n) => n,
        Err(e) => return (Err(e), body, false),
    };
    if dec.is_done() {
        return (Ok(first), body, true);
    }
    assert_eq!(first, split, "an unfinished decoder consumes all it is given");
    match dec.decode(&input[split..], &mut body, BODY_BYTES_MAX) {
        Ok(n) => (Ok(first + n), body, dec.is_done()),
        Err(e) => (Err(e), body, false),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut at = 0;
    for _ in 0..REQUESTS_MAX {
        match parse_request(&data[at..], HEADER_BYTES_MAX, BODY_BYTES_MAX) {
            Ok(Some(r)) => {
                assert!(r.consumed > 0 && r.consumed <= data.len() - at);
                assert!(r.body.len() <= BODY_BYTES_MAX);
                at += r.consumed;
            }
            Ok(None) | Err(_) => break,
        }
    }

    let split = data.first().map_or(0, |&b| b as usize);
    let input = data.get(1..).unwrap_or(&[]);
    let (whole, body_whole, done_whole) = decode_split(input, input.len());
    let (parts, body_parts, done_parts) = decode_split(input, split);
    assert_eq!(whole.is_ok(), parts.is_ok());
    if let (Ok(a), Ok(b)) = (whole, parts) {
        assert_eq!(done_whole, done_parts);
        if done_whole {
            assert_eq!(a, b);
            assert_eq!(body_whole, body_parts);
        }
    }
    assert!(body_whole.len() <= BODY_BYTES_MAX);
});
