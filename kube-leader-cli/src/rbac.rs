//! `kube-leader rbac`: the least-privilege Role and RoleBinding for `run` with given options.
//!
//! Every verb printed is one the code uses, and nothing else is needed; the end-to-end tests
//! bind the printed Role to a restricted user and run the election with it, and check that
//! `deploy/` holds the same rules.

use std::fmt::Write as _;

use crate::cli::{RbacArgs, StrategyArg};

/// One rule of the Role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rule {
    /// Why the rule is there (a YAML comment).
    pub(crate) why: &'static str,
    pub(crate) api_group: &'static str,
    pub(crate) resource: &'static str,
    pub(crate) resource_names: Vec<String>,
    pub(crate) verbs: &'static [&'static str],
}

/// The rules `run` needs for `lock` with `strategy` (and `--label-pod`).
pub(crate) fn rules(strategy: StrategyArg, lock: &str, label_pod: bool) -> Vec<Rule> {
    let mut rules = match strategy {
        StrategyArg::Lease => lease_rules(lock),
        StrategyArg::ForLife => for_life_rules(lock),
    };
    if label_pod {
        rules.push(Rule {
            why: "--label-pod: label this candidate's Pod kube-leader.io/leader=true|false. Beware: \
                  patch pods is namespace-wide (a Pod's name is not known when the Role is written), \
                  so it lets this ServiceAccount patch any Pod in the namespace: relabel it in or out \
                  of a Service, or change its container image and run code as that Pod. Grant it \
                  only where that is acceptable",
            api_group: "",
            resource: "pods",
            resource_names: vec![],
            verbs: &["patch"],
        });
    }
    rules
}

/// The rules of the Lease strategy.
fn lease_rules(lock: &str) -> Vec<Rule> {
    vec![
        Rule {
            why: "create: the first candidate creates the Lease (create cannot be limited by name)",
            api_group: "coordination.k8s.io",
            resource: "leases",
            resource_names: vec![],
            verbs: &["create"],
        },
        Rule {
            why: "get: status and re-reads after a conflict; list, watch: candidates and the leader \
                  watch the Lease; update: take over, renew and release",
            api_group: "coordination.k8s.io",
            resource: "leases",
            resource_names: vec![lock.to_string()],
            verbs: &["get", "list", "watch", "update"],
        },
        Rule {
            why: "best-effort LeaderElection Events on the Lease when a candidate becomes \
                  leader and stops leading (as client-go records them)",
            api_group: "",
            resource: "events",
            resource_names: vec![],
            verbs: &["create"],
        },
    ]
}

// The same rules as deploy/for-life/rbac-for-life.yaml, which explains each verb.
/// The rules of leader for life.
fn for_life_rules(lock: &str) -> Vec<Rule> {
    vec![
        Rule {
            why: "create: become leader (create cannot be limited by name)",
            api_group: "",
            resource: "configmaps",
            resource_names: vec![],
            verbs: &["create"],
        },
        Rule {
            why: "the lock only: get, list, watch it (by name, with a field selector); update: \
                  write the fencing token; delete: remove a stale lock (UID precondition) and \
                  step down",
            api_group: "",
            resource: "configmaps",
            resource_names: vec![lock.to_string()],
            verbs: &["get", "list", "watch", "update", "delete"],
        },
        Rule {
            why: "get: the candidate's own Pod (its UID owns the lock) and the leader Pod; list, \
                  watch: waiting candidates watch the leader Pod; delete: an evicted leader Pod",
            api_group: "",
            resource: "pods",
            resource_names: vec![],
            verbs: &["get", "list", "watch", "delete"],
        },
        Rule {
            why: "best-effort LeaderElection Events on the lock when a candidate becomes leader \
                  and stops leading (as client-go records them)",
            api_group: "",
            resource: "events",
            resource_names: vec![],
            verbs: &["create"],
        },
    ]
}

/// The Role's (and RoleBinding's) name.
pub(crate) fn role_name(strategy: StrategyArg, lock: &str) -> String {
    format!("kube-leader-{}-{lock}", strategy.as_str())
}

/// The YAML `kube-leader rbac` prints.
pub(crate) fn yaml(args: &RbacArgs, namespace: &str) -> String {
    let strategy = args.lock.strategy;
    let lock = &args.lock.lock;
    let name = role_name(strategy, lock);
    let mut y = String::new();
    let mut command = format!(
        "kube-leader rbac --strategy {} --lock {lock} --namespace {namespace}",
        strategy.as_str()
    );
    if args.service_account != "default" {
        command.push_str(&format!(" --service-account {}", args.service_account));
    }
    if args.label_pod {
        command.push_str(" --label-pod");
    }
    let _ = writeln!(
        y,
        "# Least privilege for `kube-leader run --strategy {} --lock {lock}`",
        strategy.as_str()
    );
    let _ = writeln!(
        y,
        "# in namespace {namespace}, for ServiceAccount {}.",
        args.service_account
    );
    let _ = writeln!(y, "# Generated by `{command}`.");
    let _ = writeln!(y, "apiVersion: rbac.authorization.k8s.io/v1");
    let _ = writeln!(y, "kind: Role");
    let _ = writeln!(y, "metadata:\n  name: {name}\n  namespace: {namespace}");
    let _ = writeln!(y, "rules:");
    for rule in rules(strategy, lock, args.label_pod) {
        let _ = writeln!(y, "  # {}", rule.why);
        let _ = writeln!(y, "  - apiGroups: [{}]", quote(rule.api_group));
        let _ = writeln!(y, "    resources: [{}]", quote(rule.resource));
        if !rule.resource_names.is_empty() {
            let names: Vec<_> = rule.resource_names.iter().map(|n| quote(n)).collect();
            let _ = writeln!(y, "    resourceNames: [{}]", names.join(", "));
        }
        let verbs: Vec<_> = rule.verbs.iter().map(|v| quote(v)).collect();
        let _ = writeln!(y, "    verbs: [{}]", verbs.join(", "));
    }
    let _ = writeln!(y, "---");
    let _ = writeln!(y, "apiVersion: rbac.authorization.k8s.io/v1");
    let _ = writeln!(y, "kind: RoleBinding");
    let _ = writeln!(y, "metadata:\n  name: {name}\n  namespace: {namespace}");
    let _ = writeln!(
        y,
        "roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: Role\n  name: {name}"
    );
    let _ = writeln!(y, "subjects:");
    let _ = writeln!(
        y,
        "  - kind: ServiceAccount\n    name: {}\n    namespace: {namespace}",
        args.service_account
    );
    y
}

fn quote(s: &str) -> String {
    format!("\"{s}\"")
}

/// `kube-leader rbac`: prints the YAML. The namespace comes from `--namespace`, else
/// `POD_NAMESPACE`, else the service-account file, else the kubeconfig context, else `default`;
/// no cluster is contacted.
pub(crate) fn rbac(args: &RbacArgs) -> u8 {
    let namespace = kube_leader::discovery::discover_namespace(args.lock.namespace.as_deref())
        .map(|(ns, _)| ns)
        .or_else(kubeconfig_namespace)
        .unwrap_or_else(|| "default".into());
    print!("{}", yaml(args, &namespace));
    0
}

/// The current kubeconfig context's namespace, read without contacting the cluster.
fn kubeconfig_namespace() -> Option<String> {
    let kubeconfig = kube::config::Kubeconfig::read().ok()?;
    let current = kubeconfig.current_context.as_deref()?;
    kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == current)
        .and_then(|c| c.context.as_ref())
        .and_then(|c| c.namespace.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

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
        assert!(
            y.contains("verbs: [\"get\", \"list\", \"watch\", \"update\"]"),
            "{y}"
        );
        assert!(y.contains("verbs: [\"create\"]"), "{y}");
        assert!(!y.contains("pods"), "{y}");
        assert!(!y.contains("delete"), "{y}");
        assert!(y.contains("namespace: ns1"), "{y}");
        // client-go's LeaderElection Events.
        assert!(
            y.contains("resources: [\"events\"]\n    verbs: [\"create\"]"),
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
    fn for_life_rules_include_events() {
        let y = yaml(&args("kube-leader rbac --lock l --service-account op"), "ns");
        assert!(
            y.contains("resources: [\"events\"]\n    verbs: [\"create\"]"),
            "{y}"
        );
        assert!(y.contains("name: op\n    namespace: ns"), "{y}");
        assert!(y.contains("--service-account op"), "{y}");
    }
}
