//! A kube-runtime `Controller` gated on leader-for-life leadership.
//!
//! Only the leader reconciles: the controller starts once `become_leader` returns, and shuts
//! down gracefully the moment leadership is lost or a shutdown signal arrives.
//!
//! Run it in a Pod with `POD_NAME`/`POD_NAMESPACE` from the Downward API and a ServiceAccount
//! bound to the Role of `deploy/for-life/rbac-for-life.yaml` (which grants the lock ConfigMap
//! alone, by name) **plus** a rule for the ConfigMaps this controller reconciles, which that
//! Role does not grant:
//!
//! ```yaml
//!   - apiGroups: [""]
//!     resources: ["configmaps"]
//!     verbs: ["get", "list", "watch"]
//! ```
//!
//! Outside a cluster the election is skipped, as operator-sdk's `leader.Become` does, and the
//! controller runs in the kubeconfig's default namespace.
//!
//! ```text
//! cargo run -p kube-leader-examples --example controller_for_life
//! ```
//!
//! Exit codes: 0 after SIGTERM or Ctrl-C; 1 on an error; 3 when leadership was lost (the lock
//! was deleted or replaced), so that the container restarts and campaigns again.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    runtime::{controller::Action, watcher, Controller},
    Api, Client, ResourceExt,
};
use kube_leader::{Error, ForLife, LossReason};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The lock ConfigMap's name.
const LOCK: &str = "controller-for-life-example";
/// Exit code after losing leadership.
const EXIT_LOST: i32 = 3;
/// How long the controller may take to drain its running reconciles once leadership is lost or
/// a shutdown was asked for; then they are dropped (cancelled). kube-runtime's graceful
/// shutdown does not end a controller whose first list has not completed yet (a term lost
/// within milliseconds of being won), so the wait is bounded here.
const DRAIN: Duration = Duration::from_secs(5);

/// What the reconciler knows about the term it works in.
struct Context {
    /// Attach it to writes that must not come from a deposed leader.
    fencing_token: u64,
}

async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Context>) -> Result<Action, kube::Error> {
    info!(configmap = %cm.name_any(), fencing_token = ctx.fencing_token, "reconciling");
    Ok(Action::requeue(Duration::from_secs(300)))
}

fn error_policy(cm: Arc<ConfigMap>, error: &kube::Error, _ctx: Arc<Context>) -> Action {
    warn!(configmap = %cm.name_any(), %error, "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let client = Client::try_default().await?;
    let shutdown = CancellationToken::new();
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            shutdown_signal().await;
            shutdown.cancel();
        }
    });

    // 1. Become the leader (or return on shutdown while waiting).
    let leadership = match ForLife::new(client.clone(), LOCK).become_leader(&shutdown).await {
        Ok(leadership) => leadership,
        Err(Error::Cancelled { .. }) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    info!(
        identity = leadership.term().identity,
        fencing_token = leadership.fencing_token(),
        skipped = leadership.is_skipped(),
        "leading; starting the controller"
    );

    // 2. Reconcile while leading. Leadership ends on shutdown too (`LossReason::Cancelled`);
    //    the shutdown trigger is there as well for a skipped election, which never ends.
    let configmaps = Api::<ConfigMap>::namespaced(client, &leadership.term().lock.namespace);
    let ctx = Arc::new(Context {
        fencing_token: leadership.fencing_token(),
    });
    let controller = Controller::new(configmaps, watcher::Config::default())
        .graceful_shutdown_on(leadership.lost_token().cancelled_owned())
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                warn!(%error, "controller error");
            }
        });
    let (lost, stop) = (leadership.lost_token(), shutdown.clone());
    let drained = async move {
        tokio::select! {
            () = lost.cancelled() => {}
            () = stop.cancelled() => {}
        }
        tokio::time::sleep(DRAIN).await;
    };
    tokio::select! {
        () = controller => {}
        () = drained => warn!(drain = ?DRAIN, "the controller did not stop in time; its reconciles are cancelled"),
    }

    // 3. The work has stopped: now it is safe to step down. Deleting the lock lets the next
    // leader start at once, rather than when this Pod is gone (dropping the handle instead
    // keeps the lock until then, the seed's way). After a loss, the release is this leader's
    // word that its work stopped: a candidate waiting on a lock deleted under this leader
    // takes over only on it (or once this Pod has ended).
    let reason = leadership.loss_reason();
    leadership.release().await?;
    match reason {
        Some(LossReason::Cancelled) | None => {
            info!("shut down");
            Ok(())
        }
        Some(reason) => {
            warn!(%reason, "lost leadership; exiting so that the container restarts and campaigns again");
            std::process::exit(EXIT_LOST);
        }
    }
}

/// SIGTERM (what Kubernetes sends) or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
