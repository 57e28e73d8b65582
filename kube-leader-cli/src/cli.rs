//! Command-line flags, their parsing, and the usage errors they give.
//!
//! This file holds the flag definitions; [`values`] parses single values, [`validate`] checks
//! the flags of `run` together, [`parse`] reads the command line and the environment.

use std::{ffi::OsString, net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand, ValueEnum};

use kube_leader::Strategy;

use crate::{exit, version};

mod elect;
mod fence;
mod on_change;
mod parse;
#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;
mod validate;
mod values;

pub(crate) use elect::ElectArgs;
pub(crate) use fence::{FenceArgs, FenceCertsArgs, FenceCommand, FenceServeArgs, FenceWebhooksArgs};
pub(crate) use on_change::OnChange;
pub(crate) use parse::{completions, parse, usage_error};
pub(crate) use values::{parse_addr, parse_duration, LivenessArg, DEFAULT_LIVENESS, FOR_LIFE_GRACE};
use values::{
    parse_elector, parse_identity, parse_liveness, parse_lock_name, parse_namespace, parse_strategy,
};

/// Run any program only while it leads, on a Kubernetes lock.
#[derive(Debug, Parser)]
#[command(
    name = "kube-leader",
    version = version::SHORT,
    long_version = version::LONG,
    about = "Run any program only while it leads a Kubernetes leader election.",
    long_about = "Run any program only while it leads a Kubernetes leader election: leader for life \
                  (a ConfigMap owned by the leader's Pod, operator-sdk's leader.Become) or a \
                  client-go compatible coordination.k8s.io/v1 Lease.\n\n\
                  Cluster access: in-cluster configuration, or KUBECONFIG / ~/.kube/config \
                  (--kubeconfig and --context choose). \
                  Durations are written like 500ms, 2s, 1m. Logs go to stderr; RUST_LOG overrides \
                  the log filter (an invalid RUST_LOG is an error). Every flag of `run` (and \
                  --log-format) can also be set with an environment variable KUBE_LEADER_<FLAG>, \
                  for example KUBE_LEADER_LOCK or KUBE_LEADER_LEASE_DURATION; a flag on the \
                  command line wins.",
    after_help = exit::CODES_HELP,
    after_long_help = exit::CODES_HELP,
    propagate_version = true,
    disable_help_subcommand = true
)]
pub(crate) struct Cli {
    /// Log format on stderr: human-readable text, or one JSON object per line.
    #[arg(long, value_enum, global = true, default_value_t = LogFormat::Text, value_name = "FORMAT")]
    pub(crate) log_format: LogFormat,

    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Wait until this candidate leads, then run COMMAND; stop it when leadership is lost.
    #[command(after_help = exit::CODES_HELP, after_long_help = exit::CODES_HELP)]
    Run(RunArgs),
    /// Campaign without COMMAND and serve who leads over HTTP (`GET /`: `{"name",
    /// "last_update"}`, `GET /sse`), as the retired leader-elector sidecar and nais/elector did.
    #[command(after_help = exit::CODES_HELP, after_long_help = exit::CODES_HELP)]
    Elect(ElectArgs),
    /// Print the current leader of a lock, without being a candidate.
    #[command(after_help = exit::CODES_HELP)]
    Status(StatusArgs),
    /// Print the least-privilege Role and RoleBinding for `run` with these options.
    Rbac(RbacArgs),
    /// The fence: an admission webhook by which the API server refuses a deposed leader's
    /// writes to fenced objects (docs/fence.md).
    Fence(FenceArgs),
    /// Copy this binary to DIR/kube-leader (mode 0755), for an initContainer that puts it into
    /// an emptyDir the program's own container runs it from (an image without cp or sh).
    Install(InstallArgs),
    /// Print a shell completion script: `kube-leader completions bash > /etc/bash_completion.d/kube-leader`.
    Completions(CompletionsArgs),
    /// Internal: the process between `kube-leader run` and COMMAND that stops COMMAND when
    /// kube-leader's heartbeats stop.
    #[command(name = "__supervise", hide = true)]
    Supervise(SuperviseArgs),
    /// Internal: the supervisor's child, which asks to die with the supervisor
    /// (`PR_SET_PDEATHSIG`) and then executes COMMAND in its place.
    #[command(name = "__exec", hide = true)]
    Exec(ExecArgs),
}

/// The log format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// What to do outside a cluster (leader for life).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OutsideClusterArg {
    /// Skip the election and run COMMAND at once, with fencing token 0 (operator-sdk's
    /// behaviour): every replica that finds no namespace runs it.
    Skip,
    /// Exit with a configuration error (the default: a sidecar fails closed).
    Fail,
}

/// What a leader for life does with the Pod of a dead leader whose lock it takes over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum DeadLeaderPodArg {
    /// Leave the Pod alone: `run` and `kube-leader rbac` need no `delete pods`.
    Keep,
    /// Delete it if it was evicted (operator-sdk's behaviour; the default).
    DeleteEvicted,
    /// Delete it in any terminal phase (Failed for any reason, or Succeeded).
    DeleteTerminal,
}

/// Who leads next when a leader steps down (`--successor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum SuccessorArg {
    /// The youngest live candidate (the default): a rollout moves leadership once.
    Youngest,
    /// Whoever is first, as client-go: no registrations.
    Any,
}

/// Output format of `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OutputFormat {
    /// Aligned `key: value` lines.
    Text,
    /// One JSON object.
    Json,
}

/// The lock: shared by every subcommand.
#[derive(Debug, Clone, Args)]
pub(crate) struct LockArgs {
    /// Name of the lock object (a ConfigMap for for-life, a Lease for lease); a DNS-1123
    /// subdomain.
    #[arg(long, value_name = "NAME", value_parser = parse_lock_name)]
    pub(crate) lock: String,

    /// Namespace of the lock [default: POD_NAMESPACE, else the in-cluster service-account
    /// namespace, else (lease, status, rbac) the kubeconfig context's]
    #[arg(long, short = 'n', value_name = "NS", value_parser = parse_namespace)]
    pub(crate) namespace: Option<String>,

    /// Election strategy.
    #[arg(long, default_value_t = Strategy::ForLife, value_parser = parse_strategy(), value_name = "STRATEGY")]
    pub(crate) strategy: Strategy,
}

/// How `run` and `status` reach the API server.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct ClusterArgs {
    /// The kubeconfig file [default: the in-cluster configuration, else KUBECONFIG, else
    /// ~/.kube/config].
    #[arg(long, value_name = "PATH")]
    pub(crate) kubeconfig: Option<PathBuf>,

    /// The kubeconfig context [default: its current-context]. Without --kubeconfig, from
    /// KUBECONFIG or ~/.kube/config (not the in-cluster configuration).
    #[arg(long, value_name = "NAME")]
    pub(crate) context: Option<String>,

    /// Speak HTTP/1.1 to the API server (kube's own client: a connection per open watch, no
    /// PINGs) instead of HTTP/2; a proxy in the kubeconfig always does.
    #[arg(long)]
    pub(crate) http1: bool,
}

/// `kube-leader run`.
#[derive(Debug, Clone, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) lock: LockArgs,

    #[command(flatten)]
    pub(crate) cluster: ClusterArgs,

    /// This candidate's identity, unique among candidates [default: POD_NAME, else the host
    /// name]. Leader for life needs the name of this candidate's Pod.
    #[arg(long, value_name = "ID", value_parser = parse_identity)]
    pub(crate) identity: Option<String>,

    /// How long a lease is valid after its last renewal was observed (lease).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "15s")]
    pub(crate) lease_duration: Duration,

    /// How long the leader keeps trying to renew before it stops leading (lease). Also the
    /// supervisor's deadline: COMMAND is stopped when kube-leader has not confirmed its
    /// leadership for this long (both strategies).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "10s")]
    pub(crate) renew_deadline: Duration,

    /// How often the leader renews, and how long candidates wait after a transient error.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "2s")]
    pub(crate) retry_period: Duration,

    /// After SIGTERM to COMMAND on loss of leadership, how long to wait before SIGKILL
    /// [default: lease: --lease-duration − --renew-deadline, so that COMMAND is gone before
    /// another candidate can take over an expired lease; for-life: 10s]. A lease refuses more
    /// unless --allow-grace-beyond-lease.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) grace: Option<Duration>,

    /// Accept a --grace longer than --lease-duration − --renew-deadline (lease): a COMMAND slow
    /// to stop may then still run when another candidate has taken over the expired lease.
    #[arg(long)]
    pub(crate) allow_grace_beyond_lease: bool,

    /// Serve status, health and metrics over HTTP on this address: IP:PORT, or :PORT for every
    /// interface (0.0.0.0:PORT, as Go servers read it; kubelet probes need it). 127.0.0.1:PORT
    /// stays on loopback. Off by default.
    #[arg(long, value_name = "ADDR", value_parser = parse_addr)]
    pub(crate) status_addr: Option<SocketAddr>,

    /// Make /readyz answer 200 only while this candidate leads (default: once the first
    /// election result is known). Beware: readiness tied to leadership can stall rolling
    /// updates.
    #[arg(long)]
    pub(crate) ready_only_when_leader: bool,

    /// Label this candidate's Pod (POD_NAME, else the identity) kube-leader.io/leader=true while
    /// it leads and =false otherwise, so that a Service can select the leader.
    #[arg(long)]
    pub(crate) label_pod: bool,

    /// Lease: watch this candidate's own Pod (POD_NAME, else the identity; in POD_NAMESPACE,
    /// else the service-account namespace) and act on its deletion at once, as on SIGTERM: stop
    /// COMMAND, release the lease, exit; a follower stops campaigning. The kubelet's SIGTERM
    /// comes after it, 10 ms to over a second later on a busy node. Needs get, list and watch
    /// on pods in the Pod's namespace (`kube-leader rbac --strategy lease --watch-own-pod`).
    /// Leader for life always watches its Pod.
    #[arg(long)]
    pub(crate) watch_own_pod: bool,

    /// Who leads next when this candidate steps down (SIGTERM, its Pod deleted, a rollout):
    /// `youngest`, the youngest live candidate by its Pod's creation time (a Pod of the new
    /// ReplicaSet in a rolling update), which takes over at once while the others defer to it
    /// for --successor-wait; or `any`, whoever is first (client-go). Every candidate keeps a
    /// registration Lease beside the lock for it (see `kube-leader rbac`). Crash failover never
    /// waits. client-go candidates on the same Lease ignore the preference.
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

    /// Leader for life outside a cluster (no --namespace, POD_NAMESPACE or service-account
    /// namespace file): fail (exit 125), or skip the election and run COMMAND — in every replica
    /// that finds no namespace.
    #[arg(long, value_enum, default_value_t = OutsideClusterArg::Fail, value_name = "POLICY")]
    pub(crate) on_outside_cluster: OutsideClusterArg,

    /// How long to retry reaching the API server at start before giving up (exit code 123).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "30s")]
    pub(crate) connect_timeout: Duration,

    /// Leader for life only, opt-in: take over from a leader whose Node has not been Ready for
    /// this long [default: never]. RISK: TWO LEADERS. A NotReady Node is one the control plane
    /// cannot hear from; its Pods may still run, and the old leader's COMMAND goes on until it
    /// learns that its lock is gone. Use it only if COMMAND tolerates a second leader for a while,
    /// for example because its writes carry KUBE_LEADER_FENCING_TOKEN and stale tokens are
    /// refused. Needs `get nodes` (a ClusterRole); without it, one warning and no takeover.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) not_ready_takeover: Option<Duration>,

    /// Leader for life: the liveness heartbeat, at least 1s; `off` (or 0) disables it [default:
    /// 5s]. The leader writes its lock every third of it; COMMAND is stopped (SIGTERM, --grace,
    /// SIGKILL) once no heartbeat got through for this long, but the lock is kept (a partition
    /// hands nothing over while the Pod lives). An ended leader Pod (evicted, failed, gone) is
    /// taken over once its heartbeat has not moved for this + --grace + 2s, rather than its
    /// grace period + 2s, even when its kube-leader died with COMMAND (no release). Costs one
    /// update of the lock per heartbeat. Not for --strategy lease.
    #[arg(long, value_name = "DURATION", value_parser = parse_liveness)]
    pub(crate) liveness: Option<LivenessArg>,

    /// Leader for life only: what a candidate that takes over from a dead leader (Pod phase
    /// Failed or Succeeded) does with that Pod: keep it, delete it if it was evicted, or delete
    /// it in any terminal phase [default: delete-evicted, as operator-sdk]. Failover never waits
    /// for the Pod object either way; deleting needs `delete pods`, keep does not (`kube-leader
    /// rbac --dead-leader-pod keep`).
    #[arg(long, value_enum, value_name = "POLICY")]
    pub(crate) dead_leader_pod: Option<DeadLeaderPodArg>,

    /// Hold a fair share of M shard Leases LOCK-0 .. LOCK-<M-1> (lease only) and run COMMAND
    /// with its shards: KUBE_LEADER_SHARD_SET (and the file KUBE_LEADER_SHARDS_FILE) at start;
    /// on every change of the set, see --on-shards-change. COMMAND never runs with a shard past
    /// that shard's confirmed renewal (+ --grace), as in plain `run`.
    #[arg(long, value_name = "M", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) shards: Option<u32>,

    /// With --shards, what a change of COMMAND's shards does: `restart` (stop COMMAND:
    /// SIGTERM, --grace, SIGKILL; release the shards it gave up; start it again with the new
    /// set), or `signal:SIG` (e.g. signal:HUP: rewrite KUBE_LEADER_SHARDS_FILE and send SIG to
    /// COMMAND's process group; COMMAND writes the file's generation to KUBE_LEADER_SHARDS_ACK
    /// once it stopped work on the shards no longer listed; without that within --grace it is
    /// restarted). Signalling is only for a program written to handle SIG so: a Go or JVM
    /// program that exits on SIGHUP must keep `restart`.
    #[arg(long, value_name = "POLICY", default_value = "restart", value_parser = on_change::parse_on_change)]
    pub(crate) on_shards_change: OnChange,

    /// Fence COMMAND's writes (docs/fence.md): COMMAND gets KUBECONFIG pointing at a loopback
    /// proxy inside kube-leader that accepts only the per-term bearer token it gives COMMAND,
    /// adds this term's fencing token to every request (impersonating --fence-user with the
    /// user extra kube-leader.io/fencing-token), stamps the objects it writes, and forwards
    /// with kube-leader's credentials. With --shards the token is a shard's: the kubeconfig
    /// has a context shard-<i> per shard whose requests carry shard i's token; its writes are
    /// refused by the proxy while this replica does not hold shard i (the default context
    /// carries no token).
    /// Needs `kube-leader rbac --fence`.
    #[arg(long)]
    pub(crate) fence: bool,

    /// With --fence: kube-leader's own user name, which the proxy impersonates [default: the
    /// in-cluster ServiceAccount's, system:serviceaccount:NAMESPACE:NAME].
    #[arg(long, value_name = "USER", requires = "fence")]
    pub(crate) fence_user: Option<String>,

    /// Make kube-leader's own API requests (the election's, --label-pod's, --watch-own-pod's)
    /// as this ServiceAccount of the lock's namespace, by impersonation, rather than as the
    /// Pod's, which stays COMMAND's (and --fence's). A FlowSchema can then send kube-leader's
    /// requests to the leader-election priority level without COMMAND's (`kube-leader rbac
    /// --flow-schema`). Needs impersonate on this ServiceAccount, and the election's Role bound
    /// to it (`kube-leader rbac --elector-service-account NAME`).
    #[arg(long, value_name = "NAME", value_parser = parse_elector)]
    pub(crate) elector_service_account: Option<String>,

    /// The program to run while leading, and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub(crate) command: Vec<OsString>,
}

/// `kube-leader status`.
#[derive(Debug, Clone, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    pub(crate) lock: LockArgs,

    #[command(flatten)]
    pub(crate) cluster: ClusterArgs,

    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Text, value_name = "FORMAT")]
    pub(crate) output: OutputFormat,

    /// How long to retry reaching the API server before giving up (exit code 123).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "10s")]
    pub(crate) connect_timeout: Duration,

    /// Read the lock as this ServiceAccount of the lock's namespace, by impersonation, as `run
    /// --elector-service-account` does (so that COMMAND's `kube-leader status` needs no
    /// permission of its own).
    #[arg(long, value_name = "NAME", value_parser = parse_elector)]
    pub(crate) elector_service_account: Option<String>,
}

/// `kube-leader rbac`.
#[derive(Debug, Clone, Args)]
pub(crate) struct RbacArgs {
    #[command(flatten)]
    pub(crate) lock: LockArgs,

    /// The ServiceAccount the RoleBinding grants the Role to, named in the output's first
    /// comment lines and printed with it; `default` (not printed: every namespace has it) is
    /// the ServiceAccount of every Pod that sets no serviceAccountName.
    #[arg(long, value_name = "NAME", default_value = "default", value_parser = parse_lock_name)]
    pub(crate) service_account: String,

    /// Also grant what `run --label-pod` needs (patch pods).
    #[arg(long)]
    pub(crate) label_pod: bool,

    /// Also grant what `run --strategy lease --watch-own-pod` needs (get, list, watch pods;
    /// leader for life has them already).
    #[arg(long, conflicts_with = "shards")]
    pub(crate) watch_own_pod: bool,

    /// The Role of `run --successor POLICY`: `any` needs no rule for the candidates'
    /// registrations.
    #[arg(long, value_enum, default_value_t = SuccessorArg::Youngest, value_name = "POLICY")]
    pub(crate) successor: SuccessorArg,

    /// The Role of `run --coordinated VERSION`: its LeaseCandidate instead of the
    /// registrations.
    #[arg(long, value_name = "VERSION", conflicts_with = "shards")]
    pub(crate) coordinated: Option<String>,

    /// The Role of `run --dead-leader-pod POLICY` (leader for life): `keep` needs no `delete
    /// pods` [default: delete-evicted].
    #[arg(long, value_enum, value_name = "POLICY")]
    pub(crate) dead_leader_pod: Option<DeadLeaderPodArg>,

    /// The Role of `run --shards M` (shard Leases LOCK-0 .. LOCK-<M-1> and the membership
    /// Leases; --strategy does not apply).
    #[arg(long, value_name = "M", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) shards: Option<u32>,

    /// Also grant what a fenced writer (`kube-leader fence`, docs/fence.md) needs to carry its
    /// fencing token: impersonate its own ServiceAccount (in the Role) and the user extra
    /// kube-leader.io/fencing-token (cluster-scoped: a ClusterRole and its binding, printed too).
    #[arg(long)]
    pub(crate) fence: bool,

    /// The Role of `run --elector-service-account NAME`: the election's rules bound to that
    /// ServiceAccount (printed too), and impersonate on it (by name) for --service-account.
    #[arg(long, value_name = "NAME", value_parser = parse_elector)]
    pub(crate) elector_service_account: Option<String>,

    /// Print, instead of the RBAC, the FlowSchema (cluster-scoped) that sends the requests
    /// kube-leader makes as --elector-service-account (the election's, not Events) to the
    /// leader-election priority level, as Kubernetes' own leader elections; COMMAND's requests,
    /// as the Pod's ServiceAccount, stay where they were.
    #[arg(long, requires = "elector_service_account")]
    pub(crate) flow_schema: bool,

    /// With --shards: a candidate's identity (repeatable), so that the Role names its
    /// membership Lease; without any, the membership Leases need get, update and delete on every
    /// Lease of the namespace (their names contain the identities).
    #[arg(long = "identity", value_name = "ID", requires = "shards", value_parser = parse_identity)]
    pub(crate) identities: Vec<String>,
}

/// `kube-leader install`.
#[derive(Debug, Clone, Args)]
pub(crate) struct InstallArgs {
    /// The directory to copy the binary into (it must exist: an emptyDir's mount point).
    #[arg(value_name = "DIR")]
    pub(crate) dir: PathBuf,
}

/// `kube-leader completions`.
#[derive(Debug, Clone, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum, value_name = "SHELL")]
    pub(crate) shell: clap_complete::Shell,
}

/// `kube-leader __supervise` (internal).
#[derive(Debug, Clone, Args)]
pub(crate) struct SuperviseArgs {
    /// SIGTERM → SIGKILL grace when stopping the child.
    #[arg(long, value_parser = parse_duration)]
    pub(crate) grace: Duration,

    /// The child and its arguments.
    #[arg(last = true, required = true)]
    pub(crate) command: Vec<OsString>,
}

/// `kube-leader __exec` (internal).
#[derive(Debug, Clone, Args)]
pub(crate) struct ExecArgs {
    /// The supervisor's pid: if the parent is another process, the supervisor is already gone.
    #[arg(long)]
    pub(crate) parent: i32,

    /// Wait, started in advance, for one line on stdin (COMMAND's extra environment, as JSON)
    /// before executing COMMAND; end quietly at end of input.
    #[arg(long)]
    pub(crate) wait: bool,

    /// COMMAND and its arguments.
    #[arg(last = true, required = true)]
    pub(crate) command: Vec<OsString>,
}
