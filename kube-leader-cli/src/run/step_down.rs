//! The end of a term: once COMMAND has exited, stepping down as the way it ended asks
//! ([`StepDown`]).

use std::time::Duration;

use kube_leader::internal::StrategyExt as _;
use kube_leader::Leadership;
use tracing::{info, warn};

use super::command::Running;
use crate::{exit, label::PodLabel, state::Status};

/// The leader stepping down, once COMMAND is gone (or could not start).
pub(super) struct Leaving<'a> {
    pub(super) status: &'a Status,
    pub(super) label: Option<&'a PodLabel>,
    /// How long a release may take.
    pub(super) renew_deadline: Duration,
}

/// How kube-leader steps down once COMMAND is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StepDown {
    /// Release the lock: another candidate takes over at once.
    Release,
    /// Keep the lock as it is: it expires (a lease), or stays with the Pod (leader for life).
    Keep,
    /// COMMAND's end is not known to be orderly (its supervisor died): neither release nor
    /// touch anything; the lease runs out as if this process had crashed.
    Abandon,
    /// Leadership was lost, but the lock is still this term's to hand over: this candidate's
    /// own Pod is ending (leader for life: delete the lock anyway, UID precondition, never a
    /// newer lock, since COMMAND has stopped and the lock goes with the Pod), its lock was
    /// deleted under it (leader for life says its work stopped), or the coordinated election's
    /// controller prefers another holder (the Lease is released, so the controller hands it
    /// over at once).
    ReleaseAfterLoss,
}

// === impl Leaving ===

impl Leaving<'_> {
    /// COMMAND could not start: keeps the lock as it is; returns the exit code.
    pub(super) async fn not_started(&self, leadership: Leadership) -> u8 {
        self.step_down(leadership, StepDown::Keep).await;
        self.settle_label().await;
        exit::INTERNAL
    }

    /// COMMAND has exited with `code`: steps down as the way it ended asks, and returns the
    /// exit code once the Pod label says "not leader".
    pub(super) async fn end(&self, leadership: Leadership, running: Running<'_>, code: u8) -> u8 {
        let code = self.after(leadership, running, code).await;
        self.settle_label().await;
        code
    }

    /// Waits (at most 10 s) until the Pod label says "not leader".
    async fn settle_label(&self) {
        if let Some(label) = self.label {
            label.set(false);
            label.settle(Duration::from_secs(10)).await;
        }
    }

    /// COMMAND has exited with `code`: steps down as the way it ended asks.
    async fn after(&self, leadership: Leadership, mut running: Running<'_>, code: u8) -> u8 {
        let lock = &self.status.lock;
        let token = leadership.fencing_token();
        if !running.orderly {
            return self.abandon(leadership, &running, code).await;
        }
        if let (Some(reason), false) = (leadership.loss_reason(), running.lost) {
            running.lost = true;
            self.status.lose(token, &reason.to_string(), false);
        }
        if running.lost {
            info!(lock = %lock, code, "COMMAND stopped after the loss of leadership");
            // A leader for life whose own Pod is ending (deleted, evicted) deletes its lock now
            // that COMMAND has stopped (UID precondition: never a newer lock). The lock goes with
            // the Pod anyway, and the successor need not wait until the Pod object is gone: on a
            // real node that takes seconds after `kubectl delete pod` (the kubelet stops every
            // container first). The leader usually sees its Pod's deletion before the kubelet's
            // SIGTERM reaches it, so this is the common path of a deletion, not the signal's.
            // Likewise a leader for life whose lock was deleted under it: now that COMMAND has
            // stopped it says so (the library creates the lock again, marked released), and
            // waiting candidates, which do not take over without that word, take over at once.
            let says_stopped = self.status.strategy.keeps_lock_after_work()
                && leadership.loss_reason() == Some(kube_leader::LossReason::LockDeleted);
            let how = if says_stopped
                || matches!(
                    leadership.loss_reason(),
                    Some(kube_leader::LossReason::PodEnding { .. } | kube_leader::LossReason::Yielded { .. })
                ) {
                StepDown::ReleaseAfterLoss
            } else {
                StepDown::Keep
            };
            self.step_down(leadership, how).await;
            return exit::LOST;
        }
        info!(lock = %lock, code, "COMMAND exited");
        self.status.lose(token, "COMMAND exited", true);
        // A lease is always released; a leader-for-life lock only when asked to stop (the Pod is
        // going away), since a restarted kube-leader in the same Pod continues on it.
        let release = !self.status.strategy.keeps_lock_after_work() || running.stop_signal;
        let how = if release {
            StepDown::Release
        } else {
            StepDown::Keep
        };
        self.step_down(leadership, how).await;
        code
    }

    /// The supervisor died unexpectedly: COMMAND's end is not known to be orderly.
    async fn abandon(&self, leadership: Leadership, running: &Running<'_>, code: u8) -> u8 {
        let lock = &self.status.lock;
        let command_pid = running.command_pid;
        // Killed, or crashed: COMMAND's group was killed and waited for (`Supervised::died`).
        // Nothing is released, as if this process had crashed: only the lease's expiry can tell
        // that COMMAND is gone.
        warn!(lock = %lock, code, command_pid,
            "the supervisor died unexpectedly; not releasing the lock");
        self.status.lose(
            leadership.fencing_token(),
            "the supervisor died unexpectedly",
            false,
        );
        self.step_down(leadership, StepDown::Abandon).await;
        exit::LOST
    }

    /// Steps down: releases the lock, keeps it, or leaves it as it is (`how`).
    async fn step_down(&self, leadership: Leadership, how: StepDown) {
        if let Some(label) = self.label {
            label.set(false);
        }
        if how == StepDown::Abandon {
            // Dropping the handle would let the library step down (release a lease) in the
            // background; the process exits right after, so the handle is leaked instead.
            std::mem::forget(leadership);
            return;
        }
        let lost = !leadership.is_leader() && how != StepDown::ReleaseAfterLoss;
        if how == StepDown::Keep || leadership.is_skipped() || lost {
            return;
        }
        let lock = &self.status.lock;
        match tokio::time::timeout(self.renew_deadline, leadership.release()).await {
            Ok(Ok(())) => info!(lock = %lock, identity = %self.status.identity, "released the lock"),
            Ok(Err(e)) => warn!(lock = %lock, error = %e, "could not release the lock"),
            Err(_) => warn!(lock = %lock, "releasing the lock timed out"),
        }
    }
}
