//! The engine: the background task of one [`Shards`] candidate.
//!
//! One loop owns all state of the candidate: what is known of every shard Lease ([`Slot`]),
//! the terms it holds ([`Held`](table::Held)), its membership Lease ([`Member`]) and the other candidates'.
//! It wakes up for shutdown, an API answer, the end of the work on a shard, a watch event or a
//! timer, and acts on it in one of its parts:
//! - [`table`]: the lifecycle of a shard's term and of the campaign, the only place either
//!   changes (the other parts tell it events);
//! - [`setup`]: what the candidate is (fixed); [`io`]: the I/O edge (calls, queued writes,
//!   wake-ups, the pause, the channels);
//! - [`watching`]: folding the list/watch into what is known;
//! - [`schedule`]: timers (renewals, deadlines) and the queue of writes;
//! - [`writes`]: the API calls (acquire, renew, release, read, membership);
//! - [`answers`]: what the API server answered; [`acquired`]: a term begins;
//! - [`counts`]: the other candidates' shard counts;
//! - [`handover`]: the end of a term (lost, handed over, given up, released);
//! - [`rebalance`]: the fair share and which shards to take or hand over.

use std::collections::BTreeMap;

use futures::stream::{BoxStream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    api::DeleteParams,
    runtime::{watcher, WatchStreamExt},
    Api,
};
use tokio::{
    sync::{mpsc, watch},
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{
    assignments::ShardSet,
    config::ShardsConfig,
    names::{member_lease_name, SHARDS_LABEL},
    scheduler::{Phases, Throttle},
};
use crate::{
    api::{call, classify_watch, Failure, Op},
    backoff::jittered,
    error::Result,
    leadership::{Leadership, LossReason},
    lease::{decide::Observed, record::new_instance_id},
    lock,
    time::sleep_until_opt,
};

mod acquired;
mod answers;
mod counts;
mod handover;
mod io;
pub(crate) mod rebalance;
mod schedule;
mod setup;
pub(crate) mod table;
mod watching;
mod writes;

use io::{Input, Io};
use setup::Setup;
use table::{Campaign, Machine, MemberPace, State, Tenure};

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
    /// What it is a candidate for (fixed).
    set: Setup,
    /// The I/O edge: calls, queued writes, wake-ups, the pause, the channels.
    io: Io,
    /// What is known and held of every shard; their terms' states are the table's.
    slots: Vec<Slot>,
    member: Member,
    /// Other candidates' membership Leases, by Lease name.
    members: BTreeMap<String, Observed>,
    /// Those of them seen with another shard count (see [`counts`]).
    foreign: BTreeMap<String, counts::Foreign>,
    /// The campaign, the plan's dirty flag, the fatal error, a relist in progress and the
    /// terms' generations: private to [`table`], the only module that writes them.
    machine: Machine,
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
    /// The term held, if any, and the hold-off after a lost race or an error: private to
    /// [`table`], the only module that begins or ends a term.
    tenure: Tenure,
}

#[derive(Default)]
struct Member {
    name: String,
    lease: Option<Lease>,
    /// When it is written next: private to [`table`].
    pace: MemberPace,
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
        out: mpsc::UnboundedSender<(u32, Leadership)>,
        held_tx: watch::Sender<ShardSet>,
    ) -> Self {
        let cfg = s.config;
        let retry = cfg.lease.retry_period;
        let throttle = Throttle::new(retry / 4, cfg.lease.renew_deadline / 2);
        Self {
            io: Io::new(Api::namespaced(s.client, &namespace), throttle, out, held_tx),
            member: Member {
                name: member_lease_name(&s.name, &identity),
                ..Member::default()
            },
            slots: (0..s.count).map(|_| Slot::default()).collect(),
            set: Setup {
                namespace,
                count: s.count,
                name: s.name,
                identity,
                instance: new_instance_id(),
                phases: Phases {
                    epoch: Instant::now(),
                    retry,
                    slots: s.count + 1,
                },
                cfg,
            },
            members: BTreeMap::new(),
            foreign: BTreeMap::new(),
            machine: Machine::default(),
        }
    }

    /// Whether every shard is being handed back.
    fn stopping(&self) -> bool {
        self.machine.campaign() == Campaign::Stopping
    }

    /// Campaigns until shutdown (or an error), then hands every shard back.
    pub(super) async fn run(mut self, shutdown: CancellationToken) -> Result<()> {
        let mut watch = self.watch();
        info!(instance = %self.set.instance, "campaigning for shards");
        loop {
            if (self.failed() || self.io.abandoned()) && !self.stopping() {
                // An error ended the campaign, or nobody takes the shards any more (the
                // `Assignments` were dropped): hand everything back.
                self.stop(Instant::now(), LossReason::Cancelled);
            }
            if self.stopping() && self.finished() {
                break;
            }
            // Deadlines first: after a freeze (SIGSTOP, a paused VM) the renew deadlines that
            // passed meanwhile end their shards before a backlog of watch events is read.
            let now = Instant::now();
            if self.io.next_wake().is_some_and(|t| t <= now) {
                self.fire(now);
                self.settle(now);
            }
            let wake = self.io.next_wake();
            // Not biased: with many shards a renewal's answer is ready on almost every turn,
            // and a biased select that put answers first read the watch only on a turn with
            // none. The API server gives a Lease watcher 10 events of buffer and closes a
            // watch whose reader falls behind: the set's watch was opened again every ~12 s
            // (24 times in 5 minutes with 1,000 shards; issue 21, item 10). Deadlines are
            // handled above, before the select, and shutdown is seen on the next turn at most.
            let stopping = self.stopping();
            tokio::select! {
                () = shutdown.cancelled(), if !stopping => {
                    info!("shutdown: handing every shard back once its work stops");
                    self.stop(Instant::now(), LossReason::Cancelled);
                }
                input = self.io.input() => match input {
                    Input::Reply(reply) => self.on_reply(reply, Instant::now()),
                    Input::Done(index, gen) => self.on_done(index, gen, Instant::now()),
                },
                ev = watch.next() => self.on_watch_item(ev),
                () = sleep_until_opt(wake) => self.fire(Instant::now()),
            }
            self.settle(Instant::now());
        }
        self.leave().await;
        self.outcome()
    }

    /// The one list/watch of every Lease of the set.
    fn watch(&self) -> BoxStream<'static, watcher::Result<watcher::Event<Lease>>> {
        let selector = format!("{SHARDS_LABEL}={}", self.set.name);
        let config = watcher::Config::default()
            .labels(&selector)
            .timeout(WATCH_TIMEOUT_SECS);
        watcher(self.io.api.clone(), config).default_backoff().boxed()
    }

    /// Handles the timers due at `now`.
    fn fire(&mut self, now: Instant) {
        for key in self.io.due(now) {
            self.on_timer(key, now);
        }
    }

    /// Acts on what changed: rebalances if needed, then starts queued writes.
    fn settle(&mut self, now: Instant) {
        if self.replan_wanted() {
            self.rebalance(now);
        }
        self.dispatch(now);
    }

    /// Handles what the watch stream yields.
    fn on_watch_item(&mut self, ev: Option<watcher::Result<watcher::Event<Lease>>>) {
        match ev {
            Some(Ok(ev)) => self.on_watch(ev, Instant::now()),
            Some(Err(e)) => match classify_watch(self.set.op("watch").op(), e) {
                Failure::Fatal(e) => {
                    warn!(error = %e, "cannot watch the shard Leases");
                    self.fail(e);
                }
                e => debug!(error = ?e, "shard watch failed; it is retried with backoff"),
            },
            None => debug!("shard watch ended"),
        }
    }

    /// Whether everything is handed back after a shutdown.
    fn finished(&self) -> bool {
        self.io.in_flight() == 0
            && self
                .slots
                .iter()
                .all(|s| s.tenure.term().is_none_or(|t| t.state() == State::Gone))
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
        let op = self.set.op_on("delete", &name);
        match call(
            op.op(),
            self.set.cfg.call_timeout(),
            self.io.api.delete(&name, &params),
        )
        .await
        {
            Ok(_) => debug!(lease = %name, "membership Lease deleted"),
            Err(e) => debug!(lease = %name, error = ?e, "could not delete the membership Lease; it expires"),
        }
    }

    /// Publishes the shards held now (see [`Assignments::held`](super::Assignments::held)).
    fn publish(&self) {
        self.publish_share(self.io.share());
    }

    /// Publishes the shards held now, this candidate's fair share and the live candidates.
    fn publish_share(&self, (quota, members): (u32, usize)) {
        let held: BTreeMap<u32, u64> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                s.tenure
                    .term()
                    .filter(|t| t.state() == State::Active)
                    .map(|t| (i as u32, t.term.fencing_token()))
            })
            .collect();
        self.io.publish(ShardSet { held, members, quota });
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
