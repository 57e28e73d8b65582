//! `--label-pod`: the leader label on this candidate's Pod, best effort.

use std::{future::Future, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use kube::{
    api::{Patch, PatchParams},
    Api, Client,
};
use tokio::sync::watch;
use tracing::{debug, warn};

/// The label `--label-pod` sets on this candidate's Pod.
pub(crate) const LEADER_LABEL: &str = "kube-leader.io/leader";

/// How a label update ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// The API server took it.
    Done,
    /// Worth another try (timeout, transient error): the write may or may not have landed.
    Retry,
    /// Retrying cannot help (no permission, no such Pod): warned once.
    GiveUp,
}

/// How long to wait before trying a failed label update again.
const RETRY: Duration = Duration::from_secs(1);

/// The leader label on one Pod, kept by one task that applies the latest desired value, one
/// request at a time: a slow `true` can never land after a later `false` (independent
/// requests could overtake each other). A request that timed out may still land late, so the
/// task writes the current value again after any failure that can be retried.
#[derive(Debug)]
pub(crate) struct PodLabel {
    desired: watch::Sender<Option<bool>>,
    applied: watch::Receiver<Option<bool>>,
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
                    Ok(Ok(_)) => {
                        debug!(pod = %pod, leader, "labelled the Pod");
                        Outcome::Done
                    }
                    Ok(Err(kube::Error::Api(s))) if matches!(s.code, 403 | 404 | 422) => {
                        warn!(pod = %pod, leader, error = %s.message,
                            "cannot label the Pod (needs patch pods: kube-leader rbac --label-pod)");
                        Outcome::GiveUp
                    }
                    Ok(Err(e)) => {
                        debug!(pod = %pod, leader, error = %e, "labelling the Pod failed; retrying");
                        Outcome::Retry
                    }
                    Err(_) => {
                        debug!(pod = %pod, leader, "labelling the Pod timed out; retrying");
                        Outcome::Retry
                    }
                }
            }
        })
    }

    fn with_patcher<F, Fut>(patch: F) -> Self
    where
        F: Fn(bool) -> Fut + Send + 'static,
        Fut: Future<Output = Outcome> + Send + 'static,
    {
        let (desired, mut want) = watch::channel(None);
        let (done, applied) = watch::channel(None);
        tokio::spawn(async move {
            loop {
                let Some(leader) = *want.borrow_and_update() else {
                    if want.changed().await.is_err() {
                        return;
                    }
                    continue;
                };
                match patch(leader).await {
                    Outcome::Done | Outcome::GiveUp => {
                        let _ = done.send(Some(leader));
                        if want.changed().await.is_err() {
                            return;
                        }
                    }
                    Outcome::Retry => {
                        // Again after a while, or at once with a newer value.
                        if let Ok(Err(_)) = tokio::time::timeout(RETRY, want.changed()).await {
                            // The handle is gone (kube-leader is exiting): keep trying the last
                            // value while the process lasts.
                            tokio::time::sleep(RETRY).await;
                        }
                    }
                }
            }
        });
        Self { desired, applied }
    }

    /// Asks for the label to become `leader` (in the background).
    pub(crate) fn set(&self, leader: bool) {
        self.desired.send_replace(Some(leader));
    }

    /// Waits until the latest value asked for was applied (or given up on), at most `limit`.
    pub(crate) async fn settle(&self, limit: Duration) {
        let want = *self.desired.borrow();
        let mut applied = self.applied.clone();
        let _ = tokio::time::timeout(limit, applied.wait_for(|a| *a == want)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

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
                Outcome::Done
            }
        });
        label.set(false);
        tokio::time::sleep(Duration::from_millis(50)).await;
        label.set(true);
        tokio::time::sleep(Duration::from_millis(5)).await;
        label.set(false);
        label.settle(Duration::from_secs(10)).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let landed = landed.lock().unwrap().clone();
        assert_eq!(landed.last(), Some(&false), "landed in this order: {landed:?}");
    }

    /// A failed update is tried again until it lands; a newer value replaces it.
    #[tokio::test(start_paused = true)]
    async fn failures_are_retried_with_the_latest_value() {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let c = calls.clone();
        let label = PodLabel::with_patcher(move |leader| {
            let c = c.clone();
            async move {
                let mut calls = c.lock().unwrap();
                calls.push(leader);
                if calls.len() < 3 {
                    Outcome::Retry
                } else {
                    Outcome::Done
                }
            }
        });
        label.set(true);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        label.set(false);
        label.settle(Duration::from_secs(10)).await;
        assert_eq!(*calls.lock().unwrap(), vec![true, true, false]);
    }
}
