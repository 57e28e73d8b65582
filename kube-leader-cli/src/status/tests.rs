use super::*;
use kube_leader::Strategy;

#[test]
fn lease_status() {
    let lock = LockRef::new("ns", "l").unwrap();
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let mut info = kube_leader::internal::leader_info(Strategy::Lease, lock.clone());
    info.holder = Some("pod-a".into());
    info.fencing_token = Some(3);
    info.acquired_at = Some(t0);
    info.renewed_at = Some(t0 + Duration::from_secs(10));
    info.lease_duration = Some(Duration::from_secs(15));
    let out = StatusOut::new(&lock, "lease", Some(&info));
    assert_eq!(out.expires_at.as_deref(), Some("2027-01-15T08:00:25Z"));
    let text = out.text(t0 + Duration::from_secs(20));
    assert!(text.contains("holder:         pod-a\n"), "{text}");
    assert!(text.contains("(20s ago)"), "{text}");
    assert!(text.contains("(in 5s)"), "{text}");
    let json = serde_json::to_value(&out).unwrap();
    assert_eq!(json["fencing_token"], 3);
    assert_eq!(json["holder"], "pod-a");
}

#[test]
fn no_lock() {
    let lock = LockRef::new("ns", "l").unwrap();
    let out = StatusOut::new(&lock, "for-life", None);
    assert!(!out.exists);
    assert!(out.text(SystemTime::now()).contains("none (no lock)"));
}
