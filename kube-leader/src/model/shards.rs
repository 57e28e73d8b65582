//! The model checker of shards (issue 43, second slice): the shipped decision code of the
//! shards engine (the term table [`next`] and [`orphaned_from`], the fair share [`quota`] and
//! [`plan`], the live candidates [`live_members`], the decision about one shard
//! [`shard_decision`], whether a shard may be taken [`availability`] and counts as held
//! [`tally`]) and the Lease [`Term`] of each held shard, driven through every interleaving of
//! a small world by stateright's breadth-first checker, as the engine (`shards/engine/*`)
//! drives them.
//!
//! The world (see docs/safety.md, "What is proven, and under which assumptions"):
//! - an API server holding M shard Leases as a linearizable store: one global revision
//!   (resourceVersion) bumped by every write, create-if-absent, replace with a resourceVersion
//!   precondition (compare-and-swap), get, and delete; every commit queues a watch event for
//!   every live replica, delivered in order and as late as the model likes, or replaced by a
//!   re-list;
//! - N replicas with one identity each (`r<i>`, instance `r<i>.<incarnation>`), each one
//!   engine with one call in flight at a time (`max_in_flight = 1`): renewals and releases
//!   first, then one acquisition of the plan;
//! - the membership Leases, abstracted: a live replica's membership Lease is renewed at every
//!   tick and every live replica sees the renewal at once (through the shipped
//!   [`Observed::update`]); a crashed replica's stops being renewed and expires as the others
//!   see it; a replica that leaves deletes it once its shards are handed back;
//! - a global real time in whole seconds (ticks) up to `horizon`, and per replica a monotonic
//!   local clock `real + skew`, `skew` in `0..=drift` (as in the Lease model);
//! - faults: a request lost before it commits or after, any answer, watch event or turn of a
//!   replica delivered arbitrarily late (a paused process), a crash (its request in flight may
//!   still commit; the work on its shards dies with it) and a restart with a new instance id,
//!   a join and a graceful leave, a deletion of a shard Lease, a re-list, a membership Lease
//!   that stops being renewed while its replica goes on (a stall).
//!
//! The work on a shard is allowed while its term's work has not stopped and the replica's own
//! clock has not reached the `confirmed_until` its keeper was told (what the sidecar's
//! supervisor enforces per shard). The work of a term that is not `Active` (handed over, lost,
//! being given back) stops at any later time ([`Action::Done`]).

use std::{
    collections::{BTreeMap, VecDeque},
    time::Duration,
};

use super::{at, wall, Answer, Held, Obs, Rec, Req};
use crate::{
    lease::{decide::Observed, record::LeaseRecord},
    shards::engine::table::State,
};

mod check;
mod engine;
mod tests;
mod trace;

pub(crate) use check::{FAIR_SHARE, ONE_WORKER, SECOND_TERM, STOP_GRACE_KEPT, TOKENS_INCREASE};
pub(crate) use trace::trace;

/// A deliberately broken variant of the engine, which the checker must refute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mutant {
    /// None: the shipped behaviour.
    None,
    /// A lost term whose work goes on stops guarding its shard at once (the orphan bound
    /// `lease duration − renew deadline` after the loss is not waited for).
    NoOrphanBound,
    /// Every replica's quota is one more than its fair share.
    QuotaPlusOne,
    /// Shard writes (takeovers, renewals, releases) are sent without their resourceVersion
    /// precondition.
    NoPrecondition,
}

/// The model's settings.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// Replicas up at the start.
    pub(crate) replicas: usize,
    /// Replicas that may join later (down at the start).
    pub(crate) joiners: usize,
    /// How many shards.
    pub(crate) shards: u32,
    /// The lease duration, in ticks.
    pub(crate) lease: u64,
    /// The renew deadline, in ticks.
    pub(crate) renew_deadline: u64,
    /// The retry period, in ticks.
    pub(crate) retry: u64,
    /// The handover grace and the shutdown grace, in ticks.
    pub(crate) grace: u64,
    /// The bound on clock drift, in ticks.
    pub(crate) drift: i64,
    /// How many ticks are explored after the start (the replicas race for the shards until
    /// every shard is held fairly, in a fair world, clocks alike).
    pub(crate) horizon: i64,
    /// How many crashes (each followed by a possible restart) in a run.
    pub(crate) crashes: u8,
    /// How many lost requests in a run.
    pub(crate) losses: u8,
    /// How many deletions of a shard Lease in a run.
    pub(crate) deletes: u8,
    /// How many graceful leaves in a run.
    pub(crate) leaves: u8,
    /// How many re-lists in a run.
    pub(crate) relists: u8,
    /// How many replicas' membership Leases may stall in a run (their renewals stop reaching
    /// the API server while the replica goes on: a partition of its membership writes).
    pub(crate) stalls: u8,
    /// A fair world, for the fair-share check: nothing lost, no deletion or re-list, clocks at
    /// fixed skews; every request, answer, watch event, due turn and stop of work happens before
    /// real time moves on; joins, leaves and crashes only before `calm_from`.
    pub(crate) prompt: bool,
    /// In a fair world, the tick (after the start) from which on nothing fails, joins or leaves.
    pub(crate) calm_from: i64,
    /// The start itself is explored: the horizon counts from tick 0, where every replica has
    /// just sent its first acquisition, and every fault may come during the race (else the
    /// start is played out once in a fair world, clocks alike, until every shard is held).
    pub(crate) explore_start: bool,
    /// The broken variant, if any.
    pub(crate) mutant: Mutant,
}

impl Settings {
    /// The settings of the test runs: 2 replicas, 1 shard, lease 4 s, renew deadline 2 s,
    /// retry 1 s, graces 2 s, drift 1 s, horizon 4, no fault.
    pub(crate) fn small() -> Self {
        Self {
            replicas: 2,
            joiners: 0,
            shards: 1,
            lease: 4,
            renew_deadline: 2,
            retry: 1,
            grace: 2,
            drift: 1,
            horizon: 4,
            crashes: 0,
            losses: 0,
            deletes: 0,
            leaves: 0,
            relists: 0,
            stalls: 0,
            prompt: false,
            calm_from: 0,
            explore_start: false,
            mutant: Mutant::None,
        }
    }

    fn fallback(&self) -> Duration {
        Duration::from_secs(self.lease)
    }

    /// How long the work on a lost shard has to stop (`Setup::stop_grace`).
    fn stop_grace(&self) -> Duration {
        Duration::from_secs(self.lease.saturating_sub(self.renew_deadline))
    }

    fn ticks(d: u64) -> i64 {
        i64::try_from(d).expect("small")
    }
}

/// The model: [`Settings`] and the checker's interface.
#[derive(Debug, Clone)]
pub(crate) struct ShardsModel {
    s: Settings,
}

// === the world's state ===

/// A replica's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Life {
    /// Not started yet (a joiner).
    Unborn,
    Up,
    /// Crashed.
    Down,
    /// Left gracefully.
    Left,
}

/// A watch event: shard `shard`'s Lease as it is (`None`: deleted).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Ev {
    shard: u32,
    lease: Option<Rec>,
}

/// What a call is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Why {
    /// An acquisition (`true`: a create).
    Acquire(bool),
    Renew,
    Release,
    /// A re-read after a conflict.
    Read,
}

/// The call of a replica in flight.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Flight {
    shard: u32,
    why: Why,
    req: Req,
    /// When it was sent (local tick).
    sent: i64,
    answer: Option<Answer>,
}

/// A term of a shard held by a replica: the table's state and the real term machine.
#[derive(Debug, Clone, PartialEq, Hash)]
struct Tm {
    held: Held,
    state: State,
    done: bool,
    lost_at: Option<i64>,
    /// The `confirmed_until` its keeper was told (local tick): the supervisor's bound.
    confirmed: i64,
}

/// What a replica knows and holds of one shard (the engine's `Slot`).
#[derive(Debug, Clone, PartialEq, Hash, Default)]
struct Slot {
    lease: Option<Rec>,
    observed: Option<Obs>,
    deleted: Option<Obs>,
    absent_since: Option<i64>,
    seen: bool,
    transitions_seen: Option<u32>,
    foreign_self: bool,
    term: Option<Tm>,
    not_before: Option<i64>,
    /// A lost term dropped by a new term of the shard while its work goes on: its keeper's
    /// `confirmed_until`.
    zombie: Option<i64>,
}

/// One replica.
#[derive(Debug, Clone, PartialEq, Hash)]
struct Rep {
    skew: i64,
    incarnation: u8,
    life: Life,
    /// Shards are taken from this local tick on (`Campaign::From`).
    from: i64,
    /// Handing every shard back (`Campaign::Stopping`).
    stopping: bool,
    /// Its membership Lease is not renewed any more (a stall).
    stalled: bool,
    slots: Vec<Slot>,
    /// The other replicas' membership Leases as seen.
    members: BTreeMap<usize, Obs>,
    watch: VecDeque<Ev>,
    flight: Option<Flight>,
    /// The call in flight of a crashed incarnation: it may still commit.
    orphan: Option<(u32, Req)>,
}

/// The world.
#[derive(Debug, Clone, PartialEq, Hash)]
pub(crate) struct World {
    real: i64,
    /// The last real tick explored: the start's end plus the horizon.
    end: i64,
    /// In a fair world, nothing fails, joins or leaves from this real tick on.
    calm: i64,
    store: Vec<Option<Rec>>,
    revision: u64,
    reps: Vec<Rep>,
    crashes: u8,
    losses: u8,
    deletes: u8,
    leaves: u8,
    relists: u8,
    stalls: u8,
    /// Terms begun so far.
    terms: u8,
    /// Per shard, the greatest fencing token of a term begun.
    max_token: Vec<Option<u64>>,
    /// A term began with a token not greater than an earlier term's of its shard.
    token_regressed: bool,
    /// A replica began a term of a shard while the work of its lost term of that shard was
    /// still within its stop grace (not stopped, told less than `lease − renew deadline` ago).
    taken_while_stopping: bool,
}

/// What happens next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Real time advances a tick; each replica's clock skew becomes the given one.
    Tick(Vec<i64>),
    /// The API server handles replica `i`'s call.
    Commit(usize),
    /// Replica `i`'s call is lost before it commits.
    LoseBefore(usize),
    /// Replica `i`'s call commits, and its answer is lost.
    LoseAfter(usize),
    /// Replica `i` takes in the answer to its call (then settles: rebalance, dispatch).
    Answer(usize),
    /// Replica `i` takes in its next watch event (then settles).
    Watch(usize),
    /// Replica `i`'s watch re-lists: its pending events are replaced by the set as it is.
    Relist(usize),
    /// Replica `i`'s timers fire (deadlines, graces, renewals, a rebalance), then it settles.
    Turn(usize),
    /// The work on replica `i`'s shard `s` (told to stop) stops.
    Done(usize, u32),
    /// Replica `i` crashes.
    Crash(usize),
    /// Replica `i` restarts (a crashed one) or joins (a new one).
    Start(usize),
    /// Replica `i` is shut down: it hands every shard back, then leaves.
    Leave(usize),
    /// The orphaned call of replica `i`'s crashed incarnation commits.
    OrphanCommits(usize),
    /// An administrator deletes shard `s`'s Lease.
    Delete(u32),
    /// Replica `i`'s membership Lease stops being renewed (it goes on otherwise).
    Stall(usize),
}

/// The identity of replica `i`.
fn identity(i: usize) -> String {
    format!("r{i}")
}

impl Rep {
    fn instance(&self, i: usize) -> String {
        format!("r{i}.{}", self.incarnation)
    }

    fn busy(&self, s: u32) -> bool {
        self.flight.as_ref().is_some_and(|f| f.shard == s)
    }

    fn live(&self) -> bool {
        self.life == Life::Up && !self.stopping
    }

    /// Handing back is over: no call in flight, every term ended or gone (`Engine::finished`).
    fn finished(&self) -> bool {
        self.flight.is_none()
            && self
                .slots
                .iter()
                .all(|s| s.term.as_ref().is_none_or(|t| t.state == State::Gone))
    }
}

impl World {
    fn slot(&mut self, i: usize, s: u32) -> &mut Slot {
        &mut self.reps[i].slots[s as usize]
    }

    fn now(&self, i: usize) -> i64 {
        self.real + self.reps[i].skew
    }

    /// The terms of shard `s` allowed to work now: not stopped, and the replica's clock before
    /// the `confirmed_until` its keeper was told.
    fn allowed(&self, s: u32) -> Vec<usize> {
        let mut who = Vec::new();
        for (i, r) in self.reps.iter().enumerate() {
            if r.life != Life::Up {
                continue;
            }
            let now = self.now(i);
            let slot = &r.slots[s as usize];
            if slot.term.as_ref().is_some_and(|t| !t.done && now < t.confirmed) {
                who.push(i);
            }
            if slot.zombie.is_some_and(|c| now < c) {
                who.push(i);
            }
        }
        who
    }

    /// The shards replica `i` holds and works on (`Active`).
    fn active(&self, i: usize) -> usize {
        self.reps[i]
            .slots
            .iter()
            .filter(|s| s.term.as_ref().is_some_and(|t| t.state == State::Active))
            .count()
    }

    /// A commit to shard `s`: every live replica's watch but the writer's will show its Lease as
    /// it is now (the writer learns its write from the answer; the echo of its own write is left
    /// out of the model: the engine ignores it once answered, and before, it only confirms what
    /// the answer says).
    fn notify(&mut self, s: u32, writer: Option<usize>) {
        let ev = Ev {
            shard: s,
            lease: self.store[s as usize].clone(),
        };
        for (i, r) in self.reps.iter_mut().enumerate() {
            if r.life == Life::Up && writer != Some(i) {
                r.watch.push_back(ev.clone());
            }
        }
    }

    /// The API server handles `req` on shard `s`, sent by the live replica `writer` (`None`: a
    /// crashed incarnation).
    fn apply(&mut self, s: u32, req: &Req, writer: Option<usize>) -> Answer {
        let stored = &self.store[s as usize];
        let written = match (req, stored) {
            (Req::Get, Some(l)) => return Answer::Ok(l.clone()),
            (Req::Get, None) => return Answer::NotFound,
            (Req::Create(_), Some(_)) => return Answer::Conflict,
            (Req::Create(l), None) => l,
            (Req::Replace { .. }, None) => return Answer::NotFound,
            (
                Req::Replace {
                    precondition: Some(p),
                    ..
                },
                Some(cur),
            ) if *p != cur.rv => return Answer::Conflict,
            (Req::Replace { lease, .. }, Some(_)) => lease,
        };
        self.revision += 1;
        let mut written = written.clone();
        written.rv = self.revision;
        self.store[s as usize] = Some(written.clone());
        self.notify(s, writer);
        Answer::Ok(written)
    }

    /// The membership Leases: every live replica's is renewed now and seen by every live
    /// replica (the abstraction of the module's doc).
    fn renew_members(&mut self, lease: u64) {
        let live = (0..self.reps.len()).filter(|&j| self.reps[j].live() && !self.reps[j].stalled);
        let live: Vec<usize> = live.collect();
        for i in 0..self.reps.len() {
            if self.reps[i].life != Life::Up {
                continue;
            }
            let now = self.now(i);
            for &j in live.iter().filter(|&&j| j != i) {
                let record = LeaseRecord {
                    holder: Some(identity(j)),
                    lease_duration: Some(Duration::from_secs(lease)),
                    acquire_time: None,
                    renew_time: Some(wall(self.real)),
                    transitions: 0,
                };
                let m = &mut self.reps[i].members;
                let next = Observed::update(m.get(&j).map(|o| &o.0), record, None, at(now));
                m.insert(j, Obs(next));
            }
        }
    }
}

impl ShardsModel {
    /// Replica `i` starts (joins, or restarts after a crash): lists the set, campaigns.
    fn start(&self, w: &mut World, i: usize) {
        let r = &mut w.reps[i];
        if r.life == Life::Down {
            r.incarnation += 1;
        }
        r.life = Life::Up;
        r.stopping = false;
        r.stalled = false;
        r.slots = vec![Slot::default(); self.s.shards as usize];
        r.members.clear();
        r.watch.clear();
        w.renew_members(self.s.lease);
        let now = w.now(i);
        self.relisted(w, i, now);
        // `first_synced`: no settle time in the model (`join_settle` zero).
        w.reps[i].from = now;
        self.turn(w, i);
    }
}
