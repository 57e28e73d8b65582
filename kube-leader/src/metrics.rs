//! Prometheus metrics of the election, in your own `prometheus_client` [`Registry`] (feature
//! `prometheus-client`).
//!
//! [`LeaderMetrics`] registers these metrics and is an [`Observer`]: give it to
//! [`LeaseElector::observer`](crate::LeaseElector::observer) or
//! [`ForLife::observer`](crate::ForLife::observer). Every series is labelled `name`, the lock's
//! name, as client-go labels its own, so that dashboards and alerts made for client-go's and
//! controller-runtime's leader election work unchanged:
//!
//! | metric | type | meaning |
//! |---|---|---|
//! | `leader_election_master_status{name}` | gauge | client-go's: 1 while this process leads the lock, else 0 |
//! | `leader_election_slowpath_total{name}` | counter | client-go's: renewals that could not be done with the leader's one write (below) |
//! | `kube_leader_leadership_acquired_total{name}` | counter | terms this process began |
//! | `kube_leader_leadership_lost_total{name, reason}` | counter | terms that ended, by [`LossReason`] (`other_holder`, `renew_deadline`, `released`, ...) |
//! | `kube_leader_renew_duration_seconds{name}` | histogram | Lease: from sending a renewal to seeing it stored |
//! | `kube_leader_fencing_token{name}` | gauge | the fencing token of the latest term this process led (0 before its first) |
//!
//! **`leader_election_slowpath_total`.** client-go's leader renews with an update built from
//! the record it saw last (its fast path), and counts the renewals for which that update failed
//! and it had to read the lease again (its slow path). A kube-leader leader renews with one
//! write too, and counts here every renewal attempt that did not store that write: refused,
//! timed out, failed on the network, or met a conflict that needed a re-read of the Lease (an
//! edit of its metadata by somebody else). These are the
//! [`RenewFailed`](Observation::RenewFailed) observations; a renewal that shows that another
//! candidate leads ends the term instead (`kube_leader_leadership_lost_total`). On a healthy
//! leader it stays at 0; it grows while the API server is slow or unreachable. Leader for life
//! never renews: its slow path counter stays 0.
//!
//! A follower is reported to no observer: call [`LeaderMetrics::add_lock`] so that its series
//! show 0 before this process ever leads. Shards report to no observer either: call
//! [`LeaderMetrics::follow`] with each shard's [`Leadership`] (its term: master status,
//! acquired and lost, fencing token; the shards' renewals are not reported).
//!
//! The names are registered as they are: register into a
//! [`sub_registry_with_prefix`](Registry::sub_registry_with_prefix) to prefix them all
//! (client-go's then lose their name), or one
//! [`sub_registry_with_label`](Registry::sub_registry_with_label) to add a label.
//!
//! ```no_run
//! use kube_leader::{metrics::LeaderMetrics, LeaseElector};
//! use prometheus_client::{encoding::text::encode, registry::Registry};
//!
//! # async fn run(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let mut registry = Registry::default(); // your own, with your own metrics
//! let metrics = LeaderMetrics::register(&mut registry);
//! metrics.add_lock("my-operator"); // master_status 0 while following
//! let elector = LeaseElector::new(client, "my-operator").observer(metrics.clone());
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! let leadership = elector.become_leader(&shutdown).await?;
//!
//! let mut text = String::new();
//! encode(&mut text, &registry)?; // serve this on /metrics
//! assert!(text.contains(r#"leader_election_master_status{name="my-operator"} 1"#));
//! # leadership.release().await?;
//! # Ok(()) }
//! ```

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use crate::{
    leadership::{Leadership, LossReason},
    observer::{Observation, Observer},
};

/// The buckets of `kube_leader_renew_duration_seconds` (the sidecar's).
const RENEW_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The label of every series: the lock's name.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Lock {
    name: String,
}

/// The labels of `kube_leader_leadership_lost_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Loss {
    name: String,
    reason: &'static str,
}

type Histograms = Family<Lock, Histogram, fn() -> Histogram>;

/// The election's metrics in a `prometheus_client` [`Registry`], and the [`Observer`] that
/// updates them; see the [module documentation](self) for the names and their meaning.
///
/// Cheap to clone: clones update the same series. One value can observe several electors (of
/// different locks) at once.
#[derive(Debug, Clone)]
pub struct LeaderMetrics {
    master_status: Family<Lock, Gauge>,
    slowpath: Family<Lock, Counter>,
    acquired: Family<Lock, Counter>,
    lost: Family<Loss, Counter>,
    renew: Histograms,
    fencing_token: Family<Lock, Gauge<u64, AtomicU64>>,
}

// === impl LeaderMetrics ===

impl LeaderMetrics {
    /// Registers the metrics into `registry` and returns their handle.
    ///
    /// Register them once per registry: a second registration would encode every name twice.
    pub fn register(registry: &mut Registry) -> Self {
        let this = Self {
            master_status: Family::default(),
            slowpath: Family::default(),
            acquired: Family::default(),
            lost: Family::default(),
            renew: Family::new_with_constructor(|| Histogram::new(RENEW_BUCKETS)),
            fencing_token: Family::default(),
        };
        // Counters are registered without `_total`: the encoder appends it.
        registry.register(
            "leader_election_master_status",
            "client-go's leader election gauge: 1 while this process leads the lock named by `name`, else 0",
            this.master_status.clone(),
        );
        registry.register(
            "leader_election_slowpath",
            "Renewals that could not be done with the leader's one write (failed, timed out, or needed a re-read after a conflict)",
            this.slowpath.clone(),
        );
        registry.register(
            "kube_leader_leadership_acquired",
            "Terms this process began as leader of the lock",
            this.acquired.clone(),
        );
        registry.register(
            "kube_leader_leadership_lost",
            "Terms of this process that ended, by reason",
            this.lost.clone(),
        );
        registry.register(
            "kube_leader_renew_duration_seconds",
            "Lease: time from sending a renewal until this leader sees it stored",
            this.renew.clone(),
        );
        registry.register(
            "kube_leader_fencing_token",
            "The fencing token of the latest term this process led (0 before its first)",
            this.fencing_token.clone(),
        );
        this
    }

    /// Shows every series of the lock `name` now, at 0: a follower's
    /// `leader_election_master_status` is 0 rather than absent. Observations add the series of
    /// their lock anyway; `leadership_lost_total` gets its series per reason as they happen.
    pub fn add_lock(&self, name: &str) {
        let lock = label(name);
        // Each returns a read guard of its family: dropped at once.
        drop(self.master_status.get_or_create(&lock));
        drop(self.slowpath.get_or_create(&lock));
        drop(self.acquired.get_or_create(&lock));
        drop(self.renew.get_or_create(&lock));
        drop(self.fencing_token.get_or_create(&lock));
    }

    /// Counts a term that reports to no observer, the leadership of one shard of
    /// [`Shards`](crate::Shards) for example: the term begins now, and a background task (on
    /// the current tokio runtime) reports its end. A skipped election is not counted.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn follow(&self, leadership: &Leadership) {
        if leadership.is_skipped() {
            return;
        }
        let term = leadership.term().clone();
        self.observe(&Observation::Leading { term: term.clone() });
        let mut reason = leadership.loss_watch();
        let this = self.clone();
        tokio::spawn(async move {
            let reason = match reason.wait_for(Option::is_some).await {
                Ok(r) => r.clone().unwrap_or(LossReason::Released),
                Err(_) => LossReason::KeeperStopped {
                    why: "ended without a reason".into(),
                },
            };
            this.observe(&Observation::Stopped { term, reason });
        });
    }
}

impl Observer for LeaderMetrics {
    fn observe(&self, observation: &Observation) {
        match observation {
            Observation::Leading { term } => {
                let lock = label(&term.lock.name);
                self.acquired.get_or_create(&lock).inc();
                self.fencing_token.get_or_create(&lock).set(term.fencing_token);
                self.master_status.get_or_create(&lock).set(1);
            }
            Observation::Stopped { term, reason } => {
                let lock = label(&term.lock.name);
                self.master_status.get_or_create(&lock).set(0);
                let loss = Loss {
                    name: lock.name,
                    reason: reason_label(reason),
                };
                self.lost.get_or_create(&loss).inc();
            }
            Observation::Renewed { lock, latency } => {
                self.renew
                    .get_or_create(&label(&lock.name))
                    .observe(latency.as_secs_f64());
            }
            Observation::RenewFailed { lock, count } => {
                self.slowpath.get_or_create(&label(&lock.name)).inc_by(*count);
            }
        }
    }
}

fn label(name: &str) -> Lock {
    Lock {
        name: name.to_string(),
    }
}

/// The `reason` label of a loss: the variant's name in snake case.
fn reason_label(reason: &LossReason) -> &'static str {
    match reason {
        LossReason::LockDeleted => "lock_deleted",
        LossReason::LockReplaced { .. } => "lock_replaced",
        LossReason::OtherHolder { .. } => "other_holder",
        LossReason::RenewDeadline { .. } => "renew_deadline",
        LossReason::PodEnding { .. } => "pod_ending",
        LossReason::DuplicateIdentity { .. } => "duplicate_identity",
        LossReason::KeeperStopped { .. } => "keeper_stopped",
        LossReason::Released => "released",
        LossReason::Cancelled => "cancelled",
        LossReason::Rebalanced => "rebalanced",
        LossReason::Yielded { .. } => "yielded",
    }
}

#[cfg(test)]
mod tests;
