//! The fence rules file: which objects are fenced, by which lock, against which writers; and
//! the checks that keep a fail-closed webhook away from what the control plane itself needs.
//!
//! ```yaml
//! rules:
//!   - name: orders                       # a DNS label: names the webhooks and their paths
//!     resources:                         # namespaced resources, no wildcards
//!       - { apiGroup: "apps", resource: "deployments" }
//!       - { apiGroup: "", resource: "configmaps" }
//!     namespaceSelector:                 # required: which namespaces (never kube-system)
//!       matchLabels: { fence.example.com/orders: "true" }
//!     objectSelector:                    # optional; required for configmaps
//!       matchLabels: { app: orders }
//!     lock: { namespace: app, name: orders-leader, strategy: lease }   # or for-life
//!     # or, for a sharded controller: the shard named by the object's label
//!     # shards: { namespace: app, set: work, label: example.com/shard }
//!     writers: ["system:serviceaccount:app:orders"]
//! ```

use std::{collections::BTreeMap, path::Path};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube_leader::Strategy;
use serde::Deserialize;

/// The namespace a fence never covers.
pub(crate) const KUBE_SYSTEM: &str = "kube-system";
/// The label Kubernetes 1.21 and later put on every namespace, with its name.
pub(crate) const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// The label every kube-leader lock carries (`app.kubernetes.io/managed-by=kube-leader`).
pub(crate) const MANAGED_BY_LABEL: &str = kube_leader::internal::labels::MANAGED_BY_LABEL;

/// The rules file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FenceConfig {
    /// The rules; each becomes one mutating and one validating webhook.
    pub(crate) rules: Vec<Rule>,
}

/// One fence rule.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Rule {
    /// A DNS label, unique in the file.
    pub(crate) name: String,
    /// The fenced resources.
    pub(crate) resources: Vec<ResourceRef>,
    /// Which namespaces.
    #[serde(default)]
    pub(crate) namespace_selector: Option<LabelSelector>,
    /// Which objects.
    #[serde(default)]
    pub(crate) object_selector: Option<LabelSelector>,
    /// The lock that guards the objects (or `shards`).
    #[serde(default)]
    pub(crate) lock: Option<LockSpec>,
    /// The shard set that guards the objects, each by the shard its label names.
    #[serde(default)]
    pub(crate) shards: Option<ShardSpec>,
    /// The fenced writers' user names.
    pub(crate) writers: Vec<String>,
}

/// A resource, as in a webhook rule (every version).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ResourceRef {
    /// The API group; `""` is the core group.
    #[serde(default)]
    pub(crate) api_group: String,
    /// The plural resource name.
    pub(crate) resource: String,
}

/// A lock.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LockSpec {
    /// Its namespace.
    pub(crate) namespace: String,
    /// Its name.
    pub(crate) name: String,
    /// Its strategy (`lease`, `for-life`).
    #[serde(deserialize_with = "strategy")]
    pub(crate) strategy: Strategy,
}

/// A strategy by its name (`lease`, `for-life`).
fn strategy<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Strategy, D::Error> {
    use kube_leader::internal::{strategy_named, STRATEGY_NAMES};
    let name = String::deserialize(d)?;
    strategy_named(&name).ok_or_else(|| serde::de::Error::unknown_variant(&name, &STRATEGY_NAMES))
}

/// A shard set: the object's shard is `<set>-<value of label>`, a Lease.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ShardSpec {
    /// The namespace of the shard Leases.
    pub(crate) namespace: String,
    /// The set's name (the shard Leases are `<set>-0` .. `<set>-<M-1>`).
    pub(crate) set: String,
    /// The label of a fenced object that holds its shard's index.
    pub(crate) label: String,
}

/// Which lock guards an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Guard<'a> {
    /// One lock for every object of the rule.
    Lock(&'a LockSpec),
    /// The shard named by the object's label.
    Shards(&'a ShardSpec),
}

// === impl FenceConfig ===

impl FenceConfig {
    /// Reads and checks the rules file at `path` (YAML or JSON).
    pub(crate) fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the fence rules {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("fence rules {}: {e}", path.display()))
    }

    /// Parses and checks rules.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let config: FenceConfig = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
        config.validate()?;
        Ok(config)
    }

    /// The rule named `name`.
    pub(crate) fn rule(&self, name: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| r.name == name)
    }

    /// Refuses rules a fail-closed webhook must not have (see docs/fence.md, "What a rule may
    /// cover").
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.rules.is_empty() {
            return Err("no rules: give at least one under `rules:`".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        for rule in &self.rules {
            if !seen.insert(rule.name.as_str()) {
                return Err(format!("two rules are named {:?}", rule.name));
            }
            rule.validate()
                .map_err(|e| format!("rule {:?}: {e}", rule.name))?;
        }
        Ok(())
    }
}

// === impl Rule ===

impl Rule {
    /// Which lock guards this rule's objects: `None` only for a rule that was not validated
    /// (every rule read from a file is).
    pub(crate) fn guard(&self) -> Option<Guard<'_>> {
        match (&self.lock, &self.shards) {
            (Some(lock), _) => Some(Guard::Lock(lock)),
            (None, Some(shards)) => Some(Guard::Shards(shards)),
            (None, None) => None,
        }
    }

    fn validate(&self) -> Result<(), String> {
        if !is_dns_label(&self.name) {
            return Err(
                "the name must be a DNS label (lower-case alphanumerics and '-', at most \
                        63 characters)"
                    .into(),
            );
        }
        match (&self.lock, &self.shards) {
            (Some(_), Some(_)) => return Err("give `lock` or `shards`, not both".into()),
            (None, None) => {
                return Err("no guard: give the `lock` (namespace, name, strategy) or the \
                            `shards` (namespace, set, label) whose token fences the objects"
                    .into())
            }
            (Some(lock), None) => {
                check_name("lock.namespace", &lock.namespace)?;
                kube_leader::internal::validate_name(&lock.name).map_err(|e| format!("lock.name: {e}"))?;
            }
            (None, Some(shards)) => {
                check_name("shards.namespace", &shards.namespace)?;
                kube_leader::internal::validate_name(&shards.set).map_err(|e| format!("shards.set: {e}"))?;
                if shards.label.is_empty() {
                    return Err("shards.label: name the label that holds an object's shard".into());
                }
            }
        }
        if self.writers.is_empty() || self.writers.iter().any(|w| w.trim().is_empty()) {
            return Err("writers: name at least one fenced writer (a user name, as in \
                        system:serviceaccount:NAMESPACE:NAME); empty names are not allowed"
                .into());
        }
        if self.resources.is_empty() {
            return Err("resources: name at least one resource".into());
        }
        for r in &self.resources {
            r.validate(self.object_selector.as_ref())?;
        }
        self.validate_namespaces()
    }

    /// A fence needs an explicit choice of namespaces, none of which may be kube-system.
    fn validate_namespaces(&self) -> Result<(), String> {
        let Some(selector) = self.namespace_selector.as_ref().filter(|s| !is_empty(s)) else {
            return Err(
                "namespaceSelector: required and not empty: a rule over every namespace \
                        would cover kube-system (label the fenced namespaces, e.g. \
                        `kubectl label namespace app fence.example.com/orders=true`)"
                    .into(),
            );
        };
        let names_kube_system = selector
            .match_labels
            .iter()
            .flatten()
            .any(|(_, v)| v == KUBE_SYSTEM)
            || selector
                .match_expressions
                .iter()
                .flatten()
                .any(|e| e.operator == "In" && e.values.iter().flatten().any(|v| v == KUBE_SYSTEM));
        if names_kube_system {
            return Err(
                "namespaceSelector: selects kube-system, which a fence never covers (a \
                        fail-closed webhook there can stop the control plane)"
                    .into(),
            );
        }
        Ok(())
    }

    /// The namespace selector of the webhooks: the rule's, and never kube-system (on 1.21 and
    /// later, where namespaces carry their name as a label; on 1.20 the rule's own label keeps
    /// kube-system out, and the server passes kube-system untouched).
    pub(crate) fn webhook_namespace_selector(&self) -> LabelSelector {
        let mut s = self.namespace_selector.clone().unwrap_or_default();
        s.match_expressions
            .get_or_insert_with(Vec::new)
            .push(LabelSelectorRequirement {
                key: NAMESPACE_NAME_LABEL.into(),
                operator: "NotIn".into(),
                values: Some(vec![KUBE_SYSTEM.into()]),
            });
        s
    }

    /// The object selector of the webhooks: the rule's, and never a kube-leader lock.
    pub(crate) fn webhook_object_selector(&self) -> LabelSelector {
        let mut s = self.object_selector.clone().unwrap_or_default();
        s.match_expressions
            .get_or_insert_with(Vec::new)
            .push(LabelSelectorRequirement {
                key: MANAGED_BY_LABEL.into(),
                operator: "NotIn".into(),
                values: Some(vec!["kube-leader".into()]),
            });
        s
    }

    /// Whether `user` is one of this rule's fenced writers.
    pub(crate) fn fences(&self, user: &str) -> bool {
        self.writers.iter().any(|w| w == user)
    }
}

// === impl ResourceRef ===

impl ResourceRef {
    fn validate(&self, object_selector: Option<&LabelSelector>) -> Result<(), String> {
        let what = format!("resource {:?} of group {:?}", self.resource, self.api_group);
        if self.api_group.contains('*') || self.resource.contains('*') {
            return Err(format!(
                "{what}: wildcards could cover Leases and the locks themselves; name each resource"
            ));
        }
        if self.resource.is_empty() || self.resource.contains('/') {
            return Err(format!(
                "{what}: name a resource (plural, as in `deployments`), without a subresource"
            ));
        }
        if self.resource == "leases" {
            return Err(format!(
                "{what}: Leases are never fenced: leader election (kube-leader's, client-go's, the \
                 control plane's own) writes them, and a fail-closed webhook over them can stop it"
            ));
        }
        if self.api_group.is_empty()
            && [
                "namespaces",
                "events",
                "pods/eviction",
                "serviceaccounts",
                "nodes",
            ]
            .contains(&self.resource.as_str())
        {
            return Err(format!(
                "{what}: the control plane writes these itself; a fence over them can block it"
            ));
        }
        if self.api_group.is_empty() && self.resource == "configmaps" {
            let selected = object_selector.is_some_and(|s| !is_empty(s));
            if !selected {
                return Err(format!(
                    "{what}: ConfigMaps are used as locks (leader for life, client-go's old \
                     ConfigMap locks): give an objectSelector that selects only the fenced ones \
                     (kube-leader's own locks, labelled {MANAGED_BY_LABEL}=kube-leader, are always \
                     left out)"
                ));
            }
        }
        Ok(())
    }
}

/// Whether `selector` selects everything.
fn is_empty(selector: &LabelSelector) -> bool {
    selector.match_labels.as_ref().is_none_or(BTreeMap::is_empty)
        && selector.match_expressions.as_ref().is_none_or(Vec::is_empty)
}

fn check_name(field: &str, name: &str) -> Result<(), String> {
    if is_dns_label(name) {
        Ok(())
    } else {
        Err(format!("{field}: {name:?} is not a namespace name (a DNS label)"))
    }
}

/// A DNS-1123 label.
pub(crate) fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
rules:
  - name: orders
    resources:
      - { apiGroup: "", resource: configmaps }
      - { apiGroup: apps, resource: deployments }
    namespaceSelector: { matchLabels: { fence: orders } }
    objectSelector: { matchLabels: { app: orders } }
    lock: { namespace: app, name: orders-leader, strategy: lease }
    writers: ["system:serviceaccount:app:orders"]
"#;

    fn refused(yaml: &str) -> String {
        FenceConfig::parse(yaml).unwrap_err()
    }

    #[test]
    fn a_good_rule_parses() {
        let c = FenceConfig::parse(GOOD).unwrap();
        let r = c.rule("orders").unwrap();
        assert!(r.fences("system:serviceaccount:app:orders"));
        assert!(!r.fences("system:serviceaccount:kube-system:generic-garbage-collector"));
        assert!(matches!(r.guard(), Some(Guard::Lock(l)) if l.strategy == Strategy::Lease));
        let ns = r.webhook_namespace_selector();
        let e = &ns.match_expressions.unwrap()[0];
        assert_eq!(
            (e.key.as_str(), e.operator.as_str()),
            (NAMESPACE_NAME_LABEL, "NotIn")
        );
        let os = r.webhook_object_selector();
        assert_eq!(os.match_labels.unwrap()["app"], "orders");
        assert_eq!(os.match_expressions.unwrap()[0].key, MANAGED_BY_LABEL);
    }

    #[test]
    fn leases_are_refused() {
        let e = refused(&GOOD.replace("resource: configmaps", "resource: leases"));
        assert!(
            e.contains("Leases are never fenced") && e.contains("rule \"orders\""),
            "{e}"
        );
    }

    #[test]
    fn wildcards_are_refused() {
        let e = refused(&GOOD.replace("resource: deployments", "resource: \"*\""));
        assert!(e.contains("wildcards"), "{e}");
        let e = refused(&GOOD.replace("apiGroup: apps", "apiGroup: \"*\""));
        assert!(e.contains("wildcards"), "{e}");
    }

    #[test]
    fn config_maps_need_an_object_selector() {
        let e = refused(&GOOD.replace("    objectSelector: { matchLabels: { app: orders } }\n", ""));
        assert!(e.contains("ConfigMaps are used as locks"), "{e}");
    }

    #[test]
    fn kube_system_and_all_namespaces_are_refused() {
        let e = refused(&GOOD.replace(
            "{ fence: orders }",
            "{ kubernetes.io/metadata.name: kube-system }",
        ));
        assert!(e.contains("kube-system"), "{e}");
        let e = refused(&GOOD.replace("    namespaceSelector: { matchLabels: { fence: orders } }\n", ""));
        assert!(e.contains("namespaceSelector: required"), "{e}");
        let e = refused(&GOOD.replace(
            "{ matchLabels: { fence: orders } }",
            "{ matchExpressions: [{ key: kubernetes.io/metadata.name, operator: In, values: [app, kube-system] }] }",
        ));
        assert!(e.contains("kube-system"), "{e}");
    }

    #[test]
    fn a_rule_needs_one_guard_and_writers() {
        let e = refused(&GOOD.replace(
            "lock: { namespace: app, name: orders-leader, strategy: lease }",
            "writers2: []",
        ));
        assert!(e.contains("unknown field") || e.contains("writers2"), "{e}");
        let e = refused(&GOOD.replace(
            "    lock: { namespace: app, name: orders-leader, strategy: lease }\n",
            "",
        ));
        assert!(e.contains("no guard"), "{e}");
        let e = refused(&GOOD.replace("[\"system:serviceaccount:app:orders\"]", "[]"));
        assert!(e.contains("writers"), "{e}");
        let shards = GOOD.replace(
            "lock: { namespace: app, name: orders-leader, strategy: lease }",
            "shards: { namespace: app, set: work, label: example.com/shard }",
        );
        let c = FenceConfig::parse(&shards).unwrap();
        assert!(matches!(c.rules[0].guard(), Some(Guard::Shards(s)) if s.set == "work"));
    }

    #[test]
    fn control_plane_resources_are_refused() {
        for r in ["namespaces", "events", "nodes"] {
            let e = refused(&GOOD.replace("resource: configmaps", &format!("resource: {r}")));
            assert!(e.contains("control plane"), "{r}: {e}");
        }
    }
}
