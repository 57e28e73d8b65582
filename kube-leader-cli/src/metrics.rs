//! Prometheus metrics of one candidate, labelled by its lock.
//!
//! The lock's namespace is the label `lock_namespace`, not `namespace`: Prometheus sets
//! `namespace` on every scraped target (the Pod's), and renames a clashing label of the target's
//! own to `exported_namespace`. Beside kube-leader's own metrics, client-go's
//! `leader_election_master_status{name}` (1 while leading), so that dashboards and alerts made for
//! client-go and controller-runtime leader election work unchanged, and
//! `kube_leader_build_info{version, commit}`.

use std::time::Duration;

use kube_leader::observer::Observation;
use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, gauge::Gauge, histogram::Histogram, info::Info},
    registry::Registry,
};

/// The metrics `/metrics` serves.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    /// 1 while this candidate leads.
    is_leader: Gauge,
    /// client-go's name for `is_leader`, labelled `name` (the lock).
    master_status: Gauge,
    /// Changes of the lock's holder seen by this candidate.
    pub(crate) transitions: Counter,
    /// Time from the start of a campaign to leading.
    pub(crate) acquire: Histogram,
    /// Lease: from a renewal's renewTime to this leader seeing it stored.
    pub(crate) renew: Histogram,
    /// Lease: renewals that did not happen on schedule.
    pub(crate) renew_failures: Counter,
}

/// Names, for tests and documentation.
#[cfg(test)]
pub(crate) const NAMES: [&str; 7] = [
    "kube_leader_build_info",
    "leader_election_master_status",
    "kube_leader_is_leader",
    "kube_leader_transitions_total",
    "kube_leader_acquire_duration_seconds",
    "kube_leader_renew_duration_seconds",
    "kube_leader_renew_failures_total",
];

/// Registers the metrics without the lock labels, first: `kube_leader_build_info` and
/// client-go's `leader_election_master_status{name}`, whose gauge it returns.
fn register_unlabelled(root: &mut Registry, lock: &str) -> Gauge {
    root.sub_registry_with_prefix("kube_leader").register(
        "build",
        "The kube-leader build: version and commit",
        Info::new(vec![
            ("version", env!("CARGO_PKG_VERSION")),
            ("commit", crate::version::COMMIT),
        ]),
    );
    let master_status = Gauge::default();
    root.sub_registry_with_labels(std::iter::once(("name".into(), lock.to_string().into())))
        .register(
            "leader_election_master_status",
            "client-go's leader election gauge: 1 while this candidate leads the lock named by `name`, else 0",
            master_status.clone(),
        );
    master_status
}

// === impl Metrics ===

impl Metrics {
    /// Metrics for `lock` in `namespace` with `strategy`.
    pub(crate) fn new(namespace: &str, lock: &str, strategy: &str) -> Self {
        let mut root = Registry::default();
        let master_status = register_unlabelled(&mut root, lock);
        let registry = root
            .sub_registry_with_prefix("kube_leader")
            .sub_registry_with_labels(
                [
                    ("lock_namespace".into(), namespace.to_string().into()),
                    ("lock".into(), lock.to_string().into()),
                    ("strategy".into(), strategy.to_string().into()),
                ]
                .into_iter(),
            );
        let is_leader = Gauge::default();
        registry.register(
            "is_leader",
            "1 while this candidate leads the lock, else 0",
            is_leader.clone(),
        );
        let transitions = Counter::default();
        registry.register(
            "transitions",
            "Changes of the lock's holder seen by this candidate",
            transitions.clone(),
        );
        let acquire = Histogram::new([
            0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0, 60.0, 300.0, 1800.0,
        ]);
        registry.register(
            "acquire_duration_seconds",
            "Time from the start of a campaign until this candidate leads",
            acquire.clone(),
        );
        let renew = Histogram::new([
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ]);
        registry.register(
            "renew_duration_seconds",
            "Lease: time from a renewal's renewTime until this leader sees it stored",
            renew.clone(),
        );
        let renew_failures = Counter::default();
        registry.register(
            "renew_failures",
            "Lease: renewals that did not happen on schedule (failed or late), as seen by this leader",
            renew_failures.clone(),
        );
        Self {
            registry: root,
            is_leader,
            master_status,
            transitions,
            acquire,
            renew,
            renew_failures,
        }
    }

    /// Whether this candidate leads: `kube_leader_is_leader` and `leader_election_master_status`.
    pub(crate) fn set_leader(&self, leading: bool) {
        let v = i64::from(leading);
        self.is_leader.set(v);
        self.master_status.set(v);
    }

    /// The elector's observer: each renewal's latency and the renewals that failed or came
    /// late.
    pub(crate) fn observer(&self) -> impl kube_leader::observer::Observer {
        let (renew, failures) = (self.renew.clone(), self.renew_failures.clone());
        move |o: &Observation| match o {
            Observation::Renewed { latency, .. } => renew.observe(secs(*latency)),
            Observation::RenewFailed { count, .. } => {
                failures.inc_by(*count);
            }
            _ => {}
        }
    }

    /// The OpenMetrics text exposition.
    pub(crate) fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// A duration in seconds, for histograms.
pub(crate) fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_exposed_with_the_lock() {
        let m = Metrics::new("ns", "my-lock", "lease");
        m.set_leader(true);
        m.transitions.inc();
        m.acquire.observe(0.2);
        m.renew.observe(0.003);
        let text = m.encode();
        for name in NAMES {
            assert!(text.contains(name), "{name} missing in\n{text}");
        }
        assert!(
            text.contains(r#"kube_leader_is_leader{lock_namespace="ns",lock="my-lock",strategy="lease"} 1"#),
            "{text}"
        );
        // client-go's gauge, with client-go's one label.
        assert!(
            text.contains(r#"leader_election_master_status{name="my-lock"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                r#"kube_leader_build_info{{version="{}",commit="{}"}} 1"#,
                env!("CARGO_PKG_VERSION"),
                crate::version::COMMIT
            )),
            "{text}"
        );
        // No label that Prometheus would rename on scrape.
        assert!(
            !text.contains("{namespace=") && !text.contains(",namespace="),
            "{text}"
        );
        m.set_leader(false);
        let text = m.encode();
        assert!(
            text.contains(r#"leader_election_master_status{name="my-lock"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(r#"kube_leader_is_leader{lock_namespace="ns",lock="my-lock",strategy="lease"} 0"#),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
