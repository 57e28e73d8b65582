//! Prometheus metrics of a Lease election: `kube_leader::metrics::LeaderMetrics` (feature
//! `prometheus-client`) as the elector's observer, in the program's own registry, served on
//! `/metrics`.
//!
//! The metrics have client-go's names, so dashboards and alerts made for controller-runtime's
//! leader election work as they are: `leader_election_master_status{name}` is 1 on the leader
//! and 0 on the followers, `leader_election_slowpath_total{name}` counts renewals that could not
//! be done with one write; beside them `kube_leader_leadership_{acquired,lost}_total`,
//! `kube_leader_renew_duration_seconds` and `kube_leader_fencing_token`.
//!
//! Role: the Lease strategy's, `deploy/lease/rbac-lease.yaml` (or what
//! `kube-leader rbac --strategy lease --lock observer-prometheus-example` prints): `create` and
//! `list, watch, patch, delete` on Leases, `get, update` on the lock.
//!
//! ```sh
//! POD_NAME=a cargo run -p kube-leader-examples --example observer_prometheus -- --metrics-addr 127.0.0.1:9090
//! POD_NAME=b cargo run -p kube-leader-examples --example observer_prometheus -- --metrics-addr 127.0.0.1:9091
//! curl -s 127.0.0.1:9090/metrics | grep master_status  # 1 on the leader, 0 on the other
//! ```
//! Stop the leader (Ctrl-C or SIGTERM): it releases the Lease, the other one leads at once and
//! its gauge turns 1. Without `POD_NAMESPACE`, the kubeconfig's namespace is used.

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use clap::Parser;
use http_body_util::Full;
use hyper::{body::Bytes, header, server::conn::http1, service::service_fn, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kube_leader::{metrics::LeaderMetrics, LeaseElector};
use prometheus_client::{encoding::text::encode, registry::Registry};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// A Lease election that serves its metrics on `/metrics`.
#[derive(Debug, Parser)]
struct Args {
    /// The Lease's name (in `POD_NAMESPACE`, else the kubeconfig's namespace).
    #[arg(long, env = "LEASE_NAME", default_value = "observer-prometheus-example")]
    lease: String,
    /// Where to serve `/metrics`.
    #[arg(long, env = "METRICS_ADDR", default_value = "127.0.0.1:9090")]
    metrics_addr: SocketAddr,
    /// How long a lease lasts unless renewed.
    #[arg(long, env = "LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    lease_duration: Duration,
    /// How long the leader keeps trying to renew before it stops leading.
    #[arg(long, env = "RENEW_DEADLINE", default_value = "10s", value_parser = humantime::parse_duration)]
    renew_deadline: Duration,
    /// The time between renewals.
    #[arg(long, env = "RETRY_PERIOD", default_value = "2s", value_parser = humantime::parse_duration)]
    retry_period: Duration,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let client = kube::Client::try_default().await?;

    // The program's own registry: its own metrics would go here too.
    let mut registry = Registry::default();
    let metrics = LeaderMetrics::register(&mut registry);
    // A follower hears nothing from the elector: show its series (master_status 0) now.
    metrics.add_lock(&args.lease);
    let listener = TcpListener::bind(args.metrics_addr).await?;
    info!(addr = %listener.local_addr()?, "serving /metrics");
    tokio::spawn(serve(listener, Arc::new(registry)));

    let elector = LeaseElector::new(client, &args.lease).observer(metrics).config(
        kube_leader::LeaseConfig::default()
            .lease_duration(args.lease_duration)
            .renew_deadline(args.renew_deadline)
            .retry_period(args.retry_period),
    );
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        on_signal.cancel();
    });
    elector
        .run(&shutdown, |term, lost| async move {
            info!(fencing_token = term.fencing_token, "leading");
            lost.cancelled().await; // your work, until leadership is lost
            info!("no longer leading");
        })
        .await?;
    Ok(())
}

/// Serves `registry` on `GET /metrics`, one connection per task, until the process ends.
async fn serve(listener: TcpListener, registry: Arc<Registry>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let registry = registry.clone();
        let service = service_fn(move |req: Request<hyper::body::Incoming>| {
            let response = respond(&req, &registry);
            async move { Ok::<_, Infallible>(response) }
        });
        tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), service));
    }
}

fn respond(req: &Request<hyper::body::Incoming>, registry: &Registry) -> Response<Full<Bytes>> {
    let mut text = String::new();
    let (status, content_type, body) = if req.uri().path() != "/metrics" {
        (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /metrics\n".to_owned(),
        )
    } else if encode(&mut text, registry).is_err() {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            "could not encode the metrics\n".to_owned(),
        )
    } else {
        let openmetrics = "application/openmetrics-text; version=1.0.0; charset=utf-8";
        (StatusCode::OK, openmetrics, text)
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    response
}

/// SIGTERM (what Kubernetes sends) or Ctrl-C.
async fn shutdown_signal() {
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}
