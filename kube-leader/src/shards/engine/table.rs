//! The table: the lifecycle of a shard's term and of the campaign, written once.
//!
//! A shard without a term has none (`Slot::term` is `None`); a term begins [`Active`]
//! ([`Engine::begin`]) and goes on by the rows of [`next`]: (state, event) → next state, or the
//! end of the term. A pair the table does not list is ignored. This file is the only place
//! that writes a term's state ([`State`], whether its work stopped, when it was lost), begins
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
//! [`Active`]: State::Active

use std::time::Duration;

use tokio::{sync::oneshot, time::Instant};

use super::Engine;
use crate::{leadership::KeeperHandle, lease::term::Term, shards::scheduler::Phased};

/// Where a held term of a shard is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
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
pub(super) enum Event {
    /// Handed over, handed back on shutdown, or given up: the work stops until `until`, then
    /// the term is released if `release`.
    Leave { until: Instant, release: bool },
    /// Not ours any more: its renew deadline passed, another holder or a twin wrote it, or it
    /// was deleted.
    Lost,
    /// The work on it stopped (its `Shard` was dropped).
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

/// What a row of the table leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
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

/// A term of a shard held by this process.
pub(super) struct Held {
    pub(super) gen: u64,
    pub(super) keeper: KeeperHandle,
    released: Option<oneshot::Sender<()>>,
    state: State,
    /// The work on it has stopped (the `Shard` was dropped).
    done: bool,
    /// When it stopped being ours while its work went on (it became `Gone` undone).
    lost_at: Option<Instant>,
    /// The term's Lease, record, fencing token and renewals, judged by the term machine.
    pub(super) term: Term<Phased>,
}

/// The table (see the [module](self)): the next state of a term in `state` (its work stopped
/// if `done`) on `event`; `None` if the table has no such row.
pub(super) fn next(state: State, done: bool, event: Event) -> Option<Next> {
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
fn orphaned_from(state: State, done: bool, lost_at: Option<Instant>, grace: Duration) -> Option<Instant> {
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

    /// When a term that is not ours any more, and whose `Shard` is still kept, stops keeping
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
        self.slots[index as usize].term = Some(Held {
            gen,
            keeper,
            released: Some(released),
            state: State::Active,
            done: false,
            lost_at: None,
            term,
        });
    }

    /// Applies `event` at `now` to the term of shard `index`, by the table; `false` (nothing
    /// changed) if there is no term or the table has no such row.
    pub(super) fn apply(&mut self, index: u32, event: Event, now: Instant) -> bool {
        let slot = &mut self.slots[index as usize];
        let Some(t) = slot.term.as_mut() else {
            return false;
        };
        if event == Event::Finish && slot.busy {
            // A call on the shard is in flight: the term ends when it returns.
            return false;
        }
        match next(t.state, t.done, event) {
            None => return false,
            Some(Next::To(state)) => {
                if event == Event::Done {
                    t.done = true;
                }
                if state == State::Gone && matches!(event, Event::Lost | Event::GraceOver) {
                    t.lost_at = Some(now);
                }
                t.state = state;
            }
            Some(Next::Over) => {
                if let Some(tx) = t.released.take() {
                    let _ = tx.send(());
                }
                slot.term = None;
                self.dirty = true;
            }
        }
        true
    }

    /// Moves the campaign on to `to`, by its table; `false` if it may not.
    pub(super) fn campaign_to(&mut self, to: Campaign) -> bool {
        match next_campaign(self.campaign, to) {
            Some(c) => {
                self.campaign = c;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests;
