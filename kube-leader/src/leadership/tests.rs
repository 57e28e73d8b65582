//! Unit tests of `leadership`.

use super::*;

fn term() -> Term {
    Term {
        identity: "me".into(),
        lock: LockRef::new("ns", "lock").unwrap(),
        strategy: Strategy::Lease,
        fencing_token: 3,
        acquired_at: SystemTime::now(),
    }
}

#[tokio::test]
async fn loss_is_reported_once_with_the_first_reason() {
    let (l, keeper, _done) = Leadership::new(term());
    let token = l.lost_token();
    assert!(l.is_leader());
    keeper.lose(LossReason::LockDeleted);
    keeper.lose(LossReason::Released);
    assert!(token.is_cancelled());
    assert!(!l.is_leader());
    assert_eq!(l.lost().await, LossReason::LockDeleted);
    assert_eq!(l.loss_reason(), Some(LossReason::LockDeleted));
}

#[tokio::test]
async fn user_cancelling_the_child_token_does_not_end_leadership() {
    let (l, _keeper, _done) = Leadership::new(term());
    l.lost_token().cancel();
    assert!(l.is_leader());
}

#[tokio::test]
async fn dropping_signals_done() {
    let (l, keeper, done) = Leadership::new(term());
    assert!(!done.is_cancelled());
    drop(l);
    assert!(done.is_cancelled());
    assert!(!keeper.release_requested(), "a drop is not an explicit release");
}

#[tokio::test]
async fn release_is_told_apart_from_drop() {
    let (l, keeper, done) = Leadership::new(term());
    l.release().await.unwrap();
    assert!(done.is_cancelled());
    assert!(keeper.release_requested());
}

#[tokio::test]
async fn a_keeper_that_is_gone_ends_leadership() {
    let (l, keeper, _done) = Leadership::new(term());
    let task = tokio::spawn(async move {
        let _keeper = keeper;
        panic!("a bug in the keeper");
    });
    assert!(task.await.unwrap_err().is_panic());
    assert!(!l.is_leader(), "a panicked keeper left the handle leading");
    assert!(
        matches!(l.loss_reason(), Some(LossReason::KeeperStopped { .. })),
        "{:?}",
        l.loss_reason()
    );
    assert!(l.lost_token().is_cancelled());

    let (l, keeper, _done) = Leadership::new(term());
    drop(keeper);
    assert!(!l.is_leader());
}

#[tokio::test(start_paused = true)]
async fn skipped_never_ends() {
    let l = Leadership::skipped(term());
    assert!(l.is_skipped());
    assert!(l.is_leader());
    let r = tokio::time::timeout(Duration::from_secs(3600), l.lost()).await;
    assert!(r.is_err());
}
