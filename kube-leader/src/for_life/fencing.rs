//! The leader-for-life fencing token: the lock's `resourceVersion` at creation, stored in the
//! lock by the new leader beside its watch (see the [module docs](super)).

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{api::PostParams, Api};
use tracing::{debug, warn};

use super::{
    config::INITIAL_BACKOFF,
    elector::cm_op,
    record::{with_fencing_token, LockRecord, PodRef},
};
use crate::{
    api::{call, Failure},
    backoff::Backoff,
    lock::{self, LockRef},
};

/// Writes the fencing token into the leader's new lock (`lock`, as created), with the lock's
/// `resourceVersion` as precondition, re-reading after a conflict. Runs beside the leader's
/// watch, so that taking over costs one write; until it is done, readers fall back to the
/// lock's `resourceVersion`, which is the same number while nobody else has written the lock.
pub(super) async fn store_fencing_token(
    configmaps: Api<ConfigMap>,
    lock_ref: LockRef,
    me: PodRef,
    mut lock: ConfigMap,
    token: u64,
    timeout: Duration,
    backoff_cap: Duration,
) {
    let uid = lock.metadata.uid.clone();
    let mut backoff = Backoff::new(INITIAL_BACKOFF, backoff_cap);
    let op = |verb| cm_op(&lock_ref, verb);
    loop {
        if LockRecord::from_config_map(&lock).fencing_token == Some(token) {
            return;
        }
        let desired = with_fencing_token(lock.clone(), token);
        let params = PostParams::default();
        match call(
            op("update"),
            timeout,
            configmaps.replace(&lock_ref.name, &params, &desired),
        )
        .await
        {
            Ok(_) => {
                debug!(fencing_token = token, "stored the fencing token in the lock");
                return;
            }
            Err(Failure::NotFound) => return,
            Err(Failure::Fatal(e)) => {
                warn!(error = %e, "could not store the fencing token in the lock (leadership is not affected)");
                return;
            }
            Err(Failure::Conflict) => {
                debug!("the lock changed before the fencing token was written; re-reading")
            }
            Err(Failure::Transient(e)) => {
                let delay = backoff.next_delay();
                debug!(error = %e, ?delay, "writing the fencing token failed; retrying");
                tokio::time::sleep(delay).await;
            }
        }
        match call(op("get"), timeout, configmaps.get_opt(&lock_ref.name)).await {
            Ok(Some(fresh))
                if fresh.metadata.uid == uid && LockRecord::from_config_map(&fresh).is_owned_by(&me) =>
            {
                lock = fresh;
            }
            // Gone or replaced: the leader's watch says so.
            Ok(_) | Err(Failure::NotFound | Failure::Conflict) => return,
            Err(Failure::Fatal(e)) => {
                warn!(error = %e, "could not store the fencing token in the lock (leadership is not affected)");
                return;
            }
            Err(Failure::Transient(e)) => {
                let delay = backoff.next_delay();
                debug!(error = %e, ?delay, "re-reading the lock failed; retrying");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// The fencing token of a lock just created or found: its `resourceVersion` (etcd's revision).
pub(super) fn fencing_token_of(lock: &ConfigMap) -> u64 {
    lock::fencing_token(lock.metadata.resource_version.as_deref(), 0)
}
