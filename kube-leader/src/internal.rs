//! Not public API: what the `kube-leader` sidecar and this workspace's tests use of the
//! library's insides.
//!
//! docs.rs does not show this module, and it may change in any release. A program that needs
//! something here should open an issue, so it can become public API with a proper design.
//!
//! The `*Ext` traits add the sidecar's accessors to the public types: `use` one to call its
//! methods. Their impls are hidden with the module, so they are not public API either.

use std::time::Duration;

use tokio::sync::watch;

pub use crate::{
    for_life::{Environment, MIN_LIVENESS},
    lease::{check_renew_deadline, LeaseRecord, Renewals, Unhealthy, INSTANCE_ANNOTATION, JITTER_FACTOR},
    lock::validate_name,
    shards::{member_lease_name, MAX_SHARDS},
};
use crate::{
    Coordinated, Elector, ForLife, ForLifeConfig, LeaderInfo, Leadership, LeaseConfig, LeaseElector, LockRef,
    Result, Shards, ShardsConfig, Strategy,
};

/// A lock of `strategy` that nobody holds, to fill in (tests of the sidecar's status).
pub fn leader_info(strategy: Strategy, lock: LockRef) -> LeaderInfo {
    LeaderInfo::new(strategy, lock)
}

/// Checks a config before a candidate starts (`become_leader` checks it too).
pub trait Validate {
    /// The first setting that is not valid, named.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig).
    fn validate(&self) -> Result<()>;
}

macro_rules! validate {
    ($($ty:ty),*) => {$(
        impl Validate for $ty {
            fn validate(&self) -> Result<()> {
                <$ty>::validate(self)
            }
        }
    )*};
}
validate!(LeaseConfig, ForLifeConfig, ShardsConfig, Coordinated, Shards);

/// The Lease settings the sidecar reads.
pub trait LeaseConfigExt {
    /// `spec.leaseDurationSeconds` as written.
    fn lease_duration_seconds(&self) -> i32;
}

impl LeaseConfigExt for LeaseConfig {
    fn lease_duration_seconds(&self) -> i32 {
        LeaseConfig::lease_duration_seconds(self)
    }
}

/// Every strategy, as the sidecar lists them (`--strategy`, the fence's config).
pub const STRATEGIES: [Strategy; 2] = [Strategy::ForLife, Strategy::Lease];

/// The names of [`STRATEGIES`], in order.
pub const STRATEGY_NAMES: [&str; 2] = ["for-life", "lease"];

/// The strategy named `name` (`for-life`, `lease`).
pub fn strategy_named(name: &str) -> Option<Strategy> {
    STRATEGIES.into_iter().find(|s| s.as_str() == name)
}

/// What the sidecar asks of a strategy instead of naming one.
pub trait StrategyExt {
    /// Its name in flags and files: `for-life` or `lease`.
    fn as_str(&self) -> &'static str;
    /// One line about it, for `--help`.
    fn help(self) -> &'static str;
    /// Whether the lock expires by itself when its leader goes silent (a Lease).
    fn expires(self) -> bool;
    /// Whether a leader keeps its lock when its work ends by itself (leader for life).
    fn keeps_lock_after_work(self) -> bool;
    /// Whether a candidate watches its own Pod by itself (leader for life).
    fn watches_own_pod(self) -> bool;
}

impl StrategyExt for Strategy {
    fn as_str(&self) -> &'static str {
        Strategy::as_str(*self)
    }
    fn help(self) -> &'static str {
        match self {
            Strategy::ForLife => {
                "Leader for life: a ConfigMap owned by the leader's Pod (operator-sdk `leader.Become`)"
            }
            Strategy::Lease => {
                "A `coordination.k8s.io/v1` Lease renewed by the leader (client-go `leaderelection`)"
            }
        }
    }
    fn expires(self) -> bool {
        Strategy::expires(self)
    }
    fn keeps_lock_after_work(self) -> bool {
        Strategy::keeps_lock_after_work(self)
    }
    fn watches_own_pod(self) -> bool {
        Strategy::watches_own_pod(self)
    }
}

/// What the sidecar reads of a term.
pub trait LeadershipExt {
    /// Until when the term is confirmed (see [`Leadership::confirmations`]).
    fn confirmed_until(&self) -> Option<tokio::time::Instant>;
}

impl LeadershipExt for Leadership {
    fn confirmed_until(&self) -> Option<tokio::time::Instant> {
        Leadership::confirmed_until(self)
    }
}

/// What the sidecar reads of a Lease candidate.
pub trait LeaseElectorExt {
    /// The settings in force.
    fn settings(&self) -> &LeaseConfig;
    /// The Lease, its namespace resolved.
    ///
    /// # Errors
    /// An invalid lock name.
    fn lock(&self) -> Result<LockRef>;
    /// This candidate's identity, resolved.
    ///
    /// # Errors
    /// None can be found.
    fn resolved_identity(&self) -> Result<String>;
    /// Renewal figures, updated on every renewal attempt.
    fn renewals(&self) -> watch::Receiver<Renewals>;
    /// The election watchdog (client-go's `HealthzAdaptor`).
    ///
    /// # Errors
    /// Leading, but no renewal for the lease duration plus `tolerance`.
    fn check_health(&self, tolerance: Duration) -> Result<(), Unhealthy>;
}

impl LeaseElectorExt for LeaseElector {
    fn settings(&self) -> &LeaseConfig {
        LeaseElector::settings(self)
    }
    fn lock(&self) -> Result<LockRef> {
        LeaseElector::lock(self)
    }
    fn resolved_identity(&self) -> Result<String> {
        LeaseElector::resolved_identity(self)
    }
    fn renewals(&self) -> watch::Receiver<Renewals> {
        LeaseElector::renewals(self)
    }
    fn check_health(&self, tolerance: Duration) -> Result<(), Unhealthy> {
        LeaseElector::check_health(self, tolerance)
    }
}

/// What the sidecar reads of, and sets on, a leader-for-life candidate.
pub trait ForLifeExt {
    /// The settings in force.
    fn settings(&self) -> &ForLifeConfig;
    /// The lock, its namespace resolved.
    ///
    /// # Errors
    /// No namespace (outside a cluster), or an invalid lock name.
    fn lock(&self) -> Result<LockRef>;
    /// This candidate's identity (its Pod's name), resolved.
    ///
    /// # Errors
    /// None can be found.
    fn resolved_identity(&self) -> Result<String>;
    /// Sets where the namespace and Pod name come from when not set (tests).
    #[must_use]
    fn environment(self, environment: Environment) -> Self;
}

impl ForLifeExt for ForLife {
    fn settings(&self) -> &ForLifeConfig {
        ForLife::settings(self)
    }
    fn lock(&self) -> Result<LockRef> {
        ForLife::lock(self)
    }
    fn resolved_identity(&self) -> Result<String> {
        ForLife::resolved_identity(self)
    }
    fn environment(self, environment: Environment) -> Self {
        ForLife::environment(self, environment)
    }
}

/// What the sidecar reads of a shard set.
pub trait ShardsExt {
    /// The settings in force.
    fn settings(&self) -> &ShardsConfig;
    /// The number of shards.
    fn count(&self) -> u32;
    /// The name of shard `index`'s Lease.
    fn lease_name(&self, index: u32) -> String;
    /// The namespace of the shard Leases, resolved.
    fn resolved_namespace(&self) -> String;
    /// This candidate's identity, resolved.
    ///
    /// # Errors
    /// None can be found.
    fn resolved_identity(&self) -> Result<String>;
}

impl ShardsExt for Shards {
    fn settings(&self) -> &ShardsConfig {
        Shards::settings(self)
    }
    fn count(&self) -> u32 {
        Shards::count(self)
    }
    fn lease_name(&self, index: u32) -> String {
        Shards::lease_name(self, index)
    }
    fn resolved_namespace(&self) -> String {
        Shards::resolved_namespace(self)
    }
    fn resolved_identity(&self) -> Result<String> {
        Shards::resolved_identity(self)
    }
}

/// What the sidecar asks of a candidate of either strategy.
pub trait ElectorExt {
    /// The strategy of this candidate.
    fn strategy(&self) -> Strategy;
    /// The lock, its namespace resolved as the strategy does.
    ///
    /// # Errors
    /// No namespace (leader for life outside a cluster), or an invalid lock name.
    fn lock(&self) -> Result<LockRef>;
    /// This candidate's identity, resolved as the strategy does.
    ///
    /// # Errors
    /// None can be found.
    fn identity(&self) -> Result<String>;
    /// A Lease candidate's renewal figures; leader for life has none.
    fn renewals(&self) -> Option<watch::Receiver<Renewals>>;
    /// The election watchdog; leader for life is always healthy.
    ///
    /// # Errors
    /// A Lease leader without a renewal for the lease duration plus `tolerance`.
    fn check_health(&self, tolerance: Duration) -> Result<(), Unhealthy>;
    /// The current leader of `lock`, this candidate's lock as resolved by the caller.
    fn observe_lock(&self, lock: &LockRef) -> watch::Receiver<Option<LeaderInfo>>;
}

impl ElectorExt for Elector {
    fn strategy(&self) -> Strategy {
        Elector::strategy(self)
    }
    fn lock(&self) -> Result<LockRef> {
        Elector::lock(self)
    }
    fn identity(&self) -> Result<String> {
        Elector::identity(self)
    }
    fn renewals(&self) -> Option<watch::Receiver<Renewals>> {
        Elector::renewals(self)
    }
    fn check_health(&self, tolerance: Duration) -> Result<(), Unhealthy> {
        Elector::check_health(self, tolerance)
    }
    fn observe_lock(&self, lock: &LockRef) -> watch::Receiver<Option<LeaderInfo>> {
        Elector::observe_lock(self, lock)
    }
}

/// Who leads a lock, without a candidate.
pub mod leader {
    pub use crate::for_life::{current_leader as for_life_current, watch_leader as for_life_watch};
    pub use crate::lease::{current_leader as lease_current, watch_leader as lease_watch};
    use crate::{LeaderInfo, LockRef, Result, Strategy};

    /// Reads the current leader of a lock of `strategy` once (`None`: no lock).
    ///
    /// # Errors
    /// The API's, named.
    pub async fn current(
        client: kube::Client,
        strategy: Strategy,
        lock: &LockRef,
    ) -> Result<Option<LeaderInfo>> {
        match strategy {
            Strategy::ForLife => for_life_current(client, lock).await,
            Strategy::Lease => lease_current(client, lock).await,
        }
    }
}

/// Where a candidate runs: its namespace and identity from the environment.
pub mod discovery {
    pub use crate::discovery::*;
}

/// The Role rules each kind of candidate needs.
pub mod rbac {
    pub use crate::rbac::*;
}

/// The fence's headers, annotations and layer; what the fence webhook reads of a lock, and its
/// verdict on a fenced write.
pub mod fence {
    pub use crate::fence::{
        fencing_headers, stamp_body, Fenced, FencedLayer, FENCED_TOKEN_ANNOTATION, FENCING_TOKEN_EXTRA,
        FENCING_TOKEN_HEADER,
    };
    pub use crate::fence::{
        judge::{judge, stamp, Write},
        lock::{for_life_state, lease_state, read_lock, LockReadError, LockState},
    };
}

/// The labels and annotations kube-leader writes.
pub mod labels {
    pub use crate::{
        events::REASON as EVENT_REASON,
        lease::coordinated::{RENEW_EVERY as COORDINATED_RENEW_EVERY, STRATEGY as COORDINATED_STRATEGY},
        lock::{
            ACQUIRED_AT_ANNOTATION, FENCING_TOKEN_ANNOTATION, HOLDER_ANNOTATION, LIVENESS_ANNOTATION,
            MANAGED_BY_LABEL, RENEW_TIME_ANNOTATION, STRATEGY_LABEL,
        },
        shards::{ROLE_LABEL, SHARDS_LABEL, SHARD_COUNT_ANNOTATION},
        successor::{
            CANDIDATE_FOR_LABEL, LOCK_KIND_LABEL, PREFERRED_HOLDER_ANNOTATION, REGISTRATION_HEARTBEAT,
        },
    };
}

/// The API client's parts the sidecar sets itself (feature `http2`).
#[cfg(feature = "http2")]
pub mod client {
    pub use crate::client::{
        builder::{http1, http2_with},
        liveness::Liveness,
    };
}

/// Trace checking of the Lease strategy: replays the decision steps a chaos run recorded
/// through the shipped decision code (hidden feature `trace-check`). The model checker
/// (`src/model.rs`) is a test module with a test-only checker; the replayer must be reachable
/// from the e2e crate, so it is mounted here.
#[cfg(any(test, feature = "trace-check"))]
#[path = "model/trace.rs"]
pub mod trace;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_strategy_has_its_name() {
        assert_eq!(STRATEGIES.map(|s| StrategyExt::as_str(&s)), STRATEGY_NAMES);
        assert_eq!(STRATEGY_NAMES.map(strategy_named), STRATEGIES.map(Some));
        assert_eq!(strategy_named("leases"), None);
    }
}
