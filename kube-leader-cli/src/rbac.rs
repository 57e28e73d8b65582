//! `kube-leader rbac`: the least-privilege Role and RoleBinding for `run` with given options
//! (`--shards M`: for `run --shards M`); with `--flow-schema`, the FlowSchema of its elector
//! ([`flow_schema`]).
//!
//! Every verb printed is one the code uses, and nothing else is needed; the end-to-end tests
//! bind the printed Role to a restricted user and run the election with it, and check that
//! `deploy/` holds the same rules.

use std::fmt::Write as _;

use kube_leader::{internal::rbac::PolicyRule, Strategy};

use crate::candidate::Candidate;

use crate::cli::{DeadLeaderPodArg, RbacArgs, SuccessorArg};

/// The rule `--label-pod` adds: patch pods.
fn label_pod_rule() -> PolicyRule {
    PolicyRule::new(
        "--label-pod: label this candidate's Pod kube-leader.io/leader=true|false. Beware: \
         patch pods is namespace-wide (a Pod's name is not known when the Role is written), \
         so it lets this ServiceAccount patch any Pod in the namespace: relabel it in or out \
         of a Service, or change its container image and run code as that Pod. Grant it \
         only where that is acceptable",
        "",
        "pods",
        &["patch"],
    )
}

/// The rule `--watch-own-pod` adds where the strategy's own rules do not grant it already
/// (a strategy that watches its own Pod has them).
fn watch_own_pod_rule() -> PolicyRule {
    PolicyRule::new(
        "--watch-own-pod: watch this candidate's own Pod, to stop at once when it is \
         deleted rather than on the kubelet's SIGTERM a moment later (get, list, watch pods \
         is namespace-wide: a Pod's name is not known when the Role is written)",
        "",
        "pods",
        &["get", "list", "watch"],
    )
}

/// The Role's (and RoleBinding's) name.
pub(crate) fn role_name(strategy: Strategy, lock: &str) -> String {
    format!("kube-leader-{strategy}-{lock}")
}

/// What `kube-leader rbac` prints, before it is written out.
struct Printed {
    /// The election's Role and RoleBinding.
    name: String,
    /// The `kube-leader rbac` command line.
    command: String,
    /// The `kube-leader run` it is for.
    run: String,
    /// The rules of kube-leader's own requests: bound to `--elector-service-account` where
    /// given, else to `--service-account`.
    rules: Vec<PolicyRule>,
    /// With an elector, the rules of `--service-account` (the Pod's, COMMAND's): impersonate
    /// the elector, and `--fence`'s impersonation of itself.
    own_rules: Vec<PolicyRule>,
}

/// What `kube-leader rbac` prints for `args` in `namespace`.
fn role_of(args: &RbacArgs, namespace: &str) -> Printed {
    let (name, mut command, mut run, mut rules) = base_role(args, namespace);
    let mut own_rules = Vec::new();
    if args.shards.is_none() && args.successor == SuccessorArg::Any {
        command.push_str(" --successor any");
        run.push_str(" --successor any");
    }
    for id in &args.identities {
        command.push_str(&format!(" --identity {id}"));
    }
    if args.service_account != "default" {
        command.push_str(&format!(" --service-account {}", args.service_account));
    }
    if let Some(elector) = &args.elector_service_account {
        command.push_str(&format!(" --elector-service-account {elector}"));
        run.push_str(&format!(" --elector-service-account {elector}"));
        own_rules.push(elector_rule(elector));
    }
    let pods_watched = rules
        .iter()
        .any(|r| r.grants("", "pods", &["get", "list", "watch"]));
    if args.watch_own_pod && args.shards.is_none() && !pods_watched {
        command.push_str(" --watch-own-pod");
        run.push_str(" --watch-own-pod");
        rules.push(watch_own_pod_rule());
    }
    if args.fence {
        command.push_str(" --fence");
        let mut rule = PolicyRule::new(
            "--fence: a fenced writer carries its fencing token by impersonating itself \
             (Impersonate-User: its own ServiceAccount) with the user extra \
             kube-leader.io/fencing-token, which the ClusterRole below allows",
            "",
            "serviceaccounts",
            &["impersonate"],
        );
        rule.resource_names = vec![args.service_account.clone()];
        // COMMAND's fenced requests go as the Pod's ServiceAccount, never as the elector.
        match args.elector_service_account {
            Some(_) => own_rules.push(rule),
            None => rules.push(rule),
        }
    }
    if args.label_pod {
        command.push_str(" --label-pod");
        rules.push(label_pod_rule());
    }
    Printed {
        name,
        command,
        run,
        rules,
        own_rules,
    }
}

/// The rule by which the Pod's ServiceAccount makes kube-leader's requests as `elector`.
fn elector_rule(elector: &str) -> PolicyRule {
    let mut rule = PolicyRule::new(
        "--elector-service-account: kube-leader makes its own requests as that ServiceAccount \
         (Impersonate-User), so that a FlowSchema (`kube-leader rbac --flow-schema`) can send \
         them to the leader-election priority level while COMMAND's, as this ServiceAccount, \
         stay where they were. By name: that ServiceAccount only",
        "",
        "serviceaccounts",
        &["impersonate"],
    );
    rule.resource_names = vec![elector.to_owned()];
    rule
}

/// The Role of the election alone (shards, or a strategy): its name, command line, `run` and
/// rules (the library's), before the options that add to them.
fn base_role(args: &RbacArgs, namespace: &str) -> (String, String, String, Vec<PolicyRule>) {
    let lock = &args.lock.lock;
    let options: Candidate = args.options();
    match args.shards {
        Some(m) => (
            format!("kube-leader-shards-{lock}"),
            format!("kube-leader rbac --shards {m} --lock {lock} --namespace {namespace}"),
            format!(
                "kube-leader run --strategy {} --lock {lock} --shards {m}",
                options.strategy
            ),
            kube_leader::internal::rbac::shards_rules(lock, m, &args.identities),
        ),
        None => {
            let dead = match args.dead_leader_pod {
                Some(p) => format!(" --dead-leader-pod {}", dead_leader_pod_str(p)),
                None => String::new(),
            };
            let strategy = options.strategy;
            (
                role_name(strategy, lock),
                format!("kube-leader rbac --strategy {strategy} --lock {lock} --namespace {namespace}{dead}"),
                format!("kube-leader run --strategy {strategy} --lock {lock}{dead}"),
                options.role_rules(),
            )
        }
    }
}

/// The YAML `kube-leader rbac` prints (with `--flow-schema`: the FlowSchema).
pub(crate) fn yaml(args: &RbacArgs, namespace: &str) -> String {
    let printed = role_of(args, namespace);
    let sa = &args.service_account;
    if let (true, Some(elector)) = (args.flow_schema, &args.elector_service_account) {
        let command = format!("{} --flow-schema", printed.command);
        return flow_schema::yaml(namespace, elector, sa, &command, &printed.run, &printed.rules);
    }
    let mut y = String::new();
    let _ = writeln!(y, "# Least privilege for `{}`", printed.run);
    let _ = writeln!(y, "# in namespace {namespace}, for ServiceAccount {sa}.");
    let _ = writeln!(y, "# Generated by `{}`.", printed.command);
    if let Some(elector) = &args.elector_service_account {
        let _ = writeln!(
            y,
            "# kube-leader's own requests go as ServiceAccount {elector}, which {sa} impersonates:\n\
             # the election's Role is bound to {elector}; {sa}, whose requests are COMMAND's, may\n\
             # impersonate {elector} and nothing more of it."
        );
    }
    if sa == "default" {
        let _ = writeln!(
            y,
            "# (default: the ServiceAccount every namespace has, of every Pod without \
             serviceAccountName.)"
        );
    } else {
        // The ServiceAccount it binds, so that the output is complete on its own.
        service_account(&mut y, sa, namespace, true);
    }
    if let Some(elector) = &args.elector_service_account {
        service_account(&mut y, elector, namespace, false);
    }
    let bound = args.elector_service_account.as_ref().unwrap_or(sa);
    role(&mut y, &printed.name, namespace, &printed.rules, bound);
    if !printed.own_rules.is_empty() {
        let _ = writeln!(y, "---");
        role(
            &mut y,
            &format!("{}-impersonate", printed.name),
            namespace,
            &printed.own_rules,
            sa,
        );
    }
    if args.fence {
        fence_cluster_role(&mut y, sa, namespace);
    }
    y
}

/// A ServiceAccount and `---`; one that only kube-leader impersonates mounts no token in Pods.
fn service_account(y: &mut String, name: &str, namespace: &str, mounted: bool) {
    let _ = writeln!(y, "apiVersion: v1");
    let _ = writeln!(y, "kind: ServiceAccount");
    let _ = writeln!(y, "metadata:\n  name: {name}\n  namespace: {namespace}");
    if !mounted {
        let _ = writeln!(
            y,
            "# Impersonated by kube-leader, never a Pod's: no token is mounted into a Pod that names it."
        );
        let _ = writeln!(y, "automountServiceAccountToken: false");
    }
    let _ = writeln!(y, "---");
}

/// A Role of `rules` and its RoleBinding to ServiceAccount `subject`.
fn role(y: &mut String, name: &str, namespace: &str, rules: &[PolicyRule], subject: &str) {
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
        "  - kind: ServiceAccount\n    name: {subject}\n    namespace: {namespace}"
    );
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
        kube_leader::internal::fence::FENCING_TOKEN_EXTRA
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

pub(super) fn quote(s: &str) -> String {
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
    let namespace = kube_leader::internal::discovery::discover_namespace(args.lock.namespace.as_deref())
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

mod flow_schema;
#[cfg(test)]
mod tests;
