//! The sidecar's API client: the library's ([`kube_leader::client`], feature `http2`), kube's
//! layers over a connection pool that speaks HTTP/2 when the API server offers it (every
//! Kubernetes API server does), so that the watches and the takeover write share one
//! connection. Its liveness bounds come from the renew deadline ([`Liveness`]).
//!
//! `--http1` (or `KUBE_LEADER_HTTP1=true`), or a proxy in the configuration, keeps kube's own
//! HTTP/1.1 client, with the same connect and response-headers bounds. It has no PINGs: a
//! connection that dies under an open watch is noticed by the watch's own idle timeout
//! (kube-runtime: the watch timeout plus 5 s), and leader for life also reads its objects when
//! a watch stays silent (kube-leader's object watch).

use std::time::Duration;

use hyper::http::{header::HeaderName, HeaderValue, Request};
use kube::{client::Body, Client, Config};
pub(crate) use kube_leader::internal::client::{http1, http2_with as http2, Liveness};
use tower::ServiceExt as _;

/// The renew deadline whose bounds a command that does not campaign (`status`) uses: the
/// default `--renew-deadline`.
pub(crate) const ONE_OFF_RENEW_DEADLINE: Duration = Duration::from_secs(10);

/// A client for `config`: HTTP/2 where the server offers it, kube's own HTTP/1.1 client behind
/// a proxy or with `use_http1` (`--http1`; see the module docs).
pub(crate) fn build(config: Config, liveness: Liveness, use_http1: bool) -> kube::Result<Client> {
    if use_http1 {
        http1(config, liveness)
    } else {
        http2(config, liveness)
    }
}

/// The user name of ServiceAccount `name` in `namespace`, as the API server writes it.
pub(crate) fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// `client` with every request sent as `user` (`Impersonate-User`), over `client`'s own
/// connections: kube-leader's requests as the elector's ServiceAccount, beside COMMAND's fenced
/// ones, which go through `client` itself as the Pod's. The API server runs its impersonation
/// filter before priority and fairness, so a FlowSchema classifies these requests by `user`.
///
/// # Errors
///
/// If `user` cannot be a header value (a control character).
pub(crate) fn impersonating(
    client: Client,
    user: &str,
) -> Result<Client, hyper::http::header::InvalidHeaderValue> {
    let value = HeaderValue::from_str(user)?;
    let namespace = client.default_namespace().to_owned();
    let service = tower::service_fn(move |mut req: Request<Body>| {
        req.headers_mut()
            .insert(HeaderName::from_static("impersonate-user"), value.clone());
        let client = client.clone();
        async move { client.send(req).await }
    });
    Ok(Client::new(service.map_err(tower::BoxError::from), namespace))
}
