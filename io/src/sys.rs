//! Small safe wrappers over the operating-system calls the rest of the workspace needs outside
//! file and socket I/O: free space of a file system and the calling thread's CPU time.
//!
//! Owns the `unsafe` and the libc types of those calls, so that `shard`, `raft` and the binary
//! never name `libc` (the other libc calls live with what they serve: sockets in [`crate::rt`],
//! files in [`crate::file`] and [`crate::durable`]). Never caches an answer and never retries.

use std::path::Path;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
