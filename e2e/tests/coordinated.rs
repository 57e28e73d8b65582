//! Kubernetes' coordinated leader election (KEP-4355) beside kube-leader, on a control plane of
//! this binary's own with the `CoordinatedLeaderElection` gate and `coordination.k8s.io/v1beta1`
//! on ([`ControlPlaneOptions::coordinated_leader_election`]; on binaries without them the
//! control plane refuses to start, naming the release, and every test here fails).
//!
//! - `coordinated_client_go_beside_kube_leader`: a client-go candidate with `Coordinated: true`
//!   (`go-candidate --coordinated`) and two kube-leader `LeaseElector` candidates on one Lease.
//!   The controller's choice leads; the LeaseCandidates exist; leadership intervals never
//!   overlap; client-go's candidates never exit unasked and lead whenever the controller makes
//!   them holder. kube-leader's candidates, which do not take part, leave the Lease to the
//!   controller: they take it only once it has stayed free for 10 s after its expiry (no
//!   coordinated candidate answers), and a holder gives way to a new `spec.preferredHolder`
//!   (the Lease's holder changes are printed as they happen).
//! - `unowned_fields_survive_acquire_renew_and_release` and `a_shard_lease_keeps_unowned_fields`:
//!   kube-leader's writes (PUTs of the Lease it read) keep `spec.strategy`,
//!   `spec.preferredHolder`, labels and annotations that it does not own. Without the gate the
//!   API server itself would drop the two spec fields, hence this control plane.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{
    api::{ApiResource, DynamicObject, GroupVersionKind, PostParams},
    Api,
};
use kube_leader::{
    internal::labels::{ROLE_LABEL, SHARDS_LABEL},
    LeaseConfig, Shards,
};
use kube_leader_e2e::{
    init_tracing,
    interop::{Fleet, Implementation, Stop, LEASE, PATIENCE, RENEW, RETRY},
    short_lease_elector, wait_for,
};
use kube_leader_testenv::ControlPlane;
use tokio_util::sync::CancellationToken;

/// This binary's control plane, with coordinated leader election, started on first use.
fn control_plane() -> &'static ControlPlane {
    ControlPlane::shared_coordinated()
}

// === coordinated election beside kube-leader ===

/// One change of the Lease as a poller saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    holder: Option<String>,
    preferred_holder: Option<String>,
    strategy: Option<String>,
    lease_duration_seconds: Option<i32>,
}

/// Polls a Lease every 100 ms and keeps each change, with the time since the test started.
struct Poller {
    seen: Arc<Mutex<Vec<(Duration, Seen)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Poller {
    fn start(leases: Api<Lease>, name: &str, since: Instant) -> Self {
        let seen: Arc<Mutex<Vec<(Duration, Seen)>>> = Arc::default();
        let s = Arc::clone(&seen);
        let name = name.to_owned();
        let task = tokio::spawn(async move {
            loop {
                if let Ok(Some(lease)) = leases.get_opt(&name).await {
                    let spec = lease.spec.unwrap_or_default();
                    let now = Seen {
                        holder: spec.holder_identity,
                        preferred_holder: spec.preferred_holder,
                        strategy: spec.strategy,
                        lease_duration_seconds: spec.lease_duration_seconds,
                    };
                    let mut seen = s.lock().unwrap();
                    if seen.last().map(|(_, last)| last) != Some(&now) {
                        seen.push((since.elapsed(), now));
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Self { seen, task }
    }

    fn changes(&self) -> Vec<(Duration, Seen)> {
        self.seen.lock().unwrap().clone()
    }

    /// Prints the changes from index `from` on; returns how many there are in all.
    fn print_since(&self, from: usize, phase: &str) -> usize {
        let changes = self.changes();
        eprintln!("Lease changes, {phase}:");
        for (at, seen) in &changes[from.min(changes.len())..] {
            eprintln!(
                "  {at:>8.2?} holder {:?} preferredHolder {:?} strategy {:?} leaseDurationSeconds {:?}",
                seen.holder, seen.preferred_holder, seen.strategy, seen.lease_duration_seconds
            );
        }
        changes.len()
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The LeaseCandidates of `lease` in `ns`: name → spec.
async fn lease_candidates(
    client: &kube::Client,
    ns: &str,
    lease: &str,
) -> BTreeMap<String, serde_json::Value> {
    let gvk = GroupVersionKind::gvk("coordination.k8s.io", "v1beta1", "LeaseCandidate");
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk));
    api.list(&Default::default())
        .await
        .expect("list coordination.k8s.io/v1beta1 LeaseCandidates")
        .items
        .into_iter()
        .filter(|c| c.data["spec"]["leaseName"] == lease)
        .map(|c| (c.metadata.name.unwrap_or_default(), c.data["spec"].clone()))
        .collect()
}

/// How many terms `identity` has had.
fn terms_of(fleet: &Fleet, identity: &str) -> usize {
    fleet
        .history()
        .terms()
        .iter()
        .filter(|t| t.candidate == identity)
        .count()
}

#[tokio::test]
async fn coordinated_client_go_beside_kube_leader() {
    init_tracing();
    let cp = control_plane();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns.name());
    let since = Instant::now();
    let poller = Poller::start(leases.clone(), "coordinated", since);
    let mut fleet = Fleet::new(
        cp.kubeconfig_path(),
        ns.name(),
        "coordinated",
        std::path::Path::new(env!("CARGO_BIN_EXE_lease-candidate")),
    );

    // 1. The coordinated client-go candidate alone: the controller creates the Lease naming it.
    fleet.spawn(Implementation::ClientGoCoordinated, "go-c1");
    let (leader, _) = fleet.wait_leader(&[]).await;
    assert_eq!(leader, "go-c1", "the controller's choice leads");
    eprintln!("go-c1 (coordinated) leads {:?} after it started", since.elapsed());
    let lease = leases.get("coordinated").await.unwrap();
    let spec = lease.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("go-c1"));
    assert_eq!(spec.strategy.as_deref(), Some("OldestEmulationVersion"));
    let candidates = lease_candidates(&client, ns.name(), "coordinated").await;
    assert_eq!(candidates.keys().collect::<Vec<_>>(), ["go-c1"]);
    assert_eq!(candidates["go-c1"]["binaryVersion"], "1.37.2");
    assert_eq!(candidates["go-c1"]["strategy"], "OldestEmulationVersion");
    let mut printed = poller.print_since(0, "go-c1 alone");

    // 2. Two kube-leader candidates join; the coordinated leader keeps the Lease it renews.
    fleet.spawn(Implementation::KubeLeader, "kl-1");
    fleet.spawn(Implementation::KubeLeader, "kl-2");
    tokio::time::sleep(4 * LEASE).await;
    assert_eq!(
        fleet.leaders(),
        ["go-c1"],
        "kube-leader took a Lease client-go renews"
    );
    assert_eq!(terms_of(&fleet, "go-c1"), 1, "go-c1 flapped");
    fleet.assert_safe();
    printed = poller.print_since(printed, "kube-leader candidates beside go-c1");

    // 3. go-c1 crashes; its LeaseCandidate stays (valid 30 minutes), unanswering. The
    //    controller names nobody, and a kube-leader candidate takes the Lease only once it has
    //    stayed free for the coordinated grace (10 s) after its expiry, keeping `strategy`.
    let stopped = fleet.stop("go-c1", Stop::Crash).await.expect("go-c1 led");
    let (kl_leader, started) = fleet.wait_leader(&["go-c1"]).await;
    let took = Duration::from_nanos(started - stopped);
    eprintln!(
        "go-c1 crashed → {kl_leader} ({}) leads after {took:?}",
        fleet.implementation(&kl_leader),
    );
    assert_eq!(fleet.implementation(&kl_leader), Implementation::KubeLeader);
    assert!(
        took >= Duration::from_secs(10),
        "kube-leader took a coordinated Lease {took:?} after its holder crashed, before the controller's grace"
    );
    let spec = leases.get("coordinated").await.unwrap().spec.unwrap();
    assert_eq!(spec.strategy.as_deref(), Some("OldestEmulationVersion"));
    fleet.assert_safe();
    printed = poller.print_since(printed, "after go-c1 crashed");

    // 4. A new coordinated candidate registers while kube-leader holds the Lease: the controller
    //    elects it and names it spec.preferredHolder; the kube-leader holder gives way (its work
    //    stops, then it releases) and the controller makes go-c2 holder.
    let registered = Instant::now();
    fleet.spawn(Implementation::ClientGoCoordinated, "go-c2");
    let (leader, _) = fleet.wait_leader(&["go-c1", &kl_leader]).await;
    eprintln!(
        "go-c2 registered → it leads after {:?} ({kl_leader} gave way)",
        registered.elapsed()
    );
    assert_eq!(leader, "go-c2", "the controller's choice leads");
    fleet.assert_safe();
    printed = poller.print_since(printed, "go-c2 registered");
    let candidates = lease_candidates(&client, ns.name(), "coordinated").await;
    assert_eq!(candidates.keys().collect::<Vec<_>>(), ["go-c1", "go-c2"]);

    // 5. No flapping: the kube-leader candidates, campaigning again, leave go-c2's Lease alone.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(fleet.leaders(), ["go-c2"]);
    assert_eq!(terms_of(&fleet, "go-c2"), 1, "go-c2 flapped");
    assert_eq!(terms_of(&fleet, &kl_leader), 1, "{kl_leader} took the Lease back");
    let spec = leases.get("coordinated").await.unwrap().spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("go-c2"));
    assert_eq!(spec.strategy.as_deref(), Some("OldestEmulationVersion"));
    poller.print_since(printed, "go-c2 leads");
    for id in ["kl-1", "kl-2", "go-c2"] {
        fleet.stop(id, Stop::Release).await;
    }
    let report = fleet.assert_safe();
    eprintln!("coordinated beside kube-leader: {report}");
    for t in fleet.history().terms() {
        eprintln!("  term {} {}..{:?}", t.candidate, t.start, t.end);
    }
}

/// kube-leader taking part (`LeaseElector::coordinated`): it registers a LeaseCandidate, leads
/// only when the controller names it holder, and gives way to the controller's better choice
/// (an older emulation version), beside client-go's coordinated candidates; a classic
/// kube-leader candidate beside them never takes the Lease while the controller has a choice.
#[tokio::test]
async fn kube_leader_takes_part_and_follows_the_controller() {
    init_tracing();
    let cp = control_plane();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns.name());
    let since = Instant::now();
    let poller = Poller::start(leases.clone(), "takes-part", since);
    let mut fleet = Fleet::new(
        cp.kubeconfig_path(),
        ns.name(),
        "takes-part",
        std::path::Path::new(env!("CARGO_BIN_EXE_lease-candidate")),
    );

    // 1. A coordinated kube-leader candidate alone: the controller creates the Lease naming it.
    //    (A classic candidate started at the same moment may create the absent Lease first, as
    //    it cannot know that a controller will manage it, and then gives way. Started after, it
    //    finds a coordinated Lease and leaves it to the controller.)
    fleet.spawn_versioned(Implementation::KubeLeader, "kl-c1", Some("1.37.2"));
    let (leader, _) = fleet.wait_leader(&[]).await;
    eprintln!("{leader} leads {:?} after it started", since.elapsed());
    assert_eq!(leader, "kl-c1", "the controller's choice leads");
    fleet.spawn(Implementation::KubeLeader, "kl-classic");
    let spec = leases.get("takes-part").await.unwrap().spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("kl-c1"));
    assert_eq!(spec.strategy.as_deref(), Some("OldestEmulationVersion"));
    let candidates = lease_candidates(&client, ns.name(), "takes-part").await;
    assert_eq!(candidates.keys().collect::<Vec<_>>(), ["kl-c1"]);
    assert_eq!(candidates["kl-c1"]["binaryVersion"], "1.37.2");
    let mut printed = poller.print_since(0, "kl-c1 alone");

    // 2. An older coordinated client-go candidate registers: the controller prefers it, kl-c1
    //    gives way (its work stops, it releases) and go-old leads.
    let registered = Instant::now();
    fleet.spawn_versioned(Implementation::ClientGoCoordinated, "go-old", Some("1.36.0"));
    let (leader, _) = fleet.wait_leader(&["kl-c1", "kl-classic"]).await;
    eprintln!("go-old registered → it leads after {:?}", registered.elapsed());
    assert_eq!(leader, "go-old", "the oldest emulation version leads");
    fleet.assert_safe();
    printed = poller.print_since(printed, "go-old registered");

    // 3. go-old stops: the controller names kl-c1 again.
    let stopped = Instant::now();
    fleet.stop("go-old", Stop::Release).await;
    let (leader, _) = fleet.wait_leader(&["go-old", "kl-classic"]).await;
    eprintln!("go-old released → {leader} leads after {:?}", stopped.elapsed());
    assert_eq!(leader, "kl-c1");
    let took = stopped.elapsed();
    tokio::time::sleep(4 * LEASE).await;
    assert_eq!(fleet.leaders(), ["kl-c1"]);
    // A classic candidate leaves a coordinated Lease to the controller for 10 s after it is
    // free (COORDINATED_GRACE). A controller slower than that (a loaded machine: it pings the
    // candidates, the stopped go-old too, and waits for their answers) lets it take one term,
    // which it gives up as soon as the controller names its choice; before the grace, never.
    let classic = terms_of(&fleet, "kl-classic");
    assert!(
        classic == 0 || (classic == 1 && took >= Duration::from_secs(10)),
        "the classic candidate took a coordinated Lease {classic} times, the controller's choice \
         leading {took:?} after the release"
    );
    assert_eq!(terms_of(&fleet, "kl-c1"), 2);
    poller.print_since(printed, "go-old stopped");

    // 4. Stopping withdraws the LeaseCandidate.
    for id in ["kl-classic", "kl-c1"] {
        fleet.stop(id, Stop::Release).await;
    }
    let report = fleet.assert_safe();
    eprintln!("kube-leader taking part: {report}");
    wait_for("kl-c1's LeaseCandidate is withdrawn", PATIENCE, || async {
        let left = lease_candidates(&client, ns.name(), "takes-part").await;
        (!left.contains_key("kl-c1")).then_some(())
    })
    .await;
}

// === fields kube-leader does not own ===

const STRATEGY: &str = "OldestEmulationVersion";
const PREFERRED: &str = "someone-else";
const LABEL: (&str, &str) = ("example.com/team", "blue");
const ANNOTATION: (&str, &str) = ("example.com/note", "not kube-leader's");

/// `spec` with the fields kube-leader does not own set, and labels besides `labels`.
fn with_unowned(name: &str, mut labels: BTreeMap<String, String>, mut spec: LeaseSpec) -> Lease {
    labels.insert(LABEL.0.into(), LABEL.1.into());
    spec.strategy = Some(STRATEGY.into());
    spec.preferred_holder = Some(PREFERRED.into());
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels),
            annotations: Some([(ANNOTATION.0.to_owned(), ANNOTATION.1.to_owned())].into()),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
    }
}

/// Reads the Lease and panics, naming `stage`, unless every field kube-leader does not own is
/// still there.
async fn assert_unowned_kept(leases: &Api<Lease>, name: &str, stage: &str) -> Lease {
    let lease = leases.get(name).await.unwrap();
    let spec = lease.spec.clone().unwrap_or_default();
    let labels = lease.metadata.labels.clone().unwrap_or_default();
    let annotations = lease.metadata.annotations.clone().unwrap_or_default();
    let lost: Vec<&str> = [
        ("spec.strategy", spec.strategy.as_deref() == Some(STRATEGY)),
        (
            "spec.preferredHolder",
            spec.preferred_holder.as_deref() == Some(PREFERRED),
        ),
        (
            "a label",
            labels.get(LABEL.0).map(String::as_str) == Some(LABEL.1),
        ),
        (
            "an annotation",
            annotations.get(ANNOTATION.0).map(String::as_str) == Some(ANNOTATION.1),
        ),
    ]
    .into_iter()
    .filter(|(_, kept)| !kept)
    .map(|(field, _)| field)
    .collect();
    assert!(
        lost.is_empty(),
        "{stage}: kube-leader's write dropped {lost:?} of Lease {name}: spec {spec:?}, labels {labels:?}, annotations {annotations:?}"
    );
    lease
}

/// Waits until the Lease `name` has been renewed after `after` (its renewTime moved on) and
/// returns it.
async fn next_renewal(leases: &Api<Lease>, name: &str, after: Option<MicroTime>) -> Lease {
    wait_for("a renewal", PATIENCE, || async {
        let lease = leases.get(name).await.ok()?;
        let renewed = lease.spec.as_ref()?.renew_time.clone();
        (renewed.is_some() && renewed != after).then_some(lease)
    })
    .await
}

#[tokio::test]
async fn unowned_fields_survive_acquire_renew_and_release() {
    init_tracing();
    let cp = control_plane();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns.name());

    // A Lease held by a candidate gone long ago, with fields kube-leader does not own.
    let long_ago = Timestamp::from_second(Timestamp::now().as_second() - 3600).unwrap();
    let spec = LeaseSpec {
        holder_identity: Some("gone".into()),
        lease_duration_seconds: Some(2),
        acquire_time: Some(MicroTime(long_ago)),
        renew_time: Some(MicroTime(long_ago)),
        lease_transitions: Some(4),
        ..LeaseSpec::default()
    };
    leases
        .create(
            &PostParams::default(),
            &with_unowned("kept", BTreeMap::new(), spec),
        )
        .await
        .unwrap();
    assert_unowned_kept(&leases, "kept", "created (the gate keeps the spec fields)").await;

    // Acquire the expired Lease.
    let shutdown = CancellationToken::new();
    let elector = short_lease_elector(&client, ns.name(), "kept", "kl-1");
    let leadership = tokio::time::timeout(PATIENCE, elector.become_leader(&shutdown))
        .await
        .expect("kl-1 acquires the expired Lease")
        .unwrap();
    let lease = assert_unowned_kept(&leases, "kept", "acquired (expired holder)").await;
    assert_eq!(
        lease.spec.as_ref().unwrap().holder_identity.as_deref(),
        Some("kl-1")
    );
    assert_eq!(lease.spec.as_ref().unwrap().lease_transitions, Some(5));

    // Renewals.
    let mut renewed = lease.spec.unwrap().renew_time;
    for i in 1..=3 {
        let lease = next_renewal(&leases, "kept", renewed).await;
        renewed = lease.spec.unwrap().renew_time;
        assert_unowned_kept(&leases, "kept", &format!("renewal {i}")).await;
    }
    assert!(leadership.is_leader());

    // Release.
    leadership.release().await.unwrap();
    let lease = assert_unowned_kept(&leases, "kept", "released").await;
    assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some(""));

    // Acquire the released Lease (no holder), renew once, release.
    let elector = short_lease_elector(&client, ns.name(), "kept", "kl-2");
    let leadership = tokio::time::timeout(PATIENCE, elector.become_leader(&shutdown))
        .await
        .expect("kl-2 acquires the released Lease")
        .unwrap();
    let lease = assert_unowned_kept(&leases, "kept", "acquired (released, no holder)").await;
    next_renewal(&leases, "kept", lease.spec.unwrap().renew_time).await;
    assert_unowned_kept(&leases, "kept", "renewal by kl-2").await;
    leadership.release().await.unwrap();
    assert_unowned_kept(&leases, "kept", "released by kl-2").await;
}

#[tokio::test]
async fn a_shard_lease_keeps_unowned_fields() {
    init_tracing();
    let cp = control_plane();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns.name());

    // The set's only shard Lease, released, with the set's labels and fields it does not own.
    let labels = [
        (SHARDS_LABEL.to_owned(), "set".to_owned()),
        (ROLE_LABEL.to_owned(), "shard".to_owned()),
    ]
    .into();
    let spec = LeaseSpec {
        holder_identity: Some(String::new()),
        lease_duration_seconds: Some(1),
        ..LeaseSpec::default()
    };
    leases
        .create(&PostParams::default(), &with_unowned("set-0", labels, spec))
        .await
        .unwrap();

    let shutdown = CancellationToken::new();
    let shards = Shards::new(client.clone(), "set", 1)
        .namespace(ns.name())
        .identity("kl-shards")
        .config(
            kube_leader::ShardsConfig::default().lease(
                LeaseConfig::default()
                    .lease_duration(LEASE)
                    .renew_deadline(RENEW)
                    .retry_period(RETRY),
            ),
        );
    let (held_tx, mut held_rx) = tokio::sync::mpsc::unbounded_channel();
    let s = shutdown.clone();
    let run = tokio::spawn(async move {
        shards
            .run(&s, |index, _term, lost| {
                let held = held_tx.clone();
                async move {
                    let _ = held.send(index);
                    lost.cancelled().await;
                }
            })
            .await
    });
    let index = tokio::time::timeout(PATIENCE, held_rx.recv())
        .await
        .expect("the shard is acquired")
        .unwrap();
    assert_eq!(index, 0);
    let lease = assert_unowned_kept(&leases, "set-0", "shard acquired").await;
    assert_eq!(
        lease.spec.as_ref().unwrap().holder_identity.as_deref(),
        Some("kl-shards")
    );
    let mut renewed = lease.spec.unwrap().renew_time;
    for i in 1..=3 {
        let lease = next_renewal(&leases, "set-0", renewed).await;
        renewed = lease.spec.unwrap().renew_time;
        assert_unowned_kept(&leases, "set-0", &format!("shard renewal {i}")).await;
    }
    shutdown.cancel();
    tokio::time::timeout(PATIENCE, run)
        .await
        .expect("the shard candidate stops")
        .unwrap()
        .unwrap();
    let lease = assert_unowned_kept(&leases, "set-0", "shard released").await;
    assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some(""));
}
