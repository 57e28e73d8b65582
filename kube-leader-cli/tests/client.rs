//! The sidecar's API client (`src/client.rs`, compiled into this test as a module of its own:
//! it lives in the binary crate) against real sockets on 127.0.0.1: servers that stall, and a
//! connection to the real API server that goes dead under a watch. Bounds are asserted with
//! generous slack (a 2-core machine shared by builds); the measured times are printed. And the
//! real binary, idle as a leader, against the real control plane: its watches stay open.

use std::{
    collections::HashSet,
    net::SocketAddr,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{api::WatchParams, Api, Client, Config};
use kube_leader_testenv::{bind_role, create_pod, rule, ControlPlane, Fault, FaultProxy};
use tokio::{io::AsyncReadExt as _, net::TcpListener};

#[allow(dead_code, unreachable_pub)]
#[path = "../src/client.rs"]
mod client;

use client::Liveness;

/// Slack on every bound: scheduling on a loaded machine.
const SLACK: Duration = Duration::from_secs(2);

/// A server on 127.0.0.1 that accepts every connection and reads from it, but never writes:
/// neither a TLS handshake nor an HTTP answer.
async fn stalled_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    addr
}

fn config(url: &str) -> Config {
    let mut config = Config::new(url.parse().unwrap());
    config.accept_invalid_certs = true;
    config
}

/// Both clients the sidecar can build, by name.
fn clients(url: &str, liveness: Liveness) -> [(&'static str, Client); 2] {
    [
        ("HTTP/2 pool", client::http2(config(url), liveness).unwrap()),
        ("kube's HTTP/1.1", client::http1(config(url), liveness).unwrap()),
    ]
}

/// Runs `call` and returns its error and how long it took, failing the test if it is not an
/// error within `bound` plus slack.
async fn fails_within<T: std::fmt::Debug>(
    what: &str,
    bound: Duration,
    call: impl std::future::Future<Output = kube::Result<T>>,
) -> (kube::Error, Duration) {
    let started = Instant::now();
    match tokio::time::timeout(bound + SLACK, call).await {
        Ok(Err(e)) => (e, started.elapsed()),
        Ok(Ok(v)) => panic!("{what}: succeeded against a silent server: {v:?}"),
        Err(_) => panic!("{what}: no error within {:?}", bound + SLACK),
    }
}

#[tokio::test]
async fn a_server_that_never_answers_tls_fails_the_connection_within_the_bound() {
    let addr = stalled_server().await;
    let liveness = Liveness::for_renew_deadline(Duration::from_secs(2));
    for (name, client) in clients(&format!("https://{addr}"), liveness) {
        let (e, took) = fails_within(name, liveness.connect, client.apiserver_version()).await;
        eprintln!("{name}: TLS handshake never answered: failed after {took:?}: {e}");
        assert!(
            e.to_string().contains("cannot connect to the API server"),
            "{name}: {e}"
        );
    }
}

#[tokio::test]
async fn a_server_that_never_answers_a_request_fails_it_within_the_bound() {
    let addr = stalled_server().await;
    let liveness = Liveness::for_renew_deadline(Duration::from_secs(2));
    for (name, client) in clients(&format!("http://{addr}"), liveness) {
        let (e, took) = fails_within(name, liveness.headers, client.apiserver_version()).await;
        eprintln!("{name}: request never answered: failed after {took:?}: {e}");
        assert!(
            e.to_string().contains("did not answer GET /version"),
            "{name}: {e}"
        );
    }
}

#[tokio::test]
async fn a_watch_that_never_sends_headers_fails_within_the_bound() {
    let addr = stalled_server().await;
    let liveness = Liveness::for_renew_deadline(Duration::from_secs(2));
    for (name, client) in clients(&format!("http://{addr}"), liveness) {
        let api: Api<ConfigMap> = Api::namespaced(client, "default");
        let watch = async { api.watch(&WatchParams::default(), "0").await.map(|_| ()) };
        let (e, took) = fails_within(name, liveness.headers, watch).await;
        eprintln!("{name}: watch without headers: failed after {took:?}: {e}");
    }
}

/// A watch through a proxy to the real API server; then the proxy forwards nothing more, in
/// either direction (a partition). The watch must fail within the PING's bound.
async fn dead_connection_noticed(renew_deadline: Duration) -> Duration {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let proxy = FaultProxy::to_apiserver(cp).unwrap();
    let liveness = Liveness::for_renew_deadline(renew_deadline);
    let client = client::http2(proxy.config(cp, "admin").await.unwrap(), liveness).unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, ns.name());
    // Bookmarks off: a current API server may send one on its own (1.20 never did).
    let mut events = api
        .watch(&WatchParams::default().disable_bookmarks(), "0")
        .await
        .unwrap()
        .boxed();
    // The watch is open and healthy: nothing to see for a while (a bookmark aside).
    let quiet = tokio::time::timeout(liveness.keep_alive * 3, async {
        loop {
            match events.next().await {
                Some(Ok(kube::api::WatchEvent::Bookmark(_))) => continue,
                other => return other,
            }
        }
    })
    .await;
    assert!(quiet.is_err(), "an event on an empty namespace: {quiet:?}");
    proxy.set(Fault::Blackhole);
    let dead_at = Instant::now();
    let bound = liveness.keep_alive * 2;
    let ended = tokio::time::timeout(bound + SLACK, events.next()).await;
    let noticed = dead_at.elapsed();
    eprintln!(
        "renew deadline {renew_deadline:?}: a dead connection under a watch noticed after \
         {noticed:?} (bound {bound:?}): {ended:?}"
    );
    match ended {
        Ok(Some(Err(_)) | None) => noticed,
        Ok(Some(Ok(event))) => panic!("an event through a partition: {event:?}"),
        Err(_) => panic!("a dead connection was not noticed within {:?}", bound + SLACK),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_connection_under_a_watch_is_noticed_well_inside_a_term() {
    for renew_deadline in [Duration::from_secs(10), Duration::from_secs(3)] {
        let noticed = dead_connection_noticed(renew_deadline).await;
        assert!(noticed < renew_deadline, "{noticed:?}");
    }
}

// === an idle leader's watches ===

/// `kube-leader run` as a restricted user (whose requests the audit log counts), killed when
/// dropped.
struct Sidecar {
    child: Child,
    log: PathBuf,
}

impl Sidecar {
    fn spawn(cp: &ControlPlane, user: &str, flags: &[&str], pod: Option<&str>) -> Self {
        let log = std::env::temp_dir().join(format!(
            "kube-leader-client-{}-{}.log",
            std::process::id(),
            rand::random::<u32>()
        ));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kube-leader"));
        cmd.args(["run", "--identity", pod.unwrap_or("idle")])
            .args(flags)
            .args(["--", "sleep", "3600"])
            .env("KUBECONFIG", cp.user_kubeconfig_path(user).unwrap())
            .env("RUST_LOG", "info")
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .env_remove("KUBE_LEADER_HTTP1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        if let Some(pod) = pod {
            cmd.env("POD_NAME", pod);
        }
        Self {
            child: cmd.spawn().unwrap(),
            log,
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        std::thread::sleep(Duration::from_millis(500));
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The watch requests of `user` that have ended (this API server writes a watch's audit events
/// when it ends): each is a watch that had to be opened again.
fn ended_watches(cp: &ControlPlane, user: &str) -> Vec<String> {
    let mut seen = HashSet::new();
    cp.audit_events(user)
        .unwrap()
        .into_iter()
        .filter(|e| e.verb == "watch" && e.stage == "ResponseComplete" && seen.insert(e.audit_id.clone()))
        .map(|e| e.request_uri)
        .collect()
}

/// An idle leader of `strategy` (default timings) for `window`: the watches that ended.
async fn idle_leader(strategy: &str, window: Duration) -> (Vec<String>, String) {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let admin = cp.client().await;
    let user = cp.unused_user();
    let all = rule(&["", "coordination.k8s.io"], &["*"], &["*"]);
    bind_role(&admin, ns.name(), &user, vec![all]).await.unwrap();
    let pod = (strategy == "for-life").then_some("idle");
    if let Some(pod) = pod {
        create_pod(&admin, ns.name(), pod).await.unwrap();
    }
    let flags = ["--lock", "idle", "-n", ns.name(), "--strategy", strategy];
    let sidecar = Sidecar::spawn(cp, &user, &flags, pod);
    tokio::time::sleep(window).await;
    assert!(
        sidecar.log_text().contains("became leader"),
        "{strategy}: no leader\n{}",
        sidecar.log_text()
    );
    (ended_watches(cp, &user), sidecar.log_text())
}

/// Issue 21, item 10: an idle leader's watch was seen reopened about every 12 s. Over a minute
/// an idle leader's watches (290 s each) must all stay open, for either strategy.
#[tokio::test(flavor = "multi_thread")]
async fn an_idle_leader_keeps_its_watches_open() {
    let window = Duration::from_secs(60);
    let (lease, for_life) = tokio::join!(idle_leader("lease", window), idle_leader("for-life", window));
    for (strategy, (ended, log)) in [("lease", lease), ("for-life", for_life)] {
        eprintln!("{strategy}: {} watches ended in {window:?}", ended.len());
        assert!(
            ended.is_empty(),
            "{strategy}: watches reopened: {ended:#?}\n{log}"
        );
    }
}
