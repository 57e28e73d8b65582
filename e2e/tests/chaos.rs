//! Chaos runs (issue 5): five candidates per strategy, as library processes (`chaos-candidate`)
//! and as real `kube-leader run` processes (COMMAND: `chaos-candidate child`), under a seeded
//! schedule of faults, checked exactly.
//!
//! Each strategy has a private control plane (kube-apiserver is restarted) and two sets of five
//! candidates that run at the same time on two locks: library candidates and `kube-leader run`
//! candidates. Each candidate reaches the API server through a fault proxy of its own. Every
//! leader writes its fencing token to a fenced ledger (a ConfigMap written by compare-and-swap,
//! see `kube_leader_e2e::chaos::Ledger`) as soon as it leads and then periodically.
//!
//! Faults (the CI mode draws each applicable kind once, in a seeded order; the long mode draws
//! kinds by weight until the transitions reach a target):
//!
//! - `kill`: SIGKILL of the leader, all its processes; a fresh candidate replaces it.
//! - `kill-kube-leader`: SIGKILL of the `kube-leader` process only: its supervisor must stop
//!   COMMAND.
//! - `pause`: SIGSTOP of every process of the leader (`kube-leader run`: the process groups of
//!   kube-leader, its supervisor and COMMAND) for longer than the lease (leader for life: while
//!   its Pod or its lock is deleted), until another leader has written the ledger, then SIGCONT
//!   (COMMAND first). The resumed leader may act until it learns it lost (the post-pause window,
//!   at most [`POST_PAUSE_BOUND`] beside its successor); its writes then must be refused by
//!   fencing. The only fault with a post-pause window (and `acquire-pause`, the same freeze of a
//!   follower): the only ones that freeze every process able to stop COMMAND.
//! - `freeze-kube-leader`: SIGSTOP of the `kube-leader` process only (not its supervisor, not
//!   COMMAND): the supervisor must stop COMMAND by the renew deadline; the delay is measured.
//! - `kill-supervisor`: SIGKILL of the leader's supervisor only: COMMAND must die with it at once
//!   (parent-death signal) and nothing be released (a lease expires; a leader-for-life lock
//!   stays with the Pod, and the restarted candidate leads again); the delay is measured.
//! - `deaf-command` (lease): the leader's COMMAND is made to ignore SIGTERM (SIGUSR1 to
//!   `chaos-candidate child`), then the leader is cut off: COMMAND must be SIGKILLed by the lease
//!   duration after its last renewal (default grace = lease − renew deadline), before any
//!   successor leads; the delay from the cut is measured.
//! - `pause-acquiring` (lease): the leader is stopped gracefully (it releases) and a follower's
//!   `kube-leader` is frozen for half to twice the renew deadline while it takes over; a term
//!   won before or during the freeze must not start (or keep) COMMAND past the renew deadline
//!   counted from the acquiring write.
//! - `partition` / `partition-follower`: the proxy of the leader / of a follower blackholes
//!   everything, then heals.
//! - `delay`: the leader's proxy delays every chunk past the renew deadline, then heals.
//! - `apiserver-restart`: kube-apiserver killed and started again on the same etcd.
//! - `lock-delete`: an administrator deletes the lock.
//! - `sigterm`: the leader is asked to stop (a rolling update): it releases.
//! - Lease: `twin` (a follower is replaced by a candidate with the leader's identity, as a
//!   copied `--identity` would do: it must not lead while the leader renews), `acquire-pause`
//!   (the leader is asked to stop and a follower is paused right away, past the lease, so that
//!   an acquiring write may be answered after its renew deadline: that term must not start).
//! - `stop-group` (`kube-leader run`, issue 21): SIGSTOP or SIGTSTP (Ctrl-Z) of kube-leader's
//!   process group (`kill -STOP -PGID`; the supervisor and COMMAND have groups of their own):
//!   the supervisor must stop COMMAND by the renew deadline; 0 overlap.
//! - `stop-supervisor` (`kube-leader run`, lease, issue 21): SIGSTOP of the leader's supervisor
//!   alone, then the leader cut off (its proxy blackholed): kube-leader's backstop must kill
//!   COMMAND by the last confirmed instant + grace, before a successor leads; 0 overlap.
//! - `stall` (`kube-leader run`, issue 21): the leader's proxy accepts and never answers, and
//!   its open connections (watches) go silent (lease: past the lease; leader for life: 1-3 s),
//!   then heals: the client's liveness bounds must notice; 0 overlap, and a leader is back
//!   within the liveness bound.
//! - leader for life: `pod-delete` (the leader's Pod deleted, its process alive: no kubelet),
//!   `evict` (the leader's Pod `Failed`/`Evicted`), `evict-then-kill` (issue 21: the 1.20
//!   kubelet's order, the Pod `Failed`/`Evicted` by a status write while the candidate runs,
//!   its processes killed 0.1-2 s later; the leader must step down on its own and no successor
//!   lead before: 0 overlap), `recreate` (the leader's Pod deleted and
//!   created again under the same name, with a new candidate in it while the old process runs),
//!   `kill-then-pod-delete` (the leader's processes killed, then its Pod deleted, as a kubelet
//!   would).
//!
//! The checker: terms are the library's `[became leader, lost]` and, for `kube-leader run`, the
//! life of COMMAND, on CLOCK_MONOTONIC, with frozen spans cut out. Overlaps must be none except
//! in the window after a whole-candidate pause (each at most [`POST_PAUSE_BOUND`]), and (leader
//! for life, which has no lease) while a leader whose lock someone else deleted (`lock-delete`,
//! or the garbage collector after `pod-delete`/`recreate`) with its process running has not yet
//! heard of it from its watch: those are measured and reported. An evicted leader for life
//! deletes its lock itself: no overlap is allowed there. The fencing token must grow from leader to leader; every write in a
//! post-pause window must be refused, and no deposed leader's write accepted after its
//! successor's; after every fault, a leader must be back within the bound the configuration
//! implies.
//!
//! `KUBE_LEADER_CHAOS=long` runs the long mode until the two sets of candidates of a strategy
//! have made `KUBE_LEADER_CHAOS_TRANSITIONS` (default 1000) leadership transitions together, with
//! lease timings of 1 s / 600 ms / 100 ms; `KUBE_LEADER_CHAOS_SEED` overrides the seed (printed);
//! `KUBE_LEADER_CHAOS_KEEP` keeps the logs and timelines; `KUBE_LEADER_CHAOS_MAX_SECS` (default
//! 3600) ends the run early; `KUBE_LEADER_CHAOS_ONLY=stop-group,stall,...` draws only the kinds
//! named (a set of candidates to which none applies idles). The runs need
//! `kube-leader` built (`cargo build -p kube-leader-cli`; `cargo test --workspace` builds it).

use std::{
    collections::BTreeMap,
    fs,
    io::{BufRead, BufReader},
    os::unix::process::{CommandExt, ExitStatusExt},
    path::PathBuf,
    process::{Child, Command, ExitStatus, Stdio},
    sync::{mpsc as std_mpsc, Arc, Mutex, OnceLock},
    time::Duration,
};

use k8s_openapi::api::{coordination::v1::Lease, core::v1::ConfigMap, core::v1::Pod};
use kube::{
    api::{DeleteParams, PostParams},
    Api, Client,
};
use kube_leader_e2e::{
    chaos::{
        seed_from_env, Analysis, Deposition, Fault, Findings, Ledger, Model, Pause, Rng, Steps, TraceCheck,
        Write, WriteOutcome,
    },
    checker::History,
    mono_ns,
};
use kube_leader_testenv::{
    pod, set_pod_phase, ControlPlane, Fault as NetFault, FaultProxy, TestNamespace, ADMIN,
};
use nix::{
    sys::signal::{kill, killpg, Signal},
    unistd::Pid,
};
use serde_json::Value;
use tokio::{sync::mpsc, time::Instant};

const CANDIDATES: usize = 5;
/// The seed of the CI mode.
const DEFAULT_SEED: u64 = 0x6b75_6265_6c65_6164;
/// How long a candidate whose process ended waits before a fresh one replaces it.
const RESTART_DELAY: Duration = Duration::from_millis(300);
/// What the controller-manager's garbage collector may take to delete the lock of a deleted
/// leader Pod, on a loaded machine (not configurable: the liveness bound of leader for life).
const GC_ALLOWANCE: Duration = Duration::from_secs(5);
/// `terminationGracePeriodSeconds` of the candidates' Pods. Leader for life takes over a Pod
/// that vanished without a graceful deletion (the harness force-deletes) or turned terminal
/// without its leader's release only after this grace plus the library's 2 s kill margin, by
/// the candidate's clock (a killed or frozen leader; docs/library.md): the kubelet's minimum,
/// rather than the default 30 s, keeps the run short.
const POD_GRACE_SECS: i64 = 2;
/// The wait that grace proof implies: [`POD_GRACE_SECS`] + the library's 2 s kill margin.
const PROOF_WAIT: Duration = Duration::from_secs(POD_GRACE_SECS as u64 + 2);
/// Scheduling slack for the liveness bound (2-core machine shared with builds).
const SLACK: Duration = Duration::from_secs(1);
/// Leader for life, after a restart of kube-apiserver: how long before the lock is taken from a
/// living leader. The watches come back with kube-runtime's backoff (0.8 s doubling), and a
/// leader for life learns that its lock is gone only from its watch, or from its fallback reads
/// (every backoff cap at most); until then it would lead beside the next leader. (A Lease leader
/// learns it from its renewals, and the others wait its lease out.)
const WATCH_SETTLE: Duration = Duration::from_secs(12);
/// The longest a resumed leader may act beside its successor after a pause of its whole tree
/// (issue 21: a frozen tree that thaws after the deadline kills COMMAND before anything else).
/// Measured: 12–16 ms at worst over 1,000 transitions, once 50.5 ms in a test-command run on a
/// loaded, slow day (the thaw's own scheduling); the behaviour this bounds is "stopped at the
/// thaw", far below the renew deadline (600 ms, leader for life 1 s) that a supervisor which
/// waited for its deadline would take, so the bound leaves room for the machine.
const POST_PAUSE_BOUND: Duration = Duration::from_millis(150);
/// Generous bound for things that happen "at once".
const SOON: Duration = Duration::from_secs(30);

// === configuration ===

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strategy {
    Lease,
    ForLife,
}

impl Strategy {
    fn as_str(self) -> &'static str {
        match self {
            Strategy::Lease => "lease",
            Strategy::ForLife => "for-life",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavor {
    /// `chaos-candidate lease|for-life`.
    Library,
    /// `kube-leader run -- chaos-candidate child`.
    Cli,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Kill,
    KillKubeLeader,
    Pause,
    FreezeKubeLeader,
    Partition,
    PartitionFollower,
    Delay,
    ApiserverRestart,
    LockDelete,
    Sigterm,
    PodDelete,
    Evict,
    Recreate,
    KillThenPodDelete,
    Twin,
    AcquirePause,
    KillSupervisor,
    DeafCommand,
    PauseAcquiring,
    StopGroup,
    StopSupervisor,
    Stall,
    EvictThenKill,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Kill => "kill",
            Kind::KillKubeLeader => "kill-kube-leader",
            Kind::Pause => "pause",
            Kind::FreezeKubeLeader => "freeze-kube-leader",
            Kind::Partition => "partition",
            Kind::PartitionFollower => "partition-follower",
            Kind::Delay => "delay",
            Kind::ApiserverRestart => "apiserver-restart",
            Kind::LockDelete => "lock-delete",
            Kind::Sigterm => "sigterm",
            Kind::PodDelete => "pod-delete",
            Kind::Evict => "evict",
            Kind::Recreate => "recreate",
            Kind::KillThenPodDelete => "kill-then-pod-delete",
            Kind::Twin => "twin",
            Kind::AcquirePause => "acquire-pause",
            Kind::KillSupervisor => "kill-supervisor",
            Kind::DeafCommand => "deaf-command",
            Kind::PauseAcquiring => "pause-acquiring",
            Kind::StopGroup => "stop-group",
            Kind::StopSupervisor => "stop-supervisor",
            Kind::Stall => "stall",
            Kind::EvictThenKill => "evict-then-kill",
        }
    }

    /// The kinds that apply, with their weights in the long mode. `restarts`: whether this set
    /// of candidates restarts kube-apiserver (one set per control plane in the CI mode).
    fn applicable(strategy: Strategy, flavor: Flavor, restarts: bool) -> Vec<(Kind, u32)> {
        let cli = flavor == Flavor::Cli;
        let mut kinds = match strategy {
            Strategy::Lease => vec![
                (Kind::Kill, 6),
                (Kind::Pause, 4),
                (Kind::Partition, 4),
                (Kind::PartitionFollower, 2),
                (Kind::Delay, 2),
                (Kind::LockDelete, 4),
                (Kind::Sigterm, 10),
                (Kind::Twin, 2),
                (Kind::AcquirePause, 3),
            ],
            Strategy::ForLife => vec![
                (Kind::KillThenPodDelete, 6),
                (Kind::PodDelete, 6),
                (Kind::Evict, 6),
                (Kind::EvictThenKill, 6),
                (Kind::Recreate, 4),
                (Kind::LockDelete, 6),
                (Kind::Sigterm, 10),
                (Kind::Pause, 4),
                (Kind::Partition, 1),
                (Kind::Delay, 1),
            ],
        };
        if cli {
            kinds.push((Kind::FreezeKubeLeader, 2));
            kinds.push((Kind::KillSupervisor, 2));
            kinds.push((Kind::StopGroup, 4));
            kinds.push((Kind::Stall, 4));
            if strategy == Strategy::Lease {
                // Leader for life has no confirmed-until for kube-leader's backstop to enforce.
                kinds.push((Kind::StopSupervisor, 4));
                kinds.push((Kind::KillKubeLeader, 4));
                // Leader for life has no lease for a grace to stay within: a successor may
                // start as soon as the lock is gone.
                kinds.push((Kind::DeafCommand, 2));
                kinds.push((Kind::PauseAcquiring, 2));
            }
        }
        if restarts {
            kinds.push((Kind::ApiserverRestart, 1));
        }
        kinds
    }

    /// Faults after which the leader they aimed at must have stopped leading.
    fn deposes(self, strategy: Strategy) -> bool {
        match self {
            Kind::PartitionFollower | Kind::ApiserverRestart | Kind::Twin => false,
            Kind::Partition | Kind::Delay | Kind::Stall => strategy == Strategy::Lease,
            _ => true,
        }
    }

    /// Leader for life: faults that end a living leader's term through its watch (its Pod or
    /// lock changed under it): they wait until the watches are back from a kube-apiserver
    /// restart.
    fn deposes_through_the_watch(self) -> bool {
        matches!(
            self,
            Kind::LockDelete | Kind::PodDelete | Kind::Evict | Kind::Recreate | Kind::EvictThenKill
        )
    }

    /// Leader for life: faults whose lock the garbage collector deletes after the leader's Pod
    /// was deleted, with no kubelet to stop its process: the leader learns it from its watch
    /// while a successor may lead (see [`Deposition`]). Neither an eviction (the leader's own
    /// Pod turned terminal: it stops COMMAND and deletes the lock itself) nor `lock-delete` (a
    /// lock deleted under a live leader: the successor waits for the leader's word that its
    /// work stopped, Safety IV) is one of them: no successor may lead before (0 overlap,
    /// asserted).
    fn deletes_under_a_live_leader(self) -> bool {
        matches!(self, Kind::PodDelete | Kind::Recreate)
    }
}

#[derive(Debug, Clone, Copy)]
struct Timings {
    lease: Duration,
    renew: Duration,
    retry: Duration,
    /// How often a leader writes the ledger.
    write: Duration,
}

impl Timings {
    fn ms(d: Duration) -> String {
        d.as_millis().to_string()
    }
}

/// The run's mode, from the environment.
#[derive(Debug, Clone, Copy)]
struct Mode {
    long: bool,
    seed: u64,
    /// Long mode: transitions the run must reach (both sets of candidates together).
    target: usize,
    /// Long mode: give up after this long.
    max: Duration,
    /// Long mode: draw only these kinds (by name), from `KUBE_LEADER_CHAOS_ONLY` (commas).
    only: Option<&'static [String]>,
}

impl Mode {
    fn from_env() -> Self {
        let long = std::env::var("KUBE_LEADER_CHAOS").is_ok_and(|v| v == "long");
        Self {
            long,
            seed: seed_from_env("KUBE_LEADER_CHAOS_SEED", DEFAULT_SEED),
            target: std::env::var("KUBE_LEADER_CHAOS_TRANSITIONS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1000),
            max: Duration::from_secs(
                std::env::var("KUBE_LEADER_CHAOS_MAX_SECS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(3600),
            ),
            only: std::env::var("KUBE_LEADER_CHAOS_ONLY").ok().map(|v| {
                let kinds: Vec<String> = v.split(',').map(|k| k.trim().to_string()).collect();
                &*Vec::leak(kinds)
            }),
        }
    }

    fn timings(&self) -> Timings {
        if self.long {
            Timings {
                lease: Duration::from_millis(1000),
                renew: Duration::from_millis(600),
                retry: Duration::from_millis(100),
                write: Duration::from_millis(100),
            }
        } else {
            Timings {
                lease: Duration::from_millis(2000),
                renew: Duration::from_millis(1000),
                retry: Duration::from_millis(200),
                write: Duration::from_millis(200),
            }
        }
    }
}

// === processes ===

/// Spawns `command` under `setpriv --pdeathsig KILL` from one long-lived thread, so that the
/// candidate dies with the test binary however it ends (`PR_SET_PDEATHSIG` follows the thread
/// that forked). As testenv does for the control plane.
fn spawn(command: Command) -> std::io::Result<Child> {
    type Request = (Command, std_mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<std_mpsc::Sender<Request>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = std_mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("chaos-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("spawner thread");
        Mutex::new(tx)
    });
    let (reply, result) = std_mpsc::channel();
    spawner
        .lock()
        .unwrap()
        .send((command, reply))
        .map_err(|_| std::io::Error::other("spawner gone"))?;
    result.recv().map_err(|_| std::io::Error::other("spawner gone"))?
}

/// `(state, ppid)` of a process, from `/proc/<pid>/stat`.
fn proc_stat(pid: i32) -> Option<(char, i32)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    let mut f = rest.split_whitespace();
    Some((f.next()?.chars().next()?, f.next()?.parse().ok()?))
}

/// Whether `pid` runs (a zombie does not).
fn process_alive(pid: i32) -> bool {
    proc_stat(pid).is_some_and(|(state, _)| state != 'Z')
}

/// The parent of `pid` (0 if unknown).
fn parent_of(pid: i32) -> i32 {
    proc_stat(pid).map_or(0, |(_, ppid)| ppid)
}

/// `chaos-candidate`; `KUBE_LEADER_CHAOS_BIN_DIR` runs copies (`chaos-candidate` and
/// `kube-leader` in that directory), so that a long run is not disturbed by a rebuild.
fn chaos_candidate_bin() -> String {
    match std::env::var("KUBE_LEADER_CHAOS_BIN_DIR") {
        Ok(dir) => format!("{dir}/chaos-candidate"),
        Err(_) => env!("CARGO_BIN_EXE_chaos-candidate").to_string(),
    }
}

fn kube_leader_bin() -> PathBuf {
    kube_leader_e2e::kube_leader_bin_beside(&chaos_candidate_bin())
}

/// One line of a candidate's stdout, or the end of it.
#[derive(Debug)]
enum Line {
    Event(usize, Value),
    Eof(usize),
}

/// A candidate process.
#[derive(Debug)]
struct Proc {
    /// Its name in the history: unique in the run.
    key: String,
    /// Its identity: the Lease holder, or its Pod.
    name: String,
    slot: usize,
    child: Child,
    pid: i32,
    /// `kube-leader run`: COMMAND's pid (its process group), once it started.
    command_pid: Option<i32>,
    status: Option<ExitStatus>,
    exited_at: Option<u64>,
    eof: bool,
    /// When the harness killed it (its term ends there).
    killed_at: Option<u64>,
    finalized: bool,
    log: PathBuf,
}

impl Proc {
    fn alive(&self) -> bool {
        self.status.is_none()
    }
}

#[derive(Debug)]
struct Slot {
    proxy: FaultProxy,
    kubeconfig: PathBuf,
    generation: u32,
    current: Option<usize>,
    restart_at: Option<Instant>,
    /// A fault owns the slot: do not restart its candidate yet.
    hold: bool,
}

/// What the sets of candidates of one control plane share.
struct Shared {
    cp: ControlPlane,
    token: String,
    /// Faults of both sets of candidates run side by side (they touch different locks), but a
    /// restart of kube-apiserver, which both live through, runs alone: faults hold this for
    /// reading, a restart for writing.
    gate: tokio::sync::RwLock<()>,
    /// Whether kube-apiserver is down for a restart now. A writer merely waiting for `gate`
    /// must not stop the other set from restarting its candidates: that set may be inside a
    /// fault that needs a restarted candidate to end, and the writer waits for that fault.
    restarting: std::sync::atomic::AtomicBool,
    /// kube-apiserver restarts, which every set of candidates lives through.
    restarts: Mutex<Vec<Fault>>,
    /// Long mode: the transitions of each set of candidates so far (the run stops when their sum
    /// reaches the target).
    transitions: Mutex<BTreeMap<String, usize>>,
}

/// How long an administrator's call is retried while the API server cannot be reached: a
/// restart of kube-apiserver may take long on a loaded machine (testenv waits up to 60 s).
const API_OUTAGE: Duration = Duration::from_secs(90);

/// Runs an administrator's call, again while the API server cannot be reached or answers with
/// a 5xx (the other set of candidates may be restarting it), for up to [`API_OUTAGE`].
async fn retried<T, F, Fut>(what: &str, mut call: F) -> kube::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = kube::Result<T>>,
{
    let deadline = Instant::now() + API_OUTAGE;
    loop {
        match call().await {
            Err(e) if !matches!(&e, kube::Error::Api(s) if s.code < 500) && Instant::now() < deadline => {
                eprintln!("{what}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            result => return result,
        }
    }
}

// === the arena ===

/// One set of five candidates on one lock, and everything observed about them.
struct Arena {
    name: String,
    strategy: Strategy,
    flavor: Flavor,
    timings: Timings,
    mode: Mode,
    shared: Arc<Shared>,
    ns: TestNamespace,
    admin: Client,
    lock: String,
    dir: PathBuf,
    rng: Rng,
    slots: Vec<Slot>,
    procs: Vec<Proc>,
    tx: mpsc::UnboundedSender<Line>,
    rx: mpsc::UnboundedReceiver<Line>,
    history: History,
    writes: Vec<Write>,
    /// Writes started whose outcome was not (yet) reported: (key, start) → token.
    unreported: BTreeMap<(String, u64), u64>,
    faults: Vec<Fault>,
    pauses: Vec<Pause>,
    /// Leader for life: leaders deposed while their process ran on.
    deposed: Vec<Deposition>,
    /// `freeze-kube-leader`: from the freeze to COMMAND's stop.
    freeze_stops: Vec<Duration>,
    /// `kill-kube-leader`: from the kill to COMMAND's stop.
    orphan_stops: Vec<Duration>,
    /// `kill-supervisor`: from the kill to COMMAND's death.
    supervisor_kill_stops: Vec<Duration>,
    /// `deaf-command`: from cutting the leader off to its deaf COMMAND's death.
    deaf_kills: Vec<Duration>,
    /// `stop-group`: from stopping kube-leader's process group to COMMAND's stop.
    group_stops: Vec<Duration>,
    /// `stop-supervisor`: from cutting off the leader whose supervisor is stopped to COMMAND's
    /// death (kube-leader's backstop).
    backstop_kills: Vec<Duration>,
    /// `evict-then-kill`: from the eviction's status write to the end of the leader's term, if
    /// it stepped down before the kill.
    evict_stepdowns: Vec<Option<Duration>>,
    /// Terms whose end the harness had to infer (the process died without saying).
    inferred_ends: Vec<String>,
    errors: Vec<String>,
    exit_codes: BTreeMap<String, usize>,
    leaked: Arc<Mutex<Vec<String>>>,
    started: u64,
    /// Library candidates: their decision steps, and their replay (issue 43).
    steps: Steps,
    trace: Option<TraceCheck>,
}

impl Drop for Arena {
    fn drop(&mut self) {
        for p in &mut self.procs {
            if p.status.is_none() {
                let _ = killpg(Pid::from_raw(p.pid), Signal::SIGKILL);
                if let Some(c) = p.command_pid {
                    let _ = killpg(Pid::from_raw(c), Signal::SIGKILL);
                }
                let _ = p.child.kill();
                let _ = p.child.wait();
            }
        }
    }
}

impl Arena {
    async fn new(shared: Arc<Shared>, strategy: Strategy, flavor: Flavor, mode: Mode) -> Self {
        let cp = &shared.cp;
        let name = format!(
            "{}-{}",
            strategy.as_str(),
            match flavor {
                Flavor::Library => "library",
                Flavor::Cli => "kube-leader-run",
            }
        );
        let ns = cp.namespace().await;
        let admin = cp.client().await;
        let ledger = Ledger::new(admin.clone(), ns.name(), Duration::from_secs(10));
        retried("creating the ledger", || ledger.create())
            .await
            .expect("create the ledger");
        let dir = std::env::temp_dir().join(format!("kube-leader-chaos-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let slots = (0..CANDIDATES)
            .map(|_| {
                let proxy = FaultProxy::to_apiserver(cp).expect("a fault proxy");
                let kubeconfig = proxy.write_kubeconfig(cp, ADMIN).expect("a kubeconfig");
                Slot {
                    proxy,
                    kubeconfig,
                    generation: 0,
                    current: None,
                    restart_at: None,
                    hold: false,
                }
            })
            .collect();
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            rng: Rng::stream(mode.seed, &name),
            name,
            strategy,
            flavor,
            timings: mode.timings(),
            mode,
            shared,
            ns,
            admin,
            lock: "chaos".into(),
            dir,
            slots,
            procs: Vec::new(),
            tx,
            rx,
            history: History::new(),
            writes: Vec::new(),
            unreported: BTreeMap::new(),
            faults: Vec::new(),
            pauses: Vec::new(),
            deposed: Vec::new(),
            freeze_stops: Vec::new(),
            orphan_stops: Vec::new(),
            supervisor_kill_stops: Vec::new(),
            deaf_kills: Vec::new(),
            group_stops: Vec::new(),
            backstop_kills: Vec::new(),
            evict_stepdowns: Vec::new(),
            inferred_ends: Vec::new(),
            errors: Vec::new(),
            exit_codes: BTreeMap::new(),
            leaked: Arc::default(),
            started: mono_ns(),
            steps: Steps::default(),
            trace: None,
        }
    }

    fn prefix(&self) -> &'static str {
        match self.flavor {
            Flavor::Library => "lib",
            Flavor::Cli => "cli",
        }
    }

    /// The longest a leader may be missing after a fault ended, by the configuration.
    fn liveness_bound(&self) -> Duration {
        let t = self.timings;
        match self.strategy {
            // A follower waits out the lease from its last observation, a takeover write may
            // hang for the API timeout (the renew deadline), retries come every retry period.
            Strategy::Lease => t.lease + t.renew + 2 * t.retry + SLACK,
            // The garbage collector deletes a dead leader's lock; a waiting candidate waits for
            // the proof that the dead leader's containers are gone (its grace period, for a
            // force-deleted Pod); a waiting candidate whose watch failed re-reads within the
            // backoff cap (2 s for the library candidates,
            // kube-leader's default 16 s); a frozen kube-leader's COMMAND restarts.
            Strategy::ForLife => {
                let cap = match self.flavor {
                    Flavor::Library => Duration::from_secs(2),
                    Flavor::Cli => Duration::from_secs(16),
                };
                GC_ALLOWANCE + PROOF_WAIT + cap + RESTART_DELAY + SLACK
            }
        }
    }

    // --- starting candidates ---

    /// Starts a candidate in `slot`, in the Pod `reuse` (leader for life) or a new one.
    async fn start(&mut self, slot: usize, reuse: Option<String>) {
        self.slots[slot].generation += 1;
        let generation = self.slots[slot].generation;
        let fresh = format!("{}{}-{generation}", self.prefix(), slot + 1);
        let (name, key) = match self.strategy {
            // `reuse`: a twin, with another candidate's identity (the key stays unique).
            Strategy::Lease => match reuse {
                Some(identity) => (identity.clone(), format!("{fresh}-twin-of-{identity}")),
                None => (fresh.clone(), fresh),
            },
            Strategy::ForLife => {
                let pod_name = match reuse {
                    Some(p) => p,
                    None => {
                        self.create_pod(&fresh).await;
                        fresh
                    }
                };
                let key = format!("{pod_name}@{generation}");
                (pod_name, key)
            }
        };
        let t = self.timings;
        let me = &chaos_candidate_bin();
        let kubeconfig = self.slots[slot].kubeconfig.display().to_string();
        let ns = self.ns.name().to_string();
        let mut command = Command::new("setpriv");
        command.args(["--pdeathsig", "KILL", "--"]);
        match self.flavor {
            Flavor::Library => {
                command.arg(me);
                match self.strategy {
                    Strategy::Lease => command.args([
                        "lease",
                        &kubeconfig,
                        &ns,
                        &self.lock,
                        &name,
                        &Timings::ms(t.lease),
                        &Timings::ms(t.renew),
                        &Timings::ms(t.retry),
                        &Timings::ms(t.write),
                    ]),
                    Strategy::ForLife => command.args([
                        "for-life",
                        &kubeconfig,
                        &ns,
                        &self.lock,
                        &name,
                        &Timings::ms(t.write),
                    ]),
                };
                command.env("RUST_LOG", "kube_leader=info");
            }
            Flavor::Cli => {
                let grace = match self.strategy {
                    Strategy::Lease => t.lease - t.renew,
                    Strategy::ForLife => Duration::from_secs(1),
                };
                command
                    .arg(kube_leader_bin())
                    .args([
                        "run",
                        "--log-format",
                        "json",
                        "--lock",
                        &self.lock,
                        "--namespace",
                        &ns,
                        "--strategy",
                        self.strategy.as_str(),
                        "--identity",
                        &name,
                        "--lease-duration",
                        &format!("{}ms", t.lease.as_millis()),
                        "--renew-deadline",
                        &format!("{}ms", t.renew.as_millis()),
                        "--retry-period",
                        &format!("{}ms", t.retry.as_millis()),
                        "--grace",
                        &format!("{}ms", grace.as_millis()),
                        "--connect-timeout",
                        "60s",
                        "--",
                        me,
                        "child",
                        &Timings::ms(t.write),
                    ])
                    .env("KUBECONFIG", &kubeconfig)
                    .env("POD_NAME", &name);
            }
        }
        let log = self.dir.join(format!("{}.log", key.replace('@', "-")));
        command
            .env_remove("POD_NAMESPACE")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(fs::File::create(&log).unwrap())
            .process_group(0);
        let mut child = spawn(command).expect("start a candidate");
        let index = self.procs.len();
        let stdout = child.stdout.take().unwrap();
        let (tx, leaked, token) = (self.tx.clone(), self.leaked.clone(), self.shared.token.clone());
        let label = key.clone();
        std::thread::Builder::new()
            .name(format!("chaos-{key}"))
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if line.contains(&token) {
                        leaked.lock().unwrap().push(format!("{label} stdout: {line}"));
                    }
                    if let Ok(v) = serde_json::from_str::<Value>(&line) {
                        let _ = tx.send(Line::Event(index, v));
                    }
                }
                let _ = tx.send(Line::Eof(index));
            })
            .unwrap();
        self.procs.push(Proc {
            key,
            name,
            slot,
            pid: child.id() as i32,
            child,
            command_pid: None,
            status: None,
            exited_at: None,
            eof: false,
            killed_at: None,
            finalized: false,
            log,
        });
        self.slots[slot].current = Some(index);
        self.slots[slot].restart_at = None;
    }

    async fn create_pod(&self, name: &str) {
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), self.ns.name());
        let deadline = Instant::now() + API_OUTAGE;
        let mut object = pod(name);
        if let Some(spec) = object.spec.as_mut() {
            spec.termination_grace_period_seconds = Some(POD_GRACE_SECS);
        }
        loop {
            match pods.create(&PostParams::default(), &object).await {
                Ok(_) => return,
                // The previous Pod of that name is still going away.
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => eprintln!("{}: creating Pod {name}: {e}; retrying", self.name),
            }
            assert!(
                Instant::now() < deadline,
                "{}: cannot create Pod {name}",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn delete_pod(&self, name: &str) {
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), self.ns.name());
        let params = DeleteParams::default().grace_period(0);
        match retried("deleting a Pod", || pods.delete(name, &params)).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => panic!("{}: cannot delete Pod {name}: {e}", self.name),
        }
    }

    /// Whether `name` is a Pod a container could restart in: present, not terminal, not being
    /// deleted.
    async fn pod_usable(&self, name: &str) -> bool {
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), self.ns.name());
        match pods.get_opt(name).await {
            Ok(Some(p)) => {
                let phase = p.status.and_then(|s| s.phase).unwrap_or_default();
                p.metadata.deletion_timestamp.is_none() && phase != "Failed" && phase != "Succeeded"
            }
            _ => false,
        }
    }

    // --- following the candidates ---

    /// Takes in what the candidates said, notices exits, restarts candidates.
    async fn poll(&mut self) {
        while let Ok(line) = self.rx.try_recv() {
            self.absorb(line);
        }
        for p in &mut self.procs {
            if p.status.is_none() {
                if let Ok(Some(status)) = p.child.try_wait() {
                    p.status = Some(status);
                    p.exited_at = Some(mono_ns());
                }
            }
        }
        for i in 0..self.procs.len() {
            let p = &self.procs[i];
            if p.finalized || p.status.is_none() || !p.eof {
                continue;
            }
            self.finalize(i);
        }
        // No candidate is started while kube-apiserver restarts (leader for life needs the API
        // to give it a Pod).
        if self.shared.restarting.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        for slot in 0..self.slots.len() {
            let (current, restart_at, hold) = {
                let s = &self.slots[slot];
                (s.current, s.restart_at, s.hold)
            };
            let dead = current.is_none_or(|i| self.procs[i].finalized);
            if !dead || hold {
                continue;
            }
            match restart_at {
                None => self.slots[slot].restart_at = Some(Instant::now() + RESTART_DELAY),
                Some(at) if at <= Instant::now() => {
                    let reuse = match (self.strategy, current) {
                        (Strategy::ForLife, Some(i)) => {
                            let old = self.procs[i].name.clone();
                            if self.pod_usable(&old).await {
                                Some(old)
                            } else {
                                self.delete_pod(&old).await;
                                None
                            }
                        }
                        _ => None,
                    };
                    self.start(slot, reuse).await;
                }
                Some(_) => {}
            }
        }
    }

    fn absorb(&mut self, line: Line) {
        let (i, mut v) = match line {
            Line::Eof(i) => {
                self.procs[i].eof = true;
                return;
            }
            Line::Event(i, v) => (i, v),
        };
        let key = self.procs[i].key.clone();
        match v["event"].as_str() {
            Some("ledger_write_started") => {
                if let (Some(start), Some(token)) = (v["start_ns"].as_u64(), v["fencing_token"].as_u64()) {
                    self.unreported.insert((key, start), token);
                }
            }
            Some("ledger_write") => {
                if let Some(w) = Write::from_event(&key, &v) {
                    self.unreported.remove(&(w.key.clone(), w.start));
                    self.writes.push(w);
                }
            }
            Some("step") => self.steps.absorb(&key, &v),
            Some("error") => self
                .errors
                .push(format!("{key}: {}", v["message"].as_str().unwrap_or("?"))),
            Some(kind) => {
                if kind == "started_leading" && self.flavor == Flavor::Cli {
                    self.procs[i].command_pid = v["pid"].as_i64().map(|p| p as i32);
                }
                // The history knows processes by key (a Pod name may come back).
                v["identity"] = Value::String(key);
                self.history.record_event(&v);
            }
            None => {}
        }
    }

    /// A process is gone and its output read: close its term if it did not.
    fn finalize(&mut self, i: usize) {
        let (key, status, at, killed) = {
            let p = &mut self.procs[i];
            p.finalized = true;
            (
                p.key.clone(),
                p.status.expect("exited"),
                p.killed_at.or(p.exited_at).unwrap_or_else(mono_ns),
                p.killed_at.is_some(),
            )
        };
        let code = match (status.code(), status.signal()) {
            (Some(c), _) => format!("exit {c}"),
            (None, Some(s)) => format!("signal {s}"),
            _ => "?".into(),
        };
        *self.exit_codes.entry(code).or_insert(0) += 1;
        if self.leads(&key) {
            self.history.ended(&key, at);
            if !killed {
                self.inferred_ends.push(key);
            }
        }
    }

    /// Transitions so far (cheap: no overlap computation).
    fn transitions(&self) -> usize {
        let mut terms: Vec<(u64, &str)> = self
            .history
            .terms()
            .iter()
            .map(|t| (t.start, t.candidate.as_str()))
            .collect();
        terms.sort_unstable();
        terms.windows(2).filter(|w| w[0].1 != w[1].1).count()
    }

    /// Polls until `f` gives `Some`, or panics after `timeout` naming `what`.
    async fn until<T>(&mut self, what: &str, timeout: Duration, mut f: impl FnMut(&Self) -> Option<T>) -> T {
        let mut deadline = Instant::now() + timeout;
        loop {
            self.poll().await;
            if let Some(v) = f(self) {
                return v;
            }
            if self.shared.restarting.load(std::sync::atomic::Ordering::SeqCst) {
                // The other set of candidates is restarting kube-apiserver: the clock stops.
                deadline = deadline.max(Instant::now() + timeout);
            }
            if Instant::now() >= deadline {
                let leaders = self.history.leaders().join(", ");
                panic!(
                    "{}: timed out after {timeout:?} waiting for {what}; leaders now [{leaders}]; logs in {}",
                    self.name,
                    self.dir.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Polls for `d`.
    async fn sleep(&mut self, d: Duration) {
        let deadline = Instant::now() + d;
        while Instant::now() < deadline {
            self.poll().await;
            tokio::time::sleep(Duration::from_millis(10).min(deadline - Instant::now())).await;
        }
    }

    fn proc_of(&self, key: &str) -> usize {
        self.procs.iter().position(|p| p.key == key).expect("a known key")
    }

    fn leads(&self, key: &str) -> bool {
        self.history.leaders().contains(&key)
    }

    /// The only leader, if there is exactly one, it has led for `stable`, and its processes run.
    fn single_leader(&self, stable: Duration) -> Option<usize> {
        let [key] = self.history.leaders()[..] else {
            return None;
        };
        let term = self.history.terms().iter().rev().find(|t| t.candidate == key)?;
        let i = self.proc_of(key);
        let p = &self.procs[i];
        let ready = p.alive() && (self.flavor == Flavor::Library || p.command_pid.is_some());
        (ready && mono_ns().saturating_sub(term.start) >= stable.as_nanos() as u64).then_some(i)
    }

    async fn stable_leader(&mut self) -> usize {
        let stable = if self.mode.long {
            Duration::from_millis(300)
        } else {
            Duration::from_millis(600)
        };
        let timeout = self.liveness_bound() + SOON;
        self.until("a single stable leader", timeout, |a| a.single_leader(stable))
            .await
    }

    /// Whether a write of another candidate, started since `since`, showed the ledger holding a
    /// token greater than `token` (its own, accepted, or the one that refused it).
    fn ledger_passed(&self, key: &str, since: u64, token: u64) -> bool {
        self.writes.iter().any(|w| {
            w.key != key
                && w.start >= since
                && match w.outcome {
                    WriteOutcome::Accepted => w.token > token,
                    WriteOutcome::Rejected { stored } => stored > token,
                    WriteOutcome::Unreached | WriteOutcome::Unknown => false,
                }
        })
    }

    fn record(&mut self, kind: Kind, target: Option<&str>, start: u64) {
        self.faults.push(Fault {
            kind: kind.name().into(),
            target: target.map(str::to_string),
            start,
            end: mono_ns(),
        });
    }

    // --- signals ---

    /// The process groups of candidate `i`: its own, and COMMAND's for `kube-leader run`.
    fn groups(&self, i: usize) -> Vec<Pid> {
        let p = &self.procs[i];
        let mut g = vec![Pid::from_raw(p.pid)];
        g.extend(p.command_pid.map(Pid::from_raw));
        g
    }

    /// Every process group of candidate `i`'s tree, in the order to freeze it: kube-leader's,
    /// the supervisor's (`kube-leader run`: it has a group of its own) and COMMAND's. Thawed in
    /// reverse, COMMAND first: the worst order.
    fn tree(&self, i: usize) -> Vec<Pid> {
        let p = &self.procs[i];
        let mut g = vec![Pid::from_raw(p.pid)];
        if let Some(command) = p.command_pid {
            let supervisor = parent_of(command);
            if supervisor > 1 && supervisor != p.pid {
                g.push(Pid::from_raw(supervisor));
            }
            g.push(Pid::from_raw(command));
        }
        g
    }

    /// SIGKILL to every process of candidate `i`; its term ends now.
    fn kill_all(&mut self, i: usize) {
        for g in self.groups(i) {
            let _ = killpg(g, Signal::SIGKILL);
        }
        self.procs[i].killed_at = Some(mono_ns());
    }

    /// Polls `pid` every millisecond (absorbing events meanwhile) until it is dead or a zombie;
    /// returns when it was first seen so.
    async fn death_of(&mut self, pid: i32, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        loop {
            if !process_alive(pid) {
                return mono_ns();
            }
            while let Ok(line) = self.rx.try_recv() {
                self.absorb(line);
            }
            assert!(
                Instant::now() < deadline,
                "{}: process {pid} still alive after {timeout:?}; logs in {}",
                self.name,
                self.dir.display()
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    // --- faults ---

    /// Waits, before deleting the lock under a living leader, until the watches are back from
    /// the last restart of kube-apiserver.
    async fn let_watches_settle(&mut self) {
        let last = self.shared.restarts.lock().unwrap().iter().map(|f| f.end).max();
        if let Some(end) = last {
            let settled = end + WATCH_SETTLE.as_nanos() as u64;
            let now = mono_ns();
            if settled > now {
                self.sleep(Duration::from_nanos(settled - now)).await;
            }
        }
    }

    async fn inject(&mut self, kind: Kind) {
        let shared = self.shared.clone();
        if kind == Kind::ApiserverRestart {
            let _alone = shared.gate.write().await;
            self.inject_alone(kind).await;
        } else {
            let _beside = shared.gate.read().await;
            self.inject_alone(kind).await;
        }
    }

    async fn inject_alone(&mut self, kind: Kind) {
        if self.strategy == Strategy::ForLife && kind.deposes_through_the_watch() {
            self.let_watches_settle().await;
        }
        let leader = self.stable_leader().await;
        let key = self.procs[leader].key.clone();
        let term_start = self
            .history
            .terms()
            .iter()
            .rev()
            .find(|t| t.candidate == key && t.end.is_none())
            .map(|t| t.start)
            .expect("the leader's term");
        let t = self.timings;
        let start = mono_ns();
        match kind {
            Kind::Kill => self.kill_all(leader),
            Kind::KillKubeLeader => {
                let _ = kill(Pid::from_raw(self.procs[leader].pid), Signal::SIGKILL);
                let stopped = self
                    .until("COMMAND to stop after kube-leader was killed", SOON, |a| {
                        (!a.leads(&key)).then(mono_ns)
                    })
                    .await;
                self.orphan_stops.push(Duration::from_nanos(
                    self.term_end(&key).unwrap_or(stopped) - start,
                ));
            }
            Kind::Pause => {
                let groups = self.tree(leader);
                for g in &groups {
                    let _ = killpg(*g, Signal::SIGSTOP);
                }
                let froze = mono_ns();
                self.history.froze(&key, froze);
                if self.strategy == Strategy::ForLife {
                    // A frozen leader for life keeps its lock: it is taken from it meanwhile, as
                    // when the Pod of a frozen (or cut off) node is force-deleted.
                    if self.rng.chance(0.5) {
                        let name = self.procs[leader].name.clone();
                        self.delete_pod(&name).await;
                    } else {
                        self.delete_lock().await;
                    }
                }
                let at_least = match self.strategy {
                    Strategy::Lease => t.lease + self.rng.duration(Duration::from_millis(100), t.lease / 2),
                    Strategy::ForLife => self.rng.duration(Duration::from_millis(100), t.lease),
                };
                let thaw_after = froze + at_least.as_nanos() as u64;
                let token = self
                    .history
                    .terms()
                    .iter()
                    .rev()
                    .find(|t| t.candidate == key)
                    .and_then(|t| t.fencing_token)
                    .unwrap_or_default();
                // Thaw once another leader leads and the ledger is known to hold a greater token
                // than the frozen leader's: its writes must then be refused.
                self.until(
                    "a newer leader's token in the ledger during the pause",
                    SOON,
                    |a| {
                        let another = a.history.leaders().iter().any(|l| *l != key);
                        (mono_ns() >= thaw_after && another && a.ledger_passed(&key, froze, token))
                            .then_some(())
                    },
                )
                .await;
                // COMMAND first: the worst order.
                let thawed = mono_ns();
                for g in groups.iter().rev() {
                    let _ = killpg(*g, Signal::SIGCONT);
                }
                self.history.thawed(&key, thawed);
                self.pauses.push(Pause {
                    key: key.clone(),
                    froze,
                    thawed,
                });
                self.faults.push(Fault {
                    kind: kind.name().into(),
                    target: Some(key.clone()),
                    start: froze,
                    end: thawed,
                });
                self.until("the resumed leader to stop", SOON, |a| {
                    (!a.leads(&key)).then_some(())
                })
                .await;
                return;
            }
            Kind::FreezeKubeLeader => {
                let pid = Pid::from_raw(self.procs[leader].pid);
                let _ = kill(pid, Signal::SIGSTOP);
                self.until("the supervisor to stop COMMAND", t.renew + SOON, |a| {
                    (!a.leads(&key)).then_some(())
                })
                .await;
                let stopped = self.term_end(&key).unwrap_or_else(mono_ns);
                self.freeze_stops.push(Duration::from_nanos(stopped - start));
                if self.strategy == Strategy::Lease {
                    self.until("another leader", SOON, |a| {
                        a.history.leaders().iter().any(|l| *l != key).then_some(())
                    })
                    .await;
                } else {
                    self.sleep(Duration::from_millis(300)).await;
                }
                let _ = kill(pid, Signal::SIGCONT);
            }
            Kind::Twin => {
                // A follower's slot gets a candidate with the leader's identity, for a few
                // lease durations: it must not lead while the leader renews.
                let followers: Vec<usize> = (0..CANDIDATES)
                    .filter(|s| *s != self.procs[leader].slot)
                    .filter(|s| self.slots[*s].current.is_some_and(|i| self.procs[i].alive()))
                    .collect();
                let slot = followers[self.rng.index(followers.len())];
                self.slots[slot].hold = true;
                let follower = self.slots[slot].current.expect("alive");
                self.kill_all(follower);
                self.until("the replaced follower to be gone", SOON, |a| {
                    a.procs[follower].finalized.then_some(())
                })
                .await;
                let identity = self.procs[leader].name.clone();
                self.start(slot, Some(identity)).await;
                let twin = self.slots[slot].current.expect("started");
                self.sleep(3 * t.lease).await;
                self.kill_all(twin);
                self.slots[slot].hold = false;
            }
            Kind::AcquirePause => {
                // The leader steps down (releases); a follower is stopped at once, maybe with
                // its acquiring write in flight, past the lease, and resumed.
                let followers: Vec<usize> = (0..CANDIDATES)
                    .filter(|s| *s != self.procs[leader].slot)
                    .filter_map(|s| self.slots[s].current)
                    .filter(|i| self.procs[*i].alive())
                    .collect();
                let paused = followers[self.rng.index(followers.len())];
                let _ = kill(Pid::from_raw(self.procs[leader].pid), Signal::SIGTERM);
                let wait = self.rng.duration(Duration::ZERO, Duration::from_millis(15));
                std::thread::sleep(wait);
                let groups = self.tree(paused);
                for g in &groups {
                    let _ = killpg(*g, Signal::SIGSTOP);
                }
                let froze = mono_ns();
                let paused_key = self.procs[paused].key.clone();
                self.history.froze(&paused_key, froze);
                self.sleep(t.lease + t.renew).await;
                for g in groups.iter().rev() {
                    let _ = killpg(*g, Signal::SIGCONT);
                }
                let thawed = mono_ns();
                self.history.thawed(&paused_key, thawed);
                // A pause like any other: if it caught the follower already leading, the window
                // after the thaw is a post-pause window. If it caught it acquiring (no term
                // yet), there is none: a term it starts after the thaw must not overlap.
                self.pauses.push(Pause {
                    key: paused_key,
                    froze,
                    thawed,
                });
            }
            Kind::Partition | Kind::PartitionFollower | Kind::Delay => {
                let slot = if kind == Kind::PartitionFollower {
                    let followers: Vec<usize> = (0..CANDIDATES)
                        .filter(|s| *s != self.procs[leader].slot)
                        .collect();
                    followers[self.rng.index(followers.len())]
                } else {
                    self.procs[leader].slot
                };
                let (fault, hold) = match (kind, self.strategy) {
                    (Kind::Delay, Strategy::Lease) => (NetFault::Delay(t.renew * 3 / 4), 2 * t.lease),
                    (Kind::Delay, Strategy::ForLife) => {
                        (NetFault::Delay(Duration::from_millis(700)), t.lease)
                    }
                    (_, Strategy::Lease) => (
                        NetFault::Blackhole,
                        t.lease + t.renew + self.rng.duration(Duration::ZERO, t.lease),
                    ),
                    (_, Strategy::ForLife) => (
                        NetFault::Blackhole,
                        self.rng.duration(Duration::from_secs(1), Duration::from_secs(3)),
                    ),
                };
                self.slots[slot].proxy.set(fault);
                self.sleep(hold).await;
                self.slots[slot].proxy.set(NetFault::Pass);
            }
            Kind::ApiserverRestart => {
                let shared = self.shared.clone();
                let start = mono_ns();
                shared.restarting.store(true, std::sync::atomic::Ordering::SeqCst);
                shared.cp.stop_apiserver();
                let down = self.rng.duration(Duration::ZERO, Duration::from_secs(1));
                self.sleep(down).await;
                // On a task of its own, so that it goes on while this set of candidates is
                // followed.
                let mut restart = {
                    let shared = shared.clone();
                    tokio::spawn(async move { shared.cp.start_apiserver().await })
                };
                loop {
                    tokio::select! {
                        biased;
                        r = &mut restart => {
                            r.expect("the restart task").expect("kube-apiserver starts again");
                            break;
                        }
                        () = tokio::time::sleep(Duration::from_millis(20)) => self.poll().await,
                    }
                }
                shared
                    .restarting
                    .store(false, std::sync::atomic::Ordering::SeqCst);
                let end = mono_ns();
                let took = Duration::from_nanos(end - start);
                if took > Duration::from_secs(20) {
                    eprintln!("{}: kube-apiserver took {took:?} to come back", self.name);
                }
                shared.restarts.lock().unwrap().push(Fault {
                    kind: kind.name().into(),
                    target: None,
                    start,
                    end,
                });
                return;
            }
            Kind::KillSupervisor => {
                let command = self.procs[leader].command_pid.expect("COMMAND's pid");
                let supervisor = parent_of(command);
                assert!(
                    supervisor > 1 && supervisor != self.procs[leader].pid,
                    "{}: COMMAND's parent {supervisor} is not a supervisor",
                    self.name
                );
                let _ = kill(Pid::from_raw(supervisor), Signal::SIGKILL);
                let died = self.death_of(command, SOON).await;
                self.history.ended(&key, died);
                self.supervisor_kill_stops
                    .push(Duration::from_nanos(died - start));
            }
            Kind::DeafCommand => {
                let command = self.procs[leader].command_pid.expect("COMMAND's pid");
                let _ = kill(Pid::from_raw(command), Signal::SIGUSR1);
                // Let the signal land before SIGTERM can come.
                self.sleep(Duration::from_millis(50)).await;
                let slot = self.procs[leader].slot;
                self.slots[slot].proxy.set(NetFault::Blackhole);
                let cut = mono_ns();
                let died = self.death_of(command, t.lease + SOON).await;
                self.history.ended(&key, died);
                self.deaf_kills.push(Duration::from_nanos(died - cut));
                self.slots[slot].proxy.set(NetFault::Pass);
            }
            Kind::PauseAcquiring => {
                let followers: Vec<usize> = self
                    .slots
                    .iter()
                    .filter_map(|s| s.current)
                    .filter(|i| *i != leader && self.procs[*i].alive())
                    .collect();
                let _ = kill(Pid::from_raw(self.procs[leader].pid), Signal::SIGTERM);
                if !followers.is_empty() {
                    let f = followers[self.rng.index(followers.len())];
                    // The release lands some 10-100 ms after the SIGTERM (COMMAND exits first).
                    let after = self.rng.duration(Duration::ZERO, Duration::from_millis(120));
                    let hold = self.rng.duration(t.renew / 2, t.renew * 2);
                    self.sleep(after).await;
                    let pid = Pid::from_raw(self.procs[f].pid);
                    let _ = kill(pid, Signal::SIGSTOP);
                    self.sleep(hold).await;
                    let _ = kill(pid, Signal::SIGCONT);
                }
            }
            Kind::StopGroup | Kind::StopSupervisor | Kind::Stall | Kind::EvictThenKill => {
                self.inject_safety3(kind, leader, start).await;
            }
            Kind::LockDelete => self.delete_lock().await,
            Kind::Sigterm => {
                let _ = kill(Pid::from_raw(self.procs[leader].pid), Signal::SIGTERM);
            }
            Kind::PodDelete => {
                let name = self.procs[leader].name.clone();
                self.delete_pod(&name).await;
            }
            Kind::Evict => {
                let name = self.procs[leader].name.clone();
                retried("evicting the leader Pod", || {
                    set_pod_phase(&self.admin, self.ns.name(), &name, "Failed", Some("Evicted"))
                })
                .await
                .expect("evict the leader Pod");
            }
            Kind::Recreate => {
                let slot = self.procs[leader].slot;
                let name = self.procs[leader].name.clone();
                self.delete_pod(&name).await;
                self.create_pod(&name).await;
                // A new candidate in the new Pod of the same name; the old process goes on.
                self.start(slot, Some(name)).await;
            }
            Kind::KillThenPodDelete => {
                let slot = self.procs[leader].slot;
                self.slots[slot].hold = true;
                if self.flavor == Flavor::Cli && self.rng.chance(0.5) {
                    // kube-leader only: its supervisor stops COMMAND.
                    let _ = kill(Pid::from_raw(self.procs[leader].pid), Signal::SIGKILL);
                } else {
                    self.kill_all(leader);
                }
                let wait = self
                    .rng
                    .duration(Duration::from_millis(100), Duration::from_millis(600));
                self.sleep(wait).await;
                let name = self.procs[leader].name.clone();
                self.delete_pod(&name).await;
                self.slots[slot].hold = false;
            }
        }
        if self.strategy == Strategy::ForLife && kind.deletes_under_a_live_leader() {
            // Leader for life has no lease: a deposed leader whose process runs on stops only when
            // its watch tells it, and a successor may lead meanwhile (see `check`).
            self.deposed.push(Deposition {
                key: key.clone(),
                at: start,
            });
        }
        let target = match kind {
            Kind::PartitionFollower => None,
            _ => Some(key.as_str()),
        };
        self.record(kind, target, start);
        // One fault at a time: the next one waits until this one has deposed its leader.
        if kind.deposes(self.strategy) {
            self.until("the leader to stop leading after the fault", SOON, |a| {
                a.history
                    .terms()
                    .iter()
                    .any(|t| t.candidate == key && t.start == term_start && t.end.is_some())
                    .then_some(())
            })
            .await;
        }
    }

    /// An administrator deletes the lock.
    async fn delete_lock(&self) {
        let params = DeleteParams::default();
        let deleted = match self.strategy {
            Strategy::Lease => {
                let api = Api::<Lease>::namespaced(self.admin.clone(), self.ns.name());
                retried("deleting the lock", || api.delete(&self.lock, &params))
                    .await
                    .map(|_| ())
            }
            Strategy::ForLife => {
                let api = Api::<ConfigMap>::namespaced(self.admin.clone(), self.ns.name());
                retried("deleting the lock", || api.delete(&self.lock, &params))
                    .await
                    .map(|_| ())
            }
        };
        match deleted {
            Ok(()) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => panic!("{}: cannot delete the lock: {e}", self.name),
        }
    }

    /// The faults of issue 21 (Safety III) on the leader `leader`, injected at `start`. None of
    /// them freezes every process able to stop COMMAND: none allows a post-pause window.
    async fn inject_safety3(&mut self, kind: Kind, leader: usize, start: u64) {
        match kind {
            Kind::StopGroup => self.stop_group(leader, start).await,
            Kind::StopSupervisor => self.stop_supervisor(leader).await,
            Kind::Stall => {
                // Connections accepted and never answered, open ones (watches) silent.
                let t = self.timings;
                let hold = match self.strategy {
                    Strategy::Lease => t.lease + t.renew + self.rng.duration(Duration::ZERO, t.lease),
                    Strategy::ForLife => self.rng.duration(Duration::from_secs(1), Duration::from_secs(3)),
                };
                let slot = self.procs[leader].slot;
                self.slots[slot].proxy.set(NetFault::Blackhole);
                self.sleep(hold).await;
                self.slots[slot].proxy.set(NetFault::Pass);
            }
            Kind::EvictThenKill => self.evict_then_kill(leader, start).await,
            _ => unreachable!("not a Safety III fault: {kind:?}"),
        }
    }

    /// `stop-group`: `kill -STOP -PGID` or Ctrl-Z of kube-leader's process group (the
    /// supervisor's and COMMAND's are their own): the supervisor must stop COMMAND.
    async fn stop_group(&mut self, leader: usize, start: u64) {
        let key = self.procs[leader].key.clone();
        let group = Pid::from_raw(self.procs[leader].pid);
        let stop = if self.rng.chance(0.5) {
            Signal::SIGTSTP
        } else {
            Signal::SIGSTOP
        };
        let _ = killpg(group, stop);
        let renew = self.timings.renew;
        self.until(
            "the supervisor to stop COMMAND (group stopped)",
            renew + SOON,
            |a| (!a.leads(&key)).then_some(()),
        )
        .await;
        let stopped = self.term_end(&key).unwrap_or_else(mono_ns);
        self.group_stops.push(Duration::from_nanos(stopped - start));
        self.until_another_leader(&key).await;
        let _ = killpg(group, Signal::SIGCONT);
    }

    /// `stop-supervisor`: the supervisor alone is stopped, then its leader is cut off:
    /// kube-leader's backstop must kill COMMAND by the last confirmed instant + grace.
    async fn stop_supervisor(&mut self, leader: usize) {
        let key = self.procs[leader].key.clone();
        let slot = self.procs[leader].slot;
        let command = self.procs[leader].command_pid.expect("COMMAND's pid");
        let supervisor = parent_of(command);
        assert!(
            supervisor > 1 && supervisor != self.procs[leader].pid,
            "{}: COMMAND's parent {supervisor} is not a supervisor",
            self.name
        );
        let _ = kill(Pid::from_raw(supervisor), Signal::SIGSTOP);
        self.slots[slot].proxy.set(NetFault::Blackhole);
        let cut = mono_ns();
        let died = self.death_of(command, self.timings.lease + SOON).await;
        self.history.ended(&key, died);
        self.backstop_kills.push(Duration::from_nanos(died - cut));
        self.until_another_leader(&key).await;
        self.slots[slot].proxy.set(NetFault::Pass);
        let _ = kill(Pid::from_raw(supervisor), Signal::SIGCONT);
    }

    /// `evict-then-kill`: the 1.20 kubelet's order, the terminal status first, the kill after.
    async fn evict_then_kill(&mut self, leader: usize, start: u64) {
        let key = self.procs[leader].key.clone();
        let slot = self.procs[leader].slot;
        self.slots[slot].hold = true;
        let name = self.procs[leader].name.clone();
        retried("evicting the leader Pod", || {
            set_pod_phase(&self.admin, self.ns.name(), &name, "Failed", Some("Evicted"))
        })
        .await
        .expect("evict the leader Pod");
        let wait = self
            .rng
            .duration(Duration::from_millis(100), Duration::from_secs(2));
        self.sleep(wait).await;
        // Whether it stepped down on its own before the kill (its term ends at the kill
        // otherwise).
        let stepped_down = (!self.leads(&key)).then(|| self.term_end(&key)).flatten();
        self.evict_stepdowns
            .push(stepped_down.map(|end| Duration::from_nanos(end.saturating_sub(start))));
        if self.procs[leader].alive() {
            self.kill_all(leader);
        }
        self.slots[slot].hold = false;
    }

    /// Lease: waits until another candidate than `key` leads; leader for life: 300 ms.
    async fn until_another_leader(&mut self, key: &str) {
        if self.strategy == Strategy::Lease {
            self.until("another leader", SOON, |a| {
                a.history.leaders().iter().any(|l| *l != key).then_some(())
            })
            .await;
        } else {
            self.sleep(Duration::from_millis(300)).await;
        }
    }

    fn term_end(&self, key: &str) -> Option<u64> {
        self.history
            .terms()
            .iter()
            .rev()
            .find(|t| t.candidate == key)
            .and_then(|t| t.end)
    }

    // --- the run ---

    async fn run(mut self, restarts: bool) -> (String, Findings, Arena) {
        let mut kinds = Kind::applicable(self.strategy, self.flavor, restarts);
        if self.mode.long {
            if let Some(only) = &self.mode.only {
                kinds.retain(|(k, _)| only.iter().any(|o| o == k.name()));
            }
        }
        for slot in 0..CANDIDATES {
            self.start(slot, None).await;
        }
        self.started = mono_ns();
        let first = self.stable_leader().await;
        eprintln!(
            "{}: first leader {} after {:?}; logs in {}",
            self.name,
            self.procs[first].key,
            Duration::from_nanos(mono_ns() - self.started),
            self.dir.display()
        );
        let began = Instant::now();
        if self.mode.long {
            let mut last_report = Instant::now();
            loop {
                let transitions = self.transitions();
                let total: usize = {
                    let mut all = self.shared.transitions.lock().unwrap();
                    all.insert(self.name.clone(), transitions);
                    all.values().sum()
                };
                if total >= self.mode.target || began.elapsed() > self.mode.max {
                    break;
                }
                if last_report.elapsed() > Duration::from_secs(60) {
                    eprintln!(
                        "{}: {transitions} transitions, {} faults after {:?}",
                        self.name,
                        self.faults.len(),
                        began.elapsed()
                    );
                    last_report = Instant::now();
                }
                if kinds.is_empty() {
                    // KUBE_LEADER_CHAOS_ONLY left this set nothing to draw: it idles.
                    self.sleep(Duration::from_secs(1)).await;
                    continue;
                }
                let kind = self.rng.weighted(&kinds);
                self.inject(kind).await;
            }
        } else {
            let mut order: Vec<Kind> = kinds.iter().map(|(k, _)| *k).collect();
            if self.flavor == Flavor::Cli {
                // Time: network faults of the leader are the library's business (the library
                // set has them); the CLI set keeps its own kinds, and `deaf-command` cuts its
                // leader off too.
                order.retain(|k| !matches!(k, Kind::Partition | Kind::PartitionFollower | Kind::Delay));
            }
            self.rng.shuffle(&mut order);
            // kube-apiserver restarts last: after it only liveness is measured (see WATCH_SETTLE).
            order.sort_by_key(|k| *k == Kind::ApiserverRestart);
            for kind in order {
                self.inject(kind).await;
            }
        }
        // Settle: one leader for a while after the last fault.
        self.stable_leader().await;
        self.sleep(Duration::from_secs(1)).await;
        let until = mono_ns();
        let took = began.elapsed();

        // Stop everything; the window of the analysis ended before.
        for i in 0..self.procs.len() {
            if self.procs[i].alive() {
                for g in self.groups(i) {
                    let _ = killpg(g, Signal::SIGKILL);
                }
            }
        }
        for p in &mut self.procs {
            if p.status.is_none() {
                let _ = p.child.wait();
            }
        }
        while let Ok(line) = self.rx.try_recv() {
            self.absorb(line);
        }

        // A write whose writer died before it reported (COMMAND killed after the grace) has an
        // unknown outcome.
        for ((key, start), token) in std::mem::take(&mut self.unreported) {
            self.writes.push(Write {
                key,
                token,
                start,
                end: start,
                outcome: WriteOutcome::Unknown,
            });
        }
        let mut faults = self.faults.clone();
        faults.extend(self.shared.restarts.lock().unwrap().iter().cloned());
        faults.sort_by_key(|f| f.start);
        let findings = Analysis {
            history: &self.history,
            writes: &self.writes,
            faults: &faults,
            pauses: &self.pauses,
            deposed: &self.deposed,
            from: self.started,
            until,
        }
        .run();
        self.write_timeline(&faults, until);
        if self.flavor == Flavor::Library {
            let model = match self.strategy {
                Strategy::Lease => Model::Lease,
                Strategy::ForLife => Model::ForLife,
            };
            self.trace = Some(self.steps.replay(model, &self.dir));
        }
        let trace = self.trace.as_ref().map_or(String::new(), |t| format!("\n{t}"));
        let summary = format!(
            "== {} (seed {:#x}, {} mode, lease {:?}/{:?}/{:?}, {:?} of faults)\n{findings}\n\
             liveness bound {:?}; freeze-kube-leader: COMMAND stopped after {:?} (renew deadline {:?}); \
             kill-kube-leader: COMMAND stopped after {:?}; kill-supervisor: COMMAND died after {:?}; \
             deaf-command: COMMAND killed {:?} after the leader was cut off (lease {:?})\n\
             stop-group: COMMAND stopped after {}; stop-supervisor: COMMAND killed by the backstop {} \
             after the cut; evict-then-kill: stepped down after {}, still led at the kill {}; \
             post-pause windows {}\n\
             exits {:?}; term ends inferred {}; candidate errors {}{trace}",
            self.name,
            self.mode.seed,
            if self.mode.long { "long" } else { "CI" },
            self.timings.lease,
            self.timings.renew,
            self.timings.retry,
            took,
            self.liveness_bound(),
            self.freeze_stops,
            self.timings.renew,
            self.orphan_stops,
            self.supervisor_kill_stops,
            self.deaf_kills,
            self.timings.lease,
            spread(&self.group_stops),
            spread(&self.backstop_kills),
            spread(&self.evict_stepdowns.iter().flatten().copied().collect::<Vec<_>>()),
            self.evict_stepdowns.iter().filter(|d| d.is_none()).count(),
            spread(
                &findings
                    .post_pauses
                    .iter()
                    .filter_map(|p| p.window)
                    .collect::<Vec<_>>()
            ),
            self.exit_codes,
            self.inferred_ends.len(),
            self.errors.len(),
        );
        (summary, findings, self)
    }

    /// Writes the terms and faults, in order, to `timeline.txt` in the log directory (kept when
    /// a check fails).
    fn write_timeline(&self, faults: &[Fault], until: u64) {
        let at = |ns: u64| format!("{:>10.3}", ns.saturating_sub(self.started) as f64 / 1e9);
        let mut lines: Vec<(u64, String)> = Vec::new();
        for t in self.history.terms() {
            lines.push((
                t.start,
                format!(
                    "{} term {} token {:?} until {}",
                    at(t.start),
                    t.candidate,
                    t.fencing_token,
                    t.end.map_or("-".into(), at)
                ),
            ));
        }
        for f in faults {
            lines.push((
                f.start,
                format!(
                    "{} FAULT {} {:?} until {}",
                    at(f.start),
                    f.kind,
                    f.target,
                    at(f.end)
                ),
            ));
        }
        lines.push((until, format!("{} END", at(until))));
        lines.sort_by_key(|(t, _)| *t);
        let text: Vec<String> = lines.into_iter().map(|(_, l)| l).collect();
        let _ = fs::write(self.dir.join("timeline.txt"), text.join("\n") + "\n");
    }

    /// The checks every run must pass.
    fn check(&self, findings: &Findings) {
        let name = &self.name;
        let report = &findings.report;
        assert!(
            report.malformed.is_empty(),
            "{name}: malformed history {:?}",
            report.malformed
        );
        assert!(
            findings.unexplained_overlaps.is_empty(),
            "{name}: two leaders at once outside post-pause windows (timeline, candidate logs: {}):\n{}",
            self.dir.display(),
            findings
                .unexplained_overlaps
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        );
        // Leader for life: a leader deposed while its process runs (its lock deleted by an
        // administrator, or by the garbage collector after its Pod was deleted with no kubelet to
        // stop it) learns it from its watch only, while a successor creates the lock at once:
        // they may overlap for the watch's delivery delay. A limit of the strategy (no lease, no
        // fail-stop), reported, not failed; the successor's fencing token is greater, so the late
        // writes must be refused. An evicted leader is no such case: any overlap fails above.
        if !findings.deposition_overlaps.is_empty() {
            eprintln!(
                "{name}: KNOWN LIMIT of leader for life: {} deposed leader(s) acted beside their \
                 successor for up to {:?} before their watch told them",
                findings.deposition_overlaps.len(),
                findings
                    .deposition_overlaps
                    .iter()
                    .map(|o| o.span.duration())
                    .max()
                    .unwrap_or_default()
            );
        }
        assert_eq!(
            findings.deposition_writes.1, 0,
            "{name}: a deposed leader's write was accepted after its successor's"
        );
        for o in &findings.post_pause_overlaps {
            assert!(
                o.span.duration() <= POST_PAUSE_BOUND,
                "{name}: a resumed leader acted beside its successor for {:?} after its pause \
                 (bound {POST_PAUSE_BOUND:?}): {o}; timeline in {}",
                o.span.duration(),
                self.dir.display()
            );
        }
        for p in &findings.post_pauses {
            assert!(
                p.window.is_some(),
                "{name}: {} never stopped after its pause",
                p.key
            );
            // Not sent (the ledger could not be read) is no write. An unknown outcome (the
            // writer was killed with its write in flight: the supervisor SIGKILLs a COMMAND at
            // once when its deadline passed during the pause) cannot have landed either: the
            // pause ends only once the ledger holds a greater token, and every write reads the
            // ledger after it started and replaces it with that read's resourceVersion.
            assert_eq!(
                p.accepted, 0,
                "{name}: writes of {} after its pause were not all refused: {p:?}",
                p.key
            );
            if p.unknown > 0 {
                eprintln!(
                    "{name}: {} write(s) of {} after its pause have no reported outcome (killed in \
                     flight); they started after the ledger held a greater token",
                    p.unknown, p.key
                );
            }
        }
        assert!(
            findings.outside_terms.is_empty(),
            "{name}: writes accepted from non-leaders: {:?}",
            findings.outside_terms
        );
        // The fencing token must grow from leader to leader (also across an administrator's
        // deletion of the lock), and the newest leader's writes must never be refused.
        assert!(
            findings.token_regressions.is_empty(),
            "{name}: fencing token regressions {:?}",
            findings.token_regressions
        );
        assert!(
            findings.wrongly_rejected.is_empty(),
            "{name}: writes of the newest leader refused: {:?}",
            findings.wrongly_rejected
        );
        let bound = self.liveness_bound();
        if let Some((kind, gap)) = &findings.worst_gap_after_a_fault {
            assert!(
                gap.duration() <= bound,
                "{name}: no leader for {:?} after {kind} (bound {bound:?})",
                gap.duration()
            );
        }
        for d in &self.freeze_stops {
            assert!(
                *d <= self.timings.renew + SLACK,
                "{name}: COMMAND of a frozen kube-leader stopped after {d:?} (renew deadline {:?})",
                self.timings.renew
            );
        }
        for d in &self.group_stops {
            assert!(
                *d <= self.timings.renew + SLACK,
                "{name}: COMMAND of a kube-leader whose process group was stopped stopped after \
                 {d:?} (renew deadline {:?})",
                self.timings.renew
            );
        }
        for d in &self.backstop_kills {
            assert!(
                *d <= self.timings.lease + SLACK,
                "{name}: kube-leader's backstop killed COMMAND {d:?} after the cut (lease {:?})",
                self.timings.lease
            );
        }
        let leaked = self.leaked.lock().unwrap();
        assert!(
            leaked.is_empty(),
            "{name}: the bearer token appeared in the output: {leaked:?}"
        );
        for p in &self.procs {
            let log = fs::read_to_string(&p.log).unwrap_or_default();
            assert!(
                !log.contains(&self.shared.token),
                "{name}: the bearer token appeared in {}",
                p.log.display()
            );
        }
        if let Some(t) = &self.trace {
            assert!(
                t.report.violations.is_empty() && t.report.steps > 0,
                "{name}: the model cannot explain the recorded steps (traces in {}):\n{t}",
                self.dir.display()
            );
            assert!(
                t.mutants.iter().all(|(_, refused)| *refused != Some(false)),
                "{name}: the replayer accepted a broken step:\n{t}"
            );
        }
        let transitions = report.transitions;
        // A set that KUBE_LEADER_CHAOS_ONLY left idle makes none.
        let idle = self.mode.only.is_some() && self.faults.is_empty();
        assert!(idle || transitions >= 5, "{name}: only {transitions} transitions");
    }
}

/// `N× min–median–max` of `ds`, or `-`.
fn spread(ds: &[Duration]) -> String {
    let mut ds = ds.to_vec();
    ds.sort_unstable();
    match (ds.first(), ds.last()) {
        (Some(min), Some(max)) => format!("{}× {min:.1?}–{:.1?}–{max:.1?}", ds.len(), ds[ds.len() / 2]),
        _ => "-".into(),
    }
}

// === the tests ===

async fn chaos(strategy: Strategy) {
    let mode = Mode::from_env();
    eprintln!(
        "chaos {}: seed {:#x} (KUBE_LEADER_CHAOS_SEED overrides), {} mode",
        strategy.as_str(),
        mode.seed,
        if mode.long { "long" } else { "CI" }
    );
    let cp = tokio::task::spawn_blocking(ControlPlane::start)
        .await
        .unwrap()
        .unwrap_or_else(|e| {
            panic!("a private control plane is needed (run ./scripts/testenv-assets.sh): {e}")
        });
    let token = cp.user_token(ADMIN).unwrap().to_string();
    let shared = Arc::new(Shared {
        cp,
        token,
        gate: tokio::sync::RwLock::new(()),
        restarting: std::sync::atomic::AtomicBool::new(false),
        restarts: Mutex::default(),
        transitions: Mutex::default(),
    });
    let library = Arena::new(shared.clone(), strategy, Flavor::Library, mode).await;
    let cli = Arena::new(shared.clone(), strategy, Flavor::Cli, mode).await;
    // The library candidates' schedule restarts kube-apiserver; both sets live through it.
    let ((lib_summary, lib_findings, lib), (cli_summary, cli_findings, cli)) =
        tokio::join!(library.run(true), cli.run(false));
    eprintln!("{lib_summary}\n{cli_summary}");
    let total = lib_findings.report.transitions + cli_findings.report.transitions;
    eprintln!(
        "chaos {}: {total} transitions in all (library {}, kube-leader run {})",
        strategy.as_str(),
        lib_findings.report.transitions,
        cli_findings.report.transitions
    );
    lib.check(&lib_findings);
    cli.check(&cli_findings);
    if mode.long {
        assert!(
            total >= mode.target,
            "only {total} transitions, {} wanted",
            mode.target
        );
    }
    if std::env::var_os("KUBE_LEADER_CHAOS_KEEP").is_none() {
        let _ = fs::remove_dir_all(&lib.dir);
        let _ = fs::remove_dir_all(&cli.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_lease() {
    chaos(Strategy::Lease).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_for_life() {
    chaos(Strategy::ForLife).await;
}
