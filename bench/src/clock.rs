//! The one clock every process on this host shares: CLOCK_MONOTONIC.

use std::time::Duration;

/// CLOCK_MONOTONIC now, in nanoseconds: the clock the candidate processes (the kube-leader Lease
/// candidate and the client-go one) stamp their events with, so that a signal sent by this
/// harness and the next leader's first act in another process can be subtracted exactly.
pub(crate) fn mono_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    u64::try_from(ts.tv_sec()).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec()).unwrap_or(0)
}

/// The time from `from` to `to` (both [`mono_ns`]); zero if `to` is earlier.
pub(crate) fn between(from: u64, to: u64) -> Duration {
    Duration::from_nanos(to.saturating_sub(from))
}
