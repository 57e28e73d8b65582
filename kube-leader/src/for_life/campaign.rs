//! A leader-for-life campaign: watch the lock and its holder's Pod, and take the lock the
//! moment it is free (or stale), as operator-sdk's `leader.Become` does by polling.

use std::{sync::atomic::Ordering, time::SystemTime};

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Api;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{
    api::{cm_op, pod_op},
    config::{ForLifeConfig, INITIAL_BACKOFF},
    decide::{
        dead_pod_to_delete, decide, defer_to_preferred, track_fate, Decision, Fate, Inputs, Policy, Proof,
        Stale, Waiting,
    },
    record::{LeaderPod, LockRecord, LockState, PodRef, PodView},
    steps,
};
use crate::{
    api::{call, Failure},
    backoff::Backoff,
    error::{Error, Result},
    lock::LockRef,
    object_watch::ObjectWatch,
    time::sleep_until_opt,
};

/// What winning yields: the lock as written, and the term's facts.
#[derive(Debug)]
pub(super) struct Won {
    pub(super) lock: ConfigMap,
    pub(super) fencing_token: u64,
    pub(super) acquired_at: SystemTime,
    /// Found this Pod's own lock (a restart) rather than creating one.
    pub(super) restarted: bool,
    /// The lock carries the fencing token already.
    pub(super) token_stored: bool,
    /// When the write that made this term, with a liveness heartbeat, was sent.
    pub(super) heartbeat_sent: Option<Instant>,
}

/// The leader Pod as watched by a waiting candidate.
pub(super) struct LeaderPodWatch {
    pub(super) name: String,
    pub(super) watch: ObjectWatch<Pod>,
    pub(super) state: LeaderPod,
    pub(super) failing: bool,
}

/// Whether a fresh read of the leader Pod confirms what a decision was made on.
pub(super) enum Confirmed {
    Yes,
    Changed,
    Unknown,
}

/// What one decision and its act came to.
enum Step {
    /// This candidate leads (boxed: a term's lock is large beside the other variants).
    Won(Box<Won>),
    /// The world changed under the act: decide again at once.
    Again,
    /// Wait for a change (or until the instant given), then decide again.
    Wait(Option<Instant>),
}

/// What woke a waiting candidate.
enum Wake {
    Lock(Result<Option<Box<ConfigMap>>, Failure>),
    Pod(Result<Option<PodView>, Failure>),
    OwnPod(Result<Option<PodView>, Failure>),
    Timer,
}

/// What a campaign reads of its candidate ([`ForLife`](super::ForLife)): its client, settings,
/// and whether the NotReady takeover was switched off.
pub(super) struct Settings<'a> {
    pub(super) client: &'a kube::Client,
    pub(super) config: &'a ForLifeConfig,
    pub(super) node_check_disabled: &'a std::sync::atomic::AtomicBool,
    /// See [`Policy::kubelet_terminal_proof`].
    pub(super) kubelet_terminal_proof: bool,
}

/// One campaign: the state of a waiting candidate.
pub(super) struct Election<'a> {
    pub(super) elector: Settings<'a>,
    pub(super) lock: LockRef,
    pub(super) me: PodRef,
    pub(super) configmaps: Api<ConfigMap>,
    pub(super) pods: Api<Pod>,
    pub(super) backoff: Backoff,
    pub(super) lock_watch: ObjectWatch<ConfigMap>,
    /// The lock as last observed: `None` until first observed, `Some(None)` when absent.
    pub(super) lock_state: LockState,
    pub(super) lock_watch_failing: bool,
    pub(super) leader_pod: Option<LeaderPodWatch>,
    /// What this candidate saw of the end of the lock's owner, or (while there is no lock) of
    /// the last owner it saw.
    pub(super) fate: Option<Fate>,
    /// A dead leader's Pod to delete (by policy) once this candidate's create won. Not before:
    /// deleting a Pod makes the garbage collector delete every lock it owns, a newer one too
    /// that this candidate's watch has not shown yet (the dead Pod's process campaigned again
    /// before its eviction reached it).
    pub(super) dead_pod: Option<PodRef>,
    pub(super) node: Option<NodeCheck>,
    /// When to re-read the lock (and leader Pod) with GET instead of waiting for the watches:
    /// the fallback after an action, a transient error, or while a watch fails.
    pub(super) retry_at: Option<Instant>,
    /// The last reason for waiting that was logged.
    pub(super) last_wait: Option<Waiting>,
    /// The last unreadable heartbeat that was logged.
    pub(super) last_bad_heartbeat: Option<String>,
    /// This candidate's own Pod: once it is ending, the candidate stops campaigning.
    pub(super) own_pod: ObjectWatch<Pod>,
    /// Whether watching the own Pod was refused (logged once; campaigning goes on).
    pub(super) own_pod_refused: bool,
}

mod acquire;
mod node;
mod takeover;
mod waiting;

use node::NodeCheck;

// === impl Election ===

impl<'a> Election<'a> {
    pub(super) fn new(elector: Settings<'a>, lock: LockRef, me: PodRef, pods: Api<Pod>) -> Self {
        let configmaps: Api<ConfigMap> = Api::namespaced(elector.client.clone(), &lock.namespace);
        let lock_watch = ObjectWatch::new(configmaps.clone(), &lock.name, cm_op(&lock, "watch"));
        let own_pod = ObjectWatch::new(pods.clone(), &me.name, pod_op(&lock.namespace, &me.name, "watch"));
        steps::campaign(&me, elector.config.successor_wait);
        Self {
            own_pod,
            own_pod_refused: false,
            backoff: Backoff::new(INITIAL_BACKOFF, elector.config.backoff_cap),
            elector,
            lock,
            me,
            configmaps,
            pods,
            lock_watch,
            lock_state: LockState::Unseen,
            lock_watch_failing: false,
            leader_pod: None,
            fate: None,
            dead_pod: None,
            node: None,
            retry_at: None,
            last_wait: None,
            last_bad_heartbeat: None,
        }
    }

    pub(super) fn config(&self) -> &ForLifeConfig {
        self.elector.config
    }

    pub(super) fn policy(&self) -> Policy {
        let node_check = !self.elector.node_check_disabled.load(Ordering::Relaxed);
        Policy {
            dead_leader_pod: self.config().dead_leader_pod,
            not_ready_takeover: self.config().not_ready_takeover.filter(|_| node_check),
            kubelet_terminal_proof: self.elector.kubelet_terminal_proof,
        }
    }

    /// Decides and acts until this candidate leads.
    pub(super) async fn run(&mut self) -> Result<Won> {
        loop {
            let mut recheck_at = None;
            if let Some(state) = self.lock_state.known() {
                match self.step(state).await? {
                    Step::Won(won) => {
                        let beat = self.config().heartbeat().zip(won.heartbeat_sent);
                        let (token, lock) = (won.fencing_token, &won.lock);
                        steps::lead(token, won.restarted, won.token_stored, lock, beat);
                        return Ok(*won);
                    }
                    Step::Again => continue,
                    Step::Wait(at) => recheck_at = at,
                }
            }
            self.wait(recheck_at).await?;
        }
    }

    /// One decision on the lock as last seen (`None`: there is none), and its act.
    async fn step(&mut self, state: Option<ConfigMap>) -> Result<Step> {
        let record = state.as_ref().map(LockRecord::from_config_map);
        self.track_leader_pod(record.as_ref());
        self.track_node();
        let now = Instant::now();
        self.track_fate(record.as_ref(), now);
        let inputs = Inputs {
            lock: record.as_ref(),
            leader_pod: self.leader_pod.as_ref().map_or(&LeaderPod::Unknown, |p| &p.state),
            node_not_ready_since: self.node.as_ref().and_then(|n| n.not_ready_since),
            fate: self.fate.as_ref(),
            me: &self.me,
            now,
            policy: self.policy(),
        };
        let wait = self.config().successor_wait;
        let decision = defer_to_preferred(decide(inputs), self.fate.as_ref(), &self.me, now, wait);
        let dead_pod = dead_pod_to_delete(&inputs);
        let watched = self.leader_pod.as_ref().map(|p| p.name.as_str());
        steps::decided(state.as_ref(), watched, &inputs, &decision, dead_pod.as_ref());
        match decision {
            Decision::Create => {
                self.last_wait = None;
                match self.confirm_before_create().await? {
                    Confirmed::Yes => {
                        if dead_pod.is_some() {
                            self.dead_pod = dead_pod;
                        }
                        if let Some(won) = self.create().await? {
                            // Only once the create won: no other lock existed then, so the
                            // dead Pod's deletion cannot take one with it (see `dead_pod`).
                            if let Some(pod) = self.dead_pod.take() {
                                self.delete_dead_pod(pod);
                            }
                            return Ok(Step::Won(Box::new(won)));
                        }
                    }
                    Confirmed::Changed => return Ok(Step::Again),
                    Confirmed::Unknown => {}
                }
            }
            Decision::Continue => {
                if let Some(won) = self.continue_as_leader(state.unwrap_or_default()).await? {
                    return Ok(Step::Won(Box::new(won)));
                }
            }
            Decision::DeleteLock {
                lock_uid,
                why,
                proof,
                delete_pod,
            } => {
                self.last_wait = None;
                let version = record.as_ref().and_then(|r| r.resource_version.clone());
                return self
                    .delete_lock(&lock_uid, version, &why, proof, delete_pod)
                    .await;
            }
            Decision::Wait { why, recheck_at } => {
                if matches!(why, Waiting::Malformed(_)) {
                    // Re-read with the backoff, as operator-sdk does, in case an edit that
                    // fixes the lock is missed; the watch usually brings it first.
                    self.arm_retry();
                }
                self.log_wait(why, recheck_at, now);
                return Ok(Step::Wait(recheck_at));
            }
        }
        Ok(Step::Wait(None))
    }

    /// [`Decision::DeleteLock`]: once the leader's Pod is confirmed as decided on, deletes the
    /// stale lock (of `version`, as seen, where the proof is a lapsed liveness).
    async fn delete_lock(
        &mut self,
        lock_uid: &str,
        version: Option<String>,
        why: &Stale,
        proof: Proof,
        delete_pod: Option<PodRef>,
    ) -> Result<Step> {
        match self.confirm_leader_pod().await? {
            // The Pod is as decided on: the lock is stale.
            Confirmed::Yes => {
                // The liveness proof holds for the lock as seen: a heartbeat since (a newer
                // version) must stop the deletion.
                let version = matches!(proof, Proof::LivenessLapsed { .. })
                    .then_some(version)
                    .flatten();
                let precondition = (lock_uid, version.as_deref());
                if self.delete_stale(precondition, why, proof, delete_pod).await? {
                    return Ok(Step::Again);
                }
                Ok(Step::Wait(None))
            }
            // The Pod changed: decide again on what it is now.
            Confirmed::Changed => Ok(Step::Again),
            // Cannot tell now: wait, re-reading with the backoff.
            Confirmed::Unknown => Ok(Step::Wait(None)),
        }
    }

    /// Watches the Pod named by the lock's owner (if it is not this candidate), and only it.
    /// While there is no lock, the last owner's Pod stays watched: its end may be unproven.
    fn track_leader_pod(&mut self, record: Option<&LockRecord>) {
        let Some(record) = record else { return };
        let wanted = record
            .owner
            .as_ref()
            .ok()
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

    /// Keeps [`Fate`] for the lock's owner: a new one for a new owner, none for a lock without
    /// one, and the last one while there is no lock. A former Pod of this candidate's own name
    /// is gone (this Pod has its name), and was never watched.
    fn track_fate(&mut self, record: Option<&LockRecord>, now: Instant) {
        let leader_pod = self.leader_pod.as_ref().map(|p| (p.name.as_str(), &p.state));
        track_fate(&mut self.fate, record, &self.me, leader_pod, now);
        if let Some(record) = record {
            self.log_bad_heartbeat(record);
        }
    }

    /// Logs an unreadable liveness heartbeat once: it counts as none (only the other proofs).
    fn log_bad_heartbeat(&mut self, record: &LockRecord) {
        let bad = record.heartbeat.as_ref().err();
        if bad.is_some() && bad != self.last_bad_heartbeat.as_ref() {
            warn!(lock = %self.lock, reason = %bad.cloned().unwrap_or_default(),
                "the lock's liveness heartbeat cannot be read; ignoring it (only the release mark, \
                 the Pod's deletion or its grace prove that a dead leader's work stopped)");
        }
        self.last_bad_heartbeat = bad.cloned();
    }

    /// Arms the fallback re-read, if not armed.
    pub(super) fn arm_retry(&mut self) {
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
                r = self.own_pod.changed(), if !self.own_pod_refused => {
                    Wake::OwnPod(r.map(|o| o.map(PodView::from_pod)))
                }
                () = sleep_until_opt(wake_at) => Wake::Timer,
            }
        };
        match wake {
            Wake::Lock(Ok(state)) => {
                self.lock_state = LockState::from(state.map(|b| *b));
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
            Wake::OwnPod(r) => self.own_pod_changed(r)?,
            Wake::Timer => self.on_timer().await?,
        }
        Ok(())
    }

    /// A stopping candidate never campaigns again: once its own Pod is being deleted, replaced
    /// or terminal, the campaign ends with [`Error::Stopping`].
    fn own_pod_changed(&mut self, r: Result<Option<PodView>, Failure>) -> Result<()> {
        let why = match r {
            Ok(None) => "was deleted".to_string(),
            Ok(Some(v)) if v.uid != self.me.uid => {
                format!("was replaced by another Pod of that name (UID {})", v.uid)
            }
            Ok(Some(v)) if v.deleting => "is being deleted".to_string(),
            Ok(Some(v)) if v.is_terminal() => {
                format!("is in phase {}", v.phase.as_deref().unwrap_or_default())
            }
            Ok(Some(_)) => return Ok(()),
            Err(Failure::Fatal(e)) => {
                self.own_pod_refused = true;
                warn!(error = %e, "cannot watch this candidate's own Pod; campaigning goes on, but a \
                    candidate whose Pod is going may still take the lock (grant watch on pods)");
                return Ok(());
            }
            Err(e) => {
                debug!(error = ?e, "the watch of this candidate's own Pod failed; it is retried");
                return Ok(());
            }
        };
        info!(pod = %self.me.name, "this candidate's Pod {why}; no longer campaigning");
        Err(Error::Stopping {
            lock: self.lock.to_string(),
            why,
        })
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
            Ok(state) => self.lock_state = LockState::from(state),
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
}

async fn changed_or_pending(watch: Option<&mut ObjectWatch<Pod>>) -> Result<Option<PodView>, Failure> {
    match watch {
        Some(w) => w.changed().await.map(|o| o.map(PodView::from_pod)),
        None => std::future::pending().await,
    }
}
