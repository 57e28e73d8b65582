//! Not public API: what the `kube-leader` sidecar and this workspace's tests use of the
//! library's insides.
//!
//! docs.rs does not show this module, and it may change in any release. A program that needs
//! something here should open an issue, so it can become public API with a proper design.

pub use crate::{
    for_life::{Environment, MIN_LIVENESS},
    lease::{check_renew_deadline, LeaseRecord, Renewals, INSTANCE_ANNOTATION, JITTER_FACTOR},
    lock::validate_name,
    shards::{member_lease_name, MAX_SHARDS},
};

/// Who leads a lock, without a candidate.
pub mod leader {
    pub use crate::for_life::{current_leader as for_life_current, watch_leader as for_life_watch};
    pub use crate::lease::{current_leader as lease_current, watch_leader as lease_watch};
}

/// Where a candidate runs: its namespace and identity from the environment.
pub mod discovery {
    pub use crate::discovery::*;
}

/// The Role rules each kind of candidate needs.
pub mod rbac {
    pub use crate::rbac::*;
}

/// What the fence webhook reads of a lock, and its verdict on a fenced write.
pub mod fence {
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
