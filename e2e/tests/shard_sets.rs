//! Shard sets used the wrong way (issue 21) against the real control plane: candidates with
//! different shard counts (items 7) and the least-privilege Role of `run --shards` (item 8).
//! In-process `Shards` candidates, and the `kube-leader` binary for the sidecar's exit code.

use std::time::Duration;

use k8s_openapi::api::{
    coordination::v1::Lease,
    rbac::v1::{PolicyRule, Role},
};
use kube::Api;
use kube_leader::{internal::LeaseRecord, Shards};
use kube_leader_e2e::shard_fleet::Timings;
use kube_leader_testenv::{bind_role, ControlPlane};
use tokio_util::sync::CancellationToken;

const T: Timings = Timings {
    lease: Duration::from_secs(2),
    renew: Duration::from_secs(1),
    retry: Duration::from_millis(200),
};
const SOON: Duration = Duration::from_secs(30);

/// Lease timings of the in-process candidates below: those of the fleet.
fn short_lease() -> kube_leader::LeaseConfig {
    kube_leader::LeaseConfig::default()
        .lease_duration(T.lease)
        .renew_deadline(T.renew)
        .retry_period(T.retry)
}

/// An in-process candidate of the set `set` with `count` shards.
fn counted(client: &kube::Client, ns: &str, set: &str, identity: &str, count: u32) -> Shards {
    Shards::new(client.clone(), set, count)
        .namespace(ns)
        .identity(identity)
        .config(kube_leader::ShardsConfig::default().lease(short_lease()))
}

/// Candidates of one set with different shard counts (issue 21, item 7) used to hold nothing
/// and say nothing. The membership Lease carries the count: the candidate that joins a set
/// with another count fails, naming both counts, both identities and the set, and holds no
/// shard; the candidate already there keeps its shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_with_another_shard_count_fails_naming_both() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns.name());
    let shutdown = CancellationToken::new();
    let mut four = counted(&client, ns.name(), "counted", "four", 4)
        .start(&shutdown)
        .unwrap();
    let mut held = four.held();
    tokio::time::timeout(SOON, held.wait_for(|s| s.held.len() == 4))
        .await
        .expect("the first candidate takes all 4 shards")
        .unwrap();
    let mut guards = Vec::new();
    while guards.len() < 4 {
        guards.push(four.next().await.expect("4 shards"));
    }

    let five = counted(&client, ns.name(), "counted", "five", 5)
        .start(&shutdown)
        .unwrap();
    let mut five_held = five.held();
    let err = tokio::time::timeout(SOON, five.finish())
        .await
        .expect("the candidate with 5 shards must fail, not wait silently")
        .expect_err("the candidate with 5 shards must fail");
    let msg = err.to_string();
    println!("{msg}");
    for want in [
        "counted",
        ns.name(),
        "\"four\"",
        "\"five\"",
        "4 shards",
        "5 shards",
    ] {
        assert!(msg.contains(want), "{msg:?} should name {want}");
    }
    assert!(
        five_held.borrow_and_update().held.is_empty(),
        "the failed candidate holds nothing"
    );
    // The first candidate goes on with its 4 shards, and nobody else took one.
    tokio::time::sleep(T.lease).await;
    assert_eq!(held.borrow().held.len(), 4, "{:?}", held.borrow());
    for i in 0..4 {
        let l = leases.get(&format!("counted-{i}")).await.unwrap();
        assert_eq!(LeaseRecord::from_lease(&l).holder.as_deref(), Some("four"));
    }
    if let Some(l) = leases.get_opt("counted-4").await.unwrap() {
        assert_eq!(LeaseRecord::from_lease(&l).holder, None, "counted-4 is not held");
    }
    shutdown.cancel();
    drop(guards);
    four.finish().await.unwrap();
}

/// `kube-leader run --shards 5` beside a candidate of the set with 4 shards: it exits 125
/// (a configuration error) with the message naming both counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sidecar_with_another_shard_count_exits_125() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let shutdown = CancellationToken::new();
    let mut four = counted(&client, ns.name(), "mixed", "four", 4)
        .start(&shutdown)
        .unwrap();
    let mut held = four.held();
    tokio::time::timeout(SOON, held.wait_for(|s| s.held.len() == 4))
        .await
        .expect("the first candidate takes all 4 shards")
        .unwrap();
    let bin = kube_leader_e2e::kube_leader_bin_beside(env!("CARGO_BIN_EXE_shard-candidate"));
    let out = tokio::time::timeout(
        SOON,
        tokio::process::Command::new(&bin)
            .args([
                "run",
                "--strategy",
                "lease",
                "--lock",
                "mixed",
                "--namespace",
                ns.name(),
            ])
            .args(["--identity", "five", "--shards", "5"])
            .args([
                "--lease-duration",
                "2s",
                "--renew-deadline",
                "1s",
                "--retry-period",
                "200ms",
            ])
            .args(["--", "sleep", "600"])
            .env("KUBECONFIG", cp.kubeconfig_path())
            .env_remove("POD_NAMESPACE")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("kube-leader run --shards 5 must exit, not wait silently")
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stderr}");
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    for want in ["mixed", "\"four\"", "\"five\"", "4 shards", "5 shards"] {
        assert!(stderr.contains(want), "{stderr:?} should name {want}");
    }
    assert_eq!(held.borrow().held.len(), 4);
    shutdown.cancel();
    while let Some(shard) = four.next().await {
        drop(shard);
    }
    four.finish().await.unwrap();
}

/// `kube-leader rbac --shards 2 --lock SET --identity ID` as a user would apply it; the rules
/// as the API server stored them.
async fn printed_shards_role(
    cp: &ControlPlane,
    client: &kube::Client,
    ns: &str,
    set: &str,
    id: &str,
) -> Vec<PolicyRule> {
    let bin = kube_leader_e2e::kube_leader_bin_beside(env!("CARGO_BIN_EXE_shard-candidate"));
    let out = std::process::Command::new(bin)
        .args([
            "rbac",
            "--shards",
            "2",
            "--lock",
            set,
            "--namespace",
            ns,
            "--identity",
            id,
        ])
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .unwrap();
    assert!(out.status.success(), "kube-leader rbac: {out:?}");
    let yaml = String::from_utf8(out.stdout).unwrap();
    tokio::task::block_in_place(|| cp.kubectl_with_stdin(&["apply", "-f", "-"], &yaml)).unwrap();
    let role = Api::<Role>::namespaced(client.clone(), ns)
        .get(&format!("kube-leader-shards-{set}"))
        .await
        .unwrap();
    role.rules.unwrap_or_default()
}

/// A restricted user with `rules`, once the authorizer lets it list Leases (or `SOON` passed).
async fn shards_user(
    cp: &ControlPlane,
    admin: &kube::Client,
    ns: &str,
    rules: Vec<PolicyRule>,
) -> kube::Client {
    let user = cp.unused_user();
    bind_role(admin, ns, &user, rules).await.unwrap();
    let client = cp.user_client(&user).await;
    // RBAC takes effect within moments; the candidates below retry what is transient.
    tokio::time::sleep(Duration::from_millis(500)).await;
    client
}

/// The Role `kube-leader rbac --shards` prints (issue 21, item 8) is enough for a candidate:
/// it takes both shards, renews them and hands them back; without the list/watch rule it
/// fails with the missing permission and a hint naming `kube-leader rbac --shards`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_shards_role_is_sufficient_and_a_missing_rule_is_named() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let admin = cp.client().await;
    let rules = printed_shards_role(cp, &admin, ns.name(), "ranked", "me").await;
    assert!(
        rules
            .iter()
            .any(|r| r.resource_names.as_deref()
                == Some(&["ranked-0".to_string(), "ranked-1".to_string()][..])),
        "{rules:?}"
    );
    let client = shards_user(cp, &admin, ns.name(), rules.clone()).await;
    let shutdown = CancellationToken::new();
    let mut me = counted(&client, ns.name(), "ranked", "me", 2)
        .start(&shutdown)
        .unwrap();
    let mut held = me.held();
    tokio::time::timeout(SOON, held.wait_for(|s| s.held.len() == 2))
        .await
        .expect("the candidate with only the printed Role takes both shards")
        .unwrap();
    // Renewals go on for several lease durations.
    tokio::time::sleep(T.lease * 2).await;
    assert_eq!(held.borrow().held.len(), 2);
    shutdown.cancel();
    while let Some(shard) = me.next().await {
        drop(shard);
    }
    me.finish().await.expect("ends cleanly with the printed Role");
    let leases: Api<Lease> = Api::namespaced(admin.clone(), ns.name());
    for i in 0..2 {
        let l = leases.get(&format!("ranked-{i}")).await.unwrap();
        assert_eq!(LeaseRecord::from_lease(&l).holder, None, "released");
    }
    assert!(
        leases
            .get_opt(&kube_leader::internal::member_lease_name("ranked", "me"))
            .await
            .unwrap()
            .is_none(),
        "the membership Lease is deleted on shutdown"
    );

    // Without list and watch.
    let without: Vec<PolicyRule> = rules
        .into_iter()
        .filter(|r| !r.verbs.contains(&"list".to_string()))
        .collect();
    let client = shards_user(cp, &admin, ns.name(), without).await;
    let other = counted(&client, ns.name(), "ranked", "me", 2)
        .start(&CancellationToken::new())
        .unwrap();
    let err = tokio::time::timeout(SOON, other.finish())
        .await
        .expect("fails without list")
        .expect_err("fails without list");
    let msg = err.to_string();
    println!("{msg}");
    assert!(
        msg.contains(&format!(
            "missing permission: list leases.coordination.k8s.io in namespace {}",
            ns.name()
        )),
        "{msg}"
    );
    assert!(msg.contains("kube-leader rbac --shards M --lock SET"), "{msg}");
    assert!(!msg.contains("deploy/"), "{msg}");
}
