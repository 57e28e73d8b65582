//! Safety IV: a lock deleted under a live leader whose COMMAND is slow to stop. The next
//! COMMAND must not start before the old one has ended, whoever deleted the lock (an admin, a
//! prune, a cleanup script) and whatever the lock (a leader-for-life ConfigMap, a Lease).

use super::*;

/// How long the leader's COMMAND takes to stop after SIGTERM (a program that flushes its work).
const SLOW_STOP: &str = "sleep 3";

/// `COMMAND` that records its start, and on SIGTERM sleeps, records its end and exits.
pub(super) fn slow_work(dir: &Path, id: &str) -> Vec<String> {
    let d = dir.display();
    let on_term = format!("{SLOW_STOP}; date +%s%N > {d}/{id}.stopped; exit 0");
    let mut script = work_script(dir, id, &on_term);
    let body = script.pop().expect("the script");
    script.push(format!("date +%s%N > {d}/{id}.started; {body}"));
    script
}

fn ns_at(dir: &Path, file: &str) -> Option<u128> {
    fs::read_to_string(dir.join(file)).ok()?.trim().parse().ok()
}

/// Until `follower` leads (or `until` passes), checks that the leader's COMMAND is never alive
/// while the follower's runs; returns whether the follower led.
pub(super) fn never_together(leader: &Candidate, follower: &Candidate, until: Duration) -> bool {
    let old = leader.command_pid().expect("the leader's COMMAND started");
    let start = Instant::now();
    while start.elapsed() < until {
        if follower.leading() {
            assert!(
                !alive(old),
                "two COMMANDs ran together: {} started while {}'s COMMAND (pid {old}) still ran\n\
                 {}'s log:\n{}\n{}'s log:\n{}",
                follower.id,
                leader.id,
                leader.id,
                leader.log_text(),
                follower.id,
                follower.log_text()
            );
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Both COMMANDs' times: the follower's start is after the leader's end. Prints the wait the
/// safe rule costs, from `deleted` (ns since the epoch, when the lock was deleted).
pub(super) fn started_after_stop(dir: &Path, leader: &str, follower: &str, deleted: u128) {
    let stopped = ns_at(dir, &format!("{leader}.stopped")).expect("the old COMMAND recorded its end");
    let started = ns_at(dir, &format!("{follower}.started")).expect("the new COMMAND recorded its start");
    assert!(
        started >= stopped,
        "{follower}'s COMMAND started {} ms before {leader}'s ended",
        (stopped - started) / 1_000_000
    );
    let ms = |ns: u128| ns as f64 / 1e6;
    eprintln!(
        "safety IV: lock deleted -> old COMMAND ended {:.1} ms -> next COMMAND started {:.1} ms after that ({:.1} ms after the deletion)",
        ms(stopped.saturating_sub(deleted)),
        ms(started - stopped),
        ms(started.saturating_sub(deleted))
    );
}

pub(super) fn epoch_now() -> u128 {
    epoch_ns(SystemTime::now())
}

/// Two leader-for-life candidates of `lock` with Pod objects `ids`, their COMMAND slow to stop:
/// returns once the first leads and the second's campaign has seen its lock (not only its
/// status server: a candidate that never saw the lock knows nothing of its leader,
/// docs/library.md, Safety IV).
async fn for_life_pair(
    cp: &ControlPlane,
    ns: &str,
    dir: &Path,
    lock: &str,
    ids: [&str; 2],
) -> (Candidate, Candidate) {
    let client = cp.client().await;
    for pod in ids {
        create_pod(&client, ns, pod).await.unwrap();
    }
    let flags = ["--lock", lock, "--namespace", ns, "--grace", "10s"];
    let spawn = |pod: &str| {
        let work = slow_work(dir, pod);
        Candidate::spawn_with(
            cp.kubeconfig_path(),
            dir,
            pod,
            &flags,
            &work,
            &[("POD_NAME", pod)],
        )
    };
    let leader = spawn(ids[0]);
    wait_for(&format!("{} leads", ids[0]), WAIT, || {
        leader.leading().then_some(())
    });
    let follower = spawn(ids[1]);
    let waiting = format!(r#""reason":"{} leads""#, ids[0]);
    wait_for(&format!("{} waits on {}", ids[1], ids[0]), WAIT, || {
        follower.log_text().contains(&waiting).then_some(())
    });
    (leader, follower)
}

#[tokio::test(flavor = "multi_thread")]
async fn for_life_lock_deleted_under_a_live_leader_waits_for_its_command_to_stop() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let dir = scratch_dir("deleted-for-life");
    let (mut leader, follower) = for_life_pair(cp, ns.name(), &dir, "dl", ["dl1", "dl2"]).await;

    // An admin deletes the lock: dl1 loses and stops its COMMAND (3 s); dl2 waits for its word.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns.name());
    let deleted = epoch_now();
    cms.delete("dl", &DeleteParams::default()).await.unwrap();
    assert!(
        never_together(&leader, &follower, WAIT),
        "dl2 never took over after dl1 stopped; dl1's log:\n{}\ndl2's log:\n{}",
        leader.log_text(),
        follower.log_text()
    );
    started_after_stop(&dir, "dl1", "dl2", deleted);
    assert_eq!(leader.wait_exit(WAIT).code(), Some(124), "{}", leader.log_text());
    assert!(
        leader
            .log_text()
            .contains("created the lock again, marked released"),
        "{}",
        leader.log_text()
    );
    let lock = cms.get("dl").await.unwrap();
    assert_eq!(lock.metadata.owner_references.unwrap()[0].name, "dl2");
    let _ = fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn lease_deleted_under_a_live_leader_waits_for_its_command_to_stop() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let dir = scratch_dir("deleted-lease");
    let mut flags = lease_flags("dll", ns.name());
    flags.extend(["--grace", "1s"]);
    // A slow COMMAND beyond the grace is killed at the grace: its end is the kill.
    let spawn = |id: &str| Candidate::spawn(cp, &dir, id, &flags, &slow_work(&dir, id));
    let mut leader = spawn("ll1");
    wait_for("ll1 leads", WAIT, || leader.leading().then_some(()));
    let follower = spawn("ll2");
    wait_for("ll2 follows", WAIT, || {
        follower.log_text().contains("leader is ll1").then_some(())
    });
    let leases: Api<Lease> = Api::namespaced(cp.client().await, ns.name());
    leases.delete("dll", &DeleteParams::default()).await.unwrap();
    assert!(never_together(&leader, &follower, WAIT), "ll2 never took over");
    leader.wait_exit(WAIT);
    let _ = fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn for_life_namespace_deleted_under_a_live_leader_starts_no_second_command() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace().await;
    let client = cp.client().await;
    let dir = scratch_dir("deleted-namespace");
    let (leader, follower) = for_life_pair(cp, ns.name(), &dir, "dn", ["dn1", "dn2"]).await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
    let deleted = epoch_now();
    namespaces
        .delete(ns.name(), &DeleteParams::default())
        .await
        .unwrap();
    // Whatever the namespace controller deletes first (the lock, the Pods), dn2 never runs
    // COMMAND while dn1's does; in a terminating namespace it may never lead at all.
    if never_together(&leader, &follower, Duration::from_secs(15)) {
        started_after_stop(&dir, "dn1", "dn2", deleted);
    }
    let _ = fs::remove_dir_all(dir);
}
