//! The Lease leader's keeper: the I/O of a held term. Renews every retry period with one
//! write, ends the term at the renew deadline or on another holder's write, and releases the
//! lease when the work is done; what each event means is the [`Term`]'s judgement.

use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use kube::{api::PostParams, Api};
use serde_json::json;
use tokio::{task::JoinHandle, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};

use crate::{
    api::{call, Failure},
    error::Result,
    leadership::{KeeperHandle, LossReason},
    lease::{
        config::LeaseConfig,
        record::{now_micro, stored_fencing_token, LeaseRecord},
        shared::{lease_op, Shared},
        term::{steps, Every, Step, Term},
    },
    lock::LockRef,
    object_watch::ObjectWatch,
    successor::Registry,
    time::{sleep_until_opt, until_deadline},
};

/// The leader's background task.
pub(crate) struct Keeper {
    pub(crate) api: Api<Lease>,
    pub(crate) cfg: LeaseConfig,
    pub(crate) shared: Arc<Shared>,
    pub(crate) lock: LockRef,
    pub(crate) identity: String,
    /// The term held: the Lease as last written, its record, fencing token and renewals.
    pub(crate) term: Term<Every>,
    /// The candidates' registrations, to name the successor of a release.
    pub(crate) registry: Option<Registry>,
    /// The successor, looked up while the work stops (from the shutdown on).
    pub(crate) successor: Option<JoinHandle<Option<String>>>,
    /// Keeps this candidate's registration until the term is over (dropped with the keeper).
    pub(crate) registration: Option<crate::successor::Hold>,
}

/// What one turn of the keeper's loop came to.
enum Turn {
    /// Keep the term.
    Keep,
    /// The coordinated election's controller prefers another holder: leadership is lost (the
    /// work stops), and the term is kept, renewed, until the work has stopped and the Lease
    /// is released, as on a shutdown (bounded by the shutdown grace).
    Yield,
    /// The term is over (the reason is given to the handle); `Ok` unless the release failed.
    End(Result<()>),
}

// === impl Keeper ===

impl Keeper {
    /// Keeps the term until it ends; then the handle knows why.
    pub(crate) async fn run(
        mut self,
        handle: KeeperHandle,
        mut watch: ObjectWatch<Lease>,
        done: CancellationToken,
        shutdown: CancellationToken,
    ) -> Result<()> {
        let mut grace_until: Option<Instant> = None;
        let mut watch_refused = false;
        let result = loop {
            let deadline = self.term.confirmed_until();
            handle.confirm_until(deadline);
            let turn = tokio::select! {
                biased;
                _ = tokio::time::sleep_until(deadline) => {
                    let now = Instant::now();
                    let step = self.term.deadline_reached(now);
                    steps::emit("deadline", || json!({"now": steps::ns(now), "step": steps::step(&step)}));
                    if let Step::End(LossReason::RenewDeadline { since_last_renewal: since }) = &step {
                        warn!(lock = %self.lock, identity = %self.identity, ?since, "renew deadline passed; stopping leading");
                    }
                    self.step(&handle, step)
                }
                _ = done.cancelled() => {
                    Turn::End(if self.cfg.release_on_cancel { self.release(&handle).await } else { Ok(()) })
                }
                _ = shutdown.cancelled(), if grace_until.is_none() => {
                    info!(lock = %self.lock, identity = %self.identity, "shutdown: stopping work before releasing");
                    handle.lose(LossReason::Cancelled);
                    grace_until = Some(Instant::now() + self.cfg.shutdown_grace);
                    self.look_up_successor();
                    Turn::Keep
                }
                _ = sleep_until_opt(grace_until) => {
                    warn!(lock = %self.lock, grace = ?self.cfg.shutdown_grace,
                        "the work did not stop within the shutdown grace; not releasing, the lease will expire");
                    Turn::End(Ok(()))
                }
                ev = watch.changed() => {
                    let ev = ev.map(|l| l.cloned());
                    self.on_watch(&handle, ev, &mut watch_refused)
                }
                _ = tokio::time::sleep_until(self.term.next_renewal()) => self.renew(&handle).await,
            };
            match turn {
                Turn::End(result) => break result,
                Turn::Yield if grace_until.is_none() => {
                    grace_until = Some(Instant::now() + self.cfg.shutdown_grace);
                }
                Turn::Yield | Turn::Keep => {}
            }
        };
        self.shared.set_health(|h| h.leading = false);
        if !handle.is_lost() {
            handle.lose(LossReason::Released);
        }
        if let Some(registration) = self.registration.take() {
            registration.end().await;
        }
        result
    }

    /// Acts on the term's decision: an end is told to the handle (a twin loudly).
    fn step(&self, handle: &KeeperHandle, step: Step) -> Turn {
        match step {
            Step::End(reason @ LossReason::Yielded { .. }) => {
                info!(lock = %self.lock, identity = %self.identity, %reason,
                    "giving the lease to the coordinated election's choice once the work has stopped");
                handle.lose(reason);
                Turn::Yield
            }
            Step::End(reason) => {
                if let LossReason::DuplicateIdentity { .. } = reason {
                    self.log_twin();
                }
                handle.lose(reason);
                Turn::End(Ok(()))
            }
            Step::Keep | Step::Renew { .. } | Step::Reread { .. } => Turn::Keep,
        }
    }

    /// Takes in what the Lease watch shows while leading.
    fn on_watch(
        &mut self,
        handle: &KeeperHandle,
        ev: Result<Option<Lease>, Failure>,
        watch_refused: &mut bool,
    ) -> Turn {
        match ev {
            Ok(Some(lease)) => return self.on_lease(handle, &lease),
            Ok(None) => {
                info!(lock = %self.lock, identity = %self.identity, "lease deleted; stopping leading");
                self.shared.publish(&self.lock, None, None);
                let step = self.term.deleted();
                steps::emit("deleted", || json!({"step": steps::step(&step)}));
                return self.step(handle, step);
            }
            Err(Failure::Fatal(e)) if !*watch_refused => {
                // Renewals do not need the watch, but nobody should lose a permission
                // silently (a follower needs it to wait for the lease).
                *watch_refused = true;
                warn!(lock = %self.lock, error = %e, "cannot watch the lease while leading; renewals go on");
            }
            Err(e) => debug!(error = ?e, "lease watch failed while leading; renewals go on"),
        }
        Turn::Keep
    }

    /// A Lease seen by the watch, judged by the term.
    fn on_lease(&mut self, handle: &KeeperHandle, lease: &Lease) -> Turn {
        let step = self.term.watched(lease);
        steps::emit(
            "watched",
            || json!({"lease": steps::lease(lease), "step": steps::step(&step)}),
        );
        if let Step::End(LossReason::OtherHolder { holder }) = &step {
            let record = LeaseRecord::from_lease(lease);
            self.shared
                .publish(&self.lock, Some(&record), stored_fencing_token(lease, &record));
            info!(lock = %self.lock, identity = %self.identity, holder = %holder, "another holder seen; stopping leading");
        }
        self.step(handle, step)
    }

    /// One renewal, when the term says it is due; a conflict is read again.
    async fn renew(&mut self, handle: &KeeperHandle) -> Turn {
        let (now, wall) = (Instant::now(), now_micro());
        let step = self.term.renew(now, wall);
        let sent = Instant::now();
        steps::emit(
            "renew",
            || json!({"now": steps::ns(now), "wall": wall.to_string(), "sent": steps::ns(sent), "step": steps::step(&step)}),
        );
        let (lease, deadline) = match step {
            Step::Renew { lease, until } => (lease, until),
            step => return self.renewal_over(handle, step),
        };
        let timeout = until_deadline(self.cfg.call_timeout(), deadline);
        let params = PostParams::default();
        let replace = self.api.replace(&self.lock.name, &params, &lease);
        let failure = match call(lease_op(&self.lock, "update"), timeout, replace).await {
            Ok(written) => {
                let (now, recorded) = (Instant::now(), steps::if_listening(|| steps::lease(&written)));
                self.term.renewed(written, sent);
                steps::emit("renewed", || {
                    json!({"sent": steps::ns(sent), "now": steps::ns(now),
                    "written": recorded, "confirmed_until": steps::ns(self.term.confirmed_until())})
                });
                self.shared.set_health(|h| {
                    h.last_success = Some(sent);
                    h.last_latency = Some(sent.elapsed());
                    h.successes += 1;
                });
                return Turn::Keep;
            }
            Err(failure) => failure,
        };
        match &failure {
            Failure::Transient(e) => debug!(error = %e, "renewal failed; retrying"),
            Failure::Fatal(e) => warn!(error = %e, "renewal refused; retrying until the renew deadline"),
            Failure::Conflict | Failure::NotFound => {}
        }
        let now = Instant::now();
        let step = self.term.write_failed(&failure, now);
        steps::emit(
            "write_failed",
            || json!({"now": steps::ns(now), "failure": steps::failure(&failure), "step": steps::step(&step)}),
        );
        let step = match step {
            // Re-read and decide again. The read is bounded by the renew deadline too: while
            // it runs, nothing else can end leadership, and fail-stop must hold if the API
            // server stops answering.
            Step::Reread { until } => {
                let timeout = until_deadline(self.cfg.call_timeout(), until);
                let get = self.api.get(&self.lock.name);
                let current = call(lease_op(&self.lock, "get"), timeout, get).await;
                if let Err(e) = &current {
                    debug!(error = ?e, "re-read after a conflict failed");
                }
                self.reread(current)
            }
            step => step,
        };
        self.renewal_over(handle, step)
    }

    /// What a renewal came to: a failure counted, or the end of the term.
    fn renewal_over(&mut self, handle: &KeeperHandle, step: Step) -> Turn {
        match &step {
            Step::End(reason) => {
                info!(lock = %self.lock, identity = %self.identity, %reason, "stopping leading")
            }
            _ => self.shared.set_health(|h| h.failures += 1),
        }
        self.step(handle, step)
    }

    /// Starts looking up the youngest registered candidate, the successor a release names;
    /// it runs while the work stops, so the release waits for it only where the work stops
    /// at once.
    fn look_up_successor(&mut self) {
        if let (Some(registry), None) = (&self.registry, &self.successor) {
            let (registry, me) = (registry.clone(), self.identity.clone());
            let lookup = async move { registry.youngest_other(&me).await };
            self.successor = Some(tokio::spawn(lookup.in_current_span()));
        }
    }

    /// The successor the release names (see [`look_up_successor`](Self::look_up_successor)).
    async fn successor(&mut self) -> Option<String> {
        self.look_up_successor();
        let lookup = self.successor.take()?;
        let found = tokio::time::timeout(self.cfg.call_timeout(), lookup).await;
        found.ok().and_then(|r| r.ok()).flatten()
    }

    /// Clears the holder, as client-go's `ReleaseOnCancel` does: holder "", duration 1 s; with
    /// a registry, names the youngest live candidate as the preferred successor
    /// ([`PREFERRED_HOLDER_ANNOTATION`](crate::successor::PREFERRED_HOLDER_ANNOTATION)).
    async fn release(&mut self, handle: &KeeperHandle) -> Result<()> {
        let lost = if handle.is_lost() { handle.reason() } else { None };
        if !self.term.may_release(Instant::now(), lost.as_ref()) {
            return Ok(());
        }
        // The loss first: once the release is written, a successor may start at once, and no
        // work gated on this term may still be running then.
        handle.lose(LossReason::Released);
        // A Lease yielded to the coordinated election's controller goes to its choice: no
        // successor of kube-leader's own is named.
        let successor = match lost {
            Some(LossReason::Yielded { .. }) => None,
            _ => self.successor().await,
        };
        for _ in 0..2 {
            let lease = self.term.release_write(successor.as_deref(), now_micro());
            let params = PostParams::default();
            let replace = self.api.replace(&self.lock.name, &params, &lease);
            let answer = call(lease_op(&self.lock, "update"), self.cfg.call_timeout(), replace).await;
            steps::emit("release", || {
                json!({"now": steps::ns(Instant::now()), "precondition": steps::rv(&lease),
                "lease": steps::lease(&lease), "answer": steps::answer(&answer)})
            });
            match answer {
                Ok(_) => {
                    let successor = successor.as_deref().unwrap_or("(none)");
                    info!(lock = %self.lock, identity = %self.identity, %successor, "released the lease");
                    return Ok(());
                }
                Err(Failure::Conflict) => {
                    let get = self.api.get(&self.lock.name);
                    let current = call(lease_op(&self.lock, "get"), self.cfg.call_timeout(), get).await;
                    if current.is_err() || self.reread(current) != Step::Keep {
                        return Ok(()); // not ours any more: nothing to release
                    }
                }
                Err(Failure::NotFound) => return Ok(()),
                Err(Failure::Transient(e)) => {
                    warn!(error = %e, "could not release the lease; it will expire");
                    return Ok(());
                }
                Err(Failure::Fatal(e)) => return Err(e),
            }
        }
        Ok(())
    }

    /// Judges the answer to a re-read (a step recorded for trace checking).
    fn reread(&mut self, answer: Result<Lease, Failure>) -> Step {
        let now = Instant::now();
        let recorded = steps::if_listening(|| steps::answer(&answer));
        let step = self.term.reread(answer, now);
        steps::emit(
            "reread",
            || json!({"now": steps::ns(now), "answer": recorded, "step": steps::step(&step)}),
        );
        step
    }

    /// The Lease names this candidate but this process did not write it: another process
    /// shares the identity. Both must not lead; this one stops, loudly.
    fn log_twin(&self) {
        tracing::error!(lock = %self.lock, identity = %self.identity,
            "another process wrote the lease under this candidate's identity: two candidates share \
             one identity (a copied --identity, two containers of one Pod, or host names under \
             hostNetwork); stopping leading. Give every candidate a unique identity (POD_NAME from \
             the Downward API, or --identity)");
    }
}
