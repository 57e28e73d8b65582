//! The candidates of the fenced chaos run and the faults done to them.

use std::{
    collections::BTreeMap,
    os::unix::process::CommandExt as _,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    api::{Patch, PatchParams},
    Api,
};
use kube_leader_e2e::{
    chaos::Rng,
    fence_chaos::{Recorder, THIEF},
    mono_ns,
    shard_fleet::spawn,
};
use kube_leader_testenv::{ControlPlane, Fault as NetFault, FaultProxy};
use nix::{
    sys::signal::{kill, killpg, Signal},
    unistd::Pid,
};

use super::{setup::Webhook, Timings, OBJECTS};

/// How a slot's candidate runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavor {
    /// `fence-candidate lease`: the library, `Leadership::fenced_client`.
    Library,
    /// `kube-leader run --fence -- fence-candidate child`: COMMAND writes through the proxy.
    Sidecar,
}

/// A fault of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// SIGTERM of the leader: it stops writing and releases (a rolling update).
    Sigterm,
    /// SIGSTOP of every process of the leader until another leads and writes, then SIGCONT.
    Pause,
    /// The leader's proxy blackholes until another leads and writes (held requests are
    /// delivered when it heals).
    Partition,
    /// SIGKILL of every process of the leader.
    Kill,
    /// The enforcing webhook killed, and started again 1 s later.
    WebhookDown,
    /// An administrator writes another holder into the Lease while the leader writes: the lock
    /// moves under the leader's writes in flight (the check-to-commit window); the leader learns
    /// it at its next renewal, and a candidate takes over once the thief's lease expired.
    Steal,
}

impl Kind {
    /// Its name in the figures.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Sigterm => "sigterm",
            Kind::Pause => "pause",
            Kind::Partition => "partition",
            Kind::Kill => "kill",
            Kind::WebhookDown => "webhook-down",
            Kind::Steal => "steal",
        }
    }
}

/// One candidate's place: its fault proxy, and the process in it now.
#[derive(Debug)]
struct Slot {
    flavor: Flavor,
    proxy: FaultProxy,
    kubeconfig: PathBuf,
    generation: u32,
    child: Option<Child>,
}

/// The candidates, the webhooks and what was done to them.
pub(crate) struct Arena {
    pub(crate) cp: &'static ControlPlane,
    pub(crate) ns: String,
    pub(crate) writer: String,
    pub(crate) dir: PathBuf,
    pub(crate) timings: Timings,
    pub(crate) rng: Rng,
    pub(crate) recorder: Recorder,
    pub(crate) enforcing: Webhook,
    slots: Vec<Slot>,
    /// Every stdout file of a candidate.
    pub(crate) outputs: Vec<PathBuf>,
    /// When a fault was in force, and when the enforcing webhook was down (mono ns).
    pub(crate) faults: Vec<(u64, u64)>,
    /// See `faults`.
    pub(crate) down: Vec<(u64, u64)>,
    /// Faults done, by kind.
    pub(crate) counts: BTreeMap<&'static str, usize>,
    /// Faults that did not end as they should (no new leader in time).
    pub(crate) errors: Vec<String>,
}

/// A bound on anything that should happen soon (a loaded 2-core machine).
const SOON: Duration = Duration::from_secs(30);

/// `fence-candidate`; `KUBE_LEADER_FENCE_CHAOS_BIN_DIR` runs copies (`fence-candidate` and
/// `kube-leader` in that directory), so that a long run is not disturbed by a rebuild.
pub(crate) fn fence_candidate_bin() -> String {
    match std::env::var("KUBE_LEADER_FENCE_CHAOS_BIN_DIR") {
        Ok(dir) => format!("{dir}/fence-candidate"),
        Err(_) => env!("CARGO_BIN_EXE_fence-candidate").to_string(),
    }
}

/// `(pid, process group)` of `pid` and of every process below it, parents first.
fn tree(pid: i32) -> Vec<(i32, i32)> {
    let mut all: Vec<(i32, i32, i32)> = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if let (Some(ppid), Some(pgid)) = (
            f.get(1).and_then(|s| s.parse().ok()),
            f.get(2).and_then(|s| s.parse().ok()),
        ) {
            all.push((p, ppid, pgid));
        }
    }
    let mut out: Vec<(i32, i32)> = all.iter().filter(|a| a.0 == pid).map(|a| (a.0, a.2)).collect();
    let mut i = 0;
    while i < out.len() {
        let parent = out[i].0;
        out.extend(all.iter().filter(|a| a.1 == parent).map(|a| (a.0, a.2)));
        i += 1;
    }
    out
}

/// Sends `signal` to every process group of `pid`'s tree (children's groups first when
/// `children_first`: COMMAND resumes before the proxy it writes through, as a node would).
fn signal_tree(pid: i32, signal: Signal, children_first: bool) {
    let mut groups: Vec<i32> = Vec::new();
    for (_, g) in tree(pid) {
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    if children_first {
        groups.reverse();
    }
    for g in groups {
        let _ = killpg(Pid::from_raw(g), signal);
    }
}

impl Arena {
    /// `flavors.len()` slots, each with a fault proxy of its own; no candidate started yet.
    pub(crate) fn add_slots(&mut self, flavors: &[Flavor]) {
        for &flavor in flavors {
            let proxy = FaultProxy::to_apiserver(self.cp).expect("a fault proxy");
            let kubeconfig = proxy
                .write_kubeconfig(self.cp, &self.writer)
                .expect("a kubeconfig");
            self.slots.push(Slot {
                flavor,
                proxy,
                kubeconfig,
                generation: 0,
                child: None,
            });
        }
    }

    /// The arena, without slots.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        cp: &'static ControlPlane,
        ns: String,
        writer: String,
        dir: PathBuf,
        timings: Timings,
        rng: Rng,
        recorder: Recorder,
        enforcing: Webhook,
    ) -> Self {
        Self {
            cp,
            ns,
            writer,
            dir,
            timings,
            rng,
            recorder,
            enforcing,
            slots: Vec::new(),
            outputs: Vec::new(),
            faults: Vec::new(),
            down: Vec::new(),
            counts: BTreeMap::new(),
            errors: Vec::new(),
        }
    }

    /// Starts a fresh candidate (a new identity) in slot `i`.
    fn start(&mut self, i: usize) {
        let t = self.timings;
        let ms = |d: Duration| d.as_millis().to_string();
        let slot = &mut self.slots[i];
        slot.generation += 1;
        let identity = format!("s{i}-g{}", slot.generation);
        let mut command = Command::new("setpriv");
        command.args(["--pdeathsig", "KILL", "--"]);
        match slot.flavor {
            Flavor::Library => {
                command
                    .arg(fence_candidate_bin())
                    .arg("lease")
                    .arg(&slot.kubeconfig);
                command.args([
                    &self.ns,
                    super::LOCK,
                    &identity,
                    &ms(t.lease),
                    &ms(t.renew),
                    &ms(t.retry),
                ]);
                command.args([ms(t.write), self.writer.clone(), OBJECTS.to_string()]);
            }
            Flavor::Sidecar => {
                let bin = kube_leader_e2e::kube_leader_bin_beside(&fence_candidate_bin());
                command
                    .arg(bin)
                    .args(["run", "--strategy", "lease", "--lock", super::LOCK]);
                command.args(["--namespace", &self.ns, "--identity", &identity, "--kubeconfig"]);
                command.arg(&slot.kubeconfig);
                command.args(["--lease-duration", &format!("{}ms", t.lease.as_millis())]);
                command.args(["--renew-deadline", &format!("{}ms", t.renew.as_millis())]);
                command.args(["--retry-period", &format!("{}ms", t.retry.as_millis())]);
                command.args(["--fence", "--fence-user", &self.writer, "--"]);
                command.args([
                    &fence_candidate_bin(),
                    "child",
                    &ms(t.write),
                    &OBJECTS.to_string(),
                ]);
            }
        }
        let out = self.dir.join(format!("{identity}.jsonl"));
        let log = std::fs::File::create(self.dir.join(format!("{identity}.log"))).expect("a log file");
        command
            .env_remove("POD_NAMESPACE")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).expect("an output file"))
            .stderr(log)
            .process_group(0);
        self.outputs.push(out);
        slot.child = Some(spawn(command).expect("start a candidate"));
    }

    /// Starts a candidate in every slot whose process ended (or never started).
    pub(crate) fn respawn(&mut self) {
        for i in 0..self.slots.len() {
            let ended = match &mut self.slots[i].child {
                None => true,
                Some(c) => c.try_wait().ok().flatten().is_some(),
            };
            if ended {
                self.start(i);
            }
        }
    }

    /// The leader's slot and token once it has stamped a fenced object with that token, and
    /// its token is above `after`; waits up to [`SOON`], starting candidates whose process
    /// ended meanwhile.
    async fn leader_writing(&mut self, after: u64) -> Option<(usize, u64)> {
        let deadline = tokio::time::Instant::now() + SOON;
        while tokio::time::Instant::now() < deadline {
            self.respawn();
            let seen = self.recorder.with(|r| {
                let l = r.current()?;
                let holder = l.holder.clone()?;
                let stamped = r
                    .max_stamp
                    .iter()
                    .filter(|(name, _)| name.starts_with("fenced-"))
                    .any(|(_, s)| *s >= l.token);
                (stamped && l.token > after).then_some((holder, l.token))
            });
            if let Some((holder, token)) = seen {
                let slot = holder
                    .strip_prefix('s')
                    .and_then(|h| h.split_once('-'))
                    .and_then(|(s, _)| s.parse().ok());
                if let Some(slot) = slot {
                    return Some((slot, token));
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// Writes [`THIEF`] into the Lease as its holder (an administrator's edit): the lock moves
    /// to a newer token at once, whatever the leader is doing.
    async fn steal(&mut self) {
        let now = humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string();
        let patch = serde_json::json!({"spec": {"holderIdentity": THIEF, "acquireTime": now,
            "renewTime": now, "leaseDurationSeconds": 1}});
        let leases = Api::<Lease>::namespaced(self.cp.client().await, &self.ns);
        if let Err(e) = leases
            .patch(super::LOCK, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            self.errors.push(format!("steal: {e}"));
        }
    }

    /// Waits until a fenced write lands (the webhook is back); records an error after [`SOON`].
    async fn fenced_write_lands(&mut self) {
        let fenced = |r: &kube_leader_e2e::fence_chaos::Recorded| {
            r.objects
                .iter()
                .filter(|v| v.name.starts_with("fenced-") && v.stamp.is_some())
                .count()
        };
        let before = self.recorder.with(fenced);
        let deadline = tokio::time::Instant::now() + SOON;
        while self.recorder.with(fenced) == before {
            if tokio::time::Instant::now() > deadline {
                return self
                    .errors
                    .push("webhook-down: no fenced write landed once it was back".into());
            }
            self.respawn();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Does `kind` to the current leader (or the webhook) and waits until a leader writes again.
    pub(crate) async fn fault(&mut self, kind: Kind) {
        let Some((slot, token)) = self.leader_writing(0).await else {
            return self
                .errors
                .push(format!("{}: no leader writing before it", kind.name()));
        };
        let start = mono_ns();
        let pid = self.slots[slot].child.as_ref().map_or(0, |c| c.id() as i32);
        match kind {
            Kind::Sigterm => {
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            }
            Kind::Kill => signal_tree(pid, Signal::SIGKILL, true),
            Kind::Steal => self.steal().await,
            Kind::Pause => signal_tree(pid, Signal::SIGSTOP, false),
            Kind::Partition => self.slots[slot].proxy.set(NetFault::Blackhole),
            Kind::WebhookDown => {
                self.enforcing.stop();
                tokio::time::sleep(Duration::from_secs(1)).await;
                self.enforcing.start();
                self.down.push((start, mono_ns()));
                self.fenced_write_lands().await;
            }
        }
        let after = if kind == Kind::WebhookDown { 0 } else { token };
        let next = self.leader_writing(after).await;
        match kind {
            Kind::Pause => signal_tree(pid, Signal::SIGCONT, true),
            Kind::Partition => self.slots[slot].proxy.set(NetFault::Pass),
            _ => {}
        }
        if next.is_none() {
            self.errors
                .push(format!("{}: no new leader writing within {SOON:?}", kind.name()));
        }
        self.faults.push((start, mono_ns()));
        *self.counts.entry(kind.name()).or_default() += 1;
        // The new leader writes a few ticks before the next fault.
        let dwell = self
            .rng
            .duration(Duration::from_millis(200), Duration::from_millis(600));
        tokio::time::sleep(dwell).await;
    }

    /// Transitions so far.
    pub(crate) fn transitions(&self) -> usize {
        self.recorder.with(|r| r.transitions)
    }

    /// Stops every candidate (SIGKILL of each process tree).
    pub(crate) fn stop_all(&mut self) {
        for s in &mut self.slots {
            if let Some(mut c) = s.child.take() {
                signal_tree(c.id() as i32, Signal::SIGKILL, true);
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        self.stop_all();
    }
}
