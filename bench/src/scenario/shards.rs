//! Shards (issue 13): `shard-candidate` processes, each one `kube_leader::Shards` candidate
//! with one client (one API user).
//!
//! - One process holding N shard Leases: time until all are held, then over a long window the
//!   writes per second it sends (ideal: N per retry period, plus its membership Lease), the
//!   answers by HTTP status, shards lost, CPU and memory.
//! - Replicas sharing M shards: the spread (each within one of fair) and the time to reach it
//!   after the start, after a replica joins, and after one is SIGKILLed; requests per minute
//!   per replica while idle.

use std::{collections::BTreeMap, time::Duration};

use anyhow::Context;
use nix::sys::signal::Signal;

use crate::{
    audit::{self, ByVerb},
    candidate::{guarded, Event, Fleet, Timings},
    clock::{between, mono_ns},
    harness::Bench,
    procfs::{self, Memory},
};

/// Requests by verb and HTTP status.
pub(crate) type Codes = BTreeMap<String, BTreeMap<u16, u64>>;

/// What the one-process scenario measured.
#[derive(Debug, Clone)]
pub(crate) struct OneProcess {
    pub(crate) leases: u32,
    pub(crate) timings: Timings,
    /// Started → every shard held.
    pub(crate) all_held: Duration,
    pub(crate) window: Duration,
    pub(crate) requests: ByVerb,
    pub(crate) codes: Codes,
    /// CPU time used per second of the window (1.0 = one core).
    pub(crate) cpu: f64,
    pub(crate) memory: Memory,
    /// Shards lost (loss token fired) during the window.
    pub(crate) lost: usize,
}

impl OneProcess {
    pub(crate) fn writes_per_second(&self) -> f64 {
        audit::writes(&self.requests) as f64 / self.window.as_secs_f64()
    }

    /// N / retry period.
    pub(crate) fn ideal(&self) -> f64 {
        f64::from(self.leases) / self.timings.retry.as_secs_f64()
    }

    pub(crate) fn refused(&self) -> u64 {
        self.codes
            .values()
            .flat_map(|c| c.iter())
            .filter(|(code, _)| **code == 429)
            .map(|(_, n)| *n)
            .sum()
    }
}

/// The spread at one moment.
#[derive(Debug, Clone)]
pub(crate) struct Spread {
    /// From the event (start, join, kill) until every shard was held once by a live replica and
    /// each held ⌊M/N⌋ or ⌈M/N⌉; `None`: not reached within the bound.
    pub(crate) took: Option<Duration>,
    /// Shards held per live replica then (or at the bound).
    pub(crate) counts: BTreeMap<String, usize>,
    pub(crate) shards: u32,
}

impl Spread {
    /// The largest distance of a replica's count from fair (M / N).
    pub(crate) fn worst(&self) -> f64 {
        let fair = f64::from(self.shards) / self.counts.len().max(1) as f64;
        self.counts
            .values()
            .map(|c| (*c as f64 - fair).abs())
            .fold(0.0, f64::max)
    }

    pub(crate) fn describe(&self) -> String {
        let c: Vec<String> = self.counts.values().map(ToString::to_string).collect();
        c.join("/")
    }
}

/// What the replicas scenario measured.
#[derive(Debug, Clone)]
pub(crate) struct Replicas {
    pub(crate) replicas: usize,
    pub(crate) shards: u32,
    pub(crate) timings: Timings,
    pub(crate) start: Spread,
    pub(crate) join: Spread,
    pub(crate) crash: Spread,
    pub(crate) idle_window: Duration,
    /// Requests per minute of each replica while idle.
    pub(crate) idle_per_minute: Vec<f64>,
    /// All replicas' idle requests by verb.
    pub(crate) idle: ByVerb,
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn spawn(
    b: &Bench,
    fleet: &mut Fleet,
    ns: &str,
    user: &str,
    name: &str,
    count: u32,
    identity: &str,
    t: Timings,
) -> anyhow::Result<()> {
    let ms = |d: Duration| d.as_millis().to_string();
    let mut command = guarded(&b.bins.shard_candidate);
    command
        .arg(b.kubeconfig(user)?)
        .args([ns, name, &count.to_string(), identity])
        .args([ms(t.lease), ms(t.renew), ms(t.retry)])
        .env("RUST_LOG", "kube_leader=warn");
    fleet.spawn(identity, user, command)
}

/// Shards held per identity, by replaying `started_leading` / `stopped_leading` events.
pub(crate) fn tally(events: &[Event]) -> BTreeMap<String, BTreeMap<u32, ()>> {
    let mut held: BTreeMap<String, BTreeMap<u32, ()>> = BTreeMap::new();
    for e in events {
        let Some(shard) = e.shard else { continue };
        if e.is("started_leading") {
            held.entry(e.identity.clone()).or_default().insert(shard, ());
        } else if e.is("stopped_leading") {
            held.entry(e.identity.clone()).or_default().remove(&shard);
        }
    }
    held
}

/// Waits (up to `timeout`) until the live replicas hold every shard within one of fair.
pub(crate) async fn spread(
    fleet: &mut Fleet,
    live: &[String],
    shards: u32,
    since_ns: u64,
    timeout: Duration,
) -> Spread {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let held = tally(fleet.events());
        let counts: BTreeMap<String, usize> = live
            .iter()
            .map(|id| (id.clone(), held.get(id).map_or(0, BTreeMap::len)))
            .collect();
        let mut covered: Vec<u32> = live
            .iter()
            .filter_map(|id| held.get(id))
            .flat_map(|m| m.keys().copied())
            .collect();
        covered.sort_unstable();
        let total = covered.len();
        covered.dedup();
        let s = Spread {
            took: None,
            counts,
            shards,
        };
        let done = covered.len() == shards as usize && total == shards as usize && s.worst() < 1.0;
        if done || tokio::time::Instant::now() > deadline {
            return Spread {
                took: done.then(|| between(since_ns, mono_ns())),
                ..s
            };
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One process holding `leases` shard Leases for `window`.
pub(crate) async fn one_process(
    b: &Bench,
    leases: u32,
    t: Timings,
    window: Duration,
) -> anyhow::Result<OneProcess> {
    let users = b.users(1)?;
    let ns = b.lease_namespace(&users).await?;
    let mut fleet = Fleet::new(&b.log_dir);
    let started = mono_ns();
    spawn(b, &mut fleet, ns.name(), &users[0], "bench", leases, "holder", t)?;
    let outcome = measure_one(b, &mut fleet, &users[0], leases, t, window, started).await;
    fleet.stop_all(Duration::from_secs(40)).await;
    drop(ns);
    outcome
}

async fn measure_one(
    b: &Bench,
    fleet: &mut Fleet,
    user: &str,
    leases: u32,
    t: Timings,
    window: Duration,
    started: u64,
) -> anyhow::Result<OneProcess> {
    let pid = fleet.proc("holder").context("no shard candidate")?.pid;
    let all = spread(
        fleet,
        &["holder".to_string()],
        leases,
        started,
        Duration::from_secs(600),
    )
    .await;
    let all_held = all
        .took
        .with_context(|| format!("only {} of {leases} shards held after 600 s", all.describe()))?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = fleet.events().len();
    let log = audit::log_path(b.cp.dir());
    let cpu0 = procfs::cpu_time(pid).context("the shard candidate exited")?;
    let w = audit::Window::open(&log)?;
    tokio::time::sleep(window).await;
    let requests = w.requests()?;
    let elapsed = w.elapsed();
    let cpu1 = procfs::cpu_time(pid).context("the shard candidate exited")?;
    let mut by_verb = ByVerb::new();
    let mut codes = Codes::new();
    for r in requests.iter().filter(|r| r.user == user) {
        *by_verb.entry(r.verb.clone()).or_default() += 1;
        *codes
            .entry(r.verb.clone())
            .or_default()
            .entry(r.code.unwrap_or(0))
            .or_default() += 1;
    }
    let lost = fleet.events()[before..]
        .iter()
        .filter(|e| e.is("stopped_leading"))
        .count();
    Ok(OneProcess {
        leases,
        timings: t,
        all_held,
        window: elapsed,
        requests: by_verb,
        codes,
        cpu: (cpu1 - cpu0).as_secs_f64() / elapsed.as_secs_f64(),
        memory: Memory::of(pid).context("the shard candidate exited")?,
        lost,
    })
}

/// `replicas` replicas sharing `shards` shards: spread after start, idle load, a join, a crash.
pub(crate) async fn replicas(
    b: &Bench,
    replicas: usize,
    shards: u32,
    t: Timings,
    idle_window: Duration,
) -> anyhow::Result<Replicas> {
    let users = b.users(replicas + 1)?;
    let ns = b.lease_namespace(&users).await?;
    let mut fleet = Fleet::new(&b.log_dir);
    let outcome = measure_replicas(b, &mut fleet, ns.name(), &users, replicas, shards, t, idle_window).await;
    fleet.stop_all(Duration::from_secs(40)).await;
    drop(ns);
    outcome
}

#[allow(clippy::too_many_arguments)]
async fn measure_replicas(
    b: &Bench,
    fleet: &mut Fleet,
    ns: &str,
    users: &[String],
    replicas: usize,
    shards: u32,
    t: Timings,
    idle_window: Duration,
) -> anyhow::Result<Replicas> {
    let bound = t.lease * 4 + Duration::from_secs(30);
    let mut live: Vec<String> = (0..replicas).map(|i| format!("replica-{i}")).collect();
    let t0 = mono_ns();
    for (i, id) in live.iter().enumerate() {
        spawn(b, fleet, ns, &users[i], "bench", shards, id, t)?;
    }
    let start = spread(fleet, &live, shards, t0, bound).await;
    anyhow::ensure!(
        start.took.is_some(),
        "no fair spread after start: {}",
        start.describe()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Idle: requests per replica.
    let log = audit::log_path(b.cp.dir());
    let w = audit::Window::open(&log)?;
    tokio::time::sleep(idle_window).await;
    let per_user = w.close()?;
    let elapsed = w.elapsed();
    let minutes = elapsed.as_secs_f64() / 60.0;
    let idle_per_minute: Vec<f64> = users[..replicas]
        .iter()
        .map(|u| per_user.get(u).map_or(0, audit::total) as f64 / minutes)
        .collect();
    let idle = audit::sum(users[..replicas].iter().filter_map(|u| per_user.get(u)));

    // A join.
    let joiner = format!("replica-{replicas}");
    let t1 = mono_ns();
    spawn(b, fleet, ns, &users[replicas], "bench", shards, &joiner, t)?;
    live.push(joiner);
    let join = spread(fleet, &live, shards, t1, bound).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // A crash: SIGKILL of the first replica.
    let victim = live.remove(0);
    let t2 = fleet.signal(&victim, Signal::SIGKILL)?;
    let crash = spread(fleet, &live, shards, t2, bound).await;
    Ok(Replicas {
        replicas,
        shards,
        timings: t,
        start,
        join,
        crash,
        idle_window: elapsed,
        idle_per_minute,
        idle,
    })
}
