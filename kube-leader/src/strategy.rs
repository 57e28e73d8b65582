//! [`Strategy`]: which strategy, and what a program that lets its users choose asks of it. It
//! stands below every module that names a strategy (the handle, the fence's lock reads, the
//! options), and imports none of them.

use std::fmt;

/// Which election strategy produced a [`Leadership`](crate::leadership::Leadership).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Strategy {
    /// Leader for life: a ConfigMap owned by the leader's Pod (operator-sdk `leader.Become`).
    ForLife,
    /// A `coordination.k8s.io/v1` Lease renewed by the leader (client-go `leaderelection`).
    Lease,
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// === impl Strategy ===

/// What a program that lets its users choose the strategy asks of it, instead of naming one:
/// the `kube-leader` sidecar decides its defaults, its RBAC and its step-down with these.
impl Strategy {
    /// Its name in flags and configuration files: `for-life` or `lease`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Strategy::ForLife => "for-life",
            Strategy::Lease => "lease",
        }
    }

    /// Whether the lock expires by itself when its leader goes silent: a Lease does,
    /// `lease_duration` after its last renewal, so work gated on a term must have stopped
    /// within `lease_duration − renew_deadline` after that term's confirmation lapsed
    /// (the sidecar's stop bound). Leader
    /// for life's lock is held until its Pod is deleted; a silent leader is noticed by its
    /// liveness heartbeat, if any.
    pub(crate) fn expires(self) -> bool {
        match self {
            Strategy::ForLife => false,
            Strategy::Lease => true,
        }
    }

    /// Whether a leader keeps its lock when its work ends by itself (not asked to stop):
    /// leader for life does (a process restarted in the same Pod continues the term, as
    /// operator-sdk's); a Lease is released, so that another candidate takes over at once.
    pub(crate) fn keeps_lock_after_work(self) -> bool {
        !self.expires()
    }

    /// Whether a candidate watches its own Pod by itself: leader for life does (its lock is
    /// owned by its Pod); a Lease candidate only when given its Pod
    /// ([`LeaseElector::candidate_pod`](crate::LeaseElector::candidate_pod)).
    pub(crate) fn watches_own_pod(self) -> bool {
        !self.expires()
    }
}
