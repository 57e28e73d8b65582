//! `kube-leader run --shards M` against the real control plane (Safety III): COMMAND never
//! works a shard while another replica's COMMAND does, whichever process dies and whatever
//! COMMAND does with signals.
//!
//! COMMAND here is a shell script or a Go program (`tools/go-shard-command`) that records when
//! it starts (with `KUBE_LEADER_SHARD_SET`) and when it stops, on the machine's clock; the
//! tests check per shard that no two replicas' COMMANDs held it at the same time.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, SystemTime},
};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube_leader::internal::LeaseRecord;
use kube_leader_testenv::ControlPlane;
use nix::{sys::signal::Signal, unistd::Pid};
use tokio::process::{Child, Command};

const SOON: Duration = Duration::from_secs(30);
const SHARDS: u32 = 4;

fn bin() -> PathBuf {
    kube_leader_e2e::kube_leader_bin_beside(env!("CARGO_BIN_EXE_shard-candidate"))
}

fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kube-leader-sidecar-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// COMMAND as a shell script that handles no change signal (only SIGTERM, to record its exit):
/// its records carry its pid.
fn plain_script() -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        r#"echo "start $(date +%s%N) $KUBE_LEADER_SHARD_SET $$" >> "$LOG_FILE"
trap 'echo "exit $(date +%s%N) TERM" >> "$LOG_FILE"; exit 0' TERM
while true; do sleep 0.05; done"#
            .into(),
    ]
}

/// Builds `tools/go-shard-command` with the machine's Go (the test command installs it).
fn go_command() -> PathBuf {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("go-shard-command");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/go-shard-command/main.go");
    // A single file using only the standard library: GOPATH mode (GO111MODULE=off) needs no
    // go.mod, and builds with Go 1.26.8 (/usr/local/go) as with Debian's golang-go.
    let go = ["go", "/usr/local/go/bin/go", "/usr/lib/go/bin/go"]
        .into_iter()
        .find(|g| std::process::Command::new(g).arg("version").output().is_ok())
        .expect(
            "Go is needed for this test: scripts/testenv-assets.sh installs Debian's golang-go \
             (scripts/k8s-assets.sh uses /usr/local/go)",
        );
    let status = std::process::Command::new(go)
        .args(["build", "-o"])
        .arg(&out)
        .arg(&src)
        .env("GO111MODULE", "off")
        .env("GOFLAGS", "")
        .env(
            "GOCACHE",
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("go-cache"),
        )
        .status()
        .expect("run go build");
    assert!(status.success(), "go build {}", src.display());
    out
}

/// `kube-leader run --shards 4` as `identity`, COMMAND's records in `<dir>/<identity>.txt`.
fn start(
    cp: &ControlPlane,
    ns: &str,
    dir: &Path,
    identity: &str,
    extra: &[&str],
    command: &[String],
) -> Child {
    let mut c = Command::new(bin());
    c.args(["run", "--strategy", "lease", "--lock", "side", "--namespace", ns])
        .args(["--identity", identity, "--shards", &SHARDS.to_string()])
        .args([
            "--lease-duration",
            "2s",
            "--renew-deadline",
            "1s",
            "--retry-period",
            "200ms",
        ])
        .args(extra)
        .arg("--")
        .args(command)
        .env("KUBECONFIG", cp.kubeconfig_path())
        .env("LOG_FILE", dir.join(format!("{identity}.txt")))
        .env("RUST_LOG", "info,kube_leader_cli=debug")
        .env_remove("POD_NAMESPACE")
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("{identity}.log"))).unwrap())
        .kill_on_drop(true);
    c.spawn().expect("start kube-leader run --shards")
}

/// One start of COMMAND: when, which shards, until when (None: still running).
#[derive(Debug, Clone)]
struct Incarnation {
    start: u128,
    shards: Vec<u32>,
    end: Option<u128>,
}

/// COMMAND's incarnations, from its records (a start ends the previous incarnation at the
/// latest: COMMAND is restarted only after it stopped).
fn incarnations(dir: &Path, identity: &str) -> Vec<Incarnation> {
    let text = std::fs::read_to_string(dir.join(format!("{identity}.txt"))).unwrap_or_default();
    let mut out: Vec<Incarnation> = Vec::new();
    for line in text.lines() {
        let mut w = line.split_whitespace();
        let (Some(kind), Some(Ok(at))) = (w.next(), w.next().map(str::parse::<u128>)) else {
            continue;
        };
        match kind {
            "start" => {
                if let Some(last) = out.last_mut() {
                    last.end.get_or_insert(at);
                }
                let shards = w
                    .next()
                    .unwrap_or("")
                    .split(',')
                    .filter_map(|s| s.parse().ok())
                    .collect();
                out.push(Incarnation {
                    start: at,
                    shards,
                    end: None,
                });
            }
            "exit" => {
                if let Some(last) = out.last_mut() {
                    last.end.get_or_insert(at);
                }
            }
            _ => {}
        }
    }
    out
}

/// Per shard, no two identities' incarnations overlap in time; `ended` maps an identity whose
/// COMMAND is known to be gone to when it was seen gone (for a COMMAND killed without a record).
fn assert_no_overlap(dir: &Path, identities: &[&str], ended: &BTreeMap<String, u128>) {
    let now = now_ns();
    let mut spans: BTreeMap<u32, Vec<(String, u128, u128)>> = BTreeMap::new();
    for id in identities {
        for inc in incarnations(dir, id) {
            let end = inc.end.or_else(|| ended.get(*id).copied()).unwrap_or(now);
            for s in &inc.shards {
                spans
                    .entry(*s)
                    .or_default()
                    .push(((*id).to_string(), inc.start, end));
            }
        }
    }
    for (shard, list) in spans {
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                assert!(
                    a.0 == b.0 || a.2 <= b.1 || b.2 <= a.1,
                    "shard {shard} worked by two COMMANDs at once: {a:?} and {b:?}\n{}",
                    identities
                        .iter()
                        .map(|id| format!("{id}: {:?}", incarnations(dir, id)))
                        .collect::<Vec<_>>()
                        .join("\n")
                );
            }
        }
    }
}

async fn holders(leases: &Api<Lease>) -> Vec<String> {
    let mut h = Vec::new();
    for i in 0..SHARDS {
        let l = leases.get_opt(&format!("side-{i}")).await.unwrap();
        h.push(
            l.and_then(|l| LeaseRecord::from_lease(&l).holder)
                .unwrap_or_default(),
        );
    }
    h
}

/// The shards COMMAND runs with now (its last incarnation, if it runs).
fn current(dir: &Path, identity: &str) -> Option<Vec<u32>> {
    incarnations(dir, identity)
        .pop()
        .filter(|i| i.end.is_none())
        .map(|i| {
            let mut s = i.shards;
            s.sort_unstable();
            s
        })
}

async fn stop(child: &mut Child) -> std::process::ExitStatus {
    let pid = Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, Signal::SIGTERM).unwrap();
    tokio::time::timeout(SOON, child.wait())
        .await
        .expect("exits")
        .unwrap()
}

/// The default (`--on-shards-change restart`): a COMMAND that handles no signal is restarted
/// with its new set when a replica joins, and the shards it gives up are released only once
/// it stopped: no shard is worked by two COMMANDs at once. Before, such a COMMAND was never
/// told (the signal was held back until it caught it) and worked its old set on while the
/// joining replica's COMMAND worked the shards handed over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_without_a_handler_is_restarted_and_never_overlaps() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let leases: Api<Lease> = Api::namespaced(cp.client().await, ns.name());
    let dir = scratch("restart");
    let mut a = start(cp, ns.name(), &dir, "a", &[], &plain_script());
    kube_leader_e2e::wait_for("a's COMMAND to work all 4 shards", SOON, || async {
        (current(&dir, "a")? == [0, 1, 2, 3]).then_some(())
    })
    .await;
    let mut b = start(cp, ns.name(), &dir, "b", &[], &plain_script());
    kube_leader_e2e::wait_for("2 shards each, and each COMMAND on its 2", SOON, || async {
        let h = holders(&leases).await;
        let (ca, cb) = (current(&dir, "a")?, current(&dir, "b")?);
        let fair = h.iter().filter(|x| *x == "a").count() == 2 && h.iter().filter(|x| *x == "b").count() == 2;
        (fair && ca.len() == 2 && cb.len() == 2).then_some(())
    })
    .await;
    assert_no_overlap(&dir, &["a", "b"], &BTreeMap::new());
    println!(
        "a: {:?}\nb: {:?}",
        incarnations(&dir, "a"),
        incarnations(&dir, "b")
    );
    for (name, child) in [("b", &mut b), ("a", &mut a)] {
        let status = stop(child).await;
        assert_eq!(status.code(), Some(0), "{name}: {status:?}");
    }
    assert_no_overlap(&dir, &["a", "b"], &BTreeMap::new());
    assert!(
        holders(&leases).await.iter().all(String::is_empty),
        "every shard released"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Go COMMAND, which catches SIGHUP in order to exit (as Go and JVM services do), is not
/// sent SIGHUP by default: it is restarted with its new set and kube-leader goes on. Before,
/// its caught SIGHUP was taken for a shard-change handler and the signal ended it (and with
/// it kube-leader: a crash loop in a Pod).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_command_that_exits_on_sighup_is_restarted_not_signalled() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let dir = scratch("go");
    let command = vec![go_command().display().to_string()];
    let mut a = start(cp, ns.name(), &dir, "a", &[], &command);
    kube_leader_e2e::wait_for("a's COMMAND to work shards", SOON, || async {
        (!current(&dir, "a")?.is_empty()).then_some(())
    })
    .await;
    let mut b = start(cp, ns.name(), &dir, "b", &[], &command);
    kube_leader_e2e::wait_for("each COMMAND on 2 shards", SOON, || async {
        (current(&dir, "a")?.len() == 2 && current(&dir, "b")?.len() == 2).then_some(())
    })
    .await;
    assert!(a.try_wait().unwrap().is_none(), "a's kube-leader exited");
    let records = std::fs::read_to_string(dir.join("a.txt")).unwrap();
    assert!(!records.contains("hangup"), "COMMAND was sent SIGHUP:\n{records}");
    assert_no_overlap(&dir, &["a", "b"], &BTreeMap::new());
    for child in [&mut b, &mut a] {
        assert_eq!(stop(child).await.code(), Some(0));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The pid of `identity`'s COMMAND, from its last record.
fn command_pid(dir: &Path, identity: &str) -> i32 {
    let text = std::fs::read_to_string(dir.join(format!("{identity}.txt"))).unwrap();
    text.lines()
        .last()
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|p| p.parse().ok())
        .expect("COMMAND's pid")
}

/// Whether process `pid` runs (exists and is not a zombie).
fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(Pid::from_raw(pid), None).is_ok()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
}

/// kube-leader SIGKILLed (not PID 1: the kernel kills nothing for it here): its COMMAND is
/// stopped by the supervisor, before another replica can take its shards over (the lease
/// duration after the last renewal). Before, `run --shards` started COMMAND itself and a killed
/// kube-leader left it working its shards forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_shards_sidecar_leaves_no_command_behind() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let dir = scratch("kill");
    let mut a = start(cp, ns.name(), &dir, "a", &[], &plain_script());
    kube_leader_e2e::wait_for("a's COMMAND to work shards", SOON, || async {
        (!current(&dir, "a")?.is_empty()).then_some(())
    })
    .await;
    let pid = command_pid(&dir, "a");
    let killed = std::time::Instant::now();
    a.start_kill().unwrap();
    let _ = a.wait().await;
    while alive(pid) && killed.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let after = killed.elapsed();
    if alive(pid) {
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        panic!("COMMAND still ran {after:?} after its kube-leader was killed");
    }
    println!("COMMAND gone {after:?} after kube-leader was SIGKILLed (lease duration 2s)");
    assert!(after < Duration::from_secs(2), "{after:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The supervisor of a shards sidecar's COMMAND SIGKILLed: COMMAND and its process group are
/// killed, kube-leader exits 124, and the shards are not released but left to expire, as in
/// plain `run` (COMMAND's end is not known to be orderly, so no other replica may start on them
/// before their lease duration). Before, `run --shards` handed every shard back at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_shards_supervisor_leaves_the_shards_to_expire() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let dir = scratch("kill-sup");
    let mut a = start(cp, ns.name(), &dir, "a", &[], &plain_script());
    let leases: Api<Lease> = Api::namespaced(cp.client().await, ns.name());
    kube_leader_e2e::wait_for("a's COMMAND to work every shard", SOON, || async {
        (current(&dir, "a")?.len() == SHARDS as usize).then_some(())
    })
    .await;
    let pid = command_pid(&dir, "a");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let supervisor: i32 = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
        .expect("COMMAND's parent");
    assert_ne!(
        supervisor,
        a.id().unwrap() as i32,
        "COMMAND runs under a supervisor"
    );
    nix::sys::signal::kill(Pid::from_raw(supervisor), Signal::SIGKILL).unwrap();
    let status = tokio::time::timeout(SOON, a.wait())
        .await
        .expect("kube-leader exits")
        .unwrap();
    let log = std::fs::read_to_string(dir.join("a.log")).unwrap_or_default();
    assert_eq!(status.code(), Some(124), "a loss: {log}");
    assert!(
        !alive(pid),
        "COMMAND outlived its supervisor and kube-leader: {log}"
    );
    assert_eq!(
        holders(&leases).await,
        vec!["a".to_string(); SHARDS as usize],
        "the shards are left to expire, not released: {log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// COMMAND as a shell script that handles SIGHUP as `--on-shards-change signal:HUP` asks: on
/// the signal it reads the new set from the file, records it as a new incarnation (its work on
/// the shards the set no longer lists has stopped), then acknowledges the generation.
fn signalled_script() -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        r#"echo "start $(date +%s%N) $KUBE_LEADER_SHARD_SET $$" >> "$LOG_FILE"
on_hup() {
  g=$(sed -n 's/^generation //p' "$KUBE_LEADER_SHARDS_FILE")
  s=$(sed -n '2,$p' "$KUBE_LEADER_SHARDS_FILE" | cut -d' ' -f1 | paste -sd, -)
  echo "start $(date +%s%N) $s $$" >> "$LOG_FILE"
  echo "$g" > "$KUBE_LEADER_SHARDS_ACK"
}
trap on_hup HUP
trap 'echo "exit $(date +%s%N) TERM" >> "$LOG_FILE"; exit 0' TERM
while true; do sleep 0.05; done"#
            .into(),
    ]
}

/// `--on-shards-change signal:HUP` with a COMMAND that acknowledges: a joining replica gets
/// its shards only once the first replica's COMMAND acknowledged a set without them, and that
/// COMMAND is told, not restarted (one process throughout). Prints the handover time: the
/// first COMMAND's acknowledgement → the joiner's COMMAND on the shards handed over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signalled_command_acknowledges_before_its_shards_move() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let dir = scratch("signal");
    let signal = ["--on-shards-change", "signal:HUP"];
    let mut a = start(cp, ns.name(), &dir, "a", &signal, &signalled_script());
    kube_leader_e2e::wait_for("a's COMMAND to work all 4 shards", SOON, || async {
        (current(&dir, "a")? == [0, 1, 2, 3]).then_some(())
    })
    .await;
    let joined = now_ns();
    let mut b = start(cp, ns.name(), &dir, "b", &signal, &signalled_script());
    kube_leader_e2e::wait_for("each COMMAND on 2 shards", SOON, || async {
        (current(&dir, "a")?.len() == 2 && current(&dir, "b")?.len() == 2).then_some(())
    })
    .await;
    assert_no_overlap(&dir, &["a", "b"], &BTreeMap::new());
    let records = std::fs::read_to_string(dir.join("a.txt")).unwrap();
    let pids: std::collections::BTreeSet<&str> = records
        .lines()
        .filter(|l| l.starts_with("start"))
        .filter_map(|l| l.split_whitespace().nth(3))
        .collect();
    assert_eq!(
        pids.len(),
        1,
        "a's COMMAND was restarted, not signalled:\n{records}"
    );
    assert!(!records.contains("exit"), "a's COMMAND stopped:\n{records}");
    let (a_inc, b_inc) = (incarnations(&dir, "a"), incarnations(&dir, "b"));
    let acked = a_inc
        .iter()
        .find(|i| i.shards.len() == 2)
        .expect("a's 2-shard set")
        .start;
    let b_started = b_inc.last().expect("b's COMMAND").start;
    println!(
        "signal mode: a acknowledged its 2-shard set {:.1} ms after b started; b's COMMAND \
         started on the other 2 {:.1} ms after that acknowledgement\na: {a_inc:?}\nb: {b_inc:?}",
        (acked - joined) as f64 / 1e6,
        (b_started as f64 - acked as f64) / 1e6,
    );
    assert!(b_started >= acked, "b started before a acknowledged");
    for child in [&mut b, &mut a] {
        assert_eq!(stop(child).await.code(), Some(0));
    }
    assert_no_overlap(&dir, &["a", "b"], &BTreeMap::new());
    let _ = std::fs::remove_dir_all(&dir);
}

/// COMMAND as [`plain_script`], but slow to stop: 0.8 s after SIGTERM (within the 1 s grace),
/// as a program that flushes its work.
fn slow_script() -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        r#"echo "start $(date +%s%N) $KUBE_LEADER_SHARD_SET $$" >> "$LOG_FILE"
trap 'sleep 0.8; echo "exit $(date +%s%N) TERM" >> "$LOG_FILE"; exit 0' TERM
while true; do sleep 0.05; done"#
            .into(),
    ]
}

/// Safety IV for shards: an admin deletes a shard's Lease under its live holder, whose COMMAND
/// takes 0.8 s to stop. The other replica takes the shard only once the deleted holder's lease
/// (as last seen renewed) has run out, by which time the holder's COMMAND has given it up
/// (renew deadline + grace): no shard is worked by two COMMANDs at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_lease_deleted_under_its_holder_is_never_worked_twice() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let leases: Api<Lease> = Api::namespaced(cp.client().await, ns.name());
    let dir = scratch("deleted");
    let grace = ["--grace", "1s"];
    let mut a = start(cp, ns.name(), &dir, "a", &grace, &slow_script());
    kube_leader_e2e::wait_for("a's COMMAND to work all 4 shards", SOON, || async {
        (current(&dir, "a")? == [0, 1, 2, 3]).then_some(())
    })
    .await;
    let mut b = start(cp, ns.name(), &dir, "b", &grace, &slow_script());
    kube_leader_e2e::wait_for("2 shards each", SOON, || async {
        (current(&dir, "a")?.len() == 2 && current(&dir, "b")?.len() == 2).then_some(())
    })
    .await;
    let shard = current(&dir, "a").unwrap()[0];
    let deleted = now_ns();
    leases
        .delete(&format!("side-{shard}"), &Default::default())
        .await
        .unwrap();
    // Somebody works the shard again, in a COMMAND started after the deletion (a takes it back,
    // or b takes it).
    kube_leader_e2e::wait_for("the deleted shard to be worked again", SOON, || async {
        ["a", "b"]
            .iter()
            .flat_map(|id| incarnations(&dir, id))
            .any(|i| i.start > deleted && i.end.is_none() && i.shards.contains(&shard))
            .then_some(())
    })
    .await;
    assert_no_overlap(&dir, &["a", "b"], &BTreeMap::new());
    for child in [&mut b, &mut a] {
        assert_eq!(stop(child).await.code(), Some(0));
    }
    assert_no_overlap(&dir, &["a", "b"], &BTreeMap::new());
    let _ = std::fs::remove_dir_all(&dir);
}
