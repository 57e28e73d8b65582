//! The clock both processes share: CLOCK_MONOTONIC readings, sent between kube-leader and
//! its supervisor as absolute instants.

use std::time::Duration;

use nix::time::{clock_gettime, ClockId};
use tokio::time::Instant;

/// CLOCK_MONOTONIC now, as the time since its origin.
pub(crate) fn mono_now() -> Duration {
    match clock_gettime(ClockId::CLOCK_MONOTONIC) {
        Ok(ts) => Duration::new(
            u64::try_from(ts.tv_sec()).unwrap_or(0),
            u32::try_from(ts.tv_nsec()).unwrap_or(0),
        ),
        // Cannot happen on Linux; the zero instant makes every deadline passed (fail-safe).
        Err(_) => Duration::ZERO,
    }
}

/// The CLOCK_MONOTONIC reading of `t` (tokio's and std's `Instant` are CLOCK_MONOTONIC on
/// Linux; the two readings are taken back to back, within microseconds).
pub(crate) fn to_mono(t: Instant) -> Duration {
    let (now, mono) = (Instant::now(), mono_now());
    if t <= now {
        mono.saturating_sub(now - t)
    } else {
        mono + (t - now)
    }
}

/// The `Instant` of CLOCK_MONOTONIC reading `m`.
pub(super) fn from_mono(m: Duration) -> Instant {
    let (now, mono) = (Instant::now(), mono_now());
    if m >= mono {
        now + (m - mono)
    } else {
        now.checked_sub(mono - m).unwrap_or(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_readings_round_trip() {
        let t = Instant::now() + Duration::from_secs(3);
        let back = from_mono(to_mono(t));
        let diff = if back > t { back - t } else { t - back };
        assert!(diff < Duration::from_millis(5), "{diff:?}");
        let past = Instant::now();
        assert!(from_mono(to_mono(past)) <= Instant::now());
        assert!(to_mono(Instant::now()) <= mono_now());
    }
}
