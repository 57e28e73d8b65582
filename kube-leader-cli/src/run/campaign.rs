//! The candidate around COMMAND, for `run` and `elect` alike: its status (and the status
//! server), its Pod label, its campaign, and what leading changes in them.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::anyhow;
use kube::Client;
use kube_leader::internal::ElectorExt as _;
use kube_leader::internal::StrategyExt as _;
use kube_leader::{Elector, LeaderInfo, Leadership, LockRef};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::signals::{is_stop, Signals};
use crate::{
    exit::{self, Fail},
    label::PodLabel,
    metrics::Metrics,
    server,
    state::Status,
};

/// What the status server is asked to do.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Served {
    /// `--status-addr`: where it listens, if anywhere.
    pub(crate) addr: Option<SocketAddr>,
    /// `--ready-only-when-leader`.
    pub(crate) ready_only_when_leader: bool,
    /// How long past the lease duration a leader may go without a renewal before `/healthz`
    /// fails.
    pub(crate) health_tolerance: Duration,
}

/// The status of `elector`'s campaign for `lock` (and the status server), fed with the
/// leader as observed; its metrics are fed by the elector's observations, so the elector is
/// returned with that observer.
pub(crate) async fn serve_status(
    elector: Elector,
    lock: &LockRef,
    identity: &str,
    served: Served,
) -> Result<(Elector, Arc<Status>), Fail> {
    let strategy = elector.strategy();
    let metrics = Metrics::new(&lock.namespace, &lock.name, strategy.as_str());
    // Before any clone: the observer is the elector's from the start.
    let elector = elector.observer(metrics.observer());
    let status = Arc::new(Status::new(
        lock.clone(),
        identity.to_string(),
        strategy,
        served.ready_only_when_leader,
        (elector.clone(), metrics),
        served.health_tolerance,
    ));
    if let Some(addr) = served.addr {
        let (listener, _) = server::bind(addr).await.map_err(|e| {
            Fail::new(
                exit::USAGE,
                anyhow!(e).context(format!("cannot listen on --status-addr {addr}")),
            )
        })?;
        tokio::spawn(server::serve(listener, status.clone()));
    }
    // The Lease candidate publishes what its own watch sees; leader for life needs a watch.
    tokio::spawn(observe(status.leader(), status.clone()));
    Ok((elector, status))
}

/// The Pod label of `--label-pod` (`label_pod`), set to "not leader".
pub(crate) fn pod_label(
    label_pod: bool,
    client: &Client,
    lock: &LockRef,
    identity: &str,
) -> Option<PodLabel> {
    let label = label_pod.then(|| {
        PodLabel::new(
            client.clone(),
            &lock.namespace,
            kube_leader::internal::discovery::pod_name_from_env().unwrap_or(identity.to_string()),
        )
    });
    if let Some(label) = &label {
        label.set(false);
    }
    label
}

/// Campaigns until elected (`Some`: the status and the Pod label say so), or until a signal
/// stops kube-leader first (`None`).
pub(crate) async fn campaign(
    elector: &Elector,
    signals: &mut Signals,
    status: &Status,
    label: Option<&PodLabel>,
    renew_deadline: Duration,
) -> Result<Option<Leadership>, Fail> {
    let (lock, identity) = (&status.lock, &status.identity);
    let cancel = CancellationToken::new();
    let campaign = elector.become_leader(&cancel);
    tokio::pin!(campaign);
    let mut stop_requested = false;
    let result = loop {
        tokio::select! {
            biased;
            r = &mut campaign => break r,
            kind = signals.recv(), if !stop_requested => {
                if is_stop(kind) {
                    info!(lock = %lock, identity = %identity, signal = kind.as_raw_value(), "stopping before leading");
                    stop_requested = true;
                    cancel.cancel();
                }
            }
        }
    };
    let leadership = match result {
        Ok(l) => l,
        Err(kube_leader::Error::Cancelled { .. }) => return Ok(None),
        // A follower whose Pod is going: it never campaigns again (exit 0, as on SIGTERM).
        Err(kube_leader::Error::Stopping { .. }) => return Ok(None),
        Err(e) => return Err(Fail::new(exit::for_error(&e), e)),
    };
    if stop_requested {
        // Won the race with the signal: step down at once.
        let _ = tokio::time::timeout(renew_deadline, leadership.release()).await;
        return Ok(None);
    }
    // Elected: the status and the Pod label say so.
    if leadership.is_skipped() {
        warn!(lock = %lock, identity = %identity,
            "not running in a cluster: skipping the election and running COMMAND in every replica \
             that finds no namespace (--on-outside-cluster skip); set --namespace or POD_NAMESPACE \
             to elect one leader");
    }
    status.lead(leadership.fencing_token(), leadership.term().acquired_at);
    if let Some(label) = label {
        label.set(true);
    }
    Ok(Some(leadership))
}

/// Feeds the watched leader into the status.
async fn observe(mut leader: watch::Receiver<Option<LeaderInfo>>, status: Arc<Status>) {
    loop {
        let info = leader.borrow_and_update().clone();
        status.observe(info.as_ref());
        if leader.changed().await.is_err() {
            return;
        }
    }
}
