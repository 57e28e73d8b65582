//! What the writers and the webhook servers reported: the writers' JSON lines (`fence-candidate`)
//! and the webhook's `fence check` lines (`kube-leader fence serve --log-format json`, with
//! `RUST_LOG` at debug for its `fence` module).

use std::path::Path;

use serde_json::Value;

/// Which set of objects a write went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Side {
    /// `fenced-<i>`: under the enforcing rule.
    Fenced,
    /// `audit-<i>`: the twin, under the audit-only rule.
    Audit,
    /// `plain-<i>`: under no rule (the latency pair).
    Plain,
}

impl Side {
    /// The side of object `name`, by its prefix.
    pub fn of(name: &str) -> Option<Side> {
        match name.split_once('-')?.0 {
            "fenced" => Some(Side::Fenced),
            "audit" => Some(Side::Audit),
            "plain" => Some(Side::Plain),
            _ => None,
        }
    }
}

/// How a write ended, as its writer saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It landed.
    Ok,
    /// 403: the fence (or RBAC) refused it.
    Refused,
    /// Another error (the webhook unreachable is a 500 here).
    Error,
    /// No answer within the writer's timeout.
    Timeout,
}

/// One write, as its writer reported it.
#[derive(Debug, Clone)]
pub struct WriteRecord {
    /// The writer's identity (one process's term).
    pub identity: String,
    /// The token the write carried.
    pub token: u64,
    /// Its side.
    pub side: Side,
    /// The object written.
    pub object: String,
    /// The writer's tick: the three writes of a tick go out together.
    pub tick: u64,
    /// When it was sent and answered (CLOCK_MONOTONIC ns).
    pub start_ns: u64,
    /// See `start_ns`.
    pub end_ns: u64,
    /// When it was answered, wall clock (µs since the epoch).
    pub end_unix_us: u64,
    /// How it ended.
    pub outcome: Outcome,
    /// The stored object's `resourceVersion` (a landed write's commit).
    pub rv: Option<u64>,
    /// The answer's message, if not landed.
    pub message: Option<String>,
}

impl WriteRecord {
    /// How long the write took.
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }

    fn parse(v: &Value) -> Option<Self> {
        if v["event"] != "write" {
            return None;
        }
        let object = v["object"].as_str()?.to_owned();
        let outcome = match v["outcome"].as_str()? {
            "ok" => Outcome::Ok,
            "refused" => Outcome::Refused,
            "timeout" => Outcome::Timeout,
            _ => Outcome::Error,
        };
        Some(Self {
            identity: v["identity"].as_str()?.to_owned(),
            token: v["token"].as_u64()?,
            side: Side::of(&object)?,
            object,
            tick: v["tick"].as_u64()?,
            start_ns: v["start_ns"].as_u64()?,
            end_ns: v["end_ns"].as_u64()?,
            end_unix_us: v["end_unix_us"].as_u64()?,
            outcome,
            rv: v["rv"].as_str().and_then(|s| s.parse().ok()),
            message: v["message"].as_str().map(str::to_owned),
        })
    }
}

/// One `fence check` of the webhook: a fenced write checked against the lock it read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// The object's name.
    pub name: String,
    /// The write's token.
    pub token: u64,
    /// The stored object's `resourceVersion` (update, delete): the write commits as the next.
    pub old_version: Option<u64>,
    /// The lock's `resourceVersion` the check read.
    pub lock_version: Option<u64>,
    /// The lock's token the check read.
    pub lock_token: Option<u64>,
    /// Whether the webhook found nothing to refuse.
    pub allowed: bool,
    /// When the line was written, just after the lock's read (µs since the epoch).
    pub at_unix_us: u64,
}

impl Check {
    fn parse(v: &Value) -> Option<Self> {
        if v["message"] != "fence check" {
            return None;
        }
        let num = |k: &str| {
            v[k].as_u64()
                .or_else(|| v[k].as_str().and_then(|s| s.parse().ok()))
        };
        let at = humantime::parse_rfc3339_weak(v["timestamp"].as_str()?).ok()?;
        Some(Self {
            name: v["name"].as_str()?.to_owned(),
            token: num("token")?,
            old_version: num("old_version"),
            lock_version: num("lock_version"),
            lock_token: num("lock_token"),
            allowed: v["allowed"].as_bool()?,
            at_unix_us: at
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64),
        })
    }
}

/// The JSON lines of a file (missing: none; lines that are not JSON are skipped).
fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The writes a candidate's stdout file reports.
pub fn read_writes(path: &Path) -> Vec<WriteRecord> {
    lines(path).iter().filter_map(WriteRecord::parse).collect()
}

/// The `fence check` lines of a webhook server's log, and how many `would refuse` lines it has
/// (audit only).
pub fn read_checks(path: &Path) -> (Vec<Check>, usize) {
    let all = lines(path);
    let would = all.iter().filter(|v| v["message"] == "would refuse").count();
    (all.iter().filter_map(Check::parse).collect(), would)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_line_and_a_write_line_parse() {
        let v: Value = serde_json::from_str(
            r#"{"timestamp":"2026-12-04T01:20:49.123456Z","level":"DEBUG","message":"fence check",
            "operation":"UPDATE","namespace":"n","name":"fenced-1","token":57,"old_version":"60",
            "lock":"n/l","lock_version":"58","lock_token":57,"allowed":true}"#,
        )
        .unwrap();
        let c = Check::parse(&v).unwrap();
        assert_eq!(
            (c.token, c.old_version, c.lock_version, c.lock_token, c.allowed),
            (57, Some(60), Some(58), Some(57), true)
        );
        assert_eq!(c.at_unix_us % 1_000_000, 123_456);
        let w: Value = serde_json::from_str(
            r#"{"event":"write","identity":"c1","token":57,"side":"audit","object":"audit-2",
            "tick":3,"start_ns":10,"end_ns":25,"end_unix_us":99,"outcome":"ok","rv":"61"}"#,
        )
        .unwrap();
        let w = WriteRecord::parse(&w).unwrap();
        assert_eq!(
            (w.side, w.rv, w.duration_ns(), w.outcome),
            (Side::Audit, Some(61), 15, Outcome::Ok)
        );
    }
}
