//! Signals to COMMAND: the change signal, sent only once COMMAND handles it, and the stop
//! signals kube-leader forwards; `--shards-signal` parsing.

use nix::{
    sys::signal::{killpg, Signal},
    unistd::Pid,
};
use tokio::time::Instant;

/// Sends the change signal to COMMAND's group if COMMAND handles it; clears `untold` if sent.
pub(super) fn tell(group: Pid, signal: Signal, untold: &mut Option<Instant>) -> bool {
    if group.as_raw() <= 0 || !handles(group, signal) {
        return false;
    }
    forward(group, signal);
    *untold = None;
    true
}

/// Whether sending `signal` to `pid` cannot end it: the process catches or ignores it
/// (`SigCgt`/`SigIgn` in `/proc/PID/status`), or the signal's default action is to ignore it.
fn handles(pid: Pid, signal: Signal) -> bool {
    if matches!(
        signal,
        Signal::SIGCHLD | Signal::SIGURG | Signal::SIGWINCH | Signal::SIGCONT
    ) {
        return true;
    }
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| handled_in(&status, signal))
}

/// `handles` on the text of `/proc/PID/status`.
fn handled_in(status: &str, signal: Signal) -> bool {
    let bit = 1u64 << (signal as i32 - 1);
    status
        .lines()
        .filter_map(|l| l.strip_prefix("SigCgt:").or_else(|| l.strip_prefix("SigIgn:")))
        .filter_map(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .any(|mask| mask & bit != 0)
}

/// Sends `signal` to COMMAND's process group (once it has one).
pub(super) fn forward(group: Pid, signal: Signal) {
    if group.as_raw() > 0 {
        let _ = killpg(group, signal);
    }
}

/// COMMAND's exit code: its code, or 128+N for signal N.
pub(super) fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(1),
        (None, Some(s)) => u8::try_from(128 + s).unwrap_or(255),
        _ => 1,
    }
}

/// Parses `--shards-signal`: `HUP`, `SIGHUP`, `USR1`, ...
pub(crate) fn parse_signal(s: &str) -> Result<Signal, String> {
    let name = s.trim().to_ascii_uppercase();
    let name = if name.starts_with("SIG") {
        name
    } else {
        format!("SIG{name}")
    };
    let sig: Signal = name
        .parse()
        .map_err(|_| format!("unknown signal {s:?} (for example HUP or USR1)"))?;
    if matches!(sig, Signal::SIGKILL | Signal::SIGSTOP) {
        return Err(format!("{s} cannot be caught: use HUP, USR1 or USR2"));
    }
    Ok(sig)
}

#[cfg(test)]
mod tests {
    use std::process::Stdio;

    use super::*;

    #[test]
    fn a_signal_is_handled_when_caught_or_ignored() {
        let status =
            "Name:\tsh\nSigBlk:\t0000000000000000\nSigIgn:\t0000000000000002\nSigCgt:\t0000000000010001\n";
        assert!(handled_in(status, Signal::SIGHUP)); // caught: bit 0
        assert!(handled_in(status, Signal::SIGINT)); // ignored: bit 1
        assert!(handled_in(status, Signal::SIGCHLD)); // caught: bit 16
        assert!(!handled_in(status, Signal::SIGUSR1));
        assert!(!handled_in("garbage", Signal::SIGHUP));
    }

    #[test]
    fn a_process_handles_the_signal_only_once_its_handler_is_installed() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "read _; trap 'echo hup' USR1; echo ready; read _"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = Pid::from_raw(child.id() as i32);
        assert!(!handles(pid, Signal::SIGUSR1), "no trap yet");
        assert!(handles(pid, Signal::SIGWINCH), "ignored by default");
        use std::io::{BufRead, Write};
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin).unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "ready\n");
        assert!(handles(pid, Signal::SIGUSR1), "trapped");
        drop(stdin);
        child.wait().unwrap();
        assert!(!handles(pid, Signal::SIGUSR1), "gone");
    }

    #[test]
    fn signals() {
        assert_eq!(parse_signal("HUP"), Ok(Signal::SIGHUP));
        assert_eq!(parse_signal("sigusr1"), Ok(Signal::SIGUSR1));
        assert!(parse_signal("KILL").is_err());
        assert!(parse_signal("nope").is_err());
    }
}
