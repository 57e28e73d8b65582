//! The model runs: the shipped code is safe in the world of [`Settings::small`], and every
//! mutant is refuted with a counterexample (printed: `cargo test -p kube-leader --lib model --
//! --nocapture`).

use super::*;

/// Both cores of the test machine.
const THREADS: usize = 2;

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
        let checker = LeaseModel::new(settings).check(THREADS);
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
    let checker = LeaseModel::new(Settings {
        mutant,
        ..Settings::small()
    })
    .check(THREADS);
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
    let checker = LeaseModel::new(Settings {
        blind_deletes: true,
        deletes: 1,
        crashes: 1,
        horizon: 4,
        ..Settings::small()
    })
    .check(THREADS);
    let path = checker.discovery(ONE_ALLOWED).expect("the known limit");
    let trace = trace(path);
    println!("the known limit:\n{trace}");
    assert!(trace.contains("Delete") && trace.contains("Restart"), "{trace}");
}
