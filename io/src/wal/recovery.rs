//! Recovery scan, free of I/O: fed the image of every segment in order, it returns the intact
//! records, where the next batch goes, and what to truncate or remove.
//!
//! Owns: the decision "torn tail or corruption in the middle". Never writes; the caller carries
//! out `truncate` and `remove_segments` before appending.
//!
//! The rule (see the crash-safety argument in `wal`): a batch is acknowledged only after every
//! batch before it is durable, so only the batches still in flight at a crash can be torn: the
//! last one, or with pipelining (`core`) a lost batch followed by batches flagged *pipelined*
//! (written while it was in flight). While scanning, the
//! first position where the log stops being valid opens a *hole*. If a valid batch with a later
//! sequence number follows the hole, the hole is corruption of acknowledged data: it is counted,
//! logged with `tracing::error!`, the intact leading records of a damaged batch are kept, and the
//! scan continues. Zeros, or the stale batches of a recycled segment file's earlier life (bound to
//! another segment number, so they fail their header check), followed by the next sequence number
//! at byte 0 of the next segment is the normal end of a segment, not a hole. A hole that reaches
//! the end of the log is the batch that was in flight at the crash: never acknowledged, so the log
//! continues at the hole, and every batch header of this segment after it (the torn batch's, and
//! with pipelining the batches after it) is zeroed (`truncate`) so that it cannot be found again
//! once new batches are written over the start of that space. Other non-zero bytes there (what is
//! left of a torn batch without its header, old batches of a recycled file) are left: they never
//! decode, and the batches written next overwrite them in order.
//!
//! Pipelining: every batch records how many earlier batches were in flight when it started. A
//! hole where batches k … k+m−1 are missing, followed by valid batches k+m, k+m+1, …, each k+i
//! started while k was still in flight (in flight before it ≥ i), is held *tentative*. If
//! nothing valid follows them, the hole was the batches in flight whose completed but unsynced
//! writes a power loss dropped while their successors' writes survived; none of them was acknowledged (acknowledgements
//! are in order), so the hole and those batches are the torn tail, truncated together. If
//! anything valid follows, the hole is corruption in the middle as above and the tentative
//! batches are kept. (Bit rot in an acknowledged batch k whose only successors are such batches
//! at the very end of the log is indistinguishable from that crash and is treated as it.)

use crate::codec::{self, WalPosition, WalRecord, BATCH_ALIGN, BATCH_HEADER_BYTES};

use super::WalRecoveryStats;

/// Most pipelined batches that can follow a lost in-flight batch: the batch header holds at
/// most this many earlier batches in flight (`codec::BATCH_FLAGS_IN_FLIGHT_MASK`).
pub const PIPELINED_TAIL_BATCHES_MAX: u64 = codec::BATCH_FLAGS_IN_FLIGHT_MASK as u64;

struct Hole {
    at: WalPosition,
    /// Any non-zero byte that is not a valid batch seen since the hole opened.
    bad: bool,
    /// End of the last batch with a header of this segment (valid, or with a bad payload) seen
    /// in `at.segment` since the hole opened (>= `at.byte`): what must be zeroed if the hole is
    /// the torn tail, so that no such header is found there again. Other non-zero blocks are
    /// left: they never decode, and new batches overwrite them in order.
    dirty_end: u64,
    /// Intact leading records of damaged batches: kept only if the hole is mid-log.
    salvaged: Vec<(WalPosition, WalRecord)>,
    bad_batches: u64,
    bad_records: u64,
}

/// One hole of a tentative run and the valid batches after it.
struct TentativePart {
    hole: Hole,
    /// Sequence number expected at the hole (its first missing batch).
    expected: u64,
    /// Sequence number and start of the first valid batch after the hole.
    first_seq: u64,
    first_at: WalPosition,
    records: Vec<(WalPosition, WalRecord)>,
}

/// Valid pipelined batches after a hole of missing in-flight batches (possibly with more such
/// holes between them: several writes in flight lost), not yet known to be the torn tail or to
/// follow corruption in the middle.
struct Tentative {
    /// At least one; the first part's hole is where the run starts.
    parts: Vec<TentativePart>,
    batches: u64,
    /// End of the last pipelined batch.
    end: WalPosition,
}

impl Tentative {
    /// Sequence number of the first missing batch.
    fn missing_seq(&self) -> u64 {
        self.parts[0].expected
    }
}

/// Feed segments with [`Scanner::feed`] in increasing order, then call [`Scanner::finish`].
#[derive(Default)]
pub struct Scanner {
    expected: Option<u64>,
    last_end: Option<WalPosition>,
    hole: Option<Hole>,
    tentative: Option<Tentative>,
    records: Vec<(WalPosition, WalRecord)>,
    segments: Vec<u64>,
    stats: WalRecoveryStats,
}

/// Result of a recovery scan.
#[derive(Debug)]
pub struct Recovered {
    /// Intact records at or after the last checkpoint's `upto`, in log order, without the
    /// `Checkpoint` records themselves.
    pub records: Vec<(WalPosition, WalRecord)>,
    pub next_seq: u64,
    /// Where the next batch goes; `None` when there is no segment at all.
    pub write_at: Option<WalPosition>,
    /// Zero bytes `[at.byte, end)` of segment `at.segment` (a torn tail) before appending.
    pub truncate: Option<(WalPosition, u64)>,
    /// Segments after the end of the log (nothing valid in them): delete before appending.
    pub remove_segments: Vec<u64>,
    pub stats: WalRecoveryStats,
}

impl Scanner {
    pub fn new() -> Scanner {
        Scanner::default()
    }

    /// Scans the image of segment `segment` (its whole file).
    pub fn feed(&mut self, segment: u64, bytes: &[u8]) {
        if let Some(&last) = self.segments.last() {
            assert!(segment > last, "segments fed out of order");
        }
        self.segments.push(segment);
        self.stats.segments += 1;
        let len = bytes.len();
        if len < BATCH_ALIGN {
            // Created but never pre-allocated (crash right after create): nothing in it.
            self.gap(WalPosition { segment, byte: 0 });
            return;
        }
        let mut p = 0usize;
        while p + BATCH_ALIGN <= len {
            let here = WalPosition {
                segment,
                byte: p as u64,
            };
            match codec::decode_batch_header(&bytes[p..], segment) {
                Ok(h)
                    if p + h.span() as usize <= len && self.expected.is_none_or(|e| h.seq >= e) =>
                {
                    let span = h.span() as usize;
                    let payload = &bytes
                        [p + BATCH_HEADER_BYTES..p + BATCH_HEADER_BYTES + h.payload_len as usize];
                    let base = (p + BATCH_HEADER_BYTES) as u64;
                    let (recs, err) = codec::decode_payload(payload);
                    let recs: Vec<_> = recs
                        .into_iter()
                        .map(|(off, r)| {
                            (
                                WalPosition {
                                    segment,
                                    byte: base + off as u64,
                                },
                                r,
                            )
                        })
                        .collect();
                    if codec::payload_crc(payload) == h.payload_crc {
                        let end = WalPosition {
                            segment,
                            byte: (p + span) as u64,
                        };
                        let held = self.accept(here, end, h.seq, h.in_flight_before);
                        if let Some(e) = err {
                            // Checksum right but frames do not parse: a writer bug, never expected.
                            self.stats.corrupt_batches += 1;
                            self.stats.corrupt_records +=
                                u64::from(h.record_count).saturating_sub(recs.len() as u64);
                            tracing::error!(segment, byte = p, error = %e, "write-ahead log batch passes its checksum but does not parse");
                        }
                        self.stats.batches += 1;
                        match (held, self.tentative.as_mut()) {
                            (true, Some(t)) => {
                                if let Some(part) = t.parts.last_mut() {
                                    part.records.extend(recs);
                                }
                                t.end = end;
                            }
                            _ => self.records.extend(recs),
                        }
                        self.expected = Some(h.seq + 1);
                        p += span;
                        self.last_end = Some(end);
                    } else {
                        let lost = u64::from(h.record_count).saturating_sub(recs.len() as u64);
                        self.bad(here, span as u64, Some((recs, lost)));
                        p += span;
                    }
                }
                _ => {
                    let block = &bytes[p..p + BATCH_ALIGN];
                    if block.iter().all(|&b| b == 0) {
                        self.gap(here);
                    } else {
                        self.bad(here, BATCH_ALIGN as u64, None);
                    }
                    p += BATCH_ALIGN;
                }
            }
        }
    }

    fn gap(&mut self, at: WalPosition) {
        if self.hole.is_none() {
            self.hole = Some(Hole {
                at,
                bad: false,
                dirty_end: at.byte,
                salvaged: Vec::new(),
                bad_batches: 0,
                bad_records: 0,
            });
        }
    }

    fn bad(
        &mut self,
        at: WalPosition,
        len: u64,
        batch: Option<(Vec<(WalPosition, WalRecord)>, u64)>,
    ) {
        self.gap(at);
        let hole = self.hole.as_mut().expect("opened above");
        hole.bad = true;
        if let Some((recs, lost)) = batch {
            if at.segment == hole.at.segment {
                hole.dirty_end = hole.dirty_end.max(at.byte + len);
            }
            hole.bad_batches += 1;
            hole.bad_records += lost;
            hole.salvaged.extend(recs);
        }
    }

    /// A valid batch `[at, end)` with sequence `seq`: decides what an open hole or a tentative
    /// run is. Returns true when the batch's records are held in the tentative run.
    fn accept(
        &mut self,
        at: WalPosition,
        end: WalPosition,
        seq: u64,
        in_flight_before: u8,
    ) -> bool {
        if let Some(t) = &mut self.tentative {
            // Started while the first missing batch was still in flight.
            let in_flight = u64::from(in_flight_before) >= seq.saturating_sub(t.missing_seq());
            let contiguous = self.hole.is_none() && self.expected == Some(seq) && at == t.end;
            if in_flight && contiguous {
                t.batches += 1;
                return true;
            }
            // More batches in flight were lost between the pipelined ones.
            let after_lost = self
                .hole
                .as_ref()
                .is_some_and(|h| h.at.segment == at.segment && at.segment == t.end.segment)
                && self.expected.is_some_and(|e| seq > e);
            if in_flight && after_lost && (t.parts.len() as u64) < PIPELINED_TAIL_BATCHES_MAX {
                let hole = self.hole.take().expect("checked above");
                t.parts.push(TentativePart {
                    hole,
                    expected: self.expected.expect("checked above"),
                    first_seq: seq,
                    first_at: at,
                    records: Vec::new(),
                });
                t.batches += 1;
                return true;
            }
            self.commit_tentative();
        }
        // Batches expected..seq are missing; all of them were in flight when this one started.
        // Nothing valid before the hole: a new log whose first batches (from seq 1) were lost.
        let missing = seq.saturating_sub(self.expected.unwrap_or(1));
        let lost_in_flight = self.hole.as_ref().is_some_and(|hole| {
            missing >= 1
                && u64::from(in_flight_before) >= missing
                && hole.bad_batches <= missing
                // The lost batch may have opened a new segment: the hole then starts in the
                // zeros at the end of the previous one.
                && (hole.at.segment == at.segment || hole.at.segment + 1 == at.segment)
        });
        if lost_in_flight {
            let hole = self.hole.take().expect("checked above");
            self.tentative = Some(Tentative {
                parts: vec![TentativePart {
                    hole,
                    expected: seq - missing,
                    first_seq: seq,
                    first_at: at,
                    records: Vec::new(),
                }],
                batches: 1,
                end,
            });
            return true;
        }
        self.resolve(at, seq);
        false
    }

    /// Something valid follows the tentative run: its holes were corruption in the middle.
    fn commit_tentative(&mut self) {
        let Some(t) = self.tentative.take() else {
            return;
        };
        for part in t.parts {
            self.report_corruption(
                part.hole,
                part.first_at,
                part.first_seq,
                Some(part.expected),
            );
            self.records.extend(part.records);
        }
    }

    /// A valid batch with sequence `seq` at `at`: closes an open hole.
    fn resolve(&mut self, at: WalPosition, seq: u64) {
        let Some(hole) = self.hole.take() else {
            if let Some(e) = self.expected {
                if seq > e {
                    // Valid batches on both sides but sequence numbers missing.
                    self.stats.lost_batches += seq - e;
                    tracing::error!(
                        segment = at.segment,
                        byte = at.byte,
                        missing = seq - e,
                        "write-ahead log batches missing in the middle of the log"
                    );
                }
            }
            return;
        };
        // The rest of a segment after its last batch is zeros, or in a recycled segment file
        // the old batches of its earlier life (which fail their header check here, bound to
        // another segment number). Either way the log goes on at byte 0 of the next segment
        // with the next sequence number; damage to a batch of this life would show as a missing
        // sequence number or as a batch with a valid header and a bad payload.
        let rollover = hole.bad_batches == 0
            && at.byte == 0
            && at.segment == hole.at.segment + 1
            && self.expected == Some(seq);
        let fresh_start = !hole.bad && self.expected.is_none();
        if rollover || fresh_start {
            return;
        }
        self.report_corruption(hole, at, seq, self.expected);
    }

    /// `hole` is followed by the valid batch `seq` at `at` (`expected` was the next sequence
    /// number before the hole): counts, logs and keeps the salvaged records.
    fn report_corruption(&mut self, hole: Hole, at: WalPosition, seq: u64, expected: Option<u64>) {
        let missing = expected.map_or(0, |e| seq.saturating_sub(e));
        self.stats.corrupt_batches += hole.bad_batches;
        self.stats.corrupt_records += hole.bad_records;
        self.stats.lost_batches += missing.saturating_sub(hole.bad_batches);
        if hole.bad_batches == 0 && missing == 0 {
            // Damage of unknown extent (no readable header, sequence unknown): still report it.
            self.stats.corrupt_batches += 1;
        }
        tracing::error!(
            segment = hole.at.segment,
            byte = hole.at.byte,
            resumes_at_segment = at.segment,
            resumes_at_byte = at.byte,
            damaged_batches = hole.bad_batches,
            lost_records = hole.bad_records,
            missing_batches = missing,
            salvaged_records = hole.salvaged.len(),
            "write-ahead log corrupt in the middle: acknowledged data damaged, skipped"
        );
        self.records.extend(hole.salvaged);
    }

    pub fn finish(mut self) -> Recovered {
        let mut truncate = None;
        if let Some(t) = self.tentative.take() {
            // Nothing valid after the pipelined batches: the hole was in flight at the crash and
            // so were they; none was acknowledged. Zero through their end and any damage after.
            let missing_seq = t.missing_seq();
            let seg = t.parts[0].hole.at.segment;
            let mut end = self
                .hole
                .take()
                .filter(|h| h.at.segment == seg)
                .map_or(0, |h| h.dirty_end);
            for part in &t.parts {
                if part.hole.at.segment == seg {
                    end = end.max(part.hole.dirty_end);
                }
            }
            // Pipelined batches in the next segment go with it (`remove_segments`).
            if t.end.segment == seg {
                end = end.max(t.end.byte);
            }
            self.stats.batches -= t.batches;
            let first = t.parts.into_iter().next().expect("at least one part").hole;
            tracing::warn!(
                segment = first.at.segment,
                byte = first.at.byte,
                pipelined_batches = t.batches,
                "write-ahead log ends in lost in-flight batches and the pipelined batches after them (never acknowledged): truncating"
            );
            self.hole = Some(Hole {
                dirty_end: end,
                ..first
            });
            self.expected = Some(missing_seq);
        }
        let write_at = match self.hole.take() {
            Some(hole) => {
                // Only a batch with this segment's header (`bad` with a batch) or a lost
                // in-flight run moves `dirty_end`.
                if hole.dirty_end > hole.at.byte {
                    self.stats.torn_bytes = hole.dirty_end - hole.at.byte;
                    tracing::warn!(
                        segment = hole.at.segment,
                        byte = hole.at.byte,
                        bytes = self.stats.torn_bytes,
                        records = hole.bad_records + hole.salvaged.len() as u64,
                        "write-ahead log ends in a torn batch (in flight at the crash, never acknowledged): truncating"
                    );
                    truncate = Some((hole.at, hole.dirty_end));
                }
                Some(hole.at)
            }
            None => self.last_end,
        };
        let remove_segments: Vec<u64> = match write_at {
            Some(w) => self
                .segments
                .iter()
                .copied()
                .filter(|&s| s > w.segment)
                .collect(),
            None => Vec::new(),
        };
        self.stats.removed_segments = remove_segments.len() as u32;
        self.stats.records = self.records.len() as u64;
        let (checkpoint, checkpoint_marks) = self
            .records
            .iter_mut()
            .rev()
            .find_map(|(_, r)| match r {
                WalRecord::Checkpoint { upto, marks } => Some((*upto, std::mem::take(marks))),
                _ => None,
            })
            .unzip();
        self.stats.last_checkpoint = checkpoint;
        self.stats.last_checkpoint_marks = checkpoint_marks.unwrap_or_default();
        let from = checkpoint.unwrap_or_default();
        self.records
            .retain(|(p, r)| *p >= from && !matches!(r, WalRecord::Checkpoint { .. }));
        self.stats.records_replayed = self.records.len() as u64;
        Recovered {
            records: self.records,
            next_seq: self.expected.unwrap_or(1),
            write_at,
            truncate,
            remove_segments,
            stats: self.stats,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::tests::{random_record, Rng};
    use crate::codec::{batch_span, encode_batch, encode_record, seal_batch_flagged};

    /// Lays batches of the given records into an image of segment `segment` of `seg_bytes`;
    /// returns the image and the (start, end) of each batch.
    fn build(
        segment: u64,
        batches: &[Vec<WalRecord>],
        first_seq: u64,
        seg_bytes: usize,
    ) -> (Vec<u8>, Vec<(usize, usize)>) {
        let mut img = vec![0u8; seg_bytes];
        let mut at = 0;
        let mut spans = Vec::new();
        for (i, recs) in batches.iter().enumerate() {
            let span = put_batch(&mut img, at, segment, first_seq + i as u64, recs);
            spans.push((at, at + span));
            at += span;
        }
        (img, spans)
    }

    fn records(rng: &mut Rng, n: usize) -> Vec<WalRecord> {
        (0..n)
            .map(|_| loop {
                let r = random_record(rng);
                if !matches!(r, WalRecord::Checkpoint { .. }) {
                    break r;
                }
            })
            .collect()
    }

    fn scan(segs: &[(u64, &[u8])]) -> Recovered {
        let mut s = Scanner::new();
        for (id, b) in segs {
            s.feed(*id, b);
        }
        s.finish()
    }

    /// Writes one batch of `recs` for `segment` at byte `at` of `img`; returns its span.
    fn put_batch(img: &mut [u8], at: usize, segment: u64, seq: u64, recs: &[WalRecord]) -> usize {
        let mut payload = Vec::new();
        for r in recs {
            encode_record(r, &mut payload).expect("encode");
        }
        let span = batch_span(payload.len());
        encode_batch(
            segment,
            seq,
            recs.len() as u32,
            &payload,
            &mut img[at..at + span],
        );
        span
    }

    /// Carries out `r` on the image of its write segment (zeroes `truncate`), then writes one
    /// batch of `recs` where the log continues, as the driver does after recovery.
    fn continue_log(img: &mut [u8], r: &Recovered, recs: &[WalRecord]) {
        let at = r.write_at.expect("a write position");
        if let Some((t, end)) = r.truncate {
            assert_eq!(t.segment, at.segment);
            img[t.byte as usize..end as usize].fill(0);
        }
        put_batch(img, at.byte as usize, at.segment, r.next_seq, recs);
    }

    #[test]
    fn truncating_the_last_batch_at_every_byte_recovers_the_acknowledged_prefix() {
        // Proves that whatever prefix of the last batch reached the disk (cut at every byte
        // offset, the rest zero), recovery returns exactly the records of the earlier batches,
        // reports nothing as corruption, and zeroes the torn batch when its header survived; a
        // complete last batch is returned whole. And that the log continued there (a shorter
        // batch over what is left of the torn one) recovers as the earlier batches plus the new
        // one, with nothing reported.
        let mut rng = Rng(0x7ab1e);
        let batches: Vec<_> = (0..4).map(|i| records(&mut rng, 3 + i)).collect();
        let (img, spans) = build(0, &batches, 1, 64 << 10);
        let acked: Vec<WalRecord> = batches[..3].concat();
        let (start, end) = spans[3];
        for cut in start..=end {
            let mut torn = img.clone();
            torn[cut..].fill(0);
            let r = scan(&[(0, &torn)]);
            let got: Vec<WalRecord> = r.records.iter().map(|(_, r)| r.clone()).collect();
            assert_eq!(
                r.stats.corrupt_batches + r.stats.lost_batches,
                0,
                "cut {cut}"
            );
            if cut == end || (cut > start && torn[start..end] == img[start..end]) {
                assert_eq!(got, batches.concat(), "cut {cut}: complete batch");
                continue;
            }
            assert_eq!(got, acked, "cut {cut}");
            assert_eq!(
                r.write_at,
                Some(WalPosition {
                    segment: 0,
                    byte: start as u64
                }),
                "cut {cut}"
            );
            assert_eq!(r.next_seq, 4);
            let header_whole = cut >= start + BATCH_HEADER_BYTES;
            assert_eq!(
                r.truncate.map(|t| t.0.byte),
                header_whole.then_some(start as u64),
                "cut {cut}"
            );
            let new = records(&mut rng, 1);
            continue_log(&mut torn, &r, &new);
            let r = scan(&[(0, &torn)]);
            assert_eq!(r.stats.corrupt_batches + r.stats.lost_batches, 0);
            let got: Vec<WalRecord> = r.records.into_iter().map(|(_, r)| r).collect();
            assert_eq!(got, [acked.clone(), new].concat(), "cut {cut}: continued");
            assert_eq!(r.next_seq, 5);
        }
    }

    #[test]
    fn corruption_in_the_middle_is_counted_and_skipped() {
        // Proves a flipped byte inside an acknowledged batch followed by valid batches is reported
        // as corruption (not a torn tail), the intact records before and after it are returned,
        // the damaged batch's leading intact records are salvaged, and nothing is truncated.
        let mut rng = Rng(0xb17f);
        let batches: Vec<_> = (0..5).map(|_| records(&mut rng, 4)).collect();
        let (mut img, spans) = build(0, &batches, 10, 64 << 10);
        // Damage the last record of batch 2.
        let mut payload = Vec::new();
        for r in &batches[2][..3] {
            encode_record(r, &mut payload).expect("encode");
        }
        img[spans[2].0 + BATCH_HEADER_BYTES + payload.len() + 20] ^= 0x40;
        let r = scan(&[(0, &img)]);
        assert_eq!((r.stats.corrupt_batches, r.stats.corrupt_records), (1, 1));
        assert!(r.truncate.is_none());
        let mut want: Vec<WalRecord> = batches[..2].concat();
        want.extend_from_slice(&batches[2][..3]);
        want.extend(batches[3..].concat());
        let got: Vec<WalRecord> = r.records.into_iter().map(|(_, r)| r).collect();
        assert_eq!(got, want);
        assert_eq!(r.next_seq, 15);
        // A destroyed header: the batch is gone, counted as a missing batch, the rest survives.
        let (mut img, spans) = build(0, &batches, 10, 64 << 10);
        img[spans[1].0 + 3] ^= 0xff;
        let r = scan(&[(0, &img)]);
        assert_eq!(r.stats.lost_batches, 1);
        assert_eq!(r.records.len(), 16);
    }

    /// Seals batch `i` of `build`'s image again with `in_flight_before` recorded.
    fn mark_in_flight(img: &mut [u8], span: (usize, usize), in_flight_before: u8) {
        let h = codec::decode_batch_header(&img[span.0..], 0).expect("valid header");
        seal_batch_flagged(
            &mut img[span.0..span.1],
            0,
            h.seq,
            h.record_count,
            h.payload_len as usize,
            in_flight_before,
        );
    }

    #[test]
    fn a_lost_in_flight_batch_followed_by_pipelined_batches_is_the_torn_tail() {
        // Proves that when power loss drops batch k's unsynced write but keeps the pipelined
        // batches started while k was in flight, recovery truncates k and them as the torn tail
        // (none was acknowledged) without reporting corruption, and continues at k with k's seq;
        // and that a later batch which started after k resolved makes k corruption in the middle
        // instead (k was acknowledged), keeping every intact batch.
        let mut rng = Rng(0x919e);
        let batches: Vec<_> = (0..5).map(|i| records(&mut rng, 2 + i)).collect();
        let (img, spans) = build(0, &batches, 1, 64 << 10);
        // Batches 3 and 4 (seq 4, 5) were started while batch 2 (seq 3) was in flight.
        for (lost, torn) in [(true, false), (false, true)] {
            let mut img = img.clone();
            mark_in_flight(&mut img, spans[3], 1);
            mark_in_flight(&mut img, spans[4], 2);
            if lost {
                img[spans[2].0..spans[2].1].fill(0);
            }
            if torn {
                img[spans[2].0 + BATCH_HEADER_BYTES + 3] ^= 0x01;
            }
            let r = scan(&[(0, &img)]);
            assert_eq!(
                r.stats.corrupt_batches + r.stats.lost_batches,
                0,
                "{:?}",
                r.stats
            );
            let got: Vec<WalRecord> = r.records.into_iter().map(|(_, r)| r).collect();
            assert_eq!(got, batches[..2].concat());
            assert_eq!(r.next_seq, 3);
            let at = WalPosition {
                segment: 0,
                byte: spans[2].0 as u64,
            };
            assert_eq!(r.write_at, Some(at));
            assert_eq!(r.truncate, Some((at, spans[4].1 as u64)));
        }
        // Deeper pipelines: seq 3 and 4 both lost, seq 5 started with both in flight; or seq 3
        // lost and seq 4 and 5 kept, each started while seq 3 was in flight: both are the torn
        // tail from seq 3 on. (Lost batches between kept ones are covered by `wal::sim`.)
        for (lost, marks) in [(vec![2, 3], vec![(4, 2)]), (vec![2], vec![(3, 1), (4, 2)])] {
            let mut img = img.clone();
            for (i, n) in marks {
                mark_in_flight(&mut img, spans[i], n);
            }
            for i in lost {
                img[spans[i].0..spans[i].1].fill(0);
            }
            let r = scan(&[(0, &img)]);
            assert_eq!(
                r.stats.corrupt_batches + r.stats.lost_batches,
                0,
                "{:?}",
                r.stats
            );
            assert_eq!(r.records.len(), batches[..2].concat().len());
            assert_eq!(r.next_seq, 3);
            assert_eq!(r.truncate.map(|t| t.1), Some(spans[4].1 as u64));
        }
        // Batch 4 (seq 5) started after seq 3 resolved (only seq 4 in flight): seq 3 was
        // acknowledged, its loss is corruption, batches 3 and 4 are kept.
        let mut img = img.clone();
        mark_in_flight(&mut img, spans[3], 1);
        mark_in_flight(&mut img, spans[4], 1);
        img[spans[2].0..spans[2].1].fill(0);
        let r = scan(&[(0, &img)]);
        assert_eq!(r.stats.lost_batches, 1);
        assert!(r.truncate.is_none());
        let got: Vec<WalRecord> = r.records.into_iter().map(|(_, r)| r).collect();
        let mut want = batches[..2].concat();
        want.extend(batches[3..].concat());
        assert_eq!(got, want);
        assert_eq!(r.next_seq, 6);
    }

    /// The image of a segment file recycled as segment `segment`: its earlier life as segment
    /// `old` (full of batches with sequence numbers from `old_seq`) with `batches` of this life
    /// written over its start. Returns the image and the end of this life's last batch.
    fn recycled(
        rng: &mut Rng,
        old: u64,
        old_seq: u64,
        segment: u64,
        batches: &[Vec<WalRecord>],
        first_seq: u64,
    ) -> (Vec<u8>, usize) {
        let stale: Vec<_> = (0..12).map(|_| records(rng, 6)).collect();
        let (mut img, stale_spans) = build(old, &stale, old_seq, 64 << 10);
        let (new, spans) = build(segment, batches, first_seq, 64 << 10);
        let end = spans.last().map_or(0, |s| s.1);
        assert!(stale_spans.last().expect("stale batches").1 > end + 4096);
        img[..end].copy_from_slice(&new[..end]);
        (img, end)
    }

    #[test]
    fn a_recycled_segment_s_old_batches_are_never_replayed_or_taken_for_corruption() {
        // Proves that the batches a recycled segment file kept from its earlier life (even with
        // sequence numbers above the log's) are neither returned nor reported as corruption: a
        // segment that ends in them rolls over normally, a log that ends in them continues after
        // its last batch with nothing to zero, a rollover to a recycled file that got no batch
        // yet drops that file, and damage to this life's last batch before a rollover is still
        // reported.
        let mut rng = Rng(0x5ec1);
        let a: Vec<_> = (0..2).map(|_| records(&mut rng, 3)).collect();
        let b: Vec<_> = (0..3).map(|_| records(&mut rng, 4)).collect();
        let c: Vec<_> = (0..1).map(|_| records(&mut rng, 2)).collect();
        let (img8, _) = build(8, &a, 298, 64 << 10);
        for old_seq in [100, 10_000] {
            let (img9, end9) = recycled(&mut rng, 5, old_seq, 9, &b, 300);
            let (img10, end10) = recycled(&mut rng, 6, old_seq + 50, 10, &c, 303);
            let all: Vec<WalRecord> = [a.concat(), b.concat(), c.concat()].concat();
            let r = scan(&[(8, &img8), (9, &img9), (10, &img10)]);
            assert_eq!(
                r.stats.corrupt_batches + r.stats.lost_batches,
                0,
                "{:?}",
                r.stats
            );
            let got: Vec<WalRecord> = r.records.iter().map(|(_, r)| r.clone()).collect();
            assert_eq!(got, all);
            let at = WalPosition {
                segment: 10,
                byte: end10 as u64,
            };
            assert_eq!((r.write_at, r.next_seq), (Some(at), 304));
            assert_eq!((r.truncate, r.stats.torn_bytes), (None, 0));
            let d = records(&mut rng, 2);
            let mut more10 = img10.clone();
            continue_log(&mut more10, &r, &d);
            let r = scan(&[(8, &img8), (9, &img9), (10, &more10)]);
            assert_eq!(
                r.stats.corrupt_batches + r.stats.lost_batches,
                0,
                "{:?}",
                r.stats
            );
            assert_eq!(r.records.len(), all.len() + 2);
            assert_eq!(r.next_seq, 305);
            // Crash right after segment 10 was renamed into place, before its first batch.
            let (stale10, _) = recycled(&mut rng, 6, old_seq + 50, 10, &[], 303);
            let r = scan(&[(8, &img8), (9, &img9), (10, &stale10)]);
            assert_eq!(
                r.stats.corrupt_batches + r.stats.lost_batches,
                0,
                "{:?}",
                r.stats
            );
            assert_eq!(r.records.len(), a.concat().len() + b.concat().len());
            let at9 = WalPosition {
                segment: 9,
                byte: end9 as u64,
            };
            assert_eq!((r.write_at, r.next_seq), (Some(at9), 303));
            assert_eq!((r.remove_segments, r.truncate), (vec![10], None));
            // This life's last batch of segment 9 destroyed: reported, the rest kept.
            let mut bad9 = img9.clone();
            let last9 =
                end9 - codec::batch_span(b[2].iter().map(codec::encoded_len).sum::<usize>());
            bad9[last9 + 3] ^= 0xff;
            let r = scan(&[(8, &img8), (9, &bad9), (10, &img10)]);
            assert!(
                r.stats.corrupt_batches + r.stats.lost_batches > 0,
                "{:?}",
                r.stats
            );
            assert_eq!(r.next_seq, 304);
        }
    }

    #[test]
    fn rollover_checkpoint_and_trailing_empty_segments() {
        // Proves a segment ending in zeros followed by the next segment is normal, only records
        // at/after the last checkpoint's position are replayed, and empty segments after the end
        // of the log are listed for removal.
        let mut rng = Rng(0xc4ec);
        let a = records(&mut rng, 2);
        let (img0, _) = build(0, std::slice::from_ref(&a), 1, 16 << 10);
        let b = records(&mut rng, 2);
        let cp = WalRecord::Checkpoint {
            upto: WalPosition {
                segment: 1,
                byte: 4096,
            },
            marks: Vec::new(),
        };
        let c = records(&mut rng, 1);
        let (img1, _) = build(1, &[b, vec![cp], c.clone()], 2, 16 << 10);
        let empty = vec![0u8; 16 << 10];
        let r = scan(&[(0, &img0), (1, &img1), (2, &empty)]);
        assert_eq!(r.stats.corrupt_batches + r.stats.lost_batches, 0);
        assert_eq!(r.records.into_iter().map(|(_, r)| r).collect::<Vec<_>>(), c);
        assert_eq!(r.remove_segments, vec![2]);
        assert_eq!(
            r.write_at,
            Some(WalPosition {
                segment: 1,
                byte: 3 * 4096
            })
        );
        assert_eq!(r.next_seq, 5);
    }
}
