//! Fuzzes every on-disk decoder with arbitrary bytes: WAL records, WAL batch headers and payloads,
//! partition segment frames and segment index files. None may panic, and a WAL record that
//! decodes must re-encode to the same bytes it was decoded from (a version-1 Handed marker to the
//! same record, since it is written as version 2).
#![no_main]

use libfuzzer_sys::fuzz_target;
use narad_io::codec;
use narad_io::partition::frame;

fuzz_target!(|data: &[u8]| {
    if let Ok((rec, used)) = codec::decode_record(data) {
        assert!(used <= data.len());
        let mut again = Vec::new();
        codec::encode_record(&rec, &mut again).expect("a decoded record re-encodes");
        if data[2] == codec::TYPE_HANDED && data[3] == codec::RECORD_VERSION {
            // A version-1 Handed marker is written as version 2 now: same record, new bytes.
            assert_eq!(codec::decode_record(&again).expect("re-decodes").0, rec);
        } else {
            assert_eq!(&again[..], &data[..used]);
        }
    }
    let segment = data.first().map_or(0, |&b| u64::from(b));
    let _ = codec::decode_batch_header(data, segment);
    let _ = codec::decode_payload(data);
    let mut rest = data;
    while let Ok((_, used)) = frame::decode(rest) {
        assert!(used > 0 && used <= rest.len());
        rest = &rest[used..];
    }
    let _ = frame::decode_index(data);
});
