//! kube-leader's side: the supervisor process, and the control socket it is driven over.

use std::{ffi::OsString, process::Stdio, time::Duration};

use anyhow::Context as _;
use nix::{sys::signal::Signal, unistd::Pid};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines},
    net::unix::{OwnedReadHalf, OwnedWriteHalf},
    process::{Child, Command},
    time::Instant,
};
use tracing::{debug, warn};

use super::{
    clock::to_mono,
    protocol::{log_format_arg, Start},
    reap::{kill_group_and_wait, send_group, waited_by_handle},
};
use crate::{cli::LogFormat, exit};

/// What the supervisor reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Report {
    /// COMMAND runs with this pid (and process group).
    Started(u32),
    /// The supervisor stopped COMMAND because heartbeats stopped.
    Expired(Duration),
    /// COMMAND could not be started.
    Failed(u8),
    /// COMMAND, and what it left, are gone: the supervisor's last word before it exits.
    Exited(u8),
    /// kube-leader's backstop fired: COMMAND still ran at the last confirmed instant + grace,
    /// so the supervisor did not stop it (stopped, traced or stuck): kube-leader killed
    /// COMMAND's process group, and the supervisor.
    Backstop,
}

/// kube-leader's handle on its supervisor process.
#[derive(Debug)]
pub(crate) struct Supervisor {
    /// The supervisor process: it exits with COMMAND's exit code.
    pub(crate) process: SupervisorProcess,
    /// The control socket.
    pub(crate) control: Control,
}

/// The supervisor process.
#[derive(Debug)]
pub(crate) struct SupervisorProcess(Child);

/// The control socket to the supervisor, and kube-leader's own deadline on COMMAND.
///
/// The supervisor enforces COMMAND's deadline (the last confirmed instant, then `grace`), but
/// a supervisor can be stopped on its own (SIGSTOP, a debugger, a freezer on part of the
/// tree): kube-leader then enforces the same deadline itself. It remembers the last instant
/// it confirmed and COMMAND's process group; should COMMAND still run at that instant +
/// `grace` (no `exited` from the supervisor), [`report`](Self::report) kills the group
/// (SIGKILL) and reports [`Report::Backstop`].
#[derive(Debug)]
pub(crate) struct Control {
    tx: OwnedWriteHalf,
    lines: Lines<BufReader<OwnedReadHalf>>,
    reports_closed: bool,
    grace: Duration,
    /// The last confirmed instant sent (`start`, `until`).
    until: Option<Instant>,
    /// COMMAND's process group, once the supervisor reported it started.
    group: Option<Pid>,
    /// The supervisor's own pid: the backstop kills it too.
    supervisor: Option<Pid>,
    /// COMMAND is known to be gone (`exited`), or the backstop fired.
    done: bool,
}

/// What starts a supervisor: COMMAND, its grace, and the log format.
#[derive(Debug, Clone)]
pub(crate) struct Launch {
    /// COMMAND and its arguments.
    pub(crate) command: Vec<OsString>,
    /// From SIGTERM to SIGKILL.
    pub(crate) grace: Duration,
    /// The supervisor's log format.
    pub(crate) log_format: LogFormat,
}

impl Launch {
    /// Starts a supervisor for COMMAND ([`Supervisor::spawn`]).
    pub(crate) fn spawn(&self) -> anyhow::Result<Supervisor> {
        Supervisor::spawn(&self.command, self.grace, self.log_format)
    }

    /// A supervisor started in advance, while this candidate follows; `None` (with a warning)
    /// if it cannot start: it is started again once leading.
    pub(crate) fn standby(&self) -> Option<Supervisor> {
        self.spawn()
            .map_err(|e| warn!(error = %format!("{e:#}"), "cannot start the supervisor in advance"))
            .ok()
    }
}

impl Supervisor {
    /// Starts `kube-leader __supervise -- COMMAND`, which gets COMMAND's process ready and waits
    /// for [`Control::start`].
    pub(crate) fn spawn(
        command: &[OsString],
        grace: Duration,
        log_format: LogFormat,
    ) -> anyhow::Result<Self> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().context("create the control socket")?;
        let exe = std::env::current_exe().context("find kube-leader's own executable")?;
        let mut cmd = Command::new(exe);
        // A process group of its own: a stop of kube-leader's group (Ctrl-Z in a terminal,
        // SIGSTOP to the group) leaves the supervisor running, and it stops COMMAND by its
        // deadline; a stop of the supervisor alone is kube-leader's to catch (the backstop).
        cmd.process_group(0)
            .arg("--log-format")
            .arg(log_format_arg(log_format))
            .arg("__supervise")
            .arg("--grace")
            .arg(format!("{}ms", grace.as_millis()))
            .arg("--")
            .args(command)
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
            .kill_on_drop(false);
        let process = cmd.spawn().context("start the supervisor process")?;
        let supervisor = process.id().and_then(|p| i32::try_from(p).ok());
        if let Some(pid) = supervisor {
            waited_by_handle(pid);
        }
        ours.set_nonblocking(true).context("control socket")?;
        let sock = tokio::net::UnixStream::from_std(ours).context("control socket")?;
        let (rx, tx) = sock.into_split();
        let control = Control {
            tx,
            lines: BufReader::new(rx).lines(),
            reports_closed: false,
            grace,
            until: None,
            group: None,
            supervisor: supervisor.map(Pid::from_raw),
            done: false,
        };
        Ok(Self {
            process: SupervisorProcess(process),
            control,
        })
    }
}

impl Control {
    /// Start COMMAND with `env` added to its environment: leadership is confirmed until
    /// `until`.
    pub(crate) async fn start(&mut self, until: Instant, env: &[(&str, String)]) {
        self.until = Some(until);
        let start = Start {
            until_ns: u64::try_from(to_mono(until).as_nanos()).unwrap_or(u64::MAX),
            env: env.iter().map(|(k, v)| ((*k).to_string(), v.clone())).collect(),
        };
        let json = serde_json::to_string(&start).unwrap_or_default();
        self.send(&format!("start {json}")).await;
    }

    /// Leadership is confirmed until `until` (an instant of this process's monotonic clock,
    /// sent as the CLOCK_MONOTONIC reading both processes share).
    pub(crate) async fn confirm_until(&mut self, until: Instant) {
        self.until = Some(until);
        self.send(&format!("until {}", to_mono(until).as_nanos())).await;
    }

    /// Leadership is lost: stop COMMAND (SIGTERM, grace, SIGKILL).
    pub(crate) async fn stop(&mut self) {
        self.send("stop").await;
    }

    /// Forwards a signal to COMMAND.
    pub(crate) async fn signal(&mut self, signo: i32) {
        self.send(&format!("signal {signo}")).await;
    }

    async fn send(&mut self, line: &str) {
        let text = format!("{line}\n");
        let write = self.tx.write_all(text.as_bytes());
        match tokio::time::timeout(Duration::from_secs(1), write).await {
            Ok(Ok(())) => {}
            // The supervisor exited: its exit status tells the rest.
            Ok(Err(e)) => debug!(error = %e, line, "supervisor gone"),
            Err(_) => warn!(line, "the supervisor does not read its control socket"),
        }
    }

    /// The next report; `None` once the supervisor closed its side (it exited).
    ///
    /// # Cancellation safety
    /// Cancel-safe (tokio's `Lines::next_line` is).
    pub(crate) async fn next_report(&mut self) -> Option<Report> {
        loop {
            if self.reports_closed {
                return None;
            }
            let line = match self.lines.next_line().await {
                Ok(Some(line)) => line,
                _ => {
                    self.reports_closed = true;
                    continue;
                }
            };
            let mut words = line.split_whitespace();
            let report = match (words.next(), words.next().and_then(|w| w.parse::<u64>().ok())) {
                (Some("started"), Some(pid)) => Report::Started(u32::try_from(pid).unwrap_or_default()),
                (Some("expired"), Some(ms)) => Report::Expired(Duration::from_millis(ms)),
                (Some("failed"), Some(code)) => Report::Failed(u8::try_from(code).unwrap_or(1)),
                (Some("exited"), Some(code)) => Report::Exited(u8::try_from(code).unwrap_or(1)),
                _ => continue,
            };
            match report {
                Report::Started(pid) => self.group = i32::try_from(pid).ok().map(Pid::from_raw),
                Report::Exited(_) => self.done = true,
                _ => {}
            }
            return Some(report);
        }
    }

    /// The next report, or [`Report::Backstop`] once COMMAND outlived its deadline; pending
    /// forever once the supervisor closed its side and the backstop has nothing to do.
    ///
    /// # Cancellation safety
    /// Cancel-safe.
    pub(crate) async fn report(&mut self) -> Report {
        let backstop = match (self.until, self.group, self.done) {
            (Some(until), Some(_), false) => Some(until + self.grace),
            _ => None,
        };
        tokio::select! {
            biased;
            _ = tokio::time::sleep_until(backstop.unwrap_or_else(Instant::now)), if backstop.is_some() => {
                self.fire_backstop();
                Report::Backstop
            }
            report = self.next_report() => match report {
                Some(r) => r,
                None => match backstop {
                    Some(at) => {
                        tokio::time::sleep_until(at).await;
                        self.fire_backstop();
                        Report::Backstop
                    }
                    None => std::future::pending().await,
                },
            },
        }
    }

    /// Kills COMMAND's process group, and the supervisor that did not stop it by its deadline
    /// (stopped or stuck: it cannot end in order any more, so kube-leader's wait for it ends and
    /// the term is abandoned, not released).
    fn fire_backstop(&mut self) {
        self.done = true;
        if let Some(group) = self.group {
            warn!(pgid = group.as_raw(), grace = %humantime::format_duration(self.grace),
                "COMMAND still runs past its deadline (its supervisor is stopped or stuck): killing its process group and the supervisor");
            send_group(group, Signal::SIGKILL);
        }
        if let Some(pid) = self.supervisor {
            let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
        }
    }

    /// COMMAND's process group (its pid), once the supervisor reported that it started.
    pub(crate) fn command_group(&self) -> Option<Pid> {
        self.group
    }

    /// The supervisor has exited with `code` before its last word was read: what it said last
    /// (read for at most 1 s). If it did not say `exited` (it was killed, or crashed), COMMAND
    /// died with it but what COMMAND left may still be going away: COMMAND's process group is
    /// killed and waited for (at most 2 s). Every mode that runs COMMAND ends a supervisor's
    /// death here, so no mode can leave COMMAND's group behind.
    pub(crate) async fn after_exit(&mut self, code: u8) -> Vec<Report> {
        let reports = self.last_reports().await;
        if !reports.iter().any(|r| matches!(r, Report::Exited(_))) {
            let pgid = self.group.map(Pid::as_raw);
            warn!(
                code,
                pgid, "the supervisor died unexpectedly; killing COMMAND's process group"
            );
            if let Some(group) = self.group {
                if !kill_group_and_wait(group, Duration::from_secs(2)).await {
                    warn!(pgid, "COMMAND's process group would not die");
                }
            }
        }
        reports
    }

    /// The reports still buffered once the supervisor has exited (read for at most 1 s).
    async fn last_reports(&mut self) -> Vec<Report> {
        let mut reports = Vec::new();
        let drain = async {
            while let Some(report) = self.next_report().await {
                reports.push(report);
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
        reports
    }
}

impl SupervisorProcess {
    /// Whether it has exited already (a supervisor started in advance may have died).
    pub(crate) fn has_exited(&mut self) -> bool {
        !matches!(self.0.try_wait(), Ok(None))
    }

    /// Waits for the supervisor to exit; returns its exit code.
    ///
    /// # Cancellation safety
    /// Cancel-safe.
    pub(crate) async fn wait(&mut self) -> u8 {
        match self.0.wait().await {
            Ok(status) => exit::for_status(status),
            Err(e) => {
                warn!(error = %e, "cannot wait for the supervisor");
                1
            }
        }
    }
}
