//! The engine's I/O edge: the API, the calls in flight and the writes waiting for a free one,
//! the wake-ups, the process-wide pause, and the channels to the user (the shards handed out,
//! the set held) and from the shards' guards (their work stopped).
//!
//! The edge also knows which keys (a shard, the membership Lease) have a call in flight
//! ([`busy`](Io::busy)): a key is busy from the [`push`](Io::push) of its call until its reply
//! is handed out by [`input`](Io::input), before the engine handles it, whatever the engine then
//! does with it (a stale answer is ignored, but its call is over all the same). The engine
//! sends at most one call per key at a time: it asks `busy` before sending one, or sends the
//! next while handling the previous one's reply.

use std::{collections::BTreeSet, future::Future};

use futures::{
    future::BoxFuture,
    stream::{FuturesUnordered, StreamExt},
    FutureExt,
};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::{
    sync::{mpsc, watch},
    time::Instant,
};

use crate::{
    leadership::Leadership,
    shards::{
        assignments::ShardSet,
        engine::answers::Reply,
        scheduler::{Key, Throttle, Timers},
    },
};

/// The engine's I/O edge (see the [module](self)).
pub(super) struct Io {
    /// The set's Leases.
    pub(super) api: Api<Lease>,
    /// The calls in flight, each with the key it is for.
    calls: FuturesUnordered<BoxFuture<'static, (Key, Reply)>>,
    /// The keys of the calls in flight.
    busy: BTreeSet<Key>,
    /// Writes waiting for a free call: (class, deadline, key). Renewals (class 0) by deadline
    /// first, then releases (1).
    queue: BTreeSet<(u8, Instant, Key)>,
    /// The pause after the API server said it is overloaded.
    pub(super) throttle: Throttle,
    timers: Timers,
    out: mpsc::UnboundedSender<(u32, Leadership)>,
    held_tx: watch::Sender<ShardSet>,
    done_tx: mpsc::UnboundedSender<(u32, u64)>,
    done_rx: mpsc::UnboundedReceiver<(u32, u64)>,
}

/// What comes in through the edge besides the watch and the timers.
// One a turn of the loop, taken apart at once: boxing the answer would cost an allocation each.
#[allow(clippy::large_enum_variant)]
pub(super) enum Input {
    /// An API call returned.
    Reply(Reply),
    /// The work on a shard's term (shard, generation) stopped.
    Done(u32, u64),
}

// === impl Io ===

impl Io {
    /// The edge over `api`, handing shards to `out` and publishing the set held to `held_tx`.
    pub(super) fn new(
        api: Api<Lease>,
        throttle: Throttle,
        out: mpsc::UnboundedSender<(u32, Leadership)>,
        held_tx: watch::Sender<ShardSet>,
    ) -> Self {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Self {
            api,
            calls: FuturesUnordered::new(),
            busy: BTreeSet::new(),
            queue: BTreeSet::new(),
            throttle,
            timers: Timers::default(),
            out,
            held_tx,
            done_tx,
            done_rx,
        }
    }

    /// The next answer or end of work (never ends: the edge keeps a sender of its own). The
    /// key of an answer is idle from now on.
    pub(super) async fn input(&mut self) -> Input {
        tokio::select! {
            Some((key, reply)) = self.calls.next(), if !self.calls.is_empty() => {
                self.busy.remove(&key);
                Input::Reply(reply)
            }
            Some((index, gen)) = self.done_rx.recv() => Input::Done(index, gen),
            else => std::future::pending().await,
        }
    }

    /// How many calls are in flight.
    pub(super) fn in_flight(&self) -> usize {
        self.calls.len()
    }

    /// Whether a call for `key` is in flight (its reply not handed out yet).
    pub(super) fn busy(&self, key: Key) -> bool {
        self.busy.contains(&key)
    }

    /// Starts an API call for `key`; its answer comes back through [`input`](Self::input), and
    /// `key` is [`busy`](Self::busy) until then.
    pub(super) fn push(&mut self, key: Key, fut: impl Future<Output = Reply> + Send + 'static) {
        self.busy.insert(key);
        self.calls.push(fut.map(move |reply| (key, reply)).boxed());
    }

    /// Queues a renewal of `key`, whose renew deadline is `deadline`.
    pub(super) fn queue_renewal(&mut self, deadline: Instant, key: Key) {
        self.queue.insert((0, deadline, key));
    }

    /// Queues the release of `key`, wanted from `now`.
    pub(super) fn queue_release(&mut self, now: Instant, key: Key) {
        self.queue.insert((1, now, key));
    }

    /// The next queued write, if fewer than `max` calls are in flight.
    pub(super) fn next_write(&mut self, max: usize) -> Option<Key> {
        if self.in_flight() >= max {
            return None;
        }
        self.queue.pop_first().map(|(_, _, key)| key)
    }

    /// Wakes the engine up for `key` at `when`.
    pub(super) fn wake_at(&mut self, when: Instant, key: Key) {
        self.timers.at(when, key);
    }

    /// The earliest wake-up.
    pub(super) fn next_wake(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// Removes and returns every key due at `now`, each once.
    pub(super) fn due(&mut self, now: Instant) -> Vec<Key> {
        self.timers.due(now)
    }

    /// A sender for the guards of the terms to tell that their work stopped.
    pub(super) fn done_sender(&self) -> mpsc::UnboundedSender<(u32, u64)> {
        self.done_tx.clone()
    }

    /// Hands a shard to the user; `false` if nobody takes the shards any more.
    pub(super) fn hand_out(&self, index: u32, leadership: Leadership) -> bool {
        self.out.send((index, leadership)).is_ok()
    }

    /// Whether nobody takes the shards any more (the `Assignments` were dropped).
    pub(super) fn abandoned(&self) -> bool {
        self.out.is_closed()
    }

    /// The fair share and the live candidates last published (before the first count: none
    /// and this candidate).
    pub(super) fn share(&self) -> (u32, usize) {
        let cur = self.held_tx.borrow();
        (cur.quota, cur.members.max(1))
    }

    /// Publishes `set` if it changed (see [`Assignments::held`](crate::shards::Assignments::held)).
    pub(super) fn publish(&self, set: ShardSet) {
        self.held_tx.send_if_modified(|cur| {
            if *cur == set {
                return false;
            }
            *cur = set;
            true
        });
    }
}
