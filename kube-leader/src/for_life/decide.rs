//! The decision of a waiting candidate, as a pure function of what it has observed.

use std::{fmt, time::Duration};

use tokio::time::Instant;

use super::{
    config::DeadLeaderPod,
    record::{LeaderPod, LockRecord, Malformed, PodRef, PodView, DEFAULT_GRACE},
};

mod defer;
mod fate;
mod without_lock;

pub(crate) use defer::defer_to_preferred;
pub(crate) use fate::{track_fate, Fate};
pub(crate) use without_lock::dead_pod_to_delete;
use without_lock::decide_without_lock;

/// The kubelet's shortest grace period when it stops a container without an override
/// (`minimumGracePeriodInSeconds`, pkg/kubelet/kuberuntime/kuberuntime_manager.go in 1.20).
pub(crate) const KUBELET_MIN_GRACE: Duration = Duration::from_secs(2);

/// Added to a leader Pod's grace before its containers are taken to be gone by time alone: the
/// kubelet starts the kill in the same step as it writes the terminal status (its status write
/// reaches the API server after the kill began), and the runtime's SIGKILL at the end of the
/// grace takes milliseconds; this leaves room for a loaded node.
pub(crate) const KILL_MARGIN: Duration = Duration::from_secs(2);

/// The options that shape a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Policy {
    pub(crate) dead_leader_pod: DeadLeaderPod,
    /// `None`: never take over from a leader on a NotReady Node.
    pub(crate) not_ready_takeover: Option<Duration>,
    /// A terminal phase the kubelet wrote proves that the Pod's containers have stopped
    /// ([`Proof::KubeletTerminal`]): the API server is of a release whose kubelets, by the
    /// version skew policy, all hold a Pod's terminal phase back until no container can run
    /// (see [`crate::for_life::kubelet`]). `false` on older servers, or when the version could
    /// not be read: the other proofs only.
    pub(crate) kubelet_terminal_proof: bool,
}

/// Everything a waiting candidate decides on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Inputs<'a> {
    /// The lock; `None`: it does not exist.
    pub(crate) lock: Option<&'a LockRecord>,
    /// The Pod named by the lock's owner reference (`Unknown` if the lock has no Pod owner).
    pub(crate) leader_pod: &'a LeaderPod,
    /// Since when (by this candidate's clock) the leader Pod's Node has been seen not `Ready`;
    /// `None` if it was seen `Ready` or is not being checked.
    pub(crate) node_not_ready_since: Option<Instant>,
    /// What this candidate saw of the end of the lock's owner (or, with no lock, of the last
    /// owner it saw): `None` if it saw none.
    pub(crate) fate: Option<&'a Fate>,
    /// This candidate.
    pub(crate) me: &'a PodRef,
    pub(crate) now: Instant,
    pub(crate) policy: Policy,
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// There is no lock: create it.
    Create,
    /// The lock is this Pod's own (same name and UID): a restart; lead.
    Continue,
    /// The lock is stale: delete it, on condition that its UID is still `lock_uid`, and delete
    /// the dead leader Pod too if `delete_pod` says so.
    DeleteLock {
        lock_uid: String,
        why: Stale,
        proof: Proof,
        delete_pod: Option<PodRef>,
    },
    /// Somebody else leads, or the lock cannot be judged: wait for a change. If `recheck_at`
    /// is set, decide again then even if nothing changed.
    Wait {
        why: Waiting,
        recheck_at: Option<Instant>,
    },
}

/// Why a lock is stale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Stale {
    /// The owner has this Pod's name but another UID: a former Pod of the same name, which no
    /// longer exists since this one does.
    FormerPodOfMine { uid: String },
    /// No Pod of the owner's name exists.
    LeaderPodGone { holder: String },
    /// A Pod of the owner's name exists, with another UID: the owner was deleted.
    LeaderPodReplaced { holder: String },
    /// The owner Pod is in a terminal phase and runs nothing.
    LeaderPodTerminated {
        holder: String,
        phase: String,
        reason: Option<String>,
    },
    /// The leader marked the lock released after its work stopped, and did not (yet) delete it.
    Released { holder: String },
    /// Opt-in policy: the owner Pod's Node has not been `Ready` for at least the grace.
    LeaderNodeNotReady {
        holder: String,
        node: String,
        for_: Duration,
    },
}

impl fmt::Display for Stale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stale::FormerPodOfMine { uid } => {
                write!(
                    f,
                    "the lock is owned by a former Pod of this name (uid {uid}), which is gone"
                )
            }
            Stale::LeaderPodGone { holder } => write!(f, "the leader Pod {holder} is gone"),
            Stale::LeaderPodReplaced { holder } => {
                write!(
                    f,
                    "the leader Pod {holder} was deleted (a Pod of that name with another UID exists)"
                )
            }
            Stale::LeaderPodTerminated {
                holder,
                phase,
                reason: Some(reason),
            } => {
                write!(
                    f,
                    "the leader Pod {holder} has terminated (phase {phase}, reason {reason})"
                )
            }
            Stale::LeaderPodTerminated {
                holder,
                phase,
                reason: None,
            } => {
                write!(f, "the leader Pod {holder} has terminated (phase {phase})")
            }
            Stale::Released { holder } => write!(f, "the leader Pod {holder} released the lock"),
            Stale::LeaderNodeNotReady { holder, node, for_ } => {
                write!(
                    f,
                    "the Node {node} of the leader Pod {holder} has not been Ready for {for_:?}"
                )
            }
        }
    }
}

/// What shows that nothing of a stale lock's term still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Proof {
    /// The leader's Pod is gone (or replaced) after its graceful deletion was seen: the kubelet
    /// deletes a Pod for good only once its containers have stopped.
    PodDeletionCompleted,
    /// The leader marked the lock released: its work had stopped. A leader whose lock was
    /// deleted under it (by anyone but itself, while its Pod lives) says the same once its work
    /// has stopped: it creates its lock again, owned by its Pod, already marked released (the
    /// keeper's `say_stopped`). Until then, or until one of the other proofs holds for its Pod
    /// or its heartbeat, a waiting candidate does not create a new lock
    /// ([`Waiting::LeaderMayRun`]).
    Released,
    /// The Pod's grace (plus [`KILL_MARGIN`]) has passed, by this candidate's clock, since it
    /// saw the Pod end (terminal, gone or replaced): the kubelet has killed its containers.
    GraceElapsed { waited: Duration },
    /// The lock's liveness heartbeat has not moved for its advertised liveness (plus
    /// [`KILL_MARGIN`]), by this candidate's clock since it last saw it move, and the Pod has
    /// ended: the leader's work, bounded by its own last heartbeat's send plus that liveness,
    /// has stopped.
    LivenessLapsed { waited: Duration },
    /// The kubelet wrote the leader Pod's terminal phase (it owns `status.phase`): a kubelet of
    /// 1.24 or later writes `Failed` or `Succeeded` only once none of the Pod's containers can
    /// be running (its status manager's `couldHaveRunningContainers` guard, kubernetes#108366),
    /// also for deleted Pods from 1.27 (kubernetes#115331). Only where
    /// [`Policy::kubelet_terminal_proof`] says the server's kubelets have that guard; a phase
    /// another writer set (the Pod garbage collector, a person) proves nothing.
    KubeletTerminal,
    /// No proof: the opt-in NotReady takeover, whose risk its documentation states.
    OptIn,
}

impl fmt::Display for Proof {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Proof::PodDeletionCompleted => f.write_str(
                "its Pod's graceful deletion completed, which the kubelet does after its containers stopped",
            ),
            Proof::Released => f.write_str("its leader marked it released after its work stopped"),
            Proof::GraceElapsed { waited } => {
                write!(
                    f,
                    "its Pod's grace period and the kill margin have passed ({waited:?})"
                )
            }
            Proof::LivenessLapsed { waited } => write!(
                f,
                "its leader's liveness heartbeat has not moved for its liveness and the kill margin ({waited:?})"
            ),
            Proof::KubeletTerminal => f.write_str(
                "its Pod's kubelet wrote a terminal phase, which it does only once none of the Pod's containers can run",
            ),
            Proof::OptIn => f.write_str("the opt-in NotReady takeover"),
        }
    }
}

/// Why a candidate waits. Compared to log each reason once, not on every event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Waiting {
    /// A live Pod leads.
    Leader { holder: String },
    /// The leader Pod has not been observed yet.
    LeaderPodUnknown { holder: String },
    /// The leader Pod is being deleted but still runs; its lock goes with it.
    LeaderTerminating { holder: String },
    /// The leader Pod has ended (`how`: terminal, gone, replaced), but nothing proves yet that
    /// its containers have stopped.
    LeaderMayRun { holder: String, how: String },
    /// The leader's Node is not `Ready`; the opt-in takeover waits for its grace.
    LeaderNodeNotReady { holder: String, node: String },
    /// The lock was deleted while its leader's Pod lives: its work may still run.
    LockDeletedUnderLeader { holder: String },
    /// The lock is being deleted.
    LockTerminating,
    /// The lock cannot be attributed to a leader Pod; never taken over.
    Malformed(Malformed),
    /// The leader stepped down naming another candidate as its successor: deferring to it.
    Successor { holder: String, preferred: String },
}

impl fmt::Display for Waiting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Waiting::Leader { holder } => write!(f, "{holder} leads"),
            Waiting::LeaderPodUnknown { holder } => write!(f, "{holder} leads; looking up its Pod"),
            Waiting::LeaderTerminating { holder } => {
                write!(f, "the leader Pod {holder} is terminating; its lock goes with it")
            }
            Waiting::LeaderNodeNotReady { holder, node } => {
                write!(
                    f,
                    "the Node {node} of the leader Pod {holder} is not Ready; waiting for the takeover grace"
                )
            }
            Waiting::LeaderMayRun { holder, how } => write!(
                f,
                "the leader Pod {holder} {how}, but its containers may still run; waiting until its \
                 leader releases the lock, its Pod's deletion completes, its liveness heartbeat lapses \
                 (if its lock has one), or its grace period has passed"
            ),
            Waiting::LockDeletedUnderLeader { holder } => write!(
                f,
                "the lock of {holder} was deleted while its Pod runs, and its work may still run; \
                 waiting until it says its work stopped (it creates its lock again marked released), \
                 its Pod ends, or its liveness heartbeat lapses (if its lock had one)"
            ),
            Waiting::LockTerminating => f.write_str("the lock is being deleted"),
            Waiting::Successor { holder, preferred } => write!(
                f,
                "the leader Pod {holder} stepped down naming {preferred} its successor; deferring to it briefly"
            ),
            Waiting::Malformed(m) => write!(f, "{m}; waiting, never taking it over"),
        }
    }
}

/// Decides what a waiting candidate does, given what it has observed.
///
/// A leader Pod that has ended (terminal, gone, replaced) makes its lock stale only with a
/// [`Proof`] that nothing of its term runs any more; until then the candidate waits
/// ([`Waiting::LeaderMayRun`], rechecking when the grace proof will hold).
pub(crate) fn decide(i: Inputs<'_>) -> Decision {
    let wait = |why| Decision::Wait {
        why,
        recheck_at: None,
    };
    let Some(lock) = i.lock else {
        return decide_without_lock(&i);
    };
    if lock.deleting {
        return wait(Waiting::LockTerminating);
    }
    let owner = match &lock.owner {
        Err(m) => return wait(Waiting::Malformed(m.clone())),
        Ok(owner) => owner,
    };
    // This Pod's own lock, unless a former process of this Pod marked it released: its word
    // that the term's work stopped, on which a waiting candidate takes the lock over at once
    // (a process that crashed between its release's mark and deletion, restarted). Such a lock
    // is taken over like any released one, not continued (issue 43's model checker).
    if owner == i.me && !lock.released {
        return Decision::Continue;
    }
    let holder = owner.name.clone();
    let fate = i.fate.filter(|f| &f.owner == owner);
    let stale = |why, proof| Decision::DeleteLock {
        lock_uid: lock.uid.clone(),
        why,
        proof,
        delete_pod: None,
    };
    let ended = |why: Stale, how: &str, vanished: bool| match proof(&i, fate, vanished) {
        Ok(proof) => stale(why, proof),
        Err(recheck_at) => may_run(holder.clone(), how, recheck_at),
    };
    if lock.released {
        return released(&i, lock, owner, holder);
    }
    if owner.name == i.me.name {
        // Pod names are unique in a namespace: the owner is a former Pod of this name, gone
        // by some deletion this candidate did not see.
        let why = Stale::FormerPodOfMine {
            uid: owner.uid.clone(),
        };
        return ended(why, "is gone (a former Pod of this name)", true);
    }
    let pod = match i.leader_pod {
        LeaderPod::Unknown => return wait(Waiting::LeaderPodUnknown { holder }),
        LeaderPod::Absent => {
            return ended(
                Stale::LeaderPodGone {
                    holder: holder.clone(),
                },
                "is gone",
                true,
            )
        }
        LeaderPod::Present(pod) if pod.uid != owner.uid => {
            let why = Stale::LeaderPodReplaced {
                holder: holder.clone(),
            };
            return ended(
                why,
                "was deleted (a Pod of that name with another UID exists)",
                true,
            );
        }
        LeaderPod::Present(pod) => pod,
    };
    decide_on_pod(&i, lock, owner, fate, pod, holder)
}

/// A lock its leader marked released: its own word that its work has stopped, so the lock
/// is stale; its dead Pod is cleaned up by policy.
fn released(i: &Inputs<'_>, lock: &LockRecord, owner: &PodRef, holder: String) -> Decision {
    let delete_pod = match i.leader_pod {
        LeaderPod::Present(pod) if pod.uid == owner.uid && pod.is_terminal() => {
            deletes_pod(i, pod).then(|| owner.clone())
        }
        _ => None,
    };
    Decision::DeleteLock {
        lock_uid: lock.uid.clone(),
        why: Stale::Released { holder },
        proof: Proof::Released,
        delete_pod,
    }
}

/// The rest of [`decide`], once the leader Pod is known to be the lock's owner: its phase, its
/// Node (opt-in) and its deletion decide.
fn decide_on_pod(
    i: &Inputs<'_>,
    lock: &LockRecord,
    owner: &PodRef,
    fate: Option<&Fate>,
    pod: &PodView,
    holder: String,
) -> Decision {
    let wait = |why| Decision::Wait {
        why,
        recheck_at: None,
    };
    if pod.is_terminal() {
        return terminal(i, lock, owner, fate, pod, holder);
    }
    // The Pod may be running: only the opt-in policy takes over, and only from a Pod on a Node
    // that has not been Ready for the whole grace (a terminating Pod on such a Node is stuck).
    if let (Some(grace), Some(since), Some(node)) = (
        i.policy.not_ready_takeover,
        i.node_not_ready_since,
        pod.node_name.as_ref(),
    ) {
        let for_ = i.now.saturating_duration_since(since);
        if for_ >= grace {
            return Decision::DeleteLock {
                lock_uid: lock.uid.clone(),
                why: Stale::LeaderNodeNotReady {
                    holder,
                    node: node.clone(),
                    for_,
                },
                proof: Proof::OptIn,
                delete_pod: None,
            };
        }
        return Decision::Wait {
            why: Waiting::LeaderNodeNotReady {
                holder,
                node: node.clone(),
            },
            recheck_at: Some(since + grace),
        };
    }
    if pod.deleting {
        return wait(Waiting::LeaderTerminating { holder });
    }
    wait(Waiting::Leader { holder })
}

/// A leader Pod in a terminal phase: stale with a proof that its containers have stopped (the
/// kubelet's own terminal phase where that is one, or the other proofs), else waited for.
fn terminal(
    i: &Inputs<'_>,
    lock: &LockRecord,
    owner: &PodRef,
    fate: Option<&Fate>,
    pod: &PodView,
    holder: String,
) -> Decision {
    let proven = if i.policy.kubelet_terminal_proof && pod.phase_by_kubelet {
        Ok(Proof::KubeletTerminal)
    } else {
        proof(i, fate, false)
    };
    match proven {
        Ok(proof) => Decision::DeleteLock {
            lock_uid: lock.uid.clone(),
            why: Stale::LeaderPodTerminated {
                holder,
                phase: pod.phase.clone().unwrap_or_default(),
                reason: pod.reason.clone(),
            },
            proof,
            delete_pod: deletes_pod(i, pod).then(|| owner.clone()),
        },
        Err(recheck_at) => {
            let why_not = if !i.policy.kubelet_terminal_proof {
                "; a terminal phase proves nothing on an API server older than 1.27"
            } else {
                "; its phase was not written by its kubelet"
            };
            may_run(holder, &format!("{}{why_not}", terminated(pod)), recheck_at)
        }
    }
}

/// The proof that an ended leader Pod (`vanished`: gone or replaced, rather than terminal)
/// runs nothing, or when the grace proof will hold.
///
/// What proves it: a Pod that vanished after its graceful deletion was seen (the kubelet
/// deletes a Pod for good only once its containers have stopped), or after a terminal phase of
/// the kubelet's own was seen where that is a proof ([`Proof::KubeletTerminal`]), its lock's liveness
/// heartbeat not moving for its liveness (plus [`KILL_MARGIN`]) since last seen moving (the
/// leader's work stops by its last heartbeat's send plus that liveness), or its grace period
/// (plus [`KILL_MARGIN`]) since its end was first seen. What does not: a terminal phase on an
/// older server (the 1.20 kubelet writes `Failed`/`Evicted` before it kills the containers), or
/// one that another writer set (the Pod garbage collector marks a Pod on a deleted Node `Failed`
/// while a partitioned kubelet may still run it), a missing, empty or
/// "terminated" `containerStatuses` list (the kubelet's TerminatePod marks every container
/// terminated without looking), a Pod that vanished without a graceful deletion seen (a force
/// deletion).
fn proof(i: &Inputs<'_>, fate: Option<&Fate>, vanished: bool) -> Result<Proof, Instant> {
    let Some(fate) = fate else {
        // Not tracked (only in unit tests of other rules): wait a default grace from now.
        return Err(i.now + DEFAULT_GRACE + KILL_MARGIN);
    };
    if vanished && fate.deletion_seen {
        return Ok(Proof::PodDeletionCompleted);
    }
    if i.policy.kubelet_terminal_proof && fate.kubelet_terminal_seen {
        return Ok(Proof::KubeletTerminal);
    }
    let (Some(since), Some(deadline)) = (fate.ended_since, fate.grace_deadline()) else {
        return Err(i.now + DEFAULT_GRACE + KILL_MARGIN);
    };
    if let (Some(h), Some(lapsed)) = (&fate.heartbeat, fate.liveness_deadline()) {
        if i.now >= lapsed {
            return Ok(Proof::LivenessLapsed {
                waited: i.now.saturating_duration_since(h.since),
            });
        }
    }
    if i.now >= deadline {
        return Ok(Proof::GraceElapsed {
            waited: i.now.saturating_duration_since(since),
        });
    }
    Err(fate.liveness_deadline().map_or(deadline, |l| l.min(deadline)))
}

/// Whether the policy deletes this dead leader Pod (never one already being deleted).
fn deletes_pod(i: &Inputs<'_>, pod: &PodView) -> bool {
    !pod.deleting
        && match i.policy.dead_leader_pod {
            DeadLeaderPod::Keep => false,
            DeadLeaderPod::DeleteEvicted => pod.is_evicted(),
            DeadLeaderPod::DeleteTerminal => true,
        }
}

fn terminated(pod: &PodView) -> String {
    let phase = pod.phase.as_deref().unwrap_or_default();
    match &pod.reason {
        Some(reason) => format!("has terminated (phase {phase}, reason {reason})"),
        None => format!("has terminated (phase {phase})"),
    }
}

fn may_run(holder: String, how: &str, recheck_at: Instant) -> Decision {
    Decision::Wait {
        why: Waiting::LeaderMayRun {
            holder,
            how: how.to_string(),
        },
        recheck_at: Some(recheck_at),
    }
}

#[cfg(test)]
mod tests;
