//! The first two examples, run as their users run them against the real test control plane:
//! `lease_worker` hands its Lease over on Ctrl-C; `controller_for_life` leads for life in its
//! Pod, steps down on SIGTERM by deleting its lock, and exits 3 when its lock is deleted under
//! it (so that its container restarts and campaigns again).

mod common;

use std::time::Duration;

use common::{Replica, SOON};
use k8s_openapi::api::{coordination::v1::Lease, core::v1::ConfigMap};
use kube::{api::DeleteParams, Api, Client};
use kube_leader_testenv::{create_pod, ControlPlane};
use nix::sys::signal::Signal;

/// Polls `get` until it returns `Some`, or panics naming `what`.
async fn until<T, F, Fut>(what: &str, mut get: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = get().await {
            return v;
        }
        assert!(start.elapsed() < SOON, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn lease_holder(client: &Client, ns: &str, name: &str) -> Option<String> {
    let lease = Api::<Lease>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()?;
    lease.spec?.holder_identity.filter(|h| !h.is_empty())
}

/// The leader-for-life lock's holder: its owner reference's Pod.
async fn lock_owner(client: &Client, ns: &str, name: &str) -> Option<String> {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()?;
    Some(cm.metadata.owner_references?.first()?.name.clone())
}

#[tokio::test]
async fn the_lease_worker_hands_over_on_ctrl_c() {
    let started = std::time::Instant::now();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let lock = "lease-worker-example";
    let env = |id| [("POD_NAME", id), ("POD_NAMESPACE", ns.name())];
    let w1 = Replica::start(cp, "lease_worker", &format!("{}-w1", ns.name()), &[], &env("w1"));
    until("w1 leading", || async {
        (lease_holder(&client, ns.name(), lock).await? == "w1").then_some(())
    })
    .await;
    let w2 = Replica::start(cp, "lease_worker", &format!("{}-w2", ns.name()), &[], &env("w2"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        lease_holder(&client, ns.name(), lock).await.as_deref(),
        Some("w1")
    );

    let status = w1.signal_and_wait(Signal::SIGINT).await;
    assert!(status.success(), "lease_worker exited with {status} on Ctrl-C");
    // Released: w2 takes over at once, well before the 15 s lease would have expired.
    let handover = std::time::Instant::now();
    until("w2 leading", || async {
        (lease_holder(&client, ns.name(), lock).await? == "w2").then_some(())
    })
    .await;
    assert!(
        handover.elapsed() < Duration::from_secs(10),
        "w2 waited for the lease to expire"
    );
    w2.signal_and_wait(Signal::SIGINT).await;
    eprintln!("lease_worker example: {:.1} s", started.elapsed().as_secs_f64());
}

#[tokio::test]
async fn the_for_life_controller_steps_down_on_sigterm_and_exits_3_when_its_lock_goes() {
    let started = std::time::Instant::now();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let lock = "controller-for-life-example";
    for pod in ["p1", "p2"] {
        create_pod(&client, ns.name(), pod).await.unwrap();
    }
    let env = |pod| [("POD_NAME", pod), ("POD_NAMESPACE", ns.name())];
    let p1 = Replica::start(
        cp,
        "controller_for_life",
        &format!("{}-p1", ns.name()),
        &[],
        &env("p1"),
    );
    until("p1 leading", || async {
        (lock_owner(&client, ns.name(), lock).await? == "p1").then_some(())
    })
    .await;
    let mut p2 = Replica::start(
        cp,
        "controller_for_life",
        &format!("{}-p2", ns.name()),
        &[],
        &env("p2"),
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(lock_owner(&client, ns.name(), lock).await.as_deref(), Some("p1"));

    // SIGTERM: the controller stops, then the lock is deleted, and p2 leads without waiting
    // for p1's Pod to go.
    p1.terminate().await;
    until("p2 leading", || async {
        (lock_owner(&client, ns.name(), lock).await? == "p2").then_some(())
    })
    .await;

    // The lock deleted under the leader: it stops and exits 3.
    Api::<ConfigMap>::namespaced(client.clone(), ns.name())
        .delete(lock, &DeleteParams::default())
        .await
        .unwrap();
    let status = p2.wait().await;
    assert_eq!(
        status.code(),
        Some(3),
        "controller_for_life exited with {status} after losing its lock"
    );
    eprintln!(
        "controller_for_life example: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
