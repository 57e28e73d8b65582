//! Command-line flags, their parsing, and the usage errors they give.

use std::{ffi::OsString, net::SocketAddr, time::Duration};

use clap::{error::ErrorKind, Args, CommandFactory as _, FromArgMatches as _, Parser, Subcommand, ValueEnum};
use kube_leader::LeaseConfig;

use crate::{exit, version};

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
                  Cluster access: in-cluster configuration, or KUBECONFIG / ~/.kube/config. \
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
    /// Print the current leader of a lock, without being a candidate.
    #[command(after_help = exit::CODES_HELP)]
    Status(StatusArgs),
    /// Print the least-privilege Role and RoleBinding for `run` with these options.
    Rbac(RbacArgs),
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

/// The election strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum StrategyArg {
    /// Leader for life: a ConfigMap owned by the leader's Pod, deleted with that Pod.
    ForLife,
    /// A coordination.k8s.io/v1 Lease renewed by the leader (client-go compatible).
    Lease,
}

impl StrategyArg {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            StrategyArg::ForLife => "for-life",
            StrategyArg::Lease => "lease",
        }
    }
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
    #[arg(long, value_enum, default_value_t = StrategyArg::ForLife, value_name = "STRATEGY")]
    pub(crate) strategy: StrategyArg,
}

/// `kube-leader run`.
#[derive(Debug, Clone, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) lock: LockArgs,

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

    /// Serve status, health and metrics over HTTP on this address (IP:PORT, or :PORT for
    /// 127.0.0.1:PORT). Off by default.
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

    /// Leader for life outside a cluster (no --namespace, POD_NAMESPACE or service-account
    /// namespace file): fail (exit 2), or skip the election and run COMMAND — in every replica
    /// that finds no namespace.
    #[arg(long, value_enum, default_value_t = OutsideClusterArg::Fail, value_name = "POLICY")]
    pub(crate) on_outside_cluster: OutsideClusterArg,

    /// How long to retry reaching the API server at start before giving up (exit code 4).
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

    /// Hold a fair share of M shard Leases LOCK-0 .. LOCK-<M-1> (lease only) and run COMMAND
    /// for the life of kube-leader, telling it its shards: KUBE_LEADER_SHARD_SET at start, then
    /// the file KUBE_LEADER_SHARDS_FILE rewritten and --shards-signal on every change; COMMAND
    /// acknowledges by writing the file's generation to KUBE_LEADER_SHARDS_ACK.
    #[arg(long, value_name = "M", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) shards: Option<u32>,

    /// The signal sent to COMMAND's process group when its shards change (with --shards).
    #[arg(long, value_name = "SIGNAL", default_value = "HUP", value_parser = crate::shards::parse_signal)]
    pub(crate) shards_signal: nix::sys::signal::Signal,

    /// The program to run while leading, and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub(crate) command: Vec<OsString>,
}

/// `kube-leader status`.
#[derive(Debug, Clone, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    pub(crate) lock: LockArgs,

    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Text, value_name = "FORMAT")]
    pub(crate) output: OutputFormat,

    /// How long to retry reaching the API server before giving up (exit code 4).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "10s")]
    pub(crate) connect_timeout: Duration,
}

/// `kube-leader rbac`.
#[derive(Debug, Clone, Args)]
pub(crate) struct RbacArgs {
    #[command(flatten)]
    pub(crate) lock: LockArgs,

    /// The ServiceAccount the RoleBinding grants the Role to.
    #[arg(long, value_name = "NAME", default_value = "default", value_parser = parse_lock_name)]
    pub(crate) service_account: String,

    /// Also grant what `run --label-pod` needs (patch pods).
    #[arg(long)]
    pub(crate) label_pod: bool,
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

// === parsing ===

/// Parses a duration written as `500ms`, `2s`, `1m`, `1m30s` (at most 365 days).
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration; write it like 500ms, 2s or 1m".into());
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("missing unit; write it like {s}s or {s}ms"));
    }
    let d = humantime::parse_duration(s).map_err(|e| format!("{e}; write it like 500ms, 2s or 1m"))?;
    // Found by fuzzing: durations near u64::MAX seconds overflow the arithmetic on timings
    // (deadlines, the jitter factor). Nothing here needs more than a year.
    if d > MAX_DURATION {
        return Err(format!("{s} is too long: at most 365d"));
    }
    Ok(d)
}

/// Leader for life's default grace. A successor can start as soon as the lock is gone (its Pod
/// deleted), so any grace may overlap it; 10 s, as the seed's default and within Kubernetes'
/// 30 s termination grace period, leaves COMMAND time to stop cleanly when its Pod goes away.
pub(crate) const FOR_LIFE_GRACE: Duration = Duration::from_secs(10);

/// The longest duration any flag accepts.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

fn parse_lock_name(s: &str) -> Result<String, String> {
    kube_leader::lock::validate_name(s).map_err(|e| e.to_string())?;
    Ok(s.to_string())
}

fn parse_namespace(s: &str) -> Result<String, String> {
    // A namespace is a DNS-1123 label: a subdomain without dots, at most 63 characters.
    if s.contains('.') || s.len() > 63 {
        return Err("a namespace is at most 63 lower-case letters, digits and '-'".into());
    }
    kube_leader::lock::validate_name(s)
        .map_err(|_| "a namespace is at most 63 lower-case letters, digits and '-'".to_string())?;
    Ok(s.to_string())
}

fn parse_identity(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("must not be empty".into());
    }
    Ok(s.to_string())
}

/// `IP:PORT`, or `:PORT` for `127.0.0.1:PORT`.
pub(crate) fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    if let Some(port) = s.strip_prefix(':') {
        let port: u16 = port.parse().map_err(|_| format!("invalid port {port:?}"))?;
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse()
        .map_err(|_| "expected IP:PORT (for example 127.0.0.1:4040) or :PORT".to_string())
}

// === validation across flags ===

impl RunArgs {
    /// Checks the timings together, naming the flags: client-go's rules for a lease, and for
    /// both strategies a heartbeat period shorter than the supervisor's deadline.
    pub(crate) fn validate(&self) -> Result<(), String> {
        for (flag, d) in [
            ("--lease-duration", self.lease_duration),
            ("--renew-deadline", self.renew_deadline),
            ("--retry-period", self.retry_period),
            ("--connect-timeout", self.connect_timeout),
        ] {
            if d.is_zero() {
                return Err(format!("invalid value for '{flag}': must be greater than zero"));
            }
        }
        let ms = |d: Duration| humantime::format_duration(d).to_string();
        if self.lock.strategy == StrategyArg::Lease {
            if self.lease_duration < Duration::from_secs(1) {
                return Err(format!(
                    "invalid value for '--lease-duration': must be at least 1s (a Lease holds whole seconds), got {}",
                    ms(self.lease_duration)
                ));
            }
            if self.lease_duration <= self.renew_deadline {
                return Err(format!(
                    "invalid value for '--renew-deadline': must be less than --lease-duration ({} ≥ {})",
                    ms(self.renew_deadline),
                    ms(self.lease_duration)
                ));
            }
        }
        if self.renew_deadline <= self.retry_period.mul_f64(kube_leader::lease::JITTER_FACTOR) {
            return Err(format!(
                "invalid value for '--retry-period': --renew-deadline ({}) must be greater than {} × --retry-period ({})",
                ms(self.renew_deadline),
                kube_leader::lease::JITTER_FACTOR,
                ms(self.retry_period)
            ));
        }
        if self.shards.is_some() && self.lock.strategy != StrategyArg::Lease {
            return Err("invalid value for '--shards': shards are Leases: add --strategy lease".into());
        }
        if self.lock.strategy == StrategyArg::Lease {
            self.lease_config().validate().map_err(|e| e.to_string())?;
            let bound = self.lease_duration.saturating_sub(self.renew_deadline);
            match self.grace {
                Some(grace) if grace > bound && !self.allow_grace_beyond_lease => {
                    return Err(format!(
                        "invalid value for '--grace': {} outlasts the lease: a COMMAND slow on SIGTERM \
                         could still run when another candidate takes over the expired lease; at most \
                         --lease-duration − --renew-deadline = {} (or accept the risk with \
                         --allow-grace-beyond-lease)",
                        ms(grace),
                        ms(bound)
                    ));
                }
                _ => {}
            }
        }
        self.validate_not_ready_takeover()
    }

    /// `--not-ready-takeover`: leader for life only, and more than zero.
    fn validate_not_ready_takeover(&self) -> Result<(), String> {
        match self.not_ready_takeover {
            Some(_) if self.lock.strategy != StrategyArg::ForLife => Err(
                "invalid value for '--not-ready-takeover': only for --strategy for-life (a Lease \
                 expires by itself)"
                    .into(),
            ),
            Some(d) if d.is_zero() => {
                Err("invalid value for '--not-ready-takeover': must be greater than zero".into())
            }
            _ => Ok(()),
        }
    }

    /// The SIGTERM → SIGKILL grace: `--grace`, else for a lease lease duration − renew
    /// deadline (the supervisor's SIGTERM comes a renew deadline after the last renewal was
    /// sent at the latest, so COMMAND is gone a lease duration after it, before any successor
    /// can take the expired lease over), else (leader for life: no lease to outlast)
    /// [`FOR_LIFE_GRACE`].
    pub(crate) fn grace(&self) -> Duration {
        match (self.grace, self.lock.strategy) {
            (Some(grace), _) => grace,
            (None, StrategyArg::Lease) => self.lease_duration.saturating_sub(self.renew_deadline),
            (None, StrategyArg::ForLife) => FOR_LIFE_GRACE,
        }
    }

    /// The Lease timings.
    pub(crate) fn lease_config(&self) -> LeaseConfig {
        LeaseConfig::new(self.lease_duration, self.renew_deadline, self.retry_period)
    }
}

/// Parses the command line; on a usage error prints one line naming the flag and exits with
/// [`exit::USAGE`].
pub(crate) fn parse() -> Cli {
    parse_from(std::env::args_os())
}

fn parse_from(args: impl IntoIterator<Item = OsString>) -> Cli {
    let cli = match try_parse_with_env(args) {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => e.exit(),
        Err(e) => usage_error(&one_line(&e)),
    };
    if let Command::Run(run) = &cli.command {
        if let Err(msg) = run.validate() {
            usage_error(&msg);
        }
    }
    cli
}

// === environment variables ===

/// The prefix of the environment variables that set `run`'s flags.
pub(crate) const ENV_PREFIX: &str = "KUBE_LEADER_";

/// The command line definition, with every flag of `run` and the global `--log-format` also read
/// from `KUBE_LEADER_<FLAG>` (`--lease-duration`: `KUBE_LEADER_LEASE_DURATION`), shown in
/// `--help`. Added here rather than flag by flag, so that no flag can be forgotten. Boolean
/// flags take true/false, 1/0, yes/no, on/off.
pub(crate) fn command() -> clap::Command {
    fn with_env(arg: clap::Arg) -> clap::Arg {
        // COMMAND (positional) and help/version take no environment variable.
        if arg.is_positional()
            || matches!(
                arg.get_action(),
                clap::ArgAction::Help
                    | clap::ArgAction::HelpLong
                    | clap::ArgAction::HelpShort
                    | clap::ArgAction::Version
            )
        {
            return arg;
        }
        let name = format!(
            "{ENV_PREFIX}{}",
            arg.get_id().as_str().to_uppercase().replace('-', "_")
        );
        let arg = arg.env(name);
        if matches!(arg.get_action(), clap::ArgAction::SetTrue) {
            arg.value_parser(clap::builder::BoolishValueParser::new())
        } else {
            arg
        }
    }
    Cli::command()
        .mut_arg("log_format", with_env)
        .mut_subcommand("run", |run| run.mut_args(with_env))
}

/// Parses `args` with [`command`]: flags from the command line, else from the environment.
pub(crate) fn try_parse_with_env(args: impl IntoIterator<Item = OsString>) -> Result<Cli, clap::Error> {
    let mut command = command();
    let matches = command.try_get_matches_from_mut(args)?;
    Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut command))
}

/// `kube-leader completions SHELL`: the script on stdout; exit code 0.
pub(crate) fn completions(shell: clap_complete::Shell) -> u8 {
    clap_complete::generate(shell, &mut command(), "kube-leader", &mut std::io::stdout());
    0
}

/// Prints `msg` as a usage error on one line and exits with [`exit::USAGE`].
pub(crate) fn usage_error(msg: &str) -> ! {
    eprintln!("kube-leader: error: {msg} (see kube-leader --help)");
    std::process::exit(i32::from(exit::USAGE));
}

/// Clap's error on one line: the message without "error:", the usage block or tips.
fn one_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let mut parts = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        if line.is_empty() || line.starts_with("tip:") {
            continue;
        }
        parts.push(line.strip_prefix("error: ").unwrap_or(line).to_string());
    }
    let mut msg = parts.join(" ");
    if e.kind() == ErrorKind::MissingRequiredArgument && msg.contains("<COMMAND>") {
        msg = "missing COMMAND: give the program to run after `--`, as in \
               `kube-leader run --lock NAME -- COMMAND [ARGS...]`"
            .into();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<OsString> {
        s.split_whitespace().map(OsString::from).collect()
    }

    #[test]
    fn shards_are_leases_with_a_catchable_signal() {
        let parse = |s: &str| Cli::try_parse_from(args(s));
        let run = |s: &str| {
            let Command::Run(run) = parse(s).unwrap().command else {
                panic!("not run")
            };
            run
        };
        let r = run("kube-leader run --lock l --strategy lease --shards 64 -- true");
        assert_eq!(r.shards, Some(64));
        assert_eq!(r.shards_signal, nix::sys::signal::Signal::SIGHUP);
        r.validate().unwrap();
        let r = run("kube-leader run --lock l --strategy lease --shards 4 --shards-signal usr1 -- true");
        assert_eq!(r.shards_signal, nix::sys::signal::Signal::SIGUSR1);
        let e = run("kube-leader run --lock l --shards 4 -- true")
            .validate()
            .unwrap_err();
        assert!(e.contains("--shards") && e.contains("--strategy lease"), "{e}");
        for bad in [
            "kube-leader run --lock l --strategy lease --shards 0 -- true",
            "kube-leader run --lock l --strategy lease --shards 4 --shards-signal KILL -- true",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    fn err(s: &str) -> String {
        let e = Cli::try_parse_from(args(s)).unwrap_err();
        one_line(&e)
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert!(parse_duration("5").unwrap_err().contains("missing unit"));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn addresses() {
        assert_eq!(parse_addr(":4040").unwrap(), "127.0.0.1:4040".parse().unwrap());
        assert_eq!(parse_addr("0.0.0.0:80").unwrap(), "0.0.0.0:80".parse().unwrap());
        assert_eq!(parse_addr("[::1]:80").unwrap(), "[::1]:80".parse().unwrap());
        assert!(parse_addr("localhost").is_err());
        assert!(parse_addr(":http").is_err());
    }

    #[test]
    fn run_parses() {
        let cli = Cli::try_parse_from(args(
            "kube-leader run --lock l --strategy lease --lease-duration 2s --renew-deadline 1s \
             --retry-period 200ms --status-addr :0 -- sh -c true",
        ))
        .unwrap();
        let Command::Run(run) = cli.command else {
            panic!("not run")
        };
        assert_eq!(run.lock.strategy, StrategyArg::Lease);
        assert_eq!(run.retry_period, Duration::from_millis(200));
        assert_eq!(run.command, args("sh -c true"));
        run.validate().unwrap();
    }

    #[test]
    fn defaults_are_for_life_and_client_go_timings() {
        let cli = Cli::try_parse_from(args("kube-leader run --lock l -- true")).unwrap();
        let Command::Run(run) = cli.command else {
            panic!("not run")
        };
        assert_eq!(run.lock.strategy, StrategyArg::ForLife);
        assert_eq!(run.lease_config(), LeaseConfig::default());
        assert_eq!(run.grace(), Duration::from_secs(10));
        assert_eq!(run.on_outside_cluster, OutsideClusterArg::Fail);
        assert!(run.status_addr.is_none());
        run.validate().unwrap();
    }

    #[test]
    fn a_lease_grace_defaults_to_what_the_lease_leaves_and_is_bounded_by_it() {
        let run = |s: &str| {
            let Command::Run(run) = Cli::try_parse_from(args(s)).unwrap().command else {
                panic!("not run")
            };
            run
        };
        let r = run("kube-leader run --lock l --strategy lease -- true");
        assert_eq!(r.grace(), Duration::from_secs(5));
        let r = run("kube-leader run --lock l --strategy lease --lease-duration 2s --renew-deadline 1s --retry-period 200ms -- true");
        assert_eq!(r.grace(), Duration::from_secs(1));
        r.validate().unwrap();
        let r = run("kube-leader run --lock l --strategy lease --grace 5s -- true");
        r.validate().unwrap();
        let r = run("kube-leader run --lock l --strategy lease --grace 5001ms -- true");
        let e = r.validate().unwrap_err();
        assert!(
            e.contains("--grace") && e.contains("5s 1ms") && e.contains("= 5s"),
            "{e}"
        );
        let r =
            run("kube-leader run --lock l --strategy lease --grace 1m --allow-grace-beyond-lease -- true");
        r.validate().unwrap();
        assert_eq!(r.grace(), Duration::from_secs(60));
        let r = run("kube-leader run --lock l --grace 1m -- true");
        r.validate().unwrap();
    }

    #[test]
    fn usage_errors_are_one_line_and_name_the_flag() {
        let cases = [
            ("kube-leader run --lock l --strategy raft -- true", "--strategy"),
            ("kube-leader run --lock Bad_Name -- true", "--lock"),
            (
                "kube-leader run --lock l --lease-duration 5x -- true",
                "--lease-duration",
            ),
            ("kube-leader run --lock l --bogus -- true", "--bogus"),
            ("kube-leader run --lock l", "COMMAND"),
            ("kube-leader run -- true", "--lock"),
            ("kube-leader status --lock l -o yaml", "--output"),
        ];
        for (cmd, flag) in cases {
            let msg = err(cmd);
            assert!(!msg.contains('\n'), "{cmd}: {msg}");
            assert!(msg.contains(flag), "{cmd}: {msg} should name {flag}");
        }
    }

    /// Found by fuzzing the flags: a retry period too large to multiply by the jitter factor.
    #[test]
    fn huge_timings_are_errors_not_panics() {
        for flags in [
            "--retry-period 18446744073709551615s",
            "--renew-deadline 18446744073709551615s --retry-period 584542046090y",
            "--strategy lease --lease-duration 18446744073709551615s --renew-deadline 18446744073709551614s",
        ] {
            let cli = Cli::try_parse_from(args(&format!("kube-leader run --lock l {flags} -- true")));
            if let Ok(Cli {
                command: Command::Run(run),
                ..
            }) = cli
            {
                let _ = run.validate();
            }
        }
    }

    #[test]
    fn timings_are_checked_together() {
        let check = |s: &str| {
            let cli = Cli::try_parse_from(args(s)).unwrap();
            let Command::Run(run) = cli.command else {
                panic!("not run")
            };
            run.validate()
        };
        let e = check(
            "kube-leader run --lock l --strategy lease --lease-duration 1s --renew-deadline 2s -- true",
        )
        .unwrap_err();
        assert!(e.contains("--renew-deadline"), "{e}");
        let e = check("kube-leader run --lock l --renew-deadline 1s --retry-period 1s -- true").unwrap_err();
        assert!(e.contains("--retry-period"), "{e}");
        let e = check("kube-leader run --lock l --strategy lease --lease-duration 0s -- true").unwrap_err();
        assert!(e.contains("--lease-duration"), "{e}");
        check("kube-leader run --lock l --strategy lease --lease-duration 2s --renew-deadline 1s --retry-period 200ms -- true")
            .unwrap();
    }

    #[test]
    fn clap_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}

/// Fuzzing of the command line (issue 5): arbitrary flag values and arbitrary argument vectors
/// never panic, and every rejection is a one-line message naming the flag.
#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;

    /// `PROPTEST_CASES` for a long fuzzing run; 2,000 cases in the test command.
    fn config() -> ProptestConfig {
        let cases = std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(2_000);
        ProptestConfig {
            cases,
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    /// Durations as users (and fuzzers) write them: valid, huge, negative, unit-less, garbage.
    fn duration() -> impl Strategy<Value = String> {
        prop_oneof![
            (
                0u64..100_000,
                prop::sample::select(vec!["ns", "us", "ms", "s", "m", "h", "d", "w", "y"])
            )
                .prop_map(|(n, u)| format!("{n}{u}")),
            (any::<u64>(), prop::sample::select(vec!["s", "y", "ms", "h"]))
                .prop_map(|(n, u)| format!("{n}{u}")),
            "[0-9]{1,25}(y|d|s)",
            Just("18446744073709551615s".to_string()),
            Just("584942417355y".to_string()),
            Just("-1s".to_string()),
            "[0-9]{0,5}",
            ".{0,12}",
        ]
    }

    fn addr() -> impl Strategy<Value = String> {
        prop_oneof![
            (any::<u16>()).prop_map(|p| format!(":{p}")),
            (any::<[u8; 4]>(), any::<u16>())
                .prop_map(|(ip, p)| format!("{}.{}.{}.{}:{p}", ip[0], ip[1], ip[2], ip[3])),
            ":[0-9]{0,8}",
            ".{0,20}",
        ]
    }

    fn name() -> impl Strategy<Value = String> {
        prop_oneof!["[a-z0-9]([-a-z0-9.]{0,20}[a-z0-9])?", ".{0,30}", "[a-z]{250,260}"]
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn run_flags_parse_and_validate_without_panicking(
            lock in name(),
            ns in name(),
            strategy in prop::sample::select(vec!["lease", "for-life", "raft", ""]),
            lease in duration(),
            renew in duration(),
            retry in duration(),
            grace in duration(),
            connect in duration(),
            status in addr(),
        ) {
            let argv = [
                "kube-leader", "run", "--lock", &lock, "--namespace", &ns, "--strategy", strategy,
                "--lease-duration", &lease, "--renew-deadline", &renew, "--retry-period", &retry,
                "--grace", &grace, "--connect-timeout", &connect, "--status-addr", &status,
                "--", "true",
            ];
            match Cli::try_parse_from(argv) {
                Ok(cli) => {
                    let Command::Run(run) = cli.command else {
                        return Err(TestCaseError::fail("not run"));
                    };
                    if let Err(msg) = run.validate() {
                        prop_assert!(msg.contains("--"), "names no flag: {msg}");
                        prop_assert!(!msg.contains('\n'), "{msg}");
                    }
                }
                Err(e) => {
                    let msg = one_line(&e);
                    prop_assert!(!msg.contains('\n'), "{msg}");
                    prop_assert!(!msg.is_empty());
                }
            }
        }

        #[test]
        fn any_timings_validate_without_panicking(
            strategy in prop::sample::select(vec!["lease", "for-life"]),
            lease in duration(),
            renew in duration(),
            retry in duration(),
            grace in duration(),
        ) {
            let argv = [
                "kube-leader", "run", "--lock", "l", "--strategy", strategy, "--lease-duration", &lease,
                "--renew-deadline", &renew, "--retry-period", &retry, "--grace", &grace, "--", "true",
            ];
            match Cli::try_parse_from(argv) {
                Ok(Cli { command: Command::Run(run), .. }) => {
                    if let Err(msg) = run.validate() {
                        prop_assert!(msg.contains("--"), "names no flag: {msg}");
                    }
                }
                Ok(_) => return Err(TestCaseError::fail("not run")),
                Err(e) => prop_assert!(!one_line(&e).contains('\n')),
            }
        }

        #[test]
        fn arbitrary_argument_vectors_never_panic(words in prop::collection::vec(
            prop_oneof![
                prop::sample::select(vec![
                    "run", "status", "rbac", "--lock", "--strategy", "--lease-duration", "--grace",
                    "--status-addr", "--", "-n", "-o", "json", "lease", "for-life", "1s", "x",
                ]).prop_map(String::from),
                ".{0,10}",
            ],
            0..12,
        )) {
            let argv = std::iter::once("kube-leader".to_string()).chain(words);
            if let Ok(Cli { command: Command::Run(run), .. }) = Cli::try_parse_from(argv) {
                let _ = run.validate();
            }
        }
    }
}
