//! Finding this candidate's namespace and identity: from the configuration, the Downward API's
//! environment variables (`POD_NAMESPACE`, `POD_NAME`), the in-cluster service-account mount,
//! the host name, or the client's kubeconfig context.

use std::path::Path;

/// The in-cluster service-account namespace file (operator-sdk's `k8sutil.GetOperatorNamespace`).
pub const SERVICE_ACCOUNT_NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

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

#[cfg(test)]
mod tests {
    use super::*;

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
