//! The opt-in NotReady takeover: a waiting candidate reads the leader Pod's Node and tracks
//! since when it is not `Ready` (see [`ForLifeConfig::not_ready_takeover`](super::ForLifeConfig::not_ready_takeover)).

use std::{sync::atomic::Ordering, time::Duration};

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::Election;
use crate::api::{call, Failure, Op};
use crate::for_life::record::LeaderPod;

/// Where to find the ClusterRole that the opt-in NotReady takeover needs.
const NODES_HINT: &str = "a ClusterRole granting get nodes (the optional one at the end of \
     https://github.com/kube-leader/kube-leader/blob/main/deploy/for-life/rbac-for-life.yaml)";

/// The opt-in NotReady check of the leader Pod's Node.
#[derive(Debug)]
pub(in crate::for_life) struct NodeCheck {
    pub(super) node: String,
    pub(super) not_ready_since: Option<Instant>,
    pub(super) next_check: Instant,
}

// === impl Election (Node check) ===

impl Election<'_> {
    /// Starts, keeps or stops the opt-in check of the leader Pod's Node.
    pub(super) fn track_node(&mut self) {
        let node = match (
            self.policy().not_ready_takeover,
            self.leader_pod.as_ref().map(|p| &p.state),
        ) {
            (Some(_), Some(LeaderPod::Present(pod))) if !pod.is_terminal() => pod.node_name.clone(),
            _ => None,
        };
        match node {
            Some(node) if self.node.as_ref().is_some_and(|n| n.node == node) => {}
            Some(node) => {
                self.node = Some(NodeCheck {
                    node,
                    not_ready_since: None,
                    next_check: Instant::now(),
                })
            }
            None => self.node = None,
        }
    }

    /// The opt-in policy: reads the leader Pod's Node and tracks since when it is not `Ready`.
    pub(super) async fn check_node(&mut self) {
        let Some(check) = self.node.as_mut() else { return };
        let grace = self.elector.config.not_ready_takeover.unwrap_or_default();
        let now = Instant::now();
        check.next_check = now + (grace / 4).clamp(Duration::from_millis(200), Duration::from_secs(10));
        let nodes: Api<Node> = Api::all(self.elector.client.clone());
        let op = Op {
            verb: "get",
            resource: "nodes",
            namespace: "<cluster>",
            name: &check.node,
            hint: NODES_HINT,
        };
        let ready = match call(op, self.elector.config.api_timeout, nodes.get_opt(&check.node)).await {
            Ok(Some(node)) => is_ready(&node),
            // The Node object is gone: nothing runs there any more that the control plane knows.
            Ok(None) | Err(Failure::NotFound) => false,
            Err(Failure::Fatal(e)) => {
                if !self.elector.node_check_disabled.swap(true, Ordering::Relaxed) {
                    warn!(error = %e, "cannot read Nodes: the opt-in NotReady takeover is disabled for this elector");
                }
                self.node = None;
                return;
            }
            Err(e) => {
                debug!(error = ?e, node = %check.node, "reading the leader's Node failed");
                return;
            }
        };
        match (ready, check.not_ready_since) {
            (true, Some(_)) => {
                info!(node = %check.node, "the leader's Node is Ready again");
                check.not_ready_since = None;
            }
            (false, None) => {
                info!(node = %check.node, ?grace,
                    "the leader's Node is not Ready; taking over if it stays so for the grace");
                check.not_ready_since = Some(now);
            }
            _ => {}
        }
    }
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}
