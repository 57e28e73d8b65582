//! The decision with no lock: after the last owner this candidate saw, create it or wait.

use super::{deletes_pod, may_run, proof, terminated, Decision, Fate, Inputs, LeaderPod, PodRef, Waiting};

/// With no lock: create it, unless the last owner this candidate saw has ended without proof
/// (a force-deleted leader Pod, whose lock the garbage collector deleted at once) or is being
/// deleted (its lock gone before it: an admin, or a foreground deletion).
pub(super) fn decide_without_lock(i: &Inputs<'_>) -> Decision {
    let Some(fate) = i.fate.filter(|f| !f.released && !f.proven) else {
        return Decision::Create;
    };
    let holder = fate.owner.name.clone();
    let how = match i.leader_pod {
        _ if fate.owner.name == i.me.name => "is gone (a former Pod of this name)".to_string(),
        // Its Pod not seen yet (the lock went before the Pod's watch said anything): whether it
        // lives decides, so look first.
        LeaderPod::Unknown => {
            return Decision::Wait {
                why: Waiting::LeaderPodUnknown { holder },
                recheck_at: None,
            };
        }
        LeaderPod::Present(pod) if pod.uid == fate.owner.uid && pod.is_terminal() => terminated(pod),
        LeaderPod::Present(pod) if pod.uid == fate.owner.uid && pod.deleting => {
            return Decision::Wait {
                why: Waiting::LeaderTerminating { holder },
                recheck_at: None,
            };
        }
        // A live leader whose lock was deleted under it (an admin, a prune, a cleanup script):
        // it learns so from its lock watch, but its work stops only later (COMMAND's grace, the
        // user's code noticing the loss). Wait for its own word, or for its heartbeat to lapse.
        LeaderPod::Present(pod) if pod.uid == fate.owner.uid => return deleted_under_leader(i, fate, holder),
        _ => "is gone".to_string(),
    };
    let vanished = !matches!(i.leader_pod, LeaderPod::Present(p) if p.uid == fate.owner.uid);
    match proof(i, Some(fate), vanished) {
        Ok(_) => Decision::Create,
        Err(recheck_at) => may_run(holder, &how, recheck_at),
    }
}

/// With no lock, and the last owner's Pod alive: its lock was deleted under it. Nothing of its
/// end proves its work stopped, so create only on [`Proof::LivenessLapsed`] (its lock carried a
/// heartbeat: the leader stops its work by its last heartbeat's send plus its liveness);
/// otherwise wait for its word ([`Proof::Released`]: once its work stopped, it creates its lock
/// again marked released, which [`decide`] takes over) or for its Pod to end with a proof.
/// A leader that never says so (an older kube-leader, operator-sdk's `leader.Become`, which
/// never notices the deletion) is never assumed stopped: it may still be running its work.
fn deleted_under_leader(i: &Inputs<'_>, fate: &Fate, holder: String) -> Decision {
    match fate.liveness_deadline() {
        Some(lapsed) if i.now >= lapsed => Decision::Create,
        lapsed => Decision::Wait {
            why: Waiting::LockDeletedUnderLeader { holder },
            recheck_at: lapsed,
        },
    }
}

/// With no lock (and a [`Decision::Create`]): the last leader's Pod if it is dead and the policy
/// deletes it. Its lock may be gone before this candidate saw the release mark, which would
/// otherwise have carried the deletion ([`Decision::DeleteLock`]).
pub(crate) fn dead_pod_to_delete(i: &Inputs<'_>) -> Option<PodRef> {
    let fate = i.fate.filter(|_| i.lock.is_none())?;
    match i.leader_pod {
        LeaderPod::Present(pod) if pod.uid == fate.owner.uid && pod.is_terminal() && deletes_pod(i, pod) => {
            Some(fate.owner.clone())
        }
        _ => None,
    }
}
