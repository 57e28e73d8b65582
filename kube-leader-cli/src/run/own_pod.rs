//! `--watch-own-pod` (Lease): this candidate's own Pod, watched so that its deletion stops
//! kube-leader at once, as the kubelet's SIGTERM would a moment later.
//!
//! On a busy node the kubelet sends SIGTERM 10 ms to over a second after the Pod's deletion
//! is stored (measured on the test node: docs/node.md); the Pod's watch event comes within a
//! few milliseconds. A leader for life watches its Pod in the library already.

use anyhow::anyhow;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    runtime::{watcher, WatchStreamExt},
    Api, Client,
};
use kube_leader::CandidatePod;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::exit::{self, Fail};

/// Why this candidate's Pod is ending, once it is.
pub(crate) type Ending = watch::Receiver<Option<String>>;

/// This candidate's Pod as the Downward API tells it, without a request: `POD_UID`
/// (`metadata.uid`) and `POD_NAME` (else `identity`). With it, the candidate's registration is
/// written once, owned by the Pod (the garbage collector ends it with the Pod), and an idle
/// follower sends nothing for it; without it, the registration is renewed every 15 s, as a
/// candidate's outside a cluster must be (nothing else would end it).
pub(crate) fn from_env(identity: &str) -> Option<CandidatePod> {
    let uid = std::env::var("POD_UID").ok()?;
    let uid = uid.trim();
    if uid.is_empty() {
        return None;
    }
    let name = kube_leader::internal::discovery::pod_name_from_env().unwrap_or_else(|| identity.to_owned());
    Some(CandidatePod::new(name, uid))
}

/// [`watch`]es this candidate's Pod: its namespace is POD_NAMESPACE, else the service-account
/// namespace, else the client's; its name POD_NAME, else `identity`.
pub(crate) async fn watch_own(client: Client, identity: &str) -> Result<(Ending, CandidatePod), Fail> {
    let namespace = kube_leader::internal::discovery::namespace_or_default(None, &client);
    let name = kube_leader::internal::discovery::pod_name_from_env().unwrap_or_else(|| identity.to_owned());
    watch(client, &namespace, &name).await
}

/// Checks that this candidate's Pod can be read (the permission, the name), then watches it:
/// the receiver gets the reason once the Pod is being deleted, is terminal, or is gone. Also the
/// Pod as the candidate's registration names it (its UID and creation time).
async fn watch(client: Client, namespace: &str, name: &str) -> Result<(Ending, CandidatePod), Fail> {
    let pods: Api<Pod> = Api::namespaced(client, namespace);
    let hint = "--watch-own-pod needs get, list and watch on pods in the Pod's namespace \
                (kube-leader rbac --strategy lease --watch-own-pod prints the Role)";
    let first = match pods.get_opt(name).await {
        Ok(Some(pod)) => pod,
        Ok(None) => {
            return Err(Fail::new(
                exit::USAGE,
                anyhow!(
                    "--watch-own-pod: there is no Pod {namespace}/{name} (the Pod's name comes \
                     from POD_NAME, else --identity; its namespace from POD_NAMESPACE, else the \
                     service-account namespace)"
                ),
            ))
        }
        Err(kube::Error::Api(e)) if e.code == 403 => {
            return Err(Fail::new(
                exit::CLUSTER,
                anyhow!(
                    "cannot get Pod {namespace}/{name}: forbidden: {}. {hint}",
                    e.message
                ),
            ))
        }
        Err(e) => {
            return Err(Fail::new(
                exit::CLUSTER,
                anyhow!(e).context(format!("--watch-own-pod: cannot get Pod {namespace}/{name}")),
            ))
        }
    };
    let (tx, rx) = watch::channel(None);
    let uid = first.metadata.uid.clone();
    let mut candidate = CandidatePod::new(name, uid.clone().unwrap_or_default());
    candidate.created = first.metadata.creation_timestamp.as_ref().map(|t| t.0);
    if let Some(why) = ending(Some(&first), uid.as_deref()) {
        let _ = tx.send(Some(why));
        return Ok((rx, candidate));
    }
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let name = name.to_owned();
    tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(pods, config).default_backoff());
        while let Some(event) = events.next().await {
            let pod = match event {
                Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => Some(pod),
                Ok(watcher::Event::Delete(_)) => None,
                Ok(_) => continue,
                Err(e) => {
                    warn!(pod = %name, error = %e, "watching this candidate's Pod failed; retrying. {hint}");
                    continue;
                }
            };
            if let Some(why) = ending(pod.as_ref(), uid.as_deref()) {
                info!(pod = %name, "this candidate's Pod {why}: stopping as on SIGTERM");
                let _ = tx.send(Some(why));
                return;
            }
        }
        debug!(pod = %name, "the watch of this candidate's Pod ended");
    });
    Ok((rx, candidate))
}

/// Why `pod` (this candidate's, of UID `uid`) is ending, if it is.
fn ending(pod: Option<&Pod>, uid: Option<&str>) -> Option<String> {
    let Some(pod) = pod else {
        return Some("was deleted".into());
    };
    if uid.is_some() && pod.metadata.uid.as_deref() != uid {
        return Some("was replaced by another Pod of that name".into());
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return Some("is being deleted".into());
    }
    match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some(phase @ ("Succeeded" | "Failed")) => Some(format!("is in phase {phase}")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn pod(uid: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.uid = Some(uid.into());
        pod
    }

    #[test]
    fn a_running_pod_is_not_ending() {
        assert_eq!(ending(Some(&pod("a")), Some("a")), None);
    }

    #[test]
    fn deletion_terminal_phase_gone_and_replaced_are_endings() {
        let mut deleting = pod("a");
        deleting.metadata.deletion_timestamp = Some(Time(Default::default()));
        assert_eq!(
            ending(Some(&deleting), Some("a")).as_deref(),
            Some("is being deleted")
        );
        let mut failed = pod("a");
        failed.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Failed".into()),
            ..Default::default()
        });
        assert_eq!(
            ending(Some(&failed), Some("a")).as_deref(),
            Some("is in phase Failed")
        );
        assert_eq!(ending(None, Some("a")).as_deref(), Some("was deleted"));
        assert!(ending(Some(&pod("b")), Some("a")).unwrap().contains("replaced"));
    }
}
