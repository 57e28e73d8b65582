//! The leader-for-life keeper: watches the lock and this candidate's own Pod while leading,
//! ends the term the moment either says it is over, and deletes the lock on an explicit release.

use std::time::Duration;

use k8s_openapi::{
    api::core::v1::{ConfigMap, Pod},
    jiff::Timestamp,
};
use kube::{api::PostParams, Api};
use tokio::{task::JoinHandle, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};

use super::{
    api::{cm_op, pod_op, uid_precondition},
    config::INITIAL_BACKOFF,
    heartbeat::{check_lock, Beat},
    holder::{pod_ending, release_mark, Mark},
    record::{lock_config_map, LockRecord, LockState, PodRef, PodView, RELEASED_ANNOTATION},
    steps,
};
use crate::{
    api::{call, Failure},
    backoff::Backoff,
    error::{Error, Result},
    leadership::{KeeperHandle, LossReason},
    lock::LockRef,
    object_watch::ObjectWatch,
    successor::{preferred_value, Registry, PREFERRED_HOLDER_ANNOTATION},
    time::sleep_until_opt,
};

/// How often a leader's keeper checks, without any request, whether its process was frozen.
const FREEZE_CHECK: Duration = Duration::from_millis(250);
/// A check this late means the process was stopped (SIGSTOP, a VM pause): the lock is read at
/// once rather than waiting for a watch that may be reconnecting with backoff.
const FREEZE_SLACK: Duration = Duration::from_millis(750);

/// The leader's background task: watches its lock until it goes, the handle is dropped, or
/// leadership is released.
pub(super) struct Keeper {
    pub(super) configmaps: Api<ConfigMap>,
    pub(super) pods: Api<Pod>,
    pub(super) lock: LockRef,
    pub(super) lock_uid: String,
    pub(super) me: PodRef,
    pub(super) api_timeout: Duration,
    pub(super) backoff_cap: Duration,
    /// The liveness heartbeat, if on.
    pub(super) beat: Option<Beat>,
    /// The campaign's watch of this Pod, to go on watching (taken when the term starts).
    /// (A mutex only to keep the keeper `Sync`: a watch stream is not.)
    pub(super) own_pod: std::sync::Mutex<Option<OwnPodWatch>>,
    /// The candidates' registrations, to name the successor of a release.
    pub(super) registry: Option<Registry>,
    /// The successor, looked up from when the term began to end (while the work stops).
    pub(super) successor: std::sync::Mutex<Option<JoinHandle<Option<String>>>>,
    /// Keeps this candidate's registration until the term is over (dropped with the keeper).
    pub(super) registration: Option<crate::successor::Hold>,
}

// === impl Keeper ===

impl Keeper {
    /// Keeps the term: watches the lock and this Pod until either ends it, or the handle is
    /// dropped (the lock stays, to go with the Pod) or released (the lock is deleted).
    pub(super) async fn keep(
        mut self,
        handle: KeeperHandle,
        done: CancellationToken,
        shutdown: CancellationToken,
    ) -> Result<()> {
        let registration = self.registration.take();
        let result = self.keep_term(handle, done, shutdown).await;
        if let Some(registration) = registration {
            registration.end().await;
        }
        result
    }

    /// [`keep`](Self::keep), the term itself.
    async fn keep_term(
        mut self,
        handle: KeeperHandle,
        done: CancellationToken,
        shutdown: CancellationToken,
    ) -> Result<()> {
        let own_pod = self.own_pod.get_mut().ok().and_then(Option::take);
        let mut watches = Watches::new(&self, own_pod);
        let beat = self.beat.take();
        let beating = beat.is_some();
        let beat = async {
            match beat {
                Some(b) => b.run(&handle).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(beat);
        loop {
            let leading = !handle.is_lost();
            let seen = tokio::select! {
                biased;
                () = done.cancelled() => {
                    let watched = watches.lock.current().cloned();
                    return self.step_down(&handle, watched).await;
                }
                () = shutdown.cancelled(), if leading => {
                    info!("shutdown requested; no longer leading \
                        (the lock stays until this Pod is deleted or the leadership is released)");
                    handle.lose(LossReason::Cancelled);
                    self.look_up_successor();
                    LockState::Unseen
                }
                _ = watches.freeze_check.tick(), if leading => {
                    watches.check_freeze();
                    LockState::Unseen
                }
                r = watches.lock.changed(), if leading => {
                    let r = r.map(|s| s.cloned());
                    watches.lock_changed(r)
                }
                r = watches.own_pod.changed(), if leading && !watches.own_pod_refused => {
                    let r = r.map(|p| p.cloned());
                    self.own_pod_changed(&handle, &mut watches, r);
                    LockState::Unseen
                }
                () = sleep_until_opt(watches.poll_at), if leading => self.poll(&mut watches).await,
                () = &mut beat, if leading && beating => LockState::Unseen,
            };
            if let Some(state) = seen.known() {
                check_lock("watch", &handle, &self.lock_uid, &self.me, state);
            }
        }
    }

    /// The handle was dropped or released; `watched`: the lock as its watch shows it.
    async fn step_down(&self, handle: &KeeperHandle, watched: Option<ConfigMap>) -> Result<()> {
        if handle.reason() == Some(LossReason::LockDeleted) {
            return self.say_stopped().await;
        }
        if handle.release_requested() {
            // The loss first: once the lock is deleted a successor may start at once.
            handle.lose(LossReason::Released);
            return self.release(watched).await;
        }
        debug!(
            "the leadership handle was dropped; no longer watching the lock \
            (it stays until this Pod is deleted)"
        );
        handle.lose(LossReason::Released);
        Ok(())
    }

    /// An event of the watch on this candidate's own Pod.
    fn own_pod_changed(&self, handle: &KeeperHandle, w: &mut Watches, r: Result<Option<Pod>, Failure>) {
        match r {
            Ok(pod) => self.check_own_pod(handle, pod.as_ref()),
            Err(Failure::Fatal(e)) => {
                w.own_pod_refused = true;
                warn!(error = %e, "cannot watch this candidate's own Pod; leadership ends \
                    only with the lock (grant watch on pods to step down as soon as the Pod ends)");
            }
            Err(e) => debug!(error = ?e, "the watch of this candidate's own Pod failed; it is retried"),
        }
    }

    /// Reads the lock while its watch fails (or once after a freeze).
    async fn poll(&self, w: &mut Watches) -> LockState {
        // Polling goes on only while the watch fails (a read after a freeze is one).
        w.poll_at = w.watch_failing.then(|| Instant::now() + w.backoff.next_delay());
        let get = self.configmaps.get_opt(&self.lock.name);
        match call(cm_op(&self.lock, "get"), self.api_timeout, get).await {
            Ok(state) => LockState::from(state),
            Err(e) => {
                debug!(error = ?e, "reading the lock failed");
                LockState::Unseen
            }
        }
    }

    /// Ends leadership if this candidate's own Pod is ending (being deleted, gone, replaced,
    /// terminal, or marked with a `DisruptionTarget` condition): its lock goes next.
    fn check_own_pod(&self, handle: &KeeperHandle, pod: Option<&Pod>) {
        let view = pod.map(PodView::from_pod);
        let why = pod_ending(&self.me, view.as_ref());
        steps::pod_ending(view.as_ref(), why.as_deref());
        let Some(why) = why else { return };
        info!(pod = %self.me.name, "this candidate's Pod {why}; no longer leading");
        handle.lose(LossReason::PodEnding { why });
        self.look_up_successor();
    }

    /// Starts looking up the youngest registered candidate, the successor the release names;
    /// it runs while the work stops, so the release waits for it only where the work stops
    /// at once.
    fn look_up_successor(&self) {
        let Some(registry) = &self.registry else { return };
        let mut successor = self.successor.lock().unwrap_or_else(|e| e.into_inner());
        if successor.is_none() {
            let (registry, me) = (registry.clone(), self.me.name.clone());
            let lookup = async move { registry.youngest_other(&me).await };
            *successor = Some(tokio::spawn(lookup.in_current_span()));
        }
    }

    /// The successor the release names (see [`look_up_successor`](Self::look_up_successor)).
    async fn successor(&self) -> Option<String> {
        self.look_up_successor();
        let lookup = self.successor.lock().unwrap_or_else(|e| e.into_inner()).take()?;
        let found = tokio::time::timeout(self.api_timeout, lookup).await;
        found.ok().and_then(|r| r.ok()).flatten()
    }

    /// Explicit step-down, once this term's work has stopped: marks the lock released
    /// ([`RELEASED_ANNOTATION`]), then deletes it, both only if it is still this term's (UID).
    /// The mark is what tells a waiting candidate that nothing of this term runs any more, also
    /// when this Pod is terminal or gone and its containers might otherwise still run.
    /// `watched` (the lock as the keeper's watch shows it) saves the first GET: the update
    /// carries its resourceVersion, so a lock that changed since answers 409 and is read again.
    async fn release(&self, mut watched: Option<ConfigMap>) -> Result<()> {
        let started = Instant::now();
        let mut backoff = Backoff::new(INITIAL_BACKOFF, self.backoff_cap);
        let (mut failures, mut marked) = (0, false);
        let successor = self.successor().await;
        loop {
            let step = if marked {
                self.delete_lock().await
            } else {
                self.mark_released(watched.take(), successor.as_deref()).await
            };
            match step {
                Ok(true) if marked => {
                    let successor = successor.as_deref().unwrap_or("(none)");
                    info!(%successor, "released: marked the lock released and deleted it");
                    return Ok(());
                }
                Ok(true) => marked = true,
                // Re-read and mark again (an update raced this one).
                Err(Failure::Conflict) if !marked => {}
                Ok(false) | Err(Failure::NotFound | Failure::Conflict) => {
                    info!("released: the lock was already gone or replaced");
                    return Ok(());
                }
                Err(Failure::Fatal(e)) => return Err(e),
                Err(Failure::Transient(e)) if failures >= 2 => {
                    return Err(Error::Unreachable {
                        elapsed: started.elapsed(),
                        source: e,
                    });
                }
                Err(Failure::Transient(e)) => {
                    failures += 1;
                    let delay = backoff.next_delay();
                    debug!(error = %e, ?delay, "releasing the lock failed; retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// The lock was deleted under this term by someone else (an admin, a prune, a cleanup
    /// script) while this Pod lives, and the work has now stopped (the handle was released or
    /// dropped). Waiting candidates do not take over until this leader says so (or its Pod ends
    /// with a proof, or its heartbeat lapses): say it by creating the lock again, owned by this
    /// Pod and already marked released, naming the successor as a release does. They take it
    /// over on that mark ([`Proof::Released`](super::decide::Proof::Released)). A lock that
    /// exists by now is somebody else's (a candidate that never saw this term): nothing to say.
    async fn say_stopped(&self) -> Result<()> {
        let successor = self.successor().await;
        let now = Timestamp::now();
        let mut cm = lock_config_map(&self.lock, &self.me, now);
        let annotations = cm.metadata.annotations.get_or_insert_with(Default::default);
        annotations.insert(RELEASED_ANNOTATION.to_string(), now.to_string());
        if let Some(successor) = successor.as_deref() {
            annotations.insert(
                PREFERRED_HOLDER_ANNOTATION.to_string(),
                preferred_value(now, successor),
            );
        }
        let (started, mut failures) = (Instant::now(), 0);
        let mut backoff = Backoff::new(INITIAL_BACKOFF, self.backoff_cap);
        let fail = "the lock had been deleted under this leader; could not say that its work \
            stopped (waiting candidates take over once this Pod ends)";
        let params = PostParams::default();
        loop {
            let (create, sent) = (self.configmaps.create(&params, &cm), Instant::now());
            let created = call(cm_op(&self.lock, "create"), self.api_timeout, create).await;
            steps::write(
                "say_stopped",
                (None, None),
                Some(&cm),
                sent,
                &created,
                steps::written,
            );
            match created {
                Ok(_) => {
                    let successor = successor.as_deref().unwrap_or("(none)");
                    info!(%successor, "the lock had been deleted under this leader; its work has \
                        stopped: created the lock again, marked released, for the waiting candidates");
                    return Ok(());
                }
                Err(Failure::Conflict) => {
                    info!(
                        "the lock had been deleted under this leader, and another candidate \
                        created it since; nothing to release"
                    );
                    return Ok(());
                }
                Err(Failure::NotFound) => {
                    info!("the lock's namespace is gone; nothing to release");
                    return Ok(());
                }
                Err(Failure::Transient(e)) if failures < 2 => {
                    failures += 1;
                    let delay = backoff.next_delay();
                    debug!(error = %e, ?delay, "creating the released lock failed; retrying");
                    tokio::time::sleep(delay).await;
                }
                Err(Failure::Transient(e)) => {
                    warn!(error = %e, "{fail}");
                    return Err(Error::Unreachable {
                        elapsed: started.elapsed(),
                        source: e,
                    });
                }
                Err(Failure::Fatal(e)) => {
                    warn!(error = %e, "{fail}");
                    return Err(e);
                }
            }
        }
    }

    /// Marks the lock released if it is still this term's. `false`: it is gone or replaced.
    async fn mark_released(
        &self,
        watched: Option<ConfigMap>,
        successor: Option<&str>,
    ) -> Result<bool, Failure> {
        let mut cm = match watched {
            Some(cm) => cm,
            None => {
                let get = self.configmaps.get_opt(&self.lock.name);
                match call(cm_op(&self.lock, "get"), self.api_timeout, get).await? {
                    Some(cm) => cm,
                    None => return Ok(false),
                }
            }
        };
        let mark = release_mark(&self.lock_uid, &self.me, &LockRecord::from_config_map(&cm));
        steps::release_mark(&cm, mark);
        match mark {
            Mark::NotMine => return Ok(false),
            Mark::Marked => return Ok(true),
            Mark::Write => {}
        }
        let (released, annotations) = (
            Timestamp::now(),
            cm.metadata.annotations.get_or_insert_with(Default::default),
        );
        annotations.insert(RELEASED_ANNOTATION.to_string(), released.to_string());
        if let Some(successor) = successor {
            annotations.insert(
                PREFERRED_HOLDER_ANNOTATION.to_string(),
                preferred_value(released, successor),
            );
        }
        // The update carries the resourceVersion just read: a 409 means re-read.
        let params = PostParams::default();
        let (update, sent) = (
            self.configmaps.replace(&self.lock.name, &params, &cm),
            Instant::now(),
        );
        let marked = call(cm_op(&self.lock, "update"), self.api_timeout, update).await;
        let pre = (
            cm.metadata.uid.as_deref(),
            cm.metadata.resource_version.as_deref(),
        );
        steps::write("mark", pre, Some(&cm), sent, &marked, steps::written);
        marked.map(|_| true)
    }

    /// Deletes the lock if it is still this term's (UID precondition). `false`: gone or
    /// replaced.
    async fn delete_lock(&self) -> Result<bool, Failure> {
        let params = uid_precondition(&self.lock_uid);
        let (delete, sent) = (self.configmaps.delete(&self.lock.name, &params), Instant::now());
        let deleted = call(cm_op(&self.lock, "delete"), self.api_timeout, delete).await;
        steps::write(
            "release_delete",
            (Some(&self.lock_uid), None),
            None,
            sent,
            &deleted,
            |_| None,
        );
        match deleted {
            Ok(_) => Ok(true),
            Err(Failure::NotFound | Failure::Conflict) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keeper")
            .field("lock", &self.lock)
            .field("lock_uid", &self.lock_uid)
            .finish_non_exhaustive()
    }
}

/// The watch of this candidate's own Pod, from the campaign on: a Pod's events only ever move
/// it towards its end, so one still queued from the campaign tells nothing false.
pub(super) struct OwnPodWatch {
    pub(super) watch: ObjectWatch<Pod>,
    /// Watching it was refused (already logged).
    pub(super) refused: bool,
}

/// What a leader for life watches, and how it falls back when a watch fails.
struct Watches {
    lock: ObjectWatch<ConfigMap>,
    /// The leader's own Pod too: once it is being deleted, gone, replaced or terminal, its lock
    /// is about to be deleted (by the garbage collector, or by a candidate), and a successor may
    /// lead right after. Stepping down on the Pod's first sign keeps the successor's start after
    /// this leader's end whenever this process still runs then (a force-deleted Pod, or no
    /// kubelet to stop it); the lock watch alone would race the successor's.
    own_pod: ObjectWatch<Pod>,
    own_pod_refused: bool,
    backoff: Backoff,
    /// When to read the lock with GET (while its watch fails, or at once after a freeze).
    poll_at: Option<Instant>,
    warned: bool,
    watch_failing: bool,
    /// Leader for life has no renew deadline to expire while its process is frozen: after a
    /// pause its watches are its only news, and one that broke before (an API server restart)
    /// reconnects with backoff. A late timer shows the pause; the lock is read then.
    freeze_check: tokio::time::Interval,
    last_check: Instant,
}

// === impl Watches ===

impl Watches {
    /// The keeper's watches; `own_pod`: the campaign's watch of this Pod, if it has one.
    fn new(k: &Keeper, own_pod: Option<OwnPodWatch>) -> Self {
        let mut freeze_check = tokio::time::interval(FREEZE_CHECK);
        freeze_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let own_pod = own_pod.unwrap_or_else(|| OwnPodWatch {
            watch: ObjectWatch::new(
                k.pods.clone(),
                &k.me.name,
                pod_op(&k.lock.namespace, &k.me.name, "watch"),
            ),
            refused: false,
        });
        Self {
            lock: ObjectWatch::new(k.configmaps.clone(), &k.lock.name, cm_op(&k.lock, "watch")),
            own_pod: own_pod.watch,
            own_pod_refused: own_pod.refused,
            backoff: Backoff::new(INITIAL_BACKOFF, k.backoff_cap),
            poll_at: None,
            warned: false,
            watch_failing: false,
            freeze_check,
            last_check: Instant::now(),
        }
    }

    /// A late tick means this process was frozen: read the lock at once.
    fn check_freeze(&mut self) {
        let now = Instant::now();
        let late = now
            .saturating_duration_since(self.last_check)
            .saturating_sub(FREEZE_CHECK);
        self.last_check = now;
        if late > FREEZE_SLACK {
            info!(?late, "this process was frozen; reading the lock at once");
            self.poll_at = Some(now);
        }
    }

    /// An event of the lock watch: the lock as it is now, or `None` (fall back to reading).
    fn lock_changed(&mut self, r: Result<Option<ConfigMap>, Failure>) -> LockState {
        match r {
            Ok(state) => {
                self.backoff.reset();
                self.poll_at = None;
                self.watch_failing = false;
                LockState::from(state)
            }
            Err(e) => {
                self.watch_failing = true;
                if e.is_transient() {
                    debug!(error = ?e, "the lock watch failed; reading it with backoff until it recovers");
                } else if !self.warned {
                    self.warned = true;
                    warn!(error = ?e, "cannot watch the lock; reading it with backoff instead");
                }
                let backoff = &mut self.backoff;
                self.poll_at
                    .get_or_insert_with(|| Instant::now() + backoff.next_delay());
                LockState::Unseen
            }
        }
    }
}
