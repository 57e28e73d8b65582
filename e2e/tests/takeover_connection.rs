//! A follower over kube's own client (HTTP/1.1, kube's connector: no `TCP_NODELAY`) takes over
//! after a release without opening a connection: its write goes over a connection that is past
//! its first exchange, so Nagle's algorithm has nothing unacknowledged to wait for
//! (`kube-leader/src/lease/spare.rs`; docs/benchmarks.md).

use std::{
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    task::{Context, Poll},
    time::Duration,
};

use http::Uri;
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client as Pool},
    rt::TokioExecutor,
};
use kube::{client::ConfigExt as _, Client, Config};
use kube_leader::internal::LeaseElectorExt as _;
use kube_leader_e2e::{short_lease_elector, wait_for};
use kube_leader_testenv::ControlPlane;
use tokio_util::sync::CancellationToken;
use tower::{BoxError, ServiceBuilder, ServiceExt as _};

/// kube's TCP connector, counting the connections it opens.
#[derive(Clone)]
struct Counting {
    inner: HttpConnector,
    opened: Arc<AtomicUsize>,
}

impl tower::Service<Uri> for Counting {
    type Response = <HttpConnector as tower::Service<Uri>>::Response;
    type Error = <HttpConnector as tower::Service<Uri>>::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        self.opened.fetch_add(1, Ordering::SeqCst);
        Box::pin(self.inner.call(uri))
    }
}

/// A client as kube's `Client::try_from` builds it (the same connector, TLS and pool
/// defaults, over HTTP/1.1), with a count of the TCP connections it opened.
fn counting_client(config: &Config) -> (Client, Arc<AtomicUsize>) {
    counting_client_with(config, |_| ())
}

/// [`counting_client`], its pool's builder changed by `tune` first.
fn counting_client_with(
    config: &Config,
    tune: impl FnOnce(&mut hyper_util::client::legacy::Builder),
) -> (Client, Arc<AtomicUsize>) {
    let opened = Arc::new(AtomicUsize::new(0));
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let counting = Counting {
        inner: http,
        opened: opened.clone(),
    };
    let https = config.rustls_https_connector_with_connector(counting).unwrap();
    let mut builder = Pool::builder(TokioExecutor::new());
    tune(&mut builder);
    let pool: Pool<_, kube::client::Body> = builder.build(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().unwrap())
        .service(pool.map_err(BoxError::from));
    (Client::new(service, config.default_namespace.clone()), opened)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_follower_over_kubes_client_takes_over_without_a_new_connection() {
    let cp = ControlPlane::shared();
    let (client, opened) = counting_client(&cp.config("admin").await.unwrap());
    takes_over_without_a_new_connection(cp, client, opened, Duration::ZERO).await;
}

/// A follower that sends nothing else (no registration: `Successor::Any`, as a follower with a
/// Pod), idle for longer than its pool keeps an idle connection: the campaign's reads every
/// `keep_warm` (default 60 s) keep the spare. The pool's idle timeout is hyper's default, 90 s, so
/// this test waits 100 s: ignored by the test command; run it with
/// `cargo test -p kube-leader-e2e --test takeover_connection -- --ignored`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "waits 100 s, past hyper's 90 s pool idle timeout"]
async fn a_follower_idle_past_the_pools_idle_timeout_takes_over_without_a_new_connection() {
    let cp = ControlPlane::shared();
    let (client, opened) = counting_client_with(&cp.config("admin").await.unwrap(), |b| {
        b.pool_timer(hyper_util::rt::TokioTimer::new());
    });
    takes_over_without_a_new_connection(cp, client, opened, Duration::from_secs(100)).await;
}

/// A leader; a follower over `client` (whose connector counts into `opened`), idle for `idle`
/// once its spare is open; the leader releases; the follower must take over over a connection
/// it already had.
async fn takes_over_without_a_new_connection(
    cp: &ControlPlane,
    client: Client,
    opened: Arc<AtomicUsize>,
    idle: Duration,
) {
    let ns = cp.namespace().await;
    let shutdown = CancellationToken::new();
    let leader = short_lease_elector(&cp.client().await, ns.name(), "spare", "leader")
        .become_leader(&shutdown)
        .await
        .unwrap();
    let follower = short_lease_elector(&client, ns.name(), "spare", "follower");
    let follower = if idle.is_zero() {
        follower
    } else {
        let config = follower.settings().clone().successor(kube_leader::Successor::Any);
        follower.config(config)
    };
    let s = shutdown.clone();
    // The count as the term begins: the new leader's keeper then takes the pooled connection for
    // its watch and opens another for its first renewal, a retry period later.
    let counted = opened.clone();
    let next = tokio::spawn(async move {
        let led = follower.become_leader(&s).await;
        (led, counted.load(Ordering::SeqCst))
    });
    // The follower's watch holds one connection; its pool keeps a second, idle one. On a loaded
    // machine the spare read may still be on its way when the second connection opens: wait
    // until no connection has opened for 2 s.
    wait_for("a spare connection", Duration::from_secs(10), || async {
        (opened.load(Ordering::SeqCst) >= 2).then_some(())
    })
    .await;
    let mut before = opened.load(Ordering::SeqCst);
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = opened.load(Ordering::SeqCst);
        if now == before {
            break;
        }
        before = now;
    }
    tokio::time::sleep(idle).await;
    let before = before.max(opened.load(Ordering::SeqCst));
    let token = leader.fencing_token();
    leader.release().await.unwrap();
    let (next, at_takeover) = tokio::time::timeout(Duration::from_secs(5), next)
        .await
        .expect("the follower takes over within the lease duration")
        .unwrap();
    let next = next.unwrap();
    assert!(next.fencing_token() > token);
    assert_eq!(
        at_takeover, before,
        "the takeover write went over a connection the follower already had"
    );
    next.release().await.unwrap();
    shutdown.cancel();
}
