//! End-to-end tests of the `kube-leader` binary against a real local control plane.
//!
//! Each test spawns the real binary (`CARGO_BIN_EXE_kube-leader`) in a namespace of its own.
//! COMMAND is a small shell script that records its pid, environment and signals in files, so
//! the tests see exactly when it runs. Lease timings are short (2 s / 1 s / 200 ms) unless a
//! test needs to tell a release from an expiry; waits are generous (2-core shared machine) and
//! timing checks are sanity bounds only.

use std::{
    fs,
    io::{BufRead as _, Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{ConfigMap, Pod},
    rbac::v1::{RoleBinding, RoleRef, Subject},
};
use kube::{
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams},
    Api, Client,
};
use kube_leader_testenv::{create_pod, ControlPlane};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_kube-leader");
/// 2 s / 1 s / 200 ms.
const FAST: [&str; 6] = [
    "--lease-duration",
    "2s",
    "--renew-deadline",
    "1s",
    "--retry-period",
    "200ms",
];
const WAIT: Duration = Duration::from_secs(60);

// === helpers ===

mod support;

#[path = "cli/coordinated.rs"]
mod coordinated;
#[path = "cli/deleted_lock.rs"]
mod deleted_lock;
#[path = "cli/waiting.rs"]
mod waiting;

use support::wait_for;

fn scratch_dir(name: &str) -> PathBuf {
    support::scratch_dir("cli", name)
}

fn alive(pid: i32) -> bool {
    // A zombie is dead for our purposes.
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// `(state, ppid, pgid)` of a process, from `/proc/<pid>/stat`.
fn proc_stat(pid: i32) -> Option<(char, i32, i32)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    let pgid = f.next()?.parse().ok()?;
    Some((state, ppid, pgid))
}

/// The parent of `pid`.
fn parent_of(pid: i32) -> i32 {
    proc_stat(pid).map(|(_, ppid, _)| ppid).unwrap_or_default()
}

/// Zombies whose parent is one of `parents`.
fn zombies_of(parents: &[i32]) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Some(('Z', ppid, _)) = proc_stat(pid) {
            if parents.contains(&ppid) {
                found.push(pid);
            }
        }
    }
    found
}

/// Nanoseconds since the epoch, as `date +%s%N` prints them.
fn epoch_ns(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).unwrap().as_nanos()
}

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{sig} {pid}");
}

/// COMMAND: records its pid, environment and SIGTERM in `dir`, then works until stopped.
/// `on_term` is the shell run on SIGTERM.
fn work_script(dir: &Path, id: &str, on_term: &str) -> Vec<String> {
    let d = dir.display();
    vec![
        "sh".into(),
        "-c".into(),
        format!(
            "echo \"$KUBE_LEADER_IDENTITY $KUBE_LEADER_LOCK $KUBE_LEADER_FENCING_TOKEN\" > {d}/{id}.env; \
             echo $$ > {d}/{id}.pid.tmp && mv {d}/{id}.pid.tmp {d}/{id}.pid; \
             trap '{on_term}' TERM; while true; do sleep 0.05; done"
        ),
    ]
}

/// How to start a candidate, beyond its flags.
#[derive(Debug, Default, Clone, Copy)]
struct Opts {
    /// In a process group of its own (as a process manager starts it).
    own_group: bool,
    /// `RLIMIT_NOFILE` for kube-leader (a container's limit).
    nofile: Option<u32>,
}

/// A running `kube-leader run`.
struct Candidate {
    id: String,
    child: Child,
    dir: PathBuf,
    log: PathBuf,
    status: Option<ExitStatus>,
}

impl Candidate {
    /// `kube-leader run --lock <lock> --identity <id> <flags> -- <command>` as admin, logs in JSON.
    fn spawn(cp: &ControlPlane, dir: &Path, id: &str, flags: &[&str], command: &[String]) -> Self {
        Self::spawn_with(cp.kubeconfig_path(), dir, id, flags, command, &[])
    }

    fn spawn_with(
        kubeconfig: &Path,
        dir: &Path,
        id: &str,
        flags: &[&str],
        command: &[String],
        env: &[(&str, &str)],
    ) -> Self {
        Self::spawn_opts(kubeconfig, dir, id, flags, command, env, Opts::default())
    }

    fn spawn_opts(
        kubeconfig: &Path,
        dir: &Path,
        id: &str,
        flags: &[&str],
        command: &[String],
        env: &[(&str, &str)],
        opts: Opts,
    ) -> Self {
        let log = dir.join(format!("{id}.log"));
        let mut cmd = match opts.nofile {
            // `ulimit -n` in a shell that then becomes kube-leader (no unsafe pre_exec here).
            Some(n) => {
                let mut c = Command::new("sh");
                c.args(["-c", &format!("ulimit -n {n} && exec \"$0\" \"$@\""), BIN]);
                c
            }
            None => Command::new(BIN),
        };
        if opts.own_group {
            cmd.process_group(0);
        }
        cmd.args(["run", "--log-format", "json", "--identity", id])
            .args(flags)
            .arg("--")
            .args(command)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,kube_leader::supervisor=debug")
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap();
        Self {
            id: id.into(),
            child,
            dir: dir.to_path_buf(),
            log,
            status: None,
        }
    }

    /// `id` in a process group of its own (as a process manager starts it), its COMMAND the
    /// work script ending on SIGTERM.
    fn in_own_group(cp: &ControlPlane, dir: &Path, id: &str, flags: &[&str]) -> Self {
        let command = work_script(dir, id, "exit 0");
        let opts = Opts {
            own_group: true,
            ..Opts::default()
        };
        Self::spawn_opts(cp.kubeconfig_path(), dir, id, flags, &command, &[], opts)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// COMMAND's pid, once it has started.
    fn command_pid(&self) -> Option<i32> {
        fs::read_to_string(self.dir.join(format!("{}.pid", self.id)))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Whether COMMAND runs now.
    fn leading(&self) -> bool {
        self.command_pid().is_some_and(alive)
    }

    /// COMMAND's view: identity, lock, fencing token.
    fn command_env(&self) -> Option<(String, String, u64)> {
        let env = fs::read_to_string(self.dir.join(format!("{}.env", self.id))).ok()?;
        let mut w = env.split_whitespace();
        Some((w.next()?.into(), w.next()?.into(), w.next()?.parse().ok()?))
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().unwrap();
        }
        self.status
    }

    fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let id = self.id.clone();
        wait_for(&format!("{id} exits"), timeout, || self.exited())
    }

    fn logs(&self) -> Vec<Value> {
        fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The status server's address, from the log line announcing it.
    fn status_addr(&self) -> SocketAddr {
        wait_for(&format!("{} status server", self.id), WAIT, || {
            self.logs()
                .iter()
                .find(|l| l["message"] == "status server listening")
                .and_then(|l| l["addr"].as_str()?.parse().ok())
        })
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(self.pid().to_string())
                .status();
            let started = Instant::now();
            while self.exited().is_none() && started.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if let Some(pid) = self.command_pid() {
            if alive(pid) {
                let _ = Command::new("kill").arg("-KILL").arg(pid.to_string()).status();
            }
        }
    }
}

/// Waits until exactly one of `candidates` runs COMMAND; returns its index.
fn one_leader(candidates: &[&Candidate]) -> usize {
    wait_for("one leader", WAIT, || {
        let leading: Vec<usize> = candidates
            .iter()
            .enumerate()
            .filter(|(_, c)| c.leading())
            .map(|(i, _)| i)
            .collect();
        match leading.as_slice() {
            [one] => Some(*one),
            [] => None,
            many => panic!("several commands run at once: {many:?}"),
        }
    })
}

fn kube_leader(args: &[&str], kubeconfig: &Path) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("POD_NAMESPACE")
        .env_remove("POD_NAME")
        .output()
        .unwrap()
}

fn status_json(cp: &ControlPlane, ns: &str, lock: &str, strategy: &str) -> Value {
    let out = kube_leader(
        &[
            "status",
            "--lock",
            lock,
            "--namespace",
            ns,
            "--strategy",
            strategy,
            "-o",
            "json",
        ],
        cp.kubeconfig_path(),
    );
    assert!(
        out.status.success(),
        "status failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn lease_flags<'a>(lock: &'a str, ns: &'a str) -> Vec<&'a str> {
    let mut f = vec!["--strategy", "lease", "--lock", lock, "--namespace", ns];
    f.extend(FAST);
    f
}

/// A minimal HTTP/1.1 GET (or other method): status code and body.
fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.into()
    };
    (code, body)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

fn get_json(addr: SocketAddr, path: &str) -> Value {
    let (code, body) = http(addr, "GET", path);
    assert_eq!(code, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap()
}

// === tests that need no cluster ===

fn usage_error(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(args)
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{args:?}: {out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "{args:?}: not one line: {stderr}"
    );
    stderr
}

#[test]
fn bad_flags_give_one_line_naming_the_flag_and_exit_125() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["run", "--lock", "l", "--strategy", "raft", "--", "true"],
            "--strategy",
        ),
        (&["run", "--lock", "Not_A_Name", "--", "true"], "--lock"),
        (
            &["run", "--lock", "l", "--lease-duration", "fast", "--", "true"],
            "--lease-duration",
        ),
        (
            &["run", "--lock", "l", "--renew-deadline", "10", "--", "true"],
            "--renew-deadline",
        ),
        (&["run", "--lock", "l"], "COMMAND"),
        (&["run", "--lock", "l", "--bogus", "--", "true"], "--bogus"),
        (
            &[
                "run",
                "--lock",
                "l",
                "--strategy",
                "lease",
                "--lease-duration",
                "1s",
                "--",
                "true",
            ],
            "--renew-deadline",
        ),
        (
            &["run", "--lock", "l", "--status-addr", "localhost", "--", "true"],
            "--status-addr",
        ),
        (&["status", "--lock", "l", "-o", "yaml"], "--output"),
        (&["rbac", "--lock", "l", "--strategy", "etcd"], "--strategy"),
        (
            &["run", "--lock", "l", "--dead-leader-pod", "never", "--", "true"],
            "--dead-leader-pod",
        ),
        (
            &[
                "run",
                "--lock",
                "l",
                "--strategy",
                "lease",
                "--dead-leader-pod",
                "keep",
                "--",
                "true",
            ],
            "--dead-leader-pod",
        ),
        (
            &[
                "rbac",
                "--lock",
                "l",
                "--strategy",
                "lease",
                "--dead-leader-pod",
                "keep",
            ],
            "--dead-leader-pod",
        ),
    ];
    for (args, flag) in cases {
        let line = usage_error(args);
        assert!(line.contains(flag), "{args:?}: {line} should name {flag}");
        assert!(line.starts_with("kube-leader: error: "), "{line}");
    }
}

/// `--dead-leader-pod keep`: the Role `kube-leader rbac` prints for it deletes no Pod.
#[test]
fn rbac_for_dead_leader_pod_keep_grants_no_delete_pods() {
    let rbac = |extra: &[&str]| {
        let out = Command::new(BIN)
            .args(["rbac", "--lock", "l", "--namespace", "ns"])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let pods = "resources: [\"pods\"]\n    verbs: [\"get\", \"list\", \"watch\"";
    let keep = rbac(&["--dead-leader-pod", "keep"]);
    assert!(keep.contains(&format!("{pods}]")), "{keep}");
    assert!(keep.contains("--dead-leader-pod keep"), "{keep}");
    let default = rbac(&[]);
    assert!(default.contains(&format!("{pods}, \"delete\"]")), "{default}");
}

/// `kube-leader install DIR`: the copy runs; a DIR that is not there is named, exit 125.
#[test]
fn install_copies_the_binary_and_names_a_missing_dir() {
    let dir = scratch_dir("install");
    let out = Command::new(BIN).arg("install").arg(&dir).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let copy = Command::new(dir.join("kube-leader")).arg("-V").output().unwrap();
    assert!(copy.status.success(), "{copy:?}");
    let original = Command::new(BIN).arg("-V").output().unwrap();
    assert_eq!(copy.stdout, original.stdout);
    let missing = dir.join("no-such-dir");
    let out = Command::new(BIN).arg("install").arg(&missing).output().unwrap();
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("does not exist") && stderr.contains("no-such-dir"),
        "{stderr}"
    );
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn help_and_version() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for s in [
        "run",
        "status",
        "rbac",
        "Exit codes:",
        "leadership was lost",
        "--log-format",
    ] {
        assert!(help.contains(s), "--help lacks {s}:\n{help}");
    }
    assert!(!help.contains("__supervise"), "{help}");
    let out = Command::new(BIN).args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for s in [
        "--lock",
        "--namespace",
        "--strategy",
        "--identity",
        "--lease-duration",
        "--renew-deadline",
        "--retry-period",
        "--status-addr",
        "--on-outside-cluster",
        "--grace",
        "--label-pod",
        "--ready-only-when-leader",
        "Exit codes:",
    ] {
        assert!(help.contains(s), "run --help lacks {s}:\n{help}");
    }
    // `-V`: one line with the commit; `--version` also names the Kubernetes versions
    // (tests/conventions.rs checks the rest).
    let out = Command::new(BIN).arg("-V").output().unwrap();
    let short = String::from_utf8(out.stdout).unwrap();
    assert!(
        short.starts_with(&format!("kube-leader {} (commit ", env!("CARGO_PKG_VERSION"))),
        "{short}"
    );
}

#[test]
fn unreachable_cluster_exits_123() {
    let dir = scratch_dir("unreachable");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let kubeconfig = dir.join("kubeconfig");
    fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: 'https://127.0.0.1:{port}'}}\n\
             users:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n"
        ),
    )
    .unwrap();
    let started = Instant::now();
    let out = kube_leader(
        &[
            "run",
            "--lock",
            "l",
            "--strategy",
            "lease",
            "--connect-timeout",
            "1s",
            "--",
            "true",
        ],
        &kubeconfig,
    );
    assert_eq!(out.status.code(), Some(123), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot reach the API server"),
        "{out:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    let out = kube_leader(
        &["status", "--lock", "l", "--connect-timeout", "500ms"],
        &kubeconfig,
    );
    assert_eq!(out.status.code(), Some(123), "{out:?}");
    let _ = fs::remove_dir_all(dir);
}

// === the Lease strategy ===

#[tokio::test(flavor = "multi_thread")]
async fn child_runs_only_while_leading_and_a_crashed_leaders_child_is_stopped() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let dir = scratch_dir("only-leader");
    let flags = lease_flags("only", ns.name());
    let cands: Vec<Candidate> = ["a", "b", "c"]
        .iter()
        .map(|id| Candidate::spawn(cp, &dir, id, &flags, &work_script(&dir, id, "exit 0")))
        .collect();
    let refs: Vec<&Candidate> = cands.iter().collect();
    let first = one_leader(&refs);
    let (id, lock, token) = cands[first].command_env().unwrap();
    assert_eq!((id.as_str(), lock.as_str()), (cands[first].id.as_str(), "only"));
    // A Lease holder stores its token with its first renewal (a retry period after it leads).
    let status = wait_for("the token in the status", WAIT, || {
        let s = status_json(cp, ns.name(), "only", "lease");
        (s["fencing_token"] == token).then_some(s)
    });
    assert_eq!(status["holder"], cands[first].id.as_str());
    // The followers run nothing, for a while.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(one_leader(&refs), first);

    // Crash the leader's kube-leader: its supervisor stops COMMAND, and another takes over.
    let old_command = cands[first].command_pid().unwrap();
    signal(cands[first].pid(), "KILL");
    wait_for("the crashed leader's COMMAND stops", WAIT, || {
        (!alive(old_command)).then_some(())
    });
    let rest: Vec<&Candidate> = cands
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != first)
        .map(|(_, c)| c)
        .collect();
    let second = one_leader(&rest);
    let (_, _, token2) = rest[second].command_env().unwrap();
    assert!(token2 > token, "fencing token {token2} after {token}");
    assert!(rest[second].log_text().contains("became leader"));
    let _ = fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn exit_code_is_the_childs_and_the_lease_is_released() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let dir = scratch_dir("exit-code");
    let flags = lease_flags("exit", ns.name());
    let mut c = Candidate::spawn(
        cp,
        &dir,
        "a",
        &flags,
        &["sh".into(), "-c".into(), "sleep 0.5; exit 42".into()],
    );
    assert_eq!(c.wait_exit(WAIT).code(), Some(42), "{}", c.log_text());
    let status = status_json(cp, ns.name(), "exit", "lease");
    assert_eq!(status["holder"], Value::Null, "released: {status}");
    assert!(c.log_text().contains("released the lock"), "{}", c.log_text());

    // A child killed by a signal: 128 + N, as a shell reports it.
    let mut c = Candidate::spawn(
        cp,
        &dir,
        "b",
        &flags,
        &["sh".into(), "-c".into(), "kill -KILL $$".into()],
    );
    assert_eq!(c.wait_exit(WAIT).code(), Some(137), "{}", c.log_text());
    // COMMAND not found: 127.
    let mut c = Candidate::spawn(cp, &dir, "c", &flags, &["/nonexistent/program".into()]);
    assert_eq!(c.wait_exit(WAIT).code(), Some(127), "{}", c.log_text());
    let _ = fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_is_forwarded_then_the_lease_is_released_and_taken_over_at_once() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let dir = scratch_dir("sigterm");
    // A long lease: a takeover well within it can only come from a release.
    let flags = [
        "--strategy",
        "lease",
        "--lock",
        "term",
        "--namespace",
        ns.name(),
        "--lease-duration",
        "20s",
        "--renew-deadline",
        "10s",
        "--retry-period",
        "1s",
    ];
    let d = dir.display();
    let mut a = Candidate::spawn(
        cp,
        &dir,
        "a",
        &flags,
        &work_script(&dir, "a", &format!("echo term > {d}/a.term; exit 7")),
    );
    wait_for("a leads", WAIT, || a.leading().then_some(()));
    let b = Candidate::spawn(cp, &dir, "b", &flags, &work_script(&dir, "b", "exit 0"));
    wait_for("b follows", WAIT, || {
        b.log_text().contains("leader is a").then_some(())
    });

    let term = Instant::now();
    signal(a.pid(), "TERM");
    wait_for("b takes over", WAIT, || b.leading().then_some(()));
    let handover = term.elapsed();
    let code = a.wait_exit(WAIT);
    assert_eq!(
        code.code(),
        Some(7),
        "kube-leader exits with COMMAND's code: {}",
        a.log_text()
    );
    assert_eq!(
        fs::read_to_string(dir.join("a.term")).unwrap().trim(),
        "term",
        "SIGTERM reached COMMAND"
    );
    eprintln!("from SIGTERM to the next leader's COMMAND: {handover:?} (lease duration 20s)");
    assert!(
        handover < Duration::from_secs(10),
        "took {handover:?}: not a release"
    );
    let _ = fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn lost_leadership_stops_the_child_within_the_grace_and_exits_124() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let dir = scratch_dir("lost");
    let flags = [&lease_flags("lost", ns.name())[..], &["--grace", "1s"]].concat();
    // COMMAND ignores SIGTERM: only SIGKILL after the grace stops it.
    let mut a = Candidate::spawn(cp, &dir, "a", &flags, &work_script(&dir, "a", ""));
    wait_for("a leads", WAIT, || a.leading().then_some(()));
    let command = a.command_pid().unwrap();

    // An administrator hands the Lease to somebody else.
    let leases: Api<Lease> = Api::namespaced(client, ns.name());
    let patch = serde_json::json!({"spec": {"holderIdentity": "intruder", "leaseDurationSeconds": 3600}});
    leases
        .patch("lost", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let lost = Instant::now();
    let code = a.wait_exit(WAIT);
    let stopped = lost.elapsed();
    assert_eq!(code.code(), Some(124), "{}", a.log_text());
    assert!(!alive(command), "COMMAND still runs");
    eprintln!("COMMAND (ignoring SIGTERM) stopped {stopped:?} after the loss, grace 1s");
    assert!(
        stopped >= Duration::from_millis(900),
        "SIGKILL before the grace: {stopped:?}"
    );
    assert!(a.log_text().contains("lost leadership"), "{}", a.log_text());
    assert!(
        a.log_text().contains("did not stop within the grace period"),
        "{}",
        a.log_text()
    );
    let _ = fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_kube_leader_has_its_child_stopped_by_the_supervisor() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let dir = scratch_dir("frozen");
    let flags = [&lease_flags("frozen", ns.name())[..], &["--grace", "1s"]].concat();
    let d = dir.display();
    let mut a = Candidate::spawn(
        cp,
        &dir,
        "a",
        &flags,
        &work_script(&dir, "a", &format!("date +%s%N > {d}/a.term; exit 0")),
    );
    wait_for("a leads", WAIT, || a.leading().then_some(()));
    let command = a.command_pid().unwrap();
    // Let a few renewals pass.
    std::thread::sleep(Duration::from_millis(600));

    // Freeze kube-leader only (not its supervisor, not COMMAND).
    let frozen = Instant::now();
    signal(a.pid(), "STOP");
    wait_for("COMMAND stops", Duration::from_secs(30), || {
        (!alive(command)).then_some(())
    });
    let delay = frozen.elapsed();
    eprintln!("COMMAND stopped {delay:?} after kube-leader was frozen (renew deadline 1s)");
    signal(a.pid(), "CONT");
    assert_eq!(a.wait_exit(WAIT).code(), Some(124), "{}", a.log_text());
    assert!(dir.join("a.term").exists(), "COMMAND got SIGTERM first");
    // Sanity: about the renew deadline, well before lease duration + grace (3 s) for sure.
    assert!(delay < Duration::from_secs(3), "{delay:?}");
    assert!(
        a.log_text().contains("has not confirmed leadership in time"),
        "{}",
        a.log_text()
    );
    let _ = fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn status_reports_holder_token_and_expiry() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let dir = scratch_dir("status");
    let none = status_json(cp, ns.name(), "st", "lease");
    assert_eq!(none["exists"], false);
    assert_eq!(none["holder"], Value::Null);

    let flags = lease_flags("st", ns.name());
    let a = Candidate::spawn(cp, &dir, "a", &flags, &work_script(&dir, "a", "exit 0"));
    wait_for("a leads", WAIT, || a.leading().then_some(()));
    let token = a.command_env().unwrap().2;
    let s = wait_for("the token in the status", WAIT, || {
        let s = status_json(cp, ns.name(), "st", "lease");
        (s["fencing_token"] == token).then_some(s)
    });
    assert_eq!(s["exists"], true);
    assert_eq!(s["holder"], "a");
    assert_eq!(s["strategy"], "lease");
    assert_eq!(s["namespace"], ns.name());
    assert_eq!(s["lease_duration_seconds"], 2);
    for key in ["since", "renewed_at", "expires_at"] {
        assert!(s[key].is_string(), "{key} in {s}");
    }
    let text = kube_leader(
        &["status", "--lock", "st", "-n", ns.name(), "--strategy", "lease"],
        cp.kubeconfig_path(),
    );
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("holder:") && text.contains(" a\n") && text.contains("expires:"),
        "{text}"
    );
    let _ = fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn status_server_endpoints_and_an_event_on_failover() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let dir = scratch_dir("server");
    let flags = [
        &lease_flags("srv", ns.name())[..],
        &["--status-addr", "127.0.0.1:0"],
    ]
    .concat();
    let a = Candidate::spawn(cp, &dir, "a", &flags, &work_script(&dir, "a", "exit 0"));
    wait_for("a leads", WAIT, || a.leading().then_some(()));
    let b = Candidate::spawn(cp, &dir, "b", &flags, &work_script(&dir, "b", "exit 0"));
    let strict = [&flags[..], &["--ready-only-when-leader"]].concat();
    let c = Candidate::spawn(cp, &dir, "c", &strict, &work_script(&dir, "c", "exit 0"));
    let (a_addr, b_addr, c_addr) = (a.status_addr(), b.status_addr(), c.status_addr());
    assert!(a_addr.ip().is_loopback());

    // GET / : the old leader-elector's answer, from the leader and from a follower.
    wait_for("b sees a", WAIT, || {
        (get_json(b_addr, "/")["name"] == "a").then_some(())
    });
    // leader-elector's `name` and nais/elector's `last_update` (RFC 3339, to the second).
    let root = get_json(a_addr, "/");
    assert_eq!(root["name"], "a", "{root}");
    let last_update = root["last_update"].as_str().unwrap_or_default();
    assert!(last_update.len() == 20 && last_update.ends_with('Z'), "{root}");
    assert_eq!(root.as_object().map(|o| o.len()), Some(2), "{root}");
    let leader = get_json(a_addr, "/leader");
    assert_eq!(leader["holder"], "a");
    assert_eq!(leader["is_leader"], true);
    assert_eq!(leader["strategy"], "lease");
    assert_eq!(leader["lock"], "srv");
    assert!(
        leader["since"].is_string() && leader["fencing_token"].is_u64(),
        "{leader}"
    );
    assert_eq!(get_json(b_addr, "/leader")["is_leader"], false);
    assert_eq!(http(a_addr, "GET", "/healthz").0, 200);
    assert_eq!(http(b_addr, "GET", "/healthz").0, 200);
    // Ready once the result is known, leader or not; unless only the leader is to be ready.
    assert_eq!(http(a_addr, "GET", "/readyz").0, 200);
    assert_eq!(http(b_addr, "GET", "/readyz").0, 200);
    wait_for("c sees a", WAIT, || {
        (get_json(c_addr, "/")["name"] == "a").then_some(())
    });
    assert_eq!(http(c_addr, "GET", "/readyz").0, 503);
    // Read-only.
    assert_eq!(http(a_addr, "POST", "/leader").0, 405);
    assert_eq!(http(a_addr, "DELETE", "/").0, 405);
    assert_eq!(http(a_addr, "GET", "/nope").0, 404);
    // Metrics.
    let (code, metrics) = http(a_addr, "GET", "/metrics");
    assert_eq!(code, 200);
    for name in [
        "kube_leader_is_leader",
        "kube_leader_transitions_total",
        "kube_leader_acquire_duration_seconds",
        "kube_leader_renew_duration_seconds",
        "kube_leader_renew_failures_total",
    ] {
        assert!(metrics.contains(name), "{name} missing:\n{metrics}");
    }
    let labels = format!(r#"lock_namespace="{}",lock="srv",strategy="lease""#, ns.name());
    assert!(
        metrics.contains(&format!("kube_leader_is_leader{{{labels}}} 1")),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"leader_election_master_status{name="srv"} 1"#),
        "{metrics}"
    );
    assert!(metrics.contains("kube_leader_build_info{"), "{metrics}");
    wait_for("a renewal is measured", WAIT, || {
        http(a_addr, "GET", "/metrics")
            .1
            .contains(&format!("kube_leader_renew_duration_seconds_count{{{labels}}} "))
            .then_some(())
    });
    let (_, bm) = http(b_addr, "GET", "/metrics");
    assert!(
        bm.contains(&format!("kube_leader_is_leader{{{labels}}} 0")),
        "{bm}"
    );
    assert!(
        bm.contains(r#"leader_election_master_status{name="srv"} 0"#),
        "{bm}"
    );

    // Events: the current state first, then one per change.
    let mut events = TcpStream::connect(b_addr).unwrap();
    events.set_read_timeout(Some(WAIT)).unwrap();
    write!(events, "GET /events HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut reader = std::io::BufReader::new(events);
    let mut next_event = || -> Value {
        loop {
            let mut line = String::new();
            assert!(reader.read_line(&mut line).unwrap() > 0, "event stream closed");
            if let Some(data) = line.trim_end().strip_prefix("data: ") {
                return serde_json::from_str(data).unwrap();
            }
        }
    };
    let first = next_event();
    assert_eq!(
        (first["holder"].as_str(), first["is_leader"].as_bool()),
        (Some("a"), Some(false)),
        "{first}"
    );
    signal(a.pid(), "TERM");
    let takeover = wait_for("an event naming a new leader", WAIT, || {
        let e = next_event();
        (e["holder"] != "a" && e["holder"].is_string()).then_some(e)
    });
    eprintln!("event after failover: {takeover}");
    let _ = fs::remove_dir_all(dir);
}

// === RBAC and manifests ===

/// `kubectl <args>` with stdin; panics on failure; returns stdout.
fn kubectl(cp: &ControlPlane, args: &[&str], stdin: &str) -> String {
    cp.kubectl_with_stdin(args, stdin)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn rbac(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .arg("rbac")
        .args(args)
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// Binds Role `role` in `ns` to `user`.
async fn bind(client: &Client, ns: &str, role: &str, user: &str) {
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some(format!("{role}-{user}")),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: role.into(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "User".into(),
            name: user.into(),
            namespace: None,
        }]),
    };
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

/// The user that a test of RBAC uses (the brief reserves user-21 .. user-30 for these tests).
fn user(n: usize) -> String {
    format!("user-{}", 20 + n)
}

#[tokio::test(flavor = "multi_thread")]
async fn rbac_lease_role_is_accepted_and_sufficient_for_a_restricted_user() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let dir = scratch_dir("rbac-lease");
    let yaml = rbac(&[
        "--strategy",
        "lease",
        "--lock",
        "guarded",
        "--namespace",
        ns.name(),
        "--label-pod",
    ]);
    kubectl(cp, &["apply", "-f", "-"], &yaml);
    let user = user(1);
    bind(&client, ns.name(), "kube-leader-lease-guarded", &user).await;
    create_pod(&client, ns.name(), "guarded-pod").await.unwrap();
    let kubeconfig = cp.user_kubeconfig_path(&user).unwrap();
    let flags = [&lease_flags("guarded", ns.name())[..], &["--label-pod"]].concat();
    let a = Candidate::spawn_with(
        kubeconfig,
        &dir,
        "a",
        &flags,
        &work_script(&dir, "a", "exit 0"),
        &[("POD_NAME", "guarded-pod")],
    );
    wait_for("a leads with only the printed Role", WAIT, || {
        a.leading().then_some(())
    });
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    wait_for("the leader's Pod is labelled", WAIT, || {
        let pod = futures_block(pods.get("guarded-pod"));
        (pod.metadata
            .labels
            .unwrap_or_default()
            .get("kube-leader.io/leader")
            .map(String::as_str)
            == Some("true"))
        .then_some(())
    });
    // Renewals go on: still leading after several lease durations.
    std::thread::sleep(Duration::from_secs(3));
    assert!(a.leading(), "{}", a.log_text());
    assert!(!a.log_text().contains("missing permission"), "{}", a.log_text());
    let out = kube_leader(
        &[
            "status",
            "--lock",
            "guarded",
            "-n",
            ns.name(),
            "--strategy",
            "lease",
            "-o",
            "json",
        ],
        kubeconfig,
    );
    assert!(out.status.success(), "{out:?}");

    // Without the Role, the error names the permission and the exit code is 123.
    let other = self::user(2);
    let mut b = Candidate::spawn_with(
        cp.user_kubeconfig_path(&other).unwrap(),
        &dir,
        "b",
        &lease_flags("guarded", ns.name()),
        &work_script(&dir, "b", "exit 0"),
        &[],
    );
    assert_eq!(b.wait_exit(WAIT).code(), Some(123), "{}", b.log_text());
    assert!(b.log_text().contains("missing permission"), "{}", b.log_text());
    let _ = fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn rbac_for_life_role_is_accepted_and_sufficient_for_a_restricted_user() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let dir = scratch_dir("rbac-for-life");
    let yaml = rbac(&[
        "--strategy",
        "for-life",
        "--lock",
        "fl",
        "--namespace",
        ns.name(),
        "--label-pod",
    ]);
    kubectl(cp, &["apply", "-f", "-"], &yaml);
    let (u1, u2) = (user(3), user(4));
    for u in [&u1, &u2] {
        bind(&client, ns.name(), "kube-leader-for-life-fl", u).await;
    }
    create_pod(&client, ns.name(), "p1").await.unwrap();
    create_pod(&client, ns.name(), "p2").await.unwrap();
    let flags = [
        "--lock",
        "fl",
        "--namespace",
        ns.name(),
        "--label-pod",
        "--grace",
        "2s",
    ];
    let spawn = |u: &str, pod: &str| {
        Candidate::spawn_with(
            cp.user_kubeconfig_path(u).unwrap(),
            &dir,
            pod,
            &flags,
            &work_script(&dir, pod, "exit 0"),
            &[("POD_NAME", pod)],
        )
    };
    let mut p1 = spawn(&u1, "p1");
    wait_for("p1 leads", WAIT, || p1.leading().then_some(()));
    let p2 = spawn(&u2, "p2");
    wait_for("p2 follows", WAIT, || {
        p2.log_text().contains("leader is p1").then_some(())
    });
    assert!(!p2.leading());
    let s = status_json(cp, ns.name(), "fl", "for-life");
    assert_eq!(s["holder"], "p1");
    assert_eq!(s["strategy"], "for-life");

    // The leader's Pod is deleted: its lock goes with it, p1 loses (exit 124), p2 takes over.
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    pods.delete("p1", &DeleteParams::default()).await.unwrap();
    wait_for("p2 takes over", WAIT, || p2.leading().then_some(()));
    assert_eq!(p1.wait_exit(WAIT).code(), Some(124), "{}", p1.log_text());
    let label = wait_for("p2 is labelled", WAIT, || {
        let pod = futures_block(pods.get("p2"));
        pod.metadata
            .labels
            .unwrap_or_default()
            .get("kube-leader.io/leader")
            .cloned()
            .filter(|v| v == "true")
    });
    assert_eq!(label, "true");
    let cms: Api<ConfigMap> = Api::namespaced(client, ns.name());
    let lock = cms.get("fl").await.unwrap();
    assert_eq!(lock.metadata.owner_references.unwrap()[0].name, "p2");
    let _ = fs::remove_dir_all(dir);
}

/// Runs a future to completion from synchronous test code inside a multi-thread runtime.
fn futures_block<T>(f: impl std::future::Future<Output = kube::Result<T>>) -> T {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f)).unwrap()
}

// === leader for life outside a cluster ===

/// Item 10 of issue 16: the sidecar fails closed outside a cluster (running COMMAND in every
/// replica is what `--on-outside-cluster skip` asks for, loudly).
#[tokio::test(flavor = "multi_thread")]
async fn for_life_outside_a_cluster_fails_by_default_and_skips_loudly_when_told() {
    let cp = ControlPlane::shared();
    let dir = scratch_dir("outside");
    // No --namespace, no POD_NAMESPACE, no service-account file: not in a cluster.
    assert!(!Path::new(kube_leader::internal::discovery::SERVICE_ACCOUNT_NAMESPACE_FILE).exists());
    let mut fail = Candidate::spawn(cp, &dir, "f", &["--lock", "outside"], &["true".into()]);
    assert_eq!(fail.wait_exit(WAIT).code(), Some(125), "{}", fail.log_text());
    assert!(fail.log_text().contains("no namespace"), "{}", fail.log_text());

    let mut skip = Candidate::spawn(
        cp,
        &dir,
        "s",
        &["--lock", "outside", "--on-outside-cluster", "skip"],
        &[
            "sh".into(),
            "-c".into(),
            format!(
                "echo $KUBE_LEADER_FENCING_TOKEN > {}/s.token; exit 5",
                dir.display()
            ),
        ],
    );
    assert_eq!(skip.wait_exit(WAIT).code(), Some(5), "{}", skip.log_text());
    assert_eq!(fs::read_to_string(dir.join("s.token")).unwrap().trim(), "0");
    let warning = skip
        .logs()
        .into_iter()
        .find(|l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.contains("running COMMAND in every replica"))
        })
        .unwrap_or_else(|| panic!("no warning: {}", skip.log_text()));
    assert_eq!(warning["level"], "WARN", "{warning}");
    let _ = fs::remove_dir_all(dir);
}

// === safety under faults (issue 16) ===

/// Lease flags with wide margins: 6 s / 4 s / 500 ms.
fn wide_lease_flags<'a>(lock: &'a str, ns: &'a str) -> Vec<&'a str> {
    vec![
        "--strategy",
        "lease",
        "--lock",
        lock,
        "--namespace",
        ns,
        "--lease-duration",
        "6s",
        "--renew-deadline",
        "4s",
        "--retry-period",
        "500ms",
    ]
}

/// The time COMMAND recorded in `<dir>/<file>` (`date +%s%N`), once it did.
fn recorded_ns(dir: &Path, file: &str, timeout: Duration) -> u128 {
    wait_for(&format!("{file} recorded"), timeout, || {
        fs::read_to_string(dir.join(file)).ok()?.trim().parse().ok()
    })
}

/// Item 2: heartbeats carry absolute deadlines. The supervisor is frozen while kube-leader
/// renews and writes heartbeats it does not read; then kube-leader is frozen and the supervisor
/// resumed before its own deadline passed. It reads heartbeats written long ago: they must not
/// confirm leadership past the renew deadline counted from the last renewal's send time (the
/// old relative `beat <ms>` counted it from the read, 2.5 s too late here).
#[tokio::test(flavor = "multi_thread")]
async fn a_heartbeat_read_late_does_not_extend_commands_validity() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let dir = scratch_dir("late-beat");
    let flags = wide_lease_flags("late", ns.name());
    let d = dir.display();
    let mut a = Candidate::spawn(
        cp,
        &dir,
        "a",
        &flags,
        &work_script(&dir, "a", &format!("date +%s%N > {d}/a.term; exit 0")),
    );
    wait_for("a leads", WAIT, || a.leading().then_some(()));
    let command = a.command_pid().unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let supervisor = parent_of(command);
    assert!(
        supervisor > 1 && supervisor != a.pid() as i32,
        "COMMAND's parent is the supervisor"
    );

    signal(supervisor as u32, "STOP");
    let t0 = Instant::now();
    // kube-leader renews (every 500 ms) and writes heartbeats into the socket meanwhile.
    std::thread::sleep(Duration::from_millis(700));
    let frozen = SystemTime::now();
    signal(a.pid(), "STOP");
    // The supervisor's own deadline, from the last heartbeat it read before t0, is at least
    // 4 s − 500 ms after t0: resume it before that.
    std::thread::sleep(Duration::from_millis(2500).saturating_sub(t0.elapsed()));
    signal(supervisor as u32, "CONT");
    let term = recorded_ns(&dir, "a.term", Duration::from_secs(30));
    let after = Duration::from_nanos(u64::try_from(term - epoch_ns(frozen)).unwrap());
    signal(a.pid(), "CONT");
    assert_eq!(a.wait_exit(WAIT).code(), Some(124), "{}", a.log_text());
    eprintln!(
        "COMMAND got SIGTERM {after:?} after kube-leader was frozen (renew deadline 4s, heartbeats read 1.8 s late)"
    );
    assert!(
        after < Duration::from_millis(4600),
        "COMMAND ran {after:?} past kube-leader's last renewal: a late heartbeat extended it (renew deadline 4s)"
    );
    let _ = fs::remove_dir_all(dir);
}

/// Item 3: the supervisor killed → COMMAND dies with it at once, kube-leader exits 3 and does
/// not release the Lease (COMMAND's end is not known to be orderly).
#[tokio::test(flavor = "multi_thread")]
async fn killing_the_supervisor_kills_command_exits_124_and_keeps_the_lease() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let dir = scratch_dir("kill-sup");
    let flags = wide_lease_flags("killsup", ns.name());
    let mut a = Candidate::spawn(cp, &dir, "a", &flags, &work_script(&dir, "a", "exit 0"));
    wait_for("a leads", WAIT, || a.leading().then_some(()));
    let command = a.command_pid().unwrap();
    let supervisor = parent_of(command);
    assert!(supervisor > 1 && supervisor != a.pid() as i32);

    let killed = Instant::now();
    signal(supervisor as u32, "KILL");
    wait_for(
        "COMMAND dies with its supervisor",
        Duration::from_secs(10),
        || (!alive(command)).then_some(()),
    );
    let died = killed.elapsed();
    let code = a.wait_exit(WAIT);
    eprintln!("COMMAND died {died:?} after its supervisor was killed");
    assert_eq!(code.code(), Some(124), "a loss: {}", a.log_text());
    let status = status_json(cp, ns.name(), "killsup", "lease");
    assert_eq!(
        status["holder"], "a",
        "not released (COMMAND's end was not orderly): {status}"
    );
    assert!(!a.log_text().contains("released the lock"), "{}", a.log_text());
    let _ = fs::remove_dir_all(dir);
}

/// Item 3: `kill -9 -PGID` of kube-leader's process group (as a process manager stops a
/// service) must not leave COMMAND running, re-parented to init. (The supervisor has a group of
/// its own: it sees kube-leader gone and stops COMMAND.)
#[tokio::test(flavor = "multi_thread")]
async fn killing_kube_leaders_process_group_kills_command() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let dir = scratch_dir("kill-group");
    let flags = lease_flags("killgroup", ns.name());
    let a = Candidate::in_own_group(cp, &dir, "a", &flags);
    wait_for("a leads", WAIT, || a.leading().then_some(()));
    let command = a.command_pid().unwrap();
    let killed = Instant::now();
    let status = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", a.pid())])
        .status()
        .unwrap();
    assert!(status.success());
    wait_for(
        "COMMAND dies with kube-leader's process group",
        Duration::from_secs(10),
        || (!alive(command)).then_some(()),
    );
    eprintln!(
        "COMMAND died {:?} after kube-leader's process group was killed",
        killed.elapsed()
    );
    let _ = fs::remove_dir_all(dir);
}

/// Item 3 (and issue 12's "reaps orphans"): kube-leader and its supervisor are child
/// subreapers: a process COMMAND leaves behind (double fork) is adopted by them, not by init,
/// and reaped when it exits (no zombie).
#[tokio::test(flavor = "multi_thread")]
async fn orphans_of_command_are_adopted_and_reaped() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let dir = scratch_dir("orphans");
    let flags = lease_flags("orphans", ns.name());
    let d = dir.display();
    let script = vec![
        "sh".to_string(),
        "-c".into(),
        format!(
            "echo $$ > {d}/a.pid.tmp && mv {d}/a.pid.tmp {d}/a.pid; \
             (sh -c 'echo $$ > {d}/orphan.tmp && mv {d}/orphan.tmp {d}/orphan.pid; sleep 1' &); \
             trap 'exit 0' TERM; while true; do sleep 0.05; done"
        ),
    ];
    let a = Candidate::spawn(cp, &dir, "a", &flags, &script);
    wait_for("a leads", WAIT, || a.leading().then_some(()));
    let command = a.command_pid().unwrap();
    let supervisor = parent_of(command);
    let orphan: i32 = wait_for("the orphan's pid", WAIT, || {
        fs::read_to_string(dir.join("orphan.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    });
    // Its parent (the subshell) exits at once: the orphan is re-parented.
    let adopter = wait_for("the orphan is re-parented", Duration::from_secs(5), || {
        let p = parent_of(orphan);
        (p != command && p != 0).then_some(p)
    });
    assert!(
        adopter == supervisor || adopter == a.pid() as i32,
        "the orphan went to pid {adopter}, not to the supervisor ({supervisor}) or kube-leader ({})",
        a.pid()
    );
    wait_for("the orphan exits and is reaped", Duration::from_secs(10), || {
        (!alive(orphan) && zombies_of(&[supervisor, a.pid() as i32]).is_empty()).then_some(())
    });
    assert!(a.leading());
    let _ = fs::remove_dir_all(dir);
}

/// Item 4: a `--grace` longer than lease duration − renew deadline is refused (COMMAND could
/// still run when a successor takes over an expired lease), unless the risk is accepted.
#[test]
fn grace_beyond_the_lease_is_refused_unless_allowed() {
    let line = usage_error(&[
        "run",
        "--lock",
        "l",
        "--strategy",
        "lease",
        "--grace",
        "10s",
        "--",
        "true",
    ]);
    for s in ["--grace", "10s", "5s", "--allow-grace-beyond-lease"] {
        assert!(line.contains(s), "{line} should name {s}");
    }
    // Accepted when asked for, and for leader for life (no lease): the cluster is what fails.
    for args in [
        &[
            "run",
            "--lock",
            "l",
            "--strategy",
            "lease",
            "--grace",
            "10s",
            "--allow-grace-beyond-lease",
            "--connect-timeout",
            "100ms",
            "--",
            "true",
        ][..],
        &[
            "run",
            "--lock",
            "l",
            "--grace",
            "60s",
            "--connect-timeout",
            "100ms",
            "--",
            "true",
        ][..],
        &[
            "run",
            "--lock",
            "l",
            "--strategy",
            "lease",
            "--grace",
            "5s",
            "--connect-timeout",
            "100ms",
            "--",
            "true",
        ][..],
    ] {
        let out = Command::new(BIN)
            .args(args)
            .env("KUBECONFIG", "/nonexistent")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(123), "{args:?}: {out:?}");
    }
}

/// Item 4: with the default grace (lease duration − renew deadline), a COMMAND that ignores
/// SIGTERM is SIGKILLed by a lease duration after the last renewal at the latest, before a
/// successor can take over the expired lease.
#[tokio::test(flavor = "multi_thread")]
async fn a_command_deaf_to_sigterm_is_killed_before_the_lease_expires() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let dir = scratch_dir("deaf");
    let flags = lease_flags("deaf", ns.name());
    let mut a = Candidate::spawn(cp, &dir, "a", &flags, &work_script(&dir, "a", ""));
    wait_for("a leads", WAIT, || a.leading().then_some(()));
    let command = a.command_pid().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let frozen = Instant::now();
    signal(a.pid(), "STOP");
    wait_for("COMMAND is killed", Duration::from_secs(30), || {
        (!alive(command)).then_some(())
    });
    let killed = frozen.elapsed();
    signal(a.pid(), "CONT");
    assert_eq!(a.wait_exit(WAIT).code(), Some(124), "{}", a.log_text());
    eprintln!("COMMAND (deaf to SIGTERM) killed {killed:?} after kube-leader was frozen (lease 2s)");
    assert!(
        killed < Duration::from_millis(2600),
        "COMMAND outlived the lease: killed {killed:?} after the last renewal (lease duration 2s)"
    );
    let grace = a
        .logs()
        .iter()
        .find(|l| l["message"] == "campaigning")
        .and_then(|l| l["grace"].as_str().map(str::to_string));
    assert_eq!(
        grace.as_deref(),
        Some("1s"),
        "default grace = 2s − 1s: {}",
        a.log_text()
    );
    let _ = fs::remove_dir_all(dir);
}

/// Item 9: a flood of idle connections to the status server (2,000, kube-leader limited to 256
/// open files as in a container) neither starves the election nor keeps /healthz from
/// answering: connections are capped and a client that sends no headers is dropped.
#[tokio::test(flavor = "multi_thread")]
async fn a_connection_flood_does_not_starve_the_leader_or_its_probes() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let dir = scratch_dir("flood");
    let flags = [
        &lease_flags("flood", ns.name())[..],
        &["--status-addr", "127.0.0.1:0"],
    ]
    .concat();
    let a = Candidate::spawn_opts(
        cp.kubeconfig_path(),
        &dir,
        "a",
        &flags,
        &work_script(&dir, "a", "exit 0"),
        &[],
        Opts {
            nofile: Some(256),
            ..Opts::default()
        },
    );
    wait_for("a leads", WAIT, || a.leading().then_some(()));
    let addr = a.status_addr();
    let started = Instant::now();
    let mut flood = Vec::new();
    for _ in 0..2000 {
        // A full accept backlog (nobody accepting) ends the flood early.
        match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
            Ok(s) => flood.push(s),
            Err(e) => {
                eprintln!("the flood stops at {} connections: {e}", flood.len());
                break;
            }
        }
    }
    // Slowloris: half of them start a request and never finish its headers.
    for s in flood.iter_mut().step_by(2) {
        let _ = s.write_all(b"GET /leader HTTP/1.1\r\nHost: x\r\n");
    }
    eprintln!(
        "{} flood connections open in {:?}; kube-leader has {} open files",
        flood.len(),
        started.elapsed(),
        fs::read_dir(format!("/proc/{}/fd", a.pid())).map_or(0, |d| d.count())
    );
    // While they are held open, /healthz answers (a few retries: the cap closes what is over it).
    let healthy = Instant::now();
    wait_for("/healthz during the flood", Duration::from_secs(20), || {
        probe(addr, "/healthz").filter(|c| *c == 200)
    });
    eprintln!("/healthz answered {:?} into the flood", healthy.elapsed());
    // The election goes on: still leading, renewing, no loss, for several lease durations.
    std::thread::sleep(Duration::from_secs(4));
    assert!(a.leading(), "{}", a.log_text());
    assert!(!a.log_text().contains("lost leadership"), "{}", a.log_text());
    let status = status_json(cp, ns.name(), "flood", "lease");
    assert_eq!(status["holder"], "a");
    drop(flood);
    assert_eq!(http(addr, "GET", "/healthz").0, 200);
    let _ = fs::remove_dir_all(dir);
}

/// One GET with short timeouts: the status code, or `None` when nothing usable came back.
fn probe(addr: SocketAddr, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    raw.split_whitespace().nth(1)?.parse().ok()
}

// === handover speed (issue 14) ===

/// The children of `pid` (from `/proc/<pid>/task/*/children`).
fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(list) = fs::read_to_string(t.path().join("children")) {
                out.extend(list.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
            }
        }
    }
    out
}

fn cmdline(pid: i32) -> String {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// A follower has its supervisor and COMMAND's process ready (waiting) before it wins, so
/// that winning costs a message and COMMAND's exec; the waiting process becomes COMMAND, with
/// the term's environment.
#[tokio::test(flavor = "multi_thread")]
async fn a_follower_has_command_ready_before_it_wins() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let dir = scratch_dir("ready");
    let flags = lease_flags("ready", ns.name());
    let mut a = Candidate::spawn(cp, &dir, "a", &flags, &work_script(&dir, "a", "exit 0"));
    wait_for("a leads", WAIT, || a.leading().then_some(()));
    let b = Candidate::spawn(cp, &dir, "b", &flags, &work_script(&dir, "b", "exit 0"));
    wait_for("b follows", WAIT, || {
        b.log_text().contains("leader is a").then_some(())
    });
    let (supervisor, waiting) = wait_for("b's supervisor and COMMAND's process", WAIT, || {
        let sup = children_of(b.pid() as i32)
            .into_iter()
            .find(|p| cmdline(*p).contains("__supervise"))?;
        let waiting = children_of(sup)
            .into_iter()
            .find(|p| cmdline(*p).contains("__exec"))?;
        Some((sup, waiting))
    });
    assert!(cmdline(waiting).contains("--wait"), "{}", cmdline(waiting));
    assert!(!b.leading());

    signal(a.pid(), "TERM");
    assert_eq!(a.wait_exit(WAIT).code(), Some(0), "{}", a.log_text());
    wait_for("b takes over", WAIT, || b.leading().then_some(()));
    assert_eq!(
        b.command_pid(),
        Some(waiting),
        "COMMAND is the process that waited"
    );
    assert_eq!(parent_of(waiting), supervisor);
    let (id, _, _) = b.command_env().unwrap();
    assert_eq!(id, "b");
    let _ = fs::remove_dir_all(dir);
}

// === Safety III: a stopped process group, a stopped supervisor ===

/// Sends `sig` to every process of process group `group`.
fn signal_group(group: u32, sig: &str) {
    let status = Command::new("kill")
        .args([&format!("-{sig}"), "--", &format!("-{group}")])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{sig} -{group}");
}

/// SIGSTOP of kube-leader's whole process group (Ctrl-Z in a terminal, a debugger, a freezer)
/// must not leave COMMAND running past its deadline: the supervisor lives in a group of its
/// own and stops COMMAND once leadership is no longer confirmed. Before, it was frozen with
/// kube-leader and COMMAND, in its own group, ran on for as long as the stop lasted.
#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_process_group_has_its_command_stopped_by_the_deadline() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let dir = scratch_dir("stop-group");
    let flags = wide_lease_flags("stopgroup", ns.name());
    let mut a = Candidate::in_own_group(cp, &dir, "a", &flags);
    wait_for("a leads", WAIT, || a.leading().then_some(()));
    let command = a.command_pid().unwrap();
    let stopped = Instant::now();
    signal_group(a.pid(), "STOP");
    // Renew deadline 4 s, grace 2 s: COMMAND is gone by 6 s after the last renewal.
    let gone = {
        let started = Instant::now();
        while alive(command) && started.elapsed() < Duration::from_secs(15) {
            std::thread::sleep(Duration::from_millis(10));
        }
        !alive(command)
    };
    let after = stopped.elapsed();
    signal_group(a.pid(), "CONT");
    assert!(
        gone,
        "COMMAND still ran {after:?} after kube-leader's process group was stopped (renew deadline 4s)"
    );
    eprintln!("COMMAND gone {after:?} after kube-leader's process group was stopped");
    assert!(after < Duration::from_millis(6500), "{after:?}");
    assert_eq!(a.wait_exit(WAIT).code(), Some(124), "{}", a.log_text());
    let _ = fs::remove_dir_all(dir);
}

/// The supervisor stopped alone (SIGSTOP, a debugger) while leadership is lost (here: the
/// Lease deleted): kube-leader itself kills COMMAND by its deadline (the last confirmed instant
/// + grace). Before, it sent `stop` to a supervisor that could not read it, and COMMAND ran on.
#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_supervisor_does_not_keep_command_running_after_a_loss() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let dir = scratch_dir("stop-sup");
    let flags = wide_lease_flags("stopsup", ns.name());
    let mut a = Candidate::spawn(cp, &dir, "a", &flags, &work_script(&dir, "a", "exit 0"));
    wait_for("a leads", WAIT, || a.leading().then_some(()));
    let command = a.command_pid().unwrap();
    let supervisor = parent_of(command);
    assert!(supervisor > 1 && supervisor != a.pid() as i32);
    signal(supervisor as u32, "STOP");
    let leases: Api<Lease> = Api::namespaced(cp.client().await, ns.name());
    leases
        .delete("stopsup", &Default::default())
        .await
        .expect("delete the Lease");
    let deleted = Instant::now();
    let gone = {
        while alive(command) && deleted.elapsed() < Duration::from_secs(15) {
            std::thread::sleep(Duration::from_millis(10));
        }
        !alive(command) || proc_stat(command).is_some_and(|(state, _, _)| state == 'Z')
    };
    let after = deleted.elapsed();
    // The backstop killed the supervisor with COMMAND: a CONT may find it gone.
    let _ = Command::new("kill")
        .args(["-CONT", &supervisor.to_string()])
        .status();
    assert!(
        gone,
        "COMMAND still ran {after:?} after the loss while its supervisor was stopped"
    );
    eprintln!("COMMAND killed {after:?} after the loss (its supervisor stopped)");
    assert_eq!(a.wait_exit(WAIT).code(), Some(124), "{}", a.log_text());
    let _ = fs::remove_dir_all(dir);
}

/// The whole tree frozen (kube-leader's group, the supervisor, COMMAND) past COMMAND's
/// deadline, then thawed, COMMAND first (the worst order): COMMAND is killed at once.
#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_tree_thawed_after_the_deadline_kills_command_first() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let dir = scratch_dir("freeze-all");
    let flags = wide_lease_flags("freezeall", ns.name());
    let mut a = Candidate::in_own_group(cp, &dir, "a", &flags);
    wait_for("a leads", WAIT, || a.leading().then_some(()));
    let command = a.command_pid().unwrap();
    let supervisor = parent_of(command);
    signal_group(command as u32, "STOP");
    signal(supervisor as u32, "STOP");
    signal_group(a.pid(), "STOP");
    // Past renew deadline (4 s) + grace (2 s).
    std::thread::sleep(Duration::from_secs(7));
    let thawed = Instant::now();
    signal_group(command as u32, "CONT");
    signal(supervisor as u32, "CONT");
    signal_group(a.pid(), "CONT");
    let started = Instant::now();
    while alive(command)
        && proc_stat(command).is_none_or(|(state, _, _)| state != 'Z')
        && started.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    let after = thawed.elapsed();
    eprintln!("COMMAND gone {after:?} after the thaw");
    assert!(
        after < Duration::from_secs(2),
        "COMMAND ran {after:?} after the thaw"
    );
    assert_eq!(a.wait_exit(WAIT).code(), Some(124), "{}", a.log_text());
    let _ = fs::remove_dir_all(dir);
}

// === --kubeconfig, --context, --http1 ===

/// `kube-leader status` with `--kubeconfig` only: KUBECONFIG unset and HOME without a
/// ~/.kube/config, so the flag is the only way to the cluster; the same with `--http1`.
#[tokio::test(flavor = "multi_thread")]
async fn status_reads_the_kubeconfig_flag_without_kubeconfig_env() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let home = scratch_dir("kubeconfig-flag");
    let kubeconfig = cp.kubeconfig_path().to_str().unwrap();
    for extra in [&[][..], &["--http1"][..]] {
        let mut args = vec![
            "status",
            "--lock",
            "kc",
            "-n",
            ns.name(),
            "--strategy",
            "lease",
            "-o",
            "json",
        ];
        args.extend_from_slice(&["--kubeconfig", kubeconfig]);
        args.extend_from_slice(extra);
        let out = Command::new(BIN)
            .args(&args)
            .env_remove("KUBECONFIG")
            .env_remove("KUBE_LEADER_HTTP1")
            .env("HOME", &home)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {stderr}");
        let s: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(s["exists"], false, "{s}");
        assert_eq!(s["namespace"], ns.name(), "{s}");
    }
    let _ = fs::remove_dir_all(home);
}

/// A `--context` the kubeconfig lacks: exit code 123, one message naming the context and the file.
#[test]
fn a_missing_context_exits_123_naming_it() {
    let cp = ControlPlane::shared();
    let kubeconfig = cp.kubeconfig_path().to_str().unwrap();
    let out = Command::new(BIN)
        .args([
            "status",
            "--lock",
            "kc",
            "-n",
            "default",
            "--context",
            "no-such-ctx",
        ])
        .args(["--kubeconfig", kubeconfig, "--connect-timeout", "1s"])
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(123), "{stderr}");
    assert!(
        stderr.contains("--context no-such-ctx") && stderr.contains(kubeconfig),
        "{stderr}"
    );
    assert!(stderr.contains("has no such context"), "{stderr}");
}

/// `--watch-own-pod` (Lease), with only the Role `kube-leader rbac --watch-own-pod` prints: the
/// leader's Pod deleted → its COMMAND is stopped (SIGTERM) and the lease released at once,
/// with no signal to kube-leader, and kube-leader exits with COMMAND's code; a follower whose Pod
/// is deleted stops campaigning and exits 0. Without the pods permission: exit 123 naming it.
#[tokio::test(flavor = "multi_thread")]
async fn watch_own_pod_stops_on_the_pods_deletion_as_on_sigterm() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let dir = scratch_dir("own-pod");
    let yaml = rbac(&[
        "--strategy",
        "lease",
        "--lock",
        "own",
        "--namespace",
        ns.name(),
        "--watch-own-pod",
    ]);
    kubectl(cp, &["apply", "-f", "-"], &yaml);
    let user = user(5);
    bind(&client, ns.name(), "kube-leader-lease-own", &user).await;
    for pod in ["own-a", "own-b", "own-c"] {
        create_pod(&client, ns.name(), pod).await.unwrap();
    }
    let kubeconfig = cp.user_kubeconfig_path(&user).unwrap();
    // A long lease: a takeover well within it can only come from a release.
    let flags = [
        "--strategy",
        "lease",
        "--lock",
        "own",
        "--namespace",
        ns.name(),
        "--lease-duration",
        "20s",
        "--renew-deadline",
        "10s",
        "--retry-period",
        "1s",
        "--watch-own-pod",
    ];
    let d = dir.display();
    let spawn = |id: &str, pod: &str, on_term: &str| {
        Candidate::spawn_with(
            kubeconfig,
            &dir,
            id,
            &flags,
            &work_script(&dir, id, on_term),
            &[("POD_NAME", pod), ("POD_NAMESPACE", ns.name())],
        )
    };
    let mut a = spawn("a", "own-a", &format!("echo term > {d}/a.term; exit 7"));
    wait_for("a leads", WAIT, || a.leading().then_some(()));
    let b = spawn("b", "own-b", "exit 0");
    let mut c = spawn("c", "own-c", "exit 0");
    for x in [&b, &c] {
        wait_for("b and c follow", WAIT, || {
            x.log_text().contains("leader is a").then_some(())
        });
    }

    // The follower c's Pod goes: c stops campaigning and exits 0, never leading.
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    pods.delete("own-c", &DeleteParams::default()).await.unwrap();
    let code = c.wait_exit(WAIT);
    assert_eq!(code.code(), Some(0), "{}", c.log_text());
    assert!(!c.leading(), "{}", c.log_text());
    assert!(
        c.log_text().contains("stopping before leading"),
        "{}",
        c.log_text()
    );

    // The leader a's Pod goes: COMMAND gets SIGTERM, the lease is released, b leads.
    let deleted = Instant::now();
    pods.delete("own-a", &DeleteParams::default()).await.unwrap();
    wait_for("b takes over", WAIT, || b.leading().then_some(()));
    let handover = deleted.elapsed();
    let code = a.wait_exit(WAIT);
    assert_eq!(code.code(), Some(7), "COMMAND's code: {}", a.log_text());
    assert_eq!(
        fs::read_to_string(dir.join("a.term")).unwrap().trim(),
        "term",
        "SIGTERM reached COMMAND"
    );
    assert!(
        a.log_text().contains("this candidate's Pod was deleted")
            || a.log_text().contains("this candidate's Pod is being deleted"),
        "{}",
        a.log_text()
    );
    assert!(!a.log_text().contains("missing permission"), "{}", a.log_text());
    eprintln!("from the Pod's deletion to the next leader's COMMAND: {handover:?} (lease 20s)");
    assert!(
        handover < Duration::from_secs(10),
        "took {handover:?}: not a release"
    );

    // Without get pods (the plain Lease Role): exit 123, naming the permission and the command.
    let plain = rbac(&["--strategy", "lease", "--lock", "plain", "--namespace", ns.name()]);
    kubectl(cp, &["apply", "-f", "-"], &plain);
    let other = self::user(6);
    bind(&client, ns.name(), "kube-leader-lease-plain", &other).await;
    let kubeconfig = cp.user_kubeconfig_path(&other).unwrap();
    let mut flags = lease_flags("plain", ns.name());
    flags.push("--watch-own-pod");
    let mut d = Candidate::spawn_with(
        kubeconfig,
        &dir,
        "d",
        &flags,
        &work_script(&dir, "d", "exit 0"),
        &[("POD_NAME", "own-b"), ("POD_NAMESPACE", ns.name())],
    );
    let code = d.wait_exit(WAIT);
    assert_eq!(code.code(), Some(123), "{}", d.log_text());
    assert!(
        d.log_text()
            .contains("kube-leader rbac --strategy lease --watch-own-pod"),
        "{}",
        d.log_text()
    );
    let _ = fs::remove_dir_all(dir);
}

/// An idle follower of `kube-leader run --strategy lease` whose Pod the Downward API names
/// (`POD_NAME`, `POD_UID`, as deploy/ sets them) sends no request at all: its registration is
/// owned by its Pod and written once, and over HTTP/2 it keeps no spare connection warm. The
/// leader sends its renewals (one write per retry period) and its registration's pulse. Counted
/// at the API server from its audit log, over 35 s (more than two registration heartbeats).
#[tokio::test(flavor = "multi_thread")]
async fn an_idle_follower_with_its_pod_known_sends_nothing() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let dir = scratch_dir("idle-follower");
    let yaml = rbac(&["--strategy", "lease", "--lock", "idle", "--namespace", ns.name()]);
    kubectl(cp, &["apply", "-f", "-"], &yaml);
    let (leader_user, follower_user) = (user(7), user(8));
    for u in [&leader_user, &follower_user] {
        bind(&client, ns.name(), "kube-leader-lease-idle", u).await;
    }
    let mut uids = Vec::new();
    for name in ["pod-a", "pod-b"] {
        let pod = create_pod(&client, ns.name(), name).await.unwrap();
        uids.push(pod.metadata.uid.unwrap());
    }
    let flags = lease_flags("idle", ns.name());
    let a = Candidate::spawn_with(
        cp.user_kubeconfig_path(&leader_user).unwrap(),
        &dir,
        "pod-a",
        &flags,
        &work_script(&dir, "pod-a", "exit 0"),
        &[("POD_NAME", "pod-a"), ("POD_UID", &uids[0])],
    );
    wait_for("a leads", WAIT, || a.leading().then_some(()));
    let b = Candidate::spawn_with(
        cp.user_kubeconfig_path(&follower_user).unwrap(),
        &dir,
        "pod-b",
        &flags,
        &work_script(&dir, "pod-b", "exit 0"),
        &[("POD_NAME", "pod-b"), ("POD_UID", &uids[1])],
    );
    // b registered (owned by its Pod) and follows.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client.clone(), ns.name());
    wait_for("b's registration, owned by its Pod", WAIT, || {
        let list = futures_block(leases.list(&Default::default()));
        list.items
            .iter()
            .any(|l| {
                l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some("pod-b")
                    && l.metadata
                        .owner_references
                        .as_ref()
                        .is_some_and(|o| o.iter().any(|o| o.uid == uids[1]))
            })
            .then_some(())
    });
    // Its start-up requests (the lock's read and watch) are over once its count stands still.
    let mut seen = usize::MAX;
    let before = wait_for("the follower's start-up requests to end", WAIT, || {
        std::thread::sleep(Duration::from_secs(1));
        let now = cp.audit_events(&follower_user).unwrap().len();
        let settled = (now == seen).then_some(now);
        seen = now;
        settled
    });
    let leader_before = cp.audit_events(&leader_user).unwrap().len();
    std::thread::sleep(Duration::from_secs(35));
    let after = cp.audit_events(&follower_user).unwrap();
    let sent: Vec<String> = after[before..]
        .iter()
        .filter(|e| e.stage == "ResponseComplete" || e.stage == "ResponseStarted")
        .map(|e| format!("{} {}", e.verb, e.request_uri))
        .collect();
    assert!(a.leading() && !b.leading(), "{}\n{}", a.log_text(), b.log_text());
    assert!(
        sent.is_empty(),
        "an idle follower sent {sent:?}\n{}",
        b.log_text()
    );
    let leader = cp.audit_events(&leader_user).unwrap();
    let writes = leader[leader_before..]
        .iter()
        .filter(|e| e.stage == "ResponseComplete" && e.verb == "update")
        .count();
    eprintln!("over 35 s: follower 0 requests, leader {writes} updates");
    assert!(writes > 0, "the leader renews");
    let _ = fs::remove_dir_all(dir);
}
