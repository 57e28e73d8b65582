//! Options of a leader-for-life election and their validation.

use std::{path::PathBuf, time::Duration};

use super::holder::Liveness;
use crate::{
    discovery,
    error::{invalid, Result},
    setters::setters,
    successor::Successor,
};

/// The first retry delay of the fallback backoff: operator-sdk's `backoff := time.Second`.
pub(crate) const INITIAL_BACKOFF: Duration = Duration::from_secs(1);

/// The shortest [`ForLifeConfig::liveness`]: a heartbeat every 333 ms at most.
pub const MIN_LIVENESS: Duration = Duration::from_secs(1);

/// What [`ForLife::become_leader`](crate::ForLife::become_leader) does when no namespace can be
/// found, which means that the process does not run in a cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OutsideCluster {
    /// Skip the election and return a [`Leadership`](crate::Leadership) that
    /// [is skipped](crate::Leadership::is_skipped) and never lost, logging why at `info`: the
    /// operator-sdk's "Skipping leader election; not running in a cluster." The default.
    #[default]
    Skip,
    /// Fail with [`Error::NoNamespace`](crate::Error::NoNamespace).
    Fail,
}

/// What a waiting candidate does with the Pod of a dead leader (phase `Failed` or
/// `Succeeded`), once it takes over that leader's stale lock.
///
/// The lock is taken over in every case once the dead leader's containers are known to be gone
/// (its release, or its grace period since the terminal phase was seen: see
/// [`ForLife`](crate::ForLife)), so failover never waits for the Pod object to go; this only
/// decides whether the dead Pod object is cleaned up as well (with a UID precondition, so a
/// new Pod of the same name is never deleted). Deleting needs the `delete pods` permission.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadLeaderPod {
    /// Leave the Pod alone.
    Keep,
    /// Delete the Pod only if it was evicted (phase `Failed`, reason `Evicted`) and is not
    /// already being deleted: what operator-sdk does. The default.
    ///
    /// From Kubernetes 1.27 on, an evicted Pod whose containers all exit 0 on the eviction's
    /// SIGTERM (`kube-leader run` does) ends `Succeeded` with no reason instead, and is left
    /// alone by this policy (the lock is still taken over); [`DeleteTerminal`](Self::DeleteTerminal)
    /// deletes it.
    #[default]
    DeleteEvicted,
    /// Delete the Pod in any terminal phase (`Failed` for any reason, `Succeeded`) unless it is
    /// already being deleted.
    DeleteTerminal,
}

/// Where the namespace and the Pod name come from when they are not set explicitly.
///
/// [`Environment::from_process`] (the default) reads `POD_NAMESPACE`, `POD_NAME` and the
/// in-cluster service-account namespace file of this process when
/// [`become_leader`](crate::ForLife::become_leader) is called. Set another one to embed the
/// elector somewhere else, or to test the outside-a-cluster path without touching the process
/// environment ([`Environment::default`] has nothing: "not in a cluster").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Environment {
    /// The value of `POD_NAMESPACE`.
    pub pod_namespace: Option<String>,
    /// The value of `POD_NAME`.
    pub pod_name: Option<String>,
    /// The service-account namespace file to read.
    pub service_account_namespace_file: Option<PathBuf>,
}

// === impl Environment ===

impl Environment {
    /// This process's `POD_NAMESPACE`, `POD_NAME` and
    /// [`SERVICE_ACCOUNT_NAMESPACE_FILE`](crate::discovery::SERVICE_ACCOUNT_NAMESPACE_FILE).
    #[must_use]
    pub fn from_process() -> Self {
        Self {
            pod_namespace: std::env::var("POD_NAMESPACE").ok(),
            pod_name: discovery::pod_name_from_env(),
            service_account_namespace_file: Some(PathBuf::from(discovery::SERVICE_ACCOUNT_NAMESPACE_FILE)),
        }
    }
}

/// Options of a leader-for-life election; see [`ForLife`](crate::ForLife) for the builder.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ForLifeConfig {
    /// The longest delay of the fallback backoff, which starts at 1 s and doubles up to exactly
    /// this cap, with 20% jitter. Default 16 s: operator-sdk's `maxBackoffInterval`. The backoff
    /// only paces retries after transient API errors, re-reads while a watch is failing, and
    /// re-reads of a malformed lock (as operator-sdk does); a healthy watch wakes a waiting
    /// candidate at once.
    pub backoff_cap: Duration,
    /// What to do outside a cluster. Default [`OutsideCluster::Skip`] (operator-sdk).
    pub outside_cluster: OutsideCluster,
    /// What to do with a dead leader's Pod. Default [`DeadLeaderPod::DeleteEvicted`] (operator-sdk).
    pub dead_leader_pod: DeadLeaderPod,
    /// Opt-in takeover from a leader whose Node has not been `Ready` for this long, as observed
    /// by this candidate's own monotonic clock. Default `None`: never.
    ///
    /// **Risk: two leaders.** A Node that is not `Ready` is one the control plane cannot hear
    /// from; its processes may well still be running, cut off or merely slow, and the old
    /// leader goes on working until it notices that its lock is gone (which needs the API
    /// server it may not reach). Enable this only if the work tolerates a second leader for a
    /// while, for example because every write carries the
    /// [fencing token](crate::Leadership::fencing_token) and the store rejects stale ones.
    /// Needs `get nodes` (a ClusterRole); without it the policy is disabled with one warning.
    pub not_ready_takeover: Option<Duration>,
    /// Bound on each API call. Default 10 s: far below kube's 295 s read timeout, so a hung
    /// connection costs one retry, not five minutes, and far above a healthy API server's
    /// latency.
    pub api_timeout: Duration,
    /// The liveness heartbeat, opt-in. `Some(liveness)`: the leader writes the lock's
    /// [`RENEW_TIME_ANNOTATION`](crate::lock::RENEW_TIME_ANNOTATION) every third of
    /// `liveness` (the first with the lock's create), and
    /// [`Leadership::confirmations`](crate::Leadership::confirmations) is the send of the
    /// last successful write plus `liveness`: **work gated on the term must stop by then** (as
    /// with a Lease's renew deadline). A heartbeat that cannot be written does not end the term
    /// (a partition of a live Pod hands nothing over): the confirmation lapses, and moves on
    /// with the next heartbeat that gets through while the lock is still this term's.
    ///
    /// In exchange, a waiting candidate takes over a leader Pod that has ended (terminal, gone
    /// or replaced; never a live one) once its heartbeat has not moved for the advertised
    /// `liveness + liveness_grace` (rounded up to whole seconds) plus 2 s, by its own clock,
    /// rather than after the Pod's grace period plus 2 s: the proof that remains when the
    /// leader died with its work and wrote no release mark (a limit eviction SIGKILLs both).
    ///
    /// Default `None`: no heartbeat and no write while leading, as operator-sdk (one update
    /// of the lock every `liveness / 3`, and a watch event to every waiting candidate, is the
    /// cost). At least 1 s.
    pub liveness: Option<Duration>,
    /// With [`liveness`](Self::liveness): how long the work may still run after
    /// the [confirmation](crate::Leadership::confirmations) has passed (the sidecar's
    /// SIGTERM → SIGKILL grace). Advertised in the lock with the liveness, so that successors
    /// wait for it too. Default zero: the work stops when the confirmation lapses.
    pub liveness_grace: Duration,
    /// Which candidate a leader that steps down ([`Leadership::release`](crate::Leadership::release),
    /// after its Pod began to terminate) hands over to. Default [`Successor::Youngest`]: the
    /// youngest live candidate by its Pod's creation time, so that a rollout moves leadership
    /// once, to a Pod of the new ReplicaSet (see [`Successor`](crate::Successor)).
    pub successor: Successor,
    /// How long a candidate that is not the preferred successor defers to it after it saw the
    /// release mark; the preferred one takes over at once. Crash failover (the lock deleted with
    /// its Pod, a stale lock) never waits for it. Default 2 s.
    pub successor_wait: Duration,
    /// Whether to campaign for the lock (default `true`). `false` leads at once, without a
    /// lock, in or outside a cluster: see [`LeaseConfig::election`](crate::LeaseConfig::election).
    pub election: bool,
}

impl Default for ForLifeConfig {
    fn default() -> Self {
        Self {
            // operator-sdk's maxBackoffInterval.
            backoff_cap: Duration::from_secs(16),
            outside_cluster: OutsideCluster::Skip,
            dead_leader_pod: DeadLeaderPod::DeleteEvicted,
            not_ready_takeover: None,
            api_timeout: Duration::from_secs(10),
            liveness: None,
            liveness_grace: Duration::ZERO,
            successor: Successor::Youngest,
            successor_wait: Duration::from_secs(2),
            election: true,
        }
    }
}

// === impl ForLifeConfig ===

setters!(ForLifeConfig {
    backoff_cap: Duration => backoff_cap,
    outside_cluster: OutsideCluster => outside_cluster,
    dead_leader_pod: DeadLeaderPod => dead_leader_pod,
    not_ready_takeover: Duration => Some(not_ready_takeover),
    api_timeout: Duration => api_timeout,
    liveness: Duration => Some(liveness),
    liveness_grace: Duration => liveness_grace,
    successor: Successor => successor,
    successor_wait: Duration => successor_wait,
    election: bool => election,
});

impl ForLifeConfig {
    /// Checks the options: a backoff cap of at least the initial 1 s, a non-zero API timeout
    /// and takeover grace, and no duration beyond i64 nanoseconds (about 292 years).
    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |field, m: String| Err(invalid(field, m));
        if self.backoff_cap < INITIAL_BACKOFF {
            return bad(
                "backoff_cap",
                format!(
                    "backoff cap must be at least the initial delay of {INITIAL_BACKOFF:?}, got {:?}",
                    self.backoff_cap
                ),
            );
        }
        if self.api_timeout.is_zero() {
            return bad("api_timeout", "API timeout must be greater than zero".into());
        }
        // Found by fuzzing the CLI's flags: deadlines are `Instant + duration`, which panics on
        // overflow. Client-go's longest duration (i64 nanoseconds, ~292 years) is the limit.
        let max = Duration::from_nanos(i64::MAX.unsigned_abs());
        for (field, what, d) in [
            ("backoff_cap", "backoff cap", Some(self.backoff_cap)),
            ("api_timeout", "API timeout", Some(self.api_timeout)),
            (
                "not_ready_takeover",
                "NotReady takeover grace",
                self.not_ready_takeover,
            ),
            ("liveness", "liveness", self.liveness),
            ("liveness_grace", "liveness grace", Some(self.liveness_grace)),
            ("successor_wait", "successor wait", Some(self.successor_wait)),
        ] {
            if let Some(d) = d.filter(|d| *d > max) {
                return bad(field, format!("{what} must be at most {max:?}, got {d:?}"));
            }
        }
        if self.not_ready_takeover.is_some_and(|g| g.is_zero()) {
            return bad(
                "not_ready_takeover",
                "the NotReady takeover grace must be greater than zero".into(),
            );
        }
        if let Some(l) = self.liveness.filter(|l| *l < MIN_LIVENESS) {
            return bad(
                "liveness",
                format!(
                    "liveness must be at least {MIN_LIVENESS:?} (a heartbeat every third of it), got {l:?}"
                ),
            );
        }
        Ok(())
    }
}

impl ForLifeConfig {
    /// The heartbeat's timings, if it is on.
    pub(super) fn heartbeat(&self) -> Option<Liveness> {
        self.liveness.map(|confirm| Liveness {
            confirm,
            advertised: confirm.saturating_add(self.liveness_grace),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn defaults_are_the_seeds_and_valid() {
        let c = ForLifeConfig::default();
        assert_eq!(c.backoff_cap, Duration::from_secs(16));
        assert_eq!(c.outside_cluster, OutsideCluster::Skip);
        assert_eq!(c.dead_leader_pod, DeadLeaderPod::DeleteEvicted);
        assert_eq!(c.not_ready_takeover, None);
        assert_eq!(c.liveness, None, "no heartbeat: no write while leading");
        c.validate().unwrap();
    }

    #[test]
    fn rejects_nonsense() {
        let cases = [
            (
                ForLifeConfig {
                    backoff_cap: Duration::from_millis(500),
                    ..Default::default()
                },
                "backoff cap",
            ),
            (
                ForLifeConfig {
                    api_timeout: Duration::ZERO,
                    ..Default::default()
                },
                "API timeout",
            ),
            (
                ForLifeConfig {
                    not_ready_takeover: Some(Duration::ZERO),
                    ..Default::default()
                },
                "grace",
            ),
            (
                ForLifeConfig {
                    backoff_cap: Duration::MAX,
                    ..Default::default()
                },
                "backoff cap must be at most",
            ),
            (
                ForLifeConfig {
                    not_ready_takeover: Some(Duration::MAX),
                    ..Default::default()
                },
                "grace must be at most",
            ),
            (
                ForLifeConfig {
                    liveness: Some(Duration::from_millis(999)),
                    ..Default::default()
                },
                "liveness must be at least 1s",
            ),
            (
                ForLifeConfig {
                    liveness: Some(Duration::MAX),
                    ..Default::default()
                },
                "liveness must be at most",
            ),
        ];
        for (c, want) in cases {
            let err = c.validate().unwrap_err();
            assert!(matches!(err, Error::InvalidConfig { .. }));
            assert!(err.to_string().contains(want), "{err} should contain {want}");
        }
    }
}
