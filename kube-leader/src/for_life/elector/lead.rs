//! Leading: the handle of a term won and the keeper that keeps it (its fencing token stored,
//! its liveness heartbeat, the registrations watched for the successor of its release).

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use tokio_util::sync::CancellationToken;
use tracing::{info, info_span, Instrument};

use super::{
    super::{
        campaign::Won,
        fencing::store_fencing_token,
        heartbeat::Beat,
        holder::Beats,
        keeper::{Keeper, OwnPodWatch},
        record::PodRef,
    },
    ForLife,
};
use crate::{
    leadership::{Leadership, Strategy, Term},
    lock::LockRef,
    successor::{Hold, Registry},
};

// === impl ForLife ===

impl ForLife {
    /// Builds the handle and starts the keeper, which keeps watching the lock.
    pub(super) fn lead(
        &self,
        lock: LockRef,
        me: PodRef,
        won: Won,
        own_pod: OwnPodWatch,
        registry: Option<(Registry, Option<Hold>)>,
        shutdown: CancellationToken,
    ) -> Leadership {
        let (registry, hold) = registry.unzip();
        let lock_uid = won.lock.metadata.uid.clone().unwrap_or_default();
        info!(fencing_token = won.fencing_token, restarted = won.restarted, lock_uid = %lock_uid, "became the leader");
        let term = Term {
            identity: me.name.clone(),
            lock: lock.clone(),
            strategy: Strategy::ForLife,
            fencing_token: won.fencing_token,
            acquired_at: won.acquired_at,
        };
        let configmaps: Api<ConfigMap> = Api::namespaced(self.client.clone(), &lock.namespace);
        let store = (!won.token_stored).then(|| {
            let (cm, lock, me) = (configmaps.clone(), lock.clone(), me.clone());
            let (token, timeout, cap) = (
                won.fencing_token,
                self.config.api_timeout,
                self.config.backoff_cap,
            );
            store_fencing_token(cm, lock, me, won.lock.clone(), token, timeout, cap)
        });
        let span = info_span!("leader_for_life_keeper", lock = %lock, pod = %me.name);
        let beat = self.beat(&configmaps, &lock, &lock_uid, &me, &won);
        let keeper = Keeper {
            configmaps,
            pods: Api::namespaced(self.client.clone(), &lock.namespace),
            lock,
            lock_uid,
            me,
            api_timeout: self.config.api_timeout,
            backoff_cap: self.config.backoff_cap,
            beat,
            own_pod: std::sync::Mutex::new(Some(own_pod)),
            // Watched for the term: the release takes its successor from the watch.
            registry: registry.map(Registry::following),
            successor: std::sync::Mutex::new(None),
            registration: hold.flatten(),
        };
        let leadership = Leadership::spawn(term, span, move |handle, done| {
            if let Some(b) = &keeper.beat {
                // The write that made the term carried the heartbeat: confirmed from its send,
                // before the handle is returned.
                handle.confirm_until(b.beats.confirmed_until());
            }
            if let Some(store) = store {
                // Beside the keeper, so that taking over costs one write; ends with the term.
                let done = done.clone();
                let stored = async move {
                    tokio::select! {
                        () = done.cancelled() => {}
                        () = store => {}
                    }
                };
                tokio::spawn(stored.instrument(tracing::Span::current()));
            }
            keeper.keep(handle, done, shutdown)
        });
        self.hooks
            .follow(&leadership, won.lock.metadata.uid.clone(), won.restarted, None);
        leadership
    }

    /// The liveness heartbeat of a term won with one (the write that made the term carried
    /// the first beat).
    fn beat(
        &self,
        configmaps: &Api<ConfigMap>,
        lock: &LockRef,
        lock_uid: &str,
        me: &PodRef,
        won: &Won,
    ) -> Option<Beat> {
        let (liveness, sent) = self.config.heartbeat().zip(won.heartbeat_sent)?;
        Some(Beat {
            configmaps: configmaps.clone(),
            lock: lock.clone(),
            lock_uid: lock_uid.to_owned(),
            me: me.clone(),
            fencing_token: won.fencing_token,
            api_timeout: self.config.api_timeout,
            current: won.lock.clone(),
            beats: Beats::new(liveness, sent),
        })
    }
}
