//! The lock object: its name, the metadata kube-leader writes on it, resourceVersions as fencing
//! tokens, and finding the namespace and identity of this candidate.

use std::{fmt, path::Path};

use crate::error::{Error, Result};

/// The in-cluster service-account namespace file (operator-sdk's `k8sutil.GetOperatorNamespace`).
pub const SERVICE_ACCOUNT_NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

// The metadata kube-leader writes on its lock objects (both strategies).

/// Annotation naming the holder of the lock: the Pod (leader for life), or the identity whose
/// fencing token [`FENCING_TOKEN_ANNOTATION`] holds (Lease).
pub const HOLDER_ANNOTATION: &str = "kube-leader.io/holder";
/// Annotation with the time the holder acquired the lock (RFC 3339, the holder's wall clock).
pub const ACQUIRED_AT_ANNOTATION: &str = "kube-leader.io/acquired-at";
/// Annotation with the holder's fencing token: the lock's `resourceVersion` at creation (leader
/// for life), or that of the write that made the holder leader (Lease).
pub const FENCING_TOKEN_ANNOTATION: &str = "kube-leader.io/fencing-token";
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

/// Where the namespace came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NamespaceSource {
    /// Given explicitly in the configuration.
    Explicit,
    /// From the `POD_NAMESPACE` environment variable.
    PodNamespaceEnv,
    /// From the in-cluster service-account namespace file.
    ServiceAccount,
}

/// Finds the namespace of this candidate: `explicit`, else `POD_NAMESPACE`, else the
/// service-account file. `None` means "not running in a cluster" (operator-sdk's `ErrNoNamespace`).
pub fn discover_namespace(explicit: Option<&str>) -> Option<(String, NamespaceSource)> {
    discover_namespace_from(
        explicit,
        std::env::var("POD_NAMESPACE").ok().as_deref(),
        Path::new(SERVICE_ACCOUNT_NAMESPACE_FILE),
    )
}

pub(crate) fn discover_namespace_from(
    explicit: Option<&str>,
    env: Option<&str>,
    sa_file: &Path,
) -> Option<(String, NamespaceSource)> {
    let clean = |s: &str| Some(s.trim().to_string()).filter(|s| !s.is_empty());
    if let Some(ns) = explicit.and_then(clean) {
        return Some((ns, NamespaceSource::Explicit));
    }
    if let Some(ns) = env.and_then(clean) {
        return Some((ns, NamespaceSource::PodNamespaceEnv));
    }
    let ns = std::fs::read_to_string(sa_file).ok()?;
    clean(&ns).map(|ns| (ns, NamespaceSource::ServiceAccount))
}

/// The Pod name from `POD_NAME` (set with the Downward API), if any.
pub fn pod_name_from_env() -> Option<String> {
    std::env::var("POD_NAME")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The namespace of a lock that names none: as [`discover_namespace`], else the client's
/// default namespace (its kubeconfig context's, or `default`).
pub fn namespace_or_default(explicit: Option<&str>, client: &kube::Client) -> String {
    discover_namespace(explicit).map_or_else(|| client.default_namespace().to_string(), |(ns, _)| ns)
}

/// This candidate's identity: `explicit`, else `POD_NAME`, else the host name; `None` if all
/// are empty.
pub fn resolve_identity(explicit: Option<&str>) -> Option<String> {
    explicit
        .map(str::to_string)
        .or_else(pod_name_from_env)
        .or_else(hostname)
        .filter(|id| !id.trim().is_empty())
}

/// The host name, for a default identity.
fn hostname() -> Option<String> {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
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

    #[test]
    fn namespace_precedence() {
        let dir = std::env::temp_dir().join(format!("kl-ns-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("namespace");
        std::fs::write(&file, "from-file\n").unwrap();
        let missing = dir.join("missing");
        assert_eq!(
            discover_namespace_from(Some("x"), Some("y"), &file),
            Some(("x".into(), NamespaceSource::Explicit))
        );
        assert_eq!(
            discover_namespace_from(Some(" "), Some("y"), &file),
            Some(("y".into(), NamespaceSource::PodNamespaceEnv))
        );
        assert_eq!(
            discover_namespace_from(None, None, &file),
            Some(("from-file".into(), NamespaceSource::ServiceAccount))
        );
        assert_eq!(discover_namespace_from(None, Some(""), &missing), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
