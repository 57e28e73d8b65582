//! The `observer_prometheus` and `health` examples, run as the processes they are against a
//! real control plane (kube-leader-testenv), with short lease timings (3 s / 2 s / 500 ms):
//!
//! - `/metrics` shows `leader_election_master_status` 1 on the leader and 0 on a follower,
//!   and the follower's turns 1 when the leader stops (SIGTERM: it releases the Lease); a
//!   term lost to a partition is counted with its reason, and so is the next term.
//! - `/healthz` is 200 on a waiting follower and on the leader; 500 on the leader once another
//!   holder took its Lease, or once the API server is unreachable (a partition by a
//!   [`FaultProxy`]), and it stays 500 after the partition heals, as the example documents.
//!
//! The binaries are the ones cargo builds for `cargo test --workspace --all-targets`
//! (`target/debug/examples/<name>`); with a narrower command, build them first with
//! `cargo build -p kube-leader-examples --examples`. Each process's log is kept in
//! `target/tmp/` and its tail is shown when a check fails.

mod common;

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    time::Duration,
};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{api::PostParams, Api};
use kube_leader_testenv::{ControlPlane, Fault, FaultProxy, ADMIN};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
    process::{Child, Command},
    time::{sleep, timeout, Instant},
};

/// How long any one expected change may take.
const SOON: Duration = Duration::from_secs(30);

/// A free port of 127.0.0.1 (free when asked; the example binds it right after).
fn free_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a free port");
    listener.local_addr().expect("its address")
}

/// One running example: its process, the address it serves, and its log.
struct Example {
    child: Child,
    addr: SocketAddr,
    path: &'static str,
    log: PathBuf,
}

impl Example {
    /// Starts example `name` as candidate `id` for `lease` in `ns`, through `kubeconfig`.
    fn start(name: &str, kubeconfig: &Path, ns: &str, lease: &str, id: &str) -> Self {
        let (flag, path) = match name {
            "health" => ("--health-addr", "/healthz"),
            _ => ("--metrics-addr", "/metrics"),
        };
        let addr = free_addr();
        let log = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{ns}-{id}.log"));
        let out = std::fs::File::create(&log).expect("a log file");
        let err = out.try_clone().expect("a log file");
        let child = Command::new(common::example(name))
            .args([flag, &addr.to_string(), "--lease", lease])
            .args([
                "--lease-duration",
                "3s",
                "--renew-deadline",
                "2s",
                "--retry-period",
                "500ms",
            ])
            .env("KUBECONFIG", kubeconfig)
            .env("POD_NAMESPACE", ns)
            .env("POD_NAME", id)
            .env("RUST_LOG", "info,kube_leader=debug")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the example {name}: {e}"));
        Self {
            child,
            addr,
            path,
            log,
        }
    }

    /// The end of the log, for failure messages.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(3000);
        let start = (start..text.len())
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(0);
        format!("log {} ends with:\n{}", self.log.display(), &text[start..])
    }

    /// Asks until an answer passes `ok`; returns it. Panics after [`SOON`], or if the process
    /// exits meanwhile.
    async fn eventually(&mut self, what: &str, ok: impl Fn(u16, &str) -> bool) -> (u16, String) {
        let deadline = Instant::now() + SOON;
        let mut last = None;
        loop {
            if let Some((code, body)) = get(self.addr, self.path).await {
                if ok(code, &body) {
                    return (code, body);
                }
                last = Some((code, body));
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("{what}: the example exited ({status}); {}", self.log_tail());
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {SOON:?}; last answer {last:?}; {}",
                self.log_tail()
            );
            sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sends SIGTERM and waits for the exit.
    async fn terminate(&mut self) -> ExitStatus {
        let pid = self.child.id().expect("still running").to_string();
        let sent = std::process::Command::new("kill").args(["-TERM", &pid]).status();
        assert!(sent.is_ok_and(|s| s.success()), "kill -TERM {pid} failed");
        match timeout(SOON, self.child.wait()).await {
            Ok(status) => status.expect("the exit status"),
            Err(_) => panic!("no exit within {SOON:?} of SIGTERM; {}", self.log_tail()),
        }
    }
}

/// `GET path` on `addr`: status code and body, or `None` if there is no answer (yet).
async fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut bytes = Vec::new();
        stream.read_to_end(&mut bytes).await.ok()?;
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let (head, body) = text.split_once("\r\n\r\n")?;
        let code = head.split(' ').nth(1)?.parse().ok()?;
        Some((code, body.to_owned()))
    };
    timeout(Duration::from_secs(5), exchange).await.ok().flatten()
}

/// Whether the metrics text has `line`.
fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

/// The value of the series `series` (name and labels) in a metrics text.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn master_status(lease: &str, v: u8) -> String {
    format!(r#"leader_election_master_status{{name="{lease}"}} {v}"#)
}

#[tokio::test]
async fn metrics_show_the_leader_and_follow_a_handover() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let (kubeconfig, lease) = (cp.kubeconfig_path(), "metrics");
    let mut a = Example::start("observer_prometheus", kubeconfig, ns.name(), lease, "a");
    let (_, text) = a
        .eventually("a leads", |c, t| {
            c == 200 && has_line(t, &master_status(lease, 1))
        })
        .await;
    let series = |name: &str| format!(r#"{name}{{name="{lease}"}}"#);
    assert_eq!(
        value(&text, &series("kube_leader_leadership_acquired_total")),
        Some(1.0),
        "{text}"
    );
    let a_token = value(&text, &series("kube_leader_fencing_token")).expect("a fencing token");
    assert!(a_token >= 1.0, "{text}");
    a.eventually("a renews", |_, t| {
        value(t, &series("kube_leader_renew_duration_seconds_count")).is_some_and(|n| n >= 1.0)
    })
    .await;

    let mut b = Example::start("observer_prometheus", kubeconfig, ns.name(), lease, "b");
    b.eventually("b follows", |c, t| {
        c == 200 && has_line(t, &master_status(lease, 0))
    })
    .await;
    let (_, text) = a.eventually("a still leads", |c, _| c == 200).await;
    assert!(has_line(&text, &master_status(lease, 1)), "{text}");

    // Handover: a releases the Lease on SIGTERM; b leads at once.
    assert!(a.terminate().await.success(), "a failed; {}", a.log_tail());
    let (_, text) = b
        .eventually("b leads after a", |c, t| {
            c == 200 && has_line(t, &master_status(lease, 1))
        })
        .await;
    let b_token = value(&text, &series("kube_leader_fencing_token")).expect("b's fencing token");
    assert!(
        b_token > a_token,
        "b's term must have a greater token than a's ({a_token}):\n{text}"
    );
    assert!(b.terminate().await.success(), "b failed; {}", b.log_tail());
}

#[tokio::test]
async fn metrics_count_a_term_lost_to_a_partition_and_the_next_one() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let proxy = FaultProxy::to_apiserver(cp).expect("a proxy");
    let through_proxy = proxy.write_kubeconfig(cp, ADMIN).expect("a kubeconfig");
    let lease = "partitioned-metrics";
    let mut a = Example::start("observer_prometheus", &through_proxy, ns.name(), lease, "a");
    a.eventually("a leads", |c, t| {
        c == 200 && has_line(t, &master_status(lease, 1))
    })
    .await;

    // No renewal gets through: the term ends at the renew deadline, and says why.
    proxy.set(Fault::Blackhole);
    let lost = format!(r#"kube_leader_leadership_lost_total{{name="{lease}",reason="renew_deadline"}} 1"#);
    let (_, text) = a
        .eventually("a's term ends", |c, t| c == 200 && has_line(t, &lost))
        .await;
    assert!(has_line(&text, &master_status(lease, 0)), "{text}");

    // Healed: a campaigns again (`run` campaigns again) and leads a second term.
    proxy.set(Fault::Pass);
    let acquired = format!(r#"kube_leader_leadership_acquired_total{{name="{lease}"}} 2"#);
    let (_, text) = a
        .eventually("a leads again", |c, t| c == 200 && has_line(t, &acquired))
        .await;
    assert!(has_line(&text, &master_status(lease, 1)), "{text}");
    assert!(a.terminate().await.success(), "a failed; {}", a.log_tail());
}

/// Makes `holder` the Lease's holder behind its leader's back (retrying on the leader's own
/// renewals, which conflict).
async fn take_lease(ns: &str, lease: &str, holder: &str) {
    let leases: Api<Lease> = Api::namespaced(ControlPlane::shared().client().await, ns);
    for _ in 0..50 {
        let mut current = leases.get(lease).await.expect("the Lease");
        if let Some(spec) = current.spec.as_mut() {
            spec.holder_identity = Some(holder.to_owned());
        }
        match leases.replace(lease, &PostParams::default(), &current).await {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => panic!("cannot take the Lease: {e}"),
        }
    }
    panic!("the Lease kept changing: could not take it");
}

#[tokio::test]
async fn health_follows_the_term_and_fails_once_the_lease_is_taken() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let (kubeconfig, lease) = (cp.kubeconfig_path(), "health");
    let mut a = Example::start("health", kubeconfig, ns.name(), lease, "a");
    a.eventually("a leads, healthy", |c, b| c == 200 && b.starts_with("leading"))
        .await;
    let mut b = Example::start("health", kubeconfig, ns.name(), lease, "b");
    b.eventually("b follows a, healthy", |c, b| {
        c == 200 && b.starts_with("following; leader: a")
    })
    .await;

    take_lease(ns.name(), lease, "intruder").await;
    let (_, body) = a
        .eventually("a is unhealthy", |c, b| {
            c == 500 && b.starts_with("leadership lost: ")
        })
        .await;
    assert!(body.contains("intruder"), "{body}");
    // The intruder never renews: b takes over once its lease expires, and stays healthy.
    b.eventually("b leads, healthy", |c, b| c == 200 && b.starts_with("leading"))
        .await;
    let (code, body) = get(a.addr, "/healthz").await.expect("a answers");
    assert_eq!(
        (code, body.starts_with("leadership lost: ")),
        (500, true),
        "{body}"
    );
    assert!(a.terminate().await.success(), "a failed; {}", a.log_tail());
    assert!(b.terminate().await.success(), "b failed; {}", b.log_tail());
}

#[tokio::test]
async fn health_fails_while_the_api_server_is_unreachable() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let proxy = FaultProxy::to_apiserver(cp).expect("a proxy");
    let through_proxy = proxy.write_kubeconfig(cp, ADMIN).expect("a kubeconfig");
    let lease = "partition";
    let mut a = Example::start("health", &through_proxy, ns.name(), lease, "a");
    a.eventually("a leads, healthy", |c, b| c == 200 && b.starts_with("leading"))
        .await;
    let mut b = Example::start("health", cp.kubeconfig_path(), ns.name(), lease, "b");
    b.eventually("b follows, healthy", |c, b| {
        c == 200 && b.starts_with("following")
    })
    .await;

    proxy.set(Fault::Blackhole);
    let (_, body) = a.eventually("a is unhealthy", |c, _| c == 500).await;
    assert!(
        body.starts_with("renew loop stuck") || body.contains("renew deadline"),
        "{body}"
    );
    b.eventually("b leads, healthy", |c, b| c == 200 && b.starts_with("leading"))
        .await;
    // Healed: a stays unhealthy until it is restarted, as documented.
    proxy.set(Fault::Pass);
    a.eventually("a still unhealthy", |c, b| {
        c == 500 && b.starts_with("leadership lost: ")
    })
    .await;
    assert!(a.terminate().await.success(), "a failed; {}", a.log_tail());
    assert!(b.terminate().await.success(), "b failed; {}", b.log_tail());
}
