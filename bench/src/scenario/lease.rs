//! Lease failover, side by side: three candidate processes of one implementation on one Lease;
//! the leader is stopped gracefully (SIGTERM: it releases) or crashes (SIGKILL: no release), and
//! the time from the signal to the next leader's first act is measured, both stamped with
//! CLOCK_MONOTONIC (the harness just before `kill(2)`, the candidate in its
//! started-leading callback).

use std::time::Duration;

use anyhow::bail;
use nix::sys::signal::Signal;
use rand::Rng;

use crate::{
    candidate::{Fleet, Impl, Timings},
    clock::between,
    harness::Bench,
    observe::Observer,
};

const LEASE: &str = "bench-lease";
const CANDIDATES: usize = 3;

/// How the leader stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// SIGTERM: the candidate releases the Lease (client-go `ReleaseOnCancel`) and exits.
    Graceful,
    /// SIGKILL: no release; the others wait for the lease to expire.
    Crash,
}

impl Stop {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Stop::Graceful => "graceful handover (SIGTERM, release)",
            Stop::Crash => "crash takeover (SIGKILL, no release)",
        }
    }
}

/// What one Lease failover scenario measured.
#[derive(Debug, Clone)]
pub(crate) struct LeaseFailover {
    pub(crate) imp: Impl,
    pub(crate) stop: Stop,
    pub(crate) timings: Timings,
    /// Signal → next leader's first act.
    pub(crate) samples: Vec<Duration>,
    /// Graceful: signal → the harness's watch shows the Lease released (holder `""`).
    pub(crate) to_release: Vec<Duration>,
    /// Graceful: release seen → next leader's first act.
    pub(crate) release_to_leader: Vec<Duration>,
    /// Crash: the last renewal the harness saw before the kill → next leader's first act.
    pub(crate) renewal_to_leader: Vec<Duration>,
}

/// Runs `rounds` failovers of `imp` candidates with timings `t`.
pub(crate) async fn run(
    b: &Bench,
    imp: Impl,
    stop: Stop,
    t: Timings,
    rounds: usize,
) -> anyhow::Result<LeaseFailover> {
    let users = b.users(CANDIDATES)?;
    let ns = b.lease_namespace(&users).await?;
    let observer = Observer::leases(b.admin.clone(), ns.name()).await?;
    let mut fleet = Fleet::new(&b.log_dir);
    let identity = |slot: usize, gen: usize| format!("{}-{slot}-{gen}", imp.tag());
    for (slot, user) in users.iter().enumerate() {
        fleet.spawn_lease(
            &b.bins,
            imp,
            &b.kubeconfig(user)?,
            ns.name(),
            LEASE,
            &identity(slot, 0),
            user,
            t,
        )?;
    }
    let mut result = LeaseFailover {
        imp,
        stop,
        timings: t,
        samples: Vec::new(),
        to_release: Vec::new(),
        release_to_leader: Vec::new(),
        renewal_to_leader: Vec::new(),
    };
    let outcome = rounds_of(
        b,
        &mut fleet,
        &observer,
        ns.name(),
        &users,
        &identity,
        &mut result,
        rounds,
    )
    .await;
    fleet.stop_all(Duration::from_secs(15)).await;
    drop(ns);
    outcome.map(|()| result)
}

#[allow(clippy::too_many_arguments)]
async fn rounds_of(
    b: &Bench,
    fleet: &mut Fleet,
    observer: &Observer,
    ns: &str,
    users: &[String],
    identity: &dyn Fn(usize, usize) -> String,
    result: &mut LeaseFailover,
    rounds: usize,
) -> anyhow::Result<()> {
    let t = result.timings;
    let takeover_bound = t.lease + t.renew + Duration::from_secs(30);
    let mut leader = fleet
        .wait_for(0, Duration::from_secs(60), "a first leader", |e| {
            e.is("started_leading")
        })
        .await?
        .identity;
    for round in 0..rounds {
        // Wait for restarted candidates to follow, then a random part of a retry period, so the
        // signal falls anywhere in the leader's renewal cycle.
        let jitter = t.retry.mul_f64(rand::rng().random_range(0.0..1.0));
        tokio::time::sleep(b.plan.settle + jitter).await;
        let signal = match result.stop {
            Stop::Graceful => Signal::SIGTERM,
            Stop::Crash => Signal::SIGKILL,
        };
        let t0 = fleet.signal(&leader, signal)?;
        let old = leader.clone();
        let next = fleet
            .wait_for(
                t0,
                takeover_bound,
                &format!("round {round}: a leader after {old}"),
                |e| e.is("started_leading") && e.identity != old,
            )
            .await?;
        result.samples.push(between(t0, next.mono_ns));
        match result.stop {
            Stop::Graceful => {
                if let Some(r) = observer
                    .wait_for(LEASE, t0, Duration::from_secs(5), |s| {
                        s.holder.as_deref() == Some("")
                    })
                    .await
                    .filter(|r| r.mono_ns <= next.mono_ns)
                {
                    result.to_release.push(between(t0, r.mono_ns));
                    result.release_to_leader.push(between(r.mono_ns, next.mono_ns));
                }
            }
            Stop::Crash => {
                if let Some(r) = observer.last_before(LEASE, t0, |s| s.holder.as_deref() == Some(&*old)) {
                    result.renewal_to_leader.push(between(r.mono_ns, next.mono_ns));
                }
            }
        }
        fleet.reap(&old, Duration::from_secs(15)).await?;
        // The stopped candidate comes back under a new identity (a restarted client-go
        // candidate with its old identity would simply go on renewing a crashed lease).
        let Some(slot) = old.split('-').nth(1).and_then(|s| s.parse::<usize>().ok()) else {
            bail!("unexpected identity {old}");
        };
        let user = &users[slot];
        fleet.spawn_lease(
            &b.bins,
            result.imp,
            &b.kubeconfig(user)?,
            ns,
            LEASE,
            &identity(slot, round + 1),
            user,
            t,
        )?;
        leader = next.identity;
    }
    Ok(())
}
