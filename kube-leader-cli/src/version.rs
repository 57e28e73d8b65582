//! What `kube-leader --version` says: the version, the commit it was built from, and the
//! Kubernetes versions it works with.

/// The commit the binary was built from (12 hex digits), or `unknown` (see `build.rs`).
pub(crate) const COMMIT: &str = env!("KUBE_LEADER_GIT_COMMIT");

/// `kube-leader -V`.
pub(crate) const SHORT: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("KUBE_LEADER_GIT_COMMIT"),
    ")"
);

/// The oldest Kubernetes minor version kube-leader supports and tests (as [`LONG`] says).
#[cfg(test)]
const MIN_KUBERNETES: &str = "1.34";

/// The Kubernetes version the tests run against (as [`LONG`] says).
#[cfg(test)]
const TESTED_KUBERNETES: &str = "1.37.2";

/// `kube-leader --version`.
pub(crate) const LONG: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("KUBE_LEADER_GIT_COMMIT"),
    ")\n",
    "Kubernetes: 1.34 to 1.37 (tested against 1.37.2 and 1.34.4). Uses only GA APIs: \
     coordination.k8s.io/v1 Leases (GA in 1.14), core/v1 ConfigMaps, Pods, Nodes and Events.\n",
    "Built with kube 5 and k8s-openapi 0.29 (Kubernetes 1.33 API types; fields newer than the \
     API server are ignored by it)."
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_name_the_commit_and_kubernetes() {
        assert!(SHORT.starts_with(env!("CARGO_PKG_VERSION")), "{SHORT}");
        assert!(SHORT.contains(COMMIT), "{SHORT}");
        assert!(
            COMMIT == "unknown" || (COMMIT.len() == 12 && COMMIT.bytes().all(|b| b.is_ascii_hexdigit())),
            "{COMMIT}"
        );
        assert!(LONG.contains(&format!("{MIN_KUBERNETES} to 1.37")), "{LONG}");
        assert!(LONG.contains(TESTED_KUBERNETES), "{LONG}");
    }
}
