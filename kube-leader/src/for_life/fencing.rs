//! The leader-for-life fencing token: the lock's `resourceVersion` at creation, stored in the
//! lock by the new leader beside its watch (see the [module docs](super)).

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{api::PostParams, Api};
use tracing::{debug, warn};

use super::{
    api::cm_op,
    config::INITIAL_BACKOFF,
    record::{with_fencing_token, LockRecord, PodRef},
    steps,
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
    let mut store = TokenStore {
        uid: lock.metadata.uid.clone(),
        configmaps,
        lock_ref,
        me,
        token,
        timeout,
        backoff: Backoff::new(INITIAL_BACKOFF, backoff_cap),
    };
    while LockRecord::from_config_map(&lock).fencing_token != Some(token) {
        if store.write(&lock).await == Step::Done {
            return;
        }
        match store.reread().await {
            Step::Done => return,
            Step::Again(Some(fresh)) => lock = *fresh,
            Step::Again(None) => {}
        }
    }
}

/// What storing the token does next.
#[derive(Debug, PartialEq)]
enum Step {
    /// Stored, or not to be stored any more (the lock is gone or not ours, or writing it is
    /// refused).
    Done,
    /// Try again (with the lock as read afresh, if it was).
    Again(Option<Box<ConfigMap>>),
}

/// Storing one term's fencing token in its lock.
struct TokenStore {
    configmaps: Api<ConfigMap>,
    lock_ref: LockRef,
    me: PodRef,
    /// The lock's UID: a lock of the same name with another UID is another term's.
    uid: Option<String>,
    token: u64,
    timeout: Duration,
    backoff: Backoff,
}

// === impl TokenStore ===

impl TokenStore {
    /// Writes the token into `lock` (its resourceVersion the precondition).
    async fn write(&mut self, lock: &ConfigMap) -> Step {
        let desired = with_fencing_token(lock.clone(), self.token);
        let params = PostParams::default();
        let (replace, sent) = (
            self.configmaps.replace(&self.lock_ref.name, &params, &desired),
            tokio::time::Instant::now(),
        );
        let written = call(cm_op(&self.lock_ref, "update"), self.timeout, replace).await;
        let pre = (
            desired.metadata.uid.as_deref(),
            desired.metadata.resource_version.as_deref(),
        );
        steps::write("token", pre, Some(&desired), sent, &written, steps::written);
        match written {
            Ok(_) => {
                debug!(fencing_token = self.token, "stored the fencing token in the lock");
                Step::Done
            }
            Err(Failure::NotFound) => Step::Done,
            Err(Failure::Fatal(e)) => refused(&e),
            Err(Failure::Conflict) => {
                debug!("the lock changed before the fencing token was written; re-reading");
                Step::Again(None)
            }
            Err(Failure::Transient(e)) => {
                let delay = self.backoff.next_delay();
                debug!(error = %e, ?delay, "writing the fencing token failed; retrying");
                tokio::time::sleep(delay).await;
                Step::Again(None)
            }
        }
    }

    /// Reads the lock again: still this term's, or gone or replaced (the leader's watch says so).
    async fn reread(&mut self) -> Step {
        let get = self.configmaps.get_opt(&self.lock_ref.name);
        match call(cm_op(&self.lock_ref, "get"), self.timeout, get).await {
            Ok(Some(fresh))
                if fresh.metadata.uid == self.uid
                    && LockRecord::from_config_map(&fresh).is_owned_by(&self.me) =>
            {
                Step::Again(Some(Box::new(fresh)))
            }
            Ok(_) | Err(Failure::NotFound | Failure::Conflict) => Step::Done,
            Err(Failure::Fatal(e)) => refused(&e),
            Err(Failure::Transient(e)) => {
                let delay = self.backoff.next_delay();
                debug!(error = %e, ?delay, "re-reading the lock failed; retrying");
                tokio::time::sleep(delay).await;
                Step::Again(None)
            }
        }
    }
}

fn refused(e: &crate::error::Error) -> Step {
    warn!(error = %e, "could not store the fencing token in the lock (leadership is not affected)");
    Step::Done
}

/// The fencing token of a lock just created or found: its `resourceVersion` (etcd's revision).
pub(crate) fn fencing_token_of(lock: &ConfigMap) -> u64 {
    lock::fencing_token(lock.metadata.resource_version.as_deref(), 0)
}
