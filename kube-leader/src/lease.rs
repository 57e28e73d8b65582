//! The Lease strategy: client-go's `leaderelection` on a `coordination.k8s.io/v1` Lease.
//!
//! `config` (timings), `record` (the Lease's fields), `decide` (pure decisions on a monotonic
//! clock), `campaign` (follow and acquire), `term` (a held term judged without I/O), `keeper`
//! (the term's I/O: renew, release), `leader` (read or watch the leader without campaigning),
//! `elector` (the candidate's settings and face).

mod campaign;
mod config;
pub(crate) mod coordinated;
pub(crate) mod decide;
mod elector;
mod keeper;
mod observe;
pub(crate) mod record;
mod shared;
mod spare;
pub(crate) mod term;

pub use config::{check_renew_deadline, LeaseConfig, JITTER_FACTOR};
pub use coordinated::Coordinated;
pub use elector::{LeaseElector, Unhealthy};
pub use observe::{current_leader, watch_leader};
pub use record::{LeaseRecord, INSTANCE_ANNOTATION};
pub use shared::Renewals;
