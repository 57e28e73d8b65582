//! The Lease API of namespace `ns`, in memory, for the shards mock tests: every Lease by name,
//! a revision per write, optimistic concurrency on `resourceVersion`, and watches that stream
//! every change (held back while the watch lags). Mounted by the tests that use it
//! (`#[path = "support/leases.rs"] mod leases;`), so that the other mock tests do not carry it.

use std::collections::BTreeMap;

use bytes::Bytes;
use http::{Method, Response};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedSender;

use crate::support::{self, respond, status, Body};

/// The path of the Lease collection.
pub(crate) const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/ns/leases";

/// Every Lease by name, and the open watches.
#[derive(Debug, Default)]
pub(crate) struct Leases {
    pub(crate) leases: BTreeMap<String, Value>,
    pub(crate) revision: u64,
    watchers: Vec<UnboundedSender<Bytes>>,
    /// Watch events held back (a watch that lags), while `Some`.
    pub(crate) held_back: Option<Vec<Bytes>>,
}

impl Leases {
    /// Stores `lease` as a new revision and tells every open watch (`kind`: `ADDED`,
    /// `MODIFIED`).
    pub(crate) fn store(&mut self, mut lease: Value, kind: &str) -> Value {
        self.revision += 1;
        lease["metadata"]["resourceVersion"] = json!(self.revision.to_string());
        let name = lease["metadata"]["name"].as_str().unwrap().to_string();
        self.leases.insert(name, lease.clone());
        self.tell(kind, &lease);
        lease
    }

    /// Sends the watch events held back, and every later one at once.
    #[allow(dead_code, reason = "only the tests of a lagging watch hold events back")]
    pub(crate) fn release_watch(&mut self) {
        for line in self.held_back.take().unwrap_or_default() {
            self.watchers.retain(|w| w.send(line.clone()).is_ok());
        }
    }

    fn tell(&mut self, kind: &str, lease: &Value) {
        let line = Bytes::from(format!("{}\n", json!({"type": kind, "object": lease})));
        match &mut self.held_back {
            Some(held) => held.push(line),
            None => self.watchers.retain(|w| w.send(line.clone()).is_ok()),
        }
    }

    /// Answers a request of the Lease API; any other request fails the test.
    pub(crate) fn handle(
        &mut self,
        method: &Method,
        path: &str,
        query: &str,
        body: &Bytes,
    ) -> Response<Body> {
        let name = path.strip_prefix(LEASES).and_then(|p| p.strip_prefix('/'));
        match (method, name) {
            (&Method::GET, None) if query.contains("watch=true") => {
                let (tx, response) = support::watch();
                self.watchers.push(tx);
                response
            }
            (&Method::GET, None) => {
                let items: Vec<Value> = self.leases.values().cloned().collect();
                respond(
                    200,
                    &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "LeaseList",
                        "metadata": {"resourceVersion": self.revision.to_string()}, "items": items}),
                )
            }
            (&Method::POST, None) => {
                let lease: Value = serde_json::from_slice(body).unwrap();
                let name = lease["metadata"]["name"].as_str().unwrap();
                if self.leases.contains_key(name) {
                    return status(409, "AlreadyExists");
                }
                let lease = self.store(lease, "ADDED");
                respond(201, &lease)
            }
            (&Method::PUT, Some(name)) => {
                let lease: Value = serde_json::from_slice(body).unwrap();
                let current = self
                    .leases
                    .get(name)
                    .map(|l| l["metadata"]["resourceVersion"].clone());
                if current != Some(lease["metadata"]["resourceVersion"].clone()) {
                    return status(409, "Conflict");
                }
                let lease = self.store(lease, "MODIFIED");
                respond(200, &lease)
            }
            (&Method::GET, Some(name)) => match self.leases.get(name) {
                Some(l) => respond(200, l),
                None => status(404, "NotFound"),
            },
            (&Method::DELETE, Some(name)) => match self.leases.remove(name) {
                Some(l) => {
                    self.tell("DELETED", &l);
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
