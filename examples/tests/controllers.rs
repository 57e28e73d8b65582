//! The controller examples, run as their users run them (the example binaries, a kubeconfig,
//! their flags) against the real test control plane: the Lease controller reconciles only while
//! it leads and hands over on SIGTERM; the shards controller's replicas reconcile exactly the
//! objects of the shards they hold, and the survivor takes them all.

mod common;

use std::{collections::BTreeMap, time::Duration};

use common::{Replica, SOON};

use k8s_openapi::api::{coordination::v1::Lease, core::v1::ConfigMap};
use kube::{
    api::{ObjectMeta, PostParams},
    Api, Client, ResourceExt,
};
use kube_leader_testenv::ControlPlane;

const STAMP: &str = "example.kube-leader.io/reconciled-by";
/// The tests' short timings, as Kubernetes components' flags.
const TIMINGS: [&str; 3] = [
    "--leader-elect-lease-duration=2s",
    "--leader-elect-renew-deadline=1s",
    "--leader-elect-retry-period=200ms",
];

/// A replica of controller example `name` in namespace `ns` as `identity`.
fn replica(cp: &ControlPlane, name: &str, ns: &str, identity: &str, extra: &[&str]) -> Replica {
    let mut args = vec!["--watch-namespace", ns, "--leader-elect-resource-namespace", ns];
    args.extend(["--leader-elect-identity", identity]);
    args.extend(TIMINGS);
    args.extend(extra);
    Replica::start(cp, name, &format!("{ns}-{identity}"), &args, &[])
}

async fn create_configmaps(client: &Client, ns: &str, manager: &str, names: &[String]) {
    let api = Api::<ConfigMap>::namespaced(client.clone(), ns);
    for name in names {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([("app.kubernetes.io/managed-by".to_string(), manager.to_string())].into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
}

/// Every ConfigMap's stamp, by name (`None`: not reconciled yet).
async fn stamps(client: &Client, ns: &str) -> BTreeMap<String, Option<String>> {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|cm| !cm.labels().is_empty())
        .map(|cm| (cm.name_any(), cm.annotations().get(STAMP).cloned()))
        .collect()
}

/// Polls until `check` holds for the stamps, or panics naming `what` and the last stamps.
async fn wait_stamps<F>(
    client: &Client,
    ns: &str,
    what: &str,
    mut check: F,
) -> BTreeMap<String, Option<String>>
where
    F: FnMut(&BTreeMap<String, Option<String>>) -> bool,
{
    let start = std::time::Instant::now();
    loop {
        let now = stamps(client, ns).await;
        if check(&now) {
            return now;
        }
        assert!(
            start.elapsed() < SOON,
            "timed out waiting for {what}; stamps: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn all_by(stamps: &BTreeMap<String, Option<String>>, identity: &str) -> bool {
    stamps.values().all(|s| {
        s.as_deref()
            .is_some_and(|s| s.split(' ').next() == Some(identity))
    })
}

fn token_of(stamp: &str) -> u64 {
    stamp.rsplit(' ').next().unwrap().parse().unwrap()
}

#[tokio::test]
async fn the_lease_controller_reconciles_only_while_leading_and_hands_over_on_sigterm() {
    let started = std::time::Instant::now();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let manager = "lease-controller-example";
    create_configmaps(&client, ns.name(), manager, &["one".into()]).await;

    let a = replica(cp, "lease_controller", ns.name(), "a", &[]);
    wait_stamps(&client, ns.name(), "a's reconcile", |s| all_by(s, "a")).await;
    let b = replica(cp, "lease_controller", ns.name(), "b", &[]);
    // b follows: a new object is reconciled by a alone.
    tokio::time::sleep(Duration::from_secs(2)).await;
    create_configmaps(&client, ns.name(), manager, &["two".into()]).await;
    let before = wait_stamps(&client, ns.name(), "a's second reconcile", |s| {
        s.len() == 2 && all_by(s, "a")
    })
    .await;

    a.terminate().await;
    let after = wait_stamps(&client, ns.name(), "b's takeover", |s| all_by(s, "b")).await;
    let (old, new) = (
        token_of(before["one"].as_ref().unwrap()),
        token_of(after["one"].as_ref().unwrap()),
    );
    assert!(new > old, "b's fencing token {new} is not above a's {old}");

    b.terminate().await;
    let lease = Api::<Lease>::namespaced(client.clone(), ns.name())
        .get(manager)
        .await
        .unwrap();
    let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
    assert!(
        holder.is_empty(),
        "b did not release the Lease on SIGTERM (holder {holder:?})"
    );
    eprintln!(
        "lease_controller example: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test]
async fn the_shards_controller_reconciles_the_objects_of_its_shards() {
    let started = std::time::Instant::now();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let manager = "shards-controller-example";
    let names: Vec<String> = (0..8).map(|i| format!("object-{i}")).collect();
    create_configmaps(&client, ns.name(), manager, &names).await;
    let leases = Api::<Lease>::namespaced(client.clone(), ns.name());

    let a = replica(cp, "shards_controller", ns.name(), "a", &["--shards", "4"]);
    wait_stamps(&client, ns.name(), "a reconciling every object", |s| {
        all_by(s, "a")
    })
    .await;
    let b = replica(cp, "shards_controller", ns.name(), "b", &["--shards", "4"]);
    // Both replicas hold shards, and every object is stamped by its shard's holder, as the
    // shard's Lease names it, with that term's fencing token.
    let start = std::time::Instant::now();
    loop {
        let now = stamps(&client, ns.name()).await;
        let mut ok = true;
        let mut by = std::collections::BTreeSet::new();
        for stamp in now.values() {
            let Some(stamp) = stamp else {
                ok = false;
                break;
            };
            let parts: Vec<&str> = stamp.split(' ').collect();
            let lease = leases.get(&format!("{manager}-{}", parts[1])).await.unwrap();
            let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
            ok &= holder == parts[0];
            by.insert(parts[0].to_string());
        }
        if ok && by.len() == 2 {
            break;
        }
        assert!(
            start.elapsed() < SOON,
            "objects not reconciled by their shards' holders: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    a.terminate().await;
    wait_stamps(&client, ns.name(), "b reconciling every object", |s| {
        all_by(s, "b")
    })
    .await;
    b.terminate().await;
    eprintln!(
        "shards_controller example: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
