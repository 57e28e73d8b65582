//! Deeper runs of the Lease model than the test command's: longer horizons, every fault family
//! at once, three candidates with faults. Ignored by `cargo test`; `scripts/model-deep.sh` runs
//! them in a release build and writes their figures (states, depth, time) to
//! `bench/results/`. Each run still checks every property it names.

use super::*;

// Every fault family at once (a loss, a crash, a re-list, a release and a deletion) does not
// fit: to tick 3 it needs more than 12 GB (scripts/model-deep.sh, 2026-12-06). The runs below
// take them two or three at a time.

/// No fault but late answers, late events and pauses, to horizon 7 (the test command's: 6).
#[test]
#[ignore = "deep: scripts/model-deep.sh"]
fn deep_fault_free_to_horizon_7() {
    holds(
        Settings {
            horizon: 7,
            ..Settings::small()
        },
        &[],
    );
}

/// Two lost requests and a crash, to horizon 5: a partition from the API server is lost
/// requests and late answers and events for one candidate.
#[test]
#[ignore = "deep: scripts/model-deep.sh"]
fn deep_two_losses_and_a_crash() {
    holds(
        Settings {
            horizon: 5,
            losses: 2,
            crashes: 1,
            ..Settings::small()
        },
        &[],
    );
}

/// Three candidates and a crash, to horizon 4 (with a lost request too, it needs more than
/// 12 GB).
#[test]
#[ignore = "deep: scripts/model-deep.sh"]
fn deep_three_candidates_with_faults() {
    holds(
        Settings {
            candidates: 3,
            horizon: 4,
            crashes: 1,
            ..Settings::small()
        },
        &[],
    );
}

/// Fenced writes beside a crash and a lost request, to horizon 4.
#[test]
#[ignore = "deep: scripts/model-deep.sh"]
fn deep_fence_with_faults() {
    holds(
        Settings {
            crashes: 1,
            losses: 1,
            ..fenced()
        },
        &[FENCE_ORDER, FENCE_LETS_THE_LEADER],
    );
}

/// A fair world with successors and three candidates, to horizon 7.
#[test]
#[ignore = "deep: scripts/model-deep.sh"]
fn deep_fair_successors_three_candidates() {
    holds(
        Settings {
            candidates: 3,
            successor: true,
            horizon: 7,
            ..fair()
        },
        &[LEADS_AFTER_STOP, CRASH_NOT_DELAYED],
    );
}

/// The defaults' ratio with a tick of drift: lease 6, renew deadline 4, retry 1 (the defaults
/// 15 s / 10 s / 2 s scaled by 0.4, the retry rounded up to a tick; the margin `lease − renew
/// deadline`, 2 ticks, covers twice the drift, as in [`Settings::small`]), the holder's Lease
/// deleted under it, to horizon 7 (the other candidate's wait, a lease from its last
/// observation, ends by tick 7).
#[test]
#[ignore = "deep: scripts/model-deep.sh"]
fn deep_default_ratio_with_drift_and_a_deletion() {
    holds(
        Settings {
            lease: 6,
            renew_deadline: 4,
            deletes: 1,
            horizon: 7,
            ..Settings::small()
        },
        &[],
    );
}

/// The same ratio with a crash and a lost request, to horizon 7.
#[test]
#[ignore = "deep: scripts/model-deep.sh"]
fn deep_default_ratio_with_drift_a_crash_and_a_lost_request() {
    holds(
        Settings {
            lease: 6,
            renew_deadline: 4,
            crashes: 1,
            losses: 1,
            horizon: 7,
            ..Settings::small()
        },
        &[],
    );
}
