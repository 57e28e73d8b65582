//! The leader-for-life campaign and keeper against an in-process API server on tokio's paused
//! clock: a small object store with resourceVersions, UID preconditions and watches, so that
//! "woken by the watch, not by a timer" is exact.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http::{Method, Response};
use kube_leader::internal::ForLifeExt as _;
use kube_leader::{internal::Environment, ForLife, LossReason};
use serde_json::{json, Value};
use tokio::{sync::mpsc, time::Instant};
use tokio_util::sync::CancellationToken;

mod support;

use support::{respond, status, Body};

const PODS: &str = "/api/v1/namespaces/ns/pods";
const CONFIGMAPS: &str = "/api/v1/namespaces/ns/configmaps";

/// The objects, by collection path and name, and the open watches.
#[derive(Default)]
struct Store {
    objects: BTreeMap<(String, String), Value>,
    revision: u64,
    /// Open watches: collection, the name they select, where to send event lines.
    watchers: Vec<(String, String, mpsc::UnboundedSender<Bytes>)>,
    /// Every request but watches and Events: when, method and path.
    requests: Vec<(Instant, String)>,
}

#[derive(Clone, Default)]
struct Mock(Arc<Mutex<Store>>);

/// The name a list or watch selects (`fieldSelector=metadata.name=NAME`).
fn selected_name(query: &str) -> String {
    let query = query.replace("%3D", "=");
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("fieldSelector=metadata.name="))
        .unwrap_or_default()
        .to_string()
}

impl Store {
    /// Stores `obj` (or deletes it) as a new revision and tells the watches.
    fn commit(&mut self, collection: &str, name: &str, obj: Option<Value>) -> Value {
        self.revision += 1;
        let key = (collection.to_string(), name.to_string());
        let (kind, obj) = match obj {
            Some(mut o) => {
                o["metadata"]["resourceVersion"] = json!(self.revision.to_string());
                let kind = if self.objects.contains_key(&key) {
                    "MODIFIED"
                } else {
                    "ADDED"
                };
                self.objects.insert(key, o.clone());
                (kind, o)
            }
            None => {
                let mut o = self.objects.remove(&key).expect("an object to delete");
                o["metadata"]["resourceVersion"] = json!(self.revision.to_string());
                ("DELETED", o)
            }
        };
        let line = Bytes::from(format!("{}\n", json!({"type": kind, "object": obj})));
        self.watchers
            .retain(|(c, n, tx)| c != collection || n != name || tx.send(line.clone()).is_ok());
        obj
    }

    fn handle(&mut self, method: &Method, path: &str, query: &str, body: &[u8]) -> Response<Body> {
        let (collection, name) = match path.rsplit_once('/') {
            Some((c, n)) if c == PODS || c == CONFIGMAPS => (c.to_string(), n.to_string()),
            _ => (path.to_string(), String::new()),
        };
        let key = (collection.clone(), name.clone());
        let watch = query.contains("watch=true");
        if !watch && !path.ends_with("/events") {
            self.requests.push((Instant::now(), format!("{method} {path}")));
        }
        match (method, name.is_empty()) {
            (&Method::GET, true) if watch => {
                let (tx, response) = support::watch();
                self.watchers.push((collection, selected_name(query), tx));
                response
            }
            (&Method::GET, true) => {
                let wanted = selected_name(query);
                let items: Vec<Value> = self
                    .objects
                    .iter()
                    .filter(|((c, n), _)| *c == collection && (wanted.is_empty() || *n == wanted))
                    .map(|(_, o)| o.clone())
                    .collect();
                respond(
                    200,
                    &json!({"apiVersion": "v1", "kind": "List",
                    "metadata": {"resourceVersion": self.revision.to_string()}, "items": items}),
                )
            }
            (&Method::GET, false) => match self.objects.get(&key) {
                Some(o) => respond(200, o),
                None => status(404, "NotFound"),
            },
            (&Method::POST, true) => {
                let mut obj: Value = serde_json::from_slice(body).unwrap();
                if path.ends_with("/events") {
                    return respond(201, &obj);
                }
                let name = obj["metadata"]["name"].as_str().unwrap().to_string();
                if self.objects.contains_key(&(collection.clone(), name.clone())) {
                    return status(409, "AlreadyExists");
                }
                obj["metadata"]["uid"] = json!(format!("uid-{name}-{}", self.revision + 1));
                respond(201, &self.commit(&collection, &name, Some(obj)))
            }
            (&Method::PUT, false) => {
                let obj: Value = serde_json::from_slice(body).unwrap();
                match self.objects.get(&key) {
                    None => status(404, "NotFound"),
                    Some(cur) if cur["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"] => {
                        status(409, "Conflict")
                    }
                    Some(_) => respond(200, &self.commit(&collection, &name, Some(obj))),
                }
            }
            (&Method::DELETE, false) => {
                let opts: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
                let uid = opts["preconditions"]["uid"].as_str().map(str::to_string);
                match self.objects.get(&key) {
                    None => status(404, "NotFound"),
                    Some(cur) if uid.is_some_and(|u| cur["metadata"]["uid"] != json!(u)) => {
                        status(409, "Conflict")
                    }
                    Some(_) => respond(200, &self.commit(&collection, &name, None)),
                }
            }
            (m, _) => panic!("unexpected request {m} {path}?{query}"),
        }
    }
}

impl Mock {
    fn client(&self) -> kube::Client {
        let mock = self.clone();
        support::client(move |method, path, query, body| {
            let r = mock.0.lock().unwrap().handle(&method, &path, &query, &body);
            async move { r }
        })
    }

    fn pod(&self, name: &str) {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
            "status": {"phase": "Running"}});
        self.0.lock().unwrap().commit(PODS, name, Some(pod));
    }

    fn delete_lock(&self) {
        self.0.lock().unwrap().commit(CONFIGMAPS, "lock", None);
    }

    fn lock_owner(&self) -> Option<String> {
        let s = self.0.lock().unwrap();
        let cm = s.objects.get(&(CONFIGMAPS.to_string(), "lock".to_string()))?;
        cm["metadata"]["ownerReferences"][0]["name"]
            .as_str()
            .map(str::to_string)
    }
}

/// The tests of this file run one at a time. The trace test listens with a thread-local
/// subscriber, and `tracing` caches each callsite's interest when the callsite is first hit:
/// while that subscriber is the only registered one, a step callsite first hit on another
/// test's thread (no subscriber there) is cached as "never" (tokio-rs/tracing#3611), and its
/// events are lost (the replay found no term, in one test-command run).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn candidate(mock: &Mock, pod: &str) -> ForLife {
    ForLife::new(mock.client(), "lock")
        .environment(Environment {
            pod_namespace: Some("ns".into()),
            pod_name: Some(pod.into()),
            service_account_namespace_file: None,
        })
        .events(false)
        // The lock's and the Pods' requests only (the registrations are tested in
        // mock_apiserver.rs and e2e/tests/successor.rs).
        .config(kube_leader::ForLifeConfig::default().successor(kube_leader::Successor::Any))
}

/// A waiting candidate sends nothing while the lock is held. The lock deleted under its live
/// leader (an admin): the leader learns of it from its watch, and the waiting candidate waits for
/// its word that its work stopped (Safety IV), however long; once the leader has released, the
/// candidate takes over at once (it deletes the leader's released lock and creates its own).
#[tokio::test(start_paused = true)]
async fn a_lock_deleted_under_its_leader_is_taken_once_the_leader_says_it_stopped() {
    let _serial = SERIAL.lock().await;
    let mock = Mock::default();
    mock.pod("a");
    mock.pod("b");
    let shutdown = CancellationToken::new();
    let a = candidate(&mock, "a").become_leader(&shutdown).await.unwrap();
    assert_eq!(mock.lock_owner().as_deref(), Some("a"));
    let b = candidate(&mock, "b");
    let s = shutdown.clone();
    let waiting = tokio::spawn(async move { b.become_leader(&s).await });
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!waiting.is_finished(), "a leads for life");
    let quiet_from = Instant::now() - Duration::from_secs(50);
    let requests_while_waiting = {
        let s = mock.0.lock().unwrap();
        s.requests.iter().filter(|(t, _)| *t > quiet_from).count()
    };
    assert_eq!(requests_while_waiting, 0, "a waiting candidate only watches");

    mock.delete_lock();
    assert_eq!(a.lost().await, LossReason::LockDeleted);
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(
        !waiting.is_finished(),
        "b waits for a's word while a's work may run"
    );
    assert_eq!(mock.lock_owner(), None);

    let a_token = a.fencing_token();
    let released_at = Instant::now();
    a.release().await.unwrap();
    let b = waiting.await.unwrap().unwrap();
    assert!(
        released_at.elapsed() < Duration::from_millis(50),
        "{:?}",
        released_at.elapsed()
    );
    assert_eq!(mock.lock_owner().as_deref(), Some("b"));
    assert!(b.is_leader());
    assert!(b.fencing_token() > a_token);
}

/// A restarted leader (the same Pod, by UID) continues on its own lock, the same term: it
/// writes the lock once, with its resourceVersion as precondition, so that a request of the
/// former process still in flight (its release's mark) fails rather than marking the restarted
/// term released (found by the for-life model; docs/safety.md).
#[tokio::test(start_paused = true)]
async fn a_restarted_leader_continues_on_its_own_lock() {
    let _serial = SERIAL.lock().await;
    let mock = Mock::default();
    mock.pod("a");
    let shutdown = CancellationToken::new();
    let first = candidate(&mock, "a").become_leader(&shutdown).await.unwrap();
    let token = first.fencing_token();
    drop(first);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let writes_before = mock.0.lock().unwrap().revision;
    let again = candidate(&mock, "a").become_leader(&shutdown).await.unwrap();
    assert_eq!(again.fencing_token(), token, "the same term goes on");
    assert_eq!(
        mock.0.lock().unwrap().revision,
        writes_before + 1,
        "one write: the lock adopted with its resourceVersion as precondition"
    );
    assert_eq!(mock.lock_owner().as_deref(), Some("a"));
}

/// With the hidden feature `trace-check` (issue 43's trace checking): a leader with a liveness
/// heartbeat, restarted in its Pod (it adopts its own lock) and then released, records decision
/// steps that the leader-for-life model explains: the paths the chaos run's library candidates
/// do not take (the adopt, the heartbeat and its confirmations).
#[cfg(feature = "trace-check")]
#[tokio::test(start_paused = true)]
async fn a_heartbeating_leader_restarted_and_released_records_steps_the_model_explains() {
    let _serial = SERIAL.lock().await;
    use kube_leader::internal::trace::{for_life, Trace};
    use tracing_subscriber::layer::SubscriberExt as _;

    let steps = Arc::new(Mutex::new(Vec::new()));
    let subscriber = tracing_subscriber::registry().with(steps::Layer(steps.clone()));
    let _default = tracing::subscriber::set_default(subscriber);
    let mock = Mock::default();
    mock.pod("a");
    let shutdown = CancellationToken::new();
    let live = || {
        let config = kube_leader::ForLifeConfig::default()
            .successor(kube_leader::Successor::Any)
            .liveness(Duration::from_secs(3));
        candidate(&mock, "a").config(config)
    };
    let first = live().become_leader(&shutdown).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    drop(first);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let again = live().become_leader(&shutdown).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    again.release().await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;

    let steps = steps.lock().unwrap().clone();
    let seen = |kind: &str, op: Option<&str>| {
        steps
            .iter()
            .filter(|s| s["kind"] == kind && op.is_none_or(|op| s["step"]["op"] == op))
            .count()
    };
    let trace = Trace {
        candidate: "a".into(),
        steps: steps.clone(),
    };
    let report = for_life::replay(&[trace]);
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!((report.candidates, report.terms), (1, 2));
    for (kind, op) in [
        ("write", Some("create")),
        ("write", Some("adopt")),
        ("write", Some("beat")),
        ("confirmed", None),
        ("release_mark", None),
        ("write", Some("mark")),
        ("write", Some("release_delete")),
    ] {
        assert!(seen(kind, op) > 0, "no {kind} {op:?} step in {steps:#?}");
    }
    assert!(seen("confirmed", None) >= 4, "a heartbeat a second");
}

/// A `tracing` layer that keeps the library's decision steps (`kube_leader::step` events).
#[cfg(feature = "trace-check")]
mod steps {
    use std::sync::{Arc, Mutex};

    use kube_leader::internal::trace::step_of;
    use serde_json::Value;

    pub(super) struct Layer(pub(super) Arc<Mutex<Vec<Value>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Layer {
        fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            if let Some(step) = step_of(event) {
                self.0.lock().unwrap().push(step);
            }
        }
    }
}
