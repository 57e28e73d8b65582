//! Switching the election off (`election: false` in a config): lead at once, without a lock.

use std::time::SystemTime;

use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::{
    leadership::{Leadership, LossReason, Strategy, Term},
    lock::LockRef,
};

/// The leadership of a candidate whose election is disabled: `identity` leads `lock` at once,
/// with no fencing token, until `shutdown` (or until the handle is released or dropped).
pub(crate) fn unelected(
    strategy: Strategy,
    lock: LockRef,
    identity: String,
    shutdown: &CancellationToken,
) -> Leadership {
    info!(%lock, %identity, %strategy,
        "leader election disabled: leading at once, without a lock and without a fencing token (never run more than one replica so)");
    let term = Term {
        identity,
        lock,
        strategy,
        fencing_token: 0,
        acquired_at: SystemTime::now(),
    };
    let (leadership, keeper, done) = Leadership::new(term);
    let shutdown = shutdown.clone();
    let task = tokio::spawn(async move {
        tokio::select! {
            () = shutdown.cancelled() => keeper.lose(LossReason::Cancelled),
            () = done.cancelled() => keeper.lose(LossReason::Released),
        }
        Ok(())
    });
    leadership.with_task(task).mark_skipped()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock() -> LockRef {
        LockRef::new("default", "my-operator").unwrap()
    }

    #[tokio::test]
    async fn a_disabled_election_leads_until_shutdown() {
        let shutdown = CancellationToken::new();
        let l = unelected(Strategy::Lease, lock(), "me".into(), &shutdown);
        assert!(l.is_skipped() && l.is_leader());
        assert_eq!(l.fencing_token(), 0);
        assert_eq!(l.confirmed_until(), None);
        shutdown.cancel();
        assert_eq!(l.lost().await, LossReason::Cancelled);
        assert!(!l.is_leader());
        l.release().await.unwrap();
    }

    #[tokio::test]
    async fn a_disabled_election_releases_at_once() {
        let l = unelected(Strategy::ForLife, lock(), "me".into(), &CancellationToken::new());
        let lost = l.lost_token();
        l.release().await.unwrap();
        assert!(lost.is_cancelled());
    }
}
