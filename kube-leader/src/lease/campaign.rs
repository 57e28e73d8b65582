//! A Lease campaign: follow the Lease by its watch, decide, write, until this candidate leads.
//!
//! The campaign is a small state machine around one wake-up: [`Campaign::wait`] selects on
//! shutdown, the Lease watch and one timer (the holder's expiry, or a retry). Everything it
//! knows of the Lease is folded in by [`Campaign::absorb`]; every decision is the pure
//! [`decide`]/[`decide_absent`] of what it knows.

use std::sync::Arc;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{api::PostParams, Api, Client};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{
    config::LeaseConfig,
    coordinated::{coordinated_strategy, written_by_any},
    decide::{
        decide, decide_absent, decide_coordinated, defer_to_controller, defer_to_preferred, record_for,
        Absent, Decision, Observed,
    },
    keeper::Keeper,
    record::{
        now_micro, preferred_in, set_fencing_token, set_preferred, set_writer, stored_fencing_token,
        written_by, LeaseRecord,
    },
    shared::{lease_op, Shared},
    spare::Spare,
    term::{steps, Every, Term as HeldTerm, Writer},
};
use crate::{
    api::{call, Failure},
    backoff::jittered,
    error::{Error, Result},
    leadership::{Leadership, Strategy, Term},
    lock::{self, LockRef},
    object_watch::ObjectWatch,
    observer::Hooks,
    successor::Registry,
    time::sleep_until_opt,
};
use serde_json::json;

/// One campaign of one candidate.
pub(crate) struct Campaign {
    client: Client,
    api: Api<Lease>,
    cfg: LeaseConfig,
    shared: Arc<Shared>,
    hooks: Hooks,
    lock: LockRef,
    identity: String,
    watch: ObjectWatch<Lease>,
    /// The Lease as last seen (`None`: absent, or not seen yet).
    observed: Option<Observed>,
    /// While the Lease is absent: what this candidate last saw before it was deleted.
    deleted: Option<Observed>,
    /// Whether this elector saw the Lease before this campaign (an earlier term or campaign).
    seen_before: bool,
    /// Since when the Lease is absent, by this candidate's clock.
    absent_since: Option<Instant>,
    /// Absent on a relist after this campaign knew the Lease: since when (nobody saw it go).
    unknown_since: Option<Instant>,
    /// A record under our identity that another process wrote, as last logged.
    twin_logged: Option<LeaseRecord>,
    /// Whether "coordinated leader election manages this Lease" was logged (once a campaign).
    coordinated_logged: bool,
    /// This candidate takes part in coordinated leader election ([`decide_coordinated`]).
    coordinated: bool,
    /// The candidates' registrations ([`Successor::Youngest`](crate::Successor::Youngest)).
    registry: Option<Registry>,
    /// A warm connection for the takeover write, opened when the campaign first follows.
    spare: Spare,
}

/// A write that made this candidate the holder.
pub(crate) struct Won {
    /// The Lease as written (the precondition of the next write).
    pub(crate) lease: Lease,
    /// The record written.
    pub(crate) record: LeaseRecord,
    /// When the write was sent.
    pub(crate) sent: Instant,
    /// The resourceVersion of the write that won the term: the fencing token.
    pub(crate) token_rv: Option<String>,
}

// === impl Campaign ===

impl Campaign {
    pub(crate) fn new(
        client: Client,
        cfg: LeaseConfig,
        shared: Arc<Shared>,
        hooks: Hooks,
        lock: LockRef,
        identity: String,
    ) -> Self {
        // The campaign's and the keeper's calls read an overloaded server's `Retry-After`.
        let client = crate::api::keeping_retry_after(client);
        let api: Api<Lease> = Api::namespaced(client.clone(), &lock.namespace);
        let watch = ObjectWatch::new(api.clone(), &lock.name, lease_op(&lock, "watch"));
        Self {
            seen_before: shared.saw_lease(),
            client,
            api,
            cfg,
            shared,
            hooks,
            lock,
            identity,
            watch,
            observed: None,
            deleted: None,
            absent_since: None,
            unknown_since: None,
            twin_logged: None,
            coordinated_logged: false,
            coordinated: false,
            registry: None,
            spare: Spare::default(),
        }
    }

    /// Prefers the youngest registered candidate as the successor when this term ends.
    pub(crate) fn with_registry(mut self, registry: Option<Registry>) -> Self {
        self.registry = registry;
        self
    }

    /// Takes part in coordinated leader election (see [`decide_coordinated`]).
    pub(crate) fn coordinated(mut self, coordinated: bool) -> Self {
        self.coordinated = coordinated;
        self
    }

    /// Campaigns until this candidate leads (or `shutdown`).
    pub(crate) async fn run(mut self, shutdown: CancellationToken) -> Result<Leadership> {
        info!("campaigning");
        loop {
            if !self.watch.is_synced() {
                self.wait(&shutdown, None).await?;
                continue;
            }
            let wake_at = match self.decide() {
                Decision::WaitUntil(expiry) => {
                    self.spare
                        .open_once(&self.api, &self.lock.name, self.cfg.keep_warm, &shutdown);
                    Some(expiry)
                }
                Decision::Follow => {
                    self.spare
                        .open_once(&self.api, &self.lock.name, self.cfg.keep_warm, &shutdown);
                    None
                }
                decision => match self.attempt(decision, &shutdown).await? {
                    Attempt::Won(won) => return Ok(self.lead(*won, shutdown)),
                    Attempt::DecideAgain => continue,
                    Attempt::RetryAt(at) => Some(at),
                },
            };
            let expired = self.wait(&shutdown, wake_at).await?;
            if expired {
                let holder = self.observed.as_ref().and_then(|o| o.record.holder.clone());
                debug!(?holder, "lease expired or retry due; deciding again");
            }
        }
    }

    /// What to do now, on what the watch showed (a step recorded for trace checking).
    fn decide(&mut self) -> Decision {
        let now = Instant::now();
        let decision = self.decide_at(now);
        steps::emit("decide", || {
            let absent = self
                .absent_since
                .map(|since| steps::absent(&self.absent_of(since)));
            json!({"now": steps::ns(now), "identity": self.identity, "coordinated": self.coordinated,
                "fallback_ms": self.cfg.lease_duration.as_millis() as u64,
                "successor_wait_ms": self.cfg.successor_wait.as_millis() as u64,
                "observed": self.observed.as_ref().map(steps::observed), "absent": absent,
                "decision": steps::decision(&decision)})
        });
        decision
    }

    /// What to do at `now`, on what the watch showed.
    fn decide_at(&mut self, now: Instant) -> Decision {
        let lease_duration = self.cfg.lease_duration;
        if self.coordinated {
            return decide_coordinated(self.observed.as_ref(), &self.identity, now, lease_duration);
        }
        if let Some(obs) = &self.observed {
            self.absent_since = None;
            log_twin(obs, &self.identity, &mut self.twin_logged);
            let decision = decide(Some(obs), &self.identity, now, lease_duration);
            let decision = defer_to_controller(decision, obs, now, lease_duration);
            return defer_to_preferred(decision, obs, &self.identity, now, self.cfg.successor_wait);
        }
        let since = *self.absent_since.get_or_insert(now);
        decide_absent(self.absent_of(since), &self.identity, now, lease_duration)
    }

    /// What this candidate knows of the absent Lease, found absent `since`.
    fn absent_of(&self, since: Instant) -> Absent<'_> {
        match (&self.deleted, self.unknown_since) {
            (Some(d), _) => Absent::Deleted(d),
            (None, Some(since)) => Absent::Unknown { since },
            (None, None) if self.seen_before => Absent::Unknown { since },
            (None, None) => Absent::Never,
        }
    }

    /// Writes what `decision` says and handles the answer.
    async fn attempt(&mut self, decision: Decision, shutdown: &CancellationToken) -> Result<Attempt> {
        let mut record = record_for(
            &decision,
            self.observed.as_ref(),
            &self.identity,
            self.cfg.lease_duration,
            now_micro(),
        );
        if decision == Decision::Create {
            // Created again after a deletion: keep counting (client-go starts at 0).
            record.transitions = self.shared.transitions_for_create();
        }
        let sent = Instant::now();
        let answer = self.write(&decision, &record).await;
        steps::emit_answer(sent, &answer);
        match answer {
            Ok(lease) => {
                let won = Won {
                    token_rv: lease.metadata.resource_version.clone(),
                    lease,
                    record,
                    sent,
                };
                Ok(match self.confirm_term(won, shutdown).await? {
                    Some(won) => Attempt::Won(Box::new(won)),
                    // Not confirmed in time: decide again on what the watch shows.
                    None => Attempt::DecideAgain,
                })
            }
            Err(Failure::Conflict | Failure::NotFound) => {
                // Somebody wrote first: wait for the watch to show what, then decide again.
                debug!(?decision, "lost a write race; re-reading");
                Ok(Attempt::RetryAt(Instant::now() + self.cfg.retry_period))
            }
            Err(Failure::Transient(e)) => {
                // Keep following the watch meanwhile, so the retry decides on fresh state.
                debug!(error = %e, "transient error while acquiring; retrying after the retry period");
                Ok(Attempt::RetryAt(Instant::now() + jittered(self.cfg.retry_period)))
            }
            Err(Failure::Fatal(e)) => {
                warn!(error = %e, "cannot campaign");
                Err(e)
            }
        }
    }

    /// The create or update that `decision` calls for.
    async fn write(&mut self, decision: &Decision, record: &LeaseRecord) -> Result<Lease, Failure> {
        if *decision == Decision::Create {
            let mut lease = new_lease(&self.lock, record, self.cfg.lease_duration_seconds());
            set_writer(&mut lease, &self.shared.instance, record);
            steps::emit_write("create", &lease, record);
            let params = PostParams::default();
            let create = self.api.create(&params, &lease);
            return call(lease_op(&self.lock, "create"), self.cfg.call_timeout(), create).await;
        }
        let mut lease = self
            .watch
            .current()
            .cloned()
            .unwrap_or_else(|| new_lease(&self.lock, record, 0));
        // The previous term's token and successor do not belong to this one.
        set_fencing_token(&mut lease, None);
        set_preferred(&mut lease, None);
        self.replace(lease, record).await
    }

    /// Writes `record` into `lease` and replaces the Lease with it (`lease`'s resourceVersion
    /// is the precondition).
    async fn replace(&mut self, mut lease: Lease, record: &LeaseRecord) -> Result<Lease, Failure> {
        record.write_to(
            lease.spec.get_or_insert_with(LeaseSpec::default),
            self.cfg.lease_duration_seconds(),
        );
        set_writer(&mut lease, &self.shared.instance, record);
        steps::emit_write("replace", &lease, record);
        let params = PostParams::default();
        let replace = self.api.replace(&self.lock.name, &params, &lease);
        call(lease_op(&self.lock, "update"), self.cfg.call_timeout(), replace).await
    }

    /// Waits for shutdown, a watch event or `until`; `true` if `until` came.
    async fn wait(&mut self, shutdown: &CancellationToken, until: Option<Instant>) -> Result<bool> {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => Err(Error::Cancelled { lock: self.lock.to_string() }),
            ev = self.watch.change() => {
                let ev = ev.map(|c| (c.object.cloned(), c.relisted));
                self.absorb(ev)?;
                Ok(false)
            }
            _ = sleep_until_opt(until) => Ok(true),
        }
    }

    /// Folds a watch result into what this candidate knows; fatal watch errors end the campaign.
    fn absorb(&mut self, ev: Result<(Option<Lease>, bool), Failure>) -> Result<()> {
        match ev {
            Ok((Some(lease), _)) => self.seen(&lease),
            Ok((None, relisted)) => self.absent(relisted),
            Err(Failure::Fatal(e)) => {
                warn!(error = %e, "cannot watch the lease");
                return Err(e);
            }
            Err(e) => debug!(error = ?e, "lease watch failed; it is retried with backoff"),
        }
        Ok(())
    }

    /// The Lease as the watch shows it now.
    fn seen(&mut self, lease: &Lease) {
        let record = LeaseRecord::from_lease(lease);
        let mine = written_by(lease, &record, &self.shared.instance);
        let by_kube_leader = written_by_any(lease, &record);
        let rv = lease.metadata.resource_version.clone();
        let preferred = preferred_in(lease, &record);
        let coordinated = coordinated_strategy(lease);
        if coordinated.is_some() && !self.coordinated_logged && !self.coordinated {
            self.coordinated_logged = true;
            info!(strategy = ?coordinated, "coordinated leader election manages this Lease \
                (spec.strategy is set); this candidate does not take part: it takes the Lease only \
                once the controller has named nobody for 10 s, and gives way to spec.preferredHolder");
        }
        let now = Instant::now();
        let next = Observed::update(self.observed.as_ref(), record, rv, now)
            .written_by_me(mine)
            .preferring(preferred)
            .coordinated(coordinated.is_some())
            .written_by_kube_leader(by_kube_leader);
        steps::emit("seen", || {
            json!({"now": steps::ns(now), "instance": self.shared.instance,
            "lease": steps::lease(lease), "observed": steps::observed(&next)})
        });
        let token = stored_fencing_token(lease, &next.record);
        self.shared.publish(&self.lock, Some(&next.record), token);
        self.observed = Some(next);
        self.deleted = None;
        self.unknown_since = None;
    }

    /// The Lease is absent: deleted before our eyes, or found absent on a relist.
    fn absent(&mut self, relisted: bool) {
        let now = Instant::now();
        steps::emit("absent", || json!({"now": steps::ns(now), "relisted": relisted}));
        self.shared.publish(&self.lock, None, None);
        let last = self.observed.take();
        if relisted && (last.is_some() || self.deleted.is_some()) {
            // Absent on a relist (after a 410, or a watch that broke): nobody saw it go, and
            // whoever held it may have renewed meanwhile and may still act. Not a witnessed
            // deletion: a whole lease duration from now.
            debug!("the lease is absent on a relist; whoever held it last is unknown");
            self.deleted = None;
            self.unknown_since = Some(now);
        } else if let Some(last) = last {
            self.deleted = Some(last);
        }
    }

    /// A won term is handed out only while its renew deadline, counted from when the winning
    /// write was sent, has not passed: an answer that came late (a slow API server, or a pause
    /// of this process right after the write) leaves a term that may already be over for the
    /// followers' clocks. Such a term is confirmed by renewing first, until a renewal is
    /// answered in time. `None`: the lease is not ours any more (or not confirmable now); decide
    /// again on what the watch shows.
    async fn confirm_term(&mut self, mut won: Won, shutdown: &CancellationToken) -> Result<Option<Won>> {
        loop {
            let late = won.sent.elapsed();
            if late < self.cfg.renew_deadline {
                return Ok(Some(won));
            }
            if shutdown.is_cancelled() {
                return Err(Error::Cancelled {
                    lock: self.lock.to_string(),
                });
            }
            warn!(lock = %self.lock, identity = %self.identity, answered_after = ?late, renew_deadline = ?self.cfg.renew_deadline,
                "the write that won the lease was answered after the renew deadline; renewing before leading");
            let mut record = won.record.clone();
            record.renew_time = Some(now_micro());
            let sent = Instant::now();
            let answer = self.replace(won.lease.clone(), &record).await;
            steps::emit_answer(sent, &answer);
            match answer {
                Ok(written) => {
                    won.lease = written;
                    won.record = record;
                    won.sent = sent;
                }
                Err(Failure::Fatal(e)) => return Err(e),
                Err(e) => {
                    debug!(error = ?e, "confirming the won term failed; deciding again");
                    tokio::time::sleep(jittered(self.cfg.retry_period)).await;
                    return Ok(None);
                }
            }
        }
    }

    /// Starts the term: the handle, and the keeper that renews the Lease in the background.
    fn lead(self, won: Won, shutdown: CancellationToken) -> Leadership {
        let Won {
            lease,
            record,
            sent,
            token_rv,
        } = won;
        // The fencing token: the revision of the write that made this candidate leader. etcd's
        // revisions grow with every write to any key, so every later term's token (including on
        // a Lease deleted and created again) is greater.
        let fencing_token = lock::fencing_token(token_rv.as_deref(), u64::from(record.transitions));
        let term = Term {
            identity: self.identity.clone(),
            lock: self.lock.clone(),
            strategy: Strategy::Lease,
            fencing_token,
            acquired_at: record.acquired_at().unwrap_or_else(std::time::SystemTime::now),
        };
        info!(lock = %self.lock, identity = %self.identity, fencing_token, "became leader");
        self.shared
            .publish(&self.lock, Some(&record), Some(fencing_token));
        self.shared.set_health(|h| {
            h.leading = true;
            h.last_success = Some(sent);
            h.last_latency = Some(sent.elapsed());
            h.successes += 1;
        });
        let lock_uid = lease.metadata.uid.clone();
        let renewals = self.shared.renewals.subscribe();
        let registration = self.shared.hold_registration();
        let won_term = (lease, record, fencing_token, sent);
        let held = held_term(&self.cfg, &self.identity, &self.shared.instance, won_term);
        steps::emit_lead(&self.cfg, &self.identity, &self.shared.instance, &held);
        let keeper = Keeper {
            api: Api::namespaced(self.client, &self.lock.namespace),
            cfg: self.cfg,
            shared: self.shared,
            lock: self.lock,
            identity: self.identity,
            term: held,
            // Watched for the term: the release takes its successor from the watch.
            registry: self.registry.map(Registry::following),
            successor: None,
            registration,
        };
        let watch = self.watch;
        let leadership = Leadership::spawn(term, tracing::Span::current(), move |handle, done| {
            keeper.run(handle, watch, done, shutdown)
        });
        self.hooks.follow(&leadership, lock_uid, false, Some(renewals));
        leadership
    }
}

/// The term begun by the write of a Lease (with its record, fencing token, and when it was sent).
fn held_term(
    cfg: &LeaseConfig,
    identity: &str,
    instance: &str,
    (lease, record, fencing_token, sent): (Lease, LeaseRecord, u64, Instant),
) -> HeldTerm<Every> {
    let writer = Writer {
        identity: identity.to_string(),
        instance: instance.to_string(),
        lease_duration_seconds: cfg.lease_duration_seconds(),
        renew_deadline: cfg.renew_deadline,
        yields_to_coordinated: true,
    };
    // A fifth of the renew deadline for the last attempt (2 s of the default 10 s): a write
    // that the API server answers within it keeps the term.
    let pace = Every::keeper(cfg.retry_period, sent, cfg.renew_deadline / 5);
    HeldTerm::new(writer, lease, record, fencing_token, sent, pace)
}

/// What came of one attempt to write.
enum Attempt {
    Won(Box<Won>),
    /// Decide again at once, on what the watch shows.
    DecideAgain,
    /// Decide again on the next watch event, or at this instant at the latest.
    RetryAt(Instant),
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

/// A new Lease object holding `record`.
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
