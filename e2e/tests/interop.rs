//! kube-leader and client-go candidates on one Lease: they never both lead, each takes over
//! the other's release, and each reads the other's records. The client-go side is
//! `tools/go-candidate` (k8s.io/client-go v0.37.2's `leaderelection` with a `LeaseLock`).

use std::{process::Stdio, time::Duration};

use kube_leader::{LeaseElector, Strategy};
use kube_leader_e2e::{init_tracing, mono_ns};
use kube_leader_testenv::ControlPlane;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::sync::CancellationToken;

/// The client-go (v0.37.2) candidate built by `scripts/go-candidate.sh` (the test command
/// exports it).
fn go_candidate() -> String {
    std::env::var("KUBE_LEADER_GO_CANDIDATE").unwrap_or_else(|_| {
        panic!(
            "KUBE_LEADER_GO_CANDIDATE is not set: run ./scripts/test.sh, or export \
             KUBE_LEADER_GO_CANDIDATE=$(./scripts/go-candidate.sh)"
        )
    })
}

struct GoCandidate {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl GoCandidate {
    fn spawn(cp: &ControlPlane, ns: &str, lease: &str, id: &str) -> Self {
        let mut child = tokio::process::Command::new(go_candidate())
            .arg(format!("--kubeconfig={}", cp.kubeconfig_path().display()))
            .args([
                &format!("--namespace={ns}"),
                &format!("--lease={lease}"),
                &format!("--identity={id}"),
                "--lease-duration=2s",
                "--renew-deadline=1s",
                "--retry-period=200ms",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Self { child, lines }
    }

    /// The next event named `event`, skipping others.
    async fn wait_event(&mut self, event: &str, timeout: Duration) -> serde_json::Value {
        tokio::time::timeout(timeout, async {
            loop {
                let line = self
                    .lines
                    .next_line()
                    .await
                    .unwrap()
                    .expect("go candidate output");
                let v: serde_json::Value = serde_json::from_str(&line).unwrap();
                if v["event"] == event {
                    return v;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no {event} from the client-go candidate within {timeout:?}"))
    }

    fn sigterm(&self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id().unwrap() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    }
}

fn rust(client: &kube::Client, ns: &str, lease: &str, id: &str) -> LeaseElector {
    LeaseElector::new(client.clone(), lease)
        .namespace(ns)
        .identity(id)
        .lease_duration(Duration::from_secs(2))
        .renew_deadline(Duration::from_secs(1))
        .retry_period(Duration::from_millis(200))
}

#[tokio::test]
async fn client_go_and_kube_leader_share_a_lease() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;

    // 1. client-go leads; kube-leader follows and reads client-go's record.
    let mut go = GoCandidate::spawn(cp, ns.name(), "shared", "go-1");
    go.wait_event("started_leading", Duration::from_secs(30)).await;
    let elector = rust(&client, ns.name(), "shared", "rust-1");
    let mut observed = elector.observe();
    let shutdown = CancellationToken::new();
    let e = elector.clone();
    let s = shutdown.clone();
    let rust_wait = tokio::spawn(async move { e.become_leader(&s).await });
    let seen = tokio::time::timeout(Duration::from_secs(10), observed.wait_for(|i| i.is_some()))
        .await
        .expect("kube-leader reads client-go's record")
        .unwrap()
        .clone()
        .unwrap();
    assert_eq!(seen.holder.as_deref(), Some("go-1"));
    assert_eq!(seen.strategy, Strategy::Lease);
    assert_eq!(seen.lease_duration, Some(Duration::from_secs(2)));
    tokio::time::sleep(Duration::from_secs(3)).await; // past a lease duration: go-1 renews, so it keeps it
    assert!(
        !rust_wait.is_finished(),
        "kube-leader must not take a lease client-go renews"
    );

    // 2. client-go releases on SIGTERM; kube-leader takes over at once.
    go.sigterm();
    let go_stopped = go.wait_event("stopped_leading", Duration::from_secs(10)).await["mono_ns"]
        .as_u64()
        .unwrap();
    let leadership = tokio::time::timeout(Duration::from_secs(10), rust_wait)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let rust_started = mono_ns();
    assert!(rust_started > go_stopped, "both led at once");
    eprintln!(
        "client-go release → kube-leader leader: {:?}",
        Duration::from_nanos(rust_started - go_stopped)
    );
    assert_eq!(
        kube::Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), ns.name())
            .get("shared")
            .await
            .unwrap()
            .spec
            .unwrap()
            .lease_transitions,
        Some(1),
        "leaseTransitions counted across implementations"
    );
    let _ = go.child.wait().await;

    // 3. A new client-go candidate follows kube-leader's renewals, and reads them.
    let mut go2 = GoCandidate::spawn(cp, ns.name(), "shared", "go-2");
    let nl = go2.wait_event("new_leader", Duration::from_secs(30)).await;
    assert_eq!(nl["leader"], "rust-1", "client-go reads kube-leader's record");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        leadership.is_leader(),
        "client-go took a lease kube-leader renews"
    );

    // 4. kube-leader releases; client-go takes over (after seeing the release).
    leadership.release().await.unwrap();
    let rust_stopped = mono_ns();
    let started = go2.wait_event("started_leading", Duration::from_secs(10)).await["mono_ns"]
        .as_u64()
        .unwrap();
    assert!(started > rust_stopped, "both led at once");
    eprintln!(
        "kube-leader release → client-go leader: {:?}",
        Duration::from_nanos(started - rust_stopped)
    );
    go2.sigterm();
    let _ = go2.child.wait().await;
}
