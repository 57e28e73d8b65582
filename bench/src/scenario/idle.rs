//! Idle API load and memory: 1 leader and 9 followers of one implementation, each a process with
//! an API user of its own, left alone; their requests are counted at the API server (audit log)
//! and their peak RSS read from `/proc/<pid>/status`.

use std::time::Duration;

use anyhow::Context;

use crate::{
    audit::{self, ByVerb},
    candidate::{Fleet, Impl, Timings},
    harness::Bench,
    procfs::Memory,
};

const LEASE: &str = "bench-idle";

/// What one idle scenario measured.
#[derive(Debug, Clone)]
pub(crate) struct IdleLoad {
    pub(crate) imp: Impl,
    pub(crate) timings: Timings,
    pub(crate) window: Duration,
    /// The leader's requests in the window.
    pub(crate) leader: ByVerb,
    /// Each follower's requests in the window.
    pub(crate) followers: Vec<ByVerb>,
    pub(crate) leader_memory: Memory,
    pub(crate) follower_memory: Vec<Memory>,
    /// Leadership changes inside the window (should be none).
    pub(crate) changes: usize,
}

impl IdleLoad {
    /// Requests per minute from counts over the window.
    pub(crate) fn per_minute(&self, n: u64) -> f64 {
        n as f64 * 60.0 / self.window.as_secs_f64()
    }
}

/// Runs 1 leader and `followers` followers of `imp` idle for `window`.
pub(crate) async fn run(
    b: &Bench,
    imp: Impl,
    t: Timings,
    followers: usize,
    window: Duration,
) -> anyhow::Result<IdleLoad> {
    let users = b.users(followers + 1)?;
    let ns = b.lease_namespace(&users).await?;
    let mut fleet = Fleet::new(&b.log_dir);
    for (i, user) in users.iter().enumerate() {
        let id = format!("{}-idle-{i}", imp.tag());
        fleet.spawn_lease(&b.bins, imp, &b.kubeconfig(user)?, ns.name(), LEASE, &id, user, t)?;
    }
    let outcome = measure(b, &mut fleet, imp, t, window).await;
    fleet.stop_all(Duration::from_secs(15)).await;
    drop(ns);
    outcome
}

async fn measure(
    b: &Bench,
    fleet: &mut Fleet,
    imp: Impl,
    t: Timings,
    window: Duration,
) -> anyhow::Result<IdleLoad> {
    let leader = fleet
        .wait_for(0, Duration::from_secs(60), "a leader", |e| {
            e.is("started_leading")
        })
        .await?
        .identity;
    // Let every follower start, list and watch (client-go: its first poll names the leader).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = audit::log_path(b.cp.dir());
    let w = audit::Window::open(&log)?;
    let before = fleet.events().len();
    tokio::time::sleep(window).await;
    let counts = w.close()?;
    let elapsed = w.elapsed();
    let changes = fleet.events()[before..]
        .iter()
        .filter(|e| e.is("started_leading") || e.is("stopped_leading"))
        .count();

    let leader_user = fleet.proc(&leader).context("the leader exited")?.user.clone();
    let leader_memory = fleet.memory(&leader).context("the leader exited")?;
    let mut follower_counts = Vec::new();
    let mut follower_memory = Vec::new();
    for id in fleet.identities() {
        if id == leader {
            continue;
        }
        let user = fleet.proc(&id).map(|p| p.user.clone()).unwrap_or_default();
        follower_counts.push(counts.get(&user).cloned().unwrap_or_default());
        if let Some(m) = fleet.memory(&id) {
            follower_memory.push(m);
        }
    }
    Ok(IdleLoad {
        imp,
        timings: t,
        window: elapsed,
        leader: counts.get(&leader_user).cloned().unwrap_or_default(),
        followers: follower_counts,
        leader_memory,
        follower_memory,
        changes,
    })
}
