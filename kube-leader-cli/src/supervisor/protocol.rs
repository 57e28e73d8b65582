//! The control protocol: the lines kube-leader sends to its supervisor (see the table in the
//! [module documentation](super)), and how the supervisor reads them.

use std::time::Duration;

use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};

use crate::cli::LogFormat;

/// `start <json>`: COMMAND's environment, and until when leadership is confirmed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Start {
    /// CLOCK_MONOTONIC nanoseconds.
    pub(super) until_ns: u64,
    pub(super) env: Vec<(String, String)>,
}

impl Start {
    pub(super) fn until(&self) -> Duration {
        Duration::from_nanos(self.until_ns)
    }
}

pub(super) enum Msg {
    /// Start COMMAND with this environment.
    Start(Start),
    /// Leadership confirmed until this CLOCK_MONOTONIC reading.
    Until(Duration),
    Stop,
    Signal(Signal),
    Closed,
    Other,
}

pub(super) fn parse(line: std::io::Result<Option<String>>) -> Msg {
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

/// The `--log-format` value that gives `format`.
pub(super) fn log_format_arg(format: LogFormat) -> &'static str {
    match format {
        LogFormat::Text => "text",
        LogFormat::Json => "json",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
