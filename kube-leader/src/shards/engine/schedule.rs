//! The schedule: timers (renewals, renew deadlines, handover graces, rebalancing) and the
//! queue of writes waiting for one of the bounded calls in flight.

use std::future::Future;

use futures::FutureExt;
use tokio::time::Instant;
use tracing::warn;

use super::{Engine, Reply, State};
use crate::{
    lease::term::Step,
    shards::scheduler::{hold_back, Key},
};

// === impl Engine ===

impl Engine {
    /// A timer fired.
    pub(super) fn on_timer(&mut self, key: Key, now: Instant) {
        match key {
            Key::Rebalance => self.dirty = true,
            Key::Member => self.member_due(now),
            Key::Shard(index) => self.shard_due(index, now),
        }
    }

    /// Shard `index`'s timer: its renew deadline, the end of its handover grace, or its next
    /// renewal, queued unless the API server asks for a pause.
    fn shard_due(&mut self, index: u32, now: Instant) {
        let renew = self.renew_deadline();
        let slot = &mut self.slots[index as usize];
        let Some(t) = slot.term.as_mut() else {
            self.dirty = true;
            return;
        };
        match t.state {
            State::Active | State::Leaving { .. } => {}
            State::Releasing | State::Gone => return,
        }
        if let Step::End(reason) = t.term.deadline_reached(now) {
            warn!(
                shard = index,
                %reason,
                "renew deadline passed; stopping work on the shard"
            );
            self.lose(index, reason, now);
            return;
        }
        if let State::Leaving { until, .. } = t.state {
            if now >= until {
                warn!(
                    shard = index,
                    "the work on the shard did not stop in time; not releasing it, its lease will expire"
                );
                t.state = State::Gone;
                t.lost_at = Some(now);
                if t.done {
                    self.finish_term(index);
                }
                return;
            }
        }
        if slot.busy || now < t.term.next_renewal() {
            return;
        }
        // Urgent, and sent whatever the pause, from half the renew deadline on.
        let urgent = t.term.last_sent() + renew / 2;
        match hold_back(now, &self.throttle, urgent) {
            Some(later) => self.timers.at(later, Key::Shard(index)),
            None => {
                let deadline = t.term.confirmed_until();
                self.queue.insert((0, deadline, Key::Shard(index)));
            }
        }
    }

    /// The membership Lease's timer: its renewal is queued.
    fn member_due(&mut self, now: Instant) {
        if self.member.busy || self.stopping || !self.synced {
            return;
        }
        let due = self.member.next.unwrap_or(now);
        if now < due {
            self.timers.at(due, Key::Member);
            return;
        }
        let deadline = self
            .member
            .renewal
            .as_ref()
            .map_or(now, |r| r.deadline(self.renew_deadline()));
        self.queue.insert((0, deadline, Key::Member));
    }

    /// Starts queued writes while calls are free.
    pub(super) fn dispatch(&mut self, now: Instant) {
        while self.in_flight < self.cfg.max_in_flight {
            let Some((_, _, key)) = self.queue.pop_first() else {
                break;
            };
            match key {
                Key::Member => self.write_member(),
                Key::Shard(index) => self.write_shard(index, now),
                Key::Rebalance => {}
            }
        }
    }

    /// Starts an API call; its answer comes back to the loop.
    pub(super) fn push(&mut self, fut: impl Future<Output = Reply> + Send + 'static) {
        self.in_flight += 1;
        self.calls.push(fut.boxed());
    }
}
