//! Every version of the lock and of the fenced objects, as the API server committed them, read
//! from two watches that start before the first write and resume from the last version seen.
//!
//! A watch resumed from a `resourceVersion` delivers every later version in commit order, so
//! the histories are complete unless the API server answers 410 Gone (the version fell out of
//! its window): such a gap is counted, the watch lists again, and the figures say so.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::{coordination::v1::Lease, core::v1::ConfigMap};
use kube::{
    api::{ListParams, WatchEvent, WatchParams},
    Api, Client, Resource, ResourceExt as _,
};
use kube_leader::{
    internal::fence::FENCED_TOKEN_ANNOTATION,
    internal::labels::{FENCING_TOKEN_ANNOTATION, HOLDER_ANNOTATION},
};
use tokio::task::JoinHandle;

/// The holder an administrator writes into the Lease to take it from a leader that still
/// writes (the `steal` fault): not a candidate, so the lock passing to it or from it is no
/// leadership transition.
pub const THIEF: &str = "lock-thief";

/// One version of the lock (a Lease).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockVersion {
    /// Its `resourceVersion`: the etcd revision of the write.
    pub rv: u64,
    /// `spec.holderIdentity`, if not empty.
    pub holder: Option<String>,
    /// The token the fence requires of a write while this version is current, as the webhook
    /// computes it: the holder's stored token when the annotations name the holder, else `rv`.
    pub token: u64,
    /// The lock was deleted (this is its last version).
    pub deleted: bool,
}

/// One version of an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectVersion {
    /// The object's name.
    pub name: String,
    /// Its incarnation.
    pub uid: String,
    /// Its `resourceVersion`: the write's commit.
    pub rv: u64,
    /// The fencing token stamped on it (`kube-leader.io/fenced-token`).
    pub stamp: Option<u64>,
    /// The object was deleted.
    pub deleted: bool,
    /// When the watch delivered it (µs since the epoch): an upper bound of its commit.
    pub seen_unix_us: u64,
}

/// The token the fence requires while `lease` is current (`kube-leader fence`'s rule).
pub fn lock_token(lease: &Lease) -> Option<u64> {
    let rv: u64 = lease.metadata.resource_version.as_deref()?.parse().ok()?;
    let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref());
    let annotations = lease.annotations();
    let stored = annotations
        .get(FENCING_TOKEN_ANNOTATION)
        .and_then(|t| t.trim().parse().ok());
    match (
        holder.filter(|h| !h.is_empty()),
        annotations.get(HOLDER_ANNOTATION),
        stored,
    ) {
        (Some(h), Some(named), Some(t)) if h == named => Some(t),
        _ => Some(rv),
    }
}

/// What the watches recorded so far.
#[derive(Debug, Default, Clone)]
pub struct Recorded {
    /// The lock's versions, in commit order.
    pub lock: Vec<LockVersion>,
    /// Every object's versions, in commit order.
    pub objects: Vec<ObjectVersion>,
    /// Watches that had to list again (versions possibly missed).
    pub gaps: usize,
    /// Leadership transitions: the lock passing to a candidate other than the last one
    /// ([`THIEF`] is none).
    pub transitions: usize,
    last_holder: Option<String>,
    /// The highest stamp on each object.
    pub max_stamp: BTreeMap<String, u64>,
}

impl Recorded {
    fn lock_version(&mut self, lease: &Lease, deleted: bool) {
        let (Some(rv), Some(token)) = (version(lease), lock_token(lease)) else {
            return;
        };
        if self.lock.last().is_some_and(|l| l.rv >= rv) {
            return;
        }
        let holder = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .filter(|h| !h.is_empty() && !deleted);
        if let Some(h) = holder.as_ref().filter(|h| *h != THIEF) {
            if self.last_holder.as_ref().is_some_and(|l| l != h) {
                self.transitions += 1;
            }
            self.last_holder = Some(h.clone());
        }
        self.lock.push(LockVersion {
            rv,
            holder,
            token,
            deleted,
        });
    }

    fn object_version(&mut self, cm: &ConfigMap, deleted: bool) {
        let Some(rv) = version(cm) else { return };
        let stamp = cm
            .annotations()
            .get(FENCED_TOKEN_ANNOTATION)
            .and_then(|t| t.parse().ok());
        let name = cm.name_any();
        if let Some(s) = stamp {
            let max = self.max_stamp.entry(name.clone()).or_default();
            *max = (*max).max(s);
        }
        self.objects.push(ObjectVersion {
            name,
            uid: cm.uid().unwrap_or_default(),
            rv,
            stamp,
            deleted,
            seen_unix_us: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64),
        });
    }

    /// The lock's latest version.
    pub fn current(&self) -> Option<&LockVersion> {
        self.lock.last()
    }
}

fn version<K: Resource>(k: &K) -> Option<u64> {
    k.meta().resource_version.as_deref()?.parse().ok()
}

/// The two watches; stopped when dropped.
#[derive(Debug)]
pub struct Recorder {
    state: Arc<Mutex<Recorded>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Recorder {
    /// Watches the Lease `lock` and every ConfigMap of `namespace`, as `client` (an
    /// administrator's, not faulted).
    pub async fn start(client: &Client, namespace: &str, lock: &str) -> Self {
        let state = Arc::new(Mutex::new(Recorded::default()));
        let leases = Api::<Lease>::namespaced(client.clone(), namespace);
        let cms = Api::<ConfigMap>::namespaced(client.clone(), namespace);
        let field = format!("metadata.name={lock}");
        let s = state.clone();
        let lease_task = tokio::spawn(watch(leases, Some(field), s, Recorded::lock_version));
        let s = state.clone();
        let cm_task = tokio::spawn(watch(cms, None, s, Recorded::object_version));
        Self {
            state,
            tasks: vec![lease_task, cm_task],
        }
    }

    /// What was recorded so far.
    pub fn snapshot(&self) -> Recorded {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Reads the recorded state with `f`.
    pub fn with<T>(&self, f: impl FnOnce(&Recorded) -> T) -> T {
        f(&self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

type Record<K> = fn(&mut Recorded, &K, bool);

/// Lists, then watches from the list's version, forever; every object seen goes to `record`.
async fn watch<K>(api: Api<K>, field: Option<String>, state: Arc<Mutex<Recorded>>, record: Record<K>)
where
    K: Resource + Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let apply =
        |k: &K, deleted: bool| record(&mut state.lock().unwrap_or_else(|e| e.into_inner()), k, deleted);
    let mut from: Option<String> = None;
    loop {
        let Some(version) = from.clone() else {
            let mut lp = ListParams::default();
            if let Some(f) = &field {
                lp = lp.fields(f);
            }
            match api.list(&lp).await {
                Ok(list) => {
                    for k in &list.items {
                        apply(k, false);
                    }
                    from = list.metadata.resource_version;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
            continue;
        };
        let mut wp = WatchParams::default().timeout(60);
        if let Some(f) = &field {
            wp = wp.fields(f);
        }
        let Ok(stream) = api.watch(&wp, &version).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut stream = stream.boxed();
        while let Ok(Some(event)) = stream.try_next().await {
            match event {
                WatchEvent::Added(k) | WatchEvent::Modified(k) => {
                    apply(&k, false);
                    from = k.meta().resource_version.clone();
                }
                WatchEvent::Deleted(k) => {
                    apply(&k, true);
                    from = k.meta().resource_version.clone();
                }
                WatchEvent::Bookmark(b) => from = Some(b.metadata.resource_version),
                WatchEvent::Error(_) => {
                    state.lock().unwrap_or_else(|e| e.into_inner()).gaps += 1;
                    from = None;
                    break;
                }
            }
        }
    }
}
