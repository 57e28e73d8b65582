//! The leader-for-life liveness heartbeat: the leader renews two annotations of its lock
//! ([`RENEW_TIME_ANNOTATION`](crate::lock::RENEW_TIME_ANNOTATION),
//! [`LIVENESS_ANNOTATION`](crate::lock::LIVENESS_ANNOTATION)) every third of its liveness,
//! and its term is confirmed until the send of the last successful write plus the liveness.
//! A waiting candidate takes over an ended leader Pod once that heartbeat has not moved for the
//! advertised liveness plus the kill margin (see the [decision](super::decide)).
//!
//! A heartbeat that cannot be written does not end the term (leader for life: a partition of
//! a live Pod is no reason to hand over); its confirmation lapses, and moves on with the next
//! heartbeat that gets through while the lock is still this term's (UID and owner).

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{api::PostParams, Api};
use tokio::time::Instant;
use tracing::{debug, info};

use super::{
    api::cm_op,
    holder::{lock_loss, Beats, Liveness},
    record::{set_heartbeat, with_fencing_token, LockRecord, PodRef},
    steps,
};
use crate::{
    api::{call, Failure},
    leadership::{KeeperHandle, LossReason},
    lock::LockRef,
};

/// The lock found to be this Pod's own (a restart), made to say what this process does: with
/// a heartbeat renewed now, or without any (a former process may have written one this one
/// will not renew, which would let a candidate take over while this one works). Always
/// written, with the `resourceVersion` as precondition, also when nothing changes: a request
/// of the former process still in flight (its release's mark, conditional on the same
/// `resourceVersion`) then fails, rather than marking this process's term released under it
/// (issue 43's model checker). Returns the lock and when the write was sent.
pub(super) async fn adopt(
    configmaps: &Api<ConfigMap>,
    lock: &LockRef,
    cm: ConfigMap,
    liveness: Option<Liveness>,
    timeout: Duration,
) -> Result<(ConfigMap, Option<Instant>), Failure> {
    let mut desired = cm;
    set_heartbeat(&mut desired, liveness.map(|l| l.advertised));
    let sent = Instant::now();
    let params = PostParams::default();
    let replace = configmaps.replace(&lock.name, &params, &desired);
    let written = call(cm_op(lock, "update"), timeout, replace).await;
    let pre = (
        desired.metadata.uid.as_deref(),
        desired.metadata.resource_version.as_deref(),
    );
    steps::write("adopt", pre, Some(&desired), sent, &written, steps::written);
    Ok((written?, Some(sent)))
}

/// The leader's heartbeat, beside its keeper's watches.
pub(super) struct Beat {
    pub(super) configmaps: Api<ConfigMap>,
    pub(super) lock: LockRef,
    pub(super) lock_uid: String,
    pub(super) me: PodRef,
    pub(super) fencing_token: u64,
    pub(super) api_timeout: Duration,
    /// The lock as last written or read: its `resourceVersion` is the next write's
    /// precondition.
    pub(super) current: ConfigMap,
    /// The heartbeat's schedule: its liveness, and when the last one (or the write that made
    /// this term) was sent.
    pub(super) beats: Beats,
}

// === impl Beat ===

impl Beat {
    /// Renews the heartbeat every [`Liveness::period`] while the term lasts; never returns.
    /// Finds the lock gone or replaced (on a conflict or a 404), ends the term with `handle`.
    pub(super) async fn run(mut self, handle: &KeeperHandle) {
        let mut next = self.beats.first_due();
        loop {
            tokio::time::sleep_until(next).await;
            if handle.is_lost() {
                return std::future::pending().await;
            }
            steps::beat(next);
            let sent = Instant::now();
            match self.write(sent).await {
                Ok(()) => {
                    let until = self.beats.written(sent);
                    steps::confirmed(sent, until);
                    handle.confirm_until(until);
                }
                Err(Failure::Conflict | Failure::NotFound) => {
                    debug!("the lock changed since the last heartbeat; re-reading it");
                    if self.reread(handle).await {
                        continue;
                    }
                }
                Err(e) => {
                    debug!(error = ?e, "writing the heartbeat failed; the confirmation lapses unless the next one gets through")
                }
            }
            next = self.beats.next_due(sent, Instant::now());
        }
    }

    /// One heartbeat: the lock as last known, renewed (with the fencing token: writes go
    /// whole anyway).
    async fn write(&mut self, sent: Instant) -> Result<(), Failure> {
        let mut desired = with_fencing_token(self.current.clone(), self.fencing_token);
        set_heartbeat(&mut desired, Some(self.beats.liveness.advertised));
        let timeout = self.beats.write_timeout(self.api_timeout);
        let params = PostParams::default();
        let replace = self.configmaps.replace(&self.lock.name, &params, &desired);
        let written = call(cm_op(&self.lock, "update"), timeout, replace).await;
        let pre = (
            desired.metadata.uid.as_deref(),
            desired.metadata.resource_version.as_deref(),
        );
        steps::write("beat", pre, Some(&desired), sent, &written, steps::written);
        self.current = written?;
        Ok(())
    }

    /// Reads the lock after a conflict: `true` if it is still this term's (write again now).
    async fn reread(&mut self, handle: &KeeperHandle) -> bool {
        let get = self.configmaps.get_opt(&self.lock.name);
        match call(cm_op(&self.lock, "get"), self.api_timeout, get).await {
            Ok(state) => {
                check_lock("beat", handle, &self.lock_uid, &self.me, state.clone());
                match state {
                    Some(cm) if !handle.is_lost() => {
                        self.current = cm;
                        true
                    }
                    _ => false,
                }
            }
            Err(e) => {
                debug!(error = ?e, "re-reading the lock failed");
                false
            }
        }
    }
}

impl std::fmt::Debug for Beat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Beat")
            .field("lock", &self.lock)
            .field("liveness", &self.beats.liveness)
            .finish_non_exhaustive()
    }
}

/// Ends leadership if the lock (`state`, `None`: gone; seen by `from`: `watch`, or `beat`
/// after a heartbeat's conflict) is no longer the term's (`lock_uid`, owned by `me`).
pub(super) fn check_lock(
    from: &'static str,
    handle: &KeeperHandle,
    lock_uid: &str,
    me: &PodRef,
    state: Option<ConfigMap>,
) {
    let record = state.as_ref().map(LockRecord::from_config_map);
    let loss = lock_loss(lock_uid, me, record.as_ref());
    steps::lock_loss(from, lock_uid, state.as_ref(), loss.as_ref());
    match loss {
        None => {}
        Some(LossReason::LockDeleted) => {
            info!("the lock was deleted; no longer leading");
            handle.lose(LossReason::LockDeleted);
        }
        Some(reason) => {
            let uid = record.map(|r| r.uid).unwrap_or_default();
            info!(%reason, lock_uid = %uid, "the lock was replaced; no longer leading");
            handle.lose(reason);
        }
    }
}
