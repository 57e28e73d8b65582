//! `kube-leader elect`: a candidate without COMMAND that serves who leads over HTTP, for a
//! program that asks "am I the leader?" itself (the retired `leader-elector` sidecar's and
//! nais/elector's API: `GET /` → `{"name", "last_update"}`, `GET /sse`).
//!
//! It campaigns as `run` does (the same elector, status server and Pod label, built by the same
//! functions), leads until leadership is lost, then campaigns again. A stop signal (SIGTERM,
//! SIGINT, SIGQUIT) releases the lock, so that another candidate takes over at once, and ends
//! it with 0. A leader for life whose own Pod is ending deletes its lock at once and then only
//! serves, until the stop signal that the kubelet sends.

use std::time::Duration;

use anyhow::anyhow;
use kube_leader::internal::StrategyExt as _;
use kube_leader::{Leadership, LockRef, LossReason};
use tracing::{info, warn};

use crate::{
    cli::ElectArgs,
    cluster,
    exit::{self, Fail, OrExit},
    label::PodLabel,
    run::{self, is_stop, Signals},
    state::Status,
};

/// `kube-leader elect`: returns the exit code.
pub(crate) async fn elect(args: ElectArgs) -> Result<u8, Fail> {
    let args = args.as_run();
    let mut signals = Signals::new(&crate::supervisor::FORWARDED).or_exit(exit::INTERNAL)?;
    let client = cluster::connect(&args.cluster, args.connect_timeout, args.renew_deadline).await?;
    let namespace = cluster::resolve_namespace(args.lock.namespace.as_deref(), &client);
    let rbac = format!(
        "kube-leader rbac --strategy {} --lock {} --namespace {namespace}",
        args.lock.strategy, args.lock.lock
    );
    let elector = args.elector_service_account.as_deref();
    let client = cluster::as_elector(client, &namespace, elector, &rbac).await?;
    let lock = LockRef::new(namespace, args.lock.lock.clone()).or_exit(exit::USAGE)?;
    let identity = cluster::resolve_identity(args.identity.as_deref())
        .ok_or_else(|| Fail::new(exit::USAGE, anyhow!(run::NO_IDENTITY)))?;
    let pod = run::own_pod_from_env(&identity);
    let elector = crate::candidate::elector(client.clone(), &args, &identity, pod).or_exit(exit::USAGE)?;
    let served = run::Served {
        addr: args.status_addr,
        ready_only_when_leader: args.ready_only_when_leader,
        health_tolerance: args.lease_duration,
    };
    let (elector, status) = run::serve_status(elector, &lock, &identity, served).await?;
    let label = run::pod_label(args.label_pod, &client, &lock, &identity);
    info!(lock = %lock, identity = %identity, strategy = args.lock.strategy.as_str(),
        "campaigning (elect: no COMMAND)");
    loop {
        let campaign = run::campaign(
            &elector,
            &mut signals,
            &status,
            label.as_ref(),
            args.renew_deadline,
        );
        let Some(leadership) = campaign.await? else {
            break;
        };
        match hold(&status, &leadership, label.as_ref(), &mut signals).await {
            Held::Lost(LossReason::PodEnding { .. }) => {
                // The lock goes with the Pod: delete it now (UID precondition), then only serve.
                release(&status, leadership, args.renew_deadline).await;
                wait_for_stop(&mut signals).await;
                break;
            }
            Held::Lost(_) => {}
            Held::Stopped => {
                release(&status, leadership, args.renew_deadline).await;
                break;
            }
        }
    }
    if let Some(label) = &label {
        label.set(false);
        label.settle(Duration::from_secs(10)).await;
    }
    Ok(0)
}

/// How a term ended.
#[derive(Debug)]
enum Held {
    /// Leadership was lost, for this reason.
    Lost(LossReason),
    /// A stop signal came while leading.
    Stopped,
}

/// Leads until leadership is lost or a stop signal comes; the status and the label follow.
async fn hold(
    status: &Status,
    leadership: &Leadership,
    label: Option<&PodLabel>,
    signals: &mut Signals,
) -> Held {
    let token = leadership.fencing_token();
    let held = loop {
        tokio::select! {
            biased;
            reason = leadership.lost() => {
                status.lose(token, &reason.to_string(), false);
                break Held::Lost(reason);
            }
            kind = signals.recv() => {
                if is_stop(kind) {
                    status.lose(token, &format!("signal {}", kind.as_raw_value()), true);
                    break Held::Stopped;
                }
            }
        }
    };
    if let Some(label) = label {
        label.set(false);
    }
    held
}

/// Steps down: releases the lock within the renew deadline (a lost lease is not released).
async fn release(status: &Status, leadership: Leadership, deadline: Duration) {
    let lock = &status.lock;
    if leadership.is_skipped() {
        return;
    }
    match tokio::time::timeout(deadline, leadership.release()).await {
        Ok(Ok(())) => info!(lock = %lock, identity = %status.identity, "released the lock"),
        Ok(Err(e)) => warn!(lock = %lock, error = %e, "could not release the lock"),
        Err(_) => warn!(lock = %lock, "releasing the lock timed out"),
    }
}

/// Serves on until a stop signal.
async fn wait_for_stop(signals: &mut Signals) {
    while !is_stop(signals.recv().await) {}
}
