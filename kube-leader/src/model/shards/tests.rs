//! The shards model runs: the shipped engine is safe in small worlds with each fault family,
//! a fair world converges to fair shares, and every mutant is refuted with a counterexample
//! (printed: `cargo test -p kube-leader --lib model::shards -- --nocapture`).

use stateright::Checker;

use super::{
    trace, Mutant, Settings, ShardsModel, FAIR_SHARE, ONE_WORKER, SECOND_TERM, STOP_GRACE_KEPT,
    TOKENS_INCREASE,
};
use crate::model::tests::ONE_AT_A_TIME;

/// Both cores of the test machine.
const THREADS: usize = 2;

/// Explores the model of `settings`, alone (one model run at a time, the Lease model's too).
fn run(settings: Settings) -> impl Checker<ShardsModel> {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    ShardsModel::new(settings).check(THREADS)
}

/// Every property of `settings` (and `more`) holds; the checker, for more questions.
fn holds(settings: Settings, more: &[&'static str]) -> impl Checker<ShardsModel> {
    let checker = run(settings);
    for property in [ONE_WORKER, TOKENS_INCREASE, STOP_GRACE_KEPT].iter().chain(more) {
        if let Some(path) = checker.discovery(property) {
            panic!("{property} fails:\n{}", trace(path));
        }
    }
    checker
}

/// The counterexample the checker finds for `settings`' mutant against `property`, printed.
fn refuted(settings: Settings, property: &'static str) -> String {
    let mutant = settings.mutant;
    let checker = run(settings);
    let path = checker
        .discovery(property)
        .unwrap_or_else(|| panic!("{mutant:?} is not refuted: the model does not check {property}"));
    let trace = trace(path);
    println!("{mutant:?} breaks {property}:\n{trace}");
    trace
}

/// The fault-free world, then each fault family alone, one shard, three ticks past the start:
/// what fits the test command's budget; deeper runs: [`deeper`].
fn runs() -> Vec<Settings> {
    let s = || Settings {
        horizon: 3,
        ..Settings::small()
    };
    vec![
        Settings { horizon: 4, ..s() },
        Settings { losses: 1, ..s() },
        Settings { crashes: 1, ..s() },
        Settings { deletes: 1, ..s() },
        Settings { relists: 1, ..s() },
        Settings { leaves: 1, ..s() },
        Settings { stalls: 1, ..s() },
    ]
}

#[test]
fn the_shards_engine_is_safe() {
    for settings in runs() {
        holds(settings, &[]);
    }
}

/// The same worlds deeper, one `deep_` test each, so that `scripts/model-deep.sh` bounds each
/// on its own (`cargo test -p kube-leader --lib model::shards -- --ignored --nocapture`): each
/// fault family to horizon 6, past a lease's expiry as every replica sees it. Recorded in
/// docs/safety.md.
fn deep(settings: Settings) {
    holds(
        Settings {
            horizon: 6,
            ..settings
        },
        &[],
    );
}

#[test]
#[ignore = "deep: scripts/model-deep.sh"]
fn deep_fault_free() {
    deep(Settings::small());
}

#[test]
#[ignore = "deep: scripts/model-deep.sh"]
fn deep_a_lost_request() {
    deep(Settings {
        losses: 1,
        ..Settings::small()
    });
}

#[test]
#[ignore = "deep: scripts/model-deep.sh"]
fn deep_a_crash() {
    deep(Settings {
        crashes: 1,
        ..Settings::small()
    });
}

#[test]
#[ignore = "deep: scripts/model-deep.sh"]
fn deep_a_deletion() {
    deep(Settings {
        deletes: 1,
        ..Settings::small()
    });
}

#[test]
#[ignore = "deep: scripts/model-deep.sh"]
fn deep_a_relist() {
    deep(Settings {
        relists: 1,
        ..Settings::small()
    });
}

#[test]
#[ignore = "deep: scripts/model-deep.sh"]
fn deep_a_leave() {
    deep(Settings {
        leaves: 1,
        ..Settings::small()
    });
}

#[test]
#[ignore = "deep: scripts/model-deep.sh"]
fn deep_a_membership_stall() {
    deep(Settings {
        stalls: 1,
        ..Settings::small()
    });
}

/// A join with two shards (a handover) in the unfair world, to horizon 2.
#[test]
#[ignore = "deep: scripts/model-deep.sh"]
fn deep_a_join_with_two_shards() {
    holds(
        Settings {
            replicas: 1,
            joiners: 1,
            shards: 2,
            horizon: 2,
            ..Settings::small()
        },
        &[],
    );
}

// === the default ratio ===

/// Lease 3, renew deadline 2, retry 1: the defaults' ratio (15 s / 10 s, a lease 1.5 × the renew
/// deadline) in whole ticks, with clocks without drift (the one-tick margin `lease − renew
/// deadline` covers no drift; see the Lease model's `tests/ratio.rs`). The stop grace is
/// `lease − renew deadline` = 1, less than the renew deadline: a term lost by a deletion keeps
/// its `confirmed_until` longer than its orphan bound.
fn default_ratio() -> Settings {
    Settings {
        lease: 3,
        renew_deadline: 2,
        retry: 1,
        drift: 0,
        ..Settings::small()
    }
}

/// A shard's Lease deleted under its holder, and a crash, at the default ratio: the holder takes
/// the shard again only once the deleted record is waited out.
#[test]
fn the_default_ratio_is_safe() {
    for settings in [
        Settings {
            deletes: 1,
            horizon: 7,
            ..default_ratio()
        },
        Settings {
            crashes: 1,
            horizon: 7,
            ..default_ratio()
        },
    ] {
        let checker = holds(settings, &[]);
        assert!(
            checker.discovery(SECOND_TERM).is_some(),
            "no second term: vacuous"
        );
    }
}

/// The defaults' ratio with a tick of drift (lease 6, renew deadline 4, retry 1: the defaults
/// scaled by 0.4, the retry rounded up), a shard's Lease deleted under its holder, to horizon 7.
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

/// The same with a crash, to horizon 7.
#[test]
#[ignore = "deep: scripts/model-deep.sh"]
fn deep_default_ratio_with_drift_and_a_crash() {
    holds(
        Settings {
            lease: 6,
            renew_deadline: 4,
            crashes: 1,
            horizon: 7,
            ..Settings::small()
        },
        &[],
    );
}

// === more shards in the unfair world, and the start ===

/// Two replicas, two shards, in the unfair world with a crash (and a restart), to horizon 2
/// (to horizon 3: [`deep_two_shards_with_a_crash`]).
#[test]
fn two_shards_are_safe_with_a_crash() {
    holds(two_shards_with_a_crash(2), &[]);
}

fn two_shards_with_a_crash(horizon: i64) -> Settings {
    Settings {
        shards: 2,
        crashes: 1,
        horizon,
        ..Settings::small()
    }
}

#[test]
#[ignore = "deep: scripts/model-deep.sh"]
fn deep_two_shards_with_a_crash() {
    holds(two_shards_with_a_crash(3), &[]);
}

/// The start explored (no fair prefix): both replicas race for the shard from tick 0, their
/// first acquisitions lost, late, or orphaned by a crash. A lost request to horizon 5, a crash
/// to horizon 4 (to horizon 6, past the crashed holder's expiry: [`deep_the_start_race_with_a_crash`]).
#[test]
fn the_start_race_is_safe_under_faults() {
    for settings in [start_race(5, 1, 0), start_race(4, 0, 1)] {
        holds(settings, &[]);
    }
}

fn start_race(horizon: i64, losses: u8, crashes: u8) -> Settings {
    Settings {
        explore_start: true,
        horizon,
        losses,
        crashes,
        ..Settings::small()
    }
}

#[test]
#[ignore = "deep: scripts/model-deep.sh"]
fn deep_the_start_race_with_a_crash() {
    let checker = holds(start_race(6, 0, 1), &[]);
    assert!(
        checker.discovery(SECOND_TERM).is_some(),
        "the crashed holder's shard is never taken over"
    );
}

/// A fair world of three shards, clocks alike, where a replica crashes (and may restart) at
/// the start: its shards expire and are taken over, its share is taken back if it restarts.
fn fair() -> Settings {
    Settings {
        prompt: true,
        shards: 3,
        crashes: 1,
        drift: 0,
        calm_from: 1,
        horizon: 8,
        ..Settings::small()
    }
}

/// A fair world of three shards, clocks alike, where a third replica joins at the start: each
/// holder hands over its surplus.
fn fair_join() -> Settings {
    Settings {
        prompt: true,
        shards: 3,
        joiners: 1,
        drift: 0,
        calm_from: 1,
        horizon: 2,
        ..Settings::small()
    }
}

#[test]
fn shares_converge_to_fair_after_a_crash() {
    let checker = holds(fair(), &[FAIR_SHARE]);
    assert!(
        checker.discovery(SECOND_TERM).is_some(),
        "no shard ever changes hands: the model would check nothing"
    );
}

#[test]
fn shares_converge_to_fair_after_a_join() {
    holds(fair_join(), &[FAIR_SHARE]);
}

/// A replica paused past its renew deadline loses its shard late, its work still going on; the
/// shard's lease expires as it saw it before the work had its stop grace.
#[test]
fn a_shard_taken_again_without_the_orphan_bound_overlaps_its_stopping_work() {
    let trace = refuted(
        Settings {
            horizon: 6,
            mutant: Mutant::NoOrphanBound,
            ..Settings::small()
        },
        STOP_GRACE_KEPT,
    );
    assert!(trace.contains("gone (lost@"), "{trace}");
}

#[test]
fn a_quota_one_too_high_leaves_shares_unfair() {
    refuted(
        Settings {
            mutant: Mutant::QuotaPlusOne,
            ..fair_join()
        },
        FAIR_SHARE,
    );
}

/// A replica whose membership Lease stalls looks dead to the other, whose watch is late: it
/// takes the shard over on a stale view while its holder still renews it.
#[test]
fn shard_writes_without_their_precondition_let_two_work() {
    let trace = refuted(
        Settings {
            stalls: 1,
            horizon: 4,
            mutant: Mutant::NoPrecondition,
            ..Settings::small()
        },
        ONE_WORKER,
    );
    assert!(trace.contains("Stall") && trace.contains("ALLOWED"), "{trace}");
}
