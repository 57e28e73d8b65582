//! Handover: the end of a term. A held shard is lost (its renew deadline passed, another holder
//! wrote it, it was deleted), handed over (rebalancing), given up (its `Shard` dropped) or handed
//! back on shutdown; it is released once its work has stopped, and only then taken again, but
//! for a shard lost outright whose `Shard` is still kept once its work had the time to stop:
//! that term guards nothing, and the shard is taken again as any other holder's would be (see
//! `Held::orphaned_from`).

use tokio::time::Instant;
use tracing::{debug, info};

use super::{Engine, State};
use crate::{leadership::LossReason, shards::scheduler::Key};

// === impl Engine ===

impl Engine {
    /// Begins handing every shard back: each is lost now and released once its work stops.
    pub(super) fn stop(&mut self, now: Instant, reason: LossReason) {
        self.stopping = true;
        let grace = self.cfg.lease.shutdown_grace;
        let release = self.cfg.lease.release_on_cancel;
        for index in 0..self.count {
            let slot = &mut self.slots[index as usize];
            if let Some(t) = slot.term.as_mut() {
                if t.state == State::Active {
                    t.keeper.lose(reason.clone());
                    t.state = State::Leaving {
                        until: now + grace,
                        release,
                    };
                    self.timers.at(now + grace, Key::Shard(index));
                    if t.done {
                        self.after_done(index, now);
                    }
                }
            }
        }
        self.publish();
    }

    /// Shard `index` is not ours any more: its loss token fires, renewals stop.
    pub(super) fn lose(&mut self, index: u32, reason: LossReason, now: Instant) {
        let Some(t) = self.slots[index as usize].term.as_mut() else {
            return;
        };
        if !matches!(t.state, State::Active | State::Leaving { .. }) {
            return;
        }
        info!(shard = index, %reason, "lost shard");
        t.keeper.lose(reason);
        t.state = State::Gone;
        t.lost_at = Some(now);
        self.dirty = true;
        if t.done {
            self.finish_term(index);
        }
        self.publish();
    }

    /// The `Shard` of `index` (generation `gen`) was dropped: the work on it has stopped.
    pub(super) fn on_done(&mut self, index: u32, gen: u64, now: Instant) {
        let Some(t) = self.slots[index as usize].term.as_mut().filter(|t| t.gen == gen) else {
            return;
        };
        t.done = true;
        if t.state == State::Active {
            // Given up by the user: like `Leadership::release`, a lease is released.
            t.keeper.lose(LossReason::Released);
            t.state = State::Leaving {
                until: now + self.cfg.lease.shutdown_grace,
                release: true,
            };
            self.publish();
        }
        self.after_done(index, now);
    }

    /// Goes on with a term whose work has stopped: releases it if it is to be released and
    /// still can be, or ends it.
    pub(super) fn after_done(&mut self, index: u32, now: Instant) {
        let slot = &mut self.slots[index as usize];
        let Some(t) = slot.term.as_mut() else {
            return;
        };
        match t.state {
            State::Leaving { release: true, .. } if t.term.may_release(now, None) => {
                t.state = State::Releasing;
                self.queue.insert((1, now, Key::Shard(index)));
            }
            State::Leaving { release, .. } => {
                if release {
                    debug!(
                        shard = index,
                        "could not release the shard: its renew deadline passed; it will expire"
                    );
                }
                t.state = State::Gone;
                self.finish_term(index);
            }
            State::Gone => self.finish_term(index),
            State::Active | State::Releasing => {}
        }
    }

    /// Ends the term of `index` once it is not ours and its work has stopped: `release()`
    /// returns, and the shard may be taken again. (A lost term whose work does not stop in
    /// time ends when a new term of the shard begins; its `release()` returns then.)
    pub(super) fn finish_term(&mut self, index: u32) {
        let slot = &mut self.slots[index as usize];
        let Some(t) = slot.term.as_mut() else {
            return;
        };
        if t.state != State::Gone || !t.done || slot.busy {
            return;
        }
        if let Some(tx) = t.released.take() {
            let _ = tx.send(());
        }
        slot.term = None;
        self.dirty = true;
    }
}
