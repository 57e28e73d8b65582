//! A liveness endpoint for a Lease-elected operator: `/healthz` answers 200 for a follower
//! waiting for the Lease and for a leader whose renewals go through, and 500 with the reason
//! once leadership was lost or when the renew loop is stuck.
//!
//! - Leading: healthy while the term is confirmed ([`Leadership::confirmations`]: the
//!   renew deadline counted from the last successful renewal). Past it, the renew loop is
//!   stuck: 500 `renew loop stuck: ...`. (The elector itself stops leading at that instant, so
//!   this shows only if its keeper hangs; the loss follows.)
//! - Leadership lost (another holder took the Lease, it was deleted, or no renewal got through
//!   within the renew deadline, for example while the API server is unreachable): 500
//!   `leadership lost: <reason>`, until the process is restarted. A deposed leader's caches and
//!   in-flight work belong to the old term: let the kubelet's liveness probe restart the
//!   container, which then campaigns again as a follower.
//! - Following: 200 `following; leader: <holder>`.
//!
//! Role: the Lease strategy's, `deploy/lease/rbac-lease.yaml` (or what
//! `kube-leader rbac --strategy lease --lock health-example` prints): `create` and
//! `list, watch, patch, delete` on Leases, `get, update` on the lock. The Pod's liveness probe:
//! `httpGet: {path: /healthz, port: 8080}` (with `--health-addr 0.0.0.0:8080` in a Pod).
//!
//! ```sh
//! POD_NAME=a cargo run -p kube-leader-examples --example health -- --health-addr 127.0.0.1:8080
//! curl -si 127.0.0.1:8080/healthz   # 200 leading
//! kubectl delete lease health-example
//! curl -si 127.0.0.1:8080/healthz   # 500 leadership lost: the lock was deleted
//! ```
//! Exit codes: 0 after SIGTERM or Ctrl-C (a leader releases the Lease first); 1 on an error.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use clap::Parser;
use http_body_util::Full;
use hyper::{body::Bytes, server::conn::http1, service::service_fn, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kube_leader::{Error, LeaderInfo, Leadership, LeaseElector, LossReason};
use tokio::{net::TcpListener, sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// A Lease election with a liveness endpoint.
#[derive(Debug, Parser)]
struct Args {
    /// The Lease's name (in `POD_NAMESPACE`, else the kubeconfig's namespace).
    #[arg(long, env = "LEASE_NAME", default_value = "health-example")]
    lease: String,
    /// Where to serve `/healthz`.
    #[arg(long, env = "HEALTH_ADDR", default_value = "127.0.0.1:8080")]
    health_addr: SocketAddr,
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

/// Where this candidate stands.
#[derive(Debug)]
enum Role {
    /// Campaigning: `leader` is the holder as last seen.
    Following {
        leader: watch::Receiver<Option<LeaderInfo>>,
    },
    /// Leading: until when the term is confirmed, and whether it is lost already.
    Leading {
        confirmed: watch::Receiver<Option<Instant>>,
        lost: CancellationToken,
    },
    /// The term is over: unhealthy until restarted.
    Lost(LossReason),
}

/// `Ok`: healthy, with what to say; `Err`: why not.
fn check(role: &Role) -> Result<String, String> {
    match role {
        Role::Following { leader } => {
            let holder = leader.borrow().as_ref().and_then(|l| l.holder.clone());
            Ok(format!(
                "following; leader: {}",
                holder.as_deref().unwrap_or("(none)")
            ))
        }
        Role::Leading { lost, .. } if lost.is_cancelled() => Err("leadership lost".into()),
        Role::Leading { confirmed, .. } => match *confirmed.borrow() {
            Some(until) if Instant::now() > until => Err(format!(
                "renew loop stuck: no successful renewal within the renew deadline (expired {:?} ago)",
                Instant::now() - until
            )),
            _ => Ok("leading".into()),
        },
        Role::Lost(reason) => Err(format!("leadership lost: {reason}")),
    }
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
    let elector = LeaseElector::new(client, &args.lease).config(
        kube_leader::LeaseConfig::default()
            .lease_duration(args.lease_duration)
            .renew_deadline(args.renew_deadline)
            .retry_period(args.retry_period),
    );
    let role = Arc::new(Mutex::new(Role::Following {
        leader: elector.observe(),
    }));
    let listener = TcpListener::bind(args.health_addr).await?;
    info!(addr = %listener.local_addr()?, "serving /healthz");
    tokio::spawn(serve(listener, role.clone()));

    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        on_signal.cancel();
    });
    let leadership = match elector.become_leader(&shutdown).await {
        Ok(l) => l,
        Err(Error::Cancelled { .. }) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    lead(leadership, &role, &shutdown).await
}

/// Works while leading; after a loss, stays unhealthy until shutdown.
async fn lead(
    leadership: Leadership,
    role: &Mutex<Role>,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    info!(fencing_token = leadership.fencing_token(), "leading");
    let lost = leadership.lost_token();
    *role.lock().unwrap() = Role::Leading {
        confirmed: leadership.confirmations(),
        lost: lost.clone(),
    };
    tokio::select! {
        () = lost.cancelled() => {}
        () = shutdown.cancelled() => {}
        // Your work goes here, stopping when `lost` is cancelled.
    }
    if shutdown.is_cancelled() {
        leadership.release().await?;
        return Ok(());
    }
    let reason = leadership.lost().await;
    warn!(%reason, "leadership lost: unhealthy until restarted");
    *role.lock().unwrap() = Role::Lost(reason);
    shutdown.cancelled().await;
    Ok(())
}

/// Serves `GET /healthz` (and `/livez`), one connection per task, until the process ends.
async fn serve(listener: TcpListener, role: Arc<Mutex<Role>>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let role = role.clone();
        let service = service_fn(move |req: Request<hyper::body::Incoming>| {
            let (status, body) = match req.uri().path() {
                "/healthz" | "/livez" => match check(&role.lock().unwrap()) {
                    Ok(ok) => (StatusCode::OK, ok),
                    Err(why) => (StatusCode::INTERNAL_SERVER_ERROR, why),
                },
                _ => (StatusCode::NOT_FOUND, "not found: try /healthz".into()),
            };
            let mut response = Response::new(Full::new(Bytes::from(body + "\n")));
            *response.status_mut() = status;
            async move { Ok::<_, Infallible>(response) }
        });
        tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), service));
    }
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
