//! One run of COMMAND in shards mode, under its supervisor: started with a set of shards,
//! kept within the set's deadline, told of changes (signal mode), stopped.

use std::collections::{BTreeMap, BTreeSet};

use nix::sys::signal::Signal;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::signal::handles;
use crate::supervisor::{Control, Launch, Report, Supervisor, SupervisorProcess};

/// How a run of COMMAND ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ended {
    /// COMMAND's exit code (128+N for signal N).
    pub(super) code: u8,
    /// kube-leader asked it to stop (a restart, a lost deadline, a shutdown), or its supervisor
    /// stopped it because its deadline passed; `false`: COMMAND exited by itself.
    pub(super) stopped: bool,
    /// The supervisor said its last word: COMMAND and what it left are gone. `false`: the
    /// supervisor died, COMMAND died with it; its group was killed and waited for.
    pub(super) orderly: bool,
}

/// COMMAND now, as the sidecar sees it.
#[derive(Debug)]
pub(super) struct Run {
    process: SupervisorProcess,
    control: Control,
    /// The shards COMMAND was started with or last told, with their fencing tokens.
    pub(super) told: BTreeMap<u32, u64>,
    /// Shards no longer told that COMMAND may still work: until it acknowledges `ack_wanted`.
    pub(super) leaving: BTreeSet<u32>,
    /// Signal mode: the generation told, and when; COMMAND acknowledges it.
    pub(super) ack_wanted: Option<(u64, Instant)>,
    /// Signal mode: a change told in the file whose signal waits for COMMAND's handler.
    pub(super) untold: Option<Signal>,
    /// Asked to stop (or stopped by its supervisor).
    pub(super) stopping: bool,
    /// The deadline last sent to the supervisor.
    sent: Option<Instant>,
}

impl Run {
    /// Starts COMMAND with `env` and the shards `told`, confirmed until `until`.
    pub(super) async fn start(
        launch: &Launch,
        env: &[(&str, String)],
        told: BTreeMap<u32, u64>,
        until: Instant,
    ) -> anyhow::Result<Self> {
        let Supervisor { process, control } = launch.spawn()?;
        let mut run = Self {
            process,
            control,
            told,
            leaving: BTreeSet::new(),
            ack_wanted: None,
            untold: None,
            stopping: false,
            sent: Some(until),
        };
        run.control.start(until, env).await;
        Ok(run)
    }

    /// Every shard COMMAND may work on now: those told, and those leaving until acknowledged.
    pub(super) fn working(&self) -> impl Iterator<Item = u32> + '_ {
        self.told.keys().copied().chain(self.leaving.iter().copied())
    }

    /// COMMAND's deadline is now `until`.
    pub(super) async fn confirm(&mut self, until: Instant) {
        if self.sent != Some(until) && !self.stopping {
            self.sent = Some(until);
            self.control.confirm_until(until).await;
        }
    }

    /// Stops COMMAND (SIGTERM, grace, SIGKILL), once.
    pub(super) async fn stop(&mut self, why: &str) {
        if !self.stopping {
            info!(why, "stopping COMMAND");
            self.stopping = true;
            self.control.stop().await;
        }
    }

    /// Forwards `signo` to COMMAND's process group.
    pub(super) async fn forward(&mut self, signo: i32) {
        self.control.signal(signo).await;
    }

    /// Signal mode: sends `signal` now if COMMAND's handler is installed, else holds it back.
    pub(super) async fn tell(&mut self, signal: Signal) -> bool {
        let ready = self
            .control
            .command_group()
            .is_some_and(|pid| handles(pid, signal));
        if ready {
            self.untold = None;
            self.control.signal(signal as i32).await;
        } else {
            self.untold = Some(signal);
        }
        ready
    }

    /// The next thing that happens to COMMAND; `Some` once it is gone.
    ///
    /// # Cancellation safety
    /// Cancel-safe.
    pub(super) async fn event(&mut self) -> Option<Ended> {
        tokio::select! {
            biased;
            code = self.process.wait() => Some(self.died(code).await),
            report = self.control.report() => self.on_report(report),
        }
    }

    fn on_report(&mut self, report: Report) -> Option<Ended> {
        match report {
            Report::Started(pid) => {
                info!(pid, shards = ?self.told.keys().collect::<Vec<_>>(), "started COMMAND");
            }
            Report::Expired(since) => {
                warn!(
                    ?since,
                    "the supervisor stopped COMMAND: a shard of its set was not confirmed in time"
                );
                self.stopping = true;
            }
            Report::Backstop => self.stopping = true,
            Report::Failed(code) => debug!(code, "COMMAND could not be started"),
            Report::Exited(code) => {
                return Some(Ended {
                    code,
                    stopped: self.stopping,
                    orderly: true,
                })
            }
        }
        None
    }

    /// The supervisor exited before its last word was read (see [`Control::after_exit`]).
    async fn died(&mut self, code: u8) -> Ended {
        let words = self.control.after_exit(code).await;
        self.stopping |= words.expired;
        Ended {
            code,
            stopped: self.stopping,
            orderly: words.orderly,
        }
    }
}
