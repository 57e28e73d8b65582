//! `kube-leader elect` against the real local control plane, read by a client as the programs
//! next to the retired `leader-elector` sidecar and nais/elector read it: `GET /` with either
//! shape (`{"name"}`, `{"name", "last_update"}`), and `GET /sse`'s `data:` lines.

use std::{
    fs,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use kube_leader_testenv::{create_pod, pod, set_pod_phase, ControlPlane};
use serde::Deserialize;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_kube-leader");
const WAIT: Duration = Duration::from_secs(60);

/// What a program written for the retired `leader-elector` sidecar reads.
#[derive(Debug, Deserialize)]
struct LeaderElector {
    name: String,
}

/// What a program written for nais/elector reads (`/`, and each event of `/sse`).
#[derive(Debug, Deserialize)]
struct Nais {
    name: String,
    last_update: String,
}

// === helpers ===

mod support;

use support::wait_for;

fn scratch_dir(name: &str) -> PathBuf {
    support::scratch_dir("elect", name)
}

/// A `kube-leader elect` process, logs in JSON to a file.
struct Elect {
    id: String,
    child: Child,
    log: PathBuf,
    status: Option<ExitStatus>,
}

impl Elect {
    fn spawn(kubeconfig: &Path, dir: &Path, id: &str, flags: &[&str], env: &[(&str, &str)]) -> Self {
        let log = dir.join(format!("{id}.log"));
        let mut cmd = Command::new(BIN);
        cmd.args(["elect", "--log-format", "json", "--status-addr", "127.0.0.1:0"])
            .args(flags)
            .env("KUBECONFIG", kubeconfig)
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap());
        if env.iter().all(|(k, _)| *k != "POD_NAME") {
            cmd.args(["--identity", id]);
        }
        cmd.envs(env.iter().copied());
        Self {
            id: id.into(),
            child: cmd.spawn().unwrap(),
            log,
            status: None,
        }
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The server's address, from the log line announcing it.
    fn addr(&self) -> SocketAddr {
        wait_for(&format!("{}'s server", self.id), WAIT, || {
            self.log_text()
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|l| l["message"] == "status server listening")
                .and_then(|l| l["addr"].as_str()?.parse().ok())
        })
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().unwrap();
        }
        self.status
    }

    fn term(&self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
    }
}

impl Drop for Elect {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `GET path`: the status code and the body (HTTP/1.0: no chunks).
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, body.to_string())
}

/// `GET /` read as both programs read it; checks that the two agree.
fn leader(addr: SocketAddr) -> String {
    let (code, body) = get(addr, "/");
    assert_eq!(code, 200, "{body}");
    let old: LeaderElector = serde_json::from_str(&body).expect("leader-elector's shape");
    if old.name.is_empty() {
        return old.name;
    }
    let nais: Nais = serde_json::from_str(&body).expect("nais/elector's shape");
    assert_eq!(nais.name, old.name, "{body}");
    assert_rfc3339_seconds(&nais.last_update);
    nais.name
}

/// As Go's `time.RFC3339` writes it: to the second, in UTC.
fn assert_rfc3339_seconds(s: &str) {
    let t: k8s_openapi::jiff::Timestamp = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
    assert_eq!(t.subsec_nanosecond(), 0, "{s}");
    assert!(s.ends_with('Z') && s.len() == 20, "{s}");
}

/// Reads `GET /sse` in a thread: each `data:` line, parsed as nais/elector's event.
fn sse(addr: SocketAddr) -> mpsc::Receiver<Nais> {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET /sse HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(s).lines() {
            let Ok(line) = line else { return };
            if let Some(json) = line.strip_prefix("data: ") {
                let event: Nais = serde_json::from_str(json).expect("nais/elector's event");
                if tx.send(event).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

fn lease_flags<'a>(lock: &'a str, ns: &'a str) -> Vec<&'a str> {
    vec![
        "--strategy",
        "lease",
        "--lock",
        lock,
        "--namespace",
        ns,
        "--lease-duration",
        "2s",
        "--renew-deadline",
        "1s",
        "--retry-period",
        "200ms",
    ]
}

// === tests ===

/// Two Lease candidates: both answer who leads in both shapes; SIGTERM on the leader releases
/// the Lease, the follower takes over at once and its `/sse` says so; the leader exits 0.
#[tokio::test(flavor = "multi_thread")]
async fn elect_serves_the_leader_in_leader_elector_and_nais_shapes_and_hands_over() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let dir = scratch_dir("lease");
    let flags = lease_flags("elect", ns.name());
    let mut a = Elect::spawn(cp.kubeconfig_path(), &dir, "a", &flags, &[]);
    let a_addr = a.addr();
    wait_for("a leads", WAIT, || (leader(a_addr) == "a").then_some(()));
    let b = Elect::spawn(cp.kubeconfig_path(), &dir, "b", &flags, &[]);
    let b_addr = b.addr();
    wait_for("b sees a", WAIT, || (leader(b_addr) == "a").then_some(()));
    let (code, ready) = get(b_addr, "/readyz");
    assert_eq!(code, 200, "a follower is ready once it knows the leader: {ready}");
    // The full view too: b knows it does not lead.
    let (_, view) = get(b_addr, "/leader");
    let view: Value = serde_json::from_str(&view).unwrap();
    assert_eq!(
        (view["holder"].as_str(), view["is_leader"].as_bool()),
        (Some("a"), Some(false))
    );

    let events = sse(b_addr);
    let first = events.recv_timeout(WAIT).expect("the current leader first");
    assert_eq!(first.name, "a");
    assert_rfc3339_seconds(&first.last_update);

    let stopped = Instant::now();
    a.term();
    // The release may show first as no leader (`""`, which no program takes for its own name).
    let next = wait_for("an event naming b", WAIT, || {
        let e = events.recv_timeout(Duration::from_millis(100)).ok()?;
        assert!(e.name == "b" || e.name.is_empty(), "{e:?}");
        (e.name == "b").then_some(e)
    });
    let took = stopped.elapsed();
    assert_rfc3339_seconds(&next.last_update);
    assert!(next.last_update >= first.last_update);
    // A release, not an expiry: well within the 2 s lease.
    assert!(took < Duration::from_secs(2), "took {took:?}: {}", b.log_text());
    assert_eq!(leader(b_addr), "b");
    let status = wait_for("a exits", WAIT, || a.exited());
    assert_eq!(status.code(), Some(0), "{}", a.log_text());
    eprintln!("elect: SIGTERM on the leader -> the follower's /sse names itself in {took:?}");
    let _ = fs::remove_dir_all(dir);
}

/// Leader for life: candidates for two Pods; the server names the leader Pod; the leader's Pod
/// is deleted, so its lock goes with it and the other candidate leads.
#[tokio::test(flavor = "multi_thread")]
async fn elect_for_life_names_the_leader_pod() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    for pod in ["p1", "p2"] {
        create_pod(&client, ns.name(), pod).await.unwrap();
    }
    let dir = scratch_dir("for-life");
    let flags = [
        "--lock",
        "elect-for-life",
        "--namespace",
        ns.name(),
        "--dead-leader-pod",
        "keep",
    ];
    let env = |pod: &'static str| [("POD_NAME", pod), ("POD_NAMESPACE", ns.name())];
    let p1 = Elect::spawn(cp.kubeconfig_path(), &dir, "p1", &flags, &env("p1"));
    let p1_addr = p1.addr();
    wait_for("p1 leads", WAIT, || (leader(p1_addr) == "p1").then_some(()));
    let p2 = Elect::spawn(cp.kubeconfig_path(), &dir, "p2", &flags, &env("p2"));
    let p2_addr = p2.addr();
    wait_for("p2 sees p1", WAIT, || (leader(p2_addr) == "p1").then_some(()));
    let events = sse(p2_addr);
    assert_eq!(events.recv_timeout(WAIT).unwrap().name, "p1");
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(client, ns.name());
    pods.delete("p1", &Default::default()).await.unwrap();
    let next = wait_for("p2 leads", WAIT, || {
        let e = events.recv_timeout(Duration::from_millis(100)).ok()?;
        (e.name == "p2").then_some(e)
    });
    assert_rfc3339_seconds(&next.last_update);
    assert_eq!(leader(p2_addr), "p2", "{}", p2.log_text());
    drop(p1);
    let _ = fs::remove_dir_all(dir);
}

/// `--dead-leader-pod` reaches the library: a leader for life killed and its Pod evicted is
/// taken over either way; `keep` leaves the evicted Pod, the default (`delete-evicted`) deletes
/// it.
#[tokio::test(flavor = "multi_thread")]
async fn dead_leader_pod_keep_leaves_the_evicted_pod_and_the_default_deletes_it() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    for (policy, kept) in [(Some("keep"), true), (None, false)] {
        let ns = cp.namespace().await;
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(client.clone(), ns.name());
        for name in ["p1", "p2"] {
            let mut p = pod(name);
            // The takeover waits for the dead leader's grace period (+ 2 s): keep it short.
            p.spec.as_mut().unwrap().termination_grace_period_seconds = Some(1);
            pods.create(&Default::default(), &p).await.unwrap();
        }
        let dir = scratch_dir("dead-leader-pod");
        let mut flags = vec!["--lock", "dead", "--namespace", ns.name()];
        if let Some(policy) = policy {
            flags.extend(["--dead-leader-pod", policy]);
        }
        let env = |pod: &'static str| [("POD_NAME", pod), ("POD_NAMESPACE", ns.name())];
        let mut p1 = Elect::spawn(cp.kubeconfig_path(), &dir, "p1", &flags, &env("p1"));
        let p1_addr = p1.addr();
        wait_for("p1 leads", WAIT, || (leader(p1_addr) == "p1").then_some(()));
        let p2 = Elect::spawn(cp.kubeconfig_path(), &dir, "p2", &flags, &env("p2"));
        let p2_addr = p2.addr();
        wait_for("p2 sees p1", WAIT, || (leader(p2_addr) == "p1").then_some(()));
        // The leader dies without a word, and its Pod is evicted.
        p1.child.kill().unwrap();
        let _ = p1.child.wait();
        set_pod_phase(&client, ns.name(), "p1", "Failed", Some("Evicted"))
            .await
            .unwrap();
        wait_for("p2 takes over", WAIT, || (leader(p2_addr) == "p2").then_some(()));
        // Give a deletion the time it would take, then look.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let exists = pods.get_opt("p1").await.unwrap().is_some();
        assert_eq!(exists, kept, "--dead-leader-pod {policy:?}: {}", p2.log_text());
        let _ = fs::remove_dir_all(dir);
    }
}
