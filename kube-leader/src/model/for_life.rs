//! The model checker of leader for life (issue 43, second slice): the shipped decision code of
//! a waiting candidate ([`decide`], [`defer_to_preferred`], [`dead_pod_to_delete`],
//! [`track_fate`] and [`Fate`]) and the pure core of the holder's side
//! ([`crate::for_life::holder`]: `lock_loss`, `pod_ending`, `release_mark`, `restart_token`,
//! `Beats`), driven through every interleaving of a small world.
//!
//! The world:
//! - an API server as a linearizable store holding the lock ConfigMap and one Pod per
//!   candidate: a global revision (resourceVersion) bumped by every write, create-if-absent,
//!   update with a resourceVersion precondition, delete with a UID (and resourceVersion)
//!   precondition, get; a terminal Pod deleted goes at once, a running one is deleted
//!   gracefully; every commit queues an event on every running process's lock watch and Pod
//!   watch, two streams each delivered in order and as late as the model likes;
//! - Kubernetes' garbage collector, which deletes the lock once its owner Pod is gone (or
//!   replaced), any time later;
//! - a kubelet per Pod: once the Pod ends (evicted, deleted gracefully or forced), it kills the
//!   Pod's containers (the candidate's process and its work) at any time within the Pod's grace
//!   (real time); a graceful deletion completes (the Pod goes) only after that;
//! - `candidates` candidates, one per Pod (`p<i>`), each driving the real code as the campaign
//!   (`for_life/campaign.rs`) and the keeper, heartbeat and sidecar step-down do, with one
//!   request in flight at a time (the background deletion of a dead leader's Pod commits as
//!   it is sent);
//! - global real time in ticks (seconds), and per candidate a monotonic local clock
//!   `real + skew`, `skew` in `0..=drift`: over any interval a local clock and real time differ
//!   by at most `drift` ticks;
//! - faults: a request lost before or after it commits, any answer or watch event late (a
//!   paused process; a partition from the API server for as long as nothing gets through), a
//!   crash (a container restart: its work dies with it, its request in flight may still commit)
//!   followed by a restart with the same identity, a leader's Pod evicted (the waiting candidate
//!   deletes an Evicted leader Pod once it takes over, the default policy), deleted gracefully
//!   or forced, recreated under the same name with a new UID (a new identity), a voluntary
//!   release, an administrator's deletion of the lock.
//!
//! **Allowed to work.** What the sidecar's supervisor enforces for COMMAND: a candidate's work
//! starts when it wins a term and runs until it stops after the leader learnt of a loss (the
//! keeper's lock or own-Pod check, a release; COMMAND's exit within `--grace` of SIGTERM), the
//! kubelet kills the Pod's containers (a crash kills them too), or, with the liveness
//! heartbeat, the candidate's own clock reaches the term's `confirmed_until` (the send of the
//! last successful heartbeat plus the liveness) plus `--grace`: the supervisor's deadline.
//! (The supervisor's own pings, the renew deadline from each, can only bring that deadline
//! earlier; the model leaves them out, the worst case.) The step-down writes (the release mark
//! and deletion, or the lock created again marked released after a deletion under the leader)
//! come only after the work stopped.
//!
//! The properties: at most one candidate is allowed to work at any real instant
//! ([`ONE_WORKING`]); every term's fencing token is at least every earlier term's, and greater
//! for a new lock ([`TOKENS_INCREASE`]); in a fair world ([`Settings::prompt`]), once the
//! leader's Pod ends or its process crashes, someone leads within the Pod's grace + the kill
//! margin + the drift bound while a live candidate remains ([`LEADS_AFTER_END`]); with releases
//! naming a successor, the same holds after a crash ([`CRASH_NOT_DELAYED`]).
//!
//! Mutants ([`Mutant`]) change the inputs or outputs around the real code, never the shipped
//! code: the checker must refute each of them.

use std::{collections::VecDeque, time::Instant as StdInstant};

use stateright::{Checker, Model, Property};

use crate::for_life::{decide::Fate, holder::Beats};

mod answers;
mod cand;
mod store;
mod tests;
mod world;

use store::{Answer, Lock, Pid, PodRec, Req};

/// A deliberately broken variant of the world, which the checker must refute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mutant {
    /// None: the shipped behaviour.
    None,
    /// A waiting candidate takes over an ended leader without proof that its work stopped: a
    /// `LeaderMayRun` wait becomes a deletion of the lock (or, with no lock, a create).
    NoProof,
    /// With no lock, a waiting candidate creates it at once (the lock recreated at once after
    /// the garbage collector deleted it with a force-deleted leader Pod).
    RecreatedAtOnce,
    /// The fencing token counts the terms of each candidate, not the lock's revision.
    TokenPerCandidate,
    /// A restarted leader does not recognise its own lock (it waits as for another's).
    ForgetsOwnLock,
    /// A candidate recognises a lock of its Pod's name as its own, whatever the UID (a former
    /// Pod of its name, force-deleted, whose work may still run).
    OwnByName,
    /// A waiting candidate remembers the successor the last release preferred, and defers to
    /// it on any takeover, a crash failover's included.
    StalePreferred,
    /// A waiting candidate deletes the last leader's dead Pod with its decision (before its
    /// create, or with a stale lock's deletion), not once its create won (the order before the
    /// model found the overlap).
    DeadPodFirst,
}

/// The model's settings.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// How many candidates.
    pub(crate) candidates: usize,
    /// The Pods' grace period (`terminationGracePeriodSeconds`), in ticks.
    pub(crate) pod_grace: u64,
    /// The liveness heartbeat's confirmed window, in ticks (`None`: off).
    pub(crate) liveness: Option<u64>,
    /// The sidecar's `--grace`: how long COMMAND may run after its deadline (advertised with
    /// the liveness).
    pub(crate) cli_grace: u64,
    /// The drift bound, in ticks.
    pub(crate) drift: i64,
    /// The last real tick explored.
    pub(crate) horizon: i64,
    /// How many crashes (container restarts) in a run.
    pub(crate) crashes: u8,
    /// How many evictions of a Pod in a run.
    pub(crate) evictions: u8,
    /// How many graceful deletions of a Pod in a run.
    pub(crate) deletions: u8,
    /// How many forced deletions of a Pod in a run.
    pub(crate) forced: u8,
    /// How many Pods recreated under the same name (a new UID) in a run.
    pub(crate) recreations: u8,
    /// How many lost requests in a run.
    pub(crate) losses: u8,
    /// How many voluntary releases in a run.
    pub(crate) releases: u8,
    /// How many deletions of the lock by an administrator in a run.
    pub(crate) lock_deletes: u8,
    /// A fair world, for the liveness checks: nothing lost, no answer or event late, every
    /// write a decision calls for sent, the step-down done, a crashed container restarted,
    /// and the garbage collector and kubelet's deletions done, before real time moves on.
    pub(crate) prompt: bool,
    /// Waiting candidates may be paused too: their watch events, answers and decisions may come
    /// after real time moved on. Off: a waiting candidate takes in what it is sent and acts on
    /// it (or on a timer) within the tick (its requests may still be late or lost); a leader
    /// may always be paused.
    pub(crate) paused_followers: bool,
    /// A leader whose step-down is over campaigns again (a library user's loop, or the
    /// sidecar's container restarted after it exits), unless its Pod is ending. Off: it stops
    /// (a crash and restart still campaigns again).
    pub(crate) rejoin: bool,
    /// Releases name the next candidate as the preferred successor.
    pub(crate) successor: bool,
    /// How long a candidate that is not the preferred successor defers to it, in ticks.
    pub(crate) successor_wait: u64,
    /// The broken variant, if any.
    pub(crate) mutant: Mutant,
}

impl Settings {
    /// The settings of the test run: 2 candidates, Pod grace 2 s (the kubelet's minimum), no
    /// liveness heartbeat, drift 1 s, no fault.
    pub(crate) fn small() -> Self {
        Self {
            candidates: 2,
            pod_grace: 2,
            liveness: None,
            cli_grace: 1,
            drift: 1,
            horizon: 6,
            crashes: 0,
            evictions: 0,
            deletions: 0,
            forced: 0,
            recreations: 0,
            losses: 0,
            releases: 0,
            lock_deletes: 0,
            prompt: false,
            paused_followers: false,
            rejoin: false,
            successor: false,
            successor_wait: 2,
            mutant: Mutant::None,
        }
    }

    /// The failover bound, in ticks: the Pod's grace + the kill margin (2 s) + the drift bound
    /// (the grace proof, counted by a clock that may run a tick slow).
    pub(crate) fn failover_bound(&self) -> i64 {
        i64::try_from(self.pod_grace + 2).expect("small") + self.drift
    }
}

/// The model: [`Settings`] and the checker's interface.
#[derive(Debug, Clone)]
pub(crate) struct ForLifeModel {
    s: Settings,
}

/// What a waiting candidate knows (`for_life/campaign.rs`'s `Election`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
struct Follower {
    /// The lock as last seen: `None` until seen, `Some(None)` when absent.
    lock: Option<Option<Lock>>,
    /// The leader Pod watched: its slot, and what its watch shows.
    leader: Option<(usize, crate::for_life::record::LeaderPod)>,
    fate: Option<Fate>,
    /// The dead leader's Pod to delete once its create won (the campaign's `dead_pod`).
    dead: Option<Pid>,
    /// [`Mutant::StalePreferred`]: the successor the last release it saw preferred.
    stale_preferred: Option<(String, i64)>,
}

/// Why a term ended, as the keeper (or the supervisor) learnt it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Loss {
    /// The lock was deleted.
    Deleted,
    /// The lock was replaced.
    Replaced,
    /// The Pod is ending.
    PodEnding,
    /// A voluntary release.
    Released,
    /// The supervisor's deadline passed (the work was stopped).
    Unconfirmed,
}

/// The step-down after a loss, once the work stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Down {
    /// Mark the lock released (the keeper's `release`), then delete it.
    Mark,
    /// Delete the lock, marked.
    Delete,
    /// Create the lock again marked released (the keeper's `say_stopped`).
    SayStopped,
}

/// A leader: the keeper's state (`for_life/keeper.rs`, `heartbeat.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Holder {
    lock_uid: u64,
    token: u64,
    /// The lock as the keeper's watch last showed it (the release's first read).
    watched: Option<Lock>,
    /// The lock as last written or read (the heartbeat's precondition).
    current: Lock,
    beats: Option<Beats>,
    /// When the next heartbeat is due (local tick).
    next_beat: i64,
    lost: Option<Loss>,
    down: Option<Down>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[allow(clippy::large_enum_variant)] // states are cloned whole anyway
enum Proc {
    Wait(Follower),
    Lead(Holder),
    /// Not running: crashed, stopped campaigning (its Pod is ending), or done.
    Down,
}

/// The work (COMMAND) of a term.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Work {
    token: u64,
    /// The supervisor's deadline (local tick), with the liveness heartbeat.
    until: Option<i64>,
}

/// What a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Why {
    /// A create, and the dead Pod to delete once it won.
    Create(Option<Pid>),
    DeleteStale,
    Adopt,
    Beat,
    Mark,
    Delete,
    SayStopped,
    Reread,
}

/// The request of a candidate in flight.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Flight {
    req: Req,
    why: Why,
    /// When it was sent (local tick).
    sent: i64,
    answer: Option<Answer>,
}

/// One candidate: its Pod's process.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Cand {
    /// The generation of the Pod it runs in.
    gen: u8,
    skew: i64,
    proc: Proc,
    work: Option<Work>,
    lock_q: VecDeque<Option<Lock>>,
    pod_q: VecDeque<(usize, Option<PodRec>)>,
    flight: Option<Flight>,
    /// A request of a crashed process that may still commit.
    orphan: Option<Req>,
    /// The kubelet kills this Pod's containers by this real tick.
    kill_by: Option<i64>,
    /// The Pod's containers were killed.
    dead: bool,
    /// Its process crashed; its container restarts.
    crashed: bool,
    /// Terms this candidate won ([`Mutant::TokenPerCandidate`]).
    wins: u8,
}

impl Cand {
    fn up(&self) -> bool {
        self.proc != Proc::Down
    }

    fn pid(&self, slot: usize) -> Pid {
        Pid { slot, gen: self.gen }
    }
}

/// The world.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct World {
    real: i64,
    grace: u64,
    lock: Option<Lock>,
    pods: Vec<Option<PodRec>>,
    revision: u64,
    cands: Vec<Cand>,
    /// Faults so far: crashes, evictions, deletions, forced, recreations, losses, releases,
    /// lock deletes.
    faults: [u8; 8],
    terms: u8,
    max_token: u64,
    token_regressed: bool,
    /// The leader's Pod ended or its process crashed at this real tick, and nobody leads since
    /// (`crash`: a crash, else its Pod's end).
    ended: Option<(i64, bool)>,
}

/// What happens next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Real time advances a tick; each candidate's clock skew becomes the given one.
    Tick(Vec<i64>),
    /// The API server handles candidate `i`'s request.
    Commit(usize),
    /// Candidate `i`'s request is lost before it commits.
    LoseBefore(usize),
    /// Candidate `i`'s request commits, and its answer is lost.
    LoseAfter(usize),
    /// Candidate `i` takes in the answer to its request.
    Answer(usize),
    /// Candidate `i` takes in its next lock watch event.
    WatchLock(usize),
    /// Candidate `i` takes in its next Pod watch event.
    WatchPod(usize),
    /// Candidate `i`'s campaign decides and acts (an event, or a timer).
    Attempt(usize),
    /// Candidate `i`'s heartbeat is due.
    Beat(usize),
    /// Candidate `i`'s work stops (it learnt of a loss).
    StopWork(usize),
    /// Candidate `i`'s step-down writes its next request.
    StepDown(usize),
    /// Candidate `i` releases voluntarily.
    Release(usize),
    /// The request of candidate `i`'s crashed process commits.
    Orphan(usize),
    /// Candidate `i`'s container crashes.
    Crash(usize),
    /// Candidate `i`'s container restarts (same Pod, same identity).
    Restart(usize),
    /// Candidate `i`'s Pod is evicted.
    Evict(usize),
    /// Candidate `i`'s Pod is deleted gracefully.
    DeletePod(usize),
    /// Candidate `i`'s Pod is force-deleted.
    ForceDelete(usize),
    /// The kubelet kills candidate `i`'s containers.
    Kill(usize),
    /// Candidate `i`'s graceful deletion completes (its containers are dead).
    Vanish(usize),
    /// Candidate `i`'s Pod is recreated under its name, with a new UID.
    Recreate(usize),
    /// The garbage collector deletes the lock of a gone owner.
    Collect,
    /// An administrator deletes the lock.
    DeleteLock,
}

impl Action {
    /// In a fair world, what must happen before real time moves on: everything but a tick and
    /// the faults.
    fn is_due(&self) -> bool {
        !matches!(
            self,
            Action::Tick(_)
                | Action::LoseBefore(_)
                | Action::LoseAfter(_)
                | Action::Crash(_)
                | Action::Evict(_)
                | Action::DeletePod(_)
                | Action::ForceDelete(_)
                | Action::Kill(_)
                | Action::Recreate(_)
                | Action::Release(_)
                | Action::DeleteLock
        )
    }
}

/// The property: at no real instant are two candidates allowed to work.
pub(crate) const ONE_WORKING: &str = "at most one candidate allowed to work (for life)";
/// The property: every term's fencing token is at least every earlier term's, and greater for
/// a new lock.
pub(crate) const TOKENS_INCREASE: &str = "fencing tokens never decrease (for life)";
/// Not a safety property: the model reaches a second term (it is not vacuous).
pub(crate) const SECOND_TERM: &str = "a second term begins (for life)";
/// The property, in a fair world: once the leader's Pod ends or its process crashes, and a live
/// candidate remains, someone leads within [`Settings::failover_bound`].
pub(crate) const LEADS_AFTER_END: &str =
    "someone leads within the Pod's grace + 2 s + drift after the leader ends";
/// The property, in a fair world where releases name a successor: a crash or a Pod's end is
/// taken over within the same bound.
pub(crate) const CRASH_NOT_DELAYED: &str =
    "the successor preference never delays a crash failover (for life)";

impl ForLifeModel {
    pub(crate) fn new(s: Settings) -> Self {
        Self { s }
    }

    /// Explores the model breadth-first on `threads` threads; prints the states explored.
    pub(crate) fn check(self, threads: usize) -> impl Checker<Self> {
        let label = format!("{:?}", self.s);
        let started = StdInstant::now();
        let checker = self.checker().threads(threads).spawn_bfs().join();
        println!(
            "for-life model {label}: {} states ({} unique), depth {}, {:.1?}",
            checker.state_count(),
            checker.unique_state_count(),
            checker.max_depth(),
            started.elapsed()
        );
        checker
    }
}

impl Model for ForLifeModel {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        vec![self.initial()]
    }

    fn actions(&self, w: &World, actions: &mut Vec<Action>) {
        self.world_actions(w, actions);
        for i in 0..w.cands.len() {
            self.cand_actions(w, i, actions);
        }
        let due = |a: &Action| match a {
            _ if self.s.prompt => a.is_due(),
            Action::WatchLock(i) | Action::WatchPod(i) | Action::Attempt(i) | Action::Answer(i) => {
                !self.s.paused_followers && matches!(w.cands[*i].proc, Proc::Wait(_))
            }
            _ => false,
        };
        if actions.iter().any(due) {
            actions.retain(|a| !matches!(a, Action::Tick(_)));
        }
    }

    fn next_state(&self, last: &World, action: Action) -> Option<World> {
        let mut w = last.clone();
        self.step(&mut w, action);
        Some(w)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut all = vec![
            Property::always(ONE_WORKING, |m: &Self, w: &World| {
                (0..w.cands.len()).filter(|&i| m.allowed(w, i)).count() <= 1
            }),
            Property::always(TOKENS_INCREASE, |_, w: &World| !w.token_regressed),
            Property::sometimes(SECOND_TERM, |_, w: &World| w.terms >= 2),
        ];
        if self.s.prompt {
            all.push(Property::always(LEADS_AFTER_END, |m: &Self, w: &World| {
                !m.leaderless_past(w, false)
            }));
        }
        if self.s.prompt && self.s.successor {
            all.push(Property::always(CRASH_NOT_DELAYED, |m: &Self, w: &World| {
                !m.leaderless_past(w, true)
            }));
        }
        let target = match self.s.mutant {
            Mutant::None => return all,
            Mutant::NoProof | Mutant::RecreatedAtOnce | Mutant::OwnByName | Mutant::DeadPodFirst => {
                ONE_WORKING
            }
            Mutant::TokenPerCandidate => TOKENS_INCREASE,
            Mutant::ForgetsOwnLock => LEADS_AFTER_END,
            Mutant::StalePreferred => CRASH_NOT_DELAYED,
        };
        all.into_iter().filter(|p| p.name == target).collect()
    }
}

/// A counterexample, one line a step: the store, then every candidate, then the action.
pub(crate) fn trace(m: &ForLifeModel, path: stateright::Path<World, Action>) -> String {
    let mut out = String::new();
    for (w, action) in path.into_vec() {
        out.push_str(&format!("t={} lock: {:?}; pods: {:?}", w.real, w.lock, w.pods));
        if let Some((at, crash)) = w.ended {
            let how = if crash { "crashed" } else { "ended" };
            out.push_str(&format!("; the leader {how} at t={at}, nobody leads since"));
        }
        out.push('\n');
        for (i, c) in w.cands.iter().enumerate() {
            let proc = match &c.proc {
                Proc::Wait(f) => format!("waits (sees {:?})", f.lock),
                Proc::Lead(h) => format!(
                    "leads token{} lock uid{} lost {:?} down {:?}",
                    h.token, h.lock_uid, h.lost, h.down
                ),
                Proc::Down => "down".into(),
            };
            let allowed = if m.allowed(&w, i) { " ALLOWED" } else { "" };
            let work = match &c.work {
                Some(work) => format!("; works (token{}, until {:?})", work.token, work.until),
                None => String::new(),
            };
            let dead = match (c.dead, c.kill_by) {
                (true, _) => "; KILLED",
                (false, Some(_)) => "; being killed",
                _ => "",
            };
            out.push_str(&format!(
                "    p{i}-{} clock {}: {proc}{allowed}{work}{dead}; in flight {:?}\n",
                c.gen,
                w.real + c.skew,
                c.flight.as_ref().map(|f| (f.why, f.sent, &f.answer))
            ));
        }
        if let Some(a) = action {
            out.push_str(&format!("  -> {a:?}\n"));
        }
    }
    out
}
