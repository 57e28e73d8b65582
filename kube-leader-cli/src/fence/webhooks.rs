//! The MutatingWebhookConfiguration and ValidatingWebhookConfiguration of a fence's rules
//! (admissionregistration.k8s.io/v1, Kubernetes 1.16 and later): one webhook of each per rule,
//! `failurePolicy: Fail` (a fence that cannot answer refuses), `sideEffects: None`.

use k8s_openapi::{
    api::admissionregistration::v1::{
        MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
        ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ByteString,
};

use super::config::{FenceConfig, Rule};

/// Where the API server reaches the webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// `https://HOST:PORT` (the paths are added).
    Url(String),
    /// A Service.
    Service {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Its port.
        port: i32,
    },
}

/// What the configurations are made of.
#[derive(Debug, Clone)]
pub(crate) struct Options<'a> {
    /// The configurations' name (both).
    pub(crate) name: &'a str,
    /// The webhook's endpoint.
    pub(crate) endpoint: &'a Endpoint,
    /// The CA certificate(s), PEM.
    pub(crate) ca_bundle: &'a [u8],
    /// The API server's timeout for one call, 1..=30 seconds.
    pub(crate) timeout_seconds: i32,
}

/// The label on both configurations.
const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "kube-leader");

fn client_config(o: &Options<'_>, path: &str) -> WebhookClientConfig {
    let ca_bundle = Some(ByteString(o.ca_bundle.to_vec()));
    match o.endpoint {
        Endpoint::Url(base) => WebhookClientConfig {
            url: Some(format!("{}{path}", base.trim_end_matches('/'))),
            ca_bundle,
            service: None,
        },
        Endpoint::Service {
            namespace,
            name,
            port,
        } => WebhookClientConfig {
            url: None,
            ca_bundle,
            service: Some(ServiceReference {
                namespace: namespace.clone(),
                name: name.clone(),
                path: Some(path.into()),
                port: Some(*port),
            }),
        },
    }
}

fn rules(rule: &Rule, operations: &[&str]) -> Vec<RuleWithOperations> {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for r in &rule.resources {
        match groups.iter_mut().find(|(g, _)| *g == r.api_group) {
            Some((_, resources)) => resources.push(r.resource.clone()),
            None => groups.push((r.api_group.clone(), vec![r.resource.clone()])),
        }
    }
    groups
        .into_iter()
        .map(|(group, resources)| RuleWithOperations {
            api_groups: Some(vec![group]),
            api_versions: Some(vec!["*".into()]),
            operations: Some(operations.iter().map(|s| (*s).to_string()).collect()),
            resources: Some(resources),
            scope: Some("Namespaced".into()),
        })
        .collect()
}

fn metadata(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        labels: Some([(MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string())].into()),
        ..ObjectMeta::default()
    }
}

/// The webhook's name for `rule`: `<rule>.<config>.fence.kube-leader.io`.
fn webhook_name(o: &Options<'_>, rule: &Rule) -> String {
    format!("{}.{}.fence.kube-leader.io", rule.name, o.name)
}

/// The mutating configuration: stamps accepted writes (create, update).
pub(crate) fn mutating(config: &FenceConfig, o: &Options<'_>) -> MutatingWebhookConfiguration {
    MutatingWebhookConfiguration {
        metadata: metadata(o.name),
        webhooks: Some(
            config
                .rules
                .iter()
                .map(|rule| MutatingWebhook {
                    name: webhook_name(o, rule),
                    admission_review_versions: vec!["v1".into()],
                    client_config: client_config(o, &format!("/mutate/{}", rule.name)),
                    failure_policy: Some("Fail".into()),
                    match_policy: Some("Equivalent".into()),
                    namespace_selector: Some(rule.webhook_namespace_selector()),
                    object_selector: Some(rule.webhook_object_selector()),
                    // Runs again if a later webhook changed the object, so the stamp stays.
                    reinvocation_policy: Some("IfNeeded".into()),
                    rules: Some(rules(rule, &["CREATE", "UPDATE"])),
                    side_effects: "None".into(),
                    timeout_seconds: Some(o.timeout_seconds),
                    ..MutatingWebhook::default()
                })
                .collect(),
        ),
    }
}

/// The validating configuration: refuses stale writes (create, update, delete).
pub(crate) fn validating(config: &FenceConfig, o: &Options<'_>) -> ValidatingWebhookConfiguration {
    ValidatingWebhookConfiguration {
        metadata: metadata(o.name),
        webhooks: Some(
            config
                .rules
                .iter()
                .map(|rule| ValidatingWebhook {
                    name: webhook_name(o, rule),
                    admission_review_versions: vec!["v1".into()],
                    client_config: client_config(o, &format!("/validate/{}", rule.name)),
                    failure_policy: Some("Fail".into()),
                    match_policy: Some("Equivalent".into()),
                    namespace_selector: Some(rule.webhook_namespace_selector()),
                    object_selector: Some(rule.webhook_object_selector()),
                    rules: Some(rules(rule, &["CREATE", "UPDATE", "DELETE"])),
                    side_effects: "None".into(),
                    timeout_seconds: Some(o.timeout_seconds),
                    ..ValidatingWebhook::default()
                })
                .collect(),
        ),
    }
}

/// Both configurations (`with_mutating`; else the validating one only) as one YAML stream,
/// with their kinds.
pub(crate) fn yaml(config: &FenceConfig, o: &Options<'_>, with_mutating: bool) -> Result<String, String> {
    let with_kind = |kind: &str, v: serde_json::Value| -> serde_json::Value {
        let mut m = serde_json::Map::new();
        m.insert("apiVersion".into(), "admissionregistration.k8s.io/v1".into());
        m.insert("kind".into(), kind.into());
        if let serde_json::Value::Object(o) = v {
            m.extend(o);
        }
        serde_json::Value::Object(m)
    };
    let m = with_kind("MutatingWebhookConfiguration", to_json(&mutating(config, o))?);
    let v = with_kind("ValidatingWebhookConfiguration", to_json(&validating(config, o))?);
    let m = serde_saphyr::to_string(&m).map_err(|e| e.to_string())?;
    let v = serde_saphyr::to_string(&v).map_err(|e| e.to_string())?;
    if with_mutating {
        Ok(format!("{m}---\n{v}"))
    } else {
        Ok(v)
    }
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<serde_json::Value, String> {
    serde_json::to_value(v).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_halves_fail_closed_and_name_their_paths() {
        let config = FenceConfig::parse(
            r#"
rules:
  - name: orders
    resources: [{ apiGroup: "", resource: secrets }, { apiGroup: apps, resource: deployments }]
    namespaceSelector: { matchLabels: { fence: orders } }
    lock: { namespace: app, name: orders, strategy: for-life }
    writers: [user-1]
"#,
        )
        .unwrap();
        let endpoint = Endpoint::Url("https://127.0.0.1:9443".into());
        let o = Options {
            name: "kube-leader-fence",
            endpoint: &endpoint,
            ca_bundle: b"PEM",
            timeout_seconds: 5,
        };
        let m = mutating(&config, &o);
        let w = &m.webhooks.as_ref().unwrap()[0];
        assert_eq!(w.failure_policy.as_deref(), Some("Fail"));
        assert_eq!(w.side_effects, "None");
        assert_eq!(
            w.client_config.url.as_deref(),
            Some("https://127.0.0.1:9443/mutate/orders")
        );
        assert_eq!(w.rules.as_ref().unwrap().len(), 2, "one rule per API group");
        let v = validating(&config, &o);
        let w = &v.webhooks.as_ref().unwrap()[0];
        assert_eq!(
            w.client_config.url.as_deref(),
            Some("https://127.0.0.1:9443/validate/orders")
        );
        assert!(w.rules.as_ref().unwrap()[0]
            .operations
            .as_ref()
            .unwrap()
            .contains(&"DELETE".to_string()));
        let y = yaml(&config, &o, true).unwrap();
        assert!(
            y.contains("kind: MutatingWebhookConfiguration")
                && y.contains("kind: ValidatingWebhookConfiguration"),
            "{y}"
        );
        assert!(y.contains("caBundle"), "{y}");
    }
}
