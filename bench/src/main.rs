//! `kube-leader-bench`: kube-leader's benchmarks against client-go, on a real local control plane.
//!
//! It starts a private control plane (etcd, kube-apiserver and kube-controller-manager of the release the tests use, 1.37.2,
//! from `kube-leader-testenv`), runs the scenarios of issue 4 and prints a Markdown table:
//!
//! - **for-life failover**: three `ForLife` candidates with Pod objects; the leader's Pod is
//!   deleted (then, separately, its lock), and the time to the next leader is measured, next to
//!   the garbage collector's delay in the same rounds;
//! - **lease failover**: three candidate processes on one Lease, kube-leader (`lease-candidate`)
//!   and client-go (`kube-leader-go-candidate`) with the same timings; the leader gets SIGTERM
//!   (it releases) or SIGKILL (it does not); time from the signal to the next leader's first act,
//!   both stamped with CLOCK_MONOTONIC;
//! - **idle API load**: 1 leader + 9 followers, one API user each, requests counted at the API
//!   server from its audit log;
//! - **memory**: peak RSS (`VmHWM`) of the `kube-leader run` sidecar, of the library candidate
//!   and of the client-go candidate;
//! - **scale**: 100 and 1,000 candidates on one Lease, and one process holding 1,000 Leases
//!   (library candidates in one process, one client per 50 candidates);
//! - **under load**, only when named with `--only` (`shards-hold`, `shards-hold-load`,
//!   `under-load`): shard Leases held for a window, quiet and while `kube-leader-bench load`
//!   fills the API server's priority levels, with and without a FlowSchema that sends the
//!   candidates to the `leader-election` level; kube-controller-manager's own renewals beside
//!   them (see `scenario::under_load`).
//!
//! It writes `results.md` and `failover.svg` (and the raw samples, `samples.json`) to `--out`.
//!
//! ```text
//! cargo run --release -p kube-leader-bench -- --mode full            # the README's figures
//! cargo run --release -p kube-leader-bench -- --mode ci --out target/bench-ci   # < 3 minutes
//! ```
//!
//! Exit codes: 0 when every scenario ran (goals not met are reported, not failures); 1 when a
//! scenario failed or the control plane could not start; 2 for bad flags.

mod apf;
mod audit;
mod candidate;
mod chart;
mod clock;
mod harness;
mod kcm;
mod load;
mod observe;
mod procfs;
mod report;
mod scenario;
mod stats;
mod swarm;

use std::{path::PathBuf, process::ExitCode, time::Instant};

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use kube_leader_testenv::{Assets, ControlPlane};

use crate::{
    candidate::Impl,
    harness::Header,
    harness::{Bench, Mode, Plan},
    report::Results,
    scenario::{
        for_life, handover, idle, lease,
        lease::Stop,
        scale, shards, sidecar,
        under_load::{self, Case, Subject},
    },
};

/// kube-leader's benchmarks against client-go, on a local control plane.
#[derive(Debug, Parser)]
#[command(
    name = "kube-leader-bench",
    about,
    after_help = "Exit codes: 0 every scenario ran; 1 a scenario failed; 2 bad flags."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// `ci`: few rounds, short timings and small scale, under 3 minutes. `full`: 20 rounds each,
    /// client-go's default timings, 100 and 1,000 candidates (about half an hour).
    #[arg(long, value_enum, default_value_t = Mode::Ci)]
    mode: Mode,
    /// Where to write results.md, failover.svg and samples.json.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/results"))]
    out: PathBuf,
    /// Run only these scenarios (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Scenario>,
    /// Rounds of each Lease failover scenario and of the sidecar's Lease handover, instead of
    /// the mode's (3 in `ci`, 20 in `full`): `--rounds 100` for a p99 that is not the maximum.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    rounds: Option<u16>,
    /// Seconds the Lease failover scenarios wait before each round's signal, instead of the
    /// mode's (1.5 in `ci`, 2 in `full`): `--settle 100` makes every follower idle for longer
    /// than hyper's 90 s pool timeout before it takes over.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    settle: Option<u16>,
    /// Run the Lease failover scenarios only with these implementations (comma-separated;
    /// default: all of them), e.g. `--only graceful --implementations kube-leader-http2` for the
    /// library's handover alone.
    #[arg(long, value_enum, value_delimiter = ',')]
    implementations: Vec<Impl>,
    /// Seconds of each window of `shards-hold`, `shards-hold-load` and `under-load`, instead of
    /// the mode's (full: 300 for the shards held, 600 under load; ci: 15).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    window_secs: Option<u32>,
    /// With the load (`shards-hold-load`, `under-load`): run with the FlowSchema, without it, or
    /// both (first with it).
    #[arg(long, value_enum, default_value_t = FlowSchemaCases::Both)]
    flowschema: FlowSchemaCases,
    /// The load generator's workers, instead of the mode's (full: 40).
    #[arg(long)]
    load_workers: Option<usize>,
    /// The load generator's ConfigMaps (8 KiB each), instead of the mode's (full: 2,500).
    #[arg(long)]
    load_configmaps: Option<usize>,
    /// The load generator's Pods, instead of the mode's (full: 300).
    #[arg(long)]
    load_pods: Option<usize>,
    /// The bound on the load generator's requests per run, instead of the mode's (full: 200,000).
    #[arg(long)]
    load_max_requests: Option<u64>,
}

/// Which load cases to run, for `--flowschema`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum FlowSchemaCases {
    Both,
    On,
    Off,
}

impl FlowSchemaCases {
    fn cases(self) -> Vec<Case> {
        match self {
            Self::Both => vec![Case::FlowSchema, Case::NoFlowSchema],
            Self::On => vec![Case::FlowSchema],
            Self::Off => vec![Case::NoFlowSchema],
        }
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Internal: many candidates in one process, for the scale scenarios.
    #[command(hide = true)]
    Swarm(swarm::SwarmArgs),
    /// Internal: the COMMAND of the sidecar handover scenarios (stamps its start and SIGTERM).
    #[command(hide = true)]
    Stamp,
    /// Internal: a load generator of other API users (lists and watches of large collections),
    /// for the scenarios under load.
    #[command(hide = true)]
    Load(load::LoadArgs),
}

/// The scenarios, for `--only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    ForLife,
    Graceful,
    Crash,
    Idle,
    Sidecar,
    /// Handovers through `kube-leader run` (issue 14).
    Handover,
    Scale,
    Shards,
    /// Shard Leases held for a window without load (1 process × N, and P processes sharing N).
    /// Only when named.
    ShardsHold,
    /// The same under the load, with the FlowSchema and without. Only when named.
    ShardsHoldLoad,
    /// A single Lease leader and a shard set under the load, with the FlowSchema and without.
    /// Only when named.
    UnderLoad,
}

impl Scenario {
    /// Run only when `--only` names them: long, and not for the test command's CI step.
    const ONLY_WHEN_NAMED: [Scenario; 3] = [
        Scenario::ShardsHold,
        Scenario::ShardsHoldLoad,
        Scenario::UnderLoad,
    ];
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Stamp) = cli.command {
        // COMMAND's first instruction: nothing before the stamp.
        return handover::stamp();
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,kube_client=off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kube-leader-bench: cannot start a tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Some(Command::Swarm(args)) => runtime.block_on(swarm::run(args)).map(|()| true),
        Some(Command::Load(args)) => runtime.block_on(load::run(args)).map(|()| true),
        Some(Command::Stamp) => unreachable!("handled above"),
        None => runtime.block_on(bench(cli)),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("kube-leader-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn step(what: &str) {
    eprintln!("==> {what}");
}

/// Runs the benchmark; `Ok(false)` when a scenario failed.
async fn bench(cli: Cli) -> anyhow::Result<bool> {
    let Cli {
        mode,
        out,
        only,
        implementations,
        ..
    } = cli;
    let mut plan = Plan::for_mode(mode);
    if let Some(n) = cli.rounds {
        plan.lease_rounds = usize::from(n);
    }
    if let Some(secs) = cli.settle {
        plan.settle = std::time::Duration::from_secs(secs.into());
    }
    if let Some(secs) = cli.window_secs {
        plan.hold_window = std::time::Duration::from_secs(secs.into());
        plan.under_load_window = plan.hold_window;
    }
    if let Some(n) = cli.load_workers {
        plan.load.workers = n;
        plan.load.watchers = plan.load.watchers.min(n);
    }
    if let Some(n) = cli.load_configmaps {
        plan.load.configmaps = n;
    }
    if let Some(n) = cli.load_pods {
        plan.load.pods = n;
    }
    if let Some(n) = cli.load_max_requests {
        plan.load.max_requests = n;
    }
    let wanted =
        |s: Scenario| only.contains(&s) || (only.is_empty() && !Scenario::ONLY_WHEN_NAMED.contains(&s));
    let under_load_wanted = Scenario::ONLY_WHEN_NAMED.into_iter().any(wanted);
    std::fs::create_dir_all(&out).with_context(|| format!("create {}", out.display()))?;
    let log_dir = std::env::temp_dir().join(format!("kube-leader-bench-{}", std::process::id()));
    std::fs::create_dir_all(&log_dir)?;

    step("finding the candidates (kube-leader, client-go, the kube-leader sidecar)");
    let bins = harness::find_binaries(mode, wanted(Scenario::Sidecar) || wanted(Scenario::Handover))?;
    if let Some(why) = &bins.sidecar_missing {
        eprintln!("    no sidecar: {why}");
    }
    let started = Instant::now();
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    step("starting the control plane");
    // For the load scenarios, the API server also trusts a client certificate for a
    // kube-controller-manager that elects itself, and audits its Lease requests (see kcm.rs).
    let extras = if under_load_wanted {
        Some(kcm::Extras::prepare(&log_dir.join("control-plane"))?)
    } else {
        None
    };
    let cp = match &extras {
        Some(x) => Assets::from_env()
            .and_then(|assets| ControlPlane::start_with_options(assets, x.options()))
            .map_err(anyhow::Error::from),
        None => ControlPlane::start().map_err(anyhow::Error::from),
    }
    .context("start the control plane (binaries: ./scripts/testenv-assets.sh, or KUBEBUILDER_ASSETS)")?;
    let admin = cp.client().await;
    let header = Header {
        date: command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        machine: machine(),
        commit: commit(),
        kubernetes: cp.kubernetes_version().to_string(),
        load,
        profile: if bins.sidecar_profile == bins.profile {
            format!("`{}`", bins.profile)
        } else {
            format!("`{}` (the sidecar: `{}`)", bins.profile, bins.sidecar_profile)
        },
        control_plane_started_in: cp.started_in(),
    };
    let sidecar_missing = bins.sidecar_missing.clone();
    let b = Bench::new(cp, admin, bins, plan.clone(), log_dir.clone());
    let mut r = Results {
        plan: plan.clone(),
        header,
        for_life: None,
        lease: Vec::new(),
        idle: Vec::new(),
        sidecar: None,
        handover: None,
        sidecar_missing,
        one_lock: Vec::new(),
        many: None,
        shard_process: None,
        shard_replicas: None,
        under_load: Vec::new(),
        load_plan: plan.load.clone(),
        kcm_identity: None,
        failures: Vec::new(),
        elapsed: Default::default(),
    };
    let failed = |r: &mut Results, name: String, e: anyhow::Error| {
        eprintln!("    FAILED: {e:#}");
        r.failures.push((name, format!("{e:#}")));
    };

    if wanted(Scenario::ForLife) {
        step(&format!(
            "for-life failover: {} Pod deletions, {} lock deletions",
            plan.for_life_pod_rounds, plan.for_life_rounds
        ));
        match for_life::run(&b, plan.for_life_pod_rounds, plan.for_life_rounds).await {
            Ok(f) => r.for_life = Some(f),
            Err(e) => failed(&mut r, "for-life failover".into(), e),
        }
    }
    for (stop, scenario) in [
        (Stop::Graceful, Scenario::Graceful),
        (Stop::Crash, Scenario::Crash),
    ] {
        if !wanted(scenario) {
            continue;
        }
        // The library over its HTTP/2 client beside kube's for the handover, where the client
        // matters; a crash takeover waits out the lease whatever the client.
        let imps: &[Impl] = match stop {
            Stop::Graceful => &Impl::ALL,
            Stop::Crash => &[Impl::KubeLeader, Impl::ClientGo],
        };
        let chosen = |imp: &&Impl| implementations.is_empty() || implementations.contains(imp);
        for &imp in imps.iter().filter(chosen) {
            let t = plan.failover_timings;
            step(&format!(
                "lease {}: {}, {} rounds, {}",
                stop.name(),
                imp.name(),
                plan.lease_rounds,
                t.label()
            ));
            match lease::run(&b, imp, stop, t, plan.lease_rounds).await {
                Ok(l) => r.lease.push(l),
                Err(e) => failed(&mut r, format!("lease {} ({})", stop.name(), imp.name()), e),
            }
        }
    }
    if wanted(Scenario::Idle) {
        for imp in [Impl::KubeLeader, Impl::ClientGo] {
            step(&format!(
                "idle API load and memory: {}, 1 leader + {} followers for {:?}",
                imp.name(),
                plan.idle_followers,
                plan.idle_window
            ));
            match idle::run(&b, imp, plan.idle_timings, plan.idle_followers, plan.idle_window).await {
                Ok(l) => r.idle.push(l),
                Err(e) => failed(&mut r, format!("idle load ({})", imp.name()), e),
            }
        }
    }
    if wanted(Scenario::Sidecar) && b.bins.sidecar.is_some() {
        step(&format!(
            "sidecar memory: two `kube-leader run` for {:?}",
            plan.sidecar_window
        ));
        match sidecar::run(&b, plan.sidecar_window).await {
            Ok(s) => r.sidecar = Some(s),
            Err(e) => {
                r.sidecar_missing = Some(format!("it failed: {e:#}"));
                failed(&mut r, "sidecar memory".into(), e);
            }
        }
    }
    if wanted(Scenario::Handover) && b.bins.sidecar.is_some() {
        let mut h = handover::SidecarHandover::default();
        let t = plan.failover_timings;
        step(&format!(
            "sidecar handover, lease: {} graceful handovers through `kube-leader run`, {}",
            plan.lease_rounds,
            t.label()
        ));
        if let Err(e) = handover::lease(&b, t, plan.lease_rounds, &mut h).await {
            failed(&mut r, "sidecar handover (lease)".into(), e);
        }
        step(&format!(
            "sidecar handover, leader for life: {} lock deletions through `kube-leader run`",
            plan.for_life_rounds
        ));
        if let Err(e) = handover::for_life(&b, plan.for_life_rounds, &mut h).await {
            failed(&mut r, "sidecar handover (leader for life)".into(), e);
        }
        r.handover = Some(h);
    }
    if wanted(Scenario::Scale) {
        for &n in &plan.scale {
            step(&format!("scale: {n} candidates on one Lease"));
            match scale::one_lock(&b, n, plan.idle_timings).await {
                Ok(o) => r.one_lock.push(o),
                Err(e) => failed(&mut r, format!("scale: {n} candidates on one Lease"), e),
            }
        }
        step(&format!("scale: one process holding {} Leases", plan.held_leases));
        match scale::many_leases(&b, plan.held_leases, plan.idle_timings).await {
            Ok(m) => r.many = Some(m),
            Err(e) => failed(
                &mut r,
                format!("scale: {} Leases in one process", plan.held_leases),
                e,
            ),
        }
    }
    if wanted(Scenario::Shards) {
        let t = plan.shard_timings;
        step(&format!(
            "shards: one process holding {} shard Leases for {:?}, {}",
            plan.shard_leases,
            plan.shard_window,
            t.label()
        ));
        match shards::one_process(&b, plan.shard_leases, t, plan.shard_window).await {
            Ok(m) => r.shard_process = Some(m),
            Err(e) => failed(
                &mut r,
                format!("shards: {} Leases in one process", plan.shard_leases),
                e,
            ),
        }
        let t = plan.replica_timings;
        step(&format!(
            "shards: {} replicas × {} shards, {}: start, idle {:?}, a join, a SIGKILL",
            plan.replicas,
            plan.replica_shards,
            t.label(),
            plan.replica_idle
        ));
        match shards::replicas(&b, plan.replicas, plan.replica_shards, t, plan.replica_idle).await {
            Ok(m) => r.shard_replicas = Some(m),
            Err(e) => failed(&mut r, format!("shards: {} replicas", plan.replicas), e),
        }
    }
    if under_load_wanted {
        let kcm = match &extras {
            Some(x) => {
                step("kube-controller-manager with leader election, as system:kube-controller-manager");
                match kcm::ElectedKcm::start(&b.cp, x, &b.admin).await {
                    Ok(k) => Some(k),
                    Err(e) => {
                        eprintln!("    kube-controller-manager's renewals will not be measured: {e:#}");
                        None
                    }
                }
            }
            None => None,
        };
        r.kcm_identity = kcm.as_ref().map(|k| k.identity.clone());
        under_load_scenarios(&b, kcm.as_ref(), &plan, cli.flowschema, &wanted, &mut r).await;
        if let Some(k) = kcm {
            eprintln!("    kube-controller-manager's log: {}", k.log().display());
            k.stop().await;
        }
    }
    r.elapsed = started.elapsed();

    let markdown = r.markdown();
    println!("{markdown}");
    let results_md = out.join("results.md");
    std::fs::write(&results_md, &markdown).with_context(|| format!("write {}", results_md.display()))?;
    std::fs::write(out.join("samples.json"), samples_json(&r).to_string())?;
    if !r.lease.is_empty() {
        let title = format!(
            "Lease failover, kube-leader vs client-go: signal → next leader ({}, {})",
            r.header.date,
            match mode {
                Mode::Ci => "CI-sized mode",
                Mode::Full => "full mode",
            }
        );
        chart::write(&out.join("failover.svg"), &title, &r.lease)?;
    }
    eprintln!(
        "==> wrote {} and failover.svg in {:.0?}",
        results_md.display(),
        r.elapsed
    );
    let ok = r.failures.is_empty();
    if ok && std::env::var_os("KUBE_LEADER_BENCH_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&log_dir);
    } else {
        eprintln!(
            "    candidates' logs are in {} (KUBE_LEADER_BENCH_KEEP keeps them)",
            log_dir.display()
        );
    }
    drop(b);
    Ok(ok)
}

/// `shards-hold`, `shards-hold-load` and `under-load`, as `wanted`.
async fn under_load_scenarios(
    b: &Bench,
    kcm: Option<&kcm::ElectedKcm>,
    plan: &Plan,
    flowschema: FlowSchemaCases,
    wanted: &dyn Fn(Scenario) -> bool,
    r: &mut Results,
) {
    let mut env = match under_load::Env::new(b, kcm, plan.load.clone()) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("    FAILED: {e:#}");
            r.failures.push(("under load".into(), format!("{e:#}")));
            return;
        }
    };
    let t = plan.load_timings;
    let holds = [
        Subject::Shards {
            processes: 1,
            shards: plan.hold_shards,
        },
        Subject::Shards {
            processes: plan.hold_replicas,
            shards: plan.hold_shards,
        },
    ];
    let mut runs: Vec<(&'static str, Subject, Case, std::time::Duration)> = Vec::new();
    if wanted(Scenario::ShardsHold) {
        runs.extend(holds.map(|s| ("shards-hold", s, Case::Quiet, plan.hold_window)));
    }
    if wanted(Scenario::ShardsHoldLoad) {
        for case in flowschema.cases() {
            runs.extend(holds.map(|s| ("shards-hold-load", s, case, plan.hold_window)));
        }
    }
    if wanted(Scenario::UnderLoad) {
        for case in flowschema.cases() {
            for s in [
                Subject::Single,
                Subject::Shards {
                    processes: 1,
                    shards: plan.under_load_shards,
                },
            ] {
                runs.push(("under-load", s, case, plan.under_load_window));
            }
        }
    }
    for (scenario, subject, case, window) in runs {
        step(&format!(
            "{scenario}: {}, {}, {} for {window:?}",
            subject.label(),
            case.label(),
            t.label()
        ));
        match env.run(scenario, subject, case, t, window).await {
            Ok(run) => {
                eprintln!("    {}", run.summary());
                r.under_load.push(run);
            }
            Err(e) => {
                eprintln!("    FAILED: {e:#}");
                r.failures.push((
                    format!("{scenario}: {}, {}", subject.label(), case.label()),
                    format!("{e:#}"),
                ));
            }
        }
    }
}

fn samples_json(r: &Results) -> serde_json::Value {
    let ms = |v: &[std::time::Duration]| v.iter().map(|d| d.as_secs_f64() * 1e3).collect::<Vec<_>>();
    let lease: Vec<_> = r
        .lease
        .iter()
        .map(|l| {
            serde_json::json!({
                "implementation": l.imp.name(), "stop": format!("{:?}", l.stop), "timings": l.timings.label(),
                "signal_to_leader_ms": ms(&l.samples), "signal_to_release_ms": ms(&l.to_release),
                "release_to_leader_ms": ms(&l.release_to_leader), "renewal_to_leader_ms": ms(&l.renewal_to_leader),
            })
        })
        .collect();
    let for_life = r.for_life.as_ref().map(|f| {
        serde_json::json!({
            "pod_deleted_to_leader_ms": ms(&f.pod_deleted), "gc_delay_ms": ms(&f.gc_delay),
            "pod_deleted_to_lock_gone_ms": ms(&f.pod_to_lock_gone), "lock_gone_to_leader_ms": ms(&f.lock_gone_to_leader),
            "lock_deleted_by_candidate": f.deleted_by_candidate, "lock_deleted_to_leader_ms": ms(&f.lock_deleted),
            "lock_deleted_to_loss_ms": ms(&f.loss_seen), "lock_deleted_to_deletion_seen_ms": ms(&f.deletion_seen),
            "lock_deleted_to_new_lock_seen_ms": ms(&f.recreated_seen),
        })
    });
    serde_json::json!({ "date": r.header.date, "mode": format!("{:?}", r.plan.mode), "lease": lease, "for_life": for_life })
}

fn command_output(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// CPU model, cores, memory, kernel.
fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")?
                .split_once(':')
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines().find_map(|l| {
                l.strip_prefix("MemTotal:")?
                    .split_whitespace()
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
        })
        .map_or(0.0, |kib| kib as f64 / 1024.0 / 1024.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{model}, {cores} cores, {mem_gib:.0} GiB, Linux {}",
        kernel.trim()
    )
}

/// The commit, marked when the work tree has changes.
fn commit() -> String {
    let rev = command_output("git", &["rev-parse", "--short", "HEAD"]);
    let dirty = !command_output("git", &["status", "--porcelain"]).is_empty();
    match (rev.is_empty(), dirty) {
        (true, _) => "unknown".into(),
        (false, true) => format!("{rev} (with uncommitted changes)"),
        (false, false) => rev,
    }
}
