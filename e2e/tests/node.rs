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
//! - `image`: the node-test image (`scripts/image.sh node-test`: the static binary the image
//!   ships, `KUBE_LEADER_STATIC_AMD64`, or this build's; `sleep` is the instrumented workload
//!   `scripts/images/workload.c`) for the initContainer and the app container alike,
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
//!
//! # deploy/patterns
//!
//! `deploy/patterns/copy-from` and `deploy/patterns/init-container` run the same way with the
//! Dockerfile's scratch image and an app image that knows nothing of kube-leader (built with
//! buildah by `scripts/image.sh kube-leader|app|copy-from` from `KUBE_LEADER_STATIC_AMD64`),
//! COMMAND replaced by the app's program, without the LimitRange (the installed binary in the
//! emptyDir would pass it); the app's lines are the records.
//!
//! `deploy/patterns/native-sidecar` (`kube-leader elect` as a native sidecar beside a busybox
//! app that asks it who leads) runs with the node-test image for the sidecar and the busybox
//! stand-in (`scripts/image.sh busybox`) for the app, and one more change: a loopback address
//! per Pod for the status server, where the pattern's Pods each use `127.0.0.1:4040` in a
//! network namespace of their own (node/native_sidecar.rs).
//!
//! # client-go beside it
//!
//! The client-go candidate (`tools/go-candidate`: client-go 0.37's `leaderelection` on a Lease)
//! runs in the same shape: `deploy/lease` as above, with the container's image, command and
//! args swapped for the candidate's, and its ServiceAccount deploy/lease's elector (client-go
//! does not impersonate it as kube-leader does) (`scripts/image.sh go-candidate`; `--lease` the same lock,
//! `--namespace $(POD_NAMESPACE)` and `--identity $(POD_NAME)` from the Downward API, the same
//! 15 s / 10 s / 2 s), and the same three actions: `kubectl delete pod` on the leader, a
//! kubelet eviction, `kubectl rollout restart`. Its work starts and stops with its
//! `started_leading`/`stopped_leading` events (CLOCK_MONOTONIC), the same checker rules apply.

#[path = "node/fence.rs"]
mod fence;
#[path = "node/logs.rs"]
mod logs;
#[path = "node/native_sidecar.rs"]
mod native_sidecar;
#[path = "node/rounds.rs"]
mod rounds;

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    sync::OnceLock,
    time::Duration,
};

use k8s_openapi::api::{
    apps::v1::ReplicaSet,
    core::v1::{Event, Node as NodeObject, Pod},
};
use kube::{api::ListParams, Api};
use kube_leader_e2e::{checker::History, kube_leader_bin_beside, mono_ns, wait_for};
use kube_leader_testenv::Node;
use logs::{running_terms, PodLogs, Record, Work};
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

/// What runs in the Pods: kube-leader with one of its strategies, or the client-go candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Strategy {
    ForLife,
    Lease,
    /// client-go's `leaderelection` on a Lease (`tools/go-candidate`).
    ClientGo,
}

impl Strategy {
    /// The name in the test's output.
    fn label(self) -> &'static str {
        match self {
            Strategy::ForLife => "for-life",
            Strategy::Lease => "lease",
            Strategy::ClientGo => "client-go",
        }
    }

    /// The lock's kind as `kube-leader --strategy` names it.
    fn flag(self) -> &'static str {
        match self {
            Strategy::ForLife => "for-life",
            Strategy::Lease | Strategy::ClientGo => "lease",
        }
    }

    /// The processes that do the leader's work.
    fn work(self) -> Work {
        match self {
            Strategy::ForLife | Strategy::Lease => Work::WORKLOAD,
            Strategy::ClientGo => Work::GO_CANDIDATE,
        }
    }
}

/// A way into a user's Pod (deploy/patterns), with the Lease strategy of deploy/lease and an
/// image that knows nothing of kube-leader (`scripts/image.sh app`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pattern {
    /// `COPY --from=` the kube-leader image into the app image (`scripts/image.sh copy-from`).
    CopyFrom,
    /// An initContainer of the kube-leader image installs the binary into an emptyDir.
    InitContainer,
    /// `kube-leader elect` as a native sidecar (an initContainer with `restartPolicy: Always`)
    /// beside an app that asks it who leads (node/native_sidecar.rs).
    NativeSidecar,
}

impl Pattern {
    fn label(self) -> &'static str {
        match self {
            Pattern::CopyFrom => "copy-from",
            Pattern::InitContainer => "init-container",
            Pattern::NativeSidecar => "native-sidecar",
        }
    }

    fn kustomization(self) -> &'static str {
        match self {
            Pattern::CopyFrom => "deploy/patterns/copy-from",
            Pattern::InitContainer => "deploy/patterns/init-container",
            Pattern::NativeSidecar => "deploy/patterns/native-sidecar",
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

/// client-go's Lease election in the same Deployment shape, through the same actions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_go_on_a_real_node() {
    let Some(env) = NodeEnv::get() else { return };
    let _shared = NODE_USE.read().await;
    scenario(env, Strategy::ClientGo).await;
}

/// `kubectl delete pod` on the leader, round after round: a waiting candidate leads next, and
/// where the time goes (node/rounds.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_pod_rounds_for_life() {
    let Some(env) = NodeEnv::get() else { return };
    let _shared = NODE_USE.read().await;
    rounds::run(env, Strategy::ForLife).await;
}

/// The same rounds with the Lease strategy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_pod_rounds_lease() {
    let Some(env) = NodeEnv::get() else { return };
    let _shared = NODE_USE.read().await;
    rounds::run(env, Strategy::Lease).await;
}

/// The same rounds with client-go's Lease election, for comparison.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_pod_rounds_client_go() {
    let Some(env) = NodeEnv::get() else { return };
    let _shared = NODE_USE.read().await;
    rounds::run(env, Strategy::ClientGo).await;
}

/// deploy/patterns/copy-from on the node: the app image with kube-leader copied in by the
/// pattern's Dockerfile (built with buildah); one leader, and `kubectl delete pod` on it hands
/// over to a waiting candidate, round after round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_from_pattern_on_a_real_node() {
    let Some(env) = NodeEnv::get() else { return };
    let _shared = NODE_USE.read().await;
    pattern_scenario(env, Pattern::CopyFrom).await;
}

/// deploy/patterns/init-container on the node: the app image untouched, kube-leader installed
/// into an emptyDir by an initContainer of the scratch kube-leader image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_container_pattern_on_a_real_node() {
    let Some(env) = NodeEnv::get() else { return };
    let _shared = NODE_USE.read().await;
    pattern_scenario(env, Pattern::InitContainer).await;
}

async fn pattern_scenario(env: &'static NodeEnv, pattern: Pattern) {
    let deployed = Deployed::apply_pattern(env, pattern).await;
    let leader = deployed.leader_after(0).await;
    deployed.assert_one_leader(&leader).await;
    let start = deployed.logs.starts_of(&leader).pop().expect("a start record");
    assert_eq!(start.identity, leader, "the app runs as its Pod's candidate");
    if pattern == Pattern::InitContainer {
        // The app container runs kube-leader from the emptyDir; its image has none.
        let found = deployed.exec(
            &leader,
            &["sh", "-c", "ls /kube-leader; command -v kube-leader || true"],
        );
        assert_eq!(
            found.trim(),
            "kube-leader",
            "only /kube-leader/kube-leader: {found}"
        );
    }
    rounds::run_on(&deployed).await;
}

/// deploy/patterns/native-sidecar on the node (see the `native_sidecar` module): every
/// replica's app reports one leader; `kubectl delete pod` on it: its app stops first, then its
/// sidecar, which releases the Lease; every replica's app reports the next leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_sidecar_pattern_on_a_real_node() {
    let Some(env) = NodeEnv::get() else { return };
    let _shared = NODE_USE.read().await;
    native_sidecar::scenario(env).await;
}

/// deploy/fence on the node (see the `fence` module): two webhook Pods fence the shipped
/// rules' objects; a deposed leader's patch is refused, one replica deleted changes nothing,
/// none running refuses fenced writes only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_fence_on_a_real_node() {
    let Some(env) = NodeEnv::get() else { return };
    let _shared = NODE_USE.read().await;
    fence::scenario(env).await;
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

/// Every behaviour in order, on one Deployment of `deploy/` per strategy (client-go: all but
/// the crash, which needs a COMMAND).
async fn scenario(env: &'static NodeEnv, strategy: Strategy) {
    let deployed = Deployed::apply(env, strategy).await;
    let s = strategy.label();

    // 3 replicas: exactly one COMMAND runs, and everything names the same Pod.
    let leader = deployed.leader_after(0).await;
    deployed.assert_one_leader(&leader).await;
    let start = deployed.logs.starts_of(&leader).pop().expect("a start record");
    assert_eq!(
        start.identity, leader,
        "identity from the Downward API (POD_NAME)"
    );
    if strategy != Strategy::ClientGo {
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
    }
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
    if strategy != Strategy::ClientGo {
        assert_eq!(stop.signal, Some(15), "COMMAND stopped by SIGTERM");
        // The old leader stepped down: a lease released, a leader-for-life lock deleted by its
        // holder (it saw its Pod being deleted, stopped COMMAND, then deleted the lock rather
        // than leave it to the garbage collector once the Pod object is gone, seconds later).
        wait_for(
            "the old leader to release its lock",
            Duration::from_secs(10),
            || async { deployed.logs.logged(&leader, "released the lock").then_some(()) },
        )
        .await;
    }
    let next_start = deployed.start_after(&next, deleted);
    say(&format!(
        "{s}: kubectl delete pod → old COMMAND stopped (SIGTERM) {}, next leader's COMMAND {}",
        ms(stop.mono_ns - deleted),
        ms(next_start - deleted)
    ));
    figure(strategy.label(), "delete_to_next", next_start - deleted);
    figure(
        strategy.label(),
        "delete_stopped_to_next",
        next_start.saturating_sub(stop.mono_ns),
    );
    deployed.assert_one_leader(&next).await;
    let leader = match strategy {
        Strategy::ClientGo => next,
        _ => crash(&deployed, next).await,
    };

    // A real kubelet eviction of the leader: ephemeral-storage limit exceeded.
    let filled = mono_ns();
    deployed.fill_log(&leader);
    let (evicted, evicted_how) = deployed.wait_evicted(&leader).await;
    let next = deployed.leader_after(filled).await;
    assert_ne!(next, leader);
    let next_start = deployed.start_after(&next, filled);
    // The kubelet kills an evicted Pod's containers with grace period 0 (SIGKILL) for a limit
    // eviction on 1.20 (1.37 asks for 1 s, which the runtime raises to its minimum of 2 s:
    // SIGTERM first, kube-leader exits 0, and the Pod ends Succeeded); a leader for life
    // that saw its own Pod fail stopped COMMAND gracefully before. Its successor takes over once
    // that leader marked its lock released (after COMMAND stopped); if the SIGKILL came first,
    // the kubelet's own terminal phase proves the containers gone from 1.27 on (it writes it
    // only once none can run), and before that only the Pod's grace (30 s in deploy/) plus 2 s
    // since the successor saw the Pod terminal (within `leader_after`'s 90 s).
    let end = deployed
        .logs
        .end_of(&leader, filled)
        .expect("the evicted leader's COMMAND ended");
    assert!(
        end.mono_ns <= next_start,
        "{s}: eviction: the next leader's COMMAND started {} before the evicted leader's ended",
        ms(end.mono_ns - next_start)
    );
    say(&format!(
        "{s}: eviction: limit exceeded → Pod evicted seen ({evicted_how}) {}, old COMMAND ended ({}) {}, next leader's COMMAND {} (old COMMAND ended → next leader {})",
        ms(evicted - filled),
        match end.kind.as_str() {
            "gone" => "killed: no stop record".to_owned(),
            kind => format!("{kind} record, signal {:?}", end.signal),
        },
        ms(end.mono_ns - filled),
        ms(next_start - filled),
        ms(next_start.saturating_sub(end.mono_ns)),
    ));
    figure(strategy.label(), "evict_to_next", next_start - filled);
    figure(
        strategy.label(),
        "evict_ended_to_next",
        next_start.saturating_sub(end.mono_ns),
    );
    deployed.history().report(mono_ns()).assert_safe();
    let mut leader = next;

    // kubectl rollout restart, KUBE_LEADER_NODE_ROLLOUTS times (default 1; node-bench.sh runs
    // 10): leadership moves once, to a Pod of the new ReplicaSet; never two COMMANDs at once.
    let rollouts: usize = std::env::var("KUBE_LEADER_NODE_ROLLOUTS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1);
    for round in 1..=rollouts {
        leader = rollout(&deployed, &leader, round, rollouts).await;
    }
}

/// One `kubectl rollout restart` with `leader` leading: exactly one transition for
/// kube-leader's strategies, to a Pod of the new ReplicaSet. The leader after it.
async fn rollout(deployed: &Deployed, leader: &str, round: usize, rounds: usize) -> String {
    let strategy = deployed.strategy;
    let s = strategy.label();
    let rollout = mono_ns();
    deployed.kubectl(&["rollout", "restart", "deployment", DEPLOYMENT]);
    deployed.kubectl(&["rollout", "status", "deployment", DEPLOYMENT, "--timeout=180s"]);
    // `rollout status` returns once the new Pods are ready, while old ones may still be
    // terminating (and leading, for a moment): the leader is named only once the rollout has
    // settled, and must be a Pod of the new ReplicaSet.
    wait_for("the old Pods to be gone", Duration::from_secs(120), || async {
        let pods = deployed.pods().await;
        let terminating = pods.iter().any(|p| p.metadata.deletion_timestamp.is_some());
        let running = pods.iter().filter(|p| phase(p) == "Running").count();
        (!terminating && running == REPLICAS).then_some(())
    })
    .await;
    let done = mono_ns();
    let new_leader = deployed.leader_after(rollout).await;
    assert_ne!(new_leader, leader, "leadership moved");
    let newest = deployed.newest_replica_set().await;
    assert_eq!(
        deployed.replica_set_of(&new_leader).await.as_deref(),
        Some(newest.as_str()),
        "{s}: the leader after the rollout, {new_leader}, is a Pod of the new ReplicaSet"
    );
    let report = deployed.history().report_window(rollout, done);
    report.assert_safe();
    let transitions = report.window_transitions;
    say(&format!("count {s} rollout_transitions {transitions}"));
    if prefer_youngest(strategy) {
        // The leader steps down to the youngest candidate, a Pod of the new ReplicaSet, which
        // leads to the end of the rollout: no hop through a Pod that the rollout stops later.
        let terms = deployed
            .history()
            .terms()
            .iter()
            .filter(|t| t.start >= rollout)
            .map(|t| t.candidate.clone())
            .collect::<Vec<_>>();
        assert_eq!(
            transitions, 1,
            "{s}: exactly one transition per rollout (to {new_leader}; terms begun in the rollout: {terms:?})"
        );
    }
    say(&format!(
        "{s}: rollout restart {round}/{rounds}: {transitions} transition(s), longest leaderless gap {}, rollout took {}",
        report.longest_gap.map_or("none".to_owned(), |g| ms(g.len_ns())),
        ms(done - rollout)
    ));
    figure(
        strategy.label(),
        "rollout_gap",
        report.longest_gap.map_or(0, |g| g.len_ns()),
    );
    deployed.assert_one_leader(&new_leader).await;
    deployed.history().report(mono_ns()).assert_safe();
    new_leader
}

/// COMMAND of `leader` crashes (exit 1): the container restarts in place; a leader for life
/// continues on its lock. The leader after it.
async fn crash(deployed: &Deployed, leader: String) -> String {
    let s = deployed.strategy.label();
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
    match deployed.strategy {
        // operator-sdk semantics: the restarted container continues on its own lock.
        Strategy::ForLife => assert_eq!(after_crash, leader, "leader for life continues on its lock"),
        // The crashed leader released its lease; whoever leads, only one does.
        Strategy::Lease | Strategy::ClientGo => {}
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
    after_crash
}

// === the shared node and image ===

struct NodeEnv {
    node: &'static Node,
    image: String,
    /// The client-go candidate's image, built when a test first needs it.
    go_image: OnceLock<String>,
    /// The images of deploy/patterns, built when a test first needs them.
    pattern_images: OnceLock<PatternImages>,
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
            // The binary under test: KUBE_LEADER_NODE_BINARY, else the static binary the image
            // ships (the test command exports it), else this build's. deploy/'s initContainer
            // copies it into a 32 MiB in-memory emptyDir: a stripped debug build (about 34 MiB)
            // does not fit, the shipped one (about 8.5 MiB) does.
            let kube_leader = ["KUBE_LEADER_NODE_BINARY", "KUBE_LEADER_STATIC_AMD64"]
                .into_iter()
                .find_map(|v| std::env::var_os(v).filter(|p| !p.is_empty()))
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
                go_image: OnceLock::new(),
                pattern_images: OnceLock::new(),
                kube_leader,
                repo: Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned(),
            }
        }))
    }
}

impl NodeEnv {
    /// The image of `strategy`'s Pods.
    fn image(&self, strategy: Strategy) -> &str {
        match strategy {
            Strategy::ForLife | Strategy::Lease => &self.image,
            // The binary the test command built (`KUBE_LEADER_GO_CANDIDATE`), or the script's.
            Strategy::ClientGo => self.go_image.get_or_init(|| {
                let binary = std::env::var("KUBE_LEADER_GO_CANDIDATE").ok();
                let mut args = vec!["go-candidate"];
                if let Some(binary) = &binary {
                    args.extend(["--binary", binary]);
                }
                let image = self
                    .node
                    .build_image(&args)
                    .unwrap_or_else(|e| panic!("could not build the go-candidate image: {e}"));
                say(&format!("client-go candidate image {image}"));
                image
            }),
        }
    }
}

/// The images of deploy/patterns, as the node knows them.
struct PatternImages {
    /// The Dockerfile's image (FROM scratch, the static binary).
    kube_leader: String,
    /// The user's image, which knows nothing of kube-leader.
    app: String,
    /// The app image with kube-leader copied in (deploy/patterns/copy-from/Dockerfile).
    copy_from: String,
    /// The stand-in for the public `busybox:1.36` (`scripts/image.sh busybox`).
    busybox: String,
}

impl NodeEnv {
    /// Builds the patterns' images with buildah (scripts/image.sh), from the static binary the
    /// test command built (`KUBE_LEADER_STATIC_AMD64`).
    fn pattern_images(&self) -> &PatternImages {
        self.pattern_images.get_or_init(|| {
            // Not built here: a cargo build inside `cargo test` waits for the package cache's
            // lock that the outer cargo holds. scripts/test.sh builds it first.
            let binary = std::env::var("KUBE_LEADER_STATIC_AMD64").unwrap_or_else(|_| {
                panic!(
                    "KUBE_LEADER_STATIC_AMD64 is not set: build the static binary with \
                     `scripts/static.sh amd64` and set it to the path printed \
                     (scripts/test.sh does both)"
                )
            });
            let build = |kind: &str| {
                self.node
                    .build_image(&[kind, "--binary", &binary])
                    .unwrap_or_else(|e| panic!("could not build the {kind} image: {e}"))
            };
            let images = PatternImages {
                kube_leader: build("kube-leader"),
                app: self
                    .node
                    .build_image(&["app"])
                    .unwrap_or_else(|e| panic!("could not build the app image: {e}")),
                copy_from: build("copy-from"),
                busybox: self
                    .node
                    .build_image(&["busybox"])
                    .unwrap_or_else(|e| panic!("could not build the busybox image: {e}")),
            };
            say(&format!(
                "pattern images: {}, {}, {}, {}",
                images.kube_leader, images.app, images.copy_from, images.busybox
            ));
            images
        })
    }
}

// === one Deployment of deploy/ ===

struct Deployed {
    env: &'static NodeEnv,
    strategy: Strategy,
    /// deploy/patterns/<pattern> instead of the strategy's overlay.
    pattern: Option<Pattern>,
    work: Work,
    namespace: kube_leader_testenv::TestNamespace,
    logs: PodLogs,
}

impl Deployed {
    /// Applies `deploy/` (RBAC of the strategy, the Deployment) into a new namespace and waits
    /// until its three Pods run and one of them leads.
    async fn apply(env: &'static NodeEnv, strategy: Strategy) -> Self {
        Self::apply_shape(env, strategy, None).await
    }

    /// Applies `deploy/patterns/<pattern>` (the Lease strategy) with the patterns' images.
    async fn apply_pattern(env: &'static NodeEnv, pattern: Pattern) -> Self {
        Self::apply_shape(env, Strategy::Lease, Some(pattern)).await
    }

    async fn apply_shape(env: &'static NodeEnv, strategy: Strategy, pattern: Option<Pattern>) -> Self {
        let control_plane = env.node.control_plane();
        let namespace = control_plane.namespace().await;
        let work = if pattern.is_some() {
            Work::APP
        } else {
            strategy.work()
        };
        let logs = match pattern {
            // The app runs in every replica; kube-leader's messages come from the sidecar.
            Some(Pattern::NativeSidecar) => PodLogs::tail_containers(
                env.node.pod_log_dir(),
                namespace.name(),
                None,
                &[CONTAINER, native_sidecar::SIDECAR],
            ),
            _ => PodLogs::tail(env.node.pod_log_dir(), namespace.name(), work),
        };
        let deployed = Deployed {
            env,
            strategy,
            pattern,
            work,
            namespace,
            logs,
        };
        // The images the manifests name, as the node knows them.
        let image: Box<dyn Fn(&str) -> String> = match pattern {
            None => {
                let image = env.image(strategy).to_owned();
                Box::new(move |_| image.clone())
            }
            Some(Pattern::NativeSidecar) => {
                // The sidecar needs a shell for its per-Pod address (native_sidecar.rs): the
                // node-test image, the binary under test and dash.
                let images = env.pattern_images();
                let node_test = env.image.clone();
                Box::new(move |name: &str| match name {
                    "localhost/kube-leader:0.1.0" => node_test.clone(),
                    "busybox:1.36" => images.busybox.clone(),
                    other => panic!("deploy/patterns names an image the test does not build: {other}"),
                })
            }
            Some(_) => {
                let images = env.pattern_images();
                Box::new(move |name: &str| match name {
                    "localhost/my-app-with-kube-leader:0.1.0" => images.copy_from.clone(),
                    "localhost/kube-leader:0.1.0" => images.kube_leader.clone(),
                    "localhost/my-app:1.0.0" => images.app.clone(),
                    other => panic!("deploy/patterns names an image the test does not build: {other}"),
                })
            }
        };
        let overlay = match (pattern, strategy) {
            (Some(pattern), _) => pattern.kustomization(),
            (None, Strategy::ForLife) => "deploy/for-life",
            (None, Strategy::Lease | Strategy::ClientGo) => "deploy/lease",
        };
        let mut objects = Vec::new();
        let limits = json!({
            "apiVersion": "v1", "kind": "LimitRange",
            "metadata": {"name": "ephemeral-storage"},
            "spec": {"limits": [{"type": "Container", "default": {"ephemeral-storage": "4Mi"}}]},
        });
        // The eviction test's limit; the patterns' 8 MiB binary in an emptyDir would pass it.
        if pattern.is_none() {
            objects.push(limits);
        }
        for mut object in deployed.manifest(overlay) {
            if object["kind"] == "Deployment" {
                for_the_node(&mut object, strategy, &image, control_plane.apiserver_port());
                match pattern {
                    Some(Pattern::NativeSidecar) => {
                        native_sidecar::for_the_node(&mut object, control_plane.apiserver_port());
                    }
                    Some(_) => as_the_users_program(&mut object),
                    None => {}
                }
                if strategy == Strategy::ClientGo {
                    for_client_go(&mut object);
                }
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
        let started = deployed.start_after(&leader, 0) - applied;
        say(&format!(
            "{}: {overlay} applied → 3 Pods running and {leader}'s COMMAND started in {}",
            deployed.label(),
            ms(started)
        ));
        figure(deployed.label(), "apply_to_leading", started);
        deployed
    }

    /// The strategy's or the pattern's name in the output.
    fn label(&self) -> &'static str {
        self.pattern.map_or(self.strategy.label(), Pattern::label)
    }

    fn namespace(&self) -> &str {
        self.namespace.name()
    }

    fn manifest(&self, kustomization: &str) -> Vec<Value> {
        manifest(self.env, self.namespace(), kustomization)
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

    /// Writes 8 MiB to `pod`'s container log, past its 4 MiB ephemeral-storage limit: the test
    /// workload on SIGUSR2, or (client-go) busybox into the candidate's standard output, in the
    /// workload's 1 KiB lines (short lines would pass the kubelet's 50 MiB log rotation size
    /// once it adds its prefix to each).
    fn fill_log(&self, pod: &str) {
        const FILL: &str = r#"tr "\0" x </dev/zero | fold -w 1023 | head -n 8192 >/proc/1/fd/1"#;
        match self.strategy {
            Strategy::ForLife | Strategy::Lease => self.exec(pod, &["killall", "-USR2", "sleep"]),
            Strategy::ClientGo => self.exec(pod, &["sh", "-c", FILL]),
        };
    }

    async fn pods(&self) -> Vec<Pod> {
        let client = self.env.node.control_plane().client().await;
        Api::<Pod>::namespaced(client, self.namespace())
            .list(&ListParams::default())
            .await
            .expect("list Pods")
            .items
    }

    /// The Deployment's newest ReplicaSet (the highest `deployment.kubernetes.io/revision`).
    async fn newest_replica_set(&self) -> String {
        let client = self.env.node.control_plane().client().await;
        Api::<ReplicaSet>::namespaced(client, self.namespace())
            .list(&ListParams::default())
            .await
            .expect("list ReplicaSets")
            .items
            .into_iter()
            .filter_map(|rs| {
                let revision: u64 = rs
                    .metadata
                    .annotations
                    .as_ref()?
                    .get("deployment.kubernetes.io/revision")?
                    .parse()
                    .ok()?;
                Some((revision, rs.metadata.name?))
            })
            .max()
            .map(|(_, name)| name)
            .expect("the Deployment has a ReplicaSet with a revision")
    }

    /// The ReplicaSet that owns `pod`, if the Pod still exists.
    async fn replica_set_of(&self, pod: &str) -> Option<String> {
        let client = self.env.node.control_plane().client().await;
        let pod = Api::<Pod>::namespaced(client, self.namespace())
            .get_opt(pod)
            .await
            .expect("get Pod")?;
        pod.metadata
            .owner_references?
            .into_iter()
            .find(|o| o.kind == "ReplicaSet")
            .map(|o| o.name)
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

    /// Waits until `pod` is known to have been evicted by the kubelet; returns when its end was
    /// first seen (CLOCK_MONOTONIC ns) and how it was recognised.
    ///
    /// Evicted is phase `Failed` with reason `Evicted` (every kubelet up to 1.26; later ones when
    /// a container is killed with a non-zero status), or a terminal phase (`Succeeded` or
    /// `Failed`) together with an Event reason `Evicted` for the Pod: from 1.27 on, a Pod whose
    /// containers all exit 0 on the eviction's SIGTERM (kube-leader does) ends `Succeeded`, with
    /// no reason, and a limit eviction gives it no `DisruptionTarget` condition. A Pod that is
    /// gone with such an Event was evicted too (DeleteEvicted, the default, may delete it right
    /// after). The time returned is the first poll that saw the Pod terminal or gone, even when
    /// the Event was only listed later, so it stays "eviction → Pod ended" on every version.
    async fn wait_evicted(&self, pod: &str) -> (u64, String) {
        let client = self.env.node.control_plane().client().await;
        let pods = Api::<Pod>::namespaced(client.clone(), self.namespace());
        let events = Api::<Event>::namespaced(client, self.namespace());
        // The Pod's UID, so that only its own Events count.
        let uid = pods
            .get_opt(pod)
            .await
            .ok()
            .flatten()
            .and_then(|p| p.metadata.uid);
        let mut fields = format!("involvedObject.name={pod},reason=Evicted");
        if let Some(uid) = &uid {
            fields.push_str(&format!(",involvedObject.uid={uid}"));
        }
        let evicted_event = || async {
            events
                .list(&ListParams::default().fields(&fields))
                .await
                .is_ok_and(|l| !l.items.is_empty())
        };
        let ended = std::cell::Cell::new(None::<u64>);
        wait_for(
            &format!("Pod {pod} to be evicted"),
            Duration::from_secs(90),
            || async {
                let seen = mono_ns();
                let status = match pods.get_opt(pod).await.ok()? {
                    // A Pod of the same name but another UID is not this one.
                    Some(p) if p.metadata.uid == uid => Some(p.status.unwrap_or_default()),
                    _ => None,
                };
                let (phase, reason) = status
                    .as_ref()
                    .map(|s| (s.phase.as_deref(), s.reason.as_deref()))
                    .unwrap_or_default();
                let how = match (&status, phase) {
                    (Some(_), Some("Failed")) if reason == Some("Evicted") => {
                        return Some((
                            ended.get().unwrap_or(seen),
                            "phase Failed, reason Evicted".to_owned(),
                        ));
                    }
                    (Some(_), Some(phase @ ("Succeeded" | "Failed"))) => format!(
                        "phase {phase}{}, an Evicted Event",
                        reason.map(|r| format!(", reason {r}")).unwrap_or_default()
                    ),
                    (Some(_), _) => return None,
                    (None, _) => "gone, an Evicted Event".to_owned(),
                };
                let first = ended.get().unwrap_or(seen);
                ended.set(Some(first));
                evicted_event().await.then_some((first, how))
            },
        )
        .await
    }

    /// The one Pod whose COMMAND started after `after` (CLOCK_MONOTONIC ns) and still runs, by
    /// the workload's records; waits up to 90 s for there to be exactly one.
    async fn leader_after(&self, after: u64) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
        loop {
            let records = self.logs.records();
            let running = running_terms(&records);
            let started: Vec<&String> = running
                .iter()
                .filter(|(_, &start)| start > after)
                .map(|(pod, _)| pod)
                .collect();
            if let [one] = started.as_slice() {
                return (*one).clone();
            }
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "timed out after 90s waiting for {:?}: a COMMAND started after {after}\n{}",
                    self.strategy,
                    self.what_happened_after(after)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What a failed wait can be told apart by: the Pods as the API server has them, the work's
    /// records after `after`, and each Pod's kube-leader messages after it.
    fn what_happened_after(&self, after: u64) -> String {
        let mut out = self
            .env
            .node
            .control_plane()
            .kubectl_with_stdin(&["-n", self.namespace(), "get", "pods", "-o", "wide"], "")
            .unwrap_or_else(|e| format!("{e}\n"));
        let records = self.logs.records();
        for r in records.iter().filter(|r| r.mono_ns > after) {
            out.push_str(&format!(
                "record +{} {} {}\n",
                ms(r.mono_ns - after),
                r.pod,
                r.kind
            ));
        }
        for pod in self.logs.pods() {
            for (at, message) in self.logs.messages_between(&pod, after, u64::MAX) {
                out.push_str(&format!("{pod} +{} {message}\n", ms(at.saturating_sub(after))));
            }
        }
        out
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
        if self.strategy == Strategy::ClientGo {
            // No COMMAND and no status server: its own events say who leads.
            let leading: Vec<String> = running_terms(&self.logs.records()).into_keys().collect();
            if leading != [leader] {
                return Err(format!("started_leading without stopped_leading in {leading:?}"));
            }
            return self.status_names(leader).await;
        }
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
        self.status_names(leader).await
    }

    /// Whether `kube-leader status` names `leader` as the holder.
    async fn status_names(&self, leader: &str) -> Result<(), String> {
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
            args.extend(["pidof", self.work.comm()]);
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
    ///
    /// A term ends at its end record, or earlier where kube-leader in that Pod logged COMMAND's
    /// exit earlier (`COMMAND exited`, `COMMAND stopped after the loss of leadership`, stamped
    /// by kube-leader when it had reaped COMMAND): both are times at or after COMMAND stopped,
    /// and the earlier is the closer. The patterns' shell app cannot read a clock: its lines
    /// carry the time containerd read them from the pipe, which lags on a loaded node (a
    /// handover of 13 ms once showed the old app's stop 15 ms after kube-leader had reaped it
    /// and released the lock, and after the next app's start).
    fn history(&self) -> History {
        let mut history = History::new();
        let mut open = std::collections::HashMap::new();
        for record in self.logs.records() {
            match record.kind.as_str() {
                "start" => {
                    open.insert(record.pod.clone(), record.mono_ns);
                    history.began(&record.pod, record.mono_ns);
                }
                "stop" | "crash" | "gone" => {
                    let Some(began) = open.remove(&record.pod) else {
                        continue;
                    };
                    let reaped = ["COMMAND exited", "COMMAND stopped after the loss of leadership"]
                        .into_iter()
                        .filter_map(|m| self.logs.logged_at(&record.pod, m, began))
                        .min();
                    let end = reaped.map_or(record.mono_ns, |r| r.min(record.mono_ns));
                    history.ended(&record.pod, end);
                }
                _ => {}
            }
        }
        history
    }
}

/// The client-go candidate in place of kube-leader (see the module's documentation): the same
/// lock, the Downward API's identity and namespace, client-go's default timings (the same as
/// kube-leader's), stated.
fn for_client_go(deployment: &mut Value) {
    // The candidate is its own program: deploy/base's initContainer, which installs kube-leader,
    // has nothing to do.
    if let Some(spec) = deployment["spec"]["template"]["spec"].as_object_mut() {
        spec.remove("initContainers");
        // deploy/lease binds the election's Role to its elector ServiceAccount, which
        // kube-leader impersonates; client-go does not impersonate, so it runs as the elector,
        // whose token deploy/lease does not mount by default.
        if spec.get("serviceAccountName") == Some(&json!("kube-leader-lease")) {
            spec.insert("serviceAccountName".into(), json!("kube-leader-lease-elector"));
            spec.insert("automountServiceAccountToken".into(), json!(true));
        }
    }
    let container = &mut deployment["spec"]["template"]["spec"]["containers"][0];
    container["command"] = json!(["/usr/local/bin/kube-leader-go-candidate"]);
    container["args"] = json!([
        "--lease",
        LOCK,
        "--namespace",
        "$(POD_NAMESPACE)",
        "--identity",
        "$(POD_NAME)",
        "--lease-duration",
        "15s",
        "--renew-deadline",
        "10s",
        "--retry-period",
        "2s",
    ]);
}

/// COMMAND becomes the app image's program, as a user's patch of deploy/patterns would make it
/// their own: everything after `--` in the args.
fn as_the_users_program(deployment: &mut Value) {
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array_mut()
        .expect("args");
    let end = args.iter().position(|a| a == "--").expect("`--` before COMMAND") + 1;
    args.truncate(end);
    args.push(json!("/usr/local/bin/app"));
}

/// The test's changes to `deploy/base/deployment.yaml` (see the module's documentation).
/// `image` maps the image a container names to the one the node has.
fn for_the_node(
    deployment: &mut Value,
    strategy: Strategy,
    image: &dyn Fn(&str) -> String,
    apiserver_port: u16,
) {
    let spec = &mut deployment["spec"]["template"]["spec"];
    spec["hostNetwork"] = json!(true);
    for container in spec["initContainers"].as_array_mut().into_iter().flatten() {
        container["image"] = json!(image(container["image"].as_str().unwrap_or_default()));
        container["imagePullPolicy"] = json!("Never");
    }
    for container in spec["containers"].as_array_mut().expect("containers") {
        container["image"] = json!(image(container["image"].as_str().unwrap_or_default()));
        container["imagePullPolicy"] = json!("Never");
        let env = container["env"].as_array_mut().expect("env");
        if strategy == Strategy::Lease {
            env.retain(|e| e["name"] != "POD_NAMESPACE");
        }
        env.push(json!({"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}));
        // `--successor` of the Pods' kube-leader (KUBE_LEADER_SUCCESSOR): node-bench.sh measures
        // `any` beside the default.
        if let Some(successor) = successor_override() {
            env.push(json!({"name": "KUBE_LEADER_SUCCESSOR", "value": successor}));
        }
        // A log filter for the Pods' kube-leader (RUST_LOG), to trace a run.
        if let Ok(filter) = std::env::var("KUBE_LEADER_NODE_RUST_LOG") {
            env.push(json!({"name": "RUST_LOG", "value": filter}));
        }
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

/// The objects that `kubectl apply -k <kustomization>` applies in `namespace`, as JSON; the
/// PodDisruptionBudget as `policy/v1beta1` before 1.21, as `deploy/base/pdb.yaml` says for 1.20.
fn manifest(env: &NodeEnv, namespace: &str, kustomization: &str) -> Vec<Value> {
    let path = env.repo.join(kustomization);
    let kubectl = |args: &[&str], stdin: &str| {
        let mut all = vec!["-n", namespace];
        all.extend_from_slice(args);
        env.node
            .control_plane()
            .kubectl_with_stdin(&all, stdin)
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let yaml = kubectl(&["kustomize", &path.to_string_lossy()], "");
    let yaml = if env.node.control_plane().kubernetes_version().at_least(1, 21) {
        yaml
    } else {
        yaml.replace("apiVersion: policy/v1\n", "apiVersion: policy/v1beta1\n")
    };
    let out = kubectl(&["create", "--dry-run=client", "-o", "json", "-f", "-"], &yaml);
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

/// `KUBE_LEADER_NODE_SUCCESSOR`: the Pods' `--successor` in place of the default (youngest).
fn successor_override() -> Option<String> {
    std::env::var("KUBE_LEADER_NODE_SUCCESSOR")
        .ok()
        .filter(|s| !s.is_empty())
}

/// Whether kube-leader's Pods prefer the youngest successor (the default).
fn prefer_youngest(strategy: Strategy) -> bool {
    strategy != Strategy::ClientGo && successor_override().is_none_or(|s| s == "youngest")
}

fn phase(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
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

// === output ===

/// Prints a measurement past the test harness's output capture.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "node: {line}");
}

/// One figure on a line of its own for `scripts/node-bench.sh`: `node: figure LABEL NAME MS`.
fn figure(label: &str, name: &str, ns: u64) {
    say(&format!("figure {label} {name} {:.0}", ns as f64 / 1e6));
}

fn ms(ns: u64) -> String {
    format!("{:.0} ms", ns as f64 / 1e6)
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
    for_the_node(&mut deployment, Strategy::Lease, &|_| "img".into(), 6443);
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

#[test]
fn client_go_takes_only_the_container_command() {
    let mut deployment = json!({
        "kind": "Deployment",
        "spec": {"template": {"spec": {
            "serviceAccountName": "kube-leader-lease",
            "containers": [{
                "name": "app", "image": "x", "command": ["kube-leader"],
                "args": ["run", "--strategy", "lease", "--lock", "kube-leader-demo", "--", "sh"],
                "env": [{"name": "POD_NAME"}, {"name": "POD_NAMESPACE"}],
                "securityContext": {"runAsNonRoot": true},
            }],
        }}},
    });
    for_the_node(&mut deployment, Strategy::ClientGo, &|_| "go-img".into(), 6443);
    for_client_go(&mut deployment);
    let c = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "go-img");
    assert_eq!(c["command"][0], "/usr/local/bin/kube-leader-go-candidate");
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        &args[..6],
        [
            "--lease",
            LOCK,
            "--namespace",
            "$(POD_NAMESPACE)",
            "--identity",
            "$(POD_NAME)"
        ]
    );
    assert_eq!(
        c["env"].as_array().unwrap().len(),
        4,
        "POD_NAMESPACE kept for --namespace"
    );
    assert_eq!(c["securityContext"]["runAsNonRoot"], true);
    // The election's Role is deploy/lease's elector's: client-go runs as it.
    let spec = &deployment["spec"]["template"]["spec"];
    assert_eq!(spec["serviceAccountName"], "kube-leader-lease-elector");
    assert_eq!(spec["automountServiceAccountToken"], true);
}
