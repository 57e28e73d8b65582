//! Parsers of single flag values: durations, names, addresses.

use std::{net::SocketAddr, time::Duration};

use kube_leader::Strategy;

/// Parses a duration written as `500ms`, `2s`, `1m`, `1m30s` (at most 365 days).
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration; write it like 500ms, 2s or 1m".into());
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("missing unit; write it like {s}s or {s}ms"));
    }
    let d = humantime::parse_duration(s).map_err(|e| format!("{e}; write it like 500ms, 2s or 1m"))?;
    // Found by fuzzing: durations near u64::MAX seconds overflow the arithmetic on timings
    // (deadlines, the jitter factor). Nothing here needs more than a year.
    if d > MAX_DURATION {
        return Err(format!("{s} is too long: at most 365d"));
    }
    Ok(d)
}

/// Leader for life's default grace. A successor can start as soon as the lock is gone (its Pod
/// deleted), so any grace may overlap it; 10 s, as the seed's default and within Kubernetes'
/// 30 s termination grace period, leaves COMMAND time to stop cleanly when its Pod goes away.
pub(crate) const FOR_LIFE_GRACE: Duration = Duration::from_secs(10);

/// Leader for life's default liveness: a heartbeat every 1.7 s, COMMAND stopped 5 s after the
/// last one got through, and an ended leader Pod taken over 5 s + --grace + 2 s after its
/// heartbeat last moved (instead of its grace period + 2 s).
pub(crate) const DEFAULT_LIVENESS: Duration = Duration::from_secs(5);

/// `--liveness`: a duration, or `off` (also `0`) for none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LivenessArg(pub(crate) Option<Duration>);

pub(crate) fn parse_liveness(s: &str) -> Result<LivenessArg, String> {
    match s.trim() {
        "off" | "0" => Ok(LivenessArg(None)),
        s => parse_duration(s).map(|d| LivenessArg((!d.is_zero()).then_some(d))),
    }
}

/// `--strategy`: the library's strategies by name, each with its help.
pub(super) fn parse_strategy() -> impl clap::builder::TypedValueParser<Value = Strategy> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser as _};
    use kube_leader::internal::{strategy_named, StrategyExt as _, STRATEGIES};
    PossibleValuesParser::new(STRATEGIES.map(|s| PossibleValue::new(s.as_str()).help(s.help())))
        .try_map(|name| strategy_named(&name).ok_or("no such strategy"))
}

/// The longest duration any flag accepts.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

pub(super) fn parse_lock_name(s: &str) -> Result<String, String> {
    kube_leader::internal::validate_name(s).map_err(|e| e.to_string())?;
    Ok(s.to_string())
}

/// `--elector-service-account`: a ServiceAccount's name, not `default` (the ServiceAccount of
/// every Pod that names none, whose requests would all count as kube-leader's).
pub(super) fn parse_elector(s: &str) -> Result<String, String> {
    if s == "default" {
        return Err("the elector needs a ServiceAccount of its own: `default` is the \
                    ServiceAccount of every Pod that names none"
            .into());
    }
    parse_lock_name(s)
}

pub(super) fn parse_namespace(s: &str) -> Result<String, String> {
    // A namespace is a DNS-1123 label: a subdomain without dots, at most 63 characters.
    if s.contains('.') || s.len() > 63 {
        return Err("a namespace is at most 63 lower-case letters, digits and '-'".into());
    }
    kube_leader::internal::validate_name(s)
        .map_err(|_| "a namespace is at most 63 lower-case letters, digits and '-'".to_string())?;
    Ok(s.to_string())
}

pub(super) fn parse_identity(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("must not be empty".into());
    }
    Ok(s.to_string())
}

/// `IP:PORT`, `:PORT` for every IPv4 interface (`0.0.0.0:PORT`), as Go servers read it, or
/// `localhost:PORT` for `127.0.0.1:PORT` (as leader-elector's `--http=localhost:4040`).
pub(crate) fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    let port_of = |port: &str| port.parse::<u16>().map_err(|_| format!("invalid port {port:?}"));
    if let Some(port) = s.strip_prefix(':') {
        return Ok(SocketAddr::from(([0, 0, 0, 0], port_of(port)?)));
    }
    if let Some(port) = s.strip_prefix("localhost:") {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port_of(port)?)));
    }
    s.parse()
        .map_err(|_| "expected IP:PORT (for example 127.0.0.1:4040), :PORT or localhost:PORT".to_string())
}
