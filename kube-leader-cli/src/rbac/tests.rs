//! Unit tests of the Roles `kube-leader rbac` prints.

use super::*;
use crate::cli::{Cli, Command};
use clap::Parser;

#[test]
fn the_header_names_the_service_account_it_binds() {
    let y = yaml(&args("kube-leader rbac --lock l"), "ns");
    assert!(
        y.lines()
            .take(3)
            .any(|l| l.contains("for ServiceAccount default.")),
        "{y}"
    );
    assert!(
        !y.contains("\nkind: ServiceAccount"),
        "every namespace has one: {y}"
    );
    let y = yaml(&args("kube-leader rbac --lock l --service-account app"), "ns");
    assert!(
        y.lines().take(3).any(|l| l.contains("for ServiceAccount app.")),
        "{y}"
    );
    // And prints it: the output is complete on its own.
    assert!(
        y.contains("kind: ServiceAccount\nmetadata:\n  name: app\n  namespace: ns\n---\n"),
        "{y}"
    );
}

fn args(s: &str) -> RbacArgs {
    let argv: Vec<&str> = s.split_whitespace().collect();
    match Cli::try_parse_from(argv).unwrap().command {
        Command::Rbac(a) => a,
        _ => panic!("not rbac"),
    }
}

#[test]
fn lease_rules_are_limited_to_the_lock_where_possible() {
    let y = yaml(&args("kube-leader rbac --strategy lease --lock my-lock"), "ns1");
    assert!(y.contains("resourceNames: [\"my-lock\"]"), "{y}");
    assert!(y.contains("verbs: [\"get\", \"update\"]"), "{y}");
    assert!(y.contains("verbs: [\"create\"]"), "{y}");
    assert!(!y.contains("pods"), "{y}");
    assert!(y.contains("namespace: ns1"), "{y}");
    // The candidates' registrations (--successor youngest, the default): namespace-wide.
    assert!(
        y.contains("resources: [\"leases\"]\n    verbs: [\"list\", \"watch\", \"patch\", \"delete\"]"),
        "{y}"
    );
    let any = yaml(
        &args("kube-leader rbac --strategy lease --lock my-lock --successor any"),
        "ns1",
    );
    assert!(!any.contains("delete") && !any.contains("patch"), "{any}");
    assert!(
        any.contains("verbs: [\"get\", \"list\", \"watch\", \"update\"]"),
        "{any}"
    );
    assert!(
        any.contains("`kube-leader run --strategy lease --lock my-lock --successor any`"),
        "{any}"
    );
    // client-go's LeaderElection Events.
    assert!(
        y.contains("resources: [\"events\"]\n    verbs: [\"create\"]"),
        "{y}"
    );
}

#[test]
fn watch_own_pod_adds_get_list_watch_pods_for_a_lease() {
    let y = yaml(
        &args("kube-leader rbac --strategy lease --lock l --watch-own-pod"),
        "ns",
    );
    assert!(
        y.contains("resources: [\"pods\"]\n    verbs: [\"get\", \"list\", \"watch\"]"),
        "{y}"
    );
    assert!(
        y.contains("`kube-leader run --strategy lease --lock l --watch-own-pod`"),
        "{y}"
    );
    assert!(
        !y.contains("resources: [\"pods\"]\n    verbs: [\"patch\"]"),
        "{y}"
    );
}

#[test]
fn label_pod_adds_patch_pods() {
    let y = yaml(
        &args("kube-leader rbac --strategy lease --lock l --label-pod"),
        "ns",
    );
    assert!(y.contains("resources: [\"pods\"]\n    verbs: [\"patch\"]"), "{y}");
    // Least privilege, said plainly: patch cannot be limited to the candidate's own Pod.
    for s in ["namespace-wide", "any Pod", "image"] {
        assert!(y.contains(s), "the --label-pod rule should say {s}: {y}");
    }
}

#[test]
fn shards_rules_name_the_shard_and_membership_leases() {
    let y = yaml(
        &args("kube-leader rbac --shards 3 --lock work --identity a"),
        "ns",
    );
    assert!(y.contains("name: kube-leader-shards-work"), "{y}");
    assert!(
        y.contains("resourceNames: [\"work-0\", \"work-1\", \"work-2\"]"),
        "{y}"
    );
    let member = kube_leader::internal::member_lease_name("work", "a");
    assert!(y.contains(&format!("resourceNames: [\"{member}\"]")), "{y}");
    assert!(y.contains("verbs: [\"list\", \"watch\"]"), "{y}");
    assert!(!y.contains("events"), "shards write no Events: {y}");
    assert!(
        y.contains("--shards 3 --lock work --namespace ns --identity a"),
        "{y}"
    );
    // Without identities, the membership Leases cannot be named.
    let y = yaml(&args("kube-leader rbac --shards 3 --lock work"), "ns");
    assert!(!y.contains("resourceNames"), "{y}");
    assert!(y.contains("verbs: [\"get\", \"update\", \"delete\"]"), "{y}");
    assert!(y.contains("--identity"), "the rule says how to limit it: {y}");
}

#[test]
fn dead_leader_pod_keep_needs_no_delete_pods() {
    // The verbs of the first rule on pods.
    let pods = |s: &str| {
        let y = yaml(&args(s), "ns");
        let verbs = pod_verbs(&y).first().cloned().expect("a pods rule");
        (y, verbs)
    };
    let (y, verbs) = pods("kube-leader rbac --lock l --dead-leader-pod keep");
    assert_eq!(verbs.trim(), "verbs: [\"get\", \"list\", \"watch\"]", "{y}");
    assert!(
        y.contains("run --strategy for-life --lock l --dead-leader-pod keep`"),
        "{y}"
    );
    for s in [
        "kube-leader rbac --lock l",
        "kube-leader rbac --lock l --dead-leader-pod delete-evicted",
        "kube-leader rbac --lock l --dead-leader-pod delete-terminal",
    ] {
        let (y, verbs) = pods(s);
        assert_eq!(
            verbs.trim(),
            "verbs: [\"get\", \"list\", \"watch\", \"delete\"]",
            "{s}: {y}"
        );
    }
    // With --label-pod, keep still deletes nothing.
    let y = yaml(
        &args("kube-leader rbac --lock l --dead-leader-pod keep --label-pod"),
        "ns",
    );
    assert!(pod_verbs(&y).iter().all(|v| !v.contains("delete")), "{y}");
    assert_eq!(pod_verbs(&y).len(), 2, "{y}");
}

/// The verbs lines of the rules on pods.
fn pod_verbs(y: &str) -> Vec<String> {
    let lines: Vec<&str> = y.lines().collect();
    lines
        .windows(2)
        .filter(|w| w[0].trim() == "resources: [\"pods\"]")
        .map(|w| w[1].trim().to_string())
        .collect()
}

#[test]
fn dead_leader_pod_is_refused_for_a_lease() {
    for s in [
        "kube-leader rbac --strategy lease --lock l --dead-leader-pod keep",
        "kube-leader rbac --shards 2 --lock l --dead-leader-pod keep",
    ] {
        let e = args(s).validate().unwrap_err();
        assert!(e.contains("--dead-leader-pod"), "{s}: {e}");
    }
    args("kube-leader rbac --lock l --dead-leader-pod keep")
        .validate()
        .unwrap();
}

#[test]
fn fence_grants_impersonating_itself_with_the_token_extra() {
    let y = yaml(
        &args("kube-leader rbac --strategy lease --lock l --service-account op --fence"),
        "ns",
    );
    assert!(
        y.contains(
            "resources: [\"serviceaccounts\"]\n    resourceNames: [\"op\"]\n    verbs: [\"impersonate\"]"
        ),
        "{y}"
    );
    assert!(
        y.contains("kind: ClusterRole\nmetadata:\n  name: kube-leader-fence-writer-ns-op"),
        "{y}"
    );
    assert!(
        y.contains("apiGroups: [\"authentication.k8s.io\"]\n    resources: [\"userextras/kube-leader.io/fencing-token\"]"),
        "{y}"
    );
    assert!(y.contains("--fence"), "{y}");
    let y = yaml(&args("kube-leader rbac --strategy lease --lock l"), "ns");
    assert!(!y.contains("impersonate") && !y.contains("ClusterRole"), "{y}");
}

#[test]
fn for_life_rules_include_events() {
    let y = yaml(&args("kube-leader rbac --lock l --service-account op"), "ns");
    assert!(
        y.contains("resources: [\"events\"]\n    verbs: [\"create\"]"),
        "{y}"
    );
    assert!(y.contains("name: op\n    namespace: ns"), "{y}");
    assert!(y.contains("--service-account op"), "{y}");
}
