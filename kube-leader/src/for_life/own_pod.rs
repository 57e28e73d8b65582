//! The read of a leader-for-life candidate's own Pod (operator-sdk's `myOwnerRef`).

use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};
use kube::Api;
use tracing::debug;

use super::{
    api::pod_op,
    config::{ForLifeConfig, INITIAL_BACKOFF},
    record::PodRef,
};
use crate::{
    api::{call, Failure},
    backoff::Backoff,
    error::{Error, Result},
    lock::LockRef,
};

/// Reads this candidate's Pod (operator-sdk's `myOwnerRef`), retrying transient errors.
/// Also its creation time, the candidate's age.
pub(super) async fn own_pod(
    pods: &Api<Pod>,
    lock: &LockRef,
    name: &str,
    config: &ForLifeConfig,
) -> Result<(PodRef, Option<Timestamp>)> {
    let op = pod_op(&lock.namespace, name, "get");
    let not_found = || Error::OwnPodNotFound {
        namespace: lock.namespace.clone(),
        name: name.to_string(),
    };
    let mut backoff = Backoff::new(INITIAL_BACKOFF, config.backoff_cap);
    loop {
        match call(op, config.api_timeout, pods.get_opt(name)).await {
            Ok(Some(pod)) => {
                let created = pod.metadata.creation_timestamp.map(|t| t.0);
                let uid = pod.metadata.uid.filter(|u| !u.is_empty()).ok_or_else(not_found)?;
                let me = PodRef {
                    name: name.to_string(),
                    uid,
                };
                return Ok((me, created));
            }
            Ok(None) | Err(Failure::NotFound) => return Err(not_found()),
            Err(Failure::Fatal(e)) => return Err(e),
            Err(e @ (Failure::Conflict | Failure::Transient(_))) => {
                let delay = backoff.next_delay();
                debug!(error = ?e, ?delay, "reading this candidate's Pod failed; retrying");
                tokio::time::sleep(delay).await;
            }
        }
    }
}
