//! The schedule: timers (renewals, renew deadlines, handover graces, rebalancing) and the
//! queue of writes waiting for one of the bounded calls in flight.

use tokio::time::Instant;
use tracing::warn;

use super::{
    table::{Event, State},
    Engine,
};
use crate::{
    lease::term::Step,
    shards::scheduler::{hold_back, urgent_from, Key},
};

// === impl Engine ===

impl Engine {
    /// A timer fired.
    pub(super) fn on_timer(&mut self, key: Key, now: Instant) {
        match key {
            Key::Rebalance => self.replan(),
            Key::Member => self.member_due(now),
            Key::Shard(index) => self.shard_due(index, now),
        }
    }

    /// Shard `index`'s timer: its renew deadline, the end of its handover grace, or its next
    /// renewal, queued unless the API server asks for a pause.
    fn shard_due(&mut self, index: u32, now: Instant) {
        let renew = self.set.renew_deadline();
        let slot = &self.slots[index as usize];
        let Some(t) = slot.tenure.term() else {
            self.replan();
            return;
        };
        if !t.live() {
            return;
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
        if let State::Leaving { until, .. } = t.state() {
            if now >= until {
                warn!(
                    shard = index,
                    "the work on the shard did not stop in time; not releasing it, its lease will expire"
                );
                self.apply(index, Event::GraceOver, now);
                self.finish_term(index, now);
                return;
            }
        }
        if self.io.busy(Key::Shard(index)) || now < t.term.next_renewal() {
            return;
        }
        // Urgent, and sent whatever the pause, from half the renew deadline on.
        let urgent = urgent_from(t.term.last_sent(), renew);
        match hold_back(now, &self.io.throttle, urgent) {
            Some(later) => self.io.wake_at(later, Key::Shard(index)),
            None => {
                let deadline = t.term.confirmed_until();
                self.io.queue_renewal(deadline, Key::Shard(index));
            }
        }
    }

    /// The membership Lease's timer: its renewal is queued.
    fn member_due(&mut self, now: Instant) {
        if self.io.busy(Key::Member) || !self.machine.campaign().campaigning() {
            return;
        }
        let due = self.member.pace.next().unwrap_or(now);
        if now < due {
            self.io.wake_at(due, Key::Member);
            return;
        }
        let deadline = self
            .member
            .pace
            .last_sent()
            .map_or(now, |sent| sent + self.set.renew_deadline());
        self.io.queue_renewal(deadline, Key::Member);
    }

    /// Starts queued writes while calls are free.
    pub(super) fn dispatch(&mut self, now: Instant) {
        while let Some(key) = self.io.next_write(self.set.cfg.max_in_flight) {
            match key {
                Key::Member => self.write_member(),
                Key::Shard(index) => self.write_shard(index, now),
                Key::Rebalance => {}
            }
        }
    }
}
