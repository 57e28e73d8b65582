//! kube-leader on a real kubelet node: `deploy/` applied as shipped, Pods that run.
//!
//! One node ([`Node::shared`]) serves every test of this binary; where the machine cannot run
//! one, each test returns at once after one printed line says why.
//!
//! # What the tests change in `deploy/`
//!
//! The objects of `deploy/for-life` and `deploy/lease` (what `kubectl apply -k` applies: RBAC, the
//! Deployment, its PodDisruptionBudget as `policy/v1beta1` on 1.20) are applied with these
//! changes to the Deployment only, all forced by one node with no Pod network and no registry:
//! - `image`: the node-test image (`scripts/image.sh node-test`: the kube-leader image with this
//!   build's binary, whose `sleep` is the instrumented workload `scripts/images/workload.c`),
//!   `imagePullPolicy: Never`;
//! - `hostNetwork: true`, with `KUBERNETES_SERVICE_HOST=127.0.0.1` and `KUBERNETES_SERVICE_PORT`
//!   set to the API server's port (no Service IPs, no kube-proxy);
//! - hostNetwork Pods on one node share its ports: three replicas of one template cannot each
//!   serve a fixed status port (the scheduler would not even place a second Pod with the same
//!   host port), so `--status-addr` becomes `127.0.0.1:0` (each replica gets a free port, found
//!   in its log), and the `ports` and the two HTTP probes that name it go.
//!
//! For the Lease strategy `POD_NAMESPACE` is dropped, so the namespace must come from the
//! service-account mount. A LimitRange in the test's namespace gives containers an
//! ephemeral-storage limit (4 MiB) that the eviction test exceeds.
//!
//! COMMAND, `sh -c 'echo ...; exec sleep infinity'`, is kept: the image's `sleep` writes
//! start/stop records stamped with CLOCK_MONOTONIC to the container log, which the tests read
//! from `/var/log/pods` and feed to the chaos run's checker ([`History`]).

use std::{
    collections::{BTreeMap, HashMap},
    io::{Read, Seek, SeekFrom, Write as _},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, OnceLock,
    },
    time::Duration,
};

use k8s_openapi::api::core::v1::{Node as NodeObject, Pod};
use kube::{api::ListParams, Api};
use kube_leader_e2e::{checker::History, kube_leader_bin_beside, mono_ns, wait_for};
use kube_leader_testenv::Node;
use serde_json::{json, Value};

/// The lock name in `deploy/base/deployment.yaml`.
const LOCK: &str = "kube-leader-demo";
/// The Deployment's name in `deploy/base/deployment.yaml`.
const DEPLOYMENT: &str = "kube-leader-demo";
/// The container's name in `deploy/base/deployment.yaml`.
const CONTAINER: &str = "app";
const REPLICAS: usize = 3;

/// Tests that only use the node share it; the test that stops the kubelet has it alone.
static NODE_USE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Strategy {
    ForLife,
    Lease,
}

impl Strategy {
    fn flag(self) -> &'static str {
        match self {
            Strategy::ForLife => "for-life",
            Strategy::Lease => "lease",
        }
    }
}

// === the tests ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_for_life_on_a_real_node() {
    let Some(env) = NodeEnv::get() else { return };
    let _shared = NODE_USE.read().await;
    scenario(env, Strategy::ForLife).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_on_a_real_node() {
    let Some(env) = NodeEnv::get() else { return };
    let _shared = NODE_USE.read().await;
    scenario(env, Strategy::Lease).await;
}

/// The kubelet stops (node NotReady, containers keep running): no second leader with either
/// strategy, and the same leaders lead when it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_stopped_no_second_leader() {
    let Some(env) = NodeEnv::get() else { return };
    let _alone = NODE_USE.write().await;
    let for_life = Deployed::apply(env, Strategy::ForLife).await;
    let lease = Deployed::apply(env, Strategy::Lease).await;
    let leaders = [for_life.leader_after(0).await, lease.leader_after(0).await];

    let stopped = mono_ns();
    let kubelet = KubeletStopped::stop(env.node);
    let client = env.node.control_plane().client().await;
    let nodes = Api::<NodeObject>::all(client);
    wait_for("the node to turn NotReady", Duration::from_secs(60), || async {
        let node = nodes.get(env.node.name()).await.ok()?;
        let ready = node
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Ready")?;
        (ready.status != "True").then_some(())
    })
    .await;
    let not_ready = mono_ns();
    say(&format!(
        "kubelet stopped → node NotReady: {}",
        ms(not_ready - stopped)
    ));
    // Past the Lease's duration (15 s): a renewing leader keeps it, a leader for life is never
    // replaced on a NotReady node by default.
    tokio::time::sleep(Duration::from_secs(16)).await;
    for (deployed, leader) in [&for_life, &lease].into_iter().zip(&leaders) {
        let records = deployed.logs.records();
        let later: Vec<&Record> = records
            .iter()
            .filter(|r| r.kind == "start" && r.mono_ns > stopped)
            .collect();
        assert!(
            later.is_empty(),
            "{:?}: a COMMAND started while the kubelet was stopped: {later:?}",
            deployed.strategy
        );
        // No exec without the kubelet: the status servers and `kube-leader status` say it.
        deployed
            .one_leader(leader, false)
            .await
            .unwrap_or_else(|problem| {
                panic!("{:?} while the kubelet was stopped: {problem}", deployed.strategy)
            });
    }

    let restarted = mono_ns();
    kubelet.start().await;
    say(&format!(
        "kubelet started again → node Ready: {}",
        ms(mono_ns() - restarted)
    ));
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (deployed, leader) in [&for_life, &lease].into_iter().zip(&leaders) {
        deployed.assert_one_leader(leader).await;
    }
}

/// The kubelet stopped; started again when dropped, also when the test fails, so that the tests
/// after it find a Ready node.
struct KubeletStopped(Option<&'static Node>);

impl KubeletStopped {
    fn stop(node: &'static Node) -> Self {
        node.stop_kubelet();
        Self(Some(node))
    }

    async fn start(mut self) {
        let node = self.0.take().expect("stopped");
        node.start_kubelet().await.expect("the kubelet starts again");
    }
}

impl Drop for KubeletStopped {
    fn drop(&mut self) {
        if let Some(node) = self.0.take() {
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                runtime.block_on(node.start_kubelet())
            })
            .join()
            .expect("no panic")
            .expect("the kubelet starts again");
        }
    }
}

/// Every behaviour in order, on one Deployment of `deploy/` per strategy.
async fn scenario(env: &'static NodeEnv, strategy: Strategy) {
    let deployed = Deployed::apply(env, strategy).await;
    let s = strategy.flag();

    // 3 replicas: exactly one COMMAND runs, and everything names the same Pod.
    let leader = deployed.leader_after(0).await;
    deployed.assert_one_leader(&leader).await;
    let start = deployed.logs.starts_of(&leader).pop().expect("a start record");
    assert_eq!(
        start.identity, leader,
        "identity from the Downward API (POD_NAME)"
    );
    assert_eq!(
        start.namespace,
        deployed.namespace(),
        "namespace from {}",
        if strategy == Strategy::Lease {
            "the service-account mount"
        } else {
            "POD_NAMESPACE"
        }
    );
    say(&format!("{s}: 3 replicas, one COMMAND, in {leader}"));

    // kubectl delete pod <leader>: SIGTERM stops COMMAND, the lock is freed, the next leader's
    // COMMAND starts.
    let deleted = mono_ns();
    deployed.kubectl(&["delete", "pod", &leader, "--wait=false"]);
    let next = deployed.leader_after(deleted).await;
    assert_ne!(next, leader);
    let stop = deployed
        .logs
        .stops_of(&leader)
        .into_iter()
        .find(|r| r.mono_ns > deleted)
        .expect("the deleted leader's COMMAND wrote a stop record");
    assert_eq!(stop.signal, Some(15), "COMMAND stopped by SIGTERM");
    // The old leader stepped down: a lease released, a leader-for-life lock deleted by its
    // holder (it saw its Pod being deleted, stopped COMMAND, then deleted the lock rather than
    // leave it to the garbage collector once the Pod object is gone, seconds later).
    wait_for(
        "the old leader to release its lock",
        Duration::from_secs(10),
        || async { deployed.logs.logged(&leader, "released the lock").then_some(()) },
    )
    .await;
    let next_start = deployed.start_after(&next, deleted);
    say(&format!(
        "{s}: kubectl delete pod → old COMMAND stopped (SIGTERM) {}, next leader's COMMAND {}",
        ms(stop.mono_ns - deleted),
        ms(next_start - deleted)
    ));
    deployed.assert_one_leader(&next).await;
    let leader = next;

    // COMMAND crashes (exit 1): the container restarts in place.
    let crashed = mono_ns();
    deployed.exec(&leader, &["killall", "-USR1", "sleep"]);
    let restarted_in_place = wait_for(
        "the crashed container to restart",
        Duration::from_secs(60),
        || async { (deployed.restart_count(&leader).await >= 1).then_some(()) },
    );
    restarted_in_place.await;
    let after_crash = deployed.leader_after(crashed).await;
    let after_crash_start = deployed.start_after(&after_crash, crashed);
    match strategy {
        // operator-sdk semantics: the restarted container continues on its own lock.
        Strategy::ForLife => assert_eq!(after_crash, leader, "leader for life continues on its lock"),
        // The crashed leader released its lease; whoever leads, only one does.
        Strategy::Lease => {}
    }
    say(&format!(
        "{s}: COMMAND crashed → COMMAND again in {} ({}) after {}",
        after_crash,
        if after_crash == leader {
            "the same Pod, restarted in place"
        } else {
            "another Pod"
        },
        ms(after_crash_start - crashed)
    ));
    deployed.history().report(mono_ns()).assert_safe();
    deployed.assert_one_leader(&after_crash).await;
    let leader = after_crash;

    // A real kubelet eviction of the leader: ephemeral-storage limit exceeded.
    let filled = mono_ns();
    deployed.exec(&leader, &["killall", "-USR2", "sleep"]);
    let evicted = deployed.wait_evicted(&leader).await;
    let next = deployed.leader_after(filled).await;
    assert_ne!(next, leader);
    let next_start = deployed.start_after(&next, filled);
    // The kubelet kills an evicted Pod's containers with grace period 0 (SIGKILL) for a limit
    // eviction; a leader for life that saw its own Pod fail stopped COMMAND gracefully before.
    let end = deployed
        .logs
        .end_of(&leader, filled)
        .expect("the evicted leader's COMMAND ended");
    say(&format!(
        "{s}: eviction: limit exceeded → Pod Failed/Evicted seen {}, old COMMAND ended ({}) {}, next leader's COMMAND {} (old COMMAND ended → next leader {})",
        ms(evicted - filled),
        match end.kind.as_str() {
            "gone" => "killed: no stop record".to_owned(),
            kind => format!("{kind} record, signal {:?}", end.signal),
        },
        ms(end.mono_ns - filled),
        ms(next_start - filled),
        ms(next_start.saturating_sub(end.mono_ns)),
    ));
    deployed.history().report(mono_ns()).assert_safe();
    let leader = next;

    // kubectl rollout restart: leadership moves to a new Pod, never two COMMANDs at once.
    let rollout = mono_ns();
    deployed.kubectl(&["rollout", "restart", "deployment", DEPLOYMENT]);
    deployed.kubectl(&["rollout", "status", "deployment", DEPLOYMENT, "--timeout=180s"]);
    let new_leader = deployed.leader_after(rollout).await;
    assert_ne!(
        new_leader, leader,
        "leadership moved to a Pod of the new ReplicaSet"
    );
    wait_for("the old Pods to be gone", Duration::from_secs(120), || async {
        let pods = deployed.pods().await;
        let terminating = pods.iter().any(|p| p.metadata.deletion_timestamp.is_some());
        let running = pods.iter().filter(|p| phase(p) == "Running").count();
        (!terminating && running == REPLICAS).then_some(())
    })
    .await;
    let done = mono_ns();
    let report = deployed.history().report_window(rollout, done);
    report.assert_safe();
    say(&format!(
        "{s}: rollout restart: {} transition(s), longest leaderless gap {}, rollout took {}",
        report.transitions,
        report.longest_gap.map_or("none".to_owned(), |g| ms(g.len_ns())),
        ms(done - rollout)
    ));
    deployed.assert_one_leader(&new_leader).await;
    deployed.history().report(mono_ns()).assert_safe();
}

// === the shared node and image ===

struct NodeEnv {
    node: &'static Node,
    image: String,
    kube_leader: PathBuf,
    repo: PathBuf,
}

impl NodeEnv {
    /// The shared node with the node-test image imported; `None` (after one printed line) where
    /// the machine cannot run a node.
    fn get() -> Option<&'static NodeEnv> {
        static ENV: OnceLock<NodeEnv> = OnceLock::new();
        let node = Node::shared()?;
        Some(ENV.get_or_init(|| {
            let kube_leader = std::env::var_os("KUBE_LEADER_NODE_BINARY")
                .map(PathBuf::from)
                .unwrap_or_else(|| kube_leader_bin_beside(env!("CARGO_BIN_EXE_lease-candidate")));
            let image = node
                .build_image(&["node-test", "--binary", &kube_leader.to_string_lossy()])
                .unwrap_or_else(|e| panic!("could not build the node-test image: {e}"));
            say(&format!(
                "node {} ready in {}; image {image} ({})",
                node.name(),
                ms(node.started_in().as_nanos() as u64),
                kube_leader.display()
            ));
            NodeEnv {
                node,
                image,
                kube_leader,
                repo: Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned(),
            }
        }))
    }
}

// === one Deployment of deploy/ ===

struct Deployed {
    env: &'static NodeEnv,
    strategy: Strategy,
    namespace: kube_leader_testenv::TestNamespace,
    logs: PodLogs,
}

impl Deployed {
    /// Applies `deploy/` (RBAC of the strategy, the Deployment) into a new namespace and waits
    /// until its three Pods run and one of them leads.
    async fn apply(env: &'static NodeEnv, strategy: Strategy) -> Self {
        let control_plane = env.node.control_plane();
        let namespace = control_plane.namespace().await;
        let logs = PodLogs::tail(env.node.pod_log_dir(), namespace.name());
        let deployed = Deployed {
            env,
            strategy,
            namespace,
            logs,
        };
        let overlay = match strategy {
            Strategy::ForLife => "deploy/for-life",
            Strategy::Lease => "deploy/lease",
        };
        let mut objects = Vec::new();
        let limits = json!({
            "apiVersion": "v1", "kind": "LimitRange",
            "metadata": {"name": "ephemeral-storage"},
            "spec": {"limits": [{"type": "Container", "default": {"ephemeral-storage": "4Mi"}}]},
        });
        objects.push(limits);
        for mut object in deployed.manifest(overlay) {
            if object["kind"] == "Deployment" {
                for_the_node(&mut object, strategy, &env.image, control_plane.apiserver_port());
            }
            objects.push(object);
        }
        // The ServiceAccount's token Secret must exist before its Pods are admitted.
        let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
        deployed.kubectl_stdin(&["apply", "-f", "-"], &list.to_string());
        let applied = mono_ns();
        deployed.kubectl(&[
            "wait",
            "--for=condition=Available",
            &format!("deployment/{DEPLOYMENT}"),
            "--timeout=120s",
        ]);
        wait_for("3 running Pods", Duration::from_secs(120), || async {
            let pods = deployed.pods().await;
            (pods.len() == REPLICAS && pods.iter().all(|p| phase(p) == "Running")).then_some(())
        })
        .await;
        let leader = deployed.leader_after(0).await;
        say(&format!(
            "{}: deploy/ applied → 3 Pods running and {leader}'s COMMAND started in {}",
            strategy.flag(),
            ms(deployed.start_after(&leader, 0) - applied)
        ));
        deployed
    }

    fn namespace(&self) -> &str {
        self.namespace.name()
    }

    /// The objects that `kubectl apply -k <kustomization>` applies, as JSON; the
    /// PodDisruptionBudget as `policy/v1beta1`, as `deploy/base/pdb.yaml` says for 1.20.
    fn manifest(&self, kustomization: &str) -> Vec<Value> {
        let path = self.env.repo.join(kustomization);
        let yaml = self.kubectl(&["kustomize", &path.to_string_lossy()]);
        let yaml = yaml.replace("apiVersion: policy/v1\n", "apiVersion: policy/v1beta1\n");
        let out = self.kubectl_stdin(&["create", "--dry-run=client", "-o", "json", "-f", "-"], &yaml);
        // One JSON document per object (or a List).
        serde_json::Deserializer::from_str(&out)
            .into_iter::<Value>()
            .map(|value| value.expect("kubectl prints JSON"))
            .flat_map(|value| match value["kind"].as_str() {
                Some("List") => value["items"].as_array().cloned().unwrap_or_default(),
                _ => vec![value],
            })
            .collect()
    }

    fn kubectl(&self, args: &[&str]) -> String {
        self.kubectl_stdin(args, "")
    }

    fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> String {
        let mut all = vec!["-n", self.namespace()];
        all.extend_from_slice(args);
        self.env
            .node
            .control_plane()
            .kubectl_with_stdin(&all, stdin)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn exec(&self, pod: &str, command: &[&str]) -> String {
        let mut args = vec!["exec", pod, "-c", CONTAINER, "--"];
        args.extend_from_slice(command);
        self.kubectl(&args)
    }

    async fn pods(&self) -> Vec<Pod> {
        let client = self.env.node.control_plane().client().await;
        Api::<Pod>::namespaced(client, self.namespace())
            .list(&ListParams::default())
            .await
            .expect("list Pods")
            .items
    }

    async fn restart_count(&self, pod: &str) -> i32 {
        let client = self.env.node.control_plane().client().await;
        Api::<Pod>::namespaced(client, self.namespace())
            .get(pod)
            .await
            .ok()
            .and_then(|p| p.status?.container_statuses?.first().map(|c| c.restart_count))
            .unwrap_or(0)
    }

    /// Waits until `pod` is Failed with reason Evicted; when that was seen.
    async fn wait_evicted(&self, pod: &str) -> u64 {
        let client = self.env.node.control_plane().client().await;
        let pods = Api::<Pod>::namespaced(client, self.namespace());
        wait_for(
            &format!("Pod {pod} to be evicted"),
            Duration::from_secs(90),
            || async {
                // DeleteEvicted (the default) may delete the Pod right after: a Pod that is gone
                // after its COMMAND stopped was evicted too, if the kubelet said so.
                let status = pods.get_opt(pod).await.ok()?.and_then(|p| p.status);
                match status {
                    Some(s)
                        if s.phase.as_deref() == Some("Failed") && s.reason.as_deref() == Some("Evicted") =>
                    {
                        Some(mono_ns())
                    }
                    Some(_) => None,
                    None => self.evicted_event(pod).then(mono_ns),
                }
            },
        )
        .await
    }

    fn evicted_event(&self, pod: &str) -> bool {
        !self
            .kubectl(&[
                "get",
                "events",
                "--field-selector",
                &format!("involvedObject.name={pod},reason=Evicted"),
                "-o",
                "name",
            ])
            .trim()
            .is_empty()
    }

    /// The one Pod whose COMMAND started after `after` (CLOCK_MONOTONIC ns) and still runs, by
    /// the workload's records; waits up to 90 s for there to be exactly one.
    async fn leader_after(&self, after: u64) -> String {
        wait_for(
            &format!("{:?}: a COMMAND started after {after}", self.strategy),
            Duration::from_secs(90),
            || async {
                let records = self.logs.records();
                let running = running_terms(&records);
                let started: Vec<&String> = running
                    .iter()
                    .filter(|(_, &start)| start > after)
                    .map(|(pod, _)| pod)
                    .collect();
                match started.as_slice() {
                    [one] => Some((*one).clone()),
                    _ => None,
                }
            },
        )
        .await
    }

    /// When `pod`'s first COMMAND after `after` started.
    fn start_after(&self, pod: &str, after: u64) -> u64 {
        self.logs
            .starts_of(pod)
            .into_iter()
            .map(|r| r.mono_ns)
            .find(|&t| t > after)
            .expect("a start record")
    }

    /// Asks every Pod whether its COMMAND runs (exec: `pidof sleep`) and whether it leads
    /// (its status server's `/leader`), asks `kube-leader status`; all must name `leader` alone.
    /// Followers learn of a new leader from a watch: this waits up to 15 s for them to agree.
    async fn assert_one_leader(&self, leader: &str) {
        let mut last = String::new();
        for _ in 0..30 {
            match self.one_leader(leader, true).await {
                Ok(()) => {
                    self.history().report(mono_ns()).assert_safe();
                    return;
                }
                Err(problem) => last = problem,
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        panic!("{:?}: not exactly one leader ({leader}): {last}", self.strategy);
    }

    /// Whether everything names `leader` alone; with `exec`, COMMAND is looked for in every Pod
    /// too (needs the kubelet).
    async fn one_leader(&self, leader: &str, exec: bool) -> Result<(), String> {
        if exec {
            let running = self.running_commands().await;
            if running != [leader] {
                return Err(format!("COMMAND runs in {running:?}"));
            }
        }
        let mut leading = Vec::new();
        for pod in self.pods().await {
            let name = pod.metadata.name.clone().unwrap_or_default();
            if phase(&pod) != "Running" || pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let addr = self
                .logs
                .status_addr(&name)
                .ok_or_else(|| format!("{name} logged no status server address yet"))?;
            let answer = http_get(&addr, "/leader").await?;
            let answer: Value =
                serde_json::from_str(&answer).map_err(|e| format!("{name} /leader: {e}: {answer}"))?;
            if answer["is_leader"] == true {
                leading.push(name.clone());
            }
            if answer["holder"] != leader {
                return Err(format!(
                    "{name}'s /leader names {} as the holder",
                    answer["holder"]
                ));
            }
        }
        if leading != [leader] {
            return Err(format!("status servers that say they lead: {leading:?}"));
        }
        let holder = self.status_holder().await;
        if holder.as_deref() != Some(leader) {
            return Err(format!("kube-leader status names {holder:?}"));
        }
        Ok(())
    }

    /// The running Pods in which COMMAND runs, asked by exec.
    async fn running_commands(&self) -> Vec<String> {
        let mut running = Vec::new();
        for pod in self.pods().await {
            let name = pod.metadata.name.clone().unwrap_or_default();
            if phase(&pod) != "Running" || pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let mut args = vec!["-n", self.namespace(), "exec", &name, "-c", CONTAINER, "--"];
            args.extend(["pidof", "sleep"]);
            if self
                .env
                .node
                .control_plane()
                .kubectl_with_stdin(&args, "")
                .is_ok()
            {
                running.push(name);
            }
        }
        running
    }

    /// The holder `kube-leader status` names, run on the host with the admin kubeconfig.
    async fn status_holder(&self) -> Option<String> {
        let out = tokio::process::Command::new(&self.env.kube_leader)
            .args([
                "status",
                "--lock",
                LOCK,
                "--namespace",
                self.namespace(),
                "--strategy",
                self.strategy.flag(),
                "-o",
                "json",
            ])
            .env("KUBECONFIG", self.env.node.control_plane().kubeconfig_path())
            .output()
            .await
            .expect("run kube-leader status");
        assert!(
            out.status.success(),
            "kube-leader status: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let value: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        value["holder"].as_str().map(str::to_owned)
    }

    /// The workload's own start and stop records as the checker's history; a COMMAND killed
    /// by SIGKILL (no record) ends when its process was seen gone.
    fn history(&self) -> History {
        let mut history = History::new();
        let mut open = std::collections::HashSet::new();
        for record in self.logs.records() {
            match record.kind.as_str() {
                "start" => {
                    open.insert(record.pod.clone());
                    history.began(&record.pod, record.mono_ns);
                }
                "stop" | "crash" | "gone" if open.remove(&record.pod) => {
                    history.ended(&record.pod, record.mono_ns);
                }
                _ => {}
            }
        }
        history
    }
}

/// The test's changes to `deploy/base/deployment.yaml` (see the module's documentation).
fn for_the_node(deployment: &mut Value, strategy: Strategy, image: &str, apiserver_port: u16) {
    let spec = &mut deployment["spec"]["template"]["spec"];
    spec["hostNetwork"] = json!(true);
    for container in spec["containers"].as_array_mut().expect("containers") {
        container["image"] = json!(image);
        container["imagePullPolicy"] = json!("Never");
        let env = container["env"].as_array_mut().expect("env");
        if strategy == Strategy::Lease {
            env.retain(|e| e["name"] != "POD_NAMESPACE");
        }
        env.push(json!({"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}));
        env.push(json!({"name": "KUBERNETES_SERVICE_PORT", "value": apiserver_port.to_string()}));
        let args = container["args"].as_array_mut().expect("args");
        if let Some(i) = args.iter().position(|a| a == "--status-addr") {
            args[i + 1] = json!("127.0.0.1:0");
        }
        let container = container.as_object_mut().expect("an object");
        for key in ["ports", "readinessProbe", "livenessProbe"] {
            container.remove(key);
        }
    }
}

fn phase(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

/// For each Pod whose last record is a start: that start (CLOCK_MONOTONIC ns).
fn running_terms(records: &[Record]) -> BTreeMap<String, u64> {
    let mut running = BTreeMap::new();
    for record in records {
        match record.kind.as_str() {
            "start" => {
                running.insert(record.pod.clone(), record.mono_ns);
            }
            "stop" | "crash" | "gone" => {
                running.remove(&record.pod);
            }
            _ => {}
        }
    }
    running
}

/// `GET path` on a status server (127.0.0.1: hostNetwork).
async fn http_get(addr: &str, path: &str) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        std::io::Result::Ok(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .map_err(|_| format!("GET {addr}{path} timed out"))?
        .map_err(|e| format!("GET {addr}{path}: {e}"))?;
    Ok(response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or(response))
}

// === the containers' logs ===

/// One record of the test workload.
#[derive(Clone, Debug)]
struct Record {
    pod: String,
    kind: String,
    mono_ns: u64,
    identity: String,
    namespace: String,
    signal: Option<i32>,
}

#[derive(Debug, Default)]
struct LogState {
    /// Read offset and unfinished line per log file.
    files: HashMap<PathBuf, (u64, String)>,
    /// Every record, in the order read (per file in order; files in CLOCK order via `mono_ns`).
    records: Vec<Record>,
    /// The last status server address each Pod logged.
    status_addrs: HashMap<String, String>,
    /// kube-leader's log messages per Pod.
    messages: HashMap<String, Vec<String>>,
    /// The workload processes alive at the last look at `/proc`: host pid → (Pod, start time).
    alive: HashMap<u32, (String, String)>,
}

/// Tails the logs of one namespace's containers in `/var/log/pods` every 50 ms, keeping what
/// it read after the kubelet removes them.
struct PodLogs {
    state: Arc<Mutex<LogState>>,
    stop: Arc<AtomicBool>,
}

impl PodLogs {
    fn tail(dir: &'static Path, namespace: &str) -> Self {
        let state = Arc::new(Mutex::new(LogState::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let prefix = format!("{namespace}_");
        {
            let state = state.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let namespace = prefix.trim_end_matches('_').to_owned();
                while !stop.load(Ordering::Relaxed) {
                    let mut state = state.lock().unwrap();
                    poll_logs(dir, &prefix, &mut state);
                    poll_processes(&namespace, &mut state);
                    drop(state);
                    std::thread::sleep(Duration::from_millis(50));
                }
            });
        }
        Self { state, stop }
    }

    fn records(&self) -> Vec<Record> {
        let mut records = self.state.lock().unwrap().records.clone();
        records.sort_by_key(|r| r.mono_ns);
        records
    }

    fn starts_of(&self, pod: &str) -> Vec<Record> {
        self.records()
            .into_iter()
            .filter(|r| r.pod == pod && r.kind == "start")
            .collect()
    }

    fn stops_of(&self, pod: &str) -> Vec<Record> {
        self.records()
            .into_iter()
            .filter(|r| r.pod == pod && r.kind == "stop")
            .collect()
    }

    /// The first record after `after` that says `pod`'s COMMAND ended: stop, crash, or gone
    /// (its process disappeared without a record: SIGKILL).
    fn end_of(&self, pod: &str, after: u64) -> Option<Record> {
        self.records().into_iter().find(|r| {
            r.pod == pod && r.mono_ns > after && matches!(r.kind.as_str(), "stop" | "crash" | "gone")
        })
    }

    /// Whether kube-leader in `pod` logged `message`.
    fn logged(&self, pod: &str, message: &str) -> bool {
        self.state
            .lock()
            .unwrap()
            .messages
            .get(pod)
            .is_some_and(|m| m.iter().any(|m| m == message))
    }

    fn status_addr(&self, pod: &str) -> Option<String> {
        self.state.lock().unwrap().status_addrs.get(pod).cloned()
    }
}

impl Drop for PodLogs {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn poll_logs(dir: &Path, prefix: &str, state: &mut LogState) {
    let Ok(pods) = std::fs::read_dir(dir) else { return };
    for pod_dir in pods.flatten() {
        let name = pod_dir.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(prefix) else {
            continue;
        };
        // <namespace>_<pod>_<uid>
        let Some((pod, _uid)) = rest.rsplit_once('_') else {
            continue;
        };
        let Ok(files) = std::fs::read_dir(pod_dir.path().join(CONTAINER)) else {
            continue;
        };
        let mut files: Vec<PathBuf> = files.flatten().map(|f| f.path()).collect();
        files.sort();
        for file in files {
            let (offset, partial) = state.files.entry(file.clone()).or_default();
            let Ok(mut f) = std::fs::File::open(&file) else {
                continue;
            };
            if f.seek(SeekFrom::Start(*offset)).is_err() {
                continue;
            }
            let mut bytes = Vec::new();
            let Ok(n) = f.read_to_end(&mut bytes) else {
                continue;
            };
            *offset += n as u64;
            partial.push_str(&String::from_utf8_lossy(&bytes));
            let complete = match partial.rfind('\n') {
                Some(i) => {
                    let rest = partial.split_off(i + 1);
                    std::mem::replace(partial, rest)
                }
                None => continue,
            };
            for line in complete.lines() {
                // CRI log format: <time> <stream> <P|F> <text>
                let mut fields = line.splitn(4, ' ');
                let (Some(_), Some(_), Some(_), Some(text)) =
                    (fields.next(), fields.next(), fields.next(), fields.next())
                else {
                    continue;
                };
                if let Some(record) = parse_record(pod, text) {
                    state.records.push(record);
                } else if let Ok(log) = serde_json::from_str::<Value>(text) {
                    let message = log["message"].as_str().unwrap_or_default();
                    if message == "status server listening" {
                        if let Some(addr) = log["addr"].as_str() {
                            state.status_addrs.insert(pod.to_owned(), addr.to_owned());
                        }
                    }
                    state
                        .messages
                        .entry(pod.to_owned())
                        .or_default()
                        .push(message.to_owned());
                }
            }
        }
    }
}

/// Notes when a workload process of `namespace` disappears from `/proc` (a SIGKILL leaves no
/// record): a `gone` record at the time it was first seen missing (within 50 ms).
fn poll_processes(namespace: &str, state: &mut LogState) {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    let mut seen = HashMap::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let path = entry.path();
        if std::fs::read_to_string(path.join("comm")).map_or(true, |c| c.trim() != "sleep") {
            continue;
        }
        let Ok(environ) = std::fs::read(path.join("environ")) else {
            continue;
        };
        let mut pod = None;
        let mut in_namespace = false;
        for var in environ.split(|&b| b == 0) {
            let var = String::from_utf8_lossy(var);
            if let Some(identity) = var.strip_prefix("KUBE_LEADER_IDENTITY=") {
                pod = Some(identity.to_owned());
            } else if var.strip_prefix("KUBE_LEADER_NAMESPACE=") == Some(namespace) {
                in_namespace = true;
            }
        }
        let (Some(pod), true) = (pod, in_namespace) else {
            continue;
        };
        // Field 22 of stat: the start time, which tells a reused pid from the same process.
        let started = std::fs::read_to_string(path.join("stat"))
            .ok()
            .and_then(|stat| {
                stat.rsplit_once(')')
                    .map(|(_, rest)| rest.split_whitespace().nth(19).unwrap_or("").to_owned())
            })
            .unwrap_or_default();
        seen.insert(pid, (pod, started));
    }
    let now = mono_ns();
    for (pid, (pod, started)) in std::mem::take(&mut state.alive) {
        if seen.get(&pid).is_none_or(|(_, s)| *s != started) {
            state.records.push(Record {
                pod,
                kind: "gone".into(),
                mono_ns: now,
                identity: String::new(),
                namespace: namespace.to_owned(),
                signal: None,
            });
        }
    }
    state.alive = seen;
}

fn parse_record(pod: &str, text: &str) -> Option<Record> {
    let rest = text.strip_prefix("kl-workload ")?;
    let mut words = rest.split_whitespace();
    let kind = words.next()?.to_owned();
    let fields: HashMap<&str, &str> = words.filter_map(|w| w.split_once('=')).collect();
    Some(Record {
        pod: pod.to_owned(),
        kind,
        mono_ns: fields.get("mono_ns")?.parse().ok()?,
        identity: fields.get("identity").copied().unwrap_or_default().to_owned(),
        namespace: fields.get("namespace").copied().unwrap_or_default().to_owned(),
        signal: fields.get("signal").and_then(|s| s.parse().ok()),
    })
}

// === output ===

/// Prints a measurement past the test harness's output capture.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "node: {line}");
}

fn ms(ns: u64) -> String {
    format!("{:.0} ms", ns as f64 / 1e6)
}

#[test]
fn records_parse() {
    let r = parse_record(
        "p-1",
        "kl-workload start mono_ns=12 pid=7 identity=p-1 namespace=ns token=42",
    )
    .unwrap();
    assert_eq!(
        (
            r.kind.as_str(),
            r.mono_ns,
            r.identity.as_str(),
            r.namespace.as_str()
        ),
        ("start", 12, "p-1", "ns")
    );
    let r = parse_record("p-1", "kl-workload stop mono_ns=13 signal=15").unwrap();
    assert_eq!(r.signal, Some(15));
    assert!(parse_record("p-1", "leading as p-1").is_none());
}

#[test]
fn the_deployment_changes_are_only_those_documented() {
    let mut deployment = json!({
        "kind": "Deployment",
        "spec": {"template": {"spec": {
            "serviceAccountName": "kube-leader-for-life",
            "containers": [{
                "name": "app", "image": "x",
                "args": ["run", "--lock", "kube-leader-demo", "--status-addr", "0.0.0.0:4040", "--", "sh"],
                "env": [{"name": "POD_NAME"}, {"name": "POD_NAMESPACE"}],
                "ports": [{"containerPort": 4040}],
                "readinessProbe": {}, "livenessProbe": {},
                "resources": {"requests": {"cpu": "10m"}},
            }],
        }}},
    });
    for_the_node(&mut deployment, Strategy::Lease, "img", 6443);
    let spec = &deployment["spec"]["template"]["spec"];
    assert_eq!(spec["hostNetwork"], true);
    assert_eq!(
        spec["serviceAccountName"], "kube-leader-for-life",
        "the overlay's business"
    );
    let c = &spec["containers"][0];
    assert_eq!(c["image"], "img");
    assert_eq!(
        c["args"],
        json!([
            "run",
            "--lock",
            "kube-leader-demo",
            "--status-addr",
            "127.0.0.1:0",
            "--",
            "sh"
        ])
    );
    assert_eq!(c["env"].as_array().unwrap().len(), 3);
    assert!(c.get("ports").is_none() && c.get("readinessProbe").is_none());
    assert_eq!(c["resources"]["requests"]["cpu"], "10m");
}
