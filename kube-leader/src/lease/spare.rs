//! A follower's spare connection: its takeover write must not be the first request of a new
//! connection.
//!
//! Over kube's own client (HTTP/1.1) a follower's Lease watch holds the connection it opened,
//! so without another request since, the write that takes over after a release opens a new TCP
//! and TLS connection. kube's connector does not set `TCP_NODELAY`: the request is written right
//! after the client's TLS `Finished`, which the API server has not acknowledged yet, so Nagle's
//! algorithm holds it until the server's delayed ACK (about 40 ms on Linux). A connection past
//! its first exchange has nothing unacknowledged when the next request is written, which then
//! goes at once (docs/benchmarks.md, "Why kube's client took 40 ms more").
//!
//! So a campaign that follows sends one read of the lock, from the API server's cache
//! (`resourceVersion=0`), beside its open watch, once: kube's pool then keeps a second
//! connection, idle and warm, for the takeover write. It stays in the pool for hyper's idle
//! timeout (90 s) after its last request; a follower without a Pod renews its registration every
//! [`REGISTRATION_HEARTBEAT`](crate::successor::REGISTRATION_HEARTBEAT) over it, which keeps it.
//! Over HTTP/2 (feature `http2`) the read shares the one connection and costs one request.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::{api::GetParams, Api};
use tokio_util::sync::CancellationToken;
use tracing::{debug, Instrument as _};

/// Bound on the read: it is an optimisation, never waited for.
const BOUND: Duration = Duration::from_secs(10);

/// Whether a campaign has opened its spare connection.
#[derive(Debug, Default)]
pub(crate) struct Spare {
    opened: bool,
}

impl Spare {
    /// Sends the read of `name` once per campaign, in a task of its own (ended by `shutdown`).
    /// Any answer warms the connection, a refusal too: its outcome is only logged.
    pub(crate) fn open_once(&mut self, api: &Api<Lease>, name: &str, shutdown: &CancellationToken) {
        if std::mem::replace(&mut self.opened, true) {
            return;
        }
        let (api, name, shutdown) = (api.clone(), name.to_string(), shutdown.clone());
        let read = async move {
            let cached = GetParams::any();
            let get = api.get_metadata_opt_with(&name, &cached);
            tokio::select! {
                () = shutdown.cancelled() => {}
                r = tokio::time::timeout(BOUND, get) => match r {
                    Ok(Ok(_)) => debug!("a spare connection is ready for the takeover write"),
                    Ok(Err(e)) => debug!(error = %e, "the spare connection's read failed"),
                    Err(_) => debug!("the spare connection's read timed out"),
                },
            }
        };
        tokio::spawn(read.in_current_span());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// One read of the lock from the cache per campaign, however often it follows.
    #[tokio::test]
    async fn a_campaign_reads_the_lock_once_for_its_spare_connection() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let client = kube::Client::new(
            tower::service_fn(move |req: http::Request<kube::client::Body>| {
                s.lock().unwrap().push(format!("{} {}", req.method(), req.uri()));
                async {
                    let not_found = http::Response::builder().status(404);
                    Ok::<_, std::convert::Infallible>(not_found.body(kube::client::Body::empty()).unwrap())
                }
            }),
            "ns",
        );
        let api: Api<Lease> = Api::namespaced(client, "ns");
        let (mut spare, shutdown) = (Spare::default(), CancellationToken::new());
        for _ in 0..3 {
            spare.open_once(&api, "lock", &shutdown);
        }
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            *seen.lock().unwrap(),
            ["GET /apis/coordination.k8s.io/v1/namespaces/ns/leases/lock?&resourceVersion=0"]
        );
        shutdown.cancel();
    }
}
