//! The leader-for-life candidate: its settings, and finding its lock, namespace and Pod.

use std::{
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::SystemTime,
};

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, info_span, Instrument};

mod lead;

use super::{
    campaign::{Election, Settings},
    config::{Environment, ForLifeConfig, OutsideCluster},
    keeper::OwnPodWatch,
    kubelet,
    own_pod::own_pod,
};
use crate::{
    discovery::{self, NamespaceSource},
    error::{Error, Result},
    leadership::{Leadership, Strategy, Term},
    lock::{self, LockRef},
    observer::{Hooks, Observer},
    successor::{CandidatePod, Registration, Registry, Successor},
};

/// A candidate for leader for life: operator-sdk's `leader.Become`, watch-driven.
///
/// The leader is the Pod that created the lock, a ConfigMap whose single owner reference is
/// that Pod. It leads until the lock goes: normally when its Pod is deleted and Kubernetes'
/// garbage collector deletes the lock with it. Waiting candidates watch the lock and the
/// leader's Pod, and take over as soon as the lock is deleted, or delete it themselves (with a
/// UID precondition) once the leader Pod is gone or has terminated and its containers are known
/// to be gone: its leader [released](crate::Leadership::release) the lock, its graceful deletion
/// completed, its opt-in [liveness heartbeat](ForLifeConfig::liveness) lapsed, or its grace period (plus
/// 2 s) has passed since that end was seen.
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
/// [`identity`](Self::identity) or `POD_NAME` (set it with the Downward API), and recognised by
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
/// `get, list, watch, delete` on Pods and `create` on Events; see `kube-leader rbac --strategy for-life`.
///
/// A clone is the same candidate (it shares what it learnt, such as Nodes being unreadable);
/// changing a setting (any builder method) makes a new candidate with state of its own.
///
/// # Permissions
///
/// The Role a candidate for the lock `my-operator` needs, as
/// `kube-leader rbac --strategy for-life --lock my-operator` prints it (the Events rule only for
/// [`events`](Self::events), on by default):
///
/// ```yaml
/// apiVersion: rbac.authorization.k8s.io/v1
/// kind: Role
/// metadata:
///   name: kube-leader-for-life-my-operator
/// rules:
///   # create: become leader (create cannot be limited by name)
///   - apiGroups: [""]
///     resources: ["configmaps"]
///     verbs: ["create"]
///   # the lock only: get, list, watch it (by name, with a field selector); update: write the
///   # fencing token and the liveness heartbeat; delete: remove a stale lock (UID precondition)
///   # and step down
///   - apiGroups: [""]
///     resources: ["configmaps"]
///     resourceNames: ["my-operator"]
///     verbs: ["get", "list", "watch", "update", "delete"]
///   # get: the candidate's own Pod (its UID owns the lock) and the leader Pod; list, watch:
///   # waiting candidates watch the leader Pod; delete: an evicted leader Pod
///   - apiGroups: [""]
///     resources: ["pods"]
///     verbs: ["get", "list", "watch", "delete"]
///   # best-effort LeaderElection Events on the lock (as client-go records them)
///   - apiGroups: [""]
///     resources: ["events"]
///     verbs: ["create"]
///   # Successor::Youngest (the default): each candidate's registration, a Lease
///   # my-operator-candidate-HASH owned by its Pod; create, patch: register and heartbeat;
///   # delete: withdraw it when stopping; list, watch: a leader watches the registrations for
///   # its term and, stepping down, names the youngest candidate. Successor::Any needs none
///   - apiGroups: ["coordination.k8s.io"]
///     resources: ["leases"]
///     verbs: ["create", "list", "watch", "patch", "delete"]
/// ```
#[derive(Clone)]
pub struct ForLife {
    pub(crate) client: Client,
    name: String,
    namespace: Option<String>,
    /// This candidate's Pod name.
    identity: Option<String>,
    /// Where the namespace and Pod name come from when not set (tests: not this process).
    environment: Option<Environment>,
    pub(super) config: ForLifeConfig,
    /// Set once reading Nodes was refused: the NotReady takeover is off from then on.
    pub(super) node_check_disabled: Arc<AtomicBool>,
    /// Whether a terminal phase the kubelet wrote is proof that a Pod's containers stopped: read
    /// from the API server's version on the first campaign ([`kubelet`](super::kubelet)).
    kubelet_terminal_proof: Arc<tokio::sync::OnceCell<bool>>,
    /// The observer and the Events (see [`observer`](Self::observer), [`events`](Self::events)).
    hooks: Hooks,
    /// This candidate's registration ([`Successor::Youngest`]), from its first campaign until
    /// shutdown, or until it stops because its Pod is ending.
    registration: Arc<tokio::sync::Mutex<Option<Registration>>>,
}

impl std::fmt::Debug for ForLife {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForLife")
            .field("name", &self.name)
            .field("namespace", &self.namespace)
            .field("identity", &self.identity)
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
    /// A candidate for the lock ConfigMap `name`, with operator-sdk's defaults
    /// ([`ForLifeConfig::default`]). The name is checked when campaigning.
    #[must_use]
    pub fn new(client: Client, name: impl Into<String>) -> Self {
        Self {
            hooks: Hooks::new(&client),
            client,
            name: name.into(),
            namespace: None,
            identity: None,
            environment: None,
            config: ForLifeConfig::default(),
            node_check_disabled: Arc::new(AtomicBool::new(false)),
            kubelet_terminal_proof: Arc::default(),
            registration: Arc::default(),
        }
    }

    /// Calls `observer` with what this candidate observes about its own leadership, for
    /// metrics of your own: see [`observer`](crate::observer).
    #[must_use]
    pub fn observer(mut self, observer: impl Observer) -> Self {
        self.node_check_disabled = Arc::default();
        self.hooks.set_observer(Arc::new(observer));
        self
    }

    /// Whether to record client-go's `LeaderElection` Events on the lock, "POD became leader"
    /// and "POD stopped leading" (default `true`; needs `create events`, see
    /// [`LeaseElector::events`](crate::LeaseElector::events)).
    #[must_use]
    pub fn events(mut self, record: bool) -> Self {
        self.node_check_disabled = Arc::default();
        self.hooks.set_events(record, &self.client);
        self
    }

    /// The component that reports this candidate's Events (their `source.component` and
    /// `reportingComponent`), e.g. your operator's name. Default: the running binary's file name
    /// ([`std::env::current_exe`] without its extension), else `kube-leader`.
    #[must_use]
    pub fn event_reporter(mut self, reporter: impl Into<String>) -> Self {
        self.node_check_disabled = Arc::default();
        self.hooks
            .set_event_reporter(reporter.into().into(), &self.client);
        self
    }

    /// Sets all options at once.
    #[must_use]
    pub fn config(mut self, config: ForLifeConfig) -> Self {
        self.node_check_disabled = Arc::default();
        self.config = config;
        self
    }

    /// Sets the namespace of the lock and of this candidate's Pod.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.node_check_disabled = Arc::default();
        self.namespace = Some(namespace.into());
        self
    }

    /// Sets this candidate's identity: for leader for life, its Pod's name (instead of
    /// `POD_NAME`).
    #[must_use]
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.node_check_disabled = Arc::default();
        self.identity = Some(identity.into());
        self
    }

    /// Sets where the namespace and Pod name come from when not set (tests).
    #[must_use]
    pub(crate) fn environment(mut self, environment: Environment) -> Self {
        self.node_check_disabled = Arc::default();
        self.environment = Some(environment);
        self
    }

    /// The lock this candidate campaigns for: its namespace as [`become_leader`](Self::become_leader)
    /// finds it (set, else `POD_NAMESPACE`, else the service-account file).
    ///
    /// # Errors
    /// [`Error::NoNamespace`] outside a cluster; an invalid lock name.
    pub(crate) fn lock(&self) -> Result<LockRef> {
        let env = self.environment_in_force();
        let (namespace, _) =
            discover_namespace(self.namespace.as_deref(), &env).ok_or_else(|| Error::NoNamespace {
                path: namespace_file(&env),
            })?;
        LockRef::new(namespace, self.name.clone())
    }

    /// This candidate's identity: the name of its Pod (set, else `POD_NAME`).
    ///
    /// # Errors
    /// [`Error::NoPodName`] when there is none, as [`become_leader`](Self::become_leader).
    pub(crate) fn resolved_identity(&self) -> Result<String> {
        self.pod_name_in(&self.environment_in_force())
            .filter(|n| !n.is_empty())
            .ok_or(Error::NoPodName)
    }

    /// The environment namespace and Pod name come from (see [`environment`](Self::environment)).
    fn environment_in_force(&self) -> Environment {
        self.environment.clone().unwrap_or_else(Environment::from_process)
    }

    /// The namespace and Pod name set must not be empty, the lock's name must be valid.
    fn validate_names(&self) -> Result<()> {
        if self.namespace.as_deref().is_some_and(|n| n.trim().is_empty()) {
            return Err(crate::error::invalid("namespace", "namespace must not be empty"));
        }
        if self.identity.as_deref().is_some_and(|n| n.trim().is_empty()) {
            return Err(crate::error::invalid(
                "identity",
                "the Pod name must not be empty",
            ));
        }
        lock::validate_name(&self.name)
    }

    /// This candidate's Pod name, trimmed: set, else from `env`.
    fn pod_name_in(&self, env: &Environment) -> Option<String> {
        self.identity
            .clone()
            .or_else(|| env.pod_name.clone())
            .map(|n| n.trim().to_string())
    }

    /// The options in force.
    pub(crate) fn settings(&self) -> &ForLifeConfig {
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
    /// operator-sdk's semantics); [`Leadership::release`] deletes the lock (explicit step-down).
    ///
    /// `shutdown` is composable: cancelled while waiting, this returns
    /// [`Error::Cancelled`] at once; cancelled while leading, leadership ends with
    /// [`LossReason::Cancelled`](crate::LossReason::Cancelled) and the lock stays until the Pod is deleted or the handle is
    /// released.
    ///
    /// Outside a cluster (no namespace found) this skips the election by default, as operator-sdk
    /// does: see [`OutsideCluster`].
    ///
    /// # Cancellation safety
    /// Cancel-safe while waiting: dropping the future (or cancelling `shutdown`) leaves nothing
    /// behind. If the lock was created just before, it stays, owned by this Pod: the next call
    /// from this Pod finds it and continues as leader, and it goes with the Pod otherwise.
    pub async fn become_leader(&self, shutdown: &CancellationToken) -> Result<Leadership> {
        self.config.validate()?;
        self.validate_names()?;
        let env = self.environment_in_force();
        let pod_name = self.pod_name_in(&env);
        let found = discover_namespace(self.namespace.as_deref(), &env);
        if !self.config.election {
            let namespace = found.map_or_else(|| self.client.default_namespace().to_string(), |(ns, _)| ns);
            let identity = discovery::resolve_identity(pod_name.as_deref()).unwrap_or_default();
            let lock = LockRef::new(namespace, self.name.clone())?;
            return Ok(crate::unelected::unelected(
                Strategy::ForLife,
                lock,
                identity,
                shutdown,
            ));
        }
        let Some((namespace, source)) = found else {
            return self.skip_or_fail(&env, pod_name);
        };
        let pod_name = pod_name.filter(|n| !n.is_empty()).ok_or(Error::NoPodName)?;
        let lock = LockRef::new(namespace, self.name.clone())?;
        let span = info_span!("leader_for_life", lock = %lock, pod = %pod_name);
        // On the heap: the campaign's state (watches, registration) is large, and callers join
        // many of these in one task.
        let campaign = Box::pin(
            self.campaign(lock.clone(), pod_name, source, shutdown.clone())
                .instrument(span),
        );
        let result = tokio::select! {
            biased;
            () = shutdown.cancelled() => {
                info!(lock = %lock, "cancelled while waiting for leadership");
                Err(Error::Cancelled { lock: lock.to_string() })
            }
            r = campaign => r,
        };
        if matches!(result, Err(Error::Cancelled { .. } | Error::Stopping { .. })) {
            // Stopping: no leader may prefer this candidate any more.
            let registration = self.registration.lock().await.take();
            if let Some(r) = registration {
                r.withdraw().await;
            }
        }
        result
    }

    fn skip_or_fail(&self, env: &Environment, pod_name: Option<String>) -> Result<Leadership> {
        let path = namespace_file(env);
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
        shutdown: CancellationToken,
    ) -> Result<Leadership> {
        info!(namespace_from = ?source, "trying to become the leader");
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &lock.namespace);
        let (me, created) = own_pod(&pods, &lock, &pod_name, &self.config).await?;
        debug!(uid = %me.uid, "found this candidate's Pod");
        let registry = (self.config.successor == Successor::Youngest)
            .then(|| Registry::new(self.client.clone(), &lock, "ConfigMap", self.config.api_timeout));
        if let Some(registry) = &registry {
            let mut registration = self.registration.lock().await;
            if registration.is_none() && !shutdown.is_cancelled() {
                let mut pod = CandidatePod::new(me.name.clone(), me.uid.clone());
                pod.created = created;
                *registration = Some(registry.register(&me.name, Some(&pod), &shutdown).await);
            }
        }
        let kubelet_terminal_proof = *self
            .kubelet_terminal_proof
            .get_or_init(|| kubelet::terminal_phase_is_proof(&self.client, self.config.api_timeout))
            .await;
        let settings = Settings {
            client: &self.client,
            config: &self.config,
            node_check_disabled: &self.node_check_disabled,
            kubelet_terminal_proof,
        };
        let mut election = Election::new(settings, lock, me, pods);
        let won = election.run().await?;
        // The campaign's watch of this Pod goes on in the keeper: one watch for the whole run,
        // not one closed and another opened at the moment of winning. (The lock watch does
        // not: events of a lock the campaign replaced may still be queued in it.)
        let own_pod = OwnPodWatch {
            watch: election.own_pod,
            refused: election.own_pod_refused,
        };
        let hold = self.registration.lock().await.as_ref().map(Registration::hold);
        let registry = registry.map(|r| (r, hold));
        Ok(self.lead(election.lock, election.me, won, own_pod, registry, shutdown))
    }
}

/// The service-account namespace file `env` names, for messages (`(none)`).
fn namespace_file(env: &Environment) -> String {
    env.service_account_namespace_file
        .as_ref()
        .map_or_else(|| "(none)".to_string(), |p| p.display().to_string())
}

/// The namespace, from the explicit option, `POD_NAMESPACE` or the service-account file.
fn discover_namespace(explicit: Option<&str>, env: &Environment) -> Option<(String, NamespaceSource)> {
    // A missing file reads as "not in a cluster", as does no file at all.
    let file = env
        .service_account_namespace_file
        .as_deref()
        .unwrap_or(Path::new(""));
    discovery::discover_namespace_from(explicit, env.pod_namespace.as_deref(), file)
}
