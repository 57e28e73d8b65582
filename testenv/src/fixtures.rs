//! Objects tests need: Pods that never run, and RBAC Roles bound to restricted users.
//!
//! These are thin wrappers over the API and return [`kube::Error`], so a test can check the
//! status code of a refusal itself.

use k8s_openapi::{
    api::{
        core::v1::{Container, Pod, PodSpec},
        rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    api::{Patch, PatchParams, PostParams},
    Api, Client,
};

use crate::namespace::random_suffix;

/// A minimal Pod named `name`: one container `main` running image `busybox`.
///
/// There is no kubelet (and no scheduler), so it never runs and stays `Pending` unless
/// [`set_pod_phase`] says otherwise. Set `spec.node_name` to pretend it was scheduled; such a
/// Pod is deleted only with a grace period of 0.
pub fn pod(name: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                image: Some("busybox".into()),
                command: Some(vec!["sleep".into(), "3600".into()]),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

/// Creates [`pod`]`(name)` in `namespace`.
///
/// # Cancellation safety
///
/// Not cancellation safe: the Pod may be created although the future was dropped.
pub async fn create_pod(client: &Client, namespace: &str, name: &str) -> kube::Result<Pod> {
    Api::<Pod>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &pod(name))
        .await
}

/// Sets the Pod's `status.phase` (and `status.reason`, if given) through the status
/// subresource, as a kubelet would: for example `("Failed", Some("Evicted"))` for an evicted Pod,
/// or `("Succeeded", None)`. The field manager is the client's (not the kubelet's): see
/// [`set_pod_phase_as`] to write as the kubelet does.
///
/// # Cancellation safety
///
/// Not cancellation safe: the status may change although the future was dropped.
pub async fn set_pod_phase(
    client: &Client,
    namespace: &str,
    name: &str,
    phase: &str,
    reason: Option<&str>,
) -> kube::Result<Pod> {
    let patch = serde_json::json!({
        "status": {
            "phase": phase,
            "reason": reason,
        }
    });
    Api::<Pod>::namespaced(client.clone(), namespace)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

/// Like [`set_pod_phase`], under the field manager `manager`: `"kubelet"` is the manager the
/// API server records for a kubelet's status writes, so the Pod's `managedFields` say that its
/// kubelet set the phase.
///
/// # Cancellation safety
///
/// Not cancellation safe: the status may change although the future was dropped.
pub async fn set_pod_phase_as(
    client: &Client,
    namespace: &str,
    name: &str,
    phase: &str,
    reason: Option<&str>,
    manager: &str,
) -> kube::Result<Pod> {
    let patch = serde_json::json!({
        "status": {
            "phase": phase,
            "reason": reason,
        }
    });
    let params = PatchParams {
        field_manager: Some(manager.to_owned()),
        ..PatchParams::default()
    };
    Api::<Pod>::namespaced(client.clone(), namespace)
        .patch_status(name, &params, &Patch::Merge(&patch))
        .await
}

/// Adds (or replaces) the Pod condition `type_` with `status` and `reason` through the status
/// subresource: for example `("DisruptionTarget", "True", "EvictionByEvictionAPI")`, as the
/// eviction API writes it before it deletes the Pod.
///
/// # Cancellation safety
///
/// Not cancellation safe: the status may change although the future was dropped.
pub async fn set_pod_condition(
    client: &Client,
    namespace: &str,
    name: &str,
    type_: &str,
    status: &str,
    reason: &str,
) -> kube::Result<Pod> {
    let patch = serde_json::json!({
        "status": {
            "conditions": [{"type": type_, "status": status, "reason": reason}],
        }
    });
    Api::<Pod>::namespaced(client.clone(), namespace)
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
}

/// A policy rule, for example `rule(&[""], &["configmaps"], &["get", "list"])`; `""` is the core
/// API group.
pub fn rule(api_groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let strings = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(strings(api_groups)),
        resources: Some(strings(resources)),
        verbs: strings(verbs),
        ..PolicyRule::default()
    }
}

/// Creates a Role with `rules` in `namespace` and a RoleBinding of it to `user`, both named
/// `testenv-<user>-<random>`, and returns that name (delete the RoleBinding to revoke).
///
/// `admin` must be allowed to grant the rules (the control plane's admin client is). The RBAC
/// authorizer sees the binding after a short delay (its informer), usually milliseconds.
///
/// # Cancellation safety
///
/// Not cancellation safe: the Role may be created without its binding.
pub async fn bind_role(
    admin: &Client,
    namespace: &str,
    user: &str,
    rules: Vec<PolicyRule>,
) -> kube::Result<String> {
    let name = format!("testenv-{user}-{}", random_suffix(5));
    let metadata = ObjectMeta {
        name: Some(name.clone()),
        ..ObjectMeta::default()
    };
    let role = Role {
        metadata: metadata.clone(),
        rules: Some(rules),
    };
    Api::<Role>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &role)
        .await?;
    let binding = RoleBinding {
        metadata,
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "User".into(),
            name: user.to_owned(),
            namespace: None,
        }]),
    };
    Api::<RoleBinding>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &binding)
        .await?;
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_lists_groups_resources_and_verbs() {
        let rule = rule(&[""], &["configmaps"], &["get", "list"]);
        assert_eq!(rule.api_groups, Some(vec!["".to_owned()]));
        assert_eq!(rule.resources, Some(vec!["configmaps".to_owned()]));
        assert_eq!(rule.verbs, vec!["get".to_owned(), "list".to_owned()]);
    }

    #[test]
    fn pods_have_one_container() {
        let pod = pod("p");
        assert_eq!(pod.metadata.name.as_deref(), Some("p"));
        assert_eq!(pod.spec.unwrap().containers[0].image.as_deref(), Some("busybox"));
    }
}
