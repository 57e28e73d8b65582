//! `kube-leader run`: campaign, run COMMAND while leading, stop it when leadership ends.
//!
//! This file campaigns; [`leading`] runs COMMAND ([`command`]) while leading and steps down;
//! [`cluster`] finds the API server, namespace and identity; [`signals`] are those kube-leader
//! receives and forwards.

use std::{sync::Arc, time::Duration};

use anyhow::anyhow;
use kube::Client;
use kube_leader::{LeaderInfo, Leadership, LockRef};
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    cli::{LogFormat, RunArgs},
    exit::{self, Fail, OrExit},
    label::PodLabel,
    metrics::secs,
    server,
    state::Status,
    supervisor::{self, Supervisor},
};

mod command;
mod leading;
mod own_pod;
mod signals;

use crate::cluster::{connect, resolve_identity, resolve_namespace};
use leading::Leading;
pub(crate) use signals::{is_stop, Signals};

/// `kube-leader run`: returns the exit code.
pub(crate) async fn run(args: RunArgs, log_format: LogFormat) -> Result<u8, Fail> {
    // Before anything else, so that a signal during start-up is not lost.
    let mut signals = Signals::new().or_exit(exit::INTERNAL)?;
    // Orphans of COMMAND (and COMMAND itself, should its supervisor die) come to us, not init.
    supervisor::become_subreaper();
    tokio::spawn(supervisor::reap_orphans());
    let client = connect(&args.cluster, args.connect_timeout, args.renew_deadline).await?;
    let namespace = resolve_namespace(args.lock.namespace.as_deref(), &client);
    let lock = LockRef::new(namespace, args.lock.lock.clone()).or_exit(exit::USAGE)?;
    let identity = resolve_identity(args.identity.as_deref()).ok_or_else(|| {
        Fail::new(
            exit::USAGE,
            anyhow!("no identity: set --identity, or POD_NAME, or a host name"),
        )
    })?;
    let mut candidate_pod = None;
    if args.watch_own_pod && !args.lock.strategy.watches_own_pod() {
        let (namespace, pod) = own_pod_name(&identity, &client);
        let (ending, pod) = own_pod::watch(client.clone(), &namespace, &pod).await?;
        signals.stop_when_pod_ends(ending);
        candidate_pod = Some(pod);
    }
    let elector =
        crate::candidate::elector(client.clone(), &args, &identity, candidate_pod).or_exit(exit::USAGE)?;
    let status = serve_status(&args, &lock, &identity, &elector).await?;
    let label = pod_label(&args, &client, &lock, &identity);
    let fence = crate::fence::proxy_user(&args)?.map(|user| (client.clone(), user));

    // The supervisor, and COMMAND's process, get ready while this candidate follows: winning
    // then costs one message and COMMAND's exec.
    let standby = match Supervisor::spawn(&args.command, args.grace(), log_format) {
        Ok(s) => Some(s),
        Err(e) => {
            warn!(error = %format!("{e:#}"), "cannot start the supervisor in advance");
            None
        }
    };
    info!(lock = %lock, identity = %identity, strategy = args.lock.strategy.as_str(),
        grace = %humantime::format_duration(args.grace()), "campaigning");
    let started = Instant::now();
    let Some(leadership) = campaign(&elector, &mut signals, &lock, &identity, args.renew_deadline).await?
    else {
        return Ok(0);
    };
    status.metrics.acquire.observe(secs(started.elapsed()));
    lead(&status, &leadership, label.as_ref());
    let leading = Leading {
        args: &args,
        log_format,
        status: &status,
        label: label.as_ref(),
        fence,
    };
    let code = leading
        .run(leadership, standby, elector.renewals(), &mut signals)
        .await;
    if let Some(label) = &label {
        label.set(false);
        label.settle(Duration::from_secs(10)).await;
    }
    Ok(code)
}

/// This candidate's Pod: its namespace (POD_NAMESPACE, else the service-account namespace,
/// else the client's) and name (POD_NAME, else the identity).
fn own_pod_name(identity: &str, client: &Client) -> (String, String) {
    let namespace = kube_leader::internal::discovery::namespace_or_default(None, client);
    let name = kube_leader::internal::discovery::pod_name_from_env().unwrap_or_else(|| identity.to_owned());
    (namespace, name)
}

/// The status (and the `--status-addr` server), fed with the leader as observed.
pub(crate) async fn serve_status(
    args: &RunArgs,
    lock: &LockRef,
    identity: &str,
    elector: &kube_leader::Elector,
) -> Result<Arc<Status>, Fail> {
    // The watchdog flags a leader that has not renewed for twice the lease duration.
    let status = Arc::new(Status::new(
        lock.clone(),
        identity.to_string(),
        args.lock.strategy,
        args.ready_only_when_leader,
        elector.clone(),
        args.lease_duration,
    ));
    if let Some(addr) = args.status_addr {
        let (listener, _) = server::bind(addr).await.map_err(|e| {
            Fail::new(
                exit::USAGE,
                anyhow!(e).context(format!("cannot listen on --status-addr {addr}")),
            )
        })?;
        tokio::spawn(server::serve(listener, status.clone()));
    }
    // The Lease candidate publishes what its own watch sees; leader for life needs a watch.
    let leader = elector.observe(lock);
    tokio::spawn(observe(leader, status.clone()));
    Ok(status)
}

/// The Pod label of `--label-pod`, set to "not leader".
pub(crate) fn pod_label(args: &RunArgs, client: &Client, lock: &LockRef, identity: &str) -> Option<PodLabel> {
    let label = args.label_pod.then(|| {
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

/// Campaigns until elected (`Some`), or until a signal stops kube-leader first (`None`).
pub(crate) async fn campaign(
    elector: &kube_leader::Elector,
    signals: &mut Signals,
    lock: &LockRef,
    identity: &str,
    renew_deadline: Duration,
) -> Result<Option<Leadership>, Fail> {
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
    Ok(Some(leadership))
}

/// Elected: the status and the Pod label say so.
pub(crate) fn lead(status: &Status, leadership: &Leadership, label: Option<&PodLabel>) {
    if leadership.is_skipped() {
        warn!(lock = %status.lock, identity = %status.identity,
            "not running in a cluster: skipping the election and running COMMAND in every replica \
             that finds no namespace (--on-outside-cluster skip); set --namespace or POD_NAMESPACE \
             to elect one leader");
    }
    status.lead(leadership.fencing_token(), leadership.acquired_at());
    if let Some(label) = label {
        label.set(true);
    }
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
