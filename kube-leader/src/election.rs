//! Switching the election off: [`Election::Disabled`] leads at once, without a lock.

use std::time::SystemTime;

use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::{
    leadership::{Leadership, LossReason, Strategy, Term},
    lock::LockRef,
};

/// Whether a candidate campaigns for its lock at all: Kubernetes components'
/// `--leader-elect=false`, for local runs and single-replica tests.
///
/// Set it in the config: [`LeaseConfig::election`](crate::LeaseConfig::election),
/// [`ForLifeConfig::election`](crate::ForLifeConfig::election), or a shard set's
/// [`ShardsConfig::lease`](crate::ShardsConfig::lease).
///
/// With [`Election::Disabled`], `become_leader` returns at once, saying so at `info` in the
/// logs: no request is sent for the lock, the fencing token is absent (0, and
/// [`Leadership::is_skipped`] is `true`), no Event, observation or registration is recorded,
/// and the term ends only on shutdown ([`LossReason::Cancelled`]) or release. Every replica
/// started this way leads: **never disable the election of more than one replica.** A
/// [shard set](crate::Shards) with the election disabled hands this replica every shard.
///
/// ```no_run
/// # async fn doc(client: kube::Client) -> kube_leader::Result<()> {
/// use kube_leader::{Election, LeaseConfig, LeaseElector};
/// use tokio_util::sync::CancellationToken;
///
/// let local = std::env::var_os("KUBERNETES_SERVICE_HOST").is_none();
/// let election = if local { Election::Disabled } else { Election::Enabled };
/// let elector =
///     LeaseElector::new(client, "my-operator").config(LeaseConfig::default().election(election));
/// let leadership = elector.become_leader(&CancellationToken::new()).await?;
/// assert_eq!(leadership.is_skipped(), local);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Election {
    /// Campaign for the lock. The default.
    #[default]
    Enabled,
    /// Lead at once, without a lock.
    Disabled,
}

// === impl Election ===

impl Election {
    /// `Enabled` for `true` (`--leader-elect=true`), `Disabled` for `false`.
    pub fn from_enabled(enabled: bool) -> Self {
        if enabled {
            Self::Enabled
        } else {
            Self::Disabled
        }
    }

    /// Whether candidates campaign.
    pub fn is_enabled(self) -> bool {
        self == Self::Enabled
    }
}

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

    #[test]
    fn enabled_is_the_default() {
        assert_eq!(Election::default(), Election::Enabled);
        assert!(Election::from_enabled(true).is_enabled());
        assert!(!Election::from_enabled(false).is_enabled());
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
