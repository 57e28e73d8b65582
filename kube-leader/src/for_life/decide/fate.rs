//! What a waiting candidate saw of a leader's end, and of its liveness heartbeat.

use std::time::Duration;

use tokio::time::Instant;

use super::{KILL_MARGIN, KUBELET_MIN_GRACE};
use crate::for_life::record::{LeaderPod, LockRecord, PodRef, DEFAULT_GRACE};

/// What a waiting candidate saw of the end of a leader Pod, kept across decisions: on 1.20 the
/// kubelet leaves little proof that a Pod's containers are gone (an eviction writes phase
/// `Failed` without `containerStatuses` and only then kills them, and a terminal Pod's status is
/// never synced again; a force-deleted Pod vanishes while its containers run).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Fate {
    /// The leader Pod (from the lock's owner reference).
    pub(crate) owner: PodRef,
    /// The Pod's grace as last seen ([`PodView::grace`]); `None` if it was never seen.
    pub(crate) grace: Option<Duration>,
    /// A graceful deletion of this Pod was seen ([`PodView::graceful_deletion`]).
    pub(crate) deletion_seen: bool,
    /// The Pod was seen in a terminal phase that its kubelet wrote
    /// ([`PodView::phase_by_kubelet`]): kept once the Pod is gone (force-deleted after it, say,
    /// by the Pod garbage collector), as the kubelet's word stands.
    pub(crate) kubelet_terminal_seen: bool,
    /// When this candidate first saw the Pod terminal, gone or replaced.
    pub(crate) ended_since: Option<Instant>,
    /// The lock was last seen marked released by this leader.
    pub(crate) released: bool,
    /// The successor the release prefers, and when this candidate first saw the release.
    pub(crate) preferred: Option<(String, Instant)>,
    /// The owner's liveness heartbeat as last seen, if its lock carries one.
    pub(crate) heartbeat: Option<SeenHeartbeat>,
    /// This candidate deleted the owner's lock on a proof: with no lock, it creates one at
    /// once (its own deletion, or the dead Pod's, is no news about the owner's work).
    pub(crate) proven: bool,
}

/// A leader's liveness heartbeat as a waiting candidate saw it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct SeenHeartbeat {
    /// The lock's UID and renew time last seen; `None` once the lock was seen gone.
    pub(crate) mark: Option<(String, String)>,
    /// The liveness the lock advertised.
    pub(crate) liveness: Duration,
    /// When this candidate saw `mark` first.
    pub(crate) since: Instant,
}

// === impl Fate ===

impl Fate {
    /// Nothing seen yet of `owner`'s end.
    pub(crate) fn new(owner: PodRef) -> Self {
        Self {
            owner,
            grace: None,
            deletion_seen: false,
            kubelet_terminal_seen: false,
            ended_since: None,
            released: false,
            preferred: None,
            heartbeat: None,
            proven: false,
        }
    }

    /// Takes in the owner's lock as it is now (seen at `now`; `None`: gone): whether its
    /// liveness heartbeat moved. A lock of the owner without a (readable) heartbeat forgets it:
    /// only the other proofs count then. A lock seen gone counts as a move, seen now: a
    /// heartbeat written before the deletion may not have been seen (a watch that relisted),
    /// but was sent before it.
    pub(crate) fn observe_lock(&mut self, lock: Option<&LockRecord>, now: Instant) {
        let (mark, liveness) = match lock {
            Some(l) if l.owner.as_ref().is_ok_and(|o| o == &self.owner) => match &l.heartbeat {
                Ok(Some(h)) => (Some((l.uid.clone(), h.renew_time.clone())), h.liveness),
                Ok(None) | Err(_) => {
                    self.heartbeat = None;
                    return;
                }
            },
            Some(_) => return,
            None => match &self.heartbeat {
                Some(h) => (None, h.liveness),
                None => return,
            },
        };
        if self.heartbeat.as_ref().is_some_and(|h| h.mark == mark) {
            return;
        }
        self.heartbeat = Some(SeenHeartbeat {
            mark,
            liveness,
            since: now,
        });
    }

    /// When the liveness proof holds: the heartbeat's liveness plus [`KILL_MARGIN`] after it
    /// was last seen to move. `None` without a heartbeat.
    pub(crate) fn liveness_deadline(&self) -> Option<Instant> {
        // A liveness far beyond any deadline (the annotation allows 136 years) never lapses.
        let h = self.heartbeat.as_ref()?;
        h.since.checked_add(h.liveness + KILL_MARGIN)
    }

    /// Takes in what the owner's Pod is now (seen at `now`).
    pub(crate) fn observe(&mut self, pod: &LeaderPod, now: Instant) {
        match pod {
            LeaderPod::Unknown => {}
            LeaderPod::Present(v) if v.uid == self.owner.uid => {
                self.grace = Some(v.grace);
                self.deletion_seen |= v.graceful_deletion;
                if v.is_terminal() {
                    self.ended_since.get_or_insert(now);
                    self.kubelet_terminal_seen |= v.phase_by_kubelet;
                }
            }
            // Gone, or replaced by another Pod of that name.
            _ => {
                self.ended_since.get_or_insert(now);
            }
        }
    }

    /// When the grace proof holds: the grace (at least the kubelet's minimum, the API server's
    /// default if the Pod was never seen) plus [`KILL_MARGIN`] after the end was first seen.
    pub(crate) fn grace_deadline(&self) -> Option<Instant> {
        let grace = self.grace.unwrap_or(DEFAULT_GRACE).max(KUBELET_MIN_GRACE);
        self.ended_since.map(|t| t + grace + KILL_MARGIN)
    }
}

/// Keeps `fate` for the lock's owner (`record`, `None`: no lock), as a waiting candidate `me`
/// saw it at `now`: a new one for a new owner, none for a lock without one, and the last one
/// while there is no lock; `leader_pod`: the Pod it watches, by name. A former Pod of this
/// candidate's own name is gone (this Pod has its name), and was never watched.
pub(crate) fn track_fate(
    fate: &mut Option<Fate>,
    record: Option<&LockRecord>,
    me: &PodRef,
    leader_pod: Option<(&str, &LeaderPod)>,
    now: Instant,
) {
    if let Some(record) = record {
        let Ok(owner) = record.owner.as_ref() else {
            *fate = None;
            return;
        };
        if fate.as_ref().is_none_or(|f| &f.owner != owner) {
            *fate = Some(Fate::new(owner.clone()));
        }
        if let Some(f) = fate.as_mut() {
            f.released = record.released;
            match (&record.preferred, &f.preferred) {
                (Some(p), Some((seen, _))) if p == seen => {}
                (Some(p), _) => f.preferred = Some((p.clone(), now)),
                (None, _) => f.preferred = None,
            }
        }
    }
    let Some(fate) = fate.as_mut() else { return };
    fate.observe_lock(record, now);
    if fate.owner.name == me.name {
        fate.observe(&LeaderPod::Absent, now);
    } else if let Some((_, state)) = leader_pod.filter(|(name, _)| *name == fate.owner.name) {
        fate.observe(state, now);
    }
}
