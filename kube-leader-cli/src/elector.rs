//! The candidate `run` campaigns as: the library's [`Elector`] built from the flags.

use kube::Client;
use kube_leader::{
    CandidatePod, DeadLeaderPod, Elector, ForLife, LeaseElector, LockRef, OutsideCluster, Strategy, Successor,
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

/// The candidate `run` campaigns as.
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
) -> Elector {
    let successor = match args.successor {
        SuccessorArg::Youngest => Successor::Youngest,
        SuccessorArg::Any => Successor::Any,
    };
    match args.lock.strategy {
        StrategyArg::ForLife => {
            let mut e = ForLife::new(client, lock.name.clone())
                .pod_name(identity)
                .outside_cluster(match args.on_outside_cluster {
                    OutsideClusterArg::Skip => OutsideCluster::Skip,
                    OutsideClusterArg::Fail => OutsideCluster::Fail,
                })
                .not_ready_takeover(args.not_ready_takeover)
                // COMMAND's SIGKILL comes --grace after its confirmation lapsed: advertised too.
                .liveness(args.liveness())
                .liveness_grace(args.grace())
                .dead_leader_pod(args.dead_leader_pod.map_or(DeadLeaderPod::default(), Into::into))
                .successor(successor)
                .successor_wait(args.successor_wait);
            if let Some(ns) = &args.lock.namespace {
                e = e.namespace(ns.clone());
            }
            e.into()
        }
        StrategyArg::Lease => {
            let mut config = args.lease_config();
            config.successor = successor;
            config.successor_wait = args.successor_wait;
            let mut e = LeaseElector::new(client, lock.name.clone())
                .namespace(lock.namespace.clone())
                .identity(identity)
                .config(config);
            if let Some(pod) = pod {
                e = e.candidate_pod(pod);
            }
            e.into()
        }
    }
}
