//! Unit tests of `record`.

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
        graceful_deletion: false,
        node_name: None,
        grace: DEFAULT_GRACE,
        phase_by_kubelet: false,
        disruption_target: None,
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

/// A Pod as the API server returns it: `managedFields` say who wrote which field.
fn pod_json(managed: serde_json::Value, conditions: serde_json::Value) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "leader", "uid": "u", "managedFields": managed},
        "spec": {"containers": [{"name": "app", "image": "app"}], "nodeName": "node-a"},
        "status": {"phase": "Failed", "reason": "Evicted", "conditions": conditions},
    }))
    .unwrap()
}

#[test]
fn the_phase_is_the_kubelets_only_if_its_field_manager_owns_it() {
    let entry = |manager: &str, fields: serde_json::Value| {
        serde_json::json!({"manager": manager, "operation": "Update", "subresource": "status",
            "apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": fields})
    };
    let phase = serde_json::json!({"f:status": {"f:phase": {}, "f:reason": {}}});
    let conditions_only = serde_json::json!({"f:status": {"f:conditions": {}}});
    let none = serde_json::json!([]);

    let by_kubelet = pod_json(serde_json::json!([entry("kubelet", phase.clone())]), none.clone());
    assert!(PodView::from_pod(&by_kubelet).phase_by_kubelet);
    // The Pod garbage collector (or a person) set the phase; the kubelet wrote only conditions.
    let by_gc = pod_json(
        serde_json::json!([entry("kubelet", conditions_only), entry("PodGC", phase.clone())]),
        none.clone(),
    );
    assert!(!PodView::from_pod(&by_gc).phase_by_kubelet);
    let by_someone = pod_json(serde_json::json!([entry("kubectl-patch", phase)]), none.clone());
    assert!(!PodView::from_pod(&by_someone).phase_by_kubelet);
    let unmanaged = pod_json(serde_json::json!([]), none);
    assert!(!PodView::from_pod(&unmanaged).phase_by_kubelet);
}

#[test]
fn a_disruption_target_condition_is_read_with_its_reason() {
    let cond = |status: &str, reason: Option<&str>| {
        let mut c = serde_json::json!({"type": "DisruptionTarget", "status": status});
        if let Some(r) = reason {
            c["reason"] = r.into();
        }
        c
    };
    let read = |conditions| PodView::from_pod(&pod_json(serde_json::json!([]), conditions)).disruption_target;
    assert_eq!(
        read(serde_json::json!([cond("True", Some("EvictionByEvictionAPI"))])),
        Some("EvictionByEvictionAPI".to_string())
    );
    assert_eq!(
        read(serde_json::json!([cond("False", Some("EvictionByEvictionAPI"))])),
        None
    );
    assert_eq!(
        read(serde_json::json!([cond("True", None)])),
        Some("no reason given".to_string())
    );
    assert_eq!(
        read(serde_json::json!([{"type": "Ready", "status": "False"}])),
        None
    );
}

#[test]
fn the_grace_is_the_longer_of_the_pods_and_its_deletions() {
    let grace = |spec: Option<i64>, deletion: Option<i64>| {
        let mut pod = Pod::default();
        pod.spec.get_or_insert_default().termination_grace_period_seconds = spec;
        pod.metadata.deletion_grace_period_seconds = deletion;
        PodView::from_pod(&pod).grace
    };
    let s = Duration::from_secs;
    assert_eq!(grace(None, None), DEFAULT_GRACE);
    assert_eq!(grace(Some(7), None), s(7));
    assert_eq!(grace(Some(7), Some(3)), s(7));
    assert_eq!(grace(Some(0), Some(3)), s(3));
    assert_eq!(grace(Some(-5), None), s(0));
    assert_eq!(PodView::from_pod(&Pod::default()).grace, DEFAULT_GRACE);
}

#[test]
fn only_a_deletion_with_a_grace_is_graceful() {
    let view = |deleting: bool, grace: Option<i64>| {
        let mut pod = Pod::default();
        pod.metadata.deletion_timestamp = deleting.then(|| Time(Timestamp::now()));
        pod.metadata.deletion_grace_period_seconds = grace;
        let v = PodView::from_pod(&pod);
        (v.deleting, v.graceful_deletion)
    };
    assert_eq!(view(false, None), (false, false));
    assert_eq!(view(true, Some(30)), (true, true));
    // A force deletion (or the kubelet's final one): deletionTimestamp with grace 0.
    assert_eq!(view(true, Some(0)), (true, false));
    assert_eq!(view(true, None), (true, false));
}

#[test]
fn the_released_mark_is_read() {
    let mut cm = lock_config_map(&lock(), &me(), Timestamp::now());
    assert!(!LockRecord::from_config_map(&cm).released);
    cm.metadata
        .annotations
        .get_or_insert_default()
        .insert(RELEASED_ANNOTATION.into(), "2024-05-06T07:08:09Z".into());
    assert!(LockRecord::from_config_map(&cm).released);
}

/// Fuzzing of what a lock ConfigMap can say (issue 5): arbitrary owner references and
/// annotations, and arbitrary JSON where a ConfigMap is expected, never panic, and are read
/// exactly as the reference rules say.
mod props {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use proptest::{collection::vec, option, prelude::*};
    use serde_json::{json, Value};

    use super::*;
    use crate::for_life::observe::leader_info;

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

fn with_annotations(pairs: &[(&str, &str)]) -> LockRecord {
    let mut cm = lock_config_map(&lock(), &me(), Timestamp::now());
    let a = cm.metadata.annotations.get_or_insert_with(BTreeMap::new);
    for (k, v) in pairs {
        a.insert((*k).to_string(), (*v).to_string());
    }
    LockRecord::from_config_map(&cm)
}

#[test]
fn the_liveness_heartbeat_reads_back_and_a_malformed_one_counts_as_none() {
    let renew = "2024-05-06T07:08:09.123456Z";
    let r = with_annotations(&[(RENEW_TIME_ANNOTATION, renew), (LIVENESS_ANNOTATION, "7")]);
    assert_eq!(
        r.heartbeat,
        Ok(Some(Heartbeat {
            renew_time: renew.into(),
            liveness: Duration::from_secs(7),
        }))
    );
    assert_eq!(
        with_annotations(&[]).heartbeat,
        Ok(None),
        "no heartbeat: an older lock"
    );
    for (pairs, names) in [
        (
            vec![(RENEW_TIME_ANNOTATION, renew), (LIVENESS_ANNOTATION, "x")],
            LIVENESS_ANNOTATION,
        ),
        (
            vec![(RENEW_TIME_ANNOTATION, renew), (LIVENESS_ANNOTATION, "0")],
            LIVENESS_ANNOTATION,
        ),
        (
            vec![(RENEW_TIME_ANNOTATION, renew), (LIVENESS_ANNOTATION, "-3")],
            LIVENESS_ANNOTATION,
        ),
        (vec![(LIVENESS_ANNOTATION, "7")], RENEW_TIME_ANNOTATION),
        (
            vec![(RENEW_TIME_ANNOTATION, "yesterday"), (LIVENESS_ANNOTATION, "7")],
            RENEW_TIME_ANNOTATION,
        ),
        (vec![(RENEW_TIME_ANNOTATION, renew)], LIVENESS_ANNOTATION),
    ] {
        let r = with_annotations(&pairs);
        let err = r.heartbeat.expect_err("malformed");
        assert!(err.contains(names), "{err} should name {names}");
    }
}
