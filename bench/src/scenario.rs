//! The scenarios of the benchmark, one module each.

pub(crate) mod for_life;
pub(crate) mod handover;
pub(crate) mod idle;
pub(crate) mod lease;
pub(crate) mod scale;
pub(crate) mod shards;
pub(crate) mod sidecar;
pub(crate) mod under_load;
