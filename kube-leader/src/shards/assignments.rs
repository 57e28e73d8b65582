//! What a running candidate hands out: the [`Assignments`] stream of acquired shards, each an
//! index and its [`Leadership`], and the [`ShardSet`] held now.

use std::collections::BTreeMap;

use tokio::sync::{mpsc, watch};

use crate::{error::Result, leadership::Leadership};

/// The shards of one candidate, as they are acquired; see [`Shards::start`]. Dropping it
/// hands every shard back, as a shutdown does.
///
/// [`Shards::start`]: super::Shards::start
#[derive(Debug)]
#[must_use = "the shards acquired are taken from `next`; dropping this hands every shard back"]
pub struct Assignments {
    rx: mpsc::UnboundedReceiver<(u32, Leadership)>,
    held: watch::Receiver<ShardSet>,
    task: Option<tokio::task::JoinHandle<Result<()>>>,
}

// === impl Assignments ===

impl Assignments {
    pub(super) fn new(
        rx: mpsc::UnboundedReceiver<(u32, Leadership)>,
        held: watch::Receiver<ShardSet>,
        task: tokio::task::JoinHandle<Result<()>>,
    ) -> Self {
        Self {
            rx,
            held,
            task: Some(task),
        }
    }

    /// The next shard acquired: its index (`0..count`) and the [`Leadership`] of its Lease
    /// `<name>-<index>`; `None` once the candidate has stopped (after shutdown, or an error: see
    /// [`finish`](Self::finish)).
    ///
    /// The `Leadership` is the shard's guard. Dropping it (or
    /// [`release`](Leadership::release)) tells the candidate that the work on the shard has
    /// stopped: a shard that was handed over, or given up on shutdown, is released then, and it
    /// is renewed until then for at most the handover grace or the shutdown grace.
    ///
    /// A shard lost between its acquisition and this call is still returned, its loss token
    /// already cancelled, so that the consumer sees the loss: drop it. Shards come in the order
    /// they were acquired; a shard lost and taken again comes again with a new `Leadership` (a
    /// new fencing token) while the old one may still be kept: keep shards keyed by index and
    /// let the new one replace the old, or watch each one's
    /// [`lost_token`](Leadership::lost_token). The [`held`](Self::held) set alone cannot tell a
    /// consumer of every loss: a shard acquired and lost between two looks at it never appears
    /// there.
    ///
    /// A shard lost outright (its renew deadline passed, another holder wrote it, it was
    /// deleted) whose `Leadership` is still kept is not waited for forever: this candidate does
    /// not take it again for the lease duration minus the renew deadline from then (the time
    /// its work has to stop, as for any Lease leader), and after that only once its lease has
    /// expired as this candidate last saw it, when any other candidate may take it too. It
    /// comes then with a new `Leadership`, and the old one's `release` returns. So a consumer
    /// that never saw the loss cannot keep the shard from being taken again; drop a lost
    /// shard's `Leadership` as soon as its work has stopped.
    ///
    /// # Cancellation safety
    /// Cancel-safe: a shard acquired meanwhile is returned by the next call.
    pub async fn next(&mut self) -> Option<(u32, Leadership)> {
        self.rx.recv().await
    }

    /// The shards held now, updated on every change: for observers, status pages, or a
    /// process that passes the set to another (the `kube-leader run --shards` sidecar).
    pub fn held(&self) -> watch::Receiver<ShardSet> {
        self.held.clone()
    }

    /// Waits until the candidate has stopped and tells why: `Ok` after shutdown, or the error
    /// that ended it.
    ///
    /// # Cancellation safety
    /// Cancel-safe in that the candidate goes on in the background; its result is lost.
    pub async fn finish(mut self) -> Result<()> {
        crate::leadership::join(self.task.take()).await
    }
}

/// The shards a candidate holds now, published by [`Assignments::held`].
///
/// Built by the shard engine (or from [`Default`]); the struct may gain fields in a minor
/// release.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardSet {
    /// Held shards, by index, with the fencing token of their term. A shard leaves the set the
    /// moment its loss token fires (lost, handed over, or shutdown), before it is released.
    pub held: BTreeMap<u32, u64>,
    /// Live candidates as this one sees them (itself included).
    pub members: usize,
    /// This candidate's fair share.
    pub quota: u32,
}
