//! The Lease strategy: client-go's `leaderelection` on a `coordination.k8s.io/v1` Lease.

mod config;
mod decide;
mod elector;
mod record;

pub use config::{LeaseConfig, JITTER_FACTOR};
pub use elector::{current_leader, watch_leader, LeaseElector, Recampaign, Renewals, Unhealthy};
pub use record::{LeaseRecord, INSTANCE_ANNOTATION};
