//! The shard count of the other candidates: every membership Lease carries its candidate's
//! count ([`SHARD_COUNT_ANNOTATION`]). A live member with another count is never counted for the
//! fair shares. Of two candidates that disagree, the one that joined later (by the `acquireTime`
//! of their membership Leases, then by identity) fails with [`Error::ShardCountMismatch`] as
//! soon as it has seen the other's membership renewed (so that the Lease left behind by a dead
//! candidate never makes anybody fail); until then it takes no shard.

use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use tokio::time::Instant;
use tracing::warn;

use super::Engine;
use crate::{
    error::Error,
    lease::record::{now_micro, LeaseRecord},
    shards::{names::SHARD_COUNT_ANNOTATION, scheduler::Key},
};

/// A member seen with another shard count.
#[derive(Debug, Clone)]
pub(super) struct Foreign {
    /// Its count.
    theirs: u32,
    /// When its membership Lease was first seen with that count (this candidate's clock).
    first_seen: Instant,
}

/// What a live member with another count means for this candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// It joined first and is alive (seen renewed): this candidate fails.
    Fail,
    /// It joined first but has not been seen renewed yet (it may be a dead candidate's Lease):
    /// take no shard meanwhile.
    Wait,
    /// It joined later: it fails; not counted meanwhile.
    Ignore,
}

/// The verdict on a member that joined at `theirs` (its membership Lease's acquire time and
/// identity), for this candidate that joined at `ours`.
fn verdict(ours: (Option<Timestamp>, &str), theirs: (Option<Timestamp>, &str), renewed: bool) -> Verdict {
    match (theirs < ours, renewed) {
        (true, true) => Verdict::Fail,
        (true, false) => Verdict::Wait,
        (false, _) => Verdict::Ignore,
    }
}

/// The shard count a membership Lease announces, if it announces one.
pub(super) fn announced_count(lease: &Lease) -> Option<u32> {
    lease
        .metadata
        .annotations
        .as_ref()?
        .get(SHARD_COUNT_ANNOTATION)?
        .trim()
        .parse()
        .ok()
}

// === impl Engine ===

impl Engine {
    /// Notes the count announced by another candidate's membership Lease `name`.
    pub(super) fn note_count(&mut self, name: &str, lease: &Lease, now: Instant) {
        match announced_count(lease) {
            Some(theirs) if theirs != self.set.count => {
                let first = !self.foreign.contains_key(name);
                let f = self.foreign.entry(name.to_string()).or_insert(Foreign {
                    theirs,
                    first_seen: now,
                });
                f.theirs = theirs;
                if first {
                    let holder = LeaseRecord::from_lease(lease).holder.unwrap_or_default();
                    warn!(member = %holder, theirs, ours = self.set.count, "a candidate of this set has another number of shards");
                }
                // Its renewal may decide the verdict.
                self.replan();
            }
            // No count: a candidate of an earlier release, counted as before.
            _ => {
                if self.foreign.remove(name).is_some() {
                    self.replan();
                }
            }
        }
    }

    /// Whether member `name` was seen with another count.
    pub(super) fn is_foreign(&self, name: &str) -> bool {
        self.foreign.contains_key(name)
    }

    /// Judges the live members with another count: sets the fatal error if one of them joined
    /// first and is alive; returns whether shards must not be taken now (one joined first but
    /// has not been seen renewed yet), and schedules a look at its expiry.
    pub(super) fn judge_counts(&mut self, now: Instant) -> bool {
        let fallback = self.set.cfg.lease.lease_duration;
        let own_joined = self
            .member
            .lease
            .as_ref()
            .and_then(|l| LeaseRecord::from_lease(l).acquire_time)
            .unwrap_or_else(now_micro);
        let ours = (Some(own_joined), self.set.identity.as_str());
        let mut wait = false;
        for (name, f) in &self.foreign {
            let Some(obs) = self.members.get(name) else {
                continue;
            };
            let expiry = obs.expires_at(fallback);
            if now >= expiry {
                continue;
            }
            let holder = obs.record.holder.clone().unwrap_or_default();
            let theirs = (obs.record.acquire_time, holder.as_str());
            match verdict(ours, theirs, obs.observed_at > f.first_seen) {
                Verdict::Fail => {
                    warn!(member = %holder, theirs = f.theirs, ours = self.set.count, "another candidate joined the set first with another number of shards; giving up");
                    let error = Error::ShardCountMismatch {
                        set: self.set.name.clone(),
                        namespace: self.set.namespace.clone(),
                        identity: self.set.identity.clone(),
                        ours: self.set.count,
                        other: holder,
                        theirs: f.theirs,
                    };
                    self.fail(error);
                    return true;
                }
                Verdict::Wait => {
                    wait = true;
                    self.io.wake_at(expiry, Key::Rebalance);
                }
                Verdict::Ignore => {}
            }
        }
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_later_candidate_fails_once_the_earlier_is_seen_alive() {
        let t = |s: i64| Some(Timestamp::from_second(s).unwrap());
        assert_eq!(verdict((t(10), "b"), (t(5), "a"), true), Verdict::Fail);
        assert_eq!(verdict((t(10), "b"), (t(5), "a"), false), Verdict::Wait);
        assert_eq!(verdict((t(5), "a"), (t(10), "b"), true), Verdict::Ignore);
        // The same instant: the identity decides, the same way on both sides.
        assert_eq!(verdict((t(5), "b"), (t(5), "a"), true), Verdict::Fail);
        assert_eq!(verdict((t(5), "a"), (t(5), "b"), true), Verdict::Ignore);
        // A member without an acquire time joined first.
        assert_eq!(verdict((t(5), "a"), (None, "b"), true), Verdict::Fail);
    }

    #[test]
    fn counts_are_read_from_the_annotation() {
        let mut lease = Lease::default();
        assert_eq!(announced_count(&lease), None);
        lease.metadata.annotations = Some(
            [(SHARD_COUNT_ANNOTATION.to_string(), "12".to_string())]
                .into_iter()
                .collect(),
        );
        assert_eq!(announced_count(&lease), Some(12));
        lease.metadata.annotations = Some(
            [(SHARD_COUNT_ANNOTATION.to_string(), "twelve".to_string())]
                .into_iter()
                .collect(),
        );
        assert_eq!(announced_count(&lease), None);
    }
}
