//! Exponential backoff with an exact cap and bounded jitter.
//!
//! operator-sdk's `leader.Become` sleeps `wait.Jitter(backoff, 0.2)` starting at 1 s and
//! doubling while below 16 s. operator-lib made the cap configurable, but keeps doubling past it
//! when the cap is not a power of two (a 10 s cap gives 16 s sleeps). Here the base delay is
//! `min(initial * 2^n, cap)` and each sleep is drawn uniformly from `[0.8 * base, base]`: it never
//! exceeds the cap, and candidates that started together still spread out by 20%.
//!
//! This is hand-rolled rather than taken from `backon` because the exact-cap-with-jitter rule
//! above is the contract users configure, and it is ten lines.

use std::time::Duration;

use tokio::time::Instant;

/// Fraction of each delay that is randomised (operator-sdk's `wait.Jitter(backoff, .2)`).
pub(crate) const JITTER: f64 = 0.2;

/// `d` less up to [`JITTER`], so that candidates retrying after one error spread out.
pub(crate) fn jittered(d: Duration) -> Duration {
    d.mul_f64(1.0 - JITTER * fastrand::f64())
}

/// The retry of a renewal that failed at `now`: after `delay`, but leaving at least `last_try`
/// before `deadline` for one more attempt. Once that last attempt failed too, again every
/// `floor` until the deadline: never at once, so that an API server that rejects fast (429)
/// meets no storm of retries in the last moments of a term.
pub(crate) fn retry_at(
    now: Instant,
    delay: Duration,
    deadline: Instant,
    last_try: Duration,
    floor: Duration,
) -> Instant {
    let latest = deadline.checked_sub(last_try).unwrap_or(now);
    if now < latest {
        (now + delay).min(latest)
    } else {
        (now + floor).min(deadline)
    }
}

/// An exponential backoff: `initial`, doubling up to exactly `cap`, with 20% jitter below.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    initial: Duration,
    cap: Duration,
    current: Duration,
}

// === impl Backoff ===

impl Backoff {
    /// A backoff starting at `initial` and never exceeding `cap` (`cap` is raised to `initial`
    /// if smaller).
    #[must_use]
    pub(crate) fn new(initial: Duration, cap: Duration) -> Self {
        let cap = cap.max(initial);
        Self {
            initial,
            cap,
            current: initial,
        }
    }

    /// The base delay of the next sleep, before jitter.
    #[cfg(test)]
    pub(crate) fn base(&self) -> Duration {
        self.current
    }

    /// The next delay: uniformly random in `[0.8 * base, base]`; then doubles the base, capped.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let base = self.current;
        self.current = base.saturating_mul(2).min(self.cap);
        jittered(base)
    }

    /// Starts again from the initial delay (after a success).
    pub(crate) fn reset(&mut self) {
        self.current = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_sequence_doubles_to_sixteen_seconds() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(16));
        let bases: Vec<u64> = (0..8)
            .map(|_| {
                let base = b.base();
                let _ = b.next_delay();
                base.as_secs()
            })
            .collect();
        assert_eq!(bases, [1, 2, 4, 8, 16, 16, 16, 16]);
    }

    #[test]
    fn cap_that_is_not_a_power_of_two_is_honoured_exactly() {
        let cap = Duration::from_secs(10);
        let mut b = Backoff::new(Duration::from_secs(1), cap);
        let mut bases = vec![];
        for _ in 0..1000 {
            bases.push(b.base());
            let d = b.next_delay();
            assert!(d <= cap, "delay {d:?} exceeds the cap");
        }
        assert_eq!(&bases[..6], &[1, 2, 4, 8, 10, 10].map(Duration::from_secs));
    }

    #[test]
    fn jitter_stays_within_twenty_percent_below_the_base() {
        let mut b = Backoff::new(Duration::from_secs(4), Duration::from_secs(4));
        let (mut min, mut max) = (Duration::MAX, Duration::ZERO);
        for _ in 0..10_000 {
            let d = b.next_delay();
            assert!(
                d >= Duration::from_millis(3200) && d <= Duration::from_secs(4),
                "{d:?}"
            );
            min = min.min(d);
            max = max.max(d);
        }
        // The jitter really spreads the delays over most of the band.
        assert!(min < Duration::from_millis(3300), "{min:?}");
        assert!(max > Duration::from_millis(3900), "{max:?}");
    }

    #[test]
    fn reset_and_small_cap() {
        let mut b = Backoff::new(Duration::from_secs(2), Duration::from_secs(1));
        assert_eq!(b.base(), Duration::from_secs(2));
        let _ = b.next_delay();
        assert_eq!(b.base(), Duration::from_secs(2));
        b.reset();
        assert_eq!(b.base(), Duration::from_secs(2));
    }
}
