//! The pure decision of a Lease candidate: given what it observed and when, what to do now.

use std::time::Duration;

use tokio::time::Instant;

use super::record::LeaseRecord;

/// A record as this candidate observed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Observed {
    /// The election record.
    pub(crate) record: LeaseRecord,
    /// The Lease's resourceVersion, the precondition of the next write.
    pub(crate) resource_version: Option<String>,
    /// When this candidate first saw this record (its own monotonic clock).
    pub(crate) observed_at: Instant,
    /// Whether this very candidate (process) wrote the record: its identity is the holder, and
    /// the Lease carries its instance id for this record's renewTime. A record held under its
    /// identity that it did not write belongs to another process with the same identity, or to
    /// this candidate before a restart: either way somebody else may act on it.
    pub(crate) mine: bool,
    /// The successor a released record prefers (see
    /// [`PREFERRED_HOLDER_ANNOTATION`](crate::successor::PREFERRED_HOLDER_ANNOTATION)).
    pub(crate) preferred: Option<String>,
    /// Kubernetes' coordinated leader election manages the Lease (`spec.strategy` is set): its
    /// controller names the holder, and this candidate, which does not take part, takes the
    /// Lease only when the controller has named nobody ([`defer_to_controller`]).
    pub(crate) coordinated: bool,
    /// A kube-leader process wrote the record (any instance: its writer annotation matches the
    /// record's renewTime). A record under this identity that no kube-leader process wrote was
    /// written by the coordinated election's controller: it names this candidate holder.
    pub(crate) by_kube_leader: bool,
}

impl Observed {
    /// Folds a newly seen record into the observation: the observation time moves only when the
    /// record itself changed (client-go compares the raw record), not when only the
    /// resourceVersion did (a label edit does not renew a lease).
    pub(crate) fn update(
        prev: Option<&Observed>,
        record: LeaseRecord,
        rv: Option<String>,
        now: Instant,
    ) -> Observed {
        let observed_at = match prev {
            Some(p) if p.record == record => p.observed_at,
            _ => now,
        };
        Observed {
            record,
            resource_version: rv,
            observed_at,
            mine: false,
            preferred: None,
            coordinated: false,
            by_kube_leader: false,
        }
    }

    /// Marks whether a kube-leader process wrote the record (see [`Observed::by_kube_leader`]).
    pub(crate) fn written_by_kube_leader(mut self, by: bool) -> Self {
        self.by_kube_leader = by;
        self
    }

    /// Marks the Lease as managed by coordinated leader election (see [`Observed::coordinated`]).
    pub(crate) fn coordinated(mut self, coordinated: bool) -> Self {
        self.coordinated = coordinated;
        self
    }

    /// Sets the successor the record prefers (only a released record prefers one).
    pub(crate) fn preferring(mut self, preferred: Option<String>) -> Self {
        self.preferred = preferred.filter(|_| self.record.holder.is_none());
        self
    }

    /// Marks whether this candidate wrote the record (see [`Observed::mine`]).
    pub(crate) fn written_by_me(mut self, mine: bool) -> Self {
        self.mine = mine;
        self
    }

    /// Whether the record is held under `identity` by somebody else than this candidate.
    pub(crate) fn held_by_a_twin(&self, identity: &str) -> bool {
        self.record.is_held_by(identity) && !self.mine
    }

    /// When the observed holder's lease expires for this candidate: the holder's advertised
    /// duration (client-go ≥ 1.30), or `fallback` if it advertised none, from the observation.
    pub(crate) fn expires_at(&self, fallback: Duration) -> Instant {
        self.observed_at + self.record.lease_duration.unwrap_or(fallback)
    }

    /// A holder's record waited out: taken over once it has expired at `now`, else waited for
    /// until then.
    pub(crate) fn take_once_expired(&self, now: Instant, fallback: Duration) -> Decision {
        let expiry = self.expires_at(fallback);
        if now >= expiry {
            Decision::Takeover
        } else {
            Decision::WaitUntil(expiry)
        }
    }
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// No Lease exists: create it.
    Create,
    /// The lease is free (released, or expired): take it over; `leaseTransitions` + 1.
    Takeover,
    /// This candidate holds it already (it wrote the record: an earlier term of this
    /// process): renew, keeping `acquireTime` and `leaseTransitions`.
    Renew,
    /// Another candidate holds a valid lease until the given instant.
    WaitUntil(Instant),
    /// A coordinated candidate waits for the controller to name it holder: nothing to do until
    /// the Lease changes.
    Follow,
}

/// Decides what a candidate named `identity` does at `now`, having observed `observed`
/// (`None`: the Lease does not exist). `fallback` is this candidate's own lease duration, used
/// when the holder advertised none.
pub(crate) fn decide(
    observed: Option<&Observed>,
    identity: &str,
    now: Instant,
    fallback: Duration,
) -> Decision {
    let Some(obs) = observed else {
        return Decision::Create;
    };
    match obs.record.holder.as_deref() {
        None => Decision::Takeover,
        Some(h) if h == identity && obs.mine => Decision::Renew,
        // Another holder, or a record under our identity written by another process (two
        // candidates with one identity, or this one before a restart): wait it out.
        Some(_) => obs.take_once_expired(now, fallback),
    }
}

/// Decides what a coordinated candidate ([`coordinated`](super::coordinated)) named `identity`
/// does at `now`: it never creates the Lease nor takes it over; it leads when the controller has
/// named it holder (a record under its identity that no kube-leader process wrote), renews a
/// record it wrote itself, and waits out one that another process of its identity wrote (a
/// twin, or itself before a restart: the controller does not name it again while that record
/// holds it, even expired).
pub(crate) fn decide_coordinated(
    observed: Option<&Observed>,
    identity: &str,
    now: Instant,
    fallback: Duration,
) -> Decision {
    let Some(obs) = observed else {
        // The controller creates the Lease when it elects.
        return Decision::Follow;
    };
    match obs.record.holder.as_deref() {
        Some(h) if h == identity && obs.mine => Decision::Renew,
        Some(h) if h == identity && !obs.by_kube_leader => Decision::Takeover,
        Some(h) if h == identity => obs.take_once_expired(now, fallback),
        _ => Decision::Follow,
    }
}

/// A candidate that is not the successor a released lease prefers defers to it for `wait`
/// from when it saw the release: the preferred one takes over meanwhile, usually within
/// milliseconds. Only a takeover of a released record defers; an expired lease (a crash: nobody
/// stepped down) is taken at once.
pub(crate) fn defer_to_preferred(
    decision: Decision,
    observed: &Observed,
    identity: &str,
    now: Instant,
    wait: Duration,
) -> Decision {
    let deferring = decision == Decision::Takeover
        && observed.record.holder.is_none()
        && observed.preferred.as_deref().is_some_and(|p| p != identity);
    let until = observed.observed_at + wait;
    if deferring && now < until {
        Decision::WaitUntil(until)
    } else {
        decision
    }
}

/// How long a Lease that coordinated leader election manages must have been free (released,
/// expired, or without a holder) before a candidate that does not take part takes it: the
/// controller in kube-apiserver names a holder within its 5 s election window when it has a
/// live candidate (it pings them and waits 5 s for their answers), so a Lease still free after
/// twice that has no coordinated candidate to go to. Taking it earlier would race the
/// controller's choice and make the Lease change hands twice.
pub(crate) const COORDINATED_GRACE: Duration = Duration::from_secs(10);

/// A candidate that does not take part in coordinated leader election leaves a coordinated Lease
/// ([`Observed::coordinated`]) to the controller: it takes it over only once it has been free
/// for [`COORDINATED_GRACE`] (from when the record was seen released, or from its expiry).
pub(crate) fn defer_to_controller(
    decision: Decision,
    observed: &Observed,
    now: Instant,
    fallback: Duration,
) -> Decision {
    if decision != Decision::Takeover || !observed.coordinated {
        return decision;
    }
    let free_since = match observed.record.holder {
        None => observed.observed_at,
        Some(_) => observed.expires_at(fallback),
    };
    let until = free_since + COORDINATED_GRACE;
    if now < until {
        Decision::WaitUntil(until)
    } else {
        decision
    }
}

/// What a candidate knows about a Lease that is absent now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Absent<'a> {
    /// It never saw the Lease: a first election.
    Never,
    /// It saw the Lease deleted: the record it observed last.
    Deleted(&'a Observed),
    /// It saw the Lease before, but not how it went (it was not campaigning then, or not
    /// scheduled): whoever held it last is unknown. Absent since this instant, by its clock.
    Unknown {
        /// When this campaign first found the Lease absent.
        since: Instant,
    },
}

/// What a candidate does while the Lease is absent: create it, unless somebody may still act as
/// leader on the deleted Lease.
///
/// A deletion is not a release: the holder may not have seen it yet (its watch is late, or it is
/// partitioned) and may act as leader until its renew deadline, exactly as a holder that stopped
/// renewing. So its lease is waited out in the same way: from this candidate's observation of
/// that holder's last renewal, or, when the holder is unknown, a lease duration (`fallback`)
/// from when this candidate found the Lease absent. (client-go creates at once, and so two
/// leaders may act for up to the renew deadline after an administrator deletes the Lease.) A
/// candidate that never saw the Lease creates it at once: it cannot tell a first election from a
/// deletion.
pub(crate) fn decide_absent(
    absent: Absent<'_>,
    identity: &str,
    now: Instant,
    fallback: Duration,
) -> Decision {
    let expiry = match absent {
        Absent::Never => return Decision::Create,
        Absent::Deleted(d)
            if d.record.holder.as_deref().is_some_and(|h| h != identity) || d.held_by_a_twin(identity) =>
        {
            d.expires_at(fallback)
        }
        Absent::Deleted(_) => return Decision::Create,
        Absent::Unknown { since } => since + fallback,
    };
    if now < expiry {
        Decision::WaitUntil(expiry)
    } else {
        Decision::Create
    }
}

/// The record this candidate writes for a decision.
pub(crate) fn record_for(
    decision: &Decision,
    observed: Option<&Observed>,
    identity: &str,
    lease_duration: Duration,
    wall_now: k8s_openapi::jiff::Timestamp,
) -> LeaseRecord {
    let prev = observed.map(|o| &o.record);
    let (acquire_time, transitions) = match decision {
        Decision::Create => (Some(wall_now), 0),
        Decision::Takeover => {
            // client-go increments on every change of holder, including taking a released lease.
            (
                Some(wall_now),
                prev.map_or(0, |p| p.transitions.saturating_add(1)),
            )
        }
        Decision::Renew | Decision::WaitUntil(_) | Decision::Follow => (
            prev.and_then(|p| p.acquire_time).or(Some(wall_now)),
            prev.map_or(0, |p| p.transitions),
        ),
    };
    LeaseRecord {
        holder: Some(identity.to_string()),
        lease_duration: Some(lease_duration),
        acquire_time,
        renew_time: Some(wall_now),
        transitions,
    }
}

#[cfg(test)]
mod tests;
