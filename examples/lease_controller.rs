//! A `kube::runtime::Controller` behind a Lease election: it reconciles only while this replica
//! leads, stops the moment leadership is lost, and releases the Lease on SIGTERM so the next
//! replica takes over at once. Its flags are Kubernetes components' (`--leader-elect*`, the
//! library's `clap` feature), so `--leader-elect=false` runs it locally without an election.
//!
//! The controller is a stand-in for yours: it stamps every ConfigMap labelled
//! `app.kubernetes.io/managed-by=lease-controller-example` in `--watch-namespace` with the
//! identity and fencing token of the leader that reconciled it.
//!
//! ```sh
//! POD_NAME=a cargo run -p kube-leader-examples --example lease_controller -- --watch-namespace default
//! POD_NAME=b cargo run -p kube-leader-examples --example lease_controller -- --watch-namespace default
//! ```
//!
//! The Role it needs (the Lease in its namespace, the ConfigMaps it reconciles, its Events):
//!
//! ```yaml
//! rules:
//!   - apiGroups: ["coordination.k8s.io"]
//!     resources: ["leases"]
//!     verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
//!   - apiGroups: [""]
//!     resources: ["configmaps"]
//!     verbs: ["get", "list", "watch", "patch"]
//!   - apiGroups: ["", "events.k8s.io"]
//!     resources: ["events"]
//!     verbs: ["create", "patch"]
//! ```

use std::{sync::Arc, time::Duration};

use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{Patch, PatchParams},
    runtime::{controller::Action, watcher, Controller},
    Api, Client, ResourceExt,
};
use kube_leader::{args::LeaderElectionArgs, Leadership};
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The label of the ConfigMaps this example reconciles.
const SELECTOR: &str = "app.kubernetes.io/managed-by=lease-controller-example";
/// The annotation it writes: `<identity> <fencing token>`.
const STAMP: &str = "example.kube-leader.io/reconciled-by";
/// How long the controller may take to drain its running reconciles once leadership is lost.
const DRAIN: Duration = Duration::from_secs(5);

/// A controller that reconciles only while it leads.
#[derive(Parser)]
struct Cli {
    /// The namespace whose ConfigMaps are reconciled.
    #[arg(long, env = "WATCH_NAMESPACE", default_value = "default")]
    watch_namespace: String,
    #[command(flatten)]
    leader_election: LeaderElectionArgs,
}

/// What a reconcile needs: the client, and the term it works for.
struct Ctx {
    client: Client,
    identity: String,
    fencing_token: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter("info").init();
    let cli = Cli::parse();
    let client = Client::try_default().await?;
    let elector = cli
        .leader_election
        .elector(client.clone(), "lease-controller-example")?;

    let shutdown = CancellationToken::new();
    let mut sigterm = signal(SignalKind::terminate())?;
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = sigterm.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        on_signal.cancel();
    });

    while !shutdown.is_cancelled() {
        let leadership = match elector.become_leader(&shutdown).await {
            Ok(l) => l,
            Err(kube_leader::Error::Cancelled { .. }) => break,
            Err(e) => return Err(e.into()),
        };
        info!(
            identity = leadership.term().identity,
            fencing_token = leadership.fencing_token(),
            "leading: reconciling"
        );
        reconcile_while_leading(&client, &cli.watch_namespace, &leadership).await;
        info!(reason = ?leadership.loss_reason(), "stopped reconciling");
        // The controller has stopped: only now may the next leader start.
        leadership.release().await?;
    }
    info!("shut down");
    Ok(())
}

/// Runs the controller until leadership is lost (shutdown included).
async fn reconcile_while_leading(client: &Client, ns: &str, leadership: &Leadership) {
    let api = Api::<ConfigMap>::namespaced(client.clone(), ns);
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        identity: leadership.term().identity.clone(),
        fencing_token: leadership.fencing_token(),
    });
    let lost = leadership.lost_token();
    let controller = Controller::new(api, watcher::Config::default().labels(SELECTOR))
        .graceful_shutdown_on(async move { lost.cancelled().await })
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {});
    // kube-runtime's graceful shutdown does not end a controller whose first list has not
    // completed (a term lost within milliseconds of being won): the drain is bounded here, then
    // the reconciles still running are dropped (cancelled).
    let lost = leadership.lost_token();
    let drained = async move {
        lost.cancelled().await;
        tokio::time::sleep(DRAIN).await;
    };
    tokio::select! {
        () = controller => {}
        () = drained => warn!(drain = ?DRAIN, "the controller did not stop in time; its reconciles are cancelled"),
    }
}

async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, kube::Error> {
    let stamp = format!("{} {}", ctx.identity, ctx.fencing_token);
    if cm.annotations().get(STAMP) != Some(&stamp) {
        let ns = cm.namespace().unwrap_or_default();
        let patch = serde_json::json!({ "metadata": { "annotations": { STAMP: stamp } } });
        Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns)
            .patch(&cm.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        info!(configmap = %cm.name_any(), "reconciled");
    }
    Ok(Action::requeue(Duration::from_secs(300)))
}

fn error_policy(cm: Arc<ConfigMap>, error: &kube::Error, _: Arc<Ctx>) -> Action {
    warn!(configmap = %cm.name_any(), %error, "reconcile failed");
    Action::requeue(Duration::from_secs(1))
}
