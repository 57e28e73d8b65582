//! Support for the chaos runs (`tests/chaos.rs`): the fenced ledger that every leader writes
//! its fencing token to, a seeded schedule generator, the analysis of a run, and the trace
//! check of the Lease candidates' decision steps.
//!
//! The candidates themselves are the `chaos-candidate` binary (library candidates, and the
//! COMMAND of `kube-leader run`); they report JSON lines that [`Analysis`] reads together with
//! the [`History`](crate::checker::History) of terms.

mod analysis;
mod ledger;
mod rng;
mod trace;

pub use analysis::{
    candidate_of, Analysis, Deposition, Fault, Findings, Pause, PostPause, Write, WriteOutcome,
};
pub use ledger::{Ledger, Outcome, LEDGER};
pub use rng::{seed_from_env, Rng};
pub use trace::{Model, Steps, TraceCheck};
