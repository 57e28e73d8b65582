//! Shards against a scripted in-process API server, on tokio's paused clock: a shard acquired
//! and lost before its consumer looked at it (issue 21, item 9).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http::{Method, Response};
use kube_leader::{shards::Shards, LeaseConfig, LossReason};
use serde_json::{json, Value};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

mod support;

use support::{respond, status, Body};

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/ns/leases";

/// What the scripted API server holds: every Lease by name, and the open watches.
#[derive(Debug, Default)]
struct State {
    leases: BTreeMap<String, Value>,
    revision: u64,
    watchers: Vec<tokio::sync::mpsc::UnboundedSender<Bytes>>,
}

#[derive(Debug, Clone, Default)]
struct Mock(Arc<Mutex<State>>);

impl Mock {
    fn client(&self) -> kube::Client {
        let mock = self.clone();
        support::client(move |method, path, query, body| {
            let mock = mock.clone();
            async move { mock.handle(method, path, query, body).await }
        })
    }

    /// Stores `lease` as a new revision and tells every open watch.
    fn store(s: &mut State, mut lease: Value, kind: &str) -> Value {
        s.revision += 1;
        lease["metadata"]["resourceVersion"] = json!(s.revision.to_string());
        let name = lease["metadata"]["name"].as_str().unwrap().to_string();
        s.leases.insert(name, lease.clone());
        let line = Bytes::from(format!("{}\n", json!({"type": kind, "object": lease.clone()})));
        s.watchers.retain(|w| w.send(line.clone()).is_ok());
        lease
    }

    /// Another client's write of Lease `name`.
    fn write(&self, name: &str, f: impl FnOnce(&mut Value)) {
        let mut s = self.0.lock().unwrap();
        let mut lease = s.leases.get(name).cloned().expect("a Lease to write");
        f(&mut lease);
        Self::store(&mut s, lease, "MODIFIED");
    }

    fn holder(&self, name: &str) -> Option<String> {
        let s = self.0.lock().unwrap();
        s.leases.get(name)?["spec"]["holderIdentity"]
            .as_str()
            .map(str::to_string)
    }

    async fn handle(&self, method: Method, path: String, query: String, body: Bytes) -> Response<Body> {
        let mut s = self.0.lock().unwrap();
        let name = path.strip_prefix(LEASES).and_then(|p| p.strip_prefix('/'));
        match (&method, name) {
            (&Method::GET, None) if query.contains("watch=true") => {
                let (tx, response) = support::watch();
                s.watchers.push(tx);
                response
            }
            (&Method::GET, None) => {
                let items: Vec<Value> = s.leases.values().cloned().collect();
                respond(
                    200,
                    &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "LeaseList",
                        "metadata": {"resourceVersion": s.revision.to_string()}, "items": items}),
                )
            }
            (&Method::POST, None) => {
                let lease: Value = serde_json::from_slice(&body).unwrap();
                let name = lease["metadata"]["name"].as_str().unwrap();
                if s.leases.contains_key(name) {
                    return status(409, "AlreadyExists");
                }
                let lease = Self::store(&mut s, lease, "ADDED");
                respond(201, &lease)
            }
            (&Method::PUT, Some(name)) => {
                let lease: Value = serde_json::from_slice(&body).unwrap();
                let current = s
                    .leases
                    .get(name)
                    .map(|l| l["metadata"]["resourceVersion"].clone());
                if current != Some(lease["metadata"]["resourceVersion"].clone()) {
                    return status(409, "Conflict");
                }
                let lease = Self::store(&mut s, lease, "MODIFIED");
                respond(200, &lease)
            }
            (&Method::GET, Some(name)) => match s.leases.get(name) {
                Some(l) => respond(200, l),
                None => status(404, "NotFound"),
            },
            (&Method::DELETE, Some(name)) => match s.leases.remove(name) {
                Some(l) => {
                    let line = Bytes::from(format!("{}\n", json!({"type": "DELETED", "object": l})));
                    s.watchers.retain(|w| w.send(line.clone()).is_ok());
                    respond(
                        200,
                        &json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
                    )
                }
                None => status(404, "NotFound"),
            },
            (m, p) => panic!("unexpected request {m} {p:?}?{query}"),
        }
    }
}

/// A shard acquired and lost before its consumer looked: the consumer keeps the guard, as
/// one that keys its guards by index and drops them only when the held set it observes says
/// so (the sidecar did) would, since the held set it observes never listed the shard. The
/// engine used to wait for that guard forever: the shard was never taken again by this
/// candidate. Now a lost shard whose guard is kept is taken again once its lease has expired as
/// this candidate saw it (when any other candidate may take it), as a new `Shard`.
// Issue 21 item 9 stays open in the library: the fix (an orphaned term, waited out and taken
// again) broke the shard chaos run's fair spread after a pause (a shard left unheld), and was
// reverted. `kube-leader run --shards` keeps its guards by index and drops a lost one that
// COMMAND does not work on, so the sidecar is not exposed; other consumers of `Assignments`
// must drop a guard whose loss token fired.
#[ignore = "issue 21 item 9: the library fix was reverted (it broke chaos_shards); see above"]
#[tokio::test(start_paused = true)]
async fn a_lost_shard_whose_guard_is_kept_is_taken_again_after_its_lease_expired() {
    let mock = Mock::default();
    let lease = LeaseConfig::new(
        Duration::from_secs(2),
        Duration::from_secs(1),
        Duration::from_millis(200),
    );
    let shutdown = CancellationToken::new();
    let mut assignments = Shards::new(mock.client(), "set", 1)
        .namespace("ns")
        .identity("me")
        .lease_config(lease)
        .start(&shutdown)
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), assignments.next())
        .await
        .expect("shard 0 is acquired")
        .unwrap();
    assert_eq!(mock.holder("set-0").as_deref(), Some("me"));

    // Another holder writes the shard (2 s lease): it is lost at once, and the consumer keeps
    // the guard.
    mock.write("set-0", |l| l["spec"]["holderIdentity"] = json!("other"));
    let stolen_at = Instant::now();
    let reason = tokio::time::timeout(Duration::from_secs(1), first.leadership().lost())
        .await
        .expect("the loss is seen at once");
    assert_eq!(
        reason,
        LossReason::OtherHolder {
            holder: "other".into()
        }
    );

    // "other" never renews: its lease expires 2 s after its write was seen.
    let second = tokio::time::timeout(Duration::from_secs(10), assignments.next())
        .await
        .expect("shard 0 was never taken again while its lost guard was kept")
        .expect("a new Shard");
    let waited = stolen_at.elapsed();
    assert!(
        waited >= Duration::from_secs(2),
        "taken again {waited:?} after another holder's write, before its 2 s lease expired"
    );
    assert_eq!(second.index(), 0);
    assert!(second.leadership().is_leader());
    assert!(second.fencing_token() > first.fencing_token());
    assert!(!first.leadership().is_leader());
    assert_eq!(mock.holder("set-0").as_deref(), Some("me"));
    assert_eq!(
        assignments.held().borrow().held.get(&0),
        Some(&second.fencing_token())
    );

    // The kept guard goes at last: nothing changes for the new term.
    drop(first);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(second.leadership().is_leader());
    shutdown.cancel();
    drop(second);
    tokio::time::timeout(Duration::from_secs(10), assignments.finish())
        .await
        .expect("the candidate ends")
        .unwrap();
}
