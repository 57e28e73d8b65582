//! A candidate of the chaos runs: it writes its fencing token to the fenced ledger while it
//! leads, and reports what it does as JSON lines on stdout, with CLOCK_MONOTONIC nanoseconds.
//!
//! ```text
//! chaos-candidate lease KUBECONFIG NAMESPACE LOCK IDENTITY LEASE_MS RENEW_MS RETRY_MS WRITE_MS
//! chaos-candidate for-life KUBECONFIG NAMESPACE LOCK POD WRITE_MS
//! chaos-candidate child WRITE_MS
//! ```
//!
//! - `lease`: a library candidate that campaigns again after every loss; SIGTERM releases the
//!   lease and exits 0.
//! - `for-life`: a library candidate for the Pod `POD`; after a loss it exits 124 (as
//!   `kube-leader run` does, so that the harness restarts it like a container); SIGTERM steps
//!   down (deletes the lock) and exits 0.
//! - `child`: the COMMAND of `kube-leader run`: it leads from its start until SIGTERM, with the
//!   `KUBE_LEADER_*` environment and the `KUBECONFIG` it inherits; after SIGUSR1 it ignores
//!   SIGTERM (only SIGKILL stops it).
//!
//! Events: `started_leading` (`fencing_token`, `pid`), `ledger_write_started` (`start_ns`),
//! `ledger_write` (`start_ns`, `outcome`, `stored`), `stopped_leading`, `exit`, `error`
//! (`message`), and (`lease`, `for-life`) `step` (`kind`, `step`: a decision step of the
//! library, its `kube_leader::step` events, for trace checking); each with `identity` and `mono_ns`. A write that has started when leadership ends is finished and reported: it was
//! made while leading, and the fencing check decides its fate. With `RUST_LOG` set, logs go to
//! stderr.

use std::{io::Write as _, process::ExitCode, time::Duration};

use kube::Client;
use kube_leader::internal::trace::{step_of, STEP_TARGET};
use kube_leader::internal::ForLifeExt as _;
use kube_leader::{internal::Environment, ForLife, LeaseElector};
use kube_leader_e2e::{
    chaos::{Ledger, Outcome},
    mono_ns,
};
use serde_json::{json, Value};
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::{filter::filter_fn, layer::SubscriberExt as _, Layer};

/// Bound on each ledger call.
const LEDGER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a finished term waits for its last write to be answered.
const LAST_WRITE: Duration = Duration::from_secs(12);

fn emit(mut v: Value) {
    v["mono_ns"] = json!(mono_ns());
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

const USAGE: &str =
    "usage: chaos-candidate lease KUBECONFIG NAMESPACE LOCK IDENTITY LEASE_MS RENEW_MS RETRY_MS WRITE_MS\n\
                     \x20      chaos-candidate for-life KUBECONFIG NAMESPACE LOCK POD WRITE_MS\n\
                     \x20      chaos-candidate child WRITE_MS";

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match (args.first().map(String::as_str), args.get(4)) {
        (Some("lease" | "for-life"), Some(identity)) => init_tracing_with_steps(identity),
        _ => kube_leader_e2e::init_process_tracing(),
    }
    let result = match args.first().map(String::as_str) {
        Some("lease") => lease(&args[1..]).await,
        Some("for-life") => for_life(&args[1..]).await,
        Some("child") => child(&args[1..]).await,
        _ => Err(USAGE.into()),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            emit(json!({"event": "error", "message": e.to_string()}));
            eprintln!("chaos-candidate: {e}");
            ExitCode::from(1)
        }
    }
}

type Result<T, E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

/// Logs as [`kube_leader_e2e::init_process_tracing`] does, and reports the library's decision
/// steps (`kube_leader::step` events) as `step` events.
fn init_tracing_with_steps(identity: &str) {
    let steps = Steps(identity.to_string()).with_filter(filter_fn(|m| m.target() == STEP_TARGET));
    let logs = std::env::var_os("RUST_LOG").map(|_| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .with_filter(tracing_subscriber::EnvFilter::from_default_env())
    });
    let subscriber = tracing_subscriber::registry().with(steps).with(logs);
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// The layer that reports decision steps, for the candidate `.0`.
struct Steps(String);

impl<S: tracing::Subscriber> Layer<S> for Steps {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if let Some(step) = step_of(event) {
            emit(json!({"event": "step", "identity": self.0, "kind": step["kind"], "step": step["step"]}));
        }
    }
}

fn ms(s: &str) -> Result<Duration> {
    Ok(Duration::from_millis(s.parse()?))
}

async fn client(kubeconfig: &str) -> Result<Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    Ok(Client::try_from(config)?)
}

/// A token cancelled on SIGTERM.
fn on_sigterm() -> Result<CancellationToken> {
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let t = token.clone();
    tokio::spawn(async move {
        term.recv().await;
        t.cancel();
    });
    Ok(token)
}

/// A token cancelled on SIGTERM, until SIGUSR1 makes the process deaf to SIGTERM (the chaos
/// run's `deaf-command` fault: a COMMAND that only SIGKILL stops).
fn on_sigterm_unless_deaf() -> Result<CancellationToken> {
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut usr1 = signal(SignalKind::user_defined1())?;
    let t = token.clone();
    tokio::spawn(async move {
        let mut deaf = false;
        loop {
            tokio::select! {
                Some(()) = usr1.recv() => deaf = true,
                Some(()) = term.recv() => {
                    if !deaf {
                        t.cancel();
                        return;
                    }
                }
            }
        }
    });
    Ok(token)
}

async fn lease(args: &[String]) -> Result<u8> {
    let [kubeconfig, namespace, lock, identity, lease_ms, renew_ms, retry_ms, write_ms] = args else {
        return Err(USAGE.into());
    };
    let client = client(kubeconfig).await?;
    let ledger = Ledger::new(client.clone(), namespace, LEDGER_TIMEOUT);
    let write_every = ms(write_ms)?;
    let elector = LeaseElector::new(client, lock)
        .namespace(namespace)
        .identity(identity)
        .config(
            kube_leader::LeaseConfig::default()
                .lease_duration(ms(lease_ms)?)
                .renew_deadline(ms(renew_ms)?)
                .retry_period(ms(retry_ms)?),
        );
    let shutdown = on_sigterm()?;
    elector
        .run(&shutdown, |term, lost| {
            lead(
                ledger.clone(),
                identity.clone(),
                term.fencing_token,
                write_every,
                lost,
            )
        })
        .await?;
    emit(json!({"event": "exit", "identity": identity}));
    Ok(0)
}

async fn for_life(args: &[String]) -> Result<u8> {
    let [kubeconfig, namespace, lock, pod, write_ms] = args else {
        return Err(USAGE.into());
    };
    let client = client(kubeconfig).await?;
    let ledger = Ledger::new(client.clone(), namespace, LEDGER_TIMEOUT);
    let elector = ForLife::new(client, lock)
        .namespace(namespace)
        .identity(pod)
        .environment(Environment::default())
        .config(
            kube_leader::ForLifeConfig::default()
                .backoff_cap(Duration::from_secs(2))
                .api_timeout(Duration::from_secs(5)),
        );
    let shutdown = on_sigterm()?;
    let leadership = match elector.become_leader(&shutdown).await {
        Ok(l) => l,
        Err(kube_leader::Error::Cancelled { .. }) => {
            emit(json!({"event": "exit", "identity": pod}));
            return Ok(0);
        }
        Err(e) => return Err(e.into()),
    };
    lead(
        ledger,
        pod.clone(),
        leadership.fencing_token(),
        ms(write_ms)?,
        leadership.lost_token(),
    )
    .await;
    // The work has stopped (asked to stop, or lost): step down, so that another candidate takes
    // over at once. After a loss the release is this leader's word that its work stopped, which
    // a candidate waiting on a lock deleted under it needs (leader for life, Safety IV).
    let code = if shutdown.is_cancelled() { 0 } else { 124 };
    if let Err(e) = leadership.release().await {
        emit(json!({"event": "error", "identity": pod, "message": format!("release: {e}")}));
    }
    emit(json!({"event": "exit", "identity": pod}));
    Ok(code)
}

async fn child(args: &[String]) -> Result<u8> {
    let [write_ms] = args else {
        return Err(USAGE.into());
    };
    let var = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
    let identity = var("KUBE_LEADER_IDENTITY")?;
    let namespace = var("KUBE_LEADER_NAMESPACE")?;
    let token: u64 = var("KUBE_LEADER_FENCING_TOKEN")?.parse()?;
    let stop = on_sigterm_unless_deaf()?;
    let client = Client::try_default().await?;
    let ledger = Ledger::new(client, &namespace, LEDGER_TIMEOUT);
    lead(ledger, identity.clone(), token, ms(write_ms)?, stop).await;
    emit(json!({"event": "exit", "identity": identity}));
    Ok(0)
}

/// Leads until `lost`: reports the term and writes the token to the ledger every `every`.
async fn lead(ledger: Ledger, identity: String, token: u64, every: Duration, lost: CancellationToken) {
    emit(
        json!({"event": "started_leading", "identity": identity, "fencing_token": token,
        "pid": std::process::id()}),
    );
    let writer = {
        let (identity, lost) = (identity.clone(), lost.clone());
        tokio::spawn(async move {
            loop {
                // No new write once leadership is known to be lost.
                if lost.is_cancelled() {
                    return;
                }
                let start = mono_ns();
                emit(json!({"event": "ledger_write_started", "identity": identity,
                    "fencing_token": token, "start_ns": start}));
                let outcome = ledger.write(&identity, token).await;
                let mut event = json!({"event": "ledger_write", "identity": identity,
                    "fencing_token": token, "start_ns": start, "outcome": outcome.name()});
                match outcome {
                    Outcome::Accepted { previous } => event["previous"] = json!(previous),
                    Outcome::Rejected { stored } => event["stored"] = json!(stored),
                    Outcome::Unreached(e) | Outcome::Unknown(e) => event["error"] = json!(e),
                }
                emit(event);
                tokio::select! {
                    biased;
                    () = lost.cancelled() => return,
                    () = tokio::time::sleep(every) => {}
                }
            }
        })
    };
    lost.cancelled().await;
    emit(json!({"event": "stopped_leading", "identity": identity}));
    let _ = tokio::time::timeout(LAST_WRITE, writer).await;
}
