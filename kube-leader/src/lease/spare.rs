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
//! So a campaign that follows reads the lock from the API server's cache (`resourceVersion=0`)
//! beside its open watch: kube's pool then keeps a second connection, idle and warm, for the
//! takeover write. hyper drops a connection idle for `90 s` (hyper-util's default, which kube
//! keeps), so the campaign reads again every
//! [`keep_warm`](crate::LeaseConfig::keep_warm) (default `60 s`) while it follows: one cached
//! read a minute per follower. The reads stop when the campaign ends (it leads, or shuts down).
//! Over HTTP/2 (feature `http2`) the read shares the one connection and costs one request.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::{api::GetParams, Api};
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::{debug, Instrument as _};

/// Bound on the read: it is an optimisation, never waited for.
const BOUND: Duration = Duration::from_secs(10);

/// A campaign's spare connection: the reads that keep it, stopped when this is dropped.
#[derive(Debug, Default)]
pub(crate) struct Spare {
    stop: Option<DropGuard>,
}

impl Spare {
    /// Starts the reads of `name` once per campaign, in a task of its own: one now, then one
    /// every `keep_warm` (if any) until this campaign ends (this is dropped) or `shutdown`. Any
    /// answer warms the connection, a refusal too: its outcome is only logged.
    pub(crate) fn open_once(
        &mut self,
        api: &Api<Lease>,
        name: &str,
        keep_warm: Option<Duration>,
        shutdown: &CancellationToken,
    ) {
        if self.stop.is_some() {
            return;
        }
        let stop = shutdown.child_token();
        self.stop = Some(stop.clone().drop_guard());
        let (api, name) = (api.clone(), name.to_string());
        let reads = async move {
            loop {
                let cached = GetParams::any();
                let get = api.get_metadata_opt_with(&name, &cached);
                tokio::select! {
                    () = stop.cancelled() => return,
                    r = tokio::time::timeout(BOUND, get) => match r {
                        Ok(Ok(_)) => debug!("a spare connection is ready for the takeover write"),
                        Ok(Err(e)) => debug!(error = %e, "the spare connection's read failed"),
                        Err(_) => debug!("the spare connection's read timed out"),
                    },
                }
                let Some(every) = keep_warm else { return };
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(every) => {}
                }
            }
        };
        tokio::spawn(reads.in_current_span());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    const READ: &str = "GET /apis/coordination.k8s.io/v1/namespaces/ns/leases/lock?&resourceVersion=0";

    /// A client that answers 404 to everything and records each request.
    fn recording_client() -> (Api<Lease>, Arc<Mutex<Vec<String>>>) {
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
        (Api::namespaced(client, "ns"), seen)
    }

    async fn settle() {
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
    }

    const KEEP_WARM: Duration = Duration::from_secs(60);

    /// One read of the lock from the cache when the campaign first follows, however often it
    /// follows; then one every `keep_warm` (under hyper's 90 s idle timeout) until the campaign
    /// ends, and none after.
    #[tokio::test(start_paused = true)]
    async fn a_following_campaign_keeps_its_spare_connection_warm_until_it_ends() {
        let (api, seen) = recording_client();
        let (mut spare, shutdown) = (Spare::default(), CancellationToken::new());
        for _ in 0..3 {
            spare.open_once(&api, "lock", Some(KEEP_WARM), &shutdown);
        }
        settle().await;
        assert_eq!(*seen.lock().unwrap(), [READ]);

        tokio::time::sleep(KEEP_WARM * 2 + Duration::from_millis(1)).await;
        settle().await;
        assert_eq!(*seen.lock().unwrap(), [READ; 3], "a read every {KEEP_WARM:?}");
        assert!(
            KEEP_WARM < Duration::from_secs(90),
            "hyper drops a connection idle for 90 s"
        );

        drop(spare);
        tokio::time::sleep(KEEP_WARM * 3).await;
        settle().await;
        assert_eq!(seen.lock().unwrap().len(), 3, "the campaign ended: no more reads");
    }

    /// Without `keep_warm`, one read per campaign.
    #[tokio::test(start_paused = true)]
    async fn without_keep_warm_a_campaign_reads_once() {
        let (api, seen) = recording_client();
        let (mut spare, shutdown) = (Spare::default(), CancellationToken::new());
        spare.open_once(&api, "lock", None, &shutdown);
        tokio::time::sleep(KEEP_WARM * 3).await;
        settle().await;
        assert_eq!(*seen.lock().unwrap(), [READ]);
        drop(spare);
    }

    /// The candidate's shutdown stops the reads too.
    #[tokio::test(start_paused = true)]
    async fn shutdown_stops_the_reads() {
        let (api, seen) = recording_client();
        let (mut spare, shutdown) = (Spare::default(), CancellationToken::new());
        spare.open_once(&api, "lock", Some(KEEP_WARM), &shutdown);
        settle().await;
        shutdown.cancel();
        tokio::time::sleep(KEEP_WARM * 3).await;
        settle().await;
        assert_eq!(*seen.lock().unwrap(), [READ]);
        drop(spare);
    }
}
