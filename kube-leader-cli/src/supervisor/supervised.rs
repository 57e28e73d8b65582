//! COMMAND under its supervisor, for `run` and `run --shards` alike: started, confirmed,
//! signalled, stopped; its supervisor's reports read, and its end told as one plain result.

use std::time::Duration;

use nix::unistd::Pid;
use tokio::time::Instant;
use tracing::debug;

use super::{Control, Report, Supervisor, SupervisorProcess};

/// COMMAND under its supervisor.
#[derive(Debug)]
pub(crate) struct Supervised {
    process: SupervisorProcess,
    said: Said,
}

/// The control socket, and what the supervisor said on it.
#[derive(Debug)]
struct Said {
    control: Control,
    /// Why it was stopped, if it was.
    stopped: Option<Stop>,
    /// COMMAND's pid (and process group), once started.
    pid: Option<u32>,
}

/// What the supervisor said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// COMMAND runs with this pid.
    Started(u32),
    /// The supervisor stopped COMMAND: its deadline passed this long ago.
    Expired(Duration),
    /// COMMAND outlived its deadline by the grace: kube-leader killed it, and its supervisor.
    Backstop,
    /// COMMAND is gone.
    Ended(Ended),
}

// === impl Supervised ===

impl Supervised {
    pub(crate) fn new(supervisor: Supervisor) -> Self {
        let Supervisor { process, control } = supervisor;
        let said = Said {
            control,
            stopped: None,
            pid: None,
        };
        Self { process, said }
    }

    /// Starts COMMAND with `env` added to its environment, confirmed until `until`.
    pub(crate) async fn start(&mut self, until: Instant, env: &[(&str, String)]) {
        self.said.control.start(until, env).await;
    }

    /// COMMAND is confirmed until `until`.
    pub(crate) async fn confirm_until(&mut self, until: Instant) {
        self.said.control.confirm_until(until).await;
    }

    /// Stops COMMAND (SIGTERM, grace, SIGKILL).
    pub(crate) async fn stop(&mut self) {
        self.said.stopped.get_or_insert(Stop::Asked);
        self.said.control.stop().await;
    }

    /// Forwards `signo` to COMMAND's process group.
    pub(crate) async fn signal(&mut self, signo: i32) {
        self.said.control.signal(signo).await;
    }

    /// Whether it was asked to stop, or its supervisor stopped it.
    pub(crate) fn stopped(&self) -> bool {
        self.said.stopped.is_some()
    }

    /// COMMAND's pid, once started.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.said.pid
    }

    /// COMMAND's process group, once started.
    pub(crate) fn group(&self) -> Option<Pid> {
        self.said.control.command_group()
    }

    /// The next thing the supervisor says, or its exit.
    ///
    /// # Cancellation safety
    /// Cancel-safe while the supervisor runs; once it has exited, let [`died`](Self::died) run
    /// to its end.
    pub(crate) async fn event(&mut self) -> Event {
        let (exit, report) = self.next();
        tokio::select! {
            biased;
            code = exit => Event::Ended(self.died(code).await),
            event = report => event,
        }
    }

    /// The supervisor's exit (its code: then [`died`](Self::died)) and its next report, to be
    /// awaited side by side.
    ///
    /// # Cancellation safety
    /// Both are cancel-safe.
    pub(crate) fn next(
        &mut self,
    ) -> (
        impl std::future::Future<Output = u8> + '_,
        impl std::future::Future<Output = Event> + '_,
    ) {
        (self.process.wait(), self.said.report())
    }

    /// The supervisor exited with `code` before its last word was read: what it said last,
    /// and COMMAND's group killed and waited for unless it ended in order
    /// ([`Control::after_exit`]).
    pub(crate) async fn died(&mut self, code: u8) -> Ended {
        let said = &mut self.said;
        let mut orderly = false;
        for report in said.control.after_exit(code).await {
            orderly |= matches!(report, Report::Exited(_));
            said.note(&report);
        }
        said.ended(code, orderly)
    }
}

// === impl Said ===

impl Said {
    /// The next report of the supervisor (a failed start is logged and skipped).
    ///
    /// # Cancellation safety
    /// Cancel-safe.
    async fn report(&mut self) -> Event {
        loop {
            let report = self.control.report().await;
            self.note(&report);
            return match report {
                Report::Started(pid) => Event::Started(pid),
                Report::Expired(since) => Event::Expired(since),
                Report::Backstop => Event::Backstop,
                Report::Failed(code) => {
                    debug!(code, "COMMAND could not be started");
                    continue;
                }
                // COMMAND and what it left are gone, before the supervisor's own exit.
                Report::Exited(code) => Event::Ended(self.ended(code, true)),
            };
        }
    }

    /// Notes what `report` tells of COMMAND: its pid, and whether it was stopped.
    fn note(&mut self, report: &Report) {
        match *report {
            Report::Started(pid) => self.pid = Some(pid),
            Report::Expired(_) => self.stopped = Some(Stop::Expired),
            Report::Backstop => {
                self.stopped.get_or_insert(Stop::Asked);
            }
            Report::Failed(_) | Report::Exited(_) => {}
        }
    }

    fn ended(&self, code: u8, orderly: bool) -> Ended {
        Ended {
            code,
            stopped: self.stopped,
            orderly,
        }
    }
}

/// How COMMAND ended: each loop gives it its own meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ended {
    /// COMMAND's exit code (128+N for signal N), or its supervisor's.
    pub(crate) code: u8,
    /// Why it was stopped; `None`: it exited by itself.
    pub(crate) stopped: Option<Stop>,
    /// The supervisor said its last word: COMMAND and what it left are gone. `false`: the
    /// supervisor died, COMMAND died with it; its group was killed and waited for.
    pub(crate) orderly: bool,
}

/// Why COMMAND was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// kube-leader asked it to stop, or killed it past its deadline (the backstop).
    Asked,
    /// Its supervisor stopped it: its deadline passed.
    Expired,
}
