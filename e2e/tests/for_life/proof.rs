//! Leader for life takes over an ended leader Pod only once its containers are known to be
//! gone: the kubelet's order of events (1.20 writes `Failed`/`Evicted` before it kills the
//! containers; a force-deleted Pod vanishes while they run), played with Pod objects whose
//! "containers" are the candidates of the test.

use super::*;

/// The eviction, fast path: the old leader sees its own Pod fail, stops its work (here: takes
/// 1.5 s to), then releases. The successor waits for that release, not for the status write.
#[tokio::test]
async fn an_evicted_leader_is_taken_over_only_once_it_released() {
    init_tracing();
    let Setup { ns, admin, .. } = setup().await;
    let ns = ns.name();
    create_pods(&admin, ns, &["a", "b"]).await;
    let cancel = CancellationToken::new();
    let a = candidate(&admin, ns, "lock", "a")
        .become_leader(&cancel)
        .await
        .unwrap();
    let b = spawn(candidate(&admin, ns, "lock", "b"), "b", &cancel);
    tokio::time::sleep(Duration::from_millis(500)).await;

    let a_lost = loss_instant(&a);
    let evicted = Instant::now();
    set_pod_phase(&admin, ns, "a", "Failed", Some("Evicted"))
        .await
        .unwrap();
    let lost_at = tokio::time::timeout(SOON, a_lost)
        .await
        .expect("a's loss fires")
        .unwrap();
    // a's work is still stopping: nobody may lead.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !b.is_finished(),
        "b took over while the evicted leader still ran (status write → b: at most {:?})",
        evicted.elapsed()
    );
    let released = Instant::now();
    a.release().await.unwrap();
    let (b, won, _) = first_leader(vec![b]).await;
    eprintln!(
        "evicted: status write → old leader's loss {:?}; its release → new leader {:?}",
        lost_at - evicted,
        won - released
    );
    assert_lock_held_by(&admin, ns, "lock", &b).await;
    // The seed's DeleteEvicted: the evicted Pod is deleted by the successor, after the proof.
    let pods = Api::<Pod>::namespaced(admin.clone(), ns);
    wait_for("the evicted leader Pod is deleted", SOON, || async {
        pods.get_opt("a").await.unwrap().is_none().then_some(())
    })
    .await;
    cancel.cancel();
}

/// A force-deleted leader Pod: it vanishes at once (and the garbage collector deletes its lock),
/// while its process still runs. Only its grace,
/// counted from when the successor saw it gone, proves its containers are gone.
#[tokio::test]
async fn a_force_deleted_leader_is_taken_over_only_after_its_grace() {
    init_tracing();
    let Setup { ns, admin, .. } = setup().await;
    let ns = ns.name();
    create_pods(&admin, ns, &["a", "b"]).await;
    let cancel = CancellationToken::new();
    let a = candidate(&admin, ns, "lock", "a")
        .become_leader(&cancel)
        .await
        .unwrap();
    let a_lost = loss_instant(&a);
    let b = spawn(candidate(&admin, ns, "lock", "b"), "b", &cancel);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // a's work goes on stopping: it never releases here (had it, its release would be the
    // proof, as in the eviction's fast path).
    let deleted = Instant::now();
    delete_pod_now(&admin, ns, "a").await;
    let lost_at = a_lost.await.unwrap();
    let (b, won, _) = first_leader(vec![b]).await;
    eprintln!(
        "force-deleted: deletion → old leader's loss {:?}, → new leader {:?}",
        lost_at - deleted,
        won - deleted
    );
    assert!(
        won - deleted >= GRACE_PROOF,
        "b took over {:?} after the force deletion, before the grace proof ({GRACE_PROOF:?})",
        won - deleted
    );
    assert_lock_held_by(&admin, ns, "lock", &b).await;
    drop(a);
    cancel.cancel();
}

/// A graceful deletion seen, then the kubelet's final deletion (played by the test, grace 0):
/// the Pod is gone for good only after its containers stopped, so the successor takes over at
/// once, long before the Pod's grace (30 s here) would have proven it.
#[tokio::test]
async fn a_leader_gone_after_its_graceful_deletion_is_taken_over_at_once() {
    init_tracing();
    let Setup { ns, admin, .. } = setup().await;
    let ns = ns.name();
    let mut a_pod = test_pod("a", Some(NOWHERE));
    a_pod.spec.as_mut().unwrap().termination_grace_period_seconds = Some(30);
    create_test_pod(&admin, ns, &a_pod).await;
    create_pods(&admin, ns, &["b"]).await;
    let cancel = CancellationToken::new();
    let a = candidate(&admin, ns, "lock", "a")
        .become_leader(&cancel)
        .await
        .unwrap();
    let a_lost = loss_instant(&a);
    let b = spawn(candidate(&admin, ns, "lock", "b"), "b", &cancel);
    tokio::time::sleep(Duration::from_millis(500)).await;

    let pods = Api::<Pod>::namespaced(admin.clone(), ns);
    pods.delete("a", &DeleteParams::default()).await.unwrap();
    tokio::time::timeout(SOON, a_lost)
        .await
        .expect("a's loss fires")
        .unwrap();
    assert!(matches!(a.loss_reason(), Some(LossReason::PodEnding { .. })));
    // Being deleted, it may still run (and a does not release here): b waits.
    assert_still_waiting(std::slice::from_ref(&b), "while the leader Pod is terminating").await;
    let gone = Instant::now();
    delete_pod_now(&admin, ns, "a").await;
    let (b, won, _) = first_leader(vec![b]).await;
    eprintln!("graceful deletion completed → new leader {:?}", won - gone);
    assert!(won - gone < SOON, "{:?}", won - gone);
    assert_lock_held_by(&admin, ns, "lock", &b).await;
    drop(a);
    cancel.cancel();
}
