//! Reading who leads, without campaigning: for status commands and followers.

use std::time::SystemTime;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};
use tokio::sync::watch;

use super::{api::RBAC_HINT, record::LockRecord};
use crate::{
    error::Result,
    leadership::{LeaderInfo, Strategy},
    lock::{parse_resource_version, LockRef},
    object_watch,
};

/// What a leader-for-life lock says about its leader.
///
/// `holder` is the owner Pod's name, or `None` if the lock is malformed (no owner, several, or
/// not a Pod): nobody leads then, and no candidate will until the lock is fixed or deleted. The
/// fencing token is the lock's annotation, else its `resourceVersion` (what the holder adopts
/// if it never wrote the annotation); the acquire time is the annotation, else the lock's
/// creation time.
pub(crate) fn leader_info(lock: &LockRef, cm: &ConfigMap) -> LeaderInfo {
    let record = LockRecord::from_config_map(cm);
    let created = cm
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| SystemTime::from(t.0));
    LeaderInfo {
        strategy: Strategy::ForLife,
        lock: lock.clone(),
        holder: record.holder().map(str::to_string),
        fencing_token: record
            .fencing_token
            .or_else(|| parse_resource_version(cm.metadata.resource_version.as_deref())),
        acquired_at: record.acquired_at.or(created),
        renewed_at: None,
        lease_duration: None,
    }
}

/// Reads the current leader of a leader-for-life lock once, without campaigning (`None`: no
/// lock, so nobody leads). See [`LeaderInfo`] for a malformed lock (`holder: None`).
///
/// Does not check that the holder's Pod is alive: a lock of a dead Pod is reported until a
/// candidate or the garbage collector deletes it.
///
/// # Cancellation safety
/// Cancel-safe.
pub async fn current_leader(client: Client, lock: &LockRef) -> Result<Option<LeaderInfo>> {
    let api: Api<ConfigMap> = Api::namespaced(client, &lock.namespace);
    object_watch::read_leader(api, lock, "configmaps", RBAC_HINT, leader_info).await
}

/// Watches the leader of a leader-for-life lock without campaigning, for followers and
/// dashboards: the channel holds `None` while there is no lock, and changes only when the
/// leader (or its term) does. The watch runs in a task that ends when every receiver is dropped,
/// or (with a warning) when reading the lock is forbidden.
pub fn watch_leader(client: Client, lock: LockRef) -> watch::Receiver<Option<LeaderInfo>> {
    let api: Api<ConfigMap> = Api::namespaced(client, &lock.namespace);
    object_watch::watch_leader(api, lock, "configmaps", RBAC_HINT, leader_info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::for_life::record::{lock_config_map, with_fencing_token, PodRef};
    use k8s_openapi::jiff::Timestamp;

    #[test]
    fn info_from_a_lock() {
        let lock = LockRef::new("ns", "l").unwrap();
        let me = PodRef {
            name: "p".into(),
            uid: "u".into(),
        };
        let at: Timestamp = "2024-01-02T03:04:05Z".parse().unwrap();
        let mut cm = lock_config_map(&lock, &me, at);
        cm.metadata.resource_version = Some("77".into());
        let info = leader_info(&lock, &cm);
        assert_eq!(info.holder.as_deref(), Some("p"));
        assert_eq!(info.fencing_token, Some(77), "falls back to the resourceVersion");
        assert_eq!(info.acquired_at, Some(SystemTime::from(at)));
        assert_eq!(info.strategy, Strategy::ForLife);

        let cm = with_fencing_token(cm, 42);
        assert_eq!(leader_info(&lock, &cm).fencing_token, Some(42));

        let mut malformed = cm.clone();
        malformed.metadata.owner_references = None;
        assert_eq!(leader_info(&lock, &malformed).holder, None);
    }
}
