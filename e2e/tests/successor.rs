//! Preferred successors against a real control plane: a leader that steps down hands over to
//! the youngest live candidate; a stopping candidate never campaigns and withdraws its
//! registration; a preferred successor that does not come is waited for only briefly.
//!
//! Leader for life's candidates are Pod objects (no kubelet), created a second apart: a Pod's
//! `creationTimestamp` has whole seconds.

use kube_leader::internal::ForLifeExt as _;
use kube_leader_e2e::Tune;
use std::time::{Duration, Instant};

use k8s_openapi::{
    api::{
        coordination::v1::{Lease, LeaseSpec},
        core::v1::Pod,
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{
    api::{DeleteParams, ListParams, PostParams},
    Api, Client,
};
use kube_leader::{
    internal::labels::{CANDIDATE_FOR_LABEL, LOCK_KIND_LABEL, PREFERRED_HOLDER_ANNOTATION},
    internal::Environment,
    internal::LeaseRecord,
    Error, ForLife, Leadership, Successor,
};
use kube_leader_e2e::{init_tracing, short_lease_elector, wait_for};
use kube_leader_testenv::{bind_role, create_pod, rule, ControlPlane};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const SOON: Duration = Duration::from_secs(20);
/// How long a candidate that must not lead is watched.
const STILL_WAITING: Duration = Duration::from_secs(3);

type Campaign = JoinHandle<kube_leader::Result<Leadership>>;

/// The identities registered as candidates for `lock` (of `kind`).
async fn registered(client: &Client, ns: &str, lock: &str, kind: &str) -> Vec<String> {
    let selector = format!("{CANDIDATE_FOR_LABEL}={lock},{LOCK_KIND_LABEL}={kind}");
    let mut ids: Vec<String> = Api::<Lease>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|l| l.spec?.holder_identity)
        .collect();
    ids.sort();
    ids
}

/// Waits until the candidates registered for `lock` are `want`, and, where `maybe` is given,
/// perhaps that one too (a leader whose elector was dropped has withdrawn: it needs none).
async fn wait_registered(
    client: &Client,
    ns: &str,
    lock: &str,
    kind: &str,
    want: &[&str],
    maybe: Option<&str>,
) {
    let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    wait_for(&format!("registrations {want:?}"), SOON, || async {
        let mut now = registered(client, ns, lock, kind).await;
        now.retain(|id| Some(id.as_str()) != maybe);
        (now == want).then_some(())
    })
    .await;
}

fn lease_candidate(client: &Client, ns: &str, id: &str, shutdown: &CancellationToken) -> Campaign {
    let e = short_lease_elector(client, ns, "lock", id).tune(|c| c.successor_wait(Duration::from_secs(1)));
    let s = shutdown.clone();
    tokio::spawn(async move { e.become_leader(&s).await })
}

async fn lease_record(client: &Client, ns: &str) -> (LeaseRecord, Lease) {
    let l = Api::<Lease>::namespaced(client.clone(), ns)
        .get("lock")
        .await
        .unwrap();
    (LeaseRecord::from_lease(&l), l)
}

#[tokio::test]
async fn lease_leader_steps_down_to_the_youngest_candidate() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let shutdown = CancellationToken::new();
    let old = lease_candidate(&client, ns.name(), "old", &shutdown);
    let old = tokio::time::timeout(SOON, old).await.unwrap().unwrap().unwrap();
    // Registered in this order: "middle" is older than "young".
    let middle = lease_candidate(&client, ns.name(), "middle", &shutdown);
    wait_registered(&client, ns.name(), "lock", "Lease", &["middle"], Some("old")).await;
    let young = lease_candidate(&client, ns.name(), "young", &shutdown);
    wait_registered(
        &client,
        ns.name(),
        "lock",
        "Lease",
        &["middle", "young"],
        Some("old"),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let released = Instant::now();
    old.release().await.unwrap();
    let next = tokio::time::timeout(SOON, young)
        .await
        .expect("the youngest leads")
        .unwrap()
        .unwrap();
    eprintln!("release → youngest leads: {:?}", released.elapsed());
    assert_eq!(next.term().identity, "young");
    assert!(
        !middle.is_finished(),
        "the older candidate did not take the lease"
    );
    let (rec, lease) = lease_record(&client, ns.name()).await;
    assert_eq!(rec.holder.as_deref(), Some("young"));
    assert_eq!(rec.transitions, 1, "one transition: old → young");
    let annotations = lease.metadata.annotations.unwrap_or_default();
    assert!(
        !annotations.contains_key(PREFERRED_HOLDER_ANNOTATION),
        "the successor's takeover clears the preference: {annotations:?}"
    );

    // "young" steps down: "middle" is the youngest other candidate ("old", if still
    // registered, is older).
    next.release().await.unwrap();
    let third = tokio::time::timeout(SOON, middle)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(third.term().identity, "middle");
    third.release().await.unwrap();
    shutdown.cancel();
}

#[tokio::test]
async fn a_stopping_lease_candidate_withdraws_and_a_missing_successor_is_waited_for_briefly() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let shutdown = CancellationToken::new();
    let leader = lease_candidate(&client, ns.name(), "leader", &shutdown);
    let leader = tokio::time::timeout(SOON, leader)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let follower = lease_candidate(&client, ns.name(), "follower", &shutdown);
    let stopping_token = CancellationToken::new();
    let stopping = lease_candidate(&client, ns.name(), "stopping", &stopping_token);
    let maybe = Some("leader");
    wait_registered(
        &client,
        ns.name(),
        "lock",
        "Lease",
        &["follower", "stopping"],
        maybe,
    )
    .await;

    // A stopping candidate (its shutdown requested) withdraws before its campaign returns.
    stopping_token.cancel();
    let r = tokio::time::timeout(SOON, stopping).await.unwrap().unwrap();
    assert!(matches!(r, Err(Error::Cancelled { .. })), "{r:?}");
    let mut left = registered(&client, ns.name(), "lock", "Lease").await;
    left.retain(|id| id != "leader");
    assert_eq!(left, ["follower"], "withdrawn when its campaign returned");

    // A registration whose candidate never comes (it hung right after registering): younger
    // than everyone, live by its heartbeat. The release prefers it; "follower" defers for the
    // successor wait (1 s here) only, then takes the lease.
    let ghost = Lease {
        metadata: ObjectMeta {
            name: Some("lock-candidate-ghost".into()),
            labels: Some(
                [
                    (CANDIDATE_FOR_LABEL.to_string(), "lock".to_string()),
                    (LOCK_KIND_LABEL.to_string(), "Lease".to_string()),
                ]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("ghost".into()),
            acquire_time: Some(MicroTime(Timestamp::now())),
            renew_time: Some(MicroTime(Timestamp::now())),
            lease_duration_seconds: Some(45),
            ..LeaseSpec::default()
        }),
    };
    Api::<Lease>::namespaced(client.clone(), ns.name())
        .create(&PostParams::default(), &ghost)
        .await
        .unwrap();
    // The leader names its successor from its watch of the registrations: let the ghost's
    // event reach it (a registration made in the same instant as the release may be missed, and
    // on 1.37.2 the release once came first).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released = Instant::now();
    leader.release().await.unwrap();
    let (rec, lease) = lease_record(&client, ns.name()).await;
    let preferred = lease.metadata.annotations.unwrap_or_default()[PREFERRED_HOLDER_ANNOTATION].clone();
    assert!(
        preferred.ends_with(" ghost"),
        "the release prefers the youngest: {preferred}"
    );
    assert_eq!(rec.holder, None);
    let next = tokio::time::timeout(SOON, follower)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let gap = released.elapsed();
    eprintln!("release → a non-preferred candidate leads (the preferred one never came): {gap:?}");
    assert_eq!(next.term().identity, "follower");
    assert!(
        gap >= Duration::from_secs(1),
        "it deferred to the preferred successor first: {gap:?}"
    );
    next.release().await.unwrap();
    shutdown.cancel();
}

/// A leader stopped by its shutdown withdraws its registration after its release, not beside
/// it on the handover's path (only a leader names successors, so nobody could prefer it
/// meanwhile), and before `release` returns: the process may exit then and leaves nothing.
#[tokio::test]
async fn a_stopping_leader_withdraws_after_its_release() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let admin = cp.client().await;
    let user = cp.unused_user();
    let all = rule(&["coordination.k8s.io"], &["leases"], &["*"]);
    bind_role(&admin, ns.name(), &user, vec![all]).await.unwrap();
    let as_leader = cp.user_client(&user).await;
    let stop = CancellationToken::new();
    let leader = lease_candidate(&as_leader, ns.name(), "leader", &stop);
    let leader = tokio::time::timeout(SOON, leader)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let shutdown = CancellationToken::new();
    let follower = lease_candidate(&admin, ns.name(), "follower", &shutdown);
    wait_registered(&admin, ns.name(), "lock", "Lease", &["follower", "leader"], None).await;

    stop.cancel();
    leader.lost().await;
    leader.release().await.unwrap();
    assert_eq!(
        registered(&admin, ns.name(), "lock", "Lease").await,
        ["follower"],
        "withdrawn when release returned"
    );
    // The leader's requests in the order they completed: the release (an update of the lock)
    // before the withdrawal (a delete of its registration).
    let events = cp.audit_events(&user).unwrap();
    let completed: Vec<(String, String)> = events
        .into_iter()
        .filter(|e| e.stage == "ResponseComplete" && matches!(e.verb.as_str(), "update" | "delete"))
        .map(|e| (e.verb, e.name.unwrap_or_default()))
        .collect();
    let release = completed.iter().rposition(|(v, n)| v == "update" && n == "lock");
    let withdrawal = completed
        .iter()
        .position(|(v, n)| v == "delete" && n.starts_with("lock-candidate-"));
    assert!(
        matches!((release, withdrawal), (Some(r), Some(w)) if r < w),
        "the release first, then the withdrawal: {completed:?}"
    );
    let next = tokio::time::timeout(SOON, follower)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(next.term().identity, "follower");
    next.release().await.unwrap();
    shutdown.cancel();
}

/// A leader's requests for its lock's registrations, in the order they were answered: (verb,
/// request URI) of each allowed list and watch of Leases by the registrations' label.
fn registration_reads(cp: &ControlPlane, user: &str) -> Vec<(String, String)> {
    cp.audit_events(user)
        .unwrap()
        .into_iter()
        .filter(|e| e.resource.as_deref() == Some("leases") && e.name.is_none())
        .filter(|e| e.request_uri.contains("candidate-for"))
        .filter(|e| e.code.is_none_or(|c| c < 400))
        // A watch counts when it starts (its end, with the term, is no request), a list when
        // it is answered.
        .filter(|e| match e.verb.as_str() {
            "watch" => e.stage == "ResponseStarted",
            "list" => e.stage == "ResponseComplete",
            _ => false,
        })
        .map(|e| (e.verb, e.request_uri))
        .collect()
}

/// What a step-down showed: the leader's registration reads while it led and from its
/// release on, and who led next.
struct StepDown {
    leading: Vec<(String, String)>,
    stepping_down: Vec<(String, String)>,
    next: String,
}

/// The leader as a user with `rules` steps down while "middle" and the younger "young" wait.
async fn step_down_as(cp: &ControlPlane, rules: Vec<k8s_openapi::api::rbac::v1::PolicyRule>) -> StepDown {
    let ns = cp.namespace().await;
    let admin = cp.client().await;
    let user = cp.unused_user();
    bind_role(&admin, ns.name(), &user, rules).await.unwrap();
    let as_leader = cp.user_client(&user).await;
    let shutdown = CancellationToken::new();
    let leader = lease_candidate(&as_leader, ns.name(), "leader", &shutdown);
    let leader = tokio::time::timeout(SOON, leader)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let middle = lease_candidate(&admin, ns.name(), "middle", &shutdown);
    wait_registered(&admin, ns.name(), "lock", "Lease", &["leader", "middle"], None).await;
    let young = lease_candidate(&admin, ns.name(), "young", &shutdown);
    wait_registered(
        &admin,
        ns.name(),
        "lock",
        "Lease",
        &["leader", "middle", "young"],
        None,
    )
    .await;
    // The registration's event reaches the leader's watch within milliseconds.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let leading = registration_reads(cp, &user);
    leader.release().await.unwrap();
    let stepping_down = registration_reads(cp, &user).split_off(leading.len());
    let next = tokio::select! {
        l = young => l,
        l = middle => l,
    };
    let next = next.unwrap().unwrap();
    let id = next.term().identity.clone();
    next.release().await.unwrap();
    shutdown.cancel();
    StepDown {
        leading,
        stepping_down,
        next: id,
    }
}

/// A leader names its successor from one consistent list of the registrations made at
/// step-down (no `resourceVersion`: read once the API server's cache caught up with etcd), not
/// from its watch of them, which on a loaded API server lagged behind a new Pod's registration
/// and named an old Pod in a rollout. The watch (listed from the watch cache at the term's
/// start) is the fallback where the list fails. Without `watch` on Leases, the same.
#[tokio::test]
async fn a_leader_names_its_successor_from_a_consistent_list_at_step_down() {
    init_tracing();
    let cp = ControlPlane::shared();
    let all = rule(&["coordination.k8s.io"], &["leases"], &["*"]);
    let s = step_down_as(cp, vec![all]).await;
    // The watch's list at the term's start, from the watch cache (the API server's audit
    // shows a watch's start only once it has sent something).
    assert!(
        s.leading
            .iter()
            .any(|(v, uri)| v == "list" && uri.contains("resourceVersion=0")),
        "the leader's watch lists the registrations from the watch cache: {:?}",
        s.leading
    );
    let lists: Vec<_> = s.stepping_down.iter().filter(|(v, _)| v == "list").collect();
    assert_eq!(
        lists.len(),
        1,
        "one list of the registrations at step-down: {:?}",
        s.stepping_down
    );
    assert!(
        !lists[0].1.contains("resourceVersion="),
        "a consistent list, not the cache's: {lists:?}"
    );
    assert_eq!(s.next, "young", "the release named the youngest");

    // No `watch` on Leases but the lock's own (by name): the release lists the registrations.
    let mut named = rule(&["coordination.k8s.io"], &["leases"], &["get", "watch", "update"]);
    named.resource_names = Some(vec!["lock".into()]);
    let rest = rule(
        &["coordination.k8s.io"],
        &["leases"],
        &["create", "list", "patch", "delete"],
    );
    let s = step_down_as(cp, vec![named, rest]).await;
    assert!(
        s.stepping_down.iter().any(|(v, _)| v == "list"),
        "the step-down lists the registrations: {:?}",
        s.stepping_down
    );
    assert_eq!(s.next, "young", "the release named the youngest");
}

#[tokio::test]
async fn with_successor_any_nobody_registers_or_defers() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let shutdown = CancellationToken::new();
    let e = short_lease_elector(&client, ns.name(), "lock", "a").tune(|c| c.successor(Successor::Any));
    let a = e.become_leader(&shutdown).await.unwrap();
    assert!(registered(&client, ns.name(), "lock", "Lease").await.is_empty());
    a.release().await.unwrap();
    let (_, lease) = lease_record(&client, ns.name()).await;
    assert!(!lease
        .metadata
        .annotations
        .unwrap_or_default()
        .contains_key(PREFERRED_HOLDER_ANNOTATION));
}

fn for_life_candidate(client: &Client, ns: &str, pod: &str, shutdown: &CancellationToken) -> Campaign {
    let e = ForLife::new(client.clone(), "lock")
        .namespace(ns)
        .identity(pod)
        .environment(Environment::default())
        .config(
            kube_leader::ForLifeConfig::default()
                .backoff_cap(Duration::from_secs(2))
                .api_timeout(Duration::from_secs(5))
                .successor_wait(Duration::from_secs(1)),
        );
    let s = shutdown.clone();
    tokio::spawn(async move { e.become_leader(&s).await })
}

#[tokio::test]
async fn for_life_leader_steps_down_to_the_youngest_pod_and_a_going_pod_never_campaigns() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let shutdown = CancellationToken::new();
    for name in ["old", "middle", "young", "going"] {
        create_pod(&client, ns.name(), name).await.unwrap();
        // creationTimestamp has whole seconds.
        tokio::time::sleep(Duration::from_millis(1_100)).await;
    }
    let old = for_life_candidate(&client, ns.name(), "old", &shutdown);
    let old = tokio::time::timeout(SOON, old).await.unwrap().unwrap().unwrap();
    let middle = for_life_candidate(&client, ns.name(), "middle", &shutdown);
    let young = for_life_candidate(&client, ns.name(), "young", &shutdown);
    let going = for_life_candidate(&client, ns.name(), "going", &shutdown);
    let all = ["going", "middle", "young"];
    wait_registered(&client, ns.name(), "lock", "ConfigMap", &all, Some("old")).await;

    // The youngest Pod is deleted: it stops campaigning at once and withdraws its registration.
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    pods.delete("going", &DeleteParams::default()).await.unwrap();
    let r = tokio::time::timeout(SOON, going).await.unwrap().unwrap();
    assert!(matches!(r, Err(Error::Stopping { .. })), "{r:?}");
    wait_registered(
        &client,
        ns.name(),
        "lock",
        "ConfigMap",
        &["middle", "young"],
        Some("old"),
    )
    .await;

    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    old.release().await.unwrap();
    let next = tokio::time::timeout(SOON, young)
        .await
        .expect("the youngest leads")
        .unwrap()
        .unwrap();
    eprintln!("for life: release → youngest leads: {:?}", released.elapsed());
    assert_eq!(next.term().identity, "young");
    tokio::time::sleep(STILL_WAITING).await;
    assert!(!middle.is_finished(), "the older candidate did not take the lock");
    next.release().await.unwrap();
    let third = tokio::time::timeout(SOON, middle)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(third.term().identity, "middle");
    shutdown.cancel();
}

/// A follower with a Pod writes its registration once and then sends nothing while idle: its
/// registration lives as long as its Pod (the garbage collector) and its process (the
/// withdrawal). Only the leader renews its own, for its watch's pulse; a candidate without a
/// Pod (no owner to end its registration) keeps a heartbeat.
#[tokio::test]
async fn an_idle_follower_with_a_pod_sends_no_request_for_its_registration() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let admin = cp.client().await;
    let users = [cp.unused_user(), cp.unused_user(), cp.unused_user()];
    for user in &users {
        let rules = vec![rule(&["coordination.k8s.io"], &["leases"], &["*"])];
        bind_role(&admin, ns.name(), user, rules).await.unwrap();
    }
    let mut pods = Vec::new();
    for name in ["leader", "with-pod"] {
        let p = create_pod(&admin, ns.name(), name).await.unwrap();
        pods.push(kube_leader::CandidatePod::new(name, p.metadata.uid.unwrap()));
    }
    let shutdown = CancellationToken::new();
    let candidate = |user: &str, id: &str, pod: Option<kube_leader::CandidatePod>| {
        let (user, id, ns, s) = (
            user.to_string(),
            id.to_string(),
            ns.name().to_string(),
            shutdown.clone(),
        );
        tokio::spawn(async move {
            let client = cp.user_client(&user).await;
            let mut e = short_lease_elector(&client, &ns, "idle", &id);
            if let Some(pod) = pod {
                e = e.candidate_pod(pod);
            }
            e.become_leader(&s).await
        })
    };
    let leader = candidate(&users[0], "leader", Some(pods[0].clone()));
    let leader = tokio::time::timeout(SOON, leader)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let with_pod = candidate(&users[1], "with-pod", Some(pods[1].clone()));
    let without_pod = candidate(&users[2], "without-pod", None);
    wait_registered(
        &admin,
        ns.name(),
        "idle",
        "Lease",
        &["leader", "with-pod", "without-pod"],
        None,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await; // their watches synced
    let count = |u: &str| cp.request_count(u).unwrap();
    let before: Vec<usize> = users.iter().map(|u| count(u)).collect();
    // Longer than a heartbeat (15 s): a heartbeat would show.
    let window = kube_leader::internal::labels::REGISTRATION_HEARTBEAT + Duration::from_secs(3);
    tokio::time::sleep(window).await;
    let sent: Vec<usize> = users.iter().zip(&before).map(|(u, b)| count(u) - b).collect();
    eprintln!(
        "over {window:?}: leader {} requests, follower with a Pod {}, follower without one {}",
        sent[0], sent[1], sent[2]
    );
    assert_eq!(sent[1], 0, "an idle follower with a Pod must send no request");
    assert!(
        sent[2] >= 1,
        "a candidate without a Pod keeps its registration's heartbeat"
    );
    let patches = cp
        .audit_events(&users[0])
        .unwrap()
        .into_iter()
        .filter(|e| e.verb == "patch")
        .count();
    assert!(
        patches >= 1,
        "the leader renews its own registration while it leads"
    );
    assert!(!with_pod.is_finished() && !without_pod.is_finished());
    shutdown.cancel();
    drop(leader);
    let _ = (with_pod.await, without_pod.await);
}
