//! The per-partition consumer state: the settled frontier (every offset below it is settled) and
//! the acked-ahead set (settled offsets above it), in memory and in the `consumer.state` file.
//!
//! Crash safety: the file is replaced atomically (write `consumer.state.tmp`, fsync it, rename it
//! over `consumer.state`, fsync the directory: [`crate::durable::replace_file`], whose doc has the
//! argument), so after a crash the file is either the old or the new version, never a mix. It lags the WAL: acks after the last checkpoint are replayed
//! from the WAL's Settle records, and applying a settle twice is a no-op. A file that fails its
//! checksum is logged loudly and read as "nothing settled" (redelivery, never loss).

use std::collections::BTreeSet;
use std::path::Path;

use crate::checksum::crc32_ieee;
use crate::types::Offset;

pub const STATE_FILE: &str = "consumer.state";
pub const STATE_MAGIC: [u8; 8] = *b"NARADCSR";
pub const STATE_VERSION: u16 = 1;
/// magic(8) version(2) reserved(2) ahead_count(4) frontier(8), then ahead_count u64s, then crc(4).
const STATE_HEADER_BYTES: usize = 24;
/// Hard bound on the acked-ahead set in the file, checked before the count is used.
pub const STATE_AHEAD_MAX: usize = 4 << 20;

/// Durable consumer progress of one partition.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settled {
    /// Every offset below is settled; the frontier itself is not.
    pub frontier: Offset,
    /// Settled offsets above the frontier, sorted ascending.
    pub ahead: Vec<Offset>,
}

/// The in-memory form: the ahead set as a BTreeSet for O(log n) inserts.
#[derive(Clone, Debug, Default)]
pub struct SettledSet {
    frontier: u64,
    ahead: BTreeSet<u64>,
}

impl SettledSet {
    pub fn from_settled(s: &Settled) -> SettledSet {
        let mut set = SettledSet {
            frontier: s.frontier.0,
            ahead: s.ahead.iter().map(|o| o.0).collect(),
        };
        set.absorb();
        set
    }

    pub fn to_settled(&self) -> Settled {
        Settled {
            frontier: Offset(self.frontier),
            ahead: self.ahead.iter().map(|&o| Offset(o)).collect(),
        }
    }

    pub fn frontier(&self) -> Offset {
        Offset(self.frontier)
    }

    /// Marks offsets settled. Returns whether anything changed.
    pub fn settle(&mut self, offsets: &[Offset]) -> bool {
        let mut changed = false;
        for o in offsets {
            if o.0 == self.frontier {
                // In-order acks, the common case: the frontier moves without touching the set.
                self.frontier += 1;
                self.absorb();
                changed = true;
            } else if o.0 >= self.frontier {
                changed |= self.ahead.insert(o.0);
            }
        }
        self.absorb();
        changed
    }

    /// Moves the frontier up to at least `to` (retention overtook the consumer, or recovery
    /// clamps it). Returns whether it moved.
    pub fn raise_frontier(&mut self, to: Offset) -> bool {
        if to.0 <= self.frontier {
            return false;
        }
        self.frontier = to.0;
        self.ahead = self.ahead.split_off(&to.0);
        self.absorb();
        true
    }

    /// Keeps the state inside [.., next): offsets at or above `next` do not exist.
    pub fn clamp_below(&mut self, next: Offset) {
        self.ahead.split_off(&next.0);
        if self.frontier > next.0 {
            self.frontier = next.0;
        }
    }

    fn absorb(&mut self) {
        while self.ahead.first() == Some(&self.frontier) {
            self.ahead.pop_first();
            self.frontier += 1;
        }
    }
}

pub fn encode_state(s: &Settled) -> Vec<u8> {
    let mut v = Vec::with_capacity(STATE_HEADER_BYTES + 8 * s.ahead.len() + 4);
    v.extend_from_slice(&STATE_MAGIC);
    v.extend_from_slice(&STATE_VERSION.to_le_bytes());
    v.extend_from_slice(&[0, 0]);
    v.extend_from_slice(&(s.ahead.len() as u32).to_le_bytes());
    v.extend_from_slice(&s.frontier.0.to_le_bytes());
    for o in &s.ahead {
        v.extend_from_slice(&o.0.to_le_bytes());
    }
    let c = crc32_ieee(&v);
    v.extend_from_slice(&c.to_le_bytes());
    v
}

#[derive(Debug, PartialEq, Eq)]
pub enum StateError {
    Truncated,
    BadMagic,
    BadVersion(u16),
    TooMany(u32),
    BadCrc,
    Unsorted,
}

pub fn decode_state(b: &[u8]) -> Result<Settled, StateError> {
    if b.len() < STATE_HEADER_BYTES + 4 {
        return Err(StateError::Truncated);
    }
    if b[..8] != STATE_MAGIC {
        return Err(StateError::BadMagic);
    }
    let version = u16::from_le_bytes([b[8], b[9]]);
    if version != STATE_VERSION {
        return Err(StateError::BadVersion(version));
    }
    let count = u32::from_le_bytes([b[12], b[13], b[14], b[15]]);
    if count as usize > STATE_AHEAD_MAX {
        return Err(StateError::TooMany(count));
    }
    let body = STATE_HEADER_BYTES + 8 * count as usize;
    if b.len() != body + 4 {
        return Err(StateError::Truncated);
    }
    let stored = u32::from_le_bytes([b[body], b[body + 1], b[body + 2], b[body + 3]]);
    if crc32_ieee(&b[..body]) != stored {
        return Err(StateError::BadCrc);
    }
    let u64_at = |at: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(a)
    };
    let frontier = Offset(u64_at(16));
    let ahead: Vec<Offset> = (0..count as usize)
        .map(|i| Offset(u64_at(STATE_HEADER_BYTES + 8 * i)))
        .collect();
    if ahead.windows(2).any(|w| w[0] >= w[1]) || ahead.first().is_some_and(|o| *o <= frontier) {
        return Err(StateError::Unsorted);
    }
    Ok(Settled { frontier, ahead })
}

/// Replaces `dir/consumer.state` atomically and durably (blocking; run off the executor), through
/// `consumer.state.tmp` ([`crate::durable::replace_file`]).
pub fn write_state_file(dir: &Path, s: &Settled) -> std::io::Result<()> {
    crate::durable::replace_file(&dir.join(STATE_FILE), &encode_state(s))
}

/// Reads `dir/consumer.state`. A missing file is "nothing settled"; a damaged one is logged
/// and read the same way (redelivery, never loss).
pub fn read_state_file(dir: &Path) -> Settled {
    let path = dir.join(STATE_FILE);
    match std::fs::read(&path) {
        Ok(b) => match decode_state(&b) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(path = %path.display(), error = ?e,
                    "consumer state file is damaged; treating the partition as unsettled (messages will be redelivered)");
                Settled::default()
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Settled::default(),
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e,
                "consumer state file cannot be read; treating the partition as unsettled");
            Settled::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settle_absorbs_into_frontier() {
        // Proves out-of-order settles stay in the ahead set until the gap below them is settled,
        // and that duplicates and offsets below the frontier change nothing.
        let mut s = SettledSet::default();
        assert!(s.settle(&[Offset(2), Offset(3)]));
        assert_eq!(
            s.to_settled(),
            Settled {
                frontier: Offset(0),
                ahead: vec![Offset(2), Offset(3)]
            }
        );
        assert!(s.settle(&[Offset(0)]));
        assert_eq!(s.frontier(), Offset(1));
        assert!(s.settle(&[Offset(1)]));
        assert_eq!(
            s.to_settled(),
            Settled {
                frontier: Offset(4),
                ahead: vec![]
            }
        );
        assert!(!s.settle(&[Offset(2)]));
        assert!(s.raise_frontier(Offset(10)));
        s.settle(&[Offset(12)]);
        s.clamp_below(Offset(11));
        assert_eq!(
            s.to_settled(),
            Settled {
                frontier: Offset(10),
                ahead: vec![]
            }
        );
    }

    #[test]
    fn settle_matches_a_set_model_in_any_order() {
        // Proves the in-order fast path and the ahead set together equal the plain definition
        // (frontier = lowest offset not settled, ahead = settled offsets above it), and that
        // `changed` is true exactly when a new offset was settled, for random batches mixing
        // in-order runs, gaps, duplicates and offsets below the frontier; seeded.
        let mut rng = crate::types::SplitMix64(0x5e771e);
        for round in 0..200 {
            let mut s = SettledSet::default();
            let mut model = std::collections::BTreeSet::new();
            let mut next = 0u64;
            for _ in 0..50 {
                let batch: Vec<Offset> = (0..rng.next_u64() % 8)
                    .map(|_| match rng.next_u64() % 4 {
                        0 => Offset(rng.next_u64() % 64),
                        _ => {
                            next += 1;
                            Offset(next - 1)
                        }
                    })
                    .collect();
                let before = model.clone();
                let want_frontier = {
                    model.extend(batch.iter().map(|o| o.0));
                    (0..).find(|o| !model.contains(o)).unwrap()
                };
                let want_changed = batch.iter().any(|o| !before.contains(&o.0));
                let changed = s.settle(&batch);
                let got = s.to_settled();
                assert_eq!(got.frontier, Offset(want_frontier), "round {round}");
                let want_ahead: Vec<Offset> = model
                    .iter()
                    .filter(|&&o| o > want_frontier)
                    .map(|&o| Offset(o))
                    .collect();
                assert_eq!(got.ahead, want_ahead, "round {round}");
                assert_eq!(changed, want_changed, "round {round} batch {batch:?}");
            }
        }
    }

    #[test]
    fn state_round_trip_and_corruption() {
        // Proves the state file encoding round-trips and every single-byte corruption or
        // truncation is rejected.
        let s = Settled {
            frontier: Offset(5),
            ahead: vec![Offset(7), Offset(9)],
        };
        let b = encode_state(&s);
        assert_eq!(decode_state(&b), Ok(s));
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x40;
            assert!(decode_state(&c).is_err(), "byte {i}");
            assert!(decode_state(&b[..i]).is_err());
        }
    }

    #[test]
    fn state_file_replace_is_readable() {
        // Proves write_state_file replaces the file and read_state_file reads the latest; a
        // damaged file reads as nothing settled.
        let dir = std::env::temp_dir().join(format!("narad-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(read_state_file(&dir), Settled::default());
        write_state_file(
            &dir,
            &Settled {
                frontier: Offset(1),
                ahead: vec![],
            },
        )
        .unwrap();
        write_state_file(
            &dir,
            &Settled {
                frontier: Offset(3),
                ahead: vec![Offset(5)],
            },
        )
        .unwrap();
        assert_eq!(
            read_state_file(&dir),
            Settled {
                frontier: Offset(3),
                ahead: vec![Offset(5)]
            }
        );
        std::fs::write(dir.join(STATE_FILE), b"garbage").unwrap();
        assert_eq!(read_state_file(&dir), Settled::default());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
