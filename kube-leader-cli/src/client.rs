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

use kube::{Client, Config};
pub(crate) use kube_leader::internal::client::{http1, http2_with as http2, Liveness};

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
