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

/// Test Pods whose grace proof (60 s + 2 s) cannot end a test's wait within [`SOON`]: a
/// takeover within it has another proof.
const LONG_GRACE_S: i64 = 60;

/// Creates Pods with [`LONG_GRACE_S`] of grace.
async fn create_long_grace_pods(client: &Client, ns: &str, names: &[&str]) {
    for name in names {
        let mut p = test_pod(name, None);
        p.spec.as_mut().unwrap().termination_grace_period_seconds = Some(LONG_GRACE_S);
        create_test_pod(client, ns, &p).await;
    }
}

/// A current kubelet writes a terminal phase only once none of the Pod's containers can run
/// (1.24 and later; the server's release says so from 1.27): a waiting candidate takes over on
/// that phase at once, without the leader's release and long before its grace, but only if the
/// kubelet's field manager wrote it. The old leader here never releases (its process "hangs").
/// On an older server the terminal phase proves nothing.
#[tokio::test]
async fn a_terminal_phase_the_kubelet_wrote_is_proof_on_a_current_server() {
    init_tracing();
    let Setup { ns, admin, .. } = setup().await;
    let ns = ns.name();
    let current = ControlPlane::shared().kubernetes_version().at_least(1, 27);
    create_long_grace_pods(&admin, ns, &["a", "b", "c", "d"]).await;
    let cancel = CancellationToken::new();

    // Another writer's terminal phase (the Pod garbage collector, a person): no proof.
    let a = candidate(&admin, ns, "lock-1", "a")
        .become_leader(&cancel)
        .await
        .unwrap();
    let b = spawn(candidate(&admin, ns, "lock-1", "b"), "b", &cancel);
    tokio::time::sleep(Duration::from_millis(500)).await;
    set_pod_phase_as(&admin, ns, "a", "Failed", None, "pod-garbage-collector-stand-in")
        .await
        .unwrap();
    assert_still_waiting(std::slice::from_ref(&b), "a phase the kubelet did not write").await;
    drop(a);

    // The kubelet's own terminal phase.
    let c = candidate(&admin, ns, "lock-2", "c")
        .become_leader(&cancel)
        .await
        .unwrap();
    let d = spawn(candidate(&admin, ns, "lock-2", "d"), "d", &cancel);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let written = Instant::now();
    set_pod_phase_as(&admin, ns, "c", "Failed", Some("Evicted"), "kubelet")
        .await
        .unwrap();
    if current {
        let (d, won, _) = first_leader(vec![d]).await;
        eprintln!("the kubelet's terminal phase → new leader {:?}", won - written);
        assert_lock_held_by(&admin, ns, "lock-2", &d).await;
        assert!(
            c.lost_token().is_cancelled(),
            "the old leader saw its own Pod end"
        );
    } else {
        assert_still_waiting(
            std::slice::from_ref(&d),
            "a terminal phase on a server older than 1.27",
        )
        .await;
    }
    cancel.cancel();
}

/// A leader whose Pod gets a `DisruptionTarget` condition (the eviction API, a preemption or a
/// taint's deletion writes it before the Pod is deleted) stops leading at once, before it is
/// killed: released as the sidecar does, the lock goes to a waiting candidate, long before
/// the leader's Pod ends.
#[tokio::test]
async fn a_leader_whose_pod_is_about_to_be_disrupted_hands_over_at_once() {
    init_tracing();
    let Setup { ns, admin, .. } = setup().await;
    let ns = ns.name();
    create_long_grace_pods(&admin, ns, &["a", "b"]).await;
    let cancel = CancellationToken::new();
    let a = candidate(&admin, ns, "lock", "a")
        .become_leader(&cancel)
        .await
        .unwrap();
    let b = spawn(candidate(&admin, ns, "lock", "b"), "b", &cancel);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!b.is_finished());

    // Released as soon as it is lost, as the sidecar does once COMMAND stopped.
    let a = tokio::spawn(async move {
        a.lost_token().cancelled().await;
        let lost = Instant::now();
        let reason = a.loss_reason();
        a.release().await.expect("the release");
        (lost, reason)
    });
    let marked = Instant::now();
    set_pod_condition(
        &admin,
        ns,
        "a",
        "DisruptionTarget",
        "True",
        "EvictionByEvictionAPI",
    )
    .await
    .unwrap();
    let (lost, reason) = tokio::time::timeout(SOON, a)
        .await
        .expect("the leader stepped down on DisruptionTarget")
        .unwrap();
    assert_eq!(
        reason,
        Some(LossReason::PodEnding {
            why: "is about to be disrupted (DisruptionTarget: EvictionByEvictionAPI)".into()
        })
    );
    let (b, won, _) = first_leader(vec![b]).await;
    assert!(lost <= won, "the old leader stopped after the new one started");
    eprintln!(
        "DisruptionTarget → old leader's loss {:?}, → new leader {:?}",
        lost - marked,
        won - marked
    );
    assert_lock_held_by(&admin, ns, "lock", &b).await;
    cancel.cancel();
}
