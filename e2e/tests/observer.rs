//! The library's hooks, both strategies, on the real control plane: client-go's
//! `LeaderElection` Events on the lock ("X became leader", "X stopped leading", with the lock's
//! UID so that `kubectl describe` shows them), and the observer (terms, renewals, their end).

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{ConfigMap, Event},
};
use kube::{api::ListParams, Api, Client};
use kube_leader::internal::ForLifeExt as _;
use kube_leader::{
    internal::labels::EVENT_REASON as REASON,
    internal::Environment,
    observer::{Observation, Observer},
    ForLife, LeaseElector, LossReason, Strategy,
};
use kube_leader_testenv::{create_pod, ControlPlane};
use tokio_util::sync::CancellationToken;

const SOON: Duration = Duration::from_secs(30);

/// Collects observations.
#[derive(Debug, Clone, Default)]
struct Seen(Arc<Mutex<Vec<Observation>>>);

impl Seen {
    fn observer(&self) -> impl Observer {
        let seen = self.0.clone();
        move |o: &Observation| seen.lock().unwrap().push(o.clone())
    }

    fn all(&self) -> Vec<Observation> {
        self.0.lock().unwrap().clone()
    }

    async fn wait_for(&self, what: &str, f: impl Fn(&Observation) -> bool) {
        let deadline = tokio::time::Instant::now() + SOON;
        while !self.all().iter().any(&f) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: not seen in {:#?}",
                self.all()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The `LeaderElection` Events on `lock` (name and UID), oldest first.
async fn events(client: &Client, ns: &str, lock: &str, uid: &str) -> Vec<String> {
    let list = Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default().fields(&format!("involvedObject.name={lock}")))
        .await
        .unwrap();
    let mut items: Vec<Event> = list
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(REASON))
        .collect();
    items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for e in &items {
        assert_eq!(e.involved_object.uid.as_deref(), Some(uid), "{e:?}");
        assert_eq!(e.type_.as_deref(), Some("Normal"));
    }
    items.into_iter().filter_map(|e| e.message).collect()
}

async fn wait_for_events(client: &Client, ns: &str, lock: &str, uid: &str, want: &[&str]) {
    let deadline = tokio::time::Instant::now() + SOON;
    loop {
        let got = events(client, ns, lock, uid).await;
        if got == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "Events on {lock}: {got:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn lease_records_client_go_events_and_reports_to_the_observer() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let seen = Seen::default();
    let elector = LeaseElector::new(client.clone(), "obs")
        .namespace(ns.name())
        .identity("cand-a")
        .observer(seen.observer())
        .config(
            kube_leader::LeaseConfig::default()
                .lease_duration(Duration::from_secs(2))
                .renew_deadline(Duration::from_secs(1))
                .retry_period(Duration::from_millis(200)),
        );
    let l = elector.become_leader(&CancellationToken::new()).await.unwrap();
    seen.wait_for("Leading", |o| {
        matches!(o, Observation::Leading { term } if term.identity == "cand-a" && term.strategy == Strategy::Lease)
    })
    .await;
    seen.wait_for("a renewal", |o| matches!(o, Observation::Renewed { .. }))
        .await;
    let uid = Api::<Lease>::namespaced(client.clone(), ns.name())
        .get("obs")
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    wait_for_events(&client, ns.name(), "obs", &uid, &["cand-a became leader"]).await;
    l.release().await.unwrap();
    seen.wait_for("Stopped", |o| {
        matches!(
            o,
            Observation::Stopped {
                reason: LossReason::Released,
                ..
            }
        )
    })
    .await;
    wait_for_events(
        &client,
        ns.name(),
        "obs",
        &uid,
        &["cand-a became leader", "cand-a stopped leading"],
    )
    .await;
    // In order: the term, then its end; nothing after it.
    let all = seen.all();
    assert!(
        matches!(all.first(), Some(Observation::Leading { .. })),
        "{all:#?}"
    );
    assert!(
        matches!(all.last(), Some(Observation::Stopped { .. })),
        "{all:#?}"
    );

    // Events off: none recorded.
    let quiet = LeaseElector::new(client.clone(), "quiet")
        .namespace(ns.name())
        .identity("cand-b")
        .events(false);
    let l = quiet.become_leader(&CancellationToken::new()).await.unwrap();
    l.release().await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let n = Api::<Event>::namespaced(client, ns.name())
        .list(&ListParams::default().fields("involvedObject.name=quiet"))
        .await
        .unwrap()
        .items
        .len();
    assert_eq!(n, 0, "Events recorded with events(false)");
}

#[tokio::test(flavor = "multi_thread")]
async fn for_life_records_client_go_events_and_reports_to_the_observer() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    create_pod(&client, ns.name(), "pod-a").await.unwrap();
    let seen = Seen::default();
    let l = ForLife::new(client.clone(), "fl-obs")
        .namespace(ns.name())
        .identity("pod-a")
        .environment(Environment::default())
        .observer(seen.observer())
        .become_leader(&CancellationToken::new())
        .await
        .unwrap();
    seen.wait_for("Leading", |o| {
        matches!(o, Observation::Leading { term } if term.identity == "pod-a" && term.strategy == Strategy::ForLife)
    })
    .await;
    let uid = Api::<ConfigMap>::namespaced(client.clone(), ns.name())
        .get("fl-obs")
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    wait_for_events(&client, ns.name(), "fl-obs", &uid, &["pod-a became leader"]).await;
    l.release().await.unwrap();
    seen.wait_for("Stopped", |o| matches!(o, Observation::Stopped { .. }))
        .await;
    wait_for_events(
        &client,
        ns.name(),
        "fl-obs",
        &uid,
        &["pod-a became leader", "pod-a stopped leading"],
    )
    .await;
    assert!(
        !seen
            .all()
            .iter()
            .any(|o| matches!(o, Observation::Renewed { .. })),
        "leader for life has no renewals"
    );
}

/// The `source.component` and `reportingComponent` of the `LeaderElection` Events on `lock`.
async fn reporters(client: &Client, ns: &str, lock: &str) -> Vec<(Option<String>, Option<String>)> {
    let deadline = tokio::time::Instant::now() + SOON;
    loop {
        let list = Api::<Event>::namespaced(client.clone(), ns)
            .list(&ListParams::default().fields(&format!("involvedObject.name={lock}")))
            .await
            .unwrap();
        let got: Vec<_> = list
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(REASON))
            .map(|e| (e.source.and_then(|s| s.component), e.reporting_component))
            .collect();
        if !got.is_empty() {
            return got;
        }
        assert!(tokio::time::Instant::now() < deadline, "no Event on {lock}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn events_name_the_reporter() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    // Named, and kept when Events are turned off and on again after it was set.
    let named = LeaseElector::new(client.clone(), "named")
        .namespace(ns.name())
        .identity("cand-a")
        .event_reporter("my-operator")
        .events(false)
        .events(true);
    let l = named.become_leader(&CancellationToken::new()).await.unwrap();
    let want = (Some("my-operator".to_string()), Some("my-operator".to_string()));
    assert_eq!(reporters(&client, ns.name(), "named").await, [want]);
    l.release().await.unwrap();

    // Default: the running binary's name (this test binary's, `observer-<hash>`).
    let exe = std::env::current_exe().unwrap();
    let stem = exe.file_stem().unwrap().to_str().unwrap().to_string();
    assert!(stem.starts_with("observer"), "{stem}");
    let unnamed = LeaseElector::new(client.clone(), "unnamed")
        .namespace(ns.name())
        .identity("cand-b");
    let l = unnamed.become_leader(&CancellationToken::new()).await.unwrap();
    let want = (Some(stem.clone()), Some(stem));
    assert_eq!(reporters(&client, ns.name(), "unnamed").await, [want]);
    l.release().await.unwrap();
}
