//! Shards against a scripted in-process API server, on tokio's paused clock: a member whose
//! membership Lease expired and is renewed again (a partition healed, a stopped process group
//! continued) counts again at once (found by the shards sidecar's chaos run, issue 21).

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http::{Method, Response};
use kube_leader::{LeaseConfig, Shards};
use serde_json::json;
use tokio_util::sync::CancellationToken;

mod support;

#[path = "support/leases.rs"]
mod leases;

use leases::Leases;
use support::Body;

#[derive(Debug, Clone, Default)]
struct Mock(Arc<Mutex<Leases>>);

impl Mock {
    fn client(&self) -> kube::Client {
        let mock = self.clone();
        support::client(move |method, path, query, body| {
            let mock = mock.clone();
            async move { mock.handle(method, path, query, body) }
        })
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
        s.store(lease, kind);
    }

    fn handle(&self, method: Method, path: String, query: String, body: Bytes) -> Response<Body> {
        self.0.lock().unwrap().handle(&method, &path, &query, &body)
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
