//! Leader election under load, with API Priority and Fairness on (the API server's default):
//!
//! - `shards-hold`: one `shard-candidate` process holding a set of N shard Leases, and P
//!   processes sharing one set of N (N/P each), for a window: all held after, Leases lost,
//!   writes against the ideal (N / retry period), answers by verb and status, peak RSS and CPU
//!   per process, the renewals' latency at the API server, and kube-controller-manager's own
//!   renewals in the same window;
//! - `shards-hold-load`: the same while the load generator (`kube-leader-bench load`, as other
//!   API users) keeps the API server's priority levels full, with the FlowSchema that sends the
//!   candidates to the `leader-election` level ([`crate::apf`]) and without it;
//! - `under-load`: a single Lease leader (`lease-candidate`, one process) and a set of shards in
//!   one process, each for a window under the load, with the FlowSchema and without: losses (the
//!   bench causes none, so every loss is spurious), the time without a holder, renewal latency,
//!   429 and 504 answers, the load's own answers, and the machine's load average.
//!
//! Renewal latency is the API server's time on each Lease `update` of the candidates' users,
//! from its audit log: `stageTimestamp − requestReceivedTimestamp` of the `ResponseComplete`
//! event, queueing by API Priority and Fairness included, the network and the client not.

use std::{collections::BTreeMap, fmt::Write as _, path::PathBuf, time::Duration};

use anyhow::{bail, Context};
use nix::sys::signal::Signal;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::Child,
    sync::mpsc,
};

use crate::{
    apf::{self, ApfWindow},
    audit::{self, Request},
    candidate::{guarded, Event, Fleet, Impl, Timings},
    clock::{between, mono_ns},
    harness::{Bench, Header, LoadPlan},
    kcm::{self, ElectedKcm},
    procfs::{self, mib, Memory},
    scenario::shards::{self, Codes},
    stats::{fmt, Summary},
};

/// Whether the API server is loaded, and where the candidates' requests go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Case {
    /// No load, no FlowSchema: the candidates' requests go to `global-default`.
    Quiet,
    /// The load, and the FlowSchema: the candidates' requests go to `leader-election`.
    FlowSchema,
    /// The load, no FlowSchema: the candidates share `global-default` with the load.
    NoFlowSchema,
}

impl Case {
    pub(crate) fn loaded(self) -> bool {
        self != Case::Quiet
    }

    pub(crate) fn flow_schema(self) -> bool {
        self == Case::FlowSchema
    }

    pub(crate) fn label(self) -> &'static str {
        match self {
            Case::Quiet => "no load, no FlowSchema",
            Case::FlowSchema => "load, FlowSchema → `leader-election`",
            Case::NoFlowSchema => "load, no FlowSchema (`global-default`)",
        }
    }
}

/// What a run holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Subject {
    /// One shard set of `shards` Leases shared by `processes` `shard-candidate` processes.
    Shards { processes: usize, shards: u32 },
    /// One Lease, one `lease-candidate` process (kube's default client).
    Single,
}

impl Subject {
    pub(crate) fn label(self) -> String {
        match self {
            Subject::Shards { processes: 1, shards } => format!("1 process × {shards} shard Leases"),
            Subject::Shards { processes, shards } => format!(
                "{processes} processes × {} shard Leases (one set of {shards})",
                shards as usize / processes.max(1)
            ),
            Subject::Single => "single Lease leader (`lease-candidate`)".into(),
        }
    }

    fn processes(self) -> usize {
        match self {
            Subject::Shards { processes, .. } => processes,
            Subject::Single => 1,
        }
    }

    fn leases(self) -> u32 {
        match self {
            Subject::Shards { shards, .. } => shards,
            Subject::Single => 1,
        }
    }
}

/// kube-controller-manager's Lease over a window.
#[derive(Debug, Clone, Default)]
pub(crate) struct KcmWindow {
    /// Latency of its Lease `update`s.
    pub(crate) renewals: Vec<Duration>,
    /// Its Lease requests by verb and status.
    pub(crate) codes: Codes,
    /// Times it exited (it exits when it loses its Lease) in the window.
    pub(crate) exits: usize,
    /// Log lines of failed renewals or a lost Lease in the window.
    pub(crate) failures_logged: usize,
}

impl KcmWindow {
    fn failed(&self) -> u64 {
        self.codes
            .values()
            .flat_map(|c| c.iter())
            .filter(|(code, _)| !(200..300).contains(*code))
            .map(|(_, n)| *n)
            .sum()
    }
}

/// What the load generator said at its end.
#[derive(Debug, Clone, Default)]
pub(crate) struct LoadOutcome {
    pub(crate) created: u64,
    pub(crate) setup_s: f64,
    pub(crate) elapsed_s: f64,
    pub(crate) stopped_by: String,
    pub(crate) sent: u64,
    /// Answers by HTTP status (`0`: none).
    pub(crate) answered: BTreeMap<String, u64>,
    pub(crate) by_kind: BTreeMap<String, BTreeMap<String, u64>>,
    /// LIST latency per kind, as the load saw it: (n, p50 ms, p99 ms).
    pub(crate) list_latency: BTreeMap<String, (u64, f64, f64)>,
    pub(crate) mib: f64,
    pub(crate) watch_events: u64,
}

impl LoadOutcome {
    fn parse(loading: &serde_json::Value, done: &serde_json::Value) -> Self {
        let map = |v: &serde_json::Value| -> BTreeMap<String, u64> {
            v.as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
                        .collect()
                })
                .unwrap_or_default()
        };
        Self {
            created: loading["created"].as_u64().unwrap_or(0),
            setup_s: loading["setup_s"].as_f64().unwrap_or(0.0),
            elapsed_s: done["elapsed_s"].as_f64().unwrap_or(0.0),
            stopped_by: done["stopped_by"].as_str().unwrap_or("?").to_owned(),
            sent: done["sent"].as_u64().unwrap_or(0),
            answered: map(&done["answered"]),
            by_kind: done["by_kind"]
                .as_object()
                .map(|m| m.iter().map(|(k, v)| (k.clone(), map(v))).collect())
                .unwrap_or_default(),
            list_latency: done["list_latency_ms"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| {
                            (
                                k.clone(),
                                (
                                    v["n"].as_u64().unwrap_or(0),
                                    v["p50"].as_f64().unwrap_or(0.0),
                                    v["p99"].as_f64().unwrap_or(0.0),
                                ),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default(),
            mib: done["mib_received"].as_f64().unwrap_or(0.0),
            watch_events: done["watch_events"].as_u64().unwrap_or(0),
        }
    }

    fn count(&self, pred: impl Fn(u16) -> bool) -> u64 {
        self.answered
            .iter()
            .filter(|(c, _)| c.parse::<u16>().is_ok_and(&pred))
            .map(|(_, n)| *n)
            .sum()
    }

    /// `200 / 429 / 5xx / none` answered.
    fn answers(&self) -> String {
        format!(
            "{} / {} / {} / {}",
            self.count(|c| (200..300).contains(&c)),
            self.count(|c| c == 429),
            self.count(|c| c >= 500),
            self.count(|c| c == 0)
        )
    }
}

/// One run: a subject holding its Leases for a window in one case.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    /// `shards-hold`, `shards-hold-load` or `under-load`.
    pub(crate) scenario: &'static str,
    pub(crate) subject: Subject,
    pub(crate) case: Case,
    pub(crate) timings: Timings,
    /// When it started (UTC).
    pub(crate) date: String,
    /// Started → every Lease held (the shards evenly spread); `None`: not within the bound.
    pub(crate) all_held: Option<Duration>,
    pub(crate) held_at_start: usize,
    pub(crate) held_at_end: usize,
    /// Losses in the window (`stopped_leading`; the bench causes none).
    pub(crate) losses: usize,
    /// Time the lost Leases went without this subject holding them again (to the window's end
    /// at most): summed, and the longest.
    pub(crate) unheld_total: Duration,
    pub(crate) unheld_longest: Duration,
    pub(crate) window: Duration,
    /// The candidates' requests by verb and status.
    pub(crate) codes: Codes,
    /// Latency of the candidates' Lease `update`s (renewals, and takeovers after a loss).
    pub(crate) renewals: Vec<Duration>,
    /// Peak RSS and CPU (1.0 = a core) per process.
    pub(crate) memory: Vec<Memory>,
    pub(crate) cpu: Vec<f64>,
    pub(crate) kcm: Option<KcmWindow>,
    pub(crate) apf: ApfWindow,
    pub(crate) load: Option<LoadOutcome>,
    /// Why the load has no outcome, if it has none.
    pub(crate) load_problem: Option<String>,
    /// The `leader-election` priority level's configuration.
    pub(crate) level: Option<String>,
    /// CPU (1.0 = a core) of the control plane's processes in the window, by program.
    pub(crate) control_plane_cpu: Vec<(String, f64)>,
}

impl Run {
    fn count(&self, verb: Option<&str>, code: u16) -> u64 {
        self.codes
            .iter()
            .filter(|(v, _)| verb.is_none_or(|w| w == v.as_str()))
            .filter_map(|(_, c)| c.get(&code))
            .sum()
    }

    fn writes(&self, ok_only: bool) -> u64 {
        ["create", "update", "patch", "delete"]
            .iter()
            .flat_map(|v| self.codes.get(*v))
            .flat_map(|c| c.iter())
            .filter(|(code, _)| !ok_only || (200..300).contains(*code))
            .map(|(_, n)| *n)
            .sum()
    }

    /// N / retry period.
    pub(crate) fn ideal(&self) -> f64 {
        f64::from(self.subject.leases()) / self.timings.retry.as_secs_f64()
    }

    pub(crate) fn writes_per_second(&self) -> f64 {
        self.writes(false) as f64 / self.window.as_secs_f64()
    }

    /// Writes answered 2xx per second, over the ideal.
    pub(crate) fn ratio(&self) -> f64 {
        self.writes(true) as f64 / self.window.as_secs_f64() / self.ideal()
    }

    pub(crate) fn peak_rss(&self) -> u64 {
        self.memory.iter().map(|m| m.hwm_kib).max().unwrap_or(0)
    }

    fn latency(v: &[Duration]) -> String {
        Summary::of(v).map_or("—".into(), |s| format!("{} / {}", fmt(s.p50), fmt(s.p99)))
    }

    fn kcm_cell(&self) -> String {
        match &self.kcm {
            Some(k) => format!(
                "{} ({} renewals, {} failed, {} exits)",
                Self::latency(&k.renewals),
                k.renewals.len(),
                k.failed(),
                k.exits
            ),
            None => "not measured".into(),
        }
    }

    /// One line for stderr as soon as it is measured.
    pub(crate) fn summary(&self) -> String {
        format!(
            "{} / {}: all held after {}, {} lost, writes {:.1}/s (ideal {:.1}, 2xx {:.3}×), renewal p50/p99 {}, 429: {}, \
             504: {}, peak RSS {}, kcm renewals {}, control plane CPU {}, load average {}",
            self.subject.label(),
            self.case.label(),
            self.all_held.map_or("not reached".into(), fmt),
            self.losses,
            self.writes_per_second(),
            self.ideal(),
            self.ratio(),
            Self::latency(&self.renewals),
            self.count(None, 429),
            self.count(None, 504),
            mib(self.peak_rss()),
            self.kcm_cell(),
            cpu_line(&self.control_plane_cpu),
            self.apf.load.label()
        )
    }
}

/// A running load generator.
#[derive(Debug)]
struct LoadSession {
    child: Child,
    pid: u32,
    lines: mpsc::UnboundedReceiver<serde_json::Value>,
    loading: serde_json::Value,
    log: PathBuf,
}

impl LoadSession {
    /// Starts `kube-leader-bench load`, waits until its objects exist and it runs, then the
    /// plan's warm-up.
    async fn start(
        b: &Bench,
        plan: &LoadPlan,
        namespace: &str,
        users: &[String],
        duration: Duration,
        n: usize,
    ) -> anyhow::Result<Self> {
        let log = b.log_dir.join(format!("load-{n}.log"));
        let stderr = std::fs::File::create(&log)?;
        let mut command = guarded(&b.bins.bench);
        command
            .args(["load", "--namespace", namespace])
            .args(["--configmaps", &plan.configmaps.to_string()])
            .args(["--configmap-bytes", &plan.configmap_bytes.to_string()])
            .args(["--pods", &plan.pods.to_string()])
            .args(["--pod-bytes", &plan.pod_bytes.to_string()])
            .args(["--workers", &plan.workers.to_string()])
            .args(["--watchers", &plan.watchers.to_string()])
            .args(["--writes-per-sec", &plan.writes_per_sec.to_string()])
            .args(["--duration-secs", &duration.as_secs().to_string()])
            .args(["--max-requests", &plan.max_requests.to_string()]);
        for user in users {
            command.arg("--kubeconfig").arg(b.kubeconfig(user)?);
        }
        command
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .process_group(0);
        let mut child = command.spawn().context("start the load generator")?;
        let pid = child.id().context("the load generator exited at once")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, mut lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                    let _ = tx.send(v);
                }
            }
        });
        // Creating 2,500 ConfigMaps takes a while on a loaded machine; give it 20 minutes.
        let loading = tokio::time::timeout(Duration::from_secs(1200), async {
            while let Some(v) = lines.recv().await {
                if v["event"] == "loading" {
                    return Some(v);
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
        .with_context(|| {
            format!(
                "the load generator did not start loading (log: {})",
                log.display()
            )
        })?;
        eprintln!(
            "    load running ({} objects created in {:.1} s); warming up for {:?}",
            loading["created"],
            loading["setup_s"].as_f64().unwrap_or(0.0),
            plan.warmup
        );
        tokio::time::sleep(plan.warmup).await;
        if let Ok(Some(status)) = child.try_wait() {
            bail!(
                "the load generator exited early ({status}; log: {})",
                log.display()
            );
        }
        Ok(Self {
            child,
            pid,
            lines,
            loading,
            log,
        })
    }

    /// SIGTERM, then its last word.
    async fn stop(mut self) -> anyhow::Result<LoadOutcome> {
        if let Ok(pid) = i32::try_from(self.pid) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGTERM);
        }
        let done = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(v) = self.lines.recv().await {
                if v["event"] == "load_done" {
                    return Some(v);
                }
            }
            None
        })
        .await
        .ok()
        .flatten();
        if tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
        let done = done.with_context(|| {
            format!(
                "the load generator printed no final line (log: {})",
                self.log.display()
            )
        })?;
        Ok(LoadOutcome::parse(&self.loading, &done))
    }
}

/// The requests, APF metrics and kube-controller-manager's Lease over a window.
struct Meter {
    audit: audit::Window,
    apf: apf::Sampler,
    kcm_exits: usize,
    kcm_failures: usize,
    /// The control plane's processes (kube-apiserver, etcd, kube-controller-manager) and their
    /// CPU time at the start.
    control_plane: Vec<(String, u32, Duration)>,
}

impl Meter {
    async fn open(b: &Bench, kcm: Option<&ElectedKcm>) -> anyhow::Result<Self> {
        let apf = apf::Sampler::start(&b.admin, Duration::from_secs(5)).await?;
        let audit = audit::Window::open(&audit::log_path(b.cp.dir()))?;
        Ok(Self {
            audit,
            apf,
            kcm_exits: kcm.map_or(0, ElectedKcm::exits),
            kcm_failures: kcm.map_or(0, ElectedKcm::renewal_failures_logged),
            control_plane: control_plane_pids(b.cp.dir())
                .into_iter()
                .filter_map(|(name, pid)| Some((name, pid, procfs::cpu_time(pid)?)))
                .collect(),
        })
    }

    async fn close(
        self,
        kcm: Option<&ElectedKcm>,
    ) -> anyhow::Result<(
        Duration,
        Vec<Request>,
        Option<KcmWindow>,
        ApfWindow,
        Vec<(String, f64)>,
    )> {
        let requests = self.audit.requests()?;
        let cpu = self
            .control_plane
            .iter()
            .filter_map(|(name, pid, c0)| {
                let c1 = procfs::cpu_time(*pid)?;
                Some((
                    name.clone(),
                    c1.saturating_sub(*c0).as_secs_f64() / self.audit.elapsed().as_secs_f64(),
                ))
            })
            .collect();
        let elapsed = self.audit.elapsed();
        let apf = self.apf.close().await;
        let kcm = kcm.map(|k| {
            let mut w = KcmWindow {
                exits: k.exits() - self.kcm_exits,
                failures_logged: k.renewal_failures_logged().saturating_sub(self.kcm_failures),
                ..KcmWindow::default()
            };
            for r in requests.iter().filter(|r| {
                r.user == kcm::USER
                    && r.resource.as_deref() == Some("leases")
                    && r.name.as_deref() == Some(kcm::LEASE)
            }) {
                *w.codes
                    .entry(r.verb.clone())
                    .or_default()
                    .entry(r.code.unwrap_or(0))
                    .or_default() += 1;
                if r.verb == "update" {
                    w.renewals.extend(r.latency);
                }
            }
            w
        });
        Ok((elapsed, requests, kcm, apf, cpu))
    }
}

/// The processes of the control plane in `dir` (their command lines name it), by program name.
fn control_plane_pids(dir: &std::path::Path) -> Vec<(String, u32)> {
    let dir = dir.to_string_lossy();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found: Vec<(String, u32)> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let cmdline = procfs::cmdline(pid);
            if !cmdline.contains(dir.as_ref()) {
                return None;
            }
            let program = cmdline.split_whitespace().next()?.rsplit('/').next()?.to_owned();
            ["kube-apiserver", "etcd", "kube-controller-manager"]
                .contains(&program.as_str())
                .then_some((program, pid))
        })
        .collect();
    found.sort();
    found
}

fn cpu_line(cpu: &[(String, f64)]) -> String {
    cpu.iter()
        .map(|(name, c)| format!("{name} {:.0}%", c * 100.0))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Leases held after these events, by (identity, shard) replay.
fn held(events: &[Event]) -> usize {
    let mut h: BTreeMap<(String, Option<u32>), bool> = BTreeMap::new();
    for e in events {
        if e.is("started_leading") {
            h.insert((e.identity.clone(), e.shard), true);
        } else if e.is("stopped_leading") {
            h.insert((e.identity.clone(), e.shard), false);
        }
    }
    h.values().filter(|v| **v).count()
}

/// Losses among `events` between `since` and `until`, and how long each lost Lease (a shard, or
/// the one Lease) went until the subject held it again (or the window ended).
fn losses(events: &[Event], since: u64, until: u64) -> (usize, Duration, Duration) {
    let mut n = 0;
    let (mut total, mut longest) = (Duration::ZERO, Duration::ZERO);
    for (i, e) in events.iter().enumerate() {
        if !e.is("stopped_leading") || e.mono_ns < since || e.mono_ns > until {
            continue;
        }
        n += 1;
        let back = events[i + 1..]
            .iter()
            .find(|f| f.is("started_leading") && f.shard == e.shard && f.mono_ns >= e.mono_ns)
            .map_or(until, |f| f.mono_ns.min(until));
        let gap = between(e.mono_ns, back);
        total += gap;
        longest = longest.max(gap);
    }
    (n, total, longest)
}

/// The scenarios' shared state: the load's users and namespace, kube-controller-manager.
#[derive(Debug)]
pub(crate) struct Env<'a> {
    b: &'a Bench,
    kcm: Option<&'a ElectedKcm>,
    pub(crate) load: LoadPlan,
    load_users: Vec<String>,
    load_ns: Option<kube_leader_testenv::TestNamespace>,
    sessions: usize,
}

impl<'a> Env<'a> {
    pub(crate) fn new(b: &'a Bench, kcm: Option<&'a ElectedKcm>, load: LoadPlan) -> anyhow::Result<Self> {
        let load_users = b.users(load.users)?;
        Ok(Self {
            b,
            kcm,
            load,
            load_users,
            load_ns: None,
            sessions: 0,
        })
    }

    /// `n` users none of which is a load user.
    fn candidate_users(&self, n: usize) -> anyhow::Result<Vec<String>> {
        for _ in 0..kube_leader_testenv::RESTRICTED_USERS {
            let users = self.b.users(n)?;
            if users.iter().all(|u| !self.load_users.contains(u)) {
                return Ok(users);
            }
        }
        bail!("no {n} users apart from the load's")
    }

    async fn load_namespace(&mut self) -> anyhow::Result<String> {
        if self.load_ns.is_none() {
            self.load_ns = Some(self.b.load_namespace(&self.load_users).await?);
        }
        Ok(self
            .load_ns
            .as_ref()
            .map(|n| n.name().to_owned())
            .unwrap_or_default())
    }

    /// One run; the FlowSchema and the load are gone again when it returns.
    pub(crate) async fn run(
        &mut self,
        scenario: &'static str,
        subject: Subject,
        case: Case,
        t: Timings,
        window: Duration,
    ) -> anyhow::Result<Run> {
        let b = self.b;
        let date = crate::command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]);
        let users = self.candidate_users(subject.processes())?;
        let ns = b.lease_namespace(&users).await?;
        let level = apf::describe_level(&b.admin, apf::PRIORITY_LEVEL).await.ok();
        if case.flow_schema() {
            apf::apply(&b.admin, &users, &[ns.name().to_owned()]).await?;
        }
        // Every Lease held and spread within this, or the window starts with what is held.
        let bound = t.lease * 4 + Duration::from_secs(120);
        let load = if case.loaded() {
            let lns = self.load_namespace().await?;
            self.sessions += 1;
            let duration = self.load.warmup + bound + window + Duration::from_secs(120);
            match LoadSession::start(b, &self.load, &lns, &self.load_users, duration, self.sessions).await {
                Ok(l) => Some(l),
                Err(e) => {
                    let _ = apf::delete(&b.admin).await;
                    return Err(e);
                }
            }
        } else {
            None
        };
        let mut fleet = Fleet::new(&b.log_dir);
        let outcome = self
            .measure(&mut fleet, ns.name(), &users, subject, case, t, window, bound)
            .await;
        fleet.stop_all(Duration::from_secs(40)).await;
        let (load, load_problem) = match load {
            Some(l) => match l.stop().await {
                Ok(o) => (Some(o), None),
                Err(e) => (None, Some(format!("{e:#}"))),
            },
            None => (None, None),
        };
        if case.flow_schema() {
            if let Err(e) = apf::delete(&b.admin).await {
                eprintln!("    could not delete the FlowSchema: {e:#}");
            }
        }
        drop(ns);
        let mut run = outcome?;
        run.scenario = scenario;
        run.date = date;
        run.load = load;
        run.load_problem = load_problem;
        run.level = level;
        Ok(run)
    }

    #[allow(clippy::too_many_arguments)]
    async fn measure(
        &self,
        fleet: &mut Fleet,
        ns: &str,
        users: &[String],
        subject: Subject,
        case: Case,
        t: Timings,
        window: Duration,
        bound: Duration,
    ) -> anyhow::Result<Run> {
        let b = self.b;
        let t0 = mono_ns();
        let ids: Vec<String> = match subject {
            Subject::Shards { processes, shards } => {
                let ids: Vec<String> = (0..processes).map(|i| format!("holder-{i}")).collect();
                for (i, id) in ids.iter().enumerate() {
                    shards::spawn(b, fleet, ns, &users[i], "hold", shards, id, t)?;
                }
                ids
            }
            Subject::Single => {
                fleet.spawn_lease(
                    &b.bins,
                    Impl::KubeLeader,
                    &b.kubeconfig(&users[0])?,
                    ns,
                    "under-load",
                    "leader",
                    &users[0],
                    t,
                )?;
                vec!["leader".to_owned()]
            }
        };
        let all_held = match subject {
            Subject::Shards { shards, .. } => shards::spread(fleet, &ids, shards, t0, bound).await.took,
            Subject::Single => fleet
                .wait_for(t0, bound, "the leader", |e| e.is("started_leading"))
                .await
                .ok()
                .map(|e| between(t0, e.mono_ns)),
        };
        if all_held.is_none() {
            eprintln!(
                "    not every Lease held within {bound:?} ({} held); measuring anyway",
                held(fleet.events())
            );
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let pids: Vec<u32> = ids
            .iter()
            .map(|id| fleet.proc(id).map(|p| p.pid).context("a candidate is gone"))
            .collect::<anyhow::Result<_>>()?;
        let cpu0: Vec<Duration> = pids
            .iter()
            .map(|p| procfs::cpu_time(*p).unwrap_or_default())
            .collect();
        let held_at_start = held(fleet.events());
        let since = mono_ns();
        let meter = Meter::open(b, self.kcm).await?;
        tokio::time::sleep(window).await;
        let until = mono_ns();
        let (elapsed, requests, kcm, apf, control_plane_cpu) = meter.close(self.kcm).await?;
        let cpu: Vec<f64> = pids
            .iter()
            .zip(&cpu0)
            .map(|(p, c0)| {
                procfs::cpu_time(*p).map_or(0.0, |c1| {
                    (c1.saturating_sub(*c0)).as_secs_f64() / elapsed.as_secs_f64()
                })
            })
            .collect();
        let memory: Vec<Memory> = pids.iter().map(|p| Memory::of(*p).unwrap_or_default()).collect();
        let events = fleet.events().to_vec();
        let (n_lost, unheld_total, unheld_longest) = losses(&events, since, until);
        let mut codes = Codes::new();
        let mut renewals = Vec::new();
        for r in requests.iter().filter(|r| users.contains(&r.user)) {
            *codes
                .entry(r.verb.clone())
                .or_default()
                .entry(r.code.unwrap_or(0))
                .or_default() += 1;
            if r.verb == "update" && r.resource.as_deref() == Some("leases") {
                renewals.extend(r.latency);
            }
        }
        Ok(Run {
            scenario: "",
            subject,
            case,
            timings: t,
            date: String::new(),
            all_held,
            held_at_start,
            held_at_end: held(&events),
            losses: n_lost,
            unheld_total,
            unheld_longest,
            window: elapsed,
            codes,
            renewals,
            memory,
            cpu,
            kcm,
            apf,
            load: None,
            load_problem: None,
            level: None,
            control_plane_cpu,
        })
    }
}

// === the report ===

fn codes_line(codes: &Codes) -> String {
    if codes.is_empty() {
        return "none".into();
    }
    codes
        .iter()
        .map(|(verb, c)| {
            let c: Vec<String> = c.iter().map(|(code, n)| format!("{code}: {n}")).collect();
            format!("{verb} ({})", c.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn notes(s: &mut String, r: &Run) {
    let _ = writeln!(
        s,
        "- **{} / {}** ({}): requests by verb and status: {}.",
        r.subject.label(),
        r.case.label(),
        r.date,
        codes_line(&r.codes)
    );
    if r.held_at_start != r.subject.leases() as usize || r.held_at_end != r.subject.leases() as usize {
        let _ = writeln!(
            s,
            "  Leases held at the window's start {}, at its end {} (of {}).",
            r.held_at_start,
            r.held_at_end,
            r.subject.leases()
        );
    }
    if r.losses > 0 {
        let _ = writeln!(
            s,
            "  Lost Leases went unheld {} in total, the longest {}.",
            fmt(r.unheld_total),
            fmt(r.unheld_longest)
        );
    }
    let per: Vec<String> = r
        .memory
        .iter()
        .zip(&r.cpu)
        .map(|(m, c)| format!("{} / {:.1}%", mib(m.hwm_kib), c * 100.0))
        .collect();
    let _ = writeln!(s, "  Peak RSS / CPU per process: {}.", per.join(", "));
    if !r.control_plane_cpu.is_empty() {
        let _ = writeln!(
            s,
            "  CPU of the control plane in the window (100% = a core): {}.",
            cpu_line(&r.control_plane_cpu)
        );
    }
    if let Some(k) = &r.kcm {
        let _ = writeln!(
            s,
            "  kube-controller-manager's Lease requests by verb and status: {}; {} log lines of failed renewals; \
             {} exits.",
            codes_line(&k.codes),
            k.failures_logged,
            k.exits
        );
    }
    let b = r.apf.bench_schema_seats;
    if r.case.flow_schema() {
        let _ = writeln!(
            s,
            "  Seats executing for FlowSchema `kube-leader-bench`: mean {:.2}, max {:.0} (of {} samples).",
            b.mean, b.max, r.apf.samples
        );
    }
    for l in r.apf.describe() {
        let _ = writeln!(s, "  APF {l}.");
    }
    match (&r.load, &r.load_problem) {
        (Some(l), _) => {
            let kinds: Vec<String> = l
                .by_kind
                .iter()
                .map(|(k, c)| {
                    let c: Vec<String> = c.iter().map(|(code, n)| format!("{code}: {n}")).collect();
                    format!("{k} ({})", c.join(", "))
                })
                .collect();
            let lat: Vec<String> = l
                .list_latency
                .iter()
                .map(|(k, (n, p50, p99))| format!("{k} p50 {p50:.0} ms / p99 {p99:.0} ms (n={n})"))
                .collect();
            let _ = writeln!(
                s,
                "  The load: {} requests in {:.0} s (stopped by {}), answered 2xx / 429 / 5xx / none {}; by kind: {}; \
                 its LISTs: {}; {:.0} MiB and {} watch events received{}.",
                l.sent,
                l.elapsed_s,
                l.stopped_by,
                l.answers(),
                kinds.join("; "),
                if lat.is_empty() { "none answered".into() } else { lat.join(", ") },
                l.mib,
                l.watch_events,
                if l.created > 0 {
                    format!("; before it, {} objects created in {:.1} s", l.created, l.setup_s)
                } else {
                    String::new()
                }
            );
        }
        (None, Some(p)) => {
            let _ = writeln!(s, "  The load: no outcome ({p}).");
        }
        (None, None) => {}
    }
}

/// The tables of these scenarios, with their notes; empty if none ran.
pub(crate) fn markdown(runs: &[Run], h: &Header, load: &LoadPlan, kcm: Option<&str>) -> String {
    let mut s = String::new();
    if runs.is_empty() {
        return s;
    }
    let level = runs
        .iter()
        .find_map(|r| r.level.clone())
        .unwrap_or_else(|| "`leader-election`: not read".into());
    let kcm = kcm.map_or_else(
        || "not measured (it did not start)".to_owned(),
        |id| {
            format!(
                "a second kube-controller-manager of the same release, as `{}` with leader election on \
                 (`15s/10s/2s`, holder `{id}`); the test control plane's own runs without leader election, as \
                 `admin`",
                kcm::USER
            )
        },
    );
    let preface = |s: &mut String, title: &str| {
        let _ = writeln!(s, "### {title}\n");
        let _ = writeln!(
            s,
            "{} · Kubernetes {} · commit {} · load average at the bench's start {} · API Priority and Fairness on \
             (default); FlowSchema `{}` (users of the candidates, kind User; Leases, ConfigMaps and Pods in their \
             namespace; precedence 150, ByUser) → {level} · the load (other API users, their own namespace): {} · \
             kube-controller-manager's renewals: {kcm} · renewal latency: the API server's time on each Lease \
             `update` of the candidates (audit log, `stageTimestamp − requestReceivedTimestamp`, APF queueing \
             included).\n",
            h.date,
            h.kubernetes,
            h.commit,
            h.load,
            apf::FLOW_SCHEMA,
            load.label(),
        );
    };

    let hold: Vec<&Run> = runs
        .iter()
        .filter(|r| r.scenario.starts_with("shards-hold"))
        .collect();
    if !hold.is_empty() {
        preface(
            &mut s,
            "Shard Leases held for a window (`shards-hold`, `shards-hold-load`)",
        );
        let _ = writeln!(
            s,
            "| set | case | timings | all held after | window | Leases lost | writes/s (ideal) | 2xx writes ÷ ideal | \
             renewal p50 / p99 | 429 | 504 | peak RSS (max of processes) | CPU (all processes) | kube-controller-manager \
             renewal p50 / p99 | load average (1 min) |"
        );
        let _ = writeln!(
            s,
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
        );
        for r in &hold {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {:.0} s | {} | {:.1} ({:.1}) | {:.3}× | {} | {} | {} | {} | {:.1}% of a core | {} | {} |",
                r.subject.label(),
                r.case.label(),
                r.timings.label(),
                r.all_held.map_or("not reached".into(), fmt),
                r.window.as_secs_f64(),
                r.losses,
                r.writes_per_second(),
                r.ideal(),
                r.ratio(),
                Run::latency(&r.renewals),
                r.count(None, 429),
                r.count(None, 504),
                mib(r.peak_rss()),
                r.cpu.iter().sum::<f64>() * 100.0,
                r.kcm_cell(),
                r.apf.load.label()
            );
        }
        let shared = hold.iter().find_map(|r| match r.subject {
            Subject::Shards { processes, shards } if processes > 1 => Some(format!(
                " \"{processes} processes × {}\" is one shard set of {shards} Leases shared by {processes} replicas \
                 (`kube_leader::Shards`, {} each), one API user per process.",
                shards as usize / processes,
                shards as usize / processes
            )),
            _ => None,
        });
        let _ = writeln!(
            s,
            "\nIdeal: one `update` per shard Lease per retry period (N / retry period); each process also renews \
             its membership Lease once per retry period, beyond the ideal (P processes: P / retry period more).{} \
             Leases lost: `stopped_leading` events in the window; the bench causes none. 2xx writes ÷ ideal: the \
             writes answered 2xx per second over the ideal.\n",
            shared.unwrap_or_default()
        );
        for r in &hold {
            notes(&mut s, r);
        }
        s.push('\n');
        let _ = writeln!(s, "| goal (shards under load) | measured | met? |");
        let _ = writeln!(s, "| --- | --- | --- |");
        for r in &hold {
            let who = format!("{}, {}", r.subject.label(), r.case.label());
            let met = |ok: bool| if ok { "met" } else { "**not met**" };
            let _ = writeln!(
                s,
                "| {who}: 0 Leases lost | {} lost | {} |",
                r.losses,
                met(r.losses == 0)
            );
            if !r.case.loaded() {
                let _ = writeln!(
                    s,
                    "| {who}: 2xx writes ≥ 0.95 × ideal | {:.3}× | {} |",
                    r.ratio(),
                    met(r.ratio() >= 0.95)
                );
                let _ = writeln!(
                    s,
                    "| {who}: peak RSS ≤ 32 MiB per process | {} | {} |",
                    mib(r.peak_rss()),
                    met(r.peak_rss() <= 32 * 1024)
                );
            }
        }
        s.push('\n');
    }

    let under: Vec<&Run> = runs.iter().filter(|r| r.scenario == "under-load").collect();
    if !under.is_empty() {
        preface(&mut s, "Leader election under a saturating load (`under-load`)");
        let _ = writeln!(
            s,
            "| candidate | case | timings | window | spurious losses | unheld (total / longest) | renewal p50 / p99 | \
             renewals | 429 | 504 | the load's answers (2xx / 429 / 5xx / none) | kube-controller-manager renewal \
             p50 / p99 | load average (1 min) |"
        );
        let _ = writeln!(
            s,
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
        );
        for r in &under {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.0} s | {} | {} / {} | {} | {} | {} | {} | {} | {} | {} |",
                r.subject.label(),
                r.case.label(),
                r.timings.label(),
                r.window.as_secs_f64(),
                r.losses,
                fmt(r.unheld_total),
                fmt(r.unheld_longest),
                Run::latency(&r.renewals),
                r.renewals.len(),
                r.count(None, 429),
                r.count(None, 504),
                r.load.as_ref().map_or("—".into(), LoadOutcome::answers),
                r.kcm_cell(),
                r.apf.load.label()
            );
        }
        let _ = writeln!(
            s,
            "\nSpurious losses: `stopped_leading` in the window (the bench stops, kills or deletes nothing). \
             Unheld: from each loss until the subject held that Lease again (or the window's end). Renewals: Lease \
             `update`s of the candidates' users in the window, all statuses.\n"
        );
        for r in &under {
            notes(&mut s, r);
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: &str, id: &str, shard: Option<u32>, at: u64) -> Event {
        Event {
            kind: kind.into(),
            identity: id.into(),
            leader: None,
            shard,
            count: None,
            mono_ns: at,
        }
    }

    #[test]
    fn losses_and_the_time_unheld() {
        let events = vec![
            ev("started_leading", "a", Some(1), 0),
            ev("started_leading", "a", Some(2), 0),
            ev("stopped_leading", "a", Some(1), 10),
            ev("started_leading", "b", Some(1), 15),
            ev("stopped_leading", "a", Some(2), 20),
        ];
        let (n, total, longest) = losses(&events, 5, 100);
        assert_eq!(n, 2);
        assert_eq!(total, Duration::from_nanos(5 + 80));
        assert_eq!(longest, Duration::from_nanos(80));
        assert_eq!(held(&events), 1);
        assert_eq!(losses(&events, 50, 100).0, 0);
    }

    #[test]
    fn the_load_outcome_parses() {
        let loading = serde_json::json!({"event": "loading", "created": 12, "setup_s": 1.5});
        let done = serde_json::json!({"event": "load_done", "elapsed_s": 9.0, "stopped_by": "signal", "sent": 30,
            "answered": {"200": 25, "429": 4, "0": 1}, "by_kind": {"list pods": {"200": 3}},
            "list_latency_ms": {"list pods": {"n": 3, "p50": 10.0, "p99": 20.0}}, "mib_received": 2.0, "watch_events": 7});
        let o = LoadOutcome::parse(&loading, &done);
        assert_eq!((o.created, o.sent, o.watch_events), (12, 30, 7));
        assert_eq!(o.answers(), "25 / 4 / 0 / 1");
        assert_eq!(o.list_latency["list pods"], (3, 10.0, 20.0));
    }
}
