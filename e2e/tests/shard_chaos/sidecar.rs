//! The shards sidecar arena (issue 21): three `kube-leader run --shards M -- shard-command`
//! replicas, each through a fault proxy of its own, under a seeded schedule of faults; COMMAND's
//! work on every shard is checked exactly (see the faults in the test file's documentation).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use kube_leader_e2e::{
    chaos::{Analysis, Fault, Pause, Rng},
    checker::Span,
    mono_ns,
    shard_fleet::Timings,
    shard_sidecars::{Programs, SidecarFleet},
};
use kube_leader_testenv::{ControlPlane, Fault as NetFault, FaultProxy, ADMIN};
use nix::sys::signal::{killpg, Signal};
use tokio::time::Instant;

const REPLICAS: usize = 3;
const SOON: Duration = Duration::from_secs(30);
/// A resumed replica's COMMAND may work beside its successor's this long after the thaw.
const POST_PAUSE_BOUND: Duration = Duration::from_millis(50);
/// Scheduling on a loaded machine: COMMAND handles its SIGTERM, the harness sees it.
const SLACK: Duration = Duration::from_millis(250);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    KillKubeLeader,
    Kill,
    StopGroup,
    Partition,
    Sigterm,
    Pause,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::KillKubeLeader => "kill-kube-leader",
            Kind::Kill => "kill",
            Kind::StopGroup => "stop-group",
            Kind::Partition => "partition",
            Kind::Sigterm => "sigterm",
            Kind::Pause => "pause",
        }
    }
}

const KINDS: [Kind; 6] = [
    Kind::KillKubeLeader,
    Kind::Kill,
    Kind::StopGroup,
    Kind::Partition,
    Kind::Sigterm,
    Kind::Pause,
];

struct Slot {
    proxy: FaultProxy,
    kubeconfig: PathBuf,
    generation: u32,
    key: String,
}

/// What each kind of fault did.
#[derive(Debug, Default)]
struct PerKind {
    draws: usize,
    transitions: usize,
    /// kill-kube-leader: kill → COMMAND gone; stop-group: stop → COMMAND stopped; pause: thaw
    /// → COMMAND gone.
    delays: Vec<Duration>,
    settle: Vec<Duration>,
}

struct Arena {
    fleet: SidecarFleet,
    slots: Vec<Slot>,
    rng: Rng,
    t: Timings,
    faults: Vec<Fault>,
    pauses: Vec<Pause>,
    kinds: BTreeMap<Kind, PerKind>,
}

impl Arena {
    fn start(&mut self, slot: usize) {
        let s = &mut self.slots[slot];
        s.generation += 1;
        s.key = format!("s{}-{}", slot + 1, s.generation);
        let (key, kubeconfig) = (s.key.clone(), s.kubeconfig.clone());
        self.fleet.start(&key, &kubeconfig);
    }

    /// The longest the set may take to come back to every shard worked once, fairly, after a
    /// fault: the shards of a replica gone without a word are taken over once their leases
    /// expire (lease, an API call of up to the renew deadline, a retry period); a replica that
    /// (re)joins waits up to a lease duration for its share before its COMMAND starts, and
    /// every COMMAND whose set changes is restarted (its shards released once it stopped, the
    /// additions to a set gathered for up to 1 s); twice over for a replica that leaves and
    /// comes back (its own restart, then the others'), plus 2 s of process starts on this
    /// machine.
    fn settle_bound(&self) -> Duration {
        let t = self.t;
        t.lease
            + t.renew
            + t.retry
            + 2 * (t.lease + Duration::from_secs(1) + t.retry)
            + Duration::from_secs(2)
    }

    /// Waits until every shard is worked once, fairly (for two retry periods in a row); returns
    /// how long it took to get there. A replica whose kube-leader exited on
    /// its own (exit 3 after a pause whose thaw its backstop saw first: the term abandoned)
    /// is replaced by a fresh one, as a kubelet would restart its container.
    async fn settle(&mut self, after: &str) -> Duration {
        let took = Instant::now();
        // Fair for two retry periods in a row: not a passing state of a rebalance.
        let stable = 2 * self.t.retry;
        let mut fair_since: Option<Duration> = None;
        loop {
            self.fleet.poll();
            for slot in 0..REPLICAS {
                if self.fleet.exited(&self.slots[slot].key) {
                    self.start(slot);
                }
            }
            if !self.fleet.balanced() {
                fair_since = None;
            } else if let Some(since) = fair_since {
                if took.elapsed() - since >= stable {
                    return since;
                }
            } else {
                fair_since = Some(took.elapsed());
            }
            assert!(
                took.elapsed() < SOON,
                "sidecars: no fair spread {SOON:?} after {after}: {:?}",
                self.fleet.counts()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// A replica, at random (after a settle, every replica's COMMAND works shards).
    fn target(&mut self) -> (usize, String) {
        let slot = self.rng.index(REPLICAS);
        (slot, self.slots[slot].key.clone())
    }

    /// Waits until every shard in `shards` is worked by another replica than `key`.
    async fn taken_over(&mut self, key: &str, shards: &[u32]) {
        let ok = self
            .fleet
            .until(SOON, |f| {
                shards
                    .iter()
                    .all(|s| f.workers(*s).iter().any(|w| *w != key))
                    .then_some(())
            })
            .await;
        assert!(
            ok.is_some(),
            "sidecars: the shards {shards:?} of {key} are not taken over"
        );
    }

    /// Waits until the COMMAND `pid` of replica `key` no longer works; returns when it stopped.
    async fn command_gone(&mut self, key: &str, pid: i32, timeout: Duration, what: &str) -> u64 {
        let gone = self
            .fleet
            .until(timeout, |f| (f.command_pid(key) != Some(pid)).then_some(()))
            .await;
        assert!(
            gone.is_some(),
            "sidecars: {what}: COMMAND {pid} of {key} still works after {timeout:?}"
        );
        self.fleet.ended_at(key).expect("an end")
    }

    async fn exited(&mut self, key: &str, what: &str) {
        let k = key.to_string();
        let done = self.fleet.until(SOON, |f| f.exited(&k).then_some(())).await;
        assert!(done.is_some(), "sidecars: {key} did not exit after {what}");
    }

    async fn inject(&mut self, kind: Kind) {
        let t = self.t;
        let (slot, key) = self.target();
        let pid = self.fleet.command_pid(&key).expect("a working COMMAND");
        let held = self.fleet.worked_by(&key);
        let start = mono_ns();
        let mut delay = None;
        let mut end = None;
        match kind {
            Kind::KillKubeLeader => {
                let at = self.fleet.kill_kube_leader(&key);
                let gone = self
                    .command_gone(&key, pid, t.renew + SOON, "kill-kube-leader")
                    .await;
                delay = Some(Duration::from_nanos(gone - at));
                self.exited(&key, "SIGKILL").await;
                self.start(slot);
            }
            Kind::Kill => {
                self.fleet.kill_all(&key);
                self.exited(&key, "SIGKILL").await;
                self.start(slot);
            }
            Kind::StopGroup => {
                let stop = if self.rng.chance(0.5) {
                    Signal::SIGTSTP
                } else {
                    Signal::SIGSTOP
                };
                let at = self.fleet.signal_group(&key, stop);
                let gone = self.command_gone(&key, pid, t.renew + SOON, "stop-group").await;
                delay = Some(Duration::from_nanos(gone - at));
                self.taken_over(&key, &held).await;
                self.fleet.signal_group(&key, Signal::SIGCONT);
            }
            Kind::Partition => {
                let hold = t.lease + t.renew + self.rng.duration(Duration::ZERO, t.lease);
                self.slots[slot].proxy.set(NetFault::Blackhole);
                self.fleet.sleep(hold).await;
                self.slots[slot].proxy.set(NetFault::Pass);
            }
            Kind::Sigterm => {
                self.fleet.signal_group(&key, Signal::SIGTERM);
                self.exited(&key, "SIGTERM").await;
                assert_eq!(
                    self.fleet.exit_code(&key),
                    Some(0),
                    "sidecars: {key} after SIGTERM"
                );
                self.start(slot);
            }
            Kind::Pause => {
                let groups = self.fleet.groups(&key);
                for g in &groups {
                    let _ = killpg(*g, Signal::SIGSTOP);
                }
                let froze = mono_ns();
                let at_least = t.lease + self.rng.duration(Duration::from_millis(100), t.lease / 2);
                self.fleet.sleep(at_least).await;
                self.taken_over(&key, &held).await;
                // COMMAND first: the worst order.
                let thawed = mono_ns();
                for g in groups.iter().rev() {
                    let _ = killpg(*g, Signal::SIGCONT);
                }
                self.fleet.frozen(
                    &key,
                    Span {
                        start: froze,
                        end: thawed,
                    },
                );
                self.pauses.push(Pause {
                    key: key.clone(),
                    froze,
                    thawed,
                });
                let gone = self.command_gone(&key, pid, SOON, "after its pause").await;
                delay = Some(Duration::from_nanos(gone.saturating_sub(thawed)));
                end = Some(thawed);
            }
        }
        self.faults.push(Fault {
            kind: kind.name().into(),
            target: Some(key),
            start,
            end: end.unwrap_or_else(mono_ns),
        });
        let e = self.kinds.entry(kind).or_default();
        e.draws += 1;
        e.delays.extend(delay);
    }
}

fn spread(d: &[Duration]) -> String {
    let mut v = d.to_vec();
    v.sort();
    match (v.first(), v.get(v.len() / 2), v.last()) {
        (Some(a), Some(m), Some(z)) => format!("min {a:?} median {m:?} max {z:?}"),
        _ => "-".into(),
    }
}

/// The sidecar arena's run: returns nothing, asserts everything.
pub(crate) async fn run(long: bool, seed: u64, target: usize, only: Option<Vec<String>>) {
    let mut kinds: Vec<Kind> = KINDS.to_vec();
    if let Some(only) = &only {
        kinds.retain(|k| only.iter().any(|o| o == k.name()));
    }
    if kinds.is_empty() {
        eprintln!("chaos shards sidecar: no kind of KUBE_LEADER_CHAOS_ONLY applies; idle");
        return;
    }
    let ms = Duration::from_millis;
    let (t, shards) = match long {
        true => (
            Timings {
                lease: ms(1000),
                renew: ms(600),
                retry: ms(100),
            },
            16,
        ),
        false => (
            Timings {
                lease: ms(2000),
                renew: ms(1000),
                retry: ms(200),
            },
            8,
        ),
    };
    // Long mode: draws among the kinds still short of their share of the target.
    let per_kind = target.div_ceil(kinds.len());
    let names: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
    let mode = if long { "long" } else { "CI" };
    eprintln!("chaos shards sidecar: seed {seed:#x}, {mode} mode, {shards} shards, kinds {names:?}, {per_kind} transitions per kind (long mode)");
    let cp = tokio::task::spawn_blocking(ControlPlane::start)
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("a private control plane is needed: {e}"));
    let ns = cp.namespace().await;
    let dir = std::env::temp_dir().join(format!("kube-leader-shard-chaos-sidecar-{}", std::process::id()));
    let command = env!("CARGO_BIN_EXE_shard-command");
    let programs = Programs {
        kube_leader: kube_leader_e2e::kube_leader_bin_beside(command),
        command: PathBuf::from(command),
    };
    let fleet = SidecarFleet::new(programs, ns.name(), "side", shards, t, &dir);
    let slots = (0..REPLICAS)
        .map(|_| {
            let proxy = FaultProxy::to_apiserver(&cp).expect("a fault proxy");
            let kubeconfig = proxy.write_kubeconfig(&cp, ADMIN).expect("a kubeconfig");
            Slot {
                proxy,
                kubeconfig,
                generation: 0,
                key: String::new(),
            }
        })
        .collect();
    let mut arena = Arena {
        fleet,
        slots,
        rng: Rng::stream(seed, "sidecars"),
        t,
        faults: Vec::new(),
        pauses: Vec::new(),
        kinds: BTreeMap::new(),
    };
    let began = mono_ns();
    for slot in 0..REPLICAS {
        arena.start(slot);
    }
    let first = arena.settle("the start").await;
    eprintln!(
        "chaos shards sidecar: fair after {first:?}; logs in {}",
        dir.display()
    );
    let clock = Instant::now();
    let bound = arena.settle_bound();
    let mut slow = Vec::new();
    let mut order = kinds.clone();
    arena.rng.shuffle(&mut order);
    let mut last = Instant::now();
    loop {
        let kind = if long {
            let short: Vec<(Kind, u32)> = kinds
                .iter()
                .filter(|k| arena.kinds.get(k).is_none_or(|p| p.transitions < per_kind))
                .map(|k| (*k, 1))
                .collect();
            if short.is_empty() {
                break;
            }
            arena.rng.weighted(&short)
        } else {
            match order.pop() {
                Some(k) => k,
                None => break,
            }
        };
        let before = arena.fleet.transitions;
        arena.inject(kind).await;
        let took = arena.settle(kind.name()).await;
        if took > bound {
            slow.push(format!("{} took {took:?}", kind.name()));
        }
        let e = arena.kinds.entry(kind).or_default();
        e.transitions += arena.fleet.transitions - before;
        e.settle.push(took);
        if last.elapsed() > Duration::from_secs(60) {
            let sums: Vec<String> = arena
                .kinds
                .iter()
                .map(|(k, p)| format!("{} {}/{}", k.name(), p.draws, p.transitions))
                .collect();
            eprintln!("chaos shards sidecar: {:?}: {}", clock.elapsed(), sums.join(", "));
            last = Instant::now();
        }
    }
    arena.fleet.sleep(Duration::from_millis(300)).await;
    let until = mono_ns();
    check(
        &arena,
        seed,
        long,
        shards,
        began,
        until,
        clock.elapsed(),
        &dir,
        &slow,
        bound,
    );
    if std::env::var_os("KUBE_LEADER_CHAOS_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[allow(clippy::too_many_arguments)]
fn check(
    arena: &Arena,
    seed: u64,
    long: bool,
    shards: u32,
    began: u64,
    until: u64,
    took: Duration,
    dir: &Path,
    slow: &[String],
    bound: Duration,
) {
    let t = arena.t;
    let (mut unexplained, mut post_pause, mut regressions, mut malformed) = (vec![], vec![], vec![], vec![]);
    let mut terms = 0;
    for (shard, history) in arena.fleet.histories() {
        let f = Analysis {
            history,
            writes: &[],
            faults: &arena.faults,
            pauses: &arena.pauses,
            deposed: &[],
            from: began,
            until,
        }
        .run();
        terms += f.report.terms;
        malformed.extend(f.report.malformed.iter().map(|m| format!("shard {shard}: {m}")));
        unexplained.extend(
            f.unexplained_overlaps
                .iter()
                .map(|o| format!("shard {shard}: {o}")),
        );
        post_pause.extend(f.post_pause_overlaps.iter().map(|o| (*shard, o.clone())));
        regressions.extend(
            f.token_regressions
                .iter()
                .map(|(a, b)| format!("shard {shard}: {a:?} then {b:?}")),
        );
    }
    eprintln!(
        "== chaos shards sidecar (seed {seed:#x}, {} mode, {shards} shards, lease {:?}/{:?}/{:?}, \
         {took:?} of faults): terms {terms}, transitions {}, overlaps outside post-pause windows {}, \
         post-pause overlaps {} (longest {:?}), token regressions {}, settle bound {bound:?}, exits {:?}",
        if long { "long" } else { "CI" },
        t.lease,
        t.renew,
        t.retry,
        arena.fleet.transitions,
        unexplained.len(),
        post_pause.len(),
        post_pause.iter().map(|(_, o)| o.span.duration()).max(),
        regressions.len(),
        arena
            .fleet
            .exits
            .values()
            .fold(BTreeMap::<&str, usize>::new(), |mut m, e| {
                *m.entry(e.as_str()).or_default() += 1;
                m
            }),
    );
    for (kind, p) in &arena.kinds {
        eprintln!(
            "   {:<16} draws {:>4}, transitions {:>5}, delays {}, back to fair {}",
            kind.name(),
            p.draws,
            p.transitions,
            spread(&p.delays),
            spread(&p.settle)
        );
    }
    assert!(
        malformed.is_empty(),
        "sidecars: malformed histories: {malformed:?}"
    );
    assert!(
        unexplained.is_empty(),
        "sidecars: a shard worked by two COMMANDs at once outside post-pause windows (logs {}):\n{}",
        dir.display(),
        unexplained.join("\n")
    );
    for (shard, o) in &post_pause {
        assert!(
            o.span.duration() <= POST_PAUSE_BOUND,
            "sidecars: shard {shard} worked beside its successor for {:?} after a pause: {o}",
            o.span.duration()
        );
    }
    assert!(
        regressions.is_empty(),
        "sidecars: fencing token regressions: {regressions:?}"
    );
    let delays = |k: Kind| arena.kinds.get(&k).map_or(&[][..], |p| p.delays.as_slice());
    for d in delays(Kind::KillKubeLeader) {
        assert!(
            *d <= t.renew + SLACK,
            "sidecars: COMMAND of a killed kube-leader gone {d:?} after the kill (renew deadline {:?})",
            t.renew
        );
    }
    for d in delays(Kind::StopGroup) {
        assert!(
            *d <= t.renew + SLACK,
            "sidecars: COMMAND of a stopped process group stopped {d:?} after the stop (renew deadline {:?})",
            t.renew
        );
    }
    for d in delays(Kind::Pause) {
        assert!(
            *d <= POST_PAUSE_BOUND,
            "sidecars: COMMAND of a thawed replica gone {d:?} after the thaw (bound {POST_PAUSE_BOUND:?})"
        );
    }
    assert!(
        slow.is_empty(),
        "sidecars: back to a fair spread later than {bound:?}: {slow:?}"
    );
}
