//! What the fence's end-to-end tests share (`tests/fence.rs`, `tests/fence_chaos.rs`): free
//! ports for webhook servers, running `kube-leader` subcommands, and the cluster-wide grant by
//! which a fenced writer carries its token.

use std::{
    net::{Ipv4Addr, TcpListener},
    path::Path,
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
};

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kube::{
    api::{ObjectMeta, PostParams},
    Api, Client,
};

/// The lowest port [`free_port`] hands out.
const FLOOR: u16 = 20_000;

/// A free port on 127.0.0.1 for a server that a test starts as another process, which binds it
/// a moment later. Nothing else may take it meanwhile, and two things could with a port the
/// kernel picked (`bind(0)`): another test of the same binary, running in parallel, handed the
/// same port once its probe was closed (seen: two `fence serve` replicas of two tests on one
/// port, one exiting with "Address already in use"), and an outgoing connection, whose local
/// port the kernel takes from the same ephemeral range. So the ports come from below that range
/// (`net.ipv4.ip_local_port_range`), and each one only once per process.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let span = u32::from(ephemeral_start().saturating_sub(FLOOR)).max(1);
    // Test binaries run one after another; a per-process start spreads the runs apart.
    let start = std::process::id().wrapping_mul(2_654_435_761) % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = FLOOR + u16::try_from((start + n) % span).unwrap_or(0);
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on 127.0.0.1 from {FLOOR} to the ephemeral range");
}

/// The first port of the kernel's ephemeral range (32768 where it cannot be read).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .filter(|p: &u16| *p > FLOOR + 1_000)
        .unwrap_or(32_768)
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
