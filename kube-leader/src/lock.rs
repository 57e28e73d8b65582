//! The lock object: its name, the metadata kube-leader writes on it, and resourceVersions as
//! fencing tokens.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::error::{Error, Result};

// The metadata kube-leader writes on its lock objects (both strategies).

/// Annotation naming the holder of the lock: the Pod (leader for life), or the identity whose
/// fencing token [`FENCING_TOKEN_ANNOTATION`] holds (Lease).
pub const HOLDER_ANNOTATION: &str = "kube-leader.io/holder";
/// Annotation with the time the holder acquired the lock (RFC 3339, the holder's wall clock).
pub const ACQUIRED_AT_ANNOTATION: &str = "kube-leader.io/acquired-at";
/// Annotation with the holder's fencing token: the lock's `resourceVersion` at creation (leader
/// for life), or that of the write that made the holder leader (Lease).
pub const FENCING_TOKEN_ANNOTATION: &str = "kube-leader.io/fencing-token";
/// Leader for life with a liveness heartbeat: the holder's wall clock at its last heartbeat
/// (RFC 3339 with microseconds, as a Lease's `renewTime`). Waiting candidates only compare it
/// with the value they saw before: it tells that the heartbeat moved, never what time it is.
pub const RENEW_TIME_ANNOTATION: &str = "kube-leader.io/renew-time";
/// Leader for life with a liveness heartbeat: whole seconds, counted from when the holder sent
/// its last successful heartbeat, by which nothing of its term runs any more (its confirmed
/// window plus the time its work may take to stop), as a Lease's `leaseDurationSeconds`.
pub const LIVENESS_ANNOTATION: &str = "kube-leader.io/liveness-seconds";
/// Label marking the lock as kube-leader's (`app.kubernetes.io/managed-by=kube-leader`).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Label naming the strategy of the lock (`kube-leader.io/strategy=for-life`).
pub const STRATEGY_LABEL: &str = "kube-leader.io/strategy";

/// The lock object: its namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LockRef {
    /// Namespace of the lock object.
    pub namespace: String,
    /// Name of the lock object.
    pub name: String,
}

// === impl LockRef ===

impl LockRef {
    /// A lock reference, validating `name` as a Kubernetes object name (DNS-1123 subdomain).
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        validate_name(&name)?;
        Ok(Self {
            namespace: namespace.into(),
            name,
        })
    }
}

impl fmt::Display for LockRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Checks that `name` is a DNS-1123 subdomain, as Kubernetes requires of ConfigMap and Lease names:
/// at most 253 characters of lower-case alphanumerics, `-` and `.`, each dot-separated part
/// starting and ending with an alphanumeric.
pub fn validate_name(name: &str) -> Result<()> {
    let reject = |reason: &str| {
        Err(Error::InvalidLockName {
            name: name.to_string(),
            reason: reason.to_string(),
        })
    };
    if name.is_empty() {
        return reject("must not be empty");
    }
    if name.len() > 253 {
        return reject("must be at most 253 characters");
    }
    for part in name.split('.') {
        if part.is_empty() {
            return reject("must not contain empty dot-separated parts");
        }
        if !part
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return reject("must consist of lower-case letters, digits, '-' and '.'");
        }
        let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        if !alnum(part.as_bytes()[0]) || !alnum(part.as_bytes()[part.len() - 1]) {
            return reject("must start and end with a letter or digit");
        }
    }
    Ok(())
}

/// A `resourceVersion` as a fencing token: etcd3's revision, a decimal number. Kubernetes calls
/// resource versions opaque; every etcd-backed API server writes the revision of the write.
pub(crate) fn parse_resource_version(rv: Option<&str>) -> Option<u64> {
    rv?.trim().parse().ok()
}

/// The fencing token of the write that answered with `rv`; `fallback` (with a warning) if the
/// API server's resourceVersion is not a number.
pub(crate) fn fencing_token(rv: Option<&str>, fallback: u64) -> u64 {
    parse_resource_version(rv).unwrap_or_else(|| {
        tracing::warn!(resource_version = ?rv, fallback,
            "the API server's resourceVersion is not a number; the fencing token falls back");
        fallback
    })
}

/// Whether resourceVersion `a` is newer than `b` (numerically, as etcd revisions are; versions
/// that are not numbers count as newer when they differ, so a cache follows its watch).
pub(crate) fn is_newer(a: Option<&str>, b: Option<&str>) -> bool {
    match (parse_resource_version(a), parse_resource_version(b)) {
        (Some(a), Some(b)) => a > b,
        _ => a != b,
    }
}

/// The owner reference to the Pod `name` (UID `uid`) that kube-leader's objects carry (a
/// leader-for-life lock, a candidate's registration), so that they go with the Pod:
/// `apiVersion: v1, kind: Pod, name, uid`.
///
/// `controller` and `blockOwnerDeletion` stay unset (as with operator-sdk): setting
/// `blockOwnerDeletion` would need `update` on `pods/finalizers` under the
/// OwnerReferencesPermissionEnforcement admission plugin, for nothing, since the object only has
/// to go after the Pod.
pub(crate) fn pod_owner_reference(name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: name.to_string(),
        uid: uid.to_string(),
        ..OwnerReference::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in [
            "a",
            "lock",
            "my-operator-lock",
            "a.b.c",
            "x1",
            "1x",
            &"a".repeat(253),
        ] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Lock",
            "-a",
            "a-",
            "a..b",
            ".a",
            "a_b",
            "a/b",
            "ä",
            " a",
            &"a".repeat(254),
        ] {
            let err = validate_name(bad).unwrap_err();
            assert!(matches!(err, Error::InvalidLockName { .. }), "{bad}");
            assert!(err.to_string().contains("invalid lock name"), "{err}");
        }
    }

    #[test]
    fn resource_versions_compare_as_numbers() {
        assert!(is_newer(Some("10"), Some("9")));
        assert!(!is_newer(Some("9"), Some("10")));
        assert!(!is_newer(Some("9"), Some("9")));
        assert!(is_newer(Some("x"), Some("9")));
        assert!(!is_newer(Some("x"), Some("x")));
        assert_eq!(fencing_token(Some("42"), 7), 42);
        assert_eq!(fencing_token(Some("abc"), 7), 7);
    }
}
