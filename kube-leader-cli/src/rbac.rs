//! `kube-leader rbac`: the least-privilege Role and RoleBinding for `run` with given options
//! (`--shards M`: for `run --shards M`).
//!
//! Every verb printed is one the code uses, and nothing else is needed; the end-to-end tests
//! bind the printed Role to a restricted user and run the election with it, and check that
//! `deploy/` holds the same rules.

use std::fmt::Write as _;

use crate::cli::{DeadLeaderPodArg, RbacArgs, StrategyArg, SuccessorArg};

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

/// The rules `run` needs for `lock` with `strategy` (and `--label-pod`), leader for life with
/// the default `--dead-leader-pod`.
pub(crate) fn rules(strategy: StrategyArg, lock: &str, label_pod: bool) -> Vec<Rule> {
    let mut rules = match strategy {
        StrategyArg::Lease => lease_rules(lock),
        StrategyArg::ForLife => for_life_rules(lock, DeadLeaderPodArg::DeleteEvicted),
    };
    with_registrations(strategy, &mut rules);
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

/// The rules of `run --shards count` for the set `set`, whose candidates are `identities`
/// (none: any).
pub(crate) fn shards_rules(set: &str, count: u32, identities: &[String]) -> Vec<Rule> {
    let shards: Vec<String> = (0..count).map(|i| format!("{set}-{i}")).collect();
    let mut rules = vec![
        Rule {
            why: "create: the shard Leases and each candidate's membership Lease (create cannot be \
                  limited by name)",
            api_group: "coordination.k8s.io",
            resource: "leases",
            resource_names: vec![],
            verbs: &["create"],
        },
        Rule {
            why: "list, watch: one list/watch of the set's Leases by their label \
                  kube-leader.io/shards (a label-selected list cannot be limited by name)",
            api_group: "coordination.k8s.io",
            resource: "leases",
            resource_names: vec![],
            verbs: &["list", "watch"],
        },
    ];
    if identities.is_empty() {
        rules.push(Rule {
            why: "get: re-reads after a conflict; update: take over, renew and release the shards, \
                  renew the membership Lease; delete: remove the membership Lease on shutdown. \
                  Every Lease of the namespace: the membership Leases are named after each \
                  candidate's identity (SET-member-<identity>-<hash>), unknown when the Role is \
                  written; pass --identity for each candidate (a StatefulSet's Pod names) to limit \
                  this to the set's own Leases",
            api_group: "coordination.k8s.io",
            resource: "leases",
            resource_names: vec![],
            verbs: &["get", "update", "delete"],
        });
        return rules;
    }
    rules.push(Rule {
        why: "the shard Leases: get (re-reads after a conflict); update: take over, renew and \
              release",
        api_group: "coordination.k8s.io",
        resource: "leases",
        resource_names: shards,
        verbs: &["get", "update"],
    });
    rules.push(Rule {
        why: "the membership Lease of each candidate: get (re-read after a conflict), update \
              (renew), delete (on shutdown)",
        api_group: "coordination.k8s.io",
        resource: "leases",
        resource_names: identities
            .iter()
            .map(|id| kube_leader::shards::member_lease_name(set, id))
            .collect(),
        verbs: &["get", "update", "delete"],
    });
    rules
}

/// The rules of the candidates' registrations (`--successor youngest`, the default): the Lease
/// strategy can create Leases already.
fn registration_rules(strategy: StrategyArg) -> Vec<Rule> {
    let (why, verbs): (_, &'static [&'static str]) = match strategy {
        StrategyArg::Lease => (
            "--successor youngest (the default): each candidate's registration, a Lease \
             LOCK-candidate-HASH beside the lock (created by the rule above); patch: its \
             heartbeat; delete: withdraw it when stopping; list, watch: a leader watches the \
             registrations for its term and, stepping down, names the youngest candidate, and every \
             candidate lists and watches the lock (by name). Namespace-wide: the names hold a hash \
             of each identity. `--successor any` needs none of it (the lock's rule then has list \
             and watch)",
            &["list", "watch", "patch", "delete"],
        ),
        StrategyArg::ForLife => (
            "--successor youngest (the default): each candidate's registration, a Lease \
             LOCK-candidate-HASH owned by its Pod; create, patch: register and heartbeat; delete: \
             withdraw it when stopping; list, watch: a leader watches the registrations for its \
             term and, stepping down, names the youngest candidate (without watch, it lists them \
             on the handover's path). Namespace-wide: the names hold a hash of each Pod's name. \
             `--successor any` needs none of it",
            &["create", "list", "watch", "patch", "delete"],
        ),
    };
    vec![Rule {
        why,
        api_group: "coordination.k8s.io",
        resource: "leases",
        resource_names: vec![],
        verbs,
    }]
}

/// Adds the rules of the candidates' registrations to `rules` (of `strategy`). The Lease's
/// namespace-wide `list` and `watch` then cover the lock's too: the lock's rule loses them.
fn with_registrations(strategy: StrategyArg, rules: &mut Vec<Rule>) {
    if strategy == StrategyArg::Lease {
        for rule in rules
            .iter_mut()
            .filter(|r| r.resource == "leases" && !r.resource_names.is_empty())
        {
            rule.verbs = &["get", "update"];
            rule.why = "get: status and re-reads after a conflict; update: take over, renew and \
                        release (the list and watch of the Lease by candidates and the leader: the \
                        rule below)";
        }
    }
    rules.extend(registration_rules(strategy));
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
/// The rules of leader for life with `--dead-leader-pod dead`: `keep` deletes no Pod.
fn for_life_rules(lock: &str, dead: DeadLeaderPodArg) -> Vec<Rule> {
    let pods = match dead {
        DeadLeaderPodArg::Keep => Rule {
            why: "get: the candidate's own Pod (its UID owns the lock) and the leader Pod; list, \
                  watch: waiting candidates watch the leader Pod (--dead-leader-pod keep: no \
                  delete)",
            api_group: "",
            resource: "pods",
            resource_names: vec![],
            verbs: &["get", "list", "watch"],
        },
        DeadLeaderPodArg::DeleteEvicted | DeadLeaderPodArg::DeleteTerminal => Rule {
            why: if dead == DeadLeaderPodArg::DeleteEvicted {
                "get: the candidate's own Pod (its UID owns the lock) and the leader Pod; list, \
                 watch: waiting candidates watch the leader Pod; delete: an evicted leader Pod \
                 (--dead-leader-pod delete-evicted; keep needs no delete)"
            } else {
                "get: the candidate's own Pod (its UID owns the lock) and the leader Pod; list, \
                 watch: waiting candidates watch the leader Pod; delete: a leader Pod in a \
                 terminal phase (--dead-leader-pod delete-terminal; keep needs no delete)"
            },
            api_group: "",
            resource: "pods",
            resource_names: vec![],
            verbs: &["get", "list", "watch", "delete"],
        },
    };
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
                  write the fencing token and the liveness heartbeat; delete: remove a stale lock (UID precondition) and \
                  step down",
            api_group: "",
            resource: "configmaps",
            resource_names: vec![lock.to_string()],
            verbs: &["get", "list", "watch", "update", "delete"],
        },
        pods,
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

/// What `kube-leader rbac` prints for: the Role's name, the command line, the `run` it serves
/// and the rules.
fn role_of(args: &RbacArgs, namespace: &str) -> (String, String, String, Vec<Rule>) {
    let strategy = args.lock.strategy;
    let lock = &args.lock.lock;
    let (name, mut command, mut run, mut rules) = base_role(args, namespace);
    if args.shards.is_none() {
        match args.successor {
            SuccessorArg::Youngest => with_registrations(strategy, &mut rules),
            SuccessorArg::Any => {
                command.push_str(" --successor any");
                run.push_str(" --successor any");
            }
        }
    }
    for id in &args.identities {
        command.push_str(&format!(" --identity {id}"));
    }
    if args.service_account != "default" {
        command.push_str(&format!(" --service-account {}", args.service_account));
    }
    if args.watch_own_pod && args.shards.is_none() && strategy == StrategyArg::Lease {
        command.push_str(" --watch-own-pod");
        run.push_str(" --watch-own-pod");
        rules.push(Rule {
            why: "--watch-own-pod: watch this candidate's own Pod, to stop at once when it is \
                  deleted rather than on the kubelet's SIGTERM a moment later (get, list, watch pods \
                  is namespace-wide: a Pod's name is not known when the Role is written)",
            api_group: "",
            resource: "pods",
            resource_names: vec![],
            verbs: &["get", "list", "watch"],
        });
    }
    if args.fence {
        command.push_str(" --fence");
        rules.push(Rule {
            why: "--fence: a fenced writer carries its fencing token by impersonating itself \
                  (Impersonate-User: its own ServiceAccount) with the user extra \
                  kube-leader.io/fencing-token, which the ClusterRole below allows",
            api_group: "",
            resource: "serviceaccounts",
            resource_names: vec![args.service_account.clone()],
            verbs: &["impersonate"],
        });
    }
    if args.label_pod {
        command.push_str(" --label-pod");
        rules.extend(
            self::rules(StrategyArg::Lease, lock, true)
                .into_iter()
                .filter(|r| r.resource == "pods"),
        );
    }
    (name, command, run, rules)
}

/// The Role of the election alone (shards, or a strategy): its name, command line, `run` and
/// rules, before the options that add to them.
fn base_role(args: &RbacArgs, namespace: &str) -> (String, String, String, Vec<Rule>) {
    let strategy = args.lock.strategy;
    let lock = &args.lock.lock;
    match args.shards {
        Some(m) => (
            format!("kube-leader-shards-{lock}"),
            format!("kube-leader rbac --shards {m} --lock {lock} --namespace {namespace}"),
            format!("kube-leader run --strategy lease --lock {lock} --shards {m}"),
            shards_rules(lock, m, &args.identities),
        ),
        None => {
            let dead = match args.dead_leader_pod {
                Some(p) => format!(" --dead-leader-pod {}", dead_leader_pod_str(p)),
                None => String::new(),
            };
            let strategy = strategy.as_str();
            (
                role_name(args.lock.strategy, lock),
                format!("kube-leader rbac --strategy {strategy} --lock {lock} --namespace {namespace}{dead}"),
                format!("kube-leader run --strategy {strategy} --lock {lock}{dead}"),
                match args.lock.strategy {
                    StrategyArg::ForLife => for_life_rules(
                        lock,
                        args.dead_leader_pod.unwrap_or(DeadLeaderPodArg::DeleteEvicted),
                    ),
                    StrategyArg::Lease => lease_rules(lock),
                },
            )
        }
    }
}

/// The YAML `kube-leader rbac` prints.
pub(crate) fn yaml(args: &RbacArgs, namespace: &str) -> String {
    let (name, command, run, rules) = role_of(args, namespace);
    let mut y = String::new();
    let _ = writeln!(y, "# Least privilege for `{run}`");
    let _ = writeln!(
        y,
        "# in namespace {namespace}, for ServiceAccount {}.",
        args.service_account
    );
    let _ = writeln!(y, "# Generated by `{command}`.");
    if args.service_account == "default" {
        let _ = writeln!(
            y,
            "# (default: the ServiceAccount every namespace has, of every Pod without \
             serviceAccountName.)"
        );
    } else {
        // The ServiceAccount it binds, so that the output is complete on its own.
        let _ = writeln!(y, "apiVersion: v1");
        let _ = writeln!(y, "kind: ServiceAccount");
        let _ = writeln!(
            y,
            "metadata:\n  name: {}\n  namespace: {namespace}",
            args.service_account
        );
        let _ = writeln!(y, "---");
    }
    let _ = writeln!(y, "apiVersion: rbac.authorization.k8s.io/v1");
    let _ = writeln!(y, "kind: Role");
    let _ = writeln!(y, "metadata:\n  name: {name}\n  namespace: {namespace}");
    let _ = writeln!(y, "rules:");
    for rule in rules {
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
    if args.fence {
        fence_cluster_role(&mut y, &args.service_account, namespace);
    }
    y
}

/// `--fence`: the ClusterRole (user extras are cluster-scoped) by which `service_account`
/// impersonates itself with a fencing token, and its binding.
fn fence_cluster_role(y: &mut String, service_account: &str, namespace: &str) {
    let name = format!("kube-leader-fence-writer-{namespace}-{service_account}");
    let _ = writeln!(y, "---");
    let _ = writeln!(y, "apiVersion: rbac.authorization.k8s.io/v1");
    let _ = writeln!(y, "kind: ClusterRole");
    let _ = writeln!(y, "metadata:\n  name: {name}");
    let _ = writeln!(y, "rules:");
    let _ = writeln!(
        y,
        "  # --fence: send the fencing token as the user extra kube-leader.io/fencing-token \
         (any value: the token changes with every term; impersonation extras cannot be \
         limited to a namespace)"
    );
    let _ = writeln!(y, "  - apiGroups: [\"authentication.k8s.io\"]");
    let _ = writeln!(
        y,
        "    resources: [\"userextras/{}\"]",
        kube_leader::fence::FENCING_TOKEN_EXTRA
    );
    let _ = writeln!(y, "    verbs: [\"impersonate\"]");
    let _ = writeln!(y, "---");
    let _ = writeln!(y, "apiVersion: rbac.authorization.k8s.io/v1");
    let _ = writeln!(y, "kind: ClusterRoleBinding");
    let _ = writeln!(y, "metadata:\n  name: {name}");
    let _ = writeln!(
        y,
        "roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: {name}"
    );
    let _ = writeln!(y, "subjects:");
    let _ = writeln!(
        y,
        "  - kind: ServiceAccount\n    name: {service_account}\n    namespace: {namespace}"
    );
}

fn quote(s: &str) -> String {
    format!("\"{s}\"")
}

/// The flag value of `p`.
fn dead_leader_pod_str(p: DeadLeaderPodArg) -> &'static str {
    match p {
        DeadLeaderPodArg::Keep => "keep",
        DeadLeaderPodArg::DeleteEvicted => "delete-evicted",
        DeadLeaderPodArg::DeleteTerminal => "delete-terminal",
    }
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
mod tests;
