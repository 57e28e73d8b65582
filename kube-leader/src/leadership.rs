//! The handle a leader holds: who leads, with which fencing token, and when it stops leading.

use std::{
    fmt,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, SystemTime},
};

use tokio::{sync::watch, task::JoinHandle, time::Instant};
use tokio_util::sync::CancellationToken;

use crate::{error::Result, lock::LockRef};

pub use crate::strategy::Strategy;

/// Why leadership ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// The lock object was deleted while held (an administrator, or a takeover policy).
    LockDeleted,
    /// The lock object was replaced by another one (another UID, or another holder).
    LockReplaced {
        /// The new holder, if known.
        holder: Option<String>,
    },
    /// Another candidate holds the lease (seen in a watch event or on a conflicting write).
    OtherHolder {
        /// The identity of the new holder.
        holder: String,
    },
    /// The lease could not be renewed within the renew deadline (fail-stop).
    RenewDeadline {
        /// How long it has been since the last successful renewal was sent.
        since_last_renewal: Duration,
    },
    /// Leader for life: this candidate's own Pod is being deleted, is gone, was replaced, or
    /// reached a terminal phase (evicted): its lock goes next, and a successor may lead then.
    PodEnding {
        /// What happened to the Pod ("is being deleted", "is in phase Failed (Evicted)", ...).
        why: String,
    },
    /// Another process wrote the lock under this candidate's own identity: two candidates
    /// share one identity (a copied `--identity`, two containers of one Pod, host names under
    /// `hostNetwork`), and both would otherwise lead. Give every candidate a unique identity.
    DuplicateIdentity {
        /// The identity both use.
        identity: String,
    },
    /// The background task that keeps the lock stopped unexpectedly (it panicked): a bug in
    /// kube-leader, please report it. Leadership ends, since nobody confirms the lock any more.
    KeeperStopped {
        /// What happened to it.
        why: String,
    },
    /// Leadership was given up with [`Leadership::release`] or by dropping the handle.
    Released,
    /// The shutdown token passed to the elector was cancelled.
    Cancelled,
    /// Shards: this shard is handed over so that every candidate holds its fair share (a
    /// candidate joined); it is released once the work on it has stopped.
    Rebalanced,
    /// The Lease is managed by Kubernetes' coordinated leader election (`spec.strategy` is set)
    /// and names another candidate in `spec.preferredHolder`: this candidate steps down so that
    /// the controller's choice can lead. Release once the work has stopped, so that the
    /// controller hands the Lease over at once rather than after it expires.
    Yielded {
        /// The candidate `spec.preferredHolder` names.
        preferred: String,
    },
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::LockDeleted => f.write_str("the lock was deleted"),
            LossReason::LockReplaced { holder: Some(h) } => {
                write!(f, "the lock was replaced; now held by {h}")
            }
            LossReason::LockReplaced { holder: None } => f.write_str("the lock was replaced"),
            LossReason::OtherHolder { holder } => write!(f, "{holder} holds the lease"),
            LossReason::RenewDeadline { since_last_renewal } => {
                write!(f, "the lease was not renewed within the renew deadline ({since_last_renewal:?} since the last renewal)")
            }
            LossReason::PodEnding { why } => write!(f, "this candidate's Pod {why}"),
            LossReason::DuplicateIdentity { identity } => write!(
                f,
                "another process holds the lock under this candidate's identity {identity:?}; \
                 every candidate needs a unique identity"
            ),
            LossReason::KeeperStopped { why } => {
                write!(f, "the task keeping the lock {why} (a bug in kube-leader)")
            }
            LossReason::Released => f.write_str("released"),
            LossReason::Cancelled => f.write_str("shutdown requested"),
            LossReason::Rebalanced => f.write_str("handed over to rebalance the shards"),
            LossReason::Yielded { preferred } => write!(
                f,
                "coordinated leader election prefers {preferred} (spec.preferredHolder)"
            ),
        }
    }
}

/// What a leader knows about its term.
///
/// Built by the electors only; the struct may gain fields in a minor release.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Term {
    /// This candidate's identity (the Pod name for leader for life).
    pub identity: String,
    /// The lock held.
    pub lock: LockRef,
    /// The strategy that elected it.
    pub strategy: Strategy,
    /// A number greater for every later leader of the same lock; see
    /// [`Leadership::fencing_token`].
    pub fencing_token: u64,
    /// When this candidate became leader (or found its own lock after a restart).
    pub acquired_at: SystemTime,
}

/// What is known about the current leader of a lock, by anybody who can read it.
///
/// Built by the electors only; the struct may gain fields in a minor release.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaderInfo {
    /// The strategy of the lock.
    pub strategy: Strategy,
    /// The lock.
    pub lock: LockRef,
    /// The current holder's identity; `None` when nobody holds the lock (absent or released).
    pub holder: Option<String>,
    /// The fencing token of the holder's term (see [`Leadership::fencing_token`]), as the lock
    /// tells it: always known for leader for life; for a Lease, once the holder's first renewal
    /// stored it (a retry period after its takeover), and never for a client-go holder.
    pub fencing_token: Option<u64>,
    /// When the holder acquired the lock, by its own wall clock.
    pub acquired_at: Option<SystemTime>,
    /// When the holder last renewed (Lease only), by its own wall clock.
    pub renewed_at: Option<SystemTime>,
    /// The holder's advertised lease duration (Lease only).
    pub lease_duration: Option<Duration>,
}

// === impl LeaderInfo ===

impl LeaderInfo {
    /// A lock of `strategy` that nobody holds; set the other fields that are known.
    #[must_use]
    pub(crate) fn new(strategy: Strategy, lock: LockRef) -> Self {
        Self {
            strategy,
            lock,
            holder: None,
            fencing_token: None,
            acquired_at: None,
            renewed_at: None,
            lease_duration: None,
        }
    }
}

/// The sending half of a leadership: held by the strategy's keeper (the background task that
/// keeps the term: renews a Lease, watches a leader-for-life lock), which ends the term with it.
///
/// Dropped without having ended leadership (the task panicked, or ended by a path that forgot
/// to say why), it ends leadership with [`LossReason::KeeperStopped`]: nobody confirms the
/// lock any more, so nobody may act on it.
#[derive(Debug)]
pub(crate) struct KeeperHandle {
    lost: CancellationToken,
    reason: watch::Sender<Option<LossReason>>,
    release_requested: Arc<AtomicBool>,
    /// Until when the term is confirmed (see [`Leadership::confirmations`]).
    confirmed: watch::Sender<Option<Instant>>,
    /// `false` for a skipped election, which has no task and never ends.
    armed: bool,
}

impl Drop for KeeperHandle {
    fn drop(&mut self) {
        if self.armed && !self.is_lost() {
            let why = if std::thread::panicking() {
                "panicked"
            } else {
                "ended without a reason"
            };
            tracing::error!(
                why,
                "the task keeping the lock stopped unexpectedly; no longer leading"
            );
            self.lose(LossReason::KeeperStopped { why: why.into() });
        }
    }
}

impl KeeperHandle {
    /// Ends leadership with `reason`, once; later calls are ignored.
    pub(crate) fn lose(&self, reason: LossReason) {
        let first = self.reason.send_if_modified(|r| {
            if r.is_some() {
                return false;
            }
            *r = Some(reason.clone());
            true
        });
        if first {
            self.lost.cancel();
        }
    }

    /// Why leadership ended, if it has.
    pub(crate) fn reason(&self) -> Option<LossReason> {
        self.reason.borrow().clone()
    }

    /// Whether `done` fired because of [`Leadership::release`] (an explicit step-down) rather
    /// than because the handle was dropped. Leader for life deletes its lock only on release.
    pub(crate) fn release_requested(&self) -> bool {
        self.release_requested.load(Ordering::Acquire)
    }

    /// Whether leadership has already ended.
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// The term is confirmed until `at` (a successful write sent at `sent` confirms it until
    /// `sent` + the renew deadline). Never moves the instant back.
    pub(crate) fn confirm_until(&self, at: Instant) {
        self.confirmed.send_if_modified(|c| {
            if c.is_some_and(|c| c >= at) {
                return false;
            }
            *c = Some(at);
            true
        });
    }
}

/// Being the leader.
///
/// Returned by [`ForLife::become_leader`](crate::ForLife::become_leader),
/// [`LeaseElector::become_leader`](crate::LeaseElector::become_leader), and for each shard by
/// [`Assignments::next`](crate::Assignments::next). It carries the
/// identity and the [fencing token](Self::fencing_token), and a token that is cancelled the moment
/// leadership is lost, so work gated on it stops.
///
/// Dropping the handle steps down: a lease is released (after renewals stop), a shard is released
/// (its work has stopped), and the watch on a leader-for-life lock ends (the lock itself lives
/// until the Pod is deleted, as with operator-sdk).
/// Call [`release`](Self::release) to step down and wait until that is done.
#[must_use = "dropping the Leadership steps down at once"]
pub struct Leadership {
    term: Arc<Term>,
    skipped: bool,
    lost: CancellationToken,
    reason: watch::Receiver<Option<LossReason>>,
    /// Tells the background task that the user's work is over: stop and release.
    done: CancellationToken,
    /// Set before `done` fires when the step-down is explicit ([`Leadership::release`]).
    release_requested: Arc<AtomicBool>,
    confirmed: watch::Receiver<Option<Instant>>,
    task: Option<JoinHandle<Result<()>>>,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("term", &self.term)
            .field("skipped", &self.skipped)
            .field("lost", &self.reason.borrow().clone())
            .finish()
    }
}

// === impl Leadership ===

impl Leadership {
    /// Starts a term: the handle, and the strategy's keeper spawned in `span`. The keeper gets
    /// the [`KeeperHandle`] that ends the term and a token cancelled when the handle is dropped
    /// or released; the handle's [`release`](Self::release) waits for the keeper to end.
    pub(crate) fn spawn<F, Fut>(term: Term, span: tracing::Span, keeper: F) -> Self
    where
        F: FnOnce(KeeperHandle, CancellationToken) -> Fut,
        Fut: std::future::Future<Output = Result<()>> + Send + 'static,
    {
        use tracing::Instrument;
        let (this, handle, done) = Self::new(term);
        let task = tokio::spawn(keeper(handle, done).instrument(span));
        this.with_task(task)
    }

    /// A new leadership and the keeper side for the background task.
    pub(crate) fn new(term: Term) -> (Self, KeeperHandle, CancellationToken) {
        let lost = CancellationToken::new();
        let (tx, rx) = watch::channel(None);
        let done = CancellationToken::new();
        let release_requested = Arc::new(AtomicBool::new(false));
        let (confirmed, confirmed_rx) = watch::channel(None);
        let this = Self {
            term: Arc::new(term),
            skipped: false,
            lost: lost.clone(),
            reason: rx,
            done: done.clone(),
            release_requested: release_requested.clone(),
            confirmed: confirmed_rx,
            task: None,
        };
        (
            this,
            KeeperHandle {
                lost,
                reason: tx,
                release_requested,
                confirmed,
                armed: true,
            },
            done,
        )
    }

    /// Attaches the background task that keeps (renews or watches) the lock.
    pub(crate) fn with_task(mut self, task: JoinHandle<Result<()>>) -> Self {
        self.task = Some(task);
        self
    }

    /// The leadership of a candidate that skipped the election because it does not run in a
    /// cluster (operator-sdk's behaviour, see [`OutsideCluster::Skip`](crate::OutsideCluster::Skip)).
    /// It is never lost and its fencing token is 0.
    pub(crate) fn skipped(term: Term) -> Self {
        // No keeper task: the reason stays `None` and `lost()` waits forever.
        let (mut this, mut keeper, _done) = Self::new(term);
        keeper.armed = false;
        this.skipped = true;
        this
    }

    /// Marks a leadership that no election produced (see [`is_skipped`](Self::is_skipped)).
    pub(crate) fn mark_skipped(mut self) -> Self {
        self.skipped = true;
        self
    }

    /// Why leadership ended, as it becomes known (for the observer hook).
    pub(crate) fn loss_watch(&self) -> watch::Receiver<Option<LossReason>> {
        self.reason.clone()
    }

    /// Returns this term: who leads which lock, since when, with which fencing token.
    pub fn term(&self) -> &Term {
        &self.term
    }

    /// The fencing token of this term: greater for every later leader of the same lock.
    ///
    /// Attach it to writes that must not be made by a deposed leader: a store that remembers the
    /// highest token it has seen and rejects lower ones turns "two leaders for a moment" into
    /// "the old leader's late writes are rejected".
    ///
    /// - Lease: the `resourceVersion` of the write (create or update) that made this candidate
    ///   leader; its renewals store it in the Lease as `kube-leader.io/fencing-token` for
    ///   observers. (Not `leaseTransitions`: a Lease that an administrator deleted is created
    ///   again with a count starting over, and a fenced store would then refuse the legitimate
    ///   leader.)
    /// - Leader for life: the `resourceVersion` the lock ConfigMap was created with (stored in
    ///   the lock as `kube-leader.io/fencing-token`).
    ///
    /// With etcd3 storage a `resourceVersion` is etcd's global revision, which only grows, also
    /// across deletion and re-creation of the lock; Kubernetes calls resource versions opaque,
    /// so this holds for etcd-backed API servers and does not survive restoring etcd from a
    /// backup.
    ///
    /// Absent (0, which no etcd revision is) when no election took place
    /// ([`is_skipped`](Self::is_skipped)).
    pub fn fencing_token(&self) -> u64 {
        self.term.fencing_token
    }

    /// Returns `client` with this term's fencing token on every request, so that the
    /// `kube-leader fence` webhook refuses its writes once a later leader wrote or the lock
    /// moved on.
    ///
    /// `user` is the writer's own user: `system:serviceaccount:<namespace>:<name>` for a
    /// ServiceAccount. Each request impersonates `user` with the token as a user extra
    /// (`kube-leader.io/fencing-token`). Objects it creates or replaces, and the merge,
    /// strategic-merge and apply patches it sends, carry the token in the annotation
    /// `kube-leader.io/fenced-token`. It works on any client, for example one from
    /// `kube_leader::client::http2` or with layers of your own.
    ///
    /// ```no_run
    /// # async fn doc(leadership: kube_leader::Leadership, client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let client = leadership.fenced_client(client, "system:serviceaccount:app:orders")?;
    /// # let _ = client; Ok(())
    /// # }
    /// ```
    ///
    /// The writer needs `impersonate` on its own user (for a ServiceAccount: `serviceaccounts`
    /// with its name, in its namespace) and on `authentication.k8s.io`
    /// `userextras/kube-leader.io/fencing-token` (a ClusterRole). `kube-leader rbac --fence`
    /// prints both. Impersonation replaces the caller's groups, so grant the writer's
    /// permissions to its user or ServiceAccount, not to a group. A write refused by the fence
    /// fails with a 403 that names the lock, the tokens and the holder. See docs/fence.md.
    ///
    /// # Errors
    ///
    /// If `user` cannot be a header value (a control character).
    pub fn fenced_client(
        &self,
        client: kube::Client,
        user: impl Into<String>,
    ) -> std::result::Result<kube::Client, http::header::InvalidHeaderValue> {
        let layer = crate::fence::FencedLayer::new(user, self.fencing_token())?;
        Ok(crate::fence::fenced_client(client, &layer))
    }

    /// Whether no election took place: leader for life outside a cluster
    /// ([`OutsideCluster::Skip`](crate::OutsideCluster::Skip)), or the election
    /// [turned off](crate::LeaseConfig::election). The fencing token is then absent (0).
    pub fn is_skipped(&self) -> bool {
        self.skipped
    }

    /// Whether this candidate still leads.
    pub fn is_leader(&self) -> bool {
        !self.lost.is_cancelled()
    }

    /// A token cancelled the moment leadership is lost. Cancelling the returned token does not
    /// affect the election (it is a child token).
    pub fn lost_token(&self) -> CancellationToken {
        self.lost.child_token()
    }

    /// Why leadership ended, if it has.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.reason.borrow().clone()
    }

    /// Until when this term is confirmed (see [`confirmations`](Self::confirmations)).
    pub(crate) fn confirmed_until(&self) -> Option<Instant> {
        *self.confirmed.borrow()
    }

    /// Watches until when this term is confirmed, on this process's monotonic clock.
    ///
    /// The instant is the renew deadline counted from when the term's last successful write
    /// was *sent* (the acquiring write, then each renewal): client-go's fail-stop rule. Work
    /// that must not outlive leadership stops by this instant, even if the loss is not
    /// reported yet (a hung renewal is reported only when its deadline passes).
    ///
    /// - Lease and shards: `Some` once the term's first write succeeded.
    /// - Leader for life with a [liveness heartbeat](crate::ForLifeConfig::liveness): `Some`
    ///   from the lock's create (after a restart, from the first heartbeat), counted with the
    ///   liveness. It lapses while heartbeats fail, without a loss, and moves on with the next
    ///   heartbeat that gets through.
    /// - Leader for life without one, and a skipped election: `None`. The term lasts until its
    ///   loss is reported ([`lost`](Self::lost)).
    ///
    /// The value changes with every successful renewal. The sender goes away with the term.
    pub fn confirmations(&self) -> watch::Receiver<Option<Instant>> {
        self.confirmed.clone()
    }

    /// Waits until leadership is lost and tells why.
    ///
    /// # Cancellation safety
    /// Cancel-safe: dropping the future loses nothing.
    pub async fn lost(&self) -> LossReason {
        let mut rx = self.reason.clone();
        let seen = rx.wait_for(Option::is_some).await.map(|r| r.clone());
        match seen {
            Ok(r) => r.unwrap_or(LossReason::Released),
            // The keeper is gone without saying why: for a skipped election it never ends.
            Err(_) if self.skipped => std::future::pending().await,
            Err(_) => LossReason::Released,
        }
    }

    /// Steps down and waits until that is done: a lease is released (its holder cleared, so
    /// another candidate takes over at once); a leader-for-life lock is deleted (with a UID
    /// precondition, so a newer lock is never deleted by mistake).
    ///
    /// Call it once the work gated on this leadership has stopped.
    ///
    /// # Cancellation safety
    /// Not cancel-safe in the sense that, once called, stepping down goes on in the background
    /// even if the future is dropped.
    pub async fn release(mut self) -> Result<()> {
        self.release_requested.store(true, Ordering::Release);
        self.done.cancel();
        join(self.task.take()).await
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        // The user's work is over: let the keeper stop (and release a lease) in the background.
        self.done.cancel();
    }
}

/// Waits for a keeper task's result (`Ok` if there is none, or it was cancelled); a panic in it
/// goes on in the caller.
pub(crate) async fn join(task: Option<JoinHandle<Result<()>>>) -> Result<()> {
    match task {
        Some(task) => match task.await {
            Ok(r) => r,
            Err(join) if join.is_cancelled() => Ok(()),
            Err(join) => std::panic::resume_unwind(join.into_panic()),
        },
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests;
