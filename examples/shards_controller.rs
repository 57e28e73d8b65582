//! A `kube::runtime::Controller` over shards: `--shards` Leases (`<name>-0` ..) shared fairly
//! among the replicas, and each replica reconciles only the objects of the shards it holds.
//! An object's shard is a hash of its name. A shard handed over (a replica joined, or left)
//! is reconciled by its new holder only after the old one has stopped writing for it: the old
//! holder waits for its reconciles of that shard in flight before it lets the shard go.
//!
//! The controller is a stand-in for yours: it stamps every ConfigMap labelled
//! `app.kubernetes.io/managed-by=shards-controller-example` in `--watch-namespace` with
//! `<identity> <shard> <fencing token>`.
//!
//! ```sh
//! POD_NAME=a cargo run -p kube-leader-examples --example shards_controller -- --shards 4
//! POD_NAME=b cargo run -p kube-leader-examples --example shards_controller -- --shards 4
//! ```
//!
//! The Role it needs (the shard and membership Leases, the ConfigMaps, the Events):
//!
//! ```yaml
//! rules:
//!   - apiGroups: ["coordination.k8s.io"]
//!     resources: ["leases"]
//!     verbs: ["get", "list", "watch", "create", "update", "delete"]
//!   - apiGroups: [""]
//!     resources: ["configmaps"]
//!     verbs: ["get", "list", "watch", "patch"]
//!   - apiGroups: ["", "events.k8s.io"]
//!     resources: ["events"]
//!     verbs: ["create", "patch"]
//! ```

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{Patch, PatchParams},
    runtime::{controller::Action, watcher, Controller},
    Api, Client, ResourceExt,
};
use kube_leader::{args::LeaderElectionArgs, Term};
use tokio::{
    signal::unix::{signal, SignalKind},
    sync::{mpsc, RwLock},
};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The label of the ConfigMaps this example reconciles.
const SELECTOR: &str = "app.kubernetes.io/managed-by=shards-controller-example";
/// The annotation it writes: `<identity> <shard> <fencing token>`.
const STAMP: &str = "example.kube-leader.io/reconciled-by";

/// A controller that reconciles the objects of its shards.
#[derive(Parser)]
struct Cli {
    /// The namespace whose ConfigMaps are reconciled.
    #[arg(long, env = "WATCH_NAMESPACE", default_value = "default")]
    watch_namespace: String,
    /// How many shards the objects are spread over.
    #[arg(long, default_value_t = 4)]
    shards: u32,
    #[command(flatten)]
    leader_election: LeaderElectionArgs,
}

/// What a reconcile needs.
struct Ctx {
    client: Client,
    count: u32,
    /// The shards held now, with their terms (identity, fencing token). A reconcile holds the
    /// read lock while it writes; a shard is removed under the write lock, so no write for it
    /// is in flight after.
    held: RwLock<BTreeMap<u32, Term>>,
}

/// The shard of an object: FNV-1a of its name, modulo the shard count.
fn shard_of(name: &str, count: u32) -> u32 {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (hash % u64::from(count)) as u32
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter("info").init();
    let cli = Cli::parse();
    let client = Client::try_default().await?;
    let shards = cli
        .leader_election
        .shards(client.clone(), "shards-controller-example", cli.shards)?;
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

    let ctx = Arc::new(Ctx {
        client: client.clone(),
        count: cli.shards,
        held: RwLock::new(BTreeMap::new()),
    });
    // A shard gained: reconcile everything again (its objects were skipped so far).
    let (gained_tx, gained_rx) = mpsc::unbounded_channel::<()>();
    let api = Api::<ConfigMap>::namespaced(client, &cli.watch_namespace);
    let stop = shutdown.clone();
    let controller = Controller::new(api, watcher::Config::default().labels(SELECTOR))
        .reconcile_all_on(tokio_stream_of(gained_rx))
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|_| async {});
    let campaign = shards.run(&shutdown, |index, term, lost| {
        let ctx = ctx.clone();
        let gained = gained_tx.clone();
        async move {
            info!(
                shard = index,
                fencing_token = term.fencing_token,
                "shard acquired"
            );
            ctx.held.write().await.insert(index, term);
            let _ = gained.send(());
            lost.cancelled().await;
            // Waits for this replica's reconciles in flight: none writes for the shard after.
            ctx.held.write().await.remove(&index);
            info!(shard = index, "shard given up");
        }
    });
    let (result, ()) = tokio::join!(campaign, controller);
    result?;
    info!("shut down");
    Ok(())
}

/// An unbounded receiver as a stream.
fn tokio_stream_of(mut rx: mpsc::UnboundedReceiver<()>) -> impl futures::Stream<Item = ()> + Send {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, kube::Error> {
    let shard = shard_of(&cm.name_any(), ctx.count);
    let held = ctx.held.read().await;
    let Some(term) = held.get(&shard) else {
        // Another replica's object: it is reconciled again when this one gains the shard.
        return Ok(Action::await_change());
    };
    let stamp = format!("{} {shard} {}", term.identity, term.fencing_token);
    if cm.annotations().get(STAMP) != Some(&stamp) {
        let ns = cm.namespace().unwrap_or_default();
        let patch = serde_json::json!({ "metadata": { "annotations": { STAMP: stamp } } });
        Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns)
            .patch(&cm.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        info!(configmap = %cm.name_any(), shard, "reconciled");
    }
    drop(held);
    Ok(Action::requeue(Duration::from_secs(300)))
}

fn error_policy(cm: Arc<ConfigMap>, error: &kube::Error, _: Arc<Ctx>) -> Action {
    warn!(configmap = %cm.name_any(), %error, "reconcile failed");
    Action::requeue(Duration::from_secs(1))
}
