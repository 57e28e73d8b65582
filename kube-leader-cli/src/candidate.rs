//! The candidate `run` and `elect` campaign as, and `rbac` prints a Role for: the flags as one
//! [`Candidate`] of either strategy, mapped into the library's configs ([`LeaseConfig`],
//! [`ForLifeConfig`]): the one place the flags meet the library. It names no strategy to its
//! callers: it refuses the options a strategy does not have (`validate`), and builds the
//! [`Elector`] ([`elector`]) and the Role ([`Candidate::role_rules`]).

// The library's `Error`, as the library returns it (its size is the library's concern).
#![allow(clippy::result_large_err)]

use std::time::Duration;

use kube::Client;
use kube_leader::internal::StrategyExt as _;
use kube_leader::internal::Validate as _;
use kube_leader::{
    internal::{
        rbac::{self, PolicyRule},
        MIN_LIVENESS,
    },
    CandidatePod, Coordinated, DeadLeaderPod, Elector, Error, ForLife, ForLifeConfig, LeaseConfig,
    LeaseElector, OutsideCluster, Strategy, Successor,
};

use crate::cli::{DeadLeaderPodArg, OutsideClusterArg, RbacArgs, RunArgs, SuccessorArg, DEFAULT_LIVENESS};

type Result<T> = std::result::Result<T, Error>;

/// A configuration error naming the setting (`cli` names the flag that set it).
fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidConfig {
        field,
        reason: reason.into(),
    }
}

/// Leader for life's liveness heartbeat, as `--liveness` sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Liveness {
    /// `--liveness off`.
    Off,
    /// A heartbeat every third of this.
    Every(Duration),
}

/// A candidate of either strategy, as plain settings: which lock, which strategy, which
/// identity, whether to campaign, the Lease timings, and the options that only one strategy
/// has. [`validate`](Self::validate) checks them together, naming the setting (an option the
/// strategy does not have is refused, not ignored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// Lease or leader for life.
    pub(crate) strategy: Strategy,
    /// The lock's name (a Lease, or the leader-for-life ConfigMap).
    pub(crate) lock: String,
    /// The lock's namespace. Default: `POD_NAMESPACE`, the service-account namespace, then (Lease)
    /// the client's; leader for life without one runs outside a cluster
    /// ([`OutsideCluster`]).
    pub(crate) namespace: Option<String>,
    /// This candidate's identity. Default: `POD_NAME`, else the host name. Leader for life:
    /// the name of this candidate's Pod.
    pub(crate) identity: Option<String>,
    /// Whether to campaign at all (see [`LeaseConfig::election`]).
    pub(crate) election: bool,
    /// The Lease's duration (client-go's 15 s). Leader for life has none.
    pub(crate) lease_duration: Duration,
    /// The Lease's renew deadline (client-go's 10 s).
    pub(crate) renew_deadline: Duration,
    /// The Lease's retry period (client-go's 2 s).
    pub(crate) retry_period: Duration,
    /// Whom a leader that steps down hands over to (see [`Successor`]).
    pub(crate) successor: Successor,
    /// How long the others defer to the preferred successor (default 2 s).
    pub(crate) successor_wait: Duration,
    /// How long work gated on a term may take to stop once the term is lost (a sidecar's
    /// SIGTERM → SIGKILL). Default: [`stop_bound`](Self::stop_bound), where the lock expires;
    /// a Lease refuses more unless [`allow_grace_beyond_lease`](Self::allow_grace_beyond_lease).
    /// Leader for life advertises it with its liveness heartbeat ([`ForLifeConfig::liveness_grace`]).
    pub(crate) grace: Option<Duration>,
    /// Accept a [`grace`](Self::grace) beyond the Lease's [`stop_bound`](Self::stop_bound): work
    /// slow to stop may then still run when another candidate has taken the expired lease.
    pub(crate) allow_grace_beyond_lease: bool,
    /// Leader for life only: its liveness heartbeat ([`ForLifeConfig::liveness`]). `None`: not
    /// set (off).
    pub(crate) liveness: Option<Liveness>,
    /// Leader for life only: take over from a leader whose Node has not been Ready for this
    /// long ([`ForLifeConfig::not_ready_takeover`]).
    pub(crate) not_ready_takeover: Option<Duration>,
    /// Leader for life only: what becomes of a dead leader's Pod ([`ForLifeConfig::dead_leader_pod`];
    /// `None`: its default). It also decides whether the Role grants `delete pods`.
    pub(crate) dead_leader_pod: Option<DeadLeaderPod>,
    /// Leader for life: what to do outside a cluster ([`ForLifeConfig::outside_cluster`]; `None`: its
    /// default). A Lease candidate has no such case (it uses the client's namespace).
    pub(crate) outside_cluster: Option<OutsideCluster>,
    /// Lease only, not shard sets: take part in Kubernetes' coordinated leader election with
    /// these versions ([`LeaseConfig::coordinated`]).
    pub(crate) coordinated: Option<Coordinated>,
    /// Lease only: a follower's spare connection ([`LeaseConfig::keep_warm`]); none over HTTP/2.
    pub(crate) keep_warm: Option<Duration>,
}

// === impl Candidate ===

impl Candidate {
    /// A candidate for `lock` with every default.
    pub(crate) fn new(strategy: Strategy, lock: impl Into<String>) -> Self {
        let lease = LeaseConfig::default();
        Self {
            strategy,
            lock: lock.into(),
            namespace: None,
            identity: None,
            election: true,
            lease_duration: lease.lease_duration,
            renew_deadline: lease.renew_deadline,
            retry_period: lease.retry_period,
            successor: lease.successor,
            successor_wait: lease.successor_wait,
            grace: None,
            allow_grace_beyond_lease: false,
            liveness: None,
            not_ready_takeover: None,
            dead_leader_pod: None,
            outside_cluster: None,
            coordinated: None,
            keep_warm: lease.keep_warm,
        }
    }

    /// The options of a [shard set](Shards) named `set` (its Leases `<set>-0` ..): shards are
    /// Leases, with every default.
    pub(crate) fn shard_set(set: impl Into<String>) -> Self {
        Self::new(Strategy::Lease, set)
    }

    /// Where the lock expires ([`Strategy::expires`]): the longest time work gated on a term may
    /// take to stop after the term's confirmation lapsed before another candidate can take the
    /// expired lock, `lease_duration − renew_deadline` (the leader stops leading a renew deadline
    /// after its last renewal was sent, and the lease is valid a lease duration after it).
    /// `None` where the lock does not expire.
    pub(crate) fn stop_bound(&self) -> Option<Duration> {
        self.strategy
            .expires()
            .then(|| self.lease_duration.saturating_sub(self.renew_deadline))
    }

    /// The [`grace`](Self::grace) in force: as set, else the [`stop_bound`](Self::stop_bound),
    /// else `otherwise` (a lock that does not expire sets no bound).
    pub(crate) fn grace_or(&self, otherwise: Duration) -> Duration {
        self.grace.or(self.stop_bound()).unwrap_or(otherwise)
    }

    /// The Lease settings these options give (timings, successor, election; the rest default).
    pub(crate) fn lease_config(&self) -> LeaseConfig {
        let mut config = LeaseConfig::default()
            .lease_duration(self.lease_duration)
            .renew_deadline(self.renew_deadline)
            .retry_period(self.retry_period)
            .successor(self.successor)
            .successor_wait(self.successor_wait)
            .election(self.election);
        config.coordinated.clone_from(&self.coordinated);
        config.keep_warm = self.keep_warm;
        config
    }

    /// Leader for life's settings from these options (the rest default).
    pub(crate) fn for_life_config(&self) -> ForLifeConfig {
        let mut config = ForLifeConfig::default()
            .election(self.election)
            .successor(self.successor)
            .successor_wait(self.successor_wait);
        if let Some(Liveness::Every(l)) = self.liveness {
            config.liveness = Some(l);
        }
        if let Some(grace) = self.grace {
            // The work's SIGKILL comes `grace` after its confirmation lapsed: advertised too.
            config.liveness_grace = grace;
        }
        config.not_ready_takeover = self.not_ready_takeover;
        if let Some(p) = self.dead_leader_pod {
            config.dead_leader_pod = p;
        }
        if let Some(o) = self.outside_cluster {
            config.outside_cluster = o;
        }
        config
    }

    /// Checks the lock's name, the namespace's, and (Lease) client-go's timing rules.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](Error::InvalidConfig) naming the setting, or
    /// [`Error::InvalidLockName`](Error::InvalidLockName).
    pub(crate) fn validate(&self) -> Result<()> {
        kube_leader::internal::validate_name(&self.lock)?;
        if self.coordinated.is_some() && self.strategy != Strategy::Lease {
            return Err(invalid(
                "coordinated",
                format!(
                    "only for `strategy` lease (coordinated leader election elects Lease holders; \
                     this one is {})",
                    self.strategy
                ),
            ));
        }
        if let Some(ns) = &self.namespace {
            validate_namespace(ns)?;
        }
        if self.strategy.expires() {
            self.lease_config().validate()?;
        }
        self.validate_grace()?;
        self.validate_for_life_options()
    }

    /// Checks that a [shard set](Shards) can be built from these options: shards are Leases.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](Error::InvalidConfig) for `shards`.
    pub(crate) fn validate_shards(&self) -> Result<()> {
        if self.coordinated.is_some() {
            return Err(invalid(
                "coordinated",
                "a shard set does not take part in coordinated leader election: its engine \
                 balances its shards itself",
            ));
        }
        if self.strategy != Strategy::Lease {
            return Err(invalid(
                "shards",
                format!(
                    "shards are Leases, not a {} lock: choose the lease strategy (`strategy` lease)",
                    self.strategy
                ),
            ));
        }
        Ok(())
    }

    /// The rules of the Role this candidate needs in the lock's namespace, least privilege, each
    /// with why it is there (the `kube-leader rbac` command prints them; the end-to-end tests
    /// run elections with nothing more).
    pub(crate) fn role_rules(&self) -> Vec<PolicyRule> {
        let mut rules = match self.strategy {
            Strategy::ForLife => rbac::for_life_rules(&self.lock, self.dead_leader_pod.unwrap_or_default()),
            _ => rbac::lease_rules(&self.lock),
        };
        if self.coordinated.is_some() {
            rules.extend(rbac::coordinated_rules());
        } else if self.successor == Successor::Youngest {
            rbac::with_registrations(self.strategy, &mut rules);
        }
        rules
    }

    /// A [`grace`](Self::grace) that outlasts an expiring lock is refused unless allowed.
    fn validate_grace(&self) -> Result<()> {
        match (self.grace, self.stop_bound()) {
            (Some(grace), Some(bound)) if grace > bound && !self.allow_grace_beyond_lease => Err(invalid(
                "grace",
                format!(
                    "{grace:?} outlasts the lease: work slow to stop could still run when another \
                     candidate takes over the expired lease; at most `lease_duration` − \
                     `renew_deadline` = {bound:?} (or accept the risk with \
                     `allow_grace_beyond_lease`)"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Leader for life's own options are refused for another strategy, and checked.
    fn validate_for_life_options(&self) -> Result<()> {
        if self.strategy != Strategy::ForLife {
            let set = [
                ("liveness", self.liveness.is_some(), "a Lease has its renewals"),
                (
                    "not_ready_takeover",
                    self.not_ready_takeover.is_some(),
                    "a Lease expires by itself",
                ),
                (
                    "dead_leader_pod",
                    self.dead_leader_pod.is_some(),
                    "a Lease never deletes a Pod",
                ),
            ];
            if let Some((field, _, why)) = set.iter().find(|(_, set, _)| *set) {
                return Err(invalid(
                    field,
                    format!(
                        "only for `strategy` for-life ({why}; this one is {})",
                        self.strategy
                    ),
                ));
            }
        }
        match (self.liveness, self.not_ready_takeover) {
            (Some(Liveness::Every(l)), _) if l < MIN_LIVENESS => Err(invalid(
                "liveness",
                format!("at least 1s (a heartbeat every third of it), or off; got {l:?}"),
            )),
            (_, Some(d)) if d.is_zero() => Err(invalid("not_ready_takeover", "must be greater than zero")),
            _ => Ok(()),
        }
    }

    /// The candidate, once [validated](Self::validate).
    ///
    /// # Errors
    /// As [`validate`](Self::validate).
    pub(crate) fn elector(&self, client: Client) -> Result<Elector> {
        self.validate()?;
        Ok(match self.strategy {
            Strategy::ForLife => {
                let mut e = ForLife::new(client, self.lock.clone()).config(self.for_life_config());
                if let Some(ns) = &self.namespace {
                    e = e.namespace(ns.clone());
                }
                if let Some(id) = &self.identity {
                    e = e.identity(id.clone());
                }
                e.into()
            }
            _ => {
                let mut e = LeaseElector::new(client, self.lock.clone()).config(self.lease_config());
                if let Some(ns) = &self.namespace {
                    e = e.namespace(ns.clone());
                }
                if let Some(id) = &self.identity {
                    e = e.identity(id.clone());
                }
                e.into()
            }
        })
    }
}

/// A namespace is a DNS-1123 label: at most 63 lower-case letters, digits and `-`, starting
/// and ending with a letter or digit.
fn validate_namespace(ns: &str) -> Result<()> {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let ok = !ns.is_empty()
        && ns.len() <= 63
        && ns.bytes().all(|b| alnum(b) || b == b'-')
        && alnum(ns.as_bytes()[0])
        && alnum(ns.as_bytes()[ns.len() - 1]);
    if ok {
        return Ok(());
    }
    Err(invalid(
        "namespace",
        format!("{ns:?} is not a namespace name (at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit)"),
    ))
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
        // Over HTTP/2 the takeover write shares the watch's (PINGed) connection: no spare.
        options.keep_warm = options.keep_warm.filter(|_| self.cluster.http1);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_client_go_s() {
        let o = Candidate::new(Strategy::Lease, "lock");
        assert_eq!(o.lease_config(), LeaseConfig::default());
        o.validate().unwrap();
    }

    #[test]
    fn bad_settings_are_named() {
        let mut o = Candidate::new(Strategy::Lease, "lock");
        o.renew_deadline = Duration::from_secs(20);
        assert!(o.validate().unwrap_err().to_string().contains("renew"));
        // Leader for life has no timings to check.
        o.strategy = Strategy::ForLife;
        o.validate().unwrap();
        o.lock = "Not_A_Name".into();
        assert!(o.validate().is_err());
        let mut o = Candidate::new(Strategy::Lease, "lock");
        o.namespace = Some("Bad NS".into());
        assert!(o.validate().is_err());
    }

    #[test]
    fn an_option_the_strategy_lacks_is_refused_by_name() {
        let mut o = Candidate::new(Strategy::Lease, "lock");
        o.liveness = Some(Liveness::Off);
        assert!(matches!(
            o.validate(),
            Err(Error::InvalidConfig {
                field: "liveness",
                ..
            })
        ));
        let mut o = Candidate::new(Strategy::Lease, "lock");
        o.dead_leader_pod = Some(DeadLeaderPod::Keep);
        assert!(matches!(
            o.validate(),
            Err(Error::InvalidConfig {
                field: "dead_leader_pod",
                ..
            })
        ));
        o.strategy = Strategy::ForLife;
        o.validate().unwrap();
        o.not_ready_takeover = Some(Duration::ZERO);
        assert!(o.validate().is_err());
        let o = Candidate::new(Strategy::ForLife, "lock");
        assert!(matches!(
            o.validate_shards(),
            Err(Error::InvalidConfig { field: "shards", .. })
        ));
        Candidate::shard_set("set").validate_shards().unwrap();
    }

    #[test]
    fn the_grace_is_bounded_where_the_lock_expires() {
        let mut o = Candidate::new(Strategy::Lease, "lock");
        assert_eq!(o.stop_bound(), Some(Duration::from_secs(5)), "15 s − 10 s");
        assert_eq!(o.grace_or(Duration::from_secs(10)), Duration::from_secs(5));
        o.grace = Some(Duration::from_secs(6));
        assert!(matches!(
            o.validate(),
            Err(Error::InvalidConfig { field: "grace", .. })
        ));
        o.allow_grace_beyond_lease = true;
        o.validate().unwrap();
        let mut o = Candidate::new(Strategy::ForLife, "lock");
        assert_eq!(o.stop_bound(), None);
        assert_eq!(o.grace_or(Duration::from_secs(10)), Duration::from_secs(10));
        o.grace = Some(Duration::from_secs(60));
        o.validate().unwrap();
    }

    #[test]
    fn the_role_follows_the_options() {
        let mut o = Candidate::new(Strategy::ForLife, "lock");
        let deletes_pods = |o: &Candidate| {
            o.role_rules()
                .iter()
                .any(|r| r.resource == "pods" && r.verbs.contains(&"delete"))
        };
        assert!(deletes_pods(&o), "delete-evicted by default");
        o.dead_leader_pod = Some(DeadLeaderPod::Keep);
        assert!(!deletes_pods(&o));
        let registrations = |o: &Candidate| o.role_rules().iter().any(|r| r.why.contains("registration"));
        assert!(registrations(&o));
        o.successor = Successor::Any;
        assert!(!registrations(&o));
        let o = Candidate::new(Strategy::Lease, "lock");
        assert!(o.role_rules().iter().all(|r| r.resource != "configmaps"));
    }
}
