//! The flags of `kube-leader elect`: those of `run` that a candidate without COMMAND uses.

use std::{net::SocketAddr, time::Duration};

use clap::Args;

use super::values::{parse_elector, parse_identity, parse_liveness};
use super::{
    parse_addr, parse_duration, ClusterArgs, DeadLeaderPodArg, LivenessArg, LockArgs, OutsideClusterArg,
    RunArgs, SuccessorArg,
};

/// `kube-leader elect`.
#[derive(Debug, Clone, Args)]
pub(crate) struct ElectArgs {
    #[command(flatten)]
    pub(crate) lock: LockArgs,

    #[command(flatten)]
    pub(crate) cluster: ClusterArgs,

    /// This candidate's identity, the `name` the server answers while it leads [default:
    /// POD_NAME, else the host name]. Leader for life needs the name of this candidate's Pod.
    #[arg(long, value_name = "ID", value_parser = parse_identity)]
    pub(crate) identity: Option<String>,

    /// How long a lease is valid after its last renewal was observed (lease).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "15s")]
    pub(crate) lease_duration: Duration,

    /// How long the leader keeps trying to renew before it stops leading (lease).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "10s")]
    pub(crate) renew_deadline: Duration,

    /// How often the leader renews, and how long candidates wait after a transient error.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "2s")]
    pub(crate) retry_period: Duration,

    /// Where to serve who leads: IP:PORT, :PORT for every interface, or localhost:PORT
    /// (`--http`, as leader-elector and nais/elector spell it). The program next to it asks
    /// `GET /` and compares `name` with its own identity.
    #[arg(long, visible_alias = "http", value_name = "ADDR", value_parser = parse_addr, default_value = ":4040")]
    pub(crate) status_addr: SocketAddr,

    /// Make /readyz answer 200 only while this candidate leads (default: once the first
    /// election result is known).
    #[arg(long)]
    pub(crate) ready_only_when_leader: bool,

    /// Label this candidate's Pod kube-leader.io/leader=true while it leads and =false
    /// otherwise, so that a Service can select the leader (needs patch pods).
    #[arg(long)]
    pub(crate) label_pod: bool,

    /// Leader for life outside a cluster: fail (exit 125), or skip the election and lead.
    #[arg(long, value_enum, default_value_t = OutsideClusterArg::Fail, value_name = "POLICY")]
    pub(crate) on_outside_cluster: OutsideClusterArg,

    /// How long to retry reaching the API server at start before giving up (exit code 123).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "30s")]
    pub(crate) connect_timeout: Duration,

    /// Leader for life only, opt-in: take over from a leader whose Node has not been Ready for
    /// this long (RISK: TWO LEADERS; see `kube-leader run --help`).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) not_ready_takeover: Option<Duration>,

    /// Leader for life only: what to do with a dead leader's Pod (see `kube-leader run --help`)
    /// [default: delete-evicted].
    #[arg(long, value_enum, value_name = "POLICY")]
    pub(crate) dead_leader_pod: Option<DeadLeaderPodArg>,

    /// Leader for life only: the liveness heartbeat on the lock, at least 1s, `off` disables it
    /// [default: 5s] (see `kube-leader run --help`). An ended leader Pod whose `elect` died
    /// without releasing is taken over once its heartbeat has not moved for this + 2s.
    #[arg(long, value_name = "DURATION", value_parser = parse_liveness)]
    pub(crate) liveness: Option<LivenessArg>,

    /// Who leads next when this candidate steps down: `youngest` (the default) or `any` (see
    /// `kube-leader run --help`).
    #[arg(long, value_enum, default_value_t = SuccessorArg::Youngest, value_name = "POLICY")]
    pub(crate) successor: SuccessorArg,

    /// With --successor youngest: how long a candidate that is not the preferred successor
    /// defers to it after a release.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "2s")]
    pub(crate) successor_wait: Duration,

    /// Lease: take part in Kubernetes' coordinated leader election as a candidate of this
    /// version (MAJOR.MINOR[.PATCH]): a LeaseCandidate is registered, the controller in
    /// kube-apiserver names the holder (the oldest emulation version), and this candidate never
    /// takes the Lease itself; it gives way when the controller prefers another. Needs the
    /// CoordinatedLeaderElection feature gate and coordination.k8s.io/v1beta1 (Kubernetes 1.33
    /// or later); without them kube-leader says so once and campaigns as a classic candidate.
    /// Not with --shards.
    #[arg(long, value_name = "VERSION")]
    pub(crate) coordinated: Option<String>,

    /// With --coordinated: the version this candidate emulates (default: --coordinated's).
    #[arg(long, value_name = "VERSION", requires = "coordinated")]
    pub(crate) emulation_version: Option<String>,

    /// Make kube-leader's own API requests as this ServiceAccount of the lock's namespace, by
    /// impersonation, rather than as the Pod's (see `kube-leader run --help`).
    #[arg(long, value_name = "NAME", value_parser = parse_elector)]
    pub(crate) elector_service_account: Option<String>,
}

// === impl ElectArgs ===

impl ElectArgs {
    /// The same candidate as `run` with these flags, without COMMAND: `elect` builds its elector,
    /// status and label as `run` does, and is validated by the same rules.
    pub(crate) fn as_run(&self) -> RunArgs {
        RunArgs {
            lock: self.lock.clone(),
            cluster: self.cluster.clone(),
            identity: self.identity.clone(),
            lease_duration: self.lease_duration,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
            grace: None,
            allow_grace_beyond_lease: false,
            status_addr: Some(self.status_addr),
            ready_only_when_leader: self.ready_only_when_leader,
            watch_own_pod: false,
            label_pod: self.label_pod,
            on_outside_cluster: self.on_outside_cluster,
            connect_timeout: self.connect_timeout,
            not_ready_takeover: self.not_ready_takeover,
            dead_leader_pod: self.dead_leader_pod,
            liveness: self.liveness,
            successor: self.successor,
            successor_wait: self.successor_wait,
            coordinated: self.coordinated.clone(),
            emulation_version: self.emulation_version.clone(),
            shards: None,
            on_shards_change: crate::cli::OnChange::Restart,
            fence: false,
            fence_user: None,
            elector_service_account: self.elector_service_account.clone(),
            command: Vec::new(),
        }
    }

    /// Checks the flags with `run`'s rules, naming the flags.
    pub(crate) fn validate(&self) -> Result<(), String> {
        self.as_run().validate()
    }
}
