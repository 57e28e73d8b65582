//! A small seeded random number generator (SplitMix64), so that a schedule is the same for a
//! seed on every platform and with every version of the `rand` crate.

use std::time::Duration;

/// SplitMix64 (Steele, Lea, Flood 2014): 64 bits of state, passes BigCrush, one line of
/// arithmetic. Plenty for picking faults.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

// === impl Rng ===

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// An independent generator for one part of a run (`stream` names it), derived from `seed`.
    pub fn stream(seed: u64, stream: &str) -> Self {
        // FNV-1a of the name, mixed into the seed.
        let h = stream.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        let mut r = Self::new(seed ^ h);
        r.next_u64();
        r
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        // Lemire's multiply-shift; the bias is negligible for the small n used here.
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// An index into a slice of length `len` (`len > 0`).
    pub fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    /// `true` with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// A duration drawn uniformly from `min..=max`, in whole milliseconds.
    pub fn duration(&mut self, min: Duration, max: Duration) -> Duration {
        let (lo, hi) = (min.as_millis() as u64, max.as_millis() as u64);
        Duration::from_millis(lo + self.below(hi.saturating_sub(lo) + 1))
    }

    /// One of `weighted` (item, weight) pairs, with probability proportional to its weight.
    pub fn weighted<T: Copy>(&mut self, weighted: &[(T, u32)]) -> T {
        let total: u64 = weighted.iter().map(|(_, w)| u64::from(*w)).sum();
        let mut pick = self.below(total.max(1));
        for (item, w) in weighted {
            if pick < u64::from(*w) {
                return *item;
            }
            pick -= u64::from(*w);
        }
        weighted[weighted.len() - 1].0
    }

    /// Shuffles `items` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.index(i + 1);
            items.swap(i, j);
        }
    }
}

/// The seed in `var` (decimal, or hexadecimal with `0x`), else `default`.
///
/// # Panics
///
/// If the variable is set but is not a number: a typo must not silently run another schedule.
pub fn seed_from_env(var: &str, default: u64) -> u64 {
    match std::env::var(var) {
        Err(_) => default,
        Ok(s) => {
            let s = s.trim();
            let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse(),
            };
            parsed.unwrap_or_else(|e| panic!("{var}={s:?} is not a seed (decimal or 0x-hex): {e}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence_and_streams_differ() {
        let a: Vec<u64> = {
            let mut r = Rng::new(42);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = Rng::new(42);
            (0..4).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        // SplitMix64's published first output for seed 0.
        assert_eq!(Rng::new(0).next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_ne!(
            Rng::stream(1, "lease").next_u64(),
            Rng::stream(1, "for-life").next_u64()
        );
    }

    #[test]
    fn ranges() {
        let mut r = Rng::new(7);
        for _ in 0..1000 {
            assert!(r.below(3) < 3);
            let d = r.duration(Duration::from_millis(10), Duration::from_millis(20));
            assert!((10..=20).contains(&d.as_millis()));
        }
        let mut counts = [0; 3];
        for _ in 0..3000 {
            counts[r.weighted(&[(0, 1), (1, 0), (2, 2)])] += 1;
        }
        assert_eq!(counts[1], 0);
        assert!(counts[2] > counts[0], "{counts:?}");
        let mut v: Vec<u32> = (0..10).collect();
        r.shuffle(&mut v);
        v.sort_unstable();
        assert_eq!(v, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn seeds_from_the_environment() {
        assert_eq!(seed_from_env("KUBE_LEADER_E2E_UNSET_SEED_VAR", 9), 9);
    }
}
