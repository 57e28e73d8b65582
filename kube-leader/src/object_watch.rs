//! Watching one named object: the state the election loops decide on.

use std::fmt::Debug;

use futures::{stream::BoxStream, StreamExt};
use kube::{
    runtime::{watcher, WatchStreamExt},
    Api, Resource,
};
use serde::de::DeserializeOwned;

use tokio::sync::watch;
use tracing::warn;

use crate::{
    api::{call, classify_watch, Failure, Op},
    error::{Error, Result},
    leadership::LeaderInfo,
    lock::LockRef,
};

/// Bound on a one-off read of the lock.
const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Longest watch call; kube-runtime's watcher requires less than the client's 295 s read timeout.
/// An idle watch therefore costs one request every 290 s (about 0.2 requests per minute).
const WATCH_TIMEOUT_SECS: u32 = 290;

/// A watch on a single object by name, with relist and backoff on errors (kube-runtime's
/// watcher), reduced to "the object as it is now, or absent".
pub(crate) struct ObjectWatch<K: 'static> {
    stream: BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>,
    current: Option<K>,
    init: Option<Option<K>>,
    synced: bool,
    op: OwnedOp,
}

/// A change of the watched object.
#[derive(Debug)]
pub(crate) struct Change<'a, K> {
    /// The object now (`None`: absent).
    pub(crate) object: Option<&'a K>,
    /// Whether this comes from a (re)list, not from a watch event.
    pub(crate) relisted: bool,
}

/// An [`Op`] with owned names, to build errors long after the watch started.
#[derive(Debug, Clone)]
struct OwnedOp {
    verb: &'static str,
    resource: &'static str,
    namespace: String,
    name: String,
    hint: &'static str,
}

impl OwnedOp {
    fn op(&self) -> Op<'_> {
        Op {
            verb: self.verb,
            resource: self.resource,
            namespace: &self.namespace,
            name: &self.name,
            hint: self.hint,
        }
    }
}

impl<K> Debug for ObjectWatch<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectWatch")
            .field("synced", &self.synced)
            .finish()
    }
}

// === impl ObjectWatch ===

impl<K> ObjectWatch<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// Starts watching `name` through `api`. `op` names the watch in permission errors.
    pub(crate) fn new(api: Api<K>, name: &str, op: Op<'_>) -> Self {
        let op = OwnedOp {
            verb: op.verb,
            resource: op.resource,
            namespace: op.namespace.to_string(),
            name: op.name.to_string(),
            hint: op.hint,
        };
        let config = watcher::Config::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(WATCH_TIMEOUT_SECS);
        let stream = watcher(api, config).default_backoff().boxed();
        Self {
            stream,
            current: None,
            init: None,
            synced: false,
            op,
        }
    }

    /// The object as last seen (`None`: absent, or not yet synced).
    pub(crate) fn current(&self) -> Option<&K> {
        self.current.as_ref()
    }

    /// Whether the initial list has completed at least once.
    pub(crate) fn is_synced(&self) -> bool {
        self.synced
    }

    /// Waits for the next change of the object (or the end of the initial list).
    ///
    /// An error means the watch failed; the next call retries it after kube-runtime's backoff.
    /// A permission error is [`Failure::Fatal`].
    ///
    /// # Cancellation safety
    /// Cancel-safe: no event is lost if the future is dropped.
    pub(crate) async fn changed(&mut self) -> Result<Option<&K>, Failure> {
        self.change().await.map(|c| c.object)
    }

    /// As [`changed`](Self::changed), and whether the state comes from a (re)list rather than
    /// from a watch event: an object absent on a relist was not seen going (a 410 or a broken
    /// watch hid how), unlike one whose deletion event arrived.
    ///
    /// # Cancellation safety
    /// Cancel-safe: no event is lost if the future is dropped.
    pub(crate) async fn change(&mut self) -> Result<Change<'_, K>, Failure> {
        loop {
            let Some(event) = self.stream.next().await else {
                // The watcher stream never ends; treat an end as a transient failure.
                return Err(Failure::Transient(kube::Error::Service(
                    "watch stream ended".into(),
                )));
            };
            match event.map_err(|e| classify_watch(self.op.op(), e))? {
                watcher::Event::Init => self.init = Some(None),
                watcher::Event::InitApply(k) => self.init = Some(Some(k)),
                watcher::Event::InitDone => {
                    self.current = self.init.take().flatten();
                    self.synced = true;
                    return Ok(Change {
                        object: self.current.as_ref(),
                        relisted: true,
                    });
                }
                watcher::Event::Apply(k) => {
                    self.current = Some(k);
                    return Ok(Change {
                        object: self.current.as_ref(),
                        relisted: false,
                    });
                }
                watcher::Event::Delete(_) => {
                    self.current = None;
                    return Ok(Change {
                        object: None,
                        relisted: false,
                    });
                }
            }
        }
    }
}

/// Reads the lock object once and describes its leader (`None`: no lock).
pub(crate) async fn read_leader<K>(
    api: Api<K>,
    lock: &LockRef,
    resource: &'static str,
    hint: &'static str,
    describe: fn(&LockRef, &K) -> LeaderInfo,
) -> Result<Option<LeaderInfo>>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let op = Op {
        verb: "get",
        resource,
        namespace: &lock.namespace,
        name: &lock.name,
        hint,
    };
    match call(op, READ_TIMEOUT, api.get_opt(&lock.name)).await {
        Ok(k) => Ok(k.map(|k| describe(lock, &k))),
        Err(Failure::NotFound | Failure::Conflict) => Ok(None),
        Err(Failure::Fatal(e)) => Err(e),
        Err(Failure::Transient(e)) => Err(Error::Api(Box::new(e))),
    }
}

/// Watches the lock object and publishes its leader: `None` while there is no lock; a new
/// value only when the description changes. The task ends when every receiver is dropped, or
/// (with a warning) when watching is forbidden.
pub(crate) fn watch_leader<K>(
    api: Api<K>,
    lock: LockRef,
    resource: &'static str,
    hint: &'static str,
    describe: fn(&LockRef, &K) -> LeaderInfo,
) -> watch::Receiver<Option<LeaderInfo>>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let op = Op {
            verb: "watch",
            resource,
            namespace: &lock.namespace,
            name: &lock.name,
            hint,
        };
        let mut w = ObjectWatch::new(api, &lock.name, op);
        loop {
            tokio::select! {
                () = tx.closed() => return,
                ev = w.changed() => match ev {
                    Ok(k) => {
                        let info = k.map(|k| describe(&lock, k));
                        tx.send_if_modified(|cur| if *cur == info { false } else { *cur = info; true });
                    }
                    Err(Failure::Fatal(e)) => {
                        warn!(error = %e, lock = %lock, "cannot watch the lock");
                        return;
                    }
                    Err(_) => {}
                }
            }
        }
    });
    rx
}
