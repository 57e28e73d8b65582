//! One face for both strategies: campaign, watch the leader, read it once, health.

use std::time::Duration;

use kube::Client;
use kube_leader::{for_life, lease, ForLife, LeaderInfo, Leadership, LeaseElector, LockRef, OutsideCluster};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::cli::{OutsideClusterArg, RunArgs, StrategyArg};

/// A candidate of either strategy.
#[derive(Debug, Clone)]
pub(crate) enum Elector {
    /// Leader for life.
    ForLife(ForLife),
    /// A Lease.
    Lease(LeaseElector),
}

// === impl Elector ===

impl Elector {
    /// The candidate `run` campaigns as.
    ///
    /// Leader for life gets the namespace only when it was given with `--namespace`: without
    /// it the library looks at `POD_NAMESPACE` and the service-account file, and finding
    /// neither is how it knows it runs outside a cluster (`--on-outside-cluster`).
    pub(crate) fn new(client: Client, args: &RunArgs, lock: &LockRef, identity: &str) -> Self {
        match args.lock.strategy {
            StrategyArg::ForLife => {
                let mut e = ForLife::new(client, lock.name.clone())
                    .pod_name(identity)
                    .outside_cluster(match args.on_outside_cluster {
                        OutsideClusterArg::Skip => OutsideCluster::Skip,
                        OutsideClusterArg::Fail => OutsideCluster::Fail,
                    })
                    .not_ready_takeover(args.not_ready_takeover);
                if let Some(ns) = &args.lock.namespace {
                    e = e.namespace(ns.clone());
                }
                Elector::ForLife(e)
            }
            StrategyArg::Lease => Elector::Lease(
                LeaseElector::new(client, lock.name.clone())
                    .namespace(lock.namespace.clone())
                    .identity(identity)
                    .config(args.lease_config()),
            ),
        }
    }

    /// Campaigns until leading.
    ///
    /// # Cancellation safety
    /// As the strategy's `become_leader`: cancel-safe while waiting.
    pub(crate) async fn become_leader(&self, cancel: &CancellationToken) -> kube_leader::Result<Leadership> {
        match self {
            Elector::ForLife(e) => e.become_leader(cancel).await,
            Elector::Lease(e) => e.become_leader(cancel).await,
        }
    }

    /// The current leader as this candidate sees it. A Lease candidate publishes what its own
    /// watch sees (no second watch); leader for life gets a watch of its own.
    pub(crate) fn observe(&self, client: &Client, lock: &LockRef) -> watch::Receiver<Option<LeaderInfo>> {
        match self {
            Elector::ForLife(_) => for_life::watch_leader(client.clone(), lock.clone()),
            Elector::Lease(e) => e.observe(),
        }
    }

    /// A Lease candidate's renewal figures (heartbeats for the supervisor, renewal metrics).
    pub(crate) fn renewals(&self) -> Option<watch::Receiver<lease::Renewals>> {
        match self {
            Elector::ForLife(_) => None,
            Elector::Lease(e) => Some(e.renewals()),
        }
    }

    /// The election watchdog: `Err` says why this candidate is unhealthy.
    pub(crate) fn check_health(&self, tolerance: Duration) -> Result<(), String> {
        match self {
            // Leader for life has no renewals to miss; its lock watch reports loss at once.
            Elector::ForLife(_) => Ok(()),
            Elector::Lease(e) => e.check_health(tolerance).map_err(|u| u.to_string()),
        }
    }
}

/// Reads the current leader of `lock` once (`None`: no lock).
///
/// # Cancellation safety
/// Cancel-safe.
pub(crate) async fn current_leader(
    client: Client,
    strategy: StrategyArg,
    lock: &LockRef,
) -> kube_leader::Result<Option<LeaderInfo>> {
    match strategy {
        StrategyArg::ForLife => for_life::current_leader(client, lock).await,
        StrategyArg::Lease => lease::current_leader(client, lock).await,
    }
}
