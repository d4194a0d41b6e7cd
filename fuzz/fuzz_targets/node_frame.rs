//! Fuzzes what a node reads from another node with arbitrary bytes: the frame decoder, the
//! cluster handshake's messages and the partition-operation decoder. None may panic; a frame or
//! handshake message that decodes must re-encode to the same bytes it was decoded from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use narad_io::frame;
use narad_io::peer::proof::{Answer, Challenge, Hello, Verdict};

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((f, used))) = frame::decode(data) {
        assert!(used <= data.len());
        let mut again = Vec::new();
        frame::encode(f.kind, f.request_id, f.deadline_ms, &f.body, &mut again);
        assert_eq!(&again[..], &data[..used]);
    }
    if let Ok(h) = Hello::decode(data) {
        assert_eq!(h.encode(), data);
    }
    if let Ok(c) = Challenge::decode(data) {
        assert_eq!(c.encode(), data);
    }
    if let Ok(a) = Answer::decode(data) {
        assert_eq!(a.encode(), data);
    }
    if let Ok(Verdict::Accepted) = Verdict::decode(data) {
        assert_eq!(data, [0]);
    }
    let _ = narad_shard::route::decode_op(data);
});
