//! Handover: the end of a term. A held shard is lost (its renew deadline passed, another holder
//! wrote it, it was deleted), handed over (rebalancing), given up (its `Leadership` dropped) or handed
//! back on shutdown; it is released once its work has stopped, and only then taken again, but
//! for a shard lost outright whose `Leadership` is still kept once its work had the time to stop:
//! that term guards nothing, and the shard is taken again as any other holder's would be (see
//! `Held::orphaned_from`). The states and their order are the [`table`](super::table)'s.

use tokio::time::Instant;
use tracing::{debug, info};

use super::{
    table::{Campaign, Event, State},
    Engine,
};
use crate::{leadership::LossReason, shards::scheduler::Key};

// === impl Engine ===

impl Engine {
    /// Begins handing every shard back: each is lost now and released once its work stops.
    pub(super) fn stop(&mut self, now: Instant, reason: LossReason) {
        self.campaign_to(Campaign::Stopping);
        let until = now + self.set.cfg.lease.shutdown_grace;
        let release = self.set.cfg.lease.release_on_cancel;
        for index in 0..self.set.count {
            let Some(t) = self.slots[index as usize].tenure.term() else {
                continue;
            };
            if t.state() != State::Active {
                continue;
            }
            t.keeper.lose(reason.clone());
            self.apply(index, Event::Leave { until, release }, now);
            self.io.wake_at(until, Key::Shard(index));
            self.after_done(index, now);
        }
        self.publish();
    }

    /// Shard `index` is not ours any more: its loss token fires, renewals stop.
    pub(super) fn lose(&mut self, index: u32, reason: LossReason, now: Instant) {
        let Some(t) = self.slots[index as usize].tenure.term().filter(|t| t.live()) else {
            return;
        };
        info!(shard = index, %reason, "lost shard");
        t.keeper.lose(reason);
        self.apply(index, Event::Lost, now);
        self.replan();
        self.finish_term(index, now);
        self.publish();
    }

    /// The `Leadership` of shard `index` (generation `gen`) was dropped: the work on it has stopped.
    pub(super) fn on_done(&mut self, index: u32, gen: u64, now: Instant) {
        let Some(t) = self.slots[index as usize].tenure.term().filter(|t| t.gen == gen) else {
            return;
        };
        let active = t.state() == State::Active;
        if active {
            // Given up by the user: like `Leadership::release`, a lease is released.
            t.keeper.lose(LossReason::Released);
        }
        self.apply(index, Event::Done, now);
        if active {
            let until = now + self.set.cfg.lease.shutdown_grace;
            self.apply(index, Event::Leave { until, release: true }, now);
            self.publish();
        }
        self.after_done(index, now);
    }

    /// Goes on with a term whose work has stopped: releases it if it is to be released and
    /// still can be (before its renew deadline), or ends it.
    pub(super) fn after_done(&mut self, index: u32, now: Instant) {
        let Some(t) = self.slots[index as usize].tenure.term().filter(|t| t.done()) else {
            return;
        };
        match t.state() {
            State::Leaving { release: true, .. } if t.term.may_release(now, None) => {
                self.apply(index, Event::Release, now);
                self.io.queue_release(now, Key::Shard(index));
            }
            State::Leaving { release, .. } => {
                if release {
                    debug!(
                        shard = index,
                        "could not release the shard: its renew deadline passed; it will expire"
                    );
                }
                self.apply(index, Event::Abandon, now);
                self.finish_term(index, now);
            }
            State::Gone => self.finish_term(index, now),
            State::Active | State::Releasing => {}
        }
    }

    /// Ends the term of `index` once it is not ours, its work has stopped and no call on it is
    /// in flight: `release()` returns, and the shard may be taken again. (A lost term whose
    /// work does not stop in time ends when a new term of the shard begins; its `release()`
    /// returns then.)
    pub(super) fn finish_term(&mut self, index: u32, now: Instant) {
        self.apply(index, Event::Finish, now);
    }
}
