//! The sidecar's handover (issue 14), beside the library's: three `kube-leader run` candidates
//! whose COMMAND is this program's `stamp` subcommand, which prints CLOCK_MONOTONIC at its
//! first instruction (`started_leading`) and when SIGTERM reaches it (`stopped_leading`); its
//! stdout is the sidecar's, read by the [`Fleet`].
//!
//! - Lease, graceful: SIGTERM to the leader's `kube-leader` (it forwards it to COMMAND, which
//!   exits at once; then the lease is released) → the next COMMAND's first instruction; and
//!   COMMAND's exit → the next COMMAND's first instruction.
//! - Leader for life: an administrator deletes the lock → the next COMMAND's first instruction
//!   (the old leader's COMMAND is stopped as it learns of the deletion).

use std::{path::Path, time::Duration};

use anyhow::Context;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{api::DeleteParams, Api};
use kube_leader_testenv::create_pod;
use nix::sys::signal::Signal;

use crate::{
    candidate::{guarded, Fleet, Timings},
    clock::{between, mono_ns},
    harness::Bench,
};

const LEASE: &str = "bench-handover";
const LOCK: &str = "bench-handover-lock";
const CANDIDATES: usize = 3;
const ROUND_TIMEOUT: Duration = Duration::from_secs(90);
/// After a handover, time for the replacement candidate to start and follow (its supervisor and
/// COMMAND's process ready) before the next round.
const SETTLE: Duration = Duration::from_millis(1500);

/// What the handover scenarios measured through `kube-leader run`.
#[derive(Debug, Clone, Default)]
pub(crate) struct SidecarHandover {
    pub(crate) timings: Option<Timings>,
    /// Lease: SIGTERM to the leader's kube-leader → the next COMMAND's first instruction.
    pub(crate) sigterm_to_start: Vec<Duration>,
    /// Lease: the old COMMAND's exit (its SIGTERM handler) → the next COMMAND's first
    /// instruction.
    pub(crate) exit_to_start: Vec<Duration>,
    /// Leader for life: lock deleted → the next COMMAND's first instruction.
    pub(crate) lock_deleted_to_start: Vec<Duration>,
}

/// `kube-leader-bench stamp`: COMMAND for the handover scenarios. Prints `started_leading` at
/// once, waits for SIGTERM, prints `stopped_leading` and exits 0.
pub(crate) fn stamp() -> std::process::ExitCode {
    use nix::sys::signal::SigSet;
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    // Blocked first, so that an early SIGTERM waits for `wait` instead of killing us silently.
    let _ = set.thread_block();
    let identity = std::env::var("KUBE_LEADER_IDENTITY").unwrap_or_default();
    let line = |event: &str| {
        println!(
            "{}",
            serde_json::json!({"event": event, "identity": identity, "mono_ns": mono_ns()})
        );
    };
    line("started_leading");
    let _ = set.wait();
    line("stopped_leading");
    std::process::ExitCode::SUCCESS
}

fn sidecar(b: &Bench, kubeconfig: &Path, args: &[&str]) -> anyhow::Result<tokio::process::Command> {
    let binary = b.bins.sidecar.clone().context("no sidecar binary")?;
    let mut command = guarded(&binary);
    command
        .args(["--log-format", "json", "run"])
        .args(args)
        .arg("--")
        .arg(&b.bins.bench)
        .arg("stamp")
        .env("KUBECONFIG", kubeconfig)
        // KUBE_LEADER_BENCH_LOG=debug (with KUBE_LEADER_BENCH_KEEP): a trace of every handover.
        .env(
            "RUST_LOG",
            std::env::var("KUBE_LEADER_BENCH_LOG").unwrap_or_else(|_| "info".into()),
        );
    Ok(command)
}

/// Lease: `rounds` graceful handovers through `kube-leader run`.
pub(crate) async fn lease(
    b: &Bench,
    t: Timings,
    rounds: usize,
    out: &mut SidecarHandover,
) -> anyhow::Result<()> {
    out.timings = Some(t);
    let users = b.users(CANDIDATES)?;
    let ns = b.lease_namespace(&users).await?;
    let ms = |d: Duration| format!("{}ms", d.as_millis());
    let (lease, renew, retry) = (ms(t.lease), ms(t.renew), ms(t.retry));
    let mut fleet = Fleet::new(&b.log_dir);
    let spawn = |fleet: &mut Fleet, slot: usize, gen: usize| -> anyhow::Result<String> {
        let id = format!("sc-{slot}-{gen}");
        let user = &users[slot];
        let command = sidecar(
            b,
            &b.kubeconfig(user)?,
            &[
                "--strategy",
                "lease",
                "--lock",
                LEASE,
                "--namespace",
                ns.name(),
                "--identity",
                &id,
                "--lease-duration",
                &lease,
                "--renew-deadline",
                &renew,
                "--retry-period",
                &retry,
            ],
        )?;
        fleet.spawn(&id, user, command)?;
        Ok(id)
    };
    for slot in 0..CANDIDATES {
        spawn(&mut fleet, slot, 0)?;
    }
    let first = fleet
        .wait_for(0, ROUND_TIMEOUT, "a first leader", |e| e.is("started_leading"))
        .await?;
    let mut leader = first.identity;
    tokio::time::sleep(SETTLE).await;
    for round in 0..rounds {
        let sent = fleet.signal(&leader, Signal::SIGTERM)?;
        let stopped = fleet
            .wait_for(sent, ROUND_TIMEOUT, "the old COMMAND's exit", |e| {
                e.is("stopped_leading") && e.identity == leader
            })
            .await?;
        let next = fleet
            .wait_for(sent, ROUND_TIMEOUT, "the next COMMAND", |e| {
                e.is("started_leading") && e.identity != leader
            })
            .await?;
        out.sigterm_to_start.push(between(sent, next.mono_ns));
        out.exit_to_start.push(between(stopped.mono_ns, next.mono_ns));
        let slot: usize = leader
            .split('-')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .context("slot of the leader")?;
        fleet.reap(&leader, Duration::from_secs(15)).await?;
        spawn(&mut fleet, slot, round + 1)?;
        leader = next.identity;
        tokio::time::sleep(SETTLE).await;
    }
    fleet.stop_all(Duration::from_secs(15)).await;
    drop(ns);
    Ok(())
}

/// Leader for life: `rounds` lock deletions through `kube-leader run`.
pub(crate) async fn for_life(b: &Bench, rounds: usize, out: &mut SidecarHandover) -> anyhow::Result<()> {
    let users = b.users(CANDIDATES)?;
    let ns = b.for_life_namespace(&users).await?;
    let mut fleet = Fleet::new(&b.log_dir);
    for (slot, user) in users.iter().enumerate() {
        let pod = format!("sc-pod-{slot}");
        create_pod(&b.admin, ns.name(), &pod).await?;
        let mut command = sidecar(
            b,
            &b.kubeconfig(user)?,
            &["--lock", LOCK, "--namespace", ns.name(), "--identity", &pod],
        )?;
        command.env("POD_NAME", &pod);
        fleet.spawn(&pod, user, command)?;
    }
    let locks: Api<ConfigMap> = Api::namespaced(b.admin.clone(), ns.name());
    let first = fleet
        .wait_for(0, ROUND_TIMEOUT, "a first leader", |e| e.is("started_leading"))
        .await?;
    let mut leader = first.identity;
    tokio::time::sleep(SETTLE).await;
    for _ in 0..rounds {
        let deleted = mono_ns();
        locks.delete(LOCK, &DeleteParams::default()).await?;
        let next = fleet
            .wait_for(deleted, ROUND_TIMEOUT, "the next COMMAND", |e| {
                e.is("started_leading") && e.identity != leader
            })
            .await?;
        out.lock_deleted_to_start.push(between(deleted, next.mono_ns));
        // The deposed candidate exits (3) after stopping its COMMAND; start it again in its Pod.
        let old = leader.clone();
        fleet.reap(&old, Duration::from_secs(15)).await?;
        let slot: usize = old
            .rsplit('-')
            .next()
            .and_then(|s| s.parse().ok())
            .filter(|s| *s < users.len())
            .context("slot of the leader")?;
        let mut command = sidecar(
            b,
            &b.kubeconfig(&users[slot])?,
            &["--lock", LOCK, "--namespace", ns.name(), "--identity", &old],
        )?;
        command.env("POD_NAME", &old);
        fleet.spawn(&old, &users[slot], command)?;
        leader = next.identity;
        tokio::time::sleep(SETTLE).await;
    }
    fleet.stop_all(Duration::from_secs(15)).await;
    drop(ns);
    Ok(())
}
