//! The shard elector: one candidate of a set of shard Leases, its fair share of them held and
//! renewed from one scheduler, over one list/watch.

use std::{
    collections::{BTreeMap, BTreeSet},
    future::Future,
    time::{Duration, SystemTime},
};

use futures::{future::BoxFuture, stream::FuturesUnordered, FutureExt, StreamExt};
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    api::{DeleteParams, PostParams},
    runtime::{watcher, WatchStreamExt},
    Api, Client,
};
use tokio::{
    sync::{mpsc, oneshot, watch},
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, info_span, warn, Instrument};

use super::{
    balance,
    config::{ShardsConfig, MAX_SHARDS},
    scheduler::{Key, Phases, Renewal, Throttle, Timers},
};
use crate::{
    api::{call, classify_watch, Failure, Op},
    error::{Error, Result},
    leadership::{KeeperHandle as Keeper, Leadership, LossReason, Strategy, Term},
    lease::{
        decide::{decide, decide_absent, record_for, Absent, Decision, Observed},
        record::{new_instance_id, now_micro, set_fencing_token, set_writer, written_by, LeaseRecord},
        LeaseConfig,
    },
    lock::{self, LockRef},
};

/// The label every Lease of a set carries, with the set's name: the one list/watch selects it.
pub const SHARDS_LABEL: &str = "kube-leader.io/shards";
/// The label telling a shard Lease (`shard`) from a membership Lease (`member`).
pub const ROLE_LABEL: &str = "kube-leader.io/shard-role";

const RESOURCE: &str = "leases.coordination.k8s.io";
const RBAC_HINT: &str = "deploy/rbac-lease.yaml (or `kube-leader rbac --strategy lease`)";
/// Longest watch call (as for one Lease: kube-runtime needs less than the client's 295 s).
const WATCH_TIMEOUT_SECS: u32 = 290;

/// A candidate for a set of shard Leases `<name>-0` .. `<name>-<M-1>`.
///
/// Every live candidate of the set holds a fair share: with M shards and N candidates, `⌈M/N⌉`
/// or `⌊M/N⌋` each (candidates sorted by identity: the first `M mod N` hold one more). A
/// candidate announces itself with a membership Lease `<name>-member-<identity>`; when one
/// joins, the others hand their surplus over (the work on a shard stops, then the shard is
/// released, and the newcomer takes it at once); when one dies, its shards are taken over as
/// their leases expire. Shard Leases are plain client-go Leases (holder, duration, renew time,
/// transitions), so anybody can read who holds a shard.
///
/// All Leases of the set carry the label [`SHARDS_LABEL`]` = <name>` and are followed with one
/// list/watch; every renewal goes through one scheduler that spreads them evenly over the retry
/// period, bounds the calls in flight and pauses when the API server answers 429 or 5xx,
/// without ever letting that pause cost a shard (see [`ShardsConfig`]).
///
/// Each held shard is a [`Shard`]: a [`Leadership`] with its own loss token and fencing token
/// (the `resourceVersion` of the write that acquired it), lost by the same fail-stop rule as a
/// [`LeaseElector`](crate::LeaseElector)'s leadership: when its renew deadline passes without a
/// successful renewal, or as soon as another holder (or another process with this identity)
/// writes it. A shard handed over or given up on shutdown is released only once its [`Shard`]
/// is dropped or released, i.e. once the work on it has stopped.
///
/// ```no_run
/// # async fn run(client: kube::Client) -> kube_leader::Result<()> {
/// use kube_leader::shards::Shards;
/// use tokio_util::sync::CancellationToken;
///
/// let shutdown = CancellationToken::new();
/// Shards::new(client, "my-controller", 64)
///     .run(&shutdown, |index, term, lost| async move {
///         // Reconcile the objects of shard `index`, fenced with `term.fencing_token`,
///         // until `lost` is cancelled.
///         lost.cancelled().await;
///     })
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Shards {
    client: Client,
    name: String,
    count: u32,
    namespace: Option<String>,
    identity: Option<String>,
    config: ShardsConfig,
}

impl std::fmt::Debug for Shards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shards")
            .field("name", &self.name)
            .field("count", &self.count)
            .field("namespace", &self.namespace)
            .field("identity", &self.identity)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

// === impl Shards ===

impl Shards {
    /// A candidate for `count` shard Leases `<name>-0` .. `<name>-<count-1>`, with client-go's
    /// default timings.
    ///
    /// Namespace and identity are found as for [`LeaseElector::new`](crate::LeaseElector::new):
    /// [`namespace`](Self::namespace), `POD_NAMESPACE`, the service-account namespace, the
    /// client's; [`identity`](Self::identity), `POD_NAME`, the host name.
    #[must_use]
    pub fn new(client: Client, name: impl Into<String>, count: u32) -> Self {
        Self {
            client,
            name: name.into(),
            count,
            namespace: None,
            identity: None,
            config: ShardsConfig::default(),
        }
    }

    /// Sets the namespace of the Leases.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Sets this candidate's identity (`holderIdentity`); it must be unique among candidates.
    #[must_use]
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.identity = Some(identity.into());
        self
    }

    /// Sets all settings at once.
    #[must_use]
    pub fn config(mut self, config: ShardsConfig) -> Self {
        self.config = config;
        self
    }

    /// Sets the Lease timings (see [`ShardsConfig::lease`]).
    #[must_use]
    pub fn lease_config(mut self, lease: LeaseConfig) -> Self {
        self.config.lease = lease;
        self
    }

    /// Sets the most API calls in flight (see [`ShardsConfig::max_in_flight`]).
    #[must_use]
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.config.max_in_flight = n;
        self
    }

    /// Sets the handover grace (see [`ShardsConfig::handover_grace`]).
    #[must_use]
    pub fn handover_grace(mut self, d: Duration) -> Self {
        self.config.handover_grace = d;
        self
    }

    /// The settings in force.
    pub fn settings(&self) -> &ShardsConfig {
        &self.config
    }

    /// How many shards the set has.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The name of shard `index`'s Lease: `<name>-<index>`.
    pub fn lease_name(&self, index: u32) -> String {
        format!("{}-{index}", self.name)
    }

    /// The namespace of the Leases (resolved as documented in [`new`](Self::new)).
    pub fn resolved_namespace(&self) -> String {
        lock::discover_namespace(self.namespace.as_deref())
            .map(|(ns, _)| ns)
            .unwrap_or_else(|| self.client.default_namespace().to_string())
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
            return Err(crate::error::invalid("identity", "identity must not be empty"));
        }
        Ok(id)
    }

    /// Checks the settings and names without sending anything.
    pub fn validate(&self) -> Result<()> {
        self.config.validate()?;
        if self.count == 0 || self.count > MAX_SHARDS {
            return Err(crate::error::invalid(
                "count",
                format!(
                    "the number of shards must be between 1 and {MAX_SHARDS}, got {}",
                    self.count
                ),
            ));
        }
        // The set's name is a label value too: at most 63 characters.
        if self.name.len() > 63 {
            return Err(Error::InvalidLockName {
                name: self.name.clone(),
                reason: "a shard set's name must be at most 63 characters (it is a label value)".into(),
            });
        }
        lock::validate_name(&self.name)?;
        lock::validate_name(&self.lease_name(self.count - 1))?;
        if self.name.contains('.') {
            return Err(Error::InvalidLockName {
                name: self.name.clone(),
                reason: "a shard set's name must not contain '.' (it is a label value)".into(),
            });
        }
        Ok(())
    }

    /// Starts campaigning in the background and returns the shards as they are acquired.
    ///
    /// When `shutdown` is cancelled, every held shard's loss token fires
    /// ([`LossReason::Cancelled`]); each is renewed until its [`Shard`] is dropped or released
    /// (at most [`LeaseConfig::shutdown_grace`]) and then released; the membership Lease is
    /// deleted and the background task ends ([`Assignments::finish`]).
    pub fn start(&self, shutdown: &CancellationToken) -> Result<Assignments> {
        self.validate()?;
        let identity = self.resolved_identity()?;
        let namespace = self.resolved_namespace();
        let (out, rx) = mpsc::unbounded_channel();
        let (held_tx, held) = watch::channel(ShardSet::default());
        let engine = Engine::new(self, namespace, identity, out, held_tx);
        let span = info_span!("shards", set = %self.name, identity = %engine.identity, shards = self.count);
        let task = tokio::spawn(engine.run(shutdown.clone()).instrument(span));
        Ok(Assignments {
            rx,
            held,
            task: Some(task),
        })
    }

    /// Campaigns until `shutdown`, running `work(index, term, lost)` for every shard while it
    /// is held.
    ///
    /// `work` must return soon after `lost` is cancelled (the shard was handed over, lost, or
    /// shutdown began): only then is the shard released, so that the next holder's work never
    /// overlaps this one's through a premature release. Returns after shutdown, once every shard
    /// is released, or with the error that ended the campaign (a missing permission).
    ///
    /// # Cancellation safety
    /// Not cancel-safe: use `shutdown` to stop it. Dropping the future drops the work futures;
    /// their shards are released in the background.
    pub async fn run<F, Fut>(&self, shutdown: &CancellationToken, mut work: F) -> Result<()>
    where
        F: FnMut(u32, Term, CancellationToken) -> Fut,
        Fut: Future<Output = ()>,
    {
        let mut assignments = self.start(shutdown)?;
        let mut running = FuturesUnordered::new();
        loop {
            tokio::select! {
                shard = assignments.next() => match shard {
                    Some(shard) => {
                        let fut = work(shard.index(), shard.leadership().term().clone(), shard.lost_token());
                        running.push(async move {
                            fut.await;
                            drop(shard);
                        });
                    }
                    None => break,
                },
                Some(()) = running.next(), if !running.is_empty() => {}
            }
        }
        // The engine ended: the work still running has been told (its shards are lost).
        while running.next().await.is_some() {}
        assignments.finish().await
    }
}

/// The shards of one candidate, as they are acquired; see [`Shards::start`]. Dropping it
/// hands every shard back, as a shutdown does.
#[derive(Debug)]
#[must_use = "the shards acquired are taken from `next`; dropping this hands every shard back"]
pub struct Assignments {
    rx: mpsc::UnboundedReceiver<Shard>,
    held: watch::Receiver<ShardSet>,
    task: Option<tokio::task::JoinHandle<Result<()>>>,
}

// === impl Assignments ===

impl Assignments {
    /// The next shard acquired; `None` once the candidate has stopped (after shutdown, or an
    /// error: see [`finish`](Self::finish)).
    ///
    /// # Cancellation safety
    /// Cancel-safe: a shard acquired meanwhile is returned by the next call.
    pub async fn next(&mut self) -> Option<Shard> {
        self.rx.recv().await
    }

    /// The shards held now, updated on every change: for observers, status pages, or a
    /// process that passes the set to another (the `kube-leader run --shards` sidecar).
    pub fn held(&self) -> watch::Receiver<ShardSet> {
        self.held.clone()
    }

    /// Waits until the candidate has stopped and tells why: `Ok` after shutdown, or the error
    /// that ended it.
    ///
    /// # Cancellation safety
    /// Cancel-safe in that the candidate goes on in the background; its result is lost.
    pub async fn finish(mut self) -> Result<()> {
        match self.task.take() {
            Some(task) => match task.await {
                Ok(r) => r,
                Err(join) if join.is_cancelled() => Ok(()),
                Err(join) => std::panic::resume_unwind(join.into_panic()),
            },
            None => Ok(()),
        }
    }
}

/// One held shard: a [`Leadership`] of the Lease `<name>-<index>`.
///
/// Dropping it (or [`release`](Self::release)) tells the candidate that the work on this shard
/// has stopped: a shard that was handed over, or given up on shutdown, is released then.
#[derive(Debug)]
#[must_use = "dropping a Shard gives it up at once"]
pub struct Shard {
    index: u32,
    leadership: Leadership,
}

// === impl Shard ===

impl Shard {
    /// The shard's index, `0..count`.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The fencing token of this term of the shard (see [`Leadership::fencing_token`]).
    pub fn fencing_token(&self) -> u64 {
        self.leadership.fencing_token()
    }

    /// A token cancelled the moment this shard is lost or handed over.
    pub fn lost_token(&self) -> CancellationToken {
        self.leadership.lost_token()
    }

    /// The leadership of this shard's Lease.
    pub fn leadership(&self) -> &Leadership {
        &self.leadership
    }

    /// The leadership of this shard's Lease, to keep instead of the `Shard`.
    pub fn into_leadership(self) -> Leadership {
        self.leadership
    }

    /// Gives the shard up and waits until it is released (or found not to be ours any more).
    ///
    /// # Cancellation safety
    /// Once called, the release goes on in the background even if the future is dropped.
    pub async fn release(self) -> Result<()> {
        self.leadership.release().await
    }
}

/// The shards a candidate holds now, published by [`Assignments::held`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardSet {
    /// Held shards, by index, with the fencing token of their term. A shard leaves the set the
    /// moment its loss token fires (lost, handed over, or shutdown), before it is released.
    pub held: BTreeMap<u32, u64>,
    /// Live candidates as this one sees them (itself included).
    pub members: usize,
    /// This candidate's fair share.
    pub quota: u32,
}

// === the engine ===

/// The background task of one candidate.
struct Engine {
    api: Api<Lease>,
    name: String,
    namespace: String,
    count: u32,
    identity: String,
    instance: String,
    cfg: ShardsConfig,
    phases: Phases,
    slots: Vec<Slot>,
    member: Member,
    /// Other candidates' membership Leases, by Lease name.
    members: BTreeMap<String, Observed>,
    timers: Timers,
    calls: FuturesUnordered<BoxFuture<'static, Reply>>,
    in_flight: usize,
    /// Writes waiting for a free call: (class, deadline, key). Renewals (class 0) by deadline
    /// first, then releases (1).
    queue: BTreeSet<(u8, Instant, Key)>,
    throttle: Throttle,
    out: mpsc::UnboundedSender<Shard>,
    held_tx: watch::Sender<ShardSet>,
    done_tx: mpsc::UnboundedSender<(u32, u64)>,
    done_rx: mpsc::UnboundedReceiver<(u32, u64)>,
    /// The initial list has completed.
    synced: bool,
    /// Relist in progress: the names listed so far.
    relist: Option<Vec<Lease>>,
    /// No shard is taken before this (see [`ShardsConfig::join_settle`]).
    acquire_from: Option<Instant>,
    dirty: bool,
    stopping: bool,
    fatal: Option<Error>,
    next_gen: u64,
    quota: u32,
    live: usize,
}

/// What this candidate knows and holds of one shard.
#[derive(Default)]
struct Slot {
    /// The Lease as last seen (watch, read or our own write).
    lease: Option<Lease>,
    observed: Option<Observed>,
    /// Whether the observed record names this identity but another process wrote it.
    foreign_self: bool,
    /// Absent now: what was seen before it was deleted.
    deleted: Option<Observed>,
    absent_since: Option<Instant>,
    seen: bool,
    transitions_seen: Option<u32>,
    term: Option<Held>,
    /// An acquisition, renewal, release or read is in flight.
    busy: bool,
    /// No acquisition before this (after a lost race or an error).
    not_before: Option<Instant>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Held; renewed.
    Active,
    /// Lost by handover or shutdown: still renewed until the work stops (`done`), then
    /// released; past `until`, given up unreleased.
    Leaving { until: Instant, release: bool },
    /// The release write is in flight.
    Releasing,
    /// No longer ours (deadline, another holder, deleted): waiting for the work to stop.
    Gone,
}

struct Held {
    gen: u64,
    keeper: Keeper,
    released: Option<oneshot::Sender<()>>,
    state: State,
    /// The work on it has stopped (the `Shard` was dropped).
    done: bool,
    record: LeaseRecord,
    /// The Lease as last written by us: its resourceVersion is the next write's precondition.
    lease: Lease,
    fencing_token: u64,
    renewal: Renewal,
}

#[derive(Default)]
struct Member {
    name: String,
    lease: Option<Lease>,
    renewal: Option<Renewal>,
    busy: bool,
    /// Retry the write not before this.
    next: Option<Instant>,
}

/// An answer from the API server.
enum Reply {
    Acquired {
        index: u32,
        decision: Decision,
        record: LeaseRecord,
        sent: Instant,
        result: Result<Lease, Failure>,
    },
    Renewed {
        index: u32,
        gen: u64,
        record: LeaseRecord,
        sent: Instant,
        result: Result<Lease, Failure>,
    },
    Released {
        index: u32,
        gen: u64,
        result: Result<Lease, Failure>,
    },
    Read {
        index: u32,
        result: Result<Option<Lease>, Failure>,
    },
    Member {
        sent: Instant,
        result: Result<Lease, Failure>,
    },
    MemberRead {
        result: Result<Option<Lease>, Failure>,
    },
}

impl Engine {
    fn new(
        s: &Shards,
        namespace: String,
        identity: String,
        out: mpsc::UnboundedSender<Shard>,
        held_tx: watch::Sender<ShardSet>,
    ) -> Self {
        let cfg = s.config.clone();
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let retry = cfg.lease.retry_period;
        Self {
            api: Api::namespaced(s.client.clone(), &namespace),
            name: s.name.clone(),
            namespace,
            count: s.count,
            member: Member {
                name: member_lease_name(&s.name, &identity),
                ..Member::default()
            },
            identity,
            instance: new_instance_id(),
            phases: Phases {
                epoch: Instant::now(),
                retry,
                slots: s.count + 1,
            },
            slots: (0..s.count).map(|_| Slot::default()).collect(),
            members: BTreeMap::new(),
            timers: Timers::default(),
            calls: FuturesUnordered::new(),
            in_flight: 0,
            queue: BTreeSet::new(),
            throttle: Throttle::new(retry / 4, cfg.lease.renew_deadline / 2),
            out,
            held_tx,
            done_tx,
            done_rx,
            synced: false,
            relist: None,
            acquire_from: None,
            dirty: false,
            stopping: false,
            fatal: None,
            next_gen: 0,
            quota: 0,
            live: 1,
            cfg,
        }
    }

    fn op(&self, verb: &'static str) -> OwnedOp {
        OwnedOp {
            verb,
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }

    fn renew_deadline(&self) -> Duration {
        self.cfg.lease.renew_deadline
    }

    async fn run(mut self, shutdown: CancellationToken) -> Result<()> {
        let selector = format!("{SHARDS_LABEL}={}", self.name);
        let config = watcher::Config::default()
            .labels(&selector)
            .timeout(WATCH_TIMEOUT_SECS);
        let mut watch = watcher(self.api.clone(), config).default_backoff().boxed();
        info!(instance = %self.instance, "campaigning for shards");
        loop {
            if (self.fatal.is_some() || self.out.is_closed()) && !self.stopping {
                // An error ended the campaign, or nobody takes the shards any more (the
                // `Assignments` were dropped): hand everything back.
                self.stop(Instant::now(), LossReason::Cancelled);
            }
            if self.stopping && self.finished() {
                break;
            }
            // Deadlines first: after a freeze (SIGSTOP, a paused VM) the renew deadlines that
            // passed meanwhile end their shards before a backlog of watch events is read.
            let now = Instant::now();
            if self.timers.next().is_some_and(|t| t <= now) {
                for key in self.timers.due(now) {
                    self.on_timer(key, now);
                }
                if self.dirty {
                    self.rebalance(now);
                }
                self.dispatch(now);
            }
            let wake = self.timers.next();
            tokio::select! {
                biased;
                () = shutdown.cancelled(), if !self.stopping => {
                    info!("shutdown: handing every shard back once its work stops");
                    self.stop(Instant::now(), LossReason::Cancelled);
                }
                Some(reply) = self.calls.next(), if !self.calls.is_empty() => {
                    self.in_flight = self.in_flight.saturating_sub(1);
                    self.on_reply(reply, Instant::now());
                }
                Some((index, gen)) = self.done_rx.recv() => self.on_done(index, gen, Instant::now()),
                ev = watch.next() => match ev {
                    Some(Ok(ev)) => self.on_watch(ev, Instant::now()),
                    Some(Err(e)) => match classify_watch(self.op("watch").op(), e) {
                        Failure::Fatal(e) => {
                            warn!(error = %e, "cannot watch the shard Leases");
                            self.fatal.get_or_insert(e);
                        }
                        e => debug!(error = ?e, "shard watch failed; it is retried with backoff"),
                    },
                    None => debug!("shard watch ended"),
                },
                () = sleep_until_opt(wake) => {
                    let now = Instant::now();
                    for key in self.timers.due(now) {
                        self.on_timer(key, now);
                    }
                }
            }
            let now = Instant::now();
            if self.dirty {
                self.rebalance(now);
            }
            self.dispatch(now);
        }
        self.leave().await;
        match self.fatal.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Whether everything is handed back after a shutdown.
    fn finished(&self) -> bool {
        self.in_flight == 0
            && self
                .slots
                .iter()
                .all(|s| s.term.as_ref().is_none_or(|t| t.state == State::Gone))
    }

    /// Deletes the membership Lease (best effort) after the last shard is handed back.
    async fn leave(&mut self) {
        let Some(lease) = &self.member.lease else {
            return;
        };
        let mut params = DeleteParams::default();
        if let Some(rv) = lease.metadata.resource_version.clone() {
            params = params.preconditions(kube::api::Preconditions {
                resource_version: Some(rv),
                uid: None,
            });
        }
        let name = self.member.name.clone();
        let op = self.op("delete");
        let op = OwnedOp {
            name: name.clone(),
            ..op
        };
        match call(op.op(), self.cfg.api_timeout(), self.api.delete(&name, &params)).await {
            Ok(_) => debug!(lease = %name, "membership Lease deleted"),
            Err(e) => debug!(lease = %name, error = ?e, "could not delete the membership Lease; it expires"),
        }
    }

    /// Begins handing every shard back: each is lost now and released once its work stops.
    fn stop(&mut self, now: Instant, reason: LossReason) {
        self.stopping = true;
        let grace = self.cfg.lease.shutdown_grace;
        let release = self.cfg.lease.release_on_cancel;
        for index in 0..self.count {
            let slot = &mut self.slots[index as usize];
            if let Some(t) = slot.term.as_mut() {
                if t.state == State::Active {
                    t.keeper.lose(reason.clone());
                    t.state = State::Leaving {
                        until: now + grace,
                        release,
                    };
                    self.timers.at(now + grace, Key::Shard(index));
                    if t.done {
                        self.after_done(index, now);
                    }
                }
            }
        }
        self.publish();
    }

    // --- the watch ---

    fn on_watch(&mut self, ev: watcher::Event<Lease>, now: Instant) {
        match ev {
            watcher::Event::Init => self.relist = Some(Vec::new()),
            watcher::Event::InitApply(l) => self.relist.get_or_insert_with(Vec::new).push(l),
            watcher::Event::InitDone => {
                let listed = self.relist.take().unwrap_or_default();
                let names: BTreeSet<String> = listed.iter().filter_map(|l| l.metadata.name.clone()).collect();
                for l in listed {
                    self.absorb(l, now);
                }
                // Known before and not listed now: deleted while the watch was down, by whom
                // and after which holder is unknown (waited out from now).
                for index in 0..self.count {
                    let name = self.shard_name(index);
                    let slot = &self.slots[index as usize];
                    if slot.lease.is_some() && slot.observed.is_some() && !names.contains(&name) {
                        self.gone(index, now, true);
                    }
                }
                self.members.retain(|n, _| names.contains(n));
                if !names.contains(&self.member.name) {
                    self.member.lease = None;
                }
                if !self.synced {
                    self.synced = true;
                    // Joining a set whose shards are all held: nothing to race for, the others
                    // hand over as soon as they see this candidate. Otherwise (candidates
                    // starting together) let them see each other first.
                    let fallback = self.cfg.lease.lease_duration;
                    let established = self.slots.iter().all(|s| {
                        s.observed
                            .as_ref()
                            .is_some_and(|o| o.record.holder.is_some() && now < o.expires_at(fallback))
                    });
                    let settle = if established {
                        Duration::ZERO
                    } else {
                        self.cfg.join_settle()
                    };
                    self.acquire_from = Some(now + settle);
                    self.timers.at(now + settle, Key::Rebalance);
                    self.timers.at(now, Key::Member);
                }
                self.dirty = true;
            }
            watcher::Event::Apply(l) => self.absorb(l, now),
            watcher::Event::Delete(l) => {
                let name = l.metadata.name.clone().unwrap_or_default();
                match self.classify(&name) {
                    Some(Role::Shard(index)) => self.gone(index, now, false),
                    Some(Role::Member) if name == self.member.name => self.member.lease = None,
                    Some(Role::Member) => {
                        self.members.remove(&name);
                        self.dirty = true;
                    }
                    None => {}
                }
            }
        }
    }

    fn shard_name(&self, index: u32) -> String {
        format!("{}-{index}", self.name)
    }

    fn classify(&self, lease_name: &str) -> Option<Role> {
        let rest = lease_name.strip_prefix(&self.name)?.strip_prefix('-')?;
        if rest.starts_with("member-") {
            return Some(Role::Member);
        }
        if rest.is_empty()
            || !rest.bytes().all(|b| b.is_ascii_digit())
            || (rest.len() > 1 && rest.starts_with('0'))
        {
            return None;
        }
        rest.parse::<u32>()
            .ok()
            .filter(|i| *i < self.count)
            .map(Role::Shard)
    }

    /// Folds a Lease seen (watch or read) into what is known.
    fn absorb(&mut self, lease: Lease, now: Instant) {
        let name = lease.metadata.name.clone().unwrap_or_default();
        match self.classify(&name) {
            Some(Role::Shard(index)) => self.absorb_shard(index, lease, now),
            Some(Role::Member) if name == self.member.name => {
                let newer = self.member.lease.as_ref().is_none_or(|m| newer(&lease, m));
                if newer {
                    self.member.lease = Some(lease);
                }
            }
            Some(Role::Member) => {
                let record = LeaseRecord::from_lease(&lease);
                let rv = lease.metadata.resource_version.clone();
                let prev = self.members.get(&name);
                let changed_holder = prev.is_none_or(|p| p.record.holder != record.holder);
                let next = Observed::update(prev, record, rv, now);
                self.members.insert(name, next);
                if changed_holder {
                    self.dirty = true;
                }
            }
            None => {}
        }
    }

    fn absorb_shard(&mut self, index: u32, lease: Lease, now: Instant) {
        let record = LeaseRecord::from_lease(&lease);
        // Ours only if this process wrote it: a twin with the same identity writes another
        // instance id into `INSTANCE_ANNOTATION` (issue 16).
        let ours = record.is_held_by(&self.identity) && written_by(&lease, &record, &self.instance);
        let slot = &mut self.slots[index as usize];
        if let Some(known) = &slot.lease {
            if !newer(&lease, known) && slot.observed.is_some() {
                return;
            }
        }
        let mut lost = None;
        if let Some(t) = slot.term.as_mut() {
            if matches!(t.state, State::Active | State::Leaving { .. }) && newer(&lease, &t.lease) {
                if ours {
                    // Our own write, echoed before its answer came, or an edit of its metadata.
                    t.lease = lease.clone();
                } else if record.is_held_by(&self.identity) {
                    lost = Some(LossReason::DuplicateIdentity {
                        identity: self.identity.clone(),
                    });
                } else {
                    lost = Some(LossReason::OtherHolder {
                        holder: record.holder.clone().unwrap_or_default(),
                    });
                }
            }
        }
        let holder_changed = slot
            .observed
            .as_ref()
            .is_none_or(|o| o.record.holder != record.holder);
        slot.transitions_seen = Some(
            slot.transitions_seen
                .map_or(record.transitions, |t| t.max(record.transitions)),
        );
        slot.foreign_self = record.is_held_by(&self.identity) && !ours;
        slot.observed = Some(Observed::update(
            slot.observed.as_ref(),
            record,
            lease.metadata.resource_version.clone(),
            now,
        ));
        slot.lease = Some(lease);
        slot.deleted = None;
        slot.absent_since = None;
        slot.seen = true;
        if holder_changed {
            slot.not_before = None;
            self.dirty = true;
        }
        if let Some(reason) = lost {
            self.lose(index, reason, now);
        }
    }

    /// Shard `index`'s Lease is gone (deleted; `unknown`: found missing by a relist).
    fn gone(&mut self, index: u32, now: Instant, unknown: bool) {
        let slot = &mut self.slots[index as usize];
        let last = slot.observed.take();
        slot.lease = None;
        slot.seen = true;
        slot.foreign_self = false;
        if unknown {
            slot.deleted = None;
            slot.absent_since = Some(now);
        } else {
            slot.deleted = last;
            slot.absent_since = None;
        }
        slot.not_before = None;
        self.dirty = true;
        if slot
            .term
            .as_ref()
            .is_some_and(|t| matches!(t.state, State::Active | State::Leaving { .. }))
        {
            self.lose(index, LossReason::LockDeleted, now);
        }
    }

    /// Shard `index` is not ours any more: its loss token fires, renewals stop.
    fn lose(&mut self, index: u32, reason: LossReason, _now: Instant) {
        let Some(t) = self.slots[index as usize].term.as_mut() else {
            return;
        };
        if !matches!(t.state, State::Active | State::Leaving { .. }) {
            return;
        }
        info!(shard = index, %reason, "lost shard");
        t.keeper.lose(reason);
        t.state = State::Gone;
        self.dirty = true;
        if t.done {
            self.finish_term(index);
        }
        self.publish();
    }

    // --- timers ---

    fn on_timer(&mut self, key: Key, now: Instant) {
        match key {
            Key::Rebalance => self.dirty = true,
            Key::Member => self.member_due(now),
            Key::Shard(index) => self.shard_due(index, now),
        }
    }

    fn shard_due(&mut self, index: u32, now: Instant) {
        let renew = self.renew_deadline();
        let slot = &mut self.slots[index as usize];
        let Some(t) = slot.term.as_mut() else {
            self.dirty = true;
            return;
        };
        match t.state {
            State::Active | State::Leaving { .. } => {}
            State::Releasing | State::Gone => return,
        }
        if now >= t.renewal.deadline(renew) {
            let since = now - t.renewal.last_sent;
            warn!(
                shard = index,
                ?since,
                "renew deadline passed; stopping work on the shard"
            );
            self.lose(
                index,
                LossReason::RenewDeadline {
                    since_last_renewal: since,
                },
                now,
            );
            return;
        }
        if let State::Leaving { until, .. } = t.state {
            if now >= until {
                warn!(
                    shard = index,
                    "the work on the shard did not stop in time; not releasing it, its lease will expire"
                );
                t.state = State::Gone;
                if t.done {
                    self.finish_term(index);
                }
                return;
            }
        }
        if slot.busy || now < t.renewal.next {
            return;
        }
        match t.renewal.hold_back(now, &self.throttle, renew) {
            Some(later) => self.timers.at(later, Key::Shard(index)),
            None => {
                let deadline = t.renewal.deadline(renew);
                self.queue.insert((0, deadline, Key::Shard(index)));
            }
        }
    }

    fn member_due(&mut self, now: Instant) {
        if self.member.busy || self.stopping || !self.synced {
            return;
        }
        let due = self.member.next.unwrap_or(now);
        if now < due {
            self.timers.at(due, Key::Member);
            return;
        }
        let deadline = self
            .member
            .renewal
            .as_ref()
            .map_or(now, |r| r.deadline(self.renew_deadline()));
        self.queue.insert((0, deadline, Key::Member));
    }

    // --- writes ---

    /// Starts queued writes while calls are free.
    fn dispatch(&mut self, now: Instant) {
        while self.in_flight < self.cfg.max_in_flight {
            let Some((_, _, key)) = self.queue.pop_first() else {
                break;
            };
            match key {
                Key::Member => self.write_member(),
                Key::Shard(index) => self.write_shard(index, now),
                Key::Rebalance => {}
            }
        }
    }

    fn push(&mut self, fut: impl Future<Output = Reply> + Send + 'static) {
        self.in_flight += 1;
        self.calls.push(fut.boxed());
    }

    fn write_member(&mut self) {
        if self.member.busy || self.stopping {
            return;
        }
        let record = LeaseRecord {
            holder: Some(self.identity.clone()),
            lease_duration: Some(self.cfg.lease.lease_duration),
            acquire_time: Some(now_micro()),
            renew_time: Some(now_micro()),
            transitions: 0,
        };
        let secs = self.cfg.lease.lease_duration_seconds();
        let api = self.api.clone();
        let timeout = self.cfg.api_timeout();
        let op = OwnedOp {
            name: self.member.name.clone(),
            ..self.op("update")
        };
        self.member.busy = true;
        let sent = Instant::now();
        match self.member.lease.clone() {
            Some(mut lease) => {
                let keep = LeaseRecord::from_lease(&lease);
                let record = LeaseRecord {
                    acquire_time: keep.acquire_time.or(record.acquire_time),
                    transitions: keep.transitions,
                    ..record
                };
                record.write_to(lease.spec.get_or_insert_with(LeaseSpec::default), secs);
                self.label(&mut lease, "member");
                let name = op.name.clone();
                self.push(async move {
                    let result = call(
                        op.op(),
                        timeout,
                        api.replace(&name, &PostParams::default(), &lease),
                    )
                    .await;
                    Reply::Member { sent, result }
                });
            }
            None => {
                let mut lease = self.new_lease(&self.member.name, &record, "member");
                self.label(&mut lease, "member");
                let op = OwnedOp { verb: "create", ..op };
                self.push(async move {
                    let result = call(op.op(), timeout, api.create(&PostParams::default(), &lease)).await;
                    Reply::Member { sent, result }
                });
            }
        }
    }

    fn write_shard(&mut self, index: u32, now: Instant) {
        let renew = self.renew_deadline();
        let timeout_cap = self.cfg.api_timeout();
        let secs = self.cfg.lease.lease_duration_seconds();
        let slot = &mut self.slots[index as usize];
        if slot.busy {
            // A renewal or read is in flight: a renewal comes again from its timer, a release
            // is queued again when the call returns (see `on_reply`).
            return;
        }
        let Some(t) = slot.term.as_mut() else {
            return;
        };
        let name = format!("{}-{index}", self.name);
        let api = self.api.clone();
        match t.state {
            State::Active | State::Leaving { .. } => {
                let deadline = t.renewal.deadline(renew);
                if now >= deadline {
                    return;
                }
                let mut record = t.record.clone();
                record.renew_time = Some(now_micro());
                let mut lease = t.lease.clone();
                record.write_to(lease.spec.get_or_insert_with(LeaseSpec::default), secs);
                set_fencing_token(&mut lease, Some((&self.identity, t.fencing_token)));
                set_writer(&mut lease, &self.instance, &record);
                let timeout = timeout_cap
                    .min(deadline.saturating_duration_since(now))
                    .max(Duration::from_millis(1));
                let gen = t.gen;
                slot.busy = true;
                let op = OwnedOp {
                    verb: "update",
                    namespace: self.namespace.clone(),
                    name: name.clone(),
                };
                let sent = Instant::now();
                self.push(async move {
                    let result = call(
                        op.op(),
                        timeout,
                        api.replace(&name, &PostParams::default(), &lease),
                    )
                    .await;
                    Reply::Renewed {
                        index,
                        gen,
                        record,
                        sent,
                        result,
                    }
                });
            }
            State::Releasing => {
                let now_wall = now_micro();
                let record = LeaseRecord {
                    holder: None,
                    lease_duration: Some(Duration::from_secs(1)),
                    acquire_time: Some(now_wall),
                    renew_time: Some(now_wall),
                    transitions: t.record.transitions,
                };
                let mut lease = t.lease.clone();
                record.write_to(lease.spec.get_or_insert_with(LeaseSpec::default), 1);
                set_fencing_token(&mut lease, None);
                set_writer(&mut lease, &self.instance, &record);
                let gen = t.gen;
                slot.busy = true;
                let op = OwnedOp {
                    verb: "update",
                    namespace: self.namespace.clone(),
                    name: name.clone(),
                };
                self.push(async move {
                    let result = call(
                        op.op(),
                        timeout_cap,
                        api.replace(&name, &PostParams::default(), &lease),
                    )
                    .await;
                    Reply::Released { index, gen, result }
                });
            }
            State::Gone => {}
        }
    }

    fn acquire(&mut self, index: u32, decision: Decision) {
        let secs = self.cfg.lease.lease_duration_seconds();
        let timeout = self.cfg.api_timeout();
        let name = self.shard_name(index);
        let slot = &self.slots[index as usize];
        let mut record = record_for(
            &decision,
            slot.observed.as_ref(),
            &self.identity,
            self.cfg.lease.lease_duration,
            now_micro(),
        );
        let api = self.api.clone();
        let sent = Instant::now();
        let op = OwnedOp {
            verb: "update",
            namespace: self.namespace.clone(),
            name: name.clone(),
        };
        let fut: BoxFuture<'static, Result<Lease, Failure>> = match (&decision, slot.lease.clone()) {
            (Decision::Create, _) | (_, None) => {
                // Created again after a deletion: keep counting (client-go starts at 0).
                record.transitions = slot
                    .transitions_seen
                    .filter(|t| *t < i32::MAX.unsigned_abs())
                    .map_or(0, |t| t + 1);
                let mut lease = self.new_lease(&name, &record, "shard");
                set_writer(&mut lease, &self.instance, &record);
                let op = OwnedOp { verb: "create", ..op };
                async move { call(op.op(), timeout, api.create(&PostParams::default(), &lease)).await }
                    .boxed()
            }
            (_, Some(mut lease)) => {
                record.write_to(lease.spec.get_or_insert_with(LeaseSpec::default), secs);
                // The previous term's token does not belong to this one.
                set_fencing_token(&mut lease, None);
                set_writer(&mut lease, &self.instance, &record);
                self.label(&mut lease, "shard");
                async move {
                    call(
                        op.op(),
                        timeout,
                        api.replace(&name, &PostParams::default(), &lease),
                    )
                    .await
                }
                .boxed()
            }
        };
        self.slots[index as usize].busy = true;
        debug!(shard = index, ?decision, "acquiring shard");
        self.push(async move {
            let result = fut.await;
            Reply::Acquired {
                index,
                decision,
                record,
                sent,
                result,
            }
        });
    }

    fn read(&mut self, index: u32, timeout: Duration) {
        let name = self.shard_name(index);
        let api = self.api.clone();
        let op = OwnedOp {
            verb: "get",
            namespace: self.namespace.clone(),
            name: name.clone(),
        };
        self.slots[index as usize].busy = true;
        self.push(async move {
            let result = call(op.op(), timeout.max(Duration::from_millis(1)), api.get_opt(&name)).await;
            Reply::Read { index, result }
        });
    }

    fn read_member(&mut self) {
        let name = self.member.name.clone();
        let api = self.api.clone();
        let op = OwnedOp {
            name: name.clone(),
            ..self.op("get")
        };
        let timeout = self.cfg.api_timeout();
        self.member.busy = true;
        self.push(async move {
            let result = call(op.op(), timeout, api.get_opt(&name)).await;
            Reply::MemberRead { result }
        });
    }

    fn new_lease(&self, name: &str, record: &LeaseRecord, role: &str) -> Lease {
        let mut spec = LeaseSpec::default();
        record.write_to(&mut spec, self.cfg.lease.lease_duration_seconds());
        let mut lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(self.namespace.clone()),
                ..Default::default()
            },
            spec: Some(spec),
        };
        self.label(&mut lease, role);
        lease
    }

    fn label(&self, lease: &mut Lease, role: &str) {
        let labels = lease.metadata.labels.get_or_insert_with(BTreeMap::new);
        labels.insert(SHARDS_LABEL.to_string(), self.name.clone());
        labels.insert(ROLE_LABEL.to_string(), role.to_string());
    }

    // --- answers ---

    fn overloaded(&mut self, failure: &Failure, now: Instant) {
        if let Some(retry_after) = overload(failure) {
            self.throttle.overloaded(now, retry_after);
        }
    }

    fn on_reply(&mut self, reply: Reply, now: Instant) {
        let index = match &reply {
            Reply::Renewed { index, .. } | Reply::Read { index, .. } => Some(*index),
            _ => None,
        };
        self.answer(reply, now);
        // What waited for the call on the shard to return: a release goes out now; a term
        // that is not ours any more and whose work stopped ends.
        if let Some(index) = index {
            let slot = &self.slots[index as usize];
            if !slot.busy {
                match slot.term.as_ref().map(|t| t.state) {
                    Some(State::Releasing) => {
                        self.queue.insert((1, now, Key::Shard(index)));
                    }
                    Some(State::Gone) => self.finish_term(index),
                    _ => {}
                }
            }
        }
    }

    fn answer(&mut self, reply: Reply, now: Instant) {
        match reply {
            Reply::Acquired {
                index,
                decision,
                record,
                sent,
                result,
            } => self.on_acquired(index, decision, record, sent, result, now),
            Reply::Renewed {
                index,
                gen,
                record,
                sent,
                result,
            } => self.on_renewed(index, gen, record, sent, result, now),
            Reply::Released { index, gen, result } => {
                self.slots[index as usize].busy = false;
                match &result {
                    Ok(lease) => {
                        debug!(shard = index, "released shard");
                        let lease = lease.clone();
                        self.absorb_shard(index, lease, now);
                    }
                    Err(e) => {
                        self.overloaded(e, now);
                        debug!(shard = index, error = ?e, "could not release the shard; it will expire");
                    }
                }
                if self.slots[index as usize]
                    .term
                    .as_ref()
                    .is_some_and(|t| t.gen == gen)
                {
                    if let Some(t) = self.slots[index as usize].term.as_mut() {
                        t.state = State::Gone;
                    }
                    self.finish_term(index);
                }
            }
            Reply::Read { index, result } => {
                self.slots[index as usize].busy = false;
                match result {
                    Ok(Some(lease)) => self.absorb_shard(index, lease, now),
                    Ok(None) => self.gone(index, now, self.slots[index as usize].observed.is_none()),
                    Err(e) => {
                        self.overloaded(&e, now);
                        debug!(shard = index, error = ?e, "re-read failed");
                    }
                }
                self.timers.at(now, Key::Shard(index));
                self.dirty = true;
            }
            Reply::MemberRead { result } => {
                self.member.busy = false;
                match result {
                    Ok(lease) => self.member.lease = lease,
                    Err(e) => {
                        self.overloaded(&e, now);
                        debug!(error = ?e, "reading the membership Lease failed");
                    }
                }
                self.member.next = Some(now);
                self.timers.at(now, Key::Member);
            }
            Reply::Member { sent, result } => {
                self.member.busy = false;
                let retry = self.cfg.lease.retry_period;
                match result {
                    Ok(lease) => {
                        self.throttle.succeeded();
                        self.member.lease = Some(lease);
                        let renewal = self
                            .member
                            .renewal
                            .get_or_insert_with(|| Renewal::new(&self.phases, self.count, sent));
                        renewal.succeeded(&self.phases, sent);
                        self.member.next = Some(renewal.next);
                    }
                    Err(Failure::NotFound) => {
                        self.member.lease = None;
                        self.member.next = Some(now);
                    }
                    Err(Failure::Conflict) => {
                        // Written meanwhile (a write that timed out but landed, an edit): read
                        // it again before the next write.
                        self.read_member();
                        return;
                    }
                    Err(Failure::Fatal(e)) => {
                        warn!(error = %e, "cannot write the membership Lease");
                        self.fatal.get_or_insert(e);
                        return;
                    }
                    Err(e) => {
                        self.overloaded(&e, now);
                        debug!(error = ?e, "membership renewal failed; retrying");
                        self.member.next = Some(now + jittered(retry / 2));
                    }
                }
                if let Some(next) = self.member.next {
                    self.timers.at(next, Key::Member);
                }
            }
        }
    }

    fn on_acquired(
        &mut self,
        index: u32,
        decision: Decision,
        record: LeaseRecord,
        sent: Instant,
        result: Result<Lease, Failure>,
        now: Instant,
    ) {
        self.slots[index as usize].busy = false;
        self.dirty = true;
        let retry = self.cfg.lease.retry_period;
        let lease = match result {
            Ok(lease) => lease,
            Err(Failure::Conflict) if decision == Decision::Create => {
                // It exists: maybe unlabelled (never seen by our watch). Read it.
                self.slots[index as usize].not_before = Some(now + retry);
                self.read(index, self.cfg.api_timeout());
                return;
            }
            Err(Failure::Conflict | Failure::NotFound) => {
                debug!(shard = index, "lost a race for the shard");
                self.slots[index as usize].not_before = Some(now + retry);
                self.timers.at(now + retry, Key::Rebalance);
                return;
            }
            Err(Failure::Fatal(e)) => {
                warn!(shard = index, error = %e, "cannot take shards");
                self.fatal.get_or_insert(e);
                return;
            }
            Err(e) => {
                self.overloaded(&e, now);
                debug!(shard = index, error = ?e, "transient error while acquiring; retrying later");
                let later = now + jittered(retry);
                self.slots[index as usize].not_before = Some(later);
                self.timers.at(later, Key::Rebalance);
                return;
            }
        };
        self.throttle.succeeded();
        if now >= sent + self.renew_deadline() {
            // Answered after its own renew deadline: by the fail-stop rule the term is over
            // before it began, so it is not handed out (issue 16). The Lease names us: it is
            // taken again as a new term by the next decision.
            warn!(
                shard = index,
                "the acquisition was answered after the renew deadline; not acting on it"
            );
            self.absorb_shard(index, lease, now);
            return;
        }
        let fencing_token = lock::parse_resource_version(lease.metadata.resource_version.as_deref())
            .unwrap_or_else(|| u64::from(record.transitions));
        let name = self.shard_name(index);
        let term = Term {
            identity: self.identity.clone(),
            lock: LockRef {
                namespace: self.namespace.clone(),
                name,
            },
            strategy: Strategy::Lease,
            fencing_token,
            acquired_at: record.acquired_at().unwrap_or_else(SystemTime::now),
        };
        let (leadership, keeper, done) = Leadership::new(term);
        let (released, wait_released) = oneshot::channel();
        self.next_gen += 1;
        let gen = self.next_gen;
        let done_tx = self.done_tx.clone();
        let guard = tokio::spawn(async move {
            done.cancelled().await;
            let _ = done_tx.send((index, gen));
            let _ = wait_released.await;
            Ok(())
        });
        let leadership = leadership.with_task(guard);
        let renewal = Renewal::new(&self.phases, index, sent);
        let deadline = renewal.deadline(self.renew_deadline());
        self.timers.at(renewal.next, Key::Shard(index));
        self.timers.at(deadline, Key::Shard(index));
        let slot = &mut self.slots[index as usize];
        slot.observed = Some(Observed::update(
            None,
            record.clone(),
            lease.metadata.resource_version.clone(),
            sent,
        ));
        slot.transitions_seen = Some(
            slot.transitions_seen
                .map_or(record.transitions, |t| t.max(record.transitions)),
        );
        slot.lease = Some(lease.clone());
        slot.deleted = None;
        slot.absent_since = None;
        slot.seen = true;
        slot.foreign_self = false;
        slot.term = Some(Held {
            gen,
            keeper,
            released: Some(released),
            state: State::Active,
            done: false,
            record,
            lease,
            fencing_token,
            renewal,
        });
        if self.stopping {
            // Acquired while handing everything back: nobody works on it; released at once
            // (dropping the handle tells the engine so).
            if let Some(t) = self.slots[index as usize].term.as_mut() {
                t.keeper.lose(LossReason::Cancelled);
                t.state = State::Leaving {
                    until: now + self.cfg.lease.shutdown_grace,
                    release: true,
                };
            }
            drop(leadership);
            return;
        }
        info!(shard = index, fencing_token, "acquired shard");
        if self.out.send(Shard { index, leadership }).is_err() {
            debug!(shard = index, "nobody takes the shards; giving it up");
        }
        self.publish();
    }

    fn on_renewed(
        &mut self,
        index: u32,
        gen: u64,
        record: LeaseRecord,
        sent: Instant,
        result: Result<Lease, Failure>,
        now: Instant,
    ) {
        let renew = self.renew_deadline();
        let last_try = self.cfg.api_timeout().min(renew / 4);
        let timeout = self.cfg.api_timeout();
        let slot = &mut self.slots[index as usize];
        slot.busy = false;
        let Some(t) = slot.term.as_mut().filter(|t| t.gen == gen) else {
            return;
        };
        match result {
            Ok(written) => {
                self.throttle.succeeded();
                if matches!(t.state, State::Active | State::Leaving { .. }) {
                    t.record = record.clone();
                    t.renewal.succeeded(&self.phases, sent);
                    self.timers.at(t.renewal.next, Key::Shard(index));
                    self.timers.at(t.renewal.deadline(renew), Key::Shard(index));
                }
                if newer(&written, &t.lease) {
                    t.lease = written.clone();
                }
                if slot.lease.as_ref().is_none_or(|l| newer(&written, l)) {
                    slot.observed = Some(Observed::update(
                        slot.observed.as_ref(),
                        record,
                        written.metadata.resource_version.clone(),
                        sent,
                    ));
                    slot.lease = Some(written);
                }
            }
            Err(Failure::NotFound) => {
                self.gone(index, now, false);
            }
            Err(Failure::Conflict) => {
                // Re-read and decide again: still ours (somebody edited metadata) or lost. The
                // read is bounded by the renew deadline, so that fail-stop holds.
                t.renewal.failed(now, renew, last_try);
                let next = t.renewal.next;
                let left = t.renewal.deadline(renew).saturating_duration_since(now);
                self.timers.at(next, Key::Shard(index));
                self.read(index, timeout.min(left));
            }
            Err(e) => {
                if let Failure::Fatal(err) = &e {
                    warn!(shard = index, error = %err, "renewal refused; retrying until the renew deadline");
                } else {
                    debug!(shard = index, error = ?e, "renewal failed; retrying");
                }
                t.renewal.failed(now, renew, last_try);
                let next = t.renewal.next;
                self.timers.at(next, Key::Shard(index));
                self.overloaded(&e, now);
            }
        }
    }

    /// The `Shard` of `index` (generation `gen`) was dropped: the work on it has stopped.
    fn on_done(&mut self, index: u32, gen: u64, now: Instant) {
        let Some(t) = self.slots[index as usize].term.as_mut().filter(|t| t.gen == gen) else {
            return;
        };
        t.done = true;
        if t.state == State::Active {
            // Given up by the user: like `Leadership::release`, a lease is released.
            t.keeper.lose(LossReason::Released);
            t.state = State::Leaving {
                until: now + self.cfg.lease.shutdown_grace,
                release: true,
            };
            self.publish();
        }
        self.after_done(index, now);
    }

    fn after_done(&mut self, index: u32, now: Instant) {
        let renew = self.renew_deadline();
        let slot = &mut self.slots[index as usize];
        let Some(t) = slot.term.as_mut() else {
            return;
        };
        match t.state {
            State::Leaving { release: true, .. } if now < t.renewal.deadline(renew) => {
                t.state = State::Releasing;
                self.queue.insert((1, now, Key::Shard(index)));
            }
            State::Leaving { release, .. } => {
                if release {
                    debug!(
                        shard = index,
                        "could not release the shard: its renew deadline passed; it will expire"
                    );
                }
                t.state = State::Gone;
                self.finish_term(index);
            }
            State::Gone => self.finish_term(index),
            State::Active | State::Releasing => {}
        }
    }

    /// Ends the term of `index` once it is not ours and its work has stopped: `release()`
    /// returns, and the shard may be taken again.
    fn finish_term(&mut self, index: u32) {
        let slot = &mut self.slots[index as usize];
        let Some(t) = slot.term.as_mut() else {
            return;
        };
        if t.state != State::Gone || !t.done || slot.busy {
            return;
        }
        if let Some(tx) = t.released.take() {
            let _ = tx.send(());
        }
        slot.term = None;
        self.dirty = true;
    }

    // --- balance ---

    /// The live candidates (this one included), sorted; schedules a look when one expires.
    fn live_members(&mut self, now: Instant) -> Vec<String> {
        let fallback = self.cfg.lease.lease_duration;
        let mut live = vec![self.identity.clone()];
        let mut soonest: Option<Instant> = None;
        for obs in self.members.values() {
            let Some(holder) = obs.record.holder.as_ref() else {
                continue;
            };
            let expiry = obs.expires_at(fallback);
            if now < expiry {
                live.push(holder.clone());
                soonest = Some(soonest.map_or(expiry, |s| s.min(expiry)));
            }
        }
        if let Some(t) = soonest {
            self.timers.at(t, Key::Rebalance);
        }
        live.sort();
        live.dedup();
        live
    }

    /// What this candidate would do about shard `index` now, if it wanted it.
    fn decision(&mut self, index: u32, now: Instant) -> Decision {
        let fallback = self.cfg.lease.lease_duration;
        let slot = &mut self.slots[index as usize];
        // A record naming this identity but written by another process is not ours.
        let identity: &str = if slot.foreign_self { "" } else { &self.identity };
        match (&slot.observed, &slot.deleted) {
            (Some(obs), _) => {
                let d = decide(Some(obs), identity, now, fallback);
                match (d, obs.record.holder.as_deref()) {
                    // `decide` with an empty identity takes an empty holder for ours.
                    (Decision::Renew, Some(_)) if identity.is_empty() => {
                        let expiry = obs.expires_at(fallback);
                        if now >= expiry {
                            Decision::Takeover
                        } else {
                            Decision::WaitUntil(expiry)
                        }
                    }
                    (d, _) => d,
                }
            }
            (None, Some(deleted)) => decide_absent(Absent::Deleted(deleted), &self.identity, now, fallback),
            (None, None) if slot.seen => {
                let since = *slot.absent_since.get_or_insert(now);
                decide_absent(Absent::Unknown { since }, &self.identity, now, fallback)
            }
            (None, None) => Decision::Create,
        }
    }

    fn rebalance(&mut self, now: Instant) {
        self.dirty = false;
        if !self.synced || self.stopping || self.fatal.is_some() {
            return;
        }
        let members = self.live_members(now);
        let quota = balance::quota(self.count, &members, &self.identity);
        if (quota, members.len()) != (self.quota, self.live) {
            info!(members = members.len(), quota, "fair share");
            self.quota = quota;
            self.live = members.len();
            self.publish();
        }
        let mut active = Vec::new();
        let mut holding = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            let i = i as u32;
            match &slot.term {
                Some(t) if t.state == State::Active => {
                    active.push(i);
                    holding.push(i);
                }
                None if slot.busy => holding.push(i),
                _ => {}
            }
        }
        let ready = self.acquire_from.is_some_and(|t| now >= t);
        let mut free = Vec::new();
        if holding.len() < quota as usize && ready {
            let mut soonest: Option<Instant> = None;
            for i in 0..self.count {
                let slot = &self.slots[i as usize];
                if slot.term.is_some() || slot.busy {
                    continue;
                }
                if let Some(nb) = slot.not_before.filter(|t| *t > now) {
                    soonest = Some(soonest.map_or(nb, |s| s.min(nb)));
                    continue;
                }
                match self.decision(i, now) {
                    Decision::WaitUntil(t) => soonest = Some(soonest.map_or(t, |s| s.min(t))),
                    _ => free.push(i),
                }
            }
            if let Some(t) = soonest {
                self.timers.at(t, Key::Rebalance);
            }
        }
        let plan = balance::plan(&self.identity, quota, &holding, &free);
        for index in plan.release {
            if !active.contains(&index) {
                continue;
            }
            let until = now + self.cfg.handover_grace;
            if let Some(t) = self.slots[index as usize].term.as_mut() {
                info!(shard = index, "handing the shard over");
                t.keeper.lose(LossReason::Rebalanced);
                t.state = State::Leaving { until, release: true };
                self.timers.at(until, Key::Shard(index));
                if t.done {
                    self.after_done(index, now);
                }
            }
            self.publish();
        }
        if plan.acquire.is_empty() {
            return;
        }
        if let Some(until) = self.throttle.paused_until(now) {
            self.timers.at(until, Key::Rebalance);
            return;
        }
        for index in plan.acquire {
            if self.in_flight >= self.cfg.max_in_flight {
                // Renewals first; the rest when calls come back.
                self.dirty = true;
                break;
            }
            let d = self.decision(index, now);
            if !matches!(d, Decision::WaitUntil(_)) {
                self.acquire(index, d);
            }
        }
    }

    fn publish(&self) {
        let held: BTreeMap<u32, u64> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                s.term
                    .as_ref()
                    .filter(|t| t.state == State::Active)
                    .map(|t| (i as u32, t.fencing_token))
            })
            .collect();
        let set = ShardSet {
            held,
            members: self.live,
            quota: self.quota,
        };
        self.held_tx.send_if_modified(|cur| {
            if *cur == set {
                return false;
            }
            *cur = set;
            true
        });
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Shard(u32),
    Member,
}

/// An [`Op`] with owned names, for calls made on background futures.
#[derive(Debug, Clone)]
struct OwnedOp {
    verb: &'static str,
    namespace: String,
    name: String,
}

impl OwnedOp {
    fn op(&self) -> Op<'_> {
        Op {
            verb: self.verb,
            resource: RESOURCE,
            namespace: &self.namespace,
            name: &self.name,
            hint: RBAC_HINT,
        }
    }
}

/// `Some(Retry-After)` if the failure says the API server is overloaded (429, 5xx).
fn overload(failure: &Failure) -> Option<Option<Duration>> {
    let Failure::Transient(kube::Error::Api(status)) = failure else {
        return None;
    };
    if status.code != 429 && status.code < 500 {
        return None;
    }
    let retry_after = status
        .details
        .as_ref()
        .map(|d| d.retry_after_seconds)
        .filter(|s| *s > 0)
        .map(|s| Duration::from_secs(u64::from(s)));
    Some(retry_after)
}

/// The membership Lease of `identity` in the set `name`: `<name>-member-<identity, made a valid
/// name>-<hash>`, so that two identities never share one and nothing is `<name>-<digits>`.
pub fn member_lease_name(name: &str, identity: &str) -> String {
    let mut clean: String = identity
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .collect();
    clean.truncate(40);
    let clean = clean.trim_matches('-');
    let hash = balance::preference(identity, 0) as u32;
    if clean.is_empty() {
        format!("{name}-member-{hash:08x}")
    } else {
        format!("{name}-member-{clean}-{hash:08x}")
    }
}

/// Whether `a`'s resourceVersion is newer than `b`'s (numerically, as etcd revisions are;
/// unparsable versions count as newer, so the cache follows the watch).
fn newer(a: &Lease, b: &Lease) -> bool {
    let rv = |l: &Lease| {
        l.metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
    };
    match (rv(a), rv(b)) {
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

/// `d` less up to 20%.
fn jittered(d: Duration) -> Duration {
    d.mul_f64(1.0 - 0.2 * rand::random::<f64>())
}

/// The host name, for a default identity.
fn hostname() -> Option<String> {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_lease_names_are_valid_and_never_shard_names() {
        for id in ["pod-a", "Pod_A.example", "", "---", &"x".repeat(300), "ä"] {
            let n = member_lease_name("ctl", id);
            lock::validate_name(&n).unwrap_or_else(|e| panic!("{id:?}: {e}"));
            assert!(n.starts_with("ctl-member-"), "{n}");
        }
        assert_ne!(member_lease_name("ctl", "a_b"), member_lease_name("ctl", "a.b"));
    }

    #[test]
    fn overload_reads_retry_after() {
        let api = |code: u16, retry: u32| {
            Failure::Transient(kube::Error::Api(Box::new(kube::core::Status {
                code,
                details: Some(
                    serde_json::from_value(serde_json::json!({ "retryAfterSeconds": retry })).unwrap(),
                ),
                ..Default::default()
            })))
        };
        assert_eq!(overload(&api(429, 1)), Some(Some(Duration::from_secs(1))));
        assert_eq!(overload(&api(503, 0)), Some(None));
        assert_eq!(overload(&api(409, 0)), None);
        assert_eq!(overload(&Failure::Conflict), None);
    }
}
