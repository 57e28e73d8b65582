//! The test environment itself: the control plane garbage-collects, enforces RBAC, audits the
//! restricted users, and survives an API server restart.

use std::time::{Duration, Instant};

use k8s_openapi::{
    api::core::v1::{ConfigMap, Pod},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};
use kube::{
    api::{DeleteParams, ListParams, PostParams},
    Api, ResourceExt,
};
use kube_leader_testenv::{bind_role, create_pod, rule, set_pod_phase, ControlPlane};

/// Polls `condition` every 100 ms until it holds or `timeout` passes; returns the time it took.
async fn eventually<F, Fut>(timeout: Duration, what: &str, mut condition: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    loop {
        if condition().await {
            return started.elapsed();
        }
        assert!(started.elapsed() < timeout, "{what}: not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn is_forbidden(result: &kube::Result<impl std::fmt::Debug>) -> bool {
    matches!(result, Err(kube::Error::Api(status)) if status.code == 403)
}

#[tokio::test]
async fn garbage_collector_deletes_a_config_map_owned_by_a_deleted_pod() {
    let control_plane = ControlPlane::shared();
    let namespace = control_plane.namespace().await;
    let client = control_plane.client().await;
    let pods = Api::<Pod>::namespaced(client.clone(), namespace.name());
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), namespace.name());

    let pod = create_pod(&client, namespace.name(), "owner").await.unwrap();
    // The Pod never runs (no kubelet), but its status can still be set, as by an eviction.
    let evicted = set_pod_phase(&client, namespace.name(), "owner", "Failed", Some("Evicted"))
        .await
        .unwrap();
    let status = evicted.status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Failed"));
    assert_eq!(status.reason.as_deref(), Some("Evicted"));

    let owned = ConfigMap {
        metadata: ObjectMeta {
            name: Some("owned".into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: pod.name_any(),
                uid: pod.uid().unwrap(),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    config_maps.create(&PostParams::default(), &owned).await.unwrap();

    pods.delete("owner", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let delay = eventually(
        Duration::from_secs(30),
        "the garbage collector deletes the ConfigMap owned by the deleted Pod",
        || async { config_maps.get_opt("owned").await.unwrap().is_none() },
    )
    .await;
    println!("the garbage collector deleted the owned ConfigMap {delay:?} after the Pod");
}

#[tokio::test]
async fn a_restricted_user_may_do_only_what_a_role_allows() {
    let control_plane = ControlPlane::shared();
    let namespace = control_plane.namespace().await;
    let admin = control_plane.client().await;
    let user = control_plane.unused_user();
    let config_maps = Api::<ConfigMap>::namespaced(control_plane.user_client(&user).await, namespace.name());

    let refused = config_maps.list(&ListParams::default()).await;
    assert!(is_forbidden(&refused), "{refused:?}");

    bind_role(
        &admin,
        namespace.name(),
        &user,
        vec![rule(&[""], &["configmaps"], &["list"])],
    )
    .await
    .unwrap();
    // The RBAC authorizer learns of the binding through its informer.
    eventually(Duration::from_secs(10), "the Role takes effect", || async {
        config_maps.list(&ListParams::default()).await.is_ok()
    })
    .await;
    // Only what was granted.
    let refused = config_maps.get_opt("anything").await;
    assert!(is_forbidden(&refused), "{refused:?}");

    // The API server audited each request of the user, refusals included.
    let events = control_plane.audit_events(&user).unwrap();
    let lists: Vec<_> = events
        .iter()
        .filter(|e| e.verb == "list" && e.namespace.as_deref() == Some(namespace.name()))
        .collect();
    assert_eq!(lists.first().and_then(|e| e.code), Some(403), "{events:#?}");
    assert_eq!(lists.last().and_then(|e| e.code), Some(200), "{events:#?}");
    assert!(
        events.iter().any(|e| e.verb == "get" && e.code == Some(403)),
        "{events:#?}"
    );
    assert_eq!(
        control_plane.request_count(&user).unwrap(),
        events.len(),
        "one event per request that is not a watch"
    );
}

/// A control plane of its own, since restarting the API server would disturb the other tests.
#[tokio::test]
async fn the_api_server_restarts_on_the_same_port_and_everything_dies_with_the_control_plane() {
    let control_plane = ControlPlane::start().unwrap_or_else(|e| panic!("{e}"));
    println!(
        "a private control plane started in {:?}",
        control_plane.started_in()
    );
    let port = control_plane.apiserver_port();
    let client = control_plane.client().await;
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let before = ConfigMap {
        metadata: ObjectMeta {
            name: Some("survives-restart".into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    config_maps.create(&PostParams::default(), &before).await.unwrap();

    control_plane.stop_apiserver();
    assert!(config_maps.get_opt("survives-restart").await.is_err());
    let restarted = Instant::now();
    control_plane.start_apiserver().await.unwrap();
    println!("the API server restarted in {:?}", restarted.elapsed());

    // Same port, same etcd: the old client sees the old object.
    assert_eq!(control_plane.apiserver_port(), port);
    eventually(Duration::from_secs(10), "the old client reconnects", || async {
        matches!(config_maps.get_opt("survives-restart").await, Ok(Some(_)))
    })
    .await;

    let dir = control_plane.dir().to_owned();
    drop(control_plane);
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the API server still listens after the control plane was dropped"
    );
    assert!(!dir.exists(), "{} was not removed", dir.display());
}
