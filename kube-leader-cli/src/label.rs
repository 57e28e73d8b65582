//! `--label-pod`: the leader label on this candidate's Pod, best effort.

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use kube::{
    api::{Patch, PatchParams},
    Api, Client,
};
use tracing::{debug, warn};

/// The label `--label-pod` sets on this candidate's Pod.
pub(crate) const LEADER_LABEL: &str = "kube-leader.io/leader";

type Patcher = Arc<dyn Fn(bool) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// The leader label on one Pod.
pub(crate) struct PodLabel {
    patch: Patcher,
}

impl std::fmt::Debug for PodLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodLabel").finish_non_exhaustive()
    }
}

impl PodLabel {
    pub(crate) fn new(client: Client, namespace: &str, pod: String) -> Self {
        let api: Api<Pod> = Api::namespaced(client, namespace);
        Self::with_patcher(move |leader| {
            let (api, pod) = (api.clone(), pod.clone());
            async move {
                let patch =
                    serde_json::json!({ "metadata": { "labels": { LEADER_LABEL: leader.to_string() } } });
                let params = PatchParams::default();
                let patch = Patch::Merge(&patch);
                let call = api.patch(&pod, &params, &patch);
                match tokio::time::timeout(Duration::from_secs(10), call).await {
                    Ok(Ok(_)) => debug!(pod = %pod, leader, "labelled the Pod"),
                    Ok(Err(e)) => warn!(pod = %pod, leader, error = %e,
                        "cannot label the Pod (needs patch pods: kube-leader rbac --label-pod)"),
                    Err(_) => warn!(pod = %pod, leader, "labelling the Pod timed out"),
                }
            }
        })
    }

    fn with_patcher<F, Fut>(patch: F) -> Self
    where
        F: Fn(bool) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        Self {
            patch: Arc::new(move |leader| Box::pin(patch(leader))),
        }
    }

    /// Sets the label in the background; await the handle to wait for it.
    pub(crate) fn set(&self, leader: bool) -> tokio::task::JoinHandle<()> {
        tokio::spawn((self.patch)(leader))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A late `true` (a slow request) must never land after a later `false`.
    #[tokio::test(start_paused = true)]
    async fn updates_land_in_order_and_the_last_one_wins() {
        let landed = Arc::new(Mutex::new(Vec::new()));
        let l = landed.clone();
        let label = PodLabel::with_patcher(move |leader| {
            let l = l.clone();
            async move {
                // The `true` request is slow on the wire.
                let delay = if leader { 300 } else { 10 };
                tokio::time::sleep(Duration::from_millis(delay)).await;
                l.lock().unwrap().push(leader);
            }
        });
        let _ = label.set(false);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _ = label.set(true);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let last = label.set(false);
        let _ = last.await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let landed = landed.lock().unwrap().clone();
        assert_eq!(landed.last(), Some(&false), "landed in this order: {landed:?}");
    }
}
