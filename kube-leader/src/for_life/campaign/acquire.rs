//! Taking the lock: creating it, or continuing with this Pod's own after a restart.

use std::time::SystemTime;

use k8s_openapi::{api::core::v1::ConfigMap, jiff::Timestamp};
use kube::api::PostParams;
use tokio::time::Instant;
use tracing::{debug, info};

use super::{Election, Won};
use crate::{
    api::{call, Failure},
    error::{Error, Result},
    for_life::{
        api::cm_op,
        fencing::fencing_token_of,
        heartbeat::adopt,
        holder::restart_token,
        record::{lock_config_map, set_heartbeat, LockRecord},
        steps,
    },
};

// === impl Election (taking the lock) ===

impl Election<'_> {
    /// Tries to create the lock. `None`: not (yet) the leader.
    pub(super) async fn create(&mut self) -> Result<Option<Won>> {
        let acquired_at = Timestamp::now();
        let mut cm = lock_config_map(&self.lock, &self.me, acquired_at);
        let liveness = self.config().heartbeat();
        if let Some(l) = liveness {
            set_heartbeat(&mut cm, Some(l.advertised));
        }
        let timeout = self.config().api_timeout;
        let params = PostParams::default();
        let sent = Instant::now();
        let created = call(
            cm_op(&self.lock, "create"),
            timeout,
            self.configmaps.create(&params, &cm),
        );
        let created = created.await;
        steps::write("create", (None, None), Some(&cm), sent, &created, steps::written);
        match created {
            Ok(created) => {
                let fencing_token = fencing_token_of(&created);
                Ok(Some(Won {
                    lock: created,
                    fencing_token,
                    acquired_at: acquired_at.into(),
                    restarted: false,
                    token_stored: false,
                    heartbeat_sent: liveness.map(|_| sent),
                }))
            }
            Err(Failure::Conflict) => {
                debug!("the lock exists already");
                self.arm_retry();
                Ok(None)
            }
            Err(Failure::NotFound) => Err(Error::Rejected {
                verb: "create".into(),
                resource: "configmaps".into(),
                namespace: self.lock.namespace.clone(),
                name: self.lock.name.clone(),
                message: format!("namespace {} not found", self.lock.namespace),
            }),
            Err(Failure::Transient(e)) => {
                debug!(error = %e, "creating the lock failed; retrying");
                self.arm_retry();
                Ok(None)
            }
            Err(Failure::Fatal(e)) => Err(e),
        }
    }

    /// The lock is this Pod's own: continue as leader (with the lock's current
    /// `resourceVersion` as the fencing token if it has none yet), once its liveness heartbeat
    /// says what this process does ([`adopt`]). `None`: that write failed; decide again.
    pub(super) async fn continue_as_leader(&mut self, lock: ConfigMap) -> Result<Option<Won>> {
        let record = LockRecord::from_config_map(&lock);
        let (fencing_token, token_stored) = restart_token(&record);
        let liveness = self.config().heartbeat();
        let timeout = self.config().api_timeout;
        let (lock, heartbeat_sent) = match adopt(&self.configmaps, &self.lock, lock, liveness, timeout).await
        {
            Ok(adopted) => adopted,
            Err(Failure::Fatal(e)) => return Err(e),
            Err(e) => {
                debug!(error = ?e, "writing the liveness heartbeat of this Pod's own lock failed; retrying");
                self.arm_retry();
                return Ok(None);
            }
        };
        info!(lock_uid = %record.uid,
            "found a lock held by this Pod (same UID), likely restarted; continuing as the leader");
        Ok(Some(Won {
            fencing_token,
            token_stored,
            acquired_at: record.acquired_at.unwrap_or_else(SystemTime::now),
            lock,
            restarted: true,
            heartbeat_sent: heartbeat_sent.filter(|_| liveness.is_some()),
        }))
    }
}
