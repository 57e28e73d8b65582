//! What a running candidate hands out: the [`Assignments`] stream of acquired shards, each a
//! [`Shard`], and the [`ShardSet`] held now.

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
    rx: mpsc::UnboundedReceiver<Shard>,
    held: watch::Receiver<ShardSet>,
    task: Option<tokio::task::JoinHandle<Result<()>>>,
}

// === impl Assignments ===

impl Assignments {
    pub(super) fn new(
        rx: mpsc::UnboundedReceiver<Shard>,
        held: watch::Receiver<ShardSet>,
        task: tokio::task::JoinHandle<Result<()>>,
    ) -> Self {
        Self {
            rx,
            held,
            task: Some(task),
        }
    }

    /// The next shard acquired; `None` once the candidate has stopped (after shutdown, or an
    /// error: see [`finish`](Self::finish)).
    ///
    /// A shard lost between its acquisition and this call is still returned, its loss token
    /// already cancelled, so that the consumer sees the loss: drop it. Shards come in the order
    /// they were acquired; a shard lost and taken again comes again as a new [`Shard`] (a new
    /// fencing token) while the old one may still be kept: keep shards keyed by index and let
    /// the new one replace the old, or watch each one's [`lost_token`](Leadership::lost_token). The
    /// [`held`](Self::held) set alone cannot tell a consumer of every loss: a shard acquired
    /// and lost between two looks at it never appears there.
    ///
    /// # Cancellation safety
    /// Cancel-safe: a shard acquired meanwhile is returned by the next call.
    pub async fn next(&mut self) -> Option<Shard> {
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

/// One held shard: a [`Leadership`] of the Lease `<name>-<index>`.
///
/// Dropping it (or [`release`](Self::release)) tells the candidate that the work on this shard
/// has stopped: a shard that was handed over, or given up on shutdown, is released then.
///
/// Once its loss token has fired, a `Shard` guards nothing. A shard handed over or given up on
/// shutdown is renewed until its `Shard` is dropped, for at most the handover grace or the
/// shutdown grace. A shard lost outright (its renew deadline passed, another holder wrote it,
/// it was deleted), or not dropped within that grace, is not waited for forever: while its
/// `Shard` is still kept, this candidate does not take that shard again for the lease duration
/// minus the renew deadline from then (the time its work has to stop, as for any Lease
/// leader), and after that only once its lease has expired as this candidate last saw it, when
/// any other candidate may take it too. It comes then as a new `Shard`, and the old one's
/// `release` returns. So a consumer that never saw the loss cannot keep the shard from being
/// taken again; drop a lost `Shard` as soon as its work has stopped.
#[derive(Debug)]
#[must_use = "dropping a Shard gives it up at once"]
pub struct Shard {
    index: u32,
    leadership: Leadership,
}

// === impl Shard ===

impl Shard {
    pub(super) fn new(index: u32, leadership: Leadership) -> Self {
        Self { index, leadership }
    }

    /// The shard's index, `0..count`.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The leadership of this shard's Lease.
    pub fn leadership(&self) -> &Leadership {
        &self.leadership
    }

    /// The leadership of this shard's Lease, to keep instead of the `Shard`.
    pub fn into_leadership(self) -> Leadership {
        self.leadership
    }

    /// Gives the shard up and waits until it is released (or found not to be ours any more).
    ///
    /// # Cancellation safety
    /// Once called, the release goes on in the background even if the future is dropped.
    pub async fn release(self) -> Result<()> {
        self.leadership.release().await
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
