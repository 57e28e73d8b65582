//! Watching one named object: the state the election loops decide on.

use std::fmt::Debug;

use futures::{stream::BoxStream, StreamExt};
use kube::{
    runtime::{watcher, WatchStreamExt},
    Api, Resource, ResourceExt,
};
use serde::de::DeserializeOwned;

use tokio::{sync::watch, time::Instant};
use tracing::{debug, warn};

use crate::{
    api::{call, classify_watch, Failure, Op},
    error::{Error, Result},
    leadership::LeaderInfo,
    lock::LockRef,
};

/// Bound on a one-off read of the lock, and on the read of a silent watch's object.
const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Longest watch call, as the API server counts it (`timeoutSeconds`): kube-runtime's default,
/// which its watcher also takes as the stream's idle timeout (plus 5 s). An idle watch
/// therefore costs one request every 290 s (about 0.2 requests per minute).
const WATCH_TIMEOUT_SECS: u32 = 290;

/// A watch that delivered nothing (no event, no error) for this long may be stalled: the
/// object is read once (one GET per silent period). A 1.20 API server sends nothing on an
/// idle watch, so silence alone cannot tell a stalled watch from an idle one; 90 s keeps an
/// idle watch at under one GET a minute while bounding a stalled one far below the 295 s of
/// kube-runtime's idle timeout.
const SILENCE: std::time::Duration = std::time::Duration::from_secs(90);

/// The watch stream kube-runtime's watcher gives.
type EventStream<K> = BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>;

/// A watch on a single object by name, with relist and backoff on errors (kube-runtime's
/// watcher), reduced to "the object as it is now, or absent". A watch silent for [`SILENCE`]
/// is checked with a GET; if the object changed meanwhile the watch is restarted.
pub(crate) struct ObjectWatch<K: 'static> {
    api: Api<K>,
    name: String,
    stream: EventStream<K>,
    current: Option<K>,
    init: Option<Option<K>>,
    synced: bool,
    op: OwnedOp,
    /// When the stream last delivered (or the object was last read).
    heard_at: Instant,
    /// Whether a silent watch is checked with a GET (off once a GET was refused).
    check_silence: bool,
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
        Self {
            stream: Self::watch(&api, name),
            api,
            name: name.to_string(),
            current: None,
            init: None,
            synced: false,
            op,
            heard_at: Instant::now(),
            check_silence: true,
        }
    }

    fn watch(api: &Api<K>, name: &str) -> EventStream<K> {
        let config = watcher::Config::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(WATCH_TIMEOUT_SECS);
        watcher(api.clone(), config).default_backoff().boxed()
    }

    /// The object as last seen (`None`: absent, or not yet synced).
    pub(crate) fn current(&self) -> Option<&K> {
        self.current.as_ref()
    }

    /// Whether the initial list has completed at least once.
    pub(crate) fn is_synced(&self) -> bool {
        self.synced
    }

    /// Waits for the next change of the object (or the end of the initial list, or a change
    /// that a read after [`SILENCE`] found).
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
    /// watch hid how), unlike one whose deletion event arrived. The object as read after a
    /// silence counts as a relist too.
    ///
    /// # Cancellation safety
    /// Cancel-safe: no event is lost if the future is dropped (a read of a silent watch's
    /// object cut short is made again after the next silent period).
    pub(crate) async fn change(&mut self) -> Result<Change<'_, K>, Failure> {
        loop {
            let silent_until = self.heard_at + SILENCE;
            let event = tokio::select! {
                biased;
                event = self.stream.next() => event,
                () = tokio::time::sleep_until(silent_until), if self.check_silence => {
                    if self.on_silence().await? {
                        return Ok(Change {
                            object: self.current.as_ref(),
                            relisted: true,
                        });
                    }
                    continue;
                }
            };
            self.heard_at = Instant::now();
            let Some(event) = event else {
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

    /// The watch was silent for [`SILENCE`]. Not yet synced: its list never came; it starts
    /// over (an error for the caller). Synced: the object is read; `true` if it differs from
    /// what the watch showed, which then starts over (it missed a change).
    async fn on_silence(&mut self) -> Result<bool, Failure> {
        self.heard_at = Instant::now();
        if !self.synced {
            self.restart();
            return Err(Failure::Transient(kube::Error::Service(
                format!(
                    "{} {} {}/{}: no answer within {SILENCE:?}; watching again",
                    self.op.verb, self.op.resource, self.op.namespace, self.op.name
                )
                .into(),
            )));
        }
        let get = Op {
            verb: "get",
            ..self.op.op()
        };
        let read = match call(get, READ_TIMEOUT, self.api.get_opt(&self.name)).await {
            Ok(k) => k,
            Err(Failure::NotFound) => None,
            Err(Failure::Fatal(e)) => {
                warn!(error = %e, "cannot read the watched object; a silent watch is not checked");
                self.check_silence = false;
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        let version = |k: Option<&K>| k.map(|k| k.resource_version());
        if version(read.as_ref()) == version(self.current.as_ref()) {
            return Ok(false);
        }
        debug!(object = %self.name, "a silent watch missed a change; watching again");
        self.current = read;
        self.restart();
        Ok(true)
    }

    /// Drops the watch stream and starts a new one (its list comes as a relist).
    fn restart(&mut self) {
        self.stream = Self::watch(&self.api, &self.name);
        self.init = None;
        self.heard_at = Instant::now();
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
