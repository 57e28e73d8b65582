//! Rebalancing: the live candidates, this one's fair share of the shards, and which shards to
//! take or hand over (the pure plan is [`balance`]'s; the decision about one shard is the Lease
//! strategy's [`decide`]).

use std::time::Duration;

use tokio::time::Instant;
use tracing::info;

use super::{
    table::{Event, State},
    Engine,
};
use crate::{
    leadership::LossReason,
    lease::decide::{decide, decide_absent, Absent, Decision, Observed},
    shards::{balance, scheduler::Key},
};

// === impl Engine ===

impl Engine {
    /// The live candidates (this one included), sorted; schedules a look when one expires.
    fn live_members(&mut self, now: Instant) -> Vec<String> {
        let fallback = self.set.cfg.lease.lease_duration;
        // Another shard count: it does not share these shards (see `counts`).
        let others = self
            .members
            .iter()
            .filter(|(name, _)| !self.is_foreign(name))
            .map(|(_, obs)| obs);
        let (live, soonest) = live_members(&self.set.identity, others, now, fallback);
        if let Some(t) = soonest {
            self.io.wake_at(t, Key::Rebalance);
        }
        live
    }

    /// What this candidate would do about shard `index` now, if it wanted it.
    fn decision(&mut self, index: u32, now: Instant) -> Decision {
        let fallback = self.set.cfg.lease.lease_duration;
        let slot = &mut self.slots[index as usize];
        let known = Known {
            observed: slot.observed.as_ref(),
            deleted: slot.deleted.as_ref(),
            seen: slot.seen,
            foreign_self: slot.foreign_self,
        };
        shard_decision(known, &mut slot.absent_since, &self.set.identity, now, fallback)
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
        for (i, slot) in self.slots.iter().enumerate() {
            let i = i as u32;
            let term = slot
                .tenure
                .term()
                .map(|t| (t.state(), t.orphaned_from(grace).is_some()));
            let (is_active, is_holding) = tally(term, self.io.busy(Key::Shard(i)));
            if is_active {
                active.push(i);
            }
            if is_holding {
                holding.push(i);
            }
        }
        (active, holding)
    }

    /// The shards that could be taken now; schedules a look when the next one could be. A
    /// shard whose term is lost while its `Leadership` is still kept counts once the work on it had
    /// the time to stop (see `Held::orphaned_from`); it is then waited out as any holder's.
    pub(super) fn free(&mut self, now: Instant) -> Vec<u32> {
        let grace = self.set.stop_grace();
        let mut free = Vec::new();
        let mut soonest: Option<Instant> = None;
        for i in 0..self.set.count {
            let slot = &self.slots[i as usize];
            let busy = self.io.busy(Key::Shard(i));
            let orphaned = slot.tenure.term().map(|t| t.orphaned_from(grace));
            let not_before = slot.tenure.not_before();
            match availability(busy, orphaned, not_before, now, || self.decision(i, now)) {
                Free::Now => free.push(i),
                Free::From(t) => soonest = Some(soonest.map_or(t, |s| s.min(t))),
                Free::Not => {}
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

// === the pure parts (also driven by the model checker, `src/model/shards.rs`) ===

/// The live candidates: `identity` and every holder of a membership Lease in `others` that has
/// not expired at `now` (sorted, deduplicated); and the soonest of their expiries.
pub(crate) fn live_members<'a>(
    identity: &str,
    others: impl IntoIterator<Item = &'a Observed>,
    now: Instant,
    fallback: Duration,
) -> (Vec<String>, Option<Instant>) {
    let mut live = vec![identity.to_string()];
    let mut soonest: Option<Instant> = None;
    for obs in others {
        let Some(holder) = obs.record.holder.as_ref() else {
            continue;
        };
        let expiry = obs.expires_at(fallback);
        if now < expiry {
            live.push(holder.clone());
            soonest = Some(soonest.map_or(expiry, |s| s.min(expiry)));
        }
    }
    live.sort();
    live.dedup();
    (live, soonest)
}

/// What the engine knows of one shard's Lease, for its decision.
pub(crate) struct Known<'a> {
    /// The Lease as last seen.
    pub(crate) observed: Option<&'a Observed>,
    /// Absent now: what was seen before it was deleted.
    pub(crate) deleted: Option<&'a Observed>,
    /// It was seen (present or absent) before.
    pub(crate) seen: bool,
    /// The observed record names this identity but another process wrote it.
    pub(crate) foreign_self: bool,
}

/// What `identity` would do about a shard it knows as `known` at `now`, if it wanted it;
/// `absent_since` is when it was found missing (set now if it is unknown).
pub(crate) fn shard_decision(
    known: Known<'_>,
    absent_since: &mut Option<Instant>,
    identity: &str,
    now: Instant,
    fallback: Duration,
) -> Decision {
    // A record naming this identity but written by another process is not ours.
    let me: &str = if known.foreign_self { "" } else { identity };
    match (known.observed, known.deleted) {
        (Some(obs), _) => {
            let d = decide(Some(obs), me, now, fallback);
            match (d, obs.record.holder.as_deref()) {
                // `decide` with an empty identity takes an empty holder for ours.
                (Decision::Renew, Some(_)) if me.is_empty() => obs.take_once_expired(now, fallback),
                (d, _) => d,
            }
        }
        (None, Some(deleted)) => decide_absent(Absent::Deleted(deleted), identity, now, fallback),
        (None, None) if known.seen => {
            let since = *absent_since.get_or_insert(now);
            decide_absent(Absent::Unknown { since }, identity, now, fallback)
        }
        (None, None) => Decision::Create,
    }
}

/// Whether a shard may be taken now (see [`availability`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Free {
    /// Now.
    Now,
    /// Not before this instant (a look is scheduled then).
    From(Instant),
    /// Not: a call on it is in flight, or a term of it is held, handed over or released.
    Not,
}

/// Whether a shard may be taken at `now`: `busy` (a call on it in flight), its term's
/// `orphaned` bound (`None`: no term; `Some(None)`: a term that guards it), its hold-off
/// `not_before`, and else the `decision` about it.
pub(crate) fn availability(
    busy: bool,
    orphaned: Option<Option<Instant>>,
    not_before: Option<Instant>,
    now: Instant,
    decision: impl FnOnce() -> Decision,
) -> Free {
    if busy {
        return Free::Not;
    }
    match orphaned {
        // Held, handed over, being released, or lost with its work stopped.
        Some(None) => return Free::Not,
        Some(Some(from)) if from > now => return Free::From(from),
        Some(Some(_)) | None => {}
    }
    if let Some(nb) = not_before.filter(|t| *t > now) {
        return Free::From(nb);
    }
    match decision() {
        Decision::WaitUntil(t) => Free::From(t),
        _ => Free::Now,
    }
}

/// Whether a shard counts as held and active, and as held or being acquired: its term's state
/// and whether it is an orphan (lost, its work going on), if it has one, and `busy` (a call on
/// it in flight: a lost term's shard may be being taken again).
pub(crate) fn tally(term: Option<(State, bool)>, busy: bool) -> (bool, bool) {
    match term {
        Some((State::Active, _)) => (true, true),
        Some((_, true)) if busy => (false, true),
        None if busy => (false, true),
        _ => (false, false),
    }
}
