//! COMMAND while this candidate leads: started through its supervisor, kept confirmed by
//! renewals (a lease) or heartbeats (leader for life), told of a loss, sent the signals
//! kube-leader receives, until the supervisor reports that COMMAND has exited.

use std::time::Duration;

use kube_leader::{internal::Renewals, Leadership, LossReason};
use tokio::{
    signal::unix::SignalKind,
    sync::watch,
    time::{Instant, MissedTickBehavior},
};
use tracing::{debug, info};

use super::signals::{is_stop, Signals};
use crate::{
    label::PodLabel,
    metrics::secs,
    state::Status,
    supervisor::{Control, Report, Supervisor, SupervisorProcess},
};

/// COMMAND under its supervisor during one term, as the leader's loop sees it.
pub(super) struct Running<'a> {
    status: &'a Status,
    label: Option<&'a PodLabel>,
    token: u64,
    /// The renew deadline: how long a renewal (or heartbeat) confirms leadership.
    deadline: Duration,
    process: SupervisorProcess,
    sup: Control,
    /// Confirmed by the lease's renewals (else by the library's confirmations, or heartbeats
    /// from this loop).
    lease: bool,
    /// Leader for life with a liveness heartbeat: the library's
    /// [`confirmed_until`](Leadership::confirmed_until), the send of its last successful
    /// heartbeat plus the liveness, caps what this loop's own heartbeats confirm.
    confirmations: Option<watch::Receiver<Option<Instant>>>,
    /// Confirmed by heartbeats from this loop (leader for life; capped by `confirmations`).
    pings: bool,
    renewals: watch::Receiver<Renewals>,
    seen: Renewals,
    watching: bool,
    /// Leadership is lost (and the status says so).
    pub(super) lost: bool,
    /// A signal that stops kube-leader was forwarded.
    pub(super) stop_signal: bool,
    pub(super) command_pid: Option<u32>,
    /// Whether the supervisor said its last word (`exited`): COMMAND ended in order.
    pub(super) orderly: bool,
}

// === impl Running ===

impl<'a> Running<'a> {
    pub(super) fn new(
        status: &'a Status,
        label: Option<&'a PodLabel>,
        leadership: &Leadership,
        supervisor: Supervisor,
        renewals: Option<watch::Receiver<Renewals>>,
        deadline: Duration,
    ) -> Self {
        let Supervisor { process, control } = supervisor;
        // Lease: leadership is confirmed for the renew deadline counted from when the acquiring
        // write, then each successful renewal, was sent (the library's fail-stop rule, on the
        // same monotonic clock), never from "now": time spent since (a slow answer, a pause)
        // is not given again. Leader for life: its liveness heartbeat's confirmations, the same
        // rule; without one, liveness pings from this loop.
        let lease = renewals.is_some() && !leadership.is_skipped();
        let confirmations = Some(leadership.confirmations())
            .filter(|c| !lease && !leadership.is_skipped() && c.borrow().is_some());
        let (renewals, seen) = match renewals {
            Some(r) => {
                let seen = r.borrow().clone();
                (r, seen)
            }
            None => (watch::channel(Renewals::default()).1, Renewals::default()),
        };
        Self {
            status,
            label,
            token: leadership.fencing_token(),
            deadline,
            process,
            sup: control,
            lease,
            pings: !lease,
            confirmations,
            renewals,
            seen,
            watching: lease,
            lost: false,
            stop_signal: false,
            command_pid: None,
            orderly: false,
        }
    }

    /// Starts COMMAND with `env`, confirmed as far as leadership is.
    pub(super) async fn start(&mut self, env: &[(&str, String)]) {
        let confirmed = self.confirmations.as_mut().map(|c| *c.borrow_and_update());
        let first = match (self.lease, self.seen.leading, self.seen.last_success, confirmed) {
            (true, true, Some(sent), _) => sent + self.deadline,
            // The lease handle says it leads, but no renewal is known: nothing is confirmed.
            (true, _, _, _) => Instant::now(),
            (false, _, _, Some(until)) => self.pinged(Some(until)),
            (false, _, _, None) => Instant::now() + self.deadline,
        };
        self.sup.start(first, env).await;
    }

    /// Runs until the supervisor exits or reports that COMMAND has exited; returns the code.
    pub(super) async fn until_exit(
        &mut self,
        leadership: &Leadership,
        signals: &mut Signals,
        retry_period: Duration,
    ) -> u8 {
        let mut ping = tokio::time::interval(retry_period);
        ping.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                code = self.process.wait() => return code,
                reason = leadership.lost(), if !self.lost => self.on_lost(reason).await,
                report = self.sup.report() => {
                    if let Some(code) = self.on_report(report) {
                        return code;
                    }
                }
                kind = signals.recv() => self.on_signal(kind).await,
                changed = self.renewals.changed(), if self.watching => {
                    match changed {
                        Ok(()) => self.on_renewals().await,
                        Err(_) => self.watching = false,
                    }
                }
                changed = changed_or_pending(self.confirmations.as_mut()) => match changed {
                    Some(until) if !self.lost => {
                        let until = self.pinged(Some(Some(until)));
                        self.sup.confirm_until(until).await;
                    }
                    Some(_) => {}
                    // The keeper is gone: nothing confirms COMMAND any more.
                    None => self.confirmations = None,
                },
                _ = ping.tick(), if self.pings => {
                    // No renewals to wait for: heartbeats say that kube-leader's loop runs and
                    // the strategy has not reported a loss (capped by the liveness heartbeat's
                    // confirmation, where there is one).
                    if !self.lost {
                        let until = self.pinged(self.confirmations.as_ref().map(|c| *c.borrow()));
                        self.sup.confirm_until(until).await;
                    }
                }
            }
        }
    }

    /// Leader for life: COMMAND is confirmed while this loop runs (its pings: the renew
    /// deadline from now, so a frozen kube-leader has COMMAND stopped by the renew deadline)
    /// and, with a liveness heartbeat, no longer than the library's `confirmed` (`Some(None)`:
    /// nothing is confirmed).
    fn pinged(&self, confirmed: Option<Option<Instant>>) -> Instant {
        let now = Instant::now();
        match confirmed {
            None => now + self.deadline,
            Some(until) => until.map_or(now, |u| u.min(now + self.deadline)),
        }
    }

    async fn on_lost(&mut self, reason: LossReason) {
        self.lost = true;
        self.status.lose(self.token, &reason.to_string(), false);
        self.sup.stop().await;
        if let Some(label) = self.label {
            label.set(false);
        }
    }

    /// Handles a report of the supervisor; `Some(code)` once COMMAND has exited.
    fn on_report(&mut self, report: Report) -> Option<u8> {
        match report {
            Report::Started(pid) => {
                self.command_pid = Some(pid);
                info!(lock = %self.status.lock, pid, "started COMMAND");
            }
            Report::Expired(since) => {
                if !self.lost {
                    self.lost = true;
                    self.status.lose(
                        self.token,
                        &format!(
                            "the supervisor stopped COMMAND: leadership not confirmed for {}",
                            humantime::format_duration(Duration::from_millis(
                                u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
                            ))
                        ),
                        false,
                    );
                }
            }
            Report::Failed(code) => debug!(code, "COMMAND could not be started"),
            Report::Backstop => {
                if !self.lost {
                    self.lost = true;
                    self.status.lose(
                        self.token,
                        "kube-leader killed COMMAND: its supervisor did not stop it by its deadline",
                        false,
                    );
                }
            }
            // COMMAND and what it left are gone: step down now, without waiting for
            // the supervisor's own exit.
            Report::Exited(code) => {
                self.orderly = true;
                return Some(code);
            }
        }
        None
    }

    async fn on_signal(&mut self, kind: SignalKind) {
        info!(lock = %self.status.lock, signal = kind.as_raw_value(), "forwarding signal to COMMAND");
        self.stop_signal |= is_stop(kind);
        self.sup.signal(kind.as_raw_value()).await;
    }

    /// The lease's renewals changed: metrics, and a heartbeat confirming the last one.
    async fn on_renewals(&mut self) {
        let now = self.renewals.borrow_and_update().clone();
        if now.successes > self.seen.successes {
            if let Some(latency) = now.last_latency {
                self.status.metrics.renew.observe(secs(latency));
            }
        }
        if now.failures > self.seen.failures {
            self.status
                .metrics
                .renew_failures
                .inc_by(now.failures - self.seen.failures);
        }
        if let (true, false, Some(sent)) = (now.leading, self.lost, now.last_success) {
            self.sup.confirm_until(sent + self.deadline).await;
        }
        self.seen = now;
    }

    /// The supervisor exited (with `code`) without its last word having been read: what it
    /// said last (a loss that came together with the exit: kube-leader was frozen while the
    /// supervisor stopped COMMAND), and whether it ended in order; if not, COMMAND's group is
    /// killed and waited for ([`Control::after_exit`](crate::supervisor::Control::after_exit)).
    pub(super) async fn drain(&mut self, code: u8) {
        if self.orderly {
            return;
        }
        let words = self.sup.after_exit(code).await;
        if words.expired && !self.lost {
            self.lost = true;
            self.status.lose(
                self.token,
                "the supervisor stopped COMMAND: leadership not confirmed in time",
                false,
            );
        }
        self.command_pid = words.started.or(self.command_pid);
        self.orderly = words.orderly;
    }
}

/// The library's next confirmation; pending without confirmations. `None`: their sender (the
/// term's keeper) is gone.
async fn changed_or_pending(c: Option<&mut watch::Receiver<Option<Instant>>>) -> Option<Instant> {
    match c {
        Some(c) => {
            c.changed().await.ok()?;
            *c.borrow_and_update()
        }
        None => std::future::pending().await,
    }
}
