//! `kube-leader run`: campaign, run COMMAND while leading, stop it when leadership ends.

use std::{sync::Arc, time::Duration};

use anyhow::anyhow;
use kube::Client;
use kube_leader::{lease::Renewals, lock, LeaderInfo, Leadership, LockRef};
use nix::unistd::Pid;
use tokio::{
    signal::unix::{signal, Signal, SignalKind},
    sync::watch,
    time::{Instant, MissedTickBehavior},
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{
    cli::{LogFormat, RunArgs, StrategyArg},
    elector::Elector,
    exit::{self, Fail, OrExit},
    label::PodLabel,
    metrics::secs,
    server,
    state::Status,
    supervisor::{self, Report, Supervisor},
};

/// `kube-leader run`: returns the exit code.
pub(crate) async fn run(args: RunArgs, log_format: LogFormat) -> Result<u8, Fail> {
    if let Some(count) = args.shards {
        return crate::shards::run(args.clone(), count, args.shards_signal).await;
    }
    // Before anything else, so that a signal during start-up is not lost.
    let mut signals = Signals::new().or_exit(1)?;
    // Orphans of COMMAND (and COMMAND itself, should its supervisor die) come to us, not init.
    supervisor::become_subreaper();
    tokio::spawn(supervisor::reap_orphans());
    let client = connect(args.connect_timeout).await?;
    let namespace = resolve_namespace(args.lock.namespace.as_deref(), &client);
    let lock = LockRef::new(namespace, args.lock.lock.clone()).or_exit(exit::USAGE)?;
    let identity = resolve_identity(args.identity.as_deref()).ok_or_else(|| {
        Fail::new(
            exit::USAGE,
            anyhow!("no identity: set --identity, or POD_NAME, or a host name"),
        )
    })?;
    let elector = Elector::new(client.clone(), &args, &lock, &identity);
    // The watchdog flags a leader that has not renewed for twice the lease duration.
    let status = Arc::new(Status::new(
        lock.clone(),
        identity.clone(),
        args.lock.strategy,
        args.ready_only_when_leader,
        elector.clone(),
        args.lease_duration,
    ));
    if let Some(addr) = args.status_addr {
        let (listener, _) = server::bind(addr).await.map_err(|e| {
            Fail::new(
                exit::USAGE,
                anyhow!(e).context(format!("cannot listen on --status-addr {addr}")),
            )
        })?;
        tokio::spawn(server::serve(listener, status.clone()));
    }
    // The Lease candidate publishes what its own watch sees; leader for life needs a watch.
    let leader = elector.observe(&client, &lock);
    tokio::spawn(observe(leader, status.clone()));
    let label = args.label_pod.then(|| {
        PodLabel::new(
            client.clone(),
            &lock.namespace,
            lock::pod_name_from_env().unwrap_or(identity.clone()),
        )
    });
    if let Some(label) = &label {
        label.set(false);
    }

    // The supervisor, and COMMAND's process, get ready while this candidate follows: winning
    // then costs one message and COMMAND's exec.
    let standby = match Supervisor::spawn(&args.command, args.grace(), log_format) {
        Ok(s) => Some(s),
        Err(e) => {
            warn!(error = %format!("{e:#}"), "cannot start the supervisor in advance");
            None
        }
    };
    info!(lock = %lock, identity = %identity, strategy = args.lock.strategy.as_str(),
        grace = %humantime::format_duration(args.grace()), "campaigning");
    let started = Instant::now();
    let cancel = CancellationToken::new();
    let campaign = elector.become_leader(&cancel);
    tokio::pin!(campaign);
    let mut stop_requested = false;
    let result = loop {
        tokio::select! {
            biased;
            r = &mut campaign => break r,
            kind = signals.recv(), if !stop_requested => {
                if is_stop(kind) {
                    info!(lock = %lock, identity = %identity, signal = kind.as_raw_value(), "stopping before leading");
                    stop_requested = true;
                    cancel.cancel();
                }
            }
        }
    };
    let leadership = match result {
        Ok(l) => l,
        Err(kube_leader::Error::Cancelled { .. }) => return Ok(0),
        Err(e) => return Err(Fail::new(exit::for_error(&e), e)),
    };
    if stop_requested {
        // Won the race with the signal: step down at once.
        let _ = tokio::time::timeout(args.renew_deadline, leadership.release()).await;
        return Ok(0);
    }
    status.metrics.acquire.observe(secs(started.elapsed()));
    if leadership.is_skipped() {
        warn!(lock = %lock, identity = %identity,
            "not running in a cluster: skipping the election and running COMMAND in every replica \
             that finds no namespace (--on-outside-cluster skip); set --namespace or POD_NAMESPACE \
             to elect one leader");
    }
    status.lead(leadership.fencing_token(), leadership.acquired_at());
    if let Some(label) = &label {
        label.set(true);
    }

    let leading = Leading {
        args: &args,
        log_format,
        status: &status,
        label: label.as_ref(),
    };
    let code = leading
        .run(leadership, standby, elector.renewals(), &mut signals)
        .await;
    if let Some(label) = &label {
        label.set(false);
        label.settle(Duration::from_secs(10)).await;
    }
    Ok(code)
}

/// The leader's loop, from starting COMMAND until it has exited.
struct Leading<'a> {
    args: &'a RunArgs,
    log_format: LogFormat,
    status: &'a Status,
    label: Option<&'a PodLabel>,
}

/// How kube-leader steps down once COMMAND is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StepDown {
    /// Release the lock: another candidate takes over at once.
    Release,
    /// Keep the lock as it is: it expires (a lease), or stays with the Pod (leader for life).
    Keep,
    /// COMMAND's end is not known to be orderly (its supervisor died): neither release nor
    /// touch anything; the lease runs out as if this process had crashed.
    Abandon,
    /// Leadership was lost because this candidate's own Pod is ending (leader for life):
    /// delete the lock anyway (UID precondition: never a newer lock), since COMMAND has stopped
    /// and the lock goes with the Pod.
    ReleaseOwnPodEnding,
}

impl Leading<'_> {
    async fn run(
        self,
        leadership: Leadership,
        standby: Option<Supervisor>,
        renewals: Option<watch::Receiver<Renewals>>,
        signals: &mut Signals,
    ) -> u8 {
        let lock = &self.status.lock;
        let token = leadership.fencing_token();
        let env = [
            ("KUBE_LEADER_IDENTITY", self.status.identity.clone()),
            ("KUBE_LEADER_LOCK", lock.name.clone()),
            ("KUBE_LEADER_NAMESPACE", lock.namespace.clone()),
            ("KUBE_LEADER_FENCING_TOKEN", token.to_string()),
        ];
        let ready = standby.and_then(|mut s| (!s.process.has_exited()).then_some(s));
        let supervisor = match ready {
            Some(s) => Ok(s),
            None => Supervisor::spawn(&self.args.command, self.args.grace(), self.log_format),
        };
        let Supervisor {
            mut process,
            control: mut sup,
        } = match supervisor {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %format!("{e:#}"), "cannot start the supervisor");
                self.step_down(leadership, StepDown::Keep).await;
                return 1;
            }
        };
        let deadline = self.args.renew_deadline;
        // Lease: leadership is confirmed for the renew deadline counted from when the acquiring
        // write, then each successful renewal, was sent (the library's fail-stop rule, on the
        // same monotonic clock), never from "now": time spent since (a slow answer, a pause)
        // is not given again. Leader for life: liveness pings from this loop.
        let lease = renewals.is_some() && !leadership.is_skipped();
        let (mut renewals, mut seen) = match renewals {
            Some(r) => {
                let seen = r.borrow().clone();
                (r, seen)
            }
            None => (watch::channel(Renewals::default()).1, Renewals::default()),
        };
        let first = match (lease, seen.leading, seen.last_success) {
            (true, true, Some(sent)) => sent + deadline,
            // The lease handle says it leads, but no renewal is known: nothing is confirmed.
            (true, _, _) => Instant::now(),
            (false, _, _) => Instant::now() + deadline,
        };
        sup.start(first, &env).await;
        let mut ping = tokio::time::interval(self.args.retry_period);
        ping.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut watching = lease;
        let mut lost = false;
        let mut stop_signal = false;
        let mut command_pid: Option<u32> = None;
        // Whether the supervisor said its last word (`exited`): COMMAND ended in order.
        let mut orderly = false;

        let code = loop {
            tokio::select! {
                biased;
                code = process.wait() => break code,
                reason = leadership.lost(), if !lost => {
                    lost = true;
                    self.status.lose(token, &reason.to_string(), false);
                    sup.stop().await;
                    if let Some(label) = self.label {
                        label.set(false);
                    }
                }
                report = sup.report() => match report {
                    Report::Started(pid) => {
                        command_pid = Some(pid);
                        info!(lock = %lock, pid, "started COMMAND");
                    }
                    Report::Expired(since) => {
                        if !lost {
                            lost = true;
                            self.status.lose(token, &format!(
                                "the supervisor stopped COMMAND: leadership not confirmed for {}",
                                humantime::format_duration(Duration::from_millis(u64::try_from(since.as_millis()).unwrap_or(u64::MAX)))
                            ), false);
                        }
                    }
                    Report::Failed(code) => debug!(code, "COMMAND could not be started"),
                    // COMMAND and what it left are gone: step down now, without waiting for
                    // the supervisor's own exit.
                    Report::Exited(code) => {
                        orderly = true;
                        break code;
                    }
                },
                kind = signals.recv() => {
                    info!(lock = %lock, signal = kind.as_raw_value(), "forwarding signal to COMMAND");
                    stop_signal |= is_stop(kind);
                    sup.signal(kind.as_raw_value()).await;
                }
                changed = renewals.changed(), if watching => {
                    if changed.is_err() {
                        watching = false;
                        continue;
                    }
                    let now = renewals.borrow_and_update().clone();
                    if now.successes > seen.successes {
                        if let Some(latency) = now.last_latency {
                            self.status.metrics.renew.observe(secs(latency));
                        }
                    }
                    if now.failures > seen.failures {
                        self.status.metrics.renew_failures.inc_by(now.failures - seen.failures);
                    }
                    if let (true, false, Some(sent)) = (now.leading, lost, now.last_success) {
                        sup.confirm_until(sent + deadline).await;
                    }
                    seen = now;
                }
                _ = ping.tick(), if !lease => {
                    // No renewals to wait for: heartbeats say that kube-leader's loop runs and
                    // the strategy has not reported a loss.
                    if !lost {
                        sup.confirm_until(Instant::now() + deadline).await;
                    }
                }
            }
        };

        // The supervisor exited without its last word having been read: what it said last (a
        // loss that came together with the exit: kube-leader was frozen while the supervisor
        // stopped COMMAND), and whether it ended in order. Its side of the socket is closed, the
        // rest is buffered.
        if !orderly {
            let drain = async {
                while let Some(report) = sup.next_report().await {
                    match report {
                        Report::Expired(_) if !lost => {
                            lost = true;
                            self.status.lose(
                                token,
                                "the supervisor stopped COMMAND: leadership not confirmed in time",
                                false,
                            );
                        }
                        Report::Started(pid) => command_pid = Some(pid),
                        Report::Exited(_) => orderly = true,
                        _ => {}
                    }
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
        }
        if !orderly {
            // Killed, or crashed: COMMAND (which dies with it) and what it left may still be
            // going away. Kill its group and wait for it; then nothing is released, as if this
            // process had crashed: only the lease's expiry can tell that COMMAND is gone.
            warn!(lock = %lock, code, command_pid,
                "the supervisor died unexpectedly; killing COMMAND's process group, not releasing the lock");
            if let Some(pid) = command_pid {
                let group = Pid::from_raw(i32::try_from(pid).unwrap_or(0));
                if !supervisor::kill_group_and_wait(group, Duration::from_secs(2)).await {
                    warn!(lock = %lock, pgid = pid, "COMMAND's process group would not die");
                }
            }
            self.status.lose(token, "the supervisor died unexpectedly", false);
            self.step_down(leadership, StepDown::Abandon).await;
            return exit::LOST;
        }
        if let (Some(reason), false) = (leadership.loss_reason(), lost) {
            lost = true;
            self.status.lose(token, &reason.to_string(), false);
        }
        if lost {
            info!(lock = %lock, code, "COMMAND stopped after the loss of leadership");
            // A leader for life whose own Pod is ending (deleted, evicted) deletes its lock now
            // that COMMAND has stopped (UID precondition: never a newer lock). The lock goes with
            // the Pod anyway, and the successor need not wait until the Pod object is gone: on a
            // real node that takes seconds after `kubectl delete pod` (the kubelet stops every
            // container first). The leader usually sees its Pod's deletion before the kubelet's
            // SIGTERM reaches it, so this is the common path of a deletion, not the signal's.
            let how = if matches!(
                leadership.loss_reason(),
                Some(kube_leader::LossReason::PodEnding { .. })
            ) {
                StepDown::ReleaseOwnPodEnding
            } else {
                StepDown::Keep
            };
            self.step_down(leadership, how).await;
            return exit::LOST;
        }
        info!(lock = %lock, code, "COMMAND exited");
        self.status.lose(token, "COMMAND exited", true);
        // A lease is always released; a leader-for-life lock only when asked to stop (the Pod is
        // going away), since a restarted kube-leader in the same Pod continues on it.
        let release = self.status.strategy == StrategyArg::Lease || stop_signal;
        let how = if release {
            StepDown::Release
        } else {
            StepDown::Keep
        };
        self.step_down(leadership, how).await;
        code
    }

    async fn step_down(&self, leadership: Leadership, how: StepDown) {
        if let Some(label) = self.label {
            label.set(false);
        }
        if how == StepDown::Abandon {
            // Dropping the handle would let the library step down (release a lease) in the
            // background; the process exits right after, so the handle is leaked instead.
            std::mem::forget(leadership);
            return;
        }
        let lost = !leadership.is_leader() && how != StepDown::ReleaseOwnPodEnding;
        if how == StepDown::Keep || leadership.is_skipped() || lost {
            return;
        }
        let lock = &self.status.lock;
        match tokio::time::timeout(self.args.renew_deadline, leadership.release()).await {
            Ok(Ok(())) => info!(lock = %lock, identity = %self.status.identity, "released the lock"),
            Ok(Err(e)) => warn!(lock = %lock, error = %e, "could not release the lock"),
            Err(_) => warn!(lock = %lock, "releasing the lock timed out"),
        }
    }
}

/// Feeds the watched leader into the status.
async fn observe(mut leader: watch::Receiver<Option<LeaderInfo>>, status: Arc<Status>) {
    loop {
        let info = leader.borrow_and_update().clone();
        status.observe(info.as_ref());
        if leader.changed().await.is_err() {
            return;
        }
    }
}

// === the cluster ===

/// A client, once the API server answers (or `timeout` has passed: exit code 4).
pub(crate) async fn connect(timeout: Duration) -> Result<Client, Fail> {
    let config = kube::Config::infer().await.map_err(|e| {
        Fail::new(
            exit::CLUSTER,
            anyhow!(e).context("no cluster configuration (in-cluster, or KUBECONFIG)"),
        )
    })?;
    let url = config.cluster_url.to_string();
    let client = crate::client::build(config).or_exit(exit::CLUSTER)?;
    let deadline = Instant::now() + timeout;
    let mut delay = Duration::from_millis(100);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let err =
            match tokio::time::timeout(left.min(Duration::from_secs(5)), client.apiserver_version()).await {
                Ok(Ok(_)) => return Ok(client),
                Ok(Err(kube::Error::Api(s))) if s.code == 401 || s.code == 403 => {
                    return Err(Fail::new(
                        exit::CLUSTER,
                        anyhow!("the API server at {url} refused our credentials: {}", s.message),
                    ));
                }
                Ok(Err(e)) => anyhow!(e),
                Err(_) => anyhow!("no answer"),
            };
        if Instant::now() >= deadline {
            return Err(Fail::new(
                exit::CLUSTER,
                err.context(format!(
                    "cannot reach the API server at {url} (tried for {})",
                    humantime::format_duration(timeout)
                )),
            ));
        }
        debug!(error = %format!("{err:#}"), "API server not reachable yet");
        tokio::time::sleep(delay.min(deadline.saturating_duration_since(Instant::now()))).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

/// `--namespace`, else `POD_NAMESPACE`, else the service-account namespace, else the client's
/// (kubeconfig context).
pub(crate) fn resolve_namespace(explicit: Option<&str>, client: &Client) -> String {
    lock::discover_namespace(explicit).map_or_else(|| client.default_namespace().to_string(), |(ns, _)| ns)
}

/// `--identity`, else `POD_NAME`, else the host name.
pub(crate) fn resolve_identity(explicit: Option<&str>) -> Option<String> {
    explicit
        .map(str::to_string)
        .or_else(lock::pod_name_from_env)
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

// === signals ===

/// SIGTERM, SIGINT and SIGQUIT stop kube-leader (after COMMAND, if it runs).
fn is_stop(kind: SignalKind) -> bool {
    [
        SignalKind::terminate(),
        SignalKind::interrupt(),
        SignalKind::quit(),
    ]
    .contains(&kind)
}

/// The signals kube-leader forwards to COMMAND.
struct Signals {
    streams: Vec<(SignalKind, Signal)>,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        let streams = supervisor::FORWARDED
            .iter()
            .map(|k| Ok((*k, signal(*k)?)))
            .collect::<std::io::Result<_>>()?;
        Ok(Self { streams })
    }

    /// The next signal received.
    ///
    /// # Cancellation safety
    /// Cancel-safe: tokio's `Signal::recv` is.
    async fn recv(&mut self) -> SignalKind {
        let recvs = self.streams.iter_mut().map(|(kind, s)| {
            let kind = *kind;
            Box::pin(async move {
                s.recv().await;
                kind
            })
        });
        futures::future::select_all(recvs).await.0
    }
}
