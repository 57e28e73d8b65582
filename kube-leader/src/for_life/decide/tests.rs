//! Unit tests of `decide`.

use super::*;

fn me() -> PodRef {
    PodRef {
        name: "me".into(),
        uid: "me-1".into(),
    }
}

fn leader() -> PodRef {
    PodRef {
        name: "leader".into(),
        uid: "leader-1".into(),
    }
}

fn lock(owner: Result<PodRef, Malformed>) -> LockRecord {
    LockRecord {
        uid: "lock-1".into(),
        resource_version: Some("10".into()),
        owner,
        fencing_token: Some(9),
        acquired_at: None,
        deleting: false,
        released: false,
        preferred: None,
        heartbeat: Ok(None),
    }
}

fn pod(uid: &str, phase: &str, reason: Option<&str>) -> LeaderPod {
    LeaderPod::Present(PodView {
        uid: uid.into(),
        phase: Some(phase.into()),
        reason: reason.map(Into::into),
        deleting: false,
        graceful_deletion: false,
        node_name: Some("node-a".into()),
        grace: GRACE,
        phase_by_kubelet: false,
        disruption_target: None,
    })
}

/// The leader Pod's grace in these tests.
const GRACE: Duration = Duration::from_secs(10);
/// When the grace proof holds for an end first seen at `t`.
fn proven_at(t: Instant) -> Instant {
    t + GRACE + KILL_MARGIN
}

/// The seed's policy, on a server whose kubelets' terminal phase proves nothing (1.20).
const SEED: Policy = Policy {
    dead_leader_pod: DeadLeaderPod::DeleteEvicted,
    not_ready_takeover: None,
    kubelet_terminal_proof: false,
};

/// The seed's policy on a 1.27 or later server.
const CURRENT: Policy = Policy {
    kubelet_terminal_proof: true,
    ..SEED
};

/// A terminal leader Pod whose phase its kubelet wrote.
fn by_kubelet(phase: &str, reason: Option<&str>) -> LeaderPod {
    let LeaderPod::Present(mut v) = pod("leader-1", phase, reason) else {
        unreachable!()
    };
    v.phase_by_kubelet = true;
    LeaderPod::Present(v)
}

fn run(lock: Option<&LockRecord>, leader_pod: &LeaderPod, policy: Policy) -> Decision {
    let now = Instant::now();
    decide(Inputs {
        lock,
        leader_pod,
        node_not_ready_since: None,
        fate: None,
        me: &me(),
        now,
        policy,
    })
}

/// Decides at `now` with what was seen of the owner's end (`fate` observed `leader_pod`, as the
/// campaign does before every decision).
fn run_at(
    lock: Option<&LockRecord>,
    leader_pod: &LeaderPod,
    fate: &mut Fate,
    policy: Policy,
    now: Instant,
) -> Decision {
    fate.observe(leader_pod, now);
    decide(Inputs {
        lock,
        leader_pod,
        node_not_ready_since: None,
        fate: Some(fate),
        me: &me(),
        now,
        policy,
    })
}

/// The leader's fate, seen running (with its grace) before it ended.
fn seen_running() -> Fate {
    let mut f = Fate::new(leader());
    f.observe(&pod("leader-1", "Running", None), Instant::now());
    f
}

fn proof(d: &Decision) -> Option<Proof> {
    match d {
        Decision::DeleteLock { proof, .. } => Some(*proof),
        _ => None,
    }
}

fn may_run(d: &Decision) -> Option<Instant> {
    match d {
        Decision::Wait {
            why: Waiting::LeaderMayRun { .. },
            recheck_at,
        } => *recheck_at,
        _ => None,
    }
}

fn deletes(d: &Decision) -> Option<(&Stale, &Option<PodRef>)> {
    match d {
        Decision::DeleteLock {
            lock_uid,
            why,
            delete_pod,
            ..
        } => {
            assert_eq!(lock_uid, "lock-1", "the UID precondition is the lock's");
            Some((why, delete_pod))
        }
        _ => None,
    }
}

#[test]
fn no_lock_creates() {
    assert_eq!(run(None, &LeaderPod::Unknown, SEED), Decision::Create);
}

#[test]
fn own_lock_by_uid_continues() {
    assert_eq!(
        run(Some(&lock(Ok(me()))), &LeaderPod::Unknown, SEED),
        Decision::Continue
    );
}

/// Issue 43's model checker: a process that crashed between its release's mark and deletion,
/// restarted, found its own lock marked released and continued on it, while a waiting
/// candidate took the lock over on the mark at once (two worked). The mark is the former
/// process's word that its work stopped: the lock is taken over like any released one.
#[test]
fn own_lock_marked_released_is_taken_over_not_continued() {
    let mut l = lock(Ok(me()));
    l.released = true;
    match run(Some(&l), &LeaderPod::Unknown, SEED) {
        Decision::DeleteLock {
            why: Stale::Released { .. },
            proof: Proof::Released,
            delete_pod: None,
            ..
        } => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn same_name_other_uid_is_not_mine_and_is_stale_once_its_grace_has_passed() {
    let former = PodRef {
        name: "me".into(),
        uid: "me-0".into(),
    };
    let l = lock(Ok(former.clone()));
    let mut fate = Fate::new(former);
    // The campaign observes a former Pod of this name as gone: it was never watched, so its
    // graceful deletion was not seen either, and its grace is the API server's default.
    let t0 = Instant::now();
    let d = run_at(Some(&l), &LeaderPod::Absent, &mut fate, SEED, t0);
    let until = t0 + DEFAULT_GRACE + KILL_MARGIN;
    assert_eq!(may_run(&d), Some(until), "{d:?}");
    let d = run_at(Some(&l), &LeaderPod::Absent, &mut fate, SEED, until);
    let (why, delete_pod) = deletes(&d).expect("stale");
    assert_eq!(why, &Stale::FormerPodOfMine { uid: "me-0".into() });
    assert_eq!(delete_pod, &None, "never delete a Pod of my own name");
    assert_eq!(
        proof(&d),
        Some(Proof::GraceElapsed {
            waited: DEFAULT_GRACE + KILL_MARGIN
        })
    );
}

#[test]
fn live_leader_waits() {
    for phase in ["Pending", "Running", "Unknown"] {
        let d = run(Some(&lock(Ok(leader()))), &pod("leader-1", phase, None), SEED);
        assert_eq!(
            d,
            Decision::Wait {
                why: Waiting::Leader {
                    holder: "leader".into()
                },
                recheck_at: None
            }
        );
    }
    let d = run(Some(&lock(Ok(leader()))), &LeaderPod::Unknown, SEED);
    assert!(matches!(
        d,
        Decision::Wait {
            why: Waiting::LeaderPodUnknown { .. },
            ..
        }
    ));
}

#[test]
fn malformed_locks_are_never_taken() {
    for m in [
        Malformed::NoOwner,
        Malformed::ManyOwners { count: 2 },
        Malformed::NotAPod {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "x".into(),
        },
    ] {
        for pod in [
            LeaderPod::Unknown,
            LeaderPod::Absent,
            pod("x", "Failed", Some("Evicted")),
        ] {
            let d = run(Some(&lock(Err(m.clone()))), &pod, SEED);
            assert_eq!(
                d,
                Decision::Wait {
                    why: Waiting::Malformed(m.clone()),
                    recheck_at: None
                }
            );
        }
    }
}

#[test]
fn a_lock_being_deleted_is_waited_for() {
    let mut l = lock(Ok(leader()));
    l.deleting = true;
    assert!(matches!(
        run(Some(&l), &LeaderPod::Absent, SEED),
        Decision::Wait {
            why: Waiting::LockTerminating,
            ..
        }
    ));
}

#[test]
fn not_ready_node_is_never_taken_over_by_default() {
    let l = lock(Ok(leader()));
    let now = Instant::now();
    let since = now.checked_sub(Duration::from_secs(3600)).unwrap_or(now);
    let d = decide(Inputs {
        lock: Some(&l),
        leader_pod: &pod("leader-1", "Running", None),
        node_not_ready_since: Some(since),
        fate: None,
        me: &me(),
        now,
        policy: SEED,
    });
    assert!(
        matches!(
            d,
            Decision::Wait {
                why: Waiting::Leader { .. },
                ..
            }
        ),
        "{d:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn not_ready_takeover_after_the_grace_by_the_local_clock() {
    let l = lock(Ok(leader()));
    let grace = Duration::from_secs(30);
    let policy = Policy {
        not_ready_takeover: Some(grace),
        ..SEED
    };
    let since = Instant::now();
    let at = |now| {
        decide(Inputs {
            lock: Some(&l),
            leader_pod: &pod("leader-1", "Running", None),
            node_not_ready_since: Some(since),
            fate: None,
            me: &me(),
            now,
            policy,
        })
    };
    tokio::time::advance(Duration::from_secs(29)).await;
    assert_eq!(
        at(Instant::now()),
        Decision::Wait {
            why: Waiting::LeaderNodeNotReady {
                holder: "leader".into(),
                node: "node-a".into()
            },
            recheck_at: Some(since + grace),
        }
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    let d = at(Instant::now());
    let (why, delete_pod) = deletes(&d).unwrap();
    assert_eq!(
        why,
        &Stale::LeaderNodeNotReady {
            holder: "leader".into(),
            node: "node-a".into(),
            for_: grace
        }
    );
    assert_eq!(delete_pod, &None);
    // Seen Ready again: the clock was reset by the caller.
    let d = decide(Inputs {
        lock: Some(&l),
        leader_pod: &pod("leader-1", "Running", None),
        node_not_ready_since: None,
        fate: None,
        me: &me(),
        now: Instant::now(),
        policy,
    });
    assert!(matches!(
        d,
        Decision::Wait {
            why: Waiting::Leader { .. },
            ..
        }
    ));
}

#[test]
fn messages() {
    let s = Stale::LeaderPodTerminated {
        holder: "p".into(),
        phase: "Failed".into(),
        reason: Some("Evicted".into()),
    };
    assert_eq!(
        s.to_string(),
        "the leader Pod p has terminated (phase Failed, reason Evicted)"
    );
    let w = Waiting::Malformed(Malformed::ManyOwners { count: 2 });
    assert_eq!(
        w.to_string(),
        "the lock has 2 owner references (it must have exactly one, a Pod); waiting, never taking it over"
    );
}

mod liveness;
mod proof;

#[test]
fn a_release_that_prefers_another_candidate_is_deferred_briefly_and_a_crash_never() {
    let t0 = Instant::now();
    let wait = Duration::from_secs(2);
    let mut released = lock(Ok(leader()));
    released.released = true;
    let mut fate = Fate::new(leader());
    fate.released = true;
    fate.preferred = Some(("young".into(), t0));
    let d = run_at(
        Some(&released),
        &pod("leader-1", "Running", None),
        &mut fate,
        SEED,
        t0,
    );
    assert!(
        matches!(
            d,
            Decision::DeleteLock {
                why: Stale::Released { .. },
                ..
            }
        ),
        "{d:?}"
    );
    let deferred = defer_to_preferred(d.clone(), Some(&fate), &me(), t0, wait);
    assert!(
        matches!(deferred, Decision::Wait { why: Waiting::Successor { .. }, recheck_at: Some(at) } if at == t0 + wait),
        "{deferred:?}"
    );
    // The preferred candidate goes ahead at once; the others after the wait.
    let young = PodRef {
        name: "young".into(),
        uid: "young-1".into(),
    };
    assert_eq!(defer_to_preferred(d.clone(), Some(&fate), &young, t0, wait), d);
    assert_eq!(
        defer_to_preferred(d.clone(), Some(&fate), &me(), t0 + wait, wait),
        d
    );
    // With the lock gone after the release: the same.
    let create = defer_to_preferred(Decision::Create, Some(&fate), &me(), t0, wait);
    assert!(
        matches!(
            create,
            Decision::Wait {
                why: Waiting::Successor { .. },
                ..
            }
        ),
        "{create:?}"
    );
    // A lock gone without a release (the Pod deleted with it, a crash): created at once.
    let mut crashed = Fate::new(leader());
    crashed.preferred = None;
    assert_eq!(
        defer_to_preferred(Decision::Create, Some(&crashed), &me(), t0, wait),
        Decision::Create
    );
    assert_eq!(
        defer_to_preferred(Decision::Create, None, &me(), t0, wait),
        Decision::Create
    );
}
