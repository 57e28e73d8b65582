//! The lock ConfigMap: how it is written, and what a candidate reads from it and from the leader
//! Pod.

use std::{
    collections::BTreeMap,
    fmt,
    time::{Duration, SystemTime},
};

use k8s_openapi::{
    api::core::v1::{ConfigMap, Pod},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
    jiff::Timestamp,
};

use crate::lock::{
    LockRef, ACQUIRED_AT_ANNOTATION, FENCING_TOKEN_ANNOTATION, HOLDER_ANNOTATION, LIVENESS_ANNOTATION,
    MANAGED_BY_LABEL, RENEW_TIME_ANNOTATION, STRATEGY_LABEL,
};

/// Set on the lock by its leader right before it deletes the lock on release, once its work
/// has stopped (the value is the leader's wall clock, RFC 3339, for people): the leader's own
/// word that nothing of its term runs any more. A waiting candidate that sees it takes over at
/// once, also when the leader Pod is terminal or gone and its containers might otherwise still
/// run.
pub(crate) const RELEASED_ANNOTATION: &str = "kube-leader.io/released-at";

/// The API server's default `terminationGracePeriodSeconds`, for a Pod whose spec was never seen.
pub(crate) const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// A Pod by name and UID: a candidate, or the owner of a lock.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PodRef {
    pub(crate) name: String,
    pub(crate) uid: String,
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (uid {})", self.name, self.uid)
    }
}

/// Why a lock ConfigMap cannot be attributed to a leader Pod. Candidates wait for such a lock
/// to change or go, and never take it over: it was not written by a leader-for-life candidate,
/// and whoever wrote it may rely on it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub(crate) enum Malformed {
    /// The lock has no owner reference.
    NoOwner,
    /// The lock has more than one owner reference.
    ManyOwners {
        /// How many.
        count: usize,
    },
    /// The lock's single owner is not a core `v1` Pod.
    NotAPod {
        /// The owner's `apiVersion`.
        api_version: String,
        /// The owner's `kind`.
        kind: String,
        /// The owner's name.
        name: String,
    },
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Malformed::NoOwner => {
                f.write_str("the lock has no owner reference (it must have exactly one, a Pod)")
            }
            Malformed::ManyOwners { count } => {
                write!(
                    f,
                    "the lock has {count} owner references (it must have exactly one, a Pod)"
                )
            }
            Malformed::NotAPod {
                api_version,
                kind,
                name,
            } => {
                write!(
                    f,
                    "the lock's owner is {kind} {name} ({api_version}), not a v1 Pod"
                )
            }
        }
    }
}

/// What a lock ConfigMap says.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct LockRecord {
    pub(crate) uid: String,
    pub(crate) resource_version: Option<String>,
    /// The owner Pod, or why the lock has none that counts.
    pub(crate) owner: Result<PodRef, Malformed>,
    /// From [`FENCING_TOKEN_ANNOTATION`]; `None` if missing or not a number.
    pub(crate) fencing_token: Option<u64>,
    /// From [`ACQUIRED_AT_ANNOTATION`]; `None` if missing or not RFC 3339.
    pub(crate) acquired_at: Option<SystemTime>,
    /// `metadata.deletionTimestamp` is set: the lock is going.
    pub(crate) deleting: bool,
    /// [`RELEASED_ANNOTATION`] is set: its leader's work has stopped.
    pub(crate) released: bool,
    /// The successor the release prefers
    /// ([`PREFERRED_HOLDER_ANNOTATION`](crate::successor::PREFERRED_HOLDER_ANNOTATION)).
    pub(crate) preferred: Option<String>,
    /// The liveness heartbeat ([`RENEW_TIME_ANNOTATION`], [`LIVENESS_ANNOTATION`]): `Ok(None)`
    /// without it (liveness off, an older kube-leader, operator-sdk), `Err` (what is wrong,
    /// naming the annotation) if it cannot be read, which counts as without.
    pub(crate) heartbeat: Result<Option<Heartbeat>, String>,
}

/// A lock's liveness heartbeat as its leader wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Heartbeat {
    /// [`RENEW_TIME_ANNOTATION`]: only compared with the value seen before.
    pub(crate) renew_time: String,
    /// [`LIVENESS_ANNOTATION`]: nothing of the term runs this long after the send of its last
    /// successful heartbeat.
    pub(crate) liveness: Duration,
}

// === impl LockRecord ===

impl LockRecord {
    /// Reads a lock ConfigMap.
    pub(crate) fn from_config_map(cm: &ConfigMap) -> Self {
        let meta = &cm.metadata;
        let annotation = |key: &str| {
            meta.annotations
                .as_ref()
                .and_then(|a| a.get(key))
                .map(|v| v.trim())
        };
        let owners = meta.owner_references.as_deref().unwrap_or_default();
        let owner = match owners {
            [] => Err(Malformed::NoOwner),
            [o] if o.kind == "Pod" && o.api_version == "v1" => Ok(PodRef {
                name: o.name.clone(),
                uid: o.uid.clone(),
            }),
            [o] => Err(Malformed::NotAPod {
                api_version: o.api_version.clone(),
                kind: o.kind.clone(),
                name: o.name.clone(),
            }),
            many => Err(Malformed::ManyOwners { count: many.len() }),
        };
        Self {
            uid: meta.uid.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone(),
            owner,
            fencing_token: annotation(FENCING_TOKEN_ANNOTATION).and_then(|v| v.parse().ok()),
            acquired_at: annotation(ACQUIRED_AT_ANNOTATION)
                .and_then(|v| v.parse::<Timestamp>().ok())
                .map(SystemTime::from),
            deleting: meta.deletion_timestamp.is_some(),
            released: annotation(RELEASED_ANNOTATION).is_some(),
            preferred: crate::successor::preferred_for(
                meta.annotations.as_ref(),
                annotation(RELEASED_ANNOTATION).and_then(|v| v.parse().ok()),
            ),
            heartbeat: heartbeat_of(&annotation),
        }
    }

    /// Whether `me` (same name and UID) owns this lock.
    pub(crate) fn is_owned_by(&self, me: &PodRef) -> bool {
        self.owner.as_ref().is_ok_and(|o| o == me)
    }

    /// The holder's name, if the lock has a Pod owner.
    pub(crate) fn holder(&self) -> Option<&str> {
        self.owner.as_ref().ok().map(|o| o.name.as_str())
    }
}

/// Reads the liveness heartbeat of a lock (see [`LockRecord::heartbeat`]).
fn heartbeat_of<'a>(annotation: &impl Fn(&str) -> Option<&'a str>) -> Result<Option<Heartbeat>, String> {
    let (renew, liveness) = (annotation(RENEW_TIME_ANNOTATION), annotation(LIVENESS_ANNOTATION));
    let (renew, liveness) = match (renew, liveness) {
        (None, None) => return Ok(None),
        (Some(r), Some(l)) => (r, l),
        (None, Some(_)) => {
            return Err(format!(
                "{LIVENESS_ANNOTATION} is set without {RENEW_TIME_ANNOTATION}"
            ))
        }
        (Some(_), None) => {
            return Err(format!(
                "{RENEW_TIME_ANNOTATION} is set without {LIVENESS_ANNOTATION}"
            ))
        }
    };
    if renew.parse::<Timestamp>().is_err() {
        return Err(format!(
            "{RENEW_TIME_ANNOTATION} {renew:?} is not an RFC 3339 time"
        ));
    }
    match liveness.parse::<u32>() {
        Ok(secs) if secs > 0 => Ok(Some(Heartbeat {
            renew_time: renew.to_string(),
            liveness: Duration::from_secs(secs.into()),
        })),
        _ => Err(format!(
            "{LIVENESS_ANNOTATION} {liveness:?} is not a whole number of seconds above zero"
        )),
    }
}

/// Sets the liveness heartbeat on `cm`: renewed now, advertising `advertised` (rounded up to
/// whole seconds); `None` removes it.
pub(crate) fn set_heartbeat(cm: &mut ConfigMap, advertised: Option<Duration>) {
    let annotations = cm.metadata.annotations.get_or_insert_with(BTreeMap::new);
    let Some(advertised) = advertised else {
        annotations.remove(RENEW_TIME_ANNOTATION);
        annotations.remove(LIVENESS_ANNOTATION);
        return;
    };
    let secs = advertised.as_secs() + u64::from(advertised.subsec_nanos() > 0);
    annotations.insert(RENEW_TIME_ANNOTATION.to_string(), Timestamp::now().to_string());
    annotations.insert(LIVENESS_ANNOTATION.to_string(), secs.to_string());
}

/// The owner reference to `pod` that a lock carries (see [`pod_owner_reference`](crate::lock::pod_owner_reference)).
pub(crate) fn owner_reference(pod: &PodRef) -> OwnerReference {
    crate::lock::pod_owner_reference(&pod.name, &pod.uid)
}

/// The lock ConfigMap that `me` creates to become leader. The fencing token is added once the
/// create has returned the `resourceVersion`.
pub(crate) fn lock_config_map(lock: &LockRef, me: &PodRef, acquired_at: Timestamp) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(lock.name.clone()),
            namespace: Some(lock.namespace.clone()),
            owner_references: Some(vec![owner_reference(me)]),
            labels: Some(BTreeMap::from([
                (MANAGED_BY_LABEL.to_string(), "kube-leader".to_string()),
                (STRATEGY_LABEL.to_string(), "for-life".to_string()),
            ])),
            annotations: Some(BTreeMap::from([
                (HOLDER_ANNOTATION.to_string(), me.name.clone()),
                (ACQUIRED_AT_ANNOTATION.to_string(), acquired_at.to_string()),
            ])),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

/// `cm` with the fencing-token annotation set (its `resourceVersion` stays, as the precondition
/// of the update).
pub(crate) fn with_fencing_token(mut cm: ConfigMap, token: u64) -> ConfigMap {
    cm.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(FENCING_TOKEN_ANNOTATION.to_string(), token.to_string());
    cm
}

/// What a waiting candidate knows about the Pod that owns the lock.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum LeaderPod {
    /// Not observed yet (its watch has not synced).
    Unknown,
    /// No Pod of that name exists.
    Absent,
    /// A Pod of that name exists.
    Present(PodView),
}

/// The parts of a Pod that decide whether its lock is stale.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PodView {
    pub(crate) uid: String,
    pub(crate) phase: Option<String>,
    pub(crate) reason: Option<String>,
    pub(crate) deleting: bool,
    /// Being deleted with a grace period above zero: a graceful deletion, which the kubelet
    /// completes (deletes the Pod for good) only once the containers have stopped. A force
    /// deletion also shows `deletionTimestamp` for a moment, with a grace period of zero,
    /// right before the Pod vanishes (seen on the 1.20 API server).
    pub(crate) graceful_deletion: bool,
    pub(crate) node_name: Option<String>,
    /// The longest grace period the kubelet gives this Pod's containers when it stops them:
    /// `spec.terminationGracePeriodSeconds` or `metadata.deletionGracePeriodSeconds`, whichever
    /// is longer ([`DEFAULT_GRACE`] if neither is set; negative values count as zero).
    pub(crate) grace: Duration,
    /// `status.phase` is owned by the kubelet's field manager ([`KUBELET_FIELD_MANAGER`] in
    /// `managedFields`): the kubelet wrote the phase as it is, or agreed with it. A phase that
    /// another writer changed (the Pod garbage collector's `Failed` for a Pod on a deleted Node,
    /// a person's `kubectl patch --subresource=status`) is owned by that writer instead.
    pub(crate) phase_by_kubelet: bool,
    /// The reason of a `DisruptionTarget` condition with status `True`: the Pod is about to be
    /// disrupted (an eviction through the API, a preemption, a taint's deletion, the kubelet's
    /// own eviction; PodDisruptionConditions, GA in 1.31). `None` without one.
    pub(crate) disruption_target: Option<String>,
}

// === impl PodView ===

impl PodView {
    pub(crate) fn from_pod(pod: &Pod) -> Self {
        let status = pod.status.as_ref();
        Self {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            phase: status.and_then(|s| s.phase.clone()),
            reason: status.and_then(|s| s.reason.clone()),
            deleting: pod.metadata.deletion_timestamp.is_some(),
            graceful_deletion: pod.metadata.deletion_timestamp.is_some()
                && pod.metadata.deletion_grace_period_seconds.is_some_and(|s| s > 0),
            node_name: pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .filter(|n| !n.is_empty()),
            grace: grace_of(pod),
            phase_by_kubelet: phase_by_kubelet(pod),
            disruption_target: disruption_target(pod),
        }
    }

    /// Phase `Failed` or `Succeeded`: no container of the Pod runs, or ever will again.
    pub(crate) fn is_terminal(&self) -> bool {
        matches!(self.phase.as_deref(), Some("Failed" | "Succeeded"))
    }

    /// Phase `Failed` with reason `Evicted` (operator-sdk's `isPodEvicted`).
    pub(crate) fn is_evicted(&self) -> bool {
        self.phase.as_deref() == Some("Failed") && self.reason.as_deref() == Some("Evicted")
    }
}

/// The field manager of the kubelet's status writes: the API server names a manager after the
/// first part of its client's user agent (`prefixFromUserAgent`), and the kubelet's is its
/// binary's name (client-go's `DefaultKubernetesUserAgent`: `kubelet/v1.37.2 (linux/amd64) ...`).
/// A kubelet built into a binary of another name records another manager: its terminal phase
/// is then not taken as proof, and the other proofs apply (slower, never unsafe).
pub(crate) const KUBELET_FIELD_MANAGER: &str = "kubelet";

/// See [`PodView::phase_by_kubelet`].
fn phase_by_kubelet(pod: &Pod) -> bool {
    pod.metadata.managed_fields.iter().flatten().any(|entry| {
        entry.manager.as_deref() == Some(KUBELET_FIELD_MANAGER)
            && entry
                .fields_v1
                .as_ref()
                .and_then(|f| f.0.get("f:status"))
                .and_then(|status| status.get("f:phase"))
                .is_some()
    })
}

/// See [`PodView::disruption_target`].
fn disruption_target(pod: &Pod) -> Option<String> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    conditions
        .iter()
        .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")
        .map(|c| c.reason.clone().unwrap_or_else(|| "no reason given".to_string()))
}

/// See [`PodView::grace`].
fn grace_of(pod: &Pod) -> Duration {
    let spec = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds);
    let deletion = pod.metadata.deletion_grace_period_seconds;
    let secs = |s: i64| Duration::from_secs(s.max(0).unsigned_abs());
    match (spec, deletion) {
        (None, None) => DEFAULT_GRACE,
        (a, b) => secs(a.unwrap_or(0).max(b.unwrap_or(0))),
    }
}

/// The lock as last seen (a waiting candidate), or as an event shows it (the keeper): not
/// yet (or nothing new), absent, or present.
#[derive(Debug, Clone, Default)]
pub(super) enum LockState {
    #[default]
    Unseen,
    Absent,
    Present(Box<ConfigMap>),
}

impl From<Option<ConfigMap>> for LockState {
    fn from(cm: Option<ConfigMap>) -> Self {
        cm.map_or(Self::Absent, |cm| Self::Present(Box::new(cm)))
    }
}

impl LockState {
    /// A copy of the lock if it was seen: `Some(None)` when absent.
    pub(super) fn known(&self) -> Option<Option<ConfigMap>> {
        match self {
            Self::Unseen => None,
            Self::Absent => Some(None),
            Self::Present(cm) => Some(Some(ConfigMap::clone(cm))),
        }
    }
}

#[cfg(test)]
mod tests;
