//! The pure decision of a Lease candidate: given what it observed and when, what to do now.

use std::time::Duration;

use tokio::time::Instant;

use super::record::LeaseRecord;

/// A record as this candidate observed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Observed {
    /// The election record.
    pub(crate) record: LeaseRecord,
    /// The Lease's resourceVersion, the precondition of the next write.
    pub(crate) resource_version: Option<String>,
    /// When this candidate first saw this record (its own monotonic clock).
    pub(crate) observed_at: Instant,
}

impl Observed {
    /// Folds a newly seen record into the observation: the observation time moves only when the
    /// record itself changed (client-go compares the raw record), not when only the
    /// resourceVersion did (a label edit does not renew a lease).
    pub(crate) fn update(
        prev: Option<&Observed>,
        record: LeaseRecord,
        rv: Option<String>,
        now: Instant,
    ) -> Observed {
        let observed_at = match prev {
            Some(p) if p.record == record => p.observed_at,
            _ => now,
        };
        Observed {
            record,
            resource_version: rv,
            observed_at,
        }
    }

    /// When the observed holder's lease expires for this candidate: the holder's advertised
    /// duration (client-go ≥ 1.30), or `fallback` if it advertised none, from the observation.
    pub(crate) fn expires_at(&self, fallback: Duration) -> Instant {
        self.observed_at + self.record.lease_duration.unwrap_or(fallback)
    }
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// No Lease exists: create it.
    Create,
    /// The lease is free (released, or expired): take it over; `leaseTransitions` + 1.
    Takeover,
    /// This candidate holds it already (for example after a restart): renew, keeping
    /// `acquireTime` and `leaseTransitions`.
    Renew,
    /// Another candidate holds a valid lease until the given instant.
    WaitUntil(Instant),
}

/// Decides what a candidate named `identity` does at `now`, having observed `observed`
/// (`None`: the Lease does not exist). `fallback` is this candidate's own lease duration, used
/// when the holder advertised none.
pub(crate) fn decide(
    observed: Option<&Observed>,
    identity: &str,
    now: Instant,
    fallback: Duration,
) -> Decision {
    let Some(obs) = observed else {
        return Decision::Create;
    };
    match obs.record.holder.as_deref() {
        None => Decision::Takeover,
        Some(h) if h == identity => Decision::Renew,
        Some(_) => {
            let expiry = obs.expires_at(fallback);
            if now >= expiry {
                Decision::Takeover
            } else {
                Decision::WaitUntil(expiry)
            }
        }
    }
}

/// The record this candidate writes for a decision.
pub(crate) fn record_for(
    decision: &Decision,
    observed: Option<&Observed>,
    identity: &str,
    lease_duration: Duration,
    wall_now: k8s_openapi::jiff::Timestamp,
) -> LeaseRecord {
    let prev = observed.map(|o| &o.record);
    let (acquire_time, transitions) = match decision {
        Decision::Create => (Some(wall_now), 0),
        Decision::Takeover => {
            // client-go increments on every change of holder, including taking a released lease.
            (
                Some(wall_now),
                prev.map_or(0, |p| p.transitions.saturating_add(1)),
            )
        }
        Decision::Renew | Decision::WaitUntil(_) => (
            prev.and_then(|p| p.acquire_time).or(Some(wall_now)),
            prev.map_or(0, |p| p.transitions),
        ),
    };
    LeaseRecord {
        holder: Some(identity.to_string()),
        lease_duration: Some(lease_duration),
        acquire_time,
        renew_time: Some(wall_now),
        transitions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(15);

    fn rec(holder: Option<&str>, secs: Option<u64>, transitions: u32) -> LeaseRecord {
        LeaseRecord {
            holder: holder.map(String::from),
            lease_duration: secs.map(Duration::from_secs),
            transitions,
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn absent_is_created() {
        assert_eq!(decide(None, "me", Instant::now(), D), Decision::Create);
    }

    #[tokio::test(start_paused = true)]
    async fn expiry_uses_the_local_observation_and_the_advertised_duration() {
        let t0 = Instant::now();
        let obs = Observed::update(None, rec(Some("other"), Some(2), 3), Some("1".into()), t0);
        assert_eq!(
            decide(Some(&obs), "me", t0, D),
            Decision::WaitUntil(t0 + Duration::from_secs(2))
        );
        tokio::time::advance(Duration::from_millis(1999)).await;
        assert!(matches!(
            decide(Some(&obs), "me", Instant::now(), D),
            Decision::WaitUntil(_)
        ));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(decide(Some(&obs), "me", Instant::now(), D), Decision::Takeover);
    }

    #[tokio::test(start_paused = true)]
    async fn missing_duration_falls_back_to_ours() {
        let t0 = Instant::now();
        let obs = Observed::update(None, rec(Some("other"), None, 0), None, t0);
        assert_eq!(decide(Some(&obs), "me", t0, D), Decision::WaitUntil(t0 + D));
    }

    #[tokio::test(start_paused = true)]
    async fn released_lease_is_taken_at_once() {
        let t0 = Instant::now();
        let obs = Observed::update(None, rec(None, Some(1), 5), None, t0);
        assert_eq!(decide(Some(&obs), "me", t0, D), Decision::Takeover);
        let r = record_for(&Decision::Takeover, Some(&obs), "me", D, now());
        assert_eq!(r.transitions, 6);
        assert_eq!(r.holder.as_deref(), Some("me"));
    }

    #[tokio::test(start_paused = true)]
    async fn own_record_is_renewed_without_a_transition() {
        let t0 = Instant::now();
        let mut held = rec(Some("me"), Some(15), 9);
        held.acquire_time = Some(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let obs = Observed::update(None, held, None, t0);
        assert_eq!(decide(Some(&obs), "me", t0, D), Decision::Renew);
        let r = record_for(&Decision::Renew, Some(&obs), "me", D, now());
        assert_eq!(r.transitions, 9);
        assert_eq!(r.acquire_time, Some(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    }

    #[tokio::test(start_paused = true)]
    async fn observation_time_moves_only_when_the_record_changes() {
        let t0 = Instant::now();
        let a = Observed::update(None, rec(Some("x"), Some(2), 1), Some("1".into()), t0);
        tokio::time::advance(Duration::from_secs(1)).await;
        let t1 = Instant::now();
        // Same record, new resourceVersion (someone edited a label): the lease was not renewed.
        let b = Observed::update(Some(&a), rec(Some("x"), Some(2), 1), Some("2".into()), t1);
        assert_eq!(b.observed_at, t0);
        assert_eq!(b.resource_version.as_deref(), Some("2"));
        let mut renewed = rec(Some("x"), Some(2), 1);
        renewed.renew_time = Some(now());
        let c = Observed::update(Some(&b), renewed, Some("3".into()), t1);
        assert_eq!(c.observed_at, t1);
    }

    #[tokio::test(start_paused = true)]
    async fn takeover_of_expired_counts_a_transition_and_create_starts_at_zero() {
        let t0 = Instant::now();
        let obs = Observed::update(None, rec(Some("old"), Some(1), 2), None, t0);
        tokio::time::advance(Duration::from_secs(2)).await;
        let d = decide(Some(&obs), "me", Instant::now(), D);
        assert_eq!(d, Decision::Takeover);
        assert_eq!(record_for(&d, Some(&obs), "me", D, now()).transitions, 3);
        assert_eq!(record_for(&Decision::Create, None, "me", D, now()).transitions, 0);
    }

    fn now() -> k8s_openapi::jiff::Timestamp {
        k8s_openapi::jiff::Timestamp::now()
    }
}
