//! The Prometheus text exposition format (version 0.0.4), written by hand: metric families with
//! `# HELP` and `# TYPE` lines, samples with escaped label values, and histograms rendered as
//! cumulative `_bucket` series ending in `le="+Inf"`, then `_sum` and `_count`.
//!
//! Owns: the byte layout of `/metrics` and the fixed-bucket [`Histogram`] the shards record into.
//! Never decides what is measured (that is `metrics`), never allocates per recorded value.

use std::fmt::Write;

/// A histogram over fixed upper bounds in integer units (microseconds, records...): per-bucket
/// counts (not cumulative) plus one overflow bucket, and the sum of recorded values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Histogram {
    bounds: &'static [u64],
    counts: Box<[u64]>,
    sum: u64,
}

impl Histogram {
    pub fn new(bounds: &'static [u64]) -> Histogram {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]), "bounds ascend");
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1].into_boxed_slice(),
            sum: 0,
        }
    }

    /// A histogram from per-bucket counts already kept elsewhere (one more count than bounds).
    pub fn from_counts(bounds: &'static [u64], counts: &[u64], sum: u64) -> Histogram {
        let mut h = Histogram::new(bounds);
        for (c, v) in h.counts.iter_mut().zip(counts) {
            *c = *v;
        }
        h.sum = sum;
        h
    }

    pub fn record(&mut self, v: u64) {
        let i = self.bounds.partition_point(|&b| b < v);
        self.counts[i] += 1;
        self.sum = self.sum.saturating_add(v);
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    pub fn sum(&self) -> u64 {
        self.sum
    }

    /// Adds another histogram over the same bounds (a different shard's).
    pub fn merge(&mut self, other: &Histogram) {
        debug_assert_eq!(self.bounds, other.bounds);
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.sum = self.sum.saturating_add(other.sum);
    }
}

/// Escapes a label value: backslash, double quote and line feed (the format's three escapes).
pub fn escape_label(v: &str, out: &mut String) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// A value in the format's float syntax (`+Inf`, `-Inf`, `NaN`, or a decimal Rust prints without
/// an exponent).
fn write_f64(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        let _ = write!(out, "{v}");
    }
}

/// The metric types used here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Builds one exposition document, family by family.
#[derive(Default)]
pub struct Expo {
    out: String,
}

impl Expo {
    pub fn new() -> Expo {
        Expo {
            out: String::with_capacity(16 << 10),
        }
    }

    /// Starts a family: `# HELP` and `# TYPE`. Every sample of the family must follow before
    /// the next family starts.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let _ = writeln!(self.out, "# HELP {name} {}", help.replace('\\', "\\\\"));
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn series(&mut self, name: &str, suffix: &str, labels: &[(&str, &str)], le: Option<f64>) {
        self.out.push_str(name);
        self.out.push_str(suffix);
        if !labels.is_empty() || le.is_some() {
            self.out.push('{');
            let mut first = true;
            for (k, v) in labels {
                if !first {
                    self.out.push(',');
                }
                first = false;
                self.out.push_str(k);
                self.out.push_str("=\"");
                escape_label(v, &mut self.out);
                self.out.push('"');
            }
            if let Some(le) = le {
                if !first {
                    self.out.push(',');
                }
                self.out.push_str("le=\"");
                write_f64(&mut self.out, le);
                self.out.push('"');
            }
            self.out.push('}');
        }
        self.out.push(' ');
    }

    /// One sample with an integer value.
    pub fn int(&mut self, name: &str, labels: &[(&str, &str)], v: u64) {
        self.series(name, "", labels, None);
        let _ = writeln!(self.out, "{v}");
    }

    /// One sample with a float value.
    pub fn float(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        self.series(name, "", labels, None);
        write_f64(&mut self.out, v);
        self.out.push('\n');
    }

    /// A histogram's series: cumulative buckets, `+Inf` equal to the count, `_sum`, `_count`.
    /// Recorded values are divided by `per_unit` to give the exposed unit (1e6: microseconds to
    /// seconds; 1.0 for plain counts): a division keeps decimal bounds exact (`50 / 1e6` prints
    /// `0.00005`).
    pub fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &Histogram, per_unit: f64) {
        let mut cumulative = 0u64;
        for (i, b) in h.bounds.iter().enumerate() {
            cumulative += h.counts[i];
            self.series(name, "_bucket", labels, Some(*b as f64 / per_unit));
            let _ = writeln!(self.out, "{cumulative}");
        }
        cumulative += h.counts[h.bounds.len()];
        self.series(name, "_bucket", labels, Some(f64::INFINITY));
        let _ = writeln!(self.out, "{cumulative}");
        self.series(name, "_sum", labels, None);
        write_f64(&mut self.out, h.sum as f64 / per_unit);
        self.out.push('\n');
        self.series(name, "_count", labels, None);
        let _ = writeln!(self.out, "{cumulative}");
    }

    pub fn finish(self) -> String {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        // Proves the three escapes of the text format and that other characters pass unchanged.
        let mut s = String::new();
        escape_label("a\\b\"c\nd é", &mut s);
        assert_eq!(s, "a\\\\b\\\"c\\nd é");
    }

    #[test]
    fn histogram_renders_cumulative_buckets_ending_in_count() {
        // Proves buckets are cumulative with inclusive upper bounds, +Inf equals _count, the sum
        // is scaled, and merging adds counts and sums.
        static B: [u64; 3] = [10, 100, 1000];
        let mut h = Histogram::new(&B);
        for v in [0, 10, 11, 100, 5000] {
            h.record(v);
        }
        let mut other = Histogram::new(&B);
        other.record(1000);
        h.merge(&other);
        let mut e = Expo::new();
        e.family("x_seconds", Kind::Histogram, "help");
        e.histogram("x_seconds", &[("a", "b")], &h, 1e3);
        let text = e.finish();
        let want = "# HELP x_seconds help\n# TYPE x_seconds histogram\n\
            x_seconds_bucket{a=\"b\",le=\"0.01\"} 2\n\
            x_seconds_bucket{a=\"b\",le=\"0.1\"} 4\n\
            x_seconds_bucket{a=\"b\",le=\"1\"} 5\n\
            x_seconds_bucket{a=\"b\",le=\"+Inf\"} 6\n\
            x_seconds_sum{a=\"b\"} 6.121\n\
            x_seconds_count{a=\"b\"} 6\n";
        assert_eq!(text, want);
    }
}
