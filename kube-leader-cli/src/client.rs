//! The sidecar's API client: kube's layers (base URL, credentials, headers) over a connection
//! pool that speaks HTTP/2 when the API server offers it (every Kubernetes API server does).
//!
//! kube's own client speaks HTTP/1.1, where every open watch holds a connection of its own: a
//! follower that watches its lock (and the leader's Pod, and the leader for the status server)
//! has no idle connection left for the one write that takes over, and opens a new TCP and TLS
//! connection on the handover's path (tens of milliseconds; see docs/benchmarks.md). Over
//! HTTP/2 the watches and the writes share one connection, as client-go's do; HTTP/2 PINGs
//! (every 10 s, 10 s to answer) find a dead connection, which HTTP/1.1 left to each watch's
//! read timeout. `KUBE_LEADER_HTTP1=1`, or a proxy in the configuration, keeps kube's own
//! HTTP/1.1 client.

use std::time::Duration;

use hyper_util::{
    client::legacy::{connect::HttpConnector, Client as Pool},
    rt::{TokioExecutor, TokioTimer},
};
use kube::{client::ConfigExt, Client, Config};
use tower::{BoxError, ServiceBuilder, ServiceExt as _};

/// How often an HTTP/2 connection is PINGed, and how long an answer may take.
const KEEP_ALIVE: Duration = Duration::from_secs(10);

/// The renew deadline whose bounds a command that does not campaign (`status`) uses.
pub(crate) const ONE_OFF_RENEW_DEADLINE: Duration = Duration::from_secs(10);

/// Bounds derived from the renew deadline (not applied yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Liveness {
    /// TCP connect and TLS handshake.
    pub(crate) connect: Duration,
    /// Response headers.
    pub(crate) headers: Duration,
    /// HTTP/2 PINGs.
    pub(crate) keep_alive: Duration,
}

impl Liveness {
    /// The bounds for `renew_deadline`.
    pub(crate) fn for_renew_deadline(renew_deadline: Duration) -> Self {
        Self {
            connect: renew_deadline / 2,
            headers: renew_deadline,
            keep_alive: renew_deadline / 3,
        }
    }
}

/// A client for `config`: HTTP/2 where the server offers it (see the module docs).
pub(crate) fn build(config: Config, liveness: Liveness) -> kube::Result<Client> {
    if config.proxy_url.is_some() || std::env::var_os("KUBE_LEADER_HTTP1").is_some_and(|v| v == "1") {
        return http1(config, liveness);
    }
    http2(config, liveness)
}

/// kube's own client.
pub(crate) fn http1(config: Config, _liveness: Liveness) -> kube::Result<Client> {
    Client::try_from(config)
}

/// The HTTP/2 pool.
pub(crate) fn http2(config: Config, _liveness: Liveness) -> kube::Result<Client> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(config.connect_timeout);
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
    let https = tls.enable_http1().enable_http2().wrap_connector(http);
    let pool: Pool<_, kube::client::Body> = Pool::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(KEEP_ALIVE)
        .http2_keep_alive_timeout(KEEP_ALIVE)
        .http2_keep_alive_while_idle(true)
        .build(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .service(pool.map_err(BoxError::from));
    Ok(Client::new(service, config.default_namespace))
}
