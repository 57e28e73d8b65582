//! A kube-leader Lease candidate as a process of its own, for tests that pause or kill it.
//!
//! Usage: `lease-candidate KUBECONFIG NAMESPACE LEASE IDENTITY LEASE_MS RENEW_MS RETRY_MS [CLIENT]`,
//! CLIENT `http1` (kube's own client, the default), `http2` (`kube_leader::client::http2`) or
//! `http1-nodelay` (kube's connector, TLS and pool over HTTP/1.1 as kube builds them, with
//! `TCP_NODELAY`: the experiment of docs/benchmarks.md, "Why kube's client took 40 ms more").
//! Prints one JSON line per event on stdout: `started_leading` (with the fencing token),
//! `stopped_leading` (with the reason), each with CLOCK_MONOTONIC nanoseconds (`mono_ns`).
//! Campaigns again after a loss; SIGTERM releases and exits 0. With `KUBE_LEADER_COORDINATED`
//! set to a version, it takes part in coordinated leader election as a candidate of that version.

use kube_leader_e2e::Tune;
use std::{io::Write, time::Duration};

use kube_leader::LeaseElector;
use tokio_util::sync::CancellationToken;

fn emit(v: serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// kube's client as `Client::try_from` builds it (its connector, TLS and pool), over HTTP/1.1,
/// with `TCP_NODELAY` on its sockets.
fn http1_nodelay(config: &kube::Config) -> kube::Result<kube::Client> {
    use kube::client::ConfigExt as _;
    use tower::ServiceExt as _;
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let https = config.rustls_https_connector_with_connector(http)?;
    let pool: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(https);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .service(pool.map_err(tower::BoxError::from));
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    kube_leader_e2e::init_process_tracing();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (args, http) = match &args[..] {
        [args @ .., last] if ["http1", "http2", "http1-nodelay"].contains(&last.as_str()) => {
            (args, last.as_str())
        }
        args => (args, "http1"),
    };
    let [kubeconfig, namespace, lease, identity, lease_ms, renew_ms, retry_ms] = args else {
        return Err(
            "usage: lease-candidate KUBECONFIG NAMESPACE LEASE IDENTITY LEASE_MS RENEW_MS RETRY_MS \
                    [http1|http2|http1-nodelay]"
                .into(),
        );
    };
    let ms = |s: &String| s.parse::<u64>().map(Duration::from_millis);
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    // As the library guide recommends for an election's client: kube-leader retries itself.
    config.default_retry = false;
    let client = match http {
        "http2" => kube_leader::client::http2(config, ms(renew_ms)?)?,
        "http1-nodelay" => http1_nodelay(&config)?,
        _ => kube::Client::try_from(config)?,
    };
    let mut elector = LeaseElector::new(client, lease)
        .namespace(namespace)
        .identity(identity)
        .config(
            kube_leader::LeaseConfig::default()
                .lease_duration(ms(lease_ms)?)
                .renew_deadline(ms(renew_ms)?)
                .retry_period(ms(retry_ms)?),
        );
    if let Some(version) = std::env::var("KUBE_LEADER_COORDINATED")
        .ok()
        .filter(|v| !v.is_empty())
    {
        elector = elector.tune(|c| c.coordinated(kube_leader::Coordinated::new(version)));
    }
    let shutdown = CancellationToken::new();
    let s = shutdown.clone();
    tokio::spawn(async move {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM");
        term.recv().await;
        s.cancel();
    });
    let id = identity.clone();
    elector
        .run(&shutdown, |term, lost| {
            let id = id.clone();
            async move {
                emit(serde_json::json!({"event": "started_leading", "identity": id,
                    "fencing_token": term.fencing_token, "mono_ns": kube_leader_e2e::mono_ns()}));
                lost.cancelled().await;
                emit(serde_json::json!({"event": "stopped_leading", "identity": id,
                    "mono_ns": kube_leader_e2e::mono_ns()}));
            }
        })
        .await?;
    emit(serde_json::json!({"event": "exit", "identity": identity, "mono_ns": kube_leader_e2e::mono_ns()}));
    Ok(())
}
