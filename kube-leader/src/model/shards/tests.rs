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

/// The same worlds deeper (`cargo test -p kube-leader --lib model::shards -- --ignored
/// --nocapture`): each fault family to a horizon past a lease's expiry; and a join with two
/// shards (a handover) in the unfair world. Recorded in docs/safety.md.
#[test]
#[ignore]
fn deep_runs() {
    let s = || Settings {
        horizon: 6,
        ..Settings::small()
    };
    for settings in [
        s(),
        Settings { losses: 1, ..s() },
        Settings { crashes: 1, ..s() },
        Settings { deletes: 1, ..s() },
        Settings { relists: 1, ..s() },
        Settings { leaves: 1, ..s() },
        Settings { stalls: 1, ..s() },
        Settings {
            replicas: 1,
            joiners: 1,
            shards: 2,
            horizon: 2,
            ..s()
        },
    ] {
        holds(settings, &[]);
    }
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
