//! One run of COMMAND in shards mode, under its supervisor: started with a set of shards,
//! kept within the set's deadline, told of changes (signal mode), stopped.

use std::collections::{BTreeMap, BTreeSet};

use nix::sys::signal::Signal;
use tokio::time::Instant;
use tracing::{info, warn};

use super::signal::handles;
use crate::supervisor::{Ended, Event, Launch, Supervised};

/// COMMAND now, as the sidecar sees it.
#[derive(Debug)]
pub(super) struct Run {
    command: Supervised,
    /// The shards COMMAND was started with or last told, with their fencing tokens.
    pub(super) told: BTreeMap<u32, u64>,
    /// Shards no longer told that COMMAND may still work: until it acknowledges `ack_wanted`.
    pub(super) leaving: BTreeSet<u32>,
    /// Signal mode: the generation told, and when; COMMAND acknowledges it.
    pub(super) ack_wanted: Option<(u64, Instant)>,
    /// Signal mode: a change told in the file whose signal waits for COMMAND's handler.
    pub(super) untold: Option<Signal>,
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
        let mut run = Self {
            command: Supervised::new(launch.spawn()?),
            told,
            leaving: BTreeSet::new(),
            ack_wanted: None,
            untold: None,
            sent: Some(until),
        };
        run.command.start(until, env).await;
        Ok(run)
    }

    /// Every shard COMMAND may work on now: those told, and those leaving until acknowledged.
    pub(super) fn working(&self) -> impl Iterator<Item = u32> + '_ {
        self.told.keys().copied().chain(self.leaving.iter().copied())
    }

    /// COMMAND's deadline is now `until`.
    pub(super) async fn confirm(&mut self, until: Instant) {
        if self.sent != Some(until) && !self.stopping() {
            self.sent = Some(until);
            self.command.confirm_until(until).await;
        }
    }

    /// Stops COMMAND (SIGTERM, grace, SIGKILL), once.
    pub(super) async fn stop(&mut self, why: &str) {
        if !self.stopping() {
            info!(why, "stopping COMMAND");
            self.command.stop().await;
        }
    }

    /// Asked to stop (or stopped by its supervisor).
    pub(super) fn stopping(&self) -> bool {
        self.command.stopped()
    }

    /// Forwards `signo` to COMMAND's process group.
    pub(super) async fn forward(&mut self, signo: i32) {
        self.command.signal(signo).await;
    }

    /// Signal mode: sends `signal` now if COMMAND's handler is installed, else holds it back.
    pub(super) async fn tell(&mut self, signal: Signal) -> bool {
        let ready = self.command.group().is_some_and(|pid| handles(pid, signal));
        if ready {
            self.untold = None;
            self.command.signal(signal as i32).await;
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
        match self.command.event().await {
            Event::Started(pid) => {
                info!(pid, shards = ?self.told.keys().collect::<Vec<_>>(), "started COMMAND");
            }
            Event::Expired(since) => warn!(
                ?since,
                "the supervisor stopped COMMAND: a shard of its set was not confirmed in time"
            ),
            Event::Backstop => {}
            Event::Ended(ended) => return Some(ended),
        }
        None
    }
}
