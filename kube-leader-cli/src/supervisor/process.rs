//! `kube-leader __supervise`: the supervisor process. It starts COMMAND's process in advance,
//! lets it execute COMMAND on `start`, and stops it (SIGTERM, grace, SIGKILL to its process
//! group) when leadership is lost, no longer confirmed in time, or kube-leader is gone.

use std::{
    os::{fd::AsFd, unix::process::CommandExt as _},
    time::Duration,
};

use anyhow::Context as _;
use nix::{
    sys::signal::Signal,
    unistd::{getpid, Pid},
};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines},
    net::unix::{OwnedReadHalf, OwnedWriteHalf},
    signal::unix::{signal, Signal as UnixSignal, SignalKind},
    time::Instant,
};
use tracing::{debug, info, warn};

use super::{
    clock::from_mono,
    protocol::{log_format_arg, parse, Msg},
    reap::{become_subreaper, kill_what_is_left, reap_all, send_group},
    FORWARDED,
};
use crate::{
    cli::{LogFormat, SuperviseArgs},
    exit,
};

/// `kube-leader __supervise`: returns the exit code.
pub(crate) async fn supervise(args: SuperviseArgs, log_format: LogFormat) -> u8 {
    match Supervise::new(args, log_format).await {
        Ok(s) => s.run().await,
        Err(e) => {
            warn!(error = %format!("{e:#}"), "supervisor cannot start");
            1
        }
    }
}

/// The supervisor process: its flags and its end of the control socket.
struct Supervise {
    args: SuperviseArgs,
    log_format: LogFormat,
    lines: Lines<BufReader<OwnedReadHalf>>,
    tx: OwnedWriteHalf,
}

impl Supervise {
    async fn new(args: SuperviseArgs, log_format: LogFormat) -> anyhow::Result<Self> {
        // Our stdin is one end of kube-leader's socket pair.
        let fd = std::io::stdin().as_fd().try_clone_to_owned().context("stdin")?;
        let sock = std::os::unix::net::UnixStream::from(fd);
        sock.set_nonblocking(true).context("control socket")?;
        let sock =
            tokio::net::UnixStream::from_std(sock).context("stdin is not kube-leader's control socket")?;
        let (rx, tx) = sock.into_split();
        Ok(Self {
            args,
            log_format,
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

    /// The last report, then the exit code.
    async fn finish(&mut self, code: u8) -> u8 {
        self.send(format!("exited {code}")).await;
        code
    }

    async fn run(mut self) -> u8 {
        ignore_forwarded();
        become_subreaper();
        // Before COMMAND starts, so that its exit cannot go unnoticed.
        let mut sigchld = match signal(SignalKind::child()) {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "cannot watch SIGCHLD");
                return self.finish(1).await;
            }
        };

        // COMMAND's process, started now and waiting: winning then costs one message and
        // COMMAND's own exec.
        let standby = match self.spawn(true) {
            Ok(s) => Some(s),
            Err(e) => {
                debug!(error = %e, "cannot start COMMAND's process in advance");
                None
            }
        };

        // COMMAND starts on `start`, if leadership is still confirmed by then.
        let Some((valid_until, env)) = self.wait_for_start().await else {
            debug!("stopped before COMMAND started");
            // The waiting process sees the end of its input and exits.
            drop(standby);
            return self.finish(0).await;
        };
        if valid_until <= Instant::now() {
            warn!("leadership was over before COMMAND could start; not starting it");
            drop(standby);
            self.send("expired 0".into()).await;
            return self.finish(exit::LOST).await;
        }

        let started = match standby {
            Some(s) => s.go(&env),
            None => Err(std::io::Error::other("no process started in advance")),
        };
        let pid = match started.or_else(|_| self.spawn(false).and_then(|s| s.go(&env))) {
            Ok(pid) => pid,
            Err(e) => {
                warn!(command = ?self.args.command, error = %e, "cannot start COMMAND");
                self.send(format!("failed {}", exit::CANNOT_EXECUTE)).await;
                return self.finish(exit::CANNOT_EXECUTE).await;
            }
        };
        // COMMAND is the leader of its own process group.
        let group = pid;
        self.send(format!("started {pid}")).await;
        let code = self.watch(pid, valid_until, &mut sigchld).await;
        // Nothing COMMAND started outlives it.
        kill_what_is_left(group, pid).await;
        self.finish(code).await
    }

    /// Waits for `start` (or a first heartbeat): until when leadership is confirmed, and
    /// COMMAND's environment; `None` if stopped (or kube-leader gone) first.
    async fn wait_for_start(&mut self) -> Option<(Instant, Vec<(String, String)>)> {
        loop {
            match parse(self.lines.next_line().await) {
                Msg::Start(start) => return Some((from_mono(start.until()), start.env)),
                Msg::Until(at) => return Some((from_mono(at), Vec::new())),
                Msg::Signal(_) | Msg::Other => {}
                Msg::Stop | Msg::Closed => return None,
            }
        }
    }

    /// Watches COMMAND (pid `pid`, also its process group) until it exits; returns its exit
    /// code. Stops it when leadership is lost, no longer confirmed, or kube-leader is gone.
    async fn watch(&mut self, pid: Pid, valid_until: Instant, sigchld: &mut UnixSignal) -> u8 {
        let group = pid;
        let mut term = Term {
            group,
            state: State::Running,
            closed: false,
            last_beat: Instant::now(),
            valid_until,
        };
        loop {
            let kill_at = match term.state {
                State::Stopping { kill_at } => Some(kill_at),
                _ => None,
            };
            tokio::select! {
                biased;
                Some(()) = sigchld.recv() => {
                    if let Some(code) = reap_all(pid) {
                        return code;
                    }
                }
                _ = tokio::time::sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() => {
                    warn!(pid = pid.as_raw(), grace = %humantime::format_duration(self.args.grace),
                        "COMMAND did not stop within the grace period; SIGKILL");
                    send_group(group, Signal::SIGKILL);
                    term.state = State::Killed;
                }
                _ = tokio::time::sleep_until(term.valid_until), if term.state == State::Running => {
                    let since = term.last_beat.elapsed();
                    warn!(pid = pid.as_raw(), since_last_heartbeat = ?since,
                        "kube-leader has not confirmed leadership in time (paused or stuck?); stopping COMMAND");
                    self.send(format!("expired {}", since.as_millis())).await;
                    term.state = self.stop(group, term.valid_until);
                }
                line = self.lines.next_line(), if !term.closed => self.on_message(&mut term, parse(line)),
            }
        }
    }

    /// A message from kube-leader while COMMAND runs.
    fn on_message(&self, term: &mut Term, msg: Msg) {
        let (group, pid) = (term.group, term.group);
        match msg {
            Msg::Until(at) => {
                term.last_beat = Instant::now();
                term.valid_until = from_mono(at);
            }
            // COMMAND runs already.
            Msg::Start(_) => {}
            Msg::Stop => {
                if term.state == State::Running {
                    info!(pid = pid.as_raw(), "leadership lost: stopping COMMAND");
                    term.state = self.stop(group, term.valid_until);
                }
            }
            Msg::Signal(sig) => {
                debug!(pid = pid.as_raw(), signal = %sig, "forwarding signal");
                send_group(group, sig);
            }
            Msg::Other => {}
            Msg::Closed => {
                term.closed = true;
                if term.state == State::Running {
                    warn!(pid = pid.as_raw(), "kube-leader is gone; stopping COMMAND");
                    term.state = self.stop(group, term.valid_until);
                }
            }
        }
    }

    /// Starts `kube-leader __exec --wait -- COMMAND` in a process group of its own, from this
    /// (the main) thread: it waits for its environment on a pipe, then becomes COMMAND (its pid
    /// is COMMAND's). `in_advance`: while kube-leader still follows.
    fn spawn(&self, in_advance: bool) -> std::io::Result<Standby> {
        let exe = std::env::current_exe()?;
        let (rx, tx) = std::io::pipe()?;
        let child = std::process::Command::new(exe)
            .arg("--log-format")
            .arg(log_format_arg(self.log_format))
            .arg("__exec")
            .arg("--parent")
            .arg(getpid().as_raw().to_string())
            .arg("--wait")
            .arg("--")
            .args(&self.args.command)
            .stdin(rx)
            .process_group(0)
            .spawn()?;
        debug!(pid = child.id(), in_advance, "COMMAND's process waits");
        // Waited for by `reap_all`, never through the handle.
        Ok(Standby {
            pid: Pid::from_raw(i32::try_from(child.id()).unwrap_or(0)),
            go: tx,
        })
    }

    /// SIGTERM now, SIGKILL after the grace, counted from the end of the last confirmed
    /// validity at the latest: a `stop` that comes late (kube-leader noticed its loss after the
    /// renew deadline) does not push COMMAND's end past renew deadline + grace from the last
    /// renewal, that is the lease duration with the default grace.
    ///
    /// Past that instant already (the supervisor was frozen with the rest of the tree and has
    /// just thawed), COMMAND is killed at once, without a SIGTERM first.
    fn stop(&self, group: Pid, valid_until: Instant) -> State {
        let kill_at = (Instant::now() + self.args.grace).min(valid_until + self.args.grace);
        if kill_at <= Instant::now() {
            warn!(
                pgid = group.as_raw(),
                "past COMMAND's deadline already (frozen?); SIGKILL"
            );
            send_group(group, Signal::SIGKILL);
            return State::Killed;
        }
        send_group(group, Signal::SIGTERM);
        State::Stopping { kill_at }
    }
}

/// COMMAND's process, waiting for its environment.
struct Standby {
    pid: Pid,
    go: std::io::PipeWriter,
}

impl Standby {
    /// Lets it execute COMMAND with `env` added; returns its pid.
    fn go(mut self, env: &[(String, String)]) -> std::io::Result<Pid> {
        use std::io::Write as _;
        let line = serde_json::to_string(env).map_err(std::io::Error::other)?;
        // A pipe write of a short line: it does not block.
        writeln!(self.go, "{line}")?;
        Ok(self.pid)
    }
}

/// COMMAND while it runs, as the supervisor sees it.
struct Term {
    /// COMMAND's process group (its pid).
    group: Pid,
    state: State,
    /// kube-leader closed the control socket.
    closed: bool,
    last_beat: Instant,
    /// Leadership is confirmed until then.
    valid_until: Instant,
}

/// Where COMMAND is in being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Stopping { kill_at: Instant },
    Killed,
}

/// kube-leader forwards these to COMMAND; the supervisor must survive them (a terminal's
/// Ctrl-C reaches kube-leader's whole process group, the supervisor included).
fn ignore_forwarded() {
    for kind in FORWARDED {
        if let Ok(mut s) = signal(kind) {
            tokio::spawn(async move { while s.recv().await.is_some() {} });
        }
    }
}
