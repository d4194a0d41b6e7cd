//! Unit tests of the partition segment store on the real file system (temporary directories).

use super::*;

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("narad-part-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const KEY: PartitionKey = PartitionKey {
    topic: TopicId(0xabc),
    partition: PartitionId(7),
};

fn payload(o: u64) -> Vec<u8> {
    format!("payload-{o}-")
        .repeat((o % 7 + 1) as usize)
        .into_bytes()
}

/// Appends `n` records in batches of `per_batch`, commit time = offset.
fn fill(p: &mut PartitionLog, n: u64, per_batch: u64) {
    let mut o = p.next_offset().0;
    let end = o + n;
    while o < end {
        let mut b = EncodedBatch::new(Offset(o));
        for _ in 0..per_batch.min(end - o) {
            let key = o.is_multiple_of(3).then(|| format!("k{o}").into_bytes());
            b.push_message(UnixMillis(1000 + o), key.as_deref(), &payload(o));
            o += 1;
        }
        p.append(&b).unwrap();
    }
}

fn check_all(p: &PartitionLog, from: u64, to: u64) {
    let mut o = from;
    while o < to {
        let recs = p.read(Offset(o), 17, 1 << 20).unwrap();
        assert!(!recs.is_empty(), "no record at {o}");
        for r in recs {
            assert_eq!(r.offset, Offset(o));
            assert_eq!(r.payload, payload(o));
            assert_eq!(r.commit_ms, UnixMillis(1000 + o));
            assert_eq!(
                r.msg_key.as_deref(),
                o.is_multiple_of(3)
                    .then(|| format!("k{o}").into_bytes())
                    .as_deref()
            );
            o += 1;
        }
    }
    assert_eq!(o, to);
}

#[test]
fn append_read_across_segments_and_reopen() {
    // Proves dense offsets from 0, reads across several segment rolls, and that reopening
    // rebuilds the same index from the files alone.
    let t = TempDir::new("roundtrip");
    let mut p = PartitionLog::create(&t.0, KEY, 4096).unwrap();
    fill(&mut p, 500, 9);
    assert_eq!(p.next_offset(), Offset(500));
    assert!(p.stats().segments > 5, "{:?}", p.stats());
    check_all(&p, 0, 500);
    assert!(p.read(Offset(500), 10, 1000).unwrap().is_empty());
    let stats = p.stats();
    drop(p);
    let (p, rep) = PartitionLog::open(&partition_dir(&t.0, KEY), KEY, 4096).unwrap();
    assert_eq!(rep.records, 500);
    assert_eq!(rep.torn_tail_bytes, 0);
    assert_eq!(rep.corrupt_records, 0);
    assert_eq!(p.stats(), stats);
    check_all(&p, 0, 500);
    assert_eq!(
        scan_partition_dirs(&t.0).unwrap(),
        vec![(KEY, partition_dir(&t.0, KEY))]
    );
}

#[test]
fn read_limits_are_honoured() {
    // Proves max_records and max_bytes bound a read, and the first record is returned even when
    // it alone exceeds max_bytes.
    let t = TempDir::new("limits");
    let mut p = PartitionLog::create(&t.0, KEY, 1 << 20).unwrap();
    fill(&mut p, 50, 50);
    assert_eq!(p.read(Offset(3), 5, 1 << 20).unwrap().len(), 5);
    let one = p.read(Offset(3), 100, 1).unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].offset, Offset(3));
    let frame = message_len(&p, 3) + message_len(&p, 4);
    assert_eq!(p.read(Offset(3), 100, frame).unwrap().len(), 2);
    assert_eq!(p.read(Offset(3), 0, 1 << 20).unwrap().len(), 1);
}

fn message_len(p: &PartitionLog, o: u64) -> usize {
    let r = &p.read(Offset(o), 1, 0).unwrap()[0];
    frame::message_frame_len(r.msg_key.as_deref(), &r.payload)
}

#[test]
fn torn_tail_at_every_byte_recovers_the_complete_prefix() {
    // Proves that cutting the newest segment at any byte of its last three frames recovers
    // exactly the complete frames before the cut, and the log continues at the right offset.
    let t = TempDir::new("torn");
    let mut p = PartitionLog::create(&t.0, KEY, 1 << 20).unwrap();
    fill(&mut p, 20, 4);
    let seg = segment_path(&partition_dir(&t.0, KEY), Offset(0));
    drop(p);
    let full = std::fs::read(&seg).unwrap();
    let (p, _) = PartitionLog::open(&partition_dir(&t.0, KEY), KEY, 1 << 20).unwrap();
    let starts: Vec<u64> = p.segments[0]
        .positions
        .iter()
        .map(|&x| u64::from(x))
        .collect();
    drop(p);
    for cut in starts[17] as usize..full.len() {
        std::fs::write(&seg, &full[..cut]).unwrap();
        let (mut p, rep) = PartitionLog::open(&partition_dir(&t.0, KEY), KEY, 1 << 20).unwrap();
        let ends = starts.iter().skip(1).copied().chain([full.len() as u64]);
        let complete = ends.filter(|&e| e <= cut as u64).count() as u64;
        assert_eq!(p.next_offset(), Offset(complete), "cut at {cut}");
        assert_eq!(rep.corrupt_records, 0);
        check_all(&p, 0, complete);
        fill(&mut p, 20 - complete, 3);
        check_all(&p, 0, 20);
        drop(p);
        std::fs::write(&seg, &full).unwrap();
    }
}

#[test]
fn damage_in_the_middle_keeps_offsets_dense() {
    // Proves a damaged frame in a sealed segment reads as Corrupt at its own offset, every other
    // record stays readable at its offset, and a read stops before the damaged record.
    let t = TempDir::new("middle");
    let mut p = PartitionLog::create(&t.0, KEY, 4096).unwrap();
    fill(&mut p, 200, 5);
    let dir = partition_dir(&t.0, KEY);
    let first = p.segments[0].positions.clone();
    let victim = 4usize;
    drop(p);
    let seg = segment_path(&dir, Offset(0));
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[first[victim] as usize + 40] ^= 0xff;
    std::fs::write(&seg, &bytes).unwrap();
    let (p, rep) = PartitionLog::open(&dir, KEY, 4096).unwrap();
    assert_eq!(rep.corrupt_records, 1);
    assert_eq!(p.next_offset(), Offset(200));
    check_all(&p, 0, victim as u64);
    assert!(matches!(
        p.read(Offset(victim as u64), 5, 1 << 20),
        Err(ReadError::Corrupt { offset: Offset(4) })
    ));
    assert_eq!(p.read(Offset(2), 10, 1 << 20).unwrap().len(), 2);
    check_all(&p, victim as u64 + 1, 200);
}

#[test]
fn an_empty_segment_from_a_failed_roll_does_not_cut_the_one_before() {
    // Proves the audit s21 crash C1 repair: a roll that failed on a full disk left an empty
    // newer segment file whose base lies inside the previous segment (the records from there
    // on were written to the previous one). Opening must keep every record and remove the
    // empty file; it used to take the file as the newer segment and cut the previous one at
    // its base, losing records answered 202. A file of only a header counts as empty too.
    for header_only in [false, true] {
        let t = TempDir::new(if header_only {
            "failed-roll-h"
        } else {
            "failed-roll"
        });
        let mut p = PartitionLog::create(&t.0, KEY, 1 << 20).unwrap();
        fill(&mut p, 30, 4);
        drop(p);
        let dir = partition_dir(&t.0, KEY);
        let stray = segment_path(&dir, Offset(20));
        let bytes = if header_only {
            frame::encode_segment_header(KEY, Offset(20)).to_vec()
        } else {
            Vec::new()
        };
        std::fs::write(&stray, bytes).unwrap();
        let (p, rep) = PartitionLog::open(&dir, KEY, 1 << 20).unwrap();
        assert_eq!(rep.corrupt_records, 0);
        assert_eq!(p.next_offset(), Offset(30));
        check_all(&p, 0, 30);
        assert!(!stray.exists());
    }
}

#[test]
fn missing_segment_reads_as_corrupt_not_shifted() {
    // Proves that a lost middle segment file leaves a hole of Corrupt offsets; the following
    // records keep their offsets.
    let t = TempDir::new("hole");
    let mut p = PartitionLog::create(&t.0, KEY, 4096).unwrap();
    fill(&mut p, 200, 5);
    let second = p.segments[1].base;
    let third = p.segments[2].base;
    drop(p);
    let dir = partition_dir(&t.0, KEY);
    std::fs::remove_file(segment_path(&dir, second)).unwrap();
    let (p, rep) = PartitionLog::open(&dir, KEY, 4096).unwrap();
    assert_eq!(rep.corrupt_records, third.0 - second.0);
    assert_eq!(p.next_offset(), Offset(200));
    assert!(matches!(
        p.read(second, 5, 1 << 20),
        Err(ReadError::Corrupt { .. })
    ));
    check_all(&p, third.0, 200);
    check_all(&p, 0, second.0);
}

#[test]
fn retention_deletes_whole_sealed_segments_only() {
    // Proves retention deletes only sealed segments whose newest record is old enough, never the
    // active one, answers BelowRetention below the new oldest offset, and raises the frontier.
    let t = TempDir::new("retention");
    let mut p = PartitionLog::create(&t.0, KEY, 4096).unwrap();
    fill(&mut p, 300, 10);
    let segs = p.stats().segments;
    assert_eq!(p.enforce_retention(0, UnixMillis(u64::MAX)).unwrap(), 0);
    // Records 0..150 have commit times 1000..1150: cutoff 1150 deletes segments ending before.
    let deleted = p
        .enforce_retention(1_000_000, UnixMillis(1_001_150))
        .unwrap();
    assert!(deleted > 0);
    let oldest = p.oldest_offset();
    assert!(oldest.0 > 0 && oldest.0 <= 150, "{oldest:?}");
    assert!(
        matches!(p.read(Offset(0), 1, 100), Err(ReadError::BelowRetention { oldest: o }) if o == oldest)
    );
    check_all(&p, oldest.0, 300);
    assert_eq!(p.settled().frontier, oldest);
    assert_eq!(
        std::fs::read_dir(p.dir()).unwrap().count() as u32,
        p.stats().segments
    );
    p.enforce_retention(1, UnixMillis(u64::MAX)).unwrap();
    assert_eq!(p.stats().segments, 1);
    assert!(p.stats().segments < segs);
    check_all(&p, p.oldest_offset().0, 300);
    drop(p);
    let (p, _) = PartitionLog::open(&partition_dir(&t.0, KEY), KEY, 4096).unwrap();
    assert_eq!(p.settled().frontier, p.oldest_offset());
}

#[test]
fn settled_state_is_written_by_sync_work() {
    // Proves settles reach the consumer state file through the checkpoint's sync work and are
    // loaded on reopen; a partition with nothing dirty yields empty work.
    let t = TempDir::new("settled");
    let mut p = PartitionLog::create(&t.0, KEY, 4096).unwrap();
    fill(&mut p, 10, 10);
    p.settle(&[Offset(0), Offset(1), Offset(5)]);
    p.take_sync_work()
        .unwrap()
        .run()
        .map_err(|e| e.to_string())
        .unwrap();
    assert!(p.take_sync_work().unwrap().is_empty());
    drop(p);
    let (p, _) = PartitionLog::open(&partition_dir(&t.0, KEY), KEY, 4096).unwrap();
    assert_eq!(
        p.settled(),
        Settled {
            frontier: Offset(2),
            ahead: vec![Offset(5)]
        }
    );
}

#[test]
fn gap_frames_read_as_corrupt() {
    // Proves a gap placeholder occupies its offset and reads as Corrupt, also after reopen.
    let t = TempDir::new("gap");
    let mut p = PartitionLog::create(&t.0, KEY, 4096).unwrap();
    fill(&mut p, 3, 3);
    let mut b = EncodedBatch::new(Offset(3));
    b.push_gap();
    p.append(&b).unwrap();
    fill(&mut p, 2, 2);
    for p in [
        p,
        PartitionLog::open(&partition_dir(&t.0, KEY), KEY, 4096)
            .unwrap()
            .0,
    ] {
        assert!(matches!(
            p.read(Offset(3), 5, 1 << 20),
            Err(ReadError::Corrupt { offset: Offset(3) })
        ));
        assert_eq!(p.read(Offset(0), 10, 1 << 20).unwrap().len(), 3);
        check_all(&p, 4, 6);
    }
}

#[test]
fn reserve_allocates_without_changing_length_and_rolls_early() {
    // Proves reserve() allocates blocks ahead of writes while the file length (what recovery
    // scans) stays at the written data, and rolls to a new segment before a batch that would
    // overflow the active one, so the following append needs no roll.
    use std::os::unix::fs::MetadataExt;
    let t = TempDir::new("reserve");
    let mut p = PartitionLog::create(&t.0, KEY, 8192).unwrap();
    p.reserve(100).unwrap();
    let seg0 = segment_path(&partition_dir(&t.0, KEY), Offset(0));
    let m = std::fs::metadata(&seg0).unwrap();
    assert_eq!(m.len(), frame::SEGMENT_HEADER_BYTES as u64);
    assert!(m.blocks() * 512 >= 4096, "blocks reserved: {}", m.blocks());
    fill(&mut p, 40, 40);
    let segs = p.stats().segments;
    p.reserve(8000).unwrap();
    assert_eq!(p.stats().segments, segs + 1, "rolled before the write");
    let next = p.next_offset().0;
    let mut b = EncodedBatch::new(Offset(next));
    b.push_message(UnixMillis(1000 + next), None, &payload(next));
    p.append(&b).unwrap();
    assert_eq!(p.stats().segments, segs + 1);
    drop(p);
    let (p, rep) = PartitionLog::open(&partition_dir(&t.0, KEY), KEY, 8192).unwrap();
    assert_eq!(rep.torn_tail_bytes, 0);
    assert_eq!(p.next_offset(), Offset(41));
}

/// Appends one message at a time (reserving first, as the log does) from offset `*o` until the
/// active segment holds `bytes`.
fn append_until(p: &mut PartitionLog, o: &mut u64, bytes: u64) {
    while p.segments.back().unwrap().size_bytes < bytes {
        let mut b = EncodedBatch::new(Offset(*o));
        b.push_message(UnixMillis(1000 + *o), None, &payload(*o));
        p.reserve(b.byte_len() as u64).unwrap();
        p.append(&b).unwrap();
        *o += 1;
    }
}

#[test]
fn reservation_grows_with_the_segment() {
    // Proves a quiet partition holds little disk (one small message: at most the minimum chunk
    // plus a block), while a growing segment reserves ahead by its own length, up to a megabyte.
    use std::os::unix::fs::MetadataExt;
    let t = TempDir::new("reserve-grow");
    let mut p = PartitionLog::create(&t.0, KEY, 64 << 20).unwrap();
    let seg0 = segment_path(&partition_dir(&t.0, KEY), Offset(0));
    let disk = || std::fs::metadata(&seg0).unwrap().blocks() * 512;
    p.reserve(300).unwrap();
    fill(&mut p, 1, 1);
    assert!(
        disk() <= RESERVE_CHUNK_BYTES_MIN + 4096,
        "one message holds {} bytes",
        disk()
    );
    // Past 256 KiB written, the reservation runs at least 256 KiB ahead.
    let mut o = 1;
    append_until(&mut p, &mut o, 256 << 10);
    let size = p.segments.back().unwrap().size_bytes;
    p.reserve(p.reserved_end - size + 1).unwrap();
    assert_eq!(
        p.reserved_end,
        2 * size,
        "reserved ahead by the segment's length"
    );
    assert!(disk() >= 2 * size, "{} on disk for {size}", disk());
    // Past a megabyte, a megabyte ahead.
    append_until(&mut p, &mut o, RESERVE_CHUNK_BYTES + 1000);
    let size = p.segments.back().unwrap().size_bytes;
    p.reserve(p.reserved_end - size + 1).unwrap();
    assert_eq!(p.reserved_end, size + RESERVE_CHUNK_BYTES);
}

#[test]
fn sealed_segments_recover_from_index_files() {
    // Proves a checkpoint writes an index file for every sealed segment, recovery then loads
    // them instead of scanning (same index, same reads), and a damaged index file falls back to
    // scanning its segment.
    let t = TempDir::new("idx");
    let mut p = PartitionLog::create(&t.0, KEY, 4096).unwrap();
    fill(&mut p, 300, 7);
    let segs = p.stats().segments;
    p.take_sync_work()
        .unwrap()
        .run()
        .map_err(|e| e.to_string())
        .unwrap();
    let stats = p.stats();
    drop(p);
    let dir = partition_dir(&t.0, KEY);
    let (p, rep) = PartitionLog::open(&dir, KEY, 4096).unwrap();
    assert_eq!(rep.indexed_segments, segs - 1);
    assert_eq!(rep.records, 300);
    assert_eq!(p.stats(), stats);
    check_all(&p, 0, 300);
    drop(p);
    let idx = segment_path(&dir, Offset(0)).with_extension("idx");
    let mut b = std::fs::read(&idx).unwrap();
    b[50] ^= 1;
    std::fs::write(&idx, &b).unwrap();
    let (mut p, rep) = PartitionLog::open(&dir, KEY, 4096).unwrap();
    assert_eq!(rep.indexed_segments, segs - 2);
    check_all(&p, 0, 300);
    // Retention removes the index files with their segments.
    p.enforce_retention(1, UnixMillis(u64::MAX)).unwrap();
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
}

#[test]
fn writeback_covers_each_aligned_block_once_when_an_append_completes_it() {
    // Proves the early-writeback range: nothing until a 1 MiB block is complete, then exactly the
    // blocks the append completed (one or several), never the unfinished tail, and appends that
    // continue a block already written back start again at their own block.
    const M: u64 = WRITEBACK_STEP_BYTES;
    assert_eq!(completed_blocks(0, M - 1), None);
    assert_eq!(completed_blocks(M - 1, 1), Some((0, M)));
    assert_eq!(completed_blocks(M - 10, 20), Some((0, M)));
    assert_eq!(completed_blocks(M + 5, 10), None);
    assert_eq!(completed_blocks(M / 2, 3 * M), Some((0, 3 * M)));
    assert_eq!(completed_blocks(2 * M, M), Some((2 * M, M)));
    // Every byte of a stream of appends is covered exactly once, up to the last full block.
    let (mut at, mut covered) = (0u64, 0u64);
    for len in [100, 70_000, 900_000, 300_000, 2_500_000, 1, 64] {
        if let Some((from, n)) = completed_blocks(at, len) {
            assert_eq!(
                from, covered,
                "contiguous with what was written back before"
            );
            covered = from + n;
        }
        at += len;
    }
    assert_eq!(covered, at / M * M);
}

#[test]
fn io_stats_follow_writes_checkpoints_and_retention() {
    // Proves the per-partition figures of `/metrics`: every batch write counts once with its
    // frame bytes (which, with the segment headers, make up the partition's size), a checkpoint
    // share counts one fsync and one completed persist, a retention pass counts once and adds
    // exactly the bytes and records it deleted, and `commit_ms_at` reads a record's commit time
    // (none outside the retained range).
    let t = TempDir::new("io-stats");
    let mut p = PartitionLog::create(&t.0, KEY, 4096).unwrap();
    assert_eq!(p.io_stats(), PartitionIoStats::default());
    fill(&mut p, 300, 10);
    let s = p.io_stats();
    assert_eq!(s.flush.count(), 30);
    let headers = frame::SEGMENT_HEADER_BYTES as u64 * u64::from(p.stats().segments);
    assert_eq!(s.flush_bytes + headers, p.stats().size_bytes);
    assert_eq!((s.fsync.count(), s.persist_ok.count()), (0, 0));

    let w = p.take_sync_work().unwrap();
    assert_eq!(w.key(), KEY);
    let (times, r) = w.run_timed();
    assert!(r.is_ok());
    assert!(times.fsync <= times.total);
    p.record_sync(times, true);
    let s = p.io_stats();
    assert_eq!((s.fsync.count(), s.persist_ok.count()), (1, 1));
    assert_eq!(s.persist_failed.count(), 0);

    assert_eq!(p.commit_ms_at(Offset(42)), Some(UnixMillis(1042)));
    assert_eq!(p.commit_ms_at(Offset(300)), None);
    let (size, oldest) = (p.stats().size_bytes, p.oldest_offset());
    p.enforce_retention(0, UnixMillis(u64::MAX)).unwrap();
    assert_eq!(
        p.io_stats().retention_runs.count(),
        0,
        "no retention: no pass"
    );
    let deleted = p
        .enforce_retention(1_000_000, UnixMillis(1_001_150))
        .unwrap();
    let s = p.io_stats();
    assert_eq!(s.retention_runs.count(), 1);
    assert_eq!(s.retention_bytes_deleted, deleted);
    assert_eq!(size - p.stats().size_bytes, deleted);
    assert_eq!(s.retention_records_deleted, p.oldest_offset().0 - oldest.0);
    assert!(s.retention_records_deleted > 0);
    assert_eq!(p.commit_ms_at(Offset(0)), None, "deleted by retention");
}

#[test]
fn segment_files_are_opened_without_access_time_updates() {
    // Proves the segment opens ask for O_NOATIME (the files are ours): a new segment, a reopened
    // one, and a read-only open of a sealed one.
    use std::os::fd::AsRawFd;
    let d = TempDir::new("noatime");
    let key = PartitionKey {
        topic: TopicId(1),
        partition: PartitionId(0),
    };
    let flags = |f: &File| {
        // SAFETY: fcntl(F_GETFL) on a descriptor `f` owns; no memory is passed.
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) }
    };
    let (f, seg) = create_segment(&d.0, key, Offset(0)).unwrap();
    assert_ne!(flags(&f) & libc::O_NOATIME, 0);
    let path = segment_path(&d.0, seg.base);
    assert_ne!(flags(&open_rw(&path).unwrap()) & libc::O_NOATIME, 0);
    let ro = open_noatime(OpenOptions::new().read(true), &path).unwrap();
    assert_ne!(flags(&ro) & libc::O_NOATIME, 0);
}
