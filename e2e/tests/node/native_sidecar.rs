//! `deploy/patterns/native-sidecar` on the node: `kube-leader elect` as a native sidecar (an
//! initContainer with `restartPolicy: Always`) beside an app, busybox and a shell loop, that asks
//! it who leads (`GET /leader`) once a second and works only while the answer says its own Pod
//! leads. The app runs in every replica and logs what it sees: "app: sees leader NAME" when the
//! answer changes, "app: working as POD" / "app: not working as POD" when its work starts and
//! stops, "app: stopping as POD" on SIGTERM (node/logs.rs reads them as records).
//!
//! The node's changes, besides those of every node test (the module's documentation in
//! node.rs: `hostNetwork`, the API server's address, images that the node has): three
//! hostNetwork Pods share one network namespace, so they cannot each listen on
//! `127.0.0.1:4040` as the pattern's Pods do in their own. Each Pod gets a loopback address of
//! its own instead, `127.A.B.C:4040` from the first 32 bits of its UID (`POD_UID`, from the
//! Downward API), which the sidecar (wrapped in `sh -c`: the node-test image, the binary under
//! test and dash, in place of the scratch image) and the app compute alike; the sidecar's
//! `ports` and probes go, as they do for every node test.
//!
//! Each round (`KUBE_LEADER_NODE_DELETE_ROUNDS`, default 3): every replica's app reports the
//! same leader, and only that Pod's app works; `kubectl delete pod` on it; then the next
//! leader's app works, every other replica's app reports it, the deleted Pod's app stopped
//! (SIGTERM) before its sidecar was told to stop (the sidecar's "stepping down" comes after the
//! app's last line, and the containers' `finishedAt` are in that order), the sidecar released
//! the Lease (its log, and the Lease's own history: a release with no holder, then the next
//! holder, acquired before the old lease could have expired), and no two apps worked at once.

use std::{
    fmt::Debug,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::serde::de::DeserializeOwned;
use k8s_openapi::{
    api::{coordination::v1::Lease, core::v1::Pod},
    jiff::Timestamp,
};
use kube::{
    api::{WatchEvent, WatchParams},
    Api, Resource,
};
use kube_leader_e2e::{mono_ns, wait_for};
use serde_json::{json, Value};

use super::{figure, ms, phase, say, Deployed, NodeEnv, Pattern, CONTAINER, LOCK, REPLICAS};

/// The sidecar's container name in deploy/patterns/native-sidecar/pod.yaml.
pub(super) const SIDECAR: &str = "kube-leader";

/// The app's address line in pod.yaml, replaced by the Pod's own address on the node.
const URL_LINE: &str = "url=http://127.0.0.1:4040/leader";

/// A loopback address of the Pod's own, `$addr`, from its UID: the same in dash (the sidecar's
/// wrapper) and busybox sh (the app).
const PER_POD_ADDR: &str =
    "n=$((0x${POD_UID%%-*})); addr=127.$((n >> 16 & 255)).$((n >> 8 & 255)).$((n % 254 + 1))";

const LABEL: &str = "native-sidecar";

/// The node's changes to the pattern's Deployment (see the module's documentation), after
/// `super::for_the_node` (which sets `hostNetwork` and the images).
pub(super) fn for_the_node(deployment: &mut Value, apiserver_port: u16) {
    let spec = &mut deployment["spec"]["template"]["spec"];
    let pod_uid = json!({"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}});
    let sidecar = spec["initContainers"]
        .as_array_mut()
        .and_then(|c| c.iter_mut().find(|c| c["name"] == SIDECAR))
        .expect("the kube-leader sidecar");
    assert_eq!(sidecar["restartPolicy"], "Always", "a native sidecar");
    let env = sidecar["env"].as_array_mut().expect("env");
    // The pattern sets POD_UID itself (its registration is then owned by the Pod).
    if !env.iter().any(|e| e["name"] == "POD_UID") {
        env.push(pod_uid.clone());
    }
    env.push(json!({"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}));
    env.push(json!({"name": "KUBERNETES_SERVICE_PORT", "value": apiserver_port.to_string()}));
    if let Some(successor) = super::successor_override() {
        env.push(json!({"name": "KUBE_LEADER_SUCCESSOR", "value": successor}));
    }
    if let Ok(filter) = std::env::var("KUBE_LEADER_NODE_RUST_LOG") {
        env.push(json!({"name": "RUST_LOG", "value": filter}));
    }
    let args = sidecar["args"].as_array_mut().expect("args");
    let at = args
        .iter()
        .position(|a| a == "--status-addr")
        .expect("--status-addr");
    assert_eq!(args[at + 1], ":4040");
    args.drain(at..at + 2);
    sidecar["command"] = json!([
        "sh",
        "-c",
        format!("{PER_POD_ADDR}; exec /usr/local/bin/kube-leader \"$@\" --status-addr \"$addr:4040\""),
        "kube-leader",
    ]);
    let sidecar = sidecar.as_object_mut().expect("an object");
    for key in ["ports", "startupProbe", "readinessProbe", "livenessProbe"] {
        sidecar.remove(key);
    }

    let app = spec["containers"]
        .as_array_mut()
        .and_then(|c| c.iter_mut().find(|c| c["name"] == CONTAINER))
        .expect("the app container");
    app["env"].as_array_mut().expect("env").push(pod_uid);
    let script = app["args"][0].as_str().expect("the app's script");
    assert!(script.contains(URL_LINE), "the app asks {URL_LINE}: {script}");
    app["args"][0] =
        json!(script.replace(URL_LINE, &format!("{PER_POD_ADDR}; url=http://$addr:4040/leader")));
}

pub(super) async fn scenario(env: &'static NodeEnv) {
    let deployed = Deployed::apply_pattern(env, Pattern::NativeSidecar).await;
    let mut leader = deployed.leader_after(0).await;
    everyone_reports(&deployed, &leader).await;
    // The app's image has no kube-leader: it only asks over HTTP.
    let found = deployed.exec(&leader, &["sh", "-c", "command -v kube-leader || echo none"]);
    assert_eq!(found.trim(), "none", "the app container has no kube-leader");
    say(&format!(
        "{LABEL}: 3 replicas, every app reports {leader}, only its app works"
    ));
    let rounds: usize = std::env::var("KUBE_LEADER_NODE_DELETE_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    for round in 1..=rounds {
        leader = delete_round(&deployed, &leader, round, rounds).await;
    }
}

/// Each running Pod's app: the leader its last answer named (`-`: none).
fn reported(deployed: &Deployed) -> std::collections::BTreeMap<String, (String, u64)> {
    let mut last = std::collections::BTreeMap::new();
    for r in deployed.logs.records() {
        if r.kind == "sees" {
            last.insert(r.pod.clone(), (r.identity.clone(), r.mono_ns));
        }
    }
    last
}

/// Waits until the Deployment's Pods all run, none is being deleted, every app reports `leader`,
/// only `leader`'s app works, and every status server and `kube-leader status` name it.
async fn everyone_reports(deployed: &Deployed, leader: &str) {
    let mut last = String::new();
    for _ in 0..240 {
        match agree(deployed, leader).await {
            Ok(()) => {
                deployed.history().report(mono_ns()).assert_safe();
                return;
            }
            Err(problem) => last = problem,
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!(
        "{LABEL}: the replicas do not agree on {leader}: {last}\n{}",
        deployed.what_happened_after(0)
    );
}

async fn agree(deployed: &Deployed, leader: &str) -> Result<(), String> {
    let pods = deployed.pods().await;
    let running: Vec<String> = pods
        .iter()
        .filter(|p| phase(p) == "Running" && p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    if running.len() != REPLICAS || pods.len() != REPLICAS {
        return Err(format!("{} Pods, running: {running:?}", pods.len()));
    }
    let reported = reported(deployed);
    for pod in &running {
        match reported.get(pod) {
            Some((seen, _)) if seen == leader => {}
            other => return Err(format!("{pod}'s app reports {other:?}")),
        }
    }
    let working: Vec<String> = super::running_terms(&deployed.logs.records())
        .into_keys()
        .collect();
    if working != [leader] {
        return Err(format!("the apps that work: {working:?}"));
    }
    deployed.one_leader(leader, false).await
}

/// One `kubectl delete pod` on `leader`; the next leader.
async fn delete_round(deployed: &Deployed, leader: &str, round: usize, rounds: usize) -> String {
    let client = deployed.env.node.control_plane().client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), deployed.namespace());
    let leases: Api<Lease> = Api::namespaced(client, deployed.namespace());
    everyone_reports(deployed, leader).await;
    // The replicas running beside the leader (everyone_reports: the Deployment has settled).
    let survivors: Vec<String> = deployed
        .pods()
        .await
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .filter(|p| p != leader)
        .collect();
    let lease_before = leases.get(LOCK).await.expect("the Lease");
    let before = lease_before.spec.clone().unwrap_or_default();
    assert_eq!(before.holder_identity.as_deref(), Some(leader));
    let pod_before = pods.get(leader).await.expect("the leader's Pod");
    let pod_watch = Watched::start(pods, leader, &pod_before).await;
    let lease_watch = Watched::start(leases, LOCK, &lease_before).await;

    let deleted = mono_ns();
    deployed.kubectl(&["delete", "pod", leader, "--wait=false"]);
    let next = deployed.leader_after(deleted).await;
    assert_ne!(next, leader);
    let next_start = deployed.start_after(&next, deleted);
    // Every replica that was running beside the leader reports the next one (the replacement
    // Pod too, once it runs: everyone_reports below).
    let all_reported = wait_for(
        "every other replica's app to report the next leader",
        Duration::from_secs(60),
        || async {
            let reported = reported(deployed);
            let mut latest = 0;
            for pod in survivors.iter().filter(|p| **p != next) {
                match reported.get(pod) {
                    Some((seen, at)) if *seen == next && *at > deleted => latest = latest.max(*at),
                    _ => return None,
                }
            }
            Some(latest.max(next_start))
        },
    )
    .await;

    // The deleted Pod: its app stopped on SIGTERM, then its sidecar stepped down and released.
    let logs = &deployed.logs;
    let app_stopped = wait_for("the old leader's app to stop", Duration::from_secs(60), || {
        let stop = logs
            .records()
            .into_iter()
            .find(|r| r.pod == leader && r.kind == "stop" && r.signal == Some(15) && r.mono_ns > deleted);
        async move { stop.map(|r| r.mono_ns) }
    })
    .await;
    let released = wait_for(
        "the old leader's sidecar to release the Lease",
        Duration::from_secs(60),
        || {
            let at = logs.logged_at(leader, "released the lock", deleted);
            async move { at }
        },
    )
    .await;
    let stepping_down = logs
        .logged_at(leader, "stepping down", deleted)
        .expect("the sidecar stepped down on its SIGTERM");
    assert!(
        app_stopped < stepping_down && stepping_down <= released,
        "{LABEL}: the app stopped ({}), then its sidecar was told to stop ({}) and released ({}), \
         in that order (ms after the deletion)",
        ms(app_stopped - deleted),
        ms(stepping_down.saturating_sub(deleted)),
        ms(released.saturating_sub(deleted)),
    );
    assert!(
        stepping_down < next_start,
        "{LABEL}: the next leader's app works only after the old leader's sidecar stepped down"
    );
    deployed.history().report(mono_ns()).assert_safe();

    // The containers' final states, as the kubelet wrote them before the Pod was deleted.
    let gone = pod_watch.wait_deleted(Duration::from_secs(90)).await;
    let status = gone.status.clone().unwrap_or_default();
    let finished = |statuses: Option<Vec<k8s_openapi::api::core::v1::ContainerStatus>>, name: &str| {
        let terminated = statuses
            .into_iter()
            .flatten()
            .find(|c| c.name == name)
            .and_then(|c| c.state?.terminated)
            .unwrap_or_else(|| panic!("{LABEL}: {name} of {leader} did not end terminated: {status:?}"));
        assert_eq!(
            terminated.exit_code, 0,
            "{name} of {leader} exited 0: {terminated:?}"
        );
        terminated.finished_at.expect("finishedAt").0
    };
    let app_finished = finished(status.container_statuses.clone(), CONTAINER);
    let sidecar_finished = finished(status.init_container_statuses.clone(), SIDECAR);
    assert!(
        app_finished <= sidecar_finished,
        "{LABEL}: the app finished ({app_finished}) no later than its sidecar ({sidecar_finished})"
    );

    // The Lease: released (no holder, one second), then taken by the next leader before the
    // old term could have expired.
    let versions = lease_watch.stop();
    let release = versions.iter().position(|(_, _, l)| {
        let spec = l.spec.clone().unwrap_or_default();
        spec.holder_identity.is_none_or(|h| h.is_empty()) && spec.lease_duration_seconds == Some(1)
    });
    let taken = versions.iter().position(|(_, _, l)| {
        l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(next.as_str())
    });
    let (Some(release), Some(taken)) = (release, taken) else {
        panic!("{LABEL}: the Lease was not released, then taken by {next}: {versions:#?}");
    };
    assert!(release < taken, "released before it was taken");
    let new = versions[taken].2.spec.clone().unwrap_or_default();
    let duration = Duration::from_secs(before.lease_duration_seconds.unwrap_or(15).unsigned_abs().into());
    let expiry = before
        .renew_time
        .clone()
        .expect("renewTime")
        .0
        .checked_add(duration)
        .expect("a time");
    let acquired = new.acquire_time.clone().expect("acquireTime").0;
    assert!(
        acquired < expiry,
        "{LABEL}: {next} acquired the Lease at {acquired}, not after the old term's expiry {expiry}"
    );
    assert!(
        new.lease_transitions > before.lease_transitions,
        "one more transition: {:?} → {:?}",
        before.lease_transitions,
        new.lease_transitions
    );
    let waiting = if survivors.contains(&next) {
        "a waiting candidate"
    } else {
        "the replacement Pod"
    };
    say(&format!(
        "{LABEL}: delete round {round}/{rounds}: old app stopped {}, its sidecar stepping down {}, \
         released {}, next leader's app working {} ({next}, {waiting}), every other replica's \
         app reports it {}; Lease released then taken {} before the old term's expiry",
        ms(app_stopped - deleted),
        ms(stepping_down.saturating_sub(deleted)),
        ms(released.saturating_sub(deleted)),
        ms(next_start - deleted),
        ms(all_reported - deleted),
        ms(expiry_margin_ns(acquired, expiry)),
    ));
    figure(LABEL, "delete_to_next", next_start - deleted);
    figure(LABEL, "delete_all_report", all_reported - deleted);
    figure(LABEL, "delete_app_stopped", app_stopped - deleted);
    figure(LABEL, "delete_released", released.saturating_sub(deleted));
    figure(
        LABEL,
        "delete_app_stopped_to_released",
        released.saturating_sub(app_stopped),
    );
    figure(
        LABEL,
        "delete_released_to_next",
        next_start.saturating_sub(released),
    );
    everyone_reports(deployed, &next).await;
    next
}

fn expiry_margin_ns(acquired: Timestamp, expiry: Timestamp) -> u64 {
    let span = expiry.duration_since(acquired);
    u64::try_from(span.as_nanos()).unwrap_or(0)
}

/// The versions of one named object as a watch saw them, each with when (CLOCK_MONOTONIC ns)
/// and whether it was the deletion.
struct Watched<K> {
    seen: Arc<Mutex<Vec<(u64, bool, K)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl<K> Watched<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    /// Watches `name` from the version `current`.
    async fn start(api: Api<K>, name: &str, current: &K) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let rv = current
            .meta()
            .resource_version
            .clone()
            .expect("a resourceVersion");
        let params = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(290);
        let mut events = api
            .watch(&params, &rv)
            .await
            .unwrap_or_else(|e| panic!("watch {name}: {e}"))
            .boxed();
        let out = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok(Some(event)) = events.try_next().await {
                let at = mono_ns();
                match event {
                    WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                        out.lock().unwrap().push((at, false, o));
                    }
                    WatchEvent::Deleted(o) => {
                        out.lock().unwrap().push((at, true, o));
                        break;
                    }
                    WatchEvent::Bookmark(_) | WatchEvent::Error(_) => {}
                }
            }
        });
        Self { seen, task }
    }

    /// Waits for the deletion; the object as it was deleted.
    async fn wait_deleted(&self, timeout: Duration) -> K {
        wait_for("the deleted Pod to be gone", timeout, || {
            let deleted = self
                .seen
                .lock()
                .unwrap()
                .iter()
                .find(|(_, deleted, _)| *deleted)
                .map(|(_, _, o)| o.clone());
            async move { deleted }
        })
        .await
    }

    /// Stops watching; every version seen.
    fn stop(self) -> Vec<(u64, bool, K)> {
        self.task.abort();
        self.seen.lock().unwrap().clone()
    }
}

#[test]
fn the_node_changes_to_the_native_sidecar_are_only_those_documented() {
    let mut deployment = json!({
        "kind": "Deployment",
        "spec": {"template": {"spec": {
            "serviceAccountName": "kube-leader-lease",
            "initContainers": [{
                "name": SIDECAR, "image": "img", "restartPolicy": "Always",
                "args": ["elect", "--strategy", "lease", "--lock", "kube-leader-demo",
                         "--status-addr", ":4040", "--log-format", "json"],
                "env": [{"name": "POD_NAME"}, {"name": "POD_NAMESPACE"}],
                "ports": [{"containerPort": 4040}],
                "startupProbe": {}, "readinessProbe": {}, "livenessProbe": {},
                "securityContext": {"runAsNonRoot": true},
            }],
            "containers": [{
                "name": CONTAINER, "image": "busybox", "command": ["sh", "-c"],
                "args": [format!("{URL_LINE}\necho \"$url\"\n")],
                "env": [{"name": "POD_NAME"}],
            }],
        }}},
    });
    for_the_node(&mut deployment, 6443);
    let spec = &deployment["spec"]["template"]["spec"];
    assert_eq!(spec["serviceAccountName"], "kube-leader-lease");
    let sidecar = &spec["initContainers"][0];
    assert_eq!(sidecar["restartPolicy"], "Always");
    assert_eq!(sidecar["command"][0], "sh");
    assert_eq!(sidecar["command"][3], "kube-leader", "$0; the args follow as $@");
    assert_eq!(
        sidecar["args"],
        json!([
            "elect",
            "--strategy",
            "lease",
            "--lock",
            "kube-leader-demo",
            "--log-format",
            "json"
        ])
    );
    for key in ["ports", "startupProbe", "readinessProbe", "livenessProbe"] {
        assert!(sidecar.get(key).is_none(), "{key}");
    }
    assert_eq!(sidecar["securityContext"]["runAsNonRoot"], true);
    let names = |c: &Value| -> Vec<String> {
        c["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        names(sidecar),
        [
            "POD_NAME",
            "POD_NAMESPACE",
            "POD_UID",
            "KUBERNETES_SERVICE_HOST",
            "KUBERNETES_SERVICE_PORT"
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(super::successor_override().map(|_| "KUBE_LEADER_SUCCESSOR".to_owned()))
        .chain(
            std::env::var("KUBE_LEADER_NODE_RUST_LOG")
                .ok()
                .map(|_| "RUST_LOG".to_owned())
        )
        .collect::<Vec<_>>()
    );
    let app = &spec["containers"][0];
    assert_eq!(names(app), ["POD_NAME", "POD_UID"]);
    let script = app["args"][0].as_str().unwrap();
    assert!(!script.contains(URL_LINE), "{script}");
    assert!(script.contains("url=http://$addr:4040/leader"), "{script}");
}

/// dash (the sidecar's shell in the node-test image) and busybox sh (the app's) compute the
/// same loopback address from a UID: 127.A.B.C, C never 0.
#[test]
fn the_per_pod_address_is_the_same_in_both_shells() {
    let shells: &[&[&str]] = &[&["dash"], &["busybox", "sh"]];
    for shell in shells {
        for (uid, want) in [
            ("0000abcd-1111-2222-3333-444455556666", "127.0.171.40"),
            ("ffffffff-0000-0000-0000-000000000000", "127.255.255.16"),
        ] {
            let Ok(out) = std::process::Command::new(shell[0])
                .args(&shell[1..])
                .args(["-c", &format!("{PER_POD_ADDR}; echo $addr")])
                .env("POD_UID", uid)
                .output()
            else {
                eprintln!("{shell:?} is not installed: not checked");
                continue;
            };
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                want,
                "{shell:?} {uid}"
            );
        }
    }
}
