//! `kube-leader-bench swarm`: many kube-leader Lease candidates in one process, for the scale
//! scenarios. Not for people: the benchmark starts it.
//!
//! Candidates share clients, one per `--per-client` candidates (kube's client speaks HTTP/1.1, so
//! each candidate's watch holds one connection of its client's pool). With `--locks one` all
//! campaign for one Lease; with `--locks each` each holds a Lease of its own. Events are JSON
//! lines on stdout with CLOCK_MONOTONIC `mono_ns`: `campaigning` (once, just before the
//! candidates start), `started_leading` and `stopped_leading` (with the candidate's identity).
//! Commands on stdin: `step-down` makes the current leader release (it campaigns again);
//! `quit` or the end of stdin, like SIGTERM, stops every candidate (releasing the Leases held).
//! With `--pods FILE` (a JSON object of Pod name → UID, Pods `s-<i>` the benchmark created) each
//! candidate is told its Pod, as in a cluster: its registration is then bound to the Pod.

use std::{
    io::Write,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context;
use kube::{config::Kubeconfig, Client, Config};
use kube_leader::LeaseElector;
use tokio::{io::AsyncBufReadExt, task::JoinSet};
use tokio_util::sync::CancellationToken;

use crate::clock::mono_ns;

/// Which Leases the candidates campaign for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Locks {
    /// All for one Lease, `swarm`.
    One,
    /// Each for its own Lease, `swarm-<i>`.
    Each,
}

/// The `swarm` subcommand's arguments.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct SwarmArgs {
    /// Namespace of the Leases.
    #[arg(long)]
    pub(crate) namespace: String,
    /// Kubeconfigs of the API users; client `i` uses the `i mod n`-th.
    #[arg(long = "kubeconfig", required = true)]
    pub(crate) kubeconfigs: Vec<PathBuf>,
    /// How many candidates.
    #[arg(long)]
    pub(crate) candidates: usize,
    /// Candidates per client.
    #[arg(long, default_value_t = 50)]
    pub(crate) per_client: usize,
    #[arg(long, value_enum)]
    pub(crate) locks: Locks,
    #[arg(long)]
    pub(crate) lease_ms: u64,
    #[arg(long)]
    pub(crate) renew_ms: u64,
    #[arg(long)]
    pub(crate) retry_ms: u64,
    /// Pod name → UID (JSON): candidate `s-<i>` is Pod `s-<i>`.
    #[arg(long)]
    pub(crate) pods: Option<PathBuf>,
}

fn emit(v: serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// Runs the swarm until told to stop.
pub(crate) async fn run(args: SwarmArgs) -> anyhow::Result<()> {
    let clients_needed = args.candidates.div_ceil(args.per_client.max(1));
    let mut clients = Vec::with_capacity(clients_needed);
    for i in 0..clients_needed {
        let path = &args.kubeconfigs[i % args.kubeconfigs.len()];
        let kubeconfig = Kubeconfig::read_from(path).with_context(|| format!("read {}", path.display()))?;
        let config = Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
        clients.push(Client::try_from(config)?);
    }
    let pods: std::collections::HashMap<String, String> = match &args.pods {
        Some(path) => {
            serde_json::from_slice(&std::fs::read(path).with_context(|| format!("read {}", path.display()))?)
                .with_context(|| format!("parse {}", path.display()))?
        }
        None => Default::default(),
    };
    let shutdown = CancellationToken::new();
    let step_down: Arc<Mutex<Option<CancellationToken>>> = Arc::default();
    let mut tasks = JoinSet::new();
    emit(serde_json::json!({"event": "campaigning", "identity": "swarm", "mono_ns": mono_ns()}));
    for i in 0..args.candidates {
        let lock = match args.locks {
            Locks::One => "swarm".to_owned(),
            Locks::Each => format!("swarm-{i}"),
        };
        let identity = format!("s-{i}");
        let elector = LeaseElector::new(clients[i / args.per_client.max(1)].clone(), lock)
            .namespace(args.namespace.clone())
            .identity(identity.clone())
            .config(
                kube_leader::LeaseConfig::default()
                    .lease_duration(Duration::from_millis(args.lease_ms))
                    .renew_deadline(Duration::from_millis(args.renew_ms))
                    .retry_period(Duration::from_millis(args.retry_ms)),
            );
        let elector = match pods.get(&identity) {
            Some(uid) => elector.candidate_pod(kube_leader::CandidatePod::new(identity.clone(), uid.clone())),
            None => elector,
        };
        let (shutdown, step_down) = (shutdown.clone(), step_down.clone());
        tasks.spawn(async move {
            let result = elector
                .run(&shutdown, |term, lost| {
                    let (identity, step_down) = (identity.clone(), step_down.clone());
                    async move {
                        let mine = CancellationToken::new();
                        *step_down.lock().unwrap_or_else(|p| p.into_inner()) = Some(mine.clone());
                        emit(
                            serde_json::json!({"event": "started_leading", "identity": identity,
                            "fencing_token": term.fencing_token, "mono_ns": mono_ns()}),
                        );
                        tokio::select! {
                            () = lost.cancelled() => {}
                            () = mine.cancelled() => {}
                        }
                        emit(
                            serde_json::json!({"event": "stopped_leading", "identity": identity,
                            "mono_ns": mono_ns()}),
                        );
                    }
                })
                .await;
            if let Err(e) = result {
                eprintln!("swarm candidate failed: {e}");
            }
        });
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    loop {
        tokio::select! {
            _ = term.recv() => break,
            line = stdin.next_line() => match line {
                Ok(Some(l)) if l.trim() == "step-down" => {
                    if let Some(t) = step_down.lock().unwrap_or_else(|p| p.into_inner()).take() {
                        t.cancel();
                    }
                }
                Ok(Some(l)) if l.trim() == "quit" => break,
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            },
        }
    }
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    emit(serde_json::json!({"event": "exit", "identity": "swarm", "mono_ns": mono_ns()}));
    Ok(())
}
