//! `kube-leader-bench load`: a load generator of other clients, to fill the API server's
//! priority levels while the candidates hold their Leases. Not for people, but it runs by hand
//! too.
//!
//! First it makes sure the namespace holds `--configmaps` ConfigMaps of `--configmap-bytes`
//! each and `--pods` Pods (objects only: no node runs them), created concurrently and kept for
//! the next run (those already there are not created again). Then `--workers` workers, spread
//! over the `--kubeconfig` users, send requests until `--duration-secs` pass, `--max-requests`
//! are sent, or SIGTERM / SIGINT:
//!
//! - `--watchers` of them watch a collection (ConfigMaps, then Pods, alternately) without a
//!   resourceVersion, so each watch begins with an `ADDED` event per object (an informer's start
//!   without its list), until the API server ends it after 30–90 s; then again;
//! - the others LIST a whole collection (three in four ConfigMaps, one in four Pods) without a
//!   resourceVersion or a limit: consistent lists of the whole set, again and again;
//! - one writer patches a ConfigMap `--writes-per-sec` times a second, so the watches carry
//!   events.
//!
//! A worker answered 429 waits 1 s (what client-go does with API Priority and Fairness's
//! `Retry-After: 1`), one answered 5xx or not at all waits 1 s too. Bodies are read and thrown
//! away, not parsed, so the generator's CPU goes to reading, not to decoding.
//!
//! Progress goes to stderr every 10 s. On stdout, JSON lines: `loading` once the objects are
//! there (with how many were created and how long that took), and `load_done` at the end: the
//! requests sent, answered by HTTP status (0: no answer), by kind and status, the LIST latency
//! p50/p99 per kind, bytes and watch events received, and what stopped it.

use std::{
    collections::{BTreeMap, HashSet},
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use anyhow::Context;
use futures::{AsyncReadExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::{
    api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams, WatchParams},
    config::Kubeconfig,
    Api, Client, Config,
};
use rand::Rng as _;
use tokio_util::sync::CancellationToken;

use crate::clock::mono_ns;

/// The label every object of the load carries.
const LABEL: (&str, &str) = ("kube-leader-bench/load", "true");

/// The `load` subcommand's arguments.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct LoadArgs {
    /// Kubeconfigs of the load's API users; worker `i` uses the `i mod n`-th.
    #[arg(long = "kubeconfig", required = true)]
    pub(crate) kubeconfigs: Vec<PathBuf>,
    /// Namespace of the load's objects (the users need get, list, watch, create and patch on
    /// ConfigMaps and Pods there).
    #[arg(long)]
    pub(crate) namespace: String,
    #[arg(long, default_value_t = 2500)]
    pub(crate) configmaps: usize,
    /// Bytes of data in each ConfigMap.
    #[arg(long, default_value_t = 8192)]
    pub(crate) configmap_bytes: usize,
    #[arg(long, default_value_t = 300)]
    pub(crate) pods: usize,
    /// Bytes of an annotation on each Pod.
    #[arg(long, default_value_t = 2048)]
    pub(crate) pod_bytes: usize,
    /// Concurrent workers (watchers included).
    #[arg(long, default_value_t = 40)]
    pub(crate) workers: usize,
    /// How many of the workers watch instead of listing.
    #[arg(long, default_value_t = 8)]
    pub(crate) watchers: usize,
    /// ConfigMap patches per second (0: none).
    #[arg(long, default_value_t = 10.0)]
    pub(crate) writes_per_sec: f64,
    /// Stop after this long (the objects' creation not counted).
    #[arg(long, default_value_t = 600)]
    pub(crate) duration_secs: u64,
    /// Stop after sending this many requests (the creations not counted).
    #[arg(long, default_value_t = 100_000)]
    pub(crate) max_requests: u64,
    /// Creations in flight at once.
    #[arg(long, default_value_t = 32)]
    pub(crate) create_concurrency: usize,
}

fn emit(v: serde_json::Value) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// What a worker's request was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    ListConfigMaps,
    ListPods,
    WatchConfigMaps,
    WatchPods,
    PatchConfigMap,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::ListConfigMaps => "list configmaps",
            Kind::ListPods => "list pods",
            Kind::WatchConfigMaps => "watch configmaps",
            Kind::WatchPods => "watch pods",
            Kind::PatchConfigMap => "patch configmaps",
        }
    }
}

/// Everything counted.
#[derive(Debug, Default)]
struct Tally {
    codes: BTreeMap<Kind, BTreeMap<u16, u64>>,
    list_latency: BTreeMap<Kind, Vec<Duration>>,
    cancelled: u64,
}

/// The shared state of the workers.
#[derive(Debug)]
struct Shared {
    namespace: String,
    tally: Mutex<Tally>,
    sent: AtomicU64,
    in_flight: AtomicUsize,
    /// Body bytes and watch events (lines of a watch's body) read so far, counted as they come.
    bytes: AtomicU64,
    watch_events: AtomicU64,
    max_requests: u64,
    stop: CancellationToken,
    stopped_by: Mutex<Option<&'static str>>,
}

impl Shared {
    fn stop(&self, why: &'static str) {
        self.stopped_by
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(why);
        self.stop.cancel();
    }

    /// Takes one request from the budget; `false` when it is spent (and stops everything).
    fn take(&self) -> bool {
        if self.sent.fetch_add(1, Ordering::Relaxed) >= self.max_requests {
            self.sent.fetch_sub(1, Ordering::Relaxed);
            self.stop("max-requests");
            return false;
        }
        true
    }

    fn record(&self, kind: Kind, code: u16, took: Duration) {
        let mut t = self.tally.lock().unwrap_or_else(|p| p.into_inner());
        *t.codes.entry(kind).or_default().entry(code).or_default() += 1;
        if matches!(kind, Kind::ListConfigMaps | Kind::ListPods) && code == 200 {
            t.list_latency.entry(kind).or_default().push(took);
        }
    }

    fn cancelled(&self) {
        self.tally.lock().unwrap_or_else(|p| p.into_inner()).cancelled += 1;
    }
}

/// The HTTP status of a failed call (0: no answer).
fn code_of(e: &kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        _ => 0,
    }
}

/// Awaits `sent` (a `request_stream` call) and reads the body to the end without keeping it,
/// counting its bytes (and, of a watch, its lines: one per event) as they come; its status.
async fn drain<B, F>(sent: F, shared: &Shared, watch: bool) -> u16
where
    F: std::future::Future<Output = kube::Result<B>>,
    B: futures::AsyncRead + Unpin,
{
    let mut body = match sent.await {
        Ok(b) => b,
        Err(e) => return code_of(&e),
    };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match body.read(&mut buf).await {
            Ok(0) => return 200,
            Ok(n) => {
                shared.bytes.fetch_add(n as u64, Ordering::Relaxed);
                if watch {
                    let lines = buf[..n].iter().filter(|&&b| b == b'\n').count() as u64;
                    shared.watch_events.fetch_add(lines, Ordering::Relaxed);
                }
            }
            // Cut off mid-body (a watch's connection dropped): answered, then lost.
            Err(_) => return 200,
        }
    }
}

/// Waits before the next request after an answer with `code`.
async fn pause_after(code: u16, stop: &CancellationToken) {
    if code == 429 || code == 0 || code >= 500 {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
            () = stop.cancelled() => {}
        }
    }
}

async fn lister(shared: Arc<Shared>, client: Client, kind: Kind) {
    let resource = if kind == Kind::ListPods {
        "pods"
    } else {
        "configmaps"
    };
    let path = format!("/api/v1/namespaces/{}/{resource}", shared.namespace);
    let request = kube::core::Request::new(path);
    while !shared.stop.is_cancelled() && shared.take() {
        let Ok(req) = request.list(&ListParams::default()) else {
            return;
        };
        shared.in_flight.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let outcome = tokio::select! {
            r = drain(client.request_stream(req), &shared, false) => Some(r),
            () = shared.stop.cancelled() => None,
        };
        shared.in_flight.fetch_sub(1, Ordering::Relaxed);
        let Some(code) = outcome else {
            shared.cancelled();
            return;
        };
        shared.record(kind, code, started.elapsed());
        pause_after(code, &shared.stop).await;
    }
}

async fn watcher(shared: Arc<Shared>, client: Client, first: usize) {
    let mut turn = first;
    while !shared.stop.is_cancelled() && shared.take() {
        let (kind, resource) = if turn.is_multiple_of(2) {
            (Kind::WatchConfigMaps, "configmaps")
        } else {
            (Kind::WatchPods, "pods")
        };
        turn += 1;
        let path = format!("/api/v1/namespaces/{}/{resource}", shared.namespace);
        let timeout = rand::rng().random_range(30..=90);
        // No resourceVersion: the watch starts with an ADDED event per object.
        let Ok(req) = kube::core::Request::new(path).watch(&WatchParams::default().timeout(timeout), "")
        else {
            return;
        };
        shared.in_flight.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let outcome = tokio::select! {
            r = drain(client.request_stream(req), &shared, true) => Some(r),
            () = shared.stop.cancelled() => None,
        };
        shared.in_flight.fetch_sub(1, Ordering::Relaxed);
        let Some(code) = outcome else {
            // A watch open at the stop was answered: count it as such.
            shared.record(kind, 200, started.elapsed());
            return;
        };
        shared.record(kind, code, started.elapsed());
        pause_after(code, &shared.stop).await;
    }
}

async fn writer(shared: Arc<Shared>, client: Client, configmaps: usize, per_sec: f64) {
    if per_sec <= 0.0 || configmaps == 0 {
        return;
    }
    let api = Api::<ConfigMap>::namespaced(client, &shared.namespace);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_sec));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n: u64 = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shared.stop.cancelled() => return,
        }
        if !shared.take() {
            return;
        }
        let name = object_name("load-cm", (n as usize) % configmaps);
        let patch = serde_json::json!({"data": {"tick": n.to_string()}});
        n += 1;
        let started = Instant::now();
        let (pp, patch) = (PatchParams::default(), Patch::Merge(&patch));
        let outcome = tokio::select! {
            r = api.patch(&name, &pp, &patch) => Some(r),
            () = shared.stop.cancelled() => None,
        };
        let Some(result) = outcome else {
            shared.cancelled();
            return;
        };
        let code = match &result {
            Ok(_) => 200,
            Err(e) => code_of(e),
        };
        shared.record(Kind::PatchConfigMap, code, started.elapsed());
    }
}

fn object_name(prefix: &str, i: usize) -> String {
    format!("{prefix}-{i:05}")
}

fn labels() -> BTreeMap<String, String> {
    [(LABEL.0.to_owned(), LABEL.1.to_owned())].into()
}

/// Creates `create` with up to 20 tries while the API server answers 429 or 5xx; an object that
/// already exists counts as created.
async fn create_with_retries<F, Fut, T>(mut create: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = kube::Result<T>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        match create().await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => return Ok(()),
            Err(e) if tries < 20 && (code_of(&e) == 429 || code_of(&e) == 0 || code_of(&e) >= 500) => {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Makes sure the namespace holds the objects; returns how many it created.
async fn ensure_objects(args: &LoadArgs, clients: &[Client]) -> anyhow::Result<usize> {
    let lp = ListParams::default().labels(&format!("{}={}", LABEL.0, LABEL.1));
    let have_cm: HashSet<String> = Api::<ConfigMap>::namespaced(clients[0].clone(), &args.namespace)
        .list_metadata(&lp)
        .await
        .context("list the load's ConfigMaps")?
        .items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect();
    let have_pods: HashSet<String> = Api::<Pod>::namespaced(clients[0].clone(), &args.namespace)
        .list_metadata(&lp)
        .await
        .context("list the load's Pods")?
        .items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect();
    let payload = "x".repeat(args.configmap_bytes);
    let padding = "p".repeat(args.pod_bytes);
    let mut jobs: Vec<(usize, bool, String)> = (0..args.configmaps)
        .map(|i| (i, true, object_name("load-cm", i)))
        .filter(|(_, _, n)| !have_cm.contains(n))
        .collect();
    jobs.extend(
        (0..args.pods)
            .map(|i| (i, false, object_name("load-pod", i)))
            .filter(|(_, _, n)| !have_pods.contains(n)),
    );
    let total = jobs.len();
    if total == 0 {
        return Ok(0);
    }
    eprintln!(
        "load: creating {total} objects in {} ({} in flight)",
        args.namespace, args.create_concurrency
    );
    let done = AtomicUsize::new(0);
    let pp = PostParams::default();
    let started = Instant::now();
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(jobs)
        .map(|(i, is_cm, name)| {
            let client = clients[i % clients.len()].clone();
            let (ns, payload, padding, done, pp) = (&args.namespace, &payload, &padding, &done, &pp);
            async move {
                let r = if is_cm {
                    let api = Api::<ConfigMap>::namespaced(client, ns);
                    let cm = ConfigMap {
                        metadata: ObjectMeta {
                            name: Some(name.clone()),
                            labels: Some(labels()),
                            ..ObjectMeta::default()
                        },
                        data: Some([("payload".to_owned(), payload.clone())].into()),
                        ..ConfigMap::default()
                    };
                    create_with_retries(|| api.create(pp, &cm)).await
                } else {
                    let api = Api::<Pod>::namespaced(client, ns);
                    let mut pod = kube_leader_testenv::pod(&name);
                    pod.metadata.labels = Some(labels());
                    pod.metadata.annotations =
                        Some([("kube-leader-bench/padding".to_owned(), padding.clone())].into());
                    create_with_retries(|| api.create(pp, &pod)).await
                };
                let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_multiple_of(500) {
                    eprintln!("load: {n} of {total} created in {:.1?}", started.elapsed());
                }
                r.with_context(|| format!("create {name}"))
            }
        })
        .buffer_unordered(args.create_concurrency.max(1))
        .collect()
        .await;
    for r in results {
        r?;
    }
    eprintln!("load: {total} objects created in {:.1?}", started.elapsed());
    Ok(total)
}

fn nearest_rank(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1].as_secs_f64() * 1e3
}

/// Runs the load.
pub(crate) async fn run(args: LoadArgs) -> anyhow::Result<()> {
    let mut clients = Vec::new();
    for path in &args.kubeconfigs {
        let kubeconfig = Kubeconfig::read_from(path).with_context(|| format!("read {}", path.display()))?;
        let mut config = Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
        // Lists wait in APF's queues and watches stay open: no client-side read timeout.
        config.read_timeout = None;
        clients.push(Client::try_from(config)?);
    }
    let setup = Instant::now();
    let created = ensure_objects(&args, &clients).await?;
    emit(serde_json::json!({
        "event": "loading", "identity": "load", "mono_ns": mono_ns(),
        "created": created, "setup_s": setup.elapsed().as_secs_f64(),
        "configmaps": args.configmaps, "configmap_bytes": args.configmap_bytes,
        "pods": args.pods, "pod_bytes": args.pod_bytes,
        "workers": args.workers, "watchers": args.watchers.min(args.workers),
        "writes_per_sec": args.writes_per_sec, "users": clients.len(),
    }));

    let shared = Arc::new(Shared {
        namespace: args.namespace.clone(),
        tally: Mutex::default(),
        sent: AtomicU64::new(0),
        in_flight: AtomicUsize::new(0),
        bytes: AtomicU64::new(0),
        watch_events: AtomicU64::new(0),
        max_requests: args.max_requests,
        stop: CancellationToken::new(),
        stopped_by: Mutex::new(None),
    });
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let watchers = args.watchers.min(args.workers);
    for i in 0..args.workers {
        let client = clients[i % clients.len()].clone();
        let shared = shared.clone();
        if i < watchers {
            tasks.spawn(watcher(shared, client, i));
        } else {
            let kind = if (i - watchers) % 4 == 3 {
                Kind::ListPods
            } else {
                Kind::ListConfigMaps
            };
            tasks.spawn(lister(shared, client, kind));
        }
    }
    tasks.spawn(writer(
        shared.clone(),
        clients[0].clone(),
        args.configmaps,
        args.writes_per_sec,
    ));

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let deadline = tokio::time::sleep(Duration::from_secs(args.duration_secs));
    tokio::pin!(deadline);
    let mut progress = tokio::time::interval(Duration::from_secs(10));
    progress.tick().await;
    loop {
        tokio::select! {
            () = &mut deadline => { shared.stop("duration"); break }
            _ = term.recv() => { shared.stop("signal"); break }
            _ = int.recv() => { shared.stop("signal"); break }
            () = shared.stop.cancelled() => break,
            _ = progress.tick() => {
                let t = shared.tally.lock().unwrap_or_else(|p| p.into_inner());
                let mut by_code: BTreeMap<u16, u64> = BTreeMap::new();
                for codes in t.codes.values() {
                    for (c, n) in codes {
                        *by_code.entry(*c).or_default() += n;
                    }
                }
                eprintln!(
                    "load: {:.0} s, {} sent, answered {:?}, {} in flight, {:.0} MiB received",
                    started.elapsed().as_secs_f64(),
                    shared.sent.load(Ordering::Relaxed),
                    by_code,
                    shared.in_flight.load(Ordering::Relaxed),
                    shared.bytes.load(Ordering::Relaxed) as f64 / 1024.0 / 1024.0
                );
            }
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    tasks.abort_all();
    let elapsed = started.elapsed();
    let t = std::mem::take(&mut *shared.tally.lock().unwrap_or_else(|p| p.into_inner()));
    let mut answered: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_kind = serde_json::Map::new();
    for (kind, codes) in &t.codes {
        let mut m = serde_json::Map::new();
        for (c, n) in codes {
            *answered.entry(c.to_string()).or_default() += n;
            m.insert(c.to_string(), (*n).into());
        }
        by_kind.insert(kind.name().to_owned(), m.into());
    }
    let mut latency = serde_json::Map::new();
    for (kind, samples) in t.list_latency {
        let mut s = samples;
        s.sort();
        latency.insert(
            kind.name().to_owned(),
            serde_json::json!({"n": s.len(), "p50": nearest_rank(&s, 50.0), "p99": nearest_rank(&s, 99.0)}),
        );
    }
    let stopped_by = shared
        .stopped_by
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .unwrap_or("signal");
    eprintln!(
        "load: stopped by {stopped_by} after {:.1?}: {} sent, answered {answered:?}",
        elapsed,
        shared.sent.load(Ordering::Relaxed)
    );
    emit(serde_json::json!({
        "event": "load_done", "identity": "load", "mono_ns": mono_ns(),
        "elapsed_s": elapsed.as_secs_f64(), "stopped_by": stopped_by,
        "sent": shared.sent.load(Ordering::Relaxed), "answered": answered, "by_kind": by_kind,
        "list_latency_ms": latency, "mib_received": shared.bytes.load(Ordering::Relaxed) as f64 / 1024.0 / 1024.0,
        "watch_events": shared.watch_events.load(Ordering::Relaxed), "cancelled_at_stop": t.cancelled,
    }));
    Ok(())
}
