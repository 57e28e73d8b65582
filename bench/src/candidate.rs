//! Candidate processes and their JSON events.
//!
//! Every candidate is a process of its own, started as `setpriv --pdeathsig KILL -- <binary>`
//! so that it cannot outlive this harness, however the harness ends. Each prints one JSON line
//! per event on stdout (`started_leading`, `stopped_leading`, `new_leader`, `exit`) stamped with
//! CLOCK_MONOTONIC (`mono_ns`); its stderr goes to a log file.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{bail, Context};
use nix::{sys::signal::Signal, unistd::Pid};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    process::{Child, ChildStdin, Command},
    sync::mpsc,
};

use crate::{clock::mono_ns, procfs::Memory};

/// Which implementation a Lease candidate process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub(crate) enum Impl {
    /// `lease-candidate` (crate kube-leader-e2e): the kube-leader library's `LeaseElector`, over
    /// kube's own client (HTTP/1.1).
    KubeLeader,
    /// `lease-candidate ... http2`: the same over `kube_leader::client::http2` (feature `http2`).
    KubeLeaderHttp2,
    /// `kube-leader-go-candidate`: client-go 0.37.2's `leaderelection` with a `LeaseLock`.
    ClientGo,
}

impl Impl {
    /// Every implementation, in the order of the tables.
    pub(crate) const ALL: [Impl; 3] = [Impl::KubeLeader, Impl::KubeLeaderHttp2, Impl::ClientGo];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Impl::KubeLeader => "kube-leader",
            Impl::KubeLeaderHttp2 => "kube-leader (HTTP/2)",
            Impl::ClientGo => "client-go",
        }
    }

    /// A short prefix for identities and lock names.
    pub(crate) fn tag(self) -> &'static str {
        match self {
            Impl::KubeLeader => "kl",
            Impl::KubeLeaderHttp2 => "kh",
            Impl::ClientGo => "go",
        }
    }
}

/// Lease timings, the same for both implementations in one scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timings {
    pub(crate) lease: Duration,
    pub(crate) renew: Duration,
    pub(crate) retry: Duration,
}

impl Timings {
    /// client-go's (and kube-leader's) defaults: 15 s / 10 s / 2 s.
    pub(crate) const DEFAULT: Timings = Timings {
        lease: Duration::from_secs(15),
        renew: Duration::from_secs(10),
        retry: Duration::from_secs(2),
    };

    /// Short timings for the CI-sized mode: 2 s / 1 s / 200 ms.
    pub(crate) const SHORT: Timings = Timings {
        lease: Duration::from_secs(2),
        renew: Duration::from_secs(1),
        retry: Duration::from_millis(200),
    };

    pub(crate) fn label(&self) -> String {
        let f = |d: Duration| {
            if d.subsec_millis() == 0 {
                format!("{}s", d.as_secs())
            } else {
                format!("{}ms", d.as_millis())
            }
        };
        format!("{}/{}/{}", f(self.lease), f(self.renew), f(self.retry))
    }
}

/// Where the programs the harness starts are.
#[derive(Debug, Clone)]
pub(crate) struct Binaries {
    pub(crate) lease_candidate: PathBuf,
    /// `shard-candidate` (crate kube-leader-e2e): one `Shards` candidate.
    pub(crate) shard_candidate: PathBuf,
    pub(crate) go_candidate: PathBuf,
    /// The `kube-leader` sidecar, if it could be built and answers `run --help`.
    pub(crate) sidecar: Option<PathBuf>,
    /// Why there is no sidecar, if there is none.
    pub(crate) sidecar_missing: Option<String>,
    /// This program, for its `swarm` subcommand.
    pub(crate) bench: PathBuf,
    /// The cargo profile of this program (and of the Rust candidates it built).
    pub(crate) profile: String,
    /// The cargo profile of the sidecar.
    pub(crate) sidecar_profile: String,
}

/// One event line of a candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    pub(crate) kind: String,
    pub(crate) identity: String,
    /// The leader named by a `new_leader` event (client-go).
    pub(crate) leader: Option<String>,
    /// The shard of a `shard-candidate`'s `started_leading` / `stopped_leading` event.
    pub(crate) shard: Option<u32>,
    /// The number of shards held, in a `shard-candidate`'s `held` event.
    pub(crate) count: Option<u64>,
    pub(crate) mono_ns: u64,
}

impl Event {
    pub(crate) fn is(&self, kind: &str) -> bool {
        self.kind == kind
    }
}

/// A running candidate process.
#[derive(Debug)]
pub(crate) struct Proc {
    pub(crate) user: String,
    pub(crate) pid: u32,
    child: Child,
    stdin: Option<ChildStdin>,
}

/// The candidate processes of one scenario, by identity, and the events they printed.
#[derive(Debug)]
pub(crate) struct Fleet {
    log_dir: PathBuf,
    procs: HashMap<String, Proc>,
    tx: mpsc::UnboundedSender<Event>,
    rx: mpsc::UnboundedReceiver<Event>,
    events: Vec<Event>,
}

// === impl Fleet ===

impl Fleet {
    /// An empty fleet whose processes log into `log_dir`.
    pub(crate) fn new(log_dir: &Path) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            log_dir: log_dir.to_owned(),
            procs: HashMap::new(),
            tx,
            rx,
            events: Vec::new(),
        }
    }

    /// Starts a Lease candidate of `imp` for `namespace/lease` as `identity`, authenticated as
    /// `user` through `kubeconfig`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn spawn_lease(
        &mut self,
        bins: &Binaries,
        imp: Impl,
        kubeconfig: &Path,
        namespace: &str,
        lease: &str,
        identity: &str,
        user: &str,
        t: Timings,
    ) -> anyhow::Result<()> {
        let ms = |d: Duration| d.as_millis().to_string();
        let mut command = match imp {
            Impl::KubeLeader | Impl::KubeLeaderHttp2 => {
                let mut c = guarded(&bins.lease_candidate);
                c.arg(kubeconfig).args([namespace, lease, identity]).args([
                    ms(t.lease),
                    ms(t.renew),
                    ms(t.retry),
                ]);
                if imp == Impl::KubeLeaderHttp2 {
                    c.arg("http2");
                }
                c
            }
            Impl::ClientGo => {
                let mut c = guarded(&bins.go_candidate);
                c.arg("--kubeconfig")
                    .arg(kubeconfig)
                    .args(["--namespace", namespace, "--lease", lease, "--identity", identity])
                    .arg(format!("--lease-duration={}ms", ms(t.lease)))
                    .arg(format!("--renew-deadline={}ms", ms(t.renew)))
                    .arg(format!("--retry-period={}ms", ms(t.retry)));
                c
            }
        };
        // KUBE_LEADER_BENCH_RUST_LOG: a finer log (a trace of one step) in the candidates' logs.
        let filter =
            std::env::var("KUBE_LEADER_BENCH_RUST_LOG").unwrap_or_else(|_| "kube_leader=info".into());
        command.env("RUST_LOG", filter);
        self.spawn(identity, user, command)
    }

    /// Starts `command` (made with [`guarded`]) as candidate `identity`.
    pub(crate) fn spawn(&mut self, identity: &str, user: &str, mut command: Command) -> anyhow::Result<()> {
        if self.procs.contains_key(identity) {
            bail!("a candidate {identity} already runs");
        }
        let log = self.log_dir.join(format!("{identity}.log"));
        let stderr = std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .process_group(0);
        let mut child = command
            .spawn()
            .with_context(|| format!("start candidate {identity}"))?;
        let pid = child.id().context("the candidate exited at once")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let stdin = child.stdin.take();
        let tx = self.tx.clone();
        let fallback = identity.to_owned();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(event) = parse_event(&line, &fallback) {
                    let _ = tx.send(event);
                }
            }
        });
        self.procs.insert(
            identity.to_owned(),
            Proc {
                user: user.to_owned(),
                pid,
                child,
                stdin,
            },
        );
        Ok(())
    }

    pub(crate) fn proc(&self, identity: &str) -> Option<&Proc> {
        self.procs.get(identity)
    }

    pub(crate) fn identities(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.procs.keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Moves newly printed events into the history.
    fn drain(&mut self) {
        while let Ok(e) = self.rx.try_recv() {
            self.events.push(e);
        }
    }

    /// Every event so far.
    pub(crate) fn events(&mut self) -> &[Event] {
        self.drain();
        &self.events
    }

    /// The first event stamped at or after `after_ns` that matches `want`, waiting up to
    /// `timeout` for it.
    pub(crate) async fn wait_for(
        &mut self,
        after_ns: u64,
        timeout: Duration,
        what: &str,
        want: impl Fn(&Event) -> bool,
    ) -> anyhow::Result<Event> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut checked = 0;
        loop {
            self.drain();
            if let Some(e) = self.events[checked..]
                .iter()
                .find(|e| e.mono_ns >= after_ns && want(e))
            {
                return Ok(e.clone());
            }
            checked = self.events.len();
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(e)) => self.events.push(e),
                Ok(None) => bail!("event channel closed while waiting for {what}"),
                Err(_) => bail!(
                    "timed out after {timeout:?} waiting for {what} (logs in {})",
                    self.log_dir.display()
                ),
            }
        }
    }

    /// Sends `signal` to candidate `identity`; returns when, just before sending.
    pub(crate) fn signal(&self, identity: &str, signal: Signal) -> anyhow::Result<u64> {
        let p = self
            .procs
            .get(identity)
            .with_context(|| format!("no candidate {identity}"))?;
        let pid = Pid::from_raw(i32::try_from(p.pid)?);
        let at = mono_ns();
        nix::sys::signal::kill(pid, signal).with_context(|| format!("send {signal} to {identity}"))?;
        Ok(at)
    }

    /// Writes a line to candidate `identity`'s stdin; returns when, just before writing.
    pub(crate) async fn tell(&mut self, identity: &str, line: &str) -> anyhow::Result<u64> {
        let p = self
            .procs
            .get_mut(identity)
            .with_context(|| format!("no candidate {identity}"))?;
        let stdin = p.stdin.as_mut().context("no stdin")?;
        let at = mono_ns();
        stdin.write_all(format!("{line}\n").as_bytes()).await?;
        stdin.flush().await?;
        Ok(at)
    }

    /// Waits up to `timeout` for candidate `identity` to exit (SIGKILL after that), and forgets it.
    pub(crate) async fn reap(&mut self, identity: &str, timeout: Duration) -> anyhow::Result<()> {
        let mut p = self
            .procs
            .remove(identity)
            .with_context(|| format!("no candidate {identity}"))?;
        drop(p.stdin.take());
        if tokio::time::timeout(timeout, p.child.wait()).await.is_err() {
            tracing::warn!(identity, ?timeout, "candidate did not exit in time; killing it");
            let _ = p.child.kill().await;
        }
        Ok(())
    }

    /// Memory of candidate `identity`, if it runs.
    pub(crate) fn memory(&self, identity: &str) -> Option<Memory> {
        Memory::of(self.procs.get(identity)?.pid)
    }

    /// Stops every candidate: SIGTERM, then SIGKILL after `grace`.
    pub(crate) async fn stop_all(&mut self, grace: Duration) {
        for identity in self.identities() {
            let _ = self.signal(&identity, Signal::SIGTERM);
        }
        for identity in self.identities() {
            let _ = self.reap(&identity, grace).await;
        }
    }
}

/// A command that runs `binary` under `setpriv --pdeathsig KILL`, so the kernel kills it
/// when this harness dies (the process keeps its pid: setpriv execs).
pub(crate) fn guarded(binary: &Path) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--pdeathsig", "KILL", "--"]).arg(binary);
    c
}

fn parse_event(line: &str, fallback_identity: &str) -> Option<Event> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    Some(Event {
        kind: v["event"].as_str()?.to_owned(),
        identity: v["identity"].as_str().unwrap_or(fallback_identity).to_owned(),
        leader: v["leader"].as_str().map(str::to_owned),
        shard: v["shard"].as_u64().and_then(|s| u32::try_from(s).ok()),
        count: v["count"].as_u64(),
        mono_ns: v["mono_ns"].as_u64()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_candidates_events() {
        let go = r#"{"event":"new_leader","identity":"a","leader":"b","mono_ns":123,"unix_ns":456}"#;
        let e = parse_event(go, "x").unwrap();
        assert_eq!(
            (
                e.kind.as_str(),
                e.identity.as_str(),
                e.leader.as_deref(),
                e.mono_ns
            ),
            ("new_leader", "a", Some("b"), 123)
        );
        let rust = r#"{"event":"started_leading","identity":"c","fencing_token":3,"mono_ns":9}"#;
        assert!(parse_event(rust, "x").unwrap().is("started_leading"));
        assert!(parse_event("klog noise", "x").is_none());
    }

    #[test]
    fn timing_labels() {
        assert_eq!(Timings::DEFAULT.label(), "15s/10s/2s");
        assert_eq!(Timings::SHORT.label(), "2s/1s/200ms");
    }
}
