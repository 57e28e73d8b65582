//! A candidate of a shard set, for the shard tests and chaos runs: it reports what it holds as
//! JSON lines on stdout, with CLOCK_MONOTONIC nanoseconds.
//!
//! ```text
//! shard-candidate KUBECONFIG NAMESPACE NAME COUNT IDENTITY LEASE_MS RENEW_MS RETRY_MS
//! ```
//!
//! Events: `started_leading` (`shard`, `fencing_token`) when it starts acting on a shard,
//! `stopped_leading` (`shard`) when it stops (the loss token fired), `held` (`count`,
//! `members`, `quota`) whenever the set it holds changes, `exit`, `error` (`message`); each with
//! `identity` and `mono_ns`. SIGTERM hands every shard back and exits 0. With `RUST_LOG` set,
//! logs go to stderr.

use std::{io::Write as _, process::ExitCode, time::Duration};

use kube::Client;
use kube_leader::{LeaseConfig, Shards};
use kube_leader_e2e::mono_ns;
use serde_json::{json, Value};
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

fn emit(mut v: Value) {
    v["mono_ns"] = json!(mono_ns());
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

const USAGE: &str =
    "usage: shard-candidate KUBECONFIG NAMESPACE NAME COUNT IDENTITY LEASE_MS RENEW_MS RETRY_MS";

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    kube_leader_e2e::init_process_tracing();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            emit(json!({"event": "error", "message": e.to_string()}));
            eprintln!("shard-candidate: {e}");
            ExitCode::from(1)
        }
    }
}

type Result<T, E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

async fn run(args: &[String]) -> Result<()> {
    let [kubeconfig, namespace, name, count, identity, lease_ms, renew_ms, retry_ms] = args else {
        return Err(USAGE.into());
    };
    let ms = |s: &str| -> Result<Duration> { Ok(Duration::from_millis(s.parse()?)) };
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    // As the library guide recommends for an election's client: kube-leader retries itself.
    config.default_retry = false;
    let client = Client::try_from(config)?;
    let shards = Shards::new(client, name, count.parse()?)
        .namespace(namespace)
        .identity(identity)
        .config(
            kube_leader::ShardsConfig::default().lease(
                LeaseConfig::default()
                    .lease_duration(ms(lease_ms)?)
                    .renew_deadline(ms(renew_ms)?)
                    .retry_period(ms(retry_ms)?),
            ),
        );
    let shutdown = CancellationToken::new();
    {
        let shutdown = shutdown.clone();
        let mut term = signal(SignalKind::terminate())?;
        tokio::spawn(async move {
            term.recv().await;
            shutdown.cancel();
        });
    }
    let mut assignments = shards.start(&shutdown)?;
    let mut held = assignments.held();
    let reporter = {
        let identity = identity.clone();
        tokio::spawn(async move {
            while held.changed().await.is_ok() {
                let set = held.borrow_and_update().clone();
                emit(
                    json!({"event": "held", "identity": identity, "count": set.held.len(),
                    "members": set.members, "quota": set.quota}),
                );
            }
        })
    };
    let mut running = futures::stream::FuturesUnordered::new();
    use futures::StreamExt;
    loop {
        tokio::select! {
            shard = assignments.next() => match shard {
                Some((index, shard)) => {
                    let (token, lost) = (shard.fencing_token(), shard.lost_token());
                    emit(json!({"event": "started_leading", "identity": identity, "shard": index,
                        "fencing_token": token}));
                    let identity = identity.clone();
                    running.push(async move {
                        lost.cancelled().await;
                        emit(json!({"event": "stopped_leading", "identity": identity, "shard": index}));
                        drop(shard);
                    });
                }
                None => break,
            },
            Some(()) = running.next(), if !running.is_empty() => {}
        }
    }
    while running.next().await.is_some() {}
    let result = assignments.finish().await;
    reporter.abort();
    emit(json!({"event": "exit", "identity": identity}));
    result.map_err(Into::into)
}
