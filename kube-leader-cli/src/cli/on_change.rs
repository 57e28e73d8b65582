//! `--on-shards-change POLICY`: what a change of COMMAND's shards does, as parsed from the flag.

use nix::sys::signal::Signal;

/// What a change of COMMAND's shards does (`--on-shards-change`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnChange {
    /// Stop COMMAND, release the shards it gave up, start it again with the new set.
    Restart,
    /// Rewrite the shard file and send this signal; COMMAND acknowledges (else: restart).
    Signal(Signal),
}

/// Parses `--on-shards-change`: `restart`, or `signal:SIG` (`signal` alone is `signal:HUP`).
pub(crate) fn parse_on_change(s: &str) -> Result<OnChange, String> {
    match s.trim() {
        "restart" => Ok(OnChange::Restart),
        "signal" => Ok(OnChange::Signal(Signal::SIGHUP)),
        other => match other.strip_prefix("signal:") {
            Some(sig) => parse_signal(sig).map(OnChange::Signal),
            None => Err(format!(
                "unknown policy {s:?}: `restart` (the default) or `signal:SIG` (e.g. signal:HUP)"
            )),
        },
    }
}

/// Parses a signal name: `HUP`, `SIGHUP`, `USR1`, ...
fn parse_signal(s: &str) -> Result<Signal, String> {
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
    use super::*;

    #[test]
    fn policies() {
        assert_eq!(parse_on_change("restart"), Ok(OnChange::Restart));
        assert_eq!(parse_on_change("signal"), Ok(OnChange::Signal(Signal::SIGHUP)));
        assert_eq!(
            parse_on_change("signal:usr1"),
            Ok(OnChange::Signal(Signal::SIGUSR1))
        );
        assert!(parse_on_change("signal:KILL").is_err());
        assert!(parse_on_change("hup").unwrap_err().contains("restart"));
    }

    #[test]
    fn signals() {
        assert_eq!(parse_signal("HUP"), Ok(Signal::SIGHUP));
        assert_eq!(parse_signal("sigusr1"), Ok(Signal::SIGUSR1));
        assert!(parse_signal("KILL").is_err());
        assert!(parse_signal("nope").is_err());
    }
}
