//! Candidates of both implementations, each a process of its own, on one Lease: kube-leader's
//! (`lease-candidate`, a `LeaseElector`) and client-go's (`tools/go-candidate`, client-go
//! v0.37.2's `leaderelection`, classic or `--coordinated`).
//!
//! Both print the same JSON event lines (`started_leading`, `stopped_leading`, `exit`, each with
//! `identity` and CLOCK_MONOTONIC `mono_ns`); a [`Fleet`] reads them into one
//! [`History`](crate::checker::History), so the safety rule of the chaos checker (leadership
//! intervals never overlap) applies across implementations. Every candidate uses the tests'
//! short timings: lease 2 s, renew deadline 1 s, retry 200 ms.

use std::{
    collections::BTreeMap,
    fmt,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use nix::sys::signal::{kill, Signal};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
    task::JoinHandle,
};

use crate::{
    checker::{History, Report},
    mono_ns, wait_for,
};

/// The candidates' lease duration.
pub const LEASE: Duration = Duration::from_secs(2);
/// The candidates' renew deadline.
pub const RENEW: Duration = Duration::from_secs(1);
/// The candidates' retry period.
pub const RETRY: Duration = Duration::from_millis(200);

/// How long a wait for a process or a leader may take on a loaded machine before a test fails:
/// far beyond any of the timings above (waits end as soon as what they wait for happens).
pub const PATIENCE: Duration = Duration::from_secs(60);

/// The client-go (v0.37.2) candidate built by `scripts/go-candidate.sh`, from
/// `KUBE_LEADER_GO_CANDIDATE` (the test command exports it).
pub fn go_candidate() -> PathBuf {
    std::env::var_os("KUBE_LEADER_GO_CANDIDATE")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "KUBE_LEADER_GO_CANDIDATE is not set: run ./scripts/test.sh, or export \
                 KUBE_LEADER_GO_CANDIDATE=$(./scripts/go-candidate.sh)"
            )
        })
}

/// Which implementation a candidate runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Implementation {
    /// kube-leader's `LeaseElector` (`lease-candidate`): campaigns again after a loss; SIGTERM
    /// releases the Lease.
    KubeLeader,
    /// client-go's classic `LeaseLock` election (`go-candidate`): exits 3 after a loss; SIGTERM
    /// releases the Lease (`ReleaseOnCancel`).
    ClientGo,
    /// client-go's coordinated election (`go-candidate --coordinated`): registers a
    /// LeaseCandidate and leads only when kube-apiserver's controller names it holder.
    ClientGoCoordinated,
}

impl Implementation {
    /// Whether this is one of client-go's.
    pub fn is_client_go(self) -> bool {
        self != Implementation::KubeLeader
    }
}

impl fmt::Display for Implementation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Implementation::KubeLeader => "kube-leader",
            Implementation::ClientGo => "client-go",
            Implementation::ClientGoCoordinated => "client-go (coordinated)",
        })
    }
}

/// How a candidate is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGTERM: a graceful stop, which releases the Lease.
    Release,
    /// SIGKILL: a crash; the Lease stays until it expires.
    Crash,
}

/// What the fleet read and did, shared with the reader tasks.
#[derive(Debug, Default)]
struct State {
    history: History,
    /// Every event line, in the order read (per candidate, in the order written).
    events: Vec<serde_json::Value>,
}

#[derive(Debug)]
struct Candidate {
    implementation: Implementation,
    child: Child,
    reader: JoinHandle<()>,
    /// Whether the test stopped it (so its exit is expected).
    stopping: bool,
}

/// Candidate processes on one Lease, with their leadership history on one clock.
///
/// Dropping a fleet kills its processes.
#[derive(Debug)]
pub struct Fleet {
    kubeconfig: PathBuf,
    namespace: String,
    lease: String,
    lease_candidate: PathBuf,
    state: Arc<Mutex<State>>,
    candidates: BTreeMap<String, Candidate>,
}

impl Fleet {
    /// A fleet for the Lease `namespace/lease`; `lease_candidate` is the `lease-candidate` binary
    /// (`env!("CARGO_BIN_EXE_lease-candidate")` in a test).
    pub fn new(kubeconfig: &Path, namespace: &str, lease: &str, lease_candidate: &Path) -> Self {
        Self {
            kubeconfig: kubeconfig.to_owned(),
            namespace: namespace.to_owned(),
            lease: lease.to_owned(),
            lease_candidate: lease_candidate.to_owned(),
            state: Arc::default(),
            candidates: BTreeMap::new(),
        }
    }

    /// Starts a candidate named `identity`.
    pub fn spawn(&mut self, implementation: Implementation, identity: &str) {
        self.spawn_versioned(implementation, identity, None);
    }

    /// Starts a candidate named `identity`; a coordinated one of `version` (binary and
    /// emulation version, the controller's choice: the oldest leads). A kube-leader candidate
    /// with a version takes part in coordinated leader election too.
    pub fn spawn_versioned(&mut self, implementation: Implementation, identity: &str, version: Option<&str>) {
        assert!(
            !self.candidates.contains_key(identity),
            "{identity} was started before"
        );
        let mut command = match implementation {
            Implementation::KubeLeader => {
                let mut c = Command::new(&self.lease_candidate);
                c.arg(&self.kubeconfig).args([
                    &self.namespace,
                    &self.lease,
                    identity,
                    &LEASE.as_millis().to_string(),
                    &RENEW.as_millis().to_string(),
                    &RETRY.as_millis().to_string(),
                ]);
                c.env("KUBE_LEADER_COORDINATED", version.unwrap_or_default());
                c
            }
            Implementation::ClientGo | Implementation::ClientGoCoordinated => {
                let mut c = Command::new(go_candidate());
                c.arg(format!("--kubeconfig={}", self.kubeconfig.display()))
                    .arg(format!("--namespace={}", self.namespace))
                    .arg(format!("--lease={}", self.lease))
                    .arg(format!("--identity={identity}"))
                    .arg(format!("--lease-duration={}ms", LEASE.as_millis()))
                    .arg(format!("--renew-deadline={}ms", RENEW.as_millis()))
                    .arg(format!("--retry-period={}ms", RETRY.as_millis()));
                if implementation == Implementation::ClientGoCoordinated {
                    c.arg("--coordinated");
                    if let Some(v) = version {
                        c.arg(format!("--binary-version={v}"))
                            .arg(format!("--emulation-version={v}"));
                    }
                }
                c
            }
        };
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("could not start {implementation} candidate {identity}: {e}"));
        let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let state = Arc::clone(&self.state);
        let reader = tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) else {
                    continue;
                };
                let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
                state.history.record_event(&event);
                state.events.push(event);
            }
        });
        self.candidates.insert(
            identity.to_owned(),
            Candidate {
                implementation,
                child,
                reader,
                stopping: false,
            },
        );
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The implementation of the candidate `identity`.
    pub fn implementation(&self, identity: &str) -> Implementation {
        self.candidates
            .get(identity)
            .unwrap_or_else(|| panic!("no candidate {identity}"))
            .implementation
    }

    /// Who leads now, as far as the events read so far tell (every candidate with an open term).
    pub fn leaders(&self) -> Vec<String> {
        self.state()
            .history
            .leaders()
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    /// Waits until exactly one candidate leads and it is not one of `not`; returns it and when
    /// its term began (CLOCK_MONOTONIC ns). Panics after [`PATIENCE`].
    pub async fn wait_leader(&self, not: &[&str]) -> (String, u64) {
        wait_for("one leader", PATIENCE, || async {
            let state = self.state();
            let leaders = state.history.leaders();
            match leaders[..] {
                [leader] if !not.contains(&leader) => {
                    let term = state
                        .history
                        .terms()
                        .iter()
                        .rev()
                        .find(|t| t.candidate == leader)
                        .expect("a leader has a term");
                    Some((leader.to_owned(), term.start))
                }
                _ => None,
            }
        })
        .await
    }

    /// Stops the candidate `identity` and waits until it has exited and its last event is read.
    /// Returns when it stopped leading if it led (its `stopped_leading`, or for a crash the
    /// moment its exit was seen, after which it certainly cannot act).
    pub async fn stop(&mut self, identity: &str, how: Stop) -> Option<u64> {
        let candidate = self
            .candidates
            .get_mut(identity)
            .unwrap_or_else(|| panic!("no candidate {identity}"));
        candidate.stopping = true;
        let pid = nix::unistd::Pid::from_raw(
            i32::try_from(candidate.child.id().expect("the candidate runs")).expect("a pid"),
        );
        kill(
            pid,
            match how {
                Stop::Release => Signal::SIGTERM,
                Stop::Crash => Signal::SIGKILL,
            },
        )
        .expect("signal the candidate");
        let status = tokio::time::timeout(PATIENCE, candidate.child.wait())
            .await
            .unwrap_or_else(|_| panic!("{identity} did not exit within {PATIENCE:?} of {how:?}"))
            .expect("wait for the candidate");
        let dead = mono_ns();
        tokio::time::timeout(PATIENCE, &mut candidate.reader)
            .await
            .unwrap_or_else(|_| panic!("the output of {identity} did not end"))
            .expect("the reader task");
        if how == Stop::Release {
            assert!(status.success(), "{identity} exited with {status} after SIGTERM");
        }
        let mut state = self.state();
        if state.history.leaders().contains(&identity) {
            assert_eq!(
                how,
                Stop::Crash,
                "{identity} exited after SIGTERM without stopped_leading"
            );
            state.history.ended(identity, dead);
        }
        state
            .history
            .terms()
            .iter()
            .rev()
            .find(|t| t.candidate == identity)
            .and_then(|t| t.end)
    }

    /// Freezes (SIGSTOP) or thaws (SIGCONT) the candidate `identity`; the history cuts its frozen
    /// spans out of its terms.
    pub fn freeze(&mut self, identity: &str, frozen: bool) {
        let child = &self.candidates[identity].child;
        let pid = nix::unistd::Pid::from_raw(
            i32::try_from(child.id().expect("the candidate runs")).expect("a pid"),
        );
        if frozen {
            kill(pid, Signal::SIGSTOP).expect("SIGSTOP");
            self.state().history.froze(identity, mono_ns());
        } else {
            let at = mono_ns();
            kill(pid, Signal::SIGCONT).expect("SIGCONT");
            self.state().history.thawed(identity, at);
        }
    }

    /// The candidates that exited although the test did not stop them, with how they exited.
    pub fn unexpected_exits(&mut self) -> Vec<String> {
        self.candidates
            .iter_mut()
            .filter(|(_, c)| !c.stopping)
            .filter_map(|(id, c)| {
                let status = c.child.try_wait().ok().flatten()?;
                Some(format!("{id} ({}) exited with {status}", c.implementation))
            })
            .collect()
    }

    /// The history so far, checked up to now.
    pub fn report(&self) -> Report {
        self.state().history.report(mono_ns())
    }

    /// A copy of the history so far.
    pub fn history(&self) -> History {
        self.state().history.clone()
    }

    /// Every event line read so far.
    pub fn events(&self) -> Vec<serde_json::Value> {
        self.state().events.clone()
    }

    /// Panics if two candidates ever led at once, or if a candidate exited that the test did not
    /// stop; else returns the report.
    pub fn assert_safe(&mut self) -> Report {
        let report = self.report();
        report.assert_safe();
        let exits = self.unexpected_exits();
        assert!(exits.is_empty(), "candidates exited unasked: {exits:?}");
        report
    }
}
