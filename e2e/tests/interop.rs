//! kube-leader and client-go candidates on one Lease: they never both lead, each takes over
//! the other's release and crash, and each reads the other's records. The client-go side is
//! `tools/go-candidate` (k8s.io/client-go v0.37.2's `leaderelection` with a `LeaseLock`).
//!
//! - `client_go_and_kube_leader_share_a_lease`: an in-process `LeaseElector` and client-go read
//!   each other's records and hand over on release, counting `leaseTransitions` together.
//! - `handover_*`: one candidate of each implementation, as processes; the leader is stopped
//!   (SIGTERM: it releases; SIGKILL: the Lease expires) and the other takes over, in both
//!   directions.
//! - `a_mixed_set_hands_over_across_implementations`: two of each on one Lease, the leader
//!   stopped round after round, leadership alternating between the implementations.
//!
//! Safety is the chaos checker's rule: leadership intervals, from each candidate's
//! CLOCK_MONOTONIC stamps, never overlap.

use std::{path::Path, process::Stdio, time::Duration};

use kube_leader::Strategy;
use kube_leader_e2e::{
    init_tracing,
    interop::{go_candidate, Fleet, Implementation, Stop, LEASE, RETRY},
    mono_ns, short_lease_elector as rust,
};
use kube_leader_testenv::ControlPlane;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::sync::CancellationToken;

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

/// How long after the leader stopped another may take to lead, on a loaded machine: a new
/// leader is due within a lease duration and a retry period (a crash) or a retry period (a
/// release); the slack is for a busy two-core machine.
const LEAD_AGAIN_SLACK: Duration = Duration::from_secs(5);

fn lease_candidate() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lease-candidate"))
}

/// A fleet on the Lease `lease` of `ns`, on the shared control plane.
fn fleet(cp: &ControlPlane, ns: &str, lease: &str) -> Fleet {
    Fleet::new(cp.kubeconfig_path(), ns, lease, lease_candidate())
}

/// Stops the leader `leader` (`how`) and waits for the next one, not one of `not` (nor
/// `leader`); checks that they never both led, and that the next led within a lease duration and
/// a retry period (plus slack). Returns the next leader.
async fn stop_leader(fleet: &mut Fleet, leader: &str, how: Stop, not: &[&str]) -> String {
    let stopped = fleet
        .stop(leader, how)
        .await
        .unwrap_or_else(|| panic!("{leader} was stopped as leader but never led"));
    let mut not = not.to_vec();
    not.push(leader);
    let (next, started) = fleet.wait_leader(&not).await;
    let gap = Duration::from_nanos(started.saturating_sub(stopped));
    eprintln!(
        "{leader} ({}) {how:?} → {next} ({}) leads after {gap:?}",
        fleet.implementation(leader),
        fleet.implementation(&next)
    );
    assert!(started > stopped, "{next} began before {leader} stopped");
    let bound = LEASE + RETRY + LEAD_AGAIN_SLACK;
    assert!(
        gap <= bound,
        "nobody led for {gap:?} after {leader} {how:?} (bound {bound:?})"
    );
    fleet.assert_safe();
    next
}

/// `from` leads, `to` follows without taking the renewed Lease, then `from` is stopped (`how`)
/// and `to` takes over.
async fn handover(from: Implementation, to: Implementation, how: Stop) {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let mut fleet = fleet(cp, ns.name(), "handover");
    fleet.spawn(from, "first");
    assert_eq!(fleet.wait_leader(&[]).await.0, "first");
    fleet.spawn(to, "second");
    // Past two lease durations: `first` renews, so `second` never takes it.
    tokio::time::sleep(2 * LEASE).await;
    assert_eq!(fleet.leaders(), ["first"], "{to} took a Lease {from} renews");
    assert_eq!(stop_leader(&mut fleet, "first", how, &[]).await, "second");
    let lease =
        kube::Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(cp.client().await, ns.name())
            .get("handover")
            .await
            .unwrap();
    let spec = lease.spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("second"));
    assert_eq!(
        spec.lease_transitions,
        Some(1),
        "leaseTransitions counted across implementations"
    );
    fleet.stop("second", Stop::Release).await;
    fleet.assert_safe();
}

#[tokio::test]
async fn handover_release_kube_leader_to_client_go() {
    handover(
        Implementation::KubeLeader,
        Implementation::ClientGo,
        Stop::Release,
    )
    .await;
}

#[tokio::test]
async fn handover_release_client_go_to_kube_leader() {
    handover(
        Implementation::ClientGo,
        Implementation::KubeLeader,
        Stop::Release,
    )
    .await;
}

#[tokio::test]
async fn handover_crash_kube_leader_to_client_go() {
    handover(Implementation::KubeLeader, Implementation::ClientGo, Stop::Crash).await;
}

#[tokio::test]
async fn handover_crash_client_go_to_kube_leader() {
    handover(Implementation::ClientGo, Implementation::KubeLeader, Stop::Crash).await;
}

/// Two kube-leader and two client-go candidates on one Lease. Each round stops the leader
/// (released or crashed) while the other follower of its implementation is frozen, so that the
/// other implementation takes over: leadership alternates kube-leader → client-go →
/// kube-leader ..., and a fresh candidate replaces the stopped one.
#[tokio::test]
async fn a_mixed_set_hands_over_across_implementations() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let mut fleet = fleet(cp, ns.name(), "mixed");
    let mut live = vec!["kl-1".to_owned()];
    fleet.spawn(Implementation::KubeLeader, "kl-1");
    let (mut leader, _) = fleet.wait_leader(&[]).await;
    for id in ["go-1", "kl-2", "go-2"] {
        let implementation = if id.starts_with("kl") {
            Implementation::KubeLeader
        } else {
            Implementation::ClientGo
        };
        fleet.spawn(implementation, id);
        live.push(id.to_owned());
    }
    tokio::time::sleep(2 * LEASE).await;
    assert_eq!(
        fleet.leaders(),
        [leader.clone()],
        "a follower took a renewed Lease"
    );

    let rounds = [
        Stop::Release,
        Stop::Release,
        Stop::Crash,
        Stop::Crash,
        Stop::Release,
        Stop::Crash,
    ];
    for (round, how) in rounds.into_iter().enumerate() {
        let implementation = fleet.implementation(&leader);
        let twins: Vec<String> = live
            .iter()
            .filter(|id| **id != leader && fleet.implementation(id) == implementation)
            .cloned()
            .collect();
        for twin in &twins {
            fleet.freeze(twin, true);
        }
        let twin_refs: Vec<&str> = twins.iter().map(String::as_str).collect();
        let next = stop_leader(&mut fleet, &leader, how, &twin_refs).await;
        assert_ne!(
            fleet.implementation(&next),
            implementation,
            "round {round}: the other implementation takes over"
        );
        for twin in &twins {
            fleet.freeze(twin, false);
        }
        live.retain(|id| *id != leader);
        let replacement = format!(
            "{}-{}",
            if implementation.is_client_go() { "go" } else { "kl" },
            round + 3
        );
        fleet.spawn(implementation, &replacement);
        live.push(replacement);
        leader = next;
        // The thawed and the new followers leave the renewed Lease alone.
        tokio::time::sleep(LEASE).await;
        assert_eq!(fleet.leaders(), [leader.clone()], "round {round}: one leader");
    }
    for id in live {
        fleet.stop(&id, Stop::Release).await;
    }
    let report = fleet.assert_safe();
    eprintln!("mixed set: {report}");
    assert!(report.transitions >= rounds.len());
}
