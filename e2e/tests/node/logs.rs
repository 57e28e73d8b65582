//! The containers' logs in `/var/log/pods`: the records of the leader's work, each stamped with
//! CLOCK_MONOTONIC, and the log messages of kube-leader.
//!
//! Two kinds of work write records: the test workload `scripts/images/workload.c` (the
//! node-test image's `sleep`, COMMAND of kube-leader), `kl-workload start|stop|crash ...` lines,
//! and the client-go candidate (`tools/go-candidate`), JSON `started_leading`/`stopped_leading`
//! events. A process of either that disappears without a record (SIGKILL) is noticed in `/proc`.

use std::{
    collections::{BTreeMap, HashMap},
    io::{Read, Seek, SeekFrom},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use kube_leader_e2e::mono_ns;
use serde_json::Value;

use crate::CONTAINER;

/// Which host processes do the leader's work, and where their environment names their Pod.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Work {
    /// The process's `comm` (its executable's name, cut to 15 bytes).
    comm: &'static str,
    /// The environment variable that holds the Pod's name.
    identity_var: &'static str,
    /// The environment variable that holds the Pod's namespace.
    namespace_var: &'static str,
}

impl Work {
    /// The name `pidof` finds the work's process by.
    pub(crate) fn comm(self) -> &'static str {
        self.comm
    }

    /// COMMAND of kube-leader: the test workload, with the variables kube-leader gives COMMAND.
    pub(crate) const WORKLOAD: Work = Work {
        comm: "sleep",
        identity_var: "KUBE_LEADER_IDENTITY",
        namespace_var: "KUBE_LEADER_NAMESPACE",
    };
    /// The user's program of the deploy/patterns tests (`scripts/images/app.sh`, an image that
    /// knows nothing of kube-leader), COMMAND of kube-leader.
    pub(crate) const APP: Work = Work {
        comm: "app",
        identity_var: "KUBE_LEADER_IDENTITY",
        namespace_var: "KUBE_LEADER_NAMESPACE",
    };
    /// The client-go candidate, with the Downward API variables of deploy/'s Deployment.
    pub(crate) const GO_CANDIDATE: Work = Work {
        comm: "kube-leader-go-",
        identity_var: "POD_NAME",
        namespace_var: "POD_NAMESPACE",
    };
}

/// For each Pod whose last record is a start: that start (CLOCK_MONOTONIC ns).
pub(crate) fn running_terms(records: &[Record]) -> BTreeMap<String, u64> {
    let mut running = BTreeMap::new();
    for record in records {
        match record.kind.as_str() {
            "start" => {
                running.insert(record.pod.clone(), record.mono_ns);
            }
            "stop" | "crash" | "gone" => {
                running.remove(&record.pod);
            }
            _ => {}
        }
    }
    running
}

/// One record of the leader's work: the test workload's, or the client-go candidate's event.
#[derive(Clone, Debug)]
pub(crate) struct Record {
    /// The Pod whose log (or process) it came from.
    pub(crate) pod: String,
    /// `start`, `stop`, `crash`, `fill`, `gone` (the process disappeared without a record), or
    /// `sees` (the native-sidecar app's answer changed: `identity` is the leader it names).
    pub(crate) kind: String,
    /// When, CLOCK_MONOTONIC nanoseconds.
    pub(crate) mono_ns: u64,
    /// The identity the work was given (`start` only).
    pub(crate) identity: String,
    /// The namespace the work was given (`start` of the test workload only).
    pub(crate) namespace: String,
    /// The signal that stopped it (`stop` of the test workload only).
    pub(crate) signal: Option<i32>,
}

#[derive(Debug, Default)]
struct LogState {
    /// Read offset and unfinished line per log file.
    files: HashMap<PathBuf, (u64, String)>,
    /// Every record, in the order read (per file in order; files in CLOCK order via `mono_ns`).
    records: Vec<Record>,
    /// The last status server address each Pod logged.
    status_addrs: HashMap<String, String>,
    /// kube-leader's log messages per Pod, each with its time (CLOCK_MONOTONIC ns, from the
    /// line's own wall-clock timestamp; 0 where it has none).
    messages: HashMap<String, Vec<(String, u64)>>,
    /// The workload processes alive at the last look at `/proc`: host pid → (Pod, start time).
    alive: HashMap<u32, (String, String)>,
}

/// Tails the logs of one namespace's containers in `/var/log/pods` every 50 ms, keeping what
/// it read after the kubelet removes them.
pub(crate) struct PodLogs {
    state: Arc<Mutex<LogState>>,
    stop: Arc<AtomicBool>,
}

impl PodLogs {
    /// Starts tailing the logs of `namespace`'s Pods under `dir` (their [`CONTAINER`]),
    /// watching `work`'s processes.
    pub(crate) fn tail(dir: &'static Path, namespace: &str, work: Work) -> Self {
        Self::tail_containers(dir, namespace, Some(work), &[CONTAINER])
    }

    /// Starts tailing the logs of `containers` of `namespace`'s Pods under `dir` (their records
    /// and kube-leader messages go to the Pod alike), watching `work`'s processes if any.
    pub(crate) fn tail_containers(
        dir: &'static Path,
        namespace: &str,
        work: Option<Work>,
        containers: &'static [&'static str],
    ) -> Self {
        let state = Arc::new(Mutex::new(LogState::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let prefix = format!("{namespace}_");
        {
            let state = state.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let namespace = prefix.trim_end_matches('_').to_owned();
                while !stop.load(Ordering::Relaxed) {
                    let mut state = state.lock().unwrap();
                    poll_logs(dir, &prefix, containers, &mut state);
                    if let Some(work) = work {
                        poll_processes(&namespace, work, &mut state);
                    }
                    drop(state);
                    std::thread::sleep(Duration::from_millis(50));
                }
            });
        }
        Self { state, stop }
    }

    pub(crate) fn records(&self) -> Vec<Record> {
        let mut records = self.state.lock().unwrap().records.clone();
        records.sort_by_key(|r| r.mono_ns);
        records
    }

    pub(crate) fn starts_of(&self, pod: &str) -> Vec<Record> {
        self.records()
            .into_iter()
            .filter(|r| r.pod == pod && r.kind == "start")
            .collect()
    }

    pub(crate) fn stops_of(&self, pod: &str) -> Vec<Record> {
        self.records()
            .into_iter()
            .filter(|r| r.pod == pod && r.kind == "stop")
            .collect()
    }

    /// The first record after `after` that says `pod`'s COMMAND ended: stop, crash, or gone
    /// (its process disappeared without a record: SIGKILL).
    pub(crate) fn end_of(&self, pod: &str, after: u64) -> Option<Record> {
        self.records().into_iter().find(|r| {
            r.pod == pod && r.mono_ns > after && matches!(r.kind.as_str(), "stop" | "crash" | "gone")
        })
    }

    /// Whether kube-leader in `pod` logged `message`.
    pub(crate) fn logged(&self, pod: &str, message: &str) -> bool {
        self.state
            .lock()
            .unwrap()
            .messages
            .get(pod)
            .is_some_and(|m| m.iter().any(|(m, _)| m == message))
    }

    /// When kube-leader in `pod` first logged a message starting with `prefix` after `after`
    /// (CLOCK_MONOTONIC ns, converted from the log line's wall-clock timestamp: the same
    /// host's clocks, so within the microseconds of the conversion).
    pub(crate) fn logged_at(&self, pod: &str, prefix: &str, after: u64) -> Option<u64> {
        self.state
            .lock()
            .unwrap()
            .messages
            .get(pod)?
            .iter()
            .find(|(m, at)| *at > after && m.starts_with(prefix))
            .map(|(_, at)| *at)
    }

    /// kube-leader's messages in `pod` between `from` and `to` (CLOCK_MONOTONIC ns), with their
    /// times: a trace of one step.
    pub(crate) fn messages_between(&self, pod: &str, from: u64, to: u64) -> Vec<(u64, String)> {
        let state = self.state.lock().unwrap();
        let Some(messages) = state.messages.get(pod) else {
            return Vec::new();
        };
        messages
            .iter()
            .filter(|(_, at)| (from..=to).contains(at))
            .map(|(m, at)| (*at, m.clone()))
            .collect()
    }

    /// Every Pod with a record or a kube-leader message, by name.
    pub(crate) fn pods(&self) -> Vec<String> {
        let state = self.state.lock().unwrap();
        let mut pods: Vec<String> = state.messages.keys().cloned().collect();
        pods.extend(state.records.iter().map(|r| r.pod.clone()));
        pods.sort();
        pods.dedup();
        pods
    }

    pub(crate) fn status_addr(&self, pod: &str) -> Option<String> {
        self.state.lock().unwrap().status_addrs.get(pod).cloned()
    }
}

impl Drop for PodLogs {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn poll_logs(dir: &Path, prefix: &str, containers: &[&str], state: &mut LogState) {
    let Ok(pods) = std::fs::read_dir(dir) else { return };
    for pod_dir in pods.flatten() {
        let name = pod_dir.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(prefix) else {
            continue;
        };
        // <namespace>_<pod>_<uid>
        let Some((pod, _uid)) = rest.rsplit_once('_') else {
            continue;
        };
        let mut files: Vec<PathBuf> = containers
            .iter()
            .filter_map(|c| std::fs::read_dir(pod_dir.path().join(c)).ok())
            .flat_map(|files| files.flatten().map(|f| f.path()))
            .collect();
        files.sort();
        for file in files {
            let (offset, partial) = state.files.entry(file.clone()).or_default();
            let Ok(mut f) = std::fs::File::open(&file) else {
                continue;
            };
            if f.seek(SeekFrom::Start(*offset)).is_err() {
                continue;
            }
            let mut bytes = Vec::new();
            let Ok(n) = f.read_to_end(&mut bytes) else {
                continue;
            };
            *offset += n as u64;
            partial.push_str(&String::from_utf8_lossy(&bytes));
            let complete = match partial.rfind('\n') {
                Some(i) => {
                    let rest = partial.split_off(i + 1);
                    std::mem::replace(partial, rest)
                }
                None => continue,
            };
            for line in complete.lines() {
                // CRI log format: <time> <stream> <P|F> <text>
                let mut fields = line.splitn(4, ' ');
                let (Some(time), Some(_), Some(_), Some(text)) =
                    (fields.next(), fields.next(), fields.next(), fields.next())
                else {
                    continue;
                };
                if let Some(record) = parse_record(pod, text) {
                    state.records.push(record);
                } else if let Some(record) = parse_app_line(pod, text, time) {
                    state.records.push(record);
                } else if let Ok(log) = serde_json::from_str::<Value>(text) {
                    if let Some(record) = parse_event(pod, &log) {
                        state.records.push(record);
                        continue;
                    }
                    let message = log["message"].as_str().unwrap_or_default();
                    if message == "status server listening" {
                        if let Some(addr) = log["addr"].as_str() {
                            state.status_addrs.insert(pod.to_owned(), addr.to_owned());
                        }
                    }
                    state
                        .messages
                        .entry(pod.to_owned())
                        .or_default()
                        .push((message.to_owned(), wall_to_mono(&log["timestamp"])));
                }
            }
        }
    }
}

/// Notes when a workload process of `namespace` disappears from `/proc` (a SIGKILL leaves no
/// record): a `gone` record at the time it was first seen missing (within 50 ms).
fn poll_processes(namespace: &str, work: Work, state: &mut LogState) {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    let mut seen = HashMap::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let path = entry.path();
        if std::fs::read_to_string(path.join("comm")).map_or(true, |c| c.trim() != work.comm) {
            continue;
        }
        let Ok(environ) = std::fs::read(path.join("environ")) else {
            continue;
        };
        let mut pod = None;
        let mut in_namespace = false;
        for var in environ.split(|&b| b == 0) {
            let var = String::from_utf8_lossy(var);
            let Some((name, value)) = var.split_once('=') else {
                continue;
            };
            if name == work.identity_var {
                pod = Some(value.to_owned());
            } else if name == work.namespace_var && value == namespace {
                in_namespace = true;
            }
        }
        let (Some(pod), true) = (pod, in_namespace) else {
            continue;
        };
        // Field 22 of stat: the start time, which tells a reused pid from the same process;
        // field 4: the parent.
        let stat = std::fs::read_to_string(path.join("stat")).unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let started = fields.get(19).copied().unwrap_or("").to_owned();
        let parent = fields.get(1).and_then(|p| p.parse::<u32>().ok()).unwrap_or(0);
        seen.insert(pid, (pod, started, parent));
    }
    // A child the work forked is a copy of it (same name, same environment) until it execs
    // (the app's `sleep 1 &`): caught in that moment, it would be taken for the work and its
    // exec or exit for the work's end. Only processes whose parent is not the work count.
    let seen: HashMap<u32, (String, String)> = seen
        .iter()
        .filter(|(_, (pod, _, parent))| seen.get(parent).is_none_or(|(p, _, _)| p != pod))
        .map(|(pid, (pod, started, _))| (*pid, (pod.clone(), started.clone())))
        .collect();
    let now = mono_ns();
    for (pid, (pod, started)) in std::mem::take(&mut state.alive) {
        if seen.get(&pid).is_none_or(|(_, s)| *s != started) {
            state.records.push(Record {
                pod,
                kind: "gone".into(),
                mono_ns: now,
                identity: String::new(),
                namespace: namespace.to_owned(),
                signal: None,
            });
        }
    }
    state.alive = seen;
}

/// A log line's RFC 3339 timestamp (kube-leader's JSON logs) as CLOCK_MONOTONIC ns: the wall
/// clock's distance from now, taken from the monotonic clock's now. 0 where it has none.
fn wall_to_mono(timestamp: &Value) -> u64 {
    let Some(at) = timestamp
        .as_str()
        .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
    else {
        return 0;
    };
    let now_mono = mono_ns();
    let now_wall = std::time::SystemTime::now();
    match now_wall.duration_since(at) {
        Ok(ago) => now_mono.saturating_sub(ago.as_nanos() as u64),
        Err(ahead) => now_mono + ahead.duration().as_nanos() as u64,
    }
}

/// A `started_leading` or `stopped_leading` event of the client-go candidate, as a `start` or
/// `stop` record.
fn parse_event(pod: &str, event: &Value) -> Option<Record> {
    let kind = match event["event"].as_str()? {
        "started_leading" => "start",
        "stopped_leading" => "stop",
        _ => return None,
    };
    Some(Record {
        pod: pod.to_owned(),
        kind: kind.to_owned(),
        mono_ns: event["mono_ns"].as_u64()?,
        identity: event["identity"].as_str().unwrap_or_default().to_owned(),
        namespace: String::new(),
        signal: None,
    })
}

/// A line of the patterns' app (`scripts/images/app.sh`), which cannot read CLOCK_MONOTONIC:
/// "app: started as POD ..." or "app: stopping as POD" (on SIGTERM), at the time the runtime
/// read it (the CRI log line's timestamp, converted on the same host). The native-sidecar
/// pattern's app (deploy/patterns/native-sidecar), which runs in every replica and asks
/// `kube-leader elect` who leads, also writes "app: working as POD" (its work starts), "app:
/// not working as POD ..." (it stops) and "app: sees leader NAME" (a `sees` record naming NAME,
/// `-` for none, each time its answer changes).
fn parse_app_line(pod: &str, text: &str, time: &str) -> Option<Record> {
    let rest = text.strip_prefix("app: ")?;
    let (kind, signal, rest) = if let Some(rest) = rest.strip_prefix("started as ") {
        ("start", None, rest)
    } else if let Some(rest) = rest.strip_prefix("working as ") {
        ("start", None, rest)
    } else if let Some(rest) = rest.strip_prefix("not working as ") {
        ("stop", None, rest)
    } else if let Some(rest) = rest.strip_prefix("sees leader ") {
        ("sees", None, rest)
    } else {
        ("stop", Some(15), rest.strip_prefix("stopping as ")?)
    };
    Some(Record {
        pod: pod.to_owned(),
        kind: kind.to_owned(),
        mono_ns: wall_to_mono(&Value::String(time.to_owned())),
        identity: rest.split_whitespace().next().unwrap_or_default().to_owned(),
        namespace: String::new(),
        signal,
    })
}

fn parse_record(pod: &str, text: &str) -> Option<Record> {
    let rest = text.strip_prefix("kl-workload ")?;
    let mut words = rest.split_whitespace();
    let kind = words.next()?.to_owned();
    let fields: HashMap<&str, &str> = words.filter_map(|w| w.split_once('=')).collect();
    Some(Record {
        pod: pod.to_owned(),
        kind,
        mono_ns: fields.get("mono_ns")?.parse().ok()?,
        identity: fields.get("identity").copied().unwrap_or_default().to_owned(),
        namespace: fields.get("namespace").copied().unwrap_or_default().to_owned(),
        signal: fields.get("signal").and_then(|s| s.parse().ok()),
    })
}

#[test]
fn records_parse() {
    let r = parse_record(
        "p-1",
        "kl-workload start mono_ns=12 pid=7 identity=p-1 namespace=ns token=42",
    )
    .unwrap();
    assert_eq!(
        (
            r.kind.as_str(),
            r.mono_ns,
            r.identity.as_str(),
            r.namespace.as_str()
        ),
        ("start", 12, "p-1", "ns")
    );
    let r = parse_record("p-1", "kl-workload stop mono_ns=13 signal=15").unwrap();
    assert_eq!(r.signal, Some(15));
    assert!(parse_record("p-1", "leading as p-1").is_none());
    let event =
        serde_json::json!({"event": "started_leading", "identity": "p-1", "mono_ns": 5, "unix_ns": 9});
    let r = parse_event("p-1", &event).unwrap();
    assert_eq!(
        (r.kind.as_str(), r.mono_ns, r.identity.as_str()),
        ("start", 5, "p-1")
    );
    let r = parse_app_line(
        "p-1",
        "app: started as p-1 (fencing token 7)",
        "2026-12-03T10:00:00.5Z",
    )
    .unwrap();
    assert_eq!((r.kind.as_str(), r.identity.as_str()), ("start", "p-1"));
    let r = parse_app_line("p-1", "app: stopping as p-1", "2026-12-03T10:00:01Z").unwrap();
    assert_eq!((r.kind.as_str(), r.signal), ("stop", Some(15)));
    assert!(parse_app_line("p-1", "leading as p-1", "2026-12-03T10:00:01Z").is_none());
    let r = parse_app_line("p-1", "app: working as p-1", "2026-12-03T10:00:02Z").unwrap();
    assert_eq!((r.kind.as_str(), r.identity.as_str()), ("start", "p-1"));
    let r = parse_app_line(
        "p-1",
        "app: not working as p-1 (leader p-2)",
        "2026-12-03T10:00:03Z",
    )
    .unwrap();
    assert_eq!((r.kind.as_str(), r.signal), ("stop", None));
    let r = parse_app_line("p-1", "app: sees leader p-2", "2026-12-03T10:00:03Z").unwrap();
    assert_eq!((r.kind.as_str(), r.identity.as_str()), ("sees", "p-2"));
    assert!(parse_app_line("p-1", "app: p-1 asks http://x/ who leads", "2026-12-03T10:00:03Z").is_none());
    let event = serde_json::json!({"event": "new_leader", "identity": "p-1", "leader": "p-2", "mono_ns": 6});
    assert!(parse_event("p-1", &event).is_none());
}
