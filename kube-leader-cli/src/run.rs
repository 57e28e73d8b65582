//! `kube-leader run`: campaign, run COMMAND while leading, stop it when leadership ends.
//!
//! This file campaigns; [`candidate`] keeps the status, the Pod label and the campaign;
//! [`leading`] runs COMMAND ([`command`]) while leading and steps down; [`signals`] are those
//! kube-leader receives and forwards; [`own_pod`] is `--watch-own-pod`.

use std::time::Duration;

use anyhow::anyhow;
use kube_leader::{discovery, LockRef};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::{
    cli::{LogFormat, RunArgs},
    cluster::connect,
    exit::{self, Fail, OrExit},
    metrics::secs,
    supervisor::{self, Launch},
};

mod candidate;
mod command;
mod leading;
mod own_pod;
mod signals;

pub(crate) use candidate::{campaign, lead, pod_label, serve_status, Served};
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
    let namespace = discovery::namespace_or_default(args.lock.namespace.as_deref(), &client);
    let identity = discovery::resolve_identity(args.identity.as_deref()).ok_or_else(|| {
        Fail::new(
            exit::USAGE,
            anyhow!("no identity: set --identity, or POD_NAME, or a host name"),
        )
    })?;
    let lock = LockRef::new(namespace, args.lock.lock.clone()).or_exit(exit::USAGE)?;
    let mut candidate_pod = None;
    if args.watch_own_pod && !args.lock.strategy.watches_own_pod() {
        let (ending, pod) = own_pod::watch_own(client.clone(), &identity).await?;
        signals.stop_when_pod_ends(ending);
        candidate_pod = Some(pod);
    }
    let elector =
        crate::elector::elector(client.clone(), &args, &identity, candidate_pod).or_exit(exit::USAGE)?;
    let served = Served {
        addr: args.status_addr,
        ready_only_when_leader: args.ready_only_when_leader,
        health_tolerance: args.lease_duration,
    };
    let (elector, status) = serve_status(elector, &lock, &identity, served).await?;
    let label = pod_label(args.label_pod, &client, &lock, &identity);
    let fence =
        crate::fence::proxy_user(args.fence, args.fence_user.clone())?.map(|user| (client.clone(), user));

    // The supervisor, and COMMAND's process, get ready while this candidate follows: winning
    // then costs one message and COMMAND's exec.
    let launch = Launch {
        grace: args.grace(),
        command: args.command,
        log_format,
    };
    let standby = match launch.spawn() {
        Ok(s) => Some(s),
        Err(e) => {
            warn!(error = %format!("{e:#}"), "cannot start the supervisor in advance");
            None
        }
    };
    info!(lock = %lock, identity = %identity, strategy = args.lock.strategy.as_str(),
        grace = %humantime::format_duration(launch.grace), "campaigning");
    let started = Instant::now();
    let Some(leadership) = campaign(&elector, &mut signals, &lock, &identity, args.renew_deadline).await?
    else {
        return Ok(0);
    };
    status.metrics.acquire.observe(secs(started.elapsed()));
    lead(&status, &leadership, label.as_ref());
    let leading = Leading {
        launch: &launch,
        renew_deadline: args.renew_deadline,
        retry_period: args.retry_period,
        status: &status,
        label: label.as_ref(),
        fence,
    };
    let code = leading.run(leadership, standby, &mut signals).await;
    if let Some(label) = &label {
        label.set(false);
        label.settle(Duration::from_secs(10)).await;
    }
    Ok(code)
}
