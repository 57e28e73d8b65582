//! The clients: kube's layers over an HTTP/2 pool, or kube's own client with the same bounds.

use std::time::Duration;

use hyper_timeout::TimeoutConnector;
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client as Pool},
    rt::{TokioExecutor, TokioTimer},
};
use kube::{
    client::{retry::RetryPolicy, ClientBuilder, ConfigExt},
    Client, Config,
};
use tower::{retry::RetryLayer, BoxError, ServiceBuilder, ServiceExt as _};

use super::{
    liveness::Liveness,
    timeout::{BoundedConnect, HeadersTimeoutLayer},
    trace,
};

/// A client for `config` that speaks HTTP/2 where the API server offers it (every Kubernetes
/// API server does), with the bounds of `Liveness::for_renew_deadline(renew_deadline)`:
/// give it the renew deadline of the elector that uses it. With a proxy in `config` it is
/// kube's own client, with the same bounds.
///
/// Must be called within a tokio runtime (kube's [`Client`] spawns its buffer's worker).
///
/// # Errors
///
/// What [`kube::Client::try_from`] returns for the same configuration: credentials that
/// cannot be read or run (an exec plugin), invalid certificates or headers.
pub fn http2(config: Config, renew_deadline: Duration) -> kube::Result<Client> {
    http2_with(config, Liveness::for_renew_deadline(renew_deadline))
}

/// [`http2`] with bounds of your own.
///
/// # Errors
///
/// As [`http2`].
pub fn http2_with(config: Config, liveness: Liveness) -> kube::Result<Client> {
    if config.proxy_url.is_some() {
        return http1(config, liveness);
    }
    let connect = connect_bound(&config, liveness);
    // The headers bound replaces the read timeout: on a connection that multiplexes quiet
    // watches, a read timeout would close them all.
    let headers = config
        .read_timeout
        .map_or(liveness.headers, |t| t.min(liveness.headers));
    let pool: Pool<_, kube::client::Body> = Pool::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(liveness.keep_alive)
        .http2_keep_alive_timeout(liveness.keep_alive)
        .http2_keep_alive_while_idle(true)
        .build(connector(&config, connect)?);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .layer(trace::layer())
        .layer(HeadersTimeoutLayer(headers))
        .service(pool.map_err(BoxError::from));
    let client = Client::new(service, config.default_namespace.clone());
    keep_valid_until(client, &config)
}

/// kube's own client (HTTP/1.1, and proxies: `http-proxy` and `socks5` are kube's features)
/// with the connect and response-headers bounds of `liveness`; no PINGs. A connection that dies
/// under an open watch is noticed by the watch's own idle timeout (kube-runtime: the watch
/// timeout plus 5 s).
///
/// # Errors
///
/// As [`kube::Client::try_from`].
pub fn http1(mut config: Config, liveness: Liveness) -> kube::Result<Client> {
    // kube bounds its whole connector (a proxy's, TCP and TLS) by `connect_timeout`.
    config.connect_timeout = Some(connect_bound(&config, liveness));
    let headers = HeadersTimeoutLayer(liveness.headers);
    Ok(ClientBuilder::try_from(config)?.with_layer(&headers).build())
}

/// TCP with `TCP_NODELAY`, then TLS offering `h2` and `http/1.1` (ALPN), made within
/// `connect`; writes bounded by the configuration's write timeout.
fn connector(
    config: &Config,
    connect: Duration,
) -> kube::Result<BoundedConnect<TimeoutConnector<hyper_rustls::HttpsConnector<HttpConnector>>>> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(connect));
    // The release and the takeover are one small write each: no Nagle delay.
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
    let mut timeouts = TimeoutConnector::new(tls.enable_http1().enable_http2().wrap_connector(http));
    timeouts.set_write_timeout(config.write_timeout);
    Ok(BoundedConnect {
        inner: timeouts,
        timeout: connect,
    })
}

/// The connect bound: the configuration's connect timeout, if shorter.
fn connect_bound(config: &Config, liveness: Liveness) -> Duration {
    config
        .connect_timeout
        .map_or(liveness.connect, |t| t.min(liveness.connect))
}

/// `client` with the expiry of an exec plugin's client certificate (kube's
/// [`Client::valid_until`]), as kube's own client has it. kube reads it while it builds its
/// client and keeps it to itself: with an exec plugin, kube's client is built (the plugin runs
/// once more) for that one field.
fn keep_valid_until(client: Client, config: &Config) -> kube::Result<Client> {
    if config.auth_info.exec.is_none() {
        return Ok(client);
    }
    let kube = ClientBuilder::try_from(config.clone())?.build();
    Ok(client.with_valid_until(*kube.valid_until()))
}
