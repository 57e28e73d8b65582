//! The start-up of `run` and `run --shards`: signals caught first, orphans reaped, the cluster
//! connected, the namespace and identity resolved, the own Pod watched if asked.

use anyhow::anyhow;
use kube_leader::{internal::discovery, CandidatePod};
use tokio::signal::unix::SignalKind;

use super::{own_pod, signals::Signals};
use crate::{
    cli::RunArgs,
    cluster::{as_elector, connect},
    exit::{self, Fail, OrExit},
    supervisor,
};

/// Why a candidate cannot go on without an identity.
pub(crate) const NO_IDENTITY: &str = "no identity: set --identity, or POD_NAME, or a host name";

/// What a run starts with.
pub(crate) struct SetUp {
    /// The signals caught, the own Pod's end among them if watched.
    pub(crate) signals: Signals,
    /// kube-leader's own client: as `--elector-service-account` where given, else as the Pod.
    pub(crate) client: kube::Client,
    /// The client of the Pod's own identity, for COMMAND's requests (`--fence`'s proxy).
    pub(crate) own: kube::Client,
    pub(crate) namespace: String,
    pub(crate) identity: String,
    /// This candidate's Pod: watched, or from the Downward API (`POD_UID`).
    pub(crate) pod: Option<CandidatePod>,
}

/// Catches `kinds` (before anything else, so that a signal during start-up is not lost),
/// becomes the subreaper of COMMAND's orphans, connects (as the elector too, where given), and
/// resolves the namespace and identity. With `watch_own_pod`, watches this candidate's Pod: its
/// end stands for a SIGTERM.
pub(crate) async fn set_up(args: &RunArgs, kinds: &[SignalKind], watch_own_pod: bool) -> Result<SetUp, Fail> {
    let mut signals = Signals::new(kinds).or_exit(exit::INTERNAL)?;
    // Orphans of COMMAND (and COMMAND itself, should its supervisor die) come to us, not init.
    supervisor::become_subreaper();
    tokio::spawn(supervisor::reap_orphans());
    let pod_client = connect(&args.cluster, args.connect_timeout, args.renew_deadline).await?;
    let namespace = discovery::namespace_or_default(args.lock.namespace.as_deref(), &pod_client);
    let identity = discovery::resolve_identity(args.identity.as_deref())
        .ok_or_else(|| Fail::new(exit::USAGE, anyhow!(NO_IDENTITY)))?;
    let rbac = match args.shards {
        Some(m) => format!(
            "kube-leader rbac --shards {m} --lock {} --namespace {namespace}",
            args.lock.lock
        ),
        None => format!(
            "kube-leader rbac --strategy {} --lock {} --namespace {namespace}",
            args.lock.strategy, args.lock.lock
        ),
    };
    let elector = args.elector_service_account.as_deref();
    let client = as_elector(pod_client.clone(), &namespace, elector, &rbac).await?;
    let mut pod = own_pod::from_env(&identity);
    if watch_own_pod {
        let (ending, own) = own_pod::watch_own(client.clone(), &identity).await?;
        signals.stop_when_pod_ends(ending);
        pod = Some(own);
    }
    Ok(SetUp {
        signals,
        client,
        own: pod_client,
        namespace,
        identity,
        pod,
    })
}
