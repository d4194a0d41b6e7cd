//! The figures of a benchmark run and their two renderings: a table for people and JSON for
//! scripts. Also the end-of-run message check (lost, duplicated) computed from every
//! connection's [`Tracking`].
//!
//! Owns arithmetic on measured values and formatting; never measures anything itself.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::engine::Tracking;
use crate::hist::Histogram;

#[derive(Clone, Debug, Default, Serialize)]
pub struct Latency {
    pub count: u64,
    pub p50_us: f64,
    pub p95_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
}

impl Latency {
    pub fn of(h: &Histogram) -> Latency {
        let us = |ns: u64| ns as f64 / 1_000.0;
        Latency {
            count: h.count(),
            p50_us: us(h.quantile(0.50)),
            p95_us: us(h.quantile(0.95)),
            p99_us: us(h.quantile(0.99)),
            p999_us: us(h.quantile(0.999)),
            max_us: us(h.max()),
            mean_us: h.mean() / 1_000.0,
        }
    }
}

/// The end-of-run check: what happened to every message id this run produced.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Check {
    /// Messages answered 202.
    pub accepted: u64,
    /// Messages refused with another status (never stored, all or nothing).
    pub rejected: u64,
    /// Messages whose request got no answer (may or may not be stored).
    pub uncertain: u64,
    /// Distinct accepted-or-uncertain messages consumed at least once.
    pub consumed_unique: u64,
    /// Distinct messages acked with 204 at least once.
    pub acked_unique: u64,
    /// Accepted messages never acked: must be 0.
    pub lost: u64,
    /// Of the lost: delivered at least once but never acked (the drain stopped early).
    pub lost_delivered: u64,
    /// Messages delivered more than once (at-least-once allows it; a count worth watching).
    pub duplicated: u64,
    /// Messages acked with 204 more than once (must be 0: an ack settles a message).
    pub acked_twice: u64,
    /// Consumed ids this run never produced or that were refused: must be 0.
    pub unexpected: u64,
    /// Messages of other runs consumed (and acked) while draining the topic.
    pub foreign: u64,
    /// Seconds from the end of producing to the end of the drain.
    pub drain_s: f64,
}

const ACCEPTED: u8 = 1;
const UNCERTAIN: u8 = 2;

impl Check {
    /// Folds every connection's tracking. Producer `i` produced ids `i << 32 | seq`.
    pub fn compute(trackings: &[Tracking], drain_s: f64) -> Check {
        let mut c = Check {
            drain_s,
            ..Check::default()
        };
        // Per producer: state flags, delivery count and ack count per sequence number.
        let mut flags: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
        let mut mark = |first: u64, n: u32, f: u8| {
            let (p, s) = ((first >> 32) as u32, (first & 0xffff_ffff) as usize);
            let v = flags.entry(p).or_default();
            if v.len() < s + n as usize {
                v.resize(s + n as usize, 0);
            }
            for x in &mut v[s..s + n as usize] {
                *x |= f;
            }
        };
        for t in trackings {
            for &(first, n) in &t.accepted {
                mark(first, n, ACCEPTED);
                c.accepted += u64::from(n);
            }
            for &(first, n) in &t.uncertain {
                mark(first, n, UNCERTAIN);
                c.uncertain += u64::from(n);
            }
            c.rejected += t.rejected.iter().map(|r| u64::from(r.1)).sum::<u64>();
            c.foreign += t.foreign;
        }
        let mut delivered: BTreeMap<u32, Vec<u8>> = flags
            .iter()
            .map(|(p, v)| (*p, vec![0u8; v.len()]))
            .collect();
        let mut acked = delivered.clone();
        let bump = |m: &mut BTreeMap<u32, Vec<u8>>, id: u64| -> bool {
            let (p, s) = ((id >> 32) as u32, (id & 0xffff_ffff) as usize);
            match m.get_mut(&p).and_then(|v| v.get_mut(s)) {
                Some(x) => {
                    *x = x.saturating_add(1);
                    true
                }
                None => false,
            }
        };
        for t in trackings {
            for &id in &t.consumed {
                if !bump(&mut delivered, id) {
                    c.unexpected += 1;
                }
            }
            for &id in &t.acked {
                bump(&mut acked, id);
            }
        }
        for (p, fv) in &flags {
            let dv = &delivered[p];
            let av = &acked[p];
            for i in 0..fv.len() {
                let (f, d, a) = (fv[i], dv[i], av[i]);
                if f == 0 && d > 0 {
                    c.unexpected += 1;
                }
                if d > 0 && f != 0 {
                    c.consumed_unique += 1;
                }
                if a > 0 && f != 0 {
                    c.acked_unique += 1;
                }
                if d > 1 {
                    c.duplicated += 1;
                }
                if a > 1 {
                    c.acked_twice += 1;
                }
                if f & ACCEPTED != 0 && a == 0 {
                    c.lost += 1;
                    if d > 0 {
                        c.lost_delivered += 1;
                    }
                }
            }
        }
        c
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct RunReport {
    pub workload: String,
    pub url: String,
    pub topic: String,
    pub producers: usize,
    pub consumers: usize,
    /// Messages per produce request.
    pub batch: usize,
    pub size_bytes: usize,
    pub threads: usize,
    /// Open-loop offered load (W4), messages per second.
    pub offered_msgs_per_s: Option<f64>,
    /// The measured window (after warm-up, until producing stopped), seconds.
    pub window_s: f64,
    /// Messages answered 202 inside the window.
    pub produced: u64,
    pub produced_per_s: f64,
    /// Payload megabytes (10^6 bytes) per second produced.
    pub mb_per_s: f64,
    pub produce_requests_per_s: f64,
    /// Messages acked (204) inside the window, and per second (W3).
    pub acked: u64,
    pub acked_per_s: f64,
    /// Produce latency: from send (or scheduled send, W4) to the full response.
    pub latency: Latency,
    pub consume_latency: Option<Latency>,
    pub ack_latency: Option<Latency>,
    /// Answers by request kind and status, whole run.
    pub statuses: BTreeMap<String, BTreeMap<u16, u64>>,
    /// Failures: unexpected statuses as "<kind> <status>", and transport failures by cause.
    pub errors: BTreeMap<String, u64>,
    pub error_count: u64,
    /// CPU seconds inside the window: the server's (with --server-pid; the sum over the
    /// processes given) and the generator's.
    pub server_cpu_s: Option<f64>,
    pub generator_cpu_s: f64,
    /// Server resident memory at the end of the run, MiB (with --server-pid; the sum).
    pub server_rss_mib: Option<f64>,
    /// Each `--server-pid` process (one per node of a cluster), in the order given.
    pub servers: Vec<ServerUsage>,
    /// Bytes the server processes wrote to storage inside the window (summed), per message
    /// produced inside it.
    pub server_write_bytes_per_msg: Option<f64>,
    /// Headline rate divided by the ceiling's requests per second (same run).
    pub ratio_to_ceiling: Option<f64>,
    pub check: Option<Check>,
}

/// What one server process used inside the window.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ServerUsage {
    pub pid: u32,
    /// User + system CPU seconds.
    pub cpu_s: Option<f64>,
    /// Bytes written to storage (`write_bytes` of /proc/<pid>/io).
    pub write_bytes: Option<u64>,
    /// Resident memory at the end of the run, MiB.
    pub rss_mib: Option<f64>,
}

impl RunReport {
    /// Sets `servers` and the sums over them (`None` when a process could not be read).
    pub fn set_servers(&mut self, servers: Vec<ServerUsage>) {
        if !servers.is_empty() {
            let cpu: Option<Vec<f64>> = servers.iter().map(|s| s.cpu_s).collect();
            self.server_cpu_s = cpu.map(|v| v.iter().sum());
            let rss: Option<Vec<f64>> = servers.iter().map(|s| s.rss_mib).collect();
            self.server_rss_mib = rss.map(|v| v.iter().sum());
            let written: Option<Vec<u64>> = servers.iter().map(|s| s.write_bytes).collect();
            self.server_write_bytes_per_msg = written
                .filter(|_| self.produced > 0)
                .map(|v| v.iter().sum::<u64>() as f64 / self.produced as f64);
        }
        self.servers = servers;
    }

    /// The figure a workload is judged by: acked/s for the full flow, produced/s otherwise.
    pub fn headline_per_s(&self) -> f64 {
        if self.consumers > 0 && self.workload.starts_with("W3") {
            self.acked_per_s
        } else {
            self.produced_per_s
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// W1 against the ceiling server (nginx answering 202), if measured.
    pub ceiling: Option<RunReport>,
    pub runs: Vec<RunReport>,
}

impl Report {
    /// Messages lost, acked twice or unexpected, over every run with a check (must be 0).
    pub fn lost(&self) -> u64 {
        self.runs
            .iter()
            .filter_map(|r| r.check.as_ref())
            .map(|c| c.lost + c.unexpected + c.acked_twice)
            .sum()
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    pub fn table(&self) -> String {
        let mut s = String::new();
        let first = self.ceiling.as_ref().or(self.runs.first());
        if let Some(r) = first {
            let _ = writeln!(
                s,
                "narad bench: {} payload {} B, {} generator threads",
                r.url, r.size_bytes, r.threads
            );
        }
        let _ = writeln!(
            s,
            "{:<14} {:>5} {:>5} {:>10} {:>11} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>8} {:>7} {:>6}",
            "workload", "conns", "batch", "offered/s", "msg/s", "MB/s", "req/s", "p50", "p95",
            "p99", "p99.9", "max", "errors", "srv cpu", "srv rss", "gen cpu", "ratio"
        );
        for r in self.ceiling.iter().chain(self.runs.iter()) {
            let conns = if r.consumers > 0 {
                format!("{}+{}", r.producers, r.consumers)
            } else {
                r.producers.to_string()
            };
            let _ = writeln!(
                s,
                "{:<14} {:>5} {:>5} {:>10} {:>11} {:>8.1} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>8} {:>7} {:>6}",
                r.workload,
                conns,
                r.batch,
                r.offered_msgs_per_s.map_or("-".into(), |o| thousands(o as u64)),
                thousands(r.headline_per_s() as u64),
                r.headline_per_s() * r.size_bytes as f64 / 1e6,
                thousands(r.produce_requests_per_s as u64),
                dur(r.latency.p50_us),
                dur(r.latency.p95_us),
                dur(r.latency.p99_us),
                dur(r.latency.p999_us),
                dur(r.latency.max_us),
                r.error_count,
                r.server_cpu_s.map_or("-".into(), |c| format!("{c:.1}s")),
                r.server_rss_mib.map_or("-".into(), |m| format!("{m:.0}MiB")),
                format!("{:.1}s", r.generator_cpu_s),
                r.ratio_to_ceiling.map_or("-".into(), |x| format!("{x:.2}")),
            );
        }
        let _ = writeln!(
            s,
            "msg/s is acked/s for W3, produced/s otherwise; MB/s of payload; latency of produce \
             requests (W4: from the scheduled send); cpu over the window; ratio = msg/s / ceiling req/s"
        );
        for r in self.ceiling.iter().chain(self.runs.iter()) {
            if let Some(c) = &r.check {
                let _ = writeln!(
                    s,
                    "{} check: accepted {} consumed {} acked {} lost {} (delivered-not-acked {}) \
                     duplicated {} acked-twice {} unexpected {} uncertain {} foreign {} drain {:.1}s",
                    r.workload,
                    thousands(c.accepted),
                    thousands(c.consumed_unique),
                    thousands(c.acked_unique),
                    c.lost,
                    c.lost_delivered,
                    c.duplicated,
                    c.acked_twice,
                    c.unexpected,
                    c.uncertain,
                    c.foreign,
                    c.drain_s
                );
            }
            if let Some(b) = r.server_write_bytes_per_msg {
                let each: Vec<String> = r
                    .servers
                    .iter()
                    .map(|u| {
                        format!(
                            "pid {} cpu {} write {} rss {}",
                            u.pid,
                            u.cpu_s.map_or("-".into(), |c| format!("{c:.1}s")),
                            u.write_bytes
                                .map_or("-".into(), |w| format!("{:.1}MB", w as f64 / 1e6)),
                            u.rss_mib.map_or("-".into(), |m| format!("{m:.0}MiB")),
                        )
                    })
                    .collect();
                let _ = writeln!(
                    s,
                    "{} servers: {}; written {b:.0} B/msg",
                    r.workload,
                    each.join("; ")
                );
            }
            if !r.errors.is_empty() {
                let list: Vec<String> = r.errors.iter().map(|(k, v)| format!("{k} x{v}")).collect();
                let _ = writeln!(s, "{} errors: {}", r.workload, list.join(", "));
            }
            if let (Some(c), Some(a)) = (
                r.consume_latency.as_ref().filter(|c| c.count > 0),
                &r.ack_latency,
            ) {
                let _ = writeln!(
                    s,
                    "{} consume p50 {} p99 {} (long-poll included); ack p50 {} p99 {}",
                    r.workload,
                    dur(c.p50_us),
                    dur(c.p99_us),
                    dur(a.p50_us),
                    dur(a.p99_us)
                );
            }
        }
        s
    }
}

fn thousands(v: u64) -> String {
    let d = v.to_string();
    let mut out = String::new();
    for (i, ch) in d.chars().enumerate() {
        if i > 0 && (d.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn dur(us: f64) -> String {
    if us >= 1_000_000.0 {
        format!("{:.2}s", us / 1e6)
    } else if us >= 1_000.0 {
        format!("{:.2}ms", us / 1e3)
    } else {
        format!("{us:.0}us")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_counts_lost_duplicated_and_unexpected() {
        // Proves the check finds a never-acked message (lost), a delivered-but-unacked one,
        // a duplicate delivery, an id nobody produced, and that uncertain ones are not lost.
        let producer = Tracking {
            accepted: vec![(0, 5)],       // ids 0..5 of producer 0
            uncertain: vec![(5, 1)],      // id 5
            rejected: vec![(1 << 32, 2)], // producer 1, refused
            ..Tracking::default()
        };
        let consumer = Tracking {
            consumed: vec![0, 1, 1, 2, 3, 5, 1 << 32],
            acked: vec![0, 1, 2, 5],
            foreign: 3,
            ..Tracking::default()
        };
        let c = Check::compute(&[producer, consumer], 0.5);
        assert_eq!(c.accepted, 5);
        assert_eq!(c.uncertain, 1);
        assert_eq!(c.rejected, 2);
        assert_eq!(c.lost, 2, "ids 3 and 4");
        assert_eq!(c.lost_delivered, 1, "id 3");
        assert_eq!(c.duplicated, 1, "id 1");
        assert_eq!(c.unexpected, 1, "producer 1's refused id");
        assert_eq!(c.consumed_unique, 5);
        assert_eq!(c.acked_unique, 4);
        assert_eq!(c.foreign, 3);
    }

    #[test]
    fn formats_numbers_for_people() {
        // Proves the table helpers group thousands and pick a readable time unit.
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(dur(512.0), "512us");
        assert_eq!(dur(2_500.0), "2.50ms");
        assert_eq!(dur(3_000_000.0), "3.00s");
    }
}
