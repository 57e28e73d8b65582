//! The model runs: the shipped code is safe in the world of [`Settings::small`], the fence keeps
//! the token order, a fair world fails over within lease + retry (with and without successors,
//! with two candidates and three), and every mutant is refuted with a counterexample (printed:
//! `cargo test -p kube-leader --lib model -- --nocapture`).

use super::*;

mod deep;
mod ratio;

/// Both cores of the test machine.
const THREADS: usize = 2;

/// One model run at a time, on both cores (the test harness runs tests in parallel): each run's
/// time is then its own.
pub(super) static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Explores the model of `settings`, alone.
fn run(settings: Settings) -> impl Checker<LeaseModel> {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    LeaseModel::new(settings).check(THREADS)
}

/// The fault-free world to horizon 6, then each fault family alone to horizon 5 (a release, a deletion:
/// 4);
/// all of them at once do not fit the test command's 2 minutes.
fn runs() -> Vec<Settings> {
    let s = Settings::small;
    let h5 = |s: Settings| Settings { horizon: 5, ..s };
    let h4 = |s: Settings| Settings { horizon: 4, ..s };
    vec![
        s(),
        h5(Settings { losses: 1, ..s() }),
        h5(Settings { crashes: 1, ..s() }),
        h5(Settings { relists: 1, ..s() }),
        h4(Settings { releases: 1, ..s() }),
        h4(Settings { deletes: 1, ..s() }),
    ]
}

#[test]
fn the_lease_strategy_is_safe() {
    for settings in runs() {
        let checker = run(settings);
        for property in [ONE_ALLOWED, TOKENS_INCREASE] {
            if let Some(path) = checker.discovery(property) {
                panic!("{property} fails:\n{}", trace(path));
            }
        }
        assert!(
            checker.discovery(SECOND_TERM).is_some(),
            "the Lease never changes hands in the model: it would check nothing"
        );
    }
}

/// The counterexample the checker finds for `mutant` against `property`, printed.
fn refuted(mutant: Mutant, property: &'static str) -> String {
    let checker = run(Settings {
        mutant,
        ..Settings::small()
    });
    let path = checker
        .discovery(property)
        .unwrap_or_else(|| panic!("{mutant:?} is not refuted: the model does not check {property}"));
    let trace = trace(path);
    println!("{mutant:?} breaks {property}:\n{trace}");
    trace
}

#[test]
fn renewals_without_their_precondition_let_two_work() {
    let trace = refuted(Mutant::NoPrecondition, ONE_ALLOWED);
    assert!(trace.contains("ALLOWED"), "{trace}");
}

#[test]
fn a_term_confirmed_from_the_answer_lets_two_work() {
    let trace = refuted(Mutant::ConfirmedFromAnswer, ONE_ALLOWED);
    assert!(trace.contains("ALLOWED"), "{trace}");
}

#[test]
fn tokens_from_lease_transitions_go_back() {
    refuted(Mutant::TokenFromTransitions, TOKENS_INCREASE);
}

/// The documented limit (docs/safety.md, "Known limits"), found when a deletion may come while a
/// candidate never saw the Lease: a restarted candidate creates it at once beside the deleted
/// Lease's holder.
#[test]
fn a_candidate_that_never_saw_a_deleted_lease_creates_it_at_once() {
    let checker = run(Settings {
        blind_deletes: true,
        deletes: 1,
        crashes: 1,
        horizon: 4,
        ..Settings::small()
    });
    let path = checker.discovery(ONE_ALLOWED).expect("the known limit");
    let trace = trace(path);
    println!("the known limit:\n{trace}");
    assert!(trace.contains("Delete") && trace.contains("Restart"), "{trace}");
}

/// Every property of `settings` holds; the run is not vacuous (a second term begins).
fn holds(settings: Settings, properties: &[&'static str]) {
    let checker = run(settings);
    for property in [ONE_ALLOWED, TOKENS_INCREASE].iter().chain(properties) {
        if let Some(path) = checker.discovery(property) {
            panic!("{property} fails:\n{}", trace(path));
        }
    }
    assert!(
        checker.discovery(SECOND_TERM).is_some(),
        "no second term: vacuous"
    );
}

/// The counterexample the checker finds for `settings`' mutant against `property`, printed.
fn refuted_in(settings: Settings, property: &'static str) -> String {
    let mutant = settings.mutant;
    let checker = run(settings);
    let path = checker
        .discovery(property)
        .unwrap_or_else(|| panic!("{mutant:?} is not refuted: the model does not check {property}"));
    let trace = trace(path);
    println!("{mutant:?} breaks {property}:\n{trace}");
    trace
}

/// Fenced writes: each candidate that led may send one with its latest term's token at any
/// later time, the fence reading the lock first and judging at the commit.
fn fenced() -> Settings {
    Settings {
        fenced_writes: 2,
        horizon: 4,
        ..Settings::small()
    }
}

#[test]
fn the_fence_keeps_the_token_order() {
    holds(fenced(), &[FENCE_ORDER, FENCE_LETS_THE_LEADER]);
}

#[test]
fn a_fence_without_the_objects_stamp_accepts_an_older_token() {
    let trace = refuted_in(
        Settings {
            mutant: Mutant::FenceIgnoresStamp,
            ..fenced()
        },
        FENCE_ORDER,
    );
    assert!(trace.contains("FenceCommit"), "{trace}");
}

#[test]
fn a_fence_that_accepts_a_token_one_lower_lets_the_objects_token_go_back() {
    let trace = refuted_in(
        Settings {
            mutant: Mutant::FenceOneLower,
            ..fenced()
        },
        FENCE_ORDER,
    );
    assert!(trace.contains("FenceCommit"), "{trace}");
}

#[test]
fn a_fence_that_ignores_the_holders_stored_token_refuses_the_leader() {
    let trace = refuted_in(
        Settings {
            mutant: Mutant::LockFromVersion,
            ..fenced()
        },
        FENCE_LETS_THE_LEADER,
    );
    assert!(
        trace.contains("ALLOWED") && trace.contains("FenceCommit"),
        "{trace}"
    );
}

/// A fair world (nothing late, nothing lost) where the leader crashes or releases once.
fn fair() -> Settings {
    Settings {
        prompt: true,
        crashes: 1,
        releases: 1,
        horizon: 7,
        ..Settings::small()
    }
}

#[test]
fn someone_leads_within_lease_and_retry_after_the_leader_stops() {
    holds(fair(), &[LEADS_AFTER_STOP]);
}

#[test]
fn a_follower_that_never_retries_after_a_lost_race_leaves_the_lock_leaderless() {
    let trace = refuted_in(
        Settings {
            mutant: Mutant::NoRetryAfterRace,
            ..fair()
        },
        LEADS_AFTER_STOP,
    );
    assert!(trace.contains("Crash"), "{trace}");
}

#[test]
fn the_successor_preference_never_delays_a_crash_failover() {
    holds(
        Settings {
            successor: true,
            ..fair()
        },
        &[LEADS_AFTER_STOP, CRASH_NOT_DELAYED],
    );
}

#[test]
fn a_follower_deferring_to_a_stale_preferred_holder_delays_a_crash_failover() {
    let trace = refuted_in(
        Settings {
            successor: true,
            mutant: Mutant::StalePreferred,
            ..fair()
        },
        CRASH_NOT_DELAYED,
    );
    assert!(trace.contains("Release") && trace.contains("Crash"), "{trace}");
}

/// Three candidates: the fault-free world (a paused or late candidate, late answers and
/// events), to a shorter horizon.
#[test]
fn three_candidates_are_safe() {
    holds(
        Settings {
            candidates: 3,
            horizon: 4,
            ..Settings::small()
        },
        &[],
    );
}

/// Three candidates in a fair world: the leader crashes, the other two race for the Lease.
#[test]
fn three_candidates_fail_over_within_lease_and_retry() {
    holds(
        Settings {
            candidates: 3,
            releases: 0,
            horizon: 7,
            ..fair()
        },
        &[LEADS_AFTER_STOP],
    );
}
