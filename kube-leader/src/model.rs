//! The model checker of the Lease strategy (issue 43, first slice): the shipped decision code
//! ([`decide`], [`decide_absent`], [`defer_to_controller`], [`defer_to_preferred`],
//! [`record_for`] and the [`Term`] machine), driven through every interleaving of a small world
//! by [stateright](https://docs.rs/stateright)'s breadth-first checker.
//!
//! The world (see docs/safety.md, "What is proven, and under which assumptions"):
//! - an API server holding one Lease as a linearizable store: a global revision
//!   (resourceVersion) bumped by every write, create-if-absent, replace with a resourceVersion
//!   precondition (compare-and-swap), get, and delete; every commit queues a watch event for
//!   every live candidate, delivered in order and as late as the model likes, or replaced by a
//!   re-list;
//! - `candidates` candidates with one identity each, driving the real code as the campaign
//!   (`lease/campaign.rs`) and the keeper (`lease/keeper.rs`) do, with one request in flight at
//!   a time, as they have;
//! - a global real time in whole seconds (ticks) up to `horizon`, and per candidate a monotonic
//!   local clock `real + skew`, `skew` in `0..=drift` changing at every tick: over any interval
//!   the local clock and real time differ by at most `drift` ticks;
//! - faults: a request lost before it commits or after (its caller sees a timeout), any answer
//!   or watch event delivered arbitrarily late (a paused process, a slow network), a crash
//!   (the process's request in flight may still commit) and a restart with the same identity
//!   and a new instance id, a deletion of the Lease, a voluntary release.
//!
//! The properties: at no real instant are two candidates allowed to work (a candidate is
//! allowed while it leads, has not lost, and its clock has not reached the term's
//! `confirmed_until`: what the supervisor enforces), and each term's fencing token is greater
//! than every earlier term's. With fenced writes ([`Settings::fenced_writes`]): a candidate
//! that led sends a write with its latest term's token at any later time; the fence reads the
//! lock (the shipped [`lease_state`]) and later judges the write (the shipped [`judge`]) against
//! the stamp on the object as it is then; the object's stamp never goes back and every refusal
//! matches the token order ([`FENCE_ORDER`]), and a leader allowed to work throughout is never
//! refused ([`FENCE_LETS_THE_LEADER`]). In a fair world ([`Settings::prompt`]: nothing
//! late or lost; real time moves on only once every due write, answer and event is handled):
//! when the leader crashes or releases, someone leads within lease duration + retry period
//! ([`LEADS_AFTER_STOP`]), and, with releases naming a successor, a crash is taken over within
//! the same bound ([`CRASH_NOT_DELAYED`]).
//!
//! Mutants ([`Mutant`]) change the inputs or outputs around the real code (or the model's own
//! driver of it, as the campaign's retry after a lost race), never the shipped code: the
//! checker must refute each of them.

use std::{
    collections::{BTreeMap, VecDeque},
    fmt,
    hash::{Hash, Hasher},
    sync::OnceLock,
    time::{Duration, Instant as StdInstant},
};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use stateright::{Checker, Model, Property};
use tokio::time::Instant;

use crate::{
    api::Failure,
    fence::{
        judge::{judge, Write},
        lock::{lease_state, LockState},
    },
    lease::{
        coordinated::{coordinated_strategy, written_by_any},
        decide::{
            decide, decide_absent, defer_to_controller, defer_to_preferred, record_for, Absent, Decision,
            Observed,
        },
        record::{
            preferred_in, set_fencing_token, set_preferred, set_writer, written_by, LeaseRecord,
            INSTANCE_ANNOTATION,
        },
        term::{Every, Step, Term, Writer},
    },
    lock::{self, FENCING_TOKEN_ANNOTATION, HOLDER_ANNOTATION},
    successor::PREFERRED_HOLDER_ANNOTATION,
};

mod for_life;
mod shards;
mod tests;

/// A deliberately broken variant of the world, which the checker must refute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mutant {
    /// None: the shipped behaviour.
    None,
    /// Renewals are sent without their resourceVersion precondition (an unconditional update).
    NoPrecondition,
    /// A renewal's `confirmed_until` counted from when its answer arrived, not from when it was
    /// sent.
    ConfirmedFromAnswer,
    /// The fencing token is the record's `leaseTransitions`, not the winning write's revision.
    TokenFromTransitions,
    /// The fence judges a write without the stamp on the stored object (as if the webhook read
    /// `oldObject` without its annotation): it compares the token with the lock as read only.
    FenceIgnoresStamp,
    /// The fence compares the write's token plus one (a judge that accepts a token one lower
    /// than the stamp or the lock's).
    FenceOneLower,
    /// The fence reads the lock's token as the Lease's resourceVersion, ignoring the token the
    /// holder stored (what the fence knows before the holder's first renewal).
    LockFromVersion,
    /// A follower that lost a write race never writes again (its retry timer is never set).
    NoRetryAfterRace,
    /// A follower remembers the successor the last release it saw preferred, and defers to it
    /// on any takeover, an expired lease's included, for `successor_wait` from the expiry.
    StalePreferred,
}

/// The model's settings.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// How many candidates.
    pub(crate) candidates: usize,
    /// The lease duration, in ticks (seconds).
    pub(crate) lease: u64,
    /// The renew deadline, in ticks.
    pub(crate) renew_deadline: u64,
    /// The retry period, in ticks.
    pub(crate) retry: u64,
    /// The bound on clock drift: over any interval, a local clock and real time differ by at
    /// most this many ticks.
    pub(crate) drift: i64,
    /// The last real tick explored.
    pub(crate) horizon: i64,
    /// How many crashes (each followed by a possible restart) in a run.
    pub(crate) crashes: u8,
    /// How many deletions of the Lease in a run.
    pub(crate) deletes: u8,
    /// How many lost requests in a run.
    pub(crate) losses: u8,
    /// How many voluntary releases in a run.
    pub(crate) releases: u8,
    /// How many watch re-lists in a run.
    pub(crate) relists: u8,
    /// Deletions may come while a live candidate has never seen the Lease, and be followed by
    /// a restart (a process that never saw it): the documented limit (docs/safety.md, "Known
    /// limits": such a candidate cannot tell a first election from a deletion and creates the
    /// Lease at once). Off: every deletion is seen coming by candidates that knew the Lease.
    pub(crate) blind_deletes: bool,
    /// How many fenced writes (each read of the lock by the fence, then its verdict and commit)
    /// in a run.
    pub(crate) fenced_writes: u8,
    /// A fair world, for the liveness checks: no request or watch event is late, and every
    /// write a candidate's decision calls for is sent, before real time moves on (with retry
    /// `1 s`, a campaign's retry timer fires within every tick); no lost request, re-list or
    /// deletion.
    pub(crate) prompt: bool,
    /// Releases name the next candidate (`c<i+1>`) as the preferred successor.
    pub(crate) successor: bool,
    /// How long a candidate that is not the preferred successor defers to it, in ticks.
    pub(crate) successor_wait: u64,
    /// The broken variant, if any.
    pub(crate) mutant: Mutant,
}

impl Settings {
    /// The settings of the test run: 2 candidates, lease 4 s, renew deadline 2 s, retry 1 s,
    /// drift 1 s.
    pub(crate) fn small() -> Self {
        Self {
            candidates: 2,
            lease: 4,
            renew_deadline: 2,
            retry: 1,
            drift: 1,
            horizon: 6,
            crashes: 0,
            deletes: 0,
            losses: 0,
            releases: 0,
            relists: 0,
            blind_deletes: false,
            fenced_writes: 0,
            prompt: false,
            successor: false,
            successor_wait: 2,
            mutant: Mutant::None,
        }
    }

    /// The failover bound the docs promise, in ticks: lease duration plus retry period.
    pub(crate) fn failover_bound(&self) -> i64 {
        i64::try_from(self.lease + self.retry).expect("small")
    }
}

/// The model: [`Settings`] and the checker's interface.
#[derive(Debug, Clone)]
pub(crate) struct LeaseModel {
    s: Settings,
}

// === time ===

/// Tick 0 of every local clock, as a `tokio` instant (the real code's clock type).
fn base() -> Instant {
    static BASE: OnceLock<StdInstant> = OnceLock::new();
    Instant::from_std(*BASE.get_or_init(StdInstant::now))
}

/// The local instant of tick `t`.
fn at(t: i64) -> Instant {
    base() + Duration::from_secs(u64::try_from(t).expect("ticks are not negative"))
}

/// The local tick of an instant.
fn tick(i: Instant) -> i64 {
    i64::try_from(i.duration_since(base()).as_secs()).expect("small")
}

/// The wall clock at real tick `t` (wall clocks are only written, never read for expiry).
const WALL_ZERO: i64 = 1_800_000_000;
fn wall(t: i64) -> Timestamp {
    Timestamp::from_second(WALL_ZERO + t).expect("in range")
}
fn wall_tick(t: &MicroTime) -> i64 {
    t.0.as_second() - WALL_ZERO
}

// === the API server's Lease, abstracted ===

/// The Lease as the model's API server stores it: every field the election reads or writes,
/// in ticks. Converted to and from k8s-openapi's `Lease` at the boundary with the real code;
/// any other field there is a model error (it panics).
#[derive(Clone, PartialEq, Eq, Hash)]
struct Rec {
    rv: u64,
    holder: String,
    duration: i32,
    acquire: Option<i64>,
    renew: Option<i64>,
    transitions: i32,
    /// The writer annotation: instance and renewTime (real tick).
    writer: Option<(String, i64)>,
    /// The fencing-token annotations: holder and token.
    token: Option<(String, u64)>,
    /// The preferred-successor annotation, as written.
    preferred: Option<String>,
}

impl fmt::Debug for Rec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let holder = if self.holder.is_empty() {
            "(released)"
        } else {
            &self.holder
        };
        write!(
            f,
            "rv{} {holder} renew@{:?} dur{}",
            self.rv, self.renew, self.duration
        )?;
        if let Some((i, _)) = &self.writer {
            write!(f, " by {i}")?;
        }
        if let Some((_, t)) = &self.token {
            write!(f, " token{t}")?;
        }
        if let Some(p) = &self.preferred {
            let who = p.rsplit(' ').next().unwrap_or(p);
            write!(f, " prefers {who}")?;
        }
        Ok(())
    }
}

impl Rec {
    fn to_lease(&self) -> Lease {
        let mut a = BTreeMap::new();
        if let Some((instance, t)) = &self.writer {
            a.insert(
                INSTANCE_ANNOTATION.to_string(),
                format!("{instance} {}", wall(*t)),
            );
        }
        if let Some((holder, token)) = &self.token {
            a.insert(HOLDER_ANNOTATION.to_string(), holder.clone());
            a.insert(FENCING_TOKEN_ANNOTATION.to_string(), token.to_string());
        }
        if let Some(p) = &self.preferred {
            a.insert(PREFERRED_HOLDER_ANNOTATION.to_string(), p.clone());
        }
        Lease {
            metadata: ObjectMeta {
                name: Some("l".into()),
                namespace: Some("n".into()),
                resource_version: Some(self.rv.to_string()),
                annotations: (!a.is_empty()).then_some(a),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.holder.clone()),
                lease_duration_seconds: Some(self.duration),
                acquire_time: self.acquire.map(|t| MicroTime(wall(t))),
                renew_time: self.renew.map(|t| MicroTime(wall(t))),
                lease_transitions: Some(self.transitions),
                ..LeaseSpec::default()
            }),
        }
    }

    /// The Lease a candidate sends; `rv` is its resourceVersion (0: none).
    fn from_lease(l: &Lease) -> Self {
        let spec = l.spec.clone().unwrap_or_default();
        assert!(
            spec.strategy.is_none() && spec.preferred_holder.is_none(),
            "outside the model: {l:?}"
        );
        let mut writer = None;
        let mut preferred = None;
        let mut token = (None, None);
        for (k, v) in l.metadata.annotations.iter().flatten() {
            match k.as_str() {
                INSTANCE_ANNOTATION => {
                    let (i, t) = v.split_once(' ').expect("instance and time");
                    let t: Timestamp = t.parse().expect("a time");
                    writer = Some((i.to_string(), t.as_second() - WALL_ZERO));
                }
                HOLDER_ANNOTATION => token.0 = Some(v.clone()),
                FENCING_TOKEN_ANNOTATION => token.1 = Some(v.parse().expect("a token")),
                PREFERRED_HOLDER_ANNOTATION => preferred = Some(v.clone()),
                other => panic!("annotation outside the model: {other}"),
            }
        }
        let token = match token {
            (Some(h), Some(t)) => Some((h, t)),
            (None, None) => None,
            t => panic!("half a fencing token: {t:?}"),
        };
        Rec {
            rv: lock::parse_resource_version(l.metadata.resource_version.as_deref()).unwrap_or(0),
            holder: spec.holder_identity.unwrap_or_default(),
            duration: spec.lease_duration_seconds.unwrap_or(0),
            acquire: spec.acquire_time.as_ref().map(wall_tick),
            renew: spec.renew_time.as_ref().map(wall_tick),
            transitions: spec.lease_transitions.unwrap_or(0),
            writer,
            token,
            preferred,
        }
    }
}

// === hashable wrappers of the real code's state ===

fn hash_record<H: Hasher>(r: &LeaseRecord, h: &mut H) {
    r.holder.hash(h);
    r.lease_duration.hash(h);
    r.acquire_time.hash(h);
    r.renew_time.hash(h);
    r.transitions.hash(h);
}

/// The real [`Observed`], hashed by its fields.
#[derive(Clone, PartialEq)]
struct Obs(Observed);

impl Hash for Obs {
    fn hash<H: Hasher>(&self, h: &mut H) {
        let o = &self.0;
        hash_record(&o.record, h);
        o.resource_version.hash(h);
        o.observed_at.hash(h);
        (o.mine, &o.preferred, o.coordinated, o.by_kube_leader).hash(h);
    }
}

impl fmt::Debug for Obs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.0;
        write!(
            f,
            "saw rv{} {:?}@{}{}",
            o.resource_version.as_deref().unwrap_or("-"),
            o.record.holder,
            tick(o.observed_at),
            if o.mine { " (mine)" } else { "" }
        )
    }
}

/// The real [`Term`], hashed and compared by everything it holds.
#[derive(Clone)]
struct Held {
    term: Term<Every>,
    /// The handle was told the term is lost (a release under way).
    lost: bool,
}

impl Held {
    fn key(&self) -> impl Hash + PartialEq + '_ {
        let t = &self.term;
        let (pending, preferred) = t.model_rest();
        let (meta, spec) = (&t.lease().metadata, t.lease().spec.as_ref().expect("a spec"));
        (
            (&meta.resource_version, &meta.annotations),
            (
                &spec.holder_identity,
                spec.lease_duration_seconds,
                spec.lease_transitions,
            ),
            (
                spec.acquire_time.as_ref().map(|t| t.0),
                spec.renew_time.as_ref().map(|t| t.0),
            ),
            Rec2(t.record().clone()),
            pending.cloned().map(Rec2),
            preferred,
            (t.fencing_token(), t.last_sent(), t.next_renewal(), self.lost),
        )
    }
}

/// A [`LeaseRecord`], hashed by its fields.
#[derive(Clone, PartialEq)]
struct Rec2(LeaseRecord);
impl Hash for Rec2 {
    fn hash<H: Hasher>(&self, h: &mut H) {
        hash_record(&self.0, h)
    }
}

impl PartialEq for Held {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}
impl Hash for Held {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.key().hash(h)
    }
}
impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.term;
        write!(
            f,
            "term token{} on rv{} sent@{} confirmed_until@{} next@{}{}",
            t.fencing_token(),
            t.lease().metadata.resource_version.as_deref().unwrap_or("-"),
            tick(t.last_sent()),
            tick(t.confirmed_until()),
            tick(t.next_renewal()),
            if self.lost { " LOST" } else { "" }
        )
    }
}

// === the world's state ===

/// A watch event: the Lease as it is (`None`: absent), or as a re-list found it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Ev {
    lease: Option<Rec>,
    relisted: bool,
}

/// A request to the API server.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Req {
    Create(Rec),
    /// A replace; `precondition`: the resourceVersion it must find (`None`: unconditional).
    Replace {
        lease: Rec,
        precondition: Option<u64>,
    },
    Get,
}

/// The API server's answer (`Lost`: a timeout, the request lost before or after it committed).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Answer {
    Ok(Rec),
    Conflict,
    NotFound,
    Lost,
}

impl Answer {
    fn failure(&self) -> Failure {
        match self {
            Answer::Ok(_) => unreachable!("not a failure"),
            Answer::Conflict => Failure::Conflict,
            Answer::NotFound => Failure::NotFound,
            Answer::Lost => Failure::Transient(kube::Error::Api(Box::default())),
        }
    }
}

/// What a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Why {
    /// The campaign's create or takeover (or renewal of an earlier term of this process).
    Acquire,
    /// The campaign confirms a term won by a late answer (`confirm_term`).
    Confirm,
    /// The keeper's renewal.
    Renew,
    /// The keeper's re-read after a conflict.
    Reread,
    /// The keeper's release.
    Release,
}

/// The request of a candidate in flight.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Flight {
    req: Req,
    why: Why,
    /// When it was sent (local tick).
    sent: i64,
    /// Its answer, once the API server gave one (or it was lost).
    answer: Option<Answer>,
}

/// A campaign: what the candidate knows of the Lease (`lease/campaign.rs`).
#[derive(Debug, Clone, PartialEq, Hash)]
struct Follower {
    /// The watch has delivered its first list.
    synced: bool,
    /// The Lease as the watch shows it (`watch.current()`).
    current: Option<Rec>,
    observed: Option<Obs>,
    deleted: Option<Obs>,
    seen_before: bool,
    absent_since: Option<i64>,
    unknown_since: Option<i64>,
    /// [`Mutant::NoRetryAfterRace`]: this campaign lost a write race.
    lost_race: bool,
    /// [`Mutant::StalePreferred`]: the successor the last release it saw preferred.
    stale_preferred: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Hash)]
#[allow(clippy::large_enum_variant)] // states are cloned whole anyway
enum Role {
    Follow(Follower),
    Lead(Held),
    Down,
}

/// One candidate process.
#[derive(Debug, Clone, PartialEq, Hash)]
struct Cand {
    /// Its clock is `real + skew`.
    skew: i64,
    /// Restarts so far (its instance id is `c<i>.<incarnation>`).
    incarnation: u8,
    role: Role,
    /// Watch events not delivered yet.
    watch: VecDeque<Ev>,
    flight: Option<Flight>,
    /// The request in flight of a crashed incarnation: it may still commit.
    orphan: Option<Req>,
    /// The highest `leaseTransitions` this process saw (`Shared::transitions_for_create`).
    transitions_seen: Option<u32>,
    /// The fencing token of this candidate's latest term (kept after the term and across a
    /// crash: a write sent with it may reach the fence any time later). Only in runs with
    /// fenced writes.
    token: Option<u64>,
    /// Its fenced write the fence is judging: the token, and the lock as the fence read it.
    fencing: Option<Fencing>,
}

/// A fenced write between the fence's read of the lock and its verdict.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Fencing {
    token: u64,
    /// The writer was allowed to work when the fence read the lock.
    allowed: bool,
    /// The lock as read: `None`, missing; else its token, holder and whether exact.
    lock: Option<(u64, Option<String>, bool)>,
}

impl Fencing {
    fn lock(&self) -> LockState {
        match &self.lock {
            None => LockState::Missing,
            Some((token, holder, exact)) => LockState::Held {
                token: *token,
                holder: holder.clone(),
                exact: *exact,
            },
        }
    }
}

/// How the leader stopped, for the liveness checks.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Stopped {
    /// The real tick.
    at: i64,
    /// Which candidate.
    who: usize,
    /// A crash (else a release).
    crash: bool,
}

/// The world.
#[derive(Debug, Clone, PartialEq, Hash)]
pub(crate) struct World {
    real: i64,
    store: Option<Rec>,
    /// The global revision (etcd's): the last one given to a write.
    revision: u64,
    cands: Vec<Cand>,
    crashes: u8,
    deletes: u8,
    losses: u8,
    releases: u8,
    relists: u8,
    /// Terms begun so far, and the greatest fencing token among them.
    terms: u8,
    max_token: u64,
    /// A term began with a token not greater than an earlier term's.
    token_regressed: bool,
    /// The fenced object's stamp (`kube-leader.io/fenced-token`), if it was written.
    fenced: Option<u64>,
    /// The greatest token the fence accepted.
    fence_max: Option<u64>,
    /// Fenced writes so far.
    fence_writes: u8,
    /// The fence accepted a write with a token lower than one it accepted before.
    fence_regressed: bool,
    /// The fence's verdict disagreed with the token order (see [`World::fence_commit`]).
    fence_mismatch: bool,
    /// The fence refused a write of a candidate allowed to work from the fence's read of the
    /// lock to its verdict.
    fence_refused_leader: bool,
    /// The leader stopped and nobody leads since.
    stopped: Option<Stopped>,
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
    /// Candidate `i` takes in its next watch event.
    Watch(usize),
    /// Candidate `i`'s watch breaks and re-lists: its pending events are replaced by the Lease
    /// as it is.
    Relist(usize),
    /// Candidate `i`'s campaign writes what it decides.
    Attempt(usize),
    /// Candidate `i`'s term sends its renewal (it is due).
    Renew(usize),
    /// Candidate `i` stops its work and releases the Lease.
    Release(usize),
    /// Candidate `i` crashes.
    Crash(usize),
    /// Candidate `i` restarts: same identity, new instance id.
    Restart(usize),
    /// The orphaned request of candidate `i`'s crashed incarnation commits.
    OrphanCommits(usize),
    /// An administrator deletes the Lease.
    Delete,
    /// The fence reads the lock for a fenced write of candidate `i` (with its latest term's
    /// token).
    FenceRead(usize),
    /// The fence judges that write against the stored object's stamp, and the API server
    /// commits it if it passes (admission runs again on a conflict: the stamp is current).
    FenceCommit(usize),
}

impl Cand {
    fn identity(i: usize) -> String {
        format!("c{i}")
    }

    fn instance(&self, i: usize) -> String {
        format!("c{i}.{}", self.incarnation)
    }

    /// Whether this process knows the Lease exists: it leads, or its campaign saw it (now or
    /// in an earlier campaign).
    fn knows_the_lease(&self) -> bool {
        match &self.role {
            Role::Lead(_) => true,
            Role::Follow(f) => {
                f.seen_before || f.observed.is_some() || f.deleted.is_some() || f.unknown_since.is_some()
            }
            Role::Down => false,
        }
    }

    fn follower(seen_before: bool) -> Role {
        Role::Follow(Follower {
            synced: false,
            current: None,
            observed: None,
            deleted: None,
            seen_before,
            absent_since: None,
            unknown_since: None,
            lost_race: false,
            stale_preferred: None,
        })
    }
}

impl World {
    fn now(&self, i: usize) -> i64 {
        self.real + self.cands[i].skew
    }

    /// Whether candidate `i` may work now: it leads, has not lost, and its clock has not
    /// reached the term's `confirmed_until`.
    fn allowed(&self, i: usize) -> bool {
        match &self.cands[i].role {
            Role::Lead(h) => !h.lost && at(self.now(i)) < h.term.confirmed_until(),
            _ => false,
        }
    }

    /// A commit: every live candidate's watch will show the Lease as it is now.
    fn notify(&mut self) {
        let ev = Ev {
            lease: self.store.clone(),
            relisted: false,
        };
        for c in &mut self.cands {
            if let Role::Follow(_) = c.role {
                c.watch.push_back(ev.clone());
            }
        }
    }

    /// The API server handles `req`.
    fn apply(&mut self, req: &Req) -> Answer {
        let answer = match (req, &self.store) {
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
        let mut written = answer.clone();
        written.rv = self.revision;
        self.store = Some(written.clone());
        self.notify();
        Answer::Ok(written)
    }

    /// Candidate `i`'s term is over: it campaigns again, on a new watch.
    fn lose(&mut self, i: usize) {
        let list = Ev {
            lease: self.store.clone(),
            relisted: false,
        };
        let c = &mut self.cands[i];
        c.role = Cand::follower(true);
        c.watch = VecDeque::from([list]);
    }

    /// The fence reads the lock for a fenced write of candidate `i`, as the webhook does (a GET:
    /// the Lease as it is now, through the shipped [`lease_state`]).
    fn fence_read(&mut self, i: usize, mutant: Mutant) {
        self.fence_writes += 1;
        let lock = self.store.as_ref().map(|r| {
            let mut lease = r.to_lease();
            if mutant == Mutant::LockFromVersion {
                set_fencing_token(&mut lease, None);
            }
            match lease_state(&lease).expect("a resourceVersion") {
                LockState::Held { token, holder, exact } => (token, holder, exact),
                LockState::Missing => unreachable!("a Lease read is held"),
            }
        });
        let token = self.cands[i].token.expect("a term's token");
        let allowed = self.allowed(i);
        self.cands[i].fencing = Some(Fencing { token, allowed, lock });
    }

    /// The fence's verdict on candidate `i`'s fenced write (the shipped [`judge`]), with the lock
    /// as it read it and the stamp on the object as it is at the commit; the object is written
    /// and stamped if it passes. The verdict must match the token order: refused exactly when the
    /// lock was missing or showed a greater token, or the object carries one.
    fn fence_commit(&mut self, i: usize, mutant: Mutant) {
        let f = self.cands[i].fencing.take().expect("a fenced write");
        let lock = f.lock();
        let stored = match mutant {
            Mutant::FenceIgnoresStamp => None,
            _ => self.fenced.map(Ok),
        };
        let user = Cand::identity(i);
        let write = Write {
            operation: "UPDATE",
            resource: "configmaps",
            namespace: "n",
            name: "work",
            user: &user,
        };
        let judged = match mutant {
            Mutant::FenceOneLower => f.token + 1,
            _ => f.token,
        };
        let verdict = judge(write, judged, stored, Some(Some(Ok(judged))), "n/l", &lock);
        let older = match &lock {
            LockState::Missing => true,
            LockState::Held { token, .. } => f.token < *token,
        } || self.fenced.is_some_and(|s| f.token < s);
        if verdict.is_ok() == older {
            self.fence_mismatch = true;
        }
        if verdict.is_err() && f.allowed && self.allowed(i) {
            self.fence_refused_leader = true;
        }
        if verdict.is_ok() {
            if self.fence_max.is_some_and(|m| f.token < m) {
                self.fence_regressed = true;
            }
            self.fence_max = Some(self.fence_max.map_or(f.token, |m| m.max(f.token)));
            self.fenced = Some(f.token);
        }
    }

    /// Whether a candidate other than `who` is up.
    fn others_live(&self, who: usize) -> bool {
        self.cands
            .iter()
            .enumerate()
            .any(|(j, c)| j != who && c.role != Role::Down)
    }

    /// The leader stopped (`crash`: else it released) at least `bound` ticks ago, a candidate
    /// that was up then still is, and nobody leads.
    fn leaderless_past(&self, bound: i64, crash_only: bool) -> bool {
        self.stopped
            .as_ref()
            .is_some_and(|s| (s.crash || !crash_only) && self.real - s.at > bound && self.others_live(s.who))
    }
}

// === the campaign, as lease/campaign.rs drives the decisions ===

impl LeaseModel {
    fn lease_duration(&self) -> Duration {
        Duration::from_secs(self.s.lease)
    }

    /// `Campaign::decide`.
    fn decide(&self, f: &mut Follower, identity: &str, now: i64) -> Decision {
        let (now, fallback) = (at(now), self.lease_duration());
        if let Some(Obs(obs)) = &f.observed {
            f.absent_since = None;
            let decision = decide(Some(obs), identity, now, fallback);
            let decision = defer_to_controller(decision, obs, now, fallback);
            let wait = Duration::from_secs(self.s.successor_wait);
            let decision = defer_to_preferred(decision, obs, identity, now, wait);
            if let (Mutant::StalePreferred, Some(p)) = (self.s.mutant, &f.stale_preferred) {
                // The stale memory fed to the shipped deferral: the record taken for a release
                // preferring `p`, seen at its expiry.
                let mut stale = obs.clone();
                stale.record.holder = None;
                stale.preferred = Some(p.clone());
                stale.observed_at = obs.expires_at(fallback);
                return defer_to_preferred(decision, &stale, identity, now, wait);
            }
            return decision;
        }
        let since = at(*f.absent_since.get_or_insert(tick(now)));
        let absent = match (&f.deleted, f.unknown_since) {
            (Some(Obs(d)), _) => Absent::Deleted(d),
            (None, Some(since)) => Absent::Unknown { since: at(since) },
            (None, None) if f.seen_before => Absent::Unknown { since },
            (None, None) => Absent::Never,
        };
        decide_absent(absent, identity, now, fallback)
    }

    /// `Campaign::seen` and `Campaign::absent`.
    fn absorb(&self, c: &mut Cand, f: &mut Follower, ev: Ev, instance: &str, now: i64) {
        f.synced = true;
        f.current = ev.lease.clone();
        match ev.lease {
            Some(rec) => {
                let lease = rec.to_lease();
                let record = LeaseRecord::from_lease(&lease);
                let mine = written_by(&lease, &record, instance);
                let by_kube_leader = written_by_any(&lease, &record);
                let preferred = preferred_in(&lease, &record);
                if self.s.mutant == Mutant::StalePreferred && preferred.is_some() {
                    f.stale_preferred = preferred.clone();
                }
                let coordinated = coordinated_strategy(&lease).is_some();
                let prev = f.observed.as_ref().map(|o| &o.0);
                let next = Observed::update(prev, record, lease.metadata.resource_version.clone(), at(now))
                    .written_by_me(mine)
                    .preferring(preferred)
                    .coordinated(coordinated)
                    .written_by_kube_leader(by_kube_leader);
                let t = next.record.transitions;
                c.transitions_seen = Some(c.transitions_seen.map_or(t, |s| s.max(t)));
                f.observed = Some(Obs(next));
                f.deleted = None;
                f.unknown_since = None;
            }
            None => {
                let last = f.observed.take();
                if ev.relisted && (last.is_some() || f.deleted.is_some()) {
                    f.deleted = None;
                    f.unknown_since = Some(now);
                } else if let Some(last) = last {
                    f.deleted = Some(last);
                }
            }
        }
    }

    /// `Campaign::attempt` and `Campaign::write`: the request of a decision to write.
    fn acquire(&self, c: &Cand, f: &Follower, i: usize, decision: &Decision, real: i64) -> Req {
        let observed = f.observed.as_ref().map(|o| &o.0);
        let identity = Cand::identity(i);
        let mut record = record_for(decision, observed, &identity, self.lease_duration(), wall(real));
        let seconds = i32::try_from(self.s.lease).expect("small");
        if *decision == Decision::Create {
            record.transitions = c.transitions_seen.map_or(0, |s| s + 1);
            let mut spec = LeaseSpec::default();
            record.write_to(&mut spec, seconds);
            let mut lease = Lease {
                spec: Some(spec),
                ..Lease::default()
            };
            set_writer(&mut lease, &c.instance(i), &record);
            return Req::Create(Rec::from_lease(&lease));
        }
        let mut lease = f.current.as_ref().expect("a takeover of a Lease seen").to_lease();
        set_fencing_token(&mut lease, None);
        set_preferred(&mut lease, None);
        Self::replace(lease, &record, seconds, &c.instance(i))
    }

    /// `Campaign::replace`: `record` written into `lease`, `lease`'s version the precondition.
    fn replace(mut lease: Lease, record: &LeaseRecord, seconds: i32, instance: &str) -> Req {
        record.write_to(lease.spec.get_or_insert_with(LeaseSpec::default), seconds);
        set_writer(&mut lease, instance, record);
        let lease = Rec::from_lease(&lease);
        Req::Replace {
            precondition: Some(lease.rv),
            lease,
        }
    }

    /// `Campaign::confirm_term` and `Campaign::lead`: the write `written`, sent at `sent`, won.
    fn won(&self, w: &mut World, i: usize, written: Rec, sent: i64) {
        let now = w.now(i);
        let lease = written.to_lease();
        let record = LeaseRecord::from_lease(&lease);
        if now - sent >= i64::try_from(self.s.renew_deadline).expect("small") {
            // Answered after the renew deadline: renew before leading.
            let mut record = record;
            record.renew_time = Some(wall(w.real));
            let seconds = i32::try_from(self.s.lease).expect("small");
            let req = Self::replace(lease, &record, seconds, &w.cands[i].instance(i));
            w.cands[i].flight = Some(Flight {
                req,
                why: Why::Confirm,
                sent: now,
                answer: None,
            });
            return;
        }
        let token = match self.s.mutant {
            Mutant::TokenFromTransitions => u64::from(record.transitions),
            _ => lock::fencing_token(
                lease.metadata.resource_version.as_deref(),
                u64::from(record.transitions),
            ),
        };
        if w.terms > 0 && token <= w.max_token {
            w.token_regressed = true;
        }
        w.terms = w.terms.saturating_add(1);
        w.max_token = w.max_token.max(token);
        w.stopped = None;
        let t = u64::from(record.transitions);
        let c = &mut w.cands[i];
        if self.s.fenced_writes > 0 {
            c.token = Some(token);
        }
        c.transitions_seen = Some(c.transitions_seen.map_or(t as u32, |s| s.max(t as u32)));
        let writer = Writer {
            identity: Cand::identity(i),
            instance: c.instance(i),
            lease_duration_seconds: i32::try_from(self.s.lease).expect("small"),
            renew_deadline: Duration::from_secs(self.s.renew_deadline),
            yields_to_coordinated: true,
        };
        let retry = Duration::from_secs(self.s.retry);
        let term = Term::new(
            writer,
            lease,
            record,
            token,
            at(sent),
            Every::new(retry, at(sent)),
        );
        c.role = Role::Lead(Held { term, lost: false });
        // A leader's watch can only end its term early: the model leaves it out (a leader that
        // never hears of a newer holder is the worst case for the properties).
        c.watch.clear();
    }

    // === the keeper, as lease/keeper.rs drives the term ===

    /// What a step of the term comes to: an end makes the candidate campaign again.
    fn step(w: &mut World, i: usize, step: Step) {
        if let Step::End(_) = step {
            w.lose(i);
        }
    }

    /// Candidate `i` takes in the answer to its request.
    fn answered(&self, w: &mut World, i: usize) {
        let flight = w.cands[i].flight.take().expect("a request");
        let answer = flight.answer.expect("answered");
        let now = w.now(i);
        match (flight.why, &mut w.cands[i].role) {
            (Why::Acquire | Why::Confirm, Role::Follow(f)) => match answer {
                Answer::Ok(written) => self.won(w, i, written, flight.sent),
                Answer::Conflict | Answer::NotFound if self.s.mutant == Mutant::NoRetryAfterRace => {
                    f.lost_race = true;
                }
                // A failure: decide again on what the watch shows.
                _ => {}
            },
            (Why::Renew, Role::Lead(h)) => {
                let step = match answer {
                    Answer::Ok(written) => {
                        let sent = match self.s.mutant {
                            Mutant::ConfirmedFromAnswer => now,
                            _ => flight.sent,
                        };
                        h.term.renewed(written.to_lease(), at(sent))
                    }
                    failed => h.term.write_failed(&failed.failure(), at(now)),
                };
                if let Step::Reread { .. } = step {
                    w.cands[i].flight = Some(Flight {
                        req: Req::Get,
                        why: Why::Reread,
                        sent: now,
                        answer: None,
                    });
                    return;
                }
                Self::step(w, i, step);
            }
            (Why::Reread, Role::Lead(h)) => {
                let current = match answer {
                    Answer::Ok(l) => Ok(l.to_lease()),
                    failed => Err(failed.failure()),
                };
                let step = h.term.reread(current, at(now));
                Self::step(w, i, step);
            }
            (Why::Release, Role::Lead(_)) => w.lose(i),
            (why, role) => unreachable!("{why:?} answered to {role:?}"),
        }
    }
}

impl Model for LeaseModel {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        let n = self.s.candidates;
        let cand = |skew| Cand {
            skew,
            incarnation: 0,
            role: Cand::follower(false),
            watch: VecDeque::from([Ev {
                lease: None,
                relisted: false,
            }]),
            flight: None,
            orphan: None,
            transitions_seen: None,
            token: None,
            fencing: None,
        };
        let start = [
            Action::Watch(0),
            Action::Attempt(0),
            Action::Commit(0),
            Action::Answer(0),
        ];
        let followers = (1..n).flat_map(|i| [Action::Watch(i), Action::Watch(i)]);
        let start: Vec<Action> = start.into_iter().chain(followers).collect();
        skews(n, self.s.drift, &vec![0; n])
            .into_iter()
            .map(|skews| World {
                real: 0,
                store: None,
                revision: 0,
                cands: skews.into_iter().map(cand).collect(),
                crashes: 0,
                deletes: 0,
                losses: 0,
                releases: 0,
                relists: 0,
                terms: 0,
                max_token: 0,
                token_regressed: false,
                fenced: None,
                fence_max: None,
                fence_writes: 0,
                fence_regressed: false,
                fence_mismatch: false,
                fence_refused_leader: false,
                stopped: None,
            })
            .map(|w| {
                // The first term: c0 created the Lease, and the others saw it.
                start
                    .iter()
                    .fold(w, |w, a| self.next_state(&w, a.clone()).expect("a step"))
            })
            .collect()
    }

    fn actions(&self, w: &World, actions: &mut Vec<Action>) {
        if w.real < self.s.horizon {
            let now: Vec<i64> = w.cands.iter().map(|c| c.skew).collect();
            let one_change = |v: &Vec<i64>| v.iter().zip(&now).filter(|(a, b)| a != b).count() <= 1;
            let next = skews(w.cands.len(), self.s.drift, &now)
                .into_iter()
                .filter(one_change);
            actions.extend(next.map(Action::Tick));
        }
        let witnessed = || w.cands.iter().all(Cand::knows_the_lease);
        if w.deletes < self.s.deletes && w.store.is_some() && (self.s.blind_deletes || witnessed()) {
            actions.push(Action::Delete);
        }
        for (i, c) in w.cands.iter().enumerate() {
            if c.orphan.is_some() {
                actions.push(Action::OrphanCommits(i));
            }
            if c.fencing.is_some() {
                actions.push(Action::FenceCommit(i));
            } else if c.token.is_some() && w.fence_writes < self.s.fenced_writes {
                actions.push(Action::FenceRead(i));
            }
            if c.role == Role::Down {
                if self.s.blind_deletes || w.deletes == 0 {
                    actions.push(Action::Restart(i));
                }
                continue;
            }
            if w.crashes < self.s.crashes {
                actions.push(Action::Crash(i));
            }
            if !c.watch.is_empty() && c.flight.is_none() {
                actions.push(Action::Watch(i));
            }
            if !c.watch.is_empty() && w.relists < self.s.relists {
                actions.push(Action::Relist(i));
            }
            match &c.flight {
                Some(f) if f.answer.is_none() => {
                    actions.push(Action::Commit(i));
                    if w.losses < self.s.losses {
                        actions.extend([Action::LoseBefore(i), Action::LoseAfter(i)]);
                    }
                }
                Some(_) => actions.push(Action::Answer(i)),
                None => match &c.role {
                    Role::Follow(f) if f.synced && !f.lost_race => {
                        let mut f = f.clone();
                        let d = self.decide(&mut f, &Cand::identity(i), w.now(i));
                        if matches!(d, Decision::Create | Decision::Takeover | Decision::Renew) {
                            actions.push(Action::Attempt(i));
                        }
                    }
                    Role::Lead(h) if !h.lost => {
                        if at(w.now(i)) >= h.term.next_renewal() {
                            actions.push(Action::Renew(i));
                        }
                        if w.releases < self.s.releases {
                            actions.push(Action::Release(i));
                        }
                    }
                    _ => {}
                },
            }
        }
        if self.s.prompt && actions.iter().any(Action::is_due) {
            // A fair world: what is due happens before real time moves on.
            actions.retain(|a| !matches!(a, Action::Tick(_)));
        }
    }

    fn next_state(&self, last: &World, action: Action) -> Option<World> {
        let mut w = last.clone();
        match action {
            Action::Tick(skews) => {
                w.real += 1;
                for (c, s) in w.cands.iter_mut().zip(skews) {
                    c.skew = s;
                }
            }
            Action::Delete => {
                w.deletes += 1;
                w.revision += 1;
                w.store = None;
                w.notify();
            }
            Action::Commit(i) | Action::LoseAfter(i) => {
                let req = w.cands[i].flight.as_ref().expect("a request").req.clone();
                let mut answer = w.apply(&req);
                if let Action::LoseAfter(_) = action {
                    w.losses += 1;
                    answer = Answer::Lost;
                }
                w.cands[i].flight.as_mut().expect("a request").answer = Some(answer);
            }
            Action::LoseBefore(i) => {
                w.losses += 1;
                w.cands[i].flight.as_mut().expect("a request").answer = Some(Answer::Lost);
            }
            Action::Answer(i) => self.answered(&mut w, i),
            Action::Watch(i) => {
                let now = w.now(i);
                let instance = w.cands[i].instance(i);
                let c = &mut w.cands[i];
                let ev = c.watch.pop_front().expect("an event");
                match std::mem::replace(&mut c.role, Role::Down) {
                    Role::Follow(mut f) => {
                        self.absorb(c, &mut f, ev, &instance, now);
                        // The campaign decides at once on every event.
                        if f.synced {
                            self.decide(&mut f, &Cand::identity(i), now);
                        }
                        c.role = Role::Follow(f);
                    }
                    Role::Lead(mut h) => {
                        let step = match &ev.lease {
                            Some(l) => h.term.watched(&l.to_lease()),
                            None => h.term.deleted(),
                        };
                        c.role = Role::Lead(h);
                        Self::step(&mut w, i, step);
                    }
                    Role::Down => unreachable!("a down candidate has no watch"),
                }
            }
            Action::Relist(i) => {
                w.relists += 1;
                let ev = Ev {
                    lease: w.store.clone(),
                    relisted: true,
                };
                w.cands[i].watch = VecDeque::from([ev]);
            }
            Action::Attempt(i) => {
                let (now, real) = (w.now(i), w.real);
                let c = &w.cands[i];
                let Role::Follow(f) = &c.role else { unreachable!() };
                let mut f = f.clone();
                let decision = self.decide(&mut f, &Cand::identity(i), now);
                let req = self.acquire(c, &f, i, &decision, real);
                let c = &mut w.cands[i];
                c.role = Role::Follow(f);
                c.flight = Some(Flight {
                    req,
                    why: Why::Acquire,
                    sent: now,
                    answer: None,
                });
            }
            Action::Renew(i) => {
                let (now, real) = (w.now(i), w.real);
                let mutant = self.s.mutant;
                let c = &mut w.cands[i];
                let Role::Lead(h) = &mut c.role else {
                    unreachable!()
                };
                match h.term.renew(at(now), wall(real)) {
                    Step::Renew { lease, .. } => {
                        let lease = Rec::from_lease(&lease);
                        let precondition = (mutant != Mutant::NoPrecondition).then_some(lease.rv);
                        c.flight = Some(Flight {
                            req: Req::Replace { lease, precondition },
                            why: Why::Renew,
                            sent: now,
                            answer: None,
                        });
                    }
                    step => Self::step(&mut w, i, step),
                }
            }
            Action::Release(i) => {
                let (now, real) = (w.now(i), w.real);
                w.releases += 1;
                if self.s.prompt && w.stopped.is_none() {
                    w.stopped = Some(Stopped {
                        at: real,
                        who: i,
                        crash: false,
                    });
                }
                let successor = self.s.successor.then(|| Cand::identity((i + 1) % w.cands.len()));
                let c = &mut w.cands[i];
                let Role::Lead(h) = &mut c.role else {
                    unreachable!()
                };
                if !h.term.may_release(at(now), None) {
                    // Past the renew deadline: the keeper ends without writing.
                    w.lose(i);
                    return Some(w);
                }
                h.lost = true;
                let lease = Rec::from_lease(&h.term.release_write(successor.as_deref(), wall(real)));
                c.flight = Some(Flight {
                    req: Req::Replace {
                        precondition: Some(lease.rv),
                        lease,
                    },
                    why: Why::Release,
                    sent: now,
                    answer: None,
                });
            }
            Action::Crash(i) => {
                w.crashes += 1;
                let leads = matches!(&w.cands[i].role, Role::Lead(h) if !h.lost);
                if self.s.prompt && leads && w.stopped.is_none() {
                    w.stopped = Some(Stopped {
                        at: w.real,
                        who: i,
                        crash: true,
                    });
                }
                let c = &mut w.cands[i];
                c.orphan = c.flight.take().filter(|f| f.answer.is_none()).map(|f| f.req);
                c.role = Role::Down;
                c.watch.clear();
            }
            Action::Restart(i) => {
                let list = Ev {
                    lease: w.store.clone(),
                    relisted: false,
                };
                let c = &mut w.cands[i];
                c.incarnation += 1;
                c.role = Cand::follower(false);
                c.transitions_seen = None;
                c.watch = VecDeque::from([list]);
            }
            Action::OrphanCommits(i) => {
                let req = w.cands[i].orphan.take().expect("an orphan");
                w.apply(&req);
            }
            Action::FenceRead(i) => w.fence_read(i, self.s.mutant),
            Action::FenceCommit(i) => w.fence_commit(i, self.s.mutant),
        }
        Some(w)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut all = vec![
            Property::always(ONE_ALLOWED, |_, w: &World| {
                (0..w.cands.len()).filter(|&i| w.allowed(i)).count() <= 1
            }),
            Property::always(TOKENS_INCREASE, |_, w: &World| !w.token_regressed),
            Property::sometimes(SECOND_TERM, |_, w: &World| w.terms >= 2),
        ];
        if self.s.fenced_writes > 0 {
            all.push(Property::always(FENCE_ORDER, |_, w: &World| {
                !w.fence_regressed && !w.fence_mismatch
            }));
        }
        if self.s.fenced_writes > 0 {
            all.push(Property::always(FENCE_LETS_THE_LEADER, |_, w: &World| {
                !w.fence_refused_leader
            }));
        }
        if self.s.prompt {
            all.push(Property::always(LEADS_AFTER_STOP, |m: &Self, w: &World| {
                !w.leaderless_past(m.s.failover_bound(), false)
            }));
        }
        if self.s.prompt && self.s.successor {
            all.push(Property::always(CRASH_NOT_DELAYED, |m: &Self, w: &World| {
                !w.leaderless_past(m.s.failover_bound(), true)
            }));
        }
        // A mutant is checked against the property it breaks alone: the run stops at the first
        // (shortest) counterexample.
        let target = match self.s.mutant {
            Mutant::None => return all,
            Mutant::NoPrecondition | Mutant::ConfirmedFromAnswer => ONE_ALLOWED,
            Mutant::TokenFromTransitions => TOKENS_INCREASE,
            Mutant::FenceIgnoresStamp | Mutant::FenceOneLower => FENCE_ORDER,
            Mutant::LockFromVersion => FENCE_LETS_THE_LEADER,
            Mutant::NoRetryAfterRace => LEADS_AFTER_STOP,
            Mutant::StalePreferred => CRASH_NOT_DELAYED,
        };
        all.into_iter().filter(|p| p.name == target).collect()
    }
}

/// The property: at no real instant are two candidates allowed to work.
pub(crate) const ONE_ALLOWED: &str = "at most one candidate allowed to work";
/// The property: every term's fencing token is greater than every earlier term's.
pub(crate) const TOKENS_INCREASE: &str = "fencing tokens increase";
/// Not a safety property: the model reaches a second term (it is not vacuous).
pub(crate) const SECOND_TERM: &str = "a second term begins";
/// The property, in runs with fenced writes: the fence never accepts a write whose token is
/// lower than one it accepted, and refuses exactly the writes whose token is lower than the
/// lock's (as read) or the object's stamp, or whose lock is missing.
pub(crate) const FENCE_ORDER: &str =
    "fencing tokens never decrease per lock, and a fence refusal matches the token order";
/// The property, in runs with fenced writes: a write of a candidate allowed to work from the
/// fence's read of the lock to its verdict passes (the fence refuses no leader that may work).
pub(crate) const FENCE_LETS_THE_LEADER: &str = "the fence lets an allowed leader's writes through";
/// The property, in a fair world ([`Settings::prompt`]): when the leader stops (a crash, a
/// release) and another candidate is up, someone leads within lease duration + retry period.
pub(crate) const LEADS_AFTER_STOP: &str = "someone leads within lease + retry after the leader stops";
/// The property, in a fair world where releases name a successor: a crash is taken over within
/// the same bound.
pub(crate) const CRASH_NOT_DELAYED: &str = "the successor preference never delays a crash failover";

impl Action {
    /// In a fair world, what must happen before real time moves on: everything but a tick and
    /// the faults (a crash, a restart, a release).
    fn is_due(&self) -> bool {
        !matches!(
            self,
            Action::Tick(_) | Action::Crash(_) | Action::Restart(_) | Action::Release(_)
        )
    }
}

/// Every vector of `n` skews in `0..=drift` that keeps each clock monotonic across a tick from
/// `now` (a skew may fall by at most one).
fn skews(n: usize, drift: i64, now: &[i64]) -> Vec<Vec<i64>> {
    let mut all = vec![vec![]];
    for prev in now.iter().take(n) {
        all = all
            .into_iter()
            .flat_map(|v: Vec<i64>| {
                (0..=drift).filter(move |s| *s >= prev - 1).map(move |s| {
                    let mut v = v.clone();
                    v.push(s);
                    v
                })
            })
            .collect();
    }
    all
}

impl LeaseModel {
    pub(crate) fn new(s: Settings) -> Self {
        Self { s }
    }

    /// Explores the model breadth-first on `threads` threads; prints the states explored.
    pub(crate) fn check(self, threads: usize) -> impl Checker<Self> {
        let label = format!("{:?}", self.s);
        let started = StdInstant::now();
        let checker = self.checker().threads(threads).spawn_bfs().join();
        println!(
            "model {label}: {} states ({} unique), depth {}, {:.1?}",
            checker.state_count(),
            checker.unique_state_count(),
            checker.max_depth(),
            started.elapsed()
        );
        checker
    }
}

/// A counterexample, one line a step: the action and then every candidate and the store.
pub(crate) fn trace(path: stateright::Path<World, Action>) -> String {
    let mut out = String::new();
    for (state, action) in path.into_vec() {
        out.push_str(&format!("t={} store: {:?}", state.real, state.store));
        if let Some(f) = state.fenced {
            out.push_str(&format!("; fenced object stamped token{f}"));
        }
        if state.fence_regressed {
            out.push_str(" (BACK: the fence accepted a token lower than one it accepted)");
        }
        if state.fence_refused_leader {
            out.push_str(" (the fence refused a leader allowed to work)");
        }
        if state.fence_mismatch {
            out.push_str(" (the fence's verdict went against the token order)");
        }
        if let Some(s) = &state.stopped {
            let how = if s.crash { "crashed" } else { "released" };
            out.push_str(&format!(
                "; leader c{} {how} at t={}, nobody leads since",
                s.who, s.at
            ));
        }
        out.push('\n');
        for (i, c) in state.cands.iter().enumerate() {
            let role = match &c.role {
                Role::Follow(f) => match &f.stale_preferred {
                    Some(p) => format!("follows ({:?}), remembers {p:?} preferred", f.observed),
                    None => format!("follows ({:?})", f.observed),
                },
                Role::Lead(h) => format!("{h:?}"),
                Role::Down => "down".into(),
            };
            let allowed = if state.allowed(i) { " ALLOWED" } else { "" };
            let fence = match (&c.fencing, c.token) {
                (Some(f), _) => format!("; fenced write token{} (lock read: {:?})", f.token, f.lock),
                (None, Some(t)) => format!("; token{t}"),
                (None, None) => String::new(),
            };
            out.push_str(&format!(
                "    c{i}.{} clock {}: {role}{allowed}; in flight {:?}{fence}\n",
                c.incarnation,
                state.now(i),
                c.flight.as_ref().map(|f| (&f.why, f.sent, &f.answer))
            ));
        }
        if let Some(a) = action {
            out.push_str(&format!("  -> {a:?}\n"));
        }
    }
    out
}
