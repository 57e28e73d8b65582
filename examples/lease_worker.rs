//! A worker that does its job only while it holds a Lease, and campaigns again after losing it.
//!
//! ```sh
//! POD_NAME=worker-1 cargo run -p kube-leader-examples --example lease_worker
//! ```
//! Run it twice with different `POD_NAME`s: one works, the other waits; stop the first (Ctrl-C)
//! and the second takes over at once, because the first releases its Lease after its work stops.

use std::time::Duration;

use kube_leader::LeaseElector;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter("info,kube_leader=debug")
        .init();
    let client = kube::Client::try_default().await?;
    let elector = LeaseElector::new(client, "lease-worker-example");

    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        on_signal.cancel();
    });

    elector
        .run(&shutdown, |term, lost| async move {
            tracing::info!(identity = %term.identity, fencing_token = term.fencing_token, "leading: working");
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    biased;
                    _ = lost.cancelled() => break,
                    _ = tick.tick() => {
                        // Attach term.fencing_token to every write the leader makes.
                    }
                }
            }
            tracing::info!("no longer leading: work stopped");
        })
        .await?;
    Ok(())
}
