//! Prometheus metrics of one candidate, labelled by its lock.

use std::time::Duration;

use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

/// The metrics `/metrics` serves.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    /// 1 while this candidate leads.
    pub(crate) is_leader: Gauge,
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
pub(crate) const NAMES: [&str; 5] = [
    "kube_leader_is_leader",
    "kube_leader_transitions_total",
    "kube_leader_acquire_duration_seconds",
    "kube_leader_renew_duration_seconds",
    "kube_leader_renew_failures_total",
];

// === impl Metrics ===

impl Metrics {
    /// Metrics for `lock` in `namespace` with `strategy`.
    pub(crate) fn new(namespace: &str, lock: &str, strategy: &str) -> Self {
        let mut root = Registry::default();
        let registry = root
            .sub_registry_with_prefix("kube_leader")
            .sub_registry_with_labels(
                [
                    ("namespace".into(), namespace.to_string().into()),
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
            transitions,
            acquire,
            renew,
            renew_failures,
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
        m.is_leader.set(1);
        m.transitions.inc();
        m.acquire.observe(0.2);
        m.renew.observe(0.003);
        let text = m.encode();
        for name in NAMES {
            assert!(text.contains(name), "{name} missing in\n{text}");
        }
        assert!(
            text.contains(r#"kube_leader_is_leader{namespace="ns",lock="my-lock",strategy="lease"} 1"#),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
