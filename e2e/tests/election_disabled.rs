//! The election turned off (`election: false`) against a real control plane: every elector
//! leads at once without a single request (counted in the API server's audit log), has no fencing token, and ends its
//! term on shutdown; a shard set hands this replica every shard.

use kube_leader::internal::ForLifeExt as _;
use kube_leader_e2e::Tune;
use std::time::Duration;

use kube_leader::{internal::Environment, ForLife, LossReason, Shards};
use kube_leader_e2e::short_lease_elector;
use kube_leader_testenv::ControlPlane;
use tokio_util::sync::CancellationToken;

const SOON: Duration = Duration::from_secs(10);

/// Each strategy with the election disabled leads at once, sends nothing, and stops on
/// shutdown.
#[tokio::test]
async fn a_disabled_election_leads_at_once_and_sends_nothing() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let user = cp.unused_user();
    let client = cp.user_client(&user).await;
    let shutdown = CancellationToken::new();

    let elector = short_lease_elector(&client, ns.name(), "lock", "me").tune(|c| c.election(false));
    let lease = tokio::time::timeout(SOON, elector.become_leader(&shutdown))
        .await
        .unwrap()
        .unwrap();
    assert!(lease.is_skipped() && lease.is_leader());
    assert_eq!(lease.fencing_token(), 0);
    assert_eq!(lease.term().lock.namespace, ns.name());
    assert_eq!(lease.term().identity, "me");

    // Leader for life, in a cluster (a namespace and a Pod name): no Pod, no lock, no error.
    let env = Environment {
        pod_namespace: Some(ns.name().to_string()),
        pod_name: Some("no-such-pod".into()),
        service_account_namespace_file: None,
    };
    let elector = ForLife::new(client.clone(), "lock")
        .environment(env)
        .config(kube_leader::ForLifeConfig::default().election(false));
    let for_life = tokio::time::timeout(SOON, elector.become_leader(&shutdown))
        .await
        .unwrap()
        .unwrap();
    assert!(for_life.is_skipped() && for_life.is_leader());
    assert_eq!(for_life.term().identity, "no-such-pod");

    let mut shards = Shards::new(client.clone(), "work", 3)
        .namespace(ns.name())
        .identity("me")
        .config(
            kube_leader::ShardsConfig::default().lease(kube_leader::LeaseConfig::default().election(false)),
        )
        .start(&shutdown)
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        let shard = tokio::time::timeout(SOON, shards.next()).await.unwrap().unwrap();
        assert_eq!(shard.1.fencing_token(), 0);
        got.push(shard);
    }
    assert_eq!(got.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(shards.held().borrow().held.len(), 3);

    shutdown.cancel();
    assert_eq!(
        tokio::time::timeout(SOON, lease.lost()).await.unwrap(),
        LossReason::Cancelled
    );
    assert_eq!(
        tokio::time::timeout(SOON, for_life.lost()).await.unwrap(),
        LossReason::Cancelled
    );
    for (_, shard) in &got {
        tokio::time::timeout(SOON, shard.lost_token().cancelled())
            .await
            .unwrap();
    }
    assert!(tokio::time::timeout(SOON, shards.next()).await.unwrap().is_none());
    drop(got);
    tokio::time::timeout(SOON, shards.finish())
        .await
        .unwrap()
        .unwrap();
    lease.release().await.unwrap();
    for_life.release().await.unwrap();
    assert_eq!(
        cp.request_count(&user).unwrap(),
        0,
        "a disabled election sent requests"
    );
}

/// Disabled is not a way around validation: bad timings are still refused, before anything.
#[tokio::test]
async fn a_disabled_election_still_validates_its_settings() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    let e = short_lease_elector(&client, "default", "lock", "me")
        .tune(|c| c.renew_deadline(Duration::from_secs(5)).election(false));
    let err = e.become_leader(&CancellationToken::new()).await.unwrap_err();
    assert!(err.to_string().contains("renew"), "{err}");
}
