//! Memory of the `kube-leader run` sidecar: a leader and a follower on one Lease, each wrapping
//! `sleep`, run for a while; then the peak RSS of each `kube-leader` process (and of its
//! `__supervise` helper process, if it starts one) is read from `/proc/<pid>/status`.

use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use crate::{
    candidate::{guarded, Fleet},
    harness::Bench,
    procfs::{self, Memory},
};

const LOCK: &str = "bench-sidecar";

/// What the sidecar scenario measured.
#[derive(Debug, Clone)]
pub(crate) struct SidecarMemory {
    pub(crate) leader: Memory,
    pub(crate) follower: Memory,
    /// The leader's `kube-leader __supervise` helper process, if there is one.
    pub(crate) supervisor: Option<Memory>,
    pub(crate) window: Duration,
    /// The size of the `kube-leader` binary on disk.
    pub(crate) binary_bytes: u64,
}

/// Runs two sidecars for `window`.
pub(crate) async fn run(b: &Bench, window: Duration) -> anyhow::Result<SidecarMemory> {
    let binary = b.bins.sidecar.clone().context("no sidecar binary")?;
    let users = b.users(2)?;
    let ns = b.lease_namespace(&users).await?;
    let mut fleet = Fleet::new(&b.log_dir);
    for (i, user) in users.iter().enumerate() {
        let mut command = guarded(&binary);
        command
            .args([
                "run",
                "--lock",
                LOCK,
                "--strategy",
                "lease",
                "--namespace",
                ns.name(),
            ])
            .args(["--identity", &format!("sidecar-{i}")])
            .args(["--", "sleep", "600"])
            .env("KUBECONFIG", b.kubeconfig(user)?)
            .env("RUST_LOG", "info");
        fleet.spawn(&format!("sidecar-{i}"), user, command)?;
    }
    let outcome = measure(b, &fleet, ns.name(), window).await;
    fleet.stop_all(Duration::from_secs(15)).await;
    drop(ns);
    outcome
}

async fn measure(b: &Bench, fleet: &Fleet, ns: &str, window: Duration) -> anyhow::Result<SidecarMemory> {
    let leases = Api::<Lease>::namespaced(b.admin.clone(), ns);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let leader = loop {
        let holder = leases
            .get_opt(LOCK)
            .await?
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| !h.is_empty());
        if let Some(h) = holder {
            break h;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no sidecar became leader within 60 s (logs in {})",
            b.log_dir.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    tokio::time::sleep(window).await;
    let follower = fleet
        .identities()
        .into_iter()
        .find(|id| *id != leader)
        .context("no follower")?;
    let leader_pid = fleet.proc(&leader).context("the leader sidecar exited")?.pid;
    let supervisor = procfs::children(leader_pid)
        .into_iter()
        .find(|&pid| procfs::cmdline(pid).contains("__supervise"))
        .and_then(Memory::of);
    Ok(SidecarMemory {
        leader: fleet.memory(&leader).context("the leader sidecar exited")?,
        follower: fleet.memory(&follower).context("the follower sidecar exited")?,
        supervisor,
        window,
        binary_bytes: b
            .bins
            .sidecar
            .as_ref()
            .and_then(|p| std::fs::metadata(p).ok())
            .map_or(0, |m| m.len()),
    })
}
