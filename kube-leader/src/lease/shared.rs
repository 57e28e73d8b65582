//! The Lease strategy's basement: what its elector, campaign, keeper and leader views share —
//! the API's names for errors ([`lease_op`]), the candidate's shared state ([`Shared`]) and its
//! renewal figures ([`Renewals`]). It imports none of them.

use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{
    coordinated::{Candidacy, Registered},
    record::{new_instance_id, LeaseRecord},
};
pub use crate::renewals::Renewals;
use crate::{
    api::Op,
    leadership::{LeaderInfo, Strategy},
    lock::LockRef,
    successor::{CandidatePod, Hold, Registration, Registry},
};

/// Where to find a Role that grants what the Lease strategy needs.
pub(crate) const RBAC_HINT: &str =
    "the one `kube-leader rbac --strategy lease --lock LOCK --namespace NS` prints \
     (https://github.com/kube-leader/kube-leader/blob/main/deploy/lease/rbac-lease.yaml)";
pub(crate) const RESOURCE: &str = "leases.coordination.k8s.io";

/// What a candidate shows while it campaigns and leads, shared by the elector, its clones and
/// its campaign and keeper tasks.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(super) leader: watch::Sender<Option<LeaderInfo>>,
    pub(crate) renewals: watch::Sender<Renewals>,
    /// The greatest `leaseTransitions` this elector has seen on its Lease (`None`: it never saw
    /// the Lease): a Lease it creates again after a deletion goes on counting from there.
    transitions_seen: std::sync::Mutex<Option<u32>>,
    /// This candidate's instance id, written beside every record it writes, so that it tells
    /// its own records from those of another process with the same identity.
    pub(crate) instance: String,
    /// This candidate's registration ([`Successor::Youngest`]), from its first campaign until
    /// shutdown (or until the elector is dropped).
    registration: tokio::sync::Mutex<Option<Registration>>,
    /// This candidate's `LeaseCandidate` ([`LeaseConfig::coordinated`](super::LeaseConfig)):
    /// `None` until its first campaign registers it; `Some(None)` where the server does not
    /// serve `LeaseCandidate` (the candidate campaigns as a classic one).
    candidacy: tokio::sync::Mutex<Option<Option<Candidacy>>>,
}

impl Shared {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self {
            leader: watch::channel(None).0,
            renewals: watch::channel(Renewals::default()).0,
            transitions_seen: std::sync::Mutex::new(None),
            instance: new_instance_id(),
            registration: tokio::sync::Mutex::new(None),
            candidacy: tokio::sync::Mutex::new(None),
        })
    }

    /// Registers this candidate as a coordinated one, once (see
    /// [`coordinated`](super::coordinated)): whether it takes part (`false`: the server does not
    /// serve `LeaseCandidate`, said once in the log).
    ///
    /// # Errors
    /// The registration was refused (a permission).
    pub(super) async fn take_part(
        &self,
        register: impl std::future::Future<Output = crate::error::Result<Registered>>,
    ) -> crate::error::Result<bool> {
        let mut candidacy = self.candidacy.lock().await;
        if candidacy.is_none() {
            *candidacy = Some(match register.await? {
                Registered::Yes(c) => Some(c),
                Registered::NotServed => None,
            });
        }
        Ok(candidacy.as_ref().is_some_and(Option::is_some))
    }

    /// Withdraws this candidate's `LeaseCandidate` (a stopping candidate), awaiting its deletion.
    pub(super) async fn withdraw_candidacy(&self) {
        let candidacy = self.candidacy.lock().await.take().flatten();
        if let Some(c) = candidacy {
            c.withdraw().await;
        }
    }

    /// Registers this candidate with `registry`, unless it is registered already (a campaign
    /// after an earlier term) or `shutdown` is cancelled (a stopping candidate never registers).
    pub(super) async fn register(
        &self,
        registry: &Registry,
        identity: &str,
        pod: Option<&CandidatePod>,
        shutdown: &CancellationToken,
    ) {
        let mut registration = self.registration.lock().await;
        if registration.is_none() && !shutdown.is_cancelled() {
            *registration = Some(registry.register(identity, pod, shutdown).await);
        }
    }

    /// Holds this candidate's withdrawal back until the returned hold is dropped: taken by a
    /// term's keeper, so the withdrawal follows the release (see [`Hold`]).
    pub(super) fn hold_registration(&self) -> Option<Hold> {
        // Nothing else holds the lock while a term begins; if something did, no hold is taken
        // and the withdrawal merely runs beside the release, as without one.
        self.registration
            .try_lock()
            .ok()?
            .as_ref()
            .map(Registration::hold)
    }

    /// Withdraws this candidate's registration (a stopping candidate), awaiting its deletion.
    pub(super) async fn withdraw(&self) {
        let registration = self.registration.lock().await.take();
        if let Some(r) = registration {
            r.withdraw().await;
        }
    }

    /// Publishes the current leader (`token`: the holder's fencing token, if known).
    pub(crate) fn publish(&self, lock: &LockRef, record: Option<&LeaseRecord>, token: Option<u64>) {
        if let Some(r) = record {
            self.saw_transitions(r.transitions);
        }
        let info = record.map(|r| leader_info(lock, r, token));
        self.leader.send_if_modified(|cur| {
            if *cur == info {
                return false;
            }
            *cur = info;
            true
        });
    }

    pub(crate) fn set_health(&self, f: impl FnOnce(&mut Renewals)) {
        self.renewals.send_modify(f);
    }

    /// Whether this elector has seen its Lease (in any campaign or term).
    pub(crate) fn saw_lease(&self) -> bool {
        self.transitions_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    fn saw_transitions(&self, transitions: u32) {
        let mut seen = self.transitions_seen.lock().unwrap_or_else(|e| e.into_inner());
        *seen = Some(seen.map_or(transitions, |s| s.max(transitions)));
    }

    /// `leaseTransitions` for a Lease this elector creates: one more than the greatest it saw;
    /// 0 if it saw none, or only an exhausted count (the fencing token does not depend on it).
    pub(crate) fn transitions_for_create(&self) -> u32 {
        let seen = self.transitions_seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.filter(|s| *s < i32::MAX.unsigned_abs()).map_or(0, |s| s + 1)
    }
}

/// What `record` says of the leader of `lock` (`fencing_token`: the holder's, if known).
pub(crate) fn leader_info(lock: &LockRef, r: &LeaseRecord, fencing_token: Option<u64>) -> LeaderInfo {
    LeaderInfo {
        strategy: Strategy::Lease,
        lock: lock.clone(),
        holder: r.holder.clone(),
        fencing_token: fencing_token.filter(|_| r.holder.is_some()),
        acquired_at: r.acquired_at(),
        renewed_at: r.renewed_at(),
        lease_duration: r.lease_duration,
    }
}

/// The [`Op`] of a call on the Lease `lock`, for errors that name it.
pub(crate) fn lease_op<'a>(lock: &'a LockRef, verb: &'static str) -> Op<'a> {
    Op {
        verb,
        resource: RESOURCE,
        namespace: &lock.namespace,
        name: &lock.name,
        hint: RBAC_HINT,
    }
}
