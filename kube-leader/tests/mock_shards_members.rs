//! Shards against a scripted in-process API server, on tokio's paused clock: a member whose
//! membership Lease expired and is renewed again (a partition healed, a stopped process group
//! continued) counts again at once (found by the shards sidecar's chaos run, issue 21).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http::{Method, Response};
use kube_leader::{LeaseConfig, Shards};
use serde_json::{json, Value};
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
            async move { mock.handle(method, path, query, body) }
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

    /// Another candidate's write of its membership Lease `name` (2 s), renewed at `renew`.
    fn member(&self, name: &str, holder: &str, renew: &str) {
        let mut s = self.0.lock().unwrap();
        let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 2,
                "acquireTime": "2026-01-01T00:00:00.000000Z", "renewTime": renew}});
        let kind = if s.leases.contains_key(name) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        Self::store(&mut s, lease, kind);
    }

    fn handle(&self, method: Method, path: String, query: String, body: Bytes) -> Response<Body> {
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
                Some(_) => respond(
                    200,
                    &json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
                ),
                None => status(404, "NotFound"),
            },
            (m, p) => panic!("unexpected request {m} {p:?}?{query}"),
        }
    }
}

/// Another member's membership Lease expires (it stops renewing: partitioned, or its process
/// group stopped), and this candidate takes its share; then the member renews it again, with
/// the same holder. This candidate must count it again and hand its share back. Before, a
/// membership Lease marked the set for a rebalance only when its holder changed: the member
/// back with the same holder was ignored until something else changed (in the chaos run, no
/// fair spread 30 s after a healed partition: one replica held every shard, the other none).
#[tokio::test(start_paused = true)]
async fn a_member_that_renews_again_after_it_expired_counts_again() {
    let mock = Mock::default();
    mock.member("set-member-other", "other", "2026-01-01T00:00:00.000000Z");
    let lease = LeaseConfig::default()
        .lease_duration(Duration::from_secs(2))
        .renew_deadline(Duration::from_secs(1))
        .retry_period(Duration::from_millis(200));
    let shutdown = CancellationToken::new();
    let mut assignments = Shards::new(mock.client(), "set", 2)
        .namespace("ns")
        .identity("me")
        .config(kube_leader::ShardsConfig::default().lease(lease))
        .start(&shutdown)
        .unwrap();
    let held = assignments.held();
    let mut guards = Vec::new();
    let share = |members: usize, quota: u32| {
        let held = held.clone();
        move || {
            let s = held.borrow();
            s.members == members && s.quota == quota
        }
    };
    // "other" never renews: once its 2 s are over, both shards are this candidate's.
    let alone = share(1, 2);
    tokio::time::timeout(Duration::from_secs(10), async {
        while !alone() || guards.len() < 2 {
            tokio::select! {
                Some(shard) = assignments.next() => guards.push(shard),
                () = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
    })
    .await
    .expect("both shards held once the other member expired");

    // "other" renews its membership again (same holder): it counts again within a retry
    // period or two.
    mock.member("set-member-other", "other", "2026-01-01T00:00:09.000000Z");
    let back = share(2, 1);
    tokio::time::timeout(Duration::from_secs(2), async {
        while !back() {
            tokio::select! {
                Some(shard) = assignments.next() => guards.push(shard),
                () = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the member back with the same holder is not counted: {:?}",
            held.borrow()
        )
    });
    shutdown.cancel();
    drop(guards);
    tokio::time::timeout(Duration::from_secs(10), assignments.finish())
        .await
        .expect("the candidate ends")
        .unwrap();
}
