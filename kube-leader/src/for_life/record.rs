//! The lock ConfigMap: how it is written, and what a candidate reads from it and from the leader
//! Pod.

use std::{collections::BTreeMap, fmt, time::SystemTime};

use k8s_openapi::{
    api::core::v1::{ConfigMap, Pod},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
    jiff::Timestamp,
};

use crate::lock::{
    LockRef, ACQUIRED_AT_ANNOTATION, FENCING_TOKEN_ANNOTATION, HOLDER_ANNOTATION, MANAGED_BY_LABEL,
    STRATEGY_LABEL,
};


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
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// The owner reference to `pod` that a lock carries: `apiVersion: v1, kind: Pod, name, uid`.
///
/// `controller` and `blockOwnerDeletion` stay unset (as in the seed): setting
/// `blockOwnerDeletion` would need `update` on `pods/finalizers` under the
/// OwnerReferencesPermissionEnforcement admission plugin, for nothing, since the lock only has
/// to go after the Pod.
pub(crate) fn owner_reference(pod: &PodRef) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        ..OwnerReference::default()
    }
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LeaderPod {
    /// Not observed yet (its watch has not synced).
    Unknown,
    /// No Pod of that name exists.
    Absent,
    /// A Pod of that name exists.
    Present(PodView),
}

/// The parts of a Pod that decide whether its lock is stale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodView {
    pub(crate) uid: String,
    pub(crate) phase: Option<String>,
    pub(crate) reason: Option<String>,
    pub(crate) deleting: bool,
    pub(crate) node_name: Option<String>,
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
            node_name: pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .filter(|n| !n.is_empty()),
        }
    }

    /// Phase `Failed` or `Succeeded`: no container of the Pod runs, or ever will again.
    pub(crate) fn is_terminal(&self) -> bool {
        matches!(self.phase.as_deref(), Some("Failed" | "Succeeded"))
    }

    /// Phase `Failed` with reason `Evicted` (the seed's `isPodEvicted`).
    pub(crate) fn is_evicted(&self) -> bool {
        self.phase.as_deref() == Some("Failed") && self.reason.as_deref() == Some("Evicted")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::parse_resource_version;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn me() -> PodRef {
        PodRef {
            name: "op-0".into(),
            uid: "u-1".into(),
        }
    }

    fn lock() -> LockRef {
        LockRef::new("ns", "my-lock").unwrap()
    }

    #[test]
    fn written_lock_reads_back() {
        let at: Timestamp = "2024-05-06T07:08:09Z".parse().unwrap();
        let mut cm = lock_config_map(&lock(), &me(), at);
        let owners = cm.metadata.owner_references.clone().unwrap();
        assert_eq!(owners.len(), 1);
        assert_eq!(
            (owners[0].api_version.as_str(), owners[0].kind.as_str()),
            ("v1", "Pod")
        );
        assert_eq!(owners[0].controller, None);
        assert_eq!(owners[0].block_owner_deletion, None);
        let annotations = cm.metadata.annotations.clone().unwrap();
        assert_eq!(annotations[HOLDER_ANNOTATION], "op-0");
        assert_eq!(annotations[ACQUIRED_AT_ANNOTATION], "2024-05-06T07:08:09Z");

        cm.metadata.uid = Some("lock-uid".into());
        cm.metadata.resource_version = Some("4711".into());
        let before = LockRecord::from_config_map(&cm);
        assert_eq!(before.fencing_token, None);
        let cm = with_fencing_token(cm, 4711);
        let r = LockRecord::from_config_map(&cm);
        assert_eq!(r.uid, "lock-uid");
        assert_eq!(r.owner, Ok(me()));
        assert!(r.is_owned_by(&me()));
        assert!(!r.is_owned_by(&PodRef {
            name: "op-0".into(),
            uid: "other".into()
        }));
        assert_eq!(r.holder(), Some("op-0"));
        assert_eq!(r.fencing_token, Some(4711));
        assert_eq!(r.acquired_at, Some(SystemTime::from(at)));
        assert!(!r.deleting);
    }

    fn with_owners(owners: Vec<OwnerReference>) -> LockRecord {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                owner_references: Some(owners),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        LockRecord::from_config_map(&cm)
    }

    #[test]
    fn malformed_owners() {
        assert_eq!(with_owners(vec![]).owner, Err(Malformed::NoOwner));
        assert_eq!(
            LockRecord::from_config_map(&ConfigMap::default()).owner,
            Err(Malformed::NoOwner)
        );
        let pod = owner_reference(&me());
        assert_eq!(
            with_owners(vec![pod.clone(), pod.clone()]).owner,
            Err(Malformed::ManyOwners { count: 2 })
        );
        let deployment = OwnerReference {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: "op".into(),
            uid: "d".into(),
            ..OwnerReference::default()
        };
        let err = with_owners(vec![deployment]).owner.unwrap_err();
        assert_eq!(
            err.to_string(),
            "the lock's owner is Deployment op (apps/v1), not a v1 Pod"
        );
        let wrong_group = OwnerReference {
            api_version: "example.com/v1".into(),
            ..pod
        };
        assert!(matches!(
            with_owners(vec![wrong_group]).owner,
            Err(Malformed::NotAPod { .. })
        ));
    }

    #[test]
    fn unparsable_annotations_are_ignored() {
        let mut cm = lock_config_map(&lock(), &me(), Timestamp::UNIX_EPOCH);
        let a = cm.metadata.annotations.as_mut().unwrap();
        a.insert(FENCING_TOKEN_ANNOTATION.into(), "not-a-number".into());
        a.insert(ACQUIRED_AT_ANNOTATION.into(), "yesterday".into());
        cm.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let r = LockRecord::from_config_map(&cm);
        assert_eq!(r.fencing_token, None);
        assert_eq!(r.acquired_at, None);
        assert!(r.deleting);
        assert_eq!(parse_resource_version(Some("123")), Some(123));
        assert_eq!(parse_resource_version(Some("abc")), None);
        assert_eq!(parse_resource_version(None), None);
    }

    #[test]
    fn pod_phases() {
        let view = |phase: &str, reason: Option<&str>| PodView {
            uid: "u".into(),
            phase: Some(phase.into()),
            reason: reason.map(Into::into),
            deleting: false,
            node_name: None,
        };
        assert!(view("Failed", Some("Evicted")).is_evicted());
        assert!(view("Failed", Some("Evicted")).is_terminal());
        assert!(!view("Failed", Some("Preempting")).is_evicted());
        assert!(view("Failed", Some("Preempting")).is_terminal());
        assert!(view("Succeeded", None).is_terminal());
        assert!(!view("Running", None).is_terminal());
        assert!(!view("Pending", None).is_terminal());
        assert!(!view("Running", Some("Evicted")).is_evicted());
    }
}

/// Fuzzing of what a lock ConfigMap can say (issue 5): arbitrary owner references and
/// annotations, and arbitrary JSON where a ConfigMap is expected, never panic, and are read
/// exactly as the reference rules say.
#[cfg(test)]
mod props {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use proptest::{collection::vec, option, prelude::*};
    use serde_json::{json, Value};

    use super::*;
    use crate::for_life::leader::leader_info;

    fn owner() -> impl Strategy<Value = OwnerReference> {
        (
            prop_oneof![
                prop::sample::select(vec!["v1", "apps/v1", "", "v2", "V1"]).prop_map(String::from),
                ".{0,6}"
            ],
            prop_oneof![
                prop::sample::select(vec!["Pod", "ReplicaSet", "pod", "", "Node"]).prop_map(String::from),
                ".{0,6}"
            ],
            ".{0,12}",
            ".{0,12}",
            option::of(any::<bool>()),
        )
            .prop_map(|(api_version, kind, name, uid, controller)| OwnerReference {
                api_version,
                kind,
                name,
                uid,
                controller,
                ..OwnerReference::default()
            })
    }

    /// Annotation values: numbers (with blanks, signs, overflow), times, garbage.
    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<u64>().prop_map(|n| n.to_string()),
            " ?[0-9]{1,25} ?",
            "-[0-9]{1,5}",
            "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2})",
            ".{0,30}",
        ]
    }

    fn json_leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            ".{0,10}".prop_map(Value::from),
        ]
    }

    fn json() -> impl Strategy<Value = Value> {
        json_leaf().prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                vec(inner.clone(), 0..4).prop_map(Value::from),
                vec(
                    (
                        prop::sample::select(vec!["apiVersion", "kind", "name", "uid", "controller", "x"]),
                        inner
                    ),
                    0..5
                )
                .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(crate::proptest_config(2_000))]

        #[test]
        fn lock_records_are_read_as_the_reference_says(
            owners in option::of(vec(owner(), 0..4)),
            token in option::of(value()),
            acquired in option::of(value()),
            holder in option::of(value()),
            deleting in any::<bool>(),
            rv in option::of(value()),
        ) {
            let mut annotations = BTreeMap::new();
            for (k, v) in [
                (FENCING_TOKEN_ANNOTATION, &token),
                (ACQUIRED_AT_ANNOTATION, &acquired),
                (HOLDER_ANNOTATION, &holder),
            ] {
                if let Some(v) = v {
                    annotations.insert(k.to_string(), v.clone());
                }
            }
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some("lock".into()),
                    owner_references: owners.clone(),
                    annotations: Some(annotations),
                    resource_version: rv.clone(),
                    deletion_timestamp: deleting.then_some(Time(Timestamp::UNIX_EPOCH)),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            };
            let r = LockRecord::from_config_map(&cm);
            let owners = owners.unwrap_or_default();
            let expected = match owners.as_slice() {
                [o] if o.api_version == "v1" && o.kind == "Pod" => Some(o.name.clone()),
                _ => None,
            };
            prop_assert_eq!(r.holder().map(str::to_string), expected.clone());
            prop_assert_eq!(r.owner.is_err(), expected.is_none());
            let parsed_token = token.as_deref().and_then(|t| t.trim().parse::<u64>().ok());
            prop_assert_eq!(r.fencing_token, parsed_token);
            prop_assert_eq!(r.deleting, deleting);
            if let Some(a) = r.acquired_at {
                let a: Timestamp = a.try_into().unwrap();
                prop_assert!(acquired.is_some());
                prop_assert_eq!(Some(a), acquired.as_deref().and_then(|v| v.trim().parse().ok()));
            }
            let info = leader_info(&LockRef::new("ns", "lock").unwrap(), &cm);
            prop_assert_eq!(info.holder, expected);
            prop_assert_eq!(
                info.fencing_token,
                parsed_token.or_else(|| rv.as_deref().and_then(|v| v.trim().parse().ok()))
            );
        }

        #[test]
        fn any_json_where_a_lock_is_expected_never_panics(
            owners in json(),
            annotations in json(),
            deletion in json(),
        ) {
            let value = json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {
                    "name": "lock", "ownerReferences": owners, "annotations": annotations,
                    "deletionTimestamp": deletion,
                },
            });
            // Either the client rejects it (a typed decode error) or it is read without panic.
            if let Ok(cm) = serde_json::from_value::<ConfigMap>(value) {
                let r = LockRecord::from_config_map(&cm);
                let expected = match cm.metadata.owner_references.as_deref().unwrap_or_default() {
                    [o] if o.api_version == "v1" && o.kind == "Pod" => Some(o.name.as_str()),
                    _ => None,
                };
                prop_assert_eq!(r.holder(), expected);
                let info = leader_info(&LockRef::new("ns", "lock").unwrap(), &cm);
                prop_assert_eq!(info.holder.as_deref(), expected);
            }
        }
    }
}
