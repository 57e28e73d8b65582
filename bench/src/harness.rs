//! What every scenario needs: the control plane, its users, the programs to start, the plan.

use std::{
    path::{Path, PathBuf},
    process::Command as StdCommand,
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use anyhow::{bail, Context};
use k8s_openapi::api::{coordination::v1::Lease, core::v1::ConfigMap, rbac::v1::PolicyRule};
use kube::{api::ListParams, Api, Client};
use kube_leader_testenv::{bind_role, rule, ControlPlane, TestNamespace, RESTRICTED_USERS};

use crate::candidate::{Binaries, Timings};

/// The load generator's settings.
#[derive(Debug, Clone)]
pub(crate) struct LoadPlan {
    /// API users of the load (none of them a candidate).
    pub(crate) users: usize,
    pub(crate) configmaps: usize,
    pub(crate) configmap_bytes: usize,
    pub(crate) pods: usize,
    pub(crate) pod_bytes: usize,
    pub(crate) workers: usize,
    pub(crate) watchers: usize,
    pub(crate) writes_per_sec: f64,
    /// The bound on its requests per run.
    pub(crate) max_requests: u64,
    /// How long it runs before the candidates start.
    pub(crate) warmup: Duration,
}

impl LoadPlan {
    pub(crate) fn label(&self) -> String {
        format!(
            "{} users, {} workers ({} watching, the others listing), {} ConfigMaps × {} KiB and {} Pods × {} KiB \
             annotation, {} ConfigMap patches/s, at most {} requests, {} s before the candidates start",
            self.users,
            self.workers,
            self.watchers.min(self.workers),
            self.configmaps,
            self.configmap_bytes / 1024,
            self.pods,
            self.pod_bytes / 1024,
            self.writes_per_sec,
            self.max_requests,
            self.warmup.as_secs()
        )
    }
}

/// When and where.
#[derive(Debug, Clone)]
pub(crate) struct Header {
    pub(crate) date: String,
    pub(crate) machine: String,
    pub(crate) commit: String,
    /// The Kubernetes release of the control plane.
    pub(crate) kubernetes: String,
    pub(crate) load: String,
    /// The cargo profile(s) the Rust candidates were built with, formatted.
    pub(crate) profile: String,
    pub(crate) control_plane_started_in: Duration,
}

/// How big a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Mode {
    /// A few rounds at small scale, in under 3 minutes: keeps the harness from rotting.
    Ci,
    /// At least 20 rounds per failover scenario, client-go's default timings, 100 and 1,000
    /// candidates: the figures for the README.
    Full,
}

/// The sizes of one run.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) mode: Mode,
    /// Rounds of the leader-for-life lock deletions and of the sidecar's for-life handover.
    pub(crate) for_life_rounds: usize,
    /// Rounds of the leader-for-life Pod deletions. Each waits out the deleted Pod's grace
    /// period and 2 s (about 32 s: no kubelet tells the old process to stop), so CI mode runs one.
    pub(crate) for_life_pod_rounds: usize,
    /// Rounds of each Lease failover scenario, per implementation.
    pub(crate) lease_rounds: usize,
    /// Timings of the Lease failover scenarios, the same for both implementations.
    pub(crate) failover_timings: Timings,
    /// Timings of the idle-load, memory and scale scenarios (client-go's defaults in both modes).
    pub(crate) idle_timings: Timings,
    /// How long 1 leader and [`Plan::idle_followers`] followers are left idle.
    pub(crate) idle_window: Duration,
    pub(crate) idle_followers: usize,
    /// How long the sidecar candidates run before their memory is read.
    pub(crate) sidecar_window: Duration,
    /// Candidates on one Lease, one run each.
    pub(crate) scale: Vec<usize>,
    /// Graceful failovers per scale run.
    pub(crate) scale_rounds: usize,
    /// Idle window of each scale run.
    pub(crate) scale_window: Duration,
    /// Leases held by one process.
    pub(crate) held_leases: usize,
    /// Candidates sharing one client (one API user) in the scale runs.
    pub(crate) per_client: usize,
    /// Pause between rounds, so that a restarted candidate is watching again.
    pub(crate) settle: Duration,
    /// Shards held by one `shard-candidate` process, its timings and its window.
    pub(crate) shard_leases: u32,
    pub(crate) shard_timings: Timings,
    pub(crate) shard_window: Duration,
    /// Replicas sharing [`Plan::replica_shards`] shards, their timings and idle window.
    pub(crate) replicas: usize,
    pub(crate) replica_shards: u32,
    pub(crate) replica_timings: Timings,
    pub(crate) replica_idle: Duration,
    /// `shards-hold`: one set of [`Plan::hold_shards`] shard Leases held by one process, then by
    /// [`Plan::hold_replicas`] processes, for [`Plan::hold_window`].
    pub(crate) hold_shards: u32,
    pub(crate) hold_replicas: usize,
    pub(crate) hold_window: Duration,
    /// `under-load`: a single Lease leader and a set of this many shards in one process, each
    /// for [`Plan::under_load_window`].
    pub(crate) under_load_shards: u32,
    pub(crate) under_load_window: Duration,
    /// Timings of the load scenarios (the users' defaults).
    pub(crate) load_timings: Timings,
    /// The load generator of `shards-hold-load` and `under-load`.
    pub(crate) load: LoadPlan,
}

// === impl Plan ===

impl Plan {
    pub(crate) fn for_mode(mode: Mode) -> Self {
        match mode {
            Mode::Ci => Self {
                mode,
                for_life_rounds: 3,
                for_life_pod_rounds: 1,
                lease_rounds: 3,
                failover_timings: Timings::SHORT,
                idle_timings: Timings::DEFAULT,
                idle_window: Duration::from_secs(10),
                idle_followers: 9,
                sidecar_window: Duration::from_secs(4),
                scale: vec![20],
                scale_rounds: 2,
                scale_window: Duration::from_secs(5),
                held_leases: 50,
                per_client: 50,
                settle: Duration::from_millis(1500),
                shard_leases: 100,
                shard_timings: Timings::DEFAULT,
                shard_window: Duration::from_secs(10),
                replicas: 3,
                replica_shards: 30,
                replica_timings: Timings::SHORT,
                replica_idle: Duration::from_secs(5),
                // Only with `--only`: a tiny version that keeps the plumbing working.
                hold_shards: 100,
                hold_replicas: 10,
                hold_window: Duration::from_secs(15),
                under_load_shards: 20,
                under_load_window: Duration::from_secs(15),
                load_timings: Timings::DEFAULT,
                load: LoadPlan {
                    users: 2,
                    configmaps: 200,
                    configmap_bytes: 8192,
                    pods: 30,
                    pod_bytes: 2048,
                    workers: 8,
                    watchers: 2,
                    writes_per_sec: 5.0,
                    max_requests: 5_000,
                    warmup: Duration::from_secs(3),
                },
            },
            Mode::Full => Self {
                mode,
                for_life_rounds: 20,
                for_life_pod_rounds: 20,
                lease_rounds: 20,
                failover_timings: Timings::DEFAULT,
                idle_timings: Timings::DEFAULT,
                idle_window: Duration::from_secs(60),
                idle_followers: 9,
                sidecar_window: Duration::from_secs(20),
                scale: vec![100, 1000],
                scale_rounds: 5,
                scale_window: Duration::from_secs(30),
                held_leases: 1000,
                per_client: 50,
                settle: Duration::from_secs(2),
                shard_leases: 1000,
                shard_timings: Timings::DEFAULT,
                shard_window: Duration::from_secs(300),
                replicas: 3,
                replica_shards: 100,
                replica_timings: Timings::DEFAULT,
                replica_idle: Duration::from_secs(60),
                hold_shards: 1000,
                hold_replicas: 10,
                hold_window: Duration::from_secs(300),
                under_load_shards: 100,
                under_load_window: Duration::from_secs(600),
                load_timings: Timings::DEFAULT,
                load: LoadPlan {
                    users: 4,
                    configmaps: 2500,
                    configmap_bytes: 8192,
                    pods: 300,
                    pod_bytes: 2048,
                    workers: 40,
                    watchers: 8,
                    writes_per_sec: 10.0,
                    max_requests: 200_000,
                    warmup: Duration::from_secs(15),
                },
            },
        }
    }
}

/// The control plane and everything a scenario needs around it.
pub(crate) struct Bench {
    pub(crate) cp: ControlPlane,
    pub(crate) admin: Client,
    pub(crate) bins: Binaries,
    pub(crate) plan: Plan,
    /// Where candidates' stderr goes.
    pub(crate) log_dir: PathBuf,
    next_user: AtomicUsize,
}

impl std::fmt::Debug for Bench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bench")
            .field("cp", &self.cp)
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
}

// === impl Bench ===

impl Bench {
    pub(crate) fn new(cp: ControlPlane, admin: Client, bins: Binaries, plan: Plan, log_dir: PathBuf) -> Self {
        Self {
            cp,
            admin,
            bins,
            plan,
            log_dir,
            next_user: AtomicUsize::new(0),
        }
    }

    /// `n` API users for one scenario. There are only 40, so scenarios reuse them in turn;
    /// requests are always counted over a window in which only this scenario's candidates run.
    pub(crate) fn users(&self, n: usize) -> anyhow::Result<Vec<String>> {
        if n > RESTRICTED_USERS {
            bail!("{n} users asked for; the control plane has {RESTRICTED_USERS}");
        }
        let first = self.next_user.fetch_add(n, Ordering::Relaxed) % RESTRICTED_USERS;
        Ok((0..n)
            .map(|i| format!("user-{}", (first + i) % RESTRICTED_USERS + 1))
            .collect())
    }

    pub(crate) fn kubeconfig(&self, user: &str) -> anyhow::Result<PathBuf> {
        Ok(self.cp.user_kubeconfig_path(user)?.to_owned())
    }

    /// A namespace where `users` may do what a Lease candidate does.
    pub(crate) async fn lease_namespace(&self, users: &[String]) -> anyhow::Result<TestNamespace> {
        let rules = vec![rule(
            &["coordination.k8s.io"],
            &["leases"],
            &["get", "list", "watch", "create", "update", "patch", "delete"],
        )];
        let ns = self.namespace_for(users, rules).await?;
        let lp = ListParams::default().limit(1);
        for user in users {
            let api = Api::<Lease>::namespaced(self.cp.user_client(user).await, ns.name());
            wait_allowed(user, || api.list(&lp)).await?;
        }
        Ok(ns)
    }

    /// A namespace where `users` may do what a leader-for-life candidate does
    /// (`deploy/for-life/rbac-for-life.yaml`).
    pub(crate) async fn for_life_namespace(&self, users: &[String]) -> anyhow::Result<TestNamespace> {
        let rules = vec![
            rule(
                &[""],
                &["configmaps"],
                &["get", "list", "watch", "create", "update", "delete"],
            ),
            rule(&[""], &["pods"], &["get", "list", "watch", "delete"]),
            rule(&[""], &["events"], &["create"]),
            // The candidates' registrations (a leader stepping down prefers a registered
            // successor): what `kube-leader rbac --strategy for-life` grants.
            rule(
                &["coordination.k8s.io"],
                &["leases"],
                &["create", "patch", "delete", "list", "watch"],
            ),
        ];
        let ns = self.namespace_for(users, rules).await?;
        let lp = ListParams::default().limit(1);
        for user in users {
            let api = Api::<ConfigMap>::namespaced(self.cp.user_client(user).await, ns.name());
            wait_allowed(user, || api.list(&lp)).await?;
        }
        Ok(ns)
    }

    /// A namespace where the load generator's `users` may list, watch, create and patch
    /// ConfigMaps and Pods (`kube-leader-bench load`).
    pub(crate) async fn load_namespace(&self, users: &[String]) -> anyhow::Result<TestNamespace> {
        let rules = vec![rule(
            &[""],
            &["configmaps", "pods"],
            &["get", "list", "watch", "create", "update", "patch", "delete"],
        )];
        let ns = self.namespace_for(users, rules).await?;
        let lp = ListParams::default().limit(1);
        for user in users {
            let client = self.cp.user_client(user).await;
            let cms = Api::<ConfigMap>::namespaced(client.clone(), ns.name());
            wait_allowed(user, || cms.list(&lp)).await?;
            let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client, ns.name());
            wait_allowed(user, || pods.list(&lp)).await?;
        }
        Ok(ns)
    }

    async fn namespace_for(&self, users: &[String], rules: Vec<PolicyRule>) -> anyhow::Result<TestNamespace> {
        let ns = self.cp.namespace().await;
        for user in users {
            bind_role(&self.admin, ns.name(), user, rules.clone())
                .await
                .with_context(|| format!("bind a Role to {user} in {}", ns.name()))?;
        }
        Ok(ns)
    }
}

/// Waits until the RBAC authorizer lets `user` do `probe` (its informer lags the binding).
async fn wait_allowed<T, F, Fut>(user: &str, mut probe: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = kube::Result<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match probe().await {
            Ok(_) => return Ok(()),
            Err(e) if tokio::time::Instant::now() > deadline => {
                bail!("{user} is still not allowed after 20 s: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

// === finding and building the programs ===

/// Finds (and, under `cargo run`, builds) the programs the benchmark starts.
///
/// - the kube-leader Lease candidate `lease-candidate` (crate kube-leader-e2e) and the
///   `kube-leader` sidecar (crate kube-leader-cli): `KUBE_LEADER_LEASE_CANDIDATE` and
///   `KUBE_LEADER_CLI` if set, else in the target directory, built first when this runs under
///   `cargo run` (cargo sets `CARGO`): the candidate with this program's profile, the sidecar in
///   full mode with the workspace's `sidecar` profile (the shipped build) if there is one;
/// - the client-go candidate: `KUBE_LEADER_GO_CANDIDATE`, else `scripts/go-candidate.sh`.
///
/// Without `need_sidecar` (no scenario asked for runs it) the sidecar is neither built nor looked
/// for.
pub(crate) fn find_binaries(mode: Mode, need_sidecar: bool) -> anyhow::Result<Binaries> {
    let bench = std::env::current_exe().context("locate this program")?;
    let dir = bench
        .parent()
        .context("this program has no directory")?
        .to_owned();
    let profile = match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev".to_owned(),
        Some(other) => other.to_owned(),
        None => "release".to_owned(),
    };

    let lease_candidate = match std::env::var_os("KUBE_LEADER_LEASE_CANDIDATE") {
        Some(p) => PathBuf::from(p),
        None => {
            if let Err(e) = cargo_build(&profile, "kube-leader-e2e", "lease-candidate") {
                eprintln!("kube-leader-bench: could not build lease-candidate: {e:#}");
            }
            dir.join("lease-candidate")
        }
    };
    if !lease_candidate.is_file() {
        bail!(
            "no kube-leader Lease candidate at {}: run `cargo build --profile {profile} -p kube-leader-e2e \
             --bin lease-candidate`, or set KUBE_LEADER_LEASE_CANDIDATE",
            lease_candidate.display()
        );
    }

    let shard_candidate = match std::env::var_os("KUBE_LEADER_SHARD_CANDIDATE") {
        Some(p) => PathBuf::from(p),
        None => {
            if let Err(e) = cargo_build(&profile, "kube-leader-e2e", "shard-candidate") {
                eprintln!("kube-leader-bench: could not build shard-candidate: {e:#}");
            }
            dir.join("shard-candidate")
        }
    };
    if !shard_candidate.is_file() {
        bail!(
            "no shard candidate at {}: run `cargo build --profile {profile} -p kube-leader-e2e \
             --bin shard-candidate`, or set KUBE_LEADER_SHARD_CANDIDATE",
            shard_candidate.display()
        );
    }

    // The sidecar as shipped: the workspace's `sidecar` profile, if it has one (full mode only:
    // its LTO build takes minutes), else this program's profile.
    let workspace =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml")).unwrap_or_default();
    let sidecar_profile = if mode == Mode::Full && workspace.contains("[profile.sidecar]") {
        "sidecar".to_owned()
    } else {
        profile.clone()
    };
    let sidecar_dir = match sidecar_profile.as_str() {
        "dev" | "release" => dir.clone(),
        other => dir
            .parent()
            .map_or_else(|| dir.clone(), |target| target.join(other)),
    };
    let (sidecar, sidecar_missing) = match std::env::var_os("KUBE_LEADER_CLI").filter(|p| !p.is_empty()) {
        _ if !need_sidecar => (None, Some("no scenario asked for needs it".into())),
        Some(p) => check_sidecar(PathBuf::from(p)),
        None => match cargo_build(&sidecar_profile, "kube-leader-cli", "kube-leader") {
            Ok(()) => check_sidecar(sidecar_dir.join("kube-leader")),
            Err(_) if sidecar_dir.join("kube-leader").is_file() && std::env::var_os("CARGO").is_none() => {
                check_sidecar(sidecar_dir.join("kube-leader"))
            }
            Err(e) => (None, Some(format!("the kube-leader CLI did not build: {e:#}"))),
        },
    };

    let go_candidate = match std::env::var_os("KUBE_LEADER_GO_CANDIDATE") {
        Some(p) => PathBuf::from(p),
        None => {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/go-candidate.sh");
            let out = StdCommand::new(&script)
                .output()
                .with_context(|| format!("run {}", script.display()))?;
            if !out.status.success() {
                bail!(
                    "{} failed: {}",
                    script.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
    };
    if !go_candidate.is_file() {
        bail!("no client-go candidate at {}", go_candidate.display());
    }
    Ok(Binaries {
        lease_candidate,
        shard_candidate,
        go_candidate,
        sidecar,
        sidecar_missing,
        bench,
        profile,
        sidecar_profile,
    })
}

/// `cargo build --profile <profile> -p <package> --bin <bin>`, when running under cargo.
fn cargo_build(profile: &str, package: &str, bin: &str) -> anyhow::Result<()> {
    let Some(cargo) = std::env::var_os("CARGO") else {
        bail!("not run by cargo (CARGO is not set), so {bin} is not built");
    };
    eprintln!("kube-leader-bench: cargo build --profile {profile} -p {package} --bin {bin}");
    let out = StdCommand::new(cargo)
        .args(["build", "--profile", profile, "-p", package, "--bin", bin])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .context("run cargo")?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let first_error = stderr
        .lines()
        .find(|l| l.starts_with("error"))
        .unwrap_or("(no error line)");
    bail!("cargo build -p {package} failed: {first_error}")
}

/// The sidecar if `kube-leader run --help` works.
fn check_sidecar(path: PathBuf) -> (Option<PathBuf>, Option<String>) {
    match StdCommand::new(&path).args(["run", "--help"]).output() {
        Ok(out) if out.status.success() => (Some(path), None),
        Ok(out) => (
            None,
            Some(format!(
                "`{} run --help` exited with {}",
                path.display(),
                out.status
            )),
        ),
        Err(e) => (None, Some(format!("cannot run {}: {e}", path.display()))),
    }
}
