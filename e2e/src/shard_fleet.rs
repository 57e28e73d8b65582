//! Shard candidate processes (`shard-candidate`) and what they report: one leadership
//! [`History`] per shard, on CLOCK_MONOTONIC, and how many shards each candidate holds.
//!
//! Each candidate runs as `setpriv --pdeathsig KILL -- shard-candidate ...` in a process group
//! of its own, spawned from one long-lived thread, so that it dies with the test binary however
//! that ends. A candidate killed by the harness stops acting on its shards at the kill (its open
//! terms end there); a frozen one is cut out of its terms while frozen.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{mpsc, Mutex, OnceLock},
    time::Duration,
};

use nix::{
    sys::signal::{killpg, Signal},
    unistd::Pid,
};
use serde_json::Value;

use crate::{checker::History, mono_ns};

/// Lease timings of a shard run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// Lease duration.
    pub lease: Duration,
    /// Renew deadline.
    pub renew: Duration,
    /// Retry period.
    pub retry: Duration,
}

/// One candidate process.
#[derive(Debug)]
struct Proc {
    child: Child,
    pid: i32,
    /// When the harness killed it (its terms end there).
    killed_at: Option<u64>,
    exited: bool,
}

/// The candidates of one shard set.
#[derive(Debug)]
pub struct ShardFleet {
    binary: PathBuf,
    namespace: String,
    name: String,
    count: u32,
    timings: Timings,
    log_dir: PathBuf,
    procs: BTreeMap<String, Proc>,
    tx: mpsc::Sender<(String, Option<Value>)>,
    rx: mpsc::Receiver<(String, Option<Value>)>,
    histories: BTreeMap<u32, History>,
    /// Holders of each shard now, as the events tell.
    holding: BTreeMap<u32, Vec<String>>,
    /// Errors the candidates reported.
    pub errors: Vec<String>,
    /// Shard transitions so far (a shard passing to another candidate).
    pub transitions: usize,
    last_holder: BTreeMap<u32, String>,
}

// === impl ShardFleet ===

impl ShardFleet {
    /// A fleet of `binary` (the `shard-candidate` program) candidates for the set `name` of
    /// `count` shards in `namespace`; logs go to `log_dir`.
    pub fn new(
        binary: &Path,
        namespace: &str,
        name: &str,
        count: u32,
        timings: Timings,
        log_dir: &Path,
    ) -> Self {
        let (tx, rx) = mpsc::channel();
        let _ = std::fs::create_dir_all(log_dir);
        Self {
            binary: binary.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            count,
            timings,
            log_dir: log_dir.to_owned(),
            procs: BTreeMap::new(),
            tx,
            rx,
            histories: (0..count).map(|i| (i, History::new())).collect(),
            holding: BTreeMap::new(),
            errors: Vec::new(),
            transitions: 0,
            last_holder: BTreeMap::new(),
        }
    }

    /// Starts candidate `key` (its identity), reaching the API server through `kubeconfig`.
    pub fn start(&mut self, key: &str, kubeconfig: &Path) {
        let ms = |d: Duration| d.as_millis().to_string();
        let mut command = Command::new("setpriv");
        command
            .args(["--pdeathsig", "KILL", "--"])
            .arg(&self.binary)
            .arg(kubeconfig)
            .args([&self.namespace, &self.name, &self.count.to_string(), key])
            .args([
                ms(self.timings.lease),
                ms(self.timings.renew),
                ms(self.timings.retry),
            ])
            .env("RUST_LOG", "kube_leader=debug")
            .env_remove("POD_NAMESPACE")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(self.log_dir.join(format!("{key}.log"))).expect("a log file"))
            .process_group(0);
        let mut child = spawn(command).expect("start a shard candidate");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, label) = (self.tx.clone(), key.to_owned());
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    let _ = tx.send((label.clone(), Some(v)));
                }
            }
            let _ = tx.send((label, None));
        });
        let pid = child.id() as i32;
        self.procs.insert(
            key.to_owned(),
            Proc {
                child,
                pid,
                killed_at: None,
                exited: false,
            },
        );
    }

    /// Sends `signal` to candidate `key`'s process group; returns when (CLOCK_MONOTONIC ns).
    pub fn signal(&mut self, key: &str, signal: Signal) -> u64 {
        let p = self.procs.get_mut(key).expect("a known candidate");
        let at = mono_ns();
        let _ = killpg(Pid::from_raw(p.pid), signal);
        if signal == Signal::SIGKILL {
            p.killed_at = Some(at);
        }
        at
    }

    /// The candidate `key` was frozen from `froze` to `thawed`: it could not act meanwhile.
    pub fn frozen(&mut self, key: &str, froze: u64, thawed: u64) {
        for h in self.histories.values_mut() {
            h.frozen_span(
                key,
                crate::checker::Span {
                    start: froze,
                    end: thawed,
                },
            );
        }
    }

    /// Takes in what the candidates said; ends the terms of candidates that died.
    pub fn poll(&mut self) {
        while let Ok((key, line)) = self.rx.try_recv() {
            match line {
                Some(v) => self.absorb(&key, &v),
                None => {
                    if let Some(p) = self.procs.get_mut(&key) {
                        p.exited = true;
                        let _ = p.child.wait();
                    }
                    let at = self
                        .procs
                        .get(&key)
                        .and_then(|p| p.killed_at)
                        .unwrap_or_else(mono_ns);
                    for (shard, holders) in &mut self.holding {
                        if let Some(pos) = holders.iter().position(|h| *h == key) {
                            holders.remove(pos);
                            if let Some(h) = self.histories.get_mut(shard) {
                                h.ended(&key, at);
                            }
                        }
                    }
                }
            }
        }
    }

    fn absorb(&mut self, key: &str, v: &Value) {
        let at = v["mono_ns"].as_u64().unwrap_or_else(mono_ns);
        let shard = v["shard"].as_u64().map(|s| s as u32);
        match (v["event"].as_str(), shard) {
            (Some("started_leading"), Some(s)) => {
                if let Some(h) = self.histories.get_mut(&s) {
                    h.began_with_token(key, at, v["fencing_token"].as_u64());
                }
                self.holding.entry(s).or_default().push(key.to_owned());
                if self.last_holder.get(&s).is_some_and(|h| h != key) {
                    self.transitions += 1;
                }
                self.last_holder.insert(s, key.to_owned());
            }
            (Some("stopped_leading"), Some(s)) => {
                let holders = self.holding.entry(s).or_default();
                if let Some(pos) = holders.iter().position(|h| h == key) {
                    holders.remove(pos);
                    if let Some(h) = self.histories.get_mut(&s) {
                        h.ended(key, at);
                    }
                }
            }
            (Some("error"), _) => self
                .errors
                .push(format!("{key}: {}", v["message"].as_str().unwrap_or("?"))),
            _ => {}
        }
    }

    /// How many shards each running candidate holds now (candidates holding none included).
    pub fn counts(&self) -> BTreeMap<String, usize> {
        let mut c: BTreeMap<String, usize> = self
            .procs
            .iter()
            .filter(|(_, p)| !p.exited && p.killed_at.is_none())
            .map(|(k, _)| (k.clone(), 0))
            .collect();
        for holders in self.holding.values() {
            for h in holders {
                if let Some(n) = c.get_mut(h) {
                    *n += 1;
                }
            }
        }
        c
    }

    /// Whether every shard has exactly one holder and each running candidate holds
    /// `⌊M/N⌋` or `⌈M/N⌉` of them (within one of fair).
    pub fn balanced(&self) -> bool {
        let counts = self.counts();
        if counts.is_empty() {
            return false;
        }
        let n = counts.len();
        let fair = self.count as f64 / n as f64;
        let single = (0..self.count).all(|s| self.holding.get(&s).is_some_and(|h| h.len() == 1));
        single && counts.values().all(|c| (*c as f64 - fair).abs() < 1.0)
    }

    /// The shards candidate `key` holds now, as the events tell.
    pub fn held_by(&self, key: &str) -> Vec<u32> {
        self.holding
            .iter()
            .filter(|(_, h)| h.iter().any(|k| k == key))
            .map(|(s, _)| *s)
            .collect()
    }

    /// The holders of shard `shard` now, as the events tell.
    pub fn holders(&self, shard: u32) -> &[String] {
        self.holding.get(&shard).map_or(&[], Vec::as_slice)
    }

    /// Mutable access to shard `shard`'s history (to record freezes).
    pub fn history_mut(&mut self, shard: u32) -> Option<&mut History> {
        self.histories.get_mut(&shard)
    }

    /// The leadership history of every shard.
    pub fn histories(&self) -> &BTreeMap<u32, History> {
        &self.histories
    }

    /// Whether candidate `key` has exited.
    pub fn exited(&self, key: &str) -> bool {
        self.procs.get(key).is_none_or(|p| p.exited)
    }

    /// Keys of the candidates still running.
    pub fn running(&self) -> Vec<String> {
        self.procs
            .iter()
            .filter(|(_, p)| !p.exited && p.killed_at.is_none())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Polls until `f` holds, for at most `timeout`; returns how long it took, or `None`.
    pub async fn until(&mut self, timeout: Duration, mut f: impl FnMut(&Self) -> bool) -> Option<Duration> {
        let start = tokio::time::Instant::now();
        loop {
            self.poll();
            if f(self) {
                return Some(start.elapsed());
            }
            if start.elapsed() > timeout {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for ShardFleet {
    fn drop(&mut self) {
        for p in self.procs.values_mut() {
            if !p.exited {
                let _ = killpg(Pid::from_raw(p.pid), Signal::SIGKILL);
                let _ = p.child.kill();
                let _ = p.child.wait();
            }
        }
    }
}

/// Spawns `command` from one long-lived thread (`PR_SET_PDEATHSIG` follows the thread that
/// forked).
pub fn spawn(command: Command) -> std::io::Result<Child> {
    type Request = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("shard-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("spawner thread");
        Mutex::new(tx)
    });
    let (reply, result) = mpsc::channel();
    spawner
        .lock()
        .map_err(|_| std::io::Error::other("spawner poisoned"))?
        .send((command, reply))
        .map_err(|_| std::io::Error::other("spawner gone"))?;
    result.recv().map_err(|_| std::io::Error::other("spawner gone"))?
}
