//! The leader-for-life elector: wait for the lock, take it, keep watching it, release it.

use std::{
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, SystemTime},
};

use k8s_openapi::{
    api::core::v1::{ConfigMap, Event, EventSource, Node, ObjectReference, Pod},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::Timestamp,
};
use kube::{
    api::{DeleteParams, PostParams, Preconditions},
    Api, Client,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, info_span, warn, Instrument};

use super::{
    config::{DeadLeaderPod, Environment, ForLifeConfig, OutsideCluster, INITIAL_BACKOFF},
    decide::{decide, Decision, Inputs, Policy, Stale, Waiting},
    record::{
        lock_config_map, parse_resource_version, with_fencing_token, LeaderPod, LockRecord, PodRef, PodView,
    },
};
use crate::{
    api::{call, Failure, Op},
    backoff::Backoff,
    error::{Error, Result},
    leadership::{Keeper, Leadership, LossReason, Strategy, Term},
    lock::{self, LockRef, NamespaceSource},
    object_watch::ObjectWatch,
};

/// Where to find a Role that grants what leader for life needs.
pub(crate) const RBAC_HINT: &str = "deploy/rbac-for-life.yaml";
/// Where to find the ClusterRole that the opt-in NotReady takeover needs.
const NODES_HINT: &str = "the optional ClusterRole in deploy/rbac-for-life.yaml";

/// How often a leader's keeper checks, without any request, whether its process was frozen.
const FREEZE_CHECK: Duration = Duration::from_millis(250);
/// A check this late means the process was stopped (SIGSTOP, a VM pause): the lock is read at
/// once rather than waiting for a watch that may be reconnecting with backoff.
const FREEZE_SLACK: Duration = Duration::from_millis(750);

/// A candidate for leader for life: operator-sdk's `leader.Become`, watch-driven.
///
/// The leader is the Pod that created the lock, a ConfigMap whose single owner reference is
/// that Pod. It leads until the lock goes: normally when its Pod is deleted and Kubernetes'
/// garbage collector deletes the lock with it. Waiting candidates watch the lock and the
/// leader's Pod, and take over as soon as the lock is deleted, or delete it themselves (with a
/// UID precondition) once the leader Pod is gone or has terminated.
///
/// ```no_run
/// # async fn run(client: kube::Client) -> kube_leader::Result<()> {
/// use kube_leader::ForLife;
/// use tokio_util::sync::CancellationToken;
///
/// let shutdown = CancellationToken::new();
/// let leadership = ForLife::new(client, "my-operator-lock").become_leader(&shutdown).await?;
/// // ... work until leadership.lost_token() is cancelled.
/// # Ok(()) }
/// ```
///
/// The namespace is, in order: [`namespace`](Self::namespace), `POD_NAMESPACE`, the in-cluster
/// service-account namespace file. Without any, the process is taken to run outside a cluster
/// (see [`OutsideCluster`]). The identity is this candidate's Pod, named by
/// [`pod_name`](Self::pod_name) or `POD_NAME` (set it with the Downward API), and recognised by
/// its UID: a Pod recreated under the same name is another candidate.
///
/// # One process per Pod
/// A process that finds the lock owned by its own Pod (same name and UID) continues as the
/// leader: that is how a restarted container keeps leading, as with operator-sdk. It follows
/// that two live processes in one Pod (two containers running candidates for the same lock, or
/// a second process started beside the first) cannot be told apart from a restart by the lock
/// alone, and both lead. Run one candidate per Pod and lock. (The Lease strategy detects its
/// equivalent, two processes with one identity: see
/// [`LossReason::DuplicateIdentity`](crate::LossReason::DuplicateIdentity).)
///
/// Needs, in the lock's namespace: `create` on ConfigMaps, `get, list, watch, update, delete`
/// on the lock ConfigMap (by name),
/// `get, list, watch, delete` on Pods and `create` on Events; see `deploy/rbac-for-life.yaml`.
#[derive(Clone)]
pub struct ForLife {
    client: Client,
    name: String,
    config: ForLifeConfig,
    /// Set once reading Nodes was refused: the NotReady takeover is off from then on.
    node_check_disabled: Arc<AtomicBool>,
}

impl std::fmt::Debug for ForLife {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForLife")
            .field("name", &self.name)
            .field("config", &self.config)
            .field(
                "node_check_disabled",
                &self.node_check_disabled.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

// === impl ForLife ===

impl ForLife {
    /// A candidate for the lock ConfigMap `name`, with the seed's defaults
    /// ([`ForLifeConfig::default`]). The name is checked when campaigning.
    #[must_use]
    pub fn new(client: Client, name: impl Into<String>) -> Self {
        Self {
            client,
            name: name.into(),
            config: ForLifeConfig::default(),
            node_check_disabled: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Sets all options at once.
    #[must_use]
    pub fn config(mut self, config: ForLifeConfig) -> Self {
        self.config = config;
        self
    }

    /// Sets the namespace of the lock and of this candidate's Pod.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.config.namespace = Some(namespace.into());
        self
    }

    /// Sets this candidate's Pod name (instead of `POD_NAME`).
    #[must_use]
    pub fn pod_name(mut self, pod_name: impl Into<String>) -> Self {
        self.config.pod_name = Some(pod_name.into());
        self
    }

    /// Sets the cap of the fallback backoff (see [`ForLifeConfig::backoff_cap`]).
    #[must_use]
    pub fn backoff_cap(mut self, cap: Duration) -> Self {
        self.config.backoff_cap = cap;
        self
    }

    /// Sets what to do outside a cluster (see [`OutsideCluster`]).
    #[must_use]
    pub fn outside_cluster(mut self, outside_cluster: OutsideCluster) -> Self {
        self.config.outside_cluster = outside_cluster;
        self
    }

    /// Sets what to do with a dead leader's Pod (see [`DeadLeaderPod`]).
    #[must_use]
    pub fn dead_leader_pod(mut self, policy: DeadLeaderPod) -> Self {
        self.config.dead_leader_pod = policy;
        self
    }

    /// Opts in to taking over from a leader whose Node has not been `Ready` for `grace`; read
    /// the risk in [`ForLifeConfig::not_ready_takeover`] first. `None` (the default) never does.
    #[must_use]
    pub fn not_ready_takeover(mut self, grace: Option<Duration>) -> Self {
        self.config.not_ready_takeover = grace;
        self
    }

    /// Sets the bound on each API call (see [`ForLifeConfig::api_timeout`]).
    #[must_use]
    pub fn api_timeout(mut self, timeout: Duration) -> Self {
        self.config.api_timeout = timeout;
        self
    }

    /// Sets where the namespace and Pod name come from when not set (see [`Environment`]).
    #[must_use]
    pub fn environment(mut self, environment: Environment) -> Self {
        self.config.environment = Some(environment);
        self
    }

    /// The options in force.
    pub fn for_life_config(&self) -> &ForLifeConfig {
        &self.config
    }

    /// Waits until this candidate leads, then returns its [`Leadership`].
    ///
    /// Returns at once if the lock is already this Pod's (same UID: the process restarted).
    /// Otherwise waits, watching the lock and its holder's Pod, and creates the lock the moment
    /// it is gone. A lock whose holder Pod is gone, was replaced, or is in phase `Failed` or
    /// `Succeeded` is deleted first (with a UID precondition); a lock that does not have exactly
    /// one Pod owner is waited for and never taken. Transient API errors are retried with the
    /// backoff; permission errors are returned.
    ///
    /// Once leading, a background task watches the lock, and ends leadership (cancelling
    /// [`Leadership::lost_token`]) the moment the lock is deleted or replaced. Dropping the
    /// handle stops that watch and leaves the lock in place, to be deleted with this Pod (the
    /// seed's semantics); [`Leadership::release`] deletes the lock (explicit step-down).
    ///
    /// `cancel` is the shutdown signal: cancelled while waiting, this returns
    /// [`Error::Cancelled`] at once; cancelled while leading, leadership ends with
    /// [`LossReason::Cancelled`] and the lock stays until the Pod is deleted or the handle is
    /// released.
    ///
    /// Outside a cluster (no namespace found) this skips the election by default, as the seed
    /// does: see [`OutsideCluster`].
    ///
    /// # Cancellation safety
    /// Cancel-safe while waiting: dropping the future (or cancelling `cancel`) leaves nothing
    /// behind. If the lock was created just before, it stays, owned by this Pod: the next call
    /// from this Pod finds it and continues as leader, and it goes with the Pod otherwise.
    pub async fn become_leader(&self, cancel: &CancellationToken) -> Result<Leadership> {
        self.config.validate()?;
        lock::validate_name(&self.name)?;
        let env = self
            .config
            .environment
            .clone()
            .unwrap_or_else(Environment::from_process);
        let pod_name = self
            .config
            .pod_name
            .clone()
            .or_else(|| env.pod_name.clone())
            .map(|n| n.trim().to_string());
        let Some((namespace, source)) = discover_namespace(self.config.namespace.as_deref(), &env) else {
            return self.skip_or_fail(&env, pod_name);
        };
        let pod_name = pod_name.filter(|n| !n.is_empty()).ok_or(Error::NoPodName)?;
        let lock = LockRef::new(namespace, self.name.clone())?;
        let span = info_span!("leader_for_life", lock = %lock, pod = %pod_name);
        let campaign = self
            .campaign(lock.clone(), pod_name, source, cancel.clone())
            .instrument(span);
        tokio::select! {
            biased;
            () = cancel.cancelled() => {
                info!(lock = %lock, "cancelled while waiting for leadership");
                Err(Error::Cancelled { lock: lock.to_string() })
            }
            r = campaign => r,
        }
    }

    fn skip_or_fail(&self, env: &Environment, pod_name: Option<String>) -> Result<Leadership> {
        let path = env
            .service_account_namespace_file
            .as_ref()
            .map_or_else(|| "(none)".to_string(), |p| p.display().to_string());
        match self.config.outside_cluster {
            OutsideCluster::Fail => Err(Error::NoNamespace { path }),
            OutsideCluster::Skip => {
                info!(lock = %self.name, service_account_namespace_file = %path,
                    "skipping leader election; not running in a cluster (no namespace: set one, or POD_NAMESPACE)");
                let term = Term {
                    identity: pod_name.unwrap_or_default(),
                    lock: LockRef {
                        namespace: self.client.default_namespace().to_string(),
                        name: self.name.clone(),
                    },
                    strategy: Strategy::ForLife,
                    fencing_token: 0,
                    acquired_at: SystemTime::now(),
                };
                Ok(Leadership::skipped(term))
            }
        }
    }

    async fn campaign(
        &self,
        lock: LockRef,
        pod_name: String,
        source: NamespaceSource,
        cancel: CancellationToken,
    ) -> Result<Leadership> {
        info!(namespace_from = ?source, "trying to become the leader");
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &lock.namespace);
        let me = own_pod(&pods, &lock, &pod_name, &self.config).await?;
        debug!(uid = %me.uid, "found this candidate's Pod");
        let mut election = Election::new(self, lock, me, pods);
        let won = election.run().await?;
        Ok(self.lead(election.lock, election.me, won, cancel))
    }

    /// Builds the handle and starts the background task that keeps watching the lock.
    fn lead(&self, lock: LockRef, me: PodRef, won: Won, cancel: CancellationToken) -> Leadership {
        let lock_uid = won.lock.metadata.uid.clone().unwrap_or_default();
        info!(fencing_token = won.fencing_token, restarted = won.restarted, lock_uid = %lock_uid, "became the leader");
        let term = Term {
            identity: me.name.clone(),
            lock: lock.clone(),
            strategy: Strategy::ForLife,
            fencing_token: won.fencing_token,
            acquired_at: won.acquired_at,
        };
        let (leadership, keeper, done) = Leadership::new(term);
        let configmaps: Api<ConfigMap> = Api::namespaced(self.client.clone(), &lock.namespace);
        if !won.token_stored {
            let store = store_fencing_token(
                configmaps.clone(),
                lock.clone(),
                me.clone(),
                won.lock.clone(),
                won.fencing_token,
                self.config.api_timeout,
                self.config.backoff_cap,
            );
            let done = done.clone();
            tokio::spawn(
                async move {
                    tokio::select! {
                        () = done.cancelled() => {}
                        () = store => {}
                    }
                }
                .instrument(tracing::Span::current()),
            );
        }
        tokio::spawn(
            record_event(
                self.client.clone(),
                lock.clone(),
                won.lock,
                me.clone(),
                won.fencing_token,
                won.restarted,
                self.config.api_timeout,
            )
            .instrument(tracing::Span::current()),
        );
        let span = info_span!("leader_for_life_keeper", lock = %lock, pod = %me.name);
        let holder = Holder {
            configmaps,
            pods: Api::namespaced(self.client.clone(), &lock.namespace),
            lock,
            lock_uid,
            me,
            api_timeout: self.config.api_timeout,
            backoff_cap: self.config.backoff_cap,
        };
        leadership.with_task(tokio::spawn(holder.keep(keeper, done, cancel).instrument(span)))
    }
}

/// The namespace, from the explicit option, `POD_NAMESPACE` or the service-account file.
fn discover_namespace(explicit: Option<&str>, env: &Environment) -> Option<(String, NamespaceSource)> {
    // A missing file reads as "not in a cluster", as does no file at all.
    let file = env
        .service_account_namespace_file
        .as_deref()
        .unwrap_or(Path::new(""));
    lock::discover_namespace_from(explicit, env.pod_namespace.as_deref(), file)
}

/// Reads this candidate's Pod (the seed's `myOwnerRef`), retrying transient errors.
async fn own_pod(pods: &Api<Pod>, lock: &LockRef, name: &str, config: &ForLifeConfig) -> Result<PodRef> {
    let op = pod_op(&lock.namespace, name, "get");
    let not_found = || Error::OwnPodNotFound {
        namespace: lock.namespace.clone(),
        name: name.to_string(),
    };
    let mut backoff = Backoff::new(INITIAL_BACKOFF, config.backoff_cap);
    loop {
        match call(op, config.api_timeout, pods.get_opt(name)).await {
            Ok(Some(pod)) => {
                let uid = pod.metadata.uid.filter(|u| !u.is_empty()).ok_or_else(not_found)?;
                return Ok(PodRef {
                    name: name.to_string(),
                    uid,
                });
            }
            Ok(None) | Err(Failure::NotFound) => return Err(not_found()),
            Err(Failure::Fatal(e)) => return Err(e),
            Err(e @ (Failure::Conflict | Failure::Transient(_))) => {
                let delay = backoff.next_delay();
                debug!(error = ?e, ?delay, "reading this candidate's Pod failed; retrying");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// What winning yields: the lock as written, and the term's facts.
#[derive(Debug)]
struct Won {
    lock: ConfigMap,
    fencing_token: u64,
    acquired_at: SystemTime,
    /// Found this Pod's own lock (a restart) rather than creating one.
    restarted: bool,
    /// The lock carries the fencing token already.
    token_stored: bool,
}

/// The leader Pod as watched by a waiting candidate.
struct LeaderPodWatch {
    name: String,
    watch: ObjectWatch<Pod>,
    state: LeaderPod,
    failing: bool,
}

/// The opt-in NotReady check of the leader Pod's Node.
#[derive(Debug)]
struct NodeCheck {
    node: String,
    not_ready_since: Option<Instant>,
    next_check: Instant,
}

/// Whether a fresh read of the leader Pod confirms what a decision was made on.
enum Confirmed {
    Yes,
    Changed,
    Unknown,
}

/// What woke a waiting candidate.
enum Wake {
    Lock(Result<Option<Box<ConfigMap>>, Failure>),
    Pod(Result<Option<PodView>, Failure>),
    Timer,
}

/// One campaign: the state of a waiting candidate.
struct Election<'a> {
    elector: &'a ForLife,
    lock: LockRef,
    me: PodRef,
    configmaps: Api<ConfigMap>,
    pods: Api<Pod>,
    backoff: Backoff,
    lock_watch: ObjectWatch<ConfigMap>,
    /// The lock as last observed: `None` until first observed, `Some(None)` when absent.
    lock_state: Option<Option<ConfigMap>>,
    lock_watch_failing: bool,
    leader_pod: Option<LeaderPodWatch>,
    node: Option<NodeCheck>,
    /// When to re-read the lock (and leader Pod) with GET instead of waiting for the watches:
    /// the fallback after an action, a transient error, or while a watch fails.
    retry_at: Option<Instant>,
    /// The last reason for waiting that was logged.
    last_wait: Option<Waiting>,
}

// === impl Election ===

impl<'a> Election<'a> {
    fn new(elector: &'a ForLife, lock: LockRef, me: PodRef, pods: Api<Pod>) -> Self {
        let configmaps: Api<ConfigMap> = Api::namespaced(elector.client.clone(), &lock.namespace);
        let lock_watch = ObjectWatch::new(configmaps.clone(), &lock.name, cm_op(&lock, "watch"));
        Self {
            elector,
            backoff: Backoff::new(INITIAL_BACKOFF, elector.config.backoff_cap),
            lock,
            me,
            configmaps,
            pods,
            lock_watch,
            lock_state: None,
            lock_watch_failing: false,
            leader_pod: None,
            node: None,
            retry_at: None,
            last_wait: None,
        }
    }

    fn config(&self) -> &ForLifeConfig {
        &self.elector.config
    }

    fn policy(&self) -> Policy {
        let node_check = !self.elector.node_check_disabled.load(Ordering::Relaxed);
        Policy {
            dead_leader_pod: self.config().dead_leader_pod,
            not_ready_takeover: self.config().not_ready_takeover.filter(|_| node_check),
        }
    }

    /// Decides and acts until this candidate leads.
    async fn run(&mut self) -> Result<Won> {
        loop {
            let mut recheck_at = None;
            if let Some(state) = self.lock_state.clone() {
                let record = state.as_ref().map(LockRecord::from_config_map);
                self.track_leader_pod(record.as_ref());
                self.track_node();
                let unknown = LeaderPod::Unknown;
                let decision = decide(Inputs {
                    lock: record.as_ref(),
                    leader_pod: self.leader_pod.as_ref().map_or(&unknown, |p| &p.state),
                    node_not_ready_since: self.node.as_ref().and_then(|n| n.not_ready_since),
                    me: &self.me,
                    now: Instant::now(),
                    policy: self.policy(),
                });
                match decision {
                    Decision::Create => {
                        self.last_wait = None;
                        if let Some(won) = self.create().await? {
                            return Ok(won);
                        }
                    }
                    Decision::Continue => return Ok(self.continue_as_leader(state.unwrap_or_default())),
                    Decision::DeleteLock {
                        lock_uid,
                        why,
                        delete_pod,
                    } => {
                        self.last_wait = None;
                        match self.confirm_leader_pod().await? {
                            // The Pod is as decided on: the lock is stale.
                            Confirmed::Yes => {
                                if self.delete_stale(&lock_uid, &why, delete_pod).await? {
                                    continue;
                                }
                            }
                            // The Pod changed: decide again on what it is now.
                            Confirmed::Changed => continue,
                            // Cannot tell now: wait, re-reading with the backoff.
                            Confirmed::Unknown => {}
                        }
                    }
                    Decision::Wait { why, recheck_at: at } => {
                        if matches!(why, Waiting::Malformed(_)) {
                            // Re-read with the backoff, as the seed did, in case an edit that
                            // fixes the lock is missed; the watch usually brings it first.
                            self.arm_retry();
                        }
                        self.log_wait(why);
                        recheck_at = at;
                    }
                }
            }
            self.wait(recheck_at).await?;
        }
    }

    /// Watches the Pod named by the lock's owner (if it is not this candidate), and only it.
    fn track_leader_pod(&mut self, record: Option<&LockRecord>) {
        let wanted = record
            .and_then(|r| r.owner.as_ref().ok())
            .filter(|o| o.name != self.me.name)
            .map(|o| o.name.clone());
        match wanted {
            Some(name) if self.leader_pod.as_ref().is_some_and(|p| p.name == name) => {}
            Some(name) => {
                debug!(holder = %name, "watching the leader Pod");
                let op = pod_op(&self.lock.namespace, &name, "watch");
                let watch = ObjectWatch::new(self.pods.clone(), &name, op);
                self.leader_pod = Some(LeaderPodWatch {
                    name,
                    watch,
                    state: LeaderPod::Unknown,
                    failing: false,
                });
                self.node = None;
            }
            None => {
                self.leader_pod = None;
                self.node = None;
            }
        }
    }

    /// Starts, keeps or stops the opt-in check of the leader Pod's Node.
    fn track_node(&mut self) {
        let node = match (
            self.policy().not_ready_takeover,
            self.leader_pod.as_ref().map(|p| &p.state),
        ) {
            (Some(_), Some(LeaderPod::Present(pod))) if !pod.is_terminal() => pod.node_name.clone(),
            _ => None,
        };
        match node {
            Some(node) if self.node.as_ref().is_some_and(|n| n.node == node) => {}
            Some(node) => {
                self.node = Some(NodeCheck {
                    node,
                    not_ready_since: None,
                    next_check: Instant::now(),
                })
            }
            None => self.node = None,
        }
    }

    /// Logs why this candidate waits, once per reason.
    fn log_wait(&mut self, why: Waiting) {
        if self.last_wait.as_ref() == Some(&why) {
            return;
        }
        match &why {
            Waiting::Malformed(m) => {
                warn!(reason = %m, "the lock is not a leader-for-life lock; waiting, never taking it over")
            }
            Waiting::LeaderPodUnknown { .. } => debug!(reason = %why, "not the leader; waiting"),
            _ => info!(reason = %why, "not the leader; waiting"),
        }
        self.last_wait = Some(why);
    }

    /// Arms the fallback re-read, if not armed.
    fn arm_retry(&mut self) {
        if self.retry_at.is_none() {
            self.retry_at = Some(Instant::now() + self.backoff.next_delay());
        }
    }

    /// Waits for a watch event or a timer, and takes in what it brings.
    async fn wait(&mut self, recheck_at: Option<Instant>) -> Result<()> {
        let node_at = self.node.as_ref().map(|n| n.next_check);
        let wake_at = [self.retry_at, recheck_at, node_at].into_iter().flatten().min();
        let wake = {
            let lock_watch = &mut self.lock_watch;
            let pod_watch = self.leader_pod.as_mut().map(|p| &mut p.watch);
            tokio::select! {
                biased;
                r = lock_watch.changed() => Wake::Lock(r.map(|o| o.cloned().map(Box::new))),
                r = changed_or_pending(pod_watch) => Wake::Pod(r),
                () = sleep_until_opt(wake_at) => Wake::Timer,
            }
        };
        match wake {
            Wake::Lock(Ok(state)) => {
                self.lock_state = Some(state.map(|b| *b));
                self.lock_watch_failing = false;
                self.watch_progressed();
            }
            Wake::Lock(Err(Failure::Fatal(e))) => return Err(e),
            Wake::Lock(Err(e)) => {
                debug!(error = ?e, "the lock watch failed; re-reading with backoff until it recovers");
                self.lock_watch_failing = true;
                self.arm_retry();
            }
            Wake::Pod(r) => {
                let Some(p) = self.leader_pod.as_mut() else {
                    return Ok(());
                };
                match r {
                    Ok(pod) => {
                        p.state = pod.map_or(LeaderPod::Absent, LeaderPod::Present);
                        p.failing = false;
                        self.watch_progressed();
                    }
                    Err(Failure::Fatal(e)) => return Err(e),
                    Err(e) => {
                        debug!(error = ?e, holder = %p.name,
                            "the leader Pod watch failed; re-reading with backoff until it recovers");
                        p.failing = true;
                        self.arm_retry();
                    }
                }
            }
            Wake::Timer => self.on_timer().await?,
        }
        Ok(())
    }

    /// A watch delivered: the fallback is not needed unless another watch still fails.
    fn watch_progressed(&mut self) {
        if !self.lock_watch_failing && !self.leader_pod.as_ref().is_some_and(|p| p.failing) {
            self.retry_at = None;
            self.backoff.reset();
        }
    }

    async fn on_timer(&mut self) -> Result<()> {
        let now = Instant::now();
        if self.retry_at.is_some_and(|t| t <= now) {
            self.retry_at = None;
            self.reread().await?;
            if self.lock_watch_failing || self.leader_pod.as_ref().is_some_and(|p| p.failing) {
                self.arm_retry();
            }
        }
        if self.node.as_ref().is_some_and(|n| n.next_check <= now) {
            self.check_node().await;
        }
        Ok(())
    }

    /// The fallback: reads the lock and the leader Pod with GET.
    async fn reread(&mut self) -> Result<()> {
        let timeout = self.config().api_timeout;
        match call(
            cm_op(&self.lock, "get"),
            timeout,
            self.configmaps.get_opt(&self.lock.name),
        )
        .await
        {
            Ok(state) => self.lock_state = Some(state),
            Err(Failure::Fatal(e)) => return Err(e),
            Err(e) => {
                debug!(error = ?e, "re-reading the lock failed");
                self.arm_retry();
            }
        }
        if let Some(p) = self.leader_pod.as_mut() {
            let op = pod_op(&self.lock.namespace, &p.name, "get");
            match call(op, timeout, self.pods.get_opt(&p.name)).await {
                Ok(pod) => {
                    p.state = pod.as_ref().map_or(LeaderPod::Absent, |pod| {
                        LeaderPod::Present(PodView::from_pod(pod))
                    });
                }
                Err(Failure::Fatal(e)) => return Err(e),
                Err(e) => debug!(error = ?e, holder = %p.name, "re-reading the leader Pod failed"),
            }
        }
        Ok(())
    }

    /// The opt-in policy: reads the leader Pod's Node and tracks since when it is not `Ready`.
    async fn check_node(&mut self) {
        let Some(check) = self.node.as_mut() else { return };
        let grace = self.elector.config.not_ready_takeover.unwrap_or_default();
        let now = Instant::now();
        check.next_check = now + (grace / 4).clamp(Duration::from_millis(200), Duration::from_secs(10));
        let nodes: Api<Node> = Api::all(self.elector.client.clone());
        let op = Op {
            verb: "get",
            resource: "nodes",
            namespace: "<cluster>",
            name: &check.node,
            hint: NODES_HINT,
        };
        let ready = match call(op, self.elector.config.api_timeout, nodes.get_opt(&check.node)).await {
            Ok(Some(node)) => is_ready(&node),
            // The Node object is gone: nothing runs there any more that the control plane knows.
            Ok(None) | Err(Failure::NotFound) => false,
            Err(Failure::Fatal(e)) => {
                if !self.elector.node_check_disabled.swap(true, Ordering::Relaxed) {
                    warn!(error = %e, "cannot read Nodes: the opt-in NotReady takeover is disabled for this elector");
                }
                self.node = None;
                return;
            }
            Err(e) => {
                debug!(error = ?e, node = %check.node, "reading the leader's Node failed");
                return;
            }
        };
        match (ready, check.not_ready_since) {
            (true, Some(_)) => {
                info!(node = %check.node, "the leader's Node is Ready again");
                check.not_ready_since = None;
            }
            (false, None) => {
                info!(node = %check.node, ?grace,
                    "the leader's Node is not Ready; taking over if it stays so for the grace");
                check.not_ready_since = Some(now);
            }
            _ => {}
        }
    }

    /// Tries to create the lock. `None`: not (yet) the leader.
    async fn create(&mut self) -> Result<Option<Won>> {
        let acquired_at = Timestamp::now();
        let cm = lock_config_map(&self.lock, &self.me, acquired_at);
        let timeout = self.config().api_timeout;
        let params = PostParams::default();
        let created = call(
            cm_op(&self.lock, "create"),
            timeout,
            self.configmaps.create(&params, &cm),
        );
        match created.await {
            Ok(created) => {
                let fencing_token = fencing_token_of(&created);
                Ok(Some(Won {
                    lock: created,
                    fencing_token,
                    acquired_at: acquired_at.into(),
                    restarted: false,
                    token_stored: false,
                }))
            }
            Err(Failure::Conflict) => {
                debug!("the lock exists already");
                self.arm_retry();
                Ok(None)
            }
            Err(Failure::NotFound) => Err(Error::Rejected {
                verb: "create".into(),
                resource: "configmaps".into(),
                namespace: self.lock.namespace.clone(),
                name: self.lock.name.clone(),
                message: format!("namespace {} not found", self.lock.namespace),
            }),
            Err(Failure::Transient(e)) => {
                debug!(error = %e, "creating the lock failed; retrying");
                self.arm_retry();
                Ok(None)
            }
            Err(Failure::Fatal(e)) => Err(e),
        }
    }

    /// The lock is this Pod's own: continue as leader (with the lock's current
    /// `resourceVersion` as the fencing token if it has none yet).
    fn continue_as_leader(&mut self, lock: ConfigMap) -> Won {
        let record = LockRecord::from_config_map(&lock);
        info!(lock_uid = %record.uid,
            "found a lock held by this Pod (same UID), likely restarted; continuing as the leader");
        Won {
            fencing_token: record.fencing_token.unwrap_or_else(|| fencing_token_of(&lock)),
            token_stored: record.fencing_token.is_some(),
            acquired_at: record.acquired_at.unwrap_or_else(SystemTime::now),
            lock,
            restarted: true,
        }
    }

    /// Reads the leader Pod afresh right before a stale-lock deletion: the watched state can be
    /// old (a Pod watch that fails keeps the last state it saw, e.g. across an API server
    /// restart), and a Pod re-created under the same name may lead with a new lock meanwhile,
    /// which a stale view would take for "replaced".
    async fn confirm_leader_pod(&mut self) -> Result<Confirmed> {
        let timeout = self.config().api_timeout;
        let Some(p) = self.leader_pod.as_mut() else {
            // No other Pod to confirm (the lock is this Pod's own earlier one, or has no
            // owner): the lock's UID precondition guards the deletion.
            return Ok(Confirmed::Yes);
        };
        let op = pod_op(&self.lock.namespace, &p.name, "get");
        match call(op, timeout, self.pods.get_opt(&p.name)).await {
            Ok(pod) => {
                let fresh = pod.as_ref().map_or(LeaderPod::Absent, |pod| {
                    LeaderPod::Present(PodView::from_pod(pod))
                });
                if fresh == p.state {
                    Ok(Confirmed::Yes)
                } else {
                    debug!(holder = %p.name, "the leader Pod changed since it was last seen; deciding again");
                    p.state = fresh;
                    Ok(Confirmed::Changed)
                }
            }
            Err(Failure::Fatal(e)) => Err(e),
            Err(e) => {
                debug!(error = ?e, holder = %p.name, "cannot read the leader Pod to confirm the lock is stale; waiting");
                self.arm_retry();
                Ok(Confirmed::Unknown)
            }
        }
    }

    /// Deletes a stale lock (UID precondition) and, by policy, the dead leader's Pod (in the
    /// background). `true`: the lock is gone, so decide again at once.
    async fn delete_stale(
        &mut self,
        lock_uid: &str,
        why: &Stale,
        delete_pod: Option<PodRef>,
    ) -> Result<bool> {
        info!(reason = %why, lock_uid, "the lock is stale; deleting it");
        if let Some(pod) = delete_pod {
            tokio::spawn(
                delete_dead_pod(
                    self.pods.clone(),
                    self.lock.namespace.clone(),
                    pod,
                    self.config().api_timeout,
                )
                .instrument(tracing::Span::current()),
            );
        }
        let params = uid_precondition(lock_uid);
        let timeout = self.config().api_timeout;
        let deleted = call(
            cm_op(&self.lock, "delete"),
            timeout,
            self.configmaps.delete(&self.lock.name, &params),
        );
        match deleted.await {
            // Gone: by this delete, or already (the garbage collector, another candidate). Create
            // at once rather than after the watch says so; the create is atomic anyway.
            Ok(_) | Err(Failure::NotFound) => {
                self.lock_state = Some(None);
                return Ok(true);
            }
            // Another lock by now: the watch brings it.
            Err(Failure::Conflict) => debug!("the lock was replaced before it could be deleted"),
            Err(Failure::Fatal(e)) => return Err(e),
            Err(Failure::Transient(e)) => debug!(error = %e, "deleting the stale lock failed; retrying"),
        }
        self.arm_retry();
        Ok(false)
    }
}

/// Best effort: deletes a dead leader's Pod, if its UID is still the one seen.
async fn delete_dead_pod(pods: Api<Pod>, namespace: String, pod: PodRef, timeout: Duration) {
    info!(holder = %pod.name, "deleting the dead leader Pod");
    let op = pod_op(&namespace, &pod.name, "delete");
    match call(op, timeout, pods.delete(&pod.name, &uid_precondition(&pod.uid))).await {
        Ok(_) | Err(Failure::NotFound | Failure::Conflict) => {}
        Err(Failure::Fatal(e)) => {
            warn!(error = %e, holder = %pod.name, "could not delete the dead leader Pod")
        }
        Err(Failure::Transient(e)) => {
            debug!(error = %e, holder = %pod.name, "could not delete the dead leader Pod")
        }
    }
}

/// Writes the fencing token into the leader's new lock (`lock`, as created), with the lock's
/// `resourceVersion` as precondition, re-reading after a conflict. Runs beside the leader's
/// watch, so that taking over costs one write; until it is done, readers fall back to the
/// lock's `resourceVersion`, which is the same number while nobody else has written the lock.
async fn store_fencing_token(
    configmaps: Api<ConfigMap>,
    lock_ref: LockRef,
    me: PodRef,
    mut lock: ConfigMap,
    token: u64,
    timeout: Duration,
    backoff_cap: Duration,
) {
    let uid = lock.metadata.uid.clone();
    let mut backoff = Backoff::new(INITIAL_BACKOFF, backoff_cap);
    let op = |verb| cm_op(&lock_ref, verb);
    loop {
        if LockRecord::from_config_map(&lock).fencing_token == Some(token) {
            return;
        }
        let desired = with_fencing_token(lock.clone(), token);
        let params = PostParams::default();
        match call(
            op("update"),
            timeout,
            configmaps.replace(&lock_ref.name, &params, &desired),
        )
        .await
        {
            Ok(_) => {
                debug!(fencing_token = token, "stored the fencing token in the lock");
                return;
            }
            Err(Failure::NotFound) => return,
            Err(Failure::Fatal(e)) => {
                warn!(error = %e, "could not store the fencing token in the lock (leadership is not affected)");
                return;
            }
            Err(Failure::Conflict) => {
                debug!("the lock changed before the fencing token was written; re-reading")
            }
            Err(Failure::Transient(e)) => {
                let delay = backoff.next_delay();
                debug!(error = %e, ?delay, "writing the fencing token failed; retrying");
                tokio::time::sleep(delay).await;
            }
        }
        match call(op("get"), timeout, configmaps.get_opt(&lock_ref.name)).await {
            Ok(Some(fresh))
                if fresh.metadata.uid == uid && LockRecord::from_config_map(&fresh).is_owned_by(&me) =>
            {
                lock = fresh;
            }
            // Gone or replaced: the leader's watch says so.
            Ok(_) | Err(Failure::NotFound | Failure::Conflict) => return,
            Err(Failure::Fatal(e)) => {
                warn!(error = %e, "could not store the fencing token in the lock (leadership is not affected)");
                return;
            }
            Err(Failure::Transient(e)) => {
                let delay = backoff.next_delay();
                debug!(error = %e, ?delay, "re-reading the lock failed; retrying");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// The fencing token of a lock just created or found: its `resourceVersion` (etcd's revision).
fn fencing_token_of(lock: &ConfigMap) -> u64 {
    let rv = lock.metadata.resource_version.as_deref();
    parse_resource_version(rv).unwrap_or_else(|| {
        warn!(resource_version = ?rv, "the API server's resourceVersion is not a number; the fencing token is 0");
        0
    })
}

/// Names a call on the lock ConfigMap in errors.
fn cm_op<'a>(lock: &'a LockRef, verb: &'static str) -> Op<'a> {
    Op {
        verb,
        resource: "configmaps",
        namespace: &lock.namespace,
        name: &lock.name,
        hint: RBAC_HINT,
    }
}

fn pod_op<'a>(namespace: &'a str, name: &'a str, verb: &'static str) -> Op<'a> {
    Op {
        verb,
        resource: "pods",
        namespace,
        name,
        hint: RBAC_HINT,
    }
}

fn uid_precondition(uid: &str) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    }
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn changed_or_pending(watch: Option<&mut ObjectWatch<Pod>>) -> Result<Option<PodView>, Failure> {
    match watch {
        Some(w) => w.changed().await.map(|o| o.map(PodView::from_pod)),
        None => std::future::pending().await,
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Best effort: a `Normal` Event on the lock saying who leads. Never blocks the election.
async fn record_event(
    client: Client,
    lock: LockRef,
    cm: ConfigMap,
    me: PodRef,
    fencing_token: u64,
    restarted: bool,
    timeout: Duration,
) {
    let now = Time(Timestamp::now());
    let (reason, message) = if restarted {
        (
            "LeaderContinued",
            format!(
                "{} continues as leader after a restart (fencing token {fencing_token})",
                me.name
            ),
        )
    } else {
        (
            "LeaderElected",
            format!("{} became leader (fencing token {fencing_token})", me.name),
        )
    };
    // client-go's naming: <object>.<hex nanoseconds>, within the 253-character limit.
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let prefix: String = lock.name.chars().take(253 - 33).collect();
    let event = Event {
        metadata: ObjectMeta {
            name: Some(format!("{prefix}.{nanos:x}")),
            namespace: Some(lock.namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("ConfigMap".into()),
            name: Some(lock.name.clone()),
            namespace: Some(lock.namespace.clone()),
            uid: cm.metadata.uid.clone(),
            resource_version: cm.metadata.resource_version.clone(),
            ..ObjectReference::default()
        },
        reason: Some(reason.into()),
        message: Some(message),
        type_: Some("Normal".into()),
        source: Some(EventSource {
            component: Some("kube-leader".into()),
            host: None,
        }),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        reporting_component: Some("kube-leader".into()),
        reporting_instance: Some(me.name.clone()),
        ..Event::default()
    };
    let events: Api<Event> = Api::namespaced(client, &lock.namespace);
    let op = Op {
        verb: "create",
        resource: "events",
        namespace: &lock.namespace,
        name: &lock.name,
        hint: RBAC_HINT,
    };
    match call(op, timeout, events.create(&PostParams::default(), &event)).await {
        Ok(_) => debug!(reason, "recorded an Event on the lock"),
        Err(Failure::Fatal(e @ Error::Forbidden { .. })) => {
            warn!(error = %e, "could not record an Event on the lock (leadership is not affected)");
        }
        Err(e) => debug!(error = ?e, "could not record an Event on the lock (leadership is not affected)"),
    }
}

/// The leader's background task: watches its lock until it goes, the handle is dropped, or
/// leadership is released.
struct Holder {
    configmaps: Api<ConfigMap>,
    pods: Api<Pod>,
    lock: LockRef,
    lock_uid: String,
    me: PodRef,
    api_timeout: Duration,
    backoff_cap: Duration,
}

// === impl Holder ===

impl Holder {
    async fn keep(self, keeper: Keeper, done: CancellationToken, cancel: CancellationToken) -> Result<()> {
        let mut watch = ObjectWatch::new(
            self.configmaps.clone(),
            &self.lock.name,
            cm_op(&self.lock, "watch"),
        );
        // The leader's own Pod too: once it is being deleted, gone, replaced or terminal, its
        // lock is about to be deleted (by the garbage collector, or by a candidate), and a
        // successor may lead right after. Stepping down on the Pod's first sign keeps the
        // successor's start after this leader's end whenever this process still runs then (a
        // force-deleted Pod, or no kubelet to stop it); the lock watch alone would race the
        // successor's.
        let mut own_pod = ObjectWatch::new(
            self.pods.clone(),
            &self.me.name,
            pod_op(&self.lock.namespace, &self.me.name, "watch"),
        );
        let mut own_pod_refused = false;
        let mut backoff = Backoff::new(INITIAL_BACKOFF, self.backoff_cap);
        let mut poll_at: Option<Instant> = None;
        let mut warned = false;
        // Leader for life has no renew deadline to expire while its process is frozen: after a
        // pause its watches are its only news, and one that broke before (an API server
        // restart) reconnects with backoff. A late timer shows the pause; the lock is read then.
        let mut freeze_check = tokio::time::interval(FREEZE_CHECK);
        freeze_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_check = Instant::now();
        let mut watch_failing = false;
        loop {
            let leading = !keeper.is_lost();
            let seen: Option<Option<ConfigMap>> = tokio::select! {
                biased;
                () = done.cancelled() => {
                    if keeper.release_requested() {
                        // The loss first: once the lock is deleted a successor may start at once.
                        keeper.lose(LossReason::Released);
                        return self.release().await;
                    }
                    debug!("the leadership handle was dropped; no longer watching the lock \
                        (it stays until this Pod is deleted)");
                    keeper.lose(LossReason::Released);
                    return Ok(());
                }
                () = cancel.cancelled(), if leading => {
                    info!("shutdown requested; no longer leading \
                        (the lock stays until this Pod is deleted or the leadership is released)");
                    keeper.lose(LossReason::Cancelled);
                    None
                }
                _ = freeze_check.tick(), if leading => {
                    let now = Instant::now();
                    let late = now.saturating_duration_since(last_check).saturating_sub(FREEZE_CHECK);
                    last_check = now;
                    if late > FREEZE_SLACK {
                        info!(?late, "this process was frozen; reading the lock at once");
                        poll_at = Some(now);
                    }
                    None
                }
                r = watch.changed(), if leading => match r {
                    Ok(state) => {
                        backoff.reset();
                        poll_at = None;
                        watch_failing = false;
                        Some(state.cloned())
                    }
                    Err(e) => {
                        watch_failing = true;
                        if e.is_transient() {
                            debug!(error = ?e, "the lock watch failed; reading it with backoff until it recovers");
                        } else if !warned {
                            warned = true;
                            warn!(error = ?e, "cannot watch the lock; reading it with backoff instead");
                        }
                        poll_at.get_or_insert_with(|| Instant::now() + backoff.next_delay());
                        None
                    }
                },
                r = own_pod.changed(), if leading && !own_pod_refused => {
                    match r {
                        Ok(pod) => self.check_own_pod(&keeper, pod),
                        Err(Failure::Fatal(e)) => {
                            own_pod_refused = true;
                            warn!(error = %e, "cannot watch this candidate's own Pod; leadership ends \
                                only with the lock (grant watch on pods to step down as soon as the Pod ends)");
                        }
                        Err(e) => debug!(error = ?e, "the watch of this candidate's own Pod failed; it is retried"),
                    }
                    None
                }
                () = sleep_until_opt(poll_at), if leading => {
                    // Polling goes on only while the watch fails (a read after a freeze is one).
                    poll_at = watch_failing.then(|| Instant::now() + backoff.next_delay());
                    let read = call(cm_op(&self.lock, "get"), self.api_timeout, self.configmaps.get_opt(&self.lock.name));
                    match read.await {
                        Ok(state) => Some(state),
                        Err(e) => {
                            debug!(error = ?e, "reading the lock failed");
                            None
                        }
                    }
                }
            };
            if let Some(state) = seen {
                self.check(&keeper, state);
            }
        }
    }

    /// Ends leadership if the lock is gone or no longer this term's.
    fn check(&self, keeper: &Keeper, state: Option<ConfigMap>) {
        let Some(cm) = state else {
            info!("the lock was deleted; no longer leading");
            keeper.lose(LossReason::LockDeleted);
            return;
        };
        let record = LockRecord::from_config_map(&cm);
        if record.uid != self.lock_uid || !record.is_owned_by(&self.me) {
            let holder = record.holder().map(str::to_string);
            info!(holder = ?holder, lock_uid = %record.uid, "the lock was replaced; no longer leading");
            keeper.lose(LossReason::LockReplaced { holder });
        }
    }

    /// Ends leadership if this candidate's own Pod is ending: its lock goes next.
    fn check_own_pod(&self, keeper: &Keeper, pod: Option<&Pod>) {
        let why = match pod.map(PodView::from_pod) {
            None => "was deleted".to_string(),
            Some(v) if v.uid != self.me.uid => {
                format!("was replaced by another Pod of that name (UID {})", v.uid)
            }
            Some(v) if v.deleting => "is being deleted".to_string(),
            Some(v) if v.is_terminal() => format!(
                "is in phase {}{}",
                v.phase.as_deref().unwrap_or_default(),
                v.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default()
            ),
            Some(_) => return,
        };
        info!(pod = %self.me.name, "this candidate's Pod {why}; no longer leading");
        keeper.lose(LossReason::PodEnding { why });
    }

    /// Explicit step-down: deletes the lock if it is still this term's (UID precondition).
    async fn release(&self) -> Result<()> {
        let started = Instant::now();
        let mut backoff = Backoff::new(INITIAL_BACKOFF, self.backoff_cap);
        let params = uid_precondition(&self.lock_uid);
        let mut attempt = 0;
        loop {
            attempt += 1;
            match call(
                cm_op(&self.lock, "delete"),
                self.api_timeout,
                self.configmaps.delete(&self.lock.name, &params),
            )
            .await
            {
                Ok(_) => {
                    info!("released: deleted the lock");
                    return Ok(());
                }
                Err(Failure::NotFound | Failure::Conflict) => {
                    info!("released: the lock was already gone or replaced");
                    return Ok(());
                }
                Err(Failure::Fatal(e)) => return Err(e),
                Err(Failure::Transient(e)) if attempt >= 3 => {
                    return Err(Error::Unreachable {
                        elapsed: started.elapsed(),
                        source: e,
                    });
                }
                Err(Failure::Transient(e)) => {
                    let delay = backoff.next_delay();
                    debug!(error = %e, ?delay, "deleting the lock failed; retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }
}

impl std::fmt::Debug for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Holder")
            .field("lock", &self.lock)
            .field("lock_uid", &self.lock_uid)
            .finish_non_exhaustive()
    }
}
