//! The term machine: what a held Lease term is, judged without I/O on a monotonic clock.
//!
//! A [`Term`] is the Lease as last written by this process, the record it carries, the term's
//! fencing token and when the last successful renewal was sent. Events come in as method calls
//! (a renewal is due, a write or a re-read was answered, the watch showed the Lease, a release
//! is wanted), each with the instant `now` the caller read; decisions come out as [`Step`]s
//! (keep, send this renewal bounded until the renew deadline, re-read, end with a reason) or as
//! the release to write. The single-Lease keeper and every shard of the shards engine drive
//! one, so the writes of a term are built, and its answers judged, in this one place (the
//! writes themselves are assembled by [`renewal_write`] and [`release_write`]).
//!
//! When the next renewal is due is the [`Pace`]'s: the keeper renews every retry period
//! ([`Every`]), the shards engine at each shard's phase of the period with a backoff.

use std::time::Duration;

use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use tokio::time::Instant;

use crate::{
    api::Failure,
    backoff::{jittered, retry_at},
    leadership::LossReason,
    lease::{
        coordinated::preferred_other,
        record::{release_write, renewal_write, LeaseRecord, Owner},
    },
    lock,
};

/// When a term's renewals are due: after a success and after a failure.
pub(crate) trait Pace {
    /// When the next renewal is due.
    fn next(&self) -> Instant;
    /// A renewal sent at `sent` succeeded.
    fn succeeded(&mut self, sent: Instant);
    /// A renewal failed at `now`; the term ends at `deadline` unless renewed before. An
    /// overloaded API server may have said when to come back (`retry_after`: its
    /// `Retry-After`).
    fn failed(&mut self, now: Instant, deadline: Instant, retry_after: Option<Duration>);
}

/// The single Lease's pace: a retry period after the last success; after a failure, a retry
/// period spread by jitter, or the server's `Retry-After` if that is longer, but never so late
/// that no attempt of `last_try` is left before the renew deadline (an overload answer cannot
/// cost a term whose deadline has not passed); once that last attempt failed, every half
/// retry period until the deadline, never at once.
#[derive(Debug, Clone)]
pub(crate) struct Every {
    retry: Duration,
    next: Instant,
    /// The keeper's: the time kept for one last attempt before the renew deadline, and
    /// retries spread by [`jittered`]. `None`: the protocol models' pace (deterministic).
    last_try: Option<Duration>,
}

/// Who writes a term, and the timings its records carry and its judgement keeps.
#[derive(Debug, Clone)]
pub(crate) struct Writer {
    /// The candidate's identity (the holder of the record).
    pub(crate) identity: String,
    /// This process's instance id (tells its writes from a twin's).
    pub(crate) instance: String,
    /// The `leaseDurationSeconds` a renewal writes.
    pub(crate) lease_duration_seconds: i32,
    /// How long after the last successful renewal was sent the term ends (fail-stop).
    pub(crate) renew_deadline: Duration,
    /// The term gives way to a new `spec.preferredHolder` of a Lease that coordinated leader
    /// election manages ([`LossReason::Yielded`]): the single Lease's candidates do; a shard's
    /// Lease is the shard set's own, balanced by its engine.
    pub(crate) yields_to_coordinated: bool,
}

/// What the caller does next.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    /// Nothing: the term goes on.
    Keep,
    /// Send this renewal (a replace of the Lease), bounded by `until`: the renew deadline.
    Renew {
        /// The object to send; its resourceVersion is the precondition.
        lease: Box<Lease>,
        /// The renew deadline: no answer counts after it.
        until: Instant,
    },
    /// Read the Lease again (a renewal met a conflict), bounded by `until`: the renew deadline.
    Reread {
        /// The renew deadline.
        until: Instant,
    },
    /// The term is over.
    End(LossReason),
}

/// One held term of a Lease (see the [module](self)).
#[derive(Debug, Clone)]
pub(crate) struct Term<P> {
    writer: Writer,
    /// The Lease as last written by us (its resourceVersion is the next write's precondition).
    lease: Lease,
    record: LeaseRecord,
    /// The record of the renewal in flight, which becomes the term's when it succeeds.
    pending: Option<LeaseRecord>,
    /// This term's fencing token, stored in the Lease by every renewal for observers.
    fencing_token: u64,
    /// When the last successful renewal (or the acquisition) was sent.
    last_sent: Instant,
    /// The other candidate the coordinated election's controller last named preferred holder
    /// of this Lease, as this term last saw it: a new name is the controller's new choice, to
    /// which the term gives way; a name already there when the term began is a choice the
    /// controller could not carry out (this candidate took the Lease only after it had stayed
    /// free; see [`COORDINATED_GRACE`](super::decide::COORDINATED_GRACE)).
    preferred_seen: Option<String>,
    pace: P,
}

// === impl Every ===

impl Every {
    /// Renewals every `retry`, the first a retry period after the acquisition sent at `sent`;
    /// a failed one is retried a retry period later, without jitter, keeping no last attempt
    /// (the protocol models' pace: deterministic).
    pub(crate) fn new(retry: Duration, sent: Instant) -> Self {
        Self {
            retry,
            next: sent + retry,
            last_try: None,
        }
    }

    /// The keeper's pace: as [`new`](Self::new), but a failed renewal is retried after a
    /// jittered retry period (80–100 %) or the server's `Retry-After` if longer, and at the
    /// latest `last_try` before the renew deadline.
    pub(crate) fn keeper(retry: Duration, sent: Instant, last_try: Duration) -> Self {
        Self {
            last_try: Some(last_try),
            ..Self::new(retry, sent)
        }
    }
}

impl Pace for Every {
    fn next(&self) -> Instant {
        self.next
    }

    fn succeeded(&mut self, sent: Instant) {
        self.next = sent + self.retry;
    }

    fn failed(&mut self, now: Instant, deadline: Instant, retry_after: Option<Duration>) {
        let retry_after = retry_after.unwrap_or_default();
        self.next = match self.last_try {
            Some(last_try) => {
                let wait = jittered(self.retry).max(retry_after);
                retry_at(now, wait, deadline, last_try, self.retry / 2)
            }
            None => now + self.retry.max(retry_after),
        };
    }
}

// === impl Term ===

impl<P: Pace> Term<P> {
    /// The term begun by the write of `lease` (carrying `record`), sent at `sent`.
    pub(crate) fn new(
        writer: Writer,
        lease: Lease,
        record: LeaseRecord,
        fencing_token: u64,
        sent: Instant,
        pace: P,
    ) -> Self {
        Self {
            preferred_seen: preferred_other(&lease, &writer.identity),
            writer,
            lease,
            record,
            pending: None,
            fencing_token,
            last_sent: sent,
            pace,
        }
    }

    /// The Lease as last written (or adopted) by this term.
    pub(crate) fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The record of the last successful write.
    pub(crate) fn record(&self) -> &LeaseRecord {
        &self.record
    }

    /// This term's fencing token.
    pub(crate) fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// When the last successful renewal (or the acquisition) was sent.
    pub(crate) fn last_sent(&self) -> Instant {
        self.last_sent
    }

    /// Until when the term is certainly ours: the last renewal sent plus the renew deadline.
    pub(crate) fn confirmed_until(&self) -> Instant {
        self.last_sent + self.writer.renew_deadline
    }

    /// What the model checker tells states apart by, beyond the public accessors: the record of
    /// the renewal in flight and the preferred holder last seen (`src/model`).
    #[cfg(test)]
    pub(crate) fn model_rest(&self) -> (Option<&LeaseRecord>, Option<&str>) {
        (self.pending.as_ref(), self.preferred_seen.as_deref())
    }

    /// When the next renewal is due.
    pub(crate) fn next_renewal(&self) -> Instant {
        self.pace.next()
    }

    /// Checks the renew deadline at `now`. Past it, the term is over (fail-stop).
    pub(crate) fn deadline_reached(&self, now: Instant) -> Step {
        if now < self.confirmed_until() {
            return Step::Keep;
        }
        Step::End(LossReason::RenewDeadline {
            since_last_renewal: now.saturating_duration_since(self.last_sent),
        })
    }

    /// Builds the renewal to send at `now`, unless the renew deadline has passed. `wall_now`
    /// is the wall clock then: the `renewTime` to write.
    pub(crate) fn renew(&mut self, now: Instant, wall_now: Timestamp) -> Step {
        if let end @ Step::End(_) = self.deadline_reached(now) {
            return end;
        }
        let w = &self.writer;
        let (lease, record) = renewal_write(
            &self.lease,
            &self.record,
            w.lease_duration_seconds,
            &w.identity,
            self.fencing_token,
            &w.instance,
            wall_now,
        );
        self.pending = Some(record);
        Step::Renew {
            lease: Box::new(lease),
            until: self.confirmed_until(),
        }
    }

    /// Handles a successful renewal. The term is confirmed from `sent`, when it was sent.
    pub(crate) fn renewed(&mut self, written: Lease, sent: Instant) -> Step {
        if let Some(record) = self.pending.take() {
            self.record = record;
        }
        self.last_sent = self.last_sent.max(sent);
        self.pace.succeeded(sent);
        self.adopt(written);
        Step::Keep
    }

    /// Handles a failed renewal. Re-read on a conflict, end the term if the Lease was deleted,
    /// and otherwise retry as the pace says until the renew deadline.
    pub(crate) fn write_failed(&mut self, failure: &Failure, now: Instant) -> Step {
        self.pending = None;
        if let Failure::NotFound = failure {
            return Step::End(LossReason::LockDeleted);
        }
        self.pace
            .failed(now, self.confirmed_until(), failure.retry_after());
        match failure {
            // 409 means "re-read and decide again": still ours (somebody edited metadata) or
            // lost. The read is bounded by the renew deadline, so that fail-stop holds.
            Failure::Conflict => Step::Reread {
                until: self.confirmed_until(),
            },
            _ => Step::Keep,
        }
    }

    /// Handles the answer to a re-read after a conflict. If the Lease is still ours, keep its
    /// version. Retry a failed read as the pace says.
    pub(crate) fn reread(&mut self, answer: Result<Lease, Failure>, now: Instant) -> Step {
        let retry_after = answer.as_ref().err().and_then(Failure::retry_after);
        let step = match answer {
            Ok(current) => self.judge(current),
            Err(Failure::NotFound) => Step::End(LossReason::LockDeleted),
            Err(_) => Step::Keep,
        };
        if step == Step::Keep {
            self.pace.failed(now, self.confirmed_until(), retry_after);
        }
        step
    }

    /// Handles a watch event for the Lease. Only a record newer than our last write can end
    /// the term: older events are stale.
    pub(crate) fn watched(&mut self, lease: &Lease) -> Step {
        if !newer(lease, &self.lease) {
            return Step::Keep;
        }
        self.judge(lease.clone())
    }

    /// The watch showed the Lease deleted.
    pub(crate) fn deleted(&self) -> Step {
        Step::End(LossReason::LockDeleted)
    }

    /// Whether a release may be written at `now`, the term lost for `lost` (`None`: not lost):
    /// not after the renew deadline, and not after a loss other than a cancellation or a
    /// yield to the coordinated controller's choice (the Lease may be somebody else's by then;
    /// a yielded one is still ours, and the release hands it over at once).
    pub(crate) fn may_release(&self, now: Instant, lost: Option<&LossReason>) -> bool {
        matches!(
            lost,
            None | Some(LossReason::Cancelled | LossReason::Yielded { .. })
        ) && now < self.confirmed_until()
    }

    /// The release to write at the wall time `wall_now`, naming `successor` as the preferred
    /// next holder.
    pub(crate) fn release_write(&self, successor: Option<&str>, wall_now: Timestamp) -> Lease {
        let (lease, _) = release_write(
            &self.lease,
            self.record.transitions,
            &self.writer.instance,
            successor,
            wall_now,
        );
        lease
    }

    /// Judges the Lease as it is now. If it is still ours, keep its version and go on.
    /// Otherwise end the term with the reason.
    fn judge(&mut self, lease: Lease) -> Step {
        let record = LeaseRecord::from_lease(&lease);
        let w = &self.writer;
        match Owner::of(&lease, &record, &w.identity, &w.instance).loss(&w.identity) {
            Some(reason) => Step::End(reason),
            None => {
                // Ours. A new choice of the coordinated election's controller: give way, as
                // client-go's coordinated candidates do (they stop renewing).
                let preferred = preferred_other(&lease, &w.identity);
                let new_choice =
                    w.yields_to_coordinated && preferred.is_some() && preferred != self.preferred_seen;
                self.preferred_seen = preferred.clone();
                if let (true, Some(preferred)) = (new_choice, preferred) {
                    self.lease = lease;
                    return Step::End(LossReason::Yielded { preferred });
                }
                // Our lease, touched by somebody else (labels), or our own write echoed.
                self.lease = lease;
                Step::Keep
            }
        }
    }

    /// Keeps `lease` as the last written if it is newer.
    fn adopt(&mut self, lease: Lease) {
        if newer(&lease, &self.lease) {
            self.lease = lease;
        }
    }
}

/// Whether `a`'s resourceVersion is newer than `b`'s ([`lock::is_newer`]).
fn newer(a: &Lease, b: &Lease) -> bool {
    let rv = |l: &Lease| l.metadata.resource_version.clone();
    lock::is_newer(rv(a).as_deref(), rv(b).as_deref())
}

pub(crate) mod steps;
#[cfg(test)]
mod tests;
