//! `--on-shards-change`: restart COMMAND, or signal it (an explicit opt-in); in signal mode the
//! signal is held back until COMMAND's handler is installed (a timing aid for a program that
//! installs it late, never a guess whether it handles the signal: that is the user's word).

use nix::{sys::signal::Signal, unistd::Pid};

/// Whether sending `signal` to `pid` cannot end it: the process catches or ignores it
/// (`SigCgt`/`SigIgn` in `/proc/PID/status`), or the signal's default action is to ignore it.
pub(super) fn handles(pid: Pid, signal: Signal) -> bool {
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
}
