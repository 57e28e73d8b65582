//! A candidate of the fenced chaos run (`tests/fence_chaos.rs`): while it leads it keeps
//! writing fenced objects at a steady rate, and reports every write as a JSON line on stdout.
//!
//! ```text
//! fence-candidate lease KUBECONFIG NAMESPACE LOCK IDENTITY LEASE_MS RENEW_MS RETRY_MS WRITE_MS USER OBJECTS
//! fence-candidate child WRITE_MS OBJECTS
//! ```
//!
//! - `lease`: a library candidate; each term writes through `Leadership::fenced_client` (its
//!   requests impersonate `USER` with the term's token and stamp the objects). It campaigns
//!   again after every loss; SIGTERM stops its writes, releases the lease and exits 0.
//! - `child`: the COMMAND of `kube-leader run --fence`: it writes through the kubeconfig it
//!   inherits (`KUBECONFIG`: the loopback proxy that adds the token and stamps), with the
//!   token of `KUBE_LEADER_FENCING_TOKEN`, until SIGTERM.
//!
//! Every `WRITE_MS` a tick merge-patches, all at once, the objects `fenced-<i>` (fenced by the
//! enforcing rule), `audit-<i>` (its twin under the audit-only rule) and `plain-<i>` (fenced by
//! no rule: the pair for the latency figure), with `i` = tick mod `OBJECTS`. Events, each with
//! `identity`, `token` and `mono_ns`: `term` (`pid`), and `write` (`side`: fenced, audit or
//! plain; `object`, `tick`, `start_ns`, `end_ns`, `end_unix_us`, `outcome`: ok, refused (a 403),
//! error or timeout; `rv` and `stamp` of the stored object when ok; `code` and `message`
//! otherwise). A library candidate issues no write once it knows it lost, but finishes those in
//! flight: a paused or partitioned leader's late writes are what the fence must refuse.

use std::{
    io::Write as _,
    process::ExitCode,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{Patch, PatchParams},
    Api, Client,
};
use kube_leader::{internal::fence::FENCED_TOKEN_ANNOTATION, LeaseElector};
use kube_leader_e2e::mono_ns;
use serde_json::{json, Value};
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

/// Bound on each write.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

const USAGE: &str = "usage: fence-candidate lease KUBECONFIG NAMESPACE LOCK IDENTITY LEASE_MS RENEW_MS \
                     RETRY_MS WRITE_MS USER OBJECTS\n       fence-candidate child WRITE_MS OBJECTS";

type Result<T, E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

fn emit(mut v: Value) {
    v["mono_ns"] = json!(mono_ns());
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("lease") => lease(&args[1..]).await,
        Some("child") => child(&args[1..]).await,
        _ => Err(USAGE.into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            emit(json!({"event": "error", "message": e.to_string()}));
            eprintln!("fence-candidate: {e}");
            ExitCode::from(1)
        }
    }
}

fn ms(s: &str) -> Result<Duration> {
    Ok(Duration::from_millis(s.parse()?))
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

async fn lease(args: &[String]) -> Result<()> {
    let [kubeconfig, namespace, lock, identity, lease_ms, renew_ms, retry_ms, write_ms, user, objects] = args
    else {
        return Err(USAGE.into());
    };
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    let client = Client::try_from(config)?;
    let elector = LeaseElector::new(client.clone(), lock)
        .namespace(namespace)
        .identity(identity)
        .config(
            kube_leader::LeaseConfig::default()
                .lease_duration(ms(lease_ms)?)
                .renew_deadline(ms(renew_ms)?)
                .retry_period(ms(retry_ms)?),
        );
    let shutdown = on_sigterm()?;
    let writer = Writer {
        identity: identity.clone(),
        namespace: namespace.clone(),
        every: ms(write_ms)?,
        objects: objects.parse()?,
    };
    loop {
        let leadership = match elector.become_leader(&shutdown).await {
            Ok(l) => l,
            Err(kube_leader::Error::Cancelled { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let fenced = leadership.fenced_client(client.clone(), user.clone())?;
        // Lost, or asked to stop: no new write; those in flight are finished.
        let stop = CancellationToken::new();
        let (lost, s) = (leadership.lost_token(), stop.clone());
        let shutdown_ = shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = lost.cancelled() => {}
                () = shutdown_.cancelled() => {}
            }
            s.cancel();
        });
        writer.run(&fenced, leadership.fencing_token(), &stop).await;
        if shutdown.is_cancelled() {
            leadership.release().await?;
            return Ok(());
        }
    }
}

async fn child(args: &[String]) -> Result<()> {
    let [write_ms, objects] = args else {
        return Err(USAGE.into());
    };
    let var = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
    let writer = Writer {
        identity: var("KUBE_LEADER_IDENTITY")?,
        namespace: var("KUBE_LEADER_NAMESPACE")?,
        every: ms(write_ms)?,
        objects: objects.parse()?,
    };
    let token: u64 = var("KUBE_LEADER_FENCING_TOKEN")?.parse()?;
    let stop = on_sigterm()?;
    // The proxy's kubeconfig: it carries the token and stamps the patches.
    let client = Client::try_default().await?;
    writer.run(&client, token, &stop).await;
    Ok(())
}

/// What a term writes, and how often.
struct Writer {
    identity: String,
    namespace: String,
    every: Duration,
    objects: usize,
}

impl Writer {
    /// Writes a tick every `every` until `stop`; the tick in flight is finished.
    async fn run(&self, client: &Client, token: u64, stop: &CancellationToken) {
        emit(json!({"event": "term", "identity": self.identity, "token": token,
            "pid": std::process::id()}));
        let api = Api::<ConfigMap>::namespaced(client.clone(), &self.namespace);
        let mut ticks = tokio::time::interval(self.every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for tick in 0usize.. {
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                _ = ticks.tick() => {}
            }
            if stop.is_cancelled() {
                return;
            }
            let i = tick % self.objects;
            let write = |side: &'static str| self.write(&api, side, i, tick, token);
            tokio::join!(write("fenced"), write("audit"), write("plain"));
        }
    }

    /// One merge patch of `<side>-<i>`, reported.
    async fn write(&self, api: &Api<ConfigMap>, side: &'static str, i: usize, tick: usize, token: u64) {
        let object = format!("{side}-{i}");
        let patch = Patch::Merge(json!({"data": {"v": format!("{}-{tick}", self.identity)}}));
        let start = mono_ns();
        let result =
            tokio::time::timeout(WRITE_TIMEOUT, api.patch(&object, &PatchParams::default(), &patch)).await;
        let end = mono_ns();
        let unix_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros());
        let mut event = json!({"event": "write", "identity": self.identity, "token": token,
            "side": side, "object": object, "tick": tick, "start_ns": start, "end_ns": end,
            "end_unix_us": unix_us});
        match result {
            Ok(Ok(cm)) => {
                event["outcome"] = json!("ok");
                event["rv"] = json!(cm.metadata.resource_version);
                event["stamp"] = json!(cm
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(FENCED_TOKEN_ANNOTATION)));
            }
            Ok(Err(kube::Error::Api(s))) => {
                event["outcome"] = json!(if s.code == 403 { "refused" } else { "error" });
                event["code"] = json!(s.code);
                event["message"] = json!(s.message);
            }
            Ok(Err(e)) => {
                event["outcome"] = json!("error");
                event["message"] = json!(e.to_string());
            }
            Err(_) => event["outcome"] = json!("timeout"),
        }
        emit(event);
    }
}
