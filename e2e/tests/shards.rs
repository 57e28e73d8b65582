//! Shards (issue 13) against the real control plane: candidates are `shard-candidate`
//! processes sharing one set of shard Leases. They spread the shards within one of fair after
//! start, after a join (hand-over, no expiry wait) and after a SIGKILL (takeover on expiry); no
//! shard ever has two holders; the Leases are plain client-go Leases; a shutdown releases every
//! shard and deletes the membership Leases. Times are printed, not asserted.

use std::{collections::BTreeSet, path::PathBuf, time::Duration};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{api::ListParams, Api};
use kube_leader::{
    internal::labels::{ROLE_LABEL, SHARDS_LABEL},
    internal::LeaseRecord,
};
use kube_leader_e2e::shard_fleet::{ShardFleet, Timings};
use kube_leader_testenv::ControlPlane;
use nix::sys::signal::Signal;

const T: Timings = Timings {
    lease: Duration::from_secs(2),
    renew: Duration::from_secs(1),
    retry: Duration::from_millis(200),
};
const SHARDS: u32 = 12;
const SOON: Duration = Duration::from_secs(30);

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_shard-candidate"))
}

fn log_dir(test: &str) -> PathBuf {
    std::env::temp_dir().join(format!("kube-leader-shards-{}-{test}", std::process::id()))
}

fn assert_safe(fleet: &ShardFleet) {
    for (shard, h) in fleet.histories() {
        let report = h.report(kube_leader_e2e::mono_ns());
        assert!(
            report.overlaps.is_empty() && report.malformed.is_empty(),
            "shard {shard}: {:?} {:?}",
            report.overlaps,
            report.malformed
        );
        // The fencing token grows from term to term of the shard.
        let tokens: Vec<u64> = h.terms().iter().filter_map(|t| t.fencing_token).collect();
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "shard {shard}: tokens {tokens:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_spread_after_start_join_and_crash_and_are_released_on_shutdown() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let leases: Api<Lease> = Api::namespaced(cp.client().await, ns.name());
    let dir = log_dir("spread");
    let mut fleet = ShardFleet::new(&binary(), ns.name(), "work", SHARDS, T, &dir);
    let kubeconfig = cp.kubeconfig_path().to_owned();
    for key in ["a", "b", "c"] {
        fleet.start(key, &kubeconfig);
    }
    let took = fleet
        .until(SOON, |f| f.counts().len() == 3 && f.balanced())
        .await
        .unwrap_or_else(|| {
            panic!(
                "not balanced after start: {:?} (logs {})",
                fleet.counts(),
                dir.display()
            )
        });
    println!("3 candidates: {:?} after {took:?}", fleet.counts());

    // Plain client-go Leases, labelled for the one watch.
    let list = leases
        .list(&ListParams::default().labels(&format!("{SHARDS_LABEL}=work,{ROLE_LABEL}=shard")))
        .await
        .unwrap();
    assert_eq!(list.items.len(), SHARDS as usize);
    for l in &list.items {
        let r = LeaseRecord::from_lease(l);
        assert!(
            ["a", "b", "c"].contains(&r.holder.as_deref().unwrap_or("")),
            "{r:?}"
        );
        assert_eq!(r.lease_duration, Some(Duration::from_secs(2)));
        assert!(r.renew_time.is_some() && r.acquire_time.is_some());
    }

    // A join: surplus handed over (released), the newcomer takes it at once.
    let t0 = tokio::time::Instant::now();
    fleet.start("d", &kubeconfig);
    fleet
        .until(SOON, |f| f.counts().len() == 4 && f.balanced())
        .await
        .unwrap_or_else(|| {
            panic!(
                "not balanced after a join: {:?} (logs {})",
                fleet.counts(),
                dir.display()
            )
        });
    println!(
        "join: {:?} after {:?} (retry period {:?})",
        fleet.counts(),
        t0.elapsed(),
        T.retry
    );

    // A crash: its shards are taken over when their leases expire.
    let t0 = tokio::time::Instant::now();
    fleet.signal("b", Signal::SIGKILL);
    fleet
        .until(SOON, |f| f.counts().len() == 3 && f.balanced())
        .await
        .unwrap_or_else(|| {
            panic!(
                "not balanced after a crash: {:?} (logs {})",
                fleet.counts(),
                dir.display()
            )
        });
    println!(
        "crash: {:?} after {:?} (lease {:?})",
        fleet.counts(),
        t0.elapsed(),
        T.lease
    );

    // Shutdown: every shard released, the membership Leases of the living deleted.
    for key in fleet.running() {
        fleet.signal(&key, Signal::SIGTERM);
    }
    fleet
        .until(SOON, |f| f.running().iter().all(|k| f.exited(k)))
        .await
        .expect("every candidate exits after SIGTERM");
    assert!(fleet.errors.is_empty(), "{:?}", fleet.errors);
    let all = leases
        .list(&ListParams::default().labels(&format!("{SHARDS_LABEL}=work")))
        .await
        .unwrap();
    let mut members = BTreeSet::new();
    for l in &all.items {
        let r = LeaseRecord::from_lease(l);
        match l
            .metadata
            .labels
            .as_ref()
            .and_then(|m| m.get(ROLE_LABEL))
            .map(String::as_str)
        {
            Some("shard") => {
                // Released on shutdown, unless the release could not be made (a renew deadline
                // passed first, or the write failed): then it expires, and the log says why.
                if let Some(h) = &r.holder {
                    let log = std::fs::read_to_string(dir.join(format!("{h}.log"))).unwrap_or_default();
                    assert!(
                        log.contains("renew deadline passed") || log.contains("could not release"),
                        "{:?} not released by {h}, and its log does not say why",
                        l.metadata.name
                    );
                    println!("{:?} left to expire by {h} (a loaded machine)", l.metadata.name);
                }
            }
            _ => {
                members.insert(r.holder.unwrap_or_default());
            }
        }
    }
    // Only the killed candidate's membership Lease is left (it expired).
    assert_eq!(members, BTreeSet::from(["b".to_string()]));
    assert_safe(&fleet);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A shard Lease that exists without the set's label (created by a client-go candidate, say)
/// and is held: it is respected until it expires, then taken and labelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_holder_is_waited_out() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let leases: Api<Lease> = Api::namespaced(cp.client().await, ns.name());
    let foreign: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "solo-0"},
        "spec": {"holderIdentity": "go-candidate", "leaseDurationSeconds": 3,
                 "renewTime": "2026-01-01T00:00:00.000000Z", "acquireTime": "2026-01-01T00:00:00.000000Z",
                 "leaseTransitions": 4}
    }))
    .unwrap();
    leases.create(&Default::default(), &foreign).await.unwrap();
    let dir = log_dir("foreign");
    let mut fleet = ShardFleet::new(&binary(), ns.name(), "solo", 2, T, &dir);
    let t0 = kube_leader_e2e::mono_ns();
    fleet.start("a", cp.kubeconfig_path());
    fleet
        .until(SOON, |f| f.counts().get("a") == Some(&2))
        .await
        .unwrap_or_else(|| {
            panic!(
                "both shards not held: {:?} (logs {})",
                fleet.counts(),
                dir.display()
            )
        });
    let began = fleet.histories()[&0].terms()[0].start;
    let waited = Duration::from_nanos(began - t0);
    println!("the foreign holder's shard was taken after {waited:?}");
    assert!(
        waited >= Duration::from_secs(3),
        "taken after {waited:?}, before its 3 s lease expired"
    );
    let l = leases.get("solo-0").await.unwrap();
    let r = LeaseRecord::from_lease(&l);
    assert_eq!(r.holder.as_deref(), Some("a"));
    assert_eq!(r.transitions, 5, "a takeover counts a transition");
    assert_eq!(l.metadata.labels.unwrap()[SHARDS_LABEL], "solo");
    fleet.signal("a", Signal::SIGTERM);
    fleet.until(SOON, |f| f.exited("a")).await.expect("exits");
    assert_safe(&fleet);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `kube-leader run --shards --on-shards-change signal:HUP`: COMMAND gets its shards in its
/// environment, then in the file and a SIGHUP on every change; a shard handed over to a joining replica is released only once
/// COMMAND acknowledged the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sidecar_tells_command_its_shards_and_waits_for_its_acknowledgement() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let leases: Api<Lease> = Api::namespaced(cp.client().await, ns.name());
    let bin = kube_leader_e2e::kube_leader_bin_beside(env!("CARGO_BIN_EXE_shard-candidate"));
    let dir = log_dir("sidecar");
    std::fs::create_dir_all(&dir).unwrap();
    // COMMAND: logs its shards at start and on every SIGHUP, then acknowledges. It installs
    // its handler only after a second, as a slow-starting program would: the change signals
    // of its first shards must wait for it (SIGHUP's default action would end it).
    let script = r#"
sleep 1
log="$LOG_DIR/$KUBE_LEADER_IDENTITY.txt"
ack() {
  g=$(head -1 "$KUBE_LEADER_SHARDS_FILE" | cut -d' ' -f2)
  s=$(tail -n +2 "$KUBE_LEADER_SHARDS_FILE" | cut -d' ' -f1 | tr '\n' ',')
  echo "gen $g $s" >> "$log"
  echo "$g" > "$KUBE_LEADER_SHARDS_ACK"
}
trap ack HUP
trap 'echo stop >> "$log"; exit 0' TERM
echo "start $KUBE_LEADER_SHARD_SET count $KUBE_LEADER_SHARD_COUNT" >> "$log"
while true; do sleep 0.05; done
"#;
    let start = |identity: &str| {
        let mut c = tokio::process::Command::new(&bin);
        c.args([
            "run",
            "--strategy",
            "lease",
            "--lock",
            "side",
            "--namespace",
            ns.name(),
        ])
        .args([
            "--identity",
            identity,
            "--shards",
            "4",
            "--on-shards-change",
            "signal:HUP",
        ])
        .args([
            "--lease-duration",
            "2s",
            "--renew-deadline",
            "1s",
            "--retry-period",
            "200ms",
        ])
        .args(["--", "sh", "-c", script])
        .env("KUBECONFIG", cp.kubeconfig_path())
        .env("LOG_DIR", &dir)
        .env_remove("POD_NAMESPACE")
        .stderr(std::fs::File::create(dir.join(format!("{identity}.log"))).unwrap())
        .kill_on_drop(true);
        c.spawn().expect("start kube-leader run --shards")
    };
    let read =
        |identity: &str| std::fs::read_to_string(dir.join(format!("{identity}.txt"))).unwrap_or_default();
    let holders = || async {
        let mut h = Vec::new();
        for i in 0..4 {
            let l = leases.get_opt(&format!("side-{i}")).await.unwrap();
            h.push(
                l.and_then(|l| LeaseRecord::from_lease(&l).holder)
                    .unwrap_or_default(),
            );
        }
        h
    };
    let mut a = start("a");
    // COMMAND starts with its first share, or after a lease duration with none (a slow first
    // acquisition): either way it then learns of every shard it holds.
    kube_leader_e2e::wait_for("a's COMMAND to start", SOON, || async {
        read("a")
            .lines()
            .next()
            .filter(|l| l.starts_with("start ") && l.ends_with(" count 4"))
            .map(|_| ())
    })
    .await;
    kube_leader_e2e::wait_for("a to hold all 4 shards", SOON, || async {
        (holders().await.iter().all(|h| h == "a")).then_some(())
    })
    .await;
    kube_leader_e2e::wait_for("a's COMMAND to know all 4 shards", SOON, || async {
        let log = read("a");
        let last = log
            .lines()
            .rfind(|l| l.starts_with("start ") || l.starts_with("gen "))?;
        let set = if last.starts_with("start ") {
            last.split(' ')
                .nth(1)?
                .split(',')
                .filter(|s| !s.is_empty())
                .count()
        } else {
            last.split(' ').nth(2)?.matches(',').count()
        };
        (set == 4).then_some(())
    })
    .await;
    let mut b = start("b");
    kube_leader_e2e::wait_for("2 shards each", SOON, || async {
        let h = holders().await;
        (h.iter().filter(|x| *x == "a").count() == 2 && h.iter().filter(|x| *x == "b").count() == 2)
            .then_some(())
    })
    .await;
    kube_leader_e2e::wait_for("b's COMMAND to start", SOON, || async {
        read("b").starts_with("start ").then_some(())
    })
    .await;
    let a_log = read("a");
    println!("a's COMMAND:\n{a_log}b's COMMAND:\n{}", read("b"));
    // a was told (and acknowledged) a generation with 2 shards.
    assert!(
        a_log.lines().any(
            |l| l.starts_with("gen ") && l.split(' ').nth(2).is_some_and(|s| s.matches(',').count() == 2)
        ),
        "{a_log}"
    );
    for (name, child) in [("a", &mut a), ("b", &mut b)] {
        let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
        nix::sys::signal::kill(pid, Signal::SIGTERM).unwrap();
        let status = tokio::time::timeout(SOON, child.wait())
            .await
            .expect("exits")
            .unwrap();
        assert_eq!(status.code(), Some(0), "{name}: {status:?}");
    }
    assert!(
        holders().await.iter().all(String::is_empty),
        "every shard released"
    );
    assert!(read("a").contains("stop") && read("b").contains("stop"));
    let _ = std::fs::remove_dir_all(&dir);
}
