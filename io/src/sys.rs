//! Small safe wrappers over the operating-system calls the rest of the workspace needs outside
//! file and socket I/O: the one source of randomness, free space of a file system and the
//! calling thread's CPU time.
//!
//! Owns the `unsafe` and the libc types of those calls, so that `shard`, `raft` and the binary
//! never name `libc` (the other libc calls live with what they serve: sockets in [`crate::rt`],
//! files in [`crate::file`] and [`crate::durable`]). Never caches an answer.
//!
//! Randomness: every unpredictable value production code needs (topic ids, fan-out attach
//! epochs, generated passwords, the seeds of the lease-nonce generators, the starts of the
//! round-robin rotations, openraft's election timeouts) is drawn here, from the kernel's
//! getrandom(2). There is no fallback: when the kernel refuses, [`fill_random`] panics, because
//! nothing that relies on those values being unguessable can go on safely. Seeded generators
//! ([`crate::types::SplitMix64`]) only stretch a seed drawn here, or replay a test's seed.

use std::io;
use std::path::Path;

/// getrandom(2) calls interrupted by a signal that [`fill_random`] retries before giving up.
pub const RANDOM_INTERRUPTS_MAX: u32 = 64;

/// Fills `buf` with random bytes from the kernel (getrandom(2): the pool behind /dev/urandom,
/// which blocks only until it is initialised early at boot).
///
/// # Panics
/// When the kernel refuses (no getrandom, or more than [`RANDOM_INTERRUPTS_MAX`] interruptions
/// in a row): nothing secure can go on without unpredictable values.
pub fn fill_random(buf: &mut [u8]) {
    let mut filled = 0;
    let mut interrupts = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: getrandom writes at most `rest.len()` bytes into `rest`, which we own.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n > 0 {
            filled += n as usize;
            continue;
        }
        let e = io::Error::last_os_error();
        if n < 0 && e.kind() == io::ErrorKind::Interrupted && interrupts < RANDOM_INTERRUPTS_MAX {
            interrupts += 1;
            continue;
        }
        panic!(
            "the kernel refused random bytes (getrandom: {e}): ids, nonces and passwords \
             cannot be made unguessable, so nothing can go on"
        );
    }
}

/// A random u64 from [`fill_random`].
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    fill_random(&mut b);
    u64::from_le_bytes(b)
}

/// Bytes an unprivileged process may still write on the file system holding `path`
/// (`statvfs`: available blocks × fragment size; root's reserve not counted), or `None` when the
/// file system cannot be asked (a missing path, a path with a NUL byte).
pub fn filesystem_available_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut s = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a valid NUL-terminated path and `s` points to writable memory of the right
    // type; statvfs only writes into it and we read it only when it returned 0.
    let rc = unsafe { libc::statvfs(c.as_ptr(), s.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it initialised `s`.
    let s = unsafe { s.assume_init() };
    // The field types are 32-bit on some targets.
    #[allow(clippy::unnecessary_cast)]
    Some((s.f_bavail as u64).saturating_mul(s.f_frsize as u64))
}

/// CPU time the calling thread has used, in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`: time
/// preempted or stolen by the hypervisor is not counted), or `None` if the clock cannot be read.
pub fn thread_cpu_time_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return None;
    }
    Some(
        (ts.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec as u64),
    )
}

/// Makes closing socket `fd` abortive (`SO_LINGER` on with a zero timeout): `close` sends a
/// reset and discards whatever the kernel still holds unsent, instead of delivering it later.
pub fn set_linger_abort(fd: std::os::fd::RawFd) -> io::Result<()> {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `l` is a valid linger struct and its size is passed; a bad `fd` is an error return.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_bytes_fill_the_whole_buffer_and_differ() {
        // Proves fill_random writes every byte, also of a buffer larger than one getrandom call
        // is promised to fill (256 bytes), and that draws differ: two equal 1 MiB draws, or a
        // 64-bit draw repeating, would mean the same bytes were handed out twice.
        let mut a = vec![0u8; 1 << 20];
        let mut b = vec![0u8; 1 << 20];
        fill_random(&mut a);
        fill_random(&mut b);
        assert_ne!(a, b);
        // A zero run of 64 bytes in 1 MiB of random bytes has probability ~2^-492.
        assert!(
            a.windows(64).all(|w| w.iter().any(|&x| x != 0)),
            "unfilled run"
        );
        let draws: std::collections::HashSet<u64> = (0..1000).map(|_| random_u64()).collect();
        assert_eq!(draws.len(), 1000);
        fill_random(&mut []);
    }

    #[test]
    fn available_bytes_are_known_for_a_real_directory_only() {
        // Proves statvfs answers for an existing directory (a temp dir has some space) and
        // `None` for a path that does not exist or cannot be a C string.
        let tmp = std::env::temp_dir();
        assert!(filesystem_available_bytes(&tmp).is_some_and(|b| b > 0));
        assert_eq!(
            filesystem_available_bytes(Path::new("/nonexistent/narad/x")),
            None
        );
        assert_eq!(filesystem_available_bytes(Path::new("a\0b")), None);
    }

    #[test]
    fn thread_cpu_time_counts_work_not_sleep() {
        // Proves the clock advances while this thread computes (20 ms of CPU within at most 5 s
        // of wall time) and hardly while it sleeps 50 ms.
        let t0 = thread_cpu_time_ns().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let slept = thread_cpu_time_ns().unwrap() - t0;
        assert!(slept < 20_000_000, "sleeping 50 ms cost {slept} ns of CPU");
        let t1 = thread_cpu_time_ns().unwrap();
        let wall = std::time::Instant::now();
        let mut x = 0u64;
        while thread_cpu_time_ns().unwrap() - t1 < 20_000_000
            && wall.elapsed() < std::time::Duration::from_secs(5)
        {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let worked = thread_cpu_time_ns().unwrap() - t1;
        assert!(worked >= 20_000_000, "5 s of computing counted {worked} ns");
    }

    /// Writes into a connection whose peer does not read until the kernel takes no more,
    /// closes it (abortively or not), then reads everything the peer side gets: bytes written,
    /// bytes read, and whether the read ended in an error rather than an end of stream.
    fn close_with_unsent_bytes(abortive: bool) -> (usize, usize, bool) {
        use std::io::{Read, Write};
        use std::os::fd::AsRawFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let mut c = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (mut s, _) = l.accept().expect("accept");
        c.set_nonblocking(true).expect("nonblocking");
        let chunk = vec![7u8; 64 << 10];
        let mut written = 0usize;
        while written < (256 << 20) {
            match c.write(&chunk) {
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("write: {e}"),
            }
        }
        if abortive {
            set_linger_abort(c.as_raw_fd()).expect("linger");
        }
        drop(c);
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .expect("timeout");
        let mut read = 0usize;
        let mut buf = vec![0u8; 1 << 20];
        let failed = loop {
            match s.read(&mut buf) {
                Ok(0) => break false,
                Ok(n) => read += n,
                Err(_) => break true,
            }
        };
        (written, read, failed)
    }

    #[test]
    fn an_abortive_close_discards_what_the_peer_has_not_received() {
        // Proves `set_linger_abort` (used by cluster links): bytes still queued in the kernel
        // when the socket closes never reach the peer, which sees a reset; without it, the
        // same close delivers every byte and then an end of stream.
        let (written, read, failed) = close_with_unsent_bytes(false);
        assert_eq!(
            (read, failed),
            (written, false),
            "a plain close delivers all"
        );
        let (written, read, failed) = close_with_unsent_bytes(true);
        assert!(read < written, "{read} of {written} bytes arrived");
        assert!(failed, "the peer sees a reset, not an end of stream");
    }
}
