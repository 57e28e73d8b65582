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

// === --elector-service-account and --flow-schema ===

/// The YAML documents of `y` whose `kind:` line is `kind`.
fn docs<'a>(y: &'a str, kind: &str) -> Vec<&'a str> {
    y.split("\n---\n")
        .filter(|d| d.lines().any(|l| l == format!("kind: {kind}")))
        .collect()
}

#[test]
fn an_elector_gets_the_election_role_and_the_pods_service_account_only_impersonation() {
    let y = yaml(
        &args(
            "kube-leader rbac --strategy lease --lock l --service-account app \
             --elector-service-account app-elector --watch-own-pod",
        ),
        "ns",
    );
    // Both ServiceAccounts; the elector's mounts no token.
    let accounts = docs(&y, "ServiceAccount");
    assert_eq!(accounts.len(), 2, "{y}");
    assert!(
        accounts[1].contains("name: app-elector\n  namespace: ns")
            && accounts[1].contains("automountServiceAccountToken: false"),
        "{y}"
    );
    let roles = docs(&y, "Role");
    let bindings = docs(&y, "RoleBinding");
    assert_eq!((roles.len(), bindings.len()), (2, 2), "{y}");
    // The election's Role, bound to the elector.
    assert!(roles[0].contains("resourceNames: [\"l\"]"), "{y}");
    assert!(roles[0].contains("resources: [\"pods\"]"), "{y}");
    assert!(!roles[0].contains("impersonate"), "{y}");
    assert!(
        bindings[0].contains("name: kube-leader-lease-l\n")
            && bindings[0].contains("- kind: ServiceAccount\n    name: app-elector\n    namespace: ns"),
        "{y}"
    );
    // The Pod's: impersonate the elector by name, nothing else.
    assert!(
        roles[1].contains("name: kube-leader-lease-l-impersonate\n"),
        "{y}"
    );
    let rules: Vec<&str> = roles[1]
        .lines()
        .filter(|l| l.trim_start().starts_with("- apiGroups"))
        .collect();
    assert_eq!(rules.len(), 1, "{y}");
    assert!(
        roles[1].contains(
            "resources: [\"serviceaccounts\"]\n    resourceNames: [\"app-elector\"]\n    verbs: [\"impersonate\"]"
        ),
        "{y}"
    );
    assert!(
        bindings[1].contains("- kind: ServiceAccount\n    name: app\n    namespace: ns"),
        "{y}"
    );
    assert!(
        y.contains("`kube-leader run --strategy lease --lock l --elector-service-account app-elector --watch-own-pod`"),
        "{y}"
    );
    // Without an elector: one Role, bound to the Pod's ServiceAccount, as before.
    let y = yaml(
        &args("kube-leader rbac --strategy lease --lock l --service-account app"),
        "ns",
    );
    assert_eq!(docs(&y, "Role").len(), 1, "{y}");
    assert!(!y.contains("elector") && !y.contains("impersonate"), "{y}");
}

#[test]
fn with_an_elector_the_fence_stays_on_the_pods_service_account() {
    let y = yaml(
        &args(
            "kube-leader rbac --strategy lease --lock l --service-account app \
             --elector-service-account app-elector --fence",
        ),
        "ns",
    );
    let roles = docs(&y, "Role");
    assert!(!roles[0].contains("impersonate"), "the elector's Role: {y}");
    assert!(
        roles[1].contains("resourceNames: [\"app-elector\"]")
            && roles[1].contains("resourceNames: [\"app\"]"),
        "the Pod's: the elector and itself: {y}"
    );
    let cluster_binding = docs(&y, "ClusterRoleBinding");
    assert!(
        cluster_binding[0].contains("name: app\n    namespace: ns"),
        "the fencing-token extra for the Pod's: {y}"
    );
}

#[test]
fn the_elector_is_a_service_account_of_its_own() {
    let e = args("kube-leader rbac --lock l --service-account app --elector-service-account app")
        .validate()
        .unwrap_err();
    assert!(e.contains("of its own"), "{e}");
    for line in [
        "kube-leader rbac --lock l --elector-service-account default",
        "kube-leader run --lock l --elector-service-account default -- true",
        "kube-leader rbac --lock l --elector-service-account Not_A_Name",
        // --flow-schema is the elector's.
        "kube-leader rbac --lock l --flow-schema",
    ] {
        let argv: Vec<&str> = line.split_whitespace().collect();
        assert!(Cli::try_parse_from(argv).is_err(), "{line}");
    }
}

/// `kube-leader rbac --flow-schema` as deploy/flow-schema/flow-schema.yaml holds it: the file is
/// the snapshot of this output (for deploy/lease's options in namespace `default`), but for the
/// FlowSchema's name, which a kustomization completes with the namespace, and its header.
#[test]
fn flow_schema_is_deploy_flow_schemas_file() {
    let printed = yaml(
        &args(
            "kube-leader rbac --strategy lease --lock kube-leader-demo --service-account \
             kube-leader-lease --elector-service-account kube-leader-lease-elector \
             --watch-own-pod --flow-schema",
        ),
        "default",
    );
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/flow-schema/flow-schema.yaml"
    );
    let file = std::fs::read_to_string(path).unwrap();
    // The object, from its apiVersion on; the header comments differ.
    let body = |s: &str| s[s.find("apiVersion:").unwrap()..].to_owned();
    assert_eq!(
        body(&file),
        body(&printed).replace(
            "\n  name: kube-leader-lease-elector-default\n",
            "\n  name: kube-leader-lease-elector\n"
        ),
        "deploy/flow-schema/flow-schema.yaml and `kube-leader rbac --flow-schema` disagree"
    );
    // Only the FlowSchema: the RBAC is printed without --flow-schema.
    assert_eq!(docs(&printed, "FlowSchema").len(), 1, "{printed}");
    assert!(!printed.contains("\n---\n"), "{printed}");
    for line in [
        "apiVersion: flowcontrol.apiserver.k8s.io/v1",
        "  name: kube-leader-lease-elector-default",
        "  priorityLevelConfiguration:\n    name: leader-election",
        "  matchingPrecedence: 200",
        "  distinguisherMethod:\n    type: ByUser",
        "        - kind: ServiceAccount\n          serviceAccount:\n            name: kube-leader-lease-elector\n            namespace: default",
    ] {
        assert!(printed.contains(line), "{line}: {printed}");
    }
}

/// The resources of the FlowSchema: the elector's Role's, but Events, by strategy and option.
#[test]
fn flow_schema_covers_the_election_requests_of_each_strategy() {
    let resources = |line: &str| {
        let y = yaml(&args(line), "ns");
        let lines: Vec<&str> = y.lines().collect();
        let rules: Vec<String> = lines
            .windows(4)
            .filter(|w| w[0].trim_start().starts_with("- apiGroups:"))
            .map(|w| format!("{} {} {}", w[0].trim(), w[1].trim(), w[2].trim()))
            .collect();
        assert!(lines.iter().all(|l| !l.contains("events")), "no Events: {y}");
        assert!(y.matches("namespaces: [\"*\"]").count() == rules.len(), "{y}");
        rules
    };
    let e = "--service-account app --elector-service-account e --flow-schema";
    assert_eq!(
        resources(&format!("kube-leader rbac --strategy for-life --lock l {e}")),
        [
            "- apiGroups: [\"\"] resources: [\"configmaps\"] verbs: [\"create\", \"get\", \"list\", \"watch\", \"update\", \"delete\"]",
            "- apiGroups: [\"\"] resources: [\"pods\"] verbs: [\"get\", \"list\", \"watch\", \"delete\"]",
            "- apiGroups: [\"coordination.k8s.io\"] resources: [\"leases\"] verbs: [\"create\", \"list\", \"watch\", \"patch\", \"delete\"]",
        ]
    );
    assert_eq!(
        resources(&format!("kube-leader rbac --strategy lease --lock l --successor any {e}")),
        ["- apiGroups: [\"coordination.k8s.io\"] resources: [\"leases\"] verbs: [\"create\", \"get\", \"list\", \"watch\", \"update\"]"]
    );
    let coordinated = resources(&format!(
        "kube-leader rbac --strategy lease --lock l --coordinated 1.37.0 {e}"
    ));
    assert!(
        coordinated.iter().any(|r| r.contains("[\"leasecandidates\"]")),
        "{coordinated:?}"
    );
    let labelled = resources(&format!(
        "kube-leader rbac --strategy lease --lock l --label-pod {e}"
    ));
    assert!(
        labelled
            .iter()
            .any(|r| r.contains("[\"pods\"] verbs: [\"patch\"]")),
        "{labelled:?}"
    );
    let shards = resources(&format!("kube-leader rbac --shards 3 --lock l {e}"));
    assert_eq!(shards.len(), 1, "{shards:?}");
    // Named after the elector and the namespace: cluster-scoped.
    let y = yaml(&args(&format!("kube-leader rbac --lock l {e}")), "team-a");
    assert!(y.contains("metadata:\n  name: e-team-a\n"), "{y}");
    assert!(y.contains("name: e\n            namespace: team-a"), "{y}");
}
