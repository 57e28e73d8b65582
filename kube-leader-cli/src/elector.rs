//! The candidate `run` campaigns as: the library's [`Elector`] built from the flags.

use kube::Client;
use kube_leader::{
    options::ElectorOptions, CandidatePod, DeadLeaderPod, Elector, LockRef, OutsideCluster, Strategy,
    Successor,
};

use crate::cli::{DeadLeaderPodArg, OutsideClusterArg, RunArgs, StrategyArg, SuccessorArg};

impl From<StrategyArg> for Strategy {
    fn from(s: StrategyArg) -> Self {
        match s {
            StrategyArg::ForLife => Strategy::ForLife,
            StrategyArg::Lease => Strategy::Lease,
        }
    }
}

impl From<DeadLeaderPodArg> for DeadLeaderPod {
    fn from(p: DeadLeaderPodArg) -> Self {
        match p {
            DeadLeaderPodArg::Keep => DeadLeaderPod::Keep,
            DeadLeaderPodArg::DeleteEvicted => DeadLeaderPod::DeleteEvicted,
            DeadLeaderPodArg::DeleteTerminal => DeadLeaderPod::DeleteTerminal,
        }
    }
}

/// The candidate `run` campaigns as: the library's mapping of the settings both strategies
/// share ([`ElectorOptions`], which validates them), then the options of one strategy.
///
/// Leader for life gets the namespace only when it was given with `--namespace`: without it
/// the library looks at `POD_NAMESPACE` and the service-account file, and finding neither is how
/// it knows it runs outside a cluster (`--on-outside-cluster`).
///
/// `pod`: this candidate's Pod, where `run` read it (`--watch-own-pod`), for the Lease
/// candidate's registration (leader for life reads its Pod itself).
pub(crate) fn elector(
    client: Client,
    args: &RunArgs,
    lock: &LockRef,
    identity: &str,
    pod: Option<CandidatePod>,
) -> anyhow::Result<Elector> {
    let mut options = ElectorOptions::new(args.lock.strategy.into(), lock.name.clone());
    options.namespace = match args.lock.strategy {
        StrategyArg::ForLife => args.lock.namespace.clone(),
        StrategyArg::Lease => Some(lock.namespace.clone()),
    };
    options.identity = Some(identity.to_string());
    options.timings = (args.lease_duration, args.renew_deadline, args.retry_period);
    options.successor = match args.successor {
        SuccessorArg::Youngest => Successor::Youngest,
        SuccessorArg::Any => Successor::Any,
    };
    options.successor_wait = args.successor_wait;
    Ok(match options.elector(client)? {
        Elector::ForLife(e) => e
            .outside_cluster(match args.on_outside_cluster {
                OutsideClusterArg::Skip => OutsideCluster::Skip,
                OutsideClusterArg::Fail => OutsideCluster::Fail,
            })
            .not_ready_takeover(args.not_ready_takeover)
            // COMMAND's SIGKILL comes --grace after its confirmation lapsed: advertised too.
            .liveness(args.liveness())
            .liveness_grace(args.grace())
            .dead_leader_pod(args.dead_leader_pod.map_or(DeadLeaderPod::default(), Into::into))
            .into(),
        Elector::Lease(e) => match pod {
            Some(pod) => e.candidate_pod(pod).into(),
            None => e.into(),
        },
        other => other,
    })
}
