//! A follower over kube's own client (HTTP/1.1, kube's connector: no `TCP_NODELAY`) takes over
//! after a release without opening a connection: its write goes over a connection that is past
//! its first exchange, so Nagle's algorithm has nothing unacknowledged to wait for
//! (`kube-leader/src/lease/spare.rs`; docs/benchmarks.md).

use std::{
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll},
    time::Duration,
};

use http::{Method, Uri};
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

/// The writes of one Lease (`PUT .../leases/<name>`) a client sent, each with the count of
/// connections opened when it was sent and when its answer came.
#[derive(Clone, Default)]
struct Writes(Arc<Mutex<Vec<(usize, usize)>>>);

/// Records the Lease's writes into [`Writes`], in front of the pool.
#[derive(Clone)]
struct Recording<S> {
    inner: S,
    lease: &'static str,
    opened: Arc<AtomicUsize>,
    writes: Writes,
}

impl<S> tower::Service<http::Request<kube::client::Body>> for Recording<S>
where
    S: tower::Service<http::Request<kube::client::Body>, Error = BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let path = format!("/leases/{}", self.lease);
        let write = req.method() == Method::PUT && req.uri().path().ends_with(&path);
        let before = self.opened.load(Ordering::SeqCst);
        let answer = self.inner.call(req);
        let (opened, writes) = (self.opened.clone(), self.writes.clone());
        Box::pin(async move {
            let answer = answer.await;
            if write {
                let after = opened.load(Ordering::SeqCst);
                writes.0.lock().unwrap().push((before, after));
            }
            answer
        })
    }
}

/// A client as kube's `Client::try_from` builds it (the same connector, TLS and pool
/// defaults, over HTTP/1.1), with a count of the TCP connections it opened and a record of its
/// writes of the Lease `spare`.
fn counting_client(config: &Config) -> (Client, Arc<AtomicUsize>, Writes) {
    counting_client_with(config, |_| ())
}

/// [`counting_client`], its pool's builder changed by `tune` first.
fn counting_client_with(
    config: &Config,
    tune: impl FnOnce(&mut hyper_util::client::legacy::Builder),
) -> (Client, Arc<AtomicUsize>, Writes) {
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
    let writes = Writes::default();
    let recording = Recording {
        inner: pool.map_err(BoxError::from),
        lease: "spare",
        opened: opened.clone(),
        writes: writes.clone(),
    };
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().unwrap())
        .service(recording);
    (
        Client::new(service, config.default_namespace.clone()),
        opened,
        writes,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_follower_over_kubes_client_takes_over_without_a_new_connection() {
    let cp = ControlPlane::shared();
    let (client, opened, writes) = counting_client(&cp.config("admin").await.unwrap());
    takes_over_without_a_new_connection(cp, client, (opened, writes), Duration::ZERO).await;
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
    let (client, opened, writes) = counting_client_with(&cp.config("admin").await.unwrap(), |b| {
        b.pool_timer(hyper_util::rt::TokioTimer::new());
    });
    takes_over_without_a_new_connection(cp, client, (opened, writes), Duration::from_secs(100)).await;
}

/// A leader; a follower over `client` (whose connector counts into `opened`, and whose writes of
/// the Lease are recorded in `writes`), idle for `idle` once its spare is open; the leader
/// releases; the follower's takeover write must go over a connection it already had.
///
/// The follower sends nothing but its watch, its spare reads and its writes (no registration:
/// `Successor::Any`, as a follower with a Pod), and the connections are counted around the
/// takeover write itself: once the term begins, the new leader's keeper and its own watch open
/// connections of their own (a count taken when `become_leader` returned caught those on a
/// loaded machine).
async fn takes_over_without_a_new_connection(
    cp: &ControlPlane,
    client: Client,
    (opened, writes): (Arc<AtomicUsize>, Writes),
    idle: Duration,
) {
    let ns = cp.namespace().await;
    let shutdown = CancellationToken::new();
    let leader = short_lease_elector(&cp.client().await, ns.name(), "spare", "leader")
        .become_leader(&shutdown)
        .await
        .unwrap();
    let follower = short_lease_elector(&client, ns.name(), "spare", "follower");
    let config = follower.settings().clone().successor(kube_leader::Successor::Any);
    let follower = follower.config(config);
    let s = shutdown.clone();
    let next = tokio::spawn(async move { follower.become_leader(&s).await });
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
    let token = leader.fencing_token();
    leader.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), next)
        .await
        .expect("the follower takes over within the lease duration")
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > token);
    let takeover = writes.0.lock().unwrap().first().copied();
    let (sent, answered) = takeover.expect("the follower wrote the Lease to take it over");
    assert_eq!(
        answered, sent,
        "the takeover write went over a connection the follower did not have yet ({sent} \
         connections opened when it was sent, {answered} when it was answered)"
    );
    next.release().await.unwrap();
    shutdown.cancel();
}
