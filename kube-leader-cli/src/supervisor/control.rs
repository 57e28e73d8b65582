//! kube-leader's side: the supervisor process, and the control socket it is driven over.

use std::{ffi::OsString, process::Stdio, time::Duration};

use anyhow::Context as _;
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

/// The control socket to the supervisor.
#[derive(Debug)]
pub(crate) struct Control {
    tx: OwnedWriteHalf,
    lines: Lines<BufReader<OwnedReadHalf>>,
    reports_closed: bool,
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
        cmd.arg("--log-format")
            .arg(log_format_arg(log_format))
            .arg("__supervise")
            .arg("--grace")
            .arg(format!("{}ms", grace.as_millis()))
            .arg("--")
            .args(command)
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
            .kill_on_drop(false);
        let process = cmd.spawn().context("start the supervisor process")?;
        ours.set_nonblocking(true).context("control socket")?;
        let sock = tokio::net::UnixStream::from_std(ours).context("control socket")?;
        let (rx, tx) = sock.into_split();
        let control = Control {
            tx,
            lines: BufReader::new(rx).lines(),
            reports_closed: false,
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
            return Some(report);
        }
    }

    /// The next report; pending forever once the supervisor closed its side.
    ///
    /// # Cancellation safety
    /// Cancel-safe.
    pub(crate) async fn report(&mut self) -> Report {
        match self.next_report().await {
            Some(r) => r,
            None => std::future::pending().await,
        }
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
