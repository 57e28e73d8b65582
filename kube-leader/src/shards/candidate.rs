//! [`Shards`]: one candidate for a set of shard Leases — its settings, names and validation —
//! and the two ways to start it ([`Shards::start`], [`Shards::run`]). The campaign itself runs
//! in the background [`engine`](super::engine).

use std::future::Future;

use futures::{stream::FuturesUnordered, StreamExt};
use kube::Client;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info_span, Instrument};

use super::{
    assignments::{Assignments, ShardSet},
    config::{ShardsConfig, MAX_SHARDS},
    engine::{Engine, Spec},
};
use crate::{
    discovery,
    error::{invalid, Error, Result},
    leadership::{Strategy, Term},
    lock::{self, LockRef},
    unelected::unelected,
};

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
/// All Leases of the set carry the label [`SHARDS_LABEL`](super::SHARDS_LABEL)` = <name>` and are followed with one
/// list/watch; every renewal goes through one scheduler that spreads them evenly over the retry
/// period, bounds the calls in flight and pauses when the API server answers 429 or 5xx,
/// without ever letting that pause cost a shard (see [`ShardsConfig`]).
///
/// Each held shard comes as its index and a [`Leadership`], with its own loss token and fencing token
/// (the `resourceVersion` of the write that acquired it), lost by the same fail-stop rule as a
/// [`LeaseElector`](crate::LeaseElector)'s leadership: when its renew deadline passes without a
/// successful renewal, or as soon as another holder (or another process with this identity)
/// writes it. A shard handed over or given up on shutdown is released only once its
/// `Leadership` is dropped or released, i.e. once the work on it has stopped.
///
/// [`Leadership`]: crate::Leadership
///
/// ```no_run
/// # async fn run(client: kube::Client) -> kube_leader::Result<()> {
/// use kube_leader::Shards;
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
///
/// # Permissions
///
/// The Role a candidate of the set `my-controller` needs, as
/// `kube-leader rbac --shards 64 --lock my-controller` prints it (the comments shortened; with
/// `--identity` for each candidate, the `get`, `update`, `delete` rule is limited to the set's
/// own Leases by name):
///
/// ```yaml
/// apiVersion: rbac.authorization.k8s.io/v1
/// kind: Role
/// metadata:
///   name: kube-leader-shards-my-controller
/// rules:
///   # create: the shard Leases and each candidate's membership Lease
///   - apiGroups: ["coordination.k8s.io"]
///     resources: ["leases"]
///     verbs: ["create"]
///   # list, watch: one list/watch of the set's Leases by their label kube-leader.io/shards
///   - apiGroups: ["coordination.k8s.io"]
///     resources: ["leases"]
///     verbs: ["list", "watch"]
///   # get: re-reads after a conflict; update: take over, renew and release the shards, renew
///   # the membership Lease; delete: remove the membership Lease on shutdown
///   - apiGroups: ["coordination.k8s.io"]
///     resources: ["leases"]
///     verbs: ["get", "update", "delete"]
/// ```
#[derive(Clone)]
pub struct Shards {
    pub(super) client: Client,
    pub(super) name: String,
    pub(super) count: u32,
    namespace: Option<String>,
    identity: Option<String>,
    pub(super) config: ShardsConfig,
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

    /// The settings in force.
    pub(crate) fn settings(&self) -> &ShardsConfig {
        &self.config
    }

    /// How many shards the set has.
    pub(crate) fn count(&self) -> u32 {
        self.count
    }

    /// The name of shard `index`'s Lease: `<name>-<index>`.
    pub(crate) fn lease_name(&self, index: u32) -> String {
        format!("{}-{index}", self.name)
    }

    /// The namespace of the Leases (resolved as documented in [`new`](Self::new)).
    pub(crate) fn resolved_namespace(&self) -> String {
        discovery::namespace_or_default(self.namespace.as_deref(), &self.client)
    }

    /// This candidate's identity (resolved as documented in [`new`](Self::new)).
    pub(crate) fn resolved_identity(&self) -> Result<String> {
        discovery::resolve_identity(self.identity.as_deref()).ok_or_else(|| {
            invalid(
                "identity",
                "identity must not be empty (set it, or POD_NAME, or a host name)",
            )
        })
    }

    /// Checks the settings and names without sending anything.
    pub(crate) fn validate(&self) -> Result<()> {
        self.config.validate()?;
        if self.count == 0 || self.count > MAX_SHARDS {
            return Err(invalid(
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
    /// ([`LossReason::Cancelled`]); each is renewed until its `Leadership` is dropped or released
    /// (at most [`LeaseConfig::shutdown_grace`](crate::LeaseConfig::shutdown_grace)) and then released; the membership Lease is
    /// deleted and the background task ends ([`Assignments::finish`]).
    ///
    /// [`LossReason::Cancelled`]: crate::LossReason::Cancelled
    pub fn start(&self, shutdown: &CancellationToken) -> Result<Assignments> {
        self.validate()?;
        let identity = self.resolved_identity()?;
        let namespace = self.resolved_namespace();
        let (out, rx) = mpsc::unbounded_channel();
        if !self.config.lease.election {
            return Ok(self.start_unelected(shutdown, &namespace, identity));
        }
        let (held_tx, held) = watch::channel(ShardSet::default());
        let span = info_span!("shards", set = %self.name, identity = %identity, shards = self.count);
        let spec = Spec {
            // The engine's calls read an overloaded server's `Retry-After` (its pause).
            client: crate::api::keeping_retry_after(self.client.clone()),
            name: self.name.clone(),
            count: self.count,
            config: self.config.clone(),
        };
        let engine = Engine::new(spec, namespace, identity, out, held_tx);
        let task = tokio::spawn(engine.run(shutdown.clone()).instrument(span));
        Ok(Assignments::new(rx, held, task))
    }

    /// Every shard at once, for a candidate whose election is disabled: held until shutdown.
    fn start_unelected(
        &self,
        shutdown: &CancellationToken,
        namespace: &str,
        identity: String,
    ) -> Assignments {
        let (out, rx) = mpsc::unbounded_channel();
        let mut set = ShardSet {
            members: 1,
            quota: self.count,
            ..ShardSet::default()
        };
        for index in 0..self.count {
            let lock = LockRef {
                namespace: namespace.to_string(),
                name: self.lease_name(index),
            };
            let leadership = unelected(Strategy::Lease, lock, identity.clone(), shutdown);
            set.held.insert(index, 0);
            // The receiver is ours, in the Assignments returned below.
            let _ = out.send((index, leadership));
        }
        let (held_tx, held) = watch::channel(set);
        let shutdown = shutdown.clone();
        let task = tokio::spawn(async move {
            shutdown.cancelled().await;
            held_tx.send_replace(ShardSet::default());
            drop(out);
            Ok(())
        });
        Assignments::new(rx, held, task)
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
                    Some((index, leadership)) => {
                        let fut = work(index, leadership.term().clone(), leadership.lost_token());
                        running.push(async move {
                            fut.await;
                            drop(leadership);
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
