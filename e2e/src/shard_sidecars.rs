//! Replicas of the shards sidecar (`kube-leader run --shards M -- shard-command`) and what
//! their COMMANDs did: one [`History`] per shard of COMMAND's work, on CLOCK_MONOTONIC.
//!
//! Each replica runs as `setpriv --pdeathsig KILL -- kube-leader run --shards M ...` in a
//! process group of its own (not as PID 1 of a PID namespace: the kernel would kill COMMAND for
//! a killed kube-leader there); kube-leader gives its supervisor and COMMAND groups of their
//! own. COMMAND (`shard-command`) says on the replica's stdout when it starts working its set
//! (with its pid) and when a stop signal ends its work; a COMMAND killed says nothing, so the
//! harness watches the pid of every running COMMAND and ends its work when it is first seen
//! dead (or a zombie), or when the harness SIGKILLed it, or at the start of the replica's next
//! COMMAND (the supervisor starts one only after the previous one is gone), whichever comes
//! first.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::mpsc,
    time::Duration,
};

use nix::{
    sys::signal::{kill, killpg, Signal},
    unistd::Pid,
};
use serde_json::Value;

use crate::{
    checker::{History, Span},
    mono_ns,
    shard_fleet::{spawn, Timings},
};

/// The programs a sidecar replica runs.
#[derive(Debug, Clone)]
pub struct Programs {
    /// `kube-leader`.
    pub kube_leader: PathBuf,
    /// COMMAND: `shard-command`.
    pub command: PathBuf,
}

/// One run of COMMAND.
#[derive(Debug, Clone)]
struct Work {
    pid: i32,
    shards: Vec<u32>,
}

/// One replica: a `kube-leader run --shards` process and its COMMAND now.
#[derive(Debug)]
struct Replica {
    child: Child,
    pid: i32,
    status: Option<ExitStatus>,
    /// The harness SIGKILLed all of its processes then.
    killed_at: Option<u64>,
    work: Option<Work>,
    /// When its last COMMAND stopped working.
    ended_at: Option<u64>,
}

/// The sidecar replicas of one shard set.
#[derive(Debug)]
pub struct SidecarFleet {
    programs: Programs,
    namespace: String,
    name: String,
    count: u32,
    timings: Timings,
    log_dir: PathBuf,
    replicas: BTreeMap<String, Replica>,
    tx: mpsc::Sender<(String, Value)>,
    rx: mpsc::Receiver<(String, Value)>,
    histories: BTreeMap<u32, History>,
    /// Shard transitions so far (a shard's work passing to another replica).
    pub transitions: usize,
    last_worker: BTreeMap<u32, String>,
    /// Exit status of every replica that exited, by key.
    pub exits: BTreeMap<String, String>,
}

// === impl SidecarFleet ===

impl SidecarFleet {
    /// Replicas of `programs` for the set `name` of `count` shards in `namespace`; logs go to
    /// `log_dir`.
    pub fn new(
        programs: Programs,
        namespace: &str,
        name: &str,
        count: u32,
        timings: Timings,
        log_dir: &Path,
    ) -> Self {
        let (tx, rx) = mpsc::channel();
        let _ = std::fs::create_dir_all(log_dir);
        Self {
            programs,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            count,
            timings,
            log_dir: log_dir.to_owned(),
            replicas: BTreeMap::new(),
            tx,
            rx,
            histories: (0..count).map(|i| (i, History::new())).collect(),
            transitions: 0,
            last_worker: BTreeMap::new(),
            exits: BTreeMap::new(),
        }
    }

    /// Starts replica `key` (its identity), reaching the API server through `kubeconfig`; the
    /// default grace (lease duration − renew deadline) and `--on-shards-change restart`.
    pub fn start(&mut self, key: &str, kubeconfig: &Path) {
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        let t = self.timings;
        let mut command = Command::new("setpriv");
        command
            .args(["--pdeathsig", "KILL", "--"])
            .arg(&self.programs.kube_leader)
            .args(["run", "--strategy", "lease", "--lock", &self.name])
            .args(["--namespace", &self.namespace, "--identity", key])
            .args(["--shards", &self.count.to_string()])
            .args(["--lease-duration", &ms(t.lease), "--renew-deadline", &ms(t.renew)])
            .args(["--retry-period", &ms(t.retry), "--connect-timeout", "60s", "--"])
            .arg(&self.programs.command)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,kube_leader_cli=debug")
            .env_remove("POD_NAMESPACE")
            .env_remove("POD_NAME")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(self.log_dir.join(format!("{key}.log"))).expect("a log file"))
            .process_group(0);
        let mut child = spawn(command).expect("start kube-leader run --shards");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, label) = (self.tx.clone(), key.to_owned());
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    let _ = tx.send((label.clone(), v));
                }
            }
        });
        let pid = child.id() as i32;
        let replica = Replica {
            child,
            pid,
            status: None,
            killed_at: None,
            work: None,
            ended_at: None,
        };
        self.replicas.insert(key.to_owned(), replica);
    }

    /// Takes in what the COMMANDs said; ends the work of COMMANDs that died; notes exits.
    pub fn poll(&mut self) {
        while let Ok((key, v)) = self.rx.try_recv() {
            self.absorb(&key, &v);
        }
        let now = mono_ns();
        let dead: Vec<(String, u64)> = self
            .replicas
            .iter()
            .filter_map(|(k, r)| {
                let w = r.work.as_ref()?;
                (!process_alive(w.pid)).then(|| (k.clone(), r.killed_at.unwrap_or(now)))
            })
            .collect();
        for (key, at) in dead {
            self.end_work(&key, at);
        }
        for (key, r) in &mut self.replicas {
            if r.status.is_none() {
                if let Ok(Some(status)) = r.child.try_wait() {
                    r.status = Some(status);
                    self.exits.insert(key.clone(), format!("{status}"));
                }
            }
        }
    }

    fn absorb(&mut self, key: &str, v: &Value) {
        let at = v["mono_ns"].as_u64().unwrap_or_else(mono_ns);
        let pid = v["pid"].as_i64().map_or(0, |p| p as i32);
        match v["event"].as_str() {
            Some("command_started") => {
                // The previous COMMAND was gone before this one started.
                self.end_work(key, at);
                let shards: Vec<u32> = v["shards"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|s| s.as_u64().map(|s| s as u32)).collect())
                    .unwrap_or_default();
                for s in &shards {
                    let token = v["tokens"][s.to_string()].as_u64();
                    if let Some(h) = self.histories.get_mut(s) {
                        h.began_with_token(key, at, token);
                    }
                    if self.last_worker.get(s).is_some_and(|w| w != key) {
                        self.transitions += 1;
                    }
                    self.last_worker.insert(*s, key.to_owned());
                }
                if let Some(r) = self.replicas.get_mut(key) {
                    r.work = Some(Work { pid, shards });
                }
            }
            Some("command_stopped") => {
                let current = self
                    .replicas
                    .get(key)
                    .and_then(|r| r.work.as_ref())
                    .map(|w| w.pid);
                if current == Some(pid) {
                    self.end_work(key, at);
                }
            }
            _ => {}
        }
    }

    /// Replica `key`'s COMMAND stopped working its set at `at` (if it was working).
    fn end_work(&mut self, key: &str, at: u64) {
        let Some(r) = self.replicas.get_mut(key) else {
            return;
        };
        let Some(work) = r.work.take() else { return };
        r.ended_at = Some(at);
        for s in work.shards {
            if let Some(h) = self.histories.get_mut(&s) {
                h.ended(key, at);
            }
        }
    }

    /// The pid of replica `key`'s COMMAND, if one works now.
    pub fn command_pid(&self, key: &str) -> Option<i32> {
        self.replicas.get(key)?.work.as_ref().map(|w| w.pid)
    }

    /// When replica `key`'s last COMMAND stopped working, if one did.
    pub fn ended_at(&self, key: &str) -> Option<u64> {
        self.replicas.get(key)?.ended_at
    }

    /// The shards replica `key`'s COMMAND works now.
    pub fn worked_by(&self, key: &str) -> Vec<u32> {
        let work = self.replicas.get(key).and_then(|r| r.work.as_ref());
        work.map_or_else(Vec::new, |w| w.shards.clone())
    }

    /// The replicas whose COMMAND works shard `shard` now.
    pub fn workers(&self, shard: u32) -> Vec<&str> {
        self.replicas
            .iter()
            .filter(|(_, r)| r.work.as_ref().is_some_and(|w| w.shards.contains(&shard)))
            .map(|(k, _)| k.as_str())
            .collect()
    }

    /// kube-leader's pid (also its process group) of replica `key`.
    pub fn pid(&self, key: &str) -> i32 {
        self.replicas.get(key).expect("a known replica").pid
    }

    /// The process groups of replica `key`, in the order to freeze them: kube-leader's, its
    /// supervisor's (the parent of COMMAND) and COMMAND's.
    pub fn groups(&self, key: &str) -> Vec<Pid> {
        let mut g = vec![Pid::from_raw(self.pid(key))];
        if let Some(command) = self.command_pid(key) {
            let supervisor = parent_of(command);
            if supervisor > 1 && supervisor != self.pid(key) {
                g.push(Pid::from_raw(supervisor));
            }
            g.push(Pid::from_raw(command));
        }
        g
    }

    /// SIGKILL of the `kube-leader` process of replica `key` alone; returns when.
    pub fn kill_kube_leader(&mut self, key: &str) -> u64 {
        let at = mono_ns();
        let _ = kill(Pid::from_raw(self.pid(key)), Signal::SIGKILL);
        at
    }

    /// SIGKILL of every process of replica `key` (COMMAND first); its work ends now.
    pub fn kill_all(&mut self, key: &str) -> u64 {
        let mut groups = self.groups(key);
        groups.reverse();
        let at = mono_ns();
        for g in groups {
            let _ = killpg(g, Signal::SIGKILL);
        }
        if let Some(r) = self.replicas.get_mut(key) {
            r.killed_at = Some(at);
        }
        self.end_work(key, at);
        at
    }

    /// Sends `signal` to `kube-leader` of replica `key` (its own process group); returns when.
    pub fn signal_group(&mut self, key: &str, signal: Signal) -> u64 {
        let at = mono_ns();
        let _ = killpg(Pid::from_raw(self.pid(key)), signal);
        at
    }

    /// Replica `key` was frozen, all of it, during `span`: cut out of its work.
    pub fn frozen(&mut self, key: &str, span: Span) {
        for h in self.histories.values_mut() {
            h.frozen_span(key, span);
        }
    }

    /// Whether replica `key`'s kube-leader has exited.
    pub fn exited(&self, key: &str) -> bool {
        self.replicas.get(key).is_none_or(|r| r.status.is_some())
    }

    /// The exit code of replica `key`, if it exited with one.
    pub fn exit_code(&self, key: &str) -> Option<i32> {
        self.replicas.get(key)?.status?.code()
    }

    /// Keys of the replicas whose kube-leader runs.
    pub fn running(&self) -> Vec<String> {
        let live = self
            .replicas
            .iter()
            .filter(|(_, r)| r.status.is_none() && r.killed_at.is_none());
        live.map(|(k, _)| k.clone()).collect()
    }

    /// How many shards each running replica's COMMAND works now.
    pub fn counts(&self) -> BTreeMap<String, usize> {
        let running = self.running();
        running
            .into_iter()
            .map(|k| (k.clone(), self.worked_by(&k).len()))
            .collect()
    }

    /// Whether every shard is worked by exactly one COMMAND, of a running replica, and each
    /// running replica's COMMAND works `⌊M/N⌋` or `⌈M/N⌉` of them (within one of fair).
    pub fn balanced(&self) -> bool {
        let counts = self.counts();
        if counts.is_empty() {
            return false;
        }
        let fair = f64::from(self.count) / counts.len() as f64;
        let once = (0..self.count).all(|s| {
            let w = self.workers(s);
            w.len() == 1 && counts.contains_key(w[0])
        });
        once && counts.values().all(|c| (*c as f64 - fair).abs() < 1.0)
    }

    /// The work history of every shard.
    pub fn histories(&self) -> &BTreeMap<u32, History> {
        &self.histories
    }

    /// Polls every millisecond until `f` gives `Some`, for at most `timeout`.
    pub async fn until<T>(&mut self, timeout: Duration, mut f: impl FnMut(&Self) -> Option<T>) -> Option<T> {
        let end = tokio::time::Instant::now() + timeout;
        loop {
            self.poll();
            if let Some(v) = f(self) {
                return Some(v);
            }
            if tokio::time::Instant::now() > end {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Polls for `d`.
    pub async fn sleep(&mut self, d: Duration) {
        let end = tokio::time::Instant::now() + d;
        while tokio::time::Instant::now() < end {
            self.poll();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

impl Drop for SidecarFleet {
    fn drop(&mut self) {
        let keys: Vec<String> = self.replicas.keys().cloned().collect();
        for key in keys {
            for g in self.groups(&key) {
                let _ = killpg(g, Signal::SIGKILL);
            }
            if let Some(r) = self.replicas.get_mut(&key) {
                let _ = r.child.kill();
                let _ = r.child.wait();
            }
        }
    }
}

/// `(state, ppid)` of a process, from `/proc/<pid>/stat`.
fn proc_stat(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    let mut f = rest.split_whitespace();
    Some((f.next()?.chars().next()?, f.next()?.parse().ok()?))
}

/// Whether `pid` runs (a zombie does not).
fn process_alive(pid: i32) -> bool {
    proc_stat(pid).is_some_and(|(state, _)| state != 'Z')
}

/// The parent of `pid` (0 if unknown).
fn parent_of(pid: i32) -> i32 {
    proc_stat(pid).map_or(0, |(_, ppid)| ppid)
}
