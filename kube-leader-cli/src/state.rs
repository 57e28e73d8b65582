//! What this candidate knows about the election: the source of the log lines, the status
//! server's answers, its events and its metrics.

use std::{sync::Arc, time::SystemTime};

use kube_leader::internal::ElectorExt as _;
use kube_leader::internal::StrategyExt as _;
use kube_leader::{LeaderInfo, LockRef};
use serde::Serialize;
use tokio::sync::{broadcast, watch};
use tracing::info;

use kube_leader::Elector;

use kube_leader::Strategy;

use crate::metrics::Metrics;

/// The election as this candidate sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Snapshot {
    /// Whether the first election result is known (a holder seen, or this candidate leads).
    pub(crate) known: bool,
    /// The current holder, if any.
    pub(crate) holder: Option<String>,
    /// Whether this candidate leads.
    pub(crate) is_leader: bool,
    /// When the holder acquired the lock (by its clock).
    pub(crate) since: Option<SystemTime>,
    /// The holder's fencing token.
    pub(crate) fencing_token: Option<u64>,
    /// When this process saw the holder change last, by its own clock (nais/elector's
    /// `last_update`).
    pub(crate) changed_at: Option<SystemTime>,
}

/// `GET /` and each event of `GET /sse`: the answer of the retired `leader-elector` sidecar
/// (`name`) and of nais/elector (`name`, `last_update`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ElectorView {
    /// The holder, `""` if none (as `leader-elector` answered).
    pub(crate) name: String,
    /// When the holder last changed, RFC 3339 to the second (as nais/elector writes it);
    /// absent before the first election result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) last_update: Option<String>,
}

impl From<&Snapshot> for ElectorView {
    fn from(s: &Snapshot) -> Self {
        Self {
            name: s.holder.clone().unwrap_or_default(),
            last_update: s.changed_at.map(rfc3339_seconds),
        }
    }
}

/// `GET /leader`, and each event of `GET /events`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LeaderView {
    lock: String,
    namespace: String,
    strategy: &'static str,
    identity: String,
    holder: Option<String>,
    is_leader: bool,
    since: Option<String>,
    fencing_token: Option<u64>,
}

/// Shared by the election loop, the leader watch and the status server.
#[derive(Debug)]
pub(crate) struct Status {
    pub(crate) lock: LockRef,
    pub(crate) identity: String,
    pub(crate) strategy: Strategy,
    pub(crate) ready_only_when_leader: bool,
    pub(crate) metrics: Metrics,
    elector: Elector,
    health_tolerance: std::time::Duration,
    snapshot: watch::Sender<Snapshot>,
    events: broadcast::Sender<Arc<str>>,
}

// === impl Status ===

impl Status {
    /// The status of `elector`'s campaign for `lock`; `metrics` are fed by its observer.
    pub(crate) fn new(
        lock: LockRef,
        identity: String,
        strategy: Strategy,
        ready_only_when_leader: bool,
        (elector, metrics): (Elector, Metrics),
        health_tolerance: std::time::Duration,
    ) -> Self {
        Self {
            lock,
            identity,
            strategy,
            ready_only_when_leader,
            metrics,
            elector,
            health_tolerance,
            snapshot: watch::channel(Snapshot::default()).0,
            events: broadcast::channel(64).0,
        }
    }

    /// The current snapshot.
    pub(crate) fn snapshot(&self) -> Snapshot {
        self.snapshot.borrow().clone()
    }

    /// The snapshot, as it changes.
    pub(crate) fn watch(&self) -> watch::Receiver<Snapshot> {
        self.snapshot.subscribe()
    }

    /// Leadership events as JSON, one per change.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Arc<str>> {
        self.events.subscribe()
    }

    /// What `GET /leader` answers.
    pub(crate) fn view(&self) -> LeaderView {
        let s = self.snapshot();
        LeaderView {
            lock: self.lock.name.clone(),
            namespace: self.lock.namespace.clone(),
            strategy: self.strategy.as_str(),
            identity: self.identity.clone(),
            holder: s.holder,
            is_leader: s.is_leader,
            since: s.since.map(rfc3339),
            fencing_token: s.fencing_token,
        }
    }

    /// The lock's leader as the elector sees it.
    pub(crate) fn leader(&self) -> watch::Receiver<Option<LeaderInfo>> {
        self.elector.observe_lock(&self.lock)
    }

    /// The election watchdog.
    pub(crate) fn health(&self) -> Result<(), String> {
        self.elector
            .check_health(self.health_tolerance)
            .map_err(|u| u.to_string())
    }

    /// Whether `/readyz` passes.
    pub(crate) fn ready(&self) -> bool {
        let s = self.snapshot.borrow();
        if self.ready_only_when_leader {
            s.is_leader
        } else {
            s.known
        }
    }

    /// The lock's holder as watched: logs a change of leader seen by this candidate.
    pub(crate) fn observe(&self, info: Option<&LeaderInfo>) {
        let holder = info.and_then(|i| i.holder.clone());
        let token = info.and_then(|i| i.fencing_token);
        self.update(|s| {
            // A Lease holder's token becomes known with its first renewal: that is no new term.
            let new_term = s.holder != holder
                || (holder.is_some() && matches!((s.fencing_token, token), (Some(a), Some(b)) if a != b));
            if !new_term && s.fencing_token == token {
                return;
            }
            if new_term && s.known && holder.is_some() {
                self.metrics.transitions.inc();
            }
            // This candidate's own rise and fall are logged by `lead` and `lose`.
            if new_term && holder.as_deref() != Some(self.identity.as_str()) && !s.is_leader {
                match &holder {
                    Some(h) => info!(lock = %self.lock, identity = %self.identity, leader = %h,
                        fencing_token = token, "leader is {h}"),
                    None => info!(lock = %self.lock, identity = %self.identity, "no leader"),
                }
            }
            s.known |= holder.is_some();
            s.holder = holder;
            s.fencing_token = token;
            s.since = info.and_then(|i| i.acquired_at);
        });
    }

    /// This candidate leads.
    pub(crate) fn lead(&self, fencing_token: u64, since: SystemTime) {
        info!(lock = %self.lock, identity = %self.identity, fencing_token, "became leader");
        self.metrics.set_leader(true);
        self.update(|s| {
            if s.holder.as_deref() != Some(self.identity.as_str()) && s.known {
                self.metrics.transitions.inc();
            }
            s.known = true;
            s.is_leader = true;
            s.holder = Some(self.identity.clone());
            s.fencing_token = Some(fencing_token);
            s.since = Some(since);
        });
    }

    /// This candidate no longer leads: it lost leadership, or steps down (`stepping_down`).
    pub(crate) fn lose(&self, fencing_token: u64, reason: &str, stepping_down: bool) {
        if !self.snapshot.borrow().is_leader {
            return;
        }
        if stepping_down {
            info!(lock = %self.lock, identity = %self.identity, fencing_token, %reason, "stepping down");
        } else {
            info!(lock = %self.lock, identity = %self.identity, fencing_token, %reason, "lost leadership");
        }
        self.metrics.set_leader(false);
        self.update(|s| s.is_leader = false);
    }

    fn update(&self, f: impl FnOnce(&mut Snapshot)) {
        let changed = self.snapshot.send_if_modified(|s| {
            let before = s.clone();
            f(s);
            if s.holder != before.holder {
                s.changed_at = Some(SystemTime::now());
            }
            *s != before
        });
        if changed {
            if let Ok(json) = serde_json::to_string(&self.view()) {
                // No subscriber is fine.
                let _ = self.events.send(json.into());
            }
        }
    }
}

/// RFC 3339 in UTC to the second, as Go's `time.RFC3339` writes it.
pub(crate) fn rfc3339_seconds(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rfc3339(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs))
}

/// RFC 3339 in UTC, as Kubernetes writes times.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    k8s_openapi::jiff::Timestamp::try_from(t)
        .map(|ts| ts.to_string())
        .unwrap_or_else(|_| "invalid".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_elector_view_has_leader_elector_and_nais_fields() {
        let none = serde_json::to_value(ElectorView::from(&Snapshot::default())).unwrap();
        assert_eq!(none, serde_json::json!({ "name": "" }));
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_800_000_000_750);
        let s = Snapshot {
            holder: Some("pod-a".into()),
            changed_at: Some(t),
            ..Snapshot::default()
        };
        let v = serde_json::to_value(ElectorView::from(&s)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({ "name": "pod-a", "last_update": "2027-01-15T08:00:00Z" })
        );
    }
}
