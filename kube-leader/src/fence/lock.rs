//! The lock as a fence reads it: the fencing token every fenced write must at least carry,
//! whatever the strategy ([`read_lock`]).

use std::time::Duration;

use k8s_openapi::api::{coordination::v1::Lease, core::v1::ConfigMap};
use kube::{Api, Client};

use crate::{
    lock::{LockRef, FENCING_TOKEN_ANNOTATION, HOLDER_ANNOTATION},
    strategy::Strategy,
};

/// A lock as a fence reads it: the token every fenced write must at least carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockState {
    /// The lock exists.
    Held {
        /// The token every fenced write must at least carry.
        token: u64,
        /// Its holder, if any.
        holder: Option<String>,
        /// Whether `token` is the holder's own token (else it is the lock's `resourceVersion`:
        /// a Lease's new holder has not stored its token yet, or nobody holds it).
        exact: bool,
    },
    /// The lock does not exist: nobody leads.
    Missing,
}

/// The state of a Lease lock: the holder's token where the Lease's annotations name the holder
/// (kube-leader's holders store it with their first renewal), else its `resourceVersion`, which
/// is at least the token of whoever holds it now (the write that made it leader, or a later one)
/// and greater than any earlier holder's.
pub fn lease_state(lease: &Lease) -> Result<LockState, String> {
    let holder = lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .filter(|h| !h.is_empty());
    let annotations = lease.metadata.annotations.as_ref();
    let named = annotations.and_then(|a| a.get(HOLDER_ANNOTATION));
    if let (Some(h), Some(n)) = (&holder, named) {
        if h == n {
            if let Some(t) = annotations
                .and_then(|a| a.get(FENCING_TOKEN_ANNOTATION))
                .and_then(|t| t.trim().parse().ok())
            {
                return Ok(LockState::Held {
                    token: t,
                    holder,
                    exact: true,
                });
            }
        }
    }
    Ok(LockState::Held {
        token: resource_version(lease.metadata.resource_version.as_deref())?,
        holder,
        exact: false,
    })
}

/// The state of a leader-for-life lock: its token annotation, else (the leader crashed before
/// storing it) its `resourceVersion`, as the library reads it.
pub fn for_life_state(cm: &ConfigMap) -> Result<LockState, String> {
    let annotations = cm.metadata.annotations.as_ref();
    let holder = annotations.and_then(|a| a.get(HOLDER_ANNOTATION)).cloned();
    match annotations
        .and_then(|a| a.get(FENCING_TOKEN_ANNOTATION))
        .and_then(|t| t.trim().parse().ok())
    {
        Some(t) => Ok(LockState::Held {
            token: t,
            holder,
            exact: true,
        }),
        None => Ok(LockState::Held {
            token: resource_version(cm.metadata.resource_version.as_deref())?,
            holder,
            exact: false,
        }),
    }
}

fn resource_version(rv: Option<&str>) -> Result<u64, String> {
    let rv = rv.ok_or("the lock has no resourceVersion")?;
    rv.parse().map_err(|_| {
        format!("the lock's resourceVersion {rv:?} is not a number (not an etcd-backed API server?)")
    })
}

/// Why [`read_lock`] could not tell the lock's state.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockReadError {
    /// The reader may not `get` the lock: `resource` (plural) in the lock's namespace.
    #[error("missing permission get {resource}")]
    Forbidden {
        /// The lock's resource (`leases`, `configmaps`).
        resource: &'static str,
    },
    /// The lock was read but its token cannot be told (why).
    #[error("{0}")]
    Malformed(String),
    /// The API server's answer.
    #[error(transparent)]
    Api(kube::Error),
    /// No answer within this.
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}

/// Reads the lock `lock` of `strategy` with a GET (served from etcd, not from the API server's
/// watch cache) within `timeout`: its state and the `resourceVersion` read (empty when it does
/// not exist).
///
/// # Errors
/// [`LockReadError`].
pub async fn read_lock(
    client: &Client,
    strategy: Strategy,
    lock: &LockRef,
    timeout: Duration,
) -> Result<(LockState, String), LockReadError> {
    let version = |meta: &kube::api::ObjectMeta| meta.resource_version.clone().unwrap_or_default();
    let (resource, read) = match strategy {
        Strategy::Lease => {
            let api = Api::<Lease>::namespaced(client.clone(), &lock.namespace);
            let read = tokio::time::timeout(timeout, api.get_opt(&lock.name)).await;
            let state = |l: Lease| lease_state(&l).map(|s| (s, version(&l.metadata)));
            ("leases", read.map(|r| r.map(|l| l.map(state))))
        }
        Strategy::ForLife => {
            let api = Api::<ConfigMap>::namespaced(client.clone(), &lock.namespace);
            let read = tokio::time::timeout(timeout, api.get_opt(&lock.name)).await;
            let state = |c: ConfigMap| for_life_state(&c).map(|s| (s, version(&c.metadata)));
            ("configmaps", read.map(|r| r.map(|c| c.map(state))))
        }
    };
    match read {
        Ok(Ok(Some(state))) => state.map_err(LockReadError::Malformed),
        Ok(Ok(None)) => Ok((LockState::Missing, String::new())),
        Ok(Err(kube::Error::Api(s))) if s.code == 403 => Err(LockReadError::Forbidden { resource }),
        Ok(Err(e)) => Err(LockReadError::Api(e)),
        Err(_) => Err(LockReadError::TimedOut(timeout)),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{api::coordination::v1::LeaseSpec, apimachinery::pkg::apis::meta::v1::ObjectMeta};

    use super::*;

    fn lease(holder: Option<&str>, annotations: &[(&str, &str)], rv: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                resource_version: Some(rv.into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(Into::into),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn a_lease_tells_its_holders_token_or_its_resource_version() {
        let l = lease(
            Some("b"),
            &[(HOLDER_ANNOTATION, "b"), (FENCING_TOKEN_ANNOTATION, "40")],
            "55",
        );
        assert_eq!(
            lease_state(&l).unwrap(),
            LockState::Held {
                token: 40,
                holder: Some("b".into()),
                exact: true
            }
        );
        // A new holder that has not stored its token yet: the resourceVersion bounds it.
        let l = lease(
            Some("c"),
            &[(HOLDER_ANNOTATION, "b"), (FENCING_TOKEN_ANNOTATION, "40")],
            "60",
        );
        assert_eq!(
            lease_state(&l).unwrap(),
            LockState::Held {
                token: 60,
                holder: Some("c".into()),
                exact: false
            }
        );
        let l = lease(Some(""), &[], "61");
        assert_eq!(
            lease_state(&l).unwrap(),
            LockState::Held {
                token: 61,
                holder: None,
                exact: false
            }
        );
    }
}
