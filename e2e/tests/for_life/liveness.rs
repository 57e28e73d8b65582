//! Leader for life with a liveness heartbeat: an ended leader Pod whose kube-leader died with
//! its work (no release mark) is taken over once its lock's heartbeat has not moved for the
//! liveness (plus the 2 s kill margin), not after the Pod's grace; and a leader that cannot
//! write its heartbeat stops being confirmed, without losing its term.

use http::Method;
use kube_leader::internal::labels::{LIVENESS_ANNOTATION, RENEW_TIME_ANNOTATION};
use kube_leader::internal::LeadershipExt as _;
use kube_leader_e2e::faults::{Fault, Faulty, Matcher};

use super::*;

/// The leaders' liveness in these tests.
const LIVENESS: Duration = Duration::from_secs(2);
/// The leader Pod's grace: far longer than the liveness, so that the two proofs differ.
const LONG_GRACE_S: i64 = 30;
/// What a loaded 2-core machine may add to the liveness proof (watch delivery, the fresh read
/// of the leader Pod before the deletion, the create).
const SLACK: Duration = Duration::from_secs(3);

fn live(elector: ForLife) -> ForLife {
    elector.tune(|c| c.liveness(LIVENESS))
}

/// The kubelet's eviction on a real node, with the sidecar SIGKILLed together with COMMAND:
/// the status is written (phase `Failed`, reason `Evicted`, no `containerStatuses`) and the old
/// leader's kube-leader is gone at once, so no release mark is written. Only the grace (30 s)
/// or the lapsed heartbeat prove its work stopped; the heartbeat is the faster proof.
#[tokio::test]
async fn an_evicted_leader_killed_without_release_is_taken_over_after_its_liveness() {
    init_tracing();
    let Setup { ns, admin, .. } = setup().await;
    let ns = ns.name();
    let mut a_pod = test_pod("a", None);
    a_pod.spec.as_mut().unwrap().termination_grace_period_seconds = Some(LONG_GRACE_S);
    create_test_pod(&admin, ns, &a_pod).await;
    create_pods(&admin, ns, &["b"]).await;
    let cancel = CancellationToken::new();
    let a = live(candidate(&admin, ns, "lock", "a"))
        .become_leader(&cancel)
        .await
        .unwrap();
    // Checked after the takeover, which is what this test is about.
    let confirmed = a.confirmed_until();
    let cm = lock_object(&admin, ns, "lock").await.expect("the lock");
    let annotations = cm.annotations().clone();
    let b = spawn(live(candidate(&admin, ns, "lock", "b")), "b", &cancel);
    // A few heartbeats: b sees them move, and waits.
    tokio::time::sleep(LIVENESS * 2).await;
    assert!(!b.is_finished(), "b took over from a live leader");
    let moved = a.confirmed_until();

    let evicted = Instant::now();
    set_pod_phase(&admin, ns, "a", "Failed", Some("Evicted"))
        .await
        .unwrap();
    // SIGKILL: nothing of a's term writes again (no release mark, no heartbeat).
    drop(a);
    let (b, won, _) = first_leader(vec![b]).await;
    let took = won - evicted;
    eprintln!("evicted and killed without release → new leader {took:?} (liveness {LIVENESS:?}, grace {LONG_GRACE_S} s)");
    assert!(
        took <= LIVENESS + Duration::from_secs(2) + SLACK,
        "b took over {took:?} after the eviction: not by the liveness proof"
    );
    let heartbeat_period = LIVENESS / 3;
    assert!(
        took + heartbeat_period >= LIVENESS,
        "b took over {took:?} after the eviction, before a's liveness could have lapsed"
    );
    assert_lock_held_by(&admin, ns, "lock", &b).await;
    let confirmed = confirmed.expect("a liveness leader is confirmed from its create");
    assert!(moved > Some(confirmed), "the heartbeat moves confirmed_until on");
    assert_eq!(
        annotations.get(LIVENESS_ANNOTATION).map(String::as_str),
        Some("2")
    );
    assert!(annotations.contains_key(RENEW_TIME_ANNOTATION), "{annotations:?}");
    cancel.cancel();
}

/// A leader whose heartbeat writes hang (a partition between it and the API server, while its
/// Pod lives): its confirmed_until lapses, so gated work pauses, but its term is not lost and
/// no candidate takes over (leader for life); once a heartbeat gets through, confirmed_until
/// moves on.
#[tokio::test]
async fn a_leader_whose_heartbeats_are_blocked_has_its_confirmation_lapse() {
    init_tracing();
    let Setup { cp, ns, admin } = setup().await;
    let ns = ns.name();
    create_pods(&admin, ns, &["a", "b"]).await;
    let (a_client, faults) = Faulty::client(cp.config("admin").await.expect("admin config"));
    let cancel = CancellationToken::new();
    let a = live(candidate(&a_client, ns, "lock", "a"))
        .become_leader(&cancel)
        .await
        .unwrap();
    let b = spawn(live(candidate(&admin, ns, "lock", "b")), "b", &cancel);
    tokio::time::sleep(LIVENESS).await;
    let before = a.confirmed_until().expect("confirmed");
    assert!(before > tokio::time::Instant::now());

    faults.set(Matcher::write("configmaps", Method::PUT), Fault::Hang);
    let blocked = tokio::time::Instant::now();
    let lapsed = wait_for("a's confirmation lapses", SOON, || async {
        let until = a.confirmed_until().expect("still Some");
        (tokio::time::Instant::now() > until).then_some(until)
    })
    .await;
    assert!(
        lapsed <= blocked + LIVENESS,
        "confirmed until {:?} after the block: beyond the liveness",
        lapsed - blocked
    );
    assert!(a.is_leader(), "a partition of a live Pod does not end its term");
    assert_still_waiting(std::slice::from_ref(&b), "while the leader Pod lives").await;
    assert_eq!(a.confirmed_until(), Some(lapsed), "no heartbeat got through");

    faults.clear();
    wait_for("a's confirmation moves on", SOON, || async {
        let until = a.confirmed_until().expect("still Some");
        (until > tokio::time::Instant::now()).then_some(())
    })
    .await;
    assert!(a.is_leader());
    assert_lock_held_by(&admin, ns, "lock", &a).await;
    drop(a);
    cancel.cancel();
}
