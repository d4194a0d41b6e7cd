//! A log-linear latency histogram in the manner of HDR histograms: values below 128 are counted
//! exactly, larger values in 64 linear sub-buckets per power of two, so any reported value is
//! within 1/64 (about 1.6%) above the true one. Fixed memory (3,776 counters), O(1) record, exact
//! min and max, mergeable across threads.
//!
//! Owns counting and percentile queries only; never reads clocks and never prints. Written here
//! rather than taken from the `hdrhistogram` crate because these ~100 lines are all the generator
//! needs (no serialisation, no auto-resize) and keep the crate free of another dependency.

/// Values below this are their own bucket.
const LINEAR_MAX: u64 = 128;
/// Sub-buckets per power of two above `LINEAR_MAX`.
const SUB_BUCKETS: u64 = 64;
/// Bucket count covering every `u64`: 128 exact values, then 64 per exponent 7..=63.
pub const BUCKETS: usize = (LINEAR_MAX + SUB_BUCKETS * 57) as usize;

#[derive(Clone)]
pub struct Histogram {
    counts: Box<[u64; BUCKETS]>,
    total: u64,
    min: u64,
    max: u64,
    sum: u128,
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("total", &self.total)
            .field("min", &self.min)
            .field("max", &self.max)
            .finish()
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new()
    }
}

fn index_of(v: u64) -> usize {
    if v < LINEAR_MAX {
        return v as usize;
    }
    let exp = 63 - u64::from(v.leading_zeros()); // >= 7
    let shift = exp - 6;
    let mantissa = v >> shift; // in [64, 128)
    (SUB_BUCKETS * (exp - 6) + mantissa) as usize
}

/// Highest value that lands in bucket `i`.
fn upper_of(i: usize) -> u64 {
    let i = i as u64;
    if i < LINEAR_MAX {
        return i;
    }
    let exp = i / SUB_BUCKETS + 5;
    let mantissa = i % SUB_BUCKETS + SUB_BUCKETS;
    let shift = exp - 6;
    // For the top bucket (exp 63, mantissa 127) this is u64::MAX exactly.
    (((mantissa + 1) as u128) << shift)
        .saturating_sub(1)
        .min(u64::MAX as u128) as u64
}

impl Histogram {
    pub fn new() -> Histogram {
        Histogram {
            counts: Box::new([0; BUCKETS]),
            total: 0,
            min: u64::MAX,
            max: 0,
            sum: 0,
        }
    }

    pub fn record(&mut self, v: u64) {
        self.counts[index_of(v)] += 1;
        self.total += 1;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        self.sum += u128::from(v);
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += *b;
        }
        self.total += other.total;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.sum += other.sum;
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    pub fn min(&self) -> u64 {
        if self.total == 0 {
            0
        } else {
            self.min
        }
    }

    pub fn mean(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum as f64 / self.total as f64
        }
    }

    /// The value at quantile `q` (0..=1): the smallest bucket bound below which at least
    /// `ceil(q * count)` values lie, never above the exact maximum. 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let q = if q.is_nan() { 1.0 } else { q.clamp(0.0, 1.0) };
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            seen += *c;
            if seen >= rank {
                return upper_of(i).clamp(self.min, self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_cover_u64() {
        // Proves the index function is monotone, maps every bucket's bounds back to itself and
        // that the last bucket ends at u64::MAX: no value is lost or misplaced.
        let mut prev_upper = None;
        for i in 0..BUCKETS {
            let up = upper_of(i);
            assert_eq!(index_of(up), i, "upper bound of bucket {i}");
            if let Some(p) = prev_upper {
                assert_eq!(index_of(p + 1), i, "first value of bucket {i}");
                assert!(up > p);
            }
            prev_upper = Some(up);
        }
        assert_eq!(upper_of(BUCKETS - 1), u64::MAX);
        assert_eq!(index_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_are_within_relative_error() {
        // Proves percentiles of a known distribution (1..=100_000) are reported within 1/64
        // above the exact value, and that min/max are exact.
        let mut h = Histogram::new();
        for v in 1..=100_000u64 {
            h.record(v);
        }
        for (q, exact) in [
            (0.5, 50_000u64),
            (0.99, 99_000),
            (0.999, 99_900),
            (1.0, 100_000),
        ] {
            let got = h.quantile(q);
            assert!(got >= exact, "q{q}: {got} < {exact}");
            assert!(
                (got - exact) as f64 <= exact as f64 / 64.0,
                "q{q}: {got} too far above {exact}"
            );
        }
        assert_eq!(h.min(), 1);
        assert_eq!(h.max(), 100_000);
        assert_eq!(h.count(), 100_000);
    }

    #[test]
    fn merge_equals_recording_into_one() {
        // Proves merging per-thread histograms gives the same quantiles as one histogram.
        let mut a = Histogram::new();
        let mut b = Histogram::new();
        let mut all = Histogram::new();
        for v in 0..10_000u64 {
            let x = v * v % 7_919 * 1_000;
            if v % 2 == 0 {
                a.record(x)
            } else {
                b.record(x)
            }
            all.record(x);
        }
        a.merge(&b);
        for q in [0.0, 0.5, 0.9, 0.99, 0.999, 1.0] {
            assert_eq!(a.quantile(q), all.quantile(q));
        }
        assert_eq!(a.count(), all.count());
        assert_eq!(Histogram::new().quantile(0.5), 0);
    }
}
