//! Requests counted at the API server, from its audit log, over a window of time.
//!
//! The test control plane audits every request of `user-1` .. `user-40` (see
//! `kube_leader_testenv::ControlPlane::audit_events`). Its per-user reader returns the whole
//! history; a benchmark needs "requests started between two instants", so this reads the same
//! log (`<control plane dir>/kube-apiserver/audit.log`) once at the start of a window, remembers
//! which requests were already under way, and at the end counts the new ones by user and verb.
//! A watch that was open before the window (its `ResponseStarted` event is older) is not
//! counted when it ends inside the window; a watch opened inside it is.
//!
//! The API server rotates its audit log at 100 MB (`--audit-log-maxsize` 0 means lumberjack's
//! default), renaming it to `audit-<time>.log`: a window follows the file it opened by inode
//! into its new name (by inode), then reads the files started after it whole.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    io::{Read, Seek, SeekFrom},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::Context;
use serde::Deserialize;

/// Requests by verb (`get`, `list`, `watch`, `create`, `update`, ...).
pub(crate) type ByVerb = BTreeMap<String, u64>;

/// An open counting window.
#[derive(Debug)]
pub(crate) struct Window {
    path: PathBuf,
    offset: u64,
    under_way: HashSet<String>,
    opened: Instant,
    inode: u64,
}

#[derive(Debug, Deserialize)]
struct Line {
    #[serde(rename = "auditID")]
    audit_id: String,
    #[serde(default)]
    stage: String,
    verb: String,
    user: UserInfo,
    #[serde(rename = "objectRef", default)]
    object: Option<ObjectRef>,
    #[serde(rename = "responseStatus", default)]
    status: Option<Status>,
    /// When the API server received the request (RFC 3339, microseconds).
    #[serde(rename = "requestReceivedTimestamp", default)]
    received: Option<String>,
    /// When this stage was reached.
    #[serde(rename = "stageTimestamp", default)]
    stage_at: Option<String>,
}

#[derive(Debug, Deserialize)]
struct UserInfo {
    username: String,
}

#[derive(Debug, Deserialize)]
struct ObjectRef {
    #[serde(default)]
    resource: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Status {
    #[serde(default)]
    code: Option<u16>,
}

/// One request started inside a window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) user: String,
    pub(crate) verb: String,
    pub(crate) resource: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) namespace: Option<String>,
    /// The HTTP status of the last event seen for it (a watch's first event has 200).
    pub(crate) code: Option<u16>,
    /// From its receipt to its `ResponseComplete` event (`stageTimestamp` −
    /// `requestReceivedTimestamp`): the API server's whole time on it, queueing by API Priority
    /// and Fairness included. `None` until the request completed.
    pub(crate) latency: Option<Duration>,
}

/// The audit log of a test control plane whose directory is `dir`.
pub(crate) fn log_path(dir: &Path) -> PathBuf {
    dir.join("kube-apiserver").join("audit.log")
}

// === impl Window ===

impl Window {
    /// Opens a window now.
    pub(crate) fn open(path: &Path) -> anyhow::Result<Self> {
        let bytes = std::fs::read(path).with_context(|| format!("read the audit log {}", path.display()))?;
        // Only complete lines count; a half-written last line is read by `close`.
        let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let under_way = lines(&bytes[..complete]).map(|l| l.audit_id).collect();
        let inode = std::fs::metadata(path)?.ino();
        Ok(Self {
            path: path.to_owned(),
            offset: complete as u64,
            under_way,
            opened: Instant::now(),
            inode,
        })
    }

    /// How long the window has been open.
    pub(crate) fn elapsed(&self) -> Duration {
        self.opened.elapsed()
    }

    /// The requests started since [`Window::open`], by user and verb.
    pub(crate) fn close(&self) -> anyhow::Result<HashMap<String, ByVerb>> {
        let mut counts: HashMap<String, ByVerb> = HashMap::new();
        for r in self.requests()? {
            *counts.entry(r.user).or_default().entry(r.verb).or_default() += 1;
        }
        Ok(counts)
    }

    /// The requests started since [`Window::open`], in the order the API server logged them.
    pub(crate) fn requests(&self) -> anyhow::Result<Vec<Request>> {
        let bytes = self.read_since_open()?;
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut requests: Vec<Request> = Vec::new();
        for line in lines(&bytes) {
            if self.under_way.contains(&line.audit_id) {
                continue;
            }
            let code = line.status.as_ref().and_then(|s| s.code);
            let latency = (line.stage == "ResponseComplete")
                .then(|| latency(line.received.as_deref()?, line.stage_at.as_deref()?))
                .flatten();
            if let Some(&i) = index.get(&line.audit_id) {
                requests[i].code = code.or(requests[i].code);
                requests[i].latency = latency.or(requests[i].latency);
                continue;
            }
            // A watch whose first event here is its successful end started before the window,
            // in a log file rotated away before the window opened.
            if line.verb == "watch" && line.stage == "ResponseComplete" && code == Some(200) {
                continue;
            }
            index.insert(line.audit_id, requests.len());
            requests.push(Request {
                user: line.user.username,
                verb: line.verb,
                resource: line.object.as_ref().and_then(|o| o.resource.clone()),
                name: line.object.as_ref().and_then(|o| o.name.clone()),
                namespace: line.object.as_ref().and_then(|o| o.namespace.clone()),
                code,
                latency,
            });
        }
        Ok(requests)
    }
}

impl Window {
    /// The log written since the window opened, across rotations: the rest of the file it
    /// opened (under whatever name it has now), then every log file started since, oldest first.
    fn read_since_open(&self) -> anyhow::Result<Vec<u8>> {
        let dir = self.path.parent().context("the audit log has no directory")?;
        let current = self
            .path
            .file_name()
            .context("the audit log has no name")?
            .to_owned();
        let mut opened: Option<PathBuf> = None;
        let mut backups = Vec::new();
        for entry in std::fs::read_dir(dir)?.flatten() {
            let name = entry.file_name();
            let text = name.to_string_lossy();
            if !(text.starts_with("audit") && text.ends_with(".log")) {
                continue;
            }
            if entry.metadata()?.ino() == self.inode {
                opened = Some(entry.path());
            } else if name != current {
                backups.push(entry.path());
            }
        }
        let opened = opened.context("the audit log the window opened is gone")?;
        // Backups are named `audit-<rotation time>.log`: those after the opened file's are newer.
        backups.retain(|b| opened.file_name() != Some(&*current) && b.file_name() > opened.file_name());
        backups.sort();
        let mut files = vec![(opened.clone(), self.offset)];
        files.extend(backups.into_iter().map(|b| (b, 0)));
        if opened.file_name() != Some(&*current) {
            files.push((dir.join(&current), 0));
        }
        let mut bytes = Vec::new();
        for (path, offset) in files {
            let Ok(mut file) = std::fs::File::open(&path) else {
                continue;
            };
            file.seek(SeekFrom::Start(offset))?;
            file.read_to_end(&mut bytes)?;
            if bytes.last().is_some_and(|&b| b != b'\n') {
                bytes.push(b'\n');
            }
        }
        Ok(bytes)
    }
}

fn lines(bytes: &[u8]) -> impl Iterator<Item = Line> + '_ {
    bytes
        .split(|&b| b == b'\n')
        .filter_map(|l| serde_json::from_slice::<Line>(l).ok())
}

/// `to` − `from`, two audit timestamps (`2026-12-06T10:11:12.123456Z`); `None` if either does
/// not parse or `to` is earlier.
fn latency(from: &str, to: &str) -> Option<Duration> {
    let (a, b) = (micros(from)?, micros(to)?);
    Some(Duration::from_micros(u64::try_from(b - a).ok()?))
}

/// Microseconds since the Unix epoch of an RFC 3339 UTC timestamp as the API server writes
/// them (`Z`, up to nine fractional digits).
fn micros(ts: &str) -> Option<i64> {
    let ts = ts.strip_suffix('Z')?;
    let (date, time) = ts.split_once('T')?;
    let mut d = date.splitn(3, '-').map(str::parse::<i64>);
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':').map(str::parse::<i64>);
    let (h, min, s) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    let mut frac_us = 0i64;
    for (i, c) in frac.bytes().take(6).enumerate() {
        if !c.is_ascii_digit() {
            return None;
        }
        frac_us += i64::from(c - b'0') * 10i64.pow(5 - i as u32);
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400 + h * 3600 + min * 60 + s) * 1_000_000) + frac_us)
}

/// The sum of several users' counts.
pub(crate) fn sum<'a>(counts: impl IntoIterator<Item = &'a ByVerb>) -> ByVerb {
    let mut total = ByVerb::new();
    for c in counts {
        for (verb, n) in c {
            *total.entry(verb.clone()).or_default() += n;
        }
    }
    total
}

/// All requests in `counts`.
pub(crate) fn total(counts: &ByVerb) -> u64 {
    counts.values().sum()
}

/// Reads are `get` and `list`; writes are `create`, `update`, `patch` and `delete`.
pub(crate) fn reads(counts: &ByVerb) -> u64 {
    ["get", "list"]
        .iter()
        .map(|v| counts.get(*v).copied().unwrap_or(0))
        .sum()
}

/// See [`reads`].
pub(crate) fn writes(counts: &ByVerb) -> u64 {
    ["create", "update", "patch", "delete"]
        .iter()
        .map(|v| counts.get(*v).copied().unwrap_or(0))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(id: &str, stage: &str, verb: &str, user: &str) -> String {
        format!(
            r#"{{"kind":"Event","auditID":"{id}","stage":"{stage}","verb":"{verb}","user":{{"username":"{user}"}},"requestURI":"/x"}}"#
        ) + "\n"
    }

    #[test]
    fn counts_only_requests_started_inside_the_window() {
        let dir = std::env::temp_dir().join(format!("kube-leader-bench-audit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.log");
        // A watch open before the window, and a finished get.
        std::fs::write(
            &path,
            line("w1", "ResponseStarted", "watch", "user-1")
                + &line("g1", "ResponseComplete", "get", "user-1"),
        )
        .unwrap();
        let window = Window::open(&path).unwrap();
        let mut more = String::new();
        more += &line("w1", "ResponseComplete", "watch", "user-1"); // ends inside: not counted
        more += &line("w2", "ResponseStarted", "watch", "user-1"); // opens inside: counted once
        more += &line("w2", "ResponseComplete", "watch", "user-1");
        more += &line("u1", "ResponseComplete", "update", "user-2");
        more += "{\"half";
        std::fs::write(&path, std::fs::read_to_string(&path).unwrap() + &more).unwrap();

        let counts = window.close().unwrap();

        assert_eq!(counts["user-1"], ByVerb::from([("watch".to_owned(), 1)]));
        assert_eq!(counts["user-2"], ByVerb::from([("update".to_owned(), 1)]));
        assert_eq!(writes(&counts["user-2"]), 1);
        assert_eq!(reads(&counts["user-2"]), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn latency_from_the_two_timestamps() {
        assert_eq!(micros("1970-01-01T00:00:01.5Z"), Some(1_500_000));
        assert_eq!(micros("2000-03-01T00:00:00Z"), Some(951_868_800_000_000));
        assert_eq!(
            latency("2026-12-31T23:59:59.999990Z", "2027-01-01T00:00:00.000015Z"),
            Some(Duration::from_micros(25))
        );
        assert_eq!(latency("2026-12-06T10:00:01Z", "2026-12-06T10:00:00Z"), None);
        assert_eq!(micros("not a time"), None);

        let dir = std::env::temp_dir().join(format!("kube-leader-bench-latency-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.log");
        std::fs::write(&path, "").unwrap();
        let window = Window::open(&path).unwrap();
        std::fs::write(
            &path,
            r#"{"auditID":"u1","stage":"ResponseComplete","verb":"update","user":{"username":"user-1"},"objectRef":{"resource":"leases","namespace":"kl-a","name":"x"},"responseStatus":{"code":200},"requestReceivedTimestamp":"2026-12-06T10:00:00.000100Z","stageTimestamp":"2026-12-06T10:00:00.012600Z"}"#
                .to_owned()
                + "\n",
        )
        .unwrap();
        let r = &window.requests().unwrap()[0];
        assert_eq!(r.namespace.as_deref(), Some("kl-a"));
        assert_eq!(r.latency, Some(Duration::from_micros(12_500)));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn follows_the_log_through_a_rotation() {
        let dir = std::env::temp_dir().join(format!("kube-leader-bench-rotate-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.log");
        std::fs::write(&path, line("g0", "ResponseComplete", "get", "user-1")).unwrap();
        let window = Window::open(&path).unwrap();
        // Written before the rotation, then renamed away as the API server's logger does.
        let old =
            std::fs::read_to_string(&path).unwrap() + &line("u1", "ResponseComplete", "update", "user-1");
        std::fs::write(&path, old).unwrap();
        std::fs::rename(&path, dir.join("audit-2026-01-01T00-00-00.000.log")).unwrap();
        let mut new = line("u2", "ResponseComplete", "update", "user-1");
        // A watch from long before, ending now.
        new += r#"{"auditID":"w0","stage":"ResponseComplete","verb":"watch","user":{"username":"user-1"},"responseStatus":{"code":200}}"#;
        new += "\n";
        std::fs::write(&path, new).unwrap();

        let counts = window.close().unwrap();

        assert_eq!(counts["user-1"], ByVerb::from([("update".to_owned(), 2)]));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
