//! What the fence's end-to-end tests share (`tests/fence.rs`, `tests/fence_chaos.rs`): free
//! ports for webhook servers, running `kube-leader` subcommands, and the cluster-wide grant by
//! which a fenced writer carries its token.

use std::{
    net::{Ipv4Addr, TcpListener},
    path::Path,
    process::Command,
};

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kube::{
    api::{ObjectMeta, PostParams},
    Api, Client,
};

/// A free port on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

/// `BIN ARGS` (a `kube-leader` binary), which must succeed, with no usable `KUBECONFIG`: its
/// stdout.
pub fn run_ok(bin: &Path, args: &[&str]) -> String {
    let out = Command::new(bin)
        .args(args)
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .expect("run kube-leader");
    assert!(
        out.status.success(),
        "kube-leader {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The ClusterRole and ClusterRoleBinding `name` by which the user `writer` may impersonate
/// itself with a fencing token (what `kube-leader rbac --fence` prints, for a user rather than a
/// ServiceAccount). Delete both by `name` when done.
pub async fn grant_impersonating_itself(admin: &Client, name: &str, writer: &str) {
    let impersonate = |group: &str, resource: &str, names: Option<Vec<String>>| PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(vec![resource.into()]),
        resource_names: names,
        verbs: vec!["impersonate".into()],
        ..PolicyRule::default()
    };
    let role = ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![
            impersonate("", "users", Some(vec![writer.into()])),
            impersonate(
                "authentication.k8s.io",
                "userextras/kube-leader.io/fencing-token",
                None,
            ),
        ]),
        aggregation_rule: None,
    };
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("create the impersonation ClusterRole");
    let binding = ClusterRoleBinding {
        metadata: role.metadata.clone(),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: name.to_owned(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "User".into(),
            name: writer.into(),
            namespace: None,
        }]),
    };
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("bind the impersonation ClusterRole");
}
