//! `kube_leader::client` (feature `http2`) against the real API server: a Lease read, watched
//! and updated over one HTTP/2 connection, exec-plugin credentials (a refreshable token, a
//! certificate's expiry), kube's retry of 503, the proxy fallback, and a handover between two
//! electors on it.

use kube_leader_e2e::Tune;
use std::{
    os::unix::fs::PermissionsExt as _,
    path::PathBuf,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::{
    api::{ObjectMeta, PostParams, WatchEvent, WatchParams},
    config::ExecConfig,
    Api, Client, Config,
};
use kube_leader::{client, internal::client::Liveness};
use kube_leader_e2e::short_lease_elector;
use kube_leader_testenv::ControlPlane;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_util::sync::CancellationToken;

/// The HTTP version the API server answered `client`'s `GET /version` with.
async fn version_of(client: &Client) -> http::Version {
    let req = http::Request::get("/version")
        .body(kube::client::Body::empty())
        .unwrap();
    client.send(req).await.unwrap().version()
}

#[tokio::test]
async fn a_lease_is_read_watched_and_updated_over_http2() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = client::http2(cp.config("admin").await.unwrap(), Duration::from_secs(10)).unwrap();
    assert_eq!(version_of(&client).await, http::Version::HTTP_2);

    let api: Api<Lease> = Api::namespaced(client.clone(), ns.name());
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("h2".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec::default()),
    };
    let created = api.create(&PostParams::default(), &lease).await.unwrap();
    let rv = created.metadata.resource_version.clone().unwrap();
    let mut events = api
        .watch(&WatchParams::default().fields("metadata.name=h2"), &rv)
        .await
        .unwrap()
        .boxed();
    // The write and the open watch share the connection.
    let mut got = api.get("h2").await.unwrap();
    got.spec.as_mut().unwrap().holder_identity = Some("a".into());
    let replaced = api.replace("h2", &PostParams::default(), &got).await.unwrap();
    let event = tokio::time::timeout(Duration::from_secs(10), events.try_next())
        .await
        .expect("the watch sees the update")
        .unwrap();
    match event {
        Some(WatchEvent::Modified(l)) => {
            assert_eq!(l.spec.unwrap().holder_identity.as_deref(), Some("a"));
            assert_eq!(l.metadata.resource_version, replaced.metadata.resource_version);
        }
        other => panic!("expected the update, got {other:?}"),
    }
    let holder = api.get("h2").await.unwrap().spec.unwrap().holder_identity;
    assert_eq!(holder.as_deref(), Some("a"));
}

/// An executable that prints `credential` (an ExecCredential's JSON), and the ExecConfig
/// that runs it.
fn exec_plugin(credential: &serde_json::Value) -> (PathBuf, ExecConfig) {
    let path = std::env::temp_dir().join(format!("kube-leader-exec-{}.sh", rand::random::<u64>()));
    std::fs::write(&path, format!("#!/bin/sh\ncat <<'EOF'\n{credential}\nEOF\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let exec = serde_json::from_value(serde_json::json!({
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "command": path,
    }))
    .unwrap();
    (path, exec)
}

fn credential(status: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "kind": "ExecCredential",
        "status": status,
    })
}

/// `config` authenticated by `exec` alone.
fn with_exec(mut config: Config, exec: ExecConfig) -> Config {
    config.auth_info = kube::config::AuthInfo {
        exec: Some(exec),
        ..Default::default()
    };
    config
}

#[tokio::test]
async fn an_exec_plugin_token_that_expires_authenticates_over_http2() {
    let cp = ControlPlane::shared();
    let token = cp.user_token("admin").unwrap();
    let expiry = "2099-01-01T00:00:00Z";
    let (path, exec) = exec_plugin(&credential(serde_json::json!({
        "token": token, "expirationTimestamp": expiry,
    })));
    let config = with_exec(cp.config("admin").await.unwrap(), exec);
    let client = client::http2(config, Duration::from_secs(10)).unwrap();
    assert_eq!(version_of(&client).await, http::Version::HTTP_2);
    let ns = cp.namespace().await;
    let leases = Api::<Lease>::namespaced(client.clone(), ns.name())
        .list(&Default::default())
        .await;
    let _ = std::fs::remove_file(path);
    assert!(leases.unwrap().items.is_empty());
    // A token's expiry is the token's business (kube refreshes it); only a certificate's
    // expiry is the client's.
    assert_eq!(*client.valid_until(), None);
}

#[tokio::test]
async fn an_exec_plugin_certificate_expiry_is_the_clients_as_with_kube() {
    let cp = ControlPlane::shared();
    let dir = std::env::temp_dir().join(format!("kube-leader-cert-{}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let made = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-subj", "/CN=exec-user", "-days", "1", "-keyout"])
        .arg(dir.join("key.pem"))
        .arg("-out")
        .arg(dir.join("cert.pem"))
        .output()
        .expect("openssl runs");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
    let expiry = "2099-01-01T00:00:00Z";
    let (path, exec) = exec_plugin(&credential(serde_json::json!({
        "clientCertificateData": read("cert.pem"), "clientKeyData": read("key.pem"),
        "expirationTimestamp": expiry,
    })));
    let config = with_exec(cp.config("admin").await.unwrap(), exec);
    let ours = client::http2(config.clone(), Duration::from_secs(10)).unwrap();
    let kubes = Client::try_from(config).unwrap();
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_dir_all(dir);
    assert_eq!(
        ours.valid_until().as_ref().map(|t| t.to_string()).as_deref(),
        Some(expiry)
    );
    assert_eq!(ours.valid_until(), kubes.valid_until());
}

/// A server on 127.0.0.1 that answers its first `failures` requests 503 and then `/version`;
/// returns its URL and the count of requests.
async fn flaky_server(failures: usize) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {
                    let body = r#"{"major":"1","minor":"20","gitVersion":"v1.20.2","gitCommit":"","gitTreeState":"","buildDate":"","goVersion":"","compiler":"","platform":""}"#;
                    let answer = if seen.fetch_add(1, Ordering::SeqCst) < failures {
                        "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n".to_string()
                    } else {
                        format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len())
                    };
                    if stream.write_all(answer.as_bytes()).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    (url, count)
}

#[tokio::test]
async fn kubes_retry_of_503_is_kept() {
    let (url, count) = flaky_server(2).await;
    let client = client::http2(Config::new(url.parse().unwrap()), Duration::from_secs(10)).unwrap();
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.git_version, "v1.20.2");
    assert_eq!(count.load(Ordering::SeqCst), 3, "two 503s retried");

    let (url, count) = flaky_server(1).await;
    let mut config = Config::new(url.parse().unwrap());
    config.default_retry = false;
    let client = client::http2(config, Duration::from_secs(10)).unwrap();
    assert!(client.apiserver_version().await.is_err());
    assert_eq!(count.load(Ordering::SeqCst), 1, "no retry without default_retry");
}

#[tokio::test]
async fn a_proxy_falls_back_to_kubes_client() {
    let mut config = Config::new("https://127.0.0.1:6443".parse().unwrap());
    config.proxy_url = Some("http://127.0.0.1:3128".parse().unwrap());
    // This workspace's kube has no `http-proxy` feature: kube's own builder says so.
    let Err(err) = kube_leader::internal::client::http2_with(config, Liveness::default()) else {
        panic!("a client through a proxy kube cannot use");
    };
    assert!(matches!(err, kube::Error::ProxyProtocolDisabled { .. }), "{err}");
}

/// Two electors over HTTP/2 clients: the leader releases, the follower takes over.
#[tokio::test(flavor = "multi_thread")]
async fn a_release_hands_over_between_http2_clients() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let renew_deadline = Duration::from_secs(1);
    let client = || async { client::http2(cp.config("admin").await.unwrap(), renew_deadline).unwrap() };
    let (a, b) = (client().await, client().await);
    let shutdown = CancellationToken::new();
    let leader = short_lease_elector(&a, ns.name(), "h2-handover", "a")
        .become_leader(&shutdown)
        .await
        .unwrap();
    let follower = short_lease_elector(&b, ns.name(), "h2-handover", "b");
    let s = shutdown.clone();
    let next = tokio::spawn(async move { follower.become_leader(&s).await });
    // Let the follower watch the Lease.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let token = leader.fencing_token();
    let released = Instant::now();
    leader.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), next)
        .await
        .expect("the follower takes over within the lease duration")
        .unwrap()
        .unwrap();
    eprintln!("release → next leader over HTTP/2: {:?}", released.elapsed());
    assert!(next.fencing_token() > token);
    next.release().await.unwrap();
}

/// Where a graceful handover's leader-side time goes: `Leadership::release` over HTTP/2 and
/// over kube's own client (HTTP/1.1, without `TCP_NODELAY`), with the successor lookup
/// (`Successor::Youngest`, the default: a list of the registration Leases, then the update) and
/// without it (`Successor::Any`: the update alone). Printed, for docs/benchmarks.md; asserted
/// only loosely (a shared machine).
#[tokio::test(flavor = "multi_thread")]
async fn the_release_over_http2_and_http1_with_and_without_the_successor_lookup() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let config = cp.config("admin").await.unwrap();
    let clients = [
        (
            "HTTP/2",
            client::http2(config.clone(), Duration::from_secs(1)).unwrap(),
        ),
        ("kube's HTTP/1.1", Client::try_from(config).unwrap()),
    ];
    for (name, client) in &clients {
        for successor in [kube_leader::Successor::Youngest, kube_leader::Successor::Any] {
            let took = releases(client, ns.name(), successor).await;
            eprintln!(
                "{name}, {successor:?}: release, 20 rounds: p50 {:?}, p90 {:?}, max {:?}",
                took[9], took[17], took[19]
            );
            assert!(took[9] < Duration::from_secs(1), "{took:?}");
        }
    }
}

/// 20 terms on two Leases, each released: how long each release took, sorted.
async fn releases(client: &Client, ns: &str, successor: kube_leader::Successor) -> Vec<Duration> {
    let mut took = Vec::new();
    for round in 0..20 {
        let shutdown = CancellationToken::new();
        let lease = format!("release-{successor:?}-{}", round % 2).to_lowercase();
        let leadership = short_lease_elector(client, ns, &lease, "a")
            .tune(|c| c.successor(successor))
            .become_leader(&shutdown)
            .await
            .unwrap();
        let started = Instant::now();
        leadership.release().await.unwrap();
        took.push(started.elapsed());
        shutdown.cancel();
    }
    took.sort();
    took
}
