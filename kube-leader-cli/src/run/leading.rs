//! The leader's side of `run`: from starting COMMAND until it has exited, then stepping down
//! as the way COMMAND ended asks ([`StepDown`]).

use std::time::Duration;

use kube_leader::Leadership;
use tracing::{info, warn};

use super::{command::Running, signals::Signals};
use crate::{
    exit,
    label::PodLabel,
    state::Status,
    supervisor::{Launch, Supervisor},
};

/// The leader's loop, from starting COMMAND until it has exited.
pub(super) struct Leading<'a> {
    /// What starts COMMAND's supervisor, should the one started in advance be gone.
    pub(super) launch: &'a Launch,
    /// The renew deadline: how long the loop's own ping confirms, and how long a release may
    /// take.
    pub(super) renew_deadline: Duration,
    /// How often the loop pings where the library gives no confirmations.
    pub(super) retry_period: Duration,
    pub(super) status: &'a Status,
    pub(super) label: Option<&'a PodLabel>,
    /// `--fence`: kube-leader's client and user, through which COMMAND's fencing proxy writes.
    pub(super) fence: Option<(kube::Client, String)>,
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

// === impl Leading ===

impl Leading<'_> {
    /// Runs COMMAND under its supervisor while `leadership` lasts; returns the exit code.
    pub(super) async fn run(
        self,
        leadership: Leadership,
        standby: Option<Supervisor>,
        signals: &mut Signals,
    ) -> u8 {
        let lock = &self.status.lock;
        let token = leadership.fencing_token();
        let mut env = vec![
            ("KUBE_LEADER_IDENTITY", self.status.identity.clone()),
            ("KUBE_LEADER_LOCK", lock.name.clone()),
            ("KUBE_LEADER_NAMESPACE", lock.namespace.clone()),
            ("KUBE_LEADER_FENCING_TOKEN", token.to_string()),
        ];
        // `--fence`: COMMAND's API requests go through a proxy that adds this term's token; it
        // stops when this function returns.
        let _proxy = match &self.fence {
            Some((client, user)) => {
                match crate::fence::start_proxy(
                    client.clone(),
                    user,
                    crate::fence::Tokens::Term(token),
                    &std::env::temp_dir(),
                )
                .await
                {
                    Ok(proxy) => {
                        env.push(("KUBECONFIG", proxy.kubeconfig.display().to_string()));
                        Some(proxy)
                    }
                    Err(e) => {
                        warn!(error = %e, "cannot start the fencing proxy");
                        self.step_down(leadership, StepDown::Keep).await;
                        return exit::INTERNAL;
                    }
                }
            }
            None => None,
        };
        let ready = standby.and_then(|mut s| (!s.process.has_exited()).then_some(s));
        let supervisor = match ready {
            Some(s) => Ok(s),
            None => self.launch.spawn(),
        };
        let supervisor = match supervisor {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %format!("{e:#}"), "cannot start the supervisor");
                self.step_down(leadership, StepDown::Keep).await;
                return exit::INTERNAL;
            }
        };
        let timings = (self.renew_deadline, self.retry_period);
        let mut running = Running::new(self.status, self.label, &leadership, supervisor, timings);
        running.start(&env).await;
        let code = running.until_exit(&leadership, signals).await;
        running.drain(code).await;
        self.end(leadership, running, code).await
    }

    /// COMMAND has exited with `code`: steps down as the way it ended asks.
    async fn end(&self, leadership: Leadership, mut running: Running<'_>, code: u8) -> u8 {
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
        // Killed, or crashed: COMMAND's group was killed and waited for (`drain`). Nothing is
        // released, as if this process had crashed: only the lease's expiry can tell that
        // COMMAND is gone.
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
