//! Command-line arguments for an operator's own parser (the `clap` feature):
//! [`LeaderElectionArgs`], with the flag names of Kubernetes' own components
//! (component-base's `--leader-elect*`).

use std::time::Duration;

use kube::Client;

use crate::{
    elector::Elector,
    error::{invalid, Result},
    for_life::{ForLife, ForLifeConfig},
    leadership::Strategy,
    lease::{LeaseConfig, LeaseElector},
    lock,
    shards::{Shards, ShardsConfig},
};

/// The values of `--leader-elect-resource-lock`: client-go's `leases`, or `for-life`.
fn resource_lock() -> impl clap::builder::TypedValueParser<Value = Strategy> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser as _};
    PossibleValuesParser::new([
        PossibleValue::new("leases").help("A `coordination.k8s.io/v1` Lease (client-go's `leases`)"),
        PossibleValue::new("for-life")
            .help("Leader for life: a ConfigMap owned by the leader's Pod (operator-sdk's `leader.Become`)"),
    ])
    .map(|kind| match kind.as_str() {
        "for-life" => Strategy::ForLife,
        _ => Strategy::Lease,
    })
}

/// Leader-election flags to flatten into an operator's `clap` parser, named as Kubernetes
/// components name theirs, each with an environment variable; durations in humantime
/// (`15s`, `1m30s`).
///
/// ```
/// use clap::Parser;
/// use kube_leader::args::LeaderElectionArgs;
///
/// /// My operator.
/// #[derive(Parser)]
/// struct Cli {
///     #[command(flatten)]
///     leader_election: LeaderElectionArgs,
/// }
///
/// let cli = Cli::parse_from(["my-operator", "--leader-elect-lease-duration", "30s", "--leader-elect=false"]);
/// assert_eq!(cli.leader_election.lease_duration, std::time::Duration::from_secs(30));
/// assert!(!cli.leader_election.leader_elect);
/// // let elector = cli.leader_election.elector(client, "my-operator")?;
/// ```
///
/// | flag | environment | default |
/// |---|---|---|
/// | `--leader-elect[=BOOL]` | `LEADER_ELECT` | `true` |
/// | `--leader-elect-lease-duration` | `LEADER_ELECT_LEASE_DURATION` | `15s` |
/// | `--leader-elect-renew-deadline` | `LEADER_ELECT_RENEW_DEADLINE` | `10s` |
/// | `--leader-elect-retry-period` | `LEADER_ELECT_RETRY_PERIOD` | `2s` |
/// | `--leader-elect-resource-lock` | `LEADER_ELECT_RESOURCE_LOCK` | `leases` |
/// | `--leader-elect-resource-name` | `LEADER_ELECT_RESOURCE_NAME` | the program's choice |
/// | `--leader-elect-resource-namespace` | `LEADER_ELECT_RESOURCE_NAMESPACE` | the Pod's |
/// | `--leader-elect-identity` | `LEADER_ELECT_IDENTITY` | `POD_NAME`, else the host name |
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
#[non_exhaustive]
pub struct LeaderElectionArgs {
    /// Campaign for the lock before running (false: lead at once, without a lock; for local
    /// runs of a single replica)
    #[arg(long = "leader-elect", env = "LEADER_ELECT", value_name = "BOOL",
        default_value_t = true, num_args = 0..=1, default_missing_value = "true",
        action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// How long a lease is valid after its last observed renewal; followers wait this long
    /// before taking over a silent leader
    #[arg(long = "leader-elect-lease-duration", env = "LEADER_ELECT_LEASE_DURATION",
        value_name = "DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    pub lease_duration: Duration,
    /// How long the leader tries to renew before it stops leading
    #[arg(long = "leader-elect-renew-deadline", env = "LEADER_ELECT_RENEW_DEADLINE",
        value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub renew_deadline: Duration,
    /// How often the leader renews, and candidates retry after an error
    #[arg(long = "leader-elect-retry-period", env = "LEADER_ELECT_RETRY_PERIOD",
        value_name = "DURATION", default_value = "2s", value_parser = humantime::parse_duration)]
    pub retry_period: Duration,
    /// The kind of lock
    #[arg(long = "leader-elect-resource-lock", env = "LEADER_ELECT_RESOURCE_LOCK",
        value_name = "KIND", default_value = "leases", value_parser = resource_lock())]
    pub resource_lock: Strategy,
    /// The lock's name [default: the program's]
    #[arg(
        long = "leader-elect-resource-name",
        env = "LEADER_ELECT_RESOURCE_NAME",
        value_name = "NAME"
    )]
    pub resource_name: Option<String>,
    /// The lock's namespace [default: POD_NAMESPACE, the service-account namespace, the
    /// kubeconfig context's]
    #[arg(
        long = "leader-elect-resource-namespace",
        env = "LEADER_ELECT_RESOURCE_NAMESPACE",
        value_name = "NS"
    )]
    pub resource_namespace: Option<String>,
    /// This candidate's identity, unique among candidates [default: POD_NAME, else the host
    /// name]
    #[arg(
        long = "leader-elect-identity",
        env = "LEADER_ELECT_IDENTITY",
        value_name = "ID"
    )]
    pub identity: Option<String>,
}

impl Default for LeaderElectionArgs {
    fn default() -> Self {
        use clap::Parser as _;
        /// The defaults are the parser's, written once.
        #[derive(clap::Parser)]
        struct Only {
            #[command(flatten)]
            args: LeaderElectionArgs,
        }
        Only::parse_from(["leader-election"]).args
    }
}

// === impl LeaderElectionArgs ===

impl LeaderElectionArgs {
    /// Returns the Lease settings: the three timings and `--leader-elect`.
    pub fn lease_config(&self) -> LeaseConfig {
        LeaseConfig::default()
            .lease_duration(self.lease_duration)
            .renew_deadline(self.renew_deadline)
            .retry_period(self.retry_period)
            .election(self.leader_elect)
    }

    /// Returns the leader-for-life settings: `--leader-elect`. Leader for life has no timings.
    pub fn for_life_config(&self) -> ForLifeConfig {
        ForLifeConfig::default().election(self.leader_elect)
    }

    /// The lock's name: `--leader-elect-resource-name`, else `default_name`.
    fn lock_name<'a>(&'a self, default_name: &'a str) -> &'a str {
        self.resource_name.as_deref().unwrap_or(default_name)
    }

    /// The candidate these flags describe, for a lock named `default_name` unless
    /// `--leader-elect-resource-name` names another.
    ///
    /// # Errors
    /// A setting that is not valid, named: a bad lock name, or (Lease) a renew deadline not
    /// below the lease duration.
    pub fn elector(&self, client: Client, default_name: &str) -> Result<Elector> {
        let name = self.lock_name(default_name);
        lock::validate_name(name)?;
        Ok(match self.resource_lock {
            Strategy::Lease => {
                let config = self.lease_config();
                config.validate()?;
                let mut e = LeaseElector::new(client, name).config(config);
                if let Some(ns) = &self.resource_namespace {
                    e = e.namespace(ns.clone());
                }
                if let Some(id) = &self.identity {
                    e = e.identity(id.clone());
                }
                e.into()
            }
            Strategy::ForLife => {
                let mut e = ForLife::new(client, name).config(self.for_life_config());
                if let Some(ns) = &self.resource_namespace {
                    e = e.namespace(ns.clone());
                }
                if let Some(id) = &self.identity {
                    e = e.identity(id.clone());
                }
                e.into()
            }
        })
    }

    /// A [shard set](Shards) of `count` Leases named after the lock (`<name>-0` ..), with these
    /// timings, namespace, identity and `--leader-elect`.
    ///
    /// # Errors
    /// As [`elector`](Self::elector); leader for life has no shards.
    pub fn shards(&self, client: Client, default_name: &str, count: u32) -> Result<Shards> {
        if self.resource_lock != Strategy::Lease {
            return Err(invalid(
                "leader-elect-resource-lock",
                "shards are Leases, not a for-life lock: choose `--leader-elect-resource-lock leases`",
            ));
        }
        let name = self.lock_name(default_name);
        lock::validate_name(name)?;
        let config = ShardsConfig::default().lease(self.lease_config());
        config.validate()?;
        let mut shards = Shards::new(client, name, count).config(config);
        if let Some(ns) = &self.resource_namespace {
            shards = shards.namespace(ns.clone());
        }
        if let Some(id) = &self.identity {
            shards = shards.identity(id.clone());
        }
        Ok(shards)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        le: LeaderElectionArgs,
    }

    fn parse(args: &[&str]) -> Result<LeaderElectionArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("op").chain(args.iter().copied())).map(|c| c.le)
    }

    #[test]
    fn the_defaults_are_kubernetes_components() {
        let a = LeaderElectionArgs::default();
        assert!(a.leader_elect);
        assert_eq!(a.resource_lock, Strategy::Lease);
        assert_eq!(a.lock_name("my-operator"), "my-operator");
        assert_eq!(a.lease_config(), LeaseConfig::default());
    }

    #[test]
    fn every_flag_maps_to_its_setting() {
        let a = parse(&[
            "--leader-elect=false",
            "--leader-elect-lease-duration=1m",
            "--leader-elect-renew-deadline=40s",
            "--leader-elect-retry-period=5s",
            "--leader-elect-resource-lock=for-life",
            "--leader-elect-resource-name=lock",
            "--leader-elect-resource-namespace=ops",
            "--leader-elect-identity=me",
        ])
        .unwrap();
        assert_eq!(a.resource_lock, Strategy::ForLife);
        assert_eq!(
            (
                a.lock_name("ignored"),
                a.resource_namespace.as_deref(),
                a.identity.as_deref()
            ),
            ("lock", Some("ops"), Some("me"))
        );
        assert!(!a.for_life_config().election);
        let secs = Duration::from_secs;
        let l = a.lease_config();
        assert_eq!(
            (l.lease_duration, l.renew_deadline, l.retry_period, l.election),
            (secs(60), secs(40), secs(5), false)
        );
        // A bare `--leader-elect` is `true`.
        assert!(parse(&["--leader-elect"]).unwrap().leader_elect);
    }

    #[test]
    fn bad_values_are_refused_with_the_flag_named() {
        let e = parse(&["--leader-elect-lease-duration=soon"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--leader-elect-lease-duration"), "{e}");
        let e = parse(&["--leader-elect-resource-lock=endpoints"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("leases") && e.contains("for-life"), "{e}");
        let a = parse(&["--leader-elect-renew-deadline=20s"]).unwrap();
        let e = a.lease_config().validate().unwrap_err().to_string();
        assert!(e.contains("renew"), "{e}");
    }
}
