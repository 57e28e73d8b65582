//! The pure core of a leader-for-life term, the holder's side: what the keeper and the
//! heartbeat decide from what they saw and when, with no request and no clock of its own (the
//! caller passes the instants in). The keeper ([`super::keeper`]), the heartbeat
//! ([`super::heartbeat`]), the campaign's restart ([`super::campaign`]) and the model checker
//! call these, so that the model drives the shipped decisions.

use std::time::Duration;

use tokio::time::Instant;

use super::record::{LockRecord, PodRef, PodView};
use crate::{leadership::LossReason, lock};

/// The heartbeat's timings, from [`ForLifeConfig`](super::ForLifeConfig).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Liveness {
    /// How long a heartbeat confirms the term, from its send.
    pub(crate) confirm: Duration,
    /// What the lock advertises: `confirm` plus the time the work may take to stop after.
    pub(crate) advertised: Duration,
}

// === impl Liveness ===

impl Liveness {
    /// A heartbeat every third of the confirmed window: two may fail before it lapses.
    pub(crate) fn period(&self) -> Duration {
        self.confirm / 3
    }
}

/// Why the term is over, from the lock as seen (`None`: gone): deleted, or no longer the
/// term's (another UID, or not owned by `me`). `None` while it is still the term's.
pub(crate) fn lock_loss(lock_uid: &str, me: &PodRef, lock: Option<&LockRecord>) -> Option<LossReason> {
    let Some(record) = lock else {
        return Some(LossReason::LockDeleted);
    };
    if record.uid != lock_uid || !record.is_owned_by(me) {
        let holder = record.holder().map(str::to_string);
        return Some(LossReason::LockReplaced { holder });
    }
    None
}

/// Why this candidate's own Pod (as seen, `None`: gone) ends its term: being deleted, gone,
/// replaced, terminal, or marked with a `DisruptionTarget` condition. `None`: it lives on.
pub(crate) fn pod_ending(me: &PodRef, pod: Option<&PodView>) -> Option<String> {
    let why = match pod {
        None => "was deleted".to_string(),
        Some(v) if v.uid != me.uid => {
            format!("was replaced by another Pod of that name (UID {})", v.uid)
        }
        Some(v) if v.deleting => "is being deleted".to_string(),
        Some(v) if v.is_terminal() => format!(
            "is in phase {}{}",
            v.phase.as_deref().unwrap_or_default(),
            v.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default()
        ),
        // An eviction, a preemption or a taint's deletion is coming: hand over now, while
        // this Pod can still release, rather than when it is killed.
        Some(v) => format!(
            "is about to be disrupted (DisruptionTarget: {})",
            v.disruption_target.as_deref()?
        ),
    };
    Some(why)
}

/// What the release's mark does with the lock as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mark {
    /// The lock is gone or no longer this term's: nothing to release.
    NotMine,
    /// Already marked released: delete it next.
    Marked,
    /// Write the mark (an update conditional on the lock's resourceVersion).
    Write,
}

/// What the release does with the lock as read (see [`Mark`]).
pub(crate) fn release_mark(lock_uid: &str, me: &PodRef, record: &LockRecord) -> Mark {
    if record.uid != lock_uid || !record.is_owned_by(me) {
        Mark::NotMine
    } else if record.released {
        Mark::Marked
    } else {
        Mark::Write
    }
}

/// The fencing token of this Pod's own lock found after a restart, and whether the lock
/// stores it already: the stored token, else the lock's resourceVersion.
pub(crate) fn restart_token(record: &LockRecord) -> (u64, bool) {
    match record.fencing_token {
        Some(token) => (token, true),
        None => (lock::fencing_token(record.resource_version.as_deref(), 0), false),
    }
}

/// The liveness heartbeat's schedule and confirmations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Beats {
    pub(crate) liveness: Liveness,
    /// When the last successful heartbeat (or the write that made the term) was sent.
    pub(crate) last_sent: Instant,
}

// === impl Beats ===

impl Beats {
    /// The heartbeat of a term whose making write was sent at `sent`.
    pub(crate) fn new(liveness: Liveness, sent: Instant) -> Self {
        Self {
            liveness,
            last_sent: sent,
        }
    }

    /// Until when the term is confirmed: the last successful send plus the liveness.
    pub(crate) fn confirmed_until(&self) -> Instant {
        self.last_sent + self.liveness.confirm
    }

    /// When the first heartbeat is due.
    pub(crate) fn first_due(&self) -> Instant {
        self.last_sent + self.liveness.period()
    }

    /// A heartbeat sent at `sent` was written: until when the term is confirmed now.
    pub(crate) fn written(&mut self, sent: Instant) -> Instant {
        self.last_sent = sent;
        self.confirmed_until()
    }

    /// When the next heartbeat is due after one sent at `sent`, seen done at `now`.
    pub(crate) fn next_due(&self, sent: Instant, now: Instant) -> Instant {
        (sent + self.liveness.period()).max(now)
    }

    /// How long a heartbeat write may take: one that has not returned within the confirmed
    /// window confirms nothing more.
    pub(crate) fn write_timeout(&self, api_timeout: std::time::Duration) -> std::time::Duration {
        api_timeout.min(self.liveness.confirm)
    }
}
