//! The Lease elector: campaign, renew, release.

use std::{
    future::Future,
    sync::Arc,
    time::{Duration, SystemTime},
};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{api::PostParams, Api, Client};
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, info_span, warn, Instrument};

use super::{
    config::LeaseConfig,
    decide::{decide, decide_absent, record_for, Absent, Decision, Observed},
    record::{
        new_instance_id, now_micro, set_fencing_token, set_writer, stored_fencing_token, written_by,
        LeaseRecord,
    },
};
use crate::{
    api::{call, Failure, Op},
    error::{Error, Result},
    events::EventRecorder,
    leadership::{Keeper, LeaderInfo, Leadership, LossReason, Strategy, Term},
    lock::{self, LockRef},
    object_watch::{self, Change, ObjectWatch},
    observer::{Hooks, Observer},
};

/// Where to find a Role that grants what the Lease strategy needs.
pub(crate) const RBAC_HINT: &str =
    "the one `kube-leader rbac --strategy lease --lock LOCK --namespace NS` prints \
     (https://github.com/kube-leader/kube-leader/blob/main/deploy/lease/rbac-lease.yaml)";
const RESOURCE: &str = "leases.coordination.k8s.io";

/// Whether [`LeaseElector::run`] campaigns again after losing leadership.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Recampaign {
    /// Return after the first term, like client-go's `Run`.
    Once,
    /// Campaign again after every lost term, until shutdown.
    Always,
}

/// Why the watchdog thinks this candidate is unhealthy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("believes it leads {lock} but has not renewed for {since:?} (lease duration {lease_duration:?} + tolerance {tolerance:?})")]
pub struct Unhealthy {
    /// The lock.
    pub lock: String,
    /// Time since the last successful renewal was sent.
    pub since: Duration,
    /// The lease duration.
    pub lease_duration: Duration,
    /// The tolerance given to the check.
    pub tolerance: Duration,
}

/// What a candidate's renewals look like, published on [`LeaseElector::renewals`]: a
/// heartbeat for supervisors, and the figures for metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Renewals {
    /// Whether this candidate currently leads.
    pub leading: bool,
    /// When the last successful renewal (or the acquisition) was sent.
    pub last_success: Option<Instant>,
    /// How long the last successful renewal took.
    pub last_latency: Option<Duration>,
    /// Successful renewals since this elector was created.
    pub successes: u64,
    /// Failed renewal attempts since this elector was created.
    pub failures: u64,
}

/// State shared by the elector and its background tasks.
#[derive(Debug)]
struct Shared {
    leader: watch::Sender<Option<LeaderInfo>>,
    renewals: watch::Sender<Renewals>,
    /// The greatest `leaseTransitions` this elector has seen on its Lease (`None`: it never saw
    /// the Lease): a Lease it creates again after a deletion goes on counting from there.
    transitions_seen: std::sync::Mutex<Option<u32>>,
    /// This candidate's instance id, written beside every record it writes, so that it tells
    /// its own records from those of another process with the same identity.
    instance: String,
}

impl Shared {
    fn set_health(&self, f: impl FnOnce(&mut Renewals)) {
        self.renewals.send_modify(f);
    }

    /// Whether this elector has seen its Lease (in any campaign or term).
    fn saw_lease(&self) -> bool {
        self.transitions_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    fn saw_transitions(&self, transitions: u32) {
        let mut seen = self.transitions_seen.lock().unwrap_or_else(|e| e.into_inner());
        *seen = Some(seen.map_or(transitions, |s| s.max(transitions)));
    }

    /// `leaseTransitions` for a Lease this elector creates: one more than the greatest it saw;
    /// 0 if it saw none, or only an exhausted count (the fencing token does not depend on it).
    fn transitions_for_create(&self) -> u32 {
        let seen = self.transitions_seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.filter(|s| *s < i32::MAX.unsigned_abs()).map_or(0, |s| s + 1)
    }
}

/// A candidate for a `coordination.k8s.io/v1` Lease, compatible with client-go's
/// `leaderelection` on the same Lease.
///
/// ```no_run
/// # async fn run(client: kube::Client) -> kube_leader::Result<()> {
/// use kube_leader::LeaseElector;
/// use tokio_util::sync::CancellationToken;
///
/// let shutdown = CancellationToken::new();
/// let leadership = LeaseElector::new(client, "my-operator").become_leader(&shutdown).await?;
/// // ... work until leadership.lost_token() is cancelled, then:
/// leadership.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LeaseElector {
    client: Client,
    name: String,
    namespace: Option<String>,
    identity: Option<String>,
    config: LeaseConfig,
    shared: Arc<Shared>,
    /// The observer and the Events (see [`observer`](Self::observer), [`events`](Self::events)).
    hooks: Hooks,
}

// === impl LeaseElector ===

impl std::fmt::Debug for LeaseElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseElector")
            .field("name", &self.name)
            .field("namespace", &self.namespace)
            .field("identity", &self.identity)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl LeaseElector {
    /// A candidate for the Lease `name`, with client-go's default timings.
    ///
    /// The namespace is, in order: [`namespace`](Self::namespace), `POD_NAMESPACE`, the in-cluster
    /// service-account namespace, the client's default namespace. The identity is, in order:
    /// [`identity`](Self::identity), `POD_NAME`, the host name.
    #[must_use]
    pub fn new(client: Client, name: impl Into<String>) -> Self {
        Self {
            hooks: Hooks::new(Some(EventRecorder::new(client.clone()))),
            client,
            name: name.into(),
            namespace: None,
            identity: None,
            config: LeaseConfig::default(),
            shared: Arc::new(Shared {
                leader: watch::channel(None).0,
                renewals: watch::channel(Renewals::default()).0,
                transitions_seen: std::sync::Mutex::new(None),
                instance: new_instance_id(),
            }),
        }
    }

    /// Sets the namespace of the Lease.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Sets this candidate's identity (`holderIdentity`); it must be unique among candidates.
    ///
    /// Every candidate also has a random instance id, written beside each record it writes
    /// ([`INSTANCE_ANNOTATION`](crate::lease::INSTANCE_ANNOTATION)). A Lease held under this
    /// identity that this candidate did not write (a second process with the same identity, or
    /// this candidate's process before a restart) is waited out like any other holder's, and a
    /// leader that sees such a write stops with
    /// [`LossReason::DuplicateIdentity`](crate::LossReason::DuplicateIdentity) and an error log.
    /// A restarted candidate therefore takes its old lease over only when it expires (or at
    /// once, if the old process released it on its way out).
    #[must_use]
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.identity = Some(identity.into());
        self
    }

    /// Sets all timings and options at once.
    #[must_use]
    pub fn config(mut self, config: LeaseConfig) -> Self {
        self.config = config;
        self
    }

    /// Sets the lease duration (see [`LeaseConfig::lease_duration`]).
    #[must_use]
    pub fn lease_duration(mut self, d: Duration) -> Self {
        self.config.lease_duration = d;
        self
    }

    /// Sets the renew deadline (see [`LeaseConfig::renew_deadline`]).
    #[must_use]
    pub fn renew_deadline(mut self, d: Duration) -> Self {
        self.config.renew_deadline = d;
        self
    }

    /// Sets the retry period (see [`LeaseConfig::retry_period`]).
    #[must_use]
    pub fn retry_period(mut self, d: Duration) -> Self {
        self.config.retry_period = d;
        self
    }

    /// Calls `observer` with what this candidate observes about its own leadership (terms,
    /// renewals), for metrics of your own: see [`observer`](crate::observer).
    #[must_use]
    pub fn observer(mut self, observer: impl Observer) -> Self {
        self.hooks.set_observer(Arc::new(observer));
        self
    }

    /// Whether to record client-go's `LeaderElection` Events on the Lease, "ID became leader"
    /// and "ID stopped leading" (default `true`; needs `create events`, see
    /// [`events`](crate::events)).
    #[must_use]
    pub fn events(mut self, record: bool) -> Self {
        self.hooks
            .set_events(record.then(|| EventRecorder::new(self.client.clone())));
        self
    }

    /// Whether to clear the holder on shutdown or release (default `true`).
    #[must_use]
    pub fn release_on_cancel(mut self, release: bool) -> Self {
        self.config.release_on_cancel = release;
        self
    }

    /// The timings in force.
    pub fn lease_config(&self) -> &LeaseConfig {
        &self.config
    }

    /// The lock this candidate campaigns for (namespace resolved as documented in [`new`](Self::new)).
    pub fn lock(&self) -> Result<LockRef> {
        let ns = lock::discover_namespace(self.namespace.as_deref())
            .map(|(ns, _)| ns)
            .unwrap_or_else(|| self.client.default_namespace().to_string());
        LockRef::new(ns, self.name.clone())
    }

    /// This candidate's identity (resolved as documented in [`new`](Self::new)).
    pub fn resolved_identity(&self) -> Result<String> {
        let id = self
            .identity
            .clone()
            .or_else(lock::pod_name_from_env)
            .or_else(hostname)
            .unwrap_or_default();
        if id.trim().is_empty() {
            return Err(Error::InvalidConfig("identity must not be empty".into()));
        }
        Ok(id)
    }

    /// The current leader as this candidate last saw it (updated while it campaigns or leads).
    pub fn observe(&self) -> watch::Receiver<Option<LeaderInfo>> {
        self.shared.leader.subscribe()
    }

    /// Renewal figures of this candidate, updated on every renewal attempt: a heartbeat for
    /// supervisors and the source of renewal metrics.
    pub fn renewals(&self) -> watch::Receiver<Renewals> {
        self.shared.renewals.subscribe()
    }

    /// The election watchdog (client-go's `HealthzAdaptor`): unhealthy if this candidate believes
    /// it leads but has not renewed for longer than the lease duration plus `tolerance`.
    pub fn check_health(&self, tolerance: Duration) -> Result<(), Unhealthy> {
        let h = self.shared.renewals.borrow();
        match (h.leading, h.last_success) {
            (true, Some(last)) if last.elapsed() > self.config.lease_duration + tolerance => Err(Unhealthy {
                lock: self.name.clone(),
                since: last.elapsed(),
                lease_duration: self.config.lease_duration,
                tolerance,
            }),
            _ => Ok(()),
        }
    }

    /// Campaigns until this candidate leads, then returns its [`Leadership`].
    ///
    /// Followers watch the Lease and sleep until the holder's lease expires by their own clock,
    /// sending no request meanwhile; a released lease is taken at once. Once leading, a
    /// background task renews every retry period with a single write, and ends leadership
    /// (cancelling [`Leadership::lost_token`]) as soon as it sees another holder, or when the
    /// renew deadline passes without a successful renewal.
    ///
    /// `shutdown` is composable: cancelled while campaigning, this returns
    /// [`Error::Cancelled`]; cancelled while leading, leadership ends with
    /// [`LossReason::Cancelled`], renewals go on until the handle is dropped or released (at most
    /// [`LeaseConfig::shutdown_grace`]), then the lease is released.
    ///
    /// # Cancellation safety
    /// Cancel-safe: dropping the future while campaigning leaves no state behind. A write
    /// that was in flight may still have made this candidate the holder; it is then released
    /// by nobody and expires after the lease duration.
    pub async fn become_leader(&self, shutdown: &CancellationToken) -> Result<Leadership> {
        self.config.validate()?;
        let lock = self.lock()?;
        let identity = self.resolved_identity()?;
        let span = info_span!("lease_election", lock = %lock, identity = %identity);
        self.campaign(lock, identity, shutdown.clone())
            .instrument(span)
            .await
    }

    /// Runs `work` whenever this candidate leads, until `shutdown`.
    ///
    /// `work` gets the term and a token cancelled when leadership is lost (or on shutdown); it
    /// must return soon after. Only then is the lease released, so work never overlaps the next
    /// leader's through a premature release. With [`Recampaign::Always`] the candidate
    /// campaigns again after each term; with [`Recampaign::Once`] it returns after one.
    ///
    /// # Cancellation safety
    /// Not cancel-safe: use `shutdown` to stop it.
    pub async fn run<F, Fut>(
        &self,
        shutdown: &CancellationToken,
        recampaign: Recampaign,
        mut work: F,
    ) -> Result<()>
    where
        F: FnMut(Term, CancellationToken) -> Fut,
        Fut: Future<Output = ()>,
    {
        loop {
            let leadership = match self.become_leader(shutdown).await {
                Ok(l) => l,
                Err(Error::Cancelled { .. }) => return Ok(()),
                Err(e) => return Err(e),
            };
            work(leadership.term().clone(), leadership.lost_token()).await;
            leadership.release().await?;
            if shutdown.is_cancelled() || recampaign == Recampaign::Once {
                return Ok(());
            }
        }
    }

    async fn campaign(
        &self,
        lock: LockRef,
        identity: String,
        shutdown: CancellationToken,
    ) -> Result<Leadership> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &lock.namespace);
        let op = |verb| lease_op(&lock, verb);
        let mut watch = ObjectWatch::new(api.clone(), &lock.name, op("watch"));
        let mut observed: Option<Observed> = None;
        // While the Lease is absent: what this candidate last saw before it was deleted.
        let mut deleted: Option<Observed> = None;
        // Whether this elector saw the Lease before this campaign (an earlier term or campaign).
        let seen_before = self.shared.saw_lease();
        let mut absent_since: Option<Instant> = None;
        // Absent on a relist after this campaign knew the Lease: since when (nobody saw it go).
        let mut unknown_since: Option<Instant> = None;
        // A record under our identity that another process wrote, as last logged.
        let mut twin_logged: Option<LeaseRecord> = None;
        let cfg = &self.config;
        let cancelled = || Error::Cancelled {
            lock: lock.to_string(),
        };
        info!("campaigning");

        loop {
            if !watch.is_synced() {
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => return Err(cancelled()),
                    ev = watch.change() => self.absorb(ev, &mut observed, &mut deleted, &mut unknown_since, &lock)?,
                }
                continue;
            }
            let decision = match &observed {
                Some(obs) => {
                    absent_since = None;
                    log_twin(obs, &identity, &mut twin_logged);
                    decide(observed.as_ref(), &identity, Instant::now(), cfg.lease_duration)
                }
                None => {
                    let since = *absent_since.get_or_insert_with(Instant::now);
                    let absent = match (&deleted, unknown_since) {
                        (Some(d), _) => Absent::Deleted(d),
                        (None, Some(since)) => Absent::Unknown { since },
                        (None, None) if seen_before => Absent::Unknown { since },
                        (None, None) => Absent::Never,
                    };
                    decide_absent(absent, &identity, Instant::now(), cfg.lease_duration)
                }
            };
            let Decision::WaitUntil(expiry) = decision else {
                let mut record = record_for(
                    &decision,
                    observed.as_ref(),
                    &identity,
                    cfg.lease_duration,
                    now_micro(),
                );
                if decision == Decision::Create {
                    // Created again after a deletion: keep counting (client-go starts at 0).
                    record.transitions = self.shared.transitions_for_create();
                }
                let sent = Instant::now();
                let result = match decision {
                    Decision::Create => {
                        let mut lease = new_lease(&lock, &record, cfg.lease_duration_seconds());
                        set_writer(&mut lease, &self.shared.instance, &record);
                        call(
                            op("create"),
                            cfg.api_timeout(),
                            api.create(&PostParams::default(), &lease),
                        )
                        .await
                    }
                    _ => {
                        let mut lease = watch
                            .current()
                            .cloned()
                            .unwrap_or_else(|| new_lease(&lock, &record, 0));
                        record.write_to(
                            lease.spec.get_or_insert_with(LeaseSpec::default),
                            cfg.lease_duration_seconds(),
                        );
                        // The previous term's token does not belong to this one.
                        set_fencing_token(&mut lease, None);
                        set_writer(&mut lease, &self.shared.instance, &record);
                        call(
                            op("update"),
                            cfg.api_timeout(),
                            api.replace(&lock.name, &PostParams::default(), &lease),
                        )
                        .await
                    }
                };
                match result {
                    Ok(lease) => {
                        let won = Won {
                            token_rv: lease.metadata.resource_version.clone(),
                            lease,
                            record,
                            sent,
                        };
                        match self.confirm_term(won, &lock, &identity, &shutdown).await? {
                            Some(won) => return Ok(self.lead(lock, identity, won, watch, shutdown)),
                            // Not confirmed in time: decide again on what the watch shows.
                            None => continue,
                        }
                    }
                    Err(Failure::Conflict) | Err(Failure::NotFound) => {
                        // Somebody wrote first: wait for the watch to show what, then decide again.
                        debug!(?decision, "lost a write race; re-reading");
                        tokio::select! {
                            biased;
                            _ = shutdown.cancelled() => return Err(cancelled()),
                            ev = watch.change() => self.absorb(ev, &mut observed, &mut deleted, &mut unknown_since, &lock)?,
                            _ = tokio::time::sleep(cfg.retry_period) => {}
                        }
                    }
                    Err(Failure::Transient(e)) => {
                        debug!(error = %e, "transient error while acquiring; retrying after the retry period");
                        // Keep following the watch meanwhile, so the retry decides on fresh state.
                        tokio::select! {
                            biased;
                            _ = shutdown.cancelled() => return Err(cancelled()),
                            ev = watch.change() => self.absorb(ev, &mut observed, &mut deleted, &mut unknown_since, &lock)?,
                            _ = tokio::time::sleep(jittered(cfg.retry_period)) => {}
                        }
                    }
                    Err(Failure::Fatal(e)) => {
                        warn!(error = %e, "cannot campaign");
                        return Err(e);
                    }
                }
                continue;
            };
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Err(cancelled()),
                ev = watch.change() => self.absorb(ev, &mut observed, &mut deleted, &mut unknown_since, &lock)?,
                _ = tokio::time::sleep_until(expiry) => {
                    debug!(holder = ?observed.as_ref().and_then(|o| o.record.holder.clone()), "lease expired; trying to take over");
                }
            }
        }
    }

    /// Folds a watch result into the observation; fatal watch errors end the campaign.
    fn absorb(
        &self,
        ev: Result<Change<'_, Lease>, Failure>,
        observed: &mut Option<Observed>,
        deleted: &mut Option<Observed>,
        unknown_since: &mut Option<Instant>,
        lock: &LockRef,
    ) -> Result<()> {
        match ev.map(|c| (c.object, c.relisted)) {
            Ok((Some(lease), _)) => {
                let record = LeaseRecord::from_lease(lease);
                let mine = written_by(lease, &record, &self.shared.instance);
                let next = Observed::update(
                    observed.as_ref(),
                    record,
                    lease.metadata.resource_version.clone(),
                    Instant::now(),
                )
                .written_by_me(mine);
                self.publish(
                    lock,
                    Some(&next.record),
                    stored_fencing_token(lease, &next.record),
                );
                *observed = Some(next);
                *deleted = None;
                *unknown_since = None;
            }
            Ok((None, relisted)) => {
                self.publish(lock, None, None);
                let last = observed.take();
                if relisted && (last.is_some() || deleted.is_some()) {
                    // Absent on a relist (after a 410, or a watch that broke): nobody saw it go,
                    // and whoever held it may have renewed meanwhile and may still act. Not a
                    // witnessed deletion: a whole lease duration from now.
                    debug!("the lease is absent on a relist; whoever held it last is unknown");
                    *deleted = None;
                    *unknown_since = Some(Instant::now());
                } else if let Some(last) = last {
                    *deleted = Some(last);
                }
            }
            Err(Failure::Fatal(e)) => {
                warn!(error = %e, "cannot watch the lease");
                return Err(e);
            }
            Err(e) => debug!(error = ?e, "lease watch failed; it is retried with backoff"),
        }
        Ok(())
    }

    /// Publishes the current leader (`token`: the holder's fencing token, if known).
    fn publish(&self, lock: &LockRef, record: Option<&LeaseRecord>, token: Option<u64>) {
        if let Some(r) = record {
            self.shared.saw_transitions(r.transitions);
        }
        let info = record.map(|r| leader_info(lock, r, token));
        self.shared.leader.send_if_modified(|cur| {
            if *cur == info {
                return false;
            }
            *cur = info;
            true
        });
    }

    /// A won term is handed out only while its renew deadline, counted from when the winning
    /// write was sent, has not passed: an answer that came late (a slow API server, or a pause
    /// of this process right after the write) leaves a term that may already be over for the
    /// followers' clocks. Such a term is confirmed by renewing first, until a renewal is
    /// answered in time. `None`: the lease is not ours any more (or not confirmable now); decide
    /// again on what the watch shows.
    async fn confirm_term(
        &self,
        mut won: Won,
        lock: &LockRef,
        identity: &str,
        shutdown: &CancellationToken,
    ) -> Result<Option<Won>> {
        let cfg = &self.config;
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &lock.namespace);
        loop {
            let late = won.sent.elapsed();
            if late < cfg.renew_deadline {
                return Ok(Some(won));
            }
            if shutdown.is_cancelled() {
                return Err(Error::Cancelled {
                    lock: lock.to_string(),
                });
            }
            warn!(lock = %lock, identity = %identity, answered_after = ?late, renew_deadline = ?cfg.renew_deadline,
                "the write that won the lease was answered after the renew deadline; renewing before leading");
            let mut record = won.record.clone();
            record.renew_time = Some(now_micro());
            let mut lease = won.lease.clone();
            record.write_to(
                lease.spec.get_or_insert_with(LeaseSpec::default),
                cfg.lease_duration_seconds(),
            );
            set_writer(&mut lease, &self.shared.instance, &record);
            let sent = Instant::now();
            match call(
                lease_op(lock, "update"),
                cfg.api_timeout(),
                api.replace(&lock.name, &PostParams::default(), &lease),
            )
            .await
            {
                Ok(written) => {
                    won.lease = written;
                    won.record = record;
                    won.sent = sent;
                }
                Err(Failure::Fatal(e)) => return Err(e),
                Err(e) => {
                    debug!(error = ?e, "confirming the won term failed; deciding again");
                    tokio::time::sleep(jittered(cfg.retry_period)).await;
                    return Ok(None);
                }
            }
        }
    }

    fn lead(
        &self,
        lock: LockRef,
        identity: String,
        won: Won,
        watch: ObjectWatch<Lease>,
        shutdown: CancellationToken,
    ) -> Leadership {
        let Won {
            lease,
            record,
            sent,
            token_rv,
        } = won;
        // The fencing token: the revision of the write that made this candidate leader. etcd's
        // revisions grow with every write to any key, so every later term's token (including on
        // a Lease deleted and created again) is greater.
        let fencing_token = lock::parse_resource_version(token_rv.as_deref()).unwrap_or_else(|| {
            let fallback = u64::from(record.transitions);
            warn!(resource_version = ?token_rv, fallback,
                "the API server's resourceVersion is not a number; the fencing token falls back to leaseTransitions");
            fallback
        });
        let term = Term {
            identity: identity.clone(),
            lock: lock.clone(),
            strategy: Strategy::Lease,
            fencing_token,
            acquired_at: record.acquired_at().unwrap_or_else(SystemTime::now),
        };
        info!(lock = %lock, identity = %identity, fencing_token = term.fencing_token, "became leader");
        self.publish(&lock, Some(&record), Some(fencing_token));
        self.shared.set_health(|h| {
            h.leading = true;
            h.last_success = Some(sent);
            h.last_latency = Some(sent.elapsed());
            h.successes += 1;
        });
        let (leadership, keeper, done) = Leadership::new(term);
        self.hooks.follow(
            &leadership,
            lease.metadata.uid.clone(),
            false,
            Some(self.renewals()),
        );
        let renewer = Renewer {
            api: Api::namespaced(self.client.clone(), &lock.namespace),
            elector: self.clone(),
            lock,
            identity,
            lease,
            record,
            fencing_token,
            last_sent: sent,
            keeper,
        };
        let span = tracing::Span::current();
        let task = tokio::spawn(renewer.run(watch, done, shutdown).instrument(span));
        leadership.with_task(task)
    }
}

/// A write that made this candidate the holder.
struct Won {
    /// The Lease as written (the precondition of the next write).
    lease: Lease,
    /// The record written.
    record: LeaseRecord,
    /// When the write was sent.
    sent: Instant,
    /// The resourceVersion of the write that won the term: the fencing token.
    token_rv: Option<String>,
}

/// The leader's background task.
struct Renewer {
    api: Api<Lease>,
    elector: LeaseElector,
    lock: LockRef,
    identity: String,
    /// The Lease as last written by us (its resourceVersion is the next write's precondition).
    lease: Lease,
    record: LeaseRecord,
    /// This term's fencing token, stored in the Lease by every renewal for observers.
    fencing_token: u64,
    /// When the last successful renewal was sent.
    last_sent: Instant,
    keeper: Keeper,
}

impl Renewer {
    fn op(&self, verb: &'static str) -> Op<'_> {
        lease_op(&self.lock, verb)
    }

    /// Whether `lease` holds a record this very candidate wrote (see [`written_by`]).
    fn is_mine(&self, lease: &Lease, record: &LeaseRecord) -> bool {
        record.is_held_by(&self.identity) && written_by(lease, record, &self.elector.shared.instance)
    }

    fn cfg(&self) -> &LeaseConfig {
        &self.elector.config
    }

    async fn run(
        mut self,
        mut watch: ObjectWatch<Lease>,
        done: CancellationToken,
        shutdown: CancellationToken,
    ) -> Result<()> {
        let mut next_renewal = self.last_sent + self.cfg().retry_period;
        let mut grace_until: Option<Instant> = None;
        let mut watch_refused = false;
        let result = loop {
            let deadline = self.last_sent + self.cfg().renew_deadline;
            tokio::select! {
                biased;
                _ = tokio::time::sleep_until(deadline) => {
                    let since = self.last_sent.elapsed();
                    warn!(lock = %self.lock, identity = %self.identity, ?since, "renew deadline passed; stopping leading");
                    self.keeper.lose(LossReason::RenewDeadline { since_last_renewal: since });
                    break Ok(());
                }
                _ = done.cancelled() => {
                    break if self.cfg().release_on_cancel { self.release().await } else { Ok(()) };
                }
                _ = shutdown.cancelled(), if grace_until.is_none() => {
                    info!(lock = %self.lock, identity = %self.identity, "shutdown: stopping work before releasing");
                    self.keeper.lose(LossReason::Cancelled);
                    grace_until = Some(Instant::now() + self.cfg().shutdown_grace);
                }
                _ = sleep_until_opt(grace_until) => {
                    warn!(lock = %self.lock, grace = ?self.cfg().shutdown_grace,
                        "the work did not stop within the shutdown grace; not releasing, the lease will expire");
                    break Ok(());
                }
                ev = watch.changed() => match ev {
                    Ok(Some(lease)) => {
                        let record = LeaseRecord::from_lease(lease);
                        // Events older than our last write cannot be current (our write carried
                        // the version we decided on); only a newer record can depose us.
                        if !record.is_held_by(&self.identity) && newer(lease, &self.lease) {
                            let holder = record.holder.clone().unwrap_or_default();
                            self.elector.publish(&self.lock, Some(&record), stored_fencing_token(lease, &record));
                            info!(lock = %self.lock, identity = %self.identity, holder = %holder, "another holder seen; stopping leading");
                            self.keeper.lose(LossReason::OtherHolder { holder });
                            break Ok(());
                        }
                        if newer(lease, &self.lease) && !written_by(lease, &record, &self.elector.shared.instance) {
                            self.twin_seen();
                            break Ok(());
                        }
                        if newer(lease, &self.lease) {
                            // Our lease, touched by somebody else (labels): keep its version.
                            self.lease = lease.clone();
                        }
                    }
                    Ok(None) => {
                        info!(lock = %self.lock, identity = %self.identity, "lease deleted; stopping leading");
                        self.elector.publish(&self.lock, None, None);
                        self.keeper.lose(LossReason::LockDeleted);
                        break Ok(());
                    }
                    Err(Failure::Fatal(e)) if !watch_refused => {
                        // Renewals do not need the watch, but nobody should lose a permission
                        // silently (a follower needs it to wait for the lease).
                        watch_refused = true;
                        warn!(lock = %self.lock, error = %e, "cannot watch the lease while leading; renewals go on");
                    }
                    Err(e) => debug!(error = ?e, "lease watch failed while leading; renewals go on"),
                },
                _ = tokio::time::sleep_until(next_renewal) => {
                    match self.renew(deadline).await {
                        Ok(()) => next_renewal = self.last_sent + self.cfg().retry_period,
                        Err(Some(reason)) => {
                            info!(lock = %self.lock, identity = %self.identity, %reason, "stopping leading");
                            self.keeper.lose(reason);
                            break Ok(());
                        }
                        Err(None) => {
                            self.elector.shared.set_health(|h| h.failures += 1);
                            next_renewal = Instant::now() + self.cfg().retry_period;
                        }
                    }
                }
            }
        };
        self.elector.shared.set_health(|h| h.leading = false);
        if !self.keeper.is_lost() {
            self.keeper.lose(LossReason::Released);
        }
        result
    }

    /// One renewal. `Err(Some(reason))`: leadership is over; `Err(None)`: retry later.
    async fn renew(&mut self, deadline: Instant) -> Result<(), Option<LossReason>> {
        let mut record = self.record.clone();
        record.renew_time = Some(now_micro());
        let mut lease = self.lease.clone();
        record.write_to(
            lease.spec.get_or_insert_with(LeaseSpec::default),
            self.cfg().lease_duration_seconds(),
        );
        // Free: renewals write the whole object anyway.
        set_fencing_token(&mut lease, Some((&self.identity, self.fencing_token)));
        set_writer(&mut lease, &self.elector.shared.instance, &record);
        let timeout = self
            .cfg()
            .api_timeout()
            .min(deadline.saturating_duration_since(Instant::now()));
        let sent = Instant::now();
        let op = self.op("update");
        match call(
            op,
            timeout.max(Duration::from_millis(1)),
            self.api.replace(&self.lock.name, &PostParams::default(), &lease),
        )
        .await
        {
            Ok(written) => {
                self.lease = written;
                self.record = record;
                self.last_sent = sent;
                self.elector.shared.set_health(|h| {
                    h.last_success = Some(sent);
                    h.last_latency = Some(sent.elapsed());
                    h.successes += 1;
                });
                Ok(())
            }
            Err(Failure::Conflict) => {
                // Re-read and decide again: still ours (somebody edited metadata) or lost. The
                // read is bounded by the renew deadline too: while it runs, nothing else can
                // end leadership, and fail-stop must hold if the API server stops answering.
                let op = self.op("get");
                let timeout = self
                    .cfg()
                    .api_timeout()
                    .min(deadline.saturating_duration_since(Instant::now()));
                match call(
                    op,
                    timeout.max(Duration::from_millis(1)),
                    self.api.get(&self.lock.name),
                )
                .await
                {
                    Ok(current) => {
                        let rec = LeaseRecord::from_lease(&current);
                        if self.is_mine(&current, &rec) {
                            self.lease = current;
                            Err(None)
                        } else if rec.is_held_by(&self.identity) {
                            Err(Some(self.duplicate_identity()))
                        } else {
                            Err(Some(LossReason::OtherHolder {
                                holder: rec.holder.unwrap_or_default(),
                            }))
                        }
                    }
                    Err(Failure::NotFound) => Err(Some(LossReason::LockDeleted)),
                    Err(e) => {
                        debug!(error = ?e, "re-read after a conflict failed");
                        Err(None)
                    }
                }
            }
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

    /// Clears the holder, as client-go's `ReleaseOnCancel` does: holder "", duration 1 s.
    async fn release(&mut self) -> Result<()> {
        if self.keeper.is_lost() && !matches!(self.keeper_reason(), Some(LossReason::Cancelled) | None) {
            return Ok(());
        }
        // The loss first: once the release is written, a successor may start at once, and no
        // work gated on this term may still be running then.
        self.keeper.lose(LossReason::Released);
        let now = now_micro();
        let record = LeaseRecord {
            holder: None,
            lease_duration: Some(Duration::from_secs(1)),
            acquire_time: Some(now),
            renew_time: Some(now),
            transitions: self.record.transitions,
        };
        for _ in 0..2 {
            let mut lease = self.lease.clone();
            record.write_to(lease.spec.get_or_insert_with(LeaseSpec::default), 1);
            set_fencing_token(&mut lease, None);
            set_writer(&mut lease, &self.elector.shared.instance, &record);
            let op = self.op("update");
            match call(
                op,
                self.cfg().api_timeout(),
                self.api.replace(&self.lock.name, &PostParams::default(), &lease),
            )
            .await
            {
                Ok(_) => {
                    info!(lock = %self.lock, identity = %self.identity, "released the lease");
                    self.keeper.lose(LossReason::Released);
                    return Ok(());
                }
                Err(Failure::Conflict) => {
                    let op = self.op("get");
                    match call(op, self.cfg().api_timeout(), self.api.get(&self.lock.name)).await {
                        Ok(current) if self.is_mine(&current, &LeaseRecord::from_lease(&current)) => {
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

    fn keeper_reason(&self) -> Option<LossReason> {
        self.keeper.reason()
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

    /// Ends the term on a twin's write seen by the watch.
    fn twin_seen(&self) {
        let reason = self.duplicate_identity();
        self.keeper.lose(reason);
    }
}

/// Logs, once per record, that the Lease is held under this candidate's identity by another
/// process; the second time (the record changed: that process is alive and renewing) as an
/// error, since two candidates share one identity.
fn log_twin(obs: &Observed, identity: &str, logged: &mut Option<LeaseRecord>) {
    if !obs.held_by_a_twin(identity) {
        *logged = None;
        return;
    }
    if logged.as_ref() == Some(&obs.record) {
        return;
    }
    if logged.is_none() {
        warn!(
            identity,
            "the lease is held under this candidate's identity by another process \
            (this candidate before a restart, or a second candidate with the same identity); \
            waiting for that lease to expire"
        );
    } else {
        tracing::error!(
            identity,
            "another live process renews the lease under this candidate's \
            identity: two candidates share one identity (a copied --identity, two containers of \
            one Pod, or host names under hostNetwork). Give every candidate a unique identity \
            (POD_NAME from the Downward API, or --identity)"
        );
    }
    *logged = Some(obs.record.clone());
}

/// The [`Op`] of a call on the Lease `lock`, for errors that name it.
fn lease_op<'a>(lock: &'a LockRef, verb: &'static str) -> Op<'a> {
    Op {
        verb,
        resource: RESOURCE,
        namespace: &lock.namespace,
        name: &lock.name,
        hint: RBAC_HINT,
    }
}

/// Whether `a`'s resourceVersion is newer than `b`'s (numerically, as etcd revisions are;
/// unparsable versions count as newer, so the cache follows the watch).
fn newer(a: &Lease, b: &Lease) -> bool {
    match (
        a.metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok()),
        b.metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok()),
    ) {
        (Some(a), Some(b)) => a > b,
        _ => a.metadata.resource_version != b.metadata.resource_version,
    }
}

async fn sleep_until_opt(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// `d` less up to 20%, so candidates retrying after one error spread out.
fn jittered(d: Duration) -> Duration {
    d.mul_f64(1.0 - 0.2 * rand::random::<f64>())
}

fn new_lease(lock: &LockRef, record: &LeaseRecord, duration_secs: i32) -> Lease {
    let mut spec = LeaseSpec::default();
    record.write_to(&mut spec, duration_secs);
    Lease {
        metadata: ObjectMeta {
            name: Some(lock.name.clone()),
            namespace: Some(lock.namespace.clone()),
            ..Default::default()
        },
        spec: Some(spec),
    }
}

fn leader_info(lock: &LockRef, r: &LeaseRecord, fencing_token: Option<u64>) -> LeaderInfo {
    LeaderInfo {
        strategy: Strategy::Lease,
        lock: lock.clone(),
        holder: r.holder.clone(),
        fencing_token: fencing_token.filter(|_| r.holder.is_some()),
        acquired_at: r.acquired_at(),
        renewed_at: r.renewed_at(),
        lease_duration: r.lease_duration,
    }
}

/// Reads the current leader of a Lease once, without campaigning (`None`: no such Lease).
///
/// # Cancellation safety
/// Cancel-safe.
pub async fn current_leader(client: Client, lock: &LockRef) -> Result<Option<LeaderInfo>> {
    let api: Api<Lease> = Api::namespaced(client, &lock.namespace);
    object_watch::read_leader(api, lock, RESOURCE, RBAC_HINT, describe).await
}

/// Watches the current leader of a Lease without campaigning: the channel holds `None` while
/// the Lease does not exist. The watch ends when every receiver is dropped.
pub fn watch_leader(client: Client, lock: LockRef) -> watch::Receiver<Option<LeaderInfo>> {
    let api: Api<Lease> = Api::namespaced(client, &lock.namespace);
    object_watch::watch_leader(api, lock, RESOURCE, RBAC_HINT, describe)
}

fn describe(lock: &LockRef, lease: &Lease) -> LeaderInfo {
    let record = LeaseRecord::from_lease(lease);
    let token = stored_fencing_token(lease, &record);
    leader_info(lock, &record, token)
}

/// The host name, for a default identity.
fn hostname() -> Option<String> {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}
