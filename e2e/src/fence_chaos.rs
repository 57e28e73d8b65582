//! Support for the fenced chaos run (`tests/fence_chaos.rs`, issue 25): the histories of the
//! lock and of the fenced objects, what the writers and the webhooks reported, and the checker.
//!
//! The writers are the `fence-candidate` binary (library candidates, and the COMMAND of
//! `kube-leader run --fence`).

mod analysis;
mod history;
mod records;

pub use analysis::{analyze, Figures, Input, Landed, Spread};
pub use history::{lock_token, LockVersion, ObjectVersion, Recorded, Recorder, THIEF};
pub use records::{read_checks, read_writes, Check, Outcome, Side, WriteRecord};
