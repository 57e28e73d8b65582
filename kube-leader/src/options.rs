//! [`ElectorOptions`]: the settings both strategies share, turned into an [`Elector`] in one
//! place (the `kube-leader` sidecar's flags and the `clap` feature's
//! `args::LeaderElectionArgs`, with the `clap` feature, both build on it).

use std::time::Duration;

use kube::Client;

use crate::{
    election::Election,
    elector::Elector,
    error::{invalid, Result},
    for_life::{DeadLeaderPod, ForLife, OutsideCluster},
    leadership::Strategy,
    lease::{Coordinated, LeaseConfig, LeaseElector},
    lock,
    rbac::{self, PolicyRule},
    shards::Shards,
    successor::Successor,
};

/// What a candidate of either strategy is, as plain settings: which lock, which strategy,
/// which identity, whether to campaign, the Lease timings, and the options that only one
/// strategy has. [`validate`](Self::validate) checks them together, naming the setting (an
/// option the strategy does not have is refused, not ignored); [`elector`](Self::elector)
/// builds the [`Elector`], [`role_rules`](Self::role_rules) the Role it needs. A program that
/// lets its users choose the strategy (the `kube-leader` sidecar, the `clap` feature's
/// `args::LeaderElectionArgs`) maps its flags here and names no strategy itself.
///
/// ```no_run
/// # fn doc(client: kube::Client) -> kube_leader::Result<()> {
/// use kube_leader::{options::ElectorOptions, Strategy};
///
/// let mut options = ElectorOptions::new(Strategy::Lease, "my-operator");
/// options.namespace = Some("operators".into());
/// let elector = options.elector(client)?;
/// # let _ = elector; Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ElectorOptions {
    /// Lease or leader for life.
    pub strategy: Strategy,
    /// The lock's name (a Lease, or the leader-for-life ConfigMap).
    pub lock: String,
    /// The lock's namespace. Default: `POD_NAMESPACE`, the service-account namespace, then (Lease)
    /// the client's; leader for life without one runs outside a cluster
    /// ([`OutsideCluster`]).
    pub namespace: Option<String>,
    /// This candidate's identity. Default: `POD_NAME`, else the host name. Leader for life:
    /// the name of this candidate's Pod.
    pub identity: Option<String>,
    /// Whether to campaign at all (see [`Election`]).
    pub election: Election,
    /// Lease timings: lease duration, renew deadline, retry period (client-go's 15 s / 10 s /
    /// 2 s). Leader for life has none.
    pub timings: (Duration, Duration, Duration),
    /// Whom a leader that steps down hands over to (see [`Successor`]).
    pub successor: Successor,
    /// How long the others defer to the preferred successor (default 2 s).
    pub successor_wait: Duration,
    /// How long work gated on a term may take to stop once the term is lost (a sidecar's
    /// SIGTERM → SIGKILL). Default: [`stop_bound`](Self::stop_bound), where the lock expires;
    /// a Lease refuses more unless [`allow_grace_beyond_lease`](Self::allow_grace_beyond_lease).
    /// Leader for life advertises it with its liveness heartbeat ([`ForLife::liveness_grace`]).
    pub grace: Option<Duration>,
    /// Accept a [`grace`](Self::grace) beyond the Lease's [`stop_bound`](Self::stop_bound): work
    /// slow to stop may then still run when another candidate has taken the expired lease.
    pub allow_grace_beyond_lease: bool,
    /// Leader for life only: its liveness heartbeat ([`ForLife::liveness`]). `None`: the
    /// strategy's default (off); `Some(None)`: off; `Some(Some(l))`: a write every `l / 3`.
    pub liveness: Option<Option<Duration>>,
    /// Leader for life only: take over from a leader whose Node has not been Ready for this
    /// long ([`ForLife::not_ready_takeover`]).
    pub not_ready_takeover: Option<Duration>,
    /// Leader for life only: what becomes of a dead leader's Pod ([`ForLife::dead_leader_pod`];
    /// `None`: its default). It also decides whether the Role grants `delete pods`.
    pub dead_leader_pod: Option<DeadLeaderPod>,
    /// Leader for life: what to do outside a cluster ([`ForLife::outside_cluster`]; `None`: its
    /// default). A Lease candidate has no such case (it uses the client's namespace).
    pub outside_cluster: Option<OutsideCluster>,
    /// Lease only, not shard sets: take part in Kubernetes' coordinated leader election with
    /// these versions ([`LeaseConfig::coordinated`]).
    pub coordinated: Option<Coordinated>,
}

// === impl ElectorOptions ===

impl ElectorOptions {
    /// A candidate for `lock` with every default.
    pub fn new(strategy: Strategy, lock: impl Into<String>) -> Self {
        let lease = LeaseConfig::default();
        Self {
            strategy,
            lock: lock.into(),
            namespace: None,
            identity: None,
            election: Election::Enabled,
            timings: (lease.lease_duration, lease.renew_deadline, lease.retry_period),
            successor: lease.successor,
            successor_wait: lease.successor_wait,
            grace: None,
            allow_grace_beyond_lease: false,
            liveness: None,
            not_ready_takeover: None,
            dead_leader_pod: None,
            outside_cluster: None,
            coordinated: None,
        }
    }

    /// The options of a [shard set](Shards) named `set` (its Leases `<set>-0` ..): shards are
    /// Leases, with every default.
    pub fn shard_set(set: impl Into<String>) -> Self {
        Self::new(Strategy::Lease, set)
    }

    /// Where the lock expires ([`Strategy::expires`]): the longest time work gated on a term may
    /// take to stop after the term's confirmation lapsed before another candidate can take the
    /// expired lock, `lease_duration − renew_deadline` (the leader stops leading a renew deadline
    /// after its last renewal was sent, and the lease is valid a lease duration after it).
    /// `None` where the lock does not expire.
    pub fn stop_bound(&self) -> Option<Duration> {
        let (lease_duration, renew_deadline, _) = self.timings;
        self.strategy
            .expires()
            .then(|| lease_duration.saturating_sub(renew_deadline))
    }

    /// The [`grace`](Self::grace) in force: as set, else the [`stop_bound`](Self::stop_bound),
    /// else `otherwise` (a lock that does not expire sets no bound).
    pub fn grace_or(&self, otherwise: Duration) -> Duration {
        self.grace.or(self.stop_bound()).unwrap_or(otherwise)
    }

    /// The Lease settings these options give (timings, successor, election; the rest default).
    pub fn lease_config(&self) -> LeaseConfig {
        let (lease_duration, renew_deadline, retry_period) = self.timings;
        let mut config = LeaseConfig::new(lease_duration, renew_deadline, retry_period);
        config.successor = self.successor;
        config.successor_wait = self.successor_wait;
        config.election = self.election;
        config.coordinated = self.coordinated.clone();
        config
    }

    /// Checks the lock's name, the namespace's, and (Lease) client-go's timing rules.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) naming the setting, or
    /// [`Error::InvalidLockName`](crate::Error::InvalidLockName).
    pub fn validate(&self) -> Result<()> {
        lock::validate_name(&self.lock)?;
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
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for `shards`.
    pub fn validate_shards(&self) -> Result<()> {
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

    /// A [shard set](Shards) of `count` Leases named after the lock (`<lock>-0` ..), with these
    /// timings, namespace, identity and election.
    ///
    /// # Errors
    /// As [`validate`](Self::validate) and [`validate_shards`](Self::validate_shards).
    pub fn shards(&self, client: Client, count: u32) -> Result<Shards> {
        self.validate_shards()?;
        self.validate()?;
        let mut shards = Shards::new(client, self.lock.clone(), count).lease_config(self.lease_config());
        if let Some(ns) = &self.namespace {
            shards = shards.namespace(ns.clone());
        }
        if let Some(id) = &self.identity {
            shards = shards.identity(id.clone());
        }
        Ok(shards)
    }

    /// The rules of the Role this candidate needs in the lock's namespace, least privilege, each
    /// with why it is there (the `kube-leader rbac` command prints them; the end-to-end tests
    /// run elections with nothing more).
    pub fn role_rules(&self) -> Vec<PolicyRule> {
        let mut rules = match self.strategy {
            Strategy::ForLife => rbac::for_life_rules(&self.lock, self.dead_leader_pod.unwrap_or_default()),
            Strategy::Lease => rbac::lease_rules(&self.lock),
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
            (Some(Some(l)), _) if l < crate::for_life::MIN_LIVENESS => Err(invalid(
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
    pub fn elector(&self, client: Client) -> Result<Elector> {
        self.validate()?;
        Ok(match self.strategy {
            Strategy::ForLife => {
                let mut e = ForLife::new(client, self.lock.clone())
                    .election(self.election)
                    .successor(self.successor)
                    .successor_wait(self.successor_wait);
                if let Some(ns) = &self.namespace {
                    e = e.namespace(ns.clone());
                }
                if let Some(id) = &self.identity {
                    e = e.pod_name(id.clone());
                }
                self.for_life_options(e).into()
            }
            Strategy::Lease => {
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

// === impl ElectorOptions: leader for life ===

impl ElectorOptions {
    /// Leader for life's own options, where set.
    fn for_life_options(&self, mut e: ForLife) -> ForLife {
        if let Some(liveness) = self.liveness {
            e = e.liveness(liveness);
        }
        if let Some(grace) = self.grace {
            // The work's SIGKILL comes `grace` after its confirmation lapsed: advertised too.
            e = e.liveness_grace(grace);
        }
        if let Some(d) = self.not_ready_takeover {
            e = e.not_ready_takeover(Some(d));
        }
        if let Some(p) = self.dead_leader_pod {
            e = e.dead_leader_pod(p);
        }
        if let Some(o) = self.outside_cluster {
            e = e.outside_cluster(o);
        }
        e
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_client_go_s() {
        let o = ElectorOptions::new(Strategy::Lease, "lock");
        assert_eq!(o.lease_config(), LeaseConfig::default());
        o.validate().unwrap();
    }

    #[test]
    fn bad_settings_are_named() {
        let mut o = ElectorOptions::new(Strategy::Lease, "lock");
        o.timings.1 = Duration::from_secs(20);
        assert!(o.validate().unwrap_err().to_string().contains("renew"));
        // Leader for life has no timings to check.
        o.strategy = Strategy::ForLife;
        o.validate().unwrap();
        o.lock = "Not_A_Name".into();
        assert!(o.validate().is_err());
        let mut o = ElectorOptions::new(Strategy::Lease, "lock");
        o.namespace = Some("Bad NS".into());
        assert!(o.validate().is_err());
    }

    #[test]
    fn an_option_the_strategy_lacks_is_refused_by_name() {
        let mut o = ElectorOptions::new(Strategy::Lease, "lock");
        o.liveness = Some(None);
        assert!(matches!(
            o.validate(),
            Err(crate::Error::InvalidConfig {
                field: "liveness",
                ..
            })
        ));
        let mut o = ElectorOptions::new(Strategy::Lease, "lock");
        o.dead_leader_pod = Some(DeadLeaderPod::Keep);
        assert!(matches!(
            o.validate(),
            Err(crate::Error::InvalidConfig {
                field: "dead_leader_pod",
                ..
            })
        ));
        o.strategy = Strategy::ForLife;
        o.validate().unwrap();
        o.not_ready_takeover = Some(Duration::ZERO);
        assert!(o.validate().is_err());
        let o = ElectorOptions::new(Strategy::ForLife, "lock");
        assert!(matches!(
            o.validate_shards(),
            Err(crate::Error::InvalidConfig { field: "shards", .. })
        ));
        ElectorOptions::shard_set("set").validate_shards().unwrap();
    }

    #[test]
    fn the_grace_is_bounded_where_the_lock_expires() {
        let mut o = ElectorOptions::new(Strategy::Lease, "lock");
        assert_eq!(o.stop_bound(), Some(Duration::from_secs(5)), "15 s − 10 s");
        assert_eq!(o.grace_or(Duration::from_secs(10)), Duration::from_secs(5));
        o.grace = Some(Duration::from_secs(6));
        assert!(matches!(
            o.validate(),
            Err(crate::Error::InvalidConfig { field: "grace", .. })
        ));
        o.allow_grace_beyond_lease = true;
        o.validate().unwrap();
        let mut o = ElectorOptions::new(Strategy::ForLife, "lock");
        assert_eq!(o.stop_bound(), None);
        assert_eq!(o.grace_or(Duration::from_secs(10)), Duration::from_secs(10));
        o.grace = Some(Duration::from_secs(60));
        o.validate().unwrap();
    }

    #[test]
    fn the_role_follows_the_options() {
        let mut o = ElectorOptions::new(Strategy::ForLife, "lock");
        let deletes_pods = |o: &ElectorOptions| {
            o.role_rules()
                .iter()
                .any(|r| r.resource == "pods" && r.verbs.contains(&"delete"))
        };
        assert!(deletes_pods(&o), "delete-evicted by default");
        o.dead_leader_pod = Some(DeadLeaderPod::Keep);
        assert!(!deletes_pods(&o));
        let registrations =
            |o: &ElectorOptions| o.role_rules().iter().any(|r| r.why.contains("registration"));
        assert!(registrations(&o));
        o.successor = Successor::Any;
        assert!(!registrations(&o));
        let o = ElectorOptions::new(Strategy::Lease, "lock");
        assert!(o.role_rules().iter().all(|r| r.resource != "configmaps"));
    }
}
