//! The sidecar's loop: shards acquired and lost, COMMAND started with its set, restarted or
//! told on every change, kept within its set's deadline; a shard released only once COMMAND
//! no longer works on it.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use kube_leader::{Assignments, Leadership, ShardSet};
use tokio::{sync::watch, time::Instant};
use tracing::{info, warn};

use super::{
    command::Run,
    file::{list, read_ack, render, write_atomically},
    warn_file,
};
use crate::{
    cli::OnChange,
    exit::{self, Fail},
    run::{Confirmed, Signals},
    supervisor::{Ended, Launch},
};

/// The shard set's timings: the lease duration, the renew deadline, the retry period.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timings {
    /// How long the first start waits for the fair share, and the hand-back for the shards.
    pub(super) lease_duration: Duration,
    /// How long the loop's own ping confirms COMMAND with no shard, and the candidate's end
    /// may take.
    pub(super) renew_deadline: Duration,
    /// How often that ping moves on.
    pub(super) retry_period: Duration,
}

/// How COMMAND runs: its launch, what a change of its shards does, the set's timings.
pub(super) struct Settings {
    pub(super) launch: Launch,
    pub(super) on_change: OnChange,
    pub(super) timings: Timings,
}

/// How often the loop looks at its shards' confirmations, COMMAND's acknowledgement and a
/// held-back signal (nothing is sent unless something changed).
const TICK: Duration = Duration::from_millis(50);

/// The shards held for COMMAND, and COMMAND.
pub(super) struct Sidecar {
    assignments: Assignments,
    /// The fair share and the members, as the candidate sees them.
    held: watch::Receiver<ShardSet>,
    /// Every shard guard held: a shard is released when its guard is dropped.
    guards: BTreeMap<u32, Held>,
    /// COMMAND now, if it runs.
    run: Option<Run>,
    on_change: OnChange,
    launch: Launch,
    timings: Timings,
    /// This loop's own ping (as a skipped election's in plain `run`): every retry period, not
    /// every tick; it confirms COMMAND only while the set holds no shard.
    ping: Confirmed,
    /// Until when the last ping confirmed COMMAND.
    pinged: Instant,
    env: Vec<(&'static str, String)>,
    file: PathBuf,
    ack: PathBuf,
    generation: u64,
    /// COMMAND starts with its fair share, or with what there is by then.
    first_start_by: Instant,
    started_once: bool,
    /// Restart mode: since when an addition to the set waits for the rest of the share.
    adding_since: Option<Instant>,
    /// kube-leader was told to stop, or the candidate ended: no new run of COMMAND.
    stopping: bool,
    engine_ended: bool,
    /// COMMAND's end is not known to be orderly (its supervisor died): the shards are not
    /// handed back but left to expire, as if this process had crashed.
    abandoned: bool,
}

// === impl Sidecar ===

impl Sidecar {
    pub(super) fn new(
        Settings {
            launch,
            on_change,
            timings,
        }: Settings,
        assignments: Assignments,
        env: Vec<(&'static str, String)>,
        file: PathBuf,
        ack: PathBuf,
    ) -> Self {
        Self {
            held: assignments.held(),
            assignments,
            guards: BTreeMap::new(),
            run: None,
            on_change,
            launch,
            timings,
            ping: Confirmed::ping(timings.renew_deadline, timings.retry_period),
            pinged: Instant::now() + timings.renew_deadline,
            env,
            file,
            ack,
            generation: 0,
            first_start_by: Instant::now() + timings.lease_duration,
            started_once: false,
            adding_since: None,
            stopping: false,
            engine_ended: false,
            abandoned: false,
        }
    }

    /// Runs until COMMAND has ended for good; `stops` are the stop signals (forwarded to
    /// COMMAND); returns the exit code.
    pub(super) async fn run(&mut self, stops: &mut Signals) -> u8 {
        let mut tick = tokio::time::interval(TICK);
        loop {
            if let Some(code) = self.reconcile().await {
                return code;
            }
            tokio::select! {
                biased;
                ended = ended(&mut self.run) => {
                    if let Some(code) = self.on_ended(ended) {
                        return code;
                    }
                }
                kind = stops.recv() => {
                    let signo = kind.as_raw_value();
                    self.stopping = true;
                    match &mut self.run {
                        Some(run) => {
                            info!(signal = signo, "forwarding signal to COMMAND");
                            run.forward(signo).await;
                        }
                        None => return 0,
                    }
                }
                shard = self.assignments.next(), if !self.engine_ended => self.on_shard(shard).await,
                Some(until) = self.ping.next() => self.pinged = until,
                _ = tick.tick() => {}
            }
        }
    }

    /// A shard was acquired (`Some`), or the candidate stopped (`None`).
    async fn on_shard(&mut self, shard: Option<(u32, Leadership)>) {
        match shard {
            Some((index, shard)) => {
                let confirmations = shard.confirmations();
                let confirmed = Confirmed::from_writes(confirmations, self.timings.renew_deadline);
                self.guards.insert(index, Held { shard, confirmed });
            }
            None => {
                self.engine_ended = true;
                self.stopping = true;
                warn!("the shard candidate stopped; stopping COMMAND");
                if let Some(run) = &mut self.run {
                    run.stop("the shard candidate stopped").await;
                }
            }
        }
    }

    /// COMMAND ended: `Some(code)` when kube-leader ends with it, `None` for a restart.
    fn on_ended(&mut self, ended: Ended) -> Option<u8> {
        self.run = None;
        if !ended.orderly {
            self.abandoned = true;
            return Some(exit::LOST);
        }
        let stopped = ended.stopped.is_some();
        if self.stopping || !stopped {
            if !stopped {
                info!(code = ended.code, "COMMAND exited");
            }
            return Some(ended.code);
        }
        info!(
            code = ended.code,
            "COMMAND stopped; starting it again with its shards"
        );
        None
    }

    /// The shards that are ours now, with their fencing tokens.
    fn desired(&self) -> BTreeMap<u32, u64> {
        self.guards
            .iter()
            .filter(|(_, h)| h.shard.is_leader())
            .map(|(i, h)| (*i, h.shard.fencing_token()))
            .collect()
    }

    /// Brings COMMAND in line with the shards: releases what nobody works on, starts COMMAND,
    /// restarts or tells it of a change, sends its deadline. `Some(code)` to end.
    async fn reconcile(&mut self) -> Option<u8> {
        let desired = self.desired();
        let working: Vec<u32> = self
            .run
            .as_ref()
            .map(|r| r.working().collect())
            .unwrap_or_default();
        // Not ours any more and not worked on: released (the guard's drop lets the engine).
        self.guards
            .retain(|i, h| h.shard.is_leader() || working.contains(i));
        if self.run.is_none() {
            if self.stopping {
                return Some(0);
            }
            return self.start(desired).await;
        }
        if !self.stopping && self.run.as_ref().is_some_and(|r| !r.stopping()) {
            match self.on_change {
                OnChange::Restart => self.restart_on_change(&desired).await,
                OnChange::Signal(sig) => self.signal_on_change(desired, sig).await,
            }
        }
        let until = self.deadline();
        if let Some(run) = &mut self.run {
            run.confirm(until).await;
        }
        None
    }

    /// Starts COMMAND with `set` (once its share is held, or the first wait is over).
    async fn start(&mut self, set: BTreeMap<u32, u64>) -> Option<u8> {
        let quota = self.held.borrow().quota as usize;
        let now = Instant::now();
        if !self.started_once && set.len() < quota.max(1) && now < self.first_start_by {
            return None;
        }
        self.generation += 1;
        if let Err(e) = write_atomically(&self.file, &render(self.generation, &set)) {
            warn_file(&e, &self.file);
        }
        let mut env: Vec<(&str, String)> = self.env.iter().map(|(k, v)| (*k, v.clone())).collect();
        env.push(("KUBE_LEADER_SHARD_SET", list(&set)));
        env.push(("KUBE_LEADER_SHARDS_GENERATION", self.generation.to_string()));
        if let OnChange::Signal(sig) = self.on_change {
            env.push(("KUBE_LEADER_SHARDS_SIGNAL", sig.as_str().to_string()));
        }
        let until = self.deadline_of(set.keys().copied());
        let shards = list(&set);
        match Run::start(&self.launch, &env, set, until).await {
            Ok(run) => {
                info!(shards = %shards, generation = self.generation, "starting COMMAND");
                self.run = Some(run);
                self.started_once = true;
                self.adding_since = None;
                None
            }
            Err(e) => {
                warn!(error = %format!("{e:#}"), "cannot start the supervisor");
                Some(1)
            }
        }
    }

    /// Restart mode: a shard gone from the set stops COMMAND at once; an addition waits for
    /// the rest of the share (at most a second), so that joining shards cost one restart.
    async fn restart_on_change(&mut self, desired: &BTreeMap<u32, u64>) {
        let Some(run) = &mut self.run else { return };
        if *desired == run.told {
            self.adding_since = None;
            return;
        }
        let removed = run.told.keys().any(|i| !desired.contains_key(i));
        let quota = self.held.borrow().quota as usize;
        let since = *self.adding_since.get_or_insert_with(Instant::now);
        if removed || desired.len() >= quota || since.elapsed() >= Duration::from_secs(1) {
            run.stop("its shards changed (--on-shards-change restart)").await;
        }
    }

    /// Signal mode: the file rewritten and COMMAND signalled on a change; leaving shards
    /// released once it acknowledges; restarted without an acknowledgement within the grace.
    async fn signal_on_change(&mut self, desired: BTreeMap<u32, u64>, sig: nix::sys::signal::Signal) {
        let acked = read_ack(&self.ack);
        let Some(run) = &mut self.run else { return };
        if desired != run.told {
            self.generation += 1;
            let gone: Vec<u32> = run
                .told
                .keys()
                .filter(|i| !desired.contains_key(i))
                .copied()
                .collect();
            run.leaving.extend(gone);
            if let Err(e) = write_atomically(&self.file, &render(self.generation, &desired)) {
                warn_file(&e, &self.file);
            }
            info!(shards = %list(&desired), generation = self.generation, "shards changed; telling COMMAND");
            run.told = desired;
            run.ack_wanted = Some((self.generation, Instant::now()));
            run.tell(sig).await;
        } else if let Some(sig) = run.untold {
            run.tell(sig).await;
        }
        match run.ack_wanted {
            Some((generation, _)) if acked >= generation => {
                run.ack_wanted = None;
                run.leaving.clear();
            }
            Some((generation, told)) if told.elapsed() >= self.launch.grace => {
                warn!(generation, grace = %humantime::format_duration(self.launch.grace),
                    "COMMAND did not acknowledge its shards in time; restarting it");
                run.stop("no acknowledgement within --grace").await;
            }
            _ => {}
        }
    }

    /// COMMAND's deadline: the earliest confirmation of the shards it works on; with none,
    /// this loop's own ping.
    fn deadline(&mut self) -> Instant {
        let working: Vec<u32> = self
            .run
            .as_ref()
            .map(|r| r.working().collect())
            .unwrap_or_default();
        self.deadline_of(working.into_iter())
    }

    fn deadline_of(&mut self, shards: impl Iterator<Item = u32>) -> Instant {
        let now = Instant::now();
        let guards = &mut self.guards;
        let each = shards.map(|i| guards.get_mut(&i).map_or(now, |h| h.confirmed.until()));
        earliest(each, self.pinged)
    }

    /// COMMAND's end is not known to be orderly (its supervisor died, or had to be killed by
    /// the backstop): its process group was killed and waited for, but what it left elsewhere
    /// cannot be known gone, so nothing may be handed back (see [`abandon`](Self::abandon)).
    pub(super) fn abandoned(&self) -> bool {
        self.abandoned
    }

    /// Leaves every shard held, unreleased, to expire as if this process had crashed: no other
    /// replica's COMMAND starts on them before their lease duration has passed. Dropping the
    /// guards or stopping the candidate would release them; the process exits right after.
    pub(super) fn abandon(self) {
        warn!(shards = ?self.guards.keys().collect::<Vec<_>>(),
            "COMMAND's end is not known to be orderly (its supervisor died): not releasing the \
             shards; they expire");
        std::mem::forget(self);
    }

    /// COMMAND is gone: hands every shard back and removes the files.
    pub(super) async fn hand_back(mut self) -> Result<(), Fail> {
        // Nothing acts on any shard any more, nor on one acquired meanwhile.
        self.guards.clear();
        let assignments = &mut self.assignments;
        let _ = tokio::time::timeout(self.timings.lease_duration, async {
            while let Some(shard) = assignments.next().await {
                drop(shard);
            }
        })
        .await;
        let renew_deadline = self.timings.renew_deadline;
        let result = match tokio::time::timeout(renew_deadline, self.assignments.finish()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                warn!(error = %e, "the shard candidate failed");
                Err(Fail::new(exit::for_error(&e), e))
            }
            Err(_) => {
                warn!("handing the shards back timed out");
                Ok(())
            }
        };
        let _ = std::fs::remove_file(&self.file);
        let _ = std::fs::remove_file(&self.ack);
        result
    }
}

/// A shard held, and its confirmations.
struct Held {
    /// Its guard: the shard is released when it is dropped.
    shard: Leadership,
    /// Until when it is confirmed: its term's confirmations alone, never the ping.
    confirmed: Confirmed,
}

/// The earliest of the shards' deadlines; `ping` only with no shard. A shard whose term is
/// lost, or not confirmed, brings its own deadline (now at the latest), never the ping.
fn earliest(shards: impl Iterator<Item = Instant>, ping: Instant) -> Instant {
    shards.min().unwrap_or(ping)
}

/// How the current run of COMMAND ends; pending while none runs.
///
/// # Cancellation safety
/// Cancel-safe ([`Run::event`] is).
async fn ended(run: &mut Option<Run>) -> Ended {
    match run {
        Some(run) => loop {
            if let Some(ended) = run.event().await {
                return ended;
            }
        },
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::{sync::watch, time::Instant};

    use super::earliest;
    use crate::run::Confirmed;

    #[tokio::test(start_paused = true)]
    async fn a_lost_term_never_falls_back_to_the_ping() {
        let now = Instant::now();
        let ping = now + Duration::from_secs(10);
        // Never confirmed, and its keeper gone: now, not the ping.
        let (tx, rx) = watch::channel(None);
        drop(tx);
        let mut lost = Confirmed::from_writes(rx, Duration::from_secs(10));
        assert_eq!(earliest([lost.until()].into_iter(), ping), now);
        // Confirmed once, then lost: its last confirmation, though long past.
        let (tx, rx) = watch::channel(Some(now - Duration::from_secs(30)));
        let mut lapsed = Confirmed::from_writes(rx, Duration::from_secs(10));
        drop(tx);
        let until = earliest([lapsed.until()].into_iter(), ping);
        assert_eq!(until, now - Duration::from_secs(30));
        // One confirmed shard and one lost: the lost one's.
        let (_tx, rx) = watch::channel(Some(now + Duration::from_secs(5)));
        let mut held = Confirmed::from_writes(rx, Duration::from_secs(10));
        assert_eq!(earliest([held.until(), lost.until()].into_iter(), ping), now);
        // No shard at all: the ping.
        assert_eq!(earliest(std::iter::empty(), ping), ping);
    }
}
