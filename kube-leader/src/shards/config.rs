//! Shard election settings and their validation.

use std::time::Duration;

use crate::{
    error::{invalid, Result},
    lease::LeaseConfig,
    setters::setters,
};

/// The most shards one set may have: far beyond what one API server renews comfortably
/// (1,000 Leases at 2 s are 500 writes/s), and small enough that every index fits a `u32`.
pub const MAX_SHARDS: u32 = 100_000;

/// Settings of a shard set ([`Shards`](crate::Shards)).
///
/// Every shard is a client-go compatible Lease with the timings of [`ShardsConfig::lease`].
/// Its holder stops acting on it as a [`LeaseElector`](crate::LeaseElector) leader does: when
/// its renew deadline passes without a successful renewal. [`Shards::start`](crate::Shards::start)
/// checks the settings.
///
/// Build it from [`Default`] and its setters, or set the fields of a default one. The struct
/// may gain fields in a minor release.
///
/// ```
/// use std::time::Duration;
/// use kube_leader::{LeaseConfig, ShardsConfig};
///
/// let lease = LeaseConfig::default().renew_deadline(Duration::from_secs(8));
/// let config = ShardsConfig::default().lease(lease).max_in_flight(16);
/// assert_eq!(config.lease.renew_deadline, Duration::from_secs(8));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardsConfig {
    /// Timings of every shard Lease and of the membership Lease (default client-go's 15 s /
    /// 10 s / 2 s). `shutdown_grace` bounds the wait for the work on each shard to stop after
    /// shutdown; `release_on_cancel` releases shards on shutdown. `api_timeout` bounds each call
    /// (default: half the renew deadline, so that a renewal that hangs leaves time for another).
    pub lease: LeaseConfig,
    /// Most API calls in flight at once, over all shards of this candidate. Default 64: 1,000
    /// shards at 2 s are 500 writes/s, which at 50 ms per write (measured on a loaded 2-core
    /// test machine) keep 25 calls in flight; bounded so that an API server that slows down is
    /// not met with a growing pile of requests. (With 16, the benchmark's 1,000 shards were
    /// renewed every 2.9 s instead of 2 s.)
    pub max_in_flight: usize,
    /// After a shard is handed over to rebalance (a candidate joined), how long to wait for the
    /// work on it to stop before giving up the release: renewals go on meanwhile, so nobody else
    /// holds it. Past this bound the shard is left to expire. Default 10 s (the default renew
    /// deadline).
    pub handover_grace: Duration,
    /// How long a new candidate waits after it announced itself before it takes free shards,
    /// so that candidates started together see each other first and do not take everything
    /// to hand it over again a moment later. Default: the retry period (`None`). A candidate
    /// that finds every shard held (it joins a running set) does not wait: the others hand
    /// its share over as soon as they see it.
    pub join_settle: Option<Duration>,
}

impl Default for ShardsConfig {
    fn default() -> Self {
        Self {
            lease: LeaseConfig::default(),
            max_in_flight: 64,
            handover_grace: Duration::from_secs(10),
            join_settle: None,
        }
    }
}

// === impl ShardsConfig ===

setters!(ShardsConfig {
    lease: LeaseConfig => lease,
    max_in_flight: usize => max_in_flight,
    handover_grace: Duration => handover_grace,
    join_settle: Duration => Some(join_settle),
});

impl ShardsConfig {
    /// Checks the Lease timings with client-go's rules ([`LeaseConfig::validate`]) and the
    /// shard settings.
    pub(crate) fn validate(&self) -> Result<()> {
        self.lease.validate()?;
        if self.lease.coordinated.is_some() {
            return Err(invalid(
                "lease.coordinated",
                "a shard set does not take part in coordinated leader election: its engine balances \
                 its shards itself",
            ));
        }
        if self.max_in_flight == 0 {
            return Err(invalid("max_in_flight", "max in flight must be at least 1"));
        }
        if self.handover_grace > Duration::from_secs(365 * 24 * 3600) {
            return Err(invalid(
                "handover_grace",
                format!(
                    "handover grace must be at most 365 days, got {:?}",
                    self.handover_grace
                ),
            ));
        }
        if let Some(s) = self.join_settle.filter(|s| *s > self.lease.lease_duration) {
            return Err(invalid(
                "join_settle",
                format!(
                    "join settle ({s:?}) must be at most the lease duration ({:?})",
                    self.lease.lease_duration
                ),
            ));
        }
        Ok(())
    }

    /// The bound on each API call.
    pub(crate) fn call_timeout(&self) -> Duration {
        self.lease.call_timeout()
    }

    pub(crate) fn settle_in_force(&self) -> Duration {
        self.join_settle.unwrap_or(self.lease.retry_period)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_client_go_timed() {
        let c = ShardsConfig::default();
        c.validate().unwrap();
        assert_eq!(c.lease, LeaseConfig::default());
        assert_eq!(c.call_timeout(), Duration::from_secs(5));
        assert_eq!(c.settle_in_force(), Duration::from_secs(2));
    }

    #[test]
    fn bad_settings_are_named() {
        for (c, want) in [
            (
                ShardsConfig {
                    max_in_flight: 0,
                    ..Default::default()
                },
                "max in flight",
            ),
            (
                ShardsConfig {
                    join_settle: Some(Duration::from_secs(60)),
                    ..Default::default()
                },
                "join settle",
            ),
            (
                ShardsConfig {
                    lease: LeaseConfig {
                        renew_deadline: Duration::from_secs(20),
                        ..Default::default()
                    },
                    ..Default::default()
                },
                "greater than renew deadline",
            ),
        ] {
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(want), "{e} should contain {want}");
        }
    }
}
