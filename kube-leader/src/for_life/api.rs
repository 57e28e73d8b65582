//! Leader for life's basement: how its calls on the lock ConfigMap and on Pods are named in
//! errors, and the preconditions of its deletes. The elector, campaign, keeper, heartbeat and
//! fencing import it; it imports none of them.

use kube::api::{DeleteParams, Preconditions};

use crate::{api::Op, lock::LockRef};

/// Where to find a Role that grants what leader for life needs.
pub(crate) const RBAC_HINT: &str =
    "the one `kube-leader rbac --strategy for-life --lock LOCK --namespace NS` prints \
     (https://github.com/kube-leader/kube-leader/blob/main/deploy/for-life/rbac-for-life.yaml)";
/// Names a call on the lock ConfigMap in errors.
pub(super) fn cm_op<'a>(lock: &'a LockRef, verb: &'static str) -> Op<'a> {
    Op {
        verb,
        resource: "configmaps",
        namespace: &lock.namespace,
        name: &lock.name,
        hint: RBAC_HINT,
    }
}

pub(super) fn pod_op<'a>(namespace: &'a str, name: &'a str, verb: &'static str) -> Op<'a> {
    Op {
        verb,
        resource: "pods",
        namespace,
        name,
        hint: RBAC_HINT,
    }
}

pub(super) fn uid_precondition(uid: &str) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    }
}
