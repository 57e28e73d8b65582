//! The Lease leader's keeper: renews every retry period with one write, ends the term at the
//! renew deadline or on another holder's write, and releases the lease when the work is done.

use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use kube::{api::PostParams, Api};
use tokio::{task::JoinHandle, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};

use super::{
    config::LeaseConfig,
    record::{release_write, renewal_write, stored_fencing_token, LeaseRecord, Owner},
    shared::{lease_op, Shared},
};
use crate::{
    api::{call, Failure},
    error::Result,
    leadership::{KeeperHandle, LossReason},
    lock::{self, LockRef},
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
    /// The Lease as last written by us (its resourceVersion is the next write's precondition).
    pub(crate) lease: Lease,
    pub(crate) record: LeaseRecord,
    /// This term's fencing token, stored in the Lease by every renewal for observers.
    pub(crate) fencing_token: u64,
    /// When the last successful renewal was sent.
    pub(crate) last_sent: Instant,
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
        let mut next_renewal = self.last_sent + self.cfg.retry_period;
        let mut grace_until: Option<Instant> = None;
        let mut watch_refused = false;
        let result = loop {
            let deadline = self.last_sent + self.cfg.renew_deadline;
            handle.confirm_until(deadline);
            let turn = tokio::select! {
                biased;
                _ = tokio::time::sleep_until(deadline) => {
                    let since = self.last_sent.elapsed();
                    warn!(lock = %self.lock, identity = %self.identity, ?since, "renew deadline passed; stopping leading");
                    handle.lose(LossReason::RenewDeadline { since_last_renewal: since });
                    Turn::End(Ok(()))
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
                _ = tokio::time::sleep_until(next_renewal) => {
                    let (turn, next) = self.on_renewal_due(&handle, deadline).await;
                    next_renewal = next;
                    turn
                }
            };
            if let Turn::End(result) = turn {
                break result;
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

    /// Takes in what the Lease watch shows while leading.
    fn on_watch(
        &mut self,
        handle: &KeeperHandle,
        ev: Result<Option<Lease>, Failure>,
        watch_refused: &mut bool,
    ) -> Turn {
        match ev {
            Ok(Some(lease)) => return self.on_lease(handle, lease),
            Ok(None) => {
                info!(lock = %self.lock, identity = %self.identity, "lease deleted; stopping leading");
                self.shared.publish(&self.lock, None, None);
                handle.lose(LossReason::LockDeleted);
                return Turn::End(Ok(()));
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

    /// A Lease seen by the watch: only a record newer than our last write can depose us (our
    /// write carried the version we decided on; older events cannot be current).
    fn on_lease(&mut self, handle: &KeeperHandle, lease: Lease) -> Turn {
        let v = |l: &Lease| l.metadata.resource_version.clone();
        if !lock::is_newer(v(&lease).as_deref(), v(&self.lease).as_deref()) {
            return Turn::Keep;
        }
        let record = LeaseRecord::from_lease(&lease);
        match Owner::of(&lease, &record, &self.identity, &self.shared.instance) {
            Owner::Other(holder) => {
                self.shared
                    .publish(&self.lock, Some(&record), stored_fencing_token(&lease, &record));
                info!(lock = %self.lock, identity = %self.identity, holder = %holder, "another holder seen; stopping leading");
                handle.lose(LossReason::OtherHolder { holder });
                Turn::End(Ok(()))
            }
            Owner::Twin => {
                handle.lose(self.duplicate_identity());
                Turn::End(Ok(()))
            }
            Owner::Mine => {
                // Our lease, touched by somebody else (labels): keep its version.
                self.lease = lease;
                Turn::Keep
            }
        }
    }

    /// Renews; returns the turn and when the next renewal is due.
    async fn on_renewal_due(&mut self, handle: &KeeperHandle, deadline: Instant) -> (Turn, Instant) {
        match self.renew(deadline).await {
            Ok(()) => (Turn::Keep, self.last_sent + self.cfg.retry_period),
            Err(Some(reason)) => {
                info!(lock = %self.lock, identity = %self.identity, %reason, "stopping leading");
                handle.lose(reason);
                (Turn::End(Ok(())), Instant::now())
            }
            Err(None) => {
                self.shared.set_health(|h| h.failures += 1);
                (Turn::Keep, Instant::now() + self.cfg.retry_period)
            }
        }
    }

    /// Whose `lease` (its record `record`) is (see [`Owner`]).
    fn owner(&self, lease: &Lease, record: &LeaseRecord) -> Owner {
        Owner::of(lease, record, &self.identity, &self.shared.instance)
    }

    /// One renewal. `Err(Some(reason))`: leadership is over; `Err(None)`: retry later.
    async fn renew(&mut self, deadline: Instant) -> Result<(), Option<LossReason>> {
        let (lease, record) = renewal_write(
            &self.lease,
            &self.record,
            self.cfg.lease_duration_seconds(),
            &self.identity,
            self.fencing_token,
            &self.shared.instance,
        );
        let timeout = until_deadline(self.cfg.api_timeout(), deadline);
        let sent = Instant::now();
        let params = PostParams::default();
        let replace = self.api.replace(&self.lock.name, &params, &lease);
        match call(lease_op(&self.lock, "update"), timeout, replace).await {
            Ok(written) => {
                self.lease = written;
                self.record = record;
                self.last_sent = sent;
                self.shared.set_health(|h| {
                    h.last_success = Some(sent);
                    h.last_latency = Some(sent.elapsed());
                    h.successes += 1;
                });
                Ok(())
            }
            Err(Failure::Conflict) => self.after_conflict(deadline).await,
            Err(Failure::NotFound) => Err(Some(LossReason::LockDeleted)),
            Err(Failure::Transient(e)) => {
                debug!(error = %e, "renewal failed; retrying");
                Err(None)
            }
            Err(Failure::Fatal(e)) => {
                warn!(error = %e, "renewal refused; retrying until the renew deadline");
                Err(None)
            }
        }
    }

    /// A renewal met a conflict: re-read and decide again, still ours (somebody edited
    /// metadata) or lost. The read is bounded by the renew deadline too: while it runs, nothing
    /// else can end leadership, and fail-stop must hold if the API server stops answering.
    async fn after_conflict(&mut self, deadline: Instant) -> Result<(), Option<LossReason>> {
        let timeout = until_deadline(self.cfg.api_timeout(), deadline);
        match call(
            lease_op(&self.lock, "get"),
            timeout,
            self.api.get(&self.lock.name),
        )
        .await
        {
            Ok(current) => match self.owner(&current, &LeaseRecord::from_lease(&current)) {
                Owner::Mine => {
                    self.lease = current;
                    Err(None)
                }
                Owner::Twin => Err(Some(self.duplicate_identity())),
                other => Err(other.loss(&self.identity)),
            },
            Err(Failure::NotFound) => Err(Some(LossReason::LockDeleted)),
            Err(e) => {
                debug!(error = ?e, "re-read after a conflict failed");
                Err(None)
            }
        }
    }

    /// Starts looking up the youngest registered candidate, the successor a release names;
    /// it runs while the work stops, so the release waits for no extra request.
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
        let found = tokio::time::timeout(self.cfg.api_timeout(), lookup).await;
        found.ok().and_then(|r| r.ok()).flatten()
    }

    /// Clears the holder, as client-go's `ReleaseOnCancel` does: holder "", duration 1 s; with
    /// a registry, names the youngest live candidate as the preferred successor
    /// ([`PREFERRED_HOLDER_ANNOTATION`](crate::successor::PREFERRED_HOLDER_ANNOTATION)).
    async fn release(&mut self, handle: &KeeperHandle) -> Result<()> {
        if handle.is_lost() && !matches!(handle.reason(), Some(LossReason::Cancelled) | None) {
            return Ok(());
        }
        // The loss first: once the release is written, a successor may start at once, and no
        // work gated on this term may still be running then.
        handle.lose(LossReason::Released);
        let successor = self.successor().await;
        for _ in 0..2 {
            let (lease, _) = release_write(
                &self.lease,
                self.record.transitions,
                &self.shared.instance,
                successor.as_deref(),
            );
            let params = PostParams::default();
            let replace = self.api.replace(&self.lock.name, &params, &lease);
            match call(lease_op(&self.lock, "update"), self.cfg.api_timeout(), replace).await {
                Ok(_) => {
                    let successor = successor.as_deref().unwrap_or("(none)");
                    info!(lock = %self.lock, identity = %self.identity, %successor, "released the lease");
                    return Ok(());
                }
                Err(Failure::Conflict) => {
                    let get = self.api.get(&self.lock.name);
                    match call(lease_op(&self.lock, "get"), self.cfg.api_timeout(), get).await {
                        Ok(current)
                            if self.owner(&current, &LeaseRecord::from_lease(&current)) == Owner::Mine =>
                        {
                            self.lease = current
                        }
                        _ => return Ok(()), // not ours any more: nothing to release
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

    /// The Lease names this candidate but this process did not write it: another process
    /// shares the identity. Both must not lead; this one stops, loudly.
    fn duplicate_identity(&self) -> LossReason {
        tracing::error!(lock = %self.lock, identity = %self.identity,
            "another process wrote the lease under this candidate's identity: two candidates share \
             one identity (a copied --identity, two containers of one Pod, or host names under \
             hostNetwork); stopping leading. Give every candidate a unique identity (POD_NAME from \
             the Downward API, or --identity)");
        LossReason::DuplicateIdentity {
            identity: self.identity.clone(),
        }
    }
}
