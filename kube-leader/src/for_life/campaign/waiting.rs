//! What a waiting candidate says about its wait: why, and which proof it waits for until when.

use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::Election;
use crate::for_life::decide::{Fate, Waiting};

/// The log target of a waiting candidate's reasons (`kube_leader::waiting`): why it does not
/// take over yet, and which proof it waits for until when. Shown by the sidecar's default log
/// filter, which keeps the rest of the library at warnings.
pub(crate) const WAITING_TARGET: &str = "kube_leader::waiting";

/// Which proof (or deferral) holds next by time, and in how long: the words of a waiting
/// candidate's log line. `None` when no timer is armed (the wait ends with an event).
fn next_by_time(
    fate: Option<&Fate>,
    why: &Waiting,
    recheck_at: Option<Instant>,
    now: Instant,
) -> Option<String> {
    let at = recheck_at?;
    let left = at.saturating_duration_since(now);
    let left = std::time::Duration::from_millis(u64::try_from(left.as_millis()).unwrap_or(u64::MAX));
    let text = match (why, fate) {
        (Waiting::Successor { preferred, .. }, _) => {
            format!("taking over in {left:?} unless {preferred} does")
        }
        (_, Some(f)) if f.liveness_deadline() == Some(at) => {
            format!("its liveness heartbeat lapses in {left:?} unless it moves")
        }
        (_, Some(f)) if f.grace_deadline() == Some(at) => {
            format!("its Pod's grace period and the kill margin pass in {left:?}")
        }
        (Waiting::LeaderNodeNotReady { .. }, _) => {
            format!("the NotReady takeover's grace passes in {left:?}")
        }
        _ => format!("deciding again in {left:?}"),
    };
    Some(text)
}

impl Election<'_> {
    /// Logs why this candidate waits, once per reason, and which proof comes next by time and
    /// when (`recheck_at`). The lines go to the target [`WAITING_TARGET`], which the sidecar's
    /// default log filter shows.
    pub(super) fn log_wait(&mut self, why: Waiting, recheck_at: Option<Instant>, now: Instant) {
        if self.last_wait.as_ref() == Some(&why) {
            return;
        }
        let next = next_by_time(self.fate.as_ref(), &why, recheck_at, now);
        match (&why, next) {
            (Waiting::Malformed(m), _) => {
                warn!(reason = %m, "the lock is not a leader-for-life lock; waiting, never taking it over")
            }
            (Waiting::LeaderPodUnknown { .. }, _) => {
                debug!(target: WAITING_TARGET, reason = %why, "not the leader; waiting")
            }
            (_, Some(next)) => info!(target: WAITING_TARGET, reason = %why, %next, "not the leader; waiting"),
            (_, None) => info!(target: WAITING_TARGET, reason = %why, "not the leader; waiting"),
        }
        self.last_wait = Some(why);
    }
}
