//! The checksums of Narad's on-disk formats: one named function per algorithm, used by every
//! writer and every reader. Which format uses which algorithm, and why there are two, is written
//! down in `io/FORMAT.md` ("Checksums").
//!
//! Owns the algorithms only. Never decides what a checksum covers (each format's encoder and
//! decoder do) and never changes a format's algorithm: data already on disk must keep verifying.

/// CRC-32 with the IEEE 802.3 polynomial (CRC-32/ISO-HDLC, as zlib and Ethernet compute it:
/// polynomial 0x04C11DB7 reflected, initial value and final xor 0xFFFFFFFF), by `crc32fast`
/// (SIMD where the CPU has it). The WAL, partition segments, segment indexes, `consumer.state`
/// and the fan-out cursor file use it.
pub fn crc32_ieee(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// [`crc32_ieee`] of the concatenation of `parts`, without copying them together.
pub fn crc32_ieee_parts(parts: &[&[u8]]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for p in parts {
        h.update(p);
    }
    h.finalize()
}

/// CRC-32C (Castagnoli: polynomial 0x1EDC6F41 reflected, initial value and final xor
/// 0xFFFFFFFF), bytewise over a table built at compile time: only the metadata Raft log uses it,
/// and its frames are few and small.
pub fn crc32c(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c = CRC32C_TABLE[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

static CRC32C_TABLE: [u32; 256] = crc32c_table();

const fn crc32c_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0x82F6_3B78 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_algorithm_gives_its_standard_check_value() {
        // Proves which CRC each function computes: the catalogued check value of "123456789"
        // for CRC-32/ISO-HDLC (0xCBF43926) and for CRC-32C (0xE3069283), so that a change of
        // algorithm, which would make every existing data directory unreadable, fails here.
        assert_eq!(crc32_ieee(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32_ieee(b""), 0);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn parts_checksum_as_their_concatenation() {
        // Proves crc32_ieee_parts equals crc32_ieee of the joined bytes at every split point,
        // empty parts included (the WAL's header CRC covers a header and a segment number).
        let data: Vec<u8> = (0..200u32).map(|i| (i * 7 + 3) as u8).collect();
        for cut in 0..=data.len() {
            let (a, b) = data.split_at(cut);
            assert_eq!(crc32_ieee_parts(&[a, b]), crc32_ieee(&data), "cut {cut}");
        }
        assert_eq!(crc32_ieee_parts(&[]), crc32_ieee(b""));
    }
}
