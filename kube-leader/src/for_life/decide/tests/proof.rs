//! Unit tests of `decide`: an ended leader Pod is taken over only with a proof that its
//! containers are gone.

use super::*;

#[test]
fn gone_or_replaced_after_a_graceful_deletion_was_seen_is_stale_at_once() {
    let l = lock(Ok(leader()));
    let LeaderPod::Present(mut deleting) = pod("leader-1", "Running", None) else {
        unreachable!()
    };
    deleting.deleting = true;
    deleting.graceful_deletion = true;
    for after in [LeaderPod::Absent, pod("leader-2", "Running", None)] {
        let mut fate = seen_running();
        let now = Instant::now();
        let d = run_at(
            Some(&l),
            &LeaderPod::Present(deleting.clone()),
            &mut fate,
            SEED,
            now,
        );
        assert!(
            matches!(
                d,
                Decision::Wait {
                    why: Waiting::LeaderTerminating { .. },
                    recheck_at: None
                }
            ),
            "a Pod being deleted still runs: {d:?}"
        );
        let d = run_at(Some(&l), &after, &mut fate, SEED, now);
        let (why, delete_pod) = deletes(&d).unwrap_or_else(|| panic!("{after:?}: {d:?}"));
        let want = match after {
            LeaderPod::Absent => Stale::LeaderPodGone {
                holder: "leader".into(),
            },
            _ => Stale::LeaderPodReplaced {
                holder: "leader".into(),
            },
        };
        assert_eq!(why, &want);
        assert_eq!(delete_pod, &None, "the new Pod of that name is not touched");
        assert_eq!(proof(&d), Some(Proof::PodDeletionCompleted));
    }
}

#[test]
fn a_force_deletion_seen_deleting_for_a_moment_is_no_proof() {
    let l = lock(Ok(leader()));
    let LeaderPod::Present(mut v) = pod("leader-1", "Running", None) else {
        unreachable!()
    };
    v.deleting = true; // grace 0: not graceful
    let mut fate = seen_running();
    let t0 = Instant::now();
    run_at(Some(&l), &LeaderPod::Present(v), &mut fate, SEED, t0);
    let d = run_at(Some(&l), &LeaderPod::Absent, &mut fate, SEED, t0);
    assert_eq!(may_run(&d), Some(proven_at(t0)), "{d:?}");
}

#[test]
fn gone_or_replaced_without_a_graceful_deletion_seen_waits_for_the_grace() {
    // A force deletion: the Pod vanishes at once while the kubelet has yet to kill its
    // containers. Its grace counts from when this candidate saw it gone.
    let l = lock(Ok(leader()));
    for after in [LeaderPod::Absent, pod("leader-2", "Running", None)] {
        let mut fate = seen_running();
        let t0 = Instant::now();
        let d = run_at(Some(&l), &after, &mut fate, SEED, t0);
        assert_eq!(may_run(&d), Some(proven_at(t0)), "{after:?}: {d:?}");
        let just_before = proven_at(t0) - Duration::from_millis(1);
        let d = run_at(Some(&l), &after, &mut fate, SEED, just_before);
        assert_eq!(may_run(&d), Some(proven_at(t0)), "{d:?}");
        let d = run_at(Some(&l), &after, &mut fate, SEED, proven_at(t0));
        assert!(deletes(&d).is_some(), "{d:?}");
        assert_eq!(deletes(&d).unwrap().1, &None);
        assert_eq!(
            proof(&d),
            Some(Proof::GraceElapsed {
                waited: GRACE + KILL_MARGIN
            })
        );
    }
    // Never seen at all (a candidate that started after the Pod was gone): the default grace.
    let mut fate = Fate::new(leader());
    let t0 = Instant::now();
    let d = run_at(Some(&l), &LeaderPod::Absent, &mut fate, SEED, t0);
    assert_eq!(may_run(&d), Some(t0 + DEFAULT_GRACE + KILL_MARGIN));
}

#[test]
fn an_evicted_leader_is_waited_for_until_its_grace_has_passed_then_its_pod_deleted() {
    // The 1.20 kubelet writes Failed/Evicted and only then kills the containers.
    let l = lock(Ok(leader()));
    let evicted = pod("leader-1", "Failed", Some("Evicted"));
    let mut fate = seen_running();
    let t0 = Instant::now();
    let d = run_at(Some(&l), &evicted, &mut fate, SEED, t0);
    assert_eq!(
        d,
        Decision::Wait {
            why: Waiting::LeaderMayRun {
                holder: "leader".into(),
                how: "has terminated (phase Failed, reason Evicted); a terminal phase proves \
                      nothing on an API server older than 1.27"
                    .into(),
            },
            recheck_at: Some(proven_at(t0)),
        }
    );
    // Seen again later (another event): the grace still counts from the first sight.
    let later = t0 + Duration::from_secs(5);
    assert_eq!(
        may_run(&run_at(Some(&l), &evicted, &mut fate, SEED, later)),
        Some(proven_at(t0))
    );
    let d = run_at(Some(&l), &evicted, &mut fate, SEED, proven_at(t0));
    let (why, delete_pod) = deletes(&d).expect("stale once the grace has passed");
    assert!(matches!(why, Stale::LeaderPodTerminated { .. }), "{why:?}");
    assert_eq!(
        delete_pod.as_ref(),
        Some(&leader()),
        "DeleteEvicted, after the proof"
    );
}

#[test]
fn a_grace_below_the_kubelets_minimum_counts_as_the_minimum() {
    let l = lock(Ok(leader()));
    let LeaderPod::Present(mut v) = pod("leader-1", "Failed", Some("Evicted")) else {
        unreachable!()
    };
    v.grace = Duration::ZERO;
    let mut fate = Fate::new(leader());
    let t0 = Instant::now();
    let d = run_at(Some(&l), &LeaderPod::Present(v), &mut fate, SEED, t0);
    assert_eq!(may_run(&d), Some(t0 + KUBELET_MIN_GRACE + KILL_MARGIN));
}

#[test]
fn missing_empty_or_terminated_container_statuses_prove_nothing() {
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodStatus,
    };
    // What the kubelet writes on eviction (no containerStatuses), an empty list, and what its
    // TerminatePod writes for a deleted terminal Pod (every container "terminated", whether or
    // not it still runs).
    let terminated = ContainerStatus {
        name: "main".into(),
        state: Some(ContainerState {
            terminated: Some(ContainerStateTerminated::default()),
            ..ContainerState::default()
        }),
        ..ContainerStatus::default()
    };
    for statuses in [None, Some(vec![]), Some(vec![terminated])] {
        let mut p = Pod::default();
        p.metadata.uid = Some("leader-1".into());
        p.status = Some(PodStatus {
            phase: Some("Failed".into()),
            reason: Some("Evicted".into()),
            container_statuses: statuses.clone(),
            ..PodStatus::default()
        });
        let view = LeaderPod::Present(PodView::from_pod(&p));
        let mut fate = seen_running();
        let d = run_at(Some(&lock(Ok(leader()))), &view, &mut fate, SEED, Instant::now());
        assert!(may_run(&d).is_some(), "{statuses:?}: {d:?}");
    }
}

#[test]
fn a_released_lock_is_stale_at_once_and_the_evicted_pod_deleted() {
    let mut l = lock(Ok(leader()));
    l.released = true;
    for (leader_pod, deleted) in [
        (pod("leader-1", "Failed", Some("Evicted")), true),
        (pod("leader-1", "Running", None), false),
        (LeaderPod::Absent, false),
        (LeaderPod::Unknown, false),
    ] {
        let mut fate = seen_running();
        fate.released = true;
        let d = run_at(Some(&l), &leader_pod, &mut fate, SEED, Instant::now());
        assert_eq!(proof(&d), Some(Proof::Released), "{leader_pod:?}: {d:?}");
        assert_eq!(deletes(&d).unwrap().1.is_some(), deleted, "{leader_pod:?}");
    }
}

#[test]
fn with_no_lock_an_unproven_end_of_the_last_leader_is_waited_for() {
    // A force-deleted leader Pod: the garbage collector deletes its lock at once.
    let mut fate = seen_running();
    let t0 = Instant::now();
    let d = run_at(None, &LeaderPod::Absent, &mut fate, SEED, t0);
    assert_eq!(may_run(&d), Some(proven_at(t0)), "{d:?}");
    assert_eq!(
        run_at(None, &LeaderPod::Absent, &mut fate, SEED, proven_at(t0)),
        Decision::Create
    );
    // Evicted, then its lock deleted by someone else than its leader.
    let mut fate = seen_running();
    let evicted = pod("leader-1", "Failed", Some("Evicted"));
    let d = run_at(None, &evicted, &mut fate, SEED, t0);
    assert_eq!(may_run(&d), Some(proven_at(t0)), "{d:?}");
}

#[test]
fn with_no_lock_a_proven_last_leader_lets_the_lock_be_created() {
    let t0 = Instant::now();
    // Released by its leader (the lock was marked before it was deleted).
    let mut fate = seen_running();
    fate.released = true;
    let evicted = pod("leader-1", "Failed", Some("Evicted"));
    assert_eq!(run_at(None, &evicted, &mut fate, SEED, t0), Decision::Create);
    // Gone after a graceful deletion was seen.
    let mut fate = seen_running();
    fate.deletion_seen = true;
    assert_eq!(
        run_at(None, &LeaderPod::Absent, &mut fate, SEED, t0),
        Decision::Create
    );
    // No leader seen at all.
    assert_eq!(run(None, &LeaderPod::Unknown, SEED), Decision::Create);
}

#[test]
fn with_no_lock_a_last_leader_being_deleted_is_waited_for() {
    // Its lock gone (an admin, or foreground deletion) while the Pod still runs: wait for its
    // deletion to complete.
    let LeaderPod::Present(mut v) = pod("leader-1", "Running", None) else {
        unreachable!()
    };
    v.deleting = true;
    v.graceful_deletion = true;
    let mut fate = seen_running();
    let d = run_at(None, &LeaderPod::Present(v), &mut fate, SEED, Instant::now());
    assert!(
        matches!(
            d,
            Decision::Wait {
                why: Waiting::LeaderTerminating { .. },
                recheck_at: None
            }
        ),
        "{d:?}"
    );
}

#[test]
fn the_fate_keeps_the_first_end_and_every_deletion_seen() {
    let mut fate = Fate::new(leader());
    let t0 = Instant::now();
    fate.observe(&LeaderPod::Unknown, t0);
    assert_eq!(fate, Fate::new(leader()));
    fate.observe(&pod("leader-1", "Running", None), t0);
    assert_eq!((fate.grace, fate.ended_since), (Some(GRACE), None));
    let LeaderPod::Present(mut v) = pod("leader-1", "Failed", Some("Evicted")) else {
        unreachable!()
    };
    v.deleting = true;
    v.graceful_deletion = true;
    fate.observe(&LeaderPod::Present(v), t0);
    fate.observe(&LeaderPod::Absent, t0 + Duration::from_secs(3));
    assert!(fate.deletion_seen);
    assert_eq!(fate.ended_since, Some(t0));
    assert_eq!(fate.grace_deadline(), Some(proven_at(t0)));
    // Another Pod of that name is the owner's end too.
    let mut fate = Fate::new(leader());
    fate.observe(&pod("leader-2", "Running", None), t0);
    assert_eq!(fate.ended_since, Some(t0));
}

#[test]
fn with_no_lock_a_dead_last_leader_pod_is_deleted_by_policy() {
    let evicted = pod("leader-1", "Failed", Some("Evicted"));
    let mut fate = seen_running();
    fate.released = true;
    let now = Instant::now();
    fate.observe(&evicted, now);
    let me = me();
    let dead = |lock: Option<&LockRecord>, leader_pod: &LeaderPod, policy: Policy| {
        dead_pod_to_delete(&Inputs {
            lock,
            leader_pod,
            node_not_ready_since: None,
            fate: Some(&fate),
            me: &me,
            now,
            policy,
        })
    };
    assert_eq!(dead(None, &evicted, SEED), Some(leader()));
    let keep = Policy {
        dead_leader_pod: DeadLeaderPod::Keep,
        ..SEED
    };
    assert_eq!(dead(None, &evicted, keep), None);
    assert_eq!(dead(None, &pod("leader-1", "Running", None), SEED), None);
    let l = lock(Ok(leader()));
    assert_eq!(dead(Some(&l), &evicted, SEED), None, "DeleteLock carries it");
}

#[test]
fn a_lock_deleted_under_a_live_leader_is_not_taken_without_its_word() {
    // An admin (a prune, a cleanup script) deleted the lock while its leader's Pod runs: its work
    // may still run, and without a heartbeat nothing bounds it. Wait, however long, with no
    // recheck: only news (its released lock, its Pod's end) moves the decision.
    let mut fate = seen_running();
    let t0 = Instant::now();
    let running = pod("leader-1", "Running", None);
    for later in [0, 60, 3600] {
        let d = run_at(None, &running, &mut fate, SEED, t0 + Duration::from_secs(later));
        assert_eq!(
            d,
            Decision::Wait {
                why: Waiting::LockDeletedUnderLeader {
                    holder: "leader".into()
                },
                recheck_at: None,
            },
            "{later} s after"
        );
    }
    // Its Pod not seen yet when the lock went: look before deciding.
    let mut unseen = seen_running();
    let d = run_at(None, &LeaderPod::Unknown, &mut unseen, SEED, t0);
    assert!(
        matches!(
            d,
            Decision::Wait {
                why: Waiting::LeaderPodUnknown { .. },
                ..
            }
        ),
        "{d:?}"
    );
    // Its word: once its work stopped it creates its lock again, marked released.
    let mut tombstone = lock(Ok(leader()));
    tombstone.uid = "lock-2".into();
    tombstone.released = true;
    let d = run_at(Some(&tombstone), &running, &mut fate, SEED, t0);
    assert!(
        matches!(
            d,
            Decision::DeleteLock {
                proof: Proof::Released,
                ..
            }
        ),
        "{d:?}"
    );
    // Its Pod deleted gracefully, then gone: the kubelet stopped its containers.
    let mut fate = seen_running();
    let mut deleting = running.clone();
    if let LeaderPod::Present(p) = &mut deleting {
        p.deleting = true;
        p.graceful_deletion = true;
    }
    let d = run_at(None, &deleting, &mut fate, SEED, t0);
    assert!(matches!(d, Decision::Wait { .. }), "{d:?}");
    assert_eq!(
        run_at(None, &LeaderPod::Absent, &mut fate, SEED, t0),
        Decision::Create
    );
}

#[test]
fn the_wait_for_a_live_leader_says_why() {
    let w = Waiting::LockDeletedUnderLeader {
        holder: "leader".into(),
    };
    let text = w.to_string();
    assert!(text.contains("leader") && text.contains("released"), "{text}");
}

#[test]
fn a_terminal_phase_its_kubelet_wrote_is_proof_at_once_on_a_current_server() {
    let l = lock(Ok(leader()));
    for (phase, reason) in [("Failed", Some("Evicted")), ("Succeeded", None), ("Failed", None)] {
        let mut fate = seen_running();
        let d = run_at(
            Some(&l),
            &by_kubelet(phase, reason),
            &mut fate,
            CURRENT,
            Instant::now(),
        );
        assert_eq!(
            proof(&d),
            Some(Proof::KubeletTerminal),
            "{phase} {reason:?}: {d:?}"
        );
        let (why, _) = deletes(&d).unwrap();
        assert!(matches!(why, Stale::LeaderPodTerminated { .. }), "{why:?}");
    }
}

#[test]
fn a_terminal_phase_is_no_proof_on_an_older_server_or_from_another_writer() {
    let l = lock(Ok(leader()));
    let t0 = Instant::now();
    // 1.20's kubelet wrote Failed/Evicted before it killed the containers.
    let mut fate = seen_running();
    let d = run_at(
        Some(&l),
        &by_kubelet("Failed", Some("Evicted")),
        &mut fate,
        SEED,
        t0,
    );
    assert_eq!(may_run(&d), Some(proven_at(t0)), "{d:?}");
    let Decision::Wait {
        why: Waiting::LeaderMayRun { how, .. },
        ..
    } = &d
    else {
        unreachable!()
    };
    assert!(how.contains("older than 1.27"), "{how}");
    // A phase the Pod garbage collector or a person set: the containers may run on a
    // partitioned Node.
    let mut fate = seen_running();
    let d = run_at(Some(&l), &pod("leader-1", "Failed", None), &mut fate, CURRENT, t0);
    assert_eq!(may_run(&d), Some(proven_at(t0)), "{d:?}");
    assert!(d_how(&d).contains("not written by its kubelet"), "{d:?}");
    // The grace proof still ends the wait.
    let d = run_at(
        Some(&l),
        &pod("leader-1", "Failed", None),
        &mut fate,
        CURRENT,
        proven_at(t0),
    );
    assert!(matches!(proof(&d), Some(Proof::GraceElapsed { .. })), "{d:?}");
}

fn d_how(d: &Decision) -> String {
    match d {
        Decision::Wait {
            why: Waiting::LeaderMayRun { how, .. },
            ..
        } => how.clone(),
        _ => String::new(),
    }
}

#[test]
fn a_pod_gone_after_its_kubelet_wrote_a_terminal_phase_needs_no_graceful_deletion() {
    let l = lock(Ok(leader()));
    let t0 = Instant::now();
    let mut fate = seen_running();
    // Terminal (the kubelet's word), then force-deleted (the Pod garbage collector).
    run_at(
        Some(&l),
        &by_kubelet("Failed", Some("Evicted")),
        &mut fate,
        CURRENT,
        t0,
    );
    let d = run_at(Some(&l), &LeaderPod::Absent, &mut fate, CURRENT, t0);
    assert_eq!(proof(&d), Some(Proof::KubeletTerminal), "{d:?}");
    // On an older server the same sequence waits for the grace.
    let mut fate = seen_running();
    run_at(
        Some(&l),
        &by_kubelet("Failed", Some("Evicted")),
        &mut fate,
        SEED,
        t0,
    );
    let d = run_at(Some(&l), &LeaderPod::Absent, &mut fate, SEED, t0);
    assert_eq!(may_run(&d), Some(proven_at(t0)), "{d:?}");
}
