//! The table: the lifecycle of a shard's term and of the campaign, written once.
//!
//! A shard without a term has none (`Tenure::term` is `None`); a term begins [`Active`]
//! ([`Engine::begin`]) and goes on by the rows of [`next`]: (state, event) → next state, or the
//! end of the term. A pair the table does not list is ignored. This file is the only place
//! that can write a term's state ([`State`], whether its work stopped, when it was lost), begins
//! or ends one, or moves the campaign on ([`Campaign`]); the other parts of the engine tell it
//! events.
//!
//! | state | event | next |
//! | --- | --- | --- |
//! | `Active` | `Leave { until, release }` (handover, shutdown, given up) | `Leaving { until, release }` |
//! | `Active`, `Leaving` | `Lost` (deadline, other holder, twin, deleted) | `Gone` (lost now) |
//! | any | `Done` (the work stopped) | the same, its work stopped |
//! | `Leaving { release: true }`, work stopped | `Release` (in time) | `Releasing` |
//! | `Leaving`, work stopped | `Abandon` (not to be, or too late, released) | `Gone` |
//! | `Leaving` | `GraceOver` (the work did not stop in time) | `Gone` (lost now) |
//! | `Releasing` | `Released` (answered, or failed) | `Gone` |
//! | `Gone`, work stopped, no call in flight | `Finish` | no term |
//!
//! The types enforce it: the state lives in [`Machine`] (the engine's), [`Tenure`] (each
//! shard's term and hold-off) and [`MemberPace`] (the membership Lease's schedule), whose fields
//! are private to this module. The other parts read them through accessors and change them
//! only by the small methods below:
//! - [`hold_off`](Engine::hold_off) / [`lift_hold_off`](Engine::lift_hold_off): when shard
//!   `index` may be tried again after a lost race or an error (`Tenure::not_before`);
//! - [`replan`](Engine::replan) / [`replan_wanted`](Engine::replan_wanted) /
//!   [`replanning`](Engine::replanning): whether something changed that may change the plan
//!   (`Machine::dirty`);
//! - [`fail`](Engine::fail) / [`outcome`](Engine::outcome): the error that ends the campaign
//!   (`Machine::fatal`; the first one is kept);
//! - [`relist_started`](Engine::relist_started), [`relist_item`](Engine::relist_item),
//!   [`relist_done`](Engine::relist_done): a relist of the set in progress (`Machine::relist`);
//! - [`new_gen`](Engine::new_gen): the generation of a new term (`Machine::next_gen`);
//! - [`member_due_at`](Engine::member_due_at) / [`member_renewed`](Engine::member_renewed):
//!   when the membership Lease is written next (`MemberPace`).
//!
//! What is not here is either knowledge folded from the watch and the answers (the Leases
//! seen, the other candidates: [`watching`](super::watching)), fixed ([`setup`](super::setup)),
//! or the I/O edge's ([`io`](super::io): which keys have a call in flight, the queue, the
//! timers).
//!
//! [`Active`]: State::Active

use std::time::Duration;

use tokio::{sync::oneshot, time::Instant};

use k8s_openapi::api::coordination::v1::Lease;

use super::Engine;
use crate::{
    error::{Error, Result},
    leadership::KeeperHandle,
    lease::term::{Pace, Term},
    shards::scheduler::{Key, Phased},
};

/// Where a held term of a shard is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum State {
    /// Held; renewed.
    Active,
    /// Lost by handover or shutdown: still renewed until the work stops (`done`), then
    /// released; past `until`, given up unreleased.
    Leaving { until: Instant, release: bool },
    /// The release write is in flight.
    Releasing,
    /// No longer ours (deadline, another holder, deleted): waiting for the work to stop, for
    /// a while only (see [`Held::orphaned_from`]).
    Gone,
}

/// What happens to a term (see the [module](self)'s table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// Handed over, handed back on shutdown, or given up: the work stops until `until`, then
    /// the term is released if `release`.
    Leave { until: Instant, release: bool },
    /// Not ours any more: its renew deadline passed, another holder or a twin wrote it, or it
    /// was deleted.
    Lost,
    /// The work on it stopped (its `Leadership` was dropped).
    Done,
    /// Its work stopped and its release may be written (before the renew deadline).
    Release,
    /// Its work stopped and it is not released: not to be, or too late.
    Abandon,
    /// Its handover grace passed while the work went on.
    GraceOver,
    /// Its release was answered (written or not).
    Released,
    /// Not ours, its work stopped, no call in flight: the term is over.
    Finish,
}

/// One row of the table applied to a term's state: its [`State`], whether its work stopped
/// (`done`), and when it was lost (`lost_at`, set when a loss or the grace's end makes it
/// [`State::Gone`]). `None`: the table has no such row, nothing changed; `Some(Next::Over)`: the
/// term is over, for the caller to end. [`Engine::apply`] and the model checker call it.
pub(crate) fn advance<T>(
    state: &mut State,
    done: &mut bool,
    lost_at: &mut Option<T>,
    event: Event,
    now: T,
) -> Option<Next> {
    let to = next(*state, *done, event)?;
    if let Next::To(to) = to {
        if event == Event::Done {
            *done = true;
        }
        if to == State::Gone && matches!(event, Event::Lost | Event::GraceOver) {
            *lost_at = Some(now);
        }
        *state = to;
    }
    Some(to)
}

/// What a row of the table leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// The term goes on in this state.
    To(State),
    /// The term is over: the shard has no term.
    Over,
}

/// The campaign of the whole candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Campaign {
    /// The first list of the set has not completed.
    Listing,
    /// Campaigning; no shard is taken before this instant (see
    /// [`ShardsConfig::join_settle`](crate::shards::ShardsConfig::join_settle)).
    From(Instant),
    /// Handing every shard back.
    Stopping,
}

/// The engine's state that only this module writes: its fields are private to `table`, so no
/// other part of the engine can assign them; they read it through the accessors below.
pub(super) struct Machine {
    /// Relist in progress: the Leases listed so far.
    relist: Option<Vec<Lease>>,
    /// Where the campaign is.
    campaign: Campaign,
    /// Something changed that may change the plan: rebalance before the next wait.
    dirty: bool,
    /// The error that ends the campaign, if one did.
    fatal: Option<Error>,
    /// The generation of the last term begun (tells a term's answers from an earlier one's).
    next_gen: u64,
}

impl Default for Machine {
    fn default() -> Self {
        Self {
            relist: None,
            campaign: Campaign::Listing,
            dirty: false,
            fatal: None,
            next_gen: 0,
        }
    }
}

impl Machine {
    /// Where the campaign is.
    pub(super) fn campaign(&self) -> Campaign {
        self.campaign
    }
}

/// A shard's term and its hold-off: only this module begins or ends a term.
#[derive(Default)]
pub(super) struct Tenure {
    /// The term held, if any.
    term: Option<Held>,
    /// No acquisition before this (after a lost race or an error).
    not_before: Option<Instant>,
}

impl Tenure {
    /// The term held, if any.
    pub(super) fn term(&self) -> Option<&Held> {
        self.term.as_ref()
    }

    /// The term held, to drive its term machine (its lifecycle stays this module's).
    pub(super) fn term_mut(&mut self) -> Option<&mut Held> {
        self.term.as_mut()
    }

    /// No acquisition before this.
    pub(super) fn not_before(&self) -> Option<Instant> {
        self.not_before
    }
}

/// When the membership Lease is written: only this module moves it on.
#[derive(Default)]
pub(super) struct MemberPace {
    /// The pace of its renewals, from its first successful write on.
    renewal: Option<Phased>,
    /// When its last successful write was sent (its renewals are queued by the deadline after).
    last_sent: Option<Instant>,
    /// Retry the write not before this.
    next: Option<Instant>,
}

impl MemberPace {
    /// Retry the write not before this.
    pub(super) fn next(&self) -> Option<Instant> {
        self.next
    }

    /// When its last successful write was sent.
    pub(super) fn last_sent(&self) -> Option<Instant> {
        self.last_sent
    }
}

/// A term of a shard held by this process.
pub(super) struct Held {
    pub(super) gen: u64,
    pub(super) keeper: KeeperHandle,
    released: Option<oneshot::Sender<()>>,
    state: State,
    /// The work on it has stopped (the `Leadership` was dropped).
    done: bool,
    /// When it stopped being ours while its work went on (it became `Gone` undone).
    lost_at: Option<Instant>,
    /// The term's Lease, record, fencing token and renewals, judged by the term machine.
    pub(super) term: Term<Phased>,
}

/// The table (see the [module](self)): the next state of a term in `state` (its work stopped
/// if `done`) on `event`; `None` if the table has no such row.
pub(crate) fn next(state: State, done: bool, event: Event) -> Option<Next> {
    use {Event as E, Next::*, State as S};
    Some(match (state, event) {
        (S::Active, E::Leave { until, release }) => To(S::Leaving { until, release }),
        (S::Active | S::Leaving { .. }, E::Lost) => To(S::Gone),
        (s, E::Done) => To(s),
        (S::Leaving { release: true, .. }, E::Release) if done => To(S::Releasing),
        (S::Leaving { .. }, E::Abandon) if done => To(S::Gone),
        (S::Leaving { .. }, E::GraceOver) => To(S::Gone),
        (S::Releasing, E::Released) => To(S::Gone),
        (S::Gone, E::Finish) if done => Over,
        _ => return None,
    })
}

/// The campaign's table: `Listing` → `From` when the first list completes; anything →
/// `Stopping` on shutdown (or an error); `None` for anything else.
fn next_campaign(now: Campaign, to: Campaign) -> Option<Campaign> {
    match (now, to) {
        (Campaign::Listing, Campaign::From(t)) => Some(Campaign::From(t)),
        (_, Campaign::Stopping) => Some(Campaign::Stopping),
        _ => None,
    }
}

/// When the orphan of a term (lost at `lost_at` while its work goes on) stops guarding the shard
/// (see [`Held::orphaned_from`]); `None`: it is no such term.
pub(crate) fn orphaned_from(
    state: State,
    done: bool,
    lost_at: Option<Instant>,
    grace: Duration,
) -> Option<Instant> {
    if state != State::Gone || done {
        return None;
    }
    lost_at.map(|t| t + grace)
}

// === impl Held ===

impl Held {
    /// Where the term is.
    pub(super) fn state(&self) -> State {
        self.state
    }

    /// Whether the work on it has stopped.
    pub(super) fn done(&self) -> bool {
        self.done
    }

    /// Whether it is still ours: held, or being handed over.
    pub(super) fn live(&self) -> bool {
        matches!(self.state, State::Active | State::Leaving { .. })
    }

    /// When a term that is not ours any more, and whose `Leadership` is still kept, stops keeping
    /// the shard from being taken again: `grace` after its loss was told (the time its work
    /// has to stop), if it is such a term. From then on it guards nothing: the shard is waited
    /// out like any other holder's and taken again as a new term, whose `hold` drops this one.
    pub(super) fn orphaned_from(&self, grace: Duration) -> Option<Instant> {
        orphaned_from(self.state, self.done, self.lost_at, grace)
    }
}

// === impl Campaign ===

impl Campaign {
    /// Whether shards may be taken at `now`.
    pub(super) fn acquiring(self, now: Instant) -> bool {
        matches!(self, Campaign::From(t) if now >= t)
    }

    /// Whether the first list completed and the campaign goes on.
    pub(super) fn campaigning(self) -> bool {
        matches!(self, Campaign::From(_))
    }
}

// === impl Engine ===

impl Engine {
    /// Begins term `gen` of shard `index` (told through `keeper`; `released` is told when it
    /// ends): `Active`. A lost term still kept there is dropped (its `release()` returns).
    pub(super) fn begin(
        &mut self,
        index: u32,
        (gen, keeper, released): (u64, KeeperHandle, oneshot::Sender<()>),
        term: Term<Phased>,
    ) {
        self.slots[index as usize].tenure.term = Some(Held {
            gen,
            keeper,
            released: Some(released),
            state: State::Active,
            done: false,
            lost_at: None,
            term,
        });
    }

    /// Applies `event` at `now` to the term of shard `index`, by the table ([`advance`]); `false`
    /// (nothing changed) if there is no term or the table has no such row.
    pub(super) fn apply(&mut self, index: u32, event: Event, now: Instant) -> bool {
        let busy = self.io.busy(Key::Shard(index));
        let slot = &mut self.slots[index as usize];
        let Some(t) = slot.tenure.term.as_mut() else {
            return false;
        };
        if event == Event::Finish && busy {
            // A call on the shard is in flight: the term ends when it returns.
            return false;
        }
        match advance(&mut t.state, &mut t.done, &mut t.lost_at, event, now) {
            None => return false,
            Some(Next::To(_)) => {}
            Some(Next::Over) => {
                if let Some(tx) = t.released.take() {
                    let _ = tx.send(());
                }
                slot.tenure.term = None;
                self.replan();
            }
        }
        true
    }

    /// Moves the campaign on to `to`, by its table; `false` if it may not.
    pub(super) fn campaign_to(&mut self, to: Campaign) -> bool {
        match next_campaign(self.machine.campaign, to) {
            Some(c) => {
                self.machine.campaign = c;
                true
            }
            None => false,
        }
    }

    /// The generation of a term about to begin: one more than the last (never reused, so an
    /// answer or end of work of an earlier term of the shard is told apart).
    pub(super) fn new_gen(&mut self) -> u64 {
        self.machine.next_gen += 1;
        self.machine.next_gen
    }

    /// The membership Lease's next write is due at `at` (after a read, its loss, or a failed
    /// write).
    pub(super) fn member_due_at(&mut self, at: Instant) {
        self.member.pace.next = Some(at);
    }

    /// The membership Lease's write sent at `sent` succeeded: the next one is due at its phase
    /// of the renewal period; returns when.
    pub(super) fn member_renewed(&mut self, sent: Instant) -> Instant {
        let (phases, count) = (&self.set.phases, self.set.count);
        // Its failures are retried by `member_due_at`: no last attempt to keep.
        let renewal = self
            .member
            .pace
            .renewal
            .get_or_insert_with(|| Phased::new(phases, count, sent, Duration::ZERO));
        renewal.succeeded(sent);
        self.member.pace.last_sent = Some(sent);
        self.member.pace.next = Some(renewal.next());
        renewal.next()
    }

    /// Shard `index` is not tried again before `until` (a race lost, an error).
    pub(super) fn hold_off(&mut self, index: u32, until: Instant) {
        self.slots[index as usize].tenure.not_before = Some(until);
    }

    /// Shard `index` may be tried again at once (its holder changed, its Lease is gone).
    pub(super) fn lift_hold_off(&mut self, index: u32) {
        self.slots[index as usize].tenure.not_before = None;
    }

    /// Something changed that may change the plan: rebalance before the next wait.
    pub(super) fn replan(&mut self) {
        self.machine.dirty = true;
    }

    /// Whether something changed since the last rebalance.
    pub(super) fn replan_wanted(&self) -> bool {
        self.machine.dirty
    }

    /// A rebalance begins: what changed until now is taken into account.
    pub(super) fn replanning(&mut self) {
        self.machine.dirty = false;
    }

    /// An error ends the campaign (every shard is handed back); the first one is kept.
    pub(super) fn fail(&mut self, error: Error) {
        self.machine.fatal.get_or_insert(error);
    }

    /// Whether an error ended the campaign.
    pub(super) fn failed(&self) -> bool {
        self.machine.fatal.is_some()
    }

    /// What the campaign ends with, once everything is handed back: the error that ended it.
    pub(super) fn outcome(&mut self) -> Result<()> {
        match self.machine.fatal.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// A (re)list of the set begins: what was listed before is forgotten.
    pub(super) fn relist_started(&mut self) {
        self.machine.relist = Some(Vec::new());
    }

    /// A Lease listed by the (re)list.
    pub(super) fn relist_item(&mut self, lease: Lease) {
        self.machine.relist.get_or_insert_with(Vec::new).push(lease);
    }

    /// The (re)list is complete: what it listed.
    pub(super) fn relist_done(&mut self) -> Vec<Lease> {
        self.machine.relist.take().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests;
