//! The fail-safe supervisor: a small process between `kube-leader run` and COMMAND.
//!
//! A paused process cannot stop anything (SIGSTOP freezes every thread of it), so the deadline
//! that keeps COMMAND from outliving leadership is enforced outside kube-leader's process:
//! `kube-leader run` re-executes itself as `kube-leader __supervise`, which starts COMMAND and
//! stops it (SIGTERM, `--grace`, SIGKILL, to COMMAND's whole process group) as soon as
//!
//! - kube-leader says so (leadership lost),
//! - kube-leader's heartbeats stop: each heartbeat says for how long leadership is confirmed
//!   (for a lease: the renew deadline counted from the last successful renewal), and the
//!   supervisor stops COMMAND when that time passes without a newer heartbeat, or
//! - kube-leader dies (the control socket closes).
//!
//! The control channel is a Unix socket pair that is the supervisor's stdin; COMMAND gets
//! `/dev/null` as stdin and inherits stdout and stderr. Messages are lines:
//!
//! | direction            | line            | meaning                                            |
//! |----------------------|-----------------|----------------------------------------------------|
//! | kube-leader → sup.   | `beat <ms>`     | leadership confirmed for `<ms>` from now           |
//! | kube-leader → sup.   | `stop`          | leadership lost: SIGTERM, grace, SIGKILL           |
//! | kube-leader → sup.   | `signal <n>`    | forward signal `<n>` to COMMAND's process group    |
//! | sup. → kube-leader   | `started <pid>` | COMMAND runs                                       |
//! | sup. → kube-leader   | `expired <ms>`  | no heartbeat in time; stopping COMMAND             |
//! | sup. → kube-leader   | `failed <code>` | COMMAND could not be started (126/127)             |
//!
//! The supervisor starts COMMAND on the first heartbeat and exits with COMMAND's exit code
//! (128+N for signal N). COMMAND runs in its own process group, so that a terminal's Ctrl-C
//! reaches it once (forwarded) and no process of that group outlives it: after COMMAND exits,
//! whatever is left of its group is killed.

use std::{
    ffi::OsString,
    os::fd::AsFd,
    process::{ExitStatus, Stdio},
    time::Duration,
};

use anyhow::Context as _;
use nix::{
    sys::signal::{killpg, Signal},
    unistd::Pid,
};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines},
    net::unix::{OwnedReadHalf, OwnedWriteHalf},
    process::{Child, Command},
    signal::unix::{signal, SignalKind},
    time::Instant,
};
use tracing::{debug, info, warn};

use crate::{
    cli::{LogFormat, SuperviseArgs},
    exit,
};

/// Signals kube-leader forwards to COMMAND (and the supervisor itself ignores).
pub(crate) const FORWARDED: [SignalKind; 6] = [
    SignalKind::terminate(),
    SignalKind::interrupt(),
    SignalKind::hangup(),
    SignalKind::quit(),
    SignalKind::user_defined1(),
    SignalKind::user_defined2(),
];

// === the supervisor process ===

/// `kube-leader __supervise`: returns the exit code.
pub(crate) async fn supervise(args: SuperviseArgs) -> u8 {
    match Supervise::new(args).await {
        Ok(s) => s.run().await,
        Err(e) => {
            warn!(error = %format!("{e:#}"), "supervisor cannot start");
            1
        }
    }
}

struct Supervise {
    args: SuperviseArgs,
    lines: Lines<BufReader<OwnedReadHalf>>,
    tx: OwnedWriteHalf,
}

impl Supervise {
    async fn new(args: SuperviseArgs) -> anyhow::Result<Self> {
        // Our stdin is one end of kube-leader's socket pair.
        let fd = std::io::stdin().as_fd().try_clone_to_owned().context("stdin")?;
        let sock = std::os::unix::net::UnixStream::from(fd);
        sock.set_nonblocking(true).context("control socket")?;
        let sock =
            tokio::net::UnixStream::from_std(sock).context("stdin is not kube-leader's control socket")?;
        let (rx, tx) = sock.into_split();
        Ok(Self {
            args,
            lines: BufReader::new(rx).lines(),
            tx,
        })
    }

    async fn send(&mut self, line: String) {
        // kube-leader may be frozen or gone: never wait long on it.
        let line = format!("{line}\n");
        let write = self.tx.write_all(line.as_bytes());
        if tokio::time::timeout(Duration::from_millis(100), write)
            .await
            .is_err()
        {
            debug!(%line, "kube-leader does not read its control socket");
        }
    }

    async fn run(mut self) -> u8 {
        // kube-leader forwards these to COMMAND; the supervisor must survive them (a terminal's
        // Ctrl-C reaches kube-leader's whole process group, the supervisor included).
        for kind in FORWARDED {
            if let Ok(mut s) = signal(kind) {
                tokio::spawn(async move { while s.recv().await.is_some() {} });
            }
        }

        // COMMAND starts on the first heartbeat.
        let mut valid_until = loop {
            match parse(self.lines.next_line().await) {
                Msg::Beat(ms) => break Instant::now() + ms,
                Msg::Signal(_) | Msg::Other => {}
                Msg::Stop | Msg::Closed => {
                    debug!("stopped before COMMAND started");
                    return 0;
                }
            }
        };

        let mut child = match self.spawn() {
            Ok(child) => child,
            Err(e) => {
                let code = match e.kind() {
                    std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                    _ => exit::CANNOT_EXECUTE,
                };
                warn!(command = ?self.args.command, error = %e, "cannot start COMMAND");
                self.send(format!("failed {code}")).await;
                return code;
            }
        };
        let pid = child.id().unwrap_or_default();
        let group = Pid::from_raw(i32::try_from(pid).unwrap_or(0));
        self.send(format!("started {pid}")).await;

        let mut state = State::Running;
        let mut closed = false;
        let mut last_beat = Instant::now();
        let status: ExitStatus = loop {
            let kill_at = match state {
                State::Stopping { kill_at } => Some(kill_at),
                _ => None,
            };
            tokio::select! {
                biased;
                status = child.wait() => match status {
                    Ok(s) => break s,
                    Err(e) => {
                        warn!(error = %e, "cannot wait for COMMAND");
                        return 1;
                    }
                },
                _ = sleep_until_opt(kill_at) => {
                    warn!(pid, grace = %humantime::format_duration(self.args.grace),
                        "COMMAND did not stop within the grace period; SIGKILL");
                    send_group(group, Signal::SIGKILL);
                    state = State::Killed;
                }
                _ = tokio::time::sleep_until(valid_until), if state == State::Running => {
                    let since = last_beat.elapsed();
                    warn!(pid, since_last_heartbeat = ?since,
                        "kube-leader has not confirmed leadership in time (paused or stuck?); stopping COMMAND");
                    self.send(format!("expired {}", since.as_millis())).await;
                    state = self.stop(group);
                }
                line = self.lines.next_line(), if !closed => match parse(line) {
                    Msg::Beat(ms) => {
                        last_beat = Instant::now();
                        valid_until = last_beat + ms;
                    }
                    Msg::Stop => {
                        if state == State::Running {
                            info!(pid, "leadership lost: stopping COMMAND");
                            state = self.stop(group);
                        }
                    }
                    Msg::Signal(sig) => {
                        debug!(pid, signal = %sig, "forwarding signal");
                        send_group(group, sig);
                    }
                    Msg::Other => {}
                    Msg::Closed => {
                        closed = true;
                        if state == State::Running {
                            warn!(pid, "kube-leader is gone; stopping COMMAND");
                            state = self.stop(group);
                        }
                    }
                },
            }
        };
        // Nothing of COMMAND's process group outlives it.
        send_group(group, Signal::SIGKILL);
        exit::for_status(status)
    }

    fn spawn(&self) -> std::io::Result<Child> {
        let (program, args) = self.args.command.split_first().expect("clap requires COMMAND");
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .process_group(0)
            .kill_on_drop(false);
        cmd.spawn()
    }

    /// SIGTERM now, SIGKILL after the grace.
    fn stop(&self, group: Pid) -> State {
        send_group(group, Signal::SIGTERM);
        State::Stopping {
            kill_at: Instant::now() + self.args.grace,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Stopping { kill_at: Instant },
    Killed,
}

fn send_group(group: Pid, sig: Signal) {
    if group.as_raw() <= 1 {
        return;
    }
    match killpg(group, sig) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => warn!(pgid = group.as_raw(), signal = %sig, error = %e, "cannot signal COMMAND"),
    }
}

async fn sleep_until_opt(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

enum Msg {
    Beat(Duration),
    Stop,
    Signal(Signal),
    Closed,
    Other,
}

fn parse(line: std::io::Result<Option<String>>) -> Msg {
    let Ok(Some(line)) = line else { return Msg::Closed };
    let mut words = line.split_whitespace();
    match (words.next(), words.next()) {
        (Some("beat"), Some(ms)) => ms
            .parse()
            .map(|ms| Msg::Beat(Duration::from_millis(ms)))
            .unwrap_or(Msg::Other),
        (Some("stop"), None) => Msg::Stop,
        (Some("signal"), Some(n)) => n
            .parse::<i32>()
            .ok()
            .and_then(|n| Signal::try_from(n).ok())
            .map(Msg::Signal)
            .unwrap_or(Msg::Other),
        _ => Msg::Other,
    }
}

// === kube-leader's side ===

/// What the supervisor reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Report {
    /// COMMAND runs with this pid.
    Started(u32),
    /// The supervisor stopped COMMAND because heartbeats stopped.
    Expired(Duration),
    /// COMMAND could not be started.
    Failed(u8),
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
    /// Starts `kube-leader __supervise -- COMMAND` with `env` added to COMMAND's environment.
    pub(crate) fn spawn(
        command: &[OsString],
        grace: Duration,
        log_format: LogFormat,
        env: &[(&str, String)],
    ) -> anyhow::Result<Self> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().context("create the control socket")?;
        let exe = std::env::current_exe().context("find kube-leader's own executable")?;
        let mut cmd = Command::new(exe);
        cmd.arg("__supervise")
            .arg("--log-format")
            .arg(match log_format {
                LogFormat::Text => "text",
                LogFormat::Json => "json",
            })
            .arg("--grace")
            .arg(format!("{}ms", grace.as_millis()))
            .arg("--")
            .args(command)
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
            .kill_on_drop(false);
        for (k, v) in env {
            cmd.env(k, v);
        }
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
    /// Leadership is confirmed for `valid_for` from now.
    pub(crate) async fn beat(&mut self, valid_for: Duration) {
        self.send(&format!("beat {}", valid_for.as_millis())).await;
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

    /// The next report; pending forever once the supervisor closed its side.
    ///
    /// # Cancellation safety
    /// Cancel-safe (tokio's `Lines::next_line` is).
    pub(crate) async fn report(&mut self) -> Report {
        loop {
            if self.reports_closed {
                return std::future::pending().await;
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
                _ => continue,
            };
            return report;
        }
    }
}

impl SupervisorProcess {
    /// Waits for the supervisor, hence COMMAND, to exit; returns the exit code.
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
