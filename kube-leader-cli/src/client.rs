//! The sidecar's API client: kube's layers (base URL, credentials, headers) over a connection
//! pool that speaks HTTP/2 when the API server offers it (every Kubernetes API server does).
//!
//! kube's own client speaks HTTP/1.1, where every open watch holds a connection of its own: a
//! follower that watches its lock (and the leader's Pod, and the leader for the status server)
//! has no idle connection left for the one write that takes over, and opens a new TCP and TLS
//! connection on the handover's path (tens of milliseconds; see docs/benchmarks.md). Over
//! HTTP/2 the watches and the writes share one connection, as client-go's do.
//!
//! A silent API server is noticed within bounds derived from the renew deadline
//! ([`Liveness`]):
//!
//! - the TCP connect and the TLS handshake together take at most [`Liveness::connect`];
//! - every request, a watch too, gets its response headers within [`Liveness::headers`];
//! - HTTP/2: a connection that has read nothing for [`Liveness::keep_alive`] is PINGed, and
//!   closed if the answer takes longer than that again, so a dead connection (and every watch
//!   on it) fails at most twice that after its last frame: well inside a term.
//!
//! `--http1` (or `KUBE_LEADER_HTTP1=true`), or a proxy in the configuration, keeps kube's own HTTP/1.1 client,
//! with the same connect and response-headers bounds. It has no PINGs: a connection that dies
//! under an open watch is noticed by the watch's own idle timeout (kube-runtime: the watch
//! timeout plus 5 s), and leader for life also reads its objects when a watch stays silent
//! (kube-leader's object watch).

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use hyper::{Request, Uri};
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client as Pool},
    rt::{TokioExecutor, TokioTimer},
};
use kube::{
    client::{ClientBuilder, ConfigExt},
    Client, Config,
};
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt as _};

/// The shortest bound of each kind, whatever the renew deadline: below it a loaded machine
/// would take a slow answer for a dead server.
const FLOOR: Duration = Duration::from_millis(500);

/// The renew deadline whose bounds a command that does not campaign (`status`) uses: the
/// default `--renew-deadline`.
pub(crate) const ONE_OFF_RENEW_DEADLINE: Duration = Duration::from_secs(10);

/// How long the client waits for a silent API server before it gives up on the connection or
/// the request, derived from the renew deadline (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Liveness {
    /// TCP connect and TLS handshake, together: half the renew deadline.
    pub(crate) connect: Duration,
    /// From sending a request to its response headers (for a watch: its start): the renew
    /// deadline, at least the library's API timeout (half of it for a Lease).
    pub(crate) headers: Duration,
    /// HTTP/2: PING after this long without a frame read, and wait this long for its answer: a
    /// third of the renew deadline each.
    pub(crate) keep_alive: Duration,
}

// === impl Liveness ===

impl Liveness {
    /// The bounds for a candidate whose leadership ends `renew_deadline` after its last
    /// confirmation, each at least 500 ms.
    pub(crate) fn for_renew_deadline(renew_deadline: Duration) -> Self {
        Self {
            connect: (renew_deadline / 2).max(FLOOR),
            headers: renew_deadline.max(FLOOR),
            keep_alive: (renew_deadline / 3).max(FLOOR),
        }
    }
}

/// A client for `config`: HTTP/2 where the server offers it, kube's own HTTP/1.1 client behind
/// a proxy or with `use_http1` (`--http1`; see the module docs).
pub(crate) fn build(config: Config, liveness: Liveness, use_http1: bool) -> kube::Result<Client> {
    if use_http1 || config.proxy_url.is_some() {
        http1(config, liveness)
    } else {
        http2(config, liveness)
    }
}

/// kube's own client (HTTP/1.1, and proxies), with the connect and response-headers bounds.
pub(crate) fn http1(mut config: Config, liveness: Liveness) -> kube::Result<Client> {
    // kube bounds its whole connector (a proxy's, TCP and TLS) by `connect_timeout`.
    config.connect_timeout = Some(connect_bound(&config, liveness));
    let headers = HeadersTimeoutLayer(liveness.headers);
    Ok(ClientBuilder::try_from(config)?.with_layer(&headers).build())
}

/// kube's layers over a pool that speaks HTTP/2 where the server offers it, with every bound
/// of [`Liveness`].
pub(crate) fn http2(config: Config, liveness: Liveness) -> kube::Result<Client> {
    let connect = connect_bound(&config, liveness);
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(connect));
    http.set_nodelay(true);
    let mut tls = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = name
            .clone()
            .try_into()
            .map_err(|e| kube::Error::Service(format!("invalid tls-server-name {name:?}: {e}").into()))?;
        tls = tls.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = BoundedConnect {
        inner: tls.enable_http1().enable_http2().wrap_connector(http),
        timeout: connect,
    };
    let pool: Pool<_, kube::client::Body> = Pool::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(liveness.keep_alive)
        .http2_keep_alive_timeout(liveness.keep_alive)
        .http2_keep_alive_while_idle(true)
        .build(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .layer(HeadersTimeoutLayer(liveness.headers))
        .service(pool.map_err(BoxError::from));
    Ok(Client::new(service, config.default_namespace))
}

/// The connect bound: the configuration's connect timeout, if shorter.
fn connect_bound(config: &Config, liveness: Liveness) -> Duration {
    config
        .connect_timeout
        .map_or(liveness.connect, |t| t.min(liveness.connect))
}

/// A connector whose connections (TCP, then TLS) are made within `timeout`, or fail saying so.
#[derive(Debug, Clone)]
struct BoundedConnect<C> {
    inner: C,
    timeout: Duration,
}

impl<C> Service<Uri> for BoundedConnect<C>
where
    C: Service<Uri>,
    C::Error: Into<BoxError>,
    C::Future: Send + 'static,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let timeout = self.timeout;
        let what = format!(
            "{}:{}",
            uri.host().unwrap_or_default(),
            uri.port_u16().unwrap_or(443)
        );
        let connecting = self.inner.call(uri);
        Box::pin(async move {
            match tokio::time::timeout(timeout, connecting).await {
                Ok(r) => r.map_err(Into::into),
                Err(_) => {
                    Err(format!("TCP connect and TLS handshake with {what} took over {timeout:?}").into())
                }
            }
        })
    }
}

/// Bounds the wait for response headers: a request the API server does not start answering
/// within the bound fails (for a watch: its start; the body streams on unbounded).
#[derive(Debug, Clone, Copy)]
struct HeadersTimeoutLayer(Duration);

impl<S> Layer<S> for HeadersTimeoutLayer {
    type Service = HeadersTimeout<S>;

    fn layer(&self, inner: S) -> Self::Service {
        HeadersTimeout {
            inner,
            timeout: self.0,
        }
    }
}

/// See [`HeadersTimeoutLayer`].
#[derive(Debug, Clone)]
struct HeadersTimeout<S> {
    inner: S,
    timeout: Duration,
}

impl<S, B> Service<Request<B>> for HeadersTimeout<S>
where
    S: Service<Request<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let timeout = self.timeout;
        let what = format!("{} {}", req.method(), req.uri().path());
        let answering = self.inner.call(req);
        Box::pin(async move {
            match tokio::time::timeout(timeout, answering).await {
                Ok(r) => r.map_err(|e| connect_error_in_words(e.into())),
                Err(_) => Err(format!("the API server did not answer {what} within {timeout:?}").into()),
            }
        })
    }
}

/// The pool's "client error (Connect)" says nothing of the cause it wraps (a refused
/// connection, a timeout, a certificate): such an error becomes one message with its causes.
fn connect_error_in_words(e: BoxError) -> BoxError {
    let is_connect = e
        .downcast_ref::<hyper_util::client::legacy::Error>()
        .is_some_and(hyper_util::client::legacy::Error::is_connect);
    if !is_connect {
        return e;
    }
    let mut message = "cannot connect to the API server".to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        message.push_str(": ");
        message.push_str(&c.to_string());
        cause = c.source();
    }
    message.into()
}
