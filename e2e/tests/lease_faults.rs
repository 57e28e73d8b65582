//! The Lease strategy under network and API-server faults, against a real control plane.
//!
//! The leader's client goes through a [`FaultProxy`]; the others connect directly. Every
//! candidate campaigns again after a loss. The safety invariant is checked everywhere, twice:
//! the terms `[became leader, lost]` of different candidates, on CLOCK_MONOTONIC, never overlap
//! ([`History`]), and a sampler that looks at every handle each millisecond never sees two of
//! them report `is_leader()`.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use kube::Client;
use kube_leader::{Error, Leadership, LeaseElector, LossReason};
use kube_leader_e2e::{
    checker::{History, Report},
    init_tracing, mono_ns,
};
use kube_leader_testenv::{ControlPlane, Fault, FaultProxy, ADMIN};
use tokio::{sync::mpsc, task::JoinHandle};
use tokio_util::sync::CancellationToken;

/// Timings `lease / renew / retry` in milliseconds.
#[derive(Clone, Copy)]
struct Timings(u64, u64, u64);

/// The short timings of the Lease tests: 2 s / 1 s / 200 ms.
const SHORT: Timings = Timings(2000, 1000, 200);
/// Long enough to ride out a restart of kube-apiserver of a few seconds.
const LONG: Timings = Timings(10_000, 8000, 1000);

fn elector(client: Client, ns: &str, lease: &str, id: &str, t: Timings) -> LeaseElector {
    LeaseElector::new(client, lease)
        .namespace(ns)
        .identity(id)
        .config(
            kube_leader::LeaseConfig::default()
                .lease_duration(Duration::from_millis(t.0))
                .renew_deadline(Duration::from_millis(t.1))
                .retry_period(Duration::from_millis(t.2)),
        )
}

/// What a candidate did, with CLOCK_MONOTONIC nanoseconds.
#[derive(Debug, Clone)]
enum Event {
    Began {
        id: String,
        at: u64,
    },
    Lost {
        id: String,
        at: u64,
        reason: Option<LossReason>,
    },
}

impl Event {
    fn began_by(&self, who: &str) -> Option<u64> {
        matches!(self, Event::Began { id, .. } if id == who).then(|| self.at())
    }

    fn lost_by(&self, who: &str) -> Option<(u64, Option<LossReason>)> {
        match self {
            Event::Lost { id, at, reason } if id == who => Some((*at, reason.clone())),
            _ => None,
        }
    }

    fn at(&self) -> u64 {
        match self {
            Event::Began { at, .. } | Event::Lost { at, .. } => *at,
        }
    }
}

/// A sample in which several handles reported `is_leader()`: when, and whose.
type Double = (u64, Vec<String>);

/// Candidates that campaign again after every loss, and the checks on them.
struct Arena {
    history: Arc<Mutex<History>>,
    /// Every Leadership handed out, kept (not dropped) until the end so the sampler can ask each
    /// one, and a test can ask an old one, whether it believes it leads.
    handles: Arc<Mutex<Vec<(String, Leadership)>>>,
    /// Instants at which the sampler saw more than one handle report `is_leader()`.
    doubles: Arc<Mutex<Vec<Double>>>,
    samples: Arc<Mutex<u64>>,
    tx: mpsc::UnboundedSender<Event>,
    rx: mpsc::UnboundedReceiver<Event>,
    /// Every event received so far.
    log: Vec<Event>,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    sampler: JoinHandle<()>,
}

impl Arena {
    fn new() -> Self {
        let handles: Arc<Mutex<Vec<(String, Leadership)>>> = Arc::default();
        let doubles: Arc<Mutex<Vec<Double>>> = Arc::default();
        let samples: Arc<Mutex<u64>> = Arc::default();
        let sampler = {
            let (handles, doubles, samples) = (handles.clone(), doubles.clone(), samples.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(1));
                loop {
                    tick.tick().await;
                    let leaders: Vec<String> = handles
                        .lock()
                        .unwrap()
                        .iter()
                        .filter(|(_, l)| l.is_leader())
                        .map(|(id, _)| id.clone())
                        .collect();
                    *samples.lock().unwrap() += 1;
                    if leaders.len() > 1 {
                        doubles.lock().unwrap().push((mono_ns(), leaders));
                    }
                }
            })
        };
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            history: Arc::default(),
            handles,
            doubles,
            samples,
            tx,
            rx,
            log: Vec::new(),
            shutdown: CancellationToken::new(),
            tasks: Vec::new(),
            sampler,
        }
    }

    /// Starts a candidate that campaigns, leads until it loses, and campaigns again.
    fn spawn(&mut self, id: &str, elector: LeaseElector) {
        let id = id.to_string();
        let (history, handles, tx, shutdown) = (
            self.history.clone(),
            self.handles.clone(),
            self.tx.clone(),
            self.shutdown.clone(),
        );
        self.tasks.push(tokio::spawn(async move {
            loop {
                let leadership = match elector.become_leader(&shutdown).await {
                    Ok(l) => l,
                    Err(Error::Cancelled { .. }) => return,
                    Err(e) => panic!("candidate {id} failed: {e}"),
                };
                let at = mono_ns();
                let lost = leadership.lost_token();
                let fencing_token = leadership.fencing_token();
                history
                    .lock()
                    .unwrap()
                    .began_with_token(&id, at, Some(fencing_token));
                handles.lock().unwrap().push((id.clone(), leadership));
                let _ = tx.send(Event::Began { id: id.clone(), at });
                lost.cancelled().await;
                let at = mono_ns();
                history.lock().unwrap().ended(&id, at);
                let reason = handles
                    .lock()
                    .unwrap()
                    .iter()
                    .rev()
                    .find(|(i, _)| *i == id)
                    .and_then(|(_, l)| l.loss_reason());
                let _ = tx.send(Event::Lost {
                    id: id.clone(),
                    at,
                    reason,
                });
                if shutdown.is_cancelled() {
                    return;
                }
            }
        }));
    }

    /// The first event (received so far or later) for which `f` gives `Some`.
    async fn wait<T>(&mut self, what: &str, timeout: Duration, f: impl Fn(&Event) -> Option<T>) -> T {
        if let Some(v) = self.log.iter().find_map(&f) {
            return v;
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let ev = tokio::time::timeout_at(deadline, self.rx.recv())
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "timed out after {timeout:?} waiting for {what}; events: {:#?}",
                        self.log
                    )
                })
                .expect("the arena holds a sender");
            self.log.push(ev);
            if let Some(v) = f(self.log.last().unwrap()) {
                return v;
            }
        }
    }

    /// Takes in the events sent so far.
    fn drain(&mut self) -> &[Event] {
        while let Ok(ev) = self.rx.try_recv() {
            self.log.push(ev);
        }
        &self.log
    }

    /// Who leads now, by the handles.
    fn leaders(&self) -> Vec<String> {
        let handles = self.handles.lock().unwrap();
        handles
            .iter()
            .filter(|(_, l)| l.is_leader())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// `id`'s `n`th term's handle: whether it believes it leads, and why it stopped.
    fn term_state(&self, id: &str, n: usize) -> (bool, Option<LossReason>) {
        let handles = self.handles.lock().unwrap();
        let (_, l) = handles
            .iter()
            .filter(|(i, _)| i == id)
            .nth(n)
            .expect("no such term");
        (l.is_leader(), l.loss_reason())
    }

    /// Waits until exactly one candidate leads and has led for `stable`, then returns it.
    async fn settled_leader(&mut self, stable: Duration, timeout: Duration) -> String {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let leaders = self.leaders();
            if let [one] = &leaders[..] {
                let history = self.history.lock().unwrap();
                let term = history
                    .terms()
                    .iter()
                    .rev()
                    .find(|t| t.candidate == *one && t.end.is_none());
                let since = term.map_or(u64::MAX, |t| t.start);
                drop(history);
                if mono_ns().saturating_sub(since) >= stable.as_nanos() as u64 {
                    return one.clone();
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no single stable leader after {timeout:?}: {leaders:?}; events {:#?}",
                self.drain()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops every candidate, checks the invariant, and returns the report.
    async fn finish(mut self, name: &str) -> Report {
        // The window ends before shutdown: the shutdown's own release is no leaderless gap.
        let until = mono_ns();
        self.shutdown.cancel();
        for task in std::mem::take(&mut self.tasks) {
            task.await.expect("a candidate panicked");
        }
        self.sampler.abort();
        let samples = *self.samples.lock().unwrap();
        self.drain();
        // Dropping the handles releases what is still held.
        self.handles.lock().unwrap().clear();
        let report = self.history.lock().unwrap().report(until);
        eprintln!("{name}: {report}; sampler: {samples} samples, never two leaders");
        let doubles = self.doubles.lock().unwrap();
        assert!(
            doubles.is_empty(),
            "{name}: the sampler saw two leaders at once: {doubles:?}"
        );
        report.assert_safe();
        // Fencing: a later term of another candidate has a greater token (a candidate that finds
        // its own record again keeps its token).
        let mut terms = self.history.lock().unwrap().terms().to_vec();
        terms.sort_by_key(|t| t.start);
        for w in terms.windows(2) {
            let (a, b) = (&w[0], &w[1]);
            let ok = if a.candidate == b.candidate {
                b.fencing_token >= a.fencing_token
            } else {
                b.fencing_token > a.fencing_token
            };
            assert!(ok, "{name}: fencing token went from {a:?} to {b:?}");
        }
        report
    }
}

fn dur(ns: u64) -> Duration {
    Duration::from_nanos(ns)
}

/// Issue 7: a leader partitioned from the API server stops before its lease can expire for the
/// others; after the partition heals, its old handle stays lost and it leads again only by a
/// normal campaign.
#[tokio::test]
async fn partitioned_leader_stops_before_anyone_can_take_over() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let proxy = FaultProxy::to_apiserver(cp).unwrap();
    // The leader's client reads a kubeconfig that points at the proxy, as a process would.
    let kubeconfig = kube::config::Kubeconfig::read_from(proxy.write_kubeconfig(cp, ADMIN).unwrap()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let through_proxy = Client::try_from(config).unwrap();

    let mut arena = Arena::new();
    arena.spawn("a", elector(through_proxy, ns.name(), "partition", "a", SHORT));
    arena
        .wait("a to lead", Duration::from_secs(30), |e| e.began_by("a"))
        .await;
    arena.spawn(
        "b",
        elector(cp.client().await, ns.name(), "partition", "b", SHORT),
    );
    tokio::time::sleep(Duration::from_millis(700)).await; // b syncs and sees renewals

    let cut = mono_ns();
    proxy.set(Fault::Blackhole);
    let (lost, reason) = arena
        .wait("a to lose", Duration::from_secs(5), |e| e.lost_by("a"))
        .await;
    let took_over = arena
        .wait("b to take over", Duration::from_secs(10), |e| e.began_by("b"))
        .await;
    eprintln!(
        "partition: a lost {:?} after the cut ({reason:?}), b took over {:?} after the cut: \
         margin {:?}",
        dur(lost - cut),
        dur(took_over - cut),
        dur(took_over.saturating_sub(lost))
    );
    assert!(
        matches!(reason, Some(LossReason::RenewDeadline { .. })),
        "{reason:?}"
    );
    assert!(
        lost < took_over,
        "b took over {:?} before a lost",
        dur(lost - took_over)
    );
    assert!(
        dur(lost - cut) <= Duration::from_millis(1500),
        "fail-stop took {:?}",
        dur(lost - cut)
    );
    // b waits a whole lease duration from its last observation of a's renewals.
    assert!(
        dur(took_over - cut) >= Duration::from_millis(1700),
        "{:?}",
        dur(took_over - cut)
    );

    // Heal. a's first handle stays lost; a campaigns again through the proxy, but b renews, so a
    // must not lead.
    proxy.set(Fault::Pass);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !arena.term_state("a", 0).0,
        "the partitioned leader's handle came back to life"
    );
    assert!(matches!(
        arena.term_state("a", 0).1,
        Some(LossReason::RenewDeadline { .. })
    ));
    assert_eq!(arena.leaders(), ["b"], "b keeps leading after the heal");
    assert!(
        arena.drain().iter().filter_map(|e| e.began_by("a")).count() == 1,
        "a led again over b"
    );
    let report = arena.finish("partition").await;
    assert_eq!(report.transitions, 1);
}

/// Issue 5: the API server slowed past the renew deadline for the leader only. Its renewals time
/// out, it stops by its renew deadline, and the follower takes over only afterwards, though
/// late renewals of the old leader may still land and postpone that.
#[tokio::test]
async fn leader_slowed_past_its_renew_deadline_stops_before_takeover() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let proxy = FaultProxy::to_apiserver(cp).unwrap();
    let mut arena = Arena::new();
    arena.spawn(
        "a",
        elector(proxy.client(cp, ADMIN).await, ns.name(), "slow", "a", SHORT),
    );
    arena
        .wait("a to lead", Duration::from_secs(30), |e| e.began_by("a"))
        .await;
    arena.spawn("b", elector(cp.client().await, ns.name(), "slow", "b", SHORT));
    tokio::time::sleep(Duration::from_millis(700)).await;

    let slowed = mono_ns();
    proxy.set(Fault::Delay(Duration::from_millis(1500)));
    let (lost, reason) = arena
        .wait("a to lose", Duration::from_secs(5), |e| e.lost_by("a"))
        .await;
    let took_over = arena
        .wait("b to take over", Duration::from_secs(15), |e| e.began_by("b"))
        .await;
    eprintln!(
        "delay 1.5 s: a lost {:?} after the slowdown ({reason:?}), b took over {:?} after it: margin {:?}",
        dur(lost - slowed),
        dur(took_over - slowed),
        dur(took_over.saturating_sub(lost))
    );
    assert!(
        matches!(reason, Some(LossReason::RenewDeadline { .. })),
        "{reason:?}"
    );
    assert!(lost < took_over);

    // a keeps campaigning through the slow proxy meanwhile; then the proxy is healed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.set(Fault::Pass);
    let leader = arena
        .settled_leader(Duration::from_secs(1), Duration::from_secs(15))
        .await;
    eprintln!("delay 1.5 s: after the heal {leader} leads");
    arena.finish("delay").await;
}

/// Connections reset again and again, each time sooner than the renew deadline: transient
/// errors are retried, so the leader keeps leading (or, if it loses, loses cleanly).
#[tokio::test]
async fn connections_reset_faster_than_the_deadline() {
    init_tracing();
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let proxy = FaultProxy::to_apiserver(cp).unwrap();
    let mut arena = Arena::new();
    arena.spawn(
        "a",
        elector(proxy.client(cp, ADMIN).await, ns.name(), "reset", "a", SHORT),
    );
    arena
        .wait("a to lead", Duration::from_secs(30), |e| e.began_by("a"))
        .await;
    arena.spawn("b", elector(cp.client().await, ns.name(), "reset", "b", SHORT));
    tokio::time::sleep(Duration::from_millis(500)).await;

    let resets_before = proxy.reset_count();
    for _ in 0..8 {
        // 150 ms in which every connection is reset and new ones are refused, then 350 ms of
        // service: 4 s in all, four renew deadlines.
        proxy.set(Fault::Reset);
        tokio::time::sleep(Duration::from_millis(150)).await;
        proxy.set(Fault::Pass);
        tokio::time::sleep(Duration::from_millis(350)).await;
    }
    let resets = proxy.reset_count() - resets_before;
    let losses: Vec<_> = arena.drain().iter().filter_map(|e| e.lost_by("a")).collect();
    eprintln!(
        "resets: {resets} connections reset over 8 cycles; a lost leadership {} time(s) {losses:?}",
        losses.len()
    );
    assert!(resets >= 8, "the proxy reset only {resets} connections");
    if losses.is_empty() {
        assert_eq!(arena.leaders(), ["a"], "a kept leading through the resets");
    }
    arena
        .settled_leader(Duration::from_millis(500), Duration::from_secs(15))
        .await;
    arena.finish("reset").await;
}

/// kube-apiserver killed and started again on a control plane of this test's own. With timings
/// that outlast the restart, the leader keeps leading, or loses before anybody else leads; with
/// short timings, the leader stops by its renew deadline and somebody leads after the restart.
/// Both groups of candidates share the one restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_restart() {
    init_tracing();
    let cp = tokio::task::spawn_blocking(ControlPlane::start)
        .await
        .unwrap()
        .unwrap_or_else(|e| {
            panic!("a private control plane is needed (run ./scripts/testenv-assets.sh): {e}")
        });
    let ns = cp.namespace().await;
    let mut long = Arena::new();
    let mut short = Arena::new();
    for id in ["l1", "l2", "l3"] {
        long.spawn(id, elector(cp.client().await, ns.name(), "long", id, LONG));
    }
    for id in ["s1", "s2", "s3"] {
        short.spawn(id, elector(cp.client().await, ns.name(), "short", id, SHORT));
    }
    let long_leader = long
        .settled_leader(Duration::from_millis(1500), Duration::from_secs(30))
        .await;
    let short_leader = short
        .settled_leader(Duration::from_millis(500), Duration::from_secs(30))
        .await;

    let killed = mono_ns();
    cp.stop_apiserver();
    // Down for longer than the short renew deadline (1 s), whatever the machine's speed: a
    // restart that answers within it lets a renewal through in time, and the short leader then
    // rightly keeps leading (seen once: the restarted server answered 1.1 s after the kill,
    // before it reported ready).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cp.start_apiserver().await.expect("kube-apiserver restarts");
    let back = mono_ns();
    eprintln!("kube-apiserver was down for {:?}", dur(back - killed));

    // Short timings: the leader stopped by its renew deadline, about 1 s after the kill.
    let (lost, reason) = short
        .wait("the short leader to lose", Duration::from_secs(5), |e| {
            e.lost_by(&short_leader)
        })
        .await;
    assert!(
        matches!(reason, Some(LossReason::RenewDeadline { .. })),
        "{reason:?}"
    );
    let after_kill = dur(lost.saturating_sub(killed));
    assert!(after_kill <= Duration::from_millis(1500), "{after_kill:?}");
    let short_next = short
        .settled_leader(Duration::from_millis(500), Duration::from_secs(30))
        .await;
    let next_began = short.history.lock().unwrap().terms().last().unwrap().start;
    eprintln!(
        "restart, 2s/1s/200ms: {short_leader} lost {after_kill:?} after the kill; {short_next} leads again \
         {:?} after the kill (the restarted API server was ready {:?} after the kill)",
        dur(next_began.saturating_sub(killed)),
        dur(back - killed)
    );

    // Long timings: the leader kept leading, or lost before the others took over (the checker).
    let long_next = long
        .settled_leader(Duration::from_secs(1), Duration::from_secs(30))
        .await;
    let long_losses: Vec<_> = long
        .drain()
        .iter()
        .filter_map(|e| e.lost_by(&long_leader))
        .collect();
    eprintln!(
        "restart, 10s/8s/1s: {long_leader} led before, {long_next} leads after; losses of the old leader: \
         {long_losses:?}"
    );
    if long_losses.is_empty() {
        assert_eq!(long_next, long_leader);
    }

    long.finish("restart 10s/8s/1s").await;
    short.finish("restart 2s/1s/200ms").await;
}
