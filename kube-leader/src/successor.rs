//! Preferred successors: a leader that steps down hands over to the youngest live candidate.
//! How it works: see [`Successor`].

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference},
    jiff::Timestamp,
};
use kube::{
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    Api, Client,
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};

use crate::{
    api::{call, Failure, Op},
    lock::{LockRef, MANAGED_BY_LABEL},
};

mod choice;
mod names;
mod watch;

pub(crate) use choice::youngest;

use names::label_value;
#[cfg(test)]
use names::truncate_micros;
pub(crate) use names::{preferred_for, preferred_value, registration_name};

/// Label on a candidate registration: the name of the lock it is a candidate for (a hash of
/// the name when it is longer than a label value may be).
pub const CANDIDATE_FOR_LABEL: &str = "kube-leader.io/candidate-for";
/// Label on a candidate registration: the kind of its lock (`Lease` or `ConfigMap`).
pub const LOCK_KIND_LABEL: &str = "kube-leader.io/lock-kind";
/// Annotation on a released lock: `<release time> <identity>`, the successor the leader that
/// stepped down prefers. It counts only for the release it was written with (the lock's
/// `renewTime` for a Lease, the release mark's time for leader for life): a later release by a
/// client-go candidate, which keeps annotations it does not know, names nobody.
pub const PREFERRED_HOLDER_ANNOTATION: &str = "kube-leader.io/preferred-holder";
/// How often a leader, and a candidate without a Pod, renews its registration (a candidate
/// without a Pod counts as live for three of these).
pub const REGISTRATION_HEARTBEAT: Duration = Duration::from_secs(15);
/// The longest a leader stepping down waits for the consistent list of the registrations
/// before it chooses from its watch of them instead.
const FRESH_LIST_BOUND: Duration = Duration::from_secs(1);
/// How long after its last heartbeat a registration counts as live, in whole seconds.
const LIVE_SECONDS: i32 = 45;

/// Which candidate a leader that steps down hands over to.
///
/// # How it works
///
/// Preferred successors: a leader that steps down hands over to the youngest live candidate.
///
/// Most changes of leader are not crashes but rollouts: `kubectl rollout restart`, a new image,
/// a node drain. Without a preference, leadership hops from an old Pod to another old Pod that
/// the rollout terminates a moment later, and every hop stops and restarts the work. With one,
/// a leader stepping down names the youngest live candidate (a Pod of the newest ReplicaSet in
/// a rolling update) in its release, and that candidate takes over at once; the others defer
/// to it for a short, bounded [`successor_wait`](crate::LeaseConfig::successor_wait).
///
/// How candidates learn of each other: every candidate keeps a **registration**, a Lease of its
/// own beside the lock (the mechanics of Kubernetes' `LeaseCandidate`, emulated with
/// `coordination.k8s.io/v1` Leases, which every API server since 1.14 serves):
///
/// | field | meaning |
/// | --- | --- |
/// | name | `<lock>-candidate-<16 hex digits of a hash of the lock kind and identity>` |
/// | labels | `CANDIDATE_FOR_LABEL` (the lock's name, or a hash of a longer one) and `LOCK_KIND_LABEL` |
/// | `spec.holderIdentity` | the candidate's identity |
/// | `spec.acquireTime` | the candidate's age: its Pod's creation time where known, else its first registration |
/// | `spec.renewTime` | when it was last written |
/// | `spec.leaseDurationSeconds` | unset for a candidate with a Pod: live while the registration exists; else how long after `renewTime` it counts as live (three heartbeats) |
/// | `ownerReferences` | its Pod, where known: the registration goes with the Pod |
///
/// A candidate registers before its first election result (so a Pod that is `Ready` by the
/// sidecar's `/readyz` is registered), withdraws the registration the moment it stops (shutdown
/// requested, or its Pod is being deleted: a stopping candidate never campaigns again), and the
/// garbage collector deletes the registration of a Pod that was deleted.
///
/// **What a registration costs.** A candidate with a Pod writes its registration once: its
/// life is its Pod's (the garbage collector) and its process's (the withdrawal), so an idle
/// follower sends no request for it at all. Only while it leads does it renew its registration
/// every `REGISTRATION_HEARTBEAT`: the pulse by which its watch of the registrations (below)
/// shows that it is not stalled, beside the lock's own renewals. A candidate without a Pod
/// (outside a cluster) has no owner to end its registration, so it renews every heartbeat and
/// counts as live for three. What this trades: a process that died while its Pod lives (a crash
/// loop) keeps a registration until its Pod goes; a leader that names it its successor makes the
/// others defer for at most [`successor_wait`](crate::LeaseConfig::successor_wait) before one of
/// them takes over. A leader that steps down names the youngest live candidate other than
/// itself in `PREFERRED_HOLDER_ANNOTATION`, from one consistent list of the registrations made
/// while its work stops (so the release is still one write): a watch of them could lag behind
/// a new Pod's registration on a loaded API server and name an old Pod, which a rollout stops
/// a moment later. The leader also watches the registrations for its term, and chooses from
/// that watch where the list fails or takes more than a second.
///
/// Crash failover is untouched: nobody stepped down, so nobody is preferred and nobody waits.
/// Registrations are an optimisation, never a safety property: a candidate that may not
/// register (no permission) logs one warning and campaigns as before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Successor {
    /// The youngest live candidate (by its Pod's creation time): a Pod of the newest ReplicaSet
    /// in a rolling update, the Pod that replaced others in a drain. Every candidate keeps a
    /// registration (see [below](#how-it-works)), which needs `create`, `patch`,
    /// `delete`, `list` and `watch` on `leases` in the lock's namespace (without `watch`, a
    /// leader stepping down lists the registrations on the handover's path).
    #[default]
    Youngest,
    /// Whoever is first, as client-go: no registration, no preference.
    Any,
}

/// This candidate's Pod, as its registration names it: the owner of the registration (so that
/// it is deleted with the Pod) and the candidate's age.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CandidatePod {
    /// The Pod's name.
    pub name: String,
    /// The Pod's UID.
    pub uid: String,
    /// The Pod's `metadata.creationTimestamp`, if known: the candidate's age. Without it, the
    /// candidate is as old as its first registration.
    pub created: Option<Timestamp>,
}

// === impl CandidatePod ===

impl CandidatePod {
    /// The Pod `name` with UID `uid` (the Downward API's `metadata.name` and `metadata.uid`).
    #[must_use]
    pub fn new(name: impl Into<String>, uid: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            uid: uid.into(),
            created: None,
        }
    }

    /// Sets the Pod's creation time.
    #[must_use]
    pub fn created(mut self, created: Timestamp) -> Self {
        self.created = Some(created);
        self
    }
}

/// The registrations of one lock's candidates.
#[derive(Clone)]
pub(crate) struct Registry {
    api: Api<Lease>,
    lock: LockRef,
    kind: &'static str,
    api_timeout: Duration,
    /// A leader's watch of the registrations, for its term (see [`Registry::following`]).
    follow: Option<Arc<watch::Follow>>,
    /// This candidate's registration was refused (a permission): it does not watch them
    /// either, and a release lists them (and logs why that fails, once more).
    refused: Arc<AtomicBool>,
}

/// What came of writing a registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    Yes,
    /// Transient: written again with the next heartbeat.
    Failed,
    /// Refused (a permission): not tried again.
    Refused,
}

/// This candidate's registration, kept fresh in the background until it is withdrawn (or
/// dropped, or the shutdown token it was started with is cancelled).
#[derive(Debug)]
pub(crate) struct Registration {
    stop: CancellationToken,
    /// Turns `true` once the registration is withdrawn (deleted, or the delete failed).
    withdrawn: tokio::sync::watch::Receiver<bool>,
    /// How many terms of this candidate are under way ([`Hold`]s alive).
    held: Arc<tokio::sync::watch::Sender<usize>>,
}

/// A term under way: while one is alive, a stopped registration is withdrawn only after the
/// term ends (its release written). Only a leader names successors, so nobody can prefer a
/// candidate while it leads, and its withdrawal then needs no request on the release's path:
/// on a 2-core machine the parallel DELETE slowed the release's successor lookup and write by
/// several milliseconds, and over HTTP/1.1 it made the lookup open a connection of its own.
#[derive(Debug)]
pub(crate) struct Hold {
    held: Option<Arc<tokio::sync::watch::Sender<usize>>>,
    stop: CancellationToken,
    withdrawn: tokio::sync::watch::Receiver<bool>,
}

impl Hold {
    /// The term is over: lets the withdrawal go on and, if the candidate is stopping, awaits
    /// it (bounded by the API timeout of its delete), so that a process that exits after its
    /// release leaves no registration behind.
    pub(crate) async fn end(mut self) {
        self.release();
        if self.stop.is_cancelled() {
            let _ = self.withdrawn.wait_for(|w| *w).await;
        }
    }

    fn release(&mut self) {
        if let Some(held) = self.held.take() {
            held.send_modify(|n| *n = n.saturating_sub(1));
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.release();
    }
}

// === impl Registry ===

impl Registry {
    /// The registrations of candidates for `lock` (of `kind`: `Lease` or `ConfigMap`).
    pub(crate) fn new(client: Client, lock: &LockRef, kind: &'static str, api_timeout: Duration) -> Self {
        Self {
            api: Api::namespaced(client, &lock.namespace),
            lock: lock.clone(),
            kind,
            api_timeout,
            follow: None,
            refused: Arc::new(AtomicBool::new(false)),
        }
    }

    /// This registry with a watch of the registrations kept until the last clone of it is
    /// dropped: a leader takes one for its term, so that the successor its release names is
    /// taken from the watch, not listed on the handover's path (see [`watch`]). Not where this
    /// candidate's registration was refused: it may not watch them either.
    pub(crate) fn following(mut self) -> Self {
        if self.follow.is_none() && !self.refused.load(Ordering::Relaxed) {
            let names = format!("{}-candidate-*", self.lock.name);
            let follow = watch::Follow::start(
                self.api.clone(),
                &self.lock.namespace,
                names,
                self.selector(),
                RBAC_HINT,
            );
            self.follow = Some(Arc::new(follow));
        }
        self
    }

    fn op<'a>(&'a self, verb: &'static str, name: &'a str) -> Op<'a> {
        Op {
            verb,
            resource: "leases",
            namespace: &self.lock.namespace,
            name,
            hint: RBAC_HINT,
        }
    }

    fn selector(&self) -> String {
        format!(
            "{CANDIDATE_FOR_LABEL}={},{LOCK_KIND_LABEL}={}",
            label_value(&self.lock.name),
            self.kind
        )
    }

    /// Registers `identity` (awaiting the first write, bounded by the API timeout) and keeps the
    /// registration fresh until it is withdrawn, dropped, or `shutdown` is cancelled; then it is
    /// deleted. A registration that cannot be written is logged (once, with the permission
    /// missing) and the candidate goes on without one.
    pub(crate) async fn register(
        &self,
        identity: &str,
        pod: Option<&CandidatePod>,
        shutdown: &CancellationToken,
    ) -> Registration {
        let name = registration_name(&self.lock.name, self.kind, identity);
        let stop = shutdown.child_token();
        let (tx, withdrawn) = tokio::sync::watch::channel(false);
        let held = Arc::new(tokio::sync::watch::channel(0).0);
        let refused = self.write(&name, identity, pod).await == Written::Refused;
        let registry = self.clone();
        let (identity, pod, task_stop) = (identity.to_string(), pod.cloned(), stop.clone());
        let mut terms = held.subscribe();
        let leading = held.subscribe();
        let task = async move {
            if !refused {
                registry
                    .keep(&name, &identity, pod.as_ref(), leading, &task_stop)
                    .await;
                // A term under way ends first (bounded: a term that never ends does not keep
                // the registration for ever).
                let bound = registry.api_timeout * 2;
                let _ = tokio::time::timeout(bound, terms.wait_for(|n| *n == 0)).await;
                registry.delete(&name).await;
            }
            tx.send_replace(true);
        };
        tokio::spawn(task.in_current_span());
        Registration {
            stop,
            withdrawn,
            held,
        }
    }

    /// Writes the registration: created, or (it exists: this candidate before a restart, or its
    /// Pod's former incarnation) patched.
    async fn write(&self, name: &str, identity: &str, pod: Option<&CandidatePod>) -> Written {
        let now = Timestamp::now();
        let lease = self.registration(name, identity, pod, now);
        let params = PostParams::default();
        let create = self.api.create(&params, &lease);
        let failure = match call(self.op("create", name), self.api_timeout, create).await {
            Ok(_) => {
                debug!(registration = %name, "registered as a candidate");
                return Written::Yes;
            }
            Err(Failure::Conflict) => match self.renew(name, identity, pod, now).await {
                Ok(()) => return Written::Yes,
                Err(f) => f,
            },
            Err(f) => f,
        };
        match failure {
            Failure::Fatal(e) => {
                warn!(lock = %self.lock, registration = %name, error = %e,
                    "cannot register as a candidate: a leader stepping down cannot prefer this \
                     candidate as its successor (leadership itself is unaffected)");
                self.refused.store(true, Ordering::Relaxed);
                Written::Refused
            }
            e => {
                info!(lock = %self.lock, registration = %name, error = ?e,
                    "registering as a candidate failed; retrying with the next heartbeat");
                Written::Failed
            }
        }
    }

    /// Renews the registration's heartbeat (a merge patch: no read, no conflict).
    async fn renew(
        &self,
        name: &str,
        identity: &str,
        pod: Option<&CandidatePod>,
        now: Timestamp,
    ) -> Result<(), Failure> {
        // A merge patch of the fields set here (k8s-openapi leaves out the unset ones), and the
        // duration set or removed (`null`): a registration bound to its Pod has none.
        let lease = Lease {
            metadata: ObjectMeta {
                // The Pod of this name now (a StatefulSet's Pod recreated under its old name).
                owner_references: pod.map(|p| vec![owner_reference(p)]),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(identity.to_string()),
                renew_time: Some(MicroTime(now)),
                acquire_time: pod.and_then(|p| p.created).map(MicroTime),
                ..LeaseSpec::default()
            }),
        };
        let mut patch = serde_json::to_value(&lease).unwrap_or_default();
        patch["spec"]["leaseDurationSeconds"] = match pod {
            Some(_) => serde_json::Value::Null,
            None => LIVE_SECONDS.into(),
        };
        let params = PatchParams::default();
        let patch = Patch::Merge(&patch);
        let fut = self.api.patch(name, &params, &patch);
        call(self.op("patch", name), self.api_timeout, fut)
            .await
            .map(|_| ())
    }

    /// Renews every [`REGISTRATION_HEARTBEAT`] until `stop`: always without a Pod, and with one
    /// only while a term is under way (`terms` above zero).
    /// A registration deleted meanwhile is written again at the next renewal.
    async fn keep(
        &self,
        name: &str,
        identity: &str,
        pod: Option<&CandidatePod>,
        mut terms: tokio::sync::watch::Receiver<usize>,
        stop: &CancellationToken,
    ) {
        loop {
            if pod.is_some() {
                tokio::select! {
                    () = stop.cancelled() => return,
                    r = terms.wait_for(|n| *n > 0) => if r.is_err() { return },
                }
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(REGISTRATION_HEARTBEAT) => {}
            }
            if pod.is_some() && *terms.borrow() == 0 {
                continue;
            }
            match self.renew(name, identity, pod, Timestamp::now()).await {
                Ok(()) => {}
                Err(Failure::NotFound) => {
                    if self.write(name, identity, pod).await == Written::Refused {
                        return;
                    }
                }
                Err(e) => debug!(registration = %name, error = ?e, "renewing the registration failed"),
            }
        }
    }

    async fn delete(&self, name: &str) {
        let params = DeleteParams::default();
        let fut = self.api.delete(name, &params);
        match call(self.op("delete", name), self.api_timeout, fut).await {
            Ok(_) | Err(Failure::NotFound) => debug!(registration = %name, "withdrew the registration"),
            Err(e) => debug!(registration = %name, error = ?e,
                "withdrawing the registration failed; it stops counting once its heartbeat is stale"),
        }
    }

    /// The registration object of `identity`.
    fn registration(&self, name: &str, identity: &str, pod: Option<&CandidatePod>, now: Timestamp) -> Lease {
        let labels = BTreeMap::from([
            (CANDIDATE_FOR_LABEL.to_string(), label_value(&self.lock.name)),
            (LOCK_KIND_LABEL.to_string(), self.kind.to_string()),
            (MANAGED_BY_LABEL.to_string(), "kube-leader".to_string()),
        ]);
        let since = pod.and_then(|p| p.created).unwrap_or(now);
        Lease {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(self.lock.namespace.clone()),
                labels: Some(labels),
                owner_references: pod.map(|p| vec![owner_reference(p)]),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(identity.to_string()),
                acquire_time: Some(MicroTime(since)),
                renew_time: Some(MicroTime(now)),
                lease_duration_seconds: pod.is_none().then_some(LIVE_SECONDS),
                ..LeaseSpec::default()
            }),
        }
    }

    /// The youngest live candidate other than `me`, by one consistent list of the
    /// registrations; where that list fails or takes longer than [`FRESH_LIST_BOUND`], the
    /// leader's watch of them; `None` if there is none or neither answered (logged: the
    /// release then prefers nobody).
    ///
    /// The list is consistent (no `resourceVersion`: served once the API server's cache has
    /// caught up with etcd), not a read of whatever the cache or the watch holds: in a rollout
    /// the new Pod registers before it is Ready, and so before the old leader is stopped, but a
    /// watch that lags (a loaded API server) may not have shown it yet. A choice from the
    /// lagging watch named an old Pod, which the rollout stopped a moment later, and
    /// leadership moved twice. The list is on the way of a handover only where the work stops
    /// at once (the lookup starts when the shutdown does, while the work stops).
    pub(crate) async fn youngest_other(&self, me: &str) -> Option<String> {
        let params = ListParams::default().labels(&self.selector());
        let name = format!("{}-candidate-*", self.lock.name);
        let bound = self.api_timeout.min(FRESH_LIST_BOUND);
        let listed = call(self.op("list", &name), bound, self.api.list(&params)).await;
        let error = match listed {
            Ok(list) => {
                let found = youngest(&list.items, me, Timestamp::now());
                debug!(lock = %self.lock, candidates = list.items.len(), preferred = ?found, "chose a successor");
                return found;
            }
            Err(e) => e,
        };
        let watched = self.follow.as_ref();
        if let Some((found, candidates)) = watched.and_then(|f| f.youngest_other(me, Timestamp::now())) {
            debug!(lock = %self.lock, error = ?error, candidates, preferred = ?found,
                "the registrations' list failed; chose a successor from their watch");
            return found;
        }
        warn!(lock = %self.lock, error = ?error,
            "cannot list the candidates' registrations; stepping down without a preferred successor");
        None
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("lock", &self.lock)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

// === impl Registration ===

impl Registration {
    /// Holds the withdrawal back while a term of this candidate is under way (see [`Hold`]).
    pub(crate) fn hold(&self) -> Hold {
        self.held.send_modify(|n| *n += 1);
        Hold {
            held: Some(self.held.clone()),
            stop: self.stop.clone(),
            withdrawn: self.withdrawn.clone(),
        }
    }

    /// Withdraws the registration now: deleted before this returns (bounded by the API
    /// timeout). A stopping candidate calls this first, so no leader prefers it any more.
    pub(crate) async fn withdraw(mut self) {
        self.stop.cancel();
        let _ = self.withdrawn.wait_for(|w| *w).await;
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

const RBAC_HINT: &str = "a candidate registration needs create, patch, delete, list and watch on \
    leases in the lock's namespace (print the Role with `kube-leader rbac`), or turn the preference off \
    (Successor::Any, --successor any)";

fn owner_reference(pod: &CandidatePod) -> OwnerReference {
    crate::lock::pod_owner_reference(&pod.name, &pod.uid)
}

#[cfg(test)]
mod tests;
