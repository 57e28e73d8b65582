//! A randomly named namespace per test.

use k8s_openapi::api::core::v1::Namespace;
use kube::{api::DeleteParams, Api, Client, Config};
use rand::Rng;

/// A namespace created for one test by [`ControlPlane::namespace`](crate::ControlPlane::namespace).
///
/// Dropping it deletes the namespace, best effort and in the background: the deletion is not
/// awaited and its errors are ignored. Namespaces die with the control plane anyway.
#[must_use = "dropping the guard deletes the namespace"]
pub struct TestNamespace {
    name: String,
    admin: Config,
}

// === impl TestNamespace ===

impl TestNamespace {
    pub(crate) fn new(name: String, admin: Config) -> Self {
        Self { name, admin }
    }

    /// The namespace's name, `kl-<random>`.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl std::fmt::Debug for TestNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("TestNamespace").field(&self.name).finish()
    }
}

impl std::fmt::Display for TestNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        // Drop may run outside a runtime, or inside one that is shutting down; a thread with a
        // runtime of its own works in both cases.
        let name = std::mem::take(&mut self.name);
        let admin = self.admin.clone();
        let _ = std::thread::Builder::new()
            .name("kube-leader-testenv-namespace-delete".into())
            .spawn(move || {
                let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                runtime.block_on(async {
                    let Ok(client) = Client::try_from(admin) else {
                        return;
                    };
                    let deleted = tokio::time::timeout(
                        std::time::Duration::from_secs(10),
                        Api::<Namespace>::all(client).delete(&name, &DeleteParams::default()),
                    )
                    .await;
                    tracing::debug!(namespace = %name, ok = matches!(deleted, Ok(Ok(_))), "deleted test namespace");
                });
            });
    }
}

/// `len` random characters from `[a-z0-9]`, valid in any Kubernetes name.
pub(crate) fn random_suffix(len: usize) -> String {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..len)
        .map(|_| char::from(CHARS[rng.random_range(0..CHARS.len())]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_suffixes_are_dns_labels() {
        let suffix = random_suffix(10);
        assert_eq!(suffix.len(), 10);
        assert!(suffix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
        assert_ne!(suffix, random_suffix(10));
    }
}
