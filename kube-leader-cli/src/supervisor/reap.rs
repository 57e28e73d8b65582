//! Processes: child subreapers, reaping what COMMAND leaves behind, and killing COMMAND's
//! process group.

use std::time::Duration;

use nix::{
    errno::Errno,
    sys::{
        prctl,
        signal::{kill, killpg, Signal},
        wait::{waitpid, WaitPidFlag, WaitStatus},
    },
    unistd::{getpgrp, Pid},
};
use tokio::{
    signal::unix::{signal, SignalKind},
    time::Instant,
};
use tracing::{debug, warn};

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

/// The supervisors kube-leader started: they have process groups of their own, and are waited
/// for through their handles, so [`reap_orphans`] must leave them alone.
static SUPERVISORS: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

/// Marks `pid` (a supervisor just started) as waited for by its handle.
pub(crate) fn waited_by_handle(pid: i32) {
    if let Ok(mut s) = SUPERVISORS.lock() {
        s.retain(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
        s.push(pid);
    }
}

fn is_supervisor(pid: Pid) -> bool {
    SUPERVISORS.lock().is_ok_and(|s| s.contains(&pid.as_raw()))
}

/// kube-leader's reaper: reaps the zombies among its children that are not in its own process
/// group and not its supervisors, that is orphans it adopted as a subreaper (COMMAND once its
/// supervisor died, what COMMAND left behind). Its own children (supervisors, credential
/// plugins) are waited for by whoever started them, whose exit status this must not steal.
pub(crate) async fn reap_orphans() {
    let Ok(mut sigchld) = signal(SignalKind::child()) else {
        warn!("cannot watch SIGCHLD; orphans of COMMAND are not reaped");
        return;
    };
    let own = getpgrp().as_raw();
    loop {
        for pid in children() {
            if let Some(('Z', group)) = stat(pid) {
                if group != own && !is_supervisor(pid) {
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
pub(super) fn reap_all(command: Pid) -> Option<u8> {
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
pub(super) async fn kill_what_is_left(group: Pid, command: Pid) {
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
