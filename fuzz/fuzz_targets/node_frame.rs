//! Fuzzes what a node reads from another node with arbitrary bytes: the frame decoder and the
//! partition-operation decoder. Neither may panic; a frame that decodes must re-encode to the
//! same bytes it was decoded from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use narad_io::frame;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((f, used))) = frame::decode(data) {
        assert!(used <= data.len());
        let mut again = Vec::new();
        frame::encode(f.kind, f.request_id, f.deadline_ms, &f.body, &mut again);
        assert_eq!(&again[..], &data[..used]);
    }
    let _ = narad_shard::route::decode_op(data);
});
