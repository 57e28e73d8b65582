//! Latency samples and their percentiles.

use std::time::Duration;

/// Percentiles of a set of samples, by the nearest-rank method: the p-th percentile is the
/// smallest sample with at least p% of the samples at or below it. With 20 samples, p99 is the
/// maximum; with fewer than 10, p90 is too. The tables say how many samples each row has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Summary {
    pub(crate) n: usize,
    pub(crate) p50: Duration,
    pub(crate) p90: Duration,
    pub(crate) p99: Duration,
    pub(crate) max: Duration,
}

// === impl Summary ===

impl Summary {
    /// The summary of `samples`, or `None` if there are none.
    pub(crate) fn of(samples: &[Duration]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort();
        Some(Self {
            n: sorted.len(),
            p50: percentile(&sorted, 50.0),
            p90: percentile(&sorted, 90.0),
            p99: percentile(&sorted, 99.0),
            max: sorted[sorted.len() - 1],
        })
    }
}

/// Nearest-rank percentile of sorted, non-empty samples.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Signed differences `a[i] - b[i]` in milliseconds (for "latency over the GC delay").
pub(crate) fn excess_ms(a: &[Duration], b: &[Duration]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .map(|(a, b)| a.as_secs_f64() * 1e3 - b.as_secs_f64() * 1e3)
        .collect()
}

/// Nearest-rank percentile of signed values; `None` if there are none.
pub(crate) fn percentile_f64(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// A duration for tables: `12.3 ms` below a second, `1.23 s` above.
pub(crate) fn fmt(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms < 1.0 {
        format!("{ms:.2} ms")
    } else if ms < 1000.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&m| Duration::from_millis(m)).collect()
    }

    #[test]
    fn nearest_rank_percentiles() {
        let s = Summary::of(&ms(&(1..=20).rev().collect::<Vec<_>>())).unwrap();
        assert_eq!(s.n, 20);
        assert_eq!(s.p50, Duration::from_millis(10));
        assert_eq!(s.p90, Duration::from_millis(18));
        assert_eq!(s.p99, Duration::from_millis(20));
        assert_eq!(s.max, Duration::from_millis(20));
        let one = Summary::of(&ms(&[7])).unwrap();
        assert_eq!(
            (one.p50, one.p99),
            (Duration::from_millis(7), Duration::from_millis(7))
        );
        assert!(Summary::of(&[]).is_none());
    }

    #[test]
    fn signed_excess() {
        let e = excess_ms(&ms(&[100, 50]), &ms(&[80, 90]));
        assert_eq!(e, vec![20.0, -40.0]);
        assert_eq!(percentile_f64(&e, 99.0), Some(20.0));
    }

    #[test]
    fn formats_by_magnitude() {
        assert_eq!(fmt(Duration::from_micros(500)), "0.50 ms");
        assert_eq!(fmt(Duration::from_millis(12)), "12.0 ms");
        assert_eq!(fmt(Duration::from_millis(1234)), "1.23 s");
    }
}
