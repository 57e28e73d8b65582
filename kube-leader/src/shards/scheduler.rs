//! The renewal schedule of one process: renewals spread evenly over the retry period, a
//! process-wide pause when the API server says it is overloaded (429 with `Retry-After`, 5xx),
//! and per-shard retries that never give up a shard's renew deadline for that pause.
//!
//! Shard `i` of `M` is renewed at the phase `i/M` of every retry period (counted from one
//! epoch for the whole process), so that 1,000 shards are 1,000 writes evenly spaced over the
//! period, not 1,000 writes at once every period (client-go's timers, one per Lease, drift into
//! bursts). The first renewal after an acquisition comes at the shard's next phase at least an
//! eighth of a retry period later: between `retry/8` and `9·retry/8` after the acquisition,
//! below the `1.2 × retry` that the renew deadline must exceed.
//!
//! Failed renewals are retried with a jittered exponential backoff from `retry/4` up to the
//! retry period, but never so late that no attempt is left before the shard's renew deadline.
//! An overloaded API server (429, 5xx) pauses every renewal that is not urgent, and every
//! acquisition, until its `Retry-After` (or a backoff) has passed; a renewal is urgent once half
//! its renew deadline has gone by, and is then sent anyway: a shard is only ever lost by its own
//! renew deadline (fail-stop), never by the pause.

use std::{collections::BTreeSet, time::Duration};

use tokio::time::Instant;

use crate::{
    backoff::{retry_at, Backoff},
    lease::term::Pace,
};

/// What a scheduled wake-up is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Key {
    /// This candidate's membership Lease.
    Member,
    /// A shard.
    Shard(u32),
    /// Look at the whole set again (a lease may have expired, a member gone).
    Rebalance,
}

/// The renewal phases of one process.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Phases {
    /// The start of the first period.
    pub(crate) epoch: Instant,
    pub(crate) retry: Duration,
    /// How many phases a period is cut into (shards, plus one for the membership Lease).
    pub(crate) slots: u32,
}

impl Phases {
    /// Where in the period slot `slot` renews.
    pub(crate) fn offset(&self, slot: u32) -> Duration {
        let nanos =
            self.retry.as_nanos() * u128::from(slot % self.slots.max(1)) / u128::from(self.slots.max(1));
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// The renewal after one sent at `sent`: slot `slot`'s first phase at or after
    /// `sent + retry/8`.
    pub(crate) fn next_after(&self, slot: u32, sent: Instant) -> Instant {
        let earliest = sent + self.retry / 8;
        let first = self.epoch + self.offset(slot);
        if earliest <= first {
            return first;
        }
        let retry = self.retry.as_nanos().max(1);
        let periods = (earliest - first).as_nanos().div_ceil(retry);
        let nanos = u64::try_from(periods * retry).unwrap_or(u64::MAX);
        first + Duration::from_nanos(nanos)
    }
}

/// The process-wide pause after the API server said it is overloaded.
#[derive(Debug, Clone)]
pub(crate) struct Throttle {
    until: Option<Instant>,
    backoff: Backoff,
    cap: Duration,
}

impl Throttle {
    /// A throttle whose pauses back off from `initial` to `cap` when the API server gives no
    /// `Retry-After` (an explicit one is honoured up to `cap` too).
    pub(crate) fn new(initial: Duration, cap: Duration) -> Self {
        Self {
            until: None,
            backoff: Backoff::new(initial, cap),
            cap,
        }
    }

    /// The API server answered 429 or 5xx at `now`, with `Retry-After` if it gave one.
    pub(crate) fn overloaded(&mut self, now: Instant, retry_after: Option<Duration>) {
        let pause = match retry_after {
            Some(d) => d.min(self.cap),
            None => self.backoff.next_delay(),
        };
        let until = now + pause;
        self.until = Some(self.until.map_or(until, |u| u.max(until)));
    }

    /// A call succeeded: the next overload starts backing off from the beginning.
    pub(crate) fn succeeded(&mut self) {
        self.backoff.reset();
    }

    /// Until when non-urgent calls wait, if they do at `now`.
    pub(crate) fn paused_until(&self, now: Instant) -> Option<Instant> {
        self.until.filter(|u| *u > now)
    }
}

/// From when on a renewal is sent even while the API server asked to wait: half the renew
/// deadline after the last success (`last_sent`).
pub(crate) fn urgent_from(last_sent: Instant, renew_deadline: Duration) -> Instant {
    last_sent + renew_deadline / 2
}

/// When to send a renewal that is due at `now` and urgent from `urgent`: `None` now, or the
/// later instant to wait for while the API server asked to pause (never later than `urgent`).
pub(crate) fn hold_back(now: Instant, throttle: &Throttle, urgent: Instant) -> Option<Instant> {
    let until = throttle.paused_until(now)?;
    (now < urgent).then(|| until.min(urgent))
}

/// The pace of a Lease's renewals: a held shard's, for its [`Term`](crate::lease::term::Term),
/// and the membership Lease's. At the Lease's phase of every retry period, and after a failure
/// with a backoff that leaves one last attempt before the renew deadline.
#[derive(Debug, Clone)]
pub(crate) struct Phased {
    phases: Phases,
    slot: u32,
    next: Instant,
    backoff: Backoff,
    /// The time left for one last attempt before the renew deadline.
    last_try: Duration,
}

impl Phased {
    /// The pace of slot `slot`'s Lease acquired by a write sent at `sent`.
    pub(crate) fn new(phases: &Phases, slot: u32, sent: Instant, last_try: Duration) -> Self {
        Self {
            phases: *phases,
            slot,
            next: phases.next_after(slot, sent),
            backoff: Backoff::new(phases.retry / 4, phases.retry),
            last_try,
        }
    }
}

impl Pace for Phased {
    fn next(&self) -> Instant {
        self.next
    }

    fn succeeded(&mut self, sent: Instant) {
        self.next = self.phases.next_after(self.slot, sent);
        self.backoff.reset();
    }

    /// The engine pauses for an overloaded server's `Retry-After` process-wide (its
    /// [`Throttle`]): a shard's own retry only backs off. Once its last attempt failed, a
    /// shard is retried at once (a zero floor), bounded by the calls in flight: against a
    /// server that takes a fixed number of writes per moment, any wait there cost shards in
    /// `an_overloaded_api_server_costs_no_shard` (a floor of an eighth of the retry period
    /// lost 9 of 1,000).
    fn failed(&mut self, now: Instant, deadline: Instant, _retry_after: Option<Duration>) {
        let delay = self.backoff.next_delay();
        self.next = retry_at(now, delay, deadline, self.last_try, Duration::ZERO);
    }
}

/// Wake-ups, in order; a key may be scheduled several times (each wake-up re-examines it).
#[derive(Debug, Default)]
pub(crate) struct Timers {
    set: BTreeSet<(Instant, Key)>,
}

impl Timers {
    pub(crate) fn at(&mut self, when: Instant, key: Key) {
        self.set.insert((when, key));
    }

    /// The earliest wake-up.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.set.first().map(|(t, _)| *t)
    }

    /// Removes and returns every key due at `now`, each once.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<Key> {
        let mut keys = Vec::new();
        while let Some((t, k)) = self.set.first().copied() {
            if t > now {
                break;
            }
            self.set.pop_first();
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        keys
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.set.len()
    }
}

#[cfg(test)]
mod tests;
