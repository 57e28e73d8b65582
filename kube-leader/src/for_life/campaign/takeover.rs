//! A waiting candidate's takeover of a stale lock: the fresh read of the leader Pod that
//! confirms the decision, the deletion of the lock (with its preconditions), and of the dead
//! leader's Pod by policy.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use tokio::time::Instant;
use tracing::{debug, info, warn, Instrument};

use super::{Confirmed, Election};
use crate::for_life::{
    api::{cm_op, pod_op, uid_precondition},
    decide::{Proof, Stale},
    record::{LeaderPod, LockState, PodRef, PodView},
    steps,
};
use crate::{
    api::{call, Failure},
    error::Result,
};

// === impl Election ===

impl Election<'_> {
    /// Before creating a lock that went without its leader's release mark: reads the last
    /// leader's Pod afresh, since the lock watch can bring the garbage collector's deletion
    /// before the Pod watch brings the Pod's end.
    pub(super) async fn confirm_before_create(&mut self) -> Result<Confirmed> {
        if self.fate.as_ref().is_some_and(|f| !f.released) {
            return self.confirm_leader_pod().await;
        }
        Ok(Confirmed::Yes)
    }

    /// Reads the leader Pod afresh right before a stale-lock deletion: the watched state can be
    /// old (a Pod watch that fails keeps the last state it saw, e.g. across an API server
    /// restart), and a Pod re-created under the same name may lead with a new lock meanwhile,
    /// which a stale view would take for "replaced".
    pub(super) async fn confirm_leader_pod(&mut self) -> Result<Confirmed> {
        let timeout = self.config().api_timeout;
        let Some(p) = self.leader_pod.as_mut() else {
            // No other Pod to confirm (the lock is this Pod's own earlier one, or has no
            // owner): the lock's UID precondition guards the deletion.
            return Ok(Confirmed::Yes);
        };
        let op = pod_op(&self.lock.namespace, &p.name, "get");
        match call(op, timeout, self.pods.get_opt(&p.name)).await {
            Ok(pod) => {
                let fresh = pod.as_ref().map_or(LeaderPod::Absent, |pod| {
                    LeaderPod::Present(PodView::from_pod(pod))
                });
                if fresh == p.state {
                    Ok(Confirmed::Yes)
                } else {
                    debug!(holder = %p.name, "the leader Pod changed since it was last seen; deciding again");
                    p.state = fresh;
                    Ok(Confirmed::Changed)
                }
            }
            Err(Failure::Fatal(e)) => Err(e),
            Err(e) => {
                debug!(error = ?e, holder = %p.name, "cannot read the leader Pod to confirm the lock is stale; waiting");
                self.arm_retry();
                Ok(Confirmed::Unknown)
            }
        }
    }

    /// Deletes a dead leader's Pod in the background (best effort, UID precondition).
    pub(super) fn delete_dead_pod(&self, pod: PodRef) {
        steps::delete_pod(&pod);
        let (pods, ns) = (self.pods.clone(), self.lock.namespace.clone());
        let task = delete_dead_pod(pods, ns, pod, self.config().api_timeout);
        tokio::spawn(task.instrument(tracing::Span::current()));
    }

    /// Deletes a stale lock (UID precondition); by policy, the dead leader's Pod is deleted once
    /// this candidate's create won (see [`Election::dead_pod`]). `true`: the lock is gone, so
    /// decide again at once.
    pub(super) async fn delete_stale(
        &mut self,
        (lock_uid, version): (&str, Option<&str>),
        why: &Stale,
        proof: Proof,
        delete_pod: Option<PodRef>,
    ) -> Result<bool> {
        info!(reason = %why, %proof, lock_uid, "the lock is stale; deleting it");
        if delete_pod.is_some() {
            self.dead_pod = delete_pod;
        }
        let mut params = uid_precondition(lock_uid);
        if let Some(p) = params.preconditions.as_mut() {
            p.resource_version = version.map(str::to_string);
        }
        let timeout = self.config().api_timeout;
        let (delete, sent) = (self.configmaps.delete(&self.lock.name, &params), Instant::now());
        let deleted = call(cm_op(&self.lock, "delete"), timeout, delete).await;
        steps::write("delete", (Some(lock_uid), version), None, sent, &deleted, |_| {
            None
        });
        match deleted {
            // Gone: by this delete, or already (the garbage collector, another candidate). Create
            // at once rather than after the watch says so; the create is atomic anyway.
            Ok(_) | Err(Failure::NotFound) => {
                self.lock_state = LockState::Absent;
                if let Some(f) = self.fate.as_mut() {
                    f.proven = true;
                }
                return Ok(true);
            }
            // Another lock by now: the watch brings it.
            Err(Failure::Conflict) => debug!("the lock was replaced before it could be deleted"),
            Err(Failure::Fatal(e)) => return Err(e),
            Err(Failure::Transient(e)) => debug!(error = %e, "deleting the stale lock failed; retrying"),
        }
        self.arm_retry();
        Ok(false)
    }
}

/// Best effort: deletes a dead leader's Pod, if its UID is still the one seen.
async fn delete_dead_pod(pods: Api<Pod>, namespace: String, pod: PodRef, timeout: Duration) {
    info!(holder = %pod.name, "deleting the dead leader Pod");
    let op = pod_op(&namespace, &pod.name, "delete");
    match call(op, timeout, pods.delete(&pod.name, &uid_precondition(&pod.uid))).await {
        Ok(_) | Err(Failure::NotFound | Failure::Conflict) => {}
        Err(Failure::Fatal(e)) => {
            warn!(error = %e, holder = %pod.name, "could not delete the dead leader Pod")
        }
        Err(Failure::Transient(e)) => {
            debug!(error = %e, holder = %pod.name, "could not delete the dead leader Pod")
        }
    }
}
