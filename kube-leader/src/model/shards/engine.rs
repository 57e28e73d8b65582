//! The engine of one replica, as `shards/engine/*` drives the shipped decisions: each
//! function names the engine's function it stands for.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};

use super::{identity, Flight, Life, Mutant, Settings, ShardsModel, Slot, Tm, Why, World};
use crate::{
    lease::{
        decide::{record_for, Decision, Observed},
        record::{set_fencing_token, set_writer, LeaseRecord, Owner},
        term::{Every, Step, Term, Writer},
    },
    lock,
    model::{at, tick, wall, Answer, Held, Obs, Rec, Req},
    shards::{
        balance::{plan, quota},
        engine::{
            rebalance::{availability, live_members, shard_decision, tally, Free, Known},
            table::{advance, orphaned_from, Event, Next, State},
        },
    },
};

impl ShardsModel {
    pub(crate) fn new(s: Settings) -> Self {
        Self { s }
    }

    /// `Engine::apply`: `event` at `now` to replica `i`'s term of shard `s`, by the table.
    fn apply(&self, w: &mut World, i: usize, s: u32, event: Event, now: i64) -> bool {
        let r = &mut w.reps[i];
        let busy = r.busy(s);
        let slot = &mut r.slots[s as usize];
        let Some(t) = slot.term.as_mut() else {
            return false;
        };
        if event == Event::Finish && busy {
            return false;
        }
        match advance(&mut t.state, &mut t.done, &mut t.lost_at, event, now) {
            None => return false,
            Some(Next::To(_)) => {}
            Some(Next::Over) => slot.term = None,
        }
        true
    }

    /// `Engine::lose`: the term of shard `s` is not ours any more.
    fn lose(&self, w: &mut World, i: usize, s: u32, now: i64) {
        let live = w.reps[i].slots[s as usize]
            .term
            .as_ref()
            .is_some_and(|t| matches!(t.state, State::Active | State::Leaving { .. }));
        if live {
            self.apply(w, i, s, Event::Lost, now);
            self.apply(w, i, s, Event::Finish, now);
        }
    }

    /// `Engine::after_done`: a term whose work stopped is released or ends.
    fn after_done(&self, w: &mut World, i: usize, s: u32, now: i64) {
        let Some(t) = w.reps[i].slots[s as usize].term.as_ref().filter(|t| t.done) else {
            return;
        };
        match t.state {
            State::Leaving { release: true, .. } if t.held.term.may_release(at(now), None) => {
                self.apply(w, i, s, Event::Release, now);
            }
            State::Leaving { .. } => {
                self.apply(w, i, s, Event::Abandon, now);
                self.apply(w, i, s, Event::Finish, now);
            }
            State::Gone => {
                self.apply(w, i, s, Event::Finish, now);
            }
            State::Active | State::Releasing => {}
        }
    }

    /// `Engine::stop`: every active shard is handed back once its work stops.
    pub(super) fn stop(&self, w: &mut World, i: usize) {
        let now = w.now(i);
        w.reps[i].stopping = true;
        let until = at(now + Settings::ticks(self.s.grace));
        for s in 0..self.s.shards {
            let active = w
                .slot(i, s)
                .term
                .as_ref()
                .is_some_and(|t| t.state == State::Active);
            if active {
                self.apply(w, i, s, Event::Leave { until, release: true }, now);
                self.after_done(w, i, s, now);
            }
        }
    }

    /// `Engine::on_done`: the work on shard `s` stopped.
    pub(super) fn on_done(&self, w: &mut World, i: usize, s: u32, now: i64) {
        let slot = &mut w.reps[i].slots[s as usize];
        if slot.zombie.take().is_some() {
            return;
        }
        let Some(t) = slot.term.as_ref() else { return };
        let active = t.state == State::Active;
        self.apply(w, i, s, Event::Done, now);
        if active {
            let until = at(now + Settings::ticks(self.s.grace));
            self.apply(w, i, s, Event::Leave { until, release: true }, now);
        }
        self.after_done(w, i, s, now);
    }

    /// `Engine::absorb_shard`: shard `s`'s Lease seen (watch, read, write).
    pub(super) fn absorb(&self, w: &mut World, i: usize, s: u32, rec: Rec, now: i64) {
        let lease = rec.to_lease();
        let record = LeaseRecord::from_lease(&lease);
        let r = &mut w.reps[i];
        let owner = Owner::of(&lease, &record, &identity(i), &r.instance(i));
        let slot = &mut r.slots[s as usize];
        if let Some(known) = &slot.lease {
            let newer = lock::is_newer(Some(&rec.rv.to_string()), Some(&known.rv.to_string()));
            if !newer && slot.observed.is_some() {
                return;
            }
        }
        let mut lost = false;
        if let Some(t) = slot.term.as_mut() {
            if matches!(t.state, State::Active | State::Leaving { .. }) {
                lost = matches!(t.held.term.watched(&lease), Step::End(_));
            }
        }
        let holder_changed = slot
            .observed
            .as_ref()
            .is_none_or(|o| o.0.record.holder != record.holder);
        let tr = record.transitions;
        slot.transitions_seen = Some(slot.transitions_seen.map_or(tr, |t| t.max(tr)));
        slot.foreign_self = owner == Owner::Twin;
        let prev = slot.observed.as_ref().map(|o| &o.0);
        let rv = lease.metadata.resource_version.clone();
        slot.observed = Some(Obs(Observed::update(prev, record, rv, at(now))));
        slot.lease = Some(rec);
        slot.deleted = None;
        slot.absent_since = None;
        slot.seen = true;
        if holder_changed {
            slot.not_before = None;
        }
        if lost {
            self.lose(w, i, s, now);
        }
    }

    /// `Engine::gone`: shard `s`'s Lease is gone (`unknown`: found missing by a re-list).
    pub(super) fn gone(&self, w: &mut World, i: usize, s: u32, now: i64, unknown: bool) {
        let slot = &mut w.reps[i].slots[s as usize];
        let last = slot.observed.take();
        slot.lease = None;
        slot.seen = true;
        slot.foreign_self = false;
        if unknown {
            slot.deleted = None;
            slot.absent_since = Some(now);
        } else {
            slot.deleted = last;
            slot.absent_since = None;
        }
        slot.not_before = None;
        self.lose(w, i, s, now);
    }

    /// `Engine::relisted`: a (re)list of the set as it is now.
    pub(super) fn relisted(&self, w: &mut World, i: usize, now: i64) {
        for s in 0..self.s.shards {
            match w.store[s as usize].clone() {
                Some(rec) => self.absorb(w, i, s, rec, now),
                None => {
                    let slot = &w.reps[i].slots[s as usize];
                    if slot.lease.is_some() && slot.observed.is_some() {
                        self.gone(w, i, s, now, true);
                    }
                }
            }
        }
    }

    /// `Engine::begin_term` (with `hold` and `begin`): the acquisition `written`, sent at
    /// `sent`, won.
    fn begin_term(&self, w: &mut World, i: usize, s: u32, written: Rec, sent: i64, now: i64) {
        let lease = written.to_lease();
        let record = LeaseRecord::from_lease(&lease);
        let rv = lease.metadata.resource_version.clone();
        let token = lock::fencing_token(rv.as_deref(), u64::from(record.transitions));
        let max = w.max_token[s as usize];
        if max.is_some_and(|m| token <= m) {
            w.token_regressed = true;
        }
        w.max_token[s as usize] = Some(max.map_or(token, |m| m.max(token)));
        w.terms = w.terms.saturating_add(1);
        let r = &mut w.reps[i];
        let writer = Writer {
            identity: identity(i),
            instance: r.instance(i),
            lease_duration_seconds: i32::try_from(self.s.lease).expect("small"),
            renew_deadline: Duration::from_secs(self.s.renew_deadline),
            yields_to_coordinated: false,
        };
        let every = Every::new(Duration::from_secs(self.s.retry), at(sent));
        let term = Term::new(writer, lease, record.clone(), token, at(sent), every);
        let slot = &mut r.slots[s as usize];
        slot.observed = Some(Obs(Observed::update(None, record.clone(), rv, at(sent))));
        let tr = record.transitions;
        slot.transitions_seen = Some(slot.transitions_seen.map_or(tr, |t| t.max(tr)));
        slot.lease = Some(written);
        slot.deleted = None;
        slot.absent_since = None;
        slot.seen = true;
        slot.foreign_self = false;
        let grace = Settings::ticks(self.s.lease.saturating_sub(self.s.renew_deadline));
        let stopping =
            |t: &Tm| !t.done && t.state == State::Gone && t.lost_at.is_some_and(|l| now < l + grace);
        if slot.term.as_ref().is_some_and(stopping) {
            w.taken_while_stopping = true;
        }
        let slot = &mut w.reps[i].slots[s as usize];
        if let Some(old) = slot.term.take().filter(|t| !t.done) {
            // A lost term still kept there is dropped: its work goes on until it stops.
            slot.zombie = Some(old.confirmed);
        }
        slot.term = Some(Tm {
            held: Held { term, lost: false },
            state: State::Active,
            done: false,
            lost_at: None,
            confirmed: sent + Settings::ticks(self.s.renew_deadline),
        });
        if w.reps[i].stopping {
            // Acquired while handing everything back: released at once.
            let until = at(now + Settings::ticks(self.s.grace));
            self.apply(w, i, s, Event::Leave { until, release: true }, now);
            self.apply(w, i, s, Event::Done, now);
            self.after_done(w, i, s, now);
        }
    }

    /// `Engine::acquire`: the call that takes shard `s` as `decision` says.
    fn acquire(&self, w: &mut World, i: usize, s: u32, decision: Decision, now: i64) {
        let real = w.real;
        let r = &mut w.reps[i];
        let instance = r.instance(i);
        let slot = &r.slots[s as usize];
        let observed = slot.observed.as_ref().map(|o| &o.0);
        let mut record = record_for(&decision, observed, &identity(i), self.s.fallback(), wall(real));
        let secs = i32::try_from(self.s.lease).expect("small");
        let (create, req) = match (&decision, &slot.lease) {
            (Decision::Create, _) | (_, None) => {
                record.transitions = slot.transitions_seen.map_or(0, |t| t + 1);
                let mut spec = LeaseSpec::default();
                record.write_to(&mut spec, secs);
                let mut lease = Lease {
                    spec: Some(spec),
                    ..Lease::default()
                };
                set_writer(&mut lease, &instance, &record);
                (true, Req::Create(Rec::from_lease(&lease)))
            }
            (_, Some(rec)) => {
                let mut lease = rec.to_lease();
                record.write_to(lease.spec.get_or_insert_with(LeaseSpec::default), secs);
                set_fencing_token(&mut lease, None);
                set_writer(&mut lease, &instance, &record);
                let lease = Rec::from_lease(&lease);
                let precondition = (self.s.mutant != Mutant::NoPrecondition).then_some(lease.rv);
                (false, Req::Replace { lease, precondition })
            }
        };
        r.flight = Some(Flight {
            shard: s,
            why: Why::Acquire(create),
            req,
            sent: now,
            answer: None,
        });
    }

    /// Replica `i` takes in the answer to its call (`Engine::on_reply`).
    pub(super) fn answered(&self, w: &mut World, i: usize) {
        let f = w.reps[i].flight.take().expect("a call");
        let answer = f.answer.expect("answered");
        let (s, now) = (f.shard, w.now(i));
        let retry = Settings::ticks(self.s.retry);
        match (f.why, answer) {
            (Why::Acquire(_), Answer::Ok(written)) => {
                if now >= f.sent + Settings::ticks(self.s.renew_deadline) {
                    // Answered after its renew deadline: no term (issue 16).
                    self.absorb(w, i, s, written, now);
                } else {
                    self.begin_term(w, i, s, written, f.sent, now);
                }
            }
            (Why::Acquire(true), Answer::Conflict) => {
                w.slot(i, s).not_before = Some(now + retry);
                self.read(w, i, s, now);
            }
            (Why::Acquire(_), _) => w.slot(i, s).not_before = Some(now + retry),
            (Why::Renew, answer) if w.slot(i, s).term.is_some() => {
                self.renewal_answered(w, i, s, f.sent, answer);
            }
            (Why::Renew, _) => {}
            (Why::Release, answer) => {
                if let Answer::Ok(written) = answer {
                    self.absorb(w, i, s, written, now);
                }
                self.apply(w, i, s, Event::Released, now);
                self.apply(w, i, s, Event::Finish, now);
            }
            (Why::Read, Answer::Ok(rec)) => self.absorb(w, i, s, rec, now),
            (Why::Read, Answer::NotFound) => {
                let unknown = w.slot(i, s).observed.is_none();
                self.gone(w, i, s, now, unknown);
            }
            (Why::Read, _) => {}
        }
        let gone = w.slot(i, s).term.as_ref().is_some_and(|t| t.state == State::Gone);
        if gone && !w.reps[i].busy(s) {
            self.apply(w, i, s, Event::Finish, now);
        }
    }

    /// `Engine::on_renewed`, `renewed` and `renewal_failed`.
    fn renewal_answered(&self, w: &mut World, i: usize, s: u32, sent: i64, answer: Answer) {
        let now = w.now(i);
        let written = match answer {
            Answer::Ok(written) => written,
            Answer::NotFound => return self.gone(w, i, s, now, false),
            failed => {
                let t = w.slot(i, s).term.as_mut().expect("a term");
                match t.held.term.write_failed(&failed.failure(), at(now)) {
                    Step::Reread { .. } => self.read(w, i, s, now),
                    Step::End(_) => self.lose(w, i, s, now),
                    Step::Keep | Step::Renew { .. } => {}
                }
                return;
            }
        };
        let slot = w.slot(i, s);
        let t = slot.term.as_mut().expect("a term");
        t.held.term.renewed(written.to_lease(), at(sent));
        if matches!(t.state, State::Active | State::Leaving { .. }) {
            t.confirmed = tick(t.held.term.confirmed_until());
        }
        let record = t.held.term.record().clone();
        let newer = slot.lease.as_ref().is_none_or(|l| written.rv > l.rv);
        if newer {
            let prev = slot.observed.as_ref().map(|o| &o.0);
            let rv = Some(written.rv.to_string());
            slot.observed = Some(Obs(Observed::update(prev, record, rv, at(sent))));
            slot.lease = Some(written);
        }
    }

    /// `Engine::read`: shard `s`'s Lease read again.
    fn read(&self, w: &mut World, i: usize, s: u32, now: i64) {
        w.reps[i].flight = Some(Flight {
            shard: s,
            why: Why::Read,
            req: Req::Get,
            sent: now,
            answer: None,
        });
    }

    /// `Engine::fire` then `settle`: the timers due (renew deadlines, graces), a rebalance, then
    /// the queued writes (releases, renewals) before the plan's acquisition.
    pub(super) fn turn(&self, w: &mut World, i: usize) {
        if w.reps[i].life != Life::Up {
            return;
        }
        let now = w.now(i);
        for s in 0..self.s.shards {
            let Some(t) = w.reps[i].slots[s as usize].term.as_ref() else {
                continue;
            };
            if !matches!(t.state, State::Active | State::Leaving { .. }) {
                continue;
            }
            if let Step::End(_) = t.held.term.deadline_reached(at(now)) {
                self.lose(w, i, s, now);
            } else if let State::Leaving { until, .. } = t.state {
                if at(now) >= until {
                    self.apply(w, i, s, Event::GraceOver, now);
                    self.apply(w, i, s, Event::Finish, now);
                }
            }
        }
        self.dispatch(w, i, now);
        self.rebalance(w, i, now);
        if w.reps[i].stopping && w.reps[i].finished() {
            // Everything is handed back: the membership Lease is deleted.
            w.reps[i].life = Life::Left;
            w.reps[i].watch.clear();
            for other in &mut w.reps {
                other.members.remove(&i);
            }
        }
    }

    /// `Engine::dispatch`: a release, else a renewal due, if no call is in flight.
    fn dispatch(&self, w: &mut World, i: usize, now: i64) {
        let real = w.real;
        let mutant = self.s.mutant;
        let r = &mut w.reps[i];
        if r.flight.is_some() {
            return;
        }
        let writes = r.slots.iter_mut().enumerate().filter_map(|(s, slot)| {
            let t = slot.term.as_mut()?;
            match t.state {
                State::Releasing => Some((s, Why::Release, t)),
                State::Active | State::Leaving { .. } if at(now) >= t.held.term.next_renewal() => {
                    Some((s, Why::Renew, t))
                }
                _ => None,
            }
        });
        let mut writes: Vec<_> = writes.collect();
        writes.sort_by_key(|(_, why, _)| *why != Why::Release);
        let Some((s, why, t)) = writes.into_iter().next() else {
            return;
        };
        let lease = match why {
            Why::Release => t.held.term.release_write(None, wall(real)),
            _ => match t.held.term.renew(at(now), wall(real)) {
                Step::Renew { lease, .. } => *lease,
                _ => return,
            },
        };
        let lease = Rec::from_lease(&lease);
        let precondition = (mutant != Mutant::NoPrecondition).then_some(lease.rv);
        r.flight = Some(Flight {
            shard: u32::try_from(s).expect("small"),
            why,
            req: Req::Replace { lease, precondition },
            sent: now,
            answer: None,
        });
    }

    /// `Engine::rebalance`: the fair share; hands over the surplus and takes a free shard.
    fn rebalance(&self, w: &mut World, i: usize, now: i64) {
        let r = &w.reps[i];
        if r.stopping {
            return;
        }
        let me = identity(i);
        let fallback = self.s.fallback();
        let others = r.members.values().map(|o| &o.0);
        let (members, _) = live_members(&me, others, at(now), fallback);
        let mut share = quota(self.s.shards, &members, &me);
        if self.s.mutant == Mutant::QuotaPlusOne {
            share += 1;
        }
        let grace = match self.s.mutant {
            Mutant::NoOrphanBound => Duration::ZERO,
            _ => self.s.stop_grace(),
        };
        let orphaned = |t: &Tm| orphaned_from(t.state, t.done, t.lost_at.map(at), grace);
        let (mut active, mut holding) = (Vec::new(), Vec::new());
        for s in 0..self.s.shards {
            let term = r.slots[s as usize].term.as_ref();
            let (a, h) = tally(term.map(|t| (t.state, orphaned(t).is_some())), r.busy(s));
            if a {
                active.push(s);
            }
            if h {
                holding.push(s);
            }
        }
        let mut free = Vec::new();
        if holding.len() < share as usize && now >= r.from {
            for s in 0..self.s.shards {
                let r = &mut w.reps[i];
                let busy = r.busy(s);
                let slot = &mut r.slots[s as usize];
                let orphan = slot.term.as_ref().map(orphaned);
                let not_before = slot.not_before.map(at);
                let decide = || self.decision(slot, &me, now);
                if availability(busy, orphan, not_before, at(now), decide) == Free::Now {
                    free.push(s);
                }
            }
        }
        let p = plan(&me, share, &holding, &free);
        for s in p.release.into_iter().filter(|s| active.contains(s)) {
            let until = at(now + Settings::ticks(self.s.grace));
            self.apply(w, i, s, Event::Leave { until, release: true }, now);
        }
        if w.reps[i].flight.is_some() {
            return;
        }
        for s in p.acquire {
            let slot = &mut w.reps[i].slots[s as usize];
            let d = self.decision(slot, &me, now);
            if !matches!(d, Decision::WaitUntil(_)) {
                self.acquire(w, i, s, d, now);
                return;
            }
        }
    }

    /// `Engine::decision`: what replica `me` would do about the shard of `slot` now.
    fn decision(&self, slot: &mut Slot, me: &str, now: i64) -> Decision {
        let known = Known {
            observed: slot.observed.as_ref().map(|o| &o.0),
            deleted: slot.deleted.as_ref().map(|o| &o.0),
            seen: slot.seen,
            foreign_self: slot.foreign_self,
        };
        let mut since = slot.absent_since.map(at);
        let d = shard_decision(known, &mut since, me, at(now), self.s.fallback());
        slot.absent_since = since.map(tick);
        d
    }
}
