//! Shards: many Leases per process, spread fairly over the live candidates.
//!
//! A set of M shard Leases `<name>-0` .. `<name>-<M-1>` (plain client-go Leases) is shared by
//! the candidates that run [`Shards`]: each holds its fair share, hands shards over when a
//! candidate joins, and takes over a dead candidate's shards when their leases expire. One
//! process renews all its shards from one scheduler over one list/watch; see [`Shards`].

mod assignments;
pub(crate) mod balance;
mod candidate;
mod config;
pub(crate) mod engine;
mod names;
mod scheduler;

pub use assignments::{Assignments, ShardSet};
pub use candidate::Shards;
pub use config::{ShardsConfig, MAX_SHARDS};
pub use names::{member_lease_name, ROLE_LABEL, SHARDS_LABEL, SHARD_COUNT_ANNOTATION};
