//! The Lease candidate: its settings, and what it shows while it campaigns and leads.

use std::{future::Future, sync::Arc, time::Duration};

use kube::Client;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info_span, Instrument};

use super::{
    campaign::Campaign,
    config::LeaseConfig,
    coordinated::{self},
    shared::{Renewals, Shared},
};
use crate::{
    discovery,
    error::{Error, Result},
    leadership::{LeaderInfo, Leadership, Strategy, Term},
    lock::LockRef,
    observer::{Hooks, Observer},
    successor::{CandidatePod, Registry, Successor},
    unelected::unelected,
};

/// Why the watchdog thinks this candidate is unhealthy (the sidecar's `/healthz`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
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
///
/// A clone is the same candidate: it shares [`observe`](Self::observe) and its state with the
/// original. Clone it to campaign in one task and observe from another. A setter makes a new
/// candidate with state of its own: `a.clone().identity("b")` shares nothing with `a`.
///
/// # Permissions
///
/// The Role a candidate for the Lease `my-operator` needs, as
/// `kube-leader rbac --strategy lease --lock my-operator` prints it (the Events rule only for
/// [`events`](Self::events), on by default):
///
/// ```yaml
/// apiVersion: rbac.authorization.k8s.io/v1
/// kind: Role
/// metadata:
///   name: kube-leader-lease-my-operator
/// rules:
///   # create: the first candidate creates the Lease (create cannot be limited by name)
///   - apiGroups: ["coordination.k8s.io"]
///     resources: ["leases"]
///     verbs: ["create"]
///   # get: status and re-reads after a conflict; update: take over, renew and release (the
///   # Lease's list and watch by candidates and the leader: the last rule)
///   - apiGroups: ["coordination.k8s.io"]
///     resources: ["leases"]
///     resourceNames: ["my-operator"]
///     verbs: ["get", "update"]
///   # best-effort LeaderElection Events on the Lease (as client-go records them)
///   - apiGroups: [""]
///     resources: ["events"]
///     verbs: ["create"]
///   # Successor::Youngest (the default): each candidate's registration, a Lease
///   # my-operator-candidate-HASH (created by the first rule); patch: its heartbeat; delete:
///   # withdraw it when stopping; list, watch: a leader watches the registrations for its term
///   # and, stepping down, names the youngest candidate; and the list and watch of the lock.
///   # With Successor::Any, the lock's rule takes `list` and `watch` and this rule goes
///   - apiGroups: ["coordination.k8s.io"]
///     resources: ["leases"]
///     verbs: ["list", "watch", "patch", "delete"]
/// ```
#[derive(Clone)]
pub struct LeaseElector {
    client: Client,
    name: String,
    namespace: Option<String>,
    identity: Option<String>,
    config: LeaseConfig,
    /// This candidate's Pod, for its registration (see [`candidate_pod`](Self::candidate_pod)).
    pod: Option<CandidatePod>,
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
            hooks: Hooks::new(&client),
            client,
            name: name.into(),
            namespace: None,
            identity: None,
            config: LeaseConfig::default(),
            pod: None,
            shared: Shared::new(),
        }
    }

    /// Sets the namespace of the Lease.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.shared = Shared::new();
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
        self.shared = Shared::new();
        self.identity = Some(identity.into());
        self
    }

    /// This candidate's Pod: its registration is owned by the Pod (deleted with it) and ordered
    /// by the Pod's creation time, if set. Without it the registration stays until this candidate
    /// withdraws it (a stale one is ignored) and counts from when it was first written.
    #[must_use]
    pub fn candidate_pod(mut self, pod: CandidatePod) -> Self {
        self.pod = Some(pod);
        self
    }

    /// Sets all timings and options at once.
    #[must_use]
    pub fn config(mut self, config: LeaseConfig) -> Self {
        self.shared = Shared::new();
        self.config = config;
        self
    }

    /// Calls `observer` with what this candidate observes about its own leadership (terms,
    /// renewals), for metrics of your own: see [`observer`](crate::observer).
    #[must_use]
    pub fn observer(mut self, observer: impl Observer) -> Self {
        self.shared = Shared::new();
        self.hooks.set_observer(Arc::new(observer));
        self
    }

    /// Whether to record client-go's `LeaderElection` Events on the Lease (default `true`).
    ///
    /// client-go's leader-election Events: `LeaderElection` on the lock object, "ID became
    /// leader" when a term starts and "ID stopped leading" when it ends, for both
    /// strategies, as client-go's `resourcelock` records them (so `kubectl describe lease NAME` and
    /// `kubectl get events` show the same history for Go and Rust candidates).
    ///
    /// They are core/v1 Events, as client-go's recorder writes them: kube's `events::Recorder`
    /// writes `events.k8s.io/v1` Events, which would need another grant (`create` and `patch` on
    /// `events.k8s.io` events) for the same information. Best effort: an Event never delays or
    /// fails the election; a refused one (no `create events`) is warned about once and not tried
    /// again by this elector.
    ///
    /// The Events are reported (`source.component` and `reportingComponent`) by the name given to
    /// the elector's `event_reporter` option, by default the running binary's file name
    /// ([`std::env::current_exe`] without its extension), else `kube-leader`.
    #[must_use]
    pub fn events(mut self, record: bool) -> Self {
        self.shared = Shared::new();
        self.hooks.set_events(record, &self.client);
        self
    }

    /// The component that reports this candidate's Events (their `source.component` and
    /// `reportingComponent`), e.g. your operator's name. Default: the running binary's file name
    /// ([`std::env::current_exe`] without its extension), else `kube-leader`.
    #[must_use]
    pub fn event_reporter(mut self, reporter: impl Into<String>) -> Self {
        self.shared = Shared::new();
        self.hooks
            .set_event_reporter(reporter.into().into(), &self.client);
        self
    }

    /// The timings and options in force.
    pub(crate) fn settings(&self) -> &LeaseConfig {
        &self.config
    }

    /// The lock this candidate campaigns for (namespace resolved as documented in [`new`](Self::new)).
    pub(crate) fn lock(&self) -> Result<LockRef> {
        let ns = discovery::namespace_or_default(self.namespace.as_deref(), &self.client);
        LockRef::new(ns, self.name.clone())
    }

    /// This candidate's identity (resolved as documented in [`new`](Self::new)).
    pub(crate) fn resolved_identity(&self) -> Result<String> {
        discovery::resolve_identity(self.identity.as_deref()).ok_or_else(|| Error::InvalidConfig {
            field: "identity",
            reason: "must not be empty (set it, or POD_NAME, or a host name)".into(),
        })
    }

    /// The current leader as this candidate last saw it (updated while it campaigns or leads).
    pub fn observe(&self) -> watch::Receiver<Option<LeaderInfo>> {
        self.shared.leader.subscribe()
    }

    /// Renewal figures of this candidate, updated on every renewal attempt: a heartbeat for
    /// supervisors and the source of renewal metrics.
    pub(crate) fn renewals(&self) -> watch::Receiver<Renewals> {
        self.shared.renewals.subscribe()
    }

    /// The election watchdog (client-go's `HealthzAdaptor`): unhealthy if this candidate believes
    /// it leads but has not renewed for longer than the lease duration plus `tolerance`.
    pub(crate) fn check_health(&self, tolerance: Duration) -> Result<(), Unhealthy> {
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
    /// [`LossReason::Cancelled`](crate::LossReason::Cancelled), renewals go on until the handle is dropped or released (at most
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
        if !self.config.election {
            return Ok(unelected(Strategy::Lease, lock, identity, shutdown));
        }
        let span = info_span!("lease_election", lock = %lock, identity = %identity);
        let campaign = async {
            // A coordinated candidate: the controller names the holder (no successor of ours).
            let coordinated = match &self.config.coordinated {
                Some(c) if !shutdown.is_cancelled() => {
                    let pod = self.pod.as_ref();
                    let timeout = self.config.call_timeout();
                    let register =
                        coordinated::register(&self.client, &lock, &identity, c, pod, timeout, shutdown);
                    self.shared.take_part(register).await?
                }
                _ => false,
            };
            let registry = (!coordinated && self.config.successor == Successor::Youngest)
                .then(|| Registry::new(self.client.clone(), &lock, "Lease", self.config.call_timeout()));
            if let Some(registry) = &registry {
                let pod = self.pod.as_ref();
                self.shared.register(registry, &identity, pod, shutdown).await;
            }
            let campaign = Campaign::new(
                self.client.clone(),
                self.config.clone(),
                self.shared.clone(),
                self.hooks.clone(),
                lock,
                identity.clone(),
            );
            let result = campaign
                .with_registry(registry)
                .coordinated(coordinated)
                .run(shutdown.clone())
                .await;
            if matches!(result, Err(Error::Cancelled { .. })) {
                // Stopping: no leader may prefer this candidate, nor the controller elect it.
                self.shared.withdraw().await;
                self.shared.withdraw_candidacy().await;
            }
            result
        };
        // On the heap: the campaign's state is large, and callers join many of these in a task.
        Box::pin(campaign.instrument(span)).await
    }

    /// Runs `work` whenever this candidate leads, until `shutdown`.
    ///
    /// `work` gets the term and a token that is cancelled when leadership is lost or on
    /// shutdown. It must return soon after. Only then is the Lease released, so work never
    /// overlaps the next leader's. After each term the candidate campaigns again.
    ///
    /// For one term only, call [`become_leader`](Self::become_leader) and
    /// [`Leadership::release`] yourself.
    ///
    /// # Cancellation safety
    /// Not cancel-safe: use `shutdown` to stop it.
    pub async fn run<F, Fut>(&self, shutdown: &CancellationToken, mut work: F) -> Result<()>
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
            if shutdown.is_cancelled() {
                return Ok(());
            }
        }
    }
}
