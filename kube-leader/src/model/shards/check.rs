//! The checker's interface: the initial states, what may happen in each, and the properties.

use std::time::Instant as StdInstant;

use stateright::{Checker, Model, Property};

use super::{Action, Life, Mutant, Rep, Settings, ShardsModel, Slot, World};
use crate::model::skews;

/// The property: at no real instant are two terms of one shard allowed to work (of two
/// replicas, or a replica's new term beside its dropped lost one).
pub(crate) const ONE_WORKER: &str = "no shard is worked on by two terms at once";
/// The property: every term of a shard has a greater fencing token than every earlier term of
/// that shard.
pub(crate) const TOKENS_INCREASE: &str = "fencing tokens per shard increase";
/// The property: a replica never takes a shard again while the work of its lost term of that
/// shard may still be stopping (not stopped, its loss told less than the stop grace
/// `lease duration − renew deadline` ago: the time the work has to stop).
pub(crate) const STOP_GRACE_KEPT: &str = "no shard is taken again while its lost work may still be stopping";
/// Not a safety property: some shard changes hands (the model is not vacuous).
pub(crate) const SECOND_TERM: &str = "a shard has a second term";
/// The property, in a fair world ([`Settings::prompt`](super::Settings::prompt)): once nothing
/// fails, joins or leaves and nothing is due, at the horizon, every shard is held by exactly one
/// live replica and each live replica holds ⌊M/N⌋ or ⌈M/N⌉ of the M shards.
pub(crate) const FAIR_SHARE: &str = "each live replica holds its fair share";

impl Action {
    /// In a fair world, what must happen before real time moves on: everything but a tick and
    /// the faults (a crash, a start, a leave, a deletion, a re-list).
    fn is_due(&self) -> bool {
        !matches!(
            self,
            Action::Tick(_)
                | Action::Crash(_)
                | Action::Start(_)
                | Action::Leave(_)
                | Action::Delete(_)
                | Action::Relist(_)
                | Action::Stall(_)
        )
    }
}

impl World {
    /// Every shard is held (`Active`) by exactly one live replica, and each live replica holds
    /// ⌊M/N⌋ or ⌈M/N⌉ shards.
    fn fair(&self, shards: u32) -> bool {
        let live: Vec<usize> = (0..self.reps.len()).filter(|&i| self.reps[i].live()).collect();
        let n = live.len();
        if n == 0 {
            return true;
        }
        let m = shards as usize;
        let counts: Vec<usize> = live.iter().map(|&i| self.active(i)).collect();
        let once = (0..shards).all(|s| {
            let holders = live.iter().filter(|&&i| {
                let slot = &self.reps[i].slots[s as usize];
                slot.term
                    .as_ref()
                    .is_some_and(|t| t.state == super::State::Active)
            });
            holders.count() == 1
        });
        once && counts.iter().all(|c| *c == m / n || *c == m.div_ceil(n))
    }
}

impl ShardsModel {
    /// The start, played out: the replicas race for the shards in a fair world with the
    /// shipped engine (the first action due each time; real time moves on when nothing is due),
    /// until every shard is held fairly and nothing is due.
    fn settled_start(&self, mut w: World) -> World {
        let fair = ShardsModel::new(Settings {
            prompt: true,
            calm_from: 0,
            crashes: 0,
            losses: 0,
            deletes: 0,
            leaves: 0,
            relists: 0,
            stalls: 0,
            mutant: Mutant::None,
            ..self.s.clone()
        });
        w.end = i64::MAX;
        for _ in 0..10_000 {
            let mut next = Vec::new();
            fair.actions(&w, &mut next);
            let action = match next.into_iter().find(Action::is_due) {
                Some(a) => a,
                None if w.fair(self.s.shards) => return w,
                None => Action::Tick(w.reps.iter().map(|r| r.skew).collect()),
            };
            w = fair.next_state(&w, action).expect("a step");
        }
        panic!("the start never settles: {w:?}");
    }

    /// Whether `w` is quiet at the horizon: nothing is due (a fair world's stable state).
    fn settled(&self, w: &World) -> bool {
        if w.real < w.end {
            return false;
        }
        let mut next = Vec::new();
        self.actions(w, &mut next);
        !next.iter().any(Action::is_due)
    }

    /// Explores the model breadth-first on `threads` threads; prints the states explored, the
    /// depth and the time.
    pub(crate) fn check(self, threads: usize) -> impl Checker<Self> {
        let label = format!("{:?}", self.s);
        let started = StdInstant::now();
        let checker = self.checker().threads(threads).spawn_bfs().join();
        println!(
            "shards model {label}: {} states ({} unique), depth {}, {:.1?}",
            checker.state_count(),
            checker.unique_state_count(),
            checker.max_depth(),
            started.elapsed()
        );
        checker
    }
}

impl Model for ShardsModel {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        let n = self.s.replicas + self.s.joiners;
        let m = self.s.shards as usize;
        let rep = |skew| Rep {
            skew,
            incarnation: 0,
            life: Life::Unborn,
            from: 0,
            stopping: false,
            stalled: false,
            slots: vec![Slot::default(); m],
            members: Default::default(),
            watch: Default::default(),
            flight: None,
            orphan: None,
        };
        skews(n, self.s.drift, &vec![0; n])
            .into_iter()
            .map(|skews| {
                let mut w = World {
                    real: 0,
                    end: 0,
                    calm: 0,
                    store: vec![None; m],
                    revision: 0,
                    reps: skews.into_iter().map(rep).collect(),
                    crashes: 0,
                    losses: 0,
                    deletes: 0,
                    leaves: 0,
                    relists: 0,
                    stalls: 0,
                    terms: 0,
                    max_token: vec![None; m],
                    token_regressed: false,
                    taken_while_stopping: false,
                };
                // The first replicas start together: each lists the (empty) set and sees the
                // others' membership Leases, then turns.
                for i in 0..self.s.replicas {
                    w.reps[i].life = Life::Up;
                    w.reps[i].from = w.now(i);
                }
                w.renew_members(self.s.lease);
                for i in 0..self.s.replicas {
                    self.turn(&mut w, i);
                }
                let mut w = match self.s.explore_start {
                    true => w,
                    false => self.settled_start(w),
                };
                w.end = w.real + self.s.horizon;
                w.calm = w.real + self.s.calm_from;
                w
            })
            .collect()
    }

    fn actions(&self, w: &World, actions: &mut Vec<Action>) {
        let s = &self.s;
        let faults = !s.prompt || w.real < w.calm;
        if w.real < w.end {
            let now: Vec<i64> = w.reps.iter().map(|r| r.skew).collect();
            // A fair world keeps its clocks' skews (its initial states differ by them).
            let changes = if s.prompt { 0 } else { 1 };
            let few = |v: &Vec<i64>| v.iter().zip(&now).filter(|(a, b)| a != b).count() <= changes;
            let next = skews(w.reps.len(), s.drift, &now).into_iter().filter(few);
            actions.extend(next.map(Action::Tick));
        }
        for (i, r) in w.reps.iter().enumerate() {
            if r.orphan.is_some() {
                actions.push(Action::OrphanCommits(i));
            }
            match r.life {
                Life::Unborn | Life::Down if faults => actions.push(Action::Start(i)),
                Life::Up => {}
                _ => continue,
            }
            if r.life != Life::Up {
                continue;
            }
            if faults && w.crashes < s.crashes {
                actions.push(Action::Crash(i));
            }
            if faults && w.leaves < s.leaves && !r.stopping {
                actions.push(Action::Leave(i));
            }
            if faults && w.stalls < s.stalls && !r.stalled {
                actions.push(Action::Stall(i));
            }
            if !r.watch.is_empty() {
                actions.push(Action::Watch(i));
                if w.relists < s.relists {
                    actions.push(Action::Relist(i));
                }
            }
            match &r.flight {
                Some(f) if f.answer.is_none() => {
                    actions.push(Action::Commit(i));
                    if w.losses < s.losses {
                        actions.extend([Action::LoseBefore(i), Action::LoseAfter(i)]);
                    }
                }
                Some(_) => actions.push(Action::Answer(i)),
                None => {}
            }
            for (k, slot) in r.slots.iter().enumerate() {
                let stopping = slot
                    .term
                    .as_ref()
                    .is_some_and(|t| !t.done && t.state != super::State::Active);
                if stopping || slot.zombie.is_some() {
                    actions.push(Action::Done(i, u32::try_from(k).expect("small")));
                }
            }
            let mut turned = w.clone();
            self.turn(&mut turned, i);
            if turned != *w {
                actions.push(Action::Turn(i));
            }
        }
        if w.deletes < s.deletes {
            let present = (0..s.shards).filter(|k| w.store[*k as usize].is_some());
            actions.extend(present.map(Action::Delete));
        }
        if s.prompt && actions.iter().any(Action::is_due) {
            // A fair world: what is due happens before real time moves on.
            actions.retain(|a| !matches!(a, Action::Tick(_)));
        }
    }

    fn next_state(&self, last: &World, action: Action) -> Option<World> {
        let mut w = last.clone();
        match action {
            Action::Tick(skews) => {
                w.real += 1;
                for (r, s) in w.reps.iter_mut().zip(skews) {
                    r.skew = s;
                }
                w.renew_members(self.s.lease);
            }
            Action::Commit(i) | Action::LoseAfter(i) => {
                let f = w.reps[i].flight.clone().expect("a call");
                let mut answer = w.apply(f.shard, &f.req, Some(i));
                if let Action::LoseAfter(_) = action {
                    w.losses += 1;
                    answer = super::Answer::Lost;
                }
                w.reps[i].flight.as_mut().expect("a call").answer = Some(answer);
            }
            Action::LoseBefore(i) => {
                w.losses += 1;
                w.reps[i].flight.as_mut().expect("a call").answer = Some(super::Answer::Lost);
            }
            Action::Answer(i) => {
                self.answered(&mut w, i);
                self.turn(&mut w, i);
            }
            Action::Watch(i) => {
                let ev = w.reps[i].watch.pop_front().expect("an event");
                let now = w.now(i);
                match ev.lease {
                    Some(rec) => self.absorb(&mut w, i, ev.shard, rec, now),
                    None => self.gone(&mut w, i, ev.shard, now, false),
                }
                self.turn(&mut w, i);
            }
            Action::Relist(i) => {
                w.relists += 1;
                w.reps[i].watch.clear();
                let now = w.now(i);
                self.relisted(&mut w, i, now);
                self.turn(&mut w, i);
            }
            Action::Turn(i) => self.turn(&mut w, i),
            Action::Done(i, s) => {
                let now = w.now(i);
                self.on_done(&mut w, i, s, now);
                self.turn(&mut w, i);
            }
            Action::Crash(i) => {
                w.crashes += 1;
                let r = &mut w.reps[i];
                r.orphan = r
                    .flight
                    .take()
                    .filter(|f| f.answer.is_none())
                    .map(|f| (f.shard, f.req));
                r.life = Life::Down;
                r.stopping = false;
                r.slots = vec![Slot::default(); self.s.shards as usize];
                r.members.clear();
                r.watch.clear();
            }
            Action::Start(i) => self.start(&mut w, i),
            Action::Leave(i) => {
                w.leaves += 1;
                self.stop(&mut w, i);
                self.turn(&mut w, i);
            }
            Action::OrphanCommits(i) => {
                let (s, req) = w.reps[i].orphan.take().expect("an orphan");
                w.apply(s, &req, None);
            }
            Action::Stall(i) => {
                w.stalls += 1;
                w.reps[i].stalled = true;
            }
            Action::Delete(s) => {
                w.deletes += 1;
                w.revision += 1;
                w.store[s as usize] = None;
                w.notify(s, None);
            }
        }
        Some(w)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut all = vec![
            Property::always(ONE_WORKER, |m: &Self, w: &World| {
                (0..m.s.shards).all(|s| w.allowed(s).len() <= 1)
            }),
            Property::always(TOKENS_INCREASE, |_, w: &World| !w.token_regressed),
            Property::always(STOP_GRACE_KEPT, |_, w: &World| !w.taken_while_stopping),
            Property::sometimes(SECOND_TERM, |m: &Self, w: &World| u32::from(w.terms) > m.s.shards),
        ];
        if self.s.prompt {
            all.push(Property::always(FAIR_SHARE, |m: &Self, w: &World| {
                !m.settled(w) || w.fair(m.s.shards)
            }));
        }
        // A mutant is checked against the property it breaks alone: the run stops at the first
        // (shortest) counterexample.
        let target = match self.s.mutant {
            Mutant::None => return all,
            Mutant::NoOrphanBound => STOP_GRACE_KEPT,
            Mutant::NoPrecondition => ONE_WORKER,
            Mutant::QuotaPlusOne => FAIR_SHARE,
        };
        all.into_iter().filter(|p| p.name == target).collect()
    }
}
