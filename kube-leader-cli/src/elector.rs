//! The candidate `run` campaigns as: the flags as one [`Candidate`], the one place the flags
//! meet the library. It names no strategy: the candidate refuses the options a strategy does
//! not have (`validate`), and builds the [`Elector`].

use kube::Client;
use kube_leader::{CandidatePod, Coordinated, DeadLeaderPod, Elector, OutsideCluster, Successor};

use crate::{
    candidate::{Candidate, Liveness},
    cli::{DeadLeaderPodArg, OutsideClusterArg, RbacArgs, RunArgs, SuccessorArg, DEFAULT_LIVENESS},
};

impl From<DeadLeaderPodArg> for DeadLeaderPod {
    fn from(p: DeadLeaderPodArg) -> Self {
        match p {
            DeadLeaderPodArg::Keep => DeadLeaderPod::Keep,
            DeadLeaderPodArg::DeleteEvicted => DeadLeaderPod::DeleteEvicted,
            DeadLeaderPodArg::DeleteTerminal => DeadLeaderPod::DeleteTerminal,
        }
    }
}

impl RunArgs {
    /// The library's options these flags give: the lock (its namespace only when given with
    /// `--namespace`: without it the library looks at `POD_NAMESPACE`, the service-account file
    /// and the client, as `run` does, and leader for life finding none is how it knows it runs
    /// outside a cluster), the identity (`None`: the library's rule, as `run`'s), the timings and
    /// every strategy's own options as given.
    pub(crate) fn options(&self) -> Candidate {
        let mut options = Candidate::new(self.lock.strategy, self.lock.lock.clone());
        options.namespace = self.lock.namespace.clone();
        options.identity = self.identity.clone();
        options.lease_duration = self.lease_duration;
        options.renew_deadline = self.renew_deadline;
        options.retry_period = self.retry_period;
        options.successor = self.successor.into();
        options.successor_wait = self.successor_wait;
        options.grace = self.grace;
        options.allow_grace_beyond_lease = self.allow_grace_beyond_lease;
        // The sidecar's liveness heartbeat is on by default where the lock does not expire
        // by itself (COMMAND then stops when kube-leader cannot reach the API server).
        options.liveness = match self.liveness {
            Some(l) => Some(l.0.map_or(Liveness::Off, Liveness::Every)),
            None => (!self.lock.strategy.expires()).then_some(Liveness::Every(DEFAULT_LIVENESS)),
        };
        options.not_ready_takeover = self.not_ready_takeover;
        options.dead_leader_pod = self.dead_leader_pod.map(Into::into);
        options.outside_cluster = Some(match self.on_outside_cluster {
            OutsideClusterArg::Skip => OutsideCluster::Skip,
            OutsideClusterArg::Fail => OutsideCluster::Fail,
        });
        options.coordinated = coordinated(self.coordinated.as_deref(), self.emulation_version.as_deref());
        options
    }
}

impl RbacArgs {
    /// The options of the `run` a Role is printed for: a shard set's (`--shards`: Leases,
    /// whatever `--strategy` says), or a candidate's.
    pub(crate) fn options(&self) -> Candidate {
        let mut options = match self.shards {
            Some(_) => Candidate::shard_set(self.lock.lock.clone()),
            None => Candidate::new(self.lock.strategy, self.lock.lock.clone()),
        };
        options.successor = self.successor.into();
        options.dead_leader_pod = self.dead_leader_pod.map(Into::into);
        options.coordinated = coordinated(self.coordinated.as_deref(), None);
        options
    }
}

/// `--coordinated VERSION [--emulation-version VERSION]`.
fn coordinated(version: Option<&str>, emulation: Option<&str>) -> Option<Coordinated> {
    let c = Coordinated::new(version?);
    Some(match emulation {
        Some(e) => c.emulation_version(e),
        None => c,
    })
}

impl From<SuccessorArg> for Successor {
    fn from(s: SuccessorArg) -> Self {
        match s {
            SuccessorArg::Youngest => Successor::Youngest,
            SuccessorArg::Any => Successor::Any,
        }
    }
}

/// The candidate `run` campaigns as, with `identity` (as `run` resolved it) and, where `run`
/// read it (`--watch-own-pod`), this candidate's Pod for its registration.
pub(crate) fn elector(
    client: Client,
    args: &RunArgs,
    identity: &str,
    pod: Option<CandidatePod>,
) -> anyhow::Result<Elector> {
    let mut options = args.options();
    options.identity = Some(identity.to_string());
    // COMMAND's SIGKILL comes --grace after its confirmation lapsed: advertised too.
    options.grace = Some(args.grace());
    let elector = options.elector(client)?;
    Ok(match pod {
        Some(pod) => elector.candidate_pod(pod),
        None => elector,
    })
}
