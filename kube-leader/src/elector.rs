//! One face for both strategies: a candidate of either, and the leader of either lock.

use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::{
    error::Result,
    for_life::{self, ForLife},
    leadership::{LeaderInfo, Leadership, Strategy},
    lease::{LeaseElector, Renewals, Unhealthy},
    lock::LockRef,
    observer::Observer,
    successor::CandidatePod,
};

/// A candidate of either strategy, for programs that let their users choose (the
/// `kube-leader` sidecar does).
///
/// ```no_run
/// # async fn run(client: kube::Client, lease: bool) -> kube_leader::Result<()> {
/// use kube_leader::{Elector, ForLife, LeaseElector};
/// use tokio_util::sync::CancellationToken;
///
/// let elector: Elector = if lease {
///     LeaseElector::new(client, "my-operator").into()
/// } else {
///     ForLife::new(client, "my-operator-lock").into()
/// };
/// let leadership = elector.become_leader(&CancellationToken::new()).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Elector {
    /// Leader for life.
    ForLife(ForLife),
    /// A Lease.
    Lease(LeaseElector),
}

impl From<ForLife> for Elector {
    fn from(e: ForLife) -> Self {
        Self::ForLife(e)
    }
}

impl From<LeaseElector> for Elector {
    fn from(e: LeaseElector) -> Self {
        Self::Lease(e)
    }
}

// === impl Elector ===

impl Elector {
    /// The strategy of this candidate.
    pub(crate) fn strategy(&self) -> Strategy {
        match self {
            Self::ForLife(_) => Strategy::ForLife,
            Self::Lease(_) => Strategy::Lease,
        }
    }

    /// Sets the observer of either strategy ([`ForLife::observer`],
    /// [`LeaseElector::observer`]): for example the `prometheus-client` feature's
    /// `metrics::LeaderMetrics`.
    #[must_use]
    pub fn observer(self, observer: impl Observer) -> Self {
        match self {
            Self::ForLife(e) => Self::ForLife(e.observer(observer)),
            Self::Lease(e) => Self::Lease(e.observer(observer)),
        }
    }

    /// Names the Events' reporter ([`ForLife::event_reporter`],
    /// [`LeaseElector::event_reporter`]).
    #[must_use]
    pub fn event_reporter(self, reporter: impl Into<String>) -> Self {
        match self {
            Self::ForLife(e) => Self::ForLife(e.event_reporter(reporter)),
            Self::Lease(e) => Self::Lease(e.event_reporter(reporter)),
        }
    }

    /// The lock this candidate campaigns for, its namespace resolved as its strategy does
    /// ([`ForLife::lock`], [`LeaseElector::lock`]).
    ///
    /// # Errors
    /// No namespace (leader for life outside a cluster), or an invalid lock name.
    pub(crate) fn lock(&self) -> Result<LockRef> {
        match self {
            Self::ForLife(e) => e.lock(),
            Self::Lease(e) => e.lock(),
        }
    }

    /// This candidate's identity as its strategy resolves it ([`ForLife::resolved_identity`]:
    /// its Pod's name; [`LeaseElector::resolved_identity`]).
    ///
    /// # Errors
    /// None can be found.
    pub(crate) fn identity(&self) -> Result<String> {
        match self {
            Self::ForLife(e) => e.resolved_identity(),
            Self::Lease(e) => e.resolved_identity(),
        }
    }

    /// This candidate's Pod, for its registration as a successor ([`LeaseElector::candidate_pod`]);
    /// leader for life reads its own Pod, and ignores it.
    #[must_use]
    pub fn candidate_pod(self, pod: CandidatePod) -> Self {
        match self {
            Self::ForLife(e) => Self::ForLife(e),
            Self::Lease(e) => Self::Lease(e.candidate_pod(pod)),
        }
    }

    /// Campaigns until this candidate leads: [`ForLife::become_leader`] or
    /// [`LeaseElector::become_leader`].
    ///
    /// # Cancellation safety
    /// As the strategy's `become_leader`: cancel-safe while waiting.
    pub async fn become_leader(&self, shutdown: &CancellationToken) -> Result<Leadership> {
        match self {
            Self::ForLife(e) => e.become_leader(shutdown).await,
            Self::Lease(e) => e.become_leader(shutdown).await,
        }
    }

    /// Watches the current leader of this candidate's lock.
    ///
    /// A Lease candidate shares what its own campaign watches ([`LeaseElector::observe`]).
    /// Leader for life starts a watch of its own.
    ///
    /// # Errors
    /// The lock cannot be resolved: no namespace (leader for life outside a cluster), or an
    /// invalid lock name.
    pub fn observe(&self) -> Result<watch::Receiver<Option<LeaderInfo>>> {
        Ok(self.observe_lock(&self.lock()?))
    }

    /// The current leader of `lock` (this candidate's lock, resolved by the caller).
    pub(crate) fn observe_lock(&self, lock: &LockRef) -> watch::Receiver<Option<LeaderInfo>> {
        match self {
            Self::ForLife(e) => for_life::watch_leader(e.client.clone(), lock.clone()),
            Self::Lease(e) => e.observe(),
        }
    }

    /// A Lease candidate's renewal figures ([`LeaseElector::renewals`]); leader for life has
    /// no renewals.
    pub(crate) fn renewals(&self) -> Option<watch::Receiver<Renewals>> {
        match self {
            Self::ForLife(_) => None,
            Self::Lease(e) => Some(e.renewals()),
        }
    }

    /// The election watchdog ([`LeaseElector::check_health`]). Leader for life is always
    /// healthy: it has no renewals to miss, and its lock watch reports a loss at once.
    pub(crate) fn check_health(&self, tolerance: Duration) -> Result<(), Unhealthy> {
        match self {
            Self::ForLife(_) => Ok(()),
            Self::Lease(e) => e.check_health(tolerance),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_send<T: Send>(_: &T) {}

    /// Campaigns can be spawned: their futures are `Send` (checked at compile time).
    #[allow(dead_code)]
    fn campaigns_are_send(e: &Elector, f: &ForLife, l: &LeaseElector, t: &CancellationToken) {
        is_send(&e.become_leader(t));
        is_send(&f.become_leader(t));
        is_send(&l.become_leader(t));
    }
}
