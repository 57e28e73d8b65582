//! What the harness itself sees of the locks, through watches of its own (as `admin`, whose
//! requests are not audited, so they never count as candidates' requests).

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::{coordination::v1::Lease, core::v1::ConfigMap};
use kube::{
    runtime::{watcher, WatchStreamExt},
    Api, Client, ResourceExt,
};
use tokio::{sync::watch, task::JoinHandle};

use crate::clock::mono_ns;

/// One observation: when, which object, and what it showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seen {
    pub(crate) mono_ns: u64,
    pub(crate) name: String,
    /// `None`: the object was deleted. For a Lease, `Some(holder)` with `""` when released.
    pub(crate) holder: Option<String>,
}

/// A watch of the Leases or ConfigMaps of one namespace, recording every change it sees.
#[derive(Debug)]
pub(crate) struct Observer {
    seen: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
}

// === impl Observer ===

impl Observer {
    /// Watches the Leases in `namespace`; returns once the watch is running.
    pub(crate) async fn leases(admin: Client, namespace: &str) -> anyhow::Result<Self> {
        let api = Api::<Lease>::namespaced(admin, namespace);
        Self::start(api, |l: &Lease| {
            l.spec
                .as_ref()
                .and_then(|s| s.holder_identity.clone())
                .unwrap_or_default()
        })
        .await
    }

    /// Watches the ConfigMaps in `namespace` (holder: the owner Pod's name, or `""`).
    pub(crate) async fn config_maps(admin: Client, namespace: &str) -> anyhow::Result<Self> {
        let api = Api::<ConfigMap>::namespaced(admin, namespace);
        Self::start(api, |c: &ConfigMap| {
            c.owner_references()
                .first()
                .map(|o| o.name.clone())
                .unwrap_or_default()
        })
        .await
    }

    async fn start<K>(api: Api<K>, holder: fn(&K) -> String) -> anyhow::Result<Self>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, mut ready) = watch::channel(false);
        let record = seen.clone();
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, watcher::Config::default()).default_backoff().boxed();
            while let Some(event) = stream.next().await {
                let now = mono_ns();
                let entry = match event {
                    Ok(watcher::Event::Apply(o)) | Ok(watcher::Event::InitApply(o)) => Seen {
                        mono_ns: now,
                        name: o.name_any(),
                        holder: Some(holder(&o)),
                    },
                    Ok(watcher::Event::Delete(o)) => Seen {
                        mono_ns: now,
                        name: o.name_any(),
                        holder: None,
                    },
                    Ok(watcher::Event::InitDone) => {
                        let _ = ready_tx.send(true);
                        continue;
                    }
                    Ok(watcher::Event::Init) | Err(_) => continue,
                };
                record.lock().unwrap_or_else(|p| p.into_inner()).push(entry);
            }
        });
        tokio::time::timeout(Duration::from_secs(30), ready.wait_for(|r| *r))
            .await
            .map_err(|_| anyhow::anyhow!("the harness's watch did not start within 30 s"))??;
        Ok(Self { seen, task })
    }

    /// Everything seen so far.
    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The first observation of `name` at or after `after_ns` that matches `want`, waiting up
    /// to `timeout` for it.
    pub(crate) async fn wait_for(
        &self,
        name: &str,
        after_ns: u64,
        timeout: Duration,
        want: impl Fn(&Seen) -> bool,
    ) -> Option<Seen> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(s) = self
                .seen()
                .into_iter()
                .find(|s| s.name == name && s.mono_ns >= after_ns && want(s))
            {
                return Some(s);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The last observation of `name` before `before_ns` that matches `want`.
    pub(crate) fn last_before(
        &self,
        name: &str,
        before_ns: u64,
        want: impl Fn(&Seen) -> bool,
    ) -> Option<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.name == name && s.mono_ns < before_ns && want(s))
            .last()
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
