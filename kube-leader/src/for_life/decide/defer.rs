//! A waiting candidate that is not the successor a release prefers gives way to it briefly.

use std::time::Duration;

use tokio::time::Instant;

use super::{Decision, Fate, Stale, Waiting};
use crate::for_life::record::PodRef;

/// A candidate that is not the successor a release prefers defers to it for `wait` from when it
/// saw the release mark: the preferred one takes over meanwhile. Only a takeover after a release
/// defers (the mark, or no lock after one); a crash failover (a stale lock, a lock deleted with
/// its Pod) is never delayed.
pub(crate) fn defer_to_preferred(
    decision: Decision,
    fate: Option<&Fate>,
    me: &PodRef,
    now: Instant,
    wait: Duration,
) -> Decision {
    let after_release = match &decision {
        Decision::DeleteLock {
            why: Stale::Released { .. },
            ..
        } => true,
        Decision::Create => fate.is_some_and(|f| f.released),
        _ => false,
    };
    let Some((fate, (preferred, seen))) = fate
        .filter(|_| after_release)
        .and_then(|f| f.preferred.as_ref().map(|p| (f, p)))
    else {
        return decision;
    };
    let until = *seen + wait;
    if *preferred == me.name || now >= until {
        return decision;
    }
    Decision::Wait {
        why: Waiting::Successor {
            holder: fate.owner.name.clone(),
            preferred: preferred.clone(),
        },
        recheck_at: Some(until),
    }
}
