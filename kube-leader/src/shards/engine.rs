//! The engine: the background task of one [`Shards`] candidate.
//!
//! One loop owns all state of the candidate: what is known of every shard Lease ([`Slot`]),
//! the terms it holds ([`Held`]), its membership Lease ([`Member`]) and the other candidates'.
//! It wakes up for shutdown, an API answer, the end of the work on a shard, a watch event or a
//! timer, and acts on it in one of its parts:
//! - [`watching`]: folding the list/watch into what is known;
//! - [`schedule`]: timers (renewals, deadlines) and the queue of writes;
//! - [`writes`]: the API calls (acquire, renew, release, read, membership);
//! - [`answers`]: what the API server answered; [`acquired`]: a term begins;
//! - [`counts`]: the other candidates' shard counts;
//! - [`handover`]: the end of a term (lost, handed over, given up, released);
//! - [`rebalance`]: the fair share and which shards to take or hand over.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use futures::{
    future::BoxFuture,
    stream::{BoxStream, FuturesUnordered},
    StreamExt,
};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    api::DeleteParams,
    runtime::{watcher, WatchStreamExt},
    Api,
};
use tokio::{
    sync::{mpsc, oneshot, watch},
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{
    assignments::{Shard, ShardSet},
    config::ShardsConfig,
    names::{member_lease_name, SHARDS_LABEL},
    scheduler::{Key, Phased, Phases, Renewal, Throttle, Timers},
};
use crate::{
    api::{call, classify_watch, Failure, Op},
    backoff::jittered,
    error::{Error, Result},
    leadership::{KeeperHandle, LossReason},
    lease::{decide::Observed, record::new_instance_id, term::Term},
    lock,
    time::sleep_until_opt,
};

mod acquired;
mod answers;
mod counts;
mod handover;
mod rebalance;
mod schedule;
mod watching;
mod writes;

use answers::Reply;

const RESOURCE: &str = "leases.coordination.k8s.io";
/// The Role shards need: create, list and watch Leases; get and update on the shard Leases
/// `SET-0` .. `SET-<M-1>`; get, update and delete on the membership Leases.
const RBAC_HINT: &str = "the one `kube-leader rbac --shards M --lock SET` prints (create, list and \
     watch leases; get and update on the shard Leases SET-0 .. SET-<M-1>; get, update and delete \
     on the membership Leases SET-member-<identity>-<hash>)";
/// Longest watch call (as for one Lease: kube-runtime needs less than the client's 295 s).
const WATCH_TIMEOUT_SECS: u32 = 290;

/// The background task of one candidate.
pub(super) struct Engine {
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
    /// Those of them seen with another shard count (see [`counts`]).
    foreign: BTreeMap<String, counts::Foreign>,
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
    /// No longer ours (deadline, another holder, deleted): waiting for the work to stop, for
    /// a while only (see [`Held::orphaned_from`]).
    Gone,
}

struct Held {
    gen: u64,
    keeper: KeeperHandle,
    released: Option<oneshot::Sender<()>>,
    state: State,
    /// The work on it has stopped (the `Shard` was dropped).
    done: bool,
    /// When it stopped being ours while its work went on (it became `Gone` undone).
    lost_at: Option<Instant>,
    /// The term's Lease, record, fencing token and renewals, judged by the term machine.
    term: Term<Phased>,
}

// === impl Held ===

impl Held {
    /// When a term that is not ours any more, and whose `Shard` is still kept, stops keeping
    /// the shard from being taken again: `grace` after its loss was told (the time its work
    /// has to stop), if it is such a term. From then on it guards nothing: the shard is waited
    /// out like any other holder's and taken again as a new term, whose `hold` drops this one.
    fn orphaned_from(&self, grace: Duration) -> Option<Instant> {
        if self.state != State::Gone || self.done {
            return None;
        }
        self.lost_at.map(|t| t + grace)
    }
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

/// What the engine is a candidate for: the set's client, name, shard count and settings
/// (from [`Shards`](super::Shards), which starts it).
pub(super) struct Spec {
    pub(super) client: kube::Client,
    pub(super) name: String,
    pub(super) count: u32,
    pub(super) config: ShardsConfig,
}

// === impl Engine ===

impl Engine {
    /// The engine of candidate `s`, before its first list.
    pub(super) fn new(
        s: Spec,
        namespace: String,
        identity: String,
        out: mpsc::UnboundedSender<Shard>,
        held_tx: watch::Sender<ShardSet>,
    ) -> Self {
        let cfg = s.config.clone();
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let retry = cfg.lease.retry_period;
        Self {
            api: Api::namespaced(s.client, &namespace),
            namespace,
            count: s.count,
            member: Member {
                name: member_lease_name(&s.name, &identity),
                ..Member::default()
            },
            name: s.name,
            identity,
            instance: new_instance_id(),
            phases: Phases {
                epoch: Instant::now(),
                retry,
                slots: s.count + 1,
            },
            slots: (0..s.count).map(|_| Slot::default()).collect(),
            members: BTreeMap::new(),
            foreign: BTreeMap::new(),
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

    /// The description of a call with `verb` on the set, for errors and logs.
    fn op(&self, verb: &'static str) -> OwnedOp {
        OwnedOp {
            verb,
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }

    /// The renew deadline of every Lease of the set.
    fn renew_deadline(&self) -> Duration {
        self.cfg.lease.renew_deadline
    }

    /// How long the work on a lost shard has to stop once its loss is told: the lease
    /// duration minus the renew deadline, as for any Lease leader.
    fn stop_grace(&self) -> Duration {
        self.cfg
            .lease
            .lease_duration
            .saturating_sub(self.cfg.lease.renew_deadline)
    }

    /// Campaigns until shutdown (or an error), then hands every shard back.
    pub(super) async fn run(mut self, shutdown: CancellationToken) -> Result<()> {
        let mut watch = self.watch();
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
                self.fire(now);
                self.settle(now);
            }
            let wake = self.timers.next();
            // Not biased: with many shards a renewal's answer is ready on almost every turn,
            // and a biased select that put answers first read the watch only on a turn with
            // none. The API server gives a Lease watcher 10 events of buffer and closes a
            // watch whose reader falls behind: the set's watch was opened again every ~12 s
            // (24 times in 5 minutes with 1,000 shards; issue 21, item 10). Deadlines are
            // handled above, before the select, and shutdown is seen on the next turn at most.
            tokio::select! {
                () = shutdown.cancelled(), if !self.stopping => {
                    info!("shutdown: handing every shard back once its work stops");
                    self.stop(Instant::now(), LossReason::Cancelled);
                }
                Some(reply) = self.calls.next(), if !self.calls.is_empty() => {
                    self.in_flight = self.in_flight.saturating_sub(1);
                    self.on_reply(reply, Instant::now());
                }
                Some((index, gen)) = self.done_rx.recv() => self.on_done(index, gen, Instant::now()),
                ev = watch.next() => self.on_watch_item(ev),
                () = sleep_until_opt(wake) => self.fire(Instant::now()),
            }
            self.settle(Instant::now());
        }
        self.leave().await;
        match self.fatal.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The one list/watch of every Lease of the set.
    fn watch(&self) -> BoxStream<'static, watcher::Result<watcher::Event<Lease>>> {
        let selector = format!("{SHARDS_LABEL}={}", self.name);
        let config = watcher::Config::default()
            .labels(&selector)
            .timeout(WATCH_TIMEOUT_SECS);
        watcher(self.api.clone(), config).default_backoff().boxed()
    }

    /// Handles the timers due at `now`.
    fn fire(&mut self, now: Instant) {
        for key in self.timers.due(now) {
            self.on_timer(key, now);
        }
    }

    /// Acts on what changed: rebalances if needed, then starts queued writes.
    fn settle(&mut self, now: Instant) {
        if self.dirty {
            self.rebalance(now);
        }
        self.dispatch(now);
    }

    /// Handles what the watch stream yields.
    fn on_watch_item(&mut self, ev: Option<watcher::Result<watcher::Event<Lease>>>) {
        match ev {
            Some(Ok(ev)) => self.on_watch(ev, Instant::now()),
            Some(Err(e)) => match classify_watch(self.op("watch").op(), e) {
                Failure::Fatal(e) => {
                    warn!(error = %e, "cannot watch the shard Leases");
                    self.fatal.get_or_insert(e);
                }
                e => debug!(error = ?e, "shard watch failed; it is retried with backoff"),
            },
            None => debug!("shard watch ended"),
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

    /// Publishes the shards held now (see [`Assignments::held`](super::Assignments::held)).
    fn publish(&self) {
        let held: BTreeMap<u32, u64> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                s.term
                    .as_ref()
                    .filter(|t| t.state == State::Active)
                    .map(|t| (i as u32, t.term.fencing_token()))
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

/// Whether `a`'s resourceVersion is newer than `b`'s ([`lock::is_newer`]).
fn newer(a: &Lease, b: &Lease) -> bool {
    let rv = |l: &Lease| l.metadata.resource_version.clone();
    lock::is_newer(rv(a).as_deref(), rv(b).as_deref())
}
