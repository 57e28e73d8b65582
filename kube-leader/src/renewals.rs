//! [`Renewals`]: what a Lease candidate's renewals look like, for supervisors and metrics
//! (published by [`LeaseElector::renewals`](crate::LeaseElector::renewals); the observer
//! follows it too).

use std::time::Duration;

use tokio::time::Instant;

/// What a candidate's renewals look like, published on `LeaseElector::renewals`: a
/// heartbeat for supervisors, and the figures for metrics.
///
/// Built by the elector (or from [`Default`]); the struct may gain fields in a minor release.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Renewals {
    /// Whether this candidate currently leads.
    pub leading: bool,
    /// When the last successful renewal (or the acquisition) was sent.
    pub last_success: Option<Instant>,
    /// How long the last successful renewal took.
    pub last_latency: Option<Duration>,
    /// Successful renewals since this elector was created.
    pub successes: u64,
    /// Failed renewal attempts since this elector was created.
    pub failures: u64,
}
