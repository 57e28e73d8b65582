//! Unit tests of `metrics`: observe a sequence, encode the registry, read the text.

use std::time::{Duration, SystemTime};

use prometheus_client::encoding::text::encode;

use super::*;
use crate::{leadership::Strategy, lock::LockRef, Term};

fn term(lock: &str, fencing_token: u64) -> Term {
    Term {
        identity: "me".into(),
        lock: LockRef::new("ns", lock).unwrap(),
        strategy: Strategy::Lease,
        fencing_token,
        acquired_at: SystemTime::now(),
    }
}

fn text(registry: &Registry) -> String {
    let mut out = String::new();
    encode(&mut out, registry).unwrap();
    out
}

/// Asserts that every line of `expected` is a line of `text`.
fn assert_lines(text: &str, expected: &[&str]) {
    for line in expected {
        assert!(text.lines().any(|l| l == *line), "no line {line:?} in\n{text}");
    }
}

#[test]
fn a_follower_shows_zero_once_its_lock_is_added() {
    let mut registry = Registry::default();
    let metrics = LeaderMetrics::register(&mut registry);
    let before = text(&registry);
    assert!(!before.contains("master_status{"), "{before}");
    metrics.add_lock("my-lock");
    assert_lines(
        &text(&registry),
        &[
            "# TYPE leader_election_master_status gauge",
            r#"leader_election_master_status{name="my-lock"} 0"#,
            "# TYPE leader_election_slowpath counter",
            r#"leader_election_slowpath_total{name="my-lock"} 0"#,
            r#"kube_leader_leadership_acquired_total{name="my-lock"} 0"#,
            r#"kube_leader_renew_duration_seconds_count{name="my-lock"} 0"#,
            r#"kube_leader_fencing_token{name="my-lock"} 0"#,
            "# EOF",
        ],
    );
}

#[test]
fn a_term_with_renewals_and_its_end() {
    let mut registry = Registry::default();
    let metrics = LeaderMetrics::register(&mut registry);
    let t = term("my-lock", 7);
    let lock = t.lock.clone();
    metrics.observe(&Observation::Leading { term: t.clone() });
    metrics.observe(&Observation::Renewed {
        lock: lock.clone(),
        latency: Duration::from_millis(3),
    });
    metrics.observe(&Observation::Renewed {
        lock: lock.clone(),
        latency: Duration::from_millis(300),
    });
    metrics.observe(&Observation::RenewFailed {
        lock: lock.clone(),
        count: 2,
    });
    assert_lines(
        &text(&registry),
        &[
            r#"leader_election_master_status{name="my-lock"} 1"#,
            r#"leader_election_slowpath_total{name="my-lock"} 2"#,
            r#"kube_leader_leadership_acquired_total{name="my-lock"} 1"#,
            r#"kube_leader_fencing_token{name="my-lock"} 7"#,
            r#"kube_leader_renew_duration_seconds_count{name="my-lock"} 2"#,
            r#"kube_leader_renew_duration_seconds_bucket{le="0.005",name="my-lock"} 1"#,
            r#"kube_leader_renew_duration_seconds_bucket{le="0.5",name="my-lock"} 2"#,
        ],
    );
    metrics.observe(&Observation::Stopped {
        term: t,
        reason: LossReason::OtherHolder {
            holder: "them".into(),
        },
    });
    let after = text(&registry);
    assert_lines(
        &after,
        &[
            r#"leader_election_master_status{name="my-lock"} 0"#,
            r#"kube_leader_leadership_lost_total{name="my-lock",reason="other_holder"} 1"#,
            // The latest term's token stays: it tells which term this process led last.
            r#"kube_leader_fencing_token{name="my-lock"} 7"#,
        ],
    );
}

#[test]
fn terms_of_two_locks_and_a_second_term() {
    let mut registry = Registry::default();
    let metrics = LeaderMetrics::register(&mut registry);
    let (a, b) = (term("a", 1), term("b", 4));
    metrics.observe(&Observation::Leading { term: a.clone() });
    metrics.observe(&Observation::Leading { term: b.clone() });
    metrics.observe(&Observation::Stopped {
        term: a,
        reason: LossReason::RenewDeadline {
            since_last_renewal: Duration::from_secs(2),
        },
    });
    metrics.observe(&Observation::Leading { term: term("a", 3) });
    assert_lines(
        &text(&registry),
        &[
            r#"leader_election_master_status{name="a"} 1"#,
            r#"leader_election_master_status{name="b"} 1"#,
            r#"kube_leader_leadership_acquired_total{name="a"} 2"#,
            r#"kube_leader_leadership_acquired_total{name="b"} 1"#,
            r#"kube_leader_leadership_lost_total{name="a",reason="renew_deadline"} 1"#,
            r#"kube_leader_fencing_token{name="a"} 3"#,
            r#"kube_leader_fencing_token{name="b"} 4"#,
        ],
    );
}

#[tokio::test]
async fn follow_counts_a_term_without_an_observer() {
    let mut registry = Registry::default();
    let metrics = LeaderMetrics::register(&mut registry);
    let (leadership, keeper, _done) = Leadership::new(term("shard-0", 9));
    metrics.follow(&leadership);
    assert_lines(
        &text(&registry),
        &[
            r#"leader_election_master_status{name="shard-0"} 1"#,
            r#"kube_leader_fencing_token{name="shard-0"} 9"#,
        ],
    );
    keeper.lose(LossReason::Rebalanced);
    let line = r#"kube_leader_leadership_lost_total{name="shard-0",reason="rebalanced"} 1"#;
    for _ in 0..100 {
        if text(&registry).lines().any(|l| l == line) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_lines(
        &text(&registry),
        &[line, r#"leader_election_master_status{name="shard-0"} 0"#],
    );
}

#[test]
fn every_loss_reason_has_a_snake_case_label() {
    let reasons = [
        LossReason::LockDeleted,
        LossReason::LockReplaced { holder: None },
        LossReason::OtherHolder { holder: "x".into() },
        LossReason::RenewDeadline {
            since_last_renewal: Duration::ZERO,
        },
        LossReason::PodEnding { why: "x".into() },
        LossReason::DuplicateIdentity { identity: "x".into() },
        LossReason::KeeperStopped { why: "x".into() },
        LossReason::Released,
        LossReason::Cancelled,
        LossReason::Rebalanced,
    ];
    let labels: std::collections::BTreeSet<_> = reasons.iter().map(reason_label).collect();
    assert_eq!(labels.len(), reasons.len());
    for l in labels {
        assert!(l.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{l}");
    }
}
