//! Leader for life against a real control plane (etcd, kube-apiserver, kube-controller-manager).
//!
//! There is no kubelet: Pod objects stand for candidates, and each candidate is a task in the
//! test's runtime that names its Pod with `pod_name`. Every test has its own namespace.
//!
//! Test Pods have a grace period of [`POD_GRACE_S`], so a leader Pod that ended without proof
//! that its containers stopped is taken over [`GRACE_PROOF`] after its end was seen.

#[path = "for_life/liveness.rs"]
mod liveness;
#[path = "for_life/proof.rs"]
mod proof;

use kube_leader::internal::ForLifeExt as _;
use kube_leader_e2e::Tune;
use std::{
    io::Write,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::future::select_all;
use k8s_openapi::{
    api::{
        core::v1::{ConfigMap, Event, Node, NodeCondition, NodeStatus, Pod},
        rbac::v1::Role,
    },
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};
use kube::{
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    Api, Client, ResourceExt,
};
use kube_leader::{
    internal::labels::{FENCING_TOKEN_ANNOTATION, HOLDER_ANNOTATION},
    internal::Environment,
    DeadLeaderPod, Error, ForLife, Leadership, LockRef, LossReason, OutsideCluster, Strategy,
};
use kube_leader_e2e::{init_tracing, wait_for};
use kube_leader_testenv::{
    bind_role, pod, rule, set_pod_condition, set_pod_phase, set_pod_phase_as, ControlPlane, TestNamespace,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Generous bound for anything that should happen "at once", on a loaded 2-core machine.
const SOON: Duration = Duration::from_secs(20);
/// How long a candidate that must not lead is watched before the test accepts that it waits.
const STILL_WAITING: Duration = Duration::from_secs(3);

/// The test Pods' `terminationGracePeriodSeconds`.
const POD_GRACE_S: i64 = 2;
/// When the grace proof holds after a leader Pod's end was seen: its grace (at least the
/// kubelet's minimum of 2 s) plus kube-leader's 2 s kill margin.
const GRACE_PROOF: Duration = Duration::from_secs(4);

/// A candidate's campaign: its Pod name, the outcome, and when it came.
type Campaign = JoinHandle<(String, kube_leader::Result<Leadership>, Instant)>;

/// A candidate for `lock` as Pod `pod`, with short backoff, isolated from the process
/// environment.
fn candidate(client: &Client, ns: &str, lock: &str, pod: &str) -> ForLife {
    ForLife::new(client.clone(), lock)
        .namespace(ns)
        .identity(pod)
        .environment(Environment::default())
        .config(
            kube_leader::ForLifeConfig::default()
                .backoff_cap(Duration::from_secs(2))
                .api_timeout(Duration::from_secs(5)),
        )
}

fn spawn(elector: ForLife, pod: &str, cancel: &CancellationToken) -> Campaign {
    let cancel = cancel.clone();
    let pod = pod.to_string();
    tokio::spawn(async move {
        let r = elector.become_leader(&cancel).await;
        (pod, r, Instant::now())
    })
}

/// Waits for the first campaign to end; it must have won. Returns it, when, and the others.
async fn first_leader(campaigns: Vec<Campaign>) -> (Leadership, Instant, Vec<Campaign>) {
    let (done, _, rest) = tokio::time::timeout(SOON, select_all(campaigns))
        .await
        .unwrap_or_else(|_| panic!("no leader within {SOON:?}"));
    let (pod, result, at) = done.expect("campaign task");
    let leadership = result.unwrap_or_else(|e| panic!("{pod} failed to become leader: {e}"));
    assert_eq!(leadership.term().identity.as_str(), pod);
    (leadership, at, rest)
}

/// When `leader` learns that it lost (its loss token fires), as seen by a task of its own.
fn loss_instant(leader: &Leadership) -> JoinHandle<Instant> {
    let lost = leader.lost_token();
    tokio::spawn(async move {
        lost.cancelled().await;
        Instant::now()
    })
}

/// A Node name for Pods whose graceful deletion must wait (no kubelet finishes it: the test
/// does, with a deletion of grace 0).
const NOWHERE: &str = "kube-leader-test-nowhere";

/// Releases `leader` as soon as its loss token fires, as the sidecar does once COMMAND stopped.
fn release_on_loss(leader: Leadership) -> JoinHandle<Instant> {
    tokio::spawn(async move {
        leader.lost_token().cancelled().await;
        let lost = Instant::now();
        leader.release().await.expect("the release");
        lost
    })
}

/// Asserts that none of `campaigns` ends within [`STILL_WAITING`].
async fn assert_still_waiting(campaigns: &[Campaign], what: &str) {
    tokio::time::sleep(STILL_WAITING).await;
    assert!(
        campaigns.iter().all(|c| !c.is_finished()),
        "{what}: a waiting candidate returned"
    );
}

async fn lock_object(client: &Client, ns: &str, lock: &str) -> Option<ConfigMap> {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(lock)
        .await
        .unwrap()
}

fn owner_uids(cm: &ConfigMap) -> Vec<String> {
    cm.owner_references().iter().map(|o| o.uid.clone()).collect()
}

async fn uid_of_pod(client: &Client, ns: &str, name: &str) -> String {
    Api::<Pod>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap()
        .uid()
        .unwrap()
}

async fn delete_pod_now(client: &Client, ns: &str, name: &str) {
    Api::<Pod>::namespaced(client.clone(), ns)
        .delete(name, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
}

/// A test Pod: [`POD_GRACE_S`] of grace, bound to `node` if given (a Node that need not exist:
/// a graceful deletion of a bound Pod waits for a kubelet, which the test plays).
fn test_pod(name: &str, node: Option<&str>) -> Pod {
    let mut p = pod(name);
    let spec = p.spec.as_mut().expect("the fixture has a spec");
    spec.termination_grace_period_seconds = Some(POD_GRACE_S);
    spec.node_name = node.map(str::to_string);
    p
}

async fn create_test_pod(client: &Client, ns: &str, p: &Pod) {
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), p)
        .await
        .unwrap();
}

async fn create_pods(client: &Client, ns: &str, names: &[&str]) {
    for name in names {
        create_test_pod(client, ns, &test_pod(name, None)).await;
    }
}

/// Checks that the lock is `leader`'s: single owner with its Pod's UID, annotations agree (the
/// fencing token is written just after the takeover, so it is waited for).
async fn assert_lock_held_by(client: &Client, ns: &str, lock: &str, leader: &Leadership) {
    let cm = lock_object(client, ns, lock).await.expect("the lock exists");
    let uid = uid_of_pod(client, ns, leader.term().identity.as_str()).await;
    assert_eq!(
        owner_uids(&cm),
        vec![uid],
        "the lock's single owner is the leader's Pod"
    );
    assert_eq!(
        cm.annotations().get(HOLDER_ANNOTATION).map(String::as_str),
        Some(leader.term().identity.as_str())
    );
    let token = leader.fencing_token().to_string();
    wait_for("the fencing token in the lock", SOON, || async {
        let cm = lock_object(client, ns, lock).await?;
        (cm.annotations().get(FENCING_TOKEN_ANNOTATION) == Some(&token)).then_some(())
    })
    .await;
}

/// Records what kube-leader logs on this test's thread (a `#[tokio::test]` runs every task on
/// it), to check what is logged, and how often.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// Runs `test` on a runtime of its own with the logs captured. The capturing subscriber
    /// stays the default until the runtime is gone, so that spans of tasks that outlive the
    /// test body are closed where they were opened.
    fn run<F, Fut>(test: F)
    where
        F: FnOnce(Logs) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let logs = Logs::default();
        let guard = logs.capture();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(test(logs.clone()));
        drop(runtime);
        drop(guard);
    }

    fn capture(&self) -> tracing::subscriber::DefaultGuard {
        let logs = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter("kube_leader=debug")
            .with_ansi(false)
            .with_writer(move || logs.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    fn count(&self, needle: &str) -> usize {
        self.text().lines().filter(|l| l.contains(needle)).count()
    }
}

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct Setup {
    cp: &'static ControlPlane,
    ns: TestNamespace,
    admin: Client,
}

async fn setup() -> Setup {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let admin = cp.client().await;
    Setup { cp, ns, admin }
}

#[tokio::test]
async fn three_candidates_one_leader_then_pod_deletion_elects_exactly_one() {
    init_tracing();
    let Setup { ns, admin, .. } = setup().await;
    let ns = ns.name();
    create_pods(&admin, ns, &["a", "b", "c"]).await;
    let cancel = CancellationToken::new();
    let campaigns = ["a", "b", "c"]
        .iter()
        .map(|p| spawn(candidate(&admin, ns, "lock", p), p, &cancel))
        .collect();

    let (first, _, rest) = first_leader(campaigns).await;
    assert_eq!(first.term().strategy, Strategy::ForLife);
    assert!(!first.is_skipped());
    assert_lock_held_by(&admin, ns, "lock", &first).await;
    assert_still_waiting(&rest, "while the first leader's Pod lives").await;

    // The acquisition was recorded as an Event on the lock.
    let events = Api::<Event>::namespaced(admin.clone(), ns);
    wait_for("an Event on the lock", SOON, || async {
        let list = events.list(&ListParams::default()).await.unwrap();
        list.items
            .iter()
            .any(|e| {
                e.involved_object.name.as_deref() == Some("lock")
                    && e.reason.as_deref() == Some("LeaderElection")
                    && e.message
                        .as_deref()
                        .is_some_and(|m| m.contains(first.term().identity.as_str()))
            })
            .then_some(())
    })
    .await;

    // The leader's Pod is deleted: exactly one other takes over, the old one learns it.
    let first_lost = loss_instant(&first);
    let deleted = Instant::now();
    delete_pod_now(&admin, ns, first.term().identity.as_str()).await;
    let (second, won, rest) = first_leader(rest).await;
    eprintln!("pod deletion -> new leader: {:?}", won - deleted);
    // The old leader (its process still runs: no kubelet here) steps down on its Pod's
    // deletion, before the garbage collector deletes its lock and a successor can lead.
    let lost_at = tokio::time::timeout(SOON, first_lost)
        .await
        .expect("the old leader learns it lost")
        .unwrap();
    assert!(
        lost_at < won,
        "the old leader stopped {:?} after the new one started",
        lost_at - won
    );
    eprintln!("pod deletion -> old leader stops: {:?}", lost_at - deleted);
    assert_ne!(second.term().identity.as_str(), first.term().identity.as_str());
    assert!(
        second.fencing_token() > first.fencing_token(),
        "the fencing token grows"
    );
    assert!(
        matches!(
            first.loss_reason(),
            Some(LossReason::PodEnding { ref why }) if why == "was deleted" || why == "is being deleted"
        ),
        "{:?}",
        first.loss_reason()
    );
    assert_lock_held_by(&admin, ns, "lock", &second).await;
    assert_still_waiting(&rest, "after the takeover").await;
    cancel.cancel();
}

#[tokio::test]
async fn a_restarted_leader_with_the_same_pod_continues_and_release_deletes_the_lock() {
    init_tracing();
    let Setup { ns, admin, .. } = setup().await;
    let ns = ns.name();
    create_pods(&admin, ns, &["a"]).await;
    let cancel = CancellationToken::new();

    let first = candidate(&admin, ns, "lock", "a")
        .become_leader(&cancel)
        .await
        .unwrap();
    let token = first.fencing_token();
    let lock_uid = lock_object(&admin, ns, "lock").await.unwrap().uid();
    // "The process exits": the handle goes, the lock stays (it goes with the Pod).
    drop(first);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        lock_object(&admin, ns, "lock").await.unwrap().uid(),
        lock_uid,
        "dropping keeps the lock"
    );

    let started = Instant::now();
    let again = candidate(&admin, ns, "lock", "a")
        .become_leader(&cancel)
        .await
        .unwrap();
    eprintln!("restart -> continuing as leader: {:?}", started.elapsed());
    assert_eq!(again.fencing_token(), token, "same term, same token");
    assert_eq!(lock_object(&admin, ns, "lock").await.unwrap().uid(), lock_uid);
    assert!(again.is_leader());

    // Explicit step-down deletes the lock.
    again.release().await.unwrap();
    assert!(
        lock_object(&admin, ns, "lock").await.is_none(),
        "release deletes the lock"
    );
}

#[tokio::test]
async fn a_pod_recreated_under_the_same_name_does_not_continue_and_there_is_one_leader() {
    init_tracing();
    let Setup { ns, admin, .. } = setup().await;
    let ns = ns.name();
    create_pods(&admin, ns, &["a", "b"]).await;
    let cancel = CancellationToken::new();

    let old = candidate(&admin, ns, "lock", "a")
        .become_leader(&cancel)
        .await
        .unwrap();
    let old_uid = uid_of_pod(&admin, ns, "a").await;
    let b = spawn(candidate(&admin, ns, "lock", "b"), "b", &cancel);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A StatefulSet-style replacement: same name, new UID, at once.
    let old_lost = loss_instant(&old);
    delete_pod_now(&admin, ns, "a").await;
    create_pods(&admin, ns, &["a"]).await;
    let new_uid = uid_of_pod(&admin, ns, "a").await;
    assert_ne!(new_uid, old_uid);
    let a = spawn(candidate(&admin, ns, "lock", "a"), "a", &cancel);

    let (winner, won, rest) = first_leader(vec![a, b]).await;
    let lost_at = tokio::time::timeout(SOON, old_lost)
        .await
        .expect("the old Pod's leadership ends")
        .unwrap();
    assert!(lost_at < won, "the old leader stopped after the new one started");
    assert!(
        matches!(old.loss_reason(), Some(LossReason::PodEnding { .. })),
        "{:?}",
        old.loss_reason()
    );
    assert!(
        winner.fencing_token() > old.fencing_token(),
        "a new term, not a continued one"
    );
    assert_lock_held_by(&admin, ns, "lock", &winner).await;
    let owner = owner_uids(&lock_object(&admin, ns, "lock").await.unwrap());
    assert_ne!(owner, vec![old_uid.clone()]);
    assert_still_waiting(&rest, "after the new Pod's election").await;
    tokio::time::timeout(SOON, old.lost())
        .await
        .expect("the old Pod's leadership ends");
    // And stays single: the lock is still the winner's once the garbage collector is done.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_lock_held_by(&admin, ns, "lock", &winner).await;
    assert!(winner.is_leader());
    cancel.cancel();
}

/// A leader Pod set terminal by a status write while its process (the candidate) still runs,
/// and does not release: a waiting candidate takes over once the Pod's grace has passed since it
/// saw the terminal phase, without anybody deleting the Pod, and the Pod itself is deleted only
/// as the policy says.
async fn dead_leader(phase: &str, reason: Option<&str>, policy: DeadLeaderPod, pod_deleted: bool) {
    init_tracing();
    let Setup { ns, admin, .. } = setup().await;
    let ns = ns.name();
    create_pods(&admin, ns, &["a", "b"]).await;
    let cancel = CancellationToken::new();
    let a = candidate(&admin, ns, "lock", "a")
        .tune(|c| c.dead_leader_pod(policy))
        .become_leader(&cancel)
        .await
        .unwrap();
    let b = spawn(
        candidate(&admin, ns, "lock", "b").tune(|c| c.dead_leader_pod(policy)),
        "b",
        &cancel,
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!b.is_finished());

    let a_lost = loss_instant(&a);
    let terminated = Instant::now();
    set_pod_phase(&admin, ns, "a", phase, reason).await.unwrap();
    let (b, won, _) = first_leader(vec![b]).await;
    eprintln!("{phase}/{reason:?} -> new leader: {:?}", won - terminated);
    // The leader's process still runs and has not released the lock: only the Pod's grace
    // since its terminal phase was seen proves that its containers are gone.
    assert!(
        won - terminated >= GRACE_PROOF,
        "{phase}/{reason:?}: taken over {:?} after the terminal phase, before the grace proof ({GRACE_PROOF:?})",
        won - terminated
    );
    assert_eq!(b.term().identity, "b");
    assert_lock_held_by(&admin, ns, "lock", &b).await;
    // A leader whose Pod is terminal steps down at once (here its process still runs).
    let lost_at = tokio::time::timeout(SOON, a_lost)
        .await
        .expect("the dead leader's loss fires")
        .unwrap();
    assert!(lost_at < won, "the old leader stopped after the new one started");
    let why = match reason {
        Some(r) => format!("is in phase {phase} ({r})"),
        None => format!("is in phase {phase}"),
    };
    assert_eq!(a.loss_reason(), Some(LossReason::PodEnding { why }));

    let pods = Api::<Pod>::namespaced(admin.clone(), ns);
    if pod_deleted {
        wait_for("the dead leader Pod is deleted", SOON, || async {
            pods.get_opt("a")
                .await
                .unwrap()
                .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
                .then_some(())
        })
        .await;
    } else {
        let a = pods
            .get_opt("a")
            .await
            .unwrap()
            .expect("the dead leader Pod is kept");
        assert!(a.metadata.deletion_timestamp.is_none());
    }
    cancel.cancel();
}

#[tokio::test]
async fn an_evicted_leader_is_replaced_and_its_pod_deleted() {
    dead_leader("Failed", Some("Evicted"), DeadLeaderPod::DeleteEvicted, true).await;
}

#[tokio::test]
async fn a_preempted_leader_is_replaced_and_its_pod_kept_by_default() {
    dead_leader("Failed", Some("Preempting"), DeadLeaderPod::DeleteEvicted, false).await;
}

#[tokio::test]
async fn a_succeeded_leader_is_replaced() {
    dead_leader("Succeeded", None, DeadLeaderPod::DeleteEvicted, false).await;
}

#[tokio::test]
async fn a_failed_leader_pod_is_deleted_with_delete_terminal() {
    dead_leader(
        "Failed",
        Some("NodeShutdown"),
        DeadLeaderPod::DeleteTerminal,
        true,
    )
    .await;
}

#[tokio::test]
async fn a_lock_deleted_or_replaced_by_an_admin_ends_leadership() {
    init_tracing();
    let Setup { ns, admin, .. } = setup().await;
    let ns = ns.name();
    create_pods(&admin, ns, &["a", "b"]).await;
    let cancel = CancellationToken::new();
    let configmaps = Api::<ConfigMap>::namespaced(admin.clone(), ns);

    let a = candidate(&admin, ns, "lock", "a")
        .become_leader(&cancel)
        .await
        .unwrap();
    let lost = a.lost_token();
    let b = spawn(candidate(&admin, ns, "lock", "b"), "b", &cancel);
    tokio::time::sleep(Duration::from_millis(500)).await;

    let deleted = Instant::now();
    configmaps.delete("lock", &DeleteParams::default()).await.unwrap();
    tokio::time::timeout(SOON, lost.cancelled())
        .await
        .expect("the loss token fires");
    eprintln!("lock deletion -> loss token: {:?}", deleted.elapsed());
    assert_eq!(a.loss_reason(), Some(LossReason::LockDeleted));
    assert!(!a.is_leader());
    // Safety IV: a's work may still run (until the user's code has stopped it), so b waits for
    // a's word; before, b led at once beside it.
    let b = [b];
    assert_still_waiting(&b, "a lock deleted under a live leader").await;
    let [b] = b;
    let released = Instant::now();
    a.release().await.unwrap();
    let (b, won, _) = first_leader(vec![b]).await;
    eprintln!(
        "lock deletion -> loss; the old leader's release -> new leader: {:?}",
        won - released
    );
    let lock = lock_object(&admin, ns, "lock").await.expect("b's lock");
    assert_eq!(lock.owner_references()[0].name, "b");

    // Replaced in place: somebody rewrites the owner.
    let a_uid = uid_of_pod(&admin, ns, "a").await;
    let patch = serde_json::json!({
        "metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "a", "uid": a_uid}]}
    });
    configmaps
        .patch("lock", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let reason = tokio::time::timeout(SOON, b.lost())
        .await
        .expect("the loss fires");
    assert_eq!(
        reason,
        LossReason::LockReplaced {
            holder: Some("a".into())
        }
    );
    cancel.cancel();
}

/// Creates a lock with the given owners; returns its UID.
async fn malformed_lock(admin: &Client, ns: &str, owners: Vec<OwnerReference>) -> String {
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some("lock".into()),
            owner_references: Some(owners),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap()
        .uid()
        .unwrap()
}

fn owner(api_version: &str, kind: &str, name: &str, uid: String) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: name.into(),
        uid,
        ..Default::default()
    }
}

/// Candidates wait on a malformed lock, say why once, and never take it; once it is deleted
/// they elect at once.
async fn malformed(logs: Logs, case: &str, why: &str) {
    let Setup { ns, admin, .. } = setup().await;
    let ns = ns.name();
    create_pods(&admin, ns, &["a", "b", "x", "y"]).await;
    let pod = |name: &'static str| {
        let admin = admin.clone();
        async move { owner("v1", "Pod", name, uid_of_pod(&admin, ns, name).await) }
    };
    let owners = match case {
        "no owner" => vec![],
        "two owners" => vec![pod("x").await, pod("y").await],
        "not a pod" => {
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some("owner".into()),
                    ..Default::default()
                },
                ..Default::default()
            };
            let cm = Api::<ConfigMap>::namespaced(admin.clone(), ns)
                .create(&PostParams::default(), &cm)
                .await
                .unwrap();
            vec![owner("v1", "ConfigMap", "owner", cm.uid().unwrap())]
        }
        _ => unreachable!(),
    };
    let uid = malformed_lock(&admin, ns, owners.clone()).await;
    let cancel = CancellationToken::new();
    let campaigns: Vec<Campaign> = ["a", "b"]
        .iter()
        .map(|p| spawn(candidate(&admin, ns, "lock", p), p, &cancel))
        .collect();
    assert_still_waiting(&campaigns, case).await;
    let cm = lock_object(&admin, ns, "lock")
        .await
        .expect("the malformed lock is still there");
    assert_eq!(cm.uid().unwrap(), uid, "{case}: the lock was not replaced");
    assert_eq!(cm.owner_references(), owners.as_slice());
    let said = logs.count(why);
    assert_eq!(said, 2, "{case}: each candidate says why once:\n{}", logs.text());

    Api::<ConfigMap>::namespaced(admin.clone(), ns)
        .delete("lock", &DeleteParams::default())
        .await
        .unwrap();
    let (leader, _, _) = first_leader(campaigns).await;
    assert_lock_held_by(&admin, ns, "lock", &leader).await;
    cancel.cancel();
}

#[test]
fn a_lock_without_owner_is_never_taken() {
    Logs::run(|logs| malformed(logs, "no owner", "the lock has no owner reference"));
}

#[test]
fn a_lock_with_two_owners_is_never_taken() {
    Logs::run(|logs| malformed(logs, "two owners", "the lock has 2 owner references"));
}

#[test]
fn a_lock_owned_by_something_else_is_never_taken() {
    Logs::run(|logs| {
        malformed(
            logs,
            "not a pod",
            "the lock's owner is ConfigMap owner (v1), not a v1 Pod",
        )
    });
}

#[tokio::test]
async fn outside_a_pod_the_election_is_skipped_or_fails_and_errors_are_clear() {
    init_tracing();
    let Setup { ns, admin, .. } = setup().await;
    let ns = ns.name();
    let cancel = CancellationToken::new();
    // No namespace anywhere: not in a cluster.
    let outside = ForLife::new(admin.clone(), "lock").environment(Environment::default());
    let skipped = outside.clone().become_leader(&cancel).await.unwrap();
    assert!(skipped.is_skipped());
    assert!(skipped.is_leader());
    assert_eq!(skipped.fencing_token(), 0);
    let err = outside
        .tune(|c| c.outside_cluster(OutsideCluster::Fail))
        .become_leader(&cancel)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NoNamespace { .. }), "{err:?}");

    // The namespace from the environment, but no Pod name.
    let env = Environment {
        pod_namespace: Some(ns.to_string()),
        ..Environment::default()
    };
    let err = ForLife::new(admin.clone(), "lock")
        .environment(env.clone())
        .become_leader(&cancel)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NoPodName), "{err:?}");
    assert!(err.to_string().contains("POD_NAME"), "{err}");

    // A Pod name that names no Pod.
    let env = Environment {
        pod_name: Some("ghost".into()),
        ..env
    };
    let err = ForLife::new(admin.clone(), "lock")
        .environment(env)
        .become_leader(&cancel)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::OwnPodNotFound { name, .. } if name == "ghost"),
        "{err:?}"
    );

    // A lock name that is not a DNS-1123 subdomain.
    let err = candidate(&admin, ns, "Bad_Name", "ghost")
        .become_leader(&cancel)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidLockName { .. }), "{err:?}");
    assert!(
        lock_object(&admin, ns, "lock").await.is_none(),
        "nothing was created"
    );
}

/// The lock the shipped Role is limited to (`resourceNames`).
const DEMO_LOCK: &str = "kube-leader-demo";

/// The Role shipped in deploy/for-life/rbac-for-life.yaml, as `kubectl kustomize deploy/for-life`
/// builds it (its lock, `$(KUBE_LEADER_LOCK)`, is the Deployment's name: [`DEMO_LOCK`]).
fn example_role(cp: &ControlPlane) -> Role {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/for-life");
    let out = cp.kubectl().args(["kustomize", dir]).output().unwrap();
    assert!(
        out.status.success(),
        "kubectl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let built = String::from_utf8(out.stdout).unwrap();
    let doc = built
        .split("\n---\n")
        .find(|doc| doc.lines().any(|l| l == "kind: Role"))
        .expect("a Role in deploy/for-life");
    let json = cp
        .kubectl_with_stdin(&["create", "--dry-run=client", "-o", "json", "-f", "-"], doc)
        .unwrap();
    let role: serde_json::Value = serde_json::from_str(&json).unwrap();
    serde_json::from_value(role).unwrap()
}

async fn grant(
    cp: &ControlPlane,
    admin: &Client,
    ns: &str,
    user: &str,
    rules: Vec<k8s_openapi::api::rbac::v1::PolicyRule>,
) {
    bind_role(admin, ns, user, rules).await.unwrap();
    let configmaps = Api::<ConfigMap>::namespaced(cp.user_client(user).await, ns);
    let pods = Api::<Pod>::namespaced(cp.user_client(user).await, ns);
    // A Role may grant reading ConfigMaps by name only: then reading Pods shows it took effect.
    wait_for("the Role takes effect", SOON, || async {
        (configmaps.get_opt("probe").await.is_ok() || pods.get_opt("probe").await.is_ok()).then_some(())
    })
    .await;
}

#[test]
fn a_user_with_only_the_example_role_can_elect() {
    Logs::run(restricted_user_elects);
}

async fn restricted_user_elects(logs: Logs) {
    let Setup { cp, ns, admin } = setup().await;
    let ns = ns.name();
    let user = "user-1";
    let role = example_role(cp);
    grant(cp, &admin, ns, user, role.rules.unwrap()).await;
    let client = cp.user_client(user).await;

    // The leader's Pod pretends to run on a Node, so that b's opt-in NotReady check reads it:
    // the example Role does not allow that, which must disable the check with one warning.
    let a_pod = test_pod("a", Some(&format!("{ns}-node")));
    Api::<Pod>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &a_pod)
        .await
        .unwrap();
    create_pods(&admin, ns, &["b"]).await;

    let cancel = CancellationToken::new();
    let a = candidate(&client, ns, DEMO_LOCK, "a")
        .become_leader(&cancel)
        .await
        .unwrap();
    let b = spawn(
        candidate(&client, ns, DEMO_LOCK, "b").tune(|c| c.not_ready_takeover(Duration::from_millis(500))),
        "b",
        &cancel,
    );
    assert_still_waiting(std::slice::from_ref(&b), "the NotReady check is disabled").await;
    assert_eq!(
        logs.count("cannot read Nodes"),
        1,
        "one warning:\n{}",
        logs.text()
    );

    delete_pod_now(&admin, ns, "a").await;
    let (b, _, _) = first_leader(vec![b]).await;
    assert_lock_held_by(&admin, ns, DEMO_LOCK, &b).await;
    tokio::time::timeout(SOON, a.lost())
        .await
        .expect("the old leader learns it");
    let events = Api::<Event>::namespaced(admin.clone(), ns);
    wait_for("b's Event", SOON, || async {
        let list = events.list(&ListParams::default()).await.unwrap();
        list.items
            .iter()
            .any(|e| {
                e.message
                    .as_deref()
                    .is_some_and(|m| m.starts_with("b became leader"))
            })
            .then_some(())
    })
    .await;
    b.release().await.unwrap();
    assert!(lock_object(&admin, ns, DEMO_LOCK).await.is_none());

    // Nothing the election did was refused, except reading the Node (and the probes that
    // waited for the Role to take effect).
    let refused: Vec<_> = cp
        .audit_events(user)
        .unwrap()
        .into_iter()
        .filter(|e| e.code == Some(403) && e.namespace.is_some() && e.name.as_deref() != Some("probe"))
        .collect();
    assert!(refused.is_empty(), "refused requests: {refused:#?}");
    cancel.cancel();
}

#[tokio::test]
async fn a_role_lacking_a_permission_is_named_in_the_error() {
    init_tracing();
    let Setup { cp, ns, admin } = setup().await;
    let ns = ns.name();
    create_pods(&admin, ns, &["a"]).await;
    let cancel = CancellationToken::new();

    let no_create = vec![
        rule(
            &[""],
            &["configmaps"],
            &["get", "list", "watch", "update", "delete"],
        ),
        rule(&[""], &["pods"], &["get", "list", "watch", "delete"]),
        rule(&[""], &["events"], &["create"]),
    ];
    grant(cp, &admin, ns, "user-2", no_create).await;
    let err = candidate(&cp.user_client("user-2").await, ns, "lock", "a")
        .become_leader(&cancel)
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Forbidden { .. }), "{err:?}");
    assert!(
        msg.contains(&format!(
            "missing permission: create configmaps in namespace {ns}"
        )),
        "{msg}"
    );
    assert!(msg.contains("kube-leader rbac --strategy for-life"), "{msg}");

    let no_pods = vec![rule(
        &[""],
        &["configmaps"],
        &["get", "list", "watch", "create", "update", "delete"],
    )];
    grant(cp, &admin, ns, "user-3", no_pods).await;
    let err = candidate(&cp.user_client("user-3").await, ns, "lock", "a")
        .become_leader(&cancel)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("missing permission: get pods in namespace {ns}")),
        "{err}"
    );
    assert!(
        lock_object(&admin, ns, "lock").await.is_none(),
        "nothing was created"
    );
}

#[tokio::test]
async fn cancelling_a_waiting_candidate_returns_promptly() {
    init_tracing();
    let Setup { ns, admin, .. } = setup().await;
    let ns = ns.name();
    create_pods(&admin, ns, &["a", "b"]).await;
    let cancel = CancellationToken::new();
    let _a = candidate(&admin, ns, "lock", "a")
        .become_leader(&cancel)
        .await
        .unwrap();
    let b_cancel = CancellationToken::new();
    let b = spawn(candidate(&admin, ns, "lock", "b"), "b", &b_cancel);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!b.is_finished());

    let cancelled = Instant::now();
    b_cancel.cancel();
    let (_, result, at) = tokio::time::timeout(SOON, b).await.unwrap().unwrap();
    let took = at - cancelled;
    eprintln!("cancel -> return: {took:?}");
    assert!(matches!(result, Err(Error::Cancelled { .. })), "{result:?}");
    assert!(took < Duration::from_secs(1), "took {took:?}");
}

#[tokio::test]
async fn a_leader_on_a_not_ready_node_is_replaced_only_by_opt_in() {
    init_tracing();
    let Setup { ns, admin, .. } = setup().await;
    let ns = ns.name();
    let node_name = format!("{ns}-node");
    let nodes = Api::<Node>::all(admin.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(node_name.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let status = NodeStatus {
        conditions: Some(vec![NodeCondition {
            type_: "Ready".into(),
            status: "Unknown".into(),
            reason: Some("NodeStatusUnknown".into()),
            ..Default::default()
        }]),
        ..Default::default()
    };
    let patch = serde_json::json!({ "status": status });
    nodes
        .patch_status(&node_name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();

    let a_pod = test_pod("a", Some(&node_name));
    Api::<Pod>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &a_pod)
        .await
        .unwrap();
    create_pods(&admin, ns, &["b", "c"]).await;
    let cancel = CancellationToken::new();
    let a = candidate(&admin, ns, "lock", "a")
        .become_leader(&cancel)
        .await
        .unwrap();

    // By default: never.
    let c = spawn(candidate(&admin, ns, "lock", "c"), "c", &cancel);
    assert_still_waiting(
        std::slice::from_ref(&c),
        "the default never takes over from a NotReady Node",
    )
    .await;

    // Opted in, after the grace by b's own clock.
    let grace = Duration::from_secs(1);
    let started = Instant::now();
    let b = spawn(
        candidate(&admin, ns, "lock", "b").tune(|c| c.not_ready_takeover(grace)),
        "b",
        &cancel,
    );
    // b deletes the stale lock; whichever waiting candidate re-creates it first leads (c,
    // watching the lock, may win that race).
    let (b, won, rest) = first_leader(vec![b, c]).await;
    assert!(
        ["b", "c"].contains(&b.term().identity.as_str()),
        "{}",
        b.term().identity.as_str()
    );
    assert!(
        won - started >= grace,
        "took over after {:?}, before the grace",
        won - started
    );
    assert_lock_held_by(&admin, ns, "lock", &b).await;
    tokio::time::timeout(SOON, a.lost())
        .await
        .expect("the old leader learns it, if it can");
    assert_still_waiting(&rest, "the other waits").await;
    nodes.delete(&node_name, &DeleteParams::default()).await.ok();
    cancel.cancel();
}

#[tokio::test]
async fn followers_can_read_and_watch_the_leader() {
    init_tracing();
    let Setup { ns, admin, .. } = setup().await;
    let ns = ns.name();
    create_pods(&admin, ns, &["a"]).await;
    let lock = LockRef::new(ns, "lock").unwrap();
    assert_eq!(
        kube_leader::internal::leader::for_life_current(admin.clone(), &lock)
            .await
            .unwrap(),
        None
    );
    let mut watch = kube_leader::internal::leader::for_life_watch(admin.clone(), lock.clone());

    let cancel = CancellationToken::new();
    let a = candidate(&admin, ns, "lock", "a")
        .become_leader(&cancel)
        .await
        .unwrap();
    let info = kube_leader::internal::leader::for_life_current(admin.clone(), &lock)
        .await
        .unwrap()
        .expect("a leader");
    assert_eq!(info.holder.as_deref(), Some("a"));
    assert_eq!(info.fencing_token, Some(a.fencing_token()));
    assert_eq!(info.strategy, Strategy::ForLife);
    let seen = tokio::time::timeout(
        SOON,
        watch.wait_for(|i| {
            i.as_ref()
                .is_some_and(|i| i.fencing_token == Some(a.fencing_token()))
        }),
    )
    .await
    .expect("the watch sees the leader")
    .unwrap()
    .clone();
    assert_eq!(seen.unwrap().holder.as_deref(), Some("a"));
    a.release().await.unwrap();
    tokio::time::timeout(SOON, watch.wait_for(Option::is_none))
        .await
        .expect("the watch sees the release")
        .unwrap();
}

/// Failover times over many rounds, printed for the closing note (no timing assertion beyond a
/// sanity bound): from the admin deleting the lock, and from a graceful deletion of the leader's
/// Pod (the leader steps down and releases), to the waiting candidate's `become_leader`
/// returning.
#[tokio::test]
async fn failover_times_over_twelve_rounds() {
    init_tracing();
    let Setup { ns, admin, .. } = setup().await;
    let ns = ns.name();
    let configmaps = Api::<ConfigMap>::namespaced(admin.clone(), ns);
    let cancel = CancellationToken::new();
    let (mut by_lock, mut by_pod) = (vec![], vec![]);
    for round in 0..12 {
        let lock = format!("lock-{round}");
        let [a, b, c] = ["a", "b", "c"].map(|p| format!("{p}-{round}"));
        create_pods(&admin, ns, &[&a, &c]).await;
        create_test_pod(&admin, ns, &test_pod(&b, Some(NOWHERE))).await;
        let leader = candidate(&admin, ns, &lock, &a)
            .become_leader(&cancel)
            .await
            .unwrap();

        // The lock is deleted (an admin): the leader stops its work and releases (the sidecar
        // does so once COMMAND has stopped), and b, which waits for that word, takes over.
        let waiting = spawn(candidate(&admin, ns, &lock, &b), &b, &cancel);
        tokio::time::sleep(Duration::from_millis(700)).await;
        let t0 = Instant::now();
        let releasing = release_on_loss(leader);
        configmaps.delete(&lock, &DeleteParams::default()).await.unwrap();
        let (second, won, _) = first_leader(vec![waiting]).await;
        by_lock.push(won - t0);
        releasing.await.unwrap();

        // The leader's Pod is deleted (gracefully: it is bound to a Node): the leader steps
        // down and releases, as the sidecar does once COMMAND has stopped; c takes over.
        let waiting = spawn(candidate(&admin, ns, &lock, &c), &c, &cancel);
        tokio::time::sleep(Duration::from_millis(700)).await;
        let t0 = Instant::now();
        let releasing = release_on_loss(second);
        Api::<Pod>::namespaced(admin.clone(), ns)
            .delete(&b, &DeleteParams::default())
            .await
            .unwrap();
        let (third, won, _) = first_leader(vec![waiting]).await;
        by_pod.push(won - t0);
        releasing.await.unwrap();
        delete_pod_now(&admin, ns, &b).await;
        drop(third);
    }
    let summary = |name: &str, v: &mut Vec<Duration>| {
        v.sort();
        eprintln!(
            "failover after {name} over {} rounds: min {:?}, p50 {:?}, p90 {:?}, max {:?}",
            v.len(),
            v[0],
            v[v.len() / 2],
            v[v.len() * 9 / 10],
            v[v.len() - 1]
        );
        assert!(v[v.len() - 1] < SOON, "{name}: {v:?}");
    };
    summary("lock deletion", &mut by_lock);
    summary("pod deletion", &mut by_pod);
    cancel.cancel();
}
