//! deploy/fence on the real node: the webhook's two replicas run as Pods, Kubernetes calls
//! them, and a deposed leader's writes to the shipped rules' objects are refused.
//!
//! # What the test changes in `deploy/fence`
//!
//! The objects `kubectl apply -k deploy/fence` applies, with these changes, all forced by one
//! node with no Pod network, no Service routing and no registry:
//! - the Deployment: the node-test image (`imagePullPolicy: Never`), `hostNetwork: true` with
//!   `KUBERNETES_SERVICE_HOST=127.0.0.1` and `KUBERNETES_SERVICE_PORT` the API server's port;
//!   `--listen 127.0.0.1:0`, since two hostNetwork replicas on one node cannot share a port
//!   (each logs the port it got); the `ports` and the two probes that name it go;
//! - the webhooks are registered by URL (`kube-leader fence webhooks --url`), at a balancer of
//!   the test in front of both replicas' ports (no Service routing here), and without the
//!   mutating half (this API server's build crashes on a mutating webhook's patch:
//!   docs/fence.md); the fenced client stamps its writes;
//! - rules.yaml names the test's namespace for the lock and the writer (the shipped file says
//!   `default`), and the PodDisruptionBudget is applied as `policy/v1beta1` (1.20).
//!
//! The fenced writer is the rules' ServiceAccount `my-operator`, with the Role and ClusterRole
//! `kube-leader rbac --fence` prints and a Role for the Deployments it writes; it elects itself
//! on the rules' Lease `my-operator` with the library and writes through
//! `Leadership::fenced_client`.

use std::time::Duration;

use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{Pod, Secret},
};
use kube::{
    api::{ListParams, Patch, PatchParams, PostParams},
    Api, Client,
};
use kube_leader::{internal::fence::FENCED_TOKEN_ANNOTATION, Leadership, LeaseElector};
use kube_leader_e2e::{balancer::Balancer, wait_for};
use kube_leader_testenv::{bind_role, rule, ControlPlane, TestNamespace};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::{manifest, ms, say, NodeEnv};

/// The lock, the writer's ServiceAccount and the label value of deploy/fence/rules.yaml.
const OPERATOR: &str = "my-operator";
const FENCE: &str = "kube-leader-fence";
const REPLICAS: usize = 2;

/// deploy/fence applied on the node, and its fenced writer.
struct Fenced {
    env: &'static NodeEnv,
    balancer: Balancer,
    writer: String,
    // Dropped last: the webhook configurations go first (Drop).
    namespace: TestNamespace,
}

pub(crate) async fn scenario(env: &'static NodeEnv) {
    let f = Fenced::apply(env).await;
    let ns = f.ns().to_owned();
    let admin = f.cp().client().await;
    let writer = f.writer_client(&admin).await;
    f.wait_in_force(&writer).await;

    // A leads and creates the fenced Deployment: stamped with its token.
    let a = f.lead(&writer, "a").await;
    let client_a = a.fenced_client(writer.clone(), f.writer.clone()).unwrap();
    let created = Api::<Deployment>::namespaced(client_a.clone(), &ns)
        .create(&PostParams::default(), &fenced_deployment("orders"))
        .await
        .expect("the leader's create passes the fence");
    assert_eq!(stamp(&created), Some(a.fencing_token().to_string()));

    // A is deposed (its handle goes, its client stays: a paused process); B leads and writes.
    let ta = a.fencing_token();
    a.release().await.unwrap();
    let b = f.lead(&writer, "b").await;
    let tb = b.fencing_token();
    let client_b = b.fenced_client(writer.clone(), f.writer.clone()).unwrap();
    let patched = annotate(&client_b, &ns, "b-1")
        .await
        .expect("the leader's patch passes");
    assert_eq!(stamp(&patched), Some(tb.to_string()));
    let refused = refusal(annotate(&client_a, &ns, "stale").await);
    let names = [
        format!("{ns}/{OPERATOR}"),
        ta.to_string(),
        tb.to_string(),
        "held by b".into(),
    ];
    for part in names {
        assert!(refused.contains(&part), "the refusal names {part:?}: {refused}");
    }
    say(&format!(
        "fence: tokens a {ta}, b {tb}; the deposed leader's patch: {refused}"
    ));

    // One replica's Pod deleted (the kubelet's SIGTERM): the other answers alike meanwhile.
    let pods = f.pods().await;
    let deleted = super::mono_ns();
    f.kubectl(&["delete", "pod", &pods[0], "--wait=false"]);
    let mut unreachable = 0;
    for i in 0..5 {
        let value = format!("b-{}", i + 2);
        let (written, n) = reaching(|| annotate(&client_b, &ns, &value)).await;
        written.expect("the leader writes on");
        unreachable += n;
        let (stale, n) = reaching(|| annotate(&client_a, &ns, "stale")).await;
        refusal(stale);
        unreachable += n;
    }
    f.rebalance(&pods[0]).await;
    say(&format!(
        "fence: replica {} deleted; leader's writes passed, deposed leader's refused \
         ({unreachable} calls met the deleted replica's closed connection and were retried); \
         replacement serving after {}",
        pods[0],
        ms(super::mono_ns() - deleted)
    ));

    // Both replicas gone: fenced writes are refused (failurePolicy Fail), nothing else is.
    f.kubectl(&["scale", &format!("deployment/{FENCE}"), "--replicas=0"]);
    wait_for(
        "no webhook Pod, terminating ones included",
        Duration::from_secs(90),
        || async { f.pod_objects().await.is_empty().then_some(()) },
    )
    .await;
    let down = annotate(&client_b, &ns, "b-down").await;
    assert!(
        matches!(&down, Err(kube::Error::Api(s)) if s.message.contains("failed calling webhook")),
        "with the webhook down a fenced write is refused: {down:?}"
    );
    Api::<Deployment>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &unfenced_deployment("unfenced"))
        .await
        .expect("an object the rules do not select is written with the webhook down");
    f.kubectl(&["scale", &format!("deployment/{FENCE}"), "--replicas=2"]);
    f.rebalance("").await;
    let back = annotate(&client_b, &ns, "b-back")
        .await
        .expect("fenced writes pass again");
    assert_eq!(stamp(&back), Some(tb.to_string()));
    refusal(annotate(&client_a, &ns, "stale").await);
    say("fence: both replicas down → the leader's fenced write refused, other writes untouched; back up → passes");
    drop(b);
}

impl Fenced {
    /// Applies deploy/fence into a new namespace (as the module documentation says) and
    /// registers its webhooks; waits until both replicas serve.
    async fn apply(env: &'static NodeEnv) -> Self {
        let cp = env.node.control_plane();
        let namespace = cp.namespace().await;
        let ns = namespace.name().to_owned();
        let f = Fenced {
            env,
            balancer: Balancer::start(&[]),
            writer: format!("system:serviceaccount:{ns}:{OPERATOR}"),
            namespace,
        };
        let dir = std::env::temp_dir().join(format!("kube-leader-node-fence-{ns}"));
        std::fs::create_dir_all(&dir).unwrap();
        let dir_s = dir.to_string_lossy().into_owned();
        f.run(&["fence", "certs", "--out", &dir_s, "--san", "127.0.0.1"]);
        f.kubectl(&[
            "label",
            "namespace",
            &ns,
            &format!("fence.kube-leader.io/{OPERATOR}=true"),
        ]);
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        f.kubectl(&[
            "create",
            "secret",
            "tls",
            "kube-leader-fence-tls",
            "--cert",
            &cert.to_string_lossy(),
            "--key",
            &key.to_string_lossy(),
        ]);
        let rules = shipped_rules(&env.repo).replace("namespace: default", &format!("namespace: {ns}"));
        let rules = rules.replace(&format!("system:serviceaccount:default:{OPERATOR}"), &f.writer);
        std::fs::write(dir.join("rules.yaml"), &rules).unwrap();
        let mut objects = Vec::new();
        for mut object in manifest(env, &ns, "deploy/fence") {
            match object["kind"].as_str() {
                Some("Deployment") => for_the_node(&mut object, env, cp.apiserver_port()),
                Some("ConfigMap") => object["data"]["rules.yaml"] = json!(rules),
                _ => {}
            }
            objects.push(object);
        }
        objects.push(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": OPERATOR}}));
        let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
        f.kubectl_stdin(&["apply", "-f", "-"], &list.to_string());
        f.grant_writer(&dir).await;
        f.rebalance("").await;
        let url = format!("https://127.0.0.1:{}", f.balancer.port());
        let (rules_file, ca) = (dir.join("rules.yaml"), dir.join("ca.crt"));
        let kubeconfig = cp.kubeconfig_path().to_string_lossy().into_owned();
        f.run(&[
            "fence",
            "webhooks",
            "--rules",
            &rules_file.to_string_lossy(),
            "--ca-bundle",
            &ca.to_string_lossy(),
            "--url",
            &url,
            "--name",
            &f.webhooks(),
            "--without-mutating",
            "--apply",
            "--kubeconfig",
            &kubeconfig,
        ]);
        f
    }

    fn cp(&self) -> &'static ControlPlane {
        self.env.node.control_plane()
    }

    fn ns(&self) -> &str {
        self.namespace.name()
    }

    fn webhooks(&self) -> String {
        format!("fence-{}", self.ns())
    }

    /// `kube-leader rbac --fence` for the writer, and a Role for the Deployments it writes.
    async fn grant_writer(&self, dir: &std::path::Path) {
        let ns = self.ns();
        let yaml = self.run(&[
            "rbac",
            "--strategy",
            "lease",
            "--lock",
            OPERATOR,
            "--namespace",
            ns,
            "--service-account",
            OPERATOR,
            "--fence",
        ]);
        std::fs::write(dir.join("writer-rbac.yaml"), &yaml).unwrap();
        self.kubectl_stdin(&["apply", "-f", "-"], &yaml);
        let admin = self.cp().client().await;
        let verbs = ["get", "list", "watch", "create", "update", "patch", "delete"];
        bind_role(
            &admin,
            ns,
            &self.writer,
            vec![rule(&["apps"], &["deployments"], &verbs)],
        )
        .await
        .unwrap();
    }

    /// The writer's client: its ServiceAccount's token (the token controller's Secret). From
    /// 1.24 on no Secret is made for every ServiceAccount: one is asked for, which the token
    /// controller fills in.
    async fn writer_client(&self, admin: &Client) -> Client {
        let secrets = Api::<Secret>::namespaced(admin.clone(), self.ns());
        if self.cp().kubernetes_version().at_least(1, 24) {
            let secret: Secret = serde_json::from_value(json!({
                "metadata": {
                    "name": format!("{OPERATOR}-token"),
                    "annotations": {"kubernetes.io/service-account.name": OPERATOR},
                },
                "type": "kubernetes.io/service-account-token",
            }))
            .unwrap();
            secrets.create(&PostParams::default(), &secret).await.unwrap();
        }
        let token = wait_for("the writer's token Secret", Duration::from_secs(60), || async {
            let list = secrets.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find_map(|s| {
                let sa = s
                    .metadata
                    .annotations
                    .as_ref()?
                    .get("kubernetes.io/service-account.name")?;
                (sa == OPERATOR).then_some(())?;
                let token = s.data.as_ref()?.get("token")?;
                String::from_utf8(token.0.clone()).ok()
            })
        })
        .await;
        let mut config = self.cp().config("admin").await.unwrap();
        config.auth_info = kube::config::AuthInfo {
            token: Some(token.into()),
            ..Default::default()
        };
        Client::try_from(config).unwrap()
    }

    /// Waits until the fence is in force: a token-less write of the writer is refused by it.
    async fn wait_in_force(&self, writer: &Client) {
        let api = Api::<Deployment>::namespaced(writer.clone(), self.ns());
        wait_for("the fence in force", Duration::from_secs(60), || async {
            match api
                .create(&PostParams::default(), &fenced_deployment("probe"))
                .await
            {
                Err(kube::Error::Api(s)) if s.message.contains("carries no fencing token") => Some(()),
                _ => None,
            }
        })
        .await;
    }

    /// Leads the rules' Lease as `identity`, as the writer.
    async fn lead(&self, writer: &Client, identity: &str) -> Leadership {
        LeaseElector::new(writer.clone(), OPERATOR)
            .namespace(self.ns())
            .identity(identity)
            .become_leader(&CancellationToken::new())
            .await
            .unwrap()
    }

    /// The webhook's Pods, terminating ones included.
    async fn pod_objects(&self) -> Vec<Pod> {
        let api = Api::<Pod>::namespaced(self.cp().client().await, self.ns());
        api.list(&ListParams::default().labels(&format!("app.kubernetes.io/name={FENCE}")))
            .await
            .expect("list the webhook's Pods")
            .items
    }

    /// The webhook's Pods that are not terminating, by name.
    async fn pods(&self) -> Vec<String> {
        self.pod_objects()
            .await
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.metadata.name)
            .collect()
    }

    /// Waits until two replicas other than `gone` serve, and points the balancer at their
    /// ports (as a Service's endpoints follow its ready Pods).
    async fn rebalance(&self, gone: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        let ports = loop {
            let pods: Vec<String> = self.pods().await.into_iter().filter(|p| p != gone).collect();
            let ports: Vec<u16> = pods.iter().filter_map(|p| self.serving_port(p)).collect();
            if ports.len() == REPLICAS {
                break ports;
            }
            if tokio::time::Instant::now() > deadline {
                let state = self.kubectl(&["get", "pods,events", "-o", "wide"]);
                let logs: Vec<String> = pods
                    .iter()
                    .map(|p| {
                        format!(
                            "{p}: {}",
                            self.cp()
                                .kubectl_with_stdin(&["-n", self.ns(), "logs", p], "")
                                .unwrap_or_else(|e| e.to_string())
                        )
                    })
                    .collect();
                panic!(
                    "no two serving webhook replicas after 120 s:\n{state}\n{}",
                    logs.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        self.balancer.set_backends(&ports);
    }

    /// The port `pod`'s `fence serve` logged it listens on.
    fn serving_port(&self, pod: &str) -> Option<u16> {
        let mut args = vec!["-n", self.ns(), "logs", pod];
        args.push("--tail=-1");
        let log = self.cp().kubectl_with_stdin(&args, "").ok()?;
        log.lines().find_map(|line| {
            let v: Value = serde_json::from_str(line).ok()?;
            (v["message"] == "fence serving").then_some(())?;
            v["addr"].as_str()?.rsplit(':').next()?.parse().ok()
        })
    }

    fn run(&self, args: &[&str]) -> String {
        let out = std::process::Command::new(&self.env.kube_leader)
            .args(args)
            .output()
            .expect("run kube-leader");
        assert!(
            out.status.success(),
            "kube-leader {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn kubectl(&self, args: &[&str]) -> String {
        self.kubectl_stdin(args, "")
    }

    fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> String {
        let mut all = vec!["-n", self.ns()];
        all.extend_from_slice(args);
        self.cp()
            .kubectl_with_stdin(&all, stdin)
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

impl Drop for Fenced {
    fn drop(&mut self) {
        // failurePolicy Fail outlives the namespace's Pods otherwise.
        for kind in ["validatingwebhookconfiguration", "mutatingwebhookconfiguration"] {
            let _ = self
                .cp()
                .kubectl_with_stdin(&["delete", kind, &self.webhooks(), "--ignore-not-found"], "");
        }
    }
}

/// The test's changes to deploy/fence/deployment.yaml (see the module documentation).
fn for_the_node(deployment: &mut Value, env: &NodeEnv, apiserver_port: u16) {
    let spec = &mut deployment["spec"]["template"]["spec"];
    spec["hostNetwork"] = json!(true);
    let container = &mut spec["containers"][0];
    container["image"] = json!(env.image);
    container["imagePullPolicy"] = json!("Never");
    container["env"] = json!([
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": apiserver_port.to_string()},
    ]);
    let args = container["args"].as_array_mut().expect("args");
    let i = args.iter().position(|a| a == "--listen").expect("--listen");
    args[i + 1] = json!("127.0.0.1:0");
    let container = container.as_object_mut().expect("an object");
    for key in ["ports", "readinessProbe", "livenessProbe"] {
        container.remove(key);
    }
}

fn shipped_rules(repo: &std::path::Path) -> String {
    std::fs::read_to_string(repo.join("deploy/fence/rules.yaml")).expect("deploy/fence/rules.yaml")
}

/// A Deployment the shipped rules fence (its label), scaled to 0: nothing runs.
fn fenced_deployment(name: &str) -> Deployment {
    let mut d = unfenced_deployment(name);
    d.metadata.labels = Some([("app.kubernetes.io/managed-by".to_owned(), OPERATOR.to_owned())].into());
    d
}

fn unfenced_deployment(name: &str) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": "localhost/none:0"}]},
            },
        },
    }))
    .expect("a Deployment")
}

/// `write` until it reaches a webhook replica: the API server's connection to a replica
/// that just stopped fails once ("failed calling webhook"), as behind a Service whose
/// endpoints lag; what it came to, and how many tries met a stopped replica.
async fn reaching<F, Fut>(mut write: F) -> (kube::Result<Deployment>, usize)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = kube::Result<Deployment>>,
{
    let mut retried = 0;
    loop {
        match write().await {
            Err(kube::Error::Api(s)) if s.message.contains("failed calling webhook") && retried < 50 => {
                retried += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(d) => return (Ok(d), retried),
            Err(e) => return (Err(e), retried),
        }
    }
}

/// Writes `value` into the fenced Deployment's annotation through `client` (a merge patch).
async fn annotate(client: &Client, ns: &str, value: &str) -> kube::Result<Deployment> {
    let patch = json!({"metadata": {"annotations": {"example.com/value": value}}});
    Api::<Deployment>::namespaced(client.clone(), ns)
        .patch("orders", &PatchParams::default(), &Patch::Merge(patch))
        .await
}

fn stamp(d: &Deployment) -> Option<String> {
    d.metadata
        .annotations
        .as_ref()?
        .get(FENCED_TOKEN_ANNOTATION)
        .cloned()
}

/// The message of a write the fence must refuse (a 403).
fn refusal(r: kube::Result<Deployment>) -> String {
    match r {
        Err(kube::Error::Api(s)) if s.code == 403 => s.message,
        other => panic!("the fence should have refused the write: {other:?}"),
    }
}
