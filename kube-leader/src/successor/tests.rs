//! Unit tests of the successor choice, the preference annotation and the registration names.

use k8s_openapi::jiff::SignedDuration;

use super::*;

fn reg(identity: &str, since_s: i64, renewed_s: i64) -> Lease {
    let at = |s| MicroTime(Timestamp::from_second(s).unwrap());
    Lease {
        metadata: ObjectMeta::default(),
        spec: Some(LeaseSpec {
            holder_identity: Some(identity.into()),
            acquire_time: Some(at(since_s)),
            renew_time: Some(at(renewed_s)),
            lease_duration_seconds: Some(LIVE_SECONDS),
            ..LeaseSpec::default()
        }),
    }
}

#[test]
fn the_youngest_live_other_candidate_is_preferred() {
    let now = Timestamp::from_second(1_000).unwrap();
    let regs = [reg("old", 100, 990), reg("new", 900, 995), reg("me", 950, 999)];
    assert_eq!(youngest(&regs, "me", now).as_deref(), Some("new"), "never itself");
    // A stale registration (its heartbeat older than three heartbeats) is not live.
    let regs = [reg("old", 100, 990), reg("gone", 900, 1_000 - 46)];
    assert_eq!(youngest(&regs, "me", now).as_deref(), Some("old"));
    assert_eq!(youngest(&[], "me", now), None);
    // Equal ages: the same choice for every leader.
    let regs = [reg("a", 900, 990), reg("b", 900, 990)];
    assert_eq!(youngest(&regs, "me", now).as_deref(), Some("b"));
    // Being deleted (its Pod is going): not a successor.
    let mut deleting = reg("new", 900, 995);
    deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
    assert_eq!(
        youngest(&[reg("old", 100, 990), deleting], "me", now).as_deref(),
        Some("old")
    );
}

#[test]
fn a_registration_bound_to_its_pod_is_live_while_it_exists() {
    let now = Timestamp::from_second(100_000).unwrap();
    let mut pod_bound = reg("new", 900, 950);
    pod_bound.spec.as_mut().unwrap().lease_duration_seconds = None;
    // Written once, long ago: no heartbeat, yet live (its Pod's garbage collection and its
    // withdrawal end it); the one without a Pod and without a recent heartbeat is not.
    let regs = [reg("old", 100, 99_990), pod_bound, reg("ghost", 990, 1_000)];
    assert_eq!(youngest(&regs, "me", now).as_deref(), Some("new"));
}

#[test]
fn a_preference_counts_only_for_its_release() {
    let t: Timestamp = "2026-12-03T10:00:00.123456789Z".parse().unwrap();
    let a = BTreeMap::from([(
        PREFERRED_HOLDER_ANNOTATION.to_string(),
        preferred_value(t, "pod b"),
    )]);
    assert_eq!(
        preferred_for(Some(&a), Some(truncate_micros(t))).as_deref(),
        Some("pod b")
    );
    assert_eq!(
        preferred_for(Some(&a), Some(t)).as_deref(),
        Some("pod b"),
        "as read back at µs"
    );
    let later = t.checked_add(SignedDuration::from_secs(1)).unwrap();
    assert_eq!(preferred_for(Some(&a), Some(later)), None, "another release");
    assert_eq!(preferred_for(Some(&a), None), None);
    assert_eq!(preferred_for(None, Some(t)), None);
    let bad = BTreeMap::from([(PREFERRED_HOLDER_ANNOTATION.to_string(), "yesterday b".to_string())]);
    assert_eq!(preferred_for(Some(&bad), Some(t)), None);
}

#[test]
fn registration_names_are_object_names() {
    let n = registration_name("my-lock", "Lease", "pod-1");
    assert!(n.starts_with("my-lock-candidate-") && n.len() == "my-lock-candidate-".len() + 16);
    assert_ne!(n, registration_name("my-lock", "ConfigMap", "pod-1"));
    assert_ne!(n, registration_name("my-lock", "Lease", "pod-2"));
    let long = "a".repeat(253);
    let n = registration_name(&long, "Lease", "x");
    assert!(n.len() <= 253, "{}", n.len());
    crate::lock::validate_name(&n).unwrap();
    assert_eq!(label_value("my.lock"), "my.lock");
    assert!(label_value(&long).starts_with("h-") && label_value(&long).len() <= 63);
}
