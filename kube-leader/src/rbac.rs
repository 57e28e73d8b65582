//! Least privilege: the rules of the Role a candidate needs, each with why it is there.
//!
//! [`ElectorOptions::role_rules`](crate::options::ElectorOptions::role_rules) gives a
//! candidate's, [`shards_rules`] a shard set's. Every verb is one the code uses, and nothing
//! else is needed: the end-to-end tests bind these rules to a restricted user and run the
//! elections with it (the `kube-leader rbac` command prints them as YAML, and `deploy/` holds
//! the same rules).

use crate::{for_life::DeadLeaderPod, leadership::Strategy, shards::member_lease_name};

/// One rule of a Role, in the lock's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PolicyRule {
    /// Why the rule is there (a YAML comment where printed).
    pub why: &'static str,
    /// The API group (`""`: the core group).
    pub api_group: &'static str,
    /// The resource (plural).
    pub resource: &'static str,
    /// The objects it is limited to (empty: every object of the resource in the namespace).
    pub resource_names: Vec<String>,
    /// The verbs.
    pub verbs: &'static [&'static str],
}

// === impl PolicyRule ===

impl PolicyRule {
    /// A rule on every object of `resource` in the namespace.
    pub fn new(
        why: &'static str,
        api_group: &'static str,
        resource: &'static str,
        verbs: &'static [&'static str],
    ) -> Self {
        Self {
            why,
            api_group,
            resource,
            resource_names: vec![],
            verbs,
        }
    }

    /// Whether this rule grants every one of `verbs` on every object of `resource` in `api_group`.
    pub fn grants(&self, api_group: &str, resource: &str, verbs: &[&str]) -> bool {
        self.api_group == api_group
            && self.resource == resource
            && self.resource_names.is_empty()
            && verbs.iter().all(|v| self.verbs.contains(v))
    }
}

/// The rules of a [shard set](crate::Shards) `set` of `count` Leases (`run --shards count`),
/// whose candidates are `identities` (none: any; their membership Leases are then not known by
/// name, and the rule covers every Lease of the namespace).
pub fn shards_rules(set: &str, count: u32, identities: &[String]) -> Vec<PolicyRule> {
    let shards: Vec<String> = (0..count).map(|i| format!("{set}-{i}")).collect();
    let mut rules = vec![
        PolicyRule {
            why: "create: the shard Leases and each candidate's membership Lease (create cannot be \
                  limited by name)",
            api_group: "coordination.k8s.io",
            resource: "leases",
            resource_names: vec![],
            verbs: &["create"],
        },
        PolicyRule {
            why: "list, watch: one list/watch of the set's Leases by their label \
                  kube-leader.io/shards (a label-selected list cannot be limited by name)",
            api_group: "coordination.k8s.io",
            resource: "leases",
            resource_names: vec![],
            verbs: &["list", "watch"],
        },
    ];
    if identities.is_empty() {
        rules.push(PolicyRule {
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
    rules.push(PolicyRule {
        why: "the shard Leases: get (re-reads after a conflict); update: take over, renew and \
              release",
        api_group: "coordination.k8s.io",
        resource: "leases",
        resource_names: shards,
        verbs: &["get", "update"],
    });
    rules.push(PolicyRule {
        why: "the membership Lease of each candidate: get (re-read after a conflict), update \
              (renew), delete (on shutdown)",
        api_group: "coordination.k8s.io",
        resource: "leases",
        resource_names: identities.iter().map(|id| member_lease_name(set, id)).collect(),
        verbs: &["get", "update", "delete"],
    });
    rules
}

/// The rules of the candidates' registrations (`--successor youngest`, the default): the Lease
/// strategy can create Leases already.
fn registration_rules(strategy: Strategy) -> Vec<PolicyRule> {
    let (why, verbs): (_, &'static [&'static str]) = match strategy {
        Strategy::Lease => (
            "--successor youngest (the default): each candidate's registration, a Lease \
             LOCK-candidate-HASH beside the lock (created by the rule above); patch: its \
             heartbeat; delete: withdraw it when stopping; list, watch: a leader watches the \
             registrations for its term and, stepping down, names the youngest candidate, and every \
             candidate lists and watches the lock (by name). Namespace-wide: the names hold a hash \
             of each identity. `--successor any` needs none of it (the lock's rule then has list \
             and watch)",
            &["list", "watch", "patch", "delete"],
        ),
        Strategy::ForLife => (
            "--successor youngest (the default): each candidate's registration, a Lease \
             LOCK-candidate-HASH owned by its Pod; create, patch: register and heartbeat; delete: \
             withdraw it when stopping; list, watch: a leader watches the registrations for its \
             term and, stepping down, names the youngest candidate (without watch, it lists them \
             on the handover's path). Namespace-wide: the names hold a hash of each Pod's name. \
             `--successor any` needs none of it",
            &["create", "list", "watch", "patch", "delete"],
        ),
    };
    vec![PolicyRule {
        why,
        api_group: "coordination.k8s.io",
        resource: "leases",
        resource_names: vec![],
        verbs,
    }]
}

/// Adds the rules of the candidates' registrations to `rules` (of `strategy`). The Lease's
/// namespace-wide `list` and `watch` then cover the lock's too: the lock's rule loses them.
pub fn with_registrations(strategy: Strategy, rules: &mut Vec<PolicyRule>) {
    if strategy == Strategy::Lease {
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

/// What a coordinated candidate adds ([`LeaseConfig::coordinated`](crate::LeaseConfig)): its
/// `LeaseCandidate`, named after its identity (so the name is not known when the Role is
/// written).
pub fn coordinated_rules() -> Vec<PolicyRule> {
    vec![PolicyRule {
        why: "a coordinated candidate's LeaseCandidate: create it, watch it for the controller's \
              pings (get, list, watch), answer them and renew it (patch), delete it when stopping",
        api_group: "coordination.k8s.io",
        resource: "leasecandidates",
        resource_names: vec![],
        verbs: &["create", "get", "list", "watch", "patch", "delete"],
    }]
}

/// The rules of the Lease strategy.
pub fn lease_rules(lock: &str) -> Vec<PolicyRule> {
    vec![
        PolicyRule {
            why: "create: the first candidate creates the Lease (create cannot be limited by name)",
            api_group: "coordination.k8s.io",
            resource: "leases",
            resource_names: vec![],
            verbs: &["create"],
        },
        PolicyRule {
            why: "get: status and re-reads after a conflict; list, watch: candidates and the leader \
                  watch the Lease; update: take over, renew and release",
            api_group: "coordination.k8s.io",
            resource: "leases",
            resource_names: vec![lock.to_string()],
            verbs: &["get", "list", "watch", "update"],
        },
        PolicyRule {
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
pub fn for_life_rules(lock: &str, dead: DeadLeaderPod) -> Vec<PolicyRule> {
    let pods = match dead {
        DeadLeaderPod::Keep => PolicyRule {
            why: "get: the candidate's own Pod (its UID owns the lock) and the leader Pod; list, \
                  watch: waiting candidates watch the leader Pod (--dead-leader-pod keep: no \
                  delete)",
            api_group: "",
            resource: "pods",
            resource_names: vec![],
            verbs: &["get", "list", "watch"],
        },
        DeadLeaderPod::DeleteEvicted | DeadLeaderPod::DeleteTerminal => PolicyRule {
            why: if dead == DeadLeaderPod::DeleteEvicted {
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
        PolicyRule {
            why: "create: become leader (create cannot be limited by name)",
            api_group: "",
            resource: "configmaps",
            resource_names: vec![],
            verbs: &["create"],
        },
        PolicyRule {
            why: "the lock only: get, list, watch it (by name, with a field selector); update: \
                  write the fencing token and the liveness heartbeat; delete: remove a stale lock (UID precondition) and \
                  step down",
            api_group: "",
            resource: "configmaps",
            resource_names: vec![lock.to_string()],
            verbs: &["get", "list", "watch", "update", "delete"],
        },
        pods,
        PolicyRule {
            why: "best-effort LeaderElection Events on the lock when a candidate becomes leader \
                  and stops leading (as client-go records them)",
            api_group: "",
            resource: "events",
            resource_names: vec![],
            verbs: &["create"],
        },
    ]
}
