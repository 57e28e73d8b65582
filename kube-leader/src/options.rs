//! [`ElectorOptions`]: the settings both strategies share, turned into an [`Elector`] in one
//! place (the `kube-leader` sidecar's flags and the `clap` feature's
//! `args::LeaderElectionArgs`, with the `clap` feature, both build on it).

use std::time::Duration;

use kube::Client;

use crate::{
    election::Election,
    elector::Elector,
    error::{invalid, Result},
    for_life::ForLife,
    leadership::Strategy,
    lease::{LeaseConfig, LeaseElector},
    lock,
    successor::Successor,
};

/// What a candidate of either strategy is, as plain settings: which lock, which strategy,
/// which identity, whether to campaign, and the Lease timings. [`elector`](Self::elector)
/// checks them and builds the [`Elector`]; strategy-specific options are set on it afterwards.
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
    /// ([`OutsideCluster`](crate::OutsideCluster)).
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
        }
    }

    /// The Lease settings these options give (timings, successor, election; the rest default).
    pub fn lease_config(&self) -> LeaseConfig {
        let (lease_duration, renew_deadline, retry_period) = self.timings;
        let mut config = LeaseConfig::new(lease_duration, renew_deadline, retry_period);
        config.successor = self.successor;
        config.successor_wait = self.successor_wait;
        config.election = self.election;
        config
    }

    /// Checks the lock's name, the namespace's, and (Lease) client-go's timing rules.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) naming the setting, or
    /// [`Error::InvalidLockName`](crate::Error::InvalidLockName).
    pub fn validate(&self) -> Result<()> {
        lock::validate_name(&self.lock)?;
        if let Some(ns) = &self.namespace {
            validate_namespace(ns)?;
        }
        if self.strategy == Strategy::Lease {
            self.lease_config().validate()?;
        }
        Ok(())
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
                e.into()
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
}
