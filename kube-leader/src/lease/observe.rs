//! The leader of a Lease, read or watched without campaigning.

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use tokio::sync::watch;

use super::{
    record::{stored_fencing_token, LeaseRecord},
    shared::{leader_info, RBAC_HINT, RESOURCE},
};
use crate::{error::Result, leadership::LeaderInfo, lock::LockRef, object_watch};

/// Reads the current leader of a Lease once, without campaigning (`None`: no such Lease).
///
/// # Cancellation safety
/// Cancel-safe.
pub async fn current_leader(client: Client, lock: &LockRef) -> Result<Option<LeaderInfo>> {
    let api: Api<Lease> = Api::namespaced(client, &lock.namespace);
    object_watch::read_leader(api, lock, RESOURCE, RBAC_HINT, describe).await
}

/// Watches the current leader of a Lease without campaigning: the channel holds `None` while
/// the Lease does not exist. The watch ends when every receiver is dropped.
pub fn watch_leader(client: Client, lock: LockRef) -> watch::Receiver<Option<LeaderInfo>> {
    let api: Api<Lease> = Api::namespaced(client, &lock.namespace);
    object_watch::watch_leader(api, lock, RESOURCE, RBAC_HINT, describe)
}

fn describe(lock: &LockRef, lease: &Lease) -> LeaderInfo {
    let record = LeaseRecord::from_lease(lease);
    let token = stored_fencing_token(lease, &record);
    leader_info(lock, &record, token)
}
