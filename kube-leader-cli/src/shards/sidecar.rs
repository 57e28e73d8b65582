//! The sidecar's loop while COMMAND runs: shards acquired and lost, the shard file rewritten
//! and COMMAND told on every change, shards handed back once COMMAND acknowledges.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    time::Duration,
};

use kube_leader::shards::{Assignments, Shard, ShardSet};
use nix::{
    sys::signal::{killpg, Signal},
    unistd::Pid,
};
use tokio::{
    process::Child,
    signal::unix::{signal, Signal as UnixSignal, SignalKind},
    sync::watch,
    time::Instant,
};
use tracing::{info, warn};

use super::{
    file::{list, read_ack, render, write_atomically},
    signal::{exit_code, forward, tell},
};

/// SIGTERM, SIGINT and SIGQUIT, forwarded to COMMAND.
pub(super) struct StopSignals {
    term: UnixSignal,
    int: UnixSignal,
    quit: UnixSignal,
}

impl StopSignals {
    pub(super) fn new() -> std::io::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            quit: signal(SignalKind::quit())?,
        })
    }
}

/// The shards held for COMMAND, and what COMMAND has been told of them.
pub(super) struct Sidecar {
    pub(super) assignments: Assignments,
    pub(super) held: watch::Receiver<ShardSet>,
    /// The set in the file now.
    pub(super) current: ShardSet,
    pub(super) generation: u64,
    /// COMMAND's process group.
    pub(super) group: Pid,
    pub(super) notify: Signal,
    pub(super) grace: Duration,
    pub(super) file: PathBuf,
    pub(super) ack: PathBuf,
    /// Held shards by index.
    pub(super) guards: BTreeMap<u32, Shard>,
    /// Shards lost, waiting for COMMAND: index → (generation, give up at).
    pub(super) pending: BTreeMap<u32, (u64, Instant)>,
    pub(super) engine_ended: bool,
    /// A change written to the file but not yet signalled (COMMAND has no handler yet), since.
    pub(super) untold: Option<Instant>,
    pub(super) warned: bool,
}

// === impl Sidecar ===

impl Sidecar {
    /// Runs until COMMAND exits; returns its exit code.
    pub(super) async fn until_exit(&mut self, child: &mut Child, stops: &mut StopSignals) -> u8 {
        let group = self.group;
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        loop {
            tokio::select! {
                biased;
                status = child.wait() => {
                    return match status {
                        Ok(s) => exit_code(s),
                        Err(_) => 1,
                    };
                }
                _ = stops.term.recv() => forward(group, Signal::SIGTERM),
                _ = stops.int.recv() => forward(group, Signal::SIGINT),
                _ = stops.quit.recv() => forward(group, Signal::SIGQUIT),
                shard = self.assignments.next(), if !self.engine_ended => self.on_shard(shard),
                Ok(()) = self.held.changed() => self.on_change(),
                _ = tick.tick(), if !self.pending.is_empty() || self.untold.is_some() => self.on_tick(),
            }
        }
    }

    /// A shard was acquired (`Some`), or the candidate stopped (`None`).
    fn on_shard(&mut self, shard: Option<Shard>) {
        let Some(shard) = shard else {
            self.engine_ended = true;
            warn!("the shard candidate stopped; stopping COMMAND");
            forward(self.group, Signal::SIGTERM);
            let deadline = Instant::now() + self.grace;
            let group = self.group;
            tokio::spawn(async move {
                tokio::time::sleep_until(deadline).await;
                let _ = killpg(group, Signal::SIGKILL);
            });
            return;
        };
        let index = shard.index();
        if !self.current.held.contains_key(&index) && !shard.leadership().is_leader() {
            self.pending.insert(
                index,
                (
                    self.generation,
                    Instant::now() + self.grace + Duration::from_secs(1),
                ),
            );
        }
        self.guards.insert(index, shard);
    }

    /// The held set changed: the file is rewritten and COMMAND told.
    fn on_change(&mut self) {
        let next = self.held.borrow_and_update().clone();
        if next.held != self.current.held {
            self.generation += 1;
            let generation = self.generation;
            let gone: BTreeSet<u32> = self
                .current
                .held
                .keys()
                .filter(|i| !next.held.contains_key(i))
                .copied()
                .collect();
            for index in gone {
                self.pending.insert(
                    index,
                    (generation, Instant::now() + self.grace + Duration::from_secs(1)),
                );
            }
            if let Err(e) = write_atomically(&self.file, &render(generation, &next)) {
                warn!(error = %e, file = %self.file.display(), "cannot write the shard file");
            }
            self.untold.get_or_insert_with(Instant::now);
            let notify = self.notify;
            if tell(self.group, notify, &mut self.untold) {
                info!(shards = %list(&next), generation, "shards changed; COMMAND told");
            } else {
                info!(shards = %list(&next), generation, signal = notify.as_str(), "shards changed; COMMAND is told once it handles the signal");
            }
        }
        self.current = next;
    }

    /// Every 50 ms while something waits: a change still untold, shards waiting for COMMAND's
    /// acknowledgement.
    fn on_tick(&mut self) {
        let since = self.untold;
        let (group, notify, generation) = (self.group, self.notify, self.generation);
        if since.is_some() && tell(group, notify, &mut self.untold) {
            info!(generation, "COMMAND handles the signal now; told");
        } else if since.is_some_and(|t| !self.warned && t.elapsed() >= self.grace) {
            self.warned = true;
            warn!(signal = notify.as_str(), pid = group.as_raw(), "COMMAND neither catches nor ignores the shard signal, so it is not sent (its default action would end COMMAND): install a handler (exec the program from a shell wrapper) or choose --shards-signal");
        }
        let acked = read_ack(&self.ack);
        let now = Instant::now();
        let done: Vec<u32> = self
            .pending
            .iter()
            .filter(|(_, (g, until))| *g <= acked || now >= *until)
            .map(|(i, _)| *i)
            .collect();
        for index in done {
            let g = self.pending.remove(&index).map_or(0, |(g, _)| g);
            if g > acked {
                warn!(
                    shard = index,
                    generation = g,
                    "COMMAND did not acknowledge in time; the shard was left to expire"
                );
            }
            // Not ours any more, or handed back once COMMAND stopped work on it.
            if !self.current.held.contains_key(&index) {
                self.guards.remove(&index);
            }
        }
    }
}
