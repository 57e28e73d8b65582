//! COMMAND during one term: started through its supervisor (behind its fencing proxy with
//! `--fence`), kept confirmed as far as leadership is ([`Confirmed`]), told of a loss, sent the
//! signals kube-leader receives, until the supervisor reports that COMMAND has exited.

use std::time::Duration;

use kube_leader::internal::StrategyExt as _;
use kube_leader::{Leadership, LossReason};
use tokio::{
    sync::watch,
    time::{Instant, Interval, MissedTickBehavior},
};
use tracing::{info, warn};

use super::signals::{is_stop, Signals};
use crate::{
    fence::{start_proxy, Proxy, Tokens},
    label::PodLabel,
    state::Status,
    supervisor::{Ended, Event, Launch, Stop, Supervised, Supervisor},
};

/// What a term of COMMAND starts from.
pub(super) struct Start<'a> {
    pub(super) status: &'a Status,
    pub(super) label: Option<&'a PodLabel>,
    /// What starts COMMAND's supervisor, should the one started in advance be gone.
    pub(super) launch: &'a Launch,
    /// The supervisor started in advance, while this candidate followed.
    pub(super) standby: Option<Supervisor>,
    /// `--fence`: kube-leader's client and user, through which COMMAND's fencing proxy writes.
    pub(super) fence: Option<(kube::Client, String)>,
    /// How long the loop's own ping confirms COMMAND.
    pub(super) renew_deadline: Duration,
    /// How often it pings.
    pub(super) retry_period: Duration,
}

/// COMMAND under its supervisor during one term, as the leader's loop sees it.
pub(super) struct Running<'a> {
    status: &'a Status,
    label: Option<&'a PodLabel>,
    token: u64,
    env: Vec<(&'static str, String)>,
    /// `--fence`: COMMAND's API requests go through it; it stops when this is dropped.
    _proxy: Option<Proxy>,
    command: Supervised,
    confirmed: Confirmed,
    /// Leadership is lost (and the status says so).
    pub(super) lost: bool,
    /// A signal that stops kube-leader was forwarded.
    pub(super) stop_signal: bool,
    pub(super) command_pid: Option<u32>,
    /// Whether the supervisor said its last word (`exited`): COMMAND ended in order.
    pub(super) orderly: bool,
}

/// Until when COMMAND is confirmed, in `run` and, shard by shard, in `run --shards`: the library's
/// [`confirmations`](Leadership::confirmations) wherever it gives them, counted from when the
/// acquiring write or a renewal was sent (the fail-stop rule); this loop's own pings (the renew
/// deadline from now) where it gives none (leader for life without liveness, a skipped
/// election), and where its confirmation may reach further than that (leader for life's
/// liveness): a frozen kube-leader has COMMAND stopped by the renew deadline.
pub(crate) struct Confirmed {
    /// The library's confirmations; `None` for a skipped election, or once the term's keeper is
    /// gone.
    library: Option<watch::Receiver<Option<Instant>>>,
    /// The library's confirmations count from writes (a Lease): they alone confirm COMMAND, and
    /// nothing is confirmed without one.
    from_writes: bool,
    renew_deadline: Duration,
    /// Every retry period where the library's confirmations are not enough.
    ping: Option<Interval>,
}

// === impl Confirmed ===

impl Confirmed {
    /// `leadership`'s confirmations, pinged every `retry_period` where they are not enough.
    pub(crate) fn new(leadership: &Leadership, renew_deadline: Duration, retry_period: Duration) -> Self {
        let library = (!leadership.is_skipped()).then(|| leadership.confirmations());
        let from_writes = library.is_some() && leadership.term().strategy.expires();
        Self::of(library, from_writes, renew_deadline, retry_period)
    }

    /// This loop's own ping alone: the renew deadline from now, every `retry_period`.
    pub(crate) fn ping(renew_deadline: Duration, retry_period: Duration) -> Self {
        Self::of(None, false, renew_deadline, retry_period)
    }

    fn of(
        library: Option<watch::Receiver<Option<Instant>>>,
        from_writes: bool,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Self {
        let ping = (!from_writes).then(|| {
            let mut ping = tokio::time::interval(retry_period);
            ping.set_missed_tick_behavior(MissedTickBehavior::Delay);
            ping
        });
        Self {
            library,
            from_writes,
            renew_deadline,
            ping,
        }
    }

    /// A term's confirmations counted from its writes (a shard's Lease): they alone confirm
    /// COMMAND, and nothing is confirmed without one; never pinged.
    pub(crate) fn from_writes(library: watch::Receiver<Option<Instant>>, renew_deadline: Duration) -> Self {
        Self::of(Some(library), true, renew_deadline, Duration::ZERO)
    }

    /// The first confirmation. The keeper of a Lease confirms its acquiring write on its first
    /// turn, right after the handle is returned: waited for (at most the renew deadline).
    async fn first(&mut self) -> Instant {
        if let (true, Some(c)) = (self.from_writes, self.library.as_mut()) {
            let _ = tokio::time::timeout(self.renew_deadline, c.wait_for(Option::is_some)).await;
        }
        self.until()
    }

    /// Until when COMMAND is confirmed now.
    pub(crate) fn until(&mut self) -> Instant {
        let now = Instant::now();
        let library = self.library.as_mut().and_then(|c| *c.borrow_and_update());
        match (self.from_writes, library) {
            (true, until) => until.unwrap_or(now),
            (false, Some(until)) => until.min(now + self.renew_deadline),
            (false, None) => now + self.renew_deadline,
        }
    }

    /// The next confirmation: the library's, or this loop's ping; `None` when nothing is new
    /// (the keeper is gone).
    ///
    /// # Cancellation safety
    /// Cancel-safe (a watch's `changed` and an interval's `tick` are).
    pub(crate) async fn next(&mut self) -> Option<Instant> {
        let library = async {
            match self.library.as_mut() {
                Some(c) => c.changed().await.is_ok(),
                None => std::future::pending().await,
            }
        };
        let ping = async {
            match self.ping.as_mut() {
                Some(p) => p.tick().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = library => {
                if !changed {
                    self.library = None;
                    return None;
                }
            }
            _ = ping => {}
        }
        Some(self.until())
    }
}

// === impl Running ===

impl<'a> Running<'a> {
    /// Gets COMMAND ready for `leadership`'s term: its environment, its fencing proxy, its
    /// supervisor (the one started in advance, if it still lives); `None` if it cannot be.
    pub(super) async fn new(start: Start<'a>, leadership: &Leadership) -> Option<Self> {
        let lock = &start.status.lock;
        let token = leadership.fencing_token();
        let mut env = vec![
            ("KUBE_LEADER_IDENTITY", start.status.identity.clone()),
            ("KUBE_LEADER_LOCK", lock.name.clone()),
            ("KUBE_LEADER_NAMESPACE", lock.namespace.clone()),
            ("KUBE_LEADER_FENCING_TOKEN", token.to_string()),
        ];
        // `--fence`: COMMAND's API requests go through a proxy that adds this term's token.
        let proxy = match start.fence {
            Some((client, user)) => {
                let dir = std::env::temp_dir();
                match start_proxy(client, &user, Tokens::Term(token), &dir).await {
                    Ok(proxy) => Some(proxy),
                    Err(e) => {
                        warn!(error = %e, "cannot start the fencing proxy");
                        return None;
                    }
                }
            }
            None => None,
        };
        if let Some(proxy) = &proxy {
            env.push(("KUBECONFIG", proxy.kubeconfig.display().to_string()));
        }
        let ready = start
            .standby
            .and_then(|mut s| (!s.process.has_exited()).then_some(s));
        let supervisor: Supervisor = match ready.map_or_else(|| start.launch.spawn(), Ok) {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %format!("{e:#}"), "cannot start the supervisor");
                return None;
            }
        };
        Some(Self {
            status: start.status,
            label: start.label,
            token,
            env,
            _proxy: proxy,
            command: Supervised::new(supervisor),
            confirmed: Confirmed::new(leadership, start.renew_deadline, start.retry_period),
            lost: false,
            stop_signal: false,
            command_pid: None,
            orderly: false,
        })
    }

    /// Starts COMMAND, confirmed as far as leadership is, and runs until the supervisor exits
    /// or reports that COMMAND has exited; returns the code.
    pub(super) async fn run(&mut self, leadership: &Leadership, signals: &mut Signals) -> u8 {
        let first = self.confirmed.first().await;
        self.command.start(first, &self.env).await;
        loop {
            let (exit, report) = self.command.next();
            tokio::select! {
                biased;
                code = exit => {
                    let ended = self.command.died(code).await;
                    return self.ended(ended);
                }
                reason = leadership.lost(), if !self.lost => self.on_lost(reason).await,
                event = report => {
                    if let Some(ended) = self.on_report(event) {
                        return self.ended(ended);
                    }
                }
                until = self.confirmed.next(), if !self.lost => {
                    if let Some(until) = until {
                        self.command.confirm_until(until).await;
                    }
                }
                kind = signals.recv() => {
                    info!(lock = %self.status.lock, signal = kind.as_raw_value(), "forwarding signal to COMMAND");
                    self.stop_signal |= is_stop(kind);
                    self.command.signal(kind.as_raw_value()).await;
                }
            }
        }
    }

    async fn on_lost(&mut self, reason: LossReason) {
        self.lost = true;
        self.status.lose(self.token, &reason.to_string(), false);
        self.command.stop().await;
        if let Some(label) = self.label {
            label.set(false);
        }
    }

    /// Handles what the supervisor said; `Some` once COMMAND has exited.
    fn on_report(&mut self, event: Event) -> Option<Ended> {
        match event {
            Event::Started(pid) => info!(lock = %self.status.lock, pid, "started COMMAND"),
            Event::Expired(since) => self.lose(&format!(
                "the supervisor stopped COMMAND: leadership not confirmed for {}",
                humantime::format_duration(Duration::from_millis(
                    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
                ))
            )),
            Event::Backstop => {
                self.lose("kube-leader killed COMMAND: its supervisor did not stop it by its deadline");
            }
            // COMMAND and what it left are gone: step down now, without waiting for the
            // supervisor's own exit.
            Event::Ended(ended) => return Some(ended),
        }
        None
    }

    /// COMMAND has ended: a loss that came with the supervisor's exit (kube-leader was frozen
    /// while the supervisor stopped COMMAND) is told; returns the code.
    fn ended(&mut self, ended: Ended) -> u8 {
        if ended.stopped == Some(Stop::Expired) {
            self.lose("the supervisor stopped COMMAND: leadership not confirmed in time");
        }
        self.command_pid = self.command.pid();
        self.orderly = ended.orderly;
        ended.code
    }

    /// Leadership is lost for `why`, unless it was already.
    fn lose(&mut self, why: &str) {
        if !self.lost {
            self.lost = true;
            self.status.lose(self.token, why, false);
        }
    }
}
