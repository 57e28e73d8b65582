//! Rebalancing: the live candidates, this one's fair share of the shards, and which shards to
//! take or hand over (the pure plan is [`balance`]'s; the decision about one shard is the Lease
//! strategy's [`decide`]).

use tokio::time::Instant;
use tracing::info;

use super::{
    table::{Event, State},
    Engine,
};
use crate::{
    leadership::LossReason,
    lease::decide::{decide, decide_absent, Absent, Decision},
    shards::{balance, scheduler::Key},
};

// === impl Engine ===

impl Engine {
    /// The live candidates (this one included), sorted; schedules a look when one expires.
    fn live_members(&mut self, now: Instant) -> Vec<String> {
        let fallback = self.set.cfg.lease.lease_duration;
        let mut live = vec![self.set.identity.clone()];
        let mut soonest: Option<Instant> = None;
        for (name, obs) in &self.members {
            if self.is_foreign(name) {
                // Another shard count: it does not share these shards (see `counts`).
                continue;
            }
            let Some(holder) = obs.record.holder.as_ref() else {
                continue;
            };
            let expiry = obs.expires_at(fallback);
            if now < expiry {
                live.push(holder.clone());
                soonest = Some(soonest.map_or(expiry, |s| s.min(expiry)));
            }
        }
        if let Some(t) = soonest {
            self.io.wake_at(t, Key::Rebalance);
        }
        live.sort();
        live.dedup();
        live
    }

    /// What this candidate would do about shard `index` now, if it wanted it.
    fn decision(&mut self, index: u32, now: Instant) -> Decision {
        let fallback = self.set.cfg.lease.lease_duration;
        let slot = &mut self.slots[index as usize];
        // A record naming this identity but written by another process is not ours.
        let identity: &str = if slot.foreign_self { "" } else { &self.set.identity };
        match (&slot.observed, &slot.deleted) {
            (Some(obs), _) => {
                let d = decide(Some(obs), identity, now, fallback);
                match (d, obs.record.holder.as_deref()) {
                    // `decide` with an empty identity takes an empty holder for ours.
                    (Decision::Renew, Some(_)) if identity.is_empty() => obs.take_once_expired(now, fallback),
                    (d, _) => d,
                }
            }
            (None, Some(deleted)) => {
                decide_absent(Absent::Deleted(deleted), &self.set.identity, now, fallback)
            }
            (None, None) if slot.seen => {
                let since = *slot.absent_since.get_or_insert(now);
                decide_absent(Absent::Unknown { since }, &self.set.identity, now, fallback)
            }
            (None, None) => Decision::Create,
        }
    }

    /// Recomputes the fair share; hands over the surplus and takes free shards up to it.
    pub(super) fn rebalance(&mut self, now: Instant) {
        self.replanning();
        if !self.machine.campaign().campaigning() || self.failed() {
            return;
        }
        let count_unsure = self.judge_counts(now);
        if self.failed() {
            return;
        }
        let quota = self.fair_share(now);
        let (active, holding) = self.holding();
        let ready = self.machine.campaign().acquiring(now) && !count_unsure;
        let free = if holding.len() < quota as usize && ready {
            self.free(now)
        } else {
            Vec::new()
        };
        let plan = balance::plan(&self.set.identity, quota, &holding, &free);
        for index in plan.release {
            if active.contains(&index) {
                self.hand_over(index, now);
            }
        }
        self.take(plan.acquire, now);
    }

    /// This candidate's fair share among the live candidates, published when it changes.
    fn fair_share(&mut self, now: Instant) -> u32 {
        let members = self.live_members(now);
        let quota = balance::quota(self.set.count, &members, &self.set.identity);
        if (quota, members.len()) != self.io.share() {
            info!(members = members.len(), quota, "fair share");
            self.publish_share((quota, members.len()));
        }
        quota
    }

    /// The shards held and active, and those held or being acquired (a lost term's shard
    /// with a call in flight may be being taken again).
    pub(super) fn holding(&self) -> (Vec<u32>, Vec<u32>) {
        let grace = self.set.stop_grace();
        let mut active = Vec::new();
        let mut holding = Vec::new();
        let busy = |i: u32| self.io.busy(Key::Shard(i));
        for (i, slot) in self.slots.iter().enumerate() {
            let i = i as u32;
            match slot.tenure.term() {
                Some(t) if t.state() == State::Active => {
                    active.push(i);
                    holding.push(i);
                }
                Some(t) if busy(i) && t.orphaned_from(grace).is_some() => holding.push(i),
                None if busy(i) => holding.push(i),
                _ => {}
            }
        }
        (active, holding)
    }

    /// The shards that could be taken now; schedules a look when the next one could be. A
    /// shard whose term is lost while its `Shard` is still kept counts once the work on it had
    /// the time to stop (see `Held::orphaned_from`); it is then waited out as any holder's.
    pub(super) fn free(&mut self, now: Instant) -> Vec<u32> {
        let grace = self.set.stop_grace();
        let mut free = Vec::new();
        let mut soonest: Option<Instant> = None;
        for i in 0..self.set.count {
            let slot = &self.slots[i as usize];
            if self.io.busy(Key::Shard(i)) {
                continue;
            }
            match slot.tenure.term().map(|t| t.orphaned_from(grace)) {
                // Held, handed over, being released, or lost with its work stopped.
                Some(None) => continue,
                Some(Some(from)) if from > now => {
                    soonest = Some(soonest.map_or(from, |s| s.min(from)));
                    continue;
                }
                Some(Some(_)) | None => {}
            }
            if let Some(nb) = slot.tenure.not_before().filter(|t| *t > now) {
                soonest = Some(soonest.map_or(nb, |s| s.min(nb)));
                continue;
            }
            match self.decision(i, now) {
                Decision::WaitUntil(t) => soonest = Some(soonest.map_or(t, |s| s.min(t))),
                _ => free.push(i),
            }
        }
        if let Some(t) = soonest {
            self.io.wake_at(t, Key::Rebalance);
        }
        free
    }

    /// Hands active shard `index` over: its work stops, then it is released.
    fn hand_over(&mut self, index: u32, now: Instant) {
        let until = now + self.set.cfg.handover_grace;
        if let Some(t) = self.slots[index as usize].tenure.term() {
            info!(shard = index, "handing the shard over");
            t.keeper.lose(LossReason::Rebalanced);
            self.apply(index, Event::Leave { until, release: true }, now);
            self.io.wake_at(until, Key::Shard(index));
            self.after_done(index, now);
        }
        self.publish();
    }

    /// Acquires the shards of `plan`, unless the API server asks for a pause, while calls
    /// are free.
    fn take(&mut self, plan: Vec<u32>, now: Instant) {
        if plan.is_empty() {
            return;
        }
        if let Some(until) = self.io.throttle.paused_until(now) {
            self.io.wake_at(until, Key::Rebalance);
            return;
        }
        for index in plan {
            if self.io.in_flight() >= self.set.cfg.max_in_flight {
                // Renewals first; the rest when calls come back.
                self.replan();
                break;
            }
            let d = self.decision(index, now);
            if !matches!(d, Decision::WaitUntil(_)) {
                self.acquire(index, d);
            }
        }
    }
}
