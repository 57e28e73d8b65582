//! `kube-leader run`: campaign, run COMMAND while leading, stop it when leadership ends.
//!
//! This file gathers what the candidate is; [`candidate`] keeps its status and Pod label and
//! campaigns; [`command`] runs COMMAND while leading; [`step_down`] ends the term as COMMAND's
//! end asks; [`signals`] are those kube-leader receives and forwards; [`own_pod`] is
//! `--watch-own-pod`; [`set_up`] is the start-up of `run` and `run --shards` alike.

use kube_leader::internal::StrategyExt as _;
use kube_leader::LockRef;
use tokio::time::Instant;
use tracing::info;

use crate::{
    cli::{LogFormat, RunArgs},
    exit::{self, Fail, OrExit},
    metrics::secs,
    supervisor::{self, Launch},
};

mod campaign;
mod command;
mod own_pod;
mod set_up;
mod signals;
mod step_down;

pub(crate) use campaign::{campaign, pod_label, serve_status, Served};
pub(crate) use command::Confirmed;
use command::{Running, Start};
pub(crate) use own_pod::from_env as own_pod_from_env;
pub(crate) use set_up::{set_up, SetUp, NO_IDENTITY};
pub(crate) use signals::{is_stop, Signals, STOPS};
use step_down::Leaving;

/// `kube-leader run`: returns the exit code.
pub(crate) async fn run(args: RunArgs, log_format: LogFormat) -> Result<u8, Fail> {
    let watch_own_pod = args.watch_own_pod && !args.lock.strategy.watches_own_pod();
    let SetUp {
        mut signals,
        client,
        own,
        namespace,
        identity,
        pod: candidate_pod,
    } = set_up(&args, &supervisor::FORWARDED, watch_own_pod).await?;
    let lock = LockRef::new(namespace, args.lock.lock.clone()).or_exit(exit::USAGE)?;
    let elector =
        crate::candidate::elector(client.clone(), &args, &identity, candidate_pod).or_exit(exit::USAGE)?;
    let served = Served {
        addr: args.status_addr,
        ready_only_when_leader: args.ready_only_when_leader,
        health_tolerance: args.lease_duration,
    };
    let (elector, status) = serve_status(elector, &lock, &identity, served).await?;
    let label = pod_label(args.label_pod, &client, &lock, &identity);
    // COMMAND's requests go as the Pod, never as the elector (`--elector-service-account`).
    let fence = crate::fence::proxy_user(args.fence, args.fence_user.clone())?.map(|user| (own, user));
    // The supervisor, and COMMAND's process, get ready while this candidate follows: winning
    // then costs one message and COMMAND's exec.
    let launch = Launch {
        grace: args.grace(),
        command: args.command,
        log_format,
    };
    let standby = launch.standby();
    info!(lock = %lock, identity = %identity, strategy = args.lock.strategy.as_str(),
        grace = %humantime::format_duration(launch.grace), "campaigning");
    let started = Instant::now();
    let renew_deadline = args.renew_deadline;
    let Some(leadership) = campaign(&elector, &mut signals, &status, label.as_ref(), renew_deadline).await?
    else {
        return Ok(0);
    };
    status.metrics.acquire.observe(secs(started.elapsed()));
    let start = Start {
        status: &status,
        label: label.as_ref(),
        launch: &launch,
        standby,
        fence,
        renew_deadline,
        retry_period: args.retry_period,
    };
    let running = Running::new(start, &leadership).await;
    let leaving = Leaving {
        status: &status,
        label: label.as_ref(),
        renew_deadline,
    };
    let code = match running {
        Some(mut running) => {
            let code = running.run(&leadership, &mut signals).await;
            leaving.end(leadership, running, code).await
        }
        None => leaving.not_started(leadership).await,
    };
    Ok(code)
}
