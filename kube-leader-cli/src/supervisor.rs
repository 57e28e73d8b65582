//! The fail-safe supervisor: a small process between `kube-leader run` and COMMAND.
//!
//! A paused process cannot stop anything (SIGSTOP freezes every thread of it), so the deadline
//! that keeps COMMAND from outliving leadership is enforced outside kube-leader's process:
//! `kube-leader run` re-executes itself as `kube-leader __supervise`, which starts COMMAND and
//! stops it (SIGTERM, `--grace`, SIGKILL, to COMMAND's whole process group) as soon as
//!
//! - kube-leader says so (leadership lost),
//! - kube-leader's heartbeats stop: each heartbeat says until when leadership is confirmed, as
//!   an absolute CLOCK_MONOTONIC instant (for a lease: the renew deadline counted from when the
//!   last successful renewal, or the acquiring write, was sent), and the supervisor stops
//!   COMMAND when that instant passes without a newer heartbeat. Both processes read the same
//!   clock, so a heartbeat read late (the supervisor was frozen, or busy) cannot confirm
//!   leadership for longer than it was confirmed when written; or
//! - kube-leader dies (the control socket closes).
//!
//! COMMAND must not outlive the supervisor either: the supervisor starts
//! `kube-leader __exec --parent <pid> -- COMMAND`, which sets `PR_SET_PDEATHSIG` (SIGKILL),
//! checks that its parent is still the supervisor, and executes COMMAND in its place (the
//! parent-death signal survives `execve` for binaries that gain no privileges). The signal
//! follows the thread that forked: the supervisor runs a current-thread runtime and spawns
//! from it, the process's main thread, which lives as long as the process. If the supervisor
//! dies (SIGKILL, or `kill -9` of kube-leader's whole process group), COMMAND is killed at once;
//! kube-leader, told nothing, treats it as a loss (exit 3) and does not release the lock.
//!
//! Both kube-leader and the supervisor are child subreapers (`PR_SET_CHILD_SUBREAPER`): what
//! COMMAND leaves behind (a double fork, a daemon) is re-parented to them rather than to init,
//! reaped when it exits, and killed with COMMAND's process group when COMMAND exits.
//!
//! The control channel is a Unix socket pair that is the supervisor's stdin; COMMAND gets
//! `/dev/null` as stdin and inherits stdout and stderr. Messages are lines:
//!
//! | direction            | line            | meaning                                                 |
//! |----------------------|-----------------|---------------------------------------------------------|
//! | kube-leader → sup.   | `start <json>`  | start COMMAND: its environment, and `until` (as below)  |
//! | kube-leader → sup.   | `until <ns>`    | leadership confirmed until CLOCK_MONOTONIC `<ns>`       |
//! | kube-leader → sup.   | `stop`          | leadership lost: SIGTERM, grace, SIGKILL                |
//! | kube-leader → sup.   | `signal <n>`    | forward signal `<n>` to COMMAND's process group         |
//! | sup. → kube-leader   | `started <pid>` | COMMAND runs (its pid is its process group)             |
//! | sup. → kube-leader   | `expired <ms>`  | no heartbeat in time; stopping COMMAND                  |
//! | sup. → kube-leader   | `failed <code>` | COMMAND could not be started                            |
//! | sup. → kube-leader   | `exited <code>` | the last line: COMMAND and what it left are gone        |
//!
//! kube-leader starts its supervisor while it still follows, and the supervisor starts
//! COMMAND's process (`__exec --wait`) in advance: winning costs the `start` message, one line
//! on a pipe and COMMAND's own `execve`. The supervisor exits with COMMAND's exit code
//! (128+N for signal N), after `exited`. COMMAND runs in its own process group, so that a
//! terminal's Ctrl-C reaches it once (forwarded); after COMMAND exits, whatever is left of its
//! group, and every process re-parented to the supervisor, is killed.

use std::{
    ffi::OsString,
    os::{fd::AsFd, unix::process::CommandExt as _},
    process::Stdio,
    time::Duration,
};

use anyhow::Context as _;
use nix::{
    errno::Errno,
    sys::{
        prctl,
        signal::{kill, killpg, Signal},
        wait::{waitpid, WaitPidFlag, WaitStatus},
    },
    time::{clock_gettime, ClockId},
    unistd::{getpgrp, getpid, getppid, Pid},
};
use serde::{Deserialize, Serialize};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines},
    net::unix::{OwnedReadHalf, OwnedWriteHalf},
    process::{Child, Command},
    signal::unix::{signal, SignalKind},
    time::Instant,
};
use tracing::{debug, error, info, warn};

use crate::{
    cli::{ExecArgs, LogFormat, SuperviseArgs},
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

// === the clock both processes share ===

/// CLOCK_MONOTONIC now, as the time since its origin.
pub(crate) fn mono_now() -> Duration {
    match clock_gettime(ClockId::CLOCK_MONOTONIC) {
        Ok(ts) => Duration::new(
            u64::try_from(ts.tv_sec()).unwrap_or(0),
            u32::try_from(ts.tv_nsec()).unwrap_or(0),
        ),
        // Cannot happen on Linux; the zero instant makes every deadline passed (fail-safe).
        Err(_) => Duration::ZERO,
    }
}

/// The CLOCK_MONOTONIC reading of `t` (tokio's and std's `Instant` are CLOCK_MONOTONIC on
/// Linux; the two readings are taken back to back, within microseconds).
pub(crate) fn to_mono(t: Instant) -> Duration {
    let (now, mono) = (Instant::now(), mono_now());
    if t <= now {
        mono.saturating_sub(now - t)
    } else {
        mono + (t - now)
    }
}

/// The `Instant` of CLOCK_MONOTONIC reading `m`.
fn from_mono(m: Duration) -> Instant {
    let (now, mono) = (Instant::now(), mono_now());
    if m >= mono {
        now + (m - mono)
    } else {
        now.checked_sub(mono - m).unwrap_or(now)
    }
}

// === processes ===

/// Makes this process a child subreaper: orphaned descendants are re-parented to it.
pub(crate) fn become_subreaper() {
    if let Err(e) = prctl::set_child_subreaper(true) {
        warn!(error = %e, "cannot become a child subreaper; orphans of COMMAND go to init");
    }
}

/// The children of this process (from `/proc/self/task/*/children`).
fn children() -> Vec<Pid> {
    let mut pids = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return pids;
    };
    for task in tasks.flatten() {
        if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
            pids.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .map(Pid::from_raw),
            );
        }
    }
    pids
}

/// `(state, process group)` of `pid`, from `/proc/<pid>/stat`.
fn stat(pid: Pid) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    Some((state, fields.next()?.parse().ok()?))
}

/// kube-leader's reaper: reaps the zombies among its children that are not in its own process
/// group, that is orphans it adopted as a subreaper (COMMAND once its supervisor died, what
/// COMMAND left behind). Its own children (the supervisor, credential plugins) stay in its
/// group and are waited for by whoever started them, whose exit status this must not steal.
pub(crate) async fn reap_orphans() {
    let Ok(mut sigchld) = signal(SignalKind::child()) else {
        warn!("cannot watch SIGCHLD; orphans of COMMAND are not reaped");
        return;
    };
    let own = getpgrp().as_raw();
    loop {
        for pid in children() {
            if let Some(('Z', group)) = stat(pid) {
                if group != own {
                    let status = waitpid(pid, Some(WaitPidFlag::WNOHANG));
                    debug!(pid = pid.as_raw(), ?status, "reaped an orphan");
                }
            }
        }
        if sigchld.recv().await.is_none() {
            return;
        }
    }
}

/// The exit code for a wait status: the code, or 128+N for signal N.
fn code_of(status: WaitStatus) -> Option<(Pid, u8)> {
    match status {
        WaitStatus::Exited(pid, code) => Some((pid, u8::try_from(code & 0xff).unwrap_or(1))),
        WaitStatus::Signaled(pid, sig, _) => {
            Some((pid, u8::try_from(128 + (sig as i32 & 0x7f)).unwrap_or(255)))
        }
        _ => None,
    }
}

/// The supervisor's reaper: reaps every exited child (COMMAND, and what it left behind that
/// was re-parented here); returns COMMAND's exit code once it was reaped. The supervisor owns
/// the wait loop: no other code of it waits for a child.
fn reap_all(command: Pid) -> Option<u8> {
    let mut exited = None;
    loop {
        match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return exited,
            Ok(status) => {
                if let Some((pid, code)) = code_of(status) {
                    if pid == command {
                        exited = Some(code);
                    } else {
                        debug!(pid = pid.as_raw(), code, "reaped an orphan of COMMAND");
                    }
                }
            }
        }
    }
}

/// Kills COMMAND's process group and every process re-parented to the supervisor, until none
/// is left (or 2 s have passed): nothing COMMAND started outlives it.
async fn kill_what_is_left(group: Pid, command: Pid) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        send_group(group, Signal::SIGKILL);
        let left = children();
        for pid in &left {
            let _ = kill(*pid, Signal::SIGKILL);
        }
        let _ = reap_all(command);
        if left.is_empty() || Instant::now() >= deadline {
            if !left.is_empty() {
                warn!(left = left.len(), "processes left by COMMAND would not die");
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

// === `kube-leader __exec` ===

/// `kube-leader __exec --parent <pid> [--wait] -- COMMAND`: dies with the supervisor, waits for
/// its start message (`--wait`), then becomes COMMAND. Returns only if COMMAND is not to start
/// or cannot be executed (the exit code).
pub(crate) fn exec(args: ExecArgs) -> u8 {
    if let Err(e) = prctl::set_pdeathsig(Signal::SIGKILL) {
        error!(error = %e, "cannot ask to die with the supervisor; not starting COMMAND");
        return exit::CANNOT_EXECUTE;
    }
    // The supervisor may have died between the fork and the prctl: nobody would kill us then.
    if getppid().as_raw() != args.parent {
        return exit::LOST;
    }
    let mut env: Vec<(String, String)> = Vec::new();
    if args.wait {
        // Started while kube-leader follows: COMMAND's environment comes when it wins.
        let mut line = String::new();
        match std::io::stdin().read_line(&mut line) {
            Ok(0) | Err(_) => return 0,
            Ok(_) => match serde_json::from_str(&line) {
                Ok(e) => env = e,
                Err(e) => {
                    error!(error = %e, "unreadable start message from the supervisor");
                    return exit::CANNOT_EXECUTE;
                }
            },
        }
    }
    let (program, rest) = args.command.split_first().expect("clap requires COMMAND");
    let e = std::process::Command::new(program)
        .args(rest)
        .envs(env)
        .stdin(Stdio::null())
        .exec();
    error!(command = ?args.command, error = %e, "cannot start COMMAND");
    match e.kind() {
        std::io::ErrorKind::NotFound => exit::NOT_FOUND,
        _ => exit::CANNOT_EXECUTE,
    }
}

// === the supervisor process ===

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
        // kube-leader forwards these to COMMAND; the supervisor must survive them (a terminal's
        // Ctrl-C reaches kube-leader's whole process group, the supervisor included).
        for kind in FORWARDED {
            if let Ok(mut s) = signal(kind) {
                tokio::spawn(async move { while s.recv().await.is_some() {} });
            }
        }
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
        let (mut valid_until, env) = loop {
            match parse(self.lines.next_line().await) {
                Msg::Start(start) => break (from_mono(start.until()), start.env),
                Msg::Until(at) => break (from_mono(at), Vec::new()),
                Msg::Signal(_) | Msg::Other => {}
                Msg::Stop | Msg::Closed => {
                    debug!("stopped before COMMAND started");
                    // The waiting process sees the end of its input and exits.
                    drop(standby);
                    return self.finish(0).await;
                }
            }
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

        let mut state = State::Running;
        let mut closed = false;
        let mut last_beat = Instant::now();
        let code = loop {
            let kill_at = match state {
                State::Stopping { kill_at } => Some(kill_at),
                _ => None,
            };
            tokio::select! {
                biased;
                Some(()) = sigchld.recv() => {
                    if let Some(code) = reap_all(pid) {
                        break code;
                    }
                }
                _ = sleep_until_opt(kill_at) => {
                    warn!(pid = pid.as_raw(), grace = %humantime::format_duration(self.args.grace),
                        "COMMAND did not stop within the grace period; SIGKILL");
                    send_group(group, Signal::SIGKILL);
                    state = State::Killed;
                }
                _ = tokio::time::sleep_until(valid_until), if state == State::Running => {
                    let since = last_beat.elapsed();
                    warn!(pid = pid.as_raw(), since_last_heartbeat = ?since,
                        "kube-leader has not confirmed leadership in time (paused or stuck?); stopping COMMAND");
                    self.send(format!("expired {}", since.as_millis())).await;
                    state = self.stop(group, valid_until);
                }
                line = self.lines.next_line(), if !closed => match parse(line) {
                    Msg::Until(at) => {
                        last_beat = Instant::now();
                        valid_until = from_mono(at);
                    }
                    // COMMAND runs already.
                    Msg::Start(_) => {}
                    Msg::Stop => {
                        if state == State::Running {
                            info!(pid = pid.as_raw(), "leadership lost: stopping COMMAND");
                            state = self.stop(group, valid_until);
                        }
                    }
                    Msg::Signal(sig) => {
                        debug!(pid = pid.as_raw(), signal = %sig, "forwarding signal");
                        send_group(group, sig);
                    }
                    Msg::Other => {}
                    Msg::Closed => {
                        closed = true;
                        if state == State::Running {
                            warn!(pid = pid.as_raw(), "kube-leader is gone; stopping COMMAND");
                            state = self.stop(group, valid_until);
                        }
                    }
                },
            }
        };
        // Nothing COMMAND started outlives it.
        kill_what_is_left(group, pid).await;
        self.finish(code).await
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
    fn stop(&self, group: Pid, valid_until: Instant) -> State {
        send_group(group, Signal::SIGTERM);
        State::Stopping {
            kill_at: (Instant::now() + self.args.grace).min(valid_until + self.args.grace),
        }
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

fn log_format_arg(format: LogFormat) -> &'static str {
    match format {
        LogFormat::Text => "text",
        LogFormat::Json => "json",
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Stopping { kill_at: Instant },
    Killed,
}

/// Sends `sig` to process group `group` (never to group 0 or 1).
pub(crate) fn send_group(group: Pid, sig: Signal) {
    if group.as_raw() <= 1 {
        return;
    }
    match killpg(group, sig) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => warn!(pgid = group.as_raw(), signal = %sig, error = %e, "cannot signal COMMAND"),
    }
}

async fn sleep_until_opt(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// `start <json>`: COMMAND's environment, and until when leadership is confirmed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Start {
    /// CLOCK_MONOTONIC nanoseconds.
    until_ns: u64,
    env: Vec<(String, String)>,
}

impl Start {
    fn until(&self) -> Duration {
        Duration::from_nanos(self.until_ns)
    }
}

enum Msg {
    /// Start COMMAND with this environment.
    Start(Start),
    /// Leadership confirmed until this CLOCK_MONOTONIC reading.
    Until(Duration),
    Stop,
    Signal(Signal),
    Closed,
    Other,
}

fn parse(line: std::io::Result<Option<String>>) -> Msg {
    let Ok(Some(line)) = line else { return Msg::Closed };
    if let Some(json) = line.strip_prefix("start ") {
        return serde_json::from_str(json).map_or(Msg::Other, Msg::Start);
    }
    let mut words = line.split_whitespace();
    match (words.next(), words.next()) {
        (Some("until"), Some(ns)) => ns
            .parse()
            .map(|ns| Msg::Until(Duration::from_nanos(ns)))
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

/// Kills process group `group` (COMMAND's, its supervisor gone) and waits, at most `limit`,
/// until no process of it is left (kube-leader, a subreaper, reaps them).
pub(crate) async fn kill_group_and_wait(group: Pid, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    if group.as_raw() <= 1 {
        return true;
    }
    loop {
        if let Err(Errno::ESRCH) = killpg(group, Signal::SIGKILL) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_readings_round_trip() {
        let t = Instant::now() + Duration::from_secs(3);
        let back = from_mono(to_mono(t));
        let diff = if back > t { back - t } else { t - back };
        assert!(diff < Duration::from_millis(5), "{diff:?}");
        let past = Instant::now();
        assert!(from_mono(to_mono(past)) <= Instant::now());
        assert!(to_mono(Instant::now()) <= mono_now());
    }

    #[test]
    fn heartbeats_parse() {
        assert!(
            matches!(parse(Ok(Some("until 12345".into()))), Msg::Until(d) if d == Duration::from_nanos(12345))
        );
        assert!(matches!(parse(Ok(Some("until x".into()))), Msg::Other));
        assert!(matches!(parse(Ok(Some("beat 100".into()))), Msg::Other));
        assert!(matches!(parse(Ok(None)), Msg::Closed));
    }
}
