//! Lease election timings and their validation.

use std::time::Duration;

use super::coordinated::Coordinated;
use crate::{
    error::{invalid, Result},
    setters::setters,
    successor::Successor,
};

/// client-go's `JitterFactor`: the renew deadline must exceed `1.2 × retry period`.
pub const JITTER_FACTOR: f64 = 1.2;

/// The longest duration client-go can express: `time.Duration` is an `int64` of nanoseconds.
const MAX_DURATION: Duration = Duration::from_nanos(i64::MAX as u64);

/// The longest lease duration a Lease can advertise: `leaseDurationSeconds` is an `int32`.
const MAX_LEASE_DURATION: Duration = Duration::from_secs(i32::MAX as u64);

/// client-go's `time.Duration(JitterFactor * float64(retryPeriod))`: the product in floating
/// point, truncated to whole nanoseconds. `retry_period` is at most [`MAX_DURATION`], so the
/// result fits.
fn jittered_retry_period(retry_period: Duration) -> Duration {
    let nanos = (JITTER_FACTOR * retry_period.as_nanos() as f64) as u64;
    Duration::from_nanos(nanos)
}

/// client-go's rule for a renewing loop: the renew deadline must exceed
/// [`JITTER_FACTOR`] × the retry period (computed as client-go does, in nanoseconds), so that a
/// renewal can be retried at least once before the deadline. Part of
/// `LeaseConfig::validate`; the `kube-leader` sidecar applies it to its supervisor's
/// heartbeats under both strategies.
pub fn check_renew_deadline(renew_deadline: Duration, retry_period: Duration) -> Result<()> {
    let retry_period = retry_period.min(MAX_DURATION);
    let jittered = jittered_retry_period(retry_period);
    if renew_deadline <= jittered {
        return Err(invalid(
            "retry_period",
            format!("renew deadline ({renew_deadline:?}) must be greater than retry period × {JITTER_FACTOR} ({jittered:?})"),
        ));
    }
    Ok(())
}

/// Timings of a Lease election.
///
/// The defaults are client-go's and controller-runtime's: 15 s / 10 s / 2 s.
///
/// # Clock assumption
/// As in client-go, expiry is judged on each candidate's own monotonic clock from when it
/// *observed* the record change, never by comparing `renewTime` with the local clock. The leader
/// stops leading when `renew_deadline` has passed on its clock since it sent its last successful
/// renewal; a follower takes over when `lease_duration` has passed on its clock since it saw that
/// renewal. Because the renewal is sent before anybody can observe it, the leader always stops
/// first, as long as the clocks' rates differ by less than `lease_duration / renew_deadline`
/// (1.5 with the defaults): pauses of the leader process are covered, since the monotonic clock
/// keeps running while a process is stopped.
///
/// Build one with [`Default`] and its setters (`LeaseConfig::default().renew_deadline(d)`); the
/// struct may gain fields in a minor release.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseConfig {
    /// How long a lease is valid after its last renewal was observed; written to the Lease as
    /// `leaseDurationSeconds` (rounded up to whole seconds). Default 15 s (client-go).
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it stops leading. Default 10 s
    /// (client-go).
    pub renew_deadline: Duration,
    /// How often the leader renews, and how long candidates wait between attempts after a
    /// transient error. Default 2 s (client-go).
    pub retry_period: Duration,
    /// Clear the holder when leadership ends by shutdown or release, so another candidate takes
    /// over at once (client-go's `ReleaseOnCancel`). Default `true`.
    pub release_on_cancel: bool,
    /// After the shutdown token fires, how long to wait for the user's work to stop (the
    /// [`Leadership`](crate::Leadership) to be dropped or released) before giving up the release.
    /// Renewals go on meanwhile, so nobody else leads while the work winds down. Past this bound
    /// the lease is left to expire instead of being released. Default 30 s.
    pub shutdown_grace: Duration,
    /// Bound on each API call. Default (`None`): half the renew deadline, so that one request
    /// that hangs (a half-open connection) leaves time for another attempt within the renew
    /// deadline instead of costing the term (client-go's fix for the same problem,
    /// kubernetes PR 98059). Renewals are bounded by the time left to the deadline anyway.
    pub api_timeout: Option<Duration>,
    /// Which candidate a leader that steps down (shutdown, release) hands over to. Default
    /// [`Successor::Youngest`]: the youngest live candidate, so that a rollout moves leadership
    /// once, to a Pod of the new ReplicaSet (see [`Successor`](crate::Successor)). client-go
    /// candidates on the same Lease ignore the preference and take a released lease as before.
    pub successor: Successor,
    /// How long a candidate that is not the preferred successor defers to it after a release,
    /// counted from when it saw the release; the preferred one takes over at once, usually
    /// within milliseconds. Crash failover never waits for it (nobody stepped down). Default
    /// 2 s.
    pub successor_wait: Duration,
    /// Whether to campaign for the lock (default `true`): Kubernetes components'
    /// `--leader-elect`.
    ///
    /// With `false`, `become_leader` returns at once and logs so at `info`. No request is sent
    /// for the lock. The fencing token is 0 and [`Leadership::is_skipped`](crate::Leadership::is_skipped)
    /// is `true`. No Event, observation or registration is recorded. The term ends only on
    /// shutdown ([`LossReason::Cancelled`](crate::LossReason::Cancelled)) or release. A
    /// [shard set](crate::Shards) hands this replica every shard.
    ///
    /// Every replica started so leads: **never turn the election off for more than one
    /// replica.** Use it for local runs and single-replica tests.
    ///
    /// ```no_run
    /// # async fn doc(client: kube::Client) -> kube_leader::Result<()> {
    /// use kube_leader::{LeaseConfig, LeaseElector};
    /// use tokio_util::sync::CancellationToken;
    ///
    /// let local = std::env::var_os("KUBERNETES_SERVICE_HOST").is_none();
    /// let elector =
    ///     LeaseElector::new(client, "my-operator").config(LeaseConfig::default().election(!local));
    /// let leadership = elector.become_leader(&CancellationToken::new()).await?;
    /// assert_eq!(leadership.is_skipped(), local);
    /// # Ok(()) }
    /// ```
    pub election: bool,
    /// Take part in Kubernetes' coordinated leader election (KEP-4355) with these versions: the
    /// controller in kube-apiserver names the holder, and this candidate never takes the Lease
    /// itself (see [`Coordinated`]). Default `None`: a classic candidate,
    /// which leaves a Lease the controller manages to it (it takes one only when the controller
    /// named nobody for 10 s, and gives way to its `spec.preferredHolder`). Where the server
    /// does not serve `LeaseCandidate`, a coordinated candidate says so once and campaigns as a
    /// classic one. Not for shard sets.
    pub coordinated: Option<Coordinated>,
    /// How often a follower reads its Lease from the API server's cache, to keep a warm
    /// connection in kube's pool for its takeover write. Over kube's default HTTP/1.1 client
    /// the watch holds its own connection, the pool drops a connection idle for 90 s, and a
    /// takeover over a new connection waits about 40 ms for the API server's delayed ACK (kube's
    /// connector leaves `TCP_NODELAY` off). Default 60 s: one cached read a minute per follower.
    /// `None`: one read when the campaign begins to follow, none after (over HTTP/2 the read
    /// only costs a request; with thousands of followers the reads add up).
    pub keep_warm: Option<Duration>,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            // Same defaults as client-go's leaderelection and controller-runtime's manager.
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            release_on_cancel: true,
            shutdown_grace: Duration::from_secs(30),
            api_timeout: None,
            successor: Successor::Youngest,
            successor_wait: Duration::from_secs(2),
            election: true,
            coordinated: None,
            keep_warm: Some(Duration::from_secs(60)),
        }
    }
}

// === impl LeaseConfig ===

setters!(LeaseConfig {
    lease_duration: Duration => lease_duration,
    renew_deadline: Duration => renew_deadline,
    retry_period: Duration => retry_period,
    release_on_cancel: bool => release_on_cancel,
    shutdown_grace: Duration => shutdown_grace,
    api_timeout: Duration => Some(api_timeout),
    successor: Successor => successor,
    successor_wait: Duration => successor_wait,
    election: bool => election,
    coordinated: Coordinated => Some(coordinated),
    keep_warm: Option<Duration> => keep_warm,
});

impl LeaseConfig {
    /// Checks the timings with client-go's rules: all positive, `lease_duration >
    /// renew_deadline > 1.2 × retry_period` (computed as client-go does, in nanoseconds:
    /// `time.Duration(JitterFactor * float64(RetryPeriod))`). Also requires a lease duration of
    /// at least one second and at most `i32::MAX` seconds, since `leaseDurationSeconds` is a
    /// whole number of seconds in an `int32`, and every duration to be at most client-go's
    /// longest (`time.Duration` is an `int64` of nanoseconds, about 292 years), so that no
    /// deadline arithmetic can overflow.
    pub(crate) fn validate(&self) -> Result<()> {
        self.check_ranges()?;
        let bad = |field, m: String| Err(invalid(field, m));
        if self.lease_duration < Duration::from_secs(1) {
            return bad(
                "lease_duration",
                format!(
                    "lease duration must be at least 1s (leaseDurationSeconds is whole seconds), got {:?}",
                    self.lease_duration
                ),
            );
        }
        if self.lease_duration > MAX_LEASE_DURATION {
            return bad("lease_duration", format!(
                "lease duration must be at most {MAX_LEASE_DURATION:?} (leaseDurationSeconds is a 32-bit integer), got {:?}",
                self.lease_duration
            ));
        }
        if self.lease_duration <= self.renew_deadline {
            return bad(
                "renew_deadline",
                format!(
                    "lease duration ({:?}) must be greater than renew deadline ({:?})",
                    self.lease_duration, self.renew_deadline
                ),
            );
        }
        check_renew_deadline(self.renew_deadline, self.retry_period)?;
        if let Some(c) = &self.coordinated {
            c.validate()?;
        }
        Ok(())
    }

    /// Every duration at most client-go's longest, and greater than zero but for the shutdown
    /// grace (none: stop at once) and an unset API timeout.
    fn check_ranges(&self) -> Result<()> {
        let durations = [
            (
                "lease_duration",
                "lease duration",
                Some(self.lease_duration),
                false,
            ),
            (
                "renew_deadline",
                "renew deadline",
                Some(self.renew_deadline),
                false,
            ),
            ("retry_period", "retry period", Some(self.retry_period), false),
            (
                "shutdown_grace",
                "shutdown grace",
                Some(self.shutdown_grace),
                true,
            ),
            ("api_timeout", "API timeout", self.api_timeout, false),
            ("keep_warm", "keep-warm interval", self.keep_warm, false),
            (
                "successor_wait",
                "successor wait",
                Some(self.successor_wait),
                true,
            ),
        ];
        for (field, name, d, may_be_zero) in durations {
            let Some(d) = d else { continue };
            if d.is_zero() && !may_be_zero {
                return Err(invalid(field, format!("{name} must be greater than zero")));
            }
            if d > MAX_DURATION {
                return Err(invalid(
                    field,
                    format!(
                        "{name} must be at most {MAX_DURATION:?} (client-go's longest duration), got {d:?}"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// `leaseDurationSeconds` as written to the Lease: the duration rounded up to whole seconds.
    pub(crate) fn lease_duration_seconds(&self) -> i32 {
        let secs = self
            .lease_duration
            .as_secs()
            .saturating_add(u64::from(self.lease_duration.subsec_nanos() > 0));
        i32::try_from(secs).unwrap_or(i32::MAX)
    }

    /// The bound on each API call: [`api_timeout`](Self::api_timeout), or half the renew deadline.
    pub(crate) fn call_timeout(&self) -> Duration {
        self.api_timeout.unwrap_or(self.renew_deadline / 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn one_hung_request_leaves_time_for_another_attempt() {
        let c = LeaseConfig::default();
        assert_eq!(
            c.call_timeout(),
            Duration::from_secs(5),
            "half the renew deadline"
        );
        let explicit = LeaseConfig {
            api_timeout: Some(Duration::from_secs(3)),
            ..LeaseConfig::default()
        };
        assert_eq!(explicit.call_timeout(), Duration::from_secs(3));
    }

    fn cfg(l: u64, r: u64, p: u64) -> LeaseConfig {
        LeaseConfig {
            lease_duration: Duration::from_millis(l),
            renew_deadline: Duration::from_millis(r),
            retry_period: Duration::from_millis(p),
            ..Default::default()
        }
    }

    #[test]
    fn defaults_are_client_go_and_valid() {
        let c = LeaseConfig::default();
        assert_eq!(c.lease_duration, Duration::from_secs(15));
        assert_eq!(c.renew_deadline, Duration::from_secs(10));
        assert_eq!(c.retry_period, Duration::from_secs(2));
        assert_eq!(
            c.keep_warm,
            Some(Duration::from_secs(60)),
            "under hyper's 90 s idle timeout"
        );
        c.validate().unwrap();
        c.clone().keep_warm(None).validate().unwrap();
        assert_eq!(c.lease_duration_seconds(), 15);
    }

    #[test]
    fn client_go_rules() {
        cfg(2000, 1000, 200).validate().unwrap();
        let cases = [
            (cfg(0, 1000, 200), "lease duration must be greater than zero"),
            (cfg(2000, 0, 200), "renew deadline must be greater than zero"),
            (cfg(2000, 1000, 0), "retry period must be greater than zero"),
            (cfg(1000, 1000, 200), "must be greater than renew deadline"),
            (cfg(3000, 1200, 1000), "must be greater than retry period"),
            (cfg(900, 500, 100), "at least 1s"),
            (
                cfg(2000, 1000, 200).keep_warm(Some(Duration::ZERO)),
                "keep-warm interval must be greater than zero",
            ),
        ];
        for (c, want) in cases {
            let err = c.validate().unwrap_err();
            assert!(matches!(err, Error::InvalidConfig { .. }));
            assert!(err.to_string().contains(want), "{err} should contain {want}");
        }
    }

    /// Found by the properties in `tests/props.rs`: `Duration::mul_f64` panics when the product
    /// does not fit a `Duration`, so a huge retry period made `validate` panic; huge durations
    /// also overflowed the deadline arithmetic of the elector (`Instant + Duration` panics).
    #[test]
    fn huge_durations_are_typed_errors_not_panics() {
        let max = u64::MAX; // milliseconds: far beyond what client-go can express
        for (c, want) in [
            (cfg(15_000, 10_000, max), "retry period must be at most"),
            (cfg(max, 10_000, 2000), "lease duration must be at most"),
            (cfg(max, max - 1, 2000), "lease duration must be at most"),
            (cfg(15_000, max, 2000), "renew deadline must be at most"),
            (
                LeaseConfig {
                    shutdown_grace: Duration::MAX,
                    ..cfg(2000, 1000, 200)
                },
                "shutdown grace must be at most",
            ),
            (
                LeaseConfig {
                    api_timeout: Some(Duration::MAX),
                    ..cfg(2000, 1000, 200)
                },
                "API timeout must be at most",
            ),
            // leaseDurationSeconds is an int32.
            (
                cfg((i32::MAX as u64 + 1) * 1000, 10_000, 2000),
                "leaseDurationSeconds is a 32-bit integer",
            ),
        ] {
            let err = c.validate().unwrap_err();
            assert!(err.to_string().contains(want), "{err} should contain {want}");
        }
        cfg(i32::MAX as u64 * 1000, 10_000, 2000).validate().unwrap();
        let longest = LeaseConfig {
            lease_duration: Duration::from_secs(i32::MAX as u64),
            renew_deadline: Duration::from_secs(i32::MAX as u64 - 1),
            retry_period: Duration::from_secs(1),
            shutdown_grace: MAX_DURATION,
            api_timeout: Some(MAX_DURATION),
            ..Default::default()
        };
        longest.validate().unwrap();
        assert_eq!(cfg(max, 1, 1).lease_duration_seconds(), i32::MAX);
    }

    /// client-go truncates `1.2 × retryPeriod` to whole nanoseconds.
    #[test]
    fn jitter_rule_is_client_go_arithmetic() {
        let c = |renew: Duration, retry: Duration| LeaseConfig {
            lease_duration: Duration::from_secs(10),
            renew_deadline: renew,
            retry_period: retry,
            ..Default::default()
        };
        // 1.2 × 1 ns = 1 ns in client-go: a 2 ns renew deadline is enough.
        c(Duration::from_nanos(2), Duration::from_nanos(1))
            .validate()
            .unwrap();
        c(Duration::from_nanos(1), Duration::from_nanos(1))
            .validate()
            .unwrap_err();
        // 1.2 × 1_000_000_007 ns = 1_200_000_008.4 ns, truncated.
        c(
            Duration::from_nanos(1_200_000_008),
            Duration::from_nanos(1_000_000_007),
        )
        .validate()
        .unwrap_err();
        c(
            Duration::from_nanos(1_200_000_009),
            Duration::from_nanos(1_000_000_007),
        )
        .validate()
        .unwrap();
    }

    #[test]
    fn duration_rounds_up() {
        assert_eq!(cfg(1500, 1000, 200).lease_duration_seconds(), 2);
        assert_eq!(cfg(2000, 1000, 200).lease_duration_seconds(), 2);
    }
}
