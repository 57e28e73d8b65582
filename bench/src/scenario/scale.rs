//! Scale: many kube-leader candidates in one process (`kube-leader-bench swarm`), sharing one
//! client (one API user) per ~50 candidates.
//!
//! - N candidates on one Lease: time to the first leader, graceful failovers (the leader
//!   releases; all N-1 followers see it in one watch event and race for it), and the API
//!   requests per second of the idle swarm.
//! - One process holding N Leases: time until all are held, then its CPU, memory and the
//!   writes per second it sends while idle.

use std::{collections::HashSet, time::Duration};

use anyhow::Context;

use crate::{
    audit::{self, ByVerb},
    candidate::{guarded, Fleet, Timings},
    clock::between,
    harness::Bench,
    procfs::{self, Memory},
};

const SWARM: &str = "swarm";

/// What the one-Lease scale scenario measured.
#[derive(Debug, Clone)]
pub(crate) struct OneLock {
    pub(crate) candidates: usize,
    pub(crate) clients: usize,
    pub(crate) timings: Timings,
    /// Candidates started → first leader's first act.
    pub(crate) first_leader: Duration,
    /// `step-down` written → next leader's first act.
    pub(crate) failovers: Vec<Duration>,
    /// Requests of all candidates during the failover rounds, per failover.
    pub(crate) requests_per_failover: f64,
    /// Requests of all candidates during the failover rounds, by verb (all rounds).
    pub(crate) burst: ByVerb,
    pub(crate) rounds: usize,
    pub(crate) window: Duration,
    /// All candidates' requests in the idle window.
    pub(crate) idle: ByVerb,
    /// CPU time used per second of the idle window (1.0 = one core).
    pub(crate) cpu: f64,
    pub(crate) memory: Memory,
}

/// What the many-Leases scale scenario measured.
#[derive(Debug, Clone)]
pub(crate) struct ManyLeases {
    pub(crate) leases: usize,
    pub(crate) clients: usize,
    pub(crate) timings: Timings,
    /// Started → every Lease held.
    pub(crate) all_held: Duration,
    pub(crate) window: Duration,
    pub(crate) idle: ByVerb,
    pub(crate) cpu: f64,
    pub(crate) memory: Memory,
    /// Leases lost (stopped_leading) during the window.
    pub(crate) lost: usize,
    /// The window's requests by verb and HTTP status.
    pub(crate) codes: std::collections::BTreeMap<String, std::collections::BTreeMap<u16, u64>>,
}

impl ManyLeases {
    pub(crate) fn writes_per_second(&self) -> f64 {
        audit::writes(&self.idle) as f64 / self.window.as_secs_f64()
    }
}

fn users_for(b: &Bench, candidates: usize) -> anyhow::Result<(usize, Vec<String>)> {
    let clients = candidates.div_ceil(b.plan.per_client);
    Ok((
        clients,
        b.users(clients.min(kube_leader_testenv::RESTRICTED_USERS))?,
    ))
}

/// Creates the Pods `s-0` .. `s-<n-1>` (objects only: no node runs them) and writes their UIDs
/// to a file for `swarm --pods`: each candidate is then a Pod's, as in a cluster, and its
/// registration bound to its Pod.
async fn create_pods(b: &Bench, ns: &str, n: usize) -> anyhow::Result<std::path::PathBuf> {
    let client = b.cp.client().await;
    let mut uids = std::collections::BTreeMap::new();
    for i in 0..n {
        let name = format!("s-{i}");
        let pod = kube_leader_testenv::create_pod(&client, ns, &name)
            .await
            .with_context(|| format!("create Pod {name}"))?;
        uids.insert(name, pod.metadata.uid.unwrap_or_default());
    }
    let path = b.log_dir.join(format!("swarm-pods-{ns}.json"));
    std::fs::write(&path, serde_json::to_vec(&uids)?)?;
    Ok(path)
}

async fn start_swarm(
    b: &Bench,
    fleet: &mut Fleet,
    ns: &str,
    users: &[String],
    candidates: usize,
    locks: &str,
    t: Timings,
) -> anyhow::Result<()> {
    let pods = match locks {
        // Many candidates of one Lease: Pods, so that their registrations are bound to them
        // and an idle follower sends nothing, as in a cluster.
        "one" => Some(create_pods(b, ns, candidates).await?),
        _ => None,
    };
    let mut command = guarded(&b.bins.bench);
    command
        .args(["swarm", "--namespace", ns, "--locks", locks])
        .args(["--candidates", &candidates.to_string()])
        .args(["--per-client", &b.plan.per_client.to_string()])
        .args(["--lease-ms", &t.lease.as_millis().to_string()])
        .args(["--renew-ms", &t.renew.as_millis().to_string()])
        .args(["--retry-ms", &t.retry.as_millis().to_string()]);
    for user in users {
        command.arg("--kubeconfig").arg(b.kubeconfig(user)?);
    }
    if let Some(pods) = pods {
        command.arg("--pods").arg(pods);
    }
    fleet.spawn(SWARM, &users[0], command)
}

/// N candidates on one Lease.
pub(crate) async fn one_lock(b: &Bench, candidates: usize, t: Timings) -> anyhow::Result<OneLock> {
    let (clients, users) = users_for(b, candidates)?;
    let ns = b.lease_namespace(&users).await?;
    let mut fleet = Fleet::new(&b.log_dir);
    start_swarm(b, &mut fleet, ns.name(), &users, candidates, "one", t).await?;
    let outcome = measure_one(b, &mut fleet, &users, candidates, clients, t).await;
    fleet.stop_all(Duration::from_secs(40)).await;
    drop(ns);
    outcome
}

async fn measure_one(
    b: &Bench,
    fleet: &mut Fleet,
    users: &[String],
    candidates: usize,
    clients: usize,
    t: Timings,
) -> anyhow::Result<OneLock> {
    let pid = fleet.proc(SWARM).context("no swarm")?.pid;
    let log = audit::log_path(b.cp.dir());
    let started = fleet
        .wait_for(0, Duration::from_secs(60), "the swarm to start", |e| {
            e.is("campaigning")
        })
        .await?;
    let first = fleet
        .wait_for(0, Duration::from_secs(300), "a first leader", |e| {
            e.is("started_leading")
        })
        .await?;
    // Every follower must be watching before the first step-down.
    tokio::time::sleep(settle_for(candidates)).await;

    let w = audit::Window::open(&log)?;
    let mut failovers = Vec::new();
    for round in 0..b.plan.scale_rounds {
        let t0 = fleet.tell(SWARM, "step-down").await?;
        let next = fleet
            .wait_for(t0, Duration::from_secs(120), &format!("failover {round}"), |e| {
                e.is("started_leading")
            })
            .await?;
        failovers.push(between(t0, next.mono_ns));
        tokio::time::sleep(settle_for(candidates)).await;
    }
    let burst = w.close()?;
    let burst = audit::sum(users.iter().filter_map(|u| burst.get(u)));
    let burst_total = audit::total(&burst);

    let (idle, window, cpu, _) = idle_window(b, pid, users, &log).await?;
    Ok(OneLock {
        candidates,
        clients,
        timings: t,
        first_leader: between(started.mono_ns, first.mono_ns),
        failovers,
        requests_per_failover: burst_total as f64 / b.plan.scale_rounds.max(1) as f64,
        burst,
        rounds: b.plan.scale_rounds,
        window,
        idle,
        cpu,
        memory: Memory::of(pid).context("the swarm exited")?,
    })
}

/// One process holding N Leases.
pub(crate) async fn many_leases(b: &Bench, leases: usize, t: Timings) -> anyhow::Result<ManyLeases> {
    let (clients, users) = users_for(b, leases)?;
    let ns = b.lease_namespace(&users).await?;
    let mut fleet = Fleet::new(&b.log_dir);
    start_swarm(b, &mut fleet, ns.name(), &users, leases, "each", t).await?;
    let outcome = measure_many(b, &mut fleet, &users, leases, clients, t).await;
    fleet.stop_all(Duration::from_secs(40)).await;
    drop(ns);
    outcome
}

async fn measure_many(
    b: &Bench,
    fleet: &mut Fleet,
    users: &[String],
    leases: usize,
    clients: usize,
    t: Timings,
) -> anyhow::Result<ManyLeases> {
    let pid = fleet.proc(SWARM).context("no swarm")?.pid;
    let log = audit::log_path(b.cp.dir());
    let started = fleet
        .wait_for(0, Duration::from_secs(60), "the swarm to start", |e| {
            e.is("campaigning")
        })
        .await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    let all_held_at = loop {
        let events = fleet.events();
        let held: HashSet<&str> = events
            .iter()
            .filter(|e| e.is("started_leading"))
            .map(|e| e.identity.as_str())
            .collect();
        if held.len() >= leases {
            break events
                .iter()
                .filter(|e| e.is("started_leading"))
                .map(|e| e.mono_ns)
                .max()
                .unwrap_or(0);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "only {} of {leases} Leases held after 600 s",
            held.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = fleet.events().len();
    let (idle, window, cpu, codes) = idle_window(b, pid, users, &log).await?;
    let lost = fleet.events()[before..]
        .iter()
        .filter(|e| e.is("stopped_leading"))
        .count();
    Ok(ManyLeases {
        leases,
        clients,
        timings: t,
        all_held: between(started.mono_ns, all_held_at),
        window,
        idle,
        cpu,
        memory: Memory::of(pid).context("the swarm exited")?,
        lost,
        codes,
    })
}

/// Requests by verb and HTTP status.
type Codes = std::collections::BTreeMap<String, std::collections::BTreeMap<u16, u64>>;

/// Counts the swarm's requests (by verb, and by verb and status) and CPU over the idle window.
async fn idle_window(
    b: &Bench,
    pid: u32,
    users: &[String],
    log: &std::path::Path,
) -> anyhow::Result<(ByVerb, Duration, f64, Codes)> {
    let cpu0 = procfs::cpu_time(pid).context("the swarm exited")?;
    let w = audit::Window::open(log)?;
    tokio::time::sleep(b.plan.scale_window).await;
    let requests = w.requests()?;
    let window = w.elapsed();
    let cpu1 = procfs::cpu_time(pid).context("the swarm exited")?;
    let mut idle = ByVerb::new();
    let mut codes = Codes::new();
    for r in requests.iter().filter(|r| users.contains(&r.user)) {
        *idle.entry(r.verb.clone()).or_default() += 1;
        *codes
            .entry(r.verb.clone())
            .or_default()
            .entry(r.code.unwrap_or(0))
            .or_default() += 1;
    }
    Ok((
        idle,
        window,
        (cpu1 - cpu0).as_secs_f64() / window.as_secs_f64(),
        codes,
    ))
}

/// How long to let N candidates (re)establish their watches after a start or a failover.
fn settle_for(candidates: usize) -> Duration {
    Duration::from_millis(1000 + 5 * candidates as u64)
}
