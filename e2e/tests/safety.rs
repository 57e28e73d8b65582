//! Two-leader paths outside the chaos run's reach (issue 16), each closed and proven here
//! against a real control plane, with faults aimed by request kind ([`Faulty`]).

use std::time::{Duration, Instant};

use http::Method;
use k8s_openapi::{
    api::{coordination::v1::Lease, core::v1::ConfigMap},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
};
use kube::{
    api::{DeleteParams, PostParams},
    Api, Client, ResourceExt,
};
use kube_leader::internal::ForLifeExt as _;
use kube_leader::{internal::Environment, internal::LeaseRecord, ForLife, LossReason};
use kube_leader_e2e::{
    faults::{Fault, Faulty, Matcher},
    init_tracing, short_lease_elector as elector, wait_for,
};
use kube_leader_testenv::{create_pod, ControlPlane};
use tokio_util::sync::CancellationToken;

/// Generous bound for anything that should happen "at once", on a loaded 2-core machine.
const SOON: Duration = Duration::from_secs(20);

async fn faulty_client(cp: &ControlPlane) -> (Client, Faulty) {
    Faulty::client(cp.config("admin").await.expect("admin config"))
}

async fn lease_record(client: &Client, ns: &str, name: &str) -> Option<LeaseRecord> {
    Api::<Lease>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
        .map(|l| LeaseRecord::from_lease(&l))
}

// === 1. two candidates with one identity ===

/// A second process with the leader's identity (a copied `--identity`) must not take the lease
/// as its own: before, it renewed at once and both led, each with a fencing token.
#[tokio::test]
async fn a_second_candidate_with_the_leaders_identity_does_not_lead() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let shutdown = CancellationToken::new();
    let first = elector(&client, ns.name(), "twin", "same")
        .become_leader(&shutdown)
        .await
        .unwrap();

    let twin = elector(&client, ns.name(), "twin", "same");
    let s = shutdown.clone();
    let campaign = tokio::spawn(async move { twin.become_leader(&s).await });
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        !campaign.is_finished(),
        "a second process with the leader's identity became leader while the first renewed: {:?}",
        campaign.await
    );
    assert!(
        first.is_leader(),
        "the first leader lost: {:?}",
        first.loss_reason()
    );

    // Once the first steps down, the twin leads as any candidate would.
    first.release().await.unwrap();
    let second = tokio::time::timeout(SOON, campaign)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(second.is_leader());
    second.release().await.unwrap();
}

/// A leader that sees its Lease written by somebody else under its own identity (another
/// process, or a client-go candidate with the same identity) stops at once: before, a renewal's
/// 409 or the watch event were taken as "still mine".
#[tokio::test]
async fn a_foreign_write_under_the_leaders_identity_deposes_it() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let shutdown = CancellationToken::new();
    let leader = elector(&client, ns.name(), "impostor", "me")
        .become_leader(&shutdown)
        .await
        .unwrap();
    let lost = leader.lost_token();

    // What a client-go candidate named "me" writes when it renews: its own renewTime, the
    // annotations it found left as they were.
    let api = Api::<Lease>::namespaced(client.clone(), ns.name());
    let mut lease = api.get("impostor").await.unwrap();
    let spec = lease.spec.as_mut().unwrap();
    spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
    loop {
        match api.replace("impostor", &PostParams::default(), &lease).await {
            Ok(_) => break,
            Err(kube::Error::Api(e)) if e.code == 409 => {
                lease = api.get("impostor").await.unwrap();
                lease.spec.as_mut().unwrap().renew_time =
                    Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
            }
            Err(e) => panic!("{e}"),
        }
    }
    tokio::time::timeout(Duration::from_secs(5), lost.cancelled())
        .await
        .expect("the leader did not notice a foreign write under its own identity");
    assert!(
        matches!(leader.loss_reason(), Some(LossReason::DuplicateIdentity { .. })),
        "{:?}",
        leader.loss_reason()
    );
    drop(leader);
}

// === 2. a term that is already over ===

/// The acquiring write's answer reaches a candidate only after its renew deadline (counted from
/// when the write was sent) has passed, here through a pause of the process: that term is over
/// before it starts, and must not be handed to the user. Before, `become_leader` returned a
/// handle whose fail-stop deadline had passed (and the sidecar started COMMAND with it).
#[tokio::test]
async fn a_term_over_at_acquisition_is_not_returned() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let (client, faults) = faulty_client(cp).await;
    // The first create is answered, then the process stands still for 1.3 s (renew deadline 1 s).
    faults.set_times(
        Matcher::write("leases", Method::POST),
        Fault::PauseAfter(Duration::from_millis(1300)),
        1,
    );
    let shutdown = CancellationToken::new();
    let leadership = elector(&client, ns.name(), "slow", "slow")
        .become_leader(&shutdown)
        .await
        .unwrap();
    let returned = Instant::now();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        leadership.is_leader(),
        "become_leader returned a term that was already over: lost {:?} within {:?}",
        leadership.loss_reason(),
        returned.elapsed()
    );
    leadership.release().await.unwrap();
}

// === 6. absence found by a relist ===

/// A follower that could not watch for longer than a lease duration lists the Lease again and
/// finds none: it did not see how it went (the holder may have renewed meanwhile, and may still
/// act), so it waits a whole lease duration from now. Before, it took the absence for a
/// deletion witnessed at its old observation and created the Lease at once.
#[tokio::test]
async fn absence_found_by_a_relist_is_waited_out() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let admin = cp.client().await;
    let api = Api::<Lease>::namespaced(admin.clone(), ns.name());

    // A holder that is not a kube-leader candidate: the test renews its lease every 300 ms.
    let mut ghost = Lease {
        metadata: ObjectMeta {
            name: Some("blind".into()),
            ..Default::default()
        },
        spec: None,
    };
    let mut spec = k8s_openapi::api::coordination::v1::LeaseSpec::default();
    let mut record = LeaseRecord::default();
    record.holder = Some("ghost".into());
    record.lease_duration = Some(Duration::from_secs(2));
    record.acquire_time = Some(k8s_openapi::jiff::Timestamp::now());
    record.renew_time = record.acquire_time;
    record.write_to(&mut spec, 2);
    ghost.spec = Some(spec);
    api.create(&PostParams::default(), &ghost).await.unwrap();
    let renewing = CancellationToken::new();
    let renewer = {
        let api = api.clone();
        let renewing = renewing.clone();
        tokio::spawn(async move {
            while !renewing.is_cancelled() {
                if let Ok(mut l) = api.get("blind").await {
                    l.spec.as_mut().unwrap().renew_time =
                        Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
                    let _ = api.replace("blind", &PostParams::default(), &l).await;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };

    let (client, faults) = faulty_client(cp).await;
    let follower = elector(&client, ns.name(), "blind", "follower");
    let shutdown = CancellationToken::new();
    let s = shutdown.clone();
    let campaign = tokio::spawn(async move {
        let r = follower.become_leader(&s).await;
        (r, Instant::now())
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!campaign.is_finished());

    // Blind for 3 s (longer than the lease duration) while the holder renews.
    faults.set(Matcher::all(), Fault::Unavailable);
    faults.cut_watches();
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The Lease is deleted (an administrator) while the follower cannot see it.
    renewing.cancel();
    renewer.await.unwrap();
    api.delete("blind", &DeleteParams::default()).await.unwrap();
    // The watch comes back with 410 Gone: the follower lists again and finds nothing.
    faults.set_times(Matcher::watch("leases"), Fault::Gone, 1);
    faults.clear_persistent(None);

    let (leadership, at) = tokio::time::timeout(SOON, campaign).await.unwrap().unwrap();
    let leadership = leadership.unwrap();
    // From the list that followed the 410 (the watcher lists again after its backoff).
    let gone = faults
        .last_served(Fault::Gone)
        .expect("the follower's watch came back");
    let relisted = faults
        .first_passed_after(gone, |m, p| {
            m == Method::GET && p.contains("/leases?") && !p.contains("watch=")
        })
        .expect("the follower listed the Lease again");
    let waited = at.duration_since(relisted);
    eprintln!("absent on relist → created after {waited:?} (lease duration 2 s)");
    assert!(
        waited >= Duration::from_millis(1500),
        "created the Lease {waited:?} after finding it absent on a relist; the last holder \
         may still act for up to a lease duration"
    );
    leadership.release().await.unwrap();
}

// === 7. loss before release ===

/// The loss token fires before the release is written, so no work runs on after the successor
/// starts. Before, a Lease release (and a leader-for-life lock deletion) was sent first, and
/// the token fired only once it was answered.
#[tokio::test]
async fn lease_loss_fires_before_the_release_is_sent() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let (client, faults) = faulty_client(cp).await;
    let shutdown = CancellationToken::new();
    let leadership = elector(&client, ns.name(), "order", "me")
        .become_leader(&shutdown)
        .await
        .unwrap();
    let lost = leadership.lost_token();
    // The release write hangs: with the loss first, the token has fired all the same.
    faults.set(Matcher::write("leases", Method::PUT), Fault::Hang);
    let release = tokio::spawn(leadership.release());
    tokio::time::timeout(Duration::from_millis(300), lost.cancelled())
        .await
        .expect("the loss token did not fire while the release write was pending");
    faults.clear();
    let _ = release.await;
}

/// The same for leader for life: the lock deletion of [`Leadership::release`].
#[tokio::test]
async fn for_life_loss_fires_before_the_lock_is_deleted() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let (client, faults) = faulty_client(cp).await;
    create_pod(&cp.client().await, ns.name(), "p-order")
        .await
        .unwrap();
    let shutdown = CancellationToken::new();
    let leadership = for_life_candidate(&client, ns.name(), "order", "p-order")
        .become_leader(&shutdown)
        .await
        .unwrap();
    let lost = leadership.lost_token();
    faults.set(Matcher::write("configmaps", Method::DELETE), Fault::Hang);
    let release = tokio::spawn(leadership.release());
    tokio::time::timeout(Duration::from_millis(300), lost.cancelled())
        .await
        .expect("the loss token did not fire while the lock deletion was pending");
    faults.clear();
    release.abort();
}

// === 8. per-request timeout ===

/// One renewal that hangs does not cost the term: each request is bounded by half the renew
/// deadline by default, so a second attempt fits in. Before, the bound was the whole renew
/// deadline, and one hung request ended leadership.
#[tokio::test]
async fn one_hung_renewal_does_not_cost_the_term() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let (client, faults) = faulty_client(cp).await;
    let shutdown = CancellationToken::new();
    let leadership = elector(&client, ns.name(), "hung", "me")
        .become_leader(&shutdown)
        .await
        .unwrap();
    faults.set_times(Matcher::write("leases", Method::PUT), Fault::Hang, 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        leadership.is_leader(),
        "one hung renewal ended leadership: {:?}",
        leadership.loss_reason()
    );
    let rec = lease_record(&cp.client().await, ns.name(), "hung").await.unwrap();
    assert_eq!(rec.holder.as_deref(), Some("me"));
    leadership.release().await.unwrap();
}

// === 5. leader for life: no lock deleted on stale Pod state ===

fn for_life_candidate(client: &Client, ns: &str, lock: &str, pod: &str) -> ForLife {
    ForLife::new(client.clone(), lock)
        .namespace(ns)
        .identity(pod)
        .environment(Environment::default())
        .config(
            kube_leader::ForLifeConfig::default()
                .backoff_cap(Duration::from_secs(1))
                .api_timeout(Duration::from_secs(2)),
        )
}

/// A waiting candidate whose Pod watch fails keeps the leader Pod as it last saw it. When the
/// leader's Pod is re-created under the same name and its new process creates a new lock, the
/// candidate must not delete that lock as "replaced" on its stale view: it reads the Pod again
/// right before any stale-lock deletion. Before, the new leader's lock was deleted.
#[tokio::test]
async fn a_stale_pod_view_never_deletes_a_valid_lock() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let admin = cp.client().await;
    let (client, faults) = faulty_client(cp).await;
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(admin.clone(), ns.name());
    let cms = Api::<ConfigMap>::namespaced(admin.clone(), ns.name());
    let shutdown = CancellationToken::new();

    create_pod(&admin, ns.name(), "leader").await.unwrap();
    create_pod(&admin, ns.name(), "waiter").await.unwrap();
    let first = for_life_candidate(&admin, ns.name(), "stale", "leader")
        .become_leader(&shutdown)
        .await
        .unwrap();
    let waiter = for_life_candidate(&client, ns.name(), "stale", "waiter");
    let s = shutdown.clone();
    let campaign = tokio::spawn(async move { waiter.become_leader(&s).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!campaign.is_finished());

    // The waiter goes blind: its watches break and every read fails.
    faults.set(Matcher::resource("pods"), Fault::Unavailable);
    faults.set(Matcher::resource("configmaps"), Fault::Unavailable);
    faults.cut_watches();

    // The leader's Pod is deleted and re-created under the same name; its lock goes with it
    // (garbage collection) and the new Pod's process leads with a new lock.
    drop(first);
    pods.delete("leader", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    wait_for("the old lock to be collected", SOON, || async {
        cms.get_opt("stale").await.unwrap().is_none().then_some(())
    })
    .await;
    wait_for("the old Pod to be gone", SOON, || async {
        pods.get_opt("leader").await.unwrap().is_none().then_some(())
    })
    .await;
    create_pod(&admin, ns.name(), "leader").await.unwrap();
    let second = for_life_candidate(&admin, ns.name(), "stale", "leader")
        .become_leader(&shutdown)
        .await
        .unwrap();
    let lock_uid = cms.get("stale").await.unwrap().uid().unwrap();

    // The waiter sees the lock again, but not the Pod yet.
    faults.clear_persistent(Some("configmaps"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        second.is_leader(),
        "the new leader's lock was deleted on a stale view of its Pod: {:?}",
        second.loss_reason()
    );
    // And once it sees the Pod too, it waits as a follower.
    faults.clear();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(second.is_leader(), "{:?}", second.loss_reason());
    assert_eq!(
        cms.get("stale").await.unwrap().uid().as_deref(),
        Some(lock_uid.as_str())
    );
    assert!(
        !campaign.is_finished(),
        "the waiter became leader: {:?}",
        campaign.await
    );
    shutdown.cancel();
}
