//! CPU time of this process (getrusage) and of another process (/proc/<pid>/stat), so a report
//! can say how many cores the broker and the generator each burned during the measurement, and
//! the bytes another process wrote to storage (/proc/<pid>/io).
//!
//! Owns reading counters only; never signals or otherwise touches the other process.

/// User + system CPU seconds of this process, all threads.
pub fn self_cpu_s() -> f64 {
    // SAFETY: rusage is plain data; getrusage fills the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a rusage we own.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Processes whose children are also counted at most (nginx: a master and its workers).
const CHILDREN_MAX: usize = 256;

/// User + system CPU seconds of process `pid` and its live direct children (nginx workers), all
/// threads; `None` if `pid` cannot be read.
pub fn process_cpu_s(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut ticks = parse_stat_cpu_ticks(&stat)?;
    if let Ok(dir) = std::fs::read_dir("/proc") {
        let mut children = 0;
        for e in dir.flatten() {
            let name = e.file_name();
            let Some(n) = name
                .to_str()
                .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
            else {
                continue;
            };
            let Ok(s) = std::fs::read_to_string(format!("/proc/{n}/stat")) else {
                continue;
            };
            if parse_stat_ppid(&s) == Some(pid) {
                ticks += parse_stat_cpu_ticks(&s).unwrap_or(0);
                children += 1;
                if children >= CHILDREN_MAX {
                    break;
                }
            }
        }
    }
    Some(ticks as f64 / clock_ticks_per_s())
}

/// Field 4 (ppid) of a /proc/<pid>/stat line.
fn parse_stat_ppid(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Bytes process `pid` caused to be written to storage so far (`write_bytes` of
/// /proc/<pid>/io: page-cache writes when dirtied, direct I/O when submitted; all threads,
/// io_uring workers included); `None` if it cannot be read (another user's process).
pub fn process_write_bytes(pid: u32) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    parse_io_write_bytes(&io)
}

fn parse_io_write_bytes(io: &str) -> Option<u64> {
    let line = io.lines().find(|l| l.starts_with("write_bytes:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Resident set size of process `pid` in bytes (VmRSS of /proc/<pid>/status).
pub fn process_rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf has no memory effects.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime + stime (fields 14 and 15) of a /proc/<pid>/stat line. The command name (field 2) may
/// contain spaces and parentheses, so fields are counted after its last `)`.
fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14 -> index 11, stime index 12.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_utime_and_stime_after_the_command_name() {
        // Proves the stat parser skips a command name holding spaces and ')' and sums fields
        // 14 and 15, and that this process's own counters are readable.
        let line = "1234 (we ird) x) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0";
        assert_eq!(parse_stat_cpu_ticks(line), Some(300));
        assert_eq!(parse_stat_cpu_ticks("garbage"), None);
        assert_eq!(parse_stat_ppid(line), Some(1));
        assert!(process_cpu_s(std::process::id()).is_some());
        assert!(self_cpu_s() >= 0.0);
        assert!(process_rss_bytes(std::process::id()).is_some_and(|b| b > 0));
        let io = "rchar: 10\nwchar: 20\nsyscr: 1\nsyscw: 2\nread_bytes: 4096\n\
                  write_bytes: 8192\ncancelled_write_bytes: 0\n";
        assert_eq!(parse_io_write_bytes(io), Some(8192));
        assert_eq!(parse_io_write_bytes("rchar: 1\n"), None);
    }
}
