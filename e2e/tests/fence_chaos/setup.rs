//! The fenced chaos run's stage: its namespace, the writer's permissions, the twin objects, and
//! two webhook servers, one enforcing and one audit-only, registered by URL.

use std::{
    fs::OpenOptions,
    net::{Ipv4Addr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::{
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    Api, Client,
};
use kube_leader_e2e::fence_env::{free_port, grant_impersonating_itself, run_ok};
use kube_leader_testenv::{bind_role, rule, ControlPlane};

/// The label that puts an object under one of the two rules (`fenced` or `audit`).
pub(crate) const SIDE_LABEL: &str = "fence-side";

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// The rules of one side: ConfigMaps labelled `fence-side=<side>` in `ns`, guarded by the Lease
/// `lock`, written by `writer`.
fn rules(side: &str, ns: &str, lock: &str, writer: &str) -> String {
    format!(
        r#"rules:
  - name: {side}
    resources: [{{ apiGroup: "", resource: configmaps }}]
    namespaceSelector: {{ matchLabels: {{ fence-test: {ns} }} }}
    objectSelector: {{ matchLabels: {{ {SIDE_LABEL}: {side} }} }}
    lock: {{ namespace: {ns}, name: {lock}, strategy: lease }}
    writers: ["{writer}"]
"#
    )
}

/// One `kube-leader fence serve`, restartable (its log is appended to).
#[derive(Debug)]
pub(crate) struct Webhook {
    bin: PathBuf,
    rules: PathBuf,
    tls_dir: PathBuf,
    kubeconfig: PathBuf,
    /// Its JSON log.
    pub(crate) log: PathBuf,
    port: u16,
    audit_only: bool,
    child: Option<Child>,
}

impl Webhook {
    /// Starts the server and waits until it listens.
    pub(crate) fn start(&mut self) {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("the webhook's log");
        let child = Command::new(&self.bin)
            .args(["fence", "serve", "--rules", path(&self.rules), "--tls-dir"])
            .arg(&self.tls_dir)
            .args(["--listen", &format!("127.0.0.1:{}", self.port), "--kubeconfig"])
            .arg(&self.kubeconfig)
            .args(["--log-format", "json"])
            .args(self.audit_only.then_some("--audit-only"))
            // The `fence check` line of every fenced write is a debug line of the fence module.
            .env("RUST_LOG", "info,kube_leader::fence=debug")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start kube-leader fence serve");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the webhook did not listen on {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the server (SIGKILL: a crashed webhook Pod).
    pub(crate) fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The stage: what [`stage`] made.
#[derive(Debug)]
pub(crate) struct Stage {
    /// The enforcing webhook (objects `fenced-<i>`).
    pub(crate) enforcing: Webhook,
    /// The audit-only webhook (objects `audit-<i>`).
    pub(crate) audit: Webhook,
    /// The webhook configurations' names.
    pub(crate) configurations: Vec<String>,
}

/// Labels `ns` for the rules, grants `writer`, creates the objects, starts both webhooks and
/// registers them (validating half only: see docs/fence.md on this build's API server).
pub(crate) async fn stage(
    cp: &ControlPlane,
    bin: &Path,
    ns: &str,
    lock: &str,
    writer: &str,
    dir: &Path,
    objects: usize,
) -> Stage {
    let admin = cp.client().await;
    Api::<Namespace>::all(admin.clone())
        .patch(
            ns,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"fence-test": ns}}})),
        )
        .await
        .expect("label the namespace");
    grant_writer(&admin, ns, writer).await;
    create_objects(&admin, ns, objects).await;
    run_ok(bin, &["fence", "certs", "--out", path(dir), "--san", "127.0.0.1"]);
    let webhook = |side: &str, audit_only: bool| {
        let rules_file = dir.join(format!("{side}.yaml"));
        std::fs::write(&rules_file, rules(side, ns, lock, writer)).expect("write the rules");
        let mut w = Webhook {
            bin: bin.to_owned(),
            rules: rules_file,
            tls_dir: dir.to_owned(),
            kubeconfig: cp.kubeconfig_path().to_owned(),
            log: dir.join(format!("webhook-{side}.log")),
            port: free_port(),
            audit_only,
            child: None,
        };
        w.start();
        w
    };
    let (enforcing, audit) = (webhook("fenced", false), webhook("audit", true));
    let configurations = register(cp, bin, dir, ns, [&enforcing, &audit]);
    Stage {
        enforcing,
        audit,
        configurations,
    }
}

/// Registers both webhooks by URL; returns the configurations' names.
fn register(cp: &ControlPlane, bin: &Path, dir: &Path, ns: &str, webhooks: [&Webhook; 2]) -> Vec<String> {
    let mut configurations = Vec::new();
    for w in webhooks {
        let name = format!(
            "{}-{ns}",
            w.rules.file_stem().and_then(|s| s.to_str()).unwrap_or("fence")
        );
        let url = format!("https://127.0.0.1:{}", w.port);
        run_ok(
            bin,
            &[
                "fence",
                "webhooks",
                "--rules",
                path(&w.rules),
                "--ca-bundle",
                path(&dir.join("ca.crt")),
                "--url",
                &url,
                "--name",
                &name,
                "--apply",
                "--without-mutating",
                "--kubeconfig",
                path(cp.kubeconfig_path()),
            ],
        );
        configurations.push(name);
    }
    configurations
}

/// `fenced-<i>`, `audit-<i>` (labelled for their rules) and `plain-<i>`, created by the
/// administrator (not a fenced writer: no stamp).
async fn create_objects(admin: &Client, ns: &str, objects: usize) {
    let api = Api::<ConfigMap>::namespaced(admin.clone(), ns);
    for i in 0..objects {
        for side in ["fenced", "audit", "plain"] {
            let labels = (side != "plain").then(|| [(SIDE_LABEL.to_string(), side.to_string())].into());
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(format!("{side}-{i}")),
                    labels,
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            };
            api.create(&PostParams::default(), &cm)
                .await
                .expect("create an object");
        }
    }
}

/// The writer may elect on Leases, write ConfigMaps and Events in `ns`, and impersonate itself
/// with a fencing token (what `kube-leader rbac --fence` prints, for a user).
async fn grant_writer(admin: &Client, ns: &str, writer: &str) {
    let all = ["get", "list", "watch", "create", "update", "patch", "delete"];
    bind_role(
        admin,
        ns,
        writer,
        vec![
            rule(&[""], &["configmaps"], &all),
            rule(&["coordination.k8s.io"], &["leases"], &all),
            rule(&[""], &["events"], &["create"]),
        ],
    )
    .await
    .expect("bind the writer's role");
    let name = format!("fence-chaos-writer-{ns}");
    grant_impersonating_itself(admin, &name, writer).await;
}

/// Waits until both rules are in force: a token-less write of the writer to `fenced-0` is
/// refused by the fence, and one to `audit-0` is logged as what the audit-only webhook would
/// refuse.
pub(crate) async fn wait_in_force(cp: &ControlPlane, writer: &str, ns: &str, audit_log: &Path) {
    let api = Api::<ConfigMap>::namespaced(cp.user_client(writer).await, ns);
    let patch = Patch::Merge(serde_json::json!({"data": {"probe": "x"}}));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let fenced = api.patch("fenced-0", &PatchParams::default(), &patch).await;
        let refused =
            matches!(&fenced, Err(kube::Error::Api(s)) if s.message.contains("carries no fencing token"));
        let _ = api.patch("audit-0", &PatchParams::default(), &patch).await;
        let audited = std::fs::read_to_string(audit_log)
            .unwrap_or_default()
            .contains("would refuse");
        if refused && audited {
            return;
        }
        assert!(Instant::now() < deadline, "the fence is not in force: {fenced:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Deletes the webhook configurations and the writer's cluster-wide grant.
pub(crate) fn unstage(cp: &ControlPlane, ns: &str, configurations: &[String]) {
    for name in configurations {
        let _ = cp
            .kubectl()
            .args([
                "delete",
                "validatingwebhookconfiguration",
                name,
                "--ignore-not-found",
            ])
            .output();
    }
    let name = format!("fence-chaos-writer-{ns}");
    for kind in ["clusterrolebinding", "clusterrole"] {
        let _ = cp
            .kubectl()
            .args(["delete", kind, &name, "--ignore-not-found"])
            .output();
    }
}
