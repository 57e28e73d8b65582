//! The manifests in `deploy/`, applied as a user applies them (`kubectl apply -k`) to the test
//! control plane: the kustomize base and each overlay, their RBAC equal to `kube-leader rbac`
//! (and `deploy/flow-schema` to `kube-leader rbac --flow-schema`), and the Pod template checked
//! against the `restricted` Pod Security Standard.
//!
//! Kubernetes 1.20 has no Pod Security admission, so the rules are checked here, field by field,
//! on the Deployment as the API server stored it; the namespace still carries the
//! `pod-security.kubernetes.io/enforce: restricted` label, which a 1.23+ control plane enforces.
//! A Pod made from the template is created with a server-side dry run, so the API server's own
//! validation of the security fields runs too (the test control plane has no Deployment
//! controller and no node).

use std::{
    collections::BTreeMap,
    fs,
    path::{Component, Path, PathBuf},
    process::Command,
};

use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{Container, Namespace, Pod, PodSpec},
};
use kube::{
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    Api,
};
use kube_leader_testenv::ControlPlane;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_kube-leader");

/// The repository's `deploy/`.
fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .join("deploy")
}

// === the restricted Pod Security Standard ===

/// The volume types the restricted level allows.
const RESTRICTED_VOLUMES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// Every rule of the `baseline` and `restricted` Pod Security Standards (Kubernetes 1.25+
/// definitions) that `spec` breaks, one line each; empty when it meets `restricted`.
fn restricted_violations(spec: &PodSpec) -> Vec<String> {
    let mut v = Vec::new();
    // Baseline: host namespaces.
    for (field, on) in [
        ("hostNetwork", spec.host_network),
        ("hostPID", spec.host_pid),
        ("hostIPC", spec.host_ipc),
    ] {
        if on == Some(true) {
            v.push(format!("{field} must not be true"));
        }
    }
    let pod_sc = spec.security_context.clone().unwrap_or_default();
    // Restricted: volume types (baseline: no hostPath).
    let volumes = serde_json::to_value(spec.volumes.clone().unwrap_or_default()).unwrap();
    for vol in volumes.as_array().unwrap() {
        for key in vol.as_object().unwrap().keys() {
            if key != "name" && !RESTRICTED_VOLUMES.contains(&key.as_str()) {
                v.push(format!("volume {} has type {key}", vol["name"]));
            }
        }
    }
    // Pod level: seccomp, non-root, user, sysctls, SELinux.
    let seccomp_ok = |t: Option<&str>| matches!(t, Some("RuntimeDefault" | "Localhost"));
    let pod_seccomp = pod_sc.seccomp_profile.as_ref().map(|p| p.type_.as_str());
    if pod_seccomp == Some("Unconfined") {
        v.push("pod seccompProfile must not be Unconfined".into());
    }
    if pod_sc.run_as_user == Some(0) {
        v.push("pod runAsUser must not be 0".into());
    }
    if let Some(sysctls) = &pod_sc.sysctls {
        if !sysctls.is_empty() {
            v.push("no sysctls (only the safe set is allowed; none is needed)".into());
        }
    }
    if let Some(se) = &pod_sc.se_linux_options {
        if se.user.is_some() || se.role.is_some() {
            v.push("pod seLinuxOptions user/role must not be set".into());
        }
    }
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    for c in containers {
        let name = &c.name;
        let sc = c.security_context.clone().unwrap_or_default();
        if sc.privileged == Some(true) {
            v.push(format!("{name}: privileged must not be true"));
        }
        if sc.allow_privilege_escalation != Some(false) {
            v.push(format!("{name}: allowPrivilegeEscalation must be false"));
        }
        let caps = sc.capabilities.clone().unwrap_or_default();
        if !caps.drop.unwrap_or_default().iter().any(|d| d == "ALL") {
            v.push(format!("{name}: capabilities.drop must contain ALL"));
        }
        for add in caps.add.unwrap_or_default() {
            if add != "NET_BIND_SERVICE" {
                v.push(format!(
                    "{name}: capabilities.add may hold only NET_BIND_SERVICE, has {add}"
                ));
            }
        }
        let non_root = sc.run_as_non_root.or(pod_sc.run_as_non_root);
        if non_root != Some(true) {
            v.push(format!("{name}: runAsNonRoot must be true (pod or container)"));
        }
        if sc.run_as_user == Some(0) {
            v.push(format!("{name}: runAsUser must not be 0"));
        }
        let seccomp = sc.seccomp_profile.as_ref().map(|p| p.type_.as_str());
        if !seccomp_ok(seccomp.or(pod_seccomp)) || seccomp == Some("Unconfined") {
            v.push(format!(
                "{name}: seccompProfile must be RuntimeDefault or Localhost (pod or container)"
            ));
        }
        if sc.proc_mount.as_deref().is_some_and(|m| m != "Default") {
            v.push(format!("{name}: procMount must be Default"));
        }
        if let Some(se) = &sc.se_linux_options {
            if se.user.is_some() || se.role.is_some() {
                v.push(format!("{name}: seLinuxOptions user/role must not be set"));
            }
        }
        for port in c.ports.iter().flatten() {
            if port.host_port.is_some_and(|p| p != 0) {
                v.push(format!("{name}: hostPort must not be set"));
            }
        }
    }
    v
}

/// The containers that run as long as the Pod: the app containers and the native sidecars
/// (initContainers with `restartPolicy: Always`).
fn long_running(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.containers.iter().chain(
        spec.init_containers
            .iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some("Always")),
    )
}

/// Whether `c` runs kube-leader: its image is kube-leader's, or its command is kube-leader.
fn runs_kube_leader(c: &Container) -> bool {
    c.image.as_deref().is_some_and(|i| i.contains("kube-leader"))
        || c.command
            .as_ref()
            .and_then(|c| c.first())
            .is_some_and(|c| c.ends_with("kube-leader"))
}

/// What the issue asks of `deploy/` beyond Pod Security: a read-only root file system, limits,
/// a topology spread, and the Downward API variables the sidecar needs (`POD_NAME` in every
/// long-running container, for kube-leader's identity or for a program that compares its own
/// with the leader's; `POD_NAMESPACE` too where kube-leader runs).
fn hardening_gaps(spec: &PodSpec) -> Vec<String> {
    let mut v = Vec::new();
    if spec
        .topology_spread_constraints
        .as_ref()
        .is_none_or(Vec::is_empty)
    {
        v.push("no topologySpreadConstraints".to_string());
    }
    if spec
        .security_context
        .as_ref()
        .and_then(|sc| sc.run_as_user)
        .is_none_or(|u| u == 0)
    {
        v.push("the pod needs a numeric non-root runAsUser (the kubelet checks runAsNonRoot against it without reading the image)".into());
    }
    for c in long_running(spec) {
        let sc = c.security_context.clone().unwrap_or_default();
        if sc.read_only_root_filesystem != Some(true) {
            v.push(format!("{}: readOnlyRootFilesystem must be true", c.name));
        }
        let res = c.resources.clone().unwrap_or_default();
        for (what, map) in [("requests", res.requests), ("limits", res.limits)] {
            let map = map.unwrap_or_default();
            for r in ["cpu", "memory"] {
                if !map.contains_key(r) {
                    v.push(format!("{}: no {r} in resources.{what}", c.name));
                }
            }
        }
        let env: Vec<_> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
        let needed: &[&str] = if runs_kube_leader(c) {
            &["POD_NAME", "POD_NAMESPACE"]
        } else {
            &["POD_NAME"]
        };
        for &name in needed {
            if !env.contains(&name) {
                v.push(format!("{}: no {name} from the Downward API", c.name));
            }
        }
    }
    v
}

#[test]
fn the_checker_finds_each_broken_rule() {
    let good: Deployment = serde_json::from_value(serde_json::json!({
        "spec": {"selector": {}, "template": {"spec": {
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "app", "securityContext": {
                "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}
            }}],
            "volumes": [{"name": "tmp", "emptyDir": {}}]
        }}}
    }))
    .unwrap();
    let spec = good.spec.unwrap().template.spec.unwrap();
    assert_eq!(restricted_violations(&spec), Vec::<String>::new());
    let broken = |f: &dyn Fn(&mut Value)| {
        let mut v = serde_json::to_value(&spec).unwrap();
        f(&mut v);
        let spec: PodSpec = serde_json::from_value(v).unwrap();
        restricted_violations(&spec)
    };
    for (what, f) in [
        (
            "hostNetwork",
            &(|v: &mut Value| v["hostNetwork"] = true.into()) as &dyn Fn(&mut Value),
        ),
        ("type hostPath", &|v| {
            v["volumes"][0] = serde_json::json!({"name": "h", "hostPath": {"path": "/"}})
        }),
        ("allowPrivilegeEscalation", &|v| {
            v["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = true.into()
        }),
        ("drop must contain ALL", &|v| {
            v["containers"][0]["securityContext"]["capabilities"]["drop"] = serde_json::json!([])
        }),
        ("only NET_BIND_SERVICE", &|v| {
            v["containers"][0]["securityContext"]["capabilities"]["add"] = serde_json::json!(["SYS_ADMIN"])
        }),
        ("runAsNonRoot", &|v| {
            v["securityContext"]["runAsNonRoot"] = false.into()
        }),
        ("runAsUser must not be 0", &|v| {
            v["securityContext"]["runAsUser"] = 0.into()
        }),
        ("seccompProfile", &|v| {
            v["securityContext"]["seccompProfile"]["type"] = "Unconfined".into()
        }),
        ("privileged", &|v| {
            v["containers"][0]["securityContext"]["privileged"] = true.into()
        }),
        ("hostPort", &|v| {
            v["containers"][0]["ports"] = serde_json::json!([{"containerPort": 80, "hostPort": 80}])
        }),
    ] {
        let found = broken(f);
        assert!(
            found.iter().any(|m| m.contains(what)),
            "{what} not found: {found:?}"
        );
    }
}

// === applying deploy/ ===

/// `kubectl ARGS` as admin: stdout, or a panic with stderr.
fn kubectl(cp: &ControlPlane, args: &[&str]) -> String {
    let out = cp.kubectl().args(args).output().expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `to` relative to `from` (both absolute): kustomize refuses absolute paths to bases.
fn relative(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<Component<'_>> = from.components().collect();
    let to: Vec<Component<'_>> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut path = PathBuf::new();
    for _ in common..from.len() {
        path.push("..");
    }
    for c in &to[common..] {
        path.push(c.as_os_str());
    }
    path
}

/// `kubectl apply -n NS -k DIR`: as shipped when the API server serves `policy/v1`
/// (Kubernetes 1.21+); on an older one, through a kustomization that only changes the
/// PodDisruptionBudget's apiVersion to `policy/v1beta1` (same fields), as a 1.20 user would.
/// Returns the applied objects as the API server answered.
fn apply_k(cp: &ControlPlane, ns: &str, dir: &Path) -> Vec<Value> {
    let serves_policy_v1 = kubectl(cp, &["api-versions"]).lines().any(|l| l == "policy/v1");
    let target = if serves_policy_v1 {
        dir.to_path_buf()
    } else {
        let wrapper = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "deploy-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        fs::create_dir_all(&wrapper).unwrap();
        let base = relative(&wrapper, dir);
        fs::write(
            wrapper.join("kustomization.yaml"),
            format!(
                "bases:\n  - {}\npatchesJson6902:\n  - target:\n      group: policy\n      version: v1\n      \
                 kind: PodDisruptionBudget\n      name: kube-leader-demo\n    path: pdb-v1beta1.yaml\n",
                base.display()
            ),
        )
        .unwrap();
        fs::write(
            wrapper.join("pdb-v1beta1.yaml"),
            "- op: replace\n  path: /apiVersion\n  value: policy/v1beta1\n",
        )
        .unwrap();
        wrapper
    };
    let out = kubectl(
        cp,
        &["apply", "-n", ns, "-k", target.to_str().unwrap(), "-o", "json"],
    );
    if !serves_policy_v1 {
        let _ = fs::remove_dir_all(&target);
    }
    let v: Value = serde_json::from_str(&out).unwrap();
    v["items"].as_array().cloned().unwrap_or_else(|| vec![v])
}

/// A namespace labelled to enforce the restricted level (enforced by 1.23+ API servers).
async fn restricted_namespace(cp: &ControlPlane) -> kube_leader_testenv::TestNamespace {
    let ns = cp.namespace().await;
    let patch = serde_json::json!({"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/warn": "restricted",
    }}});
    Api::<Namespace>::all(cp.client().await)
        .patch(ns.name(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    ns
}

/// Applies `deploy/<variant>`, whose one container runs kube-leader, and checks everything;
/// returns the stored Deployment.
async fn check_variant(cp: &ControlPlane, variant: &str, service_account: &str) -> Deployment {
    let d = check_applied(cp, variant, service_account).await;
    let pod = d.spec.clone().unwrap().template.spec.unwrap();
    // The container and its names stay as the real-node tests and users know them.
    assert_eq!(pod.containers.len(), 1);
    assert_eq!(pod.containers[0].name, "app");
    // kube-leader on the PATH of the image, or installed by the initContainer pattern.
    let command = pod.containers[0].command.clone().unwrap_or_default();
    assert!(
        command == ["kube-leader"] || command == ["/kube-leader/kube-leader"],
        "deploy/{variant}: command {command:?}"
    );
    d
}

/// Applies `deploy/<variant>` and checks what every variant shares: its objects, the
/// restricted level and the hardening, the ServiceAccount, three replicas, a
/// PodDisruptionBudget that selects them, and a Pod of the template that the API server
/// admits; returns the stored Deployment.
async fn check_applied(cp: &ControlPlane, variant: &str, service_account: &str) -> Deployment {
    let ns = restricted_namespace(cp).await;
    let dir = deploy_dir().join(variant);
    let applied = apply_k(cp, ns.name(), &dir);
    let mut kinds: Vec<String> = applied
        .iter()
        .map(|o| o["kind"].as_str().unwrap_or_default().to_string())
        .collect();
    kinds.sort();
    // deploy/lease and what is built on it: the Pods' ServiceAccount and the elector's, each
    // with its Role and RoleBinding (`--elector-service-account`).
    let rbac: &[&str] = if matches!(variant, "" | "for-life") {
        &["Role", "RoleBinding", "ServiceAccount"]
    } else {
        &[
            "Role",
            "Role",
            "RoleBinding",
            "RoleBinding",
            "ServiceAccount",
            "ServiceAccount",
        ]
    };
    let mut expected = vec!["Deployment", "PodDisruptionBudget"];
    expected.extend_from_slice(rbac);
    assert_eq!(kinds, expected, "deploy/{variant}");

    let client = cp.client().await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns.name());
    let d = deployments.get("kube-leader-demo").await.unwrap();
    let spec = d.spec.clone().unwrap();
    let pod = spec.template.spec.clone().unwrap();
    let violations = restricted_violations(&pod);
    assert!(
        violations.is_empty(),
        "deploy/{variant} is not restricted: {violations:#?}"
    );
    let gaps = hardening_gaps(&pod);
    assert!(gaps.is_empty(), "deploy/{variant}: {gaps:#?}");
    assert_eq!(pod.service_account_name.as_deref(), Some(service_account));
    assert_eq!(spec.replicas, Some(3));

    // The PodDisruptionBudget selects the Deployment's Pods.
    let pdb = applied
        .iter()
        .find(|o| o["kind"] == "PodDisruptionBudget")
        .unwrap();
    let labels = serde_json::to_value(spec.template.metadata.clone().unwrap().labels).unwrap();
    for (k, val) in pdb["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(
            &labels[k], val,
            "the PodDisruptionBudget does not select the Pods"
        );
    }
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);

    // The API server validates a Pod made from the template (dry run: nothing is created).
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("template-check".into()),
            labels: spec.template.metadata.and_then(|m| m.labels),
            ..ObjectMeta::default()
        },
        spec: Some(pod),
        ..Pod::default()
    };
    Api::<Pod>::namespaced(client, ns.name())
        .create(
            &PostParams {
                dry_run: true,
                ..PostParams::default()
            },
            &pod,
        )
        .await
        .unwrap_or_else(|e| panic!("deploy/{variant}: a Pod of the template is refused: {e}"));
    d
}

fn args(d: &Deployment) -> Vec<String> {
    d.spec.clone().unwrap().template.spec.unwrap().containers[0]
        .args
        .clone()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_apply_k_deploy_is_restricted_with_limits_and_a_pdb() {
    let cp = ControlPlane::shared();
    // `kubectl apply -k deploy/` is leader for life, as `kube-leader run` defaults, written out.
    for variant in ["", "for-life"] {
        let d = check_variant(cp, variant, "kube-leader-for-life").await;
        installs_kube_leader(&d, "busybox:1.36");
        let a = args(&d);
        assert_eq!(
            &a[..5],
            ["run", "--strategy", "for-life", "--lock", "kube-leader-demo"],
            "{a:?}"
        );
    }
}

/// `deploy/example`: one kustomization sets the namespace and the names; every reference (the
/// ServiceAccount, the Role, the lock in `--lock` and in `resourceNames`) follows, and nothing
/// refers to an object that is not there.
#[test]
fn one_kustomization_names_everything_without_dangling_references() {
    let cp = ControlPlane::shared();
    let out = kubectl(cp, &["kustomize", deploy_dir().join("example").to_str().unwrap()]);
    let objects: Vec<Value> = out.split("\n---\n").map(yaml_to_json).collect();
    let named = |kind: &str| -> Vec<String> {
        objects
            .iter()
            .filter(|o| o["kind"] == kind)
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    for o in &objects {
        assert_eq!(o["metadata"]["namespace"], "my-namespace", "{o}");
        let name = o["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("my-app-"), "{name}");
    }
    let d = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let pod = &d["spec"]["template"]["spec"];
    let sa = pod["serviceAccountName"].as_str().unwrap();
    assert!(named("ServiceAccount").contains(&sa.to_string()), "{sa}");
    let a: Vec<&str> = pod["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let lock = a[a.iter().position(|s| *s == "--lock").unwrap() + 1];
    assert_eq!(
        lock, "my-app-kube-leader-demo",
        "the lock is the Deployment's name"
    );
    assert_eq!(d["metadata"]["name"], lock);
    let role = |needle: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == "Role" && o.to_string().contains(needle))
            .unwrap_or_else(|| panic!("no Role with {needle}:\n{out}"))
    };
    let election = role(&format!("\"resourceNames\":[\"{lock}\"]"));
    assert!(!out.contains("$("), "a variable left unset:\n{out}");
    // kube-leader's own requests as the elector: its name follows the prefix in the flag and
    // in the rule that lets the Pods' ServiceAccount impersonate it.
    let elector = a[a.iter().position(|s| *s == "--elector-service-account").unwrap() + 1];
    assert_eq!(elector, "my-app-kube-leader-lease-elector");
    assert!(named("ServiceAccount").contains(&elector.to_string()));
    let impersonate = role(&format!("\"resourceNames\":[\"{elector}\"]"));
    let bound_to = |role: &Value| {
        let binding = objects
            .iter()
            .find(|o| o["kind"] == "RoleBinding" && o["roleRef"]["name"] == role["metadata"]["name"])
            .unwrap_or_else(|| panic!("no RoleBinding of {role}"));
        assert_eq!(binding["subjects"][0]["namespace"], "my-namespace");
        binding["subjects"][0]["name"].as_str().unwrap().to_string()
    };
    assert_eq!(bound_to(election), elector);
    assert_eq!(bound_to(impersonate), sa);
    for binding in objects.iter().filter(|o| o["kind"] == "RoleBinding") {
        assert!(named("Role").contains(&binding["roleRef"]["name"].as_str().unwrap().to_string()));
    }
    let pdb = objects
        .iter()
        .find(|o| o["kind"] == "PodDisruptionBudget")
        .unwrap();
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"],
        "my-app"
    );
}

/// One YAML document as JSON, through kubectl's own reader (no YAML crate here; a 1.20 API
/// server knows the PodDisruptionBudget as policy/v1beta1, with the same fields; 1.25 and
/// later only as policy/v1).
fn yaml_to_json(doc: &str) -> Value {
    let cp = ControlPlane::shared();
    let doc = if cp.kubernetes_version().at_least(1, 21) {
        doc.to_owned()
    } else {
        doc.replace("apiVersion: policy/v1\n", "apiVersion: policy/v1beta1\n")
    };
    let doc = doc.as_str();
    let out = cp
        .kubectl_with_stdin(&["create", "--dry-run=client", "-o", "json", "-f", "-"], doc)
        .unwrap_or_else(|e| panic!("{e}: {doc}"));
    serde_json::from_str(&out).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_apply_k_deploy_lease_runs_the_lease_strategy() {
    let cp = ControlPlane::shared();
    let d = check_variant(cp, "lease", "kube-leader-lease").await;
    let a = args(&d);
    assert_eq!(
        &a[..6],
        [
            "run",
            "--strategy",
            "lease",
            "--watch-own-pod",
            "--elector-service-account",
            "kube-leader-lease-elector"
        ],
        "{a:?}"
    );
    // The elector mounts no token: only kube-leader's impersonation makes requests as it.
    let elector = Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(
        cp.client().await,
        d.metadata.namespace.as_deref().unwrap(),
    )
    .get("kube-leader-lease-elector")
    .await
    .unwrap();
    assert_eq!(elector.automount_service_account_token, Some(false));
    // The lock the RBAC names (resourceNames) is the one the Deployment campaigns for.
    let lock = a
        .iter()
        .position(|s| s == "--lock")
        .map(|i| a[i + 1].clone())
        .unwrap();
    assert_eq!(lock, "kube-leader-demo");
}

// === RBAC ===

fn rbac(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .arg("rbac")
        .args(args)
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The objects in `yaml`, normalized by the API server (dry run).
fn server_objects(cp: &ControlPlane, ns: &str, yaml: &str) -> Vec<Value> {
    let out = cp
        .kubectl_with_stdin(
            &["apply", "--dry-run=server", "-n", ns, "-o", "json", "-f", "-"],
            yaml,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let v: Value = serde_json::from_str(&out).unwrap();
    v["items"].as_array().cloned().unwrap_or_else(|| vec![v.clone()])
}

/// What the Roles and RoleBindings in `yaml` grant, normalized by the API server (dry run): per
/// ServiceAccount bound, the rules of its Roles, sorted.
fn server_grants(cp: &ControlPlane, ns: &str, yaml: &str) -> BTreeMap<String, Vec<Value>> {
    let items = server_objects(cp, ns, yaml);
    let mut grants: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for binding in items.iter().filter(|i| i["kind"] == "RoleBinding") {
        let role = items
            .iter()
            .find(|i| i["kind"] == "Role" && i["metadata"]["name"] == binding["roleRef"]["name"])
            .unwrap_or_else(|| panic!("{binding} binds a Role that is not there"));
        for subject in binding["subjects"].as_array().unwrap() {
            let rules = grants
                .entry(subject["name"].as_str().unwrap().to_owned())
                .or_default();
            rules.extend(role["rules"].as_array().unwrap().iter().cloned());
            rules.sort_by_key(|r| r.to_string());
        }
    }
    assert!(!grants.is_empty(), "no Role bound in:\n{yaml}");
    grants
}

#[tokio::test(flavor = "multi_thread")]
async fn deploy_rbac_matches_kube_leader_rbac() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    // deploy/lease: kube-leader's requests as the elector, COMMAND's as the Pods'.
    let elector = [
        "--service-account",
        "kube-leader-lease",
        "--elector-service-account",
        "kube-leader-lease-elector",
    ];
    for (strategy, file, extra) in [
        ("lease", "lease", &[&elector[..], &["--watch-own-pod"]].concat()),
        (
            "for-life",
            "for-life",
            &vec!["--service-account", "kube-leader-for-life"],
        ),
        // `kube-leader elect` has no --watch-own-pod: deploy/lease's Role without the pods rule.
        ("lease", "patterns/native-sidecar", &elector.to_vec()),
    ] {
        // As kustomize builds it: the lock ($(KUBE_LEADER_LOCK)) is the Deployment's name, the
        // elector ($(KUBE_LEADER_ELECTOR)) its ServiceAccount's.
        let built = kubectl(cp, &["kustomize", deploy_dir().join(file).to_str().unwrap()]);
        let deployed: Vec<&str> = built
            .split("\n---\n")
            .filter(|doc| doc.lines().any(|l| l == "kind: Role" || l == "kind: RoleBinding"))
            .collect();
        let printed = rbac(
            &[
                &[
                    "--strategy",
                    strategy,
                    "--lock",
                    "kube-leader-demo",
                    "--namespace",
                    ns.name(),
                ],
                &extra[..],
            ]
            .concat(),
        );
        assert_eq!(
            server_grants(cp, ns.name(), &deployed.join("\n---\n")),
            server_grants(cp, ns.name(), &printed),
            "deploy/{file} and `kube-leader rbac --strategy {strategy} {}` disagree",
            extra.join(" ")
        );
    }
}

// === deploy/flow-schema ===

/// A kustomization of a user's, `body` with `bases:` (relative paths of `deploy/`'s
/// directories) added, built by kubectl's kustomize.
fn kustomize_over(body: &str, bases: &[&str]) -> String {
    let cp = ControlPlane::shared();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "deploy-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    fs::create_dir_all(&dir).unwrap();
    let mut k = format!("{body}bases:\n");
    for base in bases {
        k.push_str(&format!(
            "  - {}\n",
            relative(&dir, &deploy_dir().join(base)).display()
        ));
    }
    fs::write(dir.join("kustomization.yaml"), k).unwrap();
    let out = kubectl(cp, &["kustomize", dir.to_str().unwrap()]);
    let _ = fs::remove_dir_all(&dir);
    out
}

/// The FlowSchema in `yaml` as the API server would store it (dry run): its name and spec.
fn server_flow_schema(cp: &ControlPlane, yaml: &str) -> (Value, Value) {
    let doc = yaml
        .split("\n---\n")
        .find(|d| d.lines().any(|l| l == "kind: FlowSchema"))
        .unwrap_or_else(|| panic!("no FlowSchema in:\n{yaml}"));
    let fs = server_objects(cp, "default", doc).remove(0);
    (fs["metadata"]["name"].clone(), fs["spec"].clone())
}

/// `deploy/flow-schema` is what `kube-leader rbac --flow-schema` prints for deploy/lease's
/// options: as shipped for the namespace `default` (named without it), and through a
/// kustomization of a user's that sets `namespace:` and `nameSuffix:` for another namespace,
/// name and all. Built with deploy/lease and a namePrefix, its subject follows the elector's
/// ServiceAccount.
#[test]
fn deploy_flow_schema_matches_kube_leader_rbac_flow_schema() {
    let cp = ControlPlane::shared();
    if !cp.kubernetes_version().at_least(1, 29) {
        eprintln!("flowcontrol.apiserver.k8s.io/v1 needs Kubernetes 1.29 or later: not checked on this control plane");
        return;
    }
    let printed = |ns: &str| {
        rbac(&[
            "--strategy",
            "lease",
            "--lock",
            "kube-leader-demo",
            "--namespace",
            ns,
            "--service-account",
            "kube-leader-lease",
            "--elector-service-account",
            "kube-leader-lease-elector",
            "--watch-own-pod",
            "--flow-schema",
        ])
    };
    let shipped = kubectl(
        cp,
        &["kustomize", deploy_dir().join("flow-schema").to_str().unwrap()],
    );
    let (name, spec) = server_flow_schema(cp, &shipped);
    assert_eq!(name, "kube-leader-lease-elector");
    assert_eq!(spec, server_flow_schema(cp, &printed("default")).1, "{shipped}");
    assert_eq!(spec["priorityLevelConfiguration"]["name"], "leader-election");

    let users = kustomize_over("namespace: team-a\nnameSuffix: -team-a\n", &["flow-schema"]);
    assert_eq!(
        server_flow_schema(cp, &users),
        server_flow_schema(cp, &printed("team-a")),
        "a kustomization with namespace: team-a and nameSuffix: -team-a over deploy/flow-schema, \
         and `kube-leader rbac --namespace team-a --flow-schema`, disagree:\n{users}"
    );

    let together = kustomize_over(
        "namespace: my-namespace\nnamePrefix: my-app-\n",
        &["lease", "flow-schema"],
    );
    let (_, spec) = server_flow_schema(cp, &together);
    let subject = &spec["rules"][0]["subjects"][0]["serviceAccount"];
    assert_eq!(subject["name"], "my-app-kube-leader-lease-elector", "{together}");
    assert_eq!(subject["namespace"], "my-namespace", "{together}");
    assert!(
        together.contains("- --elector-service-account\n        - my-app-kube-leader-lease-elector\n"),
        "the Deployment's elector is the FlowSchema's:\n{together}"
    );
}

// === deploy/patterns: kube-leader next to a program of the user's ===

/// `deploy/patterns/copy-from`: deploy/lease with the user's image, which holds kube-leader
/// (its Dockerfile copies it in); restricted, the Lease strategy, the image renamed.
#[tokio::test(flavor = "multi_thread")]
async fn kubectl_apply_k_the_copy_from_pattern() {
    let cp = ControlPlane::shared();
    let d = check_variant(cp, "patterns/copy-from", "kube-leader-lease").await;
    assert_eq!(&args(&d)[..3], ["run", "--strategy", "lease"]);
    let spec = d.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        spec.containers[0].image.as_deref(),
        Some("localhost/my-app-with-kube-leader:0.1.0")
    );
    assert_eq!(
        spec.containers[0].command.as_deref(),
        Some(&["kube-leader".to_owned()][..])
    );
    assert!(spec.init_containers.is_none(), "no initContainer");
    let volumes: Vec<_> = spec.volumes.iter().flatten().map(|v| &v.name).collect();
    assert_eq!(volumes, ["tmp"], "no emptyDir for the binary");
    let mounts: Vec<_> = spec.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| &m.name)
        .collect();
    assert_eq!(mounts, ["tmp"]);
}

/// `deploy/patterns/init-container`: the user's image untouched; an initContainer of the
/// kube-leader image installs the binary into an emptyDir that the app container runs it from.
#[tokio::test(flavor = "multi_thread")]
async fn kubectl_apply_k_the_init_container_pattern() {
    let cp = ControlPlane::shared();
    let d = check_variant(cp, "patterns/init-container", "kube-leader-lease").await;
    assert_eq!(&args(&d)[..3], ["run", "--strategy", "lease"]);
    installs_kube_leader(&d, "localhost/my-app:1.0.0");
}

/// `deploy/patterns/native-sidecar`: `kube-leader elect` as a native sidecar (an initContainer
/// with `restartPolicy: Always`, probed on its status server) beside an app of the public
/// busybox image that asks it who leads on localhost and has no kube-leader of its own;
/// restricted, deploy/lease's ServiceAccount, its Role without the pods rule
/// (`deploy_rbac_matches_kube_leader_rbac`).
#[tokio::test(flavor = "multi_thread")]
async fn kubectl_apply_k_the_native_sidecar_pattern() {
    let cp = ControlPlane::shared();
    if !cp.kubernetes_version().at_least(1, 29) {
        eprintln!("native sidecars need Kubernetes 1.29 or later (beta, on by default; GA in 1.33): not checked on this control plane");
        return;
    }
    let d = check_applied(cp, "patterns/native-sidecar", "kube-leader-lease").await;
    let spec = d.spec.unwrap().template.spec.unwrap();

    let init = spec.init_containers.clone().unwrap_or_default();
    assert_eq!(init.len(), 1, "one initContainer, the sidecar");
    let sidecar = &init[0];
    assert_eq!(sidecar.name, "kube-leader");
    assert_eq!(
        sidecar.restart_policy.as_deref(),
        Some("Always"),
        "a native sidecar: restartPolicy Always (the API server kept it)"
    );
    assert_eq!(sidecar.image.as_deref(), Some("localhost/kube-leader:0.1.0"));
    assert!(sidecar.command.is_none(), "the image's entry point, kube-leader");
    let a = sidecar.args.clone().unwrap_or_default();
    assert_eq!(
        &a[..5],
        ["elect", "--strategy", "lease", "--lock", "kube-leader-demo"],
        "{a:?}"
    );
    let status_addr = a
        .iter()
        .position(|s| s == "--status-addr")
        .map(|i| a[i + 1].as_str());
    assert_eq!(status_addr, Some(":4040"), "the kubelet's probes reach it: {a:?}");
    assert!(
        !a.iter().any(|s| s == "--watch-own-pod"),
        "elect has no --watch-own-pod"
    );
    let port = sidecar
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("status"))
        .expect("the status port");
    assert_eq!(port.container_port, 4040);
    let probe = |probe: Option<&k8s_openapi::api::core::v1::Probe>, what: &str| {
        let get = probe
            .and_then(|p| p.http_get.clone())
            .unwrap_or_else(|| panic!("the sidecar has an HTTP {what}"));
        assert_eq!(
            serde_json::to_value(&get.port).unwrap(),
            "status",
            "{what} on the status port"
        );
        get.path.unwrap_or_default()
    };
    // The app starts once the sidecar knows who leads; ready and alive as the Deployment's.
    assert_eq!(probe(sidecar.startup_probe.as_ref(), "startupProbe"), "/readyz");
    assert_eq!(
        probe(sidecar.readiness_probe.as_ref(), "readinessProbe"),
        "/readyz"
    );
    assert_eq!(
        probe(sidecar.liveness_probe.as_ref(), "livenessProbe"),
        "/healthz"
    );

    assert_eq!(spec.containers.len(), 1);
    let app = &spec.containers[0];
    assert_eq!(app.name, "app");
    assert_eq!(app.image.as_deref(), Some("busybox:1.36"));
    assert!(!runs_kube_leader(app), "the app does not run kube-leader");
    assert!(
        spec.volumes.iter().flatten().all(|v| v.name != "kube-leader"),
        "no binary to install"
    );
    let script = app.args.clone().unwrap_or_default().concat();
    assert!(
        script.contains("url=http://127.0.0.1:4040/leader"),
        "the app asks the sidecar on localhost: {script}"
    );
    // The app compares the answer with its own Pod's name, the sidecar's identity.
    let pod_name = |c: &Container| {
        c.env
            .iter()
            .flatten()
            .find(|e| e.name == "POD_NAME")
            .and_then(|e| e.value_from.clone()?.field_ref)
            .map(|f| f.field_path)
    };
    assert_eq!(pod_name(app).as_deref(), Some("metadata.name"));
    assert_eq!(pod_name(sidecar).as_deref(), Some("metadata.name"));
    assert!(script.contains("$POD_NAME"), "{script}");
}

/// `deploy/lease`: the shipped images, the public busybox and kube-leader's own.
#[tokio::test(flavor = "multi_thread")]
async fn kubectl_apply_k_deploy_lease_uses_public_and_own_images() {
    let cp = ControlPlane::shared();
    let d = check_variant(cp, "lease", "kube-leader-lease").await;
    installs_kube_leader(&d, "busybox:1.36");
}

/// The initContainer shape of deploy/base: the kube-leader image installs the binary into an
/// emptyDir that the app container, of image `app_image`, runs it from.
fn installs_kube_leader(d: &Deployment, app_image: &str) {
    let spec = d.spec.clone().unwrap().template.spec.unwrap();
    let init = spec.init_containers.clone().unwrap_or_default();
    assert_eq!(init.len(), 1, "one initContainer");
    assert_eq!(init[0].image.as_deref(), Some("localhost/kube-leader:0.1.0"));
    assert_eq!(
        init[0].args.as_deref(),
        Some(&["install".to_owned(), "/kube-leader".to_owned()][..])
    );
    let app = &spec.containers[0];
    assert_eq!(app.image.as_deref(), Some(app_image));
    assert_eq!(
        app.command.as_deref(),
        Some(&["/kube-leader/kube-leader".to_owned()][..])
    );
    let mounted = |c: &k8s_openapi::api::core::v1::Container| {
        c.volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == "kube-leader" && m.mount_path == "/kube-leader")
    };
    assert!(
        mounted(&init[0]) && mounted(app),
        "both mount the emptyDir at /kube-leader"
    );
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "kube-leader")
        .expect("the kube-leader volume");
    assert!(volume.empty_dir.is_some(), "an emptyDir");
}
