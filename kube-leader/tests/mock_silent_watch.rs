//! Watches that go silent: an in-process API server on tokio's paused clock whose watches
//! answer with headers and then never send an event (a stalled stream behind a connection
//! that still looks alive). The leader-for-life follower must not wait on them forever.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http::{Method, Response};
use kube_leader::internal::ForLifeExt as _;
use kube_leader::{internal::Environment, ForLife};
use serde_json::{json, Value};
use tokio::{sync::mpsc, time::Instant};
use tokio_util::sync::CancellationToken;

mod support;

use support::{respond, status, Body};

/// The objects by path (`/api/v1/namespaces/ns/<resource>/<name>`), and the silent watches
/// (kept open: their senders live here and are never used).
#[derive(Default)]
struct Store {
    objects: BTreeMap<String, Value>,
    revision: u64,
    watches: Vec<mpsc::UnboundedSender<Bytes>>,
    /// The GETs of single objects, by path.
    gets: Vec<String>,
}

#[derive(Clone, Default)]
struct Mock(Arc<Mutex<Store>>);

fn selected_name(query: &str) -> String {
    let query = query.replace("%3D", "=");
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("fieldSelector=metadata.name="))
        .unwrap_or_default()
        .to_string()
}

impl Store {
    fn put(&mut self, path: &str, mut obj: Value) -> Value {
        self.revision += 1;
        obj["metadata"]["resourceVersion"] = json!(self.revision.to_string());
        self.objects.insert(path.to_string(), obj.clone());
        obj
    }

    fn handle(&mut self, method: &Method, path: &str, query: &str, body: &[u8]) -> Response<Body> {
        let collection = ["/pods", "/configmaps", "/events"]
            .iter()
            .any(|c| path.ends_with(c));
        match (method, collection) {
            (&Method::GET, true) if query.contains("watch=true") => {
                let (tx, response) = support::watch();
                self.watches.push(tx);
                response
            }
            (&Method::GET, true) => {
                let wanted = format!("{path}/{}", selected_name(query));
                let items: Vec<Value> = self.objects.get(&wanted).cloned().into_iter().collect();
                respond(
                    200,
                    &json!({"apiVersion": "v1", "kind": "List",
                        "metadata": {"resourceVersion": self.revision.to_string()}, "items": items}),
                )
            }
            (&Method::GET, false) => {
                self.gets.push(path.to_string());
                match self.objects.get(path) {
                    Some(o) => respond(200, o),
                    None => status(404, "NotFound"),
                }
            }
            (&Method::POST, true) => {
                let mut obj: Value = serde_json::from_slice(body).unwrap();
                if path.ends_with("/events") {
                    return respond(201, &obj);
                }
                let name = obj["metadata"]["name"].as_str().unwrap().to_string();
                let key = format!("{path}/{name}");
                if self.objects.contains_key(&key) {
                    return status(409, "AlreadyExists");
                }
                obj["metadata"]["uid"] = json!(format!("uid-{name}-{}", self.revision + 1));
                respond(201, &self.put(&key, obj))
            }
            (&Method::PUT, false) => {
                let obj: Value = serde_json::from_slice(body).unwrap();
                match self.objects.get(path) {
                    None => status(404, "NotFound"),
                    Some(cur) if cur["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"] => {
                        status(409, "Conflict")
                    }
                    Some(_) => respond(200, &self.put(path, obj)),
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
        self.0
            .lock()
            .unwrap()
            .put(&format!("/api/v1/namespaces/ns/pods/{name}"), pod);
    }

    /// Sets the Pod's phase to `Succeeded` without telling any watch (they are silent).
    fn end_pod_silently(&self, name: &str) {
        let mut s = self.0.lock().unwrap();
        let path = format!("/api/v1/namespaces/ns/pods/{name}");
        let mut pod = s.objects[&path].clone();
        pod["status"]["phase"] = json!("Succeeded");
        s.put(&path, pod);
    }

    /// Deletes the lock without telling any watch (they are silent).
    fn delete_lock_silently(&self) {
        let mut s = self.0.lock().unwrap();
        s.revision += 1;
        s.objects.remove("/api/v1/namespaces/ns/configmaps/lock").unwrap();
    }
}

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

/// A follower whose watches went silent reads the lock and the leader's Pod when they stay
/// silent too long (90 s), finds the lock gone and the Pod ended, and takes over once the Pod's
/// grace has passed (the proof that its work stopped: a lock deleted under a live leader is
/// never taken, Safety IV); without the reads it waits until kube-runtime's idle timeout (the
/// 290 s watch timeout + 5 s) ends the streams and a relist shows them (hence the bound, 280 s).
#[tokio::test(start_paused = true)]
async fn a_follower_whose_watches_went_silent_reads_the_lock() {
    let mock = Mock::default();
    mock.pod("a");
    mock.pod("b");
    let shutdown = CancellationToken::new();
    let _a = candidate(&mock, "a").become_leader(&shutdown).await.unwrap();
    let b = candidate(&mock, "b");
    let s = shutdown.clone();
    let waiting = tokio::spawn(async move { b.become_leader(&s).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!waiting.is_finished(), "a leads for life");
    let deleted_at = Instant::now();
    mock.end_pod_silently("a");
    mock.delete_lock_silently();
    let bound = Duration::from_secs(280);
    let b = tokio::time::timeout(bound, waiting)
        .await
        .unwrap_or_else(|_| panic!("the follower did not notice within {bound:?}"))
        .unwrap()
        .unwrap();
    assert!(b.is_leader());
    eprintln!(
        "a silently deleted lock was taken after {:?}",
        deleted_at.elapsed()
    );
    // An idle watch costs a GET per silence period, not more.
    let gets = mock.0.lock().unwrap().gets.len();
    assert!(gets < 10, "{gets} GETs");
}
