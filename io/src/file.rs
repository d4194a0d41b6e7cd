//! Files opened for direct I/O, over glommio's `DmaFile`, with errors as `std::io::Error` that
//! keep the OS error code (so ENOSPC stays recognisable).
//!
//! Owns: opening (always read+write when writing: glommio's `DmaFile::create` is write-only and
//! the WAL reads back what it wrote), aligned buffers, positioned reads and writes, fdatasync,
//! pre-allocation, zeroing, directory fsync. Never buffers or caches, never retries.

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::task::Poll;

use glommio::io::{DmaBuffer, OpenOptions};

/// Alignment of offsets and lengths for direct I/O on these disks (and the WAL's batch unit).
pub const DIRECT_IO_ALIGN: usize = 4096;
/// Largest single read issued by [`DirectFile::read_exact_at`]; bigger reads are split.
pub const READ_CHUNK_BYTES_MAX: usize = 1 << 20;
/// Chunk reads in flight at once in [`DirectFile::read_exact_into`].
pub const READS_IN_FLIGHT_MAX: usize = 4;

/// Converts a glommio error into an io error, keeping the OS error code when there is one.
pub(crate) fn io_err<T>(e: glommio::GlommioError<T>) -> io::Error {
    match e {
        glommio::GlommioError::EnhancedIoError {
            source, op, path, ..
        } => {
            let msg = format!(
                "{op} {}: {source}",
                path.as_deref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            );
            match source.raw_os_error() {
                Some(code) => io::Error::new(
                    io::Error::from_raw_os_error(code).kind(),
                    OsError { code, msg },
                ),
                None => io::Error::new(source.kind(), msg),
            }
        }
        other => io::Error::from(other),
    }
}

/// An io error message that remembers its OS error code.
#[derive(Debug)]
struct OsError {
    code: i32,
    msg: String,
}

impl std::fmt::Display for OsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.msg)
    }
}

impl std::error::Error for OsError {}

/// Makes `path` a file of `len` bytes unless it already is one: written under a name of its own
/// and renamed into place, so that an executor probing it at the same moment (DESIGN.md §5: the
/// first direct-I/O file an executor opens must not be empty) never sees it empty or short. Two
/// writers race harmlessly: both rename a complete file.
pub fn ensure_probe_file(path: &Path, len: usize) -> io::Result<()> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    if std::fs::metadata(path).is_ok_and(|m| m.len() >= len as u64) {
        return Ok(());
    }
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}-{n}.tmp", std::process::id()));
    let tmp = std::path::PathBuf::from(tmp);
    let written =
        std::fs::write(&tmp, vec![0x4e_u8; len]).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// The OS error code of `e`, also through [`io_err`]'s wrapping.
pub fn os_error_code(e: &io::Error) -> Option<i32> {
    e.raw_os_error().or_else(|| {
        e.get_ref()
            .and_then(|i| i.downcast_ref::<OsError>())
            .map(|o| o.code)
    })
}

/// True when `e` is ENOSPC (or EDQUOT, a quota that is full).
pub fn is_disk_full(e: &io::Error) -> bool {
    matches!(os_error_code(e), Some(libc::ENOSPC) | Some(libc::EDQUOT))
        || e.kind() == io::ErrorKind::StorageFull
}

/// True when `e` is EOPNOTSUPP: the file system cannot do what was asked (`fallocate` on some
/// file systems), and the caller goes on without it.
pub fn is_unsupported(e: &io::Error) -> bool {
    os_error_code(e) == Some(libc::EOPNOTSUPP)
}

/// An EIO error, as a failing disk answers a write or an fsync (for fault injection).
pub fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

/// An aligned buffer for direct writes.
pub struct AlignedBuf(DmaBuffer);

impl AlignedBuf {
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl AsMut<[u8]> for AlignedBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        self.0.as_bytes_mut()
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// A file opened with O_DIRECT.
pub struct DirectFile(glommio::io::DmaFile);

impl DirectFile {
    /// Opens read+write, creating the file when `create`; fails if it exists and `create_new`.
    ///
    /// Opened with `O_NOATIME` where the kernel allows it (the file's owner): the read-back of
    /// every WAL batch would otherwise update the access time, dirty the inode, and make the
    /// next fdatasync write the inode table block before its flush (measured: about half of the
    /// fdatasyncs that carried an inode write). Without permission, opened without it.
    pub async fn open_rw(path: &Path, create: bool, create_new: bool) -> io::Result<DirectFile> {
        let open = |flags: i32| {
            let mut o = OpenOptions::new();
            o.read(true)
                .write(true)
                .create(create)
                .create_new(create_new)
                .custom_flags(flags);
            o
        };
        match open(libc::O_NOATIME).dma_open(path).await.map_err(io_err) {
            // EPERM: not the file's owner (the only refusal O_NOATIME adds).
            Err(e) if os_error_code(&e) == Some(libc::EPERM) => {
                Ok(DirectFile(open(0).dma_open(path).await.map_err(io_err)?))
            }
            r => r.map(DirectFile),
        }
    }

    pub async fn open_read(path: &Path) -> io::Result<DirectFile> {
        Ok(DirectFile(
            glommio::io::DmaFile::open(path).await.map_err(io_err)?,
        ))
    }

    /// A buffer of `len` bytes (rounded up to the alignment by the caller) suitable for writes.
    pub fn alloc(&self, len: usize) -> AlignedBuf {
        AlignedBuf(self.0.alloc_dma_buffer(len))
    }

    /// Writes the whole buffer at `pos` (both aligned). A short write is an error.
    pub async fn write_all_at(&self, buf: AlignedBuf, pos: u64) -> io::Result<()> {
        let len = buf.len();
        let n = self.0.write_at(buf.0, pos).await.map_err(io_err)?;
        if n != len {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short write: {n} of {len} bytes at {pos}"),
            ));
        }
        Ok(())
    }

    /// Reads exactly `len` bytes at `pos` (aligned) into a new vector; fewer bytes is an error.
    pub async fn read_exact_at(&self, pos: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let want = (len - out.len()).min(READ_CHUNK_BYTES_MAX);
            let at = pos + out.len() as u64;
            let r = self.0.read_at_aligned(at, want).await.map_err(io_err)?;
            if r.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("read at {at}: end of file"),
                ));
            }
            out.extend_from_slice(&r[..r.len().min(want)]);
        }
        Ok(out)
    }

    /// Reads exactly `len` bytes at `pos` (aligned) and hands them to `check`. When one read
    /// covers them (up to [`READ_CHUNK_BYTES_MAX`], every WAL batch but the largest), `check`
    /// runs on the read's own DMA buffer: no copy and no second buffer. Longer spans, and a short
    /// read, are gathered by [`Self::read_exact_at`] first.
    pub async fn read_exact_with<R>(
        &self,
        pos: u64,
        len: usize,
        check: impl FnOnce(&[u8]) -> R,
    ) -> io::Result<R> {
        if len <= READ_CHUNK_BYTES_MAX {
            let r = self.0.read_at_aligned(pos, len).await.map_err(io_err)?;
            if r.len() >= len {
                return Ok(check(&r[..len]));
            }
        }
        Ok(check(&self.read_exact_at(pos, len).await?))
    }

    /// Fills `out` (length aligned) from `pos` (aligned), with up to [`READS_IN_FLIGHT_MAX`] chunk
    /// reads of [`READ_CHUNK_BYTES_MAX`] in flight at once. Fewer bytes than asked is an error.
    pub async fn read_exact_into(&self, pos: u64, out: &mut [u8]) -> io::Result<()> {
        let group_bytes = READ_CHUNK_BYTES_MAX * READS_IN_FLIGHT_MAX;
        for (g, group) in out.chunks_mut(group_bytes).enumerate() {
            let base = pos + (g * group_bytes) as u64;
            type ReadFut<'a> = Pin<Box<dyn Future<Output = io::Result<()>> + 'a>>;
            let mut reads: Vec<ReadFut<'_>> = group
                .chunks_mut(READ_CHUNK_BYTES_MAX)
                .enumerate()
                .map(|(c, chunk)| {
                    let at = base + (c * READ_CHUNK_BYTES_MAX) as u64;
                    Box::pin(self.read_chunk_into(at, chunk)) as ReadFut<'_>
                })
                .collect();
            let mut done: Vec<Option<io::Result<()>>> = reads.iter().map(|_| None).collect();
            std::future::poll_fn(|cx| {
                for (r, slot) in reads.iter_mut().zip(done.iter_mut()) {
                    if slot.is_none() {
                        if let Poll::Ready(v) = r.as_mut().poll(cx) {
                            *slot = Some(v);
                        }
                    }
                }
                if done.iter().all(Option::is_some) {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            })
            .await;
            for r in done {
                r.expect("all reads completed")?;
            }
        }
        Ok(())
    }

    /// One read of `out.len()` bytes at `pos`, copied straight into `out` (no intermediate vector).
    async fn read_chunk_into(&self, pos: u64, out: &mut [u8]) -> io::Result<()> {
        let mut filled = 0;
        while filled < out.len() {
            let at = pos + filled as u64;
            let r = self
                .0
                .read_at_aligned(at, out.len() - filled)
                .await
                .map_err(io_err)?;
            if r.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("read at {at}: end of file"),
                ));
            }
            let n = r.len().min(out.len() - filled);
            out[filled..filled + n].copy_from_slice(&r[..n]);
            filled += n;
        }
        Ok(())
    }

    /// Reads `len` bytes at any `pos` (unaligned allowed); may return fewer at end of file.
    pub async fn read_at(&self, pos: u64, len: usize) -> io::Result<Vec<u8>> {
        let r = self.0.read_at(pos, len).await.map_err(io_err)?;
        Ok(r.to_vec())
    }

    pub async fn fdatasync(&self) -> io::Result<()> {
        self.0.fdatasync().await.map_err(io_err)
    }

    /// Reserves `[0, len)` on disk (fallocate, size becomes at least `len`): ENOSPC shows here.
    /// The executor's form, over the ring, for WAL segments; files written with blocking
    /// `std::fs` calls use [`crate::durable::allocate`] and [`crate::durable::reserve_blocks`].
    pub async fn pre_allocate(&self, len: u64) -> io::Result<()> {
        self.0.pre_allocate(len, false).await.map_err(io_err)
    }

    pub async fn truncate(&self, len: u64) -> io::Result<()> {
        self.0.truncate(len).await.map_err(io_err)
    }

    pub async fn file_size(&self) -> io::Result<u64> {
        self.0.file_size().await.map_err(io_err)
    }

    /// Writes zeros over `[from, to)` (aligned), in chunks.
    pub async fn zero_range(&self, from: u64, to: u64) -> io::Result<()> {
        let mut at = from;
        while at < to {
            let n = ((to - at) as usize).min(READ_CHUNK_BYTES_MAX);
            let mut b = self.alloc(n);
            b.as_mut().fill(0);
            self.write_all_at(b, at).await?;
            at += n as u64;
        }
        Ok(())
    }

    pub async fn close(self) -> io::Result<()> {
        self.0.close().await.map_err(io_err)
    }
}

/// fsyncs a directory, so that files created, renamed or removed in it stay so after a crash.
/// The executor's form, over the ring, for the WAL; blocking code uses
/// [`crate::durable::sync_dir`].
pub async fn sync_dir(path: &Path) -> io::Result<()> {
    let d = glommio::io::Directory::open(path).await.map_err(io_err)?;
    d.sync().await.map_err(io_err)?;
    d.close().await.map_err(io_err)
}

/// Renames a file (rename(2), atomic). The caller fsyncs the directory when it must persist.
pub async fn rename(from: &Path, to: &Path) -> io::Result<()> {
    glommio::io::rename(from, to).await.map_err(io_err)
}

/// Removes a file (unlink). The caller fsyncs the directory when the removal must persist.
pub async fn remove_file(path: &Path) -> io::Result<()> {
    glommio::io::remove(path).await.map_err(io_err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn enospc_survives_glommio_error_wrapping() {
        // Proves that an ENOSPC from glommio (wrapped with operation and path) is still
        // recognised as disk full after conversion, and that EIO is not.
        let wrap = |code| {
            io_err::<()>(glommio::GlommioError::EnhancedIoError {
                source: io::Error::from_raw_os_error(code),
                op: "Pre-allocate space",
                path: Some(PathBuf::from("/x/00000000000000000001.wal")),
                fd: Some(3),
            })
        };
        // The code the O_NOATIME fallback of `open_rw` looks for survives the wrapping too.
        assert_eq!(os_error_code(&wrap(libc::EPERM)), Some(libc::EPERM));
        let e = wrap(libc::ENOSPC);
        assert!(is_disk_full(&e), "{e:?}");
        assert_eq!(os_error_code(&e), Some(libc::ENOSPC));
        assert!(e.to_string().contains("00000000000000000001.wal"), "{e}");
        assert!(!is_disk_full(&wrap(libc::EIO)));
        assert!(is_disk_full(&io::Error::from_raw_os_error(libc::ENOSPC)));
    }

    /// A fresh directory for one test (removed by the test) and the path of file `f` in it,
    /// holding `contents` when given. A file written before its first direct-I/O open, as the
    /// WAL's segments are: glommio's I/O-poll probe takes an empty file as pollable, and this
    /// device cannot poll.
    fn test_file(tag: &str, contents: Option<&[u8]>) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("narad-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        if let Some(c) = contents {
            std::fs::write(&path, c).unwrap();
        }
        (dir, path)
    }

    #[test]
    fn probe_files_are_never_seen_short_by_concurrent_starters() {
        // Proves `ensure_probe_file` never exposes an empty or short file, even while other
        // threads create it at the same moment and one keeps removing it (every shard of a node
        // probes the same file at start; a short one made glommio pick polled I/O, and reads
        // then failed with EOPNOTSUPP). Bounded: 4 threads x 300 rounds.
        let (dir, path) = test_file("probe-race", None);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let path = path.clone();
                std::thread::spawn(move || {
                    for i in 0..300 {
                        if t == 0 && i % 3 == 0 {
                            let _ = std::fs::remove_file(&path);
                        }
                        ensure_probe_file(&path, 4096).unwrap();
                        match std::fs::read(&path) {
                            Ok(b) => assert_eq!(b.len(), 4096, "thread {t} round {i}"),
                            Err(e) => assert_eq!(e.kind(), io::ErrorKind::NotFound),
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            left,
            [std::ffi::OsString::from("f")],
            "no temporary file left"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn read_write_files_do_not_update_the_access_time() {
        // Proves `open_rw` asks for O_NOATIME (the file is ours), so WAL read-backs leave the
        // inode clean for the next fdatasync, and that the file still reads and writes.
        let (dir, path) = test_file("noatime", None);
        let p = path.clone();
        let flags = crate::rt::block_on(async move {
            let f = DirectFile::open_rw(&p, true, true).await.unwrap();
            let mut buf = f.alloc(4096);
            buf.as_mut().fill(7);
            f.write_all_at(buf, 0).await.unwrap();
            // SAFETY: fcntl(F_GETFL) on a descriptor the open file owns; no memory is passed.
            let flags =
                unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&f.0), libc::F_GETFL) };
            f.close().await.unwrap();
            flags
        });
        assert_ne!(flags & libc::O_NOATIME, 0, "flags {flags:#x}");
        assert_eq!(std::fs::read(&path).unwrap(), vec![7u8; 4096]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn sequential_direct_reads_each_complete_without_waiting_for_a_timer() {
        // Proves every completion reaches the executor promptly with the rings set up for
        // cooperative task running (vendor/glommio/NARAD.md: the kernel posts a completion at the
        // thread's next pass through the kernel instead of interrupting it): 2,000 reads one
        // after another, each awaited, each answered well before its 3 s timer. A completion left
        // unposted while the executor sleeps would only surface when that timer fires.
        let (dir, path) = test_file("coopreads", Some(&[5u8; 16 * DIRECT_IO_ALIGN]));
        let p = path.clone();
        let slowest = crate::rt::block_on(async move {
            let f = DirectFile::open_read(&p).await.unwrap();
            let mut slowest = std::time::Duration::ZERO;
            for i in 0..2_000u64 {
                let at = (i % 16) * DIRECT_IO_ALIGN as u64;
                let t = std::time::Instant::now();
                let sum = crate::rt::timeout(
                    std::time::Duration::from_secs(3),
                    f.read_exact_with(at, DIRECT_IO_ALIGN, |b| {
                        b.iter().map(|&x| x as u64).sum::<u64>()
                    }),
                )
                .await
                .expect("read answered in time")
                .unwrap();
                assert_eq!(sum, 5 * DIRECT_IO_ALIGN as u64);
                slowest = slowest.max(t.elapsed());
            }
            f.close().await.unwrap();
            slowest
        });
        assert!(
            slowest < std::time::Duration::from_secs(3),
            "slowest read {slowest:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn read_exact_with_sees_the_bytes_of_one_read_or_of_many() {
        // Proves `read_exact_with` hands `check` exactly the bytes at `pos..pos + len`, for a
        // span one read covers (checked on the DMA buffer) and for one split over several reads,
        // and that reading past the end of the file is an error, as with `read_exact_at`.
        let total = READ_CHUNK_BYTES_MAX + 3 * DIRECT_IO_ALIGN;
        let want: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
        let (dir, path) = test_file("readwith", Some(&want));
        let p = path.clone();
        let (small, large, past) = crate::rt::block_on(async move {
            let f = DirectFile::open_rw(&p, false, false).await.unwrap();
            let small = f
                .read_exact_with(8192, 3 * DIRECT_IO_ALIGN, |b| b.to_vec())
                .await
                .unwrap();
            let large = f
                .read_exact_with(4096, READ_CHUNK_BYTES_MAX + 2 * DIRECT_IO_ALIGN, |b| {
                    b.to_vec()
                })
                .await
                .unwrap();
            let past = f
                .read_exact_with(total as u64, DIRECT_IO_ALIGN, |b| b.len())
                .await;
            f.close().await.unwrap();
            (small, large, past)
        });
        assert_eq!(small, want[8192..8192 + 3 * DIRECT_IO_ALIGN]);
        assert_eq!(large.len(), READ_CHUNK_BYTES_MAX + 2 * DIRECT_IO_ALIGN);
        assert!(large == want[4096..], "large span differs");
        assert!(past.is_err(), "{past:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
