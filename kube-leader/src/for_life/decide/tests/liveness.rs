//! Unit tests of `decide`: the liveness proof. An ended leader Pod whose lock's heartbeat has
//! stopped for its liveness (plus the kill margin) is taken over without waiting for its grace;
//! a live one never is.

use super::*;
use crate::for_life::record::Heartbeat;

/// The liveness the lock advertises in these tests: shorter than [`GRACE`].
const LIVENESS: Duration = Duration::from_secs(3);

/// The leader's lock, with a heartbeat at `renew_time`.
fn beating(renew_time: &str) -> LockRecord {
    let mut l = lock(Ok(leader()));
    l.heartbeat = Ok(Some(Heartbeat {
        renew_time: renew_time.into(),
        liveness: LIVENESS,
    }));
    l
}

/// When the liveness proof holds for a heartbeat last seen moving at `t`.
fn lapsed_at(t: Instant) -> Instant {
    t + LIVENESS + KILL_MARGIN
}

/// Decides at `now` as the campaign does: the lock, then the Pod, observed into `fate` first.
fn at(lock: Option<&LockRecord>, leader_pod: &LeaderPod, fate: &mut Fate, now: Instant) -> Decision {
    fate.observe_lock(lock, now);
    run_at(lock, leader_pod, fate, SEED, now)
}

fn evicted() -> LeaderPod {
    pod("leader-1", "Failed", Some("Evicted"))
}

fn running() -> LeaderPod {
    pod("leader-1", "Running", None)
}

#[test]
fn an_ended_leader_whose_heartbeat_lapsed_is_stale_before_its_grace() {
    let ended = [
        (
            evicted(),
            Stale::LeaderPodTerminated {
                holder: "leader".into(),
                phase: "Failed".into(),
                reason: Some("Evicted".into()),
            },
        ),
        (
            LeaderPod::Absent,
            Stale::LeaderPodGone {
                holder: "leader".into(),
            },
        ),
        (
            pod("leader-2", "Running", None),
            Stale::LeaderPodReplaced {
                holder: "leader".into(),
            },
        ),
    ];
    for (end, want) in ended {
        let mut fate = seen_running();
        let l = beating("t1");
        let t0 = Instant::now();
        let d = at(Some(&l), &running(), &mut fate, t0);
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
        let ended_at = t0 + Duration::from_secs(1);
        let d = at(Some(&l), &end, &mut fate, ended_at);
        assert_eq!(
            may_run(&d),
            Some(lapsed_at(t0)),
            "{end:?}: rechecks when the liveness proof holds, before the grace: {d:?}"
        );
        let d = at(Some(&l), &end, &mut fate, lapsed_at(t0));
        let (why, _) = deletes(&d).unwrap_or_else(|| panic!("{end:?}: {d:?}"));
        assert_eq!(why, &want);
        assert_eq!(
            proof(&d),
            Some(Proof::LivenessLapsed {
                waited: LIVENESS + KILL_MARGIN
            })
        );
    }
}

#[test]
fn the_evicted_pod_is_still_deleted_by_policy_with_the_liveness_proof() {
    let mut fate = seen_running();
    let l = beating("t1");
    let t0 = Instant::now();
    at(Some(&l), &evicted(), &mut fate, t0);
    let d = at(Some(&l), &evicted(), &mut fate, lapsed_at(t0));
    let (_, delete_pod) = deletes(&d).expect("stale");
    assert_eq!(delete_pod, &Some(leader()));
}

#[test]
fn an_ended_leader_whose_heartbeat_still_moves_is_waited_for() {
    let mut fate = seen_running();
    let t0 = Instant::now();
    at(Some(&beating("t1")), &evicted(), &mut fate, t0);
    // The heartbeat moved: its leader still runs (here: a partition healed a moment).
    let t1 = t0 + Duration::from_secs(2);
    let moved = beating("t2");
    let d = at(Some(&moved), &evicted(), &mut fate, t1);
    assert_eq!(may_run(&d), Some(lapsed_at(t1)), "{d:?}");
    let d = at(Some(&moved), &evicted(), &mut fate, lapsed_at(t0));
    assert_eq!(
        may_run(&d),
        Some(lapsed_at(t1)),
        "not lapsed since it moved: {d:?}"
    );
    let d = at(Some(&moved), &evicted(), &mut fate, lapsed_at(t1));
    assert!(matches!(proof(&d), Some(Proof::LivenessLapsed { .. })), "{d:?}");
}

#[test]
fn a_live_leader_whose_heartbeat_lapsed_leads_on() {
    // Leader for life: a partition (no heartbeat) of a live Pod is no reason to take over.
    let mut fate = seen_running();
    let l = beating("t1");
    let t0 = Instant::now();
    at(Some(&l), &running(), &mut fate, t0);
    let d = at(Some(&l), &running(), &mut fate, t0 + Duration::from_secs(3600));
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

#[test]
fn without_a_heartbeat_only_the_grace_proves() {
    let no_heartbeat = lock(Ok(leader()));
    let mut malformed = lock(Ok(leader()));
    malformed.heartbeat = Err("bad annotation".into());
    for l in [no_heartbeat, malformed] {
        let mut fate = seen_running();
        let t0 = Instant::now();
        let d = at(Some(&l), &evicted(), &mut fate, t0);
        assert_eq!(may_run(&d), Some(proven_at(t0)), "{d:?}");
        let d = at(Some(&l), &evicted(), &mut fate, lapsed_at(t0));
        assert_eq!(may_run(&d), Some(proven_at(t0)), "{d:?}");
        let d = at(Some(&l), &evicted(), &mut fate, proven_at(t0));
        assert!(matches!(proof(&d), Some(Proof::GraceElapsed { .. })), "{d:?}");
    }
}

#[test]
fn a_lock_gone_counts_from_when_it_was_seen_gone() {
    // A force-deleted leader Pod: it vanished, and the garbage collector deleted its lock. A
    // heartbeat written before the deletion may not have been seen (a watch that relisted):
    // the liveness is counted from when the lock was seen gone.
    let mut fate = seen_running();
    let t0 = Instant::now();
    at(Some(&beating("t1")), &running(), &mut fate, t0);
    let gone = t0 + Duration::from_secs(1);
    let d = at(None, &LeaderPod::Absent, &mut fate, gone);
    assert_eq!(may_run(&d), Some(lapsed_at(gone)), "{d:?}");
    let d = at(None, &LeaderPod::Absent, &mut fate, lapsed_at(t0));
    assert_eq!(may_run(&d), Some(lapsed_at(gone)), "{d:?}");
    assert_eq!(
        at(None, &LeaderPod::Absent, &mut fate, lapsed_at(gone)),
        Decision::Create
    );
}

#[test]
fn a_new_lock_of_the_owner_starts_its_heartbeat_over() {
    // Same owner, another lock (UID): a heartbeat seen for the first time.
    let mut fate = seen_running();
    let t0 = Instant::now();
    at(Some(&beating("t1")), &evicted(), &mut fate, t0);
    let mut other = beating("t1");
    other.uid = "lock-2".into();
    let t1 = t0 + Duration::from_secs(2);
    let d = at(Some(&other), &evicted(), &mut fate, t1);
    assert_eq!(may_run(&d), Some(lapsed_at(t1)), "{d:?}");
}

#[test]
fn the_proof_names_the_liveness() {
    let p = Proof::LivenessLapsed {
        waited: Duration::from_secs(7),
    };
    assert!(p.to_string().contains("liveness"), "{p}");
}

#[test]
fn a_lock_this_candidate_deleted_on_the_proof_is_created_at_once() {
    // Its own deletion (and the dead Pod's, by policy) is no news about the old leader's work.
    let mut fate = seen_running();
    let t0 = Instant::now();
    let l = beating("t1");
    at(Some(&l), &evicted(), &mut fate, t0);
    let d = at(Some(&l), &evicted(), &mut fate, lapsed_at(t0));
    assert!(matches!(proof(&d), Some(Proof::LivenessLapsed { .. })), "{d:?}");
    fate.proven = true; // as the campaign does once the deletion succeeded
    let d = at(None, &LeaderPod::Absent, &mut fate, lapsed_at(t0));
    assert_eq!(d, Decision::Create);
}

#[test]
fn a_lock_deleted_under_a_live_beating_leader_is_taken_once_its_heartbeat_lapsed() {
    // The leader stops its work by its last heartbeat's send plus its liveness: counted from
    // when the lock was seen gone (a heartbeat sent just before may not have been seen).
    let mut fate = seen_running();
    let t0 = Instant::now();
    at(Some(&beating("t1")), &running(), &mut fate, t0);
    let gone = t0 + Duration::from_secs(1);
    let d = at(None, &running(), &mut fate, gone);
    assert_eq!(
        d,
        Decision::Wait {
            why: Waiting::LockDeletedUnderLeader {
                holder: "leader".into()
            },
            recheck_at: Some(lapsed_at(gone)),
        }
    );
    assert_eq!(at(None, &running(), &mut fate, lapsed_at(gone)), Decision::Create);
}
